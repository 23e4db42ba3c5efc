/* SPDX-License-Identifier: MIT */
/* cublaslt.h — cuBLASLt inside the CUDA backend (private to backend/cuda/; built with
 * L2L_CUDA only): a GEMM whose bias add, and rounding to 16 bits, ride in its epilogue.
 *
 * Purpose: cublaslt.c opens libcublasLt (as runtime.c opens cuBLAS: dlopen, a table of
 * functions) when first asked, keeps a plan a shape (matmul descriptor, layouts, the
 * heuristic's algorithm) and runs cuda_ops.c's gemm_bias in one cublasLtMatmul with the
 * BIAS epilogue; anything it cannot run (switched off, not loaded, no algorithm) it
 * leaves to the caller's GEMM and bias add.
 * Must never: be included outside backend/cuda/.
 */
#ifndef L2L_CUDA_CUBLASLT_H
#define L2L_CUDA_CUBLASLT_H

#include "runtime.h"

/* Row-major c (m,n; packed) of c_dtype (f32, bf16, f16) := op(a) op(b) + bias (n floats,
   NULL: none), a and b of ab_dtype (both f32, both bf16 or both f16), summed in f32, the
   bias added in f32 and the sum rounded to c_dtype as convert rounds: one cublasLtMatmul on
   the compute stream, with cuBLAS's workspace. *ran stays false, with nothing queued, where
   cuBLASLt is off (L2L_CUBLASLT=0), not loaded, or has no algorithm for the call (then
   said once on stderr): the caller runs its GEMM and bias add instead. */
CUDA_INTERNAL l2l_status cublaslt_gemm_bias(bool *ran, void *c, l2l_dtype c_dtype, const void *a,
                                            const void *b, l2l_dtype ab_dtype, const float *bias,
                                            int64_t m, int64_t n, int64_t k, int trans_a,
                                            int trans_b);

#endif /* L2L_CUDA_CUBLASLT_H */
