/* SPDX-License-Identifier: MIT */
/* test_api_misuse_relay.c — the optimizers, the schedules and the relay of include/l2l.h called
 * with what they must refuse: the optimizer state's arrays, a schedule's settings, a
 * relay's config, model changes, steps, stats and events, its state and restores; and the
 * defects this file found, each failing before its fix. test_api_misuse.c says what a
 * refusal must do (the documented status, a message naming what is wrong, set by this call,
 * and nothing changed: watched tensors' bytes and handles, *out, the pools' bytes in use)
 * and how; misuse.h holds the harness. Which tests cover which functions is said above each
 * test. All test names start with "misuse_".
 */
#include <ctype.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misuse.h"

/* ---------------------------------------------------------------- optimizers */

/* Covers: l2l_optimizer_state_arrays, l2l_state_array_bytes (and what they answer for good
   configs). */
TEST(misuse_optimizer_state_arrays) {
  l2l_relay_config rc;
  l2l_relay_config_default(&rc);
  l2l_optimizer_config good = rc.optimizer;   /* AdamW */
  int out = -77;
  REFUSES(l2l_optimizer_state_arrays(NULL, &good), L2L_ERR_INVALID, "out");
  REFUSES(l2l_optimizer_state_arrays(&out, NULL), L2L_ERR_INVALID, "config");
  l2l_optimizer_config bad = good;
  bad.kind = (l2l_optimizer_kind)7;
  REFUSES(l2l_optimizer_state_arrays(&out, &bad), L2L_ERR_INVALID, "kind 7");
  bad = good;
  bad.lr = NAN;
  REFUSES(l2l_optimizer_state_arrays(&out, &bad), L2L_ERR_INVALID, "lr");
  CHECK(out == -77, "a refusal wrote %d", out);
  CHECK(l2l_optimizer_state_arrays(&out, &good) == L2L_OK && out == 2, "AdamW: %d arrays", out);
  l2l_optimizer_config sgd = good;
  sgd.kind = L2L_OPTIMIZER_SGD;
  sgd.momentum = 0;
  CHECK(l2l_optimizer_state_arrays(&out, &sgd) == L2L_OK && out == 0, "SGD: %d arrays", out);
  sgd.momentum = 0.9f;
  CHECK(l2l_optimizer_state_arrays(&out, &sgd) == L2L_OK && out == 1, "SGD with momentum: %d arrays", out);
  bad = good;
  bad.state = (l2l_state_precision)3;
  REFUSES(l2l_optimizer_state_arrays(&out, &bad), L2L_ERR_INVALID, "state 3");
  uint64_t bytes = 77;
  REFUSES(l2l_state_array_bytes(NULL, L2L_STATE_F32, 5), L2L_ERR_INVALID, "out");
  REFUSES(l2l_state_array_bytes(&bytes, (l2l_state_precision)-1, 5), L2L_ERR_INVALID, "state -1");
  REFUSES(l2l_state_array_bytes(&bytes, L2L_STATE_BF16, -5), L2L_ERR_INVALID, "n must be");
  REFUSES(l2l_state_array_bytes(&bytes, L2L_STATE_BF16, INT64_MAX), L2L_ERR_INVALID, "n must be");
  CHECK(bytes == 77, "a refusal wrote %llu", (unsigned long long)bytes);
  /* 4, 2 and 1 bytes an element, 8 bits with a scale a block after its padded codes */
  int64_t n = 2 * L2L_STATE_BLOCK + 3;
  CHECK(l2l_state_array_bytes(&bytes, L2L_STATE_F32, n) == L2L_OK && bytes == 4 * (uint64_t)n, "f32");
  CHECK(l2l_state_array_bytes(&bytes, L2L_STATE_BF16, n) == L2L_OK && bytes == 2 * (uint64_t)n, "bf16");
  CHECK(l2l_state_array_bytes(&bytes, L2L_STATE_8BIT, n) == L2L_OK && bytes == (uint64_t)n + 1 + 3 * 4,
        "8bit: %llu bytes", (unsigned long long)bytes);
}

/* Covers: l2l_state_array_check (its value checks: test_quant's quant_state_check). */
TEST(misuse_state_array_check) {
  l2l_relay_config rc;
  l2l_relay_config_default(&rc);
  l2l_optimizer_config adam = rc.optimizer;   /* AdamW, f32 state */
  int64_t n = 2 * L2L_STATE_BLOCK + 3;
  l2l_tensor *f32 = NEW(L2L_POOL_HOST, L2L_F32, n), *bf16 = NEW(L2L_POOL_HOST, L2L_BF16, n);
  l2l_tensor *u8 = NEW(L2L_POOL_HOST, L2L_U8, n + 1 + 3 * 4), *i32 = NEW(L2L_POOL_HOST, L2L_I32, n);
  for (int i = 0; i < 3; i++) CHECK_OK(l2l_tensor_fill((l2l_tensor *[]){f32, bf16, u8}[i], 0.0));
  WATCH(f32, bf16, u8, i32);
  REFUSES(l2l_state_array_check(NULL, &adam, 0, n), L2L_ERR_INVALID, "array");
  REFUSES(l2l_state_array_check(JUNK(l2l_tensor), &adam, 0, n), L2L_ERR_INVALID, "array");
  REFUSES(l2l_state_array_check(f32, NULL, 0, n), L2L_ERR_INVALID, "optimizer");
  l2l_optimizer_config bad = adam;
  bad.beta2 = NAN;
  REFUSES(l2l_state_array_check(f32, &bad, 0, n), L2L_ERR_INVALID, "beta2");
  bad = adam;
  bad.kind = (l2l_optimizer_kind)9;
  REFUSES(l2l_state_array_check(f32, &bad, 0, n), L2L_ERR_INVALID, "kind 9");
  const int which[] = {-1, 2, INT32_MAX, INT32_MIN};
  for (size_t i = 0; i < 4; i++)
    REFUSES(l2l_state_array_check(f32, &adam, which[i], n), L2L_ERR_INVALID, "which");
  l2l_optimizer_config sgd = adam;
  sgd.kind = L2L_OPTIMIZER_SGD;
  sgd.momentum = 0;   /* no state at all */
  REFUSES(l2l_state_array_check(f32, &sgd, 0, n), L2L_ERR_INVALID, "which");
  const int64_t sizes[] = {0, -1, INT64_MIN, INT64_MAX, n - 1, n + 1};
  for (size_t i = 0; i < 6; i++)
    REFUSES(l2l_state_array_check(f32, &adam, 0, sizes[i]), L2L_ERR_INVALID, "n");
  REFUSES(l2l_state_array_check(u8, &adam, 0, n + 5), L2L_ERR_INVALID, "elements");
  REFUSES(l2l_state_array_check(i32, &adam, 0, n), L2L_ERR_INVALID, "i32");
  /* zeros are state: every precision, either array */
  for (int a = 0; a < 2; a++) {
    CHECK_OK(l2l_state_array_check(f32, &adam, a, n));
    CHECK_OK(l2l_state_array_check(bf16, &adam, a, n));
    CHECK_OK(l2l_state_array_check(u8, &adam, a, n));
  }
  unwatch();
  l2l_tensor_free(f32), l2l_tensor_free(bf16), l2l_tensor_free(u8), l2l_tensor_free(i32);
}

/* ---------------------------------------------------------------- schedules */

/* Covers: l2l_schedule_lr. */
TEST(misuse_schedule) {
  const l2l_schedule_config good = {L2L_SCHEDULE_COSINE, 10, 100, 0.1f};
  double out = 12345.0;
  REFUSES(l2l_schedule_lr(NULL, &good, 1, 1), L2L_ERR_INVALID, "out");
  REFUSES(l2l_schedule_lr(&out, NULL, 1, 1), L2L_ERR_INVALID, "schedule");
  const int64_t bad_t[] = {0, -1, INT64_MIN};
  for (size_t i = 0; i < 3; i++)
    REFUSES(l2l_schedule_lr(&out, &good, 1, bad_t[i]), L2L_ERR_INVALID, "t must");
  const double bad_lr[] = {-1, NAN, INFINITY, -INFINITY, -DBL_MIN};
  for (size_t i = 0; i < sizeof bad_lr / sizeof bad_lr[0]; i++)
    REFUSES(l2l_schedule_lr(&out, &good, bad_lr[i], 1), L2L_ERR_INVALID, "base_lr");
  struct {
    const char *needle;
    l2l_schedule_config s;
  } bad[] = {
      {"kind 3", {(l2l_schedule_kind)3, 0, 10, 0}},
      {"kind -1", {(l2l_schedule_kind)-1, 0, 10, 0}},
      {"warmup", {L2L_SCHEDULE_CONSTANT, -1, 0, 1}},
      {"warmup", {L2L_SCHEDULE_LINEAR, INT64_MIN, 10, 0}},
      {"total", {L2L_SCHEDULE_COSINE, 10, 10, 0}},
      {"total", {L2L_SCHEDULE_COSINE, 10, 9, 0}},
      {"total", {L2L_SCHEDULE_LINEAR, 0, INT64_MIN, 0}},
      {"total", {L2L_SCHEDULE_LINEAR, INT64_MAX, INT64_MAX, 0}},
      {"final_ratio", {L2L_SCHEDULE_COSINE, 0, 10, 1.5f}},
      {"final_ratio", {L2L_SCHEDULE_LINEAR, 0, 10, -0.1f}},
      {"final_ratio", {L2L_SCHEDULE_LINEAR, 0, 10, NAN}},
      {"final_ratio", {L2L_SCHEDULE_CONSTANT, 0, 0, INFINITY}},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    REFUSES(l2l_schedule_lr(&out, &bad[i].s, 1, 1), L2L_ERR_INVALID, bad[i].needle);
  CHECK(out == 12345.0, "*out written by a refusal: %g", out);
  /* the ends of the ranges are good calls */
  CHECK_OK(l2l_schedule_lr(&out, &good, 1, INT64_MAX));
  CHECK(fabs(out - 0.1) < 1e-6, "after total: %g, want the final ratio", out);
  const l2l_schedule_config late = {L2L_SCHEDULE_LINEAR, 0, INT64_MAX, 0};
  CHECK_OK(l2l_schedule_lr(&out, &late, 1, INT64_MAX - 1));
  CHECK(isfinite(out) && out >= 0 && out <= 1, "at INT64_MAX - 1 of INT64_MAX: %g", out);
  const l2l_schedule_config warm = {L2L_SCHEDULE_CONSTANT, INT64_MAX, -5, 1};
  CHECK_OK(l2l_schedule_lr(&out, &warm, 2, INT64_MAX));
  CHECK(out == 2.0, "the last warm-up step: %g", out);
}

/* ---------------------------------------------------------------- the relay */

/* Covers: l2l_relay_config_default, l2l_relay_config_check, l2l_relay_option_count, l2l_relay_option, l2l_relay_new, l2l_relay_free, l2l_relay_layer_count,
   l2l_relay_layer, l2l_relay_frozen, l2l_relay_stash, l2l_relay_inner. */
TEST(misuse_relay_new_and_accessors) {
  struct shape g = gpt_shape();
  struct model m;
  model_new(&m, &g);
  l2l_relay_config_default(NULL); /* nothing to write: nothing happens */
  l2l_relay_config base = relay_config();
  l2l_relay *out = SENTINEL(l2l_relay);
  watch_model(&m);
  REFUSES(l2l_relay_new(NULL, m.layer, m.n, &base), L2L_ERR_INVALID, "out");
  REFUSES(l2l_relay_new(&out, m.layer, m.n, NULL), L2L_ERR_INVALID, "config");
  REFUSES(l2l_relay_new(&out, NULL, 3, &base), L2L_ERR_INVALID, "layers is NULL, but nlayers is 3");
  REFUSES(l2l_relay_new(&out, m.layer, -1, &base), L2L_ERR_INVALID, "nlayers");
  REFUSES(l2l_relay_new(&out, m.layer, INT_MIN, &base), L2L_ERR_INVALID, "nlayers");
  static struct {
    const char *needle;
    l2l_relay_config c;
  } bad[64];
  int nb = 0;
#define BAD(needle_, stmt)              \
  do {                                  \
    bad[nb].needle = (needle_);         \
    bad[nb].c = base;                   \
    {                                   \
      l2l_relay_config *c = &bad[nb].c; \
      stmt;                             \
    }                                   \
    nb++;                               \
  } while (0)
  BAD("micro_batch", c->micro_batch = INT64_MIN);
  BAD("stash", c->stash = (l2l_stash_policy)99);
  BAD("stash", c->stash = (l2l_stash_policy)INT_MIN);
  BAD("recompute_every", (c->stash = L2L_STASH_RECOMPUTE, c->recompute_every = INT_MIN));
  BAD("inner", c->inner = (l2l_inner_policy)-1);
  BAD("kind", c->optimizer.kind = (l2l_optimizer_kind)-1);
  BAD("lr", c->optimizer.lr = INFINITY);
  BAD("eps", c->optimizer.eps = NAN);
  BAD("momentum", c->optimizer.momentum = NAN);
  BAD("kind", c->schedule.kind = (l2l_schedule_kind)-1);
  BAD("warmup", c->schedule.warmup = INT64_MIN);
  BAD("final_ratio", c->schedule.final_ratio = NAN);
  BAD("clip_global_norm", c->clip_global_norm = INFINITY);
  BAD("clip_layer_norm", c->clip_layer_norm = NAN);
  BAD("accumulate", c->accumulate = INT_MIN);
  BAD("optimizer_threads", c->optimizer_threads = 1025);
  BAD("optimizer_threads", c->optimizer_threads = INT_MAX);
  BAD("optimizer_threads", c->optimizer_threads = INT_MIN);
  BAD("loss_scale", c->loss_scale = NAN);
  BAD("loss_scale", c->loss_scale = 0x1p101f);
  BAD("loss_scale_window", (c->loss_scale = 1024, c->loss_scale_window = INT_MIN));
  BAD("param_slots", c->param_slots = INT_MAX);
  BAD("param_slots", c->param_slots = INT_MIN);
  BAD("precision", c->precision = (l2l_dtype)99);
  BAD("precision", c->precision = (l2l_dtype)-1);
  BAD("grad_precision", c->grad_precision = (l2l_dtype)99);
  BAD("nonfinite_error", c->nonfinite_error = 2);
  BAD("nonfinite_error", c->nonfinite_error = -1);
  BAD("spill_dir", c->spill_dir = "");
  BAD("state", c->optimizer.state = (l2l_state_precision)3);
  BAD("master", c->master = L2L_F16);
  BAD("master", c->master = (l2l_dtype)-1);
  BAD("master bf16 needs precision bf16", (c->master = L2L_BF16, c->precision = L2L_F32));
#undef BAD
  for (int i = 0; i < nb; i++) {
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_relay_new(&out, m.layer, m.n, &bad[%d].c) (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_relay_new(&out, m.layer, m.n, &bad[i].c)), L2L_ERR_INVALID,
               bad[i].needle, __FILE__, __LINE__, expr);
    snprintf(expr, sizeof expr, "l2l_relay_config_check(&bad[%d].c) (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_relay_config_check(&bad[i].c)), L2L_ERR_INVALID, bad[i].needle,
               __FILE__, __LINE__, expr);
  }
  REFUSES(l2l_relay_config_check(NULL), L2L_ERR_INVALID, "config");
  {  /* a refused field: the detail names it, and where the words name it past the function's */
    l2l_relay_config c = base;
    c.accumulate = 0;
    REFUSES(l2l_relay_config_check(&c), L2L_ERR_INVALID, "config->accumulate");
    l2l_error_detail d;
    CHECK_OK(l2l_last_error_detail(&d));
    const char *msg = l2l_last_error();
    CHECK(strcmp(d.field, "accumulate") == 0 && d.layer == -1 && d.micro_batch == -1,
          "detail: field '%s', layer %d, micro-batch %lld", d.field, d.layer, (long long)d.micro_batch);
    CHECK(strncmp(msg, "l2l_relay_config_check: ", (size_t)d.text) == 0 && d.text == 24,
          "text at %d of \"%s\"", d.text, msg);
    CHECK(d.field_named.bytes == 18 && strncmp(msg + d.field_named.at, "config->accumulate", 18) == 0,
          "the field named at %d (%d bytes) of \"%s\"", d.field_named.at, d.field_named.bytes, msg);
  }
  CHECK_OK(l2l_relay_config_check(&base));
  /* the option table's rows: an index out of range or no out is refused, out untouched */
  int rows = l2l_relay_option_count();
  CHECK(rows >= 30, "the option table has %d rows", rows);
  const l2l_option *row = SENTINEL(const l2l_option);
  REFUSES(l2l_relay_option(NULL, 0), L2L_ERR_INVALID, "out");
  REFUSES(l2l_relay_option(&row, -1), L2L_ERR_INVALID, "index");
  REFUSES(l2l_relay_option(&row, rows), L2L_ERR_INVALID, "index");
  REFUSES(l2l_relay_option(&row, INT_MIN), L2L_ERR_INVALID, "index");
  CHECK(row == SENTINEL(const l2l_option), "a refused l2l_relay_option wrote its out");
  CHECK_OK(l2l_relay_option(&row, rows - 1));
  /* layer lists: what is no layer, a layer twice, a layer that does not fit */
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  struct shape wide = g;
  wide.D = 30, wide.H = 3;
  l2l_layer *misfit = model_block_new(&wide, 0);
  l2l_layer_config dc = model_layer_config(&g, L2L_LAYER_BLOCK);
  l2l_layer *on_device = layer_in(&dc, L2L_POOL_DEVICE);
  l2l_layer *list[MAX_LAYERS + 1];
  const struct {
    l2l_layer *layer;
    const char *needle;
  } intruders[] = {{NULL, "layers[1]"},
                   {JUNK(l2l_layer), "layers[1]"},
                   {AS(l2l_layer, t), "layers[1]"},
                   {AS(l2l_layer, l2l_layer_param(m.layer[1], 0)), "layers[1]"},
                   {m.layer[0], "already"},
                   {misfit, "dim"},
                   {on_device, "pool"}};
  for (size_t i = 0; i < sizeof intruders / sizeof intruders[0]; i++) {
    list[0] = m.layer[0], list[1] = intruders[i].layer, list[2] = m.layer[m.n - 1];
    REFUSES(l2l_relay_new(&out, list, 3, &base), L2L_ERR_INVALID, intruders[i].needle);
    /* refused after the whole model joined, with 16-bit staging copies in the pinned pool */
    memcpy(list, m.layer, (size_t)m.n * sizeof *list);
    list[m.n] = intruders[i].layer;
    l2l_relay_config half = base;
    half.precision = L2L_BF16;
    REFUSES(l2l_relay_new(&out, list, m.n + 1, &half), L2L_ERR_INVALID, "layers[");
    l2l_error_detail detail;   /* the refusal names the layer in its detail too */
    CHECK_OK(l2l_last_error_detail(&detail));
    CHECK(detail.layer == m.n, "case %zu: the refusal's detail names layer %d, want %d", i, detail.layer, m.n);
    char named[32];   /* and where its words name it */
    int len = snprintf(named, sizeof named, "layers[%d]", m.n);
    CHECK(detail.layer_named.bytes == len && strncmp(l2l_last_error() + detail.layer_named.at, named, (size_t)len) == 0,
          "case %zu: layer named at %d (%d bytes) of \"%s\"", i, detail.layer_named.at, detail.layer_named.bytes,
          l2l_last_error());
  }
  CHECK(out == SENTINEL(l2l_relay), "*out written by a refused l2l_relay_new");
  /* the layers of refused relays belong to none: a relay takes them */
  l2l_relay *r = NULL;
  if (!CHECK_OK(l2l_relay_new(&r, m.layer, m.n, &base))) goto done;

  const l2l_relay *nots[] = {NULL, JUNK(l2l_relay), AS(l2l_relay, m.layer[1]), AS(l2l_relay, t)};
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    const l2l_relay *n = nots[i];
    CHECK(l2l_relay_layer_count(n) == -1 && l2l_relay_layer(n, 0) == NULL &&
              l2l_relay_frozen(n, 0) == -1 && l2l_relay_stash(n, 1) == -1 &&
              l2l_relay_inner(n, 0) == -1,
          "case %zu: a relay accessor answered for what is no relay", i);
  }
  const int bad_index[] = {-1, m.n, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++)
    CHECK(l2l_relay_layer(r, bad_index[i]) == NULL && l2l_relay_frozen(r, bad_index[i]) == -1 &&
              l2l_relay_inner(r, bad_index[i]) == -1 && l2l_relay_stash(r, bad_index[i]) == -1,
          "index %d of a relay of %d layers answered", bad_index[i], m.n);
  CHECK(l2l_relay_stash(r, 0) == -1, "boundary 0 (before the first layer) has a policy");
  /* which relay holds a layer: none for what is no layer */
  const l2l_layer *not_layers[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, r), AS(l2l_layer, t)};
  for (size_t i = 0; i < sizeof not_layers / sizeof not_layers[0]; i++)
    CHECK(l2l_layer_relay(not_layers[i]) == NULL, "case %zu: no layer is in a relay", i);
  CHECK(l2l_layer_relay(m.layer[1]) == r, "the relay's layer is not in it");
  /* destructors ignore what is no relay */
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) l2l_relay_free((l2l_relay *)nots[i]);
  CHECK(l2l_relay_layer_count(r) == m.n && l2l_layer_param_count(m.layer[1]) > 0 &&
            l2l_tensor_numel(t) == 8,
        "l2l_relay_free hurt a relay, a layer or a tensor");
  l2l_relay_free(r);
done:
  unwatch();
  l2l_tensor_free(t);
  l2l_layer_free(misfit);
  l2l_layer_free(on_device);
  model_free(&m);
}

/* Covers: the run argument of every relay call; l2l_relay_insert, l2l_relay_remove,
   l2l_relay_replace, l2l_relay_set_frozen, l2l_relay_set_stash, l2l_relay_set_inner,
   l2l_relay_set_micro_batch, l2l_relay_set_device_budget, l2l_relay_set_host_budget,
   l2l_relay_sync. */
TEST(misuse_relay_model_changes) {
  struct rig rig, other;
  l2l_relay_config c = relay_config();
  bool ready = rig_new(&rig, &c);
  ready &= rig_new(&other, &c);
  if (!ready) {
    rig_free(&rig);
    rig_free(&other);
    return;
  }
  l2l_relay *r = rig.r;
  const int n = rig.m.n;
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  l2l_layer *extra = model_block_new(&rig.g, 0);
  struct shape wide = rig.g;
  wide.D = 30, wide.H = 3;
  l2l_layer *misfit = model_block_new(&wide, 0);
  l2l_layer_config dc = model_layer_config(&rig.g, L2L_LAYER_BLOCK);
  l2l_layer *on_device = layer_in(&dc, L2L_POOL_DEVICE);
  watch_model(&rig.m);
  watch_layer(extra);
  l2l_relay_batch b = batch_of(&rig.d);
  l2l_param *p = l2l_layer_param(rig.m.layer[1], 0);
  double loss = 12345.0;
  int64_t count = -77;
  l2l_tensor *state = SENTINEL(l2l_tensor);
  l2l_relay_stats st;
  l2l_relay_event ev[4];

  /* every call that takes a relay: NULL and what is no relay */
  const l2l_relay *nots[] = {NULL, JUNK(l2l_relay), AS(l2l_relay, rig.m.layer[1]), AS(l2l_relay, t),
                             AS(l2l_relay, p)};
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    l2l_relay *x = (l2l_relay *)nots[i];
    REFUSES(l2l_relay_insert(x, 1, extra), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_remove(x, 1), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_replace(x, 1, extra), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_frozen(x, 1, 1), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_stash(x, 1, L2L_STASH_DEVICE), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_inner(x, 1, L2L_INNER_KEEP), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_micro_batch(x, 3), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_device_budget(x, 3), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_host_budget(x, 3), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_sync(x), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_step(&loss, x, &b), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_evaluate(&loss, x, &b), L2L_ERR_INVALID, "run");
    uint64_t peak_out = 7;
    REFUSES(l2l_relay_step_peak(&peak_out, x, 2, 4, 0, 0), L2L_ERR_INVALID, "run");
    CHECK(peak_out == 7, "a refused step_peak wrote its output");
    REFUSES(l2l_relay_get_stats(&st, x), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_events(ev, x, 0, 1), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_param_state(&state, x, p, 0), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_param_updates(&count, x, p), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_restore_param(x, p, 0, NULL, NULL), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_restore_progress(x, 1, 1), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_restore_loss_scale(x, 1, 0, 0), L2L_ERR_INVALID, "run");
  }
  CHECK(loss == 12345.0 && count == -77 && state == SENTINEL(l2l_tensor),
        "an output written by a call refused for its run");

  /* the model's changes: indexes, layers, policies */
  int stash[MAX_LAYERS], inner[MAX_LAYERS], frozen[MAX_LAYERS];
  for (int i = 0; i < n; i++)
    stash[i] = l2l_relay_stash(r, i), inner[i] = l2l_relay_inner(r, i),
    frozen[i] = l2l_relay_frozen(r, i);
  const int bad_insert[] = {-1, n + 1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_insert / sizeof bad_insert[0]; i++)
    REFUSES(l2l_relay_insert(r, bad_insert[i], extra), L2L_ERR_INVALID, "index");
  const int bad_index[] = {-1, n, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++) {
    REFUSES(l2l_relay_remove(r, bad_index[i]), L2L_ERR_INVALID, "index");
    REFUSES(l2l_relay_replace(r, bad_index[i], extra), L2L_ERR_INVALID, "index");
    REFUSES(l2l_relay_set_frozen(r, bad_index[i], 1), L2L_ERR_INVALID, "index");
    REFUSES(l2l_relay_set_inner(r, bad_index[i], L2L_INNER_KEEP), L2L_ERR_INVALID, "index");
  }
  const l2l_layer *not_layers[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, t), AS(l2l_layer, p),
                                   AS(l2l_layer, r)};
  for (size_t i = 0; i < sizeof not_layers / sizeof not_layers[0]; i++) {
    REFUSES(l2l_relay_insert(r, 1, (l2l_layer *)not_layers[i]), L2L_ERR_INVALID, "layer");
    REFUSES(l2l_relay_replace(r, 1, (l2l_layer *)not_layers[i]), L2L_ERR_INVALID, "layer");
  }
  REFUSES(l2l_relay_insert(r, 1, rig.m.layer[2]), L2L_ERR_INVALID, "already");
  REFUSES(l2l_relay_replace(r, 1, rig.m.layer[2]), L2L_ERR_INVALID, "already");
  REFUSES(l2l_relay_insert(r, 1, other.m.layer[1]), L2L_ERR_STATE, "another relay");
  REFUSES(l2l_relay_replace(r, 1, other.m.layer[1]), L2L_ERR_STATE, "another relay");
  REFUSES(l2l_relay_insert(r, 1, misfit), L2L_ERR_INVALID, "dim");
  REFUSES(l2l_relay_replace(r, 1, misfit), L2L_ERR_INVALID, "dim");
  REFUSES(l2l_relay_insert(r, 1, on_device), L2L_ERR_INVALID, "pool");
  REFUSES(l2l_relay_replace(r, 1, on_device), L2L_ERR_INVALID, "pool");
  const int bad_flags[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_flags / sizeof bad_flags[0]; i++)
    REFUSES(l2l_relay_set_frozen(r, 1, bad_flags[i]), L2L_ERR_INVALID, "frozen");
  const int bad_boundary[] = {0, n, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_boundary / sizeof bad_boundary[0]; i++)
    REFUSES(l2l_relay_set_stash(r, bad_boundary[i], L2L_STASH_DEVICE), L2L_ERR_INVALID, "boundary");
  const int bad_policy[] = {3, -1, 99, INT_MIN};
  for (size_t i = 0; i < sizeof bad_policy / sizeof bad_policy[0]; i++) {
    REFUSES(l2l_relay_set_stash(r, 1, (l2l_stash_policy)bad_policy[i]), L2L_ERR_INVALID, "policy");
    REFUSES(l2l_relay_set_inner(r, 1, (l2l_inner_policy)bad_policy[i]), L2L_ERR_INVALID, "policy");
  }
  const int64_t bad_micro[] = {0, -1, INT64_MIN};
  for (size_t i = 0; i < 3; i++)
    REFUSES(l2l_relay_set_micro_batch(r, bad_micro[i]), L2L_ERR_INVALID, "micro_batch");
  /* all as it was, and the relay still trains */
  CHECK(l2l_relay_layer_count(r) == n, "layer count %d, want %d", l2l_relay_layer_count(r), n);
  bool same = true;
  for (int i = 0; i < n; i++)
    same &= l2l_relay_layer(r, i) == rig.m.layer[i] && l2l_relay_stash(r, i) == stash[i] &&
            l2l_relay_inner(r, i) == inner[i] && l2l_relay_frozen(r, i) == frozen[i];
  CHECK(same, "the model or its policies changed by refusals");
  unwatch();
  CHECK_OK(l2l_relay_step(&loss, r, &b));
  CHECK(isfinite(loss), "loss %g after refusals", loss);
  CHECK_OK(l2l_relay_set_micro_batch(r, INT64_MAX)); /* more than the batch: one micro-batch */
  CHECK_OK(l2l_relay_step(&loss, r, &b));
  CHECK_OK(l2l_relay_sync(r));
  l2l_tensor_free(t);
  l2l_layer_free(extra);
  l2l_layer_free(misfit);
  l2l_layer_free(on_device);
  rig_free(&other);
  rig_free(&rig);
}

/* Covers: l2l_relay_step, l2l_relay_evaluate, l2l_relay_step_peak, l2l_relay_get_stats,
   l2l_relay_events. */
TEST(misuse_relay_steps_stats_and_events) {
  struct rig rig;
  l2l_relay_config c = relay_config();
  if (!rig_new(&rig, &c)) {
    rig_free(&rig);
    return;
  }
  l2l_relay *r = rig.r;
  const int n = rig.m.n;
  l2l_relay_stats before, st, poisoned;
  CHECK_OK(l2l_relay_get_stats(&before, r));
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  l2l_tensor *tt = IDS((int32_t)rig.g.V, rig.g.S, 4);
  watch_model(&rig.m);
  WATCH(rig.d.tokens, rig.d.targets, rig.d.key_mask);
  double loss = 12345.0;
  l2l_relay_batch good = batch_of(&rig.d), b;
  /* named as the caller called it, not after a check inside the step */
  REFUSES(l2l_relay_step(NULL, r, &good), L2L_ERR_INVALID, "l2l_relay_step: loss is NULL");
  REFUSES(l2l_relay_evaluate(NULL, r, &good), L2L_ERR_INVALID, "l2l_relay_evaluate: loss is NULL");
  REFUSES(l2l_relay_step(&loss, r, NULL), L2L_ERR_INVALID, "l2l_relay_step: batch is NULL");
  REFUSES(l2l_relay_evaluate(&loss, r, NULL), L2L_ERR_INVALID, "l2l_relay_evaluate: batch is NULL");
  b = good, b.targets = NULL;
  REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "l2l_relay_step: batch->targets is NULL");
  /* step_peak: its output, the batch's shape and the two flags */
  uint64_t peak = 12345;
  REFUSES(l2l_relay_step_peak(NULL, r, 2, 4, 0, 0), L2L_ERR_INVALID, "peak");
  static const int64_t bad_sizes[][2] = {{0, 4}, {2, 0}, {-1, 4}, {2, -3}, {(INT64_C(1) << 24) + 1, 4},
                                         {2, (INT64_C(1) << 24) + 1}, {INT64_MIN, 4}};
  for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++)
    REFUSES(l2l_relay_step_peak(&peak, r, bad_sizes[i][0], bad_sizes[i][1], 0, 0), L2L_ERR_INVALID,
            "batch and seq");
  REFUSES(l2l_relay_step_peak(&peak, r, 2, 4, 2, 0), L2L_ERR_INVALID, "token_types");
  REFUSES(l2l_relay_step_peak(&peak, r, 2, 4, 0, -1), L2L_ERR_INVALID, "key_mask");
  l2l_layer_config emb;
  CHECK_OK(l2l_layer_get_config(&emb, rig.m.layer[0]));
  REFUSES(l2l_relay_step_peak(&peak, r, 2, emb.max_seq + 1 + check_rand_int(0, 100), 0, 0), L2L_ERR_INVALID,
          "more than the embedding's max_seq");
  CHECK_OK(l2l_relay_step_peak(&peak, r, 2, emb.max_seq, 0, 0));   /* (its whole context runs) */
  peak = 12345;
  CHECK(peak == 12345, "a refused step_peak wrote its output");
  CHECK_OK(l2l_relay_step_peak(&peak, r, 2, 4, 0, 0));
  CHECK(peak > 0 && peak < (UINT64_C(1) << 40), "step_peak of a small model: %llu bytes",
        (unsigned long long)peak);
  const l2l_tensor *foreign[] = {JUNK(l2l_tensor), AS(l2l_tensor, rig.m.layer[1]),
                                 AS(l2l_tensor, r)};
  for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
    b = good, b.tokens = foreign[i];
    REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "tokens");
    REFUSES(l2l_relay_evaluate(&loss, r, &b), L2L_ERR_INVALID, "tokens");
    b = good, b.targets = foreign[i];
    REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "targets");
    b = good, b.key_mask = foreign[i];
    REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "key_mask");
    b = good, b.token_types = foreign[i];
    REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "token_types");
  }
  /* the batch lives in the host or pinned pool: the relay moves its micro-batches itself */
  l2l_tensor *dtargets = remake(rig.d.targets, L2L_POOL_DEVICE, L2L_I32);
  l2l_tensor *dmask = remake(rig.d.key_mask, L2L_POOL_DEVICE, L2L_U8);
  b = good, b.targets = dtargets;
  REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "targets must be in the host");
  b = good, b.key_mask = dmask;
  REFUSES(l2l_relay_evaluate(&loss, r, &b), L2L_ERR_INVALID, "key_mask must be in the host");
  FREE(dtargets, dmask);
  b = good, b.tokens = tt, b.key_mask = NULL; /* transposed: (S,B) */
  REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "targets");
  uint8_t skip[MAX_LAYERS] = {0};
  skip[1] = 2;
  b = good, b.skip = skip;
  REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "skip[1]");
  skip[1] = 0, skip[n - 1] = 1;
  REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "skip");
  skip[n - 1] = 255;
  REFUSES(l2l_relay_evaluate(&loss, r, &b), L2L_ERR_INVALID, "skip");
  CHECK(loss == 12345.0, "*loss written by a refused step: %g", loss);

  /* stats and events */
  memset(&poisoned, 0xa5, sizeof poisoned);
  st = poisoned;
  REFUSES(l2l_relay_get_stats(NULL, r), L2L_ERR_INVALID, "out");
  CHECK_OK(l2l_relay_get_stats(&st, r));
  CHECK(st.steps == before.steps && st.updates == before.updates,
        "steps %lld -> %lld, updates %lld -> %lld across refused steps", (long long)before.steps,
        (long long)st.steps, (long long)before.updates, (long long)st.updates);
  int64_t events = st.events;
  l2l_relay_event ev[4], ev_poisoned[4];
  memset(ev_poisoned, 0xa5, sizeof ev_poisoned);
  memcpy(ev, ev_poisoned, sizeof ev);
  REFUSES(l2l_relay_events(NULL, r, 0, 1), L2L_ERR_INVALID, "out");
  const int64_t ranges[][2] = {
      {-1, 1},         {INT64_MIN, 1}, {0, -1},        {0, INT64_MIN},         {events, 1},
      {events - 1, 2}, {INT64_MAX, 1}, {1, INT64_MAX}, {INT64_MAX, INT64_MAX}, {events + 1, 0 + 1}};
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_relay_events(ev, r, %lld, %lld) of %lld events",
             (long long)ranges[i][0], (long long)ranges[i][1], (long long)events);
    refused_at((arm(), l2l_relay_events(ev, r, ranges[i][0], ranges[i][1])), L2L_ERR_INVALID,
               ranges[i][0] < 0 ? "first" : "count", __FILE__, __LINE__, expr);
  }
  CHECK(memcmp(ev, ev_poisoned, sizeof ev) == 0, "events written by a refusal");
  unwatch();
  CHECK_OK(l2l_relay_events(NULL, r, 0, 0)); /* nothing to copy */
  if (events >= 2) CHECK_OK(l2l_relay_events(ev, r, events - 2, 2));
  CHECK_OK(l2l_relay_step(&loss, r, &good));
  CHECK_OK(l2l_relay_evaluate(&loss, r, &good));
  CHECK_OK(l2l_relay_get_stats(&st, r));
  CHECK(st.steps == before.steps + 1, "steps %lld, want %lld", (long long)st.steps,
        (long long)before.steps + 1);
  l2l_tensor_free(t);
  l2l_tensor_free(tt);
  rig_free(&rig);
}

/* Covers: l2l_relay_param_state, l2l_relay_param_updates, l2l_relay_restore_param,
   l2l_relay_restore_progress, l2l_relay_restore_loss_scale. Found here: restore_param took
   updates = INT64_MAX (the next update's t overflowed int64), and named a state that is no
   tensor "f32, got (null)"; then (issue 47) INT64_MAX - 1, whose second update overflowed:
   every count is capped at 2^53 - 1, where a checkpoint's loader caps it (the largest
   integer its JSON holds exactly), so no count can reach int64's end by counting on. */
TEST(misuse_relay_state_and_restores) {
  struct rig rig, scaled;
  l2l_relay_config c = relay_config(), cs = relay_config();
  cs.loss_scale = 1024;
  bool ready = rig_new(&rig, &c);
  ready &= rig_new(&scaled, &cs);
  if (!ready) {
    rig_free(&rig);
    rig_free(&scaled);
    return;
  }
  l2l_relay *r = rig.r;
  l2l_layer *outsider = model_block_new(&rig.g, 0);
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  l2l_param *p = l2l_layer_param(rig.m.layer[1], 2); /* attn.qkv.weight */
  l2l_tensor *first = NULL, *second = NULL;
  int64_t updates = -1;
  if (!CHECK_OK(l2l_relay_param_state(&first, r, p, 0)) ||
      !CHECK_OK(l2l_relay_param_state(&second, r, p, 1)) ||
      !CHECK_OK(l2l_relay_param_updates(&updates, r, p)) ||
      !CHECK(first != NULL && second != NULL && updates == 2, "no optimizer state after 2 steps"))
    goto done;
  watch_model(&rig.m);
  WATCH(first, second);
  l2l_relay_stats before;
  CHECK_OK(l2l_relay_get_stats(&before, r));
  const l2l_param *not_params[] = {NULL, JUNK(l2l_param), AS(l2l_param, rig.m.layer[1]),
                                   AS(l2l_param, t), l2l_layer_param(outsider, 2)};
  l2l_tensor *state = SENTINEL(l2l_tensor);
  int64_t count = -77;
  REFUSES(l2l_relay_param_state(NULL, r, p, 0), L2L_ERR_INVALID, "out");
  REFUSES(l2l_relay_param_updates(NULL, r, p), L2L_ERR_INVALID, "out");
  for (size_t i = 0; i < sizeof not_params / sizeof not_params[0]; i++) {
    REFUSES(l2l_relay_param_state(&state, r, not_params[i], 0), L2L_ERR_INVALID, "param");
    REFUSES(l2l_relay_param_updates(&count, r, not_params[i]), L2L_ERR_INVALID, "param");
    REFUSES(l2l_relay_restore_param(r, not_params[i], 1, first, second), L2L_ERR_INVALID, "param");
  }
  const int bad_which[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_which / sizeof bad_which[0]; i++)
    REFUSES(l2l_relay_param_state(&state, r, p, bad_which[i]), L2L_ERR_INVALID, "which");
  CHECK(state == SENTINEL(l2l_tensor) && count == -77, "*out written by a refusal");

  /* restore_param: the state arrays the optimizer keeps, f32, of the record's size */
  /* INT64_MAX: the next update (t + 1) would overflow int64 (it did, in the EPS: UB) */
  const int64_t bad_updates[] = {-1, INT64_MIN, INT64_MAX, INT64_MAX - 1, (INT64_C(1) << 53),
                                 check_rand_int(INT64_C(1) << 53, INT64_MAX)};
  for (size_t i = 0; i < sizeof bad_updates / sizeof bad_updates[0]; i++)
    REFUSES(l2l_relay_restore_param(r, p, bad_updates[i], first, second), L2L_ERR_INVALID,
            "updates");
  int64_t numel_p = l2l_tensor_numel(first);
  l2l_tensor *fi = remake(first, L2L_POOL_HOST, L2L_I32),
             *longer = NEW(L2L_POOL_HOST, L2L_F32, numel_p + 1);
  l2l_tensor *shorter = NEW(L2L_POOL_HOST, L2L_F32, numel_p - 1);
  /* 8-bit state of the record is numel_p codes, padding and scales: numel_p bytes is short */
  l2l_tensor *bytes_short = NEW(L2L_POOL_HOST, L2L_U8, numel_p);
  /* a copy of the state with one value an inf, and one negative (a second moment's) */
  l2l_tensor *poisoned = NEW(L2L_POOL_HOST, L2L_F32, numel_p),
             *negative = NEW(L2L_POOL_HOST, L2L_F32, numel_p);
  CHECK_OK(l2l_tensor_copy(poisoned, second));   /* >= 0: fits either array but for the inf */
  CHECK_OK(l2l_tensor_copy(negative, second));
  ((float *)l2l_tensor_data(poisoned))[numel_p / 2] = INFINITY;
  ((float *)l2l_tensor_data(negative))[numel_p - 1] = -1.0f;
  WATCH(fi, longer, shorter, bytes_short, poisoned, negative);
  REFUSES(l2l_relay_restore_param(r, p, 5, first, negative), L2L_ERR_INVALID, "second moment >= 0");
  REFUSES(l2l_relay_restore_param(r, p, 5, NULL, second), L2L_ERR_INVALID, "first is NULL");
  REFUSES(l2l_relay_restore_param(r, p, 5, first, NULL), L2L_ERR_INVALID, "second is NULL");
  REFUSES(l2l_relay_restore_param(r, p, 0, first, NULL), L2L_ERR_INVALID, "first must be NULL");
  REFUSES(l2l_relay_restore_param(r, p, 0, NULL, second), L2L_ERR_INVALID, "second must be NULL");
  const struct {
    const l2l_tensor *t;
    const char *needle;
  } bad_states[] = {{JUNK(l2l_tensor), "is not a live tensor"},
                    {AS(l2l_tensor, rig.m.layer[1]), "is not a live tensor"},
                    {fi, "must be f32, bf16 or u8 (8-bit state), got i32"},
                    {longer, "elements"},
                    {shorter, "elements"},
                    {bytes_short, "elements"},
                    {poisoned, "holds inf"}};
  for (size_t i = 0; i < sizeof bad_states / sizeof bad_states[0]; i++) {
    char needle[80];
    snprintf(needle, sizeof needle, "first %s", bad_states[i].needle);
    REFUSES(l2l_relay_restore_param(r, p, 5, bad_states[i].t, second), L2L_ERR_INVALID,
            strstr(needle, "elements") ? "first has" : needle);
    snprintf(needle, sizeof needle, "second %s", bad_states[i].needle);
    REFUSES(l2l_relay_restore_param(r, p, 5, first, bad_states[i].t), L2L_ERR_INVALID,
            strstr(needle, "elements") ? "second has" : needle);
  }
  l2l_tensor *now = NULL;
  CHECK_OK(l2l_relay_param_updates(&count, r, p));
  CHECK_OK(l2l_relay_param_state(&now, r, p, 0));
  CHECK(count == updates && now == first, "the record changed by refused restores");

  /* restore_progress: 0 <= updates <= steps */
  const int64_t bad_progress[][2] = {{-1, 0},
                                     {0, -1},
                                     {1, 2},
                                     {INT64_MIN, 0},
                                     {0, INT64_MIN},
                                     {5, INT64_MAX},
                                     {INT64_MIN, INT64_MIN},
                                     {INT64_MAX - 1, 0},
                                     {INT64_C(1) << 53, 1},
                                     {INT64_MAX - 1, INT64_MAX - 1}};
  for (size_t i = 0; i < sizeof bad_progress / sizeof bad_progress[0]; i++)
    REFUSES(l2l_relay_restore_progress(r, bad_progress[i][0], bad_progress[i][1]), L2L_ERR_INVALID,
            "updates <= steps");
  /* restore_loss_scale: only where the loss is scaled; scale 2^-64 to 2^100; 0 <= good <
     window; skipped >= 0 */
  REFUSES(l2l_relay_restore_loss_scale(r, 1024, 0, 0), L2L_ERR_STATE, "loss_scale");
  const double bad_scales[] = {0, -1, NAN, INFINITY, 0x1p101, 0x1p-65};
  for (size_t i = 0; i < sizeof bad_scales / sizeof bad_scales[0]; i++)
    REFUSES(l2l_relay_restore_loss_scale(scaled.r, bad_scales[i], 0, 0), L2L_ERR_INVALID, "scale");
  const int64_t bad_good[] = {-1, 2000, INT64_MAX, INT64_MIN};
  for (size_t i = 0; i < sizeof bad_good / sizeof bad_good[0]; i++)
    REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, bad_good[i], 0), L2L_ERR_INVALID, "good");
  REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, 0, -1), L2L_ERR_INVALID, "skipped");
  REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, 0, INT64_MIN), L2L_ERR_INVALID, "skipped");
  REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, 0, INT64_MAX), L2L_ERR_INVALID, "skipped");
  REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, 0, INT64_C(1) << 53), L2L_ERR_INVALID, "skipped");
  l2l_relay_stats after;
  CHECK_OK(l2l_relay_get_stats(&after, r));
  CHECK(after.steps == before.steps && after.updates == before.updates, "progress changed");
  unwatch();
  /* good restores afterwards: the record's own state and count, the progress it has */
  l2l_tensor *f2 = like_in(first, L2L_POOL_HOST), *s2 = like_in(second, L2L_POOL_HOST);
  CHECK_OK(l2l_tensor_copy(f2, first));
  CHECK_OK(l2l_tensor_copy(s2, second));
  CHECK_OK(l2l_relay_restore_param(r, p, updates, f2, s2));
  CHECK_OK(l2l_relay_restore_progress(r, before.steps, before.updates));
  CHECK_OK(l2l_relay_restore_loss_scale(scaled.r, 8, 1, 0));
  /* at the cap every count is taken, and steps count on from it (UBSan watches) */
  const int64_t cap = (INT64_C(1) << 53) - 1;
  l2l_relay_batch b = batch_of(&rig.d);
  double loss;
  if (CHECK_OK(l2l_relay_restore_param(r, p, cap, f2, s2)) &&
      CHECK_OK(l2l_relay_restore_progress(r, cap, cap)) && CHECK_OK(l2l_relay_step(&loss, r, &b)) &&
      CHECK_OK(l2l_relay_step(&loss, r, &b)) && CHECK_OK(l2l_relay_param_updates(&count, r, p)))
    CHECK(count == cap + 2, "updates %lld after two steps from %lld", (long long)count, (long long)cap);
  FREE(fi, longer, shorter, f2, s2);
done:
  unwatch();
  l2l_tensor_free(t);
  l2l_layer_free(outsider);
  rig_free(&scaled);
  rig_free(&rig);
}

/* ---------------------------------------------------------------- found by this file
   Each failed before its fix: a tie of a head that is in a relay freed a record the EPS
   held (the next step dereferenced NULL); progress of INT64_MAX steps overflowed the next
   step's count; an empty range of events was accepted at any first. */
TEST(misuse_tie_in_a_relay_progress_past_counting_and_empty_event_ranges) {
  struct rig rig;
  l2l_relay_config c = relay_config();
  if (!rig_new(&rig, &c)) {
    rig_free(&rig);
    return;
  }
  l2l_relay *r = rig.r;
  l2l_relay_batch b = batch_of(&rig.d);
  double loss;
  /* 1: a tie that would change the records of a layer in a relay */
  l2l_layer_config ec = model_layer_config(&rig.g, L2L_LAYER_EMBEDDING);
  l2l_layer *other = layer_in(&ec, L2L_POOL_HOST);
  l2l_layer *head = rig.m.layer[rig.m.n - 1];
  watch_model(&rig.m);
  REFUSES(l2l_layer_tie(head, other), L2L_ERR_STATE, "relay");
  unwatch();
  CHECK_OK(l2l_relay_step(&loss, r, &b));
  CHECK_OK(l2l_relay_sync(r));   /* the step's updates are done: what follows changes nothing */
  watch_model(&rig.m);
  /* 2: progress whose next step cannot be counted */
  REFUSES(l2l_relay_restore_progress(r, INT64_MAX, INT64_MAX), L2L_ERR_INVALID, "steps");
  /* 3: first out of range with nothing to copy */
  REFUSES(l2l_relay_events(NULL, r, -1, 0), L2L_ERR_INVALID, "first");
  REFUSES(l2l_relay_events(NULL, r, INT64_MAX, 0), L2L_ERR_INVALID, "first");
  unwatch();
  l2l_layer_free(other);
  rig_free(&rig);
}

/* Covers: l2l_plan_new, l2l_plan_get, l2l_plan_get_layer, l2l_plan_free,
   l2l_relay_calibrate_plan (and its deprecated name l2l_plan_calibrate),
   l2l_relay_apply_plan. */
