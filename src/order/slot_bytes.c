/* SPDX-License-Identifier: MIT */
/* slot_bytes.c — the device's parameter and gradient slots: what a layer's records take
 * in them, and which parameter slot a visit's layer copies into.
 *
 * Purpose: the relay sizes its slots (the largest layer's), lays records out in them and
 * chooses among them by these rules, and the planner counts the same bytes and the same
 * copies in its replay and its time model.
 * Must never: differ from how the pool counts an allocation (each record rounded to
 * L2L_ALIGN, as a slot's views start on it).
 */
#include "order.h"

l2l_dtype order_slot_dtype(const l2l_param *param, enum order_slot_content content,
                           l2l_dtype precision, l2l_dtype grad_precision) {
  bool low = param_low_precision(param);
  switch (content) {
    case ORDER_SLOT_VALUES: return low ? precision : L2L_F32;
    case ORDER_SLOT_GRADS: return L2L_F32;
    default: return low ? grad_precision : L2L_F32;
  }
}

uint64_t order_param_slot_bytes(const l2l_param *param, enum order_slot_content content,
                                l2l_dtype precision, l2l_dtype grad_precision, bool on_device) {
  l2l_dtype dtype = order_slot_dtype(param, content, precision, grad_precision);
  if (content == ORDER_SLOT_GRADS_OUT && dtype == L2L_F32) return 0;
  if (content == ORDER_SLOT_VALUES && on_device) return 0;
  return pool_accounted((uint64_t)l2l_tensor_numel(param_value(param)) *
                        l2l_dtype_size(dtype));
}

uint64_t order_layer_slot_bytes(const struct order_layer *layer, enum order_slot_content content,
                                l2l_dtype precision, l2l_dtype grad_precision) {
  uint64_t n = 0;
  for (int i = 0; i < l2l_layer_param_count(layer->layer); i++)
    n += order_param_slot_bytes(l2l_layer_param(layer->layer, i), content, precision,
                                grad_precision, layer->on_device >> i & 1);
  return n;
}

int order_largest_layer(const struct order *sc, enum order_slot_content content,
                        l2l_dtype precision, l2l_dtype grad_precision, uint64_t *bytes) {
  int largest = 0;
  uint64_t most = 0;
  for (int k = 0; k < sc->L; k++) {
    uint64_t n = order_layer_slot_bytes(&sc->layers[k], content, precision, grad_precision);
    if (n > most) most = n, largest = k;
  }
  *bytes = most > L2L_ALIGN ? most : L2L_ALIGN;
  return largest;
}

uint64_t order_slot_size(const struct order *sc, enum order_slot_content content,
                         l2l_dtype precision, l2l_dtype grad_precision) {
  uint64_t bytes;
  order_largest_layer(sc, content, precision, grad_precision, &bytes);
  return bytes;
}

uint64_t order_slots_bytes(const struct order *sc, int param_slots, l2l_dtype precision,
                           l2l_dtype grad_precision) {
  uint64_t values = order_slot_size(sc, ORDER_SLOT_VALUES, precision, grad_precision);
  uint64_t grads = order_slot_size(sc, ORDER_SLOT_GRADS, precision, grad_precision);
  if (grad_precision != L2L_F32)
    grads += order_slot_size(sc, ORDER_SLOT_GRADS_OUT, precision, grad_precision);
  return (uint64_t)(param_slots > 0 ? param_slots : 2) * values + (sc->training ? 2 * grads : 0);
}

int order_slot_choose(struct order_slot *slots, int nslots, int k, int busy, int64_t tick,
                      bool (*current)(void *ctx, int i), void *ctx, bool *reused) {
  int pick = -1;
  *reused = false;
  for (int i = 0; i < nslots; i++) {
    if (i == busy) continue;
    if (slots[i].held == k && (current == NULL || current(ctx, i))) {
      *reused = true;
      pick = i;
      break;
    }
    if (pick < 0 || slots[i].last_used < slots[pick].last_used) pick = i;
  }
  if (!*reused) slots[pick].held = -1;   /* its contents are about to change */
  slots[pick].last_used = tick;
  return pick;
}
