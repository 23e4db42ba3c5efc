/* SPDX-License-Identifier: MIT */
/* test_api_misuse_plan.c — the planner and data parallel of include/l2l.h called with what they
 * must refuse: l2l_plan_new and its accessors, the planner's calibration (and its
 * deprecated name), applying a plan to a relay; the l2l_dist_* calls. test_api_misuse.c
 * says what a refusal must do (the documented status, a message naming what is wrong, set
 * by this call, and nothing changed: watched tensors' bytes and handles, *out, the pools'
 * bytes in use) and how; misuse.h holds the harness. Which tests cover which functions is
 * said above each test. All test names start with "misuse_".
 */
#include <ctype.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misuse.h"

TEST(misuse_planner) {
  struct rig rig;
  l2l_relay_config c = relay_config();
  if (!rig_new(&rig, &c)) {
    rig_free(&rig);
    return;
  }
  l2l_layer **layers = rig.m.layer;
  int n = rig.m.n;
  l2l_plan_rates rates = {.flops = 1e12, .h2d = 1e10, .d2h = 1e10, .optimizer = 1e9};
  l2l_plan_request q = {.batch = 4, .seq = rig.g.S, .device_budget = UINT64_C(1) << 30, .rates = &rates};
  l2l_plan *out = SENTINEL(l2l_plan);
  REFUSES(l2l_plan_new(NULL, layers, n, &c, &q), L2L_ERR_INVALID, "out");
  REFUSES(l2l_plan_new(&out, NULL, n, &c, &q), L2L_ERR_INVALID, "layers");
  REFUSES(l2l_plan_new(&out, layers, n, NULL, &q), L2L_ERR_INVALID, "config");
  REFUSES(l2l_plan_new(&out, layers, n, &c, NULL), L2L_ERR_INVALID, "request");
  const int bad_counts[] = {-1, 0, 1, INT_MIN, (1 << 20) + 1};
  for (size_t i = 0; i < sizeof bad_counts / sizeof bad_counts[0]; i++)
    REFUSES(l2l_plan_new(&out, layers, bad_counts[i], &c, &q), L2L_ERR_INVALID, "nlayers");
  l2l_layer *swapped[MAX_LAYERS];
  memcpy(swapped, layers, (size_t)n * sizeof *swapped);
  swapped[0] = layers[n - 1], swapped[n - 1] = layers[0];
  REFUSES(l2l_plan_new(&out, swapped, n, &c, &q), L2L_ERR_INVALID, "head");
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 4);
  memcpy(swapped, layers, (size_t)n * sizeof *swapped);
  swapped[1] = AS(l2l_layer, t);
  REFUSES(l2l_plan_new(&out, swapped, n, &c, &q), L2L_ERR_INVALID, "live layer");
  l2l_plan_request bad = q;
  bad.batch = 0;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "batch");
  bad = q, bad.seq = INT64_MAX;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "seq");
  bad = q, bad.device_budget = 0;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "device_budget");
  bad = q, bad.key_mask = 2;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "key_mask");
  l2l_plan_rates bad_rates[6] = {rates, rates, rates, rates, rates, rates};
  bad_rates[0].h2d = 0, bad_rates[1].flops = NAN, bad_rates[2].optimizer = INFINITY, bad_rates[3].flops = 0;
  bad_rates[4].disk_read = -1, bad_rates[5].disk_write = NAN;
  for (int i = 0; i < 6; i++) {
    bad = q, bad.rates = &bad_rates[i];
    REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "rates");
  }
  l2l_relay_config bad_config = c;
  bad_config.param_slots = 1;
  REFUSES(l2l_plan_new(&out, layers, n, &bad_config, &q), L2L_ERR_INVALID, "param_slots");
  bad_config = c, bad_config.spill_dir = "";
  REFUSES(l2l_plan_new(&out, layers, n, &bad_config, &q), L2L_ERR_INVALID, "spill_dir");
  bad_config = c, bad_config.optimizer.kind = (l2l_optimizer_kind)9;
  REFUSES(l2l_plan_new(&out, layers, n, &bad_config, &q), L2L_ERR_INVALID, "kind 9");
  bad = q, bad.device_budget = 64;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_BUDGET, "the smallest needs");
  CHECK(out == SENTINEL(l2l_plan), "*out written by a refused l2l_plan_new");

  /* a plan, and the calls that read it */
  l2l_plan *plan = NULL;
  if (CHECK_OK(l2l_plan_new(&plan, layers, n, &c, &q))) {
    l2l_plan_summary s;
    l2l_plan_layer pl;
    REFUSES(l2l_plan_get(NULL, plan), L2L_ERR_INVALID, "out");
    REFUSES(l2l_plan_get(&s, NULL), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_plan_get(&s, AS(l2l_plan, t)), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_plan_get(&s, JUNK(l2l_plan)), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_plan_get_layer(NULL, plan, 0), L2L_ERR_INVALID, "out");
    REFUSES(l2l_plan_get_layer(&pl, JUNK(l2l_plan), 0), L2L_ERR_INVALID, "plan");
    const int bad_index[] = {-1, n, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++)
      REFUSES(l2l_plan_get_layer(&pl, plan, bad_index[i]), L2L_ERR_INVALID, "index");
    /* apply: the run and the plan checked, a plan for another number of layers refused,
       nothing changed on a refusal */
    int64_t mb_before = c.micro_batch;
    l2l_inner_policy inner_before = (l2l_inner_policy)l2l_relay_inner(rig.r, 1);
    REFUSES(l2l_relay_apply_plan(NULL, plan), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_apply_plan(rig.r, NULL), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_relay_apply_plan(rig.r, AS(l2l_plan, t)), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_relay_apply_plan(AS(l2l_relay, plan), plan), L2L_ERR_INVALID, "run");
    l2l_plan *shorter = NULL;
    l2l_layer *pair[2] = {layers[0], layers[n - 1]};
    if (CHECK_OK(l2l_plan_new(&shorter, pair, 2, &c, &q)))
      REFUSES(l2l_relay_apply_plan(rig.r, shorter), L2L_ERR_INVALID, "layers");
    l2l_plan_free(shorter);
    l2l_relay_stats st;
    CHECK_OK(l2l_relay_get_stats(&st, rig.r));
    CHECK(l2l_relay_inner(rig.r, 1) == (int)inner_before && mb_before == c.micro_batch,
          "a refused apply changed the relay");
    CHECK_OK(l2l_relay_apply_plan(rig.r, plan));
    CHECK_OK(l2l_plan_get(&s, plan));
    CHECK(s.nlayers == n && s.micro_batch >= 1 && s.micro_batch <= 4 && s.device_peak > 0,
          "plan summary: %d layers, micro-batch %lld, peak %llu", s.nlayers, (long long)s.micro_batch,
          (unsigned long long)s.device_peak);
    l2l_relay_batch b = batch_of(&rig.d);
    double loss;
    CHECK_OK(l2l_relay_step(&loss, rig.r, &b));
    l2l_plan_free(plan);
  }
  /* the relay planning itself: bad arguments refused, the relay unchanged */
  {
    int inner_before = l2l_relay_inner(rig.r, 1);
    const l2l_plan *own = SENTINEL(const l2l_plan);
    REFUSES(l2l_relay_plan_auto(&own, NULL, 4, rig.g.S, 0, 0), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_plan_auto(&own, AS(l2l_relay, t), 4, rig.g.S, 0, 0), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_plan_auto(&own, rig.r, 0, rig.g.S, 0, 0), L2L_ERR_INVALID, "batch");
    REFUSES(l2l_relay_plan_auto(&own, rig.r, 4, INT64_MIN, 0, 0), L2L_ERR_INVALID, "seq");
    REFUSES(l2l_relay_plan_auto(&own, rig.r, 4, rig.g.S, 2, 0), L2L_ERR_INVALID, "token_types");
    REFUSES(l2l_relay_plan_auto(&own, rig.r, 4, rig.g.S, 0, -1), L2L_ERR_INVALID, "key_mask");
    CHECK_OK(l2l_relay_set_device_budget(rig.r, 0));
    REFUSES(l2l_relay_plan_auto(&own, rig.r, 4, rig.g.S, 0, 0), L2L_ERR_INVALID, "device budget");
    l2l_error_detail detail;
    CHECK_OK(l2l_last_error_detail(&detail));
    CHECK(strcmp(detail.field, "device_budget") == 0, "the refusal names field '%s'", detail.field);
    CHECK(own == SENTINEL(const l2l_plan) && l2l_relay_inner(rig.r, 1) == inner_before,
          "a refused l2l_relay_plan_auto changed its out or the relay");
  }
  l2l_plan_free(NULL);
  l2l_plan_free(JUNK(l2l_plan));
  l2l_plan_free(AS(l2l_plan, t));
  l2l_plan_rates r;
  REFUSES(l2l_relay_calibrate_plan(NULL, 0), L2L_ERR_INVALID,
          "l2l_relay_calibrate_plan: out is NULL");
  REFUSES(l2l_relay_calibrate_plan(&r, 2), L2L_ERR_INVALID, "remeasure");
  REFUSES(l2l_relay_calibrate_plan(&r, -1), L2L_ERR_INVALID, "remeasure");
  /* the deprecated name of 0.1: the same function, its refusals in the name called */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  REFUSES(l2l_plan_calibrate(NULL, 0), L2L_ERR_INVALID, "l2l_plan_calibrate: out is NULL");
  REFUSES(l2l_plan_calibrate(&r, 2), L2L_ERR_INVALID,
          "l2l_plan_calibrate: remeasure must be 0 or 1, got 2");
  CHECK_OK(l2l_plan_calibrate(&r, 0));
#pragma GCC diagnostic pop
  l2l_tensor_free(t);
  rig_free(&rig);
}

/* ---------------------------------------------------------------- data parallel */

/* MPI is never started here (the C tests are one process without mpirun): what is checked
   is every refusal before it, and a plugin that cannot be opened. spec/l2l/dist_spec.lua runs
   the real thing under mpirun. */
TEST(misuse_data_parallel) {
  REFUSES(l2l_dist_rank(NULL), L2L_ERR_INVALID, "out");
  REFUSES(l2l_dist_size(NULL), L2L_ERR_INVALID, "out");
  const double bad_seconds[] = {0, -1, NAN, INFINITY, -INFINITY, 1e6 * 1.5, -0.0};
  for (size_t i = 0; i < sizeof bad_seconds / sizeof bad_seconds[0]; i++)
    REFUSES(l2l_dist_set_timeout(bad_seconds[i]), L2L_ERR_INVALID, "seconds");
  CHECK_OK(l2l_dist_finalize());   /* never started: nothing to do */
  l2l_dist_abort(NULL);            /* not running: returns */
  l2l_dist_abort("not running");

  l2l_relay_config c = relay_config();
  struct model m;
  struct shape g = gpt_shape();
  model_new(&m, &g);
  l2l_relay *run = SENTINEL(l2l_relay);
  c.dist = (l2l_dist_mode)7;
  REFUSES(l2l_relay_new(&run, m.layer, m.n, &c), L2L_ERR_INVALID, "dist");
  c.dist = (l2l_dist_mode)-1;
  REFUSES(l2l_relay_new(&run, m.layer, m.n, &c), L2L_ERR_INVALID, "dist");

  /* A plugin that is not there: refused with its path, by every call that needs MPI, and
     again the same way (MPI is never half-started). */
  setenv("L2L_MPI_PLUGIN", "/nonexistent/libl2l-mpi.so", 1);
  REFUSES(l2l_dist_init(), L2L_ERR_UNSUPPORTED, "/nonexistent/libl2l-mpi.so");
  REFUSES(l2l_dist_init(), L2L_ERR_UNSUPPORTED, "cannot open the MPI plugin");
  int out = -5;
  REFUSES(l2l_dist_rank(&out), L2L_ERR_UNSUPPORTED, "MPI plugin");
  REFUSES(l2l_dist_size(&out), L2L_ERR_UNSUPPORTED, "MPI plugin");
  CHECK(out == -5, "a refused l2l_dist_rank wrote %d", out);
  REFUSES(l2l_dist_barrier(), L2L_ERR_UNSUPPORTED, "MPI plugin");
  double sums[2] = {1.5, -2};
  REFUSES(l2l_dist_sum(sums, 2), L2L_ERR_UNSUPPORTED, "MPI plugin");
  CHECK(sums[0] == 1.5 && sums[1] == -2, "a refused l2l_dist_sum wrote %g %g", sums[0], sums[1]);
  REFUSES(l2l_dist_sum(NULL, 2), L2L_ERR_INVALID, "values is NULL");
  REFUSES(l2l_dist_sum(sums, 0), L2L_ERR_INVALID, "n must be in [1, 2^24], got 0");
  REFUSES(l2l_dist_sum(sums, (1 << 24) + 1), L2L_ERR_INVALID, "n must be in [1, 2^24]");
  c.dist = L2L_DIST_MPI;
  REFUSES(l2l_relay_new(&run, m.layer, m.n, &c), L2L_ERR_UNSUPPORTED, "MPI plugin");
  CHECK(run == SENTINEL(l2l_relay), "*out written by a refused l2l_relay_new");
  unsetenv("L2L_MPI_PLUGIN");
  CHECK_OK(l2l_dist_set_timeout(30));
  CHECK_OK(l2l_dist_finalize());
  model_free(&m);
}
