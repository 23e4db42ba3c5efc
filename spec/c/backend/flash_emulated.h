/* SPDX-License-Identifier: MIT */
/* flash_emulated.h — kernels/attention_flash.cu's kernels run on the CPU
 * (flash_emulated.cpp), for test_flash_emulated.c.
 *
 * Purpose: the flash attention kernels' own source, compiled for the host, run by 128
 * threads a block (a thread a GPU thread, blocks one after another) with the warp's
 * collective instructions emulated as the PTX ISA states them: ldmatrix (.trans too),
 * mma.sync m16n8k16 with f32 sums, shuffles, and cp.async copies that land at their
 * issue or, `lazy`, only at the wait that covers them. Shared memory is poisoned before
 * each block. What this proves: the kernels' indices, masks, softmax, dropout draws,
 * stage handling and barriers, without a GPU. What it cannot: the hardware's own
 * instructions, timing, or a race that only real asynchrony shows.
 * Only where L2L_KERNEL_EMULATION is defined (the build found the CUDA toolkit's headers).
 */
#ifndef L2L_FLASH_EMULATED_H
#define L2L_FLASH_EMULATED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The forward kernel over a whole call, arguments as k_attention_flash_forward's
   (kernels/attention.h), every pointer host memory; `blocks` blocks walk the items (a
   block takes every blocks-th, as a capped grid does). 0, or -1 for arguments the
   launcher would refuse. */
int flash_emulated_forward(void *o, int o_dtype, float *lse, const void *q, const void *k,
                           const void *v, const uint8_t *key_mask, int64_t batch,
                           int64_t heads, int64_t seq, int64_t head_dim, int64_t ld_qkv,
                           int64_t ld_o, int causal, float scale, float dropout,
                           uint32_t keep_threshold, uint64_t seed, uint64_t stream_id,
                           int64_t first_sample, int dtype, int blocks, bool lazy);

/* The backward's two kernels (dq, then dk and dv), arguments as
   k_attention_flash_backward's; d_rows: batch * heads * seq floats of scratch. */
int flash_emulated_backward(void *dq, void *dk, void *dv, int dqkv_dtype, int64_t ld_dqkv,
                            const void *d_o, int64_t ld_do, const void *o, int o_dtype,
                            const float *lse, const void *q, const void *k, const void *v,
                            const uint8_t *key_mask, int64_t batch, int64_t heads,
                            int64_t seq, int64_t head_dim, int64_t ld_qkv, int64_t ld_o,
                            int causal, float scale, float dropout, uint32_t keep_threshold,
                            uint64_t seed, uint64_t stream_id, int64_t first_sample,
                            int dtype, float *d_rows, int blocks, bool lazy);

#ifdef __cplusplus
}
#endif

#endif /* L2L_FLASH_EMULATED_H */
