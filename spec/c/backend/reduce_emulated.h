/* SPDX-License-Identifier: MIT */
/* reduce_emulated.h — kernels/reduce.cu's launchers (the bias gradient, whole-tensor
 * reductions, the index checks, embedding gather and scatter-add), compiled for the CPU by
 * reduce_emulated.cpp (kernel_emulation.h's threads), under names of their own.
 *
 * Purpose: test_reduce_emulated.c calls emu_k_bias_backward and the rest exactly as the
 * CUDA backend calls k_bias_backward, with host pointers (the stream NULL): the launchers'
 * own plans, and the kernels' source, run in make test. Only where L2L_KERNEL_EMULATION is
 * defined (the build found the CUDA toolkit's headers).
 * Must never: be included beside kernels/reduce.h (the names below rename its
 * declarations).
 */
#ifndef L2L_REDUCE_EMULATED_H
#define L2L_REDUCE_EMULATED_H

#define k_bias_backward_scratch_floats emu_k_bias_backward_scratch_floats
#define k_bias_backward emu_k_bias_backward
#define k_reduce emu_k_reduce
#define k_find_out_of_range emu_k_find_out_of_range
#define k_layernorm_uninvertible emu_k_layernorm_uninvertible
#define k_embedding_forward emu_k_embedding_forward
#define k_embedding_backward emu_k_embedding_backward
#include "kernels/reduce.h"

#endif /* L2L_REDUCE_EMULATED_H */
