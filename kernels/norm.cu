/* SPDX-License-Identifier: MIT */
/* norm.cu — row-wise ops on the GPU: LayerNorm (forward, backward, backward from the
 * output, fused residual add + forward), masked/causal softmax (forward, backward) and
 * cross-entropy (forward, backward, fused).
 *
 * Purpose: match the CPU backend's ops of the same names (src/backend/cpu/: fp32
 * throughout, the same formulas in the same operand order, accurate expf/logf/sqrtf) while
 * touching each row of global memory as few times as possible. Every op is "reduce over a
 * row, then map over the row", so all kernels share one shape: a *row group* (one warp for
 * rows of at most WARP_ROW_MAX_COLS, else one block) owns a row at a time in a grid-stride
 * loop over rows; it reads the row once into shared memory where the row fits (else later
 * passes re-read global memory, mostly from L2), reduces with warp shuffles or
 * l2l_block_sum/max, and maps. Parameter gradients (LayerNorm dweight/dbias) are summed in
 * a fixed order, never with atomics, so they are bit-identical from run to run.
 * Must never: synchronize, allocate, print, keep state between launches, or read an
 * output before writing it unless the op accumulates into it (dweight, dbias).
 */
#include "norm.h"

#include <math.h>

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
/* Grid-stride loops cover rows beyond this many blocks. */
constexpr int64_t MAX_BLOCKS = int64_t(1) << 20;
/* LayerNorm backward: per-thread parameter-gradient partials kept in registers; columns
   past OWN_REG * threads (cols > 8192 at 1024 threads) accumulate in the scratch row. */
constexpr int OWN_REG = 8;
/* LayerNorm backward: most row groups (= partial-sum rows in the scratch). */
constexpr int64_t MAX_PARTIAL_GROUPS = 1024;

/* Floats a row's cache needs: the row plus up to 3 floats of shift that make the cache
   congruent to its global row modulo 16 bytes (so both take float4 at the same indices),
   rounded up to keep the next cache 16-byte aligned. */
__host__ __device__ __forceinline__ int64_t padded_cols(int64_t cols) {
  return (cols + 3 + 3) / 4 * 4;
}

static_assert(2 * (WARP_ROW_MAX_COLS + 6) * 4 * WARPS_PER_BLOCK <= ROW_CACHE_BYTES,
              "warp mode must always fit two cached rows per warp (LayerNorm backward "
              "reuses them for its partial sums)");
static_assert(WARP_ROW_MAX_COLS <= OWN_REG * 32,
              "warp mode must keep every parameter-gradient partial in registers");

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
   threads through a cache must barrier before re-laying it for another row. */
template <class Op>
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
  for (int64_t c = t; c < chunks; c += T) op(Width<4>{}, head + 4 * c);
  for (int64_t j = head + 4 * chunks + t; j < n; j += T) op(Width<1>{}, j);
}

/* LayerNorm backward's fixed element-to-thread map (the same for every row, so each
   thread keeps its columns' parameter-gradient partials across rows): with vec (every row
   16-byte aligned) float4 chunk c = t + k T, else element t + k T. The first OWN_REG
   elements a thread owns accumulate in reg_w / reg_b (registers once unrolled), the rest
   in glob_w / glob_b at their column (NULL passes NULL). op(Width, j, acc_w, acc_b). */
template <class Op>
__device__ __forceinline__ void for_owned(int64_t n, bool vec, int t, int T, float *reg_w,
                                          float *reg_b, float *glob_w, float *glob_b, Op op) {
  if (vec) {
#pragma unroll
    for (int k = 0; k < OWN_REG / 4; k++) {
      const int64_t j = 4 * ((int64_t)k * T + t);
      if (j < n) op(Width<4>{}, j, reg_w + 4 * k, reg_b + 4 * k);
    }
    for (int64_t j = 4 * ((int64_t)(OWN_REG / 4) * T + t); j < n; j += 4 * (int64_t)T)
      op(Width<4>{}, j, glob_w ? glob_w + j : nullptr, glob_b ? glob_b + j : nullptr);
  } else {
#pragma unroll
    for (int k = 0; k < OWN_REG; k++) {
      const int64_t j = (int64_t)k * T + t;
      if (j < n) op(Width<1>{}, j, reg_w + k, reg_b + k);
    }
    for (int64_t j = (int64_t)OWN_REG * T + t; j < n; j += T)
      op(Width<1>{}, j, glob_w ? glob_w + j : nullptr, glob_b ? glob_b + j : nullptr);
  }
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
   l2l_block_sum/max are never divergent. */
template <bool WARP>
__device__ __forceinline__ float group_sum(float v, float *red) {
  if constexpr (WARP)
    return l2l_warp_sum(v);
  else
    return l2l_block_sum(v, red);
}

template <bool WARP>
__device__ __forceinline__ float group_max(float v, float *red) {
  if constexpr (WARP)
    return l2l_warp_max(v);
  else
    return l2l_block_max(v, red);
}

/* Orders the group's memory accesses (shuffles alone do not). */
template <bool WARP>
__device__ __forceinline__ void group_sync() {
  if constexpr (WARP)
    __syncwarp();
  else
    __syncthreads();
}

/* ---------------------------------------------------------------- LayerNorm forward */

/* y = LayerNorm(x) per row, or with addend: sum_out = x + addend first and y =
   LayerNorm(sum_out). Three passes as the CPU: mean, then the centred sum of squares (no
   E[x^2] - E[x]^2 cancellation), then y; the first reads global memory (and caches), the
   others read the cache when the row fits. */
template <bool WARP>
__global__ void __launch_bounds__(1024)
    layernorm_forward_kernel(float *y, float *mean_out, float *rstd_out, float *sum_out,
                             const float *x, const float *addend, const float *weight,
                             const float *bias, float eps, int64_t rows, int64_t cols,
                             bool cache_rows) {
  __shared__ float red[32];
  extern __shared__ float4 row_cache[];
  const RowGroup g = row_group<WARP>();
  float *slice =
      cache_rows ? reinterpret_cast<float *>(row_cache) + g.slot * padded_cols(cols) : nullptr;
  const bool fused = addend != nullptr;
  const bool vec_in = !fused || (congruent(x, addend) && congruent(x, sum_out));
  /* Uncached rows are re-read from sum_out (fused: a or b may be overwritten by it). */
  const float *reread = fused ? sum_out : x;
  const bool vec_out = congruent(y, cache_rows ? x : reread);

  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int64_t off = row * cols;
    const float *xr = x + off;
    float *cache = slice ? slice + cache_shift(xr) : nullptr;

    float s = 0.0f;
    for_row(xr, cols, vec_in, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      Pack<W> v = load_pack<W>(xr + j);
      if (fused) {
        /* sum may be a or b: this thread reads both before writing the same elements. */
        const Pack<W> b = load_pack<W>(addend + off + j);
#pragma unroll
        for (int e = 0; e < W; e++) v.v[e] += b.v[e];
        store_pack<W>(sum_out + off + j, v);
      }
      if (cache) store_pack<W>(cache + j, v);
#pragma unroll
      for (int e = 0; e < W; e++) s += v.v[e];
    });
    const float mean = group_sum<WARP>(s, red) / (float)cols;
    group_sync<WARP>(); /* the cache / sum_out row, written by the whole group, is read next */

    const float *src = cache ? cache : reread + off;
    float sq = 0.0f;
    for_row(src, cols, true, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      const Pack<W> v = load_pack<W>(src + j);
#pragma unroll
      for (int e = 0; e < W; e++) {
        const float d = v.v[e] - mean;
        sq += d * d;
      }
    });
    const float rstd = 1.0f / sqrtf(group_sum<WARP>(sq, red) / (float)cols + eps);

    float *yr = y + off;
    for_row(src, cols, vec_out, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      const Pack<W> v = load_pack<W>(src + j);
      Pack<W> o;
#pragma unroll
      for (int e = 0; e < W; e++) o.v[e] = (v.v[e] - mean) * rstd * weight[j + e] + bias[j + e];
      store_pack<W>(yr + j, o);
    });
    if (g.t == 0) {
      if (mean_out) mean_out[row] = mean;
      if (rstd_out) rstd_out[row] = rstd;
    }
    group_sync<WARP>(); /* the next row lays the cache out with another thread map */
  }
}

/* ---------------------------------------------------------------- LayerNorm backward */

/* dx per row as the CPU's layernorm_backward_rows; with partials, each block also writes
   its rows' sums of dy x^ (partials row blockIdx.x) and dy (row gridDim.x + blockIdx.x),
   which column_partials_kernel then adds up in block order. Warp groups first add their
   block's warps in warp order through shared memory. x^ = FROM_OUTPUT ? (src - shift) *
   (1/weight) : (src - mean) rstd. */
template <bool WARP, bool FROM_OUTPUT>
__global__ void __launch_bounds__(1024)
    layernorm_backward_kernel(float *dx, float *partials, const float *dy, const float *src,
                              const float *weight, const float *mean, const float *shift,
                              const float *rstd, int64_t rows, int64_t cols, bool cache_rows,
                              bool vec) {
  __shared__ float red[32];
  extern __shared__ float4 row_cache[];
  const RowGroup g = row_group<WARP>();
  const int64_t padded = padded_cols(cols);
  /* Two caches per group: dy, then src. In vec mode every row is 16-byte aligned, so the
     caches need no shift; otherwise only scalars touch them. */
  float *slice =
      cache_rows ? reinterpret_cast<float *>(row_cache) + g.slot * 2 * padded : nullptr;
  const bool grads = partials != nullptr;
  const int64_t groups = gridDim.x;
  float *block_w = grads && !WARP ? partials + blockIdx.x * cols : nullptr;
  float *block_b = grads && !WARP ? partials + (groups + blockIdx.x) * cols : nullptr;
  float acc_w[OWN_REG] = {}, acc_b[OWN_REG] = {};

  /* Columns past the register partials accumulate in this block's scratch rows. */
  if (block_w)
    for_owned(cols, vec, g.t, g.T, acc_w, acc_b, block_w, block_b,
              [&](auto w, int64_t, float *aw, float *ab) {
                constexpr int W = decltype(w)::value;
#pragma unroll
                for (int e = 0; e < W; e++) aw[e] = 0.0f, ab[e] = 0.0f;
              });

  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int64_t off = row * cols;
    const float *dyr = dy + off, *sr = src + off;
    float *dxr = dx + off;
    float *cache_dy = slice, *cache_src = slice ? slice + padded : nullptr;
    const float mu = FROM_OUTPUT ? 0.0f : mean[row], rs = rstd[row];
    auto xhat = [&](int64_t j, float v) -> float {
      if constexpr (FROM_OUTPUT)
        return (v - shift[j]) * __frcp_rn(weight[j]); /* = the CPU's 1.0f / weight[j] */
      else
        return (v - mu) * rs;
    };

    float sum_g = 0.0f, sum_gx = 0.0f;
    for_owned(cols, vec, g.t, g.T, acc_w, acc_b, nullptr, nullptr,
              [&](auto w, int64_t j, float *, float *) {
                constexpr int W = decltype(w)::value;
                const Pack<W> d = load_pack<W>(dyr + j), v = load_pack<W>(sr + j);
                if (cache_dy) store_pack<W>(cache_dy + j, d), store_pack<W>(cache_src + j, v);
#pragma unroll
                for (int e = 0; e < W; e++) {
                  const float gg = d.v[e] * weight[j + e];
                  sum_g += gg;
                  sum_gx += gg * xhat(j + e, v.v[e]);
                }
              });
    const float mean_g = group_sum<WARP>(sum_g, red) / (float)cols;
    const float mean_gx = group_sum<WARP>(sum_gx, red) / (float)cols;
    group_sync<WARP>(); /* dx may be dy: all of this row's dy is read before dx is written */

    const float *pdy = cache_dy ? cache_dy : dyr, *psrc = cache_dy ? cache_src : sr;
    for_owned(cols, vec, g.t, g.T, acc_w, acc_b, block_w, block_b,
              [&](auto w, int64_t j, float *aw, float *ab) {
                constexpr int W = decltype(w)::value;
                const Pack<W> d = load_pack<W>(pdy + j), v = load_pack<W>(psrc + j);
                Pack<W> o;
#pragma unroll
                for (int e = 0; e < W; e++) {
                  const float xh = xhat(j + e, v.v[e]);
                  if (grads) aw[e] += d.v[e] * xh, ab[e] += d.v[e];
                  o.v[e] = rs * (d.v[e] * weight[j + e] - mean_g - xh * mean_gx);
                }
                store_pack<W>(dxr + j, o);
              });
  }

  if (!grads) return; /* uniform over the grid */
  if constexpr (WARP) {
    /* Each warp parks its partials in its own cache slice, then the block adds its warps
       in warp order (every warp reaches the barrier; none returned early). */
    float *mine = reinterpret_cast<float *>(row_cache) + g.slot * 2 * padded;
    __syncwarp();
    for_owned(cols, vec, g.t, g.T, acc_w, acc_b, nullptr, nullptr,
              [&](auto w, int64_t j, float *aw, float *ab) {
                constexpr int W = decltype(w)::value;
#pragma unroll
                for (int e = 0; e < W; e++) mine[j + e] = aw[e], mine[padded + j + e] = ab[e];
              });
    __syncthreads();
    const int warps = (int)(blockDim.x >> 5);
    const float *all = reinterpret_cast<const float *>(row_cache);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float sw = 0.0f, sb = 0.0f;
      for (int k = 0; k < warps; k++) {
        sw += all[k * 2 * padded + j];
        sb += all[k * 2 * padded + padded + j];
      }
      partials[blockIdx.x * cols + j] = sw;
      partials[(groups + blockIdx.x) * cols + j] = sb;
    }
  } else {
    /* Overflow columns are already in place (aw == block_w + j there). */
    for_owned(cols, vec, g.t, g.T, acc_w, acc_b, block_w, block_b,
              [&](auto w, int64_t j, float *aw, float *ab) {
                constexpr int W = decltype(w)::value;
#pragma unroll
                for (int e = 0; e < W; e++) block_w[j + e] = aw[e], block_b[j + e] = ab[e];
              });
  }
}

/* dweight[j] += sum over groups of partials[p][j], dbias[j] += the same over the second
   half, in a fixed order: 32 threads per column each take every 32nd partial row, then
   one thread adds the 32 results in order. Block (32, 32): x = column in the tile. */
__global__ void __launch_bounds__(1024)
    column_partials_kernel(float *dweight, float *dbias, const float *partials, int64_t groups,
                           int64_t cols) {
  __shared__ float tile_w[32][33], tile_b[32][33];
  const int x = (int)threadIdx.x, yv = (int)threadIdx.y;
  for (int64_t j0 = (int64_t)blockIdx.x * 32; j0 < cols; j0 += (int64_t)gridDim.x * 32) {
    const int64_t j = j0 + x;
    float sw = 0.0f, sb = 0.0f;
    if (j < cols)
      for (int64_t p = yv; p < groups; p += 32) {
        sw += partials[p * cols + j];
        sb += partials[(groups + p) * cols + j];
      }
    tile_w[yv][x] = sw, tile_b[yv][x] = sb;
    __syncthreads();
    if (yv == 0 && j < cols) {
      float tw = 0.0f, tb = 0.0f;
      for (int i = 0; i < 32; i++) tw += tile_w[i][x], tb += tile_b[i][x];
      if (dweight) dweight[j] += tw;
      if (dbias) dbias[j] += tb;
    }
    __syncthreads();
  }
}

/* ---------------------------------------------------------------- softmax */

/* As cpu_softmax_forward: max of the visible scale x, then the sum of their exps, then y;
   the row is cached by the first pass where it fits. */
template <bool WARP>
__global__ void __launch_bounds__(1024)
    softmax_forward_kernel(float *y, const float *x, const uint8_t *key_mask, int causal,
                           float scale, int64_t rows, int64_t rows_per_sample, int64_t tq,
                           int64_t tk, bool cache_rows) {
  __shared__ float red[32];
  extern __shared__ float4 row_cache[];
  const RowGroup g = row_group<WARP>();
  float *slice =
      cache_rows ? reinterpret_cast<float *>(row_cache) + g.slot * padded_cols(tk) : nullptr;
  const bool vec_out = congruent(y, x);

  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int64_t off = row * tk;
    const float *xr = x + off;
    float *yr = y + off;
    const uint8_t *mask = key_mask ? key_mask + (row / rows_per_sample) * tk : nullptr;
    const int64_t query = row % tq;
    int64_t limit = causal ? query + (tk - tq) + 1 : tk; /* keys [0, limit) are visible */
    if (limit > tk) limit = tk;
    if (limit < 0) limit = 0;
    float *cache = slice ? slice + cache_shift(xr) : nullptr;

    float mx = -INFINITY;
    for_row(xr, limit, true, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      const Pack<W> v = load_pack<W>(xr + j);
      if (cache) store_pack<W>(cache + j, v);
#pragma unroll
      for (int e = 0; e < W; e++) {
        const float z = (mask && !mask[j + e]) ? -INFINITY : scale * v.v[e];
        mx = z > mx ? z : mx;
      }
    });
    mx = group_max<WARP>(mx, red); /* its barrier also publishes the cache */
    const bool hidden = mx == -INFINITY; /* every key hidden: the row is all zeros */

    const float *src = cache ? cache : xr;
    float sum = 0.0f;
    if (!hidden)
      for_row(src, limit, true, g.t, g.T, [&](auto w, int64_t j) {
        constexpr int W = decltype(w)::value;
        const Pack<W> v = load_pack<W>(src + j);
#pragma unroll
        for (int e = 0; e < W; e++)
          if (!mask || mask[j + e]) sum += expf(scale * v.v[e] - mx);
      });
    sum = group_sum<WARP>(sum, red); /* outside the branch: hidden is group-uniform anyway */
    const float inv = 1.0f / sum;    /* unused when hidden */

    /* y may be x: each thread reads the elements it writes, after every read above. A
       float4 chunk straddling limit reads x (or the cache's spare floats) past limit but
       inside the row; those values are discarded. */
    for_row(src, tk, vec_out, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      Pack<W> o;
      if (!hidden && j < limit) {
        const Pack<W> v = load_pack<W>(src + j);
#pragma unroll
        for (int e = 0; e < W; e++) {
          const int64_t k = j + e;
          o.v[e] = (k < limit && (!mask || mask[k])) ? expf(scale * v.v[e] - mx) * inv : 0.0f;
        }
      } else {
#pragma unroll
        for (int e = 0; e < W; e++) o.v[e] = 0.0f;
      }
      store_pack<W>(yr + j, o);
    });
    group_sync<WARP>(); /* the next row lays the cache out with another thread map */
  }
}

/* dx = scale y (dy - dot(dy, y)); dy and y are cached by the dot pass where they fit. */
template <bool WARP>
__global__ void __launch_bounds__(1024)
    softmax_backward_kernel(float *dx, const float *dy, const float *y, float scale,
                            int64_t rows, int64_t cols, bool cache_rows) {
  __shared__ float red[32];
  extern __shared__ float4 row_cache[];
  const RowGroup g = row_group<WARP>();
  const int64_t padded = padded_cols(cols);
  float *slice =
      cache_rows ? reinterpret_cast<float *>(row_cache) + g.slot * 2 * padded : nullptr;
  const bool vec_in = congruent(dy, y), vec_out = vec_in && congruent(dx, dy);

  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int64_t off = row * cols;
    const float *dyr = dy + off, *yr = y + off;
    float *dxr = dx + off;
    float *cache_dy = slice ? slice + cache_shift(dyr) : nullptr;
    float *cache_y = slice ? slice + padded + cache_shift(yr) : nullptr;

    float dot = 0.0f;
    for_row(dyr, cols, vec_in, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      const Pack<W> a = load_pack<W>(dyr + j), b = load_pack<W>(yr + j);
      if (cache_dy) store_pack<W>(cache_dy + j, a), store_pack<W>(cache_y + j, b);
#pragma unroll
      for (int e = 0; e < W; e++) dot += a.v[e] * b.v[e];
    });
    dot = group_sum<WARP>(dot, red);
    group_sync<WARP>(); /* dx may be dy: the row's dy is all read (and cached) first */

    const float *pdy = cache_dy ? cache_dy : dyr, *py = cache_dy ? cache_y : yr;
    for_row(pdy, cols, vec_out, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      const Pack<W> a = load_pack<W>(pdy + j), b = load_pack<W>(py + j);
      Pack<W> o;
#pragma unroll
      for (int e = 0; e < W; e++) o.v[e] = scale * b.v[e] * (a.v[e] - dot);
      store_pack<W>(dxr + j, o);
    });
    group_sync<WARP>(); /* the next row lays the cache out with another thread map */
  }
}

/* ---------------------------------------------------------------- cross-entropy */

/* One streaming read per row gives max and sum of exps (online: the running sum is
   rescaled when the max grows), then losses and/or dlogits. Rows are vocabulary-long
   (too long to cache); the write pass re-reads them, mostly from L2. */
template <bool WARP>
__global__ void __launch_bounds__(1024)
    cross_entropy_kernel(float *losses, float *dlogits, const float *logits,
                         const int32_t *targets, int32_t ignore_index, float scale,
                         int64_t rows, int64_t vocab) {
  __shared__ float red[32];
  const RowGroup g = row_group<WARP>();
  const bool vec_out = dlogits && congruent(dlogits, logits);

  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int32_t target = targets[row];
    const bool ignored = target == ignore_index;
    const bool known = !ignored && target >= 0 && (int64_t)target < vocab;
    const float *lr = logits + row * vocab;
    /* Taken before any write: dlogits may be logits. */
    float target_logit = 0.0f;
    if (losses && known && g.t == 0) target_logit = lr[target];

    float m = -INFINITY, s = 0.0f;
    if (!ignored)
      for_row(lr, vocab, true, g.t, g.T, [&](auto w, int64_t j) {
        constexpr int W = decltype(w)::value;
        const Pack<W> v = load_pack<W>(lr + j);
#pragma unroll
        for (int e = 0; e < W; e++) {
          const float z = v.v[e];
          if (z > m) {
            s = s * expf(m - z) + 1.0f; /* m = -inf at first: s is 0 and stays 0 * 0 */
            m = z;
          } else if (z != -INFINITY) { /* -inf adds 0; skipping it avoids -inf - -inf */
            s += expf(z - m);           /* NaN logits reach here and poison s, as on the CPU */
          }
        }
      });
    const float m_all = group_max<WARP>(m, red);
    const float s_all = group_sum<WARP>(s == 0.0f ? 0.0f : s * expf(m - m_all), red);
    const float lse = m_all + logf(s_all);
    if (losses && g.t == 0) losses[row] = ignored ? 0.0f : known ? lse - target_logit : NAN;

    if (dlogits) {
      group_sync<WARP>(); /* in place: every read of this row above precedes the writes */
      float *dr = dlogits + row * vocab;
      for_row(lr, vocab, vec_out, g.t, g.T, [&](auto w, int64_t j) {
        constexpr int W = decltype(w)::value;
        Pack<W> o;
        if (ignored) {
#pragma unroll
          for (int e = 0; e < W; e++) o.v[e] = 0.0f;
        } else {
          const Pack<W> v = load_pack<W>(lr + j);
#pragma unroll
          for (int e = 0; e < W; e++) {
            float d = scale * expf(v.v[e] - lse);
            if (j + e == target) d -= scale;
            o.v[e] = d;
          }
        }
        store_pack<W>(dr + j, o);
      });
    }
  }
}

/* ---------------------------------------------------------------- launch shapes */

struct RowLaunch {
  bool warp_mode, cache;
  unsigned threads, blocks;
  size_t smem;
};

/* Groups, threads and row caches for rows of `cols` floats, `cached_arrays` row arrays
   kept on chip per group, at most max_blocks blocks. Warp mode always caches (it fits). */
RowLaunch row_launch(int64_t rows, int64_t cols, int cached_arrays, int64_t max_blocks) {
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

/* LayerNorm backward's row groups = partial-sum rows: enough blocks to fill a large GPU
   (fewer for wide rows, whose blocks are 1024 threads), at most MAX_PARTIAL_GROUPS. */
int64_t layernorm_partial_groups(int64_t rows, int64_t cols) {
  if (cols <= WARP_ROW_MAX_COLS) {
    int64_t blocks = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    return blocks < MAX_PARTIAL_GROUPS ? blocks : MAX_PARTIAL_GROUPS;
  }
  int64_t cap = (int64_t(1) << 22) / cols;
  if (cap < 256) cap = 256;
  if (cap > MAX_PARTIAL_GROUPS) cap = MAX_PARTIAL_GROUPS;
  return rows < cap ? rows : cap;
}

constexpr int INVALID = (int)cudaErrorInvalidValue;

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* fused: sum = x + addend first (both required then). */
int launch_layernorm_forward(bool fused, float *sum, float *y, float *mean, float *rstd,
                             const float *x, const float *addend, const float *weight,
                             const float *bias, float eps, int64_t rows, int64_t cols,
                             void *stream) {
  if (rows < 0 || cols < 0) return INVALID;
  if (rows == 0 || cols == 0) return 0;
  if (!y || !x || !weight || !bias || (fused && (!addend || !sum))) return INVALID;
  const RowLaunch l = row_launch(rows, cols, 1, MAX_BLOCKS);
  cudaStream_t s = (cudaStream_t)stream;
  if (l.warp_mode)
    layernorm_forward_kernel<true><<<l.blocks, l.threads, l.smem, s>>>(
        y, mean, rstd, sum, x, addend, weight, bias, eps, rows, cols, l.cache);
  else
    layernorm_forward_kernel<false><<<l.blocks, l.threads, l.smem, s>>>(
        y, mean, rstd, sum, x, addend, weight, bias, eps, rows, cols, l.cache);
  return l2l_launched();
}

template <bool FROM_OUTPUT>
int launch_layernorm_backward(float *dx, float *dweight, float *dbias, const float *dy,
                              const float *src, const float *weight, const float *mean,
                              const float *shift, const float *rstd, int64_t rows,
                              int64_t cols, float *scratch, void *stream) {
  if (rows < 0 || cols < 0) return INVALID;
  if (rows == 0 || cols == 0) return 0;
  if (!dx || !dy || !src || !weight || !rstd || (FROM_OUTPUT ? !shift : !mean))
    return INVALID;
  const bool grads = dweight || dbias;
  if (grads && !scratch) return INVALID;
  const int64_t groups = layernorm_partial_groups(rows, cols);
  const RowLaunch l = row_launch(rows, cols, 2, groups);
  /* Every row 16-byte aligned: the fixed per-thread column map can use float4. */
  const bool vec = cols % 4 == 0 && aligned16(dy) && aligned16(src) && aligned16(dx);
  float *partials = grads ? scratch : nullptr;
  cudaStream_t s = (cudaStream_t)stream;
  if (l.warp_mode)
    layernorm_backward_kernel<true, FROM_OUTPUT><<<l.blocks, l.threads, l.smem, s>>>(
        dx, partials, dy, src, weight, mean, shift, rstd, rows, cols, l.cache, vec);
  else
    layernorm_backward_kernel<false, FROM_OUTPUT><<<l.blocks, l.threads, l.smem, s>>>(
        dx, partials, dy, src, weight, mean, shift, rstd, rows, cols, l.cache, vec);
  int status = l2l_launched();
  if (status != 0 || !grads) return status;
  int64_t tiles = (cols + 31) / 32;
  if (tiles > MAX_BLOCKS) tiles = MAX_BLOCKS;
  column_partials_kernel<<<(unsigned)tiles, dim3(32, 32), 0, s>>>(dweight, dbias, scratch,
                                                                  (int64_t)l.blocks, cols);
  return l2l_launched();
}

/* need_losses / need_dlogits: that output is required (the unfused ops); the fused one
   writes whichever it is given. */
int launch_cross_entropy(bool need_losses, bool need_dlogits, float *losses, float *dlogits,
                         const float *logits, const int32_t *targets, int32_t ignore_index,
                         float scale, int64_t rows, int64_t vocab, void *stream) {
  if (rows < 0 || vocab < 0) return INVALID;
  if (rows == 0 || vocab == 0) return 0;
  if (!logits || !targets || (need_losses && !losses) || (need_dlogits && !dlogits))
    return INVALID;
  if (!losses && !dlogits) return 0;
  const RowLaunch l = row_launch(rows, vocab, 0, MAX_BLOCKS);
  cudaStream_t s = (cudaStream_t)stream;
  if (l.warp_mode)
    cross_entropy_kernel<true><<<l.blocks, l.threads, 0, s>>>(
        losses, dlogits, logits, targets, ignore_index, scale, rows, vocab);
  else
    cross_entropy_kernel<false><<<l.blocks, l.threads, 0, s>>>(
        losses, dlogits, logits, targets, ignore_index, scale, rows, vocab);
  return l2l_launched();
}

} /* namespace */

/* ---------------------------------------------------------------- launchers */

extern "C" int l2l_k_layernorm_forward(float *y, float *mean, float *rstd, const float *x,
                                       const float *weight, const float *bias, float eps,
                                       int64_t rows, int64_t cols, void *stream) {
  return launch_layernorm_forward(false, nullptr, y, mean, rstd, x, nullptr, weight, bias, eps,
                                  rows, cols, stream);
}

extern "C" int l2l_k_add_layernorm_forward(float *sum, float *y, float *mean, float *rstd,
                                           const float *a, const float *b,
                                           const float *weight, const float *bias, float eps,
                                           int64_t rows, int64_t cols, void *stream) {
  return launch_layernorm_forward(true, sum, y, mean, rstd, a, b, weight, bias, eps, rows,
                                  cols, stream);
}

extern "C" int64_t l2l_k_layernorm_backward_scratch_floats(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return 2 * layernorm_partial_groups(rows, cols) * cols;
}

extern "C" int l2l_k_layernorm_backward(float *dx, float *dweight, float *dbias,
                                        const float *dy, const float *x, const float *weight,
                                        const float *mean, const float *rstd, int64_t rows,
                                        int64_t cols, float *scratch, void *stream) {
  return launch_layernorm_backward<false>(dx, dweight, dbias, dy, x, weight, mean, nullptr,
                                          rstd, rows, cols, scratch, stream);
}

extern "C" int l2l_k_layernorm_backward_from_output(float *dx, float *dweight, float *dbias,
                                                    const float *dy, const float *y,
                                                    const float *weight, const float *bias,
                                                    const float *rstd, int64_t rows,
                                                    int64_t cols, float *scratch,
                                                    void *stream) {
  return launch_layernorm_backward<true>(dx, dweight, dbias, dy, y, weight, nullptr, bias,
                                         rstd, rows, cols, scratch, stream);
}

extern "C" int l2l_k_softmax_forward(float *y, const float *x, const uint8_t *key_mask,
                                     int causal, float scale, int64_t samples,
                                     int64_t rows_per_sample, int64_t tq, int64_t tk,
                                     void *stream) {
  if (samples < 0 || rows_per_sample < 0 || tk < 0) return INVALID;
  const int64_t rows = samples * rows_per_sample;
  if (rows == 0 || tk == 0) return 0;
  if (!y || !x || tq < 1) return INVALID;
  const RowLaunch l = row_launch(rows, tk, 1, MAX_BLOCKS);
  cudaStream_t s = (cudaStream_t)stream;
  if (l.warp_mode)
    softmax_forward_kernel<true><<<l.blocks, l.threads, l.smem, s>>>(
        y, x, key_mask, causal, scale, rows, rows_per_sample, tq, tk, l.cache);
  else
    softmax_forward_kernel<false><<<l.blocks, l.threads, l.smem, s>>>(
        y, x, key_mask, causal, scale, rows, rows_per_sample, tq, tk, l.cache);
  return l2l_launched();
}

extern "C" int l2l_k_softmax_backward(float *dx, const float *dy, const float *y, float scale,
                                      int64_t rows, int64_t cols, void *stream) {
  if (rows < 0 || cols < 0) return INVALID;
  if (rows == 0 || cols == 0) return 0;
  if (!dx || !dy || !y) return INVALID;
  const RowLaunch l = row_launch(rows, cols, 2, MAX_BLOCKS);
  cudaStream_t s = (cudaStream_t)stream;
  if (l.warp_mode)
    softmax_backward_kernel<true><<<l.blocks, l.threads, l.smem, s>>>(dx, dy, y, scale, rows,
                                                                      cols, l.cache);
  else
    softmax_backward_kernel<false><<<l.blocks, l.threads, l.smem, s>>>(dx, dy, y, scale, rows,
                                                                       cols, l.cache);
  return l2l_launched();
}

extern "C" int l2l_k_cross_entropy_forward(float *losses, const float *logits,
                                           const int32_t *targets, int32_t ignore_index,
                                           int64_t rows, int64_t vocab, void *stream) {
  return launch_cross_entropy(true, false, losses, nullptr, logits, targets, ignore_index,
                              1.0f, rows, vocab, stream);
}

extern "C" int l2l_k_cross_entropy_backward(float *dlogits, const float *logits,
                                            const int32_t *targets, int32_t ignore_index,
                                            float scale, int64_t rows, int64_t vocab,
                                            void *stream) {
  return launch_cross_entropy(false, true, nullptr, dlogits, logits, targets, ignore_index,
                              scale, rows, vocab, stream);
}

extern "C" int l2l_k_cross_entropy_fused(float *losses, float *dlogits, const float *logits,
                                         const int32_t *targets, int32_t ignore_index,
                                         float scale, int64_t rows, int64_t vocab,
                                         void *stream) {
  return launch_cross_entropy(false, false, losses, dlogits, logits, targets, ignore_index,
                              scale, rows, vocab, stream);
}
