/* SPDX-License-Identifier: MIT */
/* heads.c — the LM head and the classification head: features to per-token or
 * per-sample cross-entropy losses (or, without targets, to logits).
 *
 * Purpose: the last layer of a model. LM head: h = ln(x) (optional), logits = h wte^T
 * with the (V,D) projection possibly tied to the embedding's table, losses = CE(logits,
 * targets) with -1 ignored. Classifier: the first position's features f, logits = f W + b,
 * losses = CE per sample. Backward starts from d(loss)/d(each loss) = batch->loss_scale.
 * The LM head's forward, when a backward will follow, computes the losses and the logits'
 * gradient (softmax - one-hot) in one pass and keeps the gradient in place of the logits,
 * or in 16 bits with a 16-bit projection (which is all that reads it; the f32 logits are
 * then the forward's work). The LM head keeps h and that gradient; its LayerNorm is kept
 * the frugal way (output and rstd, h being needed anyway) when the layer's memory mode is
 * frugal and the weights allow it.
 * Accumulation: parameter gradients += (a tied table gets both users' shares), dx written.
 * Must never: write dx rows the head did not compute (the classifier zeroes the rest).
 */
#include <string.h>

#include "kind.h"

enum { LOGITS = 1, FRUGAL_LN = 2 };
enum { CLS_W = 0, CLS_B = 1 };

/* Losses from the logits; when a backward will follow, also the logits' gradient for a
   unit loss scale (softmax - one-hot) in place of the kept logits, or in 16 bits into
   dlogits16 (not NULL): one log-sum-exp per row serves both. The backward applies
   batch->loss_scale as its GEMMs' alpha (the scale may only be known after the forward:
   Lua's Sequential counts the real targets then). */
static l2l_status lm_head_losses(const struct layer_call *call, float *losses, float *logits,
                                 void *dlogits16, int64_t rows, int64_t vocab, int64_t ld) {
  const int32_t *targets = tensor_ptr(call->b->targets);
  if (call->keep)
    return call->ops->cross_entropy_fused(losses, dlogits16 ? NULL : logits, dlogits16,
                                          call->precision, logits, targets, -1, 1.0f, rows,
                                          vocab, ld);
  return call->ops->cross_entropy_forward(losses, logits, targets, -1, rows, vocab, ld);
}

/* The row stride of the LM head's own logits and their gradient (a caller's logits are
   packed): the vocabulary rounded up to 8 elements, so that every row starts 16-byte
   aligned in f32 and in 16 bits, as a GPU's GEMMs want it. (GPT-2's 50257 columns, packed,
   ran the head's three GEMMs at 0.13-0.19 of the bf16 GEMM rate on an H200: 16 ms of a
   124M step.) No op writes a row's padding, and none reads it but a cast no path takes:
   an f32 gradient for a 16-bit projection would be cast whole, padding too, but with a
   16-bit projection the gradient is kept 16-bit (LAYER_ACTS_16) and never cast. */
static int64_t lm_head_ld(int64_t vocab) { return (vocab + 7) / 8 * 8; }

/* ---------------------------------------------------------------- LM head */

static l2l_status lm_head_create(l2l_layer *layer) {
  const l2l_layer_config *c = &layer->config;
  int64_t d[1] = {c->dim}, proj[2] = {c->vocab, c->dim};
  if (c->final_ln) {
    TRY(layer_add_param(layer, HEAD_LN_W, "ln.weight", 1, d, '1', 0, 0));
    TRY(layer_add_param(layer, HEAD_LN_B, "ln.bias", 1, d, '0', 0, 0));
  }
  TRY(layer_add_param(layer, HEAD_PROJ, "proj.weight", 2, proj, 'n', c->init_std, 1));
  layer_mark_low_precision(layer, HEAD_PROJ);
  return L2L_OK;
}

static uint32_t lm_head_flags(const l2l_layer *layer, bool training, bool logits) {
  const l2l_layer_config *c = &layer->config;
  (void)training;
  uint32_t flags = logits ? LOGITS : 0;
  if (c->final_ln && c->memory == L2L_MEMORY_FRUGAL &&
      !layers_layernorm_guarded(layer, HEAD_LN_W, HEAD_LN_B))
    flags |= FRUGAL_LN;
  return flags;
}

struct lm_head_plan {
  struct arena saved, fwd, bwd;
  int64_t h, mean, rstd, logits, dlogits16, dh;   /* h (N,D): f32, or 16-bit when h16;
                                                     logits (N,V) f32 and dlogits16 (N,V),
                                                     rows lm_head_ld(V) apart */
  /* With a 16-bit projection (LAYER_ACTS_16): the final LayerNorm's output kept in its
     dtype (its standard backward reads x; only the projection reads h), and the logits'
     gradient, which only the projection's GEMMs read: kept 16-bit, the f32 logits a
     forward's work. */
  bool h16, dl16;
};

static void lm_head_plan(struct lm_head_plan *p, const l2l_layer *layer, int64_t N,
                         uint32_t flags) {
  const l2l_layer_config *c = &layer->config;
  const uint64_t nd = (uint64_t)(N * c->dim) * sizeof(float), rows = (uint64_t)N * sizeof(float);
  memset(p, 0, sizeof *p);
  p->h = p->mean = p->rstd = p->logits = p->dlogits16 = p->dh = NO_BUFFER;
  p->h16 = c->final_ln && (flags & LAYER_ACTS_16) && !(flags & FRUGAL_LN);
  p->dl16 = (flags & LAYER_ACTS_16) && !(flags & LOGITS);
  if (c->final_ln) {
    p->h = arena_reserve(&p->saved, p->h16 ? nd / 2 : nd);
    if (!(flags & FRUGAL_LN)) p->mean = arena_reserve(&p->saved, rows);
    p->rstd = arena_reserve(&p->saved, rows);
    p->dh = arena_reserve(&p->bwd, nd);
  }
  const uint64_t nv = (uint64_t)(N * lm_head_ld(c->vocab));
  if (p->dl16) {
    p->logits = arena_reserve(&p->fwd, nv * sizeof(float));
    p->dlogits16 = arena_reserve(&p->saved, nv * 2);
  } else if (!(flags & LOGITS)) {
    p->logits = arena_reserve(&p->saved, nv * sizeof(float));
  }
}

static void lm_head_memory(l2l_layer_memory *out, const l2l_layer *layer, int64_t B, int64_t S,
                           uint32_t flags) {
  struct lm_head_plan p;
  lm_head_plan(&p, layer, B * S, flags);
  out->saved = p.saved.bytes;
  out->work_forward = p.fwd.bytes;
  out->work_backward = p.bwd.bytes;
  /* x is read by the backward when it is h itself or ln's standard backward needs it */
  bool reads_x = !layer->config.final_ln || !(flags & FRUGAL_LN);
  out->input_kept = reads_x ? (uint64_t)(B * S * layer->config.dim) * sizeof(float) : 0;
}

static l2l_status lm_head_forward(const struct layer_call *call, l2l_layer *layer, float *y,
                                  const float *x, struct l2l_saved *saved, void *work) {
  const struct backend_ops *ops = call->ops;
  const l2l_layer_config *c = &layer->config;
  const int64_t N = call->batch * call->seq, D = c->dim, V = c->vocab, ld = lm_head_ld(V);
  struct lm_head_plan p;
  lm_head_plan(&p, layer, N, saved->flags);
  void *base = saved_base(saved);
  struct act h = act_f32(x);
  if (c->final_ln) {
    struct layers_out hn = layers_out_of(call, arena_at(base, p.h), p.h16);
    TRY(ops->layernorm_forward(hn.f32, hn.h16, call->precision, arena_at(base, p.mean),
                               arena_at(base, p.rstd), x, param_f32(layer, HEAD_LN_W),
                               param_f32(layer, HEAD_LN_B), c->eps, N, D));
    h = layers_act_of(call, hn);
  }
  if (saved->flags & LOGITS)   /* (N,V) the caller's, packed */
    return layers_gemm_weight(call, y, h, layers_weight(layer, HEAD_PROJ), 0, N, V, D, 0, 1,
                              1.0f, 0.0f, 0);
  float *logits = arena_at(p.dl16 ? work : base, p.logits);   /* (N,V), rows ld apart */
  TRY(layers_gemm_weight(call, logits, h, layers_weight(layer, HEAD_PROJ), 0, N, V, D, 0, 1,
                         1.0f, 0.0f, ld));
  return lm_head_losses(call, y, logits, arena_at(base, p.dlogits16), N, V, ld);
}

static l2l_status lm_head_backward(const struct layer_call *call, l2l_layer *layer, float *dx,
                                   const float *dy, struct l2l_saved *saved, void *work) {
  (void)dy;
  const struct backend_ops *ops = call->ops;
  const l2l_layer_config *c = &layer->config;
  const int64_t N = call->batch * call->seq, D = c->dim, V = c->vocab, ld = lm_head_ld(V);
  struct lm_head_plan p;
  lm_head_plan(&p, layer, N, saved->flags);
  void *base = saved_base(saved);
  const float *x = saved->input ? tensor_ptr(saved->input) : NULL;
  const float *h = c->final_ln ? arena_at(base, p.h) : x;   /* (16-bit when p.h16) */
  /* the forward's lm_head_losses left softmax - one-hot here (in 16 bits when dl16);
     scaled in the GEMMs */
  const float scale = call->b->loss_scale;
  struct act dlogits = p.dl16 ? layers_kept_act(call, arena_at(base, p.dlogits16), true)
                              : act_f32(arena_at(base, p.logits));
  /* with a 16-bit projection, dlogits and h are rounded to its dtype like any GEMM input
     (the cast scratch: h, after dlogits when that is cast too; dlogits' rows ld apart) */
  const struct weight proj = layers_weight(layer, HEAD_PROJ);
  const void *dl = NULL, *hr = NULL;
  TRY(layers_cast_activation(call, &dl, dlogits, N * ld, proj.dtype, 0));
  TRY(layers_cast_activation(call, &hr, layers_kept_act(call, h, p.h16), N * D, proj.dtype,
                             p.dl16 ? 0 : N * ld));
  TRY(ops->gemm_batched(layers_grad_f32(layer, HEAD_PROJ), dl, hr, proj.dtype, 1, V, D, N, 1, 0,
                        scale, 1.0f, ld, 0, 0));
  float *dh = c->final_ln ? arena_at(work, p.dh) : dx;
  TRY(ops->gemm_batched(dh, dl, proj.data, proj.dtype, 1, N, D, V, 0, 0, scale, 0.0f, ld, 0, 0));
  if (!c->final_ln) return L2L_OK;
  float *dw = layers_grad_f32(layer, HEAD_LN_W), *db = layers_grad_f32(layer, HEAD_LN_B);
  const float *w = param_f32(layer, HEAD_LN_W), *rstd = arena_at(base, p.rstd);
  if (saved->flags & FRUGAL_LN)
    return ops->layernorm_backward_from_output(dx, NULL, L2L_F32, dw, db, dh, NULL, h, w,
                                               param_f32(layer, HEAD_LN_B), rstd, N, D);
  return ops->layernorm_backward(dx, NULL, L2L_F32, dw, db, dh, NULL, x, w,
                                 arena_at(base, p.mean), rstd, N, D);
}

/* The backward's dlogits (N,V) unless the forward left them in 16 bits, and h (N,D). */
static int64_t lm_head_cast_elements(const l2l_layer *layer, int64_t B, int64_t S,
                                     uint32_t flags) {
  bool dl16 = (flags & LAYER_ACTS_16) && !(flags & LOGITS);
  return B * S * ((dl16 ? 0 : lm_head_ld(layer->config.vocab)) + layer->config.dim);
}

/* Targets, when given: (B,S) for an LM head (ndim 2), (B) for a classifier (ndim 1), each a
   class or -1; a backward needs them, and a finite loss scale. */
static l2l_status head_check_batch(const struct batch_check *bc, int ndim, int64_t classes) {
  const l2l_layer_batch *b = bc->b;
  if (b->targets != NULL) {
    TRY(batch_tensor(bc, "batch->targets", b->targets, L2L_I32, ndim));
  } else if (bc->backward) {
    return core_fail_in(bc->func, L2L_ERR_INVALID,
                        "batch->targets is NULL: a head's backward needs targets");
  }
  if (bc->backward && !isfinite(b->loss_scale))
    return core_fail_in(bc->func, L2L_ERR_INVALID, "batch->loss_scale must be finite, got %g",
                        b->loss_scale);
  return b->targets != NULL ? batch_ids(bc, "batch->targets", b->targets, classes, -1) : L2L_OK;
}

static l2l_status lm_head_check_config(const l2l_layer_config *c) {
  CONFIG_SIZE(vocab);
  CONFIG_FLAG(final_ln);
  if (c->final_ln) CONFIG_EPS();
  return L2L_OK;
}

static l2l_status lm_head_check_batch(const struct batch_check *bc) {
  return head_check_batch(bc, 2, bc->layer->config.vocab);
}

/* (B,S) losses with targets, else (B,S,V) logits. */
static int lm_head_output_dims(int64_t *dims, const l2l_layer *layer,
                               const l2l_layer_batch *batch, int64_t B, int64_t S) {
  dims[0] = B, dims[1] = S, dims[2] = layer->config.vocab;
  return batch->targets ? 2 : 3;
}

const struct layer_kind_ops layers_lm_head_kind = {
    .name = "LM head",
    .role = L2L_ROLE_HEAD,
    .check_config = lm_head_check_config,
    .check_batch = lm_head_check_batch,
    .output_dims = lm_head_output_dims,
    .create_params = lm_head_create,
    .choose_flags = lm_head_flags,
    .weights_clear = FRUGAL_LN,
    .cast_elements = lm_head_cast_elements,
    .memory = lm_head_memory,
    .forward = lm_head_forward,
    .backward = lm_head_backward,
};

/* ---------------------------------------------------------------- classifier */

static l2l_status classifier_create(l2l_layer *layer) {
  const l2l_layer_config *c = &layer->config;
  int64_t w[2] = {c->dim, c->classes}, b[1] = {c->classes};
  TRY(layer_add_param(layer, CLS_W, "weight", 2, w, 'n', c->init_std, 1));
  layer_mark_low_precision(layer, CLS_W);
  return layer_add_param(layer, CLS_B, "bias", 1, b, '0', 0, 0);
}

static uint32_t classifier_flags(const l2l_layer *layer, bool training, bool logits) {
  (void)layer, (void)training;
  return logits ? LOGITS : 0;
}

/* saved: first-position features f (B,D), then logits (B,C); backward work: df (B,D). */
static void classifier_memory(l2l_layer_memory *out, const l2l_layer *layer, int64_t B,
                              int64_t S, uint32_t flags) {
  (void)S;
  const l2l_layer_config *c = &layer->config;
  struct arena saved = {0}, bwd = {0};
  arena_reserve(&saved, (uint64_t)(B * c->dim) * sizeof(float));
  if (!(flags & LOGITS)) arena_reserve(&saved, (uint64_t)(B * c->classes) * sizeof(float));
  arena_reserve(&bwd, (uint64_t)(B * c->dim) * sizeof(float));
  out->saved = saved.bytes;
  out->work_backward = bwd.bytes;
}

static float *classifier_logits(void *base, const l2l_layer *layer, int64_t B) {
  struct arena a = {0};
  arena_reserve(&a, (uint64_t)(B * layer->config.dim) * sizeof(float));
  return (float *)((char *)base + a.bytes);
}

static l2l_status classifier_forward(const struct layer_call *call, l2l_layer *layer, float *y,
                                     const float *x, struct l2l_saved *saved, void *work) {
  (void)work;
  const struct backend_ops *ops = call->ops;
  const int64_t B = call->batch, S = call->seq, D = layer->config.dim, C = layer->config.classes;
  float *f = saved_base(saved);
  for (int64_t b = 0; b < B; b++)
    TRY(ops->copy(f + b * D, call->pool, x + b * S * D, call->pool, (uint64_t)D * sizeof(float)));
  float *logits = saved->flags & LOGITS ? y : classifier_logits(f, layer, B);
  TRY(layers_linear_forward(call, logits, NULL, act_f32(f), layers_weight(layer, CLS_W), param_f32(layer, CLS_B),
                            B, D, C));
  if (saved->flags & LOGITS) return L2L_OK;
  return ops->cross_entropy_forward(y, logits, tensor_ptr(call->b->targets), -1, B, C, C);
}

static l2l_status classifier_backward(const struct layer_call *call, l2l_layer *layer,
                                      float *dx, const float *dy, struct l2l_saved *saved,
                                      void *work) {
  (void)dy;
  const struct backend_ops *ops = call->ops;
  const int64_t B = call->batch, S = call->seq, D = layer->config.dim, C = layer->config.classes;
  float *f = saved_base(saved), *dlogits = classifier_logits(f, layer, B), *df = work;
  TRY(ops->cross_entropy_backward(dlogits, dlogits, tensor_ptr(call->b->targets), -1,
                                  call->b->loss_scale, B, C, C));
  TRY(layers_linear_backward(call, df, NULL, layers_grad_f32(layer, CLS_W), layers_grad_f32(layer, CLS_B),
                             dlogits, NULL, act_f32(f), layers_weight(layer, CLS_W), B, D, C,
                             0.0f));
  TRY(ops->fill(dx, L2L_F32, 0.0, B * S * D));
  for (int64_t b = 0; b < B; b++)
    TRY(ops->copy(dx + b * S * D, call->pool, df + b * D, call->pool, (uint64_t)D * sizeof(float)));
  return L2L_OK;
}

static int64_t classifier_cast_elements(const l2l_layer *layer, int64_t B, int64_t S,
                                        uint32_t flags) {
  (void)S, (void)flags;
  return B * (layer->config.dim + layer->config.classes);
}

static l2l_status classifier_check_config(const l2l_layer_config *c) {
  CONFIG_SIZE(classes);
  return L2L_OK;
}

static l2l_status classifier_check_batch(const struct batch_check *bc) {
  return head_check_batch(bc, 1, bc->layer->config.classes);
}

/* (B) losses with targets, else (B, classes) logits. */
static int classifier_output_dims(int64_t *dims, const l2l_layer *layer,
                                  const l2l_layer_batch *batch, int64_t B, int64_t S) {
  (void)S;
  dims[0] = B, dims[1] = layer->config.classes;
  return batch->targets ? 1 : 2;
}

const struct layer_kind_ops layers_classifier_kind = {
    .name = "classifier",
    .role = L2L_ROLE_HEAD,
    .check_config = classifier_check_config,
    .check_batch = classifier_check_batch,
    .output_dims = classifier_output_dims,
    .create_params = classifier_create,
    .choose_flags = classifier_flags,
    .cast_elements = classifier_cast_elements,
    .memory = classifier_memory,
    .forward = classifier_forward,
    .backward = classifier_backward,
};
