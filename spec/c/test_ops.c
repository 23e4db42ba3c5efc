/* SPDX-License-Identifier: MIT */
/* test_ops.c — every op of l2l.h's "ops" section against naive double-precision references.
 *
 * What it tests: l2l_gemm and l2l_gemm_batched (all transposes, alpha/beta, beta = 0 never
 * reading c), bias add and its backward, the residual add, GELU forward and backward,
 * LayerNorm forward and backward, softmax forward (causal, key padding mask, scale) and
 * backward, embedding forward and backward, cross-entropy forward and backward
 * (ignore_index, scale), dropout forward and backward (the exact Philox keep decision,
 * mask bits, splitting a tensor into row views), the reductions and AdamW. Each op
 * family also has its refusals checked: NULL tensors, wrong dtypes, shape mismatches,
 * host/device pool mixing, overlapping outputs, values out of range; a refusal must name
 * the argument and leave every output as it was.
 *
 * How: inputs are drawn fresh each run from check.h's generator (independent of l2l's
 * Philox), with odd, prime and size-1 dims and a few cases larger than any cache. Each
 * expected value is computed in double by a plain loop written from the math stated in
 * l2l.h, never from the backend's code; gradients are additionally checked against central
 * finite differences of those double references. Outputs that an op writes are NaN-poisoned
 * first, so a forgotten element fails; outputs that an op accumulates start from random
 * values, so a write in place of an add fails. Comparisons are relative errors
 * (check_rel_err) with a floor, and each tolerance says why it is what it is.
 * All test names start with "op_", so `l2l_ctest op_` runs just this file.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "reference.h"

/* ---------------------------------------------------------------- tolerances */

/* One correctly rounded f32 operation per element (or two): at most 2^-24 ~ 6e-8 relative
   each; 1e-6 still catches any wrong formula while allowing a different exact evaluation. */
#define TOL_ROUNDED 1e-6
/* A handful of f32 operations and an exp good to a few ulp per element: ~10 ulp ~ 1e-6
   relative; 1e-5 leaves a margin of ten. */
#define TOL_ELEMENTWISE 1e-5
/* f32 sums of hundreds to tens of thousands of terms (GEMMs with a large K, long rows or
   columns): rounding grows like sqrt(K) to K ulp of the terms; 1e-4 bounds both. */
#define TOL_REDUCTION 1e-4

/* ---------------------------------------------------------------- tensors */

#define F32(...) NEW(L2L_POOL_HOST, L2L_F32, __VA_ARGS__)
#define I32(...) NEW(L2L_POOL_HOST, L2L_I32, __VA_ARGS__)
#define U8(...) NEW(L2L_POOL_HOST, L2L_U8, __VA_ARGS__)
#define DEV_F32(...) NEW(L2L_POOL_DEVICE, L2L_F32, __VA_ARGS__)
#define RANDN(scale, ...) fill_normal(F32(__VA_ARGS__), (scale))

static l2l_tensor *fill_uniform(l2l_tensor *t, double lo, double hi) {
  float *d = check_data(t);
  for (int64_t i = 0; i < numel(t); i++) d[i] = (float)check_rand_uniform(lo, hi);
  return t;
}

static void fill_value(l2l_tensor *t, float value) {
  float *d = check_data(t);
  for (int64_t i = 0; i < numel(t); i++) d[i] = value;
}

/* A random entry of a list of awkward sizes. */

/* ---------------------------------------------------------------- comparisons */

#define CHECK_CLOSE(what, got, want, n, floor, tol) \
  close_at(__FILE__, __LINE__, (what), (got), (want), (n), (floor), (tol))

#define CHECK_POOLS_NAMED() pools_named(__FILE__, __LINE__)

/* ================================================================ GEMM */

/* want = alpha op(a) op(b) + beta c0 for row-major a stored (m,k), or (k,m) when ta, and b
   stored (k,n), or (n,k) when tb. beta = 0 means c0 plays no part. */
static void ref_gemm(double *want, const float *a, const float *b, const float *c0, int64_t m,
                     int64_t n, int64_t k, int ta, int tb, double alpha, double beta) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; p++) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        acc += av * bv;
      }
      want[i * n + j] = alpha * acc + (beta != 0.0 ? beta * (double)c0[i * n + j] : 0.0);
    }
}

/* One l2l_gemm of unit-normal matrices against ref_gemm. With beta = 0, c starts as NaN,
   which must not reach the result. */
static void gemm_case(int64_t m, int64_t n, int64_t k, int ta, int tb, float alpha, float beta,
                      double tol) {
  l2l_tensor *a = ta ? RANDN(1.0, k, m) : RANDN(1.0, m, k);
  l2l_tensor *b = tb ? RANDN(1.0, n, k) : RANDN(1.0, k, n);
  l2l_tensor *c = F32(m, n);
  if (beta == 0.0f) check_poison(c);
  else fill_normal(c, 1.0);
  float *c0 = snapshot(c);
  double *want = doubles(m * n);
  ref_gemm(want, check_data(a), check_data(b), c0, m, n, k, ta, tb, alpha, beta);
  char what[160];
  snprintf(what, sizeof what, "gemm m=%lld n=%lld k=%lld ta=%d tb=%d alpha=%g beta=%g",
           (long long)m, (long long)n, (long long)k, ta, tb, alpha, beta);
  CHECK_OK(l2l_gemm(c, a, b, ta, tb, alpha, beta));
  /* Unit-normal entries: an element of op(a) op(b) is of size sqrt(k). */
  CHECK_CLOSE(what, check_data(c), want, m * n, fabs(alpha) * sqrt((double)k) + fabs(beta), tol);
  free(c0);
  free(want);
  FREE(a, b, c);
}

TEST(op_gemm_transposes) {
  static const int64_t sizes[] = {1, 3, 7, 13, 31, 97, 127};
  int cases = 0;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      /* All dims 1, then random awkward sizes; beta = 0 (c poisoned) and beta != 0. */
      gemm_case(1, 1, 1, ta, tb, (float)check_rand_uniform(-2, 2), 0.0f, TOL_ELEMENTWISE);
      for (int rep = 0; rep < 4; rep++) {
        float alpha = (float)check_rand_uniform(-2, 2);
        float beta = rep % 2 ? (float)check_rand_uniform(-1.5, 1.5) : 0.0f;
        /* k <= 127: a dot of at most 127 terms is good to ~sqrt(127) ulp of its size. */
        gemm_case(check_pick(sizes, 7), check_pick(sizes, 7), check_pick(sizes, 7), ta, tb, alpha, beta,
                  TOL_ELEMENTWISE);
        cases++;
      }
    }
  /* alpha = 0: c = beta c exactly, whatever a and b hold. */
  gemm_case(13, 7, 31, 0, 1, 0.0f, -0.75f, TOL_ROUNDED);
  CHECK(cases == 16, "ran %d cases", cases);
}

TEST(op_gemm_large) {
  /* A GEMM with dims above 1000 (bigger than the caches in every operand); a K of 1013
     makes each element a long f32 reduction. */
  gemm_case(1031, 61, 1013, 1, 0, (float)check_rand_uniform(0.5, 1.5),
            (float)check_rand_uniform(-1, 1), TOL_REDUCTION);
  gemm_case(1031, 61, 1013, 0, 1, (float)check_rand_uniform(-1.5, -0.5), 0.0f, TOL_REDUCTION);
  /* A very long inner dim. */
  gemm_case(3, 5, 65537, 0, 0, 1.0f, 0.0f, TOL_REDUCTION);
}

TEST(op_gemm_matrix_view) {
  /* l2l_gemm sees a 3-D a (2,3,K) as a (6,K) matrix, and a 3-D c (2,3,N) as (6,N). */
  int64_t k = 13, n = 7;
  l2l_tensor *a = RANDN(1.0, 2, 3, k), *b = RANDN(1.0, k, n), *c = F32(2, 3, n);
  check_poison(c);
  double *want = doubles(6 * n);
  ref_gemm(want, check_data(a), check_data(b), NULL, 6, n, k, 0, 0, 1.5, 0.0);
  CHECK_OK(l2l_gemm(c, a, b, 0, 0, 1.5f, 0.0f));
  CHECK_CLOSE("gemm 3-D a", check_data(c), want, 6 * n, 1.5 * sqrt((double)k), TOL_ELEMENTWISE);
  free(want);
  FREE(a, b, c);
}

/* Batched: every tensor is (batch..., rows, cols); ref_gemm per matrix. */
static void gemm_batched_case(const int64_t *a_shape, int a_nd, const int64_t *b_shape, int b_nd,
                              const int64_t *c_shape, int c_nd, int ta, int tb, float alpha,
                              float beta) {
  l2l_tensor *a = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, a_nd, a_shape), 1.0);
  l2l_tensor *b = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, b_nd, b_shape), 1.0);
  l2l_tensor *c = check_tensor(L2L_POOL_HOST, L2L_F32, c_nd, c_shape);
  if (beta == 0.0f) check_poison(c);
  else fill_normal(c, 1.0);
  int64_t m = c_shape[c_nd - 2], n = c_shape[c_nd - 1];
  int64_t k = ta ? a_shape[a_nd - 2] : a_shape[a_nd - 1];
  int64_t batch = numel(c) / (m * n);
  CHECK(batch >= 1 && numel(a) == batch * m * k && numel(b) == batch * k * n,
        "test shapes inconsistent");
  float *c0 = snapshot(c);
  double *want = doubles(numel(c));
  for (int64_t i = 0; i < batch; i++)
    ref_gemm(want + i * m * n, check_data(a) + i * m * k, check_data(b) + i * k * n,
             c0 + i * m * n, m, n, k, ta, tb, alpha, beta);
  char what[160];
  snprintf(what, sizeof what, "gemm_batched batch=%lld m=%lld n=%lld k=%lld ta=%d tb=%d beta=%g",
           (long long)batch, (long long)m, (long long)n, (long long)k, ta, tb, beta);
  CHECK_OK(l2l_gemm_batched(c, a, b, ta, tb, alpha, beta));
  CHECK_CLOSE(what, check_data(c), want, numel(c), fabs(alpha) * sqrt((double)k) + fabs(beta),
              TOL_ELEMENTWISE);
  free(c0);
  free(want);
  FREE(a, b, c);
}

TEST(op_gemm_batched) {
  static const int64_t sizes[] = {1, 3, 7, 13, 31};
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int rep = 0; rep < 2; rep++) {
        int64_t bt = check_pick((const int64_t[]){1, 3, 5}, 3);
        int64_t m = check_pick(sizes, 5), n = check_pick(sizes, 5), k = check_pick(sizes, 5);
        int64_t as[3] = {bt, ta ? k : m, ta ? m : k}, bs[3] = {bt, tb ? n : k, tb ? k : n};
        int64_t cs[3] = {bt, m, n};
        gemm_batched_case(as, 3, bs, 3, cs, 3, ta, tb, (float)check_rand_uniform(-2, 2),
                          rep ? (float)check_rand_uniform(-1, 1) : 0.0f);
      }
  /* 4-D: a (2,3,M,K), b (6,...) 3-D, c (3,2,M,N): only the batch counts (6) must agree. */
  for (int ta = 0; ta < 2; ta++) {
    int64_t m = 7, n = 5, k = 13;
    int64_t as[4] = {2, 3, ta ? k : m, ta ? m : k}, bs[3] = {6, n, k}, cs[4] = {3, 2, m, n};
    gemm_batched_case(as, 4, bs, 3, cs, 4, ta, 1, 0.5f, ta ? 0.0f : 2.0f);
  }
  /* 4-D with size-1 dims everywhere. */
  gemm_batched_case((const int64_t[]){1, 3, 1, 1}, 4, (const int64_t[]){3, 1, 1, 7}, 4,
                    (const int64_t[]){3, 1, 7}, 3, 0, 0, -1.0f, 0.0f);
  /* Plain matrices: a batch of one. */
  gemm_batched_case((const int64_t[]){31, 7}, 2, (const int64_t[]){7, 13}, 2,
                    (const int64_t[]){31, 13}, 2, 0, 0, 1.0f, 1.0f);
}

TEST(op_gemm_errors) {
  l2l_tensor *a = RANDN(1.0, 3, 5), *b = RANDN(1.0, 5, 2), *c = RANDN(1.0, 3, 2);
  l2l_tensor *ai = I32(3, 5), *bad_b = RANDN(1.0, 4, 2), *bad_c = RANDN(1.0, 3, 3);
  l2l_tensor *dev = DEV_F32(5, 2);
  float *c0 = snapshot(c);
  CHECK_FAILS(l2l_gemm(NULL, a, b, 0, 0, 1, 0), L2L_ERR_INVALID, "c is NULL");
  CHECK_FAILS(l2l_gemm(c, NULL, b, 0, 0, 1, 0), L2L_ERR_INVALID, "a is NULL");
  CHECK_FAILS(l2l_gemm(c, a, NULL, 0, 0, 1, 0), L2L_ERR_INVALID, "b is NULL");
  CHECK_FAILS(l2l_gemm(c, ai, b, 0, 0, 1, 0), L2L_ERR_INVALID, "a is i32");
  CHECK_FAILS(l2l_gemm(c, a, bad_b, 0, 0, 1, 0), L2L_ERR_INVALID, "inner dims");
  CHECK_FAILS(l2l_gemm(bad_c, a, b, 0, 0, 1, 0), L2L_ERR_INVALID, "c is (3,3)");
  CHECK_FAILS(l2l_gemm(c, a, b, 1, 0, 1, 0), L2L_ERR_INVALID, "inner dims"); /* a^T is (5,3) */
  CHECK_FAILS(l2l_gemm(c, a, b, 2, 0, 1, 0), L2L_ERR_INVALID, "trans_a");
  CHECK_FAILS(l2l_gemm(c, a, b, 0, 0, NAN, 0), L2L_ERR_INVALID, "alpha");
  CHECK_FAILS(l2l_gemm(c, a, b, 0, 0, 1, INFINITY), L2L_ERR_INVALID, "beta");
  CHECK_FAILS(l2l_gemm(c, a, dev, 0, 0, 1, 0), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK(same_bytes(c, c0), "a refused gemm changed c");

  /* c overlapping a: two row views of one storage. */
  l2l_tensor *big = RANDN(1.0, 10, 7), *va = NULL, *vc = NULL, *sq = RANDN(1.0, 7, 7);
  l2l_tensor *sq2 = RANDN(1.0, 7, 7);
  CHECK_OK(l2l_tensor_view_rows(&va, big, 0, 5));
  CHECK_OK(l2l_tensor_view_rows(&vc, big, 3, 5));
  float *big0 = snapshot(big);
  CHECK_FAILS(l2l_gemm(vc, va, sq, 0, 0, 1, 0), L2L_ERR_INVALID, "c overlaps a");
  float *sq0 = snapshot(sq);
  CHECK_FAILS(l2l_gemm(sq, sq2, sq, 0, 0, 1, 1), L2L_ERR_INVALID, "c overlaps b"); /* c == b */
  CHECK(same_bytes(sq, sq0), "a refused gemm changed c == b");
  free(sq0);
  CHECK(same_bytes(big, big0), "a refused gemm changed its overlapping c");

  /* Batched: batch counts must agree; every tensor needs 2 dims. */
  l2l_tensor *ba = RANDN(1.0, 2, 3, 4), *bb = RANDN(1.0, 3, 4, 5), *bc = F32(2, 3, 5);
  l2l_tensor *vec = RANDN(1.0, 5);
  CHECK_FAILS(l2l_gemm_batched(bc, ba, bb, 0, 0, 1, 0), L2L_ERR_INVALID, "batch counts differ");
  CHECK_FAILS(l2l_gemm_batched(c, a, vec, 0, 0, 1, 0), L2L_ERR_INVALID, "at least 2 dims");
  CHECK_FAILS(l2l_gemm_batched(c, a, dev, 0, 0, 1, 0), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_gemm_batched(NULL, a, b, 0, 0, 1, 0), L2L_ERR_INVALID, "c is NULL");
  free(c0);
  free(big0);
  FREE(a, b, c, ai, bad_b, bad_c, dev, big, va, vc, sq, sq2, ba, bb, bc, vec);
}

/* ================================================================ bias, add */

TEST(op_bias_add) {
  static const int64_t shapes[][4] = {{1, 1}, {1, 7}, {3, 7}, {2, 3, 13}, {131, 257}, {13}};
  static const int nds[] = {2, 2, 2, 3, 2, 1};
  for (int s = 0; s < 6; s++) {
    l2l_tensor *y = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    int64_t cols = shapes[s][nds[s] - 1], rows = numel(y) / cols;
    l2l_tensor *bias = RANDN(1.0, cols);
    double *want = doubles(numel(y));
    const float *yd = check_data(y), *bd = check_data(bias);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < cols; j++) want[r * cols + j] = (double)yd[r * cols + j] + bd[j];
    CHECK_OK(l2l_bias_add(y, bias));
    /* Each element is one f32 add. */
    CHECK_CLOSE("bias_add", check_data(y), want, numel(y), 1e-6, TOL_ROUNDED);
    free(want);
    FREE(y, bias);
  }
}

TEST(op_bias_backward) {
  static const int64_t shapes[][4] = {{1, 1}, {3, 7}, {2, 3, 13}, {1, 257}, {4099, 31}};
  static const int nds[] = {2, 2, 3, 2, 2};
  for (int s = 0; s < 5; s++) {
    l2l_tensor *dy = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    int64_t cols = shapes[s][nds[s] - 1], rows = numel(dy) / cols;
    l2l_tensor *dbias = RANDN(1.0, cols); /* accumulated onto: starts random */
    double *want = doubles(cols);
    const float *d = check_data(dy), *b0 = check_data(dbias);
    for (int64_t j = 0; j < cols; j++) {
      double acc = b0[j];
      for (int64_t r = 0; r < rows; r++) acc += d[r * cols + j];
      want[j] = acc;
    }
    CHECK_OK(l2l_bias_backward(dbias, dy));
    /* Column sums of `rows` unit normals are of size sqrt(rows); 4099 rows is a long f32
       reduction, the others a few terms. */
    CHECK_CLOSE("bias_backward", check_data(dbias), want, cols, sqrt((double)rows) + 1.0,
                rows > 100 ? TOL_REDUCTION : TOL_ELEMENTWISE);
    free(want);
    FREE(dy, dbias);
  }
}

TEST(op_bias_errors) {
  l2l_tensor *y = RANDN(1.0, 3, 7), *bias = RANDN(1.0, 7), *bias8 = RANDN(1.0, 8);
  l2l_tensor *bi = I32(7), *dev = DEV_F32(7), *row0 = NULL;
  CHECK_OK(l2l_tensor_view_rows(&row0, y, 0, 1));
  float *y0 = snapshot(y), *b0 = snapshot(bias);
  CHECK_FAILS(l2l_bias_add(NULL, bias), L2L_ERR_INVALID, "y is NULL");
  CHECK_FAILS(l2l_bias_add(y, NULL), L2L_ERR_INVALID, "bias is NULL");
  CHECK_FAILS(l2l_bias_add(y, bi), L2L_ERR_INVALID, "bias is i32");
  CHECK_FAILS(l2l_bias_add(y, bias8), L2L_ERR_INVALID, "bias has 8 elements");
  CHECK_FAILS(l2l_bias_add(y, dev), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_bias_add(y, row0), L2L_ERR_INVALID, "overlaps");
  CHECK(same_bytes(y, y0), "a refused bias_add changed y");
  CHECK_FAILS(l2l_bias_backward(NULL, y), L2L_ERR_INVALID, "dbias is NULL");
  CHECK_FAILS(l2l_bias_backward(bias, NULL), L2L_ERR_INVALID, "dy is NULL");
  CHECK_FAILS(l2l_bias_backward(bi, y), L2L_ERR_INVALID, "dbias is i32");
  CHECK_FAILS(l2l_bias_backward(bias8, y), L2L_ERR_INVALID, "dbias has 8 elements");
  CHECK_FAILS(l2l_bias_backward(dev, y), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_bias_backward(row0, y), L2L_ERR_INVALID, "overlaps");
  CHECK(same_bytes(bias, b0) && same_bytes(y, y0), "a refused bias_backward changed its output");
  free(y0);
  free(b0);
  FREE(y, bias, bias8, bi, dev, row0);
}

static void ref_add(double *want, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) want[i] = (double)a[i] + (double)b[i];
}

TEST(op_add) {
  static const int64_t shapes[][4] = {{1}, {7, 13}, {2, 3, 5, 7}, {31, 257}, {1, 1, 1, 97}};
  static const int nds[] = {1, 2, 4, 2, 4};
  for (int s = 0; s < 5; s++) {
    l2l_tensor *a = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    l2l_tensor *b = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 3.0);
    l2l_tensor *out = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    int64_t n = numel(a);
    double *want = doubles(n);
    ref_add(want, check_data(a), check_data(b), n);
    check_poison(out);
    CHECK_OK(l2l_add(out, a, b));
    /* One f32 add per element. */
    CHECK_CLOSE("add", check_data(out), want, n, 1e-6, TOL_ROUNDED);
    /* In place: out = a, then out = b (b += a). */
    float *a0 = snapshot(a);
    CHECK_OK(l2l_add(a, a, b));
    CHECK_CLOSE("add out == a", check_data(a), want, n, 1e-6, TOL_ROUNDED);
    memcpy(check_data(a), a0, (size_t)n * sizeof(float));
    CHECK_OK(l2l_add(b, a, b));
    CHECK_CLOSE("add out == b", check_data(b), want, n, 1e-6, TOL_ROUNDED);
    /* out == a == b: doubling. */
    for (int64_t i = 0; i < n; i++) want[i] = 2.0 * (double)a0[i];
    CHECK_OK(l2l_add(a, a, a));
    CHECK_CLOSE("add out == a == b", check_data(a), want, n, 1e-6, TOL_ROUNDED);
    free(a0);
    free(want);
    FREE(a, b, out);
  }
  /* The host and pinned pools belong to one backend: mixing them is allowed. */
  l2l_tensor *pa = fill_normal(NEW(L2L_POOL_PINNED, L2L_F32, 3, 7), 1.0);
  l2l_tensor *hb = RANDN(1.0, 3, 7), *ho = F32(3, 7);
  double *want = doubles(21);
  ref_add(want, check_data(pa), check_data(hb), 21);
  check_poison(ho);
  CHECK_OK(l2l_add(ho, pa, hb));
  CHECK_CLOSE("add pinned + host", check_data(ho), want, 21, 1e-6, TOL_ROUNDED);
  free(want);
  FREE(pa, hb, ho);
}

TEST(op_add_large) {
  /* 4099^2 = 16.8M floats (67 MB) per tensor: far beyond any cache, split across threads. */
  int64_t side = 4099, n = side * side;
  l2l_tensor *a = fill_uniform(F32(side, side), -1, 1), *b = fill_uniform(F32(side, side), -4, 4);
  l2l_tensor *out = F32(side, side);
  check_poison(out);
  CHECK_OK(l2l_add(out, a, b));
  enum { CHUNK = 1 << 16 };
  double *want = doubles(CHUNK);
  const float *ad = check_data(a), *bd = check_data(b), *od = check_data(out);
  double worst = 0.0;
  for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
    int64_t len = n - i0 < CHUNK ? n - i0 : CHUNK;
    ref_add(want, ad + i0, bd + i0, len);
    double e = check_rel_err(od + i0, want, len, 1e-6);
    if (e > worst) worst = e;
  }
  CHECK(worst <= TOL_ROUNDED, "16.8M-element add: relative error %.3g", worst);
  free(want);
  FREE(a, b, out);
}

TEST(op_add_errors) {
  l2l_tensor *a = RANDN(1.0, 6, 7), *b = RANDN(1.0, 6, 7), *out = RANDN(1.0, 6, 7);
  l2l_tensor *b2 = RANDN(1.0, 7, 6), *out2 = F32(42), *ai = I32(6, 7), *dev = DEV_F32(6, 7);
  l2l_tensor *shifted = NULL, *lead = NULL;
  CHECK_OK(l2l_tensor_view_rows(&lead, a, 0, 5));
  CHECK_OK(l2l_tensor_view_rows(&shifted, a, 1, 5));
  l2l_tensor *b5 = RANDN(1.0, 5, 7);
  float *o0 = snapshot(out), *a0 = snapshot(a);
  CHECK_FAILS(l2l_add(NULL, a, b), L2L_ERR_INVALID, "out is NULL");
  CHECK_FAILS(l2l_add(out, NULL, b), L2L_ERR_INVALID, "a is NULL");
  CHECK_FAILS(l2l_add(out, a, NULL), L2L_ERR_INVALID, "b is NULL");
  CHECK_FAILS(l2l_add(out, ai, b), L2L_ERR_INVALID, "a is i32");
  CHECK_FAILS(l2l_add(out, a, b2), L2L_ERR_INVALID, "b has shape (7,6)");
  CHECK_FAILS(l2l_add(out2, a, b), L2L_ERR_INVALID, "out has shape (42)");
  CHECK_FAILS(l2l_add(out, a, dev), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_add(dev, a, b), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  /* out overlapping a by all but one row: only exactly the same tensor is allowed. */
  CHECK_FAILS(l2l_add(shifted, lead, b5), L2L_ERR_INVALID, "out overlaps a");
  CHECK(same_bytes(out, o0) && same_bytes(a, a0), "a refused add changed an output");
  free(o0);
  free(a0);
  FREE(a, b, out, b2, out2, ai, dev, shifted, lead, b5);
}

/* ================================================================ GELU */

static const double GELU_K = 0.79788456080286535588; /* sqrt(2/pi) */

/* d/dx of ref_gelu: 1/2 (1 + tanh u) + x/2 sech^2(u) u', u' = k (1 + 3 * 0.044715 x^2). */
static double ref_gelu_grad(double x) {
  double t = tanh(GELU_K * (x + 0.044715 * x * x * x));
  double du = GELU_K * (1.0 + 3.0 * 0.044715 * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

static double fd_gelu(double x) {
  double h = 1e-5 * fmax(1.0, fabs(x));
  return (ref_gelu(x + h) - ref_gelu(x - h)) / (2.0 * h);
}

/* Mostly N(0, 2^2), one in four uniform in [-12, 12]: the saturated tails too. */
static l2l_tensor *gelu_input(l2l_tensor *t) {
  float *d = check_data(t);
  for (int64_t i = 0; i < numel(t); i++)
    d[i] = (float)(check_rand_int(0, 3) ? 2.0 * check_rand_normal() : check_rand_uniform(-12, 12));
  return t;
}

TEST(op_gelu_forward) {
  static const int64_t shapes[][4] = {{1}, {3, 7}, {13, 97}, {257, 131}, {2, 1, 3, 1}};
  static const int nds[] = {1, 2, 2, 2, 4};
  for (int s = 0; s < 5; s++) {
    l2l_tensor *x = gelu_input(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]));
    l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    int64_t n = numel(x);
    double *want = doubles(n);
    for (int64_t i = 0; i < n; i++) want[i] = ref_gelu(check_data(x)[i]);
    check_poison(y);
    CHECK_OK(l2l_gelu_forward(y, x));
    /* A few f32 ops and an exp/tanh per element. Floor 1e-6: deep in the negative tail the
       result is below 1e-6 and only its absolute size matters. */
    CHECK_CLOSE("gelu_forward", check_data(y), want, n, 1e-6, TOL_ELEMENTWISE);
    CHECK_OK(l2l_gelu_forward(x, x)); /* y may be x */
    CHECK_CLOSE("gelu_forward in place", check_data(x), want, n, 1e-6, TOL_ELEMENTWISE);
    free(want);
    FREE(x, y);
  }
}

TEST(op_gelu_backward) {
  /* The analytic derivative of the reference against its own finite difference first. */
  double worst_fd = 0.0;
  for (int i = 0; i < 2000; i++) {
    double x = check_rand_uniform(-12, 12);
    double e = fabs(ref_gelu_grad(x) - fd_gelu(x)) / (1.0 + fabs(ref_gelu_grad(x)));
    worst_fd = e > worst_fd ? e : worst_fd;
  }
  CHECK(worst_fd < 1e-7, "reference GELU derivative disagrees with finite differences: %.3g",
        worst_fd);

  static const int64_t shapes[][4] = {{1}, {3, 7}, {13, 97}, {257, 131}, {1, 3, 1, 5}};
  static const int nds[] = {1, 2, 2, 2, 4};
  for (int s = 0; s < 5; s++) {
    l2l_tensor *x = gelu_input(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]));
    /* dy = +-[0.5, 2]: bounded, so the absolute error bound below holds. */
    l2l_tensor *dy = fill_uniform(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 0.5, 2);
    l2l_tensor *dx = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    int64_t n = numel(x);
    for (int64_t i = 0; i < n; i++) check_data(dy)[i] *= check_rand_int(0, 1) ? 1.0f : -1.0f;
    double *want = doubles(n), *want_fd = doubles(n);
    for (int64_t i = 0; i < n; i++) {
      double xv = check_data(x)[i], g = check_data(dy)[i];
      want[i] = g * ref_gelu_grad(xv);
      want_fd[i] = g * fd_gelu(xv);
    }
    check_poison(dx);
    CHECK_OK(l2l_gelu_backward(dx, dy, x));
    /* The derivative crosses zero near x = -0.75 as a difference of O(1) terms, so its f32
       error there is absolute, about an ulp of 1 times |dy| <= 2 (~2.5e-7): floor 5e-2
       keeps that within TOL_ELEMENTWISE while every other element is held to 1e-5
       relative. */
    CHECK_CLOSE("gelu_backward", check_data(dx), want, n, 5e-2, TOL_ELEMENTWISE);
    CHECK_CLOSE("gelu_backward vs finite differences", check_data(dx), want_fd, n, 5e-2,
                TOL_ELEMENTWISE);
    free(want);
    free(want_fd);
    FREE(x, dy, dx);
  }
}

TEST(op_gelu_errors) {
  l2l_tensor *x = RANDN(1.0, 3, 7), *y = RANDN(1.0, 3, 7), *dy = RANDN(1.0, 3, 7);
  l2l_tensor *yt = F32(7, 3), *xi = I32(3, 7), *dev = DEV_F32(3, 7), *v0 = NULL, *v1 = NULL;
  CHECK_OK(l2l_tensor_view_rows(&v0, x, 0, 2));
  CHECK_OK(l2l_tensor_view_rows(&v1, x, 1, 2));
  float *y0 = snapshot(y), *x0 = snapshot(x);
  CHECK_FAILS(l2l_gelu_forward(NULL, x), L2L_ERR_INVALID, "y is NULL");
  CHECK_FAILS(l2l_gelu_forward(y, NULL), L2L_ERR_INVALID, "x is NULL");
  CHECK_FAILS(l2l_gelu_forward(y, xi), L2L_ERR_INVALID, "x is i32");
  CHECK_FAILS(l2l_gelu_forward(yt, x), L2L_ERR_INVALID, "y has shape (7,3)");
  CHECK_FAILS(l2l_gelu_forward(y, dev), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_gelu_forward(v1, v0), L2L_ERR_INVALID, "y overlaps x");
  CHECK_FAILS(l2l_gelu_backward(NULL, dy, x), L2L_ERR_INVALID, "dx is NULL");
  CHECK_FAILS(l2l_gelu_backward(y, NULL, x), L2L_ERR_INVALID, "dy is NULL");
  CHECK_FAILS(l2l_gelu_backward(y, dy, NULL), L2L_ERR_INVALID, "x is NULL");
  CHECK_FAILS(l2l_gelu_backward(y, dy, xi), L2L_ERR_INVALID, "x is i32");
  CHECK_FAILS(l2l_gelu_backward(yt, dy, x), L2L_ERR_INVALID, "dx has shape (7,3)");
  CHECK_FAILS(l2l_gelu_backward(y, yt, x), L2L_ERR_INVALID, "dy has shape (7,3)");
  CHECK_FAILS(l2l_gelu_backward(y, dy, dev), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK(same_bytes(y, y0) && same_bytes(x, x0), "a refused GELU call changed a tensor");
  free(y0);
  free(x0);
  FREE(x, y, dy, yt, xi, dev, v0, v1);
}

/* ================================================================ LayerNorm */

/* One row in double: mean, biased variance, y = (x - mean) rstd w + b. */
static void ref_layernorm_row(double *y, double *mean_out, double *rstd_out, const double *x,
                              const double *w, const double *b, double eps, int64_t cols) {
  double mean = 0.0, var = 0.0;
  for (int64_t j = 0; j < cols; j++) mean += x[j];
  mean /= (double)cols;
  for (int64_t j = 0; j < cols; j++) var += (x[j] - mean) * (x[j] - mean);
  var /= (double)cols;
  double rstd = 1.0 / sqrt(var + eps);
  for (int64_t j = 0; j < cols; j++) y[j] = (x[j] - mean) * rstd * w[j] + b[j];
  if (mean_out) *mean_out = mean;
  if (rstd_out) *rstd_out = rstd;
}

/* Rows with their own mean and spread, so the mean matters. */
static l2l_tensor *layernorm_input(l2l_tensor *x, int64_t cols) {
  float *d = check_data(x);
  for (int64_t r = 0; r < numel(x) / cols; r++) {
    double shift = 3.0 * check_rand_normal(), spread = check_rand_uniform(0.1, 4.0);
    for (int64_t j = 0; j < cols; j++) d[r * cols + j] = (float)(shift + spread * check_rand_normal());
  }
  return x;
}

TEST(op_layernorm_forward) {
  static const int64_t shapes[][4] = {{1, 1}, {5, 1}, {3, 7}, {2, 3, 13}, {31, 257}, {5, 1031}, {97}};
  static const int nds[] = {2, 2, 2, 3, 2, 2, 1};
  for (int s = 0; s < 7; s++) {
    int64_t cols = shapes[s][nds[s] - 1];
    l2l_tensor *x = layernorm_input(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), cols);
    int64_t n = numel(x), rows = n / cols;
    l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    l2l_tensor *w = RANDN(1.0, cols), *b = RANDN(1.0, cols), *mean = F32(rows), *rstd = F32(rows);
    float eps = s % 2 ? 1e-5f : 0.05f; /* a large eps shows whether it is inside the sqrt */
    double *xd = to_doubles(check_data(x), n), *wd = to_doubles(check_data(w), cols);
    double *bd = to_doubles(check_data(b), cols);
    double *want = doubles(n), *want_mean = doubles(rows), *want_rstd = doubles(rows);
    for (int64_t r = 0; r < rows; r++)
      ref_layernorm_row(want + r * cols, want_mean + r, want_rstd + r, xd + r * cols, wd, bd, eps,
                        cols);
    check_poison(y);
    check_poison(mean);
    check_poison(rstd);
    char what[160];
    snprintf(what, sizeof what, "layernorm_forward rows=%lld cols=%lld eps=%g", (long long)rows,
             (long long)cols, eps);
    CHECK_OK(l2l_layernorm_forward(y, mean, rstd, x, w, b, eps));
    /* Row sums of up to 1031 f32 terms feed every output: a long reduction. y is O(1)
       (unit weight and bias) and is compared with floor 1; mean with the floor of the
       row's spread (~1); rstd is positive and never near 0. */
    CHECK_CLOSE(what, check_data(y), want, n, 1.0, TOL_REDUCTION);
    CHECK_CLOSE("layernorm mean", check_data(mean), want_mean, rows, 1.0, TOL_REDUCTION);
    CHECK_CLOSE("layernorm rstd", check_data(rstd), want_rstd, rows, 0.0, TOL_REDUCTION);
    /* Without mean and rstd: the same y. */
    check_poison(y);
    CHECK_OK(l2l_layernorm_forward(y, NULL, NULL, x, w, b, eps));
    CHECK_CLOSE("layernorm_forward without mean/rstd", check_data(y), want, n, 1.0, TOL_REDUCTION);
    check_poison(y);
    check_poison(rstd);
    CHECK_OK(l2l_layernorm_forward(y, NULL, rstd, x, w, b, eps));
    CHECK_CLOSE("layernorm_forward rstd only", check_data(rstd), want_rstd, rows, 0.0,
                TOL_REDUCTION);
    free(xd);
    free(wd);
    free(bd);
    free(want);
    free(want_mean);
    free(want_rstd);
    FREE(x, y, w, b, mean, rstd);
  }
}

/* The backward from the Jacobian of one row, with xh = (x - mean) rstd:
   dy_i/dx_j = w_i rstd (delta_ij - 1/C - xh_i xh_j / C), so dx_j = sum_i dy_i dy_i/dx_j;
   dw_j += dy_j xh_j; db_j += dy_j. Written as the O(C^2) double sum on purpose. */
static void ref_layernorm_backward(double *dx, double *dw, double *db, const float *dy,
                                   const float *x, const float *w, const float *mean,
                                   const float *rstd, int64_t rows, int64_t cols) {
  double *xh = doubles(cols);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols, *dyr = dy + r * cols;
    for (int64_t j = 0; j < cols; j++) xh[j] = ((double)xr[j] - mean[r]) * rstd[r];
    for (int64_t j = 0; j < cols; j++) {
      double acc = 0.0;
      for (int64_t i = 0; i < cols; i++) {
        double jac = (i == j ? 1.0 : 0.0) - 1.0 / (double)cols - xh[i] * xh[j] / (double)cols;
        acc += (double)dyr[i] * w[i] * rstd[r] * jac;
      }
      dx[r * cols + j] = acc;
      dw[j] += (double)dyr[j] * xh[j];
      db[j] += dyr[j];
    }
  }
  free(xh);
}

/* dx against the reference row by row, each divided by its row's rstd: dx's terms are
   dy w rstd, and rstd is up to 10 for a row of spread 0.1 and 1/sqrt(eps) = 316 for a row
   of one element (variance 0), so divided by it they are O(1) terms and the floor is 1
   (seed 3245: a row of one element, whose dx is exactly 0, came out -1.2e-4: 4e-7 of its
   rstd). */
static void check_dx_by_rstd(const char *what, const l2l_tensor *dx, const double *want_dx,
                             const l2l_tensor *rstd, int64_t rows, int64_t cols) {
  int64_t n = rows * cols;
  float *got = xmalloc((size_t)n * sizeof *got);
  double *want = doubles(n);
  for (int64_t i = 0; i < n; i++) {
    double rs = check_data(rstd)[i / cols];
    got[i] = (float)(check_data(dx)[i] / rs);
    want[i] = want_dx[i] / rs;
  }
  CHECK_CLOSE(what, got, want, n, 1.0, TOL_REDUCTION);
  free(got);
  free(want);
}

TEST(op_layernorm_backward) {
  static const int64_t shapes[][4] = {{1, 1}, {3, 7}, {2, 3, 13}, {31, 257}, {5, 1031}, {4099, 3}};
  static const int nds[] = {2, 2, 3, 2, 2, 2};
  for (int s = 0; s < 6; s++) {
    int64_t cols = shapes[s][nds[s] - 1];
    l2l_tensor *x = layernorm_input(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), cols);
    int64_t n = numel(x), rows = n / cols;
    l2l_tensor *dy = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    l2l_tensor *dx = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    l2l_tensor *w = RANDN(1.0, cols), *mean = F32(rows), *rstd = F32(rows);
    l2l_tensor *dw = RANDN(1.0, cols), *db = RANDN(1.0, cols); /* accumulated onto */
    /* mean and rstd as forward saves them: the double statistics rounded to f32. */
    double *xd = to_doubles(check_data(x), n), *ones = doubles(cols), *zeros = doubles(cols);
    double *scratch = doubles(cols);
    for (int64_t j = 0; j < cols; j++) ones[j] = 1.0, zeros[j] = 0.0;
    float eps = 1e-5f;
    for (int64_t r = 0; r < rows; r++) {
      double mu, rs;
      ref_layernorm_row(scratch, &mu, &rs, xd + r * cols, ones, zeros, eps, cols);
      check_data(mean)[r] = (float)mu;
      check_data(rstd)[r] = (float)rs;
    }
    double *want_dx = doubles(n), *want_dw = to_doubles(check_data(dw), cols);
    double *want_db = to_doubles(check_data(db), cols);
    ref_layernorm_backward(want_dx, want_dw, want_db, check_data(dy), check_data(x),
                           check_data(w), check_data(mean), check_data(rstd), rows, cols);
    check_poison(dx);
    char what[160];
    snprintf(what, sizeof what, "layernorm_backward dx rows=%lld cols=%lld", (long long)rows,
             (long long)cols);
    CHECK_OK(l2l_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd));
    /* dx subtracts row means of dy w and dy w xh (rows up to 1031 long) from O(1) terms
       times rstd: an absolute error of a few ulp of rstd per element, hence
       check_dx_by_rstd and TOL_REDUCTION. dweight and dbias sum up to 4099 rows: size
       sqrt(rows). */
    check_dx_by_rstd(what, dx, want_dx, rstd, rows, cols);
    CHECK_CLOSE("layernorm_backward dweight", check_data(dw), want_dw, cols,
                sqrt((double)rows) + 1.0, TOL_REDUCTION);
    CHECK_CLOSE("layernorm_backward dbias", check_data(db), want_db, cols,
                sqrt((double)rows) + 1.0, TOL_REDUCTION);
    /* Without the parameter gradients: the same dx, and they stay untouched. */
    float *dw1 = snapshot(dw);
    check_poison(dx);
    CHECK_OK(l2l_layernorm_backward(dx, NULL, NULL, dy, x, w, mean, rstd));
    check_dx_by_rstd("layernorm_backward dx alone", dx, want_dx, rstd, rows, cols);
    /* Only dbias: it accumulates once more, dweight is not passed. */
    for (int64_t j = 0; j < cols; j++) {
      double col = 0.0;
      for (int64_t r = 0; r < rows; r++) col += check_data(dy)[r * cols + j];
      want_db[j] = (double)check_data(db)[j] + col;
    }
    check_poison(dx);
    CHECK_OK(l2l_layernorm_backward(dx, NULL, db, dy, x, w, mean, rstd));
    CHECK_CLOSE("layernorm_backward dbias only", check_data(db), want_db, cols,
                sqrt((double)rows) + 1.0, TOL_REDUCTION);
    CHECK(same_bytes(dw, dw1), "dweight changed without being passed");
    free(dw1);
    free(xd);
    free(ones);
    free(zeros);
    free(scratch);
    free(want_dx);
    free(want_dw);
    free(want_db);
    FREE(x, dy, dx, w, mean, rstd, dw, db);
  }
}

/* L = sum dy * LayerNorm(x; w, b) in double, for finite differences. */
static double layernorm_loss(const double *x, const double *w, const double *b, const float *dy,
                             double eps, int64_t rows, int64_t cols, double *scratch) {
  double loss = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    ref_layernorm_row(scratch, NULL, NULL, x + r * cols, w, b, eps, cols);
    for (int64_t j = 0; j < cols; j++) loss += dy[r * cols + j] * scratch[j];
  }
  return loss;
}

/* Central difference of layernorm_loss in v[i] (v is x, w or b). */
static double layernorm_fd(double *v, int64_t i, const double *x, const double *w,
                           const double *b, const float *dy, double eps, int64_t rows,
                           int64_t cols, double *scratch) {
  double saved = v[i], h = 1e-6 * fmax(1.0, fabs(saved));
  v[i] = saved + h;
  double up = layernorm_loss(x, w, b, dy, eps, rows, cols, scratch);
  v[i] = saved - h;
  double down = layernorm_loss(x, w, b, dy, eps, rows, cols, scratch);
  v[i] = saved;
  return (up - down) / (2.0 * h);
}

TEST(op_layernorm_backward_fd) {
  int64_t rows = 3, cols = 7, n = rows * cols;
  float eps = 1e-3f;
  /* |mean| small against the spread: the f32 mean that forward saves then costs no more
     than an ulp of x - mean (with |mean| >> spread, x - mean would lose |mean|/spread ulp
     in any f32 implementation, and the exact derivative would not be a fair target). */
  l2l_tensor *x = F32(rows, cols), *dy = RANDN(1.0, rows, cols);
  for (int64_t r = 0; r < rows; r++) {
    double shift = 0.3 * check_rand_normal(), spread = check_rand_uniform(0.5, 2.0);
    for (int64_t j = 0; j < cols; j++)
      check_data(x)[r * cols + j] = (float)(shift + spread * check_rand_normal());
  }
  l2l_tensor *w = RANDN(1.0, cols), *b = RANDN(1.0, cols), *y = F32(rows, cols);
  l2l_tensor *mean = F32(rows), *rstd = F32(rows), *dx = F32(rows, cols);
  l2l_tensor *dw = RANDN(1.0, cols), *db = RANDN(1.0, cols);
  float *dw0 = snapshot(dw), *db0 = snapshot(db);
  check_poison(y);
  check_poison(mean);
  check_poison(rstd);
  CHECK_OK(l2l_layernorm_forward(y, mean, rstd, x, w, b, eps));
  check_poison(dx);
  CHECK_OK(l2l_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd));
  double *xd = to_doubles(check_data(x), n), *wd = to_doubles(check_data(w), cols);
  double *bd = to_doubles(check_data(b), cols), *scratch = doubles(cols);
  double *fd_x = doubles(n), *fd_w = doubles(cols), *fd_b = doubles(cols);
  const float *dyd = check_data(dy);
  for (int64_t i = 0; i < n; i++)
    fd_x[i] = layernorm_fd(xd, i, xd, wd, bd, dyd, eps, rows, cols, scratch);
  for (int64_t j = 0; j < cols; j++) {
    fd_w[j] = dw0[j] + layernorm_fd(wd, j, xd, wd, bd, dyd, eps, rows, cols, scratch);
    fd_b[j] = db0[j] + layernorm_fd(bd, j, xd, wd, bd, dyd, eps, rows, cols, scratch);
  }
  /* The whole f32 forward/backward chain against exact double derivatives (finite
     differences with h = 1e-6 are good to ~1e-9): a few ulp of O(1) terms per element. */
  CHECK_CLOSE("layernorm dx vs finite differences", check_data(dx), fd_x, n, 1.0, TOL_ELEMENTWISE);
  CHECK_CLOSE("layernorm dweight vs finite differences", check_data(dw), fd_w, cols, 1.0,
              TOL_ELEMENTWISE);
  CHECK_CLOSE("layernorm dbias vs finite differences", check_data(db), fd_b, cols, 1.0,
              TOL_ELEMENTWISE);
  free(dw0);
  free(db0);
  free(xd);
  free(wd);
  free(bd);
  free(scratch);
  free(fd_x);
  free(fd_w);
  free(fd_b);
  FREE(x, dy, w, b, y, mean, rstd, dx, dw, db);
}

TEST(op_layernorm_errors) {
  l2l_tensor *x = RANDN(1.0, 3, 7), *y = RANDN(1.0, 3, 7), *w = RANDN(1.0, 7), *b = RANDN(1.0, 7);
  l2l_tensor *mean = RANDN(1.0, 3), *rstd = RANDN(1.0, 3), *w8 = RANDN(1.0, 8), *m4 = F32(4);
  l2l_tensor *xi = I32(3, 7), *dev = DEV_F32(7), *yt = F32(7, 3);
  l2l_tensor *dx = RANDN(1.0, 3, 7), *dy = RANDN(1.0, 3, 7), *dw = RANDN(1.0, 7);
  l2l_tensor *db = RANDN(1.0, 7);
  float *y0 = snapshot(y), *mean0 = snapshot(mean), *rstd0 = snapshot(rstd);
  float *dx0 = snapshot(dx), *dw0 = snapshot(dw), *db0 = snapshot(db);
  CHECK_FAILS(l2l_layernorm_forward(NULL, mean, rstd, x, w, b, 1e-5f), L2L_ERR_INVALID, "y is NULL");
  CHECK_FAILS(l2l_layernorm_forward(y, mean, rstd, NULL, w, b, 1e-5f), L2L_ERR_INVALID, "x is NULL");
  CHECK_FAILS(l2l_layernorm_forward(y, mean, rstd, x, NULL, b, 1e-5f), L2L_ERR_INVALID,
              "weight is NULL");
  CHECK_FAILS(l2l_layernorm_forward(y, mean, rstd, x, w, NULL, 1e-5f), L2L_ERR_INVALID,
              "bias is NULL");
  CHECK_FAILS(l2l_layernorm_forward(y, mean, rstd, xi, w, b, 1e-5f), L2L_ERR_INVALID, "x is i32");
  CHECK_FAILS(l2l_layernorm_forward(yt, mean, rstd, x, w, b, 1e-5f), L2L_ERR_INVALID,
              "y has shape (7,3)");
  CHECK_FAILS(l2l_layernorm_forward(y, mean, rstd, x, w8, b, 1e-5f), L2L_ERR_INVALID,
              "weight has 8 elements");
  CHECK_FAILS(l2l_layernorm_forward(y, mean, rstd, x, w, w8, 1e-5f), L2L_ERR_INVALID,
              "bias has 8 elements");
  CHECK_FAILS(l2l_layernorm_forward(y, m4, rstd, x, w, b, 1e-5f), L2L_ERR_INVALID,
              "mean has 4 elements");
  CHECK_FAILS(l2l_layernorm_forward(y, mean, m4, x, w, b, 1e-5f), L2L_ERR_INVALID,
              "rstd has 4 elements");
  /* eps <= 0: 1/sqrt(var + eps) is undefined for a constant row. */
  CHECK_FAILS(l2l_layernorm_forward(y, mean, rstd, x, w, b, 0.0f), L2L_ERR_INVALID, "eps");
  CHECK_FAILS(l2l_layernorm_forward(y, mean, rstd, x, w, b, -1.0f), L2L_ERR_INVALID, "eps");
  CHECK_FAILS(l2l_layernorm_forward(y, mean, rstd, x, dev, b, 1e-5f), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_layernorm_forward(y, mean, mean, x, w, b, 1e-5f), L2L_ERR_INVALID,
              "mean overlaps rstd");
  CHECK(same_bytes(y, y0) && same_bytes(mean, mean0) && same_bytes(rstd, rstd0),
        "a refused layernorm_forward changed an output");

  CHECK_FAILS(l2l_layernorm_backward(NULL, dw, db, dy, x, w, mean, rstd), L2L_ERR_INVALID,
              "dx is NULL");
  CHECK_FAILS(l2l_layernorm_backward(dx, dw, db, NULL, x, w, mean, rstd), L2L_ERR_INVALID,
              "dy is NULL");
  CHECK_FAILS(l2l_layernorm_backward(dx, dw, db, dy, x, w, NULL, rstd), L2L_ERR_INVALID,
              "mean is NULL");
  CHECK_FAILS(l2l_layernorm_backward(dx, dw, db, dy, x, w, mean, NULL), L2L_ERR_INVALID,
              "rstd is NULL");
  CHECK_FAILS(l2l_layernorm_backward(dx, dw, db, dy, xi, w, mean, rstd), L2L_ERR_INVALID,
              "x is i32");
  CHECK_FAILS(l2l_layernorm_backward(dx, dw, db, yt, x, w, mean, rstd), L2L_ERR_INVALID,
              "dy has shape (7,3)");
  CHECK_FAILS(l2l_layernorm_backward(dx, w8, db, dy, x, w, mean, rstd), L2L_ERR_INVALID,
              "dweight has 8 elements");
  CHECK_FAILS(l2l_layernorm_backward(dx, dw, db, dy, x, w, m4, rstd), L2L_ERR_INVALID,
              "mean has 4 elements");
  CHECK_FAILS(l2l_layernorm_backward(dx, dw, dev, dy, x, w, mean, rstd), L2L_ERR_INVALID,
              "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_layernorm_backward(dx, dw, dw, dy, x, w, mean, rstd), L2L_ERR_INVALID,
              "dweight overlaps dbias");
  CHECK_FAILS(l2l_layernorm_backward(dx, dw, db, dy, dx, w, mean, rstd), L2L_ERR_INVALID,
              "dx overlaps x");
  CHECK(same_bytes(dx, dx0) && same_bytes(dw, dw0) && same_bytes(db, db0),
        "a refused layernorm_backward changed an output");
  free(y0);
  free(mean0);
  free(rstd0);
  free(dx0);
  free(dw0);
  free(db0);
  FREE(x, y, w, b, mean, rstd, w8, m4, xi, dev, yt, dx, dy, dw, db);
}

/* ================================================================ softmax */

/* Softmax of scale * x over the last dim of x (dims[0..nd)). Key j is hidden from query i
   (i = the row's index along dim nd-2) when causal and j > i + (Tk - Tq), or when
   key_mask[b][j] == 0 with b the row's index along dim 0. All hidden: zeros. Returns the
   number of rows with every key hidden. */
static int64_t ref_softmax(double *y, const float *x, const int64_t *dims, int nd,
                           const uint8_t *key_mask, int causal, double scale) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= dims[d];
  int64_t tk = dims[nd - 1], tq = nd >= 2 ? dims[nd - 2] : 1, rows = n / tk;
  int64_t rows_per_sample = key_mask ? rows / dims[0] : rows, empty = 0;
  for (int64_t r = 0; r < rows; r++) {
    int64_t query = r % tq, sample = r / rows_per_sample;
    const float *xr = x + r * tk;
    double *yr = y + r * tk, mx = -INFINITY;
    bool any = false;
    for (int64_t j = 0; j < tk; j++) {
      bool hidden = (causal && j > query + (tk - tq)) ||
                    (key_mask != NULL && key_mask[sample * tk + j] == 0);
      yr[j] = hidden ? NAN : scale * (double)xr[j]; /* NaN marks hidden, for now */
      if (!hidden) any = true, mx = fmax(mx, yr[j]);
    }
    if (!any) {
      for (int64_t j = 0; j < tk; j++) yr[j] = 0.0;
      empty++;
      continue;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < tk; j++) {
      yr[j] = isnan(yr[j]) ? 0.0 : exp(yr[j] - mx);
      sum += yr[j];
    }
    for (int64_t j = 0; j < tk; j++) yr[j] /= sum;
  }
  return empty;
}

/* (B, Tk) padding mask: one random sample entirely padding, the others real up to a random
   length with a few holes, key 0 always real (so causal query 0 sees something). */
static l2l_tensor *random_key_mask(int64_t samples, int64_t tk) {
  l2l_tensor *mk = U8(samples, tk);
  uint8_t *d = l2l_tensor_data(mk);
  int64_t all_padding = check_rand_int(0, samples - 1);
  for (int64_t b = 0; b < samples; b++) {
    int64_t len = check_rand_int(1, tk);
    for (int64_t j = 0; j < tk; j++)
      d[b * tk + j] = b != all_padding && j < len && (j == 0 || check_rand_uniform(0, 1) < 0.85);
  }
  return mk;
}

struct softmax_case {
  int nd;
  int64_t dims[4];
  int causal, masked;
  float scale;
};

TEST(op_softmax_forward) {
  static const struct softmax_case cases[] = {
      {4, {2, 3, 7, 13}, 0, 0, 1.0f},     /* plain */
      {4, {3, 2, 13, 13}, 1, 0, 0.37f},   /* causal, Tq == Tk */
      {4, {2, 3, 7, 13}, 1, 0, -0.5f},    /* causal, Tq < Tk, negative scale */
      {4, {2, 3, 7, 13}, 0, 1, 2.5f},     /* padding mask */
      {4, {3, 2, 13, 13}, 1, 1, 1.0f},    /* both */
      {3, {5, 1, 97}, 1, 1, -1.75f},      /* one query: it sees every key causally */
      {4, {1, 1, 13, 7}, 1, 0, 1.0f},     /* Tq > Tk: early queries see nothing */
      {2, {31, 31}, 1, 0, 0.125f},        /* 2-D x: Tq = rows */
      {1, {257}, 0, 0, 3.0f},             /* 1-D x */
      {2, {1, 1}, 0, 0, 1.0f},            /* a single element */
      {4, {2, 4, 97, 257}, 1, 1, 0.125f}, /* large: split across threads */
  };
  int ncases = (int)(sizeof cases / sizeof cases[0]);
  for (int s = 0; s < ncases; s++) {
    const struct softmax_case *c = &cases[s];
    l2l_tensor *x = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, c->nd, c->dims), 2.0);
    l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, c->nd, c->dims);
    int64_t n = numel(x), tk = c->dims[c->nd - 1];
    l2l_tensor *mk = c->masked ? random_key_mask(c->dims[0], tk) : NULL;
    double *want = doubles(n);
    int64_t empty = ref_softmax(want, check_data(x), c->dims, c->nd,
                                mk ? l2l_tensor_data(mk) : NULL, c->causal, c->scale);
    if (c->masked) CHECK(empty > 0, "case %d: no row has every key hidden", s);
    if (c->causal && c->dims[c->nd - 2] > tk) CHECK(empty > 0, "case %d: no empty row", s);
    CHECK(empty < n / tk, "case %d: every row is empty", s);
    char what[160];
    snprintf(what, sizeof what, "softmax_forward case %d (causal %d, mask %d, scale %g)", s,
             c->causal, c->masked, c->scale);
    check_poison(y);
    CHECK_OK(l2l_softmax_forward(y, x, mk, c->causal, c->scale));
    /* Each probability is an exp good to a few ulp over a row sum of at most 257 terms:
       relative 1e-6 for the large ones; floor 1e-6 for the tiny ones, whose exp argument
       has an f32 absolute error of ~1e-6. Hidden entries and empty rows must be exactly 0
       (want 0, so any nonzero fails). */
    CHECK_CLOSE(what, check_data(y), want, n, 1e-6, TOL_ELEMENTWISE);
    int64_t nonzero_hidden = 0;
    for (int64_t i = 0; i < n; i++) nonzero_hidden += want[i] == 0.0 && check_data(y)[i] != 0.0f;
    CHECK(nonzero_hidden == 0, "%s: %lld hidden entries are not 0", what, (long long)nonzero_hidden);
    /* y may be x. */
    CHECK_OK(l2l_softmax_forward(x, x, mk, c->causal, c->scale));
    CHECK_CLOSE("softmax_forward in place", check_data(x), want, n, 1e-6, TOL_ELEMENTWISE);
    free(want);
    FREE(x, y, mk);
  }
}

TEST(op_softmax_backward) {
  static const struct softmax_case cases[] = {
      {4, {2, 3, 7, 13}, 1, 1, -0.7f}, {2, {1, 1}, 0, 0, 1.0f},     {1, {97}, 0, 0, 2.0f},
      {3, {3, 13, 13}, 1, 0, 0.25f},   {4, {2, 2, 31, 257}, 0, 1, 1.0f},
  };
  for (int s = 0; s < 5; s++) {
    const struct softmax_case *c = &cases[s];
    l2l_tensor *x = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, c->nd, c->dims), 2.0);
    l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, c->nd, c->dims);
    l2l_tensor *dy = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, c->nd, c->dims), 1.0);
    l2l_tensor *dx = check_tensor(L2L_POOL_HOST, L2L_F32, c->nd, c->dims);
    int64_t n = numel(x), tk = c->dims[c->nd - 1], rows = n / tk;
    l2l_tensor *mk = c->masked ? random_key_mask(c->dims[0], tk) : NULL;
    double *p = doubles(n), *want = doubles(n);
    ref_softmax(p, check_data(x), c->dims, c->nd, mk ? l2l_tensor_data(mk) : NULL, c->causal,
                c->scale);
    float *yd = check_data(y), *dyd = check_data(dy);
    for (int64_t i = 0; i < n; i++) yd[i] = (float)p[i];
    /* dx = scale y (dy - sum(dy y)) per row, from the y given. */
    for (int64_t r = 0; r < rows; r++) {
      double dot = 0.0;
      for (int64_t j = 0; j < tk; j++) dot += (double)dyd[r * tk + j] * yd[r * tk + j];
      for (int64_t j = 0; j < tk; j++)
        want[r * tk + j] = c->scale * (double)yd[r * tk + j] * ((double)dyd[r * tk + j] - dot);
    }
    check_poison(dx);
    CHECK_OK(l2l_softmax_backward(dx, dy, y, c->scale));
    /* dy - sum(dy y) cancels: its f32 error is a few ulp of |dy| (up to ~4) in absolute
       terms, scaled by |scale| y <= |scale|, so up to ~1e-6 |scale|; floor |scale| 0.1
       keeps that within TOL_ELEMENTWISE, every larger element is held to 1e-5 relative. */
    CHECK_CLOSE("softmax_backward", check_data(dx), want, n, fabs(c->scale) * 0.1,
                TOL_ELEMENTWISE);
    int64_t nonzero_hidden = 0;
    for (int64_t i = 0; i < n; i++) nonzero_hidden += yd[i] == 0.0f && check_data(dx)[i] != 0.0f;
    CHECK(nonzero_hidden == 0, "softmax_backward: %lld masked entries are not 0",
          (long long)nonzero_hidden);
    free(p);
    free(want);
    FREE(x, y, dy, dx, mk);
  }
}

TEST(op_softmax_backward_fd) {
  /* The gradient of L(x) = sum dy * softmax(scale x) by central differences, against the
     op fed with y = softmax(scale x); causal and masked, so hidden keys get 0. */
  const int64_t dims[3] = {2, 5, 7};
  int64_t n = 70;
  float scale = (float)check_rand_uniform(-2, 2);
  l2l_tensor *x = fill_normal(F32(2, 5, 7), 1.5), *y = F32(2, 5, 7), *dx = F32(2, 5, 7);
  l2l_tensor *dy = RANDN(1.0, 2, 5, 7), *mk = U8(2, 7);
  uint8_t *md = l2l_tensor_data(mk);
  for (int64_t i = 0; i < 14; i++) md[i] = check_rand_uniform(0, 1) < 0.7;
  md[0] = 1; /* somebody visible to the first query */
  double *p = doubles(n), *fd = doubles(n), *pp = doubles(n);
  ref_softmax(p, check_data(x), dims, 3, md, 1, scale);
  for (int64_t i = 0; i < n; i++) check_data(y)[i] = (float)p[i];
  float *xd = check_data(x);
  const float *dyd = check_data(dy);
  for (int64_t i = 0; i < n; i++) {
    /* ref_softmax reads f32 x, so x is perturbed in f32: x +- 2^-14 rounds to the f32
       grid (by up to an ulp of x), and the difference divides by the step actually taken. */
    float saved = xd[i], moved[2];
    double loss[2];
    for (int side = 0; side < 2; side++) {
      xd[i] = moved[side] = saved + (side ? -0x1p-14f : 0x1p-14f);
      ref_softmax(pp, xd, dims, 3, md, 1, scale);
      double acc = 0.0;
      for (int64_t k = 0; k < n; k++) acc += dyd[k] * pp[k];
      loss[side] = acc;
    }
    xd[i] = saved;
    fd[i] = (loss[0] - loss[1]) / ((double)moved[0] - (double)moved[1]);
  }
  check_poison(dx);
  CHECK_OK(l2l_softmax_backward(dx, dy, y, scale));
  /* Central differences with h = 2^-14 have an O(h^2 |scale|^3) ~ 1e-8 truncation error;
     the op's own f32 error is as in op_softmax_backward, plus y rounded to f32 before the
     op sees it: TOL_ELEMENTWISE with the same floor. */
  CHECK_CLOSE("softmax_backward vs finite differences", check_data(dx), fd, n,
              fabs(scale) * 0.1 + 1e-6, TOL_ELEMENTWISE);
  free(p);
  free(fd);
  free(pp);
  FREE(x, y, dx, dy, mk);
}

TEST(op_softmax_errors) {
  l2l_tensor *x = RANDN(1.0, 2, 3, 5), *y = RANDN(1.0, 2, 3, 5), *mk = U8(2, 5);
  l2l_tensor *x2 = RANDN(1.0, 3, 5), *y2 = F32(3, 5), *mk_bad = U8(2, 4), *mk_f = F32(2, 5);
  l2l_tensor *xi = I32(2, 3, 5), *yt = F32(2, 5, 3), *dev = DEV_F32(2, 3, 5);
  l2l_tensor *dx = RANDN(1.0, 2, 3, 5), *dy = RANDN(1.0, 2, 3, 5), *v0 = NULL, *v1 = NULL;
  memset(l2l_tensor_data(mk), 1, 10);
  CHECK_OK(l2l_tensor_view_rows(&v0, x2, 0, 2));
  CHECK_OK(l2l_tensor_view_rows(&v1, x2, 1, 2));
  float *y0 = snapshot(y), *dx0 = snapshot(dx), *x20 = snapshot(x2);
  CHECK_FAILS(l2l_softmax_forward(NULL, x, NULL, 0, 1), L2L_ERR_INVALID, "y is NULL");
  CHECK_FAILS(l2l_softmax_forward(y, NULL, NULL, 0, 1), L2L_ERR_INVALID, "x is NULL");
  CHECK_FAILS(l2l_softmax_forward(y, xi, NULL, 0, 1), L2L_ERR_INVALID, "x is i32");
  CHECK_FAILS(l2l_softmax_forward(y, x, mk_f, 0, 1), L2L_ERR_INVALID, "key_mask is f32");
  CHECK_FAILS(l2l_softmax_forward(yt, x, NULL, 0, 1), L2L_ERR_INVALID, "y has shape (2,5,3)");
  CHECK_FAILS(l2l_softmax_forward(y, x, mk_bad, 0, 1), L2L_ERR_INVALID, "key_mask has shape (2,4)");
  CHECK_FAILS(l2l_softmax_forward(y2, x2, mk, 0, 1), L2L_ERR_INVALID, "key_mask");
  CHECK_FAILS(l2l_softmax_forward(y, x, NULL, 0, NAN), L2L_ERR_INVALID, "scale");
  CHECK_FAILS(l2l_softmax_forward(y, x, NULL, 0, INFINITY), L2L_ERR_INVALID, "scale");
  CHECK_FAILS(l2l_softmax_forward(y, dev, NULL, 0, 1), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_softmax_forward(v1, v0, NULL, 0, 1), L2L_ERR_INVALID, "y overlaps x");
  CHECK(same_bytes(y, y0) && same_bytes(x2, x20), "a refused softmax_forward changed y");
  CHECK_FAILS(l2l_softmax_backward(NULL, dy, y, 1), L2L_ERR_INVALID, "dx is NULL");
  CHECK_FAILS(l2l_softmax_backward(dx, NULL, y, 1), L2L_ERR_INVALID, "dy is NULL");
  CHECK_FAILS(l2l_softmax_backward(dx, dy, NULL, 1), L2L_ERR_INVALID, "y is NULL");
  CHECK_FAILS(l2l_softmax_backward(dx, dy, xi, 1), L2L_ERR_INVALID, "y is i32");
  CHECK_FAILS(l2l_softmax_backward(dx, yt, y, 1), L2L_ERR_INVALID, "dy has shape (2,5,3)");
  CHECK_FAILS(l2l_softmax_backward(yt, dy, y, 1), L2L_ERR_INVALID, "dx has shape (2,5,3)");
  CHECK_FAILS(l2l_softmax_backward(dx, dy, y, NAN), L2L_ERR_INVALID, "scale");
  CHECK_FAILS(l2l_softmax_backward(dx, dev, y, 1), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK(same_bytes(dx, dx0), "a refused softmax_backward changed dx");
  free(y0);
  free(dx0);
  free(x20);
  FREE(x, y, mk, x2, y2, mk_bad, mk_f, xi, yt, dev, dx, dy, v0, v1);
}

/* ================================================================ embedding */

TEST(op_embedding_forward) {
  struct {
    int nd;
    int64_t ids[3];
    int64_t vocab, cols;
  } cases[] = {{1, {1}, 1, 1}, {1, {31}, 97, 13}, {2, {3, 7}, 7, 257}, {3, {2, 3, 5}, 257, 1},
               {2, {13, 131}, 97, 31}};
  for (int s = 0; s < 5; s++) {
    int64_t v = cases[s].vocab, cols = cases[s].cols;
    l2l_tensor *ids = random_ids(check_tensor(L2L_POOL_HOST, L2L_I32, cases[s].nd, cases[s].ids),
                                 0, (int32_t)v - 1);
    int64_t out_shape[4];
    memcpy(out_shape, cases[s].ids, sizeof cases[s].ids);
    out_shape[cases[s].nd] = cols;
    l2l_tensor *table = RANDN(1.0, v, cols);
    l2l_tensor *out = check_tensor(L2L_POOL_HOST, L2L_F32, cases[s].nd + 1, out_shape);
    int64_t n = numel(ids);
    double *want = doubles(n * cols);
    const int32_t *id = l2l_tensor_data(ids);
    /* the f32 table, then 16-bit copies of it (a relay's device copies), widened exactly */
    l2l_dtype dtypes[3] = {L2L_F32, L2L_F16, L2L_BF16};
    for (int t = 0; t < 3; t++) {
      int64_t shape[2] = {v, cols};
      l2l_tensor *tab = check_tensor(L2L_POOL_HOST, dtypes[t], 2, shape);
      CHECK_OK(l2l_tensor_cast(tab, table));
      const uint16_t *bits = l2l_tensor_data(tab);
      for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < cols; j++) {
          int64_t e = id[i] * cols + j;
          want[i * cols + j] = dtypes[t] == L2L_F32   ? check_data(table)[e]
                               : dtypes[t] == L2L_F16 ? l2l_f16_to_f32(bits[e])
                                                      : l2l_bf16_to_f32(bits[e]);
        }
      check_poison(out);
      CHECK_OK(l2l_embedding_forward(out, ids, tab));
      /* A copy: exact. */
      CHECK_CLOSE(l2l_dtype_name(dtypes[t]), check_data(out), want, n * cols, 1e-30, 0.0);
      l2l_tensor_free(tab);
    }
    free(want);
    FREE(ids, table, out);
  }
}

TEST(op_embedding_backward) {
  struct {
    int nd;
    int64_t ids[3];
    int64_t vocab, cols;
    int32_t id_hi; /* ids drawn from [0, id_hi]: a small range forces repeats */
  } cases[] = {{1, {1}, 1, 1, 0},      {1, {31}, 7, 13, 4},      {2, {3, 7}, 97, 257, 96},
               {3, {2, 3, 5}, 3, 1, 2}, {2, {13, 131}, 97, 31, 6}, {1, {257}, 5, 33, 0}};
  for (int s = 0; s < 6; s++) {
    int64_t v = cases[s].vocab, cols = cases[s].cols;
    l2l_tensor *ids = random_ids(check_tensor(L2L_POOL_HOST, L2L_I32, cases[s].nd, cases[s].ids),
                                 0, cases[s].id_hi);
    int64_t n = numel(ids), out_shape[4];
    memcpy(out_shape, cases[s].ids, sizeof cases[s].ids);
    out_shape[cases[s].nd] = cols;
    l2l_tensor *dout = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, cases[s].nd + 1, out_shape), 1.0);
    l2l_tensor *dtable = RANDN(1.0, v, cols); /* accumulated onto */
    double *want = to_doubles(check_data(dtable), v * cols);
    const int32_t *id = l2l_tensor_data(ids);
    int64_t max_repeat = 0;
    for (int64_t i = 0; i < n; i++) {
      for (int64_t j = 0; j < cols; j++) want[id[i] * cols + j] += check_data(dout)[i * cols + j];
      int64_t count = 0;
      for (int64_t k = 0; k < n; k++) count += id[k] == id[i];
      max_repeat = count > max_repeat ? count : max_repeat;
    }
    if (n > v) CHECK(max_repeat > 1, "case %d: no id repeats", s);
    CHECK_OK(l2l_embedding_backward(dtable, dout, ids));
    /* Repeated ids sum up to n rows of unit normals, of size sqrt(repeats). */
    CHECK_CLOSE("embedding_backward", check_data(dtable), want, v * cols,
                sqrt((double)max_repeat) + 1.0, max_repeat > 100 ? TOL_REDUCTION : TOL_ELEMENTWISE);
    free(want);
    FREE(ids, dout, dtable);
  }
}

TEST(op_embedding_errors) {
  int64_t v = 13, cols = 5;
  l2l_tensor *ids = random_ids(I32(3, 7), 0, (int32_t)v - 1), *table = RANDN(1.0, v, cols);
  l2l_tensor *out = F32(3, 7, cols), *dout = RANDN(1.0, 3, 7, cols), *dtable = RANDN(1.0, v, cols);
  l2l_tensor *ids_f = F32(3, 7), *table3 = RANDN(1.0, 1, v, cols), *out_bad = F32(3, 7, cols + 1);
  l2l_tensor *out_cols = F32(3, cols, 7), *dev = DEV_F32(v, cols);
  fill_value(out, 12345.0f); /* a sentinel: a refused call must leave it */
  float *out0 = snapshot(out), *dtable0 = snapshot(dtable);
  CHECK_FAILS(l2l_embedding_forward(NULL, ids, table), L2L_ERR_INVALID, "out is NULL");
  CHECK_FAILS(l2l_embedding_forward(out, NULL, table), L2L_ERR_INVALID, "ids is NULL");
  CHECK_FAILS(l2l_embedding_forward(out, ids, NULL), L2L_ERR_INVALID, "table is NULL");
  CHECK_FAILS(l2l_embedding_forward(out, ids_f, table), L2L_ERR_INVALID, "ids is f32");
  CHECK_FAILS(l2l_embedding_forward(out, ids, ids), L2L_ERR_INVALID, "table is i32");
  CHECK_FAILS(l2l_embedding_forward(out, ids, table3), L2L_ERR_INVALID, "table has shape");
  CHECK_FAILS(l2l_embedding_forward(out_bad, ids, table), L2L_ERR_INVALID, "out has");
  CHECK_FAILS(l2l_embedding_forward(out_cols, ids, table), L2L_ERR_INVALID, "out's last dim");
  CHECK_FAILS(l2l_embedding_forward(out, ids, dev), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_embedding_backward(NULL, dout, ids), L2L_ERR_INVALID, "dtable is NULL");
  CHECK_FAILS(l2l_embedding_backward(dtable, NULL, ids), L2L_ERR_INVALID, "dout is NULL");
  CHECK_FAILS(l2l_embedding_backward(dtable, dout, NULL), L2L_ERR_INVALID, "ids is NULL");
  CHECK_FAILS(l2l_embedding_backward(dtable, dout, ids_f), L2L_ERR_INVALID, "ids is f32");
  CHECK_FAILS(l2l_embedding_backward(dtable, out_bad, ids), L2L_ERR_INVALID, "dout has");
  CHECK_FAILS(l2l_embedding_backward(dev, dout, ids), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();

  /* Ids out of range, anywhere: refused before anything is written, naming the position
     as C indexes the (3,7) ids. */
  int32_t *id = l2l_tensor_data(ids);
  const int32_t bad_values[] = {(int32_t)v, -1, INT32_MIN, INT32_MAX, (int32_t)v + 1000};
  for (int k = 0; k < 5; k++) {
    int64_t pos = check_rand_int(0, 20);
    int32_t saved = id[pos];
    id[pos] = bad_values[k];
    char needle[96];
    snprintf(needle, sizeof needle, "ids[%lld][%lld] = %d", (long long)(pos / 7), (long long)(pos % 7),
             bad_values[k]);
    CHECK_FAILS(l2l_embedding_forward(out, ids, table), L2L_ERR_INVALID, needle);
    CHECK_FAILS(l2l_embedding_backward(dtable, dout, ids), L2L_ERR_INVALID, needle);
    id[pos] = saved;
  }
  CHECK(same_bytes(out, out0), "a refused embedding_forward changed out");
  CHECK(same_bytes(dtable, dtable0), "a refused embedding_backward changed dtable");
  free(out0);
  free(dtable0);
  FREE(ids, table, out, dout, dtable, ids_f, table3, out_bad, out_cols, dev);
}

/* ================================================================ cross-entropy */

static double ref_logsumexp(const float *row, int64_t v) {
  double mx = -INFINITY, sum = 0.0;
  for (int64_t j = 0; j < v; j++) mx = fmax(mx, row[j]);
  for (int64_t j = 0; j < v; j++) sum += exp((double)row[j] - mx);
  return mx + log(sum);
}

/* The floor for comparing scale * (softmax - onehot) with TOL_REDUCTION. Any f32
   evaluation forms logit - lse, whose rounding is an ulp of |lse|, so each probability
   carries an absolute error of a few ulp of max(1, |lse|) (times |scale|); in the target
   column p - 1 cancels down to that absolute error. The floor turns 4 such ulp into
   TOL_REDUCTION; larger elements are held to TOL_REDUCTION relative. */
static double ce_grad_floor(const float *logits, int64_t rows, int64_t v, float scale) {
  double worst = 1.0;
  for (int64_t r = 0; r < rows; r++) worst = fmax(worst, fabs(ref_logsumexp(logits + r * v, v)));
  return fabs(scale) * 4.0 * worst * 0x1p-24 / TOL_REDUCTION;
}

struct ce_case {
  int nd;
  int64_t dims[3]; /* logits; targets get all but the last */
  double logit_scale;
  int32_t ignore_index;
};

static const struct ce_case ce_cases[] = {
    {2, {3, 1}, 1.0, -100},      {2, {1, 7}, 1.0, -100},  {2, {13, 97}, 1.0, -100},
    {3, {2, 3, 257}, 8.0, -1},   {2, {13, 97}, 3.0, 0},   /* ignore_index is a real class */
    {2, {31, 32003}, 2.0, -100}, /* a large vocabulary */
};
enum { CE_CASES = sizeof ce_cases / sizeof ce_cases[0] };

TEST(op_cross_entropy_forward) {
  for (int s = 0; s < CE_CASES; s++) {
    const struct ce_case *c = &ce_cases[s];
    l2l_tensor *logits = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, c->nd, c->dims),
                                     c->logit_scale);
    l2l_tensor *targets = check_tensor(L2L_POOL_HOST, L2L_I32, c->nd - 1, c->dims);
    int64_t v = c->dims[c->nd - 1], rows = numel(targets);
    int64_t real = random_targets(targets, (int32_t)v, c->ignore_index);
    CHECK(real > 0 && (rows == 1 || real < rows), "case %d: real %lld of %lld", s,
          (long long)real, (long long)rows);
    l2l_tensor *losses = F32(rows);
    double *want = doubles(rows);
    const int32_t *t = l2l_tensor_data(targets);
    for (int64_t r = 0; r < rows; r++) {
      const float *row = check_data(logits) + r * v;
      want[r] = t[r] == c->ignore_index ? 0.0 : ref_logsumexp(row, v) - row[t[r]];
    }
    check_poison(losses);
    CHECK_OK(l2l_cross_entropy_forward(losses, logits, targets, c->ignore_index));
    /* log-sum-exp of up to 32003 f32 exps minus a logit: absolute error a few ulp of the
       largest logit (<= ~40), relative to losses of size >= ~1: floor 1. Ignored rows want
       exactly 0. */
    char what[160];
    snprintf(what, sizeof what, "cross_entropy_forward case %d", s);
    CHECK_CLOSE(what, check_data(losses), want, rows, 1.0, TOL_REDUCTION);
    for (int64_t r = 0; r < rows; r++)
      if (t[r] == c->ignore_index)
        CHECK(check_data(losses)[r] == 0.0f, "ignored row %lld has loss %g", (long long)r,
              check_data(losses)[r]);
    free(want);
    FREE(logits, targets, losses);
  }
}

TEST(op_cross_entropy_backward) {
  for (int s = 0; s < CE_CASES; s++) {
    const struct ce_case *c = &ce_cases[s];
    l2l_tensor *logits = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, c->nd, c->dims),
                                     c->logit_scale);
    l2l_tensor *targets = check_tensor(L2L_POOL_HOST, L2L_I32, c->nd - 1, c->dims);
    l2l_tensor *dlogits = check_tensor(L2L_POOL_HOST, L2L_F32, c->nd, c->dims);
    int64_t v = c->dims[c->nd - 1], rows = numel(targets), n = numel(logits);
    int64_t real = random_targets(targets, (int32_t)v, c->ignore_index);
    const int32_t *t = l2l_tensor_data(targets);
    /* The mean over real tokens, then an arbitrary negative scale. */
    const float scales[2] = {1.0f / (float)real, -2.5f};
    for (int k = 0; k < 2; k++) {
      double *want = doubles(n);
      for (int64_t r = 0; r < rows; r++) {
        const float *row = check_data(logits) + r * v;
        double lse = ref_logsumexp(row, v);
        for (int64_t j = 0; j < v; j++)
          want[r * v + j] = t[r] == c->ignore_index
                                ? 0.0
                                : scales[k] * (exp((double)row[j] - lse) - (j == t[r] ? 1.0 : 0.0));
      }
      check_poison(dlogits);
      CHECK_OK(l2l_cross_entropy_backward(dlogits, logits, targets, c->ignore_index, scales[k]));
      /* A row's log-sum-exp over up to 32003 terms; floor from ce_grad_floor. */
      char what[160];
      snprintf(what, sizeof what, "cross_entropy_backward case %d scale %g", s, scales[k]);
      CHECK_CLOSE(what, check_data(dlogits), want, n,
                  ce_grad_floor(check_data(logits), rows, v, scales[k]), TOL_REDUCTION);
      int64_t nonzero_ignored = 0;
      for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < v && t[r] == c->ignore_index; j++)
          nonzero_ignored += check_data(dlogits)[r * v + j] != 0.0f;
      CHECK(nonzero_ignored == 0, "%s: %lld nonzero gradients in ignored rows", what,
            (long long)nonzero_ignored);
      free(want);
    }
    FREE(logits, targets, dlogits);
  }
}

TEST(op_cross_entropy_backward_fd) {
  /* d(sum of losses)/d(logits) by central differences in double, times the scale. */
  int64_t rows = 3, v = 7, n = 21;
  l2l_tensor *logits = RANDN(2.0, rows, v), *targets = I32(rows), *dlogits = F32(rows, v);
  random_targets(targets, (int32_t)v, -100);
  const int32_t *t = l2l_tensor_data(targets);
  float scale = (float)check_rand_uniform(0.1, 2.0);
  double *fd = doubles(n), *row = doubles(v);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < v; j++) {
      double loss[2];
      for (int side = 0; side < 2; side++) {
        for (int64_t k = 0; k < v; k++) row[k] = check_data(logits)[r * v + k];
        row[j] += side ? -1e-6 : 1e-6;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t k = 0; k < v; k++) mx = fmax(mx, row[k]);
        for (int64_t k = 0; k < v; k++) sum += exp(row[k] - mx);
        loss[side] = t[r] == -100 ? 0.0 : mx + log(sum) - row[t[r]];
      }
      fd[r * v + j] = scale * (loss[0] - loss[1]) / 2e-6;
    }
  check_poison(dlogits);
  CHECK_OK(l2l_cross_entropy_backward(dlogits, logits, targets, -100, scale));
  /* Finite differences are good to ~1e-9 here; floor as in op_cross_entropy_backward. */
  CHECK_CLOSE("cross_entropy_backward vs finite differences", check_data(dlogits), fd, n,
              ce_grad_floor(check_data(logits), rows, v, scale), TOL_REDUCTION);
  free(fd);
  free(row);
  FREE(logits, targets, dlogits);
}

TEST(op_cross_entropy_errors) {
  int64_t rows = 5, v = 7;
  l2l_tensor *logits = RANDN(1.0, rows, v), *targets = I32(rows), *losses = F32(rows);
  l2l_tensor *dlogits = F32(rows, v), *t_f = F32(rows), *t6 = I32(6), *l6 = F32(6);
  l2l_tensor *d_bad = F32(v, rows), *dev = DEV_F32(rows), *li = I32(rows, v);
  random_targets(targets, (int32_t)v, -100);
  fill_value(losses, 12345.0f);
  fill_value(dlogits, -6789.0f);
  float *losses0 = snapshot(losses), *dlogits0 = snapshot(dlogits);
  CHECK_FAILS(l2l_cross_entropy_forward(NULL, logits, targets, -100), L2L_ERR_INVALID,
              "losses is NULL");
  CHECK_FAILS(l2l_cross_entropy_forward(losses, NULL, targets, -100), L2L_ERR_INVALID,
              "logits is NULL");
  CHECK_FAILS(l2l_cross_entropy_forward(losses, logits, NULL, -100), L2L_ERR_INVALID,
              "targets is NULL");
  CHECK_FAILS(l2l_cross_entropy_forward(losses, logits, t_f, -100), L2L_ERR_INVALID,
              "targets is f32");
  CHECK_FAILS(l2l_cross_entropy_forward(losses, li, targets, -100), L2L_ERR_INVALID,
              "logits is i32");
  CHECK_FAILS(l2l_cross_entropy_forward(losses, logits, t6, -100), L2L_ERR_INVALID,
              "targets has 6 elements");
  CHECK_FAILS(l2l_cross_entropy_forward(l6, logits, targets, -100), L2L_ERR_INVALID,
              "losses has 6 elements");
  CHECK_FAILS(l2l_cross_entropy_forward(dev, logits, targets, -100), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_cross_entropy_backward(NULL, logits, targets, -100, 1), L2L_ERR_INVALID,
              "dlogits is NULL");
  CHECK_FAILS(l2l_cross_entropy_backward(dlogits, NULL, targets, -100, 1), L2L_ERR_INVALID,
              "logits is NULL");
  CHECK_FAILS(l2l_cross_entropy_backward(dlogits, logits, NULL, -100, 1), L2L_ERR_INVALID,
              "targets is NULL");
  CHECK_FAILS(l2l_cross_entropy_backward(d_bad, logits, targets, -100, 1), L2L_ERR_INVALID,
              "dlogits");
  CHECK_FAILS(l2l_cross_entropy_backward(dlogits, logits, targets, -100, NAN), L2L_ERR_INVALID,
              "scale");
  CHECK_FAILS(l2l_cross_entropy_backward(dlogits, logits, t6, -100, 1), L2L_ERR_INVALID,
              "targets has 6 elements");

  /* Targets out of range are refused, naming the row; the ignore index is allowed even
     though it is outside [0, V). */
  int32_t *t = l2l_tensor_data(targets);
  const int32_t bad_values[] = {(int32_t)v, -1, INT32_MIN, -101};
  for (int k = 0; k < 4; k++) {
    int64_t pos = check_rand_int(0, rows - 1);
    int32_t saved = t[pos];
    t[pos] = bad_values[k];
    char needle[96];
    snprintf(needle, sizeof needle, "targets[%lld] = %d", (long long)pos, bad_values[k]);
    CHECK_FAILS(l2l_cross_entropy_forward(losses, logits, targets, -100), L2L_ERR_INVALID, needle);
    CHECK_FAILS(l2l_cross_entropy_backward(dlogits, logits, targets, -100, 1), L2L_ERR_INVALID,
                needle);
    t[pos] = saved;
  }
  CHECK(same_bytes(losses, losses0), "a refused cross_entropy_forward changed losses");
  CHECK(same_bytes(dlogits, dlogits0), "a refused cross_entropy_backward changed dlogits");
  for (int64_t r = 0; r < rows; r++) t[r] = r % 2 ? -100 : (int32_t)(v - 1);
  CHECK_OK(l2l_cross_entropy_forward(losses, logits, targets, -100));
  CHECK_OK(l2l_cross_entropy_backward(dlogits, logits, targets, -100, 1));
  /* An ignore index inside [0, V) stays a plain class for the range check: V is refused. */
  t[0] = (int32_t)v;
  CHECK_FAILS(l2l_cross_entropy_forward(losses, logits, targets, 3), L2L_ERR_INVALID, "targets[0]");
  free(losses0);
  free(dlogits0);
  FREE(logits, targets, losses, dlogits, t_f, t6, l6, d_bad, dev, li);
}

/* ================================================================ dropout */

static uint32_t keep_threshold_ref(float p) {
  return (uint32_t)llround((1.0 - (double)p) * 16777216.0);
}

/* keep[i] for draws first .. first+n-1 of (seed, stream): the draw with index d is word d%4,
   shifted right by 8, of Philox4x32-10 at counter (d/4 as 64 bits, stream as 64 bits)
   under key seed; kept iff below the threshold. */
static void ref_keep(uint8_t *keep, uint64_t seed, uint64_t stream, int64_t first, int64_t n,
                     float p) {
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, words[4] = {0, 0, 0, 0};
  uint32_t threshold = keep_threshold_ref(p);
  uint64_t have = UINT64_MAX;
  for (int64_t i = 0; i < n; i++) {
    uint64_t draw = (uint64_t)first + (uint64_t)i, block = draw / 4;
    if (block != have) {
      uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
      l2l_philox4x32(words, counter, key);
      have = block;
    }
    keep[i] = (words[draw % 4] >> 8) < threshold;
  }
}

static int mask_bit(const l2l_tensor *mask, int64_t i) {
  return (((const uint8_t *)l2l_tensor_data(mask))[i / 8] >> (i % 8)) & 1;
}

/* Runs dropout on x and checks mask bits against ref_keep and y against x / (1 - p) or 0.
   Returns the number kept. */
static int64_t dropout_case(l2l_tensor *x, float p, uint64_t seed, uint64_t stream, int64_t first) {
  int64_t n = numel(x);
  l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, l2l_tensor_ndim(x),
                               (const int64_t[]){l2l_tensor_dim(x, 0), l2l_tensor_dim(x, 1),
                                                 l2l_tensor_dim(x, 2), l2l_tensor_dim(x, 3)});
  l2l_tensor *mask = U8((n + 7) / 8);
  uint8_t *keep = xmalloc((size_t)n);
  ref_keep(keep, seed, stream, first, n, p);
  check_poison(y);
  memset(l2l_tensor_data(mask), 0xA5, (size_t)((n + 7) / 8));
  CHECK_OK(l2l_dropout_forward(y, mask, x, p, seed, stream, first));
  int64_t bad_bits = 0, first_bad = -1, kept = 0, bad_y = 0;
  const float *xd = check_data(x), *yd = check_data(y);
  enum { CHUNK = 1 << 16 };
  double *want = doubles(CHUNK);
  float *got = xmalloc(CHUNK * sizeof(float));
  double worst = 0.0;
  for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
    int64_t len = n - i0 < CHUNK ? n - i0 : CHUNK;
    for (int64_t i = i0; i < i0 + len; i++) {
      int bit = mask_bit(mask, i);
      if (bit != keep[i]) bad_bits++, first_bad = first_bad < 0 ? i : first_bad;
      kept += bit;
      /* y consistent with the op's own mask bit, x / (1 - p) or exactly 0. */
      want[i - i0] = bit ? (double)xd[i] / (1.0 - (double)p) : 0.0;
      got[i - i0] = yd[i];
      bad_y += !bit && yd[i] != 0.0f;
    }
    double e = check_rel_err(got, want, len, 1e-6);
    worst = e > worst ? e : worst;
  }
  CHECK(bad_bits == 0, "dropout p=%g n=%lld first=%lld: %lld keep decisions differ from Philox, "
        "first at %lld", p, (long long)n, (long long)first, (long long)bad_bits, (long long)first_bad);
  /* x * (1/(1-p)) in f32: two roundings. */
  CHECK(worst <= TOL_ROUNDED && bad_y == 0,
        "dropout p=%g: y inconsistent with x and the mask (rel err %.3g, %lld dropped not 0)", p,
        worst, (long long)bad_y);
  free(keep);
  free(want);
  free(got);
  FREE(y, mask);
  return kept;
}

static uint64_t rand_seed(void) { return check_rand_u64(); }

TEST(op_dropout_forward) {
  static const int64_t shapes[][4] = {{1}, {3, 7}, {13, 31}, {2, 3, 5, 7}, {257, 131}};
  static const int nds[] = {1, 2, 2, 4, 2};
  int64_t kept_total = 0, dropped_total = 0;
  for (int s = 0; s < 5; s++) {
    l2l_tensor *x = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    int64_t n = numel(x);
    const float ps[] = {0.1f, 0.5f, 0.9f, (float)check_rand_uniform(0.01, 0.99), 1e-7f, 0.999f};
    for (int k = 0; k < 6; k++) {
      /* first and stream up to 2^40 and 2^64: the counter's high words matter. */
      int64_t first = check_rand_int(0, INT64_C(1) << 40);
      int64_t kept = dropout_case(x, ps[k], rand_seed(), rand_seed(), first);
      kept_total += kept;
      dropped_total += n - kept;
    }
    /* p = 0 keeps everything, y == x exactly. */
    l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    l2l_tensor *mask = U8((n + 7) / 8);
    check_poison(y);
    memset(l2l_tensor_data(mask), 0x00, (size_t)((n + 7) / 8)); /* all bits must get set */
    CHECK_OK(l2l_dropout_forward(y, mask, x, 0.0f, rand_seed(), rand_seed(), 0));
    int64_t lost = 0;
    for (int64_t i = 0; i < n; i++)
      lost += !mask_bit(mask, i) || check_data(y)[i] != check_data(x)[i];
    CHECK(lost == 0, "dropout p=0: %lld of %lld elements not kept as they were", (long long)lost,
          (long long)n);
    /* y may be x. */
    float *x0 = snapshot(x);
    float p = 0.3f;
    uint64_t seed = rand_seed(), stream = rand_seed();
    uint8_t *keep = xmalloc((size_t)n);
    ref_keep(keep, seed, stream, 7, n, p);
    CHECK_OK(l2l_dropout_forward(x, mask, x, p, seed, stream, 7));
    double *want = doubles(n);
    for (int64_t i = 0; i < n; i++) want[i] = keep[i] ? (double)x0[i] / (1.0 - (double)p) : 0.0;
    CHECK_CLOSE("dropout in place", check_data(x), want, n, 1e-6, TOL_ROUNDED);
    free(want);
    free(keep);
    free(x0);
    FREE(x, y, mask);
  }
  CHECK(kept_total > 0 && dropped_total > 0, "kept %lld, dropped %lld", (long long)kept_total,
        (long long)dropped_total);
}

TEST(op_dropout_large) {
  /* 16.8M elements: every keep decision checked, and the kept fraction near 1 - p. */
  int64_t side = 4099, n = side * side;
  l2l_tensor *x = fill_uniform(F32(side, side), 0.5, 2.0);
  float p = 0.3f;
  int64_t kept = dropout_case(x, p, rand_seed(), rand_seed(), check_rand_int(0, 1 << 30));
  double frac = (double)kept / (double)n, sigma = sqrt(p * (1.0 - p) / (double)n);
  CHECK(fabs(frac - (1.0 - p)) < 6.0 * sigma, "kept fraction %.6f, want %.6f +- %.2g", frac,
        1.0 - p, 6.0 * sigma);
  FREE(x);
}

TEST(op_dropout_split) {
  /* Dropout over a whole (R, C) tensor equals dropout over two row views, each with first
     advanced by the view's offset: the same y, the same mask bits. C odd so the split lands
     inside a mask byte. */
  int64_t rows = 31, cols = 13, n = rows * cols;
  for (int rep = 0; rep < 3; rep++) {
    float p = (float)check_rand_uniform(0.05, 0.95);
    uint64_t seed = rand_seed(), stream = rand_seed();
    int64_t first = check_rand_int(0, INT64_C(1) << 36);
    int64_t split = check_rand_int(1, rows - 1);
    l2l_tensor *x = RANDN(1.0, rows, cols), *y = F32(rows, cols), *mask = U8((n + 7) / 8);
    l2l_tensor *y2 = F32(rows, cols), *x_top = NULL, *x_bot = NULL, *y_top = NULL, *y_bot = NULL;
    CHECK_OK(l2l_tensor_view_rows(&x_top, x, 0, split));
    CHECK_OK(l2l_tensor_view_rows(&x_bot, x, split, rows - split));
    CHECK_OK(l2l_tensor_view_rows(&y_top, y2, 0, split));
    CHECK_OK(l2l_tensor_view_rows(&y_bot, y2, split, rows - split));
    int64_t n_top = split * cols, n_bot = n - n_top;
    l2l_tensor *m_top = U8((n_top + 7) / 8), *m_bot = U8((n_bot + 7) / 8);
    check_poison(y);
    check_poison(y2);
    /* Masks can't hold NaN: opposite fills, so bits left unwritten could not agree. */
    memset(l2l_tensor_data(mask), 0x00, (size_t)((n + 7) / 8));
    memset(l2l_tensor_data(m_top), 0xFF, (size_t)((n_top + 7) / 8));
    memset(l2l_tensor_data(m_bot), 0xFF, (size_t)((n_bot + 7) / 8));
    CHECK_OK(l2l_dropout_forward(y, mask, x, p, seed, stream, first));
    CHECK_OK(l2l_dropout_forward(y_top, m_top, x_top, p, seed, stream,
                                 first + l2l_tensor_offset(x_top)));
    CHECK_OK(l2l_dropout_forward(y_bot, m_bot, x_bot, p, seed, stream,
                                 first + l2l_tensor_offset(x_bot)));
    CHECK(l2l_tensor_offset(x_bot) == n_top, "view offset %lld", (long long)l2l_tensor_offset(x_bot));
    CHECK(memcmp(check_data(y), check_data(y2), (size_t)n * sizeof(float)) == 0,
          "dropout split at row %lld: y differs from the whole", (long long)split);
    int64_t bad = 0, kept = 0;
    for (int64_t i = 0; i < n; i++) {
      int part = i < n_top ? mask_bit(m_top, i) : mask_bit(m_bot, i - n_top);
      bad += part != mask_bit(mask, i);
      kept += part;
    }
    CHECK(bad == 0, "dropout split: %lld mask bits differ", (long long)bad);
    CHECK(kept > 0 && kept < n, "kept %lld of %lld", (long long)kept, (long long)n);
    FREE(x, y, mask, y2, x_top, x_bot, y_top, y_bot, m_top, m_bot);
  }
}

TEST(op_dropout_backward) {
  static const int64_t shapes[][4] = {{1}, {3, 7}, {13, 31}, {2, 3, 5, 7}, {257, 131}};
  static const int nds[] = {1, 2, 2, 4, 2};
  for (int s = 0; s < 5; s++) {
    l2l_tensor *x = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    l2l_tensor *dy = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    l2l_tensor *dx = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    int64_t n = numel(x);
    l2l_tensor *mask = U8((n + 7) / 8);
    const float ps[] = {0.0f, (float)check_rand_uniform(0.05, 0.95)};
    for (int k = 0; k < 2; k++) {
      CHECK_OK(l2l_dropout_forward(y, mask, x, ps[k], rand_seed(), rand_seed(), 0));
      double *want = doubles(n);
      for (int64_t i = 0; i < n; i++)
        want[i] = mask_bit(mask, i) ? (double)check_data(dy)[i] / (1.0 - (double)ps[k]) : 0.0;
      check_poison(dx);
      CHECK_OK(l2l_dropout_backward(dx, dy, mask, ps[k]));
      /* dy * (1/(1-p)) in f32: two roundings; dropped elements exactly 0. */
      CHECK_CLOSE("dropout_backward", check_data(dx), want, n, 1e-6, TOL_ROUNDED);
      int64_t nonzero = 0;
      for (int64_t i = 0; i < n; i++) nonzero += !mask_bit(mask, i) && check_data(dx)[i] != 0.0f;
      CHECK(nonzero == 0, "dropout_backward: %lld dropped elements not 0", (long long)nonzero);
      free(want);
    }
    FREE(x, y, dy, dx, mask);
  }
}

TEST(op_dropout_errors) {
  l2l_tensor *x = RANDN(1.0, 3, 7), *y = RANDN(1.0, 3, 7), *mask = U8(3), *mask_f = F32(3);
  l2l_tensor *mask4 = U8(4), *yt = F32(7, 3), *xi = I32(3, 7), *dev = DEV_F32(3, 7);
  l2l_tensor *v0 = NULL, *v1 = NULL, *dx = RANDN(1.0, 3, 7);
  CHECK_OK(l2l_tensor_view_rows(&v0, x, 0, 2));
  CHECK_OK(l2l_tensor_view_rows(&v1, x, 1, 2));
  l2l_tensor *mask2 = U8(2);
  memset(l2l_tensor_data(mask), 0x5A, 3);
  float *y0 = snapshot(y), *x0 = snapshot(x), *dx0 = snapshot(dx);
  uint8_t *mask0 = snapshot(mask);
  CHECK_FAILS(l2l_dropout_forward(NULL, mask, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "y is NULL");
  CHECK_FAILS(l2l_dropout_forward(y, NULL, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "mask is NULL");
  CHECK_FAILS(l2l_dropout_forward(y, mask, NULL, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "x is NULL");
  CHECK_FAILS(l2l_dropout_forward(y, mask_f, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "mask is f32");
  CHECK_FAILS(l2l_dropout_forward(y, mask, xi, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "x is i32");
  CHECK_FAILS(l2l_dropout_forward(y, mask, x, 1.0f, 1, 2, 0), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_forward(y, mask, x, -0.1f, 1, 2, 0), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_forward(y, mask, x, NAN, 1, 2, 0), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_forward(y, mask, x, 0.5f, 1, 2, -1), L2L_ERR_INVALID, "first");
  CHECK_FAILS(l2l_dropout_forward(yt, mask, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "y has shape (7,3)");
  CHECK_FAILS(l2l_dropout_forward(y, mask4, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID,
              "mask has 4 elements");
  CHECK_FAILS(l2l_dropout_forward(y, mask, dev, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_dropout_forward(v1, mask2, v0, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "y overlaps x");
  CHECK(same_bytes(y, y0) && same_bytes(x, x0) && same_bytes(mask, mask0),
        "a refused dropout_forward changed an output");
  CHECK_FAILS(l2l_dropout_backward(NULL, y, mask, 0.5f), L2L_ERR_INVALID, "dx is NULL");
  CHECK_FAILS(l2l_dropout_backward(dx, NULL, mask, 0.5f), L2L_ERR_INVALID, "dy is NULL");
  CHECK_FAILS(l2l_dropout_backward(dx, y, NULL, 0.5f), L2L_ERR_INVALID, "mask is NULL");
  CHECK_FAILS(l2l_dropout_backward(dx, y, mask_f, 0.5f), L2L_ERR_INVALID, "mask is f32");
  CHECK_FAILS(l2l_dropout_backward(dx, y, mask, 1.0f), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_backward(dx, y, mask, -0.5f), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_backward(yt, y, mask, 0.5f), L2L_ERR_INVALID, "dx has shape (7,3)");
  CHECK_FAILS(l2l_dropout_backward(dx, y, mask4, 0.5f), L2L_ERR_INVALID, "mask has 4 elements");
  CHECK_FAILS(l2l_dropout_backward(dx, dev, mask, 0.5f), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK(same_bytes(dx, dx0), "a refused dropout_backward changed dx");
  free(y0);
  free(x0);
  free(dx0);
  free(mask0);
  FREE(x, y, mask, mask_f, mask4, yt, xi, dev, v0, v1, dx, mask2);
}

/* ================================================================ reductions */

struct sums {
  double sum, abs_sum, max_abs, sum_sq;
};

static struct sums ref_sums(const float *x, int64_t n) {
  struct sums s = {0, 0, 0, 0};
  for (int64_t i = 0; i < n; i++) {
    double v = x[i];
    s.sum += v;
    s.abs_sum += fabs(v);
    s.max_abs = fmax(s.max_abs, fabs(v));
    s.sum_sq += v * v;
  }
  return s;
}

static void check_reductions(const l2l_tensor *x, const char *what) {
  struct sums want = ref_sums(check_data(x), numel(x));
  double sum = NAN, max_abs = NAN, norm = NAN;
  CHECK_OK(l2l_sum(&sum, x));
  CHECK_OK(l2l_max_abs(&max_abs, x));
  CHECK_OK(l2l_norm2(&norm, x));
  /* Accumulated in double: any order is good to ~n 2^-53 of the sum of magnitudes. */
  CHECK(fabs(sum - want.sum) <= 1e-12 * want.abs_sum + 1e-300, "%s: sum %.17g, want %.17g",
        what, sum, want.sum);
  CHECK(max_abs == want.max_abs, "%s: max_abs %.9g, want %.9g", what, max_abs, want.max_abs);
  CHECK(fabs(norm - sqrt(want.sum_sq)) <= 1e-12 * sqrt(want.sum_sq) + 1e-300,
        "%s: norm2 %.17g, want %.17g", what, norm, sqrt(want.sum_sq));
}

TEST(op_reductions) {
  static const int64_t sizes[] = {1, 7, 257, 13 * 97, 131071};
  for (int s = 0; s < 5; s++) {
    l2l_tensor *x = RANDN(3.0, sizes[s]);
    /* The largest magnitude on a random element, negative half the time. */
    int64_t at = check_rand_int(0, sizes[s] - 1);
    check_data(x)[at] = (float)(check_rand_int(0, 1) ? -50.0 : 50.0) * (float)check_rand_uniform(1, 2);
    check_reductions(x, "reductions");
    FREE(x);
  }
  /* 16.8M elements, 4-D. */
  l2l_tensor *big = fill_uniform(F32(1, 3, 4099, 1366), -1, 1);
  check_data(big)[check_rand_int(0, numel(big) - 1)] = -1.5f;
  check_reductions(big, "reductions 16.8M");
  FREE(big);
}

TEST(op_reductions_nan_inf) {
  static const int64_t sizes[] = {1, 7, 257, 131071, 4099 * 4099};
  for (int s = 0; s < 5; s++) {
    l2l_tensor *x = fill_uniform(F32(sizes[s]), -1, 1);
    int64_t n = sizes[s];
    const int64_t spots[3] = {0, n - 1, check_rand_int(0, n - 1)};
    for (int k = 0; k < 3; k++) {
      float *d = check_data(x);
      float saved = d[spots[k]];
      d[spots[k]] = NAN;
      double sum = 0, max_abs = 0, norm = 0;
      CHECK_OK(l2l_sum(&sum, x));
      CHECK_OK(l2l_max_abs(&max_abs, x));
      CHECK_OK(l2l_norm2(&norm, x));
      CHECK(isnan(max_abs), "max_abs with a NaN at %lld of %lld: %g", (long long)spots[k],
            (long long)n, max_abs);
      CHECK(isnan(sum) && isnan(norm), "sum/norm2 with a NaN at %lld of %lld: %g, %g",
            (long long)spots[k], (long long)n, sum, norm);
      d[spots[k]] = -INFINITY;
      CHECK_OK(l2l_sum(&sum, x));
      CHECK_OK(l2l_max_abs(&max_abs, x));
      CHECK_OK(l2l_norm2(&norm, x));
      CHECK(max_abs == INFINITY && norm == INFINITY && sum == -INFINITY,
            "with -inf at %lld: sum %g, max_abs %g, norm2 %g", (long long)spots[k], sum, max_abs,
            norm);
      d[spots[k]] = saved;
    }
    FREE(x);
  }
}

TEST(op_reductions_errors) {
  l2l_tensor *x = RANDN(1.0, 7), *xi = I32(7);
  double out = 42.0;
  CHECK_FAILS(l2l_sum(NULL, x), L2L_ERR_INVALID, "out is NULL");
  CHECK_FAILS(l2l_max_abs(NULL, x), L2L_ERR_INVALID, "out is NULL");
  CHECK_FAILS(l2l_norm2(NULL, x), L2L_ERR_INVALID, "out is NULL");
  CHECK_FAILS(l2l_sum(&out, NULL), L2L_ERR_INVALID, "x is NULL");
  CHECK_FAILS(l2l_max_abs(&out, xi), L2L_ERR_INVALID, "x is i32");
  CHECK_FAILS(l2l_norm2(&out, xi), L2L_ERR_INVALID, "x is i32");
  CHECK(out == 42.0, "a refused reduction wrote its result");
  FREE(x, xi);
}

/* ================================================================ AdamW */

TEST(op_adamw) {
  static const int64_t sizes[] = {1, 7 * 13, 257 * 31};
  const l2l_adamw_config configs[2] = {{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f},
                                       {3e-4f, 0.8f, 0.95f, 1e-6f, 0.0f}};
  for (int s = 0; s < 3; s++)
    for (int k = 0; k < 2; k++) {
      int64_t n = sizes[s];
      l2l_tensor *p = RANDN(1.0, n), *m = F32(n), *v = F32(n), *g = F32(n);
      /* Config 0 starts fresh at step 1; config 1 resumes at step 1000 with random moments.
         Each element has its own gradient size, 1e-4 to 10, so that v meets eps for some. */
      int64_t t0 = k ? 1000 : 1;
      double *gsize = doubles(n);
      for (int64_t i = 0; i < n; i++) {
        gsize[i] = pow(10.0, check_rand_uniform(-4, 1));
        check_data(m)[i] = k ? (float)(0.1 * gsize[i] * check_rand_normal()) : 0.0f;
        check_data(v)[i] = k ? (float)(gsize[i] * gsize[i] * check_rand_uniform(0, 2)) : 0.0f;
      }
      double *pd = to_doubles(check_data(p), n), *md = to_doubles(check_data(m), n);
      double *vd = to_doubles(check_data(v), n), *want = doubles(n);
      float *got = xmalloc((size_t)n * sizeof(float));
      for (int64_t t = t0; t < t0 + 6; t++) {
        for (int64_t i = 0; i < n; i++) check_data(g)[i] = (float)(gsize[i] * check_rand_normal());
        ref_adamw(pd, md, vd, check_data(g), n, &configs[k], t);
        CHECK_OK(l2l_adamw_update(p, m, v, g, &configs[k], t));
        char what[160];
        snprintf(what, sizeof what, "adamw n=%lld config %d step %lld", (long long)n, k,
                 (long long)t);
        /* Each state element takes a few f32 ops per step, tracked in double by the
           reference: after six steps a few ulp each. Params are O(1) and move by ~lr per
           step: floor 1e-2. m = b1 m + (1-b1) g cancels when the signs differ, leaving an
           absolute error of a few ulp of the element's gradient size: m is compared in
           units of that size with floor 0.1 (m's typical size in those units). v sums
           squares: no cancellation, purely relative. */
        CHECK_CLOSE(what, check_data(p), pd, n, 1e-2, TOL_ELEMENTWISE);
        for (int64_t i = 0; i < n; i++) {
          got[i] = (float)(check_data(m)[i] / gsize[i]);
          want[i] = md[i] / gsize[i];
        }
        CHECK_CLOSE("adamw m (in units of the gradient size)", got, want, n, 0.1,
                    TOL_ELEMENTWISE);
        CHECK_CLOSE("adamw v", check_data(v), vd, n, 1e-30, TOL_ELEMENTWISE);
      }
      free(gsize);
      free(pd);
      free(md);
      free(vd);
      free(want);
      free(got);
      FREE(p, m, v, g);
    }
}

TEST(op_adamw_errors) {
  l2l_tensor *p = RANDN(1.0, 13), *m = RANDN(1.0, 13), *v = RANDN(1.0, 13), *g = RANDN(1.0, 13);
  l2l_tensor *g7 = RANDN(1.0, 7), *mi = I32(13), *dev = DEV_F32(13);
  const l2l_adamw_config ok = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  float *p0 = snapshot(p), *m0 = snapshot(m), *v0 = snapshot(v);
  CHECK_FAILS(l2l_adamw_update(p, m, v, g, &ok, 0), L2L_ERR_INVALID, "step");
  CHECK_FAILS(l2l_adamw_update(p, m, v, g, &ok, -3), L2L_ERR_INVALID, "step");
  CHECK_FAILS(l2l_adamw_update(NULL, m, v, g, &ok, 1), L2L_ERR_INVALID, "param is NULL");
  CHECK_FAILS(l2l_adamw_update(p, NULL, v, g, &ok, 1), L2L_ERR_INVALID, "m is NULL");
  CHECK_FAILS(l2l_adamw_update(p, m, NULL, g, &ok, 1), L2L_ERR_INVALID, "v is NULL");
  CHECK_FAILS(l2l_adamw_update(p, m, v, NULL, &ok, 1), L2L_ERR_INVALID, "grad is NULL");
  CHECK_FAILS(l2l_adamw_update(p, m, v, g, NULL, 1), L2L_ERR_INVALID, "config is NULL");
  CHECK_FAILS(l2l_adamw_update(p, mi, v, g, &ok, 1), L2L_ERR_INVALID, "m is i32");
  CHECK_FAILS(l2l_adamw_update(p, m, v, g7, &ok, 1), L2L_ERR_INVALID, "grad has 7 elements");
  CHECK_FAILS(l2l_adamw_update(p, m, v, dev, &ok, 1), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_adamw_update(p, p, v, g, &ok, 1), L2L_ERR_INVALID, "param overlaps m");
  CHECK_FAILS(l2l_adamw_update(p, m, v, v, &ok, 1), L2L_ERR_INVALID, "v overlaps grad");
  /* Configs for which l2l.h's formula is undefined: 1 - beta1^t = 0; eps = 0 with v = 0
     (0/0); a non-finite decay. */
  l2l_adamw_config bad = ok;
  bad.beta1 = 1.0f;
  CHECK_FAILS(l2l_adamw_update(p, m, v, g, &bad, 1), L2L_ERR_INVALID, "beta1");
  bad = ok, bad.eps = 0.0f;
  CHECK_FAILS(l2l_adamw_update(p, m, v, g, &bad, 1), L2L_ERR_INVALID, "eps");
  bad = ok, bad.weight_decay = NAN;
  CHECK_FAILS(l2l_adamw_update(p, m, v, g, &bad, 1), L2L_ERR_INVALID, "weight_decay");
  CHECK(same_bytes(p, p0) && same_bytes(m, m0) && same_bytes(v, v0),
        "a refused adamw_update changed its state");
  free(p0);
  free(m0);
  free(v0);
  FREE(p, m, v, g, g7, mi, dev);
}
