/* SPDX-License-Identifier: MIT */
/* optim_emulated.cpp — kernels/optim.cu compiled for the CPU (optim_emulated.h): its
 * launchers, renamed, run its kernels on kernel_emulation.h's threads.
 *
 * Purpose: a record placed on the device (issue 49) is updated by these kernels every step;
 * test_optim_emulated.c holds their source to the CPU backend's optim ops in make test.
 * Must never: be included by the library.
 */
#if L2L_KERNEL_EMULATION

#include "kernel_emulation.h"

#include "optim_emulated.h"

/* Three blocks at most for the grid-stride loops, LAMB's partial sums and the compact
   update's state blocks, so that the test's threads walk several strides. */
#define K_GRID_MAX_BLOCKS 3

#include "optim.cu"

#endif /* L2L_KERNEL_EMULATION */
