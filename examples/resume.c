/* SPDX-License-Identifier: MIT */
/* resume.c — a training run saved part way, everything freed, and resumed from its file
 * with the C API alone: the steps after the load give the losses, to the bit, of the run
 * that never stopped.
 *
 * What it shows: l2l_relay_save (the relay's whole training state in one safetensors file,
 * written atomically: the weights, the AdamW state, each record's update count, the steps
 * done, the options, and an "extra" of the program's own) and l2l_relay_load (into a relay
 * the program builds again over the same model: the layers of the same kinds and sizes,
 * with any weights, and the same optimizer, schedule and seed; the file's weights, state,
 * rng ids and progress replace what it holds). The model is a small byte-level GPT with
 * dropout (whose draws follow each layer's rng id, which the load restores) and an LM head
 * tied to the embedding; the minibatches are a function of the step alone, as a resumable
 * program's must be. It trains STEPS steps straight through, then the same run again: SAVE
 * steps, save, free the relay and the layers, build them again (other initial weights),
 * load, and the remaining steps; it prints both runs' losses and whether they agree to the
 * bit (on the CPU; a GPU's attention adds with atomics, so there they agree to float
 * rounding). The file is not replaced if it exists (l2l_save_options.replace says so).
 *
 * Build outside this repository (libl2l built with `make`, L2L = the checkout):
 *   cc -std=c11 -Wall -Wextra resume.c -I$L2L/include -L$L2L/build -ll2l \
 *      -Wl,-rpath,$L2L/build -o resume
 * (`make` builds it as build/resume.) Run: ./resume FILE [steps [save_at]] — 12 steps,
 * saved after 5, by default; FILE must not exist yet. A second of work.
 * Must never: reach below l2l.h (it is what a user's program looks like).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, execv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "l2l.h"

enum { VOCAB = 256, SEQ = 16, DIM = 32, HEADS = 2, BLOCKS = 2, BATCH = 8, MICRO = 2, MAX_STEPS = 1000 };

static const char text[] =
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. ";

static void ok(l2l_status status, const char *what) {
  if (status == L2L_OK) return;
  fflush(stdout);
  fprintf(stderr, "resume: %s: %s\n", what, l2l_last_error());
  exit(1);
}

/* OpenMP's spinning threads starve the relay's own (see embed.c): passive waiting, unless
   the user chose a policy. */
static void prefer_passive_openmp_threads(char **argv) {
  if (getenv("OMP_WAIT_POLICY") != NULL || getenv("GOMP_SPINCOUNT") != NULL) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv);
}

/* The model: embedding, blocks, a head tied to the embedding; initial weights from seed.
   What a load needs of it is its shape, not its weights. Each layer's rng id (its dropout
   stream) is numbered here as the program's model has it: a new layer's default id comes
   from a counter of the process, so the two runs this program makes in one process would
   otherwise draw different masks (a load restores the file's ids whatever they are). */
static int build(l2l_layer **layers, uint64_t seed) {
  l2l_layer_config c = {.dim = DIM, .heads = HEADS, .mlp = 4 * DIM, .vocab = VOCAB, .max_seq = SEQ,
                        .causal = 1, .bias = 1, .final_ln = 1, .eps = 1e-5f, .dropout = 0.1f,
                        .attn_dropout = 0.1f, .memory = L2L_MEMORY_FRUGAL, .init_std = 0.1f,
                        .resid_std = 0.05f};
  int n = 0;
  for (int i = 0; i < BLOCKS + 2; i++) {
    c.kind = i == 0 ? L2L_LAYER_EMBEDDING : i == BLOCKS + 1 ? L2L_LAYER_LM_HEAD : L2L_LAYER_BLOCK;
    c.init_seed = seed + (uint64_t)i;
    ok(l2l_layer_new(&layers[n++], &c, L2L_POOL_HOST), "making a layer");
    ok(l2l_layer_set_rng_id(layers[n - 1], 1 + (uint32_t)i), "numbering a layer");
  }
  ok(l2l_layer_tie(layers[n - 1], layers[0]), "tying the head to the embedding");
  return n;
}

static l2l_relay *relay_over(l2l_layer **layers, int n) {
  l2l_relay_config config;
  l2l_relay_config_default(&config);
  config.micro_batch = MICRO;
  config.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_ADAMW, .lr = 3e-3f, .beta1 = 0.9f,
                                            .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
  config.schedule = (l2l_schedule_config){.kind = L2L_SCHEDULE_COSINE, .warmup = 3, .total = 100,
                                          .final_ratio = 0.1f};
  config.seed = 7;
  l2l_relay *run = NULL;
  ok(l2l_relay_new(&run, layers, n, &config), "making the relay");
  return run;
}

/* Step `step`'s minibatch: windows of the text at places that depend on the step alone. */
static void step_batch(l2l_tensor *tokens, l2l_tensor *targets, long step) {
  int32_t *tok = l2l_tensor_data(tokens), *tgt = l2l_tensor_data(targets); // (BATCH,SEQ)
  long len = (long)strlen(text);
  for (int b = 0; b < BATCH; b++) {
    long start = (step * 37 + b * 11) % (len - SEQ - 1);
    for (int s = 0; s < SEQ; s++) {
      tok[b * SEQ + s] = (unsigned char)text[start + s];
      tgt[b * SEQ + s] = (unsigned char)text[start + s + 1];
    }
  }
}

/* Steps [from, to) into loss[]. */
static void train(l2l_relay *run, long from, long to, double *loss) {
  int64_t shape[2] = {BATCH, SEQ};
  l2l_tensor *tokens = NULL, *targets = NULL;
  ok(l2l_tensor_new(&tokens, L2L_POOL_HOST, L2L_I32, 2, shape), "making tokens");
  ok(l2l_tensor_new(&targets, L2L_POOL_HOST, L2L_I32, 2, shape), "making targets");
  l2l_relay_batch batch = {.tokens = tokens, .targets = targets};
  for (long step = from; step < to; step++) {
    step_batch(tokens, targets, step);
    ok(l2l_relay_step(&loss[step], run, &batch), "training step");
  }
  l2l_tensor_free(tokens);
  l2l_tensor_free(targets);
}

static void free_all(l2l_relay *run, l2l_layer **layers, int n) {
  l2l_relay_free(run);
  for (int i = 0; i < n; i++) l2l_layer_free(layers[i]);
}

int main(int argc, char **argv) {
  prefer_passive_openmp_threads(argv);
  long steps = argc > 2 ? strtol(argv[2], NULL, 10) : 12;
  long at = argc > 3 ? strtol(argv[3], NULL, 10) : 5;
  if (argc < 2 || argc > 4 || steps < 2 || steps > MAX_STEPS || at < 1 || at >= steps) {
    fprintf(stderr, "usage: %s FILE [steps [save_at]]   (2 <= steps <= %d, 1 <= save_at < steps)\n",
            argv[0], MAX_STEPS);
    return 2;
  }
  const char *path = argv[1];
  static double straight[MAX_STEPS], resumed[MAX_STEPS];
  l2l_layer *layers[BLOCKS + 2];

  /* the run that never stops */
  int n = build(layers, 1);
  l2l_relay *run = relay_over(layers, n);
  train(run, 0, steps, straight);
  free_all(run, layers, n);

  /* the same run, saved after `at` steps; nothing of it is left but the file */
  build(layers, 1);
  run = relay_over(layers, n);
  train(run, 0, at, resumed);
  char extra[64];
  snprintf(extra, sizeof extra, "{\"saved_at\": %ld}", at);
  l2l_save_options save = {.replace = 0, .extra = extra};
  ok(l2l_relay_save(run, path, &save), "saving");
  free_all(run, layers, n);
  printf("saved after step %ld to %s\n", at, path);

  /* built again with other weights, loaded, and on to the end */
  build(layers, 1000);
  run = relay_over(layers, n);
  ok(l2l_relay_load(run, path), "loading");
  l2l_relay_stats stats;
  ok(l2l_relay_get_stats(&stats, run), "reading the statistics");
  printf("loaded: %lld steps done\n", (long long)stats.steps);
  train(run, stats.steps, steps, resumed);
  free_all(run, layers, n);

  int same = 0;
  for (long step = 0; step < steps; step++) {
    int equal = memcmp(&straight[step], &resumed[step], sizeof(double)) == 0;
    same += equal;
    printf("step %3ld  loss %.17g  %s %.17g%s\n", step + 1, straight[step], step < at ? "before the save"
           : "resumed", resumed[step], equal ? "" : "  DIFFERS");
  }
  printf("%d of %ld losses equal to the bit\n", same, steps);
  return same == steps ? 0 : 1;
}
