/* SPDX-License-Identifier: MIT */
/* test_cuda.c — the CUDA backend against the CPU backend, op by op, in one process; this
 * file: the math ops (GEMM to AdamW).
 *
 * What it tests: every op of l2l.h on device tensors served by the CUDA backend against
 * the same op on host tensors (the CPU backend, which defines what every op computes):
 * GEMMs (all four transposes, beta 0 with a poisoned c and beta 1, plain and batched,
 * f32, TF32, bf16 and f16 inputs), bias add and backward, add (also in place), GELU,
 * LayerNorm (mean / rstd outputs, accumulated parameter gradients), softmax (causal, key
 * mask, Tq != Tk) and its backward, embedding (repeated ids), cross-entropy (ignored
 * targets), dropout (masks bit for bit), the reductions (NaN, infinity), AdamW over
 * several steps, fill, cast (bit for bit, every 16-bit pattern, the refused f32 -> i32
 * cast), the random fills; refusals (ids and targets out of range, host/device mixing);
 * the internal entries the layers call (GELU side bits, GELU backward from the output,
 * LayerNorm backward from the output, flash attention forward and backward in standard
 * and frugal mode with causal / key mask / dropout); whole layers (block pre-LN and
 * post-LN, standard and frugal, with dropout; LM head; embedding) with the host layer's
 * parameters copied into a device twin; the caching allocator's counters and the device
 * pool's budget; l2l_cuda_get_info.
 *
 * How: inputs are drawn on the host (check.h's generator, awkward sizes: 1, 7, 33, 257,
 * 1000+, nothing a multiple of the GPU's tile sizes unless on purpose) and copied to the
 * device; outputs start as NaN on both sides (poisoned on the host, then copied), and
 * gradients that accumulate start from the same random values. Results come back with
 * l2l_tensor_copy and are compared with the host's: a device tensor's memory is never
 * read on the CPU. Each test switches the device pool to CUDA (l2l_device_use("cuda")),
 * frees every device tensor it made and switches back to the CPU at its end (the test
 * runner exports L2L_DEVICE=cpu, and the other tests read device tensors on the CPU), so
 * a test never returns between use_gpu() and end_gpu().
 * Without a usable GPU each test reports itself skipped with the reason.
 * L2L_TEST_CUDA_DRY_RUN=1 runs the tests with the device pool on the CPU backend (host
 * against host, no GPU): a check of the tests themselves; the tests that need CUDA itself
 * (device info, the caching allocator) stay skipped then.
 * All test names start with "cuda_", so `l2l_ctest cuda_` runs just these files: test_cuda.c
 * (GEMM, bias, add, GELU, LayerNorm, softmax, embedding, cross-entropy, dropout, the
 * reductions, AdamW), test_cuda_data.c (fill, cast, random fills, refusals),
 * test_cuda_layers.c (the backend's entries for the layers, whole layers) and
 * test_cuda_device.c (device info and switch, the caching allocator, which GPU),
 * test_cuda_records.c (a record placed on the device: its adds and updates); the harness
 * and the tolerances are cuda_twins.h's.
 * Must never: read a device tensor's memory on the CPU, or leave a device tensor or the
 * CUDA backend switched on behind it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_twins.h"

/* ================================================================ GEMM */

enum gemm_kind { GEMM_F32, GEMM_TF32, GEMM_BF16, GEMM_F16 };
static const char *const gemm_kind_names[] = {"f32", "tf32", "bf16", "f16"};

/* (batch, rows, cols), or (rows, cols) when batch is 0 (then l2l_gemm is used). */
static l2l_tensor *gemm_tensor(int64_t batch, int64_t rows, int64_t cols) {
  return batch ? HOST(L2L_F32, batch, rows, cols) : HOST(L2L_F32, rows, cols);
}

static l2l_status run_gemm(int64_t batch, l2l_tensor *c, const l2l_tensor *a,
                           const l2l_tensor *b, int ta, int tb, float alpha, float beta) {
  return batch ? l2l_gemm_batched(c, a, b, ta, tb, alpha, beta)
               : l2l_gemm(c, a, b, ta, tb, alpha, beta);
}

/* One GEMM of unit-normal matrices on both sides. beta 0: c starts as NaN, which must not
   reach the result. The 16-bit kinds cast the inputs on the host (the bits both sides
   use) and check that the device's own cast of the f32 inputs gives the same bits. */
static bool gemm_case(enum gemm_kind kind, int64_t batch, int64_t m, int64_t n, int64_t k,
                      int ta, int tb, float alpha, float beta) {
  const bool half = kind == GEMM_BF16 || kind == GEMM_F16;
  const l2l_dtype dt16 = kind == GEMM_BF16 ? L2L_BF16 : L2L_F16;
  const int64_t total = (batch ? batch : 1) * m * n;
  char what[200];
  snprintf(what, sizeof what, "%s gemm%s batch=%lld m=%lld n=%lld k=%lld ta=%d tb=%d beta=%g",
           gemm_kind_names[kind], batch ? "_batched" : "", (long long)batch, (long long)m,
           (long long)n, (long long)k, ta, tb, beta);
  l2l_tensor *a = fill_normal(gemm_tensor(batch, ta ? k : m, ta ? m : k), 1.0);
  l2l_tensor *b = fill_normal(gemm_tensor(batch, tb ? n : k, tb ? k : n), 1.0);
  l2l_tensor *c0 = gemm_tensor(batch, m, n);
  if (beta == 0.0f) check_poison(c0);
  else fill_normal(c0, 1.0);
  l2l_tensor *c32 = copied_to(c0, L2L_POOL_HOST); /* f32 GEMM of the unrounded inputs */
  struct twin c = twin_of(c0);
  struct twin in_a = twin_of(half ? cast_on_host(a, dt16) : copied_to(a, L2L_POOL_HOST));
  struct twin in_b = twin_of(half ? cast_on_host(b, dt16) : copied_to(b, L2L_POOL_HOST));
  bool ok = true;
  if (half) {
    l2l_tensor *a_dev = copied_to(a, L2L_POOL_DEVICE), *a16_dev = like_in(in_a.h, L2L_POOL_DEVICE);
    ok &= CHECK_OK(l2l_tensor_cast(a16_dev, a_dev));
    char label[320];
    snprintf(label, sizeof label, "%s: the device's cast of a", what);
    ok &= CHECK_TWIN_BITS(label, pair(in_a.h, a16_dev));
    FREE(a_dev, a16_dev);
  }
  if (kind == GEMM_TF32) ok &= CHECK_OK(l2l_cuda_set_tf32(1));
  SIDES ok &= OK_ON(run_gemm(batch, AT(c), AT(in_a), AT(in_b), ta, tb, alpha, beta));
  if (kind == GEMM_TF32) ok &= CHECK_OK(l2l_cuda_set_tf32(0));
  l2l_tensor *back = copied_to(c.d, L2L_POOL_HOST);
  const float *got = fdata(back), *want = fdata(c.h);
  /* The scale of an element: a dot of k unit normals is of size sqrt(k) (an element that
     cancels to near 0 is held to that scale, not to its own). */
  const double floor = fabs((double)alpha) * sqrt((double)k) + fabs((double)beta);
  char label[320];
  switch (kind) {
    case GEMM_F32: ok &= CHECK_CLOSE(what, got, want, total, floor, tol_sum(k)); break;
    case GEMM_TF32: {
      ok &= CHECK_CLOSE(what, got, want, total, floor, TOL_TF32_ELEMENT);
      /* The normwise error settles to its expected size only over many elements. */
      double e = check_norm_err(got, want, total);
      if (total >= 256)
        ok &= CHECK_WITHIN(e, TOL_TF32_NORM, what, "%s: normwise relative error %.3g > %.3g",
                           what, e, TOL_TF32_NORM);
      break;
    }
    case GEMM_BF16:
    case GEMM_F16:
      snprintf(label, sizeof label, "%s (against the host, same 16-bit inputs)", what);
      ok &= CHECK_CLOSE(label, got, want, total, floor, TOL_HALF_SAME_INPUT);
      ok &= CHECK_OK(run_gemm(batch, c32, a, b, ta, tb, alpha, beta));
      snprintf(label, sizeof label, "%s (against the f32 GEMM of the unrounded inputs)", what);
      ok &= CHECK_CLOSE(label, got, fdata(c32), total, floor, TOL_HALF_VS_F32_ELEMENT);
      if (total >= 256) {
        double e = check_norm_err(got, fdata(c32), total);
        ok &= CHECK_WITHIN(e, TOL_HALF_VS_F32_NORM, label,
                           "%s: normwise relative error %.3g > %.3g", label, e,
                           TOL_HALF_VS_F32_NORM);
      }
      break;
  }
  FREE(a, b, c32, back);
  TWIN_FREE(&c, &in_a, &in_b);
  return ok;
}

TEST(cuda_gemm) {
  if (!use_gpu()) return;
  static const int64_t sizes[] = {1, 7, 33, 257, 1031};
  int failed = 0;
  for (int kind = 0; kind < 4; kind++)
    for (int t = 0; t < 4; t++)
      for (int accumulate = 0; accumulate < 2; accumulate++)
        for (int batched = 0; batched < 2; batched++) {
          if (failed >= 8) continue; /* enough to see what is wrong */
          int64_t batch = batched ? PICK(1, 3, 7) : 0, m, n, k;
          do {
            m = check_pick(sizes, 5), n = check_pick(sizes, 5), k = check_pick(sizes, 5);
          } while (m * n * k * (batch ? batch : 1) > (INT64_C(1) << 27));
          float alpha = (float)(check_rand_int(0, 1) ? 1 : -1) * (float)check_rand_uniform(0.5, 1.5);
          failed += !gemm_case((enum gemm_kind)kind, batch, m, n, k, t >> 1, t & 1, alpha,
                               accumulate ? 1.0f : 0.0f);
        }
  for (int kind = 0; kind < 4 && failed < 8; kind++) {
    /* all dims 1; a long odd K with more than 1000 rows; sizes a tensor-core kernel likes */
    failed += !gemm_case((enum gemm_kind)kind, 0, 1, 1, 1, 0, 0, 1.0f, 0.0f);
    failed += !gemm_case((enum gemm_kind)kind, 0, 1031, 257, 1013, (int)check_rand_int(0, 1),
                         (int)check_rand_int(0, 1), 1.25f, 1.0f);
    failed += !gemm_case((enum gemm_kind)kind, 5, 64, 96, 128, 1, 0, -0.5f, 0.0f);
  }
  end_gpu();
}

/* ================================================================ bias, add */

TEST(cuda_bias_add_and_backward) {
  if (!use_gpu()) return;
  static const struct {
    int nd;
    int64_t d[3];
  } shapes[] = {{1, {13}},         {2, {1, 1}},      {2, {7, 33}},     {2, {1031, 257}},
                {3, {3, 5, 1000}}, {2, {4099, 31}},  {2, {65536, 7}}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int nd = shapes[s].nd;
    int64_t cols = shapes[s].d[nd - 1];
    struct twin y = twin_of(fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nd, shapes[s].d), 1.0));
    int64_t rows = numel(y.h) / cols;
    struct twin bias = twin_of(RANDN(1.0, cols));
    char what[160], dims[64];
    dims_str(dims, sizeof dims, y.h);
    SIDES OK_ON(l2l_bias_add(AT(y), AT(bias)));
    snprintf(what, sizeof what, "bias_add %s", dims);
    CHECK_TWIN_BITS(what, y); /* one f32 add per element: exact */
    struct twin dbias = twin_of(RANDN(1.0, cols)); /* accumulated onto */
    struct twin dy = twin_of(fill_normal(like_in(y.h, L2L_POOL_HOST), 1.0));
    SIDES OK_ON(l2l_bias_backward(AT(dbias), AT(dy)));
    snprintf(what, sizeof what, "bias_backward %s", dims);
    CHECK_TWIN(what, dbias, RMS, tol_sum(rows));
    /* dy in 16 bits (attention's dq, dk, dv), onto the result above */
    const l2l_dtype dt = s & 1 ? L2L_F16 : L2L_BF16;
    struct twin dy16 = twin_of(cast_on_host(dy.h, dt));
    SIDES OK_ON(l2l_bias_backward(AT(dbias), AT(dy16)));
    snprintf(what, sizeof what, "bias_backward %s over %s", dims, l2l_dtype_name(dt));
    CHECK_TWIN(what, dbias, RMS, tol_sum(rows));
    TWIN_FREE(&y, &bias, &dbias, &dy, &dy16);
  }
  end_gpu();
}

TEST(cuda_add) {
  if (!use_gpu()) return;
  static const int64_t sizes[] = {1, 7, 33, 1000, 1000003};
  for (int s = 0; s < 6; s++) {
    l2l_tensor *a0 = s < 5 ? RANDN(1.0, sizes[s]) : RANDN(1.0, 2, 3, 5, 7);
    struct twin a = twin_of(a0), b = twin_of(fill_normal(like_in(a0, L2L_POOL_HOST), 1.0));
    struct twin out = twin_of(poisoned(like_in(a0, L2L_POOL_HOST)));
    char what[96];
    snprintf(what, sizeof what, "add n=%lld", (long long)numel(a0));
    SIDES OK_ON(l2l_add(AT(out), AT(a), AT(b)));
    CHECK_TWIN_BITS(what, out); /* one f32 add: exact */
    /* out may be a, or b */
    SIDES OK_ON(l2l_add(AT(a), AT(a), AT(b)));
    snprintf(what, sizeof what, "add into a, n=%lld", (long long)numel(a0));
    CHECK_TWIN_BITS(what, a);
    SIDES OK_ON(l2l_add(AT(b), AT(a), AT(b)));
    snprintf(what, sizeof what, "add into b, n=%lld", (long long)numel(a0));
    CHECK_TWIN_BITS(what, b);
    TWIN_FREE(&a, &b, &out);
  }
  end_gpu();
}

/* ================================================================ GELU */

TEST(cuda_gelu) {
  if (!use_gpu()) return;
  static const int64_t sizes[] = {1, 7, 33, 4097, 1000003};
  for (int s = 0; s < 5; s++) {
    int64_t n = sizes[s];
    l2l_tensor *x0 = RANDN(2.0, n);
    put_gelu_specials(x0);
    struct twin x = twin_of(x0), y = twin_of(NANS(n)), dy = twin_of(RANDN(1.0, n));
    struct twin dx = twin_of(NANS(n)), xc = twin_of(copied_to(x0, L2L_POOL_HOST));
    char what[96];
    SIDES OK_ON(l2l_gelu_forward(AT(y), AT(x)));
    snprintf(what, sizeof what, "gelu_forward n=%lld", (long long)n);
    CHECK_TWIN(what, y, RMS, TOL_F32);
    SIDES OK_ON(l2l_gelu_backward(AT(dx), AT(dy), AT(x)));
    snprintf(what, sizeof what, "gelu_backward n=%lld", (long long)n);
    /* floor 1, the scale of dy: GELU' cancels to ~0 at its minimum (s + x 2u' s (1-s)),
       where only an absolute error at dy's scale means anything */
    CHECK_TWIN(what, dx, 1.0, TOL_F32);
    SIDES OK_ON(l2l_gelu_forward(AT(xc), AT(xc))); /* y may be x */
    snprintf(what, sizeof what, "gelu_forward in place n=%lld", (long long)n);
    CHECK_TWIN(what, pair(y.h, xc.d), RMS, TOL_F32);
    TWIN_FREE(&x, &y, &dy, &dx, &xc);
  }
  end_gpu();
}

/* ================================================================ LayerNorm */

TEST(cuda_layernorm) {
  if (!use_gpu()) return;
  static const struct {
    int nd;
    int64_t d[3];
  } shapes[] = {{2, {1, 33}}, {2, {7, 33}}, {2, {1031, 257}}, {2, {33, 4099}}, {3, {3, 5, 1000}},
                {2, {300, 50257}}, {2, {7, 33}}, {2, {4099, 768}}, {2, {3, 4}}, {2, {9, 300}},
                {2, {21, 2048}}, {2, {19, 4096}}};
  /* (no cols = 1: x - mean is exactly 0 there and dx pure rounding noise, not comparable)
     (300, 50257): the backward's column partials, 2 x 256 x 50257 floats, outgrow the
     32 MiB scratch the backend starts with, which then grows (its old block going back to
     the cache behind the kernels); the small shape after it runs on the grown one.
     (4099, 768), (3, 4), (3, 5, 1000), (9, 300), (21, 2048) and (19, 4096): rows a warp
     holds in its registers (the forward's from 4 columns to 4096, 16 and 32 float4s a lane
     past 1024 and 2048; the backward's past 256 to 1024), GPT-2's width among them. */
  const float eps = 1e-5f;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int nd = shapes[s].nd;
    int64_t cols = shapes[s].d[nd - 1];
    l2l_tensor *x0 = check_tensor(L2L_POOL_HOST, L2L_F32, nd, shapes[s].d);
    int64_t rows = numel(x0) / cols;
    l2l_tensor *w0 = HOST(L2L_F32, cols), *b0 = HOST(L2L_F32, cols);
    layernorm_inputs(x0, w0, b0);
    struct twin x = twin_of(x0), w = twin_of(w0), b = twin_of(b0);
    struct twin y = twin_of(poisoned(like_in(x0, L2L_POOL_HOST))), mean = twin_of(NANS(rows));
    struct twin rstd = twin_of(NANS(rows)), y2 = twin_of(poisoned(like_in(x0, L2L_POOL_HOST)));
    char what[160], dims[64];
    dims_str(dims, sizeof dims, x0);
    SIDES OK_ON(l2l_layernorm_forward(AT(y), AT(mean), AT(rstd), AT(x), AT(w), AT(b), eps));
    snprintf(what, sizeof what, "layernorm_forward %s: y", dims);
    CHECK_TWIN(what, y, RMS, tol_sum(cols));
    snprintf(what, sizeof what, "layernorm_forward %s: mean", dims);
    CHECK_TWIN(what, mean, rms_tensor(x0), tol_sum(cols)); /* at x's scale: means cancel */
    snprintf(what, sizeof what, "layernorm_forward %s: rstd", dims);
    CHECK_TWIN(what, rstd, RMS, tol_sum(cols));
    SIDES OK_ON(l2l_layernorm_forward(AT(y2), NULL, NULL, AT(x), AT(w), AT(b), eps));
    snprintf(what, sizeof what, "layernorm_forward %s without mean and rstd", dims);
    CHECK_TWIN(what, y2, RMS, tol_sum(cols));

    /* Backward from the host's mean and rstd on both sides. */
    CHECK_OK(l2l_tensor_copy(mean.d, mean.h));
    CHECK_OK(l2l_tensor_copy(rstd.d, rstd.h));
    struct twin dy = twin_of(fill_normal(like_in(x0, L2L_POOL_HOST), 1.0));
    struct twin dx = twin_of(poisoned(like_in(x0, L2L_POOL_HOST)));
    struct twin dx2 = twin_of(poisoned(like_in(x0, L2L_POOL_HOST)));
    struct twin dw = twin_of(RANDN(1.0, cols)), db = twin_of(RANDN(1.0, cols)); /* += */
    SIDES OK_ON(l2l_layernorm_backward(AT(dx), AT(dw), AT(db), AT(dy), AT(x), AT(w), AT(mean),
                                       AT(rstd)));
    snprintf(what, sizeof what, "layernorm_backward %s: dx", dims);
    CHECK_TWIN(what, dx, RMS, tol_sum(cols));
    snprintf(what, sizeof what, "layernorm_backward %s: dweight", dims);
    CHECK_TWIN(what, dw, RMS, tol_sum(rows));
    snprintf(what, sizeof what, "layernorm_backward %s: dbias", dims);
    CHECK_TWIN(what, db, RMS, tol_sum(rows));
    SIDES OK_ON(l2l_layernorm_backward(AT(dx2), NULL, NULL, AT(dy), AT(x), AT(w), AT(mean),
                                       AT(rstd)));
    snprintf(what, sizeof what, "layernorm_backward %s without parameter gradients", dims);
    CHECK_TWIN(what, dx2, RMS, tol_sum(cols));
    TWIN_FREE(&x, &w, &b, &y, &mean, &rstd, &y2, &dy, &dx, &dx2, &dw, &db);
  }
  end_gpu();
}

/* ================================================================ softmax */

TEST(cuda_softmax) {
  if (!use_gpu()) return;
  static const struct {
    int nd;
    int64_t d[4];
    int causal, masked;
  } cases[] = {
      {4, {1, 1, 1, 1}, 1, 0},   {4, {2, 3, 33, 33}, 1, 0}, {4, {2, 3, 33, 33}, 1, 1},
      {4, {3, 1, 5, 257}, 0, 1}, /* sample 2: every key hidden, its rows all 0 */
      {4, {2, 2, 7, 5}, 1, 0},   /* Tq > Tk: the first rows see no key */
      {4, {2, 2, 5, 37}, 1, 1},  /* Tq < Tk */
      {2, {1031, 257}, 0, 0},    {3, {4, 65, 1000}, 1, 1}, {4, {3, 3, 64, 64}, 0, 1},
  };
  for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
    int nd = cases[s].nd, causal = cases[s].causal;
    int64_t tk = cases[s].d[nd - 1];
    float scale = (float)check_rand_uniform(0.1, 1.5);
    l2l_tensor *x0 = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nd, cases[s].d), 3.0);
    struct twin x = twin_of(x0), y = twin_of(poisoned(like_in(x0, L2L_POOL_HOST)));
    struct twin xc = twin_of(copied_to(x0, L2L_POOL_HOST));
    struct twin mask = twin_of(cases[s].masked ? random_key_mask(cases[s].d[0], tk) : NULL);
    char what[160], dims[64];
    dims_str(dims, sizeof dims, x0);
    SIDES OK_ON(l2l_softmax_forward(AT(y), AT(x), AT(mask), causal, scale));
    snprintf(what, sizeof what, "softmax_forward %s causal=%d masked=%d", dims, causal,
             cases[s].masked);
    CHECK_TWIN(what, y, RMS, tol_sum(tk));
    SIDES OK_ON(l2l_softmax_forward(AT(xc), AT(xc), AT(mask), causal, scale)); /* y may be x */
    snprintf(what, sizeof what, "softmax_forward in place %s causal=%d masked=%d", dims, causal,
             cases[s].masked);
    CHECK_TWIN(what, pair(y.h, xc.d), RMS, tol_sum(tk));

    struct twin probs = twin_of(copied_to(y.h, L2L_POOL_HOST)); /* the host's y on both */
    struct twin dy = twin_of(fill_normal(like_in(x0, L2L_POOL_HOST), 1.0));
    struct twin dx = twin_of(poisoned(like_in(x0, L2L_POOL_HOST)));
    SIDES OK_ON(l2l_softmax_backward(AT(dx), AT(dy), AT(probs), scale));
    snprintf(what, sizeof what, "softmax_backward %s", dims);
    CHECK_TWIN(what, dx, cancelling_floor_of(dx.h, scale), tol_sum(tk));
    TWIN_FREE(&x, &y, &xc, &mask, &probs, &dy, &dx);
  }
  end_gpu();
}

/* ================================================================ embedding */

TEST(cuda_embedding) {
  if (!use_gpu()) return;
  static const struct {
    int nd;
    int64_t ids[2];
    int64_t vocab, cols;
    int32_t id_hi; /* ids drawn from [0, id_hi]: a small range repeats them */
  } cases[] = {{1, {1}, 1, 1, 0},         {2, {2, 33}, 7, 257, 6},  {1, {1031}, 1000, 65, 999},
               {2, {4, 257}, 50, 1024, 3}, {1, {5000}, 2, 3, 1}};
  for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
    int nd = cases[s].nd;
    int64_t v = cases[s].vocab, cols = cases[s].cols;
    l2l_tensor *ids0 = check_tensor(L2L_POOL_HOST, L2L_I32, nd, cases[s].ids);
    int64_t n = numel(ids0);
    int64_t *count = xmalloc((size_t)v * sizeof *count), max_repeat = 0;
    memset(count, 0, (size_t)v * sizeof *count);
    for (int64_t i = 0; i < n; i++) {
      idata(ids0)[i] = (int32_t)check_rand_int(0, cases[s].id_hi);
      int64_t c = ++count[idata(ids0)[i]];
      max_repeat = c > max_repeat ? c : max_repeat;
    }
    free(count);
    int64_t out_shape[3] = {cases[s].ids[0], cases[s].ids[1], cols};
    out_shape[nd] = cols;
    struct twin ids = twin_of(ids0), table = twin_of(RANDN(1.0, v, cols));
    struct twin out = twin_of(poisoned(check_tensor(L2L_POOL_HOST, L2L_F32, nd + 1, out_shape)));
    struct twin dout = twin_of(fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nd + 1, out_shape), 1.0));
    struct twin dtable = twin_of(RANDN(1.0, v, cols)); /* accumulated onto */
    char what[160];
    SIDES OK_ON(l2l_embedding_forward(AT(out), AT(ids), AT(table)));
    snprintf(what, sizeof what, "embedding_forward n=%lld V=%lld C=%lld", (long long)n,
             (long long)v, (long long)cols);
    CHECK_TWIN_BITS(what, out); /* a copy of rows: exact */
    for (int h = 0; h < 2; h++) { /* from a 16-bit copy of the table (the relay's bf16/f16) */
      l2l_dtype dt = h ? L2L_BF16 : L2L_F16;
      int64_t tshape[2] = {v, cols};
      l2l_tensor *half0 = check_tensor(L2L_POOL_HOST, dt, 2, tshape);
      CHECK_OK(l2l_tensor_cast(half0, table.h));
      struct twin half = twin_of(half0);
      SIDES OK_ON(l2l_embedding_forward(AT(out), AT(ids), AT(half)));
      snprintf(what, sizeof what, "embedding_forward from %s n=%lld C=%lld", l2l_dtype_name(dt),
               (long long)n, (long long)cols);
      CHECK_TWIN_BITS(what, out);
      TWIN_FREE(&half);
    }
    SIDES OK_ON(l2l_embedding_backward(AT(dtable), AT(dout), AT(ids)));
    snprintf(what, sizeof what, "embedding_backward n=%lld V=%lld C=%lld (an id repeats %lld times)",
             (long long)n, (long long)v, (long long)cols, (long long)max_repeat);
    /* each row adds its positions in their order, as the CPU does: its bits, every run */
    CHECK_TWIN_BITS(what, dtable);
    TWIN_FREE(&ids, &table, &out, &dout, &dtable);
  }
  end_gpu();
}

/* ================================================================ cross-entropy */

TEST(cuda_cross_entropy) {
  if (!use_gpu()) return;
  static const struct {
    int nd;
    int64_t d[3]; /* logits; targets get all but the last */
    double logit_scale;
    int32_t ignore_index;
  } cases[] = {{2, {1, 1}, 1.0, -100},       {2, {7, 33}, 1.0, -100},  {2, {257, 1000}, 3.0, -1},
               {2, {33, 50257}, 2.0, -100},  {2, {65, 97}, 1.0, 0}, /* a real class ignored */
               {3, {2, 3, 257}, 8.0, -1}};
  for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
    int nd = cases[s].nd;
    int64_t v = cases[s].d[nd - 1];
    l2l_tensor *logits0 = fill_normal(check_tensor(L2L_POOL_HOST, L2L_F32, nd, cases[s].d),
                                      cases[s].logit_scale);
    l2l_tensor *targets0 = check_tensor(L2L_POOL_HOST, L2L_I32, nd - 1, cases[s].d);
    int64_t real = random_targets(targets0, (int32_t)v, cases[s].ignore_index);
    struct twin logits = twin_of(logits0), targets = twin_of(targets0);
    struct twin losses = twin_of(poisoned(check_tensor(L2L_POOL_HOST, L2L_F32, nd - 1, cases[s].d)));
    struct twin dlogits = twin_of(poisoned(like_in(logits0, L2L_POOL_HOST)));
    float scale = 1.0f / (float)(real > 0 ? real : 1);
    char what[160], dims[64];
    dims_str(dims, sizeof dims, logits0);
    SIDES OK_ON(l2l_cross_entropy_forward(AT(losses), AT(logits), AT(targets),
                                          cases[s].ignore_index));
    snprintf(what, sizeof what, "cross_entropy_forward %s ignore=%d", dims, cases[s].ignore_index);
    CHECK_TWIN(what, losses, cancelling_floor_of(losses.h, 1.0), tol_sum(v));
    SIDES OK_ON(l2l_cross_entropy_backward(AT(dlogits), AT(logits), AT(targets),
                                           cases[s].ignore_index, scale));
    snprintf(what, sizeof what, "cross_entropy_backward %s ignore=%d", dims, cases[s].ignore_index);
    CHECK_TWIN(what, dlogits, cancelling_floor_of(dlogits.h, scale), tol_sum(v));
    TWIN_FREE(&logits, &targets, &losses, &dlogits);
  }
  end_gpu();
}

/* ================================================================ dropout */

/* Forward and backward of one dropout on n elements: y, the mask and dx bit for bit. */
static void dropout_case(int64_t n, float p) {
  uint64_t seed = check_rand_u64(), stream = check_rand_u64();
  int64_t first = check_rand_int(0, INT64_C(1) << 40);
  struct twin x = twin_of(RANDN(1.0, n)), y = twin_of(NANS(n));
  struct twin mask = twin_of(bytes_of((n + 7) / 8, 0xA5)); /* every byte must be written */
  char what[160];
  SIDES OK_ON(l2l_dropout_forward(AT(y), AT(mask), AT(x), p, seed, stream, first));
  snprintf(what, sizeof what, "dropout_forward n=%lld p=%g first=%lld: y", (long long)n, p,
           (long long)first);
  CHECK_TWIN_BITS(what, y); /* x * (1/(1-p)) with the scale rounded to f32 first, or 0 */
  snprintf(what, sizeof what, "dropout_forward n=%lld p=%g first=%lld: mask", (long long)n, p,
           (long long)first);
  CHECK_TWIN_BITS(what, mask);
  CHECK_OK(l2l_tensor_copy(mask.d, mask.h)); /* the backward reads the same bits on both */
  struct twin dy = twin_of(RANDN(1.0, n)), dx = twin_of(NANS(n));
  SIDES OK_ON(l2l_dropout_backward(AT(dx), AT(dy), AT(mask), p));
  snprintf(what, sizeof what, "dropout_backward n=%lld p=%g", (long long)n, p);
  CHECK_TWIN_BITS(what, dx);
  TWIN_FREE(&x, &y, &mask, &dy, &dx);
}

TEST(cuda_dropout) {
  if (!use_gpu()) return;
  static const int64_t sizes[] = {1, 7, 8, 9, 33, 1000, 1000003};
  for (int s = 0; s < 7; s++) {
    const float ps[] = {0.0f, 0.1f, 0.5f, 0.9f, (float)check_rand_uniform(0.01, 0.99)};
    for (int k = 0; k < 5; k++) dropout_case(sizes[s], ps[k]);
  }
  dropout_case(INT64_C(4099) * 4099, 0.3f); /* 16.8M elements */

  /* y may be x. */
  {
    int64_t n = 4097;
    uint64_t seed = check_rand_u64(), stream = check_rand_u64();
    struct twin x = twin_of(RANDN(1.0, n)), mask = twin_of(bytes_of((n + 7) / 8, 0));
    SIDES OK_ON(l2l_dropout_forward(AT(x), AT(mask), AT(x), 0.3f, seed, stream, 11));
    CHECK_TWIN_BITS("dropout_forward in place: y", x);
    CHECK_TWIN_BITS("dropout_forward in place: mask", mask);
    TWIN_FREE(&x, &mask);
  }
  /* A row view: first advanced by the view's offset, as a split batch does. C odd so the
     view starts inside a mask byte of the whole. */
  {
    int64_t rows = 31, cols = 13, split = check_rand_int(1, rows - 1), nb = (rows - split) * cols;
    uint64_t seed = check_rand_u64(), stream = check_rand_u64();
    int64_t first = check_rand_int(0, INT64_C(1) << 36);
    struct twin x = twin_of(RANDN(1.0, rows, cols)), y = twin_of(NANS(rows, cols));
    struct twin mask = twin_of(bytes_of((nb + 7) / 8, 0xFF));
    SIDES {
      l2l_tensor *xv = NULL, *yv = NULL;
      OK_ON(l2l_tensor_view_rows(&xv, AT(x), split, rows - split));
      OK_ON(l2l_tensor_view_rows(&yv, AT(y), split, rows - split));
      OK_ON(l2l_dropout_forward(yv, AT(mask), xv, 0.4f, seed, stream,
                                first + l2l_tensor_offset(xv)));
      FREE(xv, yv);
    }
    CHECK_TWIN_BITS("dropout_forward on a row view: y (rows before the view stay NaN)", y);
    CHECK_TWIN_BITS("dropout_forward on a row view: mask", mask);
    TWIN_FREE(&x, &y, &mask);
  }
  end_gpu();
}

/* ================================================================ reductions */

TEST(cuda_reductions) {
  if (!use_gpu()) return;
  static const int64_t sizes[] = {1, 7, 257, 1000003, 16777259};
  for (int s = 0; s < 5; s++) {
    int64_t n = sizes[s];
    l2l_tensor *x0 = RANDN(3.0, n);
    fdata(x0)[check_rand_int(0, n - 1)] = (float)(check_rand_int(0, 1) ? -1 : 1) *
                                          (float)check_rand_uniform(50, 100);
    double abs_sum = 0.0;
    for (int64_t i = 0; i < n; i++) abs_sum += fabs((double)fdata(x0)[i]);
    struct twin x = twin_of(x0);
    double sum[2] = {NAN, NAN}, max_abs[2] = {NAN, NAN}, norm[2] = {NAN, NAN};
    SIDES {
      OK_ON(l2l_sum(&sum[side], AT(x)));
      OK_ON(l2l_max_abs(&max_abs[side], AT(x)));
      OK_ON(l2l_norm2(&norm[side], AT(x)));
    }
    /* Both accumulate in double: any two orders agree to ~n 2^-53 of the sum of
       magnitudes; an f32 accumulation would be off by ~1e-7 of it or more. */
    CHECK(fabs(sum[1] - sum[0]) <= 1e-9 * abs_sum, "sum n=%lld: device %.17g, host %.17g",
          (long long)n, sum[1], sum[0]);
    CHECK(max_abs[1] == max_abs[0], "max_abs n=%lld: device %.9g, host %.9g", (long long)n,
          max_abs[1], max_abs[0]);
    CHECK(fabs(norm[1] - norm[0]) <= 1e-9 * norm[0], "norm2 n=%lld: device %.17g, host %.17g",
          (long long)n, norm[1], norm[0]);
    /* A NaN anywhere makes every reduction NaN (max included); -inf makes them infinite. */
    const int64_t spots[3] = {0, n - 1, check_rand_int(0, n - 1)};
    for (int k = 0; k < 3; k++) {
      float saved = fdata(x.h)[spots[k]];
      const float bad[2] = {NAN, -INFINITY};
      for (int b = 0; b < 2; b++) {
        fdata(x.h)[spots[k]] = bad[b];
        CHECK_OK(l2l_tensor_copy(x.d, x.h));
        double ds = 0.0, dm = 0.0, dn = 0.0;
        CHECK_OK(l2l_sum(&ds, x.d));
        CHECK_OK(l2l_max_abs(&dm, x.d));
        CHECK_OK(l2l_norm2(&dn, x.d));
        if (b == 0)
          CHECK(isnan(ds) && isnan(dm) && isnan(dn),
                "a NaN at %lld of %lld: device sum %g, max_abs %g, norm2 %g", (long long)spots[k],
                (long long)n, ds, dm, dn);
        else
          CHECK(ds == -INFINITY && dm == INFINITY && dn == INFINITY,
                "-inf at %lld of %lld: device sum %g, max_abs %g, norm2 %g", (long long)spots[k],
                (long long)n, ds, dm, dn);
      }
      fdata(x.h)[spots[k]] = saved;
    }
    TWIN_FREE(&x);
  }
  end_gpu();
}

/* ================================================================ AdamW */

TEST(cuda_adamw) {
  if (!use_gpu()) return;
  static const int64_t sizes[] = {1, 7 * 13, 257 * 31, 1000003};
  const l2l_adamw_config configs[2] = {{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f},
                                       {3e-4f, 0.8f, 0.95f, 1e-6f, 0.0f}};
  for (int s = 0; s < 4; s++)
    for (int k = 0; k < 2; k++) {
      int64_t n = sizes[s], t0 = k ? 1000 : 1;
      /* Each element its own gradient size, 1e-4 to 10, so that v meets eps for some;
         config 1 resumes at step 1000 with random moments. */
      double *gsize = xmalloc((size_t)n * sizeof *gsize);
      l2l_tensor *m0 = HOST(L2L_F32, n), *v0 = HOST(L2L_F32, n);
      for (int64_t i = 0; i < n; i++) {
        gsize[i] = pow(10.0, check_rand_uniform(-4, 1));
        fdata(m0)[i] = k ? (float)(0.1 * gsize[i] * check_rand_normal()) : 0.0f;
        fdata(v0)[i] = k ? (float)(gsize[i] * gsize[i] * check_rand_uniform(0, 2)) : 0.0f;
      }
      struct twin p = twin_of(RANDN(1.0, n)), m = twin_of(m0), v = twin_of(v0);
      for (int64_t t = t0; t < t0 + 6; t++) {
        l2l_tensor *g0 = HOST(L2L_F32, n);
        for (int64_t i = 0; i < n; i++) fdata(g0)[i] = (float)(gsize[i] * check_rand_normal());
        struct twin g = twin_of(g0);
        SIDES OK_ON(l2l_adamw_update(AT(p), AT(m), AT(v), AT(g), &configs[k], t));
        char what[160];
        snprintf(what, sizeof what, "adamw n=%lld config %d step %lld: param", (long long)n, k,
                 (long long)t);
        /* params are O(1) and move by ~lr a step: floor 1e-2 */
        CHECK_TWIN(what, p, 1e-2, TOL_F32);
        /* m = b1 m + (1-b1) g cancels where the signs differ, leaving an absolute error
           of an ulp of the element's gradient size: compared in units of that size,
           floor 0.1 (m's typical size in those units), as test_ops does */
        snprintf(what, sizeof what, "adamw n=%lld config %d step %lld: m (in units of the "
                 "gradient size)", (long long)n, k, (long long)t);
        l2l_tensor *mb = copied_to(m.d, L2L_POOL_HOST);
        float *got = xmalloc((size_t)n * sizeof *got), *want = xmalloc((size_t)n * sizeof *want);
        for (int64_t i = 0; i < n; i++) {
          got[i] = (float)(fdata(mb)[i] / gsize[i]);
          want[i] = (float)(fdata(m.h)[i] / gsize[i]);
        }
        CHECK_CLOSE(what, got, want, n, 0.1, TOL_F32);
        free(got);
        free(want);
        l2l_tensor_free(mb);
        snprintf(what, sizeof what, "adamw n=%lld config %d step %lld: v", (long long)n, k,
                 (long long)t);
        CHECK_TWIN(what, v, RMS, TOL_F32);
        TWIN_FREE(&g);
      }
      free(gsize);
      TWIN_FREE(&p, &m, &v);
    }
  end_gpu();
}
