/* SPDX-License-Identifier: MIT */
/* elementwise_emulated.cpp — kernels/elementwise.cu compiled for the CPU
 * (elementwise_emulated.h): its launchers, renamed, run its kernels on kernel_emulation.h's
 * threads.
 *
 * Purpose: the bias add (and its 16-bit sums), casts of records and gradients, and dropout
 * run in every GPU step; test_elementwise_emulated.c holds their source to the CPU backend
 * in make test.
 * Must never: be included by the library.
 */
#if L2L_KERNEL_EMULATION

#include "kernel_emulation.h"

#include "elementwise_emulated.h"

/* Three blocks at most, so that the test's threads walk several grid strides. */
#define K_GRID_MAX_BLOCKS 3

#include "elementwise.cu"

#endif /* L2L_KERNEL_EMULATION */
