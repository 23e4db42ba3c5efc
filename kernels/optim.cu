/* SPDX-License-Identifier: MIT */
/* optim.cu — a record placed on the device: its gradient added into its accumulator, and
 * one step of its optimizer (SGD with momentum, AdamW, LAMB) on f32 master and state.
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

/* ---------------------------------------------------------------- the gradient's add */

/* inf exactly when |d| >= 2^63 or d is not finite (src/eps's EPS_GRAD_OVER) */
#define K_GRAD_OVER 0x1p65f

struct GradAddOp {
  float *acc;
  const void *g;
  int dtype;
  float scale;
  int32_t *flag;
  __device__ __forceinline__ float widen(int64_t i) const {
    if (dtype == DT_F32) return reinterpret_cast<const float *>(g)[i];
    uint16_t h = reinterpret_cast<const uint16_t *>(g)[i];
    return dtype == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  __device__ void scalar(int64_t i) const {
    float d = acc[i] + scale * widen(i);
    acc[i] = d;
    float big = d * K_GRAD_OVER;
    if (flag != nullptr && big - big != 0.0f) *flag = 1;   /* (NaN compares unequal too) */
  }
  __device__ void quad(int64_t q) const {
    for (int k = 0; k < 4; k++) scalar(4 * q + k);
  }
};

extern "C" int k_grad_add(float *acc, const void *g, int dtype, float scale, int64_t n,
                          int32_t *flag, void *stream) {
  if (dtype != DT_F32 && dtype != DT_F16 && dtype != DT_BF16) return invalid_argument();
  return launch_map(GradAddOp{acc, g, dtype, scale, flag}, n, false, stream);
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

enum { LAMB_BLOCKS = 1024 };

/* Wave one: the moments (the gradient cleared as read), and each block's sums of p^2 and
   r^2 into partial[2 * block]. */
__global__ void __launch_bounds__(L2L_THREADS)
    lamb_moments_kernel(float *p, float *m, float *v, float *grad, int64_t n, struct k_optim o,
                        const int32_t *skip, double *partial) {
  __shared__ double sums[2][L2L_THREADS];
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

/* The blocks' sums in block order, and the trust ratio |p| / |r| (1 where either is 0 or
   not a number) into *trust. */
__global__ void lamb_trust_kernel(const double *partial, int blocks, float *trust) {
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
  if (n < 0) return invalid_argument();
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
      lamb_moments_kernel<<<blocks, L2L_THREADS, 0, s>>>(p, s0, s1, grad, n, *o, skip, scratch);
      lamb_trust_kernel<<<1, 1, 0, s>>>(scratch, blocks, trust);
      int status = k_launched();
      if (status != 0) return status;
      return launch_map(LambApplyOp{p, s0, s1, *o, skip, trust}, n, false, stream);
    }
    default: return invalid_argument();
  }
}
