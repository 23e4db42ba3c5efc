/* eps_optim.c — the EPS's host optimizer kernels (SGD with momentum, AdamW, LAMB), the
 * checks of optimizer and schedule configs, and l2l_schedule_lr.
 *
 * Purpose: update one chunk [0, n) of one parameter record in fp32 as fast as host memory
 * allows. AdamW moves 28 bytes per parameter (read p, g, m, v; write p, m, v) and does a
 * handful of flops, so these loops are bandwidth-bound once they vectorize (see NOTES.md,
 * "Host memory bandwidth is the host optimizer's limit"). Every hot loop is therefore a
 * plain counted loop over restrict pointers that GCC vectorizes with the project's flags
 * (-fno-math-errno lets sqrtf vectorize; `omp simd reduction` lets the double sums
 * vectorize without -ffast-math): everything that depends only on the step (bias
 * corrections, step sizes, t = 1) is worked out once before the loop, and the loops have
 * no per-element branches. `make vecreport`'s flags with -fopt-info-vec-optimized on this
 * file list every loop below.
 * The maths is stated once, in l2l.h ("optimizers"); here only how it is evaluated.
 * Must never: allocate, lock, spawn threads (the EPS runs these on its own workers, one
 * chunk each), read or write beyond the n elements given, or write the gradient
 * (grad_scale is applied on the fly).
 */
#include "eps.h"

#include <math.h>


/* ---------------------------------------------------------------- config checks */

/* A float field that must be finite and lie in [lo, hi) (hi_open) or [lo, hi]. */
static l2l_status check_range(const char *func, const char *what, const char *field,
                              float value, double lo, double hi, int hi_open) {
  int ok = isfinite(value) && value >= lo && (hi_open ? value < hi : value <= hi);
  if (ok) return L2L_OK;
  return l2l_fail_in(func, L2L_ERR_INVALID, "%s %s must be in [%g, %g%s, got %g", what, field,
                     lo, hi, hi_open ? ")" : "]", (double)value);
}

l2l_status l2l_optimizer_check(const l2l_optimizer_config *c) {
  const char *f = __func__, *o = "optimizer";
  if (c == NULL) return FAIL(L2L_ERR_INVALID, "optimizer config is NULL");
  if (c->kind != L2L_OPTIMIZER_SGD && c->kind != L2L_OPTIMIZER_ADAMW &&
      c->kind != L2L_OPTIMIZER_LAMB)
    return FAIL(L2L_ERR_INVALID, "optimizer kind %d is unknown (0 sgd, 1 adamw, 2 lamb)",
                (int)c->kind);
  /* Garbage in a field the kind does not use is still garbage: no NaN or inf anywhere. */
  const struct {
    const char *name;
    float value;
  } all[] = {{"lr", c->lr},       {"momentum", c->momentum}, {"beta1", c->beta1},
             {"beta2", c->beta2}, {"eps", c->eps},           {"weight_decay", c->weight_decay}};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (!isfinite(all[i].value))
      return FAIL(L2L_ERR_INVALID, "optimizer %s must be finite, got %g", all[i].name,
                  (double)all[i].value);
  TRY(check_range(f, o, "lr", c->lr, 0.0, INFINITY, 1));
  TRY(check_range(f, o, "weight_decay", c->weight_decay, 0.0, INFINITY, 1));
  if (c->decay_all != 0 && c->decay_all != 1)
    return FAIL(L2L_ERR_INVALID, "optimizer decay_all must be 0 or 1, got %d", c->decay_all);
  if (c->kind == L2L_OPTIMIZER_SGD) {
    TRY(check_range(f, o, "momentum", c->momentum, 0.0, 1.0, 1));
    if (c->nesterov != 0 && c->nesterov != 1)
      return FAIL(L2L_ERR_INVALID, "optimizer nesterov must be 0 or 1, got %d", c->nesterov);
    if (c->nesterov && c->momentum == 0.0f)
      return FAIL(L2L_ERR_INVALID, "optimizer nesterov = 1 needs momentum > 0, got momentum %g",
                  (double)c->momentum);
  } else {
    TRY(check_range(f, o, "beta1", c->beta1, 0.0, 1.0, 1));
    TRY(check_range(f, o, "beta2", c->beta2, 0.0, 1.0, 1));
    if (!(c->eps > 0.0f))
      return FAIL(L2L_ERR_INVALID, "optimizer eps must be > 0, got %g", (double)c->eps);
  }
  return L2L_OK;
}

l2l_status l2l_schedule_check(const l2l_schedule_config *s) {
  if (s == NULL) return FAIL(L2L_ERR_INVALID, "schedule config is NULL");
  if (s->kind != L2L_SCHEDULE_CONSTANT && s->kind != L2L_SCHEDULE_COSINE &&
      s->kind != L2L_SCHEDULE_LINEAR)
    return FAIL(L2L_ERR_INVALID, "schedule kind %d is unknown (0 constant, 1 cosine, 2 linear)",
                (int)s->kind);
  if (s->warmup < 0)
    return FAIL(L2L_ERR_INVALID, "schedule warmup must be >= 0, got %lld",
                (long long)s->warmup);
  if (s->kind != L2L_SCHEDULE_CONSTANT && s->total <= s->warmup)
    return FAIL(L2L_ERR_INVALID, "schedule total must be > warmup (%lld) for %s, got %lld",
                (long long)s->warmup, s->kind == L2L_SCHEDULE_COSINE ? "cosine" : "linear",
                (long long)s->total);
  return check_range(__func__, "schedule", "final_ratio", s->final_ratio, 0.0, 1.0, 0);
}

int l2l_optim_state_count(const l2l_optimizer_config *c) {
  if (c == NULL) return -1;
  switch (c->kind) {
    case L2L_OPTIMIZER_SGD: return c->momentum > 0.0f ? 1 : 0;
    case L2L_OPTIMIZER_ADAMW:
    case L2L_OPTIMIZER_LAMB: return 2;
  }
  return -1; /* unknown kind: the config was not checked */
}

/* ---------------------------------------------------------------- schedules */

l2l_status l2l_schedule_lr(double *out, const l2l_schedule_config *schedule, double base_lr,
                           int64_t t) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (t < 1) return FAIL(L2L_ERR_INVALID, "t must be >= 1 (updates count from 1), got %lld",
                         (long long)t);
  if (!isfinite(base_lr) || base_lr < 0)
    return FAIL(L2L_ERR_INVALID, "base_lr must be finite and >= 0, got %g", base_lr);
  TRY(l2l_schedule_check(schedule));
  const l2l_schedule_config *s = schedule;
  double factor, final = (double)s->final_ratio;
  if (t <= s->warmup) {
    factor = (double)t / (double)s->warmup;
  } else if (s->kind == L2L_SCHEDULE_CONSTANT) {
    factor = 1.0;
  } else if (t >= s->total) {
    factor = final; /* the curves end exactly there, and stay */
  } else {
    double frac = (double)(t - s->warmup) / (double)(s->total - s->warmup);
    double shape = s->kind == L2L_SCHEDULE_COSINE ? 0.5 * (1.0 + cos(M_PI * frac)) : 1.0 - frac;
    factor = final + (1.0 - final) * shape;
  }
  *out = base_lr * factor;
  return L2L_OK;
}

/* ---------------------------------------------------------------- kernels */

/* Adam's bias corrections for step t, in double (b^t underflows gracefully there) and
   folded into the two constants the loops use: step = lr / (1 - b1^t) and
   rsb2 = 1 / sqrt(1 - b2^t), so that m^/(sqrt(v^) + eps) = (m / (1-b1^t)) /
   (sqrt(v) * rsb2 + eps) with no per-element division by a bias correction. */
struct adam_consts {
  float step;   /* lr / (1 - b1^t), or 1 / (1 - b1^t) for LAMB (lr applied later) */
  float rsb2;   /* 1 / sqrt(1 - b2^t) */
  float b1, c1, b2, c2; /* moment coefficients: m = b1 m + c1 g, v = b2 v + c2 g^2 */
};

static struct adam_consts adam_consts(const struct l2l_optim_hyper *h, double lr) {
  double t = (double)(h->t < 1 ? 1 : h->t);
  double bc1 = 1.0 - pow((double)h->beta1, t), bc2 = 1.0 - pow((double)h->beta2, t);
  struct adam_consts k = {
      .step = (float)(lr / bc1),
      .rsb2 = (float)(1.0 / sqrt(bc2)),
      .b1 = h->beta1,
      .b2 = h->beta2,
      /* grad_scale folds into the coefficients: (1-b1) (s g) and (1-b2) (s g)^2. */
      .c1 = (float)((1.0 - (double)h->beta1) * (double)h->grad_scale),
      .c2 = (float)((1.0 - (double)h->beta2) * (double)h->grad_scale * (double)h->grad_scale),
  };
  return k;
}

void l2l_optim_sgd(float *restrict p, float *restrict buf, const float *restrict grad, int64_t n,
                   const struct l2l_optim_hyper *h) {
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

void l2l_optim_adamw(float *restrict p, float *restrict m, float *restrict v,
                     const float *restrict grad, int64_t n, const struct l2l_optim_hyper *h) {
  const struct adam_consts k = adam_consts(h, (double)h->lr);
  const float eps = h->eps, decay = h->lr * h->weight_decay;
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float g = grad[i], pi = p[i];
    float mi = k.b1 * m[i] + k.c1 * g;
    float vi = k.b2 * v[i] + k.c2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - k.step * mi / (sqrtf(vi) * k.rsb2 + eps) - decay * pi;
  }
}

/* LAMB's update direction r = m^/(sqrt(v^) + eps) + wd p, the same expression in both
   passes so that the norm of pass one is the norm of what pass two applies. */
static inline float lamb_r(float m, float v, float p, float step, float rsb2, float eps,
                           float wd) {
  return step * m / (sqrtf(v) * rsb2 + eps) + wd * p;
}

void l2l_optim_lamb_moments(float *restrict m, float *restrict v, const float *restrict p,
                            const float *restrict grad, int64_t n,
                            const struct l2l_optim_hyper *h, double norms[2]) {
  const struct adam_consts k = adam_consts(h, 1.0);
  const float eps = h->eps, wd = h->weight_decay;
  double pp = 0.0, rr = 0.0;
#pragma omp simd reduction(+ : pp, rr)
  for (int64_t i = 0; i < n; i++) {
    float g = grad[i], pi = p[i];
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

void l2l_optim_lamb_apply(float *restrict p, const float *restrict m, const float *restrict v,
                          int64_t n, const struct l2l_optim_hyper *h, float trust) {
  const struct adam_consts k = adam_consts(h, 1.0);
  const float eps = h->eps, wd = h->weight_decay, rate = h->lr * trust;
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float pi = p[i];
    p[i] = pi - rate * lamb_r(m[i], v[i], pi, k.step, k.rsb2, eps, wd);
  }
}

float l2l_optim_lamb_trust(const double norms[2]) {
  /* !(x > 0) also catches NaN: a poisoned norm falls back to 1 and the NaN in r shows. */
  if (!(norms[0] > 0.0) || !(norms[1] > 0.0)) return 1.0f;
  return (float)(sqrt(norms[0]) / sqrt(norms[1]));
}

double l2l_optim_sumsq(const float *restrict x, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; i++) acc += (double)x[i] * (double)x[i];
  return acc;
}

void l2l_optim_axpy(float *restrict dst, const float *restrict src, float scale, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dst[i] += scale * src[i];
}

void l2l_optim_axpy_drain(float *restrict dst, float *restrict src, float scale, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    dst[i] += scale * src[i];
    src[i] = 0.0f;
  }
}

/* Widening is a shift for bf16 and half.h's exact conversion for f16, one loop per dtype so
   that each vectorizes without a per-element branch. */
double l2l_optim_sumsq_half(const uint16_t *restrict x, l2l_dtype dtype, int64_t n) {
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

void l2l_optim_axpy_half(float *restrict dst, const uint16_t *restrict src, l2l_dtype dtype,
                         float scale, int64_t n) {
  if (dtype == L2L_BF16) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] += scale * half_bf16_to_f32(src[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] += scale * half_f16_to_f32(src[i]);
  }
}
