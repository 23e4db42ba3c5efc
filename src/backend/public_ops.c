/* SPDX-License-Identifier: MIT */
/* public_ops.c — the public ops: check every argument, then run the owning backend's entry.
 *
 * Purpose: make the ops safe to call from C and Lua with anything: NULL, freed handles,
 * wrong dtypes, shapes, pools, aliasing, ids out of range. Each check names the function,
 * the argument and what it should have been. Only when all pass does the backend run, so a
 * failed call changes nothing.
 * Must never: compute anything itself (that is the backend's job) or skip a check because
 * "the backend would catch it".
 */
#include <math.h>
#include <stdio.h>

#include "backend.h"

/* ---------------------------------------------------------------- argument checks */

struct arg {
  const char *name;
  const l2l_tensor *t;
};

static l2l_status need(const char *func, const char *name, const l2l_tensor *t,
                       l2l_dtype dtype) {
  if (t == NULL) return core_fail_in(func, L2L_ERR_INVALID, "%s is NULL", name);
  if (!tensor_ok(t))
    return core_fail_in(func, L2L_ERR_INVALID, "%s is not a live tensor (freed?)", name);
  if (t->dtype != dtype)
    return core_fail_in(func, L2L_ERR_INVALID, "%s is %s, need %s", name,
                        l2l_dtype_name(t->dtype), l2l_dtype_name(dtype));
  return L2L_OK;
}

/* All tensors (NULL entries skipped) in pools of one backend; returns that backend. */
static l2l_status one_backend(const char *func, const struct backend_ops **ops,
                              const struct arg *args, int count) {
  const struct arg *first = NULL;
  for (int i = 0; i < count; i++) {
    if (args[i].t == NULL) continue;
    if (first == NULL) {
      first = &args[i];
      continue;
    }
    l2l_pool_kind a = first->t->storage->pool, b = args[i].t->storage->pool;
    if (backend_pool_domain(a) != backend_pool_domain(b))
      return core_fail_in(func, L2L_ERR_INVALID,
                          "%s is in pool '%s' but %s is in pool '%s': an op's tensors must share "
                          "one backend (copy them first)",
                          first->name, l2l_pool_name(a), args[i].name, l2l_pool_name(b));
  }
  *ops = backend_for(first ? first->t->storage->pool : L2L_POOL_HOST);
  return L2L_OK;
}

/* An output must not overlap an input, unless `same_ok` and they are exactly the same
   elements (the in-place form an op allows). */
static l2l_status distinct(const char *func, const char *out_name, const l2l_tensor *out,
                           const char *in_name, const l2l_tensor *in, bool same_ok) {
  if (!tensors_overlap(out, in)) return L2L_OK;
  if (same_ok && out->offset == in->offset && out->numel == in->numel) return L2L_OK;
  return core_fail_in(func, L2L_ERR_INVALID, "%s overlaps %s in memory%s", out_name, in_name,
                      same_ok ? " (only exactly the same tensor is allowed)" : "");
}

static l2l_status numel_is(const char *func, const char *name, const l2l_tensor *t,
                           int64_t want, const char *why) {
  if (t->numel == want) return L2L_OK;
  return core_fail_in(func, L2L_ERR_INVALID, "%s has %lld elements, need %lld (%s)", name,
                      (long long)t->numel, (long long)want, why);
}

static l2l_status need_finite(const char *func, const char *name, double value) {
  if (isfinite(value)) return L2L_OK;
  return core_fail_in(func, L2L_ERR_INVALID, "%s must be finite, got %g", name, value);
}

/* ---------------------------------------------------------------- GEMM */

/* (batch, rows, cols) of a tensor seen as a batch of matrices. */
static void as_batch(const l2l_tensor *t, int64_t *batch, int64_t *rows, int64_t *cols) {
  *cols = t->shape[t->ndim - 1];
  *rows = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
  *batch = t->numel / (*rows * *cols);
}

static l2l_status gemm_common(const char *func, l2l_tensor *c, const l2l_tensor *a,
                              const l2l_tensor *b, int trans_a, int trans_b, float alpha,
                              float beta, bool batched) {
  TRY(need(func, "c", c, L2L_F32));
  if (a != NULL && tensor_ok(a) && (a->dtype == L2L_F16 || a->dtype == L2L_BF16)) {
    TRY(need(func, "b", b, a->dtype)); /* 16-bit inputs, both of one kind */
  } else {
    TRY(need(func, "a", a, L2L_F32));
    TRY(need(func, "b", b, L2L_F32));
  }
  if ((trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1))
    return core_fail_in(func, L2L_ERR_INVALID, "trans_a and trans_b must be 0 or 1, got %d, %d",
                        trans_a, trans_b);
  TRY(need_finite(func, "alpha", alpha));
  TRY(need_finite(func, "beta", beta));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"c", c}, {"a", a}, {"b", b}};
  TRY(one_backend(func, &ops, args, 3));
  TRY(distinct(func, "c", c, "a", a, false));
  TRY(distinct(func, "c", c, "b", b, false));

  int64_t ba = 1, bb = 1, bc = 1, ar, ac, br, bcols, cr, cc;
  if (batched) {
    if (a->ndim < 2 || b->ndim < 2 || c->ndim < 2)
      return core_fail_in(func, L2L_ERR_INVALID, "a, b and c need at least 2 dims each");
    as_batch(a, &ba, &ar, &ac);
    as_batch(b, &bb, &br, &bcols);
    as_batch(c, &bc, &cr, &cc);
    if (ba != bb || ba != bc)
      return core_fail_in(func, L2L_ERR_INVALID,
                          "batch counts differ: a has %lld, b has %lld, c has %lld",
                          (long long)ba, (long long)bb, (long long)bc);
  } else {
    ar = tensor_rows(a), ac = tensor_cols(a);
    br = tensor_rows(b), bcols = tensor_cols(b);
    cr = tensor_rows(c), cc = tensor_cols(c);
  }
  int64_t m = trans_a ? ac : ar, k = trans_a ? ar : ac;
  int64_t kb = trans_b ? bcols : br, n = trans_b ? br : bcols;
  if (k != kb)
    return core_fail_in(func, L2L_ERR_INVALID,
                        "inner dims differ: op(a) is (%lld,%lld) but op(b) is (%lld,%lld) "
                        "(trans_a = %d, trans_b = %d)",
                        (long long)m, (long long)k, (long long)kb, (long long)n, trans_a, trans_b);
  if (cr != m || cc != n)
    return core_fail_in(func, L2L_ERR_INVALID, "c is (%lld,%lld) but op(a) op(b) is (%lld,%lld)",
                        (long long)cr, (long long)cc, (long long)m, (long long)n);
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
    return core_fail_in(func, L2L_ERR_INVALID, "matrix dims above 2^31-1 are not supported");
  return ops->gemm_batched(tensor_ptr(c), tensor_ptr(a), tensor_ptr(b), a->dtype, ba,
                           m, n, k, trans_a, trans_b, alpha, beta, 0, 0, 0);
}

l2l_status l2l_gemm(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b, int trans_a,
                    int trans_b, float alpha, float beta) {
  return gemm_common(__func__, c, a, b, trans_a, trans_b, alpha, beta, false);
}

l2l_status l2l_gemm_batched(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b,
                            int trans_a, int trans_b, float alpha, float beta) {
  return gemm_common(__func__, c, a, b, trans_a, trans_b, alpha, beta, true);
}

/* ---------------------------------------------------------------- element-wise */

l2l_status l2l_bias_add(l2l_tensor *y, const l2l_tensor *bias) {
  const char *f = __func__;
  TRY(need(f, "y", y, L2L_F32));
  TRY(need(f, "bias", bias, L2L_F32));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"y", y}, {"bias", bias}};
  TRY(one_backend(f, &ops, args, 2));
  TRY(numel_is(f, "bias", bias, tensor_cols(y), "one per column of y"));
  TRY(distinct(f, "y", y, "bias", bias, false));
  return ops->bias_add(tensor_ptr(y), NULL, L2L_F32, tensor_ptr(bias), tensor_rows(y),
                       tensor_cols(y));
}

l2l_status l2l_bias_backward(l2l_tensor *dbias, const l2l_tensor *dy) {
  const char *f = __func__;
  TRY(need(f, "dbias", dbias, L2L_F32));
  bool dy16 = dy != NULL && tensor_ok(dy) && (dy->dtype == L2L_F16 || dy->dtype == L2L_BF16);
  TRY(need(f, "dy", dy, dy16 ? dy->dtype : L2L_F32));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"dbias", dbias}, {"dy", dy}};
  TRY(one_backend(f, &ops, args, 2));
  TRY(numel_is(f, "dbias", dbias, tensor_cols(dy), "one per column of dy"));
  TRY(distinct(f, "dbias", dbias, "dy", dy, false));
  return ops->bias_backward(tensor_ptr(dbias), tensor_ptr(dy), dy->dtype, tensor_rows(dy),
                            tensor_cols(dy));
}

l2l_status l2l_add(l2l_tensor *out, const l2l_tensor *a, const l2l_tensor *b) {
  const char *f = __func__;
  TRY(need(f, "out", out, L2L_F32));
  TRY(need(f, "a", a, L2L_F32));
  TRY(need(f, "b", b, L2L_F32));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"out", out}, {"a", a}, {"b", b}};
  TRY(one_backend(f, &ops, args, 3));
  TRY(core_same_shape(f, "a", a, "b", b));
  TRY(core_same_shape(f, "out", out, "a", a));
  TRY(distinct(f, "out", out, "a", a, true));
  TRY(distinct(f, "out", out, "b", b, true));
  return ops->add(tensor_ptr(out), tensor_ptr(a), tensor_ptr(b), out->numel);
}

l2l_status l2l_gelu_forward(l2l_tensor *y, const l2l_tensor *x) {
  const char *f = __func__;
  TRY(need(f, "y", y, L2L_F32));
  TRY(need(f, "x", x, L2L_F32));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"y", y}, {"x", x}};
  TRY(one_backend(f, &ops, args, 2));
  TRY(core_same_shape(f, "y", y, "x", x));
  TRY(distinct(f, "y", y, "x", x, true));
  return ops->gelu_forward(tensor_ptr(y), tensor_ptr(x), x->numel);
}

l2l_status l2l_gelu_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *x) {
  const char *f = __func__;
  TRY(need(f, "dx", dx, L2L_F32));
  TRY(need(f, "dy", dy, L2L_F32));
  TRY(need(f, "x", x, L2L_F32));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"dx", dx}, {"dy", dy}, {"x", x}};
  TRY(one_backend(f, &ops, args, 3));
  TRY(core_same_shape(f, "dy", dy, "x", x));
  TRY(core_same_shape(f, "dx", dx, "x", x));
  TRY(distinct(f, "dx", dx, "dy", dy, true));
  TRY(distinct(f, "dx", dx, "x", x, true));
  return ops->gelu_backward(tensor_ptr(dx), NULL, L2L_F32, tensor_ptr(dy), tensor_ptr(x),
                            x->numel);
}

/* ---------------------------------------------------------------- LayerNorm */

l2l_status l2l_layernorm_forward(l2l_tensor *y, l2l_tensor *mean, l2l_tensor *rstd,
                                 const l2l_tensor *x, const l2l_tensor *weight,
                                 const l2l_tensor *bias, float eps) {
  const char *f = __func__;
  TRY(need(f, "y", y, L2L_F32));
  TRY(need(f, "x", x, L2L_F32));
  TRY(need(f, "weight", weight, L2L_F32));
  TRY(need(f, "bias", bias, L2L_F32));
  if (mean) TRY(need(f, "mean", mean, L2L_F32));
  if (rstd) TRY(need(f, "rstd", rstd, L2L_F32));
  if (!(eps > 0.0f) || !isfinite(eps))
    return core_fail_in(f, L2L_ERR_INVALID, "eps must be finite and > 0, got %g", eps);
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"y", y}, {"mean", mean}, {"rstd", rstd},
                       {"x", x}, {"weight", weight}, {"bias", bias}};
  TRY(one_backend(f, &ops, args, 6));
  int64_t rows = tensor_rows(x), cols = tensor_cols(x);
  TRY(core_same_shape(f, "y", y, "x", x));
  TRY(numel_is(f, "weight", weight, cols, "one per column of x"));
  TRY(numel_is(f, "bias", bias, cols, "one per column of x"));
  if (mean) TRY(numel_is(f, "mean", mean, rows, "one per row of x"));
  if (rstd) TRY(numel_is(f, "rstd", rstd, rows, "one per row of x"));
  TRY(distinct(f, "y", y, "x", x, true));
  const struct arg outs[] = {{"y", y}, {"mean", mean}, {"rstd", rstd}};
  const struct arg ins[] = {{"x", x}, {"weight", weight}, {"bias", bias}};
  for (int o = 0; o < 3; o++) {
    for (int i = o == 0 ? 1 : 0; i < 3; i++)
      TRY(distinct(f, outs[o].name, outs[o].t, ins[i].name, ins[i].t, false));
    for (int p = o + 1; p < 3; p++)
      TRY(distinct(f, outs[o].name, outs[o].t, outs[p].name, outs[p].t, false));
  }
  if (mean) TRY(distinct(f, "mean", mean, "x", x, false));
  if (rstd) TRY(distinct(f, "rstd", rstd, "x", x, false));
  return ops->layernorm_forward(tensor_ptr(y), NULL, L2L_F32, mean ? tensor_ptr(mean) : NULL,
                                rstd ? tensor_ptr(rstd) : NULL, tensor_ptr(x),
                                tensor_ptr(weight), tensor_ptr(bias), eps, rows, cols);
}

l2l_status l2l_layernorm_backward(l2l_tensor *dx, l2l_tensor *dweight, l2l_tensor *dbias,
                                  const l2l_tensor *dy, const l2l_tensor *x,
                                  const l2l_tensor *weight, const l2l_tensor *mean,
                                  const l2l_tensor *rstd) {
  const char *f = __func__;
  TRY(need(f, "dx", dx, L2L_F32));
  if (dweight) TRY(need(f, "dweight", dweight, L2L_F32));
  if (dbias) TRY(need(f, "dbias", dbias, L2L_F32));
  TRY(need(f, "dy", dy, L2L_F32));
  TRY(need(f, "x", x, L2L_F32));
  TRY(need(f, "weight", weight, L2L_F32));
  TRY(need(f, "mean", mean, L2L_F32));
  TRY(need(f, "rstd", rstd, L2L_F32));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"dx", dx}, {"dweight", dweight}, {"dbias", dbias}, {"dy", dy},
                       {"x", x},   {"weight", weight},   {"mean", mean},   {"rstd", rstd}};
  TRY(one_backend(f, &ops, args, 8));
  int64_t rows = tensor_rows(x), cols = tensor_cols(x);
  TRY(core_same_shape(f, "dy", dy, "x", x));
  TRY(core_same_shape(f, "dx", dx, "x", x));
  TRY(numel_is(f, "weight", weight, cols, "one per column of x"));
  if (dweight) TRY(numel_is(f, "dweight", dweight, cols, "one per column of x"));
  if (dbias) TRY(numel_is(f, "dbias", dbias, cols, "one per column of x"));
  TRY(numel_is(f, "mean", mean, rows, "one per row of x"));
  TRY(numel_is(f, "rstd", rstd, rows, "one per row of x"));
  /* dx may be dy (each row reads all of dy before writing dx); nothing else may overlap. */
  TRY(distinct(f, "dx", dx, "dy", dy, true));
  const struct arg outs[] = {{"dx", dx}, {"dweight", dweight}, {"dbias", dbias}};
  const struct arg ins[] = {{"dy", dy}, {"x", x}, {"weight", weight}, {"mean", mean},
                            {"rstd", rstd}};
  for (int o = 0; o < 3; o++) {
    for (int i = o == 0 ? 1 : 0; i < 5; i++)
      TRY(distinct(f, outs[o].name, outs[o].t, ins[i].name, ins[i].t, false));
    for (int p = o + 1; p < 3; p++)
      TRY(distinct(f, outs[o].name, outs[o].t, outs[p].name, outs[p].t, false));
  }
  return ops->layernorm_backward(tensor_ptr(dx), NULL, L2L_F32,
                                 dweight ? tensor_ptr(dweight) : NULL,
                                 dbias ? tensor_ptr(dbias) : NULL, tensor_ptr(dy), NULL,
                                 tensor_ptr(x), tensor_ptr(weight), tensor_ptr(mean),
                                 tensor_ptr(rstd), rows, cols);
}

/* ---------------------------------------------------------------- softmax */

l2l_status l2l_softmax_forward(l2l_tensor *y, const l2l_tensor *x, const l2l_tensor *key_mask,
                               int causal, float scale) {
  const char *f = __func__;
  TRY(need(f, "y", y, L2L_F32));
  TRY(need(f, "x", x, L2L_F32));
  if (key_mask) TRY(need(f, "key_mask", key_mask, L2L_U8));
  if (causal != 0 && causal != 1)
    return core_fail_in(f, L2L_ERR_INVALID, "causal must be 0 or 1, got %d", causal);
  TRY(need_finite(f, "scale", scale));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"y", y}, {"x", x}, {"key_mask", key_mask}};
  TRY(one_backend(f, &ops, args, 3));
  TRY(core_same_shape(f, "y", y, "x", x));
  TRY(distinct(f, "y", y, "x", x, true));
  TRY(distinct(f, "y", y, "key_mask", key_mask, false));
  int64_t tk = tensor_cols(x), tq = x->ndim >= 2 ? x->shape[x->ndim - 2] : 1;
  int64_t samples = 1;
  if (key_mask) {
    if (x->ndim < 3)
      return core_fail_in(f, L2L_ERR_INVALID,
                          "a key_mask needs x as (B, ..., Tq, Tk) with at least 3 dims, x has %d",
                          x->ndim);
    samples = x->shape[0];
    char sm[64];
    if (key_mask->ndim != 2 || key_mask->shape[0] != samples || key_mask->shape[1] != tk)
      return core_fail_in(f, L2L_ERR_INVALID, "key_mask has shape %s, need (%lld,%lld) = (B, Tk)",
                          core_shape_str(sm, 64, key_mask), (long long)samples, (long long)tk);
  }
  return ops->softmax_forward(tensor_ptr(y), tensor_ptr(x),
                              key_mask ? tensor_ptr(key_mask) : NULL, causal, scale, samples,
                              tensor_rows(x) / samples, tq, tk);
}

l2l_status l2l_softmax_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *y,
                                float scale) {
  const char *f = __func__;
  TRY(need(f, "dx", dx, L2L_F32));
  TRY(need(f, "dy", dy, L2L_F32));
  TRY(need(f, "y", y, L2L_F32));
  TRY(need_finite(f, "scale", scale));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"dx", dx}, {"dy", dy}, {"y", y}};
  TRY(one_backend(f, &ops, args, 3));
  TRY(core_same_shape(f, "dy", dy, "y", y));
  TRY(core_same_shape(f, "dx", dx, "y", y));
  TRY(distinct(f, "dx", dx, "dy", dy, true));
  TRY(distinct(f, "dx", dx, "y", y, true));
  return ops->softmax_backward(tensor_ptr(dx), tensor_ptr(dy), tensor_ptr(y), scale,
                               tensor_rows(y), tensor_cols(y));
}

/* ---------------------------------------------------------------- embedding */

static l2l_status ids_in_range(const char *func, const struct backend_ops *ops,
                               const char *name, const l2l_tensor *ids, int32_t hi,
                               bool has_except, int32_t except) {
  int64_t bad = -1;
  int32_t value = 0;
  /* With nothing excepted, pass 0: an in-range value is never reported anyway. */
  TRY(ops->find_out_of_range(&bad, &value, tensor_ptr(ids), ids->numel, 0, hi,
                             has_except ? except : 0));
  if (bad < 0) return L2L_OK;
  char at[128];
  int64_t index[L2L_MAX_DIMS];
  l2l_status status = core_fail_in(func, L2L_ERR_INVALID,
                                   "%s" L2L_NAMED_ELEMENT "%s" L2L_NAMED_END " = %d is outside [0, %d)%s",
                                   name, core_index_str(at, sizeof at, ids, bad), value, hi,
                                   has_except ? " and not the ignore index" : "");
  return error_note_element(status, core_index_of(index, ids, bad), index);
}

/* The checks both embedding ops share: a (V, C) table, rows (N..., C) with one row per id,
   ids within [0, V), and the op's output (the table or the rows) overlapping nothing. */
static l2l_status check_embedding(const char *f, const struct backend_ops **ops,
                                  const char *table_name, const l2l_tensor *table,
                                  const char *rows_name, const l2l_tensor *rows,
                                  const l2l_tensor *ids, bool table_is_output) {
  /* a gathered table may be a 16-bit copy; a gradient table is f32 */
  bool half_table = !table_is_output && tensor_ok(table) &&
                    (table->dtype == L2L_F16 || table->dtype == L2L_BF16);
  if (!half_table) TRY(need(f, table_name, table, L2L_F32));
  TRY(need(f, rows_name, rows, L2L_F32));
  TRY(need(f, "ids", ids, L2L_I32));
  struct arg args[] = {{table_name, table}, {rows_name, rows}, {"ids", ids}};
  TRY(one_backend(f, ops, args, 3));
  char st[64];
  if (table->ndim != 2)
    return core_fail_in(f, L2L_ERR_INVALID, "%s has shape %s, need (V, C)", table_name,
                        core_shape_str(st, 64, table));
  int64_t vocab = table->shape[0], cols = table->shape[1];
  if (vocab > INT32_MAX) return core_fail_in(f, L2L_ERR_INVALID, "vocabulary above 2^31-1");
  TRY(numel_is(f, rows_name, rows, ids->numel * cols, "ids elements times table columns"));
  if (tensor_cols(rows) != cols)
    return core_fail_in(f, L2L_ERR_INVALID, "%s's last dim is %lld, need %lld (table columns)",
                        rows_name, (long long)tensor_cols(rows), (long long)cols);
  const char *out_name = table_is_output ? table_name : rows_name;
  const l2l_tensor *out = table_is_output ? table : rows;
  TRY(distinct(f, out_name, out, "ids", ids, false));
  TRY(distinct(f, table_name, table, rows_name, rows, false));
  return ids_in_range(f, *ops, "ids", ids, (int32_t)vocab, false, 0);
}

l2l_status l2l_embedding_forward(l2l_tensor *out, const l2l_tensor *ids, const l2l_tensor *table) {
  const struct backend_ops *ops = NULL;
  TRY(check_embedding(__func__, &ops, "table", table, "out", out, ids, false));
  return ops->embedding_forward(tensor_ptr(out), tensor_ptr(ids), tensor_ptr(table),
                                table->dtype, ids->numel, table->shape[1]);
}

l2l_status l2l_embedding_backward(l2l_tensor *dtable, const l2l_tensor *dout,
                                  const l2l_tensor *ids) {
  const struct backend_ops *ops = NULL;
  TRY(check_embedding(__func__, &ops, "dtable", dtable, "dout", dout, ids, true));
  return ops->embedding_backward(tensor_ptr(dtable), tensor_ptr(dout),
                                 tensor_ptr(ids), ids->numel, dtable->shape[0],
                                 dtable->shape[1]);
}

/* ---------------------------------------------------------------- cross-entropy */

static l2l_status check_cross_entropy(const char *f, const struct backend_ops **ops,
                                      const char *out_name, const l2l_tensor *out,
                                      int64_t out_numel, const l2l_tensor *logits,
                                      const l2l_tensor *targets, int32_t ignore_index) {
  TRY(need(f, out_name, out, L2L_F32));
  TRY(need(f, "logits", logits, L2L_F32));
  TRY(need(f, "targets", targets, L2L_I32));
  struct arg args[] = {{out_name, out}, {"logits", logits}, {"targets", targets}};
  TRY(one_backend(f, ops, args, 3));
  int64_t rows = tensor_rows(logits), vocab = tensor_cols(logits);
  if (vocab > INT32_MAX) return core_fail_in(f, L2L_ERR_INVALID, "vocabulary above 2^31-1");
  TRY(numel_is(f, "targets", targets, rows, "one per row of logits"));
  TRY(numel_is(f, out_name, out, out_numel < 0 ? rows : out_numel,
               out_numel < 0 ? "one per row of logits" : "the shape of logits"));
  TRY(distinct(f, out_name, out, "logits", logits, false));
  TRY(distinct(f, out_name, out, "targets", targets, false));
  return ids_in_range(f, *ops, "targets", targets, (int32_t)vocab, true, ignore_index);
}

l2l_status l2l_cross_entropy_forward(l2l_tensor *losses, const l2l_tensor *logits,
                                     const l2l_tensor *targets, int32_t ignore_index) {
  const struct backend_ops *ops = NULL;
  TRY(check_cross_entropy(__func__, &ops, "losses", losses, -1, logits, targets, ignore_index));
  return ops->cross_entropy_forward(tensor_ptr(losses), tensor_ptr(logits),
                                    tensor_ptr(targets), ignore_index,
                                    tensor_rows(logits), tensor_cols(logits),
                                    tensor_cols(logits));
}

l2l_status l2l_cross_entropy_backward(l2l_tensor *dlogits, const l2l_tensor *logits,
                                      const l2l_tensor *targets, int32_t ignore_index,
                                      float scale) {
  const struct backend_ops *ops = NULL;
  TRY(need_finite(__func__, "scale", scale));
  TRY(need(__func__, "logits", logits, L2L_F32));
  TRY(check_cross_entropy(__func__, &ops, "dlogits", dlogits, logits->numel, logits, targets,
                          ignore_index));
  if (tensor_cols(dlogits) != tensor_cols(logits))
    return FAIL(L2L_ERR_INVALID, "dlogits' last dim is %lld but logits' is %lld",
                (long long)tensor_cols(dlogits), (long long)tensor_cols(logits));
  return ops->cross_entropy_backward(tensor_ptr(dlogits), tensor_ptr(logits),
                                     tensor_ptr(targets), ignore_index, scale,
                                     tensor_rows(logits), tensor_cols(logits),
                                     tensor_cols(logits));
}

/* ---------------------------------------------------------------- dropout */

static l2l_status check_p(const char *f, float p) {
  if (p >= 0.0f && p < 1.0f) return L2L_OK;
  return core_fail_in(f, L2L_ERR_INVALID, "p must be in [0, 1), got %g", p);
}

l2l_status l2l_dropout_forward(l2l_tensor *y, l2l_tensor *mask, const l2l_tensor *x, float p,
                               uint64_t seed, uint64_t stream, int64_t first) {
  const char *f = __func__;
  TRY(need(f, "y", y, L2L_F32));
  TRY(need(f, "mask", mask, L2L_U8));
  TRY(need(f, "x", x, L2L_F32));
  TRY(check_p(f, p));
  if (first < 0)
    return core_fail_in(f, L2L_ERR_INVALID, "first must be >= 0, got %lld", (long long)first);
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"y", y}, {"mask", mask}, {"x", x}};
  TRY(one_backend(f, &ops, args, 3));
  TRY(core_same_shape(f, "y", y, "x", x));
  TRY(numel_is(f, "mask", mask, (x->numel + 7) / 8, "one bit per element of x"));
  TRY(distinct(f, "y", y, "x", x, true));
  TRY(distinct(f, "mask", mask, "x", x, false));
  TRY(distinct(f, "mask", mask, "y", y, false));
  return ops->dropout_forward(tensor_ptr(y), tensor_ptr(mask), tensor_ptr(x), p, seed,
                              stream, first, x->numel);
}

l2l_status l2l_dropout_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *mask,
                                float p) {
  const char *f = __func__;
  TRY(need(f, "dx", dx, L2L_F32));
  TRY(need(f, "dy", dy, L2L_F32));
  TRY(need(f, "mask", mask, L2L_U8));
  TRY(check_p(f, p));
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"dx", dx}, {"dy", dy}, {"mask", mask}};
  TRY(one_backend(f, &ops, args, 3));
  TRY(core_same_shape(f, "dx", dx, "dy", dy));
  TRY(numel_is(f, "mask", mask, (dy->numel + 7) / 8, "one bit per element of dy"));
  TRY(distinct(f, "dx", dx, "dy", dy, true));
  TRY(distinct(f, "dx", dx, "mask", mask, false));
  return ops->dropout_backward(tensor_ptr(dx), tensor_ptr(dy), tensor_ptr(mask), p,
                               dy->numel);
}

/* ---------------------------------------------------------------- reductions */

static l2l_status reduce(const char *f, double *out, const l2l_tensor *x,
                         enum backend_reduction kind) {
  if (out == NULL) return core_fail_in(f, L2L_ERR_INVALID, "out is NULL");
  TRY(need(f, "x", x, L2L_F32));
  double value = 0.0;
  TRY(backend_for(x->storage->pool)->reduce(&value, kind, tensor_ptr(x), x->numel));
  *out = core_plain_nan(kind == L2L_REDUCE_SUMSQ ? sqrt(value) : value);
  return L2L_OK;
}

l2l_status l2l_sum(double *out, const l2l_tensor *x) {
  return reduce(__func__, out, x, L2L_REDUCE_SUM);
}
l2l_status l2l_max_abs(double *out, const l2l_tensor *x) {
  return reduce(__func__, out, x, L2L_REDUCE_MAX_ABS);
}
l2l_status l2l_norm2(double *out, const l2l_tensor *x) {
  return reduce(__func__, out, x, L2L_REDUCE_SUMSQ);
}

/* ---------------------------------------------------------------- AdamW */

l2l_status l2l_adamw_update(l2l_tensor *param, l2l_tensor *m, l2l_tensor *v,
                            const l2l_tensor *grad, const l2l_adamw_config *config,
                            int64_t step) {
  const char *f = __func__;
  TRY(need(f, "param", param, L2L_F32));
  TRY(need(f, "m", m, L2L_F32));
  TRY(need(f, "v", v, L2L_F32));
  TRY(need(f, "grad", grad, L2L_F32));
  if (config == NULL) return core_fail_in(f, L2L_ERR_INVALID, "config is NULL");
  const l2l_adamw_config *c = config;
  if (!(c->lr >= 0) || !isfinite(c->lr) || !(c->beta1 >= 0 && c->beta1 < 1) ||
      !(c->beta2 >= 0 && c->beta2 < 1) || !(c->eps > 0) || !isfinite(c->eps) ||
      !(c->weight_decay >= 0) || !isfinite(c->weight_decay))
    return core_fail_in(f, L2L_ERR_INVALID,
                        "need lr >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0; got lr "
                        "= %g, beta1 = %g, beta2 = %g, eps = %g, weight_decay = %g",
                        c->lr, c->beta1, c->beta2, c->eps, c->weight_decay);
  if (step < 1)
    return core_fail_in(f, L2L_ERR_INVALID, "step must be >= 1, got %lld", (long long)step);
  const struct backend_ops *ops = NULL;
  struct arg args[] = {{"param", param}, {"m", m}, {"v", v}, {"grad", grad}};
  TRY(one_backend(f, &ops, args, 4));
  TRY(numel_is(f, "m", m, param->numel, "one per parameter"));
  TRY(numel_is(f, "v", v, param->numel, "one per parameter"));
  TRY(numel_is(f, "grad", grad, param->numel, "one per parameter"));
  /* Element-wise over four arrays: each has the parameter's shape too (a transposed or
     flattened state array of the same size would pair its elements with other
     parameters' without a word). */
  TRY(core_same_shape(f, "m", m, "param", param));
  TRY(core_same_shape(f, "v", v, "param", param));
  TRY(core_same_shape(f, "grad", grad, "param", param));
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++)
      TRY(distinct(f, args[i].name, args[i].t, args[j].name, args[j].t, false));
  float bc1 = (float)(1.0 - pow(c->beta1, (double)step));
  float bc2 = (float)(1.0 - pow(c->beta2, (double)step));
  if (!(bc1 > 0.0f) || !(bc2 > 0.0f))  /* beta within float rounding of 1 */
    return core_fail_in(f, L2L_ERR_INVALID, "bias correction 1 - beta^%lld rounds to 0 in f32",
                        (long long)step);
  return ops->adamw(tensor_ptr(param), tensor_ptr(m), tensor_ptr(v),
                    tensor_ptr(grad), param->numel, c, bc1, bc2);
}
