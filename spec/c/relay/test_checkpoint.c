/* SPDX-License-Identifier: MIT */
/* test_checkpoint.c — l2l_relay_save and l2l_relay_load (l2l.h, "checkpoints") through the
 * public C API alone.
 *
 * What it tests: that a run saved part way, its relay and layers freed, rebuilt over the
 * same model (other initial weights, other rng ids, no layer frozen) and loaded, trains on
 * exactly as the uninterrupted run does: every loss after the load and every final weight
 * equal to the bit, with random sizes, optimizer (SGD with or without momentum, AdamW,
 * LAMB), state precision (f32, bf16, 8 bits), device precision and masters (f32, bf16 with
 * bf16 masters), dropout, a tied head, loss scaling, accumulation (saves that fall inside
 * one) and a frozen layer, drawn afresh each run (the harness prints the seed; the draw is
 * printed too). Then the refusals: a missing file, a model of another shape, options that
 * change the numbers, damaged bytes in the last tensor, a file already at the path without
 * leave to replace it, and optimizer state a load would refuse: each refused with a
 * message naming the file and what is wrong, and leaving the relay exactly as it was
 * (every weight, gradient, optimizer state, update count, rng id, flag, policy and the
 * step counts compared byte for byte before and after) and the file at the path as it was,
 * with no temporary left beside it.
 * How: the reference for a resume is the uninterrupted run itself, made from the same
 * layers' initial weights and the same minibatches (drawn before either run); it shares
 * no code path with save and load.
 * All test names start with "checkpoint_" (`make test T=checkpoint_`).
 * Must never: reach below l2l.h (a C program's view), or compare anything but bits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { MAX_BLOCKS = 3, MAX_LAYERS = MAX_BLOCKS + 2, MAX_STEPS = 10 };

/* A run drawn at random: the model, the relay's settings, the data, where it is saved. */
struct setup {
  int blocks, steps_before, steps_after, frozen;   /* frozen: a layer index, or -1 */
  int64_t dim, heads, vocab, seq, batch;
  bool tie;
  float dropout;
  l2l_memory_mode memory;
  l2l_relay_config config;
  int32_t tokens[MAX_STEPS][64], targets[MAX_STEPS][64];   /* (batch, seq) each */
};

static const char *const OPTIMIZERS[] = {"sgd", "adamw", "lamb"};
static const char *const STATES[] = {"f32", "bf16", "8bit"};

static void draw(struct setup *s) {
  memset(s, 0, sizeof *s);
  s->blocks = (int)check_rand_int(1, MAX_BLOCKS);
  s->heads = check_rand_int(1, 2);
  s->dim = s->heads * PICK(4, 8, 12);
  s->vocab = check_rand_int(5, 29);
  s->seq = check_rand_int(2, 8);
  s->batch = check_rand_int(1, 64 / s->seq < 6 ? 64 / s->seq : 6);
  s->tie = check_rand_int(0, 1);
  s->dropout = check_rand_int(0, 2) ? 0.1f : 0.0f;
  s->memory = (l2l_memory_mode)check_rand_int(0, 1);
  s->frozen = check_rand_int(0, 3) == 0 ? (int)check_rand_int(0, s->blocks + 1) : -1;
  l2l_relay_config *c = &s->config;
  l2l_relay_config_default(c);
  c->micro_batch = check_rand_int(1, s->batch);
  c->accumulate = (int)check_rand_int(1, 3);
  c->seed = (uint64_t)check_rand_int(0, 1000);
  c->optimizer_threads = (int)check_rand_int(1, 2);
  c->optimizer.kind = (l2l_optimizer_kind)check_rand_int(0, 2);
  c->optimizer.lr = (float)check_rand_uniform(1e-3, 3e-2);
  c->optimizer.momentum = check_rand_int(0, 2) ? 0.9f : 0.0f;
  c->optimizer.state = (l2l_state_precision)check_rand_int(0, 2);
  c->schedule = (l2l_schedule_config){.kind = L2L_SCHEDULE_COSINE, .warmup = 2, .total = 20, .final_ratio = 0.1f};
  c->precision = check_rand_int(0, 1) ? L2L_BF16 : L2L_F32;
  c->master = c->precision == L2L_BF16 && check_rand_int(0, 1) ? L2L_BF16 : L2L_F32;
  c->loss_scale = check_rand_int(0, 2) == 0 ? 1024.0f : 0.0f;
  c->clip_global_norm = check_rand_int(0, 2) == 0 ? 1.0f : 0.0f;
  s->steps_before = (int)check_rand_int(1, 5);
  s->steps_after = (int)check_rand_int(1, MAX_STEPS - s->steps_before);
  for (int t = 0; t < MAX_STEPS; t++) {
    for (int64_t i = 0; i < s->batch * s->seq; i++) {
      s->tokens[t][i] = (int32_t)check_rand_int(0, s->vocab - 1);
      s->targets[t][i] = check_rand_int(0, 9) == 0 ? -1 : (int32_t)check_rand_int(0, s->vocab - 1);
    }
    /* a step needs a real target (the relay refuses one without): a few targets all -1,
       one draw in 10^3 at batch 1 and seq 3, get one back */
    if (s->targets[t][0] == -1) s->targets[t][0] = (int32_t)check_rand_int(0, s->vocab - 1);
  }
  printf("    %d blocks, dim %lld, heads %lld, vocab %lld, seq %lld, batch %lld, micro %lld, "
         "accumulate %d, %s (momentum %g) with %s state, precision %s, master %s, loss scale %g, "
         "clip %g, dropout %g, %s, tie %d, frozen %d; save after %d steps, %d more\n",
         s->blocks, (long long)s->dim, (long long)s->heads, (long long)s->vocab, (long long)s->seq,
         (long long)s->batch, (long long)c->micro_batch, c->accumulate, OPTIMIZERS[c->optimizer.kind],
         (double)c->optimizer.momentum, STATES[c->optimizer.state], l2l_dtype_name(c->precision),
         l2l_dtype_name(c->master), (double)c->loss_scale, (double)c->clip_global_norm,
         (double)s->dropout, s->memory ? "frugal" : "standard", s->tie, s->frozen, s->steps_before,
         s->steps_after);
}

/* The model's layers, initialised from init_seed: embedding, blocks, LM head. rng_ids:
   their dropout streams (and bf16 masters' rounding draws) numbered from 7, as a model
   rebuilt from the same script has them; else the fresh ids every new layer gets. */
static int build(l2l_layer **layers, const struct setup *s, uint64_t init_seed, bool rng_ids) {
  int n = 0;
  l2l_layer_config c = {.dim = s->dim, .heads = s->heads, .mlp = 2 * s->dim, .vocab = s->vocab,
                        .max_seq = s->seq, .causal = 1, .bias = 1, .final_ln = 1, .eps = 1e-5f,
                        .memory = s->memory, .dropout = s->dropout, .attn_dropout = s->dropout,
                        .init_std = 0.2f, .resid_std = 0.1f};
  for (int i = 0; i < s->blocks + 2; i++) {
    c.kind = i == 0 ? L2L_LAYER_EMBEDDING : i == s->blocks + 1 ? L2L_LAYER_LM_HEAD : L2L_LAYER_BLOCK;
    c.init_seed = init_seed * 100 + (uint64_t)i;
    CHECK_OK(l2l_layer_new(&layers[n++], &c, L2L_POOL_HOST));
    if (rng_ids) CHECK_OK(l2l_layer_set_rng_id(layers[n - 1], 7 + (uint32_t)i));
  }
  if (s->tie) CHECK_OK(l2l_layer_tie(layers[n - 1], layers[0]));
  return n;
}

static l2l_relay *relay_over(l2l_layer **layers, int n, const l2l_relay_config *config) {
  l2l_relay *run = NULL;
  CHECK_OK(l2l_relay_new(&run, layers, n, config));
  return run;
}

/* Steps [from, to) of the setup's data; the losses into loss[from ..]. */
static void train(l2l_relay *run, const struct setup *s, int from, int to, double *loss) {
  int64_t shape[2] = {s->batch, s->seq};
  l2l_tensor *tokens = check_tensor(L2L_POOL_HOST, L2L_I32, 2, shape);
  l2l_tensor *targets = check_tensor(L2L_POOL_HOST, L2L_I32, 2, shape);
  l2l_relay_batch batch = {.tokens = tokens, .targets = targets};
  for (int t = from; t < to; t++) {
    memcpy(l2l_tensor_data(tokens), s->tokens[t], (size_t)(s->batch * s->seq) * sizeof(int32_t));
    memcpy(l2l_tensor_data(targets), s->targets[t], (size_t)(s->batch * s->seq) * sizeof(int32_t));
    CHECK_OK(l2l_relay_step(&loss[t], run, &batch));
  }
  CHECK_OK(l2l_relay_sync(run));
  FREE(tokens, targets);
}

static void free_all(l2l_relay *run, l2l_layer **layers, int n) {
  l2l_relay_free(run);
  for (int i = 0; i < n; i++) l2l_layer_free(layers[i]);
}

static size_t tensor_bytes(const l2l_tensor *t) {
  return (size_t)l2l_tensor_numel(t) * l2l_dtype_size(l2l_tensor_dtype(t));
}

/* ---------------------------------------------------------------- a relay, byte for byte */

/* Everything a load may change, as bytes: per layer its rng id, flag and policies; per
   parameter its value, gradient, update count and state arrays; the step counts and the
   loss scale. */
struct snapshot {
  unsigned char *bytes;
  size_t n, cap;
};

static void put(struct snapshot *sn, const void *p, size_t n) {
  if (sn->n + n > sn->cap) {
    sn->cap = 2 * (sn->n + n);
    unsigned char *grown = xmalloc(sn->cap);
    if (sn->n) memcpy(grown, sn->bytes, sn->n);
    free(sn->bytes);
    sn->bytes = grown;
  }
  memcpy(sn->bytes + sn->n, p, n);
  sn->n += n;
}

static struct snapshot snapshot_of(l2l_relay *run) {
  struct snapshot sn = {0};
  int n = l2l_relay_layer_count(run);
  for (int i = 0; i < n; i++) {
    l2l_layer *layer = l2l_relay_layer(run, i);
    int facts[4] = {(int)l2l_layer_rng_id(layer), l2l_relay_frozen(run, i), l2l_relay_inner(run, i),
                    l2l_relay_stash(run, i)};
    put(&sn, facts, sizeof facts);
    for (int p = 0; p < l2l_layer_param_count(layer); p++) {
      const l2l_param *param = l2l_layer_param(layer, p);
      put(&sn, l2l_tensor_data(l2l_param_value(param)), tensor_bytes(l2l_param_value(param)));
      put(&sn, l2l_tensor_data(l2l_param_grad(param)), tensor_bytes(l2l_param_grad(param)));
      int64_t updates = -1;
      CHECK_OK(l2l_relay_param_updates(&updates, run, param));
      put(&sn, &updates, sizeof updates);
      for (int a = 0; a < 2; a++) {
        l2l_tensor *st = NULL;
        CHECK_OK(l2l_relay_param_state(&st, run, param, a));
        if (st) put(&sn, l2l_tensor_data(st), tensor_bytes(st));
      }
    }
  }
  l2l_relay_stats stats;
  CHECK_OK(l2l_relay_get_stats(&stats, run));
  int64_t counts[5] = {stats.steps, stats.updates, stats.loss_scale_good, stats.skipped_updates, 0};
  memcpy(&counts[4], &stats.loss_scale, sizeof(double));
  put(&sn, counts, sizeof counts);
  return sn;
}

static bool same_snapshot(struct snapshot a, struct snapshot b) {
  bool same = a.n == b.n && memcmp(a.bytes, b.bytes, a.n) == 0;
  free(a.bytes);
  free(b.bytes);
  return same;
}

/* ---------------------------------------------------------------- the resume */

TEST(checkpoint_resume) {
  static struct setup s;
  draw(&s);
  int k = s.steps_before, total = s.steps_before + s.steps_after;
  char dir[256], path[512];
  if (!check_temp_dir(dir, sizeof dir, "l2l-checkpoint")) return;
  snprintf(path, sizeof path, "%s/run.safetensors", dir);

  /* the reference: the whole run, uninterrupted */
  l2l_layer *a[MAX_LAYERS], *b[MAX_LAYERS];
  double want[MAX_STEPS] = {0}, got[MAX_STEPS] = {0};
  int n = build(a, &s, 1, true);
  l2l_relay *ra = relay_over(a, n, &s.config);
  if (s.frozen >= 0) CHECK_OK(l2l_relay_set_frozen(ra, s.frozen, 1));
  train(ra, &s, 0, total, want);

  /* the same run saved after k steps, everything freed */
  build(b, &s, 1, true);
  l2l_relay *rb = relay_over(b, n, &s.config);
  if (s.frozen >= 0) CHECK_OK(l2l_relay_set_frozen(rb, s.frozen, 1));
  train(rb, &s, 0, k, got);
  l2l_save_options opts = {.extra = "{\"note\": \"a C test\", \"step\": 3}"};
  CHECK_OK(l2l_relay_save(rb, path, &opts));
  /* and loaded back into the same relay after it trained on (a rollback): every copy its
     updates made since (16-bit staging copies, accumulators) gives way to the file's */
  double later[MAX_STEPS] = {0};
  train(rb, &s, k, total, later);
  CHECK_OK(l2l_relay_load(rb, path));
  train(rb, &s, k, total, later);
  for (int t = k; t < total; t++)
    CHECK(memcmp(&later[t], &want[t], sizeof(double)) == 0, "step %d: loss %.17g after a rollback, "
          "%.17g uninterrupted", t, later[t], want[t]);
  free_all(rb, b, n);

  /* rebuilt with other weights and rng ids, nothing frozen, then loaded */
  build(b, &s, 2, false);
  rb = relay_over(b, n, &s.config);
  CHECK_OK(l2l_relay_load(rb, path));
  l2l_relay_stats stats;
  CHECK_OK(l2l_relay_get_stats(&stats, rb));
  CHECK(stats.steps == k, "steps after the load: %lld, saved after %d", (long long)stats.steps, k);
  train(rb, &s, k, total, got);
  for (int t = k; t < total; t++)
    CHECK(memcmp(&got[t], &want[t], sizeof(double)) == 0, "step %d: loss %.17g after the load, %.17g "
          "uninterrupted", t, got[t], want[t]);
  for (int i = 0; i < n; i++)
    for (int p = 0; p < l2l_layer_param_count(a[i]); p++) {
      const l2l_tensor *va = l2l_param_value(l2l_layer_param(a[i], p));
      const l2l_tensor *vb = l2l_param_value(l2l_layer_param(b[i], p));
      CHECK(memcmp(l2l_tensor_data(va), l2l_tensor_data(vb), tensor_bytes(va)) == 0,
            "layer %d's %s differs from the uninterrupted run's", i, l2l_param_name(l2l_layer_param(a[i], p)));
    }
  /* the description a C program reads back: the caller's extra in it */
  size_t len = 0;
  CHECK_OK(l2l_checkpoint_description(NULL, 0, &len, path));
  char *text = xmalloc(len + 1);
  CHECK_FAILS(l2l_checkpoint_description(text, len, &len, path), L2L_ERR_INVALID, "too small");
  CHECK_OK(l2l_checkpoint_description(text, len + 1, &len, path));
  CHECK(strlen(text) == len && strstr(text, "\"note\":\"a C test\"") != NULL, "description: %s", text);
  free(text);
  free_all(ra, a, n);
  free_all(rb, b, n);
  check_remove_dir(dir);
}

/* ---------------------------------------------------------------- refusals */

/* The whole file (NULL if it cannot be read); *len its size. */
static unsigned char *file_bytes(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  unsigned char *data = NULL;
  if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (*len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
    data = xmalloc((size_t)*len + 1);
    if (fread(data, 1, (size_t)*len, f) != (size_t)*len) {
      free(data);
      data = NULL;
    }
  }
  if (f) fclose(f);
  return data;
}

static bool write_bytes(const char *path, const unsigned char *data, long len) {
  FILE *f = fopen(path, "wb");
  bool ok = f != NULL && fwrite(data, 1, (size_t)len, f) == (size_t)len;
  if (f) ok = fclose(f) == 0 && ok;
  return ok;
}

/* A load of path into run that must fail with status and a message holding both the
   path's last part and `needle`, and leave the relay as it was. */
static void refused_load(l2l_relay *run, const char *path, l2l_status status, const char *needle) {
  struct snapshot before = snapshot_of(run);
  CHECK_FAILS(l2l_relay_load(run, path), status, needle);
  const char *base = strrchr(path, '/');
  CHECK(strstr(l2l_last_error(), base ? base + 1 : path) != NULL, "the message names the file: %s", l2l_last_error());
  CHECK(same_snapshot(before, snapshot_of(run)), "a refused load of %s changed the relay", path);
}

/* A save of run to path that must fail with status and needle, leaving the file at path
   byte for byte as it was and nothing new in its folder. */
static void refused_save(l2l_relay *run, const char *dir, const char *path, int replace, l2l_status status,
                         const char *needle) {
  long before_len = 0, after_len = 0;
  unsigned char *before = file_bytes(path, &before_len);
  int entries = check_dir_entries(dir);
  l2l_save_options opts = {.replace = replace};
  CHECK_FAILS(l2l_relay_save(run, path, &opts), status, needle);
  unsigned char *after = file_bytes(path, &after_len);
  CHECK(before && after && before_len == after_len && memcmp(before, after, (size_t)before_len) == 0,
        "a refused save changed %s", path);
  CHECK(check_dir_entries(dir) == entries, "a refused save left %d entries in %s, %d before",
        check_dir_entries(dir), dir, entries);
  free(before);
  free(after);
}

/* The first element of the first record's optimizer state made NaN, as a C program
   writing into l2l_relay_param_state's array could (false: no record has state yet). */
static bool poison_state(l2l_relay *run, l2l_state_precision state) {
  l2l_layer *layer = l2l_relay_layer(run, 0);
  l2l_tensor *st = NULL;
  CHECK_OK(l2l_relay_param_state(&st, run, l2l_layer_param(layer, 0), 0));
  if (st == NULL) return false;
  unsigned char *bytes = l2l_tensor_data(st);
  if (state == L2L_STATE_8BIT) {   /* the first block's scale, after the codes padded to 4 */
    int64_t n = l2l_tensor_numel(l2l_param_value(l2l_layer_param(layer, 0)));
    memset(bytes + (n + 3) / 4 * 4, 0xff, 4);
  } else if (state == L2L_STATE_BF16) {
    memcpy(bytes, &(uint16_t){0x7fc0}, 2);
  } else {
    memcpy(bytes, &(float){NAN}, 4);
  }
  return true;
}

TEST(checkpoint_refusals) {
  static struct setup s;
  draw(&s);
  int k = s.steps_before, total = s.steps_before + s.steps_after;
  char dir[256], path[512], other[512];
  if (!check_temp_dir(dir, sizeof dir, "l2l-checkpoint")) return;
  snprintf(path, sizeof path, "%s/run.safetensors", dir);
  double loss[MAX_STEPS];
  l2l_layer *x[MAX_LAYERS], *y[MAX_LAYERS], *z[MAX_LAYERS];
  int n = build(x, &s, 1, true);
  l2l_relay *rx = relay_over(x, n, &s.config);
  train(rx, &s, 0, k, loss);
  CHECK_OK(l2l_relay_save(rx, path, NULL));
  /* y: the same model, other weights, trained on other minibatches: all its state differs */
  build(y, &s, 3, false);
  l2l_relay *ry = relay_over(y, n, &s.config);
  train(ry, &s, k, total, loss);

  snprintf(other, sizeof other, "%s/missing.safetensors", dir);
  refused_load(ry, other, L2L_ERR_IO, "No such file");
  /* damaged: a bit of the last tensor's last byte, after every record it might change */
  long len = 0;
  unsigned char *bytes = file_bytes(path, &len);
  if (CHECK(bytes != NULL, "cannot read %s", path)) {
    bytes[len - 1 - check_rand_int(0, 3)] ^= (unsigned char)(1u << check_rand_int(0, 7));
    snprintf(other, sizeof other, "%s/damaged.safetensors", dir);
    CHECK(write_bytes(other, bytes, len), "cannot write %s", other);
    refused_load(ry, other, L2L_ERR_INVALID, "is damaged");
    /* cut short */
    CHECK(write_bytes(other, bytes, len - 1 - check_rand_int(0, len / 2)), "cannot write %s", other);
    refused_load(ry, other, L2L_ERR_INVALID, "");
    free(bytes);
  }
  /* a model of another shape, and options that change the numbers */
  struct setup wide = s;
  wide.dim += wide.heads;
  build(z, &wide, 1, false);
  l2l_relay *rz = relay_over(z, n, &s.config);
  refused_load(rz, path, L2L_ERR_INVALID, "'dim' is");
  free_all(rz, z, n);
  l2l_relay_config faster = s.config;
  faster.optimizer.lr *= 2;
  build(z, &s, 1, false);
  rz = relay_over(z, n, &faster);
  refused_load(rz, path, L2L_ERR_INVALID, "'lr' is");
  free_all(rz, z, n);
  /* a file at the path, no leave to replace it; state a load would refuse */
  refused_save(ry, dir, path, 0, L2L_ERR_STATE, "exists already");
  if (poison_state(ry, s.config.optimizer.state))
    refused_save(ry, dir, path, 1, L2L_ERR_INVALID, "would not load");
  free_all(rx, x, n);
  free_all(ry, y, n);
  check_remove_dir(dir);
}
