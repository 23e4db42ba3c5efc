/* SPDX-License-Identifier: MIT */
/* common.cuh — what every kernel file shares: launch sizes, the Philox generator, GELU
 * and reductions, in device code.
 *
 * Purpose: one copy of the pieces whose results must agree bit for bit (Philox draws,
 * dropout thresholds) or closely (GELU) with the CPU backend, which defines every op.
 * Only .cu files include this; the launchers they export are plain C (the .h files beside it).
 * Must never: be included by C code, or keep state between launches.
 */
#ifndef L2L_KERNELS_COMMON_CUH
#define L2L_KERNELS_COMMON_CUH

#include <string.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define L2L_GELU_XMIN_D (-0.75246142f) /* as L2L_GELU_XMIN in src/backend/backend.h */
#define L2L_GELU_YMIN_D (-0.17004075f)
#define L2L_GELU_K0 0.7978845608028654f  /* sqrt(2/pi) */
#define L2L_GELU_K1 0.044715f

/* Threads per block for simple one-element-per-thread kernels, and the block count that
   covers n elements in a grid-stride loop without launching millions of idle blocks. */
enum { L2L_THREADS = 256 };
/* Grid-stride loops cover elements past this many blocks (the CPU emulation of the kernels
   sets fewer, so that its threads walk several strides). */
#ifndef K_GRID_MAX_BLOCKS
#define K_GRID_MAX_BLOCKS (65535 * 8)
#endif
static inline unsigned k_blocks_for(int64_t n) {
  int64_t blocks = (n + L2L_THREADS - 1) / L2L_THREADS;
  if (blocks < 1) blocks = 1;
  if (blocks > K_GRID_MAX_BLOCKS) blocks = K_GRID_MAX_BLOCKS;
  return (unsigned)blocks;
}

/* The status a launcher returns: the launch's error, as cudaError_t's value. */
static inline int k_launched(void) { return (int)cudaGetLastError(); }

/* A launch, K_LAUNCH(grid, block, shared bytes, stream, kernel)(arguments); a kernel's
   dynamic shared memory as an array, K_DYNAMIC_SHARED(type, name); a static shared array,
   K_STATIC_SHARED(type, name, [dims]): CUDA's own syntax here; spec/c/backend/
   kernel_emulation.h gives them (and __syncthreads, shuffles, ...) for the CPU, where a
   kernel file's source runs in make test (the kernel files written so). */
#ifndef K_LAUNCH
#define K_LAUNCH(grid, block, shared, stream, ...) __VA_ARGS__<<<grid, block, shared, stream>>>
#endif
#ifndef K_DYNAMIC_SHARED
#define K_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif
#ifndef K_STATIC_SHARED
#define K_STATIC_SHARED(type, name, dims) __shared__ type name dims
#endif

/* ---------------------------------------------------------------- Philox4x32-10 */

/* The four draws of block `block` of (seed, stream): counter = (block, stream), key =
   seed, exactly as src/core/rng.c (philox_draws). */
__device__ __forceinline__ uint4 k_philox(uint64_t seed, uint64_t stream, uint64_t block) {
  uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32);
  uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; round++) {
    uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return make_uint4(c0, c1, c2, c3);
}

/* Draw `index` of (seed, stream): word index % 4 of block index / 4. */
__device__ __forceinline__ uint32_t k_philox_draw(uint64_t seed, uint64_t stream,
                                                  uint64_t index) {
  uint4 w = k_philox(seed, stream, index >> 2);
  switch (index & 3) {
    case 0: return w.x;
    case 1: return w.y;
    case 2: return w.z;
    default: return w.w;
  }
}

/* 16-bit draw `index` of (seed, stream): the low (index even) or high half of draw
   index / 2, as src/core/rng.c (philox_halves). */
__device__ __forceinline__ uint32_t k_philox_half(uint64_t seed, uint64_t stream,
                                                  uint64_t index) {
  return k_philox_draw(seed, stream, index >> 1) >> (16 * (index & 1)) & 0xffffu;
}

/* Dropout keeps draw d when its top 24 bits are below the threshold from
   backend_keep_threshold(p) (src/backend/backend.h), which the host computes and passes in. */
__device__ __forceinline__ bool k_kept(uint32_t draw, uint32_t threshold) {
  return (draw >> 8) < threshold;
}

/* ---------------------------------------------------------------- GELU (tanh form) */

/* x sigmoid(2u), u = k0 (x + k1 x^3): as the CPU backend, no cancellation for x << 0.
   expf, not __expf: the fast one is off by up to ~1e-5 relative for large arguments,
   the whole tolerance the GPU tests allow against the CPU. */
__device__ __forceinline__ float k_gelu(float x) {
  float u = L2L_GELU_K0 * (x + L2L_GELU_K1 * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}

__device__ __forceinline__ float k_gelu_prime(float x) {
  float u = L2L_GELU_K0 * (x + L2L_GELU_K1 * x * x * x);
  float du = L2L_GELU_K0 * (1.0f + 3.0f * L2L_GELU_K1 * x * x);
  float s = 1.0f / (1.0f + expf(-2.0f * u));
  return s + x * 2.0f * du * s * (1.0f - s);
}

/* ---------------------------------------------------------------- block reductions */

__device__ __forceinline__ float k_warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float k_warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets
   the result. `shared` holds 32 floats; the call ends with a barrier, so it may be called
   again right away. */
__device__ __forceinline__ float k_block_sum(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = k_warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  v = k_warp_sum(v);
  __syncthreads();
  return v;
}

__device__ __forceinline__ float k_block_max(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = k_warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  v = k_warp_max(v);
  __syncthreads();
  return v;
}

#include "dtype.h" /* l2l_dtype's values, which the launchers take as ints */

/* ---------------------------------------------------------------- f32 <-> f16 / bf16
   A port of src/core/core.h's conversions (integer round to nearest even; NaN kept and
   quieted; subnormals kept), __host__ __device__ so the same code could be checked
   against core.h's on a host.
   Only the bit moves differ: memcpy is what both compilers turn into a register move. */

static __host__ __device__ __forceinline__ uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static __host__ __device__ __forceinline__ float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static __host__ __device__ __forceinline__ uint16_t f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* ties to even; a carry correctly bumps the exponent */
  return (uint16_t)(u >> 16);
}

static __host__ __device__ __forceinline__ float bf16_to_f32(uint16_t x) {
  return bits_f32((uint32_t)x << 16);
}

/* value >> shift rounded to nearest, ties to even (shift >= 1) */
static __host__ __device__ __forceinline__ uint32_t shift_round_even(uint32_t value, int shift) {
  uint32_t kept = value >> shift;
  uint32_t rest = value & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1u))) kept++;
  return kept;
}

static __host__ __device__ __forceinline__ uint16_t f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (a >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds past 65504: infinity */
  if (a >= 0x38800000u) return sign | (uint16_t)shift_round_even(a - 0x38000000u, 13);
  int e = (int)(a >> 23); /* subnormal f16 or zero: units of 2^-24 */
  if (e < 102) return sign;
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  return sign | (uint16_t)shift_round_even(m, 126 - e);
}

/* x rounded to dtype (DT_BF16, else DT_F16) as the two above round it. */
static __host__ __device__ __forceinline__ uint16_t f32_to_16(float x, int dtype) {
  return dtype == DT_BF16 ? f32_to_bf16(x) : f32_to_f16(x);
}

static __host__ __device__ __forceinline__ float f16_to_f32(uint16_t x) {
  uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
  uint32_t e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
  if (e == 0) {
    float magnitude = (float)m * 0x1p-24f; /* exact: m < 2^10 */
    return sign ? -magnitude : magnitude;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Four floats rounded to dtype (DT_BF16, else DT_F16) as k_convert rounds, stored at p[0..3]:
   one 8-byte store where p is 8-byte aligned (packed), else four. */
static __device__ __forceinline__ void store_halves4(uint16_t *p, float x, float y, float z,
                                                     float w, int dtype, bool packed) {
  const uint32_t a = f32_to_16(x, dtype), b = f32_to_16(y, dtype);
  const uint32_t c = f32_to_16(z, dtype), d = f32_to_16(w, dtype);
  if (packed) {
    *reinterpret_cast<uint2 *>(p) = make_uint2(a | b << 16, c | d << 16);
  } else {
    p[0] = (uint16_t)a, p[1] = (uint16_t)b, p[2] = (uint16_t)c, p[3] = (uint16_t)d;
  }
}

/* cpu_convert's load_as_f32 / store_f32 for one dtype fixed at compile time. */
template <int DT>
static __device__ __forceinline__ float load_as_f32(const void *src, int64_t i) {
  if constexpr (DT == DT_F32) return reinterpret_cast<const float *>(src)[i];
  else if constexpr (DT == DT_F16) return f16_to_f32(reinterpret_cast<const uint16_t *>(src)[i]);
  else if constexpr (DT == DT_BF16) return bf16_to_f32(reinterpret_cast<const uint16_t *>(src)[i]);
  else return (float)reinterpret_cast<const int32_t *>(src)[i];
}

template <int DT>
static __device__ __forceinline__ void store_from_f32(void *dst, int64_t i, float value) {
  if constexpr (DT == DT_F32) reinterpret_cast<float *>(dst)[i] = value;
  else if constexpr (DT == DT_F16) reinterpret_cast<uint16_t *>(dst)[i] = f32_to_f16(value);
  else if constexpr (DT == DT_BF16) reinterpret_cast<uint16_t *>(dst)[i] = f32_to_bf16(value);
  else reinterpret_cast<int32_t *>(dst)[i] = (int32_t)value; /* checked integral first */
}

#endif /* L2L_KERNELS_COMMON_CUH */
