/* SPDX-License-Identifier: MIT */
/* softmax_emulated.h — kernels/softmax.cu's launchers (softmax and cross-entropy), compiled
 * for the CPU by softmax_emulated.cpp (kernel_emulation.h's threads), under names of their
 * own.
 *
 * Purpose: test_softmax_emulated.c calls emu_k_cross_entropy_fused and the rest exactly as
 * the CUDA backend calls k_cross_entropy_fused, with host pointers (the stream NULL): the
 * launchers' own choice of kernel and shape, and the kernels' source, run in make test.
 * Only where L2L_KERNEL_EMULATION is defined (the build found the CUDA toolkit's headers).
 * Must never: be included beside kernels/norm.h or norm_emulated.h (the names below rename
 * its declarations).
 */
#ifndef L2L_SOFTMAX_EMULATED_H
#define L2L_SOFTMAX_EMULATED_H

#define k_softmax_forward emu_k_softmax_forward
#define k_softmax_backward emu_k_softmax_backward
#define k_cross_entropy_forward emu_k_cross_entropy_forward
#define k_cross_entropy_backward emu_k_cross_entropy_backward
#define k_cross_entropy_fused emu_k_cross_entropy_fused
#include "kernels/norm.h"

#endif /* L2L_SOFTMAX_EMULATED_H */
