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

#include <cuda_runtime.h>
#include <stdint.h>

#define L2L_GELU_XMIN_D (-0.75246142f) /* as L2L_GELU_XMIN in src/backend.h */
#define L2L_GELU_YMIN_D (-0.17004075f)
#define L2L_GELU_K0 0.7978845608028654f  /* sqrt(2/pi) */
#define L2L_GELU_K1 0.044715f

/* Threads per block for simple one-element-per-thread kernels, and the block count that
   covers n elements in a grid-stride loop without launching millions of idle blocks. */
enum { L2L_THREADS = 256 };
static inline unsigned l2l_blocks_for(int64_t n) {
  int64_t blocks = (n + L2L_THREADS - 1) / L2L_THREADS;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535 * 8) blocks = 65535 * 8; /* grid-stride loops cover the rest */
  return (unsigned)blocks;
}

/* The status a launcher returns: the launch's error, as cudaError_t's value. */
static inline int l2l_launched(void) { return (int)cudaGetLastError(); }

/* ---------------------------------------------------------------- Philox4x32-10 */

/* The four draws of block `block` of (seed, stream): counter = (block, stream), key =
   seed, exactly as src/rng.c (l2l_philox_draws). */
__device__ __forceinline__ uint4 l2l_philox(uint64_t seed, uint64_t stream, uint64_t block) {
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
__device__ __forceinline__ uint32_t l2l_philox_draw(uint64_t seed, uint64_t stream,
                                                    uint64_t index) {
  uint4 w = l2l_philox(seed, stream, index >> 2);
  switch (index & 3) {
    case 0: return w.x;
    case 1: return w.y;
    case 2: return w.z;
    default: return w.w;
  }
}

/* Dropout keeps draw d when its top 24 bits are below the threshold from
   l2l_keep_threshold(p) (src/backend.h), which the host computes and passes in. */
__device__ __forceinline__ bool l2l_kept(uint32_t draw, uint32_t threshold) {
  return (draw >> 8) < threshold;
}

/* ---------------------------------------------------------------- GELU (tanh form) */

/* x sigmoid(2u), u = k0 (x + k1 x^3): as the CPU backend, no cancellation for x << 0.
   expf, not __expf: the fast one is off by up to ~1e-5 relative for large arguments,
   the whole tolerance the GPU tests allow against the CPU. */
__device__ __forceinline__ float l2l_gelu(float x) {
  float u = L2L_GELU_K0 * (x + L2L_GELU_K1 * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}

__device__ __forceinline__ float l2l_gelu_prime(float x) {
  float u = L2L_GELU_K0 * (x + L2L_GELU_K1 * x * x * x);
  float du = L2L_GELU_K0 * (1.0f + 3.0f * L2L_GELU_K1 * x * x);
  float s = 1.0f / (1.0f + expf(-2.0f * u));
  return s + x * 2.0f * du * s * (1.0f - s);
}

/* ---------------------------------------------------------------- block reductions */

__device__ __forceinline__ float l2l_warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float l2l_warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets
   the result. `shared` holds 32 floats; the call ends with a barrier, so it may be called
   again right away. */
__device__ __forceinline__ float l2l_block_sum(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = l2l_warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  v = l2l_warp_sum(v);
  __syncthreads();
  return v;
}

__device__ __forceinline__ float l2l_block_max(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = l2l_warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  v = l2l_warp_max(v);
  __syncthreads();
  return v;
}

#endif /* L2L_KERNELS_COMMON_CUH */
