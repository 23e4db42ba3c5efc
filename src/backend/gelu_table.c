/* SPDX-License-Identifier: MIT */
/* gelu_table.c — GELU's slope from its output: the tables both backends read in the
 * memory-frugal backward (cpu/layer_ops.c's loop; the GPU's kernel, kernels/gelu.cu, gets
 * a copy on each device).
 *
 * Purpose: GELU is not monotonic: y = gelu(x) has its minimum Y_MIN at X_MIN, so y alone
 * does not give x; one bit per element (x >= X_MIN) picks the branch. The backward reads
 * gelu' off tables of gelu'(x(y)) on each branch, interpolated linearly, in variables in
 * which it is smooth:
 * - t = sqrt(y - Y_MIN) on the right branch (y up to GELU_Y_RIGHT, beyond which gelu' is
 *   1 in float) and on the left branch down to x = GELU_X_LEFT: near the minimum
 *   y - Y_MIN grows as (x - X_MIN)^2, so x and gelu' are smooth in t, not in y;
 * - w = ln(-y) further left (x from GELU_X_LEFT to GELU_X_FAR), where y -> 0-
 *   exponentially and gelu' with it; left of GELU_X_FAR |gelu'| < 1e-26.
 * The tables are computed once, in float64, by bisection on gelu itself. GELU_TABLE points
 * each keep gelu' within 3e-7 of its float64 value at the input x everywhere except
 * within ~0.05 of the minimum, where the float rounding of y itself limits any method to
 * about sqrt(2 gelu''(X_MIN) ulp(y)) ~ 1e-4 (densely tested over [-40, 40] in
 * spec/c/backend/test_frugal_gelu.c). They replaced four Newton steps per element, each
 * with an exp, a log, a square root and two divisions: on the CPU the block's frugal
 * backward spent 15 % of its time there, and on an H200 the GPU's Newton kernel ran at
 * 0.21 of the copy rate (6.2 ms of a 124M step), bound by its arithmetic.
 * Must never: change a table once built (the GPU's copies are made from it once).
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>

#include "backend.h"

#define GELU_X_LEFT (-3.0)
#define GELU_X_FAR (-9.0)
#define GELU_Y_RIGHT 10.0

static struct gelu_slopes tables;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static double gelu64(double x) {
  double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return x / (1.0 + exp(-2.0 * u));
}

static double gelu_slope64(double x) {
  double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  double du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
  double s = 1.0 / (1.0 + exp(-2.0 * u));
  return s + x * 2.0 * du * s * (1.0 - s);
}

/* The x on one side of the minimum with gelu(x) = y, by bisection (gelu is monotonic on
   each side). */
static double gelu_inverse64(double y, double x_min, bool right) {
  double lo = right ? x_min : -60.0, hi = right ? 60.0 : x_min;
  for (int i = 0; i < 80; i++) {
    double mid = 0.5 * (lo + hi);
    if ((gelu64(mid) < y) == right) lo = mid;
    else hi = mid;
  }
  return 0.5 * (lo + hi);
}

static void tables_build(void) {
  double lo = -1.0, hi = -0.5; /* the minimum: where gelu' changes sign */
  for (int i = 0; i < 80; i++) {
    double mid = 0.5 * (lo + hi);
    if (gelu_slope64(mid) < 0.0) lo = mid;
    else hi = mid;
  }
  const double x_min = lo, y_min = gelu64(lo), y_left = gelu64(GELU_X_LEFT);
  const double t_right = sqrt(GELU_Y_RIGHT - y_min), t_left = sqrt(y_left - y_min);
  const double w_far = log(-gelu64(GELU_X_FAR)), w_left = log(-y_left);
  const double step[3] = {t_right / (GELU_TABLE - 1), t_left / (GELU_TABLE - 1),
                          (w_left - w_far) / (GELU_TABLE - 1)};
  for (int i = 0; i < GELU_TABLE; i++) {
    double t_r = step[0] * i, t_l = step[1] * i, w = w_far + step[2] * i;
    tables.slope[0][i] = (float)gelu_slope64(gelu_inverse64(y_min + t_r * t_r, x_min, true));
    tables.slope[1][i] = (float)gelu_slope64(gelu_inverse64(y_min + t_l * t_l, x_min, false));
    tables.slope[2][i] = (float)gelu_slope64(gelu_inverse64(-exp(w), x_min, false));
  }
  for (int k = 0; k < 3; k++) tables.scale[k] = (float)(1.0 / step[k]);
  tables.origin[0] = tables.origin[1] = 0.0f;
  tables.origin[2] = (float)w_far;
  tables.y_left = (float)y_left;
}

const struct gelu_slopes *gelu_slopes(void) {
  pthread_once(&tables_once, tables_build);
  return &tables;
}
