/* SPDX-License-Identifier: MIT */
/* norm_emulated.h — kernels/norm.cu's LayerNorm launchers, compiled for the CPU by
 * norm_emulated.cpp (kernel_emulation.h's threads), under names of their own.
 *
 * Purpose: test_norm_emulated.c calls emu_k_layernorm_forward and the rest exactly as the
 * CUDA backend calls k_layernorm_forward, with host pointers (the stream NULL): the
 * launchers' own choice of kernel and shape, and the kernels' source, run in make test.
 * Only where L2L_KERNEL_EMULATION is defined (the build found the CUDA toolkit's headers).
 * Must never: be included beside kernels/norm.h (the names below rename its declarations).
 */
#ifndef L2L_NORM_EMULATED_H
#define L2L_NORM_EMULATED_H

#define k_layernorm_forward emu_k_layernorm_forward
#define k_add_layernorm_forward emu_k_add_layernorm_forward
#define k_layernorm_backward_scratch_floats emu_k_layernorm_backward_scratch_floats
#define k_layernorm_backward emu_k_layernorm_backward
#define k_layernorm_backward_from_output emu_k_layernorm_backward_from_output
#include "kernels/norm.h"

#endif /* L2L_NORM_EMULATED_H */
