/* SPDX-License-Identifier: MIT */
/* optim_kernels.c — the optimizers' host kernels (SGD with momentum, AdamW, LAMB) and the
 * gradient passes beside them (adds, sums of squares), on n elements of host memory.
 *
 * Purpose: one evaluation of each optimizer on the host, which the EPS's workers run on a
 * host-placed record's chunks and the CPU backend's device ops (cpu/cpu_ops.c) run on a
 * record placed on the device, so the two placements give the same bits (issue 49). They
 * update one chunk [0, n) in fp32 as fast as host memory allows: AdamW moves 28 bytes per
 * parameter (read p, g, m, v; write p, m, v) and does a handful of flops, so these loops
 * are bound by host memory bandwidth once they vectorize (bench/optim measures them
 * against that bound). Every hot loop is therefore a plain counted loop over restrict
 * pointers that GCC vectorizes with the project's flags (-fno-math-errno lets sqrtf
 * vectorize; `omp simd reduction` lets the double sums vectorize without -ffast-math):
 * everything that depends only on the step (bias corrections, step sizes, t = 1) is
 * worked out once before the loop, and the loops have no per-element branches.
 * The maths is stated once, in l2l.h ("optimizers"); here only how it is evaluated. The
 * GPU's update of a record on the device (kernels/optim.cu) takes its step's constants from
 * optim_kernel_consts, worked out here as these kernels work them out.
 * Must never: allocate, lock, spawn threads (their callers split the work), read or write
 * beyond the n elements given, or write the gradient (grad_scale is applied on the fly).
 */
#include <math.h>

#include "backend.h"
#include "kernels/optim.h"

/* Adam's constants for step t (backend.h's AdamW arithmetic), the bias corrections in double
   (b^t underflows gracefully there); lr 1 for LAMB, which applies lr after its trust
   ratio. */
static struct backend_adamw_consts adam_consts(const struct optim_hyper *h, double lr) {
  double t = (double)(h->t < 1 ? 1 : h->t);
  double bc1 = 1.0 - pow((double)h->beta1, t), bc2 = 1.0 - pow((double)h->beta2, t);
  return backend_adamw_consts(lr, h->beta1, h->beta2, h->eps, h->weight_decay, bc1, bc2,
                              (double)h->grad_scale);
}

void optim_kernel_consts(struct k_optim *out, const struct optim_hyper *h) {
  bool lamb = h->kind == L2L_OPTIMIZER_LAMB;
  struct backend_adamw_consts k = adam_consts(h, lamb ? 1.0 : (double)h->lr);
  *out = (struct k_optim){
      .kind = (int)h->kind, .scale = h->grad_scale, .lr = h->lr,
      .decay = h->kind == L2L_OPTIMIZER_SGD ? h->lr * h->weight_decay : k.decay,
      .momentum = h->momentum, .mu_prev = h->t <= 1 ? 0.0f : h->momentum,
      .nesterov = h->nesterov, .step = k.step, .rsb2 = k.rsb2, .b1 = k.b1, .c1 = k.c1,
      .b2 = k.b2, .c2 = k.c2, .eps = h->eps, .wd = h->weight_decay,
      .master_bf16 = h->master == L2L_BF16, .seed = h->seed, .stream = h->stream,
      .first_draw = h->first_draw};
}

int optim_kernel_state(const struct optim_hyper *h, int root[2]) {
  for (int s = 0; s < 2; s++) root[s] = optim_state_code(h->kind, s) == OPTIM_CODE_ROOT;
  if (h->state == L2L_STATE_F32 && h->master == L2L_F32) return -1;
  return h->state == L2L_STATE_F32 ? 0 : h->state == L2L_STATE_BF16 ? 1 : 2;
}

void optim_sgd(float *restrict p, float *restrict buf, const float *restrict grad, int64_t n,
               const struct optim_hyper *h) {
  const float lr = h->lr, s = h->grad_scale, mu = h->momentum;
  const float decay = h->lr * h->weight_decay; /* decoupled: p -= lr wd p, before the step */
  if (buf == NULL || mu == 0.0f) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      float pi = p[i];
      p[i] = pi - decay * pi - lr * (s * grad[i]);
    }
    return;
  }
  /* b = mu b + g, except b = g at t = 1 (PyTorch's convention): the state starts at zero,
     and mu_prev = 0 then also keeps whatever is in it out of the result. */
  const float mu_prev = h->t <= 1 ? 0.0f : mu;
  if (h->nesterov) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      float g = s * grad[i], pi = p[i];
      float b = mu_prev * buf[i] + g;
      buf[i] = b;
      p[i] = pi - decay * pi - lr * (g + mu * b);
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      float g = s * grad[i], pi = p[i];
      float b = mu_prev * buf[i] + g;
      buf[i] = b;
      p[i] = pi - decay * pi - lr * b;
    }
  }
}

void optim_adamw(float *restrict p, float *restrict m, float *restrict v,
                 const float *restrict grad, int64_t n, const struct optim_hyper *h) {
  const struct backend_adamw_consts k = adam_consts(h, (double)h->lr);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float mi = m[i], vi = v[i];
    p[i] = backend_adamw_element(p[i], grad[i], &mi, &vi, &k);
    m[i] = mi;
    v[i] = vi;
  }
}

/* LAMB's update direction r = m^/(sqrt(v^) + eps) + wd p, the same expression in both
   passes so that the norm of pass one is the norm of what pass two applies. */
static inline float lamb_r(float m, float v, float p, float step, float rsb2, float eps,
                           float wd) {
  return step * m / (sqrtf(v) * rsb2 + eps) + wd * p;
}

void optim_lamb_moments(float *restrict m, float *restrict v, const float *restrict p,
                        const float *restrict grad, int64_t n,
                        const struct optim_hyper *h, double norms[2]) {
  const struct backend_adamw_consts k = adam_consts(h, 1.0);
  const float eps = h->eps, wd = h->weight_decay;
  double pp = 0.0, rr = 0.0;
#pragma omp simd reduction(+ : pp, rr)
  for (int64_t i = 0; i < n; i++) {
    float g = k.scale * grad[i], pi = p[i];   /* unscaled first: see backend_adamw_consts */
    float mi = k.b1 * m[i] + k.c1 * g;
    float vi = k.b2 * v[i] + k.c2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    float r = lamb_r(mi, vi, pi, k.step, k.rsb2, eps, wd);
    pp += (double)pi * (double)pi;
    rr += (double)r * (double)r;
  }
  norms[0] += pp;
  norms[1] += rr;
}

void optim_lamb_apply(float *restrict p, const float *restrict m, const float *restrict v,
                      int64_t n, const struct optim_hyper *h, float trust) {
  const struct backend_adamw_consts k = adam_consts(h, 1.0);
  const float eps = h->eps, wd = h->weight_decay, rate = h->lr * trust;
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float pi = p[i];
    p[i] = pi - rate * lamb_r(m[i], v[i], pi, k.step, k.rsb2, eps, wd);
  }
}

float optim_lamb_trust(const double norms[2]) {
  /* !(x > 0) also catches NaN: a poisoned norm falls back to 1 and the NaN in r shows. */
  if (!(norms[0] > 0.0) || !(norms[1] > 0.0)) return 1.0f;
  return (float)(sqrt(norms[0]) / sqrt(norms[1]));
}

double optim_sumsq(const float *restrict x, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; i++) acc += (double)x[i] * (double)x[i];
  return acc;
}

double optim_sumsq_most(const float *restrict x, int64_t n, float *most) {
  double acc = 0.0;
  float top = 0.0f;
  /* comparisons, not fmaxf: without -ffinite-math-only fmaxf is a call per element */
#pragma omp simd reduction(+ : acc) reduction(max : top)
  for (int64_t i = 0; i < n; i++) {
    acc += (double)x[i] * (double)x[i];
    float a = fabsf(x[i]);
    top = a > top ? a : top;
  }
  *most = top;
  return acc;
}

/* The axpy kernels return whether every sum they wrote is finite and below EPS_GRAD_LIMIT
   (eps.h): b = x * 2^65 is inf exactly when |x| >= 2^63 (or x is inf or NaN), b - b is 0
   for a finite b and NaN otherwise, and their sum vectorizes (a comparison per element
   would not without -ffinite-math-only), in the pass that writes them anyway. */
bool optim_axpy(float *restrict dst, const float *restrict src, float scale, int64_t n) {
  float nonfinite = 0.0f;
#pragma omp simd reduction(+ : nonfinite)
  for (int64_t i = 0; i < n; i++) {
    float d = dst[i] + scale * src[i];
    dst[i] = d;
    float big = d * EPS_GRAD_OVER;
    nonfinite += big - big;
  }
  return nonfinite == 0.0f;
}

bool optim_axpy_drain(float *restrict dst, float *restrict src, float scale, int64_t n) {
  float nonfinite = 0.0f;
#pragma omp simd reduction(+ : nonfinite)
  for (int64_t i = 0; i < n; i++) {
    float d = dst[i] + scale * src[i];
    dst[i] = d;
    src[i] = 0.0f;
    float big = d * EPS_GRAD_OVER;
    nonfinite += big - big;
  }
  return nonfinite == 0.0f;
}

/* Widening is a shift for bf16 and core.h's exact conversion for f16, one loop per dtype so
   that each vectorizes without a per-element branch. */
double optim_sumsq_half(const uint16_t *restrict x, l2l_dtype dtype, int64_t n) {
  double acc = 0.0;
  if (dtype == L2L_BF16) {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) {
      double v = half_bf16_to_f32(x[i]);
      acc += v * v;
    }
  } else {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) {
      double v = half_f16_to_f32(x[i]);
      acc += v * v;
    }
  }
  return acc;
}

bool optim_axpy_half(float *restrict dst, const uint16_t *restrict src, l2l_dtype dtype,
                     float scale, int64_t n) {
  float nonfinite = 0.0f;
  if (dtype == L2L_BF16) {
#pragma omp simd reduction(+ : nonfinite)
    for (int64_t i = 0; i < n; i++) {
      float d = dst[i] + scale * half_bf16_to_f32(src[i]);
      dst[i] = d;
      float big = d * EPS_GRAD_OVER;
      nonfinite += big - big;
    }
  } else {
#pragma omp simd reduction(+ : nonfinite)
    for (int64_t i = 0; i < n; i++) {
      float d = dst[i] + scale * half_f16_to_f32(src[i]);
      dst[i] = d;
      float big = d * EPS_GRAD_OVER;
      nonfinite += big - big;
    }
  }
  return nonfinite == 0.0f;
}

bool optim_all_zero(const float *restrict x, int64_t n) {
  const uint32_t *restrict u = (const uint32_t *)x;
  uint32_t bits = 0;
#pragma omp simd reduction(| : bits)
  for (int64_t i = 0; i < n; i++) bits |= u[i];
  return bits == 0;
}

double optim_sumsq_of(const void *x, l2l_dtype dtype, int64_t n) {
  return dtype == L2L_F32 ? optim_sumsq(x, n) : optim_sumsq_half(x, dtype, n);
}

double optim_tensor_sumsq(const l2l_tensor *grad) {
  return optim_sumsq_of(l2l_tensor_data(grad), (l2l_dtype)l2l_tensor_dtype(grad),
                        l2l_tensor_numel(grad));
}

float optim_clip_factor(double sumsq, float clip) {
  double norm = sqrt(sumsq);
  return norm > clip ? (float)(clip / norm) : 1.0f;
}


void optim_norm_blocks(double *sumsq, float *most, const float *x, int64_t n) {
  for (int64_t at = 0; at < n; at += L2L_STATE_BLOCK) {
    float top = 0;
    int64_t k = n - at < L2L_STATE_BLOCK ? n - at : L2L_STATE_BLOCK;
    *sumsq += optim_sumsq_most(x + at, k, &top);
    *most = top > *most ? top : *most;
  }
}
