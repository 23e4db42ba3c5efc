/* SPDX-License-Identifier: MIT */
/* test_relay.c — the relay and the EPS of l2l.h ("the relay and the EPS", "optimizers")
 * against plain whole-batch training.
 *
 * What it tests: that a relay step is plain training with memory and speed changed and
 * the mathematics unchanged: losses, final weights and optimizer states after several
 * AdamW steps of a tiny GPT (dropout everywhere, padding, an LM head tied to the
 * embedding) for micro-batches of 1, 3 (uneven last) and the whole batch, under every
 * stash policy and every inner policy, and mixed per-boundary policies; a BERT-like model
 * (post-LN, bidirectional, token types) with a masked-LM head and with a classifier; SGD
 * with momentum (plain and Nesterov) and LAMB against float64 updates written here;
 * schedules; gradient accumulation; global and per-layer clipping; evaluation. Then what
 * the relay promises beyond the result: device memory constant in depth with host
 * stashing and growing per block with device stashing; the bytes each visit moves (a
 * slot that still holds a layer's parameters is not copied again); updates that start
 * while earlier layers are still in backward; dynamic architecture (insert, remove,
 * replace, clone, freeze, skip) that leaves every other record's weights and optimizer state untouched,
 * bit for bit, and still trains like plain training of the changed model; and refusals
 * of bad input and configs that name the problem and change nothing.
 *
 * How: the plain executor (plain.c, reference.h) is the reference: it runs clones of the
 * relay's layers (same values, same rng ids, ties re-made) in the host pool with
 * l2l_layer_forward / l2l_layer_backward, the whole minibatch in one call per layer with
 * every saved state kept, folds each layer's gradient into per-record accumulators, and
 * updates with l2l_adamw_update (or float64 SGD / LAMB), the schedule computed from the
 * header's formulas. Each layer call gets the batch fields the relay promises (seed,
 * step = the step's index, first_sample, the key mask's rows, loss_scale = 1 / (real
 * targets x accumulate)), so both see the same dropout masks.
 * All test names start with "relay_", so `l2l_ctest relay_` runs just these files:
 * test_relay.c (plain training, accumulation, clipping, evaluation), test_relay_spill.c
 * (the optimizer state in a spill file), test_relay_memory.c (device memory, the bytes
 * each visit moves, loss scaling), test_relay_threads.c (eager updates, one call at a
 * time, a step's own device peak), test_relay_dynamic.c (insert, remove, replace, clone,
 * freeze, skip) and test_relay_refusals.c (refusals, restores); relay_rig.h holds the
 * tolerances and the helpers they share.
 * Must never: take an expected value from the relay or the EPS (the reference uses only
 * the layers, l2l_adamw_update and formulas written here), or leave the device pool's
 * budget set when a test ends.
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

/* ---------------------------------------------------------------- equivalence */

/* A reference run: the plain executor from `init` over `steps` minibatches; keeps the
   executor (its model holds the final weights) and the losses. */
struct reference {
  struct plain plain;
  double loss[MAX_STEPS];
  double lr[MAX_STEPS], norm[MAX_STEPS];
};

static void reference_run(struct reference *ref, const struct model *init,
                          const l2l_relay_config *cfg, const struct data *batches, int steps,
                          int64_t micro) {
  plain_init(&ref->plain, init, cfg);
  for (int k = 0; k < steps; k++) {
    ref->loss[k] = plain_step(&ref->plain, &batches[k], micro, NULL);
    ref->lr[k] = ref->plain.lr;
    ref->norm[k] = ref->plain.grad_norm;
  }
}

/* The last relay_matches relay's EPS: records whose held gradients it checked (eps.c,
   "held arrivals"), read before the relay is freed. */
static int64_t matched_held_checks;

/* What a test may do to a relay before its first step (per-boundary policies). */
typedef void (*relay_setup_fn)(l2l_relay *r);

/* A relay over a clone of `init` with `cfg`, `steps` steps on `batches`, against the
   plain executor split into the relay's micro-batches: every loss, and then every weight
   and optimizer state. */
static bool relay_matches(const struct model *init, const l2l_relay_config *cfg,
                          relay_setup_fn setup, const struct data *batches, int steps,
                          const char *what) {
  struct reference reference, *ref = &reference;
  reference_run(ref, init, cfg, batches, steps, cfg->micro_batch);
  struct model rm;
  model_clone(&rm, init);
  l2l_relay *r = relay_new(&rm, cfg);
  bool ok = r != NULL;
  if (r && setup) setup(r);
  for (int k = 0; ok && k < steps; k++) {
    double loss;
    ok &= relay_step(&loss, r, &batches[k], NULL);
    ok &= CHECK(rel_close(loss, ref->loss[k], TOL_LOSS),
                "%s: step %d: loss %.9g, plain training %.9g", what, k, loss, ref->loss[k]);
  }
  if (ok) ok &= compare_to_plain(r, &rm, &ref->plain, what);
  if (ok) {
    l2l_relay_stats s = relay_stats(r);
    int64_t want_updates = steps / cfg->accumulate;
    ok &= CHECK(s.steps == steps && s.updates == want_updates,
                "%s: stats.steps %lld (want %d), stats.updates %lld (want %lld)", what,
                (long long)s.steps, steps, (long long)s.updates, (long long)want_updates);
    ok &= CHECK(rel_close(s.loss, ref->loss[steps - 1], TOL_LOSS),
                "%s: stats.loss %.9g, last loss %.9g", what, s.loss, ref->loss[steps - 1]);
    ok &= CHECK(rel_close(s.lr, ref->lr[steps - 1], 1e-6), "%s: stats.lr %.9g, want %.9g", what,
                s.lr, ref->lr[steps - 1]);
    ok &= CHECK(s.updates_deferred == (cfg->clip_global_norm > 0),
                "%s: stats.updates_deferred %d with clip_global_norm %g", what,
                s.updates_deferred, (double)cfg->clip_global_norm);
    ok &= CHECK(s.device_peak > 0 && s.host_eps_bytes > 0 && s.step_seconds > 0 &&
                    s.events > 0 && s.host_pass_bytes > 0,
                "%s: stats not filled: device_peak %llu, host_eps_bytes %llu, step_seconds "
                "%g, events %lld, host_pass_bytes %llu", what, (unsigned long long)s.device_peak,
                (unsigned long long)s.host_eps_bytes, s.step_seconds, (long long)s.events,
                (unsigned long long)s.host_pass_bytes);
  }
  matched_held_checks = r ? r->eps.held_checks : 0;
  l2l_relay_free(r);
  model_free(&rm);
  plain_free(&ref->plain);
  return ok;
}

/* Norm-wise |a - b| / |b| over a record's entries outside its noise range. */
static double rel_norm_err(const l2l_param *param, const float *a, const float *b, int64_t n) {
  int64_t nf, nt;
  noise_range(param, &nf, &nt);
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (i >= nf && i < nt) continue;
    double d = (double)a[i] - b[i];
    diff += d * d, ref += (double)b[i] * b[i];
  }
  if (isnan(diff)) return INFINITY;
  return ref > 0 ? sqrt(diff / ref) : (diff > 0 ? INFINITY : 0.0);
}

/* One step's gradients, split against whole: each entry sums K = B * S positions' terms
   in another grouping, which moves it by at most 2 gamma_K of the sum of the terms'
   magnitudes (gamma_K = K u / (1 - K u), u = 2^-24; K = 77 here: 9.2e-6); the terms'
   signs vary, so for a record that sum is about sqrt(K) (9) times the gradient's norm,
   and the forward's and backward's own sums, grouped otherwise too, add as much again:
   2 x 9 x 9.2e-6 = 1.7e-4 (measured over 600 seeds: median 4e-7, worst 1.2e-5). A
   missed micro-batch moves a record by 1/7 or more. */
#define TOL_GRAD_SPLIT 1.7e-4

TEST(plain_training_is_split_invariant) {
  /* What the relay comparisons take for granted (see TOL_WEIGHT): splitting a minibatch
     into micro-batches the relay's way (1 and 3 samples of 7, forward of each layer over
     all micro-batches, then backward in reverse) changes no arithmetic but the order of
     sums. One step's gradients agree with the whole minibatch's within TOL_GRAD_SPLIT,
     norm-wise per record; over five AdamW steps the losses agree within TOL_LOSS. If
     this fails, the layers are not split-invariant (dropout draws, key mask rows). */
  enum { STEPS = 5 };
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct data batches[STEPS];
  make_batches(batches, STEPS, &g, 7, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  l2l_relay_config one = cfg;
  one.accumulate = 2;   /* one pass: the accumulators hold the step's gradient */
  struct plain whole_grad;
  plain_init(&whole_grad, &init, &one);
  double whole_loss = plain_pass(&whole_grad, &batches[0], 0, NULL);
  struct reference whole;
  reference_run(&whole, &init, &cfg, batches, STEPS, 0);
  static const int64_t micros[] = {1, 3};
  for (int i = 0; i < 2; i++) {
    struct plain split_grad;
    plain_init(&split_grad, &init, &one);
    double split_loss = plain_pass(&split_grad, &batches[0], micros[i], NULL);
    CHECK(rel_close(split_loss, whole_loss, TOL_LOSS), "micro %lld: loss %.9g whole %.9g",
          (long long)micros[i], split_loss, whole_loss);
    for (int l = 0; l < init.n; l++)
      for (int j = 0; j < l2l_layer_param_count(init.layer[l]); j++) {
        l2l_param *a = l2l_layer_param(split_grad.model.layer[l], j);
        l2l_param *b = l2l_layer_param(whole_grad.model.layer[l], j);
        struct prec *ra = plain_rec(&split_grad, a), *rb = plain_rec(&whole_grad, b);
        double err = rel_norm_err(a, check_data(ra->acc), check_data(rb->acc), numel(ra->acc));
        CHECK_WITHIN(err, TOL_GRAD_SPLIT, "gradient split",
                     "micro %lld: layer %d %s: gradient off by %.3g norm-wise",
                     (long long)micros[i], l, l2l_param_name(a), err);
      }
    plain_free(&split_grad);
    struct reference split;
    reference_run(&split, &init, &cfg, batches, STEPS, micros[i]);
    for (int k = 0; k < STEPS; k++)
      CHECK(rel_close(split.loss[k], whole.loss[k], TOL_LOSS),
            "micro %lld, step %d: loss %.9g whole %.9g", (long long)micros[i], k, split.loss[k],
            whole.loss[k]);
    plain_free(&split.plain);
  }
  plain_free(&whole_grad);
  plain_free(&whole.plain);
  free_batches(batches, STEPS);
  model_free(&init);
}

TEST(relay_gpt_matches_plain_training) {
  /* Tiny GPT (D 24, H 3, F 40, V 37, S 11, 3 pre-LN causal blocks, one frugal, dropout
     0.1 on the embedding and both residual branches, attention dropout 0.15, LM head
     tied to the embedding), B 7 with padded tails; AdamW with weight decay under a
     cosine schedule with warm-up; 5 steps on fresh minibatches. The relay with micro-
     batches of 1, 3 (last one 1) and 7, under every stash policy (recompute keeps every
     2nd boundary) and every inner policy, and once with per-boundary mixed policies; the
     configurations cycle through 2 to 6 parameter slots (6: every layer stays), so
     slots reused across rebuilds and backward visits meet every policy. */
  enum { STEPS = 5 };
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct data batches[STEPS];
  make_batches(batches, STEPS, &g, 7, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.schedule = (l2l_schedule_config){.kind = L2L_SCHEDULE_COSINE, .warmup = 2, .total = 6,
                                       .final_ratio = 0.1f};
  static const int64_t micros[] = {1, 3, 7};
  int failed = 0;
  for (int mi = 0; mi < 3; mi++)
    for (int stash = 0; stash < 3; stash++)
      for (int inner = 0; inner < 3; inner++) {
        l2l_relay_config c = cfg;
        c.micro_batch = micros[mi];
        c.stash = (l2l_stash_policy)stash;
        c.recompute_every = 2;
        c.inner = (l2l_inner_policy)inner;
        c.param_slots = 2 + (mi * 9 + stash * 3 + inner) % 5;
        char what[96];
        snprintf(what, sizeof what, "micro %lld, stash %s, inner %s, %d slots",
                 (long long)micros[mi], stash_name(stash), inner_name(inner), c.param_slots);
        failed += !relay_matches(&init, &c, NULL, batches, STEPS, what);
      }
  l2l_relay_config c = cfg;
  c.micro_batch = 2;
  c.recompute_every = 3;
  c.param_slots = (int)check_rand_int(2, 6);
  failed += !relay_matches(&init, &c, mixed_policies, batches, STEPS, "micro 2, mixed policies");
  CHECK(failed == 0, "%d of 28 configurations differ from plain training", failed);
  free_batches(batches, STEPS);
  model_free(&init);
}

TEST(relay_bert_matches_plain_training) {
  /* BERT-like: post-LN, bidirectional, token types, padding; (1) a masked-LM head tied
     to the embedding, targets on ~30 % of the real positions; (2) a classifier on the
     first position, one sample's target ignored. AdamW with decay_all. */
  enum { STEPS = 4 };
  struct shape g = bert_shape();
  for (int variant = 0; variant < 2; variant++) {
    if (variant == 1) g.head = L2L_LAYER_CLASSIFIER, g.classes = 5, g.tie = 0;
    struct model init;
    model_new(&init, &g);
    struct data batches[STEPS];
    make_batches(batches, STEPS, &g, 6, 1, variant == 0 ? 0.3 : 1.0);
    l2l_relay_config cfg = adamw_config();
    cfg.optimizer.decay_all = 1;
    l2l_relay_config c = cfg;
    c.micro_batch = variant == 0 ? 4 : 2;
    c.stash = variant == 0 ? L2L_STASH_HOST : L2L_STASH_RECOMPUTE;
    c.recompute_every = 2;
    c.inner = variant == 0 ? L2L_INNER_SWAP : L2L_INNER_KEEP;
    relay_matches(&init, &c, NULL, batches, STEPS,
                  variant == 0 ? "BERT, masked LM" : "BERT, classifier");
    free_batches(batches, STEPS);
    model_free(&init);
  }
}

TEST(relay_sgd_and_lamb_match_plain_training) {
  /* The EPS's other optimizers (their kernels against float64 in test_optim.c): SGD
     with momentum (plain, then Nesterov with decay_all), and LAMB with weight decay
     under a linear schedule with warm-up (its trust ratio per record). */
  enum { STEPS = 4 };
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct data batches[STEPS];
  make_batches(batches, STEPS, &g, 5, 1, 1.0);
  for (int variant = 0; variant < 3; variant++) {
    l2l_relay_config cfg = adamw_config();
    const char *what = "SGD momentum";
    if (variant < 2) {
      cfg.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_SGD, .lr = 0.05f,
                                             .momentum = 0.9f, .nesterov = variant,
                                             .weight_decay = 0.01f, .decay_all = variant};
      if (variant == 1) what = "SGD Nesterov, decay_all";
    } else {
      cfg.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_LAMB, .lr = 0.02f,
                                             .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-5f,
                                             .weight_decay = 0.05f};
      cfg.schedule = (l2l_schedule_config){.kind = L2L_SCHEDULE_LINEAR, .warmup = 1,
                                           .total = 5, .final_ratio = 0.2f};
      what = "LAMB";
    }
    cfg.micro_batch = 2;
    relay_matches(&init, &cfg, NULL, batches, STEPS, what);
  }
  free_batches(batches, STEPS);
  model_free(&init);
}

TEST(relay_gradients_copied_out_as_a_gpus_match_plain_training) {
  /* L2L_GRADS_OUT=copy: each visit's gradients leave the device by a copy into pinned
     memory the EPS owns, as a GPU's do, where the CPU backend would add the slot in place.
     The EPS then holds them for the updates (eps.c, "held arrivals": every record once a
     step, the tied table twice) instead of adding them: AdamW, SGD with momentum and LAMB
     against plain training as above, and every record of every step checked held; with
     accumulation over two steps the first step's are added (no update follows) and the
     second's held, read beside that sum; with global clipping (deferred updates) all are
     added as they come; both match too. The masters the device reads as they are (here
     every one: f32, no staging copies) live in pinned memory while the relay holds them,
     as a GPU's do, and in host memory again once it lets them go. An unknown value is
     refused by the step, naming it. */
  enum { STEPS = 4 };
  const char *kept = getenv("L2L_GRADS_OUT");
  setenv("L2L_GRADS_OUT", "copy", 1);
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct data batches[STEPS];
  make_batches(batches, STEPS, &g, 5, 1, 1.0);
  int records = 0;   /* distinct parameters (the tied head's table is the embedding's) */
  const l2l_param *seen[MAX_LAYERS * L2L_MAX_PARAMS];
  for (int i = 0; i < init.n; i++)
    for (int j = 0; j < l2l_layer_param_count(init.layer[i]); j++) {
      const l2l_param *p = l2l_layer_param(init.layer[i], j);
      bool again = false;
      for (int k = 0; k < records; k++) again |= seen[k] == p;
      if (!again) seen[records++] = p;
    }
  for (int variant = 0; variant < 5; variant++) {
    l2l_relay_config cfg = adamw_config();
    const char *what = "AdamW, gradients copied out";
    cfg.micro_batch = 2;
    cfg.inner = (l2l_inner_policy)(variant % 3);
    if (variant == 1) {
      cfg.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_SGD, .lr = 0.05f,
                                             .momentum = 0.9f, .weight_decay = 0.01f};
      what = "SGD momentum, gradients copied out";
    } else if (variant == 2) {
      cfg.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_LAMB, .lr = 0.02f,
                                             .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-5f,
                                             .weight_decay = 0.05f};
      what = "LAMB, gradients copied out";
    } else if (variant == 3) {
      cfg.clip_global_norm = 0.5f;
      what = "AdamW, global clipping, gradients copied out";
    } else if (variant == 4) {
      cfg.accumulate = 2;
      what = "AdamW, accumulate 2, gradients copied out";
    }
    int64_t want = variant < 3 ? STEPS * records : variant == 4 ? STEPS / 2 * records : 0;
    if (relay_matches(&init, &cfg, NULL, batches, STEPS, what))
      CHECK(matched_held_checks == want, "%s: %lld records' held gradients checked, want %lld",
            what, (long long)matched_held_checks, (long long)want);
  }
  /* where the masters live: the small model's, and one whose token table (1,100 x 256)
     is over EPS_PINNED_F32_MASTER_MAX and its MLP weights (256 x 1,024) just at it */
  struct model rm;
  l2l_relay_config cfg = adamw_config();
  struct shape big = g;
  big.D = 256, big.H = 4, big.F = 1024, big.V = 1100;
  for (int sized = 0; sized < 2; sized++) {
    if (sized) model_new(&rm, &big);
    else model_clone(&rm, &init);
    int on_host = 0;   /* records held over the bound */
    for (int held = 1; held >= 0; held--) {
      l2l_relay *r = held ? relay_new(&rm, &cfg) : NULL;
      if (held && r == NULL) break;
      int astray = 0, n = 0;
      for (int i = 0; i < rm.n; i++)
        for (int j = 0; j < l2l_layer_param_count(rm.layer[i]); j++, n++) {
          const l2l_tensor *v = l2l_param_value(l2l_layer_param(rm.layer[i], j));
          bool small = l2l_tensor_numel(v) * 4 <= EPS_PINNED_F32_MASTER_MAX;
          on_host += held && !small;
          astray += l2l_tensor_pool(v) != (held && small ? L2L_POOL_PINNED : L2L_POOL_HOST) ||
                    l2l_tensor_dtype(v) != L2L_F32;
        }
      CHECK(astray == 0, "%d of %d f32 masters not where they belong %s (small ones pinned, "
            "the rest in host memory)", astray, n,
            held ? "while a relay holds them" : "after it let them go (host memory)");
      l2l_relay_free(r);
    }
    /* (the token table, listed by the embedding and by the head tied to it) */
    CHECK(on_host == (sized ? 2 : 0), "%d records over the bound, want %d", on_host, sized ? 2 : 0);
    model_free(&rm);
  }
  setenv("L2L_GRADS_OUT", "by post", 1);
  model_clone(&rm, &init);
  l2l_relay *r = relay_new(&rm, &cfg);
  if (r != NULL) {
    double loss;
    l2l_relay_batch b = relay_batch(&batches[0], NULL);
    CHECK_FAILS(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "L2L_GRADS_OUT is \"by post\"");
    l2l_relay_free(r);
  }
  model_free(&rm);
  if (kept) setenv("L2L_GRADS_OUT", kept, 1);
  else unsetenv("L2L_GRADS_OUT");
  free_batches(batches, STEPS);
  model_free(&init);
}

/* A frozen embedding tied to a trainable head: the head's gradient completes the shared
   table, whose update runs while the backward goes on; a rebuild of the embedding's output
   (boundary 1 dropped) later in the same step must read the table the forward read, so
   the step is the one with the boundary kept on the device, to the bit. */
TEST(relay_rebuild_of_a_frozen_tied_layer_reads_the_forwards_weights) {
  struct shape g = gpt_shape();
  g.tie = 1, g.blocks = (int)check_rand_int(1, 3), g.dropout = 0;
  struct model init, kept, rebuilt;
  model_new(&init, &g);
  model_clone(&kept, &init);
  model_clone(&rebuilt, &init);
  struct data d;
  int64_t B = check_rand_int(2, 6);
  data_new(&d, &g, B, g.S, 0, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = check_rand_int(1, B);
  l2l_relay *a = relay_new(&kept, &cfg), *b = relay_new(&rebuilt, &cfg);
  if (a && b && CHECK_OK(l2l_relay_set_frozen(a, 0, 1)) && CHECK_OK(l2l_relay_set_frozen(b, 0, 1)) &&
      CHECK_OK(l2l_relay_set_stash(a, 1, L2L_STASH_DEVICE)) &&
      CHECK_OK(l2l_relay_set_stash(b, 1, L2L_STASH_RECOMPUTE))) {
    double la, lb;
    for (int step = 0; step < 3; step++) {
      if (!relay_step(&la, a, &d, NULL) || !relay_step(&lb, b, &d, NULL)) break;
      CHECK(la == lb, "step %d: loss %.17g with boundary 1 kept, %.17g rebuilt", step, la, lb);
    }
    CHECK_OK(l2l_relay_sync(a));
    CHECK_OK(l2l_relay_sync(b));
    for (int k = 0; k < kept.n; k++)
      for (int i = 0; i < l2l_layer_param_count(kept.layer[k]); i++) {
        const l2l_tensor *x = l2l_param_value(l2l_layer_param(kept.layer[k], i)),
                         *y = l2l_param_value(l2l_layer_param(rebuilt.layer[k], i));
        CHECK(memcmp(l2l_tensor_data(x), l2l_tensor_data(y), tensor_bytes(x)) == 0,
              "layer %d record %d: the weights differ after 3 steps (%d blocks, batch %lld, "
              "micro-batch %lld)", k, i, g.blocks, (long long)B, (long long)cfg.micro_batch);
      }
  }
  l2l_relay_free(a);
  l2l_relay_free(b);
  data_free(&d);
  model_free(&kept);
  model_free(&rebuilt);
  model_free(&init);
}

/* The optimizer state in a spill file between updates (issue "Beyond host memory", its
   first part, reached here through the relay's EPS: no option names it yet): the same
   losses, weights and state to the bit as in memory, for AdamW, SGD with momentum and
   LAMB (two waves), spilled before the first step or after it, and the host bytes less
   by the state's. */

TEST(relay_evaluate_is_the_plain_forward) {
  /* evaluate: the mean loss of a forward without dropout; no update, no step counted. */
  struct shape g = gpt_shape();
  struct model init, rm;
  model_new(&init, &g);
  model_clone(&rm, &init);
  struct data d;
  data_new(&d, &g, 5, g.S, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  struct plain p;
  plain_init(&p, &init, &cfg);
  double want = plain_evaluate(&p, &d), got = NAN;
  l2l_relay *r = relay_new(&rm, &cfg);
  if (r) {
    struct snapshot s;
    snapshot_take(&s, r, 0, rm.n);
    l2l_relay_batch b = relay_batch(&d, NULL);
    CHECK_OK(l2l_relay_evaluate(&got, r, &b));
    CHECK(rel_close(got, want, TOL_LOSS), "evaluate %.9g, plain forward %.9g", got, want);
    check_unchanged(r, &s, "after evaluate");
    CHECK(relay_stats(r).steps == 0, "evaluate counted as a step");
    snapshot_free(&s);
  }
  l2l_relay_free(r);
  plain_free(&p);
  data_free(&d);
  model_free(&rm);
  model_free(&init);
}

/* ---------------------------------------------------------------- accumulation, clipping */

TEST(relay_accumulate_matches_whole_minibatch) {
  /* accumulate = 2 over two halves with equal numbers of real targets is one step on the
     whole minibatch (the mean of the halves' mean gradients is the whole's mean
     gradient); no dropout, so the step index does not matter: the halves' losses average
     to plain training's on whole minibatches. No update after the first half: every
     record bit for bit as before. The weights and states after the updates are the plain
     executor's accumulating the same halves split alike (see TOL_WEIGHT: whole and split
     runs differ in entries whose gradient nearly cancels). */
  enum { UPDATES = 2 };
  struct shape g = gpt_shape();
  g.dropout = 0, g.attn_dropout = 0;
  struct model init, rm;
  model_new(&init, &g);
  model_clone(&rm, &init);
  const int64_t H = 4; /* samples per half */
  struct data whole[UPDATES], half[2 * UPDATES];
  for (int k = 0; k < UPDATES; k++) {
    data_new(&half[2 * k], &g, H, g.S, 1, 1.0);
    data_new(&half[2 * k + 1], &g, H, g.S, 1, 1.0);
    /* The second half: the first's masks and targets' positions, other tokens. */
    memcpy(l2l_tensor_data(half[2 * k + 1].key_mask), l2l_tensor_data(half[2 * k].key_mask),
           tensor_bytes(half[2 * k].key_mask));
    int32_t *t0 = l2l_tensor_data(half[2 * k].targets), *t1 = l2l_tensor_data(half[2 * k + 1].targets);
    for (int64_t i = 0; i < H * g.S; i++)
      if ((t0[i] == -1) != (t1[i] == -1)) t1[i] = t0[i] == -1 ? -1 : (int32_t)check_rand_int(0, g.V - 1);
    half[2 * k + 1].real = half[2 * k].real;
    /* The whole minibatch: both halves stacked. */
    data_new(&whole[k], &g, 2 * H, g.S, 1, 1.0);
    for (int h = 0; h < 2; h++) {
      const struct data *s = &half[2 * k + h];
      memcpy((int32_t *)l2l_tensor_data(whole[k].tokens) + h * H * g.S, l2l_tensor_data(s->tokens), tensor_bytes(s->tokens));
      memcpy((int32_t *)l2l_tensor_data(whole[k].targets) + h * H * g.S, l2l_tensor_data(s->targets), tensor_bytes(s->targets));
      memcpy((uint8_t *)l2l_tensor_data(whole[k].key_mask) + h * H * g.S, l2l_tensor_data(s->key_mask), tensor_bytes(s->key_mask));
    }
    whole[k].real = 2 * half[2 * k].real;
  }
  l2l_relay_config cfg = adamw_config();
  struct plain p, alike;
  plain_init(&p, &init, &cfg);
  l2l_relay_config rc = cfg;
  rc.accumulate = 2;
  rc.micro_batch = 3;
  plain_init(&alike, &init, &rc);
  l2l_relay *r = relay_new(&rm, &rc);
  for (int k = 0; r && k < UPDATES; k++) {
    double want = plain_step(&p, &whole[k], 0, NULL), l0 = NAN, l1 = NAN;
    plain_step(&alike, &half[2 * k], rc.micro_batch, NULL);
    plain_step(&alike, &half[2 * k + 1], rc.micro_batch, NULL);
    struct snapshot s;
    snapshot_take(&s, r, 0, rm.n);
    relay_step(&l0, r, &half[2 * k], NULL);
    check_unchanged(r, &s, "after the first of two accumulated minibatches");
    CHECK(relay_stats(r).updates == k, "updates %lld after %d updates and a half",
          (long long)relay_stats(r).updates, k);
    relay_step(&l1, r, &half[2 * k + 1], NULL);
    CHECK(relay_stats(r).updates == k + 1, "updates %lld, want %d",
          (long long)relay_stats(r).updates, k + 1);
    CHECK(rel_close(0.5 * (l0 + l1), want, TOL_LOSS),
          "update %d: halves' losses %.9g and %.9g average %.9g, whole minibatch %.9g", k, l0,
          l1, 0.5 * (l0 + l1), want);
    snapshot_free(&s);
  }
  if (r) compare_to_plain(r, &rm, &alike, "accumulate 2");
  l2l_relay_free(r);
  plain_free(&p);
  plain_free(&alike);
  for (int k = 0; k < UPDATES; k++) data_free(&whole[k]);
  for (int k = 0; k < 2 * UPDATES; k++) data_free(&half[k]);
  model_free(&rm);
  model_free(&init);
}

TEST(relay_clip_global_norm) {
  /* Global clipping with SGD (whose update is proportional to the gradient, so a missed
     or wrong scale shows; AdamW would hide it): clip at a third of the first step's
     norm. Weights as plain training with the gradient scaled by clip/norm, stats.grad_norm
     the plain norm before clipping, updates deferred: every UPDATE event starts after
     every BACKWARD event of its step has ended. */
  enum { STEPS = 3 };
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct data batches[STEPS];
  make_batches(batches, STEPS, &g, 6, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .momentum = 0.5f};
  struct reference probe;
  reference_run(&probe, &init, &cfg, batches, 1, 0);
  cfg.clip_global_norm = (float)(probe.norm[0] / 3.0);
  plain_free(&probe.plain);
  cfg.micro_batch = 4;
  struct reference ref;
  reference_run(&ref, &init, &cfg, batches, STEPS, cfg.micro_batch);
  for (int k = 0; k < STEPS; k++)
    CHECK(ref.norm[k] > cfg.clip_global_norm, "step %d: the clip (%g) does not bite (norm %g)",
          k, (double)cfg.clip_global_norm, ref.norm[k]);
  struct model rm;
  model_clone(&rm, &init);
  l2l_relay *r = relay_new(&rm, &cfg);
  for (int k = 0; r && k < STEPS; k++) {
    double loss;
    if (!relay_step(&loss, r, &batches[k], NULL)) break;
    CHECK(rel_close(loss, ref.loss[k], TOL_LOSS), "step %d: loss %.9g, plain %.9g", k, loss,
          ref.loss[k]);
    l2l_relay_stats s = relay_stats(r);
    CHECK(rel_close(s.grad_norm, ref.norm[k], TOL_NORM), "step %d: grad_norm %.9g, plain %.9g",
          k, s.grad_norm, ref.norm[k]);
    CHECK(s.updates_deferred == 1, "step %d: updates_deferred %d", k, s.updates_deferred);
    CHECK_OK(l2l_relay_sync(r));
    int64_t n;
    l2l_relay_event *ev = relay_events(r, &n);
    double last_backward = -INFINITY, first_update = INFINITY;
    for (int64_t i = 0; i < n; i++) {
      if (ev[i].phase == L2L_PHASE_BACKWARD && ev[i].end > last_backward) last_backward = ev[i].end;
      if (ev[i].phase == L2L_PHASE_UPDATE && ev[i].start < first_update) first_update = ev[i].start;
    }
    CHECK(first_update >= last_backward && isfinite(first_update),
          "step %d: an update started at %.6f s, before the backward ended at %.6f s", k,
          first_update, last_backward);
    free(ev);
  }
  if (r) compare_to_plain(r, &rm, &ref.plain, "clip_global_norm");
  l2l_relay_free(r);
  plain_free(&ref.plain);
  free_batches(batches, STEPS);
  model_free(&rm);
  model_free(&init);
}

TEST(relay_clip_layer_norm) {
  /* Per-layer clipping with SGD: each layer's own contribution (the LM head's share of
     the tied table clipped with the head, the embedding's with the embedding) scaled to
     clip_layer_norm at most, chosen so that it bites for some layers and not others;
     updates stay eager. */
  enum { STEPS = 3 };
  struct shape g = gpt_shape();
  struct model init;
  model_new(&init, &g);
  struct data batches[STEPS];
  make_batches(batches, STEPS, &g, 6, 1, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_SGD, .lr = 0.1f, .momentum = 0.5f};
  /* Each layer's gradient norm in the first step, to put the clip between the smallest
     and the largest: with every other layer frozen (its gradient dropped), the
     accumulators hold one layer's contribution alone. */
  double lo = INFINITY, hi = 0;
  struct plain q;
  plain_init(&q, &init, &cfg);
  for (int l = 0; l < q.model.n; l++) {
    for (int k = 0; k < q.model.n; k++) q.model.frozen[k] = k != l;
    plain_pass(&q, &batches[0], 0, NULL);
    double sq = 0;
    for (int j = 0; j < l2l_layer_param_count(q.model.layer[l]); j++) {
      struct prec *pr = plain_rec(&q, l2l_layer_param(q.model.layer[l], j));
      sq += sumsq_f32(check_data(pr->acc), numel(pr->acc));
      memset(check_data(pr->acc), 0, tensor_bytes(pr->acc));
      pr->touched = 0;
    }
    lo = fmin(lo, sqrt(sq)), hi = fmax(hi, sqrt(sq));
  }
  plain_free(&q);
  cfg.clip_layer_norm = (float)sqrt(lo * hi);
  CHECK(lo < cfg.clip_layer_norm && cfg.clip_layer_norm < hi, "layer norms %g..%g", lo, hi);
  cfg.micro_batch = 4;
  relay_matches(&init, &cfg, NULL, batches, STEPS, "clip_layer_norm");
  free_batches(batches, STEPS);
  model_free(&init);
}
