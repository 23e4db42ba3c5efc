/* layer.c — what every layer kind shares: construction, parameters, ties, clones, the
 * checks of a forward or backward call, and the saved state.
 *
 * Purpose: a layer call from C or Lua either runs completely or fails having changed
 * nothing: every tensor, shape, pool and batch field is checked here before the kind's
 * code (embedding.c, block.c, heads.c) runs on raw buffers. The saved state and the
 * scratch buffers come from the pool of the call's output, each as one allocation sized
 * by the kind's memory plan, so what l2l_layer_memory_use reports is what is allocated.
 * Must never: let a kind's code see an unchecked tensor, or free a parameter record that
 * another layer still uses.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kind.h"

static const struct layer_kind_ops *kind_ops(l2l_layer_kind kind) {
  switch (kind) {
    case L2L_LAYER_EMBEDDING: return &l2l_embedding_kind;
    case L2L_LAYER_BLOCK: return &l2l_block_kind;
    case L2L_LAYER_LM_HEAD: return &l2l_lm_head_kind;
    case L2L_LAYER_CLASSIFIER: return &l2l_classifier_kind;
    case L2L_LAYER_CUSTOM: return &l2l_custom_kind;
  }
  return NULL;
}

static bool layer_ok(const l2l_layer *layer) {
  return layer != NULL && layer->magic == L2L_LAYER_MAGIC;
}
static bool param_ok(const l2l_param *param) {
  return param != NULL && param->magic == L2L_PARAM_MAGIC;
}

int64_t l2l_arena_reserve(struct arena *a, uint64_t bytes) {
  if (bytes == 0) return NO_BUFFER;
  int64_t offset = (int64_t)a->bytes;
  a->bytes += (bytes + L2L_ALIGN - 1) / L2L_ALIGN * L2L_ALIGN;
  return offset;
}

/* ---------------------------------------------------------------- parameters */

static void param_release(l2l_param *param) {
  if (param == NULL || atomic_fetch_sub(&param->users, 1) != 1) return;
  l2l_param_bind(param, NULL, NULL);
  l2l_tensor_free(param->value);
  l2l_tensor_free(param->grad);
  param->magic = 0;
  free(param);
}

/* A record with value and zeroed gradient of `shape` in `pool`. */
static l2l_status param_new(l2l_param **out, const char *name, l2l_pool_kind pool, int ndim,
                            const int64_t *shape, int decays) {
  l2l_param *param = calloc(1, sizeof *param);
  if (param == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for parameter '%s'", name);
  param->magic = L2L_PARAM_MAGIC;
  atomic_init(&param->users, 1);
  snprintf(param->name, sizeof param->name, "%s", name);
  param->decays = decays;
  l2l_status status = l2l_tensor_new(&param->value, pool, L2L_F32, ndim, shape);
  if (status == L2L_OK) status = l2l_tensor_new(&param->grad, pool, L2L_F32, ndim, shape);
  if (status == L2L_OK) status = l2l_tensor_fill(param->grad, 0.0);
  if (status != L2L_OK) {
    param_release(param);
    return status;
  }
  *out = param;
  return L2L_OK;
}

l2l_status l2l_layer_add_param(l2l_layer *layer, int role, const char *name, int ndim,
                               const int64_t *shape, char init, float std, int decays) {
  int index = layer->nparams;
  l2l_param *param = NULL;
  TRY(param_new(&param, name, layer->pool, ndim, shape, decays));
  layer->params[layer->nparams++] = param;
  layer->role[role] = (int8_t)index;
  /* Each parameter role has its own stream; the top bit keeps init streams apart from
     dropout streams (step << 32 + rng_id << 8 + site). Layers of one seed start equal. */
  uint64_t stream = (UINT64_C(1) << 63) + (uint64_t)role;
  switch (init) {
    case 'n': return l2l_tensor_normal(param->value, layer->config.init_seed, stream, 0, 0.0, std);
    case '1': return l2l_tensor_fill(param->value, 1.0);
    default: return l2l_tensor_fill(param->value, 0.0);
  }
}

const char *l2l_param_name(const l2l_param *param) { return param_ok(param) ? param->name : NULL; }
l2l_tensor *l2l_param_value(const l2l_param *param) { return param_ok(param) ? param->value : NULL; }
l2l_tensor *l2l_param_grad(const l2l_param *param) { return param_ok(param) ? param->grad : NULL; }
int l2l_param_users(const l2l_param *param) {
  return param_ok(param) ? atomic_load(&param->users) : -1;
}
int l2l_param_decays(const l2l_param *param) { return param_ok(param) ? param->decays : -1; }
bool l2l_param_low_precision(const l2l_param *param) { return param->low_precision; }

void l2l_layer_mark_low_precision(l2l_layer *layer, int role) {
  layer->params[layer->role[role]]->low_precision = true;
}

void l2l_param_bind(l2l_param *param, l2l_tensor *value, l2l_tensor *grad) {
  if (value != NULL) {
    if (param->home_value == NULL) {
      param->home_value = param->value;
      param->home_grad = param->grad;
    }
    param->value = value;
    param->grad = grad;
  } else if (param->home_value != NULL) {
    param->value = param->home_value;
    param->grad = param->home_grad;
    param->home_value = param->home_grad = NULL;
  }
}

/* ---------------------------------------------------------------- construction */

static atomic_uint next_rng_id = 1;

static l2l_status check_config(const l2l_layer_config *c) {
  if (c == NULL) return l2l_fail(L2L_ERR_INVALID, "l2l_layer_new: config is NULL");
  if (kind_ops(c->kind) == NULL)
    return l2l_fail(L2L_ERR_INVALID, "l2l_layer_new: no layer kind with number %d", c->kind);
  const char *kind = kind_ops(c->kind)->name;
  const int64_t limit = INT64_C(1) << 24;
#define NEED(cond, ...)                                                                 \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      char msg_[160];                                                                   \
      snprintf(msg_, sizeof msg_, __VA_ARGS__);                                         \
      return l2l_fail(L2L_ERR_INVALID, "l2l_layer_new (%s): %s", kind, msg_);           \
    }                                                                                   \
  } while (0)
#define SIZE(field) NEED(c->field >= 1 && c->field <= limit, #field " must be 1 to 2^24, got %lld", \
                         (long long)c->field)
#define FLAG(field) NEED(c->field == 0 || c->field == 1, #field " must be 0 or 1, got %d", c->field)
  SIZE(dim);
  NEED(isfinite(c->init_std) && c->init_std > 0, "init_std must be finite and > 0, got %g",
       c->init_std);
  NEED(isfinite(c->dropout) && c->dropout >= 0 && c->dropout < 1,
       "dropout must be in [0, 1), got %g", c->dropout);
  bool uses_ln = c->kind == L2L_LAYER_BLOCK || (c->kind == L2L_LAYER_LM_HEAD && c->final_ln);
  if (uses_ln) NEED(isfinite(c->eps) && c->eps > 0, "eps must be finite and > 0, got %g", c->eps);
  switch (c->kind) {
    case L2L_LAYER_EMBEDDING:
      SIZE(vocab);
      SIZE(max_seq);
      NEED(c->type_vocab >= 0 && c->type_vocab <= limit,
           "type_vocab must be 0 to 2^24, got %lld", (long long)c->type_vocab);
      break;
    case L2L_LAYER_BLOCK:
      SIZE(heads);
      SIZE(mlp);
      NEED(c->dim % c->heads == 0, "heads (%lld) must divide dim (%lld)", (long long)c->heads,
           (long long)c->dim);
      FLAG(causal);
      FLAG(post_ln);
      FLAG(bias);
      NEED(c->memory == L2L_MEMORY_STANDARD || c->memory == L2L_MEMORY_FRUGAL,
           "memory must be standard (0) or frugal (1), got %d", c->memory);
      NEED(isfinite(c->attn_dropout) && c->attn_dropout >= 0 && c->attn_dropout < 1,
           "attn_dropout must be in [0, 1), got %g", c->attn_dropout);
      NEED(isfinite(c->resid_std) && c->resid_std > 0, "resid_std must be finite and > 0, got %g",
           c->resid_std);
      break;
    case L2L_LAYER_LM_HEAD:
      SIZE(vocab);
      FLAG(final_ln);
      break;
    case L2L_LAYER_CLASSIFIER:
      SIZE(classes);
      break;
    case L2L_LAYER_CUSTOM:
      NEED(false, "custom layers are made with l2l_layer_new_custom");
  }
#undef NEED
#undef SIZE
#undef FLAG
  return L2L_OK;
}

void l2l_layer_free(l2l_layer *layer) {
  if (!layer_ok(layer)) return;
  for (int i = 0; i < layer->nparams; i++) param_release(layer->params[i]);
  l2l_custom_kind_release(layer->custom);
  layer->magic = 0;
  free(layer);
}

l2l_status l2l_layer_alloc(l2l_layer **out, const l2l_layer_config *config,
                              l2l_pool_kind pool) {
  l2l_layer *layer = calloc(1, sizeof *layer);
  if (layer == NULL) return l2l_fail(L2L_ERR_NOMEM, "no memory for a layer");
  layer->magic = L2L_LAYER_MAGIC;
  layer->config = *config;
  layer->pool = pool;
  layer->rng_id = atomic_fetch_add(&next_rng_id, 1) & 0xffffffu;
  memset(layer->role, -1, sizeof layer->role);
  *out = layer;
  return L2L_OK;
}

l2l_status l2l_layer_new(l2l_layer **out, const l2l_layer_config *config, l2l_pool_kind pool) {
  l2l_runtime_init();
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY(check_config(config));
  if (!l2l_pool_valid((int)pool)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", pool);
  l2l_layer *layer = NULL;
  TRY(l2l_layer_alloc(&layer, config, pool));
  l2l_status status = kind_ops(config->kind)->create_params(layer);
  if (status != L2L_OK) {
    l2l_layer_free(layer);
    return status;
  }
  *out = layer;
  return L2L_OK;
}

l2l_status l2l_layer_clone(l2l_layer **out, const l2l_layer *layer) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!layer_ok(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  l2l_layer *copy = NULL;
  TRY(l2l_layer_alloc(&copy, &layer->config, layer->pool));
  memcpy(copy->role, layer->role, sizeof copy->role);
  if (layer->custom) {
    atomic_fetch_add(&((struct custom_kind *)layer->custom)->refs, 1);
    copy->custom = layer->custom;
  }
  l2l_status status = L2L_OK;
  for (int i = 0; i < layer->nparams && status == L2L_OK; i++) {
    const l2l_param *p = layer->params[i];
    l2l_param *q = NULL;
    status = param_new(&q, p->name, layer->pool, p->value->ndim, p->value->shape, p->decays);
    if (status != L2L_OK) break;
    q->low_precision = p->low_precision;
    copy->params[copy->nparams++] = q;
    status = l2l_tensor_copy(q->value, p->value);
  }
  if (status != L2L_OK) {
    l2l_layer_free(copy);
    return status;
  }
  *out = copy;
  return L2L_OK;
}

l2l_status l2l_layer_tie(l2l_layer *head, l2l_layer *embedding) {
  if (!layer_ok(head) || head->config.kind != L2L_LAYER_LM_HEAD)
    return FAIL(L2L_ERR_INVALID, "head must be a live LM head layer");
  if (!layer_ok(embedding) || embedding->config.kind != L2L_LAYER_EMBEDDING)
    return FAIL(L2L_ERR_INVALID, "embedding must be a live embedding layer");
  const l2l_layer_config *h = &head->config, *e = &embedding->config;
  if (h->vocab != e->vocab || h->dim != e->dim)
    return FAIL(L2L_ERR_INVALID,
                "head (vocab %lld, dim %lld) and embedding (vocab %lld, dim %lld) differ",
                (long long)h->vocab, (long long)h->dim, (long long)e->vocab, (long long)e->dim);
  if (l2l_pool_domain(head->pool) != l2l_pool_domain(embedding->pool))
    return FAIL(L2L_ERR_INVALID, "head is in pool '%s' but embedding in '%s'",
                l2l_pool_name(head->pool), l2l_pool_name(embedding->pool));
  int proj = head->role[HEAD_PROJ];
  l2l_param *wte = embedding->params[embedding->role[EMBED_WTE]];
  if (head->params[proj] == wte) return L2L_OK;
  atomic_fetch_add(&wte->users, 1);
  param_release(head->params[proj]);
  head->params[proj] = wte;
  return L2L_OK;
}

l2l_status l2l_layer_get_config(l2l_layer_config *out, const l2l_layer *layer) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!layer_ok(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  *out = layer->config;
  return L2L_OK;
}

l2l_status l2l_layer_set_memory(l2l_layer *layer, l2l_memory_mode memory) {
  if (!layer_ok(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  if (memory != L2L_MEMORY_STANDARD && memory != L2L_MEMORY_FRUGAL)
    return FAIL(L2L_ERR_INVALID, "memory must be standard (0) or frugal (1), got %d", memory);
  layer->config.memory = memory;
  return L2L_OK;
}

uint32_t l2l_layer_rng_id(const l2l_layer *layer) { return layer_ok(layer) ? layer->rng_id : 0; }

l2l_status l2l_layer_set_rng_id(l2l_layer *layer, uint32_t rng_id) {
  if (!layer_ok(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  if (rng_id >= (1u << 24)) return FAIL(L2L_ERR_INVALID, "rng_id must be below 2^24, got %u", rng_id);
  layer->rng_id = rng_id;
  return L2L_OK;
}

int l2l_layer_param_count(const l2l_layer *layer) { return layer_ok(layer) ? layer->nparams : -1; }

l2l_param *l2l_layer_param(const l2l_layer *layer, int index) {
  if (!layer_ok(layer) || index < 0 || index >= layer->nparams) return NULL;
  return layer->params[index];
}

int64_t l2l_layer_nparams(const l2l_layer *layer) {
  if (!layer_ok(layer)) return -1;
  int64_t n = 0;
  for (int i = 0; i < layer->nparams; i++) n += layer->params[i]->value->numel;
  return n;
}

l2l_status l2l_layer_zero_grad(l2l_layer *layer) {
  if (!layer_ok(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  for (int i = 0; i < layer->nparams; i++) TRY(l2l_tensor_fill(layer->params[i]->grad, 0.0));
  return L2L_OK;
}

static uint64_t param_bytes(const l2l_layer *layer) {
  uint64_t bytes = 0;
  for (int i = 0; i < layer->nparams; i++)
    bytes += l2l_pool_accounted((uint64_t)layer->params[i]->value->numel * sizeof(float));
  return bytes;
}

/* Bytes of the cast scratch for 16-bit weights of `precision` (f32: none). */
static uint64_t cast_bytes(const l2l_layer *layer, int64_t batch, int64_t seq,
                           l2l_dtype precision) {
  const struct layer_kind_ops *k = kind_ops(layer->config.kind);
  if (precision == L2L_F32 || k->cast_elements == NULL) return 0;
  struct arena a = {0};
  l2l_arena_reserve(&a, (uint64_t)k->cast_elements(layer, batch, seq) * l2l_dtype_size(precision));
  return a.bytes;
}

/* The dtype of the layer's bound 16-bit weights, f32 when none is. */
static l2l_dtype layer_precision(const l2l_layer *layer) {
  for (int i = 0; i < layer->nparams; i++)
    if (layer->params[i]->value->dtype != L2L_F32) return layer->params[i]->value->dtype;
  return L2L_F32;
}

/* Work arenas: the kind's buffers first, then the cast scratch. */
static void memory_for(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch,
                       int64_t seq, uint32_t flags, l2l_dtype precision) {
  memset(out, 0, sizeof *out);
  kind_ops(layer->config.kind)->memory(out, layer, batch, seq, flags);
  struct arena fwd = {out->work_forward}, bwd = {out->work_backward};
  uint64_t cast = cast_bytes(layer, batch, seq, precision);
  l2l_arena_reserve(&fwd, cast);
  l2l_arena_reserve(&bwd, cast);
  out->work_forward = fwd.bytes;
  out->work_backward = bwd.bytes;
  out->params = param_bytes(layer);
  uint64_t work = out->work_forward > out->work_backward ? out->work_forward : out->work_backward;
  out->peak = out->saved + work;
}

static uint32_t flags_now(const l2l_layer *layer, const l2l_layer_batch *batch) {
  const struct layer_kind_ops *k = kind_ops(layer->config.kind);
  return k->choose_flags ? k->choose_flags(layer, batch) : 0;
}

bool l2l_layernorm_guarded(const float *weight, const float *bias, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    float w = fabsf(weight[j]);
    if (!(w >= 1e-6f) || w * 64.0f < fabsf(bias[j])) return true;
  }
  return false;
}

l2l_status l2l_cast_activation(const struct layer_call *call, const void **out, const float *a,
                               int64_t n, l2l_dtype dtype, int64_t at) {
  if (dtype == L2L_F32) {
    *out = a;
    return L2L_OK;
  }
  void *dst = (uint16_t *)call->cast + at;
  int64_t bad = -1;
  TRY(call->ops->convert(dst, dtype, a, L2L_F32, n, &bad));
  *out = dst;
  return L2L_OK;
}

l2l_status l2l_gemm_weight(const struct layer_call *call, float *c, const float *a,
                           struct weight w, int64_t at, int64_t m, int64_t n, int64_t k,
                           int trans_a, int trans_w, float alpha, float beta) {
  const void *ar = NULL;
  TRY(l2l_cast_activation(call, &ar, a, m * k, w.dtype, at));
  return call->ops->gemm_batched(c, ar, w.data, w.dtype, 1, m, n, k, trans_a, trans_w, alpha,
                                 beta);
}

l2l_status l2l_linear_forward(const struct layer_call *call, float *y, const float *x,
                              struct weight w, const float *bias, int64_t n, int64_t in,
                              int64_t out) {
  TRY(l2l_gemm_weight(call, y, x, w, 0, n, out, in, 0, 0, 1.0f, 0.0f));
  return bias ? call->ops->bias_add(y, bias, n, out) : L2L_OK;
}

l2l_status l2l_linear_backward(const struct layer_call *call, float *dx, float *dw, float *db,
                               const float *dy, const float *x, struct weight w, int64_t n,
                               int64_t in, int64_t out, float dx_beta) {
  const struct l2l_backend_ops *ops = call->ops;
  /* dw accumulates in f32 from x and dy rounded like the weight (both 16-bit, or both f32) */
  const void *xr = NULL, *dyr = NULL;
  TRY(l2l_cast_activation(call, &dyr, dy, n * out, w.dtype, 0));
  TRY(l2l_cast_activation(call, &xr, x, n * in, w.dtype, n * out));
  TRY(ops->gemm_batched(dw, xr, dyr, w.dtype, 1, in, out, n, 1, 0, 1.0f, 1.0f));
  if (db) TRY(ops->bias_backward(db, dy, n, out));
  return dx ? ops->gemm_batched(dx, dyr, w.data, w.dtype, 1, n, in, out, 0, 1, 1.0f, dx_beta)
            : L2L_OK;
}

l2l_status l2l_layer_memory_use(l2l_layer_memory *out, const l2l_layer *layer,
                                int64_t micro_batch, int64_t seq) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!layer_ok(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  if (micro_batch < 1 || seq < 1 || micro_batch > (INT64_C(1) << 24) || seq > (INT64_C(1) << 24))
    return FAIL(L2L_ERR_INVALID, "micro_batch and seq must be 1 to 2^24, got %lld and %lld",
                (long long)micro_batch, (long long)seq);
  memory_for(out, layer, micro_batch, seq, flags_now(layer, NULL), L2L_F32);
  return L2L_OK;
}

void l2l_layer_memory_in(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch,
                         int64_t seq, l2l_dtype precision) {
  memory_for(out, layer, batch, seq, flags_now(layer, NULL), precision);
}

/* ---------------------------------------------------------------- call checks */

/* B and S of a call: from tokens for the embedding, else from x (B,S,D). */
static l2l_status call_shape(const char *func, const l2l_layer *layer, const l2l_tensor *x,
                             const l2l_layer_batch *b, int64_t *batch, int64_t *seq) {
  const l2l_layer_config *c = &layer->config;
  if (c->kind == L2L_LAYER_EMBEDDING) {
    if (x != NULL) return l2l_fail_in(func, L2L_ERR_INVALID, "x must be NULL for an embedding (it reads batch->tokens)");
    const l2l_tensor *t = b->tokens;
    if (t == NULL || !l2l_tensor_ok(t) || t->ndim != 2 || t->dtype != L2L_I32)
      return l2l_fail_in(func, L2L_ERR_INVALID, "batch->tokens must be a live (B,S) i32 tensor");
    *batch = t->shape[0];
    *seq = t->shape[1];
    if (*seq > c->max_seq)
      return l2l_fail_in(func, L2L_ERR_INVALID, "sequence length %lld exceeds max_seq %lld",
                         (long long)*seq, (long long)c->max_seq);
    return L2L_OK;
  }
  if (x == NULL || !l2l_tensor_ok(x) || x->ndim != 3)
    return l2l_fail_in(func, L2L_ERR_INVALID, "x must be a live (B,S,%lld) f32 tensor",
                       (long long)c->dim);
  *batch = x->shape[0];
  *seq = x->shape[1];
  int64_t dims[3] = {*batch, *seq, c->dim};
  return l2l_need_shape(func, "x", x, L2L_F32, 3, dims);
}

/* Every batch field this kind reads, for B samples of S positions. */
static l2l_status check_batch(const char *func, const l2l_layer *layer,
                              const l2l_layer_batch *b, int64_t batch, int64_t seq,
                              int domain, bool backward) {
  const l2l_layer_config *c = &layer->config;
  int64_t bs[2] = {batch, seq};
  if (b->first_sample < 0)
    return l2l_fail_in(func, L2L_ERR_INVALID, "batch->first_sample must be >= 0, got %lld",
                       (long long)b->first_sample);
  if (b->training != 0 && b->training != 1)
    return l2l_fail_in(func, L2L_ERR_INVALID, "batch->training must be 0 or 1, got %d", b->training);
  const l2l_tensor *used[3] = {NULL, NULL, NULL};
  const struct l2l_backend_ops *ops = l2l_backend_for(layer->pool);
  int64_t bad = -1;
  int32_t value = 0;
  switch (c->kind) {
    case L2L_LAYER_EMBEDDING:
      TRY(l2l_need_shape(func, "batch->tokens", b->tokens, L2L_I32, 2, bs));
      used[0] = b->tokens;
      if (c->type_vocab > 0) {
        TRY(l2l_need_shape(func, "batch->token_types", b->token_types, L2L_I32, 2, bs));
        used[1] = b->token_types;
      } else if (b->token_types != NULL) {
        return l2l_fail_in(func, L2L_ERR_INVALID, "batch->token_types given but the embedding has type_vocab 0");
      }
      break;
    case L2L_LAYER_BLOCK:
    case L2L_LAYER_CUSTOM:
      if (b->key_mask != NULL) {
        TRY(l2l_need_shape(func, "batch->key_mask", b->key_mask, L2L_U8, 2, bs));
        used[0] = b->key_mask;
      }
      break;
    case L2L_LAYER_LM_HEAD:
    case L2L_LAYER_CLASSIFIER:
      if (b->targets != NULL) {
        TRY(l2l_need_shape(func, "batch->targets", b->targets, L2L_I32,
                       c->kind == L2L_LAYER_LM_HEAD ? 2 : 1, bs));
        used[0] = b->targets;
      } else if (backward) {
        return l2l_fail_in(func, L2L_ERR_INVALID, "batch->targets is NULL: a head's backward needs targets");
      }
      if (backward && !isfinite(b->loss_scale))
        return l2l_fail_in(func, L2L_ERR_INVALID, "batch->loss_scale must be finite, got %g",
                           b->loss_scale);
      break;
  }
  for (int i = 0; i < 3; i++)
    if (used[i] && l2l_pool_domain(used[i]->storage->pool) != domain)
      return l2l_fail_in(func, L2L_ERR_INVALID, "batch tensors must be in the pools of the layer's backend (found pool '%s')",
                         l2l_pool_name(used[i]->storage->pool));
  /* Ids out of range are refused before anything runs. */
  if (c->kind == L2L_LAYER_EMBEDDING) {
    TRY(ops->find_out_of_range(&bad, &value, l2l_tensor_ptr(b->tokens), b->tokens->numel, 0,
                               (int32_t)c->vocab, 0));
    if (bad >= 0)
      return l2l_fail_in(func, L2L_ERR_INVALID, "batch->tokens[%lld] = %d is outside [0, %lld)",
                         (long long)bad, value, (long long)c->vocab);
    if (c->type_vocab > 0) {
      TRY(ops->find_out_of_range(&bad, &value, l2l_tensor_ptr(b->token_types),
                                 b->token_types->numel, 0, (int32_t)c->type_vocab, 0));
      if (bad >= 0)
        return l2l_fail_in(func, L2L_ERR_INVALID, "batch->token_types[%lld] is outside [0, %lld)",
                           (long long)bad, (long long)c->type_vocab);
    }
  } else if (used[0] && used[0] == b->targets) {
    int64_t classes = c->kind == L2L_LAYER_LM_HEAD ? c->vocab : c->classes;
    TRY(ops->find_out_of_range(&bad, &value, l2l_tensor_ptr(b->targets), b->targets->numel, 0,
                               (int32_t)classes, -1));
    if (bad >= 0)
      return l2l_fail_in(func, L2L_ERR_INVALID, "batch->targets[%lld] = %d is outside [0, %lld) and not -1",
                         (long long)bad, value, (long long)classes);
  }
  return L2L_OK;
}

/* The output's dims for B, S: activations, losses or logits. */
static int output_dims(const l2l_layer *layer, const l2l_layer_batch *b, int64_t batch,
                       int64_t seq, int64_t *dims) {
  const l2l_layer_config *c = &layer->config;
  dims[0] = batch;
  dims[1] = seq;
  switch (c->kind) {
    case L2L_LAYER_LM_HEAD:
      if (b->targets) return 2;
      dims[2] = c->vocab;
      return 3;
    case L2L_LAYER_CLASSIFIER:
      if (b->targets) return 1;
      dims[1] = c->classes;
      return 2;
    default:
      dims[2] = c->dim;
      return 3;
  }
}

static l2l_status check_params_domain(const char *func, const l2l_layer *layer, int domain) {
  for (int i = 0; i < layer->nparams; i++)
    if (l2l_pool_domain(layer->params[i]->value->storage->pool) != domain)
      return l2l_fail_in(func, L2L_ERR_INVALID,
                         "parameter '%s' is in pool '%s', not of the call's backend (copy the "
                         "layer's parameters or the activations first)",
                         layer->params[i]->name,
                         l2l_pool_name(layer->params[i]->value->storage->pool));
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
                          l2l_dtype precision) {
  uint64_t bytes = cast_bytes(layer, B, S, precision);
  if (bytes == 0) return NULL;
  return (char *)l2l_tensor_ptr(work) + (work->storage->bytes - bytes);
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

const void *l2l_layer_owner(const l2l_layer *layer) { return layer->owner; }
void l2l_layer_set_owner(l2l_layer *layer, const void *owner) { layer->owner = owner; }

l2l_status l2l_saved_move(l2l_saved *saved, l2l_pool_kind pool) {
  if (saved == NULL) return L2L_OK;
  if (saved->magic != L2L_SAVED_MAGIC) return FAIL(L2L_ERR_INVALID, "saved is not a live saved state");
  TRY(move_tensor(&saved->buffer, pool));
  TRY(move_tensor(&saved->input, pool));
  return move_tensor(&saved->output, pool);
}

uint64_t l2l_saved_pool_bytes(const l2l_saved *saved) {
  if (saved == NULL || saved->magic != L2L_SAVED_MAGIC) return 0;
  uint64_t bytes = 0;
  const l2l_tensor *held[3] = {saved->buffer, saved->input, saved->output};
  for (int i = 0; i < 3; i++)
    if (held[i]) bytes += l2l_pool_accounted(held[i]->storage->bytes);
  return bytes;
}

uint64_t l2l_saved_bytes(const l2l_saved *saved) {
  if (saved == NULL || saved->magic != L2L_SAVED_MAGIC || saved->buffer == NULL) return 0;
  return saved->buffer->storage->bytes;
}

l2l_status l2l_layer_forward(l2l_saved **saved_out, l2l_layer *layer, l2l_tensor *y,
                             const l2l_tensor *x, const l2l_layer_batch *batch) {
  const char *f = __func__;
  if (!layer_ok(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  if (batch == NULL) return FAIL(L2L_ERR_INVALID, "batch is NULL");
  int64_t B = 0, S = 0, dims[3];
  TRY(call_shape(f, layer, x, batch, &B, &S));
  int ndim = output_dims(layer, batch, B, S, dims);
  TRY(l2l_need_shape(f, "y", y, L2L_F32, ndim, dims));
  if (l2l_tensors_overlap(x, y)) return FAIL(L2L_ERR_INVALID, "x and y overlap");
  int domain = l2l_pool_domain(y->storage->pool);
  if (x && l2l_pool_domain(x->storage->pool) != domain)
    return FAIL(L2L_ERR_INVALID, "x is in pool '%s' but y in '%s'",
                l2l_pool_name(x->storage->pool), l2l_pool_name(y->storage->pool));
  TRY(check_params_domain(f, layer, domain));
  TRY(check_batch(f, layer, batch, B, S, domain, false));
  bool is_head = layer->config.kind == L2L_LAYER_LM_HEAD ||
                 layer->config.kind == L2L_LAYER_CLASSIFIER;
  bool keep = saved_out != NULL && !(is_head && batch->targets == NULL);
  if (saved_out) *saved_out = NULL;

  /* The forward always fills a saved state (its buffers are where it computes); an
     inference call drops it on return. */
  uint32_t flags = flags_now(layer, batch);
  l2l_dtype precision = layer_precision(layer);
  l2l_layer_memory mem;
  memory_for(&mem, layer, B, S, flags, precision);
  struct l2l_saved *saved = calloc(1, sizeof *saved);
  if (saved == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a saved state");
  saved->magic = L2L_SAVED_MAGIC;
  saved->kind = layer->config.kind;
  saved->batch = B;
  saved->seq = S;
  saved->flags = flags;
  l2l_tensor *work = NULL;
  l2l_status status = arena_new(&saved->buffer, y->storage->pool, mem.saved);
  if (status == L2L_OK && keep && mem.input_kept) status = reference(&saved->input, x);
  if (status == L2L_OK && keep && mem.output_kept) status = reference(&saved->output, y);
  if (status == L2L_OK) status = arena_new(&work, y->storage->pool, mem.work_forward);
  if (status == L2L_OK) {
    struct layer_call call = {l2l_backend_for(y->storage->pool), y->storage->pool, B, S, batch,
                              .keep = keep, .y = y, .x = x, .precision = precision,
                              .cast = cast_scratch(work, layer, B, S, precision)};
    status = kind_ops(layer->config.kind)->forward(
        &call, layer, l2l_tensor_ptr(y), x ? l2l_tensor_ptr(x) : NULL, saved,
        work ? l2l_tensor_ptr(work) : NULL);
  }
  l2l_tensor_free(work);
  if (status != L2L_OK || !keep) {
    l2l_saved_free(saved);
    return status;
  }
  *saved_out = saved;
  return L2L_OK;
}

l2l_status l2l_layer_backward(l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                              l2l_saved *saved, const l2l_layer_batch *batch) {
  const char *f = __func__;
  if (!layer_ok(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  if (batch == NULL) return FAIL(L2L_ERR_INVALID, "batch is NULL");
  if (saved == NULL || saved->magic != L2L_SAVED_MAGIC)
    return FAIL(L2L_ERR_INVALID, "saved is not a live saved state");
  if (saved->kind != layer->config.kind)
    return FAIL(L2L_ERR_INVALID, "saved comes from a %s layer, not a %s",
                kind_ops(saved->kind)->name, kind_ops(layer->config.kind)->name);
  if (saved->used)
    return FAIL(L2L_ERR_STATE, "saved has already served a backward (run the forward again)");
  const l2l_layer_config *c = &layer->config;
  int64_t B = saved->batch, S = saved->seq, dims[3] = {B, S, c->dim};
  bool is_head = c->kind == L2L_LAYER_LM_HEAD || c->kind == L2L_LAYER_CLASSIFIER;
  if (is_head) {
    if (dy != NULL) return FAIL(L2L_ERR_INVALID, "dy must be NULL for a head (batch->loss_scale is used)");
  } else {
    TRY(l2l_need_shape(f, "dy", dy, L2L_F32, 3, dims));
  }
  if (c->kind == L2L_LAYER_EMBEDDING) {
    if (dx != NULL) return FAIL(L2L_ERR_INVALID, "dx must be NULL for an embedding");
  } else {
    TRY(l2l_need_shape(f, "dx", dx, L2L_F32, 3, dims));
  }
  if (l2l_tensors_overlap(dx, dy)) return FAIL(L2L_ERR_INVALID, "dx and dy overlap");
  const l2l_tensor *any = dx ? dx : dy;
  l2l_pool_kind pool = any ? any->storage->pool : saved->buffer ? saved->buffer->storage->pool
                                                                 : layer->pool;
  int domain = l2l_pool_domain(pool);
  if (dx && dy && l2l_pool_domain(dy->storage->pool) != domain)
    return FAIL(L2L_ERR_INVALID, "dx is in pool '%s' but dy in '%s'",
                l2l_pool_name(dx->storage->pool), l2l_pool_name(dy->storage->pool));
  if (saved->buffer && l2l_pool_domain(saved->buffer->storage->pool) != domain)
    return FAIL(L2L_ERR_INVALID, "saved is in pool '%s', not of the backend of dx/dy",
                l2l_pool_name(saved->buffer->storage->pool));
  TRY(check_params_domain(f, layer, domain));
  TRY(check_batch(f, layer, batch, B, S, domain, true));
  if (c->kind == L2L_LAYER_EMBEDDING && (batch->tokens->shape[0] != B || batch->tokens->shape[1] != S))
    return FAIL(L2L_ERR_INVALID, "batch->tokens is not the forward's shape");
  if (l2l_tensors_overlap(dx, saved->input) || l2l_tensors_overlap(dx, saved->output))
    return FAIL(L2L_ERR_INVALID, "dx overlaps a tensor the saved state reads");

  l2l_dtype precision = layer_precision(layer);
  l2l_layer_memory mem;
  memory_for(&mem, layer, B, S, saved->flags, precision);
  l2l_tensor *work = NULL;
  TRY(arena_new(&work, pool, mem.work_backward));
  struct layer_call call = {l2l_backend_for(pool), pool, B, S, batch, .dx = dx, .dy = dy,
                            .precision = precision,
                            .cast = cast_scratch(work, layer, B, S, precision)};
  l2l_status status = kind_ops(c->kind)->backward(
      &call, layer, dx ? l2l_tensor_ptr(dx) : NULL, dy ? l2l_tensor_ptr(dy) : NULL, saved,
      work ? l2l_tensor_ptr(work) : NULL);
  l2l_tensor_free(work);
  if (status == L2L_OK) saved->used = true;
  return status;
}
