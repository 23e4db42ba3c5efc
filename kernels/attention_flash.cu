/* SPDX-License-Identifier: MIT */
/* attention_flash.cu — flash attention forward and backward on tensor cores, in
 * FlashAttention-2's shape: 16-bit (bf16 or f16) q, k, v and do read as they lie, every
 * product summed in fp32 in registers.
 *
 * Purpose: attention is the one part of a block whose products cuBLAS does not run. Where
 * cuDNN's fused attention does not serve a call (dropout, a key mask, no cuDNN, a shape it
 * refuses) and the relay's precision is 16-bit, the launchers of attention.cu send the flash
 * mode here: the same results as attention.cu's fp32 kernels within 16-bit rounding, with
 * the same masks, the same dropout draws and the same lse (so any backward can follow any
 * forward, cuDNN's included).
 *
 * Layout of the work: a block of 4 warps owns 64 rows, 16 a warp: queries in the forward
 * and in the dq kernel, keys in the dk/dv kernel. It walks the other side in tiles (64 keys;
 * 64 queries, 32 at head dim 128). Tiles come from global memory by cp.async, 16 bytes a
 * copy, the next tile's copies in flight while the current one is used (two stages). Rows
 * in shared memory are padded by 16 bytes, so that the eight row addresses of an ldmatrix
 * fall in eight distinct bank groups. Operands reach the tensor cores by ldmatrix (.trans
 * for the operand whose rows run along the product's inner dimension) and mma.sync
 * m16n8k16. S, P, dP, dS and the output sums stay in registers: a score tile's accumulator
 * fragment is, element for element, the A fragment of the product that follows it (P v,
 * dS k, P'^T do, dS^T q), rounded to 16 bits as it is packed.
 *
 * Fragments (PTX ISA, mma.m16n8k16): lane = 4 g + t. An accumulator of 16 x 8 holds rows
 * g and g + 8, columns 2t and 2t + 1; an A fragment of 16 x 16 is four such registers
 * pairs: (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..).
 *
 * Masks are evaluated only on tiles that can hold a hidden key (the causal diagonal, a last
 * partial tile, a key mask). Exponentials are exp2f of scores scaled by scale log2(e); lse
 * is stored in natural log, as attention.cu and cuDNN store it.
 *
 * The backward is two kernels and no atomics: per query tile, dq (S and dP recomputed over
 * the keys it sees; D = do . o computed there, first, and written for the second kernel),
 * then per key tile dk and dv (S^T and dP^T recomputed over the queries that see them).
 * Where rounding enters: q, k, v, do as given; P (unnormalised, after dropout) in the
 * forward; P' and dS in the backward. Row sums, max, lse and D stay fp32.
 *
 * Proven without a GPU: spec/c/backend/test_attention_emulated.c runs these kernels' source,
 * through attention.cu's launchers, on CPU threads (attention_emulated.cpp) against the
 * CPU's attention, and ThreadSanitizer checks their shared-memory accesses against the
 * barriers there.
 *
 * Must never: write a column outside (h head_dim, + head_dim) of o, dq, dk, dv (those are
 * column slices of bigger buffers); run on a GPU before compute capability 8.0 (the bodies
 * compile to nothing there and flash_serves says no); call __syncthreads under a condition
 * that is not the same for the whole block.
 */
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention_tiles.cuh"

namespace k_attention {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps; /* a block's own rows: queries (forward, dq), keys (dk, dv) */
constexpr int kKeys = 64;          /* keys a tile in the forward and the dq kernel */
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

/* Queries a tile in the dk/dv kernel: 32 at head dim 128, whose dk and dv sums take 128
   registers a thread already. */
template <int HD>
__host__ __device__ constexpr int inner_queries() {
  return HD == 128 ? 32 : 64;
}

/* A shared tile of ROWS rows of HD 16-bit elements, each row 16 bytes longer (ldmatrix's
   eight rows then start in distinct bank groups; rows stay 16-byte aligned for cp.async). */
template <int HD>
__host__ __device__ constexpr int stride() {
  return HD + 8;
}
template <int ROWS, int HD>
__host__ __device__ constexpr size_t tile_bytes() {
  return 2 * (size_t)ROWS * stride<HD>();
}

/* Byte offsets of each kernel's shared arrays; `kept` (the dropout bits of a tile) comes
   last, so a call without dropout asks for `kept` bytes. */
template <int HD>
struct ForwardSmem {
  static constexpr size_t q = 0, k = q + tile_bytes<kRows, HD>(), v = k + 2 * tile_bytes<kKeys, HD>();
  static constexpr size_t kept = v + 2 * tile_bytes<kKeys, HD>(), bytes = kept + kRows * kKeys;
};
template <int HD>
struct DqSmem {
  static constexpr size_t q = 0, d_o = q + tile_bytes<kRows, HD>(), k = d_o + tile_bytes<kRows, HD>();
  static constexpr size_t v = k + 2 * tile_bytes<kKeys, HD>(), lse = v + 2 * tile_bytes<kKeys, HD>();
  static constexpr size_t d = lse + 4 * kRows, kept = d + 4 * kRows, bytes = kept + kRows * kKeys;
};
template <int HD>
struct DkvSmem {
  static constexpr int kQ = inner_queries<HD>();
  static constexpr size_t k = 0, v = k + tile_bytes<kRows, HD>(), q = v + tile_bytes<kRows, HD>();
  static constexpr size_t d_o = q + 2 * tile_bytes<kQ, HD>(), lse = d_o + 2 * tile_bytes<kQ, HD>();
  static constexpr size_t d = lse + 4 * kQ, kept = d + 4 * kQ, bytes = kept + kQ * kRows;
};

template <typename X>
__device__ __forceinline__ X *at(unsigned char *base, size_t offset) {
  return reinterpret_cast<X *>(base + offset);
}

/* ---------------------------------------------------------------- PTX */

/* (spec/c/backend/attention_emulated.cpp compiles this file for the CPU with
   L2L_FLASH_EMULATE defined: it gives copy16_async, copies_commit, copies_wait,
   load_matrices, load_matrices_transposed and mma of its own.) */
#ifndef L2L_FLASH_EMULATE
__device__ __forceinline__ uint32_t smem_address(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes from global src to shared dst, or 16 zero bytes where !valid (src is then not
   read, but must still be a mapped address). */
__device__ __forceinline__ void copy16_async(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* Wait until at most N of this thread's committed groups are still in flight. */
template <int N>
__device__ __forceinline__ void copies_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8 x 8 matrices of 16-bit elements; lanes 8m .. 8m + 7 give matrix m's row addresses. */
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

/* c (16 x 8, fp32) += a (16 x 16) b (16 x 8), a row-major, b column-major, 16-bit T. */
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif /* !L2L_FLASH_EMULATE */

/* lo and hi rounded to T (to nearest even), lo in the low half: one register of a
   fragment, lo the lower column. */
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &h, 4);
  } else {
    __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&r, &h, 4);
  }
  return r;
}

template <typename T>
__device__ __forceinline__ float widen(T x) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    return __bfloat162float(x);
  else
    return __half2float(x);
}

/* ---------------------------------------------------------------- warp products */

/* acc (16 x N) := a b^T: a the warp's 16 rows of a tile, b N rows of a tile, both of HD
   columns (stride<HD>() apart). S = q k^T, dP = do v^T, S^T = k q^T, dP^T = v do^T. */
template <typename T, int HD, int N>
__device__ __forceinline__ void rows_times_rows(float (&acc)[N / 8][4], const T *a, const T *b,
                                                int lane) {
  constexpr int St = stride<HD>();
#pragma unroll
  for (int n = 0; n < N / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    uint32_t af[4];
    /* matrices: rows 0-7 | 8-15 of columns 0-7, then of columns 8-15 */
    load_matrices(af, a + (lane & 15) * St + 16 * kk + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < N / 16; np++) {
      uint32_t bf[4];
      /* matrices: b rows 0-7 columns 0-7 | 8-15, then b rows 8-15 columns 0-7 | 8-15: the
         two registers of output columns 0-7, then of 8-15 */
      load_matrices(bf, b + (16 * np + (lane & 7) + ((lane >> 4) << 3)) * St + 16 * kk +
                            ((lane >> 3) & 1) * 8);
      mma<T>(acc[2 * np], af, bf[0], bf[1]);
      mma<T>(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

/* out (16 x HD) += p b: p the warp's 16 x K accumulators (rounded to T as packed), b a
   tile of K rows of HD columns. o += P v, dq += dS k, dv += P'^T do, dk += dS^T q. */
template <typename T, int HD, int K>
__device__ __forceinline__ void frags_times_rows(float (&out)[HD / 8][4], const float (&p)[K / 8][4],
                                                 const T *b, int lane) {
  constexpr int St = stride<HD>();
#pragma unroll
  for (int kc = 0; kc < K / 16; kc++) {
    const uint32_t af[4] = {pack2<T>(p[2 * kc][0], p[2 * kc][1]), pack2<T>(p[2 * kc][2], p[2 * kc][3]),
                            pack2<T>(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                            pack2<T>(p[2 * kc + 1][2], p[2 * kc + 1][3])};
#pragma unroll
    for (int dp = 0; dp < HD / 16; dp++) {
      uint32_t bf[4];
      /* transposed matrices: b rows 0-7 | 8-15 of columns 0-7, then of columns 8-15 */
      load_matrices_transposed(bf, b + (16 * kc + (lane & 7) + ((lane >> 3) & 1) * 8) * St +
                                       16 * dp + (lane >> 4) * 8);
      mma<T>(out[2 * dp], af, bf[0], bf[1]);
      mma<T>(out[2 * dp + 1], af, bf[2], bf[3]);
    }
  }
}

/* Row (0..15) and column (0..8N) of accumulator element e of fragment n, for this lane. */
__device__ __forceinline__ int frag_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int frag_col(int lane, int n, int e) {
  return 8 * n + 2 * (lane & 3) + (e & 1);
}

/* Max and sum over the four lanes of a quad (one accumulator row). */
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* ---------------------------------------------------------------- tiles */

/* tile rows [0, ROWS) := src's rows (ld elements apart) by cp.async, HD columns; rows at or
   past rows_valid and columns at or past head_dim (a multiple of 8) zero. */
template <typename T, int ROWS, int HD>
__device__ __forceinline__ void load_tile(T *tile, const T *src, int64_t ld, int rows_valid,
                                          int head_dim) {
  constexpr int kChunks = HD / 8;
  for (int e = threadIdx.x; e < ROWS * kChunks; e += kThreads) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const bool valid = r < rows_valid && c < head_dim;
    copy16_async(tile + r * stride<HD>() + c, valid ? src + (int64_t)r * ld + c : src, valid);
  }
}

/* Rows [r0, r0 + ROWS) of x and y (at their heads' columns; ldx, ldy apart; rows past seq
   zero) into two tiles, queued and committed as one group with any copies queued before. */
template <typename T, int ROWS, int HD>
__device__ __forceinline__ void load_tile_pair(T *x_tile, const T *x, int64_t ldx, T *y_tile,
                                               const T *y, int64_t ldy, int64_t r0, int64_t seq,
                                               int head_dim) {
  const int rows = (int)(seq - r0 < ROWS ? seq - r0 : ROWS);
  load_tile<T, ROWS, HD>(x_tile, x + r0 * ldx, ldx, rows, head_dim);
  load_tile<T, ROWS, HD>(y_tile, y + r0 * ldy, ldy, rows, head_dim);
  copies_commit();
}

/* The current stage's copies complete: every group but the next stage's, where one was
   queued after them. */
__device__ __forceinline__ void copies_wait_current(bool next_queued) {
  if (next_queued)
    copies_wait<1>();
  else
    copies_wait<0>();
}

/* A query row's lse in log2 units, the base of its P = exp2(score - it): +inf (P = 0) for a
   row past seq (!valid) or one that sees no key (lse -inf). */
__device__ __forceinline__ float lse_log2(const float *lse, int64_t at, bool valid) {
  const float x = valid ? lse[at] : -INFINITY;
  return x == -INFINITY ? INFINITY : x * kLog2e;
}

/* dst[i] := x as f32 or, where half, as T. */
template <typename T>
__device__ __forceinline__ void store(void *dst, bool half, int64_t i, float x) {
  if (!half)
    static_cast<float *>(dst)[i] = x;
  else if constexpr (std::is_same<T, __nv_bfloat16>::value)
    static_cast<T *>(dst)[i] = __float2bfloat16_rn(x);
  else
    static_cast<T *>(dst)[i] = __float2half_rn(x);
}

/* out's (16 x HD) rows of this warp to dst rows first_row + 0..15 (ld apart), columns below
   head_dim, rows below seq, each multiplied by its row's factor. */
template <typename T, int HD>
__device__ __forceinline__ void store_rows(void *dst, bool half, int64_t ld, const float (&out)[HD / 8][4],
                                           const float (&factor)[2], int64_t first_row,
                                           int64_t seq, int head_dim, int lane) {
#pragma unroll
  for (int n = 0; n < HD / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int64_t row = first_row + frag_row(lane, e);
      const int d = frag_col(lane, n, e);
      if (row < seq && d < head_dim) store<T>(dst, half, row * ld + d, out[n][e] * factor[e >> 1]);
    }
}

/* Whether a tile of `keys` keys from j0 may hide one of them from a query of the tile from
   i0: a key mask, keys past seq, or (causal) a key after the tile's first query. */
__device__ __forceinline__ bool tile_masked(const AttentionShape &sh, const uint8_t *key_mask,
                                            int64_t i0, int64_t j0, int keys) {
  return key_mask != nullptr || j0 + keys > sh.seq || (sh.causal && j0 + keys - 1 > i0);
}
__device__ __forceinline__ bool visible(const AttentionShape &sh, const uint8_t *key_mask,
                                        int64_t b, int64_t i, int64_t j) {
  return j < sh.seq && key_visible(sh, key_mask, b, i, j);
}

/* Items of a call, a block's at a time: tiles of kRows rows (queries, or keys in the dk/dv
   kernel) by heads by samples. */
__host__ __device__ __forceinline__ int64_t tile_items(const AttentionShape &sh) {
  return (sh.seq + kRows - 1) / kRows * sh.batch * sh.heads;
}

/* A query tile of the forward and the dq kernel (one item): its tile, head and sample, the
   heaviest causal tiles first, and the key tiles its queries see. */
struct QueryTile {
  int64_t bh, b, h, i0, col0;
  int rows_valid, key_tiles;
};
__device__ __forceinline__ QueryTile query_tile(const AttentionShape &sh, int64_t item) {
  const int64_t S = sh.seq, BH = sh.batch * sh.heads, q_tiles = (S + kRows - 1) / kRows;
  QueryTile t;
  t.bh = item % BH, t.b = t.bh / sh.heads, t.h = t.bh % sh.heads;
  t.i0 = (q_tiles - 1 - item / BH) * kRows, t.col0 = t.h * sh.head_dim;
  t.rows_valid = (int)(S - t.i0 < kRows ? S - t.i0 : kRows);
  const int64_t kend = sh.causal ? (t.i0 + kRows < S ? t.i0 + kRows : S) : S;
  t.key_tiles = (int)((kend + kKeys - 1) / kKeys);
  return t;
}

/* The key side of a query tile's walk (forward, dq): key tile jt's k and v rows in stage
   jt & 1 of shared memory (no array of stage pointers: a run-time index would put it in
   local memory). */
template <typename T, int HD>
struct KeyWalk {
  unsigned char *smem;
  size_t k_at, v_at; /* stage 0's tiles */
  const T *kb, *vb;  /* sample b's key and value rows, at the head's columns */
  int64_t ld, seq;
  int head_dim;
  __device__ __forceinline__ T *k(int stage) const { return at<T>(smem, k_at + stage * tile_bytes<kKeys, HD>()); }
  __device__ __forceinline__ T *v(int stage) const { return at<T>(smem, v_at + stage * tile_bytes<kKeys, HD>()); }
  /* tile jt's copies queued and committed (with any copies this thread queued before) */
  __device__ __forceinline__ void load(int jt) const {
    load_tile_pair<T, kKeys, HD>(k(jt & 1), kb, ld, v(jt & 1), vb, ld, (int64_t)jt * kKeys, seq,
                                 head_dim);
  }
  /* Tile jt ready for the whole block: tile jt + 1's copies queued first (they run under
     jt's products), the dropout bits of the query tile's rows against tile jt drawn into
     kept, then jt's copies waited for. */
  __device__ __forceinline__ void ready(int jt, const QueryTile &t, uint8_t *kept,
                                        const AttentionShape &sh) const {
    const bool more = jt + 1 < t.key_tiles;
    if (more) load(jt + 1);
    if (sh.dropout > 0.0f)
      fill_kept<kRows, kKeys, kThreads>(kept, draw_index(sh, t.b, t.h, t.i0, (int64_t)jt * kKeys),
                                        (uint64_t)seq, t.rows_valid, sh);
    copies_wait_current(more);
    __syncthreads();
  }
};

/* Query tile t's key walk, its stage 0 at k_at and v_at of smem. */
template <typename T, int HD>
__device__ __forceinline__ KeyWalk<T, HD> key_walk(unsigned char *smem, size_t k_at, size_t v_at,
                                                   const FlashArgs &a, const QueryTile &t) {
  const int64_t S = a.sh.seq, ld = a.sh.ld_qkv;
  return {smem, k_at, v_at, static_cast<const T *>(a.k) + t.b * S * ld + t.col0,
          static_cast<const T *>(a.v) + t.b * S * ld + t.col0, ld, S, (int)a.sh.head_dim};
}

/* tile := query tile t's rows of x (the products' dtype, rows ld apart) at its head's
   columns, copies queued. */
template <typename T, int HD>
__device__ __forceinline__ void load_query_rows(T *tile, const void *x, int64_t ld,
                                                const FlashArgs &a, const QueryTile &t) {
  load_tile<T, kRows, HD>(tile, static_cast<const T *>(x) + (t.b * a.sh.seq + t.i0) * ld + t.col0,
                          ld, t.rows_valid, (int)a.sh.head_dim);
}

/* ---------------------------------------------------------------- forward */

/* One block per (query tile, head, sample), the heaviest causal tiles first. */
template <typename T, int HD>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(FlashArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using L = ForwardSmem<HD>;
  constexpr int St = stride<HD>();
  K_DYNAMIC_SHARED(unsigned char, smem);
  T *q_s = at<T>(smem, L::q);
  uint8_t *kept_s = at<uint8_t>(smem, L::kept);

  const AttentionShape &sh = a.sh;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t S = sh.seq, items = tile_items(sh);
  const float scale2 = sh.scale * kLog2e;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const QueryTile t = query_tile(sh, item);
    const KeyWalk<T, HD> keys = key_walk<T, HD>(smem, L::k, L::v, a, t);
    __syncthreads(); /* the previous item's readers are done with every tile */
    load_query_rows<T, HD>(q_s, a.q, sh.ld_qkv, a, t);
    keys.load(0);

    float o[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int jt = 0; jt < t.key_tiles; jt++) {
      const int64_t j0 = (int64_t)jt * kKeys;
      keys.ready(jt, t, kept_s, sh);
      float s[kKeys / 8][4];
      rows_times_rows<T, HD, kKeys>(s, q_s + 16 * warp * St, keys.k(jt & 1), lane);

      /* scaled scores, -inf where hidden; the tile's row max */
      const bool masked = tile_masked(sh, a.key_mask, t.i0, j0, kKeys);
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kKeys / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float x = s[n][e] * scale2;
          if (masked && !visible(sh, a.key_mask, t.b, t.i0 + 16 * warp + frag_row(lane, e),
                                 j0 + frag_col(lane, n, e)))
            x = -INFINITY;
          s[n][e] = x;
          tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
        }
      /* online softmax: a row that has seen no visible key keeps m = -inf, l = 0, o = 0 */
      float alpha[2], base[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
        base[r] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = exp2f(m[r] - base[r]);
        m[r] = m_new;
      }
#pragma unroll
      for (int n = 0; n < kKeys / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float p = exp2f(s[n][e] - base[e >> 1]);
          sum[e >> 1] += p; /* l sums every visible key, dropped or not */
          if (sh.dropout > 0.0f &&
              !kept_s[(16 * warp + frag_row(lane, e)) * kKeys + frag_col(lane, n, e)])
            p = 0.0f;
          s[n][e] = p;
        }
#pragma unroll
      for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
#pragma unroll
      for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] *= alpha[e >> 1];

      frags_times_rows<T, HD, kKeys>(o, s, keys.v(jt & 1), lane);
      __syncthreads(); /* every warp is done with this stage before copies into it */
    }

    /* o = acc / l / (1-p); lse = m + log l, or o = 0 and lse = -inf with no visible key */
    float factor[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const float row_l = quad_sum(l[r]);
      const bool seen = row_l > 0.0f;
      factor[r] = seen ? sh.keep_scale / row_l : 0.0f;
      const int64_t i = t.i0 + 16 * warp + (lane >> 2) + 8 * r;
      if ((lane & 3) == 0 && i < S)
        a.lse[t.bh * S + i] = seen ? (m[r] + log2f(row_l)) * kLn2 : -INFINITY;
    }
    store_rows<T, HD>(static_cast<char *>(a.o) + (t.b * S * sh.ld_o + t.col0) * (a.o16 ? 2 : 4),
                      a.o16, sh.ld_o, o, factor, t.i0 + 16 * warp, S, (int)sh.head_dim, lane);
  }
#endif
}

/* ---------------------------------------------------------------- backward: dq */

/* One block per (query tile, head, sample), the heaviest causal tiles first: D = do . o for
   its rows (to d_rows, for the dk/dv kernel), then dq = sum over key tiles of dS k. */
template <typename T, int HD>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(FlashArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using L = DqSmem<HD>;
  constexpr int St = stride<HD>();
  K_DYNAMIC_SHARED(unsigned char, smem);
  T *q_s = at<T>(smem, L::q), *do_s = at<T>(smem, L::d_o);
  float *lse_s = at<float>(smem, L::lse), *d_s = at<float>(smem, L::d);
  uint8_t *kept_s = at<uint8_t>(smem, L::kept);

  const AttentionShape &sh = a.sh;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t S = sh.seq, ldo = sh.ld_o, items = tile_items(sh);
  const int hd = (int)sh.head_dim;
  const bool dropout = sh.dropout > 0.0f;
  const float scale2 = sh.scale * kLog2e;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const QueryTile t = query_tile(sh, item);
    const KeyWalk<T, HD> keys = key_walk<T, HD>(smem, L::k, L::v, a, t);
    __syncthreads(); /* the previous item's readers are done with every tile */
    load_query_rows<T, HD>(q_s, a.q, sh.ld_qkv, a, t);
    load_query_rows<T, HD>(do_s, a.d_o, a.ld_do, a, t);
    copies_commit();
    keys.load(0); /* a group of its own: in flight while D is found */
    /* lse in log2 units; +inf for rows past seq or with no visible key, so that P = 0 */
    for (int r = threadIdx.x; r < kRows; r += kThreads)
      lse_s[r] = lse_log2(a.lse, t.bh * S + t.i0 + r, r < t.rows_valid);
    copies_wait<1>(); /* q and do */
    __syncthreads();

    /* D = do . o for this warp's 16 rows, do as the products read it, o as the forward
       wrote it; to d_rows for the dk/dv kernel */
    for (int r = 0; r < 16; r++) {
      const int row = 16 * warp + r;
      const int64_t i = t.i0 + row;
      float dot = 0.0f;
      if (row < t.rows_valid)
        for (int d = lane; d < hd; d += 32) {
          const int64_t at_o = (t.b * S + i) * ldo + t.col0 + d;
          const float o = a.o16 ? widen(static_cast<const T *>(a.o_in)[at_o])
                                : static_cast<const float *>(a.o_in)[at_o];
          dot += widen(do_s[row * St + d]) * o;
        }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      if (lane == 0) {
        d_s[row] = dot;
        if (row < t.rows_valid) a.d_rows[t.bh * S + i] = dot;
      }
    }
    __syncwarp();
    const int r0 = 16 * warp + (lane >> 2);
    const float row_lse[2] = {lse_s[r0], lse_s[r0 + 8]}, row_d[2] = {d_s[r0], d_s[r0 + 8]};

    float dq[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    for (int jt = 0; jt < t.key_tiles; jt++) {
      const int64_t j0 = (int64_t)jt * kKeys;
      keys.ready(jt, t, kept_s, sh);
      float s[kKeys / 8][4], dp[kKeys / 8][4];
      rows_times_rows<T, HD, kKeys>(s, q_s + 16 * warp * St, keys.k(jt & 1), lane);
      rows_times_rows<T, HD, kKeys>(dp, do_s + 16 * warp * St, keys.v(jt & 1), lane);

      /* dS = P (dP'' - D) scale, dP'' = dP / (1-p) where kept, else 0; 0 where hidden */
      const bool masked = tile_masked(sh, a.key_mask, t.i0, j0, kKeys);
#pragma unroll
      for (int n = 0; n < kKeys / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const bool seen = !masked || visible(sh, a.key_mask, t.b, t.i0 + 16 * warp + frag_row(lane, e),
                                               j0 + frag_col(lane, n, e));
          const float p = seen ? exp2f(s[n][e] * scale2 - row_lse[e >> 1]) : 0.0f;
          float dpv = dp[n][e];
          if (dropout)
            dpv = kept_s[(16 * warp + frag_row(lane, e)) * kKeys + frag_col(lane, n, e)]
                      ? dpv * sh.keep_scale
                      : 0.0f;
          s[n][e] = p * (dpv - row_d[e >> 1]) * sh.scale;
        }
      frags_times_rows<T, HD, kKeys>(dq, s, keys.k(jt & 1), lane);
      __syncthreads(); /* every warp is done with this stage before copies into it */
    }
    const float one[2] = {1.0f, 1.0f};
    store_rows<T, HD>(static_cast<char *>(a.dq) + (t.b * S * a.ld_dqkv + t.col0) * (a.out16 ? 2 : 4),
                      a.out16, a.ld_dqkv, dq, one, t.i0 + 16 * warp, S, hd, lane);
  }
#endif
}

/* ---------------------------------------------------------------- backward: dk, dv */

/* One block per (key tile, head, sample), the heaviest causal tiles (the first keys)
   first: dk and dv of its 64 keys over the query tiles that can see them, from the lse of
   the forward and the D of the dq kernel (queued before this one on the same stream). */
template <typename T, int HD>
__global__ void __launch_bounds__(kThreads) flash_dkdv_kernel(FlashArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using L = DkvSmem<HD>;
  constexpr int St = stride<HD>(), kQ = L::kQ;
  K_DYNAMIC_SHARED(unsigned char, smem);
  T *k_s = at<T>(smem, L::k), *v_s = at<T>(smem, L::v);
  auto q_s = [&](int i) { return at<T>(smem, L::q + i * tile_bytes<kQ, HD>()); };
  auto do_s = [&](int i) { return at<T>(smem, L::d_o + i * tile_bytes<kQ, HD>()); };
  float *lse_s = at<float>(smem, L::lse), *d_s = at<float>(smem, L::d);
  uint8_t *kept_s = at<uint8_t>(smem, L::kept);

  const AttentionShape &sh = a.sh;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t S = sh.seq, H = sh.heads, BH = sh.batch * H, ld = sh.ld_qkv;
  const int hd = (int)sh.head_dim;
  const int64_t items = tile_items(sh), q_tiles = (S + kQ - 1) / kQ;
  const bool dropout = sh.dropout > 0.0f;
  const float scale2 = sh.scale * kLog2e;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t kt = item / BH, bh = item % BH, b = bh / H, h = bh % H;
    const int64_t j0 = kt * kRows, col0 = h * hd;
    const int keys_valid = (int)(S - j0 < kRows ? S - j0 : kRows);
    const T *qb = static_cast<const T *>(a.q) + b * S * ld + col0;
    const T *dob = static_cast<const T *>(a.d_o) + b * S * a.ld_do + col0;
    /* causal: query i sees key j iff j <= i, so tiles before j0's see none of these keys */
    const int64_t qt0 = sh.causal ? j0 / kQ : 0;

    __syncthreads(); /* the previous item's readers are done with every tile */
    load_tile<T, kRows, HD>(k_s, static_cast<const T *>(a.k) + (b * S + j0) * ld + col0, ld,
                            keys_valid, hd);
    load_tile<T, kRows, HD>(v_s, static_cast<const T *>(a.v) + (b * S + j0) * ld + col0, ld,
                            keys_valid, hd);
    load_tile_pair<T, kQ, HD>(q_s(0), qb, ld, do_s(0), dob, a.ld_do, qt0 * kQ, S, hd);

    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    for (int64_t qt = qt0; qt < q_tiles; qt++) {
      const int64_t i0 = qt * kQ;
      const int stage = (int)((qt - qt0) & 1);
      const int rows_valid = (int)(S - i0 < kQ ? S - i0 : kQ);
      const bool more = qt + 1 < q_tiles;
      if (more)
        load_tile_pair<T, kQ, HD>(q_s(stage ^ 1), qb, ld, do_s(stage ^ 1), dob, a.ld_do, i0 + kQ, S,
                                  hd);
      /* lse in log2 units, +inf for queries past seq or with no visible key (P = 0) */
      for (int t = threadIdx.x; t < kQ; t += kThreads) {
        lse_s[t] = lse_log2(a.lse, bh * S + i0 + t, t < rows_valid);
        d_s[t] = t < rows_valid ? a.d_rows[bh * S + i0 + t] : 0.0f;
      }
      if (dropout) /* kept_s[query][key] */
        fill_kept<kQ, kRows, kThreads>(kept_s, draw_index(sh, b, h, i0, j0), (uint64_t)S,
                                       rows_valid, sh);
      copies_wait_current(more);
      __syncthreads();

      float st[kQ / 8][4], dpt[kQ / 8][4]; /* S^T and dP^T: this warp's 16 keys by kQ queries */
      rows_times_rows<T, HD, kQ>(st, k_s + 16 * warp * St, q_s(stage), lane);
      rows_times_rows<T, HD, kQ>(dpt, v_s + 16 * warp * St, do_s(stage), lane);

      /* P'^T into st, dS^T = P^T (dP''^T - D) scale into dpt */
      const bool masked = tile_masked(sh, a.key_mask, i0, j0, kRows);
#pragma unroll
      for (int n = 0; n < kQ / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = 16 * warp + frag_row(lane, e), query = frag_col(lane, n, e);
          const bool seen = !masked || visible(sh, a.key_mask, b, i0 + query, j0 + key);
          const float p = seen ? exp2f(st[n][e] * scale2 - lse_s[query]) : 0.0f;
          float pd = p, dpv = dpt[n][e];
          if (dropout) {
            const bool kept = kept_s[query * kRows + key] != 0;
            pd = kept ? p * sh.keep_scale : 0.0f;
            dpv = kept ? dpv * sh.keep_scale : 0.0f;
          }
          st[n][e] = pd;
          dpt[n][e] = p * (dpv - d_s[query]) * sh.scale;
        }
      frags_times_rows<T, HD, kQ>(dv, st, do_s(stage), lane);
      frags_times_rows<T, HD, kQ>(dk, dpt, q_s(stage), lane);
      __syncthreads(); /* every warp is done with this stage, lse_s and d_s */
    }
    const float one[2] = {1.0f, 1.0f};
    const size_t elem = a.out16 ? 2 : 4;
    const int64_t ldg = a.ld_dqkv;
    store_rows<T, HD>(static_cast<char *>(a.dk) + (b * S * ldg + col0) * elem, a.out16, ldg, dk,
                      one, j0 + 16 * warp, S, hd, lane);
    store_rows<T, HD>(static_cast<char *>(a.dv) + (b * S * ldg + col0) * elem, a.out16, ldg, dv,
                      one, j0 + 16 * warp, S, hd, lane);
  }
#endif
}

/* ---------------------------------------------------------------- launch */

/* Shared bytes of a call: the kept bits come last, and only dropout reads them. */
template <typename Layout>
size_t shared_bytes(const AttentionShape &sh) {
  return sh.dropout > 0.0f ? Layout::bytes : Layout::kept;
}

template <typename T, int HD>
int forward_as(const FlashArgs &args, cudaStream_t stream) {
  const int64_t items = tile_items(args.sh);
  return launch_tiles(flash_forward_kernel<T, HD>, kThreads,
                      shared_bytes<ForwardSmem<HD>>(args.sh), items, stream, args);
}

template <typename T, int HD>
int backward_as(const FlashArgs &args, cudaStream_t stream) {
  const int64_t items = tile_items(args.sh);
  int err = launch_tiles(flash_dq_kernel<T, HD>, kThreads, shared_bytes<DqSmem<HD>>(args.sh),
                         items, stream, args);
  if (err != 0) return err;
  return launch_tiles(flash_dkdv_kernel<T, HD>, kThreads, shared_bytes<DkvSmem<HD>>(args.sh),
                      items, stream, args);
}

template <typename T>
int forward_typed(const FlashArgs &args, cudaStream_t stream) {
  if (args.sh.head_dim <= 32) return forward_as<T, 32>(args, stream);
  if (args.sh.head_dim <= 64) return forward_as<T, 64>(args, stream);
  return forward_as<T, 128>(args, stream);
}

template <typename T>
int backward_typed(const FlashArgs &args, cudaStream_t stream) {
  if (args.sh.head_dim <= 32) return backward_as<T, 32>(args, stream);
  if (args.sh.head_dim <= 64) return backward_as<T, 64>(args, stream);
  return backward_as<T, 128>(args, stream);
}

/* What the current device allows, asked once (a process uses one GPU): whether these
   kernels have bodies for it (compiled from compute_80 or later PTX: a build whose
   CUDA_ARCH stops below 80 has empty ones, which a newer GPU would JIT and run), and the
   shared bytes one block may opt in to (99 KiB on compute capability 8.6 / 8.9 parts, 227
   KiB on an H100). A failed query says no: fp32 then serves. */
struct FlashDevice {
  bool bodies;
  size_t shared_optin;
};

const FlashDevice &flash_device() {
  static const FlashDevice dev = [] {
    FlashDevice d = {false, 0};
    int device = 0, major = 0, optin = 0;
    cudaFuncAttributes attrs;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
            cudaSuccess &&
        cudaFuncGetAttributes(&attrs, flash_forward_kernel<__half, 32>) == cudaSuccess) {
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
  if (!backward) return ForwardSmem<HD>::bytes <= optin;
  return DqSmem<HD>::bytes <= optin && DkvSmem<HD>::bytes <= optin;
}

} /* namespace */

bool flash_serves(int dtype, int64_t head_dim, bool backward) {
  if (dtype != DT_BF16 && dtype != DT_F16) return false;
  if (head_dim <= 0 || head_dim > 128 || head_dim % 8 != 0) return false;
  const FlashDevice &dev = flash_device();
  if (!dev.bodies) return false;
  if (head_dim <= 32) return fits<32>(dev.shared_optin, backward);
  if (head_dim <= 64) return fits<64>(dev.shared_optin, backward);
  return fits<128>(dev.shared_optin, backward);
}

int flash_forward(const FlashArgs &args, int dtype, cudaStream_t stream) {
  return dtype == DT_BF16 ? forward_typed<__nv_bfloat16>(args, stream)
                          : forward_typed<__half>(args, stream);
}

int flash_backward(const FlashArgs &args, int dtype, cudaStream_t stream) {
  return dtype == DT_BF16 ? backward_typed<__nv_bfloat16>(args, stream)
                          : backward_typed<__half>(args, stream);
}

} /* namespace k_attention */
