/* SPDX-License-Identifier: MIT */
/* test_relay_placement.c — records placed on the device (l2l_relay_config.placement,
 * issue 49) against records on the host.
 *
 * What it tests: that a relay whose records live on the device (masters, gradient
 * accumulators and optimizer state in the device pool, each gradient added and each record
 * updated there through the backend's ops table) trains to the bit as one whose records
 * live on the host (the EPS's workers): losses and every weight and state array, for
 * AdamW, SGD with momentum (Nesterov) and LAMB, on f32, bf16 and 8-bit optimizer state
 * (a checkpoint and auto's moves draw the state's precision), gradient accumulation, global clipping
 * (deferred updates), 16-bit weights and gradients, f16 with loss scaling, a frozen layer
 * tied to a trainable one, a gradient made infinite between steps (the record skipped on
 * the device's own flag), a checkpoint saved on one placement and resumed on either, and
 * layers inserted, cloned and removed between steps; that nothing of a record is in host
 * memory then (stats.host_eps_bytes 0, the parameters' values in the device pool, no
 * weight copied onto the device), that the values come home equal when the relay is
 * freed; and that what is not built for the device yet is refused naming the option.
 * How: on the CPU backend the device pool is host memory and the device's ops are the
 * EPS's own host kernels, cut in the EPS's chunks (backend.h), so the two placements run
 * the same arithmetic in the same order: any difference in a bit is a fault of the
 * placement's bookkeeping (a gradient added twice or not at all, an update at the wrong
 * time or with a stale count, a skip not taken).
 * Must never: take an expected value from the device placement.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay_rig.h"

enum { STEPS = 4 };

/* Whether two runs' records (the same model's, layer by layer) hold the same bits:
   values, update counts and state arrays. */
static bool same_records(l2l_relay *a, const struct model *ma, l2l_relay *b,
                         const struct model *mb, const char *what) {
  bool ok = CHECK_OK(l2l_relay_sync(a)) && CHECK_OK(l2l_relay_sync(b));
  for (int i = 0; ok && i < ma->n; i++)
    for (int j = 0; ok && j < l2l_layer_param_count(ma->layer[i]); j++) {
      const l2l_param *pa = l2l_layer_param(ma->layer[i], j), *pb = l2l_layer_param(mb->layer[i], j);
      const l2l_tensor *va = param_value(pa), *vb = param_value(pb);
      size_t bytes = (size_t)l2l_tensor_numel(va) * l2l_dtype_size(l2l_tensor_dtype(va));
      ok &= CHECK(memcmp(l2l_tensor_data(va), l2l_tensor_data(vb), bytes) == 0,
                  "%s: layer %d %s: weights differ", what, i, l2l_param_name(pa));
      int64_t ua = -1, ub = -2;
      ok &= CHECK_OK(l2l_relay_param_updates(&ua, a, pa)) && CHECK_OK(l2l_relay_param_updates(&ub, b, pb));
      ok &= CHECK(ua == ub, "%s: layer %d %s: %lld updates against %lld", what, i,
                  l2l_param_name(pa), (long long)ua, (long long)ub);
      for (int s = 0; ok && s < 2; s++) {
        l2l_tensor *sa = NULL, *sb = NULL;
        ok &= CHECK_OK(l2l_relay_param_state(&sa, a, pa, s)) && CHECK_OK(l2l_relay_param_state(&sb, b, pb, s));
        if (!ok || (sa == NULL && sb == NULL)) continue;   /* (the relay's: borrowed) */
        ok &= CHECK(sa != NULL && sb != NULL, "%s: layer %d %s: state %d on one side only", what,
                    i, l2l_param_name(pa), s);
        if (ok)
          ok &= CHECK(memcmp(l2l_tensor_data(sa), l2l_tensor_data(sb),
                             (size_t)l2l_tensor_numel(sa) * l2l_dtype_size(l2l_tensor_dtype(sa))) == 0,
                      "%s: layer %d %s: state %d differs", what, i, l2l_param_name(pa), s);
      }
    }
  return ok;
}

/* What a relay keeps in host memory, and where its parameters' values live. */
static bool all_in(const struct model *m, l2l_pool_kind pool, const char *what) {
  bool ok = true;
  for (int i = 0; ok && i < m->n; i++)
    for (int j = 0; ok && j < l2l_layer_param_count(m->layer[i]); j++) {
      const l2l_param *p = l2l_layer_param(m->layer[i], j);
      ok &= CHECK(l2l_tensor_pool(param_value(p)) == (int)pool &&
                      l2l_tensor_pool(param_grad(p)) == (int)pool,
                  "%s: layer %d %s: value in pool %d, grad in pool %d, want %d", what, i,
                  l2l_param_name(p), l2l_tensor_pool(param_value(p)),
                  l2l_tensor_pool(param_grad(p)), (int)pool);
    }
  return ok;
}

/* A change made between steps to both runs alike (NULL: none). */
typedef void (*between_fn)(l2l_relay *r, struct model *m, int step);

/* After a training step, the host copies a frugal LayerNorm guard reads of the records on
   the device hold their masters' values, bit for bit: queued behind the step's updates,
   they are what the next step's guard reads without a wait of its own (eps.h,
   eps_device_guard_copies). Nothing to hold without a frugal layer (none are made then). */
static bool guards_current(l2l_relay *r, const struct model *m, const char *what, int step) {
  bool frugal = false;
  for (int k = 0; k < m->n; k++) {
    l2l_layer_config c;
    l2l_layer_get_config(&c, m->layer[k]);
    frugal |= c.memory == L2L_MEMORY_FRUGAL;
  }
  bool ok = true;
  for (int k = 0; frugal && ok && k < m->n; k++)
    for (int j = 0; ok && j < l2l_layer_param_count(m->layer[k]); j++) {
      l2l_param *p = l2l_layer_param(m->layer[k], j);
      const l2l_tensor *copy = eps_guard_copy(eps_find(&r->eps, p)), *value = param_value(p);
      if (copy == NULL) continue;   /* (not on the device, or not 1-D) */
      l2l_tensor *master = NULL;
      int64_t n = l2l_tensor_numel(value);
      const l2l_dtype dtype = (l2l_dtype)l2l_tensor_dtype(value);
      ok &= CHECK_OK(l2l_tensor_new(&master, L2L_POOL_HOST, dtype, 1, &n)) &&
            CHECK_OK(l2l_tensor_copy(master, value));
      ok = ok && CHECK(memcmp(l2l_tensor_data(master), l2l_tensor_data(copy),
                              (size_t)n * l2l_dtype_size(dtype)) == 0,
                       "%s: after step %d the guard's host copy of layer %d's %s is not its "
                       "master's values", what, step, k, l2l_param_name(p));
      l2l_tensor_free(master);
    }
  return ok;
}

/* Trains clones of `init` with cfg on the host and with cfg's placement (host: device)
   over the batches (with `between` before each step), losses and records compared bit for
   bit after each step, and the device run's guard copies held to their masters. */
static bool placements_match(const struct model *init, const l2l_relay_config *cfg,
                             between_fn between, const struct data *batches, int steps,
                             const char *what) {
  struct model mh, md;
  model_clone(&mh, init);
  model_clone(&md, init);
  l2l_relay_config ch = *cfg, cd = *cfg;
  ch.placement = L2L_PLACE_HOST;
  if (cd.placement == L2L_PLACE_HOST) cd.placement = L2L_PLACE_DEVICE;
  bool all = cd.placement == L2L_PLACE_DEVICE;   /* (auto: as the budget holds them) */
  l2l_relay *rh = relay_new(&mh, &ch), *rd = relay_new(&md, &cd);
  bool ok = rh != NULL && rd != NULL;
  if (ok && all) ok &= all_in(&md, L2L_POOL_DEVICE, what);
  for (int k = 0; ok && k < steps; k++) {
    if (between) between(rh, &mh, k), between(rd, &md, k);
    double lh = NAN, ld = NAN;
    ok &= relay_step(&lh, rh, &batches[k], NULL) && relay_step(&ld, rd, &batches[k], NULL);
    ok &= CHECK(memcmp(&lh, &ld, sizeof lh) == 0, "%s: step %d: loss %a on the device, %a on the host",
                what, k, ld, lh);
    if (ok) ok &= same_records(rh, &mh, rd, &md, what);
    if (ok) ok &= guards_current(rd, &md, what, k);
    l2l_relay_stats sh = relay_stats(rh), sd = relay_stats(rd);
    ok &= CHECK(all ? sd.host_eps_bytes == 0 && sh.host_eps_bytes > 0 : sd.host_eps_bytes <= sh.host_eps_bytes,
                "%s: step %d: host_eps_bytes %llu placed %s, %llu on the host", what, k,
                (unsigned long long)sd.host_eps_bytes, all ? "on the device (want 0)" : "auto",
                (unsigned long long)sh.host_eps_bytes);
    ok &= CHECK(sd.skipped_records == sh.skipped_records && sd.updates == sh.updates,
                "%s: step %d: %lld records skipped and %lld updates on the device, %lld and %lld "
                "on the host", what, k, (long long)sd.skipped_records, (long long)sd.updates,
                (long long)sh.skipped_records, (long long)sh.updates);
    /* the host's copies onto the device carry the weights; the device's carry none */
    ok &= CHECK(all ? sd.h2d_bytes < sh.h2d_bytes : sd.h2d_bytes <= sh.h2d_bytes,
                "%s: step %d: %llu bytes onto the device with the records placed %s, %llu with "
                "them on the host", what, k, (unsigned long long)sd.h2d_bytes,
                all ? "there" : "auto", (unsigned long long)sh.h2d_bytes);
  }
  l2l_relay_free(rh);
  l2l_relay_free(rd);
  ok &= all_in(&md, L2L_POOL_HOST, what);   /* home again, as they were there */
  bool same = true;
  for (int i = 0; ok && i < mh.n; i++)
    for (int j = 0; j < l2l_layer_param_count(mh.layer[i]); j++) {
      const l2l_tensor *a = param_value(l2l_layer_param(mh.layer[i], j));
      const l2l_tensor *b = param_value(l2l_layer_param(md.layer[i], j));
      same &= memcmp(l2l_tensor_data(a), l2l_tensor_data(b),
                     (size_t)l2l_tensor_numel(a) * l2l_dtype_size(l2l_tensor_dtype(a))) == 0;
    }
  ok &= CHECK(same, "%s: the values home after the relays are freed differ", what);
  model_free(&mh);
  model_free(&md);
  return ok;
}

/* A model of shape g and STEPS minibatches of B samples for it. */
static void model_and_batches(struct model *init, struct data *batches, const struct shape *g,
                              int64_t B, int pad) {
  model_new(init, g);
  make_batches(batches, STEPS, g, B, pad, 1.0);
}

/* The variants' LAMB and SGD with Nesterov momentum, in a state precision. */
static l2l_optimizer_config lamb_config(l2l_state_precision state) {
  return (l2l_optimizer_config){.kind = L2L_OPTIMIZER_LAMB, .lr = 0.02f, .beta1 = 0.9f,
                                .beta2 = 0.999f, .eps = 1e-5f, .weight_decay = 0.05f,
                                .state = state};
}
static l2l_optimizer_config nesterov_config(l2l_state_precision state, float weight_decay) {
  return (l2l_optimizer_config){.kind = L2L_OPTIMIZER_SGD, .lr = 0.05f, .momentum = 0.9f,
                                .nesterov = 1, .weight_decay = weight_decay, .state = state};
}

TEST(relay_records_on_the_device_train_as_on_the_host) {
  struct shape g = gpt_shape();   /* dropout, padding, a tied head */
  struct model init;
  struct data batches[STEPS];
  model_and_batches(&init, batches, &g, 5, 1);
  for (int variant = 0; variant < 17; variant++) {
    l2l_relay_config cfg = adamw_config();
    const char *what = "AdamW";
    cfg.micro_batch = 1 + variant % 3;
    cfg.inner = (l2l_inner_policy)(variant % 3);
    cfg.stash = (l2l_stash_policy)(variant % 3);
    switch (variant) {
      case 1:
        cfg.optimizer = nesterov_config(L2L_STATE_F32, 0.01f);
        what = "SGD, Nesterov momentum";
        break;
      case 2:
        cfg.optimizer = lamb_config(L2L_STATE_F32);
        what = "LAMB";
        break;
      case 3: cfg.clip_global_norm = 0.5f, what = "AdamW, global clipping"; break;
      case 4: cfg.accumulate = 2, what = "AdamW, accumulate 2"; break;
      case 5:
        cfg.precision = L2L_BF16, cfg.grad_precision = L2L_BF16;
        what = "AdamW, bf16 weights and gradients";
        break;
      case 6:
        cfg.precision = L2L_F16, cfg.grad_precision = L2L_F16, cfg.loss_scale = 0x1p12;
        what = "AdamW, f16, loss scaling";
        break;
      case 7:
        cfg.optimizer.kind = L2L_OPTIMIZER_SGD, cfg.optimizer.momentum = 0, cfg.param_slots = 3;
        what = "SGD without momentum, three slots";
        break;
      case 8: cfg.optimizer.state = L2L_STATE_BF16, what = "AdamW, bf16 state"; break;
      case 9: cfg.optimizer.state = L2L_STATE_8BIT, what = "AdamW, 8-bit state"; break;
      case 10:
        cfg.optimizer = lamb_config(L2L_STATE_8BIT);
        what = "LAMB, 8-bit state";
        break;
      case 11:
        cfg.optimizer = nesterov_config(L2L_STATE_8BIT, 0.0f);
        cfg.accumulate = 2, cfg.clip_global_norm = 0.5f;
        what = "SGD Nesterov, 8-bit state, accumulate 2, global clipping";
        break;
      case 12:   /* bf16 masters: updated in f32, rounded back by the record's draws */
        cfg.precision = cfg.grad_precision = cfg.master = L2L_BF16;
        what = "AdamW, bf16 masters";
        break;
      case 13:
        cfg.optimizer = lamb_config(L2L_STATE_8BIT);
        cfg.precision = cfg.grad_precision = cfg.master = L2L_BF16;
        what = "LAMB, bf16 masters, 8-bit state";
        break;
      case 14:
        cfg.optimizer = nesterov_config(L2L_STATE_BF16, 0.0f);
        cfg.precision = cfg.master = L2L_BF16, cfg.accumulate = 2;
        what = "SGD Nesterov, bf16 masters and state, f32 gradients, accumulate 2";
        break;
      case 15:   /* each visit's factor found on the device from its gradients */
        cfg.precision = cfg.grad_precision = L2L_BF16, cfg.clip_layer_norm = 0.05f;
        what = "AdamW, per-layer clipping, bf16 gradients";
        break;
      case 16:
        cfg.optimizer = lamb_config(L2L_STATE_8BIT);
        cfg.clip_layer_norm = 0.05f, cfg.clip_global_norm = 0.5f, cfg.accumulate = 2;
        what = "LAMB, 8-bit state, per-layer and global clipping, accumulate 2";
        break;
    }
    placements_match(&init, &cfg, NULL, batches, STEPS, what);
  }
  free_batches(batches, STEPS);
  model_free(&init);
}

/* Between steps: the embedding frozen from step 1 (its table tied to the trainable head:
   a frozen rebuild reads it while the head's update waits), and at step 2 an inf written
   into one element of a block's gradient accumulator (a script's p.grad), which the next
   add finds: that record is skipped, on the device by its flag. */
static void freeze_then_poison(l2l_relay *r, struct model *m, int step) {
  if (step == 1) {
    CHECK_OK(l2l_relay_set_frozen(r, 0, 1));
    CHECK_OK(l2l_relay_set_stash(r, 1, L2L_STASH_RECOMPUTE));
  }
  if (step == 2) {
    l2l_tensor *grad = l2l_param_grad(l2l_layer_param(m->layer[1], 0));
    ((float *)l2l_tensor_data(grad))[l2l_tensor_numel(grad) / 2] = INFINITY;
  }
}

TEST(relay_records_on_the_device_freeze_and_skip_as_on_the_host) {
  struct shape g = gpt_shape();
  g.tie = 1, g.dropout = 0;
  struct model init;
  struct data batches[STEPS];
  model_and_batches(&init, batches, &g, 4, 1);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  if (placements_match(&init, &cfg, freeze_then_poison, batches, STEPS,
                       "a frozen tied embedding, then an inf in a block's gradient")) {
    /* the skip happened (else the test above proves nothing about the flag) */
    struct model m;
    model_clone(&m, &init);
    l2l_relay_config cd = cfg;
    cd.placement = L2L_PLACE_DEVICE;
    l2l_relay *r = relay_new(&m, &cd);
    double loss;
    for (int k = 0; r != NULL && k < 3; k++) {
      freeze_then_poison(r, &m, k);
      relay_step(&loss, r, &batches[k], NULL);
    }
    if (r) {
      l2l_relay_stats s = relay_stats(r);
      CHECK(s.skipped_records == 1, "step 2 skipped %lld records on the device, want 1",
            (long long)s.skipped_records);
    }
    l2l_relay_free(r);
    model_free(&m);
  }
  free_batches(batches, STEPS);
  model_free(&init);
}

/* Between steps: at step 2 the frugal block's first LayerNorm weight (a script's p.value)
   made tiny, past the guard's threshold: the backward must now take the guarded path, which
   the guard knows only from the weights as they are (on the device: its host copy, made
   current as the step begins). */
static void tiny_layernorm(l2l_relay *r, struct model *m, int step) {
  (void)r;
  if (step != 2) return;
  l2l_tensor *w = l2l_param_value(l2l_layer_param(m->layer[1], 0));
  for (int64_t i = 0; i < l2l_tensor_numel(w); i += 3) ((float *)l2l_tensor_data(w))[i] = 1e-9f;
}

TEST(relay_records_on_the_device_guard_their_layernorms_as_on_the_host) {
  struct shape g = gpt_shape();
  g.frugal_block = 0;   /* (layer 1: the frugal one) */
  struct model init;
  struct data batches[STEPS];
  model_and_batches(&init, batches, &g, 3, 1);
  if (CHECK(strcmp(l2l_param_name(l2l_layer_param(init.layer[1], 0)), "ln1.weight") == 0,
            "layer 1's first record is %s", l2l_param_name(l2l_layer_param(init.layer[1], 0)))) {
    l2l_relay_config cfg = adamw_config();
    cfg.micro_batch = 2;
    placements_match(&init, &cfg, tiny_layernorm, batches, STEPS, "a frugal LayerNorm's weight made tiny");
  }
  free_batches(batches, STEPS);
  model_free(&init);
}

/* Between steps: a new block (the same in both runs: a clone of this one) inserted before
   the head (step 1), a clone of the first block inserted after it (step 2), the first
   block removed (step 3). */
static l2l_layer *new_block;

static void change_layers(l2l_relay *r, struct model *m, int step) {
  l2l_layer *layer = NULL;
  if (step == 1) {
    layer = clone_same_rng(new_block);
    if (CHECK_OK(l2l_relay_insert(r, m->n - 1, layer))) model_insert(m, m->n - 1, layer);
  } else if (step == 2) {
    layer = clone_same_rng(m->layer[1]);
    if (CHECK_OK(l2l_relay_insert(r, 2, layer))) model_insert(m, 2, layer);
  } else if (step == 3) {
    if (CHECK_OK(l2l_relay_remove(r, 1))) l2l_layer_free(model_take(m, 1));
  }
}

TEST(relay_records_on_the_device_change_layers_as_on_the_host) {
  struct shape g = gpt_shape();
  g.dropout = 0;
  struct model init;
  struct data batches[STEPS];
  model_and_batches(&init, batches, &g, 3, 0);
  new_block = model_block_new(&g, 0);
  /* f32 masters on the device; bf16 masters on the device (a clone widens one there), and
     placed auto (every record there: no budget), whose records the change must leave
     where they are */
  const char *what[] = {"layers inserted, cloned, removed", "the same with bf16 masters",
                        "the same with bf16 masters, placed auto"};
  for (int v = 0; v < 3; v++) {
    l2l_relay_config cfg = adamw_config();
    if (v > 0) cfg.master = cfg.precision = L2L_BF16;
    if (v == 2) cfg.placement = L2L_PLACE_AUTO;
    placements_match(&init, &cfg, change_layers, batches, STEPS, what[v]);
  }
  l2l_layer_free(new_block);
  free_batches(batches, STEPS);
  model_free(&init);
}

TEST(relay_records_on_the_device_resume_to_the_bit) {
  /* Two steps, a save, two more: a relay made anew and loaded from the file, on either
     placement, with or without a spill file for the host's state, continues as the run
     that never stopped (which was on the device). */
  struct shape g = gpt_shape();
  struct model init;
  struct data batches[STEPS];
  model_and_batches(&init, batches, &g, 4, 1);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  cfg.placement = L2L_PLACE_DEVICE;
  cfg.optimizer.state = (l2l_state_precision)check_rand_int(0, 2);   /* (f32, bf16 or 8 bits) */
  if (check_rand_int(0, 1)) cfg.master = cfg.precision = L2L_BF16;   /* (and its draws) */
  printf("  (state %d, master %s)\n", (int)cfg.optimizer.state, l2l_dtype_name(cfg.master));
  cfg.seed &= (UINT64_C(1) << 53) - 1;   /* (what a checkpoint's JSON holds exactly) */
  char path[64];
  snprintf(path, sizeof path, "/tmp/l2l-placement-%d.safetensors", (int)getpid());
  struct model whole;
  model_clone(&whole, &init);
  l2l_relay *r = relay_new(&whole, &cfg);
  double loss, want[STEPS];
  for (int k = 0; r != NULL && k < STEPS; k++) {
    relay_step(&want[k], r, &batches[k], NULL);
    if (k == 1) CHECK_OK(l2l_relay_save(r, path, NULL));
  }
  char dir[256];
  bool spill_ok = check_temp_dir(dir, sizeof dir, "l2l-resume-spill");
  for (int v = 0; r != NULL && v < (spill_ok ? 4 : 2); v++) {
    bool on = v & 1, spill = v >> 1;
    struct model m;
    model_clone(&m, &init);   /* (weights as they were: the load gives the saved ones) */
    l2l_relay_config c = cfg;
    c.placement = on ? L2L_PLACE_DEVICE : L2L_PLACE_HOST;
    c.spill_dir = spill ? dir : NULL;   /* (no host budget: every host record's state there) */
    char what[64];
    snprintf(what, sizeof what, "resumed on the %s%s", on ? "device" : "host",
             spill ? " beside a spill file" : "");
    l2l_relay *back = relay_new(&m, &c);
    bool ok = back != NULL && CHECK_OK(l2l_relay_load(back, path));
    for (int k = 2; ok && k < STEPS; k++) {
      ok &= relay_step(&loss, back, &batches[k], NULL);
      ok &= CHECK(memcmp(&loss, &want[k], sizeof loss) == 0,
                  "%s: step %d: loss %a, the run that did not stop %a", what, k, loss, want[k]);
    }
    if (ok) same_records(back, &m, r, &whole, what);
    l2l_relay_free(back);
    model_free(&m);
  }
  if (spill_ok) check_remove_dir(dir);
  l2l_relay_free(r);
  unlink(path);
  model_free(&whole);
  free_batches(batches, STEPS);
  model_free(&init);
}

TEST(relay_records_on_the_device_beside_a_spill_file) {
  /* The host's records' state in the spill file (every record's: no host budget), the
     device's records beside it holding theirs there: the same bits as host placement
     with the same file, and nothing of theirs in it. */
  char dir[256];
  if (!check_temp_dir(dir, sizeof dir, "l2l-device-spill")) return;
  struct shape g = gpt_shape();
  struct model init;
  struct data batches[STEPS];
  model_and_batches(&init, batches, &g, 4, 1);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  cfg.optimizer.state = (l2l_state_precision)check_rand_int(0, 2);
  cfg.spill_dir = dir;
  cfg.placement = L2L_PLACE_DEVICE;
  printf("  (state %d)\n", (int)cfg.optimizer.state);
  placements_match(&init, &cfg, NULL, batches, STEPS, "placement device beside a spill file");
  struct model m;
  model_clone(&m, &init);
  l2l_relay *r = relay_new(&m, &cfg);
  double loss;
  for (int k = 0; r != NULL && k < 2 && relay_step(&loss, r, &batches[k], NULL); k++) {
    l2l_relay_stats st = relay_stats(r);
    CHECK(st.spill_written_bytes == 0 && st.spill_read_bytes == 0 && st.spill_file_bytes == 0,
          "step %d: the spill file wrote %llu and read %llu bytes (%llu in all) with every "
          "record on the device", k, (unsigned long long)st.spill_written_bytes,
          (unsigned long long)st.spill_read_bytes, (unsigned long long)st.spill_file_bytes);
  }
  l2l_relay_free(r);
  model_free(&m);
  CHECK(check_dir_entries(dir) == 0, "the spill file outlived its relays");
  check_remove_dir(dir);
  free_batches(batches, STEPS);
  model_free(&init);
}

/* Placement auto under a budget changed between steps (both runs alike): records move to
   the device and back as it allows, the step's peak with them within it. */
static uint64_t auto_budgets[STEPS];

static void auto_budget_step(l2l_relay *r, struct model *m, int step) {
  (void)m;
  CHECK_OK(l2l_relay_set_device_budget(r, auto_budgets[step]));
}

/* The budget of each step: all the records and the step (every record on the device),
   then a third of the records' bytes beside the step with its records on the host (some
   on the device, the rest on the host), then two thirds, then none (no budget: every
   record there). The placed run trains as the host's to the bit whatever it moved. With a
   spill file (spill_dir, not NULL) the host's records keep their state in it (no host
   budget): a record that comes home writes it there after its next update, one that
   leaves for the device reads it back as it moves. Half the draws treat the device as a
   GPU's (L2L_GRADS_OUT=copy): gradients copied out, and a master the device reads as it
   is (f32, here every master not bf16) lives in pinned memory and comes home there. */
/* What the placement-auto tests train: a GPT of gpt_shape without dropout, STEPS
   minibatches of 4 for it, AdamW placed auto in micro-batches of 2. */
static struct shape auto_model(struct model *init, struct data *batches, l2l_relay_config *cfg) {
  struct shape g = gpt_shape();
  g.dropout = 0;
  model_and_batches(init, batches, &g, 4, 1);
  *cfg = adamw_config();
  cfg->micro_batch = 2;
  cfg->placement = L2L_PLACE_AUTO;
  return g;
}

static void auto_fills_the_budget(const char *spill_dir) {
  const char *kept = getenv("L2L_GRADS_OUT");
  if (check_rand_int(0, 1)) setenv("L2L_GRADS_OUT", "copy", 1);
  bool gpu_like = getenv("L2L_GRADS_OUT") != NULL;   /* (drawn, or the caller's) */
  struct model init;
  struct data batches[STEPS];
  l2l_relay_config cfg;
  struct shape g = auto_model(&init, batches, &cfg);
  cfg.optimizer.state = (l2l_state_precision)check_rand_int(0, 2);   /* (moved in its precision) */
  /* f32 throughout; bf16 masters (a bf16 master home pinned); or f32 masters with bf16
     staging copies (a record moved home makes a new one, rewritten before it is read) */
  int precisions = (int)check_rand_int(0, 2);
  if (precisions > 0) cfg.precision = L2L_BF16;
  if (precisions == 1) cfg.master = L2L_BF16;
  /* (per-layer clipping: the tied table's embedding and head are placed together) */
  if (check_rand_int(0, 1)) cfg.clip_layer_norm = 0.05f;
  cfg.spill_dir = spill_dir;
  printf("  (state %d, master %s, precision %s, clip_layer_norm %g, %s, %s)\n",
         (int)cfg.optimizer.state, l2l_dtype_name(cfg.master), l2l_dtype_name(cfg.precision),
         (double)cfg.clip_layer_norm,
         spill_dir ? "the host's state in a spill file" : "in memory",
         gpu_like ? "gradients copied out" : "gradients read in place");
  /* the records' device bytes (the planner's count, held to the pool's in test_plan) and
     the step's peak with them on the host */
  l2l_relay_config cd = cfg;
  cd.placement = L2L_PLACE_DEVICE;
  l2l_plan_rates rates = {.flops = 1e9, .h2d = 1e9, .d2h = 1e9, .optimizer = 1e9};
  l2l_plan_request q = {.batch = 4, .seq = g.S, .device_budget = UINT64_C(1) << 30, .rates = &rates};
  l2l_plan *plan = NULL;
  l2l_plan_summary s = {0};
  uint64_t peak = 0;
  struct model mh;
  model_clone(&mh, &init);
  l2l_relay *rh = relay_new(&mh, &cfg);
  bool ok = rh != NULL && CHECK_OK(l2l_plan_new(&plan, init.layer, init.n, &cd, &q)) &&
            CHECK_OK(l2l_plan_get(&s, plan)) &&
            CHECK_OK(l2l_relay_step_peak(&peak, rh, 4, g.S, batches[0].types != NULL,
                                         batches[0].key_mask != NULL));
  l2l_plan_free(plan);
  l2l_relay_free(rh);
  model_free(&mh);
  uint64_t records = s.device_records_bytes;
  auto_budgets[0] = peak + records + records / 8;
  auto_budgets[1] = peak + records / 3;
  auto_budgets[2] = peak + 2 * records / 3;
  auto_budgets[3] = 0;
  if (ok) ok = placements_match(&init, &cfg, auto_budget_step, batches, STEPS, "placement auto");
  /* and where each step's records were, with the step's peak (one more run, checked step
     by step) */
  struct model m;
  model_clone(&m, &init);
  l2l_pool_stats before;
  CHECK_OK(l2l_pool_get_stats(&before, L2L_POOL_DEVICE));
  l2l_relay *r = ok ? relay_new(&m, &cfg) : NULL;
  for (int k = 0; r != NULL && k < STEPS; k++) {
    double loss;
    auto_budget_step(r, &m, k);
    if (!relay_step(&loss, r, &batches[k], NULL)) break;
    l2l_relay_stats st = relay_stats(r);
    uint64_t used = st.device_peak - before.current;
    int on = 0, n = 0, astray = 0;
    for (int i = 0; i < m.n; i++)
      for (int j = 0; j < l2l_layer_param_count(m.layer[i]); j++, n++) {
        const l2l_tensor *v = param_value(l2l_layer_param(m.layer[i], j));
        int pool = l2l_tensor_pool(v);
        on += pool == L2L_POOL_DEVICE;
        /* on the host, a master the device reads there is pinned: a bf16 one, and a small
           f32 one with no staging copy where the device is a GPU's */
        bool small = l2l_tensor_numel(v) * 4 <= EPS_PINNED_F32_MASTER_MAX;
        struct layers_record_dtypes d = layers_record_dtypes(l2l_layer_param(m.layer[i], j),
                                                             cfg.precision, cfg.master);
        bool read_there = l2l_tensor_dtype(v) == L2L_BF16 || (gpu_like && small && d.staging == L2L_F32);
        astray += pool != L2L_POOL_DEVICE &&
                  pool != (read_there ? L2L_POOL_PINNED : L2L_POOL_HOST);
      }
    CHECK(astray == 0, "step %d: %d masters on the host outside their pool", k, astray);
    if (auto_budgets[k] != 0)
      CHECK(used <= auto_budgets[k], "step %d: the records and the step held %llu bytes on the "
            "device at the peak, over the budget %llu", k, (unsigned long long)used,
            (unsigned long long)auto_budgets[k]);
    if (k == 0 || k == 3)
      CHECK(on == n && st.host_eps_bytes == 0, "step %d: %d of %d parameters on the device, "
            "%llu host bytes: the budget holds them all", k, on, n, (unsigned long long)st.host_eps_bytes);
    if (k == 1 || k == 2)
      CHECK(on > 0 && on < n, "step %d: %d of %d parameters on the device: the budget holds some, "
            "not all", k, on, n);
    CHECK((on == n) == (st.device_records_bytes == records) && (on > 0) == (st.device_records_bytes > 0),
          "step %d: %d of %d parameters on the device, stats.device_records_bytes %llu of %llu", k,
          on, n, (unsigned long long)st.device_records_bytes, (unsigned long long)records);
    /* the host's records' state written out after their updates (step 1's came home) */
    if (spill_dir && (k == 1 || k == 2))
      CHECK(st.spill_written_bytes > 0, "step %d: nothing written to the spill file with %d of "
            "%d parameters on the host", k, n - on, n);
  }
  l2l_relay_free(r);
  model_free(&m);
  /* and once more with nothing between the steps that waits for the last step's updates
     (stats and a record's reads do): a step's moves must wait for them themselves (moved
     under a running update, the record's state went stale, or out to the spill file from
     the device: wrong losses, a crash), against host placement's losses and records */
  struct model ma, mb;
  model_clone(&ma, &init);
  model_clone(&mb, &init);
  l2l_relay_config ch = cfg;
  ch.placement = L2L_PLACE_HOST;
  l2l_relay *ra = ok ? relay_new(&ma, &cfg) : NULL, *rb = ok ? relay_new(&mb, &ch) : NULL;
  bool stepped = ra != NULL && rb != NULL;
  for (int k = 0; stepped && k < STEPS; k++) {
    double la = NAN, lh = NAN;
    auto_budget_step(ra, &ma, k);
    stepped = relay_step(&la, ra, &batches[k], NULL) && relay_step(&lh, rb, &batches[k], NULL) &&
              CHECK(memcmp(&la, &lh, sizeof la) == 0, "not synced between steps: step %d: loss %a "
                    "placed auto, %a on the host", k, la, lh);
  }
  if (stepped) same_records(ra, &ma, rb, &mb, "placement auto, not synced between steps");
  l2l_relay_free(ra);
  l2l_relay_free(rb);
  model_free(&ma);
  model_free(&mb);
  free_batches(batches, STEPS);
  model_free(&init);
  if (kept) setenv("L2L_GRADS_OUT", kept, 1);
  else unsetenv("L2L_GRADS_OUT");
}

TEST(relay_records_placed_auto_fill_the_budget_record_by_record) { auto_fills_the_budget(NULL); }

TEST(relay_records_placed_auto_move_through_a_spill_file) {
  char dir[256];
  if (!check_temp_dir(dir, sizeof dir, "l2l-auto-spill")) return;
  auto_fills_the_budget(dir);
  CHECK(check_dir_entries(dir) == 0, "the spill file outlived its relays");
  check_remove_dir(dir);
}

/* Placement auto with no budget places within the device's memory where the device has
   its own: L2L_DEVICE_MEMORY gives the CPU backend's device a GPU's figures. None free on a
   device too large for any margin to leave room places nothing, plenty free places every
   record, and unset (host memory, which bounds nothing) every record; each trains as host
   placement does, to the bit. */
TEST(relay_records_placed_auto_without_a_budget_fit_the_devices_memory) {
  const char *kept = getenv("L2L_DEVICE_MEMORY");
  struct model init;
  struct data batches[STEPS];
  l2l_relay_config cfg;
  auto_model(&init, batches, &cfg);
  static const char *const memory[] = {NULL, "0,1000000000000000000",
                                       "1000000000000000000,1000000000000000000"};
  for (int c = 0; c < 3; c++) {
    if (memory[c] != NULL) setenv("L2L_DEVICE_MEMORY", memory[c], 1);
    else unsetenv("L2L_DEVICE_MEMORY");
    char what[96];
    snprintf(what, sizeof what, "placement auto, no budget, L2L_DEVICE_MEMORY %s",
             memory[c] != NULL ? memory[c] : "unset");
    if (!placements_match(&init, &cfg, NULL, batches, 2, what)) break;
    struct model m;
    model_clone(&m, &init);
    l2l_relay *r = relay_new(&m, &cfg);
    double loss;
    if (r != NULL && relay_step(&loss, r, &batches[0], NULL)) {
      l2l_relay_stats st = relay_stats(r);
      bool all = c != 1;
      CHECK(all ? st.host_eps_bytes == 0 && st.device_records_bytes > 0
                : st.device_records_bytes == 0 && st.host_eps_bytes > 0,
            "%s: %llu bytes of records on the device, %llu on the host: want %s", what,
            (unsigned long long)st.device_records_bytes, (unsigned long long)st.host_eps_bytes,
            all ? "every record there" : "none");
    }
    l2l_relay_free(r);
    model_free(&m);
  }
  if (kept != NULL) setenv("L2L_DEVICE_MEMORY", kept, 1);
  else unsetenv("L2L_DEVICE_MEMORY");
  free_batches(batches, STEPS);
  model_free(&init);
}
