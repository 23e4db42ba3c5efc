/* SPDX-License-Identifier: MIT */
/* bench/master_rounding.c — bf16 masters: stochastic rounding against Kahan compensation
 * (issue 33's "try both, keep what holds the curve best per byte").
 *
 * What it measures: AdamW (the EPS's own kernel, optim_adamw) fitting a noisy linear
 * regression, y = x . w* + noise, D weights of magnitude about 1, a fresh minibatch each
 * step, a learning rate small enough that most updates are below half a bf16 ulp of the
 * weights (2^-8 of them): the regime where low-precision masters lose training. Each
 * variant keeps the same f32 moments and runs the same kernel on f32 weights decoded from
 * its master; they differ only in how the updated weights are stored:
 *   f32           4 bytes a weight (the reference)
 *   bf16 nearest  2 bytes: rounded to nearest even (updates below half an ulp vanish)
 *   bf16 SR       2 bytes: stochastic rounding, half_bf16_stochastic with Philox draws (the
 *                 relay's master = "bf16")
 *   bf16 Kahan    4 bytes: a bf16 weight and a bf16 compensation term holding what the last
 *                 rounding dropped (Zamirai et al. 2020)
 * Printed: the loss (mean squared error on a held-out batch) every STEPS/8 steps, and the
 * final distance of the weights from w*. Seeds fixed: the same numbers every run.
 * Run: make build/bench_master_rounding && build/bench_master_rounding
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eps/eps.h"

enum { D = 512, B = 32, STEPS = 40000, VARIANTS = 4 };
static const char *const NAMES[VARIANTS] = {"f32", "bf16 nearest", "bf16 SR", "bf16 Kahan"};
static const int BYTES[VARIANTS] = {4, 2, 2, 4};

/* xorshift, and a normal by Box-Muller: the data, the same for every variant */
static uint64_t rng_state = 88172645463325252ull;
static double uniform(void) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return ((rng_state >> 11) + 0.5) * 0x1p-53;
}
static double normal(void) { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

int main(void) {
  static float w_true[D], x[B][D], y[B], xt[B][D], yt[B];
  static float w[VARIANTS][D], m[VARIANTS][D], v[VARIANTS][D], g[D];
  static uint16_t hi[VARIANTS][D], comp[D];
  static uint32_t draws[D];
  for (int i = 0; i < D; i++) w_true[i] = (float)(1.0 + 0.5 * normal());
  for (int k = 0; k < VARIANTS; k++)
    for (int i = 0; i < D; i++) {
      w[k][i] = half_bf16_to_f32(half_from_f32_bf16(w_true[i] + 0.3f));   /* the same start */
      hi[k][i] = half_from_f32_bf16(w[k][i]);
    }
  for (int r = 0; r < B; r++) {   /* a held-out batch */
    yt[r] = 0;
    for (int i = 0; i < D; i++) xt[r][i] = (float)normal(), yt[r] += xt[r][i] * w_true[i];
  }
  struct optim_hyper h = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 2e-4f, .beta1 = 0.9f,
                              .beta2 = 0.999f, .eps = 1e-8f, .grad_scale = 1.0f};
  printf("AdamW, lr %g, %d weights, %d steps of %d samples; held-out MSE (noise floor %.4f)\n\n",
         (double)h.lr, D, STEPS, B, 0.01 * 0.01);
  printf("| step |");
  for (int k = 0; k < VARIANTS; k++) printf(" %s (%d B) |", NAMES[k], BYTES[k]);
  printf("\n|---:|");
  for (int k = 0; k < VARIANTS; k++) printf("---:|");
  printf("\n");
  for (int t = 1; t <= STEPS; t++) {
    for (int r = 0; r < B; r++) {
      y[r] = 0;
      for (int i = 0; i < D; i++) x[r][i] = (float)normal(), y[r] += x[r][i] * w_true[i];
      y[r] += (float)(0.01 * normal());
    }
    h.t = t;
    for (int k = 0; k < VARIANTS; k++) {
      float p[D], before[D];
      for (int i = 0; i < D; i++) p[i] = k == 0 ? w[k][i] : half_bf16_to_f32(hi[k][i]);
      memset(g, 0, sizeof g);
      for (int r = 0; r < B; r++) {
        double e = -y[r];
        for (int i = 0; i < D; i++) e += x[r][i] * p[i];
        for (int i = 0; i < D; i++) g[i] += (float)(2.0 * e * x[r][i] / B);
      }
      memcpy(before, p, sizeof p);
      optim_adamw(p, m[k], v[k], g, D, &h);
      if (k == 0) {
        memcpy(w[k], p, sizeof p);
      } else if (k == 1) {
        for (int i = 0; i < D; i++) hi[k][i] = half_from_f32_bf16(p[i]);
      } else if (k == 2) {
        philox_range(draws, 7, 1, (uint64_t)t * D, D);
        for (int i = 0; i < D; i++) hi[k][i] = half_bf16_stochastic(p[i], draws[i]);
      } else {   /* Kahan: add the update less what the last rounding dropped */
        for (int i = 0; i < D; i++) {
          float step = (p[i] - before[i]) - half_bf16_to_f32(comp[i]);
          float sum = before[i] + step;
          hi[k][i] = half_from_f32_bf16(sum);
          comp[i] = half_from_f32_bf16((half_bf16_to_f32(hi[k][i]) - before[i]) - step);
        }
      }
    }
    if (t % (STEPS / 8) == 0) {
      printf("| %d |", t);
      for (int k = 0; k < VARIANTS; k++) {
        double mse = 0;
        for (int r = 0; r < B; r++) {
          double e = -yt[r];
          for (int i = 0; i < D; i++) e += xt[r][i] * (k == 0 ? w[k][i] : half_bf16_to_f32(hi[k][i]));
          mse += e * e / B;
        }
        printf(" %.4g |", mse);
      }
      printf("\n");
    }
  }
  printf("\nDistance from w* at the end (root mean square):");
  for (int k = 0; k < VARIANTS; k++) {
    double d2 = 0;
    for (int i = 0; i < D; i++) {
      double e = (k == 0 ? w[k][i] : half_bf16_to_f32(hi[k][i])) - w_true[i];
      d2 += e * e / D;
    }
    printf(" %s %.3g%s", NAMES[k], sqrt(d2), k + 1 < VARIANTS ? "," : "\n");
  }
  return 0;
}
