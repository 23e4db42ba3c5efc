/* SPDX-License-Identifier: MIT */
/* test_optim.c — the EPS's optimizer kernels, config checks and LR schedules
 * (src/eps/eps.h, and l2l_schedule_lr of l2l.h) against float64 references.
 *
 * What it tests: SGD (no momentum, momentum, nesterov), AdamW and LAMB (two passes, any
 * chunking) over steps t = 1..5, with weight decay on and off and grad_scale != 1; SGD
 * against PyTorch's momentum convention written out by hand; AdamW against the public
 * l2l_adamw_update; the LAMB trust ratio (1 when a norm is 0); sumsq, axpy and its
 * draining form, and the axpys' flag of a sum at 2^63 or beyond (EPS_GRAD_LIMIT); the
 * schedules at warm-up steps, midpoints, the end and beyond, against
 * closed forms; every refusal of optimizer_check, schedule_check and
 * l2l_schedule_lr (status, field name and value in the message); optim_state_count.
 *
 * How: the internal kernels are called directly (the test links libl2l.a). Inputs are
 * drawn fresh each run from check.h's generator, at sizes 1, 7, 33, a random one and
 * 1000003 (beyond any cache; one random flag combination there, for run time). Each array sits between guard elements that must come back
 * untouched, and the gradient must come back bit for bit. Every step's expected values
 * are computed in double by a plain loop written from l2l.h's maths, from the kernel's
 * own previous (float) state, so each step is checked on its own; an element's error is
 * measured relative to the sum of the magnitudes of the terms that make it (a float
 * evaluation errs by a few ulp of those, whatever cancels).
 * All test names start with "optim_", so `l2l_ctest optim_` runs just this file.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "reference.h"
#include "eps/eps.h"

/* ---------------------------------------------------------------- tolerances */

/* A few correctly rounded f32 operations per element plus a sqrtf and a division, each at
   most 2^-24 relative to its terms, and step constants rounded to f32 once: under 10 ulp
   ~ 6e-7 of the terms' magnitude. 1e-6 catches any wrong coefficient or formula (a
   missed bias correction or grad_scale is off by percents). */
#define TOL_KERNEL 1e-6
/* Double sums of f32 squares: only the double rounding of the sum, n * 2^-53 at worst. */
#define TOL_SUM 1e-9
/* Schedules are evaluated in double throughout. */
#define TOL_SCHEDULE 1e-12

enum { GUARD = 19 };
static const float SENTINEL = 12345.5f;

static const int64_t SIZES[] = {1, 7, 33, -1 /* random */, 1000003};
enum { NSIZES = sizeof SIZES / sizeof SIZES[0] };

static int64_t size_at(int k) { return SIZES[k] > 0 ? SIZES[k] : check_rand_int(2, 5000); }

/* The size beyond cache runs one of the four flag combinations (weight decay, grad_scale),
   drawn at random, to keep the file's run time near a second. */
static bool skip_big(int64_t n, int flags, int drawn) { return n > 100000 && flags != drawn; }

/* n floats between GUARD sentinels on either side; free with guarded_free. */
static float *guarded(int64_t n) {
  float *base = xmalloc(sizeof(float) * (size_t)(n + 2 * GUARD));
  for (int64_t i = 0; i < n + 2 * GUARD; i++) base[i] = SENTINEL;
  return base + GUARD;
}
static void guarded_free(float *x) {
  if (x) free(x - GUARD);
}
static bool guards_intact(const float *x, int64_t n) {
  for (int i = 1; i <= GUARD; i++)
    if (x[-i] != SENTINEL || x[n - 1 + i] != SENTINEL) return false;
  return true;
}

static void fill_floats_normal(float *x, int64_t n, double scale) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * check_rand_normal());
}

static double *dalloc(int64_t n) { return xmalloc(sizeof(double) * (size_t)n); }

/* max_i |got_i - want_i| / (mag_i + tiny), mag_i the sum of |terms| making want_i. */
static double scaled_err(const float *got, const double *want, const double *mag, int64_t n) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) return INFINITY;
    double err = fabs((double)got[i] - want[i]) / (mag[i] + 1e-30);
    if (err > worst) worst = err;
  }
  return worst;
}

#define CHECK_CLOSE(what, got, want, mag, n, tol)                                          \
  do {                                                                                     \
    double err_ = scaled_err((got), (want), (mag), (n));                                   \
    CHECK_WITHIN(err_, (tol), what,                                                        \
                 "%s: error %.3g of the terms' size > %.3g (n=%lld t=%lld)", what, err_,   \
                 (double)(tol), (long long)(n), (long long)t);                             \
  } while (0)

/* ---------------------------------------------------------------- references */

/* One SGD step in double from the float state (l2l.h: decoupled decay first; b = mu b + g,
   b = g at t = 1; p -= lr (g + mu b) with nesterov, else lr b; no momentum: p -= lr g). */
static void ref_sgd(double *p, double *pmag, double *b, double *bmag, const float *p0,
                    const float *b0, const float *grad, int64_t n,
                    const struct optim_hyper *h) {
  double lr = h->lr, mu = h->momentum, wd = h->weight_decay;
  for (int64_t i = 0; i < n; i++) {
    double g = (double)h->grad_scale * grad[i], pi = p0[i], step, stepmag;
    if (b0 != NULL) {
      double prev = h->t == 1 ? 0.0 : mu * b0[i];
      b[i] = prev + g;
      bmag[i] = fabs(prev) + fabs(g);
      step = h->nesterov ? g + mu * b[i] : b[i];
      stepmag = h->nesterov ? fabs(g) + mu * bmag[i] : bmag[i];
    } else {
      step = g;
      stepmag = fabs(g);
    }
    p[i] = pi - lr * wd * pi - lr * step;
    pmag[i] = fabs(pi) + lr * wd * fabs(pi) + lr * stepmag;
  }
}

/* Adam moments and the bias-corrected direction m^/(sqrt(v^)+eps), with dirmag its size
   in terms of |b1 m| + |(1-b1) g| (m itself may be a cancellation, and its rounding error
   goes through the division). */
static void ref_moments(double *m, double *mmag, double *v, double *dir, double *dirmag,
                        const float *m0, const float *v0, const float *grad, int64_t n,
                        const struct optim_hyper *h) {
  double b1 = h->beta1, b2 = h->beta2, t = (double)h->t;
  double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
  for (int64_t i = 0; i < n; i++) {
    double g = (double)h->grad_scale * grad[i];
    m[i] = b1 * m0[i] + (1.0 - b1) * g;
    mmag[i] = fabs(b1 * m0[i]) + fabs((1.0 - b1) * g);
    v[i] = b2 * v0[i] + (1.0 - b2) * g * g;
    double denom = sqrt(v[i] / bc2) + (double)h->eps;
    dir[i] = (m[i] / bc1) / denom;
    dirmag[i] = (mmag[i] / bc1) / denom;
  }
}

/* AdamW with grad_scale, and the size of each term (for scaled_err): reference.h's
   ref_adamw is l2l.h's statement for the public op, without sizes. */
static void ref_adamw_sized(double *p, double *pmag, double *m, double *mmag, double *v,
                            const float *p0, const float *m0, const float *v0,
                            const float *grad, int64_t n, const struct optim_hyper *h) {
  double *dir = dalloc(n), *dirmag = dalloc(n);
  ref_moments(m, mmag, v, dir, dirmag, m0, v0, grad, n, h);
  double lr = h->lr, wd = h->weight_decay;
  for (int64_t i = 0; i < n; i++) {
    double pi = p0[i];
    p[i] = pi - lr * (dir[i] + wd * pi);
    pmag[i] = fabs(pi) + lr * (dirmag[i] + wd * fabs(pi));
  }
  free(dir), free(dirmag);
}

/* LAMB: r = m^/(sqrt(v^)+eps) + wd p; trust = |p| / |r| (1 if either is 0);
   p -= lr trust r. norms: sum p^2, sum r^2; normmag: their size in terms of the
   magnitudes of the terms (an r that cancels has an error relative to rmag, not to r). */
static void ref_lamb(double *p, double *pmag, double *m, double *mmag, double *v,
                     double norms[2], double normmag[2], const float *p0, const float *m0, const float *v0,
                     const float *grad, int64_t n, const struct optim_hyper *h) {
  double *r = dalloc(n), *rmag = dalloc(n);
  ref_moments(m, mmag, v, r, rmag, m0, v0, grad, n, h);
  double wd = h->weight_decay, pp = 0.0, rr = 0.0, rrmag = 0.0;
  for (int64_t i = 0; i < n; i++) {
    r[i] += wd * p0[i];
    rmag[i] += wd * fabs(p0[i]);
    rrmag += 2.0 * fabs(r[i]) * rmag[i]; /* d(r^2) = 2 r dr */
    pp += (double)p0[i] * p0[i];
    rr += r[i] * r[i];
  }
  double trust = pp > 0 && rr > 0 ? sqrt(pp) / sqrt(rr) : 1.0;
  for (int64_t i = 0; i < n; i++) {
    p[i] = p0[i] - h->lr * trust * r[i];
    pmag[i] = fabs(p0[i]) + h->lr * trust * rmag[i];
  }
  norms[0] = normmag[0] = pp;
  norms[1] = rr;
  normmag[1] = rrmag;
  free(r), free(rmag);
}

/* ---------------------------------------------------------------- kernel runs */

static struct optim_hyper random_adam_hyper(l2l_optimizer_kind kind, int decay,
                                            int scaled) {
  struct optim_hyper h = {
      .kind = kind,
      .lr = (float)check_rand_uniform(0.005, 0.05),
      .weight_decay = decay ? (float)check_rand_uniform(0.01, 0.2) : 0.0f,
      .beta1 = (float)check_rand_uniform(0.8, 0.95),
      .beta2 = (float)check_rand_uniform(0.9, 0.999),
      .eps = check_rand_u64() & 1 ? 1e-8f : 1e-3f,
      .grad_scale = scaled ? (float)check_rand_uniform(0.2, 0.9) : 1.0f,
  };
  return h;
}

/* A gradient to pass, its copy to verify it was not written. */
struct grad {
  float *g, *copy;
};
static struct grad new_grad(int64_t n) {
  struct grad gr = {guarded(n), xmalloc(sizeof(float) * (size_t)n)};
  fill_floats_normal(gr.g, n, check_rand_uniform(0.1, 3.0));
  memcpy(gr.copy, gr.g, sizeof(float) * (size_t)n);
  return gr;
}
static bool grad_intact(struct grad gr, int64_t n) {
  return memcmp(gr.g, gr.copy, sizeof(float) * (size_t)n) == 0 && guards_intact(gr.g, n);
}
static void grad_free(struct grad gr) {
  guarded_free(gr.g);
  free(gr.copy);
}

TEST(optim_sgd) {
  for (int k = 0; k < NSIZES; k++) {
    int64_t n = size_at(k);
    /* variant: 0 no momentum, 1 momentum, 2 nesterov; each with decay and scale toggled */
    for (int variant = 0; variant < 3; variant++) {
      int drawn = (int)check_rand_int(0, 3);
      for (int flags = 0; flags < 4; flags++) {
        if (skip_big(n, flags, drawn)) continue;
        struct optim_hyper h = {
            .kind = L2L_OPTIMIZER_SGD,
            .lr = (float)check_rand_uniform(0.01, 0.1),
            .weight_decay = flags & 1 ? (float)check_rand_uniform(0.01, 0.2) : 0.0f,
            .momentum = variant ? (float)check_rand_uniform(0.5, 0.95) : 0.0f,
            .nesterov = variant == 2,
            .grad_scale = flags & 2 ? (float)check_rand_uniform(0.2, 0.9) : 1.0f,
        };
        float *p = guarded(n), *b = variant ? guarded(n) : NULL;
        fill_floats_normal(p, n, 1.0);
        if (b) memset(b, 0, sizeof(float) * (size_t)n); /* state starts at zero */
        double *pw = dalloc(n), *pm = dalloc(n), *bw = dalloc(n), *bm = dalloc(n);
        for (int64_t t = 1; t <= 5; t++) {
          struct grad gr = new_grad(n);
          h.t = t;
          ref_sgd(pw, pm, bw, bm, p, b, gr.g, n, &h);
          optim_sgd(p, b, gr.g, n, &h);
          CHECK_CLOSE("sgd p", p, pw, pm, n, TOL_KERNEL);
          if (b) CHECK_CLOSE("sgd momentum buffer", b, bw, bm, n, TOL_KERNEL);
          CHECK(grad_intact(gr, n), "sgd wrote the gradient or its guards (n=%lld)",
                (long long)n);
          grad_free(gr);
        }
        CHECK(guards_intact(p, n) && (!b || guards_intact(b, n)),
              "sgd wrote outside [0, n) (n=%lld variant %d)", (long long)n, variant);
        guarded_free(p);
        guarded_free(b);
        free(pw), free(pm), free(bw), free(bm);
      }
    }
  }
}

/* PyTorch's torch.optim.SGD, written out for three steps of one element (dampening 0, no
   weight decay): buf = g at the first step, then buf = mu buf + g; the step is buf, or
   g + mu buf with nesterov. */
TEST(optim_sgd_pytorch_convention) {
  const float lr = 0.1f, mu = 0.9f;
  const float g[3] = {1.0f, -2.0f, 0.5f};
  for (int nesterov = 0; nesterov <= 1; nesterov++) {
    float p = 1.0f, buf = 0.0f;
    double want_p = 1.0, want_buf = 0.0;
    for (int64_t t = 1; t <= 3; t++) {
      struct optim_hyper h = {.kind = L2L_OPTIMIZER_SGD, .lr = lr, .momentum = mu,
                                  .nesterov = nesterov, .t = t, .grad_scale = 1.0f};
      optim_sgd(&p, &buf, &g[t - 1], 1, &h);
      want_buf = t == 1 ? g[0] : (double)mu * want_buf + g[t - 1];
      double d = nesterov ? g[t - 1] + (double)mu * want_buf : want_buf;
      want_p -= (double)lr * d;
    }
    /* by hand: bufs 1, -1.1, -0.49; plain p = 1 - 0.1 (1 - 1.1 - 0.49) = 1.059;
       nesterov p = 1 - 0.1 ((1 + 0.9) + (-2 - 0.99) + (0.5 - 0.441)) = 1.1031 */
    double by_hand = nesterov ? 1.1031 : 1.059;
    CHECK(fabs(want_buf - -0.49) < 1e-6, "reference buf %.9g, by hand -0.49", want_buf);
    CHECK(fabs(want_p - by_hand) < 1e-6, "reference p %.9g, by hand %.9g", want_p, by_hand);
    CHECK(fabs(buf - want_buf) < 1e-6, "nesterov %d: buf %.9g, want %.9g", nesterov, buf,
          want_buf);
    CHECK(fabs(p - want_p) < 1e-6, "nesterov %d: p %.9g, want %.9g", nesterov, p, want_p);
  }
}

TEST(optim_adamw) {
  for (int k = 0; k < NSIZES; k++) {
    int64_t n = size_at(k);
    int drawn = (int)check_rand_int(0, 3);
    for (int flags = 0; flags < 4; flags++) {
      if (skip_big(n, flags, drawn)) continue;
      struct optim_hyper h = random_adam_hyper(L2L_OPTIMIZER_ADAMW, flags & 1, flags & 2);
      float *p = guarded(n), *m = guarded(n), *v = guarded(n);
      fill_floats_normal(p, n, 1.0);
      memset(m, 0, sizeof(float) * (size_t)n);
      memset(v, 0, sizeof(float) * (size_t)n);
      double *pw = dalloc(n), *pm = dalloc(n), *mw = dalloc(n), *mm = dalloc(n),
             *vw = dalloc(n);
      for (int64_t t = 1; t <= 5; t++) {
        struct grad gr = new_grad(n);
        h.t = t;
        ref_adamw_sized(pw, pm, mw, mm, vw, p, m, v, gr.g, n, &h);
        optim_adamw(p, m, v, gr.g, n, &h);
        CHECK_CLOSE("adamw p", p, pw, pm, n, TOL_KERNEL);
        CHECK_CLOSE("adamw m", m, mw, mm, n, TOL_KERNEL);
        CHECK_CLOSE("adamw v", v, vw, vw, n, TOL_KERNEL);
        CHECK(grad_intact(gr, n), "adamw wrote the gradient or its guards (n=%lld)",
              (long long)n);
        grad_free(gr);
      }
      CHECK(guards_intact(p, n) && guards_intact(m, n) && guards_intact(v, n),
            "adamw wrote outside [0, n) (n=%lld)", (long long)n);
      guarded_free(p), guarded_free(m), guarded_free(v);
      free(pw), free(pm), free(mw), free(mm), free(vw);
    }
  }
}

/* The EPS kernel and the public op promise the same maths (grad_scale 1): from the same
   state, each step of both lies within TOL_KERNEL of the double reference. */
TEST(optim_adamw_matches_public_update) {
  int64_t n = check_rand_int(100, 3000);
  size_t bytes = sizeof(float) * (size_t)n;
  struct optim_hyper h = random_adam_hyper(L2L_OPTIMIZER_ADAMW, 1, 0);
  l2l_adamw_config c = {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  l2l_tensor *p = check_randn(1.0, 1, n), *m = check_f32(1, n), *v = check_f32(1, n),
             *g = check_f32(1, n);
  CHECK_OK(l2l_tensor_fill(m, 0.0));
  CHECK_OK(l2l_tensor_fill(v, 0.0));
  float *p2 = xmalloc(bytes), *m2 = xmalloc(bytes), *v2 = xmalloc(bytes);
  double *pw = dalloc(n), *pm = dalloc(n), *mw = dalloc(n), *mm = dalloc(n), *vw = dalloc(n);
  for (int64_t t = 1; t <= 5; t++) {
    fill_floats_normal(check_data(g), n, 1.0);
    h.t = t;
    memcpy(p2, check_data(p), bytes);
    memcpy(m2, check_data(m), bytes);
    memcpy(v2, check_data(v), bytes);
    ref_adamw_sized(pw, pm, mw, mm, vw, p2, m2, v2, check_data(g), n, &h);
    CHECK_OK(l2l_adamw_update(p, m, v, g, &c, t));
    optim_adamw(p2, m2, v2, check_data(g), n, &h);
    CHECK_CLOSE("l2l_adamw_update p", check_data(p), pw, pm, n, TOL_KERNEL);
    CHECK_CLOSE("optim_adamw p", p2, pw, pm, n, TOL_KERNEL);
    CHECK_CLOSE("l2l_adamw_update m", check_data(m), mw, mm, n, TOL_KERNEL);
    CHECK_CLOSE("optim_adamw m", m2, mw, mm, n, TOL_KERNEL);
    CHECK_CLOSE("l2l_adamw_update v", check_data(v), vw, vw, n, TOL_KERNEL);
    CHECK_CLOSE("optim_adamw v", v2, vw, vw, n, TOL_KERNEL);
  }
  l2l_tensor_free(p), l2l_tensor_free(m), l2l_tensor_free(v), l2l_tensor_free(g);
  free(p2), free(m2), free(v2), free(pw), free(pm), free(mw), free(mm), free(vw);
}

/* LAMB through the kernels over chunks [cut[c], cut[c+1]), as the EPS runs it. */
static void lamb_chunked(float *p, float *m, float *v, const float *g, const int64_t *cut,
                         int chunks, const struct optim_hyper *h, double norms[2]) {
  norms[0] = norms[1] = 0.0;
  for (int c = 0; c < chunks; c++)
    optim_lamb_moments(m + cut[c], v + cut[c], p + cut[c], g + cut[c], cut[c + 1] - cut[c],
                       h, norms);
  float trust = optim_lamb_trust(norms);
  for (int c = 0; c < chunks; c++)
    optim_lamb_apply(p + cut[c], m + cut[c], v + cut[c], cut[c + 1] - cut[c], h, trust);
}

static int compare_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

TEST(optim_lamb) {
  enum { MAX_CHUNKS = 9 };
  for (int k = 0; k < NSIZES; k++) {
    int64_t n = size_at(k);
    int drawn = (int)check_rand_int(0, 3);
    for (int flags = 0; flags < 4; flags++) {
      if (skip_big(n, flags, drawn)) continue;
      struct optim_hyper h = random_adam_hyper(L2L_OPTIMIZER_LAMB, flags & 1, flags & 2);
      /* Two copies of the state: one run in one chunk, one in uneven chunks (random cuts,
         so some chunks may be empty or one element). */
      float *p = guarded(n), *m = guarded(n), *v = guarded(n);
      float *p1 = guarded(n), *m1 = guarded(n), *v1 = guarded(n);
      fill_floats_normal(p, n, 1.0);
      memset(m, 0, sizeof(float) * (size_t)n);
      memset(v, 0, sizeof(float) * (size_t)n);
      memcpy(p1, p, sizeof(float) * (size_t)n);
      memcpy(m1, m, sizeof(float) * (size_t)n);
      memcpy(v1, v, sizeof(float) * (size_t)n);
      double *pw = dalloc(n), *pm = dalloc(n), *mw = dalloc(n), *mm = dalloc(n),
             *vw = dalloc(n);
      for (int64_t t = 1; t <= 5; t++) {
        struct grad gr = new_grad(n);
        h.t = t;
        int chunks = (int)check_rand_int(2, MAX_CHUNKS);
        int64_t cut[MAX_CHUNKS + 1], whole[2] = {0, n};
        cut[0] = 0, cut[chunks] = n;
        for (int c = 1; c < chunks; c++) cut[c] = check_rand_int(0, n);
        qsort(cut + 1, (size_t)(chunks - 1), sizeof cut[0], compare_i64);
        double want_norms[2], normmag[2], norms[2], norms1[2];
        ref_lamb(pw, pm, mw, mm, vw, want_norms, normmag, p, m, v, gr.g, n, &h);
        lamb_chunked(p, m, v, gr.g, cut, chunks, &h, norms);
        lamb_chunked(p1, m1, v1, gr.g, whole, 1, &h, norms1);
        CHECK_CLOSE("lamb p (chunked)", p, pw, pm, n, TOL_KERNEL);
        CHECK_CLOSE("lamb m (chunked)", m, mw, mm, n, TOL_KERNEL);
        CHECK_CLOSE("lamb v (chunked)", v, vw, vw, n, TOL_KERNEL);
        for (int j = 0; j < 2; j++) {
          CHECK(fabs(norms[j] - want_norms[j]) <= TOL_KERNEL * normmag[j],
                "lamb norm %d: %.12g, want %.12g (n=%lld t=%lld)", j, norms[j], want_norms[j],
                (long long)n, (long long)t);
          CHECK(fabs(norms[j] - norms1[j]) <= TOL_SUM * norms1[j],
                "lamb norm %d: %d chunks %.15g, one chunk %.15g", j, chunks, norms[j],
                norms1[j]);
        }
        /* Chunked equals one chunk: the moments are elementwise (bit for bit), the norms
           differ only in the order of a double sum, so the f32 trust ratio may differ by
           an ulp (up to 1.2e-7 relative) and p by that much of the step plus one rounding
           of p: 5e-7 of the terms' size bounds both. Then re-sync p for the next step. */
        double *mag1 = dalloc(n), *want1 = dalloc(n);
        for (int64_t i = 0; i < n; i++) want1[i] = p[i], mag1[i] = pm[i];
        CHECK_CLOSE("lamb p: one chunk vs uneven chunks", p1, want1, mag1, n, 5e-7);
        CHECK(memcmp(m, m1, sizeof(float) * (size_t)n) == 0 &&
                  memcmp(v, v1, sizeof(float) * (size_t)n) == 0,
              "lamb moments differ between chunkings (n=%lld)", (long long)n);
        memcpy(p1, p, sizeof(float) * (size_t)n);
        free(mag1), free(want1);
        CHECK(grad_intact(gr, n), "lamb wrote the gradient or its guards (n=%lld)",
              (long long)n);
        grad_free(gr);
      }
      CHECK(guards_intact(p, n) && guards_intact(m, n) && guards_intact(v, n),
            "lamb wrote outside [0, n) (n=%lld)", (long long)n);
      guarded_free(p), guarded_free(m), guarded_free(v);
      guarded_free(p1), guarded_free(m1), guarded_free(v1);
      free(pw), free(pm), free(mw), free(mm), free(vw);
    }
  }
}

TEST(optim_lamb_trust) {
  const double cases[][3] = {
      {0.0, 4.0, 1.0},      /* |p| = 0: trust 1 (fresh zero-initialized biases) */
      {4.0, 0.0, 1.0},      /* |r| = 0 */
      {0.0, 0.0, 1.0},
      {4.0, 1.0, 2.0},      /* sqrt(4) / sqrt(1) */
      {1.0, 100.0, 0.1},
      {NAN, 1.0, 1.0},      /* a poisoned norm does not become the rate */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double norms[2] = {cases[i][0], cases[i][1]};
    float got = optim_lamb_trust(norms);
    CHECK(fabs(got - cases[i][2]) <= 1e-7 * cases[i][2], "trust(%g, %g) = %.9g, want %g",
          norms[0], norms[1], got, cases[i][2]);
  }
  /* A zero parameter (a fresh bias): trust 1, so p = -lr r exactly as plain Adam would. */
  struct optim_hyper h = random_adam_hyper(L2L_OPTIMIZER_LAMB, 1, 0);
  h.t = 1;
  float p[5] = {0}, m[5] = {0}, v[5] = {0}, g[5] = {1, -2, 3, -4, 5};
  double norms[2] = {0, 0};
  optim_lamb_moments(m, v, p, g, 5, &h, norms);
  CHECK(norms[0] == 0.0 && norms[1] > 0.0, "norms %g %g", norms[0], norms[1]);
  float trust = optim_lamb_trust(norms);
  CHECK(trust == 1.0f, "trust %g with |p| = 0", trust);
  optim_lamb_apply(p, m, v, 5, &h, trust);
  for (int i = 0; i < 5; i++) {
    /* t = 1: m^ = g, v^ = g^2, so r = g / (|g| + eps) */
    double want = -(double)h.lr * g[i] / (fabs(g[i]) + h.eps);
    CHECK(fabs(p[i] - want) <= TOL_KERNEL * fabs(want), "p[%d] = %.9g, want %.9g", i, p[i],
          want);
  }
}

TEST(optim_sumsq_axpy) {
  for (int k = 0; k < NSIZES; k++) {
    int64_t n = size_at(k);
    float *x = guarded(n), *dst = guarded(n);
    fill_floats_normal(x, n, check_rand_uniform(1e-3, 1e3));
    fill_floats_normal(dst, n, 1.0);
    double want = 0.0;
    for (int64_t i = 0; i < n; i++) want += (double)x[i] * x[i];
    double got = optim_sumsq(x, n);
    CHECK(fabs(got - want) <= TOL_SUM * want, "sumsq n=%lld: %.17g, want %.17g",
          (long long)n, got, want);
    float scale = (float)check_rand_uniform(-2.0, 2.0);
    double *w = dalloc(n), *mag = dalloc(n);
    for (int64_t i = 0; i < n; i++) {
      w[i] = dst[i] + (double)scale * x[i];
      mag[i] = fabs(dst[i]) + fabs((double)scale * x[i]);
    }
    optim_axpy(dst, x, scale, n);
    int64_t t = 0; /* for CHECK_CLOSE's message */
    CHECK_CLOSE("axpy", dst, w, mag, n, TOL_KERNEL);
    CHECK(guards_intact(dst, n) && guards_intact(x, n), "axpy wrote outside [0, n)");
    /* The draining form: the same sum again, and x left zero. */
    for (int64_t i = 0; i < n; i++) {
      w[i] = dst[i] + (double)scale * x[i];
      mag[i] = fabs(dst[i]) + fabs((double)scale * x[i]);
    }
    optim_axpy_drain(dst, x, scale, n);
    CHECK_CLOSE("axpy_drain", dst, w, mag, n, TOL_KERNEL);
    int64_t left = 0;
    for (int64_t i = 0; i < n; i++) left += x[i] != 0.0f;
    CHECK(left == 0, "axpy_drain n=%lld left %lld source entries non-zero", (long long)n,
          (long long)left);
    CHECK(guards_intact(dst, n) && guards_intact(x, n), "axpy_drain wrote outside [0, n)");
    guarded_free(x), guarded_free(dst);
    free(w), free(mag);
  }
  CHECK(optim_sumsq(NULL, 0) == 0.0, "sumsq of nothing is 0");
}

/* The axpy kernels' flag is what an eager update takes (eps.h, EPS_GRAD_LIMIT): every sum
   finite and below 2^63 in magnitude. One sum of each drawn kind is planted at a random
   element (dst = v, src = 0 there, so the sum is v exactly): the largest float below 2^63
   or any value of [1, 2^63) passes; 2^63 itself, anything above it, inf and NaN do not;
   either sign. sumsq_most's largest |x| is the plain loop's, and its sum sumsq's. */
TEST(optim_axpy_limit) {
  const float below[] = {0x1p63f - 0x1p39f, (float)ldexp(check_rand_uniform(1, 2), (int)check_rand_int(0, 62))};
  const float over[] = {0x1p63f, (float)ldexp(check_rand_uniform(1, 2), (int)check_rand_int(63, 127)),
                        INFINITY, NAN};
  for (int k = 0; k < NSIZES - 1; k++) {
    int64_t n = size_at(k);
    float *dst = guarded(n), *x = guarded(n);
    uint16_t *half = xmalloc(sizeof(uint16_t) * (size_t)n);
    for (int c = 0; c < 6; c++) {
      bool pass = c < 2;
      float v = pass ? below[c] : over[c - 2];
      if (check_rand_int(0, 1)) v = -v;
      for (int form = 0; form < 3; form++) {
        fill_floats_normal(dst, n, 1.0);
        fill_floats_normal(x, n, 1.0);
        memset(half, 0, sizeof(uint16_t) * (size_t)n);   /* bf16 zeros */
        int64_t at = check_rand_int(0, n - 1);
        dst[at] = v;
        x[at] = 0.0f;
        float scale = (float)check_rand_uniform(-2, 2);
        bool got = form == 0   ? optim_axpy(dst, x, scale, n)
                   : form == 1 ? optim_axpy_drain(dst, x, scale, n)
                               : optim_axpy_half(dst, half, L2L_BF16, scale, n);
        CHECK(got == pass, "axpy form %d n=%lld: a sum of %.9g at %lld %s, want %s", form,
              (long long)n, (double)v, (long long)at, got ? "passed" : "was flagged",
              pass ? "passed (below 2^63)" : "flagged");
      }
    }
    fill_floats_normal(x, n, check_rand_uniform(1e-3, 1e3));
    float most = -1.0f;
    double sum = optim_sumsq_most(x, n, &most), want_sum = optim_sumsq(x, n);
    float want = 0.0f;
    for (int64_t i = 0; i < n; i++) want = fabsf(x[i]) > want ? fabsf(x[i]) : want;
    CHECK(most == want, "sumsq_most n=%lld: largest %.9g, want %.9g", (long long)n, (double)most,
          (double)want);
    CHECK(fabs(sum - want_sum) <= TOL_SUM * want_sum, "sumsq_most n=%lld: %.17g, sumsq %.17g",
          (long long)n, sum, want_sum);
    guarded_free(dst), guarded_free(x);
    free(half);
  }
}

/* ---------------------------------------------------------------- schedules */

static double lr_at(const l2l_schedule_config *s, double base, int64_t t) {
  double out = NAN;
  CHECK_OK(l2l_schedule_lr(&out, s, base, t));
  return out;
}

#define CHECK_LR(s, base, t, want)                                                         \
  do {                                                                                     \
    double got_ = lr_at((s), (base), (t)), want_ = (want);                                 \
    CHECK(fabs(got_ - want_) <= TOL_SCHEDULE * fabs(want_) + 1e-300,                       \
          "schedule kind %d at t=%lld: %.17g, want %.17g", (int)(s)->kind, (long long)(t), \
          got_, want_);                                                                    \
  } while (0)

TEST(optim_schedule_values) {
  const double base = 3e-4, pi = 3.14159265358979323846;
  /* constant: warm-up t/4 for t <= 4, then 1 forever (total and final_ratio unused) */
  l2l_schedule_config c = {L2L_SCHEDULE_CONSTANT, 4, 0, 0.5f};
  for (int64_t t = 1; t <= 4; t++) CHECK_LR(&c, base, t, base * (double)t / 4.0);
  CHECK_LR(&c, base, 5, base);
  CHECK_LR(&c, base, 1000000, base);
  l2l_schedule_config c0 = {L2L_SCHEDULE_CONSTANT, 0, 0, 0.0f};
  CHECK_LR(&c0, base, 1, base);

  /* cosine and linear: warm-up 10, total 110, final 0.1 (exactly representable? no:
     use the float's own value in the closed forms) */
  for (int kind = L2L_SCHEDULE_COSINE; kind <= L2L_SCHEDULE_LINEAR; kind++) {
    l2l_schedule_config s = {(l2l_schedule_kind)kind, 10, 110, 0.1f};
    double f = (double)s.final_ratio;
    for (int64_t t = 1; t <= 10; t++) CHECK_LR(&s, base, t, base * (double)t / 10.0);
    CHECK_LR(&s, base, 60, base * (f + (1 - f) * 0.5));                   /* midpoint */
    CHECK_LR(&s, base, 110, base * f);                                    /* the end */
    CHECK_LR(&s, base, 111, base * f);                                    /* beyond */
    CHECK_LR(&s, base, 1000000, base * f);
    double q = kind == L2L_SCHEDULE_COSINE ? 0.5 * (1 + cos(pi * 0.25)) : 0.75;
    CHECK_LR(&s, base, 35, base * (f + (1 - f) * q));                     /* a quarter in */
    double first = kind == L2L_SCHEDULE_COSINE ? 0.5 * (1 + cos(pi / 100)) : 0.99;
    CHECK_LR(&s, base, 11, base * (f + (1 - f) * first));                 /* after warm-up */
    /* no warm-up: t = 1 is already one step down the curve */
    l2l_schedule_config s0 = {(l2l_schedule_kind)kind, 0, 8, 0.0f};
    double q0 = kind == L2L_SCHEDULE_COSINE ? 0.5 * (1 + cos(pi / 8)) : 7.0 / 8.0;
    CHECK_LR(&s0, base, 1, base * q0);
    CHECK_LR(&s0, base, 4, base * 0.5);
    CHECK_LR(&s0, base, 8, 0.0);
    CHECK_LR(&s0, base, 9, 0.0);
  }
  /* monotone non-increasing after warm-up, random shape */
  l2l_schedule_config r = {L2L_SCHEDULE_COSINE, check_rand_int(0, 50), 0, 0.0f};
  r.total = r.warmup + check_rand_int(1, 500);
  r.final_ratio = (float)check_rand_uniform(0, 1);
  double prev = INFINITY;
  for (int64_t t = r.warmup + 1; t <= r.total + 3; t++) {
    double lr = lr_at(&r, 1.0, t);
    CHECK(lr <= prev && lr >= r.final_ratio - 1e-12, "cosine not decreasing at t=%lld",
          (long long)t);
    prev = lr;
  }
  l2l_schedule_config z = {L2L_SCHEDULE_LINEAR, 2, 5, 0.0f};
  CHECK_LR(&z, 0.0, 3, 0.0); /* base 0 is allowed */
}

TEST(optim_schedule_refusals) {
  l2l_schedule_config good = {L2L_SCHEDULE_COSINE, 10, 100, 0.1f}, s;
  double out = 7.0;
  CHECK_OK(schedule_check(&good));
  CHECK_FAILS(schedule_check(NULL), L2L_ERR_INVALID, "NULL");
  s = good, s.kind = (l2l_schedule_kind)3;
  CHECK_FAILS(schedule_check(&s), L2L_ERR_INVALID, "kind 3");
  s = good, s.warmup = -1;
  CHECK_FAILS(schedule_check(&s), L2L_ERR_INVALID, "warmup must be >= 0, got -1");
  s = good, s.total = 10;
  CHECK_FAILS(schedule_check(&s), L2L_ERR_INVALID, "total must be > warmup (10)");
  s = good, s.kind = L2L_SCHEDULE_LINEAR, s.total = 3;
  CHECK_FAILS(schedule_check(&s), L2L_ERR_INVALID, "got 3");
  s = good, s.final_ratio = 1.5f;
  CHECK_FAILS(schedule_check(&s), L2L_ERR_INVALID, "final_ratio must be in [0, 1], got 1.5");
  s = good, s.final_ratio = -0.25f;
  CHECK_FAILS(schedule_check(&s), L2L_ERR_INVALID, "final_ratio");
  s = good, s.final_ratio = NAN;
  CHECK_FAILS(schedule_check(&s), L2L_ERR_INVALID, "final_ratio");
  /* constant ignores total; final_ratio 1 is allowed */
  s = good, s.kind = L2L_SCHEDULE_CONSTANT, s.total = 0, s.final_ratio = 1.0f;
  CHECK_OK(schedule_check(&s));

  CHECK_FAILS(l2l_schedule_lr(NULL, &good, 1.0, 1), L2L_ERR_INVALID, "out");
  CHECK_FAILS(l2l_schedule_lr(&out, &good, 1.0, 0), L2L_ERR_INVALID, "t must be >= 1");
  CHECK_FAILS(l2l_schedule_lr(&out, &good, 1.0, -5), L2L_ERR_INVALID, "got -5");
  CHECK_FAILS(l2l_schedule_lr(&out, &good, -1.0, 1), L2L_ERR_INVALID, "base_lr");
  CHECK_FAILS(l2l_schedule_lr(&out, &good, NAN, 1), L2L_ERR_INVALID, "base_lr");
  CHECK_FAILS(l2l_schedule_lr(&out, &good, INFINITY, 1), L2L_ERR_INVALID, "base_lr");
  CHECK_FAILS(l2l_schedule_lr(&out, NULL, 1.0, 1), L2L_ERR_INVALID, "NULL");
  s = good, s.warmup = -2;
  CHECK_FAILS(l2l_schedule_lr(&out, &s, 1.0, 1), L2L_ERR_INVALID, "warmup");
  CHECK(out == 7.0, "a refused l2l_schedule_lr wrote out (%g)", out);
}

TEST(optim_optimizer_refusals) {
  const l2l_optimizer_config sgd = {.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .momentum = 0.9f,
                                    .nesterov = 1, .weight_decay = 0.0f};
  const l2l_optimizer_config adam = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-3f, .beta1 = 0.9f,
                                     .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                                     .decay_all = 1};
  l2l_optimizer_config c;
  CHECK_OK(optimizer_check(&sgd)); /* betas and eps 0: unused by SGD */
  CHECK_OK(optimizer_check(&adam));
  c = adam, c.kind = L2L_OPTIMIZER_LAMB, c.lr = 0.0f;
  CHECK_OK(optimizer_check(&c)); /* lr 0 allowed; momentum unused */
  c = sgd, c.momentum = 0.0f, c.nesterov = 0;
  CHECK_OK(optimizer_check(&c)); /* plain SGD */

  CHECK_FAILS(optimizer_check(NULL), L2L_ERR_INVALID, "NULL");
  struct {
    l2l_optimizer_config c;
    const char *needle;
  } bad[] = {
      {{.kind = (l2l_optimizer_kind)3, .lr = 0.1f}, "kind 3"},
      {{.kind = (l2l_optimizer_kind)-1, .lr = 0.1f}, "kind -1"},
      {{.kind = L2L_OPTIMIZER_SGD, .lr = -0.5f}, "lr must be in [0, inf), got -0.5"},
      {{.kind = L2L_OPTIMIZER_SGD, .lr = NAN}, "lr must be finite, got nan"},
      {{.kind = L2L_OPTIMIZER_ADAMW, .lr = INFINITY, .eps = 1e-8f}, "lr must be finite, got inf"},
      {{.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .momentum = 1.0f}, "momentum must be in [0, 1), got 1"},
      {{.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .momentum = -0.25f}, "momentum must be in [0, 1), got -0.25"},
      {{.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .momentum = 0.9f, .nesterov = 2}, "nesterov must be 0 or 1, got 2"},
      {{.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .nesterov = 1}, "nesterov = 1 needs momentum > 0, got momentum 0"},
      {{.kind = L2L_OPTIMIZER_ADAMW, .lr = 0.1f, .beta1 = 1.0f, .beta2 = 0.9f, .eps = 1e-8f}, "beta1 must be in [0, 1), got 1"},
      {{.kind = L2L_OPTIMIZER_LAMB, .lr = 0.1f, .beta1 = 0.9f, .beta2 = -0.5f, .eps = 1e-8f}, "beta2 must be in [0, 1), got -0.5"},
      {{.kind = L2L_OPTIMIZER_LAMB, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 1.5f, .eps = 1e-8f}, "beta2"},
      {{.kind = L2L_OPTIMIZER_ADAMW, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 0.0f}, "eps must be > 0, got 0"},
      {{.kind = L2L_OPTIMIZER_LAMB, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = -1e-8f}, "eps must be > 0, got -1e-08"},
      {{.kind = L2L_OPTIMIZER_ADAMW, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = -0.01f}, "weight_decay must be in [0, inf), got -0.01"},
      {{.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .weight_decay = INFINITY}, "weight_decay must be finite"},
      {{.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .decay_all = 2}, "decay_all must be 0 or 1, got 2"},
      {{.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .beta1 = NAN}, "beta1 must be finite, got nan"}, /* unused, still garbage */
      {{.kind = L2L_OPTIMIZER_ADAMW, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = NAN}, "eps must be finite"},
      {{.kind = L2L_OPTIMIZER_ADAMW, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .momentum = -INFINITY}, "momentum must be finite, got -inf"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (!CHECK_FAILS(optimizer_check(&bad[i].c), L2L_ERR_INVALID, bad[i].needle))
      fprintf(stderr, "    (case %zu)\n", i);
    CHECK(strstr(l2l_last_error(), "optimizer") != NULL, "message names the optimizer: %s",
          l2l_last_error());
  }
}

TEST(optim_state_count) {
  l2l_optimizer_config c = {.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f};
  CHECK(optim_state_count(&c) == 0, "plain SGD keeps no state");
  c.momentum = 0.9f;
  CHECK(optim_state_count(&c) == 1, "SGD with momentum keeps its buffer");
  c.kind = L2L_OPTIMIZER_ADAMW;
  CHECK(optim_state_count(&c) == 2, "AdamW keeps m and v");
  c.kind = L2L_OPTIMIZER_LAMB;
  CHECK(optim_state_count(&c) == 2, "LAMB keeps m and v");
}
