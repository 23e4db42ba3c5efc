/* SPDX-License-Identifier: MIT */
/* test_ops_update.c — the update's ops of l2l.h's "ops" section against naive
 * double-precision references: the reductions (sum, max-abs, squared norm; with NaN and
 * inf) and AdamW. test_ops.c says how (fresh random inputs, double references from l2l.h's
 * formulas, poisoned outputs, refusals that name the argument and change nothing). All test
 * names start with "op_" (`l2l_ctest op_` runs every op file).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_ops.h"

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
