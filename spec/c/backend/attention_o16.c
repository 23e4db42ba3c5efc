/* SPDX-License-Identifier: MIT */
/* attention_o16.c — attention_o16_check (attention_o16.h): a backend's attention with o in
 * 16 bits against the same backend with o in f32.
 *
 * Purpose: the block keeps attention's output in 16 bits on a 16-bit run; the backends
 * promise that this changes nothing but o's own rounding. Each case draws its shape
 * (sequences across the CPU's 64-row tiles, one to three heads of 8 to 64), causal or not,
 * the 16-bit dtype and o's row stride; outputs are poisoned first, and o's padding must
 * stay poisoned.
 * Must never: hold o16 to anything but the f32 run's o rounded by the dtype's own rule.
 */
#include "attention_o16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"

/* A tensor of `pool` holding host floats h (n), or poisoned: NaN (f32) or 0xffff (16). */
static l2l_tensor *on_pool(l2l_pool_kind pool, l2l_dtype dtype, int64_t n, const float *h) {
  l2l_tensor *host = check_tensor(L2L_POOL_HOST, dtype, DIMS(n));
  if (dtype == L2L_F32) {
    float *d = l2l_tensor_data(host);
    for (int64_t i = 0; i < n; i++) d[i] = h != NULL ? h[i] : NAN;
  } else {
    memset(l2l_tensor_data(host), 0xff, (size_t)n * 2);
  }
  l2l_tensor *t = check_tensor(pool, dtype, DIMS(n));
  CHECK_OK(l2l_tensor_copy(t, host));
  l2l_tensor_free(host);
  return t;
}

/* t's bytes on the host (a copy; freed by the caller). */
static l2l_tensor *back(const l2l_tensor *t) {
  l2l_tensor *h = check_tensor(L2L_POOL_HOST, l2l_tensor_dtype(t), DIMS(l2l_tensor_numel(t)));
  CHECK_OK(l2l_tensor_copy(h, t));
  return h;
}

static float *randn(int64_t n) {
  float *v = xmalloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = (float)check_rand_normal();
  return v;
}

static bool same_bits(const char *what, const l2l_tensor *a, const l2l_tensor *b) {
  l2l_tensor *x = back(a), *y = back(b);
  size_t bytes = (size_t)l2l_tensor_numel(x) * (l2l_tensor_dtype(x) == L2L_F32 ? 4 : 2);
  bool ok = CHECK(memcmp(l2l_tensor_data(x), l2l_tensor_data(y), bytes) == 0,
                  "%s: not the same bits", what);
  l2l_tensor_free(x), l2l_tensor_free(y);
  return ok;
}

bool attention_o16_check(l2l_pool_kind pool, l2l_dtype products, bool standard,
                         bool exact_backward) {
  const struct backend_ops *ops = backend_for(pool);
  /* o in the products' dtype where they are 16-bit (as the block keeps it), else drawn */
  const l2l_dtype dt = products != L2L_F32 ? products : check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  const int64_t B = check_rand_int(1, 2), H = check_rand_int(1, 3), hd = 8 * check_rand_int(1, 8);
  const int64_t S = check_rand_int(1, 80), D = H * hd, N = B * S, rows = B * H * S;
  const int64_t ld_o = D + (check_rand_int(0, 1) ? 8 : 0);
  struct backend_attention_shape sh = {
      .batch = B, .heads = H, .seq = S, .head_dim = hd, .ld_qkv = 3 * D, .ld_o = ld_o,
      .causal = (int)check_rand_int(0, 1), .scale = 1.0f / sqrtf((float)hd),
      .seed = check_rand_u64(), .stream = check_rand_u64(), .precision = products};
  struct backend_attention_shape sh16 = sh;
  sh16.o_dtype = dt;
  char what[200];
  snprintf(what, sizeof what, "attention %s B=%lld H=%lld S=%lld hd=%lld ld_o=%lld%s, o %s, "
           "products %s", standard ? "standard" : "frugal", (long long)B, (long long)H,
           (long long)S, (long long)hd, (long long)ld_o, sh.causal ? " causal" : "",
           l2l_dtype_name(dt), l2l_dtype_name(products));

  float *h_qkv = randn(N * 3 * D), *h_do = randn(N * ld_o);
  l2l_tensor *qkv = on_pool(pool, L2L_F32, N * 3 * D, h_qkv);
  l2l_tensor *d_o = on_pool(pool, L2L_F32, N * ld_o, h_do);
  l2l_tensor *o32 = on_pool(pool, L2L_F32, N * ld_o, NULL), *o16 = on_pool(pool, dt, N * ld_o, NULL);
  l2l_tensor *lse32 = on_pool(pool, L2L_F32, rows, NULL), *lse16 = on_pool(pool, L2L_F32, rows, NULL);
  l2l_tensor *p32 = NULL, *p16 = NULL;
  if (standard) p32 = on_pool(pool, L2L_F32, rows * S, NULL), p16 = on_pool(pool, L2L_F32, rows * S, NULL);
  int64_t wf = ops->attention_workspace(S, hd, 1) * l2l_get_threads();
  if (ops->attention_workspace(S, hd, 0) * l2l_get_threads() > wf)
    wf = ops->attention_workspace(S, hd, 0) * l2l_get_threads();
  l2l_tensor *work = wf > 0 ? on_pool(pool, L2L_F32, wf, NULL) : NULL;
  float *w = work ? l2l_tensor_data(work) : NULL;
  const float *q = l2l_tensor_data(qkv);
#define DATA(t) ((t) != NULL ? l2l_tensor_data(t) : NULL)
  bool ok = CHECK_OK(ops->attention_forward(DATA(o32), DATA(lse32), DATA(p32), NULL, NULL, q,
                                            q + D, q + 2 * D, NULL, &sh, w, wf));
  ok &= CHECK_OK(ops->attention_forward(DATA(o16), DATA(lse16), DATA(p16), NULL, NULL, q, q + D,
                                        q + 2 * D, NULL, &sh16, w, wf));
  ok &= CHECK_OK(l2l_device_synchronize());

  /* o16: each element of the heads' width the f32 o rounded, the padding untouched */
  l2l_tensor *a = back(o32), *b = back(o16);
  const float *fa = l2l_tensor_data(a);
  const uint16_t *hb = l2l_tensor_data(b);
  int64_t bad = 0, first = -1;
  for (int64_t r = 0; r < N; r++)
    for (int64_t c = 0; c < ld_o; c++) {
      int64_t i = r * ld_o + c;
      uint16_t want = c >= D ? 0xffff : dt == L2L_BF16 ? half_from_f32_bf16(fa[i]) : half_from_f32_f16(fa[i]);
      if (hb[i] != want && bad++ == 0) first = i;
    }
  ok &= CHECK(bad == 0, "%s: %lld elements of o16 are not the f32 o rounded (the first at %lld: "
              "%04x, want the rounding of %.9g)", what, (long long)bad, (long long)first,
              first >= 0 ? hb[first] : 0, first >= 0 ? (double)fa[first] : 0.0);
  snprintf(what + strlen(what), sizeof what - strlen(what), ": ");
  char label[260];
  snprintf(label, sizeof label, "%slse", what);
  ok &= same_bits(label, lse32, lse16);
  if (standard) {
    snprintf(label, sizeof label, "%sprobabilities", what);
    ok &= same_bits(label, p32, p16);
  }

  /* backward from o16 against backward from its widened copy (f32, the same padding) */
  float *widened = xmalloc((size_t)(N * ld_o) * sizeof *widened);
  for (int64_t i = 0; i < N * ld_o; i++)
    widened[i] = dt == L2L_BF16 ? half_bf16_to_f32(hb[i]) : half_f16_to_f32(hb[i]);
  l2l_tensor *ow = on_pool(pool, L2L_F32, N * ld_o, widened);
  l2l_tensor *g32 = on_pool(pool, L2L_F32, N * 3 * D, NULL), *g16 = on_pool(pool, L2L_F32, N * 3 * D, NULL);
  float *ga = l2l_tensor_data(g32), *gb = l2l_tensor_data(g16);
  ok &= CHECK_OK(ops->attention_backward(ga, ga + D, ga + 2 * D, l2l_tensor_data(d_o), DATA(ow),
                                         DATA(lse32), DATA(p32), NULL, NULL, q, q + D, q + 2 * D,
                                         NULL, &sh, w, wf));
  ok &= CHECK_OK(ops->attention_backward(gb, gb + D, gb + 2 * D, l2l_tensor_data(d_o), DATA(o16),
                                         DATA(lse32), DATA(p32), NULL, NULL, q, q + D, q + 2 * D,
                                         NULL, &sh16, w, wf));
  ok &= CHECK_OK(l2l_device_synchronize());
#undef DATA
  snprintf(label, sizeof label, "%sdq, dk, dv", what);
  if (exact_backward) {
    ok &= same_bits(label, g32, g16);
  } else {
    l2l_tensor *x = back(g32), *y = back(g16);
    const float *fx = l2l_tensor_data(x), *fy = l2l_tensor_data(y);
    /* a backend that writes them in 16-bit products' dtype (cuDNN) rounds the sums' last
       bits to it: two of its ulps of an element on top */
    const double ulps = products == L2L_BF16 ? 0x1p-7 : products == L2L_F16 ? 0x1p-10 : 0.0;
    double scale = 0.0;
    int64_t apart = 0;
    for (int64_t i = 0; i < N * 3 * D; i++) scale += (double)fx[i] * fx[i];
    scale = sqrt(scale / (double)(N * 3 * D));
    for (int64_t i = 0; i < N * 3 * D; i++)
      apart += !(fabs((double)fx[i] - fy[i]) <= 1e-5 * scale + ulps * fabs((double)fx[i]));
    ok &= CHECK(apart == 0, "%s: %lld elements more than 1e-5 of their scale %.3g (and two "
                "16-bit ulps) apart", label, (long long)apart, scale);
    l2l_tensor_free(x), l2l_tensor_free(y);
  }
  l2l_tensor *all[] = {qkv, d_o, o32, o16, lse32, lse16, p32, p16, work, a, b, ow, g32, g16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) l2l_tensor_free(all[i]);
  free(h_qkv), free(h_do), free(widened);
  return ok;
}
