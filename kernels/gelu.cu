/* SPDX-License-Identifier: MIT */
/* gelu.cu — GELU on the GPU: forward, backward, the frugal mode's side bits and its
 * backward from the output, and the fused bias + GELU of the block.
 *
 * Purpose: the CPU backend's GELU ops (src/backend/cpu/layer_ops.c defines every result)
 * as elementwise.cu's maps (map.cuh), with the 16-bit copies the layers' GEMMs read
 * written in the same pass (rounded as k_convert rounds). Launchers are declared in
 * elementwise.h.
 * Aliasing: as elementwise.cu's (each thread reads its elements before it writes them).
 * Must never: synchronize, allocate, print or exit; use fast-math intrinsics.
 */
#include <math.h>
#include <stdint.h>

#include "elementwise.h"
#include "map.cuh"

/* ---------------------------------------------------------------- GELU */

struct GeluOp {
  float *y;
  const float *x;
  __device__ void scalar(int64_t i) const { y[i] = k_gelu(x[i]); }
  __device__ void quad(int64_t q) const {
    float4 v = load4(x, q);
    store4(y, q, make_float4(k_gelu(v.x), k_gelu(v.y), k_gelu(v.z), k_gelu(v.w)));
  }
};

/* A backward's dx (NULL: none) and its 16-bit copy (dx16 NULL: none), element i or quad q
   (the quad's four halves in one 8-byte store where dx16 is 8-byte aligned). */
struct GradOut {
  float *dx;
  uint16_t *dx16;
  int dtype;
  bool dx16_packed;
  __device__ void one(int64_t i, float v) const {
    if (dx) dx[i] = v;
    if (dx16) dx16[i] = f32_to_16(v, dtype);
  }
  __device__ void four(int64_t q, float4 v) const {
    if (dx) store4(dx, q, v);
    if (dx16) store_halves4(dx16 + 4 * q, v.x, v.y, v.z, v.w, dtype, dx16_packed);
  }
};

static GradOut grad_out(float *dx, void *dx16, int dtype) {
  return GradOut{dx, static_cast<uint16_t *>(dx16), dtype, ((uintptr_t)dx16 & 7) == 0};
}

struct GeluBackwardOp {
  const float *dy, *x;
  GradOut out;
  __device__ void scalar(int64_t i) const { out.one(i, dy[i] * k_gelu_prime(x[i])); }
  __device__ void quad(int64_t q) const {
    float4 d = load4(dy, q), v = load4(x, q);
    out.four(q, make_float4(d.x * k_gelu_prime(v.x), d.y * k_gelu_prime(v.y),
                            d.z * k_gelu_prime(v.z), d.w * k_gelu_prime(v.w)));
  }
};

extern "C" int k_gelu_forward(float *y, const float *x, int64_t n, void *stream) {
  return launch_map(GeluOp{y, x}, n, aligned16(y) && aligned16(x), stream);
}

extern "C" int k_gelu_backward(float *dx, void *dx16, int dx16_dtype, const float *dy,
                               const float *x, int64_t n, void *stream) {
  if (dx16 != NULL && dx16_dtype != DT_BF16 && dx16_dtype != DT_F16) return invalid_argument();
  if (dx == NULL && dx16 == NULL) return invalid_argument();
  bool vec = aligned16(dx) && aligned16(dy) && aligned16(x);   /* (a null dx is aligned) */
  return launch_map(GeluBackwardOp{dy, x, grad_out(dx, dx16, dx16_dtype)}, n, vec, stream);
}

/* ---- GELU with side bits, plain or fused with the bias add
   One thread per output byte of bits (8 elements), so no two threads share a byte.
   BIAS: in = pre (rows, cols), pre += bias[col] is written back before y = gelu(pre).
   Not BIAS: in = x, read only. Full bytes move as two float4s when aligned (with BIAS
   this also needs cols % 8 == 0, so a byte's 8 elements share a row and bias float4s).
   The column of a byte's first element is tracked like bias_add_kernel's. y (may be null)
   gets gelu in f32, y16 (may be null) rounded to y16_dtype as k_convert rounds it: the
   8 halves of a byte in one 16-byte store when y16 is 16-byte aligned. */

/* The 8 values of a byte rounded to dtype and stored at h (element 8*byte of y16). */
static __device__ __forceinline__ void store_byte_halves(uint16_t *h, const float v[8],
                                                         int dtype, bool aligned) {
  uint16_t out[8];
#pragma unroll
  for (int e = 0; e < 8; e++) out[e] = f32_to_16(v[e], dtype);
  if (aligned) {
    *reinterpret_cast<uint4 *>(h) =
        make_uint4(out[0] | (uint32_t)out[1] << 16, out[2] | (uint32_t)out[3] << 16,
                   out[4] | (uint32_t)out[5] << 16, out[6] | (uint32_t)out[7] << 16);
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) h[e] = out[e];
  }
}

template <bool BIAS>
__global__ void __launch_bounds__(L2L_THREADS)
    gelu_bits_kernel(float *pre, const float *in, float *y, uint16_t *y16, int y16_dtype,
                     uint8_t *bits, const float *bias, int64_t n, int64_t cols,
                     bool vectorized) {
  const int64_t bytes = (n + 7) >> 3, stride = grid_threads();
  int64_t byte = thread_index();
  if (byte >= bytes) return;
  const bool y16_aligned = ((uintptr_t)y16 & 15) == 0;
  int64_t col = 0, col_step = 0; /* column of element 8*byte; used only with BIAS */
  if (BIAS) {
    col = (byte << 3) % cols;
    col_step = (stride << 3) % cols;
  }
  for (; byte < bytes; byte += stride) {
    const int64_t first = byte << 3;
    uint8_t side = 0;
    if (vectorized && first + 8 <= n) {
      float4 lo = load4(in, byte * 2), hi = load4(in, byte * 2 + 1);
      if (BIAS) {
        float4 b0 = load4(bias, col >> 2), b1 = load4(bias, (col >> 2) + 1);
        lo = make_float4(lo.x + b0.x, lo.y + b0.y, lo.z + b0.z, lo.w + b0.w);
        hi = make_float4(hi.x + b1.x, hi.y + b1.y, hi.z + b1.z, hi.w + b1.w);
        store4(pre, byte * 2, lo);
        store4(pre, byte * 2 + 1, hi);
      }
      side = (uint8_t)((lo.x >= L2L_GELU_XMIN_D) | (lo.y >= L2L_GELU_XMIN_D) << 1 |
                       (lo.z >= L2L_GELU_XMIN_D) << 2 | (lo.w >= L2L_GELU_XMIN_D) << 3 |
                       (hi.x >= L2L_GELU_XMIN_D) << 4 | (hi.y >= L2L_GELU_XMIN_D) << 5 |
                       (hi.z >= L2L_GELU_XMIN_D) << 6 | (hi.w >= L2L_GELU_XMIN_D) << 7);
      const float g[8] = {k_gelu(lo.x), k_gelu(lo.y), k_gelu(lo.z), k_gelu(lo.w),
                          k_gelu(hi.x), k_gelu(hi.y), k_gelu(hi.z), k_gelu(hi.w)};
      if (y) {
        store4(y, byte * 2, make_float4(g[0], g[1], g[2], g[3]));
        store4(y, byte * 2 + 1, make_float4(g[4], g[5], g[6], g[7]));
      }
      if (y16) store_byte_halves(y16 + first, g, y16_dtype, y16_aligned);
    } else {
      const int count = n - first < 8 ? (int)(n - first) : 8;
      int64_t c = col;
      for (int j = 0; j < count; j++) {
        float v = in[first + j];
        if (BIAS) {
          v += bias[c];
          pre[first + j] = v;
          if (++c == cols) c = 0;
        }
        side |= (uint8_t)((v >= L2L_GELU_XMIN_D) << j);
        const float g = k_gelu(v);
        if (y) y[first + j] = g; /* after the reads of element first+j: y may be in */
        if (y16) y16[first + j] = f32_to_16(g, y16_dtype);
      }
    }
    if (bits) bits[byte] = side;
    if (BIAS) {
      col += col_step;
      if (col >= cols) col -= cols;
    }
  }
}

extern "C" int k_gelu_forward_bits(float *y, uint8_t *bits, const float *x, int64_t n,
                                   void *stream) {
  if (n < 0 || bits == NULL) return invalid_argument();
  if (n == 0) return 0;
  bool vec = aligned16(y) && aligned16(x);
  K_LAUNCH(k_blocks_for((n + 7) >> 3), L2L_THREADS, 0, (cudaStream_t)stream,
           gelu_bits_kernel<false>)(NULL, x, y, NULL, 0, bits, NULL, n, 1, vec);
  return k_launched();
}

extern "C" int k_bias_gelu_forward(float *pre, float *y, void *y16, int y16_dtype,
                                   uint8_t *bits, const float *bias, int64_t rows,
                                   int64_t cols, void *stream) {
  if (rows < 0 || cols < 0 || (y == NULL && y16 == NULL)) return invalid_argument();
  if (y16 != NULL && y16_dtype != DT_BF16 && y16_dtype != DT_F16) return invalid_argument();
  if (rows == 0 || cols == 0) return 0;
  const int64_t n = rows * cols;
  uint16_t *h = static_cast<uint16_t *>(y16);
  cudaStream_t s = (cudaStream_t)stream;
  /* (a null y is no constraint on the float4 path) */
  const bool y_ok = y == NULL || aligned16(y);
  if (bias == NULL) {
    K_LAUNCH(k_blocks_for((n + 7) >> 3), L2L_THREADS, 0, s, gelu_bits_kernel<false>)(
        NULL, pre, y, h, y16_dtype, bits, NULL, n, 1, y_ok && aligned16(pre));
    return k_launched();
  }
  bool vec = (cols & 7) == 0 && aligned16(pre) && y_ok && aligned16(bias);
  K_LAUNCH(k_blocks_for((n + 7) >> 3), L2L_THREADS, 0, s, gelu_bits_kernel<true>)(
      pre, pre, y, h, y16_dtype, bits, bias, n, cols, vec);
  return k_launched();
}

/* ---- GELU backward from its output y and the side bit (x >= X_MIN): gelu' read off the
   CPU backend's tables (src/backend/gelu_table.c: three branches' slopes over smooth
   variables, interpolated linearly), step for step as the CPU's loop reads them, so the
   two backends part only where their logf differ (the far left branch). This replaced
   four Newton steps an element (each an exp, a log, a square root and two divisions),
   which an H200 ran at 0.21 of its copy rate, bound by arithmetic; the tables (48 KiB)
   stay in L1 and L2 beside the streamed y and dy. */
struct SlopeParams {
  float scale0, scale1, scale2, origin0, origin1, origin2, y_left;
};

static __device__ __forceinline__ float gelu_slope_at(float v, bool right, const float *table,
                                                      const SlopeParams &s) {
  constexpr float last = (float)(K_GELU_TABLE - 1);
  const float d = v - L2L_GELU_YMIN_D;
  const float t = sqrtf(d >= 0.0f ? d : 0.0f);
  const int k = right ? 0 : v <= s.y_left ? 1 : 2;
  float at = t;
  if (k == 2) { /* y = -0 lands left of all */
    const float m = -v;
    at = logf(m >= 1.1754944e-38f ? m : 1.1754944e-38f);
  }
  const float origin = k == 0 ? s.origin0 : k == 1 ? s.origin1 : s.origin2;
  const float scale = k == 0 ? s.scale0 : k == 1 ? s.scale1 : s.scale2;
  float p = (at - origin) * scale;
  p = p >= 0.0f ? p : 0.0f; /* written so that NaN goes to 0: never out of the table */
  p = p <= last ? p : last;
  int j = (int)p;
  j = j < K_GELU_TABLE - 2 ? j : K_GELU_TABLE - 2;
  const float *row = table + k * K_GELU_TABLE;
  const float f = p - (float)j, lo = __ldg(row + j), hi = __ldg(row + j + 1);
  const float slope = lo + f * (hi - lo);
  return v == v ? slope : v; /* a NaN output stays NaN */
}

static __device__ __forceinline__ bool bit_at(unsigned byte, int bit) { return (byte >> bit) & 1u; }

struct GeluBackwardFromOutputOp {
  const float *dy, *y;
  const uint8_t *bits;
  const float *table;
  SlopeParams s;
  GradOut out;
  __device__ void scalar(int64_t i) const {
    out.one(i, dy[i] * gelu_slope_at(y[i], bit_at(bits[i >> 3], (int)(i & 7)), table, s));
  }
  __device__ void quad(int64_t q) const { /* elements 4q..4q+3: one nibble of byte q/2 */
    unsigned byte = bits[q >> 1];
    int shift = (int)(q & 1) * 4;
    float4 d = load4(dy, q), v = load4(y, q);
    out.four(q, make_float4(d.x * gelu_slope_at(v.x, bit_at(byte, shift), table, s),
                            d.y * gelu_slope_at(v.y, bit_at(byte, shift + 1), table, s),
                            d.z * gelu_slope_at(v.z, bit_at(byte, shift + 2), table, s),
                            d.w * gelu_slope_at(v.w, bit_at(byte, shift + 3), table, s)));
  }
};

extern "C" int k_gelu_backward_from_output(float *dx, void *dx16, int dx16_dtype,
                                           const float *dy, const float *y, const uint8_t *bits,
                                           int64_t n, const struct k_gelu_slopes *slopes,
                                           void *stream) {
  if (dx16 != NULL && dx16_dtype != DT_BF16 && dx16_dtype != DT_F16) return invalid_argument();
  if (slopes == NULL || slopes->slope == NULL) return invalid_argument();
  if (dx == NULL && dx16 == NULL) return invalid_argument();
  bool vec = aligned16(dx) && aligned16(dy) && aligned16(y);   /* (a null dx is aligned) */
  const SlopeParams s = {slopes->scale[0],  slopes->scale[1],  slopes->scale[2], slopes->origin[0],
                         slopes->origin[1], slopes->origin[2], slopes->y_left};
  return launch_map(GeluBackwardFromOutputOp{dy, y, bits, slopes->slope, s,
                                             grad_out(dx, dx16, dx16_dtype)},
                    n, vec, stream);
}
