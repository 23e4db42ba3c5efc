/* SPDX-License-Identifier: MIT */
/* test_gelu_emulated.c — the GPU's GELU launchers and kernels (kernels/gelu.cu), their own
 * source run on the CPU by gelu_emulated.cpp, against the CPU backend's GELU ops.
 *
 * Purpose: GELU runs in every block of a GPU step (fused with the bias, its side bits for
 * the frugal backward, and the 16-bit copy the next GEMM reads), and its kernels are changed
 * where no GPU runs them. Here the launchers choose their paths as on a GPU (float4 quads
 * where every pointer is 16-byte aligned, else scalars; the fused form's two float4s a byte
 * where the columns are a multiple of 8) at drawn shapes and alignments, with three blocks,
 * so that the threads walk several grid strides, and every output is held to the CPU's
 * within the GPU tests' tolerances (test_cuda.c's cuda_gelu, test_cuda_layers.c's): the
 * forward (in place too), the backward from x and from the output and side bits (dx in place
 * of dy; dx16 beside dx and alone, at addresses 2 bytes off 8 at times), the side bits bit
 * for bit, and the fused bias + GELU with and without the bias, y in place of pre or absent,
 * y16, bits or none.
 * Must never: need a GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cuda_twins.h"
#if L2L_KERNEL_EMULATION
#include "gelu_emulated.h"
#endif

#if L2L_KERNEL_EMULATION

/* x: normal draws at 2, some at GELU's minimum and around it, and the specials. */
static void gelu_inputs(float *x, int64_t n) {
  const float specials[] = {L2L_GELU_XMIN, nextafterf(L2L_GELU_XMIN, 0.0f),
                            nextafterf(L2L_GELU_XMIN, -1.0f), 0.0f, -0.0f, 10.0f, -10.0f,
                            30.0f, -30.0f, 87.0f, -87.0f, 1e-30f, -1e-30f, 3.0f, -3.0f};
  for (int64_t i = 0; i < n; i++)
    x[i] = check_rand_int(0, 7) == 0 ? L2L_GELU_XMIN + (float)check_rand_uniform(-0.01, 0.01)
                                     : (float)(2.0 * check_rand_normal());
  for (int64_t i = 0; i < n && i < (int64_t)(sizeof specials / sizeof specials[0]); i++)
    x[check_rand_int(0, n - 1)] = specials[i];
}

static bool bits_equal(const char *what, const uint8_t *got, const uint8_t *want, int64_t n) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++)
    if (got[i] != want[i]) bad++, first = first < 0 ? i : first;
  return CHECK(bad == 0, "%s: %lld of %lld bytes differ, first [%lld]: %#x, want %#x", what,
               (long long)bad, (long long)n, (long long)first, first < 0 ? 0u : got[first],
               first < 0 ? 0u : want[first]);
}

/* One shape: every launcher, both sides. `shift`: the f32 buffers 4 bytes off alignment. */
static bool gelu_case(int64_t rows, int64_t cols, int64_t shift) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const int64_t n = rows * cols, nb = (n + 7) / 8;
  const l2l_dtype t = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  char what[200], dims[100];
  snprintf(dims, sizeof dims, "(%lld, %lld)%s %s", (long long)rows, (long long)cols,
           shift ? " unaligned" : "", l2l_dtype_name(t));
  bool ok = true;
  struct host_buf xb = host_poisoned(n, 4, shift), yb = host_poisoned(n, 4, shift);
  struct host_buf dyb = host_poisoned(n, 4, shift), dxb = host_poisoned(n, 4, shift);
  struct host_buf h1 = host_poisoned(n, 2, check_rand_int(0, 1));
  struct host_buf h2 = host_poisoned(n, 2, check_rand_int(0, 1));
  float *x = xb.at, *y = yb.at, *dy = dyb.at, *dx = dxb.at;
  uint16_t *dx16 = h1.at, *alone16 = h2.at;
  gelu_inputs(x, n);
  for (int64_t i = 0; i < n; i++) /* |dy| in [0.5, 1.5]: compared at floor 1 */
    dy[i] = (float)((check_rand_int(0, 1) ? 1 : -1) * check_rand_uniform(0.5, 1.5));
  float *want = host_floats(n, NAN), *want2 = host_floats(n, NAN), *copy = host_floats(n, NAN);
  uint8_t *bits = malloc((size_t)nb), *want_bits = malloc((size_t)nb);

  /* forward, and in place */
  ok &= CHECK_OK(cpu->gelu_forward(want, x, n));
  ok &= CHECK(emu_k_gelu_forward(y, x, n, NULL) == 0, "%s: gelu_forward's launch", dims);
  snprintf(what, sizeof what, "gelu_forward %s", dims);
  ok &= CHECK_CLOSE(what, y, want, n, RMS, TOL_F32);
  memcpy(dx, x, (size_t)n * 4);
  ok &= CHECK(emu_k_gelu_forward(dx, dx, n, NULL) == 0, "%s: gelu_forward's launch in place", dims);
  snprintf(what, sizeof what, "gelu_forward in place %s", dims);
  ok &= CHECK_CLOSE(what, dx, want, n, RMS, TOL_F32);

  /* backward from x: dx with dx16 beside it, dx16 alone, dx in place of dy */
  ok &= CHECK_OK(cpu->gelu_backward(want, NULL, L2L_F32, dy, x, n));
  ok &= CHECK(emu_k_gelu_backward(dx, dx16, (int)t, dy, x, n, NULL) == 0, "%s: gelu_backward's launch", dims);
  snprintf(what, sizeof what, "gelu_backward %s", dims);
  ok &= CHECK_CLOSE(what, dx, want, n, 1.0, TOL_F32);
  ok &= CHECK_ROUNDED16(what, dx16, dx, 1, n, n, t);
  ok &= CHECK(emu_k_gelu_backward(NULL, alone16, (int)t, dy, x, n, NULL) == 0,
              "%s: gelu_backward's launch, 16 bits alone", dims);
  snprintf(what, sizeof what, "gelu_backward %s, dx16 alone", dims);
  ok &= CHECK_ROUNDED16(what, alone16, dx, 1, n, n, t);
  memcpy(copy, dy, (size_t)n * 4);
  ok &= CHECK(emu_k_gelu_backward(copy, NULL, 0, copy, x, n, NULL) == 0,
              "%s: gelu_backward's launch in place", dims);
  snprintf(what, sizeof what, "gelu_backward in place %s", dims);
  ok &= CHECK_CLOSE(what, copy, want, n, 1.0, TOL_F32);

  /* forward with side bits (the last byte's unused bits 0), then the backward from the CPU's
     output and bits */
  memset(bits, 0xa5, (size_t)nb);
  ok &= CHECK_OK(cpu->gelu_forward_bits(want, want_bits, x, n));
  ok &= CHECK(emu_k_gelu_forward_bits(y, bits, x, n, NULL) == 0, "%s: gelu_forward_bits' launch", dims);
  snprintf(what, sizeof what, "gelu_forward_bits %s: y", dims);
  ok &= CHECK_CLOSE(what, y, want, n, RMS, TOL_F32);
  snprintf(what, sizeof what, "gelu_forward_bits %s: side bits", dims);
  ok &= bits_equal(what, bits, want_bits, nb);
  const struct gelu_slopes *tables = gelu_slopes();
  struct k_gelu_slopes slopes = {.slope = &tables->slope[0][0], .y_left = tables->y_left};
  memcpy(slopes.scale, tables->scale, sizeof slopes.scale);
  memcpy(slopes.origin, tables->origin, sizeof slopes.origin);
  ok &= CHECK_OK(cpu->gelu_backward_from_output(want2, NULL, L2L_F32, dy, want, want_bits, n));
  memset(h1.base, 0xff, (size_t)(n + 1) * 2), memset(h2.base, 0xff, (size_t)(n + 1) * 2);
  ok &= CHECK(emu_k_gelu_backward_from_output(dx, dx16, (int)t, dy, want, want_bits, n, &slopes, NULL) == 0,
              "%s: gelu_backward_from_output's launch", dims);
  snprintf(what, sizeof what, "gelu_backward_from_output %s", dims);
  ok &= CHECK_CLOSE(what, dx, want2, n, 1.0, TOL_GELU_SLOPE);
  ok &= CHECK_ROUNDED16(what, dx16, dx, 1, n, n, t);
  ok &= CHECK(emu_k_gelu_backward_from_output(NULL, alone16, (int)t, dy, want, want_bits, n, &slopes,
                                              NULL) == 0,
              "%s: gelu_backward_from_output's launch, 16 bits alone", dims);
  snprintf(what, sizeof what, "gelu_backward_from_output %s, dx16 alone", dims);
  ok &= CHECK_ROUNDED16(what, alone16, dx, 1, n, n, t);
  memcpy(copy, dy, (size_t)n * 4);
  ok &= CHECK(emu_k_gelu_backward_from_output(copy, NULL, 0, copy, want, want_bits, n, &slopes, NULL) == 0,
              "%s: gelu_backward_from_output's launch in place", dims);
  snprintf(what, sizeof what, "gelu_backward_from_output in place %s", dims);
  ok &= CHECK_CLOSE(what, copy, want2, n, 1.0, TOL_GELU_SLOPE);

  /* bias + GELU: with or without a bias; y apart, in place of pre, or absent (y16 then);
     y16 or none; bits or none */
  struct host_buf biasb = host_poisoned(cols, 4, shift);
  float *bias = biasb.at;
  for (int64_t j = 0; j < cols; j++) bias[j] = (float)check_rand_normal();
  for (int form = 0; form < 6; form++) {
    const bool with_bias = form % 2, with_bits = check_rand_int(0, 1);
    const int y_at = form / 2; /* 0 apart, 1 in place of pre, 2 absent */
    const bool with_y16 = y_at == 2 || check_rand_int(0, 1);
    float *pre = dxb.at, *pre_want = copy;
    memcpy(pre, x, (size_t)n * 4), memcpy(pre_want, x, (size_t)n * 4);
    float *yy = y_at == 0 ? y : y_at == 1 ? pre : NULL;
    if (yy == y) memset(yb.base, 0xff, (size_t)(n + 1) * 4);
    memset(h1.base, 0xff, (size_t)(n + 1) * 2), memset(bits, 0xa5, (size_t)nb);
    ok &= CHECK_OK(cpu->bias_gelu_forward(pre_want, want, NULL, L2L_F32, want_bits,
                                          with_bias ? bias : NULL, rows, cols));
    ok &= CHECK(emu_k_bias_gelu_forward(pre, yy, with_y16 ? dx16 : NULL, (int)t, with_bits ? bits : NULL,
                                        with_bias ? bias : NULL, rows, cols, NULL) == 0,
                "%s: bias_gelu_forward's launch", dims);
    snprintf(what, sizeof what, "bias_gelu_forward %s%s, y %s%s%s", dims, with_bias ? "" : " without a bias",
             y_at == 0 ? "apart" : y_at == 1 ? "in place" : "absent", with_y16 ? ", y16" : "",
             with_bits ? ", bits" : "");
    if (y_at != 1) ok &= CHECK_CLOSE(what, pre, pre_want, n, RMS, TOL_F32); /* pre + bias */
    if (yy) ok &= CHECK_CLOSE(what, yy, want, n, RMS, TOL_F32);
    if (with_y16 && !yy) { /* y16 alone: against the f32 y of the same launch with y apart */
      memcpy(pre, x, (size_t)n * 4);
      ok &= CHECK(emu_k_bias_gelu_forward(pre, y, NULL, 0, NULL, with_bias ? bias : NULL, rows, cols,
                                          NULL) == 0,
                  "%s: bias_gelu_forward's launch, y apart", dims);
    }
    if (with_y16) ok &= CHECK_ROUNDED16(what, dx16, yy ? yy : y, 1, n, n, t);
    if (with_bits) ok &= bits_equal(what, bits, want_bits, nb);
  }
  free(xb.base), free(yb.base), free(dyb.base), free(dxb.base), free(h1.base), free(h2.base);
  free(biasb.base), free(want), free(want2), free(copy), free(bits), free(want_bits);
  return ok;
}

#endif /* L2L_KERNEL_EMULATION */

TEST(gelu_kernels_emulated_against_the_cpu) {
#if !L2L_KERNEL_EMULATION
  check_skip(NO_KERNEL_EMULATION);
#else
  /* columns a multiple of 8 (the fused form's float4 pairs) and not; sizes below a block
     of 256 threads, and past two grid strides of three blocks (a stride of bytes of side
     bits spans 6144 elements: the bias's columns step from one to the next); aligned and
     not */
#ifdef L2L_TSAN
  const int cases = 2;
#else
  const int cases = 6;
#endif
  int failed = 0;
  for (int i = 0; i < cases && failed < 2; i++) {
    int64_t cols = check_rand_int(1, 400);
    if (i % 2 == 0) cols = (cols + 7) / 8 * 8;
    const int64_t rows = i < 2 ? check_rand_int(1, 3) : 12289 / cols + check_rand_int(1, 8);
    failed += !gelu_case(rows, cols, i % 3 == 2);
  }
#endif
}
