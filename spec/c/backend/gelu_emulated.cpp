/* SPDX-License-Identifier: MIT */
/* gelu_emulated.cpp — kernels/gelu.cu compiled for the CPU (gelu_emulated.h): its
 * launchers, renamed, run its kernels on kernel_emulation.h's threads.
 *
 * Purpose: GELU (with the bias, its side bits and the 16-bit copy the next GEMM reads) runs
 * in every block of a GPU step; test_gelu_emulated.c holds its source to the CPU backend in
 * make test.
 * Must never: be included by the library.
 */
#if L2L_KERNEL_EMULATION

#include "kernel_emulation.h"

#include "gelu_emulated.h"

/* Three blocks at most, so that the test's threads walk several grid strides (and the
   bias's column steps from one stride to the next). */
#define K_GRID_MAX_BLOCKS 3

#include "gelu.cu"

#endif /* L2L_KERNEL_EMULATION */
