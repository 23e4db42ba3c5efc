/* SPDX-License-Identifier: MIT */
/* rows.cuh — the row-wise kernels' shared shape (norm.cu: LayerNorm; softmax.cu: softmax
 * and cross-entropy): row groups, row caches, vectorised row loops and launch shapes.
 *
 * Purpose: every row-wise op is "reduce over a row, then map over the row", so its kernels
 * share one shape: a *row group* (one warp for rows of at most WARP_ROW_MAX_COLS, else one
 * block) owns a row at a time in a grid-stride loop over rows; it reads the row once into
 * shared memory where the row fits (else later passes re-read global memory, mostly from
 * L2), reduces with warp shuffles or k_block_sum/max, and maps. This header says how a
 * group finds its rows and threads, walks a row (float4 where aligned), reduces, and how
 * many blocks, threads and bytes of cache a launch takes, once for both files.
 * Must never: hold a kernel or a launcher of an op (those are the .cu files'), or state
 * (each file gets its own copy of these inline helpers).
 */
#ifndef L2L_KERNELS_ROWS_CUH
#define L2L_KERNELS_ROWS_CUH

#include <stdint.h>

#include "common.cuh"

namespace {

/* ---------------------------------------------------------------- sizes */

/* Rows this short get one warp each (8 rows per 256-thread block): a whole block per
   row would leave most of its threads idle and cap residency at 32 blocks per SM. */
constexpr int64_t WARP_ROW_MAX_COLS = 256;
constexpr int WARPS_PER_BLOCK = 8;
/* Dynamic shared memory a block may use to keep its rows on chip: below the 48 KiB that
   needs no opt-in (cudaFuncSetAttribute), with room for the static reduction scratch. */
constexpr int64_t ROW_CACHE_BYTES = 44 * 1024;
/* Grid-stride loops cover rows beyond this many blocks (the CPU emulation of the kernels
   sets fewer, so that its groups walk several rows). */
#ifndef K_ROW_MAX_BLOCKS
#define K_ROW_MAX_BLOCKS (int64_t(1) << 20)
#endif
constexpr int64_t MAX_BLOCKS = K_ROW_MAX_BLOCKS;

/* Floats a row's cache needs: the row plus up to 3 floats of shift that make the cache
   congruent to its global row modulo 16 bytes (so both take float4 at the same indices),
   rounded up to keep the next cache 16-byte aligned. */
__host__ __device__ __forceinline__ int64_t padded_cols(int64_t cols) {
  return (cols + 3 + 3) / 4 * 4;
}

static_assert(2 * (WARP_ROW_MAX_COLS + 6) * 4 * WARPS_PER_BLOCK <= ROW_CACHE_BYTES,
              "warp mode must always fit two cached rows per warp (LayerNorm backward "
              "reuses them for its partial sums)");

/* ---------------------------------------------------------------- row iteration */

template <int W>
struct Width {
  static constexpr int value = W;
};

template <int W>
struct Pack {
  float v[W];
};

/* W consecutive floats; W = 4 needs p 16-byte aligned. */
template <int W>
__device__ __forceinline__ Pack<W> load_pack(const float *p) {
  Pack<W> out;
  if constexpr (W == 4) {
    const float4 q = *reinterpret_cast<const float4 *>(p);
    out.v[0] = q.x, out.v[1] = q.y, out.v[2] = q.z, out.v[3] = q.w;
  } else {
    out.v[0] = *p;
  }
  return out;
}

template <int W>
__device__ __forceinline__ void store_pack(float *p, const Pack<W> &in) {
  if constexpr (W == 4)
    *reinterpret_cast<float4 *>(p) = make_float4(in.v[0], in.v[1], in.v[2], in.v[3]);
  else
    *p = in.v[0];
}

/* W floats rounded to f16 or bf16 (dtype DT_F16 / DT_BF16) as k_convert rounds them: four
   in one 8-byte store where p is 8-byte aligned, else a 16-bit store each. */
template <int W>
__device__ __forceinline__ void store_half_pack(uint16_t *p, const Pack<W> &in, int dtype) {
  if constexpr (W == 4)
    store_halves4(p, in.v[0], in.v[1], in.v[2], in.v[3], dtype, ((uintptr_t)p & 7) == 0);
  else
    *p = f32_to_16(in.v[0], dtype);
}

__device__ __forceinline__ bool congruent(const void *a, const void *b) {
  return (((uintptr_t)a ^ (uintptr_t)b) & 15) == 0;
}

/* How many floats to shift a row's shared-memory cache so it is congruent to p mod 16. */
__device__ __forceinline__ int64_t cache_shift(const float *p) {
  return (int64_t)(((uintptr_t)p >> 2) & 3);
}

/* Calls op(Width<1 or 4>, j) so that the group's threads (t of T) cover [0, n) once each:
   with vec, a scalar head up to anchor's first 16-byte boundary, float4 chunks, a scalar
   tail; without, scalars. The caller passes vec only when every row pointer op touches
   at j is congruent to anchor mod 16 (then they are all aligned wherever anchor + j is).
   Which thread gets which j depends on anchor's alignment: code that shares data between
   threads through a cache must barrier before re-laying it for another row. UNROLL > 1:
   a thread takes its float4 chunks UNROLL at a time, with no branch between them, so that
   that many loads can be in flight at once (a streaming read's bytes in flight per SM);
   which thread takes which chunk is the same. */
template <int UNROLL = 1, class Op>
__device__ __forceinline__ void for_row(const float *anchor, int64_t n, bool vec, int t, int T,
                                        Op op) {
  if (!vec) {
    for (int64_t j = t; j < n; j += T) op(Width<1>{}, j);
    return;
  }
  int64_t head = (int64_t)(((16 - ((uintptr_t)anchor & 15)) & 15) >> 2);
  if (head > n) head = n;
  if (t < head) op(Width<1>{}, (int64_t)t);
  const int64_t chunks = (n - head) >> 2;
  int64_t c = t;
  if constexpr (UNROLL > 1)
    for (; c + (UNROLL - 1) * (int64_t)T < chunks; c += UNROLL * (int64_t)T) {
#pragma unroll
      for (int u = 0; u < UNROLL; u++) op(Width<4>{}, head + 4 * (c + u * (int64_t)T));
    }
  for (; c < chunks; c += T) op(Width<4>{}, head + 4 * c);
  for (int64_t j = head + 4 * chunks + t; j < n; j += T) op(Width<1>{}, j);
}

/* ---------------------------------------------------------------- row groups */

/* This thread's place: t of T threads on the group's row; rows first, first + stride, ...;
   slot = the group's index within its block (its slice of the row cache). */
struct RowGroup {
  int t, T, slot;
  int64_t first, stride;
};

template <bool WARP>
__device__ __forceinline__ RowGroup row_group() {
  RowGroup g;
  if constexpr (WARP) {
    const int warps = (int)(blockDim.x >> 5);
    g.t = (int)(threadIdx.x & 31), g.T = 32, g.slot = (int)(threadIdx.x >> 5);
    g.first = (int64_t)blockIdx.x * warps + g.slot;
    g.stride = (int64_t)gridDim.x * warps;
  } else {
    g.t = (int)threadIdx.x, g.T = (int)blockDim.x, g.slot = 0;
    g.first = blockIdx.x;
    g.stride = gridDim.x;
  }
  return g;
}

/* Group-wide sum / max: every thread of the group gets the same bits. Block groups run
   the row loop in lockstep (the row index is block-uniform), so the barriers inside
   k_block_sum/max are never divergent. */
template <bool WARP>
__device__ __forceinline__ float group_sum(float v, float *red) {
  if constexpr (WARP)
    return k_warp_sum(v);
  else
    return k_block_sum(v, red);
}

template <bool WARP>
__device__ __forceinline__ float group_max(float v, float *red) {
  if constexpr (WARP)
    return k_warp_max(v);
  else
    return k_block_max(v, red);
}

/* Orders the group's memory accesses (shuffles alone do not). */
template <bool WARP>
__device__ __forceinline__ void group_sync() {
  if constexpr (WARP)
    __syncwarp();
  else
    __syncthreads();
}

/* ---------------------------------------------------------------- launch shapes */

struct RowLaunch {
  bool warp_mode, cache;
  unsigned threads, blocks;
  size_t smem;
};

/* Groups, threads and row caches for rows of `cols` floats, `cached_arrays` row arrays
   kept on chip per group, at most max_blocks blocks. Warp mode always caches (it fits). */
inline RowLaunch row_launch(int64_t rows, int64_t cols, int cached_arrays, int64_t max_blocks) {
  RowLaunch l;
  l.warp_mode = cols <= WARP_ROW_MAX_COLS;
  int64_t groups_per_block;
  if (l.warp_mode) {
    l.threads = 32 * WARPS_PER_BLOCK;
    groups_per_block = WARPS_PER_BLOCK;
  } else {
    /* About 4 floats per thread (one float4), 64 to 1024 threads. */
    int64_t t = ((cols + 3) / 4 + 31) / 32 * 32;
    l.threads = (unsigned)(t < 64 ? 64 : t > 1024 ? 1024 : t);
    groups_per_block = 1;
  }
  int64_t blocks = (rows + groups_per_block - 1) / groups_per_block;
  if (blocks > max_blocks) blocks = max_blocks;
  l.blocks = (unsigned)blocks;
  const int64_t bytes = cached_arrays * padded_cols(cols) * (int64_t)sizeof(float) *
                        groups_per_block;
  l.cache = cached_arrays > 0 && (l.warp_mode || bytes <= ROW_CACHE_BYTES);
  l.smem = l.cache ? (size_t)bytes : 0;
  return l;
}

constexpr int INVALID = (int)cudaErrorInvalidValue;

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

} /* namespace */

#endif /* L2L_KERNELS_ROWS_CUH */
