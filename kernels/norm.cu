/* SPDX-License-Identifier: MIT */
/* norm.cu — LayerNorm on the GPU: forward, backward, backward from the output (frugal),
 * and the fused residual add + forward (rows of up to 4096 held in a warp's registers
 * forward, 1024 backward).
 * (softmax.cu holds the other row-wise ops.)
 *
 * Purpose: match the CPU backend's ops of the same names (src/backend/cpu/: fp32
 * throughout, the same formulas in the same operand order, accurate expf/logf/sqrtf) while
 * touching each row of global memory as few times as possible, in the row-wise kernels'
 * shape (rows.cuh: a warp or a block owns a row, cached on chip where it fits). Parameter
 * gradients (dweight/dbias) are summed in a fixed order, never with atomics, so they are
 * bit-identical from run to run.
 * Must never: synchronize, allocate, print, keep state between launches, or read an
 * output before writing it unless the op accumulates into it (dweight, dbias).
 */
#include "norm.h"

#include <math.h>

#include "rows.cuh"

namespace {

/* ---------------------------------------------------------------- LayerNorm's sizes */

/* LayerNorm backward: per-thread parameter-gradient partials kept in registers; columns
   past OWN_REG * threads (cols > 8192 at 1024 threads) accumulate in the scratch row. */
constexpr int OWN_REG = 8;
/* LayerNorm backward: most row groups (= partial-sum rows in the scratch; the CPU emulation
   sets fewer, as rows.cuh's MAX_BLOCKS). */
#ifndef K_LN_MAX_PARTIAL_GROUPS
#define K_LN_MAX_PARTIAL_GROUPS 1024
#endif
constexpr int64_t MAX_PARTIAL_GROUPS = K_LN_MAX_PARTIAL_GROUPS;

static_assert(WARP_ROW_MAX_COLS <= OWN_REG * 32,
              "warp mode must keep every parameter-gradient partial in registers");

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

/* ---------------------------------------------------------------- LayerNorm forward */

/* y = LayerNorm(x) per row, or with addend: sum_out = x + addend first and y =
   LayerNorm(sum_out). Three passes as the CPU: mean, then the centred sum of squares (no
   E[x^2] - E[x]^2 cancellation), then y; the first reads global memory (and caches), the
   others read the cache when the row fits. y16 (of y16_dtype), when not null, gets y
   rounded to nearest even as k_convert rounds (y itself may then be null). */
template <bool WARP>
__global__ void __launch_bounds__(1024)
    layernorm_forward_kernel(float *y, uint16_t *y16, int y16_dtype, float *mean_out,
                             float *rstd_out, float *sum_out, const float *x,
                             const float *addend, const float *weight, const float *bias,
                             float eps, int64_t rows, int64_t cols, bool cache_rows) {
  K_STATIC_SHARED(float, red, [32]);
  K_DYNAMIC_SHARED(float4, row_cache);
  const RowGroup g = row_group<WARP>();
  float *slice =
      cache_rows ? reinterpret_cast<float *>(row_cache) + g.slot * padded_cols(cols) : nullptr;
  const bool fused = addend != nullptr;
  const bool vec_in = !fused || (congruent(x, addend) && congruent(x, sum_out));
  /* Uncached rows are re-read from sum_out (fused: a or b may be overwritten by it). */
  const float *reread = fused ? sum_out : x;
  const bool vec_out = y == nullptr || congruent(y, cache_rows ? x : reread);

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

    float *yr = y ? y + off : nullptr;
    uint16_t *hr = y16 ? y16 + off : nullptr;
    for_row(src, cols, vec_out, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      const Pack<W> v = load_pack<W>(src + j);
      Pack<W> o;
#pragma unroll
      for (int e = 0; e < W; e++) o.v[e] = (v.v[e] - mean) * rstd * weight[j + e] + bias[j + e];
      if (yr) store_pack<W>(yr + j, o);
      if (hr) store_half_pack<W>(hr + j, o, y16_dtype);
    });
    if (g.t == 0) {
      if (mean_out) mean_out[row] = mean;
      if (rstd_out) rstd_out[row] = rstd;
    }
    group_sync<WARP>(); /* the next row lays the cache out with another thread map */
  }
}

/* ---------------------------------------------------------------- LayerNorm forward, rows in registers

   Rows of at most FWD_REG_ROW_MAX_COLS floats, a multiple of 4, x (and addend and sum)
   16-byte aligned: a warp owns a row at a time and holds it in registers (lane l the
   float4 chunks l, l + 32, ..., at most CHUNKS of them), so the row is read from memory
   once and written once, the reductions are warp shuffles alone (no shared memory, no
   block barrier between a row's passes), weight and bias are read a float4 at a time
   (from L1 after the first row) and y16 four values a store where they are aligned
   (vec_wb, vec_y, vec_h; else an element at a time: which kernel runs, and so the sums'
   grouping, depends on x's alignment alone, as the block kernel's float4 path did). The
   same formulas in the same order per element as layernorm_forward_kernel (mean, the
   centred sum of squares, y = (x - mean) rstd w + b, y16 rounded from that y); the sums'
   grouping is the warp's.
   An H200 ran that kernel at 0.25 of its copy rate for GPT-2's rows of 768, and at 0.27
   for rows of 4096 (a 7 B model's): a block per row, three block-wide reductions, y16 a
   2-byte store at a time; at 4096 a block of 1024 threads, two an SM, each with one
   row's 16 KB in flight at most. Here a row of 4096 is 32 float4s a lane (128 registers
   of the 255 a lane of a 256-thread block may have), a warp's 16 KB in flight at once.
   CHUNKS: 1, 2, 4, 8, 16 or 32 (rows of up to 128, 256, 512, 1024, 2048 or 4096). */
constexpr int FWD_REG_ROW_CHUNKS = 32;
constexpr int64_t FWD_REG_ROW_MAX_COLS = 4 * 32 * FWD_REG_ROW_CHUNKS; /* 4096 */

template <int CHUNKS>
__global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)
    layernorm_forward_regs_kernel(float *y, uint16_t *y16, int y16_dtype, float *mean_out,
                                  float *rstd_out, float *sum_out, const float *x,
                                  const float *addend, const float *weight, const float *bias,
                                  float eps, int64_t rows, int64_t cols, bool vec_wb,
                                  bool vec_y, bool vec_h) {
  const RowGroup g = row_group<true>();
  const int64_t quads = cols >> 2;
  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int64_t off = row * cols;
    float4 v[CHUNKS];
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
      const int64_t q = g.t + 32 * c;
      v[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (q >= quads) continue;
      v[c] = reinterpret_cast<const float4 *>(x + off)[q];
      if (addend) {   /* (sum, which may be x or addend, is written in the last pass) */
        const float4 b = reinterpret_cast<const float4 *>(addend + off)[q];
        v[c].x += b.x, v[c].y += b.y, v[c].z += b.z, v[c].w += b.w;
      }
      s += v[c].x, s += v[c].y, s += v[c].z, s += v[c].w;
    }
    const float mean = k_warp_sum(s) / (float)cols;
    float sq = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
      if (g.t + 32 * c >= quads) continue;
      const float d0 = v[c].x - mean, d1 = v[c].y - mean, d2 = v[c].z - mean, d3 = v[c].w - mean;
      sq += d0 * d0, sq += d1 * d1, sq += d2 * d2, sq += d3 * d3;
    }
    const float rstd = 1.0f / sqrtf(k_warp_sum(sq) / (float)cols + eps);
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
      const int64_t q = g.t + 32 * c;
      if (q >= quads) continue;
      const int64_t j = 4 * q;
      /* every read of the row is behind (a lane writes only what it read itself): a store
         among the loads would hold each later load until it is done, as sum may alias them */
      if (addend) reinterpret_cast<float4 *>(sum_out + off)[q] = v[c];
      const float4 w = vec_wb ? __ldg(reinterpret_cast<const float4 *>(weight) + q)
                              : make_float4(weight[j], weight[j + 1], weight[j + 2], weight[j + 3]);
      const float4 b = vec_wb ? __ldg(reinterpret_cast<const float4 *>(bias) + q)
                              : make_float4(bias[j], bias[j + 1], bias[j + 2], bias[j + 3]);
      const float4 o = make_float4((v[c].x - mean) * rstd * w.x + b.x,
                                   (v[c].y - mean) * rstd * w.y + b.y,
                                   (v[c].z - mean) * rstd * w.z + b.z,
                                   (v[c].w - mean) * rstd * w.w + b.w);
      if (y && vec_y) reinterpret_cast<float4 *>(y + off)[q] = o;
      else if (y) y[off + j] = o.x, y[off + j + 1] = o.y, y[off + j + 2] = o.z, y[off + j + 3] = o.w;
      if (y16) {
        const uint16_t h0 = f32_to_16(o.x, y16_dtype), h1 = f32_to_16(o.y, y16_dtype),
                       h2 = f32_to_16(o.z, y16_dtype), h3 = f32_to_16(o.w, y16_dtype);
        if (vec_h)
          reinterpret_cast<uint2 *>(y16 + off)[q] =
              make_uint2((uint32_t)h0 | (uint32_t)h1 << 16, (uint32_t)h2 | (uint32_t)h3 << 16);
        else
          y16[off + j] = h0, y16[off + j + 1] = h1, y16[off + j + 2] = h2, y16[off + j + 3] = h3;
      }
    }
    if (g.t == 0) {
      if (mean_out) mean_out[row] = mean;
      if (rstd_out) rstd_out[row] = rstd;
    }
  }
}

/* ---------------------------------------------------------------- LayerNorm backward */

/* Where a LayerNorm backward's dx goes: dx := the gradient + residual (NULL: none, and no
   0 added: -0 stays -0, as the CPU leaves it; added by __fadd_rn, not contracted into the
   formula, as the add kernel adds), dx16 := dx rounded (NULL: none). */
struct DxOut {
  float *dx;
  const float *residual;
  uint16_t *dx16;
  int dtype;
};

/* dx per row as the CPU's layernorm_backward_rows; with partials, each block also writes
   its rows' sums of dy x^ (partials row blockIdx.x) and dy (row gridDim.x + blockIdx.x),
   which column_partials_kernel then adds up in block order. Warp groups first add their
   block's warps in warp order through shared memory. x^ = FROM_OUTPUT ? (src - shift) *
   (1/weight) : (src - mean) rstd. EXTRA: out has a residual or a dx16 (a variant of its
   own, so that the plain one carries no unused pointers). Bounds as launched: a warp
   mode's block is 256 threads (declared 1024, ptxas capped it at 64 registers and it
   spilled 56-108 bytes on sm_90; three blocks an SM leave it 80 and no spill). */
template <bool WARP, bool FROM_OUTPUT, bool EXTRA>
__global__ void __launch_bounds__(WARP ? 32 * WARPS_PER_BLOCK : 1024, WARP ? 3 : 1)
    layernorm_backward_kernel(DxOut out, float *partials, const float *dy, const float *src,
                              const float *weight, const float *mean, const float *shift,
                              const float *rstd, int64_t rows, int64_t cols, bool cache_rows,
                              bool vec) {
  K_STATIC_SHARED(float, red, [32]);
  K_DYNAMIC_SHARED(float4, row_cache);
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
    float *dxr = out.dx + off;
    const float *resr = EXTRA && out.residual ? out.residual + off : nullptr;
    uint16_t *hr = EXTRA && out.dx16 ? out.dx16 + off : nullptr;
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
                if (EXTRA && resr) {   /* (read before dx is written: it may be dx or dy) */
                  const Pack<W> r = load_pack<W>(resr + j);
#pragma unroll
                  for (int e = 0; e < W; e++) o.v[e] = __fadd_rn(o.v[e], r.v[e]);
                }
                store_pack<W>(dxr + j, o);
                if (EXTRA && hr) store_half_pack<W>(hr + j, o, out.dtype);
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

/* ---------------------------------------------------------------- LayerNorm backward, rows in registers

   Rows of more than WARP_ROW_MAX_COLS and at most REG_ROW_MAX_COLS floats, a multiple of 4,
   dy, src and dx 16-byte aligned: as the forward's registers kernel, a warp owns a row at a
   time and holds its dy and src in registers (lane l the float4 chunks l, l + 32, ...), so
   each is read once and dx written once, with the row's two sums by warp shuffles alone.
   Each lane keeps its columns' parameter-gradient partials in registers across its rows;
   at the end the block's warps add theirs in warp order through shared memory (dweight's,
   then dbias's: 8 rows of cols floats) into the block's partials rows, which
   column_partials_kernel adds in block order: the same bits every run. The formulas per
   element are layernorm_backward_kernel's; the sums' grouping is the warp's.
   An H200 ran the block-per-row kernel at 0.31-0.48 of its copy rate for rows of 768 and
   1024: two block-wide reductions a row, 192-256 threads a block. Two blocks an SM where
   the registers allow it without spilling (rows of up to 768, 512 from the output). */
constexpr int REG_ROW_CHUNKS = 8;   /* (a row's dy and src both: at most 64 registers a lane) */
constexpr int64_t REG_ROW_MAX_COLS = 4 * 32 * REG_ROW_CHUNKS; /* 1024 */
template <int CHUNKS, bool FROM_OUTPUT>
__global__ void __launch_bounds__(32 * WARPS_PER_BLOCK, CHUNKS <= (FROM_OUTPUT ? 4 : 6) ? 2 : 1)
    layernorm_backward_regs_kernel(DxOut out, float *partials, const float *dy, const float *src,
                                   const float *weight, const float *mean, const float *shift,
                                   const float *rstd, int64_t rows, int64_t cols, bool vec_p) {
  K_DYNAMIC_SHARED(float4, warp_rows);   /* (WARPS_PER_BLOCK, cols) one partial each */
  const RowGroup g = row_group<true>();
  const int64_t quads = cols >> 2;
  float4 aw[CHUNKS], ab[CHUNKS];
#pragma unroll
  for (int c = 0; c < CHUNKS; c++) aw[c] = ab[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  /* weight (and, from the output, the shift and weight's reciprocal) of quad q */
  auto params = [&](int64_t q, float4 &w, float4 &sh) {
    const int64_t j = 4 * q;
    w = vec_p ? __ldg(reinterpret_cast<const float4 *>(weight) + q)
              : make_float4(weight[j], weight[j + 1], weight[j + 2], weight[j + 3]);
    if constexpr (FROM_OUTPUT)
      sh = vec_p ? __ldg(reinterpret_cast<const float4 *>(shift) + q)
                 : make_float4(shift[j], shift[j + 1], shift[j + 2], shift[j + 3]);
  };
  auto xhat = [&](float v, float w, float s, float mu, float rs) -> float {
    if constexpr (FROM_OUTPUT)
      return (v - s) * __frcp_rn(w); /* = the CPU's 1.0f / weight[j] */
    else
      return (v - mu) * rs;
  };

  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int64_t off = row * cols;
    const float mu = FROM_OUTPUT ? 0.0f : mean[row], rs = rstd[row];
    float4 d[CHUNKS], v[CHUNKS];
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
      const int64_t q = g.t + 32 * c;
      if (q >= quads) continue;
      d[c] = reinterpret_cast<const float4 *>(dy + off)[q];
      v[c] = reinterpret_cast<const float4 *>(src + off)[q];
      float4 w, sh = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      params(q, w, sh);
      const float de[4] = {d[c].x, d[c].y, d[c].z, d[c].w}, ve[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
      const float we[4] = {w.x, w.y, w.z, w.w}, se[4] = {sh.x, sh.y, sh.z, sh.w};
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float gg = de[e] * we[e];
        sum_g += gg;
        sum_gx += gg * xhat(ve[e], we[e], se[e], mu, rs);
      }
    }
    const float mean_g = k_warp_sum(sum_g) / (float)cols;
    const float mean_gx = k_warp_sum(sum_gx) / (float)cols;
    /* dx into d (dy's registers), the residual added, then stored: the residual's loads all
       come before the first store (it may be dx or dy, so a store among them would hold
       each later load behind it; a lane writes only the elements it read) */
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
      const int64_t q = g.t + 32 * c;
      if (q >= quads) continue;
      float4 w, sh = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      params(q, w, sh);
      const float de[4] = {d[c].x, d[c].y, d[c].z, d[c].w}, ve[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
      const float we[4] = {w.x, w.y, w.z, w.w}, se[4] = {sh.x, sh.y, sh.z, sh.w};
      float o[4], pw[4], pb[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float xh = xhat(ve[e], we[e], se[e], mu, rs);
        pw[e] = de[e] * xh, pb[e] = de[e];
        o[e] = rs * (de[e] * we[e] - mean_g - xh * mean_gx);
      }
      aw[c].x += pw[0], aw[c].y += pw[1], aw[c].z += pw[2], aw[c].w += pw[3];
      ab[c].x += pb[0], ab[c].y += pb[1], ab[c].z += pb[2], ab[c].w += pb[3];
      d[c] = make_float4(o[0], o[1], o[2], o[3]);
    }
    if (out.residual) {
#pragma unroll
      for (int c = 0; c < CHUNKS; c++) {
        const int64_t q = g.t + 32 * c;
        if (q >= quads) continue;
        const float4 r = reinterpret_cast<const float4 *>(out.residual + off)[q];
        d[c].x = __fadd_rn(d[c].x, r.x), d[c].y = __fadd_rn(d[c].y, r.y);
        d[c].z = __fadd_rn(d[c].z, r.z), d[c].w = __fadd_rn(d[c].w, r.w);
      }
    }
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
      const int64_t q = g.t + 32 * c;
      if (q >= quads) continue;
      reinterpret_cast<float4 *>(out.dx + off)[q] = d[c];
      if (out.dx16)   /* (rows of a multiple of 4 halves: 8-byte aligned where dx16 is) */
        store_halves4(out.dx16 + off + 4 * q, d[c].x, d[c].y, d[c].z, d[c].w, out.dtype,
                      ((uintptr_t)out.dx16 & 7) == 0);
    }
  }

  if (partials == nullptr) return; /* uniform over the grid */
  /* The block's warps in warp order: dweight's partials, then dbias's (every warp reaches
     both barriers: none returned early). */
  const int warp = (int)(threadIdx.x >> 5);
  float4 *mine = warp_rows + warp * quads;
  const float *all = reinterpret_cast<const float *>(warp_rows);
  for (int half = 0; half < 2; half++) {
#pragma unroll
    for (int c = 0; c < CHUNKS; c++)
      if (g.t + 32 * c < quads) mine[g.t + 32 * c] = half == 0 ? aw[c] : ab[c];
    __syncthreads();
    float *out = partials + ((int64_t)half * gridDim.x + blockIdx.x) * cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float s = 0.0f;
      for (int k = 0; k < WARPS_PER_BLOCK; k++) s += all[k * cols + j];
      out[j] = s;
    }
    __syncthreads();
  }
}

/* dweight[j] += sum over groups of partials[p][j], dbias[j] += the same over the second
   half, in a fixed order: 32 threads per column each take every 32nd partial row, then
   one thread adds the 32 results in order. Block (32, 32): x = column in the tile. */
__global__ void __launch_bounds__(1024)
    column_partials_kernel(float *dweight, float *dbias, const float *partials, int64_t groups,
                           int64_t cols) {
  K_STATIC_SHARED(float, tile_w, [32][33]);
  K_STATIC_SHARED(float, tile_b, [32][33]);
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

/* ---------------------------------------------------------------- launch shapes */

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

/* fused: sum = x + addend first (both required then). */
int launch_layernorm_forward(bool fused, float *sum, float *y, void *y16, int y16_dtype,
                             float *mean, float *rstd, const float *x, const float *addend,
                             const float *weight, const float *bias, float eps, int64_t rows,
                             int64_t cols, void *stream) {
  if (rows < 0 || cols < 0) return INVALID;
  if (rows == 0 || cols == 0) return 0;
  if ((!y && !y16) || !x || !weight || !bias || (fused && (!addend || !sum))) return INVALID;
  if (y16 && y16_dtype != DT_BF16 && y16_dtype != DT_F16) return INVALID;
  cudaStream_t s = (cudaStream_t)stream;
  uint16_t *h = static_cast<uint16_t *>(y16);
  /* rows that fit a warp's registers, x's rows aligned: layernorm_forward_regs_kernel */
  const bool regs = cols % 4 == 0 && cols <= FWD_REG_ROW_MAX_COLS && aligned16(x) &&
                    (!fused || (aligned16(addend) && aligned16(sum)));
  const bool vec_wb = aligned16(weight) && aligned16(bias), vec_y = !y || aligned16(y),
             vec_h = !h || ((uintptr_t)h & 7) == 0;
  if (regs) {
    const int64_t chunks = (cols / 4 + 31) / 32;
    int64_t blocks = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
#define LN_REGS(C)                                                                              \
  K_LAUNCH((unsigned)blocks, 32 * WARPS_PER_BLOCK, 0, s, layernorm_forward_regs_kernel<C>)(           \
      y, h, y16_dtype, mean, rstd, sum, x, addend, weight, bias, eps, rows, cols, vec_wb, vec_y,  \
      vec_h)
    if (chunks <= 1) LN_REGS(1);
    else if (chunks <= 2) LN_REGS(2);
    else if (chunks <= 4) LN_REGS(4);
    else if (chunks <= 8) LN_REGS(8);
    else if (chunks <= 16) LN_REGS(16);
    else LN_REGS(FWD_REG_ROW_CHUNKS);
#undef LN_REGS
    return k_launched();
  }
  const RowLaunch l = row_launch(rows, cols, 1, MAX_BLOCKS);
  if (l.warp_mode)
    K_LAUNCH(l.blocks, l.threads, l.smem, s, layernorm_forward_kernel<true>)(
        y, h, y16_dtype, mean, rstd, sum, x, addend, weight, bias, eps, rows, cols, l.cache);
  else
    K_LAUNCH(l.blocks, l.threads, l.smem, s, layernorm_forward_kernel<false>)(
        y, h, y16_dtype, mean, rstd, sum, x, addend, weight, bias, eps, rows, cols, l.cache);
  return k_launched();
}

template <bool FROM_OUTPUT>
int launch_layernorm_backward(DxOut out, float *dweight, float *dbias, const float *dy,
                              const float *src, const float *weight, const float *mean,
                              const float *shift, const float *rstd, int64_t rows,
                              int64_t cols, float *scratch, void *stream) {
  if (rows < 0 || cols < 0) return INVALID;
  if (rows == 0 || cols == 0) return 0;
  if (!out.dx || !dy || !src || !weight || !rstd || (FROM_OUTPUT ? !shift : !mean))
    return INVALID;
  if (out.dx16 && out.dtype != DT_BF16 && out.dtype != DT_F16) return INVALID;
  float *dx = out.dx;
  const bool grads = dweight || dbias;
  if (grads && !scratch) return INVALID;
  const int64_t groups = layernorm_partial_groups(rows, cols);
  /* Every row 16-byte aligned: the fixed per-thread column map can use float4. */
  const bool vec = cols % 4 == 0 && aligned16(dy) && aligned16(src) && aligned16(dx) &&
                   aligned16(out.residual);   /* (a null residual is aligned) */
  float *partials = grads ? scratch : nullptr;
  cudaStream_t s = (cudaStream_t)stream;
  /* rows past warp mode that fit a warp's registers, every row aligned:
     layernorm_backward_regs_kernel, a partials row a block (at most `groups` of them) */
  if (vec && cols > WARP_ROW_MAX_COLS && cols <= REG_ROW_MAX_COLS) {
    int64_t blocks = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    const int64_t most = grads ? groups : MAX_BLOCKS;
    if (blocks > most) blocks = most;
    const bool vec_p = aligned16(weight) && (!FROM_OUTPUT || aligned16(shift));
    const size_t smem = grads ? (size_t)WARPS_PER_BLOCK * (size_t)cols * sizeof(float) : 0;
    const int64_t chunks = (cols / 4 + 31) / 32;
#define LN_BACK_REGS(C)                                                                      \
  K_LAUNCH((unsigned)blocks, 32 * WARPS_PER_BLOCK, smem, s,                                   \
           layernorm_backward_regs_kernel<C, FROM_OUTPUT>)(out, partials, dy, src, weight, mean, \
                                                           shift, rstd, rows, cols, vec_p)
    if (chunks <= 4) LN_BACK_REGS(4);
    else if (chunks <= 6) LN_BACK_REGS(6);
    else LN_BACK_REGS(REG_ROW_CHUNKS);
#undef LN_BACK_REGS
    int status = k_launched();
    if (status != 0 || !grads) return status;
    int64_t tiles = (cols + 31) / 32;
    if (tiles > MAX_BLOCKS) tiles = MAX_BLOCKS;
    K_LAUNCH((unsigned)tiles, dim3(32, 32), 0, s, column_partials_kernel)(dweight, dbias, scratch,
                                                                          blocks, cols);
    return k_launched();
  }
  const RowLaunch l = row_launch(rows, cols, 2, groups);
#define LN_BACK(WARP, EXTRA)                                                                 \
  K_LAUNCH(l.blocks, l.threads, l.smem, s, layernorm_backward_kernel<WARP, FROM_OUTPUT, EXTRA>)( \
      out, partials, dy, src, weight, mean, shift, rstd, rows, cols, l.cache, vec)
  const bool extra = out.residual || out.dx16;
  if (l.warp_mode && extra) LN_BACK(true, true);
  else if (l.warp_mode) LN_BACK(true, false);
  else if (extra) LN_BACK(false, true);
  else LN_BACK(false, false);
#undef LN_BACK
  int status = k_launched();
  if (status != 0 || !grads) return status;
  int64_t tiles = (cols + 31) / 32;
  if (tiles > MAX_BLOCKS) tiles = MAX_BLOCKS;
  K_LAUNCH((unsigned)tiles, dim3(32, 32), 0, s, column_partials_kernel)(dweight, dbias, scratch,
                                                                        (int64_t)l.blocks, cols);
  return k_launched();
}

} /* namespace */

/* ---------------------------------------------------------------- launchers */

extern "C" int k_layernorm_forward(float *y, void *y16, int y16_dtype, float *mean,
                                   float *rstd, const float *x, const float *weight,
                                   const float *bias, float eps, int64_t rows, int64_t cols,
                                   void *stream) {
  return launch_layernorm_forward(false, nullptr, y, y16, y16_dtype, mean, rstd, x, nullptr,
                                  weight, bias, eps, rows, cols, stream);
}

extern "C" int k_add_layernorm_forward(float *sum, float *y, void *y16, int y16_dtype,
                                       float *mean, float *rstd, const float *a,
                                       const float *b, const float *weight, const float *bias,
                                       float eps, int64_t rows, int64_t cols, void *stream) {
  return launch_layernorm_forward(true, sum, y, y16, y16_dtype, mean, rstd, a, b, weight, bias,
                                  eps, rows, cols, stream);
}

extern "C" int64_t k_layernorm_backward_scratch_floats(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return 2 * layernorm_partial_groups(rows, cols) * cols;
}

extern "C" int k_layernorm_backward(float *dx, void *dx16, int dx16_dtype, float *dweight,
                                    float *dbias, const float *dy, const float *residual,
                                    const float *x, const float *weight, const float *mean,
                                    const float *rstd, int64_t rows, int64_t cols,
                                    float *scratch, void *stream) {
  const DxOut out = {dx, residual, static_cast<uint16_t *>(dx16), dx16_dtype};
  return launch_layernorm_backward<false>(out, dweight, dbias, dy, x, weight, mean, nullptr,
                                          rstd, rows, cols, scratch, stream);
}

extern "C" int k_layernorm_backward_from_output(float *dx, void *dx16, int dx16_dtype,
                                                float *dweight, float *dbias, const float *dy,
                                                const float *residual, const float *y,
                                                const float *weight, const float *bias,
                                                const float *rstd, int64_t rows, int64_t cols,
                                                float *scratch, void *stream) {
  const DxOut out = {dx, residual, static_cast<uint16_t *>(dx16), dx16_dtype};
  return launch_layernorm_backward<true>(out, dweight, dbias, dy, y, weight, nullptr, bias,
                                         rstd, rows, cols, scratch, stream);
}
