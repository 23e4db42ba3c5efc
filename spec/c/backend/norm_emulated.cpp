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

#include "norm.cu"

#endif /* L2L_KERNEL_EMULATION */
