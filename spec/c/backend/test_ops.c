/* SPDX-License-Identifier: MIT */
/* test_ops.c — every op of l2l.h's "ops" section against naive double-precision
 * references; this file: GEMM, bias, the residual add and GELU (test_ops_*.c the rest).
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
 * All test names start with "op_", so `l2l_ctest op_` runs just these files: test_ops.c,
 * test_ops_rows.c (LayerNorm, softmax), test_ops_tokens.c (embedding, cross-entropy),
 * test_ops_dropout.c and test_ops_update.c (the reductions, AdamW); test_ops.h holds the
 * tolerances and helpers they share.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_ops.h"

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

/* A 16-bit GEMM (bf16 or f16 a and b, f32 sums into f32 c) against references of the
   same values widened (exactly): small awkward shapes against the double reference, and
   shapes past the CPU backend's panels (it widens 32 MiB of inputs at a time,
   layer_ops.c's WIDEN_FLOATS: an LM head's table is cut into column panels) against the
   f32 GEMM of the widened inputs in one call, every element. Both are f32 sums over all of
   k, in orders that may differ (OpenBLAS's edge kernels sum otherwise than its full
   blocks): each is within TOL_REDUCTION of the exact product on this scale (op_gemm_large),
   so they are within twice that of each other; a panel made of the wrong rows or columns
   is off by the product's whole size. */
static void gemm16_case(int64_t m, int64_t n, int64_t k, int ta, int tb, l2l_dtype dt) {
  l2l_tensor *a = ta ? RANDN(1.0, k, m) : RANDN(1.0, m, k);
  l2l_tensor *b = tb ? RANDN(1.0, n, k) : RANDN(1.0, k, n);
  const int64_t as[2] = {ta ? k : m, ta ? m : k}, bs[2] = {tb ? n : k, tb ? k : n};
  l2l_tensor *a16 = check_tensor(L2L_POOL_HOST, dt, 2, as), *b16 = check_tensor(L2L_POOL_HOST, dt, 2, bs);
  CHECK_OK(l2l_tensor_cast(a16, a));
  CHECK_OK(l2l_tensor_cast(b16, b));
  CHECK_OK(l2l_tensor_cast(a, a16));   /* a, b := the 16-bit values, widened */
  CHECK_OK(l2l_tensor_cast(b, b16));
  float alpha = (float)check_rand_uniform(-2, 2), beta = check_rand_int(0, 1) ? 0.0f : (float)check_rand_uniform(-1, 1);
  l2l_tensor *c = F32(m, n);
  if (beta == 0.0f) check_poison(c);
  else fill_normal(c, 1.0);
  double *want = doubles(m * n);
  bool small = m * n * k <= 1 << 20;
  if (small) {
    ref_gemm(want, check_data(a), check_data(b), check_data(c), m, n, k, ta, tb, alpha, beta);
  } else {
    l2l_tensor *c32 = F32(m, n);
    memcpy(check_data(c32), check_data(c), (size_t)(m * n) * sizeof(float));
    CHECK_OK(l2l_gemm(c32, a, b, ta, tb, alpha, beta));
    for (int64_t i = 0; i < m * n; i++) want[i] = check_data(c32)[i];
    FREE(c32);
  }
  char what[160];
  snprintf(what, sizeof what, "%s gemm m=%lld n=%lld k=%lld ta=%d tb=%d alpha=%g beta=%g",
           l2l_dtype_name(dt), (long long)m, (long long)n, (long long)k, ta, tb, alpha, beta);
  CHECK_OK(l2l_gemm(c, a16, b16, ta, tb, alpha, beta));
  CHECK_CLOSE(what, check_data(c), want, m * n, fabs(alpha) * sqrt((double)k) + fabs(beta),
              small ? TOL_ELEMENTWISE : 2 * TOL_REDUCTION);
  free(want);
  FREE(a, b, a16, b16, c);
}

TEST(op_gemm_16bit_inputs) {
  static const int64_t sizes[] = {1, 3, 7, 13, 31, 97};
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      l2l_dtype dt = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
      gemm16_case(check_pick(sizes, 6), check_pick(sizes, 6), check_pick(sizes, 6), ta, tb, dt);
    }
  /* Past 8 Mi floats of inputs (32 MiB widened), each of the CPU backend's ways to cut
     them: m + n <= 32 Ki (both whole, k in panels), and a vocabulary's dim beside a few
     (the few whole, the vocabulary's in panels: an LM head; the same loops take k in
     panels too where a k of 32 Ki or more leaves no room for it whole, which no test
     here can afford: its b would be 4 GiB). */
  const int64_t cap = 8 << 20;
  for (int side = 0; side < 2; side++) {   /* a and b transposed and not; the vocabulary as m and n */
    int64_t m = check_rand_int(16, 200), n = check_rand_int(1000, 2500);
    gemm16_case(m, n, cap / (m + n) + check_rand_int(500, 3000), side, side,
                check_rand_int(0, 1) ? L2L_BF16 : L2L_F16);
    int64_t few = check_rand_int(50, 300), vocab = check_rand_int(33000, 36000), k = check_rand_int(300, 800);
    gemm16_case(side ? vocab : few, side ? few : vocab, k, check_rand_int(0, 1), check_rand_int(0, 1), L2L_BF16);
  }
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
    /* dy in 16 bits: the sums of its values (exactly widened), onto the result above */
    const l2l_dtype dt = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
    l2l_tensor *dy16 = check_tensor(L2L_POOL_HOST, dt, nds[s], shapes[s]);
    CHECK_OK(l2l_tensor_cast(dy16, dy));
    const uint16_t *h = l2l_tensor_data(dy16);
    for (int64_t j = 0; j < cols; j++) {
      double acc = check_data(dbias)[j];
      for (int64_t r = 0; r < rows; r++)
        acc += dt == L2L_BF16 ? l2l_bf16_to_f32(h[r * cols + j]) : l2l_f16_to_f32(h[r * cols + j]);
      want[j] = acc;
    }
    CHECK_OK(l2l_bias_backward(dbias, dy16));
    CHECK_CLOSE("bias_backward over 16 bits", check_data(dbias), want, cols,
                2 * sqrt((double)rows) + 1.0, rows > 100 ? TOL_REDUCTION : TOL_ELEMENTWISE);
    free(want);
    FREE(dy, dbias, dy16);
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
