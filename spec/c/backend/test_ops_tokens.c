/* SPDX-License-Identifier: MIT */
/* test_ops_tokens.c — the ops of l2l.h's "ops" section that take token ids, against naive
 * double-precision references: embedding forward and backward, cross-entropy forward and
 * backward (ignore_index, scale). test_ops.c says how (fresh random inputs, double
 * references from l2l.h's formulas, finite differences for gradients, poisoned outputs,
 * refusals that name the argument and change nothing). All test names start with "op_"
 * (`l2l_ctest op_` runs every op file).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_ops.h"

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
