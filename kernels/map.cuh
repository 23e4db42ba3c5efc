/* SPDX-License-Identifier: MIT */
/* map.cuh — what the element-wise kernel files (elementwise.cu, gelu.cu; reduce.cu for the
 * helpers) share: a grid-stride map over elements with a float4 path, and the launchers'
 * small helpers.
 *
 * Purpose: one copy of the generic map and its alignment test, so that each op is an Op
 * struct (scalar(i), quad(q)) and a launcher.
 * Must never: be included by a file that is not compiled by nvcc.
 */
#ifndef L2L_KERNELS_MAP_CUH
#define L2L_KERNELS_MAP_CUH

#include <stdint.h>

#include "common.cuh"

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static inline int invalid_argument(void) { return (int)cudaErrorInvalidValue; }

/* Grid-stride loop bounds of the calling thread. */
static __device__ __forceinline__ int64_t thread_index(void) {
  return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
static __device__ __forceinline__ int64_t grid_threads(void) {
  return (int64_t)gridDim.x * blockDim.x;
}

/* ---------------------------------------------------------------- a generic map
   An Op holds its pointers and provides scalar(i) for element i and quad(q) for elements
   4q..4q+3 with 16-byte vector accesses. The kernel runs quads over the first n/4*4
   elements when `vectorized` (every pointer aligned), then scalars over the rest. */

template <class Op>
__global__ void __launch_bounds__(L2L_THREADS) map_kernel(Op op, int64_t n, bool vectorized) {
  const int64_t stride = grid_threads();
  int64_t scalar_from = 0;
  if (vectorized) {
    const int64_t quads = n >> 2;
    for (int64_t q = thread_index(); q < quads; q += stride) op.quad(q);
    scalar_from = quads << 2;
  }
  for (int64_t i = scalar_from + thread_index(); i < n; i += stride) op.scalar(i);
}

template <class Op>
static int launch_map(const Op &op, int64_t n, bool vectorized, void *stream) {
  if (n < 0) return invalid_argument();
  if (n == 0) return 0;
  const int64_t threads_needed = vectorized ? (n >> 2) + (n & 3) : n;
  K_LAUNCH(k_blocks_for(threads_needed), L2L_THREADS, 0, (cudaStream_t)stream, map_kernel<Op>)(
      op, n, vectorized);
  return k_launched();
}

static __device__ __forceinline__ float4 load4(const float *p, int64_t q) {
  return reinterpret_cast<const float4 *>(p)[q];
}
static __device__ __forceinline__ void store4(float *p, int64_t q, float4 v) {
  reinterpret_cast<float4 *>(p)[q] = v;
}

#endif /* L2L_KERNELS_MAP_CUH */
