/* SPDX-License-Identifier: MIT */
/* reference.c — the float64 references and small helpers the C tests share (see
 * reference.h).
 *
 * Purpose: each written once, so that every test file compares against the same
 * independent arithmetic and a fix to a helper reaches every test.
 * Must never: call l2l to compute an expected value (only to make and read tensors).
 */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double GELU_K = 0.79788456080286535588; /* sqrt(2/pi) */

/* ---------------------------------------------------------------- tensors and values */

int64_t numel(const l2l_tensor *t) { return l2l_tensor_numel(t); }

size_t tensor_bytes(const l2l_tensor *t) {
  return (size_t)numel(t) * l2l_dtype_size((l2l_dtype)l2l_tensor_dtype(t));
}

double *doubles(int64_t n) { return xmalloc((size_t)n * sizeof(double)); }

double *to_doubles(const float *src, int64_t n) {
  double *d = doubles(n);
  for (int64_t i = 0; i < n; i++) d[i] = src[i];
  return d;
}

/* The bytes of a tensor, to verify later that a refused call left it alone. */
void *snapshot(const l2l_tensor *t) {
  void *copy = xmalloc(tensor_bytes(t));
  memcpy(copy, l2l_tensor_data(t), tensor_bytes(t));
  return copy;
}

bool same_bytes(const l2l_tensor *t, const void *snap) {
  return memcmp(l2l_tensor_data(t), snap, tensor_bytes(t)) == 0;
}

l2l_pool_stats stats_of(l2l_pool_kind pool) {
  l2l_pool_stats s;
  memset(&s, 0, sizeof s);
  CHECK_OK(l2l_pool_get_stats(&s, pool));
  return s;
}

l2l_tensor *fill_normal(l2l_tensor *t, double scale) {
  float *d = check_data(t);
  for (int64_t i = 0; i < numel(t); i++) d[i] = (float)(scale * check_rand_normal());
  return t;
}

/* A new tensor of t's shape and dtype in `pool` (contents undefined). */
l2l_tensor *like_in(const l2l_tensor *t, l2l_pool_kind pool) {
  int64_t shape[L2L_MAX_DIMS];
  int nd = l2l_tensor_ndim(t);
  for (int i = 0; i < nd; i++) shape[i] = l2l_tensor_dim(t, i);
  return check_tensor(pool, (l2l_dtype)l2l_tensor_dtype(t), nd, shape);
}

l2l_tensor *random_ids(l2l_tensor *ids, int32_t lo, int32_t hi) {
  int32_t *d = l2l_tensor_data(ids);
  for (int64_t i = 0; i < numel(ids); i++) d[i] = (int32_t)check_rand_int(lo, hi);
  return ids;
}

/* Targets in [0, V) with about a quarter of the rows (at least one when rows > 1, never
   all) set to ignore_index. Returns the number of real rows. */
int64_t random_targets(l2l_tensor *targets, int32_t vocab, int32_t ignore_index) {
  int32_t *t = l2l_tensor_data(targets);
  int64_t rows = numel(targets), real = 0;
  for (int64_t r = 0; r < rows; r++) {
    bool ignore = rows > 1 && (r == 0 || check_rand_int(0, 3) == 0) && r != rows - 1;
    do t[r] = ignore ? ignore_index : (int32_t)check_rand_int(0, vocab - 1);
    while (!ignore && t[r] == ignore_index);
    real += !ignore;
  }
  return real;
}

/* A new tensor of t's shape, dtype and pool. */
l2l_tensor *like(const l2l_tensor *t) { return like_in(t, (l2l_pool_kind)l2l_tensor_pool(t)); }

/* ---------------------------------------------------------------- comparisons */

/* got vs want with check_rel_err; on failure, prints the worst element. */
bool close_at(const char *file, int line, const char *what, const float *got,
              const double *want, int64_t n, double floor, double tol) {
  if (!check_that(n > 0, file, line, what, "nothing to compare")) return false;
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(want[i]))
      return check_that(false, file, line, what, "reference not finite at [%lld]", (long long)i);
  double err = check_rel_err(got, want, n, floor);
  if (check_margin(file, line, what, err, tol)) return true;
  int64_t worst = 0;
  double worst_err = -1.0;
  for (int64_t i = 0; i < n; i++) {
    double e = isnan(got[i]) ? INFINITY : fabs((double)got[i] - want[i]) / (fabs(want[i]) + floor);
    if (e > worst_err) worst_err = e, worst = i;
  }
  return check_that(false, file, line, what,
                    "relative error %.3g > %.3g (floor %g), worst at [%lld] of %lld: got %.9g, "
                    "want %.9g",
                    err, tol, floor, (long long)worst, (long long)n, (double)got[worst],
                    want[worst]);
}

/* The last error names both pools. */
bool pools_named(const char *file, int line) {
  const char *msg = l2l_last_error();
  return check_that(strstr(msg, "host") != NULL && strstr(msg, "device") != NULL, file, line,
                    "pool mixing message", "should name the host and device pools: \"%s\"",
                    msg);
}

/* ---------------------------------------------------------------- float64 references */

/* GELU, tanh form, in double. */
double ref_gelu(double x) {
  return 0.5 * x * (1.0 + tanh(GELU_K * (x + 0.044715 * x * x * x)));
}

/* One step t in double, exactly as l2l.h states it (p on the right is the old p). */
void ref_adamw(double *p, double *m, double *v, const float *g, int64_t n,
               const l2l_adamw_config *c, int64_t t) {
  double b1 = c->beta1, b2 = c->beta2, lr = c->lr, eps = c->eps, wd = c->weight_decay;
  double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
  for (int64_t i = 0; i < n; i++) {
    m[i] = b1 * m[i] + (1.0 - b1) * g[i];
    v[i] = b2 * v[i] + (1.0 - b2) * (double)g[i] * g[i];
    p[i] -= lr * ((m[i] / bc1) / (sqrt(v[i] / bc2) + eps) + wd * p[i]);
  }
}

/* ---------------------------------------------------------------- layers */

l2l_layer_config default_layer_config(l2l_layer_kind kind) {
  l2l_layer_config c;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.bias = 1;
  c.eps = 1e-5f;
  c.memory = L2L_MEMORY_STANDARD;
  c.init_std = 0.02f;
  c.resid_std = 0.01f;
  c.init_seed = check_rand_u64();
  return c;
}

void randomize_params_with(l2l_layer *layer, double vector_std, double table_std) {
  l2l_layer_config c;
  CHECK_OK(l2l_layer_get_config(&c, layer));
  for (int i = 0; i < l2l_layer_param_count(layer); i++) {
    l2l_param *p = l2l_layer_param(layer, i);
    l2l_tensor *v = l2l_param_value(p);
    const char *name = l2l_param_name(p);
    if (v == NULL || name == NULL) continue; /* the caller's checks report what is missing */
    float *d = check_data(v);
    if (l2l_tensor_ndim(v) == 1) {
      double base = starts_with(name, "ln") && ends_with(name, "weight") ? 1.0 : 0.0;
      for (int64_t k = 0; k < numel(v); k++)
        d[k] = (float)(base + vector_std * check_rand_normal());
    } else if (c.kind == L2L_LAYER_EMBEDDING) {
      fill_normal(v, table_std);
    } else {
      /* y = x @ W for (in, out) weights; the LM head's (V, D) is used transposed. */
      int64_t fan_in = l2l_tensor_dim(v, c.kind == L2L_LAYER_LM_HEAD ? 1 : 0);
      fill_normal(v, 1.0 / sqrt((double)fan_in));
    }
  }
}

void randomize_params(l2l_layer *layer) { randomize_params_with(layer, 0.3, 0.7); }
