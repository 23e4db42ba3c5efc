/* train_gpt.c — training a small byte-level GPT with the C API alone.
 *
 * What it shows: the layers (a token+position embedding, pre-LN causal blocks, an LM
 * head tied to the embedding) made in the host pool, a relay over them (AdamW with a
 * cosine schedule, host stashing, four micro-batches per minibatch), the training loop,
 * the relay's statistics, and afterwards the trained layers run directly to continue a
 * prompt greedily. The text is a short built-in passage, or the bytes of a file given on
 * the command line. Every l2l call goes through ok(), which prints l2l_last_error().
 *
 * Build (after `make`):  cc examples/train_gpt.c -Isrc -Lbuild -ll2l -Wl,-rpath,$PWD/build
 *                           -o train_gpt
 * (`make` also builds it as build/train_gpt.)  Run: build/train_gpt [file] — a few
 * seconds; on the built-in text the loss falls from about 6 to well under 1 and the
 * continuation recites the passage.
 * Must never: reach below l2l.h (it is what a user's program looks like).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, execv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "l2l.h"

enum {
  VOCAB = 256,    /* bytes */
  SEQ = 32,       /* context */
  DIM = 64,
  HEADS = 4,
  MLP = 256,
  BLOCKS = 2,
  BATCH = 16,     /* minibatch */
  MICRO = 4,      /* samples per micro-batch: four micro-batches per minibatch */
  STEPS = 150,
  PRINT_EVERY = 15
};

static const char *default_text =
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. However little known the feelings or views of "
    "such a man may be on his first entering a neighbourhood, this truth is so well fixed "
    "in the minds of the surrounding families, that he is considered the rightful property "
    "of some one or other of their daughters. ";

/* Stops the program with l2l's message when a call fails. */
static void ok(l2l_status status, const char *what) {
  if (status != L2L_OK) {
    fprintf(stderr, "train_gpt: %s: %s (%s)\n", what, l2l_last_error(), l2l_status_name(status));
    exit(1);
  }
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

static unsigned char *read_file(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  *len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *data = malloc((size_t)*len + 1);
  if (data == NULL || fread(data, 1, (size_t)*len, f) != (size_t)*len) *len = 0;
  fclose(f);
  return data;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) { /* xorshift64* */
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  return rng * 2685821657736338717ull;
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

/* The next byte after `context` (len <= SEQ bytes): the layers run one after another
   on the host, the head without targets giving logits (1, len, VOCAB). */
static int predict(l2l_layer **layers, int n, const unsigned char *context, int len) {
  int64_t ids_shape[2] = {1, len}, act_shape[3] = {1, len, DIM}, logit_shape[3] = {1, len, VOCAB};
  l2l_tensor *ids = NULL, *x = NULL, *y = NULL;
  ok(l2l_tensor_new(&ids, L2L_POOL_HOST, L2L_I32, 2, ids_shape), "tokens");
  for (int i = 0; i < len; i++) ((int32_t *)l2l_tensor_data(ids))[i] = context[i];
  l2l_layer_batch batch = {.tokens = ids, .training = 0};
  for (int l = 0; l < n; l++) {
    ok(l2l_tensor_new(&y, L2L_POOL_HOST, L2L_F32, 3, l == n - 1 ? logit_shape : act_shape),
       "activations");
    ok(l2l_layer_forward(NULL, layers[l], y, x, &batch), "forward");
    l2l_tensor_free(x);
    x = y;
  }
  const float *logits = (const float *)l2l_tensor_data(x) + (int64_t)(len - 1) * VOCAB;
  int best = 0;
  for (int v = 1; v < VOCAB; v++)
    if (logits[v] > logits[best]) best = v;
  l2l_tensor_free(x);
  l2l_tensor_free(ids);
  return best;
}

int main(int argc, char **argv) {
  prefer_passive_openmp_threads(argv);
  long len = (long)strlen(default_text);
  unsigned char *text = (unsigned char *)default_text, *owned = NULL;
  if (argc > 1) {
    owned = text = read_file(argv[1], &len);
    if (text == NULL || len < SEQ + 2) {
      fprintf(stderr, "train_gpt: cannot read at least %d bytes from %s\n", SEQ + 2, argv[1]);
      return 1;
    }
  }
  printf("l2l %s: a byte-level GPT (%d blocks, dim %d, %d heads, context %d) on %ld bytes "
         "of %s\n", l2l_version(), BLOCKS, DIM, HEADS, SEQ, len, argc > 1 ? argv[1] : "built-in text");

  /* The model: embedding, blocks, LM head sharing the embedding's table. */
  l2l_layer *layers[BLOCKS + 2];
  int n = 0;
  layers[n++] = new_layer(L2L_LAYER_EMBEDDING, 1);
  for (int b = 0; b < BLOCKS; b++) layers[n++] = new_layer(L2L_LAYER_BLOCK, 2 + (uint64_t)b);
  layers[n++] = new_layer(L2L_LAYER_LM_HEAD, 99);
  ok(l2l_layer_tie(layers[n - 1], layers[0]), "tying the head to the embedding");

  /* The relay: AdamW under a cosine schedule with warm-up, boundaries stashed on the
     host, micro-batches of MICRO samples. */
  l2l_relay_config config;
  l2l_relay_config_default(&config);
  config.micro_batch = MICRO;
  config.stash = L2L_STASH_HOST;
  config.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-2f,
                                            .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
                                            .weight_decay = 0.1f};
  config.schedule = (l2l_schedule_config){.kind = L2L_SCHEDULE_COSINE, .warmup = 10,
                                          .total = STEPS, .final_ratio = 0.1f};
  config.seed = 7;
  l2l_relay *run = NULL;
  ok(l2l_relay_new(&run, layers, n, &config), "making the relay");

  /* A minibatch: BATCH random windows of the text; targets are the next bytes. */
  int64_t shape[2] = {BATCH, SEQ};
  l2l_tensor *tokens = NULL, *targets = NULL;
  ok(l2l_tensor_new(&tokens, L2L_POOL_HOST, L2L_I32, 2, shape), "tokens");
  ok(l2l_tensor_new(&targets, L2L_POOL_HOST, L2L_I32, 2, shape), "targets");
  int32_t *tok = l2l_tensor_data(tokens), *tgt = l2l_tensor_data(targets);
  l2l_relay_batch batch = {.tokens = tokens, .targets = targets};

  double first = 0, loss = 0;
  for (int step = 1; step <= STEPS; step++) {
    for (int b = 0; b < BATCH; b++) {
      long start = (long)(next_random() % (uint64_t)(len - SEQ - 1));
      for (int s = 0; s < SEQ; s++) {
        tok[b * SEQ + s] = text[start + s];
        tgt[b * SEQ + s] = text[start + s + 1];
      }
    }
    ok(l2l_relay_step(&loss, run, &batch), "training step");
    if (step == 1) first = loss;
    if (step == 1 || step % PRINT_EVERY == 0) {
      l2l_relay_stats st;
      ok(l2l_relay_get_stats(&st, run), "stats");
      printf("step %4d  loss %.3f  lr %.2e  %.1f ms/step  device peak %.1f KiB\n", step, loss,
             st.lr, 1e3 * st.step_seconds, st.device_peak / 1024.0);
    }
  }
  ok(l2l_relay_sync(run), "waiting for the last update");
  printf("loss %.3f -> %.3f\n", first, loss);
  l2l_relay_free(run); /* the layers stay, trained */

  /* Greedy continuation of the text's first bytes. */
  unsigned char out[SEQ + 60];
  int have = 12;
  memcpy(out, text, (size_t)have);
  while (have < (int)sizeof out) {
    int ctx = have < SEQ ? have : SEQ;
    out[have] = (unsigned char)predict(layers, n, out + have - ctx, ctx);
    have++;
  }
  printf("continuation: \"");
  for (int i = 0; i < have; i++) putchar(out[i] >= 32 && out[i] < 127 ? out[i] : '.');
  printf("\"\n");

  l2l_tensor_free(tokens);
  l2l_tensor_free(targets);
  for (int i = 0; i < n; i++) l2l_layer_free(layers[i]);
  free(owned);
  return loss < first ? 0 : 1;
}
