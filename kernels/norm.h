/* SPDX-License-Identifier: MIT */
/* norm.h — CUDA launchers for the row-wise ops: LayerNorm, softmax, cross-entropy, and
 * two fused forms the layers use (residual add + LayerNorm, cross-entropy loss + gradient);
 * defined in norm.cu (LayerNorm) and softmax.cu (the rest).
 *
 * Purpose: plain-C entry points for src/backend/cuda/cuda_ops.c. Each launcher matches the
 * CPU op of the same name in src/backend/cpu/ (argument meanings in src/backend/backend.h),
 * queues its kernels on `stream` (a cudaStream_t; NULL = the default stream) and returns
 * the launch's cudaError_t as an int (0 = queued; (int)cudaErrorInvalidValue for arguments
 * it cannot serve). rows == 0 or cols == 0 returns 0 and launches nothing. Pointers are
 * device pointers; rows are contiguous, row r of a (rows, cols) matrix starts at r * cols.
 * Must never: synchronize, allocate, print, exit, or use CUDA types in this header.
 */
#ifndef L2L_KERNELS_NORM_H
#define L2L_KERNELS_NORM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- LayerNorm */

/* y = (x - mean) rstd weight + bias per row; mean = sum(x)/cols, then (second pass)
   rstd = 1 / sqrtf(sum((x - mean)^2)/cols + eps). mean and rstd (rows floats each) may be
   NULL. y may be x. y16 (rows x cols of y16_dtype, DT_BF16 or DT_F16), when not NULL, gets
   y rounded to nearest even, the bits k_convert gives; y or y16 may be NULL, not both. */
int k_layernorm_forward(float *y, void *y16, int y16_dtype, float *mean, float *rstd,
                        const float *x, const float *weight, const float *bias, float eps,
                        int64_t rows, int64_t cols, void *stream);

/* Fused residual add + LayerNorm: sum = a + b (written; sum may be a or b), then y, mean,
   rstd exactly as k_layernorm_forward(y, mean, rstd, sum, ...) would give, in one pass
   over memory (each row of sum is kept on chip between the add and the normalization).
   sum is required; y and y16 as k_layernorm_forward's; mean and rstd may be NULL. y must
   not overlap sum (it may be whichever of a, b that sum is not). */
int k_add_layernorm_forward(float *sum, float *y, void *y16, int y16_dtype, float *mean,
                            float *rstd, const float *a, const float *b, const float *weight,
                            const float *bias, float eps, int64_t rows, int64_t cols,
                            void *stream);

/* Floats of scratch the two LayerNorm backward launchers need when dweight or dbias is
   not NULL (0 when rows or cols is 0): 2 * P * cols, P = per-row-group partial sums
   (P <= 1024). Depends only on (rows, cols). */
int64_t k_layernorm_backward_scratch_floats(int64_t rows, int64_t cols);

/* With x^ = (x - mean[r]) rstd[r] and g = dy weight:
   dx = rstd (g - mean(g) - x^ mean(g x^)) [+ residual, NULL: none, added in f32 in the same
   pass]; dx16 (DT_BF16 / DT_F16, NULL: none) gets dx rounded as k_convert rounds;
   dweight += sum_r dy x^; dbias += sum_r dy.
   dweight, dbias may be NULL (each independently); they ACCUMULATE (+=). dx may be dy, and
   residual dx or dy.
   scratch: k_layernorm_backward_scratch_floats(rows, cols) floats, needed (non-NULL)
   when dweight or dbias is given, else ignored. The parameter gradients are summed in a
   fixed order (bit-identical from run to run): per-row-group partials into scratch, then
   a second kernel adds them in group order into dweight / dbias. */
int k_layernorm_backward(float *dx, void *dx16, int dx16_dtype, float *dweight, float *dbias,
                         const float *dy, const float *residual, const float *x,
                         const float *weight, const float *mean, const float *rstd,
                         int64_t rows, int64_t cols, float *scratch, void *stream);

/* As k_layernorm_backward with x^ = (y - bias) * (1/weight) from the forward's output
   (1/weight rounded to float first, as the CPU does); weight must have no zero channel.
   Same scratch. dx may be dy. */
int k_layernorm_backward_from_output(float *dx, void *dx16, int dx16_dtype, float *dweight,
                                     float *dbias, const float *dy, const float *residual,
                                     const float *y, const float *weight, const float *bias,
                                     const float *rstd, int64_t rows, int64_t cols,
                                     float *scratch, void *stream);

/* ---------------------------------------------------------------- softmax */

/* x is (samples, rows_per_sample, tk); row r is query r % tq of sample r / rows_per_sample
   (tq >= 1 divides rows_per_sample). Keys j < limit are visible, limit = causal ?
   clamp(query + (tk - tq) + 1, 0, tk) : tk, and, with key_mask (samples, tk) not NULL,
   only where key_mask[sample][j] != 0. y = softmax(scale x) over the visible keys, 0
   elsewhere; a row with no visible key (or whose visible scores are all -inf) is all 0.
   y may be x. */
int k_softmax_forward(float *y, const float *x, const uint8_t *key_mask, int causal,
                      float scale, int64_t samples, int64_t rows_per_sample, int64_t tq,
                      int64_t tk, void *stream);

/* dx = scale y (dy - dot(dy, y)) per row. dx may be dy. */
int k_softmax_backward(float *dx, const float *dy, const float *y, float scale,
                       int64_t rows, int64_t cols, void *stream);

/* ---------------------------------------------------------------- cross-entropy */

/* losses[r] = logsumexp(logits[r]) - logits[r][targets[r]]; 0 where targets[r] ==
   ignore_index. Targets must be in [0, vocab) or ignore_index (public_ops.c checks); an
   out-of-range one gives NaN instead of reading out of bounds. In the cross-entropy
   kernels a row is vocab elements of logits, dlogits and dlogits16, rows ld >= vocab
   elements apart; a row's padding is neither read nor written. */
int k_cross_entropy_forward(float *losses, const float *logits, const int32_t *targets,
                            int32_t ignore_index, int64_t rows, int64_t vocab, int64_t ld,
                            void *stream);

/* dlogits[r][j] = scale expf(logits[r][j] - lse[r]), minus scale at j = targets[r]; rows
   whose target is ignore_index are all 0. dlogits may be logits (each row is read fully
   before any of it is written). */
int k_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                             int32_t ignore_index, float scale, int64_t rows,
                             int64_t vocab, int64_t ld, void *stream);

/* Both of the above from one log-sum-exp per row: losses as k_cross_entropy_forward and
   dlogits as k_cross_entropy_backward (same scale). Either output may be NULL (then
   it is not written). dlogits may be logits: each row's target logit and log-sum-exp are
   taken before the row is overwritten. dlogits16 (of dlogits16_dtype, DT_BF16 or DT_F16;
   NULL: none) gets dlogits rounded to nearest even as k_convert rounds (dlogits may then be
   NULL). */
int k_cross_entropy_fused(float *losses, float *dlogits, void *dlogits16, int dlogits16_dtype,
                          const float *logits, const int32_t *targets, int32_t ignore_index,
                          float scale, int64_t rows, int64_t vocab, int64_t ld,
                          void *stream);

#ifdef __cplusplus
}
#endif

#endif /* L2L_KERNELS_NORM_H */
