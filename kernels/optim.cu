/* SPDX-License-Identifier: MIT */
/* optim.cu — a record placed on the device: its gradient added into its accumulator, and
 * one step of its optimizer (SGD with momentum, AdamW, LAMB) on its master (f32, or bf16
 * rounded back stochastically) and its state in f32, bf16 or 8 bits.
 *
 * Purpose: kernels/optim.h's launchers. Each element is the host kernels' expression
 * (src/backend/optim_kernels.c) written again, since device code cannot call host code;
 * the constants come from the host (struct k_optim). A step reads the skip flag on the
 * device, so a record whose gradient was not finite is left as it was without the host
 * waiting to know; the gradient is cleared by the pass that reads it. LAMB's sums over the
 * record are fixed-order (per block in double, then the blocks in order), so two runs give
 * the same bits.
 * Must never: synchronize, allocate, print or exit.
 */
#include "map.cuh"
#include "optim.h"
#include "state_code.h"

/* ---------------------------------------------------------------- the gradient's add */

/* inf exactly when |d| >= 2^63 or d is not finite (src/eps's EPS_GRAD_OVER) */
#define K_GRAD_OVER 0x1p65f

/* Element i of g (dtype f32, f16 or bf16), widened exactly. */
static __device__ __forceinline__ float widen_at(const void *g, int dtype, int64_t i) {
  if (dtype == DT_F32) return reinterpret_cast<const float *>(g)[i];
  uint16_t h = reinterpret_cast<const uint16_t *>(g)[i];
  return dtype == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

struct GradAddOp {
  float *acc;
  const void *g;
  int dtype;
  float scale;
  const float *scale_at;   /* (on the device: per-layer clipping's factor) or NULL */
  int32_t *flag;
  __device__ void scalar(int64_t i) const {
    float s = scale_at != nullptr ? *scale_at : scale;
    float d = acc[i] + s * widen_at(g, dtype, i);
    acc[i] = d;
    float big = d * K_GRAD_OVER;
    if (flag != nullptr && big - big != 0.0f) *flag = 1;   /* (NaN compares unequal too) */
  }
  __device__ void quad(int64_t q) const {
    for (int k = 0; k < 4; k++) scalar(4 * q + k);
  }
};

extern "C" int k_grad_add(float *acc, const void *g, int dtype, float scale,
                          const float *scale_at, int64_t n, int32_t *flag, void *stream) {
  if (dtype != DT_F32 && dtype != DT_F16 && dtype != DT_BF16) return invalid_argument();
  return launch_map(GradAddOp{acc, g, dtype, scale, scale_at, flag}, n, false, stream);
}

/* ---------------------------------------------------------------- per-layer clipping's factor

   Each gradient's squares summed by a fixed partition of at most CLIP_BLOCKS thread blocks
   (in double, a tree in shared memory), the partial sums then added in order by one
   thread, which writes the factor: deterministic, nothing read back. (CLIP_BLOCKS and
   LAMB_BLOCKS, below, are lower only where K_GRID_MAX_BLOCKS is: the kernels run emulated,
   whose partitions then walk several strides at a test's sizes.) */

enum { CLIP_BLOCKS = K_GRID_MAX_BLOCKS < 256 ? K_GRID_MAX_BLOCKS : 256 };
static_assert(L2L_K_CLIP_SCRATCH_DOUBLES >= L2L_K_CLIP_GRADIENTS * CLIP_BLOCKS,
              "k_clip_scale's scratch: a partial sum a block of every gradient");

static __global__ void __launch_bounds__(L2L_THREADS)
    sumsq_partial_kernel(const void *g, int dtype, int64_t n, double *partial) {
  K_STATIC_SHARED(double, sums, [L2L_THREADS]);
  double sum = 0;
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    double x = (double)widen_at(g, dtype, i);
    sum += x * x;
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int half = L2L_THREADS / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
}

/* src/backend/optim_kernels.c's optim_clip_factor, written again */
static __global__ void clip_factor_kernel(const double *partial, int count, float clip, float *scale) {
  double sumsq = 0;
  for (int b = 0; b < count; b++) sumsq += partial[b];
  double norm = sqrt(sumsq);
  *scale = norm > clip ? (float)(clip / norm) : 1.0f;
}

extern "C" int k_clip_scale(float *scale, const void *const *g, const int *dtype,
                            const int64_t *n, int count, float clip, double *scratch,
                            void *stream) {
  if (count < 0 || count > L2L_K_CLIP_GRADIENTS) return invalid_argument();
  cudaStream_t s = (cudaStream_t)stream;
  int at = 0;
  for (int i = 0; i < count; i++) {
    if (n[i] < 0 || (dtype[i] != DT_F32 && dtype[i] != DT_F16 && dtype[i] != DT_BF16))
      return invalid_argument();
    if (n[i] == 0) continue;
    int64_t wanted = (n[i] + L2L_THREADS - 1) / L2L_THREADS;
    int blocks = wanted > CLIP_BLOCKS ? CLIP_BLOCKS : (int)wanted;
    K_LAUNCH(blocks, L2L_THREADS, 0, s, sumsq_partial_kernel)(g[i], dtype[i], n[i], scratch + at);
    at += blocks;
  }
  K_LAUNCH(1, 1, 0, s, clip_factor_kernel)(scratch, at, clip, scale);
  return k_launched();
}

/* ---------------------------------------------------------------- one step */

static __device__ __forceinline__ bool skipped(const int32_t *skip) {
  return skip != nullptr && *skip != 0;
}

struct SgdOp {
  float *p, *buf, *grad;
  struct k_optim o;
  const int32_t *skip;
  __device__ void scalar(int64_t i) const {
    float g = o.scale * grad[i], pi = p[i];
    grad[i] = 0.0f;
    if (skipped(skip)) return;
    if (buf == nullptr) {
      p[i] = pi - o.decay * pi - o.lr * g;
      return;
    }
    float b = o.mu_prev * buf[i] + g;
    buf[i] = b;
    p[i] = pi - o.decay * pi - o.lr * (o.nesterov ? g + o.momentum * b : b);
  }
  __device__ void quad(int64_t q) const {
    for (int k = 0; k < 4; k++) scalar(4 * q + k);
  }
};

struct AdamwStepOp {
  float *p, *m, *v, *grad;
  struct k_optim o;
  const int32_t *skip;
  __device__ void scalar(int64_t i) const {
    float g = o.scale * grad[i];
    grad[i] = 0.0f;
    if (skipped(skip)) return;
    float mi = o.b1 * m[i] + o.c1 * g;
    float vi = o.b2 * v[i] + o.c2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] - o.step * mi / (sqrtf(vi) * o.rsb2 + o.eps) - o.decay * p[i];
  }
  __device__ void quad(int64_t q) const {
    for (int k = 0; k < 4; k++) scalar(4 * q + k);
  }
};

/* LAMB's direction, the same expression in both passes (optim_kernels.c's lamb_r) */
static __device__ __forceinline__ float lamb_r(const struct k_optim &o, float m, float v, float p) {
  return o.step * m / (sqrtf(v) * o.rsb2 + o.eps) + o.wd * p;
}

enum { LAMB_BLOCKS = K_GRID_MAX_BLOCKS < 1024 ? K_GRID_MAX_BLOCKS : 1024 };
static_assert(L2L_K_OPTIM_SCRATCH_DOUBLES >= 2 * LAMB_BLOCKS + 1,
              "k_optim_update's scratch: two partial sums a block, then the trust ratio");

/* This thread block's sums of p^2 (pp) and r^2 (rr) over its threads, in a fixed tree
   order, into partial[2 * block] and partial[2 * block + 1]. */
static __device__ void block_sums_out(double pp, double rr, double *partial) {
  K_STATIC_SHARED(double, sums, [2][L2L_THREADS]);
  sums[0][threadIdx.x] = pp;
  sums[1][threadIdx.x] = rr;
  __syncthreads();
  for (int half = L2L_THREADS / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) {
      sums[0][threadIdx.x] += sums[0][threadIdx.x + half];
      sums[1][threadIdx.x] += sums[1][threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = sums[0][0];
    partial[2 * blockIdx.x + 1] = sums[1][0];
  }
}

/* Wave one: the moments (the gradient cleared as read), and each block's sums of p^2 and
   r^2 into partial[2 * block]. */
static __global__ void __launch_bounds__(L2L_THREADS)
    lamb_moments_kernel(float *p, float *m, float *v, float *grad, int64_t n, struct k_optim o,
                        const int32_t *skip, double *partial) {
  double pp = 0, rr = 0;
  const bool go = !skipped(skip);
  for (int64_t i = thread_index(); i < n; i += grid_threads()) {
    float g = o.scale * grad[i], pi = p[i];
    grad[i] = 0.0f;
    if (!go) continue;
    float mi = o.b1 * m[i] + o.c1 * g;
    float vi = o.b2 * v[i] + o.c2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    float r = lamb_r(o, mi, vi, pi);
    pp += (double)pi * (double)pi;
    rr += (double)r * (double)r;
  }
  block_sums_out(pp, rr, partial);
}

/* The blocks' sums in block order, and the trust ratio |p| / |r| (1 where either is 0 or
   not a number) into *trust. */
static __global__ void lamb_trust_kernel(const double *partial, int blocks, float *trust) {
  double pp = 0, rr = 0;
  for (int b = 0; b < blocks; b++) pp += partial[2 * b], rr += partial[2 * b + 1];
  *trust = !(pp > 0.0) || !(rr > 0.0) ? 1.0f : (float)(sqrt(pp) / sqrt(rr));
}

struct LambApplyOp {
  float *p;
  const float *m, *v;
  struct k_optim o;
  const int32_t *skip;
  const float *trust;
  __device__ void scalar(int64_t i) const {
    if (skipped(skip)) return;
    float pi = p[i];
    p[i] = pi - (o.lr * *trust) * lamb_r(o, m[i], v[i], pi);
  }
  __device__ void quad(int64_t q) const {
    for (int k = 0; k < 4; k++) scalar(4 * q + k);
  }
};

extern "C" int k_optim_update(float *p, float *s0, float *s1, float *grad, int64_t n,
                              const struct k_optim *o, const int32_t *skip, double *scratch,
                              void *stream) {
  if (n < 0 || o->master_bf16) return invalid_argument();
  cudaStream_t s = (cudaStream_t)stream;
  switch (o->kind) {
    case 0: return launch_map(SgdOp{p, s0, grad, *o, skip}, n, false, stream);
    case 1:
      if (s0 == nullptr || s1 == nullptr) return invalid_argument();
      return launch_map(AdamwStepOp{p, s0, s1, grad, *o, skip}, n, false, stream);
    case 2: {
      if (s0 == nullptr || s1 == nullptr) return invalid_argument();
      int64_t wanted = (n + L2L_THREADS - 1) / L2L_THREADS;
      int blocks = wanted < 1 ? 1 : wanted > LAMB_BLOCKS ? LAMB_BLOCKS : (int)wanted;
      float *trust = reinterpret_cast<float *>(scratch + 2 * LAMB_BLOCKS);
      K_LAUNCH(blocks, L2L_THREADS, 0, s, lamb_moments_kernel)(p, s0, s1, grad, n, *o, skip, scratch);
      K_LAUNCH(1, 1, 0, s, lamb_trust_kernel)(scratch, blocks, trust);
      int status = k_launched();
      if (status != 0) return status;
      return launch_map(LambApplyOp{p, s0, s1, *o, skip, trust}, n, false, stream);
    }
    default: return invalid_argument();
  }
}

/* ---------------------------------------------------------------- one step on compact state

   A bf16 master or state in bf16 or 8 bits (include/l2l/relay.h, "optimizers"; f32 state
   too beside a bf16 master), a block of K_STATE_BLOCK
   elements to a thread block: each thread decodes its 8 elements' state into registers,
   runs the f32 step above on them, and (a wave that writes the state) encodes them again;
   an 8-bit block's new scale is its largest magnitude (the root code's: of sqrt(v)),
   reduced in shared memory first, and each element's code the nearest by the code's rule
   (kernels/state_code.h, which the host's codes run too). Blocks are taken grid-stride by at most
   LAMB_BLOCKS thread blocks, so LAMB's partial sums are a fixed partition of the record. */

enum { K_STATE_BLOCK = 2048, K_PER_THREAD = K_STATE_BLOCK / (int)L2L_THREADS };
static_assert(K_STATE_BLOCK % (int)L2L_THREADS == 0, "a state block is whole threads' elements");

/* The 8-bit codes' values (src/backend/state_codes.c's, copied from the host). */
struct k_codes {
  float signed_value[256], root_value[256];
};

struct CompactArgs {
  void *p;         /* the master: f32, or bf16 (o.master_bf16) */
  float *grad;
  void *s[2];
  int64_t n;
  int precision;   /* 0 f32, 1 bf16, 2 8 bits */
  int64_t scales_at;   /* 8 bits: the byte where an array's scales begin */
  int root[2];     /* whether array s keeps sqrt(v) in the unsigned code */
  int wave;        /* LAMB: 0 the moments and sums, 1 the step; else 0 */
  struct k_optim o;
  const int32_t *skip;
  const float *trust;   /* LAMB's wave 1 */
};

static __device__ __forceinline__ float *scales_of(void *array, int64_t at) {
  return reinterpret_cast<float *>(static_cast<uint8_t *>(array) + at);
}

/* Element i of the master, widened exactly. */
static __device__ __forceinline__ float master_at(const CompactArgs &a, int64_t i) {
  return a.o.master_bf16 ? bf16_to_f32(static_cast<const uint16_t *>(a.p)[i])
                         : static_cast<const float *>(a.p)[i];
}

/* Element i of the master := x; a bf16 master's rounded stochastically by its 16-bit draw
   first_draw + i (src/core/core.h's half_bf16_stochastic: up in magnitude with the
   probability of x's place within its bf16 ulp; inf and NaN to nearest). */
static __device__ __forceinline__ void master_set(const CompactArgs &a, int64_t i, float x) {
  if (!a.o.master_bf16) {
    static_cast<float *>(a.p)[i] = x;
    return;
  }
  uint32_t u = f32_bits(x);
  uint16_t h = (u & 0x7f800000u) == 0x7f800000u
                   ? f32_to_bf16(x)
                   : (uint16_t)((u + k_philox_half(a.o.seed, a.o.stream,
                                                   a.o.first_draw + (uint64_t)i)) >> 16);
  static_cast<uint16_t *>(a.p)[i] = h;
}

static __global__ void __launch_bounds__(L2L_THREADS)
    compact_step_kernel(CompactArgs a, struct k_codes codes, double *partial) {
  K_STATIC_SHARED(float, value, [2][256]);
  K_STATIC_SHARED(float, most, [2][L2L_THREADS / 32]);
  for (int i = threadIdx.x; i < 256; i += L2L_THREADS)
    value[0][i] = codes.signed_value[i], value[1][i] = codes.root_value[i];
  __syncthreads();
  const struct k_optim &o = a.o;
  const bool go = !skipped(a.skip), lamb = o.kind == 2, sgd = o.kind == 0;
  const bool writes = a.wave == 0 && go;   /* the state encoded again */
  const int arrays = a.s[1] != nullptr ? 2 : a.s[0] != nullptr ? 1 : 0;
  double pp = 0, rr = 0;
  int64_t blocks = (a.n + K_STATE_BLOCK - 1) / K_STATE_BLOCK;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    float st[2][K_PER_THREAD];
    float scale[2] = {0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < 2; s++)
      if (s < arrays && a.precision == 2) scale[s] = scales_of(a.s[s], a.scales_at)[b];
#pragma unroll
    for (int k = 0; k < K_PER_THREAD; k++) {
      int64_t i = b * K_STATE_BLOCK + k * L2L_THREADS + threadIdx.x;
      st[0][k] = st[1][k] = 0.0f;
      if (i >= a.n) continue;
#pragma unroll
      for (int s = 0; s < 2; s++) {
        if (s >= arrays) continue;
        if (a.precision == 0) {
          st[s][k] = static_cast<const float *>(a.s[s])[i];
        } else if (a.precision == 1) {
          st[s][k] = bf16_to_f32(static_cast<const uint16_t *>(a.s[s])[i]);
        } else {
          float c = value[a.root[s]][static_cast<const uint8_t *>(a.s[s])[i]] * scale[s];
          st[s][k] = a.root[s] ? c * c : c;   /* (a root code keeps sqrt(v)) */
        }
      }
      if (lamb && a.wave == 1) {
        float pi = master_at(a, i);
        if (go) master_set(a, i, pi - (o.lr * *a.trust) * lamb_r(o, st[0][k], st[1][k], pi));
        continue;
      }
      float g = o.scale * a.grad[i], pi = master_at(a, i);
      a.grad[i] = 0.0f;
      if (!go) continue;
      if (sgd) {
        if (arrays == 0) {
          master_set(a, i, pi - o.decay * pi - o.lr * g);
        } else {
          float m = o.mu_prev * st[0][k] + g;
          st[0][k] = m;
          master_set(a, i, pi - o.decay * pi - o.lr * (o.nesterov ? g + o.momentum * m : m));
        }
        continue;
      }
      float mi = o.b1 * st[0][k] + o.c1 * g;
      float vi = o.b2 * st[1][k] + o.c2 * (g * g);
      st[0][k] = mi, st[1][k] = vi;
      if (lamb) {
        float r = lamb_r(o, mi, vi, pi);
        pp += (double)pi * (double)pi;
        rr += (double)r * (double)r;
      } else {
        master_set(a, i, pi - o.step * mi / (sqrtf(vi) * o.rsb2 + o.eps) - o.decay * pi);
      }
    }
    if (!writes) continue;
#pragma unroll
    for (int s = 0; s < 2; s++) {
      if (s >= arrays) continue;
      bool root = a.root[s];
      if (a.precision < 2) {
#pragma unroll
        for (int k = 0; k < K_PER_THREAD; k++) {
          int64_t i = b * K_STATE_BLOCK + k * L2L_THREADS + threadIdx.x;
          if (i >= a.n) continue;
          if (a.precision == 0) static_cast<float *>(a.s[s])[i] = st[s][k];
          else static_cast<uint16_t *>(a.s[s])[i] = f32_to_bf16(st[s][k]);
        }
        continue;
      }
      float m = 0.0f;   /* (comparisons, as the host's: a NaN is not the largest) */
#pragma unroll
      for (int k = 0; k < K_PER_THREAD; k++) {
        float x = root ? sqrtf(st[s][k] > 0.0f ? st[s][k] : 0.0f) : fabsf(st[s][k]);
        st[s][k] = root ? x : st[s][k];
        m = x > m ? x : m;
      }
      for (int off = 16; off > 0; off /= 2) {
        float other = __shfl_xor_sync(0xffffffffu, m, off);
        m = other > m ? other : m;
      }
      if (threadIdx.x % 32 == 0) most[s][threadIdx.x / 32] = m;
      __syncthreads();
      m = 0.0f;
      for (int w = 0; w < L2L_THREADS / 32; w++) m = most[s][w] > m ? most[s][w] : m;
      __syncthreads();   /* (most[] is read by every thread before the next block's) */
      if (threadIdx.x == 0) scales_of(a.s[s], a.scales_at)[b] = m;
      float lift = m < 0x1p-100f ? 0x1p100f : 1.0f, inv = 1.0f / (m * lift);
#pragma unroll
      for (int k = 0; k < K_PER_THREAD; k++) {
        int64_t i = b * K_STATE_BLOCK + k * L2L_THREADS + threadIdx.x;
        if (i >= a.n) continue;
        uint8_t q = 0;
        if (m > 0.0f) {
          if (root) {
            q = (uint8_t)state_code_nearest(st[s][k] * lift * inv, 8);
          } else {
            int c = state_code_nearest(fabsf(st[s][k]) * lift * inv, 7);
            q = (uint8_t)(c | (int)((f32_bits(st[s][k]) >> 31) & (c != 0)) << 7);
          }
        }
        static_cast<uint8_t *>(a.s[s])[i] = q;
      }
    }
  }
  if (!lamb || a.wave != 0) return;
  block_sums_out(pp, rr, partial);
}

extern "C" int k_optim_update_compact(void *p, void *s0, void *s1, int precision,
                                      int64_t scales_at, const int root[2], float *grad,
                                      int64_t n, const struct k_optim *o,
                                      const float *signed_value, const float *root_value,
                                      const int32_t *skip, double *scratch, void *stream) {
  if (n < 0 || precision < 0 || precision > 2) return invalid_argument();
  if (o->kind != 0 && (s0 == nullptr || s1 == nullptr)) return invalid_argument();
  cudaStream_t s = (cudaStream_t)stream;
  struct k_codes codes;
  for (int i = 0; i < 256; i++)
    codes.signed_value[i] = signed_value[i], codes.root_value[i] = root_value[i];
  int64_t wanted = (n + K_STATE_BLOCK - 1) / K_STATE_BLOCK;
  int blocks = wanted < 1 ? 1 : wanted > LAMB_BLOCKS ? LAMB_BLOCKS : (int)wanted;
  float *trust = reinterpret_cast<float *>(scratch + 2 * LAMB_BLOCKS);
  CompactArgs a{p, grad, {s0, s1}, n, precision, scales_at, {root[0], root[1]}, 0, *o, skip, trust};
  K_LAUNCH(blocks, L2L_THREADS, 0, s, compact_step_kernel)(a, codes, scratch);
  if (o->kind != 2) return k_launched();
  K_LAUNCH(1, 1, 0, s, lamb_trust_kernel)(scratch, blocks, trust);
  a.wave = 1;
  K_LAUNCH(blocks, L2L_THREADS, 0, s, compact_step_kernel)(a, codes, scratch);
  return k_launched();
}
