/* SPDX-License-Identifier: MIT */
/* test_cuda_data.c — the CUDA backend against the CPU backend for the ops that make and
 * move data: fill, cast (bit for bit, every 16-bit pattern, the refused f32 -> i32 cast,
 * many tensors in one cast),
 * the random fills; and the refusals (ids and targets out of range, host/device mixing).
 * test_cuda.c says how the GPU tests test (twins compared after the device's result is
 * copied back; skipped without a GPU); the harness is cuda_twins.h's. All test names start
 * with "cuda_".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_twins.h"

/* ================================================================ fill and cast */

static float float_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The first elements of an f32 tensor: values the 16-bit roundings are hard at. */
static void put_cast_specials(l2l_tensor *t) {
  const float specials[] = {
      0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65519.996f,
      65520.0f, -65520.0f, 1e-8f, 5.9604645e-8f /* 2^-24, f16's smallest subnormal */,
      2.9802322e-8f /* 2^-25: a tie, to 0 */, 4.4703484e-8f /* 1.5 * 2^-25: to 2^-24 */,
      6.1035156e-5f /* f16's smallest normal */, 1e-40f /* f32 subnormal */, 3.4028235e38f,
      float_of_bits(0x3f808000u) /* bf16 tie, to even (down) */,
      float_of_bits(0x3f818000u) /* bf16 tie, to even (up) */,
      float_of_bits(0x7f7f8000u) /* bf16 rounds up to infinity */,
      float_of_bits(0x3f801000u) /* f16 tie, down */, float_of_bits(0x3f803000u) /* f16 tie, up */,
      float_of_bits(0x7fa00001u) /* a signaling NaN */, float_of_bits(0xffc12345u)};
  int64_t count = (int64_t)(sizeof specials / sizeof specials[0]);
  if (count > numel(t)) count = numel(t);
  for (int64_t i = 0; i < count; i++) fdata(t)[i] = specials[i];
}

/* Casts src's twin to `dtype` on both sides; the results must agree bit for bit (NaN
   payloads aside). */
static void cast_case(struct twin src, l2l_dtype dtype, const char *what) {
  int64_t shape[L2L_MAX_DIMS];
  int nd = l2l_tensor_ndim(src.h);
  for (int i = 0; i < nd; i++) shape[i] = l2l_tensor_dim(src.h, i);
  l2l_tensor *h = check_tensor(L2L_POOL_HOST, dtype, nd, shape);
  memset(l2l_tensor_data(h), 0x5A, tensor_bytes(h));
  struct twin dst = twin_of(h);
  SIDES OK_ON(l2l_tensor_cast(AT(dst), AT(src)));
  char label[160];
  snprintf(label, sizeof label, "cast %s -> %s: %s",
           l2l_dtype_name((l2l_dtype)l2l_tensor_dtype(src.h)), l2l_dtype_name(dtype), what);
  CHECK_TWIN_BITS_NAN_ANY(label, dst);
  TWIN_FREE(&dst);
}

TEST(cuda_fill_and_cast) {
  if (!use_gpu()) return;
  /* ---- fill: the value rounded to the dtype exactly as on the host */
  static const struct {
    l2l_dtype dtype;
    double value;
  } fills[] = {
      {L2L_F32, 0.0},        {L2L_F32, -0.0},       {L2L_F32, 3.141592653589793},
      {L2L_F32, 1e-40},      {L2L_F32, -1e30},      {L2L_F32, NAN},
      {L2L_F32, INFINITY},   {L2L_F32, 1e39},       {L2L_F16, 65519.0},
      {L2L_F16, 65520.0},    {L2L_F16, 1e-7},       {L2L_F16, -2.5},
      {L2L_F16, 3.141592653589793}, {L2L_F16, 2.98023223876953125e-8}, {L2L_F16, NAN},
      {L2L_BF16, 1.00390625}, {L2L_BF16, 3.141592653589793}, {L2L_BF16, -1e-40},
      {L2L_BF16, 3.4e38},    {L2L_BF16, NAN},       {L2L_I32, 0.0},
      {L2L_I32, -7.0},       {L2L_I32, 2147483647.0}, {L2L_I32, -2147483648.0},
      {L2L_U8, 0.0},         {L2L_U8, 255.0},       {L2L_U8, 7.0},
  };
  static const int64_t fill_sizes[] = {1, 3, 1001};
  for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++)
    for (int s = 0; s < 3; s++) {
      l2l_tensor *h = check_tensor(L2L_POOL_HOST, fills[f].dtype, DIMS(fill_sizes[s]));
      memset(l2l_tensor_data(h), 0x5A, tensor_bytes(h));
      struct twin t = twin_of(h);
      SIDES OK_ON(l2l_tensor_fill(AT(t), fills[f].value));
      char what[96];
      snprintf(what, sizeof what, "fill %s n=%lld with %g", l2l_dtype_name(fills[f].dtype),
               (long long)fill_sizes[s], fills[f].value);
      CHECK_TWIN_BITS(what, t);
      TWIN_FREE(&t);
    }

  /* ---- f32 -> f16 / bf16: specials, ties, every magnitude, random bit patterns */
  {
    int64_t n = 4099;
    l2l_tensor *s0 = HOST(L2L_F32, n);
    for (int64_t i = 0; i < n; i++) {
      if (i % 4 == 0) {
        fdata(s0)[i] = float_of_bits((uint32_t)check_rand_u64());
      } else {
        double mag = exp2(check_rand_uniform(-30, 20)) * check_rand_uniform(1, 2);
        fdata(s0)[i] = (float)(check_rand_int(0, 1) ? mag : -mag);
      }
    }
    put_cast_specials(s0);
    struct twin src = twin_of(s0);
    cast_case(src, L2L_F16, "specials, ties, 2^-30..2^21, random bits");
    cast_case(src, L2L_BF16, "specials, ties, 2^-30..2^21, random bits");
    cast_case(src, L2L_F32, "a copy");
    TWIN_FREE(&src);
  }
  /* ---- every 16-bit pattern -> f32 and -> the other 16-bit type */
  for (int k = 0; k < 2; k++) {
    l2l_dtype dt = k ? L2L_BF16 : L2L_F16;
    l2l_tensor *s0 = check_tensor(L2L_POOL_HOST, dt, DIMS(65536));
    uint16_t *d = l2l_tensor_data(s0);
    for (int64_t i = 0; i < 65536; i++) d[i] = (uint16_t)i;
    struct twin src = twin_of(s0);
    cast_case(src, L2L_F32, "every bit pattern");
    cast_case(src, k ? L2L_F16 : L2L_BF16, "every bit pattern");
    TWIN_FREE(&src);
  }
  /* ---- f32 <-> i32 */
  {
    int64_t n = 4099;
    l2l_tensor *s0 = HOST(L2L_F32, n), *i0 = HOST(L2L_I32, n);
    const float ints[] = {0.0f, -0.0f, 1.0f, -1.0f, 16777216.0f, 16777218.0f, -16777218.0f,
                          2147483520.0f /* the largest float below 2^31 */, -2147483648.0f};
    for (int64_t i = 0; i < n; i++) {
      int32_t r = (int32_t)(uint32_t)check_rand_u64();
      float f = i % 2 ? (float)r : (float)check_rand_int(-100000, 100000);
      if (f >= 2147483648.0f) f = -2147483648.0f; /* (float)r may round up to 2^31 */
      fdata(s0)[i] = i < 9 ? ints[i] : f;
      idata(i0)[i] = i % 3 ? r : (int32_t)check_rand_int(-1000, 1000);
    }
    idata(i0)[0] = INT32_MIN, idata(i0)[1] = INT32_MAX, idata(i0)[2] = 16777217;
    struct twin src = twin_of(s0), isrc = twin_of(i0);
    cast_case(src, L2L_I32, "integer values");
    cast_case(isrc, L2L_F32, "any int32");
    cast_case(isrc, L2L_F16, "any int32");
    cast_case(isrc, L2L_BF16, "any int32");
    TWIN_FREE(&src, &isrc);
  }
  /* ---- f32 -> i32 refused at the first value that is not an int32, before anything is
     written, with the same status and message on both sides */
  {
    const float bad[] = {2.5f, NAN, 2147483648.0f, -2147483904.0f, INFINITY, 0.5f, -1e-30f};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
      int64_t n = 1001, pos = check_rand_int(0, n - 2);
      l2l_tensor *s0 = HOST(L2L_F32, n), *d0 = HOST(L2L_I32, n);
      for (int64_t i = 0; i < n; i++) {
        fdata(s0)[i] = (float)check_rand_int(-1000, 1000);
        idata(d0)[i] = 0x0F0F0F0F;
      }
      fdata(s0)[pos] = bad[b];
      fdata(s0)[check_rand_int(pos + 1, n - 1)] = 0.25f; /* a later one is not the one named */
      struct twin src = twin_of(s0), dst = twin_of(d0);
      char needle[96];
      snprintf(needle, sizeof needle, "src[%lld] is not an integer", (long long)pos);
      SIDES FAILS_ON(l2l_tensor_cast(AT(dst), AT(src)), L2L_ERR_INVALID, needle);
      char what[96];
      snprintf(what, sizeof what, "a refused cast f32 -> i32 (%g at %lld) left dst", bad[b],
               (long long)pos);
      CHECK_TWIN_BITS(what, dst);
      bool intact = true;
      for (int64_t i = 0; i < n; i++) intact &= idata(dst.h)[i] == 0x0F0F0F0F;
      CHECK(intact, "%s: the host changed it", what);
      TWIN_FREE(&src, &dst);
    }
  }
  end_gpu();
}

TEST(cuda_cast_many) {
  /* backend_tensors_cast (convert_many: one launch for up to 64 tensors, each element's
     tensor found by a binary search over their ends) against the CPU's, bit for bit, f32
     to f16 and bf16 and back, over 1, 64 and 130 tensors (a launch's worth, and three
     launches) of drawn sizes, specials and random bit patterns among the values. */
  if (!use_gpu()) return;
  static const l2l_dtype dirs[4][2] = {{L2L_F32, L2L_BF16}, {L2L_F32, L2L_F16},
                                       {L2L_BF16, L2L_F32}, {L2L_F16, L2L_F32}};
  static const int counts[] = {1, 64, 130};
  enum { MOST = 130 };
  for (int d = 0; d < 4; d++)
    for (int c = 0; c < 3; c++) {
      int count = counts[c];
      struct twin src[MOST], dst[MOST];
      l2l_tensor *src_side[2][MOST], *dst_side[2][MOST];
      for (int i = 0; i < count; i++) {
        int64_t n = check_rand_int(1, 3000);
        l2l_tensor *s0 = check_tensor(L2L_POOL_HOST, dirs[d][0], DIMS(n));
        uint8_t *bytes = l2l_tensor_data(s0);
        for (int64_t k = 0; k < (int64_t)tensor_bytes(s0); k++) bytes[k] = (uint8_t)check_rand_u64();
        if (dirs[d][0] == L2L_F32) put_cast_specials(s0);
        l2l_tensor *d0 = check_tensor(L2L_POOL_HOST, dirs[d][1], DIMS(n));
        memset(l2l_tensor_data(d0), 0x5A, tensor_bytes(d0));
        src[i] = twin_of(s0), dst[i] = twin_of(d0);
        src_side[0][i] = src[i].h, src_side[1][i] = src[i].d;
        dst_side[0][i] = dst[i].h, dst_side[1][i] = dst[i].d;
      }
      SIDES OK_ON(backend_tensors_cast(dst_side[side], (const l2l_tensor *const *)src_side[side], count));
      for (int i = 0; i < count; i++) {
        char what[96];
        snprintf(what, sizeof what, "cast of %d: %s -> %s, tensor %d", count,
                 l2l_dtype_name(dirs[d][0]), l2l_dtype_name(dirs[d][1]), i);
        CHECK_TWIN_BITS_NAN_ANY(what, dst[i]);
        TWIN_FREE(&src[i], &dst[i]);
      }
    }
  end_gpu();
}

/* ================================================================ random fills */

static float half_to_float(uint16_t u, l2l_dtype dtype) {
  return dtype == L2L_BF16 ? l2l_bf16_to_f32(u) : l2l_f16_to_f32(u);
}

TEST(cuda_random) {
  if (!use_gpu()) return;
  static const l2l_dtype dtypes[] = {L2L_F32, L2L_F16, L2L_BF16};
  static const int64_t sizes[] = {1, 7, 1000003};
  static const double ranges[][2] = {{0, 1}, {-2.5, 3.5}, {1, 1.001}, {-1e-3, 0}, {5, 5}};
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < 3; s++) {
      /* uniform: the same draws rounded the same way, bit for bit */
      for (int r = 0; r < 5; r++) {
        uint64_t seed = check_rand_u64(), stream = check_rand_u64();
        int64_t first = check_rand_int(0, INT64_C(1) << 40);
        l2l_tensor *h = check_tensor(L2L_POOL_HOST, dtypes[d], DIMS(sizes[s]));
        memset(l2l_tensor_data(h), 0x5A, tensor_bytes(h));
        struct twin t = twin_of(h);
        SIDES OK_ON(l2l_tensor_uniform(AT(t), seed, stream, first, ranges[r][0], ranges[r][1]));
        char what[160];
        snprintf(what, sizeof what, "uniform %s n=%lld [%g, %g) first=%lld",
                 l2l_dtype_name(dtypes[d]), (long long)sizes[s], ranges[r][0], ranges[r][1],
                 (long long)first);
        CHECK_TWIN_BITS(what, t);
        TWIN_FREE(&t);
      }
      /* normal: Box-Muller in double on both sides; sqrt, log and cos of another library
         may differ in the last bits of a double, so f32 results agree to 1e-6 of
         (|value| + std), and a 16-bit result may round the other way: two of its ulps. */
      static const double params[][2] = {{0, 1}, {2.5, 0.5}, {-1, 3}, {0, 0}};
      for (int r = 0; r < 4; r++) {
        uint64_t seed = check_rand_u64(), stream = check_rand_u64();
        int64_t first = check_rand_int(0, INT64_C(1) << 40);
        l2l_tensor *h = check_tensor(L2L_POOL_HOST, dtypes[d], DIMS(sizes[s]));
        memset(l2l_tensor_data(h), 0x5A, tensor_bytes(h));
        struct twin t = twin_of(h);
        double mean = params[r][0], sd = params[r][1];
        SIDES OK_ON(l2l_tensor_normal(AT(t), seed, stream, first, mean, sd));
        char what[160];
        snprintf(what, sizeof what, "normal %s n=%lld mean=%g std=%g first=%lld",
                 l2l_dtype_name(dtypes[d]), (long long)sizes[s], mean, sd, (long long)first);
        l2l_tensor *back = copied_to(t.d, L2L_POOL_HOST);
        if (dtypes[d] == L2L_F32) {
          CHECK_CLOSE(what, fdata(back), fdata(t.h), sizes[s], sd > 0 ? sd : 1e-30, 1e-6);
        } else {
          float *got = xmalloc((size_t)sizes[s] * sizeof *got);
          float *want = xmalloc((size_t)sizes[s] * sizeof *want);
          const uint16_t *gb = l2l_tensor_data(back), *wb = l2l_tensor_data(t.h);
          for (int64_t i = 0; i < sizes[s]; i++) {
            got[i] = half_to_float(gb[i], dtypes[d]);
            want[i] = half_to_float(wb[i], dtypes[d]);
          }
          /* an ulp is at most 2^-7 (bf16) / 2^-10 (f16) of the value; f16's subnormals
             below 2^-14 have a fixed spacing of 2^-24, hence the floor */
          bool bf = dtypes[d] == L2L_BF16;
          CHECK_CLOSE(what, got, want, sizes[s], bf ? 1e-30 : 0x1p-14, bf ? 0x1p-6 : 0x1p-9);
          free(got);
          free(want);
        }
        l2l_tensor_free(back);
        TWIN_FREE(&t);
      }
    }
  end_gpu();
}

/* ================================================================ refusals */

#define CHECK_POOLS_NAMED() pools_named(__FILE__, __LINE__)

TEST(cuda_refusals) {
  if (!use_gpu()) return;
  /* ---- ids out of range: refused before anything is written, naming position and value */
  {
    int64_t v = 13, cols = 5;
    l2l_tensor *ids0 = HOST(L2L_I32, 3, 7), *out0 = HOST(L2L_F32, 3, 7, cols);
    for (int64_t i = 0; i < 21; i++) idata(ids0)[i] = (int32_t)check_rand_int(0, v - 1);
    for (int64_t i = 0; i < numel(out0); i++) fdata(out0)[i] = 12345.0f; /* a sentinel */
    struct twin ids = twin_of(ids0), table = twin_of(RANDN(1.0, v, cols)), out = twin_of(out0);
    struct twin dout = twin_of(RANDN(1.0, 3, 7, cols)), dtable = twin_of(RANDN(1.0, v, cols));
    const int32_t bad_values[] = {(int32_t)v, -1, INT32_MIN, INT32_MAX};
    for (int k = 0; k < 4; k++) {
      int64_t pos = check_rand_int(0, 20);
      int32_t saved = idata(ids.h)[pos];
      idata(ids.h)[pos] = bad_values[k];
      CHECK_OK(l2l_tensor_copy(ids.d, ids.h));
      char needle[96];
      /* the position as the ids' own (row, column) index: ids is (3, 7) */
      snprintf(needle, sizeof needle, "ids[%lld][%lld] = %d", (long long)(pos / 7),
               (long long)(pos % 7), bad_values[k]);
      SIDES {
        FAILS_ON(l2l_embedding_forward(AT(out), AT(ids), AT(table)), L2L_ERR_INVALID, needle);
        FAILS_ON(l2l_embedding_backward(AT(dtable), AT(dout), AT(ids)), L2L_ERR_INVALID, needle);
      }
      idata(ids.h)[pos] = saved;
    }
    CHECK_TWIN_BITS("refused embedding_forward: out unchanged", out);
    CHECK_TWIN_BITS("refused embedding_backward: dtable unchanged", dtable);
    TWIN_FREE(&ids, &table, &out, &dout, &dtable);
  }
  /* ---- targets out of range (the ignore index is allowed) */
  {
    int64_t rows = 7, v = 11;
    l2l_tensor *t0 = HOST(L2L_I32, rows);
    random_targets(t0, (int32_t)v, -100);
    struct twin logits = twin_of(RANDN(1.0, rows, v)), targets = twin_of(t0);
    struct twin losses = twin_of(RANDN(1.0, rows)), dlogits = twin_of(RANDN(1.0, rows, v));
    const int32_t bad_values[] = {(int32_t)v, -1, -101, INT32_MIN};
    for (int k = 0; k < 4; k++) {
      int64_t pos = check_rand_int(0, rows - 1);
      int32_t saved = idata(targets.h)[pos];
      idata(targets.h)[pos] = bad_values[k];
      CHECK_OK(l2l_tensor_copy(targets.d, targets.h));
      char needle[96];
      snprintf(needle, sizeof needle, "targets[%lld] = %d", (long long)pos, bad_values[k]);
      SIDES {
        FAILS_ON(l2l_cross_entropy_forward(AT(losses), AT(logits), AT(targets), -100),
                 L2L_ERR_INVALID, needle);
        FAILS_ON(l2l_cross_entropy_backward(AT(dlogits), AT(logits), AT(targets), -100, 1.0f),
                 L2L_ERR_INVALID, needle);
      }
      idata(targets.h)[pos] = saved;
    }
    CHECK_TWIN_BITS("refused cross_entropy_forward: losses unchanged", losses);
    CHECK_TWIN_BITS("refused cross_entropy_backward: dlogits unchanged", dlogits);
    TWIN_FREE(&logits, &targets, &losses, &dlogits);
  }
  /* ---- an op mixing host and device tensors is refused and changes nothing */
  {
    struct twin a = twin_of(RANDN(1.0, 3, 7)), b = twin_of(RANDN(1.0, 3, 7));
    struct twin out = twin_of(RANDN(1.0, 3, 7)), w = twin_of(RANDN(1.0, 7, 5));
    struct twin c = twin_of(RANDN(1.0, 3, 5));
    l2l_tensor *h16 = HOST(L2L_F16, 3, 7), *d16 = DEV(L2L_F16, 3, 7);
    CHECK_FAILS(l2l_add(out.d, a.d, b.h), L2L_ERR_INVALID, "device");
    CHECK_POOLS_NAMED();
    CHECK_FAILS(l2l_add(out.h, a.d, b.h), L2L_ERR_INVALID, "host");
    CHECK_POOLS_NAMED();
    CHECK_FAILS(l2l_gemm(c.d, a.d, w.h, 0, 0, 1.0f, 0.0f), L2L_ERR_INVALID, "device");
    CHECK_POOLS_NAMED();
    CHECK_FAILS(l2l_gelu_forward(out.d, a.h), L2L_ERR_INVALID, "device");
    CHECK_POOLS_NAMED();
    CHECK_FAILS(l2l_tensor_cast(d16, a.h), L2L_ERR_INVALID, "within one backend");
    CHECK_FAILS(l2l_tensor_cast(h16, a.d), L2L_ERR_INVALID, "within one backend");
    CHECK_TWIN_BITS("refused mixed ops: out unchanged", out);
    CHECK_TWIN_BITS("refused mixed gemm: c unchanged", c);
    FREE(h16, d16);
    TWIN_FREE(&a, &b, &out, &w, &c);
  }
  end_gpu();
}
