/* SPDX-License-Identifier: MIT */
/* auto_plan.c — l2l_relay_plan_auto: the relay plans itself (KARMA's planner, src/plan/)
 * for a batch's shape within its device budget and applies the plan, planning again only
 * when the shape, the budgets or the model changed.
 *
 * Purpose: what `plan = "auto"` is in Lua, for every caller of the C API: one call before
 * a step. The budget is the relay's (config.device_budget); with the device pool's budget
 * set, at most what it leaves beside the tensors in use then, and a plan refused there is
 * named in the pool's terms (the smallest pool budget that works). The plan applied is the
 * relay's, freed with it or when the next plan replaces it. Placement auto (below) is the
 * same within a step: the records placed before it (src/plan/place.c), with ranks placed
 * alike on every rank.
 * Must never: change the relay when planning is refused, plan again a step like the
 * last one (planning times layers on the device), or let ranks hold records in different
 * places.
 */
#include <stdio.h>
#include <stdlib.h>

#include "plan/plan.h"
#include "relay.h"

/* What the pool holds beside the relay's own records on the device (pool: its stats). */
static uint64_t pool_held(const l2l_relay *run, const l2l_pool_stats *pool) {
  return pool->current + pool->backend - eps_device_bytes(&run->eps);
}

/* The device bytes the relay's records and steps may hold: the relay's budget, or the
   room the device pool's leaves beside what else it holds, when that is less (*held: what
   else it holds then, 0 when the relay's binds); 0: neither has one, or the pool's is spent
   (*held >= pool->budget). */
static void device_room(uint64_t *budget, uint64_t *held, const l2l_relay *run,
                        const l2l_pool_stats *pool) {
  *budget = run->config.device_budget, *held = 0;
  if (pool->budget == 0) return;
  uint64_t in_use = pool_held(run, pool), room = in_use < pool->budget ? pool->budget - in_use : 0;
  if (*budget == 0 || room < *budget) *budget = room, *held = in_use;
}

/* The device budget a plan gets (device_room): refused when spent, or when there is none. */
static l2l_status auto_budget(uint64_t *budget, uint64_t *held, const l2l_relay *run,
                              const l2l_pool_stats *pool) {
  device_room(budget, held, run, pool);
  if (pool->budget > 0 && pool_held(run, pool) >= pool->budget)
    return FAIL(L2L_ERR_BUDGET, "the device pool's budget (%llu bytes) is spent before the step "
                "(%llu bytes in use)", (unsigned long long)pool->budget,
                (unsigned long long)pool_held(run, pool));
  if (*budget == 0)
    return error_note_field(FAIL(L2L_ERR_INVALID, "plans within a device budget: the relay has none "
                                 "(" L2L_NAMED_FIELD "config->device_budget" L2L_NAMED_END ") and the device "
                                 "pool has none"),
                                "device_budget");
  return L2L_OK;
}

/* A plan for the relay's layers as they are, within budget (the pool's words when held). */
static l2l_status make_plan(l2l_plan **out, const l2l_relay *run, int64_t batch, int64_t seq,
                            int token_types, int key_mask, uint64_t budget, uint64_t held) {
  l2l_plan_rates rates;
  TRY(l2l_relay_calibrate_plan(&rates, 0));
  int n = run->count;
  l2l_layer **list = calloc((size_t)n + 1, sizeof *list);
  uint8_t *frozen = calloc((size_t)n + 1, sizeof *frozen);
  if (list == NULL || frozen == NULL) {
    free(list), free(frozen);
    return FAIL(L2L_ERR_NOMEM, "no memory to plan %d layers", n);
  }
  for (int k = 0; k < n; k++) list[k] = run->layers[k].layer, frozen[k] = run->layers[k].frozen;
  l2l_plan_request q = {.batch = batch, .seq = seq, .device_budget = budget,
                        .token_types = token_types, .key_mask = key_mask, .frozen = frozen,
                        .rates = &rates};
  l2l_status status = l2l_plan_new(out, list, n, &run->config, &q);
  free(list), free(frozen);
  uint64_t needed = 0;
  if (status == L2L_ERR_BUDGET) {
    l2l_error_detail d;
    l2l_last_error_detail(&d);
    needed = d.needed_bytes;
  }
  if (needed == 0) return status;
  if (held == 0)
    return error_note_needed(FAIL(status, "no plan fits the relay's device budget of %llu bytes: "
                                  "the smallest budget that works is %llu bytes",
                                  (unsigned long long)budget, (unsigned long long)needed), needed);
  return error_note_needed(
      FAIL(status, "no plan fits what the device pool's budget leaves (%llu bytes): the smallest device "
           "pool budget that works is %llu bytes (the plan's %llu and %llu in use)",
           (unsigned long long)budget, (unsigned long long)(needed + held),
           (unsigned long long)needed, (unsigned long long)held), needed + held);
}

/* Whether the relay's plan was made for this request and its layers as they are. */
static bool plan_holds(const l2l_relay *run, const int64_t key[6]) {
  if (run->auto_plan == NULL) return false;
  for (int i = 0; i < 6; i++)
    if (run->auto_key[i] != key[i]) return false;
  return relay_check_plan(run, run->auto_plan) == L2L_OK;
}

l2l_status l2l_relay_plan_auto(const l2l_plan **out, l2l_relay *run, int64_t batch, int64_t seq,
                               int token_types, int key_mask) {
  RELAY_ENTER(run);
  if (batch < 1 || seq < 1)
    return FAIL(L2L_ERR_INVALID, "batch and seq must be >= 1, got %lld and %lld", (long long)batch,
                (long long)seq);
  if ((token_types != 0 && token_types != 1) || (key_mask != 0 && key_mask != 1))
    return FAIL(L2L_ERR_INVALID, "token_types and key_mask must be 0 or 1");
  if (run->count < 2)
    return FAIL(L2L_ERR_INVALID, "the relay has %d layers: a plan needs an input layer and a head",
                run->count);
  l2l_pool_stats pool;
  TRY_AS(l2l_pool_get_stats(&pool, L2L_POOL_DEVICE));
  uint64_t budget, held;
  TRY_AS(auto_budget(&budget, &held, run, &pool));
  int64_t key[6] = {batch, seq, token_types, key_mask, (int64_t)run->config.device_budget,
                    (int64_t)pool.budget};
  if (!plan_holds(run, key)) {
    l2l_plan *plan = NULL;
    TRY_AS(make_plan(&plan, run, batch, seq, token_types, key_mask, budget, held));
    l2l_status status = relay_apply_plan(run, plan);   /* (made for these layers: applies) */
    if (status != L2L_OK) {
      l2l_plan_free(plan);
      return error_as(__func__, status);
    }
    l2l_plan_free(run->auto_plan);
    run->auto_plan = plan;
    for (int i = 0; i < 6; i++) run->auto_key[i] = key[i];
  }
  if (out != NULL) *out = run->auto_plan;
  return L2L_OK;
}

/* ---------------------------------------------------------------- placement auto */

/* The budget placement auto places within (none: UINT64_MAX), and the key of a placement
   for it: a step like the last one placed, within the same budget, is not placed again. */
static uint64_t place_key(const struct step *s, uint64_t *budget) {
  l2l_pool_stats pool;
  l2l_pool_get_stats(&pool, L2L_POOL_DEVICE);
  uint64_t held;
  device_room(budget, &held, s->run, &pool);
  if (s->run->config.device_budget == 0 && pool.budget == 0) *budget = UINT64_MAX;   /* (none) */
  uint64_t planned = 0;   /* (a plan's placement, applied since) */
  for (int k = 0; k < s->L; k++) planned = planned * 3 + (uint64_t)active_layer(s, k)->planned;
  return relay_step_key(s, false) ^ *budget * 0x9e3779b97f4a7c15ull ^ planned * 0xc2b2ae3d27d4eb4full;
}

/* With no budget of either kind, what the device's memory leaves the relay's records and
   step (read as it places: once a key): the bytes its system has free and the pool's, less
   what others hold in the pool (this relay's records on the device count as room: placing
   may move them) and a twentieth of the device for its libraries' workspaces and
   fragmentation; at least 1 (place nothing). UINT64_MAX (every record) where the device
   is host memory, which bounds nothing of its own. */
static uint64_t device_free_room(const l2l_relay *run) {
  uint64_t free_bytes = 0, total = 0;
  if (!device_memory(&free_bytes, &total)) return UINT64_MAX;
  l2l_pool_stats pool;
  l2l_pool_get_stats(&pool, L2L_POOL_DEVICE);
  uint64_t usable = free_bytes + pool.reserved, keep = pool_held(run, &pool) + total / 20;
  return usable > keep ? usable - keep : 1;
}

/* Whether placement auto has placed for a step of this key already. */
static bool placed_for(const l2l_relay *run, uint64_t key) {
  return run->place_key_set && run->place_key == key;
}

bool relay_place_wanted(const struct step *s) {
  if (s->run->config.placement != L2L_PLACE_AUTO || !s->training) return false;
  uint64_t budget;
  return !placed_for(s->run, place_key(s, &budget));
}

/* With ranks, every rank's placement of this step (`mine`: this rank's status placing;
   pl NULL or failed: none) exchanged: *agreed when every rank's is alike; else `allowed`
   becomes, per layer, the records every rank placed (the groups every rank's budget held
   beside its own step). A rank that failed fails every rank. Collective. */
static l2l_status placements_exchange(bool *agreed, uint32_t *allowed, const struct plan_layer *pl,
                                      int L, l2l_status mine, const struct step *s) {
  int size = dist_size_now();
  int64_t *words = calloc(((size_t)size + 1) * ((size_t)L + 1), sizeof *words), *all = words + L + 1;
  if (words == NULL)   /* (a few bytes: the other ranks then wait out the timeout) */
    return FAIL(L2L_ERR_NOMEM, "no memory to exchange the ranks' placements");
  for (int k = 0; k < L; k++) words[k] = mine == L2L_OK ? pl[k].on_device : 0;
  words[L] = mine != L2L_OK;
  struct dist_op op = {.kind = DIST_ALLGATHER_I64, .send = words, .recv = all, .n = L + 1,
                       .what = "exchange of the ranks' placements", .layer = -1,
                       .step = s->run->steps + 1};
  l2l_status status = dist_run(&op);
  int failed = -1;
  *agreed = true;
  for (int r = 0; status == L2L_OK && r < size; r++) {
    const int64_t *theirs = all + (size_t)r * ((size_t)L + 1);
    if (theirs[L] && failed < 0) failed = r;
    for (int k = 0; k < L; k++) {
      *agreed &= theirs[k] == all[k];
      if (allowed != NULL)   /* (NULL: this rank failed, and every rank fails with it) */
        allowed[k] = r == 0 ? (uint32_t)theirs[k] : allowed[k] & (uint32_t)theirs[k];
    }
  }
  *agreed &= status == L2L_OK && failed < 0;
  free(words);
  if (status == L2L_OK && failed >= 0)
    status = mine != L2L_OK ? mine : FAIL(L2L_ERR_STATE, "rank %d could not place its records "
                                          "(its own error says why)", failed);
  return status;
}

l2l_status relay_place_auto(struct step *s) {
  l2l_relay *run = s->run;
  bool ranks = run->config.dist != L2L_DIST_NONE;
  if (run->config.placement != L2L_PLACE_AUTO || !s->training) return L2L_OK;
  uint64_t budget, key = place_key(s, &budget);
  if (ranks ? !s->place_wanted : placed_for(run, key)) return L2L_OK;
  if (budget == UINT64_MAX) budget = device_free_room(run);
  struct plan_layer *pl = calloc((size_t)s->L, sizeof *pl);
  uint32_t *allowed = calloc((size_t)s->L, sizeof *allowed);
  l2l_status status = pl && allowed ? L2L_OK : FAIL(L2L_ERR_NOMEM, "no memory to place a step's records");
  /* A plan applied chose the records to place with its policies (l2l_plan_new weighs a
     record on the device against the room it takes from the step): those it keeps home
     stay home. */
  bool planned = false;
  for (int k = 0; status == L2L_OK && k < s->L; k++) {
    const struct relay_layer *rl = active_layer(s, k);
    pl[k] = relay_plan_layer(run, rl);
    allowed[k] = rl->planned == PLANNED_HOME ? 0 : UINT32_MAX;
    planned |= rl->planned != PLANNED_NONE;
  }
  /* With ranks each places within what every rank placed last, until all place alike:
     each round that differs keeps fewer groups, so at most a round a layer and one more. */
  bool agreed = false;
  for (int round = 0; !agreed && round <= s->L + 1; round++) {
    uint64_t bytes = 0;   /* (the placement's own: the budget checks count what is placed) */
    l2l_status mine = status != L2L_OK ? status
                      : plan_step_place(pl, s->L, &run->config, s->B, s->S, s->mb,
                                        s->in->token_types != NULL, s->in->key_mask != NULL,
                                        budget, round > 0 || planned ? allowed : NULL, &bytes);
    if (!ranks) status = mine, agreed = true;
    else status = placements_exchange(&agreed, allowed, pl, s->L, mine, s);
    if (status != L2L_OK) break;
  }
  if (status == L2L_OK && !agreed)
    status = FAIL(L2L_ERR_STATE, "the ranks did not agree a placement in %d rounds", s->L + 2);
  bool moved = status == L2L_OK;
  if (moved) status = relay_move_records(run, pl, s->L);
  if (moved && status != L2L_OK && ranks) {
    /* the ranks' moves are collective (to the device the state is gathered) and every
       rank must hold its records where the others do: one that could not ends the job */
    char what[512];
    snprintf(what, sizeof what, "the records could not be moved where the ranks placed them: %s",
             l2l_last_error());
    dist_fail(what);
  }
  if (status == L2L_OK) run->place_key = key, run->place_key_set = true;
  free(pl), free(allowed);
  return status;
}
