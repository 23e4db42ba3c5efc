/* SPDX-License-Identifier: MIT */
/* reduce.cu — the CUDA backend's reductions (bias gradient, whole-tensor sum / max|x| /
 * sum of squares), the index range check, and embedding gather / scatter-add.
 *
 * Purpose: device versions of the CPU backend's cpu_bias_backward, cpu_reduce,
 * cpu_find_out_of_range, cpu_embedding_forward and cpu_embedding_backward (the CPU
 * defines every result). Sums that feed parameter gradients or the loss scaler use a
 * fixed partition and a fixed combining order (two passes through a caller-provided
 * scratch buffer), and the embedding scatter-add sums each row's positions in their order,
 * so a rerun on the same inputs gives the same bits; atomics only find the first index
 * of a check (the least of the candidates, whatever order they land in). Launchers are
 * declared in reduce.h.
 * Its kernels are static: the CPU emulation of this file (spec/c/backend/) links beside it.
 * Must never: synchronize, allocate, print or exit; make a result depend on timing or on
 * pointer alignment.
 */
#include <math.h>
#include <stdint.h>

#include "map.cuh"
#include "reduce.h"

/* ---------------------------------------------------------------- bias_backward
   A block is 32 columns x 8 row lanes (each warp reads 32 consecutive floats of a row).
   Rows are split into `chunks` chunks of rows_per_chunk rows; block (tile, chunk) sums
   its chunk's rows of its 32 columns: lane y takes rows y, y+8, ... in order, then lane 0
   adds the 8 lane sums in order. With one chunk the block adds straight into dbias;
   otherwise it writes partial[chunk][col] and a second kernel adds each column's
   partials in a fixed order (a warp a column). The plan depends only on (rows, cols). A
   16-bit dy (DT) is widened as it is read: the same sums of the same values. */

enum { BIAS_TILE_COLS = 32, BIAS_ROW_LANES = 8, BIAS_TARGET_BLOCKS = 2048, BIAS_MIN_ROWS = 32 };

struct bias_plan {
  int64_t chunks, rows_per_chunk, col_tiles;
};

static bias_plan plan_bias_backward(int64_t rows, int64_t cols) {
  bias_plan plan;
  plan.col_tiles = (cols + BIAS_TILE_COLS - 1) / BIAS_TILE_COLS;
  int64_t wanted = (BIAS_TARGET_BLOCKS + plan.col_tiles - 1) / plan.col_tiles;
  int64_t most = (rows + BIAS_MIN_ROWS - 1) / BIAS_MIN_ROWS; /* keep chunks worth a block */
  int64_t chunks = wanted < most ? wanted : most;
  if (chunks < 1) chunks = 1;
  plan.rows_per_chunk = (rows + chunks - 1) / chunks;
  if (plan.rows_per_chunk < 1) plan.rows_per_chunk = 1;
  plan.chunks = (rows + plan.rows_per_chunk - 1) / plan.rows_per_chunk;
  if (plan.chunks < 1) plan.chunks = 1;
  return plan;
}

extern "C" int64_t k_bias_backward_scratch_floats(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  bias_plan plan = plan_bias_backward(rows, cols);
  return plan.chunks == 1 ? 0 : plan.chunks * cols;
}

template <int DT>
static __global__ void __launch_bounds__(BIAS_TILE_COLS * BIAS_ROW_LANES)
    column_chunk_sums(float *dst, bool add_into_dst, const void *dy, int64_t rows,
                      int64_t cols, int64_t rows_per_chunk) {
  K_STATIC_SHARED(float, lane_sums, [BIAS_ROW_LANES][BIAS_TILE_COLS]);
  const int64_t col = (int64_t)blockIdx.x * BIAS_TILE_COLS + threadIdx.x;
  const int64_t first = (int64_t)blockIdx.y * rows_per_chunk;
  const int64_t end = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float acc = 0.0f;
  if (col < cols) {
#pragma unroll 4
    for (int64_t r = first + threadIdx.y; r < end; r += BIAS_ROW_LANES)
      acc += load_as_f32<DT>(dy, r * cols + col);
  }
  lane_sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = lane_sums[0][threadIdx.x];
#pragma unroll
    for (int lane = 1; lane < BIAS_ROW_LANES; lane++) total += lane_sums[lane][threadIdx.x];
    if (add_into_dst) dst[col] += total;
    else dst[(int64_t)blockIdx.y * cols + col] = total;
  }
}

/* A warp a column: lane l adds chunks l, l + 32, ... in order, then the lanes' sums meet
   in a butterfly (the same bits every run). A thread a column, adding every chunk in turn,
   left GPT-2's 768 columns 768 threads walking 86 partials each: bound by latency (the
   whole op at 0.19 of the copy rate on an H200, 4096 x 768). */
static __global__ void __launch_bounds__(L2L_THREADS)
    add_chunk_sums(float *dbias, const float *partial, int64_t chunks, int64_t cols) {
  const int lane = (int)(threadIdx.x & 31), warps_per_block = (int)(blockDim.x >> 5);
  const int64_t warps = (int64_t)gridDim.x * warps_per_block;
  for (int64_t col = (int64_t)blockIdx.x * warps_per_block + (threadIdx.x >> 5); col < cols;
       col += warps) {   /* (col is the warp's: every lane reaches the butterfly) */
    float total = 0.0f;
    for (int64_t k = lane; k < chunks; k += 32) total += partial[k * cols + col];
    total = k_warp_sum(total);
    if (lane == 0) dbias[col] += total;
  }
}

extern "C" int k_bias_backward(float *dbias, const void *dy, int dy_dtype, int64_t rows,
                               int64_t cols, float *scratch, void *stream) {
  if (rows < 0 || cols < 0) return invalid_argument();
  if (dy_dtype != DT_F32 && dy_dtype != DT_BF16 && dy_dtype != DT_F16) return invalid_argument();
  if (rows == 0 || cols == 0) return 0; /* dbias += nothing */
  cudaStream_t s = (cudaStream_t)stream;
  bias_plan plan = plan_bias_backward(rows, cols);
  if (plan.chunks > 1 && scratch == NULL) return invalid_argument();
  /* col_tiles <= 2^31-1 holds for any matrix that fits in memory; chunks <= 2048 */
  if (plan.col_tiles > 0x7fffffff) return invalid_argument();
  dim3 grid((unsigned)plan.col_tiles, (unsigned)plan.chunks);
  dim3 block(BIAS_TILE_COLS, BIAS_ROW_LANES);
  const bool one = plan.chunks == 1;
  float *dst = one ? dbias : scratch;
  const int64_t per_chunk = plan.rows_per_chunk;
  if (dy_dtype == DT_F32)
    K_LAUNCH(grid, block, 0, s, column_chunk_sums<DT_F32>)(dst, one, dy, rows, cols, per_chunk);
  else if (dy_dtype == DT_BF16)
    K_LAUNCH(grid, block, 0, s, column_chunk_sums<DT_BF16>)(dst, one, dy, rows, cols, per_chunk);
  else
    K_LAUNCH(grid, block, 0, s, column_chunk_sums<DT_F16>)(dst, one, dy, rows, cols, per_chunk);
  if (one) return k_launched();
  int status = k_launched();
  if (status != 0) return status;
  K_LAUNCH(k_blocks_for(32 * cols), L2L_THREADS, 0, s, add_chunk_sums)(dbias, scratch,
                                                                        plan.chunks, cols);
  return k_launched();
}

/* ---------------------------------------------------------------- reduce
   Pass 1: `parts` blocks (a function of n only, at most 1024); thread t of the grid takes
   the groups of four elements t, t + threads, t + 2 threads, ... (one float4 when x is
   aligned, four loads otherwise: the same elements in the same order either way, so the
   result does not depend on x's alignment), then each block combines its threads in a
   fixed tree into scratch[block]. Pass 2: one block combines the parts in a fixed order
   into *out. One part (n <= REDUCE_PER_PART) writes *out directly. */

enum { REDUCE_SUM = 0, REDUCE_MAX_ABS = 1, REDUCE_SUMSQ = 2 };
enum { REDUCE_PER_PART = 4096 };

/* The max that keeps a NaN once seen (fmax would drop it): the CPU's max_abs is NaN as
   soon as any element is. */
static __device__ __forceinline__ double nan_sticky_max(double acc, double v) {
  return (v > acc || v != v) ? v : acc;
}

template <int KIND>
static __device__ __forceinline__ double combine(double a, double b) {
  if constexpr (KIND == REDUCE_MAX_ABS) return nan_sticky_max(a, b);
  else return a + b;
}

template <int KIND>
static __device__ __forceinline__ double element_term(float v) {
  if constexpr (KIND == REDUCE_SUM) return (double)v;
  else if constexpr (KIND == REDUCE_MAX_ABS) return (double)fabsf(v);
  else return (double)v * (double)v;
}

/* Every thread gets the block's combined value; `shared` holds 32 doubles. Fixed order:
   a butterfly within each warp, then warp 0 over the warp results. */
template <int KIND>
static __device__ double block_combine(double v, double *shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = combine<KIND>(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0; /* 0 is neutral for both + and max of |x| */
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = combine<KIND>(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  return v;
}

/* The CPU reports NAN itself, not the NaN it met: give the same bits. */
template <int KIND>
static __device__ __forceinline__ double final_value(double v) {
  if (KIND == REDUCE_MAX_ABS && v != v) return __longlong_as_double(0x7ff8000000000000ll);
  return v;
}

template <int KIND>
static __global__ void __launch_bounds__(L2L_THREADS)
    reduce_parts(double *dst, const float *x, int64_t n, bool vectorized) {
  K_STATIC_SHARED(double, shared, [32]);
  const int64_t groups = (n + 3) >> 2, stride = grid_threads();
  double acc = 0.0;
  for (int64_t g = thread_index(); g < groups; g += stride) {
    const int64_t i = g << 2;
    float v0, v1, v2, v3;
    if (vectorized && i + 4 <= n) {
      float4 q = reinterpret_cast<const float4 *>(x)[g];
      v0 = q.x, v1 = q.y, v2 = q.z, v3 = q.w;
    } else { /* missing elements of the last group add nothing: 0 is neutral */
      v0 = x[i];
      v1 = i + 1 < n ? x[i + 1] : 0.0f;
      v2 = i + 2 < n ? x[i + 2] : 0.0f;
      v3 = i + 3 < n ? x[i + 3] : 0.0f;
    }
    acc = combine<KIND>(acc, element_term<KIND>(v0));
    acc = combine<KIND>(acc, element_term<KIND>(v1));
    acc = combine<KIND>(acc, element_term<KIND>(v2));
    acc = combine<KIND>(acc, element_term<KIND>(v3));
  }
  acc = block_combine<KIND>(acc, shared);
  if (threadIdx.x == 0) dst[blockIdx.x] = gridDim.x == 1 ? final_value<KIND>(acc) : acc;
}

template <int KIND>
static __global__ void __launch_bounds__(L2L_THREADS)
    reduce_finish(double *out, const double *parts, int64_t count) {
  K_STATIC_SHARED(double, shared, [32]);
  double acc = 0.0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) acc = combine<KIND>(acc, parts[k]);
  acc = block_combine<KIND>(acc, shared);
  if (threadIdx.x == 0) *out = final_value<KIND>(acc);
}

template <int KIND>
static int launch_reduce(double *out, const float *x, int64_t n, double *scratch,
                         cudaStream_t s) {
  if (n == 0) { /* the CPU's result for no elements: 0 for every kind */
    K_LAUNCH(1, L2L_THREADS, 0, s, reduce_finish<KIND>)(out, NULL, 0);
    return k_launched();
  }
  int64_t parts = (n + REDUCE_PER_PART - 1) / REDUCE_PER_PART;
  if (parts > L2L_K_REDUCE_SCRATCH_DOUBLES) parts = L2L_K_REDUCE_SCRATCH_DOUBLES;
  if (parts == 1) {
    K_LAUNCH(1, L2L_THREADS, 0, s, reduce_parts<KIND>)(out, x, n, aligned16(x));
    return k_launched();
  }
  if (scratch == NULL) return invalid_argument();
  K_LAUNCH((unsigned)parts, L2L_THREADS, 0, s, reduce_parts<KIND>)(scratch, x, n, aligned16(x));
  int status = k_launched();
  if (status != 0) return status;
  K_LAUNCH(1, L2L_THREADS, 0, s, reduce_finish<KIND>)(out, scratch, parts);
  return k_launched();
}

extern "C" int k_reduce(double *out, int kind, const float *x, int64_t n, double *scratch,
                        void *stream) {
  if (n < 0 || out == NULL) return invalid_argument();
  cudaStream_t s = (cudaStream_t)stream;
  switch (kind) {
    case REDUCE_SUM: return launch_reduce<REDUCE_SUM>(out, x, n, scratch, s);
    case REDUCE_MAX_ABS: return launch_reduce<REDUCE_MAX_ABS>(out, x, n, scratch, s);
    case REDUCE_SUMSQ: return launch_reduce<REDUCE_SUMSQ>(out, x, n, scratch, s);
    default: return invalid_argument();
  }
}

/* ---------------------------------------------------------------- find_out_of_range
   *out starts as all ones: -1 read as int64 and the largest value for the unsigned
   atomicMin, so it stays -1 unless some index is smaller; no finishing pass. */

static __global__ void set_all_ones(unsigned long long *out) { *out = ~0ull; }

static __global__ void __launch_bounds__(L2L_THREADS)
    find_out_of_range_kernel(unsigned long long *out, const int32_t *values, int64_t n,
                             int32_t lo, int32_t hi, int32_t except) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    const int32_t value = values[i];
    if ((value < lo || value >= hi) && value != except) {
      atomicMin(out, (unsigned long long)i);
      return; /* this thread's later indices are larger */
    }
  }
}

extern "C" int k_find_out_of_range(int64_t *out, const int32_t *values, int64_t n,
                                   int32_t lo, int32_t hi, int32_t except, void *stream) {
  if (n < 0 || out == NULL) return invalid_argument();
  cudaStream_t s = (cudaStream_t)stream;
  unsigned long long *first = reinterpret_cast<unsigned long long *>(out);
  K_LAUNCH(1, 1, 0, s, set_all_ones)(first);
  if (n == 0) return k_launched();
  K_LAUNCH(k_blocks_for(n), L2L_THREADS, 0, s, find_out_of_range_kernel)(first, values, n, lo,
                                                                        hi, except);
  return k_launched();
}

/* ---------------------------------------------------------------- layernorm_uninvertible
   The first LayerNorm channel whose weight cannot undo the normalisation, by the same
   all-ones start and atomicMin as find_out_of_range. */

static __global__ void __launch_bounds__(L2L_THREADS)
    layernorm_uninvertible_kernel(unsigned long long *out, const float *weight,
                                  const float *bias, int64_t n, float min_weight,
                                  float bias_ratio) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    const float w = fabsf(weight[i]);
    if (!(w >= min_weight) || w * bias_ratio < fabsf(bias[i])) {
      atomicMin(out, (unsigned long long)i);
      return;
    }
  }
}

extern "C" int k_layernorm_uninvertible(int64_t *out, const float *weight,
                                        const float *bias, int64_t n, float min_weight,
                                        float bias_ratio, void *stream) {
  if (n < 0 || out == NULL) return invalid_argument();
  cudaStream_t s = (cudaStream_t)stream;
  unsigned long long *first = reinterpret_cast<unsigned long long *>(out);
  K_LAUNCH(1, 1, 0, s, set_all_ones)(first);
  if (n == 0) return k_launched();
  K_LAUNCH(k_blocks_for(n), L2L_THREADS, 0, s, layernorm_uninvertible_kernel)(
      first, weight, bias, n, min_weight, bias_ratio);
  return k_launched();
}

/* ---------------------------------------------------------------- embedding
   A block of 256 threads serves 256 / threads_per_row token rows at a time, each row's
   columns (float4s when cols % 4 == 0 and the pointers are aligned) spread over its
   threads_per_row threads, so narrow rows do not leave most of a block idle. */

struct row_layout {
  int threads_per_row; /* 32, 64, 128 or 256 */
  bool vectorized;
};

static row_layout plan_rows(int64_t cols, const void *a, const void *b) {
  row_layout layout;
  layout.vectorized = (cols & 3) == 0 && aligned16(a) && aligned16(b);
  int64_t units = layout.vectorized ? cols >> 2 : cols;
  layout.threads_per_row = 32;
  while (layout.threads_per_row < L2L_THREADS && layout.threads_per_row < units)
    layout.threads_per_row *= 2;
  return layout;
}

static unsigned row_blocks(int64_t n, int threads_per_row) {
  int64_t rows_per_block = L2L_THREADS / threads_per_row;
  int64_t blocks = (n + rows_per_block - 1) / rows_per_block;
  if (blocks > K_GRID_MAX_BLOCKS) blocks = K_GRID_MAX_BLOCKS; /* row loops cover the rest */
  return (unsigned)blocks;
}

static __global__ void __launch_bounds__(L2L_THREADS)
    embedding_forward_kernel(float *out, const int32_t *ids, const float *table, int64_t n,
                             int64_t cols, int threads_per_row, bool vectorized) {
  const int rows_per_block = blockDim.x / threads_per_row;
  const int lane = threadIdx.x % threads_per_row;
  const int64_t units = vectorized ? cols >> 2 : cols;
  for (int64_t i = (int64_t)blockIdx.x * rows_per_block + threadIdx.x / threads_per_row; i < n;
       i += (int64_t)gridDim.x * rows_per_block) {
    const int64_t src_row = (int64_t)ids[i] * units, dst_row = i * units;
    if (vectorized) {
      const float4 *src = reinterpret_cast<const float4 *>(table) + src_row;
      float4 *dst = reinterpret_cast<float4 *>(out) + dst_row;
      for (int64_t c = lane; c < units; c += threads_per_row) dst[c] = src[c];
    } else {
      for (int64_t c = lane; c < units; c += threads_per_row) out[dst_row + c] = table[src_row + c];
    }
  }
}

/* The same from a 16-bit table (a device copy in bf16 or f16), widened exactly. */
template <int DT>
static __global__ void __launch_bounds__(L2L_THREADS)
    embedding_forward_half_kernel(float *out, const int32_t *ids, const uint16_t *table,
                                  int64_t n, int64_t cols, int threads_per_row) {
  const int rows_per_block = blockDim.x / threads_per_row;
  const int lane = threadIdx.x % threads_per_row;
  for (int64_t i = (int64_t)blockIdx.x * rows_per_block + threadIdx.x / threads_per_row; i < n;
       i += (int64_t)gridDim.x * rows_per_block) {
    const uint16_t *src = table + (int64_t)ids[i] * cols;
    float *dst = out + i * cols;
    for (int64_t c = lane; c < cols; c += threads_per_row)
      dst[c] = DT == DT_F16 ? f16_to_f32(src[c]) : bf16_to_f32(src[c]);
  }
}

/* The table's gradient, summed in a fixed order: the CPU's (each row adds the positions
   holding its id in their order), so the result is the CPU's to the bit and the same run
   after run, where atomics would add repeated tokens in whatever order they land. One warp
   per position and slice of kEmbeddingSlice columns (units: float4s when vectorized): the
   first position holding an id owns its row's slice and adds every later one's; the others
   leave. The scans read the ids (n of them, cached), so a micro-batch of n positions costs
   about n^2 / 32 warp steps: 0.5 M at 4 Ki positions, under the gradient's own traffic. */
constexpr int64_t kEmbeddingSlice = 128;

static __global__ void __launch_bounds__(L2L_THREADS)
    embedding_backward_kernel(float *dtable, const float *dout, const int32_t *ids, int64_t n,
                              int64_t cols, int64_t slices, bool vectorized) {
  const int lane = threadIdx.x & 31, warps_per_block = blockDim.x >> 5;
  const int64_t units = vectorized ? cols >> 2 : cols;
  for (int64_t w = (int64_t)blockIdx.x * warps_per_block + (threadIdx.x >> 5); w < n * slices;
       w += (int64_t)gridDim.x * warps_per_block) {
    const int64_t i = w / slices, u0 = (w % slices) * kEmbeddingSlice;
    const int64_t u1 = u0 + kEmbeddingSlice < units ? u0 + kEmbeddingSlice : units;
    const int32_t id = ids[i];
    bool owned_earlier = false; /* warp-uniform: every loop below is the whole warp's */
    for (int64_t j0 = 0; j0 < i && !owned_earlier; j0 += 32) {
      const int64_t j = j0 + lane;
      owned_earlier = __any_sync(0xffffffffu, j < i && ids[j] == id);
    }
    if (owned_earlier) continue;
    for (int64_t j0 = i; j0 < n; j0 += 32) {
      const int64_t j = j0 + lane;
      unsigned hits = __ballot_sync(0xffffffffu, j < n && ids[j] == id);
      while (hits) { /* the positions in order: lowest bit first */
        const int64_t k = j0 + __ffs((int)hits) - 1;
        hits &= hits - 1;
        if (vectorized) {
          float4 *dst = reinterpret_cast<float4 *>(dtable) + (int64_t)id * units;
          const float4 *src = reinterpret_cast<const float4 *>(dout) + k * units;
          for (int64_t c = u0 + lane; c < u1; c += 32) {
            float4 d = dst[c];
            const float4 g = src[c];
            d.x += g.x;
            d.y += g.y;
            d.z += g.z;
            d.w += g.w;
            dst[c] = d;
          }
        } else {
          float *dst = dtable + (int64_t)id * cols;
          const float *src = dout + k * cols;
          for (int64_t c = u0 + lane; c < u1; c += 32) dst[c] += src[c];
        }
      }
    }
  }
}

extern "C" int k_embedding_forward(float *out, const int32_t *ids, const void *table,
                                   int table_dtype, int64_t n, int64_t cols, void *stream) {
  if (n < 0 || cols < 0) return invalid_argument();
  if (table_dtype != DT_F32 && table_dtype != DT_F16 && table_dtype != DT_BF16)
    return invalid_argument();
  if (n == 0 || cols == 0) return 0;
  row_layout layout = plan_rows(cols, out, table);
  unsigned blocks = row_blocks(n, layout.threads_per_row);
  cudaStream_t s = (cudaStream_t)stream;
  const uint16_t *half = static_cast<const uint16_t *>(table);
  if (table_dtype == DT_F16)
    K_LAUNCH(blocks, L2L_THREADS, 0, s, embedding_forward_half_kernel<DT_F16>)(
        out, ids, half, n, cols, layout.threads_per_row);
  else if (table_dtype == DT_BF16)
    K_LAUNCH(blocks, L2L_THREADS, 0, s, embedding_forward_half_kernel<DT_BF16>)(
        out, ids, half, n, cols, layout.threads_per_row);
  else
    K_LAUNCH(blocks, L2L_THREADS, 0, s, embedding_forward_kernel)(
        out, ids, static_cast<const float *>(table), n, cols, layout.threads_per_row,
        layout.vectorized);
  return k_launched();
}

extern "C" int k_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                    int64_t n, int64_t vocab, int64_t cols, void *stream) {
  (void)vocab;
  if (n < 0 || cols < 0) return invalid_argument();
  if (n == 0 || cols == 0) return 0;
  row_layout layout = plan_rows(cols, dout, dtable);
  const int64_t units = layout.vectorized ? cols >> 2 : cols;
  const int64_t slices = (units + kEmbeddingSlice - 1) / kEmbeddingSlice;
  K_LAUNCH(row_blocks(n * slices, 32), L2L_THREADS, 0, (cudaStream_t)stream,
           embedding_backward_kernel)(dtable, dout, ids, n, cols, slices, layout.vectorized);
  return k_launched();
}
