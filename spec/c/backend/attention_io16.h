/* SPDX-License-Identifier: MIT */
/* attention_io16.h — the check that a backend's attention reads q, k, v, keeps its
 * output o and writes dq, dk, dv in 16 bits exactly (backend.h: backend_attention_shape's
 * qkv_dtype, o_dtype and dqkv_dtype); attention_io16.c defines it.
 *
 * Purpose: one statement of the contract, run on the CPU backend (test_fused_ops.c) and
 * on a GPU's (test_cudnn.c): attention over 16-bit q, k, v is attention over their widened
 * f32 copies, a 16-bit o is convert's rounding of the f32 o the same backend writes, a
 * backward from 16-bit inputs is the backward from their widened copies, and 16-bit dq,
 * dk, dv are convert's rounding of its f32 ones; a backward reading a 16-bit do is the
 * backward reading its widened copy.
 * Must never: compare a backend with another (the GPU-against-CPU tests do that).
 */
#ifndef L2L_ATTENTION_IO16_H
#define L2L_ATTENTION_IO16_H

#include <stdbool.h>

#include "l2l.h"

/* One random case on `pool`'s backend (its products in `products`: f32, bf16 or f16),
   standard (probabilities kept) or frugal; q, k, v in 16 bits, o in 16 bits, or both
   (drawn), dq, dk, dv and do each in 16 bits or not (drawn), in the products' dtype where they
   are 16-bit (bf16 or f16, drawn, where they are f32); q, k, v (and dq, dk, dv alike)
   interleaved in one buffer (the block's) or three, their 16-bit rows 16-byte aligned or
   not; o at a row stride of the heads' width or past it. The run with 16-bit inputs and
   outputs against the run with their f32 copies: exact, the forward's o to the bit
   (rounded where 16-bit, its padding untouched), lse and the kept probabilities, and the
   backward's dq, dk, dv to the bit (rounded where 16-bit, their padding untouched); else
   (a backend that may pick another kernel for the 16-bit layout, or sum in another order
   from run to run) o and 16-bit dq, dk, dv within two 16-bit ulps and 1e-5 of their rms,
   lse and probabilities within 1e-5, f32 dq, dk, dv within 1e-5 of their scale and two
   16-bit ulps.
   Returns whether every check held. */
bool attention_io16_check(l2l_pool_kind pool, l2l_dtype products, bool standard, bool exact);

#endif /* L2L_ATTENTION_IO16_H */
