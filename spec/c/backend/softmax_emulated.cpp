/* SPDX-License-Identifier: MIT */
/* softmax_emulated.cpp — kernels/softmax.cu compiled for the CPU (softmax_emulated.h): its
 * launchers, renamed, run its kernels on kernel_emulation.h's threads.
 *
 * Purpose: cross-entropy runs on the LM head's logits every GPU step, and softmax in
 * attention's standard mode; test_softmax_emulated.c holds their source to the CPU backend
 * in make test.
 * Must never: be included by the library.
 */
#if L2L_KERNEL_EMULATION

#include "kernel_emulation.h"

#include "softmax_emulated.h"

/* Two blocks at most, so that the test's rows make each row group (a warp or a block) walk
   several rows; cross-entropy's row cache up to 56 KiB (a row of 14,330 floats), so that
   the test's vocabularies run both of its block kernels, the cache past 48 KiB (which needs
   the attribute) too (on a GPU rows stream only past about 58,000 words). */
#define K_ROW_MAX_BLOCKS 2
#define K_CE_ROW_CACHE_MAX_BYTES (56 * 1024)

#include "softmax.cu"

#endif /* L2L_KERNEL_EMULATION */
