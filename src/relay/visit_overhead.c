/* SPDX-License-Identifier: MIT */
/* visit_overhead.c — l2l_relay_calibrate_plan: the planner's rates, with the one the
 * relay alone can measure: the fixed cost of a layer visit.
 *
 * Purpose: the planner (src/plan/) measures copies, the host optimizer and each layer at
 * its shape; what a visit costs beyond its channels (handing jobs to the copy threads,
 * binding slots, waiting for gradients to leave) shows only when a relay runs. So a small
 * model is trained here a few steps, and the measured step time less what the planner's
 * time model predicts without a visit cost, per visit, is that cost. Cached with the rest.
 * It is the relay's function (l2l/relay.h): the planner is below the relay and may not
 * call it, so its rates are asked of the relay. l2l_plan_calibrate, its name in 0.1, is
 * kept here for one release.
 * Must never: leave anything behind in the pools (the model and the relay are freed), or
 * in their peaks.
 */
#include <string.h>

#include "plan/plan.h"
#include "relay.h"

enum { PROBE_BLOCKS = 4, PROBE_WARM = 2, PROBE_STEPS = 5 };

/* Seconds of a visit beyond its channels, from a small model's steps. */
static l2l_status measure_visit(double *out, const l2l_plan_rates *rates) {
  const int64_t B = 2, S = 8, D = 16;
  enum { L = PROBE_BLOCKS + 2 };
  l2l_layer *layers[L] = {NULL};
  l2l_layer_config c = {.kind = L2L_LAYER_EMBEDDING, .dim = D, .vocab = 16, .max_seq = S,
                        .eps = 1e-5f, .init_std = 0.02f, .resid_std = 0.02f, .init_seed = 1,
                        .heads = 2, .mlp = 2 * D, .bias = 1, .final_ln = 1};
  l2l_status status = l2l_layer_new(&layers[0], &c, L2L_POOL_HOST);
  c.kind = L2L_LAYER_BLOCK;
  for (int k = 1; k <= PROBE_BLOCKS && status == L2L_OK; k++) status = l2l_layer_new(&layers[k], &c, L2L_POOL_HOST);
  c.kind = L2L_LAYER_LM_HEAD;
  if (status == L2L_OK) status = l2l_layer_new(&layers[L - 1], &c, L2L_POOL_HOST);
  l2l_relay_config config;
  l2l_relay_config_default(&config);
  config.precision = L2L_F32;
  l2l_relay *run = NULL;
  if (status == L2L_OK) status = l2l_relay_new(&run, layers, L, &config);
  int64_t shape[2] = {B, S};
  l2l_tensor *tokens = NULL;
  if (status == L2L_OK) status = l2l_tensor_new(&tokens, L2L_POOL_HOST, L2L_I32, 2, shape);
  if (status == L2L_OK) status = l2l_tensor_fill(tokens, 1.0);
  l2l_relay_batch batch = {.tokens = tokens, .targets = tokens};
  double seconds[PROBE_STEPS], loss;
  for (int i = 0; i < PROBE_WARM + PROBE_STEPS && status == L2L_OK; i++) {
    status = l2l_relay_step(&loss, run, &batch);
    l2l_relay_stats st;
    if (status == L2L_OK) status = l2l_relay_get_stats(&st, run);
    if (status == L2L_OK && i >= PROBE_WARM) seconds[i - PROBE_WARM] = st.step_seconds;
  }
  /* what the time model says of the same step, with no visit cost */
  if (status == L2L_OK) {
    struct plan_layer pl[L];
    for (int k = 0; k < L; k++)
      pl[k] = (struct plan_layer){.layer = layers[k], .role = layer_role(layers[k]),
                                  .inner = (l2l_inner_policy)l2l_relay_inner(run, k),
                                  .stash = k ? (l2l_stash_policy)l2l_relay_stash(run, k) : L2L_STASH_DEVICE};
    struct plan_chain chain = {.L = L, .layers = pl, .batch = B, .seq = S, .dim = D,
                               .micro_batch = config.micro_batch, .param_slots = 2,
                               .precision = L2L_F32, .grad_precision = L2L_F32, .accumulate = 1};
    struct plan_layer_costs costs[L];
    l2l_plan_rates bare = *rates;
    bare.visit = 0;
    status = plan_layer_costs(costs, &chain, &bare);
    if (status == L2L_OK) {
      struct order sc;
      status = plan_schedule(&sc, &chain);
      if (status == L2L_OK) {
        double predicted = plan_step_seconds(&chain, costs, &bare, NULL, NULL);
        double extra = (plan_median(seconds, PROBE_STEPS) - predicted) / sc.nvisits;
        *out = extra > 0 ? extra : 0;
      }
      order_free(&sc);
    }
  }
  l2l_tensor_free(tokens);
  l2l_relay_free(run);
  for (int k = 0; k < L; k++) l2l_layer_free(layers[k]);
  return status;
}

/* The rates, refusing bad arguments in the words of `func`, the name the caller used. */
static l2l_status calibrate(const char *func, l2l_plan_rates *out, int remeasure) {
  if (out == NULL) return core_fail_in(func, L2L_ERR_INVALID, "out is NULL");
  if (remeasure != 0 && remeasure != 1)
    return core_fail_in(func, L2L_ERR_INVALID, "remeasure must be 0 or 1, got %d", remeasure);
  l2l_plan_rates rates;
  TRY(plan_machine_rates(&rates, remeasure));
  if (remeasure || rates.visit < 0) {
    pool_measuring_begin();   /* (the small model's bytes are not the program's peak) */
    l2l_status status = measure_visit(&rates.visit, &rates);
    pool_measuring_end();
    TRY(status);
    plan_cache_visit(rates.visit);
  }
  *out = rates;
  return L2L_OK;
}

l2l_status l2l_relay_calibrate_plan(l2l_plan_rates *out, int remeasure) {
  return calibrate(__func__, out, remeasure);
}

/* Deprecated (l2l/relay.h): the name of 0.1, the same function, its refusals in its name. */
l2l_status l2l_plan_calibrate(l2l_plan_rates *out, int remeasure) {
  return calibrate(__func__, out, remeasure);
}
