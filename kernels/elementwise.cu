/* SPDX-License-Identifier: MIT */
/* elementwise.cu — the CUDA backend's element-wise ops, fills, casts and random fills.
 *
 * Purpose: device versions of the CPU backend's element-wise functions (src/backend/cpu/;
 * GELU's are gelu.cu's;
 * the CPU defines every result): same argument meanings, same aliasing rules, bit-identical
 * where the CPU's result is exact (casts, fills, dropout masks, uniform draws) and within
 * float rounding elsewhere. Memory-bound kernels are grid-stride loops that move float4s
 * when every pointer is 16-byte aligned (checked at run time by the launcher), with a
 * scalar path for the tail and for misaligned pointers. Launchers are declared in
 * elementwise.h.
 * Aliasing: where an output may be an input, each thread reads its elements before it
 * writes them and no thread touches another's elements, so exact aliasing is safe (no
 * __restrict__, no __ldg on possibly-aliased inputs).
 * Must never: synchronize, allocate, print or exit; use fast-math intrinsics (__expf...)
 * or cuda_fp16/cuda_bf16 conversions (their rounding of NaN differs from core.h's).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "elementwise.h"
#include "map.cuh"

/* ---------------------------------------------------------------- add */

struct AddOp {
  float *out;
  const float *a, *b;
  __device__ void scalar(int64_t i) const { out[i] = a[i] + b[i]; }
  __device__ void quad(int64_t q) const {
    float4 x = load4(a, q), y = load4(b, q);
    store4(out, q, make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
  }
};

extern "C" int k_add(float *out, const float *a, const float *b, int64_t n, void *stream) {
  bool vec = aligned16(out) && aligned16(a) && aligned16(b);
  return launch_map(AddOp{out, a, b}, n, vec, stream);
}

/* ---------------------------------------------------------------- bias_add
   Flat grid-stride over units (float4s when cols % 4 == 0 and aligned, else floats).
   Each thread divides once for its starting column and then steps it by stride % width
   with one conditional wrap, so the loop has no 64-bit division. HALF: the sums go to y16
   rounded (four in one 8-byte store when vectorized), y is only read. */

template <bool HALF>
static __global__ void __launch_bounds__(L2L_THREADS)
    bias_add_kernel(float *y, uint16_t *y16, int y16_dtype, const float *bias, int64_t rows,
                    int64_t cols, bool vectorized) {
  const int64_t per_row = vectorized ? cols >> 2 : cols;
  const int64_t total = rows * per_row, stride = grid_threads();
  int64_t u = thread_index();
  if (u >= total) return;
  int64_t col = u % per_row;
  const int64_t col_step = stride % per_row;
  for (; u < total; u += stride) {
    if (vectorized) {
      float4 v = load4(y, u), b = load4(bias, col);
      float4 s = make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w);
      if (HALF) store_halves4(y16 + 4 * u, s.x, s.y, s.z, s.w, y16_dtype, true);
      else store4(y, u, s);
    } else if (HALF) {
      y16[u] = f32_to_16(y[u] + bias[col], y16_dtype);
    } else {
      y[u] += bias[col];
    }
    col += col_step;
    if (col >= per_row) col -= per_row;
  }
}

extern "C" int k_bias_add(float *y, void *y16, int y16_dtype, const float *bias, int64_t rows,
                          int64_t cols, void *stream) {
  if (rows < 0 || cols < 0) return invalid_argument();
  if (y16 != NULL && y16_dtype != DT_BF16 && y16_dtype != DT_F16) return invalid_argument();
  if (rows == 0 || cols == 0) return 0;
  bool vec = (cols & 3) == 0 && aligned16(y) && aligned16(bias) && ((uintptr_t)y16 & 7) == 0;
  int64_t units = rows * (vec ? cols >> 2 : cols);
  uint16_t *h = static_cast<uint16_t *>(y16);
  cudaStream_t s = (cudaStream_t)stream;
  if (h != NULL)
    K_LAUNCH(k_blocks_for(units), L2L_THREADS, 0, s, bias_add_kernel<true>)(
        y, h, y16_dtype, bias, rows, cols, vec);
  else
    K_LAUNCH(k_blocks_for(units), L2L_THREADS, 0, s, bias_add_kernel<false>)(
        y, h, 0, bias, rows, cols, vec);
  return k_launched();
}

/* ---------------------------------------------------------------- dropout */

static __device__ __forceinline__ uint32_t word_of(uint4 w, unsigned k) {
  return k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
}

/* One thread per mask byte: its 8 draws first+8b .. first+8b+7 lie in at most three
   Philox blocks, each computed once (the CPU caches blocks the same way). */
static __global__ void __launch_bounds__(L2L_THREADS)
    dropout_forward_kernel(float *y, uint8_t *mask, const float *x, float keep_scale,
                           uint32_t threshold, uint64_t seed, uint64_t rng_stream,
                           uint64_t first, int64_t n, bool vectorized) {
  const int64_t bytes = (n + 7) >> 3, stride = grid_threads();
  for (int64_t byte = thread_index(); byte < bytes; byte += stride) {
    const int64_t start = byte << 3;
    const int count = n - start < 8 ? (int)(n - start) : 8;
    const uint64_t index0 = first + (uint64_t)start, block0 = index0 >> 2;
    const uint64_t last_block = (index0 + (uint64_t)(count - 1)) >> 2;
    const uint4 w0 = k_philox(seed, rng_stream, block0);
    const uint4 w1 = last_block != block0 ? k_philox(seed, rng_stream, block0 + 1) : w0;
    const uint4 w2 = last_block == block0 + 2 ? k_philox(seed, rng_stream, block0 + 2) : w0;
    unsigned kept = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      uint64_t index = index0 + (uint64_t)j, offset = (index >> 2) - block0;
      uint4 w = offset == 0 ? w0 : offset == 1 ? w1 : w2;
      if (j < count) kept |= (unsigned)k_kept(word_of(w, (unsigned)(index & 3)), threshold) << j;
    }
    if (vectorized && count == 8) {
      float4 lo = load4(x, byte * 2), hi = load4(x, byte * 2 + 1);
      store4(y, byte * 2,
             make_float4(kept & 1u ? lo.x * keep_scale : 0.0f, kept & 2u ? lo.y * keep_scale : 0.0f,
                         kept & 4u ? lo.z * keep_scale : 0.0f, kept & 8u ? lo.w * keep_scale : 0.0f));
      store4(y, byte * 2 + 1,
             make_float4(kept & 16u ? hi.x * keep_scale : 0.0f, kept & 32u ? hi.y * keep_scale : 0.0f,
                         kept & 64u ? hi.z * keep_scale : 0.0f,
                         kept & 128u ? hi.w * keep_scale : 0.0f));
    } else {
      for (int j = 0; j < count; j++)
        y[start + j] = (kept >> j) & 1u ? x[start + j] * keep_scale : 0.0f;
    }
    if (mask) mask[byte] = (uint8_t)kept; /* NULL: regenerating a backward's mask */
  }
}

extern "C" int k_dropout_forward(float *y, uint8_t *mask, const float *x, float p,
                                 uint32_t threshold, uint64_t seed, uint64_t rng_stream,
                                 int64_t first, int64_t n, void *stream) {
  if (n < 0) return invalid_argument();
  if (n == 0) return 0;
  const float keep_scale = 1.0f / (1.0f - p); /* in float, as cpu_dropout_forward */
  bool vec = aligned16(y) && aligned16(x);
  K_LAUNCH(k_blocks_for((n + 7) >> 3), L2L_THREADS, 0, (cudaStream_t)stream,
           dropout_forward_kernel)(y, mask, x, keep_scale, threshold, seed, rng_stream,
                                   (uint64_t)first, n, vec);
  return k_launched();
}

struct DropoutBackwardOp {
  float *dx;
  const float *dy;
  const uint8_t *mask;
  float keep_scale;
  __device__ void scalar(int64_t i) const {
    dx[i] = (mask[i >> 3] >> (i & 7)) & 1 ? dy[i] * keep_scale : 0.0f;
  }
  __device__ void quad(int64_t q) const {
    unsigned nibble = (unsigned)mask[q >> 1] >> ((q & 1) * 4);
    float4 d = load4(dy, q);
    store4(dx, q,
           make_float4(nibble & 1u ? d.x * keep_scale : 0.0f, nibble & 2u ? d.y * keep_scale : 0.0f,
                       nibble & 4u ? d.z * keep_scale : 0.0f, nibble & 8u ? d.w * keep_scale : 0.0f));
  }
};

extern "C" int k_dropout_backward(float *dx, const float *dy, const uint8_t *mask, float p,
                                  int64_t n, void *stream) {
  const float keep_scale = 1.0f / (1.0f - p);
  bool vec = aligned16(dx) && aligned16(dy);
  return launch_map(DropoutBackwardOp{dx, dy, mask, keep_scale}, n, vec, stream);
}

/* ---------------------------------------------------------------- AdamW */

struct AdamwOp {
  float *param, *m, *v;
  const float *grad;
  float b1, b2, eps, lr_wd, step_size, inv_sqrt_bc2;
  /* backend.h's backend_adamw_element (the CPU backend's and the EPS's), expression for
     expression: device code cannot call that host function, so it is written again here */
  __device__ __forceinline__ void update(float &p, float &mi, float &vi, float g) const {
    mi = b1 * mi + (1.0f - b1) * g;
    vi = b2 * vi + (1.0f - b2) * (g * g);
    p = p - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps) - lr_wd * p;
  }
  __device__ void scalar(int64_t i) const {
    float p = param[i], mi = m[i], vi = v[i];
    update(p, mi, vi, grad[i]);
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
  }
  __device__ void quad(int64_t q) const {
    float4 p = load4(param, q), mi = load4(m, q), vi = load4(v, q), g = load4(grad, q);
    update(p.x, mi.x, vi.x, g.x);
    update(p.y, mi.y, vi.y, g.y);
    update(p.z, mi.z, vi.z, g.z);
    update(p.w, mi.w, vi.w, g.w);
    store4(m, q, mi);
    store4(v, q, vi);
    store4(param, q, p);
  }
};

extern "C" int k_adamw(float *param, float *m, float *v, const float *grad, int64_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float bias_correction1, float bias_correction2, void *stream) {
  /* The per-step constants as backend_adamw_consts makes them on the host: in double,
     rounded once (1.0f - b is that already: a float's 1 - b is exact in double); lr * wd
     * p associates as (lr * wd) * p there too. */
  const float step_size = (float)((double)lr / (double)bias_correction1);
  const float inv_sqrt_bc2 = (float)(1.0 / sqrt((double)bias_correction2));
  AdamwOp op{param, m, v, grad, beta1, beta2, eps, lr * weight_decay, step_size, inv_sqrt_bc2};
  bool vec = aligned16(param) && aligned16(m) && aligned16(v) && aligned16(grad);
  return launch_map(op, n, vec, stream);
}

/* ---------------------------------------------------------------- fill
   Every dtype is a repeating 32-bit word of its element pattern, so one kernel stores
   uint4s of that word over a 16-byte-aligned dst, bytes for the tail; a misaligned dst
   stores whole elements of `size` bytes. */

static __global__ void __launch_bounds__(L2L_THREADS)
    fill_kernel(void *dst, uint32_t word, uint32_t pattern, int size, int64_t n,
                bool vectorized) {
  const int64_t stride = grid_threads();
  if (vectorized) {
    const int64_t bytes = n * size, chunks = bytes >> 4;
    uint4 *d4 = reinterpret_cast<uint4 *>(dst);
    const uint4 w = make_uint4(word, word, word, word);
    for (int64_t q = thread_index(); q < chunks; q += stride) d4[q] = w;
    /* the tail starts 16-byte aligned, so byte k's place in the word is k % 4 */
    uint8_t *d1 = reinterpret_cast<uint8_t *>(dst);
    for (int64_t k = (chunks << 4) + thread_index(); k < bytes; k += stride)
      d1[k] = (uint8_t)(word >> (8 * (k & 3)));
    return;
  }
  for (int64_t i = thread_index(); i < n; i += stride) {
    if (size == 4) reinterpret_cast<uint32_t *>(dst)[i] = pattern;
    else if (size == 2) reinterpret_cast<uint16_t *>(dst)[i] = (uint16_t)pattern;
    else reinterpret_cast<uint8_t *>(dst)[i] = (uint8_t)pattern;
  }
}

extern "C" int k_fill(void *dst, int dtype, uint32_t pattern, int64_t n, void *stream) {
  int size;
  uint32_t word;
  switch (dtype) {
    case DT_F32:
    case DT_I32: size = 4, word = pattern; break;
    case DT_F16:
    case DT_BF16: pattern &= 0xffffu, size = 2, word = pattern | pattern << 16; break;
    case DT_U8: pattern &= 0xffu, size = 1, word = pattern * 0x01010101u; break;
    default: return invalid_argument();
  }
  if (n < 0) return invalid_argument();
  if (n == 0) return 0;
  bool vec = aligned16(dst);
  int64_t threads_needed = vec ? (n * size >> 4) + 16 : n;
  K_LAUNCH(k_blocks_for(threads_needed), L2L_THREADS, 0, (cudaStream_t)stream, fill_kernel)(
      dst, word, pattern, size, n, vec);
  return k_launched();
}

template <int DT>
static __device__ __forceinline__ float half_to_f32(uint32_t h) {
  return DT == DT_F16 ? f16_to_f32((uint16_t)h) : bf16_to_f32((uint16_t)h);
}
template <int DT>
static __device__ __forceinline__ uint32_t f32_to_half(float v) {
  return DT == DT_F16 ? f32_to_f16(v) : f32_to_bf16(v);
}

/* Four elements 4q..4q+3 as one vector access (16 bytes for 4-byte dtypes, 8 for 2-byte
   ones; element 4q is the low half of the first word: little-endian). */
template <int DT>
static __device__ __forceinline__ void load4_as_f32(const void *src, int64_t q, float v[4]) {
  if constexpr (DT == DT_F32) {
    float4 t = reinterpret_cast<const float4 *>(src)[q];
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else if constexpr (DT == DT_I32) {
    int4 t = reinterpret_cast<const int4 *>(src)[q];
    v[0] = (float)t.x, v[1] = (float)t.y, v[2] = (float)t.z, v[3] = (float)t.w;
  } else {
    uint2 t = reinterpret_cast<const uint2 *>(src)[q];
    v[0] = half_to_f32<DT>(t.x & 0xffffu), v[1] = half_to_f32<DT>(t.x >> 16);
    v[2] = half_to_f32<DT>(t.y & 0xffffu), v[3] = half_to_f32<DT>(t.y >> 16);
  }
}

template <int DT>
static __device__ __forceinline__ void store4_from_f32(void *dst, int64_t q, const float v[4]) {
  if constexpr (DT == DT_F32) {
    reinterpret_cast<float4 *>(dst)[q] = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (DT == DT_I32) {
    reinterpret_cast<int4 *>(dst)[q] =
        make_int4((int32_t)v[0], (int32_t)v[1], (int32_t)v[2], (int32_t)v[3]);
  } else {
    reinterpret_cast<uint2 *>(dst)[q] =
        make_uint2(f32_to_half<DT>(v[0]) | f32_to_half<DT>(v[1]) << 16,
                   f32_to_half<DT>(v[2]) | f32_to_half<DT>(v[3]) << 16);
  }
}

template <int SRC, int DST>
static __global__ void __launch_bounds__(L2L_THREADS)
    convert_kernel(void *dst, const void *src, int64_t n, bool vectorized) {
  const int64_t stride = grid_threads();
  int64_t scalar_from = 0;
  if (vectorized) {
    const int64_t quads = n >> 2;
    for (int64_t q = thread_index(); q < quads; q += stride) {
      float v[4];
      load4_as_f32<SRC>(src, q, v);
      store4_from_f32<DST>(dst, q, v);
    }
    scalar_from = quads << 2;
  }
  for (int64_t i = scalar_from + thread_index(); i < n; i += stride)
    store_from_f32<DST>(dst, i, load_as_f32<SRC>(src, i));
}

static int dtype_size(int dtype) {
  switch (dtype) {
    case DT_F32:
    case DT_I32: return 4;
    case DT_F16:
    case DT_BF16: return 2;
    case DT_U8: return 1;
    default: return 0;
  }
}

template <int SRC, int DST>
static int launch_convert(void *dst, const void *src, int64_t n, cudaStream_t stream) {
  /* a vector of four elements is 4 * size bytes and must be aligned to that */
  const uintptr_t src_align = 4u * (uintptr_t)dtype_size(SRC) - 1u;
  const uintptr_t dst_align = 4u * (uintptr_t)dtype_size(DST) - 1u;
  bool vec = ((uintptr_t)src & src_align) == 0 && ((uintptr_t)dst & dst_align) == 0;
  K_LAUNCH(k_blocks_for(vec ? (n >> 2) + (n & 3) : n), L2L_THREADS, 0, stream,
           convert_kernel<SRC, DST>)(dst, src, n, vec);
  return k_launched();
}

template <int SRC>
static int launch_convert_from(void *dst, int dst_dtype, const void *src, int64_t n,
                               cudaStream_t stream) {
  switch (dst_dtype) {
    case DT_F32: return launch_convert<SRC, DT_F32>(dst, src, n, stream);
    case DT_F16: return launch_convert<SRC, DT_F16>(dst, src, n, stream);
    case DT_BF16: return launch_convert<SRC, DT_BF16>(dst, src, n, stream);
    case DT_I32: return launch_convert<SRC, DT_I32>(dst, src, n, stream);
    default: return invalid_argument();
  }
}

extern "C" int k_convert(void *dst, int dst_dtype, const void *src, int src_dtype,
                         int64_t n, void *stream) {
  if (n < 0 || dtype_size(dst_dtype) == 0 || dtype_size(src_dtype) == 0)
    return invalid_argument();
  if (n == 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  if (dst_dtype == src_dtype) {
    if (dst == src) return 0;
    return (int)cudaMemcpyAsync(dst, src, (size_t)n * (size_t)dtype_size(dst_dtype),
                                cudaMemcpyDeviceToDevice, s);
  }
  switch (src_dtype) {
    case DT_F32: return launch_convert_from<DT_F32>(dst, dst_dtype, src, n, s);
    case DT_F16: return launch_convert_from<DT_F16>(dst, dst_dtype, src, n, s);
    case DT_BF16: return launch_convert_from<DT_BF16>(dst, dst_dtype, src, n, s);
    case DT_I32: return launch_convert_from<DT_I32>(dst, dst_dtype, src, n, s);
    default: return invalid_argument(); /* u8 converts to nothing but itself */
  }
}

/* ---- many conversions in one launch: the segments' ends (prefix sums) by value, each
   element's segment found by a binary search over them */

struct ConvertMany {
  void *dst[L2L_K_CONVERT_MANY];
  const void *src[L2L_K_CONVERT_MANY];
  int64_t end[L2L_K_CONVERT_MANY];   /* elements of segments 0 .. s together */
  int count;
};

template <int SRC, int DST>
static __global__ void __launch_bounds__(L2L_THREADS) convert_many_kernel(ConvertMany m) {
  const int64_t total = m.end[m.count - 1];
  for (int64_t i = thread_index(); i < total; i += grid_threads()) {
    int lo = 0, hi = m.count - 1;
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (i < m.end[mid]) hi = mid;
      else lo = mid + 1;
    }
    const int64_t j = i - (lo > 0 ? m.end[lo - 1] : 0);
    store_from_f32<DST>(m.dst[lo], j, load_as_f32<SRC>(m.src[lo], j));
  }
}

template <int SRC, int DST>
static int launch_many(const ConvertMany &m, cudaStream_t s) {
  K_LAUNCH(k_blocks_for(m.end[m.count - 1]), L2L_THREADS, 0, s,
           convert_many_kernel<SRC, DST>)(m);
  return k_launched();
}

extern "C" int k_convert_many(void *const *dst, int dst_dtype, const void *const *src,
                              int src_dtype, const int64_t *n, int count, void *stream) {
  bool to_half = src_dtype == DT_F32 && (dst_dtype == DT_F16 || dst_dtype == DT_BF16);
  bool from_half = dst_dtype == DT_F32 && (src_dtype == DT_F16 || src_dtype == DT_BF16);
  if (count < 0 || count > L2L_K_CONVERT_MANY || !(to_half || from_half)) return invalid_argument();
  ConvertMany m;
  m.count = 0;
  int64_t total = 0;
  for (int i = 0; i < count; i++) {
    if (n[i] < 0) return invalid_argument();
    if (n[i] == 0) continue;
    m.dst[m.count] = dst[i], m.src[m.count] = src[i];
    m.end[m.count++] = total += n[i];
  }
  if (m.count == 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  if (to_half)
    return dst_dtype == DT_F16 ? launch_many<DT_F32, DT_F16>(m, s) : launch_many<DT_F32, DT_BF16>(m, s);
  return src_dtype == DT_F16 ? launch_many<DT_F16, DT_F32>(m, s) : launch_many<DT_BF16, DT_F32>(m, s);
}

/* ---- the check before an f32/f16/bf16 -> i32 conversion
   *first_bad starts as all ones, i.e. -1 read as int64 and the largest value for the
   unsigned atomicMin, so it stays -1 unless some index is smaller; no finishing pass. */

static __global__ void set_minus_one_kernel(unsigned long long *out) { *out = ~0ull; }

template <int DT>
static __global__ void __launch_bounds__(L2L_THREADS)
    find_non_i32_kernel(unsigned long long *first_bad, const void *src, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    float value = load_as_f32<DT>(src, i);
    if (!(value == floorf(value) && value >= -2147483648.0f && value < 2147483648.0f)) {
      atomicMin(first_bad, (unsigned long long)i);
      return; /* this thread's later indices are larger */
    }
  }
}

extern "C" int k_find_non_i32(int64_t *first_bad, const void *src, int src_dtype, int64_t n,
                              void *stream) {
  if (n < 0 || first_bad == NULL || src_dtype < DT_F32 || src_dtype > DT_I32)
    return invalid_argument();
  cudaStream_t s = (cudaStream_t)stream;
  unsigned long long *out = reinterpret_cast<unsigned long long *>(first_bad);
  K_LAUNCH(1, 1, 0, s, set_minus_one_kernel)(out);
  if (n == 0 || src_dtype == DT_I32) return k_launched(); /* nothing to check */
  unsigned blocks = k_blocks_for(n);
  switch (src_dtype) {
    case DT_F32:
      K_LAUNCH(blocks, L2L_THREADS, 0, s, find_non_i32_kernel<DT_F32>)(out, src, n);
      break;
    case DT_F16:
      K_LAUNCH(blocks, L2L_THREADS, 0, s, find_non_i32_kernel<DT_F16>)(out, src, n);
      break;
    default:
      K_LAUNCH(blocks, L2L_THREADS, 0, s, find_non_i32_kernel<DT_BF16>)(out, src, n);
      break;
  }
  return k_launched();
}

/* ---------------------------------------------------------------- random
   One thread per Philox block: a uniform block serves the four draws (elements) it
   holds, a normal block two elements (each Box-Muller pair uses two words). */

/* cpu_random's store_uniform: the rounded draw, stepped toward -inf (at most 4 times)
   while it is still >= hi, so draws stay in [lo, hi) whatever the dtype's spacing. One
   step in the bit pattern: +-0 -> the smallest negative subnormal, negative -> +1,
   positive -> -1 (nextafterf(x, -inf) for f32, the CPU's rule for f16/bf16). i32 stores
   the truncated float without stepping (see elementwise.h). */
static __host__ __device__ __forceinline__ void store_uniform(void *dst, int dtype, int64_t i,
                                                              double value, double lo,
                                                              double hi) {
  const float f = (float)value;
  if (dtype == DT_F32) {
    uint32_t b = f32_bits(f);
    for (int guard = 0; hi > lo && guard < 4 && (double)bits_f32(b) >= hi; guard++)
      b = (b & 0x7fffffffu) == 0 ? 0x80000001u : (b & 0x80000000u) ? b + 1 : b - 1;
    reinterpret_cast<float *>(dst)[i] = bits_f32(b);
  } else if (dtype == DT_F16 || dtype == DT_BF16) {
    uint16_t h = f32_to_16(f, dtype);
    for (int guard = 0; hi > lo && guard < 4 &&
                        (double)(dtype == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h)) >= hi;
         guard++)
      h = h == 0 ? 0x8001u : (h & 0x8000u) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
    reinterpret_cast<uint16_t *>(dst)[i] = h;
  } else {
    reinterpret_cast<int32_t *>(dst)[i] = (int32_t)f;
  }
}

/* cpu_random's store_f32 for a normal draw */
static __host__ __device__ __forceinline__ void store_value(void *dst, int dtype, int64_t i,
                                                            float f) {
  if (dtype == DT_F32) reinterpret_cast<float *>(dst)[i] = f;
  else if (dtype == DT_F16 || dtype == DT_BF16)
    reinterpret_cast<uint16_t *>(dst)[i] = f32_to_16(f, dtype);
  else reinterpret_cast<int32_t *>(dst)[i] = (int32_t)f;
}

/* The uniform value of a draw: a + (b - a) u in double. The CPU is built with
   -ffp-contract=fast on FMA hardware, where GCC fuses this into one fma; fma() here
   makes the device do the same whatever nvcc's --fmad setting. */
static __host__ __device__ __forceinline__ double uniform_value(uint32_t draw, double a,
                                                                double b) {
  double u = (double)(draw >> 8) * 0x1p-24;
  return fma(b - a, u, a);
}

/* Box-Muller on one pair of words: u1 in (0, 1], u2 in [0, 1); fused as the CPU's
   a + (b sqrt(-2 ln u1)) cos(2 pi u2). */
static __host__ __device__ __forceinline__ double normal_value(uint32_t w0, uint32_t w1,
                                                               double a, double b) {
  double u1 = ((double)w0 + 1.0) * 0x1p-32;
  double u2 = (double)w1 * 0x1p-32;
  return fma(b * sqrt(-2.0 * log(u1)), cos(6.283185307179586 * u2), a);
}

static __global__ void __launch_bounds__(L2L_THREADS)
    random_kernel(void *dst, int dtype, int64_t n, bool normal, uint64_t seed,
                  uint64_t rng_stream, uint64_t first, uint64_t block0, int64_t blocks,
                  double a, double b) {
  const int per_block = normal ? 2 : 4;
  for (int64_t t = thread_index(); t < blocks; t += grid_threads()) {
    const uint64_t block = block0 + (uint64_t)t;
    const uint4 w = k_philox(seed, rng_stream, block);
    for (int j = 0; j < per_block; j++) {
      const uint64_t index = block * (uint64_t)per_block + (uint64_t)j;
      const uint64_t i = index - first; /* wraps to huge below first: skipped */
      if (i >= (uint64_t)n) continue;
      if (normal) {
        const bool odd = (index & 1) != 0;
        double value = normal_value(odd ? w.z : w.x, odd ? w.w : w.y, a, b);
        store_value(dst, dtype, (int64_t)i, (float)value);
      } else {
        store_uniform(dst, dtype, (int64_t)i, uniform_value(word_of(w, (unsigned)(index & 3)), a, b),
                      a, b);
      }
    }
  }
}

extern "C" int k_random(void *dst, int dtype, int64_t n, int dist, uint64_t seed,
                        uint64_t rng_stream, int64_t first, double a, double b,
                        void *stream) {
  if (n < 0 || dtype < DT_F32 || dtype > DT_I32 || (dist != 0 && dist != 1))
    return invalid_argument();
  if (n == 0) return 0;
  const bool normal = dist == 1;
  const int shift = normal ? 1 : 2; /* elements per Philox block: 2 or 4 */
  const uint64_t start = (uint64_t)first, last = start + (uint64_t)(n - 1);
  const uint64_t block0 = start >> shift;
  const int64_t blocks = (int64_t)((last >> shift) - block0 + 1);
  K_LAUNCH(k_blocks_for(blocks), L2L_THREADS, 0, (cudaStream_t)stream, random_kernel)(
      dst, dtype, n, normal, seed, rng_stream, start, block0, blocks, a, b);
  return k_launched();
}
