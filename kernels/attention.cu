/* SPDX-License-Identifier: MIT */
/* attention.cu — multi-head self-attention forward and backward for the CUDA backend, in
 * fp32, flash style (Dao et al., FlashAttention 1 and 2).
 *
 * Purpose: what cpu_attention_forward / _backward (src/backend/cpu/attention.c) compute,
 * without ever holding an S x S matrix: the forward runs one block per (query tile, head,
 * sample) over key tiles in shared memory with an online softmax (running max m and sum
 * l per row); the backward runs one block per (key tile, head, sample) that owns its keys'
 * dk / dv rows in registers and loops over the query tiles that can see them, recomputing
 * P from lse (or reading the standard mode's probs), and adds its share of dq with float
 * atomics. Heads live in columns (row stride ld), so tiles are read straight from the
 * strided q, k, v, o, do matrices. The launchers at the end also check and queue the
 * tensor-core kernels of attention_flash.cu (16-bit products, the flash mode).
 *
 * Layout of the work: 256 threads as a 16 x 16 grid (ty, tx). A score tile's entry
 * (row, col) belongs to the thread with ty = row / RPT and tx = col % 16, so the 16
 * threads of one half warp hold one row's scores and reduce it with shuffles. Shared
 * tiles of q, k, v, do have a row stride of head_dim + 4 floats: float4 reads of 8
 * consecutive keys then fall in 8 different bank groups, and rows stay 16-byte aligned.
 * Dimensions beyond head_dim and rows beyond seq are zeros in shared memory, so the inner
 * loops run over the compile-time maximum without bounds checks.
 *
 * Dropout: the draw of element (b, h, i, j) is index ((first_sample + b) heads + h) seq^2
 * + i seq + j of (seed, stream), kept iff k_kept(draw, threshold), as the CPU's
 * dropout_row. P' = P kept / (1-p) feeds o and dv, while the softmax normalisation uses
 * P: the forward sums exp(s - m) into l for every visible key and exp(s - m) kept into the
 * accumulator of o, then multiplies by 1/(1-p) / l.
 *
 * Must never: write a column of q / k / v / o / dq / dk / dv outside (h*head_dim,
 * +head_dim) (those buffers are column slices of bigger ones), write a mask byte the CPU
 * does not write, synchronize or allocate (launchers only queue), or call __syncthreads
 * under a condition that is not the same for the whole block.
 */
#include <math.h>
#include <stdint.h>

#include "attention.h"
#include "attention_tiles.cuh"

using namespace k_attention;

namespace {

constexpr int kThreads = 256; /* a 16 x 16 grid of threads per block */
/* Query rows per forward tile: TILE_Q of the CPU backend. The standard mode's kept bits of
   a row end at its CPU tile's key end (causal), so the forward's tiles are the CPU's. */
constexpr int kForwardRows = 64;

/* ---------------------------------------------------------------- device helpers */

/* Max and sum over the 16 lanes of a half warp (one score row); every lane gets the
   same bits, so the replicated running max and sum never drift apart. All 32 lanes must
   call these. */
__device__ __forceinline__ float row_max16(float v) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float row_sum16(float v) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float component(const float4 &x, int c) {
  return c == 0 ? x.x : c == 1 ? x.y : c == 2 ? x.z : x.w;
}

/* tile[r][d] := src[r*ld + d] for r < rows_valid and d < head_dim, 0 elsewhere (r < ROWS,
   d < HD), shared row stride HD + 4. Consecutive threads read consecutive columns. */
template <int ROWS, int HD>
__device__ __forceinline__ void load_rows(float *tile, const float *src, int64_t ld,
                                          int rows_valid, int head_dim) {
  constexpr int kStride = HD + 4;
  for (int e = threadIdx.x; e < ROWS * HD; e += kThreads) {
    const int r = e / HD, d = e % HD;
    tile[r * kStride + d] = (r < rows_valid && d < head_dim) ? src[(int64_t)r * ld + d] : 0.0f;
  }
}

/* acc[r][c] += a_row(r) . b_row(c) over HD dimensions, where a_row(r) = a + r*stride and
   b_row(c) = b + 16*c*stride (the caller offsets a by its first row, b by tx). */
template <int RPT, int CPT, int HD>
__device__ __forceinline__ void dot_tile(float (&acc)[RPT][CPT], const float *a,
                                         const float *b) {
  constexpr int kStride = HD + 4;
#pragma unroll 4
  for (int d = 0; d < HD; d += 4) {
    float4 av[RPT], bv[CPT];
#pragma unroll
    for (int r = 0; r < RPT; r++) av[r] = *reinterpret_cast<const float4 *>(a + r * kStride + d);
#pragma unroll
    for (int c = 0; c < CPT; c++)
      bv[c] = *reinterpret_cast<const float4 *>(b + 16 * c * kStride + d);
#pragma unroll
    for (int r = 0; r < RPT; r++)
#pragma unroll
      for (int c = 0; c < CPT; c++) {
        acc[r][c] = fmaf(av[r].x, bv[c].x, acc[r][c]);
        acc[r][c] = fmaf(av[r].y, bv[c].y, acc[r][c]);
        acc[r][c] = fmaf(av[r].z, bv[c].z, acc[r][c]);
        acc[r][c] = fmaf(av[r].w, bv[c].w, acc[r][c]);
      }
  }
}

/* ---------------------------------------------------------------- forward */

template <int HD, int BK>
constexpr size_t forward_smem_bytes() {
  return sizeof(float) * ((size_t)kForwardRows * (HD + 4) + 2 * (size_t)BK * (HD + 4) +
                          (size_t)kForwardRows * (BK + 4)) +
         (size_t)kForwardRows * BK;
}

/* One block per (query tile, head, sample), heaviest causal tiles first. WRITE_ROWS: the
   standard mode, which after the flash pass also writes the full rows of P, P' and the
   kept bits (a second sweep over the keys recomputing P = exp(s - m) / l from the final
   m and l, as the CPU's e * (1 / sum)). */
template <int HD, int BK, bool WRITE_ROWS>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(ForwardArgs a) {
  constexpr int BQ = kForwardRows, RPT = BQ / 16, CPT = BK / 16, DPT = HD / 16;
  constexpr int HDS = HD + 4, PS = BK + 4;
  K_DYNAMIC_SHARED(float4, smem_f4);
  float *q_s = reinterpret_cast<float *>(smem_f4);
  float *k_s = q_s + BQ * HDS, *v_s = k_s + BK * HDS, *p_s = v_s + BK * HDS;
  uint8_t *kept_s = reinterpret_cast<uint8_t *>(p_s + BQ * PS);

  const AttentionShape &sh = a.sh;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t S = sh.seq, H = sh.heads, BH = sh.batch * H, hd = sh.head_dim;
  const int64_t ld = sh.ld_qkv, q_tiles = (S + BQ - 1) / BQ, items = q_tiles * BH;
  const bool dropout = sh.dropout > 0.0f;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t tile = q_tiles - 1 - item / BH, bh = item % BH, b = bh / H, h = bh % H;
    const int64_t i0 = tile * BQ, col0 = h * hd;
    const int rows_valid = (int)(S - i0 < BQ ? S - i0 : BQ);
    /* keys any row of the tile can see: the CPU tile's kend */
    const int64_t kend = sh.causal ? (i0 + BQ < S ? i0 + BQ : S) : S;
    const uint64_t draw0 = draw_index(sh, b, h, i0, 0);

    __syncthreads(); /* the previous item's readers are done with q_s */
    load_rows<BQ, HD>(q_s, a.q + (b * S + i0) * ld + col0, ld, rows_valid, (int)hd);

    float m[RPT], l[RPT], acc[RPT][DPT];
#pragma unroll
    for (int r = 0; r < RPT; r++) {
      m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
      for (int dd = 0; dd < DPT; dd++) acc[r][dd] = 0.0f;
    }

    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
      const int keys_valid = (int)(S - j0 < BK ? S - j0 : BK);
      __syncthreads(); /* the previous key tile's readers are done with k_s, v_s, p_s */
      load_rows<BK, HD>(k_s, a.k + (b * S + j0) * ld + col0, ld, keys_valid, (int)hd);
      load_rows<BK, HD>(v_s, a.v + (b * S + j0) * ld + col0, ld, keys_valid, (int)hd);
      if (dropout)
        fill_kept<BQ, BK, kThreads>(kept_s, draw0 + (uint64_t)j0, (uint64_t)S, rows_valid, sh);
      __syncthreads();

      float s[RPT][CPT];
#pragma unroll
      for (int r = 0; r < RPT; r++)
#pragma unroll
        for (int c = 0; c < CPT; c++) s[r][c] = 0.0f;
      dot_tile<RPT, CPT, HD>(s, q_s + ty * RPT * HDS, k_s + tx * HDS);

#pragma unroll
      for (int r = 0; r < RPT; r++) {
        const int il = ty * RPT + r;
        const int64_t i = i0 + il;
        float tile_max = -INFINITY;
#pragma unroll
        for (int c = 0; c < CPT; c++) {
          const int64_t j = j0 + tx + 16 * c;
          const bool visible = j < S && key_visible(sh, a.key_mask, b, i, j);
          s[r][c] = visible ? s[r][c] * sh.scale : -INFINITY;
          tile_max = fmaxf(tile_max, s[r][c]);
        }
        tile_max = row_max16(tile_max);
        const float m_new = fmaxf(m[r], tile_max);
        /* A row that has seen no visible key yet keeps m = -inf, l = 0 and zeros. */
        const float alpha = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
        float sum = 0.0f;
#pragma unroll
        for (int c = 0; c < CPT; c++) {
          const int jl = tx + 16 * c;
          const float p = s[r][c] == -INFINITY ? 0.0f : expf(s[r][c] - m_new);
          sum += p;
          p_s[il * PS + jl] = (dropout && !kept_s[il * BK + jl]) ? 0.0f : p;
        }
        sum = row_sum16(sum);
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
#pragma unroll
        for (int dd = 0; dd < DPT; dd++) acc[r][dd] *= alpha;
      }
      __syncthreads();

      /* acc += (kept exp(s - m)) v over the tile's keys (zero rows beyond seq) */
#pragma unroll 2
      for (int j = 0; j < BK; j += 4) {
        float4 p4[RPT];
#pragma unroll
        for (int r = 0; r < RPT; r++)
          p4[r] = *reinterpret_cast<const float4 *>(p_s + (ty * RPT + r) * PS + j);
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
          for (int dd = 0; dd < DPT; dd++) {
            const float vv = v_s[(j + u) * HDS + tx + 16 * dd];
#pragma unroll
            for (int r = 0; r < RPT; r++) acc[r][dd] = fmaf(component(p4[r], u), vv, acc[r][dd]);
          }
      }
    }

    /* o = acc / l / (1-p); lse = m + log l, or o = 0 and lse = -inf with no visible key */
#pragma unroll
    for (int r = 0; r < RPT; r++) {
      const int64_t i = i0 + ty * RPT + r;
      if (i >= S) continue;
      const bool seen = l[r] > 0.0f;
      const float out_scale = seen ? (1.0f / l[r]) * sh.keep_scale : 0.0f;
      float *orow = a.o + (b * S + i) * sh.ld_o + col0;
#pragma unroll
      for (int dd = 0; dd < DPT; dd++) {
        const int d = tx + 16 * dd;
        if (d < hd) orow[d] = seen ? acc[r][dd] * out_scale : 0.0f;
      }
      if (tx == 0) a.lse[bh * S + i] = seen ? m[r] + logf(l[r]) : -INFINITY;
    }

    if constexpr (WRITE_ROWS) {
      /* Standard mode: whole rows j < seq of P (0 at hidden keys and beyond kend), P' and
         the kept bits, as forward_tile + dropout_row write them. With p = 0 the CPU
         writes neither P' nor bits, and neither do we. */
      const bool write_dropped = dropout && a.dropped != nullptr;
      const bool write_mask = dropout && a.mask != nullptr;
      const int64_t mask_row_bytes = (S + 7) / 8;
      float inv_l[RPT];
#pragma unroll
      for (int r = 0; r < RPT; r++) inv_l[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;

      for (int64_t j0 = 0; j0 < S; j0 += BK) {
        /* tiles at or past kend only get zeros (P) and no bits: the same for the block */
        const bool in_reach = j0 < kend;
        const int keys_valid = (int)(S - j0 < BK ? S - j0 : BK);
        __syncthreads(); /* readers of k_s / kept_s (or of p_s, v_s above) are done */
        if (in_reach) {
          load_rows<BK, HD>(k_s, a.k + (b * S + j0) * ld + col0, ld, keys_valid, (int)hd);
          if (write_dropped || write_mask)
            fill_kept<BQ, BK, kThreads>(kept_s, draw0 + (uint64_t)j0, (uint64_t)S, rows_valid, sh);
        }
        __syncthreads();

        float s[RPT][CPT];
#pragma unroll
        for (int r = 0; r < RPT; r++)
#pragma unroll
          for (int c = 0; c < CPT; c++) s[r][c] = 0.0f;
        if (in_reach) dot_tile<RPT, CPT, HD>(s, q_s + ty * RPT * HDS, k_s + tx * HDS);

#pragma unroll
        for (int r = 0; r < RPT; r++) {
          const int il = ty * RPT + r;
          const int64_t i = i0 + il;
          if (i >= S) continue;
          const int64_t row = (bh * S + i) * S;
#pragma unroll
          for (int c = 0; c < CPT; c++) {
            const int jl = tx + 16 * c;
            const int64_t j = j0 + jl;
            if (j >= S) continue;
            float p = 0.0f;
            if (in_reach && l[r] > 0.0f && key_visible(sh, a.key_mask, b, i, j))
              p = expf(s[r][c] * sh.scale - m[r]) * inv_l[r];
            if (a.probs) a.probs[row + j] = p;
            /* p != 0 only in reach, where kept_s holds this tile's bits */
            if (write_dropped)
              a.dropped[row + j] = (p != 0.0f && kept_s[il * BK + jl]) ? p * sh.keep_scale : 0.0f;
          }
        }

        /* Bits: the CPU clears bytes [0, (kend+7)/8) of each row and sets kept j < kend,
           hidden keys included; one thread per (row, byte) here. */
        if (write_mask && in_reach) {
          for (int t = threadIdx.x; t < BQ * (BK / 8); t += kThreads) {
            const int r = t / (BK / 8), byte_in_tile = t % (BK / 8);
            const int64_t i = i0 + r, jb = j0 + 8 * byte_in_tile;
            if (i >= S || jb >= kend) continue;
            unsigned bits = 0;
#pragma unroll
            for (int u = 0; u < 8; u++)
              if (jb + u < kend && kept_s[r * BK + 8 * byte_in_tile + u]) bits |= 1u << u;
            a.mask[(bh * S + i) * mask_row_bytes + jb / 8] = (uint8_t)bits;
          }
        }
      }
    }
  }
}

/* ---------------------------------------------------------------- backward */

/* D_i = do_i . o_i for every (b, i, h) into d_rows (batch, heads, seq), and dq's entries of
   the row zeroed for the backward's atomics: one warp per row, fixed order. */
__global__ void __launch_bounds__(kThreads)
    attention_row_dots_kernel(float *d_rows, float *dq, const float *d_o, const float *o,
                              AttentionShape sh) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = kThreads / 32, hd = sh.head_dim;
  const int64_t rows = sh.batch * sh.seq * sh.heads;
  for (int64_t row = (int64_t)blockIdx.x * warps_per_block + (threadIdx.x >> 5); row < rows;
       row += (int64_t)gridDim.x * warps_per_block) {
    /* consecutive warps take consecutive heads of one position: neighbouring columns */
    const int64_t h = row % sh.heads, bi = row / sh.heads; /* bi = b*seq + i */
    const int64_t b = bi / sh.seq, i = bi % sh.seq;
    const float *dorow = d_o + bi * sh.ld_o + h * hd, *orow = o + bi * sh.ld_o + h * hd;
    float sum = 0.0f;
    for (int64_t d = lane; d < hd; d += 32) sum = fmaf(dorow[d], orow[d], sum);
    sum = k_warp_sum(sum);
    if (lane == 0) d_rows[(b * sh.heads + h) * sh.seq + i] = sum;
    float *dqrow = dq + bi * sh.ld_qkv + h * hd;
    for (int64_t d = lane; d < hd; d += 32) dqrow[d] = 0.0f;
  }
}

template <int HD, int BQ, int BK>
constexpr size_t backward_smem_bytes() {
  return sizeof(float) * (2 * (size_t)BK * (HD + 4) + 2 * (size_t)BQ * (HD + 4) +
                          2 * (size_t)BQ * (BK + 4) + 2 * (size_t)BQ) +
         (size_t)BQ * BK;
}

/* One block per (key tile, head, sample), heaviest causal tiles (the first keys) first.
   Per query tile:  S, dP' = (q k^T, do v^T) in registers;  P, P', dS to shared memory;
   dv += P'^T do, dk += scale dS^T q in registers;  dq += scale dS k by atomics. */
template <int HD, int BQ, int BK>
__global__ void __launch_bounds__(kThreads) attention_backward_kernel(BackwardArgs a) {
  constexpr int RPT = BQ / 16, CPT = BK / 16, DPT = HD / 16;
  constexpr int HDS = HD + 4, PS = BK + 4;
  K_DYNAMIC_SHARED(float4, smem_f4);
  float *k_s = reinterpret_cast<float *>(smem_f4);
  float *v_s = k_s + BK * HDS, *q_s = v_s + BK * HDS, *do_s = q_s + BQ * HDS;
  float *pd_s = do_s + BQ * HDS, *ds_s = pd_s + BQ * PS;
  float *lse_s = ds_s + BQ * PS, *dr_s = lse_s + BQ;
  uint8_t *kept_s = reinterpret_cast<uint8_t *>(dr_s + BQ);

  const AttentionShape &sh = a.sh;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t S = sh.seq, H = sh.heads, BH = sh.batch * H, hd = sh.head_dim;
  const int64_t ld = sh.ld_qkv, ldo = sh.ld_o;
  const int64_t k_tiles = (S + BK - 1) / BK, q_tiles = (S + BQ - 1) / BQ, items = k_tiles * BH;
  const int64_t mask_row_bytes = (S + 7) / 8;
  const bool dropout = sh.dropout > 0.0f;
  const bool regenerate = dropout && a.dropped == nullptr && a.mask == nullptr;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t kt = item / BH, bh = item % BH, b = bh / H, h = bh % H;
    const int64_t j0 = kt * BK, col0 = h * hd;
    const int keys_valid = (int)(S - j0 < BK ? S - j0 : BK);

    __syncthreads(); /* the previous item's readers are done with k_s, v_s */
    load_rows<BK, HD>(k_s, a.k + (b * S + j0) * ld + col0, ld, keys_valid, (int)hd);
    load_rows<BK, HD>(v_s, a.v + (b * S + j0) * ld + col0, ld, keys_valid, (int)hd);

    float dk_acc[CPT][DPT], dv_acc[CPT][DPT];
#pragma unroll
    for (int c = 0; c < CPT; c++)
#pragma unroll
      for (int dd = 0; dd < DPT; dd++) dk_acc[c][dd] = 0.0f, dv_acc[c][dd] = 0.0f;

    /* causal: query i sees key j iff j <= i, so tiles before j0's see none of these keys */
    for (int64_t qt = sh.causal ? j0 / BQ : 0; qt < q_tiles; qt++) {
      const int64_t i0 = qt * BQ;
      const int rows_valid = (int)(S - i0 < BQ ? S - i0 : BQ);
      __syncthreads(); /* the previous query tile's readers are done */
      load_rows<BQ, HD>(q_s, a.q + (b * S + i0) * ld + col0, ld, rows_valid, (int)hd);
      load_rows<BQ, HD>(do_s, a.d_o + (b * S + i0) * ldo + col0, ldo, rows_valid, (int)hd);
      for (int t = threadIdx.x; t < BQ; t += kThreads) {
        const bool valid = t < rows_valid;
        lse_s[t] = (valid && a.probs == nullptr) ? a.lse[bh * S + i0 + t] : 0.0f;
        dr_s[t] = valid ? a.d_rows[bh * S + i0 + t] : 0.0f;
      }
      if (regenerate)
        fill_kept<BQ, BK, kThreads>(kept_s, draw_index(sh, b, h, i0, j0), (uint64_t)S,
                                    rows_valid, sh);
      __syncthreads();

      float s[RPT][CPT], dp[RPT][CPT];
#pragma unroll
      for (int r = 0; r < RPT; r++)
#pragma unroll
        for (int c = 0; c < CPT; c++) s[r][c] = 0.0f, dp[r][c] = 0.0f;
      dot_tile<RPT, CPT, HD>(s, q_s + ty * RPT * HDS, k_s + tx * HDS);
      dot_tile<RPT, CPT, HD>(dp, do_s + ty * RPT * HDS, v_s + tx * HDS);

      /* P (recomputed or kept), P' (kept, from bits or regenerated), dS = P (dP'' - D)
         with dP'' = dP' / (1-p) where P' != 0, else 0 (the CPU's formula). Hidden and
         out-of-range entries are 0, as P is 0 there. */
#pragma unroll
      for (int r = 0; r < RPT; r++) {
        const int il = ty * RPT + r;
        const int64_t i = i0 + il;
        const float row_lse = lse_s[il], row_d = dr_s[il];
#pragma unroll
        for (int c = 0; c < CPT; c++) {
          const int jl = tx + 16 * c;
          const int64_t j = j0 + jl;
          float p = 0.0f, pd = 0.0f, ds = 0.0f;
          if (i < S && j < S && key_visible(sh, a.key_mask, b, i, j)) {
            const int64_t e = (bh * S + i) * S + j;
            if (a.probs)
              p = a.probs[e];
            else
              p = row_lse == -INFINITY ? 0.0f : expf(s[r][c] * sh.scale - row_lse);
            if (!dropout) {
              pd = p;
              ds = p * (dp[r][c] - row_d);
            } else {
              if (a.dropped) {
                pd = a.dropped[e];
              } else {
                const bool kept =
                    a.mask ? ((a.mask[(bh * S + i) * mask_row_bytes + (j >> 3)] >> (j & 7)) & 1) != 0
                           : kept_s[il * BK + jl] != 0;
                pd = kept ? p * sh.keep_scale : 0.0f;
              }
              ds = p * ((pd != 0.0f ? dp[r][c] * sh.keep_scale : 0.0f) - row_d);
            }
          }
          pd_s[il * PS + jl] = pd;
          ds_s[il * PS + jl] = ds * sh.scale;
        }
      }
      __syncthreads();

      /* dv[j] += sum_i P'[i][j] do[i];  dk[j] += sum_i scale dS[i][j] q[i]. This thread's
         keys are ty*CPT + c, its dimensions tx + 16*dd. */
#pragma unroll 2
      for (int il = 0; il < rows_valid; il++) {
        float pv[CPT], dsv[CPT];
#pragma unroll
        for (int c = 0; c < CPT; c++) {
          pv[c] = pd_s[il * PS + ty * CPT + c];
          dsv[c] = ds_s[il * PS + ty * CPT + c];
        }
#pragma unroll
        for (int dd = 0; dd < DPT; dd++) {
          const float dov = do_s[il * HDS + tx + 16 * dd], qv = q_s[il * HDS + tx + 16 * dd];
#pragma unroll
          for (int c = 0; c < CPT; c++) {
            dv_acc[c][dd] = fmaf(pv[c], dov, dv_acc[c][dd]);
            dk_acc[c][dd] = fmaf(dsv[c], qv, dk_acc[c][dd]);
          }
        }
      }

      /* dq[i] += sum_j scale dS[i][j] k[j] for this thread's rows ty*RPT + r */
      float dq_acc[RPT][DPT];
#pragma unroll
      for (int r = 0; r < RPT; r++)
#pragma unroll
        for (int dd = 0; dd < DPT; dd++) dq_acc[r][dd] = 0.0f;
#pragma unroll 2
      for (int j = 0; j < BK; j += 4) {
        float4 d4[RPT];
#pragma unroll
        for (int r = 0; r < RPT; r++)
          d4[r] = *reinterpret_cast<const float4 *>(ds_s + (ty * RPT + r) * PS + j);
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
          for (int dd = 0; dd < DPT; dd++) {
            const float kv = k_s[(j + u) * HDS + tx + 16 * dd];
#pragma unroll
            for (int r = 0; r < RPT; r++)
              dq_acc[r][dd] = fmaf(component(d4[r], u), kv, dq_acc[r][dd]);
          }
      }
#pragma unroll
      for (int r = 0; r < RPT; r++) {
        const int64_t i = i0 + ty * RPT + r;
        if (i >= S) continue;
        float *dqrow = a.dq + (b * S + i) * ld + col0;
#pragma unroll
        for (int dd = 0; dd < DPT; dd++) {
          const int d = tx + 16 * dd;
          if (d < hd) atomicAdd(dqrow + d, dq_acc[r][dd]);
        }
      }
    }

    /* this block's keys are all its own: plain stores, every (j < seq, d < head_dim) */
#pragma unroll
    for (int c = 0; c < CPT; c++) {
      const int64_t j = j0 + ty * CPT + c;
      if (j >= S) continue;
      float *dkrow = a.dk + (b * S + j) * ld + col0, *dvrow = a.dv + (b * S + j) * ld + col0;
#pragma unroll
      for (int dd = 0; dd < DPT; dd++) {
        const int d = tx + 16 * dd;
        if (d < hd) {
          dkrow[d] = dk_acc[c][dd];
          dvrow[d] = dv_acc[c][dd];
        }
      }
    }
  }
}

/* ---------------------------------------------------------------- launch helpers */

template <int HD>
int forward_for(const ForwardArgs &args, bool write_rows, cudaStream_t stream) {
  constexpr int BK = HD >= 128 ? 32 : 64; /* keeps shared memory and registers in bounds */
  const AttentionShape &sh = args.sh;
  const int64_t items = (sh.seq + kForwardRows - 1) / kForwardRows * sh.batch * sh.heads;
  constexpr size_t smem = forward_smem_bytes<HD, BK>();
  if (write_rows)
    return launch_tiles(attention_forward_kernel<HD, BK, true>, kThreads, smem, items, stream,
                        args);
  return launch_tiles(attention_forward_kernel<HD, BK, false>, kThreads, smem, items, stream,
                      args);
}

template <int HD>
int backward_for(const BackwardArgs &args, cudaStream_t stream) {
  /* register budget: dk, dv accumulators take 2 * BK * HD / 256 floats per thread */
  constexpr int BQ = HD >= 128 ? 32 : 64, BK = HD >= 256 ? 32 : 64;
  const AttentionShape &sh = args.sh;
  const int64_t items = (sh.seq + BK - 1) / BK * sh.batch * sh.heads;
  return launch_tiles(attention_backward_kernel<HD, BQ, BK>, kThreads,
                      backward_smem_bytes<HD, BQ, BK>(), items, stream, args);
}

/* Validates the shape shared by both launchers: 0 when usable, 1 when empty (nothing to
   queue), or -1 for arguments the kernels cannot serve. */
int check_shape(AttentionShape *sh, int64_t batch, int64_t heads, int64_t seq,
                int64_t head_dim, int64_t ld_qkv, int64_t ld_o, int causal, float scale,
                float dropout, uint32_t keep_threshold, uint64_t seed, uint64_t stream_id,
                int64_t first_sample) {
  if (batch < 0 || heads < 0 || seq < 0 || first_sample < 0) return -1;
  if (head_dim <= 0 || head_dim > 256) return -1;
  if (!(dropout >= 0.0f && dropout < 1.0f)) return -1;
  if (ld_qkv < heads * head_dim || ld_o < heads * head_dim) return -1;
  sh->batch = batch, sh->heads = heads, sh->seq = seq, sh->head_dim = head_dim;
  sh->ld_qkv = ld_qkv, sh->ld_o = ld_o, sh->first_sample = first_sample;
  sh->seed = seed, sh->stream = stream_id;
  sh->scale = scale, sh->dropout = dropout, sh->keep_scale = 1.0f / (1.0f - dropout);
  sh->threshold = keep_threshold, sh->causal = causal != 0;
  return batch == 0 || heads == 0 || seq == 0 ? 1 : 0;
}

} /* namespace */

/* ---------------------------------------------------------------- launchers */

extern "C" int64_t k_attention_scratch_floats(int64_t batch, int64_t heads, int64_t seq,
                                              int backward) {
  return backward ? batch * heads * seq : 0;
}

extern "C" int k_attention_forward(float *o, float *lse, float *probs, float *dropped,
                                   uint8_t *mask, const float *q, const float *k,
                                   const float *v, const uint8_t *key_mask, int64_t batch,
                                   int64_t heads, int64_t seq, int64_t head_dim,
                                   int64_t ld_qkv, int64_t ld_o, int causal, float scale,
                                   float dropout, uint32_t keep_threshold, uint64_t seed,
                                   uint64_t stream_id, int64_t first_sample,
                                   float *scratch, void *stream) {
  (void)scratch; /* the forward needs none */
  ForwardArgs args;
  int state = check_shape(&args.sh, batch, heads, seq, head_dim, ld_qkv, ld_o, causal, scale,
                          dropout, keep_threshold, seed, stream_id, first_sample);
  if (state < 0) return (int)cudaErrorInvalidValue;
  if (state > 0) return 0;
  if (!o || !lse || !q || !k || !v) return (int)cudaErrorInvalidValue;
  args.o = o, args.lse = lse, args.probs = probs, args.dropped = dropped, args.mask = mask;
  args.q = q, args.k = k, args.v = v, args.key_mask = key_mask;
  const bool write_rows = probs != nullptr || (dropout > 0.0f && (dropped || mask));
  cudaStream_t s = (cudaStream_t)stream;
  if (head_dim <= 32) return forward_for<32>(args, write_rows, s);
  if (head_dim <= 64) return forward_for<64>(args, write_rows, s);
  if (head_dim <= 128) return forward_for<128>(args, write_rows, s);
  return forward_for<256>(args, write_rows, s);
}

extern "C" int k_attention_backward(float *dq, float *dk, float *dv, const float *d_o,
                                    const float *o, const float *lse, const float *probs,
                                    const float *dropped, const uint8_t *mask,
                                    const float *q, const float *k, const float *v,
                                    const uint8_t *key_mask, int64_t batch, int64_t heads,
                                    int64_t seq, int64_t head_dim, int64_t ld_qkv,
                                    int64_t ld_o, int causal, float scale, float dropout,
                                    uint32_t keep_threshold, uint64_t seed,
                                    uint64_t stream_id, int64_t first_sample,
                                    float *scratch, void *stream) {
  BackwardArgs args;
  int state = check_shape(&args.sh, batch, heads, seq, head_dim, ld_qkv, ld_o, causal, scale,
                          dropout, keep_threshold, seed, stream_id, first_sample);
  if (state < 0) return (int)cudaErrorInvalidValue;
  if (state > 0) return 0;
  if (!dq || !dk || !dv || !d_o || !o || !q || !k || !v || !scratch || (!lse && !probs))
    return (int)cudaErrorInvalidValue;
  cudaStream_t s = (cudaStream_t)stream;

  /* D and dq := 0 first; the tile kernel follows on the same stream */
  const int64_t rows = batch * seq * heads;
  K_LAUNCH(k_blocks_for(rows * 32), kThreads, 0, s, attention_row_dots_kernel)(
      scratch, dq, d_o, o, args.sh);
  int err = k_launched();
  if (err != 0) return err;

  args.dq = dq, args.dk = dk, args.dv = dv, args.d_o = d_o, args.lse = lse;
  args.probs = probs, args.dropped = dropped, args.mask = mask;
  args.q = q, args.k = k, args.v = v, args.key_mask = key_mask, args.d_rows = scratch;
  if (head_dim <= 32) return backward_for<32>(args, s);
  if (head_dim <= 64) return backward_for<64>(args, s);
  if (head_dim <= 128) return backward_for<128>(args, s);
  return backward_for<256>(args, s);
}

/* ---------------------------------------------------------------- the flash mode */

namespace {

/* Pointers to 16-bit rows the flash kernels copy 16 bytes at a time from. */
bool rows_aligned16(const void *p, int64_t ld) {
  return ((uintptr_t)p & 15) == 0 && ld % 8 == 0;
}

} /* namespace */

extern "C" int k_attention_flash_serves(int dtype, int64_t head_dim, int backward) {
  return flash_serves(dtype, head_dim, backward != 0) ? 1 : 0;
}

extern "C" int k_attention_flash_forward(void *o, int o_dtype, float *lse, const void *q,
                                         const void *k, const void *v, const uint8_t *key_mask,
                                         int64_t batch, int64_t heads, int64_t seq,
                                         int64_t head_dim, int64_t ld_qkv, int64_t ld_o,
                                         int causal, float scale, float dropout,
                                         uint32_t keep_threshold, uint64_t seed,
                                         uint64_t stream_id, int64_t first_sample, int dtype,
                                         void *stream) {
  FlashArgs args = {};
  int state = check_shape(&args.sh, batch, heads, seq, head_dim, ld_qkv, ld_o, causal, scale,
                          dropout, keep_threshold, seed, stream_id, first_sample);
  if (state < 0 || !flash_serves(dtype, head_dim, false)) return (int)cudaErrorInvalidValue;
  if (state > 0) return 0;
  if (!o || !lse || (o_dtype != DT_F32 && o_dtype != dtype)) return (int)cudaErrorInvalidValue;
  if (!q || !k || !v || !rows_aligned16(q, ld_qkv) || !rows_aligned16(k, ld_qkv) ||
      !rows_aligned16(v, ld_qkv))
    return (int)cudaErrorInvalidValue;
  args.q = q, args.k = k, args.v = v, args.o = o, args.lse = lse, args.key_mask = key_mask;
  args.o16 = o_dtype != DT_F32;
  return flash_forward(args, dtype, (cudaStream_t)stream);
}

extern "C" int k_attention_flash_backward(void *dq, void *dk, void *dv, int dqkv_dtype,
                                          int64_t ld_dqkv, const void *d_o, int64_t ld_do, const void *o,
                                          int o_dtype,
                                          const float *lse, const void *q, const void *k,
                                          const void *v, const uint8_t *key_mask, int64_t batch,
                                          int64_t heads, int64_t seq, int64_t head_dim,
                                          int64_t ld_qkv, int64_t ld_o, int causal, float scale,
                                          float dropout, uint32_t keep_threshold, uint64_t seed,
                                          uint64_t stream_id, int64_t first_sample, int dtype,
                                          float *scratch, void *stream) {
  FlashArgs args = {};
  int state = check_shape(&args.sh, batch, heads, seq, head_dim, ld_qkv, ld_o, causal, scale,
                          dropout, keep_threshold, seed, stream_id, first_sample);
  if (state < 0 || !flash_serves(dtype, head_dim, true)) return (int)cudaErrorInvalidValue;
  if (state > 0) return 0;
  if (!dq || !dk || !dv || !o || !lse || !scratch || ld_dqkv < heads * head_dim ||
      (dqkv_dtype != DT_F32 && dqkv_dtype != dtype) ||
      (o_dtype != DT_F32 && o_dtype != dtype))
    return (int)cudaErrorInvalidValue;
  if (!q || !k || !v || !d_o || !rows_aligned16(q, ld_qkv) || !rows_aligned16(k, ld_qkv) ||
      !rows_aligned16(v, ld_qkv) || ld_do < heads * head_dim || !rows_aligned16(d_o, ld_do))
    return (int)cudaErrorInvalidValue;
  args.q = q, args.k = k, args.v = v, args.d_o = d_o, args.ld_do = ld_do, args.o_in = o;
  args.lse = const_cast<float *>(lse); /* read only by the backward */
  args.dq = dq, args.dk = dk, args.dv = dv, args.ld_dqkv = ld_dqkv, args.d_rows = scratch, args.key_mask = key_mask;
  args.o16 = o_dtype != DT_F32, args.out16 = dqkv_dtype != DT_F32;
  return flash_backward(args, dtype, (cudaStream_t)stream);
}
