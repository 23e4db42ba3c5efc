/* SPDX-License-Identifier: MIT */
/* test_reduce_emulated.c — the GPU's reductions, index checks and embedding kernels
 * (kernels/reduce.cu), their own source run on the CPU by reduce_emulated.cpp, against the
 * CPU backend's ops of the same names.
 *
 * Purpose: the bias gradient (every linear map's, from f32 or 16-bit dy), the gradient
 * norm's sums, the embedding's gather and scatter-add run in every GPU step, and their
 * kernels are changed where no GPU runs them. Here the launchers plan as on a GPU (the bias
 * gradient's row chunks, more than a warp's 32 of them at times; reductions over several
 * parts; warp-per-slice scatter-adds over repeated ids) at drawn shapes, with three blocks
 * for the grid-stride loops, and every output is held to the CPU's: the bias gradient
 * within the GPU test's tolerance (test_cuda.c's cuda_bias_add_and_backward), sums and sums
 * of squares within a double's rounding of the sum of magnitudes, max |x| (NaN included),
 * the first index a check finds, the gather and the scatter-add (the CPU's order of
 * additions) bit for bit.
 * Must never: need a GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cuda_twins.h"
#if L2L_KERNEL_EMULATION
#include "reduce_emulated.h"
#endif

#if L2L_KERNEL_EMULATION

/* dbias += column sums of dy (f32, bf16 or f16), onto the same start on both sides. */
static bool bias_backward_case(int64_t rows, int64_t cols) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const int64_t n = rows * cols;
  static const l2l_dtype types[] = {L2L_F32, L2L_BF16, L2L_F16};
  const l2l_dtype t = types[check_rand_int(0, 2)];
  float *dy = host_normals(n, 1.0), *start = host_normals(cols, 1.0);
  uint16_t *dy16 = malloc((size_t)(n > 0 ? n : 1) * 2);
  for (int64_t i = 0; i < n; i++) dy16[i] = round16(dy[i], t == L2L_F32 ? L2L_BF16 : t);
  const void *src = t == L2L_F32 ? (const void *)dy : dy16;
  float *want = host_floats(cols, 0.0f), *got = host_floats(cols, 0.0f);
  memcpy(want, start, (size_t)cols * 4), memcpy(got, start, (size_t)cols * 4);
  const int64_t scratch_floats = emu_k_bias_backward_scratch_floats(rows, cols);
  float *scratch = host_floats(scratch_floats, NAN);
  char what[160];
  snprintf(what, sizeof what, "bias_backward (%lld, %lld) over %s (%lld floats of scratch)",
           (long long)rows, (long long)cols, l2l_dtype_name(t), (long long)scratch_floats);
  bool ok = CHECK_OK(cpu->bias_backward(want, src, t, rows, cols));
  ok &= CHECK(emu_k_bias_backward(got, src, (int)t, rows, cols, scratch_floats ? scratch : NULL, NULL) == 0,
              "%s: the launch", what);
  ok &= CHECK_CLOSE(what, got, want, cols, RMS, tol_sum(rows));
  free(dy), free(start), free(dy16), free(want), free(got), free(scratch);
  return ok;
}

/* Sum, max |x| and sum of squares of x (n), a NaN among them at times. */
static bool reduce_case(int64_t n, bool nan) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  float *x = host_normals(n, 1.0);
  if (nan && n > 0) x[check_rand_int(0, n - 1)] = NAN;
  double magnitude = 0.0, squares = 0.0;
  for (int64_t i = 0; i < n; i++) magnitude += fabs(x[i]), squares += (double)x[i] * x[i];
  double scratch[L2L_K_REDUCE_SCRATCH_DOUBLES];
  bool ok = true;
  static const char *const names[] = {"sum", "max_abs", "sumsq"};
  for (int kind = 0; kind < 3; kind++) {
    double want = NAN, got = NAN;
    for (int i = 0; i < L2L_K_REDUCE_SCRATCH_DOUBLES; i++) scratch[i] = NAN;
    ok &= CHECK_OK(cpu->reduce(&want, (enum backend_reduction)kind, x, n));
    ok &= CHECK(emu_k_reduce(&got, kind, x, n, scratch, NULL) == 0, "reduce %s n=%lld: the launch",
                names[kind], (long long)n);
    if (kind == L2L_REDUCE_MAX_ABS || isnan(want)) { /* exact: the same bits */
      ok &= CHECK(memcmp(&got, &want, sizeof got) == 0, "reduce %s n=%lld%s: %.17g, want %.17g",
                  names[kind], (long long)n, nan ? " with a NaN" : "", got, want);
    } else { /* doubles summed in another order: within their rounding of the magnitudes */
      const double bound = 1e-13 * (kind == L2L_REDUCE_SUM ? magnitude : squares) + 1e-300;
      ok &= CHECK(fabs(got - want) <= bound, "reduce %s n=%lld: %.17g, want %.17g (bound %.3g)",
                  names[kind], (long long)n, got, want, bound);
    }
  }
  free(x);
  return ok;
}

/* The first index a check finds: ids outside [lo, hi) but `except`, and LayerNorm channels
   that cannot be inverted; each against a loop (-1 where none is). */
static bool index_checks_case(int64_t n) {
  int32_t *values = malloc((size_t)(n > 0 ? n : 1) * sizeof *values);
  const int32_t lo = (int32_t)check_rand_int(-5, 5), hi = lo + (int32_t)check_rand_int(1, 50);
  const int32_t except = check_rand_int(0, 1) ? -100 : lo - 1;
  const int odds = (int)check_rand_int(1, 3); /* in 500: a value out of range (hi at times) */
  for (int64_t i = 0; i < n; i++)
    values[i] = check_rand_int(0, 500) < odds ? (check_rand_int(0, 1) || except == lo - 1 ? hi : lo - 1)
                : check_rand_int(0, 9) == 0 ? except
                                            : (int32_t)check_rand_int(lo, hi - 1);
  int64_t want = -1, got = 12345;
  for (int64_t i = 0; i < n && want < 0; i++)
    if ((values[i] < lo || values[i] >= hi) && values[i] != except) want = i;
  bool ok = CHECK(emu_k_find_out_of_range(&got, values, n, lo, hi, except, NULL) == 0,
                  "find_out_of_range n=%lld: the launch", (long long)n);
  ok &= CHECK(got == want, "find_out_of_range n=%lld in [%d, %d) but %d: %lld, want %lld", (long long)n,
              lo, hi, except, (long long)got, (long long)want);

  float *w = host_floats(n, 1.0f), *b = host_floats(n, 0.0f);
  for (int64_t i = 0; i < n; i++) {
    w[i] = (float)check_rand_normal(), b[i] = (float)check_rand_normal();
    if (check_rand_int(0, 500) < odds) {
      if (check_rand_int(0, 1)) w[i] = check_rand_int(0, 1) ? 0.0f : 1e-7f;
      else b[i] = 100.0f * w[i] + (w[i] < 0 ? -1.0f : 1.0f);
    }
  }
  want = -1, got = 12345;
  for (int64_t i = 0; i < n && want < 0; i++) {
    const float a = fabsf(w[i]);
    if (!(a >= L2L_LN_MIN_WEIGHT) || a * L2L_LN_BIAS_RATIO < fabsf(b[i])) want = i;
  }
  ok &= CHECK(emu_k_layernorm_uninvertible(&got, w, b, n, L2L_LN_MIN_WEIGHT, L2L_LN_BIAS_RATIO, NULL) == 0,
              "layernorm_uninvertible n=%lld: the launch", (long long)n);
  ok &= CHECK(got == want, "layernorm_uninvertible n=%lld: %lld, want %lld", (long long)n, (long long)got,
              (long long)want);
  free(values), free(w), free(b);
  return ok;
}

/* Gather from an f32, bf16 or f16 table and scatter-add onto a table, ids repeating. */
static bool embedding_case(int64_t n, int64_t vocab, int64_t cols) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  static const l2l_dtype types[] = {L2L_F32, L2L_BF16, L2L_F16};
  const l2l_dtype t = types[check_rand_int(0, 2)];
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)check_rand_int(0, vocab - 1);
  float *table = host_normals(vocab * cols, 1.0);
  uint16_t *table16 = malloc((size_t)(vocab * cols) * 2);
  for (int64_t i = 0; i < vocab * cols; i++) table16[i] = round16(table[i], t == L2L_F32 ? L2L_BF16 : t);
  const void *src = t == L2L_F32 ? (const void *)table : table16;
  float *want = host_floats(n * cols, NAN), *got = host_floats(n * cols, NAN);
  char what[160];
  snprintf(what, sizeof what, "embedding_forward %lld ids of %lld, %lld wide, from %s", (long long)n,
           (long long)vocab, (long long)cols, l2l_dtype_name(t));
  bool ok = CHECK_OK(cpu->embedding_forward(want, ids, src, t, n, cols));
  ok &= CHECK(emu_k_embedding_forward(got, ids, src, (int)t, n, cols, NULL) == 0, "%s: the launch", what);
  ok &= CHECK(memcmp(got, want, (size_t)(n * cols) * 4) == 0, "%s: not the CPU's bits", what);

  float *dout = host_normals(n * cols, 1.0), *dt_want = host_normals(vocab * cols, 1.0);
  float *dt_got = host_floats(vocab * cols, 0);
  memcpy(dt_got, dt_want, (size_t)(vocab * cols) * 4);
  snprintf(what, sizeof what, "embedding_backward %lld ids of %lld, %lld wide", (long long)n, (long long)vocab,
           (long long)cols);
  ok &= CHECK_OK(cpu->embedding_backward(dt_want, dout, ids, n, vocab, cols));
  ok &= CHECK(emu_k_embedding_backward(dt_got, dout, ids, n, vocab, cols, NULL) == 0, "%s: the launch", what);
  ok &= CHECK(memcmp(dt_got, dt_want, (size_t)(vocab * cols) * 4) == 0, "%s: not the CPU's bits", what);
  free(ids), free(table), free(table16), free(want), free(got), free(dout), free(dt_want), free(dt_got);
  return ok;
}

#endif /* L2L_KERNEL_EMULATION */

TEST(reduce_kernels_emulated_against_the_cpu) {
#if !L2L_KERNEL_EMULATION
  check_skip(NO_KERNEL_EMULATION);
#else
  int failed = 0;
  /* the bias gradient: one chunk of rows, a few, and more than a warp's 32 (narrow) */
  failed += !bias_backward_case(check_rand_int(1, 40), check_rand_int(1, 300));
  failed += !bias_backward_case(check_rand_int(65, 300), check_rand_int(1, 300));
  failed += !bias_backward_case(check_rand_int(1100, 1600), check_rand_int(1, 64));
  /* reductions: none, one part, several (4096 elements a part) */
  failed += !reduce_case(0, false);
  failed += !reduce_case(check_rand_int(1, 4096), check_rand_int(0, 1));
  failed += !reduce_case(check_rand_int(4097, 20000), check_rand_int(0, 1));
  /* index checks past three blocks' stride (768 threads) */
  failed += !index_checks_case(0);
  for (int i = 0; i < 3 && failed < 2; i++) failed += !index_checks_case(check_rand_int(1, 5000));
  /* embeddings: rows narrower than a warp, float4 rows, slices of 128 units */
  failed += !embedding_case(check_rand_int(1, 200), check_rand_int(1, 30), check_rand_int(1, 31));
  failed += !embedding_case(check_rand_int(1, 200), check_rand_int(1, 30), 4 * check_rand_int(1, 200));
#ifndef L2L_TSAN
  failed += !embedding_case(check_rand_int(100, 400), check_rand_int(1, 5), check_rand_int(513, 1100));
#endif
  (void)failed;
#endif
}
