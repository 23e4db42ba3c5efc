/* SPDX-License-Identifier: MIT */
/* elementwise_emulated.cpp — kernels/elementwise.cu and kernels/cast_rows.cu compiled for
 * the CPU (elementwise_emulated.h): their launchers, renamed, run their kernels on
 * kernel_emulation.h's threads.
 *
 * Purpose: the bias add (and its 16-bit sums), casts of records and gradients, and dropout
 * run in every GPU step, and the cuDNN attention path casts q, k, v and o by strided rows;
 * test_elementwise_emulated.c holds their source to the CPU backend in make test.
 * Must never: be included by the library.
 */
#if L2L_KERNEL_EMULATION

#include "kernel_emulation.h"

#include "elementwise_emulated.h"

/* Three blocks at most, so that the test's threads walk several grid strides. */
#define K_GRID_MAX_BLOCKS 3

#include "elementwise.cu"
#include "cast_rows.cu"

#endif /* L2L_KERNEL_EMULATION */
