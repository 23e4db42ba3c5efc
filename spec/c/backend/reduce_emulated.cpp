/* SPDX-License-Identifier: MIT */
/* reduce_emulated.cpp — kernels/reduce.cu compiled for the CPU (reduce_emulated.h): its
 * launchers, renamed, run its kernels on kernel_emulation.h's threads.
 *
 * Purpose: the bias gradient (from 16-bit dy too), the gradient norms' reductions, the
 * embedding's gather and its fixed-order scatter-add run in every GPU step;
 * test_reduce_emulated.c holds their source to the CPU backend in make test.
 * Must never: be included by the library.
 */
#if L2L_KERNEL_EMULATION

#include "kernel_emulation.h"

#include "reduce_emulated.h"

/* Three blocks at most for the grid-stride and row loops, so that the test's threads walk
   several strides. */
#define K_GRID_MAX_BLOCKS 3

#include "reduce.cu"

#endif /* L2L_KERNEL_EMULATION */
