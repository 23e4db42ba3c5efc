/* SPDX-License-Identifier: MIT */
/* agree.c — what every rank of a data-parallel relay must hold alike, and who differs.
 *
 * Purpose: ranks that train different things must not train at all. Every step begins
 * with an exchange of sizes (step.c, dist_begin) that carries a digest of everything the
 * ranks must share: the step's shape (its number, the layers it runs and the sequence
 * length, training or evaluation), each active layer's kind, full config (its
 * initialisation seed and dropout rates included), name, records' shapes, rng id and
 * frozen flag, the relay's options the option table marks AGREE (core/options.def: the
 * optimizer and its settings, schedule, clipping, loss scaling, accumulation, precisions,
 * masters, dropout seed, non-finite policy), the loss scale's state and progress.
 * Micro-batch, stash and inner policies and parameter slots may differ: they set memory
 * and time, not what is computed. A rank whose digest differs from rank 0's
 * makes every rank exchange their descriptions (word by word) and refuse the step,
 * each naming the first difference between itself and the first rank it disagrees with.
 * Before this, a rank with other heads, learning rate or clipping trained to the end
 * with exit 0; shapes with the same parameter count ended in MPI_ERR_TRUNCATE;
 * accumulate 2 against 1 waited out the timeout and blamed a dead rank.
 * Must never: post a collective one rank would not (every rank sees the same digests and
 * takes the same path), or leave a refused step half begun.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay.h"

enum { LABEL = 72 };

/* How a word is shown in a message: an integer, the bits of an f32 or an f64, or (AS_CHOICE
   plus the option's row) a relay option's choice by its name. */
enum word_kind { AS_INT, AS_F32, AS_F64, AS_CHOICE };

/* The description being made: its digest always; its words, their kinds and labels when
   asked. */
struct description {
  uint64_t digest;
  int64_t *words;
  char (*labels)[LABEL];
  unsigned char *kinds;
  int *layers;           /* the layer a word's label names (-1: none) */
  int count, room;
  int next;              /* the kind of the next word (then back to AS_INT) */
  int layer;             /* the layer the next words' labels name (-1: none) */
};

/* A label names its layer with NAMED_LAYER: a refusal quoting the label names that layer
   in its detail too. */
static void word(struct description *d, int64_t value, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void word(struct description *d, int64_t value, const char *fmt, ...) {
  d->digest = (d->digest ^ (uint64_t)value) * 1099511628211ull;   /* FNV-1a, a word at a time */
  if (d->words != NULL && d->count < d->room) {
    d->words[d->count] = value;
    d->kinds[d->count] = (unsigned char)d->next;
    d->layers[d->count] = d->layer;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->labels[d->count], LABEL, fmt, ap);
    va_end(ap);
  }
  d->next = AS_INT;
  d->count++;
}

/* A float's bits as the word (compared exactly), shown as the float. */
static int64_t f32w(struct description *d, float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  d->next = AS_F32;
  return u;
}

static int64_t f64w(struct description *d, double f) {
  int64_t u;
  memcpy(&u, &f, sizeof u);
  d->next = AS_F64;
  return u;
}

static void show(char *out, size_t len, int64_t w, int kind) {
  if (kind >= AS_CHOICE) {
    snprintf(out, len, "%s", options_choice_name(options_rows[kind - AS_CHOICE].name, (int)w));
  } else if (kind == AS_F32) {
    uint32_t u = (uint32_t)w;
    float f;
    memcpy(&f, &u, sizeof f);
    snprintf(out, len, "%.9g", f);
  } else if (kind == AS_F64) {
    double f;
    memcpy(&f, &w, sizeof f);
    snprintf(out, len, "%.17g", f);
  } else {
    snprintf(out, len, "%lld", (long long)w);
  }
}

static void describe_layer(struct description *d, const struct step *s, int k) {
  const struct relay_layer *rl = &s->run->layers[s->active[k]];
  l2l_layer_config c;
  l2l_layer_get_config(&c, rl->layer);
  const char *name = l2l_layer_name(rl->layer);
  int at = s->active[k];
  d->layer = k;   /* (the active layer's count) */
  word(d, at, "active " NAMED_LAYER "'s place in the relay", k);
  d->layer = at;
  /* the name, 8 bytes a word */
  char padded[32] = {0};
  snprintf(padded, sizeof padded, "%s", name);
  for (int i = 0; i < 4; i++) {
    int64_t w;
    memcpy(&w, padded + 8 * i, sizeof w);
    word(d, w, NAMED_LAYER "'s kind or name (%s)", at, name);
  }
  word(d, c.kind, NAMED_LAYER " (%s): kind", at, name);
  word(d, c.dim, NAMED_LAYER " (%s): dim", at, name);
  word(d, c.heads, NAMED_LAYER " (%s): heads", at, name);
  word(d, c.mlp, NAMED_LAYER " (%s): mlp", at, name);
  word(d, c.vocab, NAMED_LAYER " (%s): vocab", at, name);
  word(d, c.max_seq, NAMED_LAYER " (%s): max_seq", at, name);
  word(d, c.type_vocab, NAMED_LAYER " (%s): type_vocab", at, name);
  word(d, c.classes, NAMED_LAYER " (%s): classes", at, name);
  word(d, c.causal, NAMED_LAYER " (%s): causal", at, name);
  word(d, c.post_ln, NAMED_LAYER " (%s): post_ln", at, name);
  word(d, c.bias, NAMED_LAYER " (%s): bias", at, name);
  word(d, c.final_ln, NAMED_LAYER " (%s): final_ln", at, name);
  word(d, f32w(d, c.dropout), NAMED_LAYER " (%s): dropout", at, name);
  word(d, f32w(d, c.attn_dropout), NAMED_LAYER " (%s): attn_dropout", at, name);
  word(d, f32w(d, c.eps), NAMED_LAYER " (%s): eps", at, name);
  word(d, c.memory, NAMED_LAYER " (%s): memory", at, name);
  word(d, f32w(d, c.init_std), NAMED_LAYER " (%s): init_std", at, name);
  word(d, f32w(d, c.resid_std), NAMED_LAYER " (%s): resid_std", at, name);
  word(d, (int64_t)c.init_seed, NAMED_LAYER " (%s): init_seed", at, name);
  word(d, l2l_layer_rng_id(rl->layer), NAMED_LAYER " (%s): rng id (its dropout draws)", at, name);
  word(d, rl->frozen, NAMED_LAYER " (%s): frozen", at, name);
  int n = l2l_layer_param_count(rl->layer);
  word(d, n, NAMED_LAYER " (%s): number of records", at, name);
  for (int r = 0; r < n; r++) {
    const l2l_param *p = l2l_layer_param(rl->layer, r);
    const l2l_tensor *v = param_value(p);
    const char *pname = l2l_param_name(p);
    int nd = l2l_tensor_ndim(v);
    word(d, nd, NAMED_LAYER " (%s): record '%s': dims", at, name, pname);
    for (int i = 0; i < nd; i++)
      word(d, l2l_tensor_dim(v, i), NAMED_LAYER " (%s): record '%s': shape[%d]", at, name, pname, i);
  }
  d->layer = -1;
}

/* Everything the ranks must share for this step (see the top), into d. */
static void describe(struct description *d, const struct step *s) {
  const l2l_relay *run = s->run;
  const l2l_relay_config *c = &run->config;
  d->digest = 1469598103934665603ull;
  d->count = 0;
  word(d, run->steps, "steps done");
  word(d, run->updates, "updates done");
  word(d, s->training, "kind of step (1 training, 0 evaluation)");
  word(d, s->S, "sequence length");
  word(d, s->L, "number of active layers");
  for (int i = 0; i < options_count; i++) {   /* the options the ranks share */
    const l2l_option *o = &options_rows[i];
    if (!(o->flags & L2L_OPTION_AGREE)) continue;
    if (o->type == L2L_OPTION_FLOAT) d->next = AS_F32;
    if (o->type == L2L_OPTION_CHOICE && o->group == L2L_OPTION_RELAY && AS_CHOICE + i <= UCHAR_MAX)
      d->next = AS_CHOICE + i;   /* (kinds are bytes) */
    int64_t w = option_word(o, option_base(c, o->group));
    if (o->group == L2L_OPTION_RELAY) word(d, w, "%s", o->name);
    else if (o->type == L2L_OPTION_CHOICE && strcmp(o->field, "kind") == 0) word(d, w, "%s", o->name);
    else word(d, w, "%s: %s", o->group == L2L_OPTION_OPTIMIZER ? "optimizer" : "schedule", o->name);
  }
  word(d, f64w(d, run->scale), "the dynamic loss scale now");
  word(d, run->scale_good, "updates since the loss scale changed");
  for (int k = 0; k < s->L; k++) describe_layer(d, s, k);
}

int64_t relay_agreement_digest(const struct step *s) {
  struct description d = {.layer = -1};
  describe(&d, s);
  return (int64_t)(d.digest >> 1);
}

/* Every rank's description, word by word: counts first, then the words padded to the
   longest. Called by every rank once their digests differ. */
l2l_status relay_explain_disagreement(const struct step *s) {
  int size = dist_size_now(), rank = dist_rank_now();
  struct description d = {.layer = -1};
  describe(&d, s);   /* (the count) */
  d.room = d.count;
  d.words = calloc((size_t)d.room + 1, sizeof *d.words);
  d.labels = calloc((size_t)d.room + 1, sizeof *d.labels);
  d.kinds = calloc((size_t)d.room + 1, sizeof *d.kinds);
  d.layers = calloc((size_t)d.room + 1, sizeof *d.layers);
  int64_t *counts = calloc((size_t)size, sizeof *counts);
  if (counts == NULL) {   /* (a few bytes: the other ranks then wait out the timeout) */
    free(d.words), free(d.labels), free(d.kinds), free(d.layers);
    return FAIL(L2L_ERR_NOMEM, "no memory to compare the ranks");
  }
  l2l_status status = d.words && d.labels && d.kinds && d.layers ? L2L_OK : FAIL(L2L_ERR_NOMEM, "no memory to compare the ranks");
  /* every rank takes part in both exchanges whatever happens (a NOMEM rank sends 0) */
  int64_t mine = status == L2L_OK ? d.room : 0;
  if (status == L2L_OK) describe(&d, s);
  struct dist_op op = {.kind = DIST_ALLGATHER_I64, .send = &mine, .recv = counts, .n = 1,
                           .what = "exchange of the ranks' description lengths", .layer = -1,
                           .step = s->run->steps + 1};
  l2l_status sent = dist_run(&op);
  int64_t longest = 0;
  for (int r = 0; r < size; r++) longest = counts[r] > longest ? counts[r] : longest;
  int64_t *padded = calloc((size_t)longest + 1, sizeof *padded);
  int64_t *all = calloc((size_t)size * (size_t)(longest + 1), sizeof *all);
  if (sent == L2L_OK && padded && all) {
    if (status == L2L_OK) memcpy(padded, d.words, (size_t)d.room * sizeof *padded);
    op = (struct dist_op){.kind = DIST_ALLGATHER_I64, .send = padded, .recv = all,
                              .n = (int)longest, .what = "exchange of the ranks' descriptions",
                              .layer = -1, .step = s->run->steps + 1};
    sent = longest > 0 ? dist_run(&op) : L2L_OK;
  } else if (sent == L2L_OK) {
    sent = FAIL(L2L_ERR_NOMEM, "no memory to compare the ranks");
  }
  if (status == L2L_OK) status = sent;
  if (status == L2L_OK) {
    /* the first rank (rank 0 first) whose words differ from ours, and where */
    int other = -1;
    int64_t at = -1;
    for (int r = 0; r < size && other < 0; r++) {
      if (r == rank) continue;
      int64_t n = counts[r] < mine ? counts[r] : mine;
      for (int64_t i = 0; i < n && at < 0; i++)
        if (all[(size_t)r * (size_t)longest + (size_t)i] != d.words[i]) at = i;
      if (at < 0 && counts[r] != mine) at = n;   /* one description is a prefix of the other */
      if (at >= 0) other = r;
    }
    if (other < 0)
      status = FAIL(L2L_ERR_INVALID, "the ranks' steps differ (rank %d's description matches every "
                    "other's, but not its digest)", rank);
    else if (at < mine && at < counts[other]) {
      char here[40], there[40];
      show(here, sizeof here, d.words[at], d.kinds[at]);
      show(there, sizeof there, all[(size_t)other * (size_t)longest + (size_t)at], d.kinds[at]);
      status = FAIL(L2L_ERR_INVALID, "the ranks differ: on rank %d %s is %s, on rank %d %s (every "
                    "rank must build the same model and relay and make the same changes and "
                    "steps)", rank, d.labels[at], here, other, there);
    }
    else
      status = FAIL(L2L_ERR_INVALID, "the ranks differ: rank %d's description has %lld words, rank "
                    "%d's %lld (%s): every rank must build the same model and relay",
                    rank, (long long)mine, other, (long long)counts[other],
                    at < mine ? d.labels[at] : "the other has more layers or records");
    if (other >= 0 && at < mine && d.layers[at] >= 0) error_note_layer(status, d.layers[at]);
  }
  free(d.words), free(d.labels), free(d.kinds), free(d.layers), free(counts), free(padded), free(all);
  return status;
}
