/* SPDX-License-Identifier: MIT */
/* attention_emulated.h — kernels/attention.cu's launchers (fp32 attention, every mode, and
 * the checks before the flash kernels) and kernels/attention_flash.cu's kernels, compiled
 * for the CPU by attention_emulated.cpp, under names of their own.
 *
 * Purpose: test_attention_emulated.c calls emu_k_attention_forward and the rest exactly as
 * the CUDA backend calls k_attention_forward, with host pointers (the stream NULL): the
 * launchers' own checks, their choice of kernel and tile, and the kernels' source run in
 * make test, a thread a GPU thread (blocks one after another), with the warp's collective
 * instructions emulated as the PTX ISA states them: ldmatrix (.trans too), mma.sync
 * m16n8k16 with f32 sums, shuffles, and cp.async copies that land at their issue or, lazy,
 * only at the wait that covers them. The device the launchers ask about is a Hopper
 * (kernel_emulation.h). What this proves: the kernels' indices, masks, softmax, dropout
 * draws, stage handling and barriers, without a GPU. What it cannot: the hardware's own
 * instructions, timing, or a race that only real asynchrony shows. Only where
 * L2L_KERNEL_EMULATION is defined (the build found the CUDA toolkit's headers).
 * Must never: be included beside kernels/attention.h (the names below rename its
 * declarations).
 */
#ifndef L2L_ATTENTION_EMULATED_H
#define L2L_ATTENTION_EMULATED_H

#include <stdbool.h>

#define k_attention_scratch_floats emu_k_attention_scratch_floats
#define k_attention_forward emu_k_attention_forward
#define k_attention_backward emu_k_attention_backward
#define k_attention_flash_serves emu_k_attention_flash_serves
#define k_attention_flash_forward emu_k_attention_flash_forward
#define k_attention_flash_backward emu_k_attention_flash_backward
#include "kernels/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The launches that follow: at most `blocks` blocks a grid (so that blocks walk several
   items and reuse their shared memory; 3 until set), and whether their cp.async copies
   land only at the wait that covers them (lazy) or at their issue. */
void emu_attention_launches(int blocks, bool lazy);

#ifdef __cplusplus
}
#endif

#endif /* L2L_ATTENTION_EMULATED_H */
