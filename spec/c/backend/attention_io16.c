/* SPDX-License-Identifier: MIT */
/* attention_io16.c — attention_io16_check (attention_io16.h): a backend's attention with
 * q, k, v, o and dq, dk, dv in 16 bits against the same backend with their f32 copies.
 *
 * Purpose: the block keeps attention's inputs, output and input gradients in 16 bits on a
 * 16-bit run; the backends promise that this changes nothing but the outputs' own
 * rounding. Each case draws its shape (sequences across the CPU's 64-row tiles, one to
 * three heads of 8 to 64), causal or not, which of q, k, v, o and dq, dk, dv are 16-bit,
 * the 16-bit dtype and the row strides; outputs are poisoned first, and their padding must
 * stay poisoned.
 * Must never: hold a 16-bit output to anything but the f32 run's rounded by the dtype's
 * own rule, or let the two runs read different input values.
 */
#include "attention_io16.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "cuda_twins.h"   /* (copied_to: a tensor's values on the host) */


/* A tensor of `pool` of n elements: f32 from h, 16-bit from h16 (NULL: poisoned, NaN or
   0xffff). */
static l2l_tensor *on_pool(l2l_pool_kind pool, l2l_dtype dtype, int64_t n, const float *h,
                           const uint16_t *h16) {
  l2l_tensor *host = check_tensor(L2L_POOL_HOST, dtype, DIMS(n));
  if (dtype == L2L_F32) {
    float *d = l2l_tensor_data(host);
    for (int64_t i = 0; i < n; i++) d[i] = h != NULL ? h[i] : NAN;
  } else if (h16 != NULL) {
    memcpy(l2l_tensor_data(host), h16, (size_t)n * 2);
  } else {
    memset(l2l_tensor_data(host), 0xff, (size_t)n * 2);
  }
  l2l_tensor *t = check_tensor(pool, dtype, DIMS(n));
  CHECK_OK(l2l_tensor_copy(t, host));
  l2l_tensor_free(host);
  return t;
}

/* q, k, v (or dq, dk, dv) as the shape lays them out: interleaved in one N x ld buffer
   (ld = 3D: part i at column i D), or three N x ld buffers; values from h32 (f32) or h16
   (16-bit), 3 x N x D part-major, or poisoned (both NULL). */
struct parts {
  l2l_tensor *t[3];   /* (the one buffer in t[0] when interleaved) */
  void *at[3];        /* each part's first element */
};

static struct parts lay_out(l2l_pool_kind pool, l2l_dtype dtype, bool interleaved, int64_t N,
                            int64_t D, int64_t ld, const float *h32, const uint16_t *h16) {
  struct parts p;
  memset(&p, 0, sizeof p);
  const size_t size = dtype == L2L_F32 ? 4 : 2;
  for (int b = 0; b < (interleaved ? 1 : 3); b++) {
    float *f = xmalloc((size_t)(N * ld) * sizeof *f);
    uint16_t *h = xmalloc((size_t)(N * ld) * sizeof *h);
    for (int64_t i = 0; i < N * ld; i++) f[i] = NAN, h[i] = 0xffff;
    for (int part = interleaved ? 0 : b; part < (interleaved ? 3 : b + 1); part++)
      for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < D; c++) {
          const int64_t from = (part * N + r) * D + c, to = r * ld + (interleaved ? part * D : 0) + c;
          if (h32 != NULL) f[to] = h32[from];
          if (h16 != NULL) h[to] = h16[from];
        }
    p.t[b] = on_pool(pool, dtype, N * ld, h32 != NULL || h16 == NULL ? f : NULL, h);
    free(f), free(h);
  }
  for (int part = 0; part < 3; part++)
    p.at[part] = (char *)l2l_tensor_data(p.t[interleaved ? 0 : part]) + (interleaved ? part * D * size : 0);
  return p;
}

static void parts_free(struct parts *p) {
  for (int b = 0; b < 3; b++) l2l_tensor_free(p->t[b]);
}

/* f32 a and b alike: to the bit (exact), else each within tol of its scale and ulps of
   its own size. */
static bool alike(const char *what, const l2l_tensor *a, const l2l_tensor *b, bool exact,
                  double tol, double ulps) {
  l2l_tensor *x = copied_to(a, L2L_POOL_HOST), *y = copied_to(b, L2L_POOL_HOST);
  const float *fx = l2l_tensor_data(x), *fy = l2l_tensor_data(y);
  const int64_t n = l2l_tensor_numel(x);
  bool ok;
  if (exact) {
    ok = CHECK(memcmp(fx, fy, (size_t)n * 4) == 0, "%s: not the same bits", what);
  } else {
    double scale = 0.0;
    int64_t apart = 0, finite = 0;
    for (int64_t i = 0; i < n; i++)
      if (isfinite(fx[i])) scale += (double)fx[i] * fx[i], finite++;
    scale = sqrt(scale / (double)(finite > 0 ? finite : 1));
    for (int64_t i = 0; i < n; i++)
      apart += !(fx[i] == fy[i] || (isnan(fx[i]) && isnan(fy[i])) ||
                 fabs((double)fx[i] - fy[i]) <= tol * scale + ulps * fabs((double)fx[i]));
    ok = CHECK(apart == 0, "%s: %lld elements more than %.3g of their scale %.3g (and %.3g of "
               "their size) apart", what, (long long)apart, tol, scale, ulps);
  }
  l2l_tensor_free(x), l2l_tensor_free(y);
  return ok;
}

/* h (16-bit, rows of ld, the first `cols` of each in use) against the f32 f rounded by dt's
   rule: to the bit (exact), else within two 16-bit ulps of each (an ulp: 2^-7 of a bf16's
   size, 2^-10 of an f16's, at most) and 1e-5 of f's rms; the padding past cols untouched
   (0xffff). widened (rows * ld, NULL: none) gets h's values. */
static bool rounded_from(const char *what, const l2l_tensor *f, const l2l_tensor *h, int64_t rows,
                         int64_t ld, int64_t cols, l2l_dtype dt, bool exact, float *widened) {
  const double ulp = dt == L2L_BF16 ? 0x1p-7 : 0x1p-10;
  l2l_tensor *a = copied_to(f, L2L_POOL_HOST), *b = copied_to(h, L2L_POOL_HOST);
  const float *fa = l2l_tensor_data(a);
  const uint16_t *hb = l2l_tensor_data(b);
  double rms = 0.0;
  for (int64_t i = 0; i < rows * ld; i++) rms += i % ld < cols ? (double)fa[i] * fa[i] : 0.0;
  rms = sqrt(rms / (double)(rows * cols));
  int64_t bad = 0, first = -1;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < ld; c++) {
      const int64_t i = r * ld + c;
      const uint16_t want = c >= cols ? 0xffff : round16(fa[i], dt);
      const bool fine = hb[i] == want || (!exact && c < cols &&
                        fabs((double)widen16(hb[i], dt) - fa[i]) <= 2 * ulp * fabs((double)fa[i]) + 1e-5 * rms);
      if (!fine && bad++ == 0) first = i;
      if (widened != NULL) widened[i] = widen16(hb[i], dt);
    }
  bool ok = CHECK(bad == 0, "%s: %lld elements are not the f32 run's rounded (the first at %lld: "
                  "%04x, want the rounding of %.9g)", what, (long long)bad, (long long)first,
                  first >= 0 ? hb[first] : 0, first >= 0 ? (double)fa[first] : 0.0);
  l2l_tensor_free(a), l2l_tensor_free(b);
  return ok;
}

bool attention_io16_check(l2l_pool_kind pool, l2l_dtype products, bool standard, bool exact) {
  const struct backend_ops *ops = backend_for(pool);
  /* 16 bits in the products' dtype where they are 16-bit (as the block keeps them) */
  const l2l_dtype dt = products != L2L_F32 ? products : check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  const int which = (int)check_rand_int(0, 2);   /* q, k, v; o; both */
  const bool qkv16 = which != 1, o16 = which != 0, dq16 = check_rand_int(0, 1);
  const bool do16 = check_rand_int(0, 1);
  const int64_t B = check_rand_int(1, 2), H = check_rand_int(1, 3), hd = 8 * check_rand_int(1, 8);
  const int64_t S = check_rand_int(1, 80), D = H * hd, N = B * S, rows = B * H * S;
  const int64_t ld_o = D + (check_rand_int(0, 1) ? 8 : 0);
  /* q, k, v interleaved as the block keeps them, or three buffers whose 16-bit rows are
     16-byte aligned (D + 8) or not (D + 4) */
  const int layout = (int)check_rand_int(0, 2);
  const bool interleaved = layout == 0;
  const int64_t ld = interleaved ? 3 * D : D + (layout == 1 ? 8 : 4);
  struct backend_attention_shape sh = {
      .batch = B, .heads = H, .seq = S, .head_dim = hd, .ld_qkv = ld, .ld_o = ld_o,
      .causal = (int)check_rand_int(0, 1), .scale = 1.0f / sqrtf((float)hd),
      .seed = check_rand_u64(), .stream = check_rand_u64(), .precision = products};
  struct backend_attention_shape sh16 = sh;
  sh16.o_dtype = o16 ? dt : L2L_F32, sh16.qkv_dtype = qkv16 ? dt : L2L_F32;
  sh16.dqkv_dtype = dq16 ? dt : L2L_F32, sh16.do_dtype = do16 ? dt : L2L_F32;
  char what[260];
  snprintf(what, sizeof what, "attention %s B=%lld H=%lld S=%lld hd=%lld ld_qkv=%lld ld_o=%lld%s, "
           "%s%s%s%s%s in %s, products %s: ", standard ? "standard" : "frugal", (long long)B,
           (long long)H, (long long)S, (long long)hd, (long long)ld, (long long)ld_o,
           sh.causal ? " causal" : "", qkv16 ? "q, k, v" : "", which == 2 ? " and " : "",
           o16 ? "o" : "", dq16 ? " (and dq, dk, dv)" : "", do16 ? " (and do)" : "",
           l2l_dtype_name(dt),
           l2l_dtype_name(products));

  /* q, k, v: the 16-bit run's rounded from a draw, the f32 run's their widened values */
  const int64_t nq = 3 * N * D;
  float *h_qkv = xmalloc((size_t)nq * sizeof *h_qkv), *h_do = xmalloc((size_t)(N * ld_o) * sizeof *h_do);
  uint16_t *h16 = xmalloc((size_t)nq * sizeof *h16);
  for (int64_t i = 0; i < nq; i++) {
    h16[i] = round16((float)check_rand_normal(), dt);
    h_qkv[i] = qkv16 ? widen16(h16[i], dt) : (float)check_rand_normal();
  }
  /* do: a 16-bit run's rounded from a draw (its padding poisoned), the f32 run's their
     widened values */
  uint16_t *h_do16 = xmalloc((size_t)(N * ld_o) * sizeof *h_do16);
  for (int64_t i = 0; i < N * ld_o; i++) {
    h_do16[i] = i % ld_o < D ? round16((float)check_rand_normal(), dt) : 0xffff;
    h_do[i] = do16 ? (i % ld_o < D ? widen16(h_do16[i], dt) : NAN) : (float)check_rand_normal();
  }
  struct parts in32 = lay_out(pool, L2L_F32, interleaved, N, D, ld, h_qkv, NULL);
  struct parts in16 = qkv16 ? lay_out(pool, dt, interleaved, N, D, ld, NULL, h16) : in32;
  l2l_tensor *d_o = on_pool(pool, L2L_F32, N * ld_o, h_do, NULL);
  l2l_tensor *d_o16 = do16 ? on_pool(pool, dt, N * ld_o, NULL, h_do16) : d_o;
  l2l_tensor *o32 = on_pool(pool, L2L_F32, N * ld_o, NULL, NULL);
  l2l_tensor *o_out = on_pool(pool, o16 ? dt : L2L_F32, N * ld_o, NULL, NULL);
  l2l_tensor *lse32 = on_pool(pool, L2L_F32, rows, NULL, NULL), *lse16 = on_pool(pool, L2L_F32, rows, NULL, NULL);
  l2l_tensor *p32 = NULL, *p16 = NULL;
  if (standard)
    p32 = on_pool(pool, L2L_F32, rows * S, NULL, NULL), p16 = on_pool(pool, L2L_F32, rows * S, NULL, NULL);
  int64_t wf = 0;
  for (int backward = 0; backward < 2; backward++)
    for (int s16 = 0; s16 < 2; s16++) {
      int64_t need = ops->attention_workspace(s16 ? &sh16 : &sh, backward) * l2l_get_threads();
      wf = need > wf ? need : wf;
    }
  l2l_tensor *work = wf > 0 ? on_pool(pool, L2L_F32, wf, NULL, NULL) : NULL;
  float *w = work ? l2l_tensor_data(work) : NULL;
#define DATA(t) ((t) != NULL ? l2l_tensor_data(t) : NULL)
  bool ok = CHECK_OK(ops->attention_forward(DATA(o32), DATA(lse32), DATA(p32), NULL, NULL, in32.at[0],
                                            in32.at[1], in32.at[2], NULL, &sh, w, wf));
  ok &= CHECK_OK(ops->attention_forward(DATA(o_out), DATA(lse16), DATA(p16), NULL, NULL, in16.at[0],
                                        in16.at[1], in16.at[2], NULL, &sh16, w, wf));
  ok &= CHECK_OK(l2l_device_synchronize());

  /* o: the f32 run's (rounded, where 16-bit; the padding untouched), or within two 16-bit
     ulps of it */
  const double ulps = products == L2L_F32 ? 0.0 : 2 * (dt == L2L_BF16 ? 0x1p-7 : 0x1p-10);
  char label[320];
  snprintf(label, sizeof label, "%so", what);
  l2l_tensor *ow = o_out;   /* o as the f32 run's backward reads it */
  if (o16) {
    float *widened = xmalloc((size_t)(N * ld_o) * sizeof *widened);
    ok &= rounded_from(label, o32, o_out, N, ld_o, D, dt, exact, widened);
    ow = on_pool(pool, L2L_F32, N * ld_o, widened, NULL);
    free(widened);
  } else {
    ok &= alike(label, o32, o_out, exact, 1e-5, ulps);
  }
  snprintf(label, sizeof label, "%slse", what);
  ok &= alike(label, lse32, lse16, exact, 1e-5, 1e-5);
  if (standard) {
    snprintf(label, sizeof label, "%sprobabilities", what);
    ok &= alike(label, p32, p16, exact, 1e-5, 1e-5);
  }

  /* the backward from the 16-bit inputs against the backward from their f32 copies */
  struct parts g32 = lay_out(pool, L2L_F32, interleaved, N, D, ld, NULL, NULL);
  struct parts g16 = lay_out(pool, dq16 ? dt : L2L_F32, interleaved, N, D, ld, NULL, NULL);
  ok &= CHECK_OK(ops->attention_backward(g32.at[0], g32.at[1], g32.at[2], l2l_tensor_data(d_o),
                                         DATA(ow), DATA(lse32), DATA(p32), NULL, NULL, in32.at[0],
                                         in32.at[1], in32.at[2], NULL, &sh, w, wf));
  ok &= CHECK_OK(ops->attention_backward(g16.at[0], g16.at[1], g16.at[2], l2l_tensor_data(d_o16),
                                         DATA(o_out), DATA(lse32), DATA(p32), NULL, NULL,
                                         in16.at[0], in16.at[1], in16.at[2], NULL, &sh16, w, wf));
  ok &= CHECK_OK(l2l_device_synchronize());
#undef DATA
  for (int b = 0; b < (interleaved ? 1 : 3); b++) {
    snprintf(label, sizeof label, "%s%s", what, interleaved ? "dq, dk, dv" : b == 0 ? "dq" : b == 1 ? "dk" : "dv");
    if (dq16) ok &= rounded_from(label, g32.t[b], g16.t[b], N, ld, interleaved ? 3 * D : D, dt, exact, NULL);
    else ok &= alike(label, g32.t[b], g16.t[b], exact, 1e-5, ulps);
  }
  l2l_tensor *all[] = {d_o, o32, o_out, lse32, lse16, p32, p16, work};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) l2l_tensor_free(all[i]);
  if (qkv16) parts_free(&in16);
  parts_free(&in32), parts_free(&g32), parts_free(&g16);
  if (ow != o_out) l2l_tensor_free(ow);
  if (d_o16 != d_o) l2l_tensor_free(d_o16);
  free(h_qkv), free(h_do), free(h_do16), free(h16);
  return ok;
}
