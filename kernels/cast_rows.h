/* SPDX-License-Identifier: MIT */
/* cast_rows.h — a launcher that casts a strided block of rows between f32 and a 16-bit
 * float type (cast_rows.cu).
 *
 * Purpose: the cuDNN attention path (src/backend/cuda/cudnn_sdpa.c) reads and writes
 * 16-bit q, k, v, o, do and their gradients while the backend's activations are f32; it
 * casts each into a packed buffer and back with this, one launch a tensor, touching only
 * the cols of each row (an interleaved qkv buffer's other heads are left alone). The
 * rounding is cpu_convert's (round to nearest even, NaN kept).
 * Must never: name a CUDA type (the stream is a cudaStream_t passed as void *),
 * synchronize, allocate, print or exit.
 */
#ifndef L2L_KERNELS_CAST_ROWS_H
#define L2L_KERNELS_CAST_ROWS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst (rows, cols; row r at dst + r * dst_ld elements) := src (rows, cols; row stride
   src_ld) converted. One of the dtypes is DT_F32 (kernels/dtype.h), the other DT_F16 or
   DT_BF16. Returns 0 when queued (rows or cols 0: nothing), cudaErrorInvalidValue (1)
   for another pair of types, a negative size, an ld below cols or a NULL pointer, else
   the launch's cudaError_t. */
int k_cast_rows(void *dst, int dst_dtype, int64_t dst_ld, const void *src, int src_dtype,
                int64_t src_ld, int64_t rows, int64_t cols, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* L2L_KERNELS_CAST_ROWS_H */
