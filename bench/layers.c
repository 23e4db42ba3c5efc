/* SPDX-License-Identifier: MIT */
/* bench/layers.c — what the transformer block keeps for backward, and how fast it runs.
 *
 * Prints, in one run:
 *  1. Saved bytes per block per sample (the saved state plus the block's input when its
 *     backward reads it), standard and frugal, at BERT-Large (dim 1024, 16 heads, MLP
 *     4096, post-LN, seq 128 and 512) and GPT-2 small (768, 12, 3072, pre-LN causal, seq
 *     1024) shapes with dropout 0.1, next to the textbook fp32 estimate
 *     s*h*(66 + 9*a*s/h) of Korthikanti et al. The figures come from
 *     l2l_layer_memory_use, which tests check against the pool byte for byte.
 *  2. A block's forward + backward at GPT-2 small shapes (dim 768, 12 heads, seq 256,
 *     micro-batch 4) in each mode, against OpenBLAS sgemm alone running the same GEMM
 *     shapes (the six linear maps forward and backward, and per-head attention products
 *     at full S x S). Rate = those GEMMs' FLOPs / time. Targets (issue 3): block >= 60 %
 *     of sgemm's rate; frugal <= 1.10 x standard's time. All three are timed in turn,
 *     REPEATS times, and medians compared.
 * Run: make bench   (L2L_THREADS=n pins the threads; OMP_WAIT_POLICY as the Makefile sets)
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "bench.h"

enum { REPEATS = 7 };

static l2l_tensor *new_f32(int64_t b, int64_t s, int64_t d) {
  int64_t shape[3] = {b, s, d};
  l2l_tensor *t = NULL;
  ok(l2l_tensor_new(&t, L2L_POOL_HOST, L2L_F32, 3, shape));
  ok(l2l_tensor_normal(t, 7, (uint64_t)rand(), 0, 0.0, 1.0));
  return t;
}

static l2l_layer *new_block(int64_t dim, int64_t heads, int64_t mlp, int post_ln, int causal,
                            float dropout, l2l_memory_mode memory) {
  l2l_layer_config c = {.kind = L2L_LAYER_BLOCK, .dim = dim, .heads = heads, .mlp = mlp,
                        .causal = causal, .post_ln = post_ln, .bias = 1, .dropout = dropout,
                        .attn_dropout = dropout, .eps = 1e-5f, .memory = memory,
                        .init_std = 0.02f, .resid_std = 0.02f, .init_seed = 1};
  l2l_layer *layer = NULL;
  ok(l2l_layer_new(&layer, &c, L2L_POOL_HOST));
  return layer;
}

/* ---------------------------------------------------------------- saved bytes */

static void saved_table(void) {
  struct {
    const char *name;
    int64_t dim, heads, mlp, seq;
    int post_ln, causal;
  } shapes[] = {
      {"BERT-Large, seq 128", 1024, 16, 4096, 128, 1, 0},
      {"BERT-Large, seq 512", 1024, 16, 4096, 512, 1, 0},
      {"GPT-2 small, seq 1024", 768, 12, 3072, 1024, 0, 1},
  };
  printf("1. Bytes a block keeps for backward, per sample (f32, dropout 0.1, training)\n\n");
  printf("| shape | textbook s*h*(66+9as/h) | standard | frugal | frugal saves |\n");
  printf("|---|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    double bytes[2];
    for (int mode = 0; mode < 2; mode++) {
      l2l_layer *layer = new_block(shapes[i].dim, shapes[i].heads, shapes[i].mlp,
                                   shapes[i].post_ln, shapes[i].causal, 0.1f, mode);
      l2l_layer_memory m;
      ok(l2l_layer_memory_use(&m, layer, 1, shapes[i].seq));
      bytes[mode] = (double)(m.saved + m.input_kept);
      l2l_layer_free(layer);
    }
    double s = (double)shapes[i].seq, h = (double)shapes[i].dim, a = (double)shapes[i].heads;
    double textbook = s * h * (66.0 + 9.0 * a * s / h);
    printf("| %s | %.1f MiB | %.1f MiB | %.1f MiB | %.1f %% |\n", shapes[i].name,
           textbook / 1048576, bytes[0] / 1048576, bytes[1] / 1048576,
           100.0 * (1.0 - bytes[1] / bytes[0]));
  }
  printf("\n(Tempo reports 27-38 %% saved on a BERT-Large layer in fp32.)\n\n");
}

/* ---------------------------------------------------------------- speed */

/* The block's GEMMs (row-major, as l2l runs them): the four linear maps forward (y = x W),
   backward (dW = x^T dy, dx = dy W^T), and per (sample, head) the attention products
   S = q k^T, o = P v forward and dP = do v^T, dv = P^T do, dq = dS k, dk = dS^T q
   backward, at full S x S. Returns their FLOPs; runs them when `run`. */
struct gemm_bufs {
  float *x, *w, *y, *dw, *dx; /* big enough for every linear shape; inputs never change */
  float *q, *p, *o;     /* attention: (S, hd) rows with stride 3D, (S, S), 2 x (S, hd) */
};

static double block_gemms(const struct gemm_bufs *g, int64_t n, int64_t d, int64_t f,
                          int64_t batch, int64_t heads, int64_t s, int run) {
  const int64_t lin[4][2] = {{d, 3 * d}, {d, d}, {d, f}, {f, d}}; /* (in, out) */
  double flops = 0;
  for (int i = 0; i < 4; i++) {
    int in = (int)lin[i][0], out = (int)lin[i][1], rows = (int)n;
    flops += 3 * 2.0 * (double)n * (double)in * (double)out;
    if (!run) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, out, in, 1, g->x, in, g->w, out, 0, g->y, out);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, rows, 1, g->x, in, g->y, out, 1, g->dw, out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, in, out, 1, g->y, out, g->w, out, 0, g->dx, in);
  }
  const int hd = (int)(d / heads), S = (int)s, ld = (int)(3 * d);
  flops += (double)(batch * heads) * 6 * 2.0 * (double)s * (double)s * hd;
  float *o2 = g->o + s * hd; /* outputs go here: inputs q, p, o keep their values */
  for (int64_t bh = 0; run && bh < batch * heads; bh++) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, hd, 1, g->q, ld, g->q, ld, 0, g->p, S);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, hd, S, 1, g->p, S, g->q, ld, 0, o2, hd);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, hd, 1, g->o, hd, g->q, ld, 0, g->p, S);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, S, 1, g->p, S, g->o, hd, 0, o2, hd);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, hd, S, 1, g->p, S, g->q, ld, 0, o2, hd);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, S, 1, g->p, S, g->q, ld, 0, o2, hd);
  }
  return flops;
}

static double time_block(l2l_layer *layer, l2l_tensor *x, l2l_tensor *y, l2l_tensor *dy,
                         l2l_tensor *dx, const l2l_layer_batch *batch) {
  double t0 = now();
  l2l_saved *saved = NULL;
  ok(l2l_layer_forward(&saved, layer, y, x, batch));
  ok(l2l_layer_backward(layer, dx, dy, saved, batch));
  l2l_saved_free(saved);
  return now() - t0;
}

static void speed(float dropout) {
  const int64_t B = 4, S = 256, D = 768, H = 12, F = 3072, N = B * S;
  l2l_layer *std_block = new_block(D, H, F, 0, 1, dropout, L2L_MEMORY_STANDARD);
  l2l_layer *frugal = new_block(D, H, F, 0, 1, dropout, L2L_MEMORY_FRUGAL);
  l2l_tensor *x = new_f32(B, S, D), *y = new_f32(B, S, D), *dy = new_f32(B, S, D),
             *dx = new_f32(B, S, D);
  l2l_layer_batch batch = {.seed = 1, .step = 1, .training = 1};
  size_t big = (size_t)(N * F > F * D * 3 ? N * F : F * D * 3);
  struct gemm_bufs g = {malloc(big * 4), malloc(big * 4), malloc(big * 4), malloc(big * 4),
                        malloc(big * 4), malloc((size_t)(S * 3 * D) * 4),
                        malloc((size_t)(S * S) * 4), calloc((size_t)(2 * S * D), 4)};
  for (size_t i = 0; i < big; i++) g.x[i] = g.w[i] = g.y[i] = g.dw[i] = 0.001f * (float)(i % 97);
  for (int64_t i = 0; i < S * 3 * D; i++) g.q[i] = 0.01f * (float)(i % 13);
  double flops = block_gemms(&g, N, D, F, B, H, S, 0);
  double t_ref[REPEATS], t_std[REPEATS], t_fru[REPEATS];
  time_block(std_block, x, y, dy, dx, &batch); /* warm up */
  time_block(frugal, x, y, dy, dx, &batch);
  for (int r = 0; r < REPEATS; r++) {
    double t0 = now();
    block_gemms(&g, N, D, F, B, H, S, 1);
    t_ref[r] = now() - t0;
    t_std[r] = time_block(std_block, x, y, dy, dx, &batch);
    t_fru[r] = time_block(frugal, x, y, dy, dx, &batch);
  }
  double ref = median(t_ref, REPEATS), st = median(t_std, REPEATS), fr = median(t_fru, REPEATS);
  printf("| %.1f | sgemm alone, same shapes | %.1f ms | %.1f GFLOP/s | 100 %% |\n", dropout,
         1e3 * ref, flops / ref / 1e9);
  printf("| %.1f | block, standard | %.1f ms | %.1f GFLOP/s | %.0f %% |\n", dropout, 1e3 * st,
         flops / st / 1e9, 100 * ref / st);
  printf("| %.1f | block, frugal | %.1f ms | %.1f GFLOP/s | %.0f %% (%.2fx standard's time) |\n",
         dropout, 1e3 * fr, flops / fr / 1e9, 100 * ref / fr, fr / st);
  l2l_layer_free(std_block);
  l2l_layer_free(frugal);
  l2l_tensor_free(x);
  l2l_tensor_free(y);
  l2l_tensor_free(dy);
  l2l_tensor_free(dx);
  free(g.x), free(g.w), free(g.y), free(g.dw), free(g.dx), free(g.q), free(g.p), free(g.o);
}

int main(void) {
  printf("l2l %s bench/layers: %d threads, %d repeats per figure (medians)\n\n", l2l_version(),
         l2l_get_threads(), REPEATS);
  saved_table();
  printf("2. Block forward + backward, GPT-2 small shapes (dim 768, 12 heads, MLP 3072, "
         "seq 256, micro-batch 4, causal)\n\n");
  printf("| dropout | what | time | rate | of sgemm's rate |\n|---|---|---:|---:|---:|\n");
  speed(0.0f);
  speed(0.1f);
  return 0;
}
