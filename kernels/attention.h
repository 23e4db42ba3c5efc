/* SPDX-License-Identifier: MIT */
/* attention.h — launchers of the CUDA backend's multi-head self-attention (attention.cu).
 *
 * Purpose: the plain-C face of the flash-style attention kernels, so that
 * src/backend/cuda/attention_ops.c can call them without CUDA headers. Arguments mean
 * exactly what attention_forward / attention_backward in src/backend/backend.h say
 * (struct backend_attention_shape spread into its fields), and the results match
 * cpu_attention_forward / _backward.
 * Must never: name a CUDA type (a stream is a cudaStream_t passed as void *, NULL = the
 * default stream), synchronize, allocate, print or exit.
 *
 * Two families: k_attention_forward / _backward compute every product in fp32 on f32
 * tensors, every mode (attention.cu); k_attention_flash_* (the flash mode, no standard-mode
 * rows) read 16-bit q, k, v, do of the products' dtype, DT_BF16 (2) or DT_F16 (1) as
 * l2l_dtype numbers them, and round P (and, in the backward, P' and dS) to it, summing in
 * fp32 on tensor cores (attention_flash.cu, compute capability 8.0 on). f16's range is
 * narrow: do and dS, rounded to it, can underflow without loss scaling; bf16 (the relay's
 * default on a GPU) has f32's range.
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
                        float *scratch, void *stream);

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
                         int64_t first_sample, float *scratch, void *stream);

/* Whether the flash launchers serve a forward (backward = 0) or backward of head_dim with
   16-bit products of `dtype` on this GPU: compute capability 8.0 or later, head_dim a
   multiple of 8 up to 128, and their shared memory within what a block may take. */
int k_attention_flash_serves(int dtype, int64_t head_dim, int backward);

/* The flash forward: o (o_dtype: DT_F32 or `dtype`) and lse from q, k, v of `dtype`, whose
   pointers are 16-byte aligned and ld_qkv a multiple of 8 (cudaErrorInvalidValue
   otherwise, as for a call k_attention_flash_serves refuses). */
int k_attention_flash_forward(void *o, int o_dtype, float *lse, const void *q, const void *k,
                              const void *v, const uint8_t *key_mask, int64_t batch,
                              int64_t heads, int64_t seq, int64_t head_dim, int64_t ld_qkv,
                              int64_t ld_o, int causal, float scale, float dropout,
                              uint32_t keep_threshold, uint64_t seed, uint64_t stream_id,
                              int64_t first_sample, int dtype, void *stream);

/* The flash backward: dq, dk, dv (dqkv_dtype: DT_F32 or `dtype`; rows ld_dqkv apart, which
   may differ from q, k, v's ld_qkv where those were copied) from d_o of `dtype`
   (rows ld_do apart, aligned as q, k, v are), o as the forward wrote it (o_dtype, rows ld_o
   apart) and lse. scratch: k_attention_scratch_floats(batch, heads, seq, 1) floats (D = do . o). No
   atomics: the same inputs give the same bits. */
int k_attention_flash_backward(void *dq, void *dk, void *dv, int dqkv_dtype, int64_t ld_dqkv,
                               const void *d_o, int64_t ld_do, const void *o, int o_dtype, const float *lse, const void *q,
                               const void *k, const void *v, const uint8_t *key_mask,
                               int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
                               int64_t ld_qkv, int64_t ld_o, int causal, float scale,
                               float dropout, uint32_t keep_threshold, uint64_t seed,
                               uint64_t stream_id, int64_t first_sample, int dtype,
                               float *scratch, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* L2L_KERNELS_ATTENTION_H */
