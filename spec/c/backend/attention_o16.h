/* SPDX-License-Identifier: MIT */
/* attention_o16.h — the check that a backend's attention keeps its output o in 16 bits
 * exactly (backend.h: backend_attention_shape.o_dtype); attention_o16.c defines it.
 *
 * Purpose: one statement of the contract, run on the CPU backend (test_fused_ops.c) and
 * on a GPU's (test_cuda_layers.c): a 16-bit o is convert's rounding of the f32 o the same
 * backend writes, and a backward from it is the backward from its widened f32 copy.
 * Must never: compare a backend with another (the GPU-against-CPU tests do that).
 */
#ifndef L2L_ATTENTION_O16_H
#define L2L_ATTENTION_O16_H

#include <stdbool.h>

#include "l2l.h"

/* One random case on `pool`'s backend (its products in `products`: f32, bf16 or f16),
   standard (probabilities kept) or frugal, o in the products' dtype where they are 16-bit
   (bf16 or f16, drawn, where they are f32) at a row stride of the heads' width or past it. The forward's o to the bit, its padding untouched, lse and the kept
   probabilities the f32 run's bits; the backward's dq, dk, dv the widened run's bits
   (exact_backward), else within 1e-5 of their scale and two ulps of the products' 16 bits
   (a backend whose backward sums in an order that varies from run to run, and may round
   the sums to 16 bits). Returns whether every check held. */
bool attention_o16_check(l2l_pool_kind pool, l2l_dtype products, bool standard,
                         bool exact_backward);

#endif /* L2L_ATTENTION_O16_H */
