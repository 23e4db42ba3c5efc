/* SPDX-License-Identifier: MIT */
/* plain.c — the plain executor: whole-batch training of a model with the layers alone, the
 * reference the relay (and, to come, data parallel training across processes) is checked
 * against; and the models and minibatches the relay's tests build (see reference.h).
 *
 * Purpose: run clones of the relay's layers (same values, same rng ids, ties re-made) in
 * the host pool with l2l_layer_forward / l2l_layer_backward, the whole minibatch in one
 * call per layer with every saved state kept (or split into micro-batches as the relay
 * splits, whose arithmetic is then a correct relay's to the bit), fold each layer's
 * gradient into per-record accumulators, and update them; the schedule and the clipping
 * norms are computed here from the header's formulas. Folding and updating call the f32
 * kernels the EPS runs (optim_axpy, optim_sgd / _adamw / _lamb_*, the gradient
 * scale passed in as the EPS passes it): test_optim.c checks those against float64, and
 * the same arithmetic here makes a relay that moves, splits and schedules right agree
 * with this executor exactly. Each layer call gets the batch
 * fields the relay promises (seed, step = the step's index, first_sample, the key mask's
 * rows, loss_scale = 1 / (real targets x accumulate)), so both see the same dropout masks.
 * Must never: take an expected value from the relay or the EPS.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eps/eps.h"
#include "reference.h"

static l2l_tensor *zeros_like(const l2l_tensor *t) {
  l2l_tensor *z = like_in(t, L2L_POOL_HOST);
  memset(l2l_tensor_data(z), 0, tensor_bytes(z));
  return z;
}

l2l_tensor *view_rows(const l2l_tensor *t, int64_t first, int64_t count) {
  if (t == NULL) return NULL;
  l2l_tensor *v = NULL;
  if (l2l_tensor_view_rows(&v, t, first, count) != L2L_OK) {
    fprintf(stderr, "plain executor: cannot view rows: %s\n", l2l_last_error());
    exit(2);
  }
  return v;
}

double sumsq_f32(const float *v, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)v[i] * v[i];
  return s;
}

/* ---------------------------------------------------------------- models */

struct shape gpt_shape(void) {
  struct shape g = {.D = 24, .H = 3, .F = 40, .V = 37, .S = 11, .blocks = 3, .post_ln = 0,
                    .causal = 1, .type_vocab = 0, .head = L2L_LAYER_LM_HEAD, .classes = 0,
                    .tie = 1, .dropout = 0.1f, .attn_dropout = 0.15f, .frugal_block = 1};
  return g;
}

struct shape bert_shape(void) {
  struct shape g = {.D = 20, .H = 4, .F = 36, .V = 29, .S = 9, .blocks = 2, .post_ln = 1,
                    .causal = 0, .type_vocab = 2, .head = L2L_LAYER_LM_HEAD, .classes = 0,
                    .tie = 1, .dropout = 0.1f, .attn_dropout = 0.1f, .frugal_block = -1};
  return g;
}

l2l_layer_config model_layer_config(const struct shape *g, l2l_layer_kind kind) {
  l2l_layer_config c = default_layer_config(kind);
  c.dim = g->D;
  c.heads = g->H;
  c.mlp = g->F;
  c.vocab = g->V;
  c.max_seq = g->S;
  c.type_vocab = g->type_vocab;
  c.classes = g->classes;
  c.causal = g->causal;
  c.post_ln = g->post_ln;
  c.final_ln = g->post_ln ? 0 : 1;
  c.dropout = g->dropout;
  c.attn_dropout = g->attn_dropout;
  return c;
}

static l2l_layer *model_layer_new(const l2l_layer_config *c) {
  l2l_layer *layer = NULL;
  if (l2l_layer_new(&layer, c, L2L_POOL_HOST) != L2L_OK) {
    fprintf(stderr, "plain executor: cannot make a layer: %s\n", l2l_last_error());
    exit(2);
  }
  return layer;
}

/* Random values in place of the initial ones, so that every parameter matters from the
   first step (a bias of 0 or a LayerNorm weight of 1 would hide a relay that loses it):
   LayerNorm weights 1 + N(0, 0.01), biases N(0, 0.01), tables N(0, 0.25), linear weights
   N(0, 1/fan_in). */
static void model_randomize(l2l_layer *layer) { randomize_params_with(layer, 0.1, 0.5); }

l2l_layer *model_block_new(const struct shape *g, int frugal) {
  l2l_layer_config c = model_layer_config(g, L2L_LAYER_BLOCK);
  c.memory = frugal ? L2L_MEMORY_FRUGAL : L2L_MEMORY_STANDARD;
  l2l_layer *b = model_layer_new(&c);
  model_randomize(b);
  return b;
}

/* Embedding, g->blocks blocks, head (tied to the embedding when g->tie and an LM head). */
void model_new(struct model *m, const struct shape *g) {
  memset(m, 0, sizeof *m);
  l2l_layer_config c = model_layer_config(g, L2L_LAYER_EMBEDDING);
  m->layer[m->n++] = model_layer_new(&c);
  for (int b = 0; b < g->blocks; b++) m->layer[m->n++] = model_block_new(g, b == g->frugal_block);
  c = model_layer_config(g, g->head);
  l2l_layer *head = model_layer_new(&c);
  m->layer[m->n++] = head;
  for (int i = 0; i < m->n; i++) model_randomize(m->layer[i]);
  if (g->tie && g->head == L2L_LAYER_LM_HEAD) CHECK_OK(l2l_layer_tie(head, m->layer[0]));
}

void model_free(struct model *m) {
  for (int i = 0; i < m->n; i++) l2l_layer_free(m->layer[i]);
  memset(m, 0, sizeof *m);
}

/* Index in m of the layer that owns `param` as its embedding table, or -1. */
static int embedding_with(const struct model *m, const l2l_param *param) {
  for (int i = 0; i < m->n; i++) {
    l2l_layer_config c;
    if (l2l_layer_get_config(&c, m->layer[i]) != L2L_OK || c.kind != L2L_LAYER_EMBEDDING) continue;
    for (int j = 0; j < l2l_layer_param_count(m->layer[i]); j++)
      if (l2l_layer_param(m->layer[i], j) == param) return i;
  }
  return -1;
}

/* A clone with the same rng ids (so the same dropout masks) and the same ties. */
l2l_layer *clone_same_rng(const l2l_layer *layer) {
  l2l_layer *c = NULL;
  if (l2l_layer_clone(&c, layer) != L2L_OK) {
    fprintf(stderr, "plain executor: cannot clone a layer: %s\n", l2l_last_error());
    exit(2);
  }
  CHECK_OK(l2l_layer_set_rng_id(c, l2l_layer_rng_id(layer)));
  return c;
}

void model_clone(struct model *dst, const struct model *src) {
  memset(dst, 0, sizeof *dst);
  for (int i = 0; i < src->n; i++) {
    dst->layer[i] = clone_same_rng(src->layer[i]);
    dst->frozen[i] = src->frozen[i];
  }
  dst->n = src->n;
  for (int i = 0; i < src->n; i++) {
    l2l_layer_config c;
    CHECK_OK(l2l_layer_get_config(&c, src->layer[i]));
    if (c.kind != L2L_LAYER_LM_HEAD) continue;
    for (int j = 0; j < l2l_layer_param_count(src->layer[i]); j++) {
      int e = embedding_with(src, l2l_layer_param(src->layer[i], j));
      if (e >= 0) CHECK_OK(l2l_layer_tie(dst->layer[i], dst->layer[e]));
    }
  }
}

/* ---------------------------------------------------------------- minibatches */

/* B samples of S tokens. pad: sample b keeps a random length in [S/2, S] (sample 1 at
   most S - 3, sample 0 whole) with key_mask 0 and targets -1 beyond it. mask_frac < 1:
   each real position has a target with that probability (masked LM), else -1. The
   classifier gets one target per sample (one of them -1 when B > 2). */
void data_new(struct data *d, const struct shape *g, int64_t B, int64_t S, int pad,
              double mask_frac) {
  memset(d, 0, sizeof *d);
  d->B = B, d->S = S;
  d->tokens = NEW(L2L_POOL_HOST, L2L_I32, B, S);
  int32_t *tok = l2l_tensor_data(d->tokens);
  for (int64_t i = 0; i < B * S; i++) tok[i] = (int32_t)check_rand_int(0, g->V - 1);
  int64_t *len = xmalloc((size_t)B * sizeof *len);
  for (int64_t b = 0; b < B; b++) {
    len[b] = pad ? check_rand_int(S / 2, S) : S;
    if (pad && b == 0) len[b] = S;
    if (pad && b == 1) len[b] = check_rand_int(S / 2, S - 3);
  }
  if (pad) {
    d->key_mask = NEW(L2L_POOL_HOST, L2L_U8, B, S);
    uint8_t *km = l2l_tensor_data(d->key_mask);
    for (int64_t b = 0; b < B; b++)
      for (int64_t s = 0; s < S; s++) km[b * S + s] = s < len[b];
  }
  if (g->type_vocab > 0) {
    d->types = NEW(L2L_POOL_HOST, L2L_I32, B, S);
    int32_t *ty = l2l_tensor_data(d->types);
    for (int64_t b = 0; b < B; b++)
      for (int64_t s = 0; s < S; s++) ty[b * S + s] = s >= len[b] / 2;
  }
  if (g->head == L2L_LAYER_CLASSIFIER) {
    d->targets = NEW(L2L_POOL_HOST, L2L_I32, B);
    int32_t *t = l2l_tensor_data(d->targets);
    for (int64_t b = 0; b < B; b++) t[b] = (int32_t)check_rand_int(0, g->classes - 1);
    if (B > 2) t[B - 2] = -1;
    for (int64_t b = 0; b < B; b++) d->real += t[b] != -1;
  } else {
    d->targets = NEW(L2L_POOL_HOST, L2L_I32, B, S);
    int32_t *t = l2l_tensor_data(d->targets);
    for (int64_t b = 0; b < B; b++)
      for (int64_t s = 0; s < S; s++) {
        bool real = s < len[b] && check_rand_uniform(0, 1) < mask_frac;
        t[b * S + s] = real ? (int32_t)check_rand_int(0, g->V - 1) : -1;
      }
    t[0] = (int32_t)check_rand_int(0, g->V - 1); /* at least one real target */
    for (int64_t i = 0; i < B * S; i++) d->real += t[i] != -1;
  }
  free(len);
}

void data_free(struct data *d) {
  l2l_tensor_free(d->tokens);
  l2l_tensor_free(d->targets);
  l2l_tensor_free(d->types);
  l2l_tensor_free(d->key_mask);
  memset(d, 0, sizeof *d);
}

/* ---------------------------------------------------------------- schedules */

/* factor(t) of l2l.h's schedules, written from the header. */
static double schedule_factor(const l2l_schedule_config *s, int64_t t) {
  if (s->warmup > 0 && t <= s->warmup) return (double)t / (double)s->warmup;
  if (s->kind == L2L_SCHEDULE_CONSTANT) return 1.0;
  if (t >= s->total) return s->final_ratio;
  double x = (double)(t - s->warmup) / (double)(s->total - s->warmup);
  double f = s->final_ratio;
  if (s->kind == L2L_SCHEDULE_COSINE) return f + (1.0 - f) * 0.5 * (1.0 + cos(M_PI * x));
  return 1.0 - (1.0 - f) * x;
}

/* ---------------------------------------------------------------- the plain executor */

struct prec *plain_rec(struct plain *p, l2l_param *param) {
  for (int i = 0; i < p->nrec; i++)
    if (p->rec[i].param == param) return &p->rec[i];
  if (p->nrec == PLAIN_MAX_RECORDS) {
    fprintf(stderr, "plain executor: more than %d records\n", PLAIN_MAX_RECORDS);
    exit(2);
  }
  struct prec *r = &p->rec[p->nrec++];
  memset(r, 0, sizeof *r);
  r->param = param;
  r->acc = zeros_like(l2l_param_value(param));
  r->m = zeros_like(l2l_param_value(param));
  r->v = zeros_like(l2l_param_value(param));
  return r;
}

void plain_init(struct plain *p, const struct model *src, const l2l_relay_config *cfg) {
  memset(p, 0, sizeof *p);
  model_clone(&p->model, src);
  p->cfg = *cfg;
  p->grad_norm = -1.0;
}

/* Drops the records of layer `index` that no other layer of the model uses. */
static void plain_forget(struct plain *p, int index) {
  l2l_layer *layer = p->model.layer[index];
  for (int j = 0; j < l2l_layer_param_count(layer); j++) {
    l2l_param *param = l2l_layer_param(layer, j);
    bool shared = false;
    for (int i = 0; i < p->model.n; i++)
      for (int k = 0; i != index && k < l2l_layer_param_count(p->model.layer[i]); k++)
        shared = shared || l2l_layer_param(p->model.layer[i], k) == param;
    for (int r = 0; !shared && r < p->nrec; r++)
      if (p->rec[r].param == param) {
        l2l_tensor_free(p->rec[r].acc);
        l2l_tensor_free(p->rec[r].m);
        l2l_tensor_free(p->rec[r].v);
        p->rec[r] = p->rec[--p->nrec];
        break;
      }
  }
}

void plain_free(struct plain *p) {
  for (int r = 0; r < p->nrec; r++) {
    l2l_tensor_free(p->rec[r].acc);
    l2l_tensor_free(p->rec[r].m);
    l2l_tensor_free(p->rec[r].v);
  }
  model_free(&p->model);
  memset(p, 0, sizeof *p);
}

void model_insert(struct model *m, int index, l2l_layer *layer) {
  memmove(&m->layer[index + 1], &m->layer[index], (size_t)(m->n - index) * sizeof m->layer[0]);
  memmove(&m->frozen[index + 1], &m->frozen[index], (size_t)(m->n - index));
  m->layer[index] = layer;
  m->frozen[index] = 0;
  m->n++;
}

/* Takes layer `index` out of m and returns it. */
l2l_layer *model_take(struct model *m, int index) {
  l2l_layer *layer = m->layer[index];
  memmove(&m->layer[index], &m->layer[index + 1], (size_t)(m->n - index - 1) * sizeof m->layer[0]);
  memmove(&m->frozen[index], &m->frozen[index + 1], (size_t)(m->n - index - 1));
  m->n--;
  return layer;
}

void plain_remove(struct plain *p, int index) {
  plain_forget(p, index);
  l2l_layer_free(model_take(&p->model, index));
}

/* Folds layer l's gradient (what its backward just added) into the records'
   accumulators: clipped to clip_layer_norm over the layer's records when that is set;
   dropped when the layer is frozen. The layer's gradients are zero afterwards. */
static void plain_fold(struct plain *p, int l) {
  l2l_layer *layer = p->model.layer[l];
  int np = l2l_layer_param_count(layer);
  if (!p->model.frozen[l]) {
    float scale = 1.0f;   /* as f32, as the relay hands it to the accumulation */
    if (p->cfg.clip_layer_norm > 0) {
      double sq = 0.0;
      for (int j = 0; j < np; j++) {
        l2l_tensor *g = l2l_param_grad(l2l_layer_param(layer, j));
        sq += optim_sumsq(check_data(g), numel(g));
      }
      double norm = sqrt(sq);
      if (norm > p->cfg.clip_layer_norm) scale = (float)(p->cfg.clip_layer_norm / norm);
    }
    for (int j = 0; j < np; j++) {
      l2l_param *param = l2l_layer_param(layer, j);
      struct prec *r = plain_rec(p, param);
      optim_axpy(check_data(r->acc), check_data(l2l_param_grad(param)), scale,
                 numel(r->acc));
      r->touched = 1;
    }
  }
  CHECK_OK(l2l_layer_zero_grad(layer));
}

/* One minibatch: forward of every layer over micro-batches of `micro` samples (0: the
   whole batch in one call), every saved state kept; the loss; backward in reverse, each
   layer's gradient folded when its backward is done. Layers with skip[l] = 1 are the
   identity. Returns the mean loss over real targets. */
double plain_pass(struct plain *p, const struct data *d, int64_t micro,
                  const uint8_t *skip) {
  struct model *m = &p->model;
  int L = m->n;
  int64_t B = d->B, S = d->S;
  if (micro <= 0 || micro > B) micro = B;
  int U = (int)((B + micro - 1) / micro);
  l2l_layer_batch *lb = xmalloc((size_t)U * sizeof *lb);
  for (int u = 0; u < U; u++) {
    int64_t first = u * micro, n = first + micro <= B ? micro : B - first;
    lb[u] = (l2l_layer_batch){.tokens = view_rows(d->tokens, first, n),
                              .token_types = view_rows(d->types, first, n),
                              .targets = view_rows(d->targets, first, n),
                              .key_mask = view_rows(d->key_mask, first, n),
                              .first_sample = first,
                              .seed = p->cfg.seed,
                              .step = (uint64_t)p->steps,
                              .training = 1,
                              .loss_scale = (float)(1.0 / ((double)d->real * p->cfg.accumulate))};
  }
  l2l_tensor *act[MAX_LAYERS + 1] = {NULL};   /* act[l]: input of layer l (B,S,D) */
  bool owned[MAX_LAYERS + 1] = {false};
  l2l_saved **saved = xmalloc((size_t)(L * U) * sizeof *saved);
  double loss = NAN;
  for (int l = 0; l < L; l++) {
    if (skip && skip[l]) {
      act[l + 1] = act[l];
      continue;
    }
    l2l_layer_config c;
    CHECK_OK(l2l_layer_get_config(&c, m->layer[l]));
    l2l_tensor *out = c.kind == L2L_LAYER_LM_HEAD     ? NEW(L2L_POOL_HOST, L2L_F32, B, S)
                      : c.kind == L2L_LAYER_CLASSIFIER ? NEW(L2L_POOL_HOST, L2L_F32, B)
                                                       : NEW(L2L_POOL_HOST, L2L_F32, B, S, c.dim);
    for (int u = 0; u < U; u++) {
      int64_t first = u * micro, n = first + micro <= B ? micro : B - first;
      l2l_tensor *x = view_rows(act[l], first, n), *y = view_rows(out, first, n);
      CHECK_OK(l2l_layer_forward(&saved[l * U + u], m->layer[l], y, x, &lb[u]));
      l2l_tensor_free(x);
      l2l_tensor_free(y);
    }
    act[l + 1] = out;
    owned[l + 1] = true;
    if (l == L - 1) {
      double sum = 0.0;
      CHECK_OK(l2l_sum(&sum, out));
      loss = sum / (double)d->real;
    }
  }
  l2l_tensor *dy = NULL; /* d(loss)/d(act[l + 1]); NULL above the head */
  for (int l = L - 1; l >= 0; l--) {
    if (skip && skip[l]) continue;
    CHECK_OK(l2l_layer_zero_grad(m->layer[l]));
    l2l_tensor *dx = l > 0 ? like_in(act[l], L2L_POOL_HOST) : NULL;
    for (int u = 0; u < U; u++) {
      int64_t first = u * micro, n = first + micro <= B ? micro : B - first;
      l2l_tensor *dxu = view_rows(dx, first, n), *dyu = view_rows(dy, first, n);
      CHECK_OK(l2l_layer_backward(m->layer[l], dxu, dyu, saved[l * U + u], &lb[u]));
      l2l_tensor_free(dxu);
      l2l_tensor_free(dyu);
      l2l_saved_free(saved[l * U + u]);
    }
    plain_fold(p, l);
    l2l_tensor_free(dy);
    dy = dx;
  }
  l2l_tensor_free(dy);
  for (int l = 0; l <= L; l++)
    if (owned[l]) l2l_tensor_free(act[l]);
  for (int u = 0; u < U; u++) {
    l2l_tensor_free((l2l_tensor *)lb[u].tokens);
    l2l_tensor_free((l2l_tensor *)lb[u].token_types);
    l2l_tensor_free((l2l_tensor *)lb[u].targets);
    l2l_tensor_free((l2l_tensor *)lb[u].key_mask);
  }
  free(lb);
  free(saved);
  return loss;
}

/* The update of every record a layer folded a gradient into: global clipping over
   those records, then the optimizer at the schedule's rate for this update count. */
static void plain_update(struct plain *p) {
  const l2l_optimizer_config *o = &p->cfg.optimizer;
  p->updates++;
  p->lr = o->lr * schedule_factor(&p->cfg.schedule, p->updates);
  double sq = 0.0;
  for (int i = 0; i < p->nrec; i++)
    if (p->rec[i].touched) sq += optim_sumsq(check_data(p->rec[i].acc), numel(p->rec[i].acc));
  p->grad_norm = sqrt(sq);
  float scale = 1.0f;   /* the kernels scale the gradient by it, in f32 */
  if (p->cfg.clip_global_norm > 0 && p->grad_norm > p->cfg.clip_global_norm)
    scale = (float)(p->cfg.clip_global_norm / p->grad_norm);
  for (int i = 0; i < p->nrec; i++) {
    struct prec *r = &p->rec[i];
    if (!r->touched) continue;
    r->t++;
    float *acc = check_data(r->acc), *w = check_data(l2l_param_value(r->param));
    float *m = check_data(r->m), *v = check_data(r->v);
    int64_t n = numel(r->acc);
    bool decays = o->decay_all || l2l_param_decays(r->param) == 1;
    struct optim_hyper h = {.kind = o->kind, .lr = (float)p->lr,
                                .weight_decay = decays ? o->weight_decay : 0.0f,
                                .momentum = o->momentum, .nesterov = o->nesterov,
                                .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .t = r->t,
                                .grad_scale = scale};
    if (o->kind == L2L_OPTIMIZER_ADAMW) {
      optim_adamw(w, m, v, acc, n, &h);
    } else if (o->kind == L2L_OPTIMIZER_SGD) {
      optim_sgd(w, o->momentum > 0 ? m : NULL, acc, n, &h);
    } else {
      double norms[2] = {0, 0};
      optim_lamb_moments(m, v, w, acc, n, &h, norms);
      optim_lamb_apply(w, m, v, n, &h, optim_lamb_trust(norms));
    }
    memset(acc, 0, tensor_bytes(r->acc));
    r->touched = 0;
  }
}

/* One step of the plain executor: the pass, then the update on the last of `accumulate`
   minibatches. */
double plain_step(struct plain *p, const struct data *d, int64_t micro,
                  const uint8_t *skip) {
  double loss = plain_pass(p, d, micro, skip);
  p->steps++;
  if (p->steps % p->cfg.accumulate == 0) plain_update(p);
  return loss;
}

/* Mean loss of the forward alone, no dropout. */
double plain_evaluate(struct plain *p, const struct data *d) {
  struct model *m = &p->model;
  l2l_layer_batch lb = {.tokens = d->tokens, .token_types = d->types, .targets = d->targets,
                        .key_mask = d->key_mask, .seed = p->cfg.seed, .training = 0};
  l2l_tensor *x = NULL;
  double loss = NAN;
  for (int l = 0; l < m->n; l++) {
    l2l_layer_config c;
    CHECK_OK(l2l_layer_get_config(&c, m->layer[l]));
    l2l_tensor *y = c.kind == L2L_LAYER_LM_HEAD     ? NEW(L2L_POOL_HOST, L2L_F32, d->B, d->S)
                    : c.kind == L2L_LAYER_CLASSIFIER ? NEW(L2L_POOL_HOST, L2L_F32, d->B)
                                                     : NEW(L2L_POOL_HOST, L2L_F32, d->B, d->S, c.dim);
    CHECK_OK(l2l_layer_forward(NULL, m->layer[l], y, x, &lb));
    l2l_tensor_free(x);
    x = y;
  }
  double sum = 0.0;
  CHECK_OK(l2l_sum(&sum, x));
  loss = sum / (double)d->real;
  l2l_tensor_free(x);
  return loss;
}
