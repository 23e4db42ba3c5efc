/* SPDX-License-Identifier: MIT */
/* test_norm_emulated.c — the GPU's LayerNorm launchers and kernels (kernels/norm.cu), their
 * own source run on the CPU by norm_emulated.cpp, against the CPU backend's LayerNorm.
 *
 * Purpose: LayerNorm runs in every block of a GPU step; its kernels that keep a row in a
 * warp's registers (rows up to 4096 forward, 1024 backward, the residual branch's gradient
 * added and dx rounded to 16 bits in the same pass) were written where no GPU ran them.
 * Here the launchers choose their kernels as on a GPU (warp rows, rows in registers, a block
 * a row; the column partials of dweight and dbias) at drawn rows and widths across each
 * kernel's bounds, and every output is held to the CPU's within the GPU tests' tolerances
 * (test_cuda.c's cuda_layernorm, test_cuda_outputs16.c's): forward with and without mean and
 * rstd and its 16-bit y, the fused add, the backward from the input and from the output, with
 * and without the residual, dx16 and the parameter gradients (accumulated into).
 * Must never: need a GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cuda_twins.h"
#if L2L_KERNEL_EMULATION
#include "norm_emulated.h"
#endif

#if L2L_KERNEL_EMULATION

/* One shape: every form on both sides. */
/* One drawn case; every_backward: the backward's eight forms (from x or the output, with
   and without the residual and dx16, with and without the parameter gradients), else one
   of them drawn. */
static bool norm_case(int64_t rows, int64_t cols, bool every_backward) {
  const struct backend_ops *cpu = backend_for(L2L_POOL_HOST);
  const int64_t n = rows * cols;
  const l2l_dtype t = check_rand_int(0, 1) ? L2L_BF16 : L2L_F16;
  const float eps = 1e-5f;
  char what[200];
  bool ok = true;
  l2l_tensor *xt = HOST(L2L_F32, rows, cols), *wt = HOST(L2L_F32, cols), *bt = HOST(L2L_F32, cols);
  layernorm_inputs(xt, wt, bt);
  for (int64_t j = 0; j < cols; j++) /* |weight| >= 0.5: x^ = (y - b) / w recovers x */
    fdata(wt)[j] = (float)((check_rand_int(0, 1) ? 1 : -1) * (0.5 + fabs(0.5 * check_rand_normal())));
  const float *x = fdata(xt), *w = fdata(wt), *b = fdata(bt);
  const double tc = tol_sum(cols), tr = tol_sum(rows);

  /* forward: y, y16, mean, rstd; the fused add (a + b' with b' = x - a) */
  float *y[2] = {host_floats(n, NAN), host_floats(n, NAN)};
  float *mean[2] = {host_floats(rows, NAN), host_floats(rows, NAN)};
  float *rstd[2] = {host_floats(rows, NAN), host_floats(rows, NAN)};
  /* 16-bit outputs 2 bytes past an 8-byte boundary at times (the kernels' unpacked stores) */
  const int64_t odd = check_rand_int(0, 1);
  uint16_t *y16_buf = malloc((size_t)(n + 1) * 2), *y16 = y16_buf + odd;
  ok &= CHECK_OK(cpu->layernorm_forward(y[0], NULL, L2L_F32, mean[0], rstd[0], x, w, b, eps, rows, cols));
  ok &= CHECK(emu_k_layernorm_forward(y[1], y16, (int)t, mean[1], rstd[1], x, w, b, eps, rows, cols,
                                      NULL) == 0, "(%lld, %lld): the forward's launch", (long long)rows,
              (long long)cols);
  snprintf(what, sizeof what, "layernorm_forward (%lld, %lld): y", (long long)rows, (long long)cols);
  ok &= CHECK_CLOSE(what, y[1], y[0], n, RMS, tc);
  snprintf(what, sizeof what, "layernorm_forward (%lld, %lld): y16 (%s)", (long long)rows,
           (long long)cols, l2l_dtype_name(t));
  ok &= CHECK_ROUNDED16(what, y16, y[1], 1, n, n, t);
  snprintf(what, sizeof what, "layernorm_forward (%lld, %lld): mean", (long long)rows, (long long)cols);
  ok &= CHECK_CLOSE(what, mean[1], mean[0], rows, rms_tensor(xt), tc);
  snprintf(what, sizeof what, "layernorm_forward (%lld, %lld): rstd", (long long)rows, (long long)cols);
  ok &= CHECK_CLOSE(what, rstd[1], rstd[0], rows, RMS, tc);

  float *a = host_normals(n, 1.0), *bb = host_floats(n, 0.0f), *sum = host_floats(n, NAN);
  float *y2 = host_floats(n, NAN);
  for (int64_t i = 0; i < n; i++) bb[i] = x[i] - a[i];
  float *y_ref = host_floats(n, NAN), *sum_ref = host_floats(n, NAN);
  ok &= CHECK_OK(cpu->add_layernorm_forward(sum_ref, y_ref, NULL, L2L_F32, NULL, NULL, a, bb, w, b, eps,
                                            rows, cols));
  /* sum written apart, or in place of either input (as the block adds into the residual) */
  const int alias = (int)check_rand_int(0, 2);
  if (alias) memcpy(sum, alias == 1 ? a : bb, (size_t)n * sizeof *sum);
  ok &= CHECK(emu_k_add_layernorm_forward(sum, y2, NULL, 0, NULL, NULL, alias == 1 ? sum : a,
                                          alias == 2 ? sum : bb, w, b, eps, rows, cols, NULL) == 0,
              "(%lld, %lld): the fused add's launch", (long long)rows, (long long)cols);
  static const char *const in_place[] = {"", ", in place of a", ", in place of the addend"};
  snprintf(what, sizeof what, "add_layernorm_forward (%lld, %lld)%s: sum", (long long)rows,
           (long long)cols, in_place[alias]);
  ok &= CHECK_CLOSE(what, sum, sum_ref, n, RMS, TOL_F32);
  snprintf(what, sizeof what, "add_layernorm_forward (%lld, %lld)%s: y", (long long)rows,
           (long long)cols, in_place[alias]);
  ok &= CHECK_CLOSE(what, y2, y_ref, n, RMS, tc);

  /* backward from the CPU's forward, both forms, with and without the residual, dx16 and the
     parameter gradients (accumulated into from the same start) */
  float *dy = host_normals(n, 1.0), *res = host_normals(n, 1.0);
  float *dw0 = host_normals(cols, 1.0), *db0 = host_normals(cols, 1.0);
  const int64_t scratch_floats = emu_k_layernorm_backward_scratch_floats(rows, cols);
  float *scratch = host_floats(scratch_floats, NAN);
  const int drawn = (int)check_rand_int(0, 7);
  for (int form = 0; form < 2; form++)
    for (int extra = 0; extra < 2; extra++)
      for (int grads = 0; grads < 2; grads++) {
        if (!every_backward && 4 * form + 2 * extra + grads != drawn) continue;
        float *dx[2] = {host_floats(n, NAN), host_floats(n, NAN)};
        float *dw[2] = {host_floats(cols, 0), host_floats(cols, 0)};
        float *db[2] = {host_floats(cols, 0), host_floats(cols, 0)};
        memcpy(dw[0], dw0, (size_t)cols * 4), memcpy(dw[1], dw0, (size_t)cols * 4);
        memcpy(db[0], db0, (size_t)cols * 4), memcpy(db[1], db0, (size_t)cols * 4);
        uint16_t *dx16_buf = extra ? malloc((size_t)(n + 1) * 2) : NULL;
        uint16_t *dx16 = extra ? dx16_buf + odd : NULL;
        const float *r = extra ? res : NULL;
        /* the residual at times in dx itself (the gradient added into it in place), for the
           kernels: they must read it all before the first write of dx */
        const bool in_dx = extra && check_rand_int(0, 1);
        if (in_dx) memcpy(dx[1], res, (size_t)n * sizeof *res);
        const float *r1 = in_dx ? dx[1] : r;
        float *gw[2] = {grads ? dw[0] : NULL, grads ? dw[1] : NULL};
        float *gb[2] = {grads ? db[0] : NULL, grads ? db[1] : NULL};
        int launched;
        if (form) {
          ok &= CHECK_OK(cpu->layernorm_backward_from_output(dx[0], NULL, L2L_F32, gw[0], gb[0], dy, r,
                                                             y[0], w, b, rstd[0], rows, cols));
          launched = emu_k_layernorm_backward_from_output(dx[1], dx16, (int)t, gw[1], gb[1], dy, r1,
                                                          y[0], w, b, rstd[0], rows, cols, scratch,
                                                          NULL);
        } else {
          ok &= CHECK_OK(cpu->layernorm_backward(dx[0], NULL, L2L_F32, gw[0], gb[0], dy, r, x, w,
                                                 mean[0], rstd[0], rows, cols));
          launched = emu_k_layernorm_backward(dx[1], dx16, (int)t, gw[1], gb[1], dy, r1, x, w, mean[0],
                                              rstd[0], rows, cols, scratch, NULL);
        }
        snprintf(what, sizeof what, "%s (%lld, %lld)%s%s%s",
                 form ? "layernorm_backward_from_output" : "layernorm_backward", (long long)rows,
                 (long long)cols, extra ? " + residual, dx16" : "", in_dx ? " (residual in dx)" : "",
                 grads ? " with dweight, dbias" : "");
        ok &= CHECK(launched == 0, "%s: the launch", what);
        char part[260];
        snprintf(part, sizeof part, "%s: dx", what);
        ok &= CHECK_CLOSE(part, dx[1], dx[0], n, RMS, tc);
        if (dx16) {
          snprintf(part, sizeof part, "%s: dx16 (%s)", what, l2l_dtype_name(t));
          ok &= CHECK_ROUNDED16(part, dx16, dx[1], 1, n, n, t);
        }
        if (grads) {
          snprintf(part, sizeof part, "%s: dweight", what);
          ok &= CHECK_CLOSE(part, dw[1], dw[0], cols, RMS, tr);
          snprintf(part, sizeof part, "%s: dbias", what);
          ok &= CHECK_CLOSE(part, db[1], db[0], cols, RMS, tr);
        }
        free(dx[0]), free(dx[1]), free(dw[0]), free(dw[1]), free(db[0]), free(db[1]), free(dx16_buf);
      }
  free(dy), free(res), free(dw0), free(db0), free(scratch);
  free(a), free(bb), free(sum), free(y2), free(y_ref), free(sum_ref), free(y16_buf);
  for (int i = 0; i < 2; i++) free(y[i]), free(mean[i]), free(rstd[i]);
  l2l_tensor_free(xt), l2l_tensor_free(wt), l2l_tensor_free(bt);
  return ok;
}

#endif /* L2L_KERNEL_EMULATION */

TEST(norm_kernels_emulated_against_the_cpu) {
#if !L2L_KERNEL_EMULATION
  check_skip(NO_KERNEL_EMULATION);
#else
  /* widths across the kernels' bounds: a warp a row (<= 256), a row in a warp's registers
     (whole float4s: forward from 4 columns up to 4096, its 16 and 32 float4s a lane past
     1024 and 2048; backward past 256, up to 1024), a block a row (past those, or past 256
     in other widths); rows across a block's 8 warps. (Not 1 or 2 columns: x^ is then +-1
     or 0 exactly and dx rounding noise on both sides, as test_cuda.c's cuda_layernorm
     says.) */
  static const struct {
    int64_t lo, hi;
    int quads;         /* 1: a multiple of 4, 0: any, -1: not a multiple of 4 */
    int64_t most_rows;   /* (fewer for wide rows: the backward's block of 1024 emulated threads) */
    bool every_backward; /* (the forward's wider rows in registers: one backward form, drawn) */
  } widths[] = {{3, 5, 0, 40, true},        {6, 256, 0, 40, true},       {257, 1024, 1, 40, true},
                {257, 1024, -1, 40, true},  {1028, 2048, 1, 20, false},  {2052, 4096, 1, 18, false},
                {1025, 4400, -1, 3, true},  {4100, 4400, 1, 3, true}};
  /* (under ThreadSanitizer, which also checks the emulated threads' accesses against the
     kernels' barriers and runs them tens of times slower: the rows in registers alone) */
#ifdef L2L_TSAN
  const size_t first = 2, last = 2;
  const int64_t row_cap = 8;
#else
  const size_t first = 0, last = sizeof widths / sizeof widths[0] - 1;
  const int64_t row_cap = 40; /* (past the 16 row groups of two blocks of 8 warps) */
#endif
  int failed = 0;
  for (size_t i = first; i <= last && failed < 2; i++) {
    int64_t cols = check_rand_int(widths[i].lo, widths[i].hi);
    if (widths[i].quads > 0) cols = cols / 4 * 4;
    if (widths[i].quads < 0 && cols % 4 == 0) cols += 1;
    const int64_t most_rows = widths[i].most_rows < row_cap ? widths[i].most_rows : row_cap;
    /* (rows in registers: past 16 rows, so that each warp walks two rows or more) */
    const int64_t fewest = widths[i].quads > 0 && most_rows > 16 ? 17 : 1;
    failed += !norm_case(check_rand_int(fewest, most_rows), cols, widths[i].every_backward);
  }
#endif
}
