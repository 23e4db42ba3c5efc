/* SPDX-License-Identifier: MIT */
/* cpu.h — what the CPU backend's files share (private to backend/cpu/).
 *
 * Purpose: the entries of cpu_backend that live outside cpu/cpu_ops.c (where the table
 * is), and the rule for how many threads a loop gets.
 * Must never: be included outside backend/cpu/ (the rest of l2l sees cpu_backend
 * through backend.h).
 */
#ifndef L2L_BACKEND_CPU_H
#define L2L_BACKEND_CPU_H

#include "backend/backend.h"

/* Threads for a loop of `work` simple operations: one below ~32k, where waking a team
   costs more than it saves. */
static inline int threads_for(int64_t work) {
  return work < 32768 ? 1 : atomic_load_explicit(&cpu_compute_threads, memory_order_relaxed);
}

/* dst (n) of dtype f16 or bf16 := src (n) rounded to nearest even: cpu_convert's f32 to
   16-bit path, and the ops that hand a GEMM its 16-bit input in the pass that makes it. */
static inline void cpu_round_16(uint16_t *dst, l2l_dtype dtype, const float *src, int64_t n) {
  if (dtype == L2L_BF16)
    for (int64_t i = 0; i < n; i++) dst[i] = half_from_f32_bf16(src[i]);
  else
    for (int64_t i = 0; i < n; i++) dst[i] = half_from_f32_f16(src[i]);
}

/* wide (rows, cols, packed) := a stored (rows, cols) f16 or bf16 matrix whose rows are ld
   apart, widened (exactly): a GEMM's 16-bit inputs, attention's 16-bit q, k, v and o. */
static inline void cpu_widen_16(float *wide, const uint16_t *m, l2l_dtype dtype, int64_t rows,
                                int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++)
      wide[r * cols + j] = dtype == L2L_F16 ? half_f16_to_f32(m[r * ld + j])
                                            : half_bf16_to_f32(m[r * ld + j]);
}

/* ---------------------------------------------------------------- the ops layers run (layer_ops.c) */

l2l_status cpu_gemm_batched(float *c, const void *a, const void *b, l2l_dtype ab_dtype,
                            int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                            int trans_b, float alpha, float beta, int64_t lda, int64_t ldb,
                            int64_t ldc);
l2l_status cpu_bias_add(float *y, void *y16, l2l_dtype y16_dtype, const float *bias,
                        int64_t rows, int64_t cols);
l2l_status cpu_bias_backward(float *dbias, const void *dy, l2l_dtype dy_dtype, int64_t rows,
                             int64_t cols);
l2l_status cpu_add(float *out, const float *a, const float *b, int64_t n);
l2l_status cpu_gelu_forward(float *y, const float *x, int64_t n);
l2l_status cpu_gelu_backward(float *dx, void *dx16, l2l_dtype dx16_dtype, const float *dy,
                             const float *x, int64_t n);
l2l_status cpu_layernorm_forward(float *y, void *y16, l2l_dtype y16_dtype, float *mean_out,
                                 float *rstd_out, const float *x, const float *weight,
                                 const float *bias, float eps, int64_t rows, int64_t cols);
l2l_status cpu_layernorm_backward(float *dx, void *dx16, l2l_dtype dx16_dtype, float *dweight,
                                  float *dbias, const float *dy, const float *residual,
                                  const float *x, const float *weight, const float *mean,
                                  const float *rstd, int64_t rows, int64_t cols);
l2l_status cpu_softmax_forward(float *y, const float *x, const uint8_t *key_mask,
                               int causal, float scale, int64_t samples,
                               int64_t rows_per_sample, int64_t tq, int64_t tk);
l2l_status cpu_softmax_backward(float *dx, const float *dy, const float *y, float scale,
                                int64_t rows, int64_t cols);
l2l_status cpu_embedding_forward(float *out, const int32_t *ids, const void *table,
                                 l2l_dtype table_dtype, int64_t n, int64_t cols);
l2l_status cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                  int64_t n, int64_t vocab, int64_t cols);
l2l_status cpu_cross_entropy_forward(float *losses, const float *logits,
                                     const int32_t *targets, int32_t ignore_index,
                                     int64_t rows, int64_t vocab, int64_t ld);
l2l_status cpu_cross_entropy_backward(float *dlogits, const float *logits,
                                      const int32_t *targets, int32_t ignore_index,
                                      float scale, int64_t rows, int64_t vocab, int64_t ld);
l2l_status cpu_dropout_forward(float *y, uint8_t *mask, const float *x, float p,
                               uint64_t seed, uint64_t stream, int64_t first, int64_t n);
l2l_status cpu_dropout_backward(float *dx, const float *dy, const uint8_t *mask, float p,
                                int64_t n);
l2l_status cpu_gelu_forward_bits(float *y, uint8_t *bits, const float *x, int64_t n);
l2l_status cpu_gelu_backward_from_output(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                         const float *dy, const float *y, const uint8_t *bits,
                                         int64_t n);
l2l_status cpu_bias_gelu_forward(float *pre, float *y, void *y16, l2l_dtype y16_dtype,
                                 uint8_t *bits, const float *bias, int64_t rows, int64_t cols);
l2l_status cpu_add_layernorm_forward(float *sum, float *y, void *y16, l2l_dtype y16_dtype,
                                     float *mean_out, float *rstd_out, const float *a,
                                     const float *b, const float *weight, const float *bias,
                                     float eps, int64_t rows, int64_t cols);
l2l_status cpu_cross_entropy_fused(float *losses, float *dlogits, void *dlogits16,
                                   l2l_dtype dlogits16_dtype, const float *logits,
                                   const int32_t *targets, int32_t ignore_index,
                                   float scale, int64_t rows, int64_t vocab, int64_t ld);
l2l_status cpu_layernorm_backward_from_output(float *dx, void *dx16, l2l_dtype dx16_dtype,
                                              float *dweight, float *dbias, const float *dy,
                                              const float *residual, const float *y,
                                              const float *weight, const float *bias,
                                              const float *rstd, int64_t rows,
                                              int64_t cols);

/* ---------------------------------------------------------------- attention (attention.c) */

/* The CPU backend's attention (attention.c), entries of cpu_backend. */
l2l_status cpu_attention_forward(void *o, float *lse, float *probs, float *dropped,
                                 uint8_t *mask, const void *q, const void *k,
                                 const void *v, const uint8_t *key_mask,
                                 const struct backend_attention_shape *shape, float *workspace,
                                 int64_t workspace_floats);
l2l_status cpu_attention_backward(void *dq, void *dk, void *dv, const void *d_o,
                                  const void *o, const float *lse, const float *probs,
                                  const float *dropped, const uint8_t *mask,
                                  const void *q, const void *k, const void *v,
                                  const uint8_t *key_mask,
                                  const struct backend_attention_shape *shape,
                                  float *workspace, int64_t workspace_floats);
int64_t cpu_attention_workspace(const struct backend_attention_shape *shape, int backward);

#endif /* L2L_BACKEND_CPU_H */
