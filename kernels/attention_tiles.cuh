/* SPDX-License-Identifier: MIT */
/* attention_tiles.cuh — what the two attention kernel files share: the call's shape and
 * arguments, which keys a query sees, the dropout draws of a tile, and the tile launcher.
 *
 * Purpose: attention.cu (fp32 on CUDA cores, every mode) and attention_flash.cu (16-bit
 * products on tensor cores, the flash mode) must agree on masking and dropout draw for
 * draw, so both take them from here. Only those two files include this.
 * Must never: hold state, or differ from the CPU backend's key_hidden / dropout_row.
 */
#ifndef L2L_KERNELS_ATTENTION_TILES_CUH
#define L2L_KERNELS_ATTENTION_TILES_CUH

#include <stdint.h>

#include "common.cuh"

namespace k_attention {

struct AttentionShape {
  int64_t batch, heads, seq, head_dim, ld_qkv, ld_o, first_sample;
  uint64_t seed, stream;
  float scale, dropout, keep_scale; /* keep_scale = 1.0f / (1.0f - dropout), as the CPU */
  uint32_t threshold;
  int causal;
};

struct ForwardArgs {
  float *o, *lse, *probs, *dropped;
  uint8_t *mask;
  const float *q, *k, *v;
  const uint8_t *key_mask;
  AttentionShape sh;
};

struct BackwardArgs {
  float *dq, *dk, *dv;
  const float *d_o, *lse, *probs, *dropped;
  const uint8_t *mask;
  const float *q, *k, *v;
  const uint8_t *key_mask;
  const float *d_rows; /* D_i = do_i . o_i, (batch, heads, seq) */
  AttentionShape sh;
};

/* Draw index of element (b, h, i, j) at block site 0, with the CPU's uint64 arithmetic
   (modulo 2^64: first_sample may be as large as INT64_MAX, so b is added unsigned). */
__device__ __forceinline__ uint64_t draw_index(const AttentionShape &sh, int64_t b, int64_t h,
                                               int64_t i, int64_t j) {
  return (((uint64_t)sh.first_sample + (uint64_t)b) * (uint64_t)sh.heads + (uint64_t)h) *
             (uint64_t)(sh.seq * sh.seq) +
         (uint64_t)(i * sh.seq) + (uint64_t)j;
}

/* Key j hidden from query i: causal future or masked-out key (the CPU's key_hidden). */
__device__ __forceinline__ bool key_visible(const AttentionShape &sh, const uint8_t *key_mask,
                                            int64_t b, int64_t i, int64_t j) {
  return !(sh.causal && j > i) && (key_mask == nullptr || key_mask[b * sh.seq + j] != 0);
}

/* kept[r][c] := whether draw first + r*row_stride + c survives dropout, for r < rows_valid
   and c < COLS, by a block of NT threads. One thread per Philox block of a row (COLS/4 + 1
   cover an unaligned run of COLS draws), so each block is computed once, not per word. */
template <int ROWS, int COLS, int NT>
__device__ __forceinline__ void fill_kept(uint8_t *kept, uint64_t first, uint64_t row_stride,
                                          int rows_valid, const AttentionShape &sh) {
  constexpr int kBlocksPerRow = COLS / 4 + 1;
  for (int t = threadIdx.x; t < ROWS * kBlocksPerRow; t += NT) {
    const int r = t / kBlocksPerRow, block_in_row = t % kBlocksPerRow;
    if (r >= rows_valid) continue;
    const uint64_t row_first = first + (uint64_t)r * row_stride;
    const uint64_t block = (row_first >> 2) + (uint64_t)block_in_row;
    const uint4 w = k_philox(sh.seed, sh.stream, block);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int u = 0; u < 4; u++) {
      /* column of word u: from -3 (before the row's first draw) to COLS + 3 */
      const int64_t col = (int64_t)(block * 4u + (uint64_t)u - row_first);
      if (col >= 0 && col < COLS) kept[r * COLS + col] = k_kept(words[u], sh.threshold) ? 1 : 0;
    }
  }
}

/* Allow `smem` bytes of dynamic shared memory, then launch one block of `threads` per
   item (kernels loop over items, so a capped grid is fine). An attribute failure is
   cleared from the runtime's last error, so that it does not leak into the next
   launcher's status. */
template <typename Args>
inline int launch_tiles(void (*kernel)(Args), int threads, size_t smem, int64_t items,
                        cudaStream_t stream, const Args &args) {
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return (int)err;
  }
  const unsigned grid = (unsigned)(items < K_GRID_MAX_BLOCKS ? items : K_GRID_MAX_BLOCKS);
  K_LAUNCH(grid, threads, smem, stream, kernel)(args);
  return k_launched();
}

/* The flash kernels on tensor cores (attention_flash.cu): 16-bit q, k, v and do of the
   products' dtype (DT_BF16 or DT_F16) read as they lie, rows 16-byte aligned. */
struct FlashArgs {
  const void *q, *k, *v, *d_o; /* the products' dtype; d_o backward only, rows ld_do apart */
  int64_t ld_do;
  void *o;                     /* forward: written, f32 or (o16) the products' dtype */
  const void *o_in;            /* backward: o as the forward wrote it, f32 or (o16) */
  float *lse;                  /* written by the forward, read by the backward */
  void *dq, *dk, *dv;          /* backward: written, f32 or (out16) the products' dtype */
  int64_t ld_dqkv;             /* their rows' stride */
  float *d_rows;               /* backward: D = do . o, (batch, heads, seq), written there */
  const uint8_t *key_mask;
  bool o16, out16;
  AttentionShape sh;
};

/* Whether the flash kernels serve a forward or backward of head_dim in `dtype` on this GPU
   (compute capability 8.0 or later, a build with their bodies, head_dim a multiple of 8 up
   to 128, and the shared memory their tiles take), and their launchers, which take
   arguments attention.cu's launchers have checked. */
bool flash_serves(int dtype, int64_t head_dim, bool backward);
int flash_forward(const FlashArgs &args, int dtype, cudaStream_t stream);
int flash_backward(const FlashArgs &args, int dtype, cudaStream_t stream);

} /* namespace k_attention */

#endif /* L2L_KERNELS_ATTENTION_TILES_CUH */
