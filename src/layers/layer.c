/* SPDX-License-Identifier: MIT */
/* layer.c — what every layer kind shares: parameters, construction, clones, and the
 * layer's settings.
 *
 * Purpose: a layer is a config, a random stream id and a list of parameter records (value
 * and gradient, refcounted so that a tied table serves two layers: l2l_layer_tie); the kind's file
 * (registry.c finds it) says which records it has. Calls, their checks and memory plans
 * are call.c's; the linear maps the kinds share, kind_math.c's.
 * Must never: free a parameter record that another layer still uses, or leave a layer
 * half-made when its construction fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kind.h"

/* ---------------------------------------------------------------- parameters */

static void param_release(l2l_param *param) {
  if (param == NULL || atomic_fetch_sub(&param->users, 1) != 1) return;
  param_bind(param, NULL, NULL);
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
  /* in host memory the accumulator's pages stay untouched until a gradient comes (they
     read as zero): a model made for a relay whose EPS lives mostly on disk does not hold
     4 bytes a parameter for it meanwhile */
  if (status == L2L_OK && pool == L2L_POOL_HOST)
    pool_zero_pages(pool, l2l_tensor_data(param->grad),
                    (uint64_t)l2l_tensor_numel(param->grad) * sizeof(float));
  else if (status == L2L_OK) status = l2l_tensor_fill(param->grad, 0.0);
  if (status != L2L_OK) {
    param_release(param);
    return status;
  }
  *out = param;
  return L2L_OK;
}

l2l_status layer_add_param(l2l_layer *layer, int role, const char *name, int ndim,
                           const int64_t *shape, char init, float std, int decays) {
  int index = layer->nparams;
  if (layer->describe != NULL) {   /* l2l_layer_config_params: the record's description only */
    l2l_param_info *info = &layer->describe[layer->nparams++];
    snprintf(info->name, sizeof info->name, "%s", name);
    info->ndim = ndim;
    for (int i = 0; i < ndim; i++) info->shape[i] = shape[i];
    info->decays = decays;
    layer->role[role] = (int8_t)index;
    return L2L_OK;
  }
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

const char *l2l_param_name(const l2l_param *param) {
  return param_live(param) ? param->name : NULL;
}
l2l_tensor *param_value(const l2l_param *param) { return param_live(param) ? param->value : NULL; }
int64_t l2l_param_numel(const l2l_param *param) {
  return param_live(param) ? l2l_tensor_numel(param->value) : -1;
}
l2l_tensor *l2l_param_value(const l2l_param *param) {
  l2l_tensor *value = param_value(param);
  tensor_hand_out(value);
  return value;
}
l2l_tensor *param_grad(const l2l_param *param) { return param_live(param) ? param->grad : NULL; }
l2l_tensor *l2l_param_grad(const l2l_param *param) {
  l2l_tensor *grad = param_grad(param);
  tensor_hand_out(grad);
  return grad;
}
int l2l_param_users(const l2l_param *param) {
  return param_live(param) ? atomic_load(&param->users) : -1;
}
int l2l_param_decays(const l2l_param *param) { return param_live(param) ? param->decays : -1; }
bool param_low_precision(const l2l_param *param) { return param->low_precision; }

void layer_mark_low_precision(l2l_layer *layer, int role) {
  if (layer->describe != NULL) return;
  layer->params[layer->role[role]]->low_precision = true;
}

/* dst := src's values in dst's dtype (to nearest even, or exactly), in whatever pools
   they are. A cast stays within one backend, so between the device and the host it is
   made on the host's side (a bf16 master on a GPU copied home, then widened; a host
   value rounded, then copied there): the transient copy is in host memory. */
static l2l_status values_into(l2l_tensor *dst, const l2l_tensor *src) {
  bool from_device = src->storage->pool == L2L_POOL_DEVICE;
  if (dst->dtype == src->dtype) return l2l_tensor_copy(dst, src);
  if (from_device == (dst->storage->pool == L2L_POOL_DEVICE)) return l2l_tensor_cast(dst, src);
  l2l_tensor *between = NULL;   /* (on the host: src's dtype, or dst's) */
  TRY(tensor_new_like(&between, from_device ? dst->storage->pool : src->storage->pool,
                      from_device ? src->dtype : dst->dtype, src));
  l2l_status status = from_device ? l2l_tensor_copy(between, src) : l2l_tensor_cast(between, src);
  if (status == L2L_OK) status = from_device ? l2l_tensor_cast(dst, between) : l2l_tensor_copy(dst, between);
  l2l_tensor_free(between);
  return status;
}

int l2l_param_shape(const l2l_param *param, int64_t *dims) {
  if (!param_live(param) || dims == NULL) return -1;
  int ndim = l2l_tensor_ndim(param->value);
  for (int i = 0; i < ndim; i++) dims[i] = l2l_tensor_dim(param->value, i);
  return ndim;
}

uint64_t param_writes(const l2l_param *param) { return atomic_load(&param->writes); }

l2l_status l2l_param_write(l2l_param *param, const l2l_tensor *src) {
  if (!param_live(param)) return FAIL(L2L_ERR_INVALID, "param is not a live parameter");
  TRY(tensor_check(__func__, "src", src));
  char what[L2L_PARAM_NAME + 16];
  snprintf(what, sizeof what, "parameter '%s'", param->name);
  TRY(core_same_shape(__func__, "src", src, what, param->value));
  if (src->dtype != L2L_F32 && src->dtype != L2L_F16 && src->dtype != L2L_BF16)
    return FAIL(L2L_ERR_INVALID, "src is %s: a parameter takes f32, f16 or bf16 values",
                l2l_dtype_name(src->dtype));
  if (param->home_value != NULL)
    return FAIL(L2L_ERR_STATE, "parameter '%s' is bound to other tensors (a relay's step is "
                "running it)", param->name);
  TRY_AS(values_into(param->value, src));
  atomic_fetch_add(&param->writes, 1);
  return L2L_OK;
}

/* *t replaced by a tensor of `dtype` in `pool` holding its values (values_into). */
static l2l_status rehome(const l2l_param *param, l2l_tensor **t, l2l_pool_kind pool,
                         l2l_dtype dtype) {
  if (param->home_value != NULL)
    return FAIL(L2L_ERR_STATE, "parameter '%s' is bound to other tensors", param->name);
  if ((*t)->dtype == dtype && (*t)->storage->pool == pool) return L2L_OK;
  l2l_tensor *fresh = NULL;
  TRY(tensor_new_like(&fresh, pool, dtype, *t));
  l2l_status status = values_into(fresh, *t);
  if (status != L2L_OK) {
    l2l_tensor_free(fresh);
    return status;
  }
  l2l_tensor_free(*t);
  *t = fresh;
  return L2L_OK;
}

l2l_status param_rehome(l2l_param *param, l2l_pool_kind pool, l2l_dtype dtype) {
  return rehome(param, &param->value, pool, dtype);
}

l2l_status param_rehome_grad(l2l_param *param, l2l_pool_kind pool) {
  return rehome(param, &param->grad, pool, L2L_F32);
}

void param_set_guard_copy(l2l_param *param, const l2l_tensor *copy) { param->guard_copy = copy; }

void param_adopt(l2l_param *param, l2l_tensor *value, l2l_tensor *grad) {
  l2l_tensor_free(param->value), param->value = value;
  l2l_tensor_free(param->grad), param->grad = grad;
}

void param_bind(l2l_param *param, l2l_tensor *value, l2l_tensor *grad) {
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
static atomic_uint_fast64_t next_serial = 1;

void l2l_layer_free(l2l_layer *layer) {
  if (!layer_live(layer)) return;
  if (layer->owner != NULL) {   /* the relay still runs it: freed when it lets it go */
    layer->free_pending = true;
    return;
  }
  for (int i = 0; i < layer->nparams; i++) param_release(layer->params[i]);
  const struct layer_kind_ops *kind = layer_kind_of(layer);
  if (kind->release) kind->release(layer);
  layer->magic = 0;
  free(layer);
}

l2l_status layer_alloc(l2l_layer **out, const l2l_layer_config *config,
                              l2l_pool_kind pool) {
  l2l_layer *layer = calloc(1, sizeof *layer);
  if (layer == NULL) return core_fail(L2L_ERR_NOMEM, "no memory for a layer");
  layer->magic = L2L_LAYER_MAGIC;
  layer->config = *config;
  layer->pool = pool;
  layer->rng_id = atomic_fetch_add(&next_rng_id, 1) & 0xffffffu;
  layer->serial = atomic_fetch_add(&next_serial, 1);
  memset(layer->role, -1, sizeof layer->role);
  *out = layer;
  return L2L_OK;
}

l2l_status l2l_layer_new(l2l_layer **out, const l2l_layer_config *config, l2l_pool_kind pool) {
  cpu_runtime_init();
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY_AS(layer_check_config(config));
  if (!pool_valid((int)pool)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", pool);
  l2l_layer *layer = NULL;
  TRY_AS(layer_alloc(&layer, config, pool));
  l2l_status status = kind_ops(config->kind)->create_params(layer);
  if (status != L2L_OK) {
    l2l_layer_free(layer);
    return error_as(__func__, status);
  }
  *out = layer;
  return L2L_OK;
}

l2l_status l2l_layer_config_params(l2l_param_info *out, int capacity, int *count,
                                   const l2l_layer_config *config) {
  if (count == NULL) return FAIL(L2L_ERR_INVALID, "count is NULL");
  if (out == NULL && capacity != 0) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY_AS(layer_check_config(config));
  /* The kind's own create_params runs on a stand-in layer that describes instead of
     allocating, so the names and shapes cannot drift from what l2l_layer_new makes. */
  l2l_param_info infos[L2L_LAYER_MAX_PARAMS];
  l2l_layer stand_in = {.config = *config, .describe = infos};
  memset(stand_in.role, -1, sizeof stand_in.role);
  TRY_AS(kind_ops(config->kind)->create_params(&stand_in));
  *count = stand_in.nparams;
  if (capacity < stand_in.nparams)
    return FAIL(L2L_ERR_INVALID, "out has room for %d records, the layer has %d", capacity,
                stand_in.nparams);
  memcpy(out, infos, (size_t)stand_in.nparams * sizeof *infos);
  return L2L_OK;
}

l2l_status l2l_layer_clone(l2l_layer **out, const l2l_layer *layer) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!layer_live(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  l2l_layer *copy = NULL;
  TRY_AS(layer_alloc(&copy, &layer->config, layer->pool));
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
    /* a relay's bf16 master (param_rehome) widens exactly into the copy's f32 */
    status = values_into(q->value, p->value);
  }
  if (status != L2L_OK) {
    l2l_layer_free(copy);
    return error_as(__func__, status);
  }
  *out = copy;
  return L2L_OK;
}

l2l_status l2l_layer_tie(l2l_layer *head, l2l_layer *embedding) {
  if (!layer_live(head) || head->config.kind != L2L_LAYER_LM_HEAD)
    return FAIL(L2L_ERR_INVALID, "head must be a live LM head layer");
  if (!layer_live(embedding) || embedding->config.kind != L2L_LAYER_EMBEDDING)
    return FAIL(L2L_ERR_INVALID, "embedding must be a live embedding layer");
  /* A relay's EPS holds the head's records: swapping one under it would leave the EPS
     with a freed record and none for the new one. (The embedding may be in a relay: the
     head then joins it already sharing the record the EPS has.) */
  if (head->owner != NULL)
    return FAIL(L2L_ERR_STATE, "head is in a relay: tie it before it joins one");
  const l2l_layer_config *h = &head->config, *e = &embedding->config;
  if (h->vocab != e->vocab || h->dim != e->dim)
    return FAIL(L2L_ERR_INVALID,
                "head (vocab %lld, dim %lld) and embedding (vocab %lld, dim %lld) differ",
                (long long)h->vocab, (long long)h->dim, (long long)e->vocab, (long long)e->dim);
  if (backend_pool_domain(head->pool) != backend_pool_domain(embedding->pool))
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
  if (!layer_live(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  *out = layer->config;
  return L2L_OK;
}

l2l_status l2l_layer_set_memory(l2l_layer *layer, l2l_memory_mode memory) {
  if (!layer_live(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  if (memory != L2L_MEMORY_STANDARD && memory != L2L_MEMORY_FRUGAL)
    return FAIL(L2L_ERR_INVALID, "memory must be standard (0) or frugal (1), got %d", memory);
  layer->config.memory = memory;
  return L2L_OK;
}

uint32_t l2l_layer_rng_id(const l2l_layer *layer) {
  return layer_live(layer) ? layer->rng_id : 0;
}

l2l_status l2l_layer_set_rng_id(l2l_layer *layer, uint32_t rng_id) {
  if (!layer_live(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  if (rng_id >= (1u << 24)) return FAIL(L2L_ERR_INVALID, "rng_id must be below 2^24, got %u", rng_id);
  layer->rng_id = rng_id;
  return L2L_OK;
}

int l2l_layer_param_count(const l2l_layer *layer) {
  return layer_live(layer) ? layer->nparams : -1;
}

l2l_param *l2l_layer_param(const l2l_layer *layer, int index) {
  if (!layer_live(layer) || index < 0 || index >= layer->nparams) return NULL;
  return layer->params[index];
}

int64_t l2l_layer_nparams(const l2l_layer *layer) {
  if (!layer_live(layer)) return -1;
  int64_t n = 0;
  for (int i = 0; i < layer->nparams; i++) n += layer->params[i]->value->numel;
  return n;
}

l2l_status l2l_layer_zero_grad(l2l_layer *layer) {
  if (!layer_live(layer)) return FAIL(L2L_ERR_INVALID, "layer is not a live layer");
  for (int i = 0; i < layer->nparams; i++) TRY_AS(l2l_tensor_fill(layer->params[i]->grad, 0.0));
  return L2L_OK;
}
