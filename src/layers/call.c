/* SPDX-License-Identifier: MIT */
/* call.c — a layer's forward and backward calls: their checks, the memory plan they
 * allocate by, and the saved state that carries one to the other.
 *
 * Purpose: a layer call from C or Lua either runs completely or fails having changed
 * nothing: every tensor, shape, pool and batch field is checked here (the batch fields by
 * the kind's own check) before the kind's code runs on raw buffers. The saved state and
 * the scratch buffers come from the pool of the call's output, each as one allocation
 * sized by the kind's memory plan, so what l2l_layer_memory_use reports is what is
 * allocated.
 * Must never: let a kind's code see an unchecked tensor.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kind.h"

/* ---------------------------------------------------------------- memory plans */

static uint64_t param_bytes(const l2l_layer *layer) {
  uint64_t bytes = 0;
  for (int i = 0; i < layer->nparams; i++)
    bytes += pool_accounted((uint64_t)layer->params[i]->value->numel * sizeof(float));
  return bytes;
}

/* Bytes of the cast scratch for 16-bit weights of `precision` (f32: none). */
static uint64_t cast_bytes(const l2l_layer *layer, int64_t batch, int64_t seq, uint32_t flags,
                           l2l_dtype precision) {
  const struct layer_kind_ops *k = layer_kind_of(layer);
  if (precision == L2L_F32 || k->cast_elements == NULL) return 0;
  struct arena a = {0};
  arena_reserve(&a, (uint64_t)k->cast_elements(layer, batch, seq, flags) *
                        l2l_dtype_size(precision));
  return a.bytes;
}

/* The dtype of the layer's bound 16-bit weights, f32 when none is. */
static l2l_dtype layer_precision(const l2l_layer *layer) {
  for (int i = 0; i < layer->nparams; i++)
    if (layer->params[i]->value->dtype != L2L_F32) return layer->params[i]->value->dtype;
  return L2L_F32;
}

/* A call's flags with LAYER_ACTS_16 when its GEMM weights are 16-bit. */
static uint32_t with_precision(uint32_t flags, l2l_dtype precision) {
  return precision != L2L_F32 ? flags | LAYER_ACTS_16 : flags & ~(uint32_t)LAYER_ACTS_16;
}

/* Work arenas: the kind's buffers first, then the cast scratch. */
static void memory_for(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch,
                       int64_t seq, uint32_t flags, l2l_dtype precision) {
  memset(out, 0, sizeof *out);
  layer_kind_of(layer)->memory(out, layer, batch, seq, with_precision(flags, precision));
  struct arena fwd = {out->work_forward}, bwd = {out->work_backward};
  uint64_t cast = cast_bytes(layer, batch, seq, with_precision(flags, precision), precision);
  arena_reserve(&fwd, cast);
  arena_reserve(&bwd, cast);
  out->work_forward = fwd.bytes;
  out->work_backward = bwd.bytes;
  out->params = param_bytes(layer);
  uint64_t work = out->work_forward > out->work_backward ? out->work_forward : out->work_backward;
  out->peak = out->saved + work;
}

/* The flags a call chooses with the layer's present parameters: training or not, with or
   without targets (logits). */
static uint32_t flags_for(const l2l_layer *layer, bool training, bool logits) {
  const struct layer_kind_ops *k = layer_kind_of(layer);
  return k->choose_flags ? k->choose_flags(layer, training, logits) : 0;
}

/* The flags of a call with this batch (NULL in the reports: training, with targets). */
static uint32_t flags_now(const l2l_layer *layer, const l2l_layer_batch *batch) {
  return flags_for(layer, batch == NULL || batch->training, batch && batch->targets == NULL);
}

l2l_status l2l_layer_memory_use(l2l_layer_memory *out, const l2l_layer *layer,
                                int64_t micro_batch, int64_t seq) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!layer_live(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  if (micro_batch < 1 || seq < 1 || micro_batch > (INT64_C(1) << 24) || seq > (INT64_C(1) << 24))
    return FAIL(L2L_ERR_INVALID, "micro_batch and seq must be 1 to 2^24, got %lld and %lld",
                (long long)micro_batch, (long long)seq);
  const l2l_layer_config *c = &layer->config;
  if (layer_role(layer) == L2L_ROLE_INPUT && seq > c->max_seq)
    return FAIL(L2L_ERR_INVALID, "seq %lld exceeds the embedding's max_seq %lld",
                (long long)seq, (long long)c->max_seq);
  /* The kinds plan in int64 elements (B x S x the widest row, B x heads x S x S): sizes
     that no call could have are refused before those products can overflow. */
  double rows = (double)micro_batch * (double)seq;
  double widest = (double)c->dim + (double)c->mlp + (double)c->vocab + (double)c->classes;
  double elements = rows * widest + rows * (double)c->heads * (double)seq;
  if (elements > 0x1p48)
    return FAIL(L2L_ERR_INVALID, "micro_batch %lld x seq %lld needs about %.3g elements per "
                "call, more than a tensor can hold (2^48)", (long long)micro_batch,
                (long long)seq, elements);
  memory_for(out, layer, micro_batch, seq, flags_now(layer, NULL), L2L_F32);
  return L2L_OK;
}

void layer_memory_in(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch,
                     int64_t seq, l2l_dtype precision, bool training) {
  memory_for(out, layer, batch, seq, flags_for(layer, training, false), precision);
}

void layer_memory_bound(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch,
                        int64_t seq, l2l_dtype precision, bool training) {
  const struct layer_kind_ops *k = layer_kind_of(layer);
  uint32_t now = flags_for(layer, training, false);
  uint32_t worst = (now | k->weights_set) & ~k->weights_clear;
  memory_for(out, layer, batch, seq, now, precision);
  if (worst == now) return;
  l2l_layer_memory w;
  memory_for(&w, layer, batch, seq, worst, precision);
  if (w.saved > out->saved) out->saved = w.saved;
  if (w.work_forward > out->work_forward) out->work_forward = w.work_forward;
  if (w.work_backward > out->work_backward) out->work_backward = w.work_backward;
  uint64_t work = out->work_forward > out->work_backward ? out->work_forward : out->work_backward;
  out->peak = out->saved + work;
}

/* ---------------------------------------------------------------- call checks */

/* B and S of a call: from batch->tokens for the input layer, else from x (B,S,D). */
static l2l_status call_shape(const char *func, const l2l_layer *layer, const l2l_tensor *x,
                             const l2l_layer_batch *b, int64_t *batch, int64_t *seq) {
  const l2l_layer_config *c = &layer->config;
  if (layer_role(layer) == L2L_ROLE_INPUT) {
    if (x != NULL)
      return core_fail_in(func, L2L_ERR_INVALID, "x must be NULL for an %s (it reads batch->tokens)",
                          l2l_layer_name(layer));
    const l2l_tensor *t = b->tokens;
    if (t == NULL || !tensor_ok(t) || t->ndim != 2 || t->dtype != L2L_I32)
      return core_fail_in(func, L2L_ERR_INVALID, "batch->tokens must be a live (B,S) i32 tensor");
    *batch = t->shape[0];
    *seq = t->shape[1];
    return L2L_OK;
  }
  if (x == NULL || !tensor_ok(x) || x->ndim != 3)
    return core_fail_in(func, L2L_ERR_INVALID, "x must be a live (B,S,%lld) f32 tensor",
                        (long long)c->dim);
  *batch = x->shape[0];
  *seq = x->shape[1];
  int64_t dims[3] = {*batch, *seq, c->dim};
  return core_need_shape(func, "x", x, L2L_F32, 3, dims);
}

/* A batch field's name marked as naming it (L2L_NAMED), and the refusal `status` of it,
   its detail naming the field ("tokens" of "batch->tokens"). */
static const char *named_field(char *buf, size_t len, const char *name) {
  snprintf(buf, len, L2L_NAMED_FIELD "%s" L2L_NAMED_END, name);
  return buf;
}
l2l_status batch_refused(l2l_status status, const char *name) {
  const char *arrow = strstr(name, "->");
  return error_note_field(status, arrow ? arrow + 2 : name);
}

l2l_status batch_tensor(const struct batch_check *bc, const char *name, const l2l_tensor *t,
                        l2l_dtype dtype, int ndim) {
  int64_t dims[2] = {bc->batch, bc->seq};
  char named[64];
  l2l_status status = core_need_shape(bc->func, named_field(named, sizeof named, name), t, dtype, ndim, dims);
  if (status != L2L_OK) return batch_refused(status, name);
  if (backend_pool_domain(t->storage->pool) != bc->domain)
    return batch_refused(core_fail_in(bc->func, L2L_ERR_INVALID, "%s must be in %s, not '%s'", named,
                                      bc->domain == backend_pool_domain(L2L_POOL_HOST)
                                             ? "the host or pinned pool" : "the device pool",
                                         l2l_pool_name(t->storage->pool)), name);
  return L2L_OK;
}

l2l_status batch_ids(const struct batch_check *bc, const char *name, const l2l_tensor *t,
                     int64_t hi, int32_t except) {
  if (bc->values_checked) return L2L_OK;
  int64_t bad = -1;
  int32_t value = 0;
  TRY(bc->ops->find_out_of_range(&bad, &value, tensor_ptr(t), t->numel, 0, (int32_t)hi,
                                 except));
  char at[128], named[64];
  int64_t index[L2L_MAX_DIMS];
  if (bad >= 0) {
    l2l_status status = core_fail_in(bc->func, L2L_ERR_INVALID,
                                     "%s" L2L_NAMED_ELEMENT "%s" L2L_NAMED_END " = %d is outside [0, %lld)%s",
                                     named_field(named, sizeof named, name),
                                     core_index_str(at, sizeof at, t, bad), value, (long long)hi,
                                     except == -1 ? " and not -1" : "");
    return batch_refused(error_note_element(status, core_index_of(index, t, bad), index), name);
  }
  return L2L_OK;
}

l2l_status layer_check_batch(const char *func, const l2l_layer *layer,
                             const l2l_layer_batch *b, int64_t B, int64_t S,
                             l2l_pool_kind pool, bool backward, bool values_checked) {
  if (b->first_sample < 0)
    return core_fail_in(func, L2L_ERR_INVALID, "batch->first_sample must be >= 0, got %lld",
                        (long long)b->first_sample);
  if (b->training != 0 && b->training != 1)
    return core_fail_in(func, L2L_ERR_INVALID, "batch->training must be 0 or 1, got %d",
                        b->training);
  const struct layer_kind_ops *kind = layer_kind_of(layer);
  if (kind->check_batch == NULL) return L2L_OK;
  struct batch_check bc = {func, layer, b, B, S, backend_pool_domain(pool), backend_for(pool),
                           backward, values_checked};
  return kind->check_batch(&bc);
}

l2l_status layers_check_key_mask(const struct batch_check *bc) {
  const l2l_tensor *mask = bc->b->key_mask;
  return mask != NULL ? batch_tensor(bc, "batch->key_mask", mask, L2L_U8, 2) : L2L_OK;
}

int layer_output_dims(int64_t *dims, const l2l_layer *layer, const l2l_layer_batch *batch,
                      int64_t B, int64_t S) {
  const struct layer_kind_ops *kind = layer_kind_of(layer);
  if (kind->output_dims) return kind->output_dims(dims, layer, batch, B, S);
  dims[0] = B, dims[1] = S, dims[2] = layer->config.dim;
  return 3;
}

static l2l_status check_params_domain(const char *func, const l2l_layer *layer, int domain) {
  for (int i = 0; i < layer->nparams; i++)
    if (backend_pool_domain(layer->params[i]->value->storage->pool) != domain)
      return core_fail_in(func, L2L_ERR_INVALID,
                          "parameter '%s' is in pool '%s', not of the call's backend (copy the "
                          "layer's parameters or the activations first)",
                          layer->params[i]->name,
                          l2l_pool_name(layer->params[i]->value->storage->pool));
  return L2L_OK;
}

/* A tensor the call writes (`values`: y, dx), or reads while the backward adds into the
   gradients (dy), may not share memory with the layer's parameter records: the call would
   overwrite the weights or gradients it computes with, or read its own partial sums. */
static l2l_status check_apart_from_params(const char *func, const l2l_layer *layer,
                                          const char *name, const l2l_tensor *t, bool values) {
  if (t == NULL) return L2L_OK;
  for (int i = 0; i < layer->nparams; i++) {
    const l2l_param *p = layer->params[i];
    if (values && tensors_overlap(t, p->value))
      return core_fail_in(func, L2L_ERR_INVALID, "%s overlaps the value of parameter '%s'", name,
                          p->name);
    if (tensors_overlap(t, p->grad))
      return core_fail_in(func, L2L_ERR_INVALID, "%s overlaps the gradient of parameter '%s'",
                          name, p->name);
  }
  return L2L_OK;
}

/* A scratch allocation of `bytes` in `pool` (NULL tensor for 0). */
static l2l_status arena_new(l2l_tensor **out, l2l_pool_kind pool, uint64_t bytes) {
  *out = NULL;
  if (bytes == 0) return L2L_OK;
  int64_t shape[1] = {(int64_t)bytes};
  return l2l_tensor_new(out, pool, L2L_U8, 1, shape);
}

/* The cast scratch at the end of a work arena (memory_for put it there). */
static void *cast_scratch(const l2l_tensor *work, const l2l_layer *layer, int64_t B, int64_t S,
                          uint32_t flags, l2l_dtype precision) {
  uint64_t bytes = cast_bytes(layer, B, S, flags, precision);
  if (bytes == 0) return NULL;
  return (char *)tensor_ptr(work) + (work->storage->bytes - bytes);
}

/* A handle on the same storage as t (the saved state's reference). */
static l2l_status reference(l2l_tensor **out, const l2l_tensor *t) {
  return l2l_tensor_view_rows(out, t, 0, t->shape[0]);
}

/* ---------------------------------------------------------------- forward and backward */

void l2l_saved_free(l2l_saved *saved) {
  if (saved == NULL || saved->magic != L2L_SAVED_MAGIC) return;
  l2l_tensor_free(saved->buffer);
  l2l_tensor_free(saved->input);
  l2l_tensor_free(saved->output);
  saved->magic = 0;
  free(saved);
}

/* t moved into `pool`: a copy there replaces the handle (the old storage goes with its
   last handle). */
static l2l_status move_tensor(l2l_tensor **t, l2l_pool_kind pool) {
  if (*t == NULL || (*t)->storage->pool == pool) return L2L_OK;
  l2l_tensor *copy = NULL;
  TRY(l2l_tensor_new(&copy, pool, (*t)->dtype, (*t)->ndim, (*t)->shape));
  l2l_status status = l2l_tensor_copy(copy, *t);
  if (status != L2L_OK) {
    l2l_tensor_free(copy);
    return status;
  }
  l2l_tensor_free(*t);
  *t = copy;
  return L2L_OK;
}

const void *layer_owner(const l2l_layer *layer) { return layer->owner; }
void layer_set_owner(l2l_layer *layer, const void *owner) {
  layer->owner = owner;
  if (owner == NULL && layer->free_pending) l2l_layer_free(layer);
}

l2l_relay *l2l_layer_relay(const l2l_layer *layer) {
  return layer_live(layer) ? (l2l_relay *)layer->owner : NULL;
}

l2l_status saved_move(l2l_saved *saved, l2l_pool_kind pool) {
  if (saved == NULL) return L2L_OK;
  if (saved->magic != L2L_SAVED_MAGIC) return FAIL(L2L_ERR_INVALID, "saved is not a live saved state");
  TRY(move_tensor(&saved->buffer, pool));
  TRY(move_tensor(&saved->input, pool));
  return move_tensor(&saved->output, pool);
}

uint64_t saved_pool_bytes(const l2l_saved *saved) {
  if (saved == NULL || saved->magic != L2L_SAVED_MAGIC) return 0;
  uint64_t bytes = 0;
  const l2l_tensor *held[3] = {saved->buffer, saved->input, saved->output};
  for (int i = 0; i < 3; i++)
    if (held[i]) bytes += pool_accounted(held[i]->storage->bytes);
  return bytes;
}

uint64_t l2l_saved_bytes(const l2l_saved *saved) {
  if (saved == NULL || saved->magic != L2L_SAVED_MAGIC || saved->buffer == NULL) return 0;
  return saved->buffer->storage->bytes;
}

static l2l_status layer_forward(l2l_saved **saved_out, l2l_layer *layer, l2l_tensor *y,
                               const l2l_tensor *x, const l2l_layer_batch *batch,
                               bool values_checked) {
  const char *f = "l2l_layer_forward";
  if (!layer_live(layer)) return core_fail_in(f, L2L_ERR_INVALID, "layer is not a live layer");
  if (batch == NULL) return core_fail_in(f, L2L_ERR_INVALID, "batch is NULL");
  int64_t B = 0, S = 0, dims[3];
  TRY(call_shape(f, layer, x, batch, &B, &S));
  int ndim = layer_output_dims(dims, layer, batch, B, S);
  TRY(core_need_shape(f, "y", y, L2L_F32, ndim, dims));
  if (tensors_overlap(x, y)) return core_fail_in(f, L2L_ERR_INVALID, "x and y overlap");
  TRY(check_apart_from_params(f, layer, "y", y, true));
  int domain = backend_pool_domain(y->storage->pool);
  if (x && backend_pool_domain(x->storage->pool) != domain)
    return core_fail_in(f, L2L_ERR_INVALID, "x is in pool '%s' but y in '%s'",
                l2l_pool_name(x->storage->pool), l2l_pool_name(y->storage->pool));
  TRY(check_params_domain(f, layer, domain));
  TRY(layer_check_batch(f, layer, batch, B, S, y->storage->pool, false, values_checked));
  bool is_head = layer_role(layer) == L2L_ROLE_HEAD;
  bool keep = saved_out != NULL && !(is_head && batch->targets == NULL);
  if (saved_out) *saved_out = NULL;

  /* The forward always fills a saved state (its buffers are where it computes); an
     inference call drops it on return. */
  l2l_dtype precision = layer_precision(layer);
  uint32_t flags = with_precision(flags_now(layer, batch), precision);
  l2l_layer_memory mem;
  memory_for(&mem, layer, B, S, flags, precision);
  struct l2l_saved *saved = calloc(1, sizeof *saved);
  if (saved == NULL) return core_fail_in(f, L2L_ERR_NOMEM, "no memory for a saved state");
  saved->magic = L2L_SAVED_MAGIC;
  saved->kind = layer->config.kind;
  saved->layer_serial = layer->serial;
  memcpy(&saved->config, &layer->config, sizeof saved->config);
  saved->batch = B;
  saved->seq = S;
  saved->flags = flags;
  saved->precision = precision;
  l2l_tensor *work = NULL;
  l2l_status status = arena_new(&saved->buffer, y->storage->pool, mem.saved);
  if (status == L2L_OK && keep && mem.input_kept) status = reference(&saved->input, x);
  if (status == L2L_OK && keep && mem.output_kept) status = reference(&saved->output, y);
  if (status == L2L_OK) status = arena_new(&work, y->storage->pool, mem.work_forward);
  if (status == L2L_OK) {
    struct layer_call call = {backend_for(y->storage->pool), y->storage->pool, B, S, batch,
                              .keep = keep, .y = y, .x = x, .precision = precision,
                              .cast = cast_scratch(work, layer, B, S, flags, precision)};
    status = layer_kind_of(layer)->forward(
        &call, layer, tensor_ptr(y), x ? tensor_ptr(x) : NULL, saved,
        work ? tensor_ptr(work) : NULL);
  }
  l2l_tensor_free(work);
  if (status != L2L_OK || !keep) {
    l2l_saved_free(saved);
    return status;
  }
  *saved_out = saved;
  return L2L_OK;
}

static l2l_status layer_backward(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                                l2l_saved *saved, const l2l_layer_batch *batch,
                                bool values_checked) {
  const char *f = "l2l_layer_backward";
  if (!layer_live(layer)) return core_fail_in(f, L2L_ERR_INVALID, "layer is not a live layer");
  if (batch == NULL) return core_fail_in(f, L2L_ERR_INVALID, "batch is NULL");
  if (saved == NULL || saved->magic != L2L_SAVED_MAGIC)
    return core_fail_in(f, L2L_ERR_INVALID, "saved is not a live saved state");
  if (saved->kind != layer->config.kind)
    return core_fail_in(f, L2L_ERR_INVALID, "saved comes from a %s layer, not a %s",
                kind_ops(saved->kind)->name, layer_kind_of(layer)->name);
  /* Its buffers are laid out for the layer and config that made it: another layer of the
     same kind (a wider MLP, more heads, the other memory mode), or this one changed since,
     would read them out of bounds. */
  if (saved->layer_serial != layer->serial)
    return core_fail_in(f, L2L_ERR_INVALID, "saved comes from another %s layer's forward, not this "
                "layer's (run this layer's forward)", l2l_layer_name(layer));
  if (memcmp(&saved->config, &layer->config, sizeof saved->config) != 0)
    return core_fail_in(f, L2L_ERR_STATE, "the layer's config changed since the forward that made saved "
                "(its memory mode?): run the forward again");
  if (saved->used)
    return core_fail_in(f, L2L_ERR_STATE, "saved has already served a backward (run the forward again)");
  const l2l_layer_config *c = &layer->config;
  int64_t B = saved->batch, S = saved->seq, dims[3] = {B, S, c->dim};
  enum layer_role role = layer_role(layer);
  if (role == L2L_ROLE_HEAD) {
    if (dy != NULL) return core_fail_in(f, L2L_ERR_INVALID, "dy must be NULL for a head (batch->loss_scale is used)");
  } else {
    TRY(core_need_shape(f, "dy", dy, L2L_F32, 3, dims));
  }
  if (role == L2L_ROLE_INPUT) {
    if (dx != NULL) return core_fail_in(f, L2L_ERR_INVALID, "dx must be NULL for an embedding");
  } else {
    TRY(core_need_shape(f, "dx", dx, L2L_F32, 3, dims));
  }
  if (tensors_overlap(dx, dy)) return core_fail_in(f, L2L_ERR_INVALID, "dx and dy overlap");
  TRY(check_apart_from_params(f, layer, "dx", dx, true));
  TRY(check_apart_from_params(f, layer, "dy", dy, false));
  const l2l_tensor *any = dx ? dx : dy;
  l2l_pool_kind pool = any ? any->storage->pool : saved->buffer ? saved->buffer->storage->pool
                                                                 : layer->pool;
  int domain = backend_pool_domain(pool);
  if (dx && dy && backend_pool_domain(dy->storage->pool) != domain)
    return core_fail_in(f, L2L_ERR_INVALID, "dx is in pool '%s' but dy in '%s'",
                l2l_pool_name(dx->storage->pool), l2l_pool_name(dy->storage->pool));
  if (saved->buffer && backend_pool_domain(saved->buffer->storage->pool) != domain)
    return core_fail_in(f, L2L_ERR_INVALID, "saved is in pool '%s', not of the backend of dx/dy",
                l2l_pool_name(saved->buffer->storage->pool));
  TRY(check_params_domain(f, layer, domain));
  TRY(layer_check_batch(f, layer, batch, B, S, pool, true, values_checked));
  if (role == L2L_ROLE_INPUT && (batch->tokens->shape[0] != B || batch->tokens->shape[1] != S))
    return core_fail_in(f, L2L_ERR_INVALID, "batch->tokens is not the forward's shape");
  if (tensors_overlap(dx, saved->input) || tensors_overlap(dx, saved->output))
    return core_fail_in(f, L2L_ERR_INVALID, "dx overlaps a tensor the saved state reads");

  /* its 16-bit activations are the forward's weights' dtype, which the backward's GEMMs
     must read too */
  l2l_dtype precision = layer_precision(layer);
  if (precision != saved->precision)
    return core_fail_in(f, L2L_ERR_STATE, "the layer's GEMM weights are %s, the forward that made "
                        "saved had them %s: run the forward again", l2l_dtype_name(precision),
                        l2l_dtype_name(saved->precision));
  l2l_layer_memory mem;
  memory_for(&mem, layer, B, S, saved->flags, precision);
  l2l_tensor *work = NULL;
  TRY(arena_new(&work, pool, mem.work_backward));
  struct layer_call call = {backend_for(pool), pool, B, S, batch, .dx = dx, .dy = dy,
                            .precision = precision,
                            .cast = cast_scratch(work, layer, B, S, saved->flags, precision)};
  l2l_status status = layer_kind_of(layer)->backward(
      &call, layer, dx ? tensor_ptr(dx) : NULL, dy ? tensor_ptr(dy) : NULL, saved,
      work ? tensor_ptr(work) : NULL);
  l2l_tensor_free(work);
  if (status == L2L_OK) saved->used = true;
  return status;
}

l2l_status l2l_layer_forward(l2l_saved **saved, l2l_layer *layer, l2l_tensor *y,
                             const l2l_tensor *x, const l2l_layer_batch *batch) {
  return error_as(__func__, layer_forward(saved, layer, y, x, batch, false));
}

l2l_status layer_forward_prechecked(l2l_saved **saved, l2l_layer *layer, l2l_tensor *y,
                                    const l2l_tensor *x, const l2l_layer_batch *batch) {
  return layer_forward(saved, layer, y, x, batch, true);
}

/* A caller's backward adds into the parameters' grads (a relay's EPS's accumulators, between
   its steps): they are handed out first, as l2l_param_grad would hand them. */
l2l_status l2l_layer_backward(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                              l2l_saved *saved, const l2l_layer_batch *batch) {
  for (int r = 0; layer_live(layer) && r < l2l_layer_param_count(layer); r++)
    (void)l2l_param_grad(l2l_layer_param(layer, r));
  return error_as(__func__, layer_backward(layer, dx, dy, saved, batch, false));
}

l2l_status layer_backward_grads_kept(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                                     l2l_saved *saved, const l2l_layer_batch *batch) {
  return layer_backward(layer, dx, dy, saved, batch, false);
}

l2l_status layer_backward_prechecked(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                                     l2l_saved *saved, const l2l_layer_batch *batch) {
  return layer_backward(layer, dx, dy, saved, batch, true);
}
