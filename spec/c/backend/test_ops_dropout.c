/* SPDX-License-Identifier: MIT */
/* test_ops_dropout.c — dropout of l2l.h's "ops" section, forward and backward: the exact
 * Philox keep decision, the mask bits, a tensor split into row views. test_ops.c says how
 * the op files test (fresh random inputs, references written from l2l.h's formulas,
 * poisoned outputs, refusals that name the argument and change nothing). All test names
 * start with "op_" (`l2l_ctest op_` runs every op file).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_ops.h"

/* ================================================================ dropout */

static uint32_t keep_threshold_ref(float p) {
  return (uint32_t)llround((1.0 - (double)p) * 16777216.0);
}

/* keep[i] for draws first .. first+n-1 of (seed, stream): the draw with index d is word d%4,
   shifted right by 8, of Philox4x32-10 at counter (d/4 as 64 bits, stream as 64 bits)
   under key seed; kept iff below the threshold. */
static void ref_keep(uint8_t *keep, uint64_t seed, uint64_t stream, int64_t first, int64_t n,
                     float p) {
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, words[4] = {0, 0, 0, 0};
  uint32_t threshold = keep_threshold_ref(p);
  uint64_t have = UINT64_MAX;
  for (int64_t i = 0; i < n; i++) {
    uint64_t draw = (uint64_t)first + (uint64_t)i, block = draw / 4;
    if (block != have) {
      uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
      l2l_philox4x32(words, counter, key);
      have = block;
    }
    keep[i] = (words[draw % 4] >> 8) < threshold;
  }
}

static int mask_bit(const l2l_tensor *mask, int64_t i) {
  return (((const uint8_t *)l2l_tensor_data(mask))[i / 8] >> (i % 8)) & 1;
}

/* Runs dropout on x and checks mask bits against ref_keep and y against x / (1 - p) or 0.
   Returns the number kept. */
static int64_t dropout_case(l2l_tensor *x, float p, uint64_t seed, uint64_t stream, int64_t first) {
  int64_t n = numel(x);
  l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, l2l_tensor_ndim(x),
                               (const int64_t[]){l2l_tensor_dim(x, 0), l2l_tensor_dim(x, 1),
                                                 l2l_tensor_dim(x, 2), l2l_tensor_dim(x, 3)});
  l2l_tensor *mask = U8((n + 7) / 8);
  uint8_t *keep = xmalloc((size_t)n);
  ref_keep(keep, seed, stream, first, n, p);
  check_poison(y);
  memset(l2l_tensor_data(mask), 0xA5, (size_t)((n + 7) / 8));
  CHECK_OK(l2l_dropout_forward(y, mask, x, p, seed, stream, first));
  int64_t bad_bits = 0, first_bad = -1, kept = 0, bad_y = 0;
  const float *xd = check_data(x), *yd = check_data(y);
  enum { CHUNK = 1 << 16 };
  double *want = doubles(CHUNK);
  float *got = xmalloc(CHUNK * sizeof(float));
  double worst = 0.0;
  for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
    int64_t len = n - i0 < CHUNK ? n - i0 : CHUNK;
    for (int64_t i = i0; i < i0 + len; i++) {
      int bit = mask_bit(mask, i);
      if (bit != keep[i]) bad_bits++, first_bad = first_bad < 0 ? i : first_bad;
      kept += bit;
      /* y consistent with the op's own mask bit, x / (1 - p) or exactly 0. */
      want[i - i0] = bit ? (double)xd[i] / (1.0 - (double)p) : 0.0;
      got[i - i0] = yd[i];
      bad_y += !bit && yd[i] != 0.0f;
    }
    double e = check_rel_err(got, want, len, 1e-6);
    worst = e > worst ? e : worst;
  }
  CHECK(bad_bits == 0, "dropout p=%g n=%lld first=%lld: %lld keep decisions differ from Philox, "
        "first at %lld", p, (long long)n, (long long)first, (long long)bad_bits, (long long)first_bad);
  /* x * (1/(1-p)) in f32: two roundings. */
  CHECK(worst <= TOL_ROUNDED && bad_y == 0,
        "dropout p=%g: y inconsistent with x and the mask (rel err %.3g, %lld dropped not 0)", p,
        worst, (long long)bad_y);
  free(keep);
  free(want);
  free(got);
  FREE(y, mask);
  return kept;
}

static uint64_t rand_seed(void) { return check_rand_u64(); }

TEST(op_dropout_forward) {
  static const int64_t shapes[][4] = {{1}, {3, 7}, {13, 31}, {2, 3, 5, 7}, {257, 131}};
  static const int nds[] = {1, 2, 2, 4, 2};
  int64_t kept_total = 0, dropped_total = 0;
  for (int s = 0; s < 5; s++) {
    l2l_tensor *x = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    int64_t n = numel(x);
    const float ps[] = {0.1f, 0.5f, 0.9f, (float)check_rand_uniform(0.01, 0.99), 1e-7f, 0.999f};
    for (int k = 0; k < 6; k++) {
      /* first and stream up to 2^40 and 2^64: the counter's high words matter. */
      int64_t first = check_rand_int(0, INT64_C(1) << 40);
      int64_t kept = dropout_case(x, ps[k], rand_seed(), rand_seed(), first);
      kept_total += kept;
      dropped_total += n - kept;
    }
    /* p = 0 keeps everything, y == x exactly. */
    l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    l2l_tensor *mask = U8((n + 7) / 8);
    check_poison(y);
    memset(l2l_tensor_data(mask), 0x00, (size_t)((n + 7) / 8)); /* all bits must get set */
    CHECK_OK(l2l_dropout_forward(y, mask, x, 0.0f, rand_seed(), rand_seed(), 0));
    int64_t lost = 0;
    for (int64_t i = 0; i < n; i++)
      lost += !mask_bit(mask, i) || check_data(y)[i] != check_data(x)[i];
    CHECK(lost == 0, "dropout p=0: %lld of %lld elements not kept as they were", (long long)lost,
          (long long)n);
    /* y may be x. */
    float *x0 = snapshot(x);
    float p = 0.3f;
    uint64_t seed = rand_seed(), stream = rand_seed();
    uint8_t *keep = xmalloc((size_t)n);
    ref_keep(keep, seed, stream, 7, n, p);
    CHECK_OK(l2l_dropout_forward(x, mask, x, p, seed, stream, 7));
    double *want = doubles(n);
    for (int64_t i = 0; i < n; i++) want[i] = keep[i] ? (double)x0[i] / (1.0 - (double)p) : 0.0;
    CHECK_CLOSE("dropout in place", check_data(x), want, n, 1e-6, TOL_ROUNDED);
    free(want);
    free(keep);
    free(x0);
    FREE(x, y, mask);
  }
  CHECK(kept_total > 0 && dropped_total > 0, "kept %lld, dropped %lld", (long long)kept_total,
        (long long)dropped_total);
}

TEST(op_dropout_large) {
  /* 16.8M elements: every keep decision checked, and the kept fraction near 1 - p. */
  int64_t side = 4099, n = side * side;
  l2l_tensor *x = fill_uniform(F32(side, side), 0.5, 2.0);
  float p = 0.3f;
  int64_t kept = dropout_case(x, p, rand_seed(), rand_seed(), check_rand_int(0, 1 << 30));
  double frac = (double)kept / (double)n, sigma = sqrt(p * (1.0 - p) / (double)n);
  CHECK(fabs(frac - (1.0 - p)) < 6.0 * sigma, "kept fraction %.6f, want %.6f +- %.2g", frac,
        1.0 - p, 6.0 * sigma);
  FREE(x);
}

TEST(op_dropout_split) {
  /* Dropout over a whole (R, C) tensor equals dropout over two row views, each with first
     advanced by the view's offset: the same y, the same mask bits. C odd so the split lands
     inside a mask byte. */
  int64_t rows = 31, cols = 13, n = rows * cols;
  for (int rep = 0; rep < 3; rep++) {
    float p = (float)check_rand_uniform(0.05, 0.95);
    uint64_t seed = rand_seed(), stream = rand_seed();
    int64_t first = check_rand_int(0, INT64_C(1) << 36);
    int64_t split = check_rand_int(1, rows - 1);
    l2l_tensor *x = RANDN(1.0, rows, cols), *y = F32(rows, cols), *mask = U8((n + 7) / 8);
    l2l_tensor *y2 = F32(rows, cols), *x_top = NULL, *x_bot = NULL, *y_top = NULL, *y_bot = NULL;
    CHECK_OK(l2l_tensor_view_rows(&x_top, x, 0, split));
    CHECK_OK(l2l_tensor_view_rows(&x_bot, x, split, rows - split));
    CHECK_OK(l2l_tensor_view_rows(&y_top, y2, 0, split));
    CHECK_OK(l2l_tensor_view_rows(&y_bot, y2, split, rows - split));
    int64_t n_top = split * cols, n_bot = n - n_top;
    l2l_tensor *m_top = U8((n_top + 7) / 8), *m_bot = U8((n_bot + 7) / 8);
    check_poison(y);
    check_poison(y2);
    /* Masks can't hold NaN: opposite fills, so bits left unwritten could not agree. */
    memset(l2l_tensor_data(mask), 0x00, (size_t)((n + 7) / 8));
    memset(l2l_tensor_data(m_top), 0xFF, (size_t)((n_top + 7) / 8));
    memset(l2l_tensor_data(m_bot), 0xFF, (size_t)((n_bot + 7) / 8));
    CHECK_OK(l2l_dropout_forward(y, mask, x, p, seed, stream, first));
    CHECK_OK(l2l_dropout_forward(y_top, m_top, x_top, p, seed, stream,
                                 first + l2l_tensor_offset(x_top)));
    CHECK_OK(l2l_dropout_forward(y_bot, m_bot, x_bot, p, seed, stream,
                                 first + l2l_tensor_offset(x_bot)));
    CHECK(l2l_tensor_offset(x_bot) == n_top, "view offset %lld", (long long)l2l_tensor_offset(x_bot));
    CHECK(memcmp(check_data(y), check_data(y2), (size_t)n * sizeof(float)) == 0,
          "dropout split at row %lld: y differs from the whole", (long long)split);
    int64_t bad = 0, kept = 0;
    for (int64_t i = 0; i < n; i++) {
      int part = i < n_top ? mask_bit(m_top, i) : mask_bit(m_bot, i - n_top);
      bad += part != mask_bit(mask, i);
      kept += part;
    }
    CHECK(bad == 0, "dropout split: %lld mask bits differ", (long long)bad);
    CHECK(kept > 0 && kept < n, "kept %lld of %lld", (long long)kept, (long long)n);
    FREE(x, y, mask, y2, x_top, x_bot, y_top, y_bot, m_top, m_bot);
  }
}

TEST(op_dropout_backward) {
  static const int64_t shapes[][4] = {{1}, {3, 7}, {13, 31}, {2, 3, 5, 7}, {257, 131}};
  static const int nds[] = {1, 2, 2, 4, 2};
  for (int s = 0; s < 5; s++) {
    l2l_tensor *x = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    l2l_tensor *y = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    l2l_tensor *dy = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]), 1.0);
    l2l_tensor *dx = check_tensor(L2L_POOL_HOST, L2L_F32, nds[s], shapes[s]);
    int64_t n = numel(x);
    l2l_tensor *mask = U8((n + 7) / 8);
    const float ps[] = {0.0f, (float)check_rand_uniform(0.05, 0.95)};
    for (int k = 0; k < 2; k++) {
      CHECK_OK(l2l_dropout_forward(y, mask, x, ps[k], rand_seed(), rand_seed(), 0));
      double *want = doubles(n);
      for (int64_t i = 0; i < n; i++)
        want[i] = mask_bit(mask, i) ? (double)check_data(dy)[i] / (1.0 - (double)ps[k]) : 0.0;
      check_poison(dx);
      CHECK_OK(l2l_dropout_backward(dx, dy, mask, ps[k]));
      /* dy * (1/(1-p)) in f32: two roundings; dropped elements exactly 0. */
      CHECK_CLOSE("dropout_backward", check_data(dx), want, n, 1e-6, TOL_ROUNDED);
      int64_t nonzero = 0;
      for (int64_t i = 0; i < n; i++) nonzero += !mask_bit(mask, i) && check_data(dx)[i] != 0.0f;
      CHECK(nonzero == 0, "dropout_backward: %lld dropped elements not 0", (long long)nonzero);
      free(want);
    }
    FREE(x, y, dy, dx, mask);
  }
}

TEST(op_dropout_errors) {
  l2l_tensor *x = RANDN(1.0, 3, 7), *y = RANDN(1.0, 3, 7), *mask = U8(3), *mask_f = F32(3);
  l2l_tensor *mask4 = U8(4), *yt = F32(7, 3), *xi = I32(3, 7), *dev = DEV_F32(3, 7);
  l2l_tensor *v0 = NULL, *v1 = NULL, *dx = RANDN(1.0, 3, 7);
  CHECK_OK(l2l_tensor_view_rows(&v0, x, 0, 2));
  CHECK_OK(l2l_tensor_view_rows(&v1, x, 1, 2));
  l2l_tensor *mask2 = U8(2);
  memset(l2l_tensor_data(mask), 0x5A, 3);
  float *y0 = snapshot(y), *x0 = snapshot(x), *dx0 = snapshot(dx);
  uint8_t *mask0 = snapshot(mask);
  CHECK_FAILS(l2l_dropout_forward(NULL, mask, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "y is NULL");
  CHECK_FAILS(l2l_dropout_forward(y, NULL, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "mask is NULL");
  CHECK_FAILS(l2l_dropout_forward(y, mask, NULL, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "x is NULL");
  CHECK_FAILS(l2l_dropout_forward(y, mask_f, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "mask is f32");
  CHECK_FAILS(l2l_dropout_forward(y, mask, xi, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "x is i32");
  CHECK_FAILS(l2l_dropout_forward(y, mask, x, 1.0f, 1, 2, 0), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_forward(y, mask, x, -0.1f, 1, 2, 0), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_forward(y, mask, x, NAN, 1, 2, 0), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_forward(y, mask, x, 0.5f, 1, 2, -1), L2L_ERR_INVALID, "first");
  CHECK_FAILS(l2l_dropout_forward(yt, mask, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "y has shape (7,3)");
  CHECK_FAILS(l2l_dropout_forward(y, mask4, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID,
              "mask has 4 elements");
  CHECK_FAILS(l2l_dropout_forward(y, mask, dev, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK_FAILS(l2l_dropout_forward(v1, mask2, v0, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "y overlaps x");
  CHECK(same_bytes(y, y0) && same_bytes(x, x0) && same_bytes(mask, mask0),
        "a refused dropout_forward changed an output");
  CHECK_FAILS(l2l_dropout_backward(NULL, y, mask, 0.5f), L2L_ERR_INVALID, "dx is NULL");
  CHECK_FAILS(l2l_dropout_backward(dx, NULL, mask, 0.5f), L2L_ERR_INVALID, "dy is NULL");
  CHECK_FAILS(l2l_dropout_backward(dx, y, NULL, 0.5f), L2L_ERR_INVALID, "mask is NULL");
  CHECK_FAILS(l2l_dropout_backward(dx, y, mask_f, 0.5f), L2L_ERR_INVALID, "mask is f32");
  CHECK_FAILS(l2l_dropout_backward(dx, y, mask, 1.0f), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_backward(dx, y, mask, -0.5f), L2L_ERR_INVALID, "p must");
  CHECK_FAILS(l2l_dropout_backward(yt, y, mask, 0.5f), L2L_ERR_INVALID, "dx has shape (7,3)");
  CHECK_FAILS(l2l_dropout_backward(dx, y, mask4, 0.5f), L2L_ERR_INVALID, "mask has 4 elements");
  CHECK_FAILS(l2l_dropout_backward(dx, dev, mask, 0.5f), L2L_ERR_INVALID, "device");
  CHECK_POOLS_NAMED();
  CHECK(same_bytes(dx, dx0), "a refused dropout_backward changed dx");
  free(y0);
  free(x0);
  free(dx0);
  free(mask0);
  FREE(x, y, mask, mask_f, mask4, yt, xi, dev, v0, v1, dx, mask2);
}
