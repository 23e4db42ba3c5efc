/* SPDX-License-Identifier: MIT */
/* attention_mma.cu — flash attention forward and backward on tensor cores: products of
 * 16-bit (bf16 or f16) operands summed in fp32.
 *
 * Purpose: attention is the one part of a block whose products cuBLAS does not run, and
 * attention.cu's fp32 kernels use the GPU's CUDA cores, an order of magnitude below its
 * bf16 tensor-core rate. When the relay's precision is 16-bit, the block asks for 16-bit
 * products and the launchers of attention.cu send the flash mode here: the same results
 * as attention.cu within 16-bit rounding, with the same masks, the same dropout draws and
 * the same lse (so either backward can follow either forward).
 *
 * Layout of the work: 4 warps per block; tiles of 64 queries by 64 keys; warp w owns the
 * rows 16w .. 16w+15 of every 64-row tile. q, k, v (and do) are rounded to 16 bits as they
 * are loaded into shared tiles; products go through WMMA 16x16x16 fragments with fp32
 * accumulators. Scores and the running output sit in fp32 shared memory, so that the
 * online softmax (two lanes per row, alternate columns) and the rescaling by
 * exp(m_old - m_new) are plain float code, as in attention.cu. Where rounding enters:
 * q, k, v, P (unnormalised, after dropout) in the forward; q, k, v, do, P', dS in the
 * backward. The row sums l, the max m, lse and D = do . o stay fp32.
 *
 * Forward per key tile:  S = q k^T (fragments, to shared) -> m, l, P (lanes) ->
 *                        o = o alpha + P v (fragments, over the shared o).
 * Backward per query tile, for a block that owns 64 keys:  S = q k^T, dP' = do v^T ->
 *   P, P', dS (lanes) -> dv += P'^T do, dk += dS^T q (fragments kept in registers across
 *   query tiles) -> dq += dS k (fragments, through shared memory, float atomics).
 *
 * Must never: what attention.cu must never do; and run on a GPU before compute capability
 * 8.0 (mma_serves says no there, and the kernels compile to nothing for it).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "attention_tiles.cuh"

namespace k_attention {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kTile = 16 * kWarps; /* queries and keys per tile */

template <typename T>
__device__ __forceinline__ T round16(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 round16<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half round16<__half>(float x) {
  return __float2half_rn(x);
}

/* Shared arrays start on 128-byte boundaries (WMMA wants 32). */
constexpr size_t aligned(size_t bytes) { return (bytes + 127) & ~(size_t)127; }

/* Row strides, in elements: 16-bit tiles of head_dim or kTile columns get 8 more (rows
   then start in different banks, and stay 16-byte multiples as WMMA wants); fp32 tiles 4. */
template <int HD>
struct Strides {
  static constexpr int kHead16 = HD + 8, kKeys16 = kTile + 8, kKeys32 = kTile + 4,
                       kHead32 = HD + 4;
};

/* Byte offsets of the forward's shared arrays (one definition for kernel and launcher). */
template <int HD>
struct ForwardLayout {
  using St = Strides<HD>;
  static constexpr size_t kTile16 = aligned(2 * (size_t)kTile * St::kHead16);
  static constexpr size_t q = 0, k = q + kTile16, v = k + kTile16, p = v + kTile16;
  static constexpr size_t s = p + aligned(2 * (size_t)kTile * St::kKeys16);
  static constexpr size_t o = s + aligned(4 * (size_t)kTile * St::kKeys32);
  static constexpr size_t kept = o + aligned(4 * (size_t)kTile * St::kHead32);
  static constexpr size_t bytes = kept + aligned((size_t)kTile * kTile);
};

/* The backward's: `stage` (dq, then dk and dv on their way out) shares the room of the
   score tiles s and dp, which are read before it is written. */
template <int HD>
struct BackwardLayout {
  using St = Strides<HD>;
  static constexpr size_t kTile16 = aligned(2 * (size_t)kTile * St::kHead16);
  static constexpr size_t kScores = aligned(4 * (size_t)kTile * St::kKeys32);
  static constexpr size_t kStage = aligned(4 * (size_t)kTile * St::kHead32);
  static constexpr size_t k = 0, v = k + kTile16, q = v + kTile16, d_o = q + kTile16;
  static constexpr size_t pd = d_o + kTile16, ds = pd + aligned(2 * (size_t)kTile * St::kKeys16);
  static constexpr size_t s = ds + aligned(2 * (size_t)kTile * St::kKeys16), dp = s + kScores;
  static constexpr size_t stage = s;
  static constexpr size_t lse = s + (2 * kScores > kStage ? 2 * kScores : kStage);
  static constexpr size_t d_rows = lse + aligned(4 * (size_t)kTile);
  static constexpr size_t kept = d_rows + aligned(4 * (size_t)kTile);
  static constexpr size_t bytes = kept + aligned((size_t)kTile * kTile);
};

template <typename X>
__device__ __forceinline__ X *at(unsigned char *base, size_t offset) {
  return reinterpret_cast<X *>(base + offset);
}

/* tile[r][d] := src[r*ld + d] rounded to T for r < rows_valid and d < head_dim, 0 elsewhere
   (r < kTile, d < HD). Consecutive threads read consecutive columns. */
template <typename T, int HD>
__device__ __forceinline__ void load_rounded(T *tile, const float *src, int64_t ld,
                                             int rows_valid, int head_dim) {
  for (int e = threadIdx.x; e < kTile * HD; e += kThreads) {
    const int r = e / HD, d = e % HD;
    const float x = (r < rows_valid && d < head_dim) ? src[(int64_t)r * ld + d] : 0.0f;
    tile[r * Strides<HD>::kHead16 + d] = round16<T>(x);
  }
}

/* dst row (first_row + r) := stage row r, for the 16 rows of one warp: r < 16, d < head_dim,
   first_row + r < seq. */
__device__ __forceinline__ void write_warp_rows(float *dst, int64_t ld, const float *stage,
                                                int stage_stride, int64_t first_row,
                                                int64_t seq, int head_dim) {
  for (int r = 0; r < 16 && first_row + r < seq; r++)
    for (int d = threadIdx.x & 31; d < head_dim; d += 32)
      dst[(first_row + r) * ld + d] = stage[r * stage_stride + d];
}

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragAt = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

/* out := (accumulate ? out : 0) + a b for one warp: out (16, HD) fp32 with stride
   kHead32, a (16, kTile) with stride kKeys16 (a warp's rows of P or dS), b (kTile, HD)
   with stride kHead16 (v or k). o += P v in the forward, dq = dS k in the backward. */
template <typename T, int HD>
__device__ __forceinline__ void warp_rows_times_tile(float *out, const T *a, const T *b,
                                                     bool accumulate) {
  using St = Strides<HD>;
#pragma unroll
  for (int n = 0; n < HD / 16; n++) {
    FragC acc;
    if (accumulate)
      wmma::load_matrix_sync(acc, out + 16 * n, St::kHead32, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < kTile / 16; kk++) {
      FragA<T> a_frag;
      FragB<T> b_frag;
      wmma::load_matrix_sync(a_frag, a + 16 * kk, St::kKeys16);
      wmma::load_matrix_sync(b_frag, b + 16 * kk * St::kHead16 + 16 * n, St::kHead16);
      wmma::mma_sync(acc, a_frag, b_frag, acc);
    }
    wmma::store_matrix_sync(out + 16 * n, acc, St::kHead32, wmma::mem_row_major);
  }
}

/* ---------------------------------------------------------------- forward */

/* One block per (query tile, head, sample), heaviest causal tiles first, as attention.cu. */
template <typename T, int HD>
__global__ void __launch_bounds__(kThreads) mma_forward_kernel(ForwardArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using L = ForwardLayout<HD>;
  using St = Strides<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  T *q_s = at<T>(smem, L::q), *k_s = at<T>(smem, L::k), *v_s = at<T>(smem, L::v);
  T *p_s = at<T>(smem, L::p);
  float *s_s = at<float>(smem, L::s), *o_s = at<float>(smem, L::o);
  uint8_t *kept_s = at<uint8_t>(smem, L::kept);

  const AttentionShape &sh = a.sh;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = 16 * warp + (lane >> 1), side = lane & 1; /* this lane's softmax row */
  const int64_t S = sh.seq, H = sh.heads, BH = sh.batch * H, hd = sh.head_dim;
  const int64_t ld = sh.ld_qkv, q_tiles = (S + kTile - 1) / kTile, items = q_tiles * BH;
  const bool dropout = sh.dropout > 0.0f;
  float *s_w = s_s + 16 * warp * St::kKeys32, *o_w = o_s + 16 * warp * St::kHead32;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t tile = q_tiles - 1 - item / BH, bh = item % BH, b = bh / H, h = bh % H;
    const int64_t i0 = tile * kTile, col0 = h * hd, i = i0 + row;
    const int rows_valid = (int)(S - i0 < kTile ? S - i0 : kTile);
    const int64_t kend = sh.causal ? (i0 + kTile < S ? i0 + kTile : S) : S;
    const uint64_t draw0 = draw_index(sh, b, h, i0, 0);

    __syncthreads(); /* the previous item's readers are done with q_s and o_s */
    load_rounded<T, HD>(q_s, a.q + (b * S + i0) * ld + col0, ld, rows_valid, (int)hd);
    for (int e = threadIdx.x; e < kTile * St::kHead32; e += kThreads) o_s[e] = 0.0f;
    __syncthreads();
    FragA<T> q_frag[HD / 16]; /* this warp's 16 query rows, for every key tile */
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
      wmma::load_matrix_sync(q_frag[kk], q_s + 16 * warp * St::kHead16 + 16 * kk, St::kHead16);

    float m = -INFINITY, l = 0.0f; /* the same bits in both lanes of a row */
    for (int64_t j0 = 0; j0 < kend; j0 += kTile) {
      const int keys_valid = (int)(S - j0 < kTile ? S - j0 : kTile);
      __syncthreads(); /* the previous key tile's readers are done with k_s, v_s, kept_s */
      load_rounded<T, HD>(k_s, a.k + (b * S + j0) * ld + col0, ld, keys_valid, (int)hd);
      load_rounded<T, HD>(v_s, a.v + (b * S + j0) * ld + col0, ld, keys_valid, (int)hd);
      if (dropout)
        fill_kept<kTile, kTile, kThreads>(kept_s, draw0 + (uint64_t)j0, (uint64_t)S, rows_valid,
                                          sh);
      __syncthreads();

      /* S = q k^T for this warp's rows */
#pragma unroll
      for (int n = 0; n < kTile / 16; n++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
          FragBt<T> k_frag; /* k^T: k's rows are the fragment's columns */
          wmma::load_matrix_sync(k_frag, k_s + 16 * n * St::kHead16 + 16 * kk, St::kHead16);
          wmma::mma_sync(acc, q_frag[kk], k_frag, acc);
        }
        wmma::store_matrix_sync(s_w + 16 * n, acc, St::kKeys32, wmma::mem_row_major);
      }
      __syncwarp();

      /* online softmax over the row's visible keys; P kept by dropout, rounded, to p_s */
      float *srow = s_s + row * St::kKeys32;
      T *prow = p_s + row * St::kKeys16;
      float tile_max = -INFINITY;
#pragma unroll 8
      for (int c = 0; c < kTile / 2; c++) {
        const int jl = 2 * c + side;
        const int64_t j = j0 + jl;
        const bool visible = j < S && key_visible(sh, a.key_mask, b, i, j);
        const float x = visible ? srow[jl] * sh.scale : -INFINITY;
        srow[jl] = x;
        tile_max = fmaxf(tile_max, x);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      const float m_new = fmaxf(m, tile_max);
      /* A row that has seen no visible key yet keeps m = -inf, l = 0 and zeros. */
      const float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new);
      float sum = 0.0f;
#pragma unroll 8
      for (int c = 0; c < kTile / 2; c++) {
        const int jl = 2 * c + side;
        const float x = srow[jl];
        const float p = x == -INFINITY ? 0.0f : expf(x - m_new);
        sum += p;
        prow[jl] = round16<T>((dropout && !kept_s[row * kTile + jl]) ? 0.0f : p);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      l = l * alpha + sum;
      m = m_new;
      float *orow = o_s + row * St::kHead32;
      for (int d = side; d < HD; d += 2) orow[d] *= alpha;
      __syncwarp();

      /* o += P v for this warp's rows, the accumulator kept in shared memory */
      warp_rows_times_tile<T, HD>(o_w, p_s + 16 * warp * St::kKeys16, v_s, true);
    }

    /* o = acc / l / (1-p); lse = m + log l, or o = 0 and lse = -inf with no visible key */
    const bool seen = l > 0.0f;
    if (side == 0 && i < S) a.lse[bh * S + i] = seen ? m + logf(l) : -INFINITY;
    __syncwarp(); /* the last P v is in o_s */
    const float out_scale = seen ? (1.0f / l) * sh.keep_scale : 0.0f;
    for (int d = side; d < HD; d += 2) o_s[row * St::kHead32 + d] *= out_scale;
    __syncwarp();
    write_warp_rows(a.o + b * S * sh.ld_o + col0, sh.ld_o, o_w, St::kHead32, i0 + 16 * warp, S,
                    (int)hd);
  }
#endif
}

/* ---------------------------------------------------------------- backward */

/* One block per (key tile, head, sample); dq was zeroed and D computed by attention.cu's
   row-dots kernel on the same stream. */
template <typename T, int HD>
__global__ void __launch_bounds__(kThreads) mma_backward_kernel(BackwardArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using L = BackwardLayout<HD>;
  using St = Strides<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  T *k_s = at<T>(smem, L::k), *v_s = at<T>(smem, L::v), *q_s = at<T>(smem, L::q);
  T *do_s = at<T>(smem, L::d_o), *pd_s = at<T>(smem, L::pd), *ds_s = at<T>(smem, L::ds);
  float *s_s = at<float>(smem, L::s), *dp_s = at<float>(smem, L::dp);
  float *stage_s = at<float>(smem, L::stage);
  float *lse_s = at<float>(smem, L::lse), *dr_s = at<float>(smem, L::d_rows);
  uint8_t *kept_s = at<uint8_t>(smem, L::kept);

  const AttentionShape &sh = a.sh;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = 16 * warp + (lane >> 1), side = lane & 1; /* this lane's score row */
  const int64_t S = sh.seq, H = sh.heads, BH = sh.batch * H, hd = sh.head_dim;
  const int64_t ld = sh.ld_qkv, ldo = sh.ld_o;
  const int64_t tiles = (S + kTile - 1) / kTile, items = tiles * BH;
  const bool dropout = sh.dropout > 0.0f; /* P' regenerated: this path reads no bits */
  float *stage_w = stage_s + 16 * warp * St::kHead32;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t kt = item / BH, bh = item % BH, b = bh / H, h = bh % H;
    const int64_t j0 = kt * kTile, col0 = h * hd;
    const int keys_valid = (int)(S - j0 < kTile ? S - j0 : kTile);

    __syncthreads(); /* the previous item's readers are done with k_s, v_s */
    load_rounded<T, HD>(k_s, a.k + (b * S + j0) * ld + col0, ld, keys_valid, (int)hd);
    load_rounded<T, HD>(v_s, a.v + (b * S + j0) * ld + col0, ld, keys_valid, (int)hd);

    FragC dk_acc[HD / 16], dv_acc[HD / 16]; /* this warp's 16 keys */
#pragma unroll
    for (int n = 0; n < HD / 16; n++) {
      wmma::fill_fragment(dk_acc[n], 0.0f);
      wmma::fill_fragment(dv_acc[n], 0.0f);
    }

    /* causal: query i sees key j iff j <= i, so tiles before j0's see none of these keys */
    for (int64_t qt = sh.causal ? j0 / kTile : 0; qt < tiles; qt++) {
      const int64_t i0 = qt * kTile, i = i0 + row;
      const int rows_valid = (int)(S - i0 < kTile ? S - i0 : kTile);
      __syncthreads(); /* the previous query tile's readers are done */
      load_rounded<T, HD>(q_s, a.q + (b * S + i0) * ld + col0, ld, rows_valid, (int)hd);
      load_rounded<T, HD>(do_s, a.d_o + (b * S + i0) * ldo + col0, ldo, rows_valid, (int)hd);
      for (int t = threadIdx.x; t < kTile; t += kThreads) {
        const bool valid = t < rows_valid;
        lse_s[t] = valid ? a.lse[bh * S + i0 + t] : 0.0f;
        dr_s[t] = valid ? a.d_rows[bh * S + i0 + t] : 0.0f;
      }
      if (dropout)
        fill_kept<kTile, kTile, kThreads>(kept_s, draw_index(sh, b, h, i0, j0), (uint64_t)S,
                                          rows_valid, sh);
      __syncthreads();

      /* S = q k^T and dP' = do v^T for this warp's query rows */
#pragma unroll
      for (int n = 0; n < kTile / 16; n++) {
        FragC s_acc, dp_acc;
        wmma::fill_fragment(s_acc, 0.0f);
        wmma::fill_fragment(dp_acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
          FragA<T> q_frag, do_frag;
          FragBt<T> k_frag, v_frag;
          const int a_at = 16 * warp * St::kHead16 + 16 * kk, b_at = 16 * n * St::kHead16 + 16 * kk;
          wmma::load_matrix_sync(q_frag, q_s + a_at, St::kHead16);
          wmma::load_matrix_sync(k_frag, k_s + b_at, St::kHead16);
          wmma::mma_sync(s_acc, q_frag, k_frag, s_acc);
          wmma::load_matrix_sync(do_frag, do_s + a_at, St::kHead16);
          wmma::load_matrix_sync(v_frag, v_s + b_at, St::kHead16);
          wmma::mma_sync(dp_acc, do_frag, v_frag, dp_acc);
        }
        const int c_at = 16 * warp * St::kKeys32 + 16 * n;
        wmma::store_matrix_sync(s_s + c_at, s_acc, St::kKeys32, wmma::mem_row_major);
        wmma::store_matrix_sync(dp_s + c_at, dp_acc, St::kKeys32, wmma::mem_row_major);
      }
      __syncwarp();

      /* P from lse, P' by the regenerated bits, dS = P (dP'' - D) with dP'' = dP' / (1-p)
         where P' != 0, else 0 (attention.cu's formula); 0 at hidden and outside keys */
      const float row_lse = lse_s[row], row_d = dr_s[row];
#pragma unroll 8
      for (int c = 0; c < kTile / 2; c++) {
        const int jl = 2 * c + side;
        const int64_t j = j0 + jl;
        float pd = 0.0f, ds = 0.0f;
        if (i < S && j < S && key_visible(sh, a.key_mask, b, i, j)) {
          const float p =
              row_lse == -INFINITY ? 0.0f
                                   : expf(s_s[row * St::kKeys32 + jl] * sh.scale - row_lse);
          const float dp = dp_s[row * St::kKeys32 + jl];
          if (!dropout) {
            pd = p;
            ds = p * (dp - row_d);
          } else {
            pd = kept_s[row * kTile + jl] ? p * sh.keep_scale : 0.0f;
            ds = p * ((pd != 0.0f ? dp * sh.keep_scale : 0.0f) - row_d);
          }
        }
        pd_s[row * St::kKeys16 + jl] = round16<T>(pd);
        ds_s[row * St::kKeys16 + jl] = round16<T>(ds * sh.scale);
      }
      __syncthreads(); /* every warp's rows of P' and dS are in place; s_s, dp_s are read */

      /* dv += P'^T do and dk += dS^T q for this warp's keys, over the tile's queries */
#pragma unroll
      for (int n = 0; n < HD / 16; n++)
#pragma unroll
        for (int kk = 0; kk < kTile / 16; kk++) {
          FragAt<T> pd_frag, ds_frag; /* transposed: the key is the fragment's row */
          FragB<T> do_frag, q_frag;
          const int a_at = 16 * kk * St::kKeys16 + 16 * warp, b_at = 16 * kk * St::kHead16 + 16 * n;
          wmma::load_matrix_sync(pd_frag, pd_s + a_at, St::kKeys16);
          wmma::load_matrix_sync(do_frag, do_s + b_at, St::kHead16);
          wmma::mma_sync(dv_acc[n], pd_frag, do_frag, dv_acc[n]);
          wmma::load_matrix_sync(ds_frag, ds_s + a_at, St::kKeys16);
          wmma::load_matrix_sync(q_frag, q_s + b_at, St::kHead16);
          wmma::mma_sync(dk_acc[n], ds_frag, q_frag, dk_acc[n]);
        }

      /* dq += dS k for this warp's query rows: through this warp's rows of stage_s (the
         room of s_s / dp_s, which every warp has read), then float atomics */
      warp_rows_times_tile<T, HD>(stage_w, ds_s + 16 * warp * St::kKeys16, k_s, false);
      __syncwarp();
      const int64_t first_query = i0 + 16 * warp;
      for (int r = 0; r < 16 && first_query + r < S; r++) {
        float *dqrow = a.dq + (b * S + first_query + r) * ld + col0;
        for (int d = lane; d < (int)hd; d += 32) atomicAdd(dqrow + d, stage_w[r * St::kHead32 + d]);
      }
    }

    /* this block's keys are all its own: plain stores through this warp's stage rows */
    float *dk_out = a.dk + b * S * ld + col0, *dv_out = a.dv + b * S * ld + col0;
    const int64_t first_key = j0 + 16 * warp;
    __syncwarp(); /* this warp's atomics have read its stage rows */
#pragma unroll
    for (int n = 0; n < HD / 16; n++)
      wmma::store_matrix_sync(stage_w + 16 * n, dk_acc[n], St::kHead32, wmma::mem_row_major);
    __syncwarp();
    write_warp_rows(dk_out, ld, stage_w, St::kHead32, first_key, S, (int)hd);
    __syncwarp();
#pragma unroll
    for (int n = 0; n < HD / 16; n++)
      wmma::store_matrix_sync(stage_w + 16 * n, dv_acc[n], St::kHead32, wmma::mem_row_major);
    __syncwarp();
    write_warp_rows(dv_out, ld, stage_w, St::kHead32, first_key, S, (int)hd);
  }
#endif
}

/* ---------------------------------------------------------------- launch */

/* Shared bytes of a call: the kept bits come last, and only dropout reads them (without,
   the HD = 128 forward fits twice in an H100 SM's 227 KiB). */
template <typename Layout>
size_t shared_bytes(const AttentionShape &sh) {
  return sh.dropout > 0.0f ? Layout::bytes : Layout::kept;
}

template <typename T, int HD>
int forward_as(const ForwardArgs &args, cudaStream_t stream) {
  const int64_t items = (args.sh.seq + kTile - 1) / kTile * args.sh.batch * args.sh.heads;
  return launch_tiles(mma_forward_kernel<T, HD>, kThreads, shared_bytes<ForwardLayout<HD>>(args.sh),
                      items, stream, args);
}

template <typename T, int HD>
int backward_as(const BackwardArgs &args, cudaStream_t stream) {
  const int64_t items = (args.sh.seq + kTile - 1) / kTile * args.sh.batch * args.sh.heads;
  return launch_tiles(mma_backward_kernel<T, HD>, kThreads,
                      shared_bytes<BackwardLayout<HD>>(args.sh), items, stream, args);
}

template <typename T>
int forward_typed(const ForwardArgs &args, cudaStream_t stream) {
  if (args.sh.head_dim <= 32) return forward_as<T, 32>(args, stream);
  if (args.sh.head_dim <= 64) return forward_as<T, 64>(args, stream);
  return forward_as<T, 128>(args, stream);
}

template <typename T>
int backward_typed(const BackwardArgs &args, cudaStream_t stream) {
  if (args.sh.head_dim <= 32) return backward_as<T, 32>(args, stream);
  if (args.sh.head_dim <= 64) return backward_as<T, 64>(args, stream);
  return backward_as<T, 128>(args, stream);
}

/* What the current device allows, asked once (a process uses one GPU): whether these
   kernels have bodies for it (compiled from compute_80 or later PTX: a build whose
   CUDA_ARCH stops below 80 has empty ones, which a newer GPU would JIT and run), and the
   shared bytes one block may opt in to (99 KiB on compute capability 8.6 / 8.9 parts, 227
   KiB on an H100). A failed query says no: fp32 then serves. */
struct MmaDevice {
  bool bodies;
  size_t shared_optin;
};

const MmaDevice &mma_device() {
  static const MmaDevice dev = [] {
    MmaDevice d = {false, 0};
    int device = 0, major = 0, optin = 0;
    cudaFuncAttributes attrs;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
            cudaSuccess &&
        cudaFuncGetAttributes(&attrs, mma_forward_kernel<__half, 32>) == cudaSuccess) {
      d.bodies = major >= 8 && attrs.ptxVersion >= 80;
      d.shared_optin = (size_t)optin;
    }
    (void)cudaGetLastError(); /* a failed query must not reach the next launcher's status */
    return d;
  }();
  return dev;
}

template <int HD>
bool fits(size_t optin, bool backward) {
  return (backward ? BackwardLayout<HD>::bytes : ForwardLayout<HD>::bytes) <= optin;
}

} /* namespace */

bool mma_serves(int dtype, int64_t head_dim, bool backward) {
  if (dtype != DT_BF16 && dtype != DT_F16) return false;
  const MmaDevice &dev = mma_device();
  if (!dev.bodies) return false;
  if (head_dim <= 32) return fits<32>(dev.shared_optin, backward);
  if (head_dim <= 64) return fits<64>(dev.shared_optin, backward);
  return head_dim <= 128 && fits<128>(dev.shared_optin, backward);
}

int mma_forward(const ForwardArgs &args, int dtype, cudaStream_t stream) {
  return dtype == DT_BF16 ? forward_typed<__nv_bfloat16>(args, stream)
                          : forward_typed<__half>(args, stream);
}

int mma_backward(const BackwardArgs &args, int dtype, cudaStream_t stream) {
  return dtype == DT_BF16 ? backward_typed<__nv_bfloat16>(args, stream)
                          : backward_typed<__half>(args, stream);
}

} /* namespace k_attention */
