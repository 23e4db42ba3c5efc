/* SPDX-License-Identifier: MIT */
/* profile_ops.c — the profile's ops table: every entry of the device pool's table, timed.
 *
 * Purpose: while a profile runs (profile.c), backend_for hands out this table for the
 * device pool. Each entry opens a probe (a stamp on the calling thread's stream), calls
 * the device's own entry, and closes the probe with what the call cost by its arguments:
 * FLOPs (GEMMs and attention; 0 for ops the memory bounds), bytes moved (each operand
 * read or written once, as a fused kernel at its roofline would), the rate it is held to,
 * whether it handed a result to the host (a sync: the ops that return a value, a float
 * to i32 conversion's check, and a transfer on the step's thread; what cuda_ops.c waits
 * for), and its shape. The counts are the arguments', so a CPU run gives a GPU run's.
 * Must never: change what an op does or returns.
 */
#include "accelerators.h"

static const struct backend_ops *base(void) { return backend_device_base(); }

enum { F = sizeof(float) };

/* Calls the device's entry `call` inside a probe; the cost arguments follow. */
#define PROFILED(call, op, flops, bytes, bound, sync, ...)                             \
  struct profile_probe probe_;                                                     \
  profile_open(&probe_);                                                           \
  l2l_status status_ = base()->call;                                                   \
  if (probe_.on && status_ == L2L_OK)                                                  \
    profile_close(&probe_, op, flops, bytes, bound, sync, __VA_ARGS__);            \
  else if (probe_.on) /* (a failed call's start stamp, a device event, given back) */ \
    device_stamp_release(&probe_.start);                                           \
  return status_

static double d(int64_t n) { return (double)n; }
static enum profile_bound flop_bound(l2l_dtype t) {
  return t == L2L_F32 ? L2L_BOUND_FLOP32 : L2L_BOUND_FLOP16;
}
static const char *dt(l2l_dtype t) { return l2l_dtype_name(t) ? l2l_dtype_name(t) : "?"; }

static l2l_status p_gemm_batched(float *c, const void *a, const void *b, l2l_dtype ab_dtype,
                                 int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                                 int trans_b, float alpha, float beta, int64_t lda, int64_t ldb,
                                 int64_t ldc) {
  double ab = (d(m) * d(k) + d(k) * d(n)) * (double)l2l_dtype_size(ab_dtype);
  double cc = d(m) * d(n) * F * (beta != 0 ? 2 : 1);
  /* rows padded past the packed stride: said in the shape, so a before and after differ */
  bool padded = (lda != 0 && lda != (trans_a ? m : k)) || (ldb != 0 && ldb != (trans_b ? k : n)) ||
                (ldc != 0 && ldc != n);
  PROFILED(gemm_batched(c, a, b, ab_dtype, batch, m, n, k, trans_a, trans_b, alpha, beta, lda,
                        ldb, ldc),
           "gemm", 2 * d(batch) * d(m) * d(n) * d(k), d(batch) * (ab + cc), flop_bound(ab_dtype),
           false, "m=%lld n=%lld k=%lld %c%c%s %s%s%s", (long long)m, (long long)n, (long long)k,
           trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', beta != 0 ? " +c" : "", dt(ab_dtype),
           batch > 1 ? " batched" : "", padded ? " padded" : "");
}

/* A GEMM whose bias add (and rounding) ride in its epilogue where the backend can: its
   output written once, 16-bit where c16 is given; " epilogue" in the shape when cuBLASLt's
   count of its runs moved across it. */
static l2l_status p_gemm_bias(float *c, void *c16, l2l_dtype c16_dtype, const void *a,
                              const void *b, l2l_dtype ab_dtype, const float *bias, int64_t m,
                              int64_t n, int64_t k, int trans_a, int trans_b) {
  double out = c16 != NULL ? (double)l2l_dtype_size(c16_dtype) : F;
  double ab = (d(m) * d(k) + d(k) * d(n)) * (double)l2l_dtype_size(ab_dtype);
  int64_t runs_before = cublaslt_runs();
  PROFILED(gemm_bias(c, c16, c16_dtype, a, b, ab_dtype, bias, m, n, k, trans_a, trans_b),
           "gemm", 2 * d(m) * d(n) * d(k), ab + out * d(m) * d(n) + (bias ? F * d(n) : 0),
           flop_bound(ab_dtype), false, "m=%lld n=%lld k=%lld %c%c %s%s%s%s%s", (long long)m,
           (long long)n, (long long)k, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', dt(ab_dtype),
           bias ? " +bias" : "", c16 ? " to " : "", c16 ? dt(c16_dtype) : "",
           cublaslt_runs() != runs_before ? " epilogue" : "");
}

static l2l_status p_bias_add(float *y, void *y16, l2l_dtype y16_dtype, const float *bias,
                             int64_t rows, int64_t cols) {
  double out = y16 != NULL ? (double)l2l_dtype_size(y16_dtype) : F;
  PROFILED(bias_add(y, y16, y16_dtype, bias, rows, cols), "bias_add", 0,
           (F + out) * d(rows) * d(cols) + F * d(cols), L2L_BOUND_MEM, false,
           "rows=%lld cols=%lld%s%s", (long long)rows, (long long)cols, y16 ? " to " : "",
           y16 ? dt(y16_dtype) : "");
}

static l2l_status p_bias_backward(float *dbias, const void *dy, l2l_dtype dy_dtype, int64_t rows,
                                  int64_t cols) {
  PROFILED(bias_backward(dbias, dy, dy_dtype, rows, cols), "bias_backward", 0,
           (double)l2l_dtype_size(dy_dtype) * d(rows) * d(cols) + 2 * F * d(cols), L2L_BOUND_MEM,
           false, "rows=%lld cols=%lld%s%s", (long long)rows, (long long)cols,
           dy_dtype != L2L_F32 ? " " : "", dy_dtype != L2L_F32 ? dt(dy_dtype) : "");
}

static l2l_status p_add(float *out, const float *a, const float *b, int64_t n) {
  PROFILED(add(out, a, b, n), "add", 0, 3 * F * d(n), L2L_BOUND_MEM, false, "n=%lld",
           (long long)n);
}

static l2l_status p_gelu_forward(float *y, const float *x, int64_t n) {
  PROFILED(gelu_forward(y, x, n), "gelu_forward", 0, 2 * F * d(n), L2L_BOUND_MEM, false,
           "n=%lld", (long long)n);
}

static l2l_status p_gelu_backward(float *dx, void *dx16, l2l_dtype dx16_dtype, const float *dy,
                                  const float *x, int64_t n) {
  PROFILED(gelu_backward(dx, dx16, dx16_dtype, dy, x, n), "gelu_backward", 0,
           (2 + (dx != NULL)) * F * d(n) + (dx16 ? 2 * d(n) : 0), L2L_BOUND_MEM, false,
           "n=%lld%s", (long long)n, dx ? "" : " to 16 bits");
}

/* A LayerNorm's per-row statistics, where they are read or written. */
static double row_stats(const void *mean, const void *rstd, int64_t rows) {
  return F * d(rows) * ((mean != NULL) + (rstd != NULL));
}

/* The bytes of a y written in f32 and of its 16-bit copy, each when not NULL. */
static double outputs(const void *y, const void *y16, double n) {
  return (y != NULL ? F * n : 0) + (y16 != NULL ? 2 * n : 0);
}

static l2l_status p_layernorm_forward(float *y, void *y16, l2l_dtype y16_dtype, float *mean,
                                      float *rstd, const float *x, const float *weight,
                                      const float *bias, float eps, int64_t rows, int64_t cols) {
  double n = d(rows) * d(cols);
  PROFILED(layernorm_forward(y, y16, y16_dtype, mean, rstd, x, weight, bias, eps, rows, cols),
           "layernorm_forward", 0, F * (n + 2 * d(cols)) + outputs(y, y16, n) +
           row_stats(mean, rstd, rows), L2L_BOUND_MEM, false, "rows=%lld cols=%lld",
           (long long)rows, (long long)cols);
}

/* dy, x (or y) and the residual read, dx (and its 16-bit copy) written; the weight read,
   its two gradients read and added to. */
static double layernorm_backward_bytes(int64_t rows, int64_t cols, const void *residual,
                                       const void *dx16, l2l_dtype dx16_dtype) {
  double n = d(rows) * d(cols);
  return F * (n * (residual != NULL ? 4 : 3) + 5 * d(cols)) +
         (dx16 != NULL ? (double)l2l_dtype_size(dx16_dtype) * n : 0);
}

#define LAYERNORM_BACKWARD_SHAPE(rows, cols, residual, dx16, dx16_dtype)                    \
  "rows=%lld cols=%lld%s%s%s", (long long)(rows), (long long)(cols),                      \
      (residual) ? " +residual" : "", (dx16) ? " and " : "", (dx16) ? dt(dx16_dtype) : ""

static l2l_status p_layernorm_backward(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                       float *dweight, float *dbias, const float *dy,
                                       const float *residual, const float *x,
                                       const float *weight, const float *mean,
                                       const float *rstd, int64_t rows, int64_t cols) {
  PROFILED(layernorm_backward(dx, dx16, dx16_dtype, dweight, dbias, dy, residual, x, weight,
                              mean, rstd, rows, cols),
           "layernorm_backward", 0,
           layernorm_backward_bytes(rows, cols, residual, dx16, dx16_dtype) +
           row_stats(mean, rstd, rows), L2L_BOUND_MEM, false,
           LAYERNORM_BACKWARD_SHAPE(rows, cols, residual, dx16, dx16_dtype));
}

static l2l_status p_softmax_forward(float *y, const float *x, const uint8_t *key_mask,
                                    int causal, float scale, int64_t samples,
                                    int64_t rows_per_sample, int64_t tq, int64_t tk) {
  double n = d(samples) * d(rows_per_sample) * d(tk);
  PROFILED(softmax_forward(y, x, key_mask, causal, scale, samples, rows_per_sample, tq, tk),
           "softmax_forward", 0, 2 * F * n + (key_mask ? d(samples) * d(tk) : 0), L2L_BOUND_MEM,
           false, "rows=%lld cols=%lld%s", (long long)(samples * rows_per_sample), (long long)tk,
           causal ? " causal" : "");
}

static l2l_status p_softmax_backward(float *dx, const float *dy, const float *y, float scale,
                                     int64_t rows, int64_t cols) {
  PROFILED(softmax_backward(dx, dy, y, scale, rows, cols), "softmax_backward", 0,
           3 * F * d(rows) * d(cols), L2L_BOUND_MEM, false, "rows=%lld cols=%lld",
           (long long)rows, (long long)cols);
}

static l2l_status p_embedding_forward(float *out, const int32_t *ids, const void *table,
                                      l2l_dtype table_dtype, int64_t n, int64_t cols) {
  PROFILED(embedding_forward(out, ids, table, table_dtype, n, cols), "embedding_forward", 0,
           d(n) * d(cols) * (F + (double)l2l_dtype_size(table_dtype)) + 4 * d(n), L2L_BOUND_MEM,
           false, "n=%lld cols=%lld %s", (long long)n, (long long)cols, dt(table_dtype));
}

static l2l_status p_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                       int64_t n, int64_t vocab, int64_t cols) {
  PROFILED(embedding_backward(dtable, dout, ids, n, vocab, cols), "embedding_backward", 0,
           3 * F * d(n) * d(cols) + 4 * d(n), L2L_BOUND_MEM, false, "n=%lld vocab=%lld cols=%lld",
           (long long)n, (long long)vocab, (long long)cols);
}

static l2l_status p_cross_entropy_forward(float *losses, const float *logits,
                                          const int32_t *targets, int32_t ignore_index,
                                          int64_t rows, int64_t vocab, int64_t ld) {
  PROFILED(cross_entropy_forward(losses, logits, targets, ignore_index, rows, vocab, ld),
           "cross_entropy_forward", 0, F * d(rows) * d(vocab) + 8 * d(rows), L2L_BOUND_MEM,
           false, "rows=%lld vocab=%lld", (long long)rows, (long long)vocab);
}

static l2l_status p_cross_entropy_backward(float *dlogits, const float *logits,
                                           const int32_t *targets, int32_t ignore_index,
                                           float scale, int64_t rows, int64_t vocab, int64_t ld) {
  PROFILED(cross_entropy_backward(dlogits, logits, targets, ignore_index, scale, rows, vocab, ld),
           "cross_entropy_backward", 0, 2 * F * d(rows) * d(vocab) + 4 * d(rows), L2L_BOUND_MEM,
           false, "rows=%lld vocab=%lld", (long long)rows, (long long)vocab);
}

static l2l_status p_dropout_forward(float *y, uint8_t *mask, const float *x, float p,
                                    uint64_t seed, uint64_t stream, int64_t first, int64_t n) {
  PROFILED(dropout_forward(y, mask, x, p, seed, stream, first, n), "dropout_forward", 0,
           2 * F * d(n) + (mask ? d(n) / 8 : 0), L2L_BOUND_MEM, false, "n=%lld", (long long)n);
}

static l2l_status p_dropout_backward(float *dx, const float *dy, const uint8_t *mask, float p,
                                     int64_t n) {
  PROFILED(dropout_backward(dx, dy, mask, p, n), "dropout_backward", 0, 2 * F * d(n) + d(n) / 8,
           L2L_BOUND_MEM, false, "n=%lld", (long long)n);
}

static l2l_status p_gelu_forward_bits(float *y, uint8_t *bits, const float *x, int64_t n) {
  PROFILED(gelu_forward_bits(y, bits, x, n), "gelu_forward_bits", 0, 2 * F * d(n) + d(n) / 8,
           L2L_BOUND_MEM, false, "n=%lld", (long long)n);
}

static l2l_status p_gelu_backward_from_output(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                              const float *dy, const float *y,
                                              const uint8_t *bits, int64_t n) {
  PROFILED(gelu_backward_from_output(dx, dx16, dx16_dtype, dy, y, bits, n),
           "gelu_backward_from_output", 0,
           (2 + (dx != NULL)) * F * d(n) + d(n) / 8 + (dx16 ? 2 * d(n) : 0), L2L_BOUND_MEM, false,
           "n=%lld%s", (long long)n, dx ? "" : " to 16 bits");
}

static l2l_status p_bias_gelu_forward(float *pre, float *y, void *y16, l2l_dtype y16_dtype,
                                      uint8_t *bits, const float *bias, int64_t rows,
                                      int64_t cols) {
  double n = d(rows) * d(cols);
  /* pre read, written back with a bias; y written unless it is that write */
  double pre_bytes = F * n * (bias ? 2 : 1) + (bias ? F * d(cols) : 0);
  PROFILED(bias_gelu_forward(pre, y, y16, y16_dtype, bits, bias, rows, cols),
           "bias_gelu_forward", 0,
           pre_bytes + outputs(y == pre && bias ? NULL : y, y16, n) + (bits ? n / 8 : 0),
           L2L_BOUND_MEM, false, "rows=%lld cols=%lld", (long long)rows, (long long)cols);
}

static l2l_status p_add_layernorm_forward(float *sum, float *y, void *y16, l2l_dtype y16_dtype,
                                          float *mean, float *rstd, const float *a,
                                          const float *b, const float *weight,
                                          const float *bias, float eps, int64_t rows,
                                          int64_t cols) {
  double n = d(rows) * d(cols);
  PROFILED(add_layernorm_forward(sum, y, y16, y16_dtype, mean, rstd, a, b, weight, bias, eps,
                                 rows, cols),
           "add_layernorm_forward", 0, F * (3 * n + 2 * d(cols)) + outputs(y, y16, n) +
           row_stats(mean, rstd, rows), L2L_BOUND_MEM, false, "rows=%lld cols=%lld",
           (long long)rows, (long long)cols);
}

static l2l_status p_cross_entropy_fused(float *losses, float *dlogits, void *dlogits16,
                                        l2l_dtype dlogits16_dtype, const float *logits,
                                        const int32_t *targets, int32_t ignore_index,
                                        float scale, int64_t rows, int64_t vocab, int64_t ld) {
  double n = d(rows) * d(vocab);
  PROFILED(cross_entropy_fused(losses, dlogits, dlogits16, dlogits16_dtype, logits, targets,
                               ignore_index, scale, rows, vocab, ld),
           "cross_entropy_fused", 0, F * n + outputs(dlogits, dlogits16, n) +
           (losses ? 8 : 4) * d(rows), L2L_BOUND_MEM, false, "rows=%lld vocab=%lld",
           (long long)rows, (long long)vocab);
}

static l2l_status p_layernorm_backward_from_output(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                                   float *dweight, float *dbias,
                                                   const float *dy, const float *residual,
                                                   const float *y, const float *weight,
                                                   const float *bias, const float *rstd,
                                                   int64_t rows, int64_t cols) {
  PROFILED(layernorm_backward_from_output(dx, dx16, dx16_dtype, dweight, dbias, dy, residual, y,
                                          weight, bias, rstd, rows, cols),
           "layernorm_backward_from_output", 0,
           layernorm_backward_bytes(rows, cols, residual, dx16, dx16_dtype) +
           F * (d(cols) + d(rows)), L2L_BOUND_MEM, false,
           LAYERNORM_BACKWARD_SHAPE(rows, cols, residual, dx16, dx16_dtype));
}

/* ---------------------------------------------------------------- attention */

/* The (query, key) products a call computes: all of them, or with a causal mask the
   S (S + 1) / 2 at or below the diagonal (what a kernel that skips masked tiles does at
   its best). */
static double attention_pairs(const struct backend_attention_shape *s) {
  double seq = d(s->seq);
  return d(s->batch) * d(s->heads) * (s->causal ? seq * (seq + 1) / 2 : seq * seq);
}

/* q, k, v, o and more in their strided rows: batch * seq rows of heads * head_dim
   elements; the backward's do and dq, dk, dv beside q, k, v and o (each of its dtype). */
static double attention_rows_bytes(const struct backend_attention_shape *s, int backward) {
  double o = s->o_dtype == L2L_F32 ? 1.0 : 0.5, qkv = s->qkv_dtype == L2L_F32 ? 3.0 : 1.5;
  double grads = !backward ? 0 : (s->do_dtype == L2L_F32 ? 1.0 : 0.5) +
                                 (s->dqkv_dtype == L2L_F32 ? 3.0 : 1.5);
  return (grads + qkv + o) * F * d(s->batch) * d(s->seq) * d(s->heads) * d(s->head_dim);
}

static enum profile_bound attention_bound(const struct backend_attention_shape *s) {
  return flop_bound(s->precision);
}

/* Which path ran an attention call: " cudnn" when cuDNN's count of calls it ran moved
   across it (the CUDA backend handed it to cuDNN), " flash" when the own flash kernels'
   count did (16-bit products on tensor cores), else "" (the fp32 kernels, or the CPU). */
static const char *attention_path(int64_t cudnn_runs_before, int64_t flash_runs_before) {
  if (cudnn_runs() != cudnn_runs_before) return " cudnn";
  return flash_attention_runs() != flash_runs_before ? " flash" : "";
}

#define ATTENTION_SHAPE(s, kept, path)                                                    \
  "B=%lld H=%lld S=%lld d=%lld%s%s %s%s%s", (long long)(s)->batch, (long long)(s)->heads, \
      (long long)(s)->seq, (long long)(s)->head_dim, (s)->causal ? " causal" : "",        \
      (s)->dropout > 0 ? " dropout" : "", dt((s)->precision), (kept) ? " probs" : "", (path)

/* Forward: S = q k^T and o = P v, 2 d FLOPs a pair each; probabilities kept, when asked,
   are S x S floats written (P, and P after dropout) and a bit a pair of mask. */
static l2l_status p_attention_forward(void *o, float *lse, float *probs, float *dropped,
                                      uint8_t *mask, const void *q, const void *k,
                                      const void *v, const uint8_t *key_mask,
                                      const struct backend_attention_shape *shape, float *workspace,
                                      int64_t workspace_floats) {
  double pairs = attention_pairs(shape), seq2 = d(shape->batch) * d(shape->heads) *
                                                d(shape->seq) * d(shape->seq);
  double kept = F * seq2 * ((probs != NULL) + (dropped != NULL)) + (mask ? seq2 / 8 : 0);
  int64_t runs_before = cudnn_runs(), flash_before = flash_attention_runs();
  PROFILED(attention_forward(o, lse, probs, dropped, mask, q, k, v, key_mask, shape, workspace,
                             workspace_floats),
           "attention_forward", 4 * d(shape->head_dim) * pairs,
           attention_rows_bytes(shape, 0) + F * d(shape->batch) * d(shape->heads) * d(shape->seq) +
           kept, attention_bound(shape), false,
           ATTENTION_SHAPE(shape, probs != NULL, attention_path(runs_before, flash_before)));
}

/* Backward: dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, and S = q k^T again when the
   forward kept no probabilities (frugal): 2 d FLOPs a pair each. */
static l2l_status p_attention_backward(void *dq, void *dk, void *dv, const void *d_o,
                                       const void *o, const float *lse, const float *probs,
                                       const float *dropped, const uint8_t *mask, const void *q,
                                       const void *k, const void *v, const uint8_t *key_mask,
                                       const struct backend_attention_shape *shape, float *workspace,
                                       int64_t workspace_floats) {
  double products = probs != NULL ? 4 : 5, seq2 = d(shape->batch) * d(shape->heads) *
                                                  d(shape->seq) * d(shape->seq);
  double kept = F * seq2 * ((probs != NULL) + (dropped != NULL)) + (mask ? seq2 / 8 : 0);
  int64_t runs_before = cudnn_runs(), flash_before = flash_attention_runs();
  PROFILED(attention_backward(dq, dk, dv, d_o, o, lse, probs, dropped, mask, q, k, v, key_mask,
                              shape, workspace, workspace_floats),
           "attention_backward", 2 * products * d(shape->head_dim) * attention_pairs(shape),
           attention_rows_bytes(shape, 1) + F * d(shape->batch) * d(shape->heads) * d(shape->seq) +
           kept, attention_bound(shape), false,
           ATTENTION_SHAPE(shape, probs != NULL, attention_path(runs_before, flash_before)));
}

static int64_t p_attention_workspace(const struct backend_attention_shape *shape, int backward) {
  return base()->attention_workspace(shape, backward);
}

/* ---------------------------------------------------------------- whole-tensor and host results */

static l2l_status p_reduce(double *out, enum backend_reduction kind, const float *x, int64_t n) {
  static const char *const names[] = {"sum", "max_abs", "sumsq"};
  PROFILED(reduce(out, kind, x, n), "reduce", 0, F * d(n), L2L_BOUND_MEM, true, "n=%lld %s",
           (long long)n, (unsigned)kind < 3 ? names[kind] : "?");
}

static l2l_status p_adamw(float *param, float *m, float *v, const float *grad, int64_t n,
                          const l2l_adamw_config *config, float bias_correction1,
                          float bias_correction2) {
  PROFILED(adamw(param, m, v, grad, n, config, bias_correction1, bias_correction2), "adamw", 0,
           7 * F * d(n), L2L_BOUND_MEM, false, "n=%lld", (long long)n);
}

/* A record's update on the device: the master (in its dtype) and each state array (in its
   precision) read and written (LAMB reads them once more in its second wave), the gradient
   read and cleared. */
static l2l_status p_optim_update(void *p, void *s0, void *s1, float *grad, int64_t n,
                                 const struct optim_hyper *h, const int32_t *skip) {
  double arrays = (s0 != NULL) + (s1 != NULL), lamb = h->kind == L2L_OPTIMIZER_LAMB;
  double state = (double)host_state_bytes(h->state, n), master = (double)l2l_dtype_size(h->master);
  PROFILED(optim_update(p, s0, s1, grad, n, h, skip), "optim_update", 0,
           d(n) * (2 * F + master * (2 + lamb)) + arrays * state * (2 + lamb), L2L_BOUND_MEM,
           false, "n=%lld kind=%d state=%d master=%s", (long long)n, (int)h->kind,
           (int)h->state, dt(h->master));
}

static l2l_status p_grad_add(float *acc, const void *g, l2l_dtype dtype, float scale,
                             const float *scale_at, int64_t n, int32_t *flag) {
  PROFILED(grad_add(acc, g, dtype, scale, scale_at, n, flag), "grad_add", 0,
           d(n) * (2 * F + (double)l2l_dtype_size(dtype)), L2L_BOUND_MEM, false, "n=%lld %s",
           (long long)n, dt(dtype));
}

/* Per-layer clipping's factor: each gradient read once. */
static l2l_status p_clip_scale(float *scale, const void *const *g, const l2l_dtype *dtype,
                               const int64_t *n, int count, float clip) {
  double bytes = 0, elements = 0;
  for (int i = 0; i < count; i++)
    bytes += d(n[i]) * (double)l2l_dtype_size(dtype[i]), elements += d(n[i]);
  PROFILED(clip_scale(scale, g, dtype, n, count, clip), "clip_scale", 0, bytes, L2L_BOUND_MEM,
           false, "gradients=%d n=%.0f", count, elements);
}

static l2l_status p_grad_norm(double *out, const float *g, int64_t n) {
  PROFILED(grad_norm(out, g, n), "grad_norm", 0, d(n) * F, L2L_BOUND_MEM, false,
           "n=%lld", (long long)n);
}

static l2l_status p_find_out_of_range(int64_t *index, int32_t *value, const int32_t *values,
                                      int64_t n, int32_t lo, int32_t hi, int32_t except) {
  PROFILED(find_out_of_range(index, value, values, n, lo, hi, except), "find_out_of_range", 0,
           4 * d(n), L2L_BOUND_MEM, true, "n=%lld", (long long)n);
}

static l2l_status p_layernorm_invertible(bool *invertible, const float *weight,
                                         const float *bias, int64_t n) {
  PROFILED(layernorm_invertible(invertible, weight, bias, n), "layernorm_invertible", 0,
           2 * F * d(n), L2L_BOUND_MEM, true, "n=%lld", (long long)n);
}

static l2l_status p_fill(void *dst, l2l_dtype dtype, double value, int64_t n) {
  PROFILED(fill(dst, dtype, value, n), "fill", 0, d(n) * (double)l2l_dtype_size(dtype),
           L2L_BOUND_MEM, false, "n=%lld %s", (long long)n, dt(dtype));
}

/* A float-to-i32 conversion checks every value on the device first and reads the answer
   back: a sync. */
static l2l_status p_convert(void *dst, l2l_dtype dst_dtype, const void *src, l2l_dtype src_dtype,
                            int64_t n, int64_t *bad) {
  bool checked = dst_dtype == L2L_I32 && src_dtype != L2L_I32;
  PROFILED(convert(dst, dst_dtype, src, src_dtype, n, bad), "convert", 0,
           d(n) * (double)(l2l_dtype_size(dst_dtype) + l2l_dtype_size(src_dtype)), L2L_BOUND_MEM,
           checked, "n=%lld %s->%s", (long long)n, dt(src_dtype), dt(dst_dtype));
}

static l2l_status p_convert_many(void *const *dst, l2l_dtype dst_dtype, const void *const *src,
                                 l2l_dtype src_dtype, const int64_t *n, int count) {
  double elements = 0;
  for (int i = 0; i < count; i++) elements += d(n[i]);
  PROFILED(convert_many(dst, dst_dtype, src, src_dtype, n, count), "convert_many", 0,
           elements * (double)(l2l_dtype_size(dst_dtype) + l2l_dtype_size(src_dtype)),
           L2L_BOUND_MEM, false, "tensors=%d n=%.0f %s->%s", count, elements, dt(src_dtype),
           dt(dst_dtype));
}

static l2l_status p_random(void *dst, l2l_dtype dtype, int64_t n, enum backend_distribution dist,
                           uint64_t seed, uint64_t stream, int64_t first, double a, double b) {
  PROFILED(random(dst, dtype, n, dist, seed, stream, first, a, b), "random", 0,
           d(n) * (double)l2l_dtype_size(dtype), L2L_BOUND_MEM, false, "n=%lld %s %s",
           (long long)n, dt(dtype), dist == L2L_NORMAL ? "normal" : "uniform");
}

/* A copy's bytes and bound: within the device, read and written, held to the copy rate;
   a transfer, its bytes, held to the link's rate. */
static double copy_bytes(bool within, uint64_t bytes) { return (double)bytes * (within ? 2 : 1); }

/* A copy's shape: its way and its size in KiB. */
#define COPY_SHAPE(within, dst_pool, bytes)                                                \
  "%s %.1f KiB", (within) ? "d2d" : (dst_pool) == L2L_POOL_DEVICE ? "h2d" : "d2h",          \
      (double)(bytes) / 1024

/* A transfer on the step's thread makes the host wait for it (a sync); on a copy lane it
   is the lane's own. */
static l2l_status p_copy(void *dst, l2l_pool_kind dst_pool, const void *src,
                         l2l_pool_kind src_pool, uint64_t bytes) {
  bool within = dst_pool == L2L_POOL_DEVICE && src_pool == L2L_POOL_DEVICE;
  bool on_step = profile_on_step_thread();
  PROFILED(copy(dst, dst_pool, src, src_pool, bytes), "copy", 0, copy_bytes(within, bytes),
           within ? L2L_BOUND_MEM : L2L_BOUND_LINK, !within && on_step,
           COPY_SHAPE(within, dst_pool, bytes));
}

/* Queued: the host never waits for it. */
static l2l_status p_copy_queued(void *dst, l2l_pool_kind dst_pool, const void *src,
                                l2l_pool_kind src_pool, uint64_t bytes) {
  bool within = dst_pool == L2L_POOL_DEVICE && src_pool == L2L_POOL_DEVICE;
  PROFILED(copy_queued(dst, dst_pool, src, src_pool, bytes), "copy_queued", 0,
           copy_bytes(within, bytes), within ? L2L_BOUND_MEM : L2L_BOUND_LINK, false,
           COPY_SHAPE(within, dst_pool, bytes));
}

static int64_t p_launches(void) { return base()->launches ? base()->launches() : -1; }

const struct backend_ops profile_ops = {
    .name = "profile",
    .gemm_batched = p_gemm_batched,
    .gemm_bias = p_gemm_bias,
    .bias_add = p_bias_add,
    .bias_backward = p_bias_backward,
    .add = p_add,
    .gelu_forward = p_gelu_forward,
    .gelu_backward = p_gelu_backward,
    .layernorm_forward = p_layernorm_forward,
    .layernorm_backward = p_layernorm_backward,
    .softmax_forward = p_softmax_forward,
    .softmax_backward = p_softmax_backward,
    .embedding_forward = p_embedding_forward,
    .embedding_backward = p_embedding_backward,
    .cross_entropy_forward = p_cross_entropy_forward,
    .cross_entropy_backward = p_cross_entropy_backward,
    .dropout_forward = p_dropout_forward,
    .dropout_backward = p_dropout_backward,
    .gelu_forward_bits = p_gelu_forward_bits,
    .gelu_backward_from_output = p_gelu_backward_from_output,
    .bias_gelu_forward = p_bias_gelu_forward,
    .add_layernorm_forward = p_add_layernorm_forward,
    .cross_entropy_fused = p_cross_entropy_fused,
    .layernorm_backward_from_output = p_layernorm_backward_from_output,
    .attention_forward = p_attention_forward,
    .attention_backward = p_attention_backward,
    .attention_workspace = p_attention_workspace,
    .reduce = p_reduce,
    .adamw = p_adamw,
    .optim_update = p_optim_update,
    .grad_add = p_grad_add,
    .clip_scale = p_clip_scale,
    .grad_norm = p_grad_norm,
    .find_out_of_range = p_find_out_of_range,
    .layernorm_invertible = p_layernorm_invertible,
    .fill = p_fill,
    .convert = p_convert,
    .convert_many = p_convert_many,
    .random = p_random,
    .copy = p_copy,
    .copy_queued = p_copy_queued,
    .launches = p_launches,
};
