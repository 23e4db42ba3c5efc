/* SPDX-License-Identifier: MIT */
/* bench/ops.c — speed of the CPU backend's ops, side by side with what bounds them.
 *
 * Prints, in one run: GFLOP/s of l2l_gemm / l2l_gemm_batched next to raw cblas_sgemm on
 * the same buffers at transformer shapes (GPT-2 small: dim 768, MLP 3072, 1024 tokens;
 * attention with 12 heads of 64, sequence 256), and GB/s of the element-wise ops next to
 * a copy of the same bytes (memcpy on one thread, and a copy split over all threads).
 * Each pair is measured alternately, REPEATS times, and the medians are compared, so a
 * noisy neighbour slows both sides alike. Targets (issue 2): the wrapper >= 95 % of raw
 * OpenBLAS; element-wise forward ops >= 50 % of copy bandwidth.
 * Run: make bench   (L2L_THREADS=n to pin the thread count)
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

enum { REPEATS = 9 };
static l2l_tensor *tensor(int ndim, int64_t d0, int64_t d1, int64_t d2) {
  int64_t shape[3] = {d0, d1, d2};
  l2l_tensor *t = NULL;
  if (l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, ndim, shape) != L2L_OK ||
      l2l_tensor_normal(t, 1, (uint64_t)rand(), 0, 0.0, 1.0) != L2L_OK) {
    fprintf(stderr, "bench: %s\n", l2l_last_error());
    exit(1);
  }
  return t;
}

/* ---------------------------------------------------------------- GEMM */

struct gemm_case {
  const char *name;
  int64_t batch, m, n, k;
  int trans_a, trans_b;
};

static void bench_gemm(const struct gemm_case *g) {
  int batched = g->batch > 1;
  l2l_tensor *a = batched ? tensor(3, g->batch, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k)
                          : tensor(2, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, 0);
  l2l_tensor *b = batched ? tensor(3, g->batch, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n)
                          : tensor(2, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, 0);
  l2l_tensor *c = batched ? tensor(3, g->batch, g->m, g->n) : tensor(2, g->m, g->n, 0);
  const float *pa = l2l_tensor_data(a), *pb = l2l_tensor_data(b);
  float *pc = l2l_tensor_data(c);
  double flops = 2.0 * (double)g->batch * (double)g->m * (double)g->n * (double)g->k;
  int inner = flops < 1e9 ? (int)(1e9 / flops) + 1 : 1; /* >= ~1 GFLOP per sample */
  double wrapper[REPEATS], raw[REPEATS];
  for (int r = -1; r < REPEATS; r++) { /* r = -1 warms up */
    double t0 = now();
    for (int i = 0; i < inner; i++)
      ok(batched ? l2l_gemm_batched(c, a, b, g->trans_a, g->trans_b, 1.0f, 0.0f)
                 : l2l_gemm(c, a, b, g->trans_a, g->trans_b, 1.0f, 0.0f));
    double t1 = now();
    for (int i = 0; i < inner; i++)
      for (int64_t q = 0; q < g->batch; q++)
        cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                    g->trans_b ? CblasTrans : CblasNoTrans, (int)g->m, (int)g->n, (int)g->k, 1.0f,
                    pa + q * g->m * g->k, (int)(g->trans_a ? g->m : g->k), pb + q * g->k * g->n,
                    (int)(g->trans_b ? g->k : g->n), 0.0f, pc + q * g->m * g->n, (int)g->n);
    double t2 = now();
    if (r >= 0) wrapper[r] = inner * flops / (t1 - t0) / 1e9, raw[r] = inner * flops / (t2 - t1) / 1e9;
  }
  double w = median(wrapper, REPEATS), o = median(raw, REPEATS);
  printf("%-34s %8.1f %10.1f %8.1f %%\n", g->name, w, o, 100.0 * w / o);
  l2l_tensor_free(a), l2l_tensor_free(b), l2l_tensor_free(c);
}

/* ---------------------------------------------------------------- element-wise */

static void parallel_copy(float *dst, const float *src, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(l2l_get_threads())
  for (int64_t i = 0; i < n; i++) dst[i] = src[i];
}

enum op { GELU_FWD, GELU_BWD, LN_FWD, LN_BWD, SOFTMAX_FWD, SOFTMAX_BWD, ADD };

struct elementwise_case {
  const char *name;
  enum op op;
  int64_t rows, cols;
  double bytes_per_element; /* bytes each element moves (reads + writes) */
};

static void bench_elementwise(const struct elementwise_case *e) {
  int64_t n = e->rows * e->cols;
  l2l_tensor *x = tensor(2, e->rows, e->cols, 0), *y = tensor(2, e->rows, e->cols, 0);
  l2l_tensor *dy = tensor(2, e->rows, e->cols, 0);
  l2l_tensor *w = tensor(1, e->cols, 0, 0), *bias = tensor(1, e->cols, 0, 0);
  l2l_tensor *dw = tensor(1, e->cols, 0, 0), *db = tensor(1, e->cols, 0, 0);
  l2l_tensor *mean = tensor(1, e->rows, 0, 0), *rstd = tensor(1, e->rows, 0, 0);
  float *src = l2l_tensor_data(x), *dst = l2l_tensor_data(y);
  ok(l2l_layernorm_forward(y, mean, rstd, x, w, bias, 1e-5f));
  double bytes = e->bytes_per_element * (double)n, copy_bytes = 8.0 * (double)n;
  double op_bw[REPEATS], copy1[REPEATS], copyn[REPEATS];
  for (int r = -1; r < REPEATS; r++) {
    double t0 = now();
    switch (e->op) {
      case GELU_FWD: ok(l2l_gelu_forward(y, x)); break;
      case GELU_BWD: ok(l2l_gelu_backward(y, dy, x)); break;
      case LN_FWD: ok(l2l_layernorm_forward(y, mean, rstd, x, w, bias, 1e-5f)); break;
      case LN_BWD: ok(l2l_layernorm_backward(y, dw, db, dy, x, w, mean, rstd)); break;
      case SOFTMAX_FWD: ok(l2l_softmax_forward(y, x, NULL, 0, 0.125f)); break;
      case SOFTMAX_BWD: ok(l2l_softmax_backward(y, dy, x, 0.125f)); break;
      case ADD: ok(l2l_add(y, x, dy)); break;
    }
    double t1 = now();
    memcpy(dst, src, (size_t)n * sizeof *src);
    double t2 = now();
    parallel_copy(dst, src, n);
    double t3 = now();
    if (r >= 0) {
      op_bw[r] = bytes / (t1 - t0) / 1e9;
      copy1[r] = copy_bytes / (t2 - t1) / 1e9;
      copyn[r] = copy_bytes / (t3 - t2) / 1e9;
    }
  }
  double o = median(op_bw, REPEATS), c1 = median(copy1, REPEATS), cn = median(copyn, REPEATS);
  double best = c1 > cn ? c1 : cn;
  printf("%-34s %8.1f %10.1f %10.1f %8.1f %%\n", e->name, o, c1, cn, 100.0 * o / best);
  l2l_tensor *all[] = {x, y, dy, w, bias, dw, db, mean, rstd};
  for (int i = 0; i < 9; i++) l2l_tensor_free(all[i]);
}

int main(void) {
  int threads = l2l_get_threads();
  printf("l2l %s bench/ops: %d threads, %d repeats per figure (medians)\n\n", l2l_version(),
         threads, REPEATS);

  printf("%-34s %8s %10s %9s\n", "GEMM (GFLOP/s)", "l2l", "cblas", "l2l/raw");
  const struct gemm_case gemms[] = {
      {"768x3072 @ 3072x1024", 1, 768, 1024, 3072, 0, 0},
      {"qkv: 1024x768 @ 768x2304", 1, 1024, 2304, 768, 0, 0},
      {"mlp up: 1024x768 @ 768x3072", 1, 1024, 3072, 768, 0, 0},
      {"mlp down: 1024x3072 @ 3072x768", 1, 1024, 768, 3072, 0, 0},
      {"dW: (1024x768)^T @ 1024x3072", 1, 768, 3072, 1024, 1, 0},
      {"dX: 1024x3072 @ (768x3072)^T", 1, 1024, 768, 3072, 0, 1},
      {"attn QK^T: 48 x 256x64 @ (256x64)^T", 48, 256, 256, 64, 0, 1},
      {"attn PV: 48 x 256x256 @ 256x64", 48, 256, 64, 256, 0, 0},
  };
  for (size_t i = 0; i < sizeof gemms / sizeof *gemms; i++) bench_gemm(&gemms[i]);

  printf("\n%-34s %8s %10s %10s %9s\n", "element-wise (GB/s)", "l2l", "memcpy", "copy xN",
         "l2l/copy");
  /* 8 bytes per element: read x, write y (like the copy); the backward ops read two. */
  const struct elementwise_case elementwise[] = {
      {"gelu forward 16M", GELU_FWD, 4096, 4096, 8},
      {"layernorm forward 16384x768", LN_FWD, 16384, 768, 8},
      {"softmax forward 12288x1024", SOFTMAX_FWD, 12288, 1024, 8},
      {"add (residual) 16M", ADD, 4096, 4096, 12},
      {"gelu backward 16M", GELU_BWD, 4096, 4096, 12},
      {"layernorm backward 16384x768", LN_BWD, 16384, 768, 12},
      {"softmax backward 12288x1024", SOFTMAX_BWD, 12288, 1024, 12},
  };
  for (size_t i = 0; i < sizeof elementwise / sizeof *elementwise; i++)
    bench_elementwise(&elementwise[i]);
  printf("\ncopy xN: one copy split over all %d threads; l2l/copy compares with the faster "
         "copy.\n",
         threads);
  return 0;
}
