/* SPDX-License-Identifier: MIT */
/* bench/relay.c — what the relay costs against plain whole-batch training.
 *
 * Prints, in one run, on the CPU backend: a 6-block GPT (dim 768, 12 heads, MLP 3072,
 * pre-LN causal, dropout 0.1, vocab 512, LM head tied to the embedding) trained on
 * minibatches of 4 sequences of 256 tokens, one step at a time by:
 *  (a) a plain executor written here: the whole batch through every layer with every
 *      saved state kept, backward in reverse, then AdamW per record (l2l_adamw_update);
 *  (b) the relay with inner keep, stash device, micro-batch = batch: the same work as
 *      (a) plus the relay's copies and bookkeeping; target (b)/(a) <= 1.05; with the
 *      default two parameter slots, the backward copies every layer in again;
 *  (f) (b) with a parameter slot per layer (param_slots 8): each layer is copied in
 *      once a step, as a model that fits on the device would run;
 *  (c) the plain executor doing the relay's per-layer recomputation: forward keeping
 *      nothing, then for each layer in reverse its forward again from the stored input
 *      (whole batch) and its backward (the head's forward and backward at once);
 *  (d) the relay with inner recompute, stash host, 4 micro-batches (micro-batch 1):
 *      L2L's constant-memory configuration; target (d)/(c) <= 1.10, and (d)/(a) is
 *      reported (about 4/3 by design: one more forward per layer);
 *  (e) for diagnosis, the plain executor doing (d)'s arithmetic: (c) in 4 micro-batches
 *      of one sample, layer by layer. (e)/(c) is what the smaller layer calls cost by
 *      themselves; (d)/(e) is what the relay adds to them.
 * The six run in turn (a, b, f, c, d, e), 7 rounds (L2L_BENCH_REPEATS=n: n, odd, up to
 * 63) after a warm-up round. Times are medians; a ratio is taken in each round first, so
 * that a change in the machine's load between rounds (these are shared machines) cancels
 * between neighbours measured seconds apart, then its median and quartiles over the rounds
 * are shown: the spread says how far one run's figure can be trusted. Beside the wall
 * time, each step's CPU time over all threads (the work done, which a waiting thread does
 * not add to) and the share of the machine the hypervisor took meanwhile (steal).
 * All apply the same AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on
 * linear weights, constant schedule). The relay's statistics of its last step are shown:
 * compute, waiting for copies and updates, optimizer seconds (summed over its threads)
 * and the device pool's peak, and its events' busy time per phase and thread.
 * Run: make build/bench_relay && build/bench_relay   (L2L_THREADS=n pins the threads)
 * Must never: be used by the library or the tests (benchmarks only).
 */
#include <stdbool.h>
#include <string.h>

#include "bench.h"

enum { BLOCKS = 6, DIM = 768, HEADS = 12, MLP = 3072, SEQ = 256, BATCH = 4, VOCAB = 512,
       LAYERS = BLOCKS + 2, MAX_REPEATS = 63, MAX_RECORDS = 128 };

static const l2l_optimizer_config adamw = {.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-4f,
                                           .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                           .weight_decay = 0.01f};

static l2l_layer *new_layer(l2l_layer_kind kind, uint64_t seed) {
  l2l_layer_config c = {.kind = kind, .dim = DIM, .heads = HEADS, .mlp = MLP, .vocab = VOCAB,
                        .max_seq = SEQ, .causal = 1, .bias = 1, .final_ln = 1,
                        .dropout = 0.1f, .attn_dropout = 0.1f, .eps = 1e-5f,
                        .memory = L2L_MEMORY_STANDARD, .init_std = 0.02f, .resid_std = 0.0058f,
                        .init_seed = seed};
  l2l_layer *layer = NULL;
  ok(l2l_layer_new(&layer, &c, L2L_POOL_HOST));
  return layer;
}

static void new_model(l2l_layer **layers) {
  layers[0] = new_layer(L2L_LAYER_EMBEDDING, 1);
  for (int b = 0; b < BLOCKS; b++) layers[1 + b] = new_layer(L2L_LAYER_BLOCK, 2 + (uint64_t)b);
  layers[LAYERS - 1] = new_layer(L2L_LAYER_LM_HEAD, 99);
  ok(l2l_layer_tie(layers[LAYERS - 1], layers[0]));
}

static l2l_tensor *new_tensor(l2l_dtype dtype, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  int64_t shape[3] = {d0, d1, d2};
  l2l_tensor *t = NULL;
  ok(l2l_tensor_new(&t, L2L_POOL_HOST, dtype, ndim, shape));
  return t;
}

/* ---------------------------------------------------------------- the plain executor */

struct plain {
  l2l_layer *layers[LAYERS];
  int nrec;
  l2l_param *rec[MAX_RECORDS];
  l2l_tensor *m[MAX_RECORDS], *v[MAX_RECORDS];
  int64_t t;
};

static void plain_init(struct plain *p) {
  memset(p, 0, sizeof *p);
  new_model(p->layers);
  for (int l = 0; l < LAYERS; l++)
    for (int j = 0; j < l2l_layer_param_count(p->layers[l]); j++) {
      l2l_param *param = l2l_layer_param(p->layers[l], j);
      bool seen = false;
      for (int i = 0; i < p->nrec; i++) seen = seen || p->rec[i] == param;
      if (seen) continue;
      /* AdamW's moments have the parameter's shape (l2l_adamw_update checks it) */
      l2l_tensor *value = l2l_param_value(param);
      int ndim = l2l_tensor_ndim(value);
      int64_t d[3] = {0, 0, 0};
      for (int k = 0; k < ndim && k < 3; k++) d[k] = l2l_tensor_dim(value, k);
      p->rec[p->nrec] = param;
      p->m[p->nrec] = new_tensor(L2L_F32, ndim, d[0], d[1], d[2]);
      p->v[p->nrec] = new_tensor(L2L_F32, ndim, d[0], d[1], d[2]);
      ok(l2l_tensor_fill(p->m[p->nrec], 0.0));
      ok(l2l_tensor_fill(p->v[p->nrec], 0.0));
      p->nrec++;
    }
}

static void plain_free(struct plain *p) {
  for (int i = 0; i < p->nrec; i++) l2l_tensor_free(p->m[i]), l2l_tensor_free(p->v[i]);
  for (int l = 0; l < LAYERS; l++) l2l_layer_free(p->layers[l]);
}

static l2l_tensor *rows_of(const l2l_tensor *t, int64_t first, int64_t count) {
  l2l_tensor *v = NULL;
  if (t != NULL) ok(l2l_tensor_view_rows(&v, t, first, count));
  return v;
}

/* One training step in micro-batches of `micro` samples (BATCH: the whole batch in one
   call per layer), layer by layer like the relay. recompute = 0: every saved state kept
   from the forward; 1: the forward keeps nothing, and each layer below the head reruns
   its forward from its stored input right before its backward (the head's forward and
   backward keep as usual). Then AdamW on every record. */
static double plain_step(struct plain *p, const l2l_layer_batch *whole, int recompute,
                         int micro) {
  enum { MAX_U = BATCH };
  const int U = (BATCH + micro - 1) / micro;
  l2l_layer_batch batch[MAX_U];
  for (int u = 0; u < U; u++) {
    batch[u] = *whole;
    batch[u].first_sample = (int64_t)u * micro;
    batch[u].tokens = rows_of(whole->tokens, (int64_t)u * micro, micro);
    batch[u].targets = rows_of(whole->targets, (int64_t)u * micro, micro);
  }
  l2l_tensor *act[LAYERS + 1] = {NULL};     /* act[l]: input of layer l, (B,S,D) */
  l2l_saved *saved[LAYERS][MAX_U] = {{NULL}};
  for (int l = 0; l < LAYERS; l++) {
    bool head = l == LAYERS - 1;
    act[l + 1] = head ? new_tensor(L2L_F32, 2, BATCH, SEQ, 0)    /* losses (B,S) */
                      : new_tensor(L2L_F32, 3, BATCH, SEQ, DIM);
    for (int u = 0; u < U; u++) {
      l2l_tensor *x = rows_of(act[l], (int64_t)u * micro, micro);
      l2l_tensor *y = rows_of(act[l + 1], (int64_t)u * micro, micro);
      ok(l2l_layer_forward(recompute && !head ? NULL : &saved[l][u], p->layers[l], y, x,
                           &batch[u]));
      l2l_tensor_free(x);
      l2l_tensor_free(y);
    }
  }
  double loss = 0;
  ok(l2l_sum(&loss, act[LAYERS]));
  loss *= whole->loss_scale;
  l2l_tensor *dy = NULL, *redo = recompute ? new_tensor(L2L_F32, 3, micro, SEQ, DIM) : NULL;
  for (int l = LAYERS - 1; l >= 0; l--) {
    l2l_tensor *dx = l > 0 ? new_tensor(L2L_F32, 3, BATCH, SEQ, DIM) : NULL;
    for (int u = 0; u < U; u++) {
      l2l_tensor *x = rows_of(act[l], (int64_t)u * micro, micro);
      l2l_tensor *dxu = rows_of(dx, (int64_t)u * micro, micro);
      l2l_tensor *dyu = rows_of(dy, (int64_t)u * micro, micro);
      if (saved[l][u] == NULL) ok(l2l_layer_forward(&saved[l][u], p->layers[l], redo, x, &batch[u]));
      ok(l2l_layer_backward(p->layers[l], dxu, dyu, saved[l][u], &batch[u]));
      l2l_saved_free(saved[l][u]);
      l2l_tensor_free(x);
      l2l_tensor_free(dxu);
      l2l_tensor_free(dyu);
    }
    l2l_tensor_free(dy);
    dy = dx;
  }
  l2l_tensor_free(redo);
  for (int l = 1; l <= LAYERS; l++) l2l_tensor_free(act[l]);
  for (int u = 0; u < U; u++) {
    l2l_tensor_free((l2l_tensor *)batch[u].tokens);
    l2l_tensor_free((l2l_tensor *)batch[u].targets);
  }
  p->t++;
  for (int i = 0; i < p->nrec; i++) {
    l2l_adamw_config c = {adamw.lr, adamw.beta1, adamw.beta2, adamw.eps,
                          l2l_param_decays(p->rec[i]) ? adamw.weight_decay : 0.0f};
    ok(l2l_adamw_update(l2l_param_value(p->rec[i]), p->m[i], p->v[i],
                        l2l_param_grad(p->rec[i]), &c, p->t));
    ok(l2l_tensor_fill(l2l_param_grad(p->rec[i]), 0.0));
  }
  return loss;
}

/* ---------------------------------------------------------------- the relays */

struct relay {
  l2l_layer *layers[LAYERS];
  l2l_relay *run;
};

static void relay_init(struct relay *r, int64_t micro, l2l_stash_policy stash,
                       l2l_inner_policy inner, int param_slots) {
  new_model(r->layers);
  l2l_relay_config c;
  l2l_relay_config_default(&c);
  c.micro_batch = micro;
  c.stash = stash;
  c.inner = inner;
  c.optimizer = adamw;
  c.schedule = (l2l_schedule_config){.kind = L2L_SCHEDULE_CONSTANT};
  c.seed = 1;
  c.param_slots = param_slots;
  ok(l2l_relay_new(&r->run, r->layers, LAYERS, &c));
}

static void relay_free(struct relay *r) {
  l2l_relay_free(r->run);
  for (int l = 0; l < LAYERS; l++) l2l_layer_free(r->layers[l]);
}

static void print_stats(const char *name, const struct relay *r, double median_s) {
  l2l_relay_stats s;
  ok(l2l_relay_get_stats(&s, r->run));
  printf("| %s | %.0f ms | %.0f ms | %.1f ms | %.1f ms | %.0f ms | %.0f MiB in %.0f ms, %.0f MiB "
         "out %.0f ms | %.1f MiB | %.1f MiB |\n", name,
         1e3 * median_s, 1e3 * s.compute_seconds, 1e3 * s.wait_copy_seconds,
         1e3 * s.wait_update_seconds, 1e3 * s.optimizer_seconds, s.h2d_bytes / 1048576.0,
         1e3 * s.h2d_seconds, s.d2h_bytes / 1048576.0, 1e3 * s.d2h_seconds,
         s.device_peak / 1048576.0, s.host_stash_peak / 1048576.0);
}

/* Where the relay's last step went: busy seconds per phase, summed over the calling
   thread (0), the copy threads (1, 2) and the optimizer workers (3..), from its events. */
static void print_phases(const char *name, const struct relay *r) {
  static const char *const phases[] = {"forward", "backward", "rebuild", "params in",
                                       "grads out", "stash out", "stash in", "swap out",
                                       "swap in", "update", "wait copy", "wait update"};
  enum { PHASES = 12 };
  l2l_relay_stats s;
  ok(l2l_relay_get_stats(&s, r->run));
  l2l_relay_event *ev = malloc((size_t)(s.events > 0 ? s.events : 1) * sizeof *ev);
  if (ev == NULL) return;
  if (s.events > 0) ok(l2l_relay_events(ev, r->run, 0, s.events));
  double busy[PHASES][3] = {{0}}, first = 1e300, last = -1e300;
  for (int64_t i = 0; i < s.events; i++) {
    int ph = ev[i].phase, th = ev[i].thread < 1 ? 0 : ev[i].thread < 3 ? 1 : 2;
    if (ph >= 0 && ph < PHASES) busy[ph][th] += ev[i].end - ev[i].start;
    if (ev[i].start < first) first = ev[i].start;
    if (ev[i].end > last) last = ev[i].end;
  }
  printf("| %s: events span %.0f ms |", name, 1e3 * (last - first));
  for (int ph = 0; ph < PHASES; ph++)
    if (busy[ph][0] + busy[ph][1] + busy[ph][2] > 0)
      printf(" %s %.0f/%.0f/%.0f;", phases[ph], 1e3 * busy[ph][0], 1e3 * busy[ph][1],
             1e3 * busy[ph][2]);
  printf(" |\n");
  free(ev);
}

int main(void) {
  const char *env = getenv("L2L_BENCH_REPEATS");
  const int REPEATS = env != NULL && atoi(env) >= 1 && atoi(env) <= MAX_REPEATS ? atoi(env) : 7;
  printf("l2l %s bench/relay: CPU backend, %d threads, %d repeats after a warm-up (medians)\n",
         l2l_version(), l2l_get_threads(), REPEATS);
  printf("Model: GPT, %d pre-LN causal blocks, dim %d, %d heads, MLP %d, vocab %d, dropout "
         "0.1, tied LM head. Minibatch: %d sequences x %d tokens. AdamW.\n\n",
         BLOCKS, DIM, HEADS, MLP, VOCAB, BATCH, SEQ);

  l2l_tensor *tokens = new_tensor(L2L_I32, 2, BATCH, SEQ, 0);
  l2l_tensor *targets = new_tensor(L2L_I32, 2, BATCH, SEQ, 0);
  int32_t *tok = l2l_tensor_data(tokens), *tgt = l2l_tensor_data(targets);
  srand(5);
  for (int i = 0; i < BATCH * SEQ; i++) tok[i] = rand() % VOCAB, tgt[i] = rand() % VOCAB;
  l2l_layer_batch lb = {.tokens = tokens, .targets = targets, .seed = 1, .step = 0,
                        .training = 1, .loss_scale = 1.0f / (BATCH * SEQ)};
  l2l_relay_batch rb = {.tokens = tokens, .targets = targets};

  struct plain plain;
  plain_init(&plain);
  struct relay keep, constant, resident;
  relay_init(&keep, BATCH, L2L_STASH_DEVICE, L2L_INNER_KEEP, 2);
  relay_init(&constant, 1, L2L_STASH_HOST, L2L_INNER_RECOMPUTE, 2);
  relay_init(&resident, BATCH, L2L_STASH_DEVICE, L2L_INNER_KEEP, LAYERS);

  /* The six executors in the order they run each round. */
  enum { A, B, F, C, D, E, EXECUTORS };
  double t[EXECUTORS][MAX_REPEATS], cpu[EXECUTORS][MAX_REPEATS], stolen = 0, wall = 0, loss;
  for (int r = -1; r < REPEATS; r++) { /* r = -1: warm-up */
    for (int x = 0; x < EXECUTORS; x++) {
      double steal0 = stolen_seconds(), cpu0 = process_cpu_seconds(), t0 = now();
      switch (x) {
      case A: plain_step(&plain, &lb, 0, BATCH); break;
      case B: ok(l2l_relay_step(&loss, keep.run, &rb)); ok(l2l_relay_sync(keep.run)); break;
      case F: ok(l2l_relay_step(&loss, resident.run, &rb)); ok(l2l_relay_sync(resident.run)); break;
      case C: plain_step(&plain, &lb, 1, BATCH); break;
      case D: ok(l2l_relay_step(&loss, constant.run, &rb)); ok(l2l_relay_sync(constant.run)); break;
      case E: plain_step(&plain, &lb, 1, 1); break;
      }
      if (r < 0) continue;
      t[x][r] = now() - t0;
      cpu[x][r] = process_cpu_seconds() - cpu0;
      stolen += stolen_seconds() - steal0, wall += t[x][r];
    }
  }
  /* Each ratio per round first, between neighbours measured seconds apart; then its
     median and quartiles over the rounds (the helpers sort their argument). */
  static const struct { int num, den; double target; const char *name; } RATIOS[] = {
      {B, A, 1.05, "(b)/(a)"}, {F, A, 1.05, "(f)/(a)"}, {C, A, 0, "(c)/(a)"},
      {D, C, 1.10, "(d)/(c)"}, {D, A, 0, "(d)/(a)"},   {D, E, 0, "(d)/(e)"},
      {E, C, 0, "(e)/(c)"}};
  enum { NRATIOS = sizeof RATIOS / sizeof RATIOS[0] };
  double wall_ratio[NRATIOS][3], cpu_ratio[NRATIOS], step[EXECUTORS], step_cpu[EXECUTORS];
  for (int i = 0; i < NRATIOS; i++) {
    double w[MAX_REPEATS], c[MAX_REPEATS];
    for (int r = 0; r < REPEATS; r++) {
      w[r] = t[RATIOS[i].num][r] / t[RATIOS[i].den][r];
      c[r] = cpu[RATIOS[i].num][r] / cpu[RATIOS[i].den][r];
    }
    wall_ratio[i][0] = quantile(w, REPEATS, 0.25), wall_ratio[i][1] = median(w, REPEATS);
    wall_ratio[i][2] = quantile(w, REPEATS, 0.75), cpu_ratio[i] = median(c, REPEATS);
  }
  for (int x = 0; x < EXECUTORS; x++)
    step[x] = median(t[x], REPEATS), step_cpu[x] = median(cpu[x], REPEATS);

  static const char *const WHAT[EXECUTORS] = {
      "(a) plain, whole batch, every activation kept",
      "(b) relay, inner keep, stash device, micro-batch 4, 2 parameter slots",
      "(f) (b) with a parameter slot per layer",
      "(c) plain, per-layer recompute, whole batch",
      "(d) relay, inner recompute, stash host, 4 micro-batches",
      "(e) plain, per-layer recompute, 4 micro-batches (d's arithmetic, no relay)"};
  printf("| executor | time per step | CPU s per step (all threads) |\n|---|---:|---:|\n");
  for (int x = 0; x < EXECUTORS; x++)
    printf("| %s | %.0f ms | %.2f s |\n", WHAT[x], 1e3 * step[x], step_cpu[x]);
  printf("\nThe hypervisor took %.1f %% of this machine's CPU time while the steps ran "
         "(steal, /proc/stat).\n\n", 100.0 * stolen / (wall * (double)sysconf(_SC_NPROCESSORS_ONLN)));
  printf("| ratio | wall: median | wall: quartiles | CPU time: median | target |\n"
         "|---|---:|---:|---:|---|\n");
  for (int i = 0; i < NRATIOS; i++) {
    char verdict[96] = "";
    if (RATIOS[i].target > 0)
      snprintf(verdict, sizeof verdict, "<= %.2f: %s", RATIOS[i].target,
               wall_ratio[i][2] <= RATIOS[i].target   ? "met in 3 of 4 rounds or more"
               : wall_ratio[i][1] <= RATIOS[i].target ? "met (median), not by the upper quartile"
                                                      : "NOT met");
    printf("| %s | %.3f | %.3f-%.3f | %.3f | %s |\n", RATIOS[i].name, wall_ratio[i][1],
           wall_ratio[i][0], wall_ratio[i][2], cpu_ratio[i], verdict);
  }
  printf("\nThe relays' last step (step time as measured above):\n\n");
  printf("| relay | step | compute | wait copy | wait update | optimizer (all threads) | "
         "copies (bytes, busy time) | device peak | host stash peak |\n"
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  print_stats("(b) keep, device, micro 4", &keep, step[B]);
  print_stats("(d) recompute, host, micro 1", &constant, step[D]);
  print_stats("(f) keep, device, micro 4, 8 slots", &resident, step[F]);

  printf("\nBusy ms per phase in that step, calling thread / copy threads / optimizer threads:\n\n");
  print_phases("(b)", &keep);
  print_phases("(d)", &constant);
  print_phases("(f)", &resident);

  relay_free(&keep);
  relay_free(&constant);
  relay_free(&resident);
  plain_free(&plain);
  l2l_tensor_free(tokens);
  l2l_tensor_free(targets);
  return 0;
}
