/* SPDX-License-Identifier: MIT */
/* kind_math.c — the arithmetic the kinds share: carving buffers out of an arena, linear maps
 * whose weight may be the relay's 16-bit copy, and the LayerNorm guard of the frugal modes.
 *
 * Purpose: one copy of the GEMM calls every kind makes, with activations rounded to a
 * 16-bit weight's dtype into the call's cast scratch (as a GPU's tensor cores read them)
 * and products accumulated in f32.
 * Must never: allocate (the call's arenas are made by call.c, sized by the kind's plan).
 */
#include <math.h>

#include "kind.h"

int64_t arena_reserve(struct arena *a, uint64_t bytes) {
  if (bytes == 0) return NO_BUFFER;
  int64_t offset = (int64_t)a->bytes;
  a->bytes += (bytes + L2L_ALIGN - 1) / L2L_ALIGN * L2L_ALIGN;
  return offset;
}

/* The tensor a LayerNorm's parameter is read from for the guard: bound by the relay, the
   call computes with an f32 device copy of the record's own f32 tensor, and no update
   changes a record during its visit (the relay waits for a record's pending update before
   it copies it, and its next update waits for this visit's gradient), so the record's own
   tensor in host memory holds the same bits, readable with no device read (on a GPU, a
   sync). A record that lives on the device is read from the host copy the relay keeps of
   it (guard_copy). Otherwise the parameter where it is. */
static const l2l_tensor *guard_source(const l2l_layer *layer, int role) {
  int i = layer->role[role];
  if (i < 0) return NULL;
  const struct l2l_param *p = layer->params[i];
  if (p->guard_copy != NULL) return p->guard_copy;
  const l2l_tensor *home = p->home_value;
  return home != NULL && home->dtype == L2L_F32 && p->value->dtype == L2L_F32 ? home : p->value;
}

bool layers_layernorm_guarded(const l2l_layer *layer, int weight_role, int bias_role) {
  /* A check that fails (a device fault, which the next op reports too) guards: the
     standard backward is right for any weights. */
  const l2l_tensor *weight = guard_source(layer, weight_role), *bias = guard_source(layer, bias_role);
  if (weight->dtype != L2L_F32 || (bias != NULL && bias->dtype != L2L_F32)) return true;
  if (bias != NULL && backend_pool_domain(bias->storage->pool) != backend_pool_domain(weight->storage->pool))
    return true;
  bool invertible = false;
  l2l_status st = backend_for(weight->storage->pool)->layernorm_invertible(
      &invertible, tensor_ptr(weight), bias != NULL ? tensor_ptr(bias) : NULL,
      layer->config.dim);
  return st != L2L_OK || !invertible;
}

l2l_status layers_cast_activation(const struct layer_call *call, const void **out, struct act a,
                                  int64_t n, l2l_dtype dtype, int64_t at) {
  if (a.dtype == dtype) {
    *out = a.data;
    return L2L_OK;
  }
  if (a.dtype != L2L_F32)   /* (a kind's bug: 16-bit activations are the weights' dtype) */
    return core_fail(L2L_ERR_STATE, "a %s activation meets a %s weight",
                     l2l_dtype_name(a.dtype), l2l_dtype_name(dtype));
  void *dst = (uint16_t *)call->cast + at;
  int64_t bad = -1;
  TRY(call->ops->convert(dst, dtype, a.data, L2L_F32, n, &bad));
  *out = dst;
  return L2L_OK;
}

l2l_status layers_gemm_weight(const struct layer_call *call, float *c, struct act a,
                              struct weight w, int64_t at, int64_t m, int64_t n, int64_t k,
                              int trans_a, int trans_w, float alpha, float beta, int64_t ldc) {
  const void *ar = NULL;
  TRY(layers_cast_activation(call, &ar, a, m * k, w.dtype, at));
  return call->ops->gemm_batched(c, ar, w.data, w.dtype, 1, m, n, k, trans_a, trans_w, alpha,
                                 beta, 0, 0, ldc);
}

l2l_status layers_linear_forward(const struct layer_call *call, float *y, void *y16,
                                 struct act x, struct weight w, const float *bias, int64_t n,
                                 int64_t in, int64_t out) {
  const void *xr = NULL;
  TRY(layers_cast_activation(call, &xr, x, n * in, w.dtype, 0));
  return call->ops->gemm_bias(y, y16, w.dtype, xr, w.data, w.dtype, bias, n, out, in, 0, 0);
}

l2l_status layers_linear_backward(const struct layer_call *call, float *dx, void *dx16, float *dw,
                                  float *db, const float *dy, const void *dy16, struct act x,
                                  struct weight w, int64_t n, int64_t in, int64_t out,
                                  float dx_beta) {
  if (dx16 != NULL && (dx_beta != 0.0f || dx == NULL))   /* (a kind's bug: a 16-bit dx is
                                                             written, not added to, beside dx) */
    return core_fail(L2L_ERR_STATE, "a 16-bit dx needs dx (its work) and cannot accumulate");
  const struct backend_ops *ops = call->ops;
  /* dw accumulates in f32 from x and dy rounded like the weight (both 16-bit, or both f32) */
  const void *xr = NULL, *dyr = NULL;
  TRY(layers_cast_activation(call, &dyr, dy16 ? (struct act){dy16, w.dtype} : act_f32(dy),
                             n * out, w.dtype, 0));
  TRY(layers_cast_activation(call, &xr, x, n * in, w.dtype, n * out));
  TRY(ops->gemm_batched(dw, xr, dyr, w.dtype, 1, in, out, n, 1, 0, 1.0f, 1.0f, 0, 0, 0));
  if (db) TRY(dy ? ops->bias_backward(db, dy, L2L_F32, n, out)
                 : ops->bias_backward(db, dy16, w.dtype, n, out));
  if (dx == NULL) return L2L_OK;
  if (dx16 != NULL)   /* (the GEMM's sums rounded into dx16: one pass where the backend can) */
    return ops->gemm_bias(dx, dx16, w.dtype, dyr, w.data, w.dtype, NULL, n, in, out, 0, 1);
  return ops->gemm_batched(dx, dyr, w.data, w.dtype, 1, n, in, out, 0, 1, 1.0f, dx_beta, 0, 0, 0);
}
