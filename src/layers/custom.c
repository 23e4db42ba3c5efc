/* SPDX-License-Identifier: MIT */
/* custom.c — layer kinds written outside the library (in Lua, or by a C program): a
 * (B,S,D) -> (B,S,D) layer whose forward and backward are the caller's functions.
 *
 * Purpose: let the relay stream, stash, recompute and update a layer it knows nothing
 * about except its parameter records. The forward keeps only a reference to x; the
 * backward gets x back and recomputes what it needs, so the saved state is exact (zero
 * bytes of its own) whatever the functions do with temporaries.
 * Must never: call the functions on any thread but the caller's (call.c only runs them
 * inside l2l_layer_forward / l2l_layer_backward), or hide their failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kind.h"

static void custom_release(l2l_layer *layer) {
  const struct custom_kind *custom = layer->custom;
  if (custom != NULL && atomic_fetch_sub(&((struct custom_kind *)custom)->refs, 1) == 1)
    free((void *)custom);
}

static l2l_status custom_check_config(const l2l_layer_config *c) {
  return layers_config_fail(c, "custom layers are made with l2l_layer_new_custom");
}

static void custom_memory(l2l_layer_memory *out, const l2l_layer *layer, int64_t batch,
                          int64_t seq, uint32_t flags) {
  (void)flags;
  out->input_kept = pool_accounted((uint64_t)(batch * seq * layer->config.dim) * sizeof(float));
}

static l2l_status custom_forward(const struct layer_call *call, l2l_layer *layer, float *y,
                                 const float *x, struct l2l_saved *saved, void *work) {
  (void)y, (void)x, (void)saved, (void)work;
  const struct custom_kind *k = layer->custom;
  if (k->forward(k->user, layer, call->y, call->x, call->b) != 0)
    return core_fail(L2L_ERR_BACKEND, "custom layer '%s': its forward failed", k->name);
  return L2L_OK;
}

static l2l_status custom_backward(const struct layer_call *call, l2l_layer *layer, float *dx,
                                  const float *dy, struct l2l_saved *saved, void *work) {
  (void)dx, (void)dy, (void)work;
  const struct custom_kind *k = layer->custom;
  if (saved->input == NULL)
    return core_fail(L2L_ERR_STATE, "custom layer '%s': the saved state holds no input", k->name);
  if (k->backward(k->user, layer, call->dx, call->dy, saved->input, call->b) != 0)
    return core_fail(L2L_ERR_BACKEND, "custom layer '%s': its backward failed", k->name);
  return L2L_OK;
}

const struct layer_kind_ops layers_custom_kind = {
    .name = "custom",
    .role = L2L_ROLE_BODY,
    .check_config = custom_check_config,
    .check_batch = layers_check_key_mask,
    .create_params = NULL,   /* l2l_layer_new_custom makes them from the caller's list */
    .choose_flags = NULL,
    .memory = custom_memory,
    .forward = custom_forward,
    .backward = custom_backward,
    .release = custom_release,
};

l2l_status l2l_layer_new_custom(l2l_layer **out, const char *name, int64_t dim,
                                const l2l_custom_param *params, int nparams,
                                l2l_custom_forward_fn forward, l2l_custom_backward_fn backward,
                                void *user, uint64_t init_seed, l2l_pool_kind pool) {
  cpu_runtime_init();
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (name == NULL || name[0] == '\0' || strlen(name) >= L2L_PARAM_NAME)
    return FAIL(L2L_ERR_INVALID, "name must be 1 to %d characters", L2L_PARAM_NAME - 1);
  if (dim < 1 || dim > (INT64_C(1) << 24))
    return FAIL(L2L_ERR_INVALID, "layer '%s': dim must be 1 to 2^24, got %lld", name, (long long)dim);
  if (nparams < 0 || nparams > L2L_LAYER_MAX_PARAMS || (nparams > 0 && params == NULL))
    return FAIL(L2L_ERR_INVALID, "layer '%s': nparams must be 0 to %d with a list, got %d", name,
                L2L_LAYER_MAX_PARAMS, nparams);
  if (forward == NULL || backward == NULL)
    return FAIL(L2L_ERR_INVALID, "layer '%s': forward and backward are required", name);
  if (!pool_valid((int)pool)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", pool);
  for (int i = 0; i < nparams; i++) {
    const l2l_custom_param *p = &params[i];
    if (p->name == NULL || p->name[0] == '\0' || strlen(p->name) >= L2L_PARAM_NAME)
      return FAIL(L2L_ERR_INVALID, "layer '%s': parameter %d's name must be 1 to %d characters",
                  name, i, L2L_PARAM_NAME - 1);
    for (int j = 0; j < i; j++)
      if (strcmp(params[j].name, p->name) == 0)
        return FAIL(L2L_ERR_INVALID, "layer '%s': two parameters are named '%s'", name, p->name);
    if (p->ndim < 1 || p->ndim > L2L_MAX_DIMS)
      return FAIL(L2L_ERR_INVALID, "layer '%s': parameter '%s' has ndim %d (1 to 4)", name,
                  p->name, p->ndim);
    for (int d = 0; d < p->ndim; d++)
      if (p->shape[d] < 1 || p->shape[d] > (INT64_C(1) << 31))
        return FAIL(L2L_ERR_INVALID, "layer '%s': parameter '%s' dim %d is %lld", name, p->name,
                    d, (long long)p->shape[d]);
    if (!isfinite(p->init_std) || p->init_std < 0 || !isfinite(p->init_value))
      return FAIL(L2L_ERR_INVALID, "layer '%s': parameter '%s' needs a finite init_std >= 0 and "
                  "init_value", name, p->name);
    if (p->decays != 0 && p->decays != 1)
      return FAIL(L2L_ERR_INVALID, "layer '%s': parameter '%s': decays must be 0 or 1", name,
                  p->name);
  }
  struct custom_kind *kind = calloc(1, sizeof *kind);
  if (kind == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for layer '%s'", name);
  atomic_init(&kind->refs, 1);
  snprintf(kind->name, sizeof kind->name, "%s", name);
  kind->forward = forward;
  kind->backward = backward;
  kind->user = user;
  l2l_layer_config config = {.kind = L2L_LAYER_CUSTOM, .dim = dim, .init_std = 1.0f,
                             .resid_std = 1.0f, .eps = 1e-5f, .init_seed = init_seed};
  l2l_layer *layer = NULL;
  l2l_status status = layer_alloc(&layer, &config, pool);
  if (status != L2L_OK) {
    free(kind);
    return error_as(__func__, status);
  }
  layer->custom = kind;
  for (int i = 0; i < nparams && status == L2L_OK; i++) {
    const l2l_custom_param *p = &params[i];
    bool random = p->init_std > 0;
    status = layer_add_param(layer, i, p->name, p->ndim, p->shape, random ? 'n' : '0',
                             p->init_std, p->decays);
    if (status == L2L_OK && !random && p->init_value != 0)
      status = l2l_tensor_fill(layer->params[i]->value, p->init_value);
  }
  if (status != L2L_OK) {
    l2l_layer_free(layer);
    return error_as(__func__, status);
  }
  *out = layer;
  return L2L_OK;
}
