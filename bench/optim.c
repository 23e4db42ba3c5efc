/* SPDX-License-Identifier: MIT */
/* bench/optim.c — the EPS's host optimizer kernels against the machine's memory bandwidth.
 *
 * Prints, in one run: for N = 16 Mi parameters (448 MiB of AdamW state, far beyond any
 * cache), the time of one update of the whole record by optim_adamw, optim_sgd
 * (momentum) and LAMB (optim_lamb_moments, the trust ratio, optim_lamb_apply), run
 * as the EPS runs them: the record cut into chunks of 64 Ki parameters, an OpenMP
 * `parallel for` over the chunks, on 1 thread and on all (omp_get_max_threads()). Next to
 * each, a plain copy (memcpy per chunk, same chunk count, same threads) of 14 bytes per
 * parameter, i.e. 28 bytes of traffic per parameter counting read and write, exactly
 * AdamW's. Rates: Gparam/s and the implied bandwidth (bytes each kernel must move: AdamW
 * 28 = read p g m v, write p m v; SGD 20 = read p g b, write p b; LAMB 40 = pass one
 * reads p g m v and writes m v, pass two reads p m v and writes p). Every repeat times the
 * copy and the three kernels in turn; the table shows medians of REPEATS.
 * Target (NOTES.md "Host memory bandwidth is the host optimizer's limit"): AdamW on all
 * threads at >= 70 % of the copy's bandwidth.
 * Note: a copy with ordinary stores also reads each destination line before writing it
 * (write-allocate), which the count above leaves out; the in-place kernels pay no such
 * read. So "vs copy" can exceed 100 % with nothing wrong, and a second baseline row, an
 * in-place x = a x + b over the same bytes, shows the rate in-place kernels can reach.
 * Last, each kernel's rate with its state in L2 (one thread): the compute ceiling.
 * Compact state (issue 33): AdamW and SGD with bf16 and 8-bit state (src/eps/quant.c, the
 * EPS's own path: per block decode, the f32 kernel, encode), each against the bytes it
 * must move (AdamW bf16 20, 8-bit 16; SGD bf16 16, 8-bit 14 a parameter).
 * Gradient arrivals: a bf16 gradient of N parameters given to the EPS (as a GPU's comes back),
 * timed until added, against one thread adding it (the way before: a job per arrival).
 * A record's host work in a GPU step (issue 49): a bf16 gradient given, the AdamW update
 * (f32 state) settled, and the next step's staging rewrite, the EPS holding the gradient
 * for its update (one pass) against adding it first (add_arrivals: the way before), and
 * held with 8-bit state and a bf16 master, in bytes a parameter as the EPS counts what
 * each pass reads and writes, against a STREAM triad (a = b + s c, 12 bytes an element)
 * measured in the same run on all threads. The accumulator and the master are the relay's
 * (never handed out): from the second step on the held check takes the accumulator as
 * zero, unread, and the update writes the staging copy (no rewrite as the next step
 * begins: its row is left out when it moved nothing).
 * Run: make build/bench_optim && build/bench_optim   (OMP_PROC_BIND=close pins threads)
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bench.h"
#include "eps/eps.h"
#include "layers/layers.h" /* param_grad, param_value: as the relay gives them (not handed out) */

enum { N = 16 << 20, CHUNK = 64 << 10, NCHUNKS = N / CHUNK, REPEATS = 9, COPY_BYTES = 14 };

static float *p, *g, *m, *v, *b;
static char *src, *dst;
static double norms[NCHUNKS][2];

static void *alloc_or_die(size_t bytes) {
  void *ptr = aligned_alloc(64, bytes);
  if (ptr == NULL) {
    fprintf(stderr, "bench_optim: cannot allocate %zu bytes\n", bytes);
    exit(1);
  }
  return ptr;
}

/* ---------------------------------------------------------------- the timed passes */

static double time_copy(int threads) {
  const size_t chunk = (size_t)COPY_BYTES * CHUNK;
  double t0 = now();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int c = 0; c < NCHUNKS; c++) memcpy(dst + (size_t)c * chunk, src + (size_t)c * chunk, chunk);
  return now() - t0;
}

/* Read-modify-write in place (x = a x + b) over the copy's source, 28 bytes of traffic per
   parameter like the copy, but no separate destination: the rate in-place kernels see. */
static double time_rmw(int threads) {
  float *x = (float *)src;
  const size_t chunk = (size_t)COPY_BYTES * CHUNK / sizeof(float);
  double t0 = now();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int c = 0; c < NCHUNKS; c++) {
    float *restrict y = x + (size_t)c * chunk;
#pragma omp simd
    for (size_t i = 0; i < chunk; i++) y[i] = 0.5f * y[i] + 0.25f;
  }
  return now() - t0;
}

static double time_adamw(int threads, const struct optim_hyper *h) {
  double t0 = now();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int c = 0; c < NCHUNKS; c++) {
    size_t o = (size_t)c * CHUNK;
    optim_adamw(p + o, m + o, v + o, g + o, CHUNK, h);
  }
  return now() - t0;
}

static double time_sgd(int threads, const struct optim_hyper *h) {
  double t0 = now();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int c = 0; c < NCHUNKS; c++) {
    size_t o = (size_t)c * CHUNK;
    optim_sgd(p + o, b + o, g + o, CHUNK, h);
  }
  return now() - t0;
}

/* AdamW or SGD on compact state (quant.c), chunk by chunk as the EPS runs it: each chunk's
   blocks decoded into f32 scratch, updated by the f32 kernel, encoded again. */
static double time_compact(int threads, const struct optim_hyper *h, l2l_state_precision state,
                           void *const arrays[2]) {
  const struct optimizer_ops *ops = optimizer_ops(h->kind);
  struct optim_hyper hs = *h;
  hs.state = state;
  double t0 = now();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int c = 0; c < NCHUNKS; c++) {
    size_t o = (size_t)c * CHUNK;
    struct optim_chunk chunk = {.p = p + o, .grad = g + o, .n = CHUNK, .h = &hs};
    struct eps_compact compact = {.state = {arrays[0], arrays[1]}, .state_n = N};
    eps_compact_chunk(ops, &chunk, &compact, (int64_t)o);
  }
  return now() - t0;
}

/* LAMB as the EPS must run it: every chunk's moments (each adding into its own norms),
   then the record's trust ratio, then every chunk's apply. */
static double time_lamb(int threads, const struct optim_hyper *h) {
  double t0 = now();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int c = 0; c < NCHUNKS; c++) {
    size_t o = (size_t)c * CHUNK;
    norms[c][0] = norms[c][1] = 0.0;
    optim_lamb_moments(m + o, v + o, p + o, g + o, CHUNK, h, norms[c]);
  }
  double total[2] = {0.0, 0.0};
  for (int c = 0; c < NCHUNKS; c++) total[0] += norms[c][0], total[1] += norms[c][1];
  float trust = optim_lamb_trust(total);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int c = 0; c < NCHUNKS; c++) {
    size_t o = (size_t)c * CHUNK;
    optim_lamb_apply(p + o, m + o, v + o, CHUNK, h, trust);
  }
  return now() - t0;
}

/* ---------------------------------------------------------------- the table */

enum { COPY, RMW, ADAMW, SGD, LAMB, ADAMW_BF16, ADAMW_8BIT, SGD_BF16, SGD_8BIT, NROWS };
static const char *const NAMES[NROWS] = {"copy (memcpy)", "in-place x = a x + b", "AdamW",
                                         "SGD momentum", "LAMB", "AdamW, bf16 state",
                                         "AdamW, 8-bit state", "SGD momentum, bf16 state",
                                         "SGD momentum, 8-bit state"};
/* Compact state: p and g as before, each state element 2 or 1 bytes each way (8-bit's
   scales, 4 bytes a block of 2048, left out: 0.2 % of a byte). */
static const double BYTES_PER_PARAM[NROWS] = {2.0 * COPY_BYTES, 2.0 * COPY_BYTES, 28.0, 20.0,
                                              40.0, 20.0, 16.0, 16.0, 14.0};
static void *mv16[2], *mv8[2], *b16[2], *b8[2];

static void run(int threads) {
  struct optim_hyper adam = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-3f,
                                 .weight_decay = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
                                 .eps = 1e-8f, .grad_scale = 1.0f};
  struct optim_hyper sgd = {.kind = L2L_OPTIMIZER_SGD, .lr = 1e-3f, .weight_decay = 0.01f,
                                .momentum = 0.9f, .grad_scale = 1.0f};
  struct optim_hyper lamb = adam;
  lamb.kind = L2L_OPTIMIZER_LAMB;
  double secs[NROWS][REPEATS];
  for (int r = -1; r < REPEATS; r++) { /* r = -1: one untimed warm-up pass */
    adam.t = sgd.t = lamb.t = r + 2;
    double t[NROWS];
    t[COPY] = time_copy(threads);
    t[RMW] = time_rmw(threads);
    t[ADAMW] = time_adamw(threads, &adam);
    t[SGD] = time_sgd(threads, &sgd);
    t[LAMB] = time_lamb(threads, &lamb);
    t[ADAMW_BF16] = time_compact(threads, &adam, L2L_STATE_BF16, mv16);
    t[ADAMW_8BIT] = time_compact(threads, &adam, L2L_STATE_8BIT, mv8);
    t[SGD_BF16] = time_compact(threads, &sgd, L2L_STATE_BF16, b16);
    t[SGD_8BIT] = time_compact(threads, &sgd, L2L_STATE_8BIT, b8);
    if (r >= 0)
      for (int k = 0; k < NROWS; k++) secs[k][r] = t[k];
  }
  double med[NROWS], gbs[NROWS];
  for (int k = 0; k < NROWS; k++) {
    med[k] = median(secs[k], REPEATS);
    gbs[k] = (double)N / med[k] * 1e-9 * BYTES_PER_PARAM[k];
  }
  for (int k = 0; k < NROWS; k++)
    printf("| %d | %s | %.0f | %.2f | %.2f | %.1f | %.0f %% | %.0f %% |\n", threads, NAMES[k],
           BYTES_PER_PARAM[k], med[k] * 1e3, (double)N / med[k] * 1e-9, gbs[k],
           100.0 * gbs[k] / gbs[COPY], 100.0 * gbs[k] / gbs[RMW]);
}

/* The kernels' own speed, their state in L2 (32 Ki parameters, 512 KiB for AdamW), on one
   thread: what each core can do when memory is not the limit. */
static void in_cache(void) {
  enum { SMALL = 32 << 10, CALLS = 200 };
  struct optim_hyper h = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-3f, .weight_decay = 0.01f,
                              .momentum = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .t = 2, .grad_scale = 1.0f};
  double secs[3][REPEATS];
  for (int r = -1; r < REPEATS; r++) {
    double t[3], t0 = now();
    for (int i = 0; i < CALLS; i++) optim_adamw(p, m, v, g, SMALL, &h);
    t[0] = now() - t0, t0 = now();
    for (int i = 0; i < CALLS; i++) optim_sgd(p, b, g, SMALL, &h);
    t[1] = now() - t0, t0 = now();
    for (int i = 0; i < CALLS; i++) {
      double nn[2] = {0.0, 0.0};
      optim_lamb_moments(m, v, p, g, SMALL, &h, nn);
      optim_lamb_apply(p, m, v, SMALL, &h, optim_lamb_trust(nn));
    }
    t[2] = now() - t0;
    if (r >= 0)
      for (int k = 0; k < 3; k++) secs[k][r] = t[k];
  }
  printf("\nIn cache (32 Ki parameters, 1 thread): ");
  const char *names[3] = {"AdamW", "SGD momentum", "LAMB"};
  for (int k = 0; k < 3; k++)
    printf("%s %.2f Gparam/s%s", names[k],
           (double)SMALL * CALLS / median(secs[k], REPEATS) * 1e-9, k < 2 ? ", " : "\n");
}

/* ---------------------------------------------------------------- gradient arrivals */

/* A gradient copied back from a GPU (N parameters, bf16, pinned) given to the EPS, timed
   until it is added into the accumulator (eps_wait_arrivals): the EPS's way, chunk jobs on
   all its workers, against one thread adding it whole (each arrival one job, as before
   issue 46's change). 10 bytes a parameter: the gradient read, the accumulator read and
   written. */
static void arrivals(int threads) {
  l2l_layer_config c = {.kind = L2L_LAYER_EMBEDDING, .dim = 64, .vocab = N / 64, .max_seq = 1,
                        .init_std = 0.02f};
  l2l_layer *layer = NULL;
  l2l_tensor *g16 = NULL;
  struct core_timeline tl;
  timeline_init(&tl);
  l2l_optimizer_config opt = {.kind = L2L_OPTIMIZER_SGD, .lr = 1e-3f};
  struct eps_settings settings = {.optimizer = &opt, .precision = L2L_BF16, .threads = threads,
                                  .seed = 1, .timeline = &tl, .dist_lane = -1};
  struct eps eps;
  int64_t shape[2] = {N / 64, 64};
  if (l2l_layer_new(&layer, &c, L2L_POOL_HOST) != L2L_OK ||
      l2l_tensor_new(&g16, L2L_POOL_HOST, L2L_BF16, 2, shape) != L2L_OK ||
      eps_init(&eps, &settings) != L2L_OK) {
    fprintf(stderr, "bench_optim: %s\n", l2l_last_error());
    exit(1);
  }
  l2l_param *wte = l2l_layer_param(layer, 0);
  struct eps_record_source source = {.param = wte, .name = "wte", .master = l2l_param_value(wte),
                                  .grad = l2l_param_grad(wte), .staging = L2L_BF16, .users = 1};
  int failed = -1;
  if (eps_set_records(&eps, &source, 1, &failed) != L2L_OK) exit(1);
  uint16_t *h = l2l_tensor_data(g16);
  for (int64_t i = 0; i < N; i++) h[i] = half_from_f32_bf16(g[i]);
  float *acc = l2l_tensor_data(l2l_param_grad(wte));
  double secs[2][REPEATS];
  for (int r = -1; r < REPEATS; r++) {
    l2l_tensor *pinned = NULL;
    if (l2l_tensor_new(&pinned, L2L_POOL_PINNED, L2L_BF16, 2, shape) != L2L_OK ||
        l2l_tensor_copy(pinned, g16) != L2L_OK)
      exit(1);
    l2l_param *expect[1] = {wte};
    struct eps_step step = {.update = false, .lr = 1e-3, .expect = expect, .n_expect = 1};
    if (eps_step_begin(&eps, &step) != L2L_OK) exit(1);
    eps_step_agreed(&eps, true);
    double t0 = now();
    eps_give_gradient(&eps, eps_find(&eps, wte), pinned, false, 1.0f, 0);
    eps_wait_arrivals(&eps);
    double t_eps = now() - t0;
    struct eps_outcome out;
    eps_step_end(&eps, true, &out);
    t0 = now();
    optim_axpy_half(acc, h, L2L_BF16, 1.0f, N);
    double t_one = now() - t0;
    if (r >= 0) secs[0][r] = t_eps, secs[1][r] = t_one;
  }
  const char *names[2] = {"the EPS's arrival (chunks on its workers)", "one thread adding it whole"};
  for (int k = 0; k < 2; k++) {
    double med = median(secs[k], REPEATS);
    printf("| %d | %s | 10 | %.2f | %.2f | %.1f |\n", k == 0 ? threads : 1, names[k], med * 1e3,
           (double)N / med * 1e-9, (double)N / med * 1e-9 * 10.0);
  }
  eps_free(&eps);
  timeline_free(&tl);
  l2l_tensor_free(g16);
  l2l_layer_free(layer);
}

/* ---------------------------------------------------------------- a record's host work in a GPU step */

/* STREAM's triad on all threads, GB/s (12 bytes an element: two reads, one write). */
static double triad(int threads) {
  float *ta = alloc_or_die(sizeof(float) * N), *tb = alloc_or_die(sizeof(float) * N);
  float *tc = alloc_or_die(sizeof(float) * N);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < N; i++) ta[i] = 0.0f, tb[i] = 1.0f, tc[i] = 2.0f;
  double secs[REPEATS];
  for (int r = -1; r < REPEATS; r++) {
    double t0 = now();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < N; i++) ta[i] = tb[i] + 3.0f * tc[i];
    if (r >= 0) secs[r] = now() - t0;
  }
  free(ta), free(tb), free(tc);
  return 12.0 * N / median(secs, REPEATS) * 1e-9;
}

/* Steps of one record (N parameters, AdamW) on three EPSs in turn each repeat: f32 state
   and bf16 staging, one holding its gradient for the update and one adding it as it
   arrives (the way before); and one holding it with 8-bit state and a bf16 master (which
   the device reads: no staging copy). Each step: a bf16 gradient given from pinned memory
   until the update has settled, then the next step's staging rewrite (eps_stage) until
   done. Bytes a parameter are the EPS's own count of what its passes read and wrote
   (eps_pass_bytes, which test_arrivals holds to the passes' arithmetic): added 2 + 8 (the
   add) + 28 (AdamW) + 4 (the clear) = 42; held 2 + 4 (the check reads the gradient and
   the accumulator) + 2 + 24 (the update reads the gradient again, the accumulator's
   chunks found zero not at all) = 32; the staging rewrite 4 + 2; held with 8-bit state
   and a bf16 master 2 + 4 + 2 + 4 (the master read and written) + 4 (two code arrays,
   the blocks' scales besides). */
enum { STEP_KINDS = 3 };
static void gpu_step_record(int threads, double triad_gbs) {
  l2l_layer_config c = {.kind = L2L_LAYER_EMBEDDING, .dim = 64, .vocab = N / 64, .max_seq = 1,
                        .init_std = 0.02f};
  l2l_optimizer_config opt = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-4f, .beta1 = 0.9f,
                              .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  l2l_optimizer_config opt8 = opt;
  opt8.state = L2L_STATE_8BIT;
  int64_t shape[2] = {N / 64, 64};
  l2l_tensor *g16 = NULL, *master16 = NULL;
  if (l2l_tensor_new(&g16, L2L_POOL_HOST, L2L_BF16, 2, shape) != L2L_OK ||
      l2l_tensor_new(&master16, L2L_POOL_PINNED, L2L_BF16, 2, shape) != L2L_OK)
    exit(1);
  uint16_t *h = l2l_tensor_data(g16), *mh = l2l_tensor_data(master16);
  for (int64_t i = 0; i < N; i++) h[i] = half_from_f32_bf16(1e-3f * g[i]), mh[i] = half_from_f32_bf16(p[i]);
  struct core_timeline tl[STEP_KINDS];
  struct eps eps[STEP_KINDS];
  l2l_layer *layer[STEP_KINDS] = {NULL, NULL, NULL};
  l2l_param *wte[STEP_KINDS];
  for (int k = 0; k < STEP_KINDS; k++) {
    timeline_init(&tl[k]);
    struct eps_settings settings = {.optimizer = k == 2 ? &opt8 : &opt, .precision = L2L_BF16,
                                    .threads = threads, .seed = 1, .timeline = &tl[k],
                                    .dist_lane = -1, .add_arrivals = k == 1};
    if (l2l_layer_new(&layer[k], &c, L2L_POOL_HOST) != L2L_OK || eps_init(&eps[k], &settings) != L2L_OK) {
      fprintf(stderr, "bench_optim: %s\n", l2l_last_error());
      exit(1);
    }
    wte[k] = l2l_layer_param(layer[k], 0);
    struct eps_record_source source = {.param = wte[k], .name = "wte",
                                       .master = k == 2 ? master16 : param_value(wte[k]),
                                       .grad = param_grad(wte[k]),   /* (as the relay gives it) */
                                       .staging = k == 2 ? L2L_F32 : L2L_BF16, .users = 1};
    int failed = -1;
    if (eps_set_records(&eps[k], &source, 1, &failed) != L2L_OK) exit(1);
  }
  double secs[STEP_KINDS][2][REPEATS];   /* [kind][update, staging] */
  uint64_t moved[STEP_KINDS][2] = {{0}};   /* the EPS's count, the last repeat's */
  for (int r = -1; r < REPEATS; r++)
    for (int k = 0; k < STEP_KINDS; k++) {
      l2l_tensor *pinned = NULL;
      if (l2l_tensor_new(&pinned, L2L_POOL_PINNED, L2L_BF16, 2, shape) != L2L_OK ||
          l2l_tensor_copy(pinned, g16) != L2L_OK)
        exit(1);
      l2l_param *expect[1] = {wte[k]};
      struct eps_step step = {.update = true, .lr = 1e-4, .expect = expect, .n_expect = 1};
      if (eps_step_begin(&eps[k], &step) != L2L_OK) exit(1);
      eps_step_agreed(&eps[k], true);
      uint64_t b0 = eps_pass_bytes(&eps[k]);
      double t0 = now();
      eps_give_gradient(&eps[k], eps_find(&eps[k], wte[k]), pinned, false, 1.0f, 0);
      eps_wait_arrivals(&eps[k]);
      eps_sync(&eps[k]);
      double t1 = now();
      uint64_t b1 = eps_pass_bytes(&eps[k]);
      struct eps_outcome out;
      eps_step_end(&eps[k], true, &out);
      double t2 = now();
      uint64_t b2 = eps_pass_bytes(&eps[k]);
      eps_stage(&eps[k]);
      eps_sync(&eps[k]);
      double t3 = now();
      if (r >= 0) secs[k][0][r] = t1 - t0, secs[k][1][r] = t3 - t2;
      moved[k][0] = b1 - b0, moved[k][1] = eps_pass_bytes(&eps[k]) - b2;
    }
  const char *names[STEP_KINDS] = {"held: checked, then one update pass",
                                   "added, updated, cleared (before)",
                                   "held, 8-bit state, bf16 master"};
  for (int k = 0; k < STEP_KINDS; k++)
    for (int part = 0; part < 2; part++) {
      if (part == 1 && moved[k][1] == 0) continue;   /* (no staging copy: none rewritten) */
      double med = median(secs[k][part], REPEATS), per = (double)moved[k][part] / (double)N;
      double gbs = (double)moved[k][part] / med * 1e-9;
      printf("| %d | %s | %.1f | %.2f | %.2f | %.1f | %.0f %% |\n", threads,
             part ? "staging rewrite (next step)" : names[k], per, med * 1e3, (double)N / med * 1e-9,
             gbs, 100.0 * gbs / triad_gbs);
    }
  printf("\nthe update, held against added: %.2f x the time\n",
         median(secs[0][0], REPEATS) / median(secs[1][0], REPEATS));
  for (int k = 0; k < STEP_KINDS; k++) {
    eps_free(&eps[k]);
    timeline_free(&tl[k]);
    l2l_layer_free(layer[k]);
  }
  l2l_tensor_free(g16), l2l_tensor_free(master16);
}

int main(void) {
  p = alloc_or_die(sizeof(float) * N), g = alloc_or_die(sizeof(float) * N);
  m = alloc_or_die(sizeof(float) * N), v = alloc_or_die(sizeof(float) * N);
  b = alloc_or_die(sizeof(float) * N);
  src = alloc_or_die((size_t)COPY_BYTES * N), dst = alloc_or_die((size_t)COPY_BYTES * N);
  /* compact state arrays, zero (the state an update starts from), touched by one thread */
  uint64_t bytes16 = host_state_bytes(L2L_STATE_BF16, N), bytes8 = host_state_bytes(L2L_STATE_8BIT, N);
  for (int a = 0; a < 2; a++) {
    mv16[a] = calloc(1, bytes16), mv8[a] = calloc(1, bytes8);
    if (mv16[a] == NULL || mv8[a] == NULL) return fprintf(stderr, "bench_optim: no memory\n"), 1;
  }
  b16[0] = calloc(1, bytes16), b8[0] = calloc(1, bytes8);
  if (b16[0] == NULL || b8[0] == NULL) return fprintf(stderr, "bench_optim: no memory\n"), 1;
  int all = omp_get_max_threads();
  /* First touch by the same static schedule the timed loops use; values that keep every
     kernel on normal floats (no denormals, v > 0). */
#pragma omp parallel for schedule(static) num_threads(all)
  for (int c = 0; c < NCHUNKS; c++) {
    uint32_t x = 2463534242u + (uint32_t)c;
    for (size_t i = (size_t)c * CHUNK; i < (size_t)(c + 1) * CHUNK; i++) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      float u = (float)(x >> 8) * 0x1p-24f - 0.5f;
      p[i] = u, g[i] = 0.5f * u + 0.01f, m[i] = 0.0f, v[i] = 0.0f, b[i] = 0.0f;
    }
    memset(src + (size_t)c * CHUNK * COPY_BYTES, 1, (size_t)CHUNK * COPY_BYTES);
    memset(dst + (size_t)c * CHUNK * COPY_BYTES, 0, (size_t)CHUNK * COPY_BYTES);
  }
  printf("Host optimizer kernels, N = %d Mi fp32 parameters in chunks of %d Ki, OpenMP "
         "static over chunks; medians of %d; copy = memcpy of %d B/param (read + write "
         "counted)\n\n",
         N >> 20, CHUNK >> 10, REPEATS, COPY_BYTES);
  printf("| threads | kernel | B/param | ms | Gparam/s | GB/s | vs copy | vs in-place |\n");
  printf("|---:|---|---:|---:|---:|---:|---:|---:|\n");
  run(1);
  if (all > 1) run(all);
  in_cache();
  printf("\nA bf16 gradient of %d Mi parameters given to the EPS (pinned), until added:\n\n",
         N >> 20);
  printf("| threads | path | B/param | ms | Gparam/s | GB/s |\n|---:|---|---:|---:|---:|---:|\n");
  arrivals(all);
  double triad_gbs = triad(all);
  printf("\nA record's host work in a GPU step: %d Mi parameters, a bf16 gradient given, AdamW "
         "(f32 state and bf16 staging, or 8-bit state and a bf16 master); STREAM triad on %d "
         "threads: %.1f GB/s\n\n",
         N >> 20, all, triad_gbs);
  printf("| threads | pass | B/param | ms | Gparam/s | GB/s | vs triad |\n"
         "|---:|---|---:|---:|---:|---:|---:|\n");
  gpu_step_record(all, triad_gbs);
  printf("\nTarget: AdamW on %d threads >= 70 %% of the copy's bandwidth.\n", all);
  free(p), free(g), free(m), free(v), free(b), free(src), free(dst);
  for (int a = 0; a < 2; a++) free(mv16[a]), free(mv8[a]);
  free(b16[0]), free(b8[0]);
  return 0;
}
