/* SPDX-License-Identifier: MIT */
/* test_elementwise_emulated.c — the GPU's element-wise launchers and kernels
 * (kernels/elementwise.cu, kernels/cast_rows.cu), their own source run on the CPU by
 * elementwise_emulated.cpp, against the CPU backend's ops of the same names.
 *
 * Purpose: the bias add (its sums rounded to 16 bits for the next GEMM), the casts of
 * records and gradients and dropout run in every GPU step, and the file is changed where no
 * GPU runs it. Here the launchers choose their paths as on a GPU (float4s where every pointer
 * is aligned, scalars else) at drawn sizes and alignments, with three blocks, so that the
 * threads walk several grid strides, and every output is held to the CPU's bit for bit (each
 * is exact there: one f32 add, a rounding, a mask from the same draws): add (in place), the
 * bias add into y or into y16, dropout's output and mask and its backward, casts between
 * f32, f16, bf16 and i32 both ways and the same type (a copy), many casts in one launch, and
 * the first value an integer cast cannot take; and kernels/cast_rows.cu's strided row
 * casts (the cuDNN path's), rows ld apart both sides, the padding untouched.
 * Must never: need a GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cuda_twins.h"
#if L2L_KERNEL_EMULATION
#include "elementwise_emulated.h"
#endif

#if L2L_KERNEL_EMULATION

static bool same_bits(const char *what, const void *got, const void *want, int64_t n, size_t size) {
  int64_t first = -1;
  for (int64_t i = 0; i < n && first < 0; i++)
    if (memcmp((const char *)got + i * (int64_t)size, (const char *)want + i * (int64_t)size, size))
      first = i;
  return CHECK(first < 0, "%s: not the CPU's bits, first at [%lld] of %lld", what, (long long)first,
               (long long)n);
}

/* add, bias add (y or y16), dropout forward and backward; f32 data `shift` floats off, the
   16-bit sums h_shift halves (1: off the 8 bytes a packed store needs). */
static bool maps_case(int64_t rows, int64_t cols, int64_t shift, int64_t h_shift) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const int64_t n = rows * cols;
  const l2l_dtype t = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  char what[160], dims[100];
  snprintf(dims, sizeof dims, "(%lld, %lld)%s", (long long)rows, (long long)cols, shift ? " unaligned" : "");
  bool ok = true;
  struct host_buf ab = host_poisoned(n, 4, shift), bb = host_poisoned(n, 4, shift);
  struct host_buf ob = host_poisoned(n, 4, shift), biasb = host_poisoned(cols, 4, shift);
  struct host_buf hb = host_poisoned(n, 2, h_shift);
  float *a = ab.at, *b = bb.at, *out = ob.at, *bias = biasb.at;
  uint16_t *h = hb.at;
  float *want = host_floats(n, NAN), *src = host_normals(n, 2.0);
  float *bias0 = host_normals(cols, 2.0);
  memcpy(a, src, (size_t)n * 4), memcpy(bias, bias0, (size_t)cols * 4);
  float *tmp = host_normals(n, 2.0);
  memcpy(b, tmp, (size_t)n * 4);

  ok &= CHECK_OK(cpu->add(want, a, b, n));
  ok &= CHECK(emu_k_add(out, a, b, n, NULL) == 0, "%s: add's launch", dims);
  snprintf(what, sizeof what, "add %s", dims);
  ok &= same_bits(what, out, want, n, 4);
  ok &= CHECK(emu_k_add(b, a, b, n, NULL) == 0, "%s: add's launch in place", dims);
  snprintf(what, sizeof what, "add in place %s", dims);
  ok &= same_bits(what, b, want, n, 4);

  /* the bias: its sums into 16 bits (y only read), then into y */
  memcpy(want, src, (size_t)n * 4);
  ok &= CHECK_OK(cpu->bias_add(want, NULL, L2L_F32, bias, rows, cols));
  ok &= CHECK(emu_k_bias_add(a, h, (int)t, bias, rows, cols, NULL) == 0, "%s: bias_add's launch into 16 bits", dims);
  snprintf(what, sizeof what, "bias_add %s into %s", dims, l2l_dtype_name(t));
  ok &= same_bits(what, a, src, n, 4); /* y only read */
  ok &= CHECK_ROUNDED16(what, h, want, 1, n, n, t);
  ok &= CHECK(emu_k_bias_add(a, NULL, 0, bias, rows, cols, NULL) == 0, "%s: bias_add's launch", dims);
  snprintf(what, sizeof what, "bias_add %s", dims);
  ok &= same_bits(what, a, want, n, 4);

  /* dropout: y, the mask (its last byte's unused bits 0) and the backward, in place too */
  const float p = (float)check_rand_uniform(0.05, 0.9);
  const uint64_t seed = check_rand_u64(), stream = check_rand_u64();
  const int64_t first = check_rand_int(0, INT64_C(1) << 40), nb = (n + 7) / 8;
  uint8_t *mask = malloc((size_t)nb), *want_mask = malloc((size_t)nb);
  memset(mask, 0xa5, (size_t)nb);
  ok &= CHECK_OK(cpu->dropout_forward(want, want_mask, src, p, seed, stream, first, n));
  ok &= CHECK(emu_k_dropout_forward(out, mask, src, p, backend_keep_threshold(p), seed, stream, first, n,
                                    NULL) == 0,
              "%s: dropout_forward's launch", dims);
  snprintf(what, sizeof what, "dropout_forward %s p=%g", dims, p);
  ok &= same_bits(what, out, want, n, 4) && same_bits(what, mask, want_mask, nb, 1);
  ok &= CHECK_OK(cpu->dropout_backward(want, tmp, want_mask, p, n));
  memcpy(b, tmp, (size_t)n * 4);
  ok &= CHECK(emu_k_dropout_backward(b, b, want_mask, p, n, NULL) == 0, "%s: dropout_backward's launch", dims);
  snprintf(what, sizeof what, "dropout_backward in place %s p=%g", dims, p);
  ok &= same_bits(what, b, want, n, 4);

  free(ab.base), free(bb.base), free(ob.base), free(biasb.base), free(hb.base), free(want), free(src);
  free(bias0), free(tmp), free(mask), free(want_mask);
  return ok;
}

/* Casts between f32, f16, bf16 and i32 (the same type: a copy) of n elements, `shift`
   elements off; then many f32 <-> 16-bit casts in one launch. */
static bool casts_case(int64_t n, int64_t shift) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  static const l2l_dtype types[] = {L2L_F32, L2L_F16, L2L_BF16, L2L_I32};
  bool ok = true;
  char what[160];
  /* values that are integers at times (an i32 cast takes them), else any, with specials */
  const bool integral = check_rand_int(0, 1);
  float *f = host_floats(n, 0.0f);
  for (int64_t i = 0; i < n; i++)
    f[i] = integral ? (float)check_rand_int(-70000, 70000) : (float)(1000.0 * check_rand_normal());
  if (!integral && n > 3) f[0] = NAN, f[1] = INFINITY, f[2] = 1e-40f, f[3] = 70000.0f;
  for (int s = 0; s < 4; s++) {
    const l2l_dtype st = types[s];
    const size_t ss = l2l_dtype_size(st);
    struct host_buf src = host_poisoned(n, ss, shift);
    int64_t bad = 0;
    if (st == L2L_F32) memcpy(src.at, f, (size_t)n * 4);
    else if (CHECK_OK(cpu->convert(src.at, st, f, L2L_F32, n, &bad)) && bad >= 0) {
      free(src.base);
      continue; /* (no i32 source from values that are not integers) */
    }
    for (int d = 0; d < 4; d++) {
      const l2l_dtype dt = types[d];
      const size_t ds = l2l_dtype_size(dt);
      struct host_buf got = host_poisoned(n, ds, check_rand_int(0, 1));
      struct host_buf want = host_poisoned(n, ds, 0);
      int64_t want_bad = -2, got_bad = -2;
      snprintf(what, sizeof what, "convert %lld %s to %s", (long long)n, l2l_dtype_name(st), l2l_dtype_name(dt));
      ok &= CHECK_OK(cpu->convert(want.at, dt, src.at, st, n, &want_bad));
      if (dt == L2L_I32) { /* the check before an integer cast */
        ok &= CHECK(emu_k_find_non_i32(&got_bad, src.at, (int)st, n, NULL) == 0, "%s: the check's launch", what);
        ok &= CHECK(got_bad == want_bad, "%s: the first value not an integer at %lld, want %lld", what,
                    (long long)got_bad, (long long)want_bad);
      }
      if (dt != L2L_I32 || want_bad < 0) {
        ok &= CHECK(emu_k_convert(got.at, (int)dt, src.at, (int)st, n, NULL) == 0, "%s: the launch", what);
        ok &= same_bits(what, got.at, want.at, n, ds);
      }
      free(got.base), free(want.base);
    }
    free(src.base);
  }

  /* many casts in one launch: segments of drawn lengths, f32 to 16 bits and back */
  const l2l_dtype half = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  const int count = (int)check_rand_int(1, 9);
  void *dst[9], *dst_want[9];
  const void *srcs[9];
  int64_t lens[9];
  for (int back = 0; back < 2; back++) {
    const l2l_dtype from = back ? half : L2L_F32, to = back ? L2L_F32 : half;
    for (int i = 0; i < count; i++) {
      lens[i] = check_rand_int(0, 700);
      void *s = malloc((size_t)(lens[i] + 1) * 4);
      float *values = host_normals(lens[i], 2.0);
      int64_t unused;
      if (back) CHECK_OK(cpu->convert(s, from, values, L2L_F32, lens[i], &unused));
      else memcpy(s, values, (size_t)lens[i] * 4);
      free(values);
      srcs[i] = s;
      dst[i] = malloc((size_t)(lens[i] + 1) * 4), dst_want[i] = malloc((size_t)(lens[i] + 1) * 4);
      memset(dst[i], 0xff, (size_t)(lens[i] + 1) * 4);
    }
    ok &= CHECK_OK(cpu->convert_many(dst_want, to, srcs, from, lens, count));
    ok &= CHECK(emu_k_convert_many(dst, (int)to, srcs, (int)from, lens, count, NULL) == 0,
                "convert_many's launch");
    for (int i = 0; i < count; i++) {
      snprintf(what, sizeof what, "convert_many %s to %s, segment %d of %d (%lld)", l2l_dtype_name(from),
               l2l_dtype_name(to), i, count, (long long)lens[i]);
      ok &= same_bits(what, dst[i], dst_want[i], lens[i], l2l_dtype_size(to));
      free((void *)srcs[i]), free(dst[i]), free(dst_want[i]);
    }
  }
  free(f);
  return ok;
}

/* Strided row casts (cast_rows.cu: the cuDNN path's q, k, v, o and their gradients):
   f32 rows src_ld apart to 16-bit rows dst_ld apart and back, each row as convert casts it,
   nothing past a row's cols written; then the arguments it refuses. */
static bool cast_rows_case(int64_t rows, int64_t cols) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const l2l_dtype half = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  bool ok = true;
  char what[160];
  for (int back = 0; back < 2; back++) {
    const l2l_dtype from = back ? half : L2L_F32, to = back ? L2L_F32 : half;
    const int64_t src_ld = cols + check_rand_int(0, 5), dst_ld = cols + check_rand_int(0, 5);
    float *values = host_normals(rows * src_ld, 100.0);
    if (rows * cols > 2) values[0] = NAN, values[1] = INFINITY, values[2] = 1e-40f;
    struct host_buf src = host_poisoned(rows * src_ld, l2l_dtype_size(from), 0);
    int64_t unused;
    ok &= CHECK_OK(cpu->convert(src.at, from, values, L2L_F32, rows * src_ld, &unused));
    struct host_buf got = host_poisoned(rows * dst_ld, l2l_dtype_size(to), check_rand_int(0, 1));
    struct host_buf want = host_poisoned(rows * dst_ld, l2l_dtype_size(to), 0);
    for (int64_t r = 0; r < rows; r++)
      ok &= CHECK_OK(cpu->convert((char *)want.at + r * dst_ld * (int64_t)l2l_dtype_size(to), to,
                                  (const char *)src.at + r * src_ld * (int64_t)l2l_dtype_size(from),
                                  from, cols, &unused));
    snprintf(what, sizeof what, "cast_rows (%lld, %lld) %s, ld %lld, to %s, ld %lld", (long long)rows,
             (long long)cols, l2l_dtype_name(from), (long long)src_ld, l2l_dtype_name(to),
             (long long)dst_ld);
    ok &= CHECK(emu_k_cast_rows(got.at, (int)to, dst_ld, src.at, (int)from, src_ld, rows, cols, NULL) == 0,
                "%s: the launch", what);
    ok &= same_bits(what, got.at, want.at, rows * dst_ld, l2l_dtype_size(to));   /* (padding too) */
    /* refused: two 16-bit types, an ld below cols, a negative size, a NULL pointer */
    ok &= CHECK(emu_k_cast_rows(got.at, (int)(half == L2L_BF16 ? L2L_F16 : L2L_BF16), dst_ld, src.at,
                                (int)half, src_ld, rows, cols, NULL) != 0 &&
                    emu_k_cast_rows(got.at, (int)to, cols - 1, src.at, (int)from, src_ld, rows, cols, NULL) != 0 &&
                    emu_k_cast_rows(got.at, (int)to, dst_ld, src.at, (int)from, src_ld, -1, cols, NULL) != 0 &&
                    emu_k_cast_rows(NULL, (int)to, dst_ld, src.at, (int)from, src_ld, rows, cols, NULL) != 0,
                "%s: an argument refused was taken", what);
    ok &= same_bits("cast_rows after the refused calls", got.at, want.at, rows * dst_ld, l2l_dtype_size(to));
    free(values), free(src.base), free(got.base), free(want.base);
  }
  return ok;
}

#endif /* L2L_KERNEL_EMULATION */

TEST(elementwise_kernels_emulated_against_the_cpu) {
#if !L2L_KERNEL_EMULATION
  check_skip(NO_KERNEL_EMULATION);
#else
  /* columns a multiple of 4 (float4s) and not; past three blocks' grid stride (768 threads:
     3072 elements in float4s); aligned and not */
  int failed = 0;
  for (int i = 0; i < 4 && failed < 2; i++) {
    int64_t cols = check_rand_int(1, 300);
    if (i % 2 == 0) cols = (cols + 3) / 4 * 4;
    const int64_t rows = i == 0 ? check_rand_int(1, 3) : 6200 / cols + check_rand_int(1, 8);
    failed += !maps_case(rows, cols, i == 3, i == 1);
  }
  failed += !casts_case(check_rand_int(1, 40), 0);
  failed += !casts_case(check_rand_int(3100, 5000), 0);
  failed += !casts_case(check_rand_int(3100, 5000), 1);
  failed += !cast_rows_case(check_rand_int(1, 3), check_rand_int(1, 9));
  failed += !cast_rows_case(check_rand_int(20, 60), check_rand_int(64, 130));   /* (past 768 threads) */
  (void)failed;
#endif
}
