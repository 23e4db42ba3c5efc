/* SPDX-License-Identifier: MIT */
/* test_relay_memory.c — what the relay promises of memory and transfers: device memory
 * constant in depth with host stashing and growing per block with device stashing, the
 * bytes each visit moves (a slot that still holds a layer's parameters is not copied again)
 * and the first input before the next parameters, dynamic loss scaling that changes only
 * the scale, and no non-finite value ever written to a master. test_relay.c says how the
 * relay's tests test (the plain executor, plain.c, as the reference); relay_rig.h holds the
 * tolerances and helpers. All test names start with "relay_".
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

/* ---------------------------------------------------------------- memory */

/* stats.device_peak of the second step (the first may make lasting buffers). */
static uint64_t device_peak(const struct shape *g, int64_t B, int64_t micro,
                            l2l_stash_policy stash) {
  struct model m;
  model_new(&m, g);
  struct data d;
  data_new(&d, g, B, g->S, 0, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = micro;
  cfg.stash = stash;
  uint64_t peak = 0;
  l2l_relay *r = relay_new(&m, &cfg);
  double loss;
  if (r && relay_step(&loss, r, &d, NULL) && relay_step(&loss, r, &d, NULL)) {
    l2l_relay_stats s = relay_stats(r);
    peak = s.device_peak;
    l2l_pool_stats ps;
    CHECK_OK(l2l_pool_get_stats(&ps, L2L_POOL_DEVICE));
    CHECK(ps.peak >= peak, "stats.device_peak %llu above the device pool's peak %llu",
          (unsigned long long)peak, (unsigned long long)ps.peak);
  }
  l2l_relay_free(r);
  data_free(&d);
  model_free(&m);
  return peak;
}

TEST(relay_stash_host_memory_constant_in_depth) {
  /* stash host: the device holds two layers' parameters, one layer's work and the
     current micro-batch's boundaries, whatever the depth. 2, 8 and 32 blocks must peak
     within one micro-batch's boundary activations (micro * S * D * 4 bytes, 8 KiB here)
     of each other; stashing on the device would add a whole batch's boundary (B S D 4
     = 32 KiB) per block, 960 KiB from 2 to 32 blocks. */
  const int64_t B = 8, micro = 2;
  uint64_t peaks[3];
  static const int depth[3] = {2, 8, 32};
  for (int i = 0; i < 3; i++) {
    struct shape g = stack_shape(depth[i]);
    peaks[i] = device_peak(&g, B, micro, L2L_STASH_HOST);
  }
  struct shape g = stack_shape(2);
  uint64_t slack = (uint64_t)(micro * g.S * g.D * 4);
  uint64_t lo = peaks[0], hi = peaks[0];
  for (int i = 1; i < 3; i++) lo = peaks[i] < lo ? peaks[i] : lo, hi = peaks[i] > hi ? peaks[i] : hi;
  CHECK(peaks[0] > 0 && hi - lo <= slack,
        "device peaks %llu, %llu, %llu bytes for 2, 8, 32 blocks: spread %llu > %llu",
        (unsigned long long)peaks[0], (unsigned long long)peaks[1], (unsigned long long)peaks[2],
        (unsigned long long)(hi - lo), (unsigned long long)slack);
  printf("    stash host, device peak for 2 / 8 / 32 blocks: %llu / %llu / %llu bytes\n",
         (unsigned long long)peaks[0], (unsigned long long)peaks[1], (unsigned long long)peaks[2]);
}

TEST(relay_stash_host_memory_follows_micro_batch_not_batch) {
  /* With micro-batch fixed, a 4x larger minibatch moves the device peak by less than one
     micro-batch's boundary activations (only token ids and targets scale with it); a 4x
     larger micro-batch raises it by at least the extra samples' boundary activations. From
     8 micro-batches on (the walk's kept and in-flight micro-batches all there: a visit's
     first and the last one the visit before made, two stash-outs on their way, the next
     input fetched ahead), the count of micro-batches changes nothing else. */
  struct shape g = stack_shape(4);
  uint64_t base = device_peak(&g, 16, 2, L2L_STASH_HOST);
  uint64_t big_batch = device_peak(&g, 64, 2, L2L_STASH_HOST);
  uint64_t big_micro = device_peak(&g, 16, 8, L2L_STASH_HOST);
  uint64_t slack = (uint64_t)(2 * g.S * g.D * 4);
  uint64_t growth = (uint64_t)((8 - 2) * g.S * g.D * 4);
  CHECK(base > 0 && big_batch <= base + slack,
        "batch 16 -> 64 at micro-batch 2: device peak %llu -> %llu bytes (allowed +%llu)",
        (unsigned long long)base, (unsigned long long)big_batch, (unsigned long long)slack);
  CHECK(big_micro >= base + growth,
        "micro-batch 2 -> 8: device peak %llu -> %llu bytes, want at least +%llu",
        (unsigned long long)base, (unsigned long long)big_micro, (unsigned long long)growth);
  printf("    stash host, device peak: batch 16 micro 2 %llu, batch 64 micro 2 %llu, batch 16 "
         "micro 8 %llu bytes\n", (unsigned long long)base, (unsigned long long)big_batch,
         (unsigned long long)big_micro);
}

TEST(relay_stash_device_memory_linear_in_depth) {
  /* stash device: every boundary stays on the device, so each block adds the same bytes
     (at least its input for the whole batch, B S D 4) to the peak: increments from 2 to
     4, 6 and 8 blocks positive and equal within 1 %. */
  const int64_t B = 8, micro = 2;
  uint64_t peaks[4];
  for (int i = 0; i < 4; i++) {
    struct shape g = stack_shape(2 + 2 * i);
    peaks[i] = device_peak(&g, B, micro, L2L_STASH_DEVICE);
  }
  struct shape g = stack_shape(2);
  double boundary = (double)(B * g.S * g.D * 4);
  double inc[3];
  for (int i = 0; i < 3; i++) inc[i] = ((double)peaks[i + 1] - (double)peaks[i]) / 2.0;
  for (int i = 0; i < 3; i++)
    CHECK(inc[i] >= boundary && fabs(inc[i] - inc[0]) <= 0.01 * inc[0],
          "per-block increments %.0f, %.0f, %.0f bytes (peaks %llu %llu %llu %llu): want "
          "equal within 1 %% and >= %.0f", inc[0], inc[1], inc[2], (unsigned long long)peaks[0],
          (unsigned long long)peaks[1], (unsigned long long)peaks[2],
          (unsigned long long)peaks[3], boundary);
  printf("    stash device, device peak per block: %.0f, %.0f, %.0f bytes (boundary %.0f)\n",
         inc[0], inc[1], inc[2], boundary);
}

/* ---------------------------------------------------------------- bytes moved */

static uint64_t layer_param_bytes(l2l_layer *layer) {
  uint64_t n = 0;
  for (int r = 0; r < l2l_layer_param_count(layer); r++)
    n += tensor_bytes(l2l_param_value(l2l_layer_param(layer, r)));
  return n;
}

TEST(relay_moves_what_each_visit_needs) {
  /* Stash device, inner keep, one micro-batch: nothing but parameters, gradients and the
     batch's rows cross. Visits: forward of every layer but the head, the head, backward
     from the last block down to the embedding. Each copies its layer's parameters in,
     unless a parameter slot still holds them with no update in between. The slots are
     reused least recently used first, so a backward visit finds its layer when fewer
     than `slots` distinct layers were visited since its forward: layer l of n has n-1-l
     (l+1 .. the head), so layers l >= n - slots copy nothing at their backward. With two
     slots that is the last block alone; with as many slots as layers, every backward.
     The embedding's forward and backward read the tokens, the head the targets; every
     trainable visit's gradients go out. Two steps: the second finds the first one's
     updates done. The slot count changes what moves, never the result: losses and
     weights are the same bits for every count, and each slot more adds one slot's bytes
     to the device peak. */
  struct shape g = gpt_shape();
  g.blocks = (int)check_rand_int(4, 6);
  struct model base;
  model_new(&base, &g);
  const int n = base.n;
  int counts[4] = {2, 3, (int)check_rand_int(3, n), n + 1};
  struct data d;
  data_new(&d, &g, 3, g.S, 0, 1.0);
  l2l_relay_config config = adamw_config();   /* one dropout seed for all */
  config.micro_batch = 3;
  config.stash = L2L_STASH_DEVICE;
  config.inner = L2L_INNER_KEEP;
  double first_loss[2] = {0, 0};
  uint64_t peak2 = 0, peak3 = 0;
  struct model first;
  memset(&first, 0, sizeof first);
  for (int c = 0; c < 4; c++) {
    const int slots = counts[c];
    struct model m;
    model_clone(&m, &base);
    l2l_relay_config cfg = config;
    cfg.param_slots = slots;
    l2l_relay *r = relay_new(&m, &cfg);
    uint64_t params = 0, grads = 0;
    for (int l = 0; l < n; l++) {
      uint64_t p = layer_param_bytes(m.layer[l]);
      grads += p;
      bool backward_copies = l <= n - 2 && l < n - slots;
      params += p * (backward_copies ? 2 : 1);
    }
    uint64_t h2d = params + 2 * tensor_bytes(d.tokens) + tensor_bytes(d.targets);
    for (int step = 0; r != NULL && step < 2; step++) {
      double loss;
      if (!relay_step(&loss, r, &d, NULL)) break;
      l2l_relay_stats s = relay_stats(r);
      CHECK(s.h2d_bytes == h2d && s.d2h_bytes == grads,
            "%d slots, step %d moved %llu bytes in and %llu out: want %llu and %llu", slots,
            step, (unsigned long long)s.h2d_bytes, (unsigned long long)s.d2h_bytes,
            (unsigned long long)h2d, (unsigned long long)grads);
      CHECK(s.h2d_seconds > 0 && s.d2h_seconds > 0 && s.h2d_seconds <= s.step_seconds * 1.01 &&
                s.d2h_seconds <= s.step_seconds * 1.01,
            "%d slots, step %d: copy threads busy %g s and %g s in a %g s step", slots, step,
            s.h2d_seconds, s.d2h_seconds, s.step_seconds);
      if (c == 0) first_loss[step] = loss;
      CHECK(memcmp(&loss, &first_loss[step], sizeof loss) == 0,
            "%d slots, step %d: loss %.17g, with 2 slots %.17g", slots, step, loss,
            first_loss[step]);
      if (step == 1 && c == 0) peak2 = s.device_peak;
      if (step == 1 && c == 1) peak3 = s.device_peak;
      if (step == 1 && c > 0)
        CHECK(s.device_peak - peak2 == (uint64_t)(slots - 2) * (peak3 - peak2),
              "%d slots: device peak %llu, with 2 slots %llu and with 3 %llu", slots,
              (unsigned long long)s.device_peak, (unsigned long long)peak2,
              (unsigned long long)peak3);
    }
    if (r != NULL) CHECK_OK(l2l_relay_sync(r));
    l2l_relay_free(r);
    if (c == 0) {
      first = m;
      continue;
    }
    for (int l = 0; l < n; l++)
      for (int p = 0; p < l2l_layer_param_count(m.layer[l]); p++) {
        const l2l_tensor *got = l2l_param_value(l2l_layer_param(m.layer[l], p));
        const l2l_tensor *want = l2l_param_value(l2l_layer_param(first.layer[l], p));
        CHECK(memcmp(l2l_tensor_data(got), l2l_tensor_data(want), tensor_bytes(got)) == 0,
              "%d slots: layer %d parameter %d differs from the 2-slot run's", slots, l, p);
      }
    model_free(&m);
  }
  CHECK(peak3 - peak2 >= layer_param_bytes(base.layer[1]),
        "a third slot adds %llu bytes to the device peak, less than a block's parameters",
        (unsigned long long)(peak3 - peak2));
  model_free(&first);
  data_free(&d);
  model_free(&base);
}

TEST(relay_first_input_before_next_parameters) {
  /* Stash host, 3 micro-batches: every block's input goes to the host in the forward; the
     forward's next visit reads micro-batch 0 from the device (the visit before left it
     there), the rest come back one micro-batch ahead, and the backward's recompute brings
     them all back, on the copy thread that also brings the next visit's parameters:
     micro-batch 0 of block l's input while the visit before (the head's or block l + 1's
     backward, whose layer names the copy) runs. It is queued before that visit's next
     parameters (layer l's, when no slot holds them) and so before layer l - 1's, so
     compute never waits behind a whole layer's copy for it: on the host-to-device thread
     (which runs its jobs in order), the one STASH_IN of micro-batch 0 named l + 1 comes
     before the last PARAMS_IN of layer l - 1, for every block l, and none is named by the
     embedding or the first block (nothing below the first block reads an input). A visit's
     second micro-batch's inputs are queued before the next visit's parameters too (not at
     its first micro-batch, behind them): block l's first STASH_IN of micro-batch 1 (its
     forward's) before the first PARAMS_IN of layer l + 1, and its last (its backward's)
     before the last PARAMS_IN of layer l - 1. */
  struct shape g = stack_shape((int)check_rand_int(2, 5));
  struct model m;
  model_new(&m, &g);
  struct data d;
  data_new(&d, &g, 6, g.S, 0, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  cfg.stash = L2L_STASH_HOST;
  l2l_relay *r = relay_new(&m, &cfg);
  double loss;
  for (int step = 0; r != NULL && step < 2; step++) {
    if (!relay_step(&loss, r, &d, NULL)) break;
    int64_t n;
    l2l_relay_event *ev = relay_events(r, &n);
    int64_t first_in[MAX_LAYERS], last_params[MAX_LAYERS], ins[MAX_LAYERS], order = 0;
    int64_t first_in1[MAX_LAYERS], last_in1[MAX_LAYERS], first_params[MAX_LAYERS];
    for (int l = 0; l < m.n; l++)
      first_in[l] = last_params[l] = first_in1[l] = last_in1[l] = first_params[l] = -1, ins[l] = 0;
    for (int64_t i = 0; i < n; i++) {
      if (ev[i].thread != 1 || ev[i].layer < 0 || ev[i].layer >= m.n) continue;
      int l = ev[i].layer;
      if (ev[i].phase == L2L_PHASE_STASH_IN && ev[i].micro_batch == 0 && ins[l]++ == 0)
        first_in[l] = order;
      if (ev[i].phase == L2L_PHASE_STASH_IN && ev[i].micro_batch == 1) {
        if (first_in1[l] < 0) first_in1[l] = order;
        last_in1[l] = order;
      }
      if (ev[i].phase == L2L_PHASE_PARAMS_IN) {
        if (first_params[l] < 0) first_params[l] = order;
        last_params[l] = order;
      }
      order++;
    }
    for (int l = 1; l < m.n - 1; l++) {
      if (l + 1 < m.n - 1)
        CHECK(first_in1[l] >= 0 && first_in1[l] < first_params[l + 1],
              "step %d: block %d's forward fetched micro-batch 1 as copy %lld, layer %d's "
              "parameters first came as copy %lld", step, l, (long long)first_in1[l], l + 1,
              (long long)first_params[l + 1]);
      CHECK(last_in1[l] >= 0 && last_in1[l] < last_params[l - 1],
            "step %d: block %d's backward fetched micro-batch 1 last as copy %lld, layer %d's "
            "parameters last came as copy %lld", step, l, (long long)last_in1[l], l - 1,
            (long long)last_params[l - 1]);
    }
    for (int l = 1; l < m.n - 1; l++)
      CHECK(ins[l + 1] == 1 && last_params[l - 1] >= 0 && first_in[l + 1] < last_params[l - 1],
            "step %d, %d layers: micro-batch 0 came in %lld times in layer %d's visits, first "
            "as copy %lld, layer %d's parameters last as copy %lld", step, m.n,
            (long long)ins[l + 1], l + 1, (long long)first_in[l + 1], l - 1,
            (long long)last_params[l - 1]);
    CHECK(ins[0] == 0 && ins[1] == 0,
          "step %d: micro-batch 0 came in %lld and %lld times in the embedding's and the "
          "first block's visits", step, (long long)ins[0], (long long)ins[1]);
    free(ev);
  }
  l2l_relay_free(r);
  data_free(&d);
  model_free(&m);
}

TEST(relay_stash_host_fetches_nothing_the_visit_before_left) {
  /* Stash host, inner recompute, n layers (the embedding, blocks, the head), nmb
     micro-batches of B rows (the last may be smaller): a boundary micro-batch of r rows is
     r S D f32. The next visit reads a visit's first and last output micro-batches from the
     device (the kept ones). Every block input goes to the host in the forward (its
     backward's recompute reads it back: all nmb), the head's input only for the middle
     micro-batches (nothing reads it later); the forward's next visit fetches the middle
     ones; each gradient g[1] .. g[n-1] crosses out and back only for the middle ones. So
     the activations move, over what stash device moves (none of them):
       in:  (n - 2) all + (n - 1) rest [the forward's] + (n - 1) rest [gradients]
       out: (n - 2) all + rest [the head's input] + (n - 1) rest [gradients]
     with all the bytes of every micro-batch and rest those of the middle ones (none for
     one or two micro-batches), in each of two steps. An evaluation after them (no backward reads a boundary again)
     moves (n - 1) rest each way. The same losses and weights, to the bit, as stash
     device. */
  struct shape g = gpt_shape();
  g.blocks = (int)check_rand_int(2, 4);
  const int64_t mb = check_rand_int(1, 3), nmb = check_rand_int(1, 5);
  const int64_t B = (nmb - 1) * mb + check_rand_int(1, mb);
  struct data d;
  data_new(&d, &g, B, g.S, 0, 1.0);
  double all = 0, rest = 0;
  for (int64_t u = 0; u < nmb; u++) {
    double bytes = (double)((u + 1 < nmb ? mb : B - (nmb - 1) * mb) * g.S * g.D) * 4;
    all += bytes;
    if (u > 0 && u + 1 < nmb) rest += bytes;
  }
  l2l_relay_stats st[2][3];
  double loss[2][3];
  struct model base, m[2];
  model_new(&base, &g);
  const l2l_relay_config config = adamw_config();   /* one dropout seed for both */
  for (int c = 0; c < 2; c++) {
    model_clone(&m[c], &base);
    l2l_relay_config cfg = config;
    cfg.micro_batch = mb;
    cfg.stash = c == 0 ? L2L_STASH_HOST : L2L_STASH_DEVICE;
    cfg.inner = L2L_INNER_RECOMPUTE;
    l2l_relay *r = relay_new(&m[c], &cfg);
    memset(st[c], 0, sizeof st[c]);
    for (int step = 0; r != NULL && step < 2; step++)
      if (relay_step(&loss[c][step], r, &d, NULL)) st[c][step] = relay_stats(r);
    l2l_relay_batch b = relay_batch(&d, NULL);
    loss[c][2] = NAN;
    if (r != NULL && CHECK_OK(l2l_relay_evaluate(&loss[c][2], r, &b))) st[c][2] = relay_stats(r);
    if (r != NULL) CHECK_OK(l2l_relay_sync(r));
    l2l_relay_free(r);
  }
  const double n = m[0].n;
  const double in = (n - 2) * all + 2 * (n - 1) * rest, out = (n - 2) * all + n * rest;
  for (int step = 0; step < 3; step++) {
    const l2l_relay_stats *h = &st[0][step], *v = &st[1][step];
    const double want_in = step < 2 ? in : (n - 1) * rest, want_out = step < 2 ? out : want_in;
    CHECK((double)(h->h2d_bytes - v->h2d_bytes) == want_in &&
              (double)(h->d2h_bytes - v->d2h_bytes) == want_out,
          "%d layers, %lld micro-batches of %lld (batch %lld), call %d (2: the evaluation): "
          "stash host moved %llu bytes in and %llu out over stash device's; want %.0f and %.0f",
          m[0].n,
          (long long)nmb, (long long)mb, (long long)B, step,
          (unsigned long long)(h->h2d_bytes - v->h2d_bytes),
          (unsigned long long)(h->d2h_bytes - v->d2h_bytes), want_in, want_out);
    CHECK(memcmp(&loss[0][step], &loss[1][step], sizeof(double)) == 0,
          "call %d: loss %.17g with stash host, %.17g with stash device", step, loss[0][step],
          loss[1][step]);
  }
  for (int l = 0; l < m[0].n; l++)
    for (int p = 0; p < l2l_layer_param_count(m[0].layer[l]); p++) {
      const l2l_tensor *a = l2l_param_value(l2l_layer_param(m[0].layer[l], p));
      const l2l_tensor *b = l2l_param_value(l2l_layer_param(m[1].layer[l], p));
      CHECK(memcmp(l2l_tensor_data(a), l2l_tensor_data(b), tensor_bytes(a)) == 0,
            "layer %d parameter %d: stash host and stash device differ", l, p);
    }
  model_free(&m[0]);
  model_free(&m[1]);
  model_free(&base);
  data_free(&d);
}

TEST(relay_loss_scaling_changes_only_the_scale) {
  /* A power-of-two loss scale multiplies every gradient exactly and the update divides it
     out exactly, so with nothing overflowing the relay with dynamic loss scaling gives
     the same bits as without: the losses, every weight and every optimizer state, with
     per-layer clipping, with global clipping (its norm in the unscaled units) or neither.
     Every update waits for the end of backward; window 2 doubles the scale every second
     update. */
  enum { STEPS = 5 };
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct data batches[STEPS];
  make_batches(batches, STEPS, &g, 5, 1, 1.0);
  l2l_relay_config plain = adamw_config();
  plain.micro_batch = 2;
  int clipping = (int)check_rand_int(0, 2);
  if (clipping == 1) plain.clip_layer_norm = 0.05f;
  if (clipping == 2) plain.clip_global_norm = 0.1f;
  l2l_relay_config scaled = plain;
  int k = (int)check_rand_int(4, 24);
  scaled.loss_scale = ldexpf(1.0f, k);
  scaled.loss_scale_window = 2;
  struct model m[2];
  l2l_relay *r[2];
  for (int i = 0; i < 2; i++) {
    model_clone(&m[i], &init);
    r[i] = relay_new(&m[i], i == 0 ? &plain : &scaled);
  }
  for (int step = 0; r[0] && r[1] && step < STEPS; step++) {
    double loss[2];
    if (!relay_step(&loss[0], r[0], &batches[step], NULL) ||
        !relay_step(&loss[1], r[1], &batches[step], NULL))
      break;
    CHECK(memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0,
          "clipping %d, scale 2^%d, step %d: loss %.17g, unscaled %.17g", clipping, k, step,
          loss[1], loss[0]);
    l2l_relay_stats s = relay_stats(r[1]), s0 = relay_stats(r[0]);
    double want = ldexp(1.0, k + (step + 1) / 2);
    CHECK(s.loss_scale == want && s.loss_scale_good == (step + 1) % 2 && s.skipped_updates == 0 &&
              s.overflow == 0 && s.updates == step + 1 && s.updates_deferred == 1,
          "step %d: loss_scale %g (want %g), good %lld, skipped %lld, overflow %d, updates "
          "%lld, deferred %d", step, s.loss_scale, want, (long long)s.loss_scale_good,
          (long long)s.skipped_updates, s.overflow, (long long)s.updates, s.updates_deferred);
    CHECK(s0.loss_scale == 0 && s0.skipped_updates == 0, "unscaled run: loss_scale %g",
          s0.loss_scale);
    if (clipping == 2)
      CHECK(s.grad_norm == s0.grad_norm, "step %d: global norm %.17g, unscaled %.17g", step,
            s.grad_norm, s0.grad_norm);
  }
  for (int i = 0; i < 2; i++)
    if (r[i]) CHECK_OK(l2l_relay_sync(r[i]));
  for (int l = 0; r[0] && r[1] && l < m[0].n; l++)
    for (int p = 0; p < l2l_layer_param_count(m[0].layer[l]); p++) {
      l2l_param *a = l2l_layer_param(m[0].layer[l], p), *b = l2l_layer_param(m[1].layer[l], p);
      const l2l_tensor *va = l2l_param_value(a), *vb = l2l_param_value(b);
      CHECK(memcmp(l2l_tensor_data(va), l2l_tensor_data(vb), tensor_bytes(va)) == 0,
            "clipping %d, scale 2^%d: layer %d parameter %d differs", clipping, k, l, p);
      for (int which = 0; which < 2; which++) {
        l2l_tensor *sa = NULL, *sb = NULL;
        CHECK_OK(l2l_relay_param_state(&sa, r[0], a, which));
        CHECK_OK(l2l_relay_param_state(&sb, r[1], b, which));
        CHECK(sa && sb && memcmp(l2l_tensor_data(sa), l2l_tensor_data(sb), tensor_bytes(sa)) == 0,
              "layer %d parameter %d: optimizer state %d differs", l, p, which);   /* borrowed */
      }
    }
  /* Restoring the scale: checked, and a relay without scaling refuses it. */
  if (r[0] && r[1]) {
    CHECK_FAILS(l2l_relay_restore_loss_scale(r[0], 1024, 0, 0), L2L_ERR_STATE, "loss_scale");
    CHECK_FAILS(l2l_relay_restore_loss_scale(r[1], 0, 0, 0), L2L_ERR_INVALID, "scale");
    CHECK_FAILS(l2l_relay_restore_loss_scale(r[1], 8, 2, 0), L2L_ERR_INVALID, "good");
    CHECK_OK(l2l_relay_restore_loss_scale(r[1], 0.5, 1, 7));
    l2l_relay_stats s = relay_stats(r[1]);
    CHECK(s.loss_scale == 0.5 && s.loss_scale_good == 1 && s.skipped_updates == 7,
          "restored: loss_scale %g, good %lld, skipped %lld", s.loss_scale,
          (long long)s.loss_scale_good, (long long)s.skipped_updates);
  }
  for (int i = 0; i < 2; i++) {
    l2l_relay_free(r[i]);
    model_free(&m[i]);
  }
  free_batches(batches, STEPS);
  model_free(&init);
}

TEST(relay_loss_scales_up_to_the_limit_change_nothing) {
  /* The same at the scales that dynamic scaling reaches by itself (2^71 to 2^100), for
     AdamW and LAMB: unscaling each gradient before anything squares it keeps the step
     exact, where (1 - b2) s^2 folded into a coefficient underflowed and wrote NaN. */
  enum { STEPS = 3 };
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct data batches[STEPS];
  make_batches(batches, STEPS, &g, 4, 1, 1.0);
  l2l_relay_config plain = adamw_config();
  plain.micro_batch = 2;
  bool lamb = check_rand_int(0, 1) == 1;
  if (lamb) plain.optimizer.kind = L2L_OPTIMIZER_LAMB;
  l2l_relay_config scaled = plain;
  int k = (int)check_rand_int(71, 100);
  scaled.loss_scale = ldexp(1.0, k);
  scaled.loss_scale_window = 1000;
  struct model m[2];
  l2l_relay *r[2];
  for (int i = 0; i < 2; i++) {
    model_clone(&m[i], &init);
    r[i] = relay_new(&m[i], i == 0 ? &plain : &scaled);
  }
  for (int step = 0; r[0] && r[1] && step < STEPS; step++) {
    double loss[2];
    if (!relay_step(&loss[0], r[0], &batches[step], NULL) ||
        !relay_step(&loss[1], r[1], &batches[step], NULL))
      break;
    l2l_relay_stats st = relay_stats(r[1]);
    CHECK(loss[0] == loss[1] && st.overflow == 0 && st.updates == step + 1 && isfinite(st.grad_norm),
          "%s, scale 2^%d, step %d: loss %.17g (unscaled %.17g), overflow %d, updates %lld, "
          "grad_norm %g", lamb ? "LAMB" : "AdamW", k, step, loss[1], loss[0], st.overflow,
          (long long)st.updates, st.grad_norm);
  }
  for (int i = 0; i < 2; i++)
    if (r[i]) CHECK_OK(l2l_relay_sync(r[i]));
  for (int l = 0; r[0] && r[1] && l < m[0].n; l++)
    for (int p = 0; p < l2l_layer_param_count(m[0].layer[l]); p++) {
      const l2l_tensor *va = l2l_param_value(l2l_layer_param(m[0].layer[l], p));
      const l2l_tensor *vb = l2l_param_value(l2l_layer_param(m[1].layer[l], p));
      const float *b = l2l_tensor_data(vb);
      bool finite = true;
      for (int64_t i = 0; i < numel(vb); i++) finite &= isfinite(b[i]) != 0;
      CHECK(finite && memcmp(l2l_tensor_data(va), b, tensor_bytes(va)) == 0,
            "%s, scale 2^%d: layer %d parameter %d %s", lamb ? "LAMB" : "AdamW", k, l, p,
            finite ? "differs from the unscaled run" : "has a non-finite value");
    }
  for (int i = 0; i < 2; i++) {
    l2l_relay_free(r[i]);
    model_free(&m[i]);
  }
  free_batches(batches, STEPS);
  model_free(&init);
}

/* Every master and optimizer state of a relay's model is finite. */
static bool all_finite(l2l_relay *r, const struct model *m, const char *what) {
  bool ok = true;
  for (int l = 0; l < m->n; l++)
    for (int p = 0; p < l2l_layer_param_count(m->layer[l]); p++) {
      l2l_param *param = l2l_layer_param(m->layer[l], p);
      const l2l_tensor *t[3] = {l2l_param_value(param), NULL, NULL};
      CHECK_OK(l2l_relay_param_state((l2l_tensor **)&t[1], r, param, 0));
      CHECK_OK(l2l_relay_param_state((l2l_tensor **)&t[2], r, param, 1));
      for (int k = 0; k < 3; k++) {
        const float *d = t[k] ? l2l_tensor_data(t[k]) : NULL;
        for (int64_t i = 0; d && i < numel(t[k]); i++)
          if (!isfinite(d[i])) {
            ok = CHECK(false, "%s: layer %d parameter %d: %s [%lld] = %g", what, l, p,
                       k ? "optimizer state" : "master", (long long)i, d[i]);
            break;
          }
      }
    }
  return ok;
}

TEST(relay_never_writes_a_nonfinite_value) {
  /* A NaN in one weight makes every gradient NaN; without loss scaling or global clipping
     each record's update is skipped (its gradient dropped) rather than writing NaN into
     every master and moment; skipped_records and skipped_updates say so, and once the
     weight is mended training goes on. With nonfinite_error the step says it as an error;
     with global clipping the whole update is skipped and counted too. An lr of 1e30 makes
     the weights huge, and the gradients then overflow: no master ever holds an inf. */
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct data batch;
  data_new(&batch, &g, 4, g.S, 0, 1.0);
  for (int mode = 0; mode < 4; mode++) {
    l2l_relay_config c = adamw_config();
    c.micro_batch = 2;
    if (mode == 1) c.nonfinite_error = 1;
    if (mode == 2) c.clip_global_norm = 1.0f;
    if (mode == 3) c.optimizer.lr = 1e30f;
    struct model m;
    model_clone(&m, &init);
    l2l_relay *r = relay_new(&m, &c);
    if (r == NULL) {
      model_free(&m);
      continue;
    }
    double loss;
    if (mode == 3) {
      for (int step = 0; step < 4; step++) {
        l2l_relay_batch b = relay_batch(&batch, NULL);
        l2l_status st = l2l_relay_step(&loss, r, &b);
        CHECK(st == L2L_OK, "lr 1e30, step %d: %s", step, l2l_last_error());
        CHECK_OK(l2l_relay_sync(r));
        all_finite(r, &m, "lr 1e30");
      }
      CHECK(relay_stats(r).skipped_records > 0, "lr 1e30: no record was skipped");
    } else {
      CHECK(relay_step(&loss, r, &batch, NULL), "mode %d: the first step", mode);
      /* one weight of the first block poisoned, once the first step's updates are done (its
         update may still run when the step returns: ThreadSanitizer saw the write race it) */
      CHECK_OK(l2l_relay_sync(r));
      float *w = l2l_tensor_data(l2l_param_value(l2l_layer_param(m.layer[1], 0)));
      float kept = w[0];
      w[0] = NAN;
      l2l_relay_batch b = relay_batch(&batch, NULL);
      l2l_status st = l2l_relay_step(&loss, r, &b);
      l2l_relay_stats s = relay_stats(r);
      if (mode == 1)
        CHECK_FAILS(st, L2L_ERR_STATE, "inf or NaN");
      else
        CHECK(st == L2L_OK, "mode %d: %s", mode, l2l_last_error());
      CHECK(s.skipped_updates == 1 && s.steps == 2,
            "mode %d: skipped_updates %lld, steps %lld", mode, (long long)s.skipped_updates,
            (long long)s.steps);
      CHECK(mode == 2 ? s.overflow == 1 && s.updates == 1 : s.skipped_records > 0,
            "mode %d: overflow %d, updates %lld, skipped_records %lld", mode, s.overflow,
            (long long)s.updates, (long long)s.skipped_records);
      CHECK_OK(l2l_relay_sync(r));
      w[0] = kept;
      all_finite(r, &m, "after a NaN weight");
      CHECK(relay_step(&loss, r, &batch, NULL) && isfinite(loss), "mode %d: mended step", mode);
      CHECK_OK(l2l_relay_sync(r));
      s = relay_stats(r);
      CHECK(s.skipped_records == 0 && s.skipped_updates == 1, "mode %d, mended: skipped %lld "
            "records, %lld updates", mode, (long long)s.skipped_records,
            (long long)s.skipped_updates);
      all_finite(r, &m, "mended");
    }
    l2l_relay_free(r);
    model_free(&m);
  }
  data_free(&batch);
  model_free(&init);
}
