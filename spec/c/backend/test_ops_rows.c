/* SPDX-License-Identifier: MIT */
/* test_ops_rows.c — the row-wise ops of l2l.h's "ops" section against naive
 * double-precision references: LayerNorm (forward, backward, finite differences) and
 * softmax (causal, key padding mask, scale; backward). test_ops.c says how (fresh random
 * inputs, double references from l2l.h's formulas, finite differences for gradients,
 * poisoned outputs, refusals that name the argument and change nothing). All test names
 * start with "op_" (`l2l_ctest op_` runs every op file).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_ops.h"

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
