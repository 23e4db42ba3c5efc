/* SPDX-License-Identifier: MIT */
/* embedding.c — token + learned position (+ token type) embeddings, then dropout.
 *
 * Purpose: the first layer of a GPT (tokens, positions) or BERT (plus token types):
 * y[b,s] = wte[tokens[b,s]] + wpe[s] (+ wtt[types[b,s]]), then inverted dropout (site 0).
 * It keeps nothing for backward: the ids come with the batch and the dropout mask is
 * regenerated from the counter-based generator.
 * Accumulation: parameter gradients += (repeated ids sum); there is no dx.
 * Must never: read ids that its batch check has not range-checked.
 */
#include "kind.h"

enum { DROPOUT = 1 };

static l2l_status embedding_create(l2l_layer *layer) {
  const l2l_layer_config *c = &layer->config;
  int64_t wte[2] = {c->vocab, c->dim}, wpe[2] = {c->max_seq, c->dim},
          wtt[2] = {c->type_vocab, c->dim};
  TRY(layer_add_param(layer, EMBED_WTE, "wte", 2, wte, 'n', c->init_std, 0));
  layer_mark_low_precision(layer, EMBED_WTE);   /* the tied LM head's GEMM weight too */
  TRY(layer_add_param(layer, EMBED_WPE, "wpe", 2, wpe, 'n', c->init_std, 0));
  if (c->type_vocab > 0)
    TRY(layer_add_param(layer, EMBED_WTT, "wtt", 2, wtt, 'n', c->init_std, 0));
  return L2L_OK;
}

static uint32_t embedding_flags(const l2l_layer *layer, bool training, bool logits) {
  (void)logits;
  return training && layer->config.dropout > 0 ? DROPOUT : 0;
}

static void embedding_memory(l2l_layer_memory *out, const l2l_layer *layer, int64_t B,
                             int64_t S, uint32_t flags) {
  struct arena fwd = {0}, bwd = {0};
  uint64_t nd = (uint64_t)(B * S * layer->config.dim) * sizeof(float);
  if (layer->config.type_vocab > 0) arena_reserve(&fwd, nd); /* type embeddings */
  if (flags & DROPOUT) arena_reserve(&bwd, nd);                /* d(before dropout) */
  out->work_forward = fwd.bytes;
  out->work_backward = bwd.bytes;
}

static uint64_t dropout_first(const struct layer_call *call, int64_t dim) {
  return (uint64_t)call->b->first_sample * (uint64_t)(call->seq * dim);
}

static l2l_status embedding_forward(const struct layer_call *call, l2l_layer *layer, float *y,
                                    const float *x, struct l2l_saved *saved, void *work) {
  (void)x;
  const struct backend_ops *ops = call->ops;
  const l2l_layer_config *c = &layer->config;
  const l2l_layer_batch *b = call->b;
  const int64_t B = call->batch, S = call->seq, D = c->dim, N = B * S;
  const struct weight wte = layers_weight(layer, EMBED_WTE);
  TRY(ops->embedding_forward(y, tensor_ptr(b->tokens), wte.data, wte.dtype, N, D));
  /* positions: y viewed as (B, S*D) plus wpe's first S rows as one (S*D) bias row */
  TRY(ops->bias_add(y, NULL, L2L_F32, param_f32(layer, EMBED_WPE), B, S * D));
  if (c->type_vocab > 0) {
    float *types = work; /* (N,D) */
    TRY(ops->embedding_forward(types, tensor_ptr(b->token_types),
                               param_f32(layer, EMBED_WTT), L2L_F32, N, D));
    TRY(ops->add(y, y, types, N * D));
  }
  if (saved->flags & DROPOUT)
    TRY(ops->dropout_forward(y, NULL, y, c->dropout, b->seed, layers_dropout_stream(layer, b, 0),
                             (int64_t)dropout_first(call, D), N * D));
  return L2L_OK;
}

static l2l_status embedding_backward(const struct layer_call *call, l2l_layer *layer, float *dx,
                                     const float *dy, struct l2l_saved *saved, void *work) {
  (void)dx;
  const struct backend_ops *ops = call->ops;
  const l2l_layer_config *c = &layer->config;
  const l2l_layer_batch *b = call->b;
  const int64_t B = call->batch, S = call->seq, D = c->dim, N = B * S;
  const float *d = dy;
  if (saved->flags & DROPOUT) { /* the same draws again give d(before dropout) */
    float *undropped = work;
    TRY(ops->dropout_forward(undropped, NULL, dy, c->dropout, b->seed,
                             layers_dropout_stream(layer, b, 0), (int64_t)dropout_first(call, D), N * D));
    d = undropped;
  }
  TRY(ops->embedding_backward(layers_grad_f32(layer, EMBED_WTE), d, tensor_ptr(b->tokens), N,
                              c->vocab, D));
  TRY(ops->bias_backward(layers_grad_f32(layer, EMBED_WPE), d, L2L_F32, B, S * D));
  if (c->type_vocab > 0)
    TRY(ops->embedding_backward(layers_grad_f32(layer, EMBED_WTT), d,
                                tensor_ptr(b->token_types), N, c->type_vocab, D));
  return L2L_OK;
}

static l2l_status embedding_check_config(const l2l_layer_config *c) {
  CONFIG_SIZE(vocab);
  CONFIG_SIZE(max_seq);
  CONFIG_NEED(c->type_vocab >= 0 && c->type_vocab <= (INT64_C(1) << 24),
              "type_vocab must be 0 to 2^24, got %lld", (long long)c->type_vocab);
  return L2L_OK;
}

/* Tokens (and token types when the layer has a type table), their ids in range, and no
   more positions than the position table. */
static l2l_status embedding_check_batch(const struct batch_check *bc) {
  const l2l_layer_config *c = &bc->layer->config;
  const l2l_layer_batch *b = bc->b;
  TRY(batch_tensor(bc, "batch->tokens", b->tokens, L2L_I32, 2));
  if (bc->seq > c->max_seq)
    return batch_refused(core_fail_in(bc->func, L2L_ERR_INVALID,
                                      L2L_NAMED_FIELD "batch->tokens" L2L_NAMED_END
                                      ": sequence length %lld exceeds max_seq %lld",
                                      (long long)bc->seq, (long long)c->max_seq), "batch->tokens");
  if (c->type_vocab > 0)
    TRY(batch_tensor(bc, "batch->token_types", b->token_types, L2L_I32, 2));
  else if (b->token_types != NULL)
    return batch_refused(core_fail_in(bc->func, L2L_ERR_INVALID,
                                      L2L_NAMED_FIELD "batch->token_types" L2L_NAMED_END
                                      " given but the embedding has type_vocab 0"), "batch->token_types");
  /* Ids out of range are refused before anything runs. */
  TRY(batch_ids(bc, "batch->tokens", b->tokens, c->vocab, 0));
  if (c->type_vocab > 0) TRY(batch_ids(bc, "batch->token_types", b->token_types, c->type_vocab, 0));
  return L2L_OK;
}

const struct layer_kind_ops layers_embedding_kind = {
    .name = "embedding",
    .role = L2L_ROLE_INPUT,
    .check_config = embedding_check_config,
    .check_batch = embedding_check_batch,
    .create_params = embedding_create,
    .choose_flags = embedding_flags,
    .memory = embedding_memory,
    .forward = embedding_forward,
    .backward = embedding_backward,
};
