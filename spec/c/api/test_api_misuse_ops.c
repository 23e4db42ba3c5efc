/* SPDX-License-Identifier: MIT */
/* test_api_misuse_ops.c — the ops of include/l2l.h called with what they must refuse: every
 * tensor argument of each op in turn NULL, no handle, a layer, a record, the wrong dtype or
 * the other pool (SWEEP), then each op's own shape, range and aliasing refusals.
 * test_api_misuse.c says what a refusal must do (the documented status, a message naming
 * what is wrong, set by this call, and nothing changed: watched tensors' bytes and handles,
 * *out, the pools' bytes in use) and how; misuse.h holds the harness. Which tests cover
 * which functions is said above each test. All test names start with "misuse_".
 */
#include <ctype.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misuse.h"

/* ---------------------------------------------------------------- ops */

typedef l2l_status (*op_fn)(l2l_tensor *const *t);
struct slot {
  const char *name; /* as the op's messages name the argument */
  bool optional;    /* NULL is allowed */
};

/* Every tensor argument of an op in turn replaced by NULL (unless optional), bytes that
   are no handle, a layer, a parameter record, a tensor of its shape with the wrong dtype
   (i32 for a float, f32 for ids and masks) and one in the device pool (the others being in
   the host pool): each refused naming the argument (or the device pool), nothing changed.
   Then the good arguments t[] still work. */
static void sweep_at(const char *op, op_fn fn, l2l_tensor **t, const struct slot *s, int n,
                     const char *file, int line) {
  l2l_layer *layer = small_block();
  for (int i = 0; i < n; i++) watch(t[i]);
  for (int i = 0; i < n; i++) {
    l2l_tensor *good = t[i];
    l2l_dtype dtype = (l2l_dtype)l2l_tensor_dtype(good);
    l2l_tensor *wrong = remake(good, L2L_POOL_HOST, dtype == L2L_F32 ? L2L_I32 : L2L_F32);
    l2l_tensor *dev = n > 1 ? remake(good, L2L_POOL_DEVICE, dtype) : NULL;
    char named[64];
    snprintf(named, sizeof named, ": %s is ", s[i].name);
    const struct {
      l2l_tensor *t;
      const char *what, *needle;
    } cases[] = {
        {NULL, "NULL", named},
        {JUNK(l2l_tensor), "bytes that are no handle", named},
        {AS(l2l_tensor, layer), "a layer", named},
        {AS(l2l_tensor, l2l_layer_param(layer, 0)), "a parameter record", named},
        {wrong, "a tensor of the wrong dtype", named},
        {dev, "a device tensor", "pool 'device'"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      if (cases[c].t == NULL && (c != 0 || s[i].optional)) continue;
      char expr[200];
      snprintf(expr, sizeof expr, "%s with %s = %s", op, s[i].name, cases[c].what);
      t[i] = cases[c].t;
      refused_at((arm(), fn(t)), L2L_ERR_INVALID, cases[c].needle, file, line, expr);
      t[i] = good;
    }
    l2l_tensor_free(wrong);
    l2l_tensor_free(dev);
  }
  l2l_layer_free(layer);
  char expr[200];
  snprintf(expr, sizeof expr, "%s with good arguments after the refusals", op);
  l2l_status st = fn(t);
  check_that(st == L2L_OK, file, line, expr, "failed: %s", l2l_last_error());
}
#define SWEEP(op, fn, t, ...)                                                                 \
  sweep_at((op), (fn), (t), (const struct slot[]){__VA_ARGS__},                               \
           (int)(sizeof((const struct slot[]){__VA_ARGS__}) / sizeof(struct slot)), __FILE__, \
           __LINE__)

static l2l_status call_gemm(l2l_tensor *const *t) {
  return l2l_gemm(t[0], t[1], t[2], 0, 0, 1.0f, 0.0f);
}
static l2l_status call_gemm_batched(l2l_tensor *const *t) {
  return l2l_gemm_batched(t[0], t[1], t[2], 0, 0, 1.0f, 0.0f);
}

/* Covers: l2l_gemm, l2l_gemm_batched. */
TEST(misuse_gemm) {
  l2l_tensor *c = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 6)), *a = check_randn(1.0, 2, 4, 5),
             *b = check_randn(1.0, 2, 5, 6);
  l2l_tensor *t[3] = {c, a, b};
  SWEEP("l2l_gemm", call_gemm, t, {"c", false}, {"a", false}, {"b", false});
  poison(c);
  const int flags[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
    REFUSES(l2l_gemm(c, a, b, flags[i], 0, 1, 0), L2L_ERR_INVALID, "trans_a");
    REFUSES(l2l_gemm(c, a, b, 0, flags[i], 1, 0), L2L_ERR_INVALID, "trans_b");
    REFUSES(l2l_gemm_batched(c, a, b, flags[i], 0, 1, 0), L2L_ERR_INVALID, "trans_a");
  }
  const float not_finite[] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < 3; i++) {
    REFUSES(l2l_gemm(c, a, b, 0, 0, not_finite[i], 0), L2L_ERR_INVALID, "alpha");
    REFUSES(l2l_gemm(c, a, b, 0, 0, 1, not_finite[i]), L2L_ERR_INVALID, "beta");
    REFUSES(l2l_gemm_batched(c, a, b, 0, 0, 1, not_finite[i]), L2L_ERR_INVALID, "beta");
  }
  /* shapes: off by one, transposed, the wrong transpose flag */
  l2l_tensor *b6 = check_randn(1.0, 2, 6, 6), *ct = poison(NEW(L2L_POOL_HOST, L2L_F32, 6, 4));
  l2l_tensor *c5 = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 7));
  WATCH(b6, ct, c5);
  REFUSES(l2l_gemm(c, a, b6, 0, 0, 1, 0), L2L_ERR_INVALID, "inner dims");
  REFUSES(l2l_gemm(ct, a, b, 0, 0, 1, 0), L2L_ERR_INVALID, "c is (6,4)");
  REFUSES(l2l_gemm(c5, a, b, 0, 0, 1, 0), L2L_ERR_INVALID, "c is (4,7)");
  REFUSES(l2l_gemm(c, a, b, 1, 0, 1, 0), L2L_ERR_INVALID, "inner dims");
  REFUSES(l2l_gemm(c, a, b, 0, 1, 1, 0), L2L_ERR_INVALID, "inner dims");
  REFUSES(l2l_gemm(c, a, b, 1, 1, 1, 0), L2L_ERR_INVALID, "inner dims");
  REFUSES(l2l_gemm(c, b, a, 1, 1, 1, 0), L2L_ERR_INVALID, "c is (4,6) but op(a) op(b) is (6,4)");
  /* 16-bit inputs come in pairs of one kind */
  l2l_tensor *ah = remake(a, L2L_POOL_HOST, L2L_F16), *bh = remake(b, L2L_POOL_HOST, L2L_BF16);
  l2l_tensor *ch = remake(c, L2L_POOL_HOST, L2L_F16);
  WATCH(ah, bh, ch);
  REFUSES(l2l_gemm(c, ah, b, 0, 0, 1, 0), L2L_ERR_INVALID, "b is f32, need f16");
  REFUSES(l2l_gemm(c, ah, bh, 0, 0, 1, 0), L2L_ERR_INVALID, "b is bf16, need f16");
  REFUSES(l2l_gemm(c, a, bh, 0, 0, 1, 0), L2L_ERR_INVALID, "b is bf16, need f32");
  REFUSES(l2l_gemm(ch, ah, ah, 0, 1, 1, 0), L2L_ERR_INVALID, "c is f16");
  /* c may not alias an input */
  l2l_tensor *sq = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 4)), *sqv = view(sq, 0, 4);
  WATCH(sq);
  REFUSES(l2l_gemm(sq, sqv, sqv, 0, 0, 1, 0), L2L_ERR_INVALID, "overlaps");
  /* batched: batch counts agree, at least 2 dims each */
  l2l_tensor *cb = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 4, 6)), *ab = check_randn(1.0, 3, 2, 4, 5),
             *bb = check_randn(1.0, 3, 2, 5, 6);
  l2l_tensor *bb3 = check_randn(1.0, 3, 3, 5, 6), *v5 = check_randn(1.0, 1, 5);
  l2l_tensor *tb[3] = {cb, ab, bb};
  SWEEP("l2l_gemm_batched", call_gemm_batched, tb, {"c", false}, {"a", false}, {"b", false});
  poison(cb);
  WATCH(bb3, v5);
  REFUSES(l2l_gemm_batched(cb, ab, bb3, 0, 0, 1, 0), L2L_ERR_INVALID, "batch counts");
  REFUSES(l2l_gemm_batched(cb, v5, bb, 0, 0, 1, 0), L2L_ERR_INVALID, "2 dims");
  REFUSES(l2l_gemm_batched(cb, ab, bb, 1, 0, 1, 0), L2L_ERR_INVALID, "inner dims");
  unwatch();
  CHECK_OK(l2l_gemm(c, a, b, 0, 0, 1, 0));
  FREE(c, a, b, b6, ct, c5, ah, bh, ch, sq, sqv, cb, ab, bb, bb3, v5);
}

static l2l_status call_bias_add(l2l_tensor *const *t) {
  return l2l_bias_add(t[0], t[1]);
}
static l2l_status call_bias_backward(l2l_tensor *const *t) {
  return l2l_bias_backward(t[0], t[1]);
}
static l2l_status call_add(l2l_tensor *const *t) {
  return l2l_add(t[0], t[1], t[2]);
}
static l2l_status call_gelu_forward(l2l_tensor *const *t) {
  return l2l_gelu_forward(t[0], t[1]);
}
static l2l_status call_gelu_backward(l2l_tensor *const *t) {
  return l2l_gelu_backward(t[0], t[1], t[2]);
}

/* Covers: l2l_bias_add, l2l_bias_backward, l2l_add, l2l_gelu_forward, l2l_gelu_backward. */
TEST(misuse_elementwise) {
  l2l_tensor *y = check_randn(1.0, 2, 4, 5), *bias = check_randn(1.0, 1, 5);
  l2l_tensor *dy = check_randn(1.0, 2, 4, 5), *x = check_randn(1.0, 2, 4, 5);
  l2l_tensor *out = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5));
  l2l_tensor *t2[2] = {y, bias}, *t3[3] = {out, x, dy};
  SWEEP("l2l_bias_add", call_bias_add, t2, {"y", false}, {"bias", false});
  l2l_tensor *db[2] = {bias, dy};
  SWEEP("l2l_bias_backward", call_bias_backward, db, {"dbias", false}, {"dy", false});
  SWEEP("l2l_add", call_add, t3, {"out", false}, {"a", false}, {"b", false});
  l2l_tensor *gf[2] = {out, x};
  SWEEP("l2l_gelu_forward", call_gelu_forward, gf, {"y", false}, {"x", false});
  SWEEP("l2l_gelu_backward", call_gelu_backward, t3, {"dx", false}, {"dy", false}, {"x", false});
  poison(out);

  l2l_tensor *b6 = check_randn(1.0, 1, 6), *b4 = check_randn(1.0, 1, 4);
  l2l_tensor *xt = check_randn(1.0, 2, 5, 4), *x6 = check_randn(1.0, 2, 4, 6);
  l2l_tensor *x1 = check_randn(1.0, 1, 20), *x3 = check_randn(1.0, 3, 4, 5, 1);
  l2l_tensor *big = check_randn(1.0, 2, 6, 5), *lo = view(big, 0, 4), *hi = view(big, 2, 4);
  l2l_tensor *row = view(y, 1, 1);
  WATCH(b6, b4, xt, x6, x1, x3, big);
  /* bias: one per column, off by one either way; a bias inside y */
  REFUSES(l2l_bias_add(y, b6), L2L_ERR_INVALID, "bias has 6 elements");
  REFUSES(l2l_bias_add(y, b4), L2L_ERR_INVALID, "bias has 4 elements");
  REFUSES(l2l_bias_add(xt, bias), L2L_ERR_INVALID, "bias has 5 elements, need 4");
  REFUSES(l2l_bias_add(y, row), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_bias_backward(b6, dy), L2L_ERR_INVALID, "dbias has 6 elements");
  REFUSES(l2l_bias_backward(bias, xt), L2L_ERR_INVALID, "dbias has 5 elements, need 4");
  REFUSES(l2l_bias_backward(row, y), L2L_ERR_INVALID, "overlaps");
  /* same shapes: transposed, off by one, flattened, an extra dim; partial aliasing */
  const l2l_tensor *misfits[] = {xt, x6, x1, x3};
  for (size_t i = 0; i < sizeof misfits / sizeof misfits[0]; i++) {
    REFUSES(l2l_add(out, x, misfits[i]), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_add(out, misfits[i], x), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_add((l2l_tensor *)misfits[i], x, dy), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_forward(out, misfits[i]), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_forward((l2l_tensor *)misfits[i], x), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_backward(out, misfits[i], x), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_backward(out, dy, misfits[i]), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_backward((l2l_tensor *)misfits[i], dy, x), L2L_ERR_INVALID, "shape");
  }
  REFUSES(l2l_add(hi, lo, x), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_add(lo, x, hi), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_gelu_forward(hi, lo), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_gelu_backward(lo, hi, x), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_gelu_backward(lo, dy, hi), L2L_ERR_INVALID, "overlaps");
  /* in place is allowed where the header says so */
  unwatch();
  CHECK_OK(l2l_add(x, x, dy));
  CHECK_OK(l2l_gelu_forward(x, x));
  FREE(y, bias, dy, x, out, b6, b4, xt, x6, x1, x3, big, lo, hi, row);
}

static l2l_status call_ln_forward(l2l_tensor *const *t) {
  return l2l_layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], 1e-5f);
}
static l2l_status call_ln_backward(l2l_tensor *const *t) {
  return l2l_layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
}

/* Covers: l2l_layernorm_forward, l2l_layernorm_backward. */
TEST(misuse_layernorm) {
  l2l_tensor *y = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5)),
             *mean = poison(NEW(L2L_POOL_HOST, L2L_F32, 4));
  l2l_tensor *rstd = poison(NEW(L2L_POOL_HOST, L2L_F32, 4)), *x = check_randn(1.0, 2, 4, 5);
  l2l_tensor *w = check_randn(1.0, 1, 5), *b = check_randn(1.0, 1, 5);
  l2l_tensor *tf[6] = {y, mean, rstd, x, w, b};
  SWEEP("l2l_layernorm_forward", call_ln_forward, tf, {"y", false}, {"mean", true}, {"rstd", true},
        {"x", false}, {"weight", false}, {"bias", false});
  l2l_tensor *dx = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5)), *dw = check_randn(1.0, 1, 5);
  l2l_tensor *dbias = check_randn(1.0, 1, 5), *dy = check_randn(1.0, 2, 4, 5);
  l2l_tensor *tb[8] = {dx, dw, dbias, dy, x, w, mean, rstd};
  SWEEP("l2l_layernorm_backward", call_ln_backward, tb, {"dx", false}, {"dweight", true},
        {"dbias", true}, {"dy", false}, {"x", false}, {"weight", false}, {"mean", false},
        {"rstd", false});
  poison(y), poison(dx);

  const float bad_eps[] = {0.0f, -1e-5f, NAN, INFINITY, -INFINITY, -0.0f};
  for (size_t i = 0; i < sizeof bad_eps / sizeof bad_eps[0]; i++)
    REFUSES(l2l_layernorm_forward(y, mean, rstd, x, w, b, bad_eps[i]), L2L_ERR_INVALID, "eps");
  l2l_tensor *w6 = check_randn(1.0, 1, 6), *w4 = check_randn(1.0, 1, 4),
             *m5 = check_randn(1.0, 1, 5);
  l2l_tensor *m3 = check_randn(1.0, 1, 3), *xt = check_randn(1.0, 2, 5, 4);
  l2l_tensor *yt = poison(NEW(L2L_POOL_HOST, L2L_F32, 5, 4));
  l2l_tensor *wide = check_randn(1.0, 2, 4, 6), *in_y = view(wide, 0, 1);
  l2l_tensor *flat5 = RESHAPED(in_y, 6);
  WATCH(w6, w4, m5, m3, xt, yt, wide);
  REFUSES(l2l_layernorm_forward(y, mean, rstd, x, w6, b, 1e-5f), L2L_ERR_INVALID, "weight has 6");
  REFUSES(l2l_layernorm_forward(y, mean, rstd, x, w, w4, 1e-5f), L2L_ERR_INVALID, "bias has 4");
  REFUSES(l2l_layernorm_forward(y, m5, rstd, x, w, b, 1e-5f), L2L_ERR_INVALID, "mean has 5");
  REFUSES(l2l_layernorm_forward(y, mean, m3, x, w, b, 1e-5f), L2L_ERR_INVALID, "rstd has 3");
  REFUSES(l2l_layernorm_forward(yt, mean, rstd, x, w, b, 1e-5f), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_layernorm_forward(y, mean, rstd, xt, w, b, 1e-5f), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_layernorm_forward(y, mean, mean, x, w, b, 1e-5f), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_layernorm_forward(wide, mean, rstd, wide, flat5, flat5, 1e-5f), L2L_ERR_INVALID,
          "overlaps");
  REFUSES(l2l_layernorm_backward(dx, dw, dbias, dy, x, w6, mean, rstd), L2L_ERR_INVALID,
          "weight has 6");
  REFUSES(l2l_layernorm_backward(dx, w4, dbias, dy, x, w, mean, rstd), L2L_ERR_INVALID,
          "dweight has 4");
  REFUSES(l2l_layernorm_backward(dx, dw, w6, dy, x, w, mean, rstd), L2L_ERR_INVALID, "dbias has 6");
  REFUSES(l2l_layernorm_backward(dx, dw, dbias, dy, x, w, m5, rstd), L2L_ERR_INVALID, "mean has 5");
  REFUSES(l2l_layernorm_backward(dx, dw, dbias, dy, x, w, mean, m3), L2L_ERR_INVALID, "rstd has 3");
  REFUSES(l2l_layernorm_backward(dx, dw, dbias, xt, x, w, mean, rstd), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_layernorm_backward(yt, dw, dbias, dy, x, w, mean, rstd), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_layernorm_backward(dx, dw, dw, dy, x, w, mean, rstd), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_layernorm_backward(dx, w, dbias, dy, x, w, mean, rstd), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_layernorm_backward(x, dw, dbias, dy, x, w, mean, rstd), L2L_ERR_INVALID, "overlaps");
  unwatch();
  CHECK_OK(l2l_layernorm_forward(y, NULL, NULL, x, w, b, 1e-5f));
  CHECK_OK(l2l_layernorm_backward(dy, NULL, NULL, dy, x, w, mean, rstd)); /* dx may be dy */
  FREE(y, mean, rstd, x, w, b, dx, dw, dbias, dy, w6, w4, m5, m3, xt, yt, wide, in_y, flat5);
}

static l2l_status call_softmax_forward(l2l_tensor *const *t) {
  return l2l_softmax_forward(t[0], t[1], t[2], 1, 0.5f);
}
static l2l_status call_softmax_backward(l2l_tensor *const *t) {
  return l2l_softmax_backward(t[0], t[1], t[2], 0.5f);
}

/* Covers: l2l_softmax_forward, l2l_softmax_backward. */
TEST(misuse_softmax) {
  l2l_tensor *y = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 4)), *x = check_randn(1.0, 3, 2, 3, 4);
  l2l_tensor *mask = ones_u8(DIMS(2, 4));
  l2l_tensor *tf[3] = {y, x, mask};
  SWEEP("l2l_softmax_forward", call_softmax_forward, tf, {"y", false}, {"x", false},
        {"key_mask", true});
  l2l_tensor *dx = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 4)), *dy = check_randn(1.0, 3, 2, 3, 4);
  l2l_tensor *tb[3] = {dx, dy, y};
  SWEEP("l2l_softmax_backward", call_softmax_backward, tb, {"dx", false}, {"dy", false},
        {"y", false});
  poison(y), poison(dx);
  const int flags[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    REFUSES(l2l_softmax_forward(y, x, mask, flags[i], 1), L2L_ERR_INVALID, "causal");
  const float not_finite[] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < 3; i++) {
    REFUSES(l2l_softmax_forward(y, x, mask, 0, not_finite[i]), L2L_ERR_INVALID, "scale");
    REFUSES(l2l_softmax_backward(dx, dy, y, not_finite[i]), L2L_ERR_INVALID, "scale");
  }
  l2l_tensor *m5 = ones_u8(DIMS(2, 5)), *m3 = ones_u8(DIMS(3, 4)), *mt = ones_u8(DIMS(4, 2));
  l2l_tensor *m1 = ones_u8(DIMS(8)), *m3d = ones_u8(DIMS(2, 1, 4));
  l2l_tensor *x2 = check_randn(1.0, 2, 3, 4), *y2 = poison(NEW(L2L_POOL_HOST, L2L_F32, 3, 4));
  l2l_tensor *xt = check_randn(1.0, 3, 2, 4, 3), *yo = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 5));
  l2l_tensor *big = check_randn(1.0, 3, 3, 3, 4), *lo = view(big, 0, 2), *hi = view(big, 1, 2);
  WATCH(m5, m3, mt, m1, m3d, x2, y2, xt, yo, big);
  const l2l_tensor *bad_masks[] = {m5, m3, mt, m1, m3d};
  for (size_t i = 0; i < sizeof bad_masks / sizeof bad_masks[0]; i++)
    REFUSES(l2l_softmax_forward(y, x, bad_masks[i], 0, 1), L2L_ERR_INVALID, "key_mask has shape");
  REFUSES(l2l_softmax_forward(y2, x2, m3, 0, 1), L2L_ERR_INVALID, "3 dims");
  REFUSES(l2l_softmax_forward(y, xt, NULL, 0, 1), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_softmax_forward(yo, x, NULL, 0, 1), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_softmax_forward(hi, lo, NULL, 0, 1), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_softmax_backward(dx, xt, y, 1), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_softmax_backward(yo, dy, y, 1), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_softmax_backward(lo, dy, hi, 1), L2L_ERR_INVALID, "overlaps");
  unwatch();
  CHECK_OK(l2l_softmax_forward(x, x, mask, 1, 1.0f)); /* y may be x */
  FREE(y, x, mask, dx, dy, m5, m3, mt, m1, m3d, x2, y2, xt, yo, big, lo, hi);
}

static l2l_status call_embedding_forward(l2l_tensor *const *t) {
  return l2l_embedding_forward(t[0], t[1], t[2]);
}
static l2l_status call_embedding_backward(l2l_tensor *const *t) {
  return l2l_embedding_backward(t[0], t[1], t[2]);
}
static l2l_status call_ce_forward(l2l_tensor *const *t) {
  return l2l_cross_entropy_forward(t[0], t[1], t[2], -1);
}
static l2l_status call_ce_backward(l2l_tensor *const *t) {
  return l2l_cross_entropy_backward(t[0], t[1], t[2], -1, 0.25f);
}

/* Covers: l2l_embedding_forward, l2l_embedding_backward, l2l_cross_entropy_forward,
   l2l_cross_entropy_backward. */
TEST(misuse_embedding_and_cross_entropy) {
  enum { V = 7 };
  l2l_tensor *out = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 5)), *ids = IDS(V, 2, 3);
  l2l_tensor *table = check_randn(1.0, 2, V, 5), *dtable = check_randn(1.0, 2, V, 5);
  l2l_tensor *dout = check_randn(1.0, 3, 2, 3, 5);
  l2l_tensor *ef[3] = {out, ids, table}, *eb[3] = {dtable, dout, ids};
  SWEEP("l2l_embedding_forward", call_embedding_forward, ef, {"out", false}, {"ids", false},
        {"table", false});
  SWEEP("l2l_embedding_backward", call_embedding_backward, eb, {"dtable", false}, {"dout", false},
        {"ids", false});
  poison(out);
  /* ids outside [0, V): refused before anything is written */
  const int32_t bad_ids[] = {V, -1, INT32_MIN, INT32_MAX, V + 1};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    l2l_tensor *bad = IDS(V, 2, 3);
    ((int32_t *)l2l_tensor_data(bad))[5] = bad_ids[i];
    WATCH(bad);
    REFUSES(l2l_embedding_forward(out, bad, table), L2L_ERR_INVALID, "ids[1][2]");
    REFUSES(l2l_embedding_backward(dtable, dout, bad), L2L_ERR_INVALID, "ids[1][2]");
    unwatch();
    l2l_tensor_free(bad);
  }
  l2l_tensor *t3 = check_randn(1.0, 3, V, 5, 1), *t1 = check_randn(1.0, 1, V * 5);
  l2l_tensor *o6 = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 6)),
             *o4 = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 4));
  l2l_tensor *ofl = poison(NEW(L2L_POOL_HOST, L2L_F32, 30)), *tt = check_randn(1.0, 2, 5, V);
  l2l_tensor *half = remake(table, L2L_POOL_HOST, L2L_BF16),
             *dhalf = remake(table, L2L_POOL_HOST, L2L_F16);
  l2l_tensor *i7 = IDS(V, 7), *wide = check_randn(1.0, 2, 8, 5);
  l2l_tensor *in_out = view(wide, 0, V), *mid = view(wide, 2, 6), *rows = RESHAPED(mid, 2, 3, 5);
  WATCH(t3, t1, o6, o4, ofl, tt, half, dhalf, i7, wide);
  REFUSES(l2l_embedding_forward(out, ids, t3), L2L_ERR_INVALID, "(V, C)");
  REFUSES(l2l_embedding_forward(out, ids, t1), L2L_ERR_INVALID, "(V, C)");
  REFUSES(l2l_embedding_forward(o6, ids, table), L2L_ERR_INVALID, "out has 36 elements");
  REFUSES(l2l_embedding_forward(o4, ids, table), L2L_ERR_INVALID, "out has 24 elements");
  REFUSES(l2l_embedding_forward(ofl, ids, table), L2L_ERR_INVALID, "last dim");
  REFUSES(l2l_embedding_forward(out, ids, tt), L2L_ERR_INVALID, "out has 30 elements, need 42");
  REFUSES(l2l_embedding_forward(out, i7, table), L2L_ERR_INVALID, "out has 30 elements, need 35");
  REFUSES(l2l_embedding_forward(rows, ids, in_out), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_embedding_backward(dhalf, dout, ids), L2L_ERR_INVALID, "dtable is f16");
  REFUSES(l2l_embedding_backward(t3, dout, ids), L2L_ERR_INVALID, "(V, C)");
  REFUSES(l2l_embedding_backward(dtable, o6, ids), L2L_ERR_INVALID, "dout has 36 elements");
  REFUSES(l2l_embedding_backward(in_out, rows, ids), L2L_ERR_INVALID, "overlaps");
  CHECK_OK(l2l_embedding_forward(out, ids, half)); /* a 16-bit table is gathered */
  poison(out);

  /* cross-entropy: targets in [0, V) or the ignore index, one per row */
  l2l_tensor *losses = poison(NEW(L2L_POOL_HOST, L2L_F32, 4)), *logits = check_randn(1.0, 2, 4, V);
  l2l_tensor *targets = IDS(V, 4), *dlogits = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, V));
  l2l_tensor *cf[3] = {losses, logits, targets}, *cb[3] = {dlogits, logits, targets};
  SWEEP("l2l_cross_entropy_forward", call_ce_forward, cf, {"losses", false}, {"logits", false},
        {"targets", false});
  SWEEP("l2l_cross_entropy_backward", call_ce_backward, cb, {"dlogits", false}, {"logits", false},
        {"targets", false});
  poison(losses), poison(dlogits);
  WATCH(losses, dlogits);
  const int32_t bad_targets[] = {V, -2, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof bad_targets / sizeof bad_targets[0]; i++) {
    l2l_tensor *bad = IDS(V, 4);
    ((int32_t *)l2l_tensor_data(bad))[3] = bad_targets[i];
    WATCH(bad);
    REFUSES(l2l_cross_entropy_forward(losses, logits, bad, -1), L2L_ERR_INVALID, "targets[3]");
    REFUSES(l2l_cross_entropy_backward(dlogits, logits, bad, -1, 1), L2L_ERR_INVALID, "targets[3]");
    unwatch();
    WATCH(losses, dlogits);
    l2l_tensor_free(bad);
  }
  /* -1 is a target like any when the ignore index is another */
  ((int32_t *)l2l_tensor_data(targets))[0] = -1;
  REFUSES(l2l_cross_entropy_forward(losses, logits, targets, -100), L2L_ERR_INVALID, "targets[0]");
  REFUSES(l2l_cross_entropy_forward(losses, logits, targets, INT32_MIN), L2L_ERR_INVALID,
          "targets[0]");
  l2l_tensor *l5 = poison(NEW(L2L_POOL_HOST, L2L_F32, 5)), *tg5 = IDS(V, 5),
             *lt = check_randn(1.0, 2, V, 4);
  l2l_tensor *dlt = poison(NEW(L2L_POOL_HOST, L2L_F32, V, 4)),
             *dl8 = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, V + 1));
  l2l_tensor *tg2 = IDS(V, 2, 2);
  WATCH(l5, tg5, lt, dlt, dl8, tg2);
  REFUSES(l2l_cross_entropy_forward(l5, logits, targets, -1), L2L_ERR_INVALID, "losses has 5");
  REFUSES(l2l_cross_entropy_forward(losses, logits, tg5, -1), L2L_ERR_INVALID, "targets has 5");
  REFUSES(l2l_cross_entropy_forward(losses, lt, targets, -1), L2L_ERR_INVALID, "targets has 4");
  REFUSES(l2l_cross_entropy_backward(dlt, logits, targets, -1, 1), L2L_ERR_INVALID, "last dim");
  REFUSES(l2l_cross_entropy_backward(dl8, logits, targets, -1, 1), L2L_ERR_INVALID,
          "dlogits has 32");
  REFUSES(l2l_cross_entropy_backward(dlogits, logits, tg5, -1, 1), L2L_ERR_INVALID,
          "targets has 5");
  REFUSES(l2l_cross_entropy_backward(logits, logits, targets, -1, 1), L2L_ERR_INVALID, "overlaps");
  const float not_finite[] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < 3; i++)
    REFUSES(l2l_cross_entropy_backward(dlogits, logits, targets, -1, not_finite[i]),
            L2L_ERR_INVALID, "scale");
  unwatch();
  CHECK_OK(l2l_cross_entropy_forward(losses, logits, targets, -1));
  CHECK_OK(l2l_cross_entropy_forward(losses, logits, tg2, -1)); /* (R) as (2,2): R values */
  FREE(out, ids, table, dtable, dout, t3, t1, o6, o4, ofl, tt, half, dhalf, i7, wide, in_out, mid,
       rows, losses, logits, targets, dlogits, l5, tg5, lt, dlt, dl8, tg2);
}

static l2l_status call_dropout_forward(l2l_tensor *const *t) {
  return l2l_dropout_forward(t[0], t[1], t[2], 0.25f, 1, 2, 0);
}
static l2l_status call_dropout_backward(l2l_tensor *const *t) {
  return l2l_dropout_backward(t[0], t[1], t[2], 0.25f);
}
static l2l_status call_sum(l2l_tensor *const *t) {
  double out;
  return l2l_sum(&out, t[0]);
}
static l2l_status call_max_abs(l2l_tensor *const *t) {
  double out;
  return l2l_max_abs(&out, t[0]);
}
static l2l_status call_norm2(l2l_tensor *const *t) {
  double out;
  return l2l_norm2(&out, t[0]);
}

/* Covers: l2l_dropout_forward, l2l_dropout_backward, l2l_sum, l2l_max_abs, l2l_norm2. */
TEST(misuse_dropout_and_reductions) {
  l2l_tensor *y = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5)),
             *mask = poison(NEW(L2L_POOL_HOST, L2L_U8, 3));
  l2l_tensor *x = check_randn(1.0, 2, 4, 5), *dx = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5));
  l2l_tensor *tf[3] = {y, mask, x};
  SWEEP("l2l_dropout_forward", call_dropout_forward, tf, {"y", false}, {"mask", false},
        {"x", false});
  l2l_tensor *tb[3] = {dx, x, mask};
  SWEEP("l2l_dropout_backward", call_dropout_backward, tb, {"dx", false}, {"dy", false},
        {"mask", false});
  poison(y), poison(dx);
  const float bad_p[] = {1.0f, -0.1f, NAN, INFINITY, -INFINITY, 1.5f, -0.0f - 1e-30f};
  for (size_t i = 0; i < sizeof bad_p / sizeof bad_p[0]; i++) {
    REFUSES(l2l_dropout_forward(y, mask, x, bad_p[i], 1, 2, 0), L2L_ERR_INVALID, "p must");
    REFUSES(l2l_dropout_backward(dx, x, mask, bad_p[i]), L2L_ERR_INVALID, "p must");
  }
  REFUSES(l2l_dropout_forward(y, mask, x, 0.5f, 1, 2, -1), L2L_ERR_INVALID, "first");
  REFUSES(l2l_dropout_forward(y, mask, x, 0.5f, 1, 2, INT64_MIN), L2L_ERR_INVALID, "first");
  l2l_tensor *m2 = poison(NEW(L2L_POOL_HOST, L2L_U8, 2)),
             *m4 = poison(NEW(L2L_POOL_HOST, L2L_U8, 4));
  l2l_tensor *xt = check_randn(1.0, 2, 5, 4), *x21 = check_randn(1.0, 1, 21);
  l2l_tensor *big = check_randn(1.0, 2, 6, 5), *lo = view(big, 0, 4), *hi = view(big, 2, 4);
  WATCH(m2, m4, xt, x21, big);
  REFUSES(l2l_dropout_forward(y, m2, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "mask has 2");
  REFUSES(l2l_dropout_forward(y, m4, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "mask has 4");
  REFUSES(l2l_dropout_forward(y, mask, xt, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_dropout_forward(y, mask, x21, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_dropout_forward(hi, mask, lo, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_dropout_backward(dx, xt, mask, 0.5f), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_dropout_backward(dx, x, m2, 0.5f), L2L_ERR_INVALID, "mask has 2");
  REFUSES(l2l_dropout_backward(lo, hi, mask, 0.5f), L2L_ERR_INVALID, "overlaps");
  /* the largest first: a good call (draw indexes are unsigned) */
  CHECK_OK(l2l_dropout_forward(y, mask, x, 0.5f, UINT64_MAX, UINT64_MAX, INT64_MAX));

  /* reductions: out, and an f32 tensor */
  l2l_tensor *r[1] = {x};
  SWEEP("l2l_sum", call_sum, r, {"x", false});
  SWEEP("l2l_max_abs", call_max_abs, r, {"x", false});
  SWEEP("l2l_norm2", call_norm2, r, {"x", false});
  REFUSES(l2l_sum(NULL, x), L2L_ERR_INVALID, "out");
  REFUSES(l2l_max_abs(NULL, x), L2L_ERR_INVALID, "out");
  REFUSES(l2l_norm2(NULL, x), L2L_ERR_INVALID, "out");
  double value = 12345.0;
  REFUSES(l2l_sum(&value, mask), L2L_ERR_INVALID, "x is u8");
  REFUSES(l2l_max_abs(&value, NULL), L2L_ERR_INVALID, "x is NULL");
  REFUSES(l2l_norm2(&value, JUNK(l2l_tensor)), L2L_ERR_INVALID, "x is not");
  CHECK(value == 12345.0, "*out written by a refused reduction: %g", value);
  unwatch();
  l2l_tensor *dev = remake(x, L2L_POOL_DEVICE, L2L_F32);
  CHECK_OK(l2l_norm2(&value, dev)); /* a device tensor alone is fine */
  CHECK(value == 0.0, "norm of zeros: %g", value);
  FREE(y, mask, x, dx, m2, m4, xt, x21, big, lo, hi, dev);
}

static l2l_status call_adamw(l2l_tensor *const *t) {
  const l2l_adamw_config c = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  return l2l_adamw_update(t[0], t[1], t[2], t[3], &c, 1);
}

/* Covers: l2l_adamw_update. Issue 21's defect: it took a v of shape (5,4) for a (4,5)
   parameter (any state array of the parameter's size, whatever its shape). */
TEST(misuse_adamw) {
  l2l_tensor *p = check_randn(1.0, 2, 4, 5), *m = check_randn(0.1, 2, 4, 5);
  l2l_tensor *v = check_randn(0.1, 2, 4, 5), *g = check_randn(1.0, 2, 4, 5);
  float *vd = check_data(v);
  for (int i = 0; i < 20; i++) vd[i] = fabsf(vd[i]);
  l2l_tensor *t[4] = {p, m, v, g};
  SWEEP("l2l_adamw_update", call_adamw, t, {"param", false}, {"m", false}, {"v", false},
        {"grad", false});
  const l2l_adamw_config ok = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  REFUSES(l2l_adamw_update(p, m, v, g, NULL, 1), L2L_ERR_INVALID, "config");
  struct {
    const char *needle;
    l2l_adamw_config c;
  } bad[] = {
      {"lr = -0.001", {-1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f}},
      {"lr = nan", {NAN, 0.9f, 0.999f, 1e-8f, 0.01f}},
      {"lr = inf", {INFINITY, 0.9f, 0.999f, 1e-8f, 0.01f}},
      {"beta1 = 1", {1e-3f, 1.0f, 0.999f, 1e-8f, 0.01f}},
      {"beta1 = -0.1", {1e-3f, -0.1f, 0.999f, 1e-8f, 0.01f}},
      {"beta1 = nan", {1e-3f, NAN, 0.999f, 1e-8f, 0.01f}},
      {"beta2 = 1", {1e-3f, 0.9f, 1.0f, 1e-8f, 0.01f}},
      {"beta2 = 2", {1e-3f, 0.9f, 2.0f, 1e-8f, 0.01f}},
      {"eps = 0", {1e-3f, 0.9f, 0.999f, 0.0f, 0.01f}},
      {"eps = -1", {1e-3f, 0.9f, 0.999f, -1.0f, 0.01f}},
      {"eps = inf", {1e-3f, 0.9f, 0.999f, INFINITY, 0.01f}},
      {"weight_decay = -0.01", {1e-3f, 0.9f, 0.999f, 1e-8f, -0.01f}},
      {"weight_decay = nan", {1e-3f, 0.9f, 0.999f, 1e-8f, NAN}},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    REFUSES(l2l_adamw_update(p, m, v, g, &bad[i].c, 1), L2L_ERR_INVALID, bad[i].needle);
  const int64_t bad_steps[] = {0, -1, INT64_MIN};
  for (size_t i = 0; i < sizeof bad_steps / sizeof bad_steps[0]; i++)
    REFUSES(l2l_adamw_update(p, m, v, g, &ok, bad_steps[i]), L2L_ERR_INVALID, "step");
  /* every state array has the parameter's shape: transposed, flattened, off by one */
  l2l_tensor *tr = check_randn(0.1, 2, 5, 4), *flat = check_randn(0.1, 1, 20);
  l2l_tensor *more = check_randn(0.1, 2, 4, 6), *less = check_randn(0.1, 2, 3, 5);
  l2l_tensor *extra = check_randn(0.1, 3, 4, 5, 1);
  for (int i = 0; i < 20; i++) check_data(tr)[i] = fabsf(check_data(tr)[i]);
  WATCH(tr, flat, more, less, extra);
  const l2l_tensor *misfits[] = {tr, flat, more, less, extra};
  for (size_t i = 0; i < sizeof misfits / sizeof misfits[0]; i++) {
    l2l_tensor *mf = (l2l_tensor *)misfits[i];
    REFUSES(l2l_adamw_update(p, mf, v, g, &ok, 1), L2L_ERR_INVALID, "m has");
    REFUSES(l2l_adamw_update(p, m, mf, g, &ok, 1), L2L_ERR_INVALID, "v has");
    REFUSES(l2l_adamw_update(p, m, v, mf, &ok, 1), L2L_ERR_INVALID, "grad has");
    /* a parameter of another size makes the others the odd ones out */
    REFUSES(l2l_adamw_update(mf, m, v, g, &ok, 1), L2L_ERR_INVALID,
            l2l_tensor_numel(mf) == 20 ? "but param has shape" : "one per parameter");
  }
  /* no two arrays in one storage */
  REFUSES(l2l_adamw_update(p, m, m, g, &ok, 1), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_adamw_update(p, p, v, g, &ok, 1), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_adamw_update(p, m, v, p, &ok, 1), L2L_ERR_INVALID, "overlaps");
  unwatch();
  CHECK_OK(l2l_adamw_update(p, m, v, g, &ok, INT64_MAX)); /* a late step is a step */
  bool finite = true;
  for (int i = 0; i < 20; i++) finite &= isfinite(check_data(p)[i]);
  CHECK(finite, "AdamW at step INT64_MAX left a non-finite parameter");
  FREE(p, m, v, g, tr, flat, more, less, extra);
}
