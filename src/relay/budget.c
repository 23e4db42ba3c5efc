/* SPDX-License-Identifier: MIT */
/* budget.c — whether a step fits the relay's device budget and the device pool's, before
 * it runs.
 *
 * Purpose: refuse a step that cannot run, at once and with the numbers, instead of
 * failing half-way: a training step is replayed by the planner (plan_step_peak: the
 * relay's own order of allocations, exact to the byte; with swap, the bound that holds
 * whatever the copies' timing), and a budget under its peak is refused with the
 * smallest budget that works and what needs it: the relay's own (config.device_budget,
 * the step's bytes alone) and the pool's (the process's cap, less what is in use). The replay is made again only when what
 * it depends on changed (the active layers and their policies and memory statements, which
 * the frugal modes' LayerNorm guard changes with the weights, the batch's shape, the
 * settings, training or evaluating). An evaluation is replayed the same way: the schedule
 * it walks has no backward and keeps nothing.
 * Must never: change anything but the replay's cache; allocate device memory.
 */
#include <stdio.h>
#include <stdlib.h>

#include "plan/plan.h"
#include "relay.h"

/* What the replay depends on, hashed (FNV-1a): a step like the last one is not replayed. */
static void mix(uint64_t *h, uint64_t v) {
  for (int b = 0; b < 8; b++) *h = (*h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
}

uint64_t relay_step_key(const struct step *s, bool placement) {
  uint64_t h = 1469598103934665603ull;
  const l2l_relay_config *c = &s->run->config;
  const uint64_t shape[] = {(uint64_t)s->B, (uint64_t)s->S, (uint64_t)s->mb, (uint64_t)s->L,
                            s->training,
                            s->in->token_types != NULL, s->in->key_mask != NULL};
  for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) mix(&h, shape[i]);
  for (int i = 0; i < options_count; i++)   /* the options the option table marks STEP */
    if (options_rows[i].flags & L2L_OPTION_STEP)
      mix(&h, (uint64_t)option_word(&options_rows[i], option_base(c, options_rows[i].group)));
  for (int k = 0; k < s->L; k++) {
    const struct relay_layer *rl = active_layer(s, k);
    l2l_layer_config lc;
    l2l_layer_get_config(&lc, rl->layer);
    mix(&h, (uint64_t)(uintptr_t)rl->layer), mix(&h, rl->frozen), mix(&h, (uint64_t)rl->stash);
    if (placement) mix(&h, relay_on_device(s->run, rl->layer));   /* (the slots follow it) */
    l2l_layer_memory m;   /* the present weights' statement: the guard flips with them */
    layer_memory_in(&m, rl->layer, s->mb, s->S, c->precision, s->training);
    mix(&h, m.saved), mix(&h, m.work_forward), mix(&h, m.work_backward);
    mix(&h, (uint64_t)rl->inner), mix(&h, (uint64_t)lc.memory), mix(&h, (uint64_t)lc.dim);
    mix(&h, (uint64_t)lc.mlp), mix(&h, (uint64_t)lc.heads), mix(&h, (uint64_t)lc.vocab);
  }
  return h;
}

struct plan_layer relay_plan_layer(const l2l_relay *run, const struct relay_layer *rl) {
  return (struct plan_layer){.layer = rl->layer, .role = layer_role(rl->layer),
                             .frozen = rl->frozen, .inner = rl->inner, .stash = rl->stash,
                             .on_device = relay_on_device(run, rl->layer)};
}

/* The planner's replay of a step of the active layers `active` (L of them). */
static l2l_status step_peak(uint64_t *peak, const l2l_relay *run, const int *active, int L,
                            int64_t B, int64_t S, int64_t mb, bool token_types, bool key_mask,
                            bool training, bool any_weights) {
  struct plan_layer *pl = calloc((size_t)L, sizeof *pl);
  if (pl == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to replay a step");
  for (int k = 0; k < L; k++) pl[k] = relay_plan_layer(run, &run->layers[active[k]]);
  l2l_status status = plan_step_peak(peak, pl, L, &run->config, B, S, mb, token_types, key_mask,
                                     training, any_weights);
  free(pl);
  return status;
}

/* The exact device peak of this step. */
static l2l_status replayed_peak(uint64_t *peak, const struct step *s) {
  l2l_relay *run = s->run;
  uint64_t key = relay_step_key(s, true);
  if (run->budget_key == key && run->budget_key_set) {
    *peak = run->budget_peak;
    return L2L_OK;
  }
  TRY(step_peak(peak, run, s->active, s->L, s->B, s->S, s->mb, s->in->token_types != NULL,
                s->in->key_mask != NULL, s->training, false));
  run->budget_key = key, run->budget_key_set = true, run->budget_peak = *peak;
  return L2L_OK;
}

l2l_status l2l_relay_step_peak(uint64_t *peak, const l2l_relay *run, int64_t batch, int64_t seq,
                               int token_types, int key_mask) {
  if (peak == NULL) return FAIL(L2L_ERR_INVALID, "peak is NULL");
  RELAY_ENTER(run);
  if (batch < 1 || seq < 1 || batch > (INT64_C(1) << 24) || seq > (INT64_C(1) << 24))
    return FAIL(L2L_ERR_INVALID, "batch and seq must be 1 to 2^24, got %lld and %lld",
                (long long)batch, (long long)seq);
  if ((token_types != 0 && token_types != 1) || (key_mask != 0 && key_mask != 1))
    return FAIL(L2L_ERR_INVALID, "token_types and key_mask must be 0 or 1");
  TRY(relay_check_model(run));
  l2l_layer_config first;
  l2l_layer_get_config(&first, run->layers[0].layer);
  if (seq > first.max_seq)
    return FAIL(L2L_ERR_INVALID, "seq %lld is more than the embedding's max_seq, %lld",
                (long long)seq, (long long)first.max_seq);
  int *active = malloc((size_t)run->count * sizeof *active);
  if (active == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to replay a step");
  for (int i = 0; i < run->count; i++) active[i] = i;
  int64_t mb = run->config.micro_batch < batch ? run->config.micro_batch : batch;
  l2l_status status = step_peak(peak, run, active, run->count, batch, seq, mb, token_types,
                                key_mask, true, true);
  free(active);
  /* the records placed on the device count against the relay's budget beside the step
     (relay_check_budget) */
  if (status == L2L_OK) *peak += eps_device_bytes(&run->eps);
  return status;
}

/* Refuses a step whose peak is over `room`, naming the smallest budget that works
   (`held` more than the peak: what else counts against that budget, which `held_is` says). */
static l2l_status refuse(const struct step *s, const char *whose, uint64_t budget, uint64_t peak,
                         uint64_t held, const char *held_is) {
  const l2l_relay_config *cfg = &s->run->config;
  uint64_t slots = order_slots_bytes(&s->order, cfg->param_slots, cfg->precision,
                                     cfg->grad_precision);
  char a[32], b[32], c[32], d[32], e[96] = "";
  uint64_t smallest = peak + held;
  if (held != 0) {
    char h[32];
    snprintf(e, sizeof e, "; %s %s", core_human_bytes(h, sizeof h, held), held_is);
  }
  return error_note_needed(FAIL(L2L_ERR_BUDGET,
              "the %s budget of %llu bytes (%s) is too small for this step: the smallest "
              "that works is %llu bytes (%s). The step needs %s on the device at its peak "
              "(the planner's replay of it, in micro-batches of %lld samples with the layers' "
              "policies), "
              "%s of them the %d parameter slots%s (each the size of the largest layer), the "
              "rest activations and working memory%s. %s need less",
              whose, (unsigned long long)budget, core_human_bytes(a, sizeof a, budget),
              (unsigned long long)smallest, core_human_bytes(b, sizeof b, smallest),
              core_human_bytes(c, sizeof c, peak), (long long)s->mb,
              core_human_bytes(d, sizeof d, slots), cfg->param_slots ? cfg->param_slots : 2,
              s->training ? " and 2 gradient slots" : "", e,
              s->training ? "A smaller micro-batch, stash = \"host\", recomputing or plan = "
                            "\"auto\" (l2l.plan)"
                          : "A smaller micro-batch would"), smallest);
}

/* The relay's own budget, then the device pool's (the process's cap: what is in use
   already, tensors and the GPU backend's own bytes, counts against it too). */
l2l_status relay_check_budget(const struct step *s) {
  uint64_t own = s->run->config.device_budget;
  l2l_pool_stats device;
  l2l_pool_get_stats(&device, L2L_POOL_DEVICE);
  if (own == 0 && device.budget == 0) return L2L_OK;
  uint64_t peak;
  TRY(replayed_peak(&peak, s));
  /* the relay's records placed on the device count against its own budget too */
  uint64_t records = eps_device_bytes(&s->run->eps);
  if (own != 0 && peak + records > own)
    return refuse(s, "relay's device", own, peak, records, "are the records placed on the device");
  uint64_t held = device.current + device.backend;
  uint64_t room = device.budget > held ? device.budget - held : 0;
  if (device.budget != 0 && peak > room)
    return refuse(s, "device pool's", device.budget, peak, held, "is in use already");
  return L2L_OK;
}
