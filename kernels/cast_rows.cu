/* SPDX-License-Identifier: MIT */
/* cast_rows.cu — strided row casts between f32 and f16 / bf16 (launcher: cast_rows.h).
 *
 * Purpose: a grid-stride loop over rows * cols elements, each read at its row's stride and
 * written at the other's, through common.cuh's conversions (cpu_convert's rounding).
 * Must never: touch an element outside the first cols of a row.
 */
#include "cast_rows.h"
#include "common.cuh"

template <bool TO_HALF, int HALF>
static __global__ void __launch_bounds__(L2L_THREADS)
    cast_rows_kernel(void *dst, int64_t dst_ld, const void *src, int64_t src_ld, int64_t rows,
                     int64_t cols) {
  const int64_t n = rows * cols, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / cols, c = i - r * cols;
    if constexpr (TO_HALF) {
      const float v = static_cast<const float *>(src)[r * src_ld + c];
      static_cast<uint16_t *>(dst)[r * dst_ld + c] =
          HALF == DT_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
    } else {
      const uint16_t h = static_cast<const uint16_t *>(src)[r * src_ld + c];
      static_cast<float *>(dst)[r * dst_ld + c] = HALF == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
}

extern "C" int k_cast_rows(void *dst, int dst_dtype, int64_t dst_ld, const void *src,
                           int src_dtype, int64_t src_ld, int64_t rows, int64_t cols,
                           void *stream) {
  if (dst == NULL || src == NULL || rows < 0 || cols < 0 || dst_ld < cols || src_ld < cols)
    return (int)cudaErrorInvalidValue;
  const bool to_half = src_dtype == DT_F32;
  const int half = to_half ? dst_dtype : src_dtype;
  if ((to_half ? dst_dtype : src_dtype) != half || (to_half ? src_dtype : dst_dtype) != DT_F32 ||
      (half != DT_F16 && half != DT_BF16))
    return (int)cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return 0;
  const unsigned blocks = k_blocks_for(rows * cols);
  cudaStream_t s = (cudaStream_t)stream;
  if (to_half && half == DT_BF16)
    K_LAUNCH(blocks, L2L_THREADS, 0, s, cast_rows_kernel<true, DT_BF16>)(dst, dst_ld, src, src_ld, rows, cols);
  else if (to_half)
    K_LAUNCH(blocks, L2L_THREADS, 0, s, cast_rows_kernel<true, DT_F16>)(dst, dst_ld, src, src_ld, rows, cols);
  else if (half == DT_BF16)
    K_LAUNCH(blocks, L2L_THREADS, 0, s, cast_rows_kernel<false, DT_BF16>)(dst, dst_ld, src, src_ld, rows, cols);
  else
    K_LAUNCH(blocks, L2L_THREADS, 0, s, cast_rows_kernel<false, DT_F16>)(dst, dst_ld, src, src_ld, rows, cols);
  return k_launched();
}
