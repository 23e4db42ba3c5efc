/* SPDX-License-Identifier: MIT */
/* norm_emulated.cpp — kernels/norm.cu compiled for the CPU (norm_emulated.h): its
 * launchers, renamed, run its kernels on kernel_emulation.h's threads.
 *
 * Purpose: LayerNorm runs in every block of every GPU step, and its kernels in a warp's
 * registers were written where no GPU runs them; test_norm_emulated.c holds their source to
 * the CPU backend in make test.
 * Must never: be included by the library.
 */
#if L2L_KERNEL_EMULATION

#include "kernel_emulation.h"

#include "norm_emulated.h"

/* Two blocks at most, so that the test's rows make each row group (a warp or a block) walk
   several rows, and its partial sums carry from one to the next. */
#define K_ROW_MAX_BLOCKS 2
#define K_LN_MAX_PARTIAL_GROUPS 2

#include "norm.cu"

#endif /* L2L_KERNEL_EMULATION */
