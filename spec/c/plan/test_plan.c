/* SPDX-License-Identifier: MIT */
/* test_plan.c — the planner (src/plan/) against the relay it plans for.
 *
 * Purpose: the device peak the planner predicts for a training step must be the peak the
 * relay reaches. On the CPU backend the device pool is host memory with the same
 * accounting, so the two can be compared to the byte: random small models (embedding,
 * blocks of both memory modes and both LayerNorm placements, an LM head tied or not, or a
 * classifier), random batch, sequence and micro-batch sizes (a short last micro-batch
 * included), random per-layer inner and stash policies, parameter slots, frozen layers,
 * padding masks and token types, f32 and 16-bit weights and gradients; then an evaluation
 * of the same model. Swap's timing belongs to the copy threads: there the prediction must
 * bound a training step's measured peak. Placement: the records a plan puts on the device
 * are what the pool rose by, and a placing of fewer groups takes the first of more. The
 * search itself: test_plan_search.c.
 * Must never: compare with numbers written here (the reference is the pool's own peak).
 */
#include <stdlib.h>
#include <string.h>

#include "plan_rig.h"

/* Placement auto for a random case: a device budget between the step's peak with every
   record on the host (the bound, whatever the weights) and that with all of the records'
   device bytes (core's device_record_bytes, AdamW's two arrays in the state's precision) and a tenth more, given to
   the relay; the layers' on_device bits as the planner places the records in it (the
   relay's own choice at its step, checked against where the records then are). */
static bool auto_placement(struct plan_layer *layers, const struct model *m, l2l_relay *r,
                           const l2l_relay_config *cfg, const struct data *d, int64_t B, int64_t S) {
  uint64_t bound = 0, total = 0, placed = 0;
  struct layers_record *recs = NULL;
  int n = 0;
  if (!CHECK_OK(l2l_relay_step_peak(&bound, r, B, S, d->types != NULL, d->key_mask != NULL)) ||
      !CHECK_OK(layers_records(&recs, &n, (const l2l_layer *const *)m->layer, NULL, m->n)))
    return false;
  for (int i = 0; i < n; i++) {
    struct layers_record_dtypes held = layers_record_dtypes(recs[i].param, cfg->precision, cfg->master);
    total += device_record_bytes(l2l_tensor_numel(l2l_param_value(recs[i].param)), held.master,
                                 2, cfg->optimizer.state, held.staging);
  }
  free(recs);
  uint64_t budget = bound + (uint64_t)(check_rand_uniform(0, 1.1) * (double)total);
  if (!CHECK_OK(l2l_relay_set_device_budget(r, budget)) ||
      !CHECK_OK(plan_step_place(layers, m->n, cfg, B, S, cfg->micro_batch, d->types != NULL,
                                d->key_mask != NULL, budget, NULL, &placed)))
    return false;
  /* Within the groups it placed it places them again (ranks that placed alike agree:
     relay/auto_plan.c); within some of them, none of the others; within none, nothing. */
  struct plan_layer *again = malloc((size_t)m->n * sizeof *again);
  uint32_t *allowed = calloc((size_t)m->n, sizeof *allowed);
  bool ok = CHECK(again != NULL && allowed != NULL, "no memory");
  for (int round = 0; ok && round < 3; round++) {
    for (int k = 0; k < m->n; k++)
      allowed[k] = round == 0 ? layers[k].on_device : round == 1 && check_rand_int(0, 1) ? layers[k].on_device : 0;
    memcpy(again, layers, (size_t)m->n * sizeof *again);
    uint64_t bytes = 0;
    ok = CHECK_OK(plan_step_place(again, m->n, cfg, B, S, cfg->micro_batch, d->types != NULL,
                                  d->key_mask != NULL, budget, allowed, &bytes));
    for (int k = 0; ok && k < m->n; k++)
      ok = CHECK(round == 0 ? again[k].on_device == layers[k].on_device
                            : (again[k].on_device & ~layers[k].on_device) == 0 &&
                                  (round == 1 || again[k].on_device == 0),
                 "round %d: layer %d placed %#x within %#x of %#x", round, k, again[k].on_device,
                 allowed[k], layers[k].on_device);
    if (ok && round == 0) ok = CHECK(bytes == placed, "%llu bytes again, %llu", (unsigned long long)bytes,
                                     (unsigned long long)placed);
  }
  free(again), free(allowed);
  return ok;
}

/* One random case: the relay's measured peak of a training step against the replay's.
   swap: whether a layer may swap (then the prediction only bounds the measurement). */
static void compare_one(int trial, bool allow_swap) {
  struct shape g = random_shape();
  int64_t B = check_rand_int(1, 7);
  struct model m;
  model_new(&m, &g);
  struct data d;
  data_new(&d, &g, B, g.S, (int)check_rand_int(0, 1), 1.0);
  l2l_relay_config cfg = random_config(B);
  l2l_relay *r = NULL;
  struct plan_layer layers[MAX_LAYERS];
  bool swapping = false;
  if (!CHECK_OK(l2l_relay_new(&r, m.layer, m.n, &cfg))) goto done;
  for (int k = 0; k < m.n; k++) {
    l2l_inner_policy inner = (l2l_inner_policy)check_rand_int(0, allow_swap ? 2 : 1);
    l2l_stash_policy stash = (l2l_stash_policy)check_rand_int(0, 2);
    bool frozen = k < m.n - 1 && check_rand_int(0, 5) == 0;
    CHECK_OK(l2l_relay_set_inner(r, k, inner));
    if (k >= 1) CHECK_OK(l2l_relay_set_stash(r, k, stash));
    CHECK_OK(l2l_relay_set_frozen(r, k, frozen));
    layers[k] = (struct plan_layer){.layer = m.layer[k], .role = layer_role(m.layer[k]),
                                    .frozen = frozen, .inner = (l2l_inner_policy)l2l_relay_inner(r, k),
                                    .stash = k >= 1 ? (l2l_stash_policy)l2l_relay_stash(r, k)
                                                    : L2L_STASH_DEVICE};
    swapping |= layers[k].inner == L2L_INNER_SWAP && layers[k].role != L2L_ROLE_HEAD;
  }
  struct plan_chain chain = {.L = m.n, .layers = layers, .batch = B, .seq = g.S, .dim = g.D,
                             .micro_batch = cfg.micro_batch, .param_slots = cfg.param_slots,
                             .precision = cfg.precision, .grad_precision = cfg.grad_precision,
                             .token_types = d.types != NULL, .key_mask = d.key_mask != NULL};
  bool on_device = cfg.placement == L2L_PLACE_DEVICE;
  for (int k = 0; k < m.n; k++) layers[k].on_device = on_device ? UINT32_MAX : 0;
  if (cfg.placement == L2L_PLACE_AUTO && !auto_placement(layers, &m, r, &cfg, &d, B, g.S)) goto done;
  uint64_t predicted = 0, floor = 0;
  if (!CHECK_OK(plan_peak(&predicted, &chain))) goto done;
  /* the floor under every policy's peak (the search's test of a size) is under this one's */
  if (CHECK_OK(plan_peak_floor(&floor, &chain)))
    CHECK(floor <= predicted, "trial %d: the floor %llu over the peak %llu", trial,
          (unsigned long long)floor, (unsigned long long)predicted);
  l2l_pool_stats before;
  CHECK_OK(l2l_pool_get_stats(&before, L2L_POOL_DEVICE));
  l2l_relay_batch b = {.tokens = d.tokens, .targets = d.targets, .token_types = d.types,
                       .key_mask = d.key_mask};
  double loss;
  if (!CHECK_OK(l2l_relay_step(&loss, r, &b))) goto done;
  l2l_relay_stats st;
  CHECK_OK(l2l_relay_get_stats(&st, r));
  /* (records placed auto moved to the device as the step began: not the step's bytes) */
  uint64_t measured = st.device_peak - before.current -
                      (cfg.placement == L2L_PLACE_AUTO ? st.device_records_bytes : 0);
  for (int k = 0; k < m.n; k++)   /* and they are where the placement put them */
    for (int i = 0; i < l2l_layer_param_count(m.layer[k]); i++) {
      bool there = l2l_tensor_pool(l2l_param_value(l2l_layer_param(m.layer[k], i))) == L2L_POOL_DEVICE;
      CHECK(there == (bool)(layers[k].on_device >> i & 1), "trial %d: layer %d's record %d is %s the "
            "device, its placement says otherwise", trial, k, i, there ? "on" : "not on");
    }
  char what[200];
  snprintf(what, sizeof what, "trial %d: %d layers, B %lld, S %lld, D %lld, micro-batch %lld, "
           "%d slots, precision %s/%s, records on the %s", trial, m.n, (long long)B,
           (long long)g.S, (long long)g.D, (long long)cfg.micro_batch, cfg.param_slots,
           l2l_dtype_name(cfg.precision), l2l_dtype_name(cfg.grad_precision),
           on_device ? "device" : cfg.placement == L2L_PLACE_AUTO ? "device and host (auto)" : "host");
  if (swapping)
    CHECK(measured <= predicted, "%s: a step with swap peaked at %llu bytes, above the bound %llu",
          what, (unsigned long long)measured, (unsigned long long)predicted);
  else
    CHECK(measured == predicted, "%s: measured peak %llu, predicted %llu", what,
          (unsigned long long)measured, (unsigned long long)predicted);
  /* The time model walks the same schedule: the bytes it has the step copy each way are
     the relay's (swap's included: the copy threads' timing moves when, not what). */
  struct plan_layer_costs costs[MAX_LAYERS];
  l2l_plan_rates rates = {.flops = 1e9, .h2d = 1e9, .d2h = 1e9, .optimizer = 1e9};
  struct plan_step_channels moved = {-1, -1, -1, -1};
  chain.accumulate = 1;
  bool costed = CHECK_OK(plan_layer_costs(costs, &chain, &rates));
  if (costed)
    CHECK(plan_step_seconds(&chain, costs, &rates, NULL, &moved) > 0, "%s: no step time", what);
  CHECK(moved.h2d == (double)st.h2d_bytes && moved.d2h == (double)st.d2h_bytes,
        "%s: the step copied %llu bytes in and %llu out, the time model %.0f and %.0f", what,
        (unsigned long long)st.h2d_bytes, (unsigned long long)st.d2h_bytes, moved.h2d, moved.d2h);
  /* Its other channels: the host optimizer's updates are the f32 masters of the records
     whose first user is trainable (the planner's rule, counted here from the model) at the
     optimizer's rate (none with the records on the device); and with copies and updates
     free (and no visit cost) a step is its compute alone. */
  double masters = 0;
  for (int k = 0; k < m.n; k++)
    for (int i = 0; !layers[k].frozen && i < l2l_layer_param_count(m.layer[k]); i++) {
      if (layers[k].on_device >> i & 1) continue;   /* (updated on the device) */
      const l2l_param *p = l2l_layer_param(m.layer[k], i);
      bool earlier = false;
      for (int j = 0; j < k; j++)
        for (int q = 0; q < l2l_layer_param_count(m.layer[j]); q++) earlier |= l2l_layer_param(m.layer[j], q) == p;
      if (!earlier) masters += 4.0 * (double)l2l_tensor_numel(l2l_param_value(p));
    }
  CHECK(fabs(moved.updates - masters / rates.optimizer) <= 1e-12 * (masters / rates.optimizer),
        "%s: the updates take %.9g s, the masters' %.0f bytes at %.0f B/s %.9g s", what,
        moved.updates, masters, rates.optimizer, masters / rates.optimizer);
  l2l_plan_rates free_rates = {.flops = rates.flops, .h2d = 1e300, .d2h = 1e300, .optimizer = 1e300};
  struct plan_step_channels alone = {-1, -1, -1, -1};
  double step = costed ? plan_step_seconds(&chain, costs, &free_rates, NULL, &alone) : -1;
  CHECK(alone.compute > 0 && fabs(step - alone.compute) <= 1e-9 * alone.compute,
        "%s: with free copies and updates a step takes %.9g s, its compute %.9g s", what, step,
        alone.compute);
  /* An evaluation of the same batch (nothing kept, nothing swapped: exact with any policy),
     with the weights the step left (the frugal guard's statements follow them). */
  chain.evaluation = true;
  if (!CHECK_OK(plan_peak(&predicted, &chain))) goto done;
  if (CHECK_OK(plan_peak_floor(&floor, &chain)))
    CHECK(floor <= predicted, "trial %d: an evaluation's floor %llu over its peak %llu", trial,
          (unsigned long long)floor, (unsigned long long)predicted);
  CHECK_OK(l2l_pool_get_stats(&before, L2L_POOL_DEVICE));
  if (!CHECK_OK(l2l_relay_evaluate(&loss, r, &b))) goto done;
  CHECK_OK(l2l_relay_get_stats(&st, r));
  measured = st.device_peak - before.current;
  CHECK(measured == predicted, "%s: an evaluation's measured peak %llu, predicted %llu", what,
        (unsigned long long)measured, (unsigned long long)predicted);
done:
  l2l_relay_free(r);
  data_free(&d);
  model_free(&m);
}

TEST(plan_peak_is_the_relays_to_the_byte) {
  if (strcmp(l2l_device_backend(), "cpu") != 0) {
    check_skip("the device pool is not host memory here: peaks are compared on the CPU backend");
    return;
  }
  for (int trial = 0; trial < 300; trial++) compare_one(trial, false);
}

TEST(plan_peak_bounds_a_step_with_swap) {
  if (strcmp(l2l_device_backend(), "cpu") != 0) {
    check_skip("the device pool is not host memory here: peaks are compared on the CPU backend");
    return;
  }
  for (int trial = 0; trial < 100; trial++) compare_one(trial, true);
}

TEST(plan_peak_of_many_micro_batches_is_the_whole_replays) {
  /* A step of many micro-batches is replayed as three short ones and extrapolated
     (peak.c): the result must be the whole replay's, to the byte, for random models,
     policies (swap, rebuilds, host and device stashes, frozen layers), slot counts,
     precisions, and 9 to 300 micro-batches with a short last one. */
  int64_t saved_max = plan_peak_whole_replay_max;
  for (int trial = 0; trial < 60; trial++) {
    struct shape g = random_shape();
    g.type_vocab = 0;
    struct model m;
    model_new(&m, &g);
    struct plan_layer layers[MAX_LAYERS];
    for (int k = 0; k < m.n; k++) {
      int mode = (int)check_rand_int(0, 4);
      layers[k] = (struct plan_layer){.layer = m.layer[k], .role = layer_role(m.layer[k]),
                                      .frozen = k < m.n - 1 && check_rand_int(0, 5) == 0,
                                      .inner = mode_inner[mode], .stash = k ? mode_stash[mode] : L2L_STASH_DEVICE};
    }
    int64_t mb = check_rand_int(1, 3), nmb = check_rand_int(9, 300);
    int precision = (int)check_rand_int(0, 1);
    struct plan_chain c = {.L = m.n, .layers = layers, .batch = (nmb - 1) * mb + check_rand_int(1, mb),
                           .seq = g.S, .dim = g.D, .micro_batch = mb,
                           .param_slots = (int)check_rand_int(2, 4),
                           .precision = precision ? L2L_BF16 : L2L_F32,
                           .grad_precision = precision && check_rand_int(0, 1) ? L2L_BF16 : L2L_F32,
                           .key_mask = check_rand_int(0, 1), .accumulate = 1};
    uint64_t whole = 0, short_replays = 0;
    plan_peak_whole_replay_max = INT64_MAX;
    CHECK_OK(plan_peak(&whole, &c));
    plan_peak_whole_replay_max = 0;
    int64_t fallbacks = plan_peak_fallbacks;
    CHECK_OK(plan_peak(&short_replays, &c));
    CHECK(plan_peak_fallbacks == fallbacks, "trial %d: the short replays were not on lines: the "
          "whole replay was used (%d layers, %lld micro-batches)", trial, m.n, (long long)nmb);
    CHECK(whole == short_replays && whole > 0, "trial %d (%d layers, B %lld, micro-batch %lld): "
          "the whole replay peaks at %llu bytes, the short ones say %llu", trial, m.n,
          (long long)c.batch, (long long)mb, (unsigned long long)whole,
          (unsigned long long)short_replays);
    model_free(&m);
  }
  plan_peak_whole_replay_max = saved_max;
}

/* ---------------------------------------------------------------- placement */

TEST(plan_holds_the_records_placed_on_the_device_in_the_budget) {
  /* placement device: the records' bytes on the device (masters, gradients, state, 16-bit
     copies, flags) are what the device pool rose by as the relay was made, to the byte;
     l2l_plan_new plans the step in the budget less them (a budget they fill is refused,
     naming them), and the relay's own budget holds them beside the step's peak. */
  struct shape g = random_shape();
  g.dropout = 0;
  int64_t B = check_rand_int(1, 5);
  struct model m;
  model_new(&m, &g);
  struct data d;
  data_new(&d, &g, B, g.S, 0, 1.0);
  l2l_relay_config cfg = random_config(B);
  cfg.placement = L2L_PLACE_DEVICE;
  if (check_rand_int(0, 1)) cfg.optimizer.kind = L2L_OPTIMIZER_SGD, cfg.optimizer.momentum = 0;
  l2l_pool_stats before, after;
  CHECK_OK(l2l_pool_get_stats(&before, L2L_POOL_DEVICE));
  l2l_relay *r = NULL;
  if (!CHECK_OK(l2l_relay_new(&r, m.layer, m.n, &cfg))) goto done;
  CHECK_OK(l2l_pool_get_stats(&after, L2L_POOL_DEVICE));
  uint64_t records = after.current - before.current;
  l2l_plan_rates rates = {.flops = 1e9, .h2d = 1e9, .d2h = 1e9, .optimizer = 1e9, .visit = 0};
  l2l_plan_request q = {.batch = B, .seq = g.S, .device_budget = UINT64_C(1) << 30, .rates = &rates};
  l2l_plan *plan = NULL;
  l2l_plan_summary s = {0};
  if (CHECK_OK(l2l_plan_new(&plan, m.layer, m.n, &cfg, &q)) && CHECK_OK(l2l_plan_get(&s, plan)))
    CHECK(s.device_records_bytes == records && records > 0,
          "the plan counts %llu bytes of records on the device, the pool rose by %llu",
          (unsigned long long)s.device_records_bytes, (unsigned long long)records);
  l2l_plan_free(plan);
  plan = NULL;
  q.device_budget = records;
  CHECK_FAILS(l2l_plan_new(&plan, m.layer, m.n, &cfg, &q), L2L_ERR_BUDGET,
              "records placed on the device");
  /* the relay's own budget: the records alone are refused; the records and the step's
     peak (the bound whatever the weights) run */
  uint64_t peak = 0;
  CHECK_OK(l2l_relay_step_peak(&peak, r, B, g.S, d.types != NULL, d.key_mask != NULL));
  l2l_relay_batch b = {.tokens = d.tokens, .targets = d.targets, .token_types = d.types,
                       .key_mask = d.key_mask};
  double loss;
  CHECK_OK(l2l_relay_set_device_budget(r, records));
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_BUDGET, "records placed on the device");
  CHECK_OK(l2l_relay_set_device_budget(r, peak + records));
  l2l_relay_stats st;
  if (CHECK_OK(l2l_relay_step(&loss, r, &b)) && CHECK_OK(l2l_relay_get_stats(&st, r)))
    CHECK(st.device_records_bytes == records, "stats.device_records_bytes %llu, the pool rose by %llu",
          (unsigned long long)st.device_records_bytes, (unsigned long long)records);
done:
  l2l_relay_free(r);
  data_free(&d);
  model_free(&m);
}

/* Placement auto plans again with fewer groups' records on the device, the largest first
   (plan.c's place_with_policies): plan_place given the groups an earlier placement took
   (c->placed_order) takes the first `most` of them, one replay, where they fit, and else
   places as with no order given (the greedy: each group, largest first, while it fits, a
   replay each), which takes the same wherever every shorter run of them fits too. Either
   way the records and the step's peak stay within the budget. */
TEST(plan_place_of_fewer_groups_takes_the_first_of_more) {
  int shortcuts = 0, compared = 0;
  for (int trial = 0; trial < 24; trial++) {
    struct shape g = random_shape();
    g.blocks = (int)check_rand_int(2, 6), g.type_vocab = 0;
    int64_t B = check_rand_int(1, 7);
    struct model m;
    model_new(&m, &g);
    l2l_relay_config cfg = random_config(B);
    cfg.placement = L2L_PLACE_AUTO;
    struct plan_layer layers[MAX_LAYERS], greedy[MAX_LAYERS];
    int order[MAX_LAYERS];
    for (int k = 0; k < m.n; k++) layers[k] = (struct plan_layer){.layer = m.layer[k], .role = layer_role(m.layer[k])};
    struct plan_chain c = {.L = m.n, .layers = layers, .batch = B, .seq = g.S, .dim = g.D,
                           .param_slots = cfg.param_slots, .precision = cfg.precision,
                           .grad_precision = cfg.grad_precision, .accumulate = 1};
    uint64_t lean = 0, all = 0, bytes = 0;
    int K = 0, took = 0;
    /* a budget from the leanest step's peak up to it and every record's device bytes */
    if (!CHECK_OK(plan_leanest_peak(&lean, &c)) ||
        !CHECK_OK(plan_place(&c, &cfg, UINT64_MAX / 4, NULL, INT32_MAX, NULL, &all)))
      goto next;
    uint64_t budget = lean + (uint64_t)(check_rand_uniform(0, 1.1) * (double)all);
    c.placed_order = order, c.placed_count = -1;
    if (!CHECK_OK(plan_place(&c, &cfg, budget, NULL, INT32_MAX, &K, &bytes))) goto next;
    CHECK(c.placed_count == K, "trial %d: %d groups taken, %d in the order", trial, K, c.placed_count);
    bool runs_fit = true;   /* every run of the first `most` so far fit */
    for (int most = 0; most < K; most++) {
      int64_t before = plan_replayed_micro_batches;
      if (!CHECK_OK(plan_place(&c, &cfg, budget, NULL, most, &took, &bytes))) break;
      bool shortcut = plan_replayed_micro_batches - before == B;   /* one whole replay */
      runs_fit = runs_fit && shortcut;
      shortcuts += shortcut;
      uint64_t peak = 0;
      plan_memo_free(&c);
      CHECK_OK(plan_peak(&peak, &c));
      CHECK(bytes <= budget && peak <= budget - bytes, "trial %d, at most %d groups: records %llu and "
            "peak %llu over the budget %llu", trial, most, (unsigned long long)bytes,
            (unsigned long long)peak, (unsigned long long)budget);
      for (int i = 0; shortcut && i < K; i++)
        CHECK((layers[order[i]].on_device != 0) == (i < most), "trial %d, at most %d groups: the "
              "group of layer %d (taken %d-th) is %s the device", trial, most, order[i], i + 1,
              layers[order[i]].on_device ? "on" : "not on");
      if (shortcut) CHECK(took == most, "trial %d: %d groups taken of %d", trial, took, most);
      if (runs_fit || !shortcut) {   /* where it must be the greedy's choice, or is its own */
        struct plan_chain d = c;
        memcpy(greedy, layers, (size_t)m.n * sizeof *greedy);
        d.layers = greedy, d.placed_order = NULL;
        int gtook = 0;
        uint64_t gbytes = 0;
        if (!CHECK_OK(plan_place(&d, &cfg, budget, NULL, most, &gtook, &gbytes))) break;
        compared++;
        CHECK(gtook == took && gbytes == bytes, "trial %d, at most %d groups: %d groups and %llu bytes, "
              "the greedy's %d and %llu", trial, most, took, (unsigned long long)bytes, gtook,
              (unsigned long long)gbytes);
        for (int k = 0; k < m.n; k++)
          CHECK(greedy[k].on_device == layers[k].on_device, "trial %d, at most %d groups: layer %d's "
                "records %#x, the greedy's %#x", trial, most, k, layers[k].on_device, greedy[k].on_device);
      }
    }
  next:
    plan_memo_free(&c);
    model_free(&m);
  }
  CHECK(shortcuts > 0, "no placement of fewer groups took the first of an earlier one's");
  printf("  %d placements of fewer groups took the first of an earlier one's in one replay; %d were "
         "compared with the greedy's\n", shortcuts, compared);
}
