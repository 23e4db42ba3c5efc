/* SPDX-License-Identifier: MIT */
/* test_auto_plan.c — l2l_relay_plan_auto (src/relay/auto_plan.c): the relay plans itself.
 *
 * Purpose: what it applies is the planner's plan for the same request (l2l_plan_new with
 * the same rates, budget and layers, an independent call), a step under it stays within
 * the budget (the pool's own peak), the same request keeps the plan and another makes a
 * new one, and a budget too small is refused naming the smallest that works (which then
 * works, and a byte less does not), changing nothing. Random small GPTs and batches.
 * Must never: compare with numbers written here.
 */
#include <string.h>

#include "check.h"
#include "reference.h"

/* The plan the planner makes for the relay's request, alone. */
static l2l_status reference_plan(l2l_plan **out, const struct model *m, const l2l_relay_config *cfg,
                                 int64_t B, int64_t S, uint64_t budget) {
  l2l_plan_rates rates;
  l2l_status status = l2l_relay_calibrate_plan(&rates, 0);
  if (status != L2L_OK) return status;
  uint8_t frozen[MAX_LAYERS] = {0};
  l2l_plan_request q = {.batch = B, .seq = S, .device_budget = budget, .frozen = frozen,
                        .rates = &rates};
  return l2l_plan_new(out, m->layer, m->n, cfg, &q);
}

TEST(auto_plan_applies_the_planners_plan_and_keeps_it_until_the_request_changes) {
  struct shape g = gpt_shape();
  g.blocks = (int)check_rand_int(1, 3);
  g.S = check_rand_int(6, 12);
  int64_t B = check_rand_int(2, 6);
  struct model m;
  model_new(&m, &g);
  struct data d;
  data_new(&d, &g, B, g.S, 0, 1.0);
  l2l_relay_config cfg;
  l2l_relay_config_default(&cfg);
  cfg.optimizer_threads = 1;
  l2l_relay *r = NULL;
  l2l_plan *want = NULL;
  if (!CHECK_OK(l2l_relay_new(&r, m.layer, m.n, &cfg))) goto done;
  /* a budget too small: refused with the smallest that works, nothing changed */
  CHECK_OK(l2l_relay_set_device_budget(r, 4096));
  int inner_before = l2l_relay_inner(r, 1);
  const l2l_plan *plan = NULL;
  CHECK_FAILS(l2l_relay_plan_auto(&plan, r, B, g.S, 0, 0), L2L_ERR_BUDGET,
              "the smallest budget that works is");
  l2l_error_detail detail;
  CHECK_OK(l2l_last_error_detail(&detail));
  uint64_t need = detail.needed_bytes;
  CHECK(need > 4096, "the smallest budget named: %llu", (unsigned long long)need);
  CHECK(plan == NULL && l2l_relay_inner(r, 1) == inner_before, "a refused plan changed the relay");
  CHECK_OK(l2l_relay_set_device_budget(r, need - 1));
  CHECK_FAILS(l2l_relay_plan_auto(&plan, r, B, g.S, 0, 0), L2L_ERR_BUDGET, "smallest");
  /* the smallest works; then a roomier budget: the planner's plan for it, applied */
  uint64_t budget = need + (uint64_t)check_rand_int(0, 3) * need;
  CHECK_OK(l2l_relay_set_device_budget(r, budget));
  if (!CHECK_OK(l2l_relay_plan_auto(&plan, r, B, g.S, 0, 0))) goto done;
  if (!CHECK_OK(reference_plan(&want, &m, &cfg, B, g.S, budget))) goto done;
  l2l_plan_summary got_s, want_s;
  CHECK_OK(l2l_plan_get(&got_s, plan));
  CHECK_OK(l2l_plan_get(&want_s, want));
  CHECK(got_s.micro_batch == want_s.micro_batch && got_s.device_peak == want_s.device_peak,
        "micro-batch %lld and peak %llu, the planner's %lld and %llu", (long long)got_s.micro_batch,
        (unsigned long long)got_s.device_peak, (long long)want_s.micro_batch,
        (unsigned long long)want_s.device_peak);
  for (int k = 0; k < m.n; k++) {
    l2l_plan_layer w;
    CHECK_OK(l2l_plan_get_layer(&w, want, k));
    CHECK(l2l_relay_inner(r, k) == (int)w.inner, "layer %d: inner %d, the planner's %d", k,
          l2l_relay_inner(r, k), (int)w.inner);
    if (k >= 1)
      CHECK(l2l_relay_stash(r, k) == (int)w.stash, "layer %d: stash %d, the planner's %d", k,
            l2l_relay_stash(r, k), (int)w.stash);
  }
  /* a step under it stays within the budget */
  l2l_pool_stats before;
  CHECK_OK(l2l_pool_get_stats(&before, L2L_POOL_DEVICE));
  l2l_relay_batch b = {.tokens = d.tokens, .targets = d.targets};
  double loss;
  CHECK_OK(l2l_relay_step(&loss, r, &b));
  l2l_relay_stats st;
  CHECK_OK(l2l_relay_get_stats(&st, r));
  CHECK(st.device_peak - before.current <= budget, "the step peaked at %llu over a budget of %llu",
        (unsigned long long)(st.device_peak - before.current), (unsigned long long)budget);
  /* the same request keeps the plan; another shape and budget plan again */
  const l2l_plan *again = NULL;
  CHECK_OK(l2l_relay_plan_auto(&again, r, B, g.S, 0, 0));
  CHECK(again == plan, "the same request made a new plan");
  CHECK_OK(l2l_relay_set_device_budget(r, 4 * need));   /* (room for the larger batch) */
  CHECK_OK(l2l_relay_plan_auto(&again, r, B + 1, g.S, 0, 0));
  l2l_plan_summary s2;
  CHECK_OK(l2l_plan_get(&s2, again));
  CHECK(s2.micro_batch >= 1 && s2.micro_batch <= B + 1, "a plan for B %lld has micro-batch %lld",
        (long long)(B + 1), (long long)s2.micro_batch);
done:
  l2l_plan_free(want);
  l2l_relay_free(r);
  data_free(&d);
  model_free(&m);
}
