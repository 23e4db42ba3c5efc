/* SPDX-License-Identifier: MIT */
/* attention.h — launchers of the CUDA backend's multi-head self-attention (attention.cu).
 *
 * Purpose: the plain-C face of the flash-style attention kernels, so that
 * src/backend/cuda/cuda_ops.c can call them without CUDA headers. Arguments mean exactly
 * what attention_forward / attention_backward in src/backend/backend.h say (struct
 * backend_attention_shape spread into its fields), and the results match
 * cpu_attention_forward / _backward.
 * Must never: name a CUDA type (a stream is a cudaStream_t passed as void *, NULL = the
 * default stream), synchronize, allocate, print or exit.
 *
 * product_dtype: 0 (f32) computes every product in fp32. DT_BF16 (2) or DT_F16 (1), as
 * l2l_dtype numbers them, lets the products read q, k, v, P (and, in the backward, do and
 * dS) rounded to that 16-bit type, summing in fp32, on tensor cores (attention_mma.cu):
 * where the GPU has them (compute capability 8.0 on), head_dim <= 128, and the call asks
 * for no standard-mode rows (forward) and reads none (backward). Other calls run fp32.
 * f16's range is narrow: do and dS, rounded to it, can underflow without loss scaling;
 * bf16 (the relay's default on a GPU) has f32's range.
 *
 * Every launcher returns the cudaError_t of its launches as an int (0 = queued), or
 * cudaErrorInvalidValue (1) for arguments it cannot serve: head_dim outside [1, 256],
 * a negative size, ld_qkv or ld_o below heads * head_dim, dropout outside [0, 1), or a
 * required pointer that is NULL. batch, heads or seq of 0 queue nothing and return 0.
 */
#ifndef L2L_KERNELS_ATTENTION_H
#define L2L_KERNELS_ATTENTION_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Floats of `scratch` the caller must pass to a forward (backward = 0) or backward: the
   forward needs none (0; scratch may be NULL), the backward batch * heads * seq (each
   query row's D = do . o). */
int64_t k_attention_scratch_floats(int64_t batch, int64_t heads, int64_t seq,
                                   int backward);

/* o, lse (batch, heads, seq) and, when not NULL, the standard mode's full rows of P
   (probs), P' (dropped, written only when dropout > 0) and kept bits (mask, written only
   when dropout > 0; row (b*heads + h)*seq + i starts at byte ((b*heads + h)*seq + i) *
   ((seq + 7) / 8), and only the bytes the CPU backend writes are written).
   keep_threshold = backend_keep_threshold(dropout), computed on the host. */
int k_attention_forward(float *o, float *lse, float *probs, float *dropped, uint8_t *mask,
                        const float *q, const float *k, const float *v,
                        const uint8_t *key_mask, int64_t batch, int64_t heads,
                        int64_t seq, int64_t head_dim, int64_t ld_qkv, int64_t ld_o,
                        int causal, float scale, float dropout, uint32_t keep_threshold,
                        uint64_t seed, uint64_t stream_id, int64_t first_sample,
                        int product_dtype, float *scratch, void *stream);

/* dq, dk, dv (written; only their (b, i, h, 0..head_dim) entries are touched) from d_o,
   given the forward's o and lse, and its probs / dropped / mask when kept (NULL: P is
   recomputed from q, k, lse and P' from the generator). lse may be NULL when probs is
   not. scratch: k_attention_scratch_floats(batch, heads, seq, 1) floats. */
int k_attention_backward(float *dq, float *dk, float *dv, const float *d_o, const float *o,
                         const float *lse, const float *probs, const float *dropped,
                         const uint8_t *mask, const float *q, const float *k,
                         const float *v, const uint8_t *key_mask, int64_t batch,
                         int64_t heads, int64_t seq, int64_t head_dim, int64_t ld_qkv,
                         int64_t ld_o, int causal, float scale, float dropout,
                         uint32_t keep_threshold, uint64_t seed, uint64_t stream_id,
                         int64_t first_sample, int product_dtype, float *scratch,
                         void *stream);

#ifdef __cplusplus
}
#endif

#endif /* L2L_KERNELS_ATTENTION_H */
