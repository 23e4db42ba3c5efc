/* SPDX-License-Identifier: MIT */
/* elementwise_emulated.h — kernels/elementwise.cu's launchers (adds, the bias, dropout,
 * AdamW, fills, casts, the integer check, random fills) and kernels/cast_rows.cu's (strided
 * row casts), compiled for the CPU by
 * elementwise_emulated.cpp (kernel_emulation.h's threads), under names of their own.
 *
 * Purpose: test_elementwise_emulated.c calls emu_k_bias_add and the rest exactly as the CUDA
 * backend calls k_bias_add, with host pointers (the stream NULL): the launchers' own choice
 * of path, and the kernels' source, run in make test. Only where L2L_KERNEL_EMULATION is
 * defined (the build found the CUDA toolkit's headers).
 * Must never: be included beside kernels/elementwise.h, kernels/cast_rows.h or
 * gelu_emulated.h (the names below rename their declarations).
 */
#ifndef L2L_ELEMENTWISE_EMULATED_H
#define L2L_ELEMENTWISE_EMULATED_H

#define k_add emu_k_add
#define k_bias_add emu_k_bias_add
#define k_dropout_forward emu_k_dropout_forward
#define k_dropout_backward emu_k_dropout_backward
#define k_adamw emu_k_adamw
#define k_fill emu_k_fill
#define k_convert emu_k_convert
#define k_convert_many emu_k_convert_many
#define k_find_non_i32 emu_k_find_non_i32
#define k_random emu_k_random
#include "kernels/elementwise.h"
#define k_cast_rows emu_k_cast_rows
#include "kernels/cast_rows.h"

#endif /* L2L_ELEMENTWISE_EMULATED_H */
