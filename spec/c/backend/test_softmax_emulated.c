/* SPDX-License-Identifier: MIT */
/* test_softmax_emulated.c — the GPU's softmax and cross-entropy launchers and kernels
 * (kernels/softmax.cu), their own source run on the CPU by softmax_emulated.cpp, against the
 * CPU backend's ops of the same names.
 *
 * Purpose: cross-entropy runs on the LM head's vocabulary-wide logits in every GPU step and
 * softmax in attention's standard mode; their kernels are changed where no GPU runs them.
 * Here the launchers choose their kernels as on a GPU (a warp a row up to 256 columns, a
 * block a row past it; two blocks, so that each row group walks several rows) at drawn
 * shapes, and every output is held to the CPU's within the GPU tests' tolerances
 * (test_cuda.c's cuda_softmax and cuda_cross_entropy): softmax forward (causal, key masks,
 * Tq against Tk, in place) and backward (in place too); cross-entropy's forward, backward
 * and fused forms at rows ld apart (the padding poisoned, never read nor written), with
 * ignored rows, an ignored real class, -inf logits, dlogits in place of the logits, and the
 * 16-bit dlogits the head's GEMMs read (bit for bit the f32 dlogits rounded, alone or beside
 * them, at addresses 2 bytes off 8 at times).
 * Must never: need a GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cuda_twins.h"
#if L2L_KERNEL_EMULATION
#include "softmax_emulated.h"
#endif

#if L2L_KERNEL_EMULATION

/* ---------------------------------------------------------------- softmax */

static bool softmax_case(int64_t samples, int64_t heads, int64_t tq, int64_t tk, int causal,
                         bool masked) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const int64_t rps = heads * tq, rows = samples * rps, n = rows * tk;
  const float scale = (float)check_rand_uniform(0.1, 1.5);
  char what[200], dims[120];
  snprintf(dims, sizeof dims, "(%lld samples, %lld heads, tq %lld, tk %lld) causal=%d masked=%d",
           (long long)samples, (long long)heads, (long long)tq, (long long)tk, causal, masked);
  bool ok = true;
  float *x = host_normals(n, 3.0);
  uint8_t *mask = NULL;
  if (masked) { /* a sample with every key hidden at times (its rows all 0) */
    mask = malloc((size_t)(samples * tk));
    const int64_t blind = check_rand_int(0, 1) ? check_rand_int(0, samples - 1) : -1;
    for (int64_t i = 0; i < samples * tk; i++)
      mask[i] = i / tk != blind && check_rand_int(0, 3) != 0;
  }
  float *y[2] = {host_floats(n, NAN), host_floats(n, NAN)};
  float *xc = host_floats(n, 0.0f);
  memcpy(xc, x, (size_t)n * sizeof *x);
  ok &= CHECK_OK(cpu->softmax_forward(y[0], x, mask, causal, scale, samples, rps, tq, tk));
  ok &= CHECK(emu_k_softmax_forward(y[1], x, mask, causal, scale, samples, rps, tq, tk, NULL) == 0,
              "%s: the forward's launch", dims);
  snprintf(what, sizeof what, "softmax_forward %s", dims);
  ok &= CHECK_CLOSE(what, y[1], y[0], n, RMS, tol_sum(tk));
  ok &= CHECK(emu_k_softmax_forward(xc, xc, mask, causal, scale, samples, rps, tq, tk, NULL) == 0,
              "%s: the forward's launch in place", dims);
  snprintf(what, sizeof what, "softmax_forward in place %s", dims);
  ok &= CHECK_CLOSE(what, xc, y[0], n, RMS, tol_sum(tk));

  /* backward from the CPU's y; dx in place of dy too */
  float *dy = host_normals(n, 1.0), *dx[2] = {host_floats(n, NAN), host_floats(n, NAN)};
  ok &= CHECK_OK(cpu->softmax_backward(dx[0], dy, y[0], scale, rows, tk));
  const double dx_floor = cancelling_floor(dx[0], 1, n, n, scale);
  ok &= CHECK(emu_k_softmax_backward(dx[1], dy, y[0], scale, rows, tk, NULL) == 0,
              "%s: the backward's launch", dims);
  snprintf(what, sizeof what, "softmax_backward %s", dims);
  ok &= CHECK_CLOSE(what, dx[1], dx[0], n, dx_floor, tol_sum(tk));
  ok &= CHECK(emu_k_softmax_backward(dy, dy, y[0], scale, rows, tk, NULL) == 0,
              "%s: the backward's launch in place", dims);
  snprintf(what, sizeof what, "softmax_backward in place %s", dims);
  ok &= CHECK_CLOSE(what, dy, dx[0], n, dx_floor, tol_sum(tk));
  free(x), free(mask), free(y[0]), free(y[1]), free(xc), free(dy), free(dx[0]), free(dx[1]);
  return ok;
}

/* ---------------------------------------------------------------- cross-entropy */

static bool cross_entropy_case(int64_t rows, int64_t vocab) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const int64_t ld = vocab + (check_rand_int(0, 1) ? check_rand_int(1, 9) : 0), n = rows * ld;
  const l2l_dtype t = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  /* -100 or -1 (not a class), or a real class ignored (where another is left) */
  const int32_t ignore = vocab > 1 && check_rand_int(0, 2) == 0 ? (int32_t)check_rand_int(0, vocab - 1)
                                                   : check_rand_int(0, 1) ? -100 : -1;
  char what[200], dims[120];
  snprintf(dims, sizeof dims, "(%lld, %lld) ld %lld ignore %d", (long long)rows, (long long)vocab,
           (long long)ld, ignore);
  bool ok = true;
  /* logits: NaN in the padding (read, it would poison the row); -inf at times (a class
     masked out), never at a row's target */
  float *logits = host_floats(n, NAN);
  int32_t *targets = malloc((size_t)rows * sizeof *targets);
  int64_t real = 0;
  const double spread = check_rand_uniform(0.5, 8.0);
  for (int64_t r = 0; r < rows; r++) {
    const bool ignored = rows > 1 && check_rand_int(0, 3) == 0;
    do targets[r] = ignored ? ignore : (int32_t)check_rand_int(0, vocab - 1);
    while (!ignored && targets[r] == ignore);
    real += !ignored;
    const bool holes = check_rand_int(0, 2) == 0;
    for (int64_t c = 0; c < vocab; c++)
      logits[r * ld + c] = holes && c != targets[r] && check_rand_int(0, 7) == 0
                               ? -INFINITY
                               : (float)(spread * check_rand_normal());
  }
  const float scale = 1.0f / (float)(real > 0 ? real : 1);

  /* the CPU's losses and dlogits */
  float *losses0 = host_floats(rows, NAN), *dl0 = host_floats(n, NAN);
  ok &= CHECK_OK(cpu->cross_entropy_forward(losses0, logits, targets, ignore, rows, vocab, ld));
  ok &= CHECK_OK(cpu->cross_entropy_backward(dl0, logits, targets, ignore, scale, rows, vocab, ld));
  const double tol = tol_sum(vocab);
  const double loss_floor = cancelling_floor(losses0, 1, rows, rows, 1.0),
               dl_floor = cancelling_floor(dl0, rows, vocab, ld, scale);

  /* forward and backward alone; the f32 dlogits 0 to 3 floats off the logits' alignment
     (the kernels' scalar stores) */
  const int64_t off = check_rand_int(0, 3);
  float *losses = host_floats(rows, NAN), *dl_buf = host_floats(n + 3, NAN), *dl = dl_buf + off;
  ok &= CHECK(emu_k_cross_entropy_forward(losses, logits, targets, ignore, rows, vocab, ld, NULL) == 0,
              "%s: the forward's launch", dims);
  snprintf(what, sizeof what, "cross_entropy_forward %s", dims);
  ok &= CHECK_CLOSE(what, losses, losses0, rows, loss_floor, tol);
  ok &= CHECK(emu_k_cross_entropy_backward(dl, logits, targets, ignore, scale, rows, vocab, ld,
                                           NULL) == 0,
              "%s: the backward's launch", dims);
  snprintf(what, sizeof what, "cross_entropy_backward %s", dims);
  ok &= CHECK_COLS(what, dl, dl0, rows, vocab, ld, dl_floor, tol);
  ok &= padding_kept(what, dl, false, rows, vocab, ld);

  /* fused: losses, dlogits and their 16-bit copy; then losses and the 16-bit copy alone;
     then in place of the logits, with the 16-bit copy */
  /* (16-bit outputs 2 bytes past an 8-byte boundary at times: the kernels' unpacked stores) */
  struct host_buf hb = host_poisoned(n, 2, check_rand_int(0, 1));
  struct host_buf alone_b = host_poisoned(n, 2, check_rand_int(0, 1));
  struct host_buf inplace16_b = host_poisoned(n, 2, check_rand_int(0, 1));
  uint16_t *h = hb.at, *alone = alone_b.at, *inplace16 = inplace16_b.at;
  float *dl2_buf = host_floats(n + 3, NAN), *dl2 = dl2_buf + off;
  float *losses2 = host_floats(rows, NAN), *losses3 = host_floats(rows, NAN);
  ok &= CHECK(emu_k_cross_entropy_fused(losses, dl2, h, (int)t, logits, targets, ignore, scale, rows,
                                        vocab, ld, NULL) == 0,
              "%s: the fused launch", dims);
  snprintf(what, sizeof what, "cross_entropy_fused %s: losses", dims);
  ok &= CHECK_CLOSE(what, losses, losses0, rows, loss_floor, tol);
  snprintf(what, sizeof what, "cross_entropy_fused %s: dlogits", dims);
  ok &= CHECK_COLS(what, dl2, dl0, rows, vocab, ld, dl_floor, tol);
  ok &= padding_kept(what, dl2, false, rows, vocab, ld);
  snprintf(what, sizeof what, "cross_entropy_fused %s: dlogits16 (%s) beside dlogits", dims,
           l2l_dtype_name(t));
  ok &= CHECK_ROUNDED16(what, h, dl2, rows, vocab, ld, t) && padding_kept(what, h, true, rows, vocab, ld);

  ok &= CHECK(emu_k_cross_entropy_fused(losses2, NULL, alone, (int)t, logits, targets, ignore, scale,
                                        rows, vocab, ld, NULL) == 0,
              "%s: the fused launch, 16 bits alone", dims);
  snprintf(what, sizeof what, "cross_entropy_fused %s: losses beside dlogits16 alone", dims);
  ok &= CHECK_CLOSE(what, losses2, losses0, rows, loss_floor, tol);
  snprintf(what, sizeof what, "cross_entropy_fused %s: dlogits16 (%s) alone", dims,
           l2l_dtype_name(t));
  ok &= CHECK_ROUNDED16(what, alone, dl2, rows, vocab, ld, t) &&
        padding_kept(what, alone, true, rows, vocab, ld);

  float *in_place = host_floats(n, NAN);
  memcpy(in_place, logits, (size_t)n * sizeof *logits);
  ok &= CHECK(emu_k_cross_entropy_fused(losses3, in_place, inplace16, (int)t, in_place, targets,
                                        ignore, scale, rows, vocab, ld, NULL) == 0,
              "%s: the fused launch in place", dims);
  snprintf(what, sizeof what, "cross_entropy_fused in place %s: losses", dims);
  ok &= CHECK_CLOSE(what, losses3, losses0, rows, loss_floor, tol);
  snprintf(what, sizeof what, "cross_entropy_fused in place %s: dlogits", dims);
  ok &= CHECK_COLS(what, in_place, dl0, rows, vocab, ld, dl_floor, tol);
  ok &= padding_kept(what, in_place, false, rows, vocab, ld);
  snprintf(what, sizeof what, "cross_entropy_fused in place %s: dlogits16 (%s)", dims,
           l2l_dtype_name(t));
  ok &= CHECK_ROUNDED16(what, inplace16, dl2, rows, vocab, ld, t);

  free(logits), free(targets), free(losses0), free(dl0), free(losses), free(dl_buf), free(hb.base);
  free(alone_b.base), free(inplace16_b.base), free(dl2_buf), free(losses2), free(losses3);
  free(in_place);
  return ok;
}

#endif /* L2L_KERNEL_EMULATION */

TEST(softmax_kernels_emulated_against_the_cpu) {
#if !L2L_KERNEL_EMULATION
  check_skip(NO_KERNEL_EMULATION);
#else
  /* key lengths for a warp a row (<= 256) and a block a row; query lengths below, at and
     above them (causal: the first rows may see no key) */
#ifdef L2L_TSAN
  const int cases = 2;
#else
  const int cases = 6;
#endif
  int failed = 0;
  for (int i = 0; i < cases && failed < 2; i++) {
    const int64_t tk = i % 2 ? check_rand_int(257, 1500) : check_rand_int(1, 256);
    const int64_t tq = check_rand_int(0, 2) == 0 ? tk : check_rand_int(1, 40);
    const int64_t heads = check_rand_int(1, 3), samples = check_rand_int(1, 3);
    if (samples * heads * tq > 200) { i--; continue; } /* (rows enough to walk several each) */
    failed += !softmax_case(samples, heads, tq, tk, check_rand_int(0, 1), check_rand_int(0, 1));
  }
#endif
}

TEST(cross_entropy_kernels_emulated_against_the_cpu) {
#if !L2L_KERNEL_EMULATION
  check_skip(NO_KERNEL_EMULATION);
#else
  /* vocabularies for a warp a row (<= 256) and a block a row (up to 1024 threads), the rows
     cached on chip (softmax_emulated.cpp: up to 56 KiB, 14,330 floats; past 48 KiB, 12,282
     floats, by the attribute) or streamed (past it); rows past the 16 warps of two blocks,
     fewer for the long rows */
  static const struct {
    int64_t lo, hi, most_rows;
  } vocabs[] = {{1, 3, 40}, {4, 256, 40}, {257, 4000, 40}, {12300, 14300, 3}, {14400, 16000, 3}};
#ifdef L2L_TSAN
  const size_t first = 2, last = 2;
  const int64_t row_cap = 6;
#else
  const size_t first = 0, last = sizeof vocabs / sizeof vocabs[0] - 1;
  const int64_t row_cap = 40;
#endif
  int failed = 0;
  for (size_t i = first; i <= last && failed < 2; i++) {
    const int64_t most = vocabs[i].most_rows < row_cap ? vocabs[i].most_rows : row_cap;
    failed += !cross_entropy_case(check_rand_int(1, most), check_rand_int(vocabs[i].lo, vocabs[i].hi));
  }
#endif
}
