/* SPDX-License-Identifier: MIT */
/* test_ops.h — what the op tests (test_ops*.c) share: their tolerances, each with why it is
 * what it is, tensor shorthands and the comparison macros.
 *
 * Purpose: one statement of the tolerances, so that every op family is held to the same
 * bounds for the same arithmetic.
 * Must never: hold a reference or a test (those are reference.c's and the test files').
 */
#ifndef L2L_TEST_OPS_H
#define L2L_TEST_OPS_H

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

static inline l2l_tensor *fill_uniform(l2l_tensor *t, double lo, double hi) {
  float *d = check_data(t);
  for (int64_t i = 0; i < numel(t); i++) d[i] = (float)check_rand_uniform(lo, hi);
  return t;
}

static inline void fill_value(l2l_tensor *t, float value) {
  float *d = check_data(t);
  for (int64_t i = 0; i < numel(t); i++) d[i] = value;
}

/* ---------------------------------------------------------------- comparisons */

#define CHECK_CLOSE(what, got, want, n, floor, tol) \
  close_at(__FILE__, __LINE__, (what), (got), (want), (n), (floor), (tol))

#define CHECK_POOLS_NAMED() pools_named(__FILE__, __LINE__)

#endif /* L2L_TEST_OPS_H */
