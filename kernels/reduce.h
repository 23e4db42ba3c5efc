/* SPDX-License-Identifier: MIT */
/* reduce.h — launchers for the CUDA backend's reductions, range checks and embedding
 * gather / scatter (kernels/reduce.cu).
 *
 * Purpose: plain-C entry points that src/backend/cuda/cuda_ops.c calls with device
 * pointers; each computes what the CPU function of the same name in src/backend/cpu/
 * computes. Every launcher queues its work on `stream` (a cudaStream_t; NULL = the default
 * stream) and returns the launch's cudaError_t as an int (0 = queued), or
 * cudaErrorInvalidValue for arguments it cannot serve. Empty inputs queue nothing and
 * return 0, except the launchers with a single result (k_reduce,
 * k_find_out_of_range), which still write it (0.0 / -1) so that it is defined.
 * Must never: synchronize, allocate, print or exit; expose CUDA types.
 */
#ifndef L2L_KERNELS_REDUCE_H
#define L2L_KERNELS_REDUCE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Floats of scratch k_bias_backward needs for (rows, cols): 0 when one pass suffices
   (scratch may then be NULL), never more than 65536 + cols. */
int64_t k_bias_backward_scratch_floats(int64_t rows, int64_t cols);

/* dbias (cols) += column sums of dy (rows, cols; dy_dtype DT_F32, or DT_BF16 / DT_F16 read
   widened). Deterministic: the rows are split into
   fixed chunks that depend only on (rows, cols); each chunk's column sums are formed in
   a fixed order into scratch (device memory, k_bias_backward_scratch_floats floats),
   then each column's added in a fixed order (a warp a column: lane l the chunks l, l + 32,
   ... in turn, then a butterfly). Float accumulation, as the CPU. */
int k_bias_backward(float *dbias, const void *dy, int dy_dtype, int64_t rows, int64_t cols,
                    float *scratch, void *stream);

/* Doubles of scratch k_reduce needs, whatever n. */
#define L2L_K_REDUCE_SCRATCH_DOUBLES 1024

/* *out (one double, device memory) := kind 0 sum, 1 max |x|, 2 sum of squares of x[0..n)
   (enum backend_reduction). Sum and sumsq accumulate (double)x per element, as the CPU;
   max_abs is NaN (0x7ff8000000000000) if any element is NaN, else the largest |x| (0.0
   for n == 0). Deterministic: a fixed partition into at most 1024 partials in scratch
   (device memory, L2L_K_REDUCE_SCRATCH_DOUBLES doubles), summed in a fixed order. */
int k_reduce(double *out, int kind, const float *x, int64_t n, double *scratch,
             void *stream);

/* *out (one int64, device memory) := the first i with (values[i] < lo || values[i] >= hi)
   && values[i] != except, or -1. */
int k_find_out_of_range(int64_t *out, const int32_t *values, int64_t n, int32_t lo,
                        int32_t hi, int32_t except, void *stream);

/* *out (one int64, device memory) := the first i with !(|weight[i]| >= min_weight) ||
   |weight[i]| * bias_ratio < |bias[i]|, or -1 (the backend's layernorm_invertible). */
int k_layernorm_uninvertible(int64_t *out, const float *weight, const float *bias,
                             int64_t n, float min_weight, float bias_ratio, void *stream);

/* out (n, cols) row i := table row ids[i], the table f32 or f16 / bf16 (table_dtype as
   l2l_dtype's values; widened exactly). ids must be valid (checked by the caller). */
int k_embedding_forward(float *out, const int32_t *ids, const void *table, int table_dtype,
                        int64_t n, int64_t cols, void *stream);

/* dtable (vocab, cols) row ids[i] += dout row i, for every i: each row adds the positions
   holding its id in their order, as the CPU adds them (its bits, run after run; no
   atomics). vocab is unused (as on the CPU). */
int k_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n,
                         int64_t vocab, int64_t cols, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* L2L_KERNELS_REDUCE_H */
