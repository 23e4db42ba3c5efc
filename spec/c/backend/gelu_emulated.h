/* SPDX-License-Identifier: MIT */
/* gelu_emulated.h — kernels/gelu.cu's GELU launchers, compiled for the CPU by
 * gelu_emulated.cpp (kernel_emulation.h's threads), under names of their own.
 *
 * Purpose: test_gelu_emulated.c calls emu_k_bias_gelu_forward and the rest exactly as the
 * CUDA backend calls k_bias_gelu_forward, with host pointers (the stream NULL; the slope
 * tables host memory): the launchers' own choice of path, and the kernels' source, run in
 * make test. Only where L2L_KERNEL_EMULATION is defined (the build found the CUDA toolkit's
 * headers).
 * Must never: be included beside kernels/elementwise.h (the names below rename its
 * declarations).
 */
#ifndef L2L_GELU_EMULATED_H
#define L2L_GELU_EMULATED_H

#define k_gelu_forward emu_k_gelu_forward
#define k_gelu_backward emu_k_gelu_backward
#define k_gelu_forward_bits emu_k_gelu_forward_bits
#define k_bias_gelu_forward emu_k_bias_gelu_forward
#define k_gelu_backward_from_output emu_k_gelu_backward_from_output
#include "kernels/elementwise.h"

#endif /* L2L_GELU_EMULATED_H */
