/* SPDX-License-Identifier: MIT */
/* checks.c — everything a step checks before its first visit: the model's shape, the
 * batch, the skipped layers and the micro-batches.
 *
 * Purpose: a step either runs or is refused having changed nothing; each refusal names
 * the batch field or the layer (index and kind) and what it should have been. The batch
 * fields are checked by the layers that read them (layers.h), the same checks their
 * micro-batches meet again. The budget is checked after them, against the step's schedule
 * (budget.c).
 * Must never: change the relay, a layer or the EPS.
 */
#include <stdlib.h>

#include "relay.h"

/* The refusal `status` of layer i, or of a field of the batch (NAMED_LAYER, NAMED_BATCH in
   its words), its detail naming it. */
#define OF_LAYER(status, i) error_note_layer((status), (i))
#define OF_BATCH(status, field) error_note_field((status), #field)

/* The model's shape: an input layer first, a head last, body layers between, one width. */
l2l_status relay_check_model(const l2l_relay *run) {
  if (run->count < 2)
    return FAIL(L2L_ERR_INVALID, "the model has %d layers: it needs at least an embedding and a head",
                run->count);
  const l2l_layer *first = run->layers[0].layer, *last = run->layers[run->count - 1].layer;
  if (layer_role(first) != L2L_ROLE_INPUT)
    return OF_LAYER(FAIL(L2L_ERR_INVALID, NAMED_LAYER " must be an embedding (it reads the tokens)", 0), 0);
  if (layer_role(last) != L2L_ROLE_HEAD)
    return OF_LAYER(FAIL(L2L_ERR_INVALID, NAMED_LAYER " (the last) must be an LM head or a classifier",
                         run->count - 1), run->count - 1);
  l2l_layer_config c0, c;
  l2l_layer_get_config(&c0, first);
  for (int i = 1; i < run->count; i++) {
    const l2l_layer *layer = run->layers[i].layer;
    if (i < run->count - 1 && layer_role(layer) != L2L_ROLE_BODY)
      return OF_LAYER(FAIL(L2L_ERR_INVALID, NAMED_LAYER " (%s) is between the embedding and the head, where "
                           "only blocks and custom layers go", i, l2l_layer_name(layer)), i);
    l2l_layer_get_config(&c, layer);
    if (c.dim != c0.dim)
      return OF_LAYER(FAIL(L2L_ERR_INVALID, NAMED_LAYER " has dim %lld but the embedding has %lld", i,
                           (long long)c.dim, (long long)c0.dim), i);
  }
  return L2L_OK;
}

/* The whole batch, by the check of every layer that reads a field of it (the one its
   micro-batches get again), in the host or pinned pool: the relay copies each
   micro-batch's rows to the device itself. Sets B, S, D and the real targets. */
static l2l_status check_batch(struct step *s, const l2l_relay_batch *in) {
  const l2l_relay *run = s->run;
  const l2l_tensor *tokens = in->tokens;
  if (tokens == NULL || l2l_tensor_ndim(tokens) != 2)
    return OF_BATCH(FAIL(L2L_ERR_INVALID, NAMED_BATCH(tokens) " must be a (B,S) i32 tensor%s",
                         tokens == NULL ? " (it is NULL)" : ""), tokens);
  s->B = l2l_tensor_dim(tokens, 0);
  s->S = l2l_tensor_dim(tokens, 1);
  l2l_layer_config first;
  l2l_layer_get_config(&first, run->layers[0].layer);
  s->D = first.dim;
  const l2l_layer_batch whole = {.tokens = in->tokens, .token_types = in->token_types,
                                 .targets = in->targets, .key_mask = in->key_mask,
                                 .training = 1, .loss_scale = 1};
  if (in->targets == NULL) return OF_BATCH(FAIL(L2L_ERR_INVALID, NAMED_BATCH(targets) " is NULL"), targets);
  for (int i = 0; i < run->count; i++) {
    const l2l_layer *layer = run->layers[i].layer;
    TRY(layer_check_batch(s->training ? "l2l_relay_step" : "l2l_relay_evaluate", layer,
                          &whole, s->B, s->S, L2L_POOL_HOST, false, false));
  }
  s->real = 0;
  const int32_t *t = l2l_tensor_data(in->targets);
  for (int64_t i = 0; i < l2l_tensor_numel(in->targets); i++) s->real += t[i] != -1;
  /* (with ranks a slice may have none: the whole minibatch's count is checked) */
  if (s->real == 0 && run->config.dist == L2L_DIST_NONE)
    return OF_BATCH(FAIL(L2L_ERR_INVALID, NAMED_BATCH(targets) " has no target other than -1"), targets);
  return L2L_OK;
}

/* The active layers (all but the skipped ones) and the micro-batches. */
static l2l_status choose_active(struct step *s, const l2l_relay_batch *in) {
  const l2l_relay *run = s->run;
  s->active = malloc((size_t)run->count * sizeof *s->active);
  if (s->active == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a step");
  for (int i = 0; i < run->count; i++) {
    bool skip = in->skip && in->skip[i];
    if (skip && (i == 0 || i == run->count - 1))
      return FAIL(L2L_ERR_INVALID, "batch->skip[%d]: the embedding and the head cannot be skipped", i);
    if (in->skip && in->skip[i] > 1)
      return FAIL(L2L_ERR_INVALID, "batch->skip[%d] must be 0 or 1, got %d", i, in->skip[i]);
    if (!skip) s->active[s->L++] = i;
  }
  s->mb = run->config.micro_batch < s->B ? run->config.micro_batch : s->B;
  s->nmb = (s->B + s->mb - 1) / s->mb;
  return L2L_OK;
}

l2l_status relay_check_step(struct step *s, const l2l_relay_batch *in) {
  if (in == NULL) return FAIL(L2L_ERR_INVALID, "batch is NULL");
  TRY(relay_check_model(s->run));
  TRY(check_batch(s, in));
  return choose_active(s, in);
}
