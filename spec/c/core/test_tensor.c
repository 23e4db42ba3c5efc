/* SPDX-License-Identifier: MIT */
/* test_tensor.c — tensors, views, casts, fills, the random generator and the pools.
 *
 * How: shapes and views against the arithmetic they promise; f16/bf16 casts against
 * round-to-nearest-even worked out in double by the test (every one of the 65536 f16
 * values, and random f32s including subnormals, halfway cases and overflow); Philox
 * against the published known-answer vectors (Salmon et al. 2011, Random123's kat set);
 * random fills for split invariance and moments; pool accounting to the byte.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "core/core.h"
#include "reference.h"

static const int64_t shape_2x3[2] = {2, 3};

/* ---------------------------------------------------------------- handles and views */

TEST(tensor_new_reports_shape_dtype_pool) {
  int64_t shape[4] = {2, 3, 5, 7};
  l2l_tensor *t = check_tensor(L2L_POOL_HOST, L2L_BF16, 4, shape);
  CHECK(l2l_tensor_ndim(t) == 4, "ndim %d", l2l_tensor_ndim(t));
  for (int i = 0; i < 4; i++)
    CHECK(l2l_tensor_dim(t, i) == shape[i], "dim %d is %lld", i, (long long)l2l_tensor_dim(t, i));
  CHECK(l2l_tensor_dim(t, 4) == -1 && l2l_tensor_dim(t, -1) == -1, "out-of-range axis");
  CHECK(l2l_tensor_numel(t) == 210, "numel %lld", (long long)l2l_tensor_numel(t));
  CHECK(l2l_tensor_dtype(t) == L2L_BF16, "dtype");
  CHECK(l2l_tensor_pool(t) == L2L_POOL_HOST, "pool");
  CHECK(((uintptr_t)l2l_tensor_data(t) % L2L_ALIGN) == 0, "data is %d-byte aligned", L2L_ALIGN);
  l2l_tensor_free(t);
  l2l_tensor_free(NULL); /* destructors accept NULL */
  CHECK(l2l_tensor_ndim(NULL) == -1 && l2l_tensor_data(NULL) == NULL, "NULL accessors");
}

TEST(tensor_new_refuses_bad_arguments) {
  l2l_tensor *t = NULL;
  int64_t zero[2] = {3, 0}, neg[1] = {-4}, huge[4] = {1 << 20, 1 << 20, 1 << 20, 1 << 20};
  CHECK_FAILS(l2l_tensor_new(NULL, L2L_POOL_HOST, L2L_F32, 2, shape_2x3), L2L_ERR_INVALID, "out");
  CHECK_FAILS(l2l_tensor_new(&t, 7, L2L_F32, 2, shape_2x3), L2L_ERR_INVALID, "pool");
  CHECK_FAILS(l2l_tensor_new(&t, L2L_POOL_HOST, 9, 2, shape_2x3), L2L_ERR_INVALID, "dtype");
  CHECK_FAILS(l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, 0, shape_2x3), L2L_ERR_INVALID, "ndim");
  CHECK_FAILS(l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, 5, shape_2x3), L2L_ERR_INVALID, "ndim");
  CHECK_FAILS(l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, 2, NULL), L2L_ERR_INVALID, "shape");
  CHECK_FAILS(l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, 2, zero), L2L_ERR_INVALID, "dim 1");
  CHECK_FAILS(l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, 1, neg), L2L_ERR_INVALID, "dim 0");
  CHECK_FAILS(l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, 4, huge), L2L_ERR_INVALID, "2^48");
  CHECK(t == NULL, "no tensor came out of failed calls");
}

TEST(views_share_storage_and_count_references) {
  int64_t rows = check_rand_int(5, 40), cols = check_rand_int(1, 9);
  l2l_tensor *t = check_randn(1.0, 2, rows, cols);
  int64_t first = check_rand_int(0, rows - 2), count = check_rand_int(1, rows - first);
  l2l_tensor *v = NULL, *w = NULL, *r = NULL;
  CHECK_OK(l2l_tensor_view_rows(&v, t, first, count));
  CHECK(l2l_tensor_data(v) == check_data(t) + first * cols, "view points into the storage");
  CHECK(l2l_tensor_offset(v) == first * cols, "offset %lld", (long long)l2l_tensor_offset(v));
  CHECK(l2l_tensor_dim(v, 0) == count && l2l_tensor_dim(v, 1) == cols, "view shape");
  CHECK(l2l_tensor_storage_refs(t) == 2, "two handles on one storage");
  /* a view of a view: offsets compose */
  CHECK_OK(l2l_tensor_view_rows(&w, v, count - 1, 1));
  CHECK(l2l_tensor_offset(w) == (first + count - 1) * cols, "nested offset");
  int64_t flat[1] = {rows * cols};
  CHECK_OK(l2l_tensor_reshape(&r, t, 1, flat));
  CHECK(l2l_tensor_data(r) == check_data(t) && l2l_tensor_numel(r) == rows * cols, "reshape");
  CHECK(l2l_tensor_storage_refs(t) == 4, "four handles");
  /* the storage outlives the handle it came from */
  uint64_t before;
  l2l_pool_stats s;
  CHECK_OK(l2l_pool_get_stats(&s, L2L_POOL_HOST));
  before = s.current;
  l2l_tensor_free(t);
  CHECK_OK(l2l_pool_get_stats(&s, L2L_POOL_HOST));
  CHECK(s.current == before, "storage kept while views live");
  check_data(w)[0] = 42.0f;
  CHECK(check_data(r)[(first + count - 1) * cols] == 42.0f, "writes through a view are shared");
  CHECK(l2l_tensor_storage_refs(v) == 3, "three left");
  l2l_tensor_free(v);
  l2l_tensor_free(w);
  l2l_tensor_free(r);
  CHECK_OK(l2l_pool_get_stats(&s, L2L_POOL_HOST));
  CHECK(s.current == before - (uint64_t)((rows * cols * 4 + 63) / 64 * 64), "storage freed last");
}

TEST(views_refuse_bad_ranges) {
  l2l_tensor *t = check_f32(2, (int64_t)6, (int64_t)4), *v = NULL;
  CHECK_FAILS(l2l_tensor_view_rows(&v, t, 5, 2), L2L_ERR_INVALID, "[5, 7)");
  CHECK_FAILS(l2l_tensor_view_rows(&v, t, -1, 2), L2L_ERR_INVALID, "not within dim 0");
  CHECK_FAILS(l2l_tensor_view_rows(&v, t, 0, 0), L2L_ERR_INVALID, "not within");
  /* first + count beyond int64: refused without computing it (UBSan aborted here) */
  CHECK_FAILS(l2l_tensor_view_rows(&v, t, INT64_MAX, 1), L2L_ERR_INVALID, "not within");
  CHECK_FAILS(l2l_tensor_view_rows(&v, t, 1, INT64_MAX), L2L_ERR_INVALID, "not within");
  CHECK_FAILS(l2l_tensor_view_rows(&v, t, INT64_MIN, -1), L2L_ERR_INVALID, "not within");
  int64_t bad[2] = {5, 5};
  CHECK_FAILS(l2l_tensor_reshape(&v, t, 2, bad), L2L_ERR_INVALID, "24 elements into 25");
  CHECK_FAILS(l2l_tensor_view_rows(&v, NULL, 0, 1), L2L_ERR_INVALID, "t is NULL");
  CHECK(v == NULL && l2l_tensor_storage_refs(t) == 1, "nothing leaked");
  l2l_tensor_free(t);
}

/* ---------------------------------------------------------------- casts */

/* Nearest f16 to x by exhaustive search over the neighbours, ties to even, in double. */
static double f16_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double mag = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

static uint16_t f16_nearest(float xf) {
  double x = xf;
  if (isnan(x)) return 0x7e00;
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  double a = fabs(x);
  if (a >= 65520.0) return sign | 0x7c00; /* halfway to 2^16 and beyond rounds to inf */
  uint16_t best = 0;
  for (uint16_t h = 0; h < 0x7c00; h++) { /* monotone in h: stop at the first above */
    if (f16_value(h) > a) {
      double below = a - f16_value((uint16_t)(h - 1)), above = f16_value(h) - a;
      best = (above < below || (above == below && (h & 1) == 0)) ? h : (uint16_t)(h - 1);
      return sign | best;
    }
  }
  return sign | 0x7bff;
}

TEST(f16_round_trips_every_value_exactly) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = l2l_f16_to_f32((uint16_t)h);
    double want = f16_value((uint16_t)h);
    if (isnan(want)) {
      bad += !isnan(f) || !isnan(l2l_f16_to_f32(l2l_f32_to_f16(f)));
      continue;
    }
    bad += (double)f != want;
    bad += l2l_f32_to_f16(f) != h;
  }
  CHECK(bad == 0, "%d f16 values do not round-trip", bad);
}

TEST(f16_rounds_to_nearest_even) {
  int bad = 0, cases = 0;
  for (int i = 0; i < 3000; i++) {
    float x;
    int kind = i % 3;
    if (kind == 0) x = (float)(check_rand_normal() * ldexp(1.0, (int)check_rand_int(-26, 16)));
    else { /* exactly halfway between two neighbouring f16 values */
      uint16_t h = (uint16_t)check_rand_int(0, 0x7bfe);
      x = (float)((f16_value(h) + f16_value((uint16_t)(h + 1))) / 2);
      if (kind == 2) x = -x;
    }
    uint16_t got = l2l_f32_to_f16(x), want = f16_nearest(x);
    cases++;
    if (got != want && bad++ < 5)
      fprintf(stderr, "    f16(%a) = %04x, want %04x\n", (double)x, got, want);
  }
  CHECK(bad == 0, "%d of %d conversions off", bad, cases);
  CHECK(l2l_f32_to_f16(65519.0f) == 0x7bff && l2l_f32_to_f16(65520.0f) == 0x7c00, "overflow edge");
  CHECK(l2l_f32_to_f16(INFINITY) == 0x7c00 && l2l_f32_to_f16(-INFINITY) == 0xfc00, "inf");
  CHECK(isnan(l2l_f16_to_f32(l2l_f32_to_f16(NAN))), "NaN stays NaN");
}

TEST(bf16_rounds_to_nearest_even) {
  int bad = 0;
  for (int i = 0; i < 20000; i++) {
    uint32_t bits = (uint32_t)check_rand_u64();
    if (i % 4 == 0) bits = (bits & 0xffff0000u) | 0x8000u; /* exact halfway */
    float x;
    memcpy(&x, &bits, 4);
    if (isnan(x)) continue;
    /* neighbours: truncation and the next bf16 away from zero */
    uint32_t lo_bits = bits & 0xffff0000u, hi_bits = lo_bits + 0x10000u;
    float lo, hi;
    memcpy(&lo, &lo_bits, 4);
    memcpy(&hi, &hi_bits, 4);
    /* Past the largest finite bf16 the next value is infinity, which rounding treats as
       2^128 (IEEE 754 overflow rule). */
    double hi_value = isinf(hi) ? copysign(ldexp(1.0, 128), x) : (double)hi;
    double dlo = fabs((double)x - lo), dhi = fabs(hi_value - x);
    uint16_t want = (uint16_t)((dhi < dlo || (dhi == dlo && ((lo_bits >> 16) & 1))) ? hi_bits >> 16
                                                                                    : lo_bits >> 16);
    if (isinf(lo)) want = (uint16_t)(lo_bits >> 16);
    if (l2l_f32_to_bf16(x) != want && bad < 5)
      fprintf(stderr, "    bf16(%a) = %04x, want %04x\n", (double)x, l2l_f32_to_bf16(x), want);
    bad += l2l_f32_to_bf16(x) != want;
    bad += l2l_bf16_to_f32(want) != (isinf(lo) ? lo : (want == (hi_bits >> 16) ? hi : lo));
  }
  CHECK(bad == 0, "%d bf16 conversions off", bad);
  CHECK(isnan(l2l_bf16_to_f32(l2l_f32_to_bf16(NAN))), "NaN stays NaN");
  CHECK(l2l_f32_to_bf16(3.4e38f) == 0x7f80, "rounds up to infinity past the largest bf16");
}

TEST(tensor_cast_matches_scalar_conversions) {
  int64_t n = check_rand_int(1000, 5000);
  l2l_tensor *x = check_randn(100.0, 1, n);
  int64_t shape[1] = {n};
  l2l_tensor *h = check_tensor(L2L_POOL_HOST, L2L_F16, 1, shape);
  l2l_tensor *b = check_tensor(L2L_POOL_PINNED, L2L_BF16, 1, shape);
  l2l_tensor *back = check_f32(1, n);
  CHECK_OK(l2l_tensor_cast(h, x));
  CHECK_OK(l2l_tensor_cast(b, x));
  const uint16_t *hd = l2l_tensor_data(h), *bd = l2l_tensor_data(b);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    bad += hd[i] != l2l_f32_to_f16(check_data(x)[i]);
    bad += bd[i] != l2l_f32_to_bf16(check_data(x)[i]);
  }
  CHECK(bad == 0, "%d elements differ from the scalar conversions", bad);
  check_poison(back);
  CHECK_OK(l2l_tensor_cast(back, b));
  for (int64_t i = 0; i < n; i++) bad += check_data(back)[i] != l2l_bf16_to_f32(bd[i]);
  CHECK(bad == 0, "bf16 -> f32");
  l2l_tensor_free(x), l2l_tensor_free(h), l2l_tensor_free(b), l2l_tensor_free(back);
}

TEST(tensor_cast_to_int_refuses_non_integers_and_writes_nothing) {
  l2l_tensor *x = check_f32(1, (int64_t)5), *ids = check_tensor(L2L_POOL_HOST, L2L_I32, 1,
                                                               (int64_t[]){5});
  float vals[5] = {0, 7, -3, 2.5f, 1};
  memcpy(check_data(x), vals, sizeof vals);
  int32_t *d = l2l_tensor_data(ids);
  for (int i = 0; i < 5; i++) d[i] = 99;
  CHECK_FAILS(l2l_tensor_cast(ids, x), L2L_ERR_INVALID, "src[3] is not an integer");
  for (int i = 0; i < 5; i++) CHECK(d[i] == 99, "element %d untouched", i);
  check_data(x)[3] = 3e9f;
  CHECK_FAILS(l2l_tensor_cast(ids, x), L2L_ERR_INVALID, "int32");
  check_data(x)[3] = 4;
  CHECK_OK(l2l_tensor_cast(ids, x));
  CHECK(d[0] == 0 && d[1] == 7 && d[2] == -3 && d[3] == 4 && d[4] == 1, "exact integers");
  l2l_tensor *u8 = check_tensor(L2L_POOL_HOST, L2L_U8, 1, (int64_t[]){5});
  CHECK_FAILS(l2l_tensor_cast(u8, x), L2L_ERR_INVALID, "cannot cast f32 to u8");
  l2l_tensor *dev = check_tensor(L2L_POOL_DEVICE, L2L_F16, 1, (int64_t[]){5});
  CHECK_FAILS(l2l_tensor_cast(dev, x), L2L_ERR_INVALID, "'device'");
  l2l_tensor_free(x), l2l_tensor_free(ids), l2l_tensor_free(u8), l2l_tensor_free(dev);
}

TEST(copy_and_fill) {
  int64_t n = check_rand_int(1, 3000);
  l2l_tensor *a = check_randn(1.0, 2, n, (int64_t)3), *d = NULL;
  int64_t shape[2] = {n, 3};
  d = check_tensor(L2L_POOL_DEVICE, L2L_F32, 2, shape);
  check_poison(d);
  CHECK_OK(l2l_tensor_copy(d, a)); /* host -> device is a transfer: allowed */
  CHECK(memcmp(check_data(d), check_data(a), (size_t)n * 12) == 0, "copied bytes");
  CHECK_OK(l2l_tensor_fill(d, -2.5));
  int bad = 0;
  for (int64_t i = 0; i < 3 * n; i++) bad += check_data(d)[i] != -2.5f;
  CHECK(bad == 0, "fill");
  l2l_tensor *ids = check_tensor(L2L_POOL_HOST, L2L_I32, 1, (int64_t[]){7});
  CHECK_FAILS(l2l_tensor_fill(ids, 1.5), L2L_ERR_INVALID, "not an int32");
  CHECK_FAILS(l2l_tensor_copy(ids, a), L2L_ERR_INVALID, "l2l_tensor_cast");
  CHECK_OK(l2l_tensor_fill(ids, -7));
  CHECK(((int32_t *)l2l_tensor_data(ids))[6] == -7, "i32 fill");
  l2l_tensor *h = check_tensor(L2L_POOL_HOST, L2L_BF16, 1, (int64_t[]){9});
  CHECK_OK(l2l_tensor_fill(h, 1.0 / 3.0));
  CHECK(((uint16_t *)l2l_tensor_data(h))[8] == l2l_f32_to_bf16(1.0f / 3.0f), "bf16 fill");
  l2l_tensor *v = NULL;
  CHECK_OK(l2l_tensor_view_rows(&v, a, 0, n > 1 ? n - 1 : 1));
  if (n > 2) {   /* rows [0, n - 1) and [1, n) share rows 1 .. n - 2 (none when n = 2:
                    seed 1160 drew it, and the copy rightly went through) */
    l2l_tensor *w = NULL;
    CHECK_OK(l2l_tensor_view_rows(&w, a, 1, n - 1));
    CHECK_FAILS(l2l_tensor_copy(w, v), L2L_ERR_INVALID, "overlap");
    l2l_tensor_free(w);
  }
  l2l_tensor_free(v), l2l_tensor_free(a), l2l_tensor_free(d), l2l_tensor_free(ids);
  l2l_tensor_free(h);
}

/* ---------------------------------------------------------------- random numbers */

TEST(philox_matches_published_known_answers) {
  struct {
    uint32_t ctr[4], key[2], out[4];
  } kat[3] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (int k = 0; k < 3; k++) {
    uint32_t out[4];
    CHECK_OK(l2l_philox4x32(out, kat[k].ctr, kat[k].key));
    CHECK(memcmp(out, kat[k].out, sizeof out) == 0, "vector %d: %08x %08x %08x %08x", k, out[0],
          out[1], out[2], out[3]);
  }
  uint32_t out[4];
  CHECK_FAILS(l2l_philox4x32(out, NULL, kat[0].key), L2L_ERR_INVALID, "must not be NULL");
}

static void check_split_invariance(bool normal) {
  uint64_t seed = check_rand_u64(), stream = check_rand_u64();
  int64_t rows = check_rand_int(3, 17), cols = check_rand_int(1, 13);
  l2l_tensor *whole = check_f32(2, rows, cols), *parts = check_f32(2, rows, cols);
  check_poison(parts);
  CHECK_OK(normal ? l2l_tensor_normal(whole, seed, stream, 0, 0.5, 2.0)
                  : l2l_tensor_uniform(whole, seed, stream, 0, -1.0, 3.0));
  for (int64_t r = 0; r < rows;) { /* uneven micro-batches */
    int64_t count = check_rand_int(1, rows - r);
    l2l_tensor *v = NULL;
    CHECK_OK(l2l_tensor_view_rows(&v, parts, r, count));
    int64_t first = l2l_tensor_offset(v);
    CHECK_OK(normal ? l2l_tensor_normal(v, seed, stream, first, 0.5, 2.0)
                    : l2l_tensor_uniform(v, seed, stream, first, -1.0, 3.0));
    l2l_tensor_free(v);
    r += count;
  }
  CHECK(memcmp(check_data(whole), check_data(parts), (size_t)(rows * cols) * 4) == 0,
        "%s draws change with the split", normal ? "normal" : "uniform");
  l2l_tensor_free(whole), l2l_tensor_free(parts);
}

TEST(random_fills_do_not_depend_on_the_split) {
  check_split_invariance(false);
  check_split_invariance(true);
}

/* Rounding to the dtype must not reach hi: with bf16 over [1, 1.0625) (16 representable
   values), about 1 draw in 32 would round up to hi without the step down. */
TEST(uniform_fills_stay_below_hi_after_rounding) {
  int64_t n = 100000;
  l2l_tensor *b = check_tensor(L2L_POOL_HOST, L2L_BF16, 1, &n), *f = check_f32(1, n);
  CHECK_OK(l2l_tensor_uniform(b, check_rand_u64(), 3, 0, 1.0, 1.0625));
  CHECK_OK(l2l_tensor_uniform(f, check_rand_u64(), 3, 0, 2.0, 6.0));
  const uint16_t *bd = l2l_tensor_data(b);
  int over = 0, top = 0;
  for (int64_t i = 0; i < n; i++) {
    float v = l2l_bf16_to_f32(bd[i]);
    over += v >= 1.0625f || v < 1.0f;
    top += v == 1.0625f - 0x1p-7f;          /* the largest bf16 below hi is reached */
    over += check_data(f)[i] >= 6.0f || check_data(f)[i] < 2.0f;
  }
  CHECK(over == 0 && top > 0, "%d draws outside [lo, hi); %d at the top value", over, top);
  l2l_tensor_free(b), l2l_tensor_free(f);
}

TEST(random_fills_have_the_right_moments_and_differ_by_key) {
  int64_t n = 1 << 20;
  uint64_t seed = check_rand_u64();
  l2l_tensor *u = check_f32(1, n), *z = check_f32(1, n), *z2 = check_f32(1, n);
  CHECK_OK(l2l_tensor_uniform(u, seed, 1, 0, 2.0, 6.0));
  CHECK_OK(l2l_tensor_normal(z, seed, 1, 0, -1.0, 3.0));
  CHECK_OK(l2l_tensor_normal(z2, seed, 2, 0, -1.0, 3.0));
  double su = 0, sz = 0, szz = 0, lo = 1e9, hi = -1e9, same = 0;
  for (int64_t i = 0; i < n; i++) {
    double a = check_data(u)[i], b = check_data(z)[i];
    su += a, sz += b, szz += (b + 1) * (b + 1);
    lo = fmin(lo, a), hi = fmax(hi, a);
    same += check_data(z)[i] == check_data(z2)[i];
  }
  /* 2^20 samples: standard errors are (4 / sqrt 12) / 1024 = 0.0011 (uniform mean),
     3 / 1024 = 0.0029 (normal mean) and 9 sqrt(2) / 1024 = 0.0124 (normal variance: a
     square of N(0, 9) has variance 2 x 81); bounds are over 5 standard errors, which the
     three miss by chance once in 1.7 million runs together. (The variance's bound was
     0.05, 4 standard errors: one run in 17,000.) */
  CHECK(fabs(su / n - 4.0) < 0.006, "uniform mean %g", su / n);
  CHECK(lo >= 2.0 && hi < 6.0 && hi > 5.99 && lo < 2.01, "uniform range [%g, %g]", lo, hi);
  CHECK(fabs(sz / n + 1.0) < 0.015, "normal mean %g", sz / n);
  CHECK(fabs(szz / n - 9.0) < 0.065, "normal variance %g", szz / n);
  CHECK(same < 10, "another stream gives other numbers (%g equal)", same);
  CHECK_FAILS(l2l_tensor_uniform(u, 1, 1, 0, 3.0, 2.0), L2L_ERR_INVALID, "lo <= hi");
  CHECK_FAILS(l2l_tensor_normal(u, 1, 1, -1, 0.0, 1.0), L2L_ERR_INVALID, "first");
  l2l_tensor_free(u), l2l_tensor_free(z), l2l_tensor_free(z2);
}

/* ---------------------------------------------------------------- pools */

TEST(pool_accounting_is_exact) {
  for (int pool = 0; pool < 3; pool++) {
    l2l_pool_stats start = stats_of(pool);
    CHECK_OK(l2l_pool_reset_peak(pool));
    l2l_tensor *live[40] = {0};
    uint64_t expect = start.current, peak = start.current;
    uint64_t allocs = 0, frees = 0;
    for (int step = 0; step < 200; step++) {
      int slot = (int)check_rand_int(0, 39);
      if (live[slot]) {
        expect -= (uint64_t)((l2l_tensor_numel(live[slot]) * 2 + 63) / 64 * 64);
        l2l_tensor_free(live[slot]);
        live[slot] = NULL;
        frees++;
      } else {
        int64_t n = check_rand_int(1, 5000);
        live[slot] = check_tensor(pool, L2L_F16, 1, &n);
        expect += (uint64_t)((n * 2 + 63) / 64 * 64);
        allocs++;
        if (expect > peak) peak = expect;
      }
      l2l_pool_stats s = stats_of(pool);
      if (!CHECK(s.current == expect && s.peak == peak, "%s step %d: current %llu peak %llu, "
                 "want %llu %llu", l2l_pool_name(pool), step, (unsigned long long)s.current,
                 (unsigned long long)s.peak, (unsigned long long)expect,
                 (unsigned long long)peak))
        break;
    }
    for (int i = 0; i < 40; i++)
      if (live[i]) l2l_tensor_free(live[i]), frees++;
    l2l_pool_stats end = stats_of(pool);
    CHECK(end.current == start.current, "all returned");
    CHECK(end.allocs - start.allocs == allocs && end.frees - start.frees == frees, "counts");
  }
}

/* The pools keep the pages of freed tensors for the next allocation (a training step
   frees and allocates the same sizes every step) and count them in `reserved`;
   l2l_device_release_cache gives them back. A sanitizer build allocates with
   aligned_alloc and caches nothing of its own. */
TEST(pools_cache_freed_pages_until_released) {
  for (int pool = 0; pool < 3; pool++) {
    CHECK_OK(l2l_device_release_cache());
    l2l_pool_stats start = stats_of(pool);
    CHECK(start.reserved == start.current, "%s after release: reserved %llu, current %llu",
          l2l_pool_name(pool), (unsigned long long)start.reserved,
          (unsigned long long)start.current);
    int64_t n = check_rand_int(3, 9) << 20; /* 12-36 MiB: whole pages */
    l2l_tensor *t = check_tensor(pool, L2L_F32, 1, &n);
    if (!t) continue;
    CHECK_OK(l2l_tensor_fill(t, 1.0)); /* touch every page */
    l2l_tensor_free(t);
    l2l_pool_stats freed = stats_of(pool);
    uint64_t cached = freed.reserved - freed.current;
    CHECK(freed.current == start.current, "%s: current back to %llu", l2l_pool_name(pool),
          (unsigned long long)start.current);
#ifdef L2L_SANITIZE
    if (pool != L2L_POOL_PINNED) /* the pinned pool's block cache works in every build */
      CHECK(cached == 0, "%s: a sanitizer build caches nothing, got %llu", l2l_pool_name(pool),
            (unsigned long long)cached);
#else
    CHECK(cached >= (uint64_t)n * 4, "%s: %llu bytes freed, %llu counted as cached",
          l2l_pool_name(pool), (unsigned long long)n * 4, (unsigned long long)cached);
#endif
    CHECK_OK(l2l_device_release_cache());
    l2l_pool_stats released = stats_of(pool);
    CHECK(released.reserved == released.current, "%s after release: reserved %llu, current %llu",
          l2l_pool_name(pool), (unsigned long long)released.reserved,
          (unsigned long long)released.current);
  }
}

/* pool_trim gives back the host arena's cache once it holds POOL_TRIM_BYTES or more (what
   a relay's f32 masters leave when they become bf16 or pinned), and keeps a smaller one
   (a step's). A sanitizer build's pools cache nothing of jemalloc's to give back. */
TEST(pool_trim_gives_back_a_cache_past_its_threshold) {
  CHECK_OK(l2l_device_release_cache());
  int64_t small = check_rand_int(1, POOL_TRIM_BYTES / 4 / 4096 / 2) * 1024;   /* < half */
  int64_t large = (POOL_TRIM_BYTES / 4) + check_rand_int(1, 8 << 20);
  for (int k = 0; k < 2; k++) {
    int64_t n = k ? large : small;
    l2l_tensor *t = check_tensor(L2L_POOL_HOST, L2L_F32, 1, &n);
    if (!t) return;
    CHECK_OK(l2l_tensor_fill(t, 1.0));   /* every page touched */
    l2l_tensor_free(t);
    l2l_pool_stats freed = stats_of(L2L_POOL_HOST);
    pool_trim(L2L_POOL_HOST);
    l2l_pool_stats trimmed = stats_of(L2L_POOL_HOST);
    uint64_t before = freed.reserved - freed.current, after = trimmed.reserved - trimmed.current;
#ifdef L2L_SANITIZE
    CHECK(before == 0 && after == 0, "a sanitizer build caches nothing: %llu, %llu",
          (unsigned long long)before, (unsigned long long)after);
#else
    CHECK(before >= (uint64_t)n * 4, "%lld bytes freed, %llu counted as cached", (long long)n * 4,
          (unsigned long long)before);
    if (k) CHECK(after == 0, "%llu bytes cached after a trim of %llu (at least %d)",
                 (unsigned long long)after, (unsigned long long)before, POOL_TRIM_BYTES);
    else CHECK(after == before, "a cache of %llu bytes, under %d, trimmed to %llu",
               (unsigned long long)before, POOL_TRIM_BYTES, (unsigned long long)after);
#endif
  }
  CHECK_OK(l2l_device_release_cache());
}

/* A measuring thread's bytes stay out of the pools' peaks while another thread's count:
   a thread measures (pool_measuring_begin) and holds a large tensor while the test's
   thread makes a small one; the peak is then the bytes in use before plus the small one's
   accounted bytes, to the byte (the large one's would be over it). What the measuring
   thread still holds when it ends is the program's: the next allocation's peak counts it. */
struct measuring_thread {
  int64_t n;
  l2l_tensor *t;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int phase;   /* 1: it holds its tensor; 2: it may free and end; 3: it ended */
  bool keep;   /* end holding it */
};
static void measuring_set(struct measuring_thread *m, int phase) {
  pthread_mutex_lock(&m->lock);
  m->phase = phase;
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
}
static void measuring_wait(struct measuring_thread *m, int phase) {
  pthread_mutex_lock(&m->lock);
  while (m->phase < phase) pthread_cond_wait(&m->cond, &m->lock);
  pthread_mutex_unlock(&m->lock);
}
static void *measuring_body(void *arg) {
  struct measuring_thread *m = arg;
  pool_measuring_begin();
  l2l_tensor_new(&m->t, L2L_POOL_HOST, L2L_F32, 1, &m->n);
  measuring_set(m, 1);
  measuring_wait(m, 2);
  if (!m->keep) {
    l2l_tensor_free(m->t);
    m->t = NULL;
  }
  pool_measuring_end();
  measuring_set(m, 3);
  return NULL;
}

TEST(pool_measuring_stays_out_of_the_peaks_of_other_threads) {
  for (int keep = 0; keep < 2; keep++) {
    struct measuring_thread m = {.n = check_rand_int(1 << 20, 4 << 20), .keep = keep,
                                 .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    CHECK_OK(l2l_pool_reset_peak(L2L_POOL_HOST));
    uint64_t before = stats_of(L2L_POOL_HOST).current;
    pthread_t th;
    if (!CHECK(pthread_create(&th, NULL, measuring_body, &m) == 0, "no thread")) return;
    measuring_wait(&m, 1);
    int64_t small = check_rand_int(1, 4096);
    l2l_tensor *t = check_tensor(L2L_POOL_HOST, L2L_F32, 1, &small);
    l2l_pool_stats s = stats_of(L2L_POOL_HOST);
    CHECK(m.t != NULL && s.current == before + pool_accounted((uint64_t)m.n * 4) + pool_accounted((uint64_t)small * 4),
          "in use %llu, want %llu + both tensors", (unsigned long long)s.current, (unsigned long long)before);
    CHECK(s.peak == before + pool_accounted((uint64_t)small * 4),
          "peak %llu with a measuring thread's %lld floats held: want %llu (in use before, %llu, and "
          "this thread's %lld floats)", (unsigned long long)s.peak, (long long)m.n,
          (unsigned long long)(before + pool_accounted((uint64_t)small * 4)), (unsigned long long)before,
          (long long)small);
    measuring_set(&m, 2);
    measuring_wait(&m, 3);
    pthread_join(th, NULL);
    l2l_tensor *u = check_tensor(L2L_POOL_HOST, L2L_F32, 1, &small);   /* a peak taken now */
    s = stats_of(L2L_POOL_HOST);
    if (keep) CHECK(s.peak == s.current, "kept after the end: peak %llu, in use %llu (the kept tensor "
                    "is the program's)", (unsigned long long)s.peak, (unsigned long long)s.current);
    else CHECK(s.peak < before + pool_accounted((uint64_t)m.n * 4), "freed inside: peak %llu",
               (unsigned long long)s.peak);
    l2l_tensor_free(m.t);
    FREE(t, u);
  }
}

/* pool_blocks_absent against mincore(2), the system's other account of the same pages:
   a host tensor given back (pool_zero_pages), kept from 2 MiB pages, then written at a few
   places in its first 2 MiB, asked about in blocks of a drawn size;
   no block is absent that has a resident page (the direction that would lose data;
   a swapped page is neither), every written block is not absent, some block is (so the
   answer is not vacuous), and too short a list and another pool's memory are refused.
   Skipped where /proc/self/pagemap does not say which pages are in memory. */
TEST(pool_blocks_absent_agrees_with_mincore) {
  long page = sysconf(_SC_PAGESIZE);
  int64_t n = (int64_t)check_rand_int(8, 16) << 18;   /* 8-16 MiB of floats, + a tail */
  n += check_rand_int(0, page / 4);
  l2l_tensor *t = check_tensor(L2L_POOL_HOST, L2L_F32, 1, &n);
  if (!t) return;
  float *x = l2l_tensor_data(t);
  uint64_t bytes = (uint64_t)n * sizeof *x, block = (uint64_t)check_rand_int(1000, 40000);
  pool_zero_pages(L2L_POOL_HOST, x, bytes);
  /* kept from 2 MiB pages: the kernel's khugepaged may make one of a range with any page
     in memory at any time, between the two accounts */
  uintptr_t whole = ((uintptr_t)x + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
  madvise((void *)whole, ((uintptr_t)x + bytes) / (uintptr_t)page * (uintptr_t)page - whole, MADV_NOHUGEPAGE);
  int64_t written[4];
  for (int w = 0; w < 4; w++) x[written[w] = check_rand_int(0, (2 << 20) / 4 - 1)] = 1.0f;
  size_t blocks = (size_t)((bytes + block - 1) / block);
  uint8_t *absent = malloc(blocks);
  uintptr_t first = (uintptr_t)x / (uintptr_t)page;
  size_t pages = ((uintptr_t)x + bytes - 1) / (uintptr_t)page - first + 1;
  unsigned char *resident = malloc(pages);
  if (absent == NULL || resident == NULL) {
    CHECK(false, "no memory for the lists");
  } else if (!pool_blocks_absent(L2L_POOL_HOST, x, bytes, block, absent, blocks)) {
    check_skip("/proc/self/pagemap does not say which pages are in memory here");
  } else if (CHECK(mincore((void *)(first * (uintptr_t)page), pages * (uintptr_t)page, resident) == 0,
                   "mincore failed")) {
    size_t some = 0, wrong = 0;
    for (size_t b = 0; b < blocks; b++) {
      uintptr_t lo = (uintptr_t)x + b * block, hi = lo + (b + 1 < blocks ? block : bytes - b * block);
      bool in = false;
      for (uintptr_t p = lo / (uintptr_t)page; p <= (hi - 1) / (uintptr_t)page; p++) in |= resident[p - first] & 1;
      wrong += absent[b] && in;   /* (a swapped page: neither absent nor resident) */
      some += absent[b];
    }
    for (int w = 0; w < 4; w++)
      CHECK(!absent[(uint64_t)written[w] * 4 / block], "element %lld was written: its block is not absent",
            (long long)written[w]);
    CHECK(wrong == 0, "%zu of %zu blocks of %llu bytes absent but resident", wrong, blocks,
          (unsigned long long)block);
    CHECK(some > 0, "no block of %zu reported absent", blocks);
    CHECK(!pool_blocks_absent(L2L_POOL_HOST, x, bytes, block, absent, blocks - 1), "a list one block short was taken");
    CHECK(!pool_blocks_absent(L2L_POOL_PINNED, x, bytes, block, absent, blocks),
          "memory said to be the pinned pool's was answered for");
  }
  free(absent);
  free(resident);
  l2l_tensor_free(t);
}

/* The pinned pool keeps what it holds from the system under its cap: past it, pinned
   tensors come from pageable memory (counted in `fallback`) and work the same; a lower
   cap gives cached blocks back; cap 0 removes it. Sizes are drawn so that the tensors
   add up to two to four times the cap. */
TEST(pinned_pool_caps_what_it_holds) {
  CHECK_OK(l2l_device_release_cache());
  l2l_pool_stats start = stats_of(L2L_POOL_PINNED);
  CHECK(start.cap > 0, "the pinned pool has a cap by default");
  const uint64_t cap = (uint64_t)check_rand_int(2, 5) << 20;
  CHECK_OK(l2l_pinned_set_cap(start.reserved + cap));
  enum { COUNT = 12 };
  l2l_tensor *t[COUNT] = {NULL};
  uint64_t asked = 0;
  int64_t n[COUNT];
  for (int i = 0; i < COUNT; i++) {
    n[i] = check_rand_int(40000, (int64_t)(cap / 2)) / 4;   /* f32 elements */
    t[i] = check_tensor(L2L_POOL_PINNED, L2L_F32, 1, &n[i]);
    if (t[i] == NULL) break;
    asked += ((uint64_t)n[i] * 4 + 63) & ~(uint64_t)63;
    CHECK_OK(l2l_tensor_fill(t[i], (double)i));   /* every byte of each is usable */
  }
  l2l_pool_stats full = stats_of(L2L_POOL_PINNED);
  CHECK(full.cap == start.reserved + cap, "cap %llu, set %llu", (unsigned long long)full.cap,
        (unsigned long long)(start.reserved + cap));
  CHECK(full.current - start.current == asked, "current grew by %llu for %llu bytes of tensors",
        (unsigned long long)(full.current - start.current), (unsigned long long)asked);
  CHECK(full.fallback > 0 && full.fallback_allocs > start.fallback_allocs,
        "%llu bytes of tensors past a cap of %llu: %llu bytes fell back", (unsigned long long)asked,
        (unsigned long long)cap, (unsigned long long)full.fallback);
  CHECK(full.reserved - full.fallback <= full.cap + (uint64_t)COUNT * L2L_ALIGN, /* headers */
        "held %llu bytes from the system beside %llu of fallback, cap %llu",
        (unsigned long long)full.reserved, (unsigned long long)full.fallback,
        (unsigned long long)full.cap);
  for (int i = 0; i < COUNT && t[i]; i++) {
    double sum = -1;
    CHECK_OK(l2l_sum(&sum, t[i]));
    CHECK(sum == (double)i * (double)n[i], "tensor %d sums to %g, want %g", i, sum,
          (double)i * (double)n[i]);
    l2l_tensor_free(t[i]);
  }
  l2l_pool_stats freed = stats_of(L2L_POOL_PINNED);
  CHECK(freed.current == start.current && freed.fallback == start.fallback,
        "after freeing: current %llu (was %llu), fallback %llu", (unsigned long long)freed.current,
        (unsigned long long)start.current, (unsigned long long)freed.fallback);
  CHECK(freed.reserved > start.reserved, "freed blocks are kept for reuse");
  CHECK_OK(l2l_pinned_set_cap(start.reserved + 1));   /* lower: the cached blocks go back */
  l2l_pool_stats lowered = stats_of(L2L_POOL_PINNED);
  CHECK(lowered.reserved == start.reserved, "a lower cap leaves %llu bytes held (was %llu)",
        (unsigned long long)lowered.reserved, (unsigned long long)start.reserved);
  CHECK_OK(l2l_pinned_set_cap(0));   /* no cap: nothing falls back */
  int64_t big = (int64_t)(2 * cap);
  l2l_tensor *u = check_tensor(L2L_POOL_PINNED, L2L_U8, 1, &big);
  CHECK(stats_of(L2L_POOL_PINNED).fallback_allocs == freed.fallback_allocs,
        "without a cap a %lld-byte tensor fell back", (long long)big);
  l2l_tensor_free(u);
  CHECK_OK(l2l_pinned_set_cap(start.cap));
  CHECK_OK(l2l_device_release_cache());
}

TEST(pool_budget_refuses_with_the_numbers) {
  l2l_pool_stats start = stats_of(L2L_POOL_DEVICE);
  uint64_t budget = start.current + 10000;
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, budget));
  int64_t n = 2000; /* 8000 bytes: fits */
  l2l_tensor *a = check_tensor(L2L_POOL_DEVICE, L2L_F32, 1, &n), *b = NULL;
  int64_t m = 600;  /* 2432 accounted: does not */
  char want[200];
  snprintf(want, sizeof want, "device pool: cannot allocate 2432 bytes (2.38 KiB): %llu bytes",
           (unsigned long long)(start.current + 8000));
  CHECK_FAILS(l2l_tensor_new(&b, L2L_POOL_DEVICE, L2L_F32, 1, &m), L2L_ERR_BUDGET, want);
  snprintf(want, sizeof want, "budget %llu bytes", (unsigned long long)budget);
  CHECK(strstr(l2l_last_error(), want) != NULL, "names the budget: %s", l2l_last_error());
  l2l_error_detail detail;   /* the smallest budget that works: in use, and the tensor */
  CHECK_OK(l2l_last_error_detail(&detail));
  CHECK(detail.needed_bytes == start.current + 8000 + 2432, "needed_bytes %llu, want %llu",
        (unsigned long long)detail.needed_bytes, (unsigned long long)(start.current + 8000 + 2432));
  l2l_pool_stats s = stats_of(L2L_POOL_DEVICE);
  CHECK(s.current == start.current + 8000 && s.refused == start.refused + 1,
        "a refusal changes nothing but the count");
  CHECK(b == NULL, "no tensor");
  CHECK_FAILS(l2l_pool_set_budget(L2L_POOL_DEVICE, start.current + 100), L2L_ERR_STATE,
              "below");
  l2l_tensor_free(a);
  m = 2400; /* 9600 now fits */
  CHECK_OK(l2l_tensor_new(&b, L2L_POOL_DEVICE, L2L_F32, 1, &m));
  l2l_tensor_free(b);
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, 0));
  CHECK_FAILS(l2l_pool_get_stats(NULL, L2L_POOL_HOST), L2L_ERR_INVALID, "out is NULL");
  CHECK_FAILS(l2l_pool_set_budget(3, 1), L2L_ERR_INVALID, "pool");
  CHECK(l2l_pool_name(L2L_POOL_PINNED) && strcmp(l2l_pool_name(L2L_POOL_PINNED), "pinned") == 0,
        "names");
}

/* The host pool starts with the machine's memory as its budget: an allocation that can
   never succeed is refused at once with the numbers, instead of being mapped and then
   killing the process when touched (a layer of dim and mlp 2^20 reached the OOM killer). */
TEST(pool_host_budget_refuses_what_can_never_fit) {
  l2l_pool_stats start = stats_of(L2L_POOL_HOST);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  CHECK(start.budget == (uint64_t)pages * (uint64_t)page, "host budget %llu, memory %llu",
        (unsigned long long)start.budget, (unsigned long long)((uint64_t)pages * (uint64_t)page));
  int64_t huge[2] = {INT64_C(1) << 24, INT64_C(1) << 24};   /* 2^48 floats: 1 PiB */
  l2l_tensor *t = NULL;
  CHECK_FAILS(l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, 2, huge), L2L_ERR_BUDGET, "budget");
  CHECK(t == NULL, "no tensor");
  l2l_layer_config c = default_layer_config(L2L_LAYER_BLOCK);
  c.dim = c.mlp = INT64_C(1) << 20;
  c.heads = 16;
  l2l_layer *layer = NULL;
  CHECK_FAILS(l2l_layer_new(&layer, &c, L2L_POOL_HOST), L2L_ERR_BUDGET, "host pool");
  CHECK(layer == NULL, "no layer");
  l2l_pool_stats end = stats_of(L2L_POOL_HOST);
  CHECK(end.current == start.current, "refusals left %lld bytes in use",
        (long long)(end.current - start.current));
  /* settable like any pool's, 0 removing it */
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_HOST, start.current + (1 << 20)));
  int64_t n = 1 << 19;   /* 2 MiB */
  CHECK_FAILS(l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, 1, &n), L2L_ERR_BUDGET, "budget");
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_HOST, start.budget));
  /* More than the machine has is refused before the system is asked, budget or not, in
     every pool of host memory (the pinned pool; the device pool on the CPU backend): with
     no budget it was mapped, and a sanitizer's allocator aborted. */
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_HOST, 0));
  const l2l_pool_kind hosted[] = {L2L_POOL_HOST, L2L_POOL_PINNED, L2L_POOL_DEVICE};
  for (int i = 0; i < 3; i++) {
    if (hosted[i] == L2L_POOL_DEVICE && strcmp(l2l_device_backend(), "cpu") != 0) continue;
    l2l_pool_stats before = stats_of(hosted[i]);
    uint64_t saved_budget = before.budget;
    CHECK_OK(l2l_pool_set_budget(hosted[i], 0));
    CHECK_FAILS(l2l_tensor_new(&t, hosted[i], L2L_F32, 2, huge), L2L_ERR_NOMEM,
                "more than this machine's memory");
    l2l_pool_stats after = stats_of(hosted[i]);
    CHECK(t == NULL && after.current == before.current && after.refused == before.refused + 1,
          "%s pool: a refusal changed its statistics", l2l_pool_name(hosted[i]));
    CHECK_OK(l2l_pool_set_budget(hosted[i], saved_budget));
  }
}

TEST(errors_are_per_thread_and_statuses_have_names) {
  l2l_clear_error();
  CHECK(strcmp(l2l_last_error(), "") == 0, "cleared");
  CHECK(strcmp(l2l_status_name(L2L_ERR_BUDGET), "over budget") == 0, "status names");
  CHECK(l2l_set_threads(0) == L2L_ERR_INVALID, "threads >= 1");
  int threads = l2l_get_threads();
  CHECK(threads >= 1, "threads %d", threads);
  CHECK_OK(l2l_set_threads(threads));
}

TEST(nans_handed_out_carry_no_payload) {
  /* LuaJIT keeps other values in NaNs' bits: a double with a NaN payload handed to Lua is
     taken for a pointer. Reductions and 16-bit widening give the one quiet NaN. */
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 3);
  uint32_t *bits = l2l_tensor_data(t);
  bits[0] = 0x3f800000u, bits[1] = 0xffae0af0u, bits[2] = 0x40000000u;
  const double plain = NAN;
  uint64_t want;
  memcpy(&want, &plain, sizeof want);
  l2l_status (*reductions[3])(double *, const l2l_tensor *) = {l2l_sum, l2l_max_abs, l2l_norm2};
  for (int i = 0; i < 3; i++) {
    double out = 0;
    uint64_t got;
    CHECK_OK(reductions[i](&out, t));
    memcpy(&got, &out, sizeof got);
    CHECK(got == want, "reduction %d gave NaN bits %016llx, want %016llx", i, (unsigned long long)got,
          (unsigned long long)want);
  }
  const float plainf = NAN;
  uint32_t wantf, gotf;
  memcpy(&wantf, &plainf, sizeof wantf);
  float wide = l2l_bf16_to_f32(0xffaeu);
  memcpy(&gotf, &wide, sizeof gotf);
  CHECK(gotf == wantf, "bf16 0xffae widened to %08x", gotf);
  wide = l2l_f16_to_f32(0xfe01u);
  memcpy(&gotf, &wide, sizeof gotf);
  CHECK(gotf == wantf, "f16 0xfe01 widened to %08x", gotf);
  l2l_tensor_free(t);
}
