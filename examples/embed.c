/* SPDX-License-Identifier: MIT */
/* embed.c — training a small byte-level GPT from C, with libl2l's C API alone.
 *
 * What it shows: the layers (a token+position embedding, pre-LN causal blocks, an LM head
 * tied to the embedding) made in the host pool; a relay over them (AdamW under a cosine
 * schedule, boundaries stashed on the host, four micro-batches per minibatch); the
 * training loop and the relay's statistics; then the trained layers run directly to
 * continue a prompt greedily. The text is a short built-in passage, or the bytes of a file
 * given on the command line. Every fallible call is checked and a failure prints
 * l2l_last_error(), the library's message saying what was wrong (`./embed 5` shows one:
 * the relay refuses a cosine schedule no longer than its warm-up).
 *
 * Build outside this repository (libl2l built with `make`, L2L = the checkout):
 *   cc -std=c11 -Wall -Wextra embed.c -I$L2L/include -L$L2L/build -ll2l \
 *      -Wl,-rpath,$L2L/build -o embed
 * (`make` builds it as build/embed.) Run: ./embed [steps [file]] — 150 steps by default, a
 * few seconds; on the built-in text the loss falls from about 6 (ln 256 = 5.5 is a uniform
 * guess) to well under 1 and the continuation recites the passage.
 * Must never: reach below l2l.h (it is what a user's program looks like).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, execv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "l2l.h"

enum {
  VOCAB = 256,  /* bytes */
  SEQ = 32,     /* context */
  DIM = 64,
  HEADS = 4,
  MLP = 256,
  BLOCKS = 2,
  BATCH = 16,   /* samples per minibatch */
  MICRO = 4,    /* samples per micro-batch: four micro-batches per minibatch */
  WARMUP = 10,  /* steps of the learning rate's warm-up */
  DEFAULT_STEPS = 150,
  PRINT_EVERY = 15
};

static const char default_text[] =
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. However little known the feelings or views of "
    "such a man may be on his first entering a neighbourhood, this truth is so well fixed "
    "in the minds of the surrounding families, that he is considered the rightful property "
    "of some one or other of their daughters. ";

/* Stops the program with l2l's message when a call failed. A failed call has changed
   nothing, so a program that can go on (another batch size, a smaller budget) may;
   this one cannot. */
static void ok(l2l_status status, const char *what) {
  if (status == L2L_OK) return;
  fflush(stdout); /* what was printed before comes first */
  /* l2l_last_error() stays valid only until the next call into l2l: print it now. */
  fprintf(stderr, "embed: %s: %s\n", what, l2l_last_error());
  exit(1);
}

/* OpenMP's threads spin between parallel regions by default and then starve the relay's
   copy and optimizer threads (steps ran up to 60x slower on 2 cores). libgomp reads its
   policy before main, so the program restarts itself once with OMP_WAIT_POLICY=PASSIVE
   unless the user chose a policy (the l2l executable does the same). */
static void prefer_passive_openmp_threads(char **argv) {
  if (getenv("OMP_WAIT_POLICY") != NULL || getenv("GOMP_SPINCOUNT") != NULL) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv); /* returns only on failure: then run as we are */
}

/* The whole file, or NULL (with *len unchanged) if it cannot be read. */
static unsigned char *read_file(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  unsigned char *data = NULL;
  long n = -1; /* ftell gives -1 for a pipe */
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
    data = malloc((size_t)n + 1);
  if (data != NULL && fread(data, 1, (size_t)n, f) != (size_t)n) {
    free(data);
    data = NULL;
  }
  fclose(f);
  if (data != NULL) *len = n;
  return data;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) { /* xorshift64* (Vigna): enough to pick windows */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}

static l2l_layer *new_layer(l2l_layer_kind kind, uint64_t seed) {
  l2l_layer_config c = {.kind = kind, .dim = DIM, .heads = HEADS, .mlp = MLP, .vocab = VOCAB,
                        .max_seq = SEQ, .causal = 1, .bias = 1, .final_ln = 1,
                        .eps = 1e-5f, .memory = L2L_MEMORY_FRUGAL,
                        /* GPT-2's 0.02 is for width 768; a model this narrow needs larger
                           initial weights to learn quickly. */
                        .init_std = 0.1f,
                        .resid_std = 0.05f, /* init_std / sqrt(2 * BLOCKS), as GPT-2 */
                        .init_seed = seed};
  l2l_layer *layer = NULL;
  ok(l2l_layer_new(&layer, &c, L2L_POOL_HOST), "making a layer");
  return layer;
}

/* The most likely byte after `context` (1 <= len <= SEQ bytes): the layers run one after
   another on the host with no saved state (inference), the head without targets giving
   logits (1,len,VOCAB) instead of losses. */
static int predict(l2l_layer **layers, int n, const unsigned char *context, int len) {
  int64_t ids_shape[2] = {1, len}, act_shape[3] = {1, len, DIM}, logit_shape[3] = {1, len, VOCAB};
  l2l_tensor *ids = NULL, *x = NULL, *y = NULL;
  ok(l2l_tensor_new(&ids, L2L_POOL_HOST, L2L_I32, 2, ids_shape), "making the context");
  int32_t *id = l2l_tensor_data(ids); // (1,len)
  for (int i = 0; i < len; i++) id[i] = context[i];
  l2l_layer_batch batch = {.tokens = ids, .training = 0};
  for (int l = 0; l < n; l++) {
    ok(l2l_tensor_new(&y, L2L_POOL_HOST, L2L_F32, 3, l == n - 1 ? logit_shape : act_shape),
       "making activations");
    ok(l2l_layer_forward(NULL, layers[l], y, x, &batch), "running a layer");
    l2l_tensor_free(x); /* NULL before the embedding: fine */
    x = y;
  }
  const float *last = (const float *)l2l_tensor_data(x) + (int64_t)(len - 1) * VOCAB; // (VOCAB)
  int best = 0;
  for (int v = 1; v < VOCAB; v++)
    if (last[v] > last[best]) best = v;
  l2l_tensor_free(x);
  l2l_tensor_free(ids);
  return best;
}

int main(int argc, char **argv) {
  prefer_passive_openmp_threads(argv);
  char *end = NULL;
  long steps = argc > 1 ? strtol(argv[1], &end, 10) : DEFAULT_STEPS;
  if (argc > 3 || (argc > 1 && (end == argv[1] || *end != '\0' || steps < 1))) {
    fprintf(stderr, "usage: %s [steps [file]]   (steps >= 1, default %d)\n", argv[0],
            DEFAULT_STEPS);
    return 2;
  }
  const unsigned char *text = (const unsigned char *)default_text;
  long len = (long)strlen(default_text);
  unsigned char *owned = NULL;
  if (argc > 2) {
    owned = read_file(argv[2], &len);
    if (owned == NULL || len < SEQ + 2) {
      fprintf(stderr, "embed: cannot read at least %d bytes from %s\n", SEQ + 2, argv[2]);
      free(owned);
      return 1;
    }
    text = owned;
  }
  printf("l2l %s: a byte-level GPT (%d blocks, dim %d, %d heads, context %d) on %ld bytes "
         "of %s, %ld steps\n", l2l_version(), BLOCKS, DIM, HEADS, SEQ, len,
         argc > 2 ? argv[2] : "built-in text", steps);

  /* The model: embedding, blocks, LM head sharing the embedding's table (its gradient
     from both users adds up in one record). */
  l2l_layer *layers[BLOCKS + 2];
  int n = 0;
  layers[n++] = new_layer(L2L_LAYER_EMBEDDING, 1);
  for (int b = 0; b < BLOCKS; b++) layers[n++] = new_layer(L2L_LAYER_BLOCK, 2 + (uint64_t)b);
  layers[n++] = new_layer(L2L_LAYER_LM_HEAD, 99);
  ok(l2l_layer_tie(layers[n - 1], layers[0]), "tying the head to the embedding");

  /* The relay: AdamW under a cosine schedule with warm-up, boundaries stashed on the
     host (device memory the same for any depth), micro-batches of MICRO samples. The
     result equals whole-batch training; only memory and speed depend on these. The
     relay checks the whole config (a cosine's total must pass its warm-up: a run of
     WARMUP steps or fewer warms up for all but its last). */
  l2l_relay_config config;
  l2l_relay_config_default(&config);
  config.micro_batch = MICRO;
  config.stash = L2L_STASH_HOST;
  config.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-2f,
                                            .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
                                            .weight_decay = 0.1f};
  config.schedule = (l2l_schedule_config){.kind = L2L_SCHEDULE_COSINE,
                                          .warmup = steps > WARMUP ? WARMUP : steps - 1,
                                          .total = steps, .final_ratio = 0.1f};
  config.seed = 7;
  l2l_relay *run = NULL;
  ok(l2l_relay_new(&run, layers, n, &config), "making the relay");

  /* A minibatch: BATCH random windows of the text; the targets are the next bytes. The
     relay reads them from the host pool. */
  int64_t shape[2] = {BATCH, SEQ};
  l2l_tensor *tokens = NULL, *targets = NULL;
  ok(l2l_tensor_new(&tokens, L2L_POOL_HOST, L2L_I32, 2, shape), "making tokens");
  ok(l2l_tensor_new(&targets, L2L_POOL_HOST, L2L_I32, 2, shape), "making targets");
  int32_t *tok = l2l_tensor_data(tokens), *tgt = l2l_tensor_data(targets); // (BATCH,SEQ)
  l2l_relay_batch batch = {.tokens = tokens, .targets = targets};

  double first = 0, loss = 0;
  for (long step = 1; step <= steps; step++) {
    for (int b = 0; b < BATCH; b++) {
      long start = (long)(next_random() % (uint64_t)(len - SEQ)); /* start + SEQ < len */
      for (int s = 0; s < SEQ; s++) {
        tok[b * SEQ + s] = text[start + s];
        tgt[b * SEQ + s] = text[start + s + 1];
      }
    }
    /* Returns once the last layer's backward is done; the updates may still be running
       on the optimizer threads, and the next step waits for each layer's own. */
    ok(l2l_relay_step(&loss, run, &batch), "training step");
    if (step == 1) first = loss;
    if (step == 1 || step % PRINT_EVERY == 0 || step == steps) {
      l2l_relay_stats st;
      ok(l2l_relay_get_stats(&st, run), "reading the relay's statistics");
      printf("step %4ld  loss %.3f  lr %.2e  %.1f ms/step  device peak %.1f KiB\n", step, loss,
             st.lr, 1e3 * st.step_seconds, st.device_peak / 1024.0);
    }
  }
  ok(l2l_relay_sync(run), "waiting for the last update");
  printf("loss %.3f -> %.3f\n", first, loss);
  l2l_relay_free(run); /* the layers stay, trained: they were only borrowed */

  /* Greedy continuation of the text's first bytes. */
  unsigned char out[SEQ + 60];
  int have = 12;
  memcpy(out, text, (size_t)have);
  for (; have < (int)sizeof out; have++) {
    int ctx = have < SEQ ? have : SEQ;
    out[have] = (unsigned char)predict(layers, n, out + have - ctx, ctx);
  }
  printf("continuation: \"");
  for (int i = 0; i < have; i++) putchar(out[i] >= 32 && out[i] < 127 ? out[i] : '.');
  printf("\"\n");

  l2l_tensor_free(tokens);
  l2l_tensor_free(targets);
  for (int i = 0; i < n; i++) l2l_layer_free(layers[i]);
  free(owned);
  return 0;
}
