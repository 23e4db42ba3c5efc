/* SPDX-License-Identifier: MIT */
/* state_code.h — the nearest 8-bit optimizer-state code of a magnitude, one inline function
 * for the host (src/backend/state_codes.c, whose loops vectorize it) and the GPU
 * (kernels/optim.cu's compact update).
 *
 * Purpose: the code's rule (include/l2l/relay.h, "optimizers") evaluated once in the tree,
 * so the host and a device pick codes by the same arithmetic: each product and difference
 * rounded on its own (the GPU by its _rn intrinsics, which are never fused; the host file
 * is built with -ffp-contract=off), never a fused multiply-add.
 * Must never: read memory (so it vectorizes on the host and stays in registers on the GPU).
 */
#ifndef L2L_KERNELS_STATE_CODE_H
#define L2L_KERNELS_STATE_CODE_H

#include <math.h>
#include <stdbool.h>

/* Powers of ten, for the decades (float constants: 10^-E and 10^E rounded once). */
#define L2L_CODE_TEN_DOWN {1.0f, 1e-1f, 1e-2f, 1e-3f, 1e-4f, 1e-5f, 1e-6f, 1e-7f}
#define L2L_CODE_TEN_UP {1.0f, 1e1f, 1e2f, 1e3f, 1e4f, 1e5f, 1e6f, 1e7f}

#if defined(__CUDACC__)
#define L2L_CODE_FN static __host__ __device__ __forceinline__
#else
#define L2L_CODE_FN static inline
#endif
#if defined(__CUDA_ARCH__)
#define L2L_CODE_MUL(a, b) __fmul_rn(a, b)
#define L2L_CODE_SUB(a, b) __fsub_rn(a, b)
#else
#define L2L_CODE_MUL(a, b) ((a) * (b))
#define L2L_CODE_SUB(a, b) ((a) - (b))
#endif

/* The nearest code of a magnitude y >= 0 in the code of `bits` bits (y > 1 gives the
   largest), by arithmetic rather than a search: the decade E (y in (10^-(E+1), 10^-E]) is
   how many of 10^-1 .. 10^-(bits-1) y is at or below; with F = bits - 1 - E, decade E's
   levels are 10^-E (0.1 + 0.9 (k + 1) / 2^F) at indexes 2^F + k, and index 2^F - 1 is the
   top of the decade below (10^-E 0.1), so the nearest index is 2^F - 1 plus the position
   (y 10^E - 0.1) 2^F / 0.9 rounded (ties down). The lowest decade's one level has 0 below
   it, not a decade: there the nearest is the level or 0, split at its half. The float
   arithmetic can move the choice only for a y within a few ulps of a midpoint. */
L2L_CODE_FN int state_code_nearest(float y, int bits) {
  const float down[8] = L2L_CODE_TEN_DOWN, up[8] = L2L_CODE_TEN_UP;
  int e = 0;
  float ten_e = 1.0f;
  for (int j = 1; j < 8; j++) {
    if (j >= bits) break;
    bool below = y <= down[j];
    e += below;
    ten_e = below ? up[j] : ten_e;
  }
  int f = bits - 1 - e;
  float two_f = (float)(1 << f);   /* (exact) */
  float position = L2L_CODE_MUL(L2L_CODE_SUB(L2L_CODE_MUL(y, ten_e), 0.1f),
                                L2L_CODE_MUL(two_f, 1.0f / 0.9f));
  float rounded = ceilf(position - 0.5f);   /* ties to the smaller */
  int top = (1 << bits) - 1;
  /* clamped so that a NaN (from an inf in the block) converts defined: to -1 */
  rounded = rounded > (float)top ? (float)top : rounded;
  rounded = rounded >= -1.0f ? rounded : -1.0f;
  int q = (1 << f) - 1 + (int)rounded;
  int lowest = y > 0.5f * down[bits - 1];
  q = e == bits - 1 ? lowest : q;
  return q > top ? top : q;
}

#endif /* L2L_KERNELS_STATE_CODE_H */
