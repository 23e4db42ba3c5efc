/* SPDX-License-Identifier: MIT */
/* budget.c — whether one layer visit fits the device's budget, before a step runs.
 *
 * Purpose: refuse a step that cannot run, at once and with the numbers, instead of
 * failing half-way. The device must hold one layer's visit: the parameter slots (at least
 * the visit's and the next one's) and, in training, the two gradient slots and their
 * 16-bit copies on the way out, each the size of the largest layer; a micro-batch's
 * input, output and gradients; the layer's working memory. This is a lower bound of the
 * relay's own accounting, and the seed of the planner's cost model (src/plan/, to come),
 * which will predict the peak exactly and choose the policies that meet the budget.
 * Must never: change anything; allocate.
 */
#include "relay.h"

/* Bytes the device holds for one visit of active layer k besides its slots. */
static uint64_t visit_bytes(const struct step *s, int k) {
  l2l_layer_memory m;
  l2l_layer_memory_in(&m, active_layer(s, k)->layer, s->mb, s->S, s->run->config.precision);
  uint64_t act = l2l_pool_accounted((uint64_t)(s->mb * s->S * s->D) * sizeof(float));
  return m.peak + 3 * act;
}

/* Bytes of the parameter and gradient slots. */
static uint64_t slots_bytes(const struct step *s) {
  const l2l_relay_config *c = &s->run->config;
  uint64_t grads = l2l_pool_accounted(relay_slot_size(s, SLOT_GRADS));
  if (c->grad_precision != L2L_F32) grads += l2l_pool_accounted(relay_slot_size(s, SLOT_GRADS_OUT));
  return (uint64_t)c->param_slots * l2l_pool_accounted(relay_slot_size(s, SLOT_VALUES)) +
         (s->training ? 2 * grads : 0);
}

l2l_status relay_check_budget(const struct step *s) {
  l2l_pool_stats device;
  l2l_pool_get_stats(&device, L2L_POOL_DEVICE);
  if (device.budget == 0) return L2L_OK;
  uint64_t slots = slots_bytes(s);
  for (int k = 0; k < s->L; k++) {
    uint64_t need = slots + visit_bytes(s, k);
    if (need <= device.budget - device.current) continue;
    char a[32], b[32];
    return FAIL(L2L_ERR_BUDGET,
                "the device budget (%llu bytes, %s free) is too small for layer %d (%s): one "
                "micro-batch of %lld needs at least %llu bytes (%s) for its parameters, "
                "gradients, activations and working memory",
                (unsigned long long)device.budget,
                l2l_human_bytes(a, sizeof a, device.budget - device.current), s->active[k],
                l2l_layer_name(active_layer(s, k)->layer), (long long)s->mb,
                (unsigned long long)need, l2l_human_bytes(b, sizeof b, need));
  }
  return L2L_OK;
}
