/* SPDX-License-Identifier: MIT */
/* dtype.h — the numbers the kernels' launchers take for element types.
 *
 * Purpose: the one place the kernels spell l2l_dtype's values (include/l2l.h), as plain ints
 * (the .cu files do not see l2l.h); src/backend/cuda/cuda_ops.c, which sees both, asserts at
 * compile time that each number is l2l_dtype's.
 * Must never: differ from l2l_dtype (the assertions fail the build if it does).
 */
#ifndef L2L_KERNELS_DTYPE_H
#define L2L_KERNELS_DTYPE_H

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_I32 = 3, DT_U8 = 4 };

#endif /* L2L_KERNELS_DTYPE_H */
