/* SPDX-License-Identifier: MIT */
/* test_frugal_gelu.c — the memory-frugal GELU backward over its whole input range.
 *
 * Purpose: GELU' recovered from the output y and one side bit must match GELU' of the
 * original input everywhere, not at a few points: Tempo's published fit has a sign error
 * on one branch (0.98 < y < 3) that only a dense sweep finds. The CPU backend's entries
 * are called directly (white box: the layers reach them only through a block), over every
 * float step of 2^-16 in [-40, 40] plus a random jitter, and at the extremes.
 * Bounds: 3e-6 of GELU' (one ulp of y moves x by ulp/GELU'; a few float ulps of the
 * forward's own rounding), except within 0.05 of the minimum x_min, where y's rounding
 * (ulp(0.17) ~ 1.5e-8) leaves x uncertain by sqrt(2 dy / GELU''(x_min)) and GELU' by
 * ~1.4e-4: there 4e-4 is allowed, but the sign must be right once |x - x_min| > 2e-3.
 * Must never: compare the frugal path with the standard one only (both could be wrong):
 * the reference is GELU' in float64, written here.
 */
#include <stdlib.h>

#include "backend/backend.h"
#include "check.h"
#include "reference.h"

static double gelu_slope(double x) {
  const double k = 0.7978845608028654, a = 0.044715;
  double t = tanh(k * (x + a * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * a * x * x);
}

TEST(frugal_gelu_slope_matches_float64_over_the_whole_range) {
  const double x_min = -0.75246142, step = 1.0 / 65536;
  const int64_t n = (int64_t)(80.0 / step) + 16;
  float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
  float *dy = malloc((size_t)n * sizeof *dy), *dx = malloc((size_t)n * sizeof *dx);
  uint8_t *bits = malloc((size_t)(n + 7) / 8);
  if (!CHECK(x && y && dy && dx && bits, "out of memory")) goto done;
  for (int64_t i = 0; i < n - 16; i++)
    x[i] = (float)(-40.0 + (double)i * step + check_rand_uniform(0.0, step));
  const float extremes[16] = {-1e4f, -300.f, -87.f, -60.f, -41.f, 41.f, 100.f, 1e4f,
                              (float)x_min, nextafterf((float)x_min, 0.f),
                              nextafterf((float)x_min, -1.f), 0.f, -0.f, 1e-30f, -1e-30f, 3.f};
  for (int i = 0; i < 16; i++) x[n - 16 + i] = extremes[i];
  for (int64_t i = 0; i < n; i++) dy[i] = 1.0f, dx[i] = NAN;
  CHECK_OK(cpu_backend.gelu_forward_bits(y, bits, x, n));
  CHECK_OK(cpu_backend.gelu_backward_from_output(dx, NULL, L2L_F32, dy, y, bits, n));
  int64_t bad = 0, worst = 0;
  double worst_excess = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    double want = gelu_slope(x[i]), near = fabs(x[i] - x_min);
    double bound = near < 0.05 ? 4e-4 : 3e-6 * (1.0 + fabs(want));
    double excess = fabs((double)dx[i] - want) - bound;
    bool wrong_sign = near > 2e-3 && (dx[i] > 0) != (want > 0) && fabs(want) > 1e-6;
    if (!(excess <= 0.0) || wrong_sign) bad++;
    if (!(excess <= worst_excess)) worst_excess = excess, worst = i;
  }
  CHECK(bad == 0, "%lld of %lld slopes outside the bound; worst at x = %.9g: got %.9g, "
        "float64 %.9g", (long long)bad, (long long)n, (double)x[worst], (double)dx[worst],
        gelu_slope(x[worst]));
  /* the side bits are the branch of each input */
  int64_t wrong_bits = 0;
  for (int64_t i = 0; i < n; i++)
    wrong_bits += ((bits[i >> 3] >> (i & 7)) & 1) != (x[i] >= L2L_GELU_XMIN);
  CHECK(wrong_bits == 0, "%lld side bits wrong", (long long)wrong_bits);
done:
  free(x), free(y), free(dy), free(dx), free(bits);
}
