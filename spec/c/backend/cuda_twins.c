/* SPDX-License-Identifier: MIT */
/* cuda_twins.c — the GPU tests' harness (cuda_twins.h): tensors for both sides, twins,
 * the comparisons of a device result brought back with the host's, and the device pool
 * switched to CUDA for one test, with every entry of its ops table checked present.
 * Must never: read a device tensor's memory on the CPU, or leave the device pool on CUDA
 * after end_gpu.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_twins.h"
#include "kernels/optim.h"

l2l_tensor *poisoned(l2l_tensor *t) {
  check_poison(t);
  return t;
}

float *host_floats(int64_t n, float fill) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  for (int64_t i = 0; i < n; i++) p[i] = fill;
  return p;
}

float *host_normals(int64_t n, double scale) {
  float *p = host_floats(n, 0.0f);
  for (int64_t i = 0; i < n; i++) p[i] = (float)(scale * check_rand_normal());
  return p;
}

struct host_buf host_poisoned(int64_t n, size_t size, int64_t shift) {
  struct host_buf b = {xmalloc((size_t)(n + 1) * size), NULL};
  memset(b.base, 0xff, (size_t)(n + 1) * size);
  b.at = b.base + shift * (int64_t)size;
  return b;
}

bool padding_kept(const char *what, const void *x, bool half, int64_t rows, int64_t cols,
                  int64_t ld) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = cols; c < ld; c++) {
      const int64_t i = r * ld + c;
      bad += half ? ((const uint16_t *)x)[i] != 0xffff : !isnan(((const float *)x)[i]);
    }
  return CHECK(bad == 0, "%s: %lld padding elements written", what, (long long)bad);
}

/* A sign-and-magnitude code (the sign the bit above `bits` magnitude bits) as an integer
   in value order (+0 and -0 both 0). */
static int signed_magnitude(unsigned code, int bits) {
  int magnitude = (int)(code & ((1u << bits) - 1));
  return code >> bits & 1 ? -magnitude : magnitude;
}

/* A bf16's value. */
static float bf16_value(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

bool state_neighbours(const uint8_t *a, const uint8_t *b, int64_t n, l2l_state_precision state,
                      enum optim_code code, const char *what) {
  float most = 0.0f;   /* (bf16: the array's largest magnitude) */
  for (int64_t i = 0; state == L2L_STATE_BF16 && i < n; i++) {
    uint16_t h;
    memcpy(&h, a + 2 * i, 2);
    most = fabsf(bf16_value(h)) > most ? fabsf(bf16_value(h)) : most;
  }
  if (state == L2L_STATE_F32) {
    const float *fa = (const float *)a, *fb = (const float *)b;
    for (int64_t i = 0; i < n; i++) most = fabsf(fa[i]) > most ? fabsf(fa[i]) : most;
    for (int64_t i = 0; i < n; i++)
      if (!CHECK(fabsf(fa[i] - fb[i]) <= TOL_F32 * most, "%s: element %lld: %g (host), %g "
                 "(device)", what, (long long)i, (double)fa[i], (double)fb[i]))
        return false;
    return true;
  }
  int64_t moved = 0;   /* (codes that differ, cancelled values aside) */
  for (int64_t i = 0; i < n; i++) {
    int x, y;   /* each code in value order (bf16 and the signed code: sign and magnitude) */
    if (state == L2L_STATE_BF16) {
      uint16_t hx, hy;
      memcpy(&hx, a + 2 * i, 2), memcpy(&hy, b + 2 * i, 2);
      x = signed_magnitude(hx, 15), y = signed_magnitude(hy, 15);
      if (fabsf(bf16_value(hx) - bf16_value(hy)) <= TOL_F32 * most) continue;   /* (cancelled) */
    } else if (code == OPTIM_CODE_SIGNED) {
      x = signed_magnitude(a[i], 7), y = signed_magnitude(b[i], 7);
    } else {
      x = a[i], y = b[i];
    }
    if (!CHECK(abs(x - y) <= 1, "%s: element %lld: codes %d (host) and %d (device)", what,
               (long long)i, x, y))
      return false;
    moved += x != y;
  }
  if (!CHECK(moved <= 1 + n / 1024, "%s: %lld of %lld codes a neighbour apart, want at most "
             "%lld", what, (long long)moved, (long long)n, (long long)(1 + n / 1024)))
    return false;
  if (state != L2L_STATE_8BIT) return true;
  const float *sa = optim_state_scales((void *)a, n), *sb = optim_state_scales((void *)b, n);
  for (int64_t k = 0; k < state8_blocks(n); k++)
    if (!CHECK(fabsf(sa[k] - sb[k]) <= TOL_F32 * fabsf(sa[k]), "%s: block %lld: scale %g (host), "
               "%g (device)", what, (long long)k, (double)sa[k], (double)sb[k]))
      return false;
  return true;
}

bool lamb_master_close(const char *what, const float *got, const float *want, const float *p0,
                       void *const s_got[2], void *const s_want[2], int64_t n,
                       const struct optim_hyper *h) {
  struct k_optim o;
  optim_kernel_consts(&o, h);
  float *state[2][2]; /* [side][array], decoded */
  for (int side = 0; side < 2; side++)
    for (int a = 0; a < 2; a++) {
      state[side][a] = host_floats(n, 0.0f);
      optim_state_decode(state[side][a], side ? s_got[a] : s_want[a], n, 0, n, h->state,
                         optim_state_code(h->kind, a));
    }
  double *r[2] = {xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double)),
                  xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double))};
  double step_r = 0, rr = 0; /* the least-squares trust: sum (p0 - want) r / lr sum r^2 */
  for (int side = 0; side < 2; side++)
    for (int64_t i = 0; i < n; i++)
      r[side][i] = (double)o.step * state[side][0][i] /
                       (sqrt((double)state[side][1][i]) * o.rsb2 + o.eps) + (double)o.wd * p0[i];
  for (int64_t i = 0; i < n; i++)
    step_r += ((double)p0[i] - want[i]) * r[0][i], rr += r[0][i] * r[0][i];
  const double trust = rr > 0 ? step_r / ((double)h->lr * rr) : 0.0;
  float *expected = host_floats(n, 0.0f);
  for (int64_t i = 0; i < n; i++) expected[i] = (float)(p0[i] - (double)h->lr * trust * r[1][i]);
  bool ok = compare_at(__FILE__, __LINE__, what, got, expected, 1, n, n, RMS, TOL_F32);
  for (int side = 0; side < 2; side++) free(state[side][0]), free(state[side][1]), free(r[side]);
  free(expected);
  return ok;
}

bool kept_bits_match(const char *what, const uint8_t *got, const uint8_t *want, int64_t rows,
                     int64_t S, int causal) {
  int64_t row_bytes = (S + 7) / 8, bad = 0, bad_row = -1, bad_key = -1;
  for (int64_t r = 0; r < rows; r++) {
    int64_t i = r % S, end = causal ? i + 1 : S;
    for (int64_t j = 0; j < end; j++) {
      int gb = (got[r * row_bytes + j / 8] >> (j % 8)) & 1, wb = (want[r * row_bytes + j / 8] >> (j % 8)) & 1;
      if (gb != wb && bad++ == 0) bad_row = r, bad_key = j;
    }
  }
  return CHECK(bad == 0, "%s: %lld kept bits differ, first at row %lld, key %lld", what,
               (long long)bad, (long long)bad_row, (long long)bad_key);
}

bool rounded16_at(const char *file, int line, const char *what, const uint16_t *got,
                  const float *f32, int64_t rows, int64_t cols, int64_t ld, l2l_dtype t) {
  int64_t bad = 0, first = -1;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      const int64_t i = r * ld + c;
      if (got[i] != round16(f32[i], t)) bad++, first = first < 0 ? i : first;
    }
  if (bad == 0) return true;
  return check_that(false, file, line, what,
                    "%lld of %lld 16-bit values (%s) not their f32 values rounded, first at [%lld]: "
                    "%#x, want %#x (of %.9g)", (long long)bad, (long long)(rows * cols),
                    l2l_dtype_name(t), (long long)first, got[first], round16(f32[first], t),
                    (double)f32[first]);
}

/* A host u8 tensor of n bytes, all `value`. */
l2l_tensor *bytes_of(int64_t n, uint8_t value) {
  l2l_tensor *t = HOST(L2L_U8, n);
  memset(l2l_tensor_data(t), value, (size_t)n);
  return t;
}

/* A copy of t in `pool` (a transfer when the pools differ). */
l2l_tensor *copied_to(const l2l_tensor *t, l2l_pool_kind pool) {
  l2l_tensor *c = like_in(t, pool);
  CHECK_OK(l2l_tensor_copy(c, t));
  return c;
}

/* A host tensor of `dtype` holding t's values as the host's l2l_tensor_cast rounds them. */
l2l_tensor *cast_on_host(const l2l_tensor *t, l2l_dtype dtype) {
  int64_t shape[L2L_MAX_DIMS];
  int nd = l2l_tensor_ndim(t);
  for (int i = 0; i < nd; i++) shape[i] = l2l_tensor_dim(t, i);
  l2l_tensor *c = check_tensor(L2L_POOL_HOST, dtype, nd, shape);
  CHECK_OK(l2l_tensor_cast(c, t));
  return c;
}

const char *dims_str(char *buf, size_t len, const l2l_tensor *t) {
  int used = snprintf(buf, len, "(");
  for (int i = 0; i < l2l_tensor_ndim(t) && used > 0 && (size_t)used < len; i++)
    used += snprintf(buf + used, len - (size_t)used, i ? ",%lld" : "%lld",
                     (long long)l2l_tensor_dim(t, i));
  if (used > 0 && (size_t)used < len) snprintf(buf + used, len - (size_t)used, ")");
  return buf;
}

l2l_pool_stats device_stats(void) {
  l2l_pool_stats s;
  memset(&s, 0, sizeof s);
  CHECK_OK(l2l_pool_get_stats(&s, L2L_POOL_DEVICE));
  return s;
}

/* Takes h; the device side is a copy of it. A NULL h gives a NULL twin. */
struct twin twin_of(l2l_tensor *h) {
  return pair(h, h ? copied_to(h, L2L_POOL_DEVICE) : NULL);
}
void twin_free_list(struct twin *const *ts, size_t n) {
  for (size_t i = 0; i < n; i++) {
    l2l_tensor_free(ts[i]->h);
    l2l_tensor_free(ts[i]->d);
    ts[i]->h = ts[i]->d = NULL;
  }
}

/* A call on one side that must fail with `want` and a message containing `needle`. */
bool fails_on(int side, l2l_status got, l2l_status want, const char *needle,
              const char *file, int line, const char *expr) {
  const char *msg = l2l_last_error();
  bool ok = got == want && strstr(msg, needle) != NULL;
  return check_that(ok, file, line, expr,
                    "on the %s: want status %d with \"%s\", got %d: \"%s\"", SIDE_NAME, want,
                    needle, got, msg);
}

/* ---------------------------------------------------------------- comparisons */

/* The root mean square of the finite elements of a (rows, cols) matrix with row stride ld. */
double rms_of(const float *v, int64_t rows, int64_t cols, int64_t ld) {
  double sq = 0.0;
  int64_t finite = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      double w = v[r * ld + c];
      if (isfinite(w)) sq += w * w, finite++;
    }
  return finite > 0 ? sqrt(sq / (double)finite) : 0.0;
}
double rms_tensor(const l2l_tensor *t) { return rms_of(fdata(t), 1, numel(t), numel(t)); }

double cancelling_floor(const float *want, int64_t rows, int64_t cols, int64_t ld, double unit) {
  const double rms = rms_of(want, rows, cols, ld);
  return rms > fabs(unit) ? rms : fabs(unit);
}
double cancelling_floor_of(const l2l_tensor *want, double unit) {
  return cancelling_floor(fdata(want), 1, numel(want), numel(want), unit);
}

/* got against want, f32 matrices of (rows, cols) with row stride ld, both in host memory:
   the largest |got - want| / (|want| + floor) over finite elements of want must be at most
   tol; where want is not finite, got must be the same (NaN where NaN, the same infinity).
   floor < 0 means -floor times the rms of want's finite elements. */
bool compare_at(const char *file, int line, const char *what, const float *got,
                const float *want, int64_t rows, int64_t cols, int64_t ld, double floor,
                double tol) {
  if (floor < 0.0) floor = -floor * rms_of(want, rows, cols, ld);
  if (!(floor > 0.0)) floor = 1e-30; /* an all-zero reference: any difference shows */
  double worst = 0.0;
  int64_t worst_at = -1, mismatched = 0, first_mismatch = -1;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      int64_t i = r * ld + c;
      double g = got[i], w = want[i];
      if (!isfinite(w)) {
        bool same = isnan(w) ? isnan(g) : g == w;
        if (!same && mismatched++ == 0) first_mismatch = i;
        continue;
      }
      double e = isfinite(g) ? fabs(g - w) / (fabs(w) + floor) : INFINITY;
      if (worst_at < 0 || e > worst) worst = e, worst_at = i;
    }
  if (mismatched > 0)
    return check_that(false, file, line, what,
                      "%lld elements where the reference is not finite differ, first at [%lld]: "
                      "got %.9g, want %.9g", (long long)mismatched, (long long)first_mismatch,
                      (double)got[first_mismatch], (double)want[first_mismatch]);
  if (check_margin(file, line, what, worst, tol)) return true;
  return check_that(false, file, line, what,
                    "relative error %.3g > %.3g (floor %.3g), worst at [%lld] of (%lld x %lld): "
                    "got %.9g, want %.9g", worst, tol, floor, (long long)worst_at,
                    (long long)rows, (long long)cols, (double)got[worst_at],
                    (double)want[worst_at]);
}

/* The device side of an f32 twin, brought back, against its host side. */
bool twin_close_at(const char *file, int line, const char *what, struct twin t,
                   double floor, double tol) {
  if (!check_that(t.h && t.d && numel(t.h) == numel(t.d), file, line, what, "not a twin"))
    return false;
  l2l_tensor *back = copied_to(t.d, L2L_POOL_HOST);
  bool ok = compare_at(file, line, what, fdata(back), fdata(t.h), 1, numel(t.h), numel(t.h),
                       floor, tol);
  l2l_tensor_free(back);
  return ok;
}

/* Whether element bits (of size es: 2 or 4 bytes, a float dtype) are a NaN. */
static bool bits_are_nan(const uint8_t *p, size_t es, l2l_dtype dtype) {
  if (dtype == L2L_F32) {
    uint32_t u;
    memcpy(&u, p, 4);
    return (u & 0x7fffffffu) > 0x7f800000u;
  }
  if (es != 2) return false;
  uint16_t u;
  memcpy(&u, p, 2);
  if (dtype == L2L_F16) return (u & 0x7fffu) > 0x7c00u;
  if (dtype == L2L_BF16) return (u & 0x7fffu) > 0x7f80u;
  return false;
}

/* The device side's bytes against the host side's, element by element. nan_any: where
   the host holds a NaN, any NaN will do (its payload is not compared). */
bool twin_bits_at(const char *file, int line, const char *what, struct twin t,
                  bool nan_any) {
  if (!check_that(t.h && t.d && tensor_bytes(t.h) == tensor_bytes(t.d), file, line, what,
                  "not a twin"))
    return false;
  l2l_tensor *back = copied_to(t.d, L2L_POOL_HOST);
  const uint8_t *g = l2l_tensor_data(back), *w = l2l_tensor_data(t.h);
  size_t es = elem_size(t.h), bytes = tensor_bytes(t.h);
  l2l_dtype dtype = (l2l_dtype)l2l_tensor_dtype(t.h);
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < bytes; i += es) {
    if (memcmp(g + i, w + i, es) == 0) continue;
    if (nan_any && bits_are_nan(w + i, es, dtype) && bits_are_nan(g + i, es, dtype)) continue;
    if (differ++ == 0) first = (int64_t)(i / es);
  }
  uint64_t gb = 0, wb = 0;
  if (first >= 0) {
    memcpy(&gb, g + (size_t)first * es, es);
    memcpy(&wb, w + (size_t)first * es, es);
  }
  l2l_tensor_free(back);
  return check_that(differ == 0, file, line, what,
                    "%lld of %lld elements differ in their bits, first at [%lld]: got 0x%llx, "
                    "want 0x%llx", (long long)differ, (long long)(bytes / es), (long long)first,
                    (unsigned long long)gb, (unsigned long long)wb);
}

/* ---------------------------------------------------------------- inputs

   What more than one file's tests draw: inputs where an op is hard. */

/* x's first elements := the values GELU is hard at (as many as fit). */
void put_gelu_specials(l2l_tensor *x) {
  const float specials[] = {L2L_GELU_XMIN, nextafterf(L2L_GELU_XMIN, 0.0f),
                            nextafterf(L2L_GELU_XMIN, -1.0f), 0.0f, -0.0f, 10.0f, -10.0f,
                            30.0f, -30.0f, 87.0f, -87.0f, 1e-30f, -1e-30f, 3.0f, -3.0f};
  int64_t count = (int64_t)(sizeof specials / sizeof specials[0]);
  if (count > numel(x)) count = numel(x);
  for (int64_t i = 0; i < count; i++) fdata(x)[i] = specials[i];
}

/* x ~ 2 N(0,1) + 0.5 (a mean to subtract), weight 1 + 0.3 N, bias 0.3 N. */
void layernorm_inputs(l2l_tensor *x, l2l_tensor *w, l2l_tensor *b) {
  fill_normal(x, 2.0);
  for (int64_t i = 0; i < numel(x); i++) fdata(x)[i] += 0.5f;
  for (int64_t j = 0; j < numel(w); j++) {
    fdata(w)[j] = (float)(1.0 + 0.3 * check_rand_normal());
    fdata(b)[j] = (float)(0.3 * check_rand_normal());
  }
}

/* key_mask (B, tk): sample 0 all real, sample 2 (when there is one) all padding, the
   others real with probability 0.7 (at least one real key). */
l2l_tensor *random_key_mask(int64_t B, int64_t tk) {
  l2l_tensor *m = HOST(L2L_U8, B, tk);
  uint8_t *d = bdata(m);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t j = 0; j < tk; j++)
      d[b * tk + j] = b == 0 ? 1 : b == 2 ? 0 : (uint8_t)(check_rand_uniform(0, 1) < 0.7);
    if (b != 2) d[b * tk + check_rand_int(0, tk - 1)] = 1;
  }
  return m;
}

/* ---------------------------------------------------------------- the device for one test */

static bool dry_run(void) {
  const char *env = getenv("L2L_TEST_CUDA_DRY_RUN");
  return env != NULL && strcmp(env, "1") == 0;
}

/* Every entry of the device's ops table is there (a missing one would crash the run). */
static bool ops_complete(const struct backend_ops *ops) {
  const struct {
    const char *name;
    bool present;
  } entries[] = {
      {"gemm_batched", ops->gemm_batched != NULL},
      {"bias_add", ops->bias_add != NULL},
      {"bias_backward", ops->bias_backward != NULL},
      {"add", ops->add != NULL},
      {"gelu_forward", ops->gelu_forward != NULL},
      {"gelu_backward", ops->gelu_backward != NULL},
      {"layernorm_forward", ops->layernorm_forward != NULL},
      {"layernorm_backward", ops->layernorm_backward != NULL},
      {"softmax_forward", ops->softmax_forward != NULL},
      {"softmax_backward", ops->softmax_backward != NULL},
      {"embedding_forward", ops->embedding_forward != NULL},
      {"embedding_backward", ops->embedding_backward != NULL},
      {"cross_entropy_forward", ops->cross_entropy_forward != NULL},
      {"cross_entropy_backward", ops->cross_entropy_backward != NULL},
      {"dropout_forward", ops->dropout_forward != NULL},
      {"dropout_backward", ops->dropout_backward != NULL},
      {"gelu_forward_bits", ops->gelu_forward_bits != NULL},
      {"gelu_backward_from_output", ops->gelu_backward_from_output != NULL},
      {"layernorm_backward_from_output", ops->layernorm_backward_from_output != NULL},
      {"bias_gelu_forward", ops->bias_gelu_forward != NULL},
      {"add_layernorm_forward", ops->add_layernorm_forward != NULL},
      {"cross_entropy_fused", ops->cross_entropy_fused != NULL},
      {"attention_forward", ops->attention_forward != NULL},
      {"attention_backward", ops->attention_backward != NULL},
      {"attention_workspace", ops->attention_workspace != NULL},
      {"reduce", ops->reduce != NULL},
      {"adamw", ops->adamw != NULL},
      {"optim_update", ops->optim_update != NULL},
      {"grad_add", ops->grad_add != NULL},
      {"clip_scale", ops->clip_scale != NULL},
      {"grad_norm", ops->grad_norm != NULL},
      {"find_out_of_range", ops->find_out_of_range != NULL},
      {"fill", ops->fill != NULL},
      {"convert", ops->convert != NULL},
      {"convert_many", ops->convert_many != NULL},
      {"random", ops->random != NULL},
      {"copy", ops->copy != NULL},
  };
  bool ok = true;
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
    ok &= CHECK(entries[i].present, "the device backend's ops table has no %s entry",
                entries[i].name);
  return ok;
}

/* Serves the device pool from CUDA for one test. false: the test was marked skipped (no
   GPU) or failed, and must return right away (nothing to undo). */
bool use_gpu(void) {
  /* Let the device pool's first choice be made before l2l_device_use: core/device.c's
     l2l_device_use holds its choice lock while it reads the pool's stats, which make the
     first choice under the same lock when none was made yet (a self-deadlock when
     l2l_device_use is the process's first device call). */
  (void)l2l_device_backend();
  if (dry_run()) return CHECK_OK(l2l_device_use("cpu"));
  char why[512] = "";
  if (!l2l_cuda_available(why, sizeof why)) {
    check_skip("no GPU: %s", why[0] ? why : "(no reason given)");
    return false;
  }
  if (!CHECK_OK(l2l_device_use("cuda"))) return false;
  const struct backend_ops *ops = backend_for(L2L_POOL_DEVICE);
  bool ok = CHECK(strcmp(l2l_device_backend(), "cuda") == 0 && ops != NULL &&
                      ops != backend_for(L2L_POOL_HOST),
                  "after l2l_device_use(\"cuda\") the device pool is served by \"%s\"",
                  l2l_device_backend());
  ok = ok && ops_complete(ops);
  if (!ok) CHECK_OK(l2l_device_use("cpu"));
  return ok;
}

/* The end of a test that use_gpu() started: nothing left in the device pool, TF32 off,
   the device pool back on the CPU. */
void end_gpu(void) {
  l2l_pool_stats s = device_stats();
  CHECK(s.current == 0, "the test left %llu bytes of device tensors behind",
        (unsigned long long)s.current);
  CHECK_OK(l2l_cuda_set_tf32(0));
  CHECK_OK(l2l_device_use("cpu"));
}

/* For tests that exercise CUDA itself: skipped in a dry run. */
bool use_real_gpu(void) {
  if (dry_run()) {
    check_skip("L2L_TEST_CUDA_DRY_RUN=1: this test needs the CUDA backend itself");
    return false;
  }
  return use_gpu();
}

/* (cuda_twins.h) */
bool attention_close(const char *what, const float *got, const float *want,
                            int64_t rows, int64_t cols, int64_t ld, double floor,
                            l2l_dtype precision, enum attention_output kind) {
  if (precision == L2L_F32)
    return CHECK_COLS(what, got, want, rows, cols, ld, floor, TOL_ATTENTION);
  double scale = precision == L2L_F16 ? 0.25 : 1.0;
  bool ok = CHECK_COLS(what, got, want, rows, cols, ld, floor, scale * TOL_ATTN16_ELEMENT[kind]);
  double floor_abs = floor < 0.0 ? -floor * rms_of(want, rows, cols, ld) : floor;
  double se = 0.0, sw = 0.0;
  int64_t finite = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      double w = want[r * ld + c], g = got[r * ld + c];
      if (!isfinite(w)) continue;
      se += (g - w) * (g - w), sw += w * w, finite++;
    }
  double want_rms = finite > 0 ? sqrt(sw / (double)finite) : 0.0;
  double denom = want_rms > floor_abs ? want_rms : floor_abs;
  double e = finite > 0 ? sqrt(se / (double)finite) / (denom > 0.0 ? denom : 1e-30) : 0.0;
  double tol = scale * TOL_ATTN16_NORM[kind];
  ok &= CHECK_WITHIN(e, tol, what, "%s: normwise relative error %.3g > %.3g", what, e, tol);
  return ok;
}
