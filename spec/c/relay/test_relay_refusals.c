/* SPDX-License-Identifier: MIT */
/* test_relay_refusals.c — the relay's refusals of bad input, configs and models, each
 * naming the problem and changing nothing; and restoring a record's optimizer state and the
 * run's progress (what a checkpoint's load does). test_relay.c says how the relay's tests
 * test (the plain executor, plain.c, as the reference); relay_rig.h holds the tolerances
 * and helpers. All test names start with "relay_".
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "relay_rig.h"

/* ---------------------------------------------------------------- refusals */

TEST(relay_refuses_bad_input) {
  /* Bad minibatches, arguments and budgets after two good steps: each refused with a
     message naming the problem, and afterwards every record bit for bit as before,
     stats.steps unchanged, and the relay still trains. */
  struct shape g = gpt_shape();
  struct model m;
  model_new(&m, &g);
  struct data d;
  data_new(&d, &g, 4, g.S, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  l2l_relay *r = relay_new(&m, &cfg);
  double loss;
  if (r == NULL || !relay_step(&loss, r, &d, NULL) || !relay_step(&loss, r, &d, NULL)) goto done;
  struct snapshot s;
  snapshot_take(&s, r, 0, m.n);
  l2l_relay_stats before = relay_stats(r);
  const int n = m.n;
  l2l_relay_batch b;

  /* tokens: shape, dtype, ids, pool, NULL */
  l2l_tensor *flat = NEW(L2L_POOL_HOST, L2L_I32, 4 * g.S);
  memcpy(l2l_tensor_data(flat), l2l_tensor_data(d.tokens), tensor_bytes(flat));
  b = relay_batch(&d, NULL), b.tokens = flat;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "tokens");
  l2l_tensor *ftok = NEW(L2L_POOL_HOST, L2L_F32, 4, g.S);
  memset(l2l_tensor_data(ftok), 0, tensor_bytes(ftok));
  b = relay_batch(&d, NULL), b.tokens = ftok;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "tokens");
  l2l_tensor *big = like_in(d.tokens, L2L_POOL_HOST);
  memcpy(l2l_tensor_data(big), l2l_tensor_data(d.tokens), tensor_bytes(big));
  ((int32_t *)l2l_tensor_data(big))[3 * g.S + 2] = (int32_t)g.V;
  b = relay_batch(&d, NULL), b.tokens = big;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "tokens");
  ((int32_t *)l2l_tensor_data(big))[3 * g.S + 2] = -1;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "tokens");
  l2l_tensor *dev = NEW(L2L_POOL_DEVICE, L2L_I32, 4, g.S);
  memcpy(l2l_tensor_data(dev), l2l_tensor_data(d.tokens), tensor_bytes(dev));
  b = relay_batch(&d, NULL), b.tokens = dev;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "pool");
  b = relay_batch(&d, NULL), b.tokens = NULL;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "tokens");

  /* targets: shape, out of range, NULL; key mask and token types */
  l2l_tensor *short_t = NEW(L2L_POOL_HOST, L2L_I32, 4, g.S - 1);
  memset(l2l_tensor_data(short_t), 0, tensor_bytes(short_t));
  b = relay_batch(&d, NULL), b.targets = short_t;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "targets");
  l2l_tensor *bad_t = like_in(d.targets, L2L_POOL_HOST);
  memcpy(l2l_tensor_data(bad_t), l2l_tensor_data(d.targets), tensor_bytes(bad_t));
  ((int32_t *)l2l_tensor_data(bad_t))[2 * g.S] = (int32_t)g.V + 3;
  b = relay_batch(&d, NULL), b.targets = bad_t;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "targets");
  b = relay_batch(&d, NULL), b.targets = NULL;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "targets");
  l2l_tensor *mask32 = NEW(L2L_POOL_HOST, L2L_I32, 4, g.S);
  CHECK_OK(l2l_tensor_fill(mask32, 1));
  b = relay_batch(&d, NULL), b.key_mask = mask32;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "key_mask");
  b = relay_batch(&d, NULL), b.token_types = d.tokens;
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "token_types");
  uint8_t skip[MAX_LAYERS] = {0};
  skip[0] = 1; /* the embedding cannot be skipped */
  b = relay_batch(&d, skip);
  CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "skip");
  b = relay_batch(&d, NULL);
  CHECK_FAILS(l2l_relay_evaluate(&loss, r, &(l2l_relay_batch){flat, d.targets, NULL, NULL, NULL}),
              L2L_ERR_INVALID, "tokens");

  /* NULL pointers */
  CHECK_FAILS(l2l_relay_step(&loss, NULL, &b), L2L_ERR_INVALID, "run");
  CHECK_FAILS(l2l_relay_step(&loss, r, NULL), L2L_ERR_INVALID, "batch");
  CHECK_FAILS(l2l_relay_step(NULL, r, &b), L2L_ERR_INVALID, "loss");
  CHECK_FAILS(l2l_relay_get_stats(NULL, r), L2L_ERR_INVALID, "out");
  CHECK_FAILS(l2l_relay_insert(r, 1, NULL), L2L_ERR_INVALID, "layer");
  CHECK_FAILS(l2l_relay_sync(NULL), L2L_ERR_INVALID, "run");
  CHECK(l2l_relay_layer_count(NULL) == -1 && l2l_relay_layer(r, n) == NULL &&
            l2l_relay_layer(r, -1) == NULL && l2l_relay_frozen(r, n) == -1,
        "accessors out of range");

  /* indexes and policies out of range */
  l2l_layer *extra = model_block_new(&g, 0);
  CHECK_FAILS(l2l_relay_insert(r, n + 1, extra), L2L_ERR_INVALID, "index");
  CHECK_FAILS(l2l_relay_insert(r, -1, extra), L2L_ERR_INVALID, "index");
  CHECK_FAILS(l2l_relay_remove(r, n), L2L_ERR_INVALID, "index");
  CHECK_FAILS(l2l_relay_remove(r, -1), L2L_ERR_INVALID, "index");
  CHECK_FAILS(l2l_relay_replace(r, n, extra), L2L_ERR_INVALID, "index");
  CHECK_FAILS(l2l_relay_set_frozen(r, n, 1), L2L_ERR_INVALID, "index");
  CHECK_FAILS(l2l_relay_set_frozen(r, 1, 2), L2L_ERR_INVALID, "frozen");
  CHECK_FAILS(l2l_relay_set_stash(r, 0, L2L_STASH_HOST), L2L_ERR_INVALID, "boundary");
  CHECK_FAILS(l2l_relay_set_stash(r, n, L2L_STASH_HOST), L2L_ERR_INVALID, "boundary");
  CHECK_FAILS(l2l_relay_set_stash(r, 1, (l2l_stash_policy)3), L2L_ERR_INVALID, "policy");
  CHECK_FAILS(l2l_relay_set_inner(r, n, L2L_INNER_KEEP), L2L_ERR_INVALID, "index");
  CHECK_FAILS(l2l_relay_set_inner(r, -1, L2L_INNER_KEEP), L2L_ERR_INVALID, "index");
  CHECK_FAILS(l2l_relay_set_inner(r, 1, (l2l_inner_policy)3), L2L_ERR_INVALID, "policy");
  CHECK_FAILS(l2l_relay_set_micro_batch(r, 0), L2L_ERR_INVALID, "micro_batch");
  CHECK_FAILS(l2l_relay_set_micro_batch(r, -2), L2L_ERR_INVALID, "micro_batch");
  /* a layer already in the relay, a layer whose dim does not fit */
  CHECK_FAILS2(l2l_relay_insert(r, 1, m.layer[2]), L2L_ERR_INVALID, L2L_ERR_STATE, "relay");
  struct shape wide = g;
  wide.D = 30, wide.H = 3;
  l2l_layer *misfit = model_block_new(&wide, 0);
  CHECK_FAILS(l2l_relay_insert(r, 1, misfit), L2L_ERR_INVALID, "dim");
  /* events and states out of range */
  l2l_relay_event ev[2];
  CHECK_FAILS(l2l_relay_events(ev, r, before.events, 1), L2L_ERR_INVALID, "count");
  CHECK_FAILS(l2l_relay_events(ev, r, -1, 1), L2L_ERR_INVALID, "first");
  l2l_tensor *st = NULL;
  CHECK_FAILS(l2l_relay_param_state(&st, r, l2l_layer_param(m.layer[1], 0), 2), L2L_ERR_INVALID,
              "which");
  CHECK_FAILS(l2l_relay_param_state(&st, r, l2l_layer_param(extra, 0), 0), L2L_ERR_INVALID,
              "param");

  /* a device budget too small for one layer: refused, and the relay trains once the
     budget is lifted */
  l2l_pool_stats ps;
  CHECK_OK(l2l_pool_get_stats(&ps, L2L_POOL_DEVICE));
  if (CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, ps.current + 4096))) {
    b = relay_batch(&d, NULL);
    CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_BUDGET, "device pool's budget");
    CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, 0));
  }
  /* so is a relay budget of its own under the step's peak (the pool's untouched) */
  uint64_t pool_budget = ps.budget;
  if (CHECK_OK(l2l_relay_set_device_budget(r, 4096))) {
    b = relay_batch(&d, NULL);
    CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_BUDGET, "relay's device budget of 4096");
    CHECK_FAILS(l2l_relay_evaluate(&loss, r, &b), L2L_ERR_BUDGET, "relay's device budget of 4096");
    CHECK_OK(l2l_pool_get_stats(&ps, L2L_POOL_DEVICE));
    CHECK(ps.budget == pool_budget, "the relay's budget set the pool's: %llu",
          (unsigned long long)ps.budget);
    CHECK_OK(l2l_relay_set_device_budget(r, 0));
  }

  check_unchanged(r, &s, "after refused calls");
  l2l_relay_stats after = relay_stats(r);
  CHECK(after.steps == before.steps && after.updates == before.updates,
        "stats.steps %lld -> %lld, updates %lld -> %lld across refused calls",
        (long long)before.steps, (long long)after.steps, (long long)before.updates,
        (long long)after.updates);
  CHECK(l2l_relay_layer_count(r) == n, "layer count %d -> %d", n, l2l_relay_layer_count(r));
  CHECK(relay_step(&loss, r, &d, NULL) && isfinite(loss), "no good step after refusals");
  snapshot_free(&s);
  l2l_layer_free(extra);
  l2l_layer_free(misfit);
  l2l_tensor_free(flat);
  l2l_tensor_free(ftok);
  l2l_tensor_free(big);
  l2l_tensor_free(dev);
  l2l_tensor_free(short_t);
  l2l_tensor_free(bad_t);
  l2l_tensor_free(mask32);
done:
  l2l_pool_set_budget(L2L_POOL_DEVICE, 0);
  l2l_relay_free(r);
  data_free(&d);
  model_free(&m);
}

TEST(relay_refuses_bad_configs_and_models) {
  /* l2l_relay_new: each bad config field refused with its name, *out untouched; bad
     layer lists; an empty relay that refuses to step. */
  struct shape g = gpt_shape();
  struct model m;
  model_new(&m, &g);
  l2l_relay *r = (l2l_relay *)&m; /* a sentinel: a refused call must not write *out */
  l2l_relay_config base = adamw_config();
  struct {
    const char *needle;
    l2l_relay_config c;
  } bad[40];
  int nb = 0;
#define BAD(field_needle, stmt) \
  do {                          \
    bad[nb].needle = (field_needle); \
    bad[nb].c = base;           \
    { l2l_relay_config *c = &bad[nb].c; stmt; } \
    nb++;                       \
  } while (0)
  BAD("micro_batch", c->micro_batch = 0);
  BAD("micro_batch", c->micro_batch = -4);
  BAD("stash", c->stash = (l2l_stash_policy)3);
  BAD("stash", c->stash = (l2l_stash_policy)-1);
  BAD("recompute_every", (c->stash = L2L_STASH_RECOMPUTE, c->recompute_every = 0));
  BAD("inner", c->inner = (l2l_inner_policy)3);
  BAD("kind", c->optimizer.kind = (l2l_optimizer_kind)3);
  BAD("lr", c->optimizer.lr = -1e-3f);
  BAD("lr", c->optimizer.lr = NAN);
  BAD("beta1", c->optimizer.beta1 = 1.0f);
  BAD("beta2", c->optimizer.beta2 = -0.1f);
  BAD("eps", c->optimizer.eps = 0.0f);
  BAD("weight_decay", c->optimizer.weight_decay = -0.1f);
  BAD("decay_all", c->optimizer.decay_all = 2);
  BAD("momentum", (c->optimizer.kind = L2L_OPTIMIZER_SGD, c->optimizer.momentum = 1.0f));
  BAD("nesterov", (c->optimizer.kind = L2L_OPTIMIZER_SGD, c->optimizer.momentum = 0.9f,
                   c->optimizer.nesterov = 2));
  BAD("nesterov", (c->optimizer.kind = L2L_OPTIMIZER_SGD, c->optimizer.momentum = 0.0f,
                   c->optimizer.nesterov = 1));
  BAD("kind", c->schedule.kind = (l2l_schedule_kind)7);
  BAD("warmup", c->schedule.warmup = -1);
  BAD("total", (c->schedule.kind = L2L_SCHEDULE_COSINE, c->schedule.warmup = 10,
                c->schedule.total = 10));
  BAD("final_ratio", (c->schedule.kind = L2L_SCHEDULE_LINEAR, c->schedule.total = 10,
                      c->schedule.final_ratio = 1.5f));
  BAD("clip_global_norm", c->clip_global_norm = -1.0f);
  BAD("clip_global_norm", c->clip_global_norm = NAN);
  BAD("clip_layer_norm", c->clip_layer_norm = -1.0f);
  BAD("accumulate", c->accumulate = 0);
  BAD("optimizer_threads", c->optimizer_threads = -1);
  BAD("loss_scale", c->loss_scale = -1.0f);
  BAD("loss_scale", c->loss_scale = INFINITY);
  BAD("loss_scale", c->loss_scale = 1e-30f);
  BAD("loss_scale_window", (c->loss_scale = 1024.0f, c->loss_scale_window = -1));
  BAD("param_slots", c->param_slots = 1);
  BAD("param_slots", c->param_slots = -2);
  BAD("param_slots", c->param_slots = 4097);
  BAD("precision", c->precision = L2L_I32);
  BAD("precision", c->precision = (l2l_dtype)7);
  BAD("grad_precision", c->grad_precision = L2L_U8);
  BAD("grad_precision", c->grad_precision = (l2l_dtype)-1);
  BAD("grad_precision f16 needs loss_scale", c->grad_precision = L2L_F16);
#undef BAD
  for (int i = 0; i < nb; i++) {
    l2l_relay *out = r;
    CHECK_FAILS(l2l_relay_new(&out, m.layer, m.n, &bad[i].c), L2L_ERR_INVALID, bad[i].needle);
    CHECK(out == r, "case %d (%s): *out written by a refused call", i, bad[i].needle);
    if (out != r) l2l_relay_free(out);
  }
  /* NULL arguments, bad layer lists */
  CHECK_FAILS(l2l_relay_new(NULL, m.layer, m.n, &base), L2L_ERR_INVALID, "out");
  l2l_relay *out = NULL;
  CHECK_FAILS(l2l_relay_new(&out, m.layer, m.n, NULL), L2L_ERR_INVALID, "config");
  CHECK_FAILS(l2l_relay_new(&out, NULL, 3, &base), L2L_ERR_INVALID, "layers");
  CHECK_FAILS(l2l_relay_new(&out, m.layer, -1, &base), L2L_ERR_INVALID, "nlayers");
  l2l_layer *holes[3] = {m.layer[0], NULL, m.layer[m.n - 1]};
  CHECK_FAILS(l2l_relay_new(&out, holes, 3, &base), L2L_ERR_INVALID, "layer");
  struct shape wide = g;
  wide.D = 30, wide.H = 3;
  l2l_layer *misfit = model_block_new(&wide, 0);
  l2l_layer *mixed[3] = {m.layer[0], misfit, m.layer[m.n - 1]};
  CHECK_FAILS(l2l_relay_new(&out, mixed, 3, &base), L2L_ERR_INVALID, "dim");
  l2l_layer_config dc = model_layer_config(&g, L2L_LAYER_BLOCK);
  l2l_layer *on_device = NULL;
  CHECK_OK(l2l_layer_new(&on_device, &dc, L2L_POOL_DEVICE));
  l2l_layer *dev_list[3] = {m.layer[0], on_device, m.layer[m.n - 1]};
  CHECK_FAILS(l2l_relay_new(&out, dev_list, 3, &base), L2L_ERR_INVALID, "pool");
  CHECK(out == NULL, "*out written by a refused call");
  /* the same layer in two relays */
  l2l_relay *first = relay_new(&m, &base);
  if (first) {
    CHECK_FAILS2(l2l_relay_new(&out, m.layer, m.n, &base), L2L_ERR_INVALID, L2L_ERR_STATE,
                 "relay");
    l2l_relay_free(out);
    out = NULL;
  }
  l2l_relay_free(first);
  /* an empty relay: made, but it refuses to step */
  l2l_relay *empty = NULL;
  if (CHECK_OK(l2l_relay_new(&empty, NULL, 0, &base))) {
    CHECK(l2l_relay_layer_count(empty) == 0, "layer count %d", l2l_relay_layer_count(empty));
    struct data d;
    data_new(&d, &g, 2, g.S, 0, 1.0);
    l2l_relay_batch b = relay_batch(&d, NULL);
    double loss;
    CHECK_FAILS2(l2l_relay_step(&loss, empty, &b), L2L_ERR_STATE, L2L_ERR_INVALID, "layer");
    CHECK(relay_stats(empty).steps == 0, "an empty relay counted a step");
    data_free(&d);
  }
  l2l_relay_free(empty);
  l2l_relay_free(NULL);
  l2l_layer_free(misfit);
  l2l_layer_free(on_device);
  model_free(&m);
}

TEST(relay_restores_optimizer_state_and_progress) {
  /* A second relay over copies of the first one's layers, given every record's optimizer
     state and update count and the steps done, continues bit for bit like the first
     (what checkpoints rely on); bad restores are refused and change nothing. */
  struct shape g = gpt_shape();
  struct model a, b;
  model_new(&a, &g);
  model_new(&b, &g);
  struct data d;
  data_new(&d, &g, 5, g.S, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  cfg.schedule.kind = L2L_SCHEDULE_COSINE, cfg.schedule.warmup = 2, cfg.schedule.total = 20;
  l2l_relay *ra = relay_new(&a, &cfg), *rb = relay_new(&b, &cfg);
  double la, lb;
  if (ra == NULL || rb == NULL) goto done;
  for (int i = 0; i < 3; i++)
    if (!relay_step(&la, ra, &d, NULL)) goto done;
  CHECK_OK(l2l_relay_sync(ra));
  for (int l = 0; l < a.n; l++) {
    CHECK_OK(l2l_layer_set_rng_id(b.layer[l], l2l_layer_rng_id(a.layer[l])));
    for (int i = 0; i < l2l_layer_param_count(a.layer[l]); i++) {
      l2l_param *pa = l2l_layer_param(a.layer[l], i), *pb = l2l_layer_param(b.layer[l], i);
      CHECK_OK(l2l_tensor_copy(l2l_param_value(pb), l2l_param_value(pa)));
      int64_t t = -1;
      l2l_tensor *m = NULL, *v = NULL;
      CHECK_OK(l2l_relay_param_updates(&t, ra, pa));
      CHECK(t == 3, "layer %d param %d: %lld updates after 3 steps", l, i, (long long)t);
      CHECK_OK(l2l_relay_param_state(&m, ra, pa, 0));
      CHECK_OK(l2l_relay_param_state(&v, ra, pa, 1));
      CHECK_OK(l2l_relay_restore_param(rb, pb, t, m, v));
    }
  }
  /* refusals, after which the restored state is intact */
  l2l_param *p0 = l2l_layer_param(a.layer[1], 2), *q0 = l2l_layer_param(b.layer[1], 2);
  l2l_tensor *m0 = NULL, *v0 = NULL;
  CHECK_OK(l2l_relay_param_state(&m0, ra, p0, 0));
  CHECK_OK(l2l_relay_param_state(&v0, ra, p0, 1));
  l2l_tensor *short_m = view_rows(m0, 0, l2l_tensor_dim(m0, 0) - 1);
  l2l_tensor *ints = NEW(L2L_POOL_HOST, L2L_I32, l2l_tensor_numel(m0));
  CHECK_FAILS(l2l_relay_restore_param(rb, q0, 3, short_m, v0), L2L_ERR_INVALID, "first");
  CHECK_FAILS(l2l_relay_restore_param(rb, q0, 3, m0, ints), L2L_ERR_INVALID, "second");
  CHECK_FAILS(l2l_relay_restore_param(rb, q0, 3, m0, NULL), L2L_ERR_INVALID, "second");
  CHECK_FAILS(l2l_relay_restore_param(rb, q0, 0, m0, v0), L2L_ERR_INVALID, "first");
  CHECK_FAILS(l2l_relay_restore_param(rb, q0, -1, NULL, NULL), L2L_ERR_INVALID, "updates");
  CHECK_FAILS(l2l_relay_restore_param(rb, p0, 3, m0, v0), L2L_ERR_INVALID, "param");
  CHECK_FAILS(l2l_relay_restore_param(NULL, q0, 3, m0, v0), L2L_ERR_INVALID, "run");
  CHECK_FAILS(l2l_relay_restore_progress(rb, 2, 3), L2L_ERR_INVALID, "updates");
  CHECK_FAILS(l2l_relay_restore_progress(rb, -1, 0), L2L_ERR_INVALID, "steps");
  int64_t t = 0;
  CHECK_FAILS(l2l_relay_param_updates(NULL, rb, q0), L2L_ERR_INVALID, "out");
  CHECK_FAILS(l2l_relay_param_updates(&t, rb, p0), L2L_ERR_INVALID, "param");
  CHECK_OK(l2l_relay_restore_progress(rb, 3, 3));
  CHECK(l2l_relay_stash(rb, 0) == -1 && l2l_relay_stash(rb, 1) == L2L_STASH_HOST &&
        l2l_relay_inner(rb, b.n) == -1 && l2l_relay_inner(rb, 0) == L2L_INNER_RECOMPUTE,
        "policy getters");
  for (int i = 0; i < 4; i++) {
    if (!relay_step(&la, ra, &d, NULL) || !relay_step(&lb, rb, &d, NULL)) break;
    CHECK(la == lb, "step %d after the restore: %.17g on the first relay, %.17g on the second",
          4 + i, la, lb);
  }
  l2l_relay_stats sb = relay_stats(rb);
  CHECK(sb.steps == 7 && sb.updates == 7, "steps %lld, updates %lld", (long long)sb.steps,
        (long long)sb.updates);
  l2l_tensor_free(short_m);
  l2l_tensor_free(ints);
done:
  l2l_relay_free(ra);
  l2l_relay_free(rb);
  data_free(&d);
  model_free(&a);
  model_free(&b);
}
