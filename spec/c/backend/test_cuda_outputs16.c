/* SPDX-License-Identifier: MIT */
/* test_cuda_outputs16.c — the CUDA backend's 16-bit outputs (LAYER_ACTS_16: an activation a
 * 16-bit GEMM reads next, kept or made in 16 bits by the op before it) and the 16-bit rows
 * its bias gradient reads, against the same kernels' f32 results and the CPU backend's.
 *
 * Purpose: every fused op that writes a 16-bit copy beside (or instead of) its f32 output
 * must write the f32 output rounded as the cast rounds it, bit for bit, at any alignment;
 * the bias add whose sums go to 16 bits (the qkv map's q, k, v) is the CPU's add rounded;
 * a bias gradient over 16-bit rows (attention's dq, dk, dv) is the CPU's over the same.
 * test_cuda.c says how the GPU tests test; the harness and the tolerances are
 * cuda_twins.h's. All test names start with "cuda_".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/accelerators.h"
#include "cuda_twins.h"

/* The device's f32 y rounded on the host is what the same kernel wrote as y16, bit for bit
   (the cast the layers made before). */
static void check_y16(const char *what, const l2l_tensor *y_dev, const l2l_tensor *y16_dev,
                      l2l_dtype dtype) {
  l2l_tensor *back = copied_to(y_dev, L2L_POOL_HOST);
  struct twin t = pair(cast_on_host(back, dtype), (l2l_tensor *)y16_dev);
  CHECK_TWIN_BITS(what, t);
  l2l_tensor_free(t.h);
  l2l_tensor_free(back);
}

/* The same for a 16-bit output written from `wide`'s element 1 on (an odd element: rows
   that start off every alignment), n of them. */
static void check_y16_at_odd(const char *what, const l2l_tensor *y_dev, const l2l_tensor *wide,
                             int64_t n, l2l_dtype dtype) {
  l2l_tensor *back = copied_to(wide, L2L_POOL_HOST), *y_back = copied_to(y_dev, L2L_POOL_HOST);
  l2l_tensor *want = cast_on_host(y_back, dtype);
  CHECK(memcmp((uint16_t *)l2l_tensor_data(back) + 1, l2l_tensor_data(want), (size_t)n * 2) == 0,
        "%s: at an odd element, not y rounded (%s)", what, l2l_dtype_name(dtype));
  l2l_tensor_free(back), l2l_tensor_free(y_back), l2l_tensor_free(want);
}

/* The fused ops' 16-bit outputs (LAYER_ACTS_16: the activation a 16-bit GEMM reads next;
   the logits' gradient), beside y and alone, for both 16-bit types, unaligned 16-bit rows
   included. */
TEST(cuda_backend_16bit_outputs) {
  if (!use_gpu()) return;
  const struct backend_ops *dops = backend_for(L2L_POOL_DEVICE);
  /* (rows of 4, 768, 1024, 2048 and 3072: LayerNorm's rows held in a warp's registers) */
  static const int64_t shapes[][2] = {{1, 1},   {7, 33},    {13, 3072}, {1031, 257},
                                      {9, 4},   {37, 768},  {5, 1024},  {21, 2048}};
  static const l2l_dtype halves[] = {L2L_BF16, L2L_F16};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    for (int d = 0; d < 2; d++) {
      const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
      const l2l_dtype dt = halves[d];
      char what[160];
      l2l_tensor *x0 = HOST(L2L_F32, rows, cols), *w0 = HOST(L2L_F32, cols), *b0 = HOST(L2L_F32, cols);
      layernorm_inputs(x0, w0, b0);
      struct twin x = twin_of(x0), w = twin_of(w0), b = twin_of(b0), add = twin_of(RANDN(1.0, rows, cols));
      l2l_tensor *y0 = NANS(rows, cols), *y = copied_to(y0, L2L_POOL_DEVICE);
      l2l_tensor *sum = DEV(L2L_F32, rows, cols);
      l2l_tensor_free(y0);
      l2l_tensor *h = DEV(dt, rows, cols), *h_alone = DEV(dt, rows, cols);
      CHECK_OK(dops->layernorm_forward(fdata(y), l2l_tensor_data(h), dt, NULL, NULL, fdata(x.d),
                                       fdata(w.d), fdata(b.d), 1e-5f, rows, cols));
      CHECK_OK(dops->layernorm_forward(NULL, l2l_tensor_data(h_alone), dt, NULL, NULL, fdata(x.d),
                                       fdata(w.d), fdata(b.d), 1e-5f, rows, cols));
      CHECK_OK(l2l_device_synchronize());
      snprintf(what, sizeof what, "layernorm_forward %lldx%lld y16 (%s)", (long long)rows,
               (long long)cols, l2l_dtype_name(dt));
      check_y16(what, y, h, dt);
      check_y16(what, y, h_alone, dt);
      CHECK_OK(dops->add_layernorm_forward(fdata(sum), fdata(y), l2l_tensor_data(h), dt, NULL, NULL,
                                           fdata(x.d), fdata(add.d), fdata(w.d), fdata(b.d), 1e-5f,
                                           rows, cols));
      CHECK_OK(dops->add_layernorm_forward(fdata(sum), NULL, l2l_tensor_data(h_alone), dt, NULL,
                                           NULL, fdata(x.d), fdata(add.d), fdata(w.d),
                                           fdata(b.d), 1e-5f, rows, cols));
      CHECK_OK(l2l_device_synchronize());
      snprintf(what, sizeof what, "add_layernorm_forward %lldx%lld y16 (%s)", (long long)rows,
               (long long)cols, l2l_dtype_name(dt));
      check_y16(what, y, h, dt);
      check_y16(what, y, h_alone, dt);
      /* bias + GELU over a copy of x (pre is written back), and without a bias */
      for (int with_bias = 0; with_bias < 2; with_bias++) {
        l2l_tensor *pre = copied_to(x.d, L2L_POOL_DEVICE), *pre2 = copied_to(x.d, L2L_POOL_DEVICE);
        const float *bias = with_bias ? fdata(b.d) : NULL;
        CHECK_OK(dops->bias_gelu_forward(fdata(pre), fdata(y), l2l_tensor_data(h), dt, NULL, bias,
                                         rows, cols));
        CHECK_OK(dops->bias_gelu_forward(fdata(pre2), NULL, l2l_tensor_data(h_alone), dt, NULL,
                                         bias, rows, cols));
        CHECK_OK(l2l_device_synchronize());
        snprintf(what, sizeof what, "bias_gelu_forward %lldx%lld%s y16 (%s)", (long long)rows,
                 (long long)cols, with_bias ? "" : " without a bias", l2l_dtype_name(dt));
        check_y16(what, y, h, dt);
        check_y16(what, y, h_alone, dt);
        l2l_tensor_free(pre);
        l2l_tensor_free(pre2);
      }
      /* the logits' gradient (cols the vocabulary), beside the f32 one and alone */
      l2l_tensor *targets0 = HOST(L2L_I32, rows);
      random_targets(targets0, (int32_t)cols, -1);
      l2l_tensor *targets = copied_to(targets0, L2L_POOL_DEVICE);
      CHECK_OK(dops->cross_entropy_fused(NULL, fdata(y), l2l_tensor_data(h), dt, fdata(x.d),
                                         idata(targets), -1, 0.25f, rows, cols, cols));
      CHECK_OK(dops->cross_entropy_fused(NULL, NULL, l2l_tensor_data(h_alone), dt, fdata(x.d),
                                         idata(targets), -1, 0.25f, rows, cols, cols));
      CHECK_OK(l2l_device_synchronize());
      snprintf(what, sizeof what, "cross_entropy_fused %lldx%lld dlogits16 (%s)", (long long)rows,
               (long long)cols, l2l_dtype_name(dt));
      check_y16(what, y, h, dt);
      check_y16(what, y, h_alone, dt);
      l2l_tensor_free(targets0), l2l_tensor_free(targets);
      /* GELU's backward, both forms (x as dy, the layer's values as y), its 16-bit dx copy
         beside dx and alone (a 16-bit run's), at an odd element too */
      l2l_tensor *odd16 = DEV(dt, n + 1);
      for (int form = 0; form < 2; form++) {
        l2l_tensor *gy = DEV(L2L_F32, rows, cols), *gbits = DEV(L2L_U8, (n + 7) / 8);
        CHECK_OK(dops->gelu_forward_bits(fdata(gy), l2l_tensor_data(gbits), fdata(x.d), n));
        for (int alone = 0; alone < 3; alone++) {
          float *dx = alone ? NULL : fdata(y);
          void *out16 = alone == 2 ? (uint16_t *)l2l_tensor_data(odd16) + 1
                                   : l2l_tensor_data(alone ? h_alone : h);
          if (form)
            CHECK_OK(dops->gelu_backward_from_output(dx, out16, dt, fdata(add.d), fdata(gy),
                                                     l2l_tensor_data(gbits), n));
          else
            CHECK_OK(dops->gelu_backward(dx, out16, dt, fdata(add.d), fdata(x.d), n));
        }
        CHECK_OK(l2l_device_synchronize());
        snprintf(what, sizeof what, "%s %lldx%lld dx16 (%s)",
                 form ? "gelu_backward_from_output" : "gelu_backward", (long long)rows,
                 (long long)cols, l2l_dtype_name(dt));
        check_y16(what, y, h, dt);
        check_y16(what, y, h_alone, dt);
        check_y16_at_odd(what, y, odd16, n, dt);   /* (dx16 alone) */
        l2l_tensor_free(gy), l2l_tensor_free(gbits);
      }
      l2l_tensor_free(odd16);
      /* the bias add whose sums go to 16 bits (the qkv map's), x only read */
      l2l_tensor *sums = copied_to(x.d, L2L_POOL_DEVICE);
      CHECK_OK(dops->bias_add(fdata(sums), NULL, L2L_F32, fdata(b.d), rows, cols));
      CHECK_OK(dops->bias_add(fdata(x.d), l2l_tensor_data(h), dt, fdata(b.d), rows, cols));
      CHECK_OK(l2l_device_synchronize());
      snprintf(what, sizeof what, "bias_add %lldx%lld to 16 bits (%s)", (long long)rows,
               (long long)cols, l2l_dtype_name(dt));
      check_y16(what, sums, h, dt);
      CHECK_TWIN_BITS(what, x);
      l2l_tensor_free(sums);
      /* a 16-bit output at an odd element: rows that start off every alignment */
      l2l_tensor *wide = DEV(dt, n + 1);
      uint16_t *odd = (uint16_t *)l2l_tensor_data(wide) + 1;
      static const char *const odd_ops[] = {"layernorm_forward", "bias_gelu_forward", "bias_add"};
      for (int op = 0; op < 3; op++) {
        l2l_tensor *pre = copied_to(x.d, L2L_POOL_DEVICE);
        if (op == 0) {
          CHECK_OK(dops->layernorm_forward(fdata(y), odd, dt, NULL, NULL, fdata(x.d), fdata(w.d),
                                           fdata(b.d), 1e-5f, rows, cols));
        } else if (op == 1) {
          CHECK_OK(dops->bias_gelu_forward(fdata(pre), fdata(y), odd, dt, NULL, fdata(b.d), rows,
                                           cols));
        } else {   /* y: the f32 sums */
          CHECK_OK(dops->bias_add(fdata(pre), NULL, L2L_F32, fdata(b.d), rows, cols));
          CHECK_OK(l2l_tensor_copy(y, pre));
          CHECK_OK(dops->bias_add(fdata(x.d), odd, dt, fdata(b.d), rows, cols));
        }
        CHECK_OK(l2l_device_synchronize());
        snprintf(what, sizeof what, "%s %lldx%lld y16", odd_ops[op], (long long)rows,
                 (long long)cols);
        check_y16_at_odd(what, y, wide, n, dt);
        l2l_tensor_free(pre);
      }
      l2l_tensor_free(wide);
      l2l_tensor_free(y), l2l_tensor_free(sum), l2l_tensor_free(h), l2l_tensor_free(h_alone);
      TWIN_FREE(&x, &w, &b, &add);
    }
  }
  end_gpu();
}


/* LayerNorm's backward with the residual branch's gradient added in the same pass and its
   16-bit copy (the pre-LN block's dh = ln2'(dc) + dy and dx = ln1'(da) + dh): dx against
   the CPU's, dx16 against the device's dx rounded, both forms, rows the block kernels and
   the warp's registers take, the 16-bit copy at an odd element too. */
TEST(cuda_backend_layernorm_backward_residual_16bit) {
  if (!use_gpu()) return;
  const struct backend_ops *hops = backend_for(L2L_POOL_HOST);
  const struct backend_ops *dops = backend_for(L2L_POOL_DEVICE);
  static const int64_t shapes[][2] = {{1, 33}, {7, 33}, {1031, 257}, {33, 4099}, {4099, 768},
                                      {5, 1024}, {9, 300}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int form = 0; form < 2; form++) {   /* from the input (mean, rstd), from the output */
      const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
      const l2l_dtype dt = (s + form) & 1 ? L2L_F16 : L2L_BF16;
      l2l_tensor *x0 = HOST(L2L_F32, rows, cols), *w0 = HOST(L2L_F32, cols), *b0 = HOST(L2L_F32, cols);
      layernorm_inputs(x0, w0, b0);
      for (int64_t j = 0; j < cols; j++) /* |weight| >= 0.5: x^ = (y - b) / w recovers x */
        fdata(w0)[j] = (float)((check_rand_int(0, 1) ? 1 : -1) * (0.5 + fabs(0.5 * check_rand_normal())));
      l2l_tensor *y0 = HOST(L2L_F32, rows, cols), *mean0 = HOST(L2L_F32, rows), *rstd0 = HOST(L2L_F32, rows);
      CHECK_OK(l2l_layernorm_forward(y0, mean0, rstd0, x0, w0, b0, 1e-5f));
      struct twin x = twin_of(x0), y = twin_of(y0), w = twin_of(w0), b = twin_of(b0);
      struct twin mean = twin_of(mean0), rstd = twin_of(rstd0), dy = twin_of(RANDN(1.0, rows, cols));
      struct twin res = twin_of(RANDN(1.0, rows, cols)), dx = twin_of(NANS(rows, cols));
      struct twin dw = twin_of(RANDN(1.0, cols)), db = twin_of(RANDN(1.0, cols)); /* += */
      l2l_tensor *h = DEV(dt, rows, cols), *wide = DEV(dt, n + 1);
      uint16_t *odd = (uint16_t *)l2l_tensor_data(wide) + 1;
      for (int side = 0; side < 3; side++) {   /* the host, the device, the device's odd dx16 */
        const struct backend_ops *ops = side ? dops : hops;
        const bool d = side > 0;
        float *dxp = side == 2 ? NULL : fdata(d ? dx.d : dx.h);
        l2l_tensor *dx_odd = side == 2 ? DEV(L2L_F32, rows, cols) : NULL;
        if (dx_odd) dxp = fdata(dx_odd);
        void *h16 = side == 0 ? NULL : side == 1 ? l2l_tensor_data(h) : (void *)odd;
        float *dwp = side == 2 ? NULL : fdata(d ? dw.d : dw.h), *dbp = side == 2 ? NULL : fdata(d ? db.d : db.h);
#define SIDE_OF(t) fdata(d ? (t).d : (t).h)
        if (form)
          CHECK_OK(ops->layernorm_backward_from_output(dxp, h16, dt, dwp, dbp, SIDE_OF(dy), SIDE_OF(res),
                                                       SIDE_OF(y), SIDE_OF(w), SIDE_OF(b),
                                                       SIDE_OF(rstd), rows, cols));
        else
          CHECK_OK(ops->layernorm_backward(dxp, h16, dt, dwp, dbp, SIDE_OF(dy), SIDE_OF(res),
                                           SIDE_OF(x), SIDE_OF(w), SIDE_OF(mean), SIDE_OF(rstd),
                                           rows, cols));
#undef SIDE_OF
        l2l_tensor_free(dx_odd);
      }
      CHECK_OK(l2l_device_synchronize());
      char what[160];
      snprintf(what, sizeof what, "%s (%lld,%lld) + residual: dx",
               form ? "layernorm_backward_from_output" : "layernorm_backward", (long long)rows,
               (long long)cols);
      CHECK_TWIN(what, dx, RMS, tol_sum(cols));
      CHECK_TWIN(what, dw, RMS, tol_sum(rows));
      CHECK_TWIN(what, db, RMS, tol_sum(rows));
      snprintf(what, sizeof what, "%s (%lld,%lld) + residual: dx16 (%s)",
               form ? "layernorm_backward_from_output" : "layernorm_backward", (long long)rows,
               (long long)cols, l2l_dtype_name(dt));
      check_y16(what, dx.d, h, dt);
      check_y16_at_odd(what, dx.d, wide, n, dt);
      l2l_tensor_free(h), l2l_tensor_free(wide);
      TWIN_FREE(&x, &y, &w, &b, &mean, &rstd, &dy, &res, &dx, &dw, &db);
    }
  end_gpu();
}

/* The GEMM whose bias add, and rounding to 16 bits, ride in its epilogue (cuBLASLt where it
   is loaded, which must then have run; and switched off, the GEMM and the bias kernel)
   against the CPU's GEMM and bias add: the f32 sums within the GEMM's tolerance (the same
   rounded inputs: TOL_HALF_SAME_INPUT of sqrt(k), an element's scale); 16-bit sums within
   that and a 16-bit ulp of their size. The block's map shapes, odd ones, the transposes,
   with a bias and without. */
TEST(cuda_gemm_bias) {
  if (!use_gpu()) return;
  const struct backend_ops *hops = backend_for(L2L_POOL_HOST);
  const struct backend_ops *dops = backend_for(L2L_POOL_DEVICE);
  char about[512];
  const bool lt = cublaslt_probe(about, sizeof about) != 0;
  printf("  %s\n", about);
  const int64_t before = cublaslt_runs();
  int cases[2] = {0, 0}, epilogues[2] = {0, 0};   /* [to 16 bits]: with cuBLASLt on, taken */
  static const int64_t shapes[][3] = {{37, 2304, 768}, {64, 768, 3072}, {7, 33, 5}, {1031, 257, 64},
                                      {1, 1, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int v = 0; v < 8; v++) {
      const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
      const l2l_dtype ab = v & 1 ? L2L_BF16 : L2L_F16;
      const bool with_bias = (v & 2) == 0, to16 = (v & 4) != 0;
      const int ta = (int)check_rand_int(0, 1), tb = (int)check_rand_int(0, 1);
      cublaslt_enable(v != 6);   /* (one case a shape on the steps) */
      l2l_tensor *a32 = RANDN(1.0, m * k), *b32 = RANDN(1.0, k * n);
      struct twin a = twin_of(cast_on_host(a32, ab)), b = twin_of(cast_on_host(b32, ab));
      struct twin bias = twin_of(RANDN(1.0, n)), c = twin_of(NANS(m, n));
      l2l_tensor *c16 = DEV(ab, m, n);
      const float *bh = with_bias ? fdata(bias.h) : NULL, *bd = with_bias ? fdata(bias.d) : NULL;
      CHECK_OK(hops->gemm_bias(fdata(c.h), NULL, L2L_F32, l2l_tensor_data(a.h),
                               l2l_tensor_data(b.h), ab, bh, m, n, k, ta, tb));
      const int64_t runs = cublaslt_runs();
      CHECK_OK(dops->gemm_bias(fdata(c.d), to16 ? l2l_tensor_data(c16) : NULL, ab,
                               l2l_tensor_data(a.d), l2l_tensor_data(b.d), ab, bd, m, n, k, ta,
                               tb));
      if (v != 6) cases[to16]++, epilogues[to16] += cublaslt_runs() != runs;
      CHECK_OK(l2l_device_synchronize());
      char what[160];
      snprintf(what, sizeof what, "gemm_bias m=%lld n=%lld k=%lld %c%c %s%s%s%s", (long long)m,
               (long long)n, (long long)k, ta ? 'T' : 'N', tb ? 'T' : 'N', l2l_dtype_name(ab),
               with_bias ? " +bias" : "", to16 ? " to 16 bits" : "", v == 6 ? " (steps)" : "");
      const double scale = sqrt((double)k) + (with_bias ? 1.0 : 0.0);
      if (!to16) {
        CHECK_TWIN(what, c, scale, TOL_HALF_SAME_INPUT);
      } else {   /* the 16-bit sums widened against the CPU's f32 ones */
        l2l_tensor *back = copied_to(c16, L2L_POOL_HOST), *wide = cast_on_host(back, L2L_F32);
        const double ulp = ab == L2L_BF16 ? 0x1p-7 : 0x1p-10;   /* (a 16-bit ulp at most) */
        int64_t bad = 0;
        const float *got = fdata(wide), *want = fdata(c.h);
        for (int64_t i = 0; i < m * n; i++)
          bad += !(fabs((double)got[i] - want[i]) <= TOL_HALF_SAME_INPUT * scale + ulp * fabs((double)want[i]));
        CHECK(bad == 0, "%s: %lld of %lld elements off the CPU's sums", what, (long long)bad,
              (long long)(m * n));
        l2l_tensor_free(back), l2l_tensor_free(wide);
      }
      l2l_tensor_free(a32), l2l_tensor_free(b32), l2l_tensor_free(c16);
      TWIN_FREE(&a, &b, &bias, &c);
    }
  cublaslt_enable(1);
  printf("  cuBLASLt's epilogue took %d of %d calls to f32, %d of %d to 16 bits\n", epilogues[0],
         cases[0], epilogues[1], cases[1]);
  if (lt) CHECK(cublaslt_runs() > before, "cuBLASLt is loaded (%s) but ran none of the calls", about);
  end_gpu();
}
