/* SPDX-License-Identifier: MIT */
/* step.c — a training or evaluation step from start to end: checks, the visit plan, the
 * learning rate and loss scale, the EPS's bookkeeping, the visits, deferred updates, and
 * the stats.
 *
 * Purpose: the relay's one public action, each of its phases a function of its own.
 * Must never: leave the EPS half-way through a step: a failure abandons the gradients of
 * the records not yet complete, and none of them updates (the records updated before the
 * failure, as eager updates are, stay updated: l2l/relay.h says so).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay.h"

l2l_status relay_check_async(l2l_relay *run) {
  pthread_mutex_lock(&run->lock);
  l2l_status status = run->async_status;
  char message[256];
  snprintf(message, sizeof message, "%s", run->async_message);
  run->async_status = L2L_OK;
  pthread_mutex_unlock(&run->lock);
  return status == L2L_OK ? L2L_OK : core_fail(status, "%s", message);
}

/* ---------------------------------------------------------------- data parallel */

/* With ranks, before anything runs: every rank's slice size and real targets, the
   digest of what the ranks must hold alike (agree.c), and whether its placement auto
   would place again (then every rank does, together). The loss is then the mean over the
   whole minibatch's targets and dropout numbers samples globally (the slices in rank
   order). Every rank sees the same exchange, so ranks that differ all refuse the step
   alike. (The exchange also orders the step after the last one's exchanges still on the
   ranks' thread: their callbacks read the EPS's step settings, which the step resets.) */
static l2l_status dist_begin(struct step *s) {
  l2l_relay *run = s->run;
  if (run->config.dist == L2L_DIST_NONE) return L2L_OK;
  int size = dist_size_now(), rank = dist_rank_now();
  enum { FIELDS = 4 };
  int64_t mine[FIELDS] = {s->B, s->real, relay_agreement_digest(s), relay_place_wanted(s)};
  int64_t *all = malloc((size_t)size * FIELDS * sizeof *all);
  if (all == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for the ranks' step sizes");
  struct dist_op op = {.kind = DIST_ALLGATHER_I64, .send = mine, .recv = all, .n = FIELDS,
                           .what = "exchange of the step's sizes", .layer = -1,
                           .step = run->steps + 1};
  double t0 = core_now();
  l2l_status status = dist_run(&op);
  relay_waited(s, L2L_WAIT_COMM, t0);
  int64_t real = 0, base = 0;
  bool differ = false;
  s->place_wanted = false;
  for (int r = 0; r < size && status == L2L_OK; r++) {
    differ |= all[r * FIELDS + 2] != all[2];
    real += all[r * FIELDS + 1];
    if (r < rank) base += all[r * FIELDS];
    s->place_wanted |= all[r * FIELDS + 3] != 0;   /* (every rank places with it) */
  }
  free(all);
  /* every rank sees the same digests: all of them explain, and refuse, alike */
  if (status == L2L_OK && differ) status = relay_explain_disagreement(s);
  if (status == L2L_OK && real == 0)
    status = error_note_field(FAIL(L2L_ERR_INVALID, L2L_NAMED_FIELD "batch->targets" L2L_NAMED_END
                                   " has no target other than -1 on any rank"), "targets");
  s->real = real;
  s->sample_base = base;
  return status;
}

/* With ranks, a step that fails on this rank once the sizes were exchanged leaves the
   others waiting on collectives this rank will never post, and this rank's streams out
   of step with theirs: the job ends now, saying why (no rank waits out its timeout). */
static void dist_diverged(const l2l_relay *run) {
  if (run->config.dist == L2L_DIST_NONE) return;
  char what[512];
  snprintf(what, sizeof what, "step %lld failed after the ranks' exchange began, so the ranks "
           "can no longer agree: %s", (long long)run->steps + 1, l2l_last_error());
  dist_fail(what);
}

/* With ranks, after each rank began the step on its side (`own`: its status, its host
   budget refused the step, say): whether every rank did. One that could not makes every
   rank refuse the step alike, still in step, each free to take it again. A failed
   exchange leaves the ranks out of step: the job ends (dist_diverged). */
static l2l_status dist_begun(struct step *s, l2l_status own) {
  l2l_relay *run = s->run;
  if (run->config.dist == L2L_DIST_NONE) return own;
  int size = dist_size_now();
  int64_t mine = own != L2L_OK, *all = malloc((size_t)size * sizeof *all);
  if (all == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for the ranks' step sizes");
  struct dist_op op = {.kind = DIST_ALLGATHER_I64, .send = &mine, .recv = all, .n = 1,
                           .what = "exchange of whether each rank began the step", .layer = -1,
                           .step = run->steps + 1};
  double t0 = core_now();
  l2l_status status = dist_run(&op);
  relay_waited(s, L2L_WAIT_COMM, t0);
  int refused = -1;   /* the first rank that could not begin the step */
  for (int r = 0; r < size && status == L2L_OK; r++)
    if (refused < 0 && all[r]) refused = r;
  free(all);
  if (status != L2L_OK) {
    dist_diverged(run);
    return status;
  }
  if (own != L2L_OK) return own;
  if (refused >= 0)
    return FAIL(L2L_ERR_STATE, "rank %d of %d could not begin step %lld (its own error says "
                "why, e.g. its host budget), so no rank takes it; each may take it again",
                refused, size, (long long)run->steps + 1);
  return L2L_OK;
}

/* With ranks: the loss summed over every rank's slice. */
static l2l_status dist_loss(struct step *s) {
  if (s->run->config.dist == L2L_DIST_NONE) return L2L_OK;
  struct dist_op op = {.kind = DIST_ALLREDUCE_SUM, .recv = &s->loss_sum, .n = 1,
                           .what = "all-reduce of the loss", .layer = -1,
                           .step = s->run->steps + 1};
  double t0 = core_now();
  l2l_status status = dist_run(&op);
  relay_waited(s, L2L_WAIT_COMM, t0);
  return status;
}

/* What a step decides before it runs, from the config and the relay's counts. */
struct step_plan {
  bool update;     /* this step ends an accumulation: the EPS updates */
  bool defer;      /* updates wait for every gradient (global clipping, loss scaling) */
  double lr;       /* the schedule's, for this update */
  double dynamic;  /* the dynamic loss scale (1 without loss scaling) */
};

static l2l_status plan_step(struct step_plan *p, struct step *s) {
  const l2l_relay *run = s->run;
  const l2l_relay_config *c = &run->config;
  if (run->steps == INT64_MAX)   /* (restore_progress refuses it; the count cannot go on) */
    return FAIL(L2L_ERR_STATE, "the relay has counted %lld steps: no step can follow",
                (long long)run->steps);
  *p = (struct step_plan){.update = s->training && (run->steps + 1) % c->accumulate == 0,
                          .dynamic = c->loss_scale > 0 ? run->scale : 1.0};
  p->defer = p->update && (c->clip_global_norm > 0 || c->loss_scale > 0);
  if (p->update) TRY(l2l_schedule_lr(&p->lr, &c->schedule, c->optimizer.lr, run->updates + 1));
  /* The loss gradient's seed: the mean over the minibatch's real targets (and over the
     accumulation), times the dynamic loss scale. The scale changes only at an update, so
     every minibatch of an accumulation has the same. */
  s->loss_scale = (float)(p->dynamic / ((double)s->real * c->accumulate));
  s->clip_layer = (float)(c->clip_layer_norm * p->dynamic);
  return L2L_OK;
}

/* Which records expect gradients this step: one arrival per trainable visit (the EPS's
   step plan); their missing optimizer state is allocated now, so that a failure comes
   before any change. */
static l2l_status eps_begin(struct step *s, const struct step_plan *p) {
  int n_expect = 0, n_hold = 0;
  for (int k = s->order.lowest; k < s->L; k++) {
    struct relay_layer *rl = active_layer(s, k);
    if (!rl->frozen) n_expect += l2l_layer_param_count(rl->layer);
  }
  for (int i = 0; i < s->order.nvisits; i++) {
    const struct order_visit *v = &s->order.visits[i];
    struct relay_layer *rl = active_layer(s, v->k);
    if (v->kind == ORDER_REBUILD && rl->frozen) n_hold += l2l_layer_param_count(rl->layer);
  }
  l2l_param **list = malloc((size_t)(n_expect + n_hold + 1) * sizeof *list);
  if (list == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for the step's list of records");
  struct eps_step step = {.update = p->update, .defer = p->defer, .lr = p->lr,
                              .expect = list, .n_expect = n_expect,
                              .hold = list + n_expect, .n_hold = n_hold};
  /* From the lowest layer up, and each layer's records from its last: the later a record
     is named, the sooner its gradient comes (a visit gives its records first to last), so
     the EPS knows the order backward completes them. */
  int at = 0;
  for (int k = s->order.lowest; k < s->L; k++) {
    struct relay_layer *rl = active_layer(s, k);
    if (rl->frozen) continue;
    for (int r = l2l_layer_param_count(rl->layer) - 1; r >= 0; r--)
      list[at++] = l2l_layer_param(rl->layer, r);
  }
  /* a frozen layer's rebuild reads its records after the forward: one that a trainable
     layer shares is not updated before (the rebuild must reproduce the forward) */
  for (int i = 0; i < s->order.nvisits; i++) {
    const struct order_visit *v = &s->order.visits[i];
    struct relay_layer *rl = active_layer(s, v->k);
    if (v->kind != ORDER_REBUILD || !rl->frozen) continue;
    for (int r = 0; r < l2l_layer_param_count(rl->layer); r++)
      list[at++] = l2l_layer_param(rl->layer, r);
  }
  l2l_status status = eps_step_begin(&s->run->eps, &step);
  free(list);
  return status;
}

/* The last step's timeline, transfer counts and device peak are forgotten. */
static void counters_reset(l2l_relay *run) {
  timeline_reset(&run->timeline);
  pthread_mutex_lock(&run->lock);
  run->h2d_bytes = run->d2h_bytes = 0;
  run->stash_peak = run->stash_now;
  pthread_mutex_unlock(&run->lock);
  /* the step's device peak is the pool's bytes now plus this relay's own rise (its meter):
     the pool's own peak is left alone, as relays on other threads share it */
  l2l_pool_stats device;
  l2l_pool_get_stats(&device, L2L_POOL_DEVICE);
  run->device_at_start = device.current;
  pool_meter_reset(&run->device_meter);
  run->meter_at_start = atomic_load(&run->device_meter.current);
}

/* Dynamic loss scaling after an update: halve on an overflow (the update was skipped),
   double after loss_scale_window good updates in a row. */
static void loss_scale_adjust(l2l_relay *run, bool applied) {
  const l2l_relay_config *c = &run->config;
  if (!applied) {
    run->scale = fmax(run->scale / 2, MIN_LOSS_SCALE);
    run->scale_good = 0;
  } else if (++run->scale_good >= c->loss_scale_window) {
    run->scale = fmin(run->scale * 2, MAX_LOSS_SCALE);
    run->scale_good = 0;
  }
}

/* The records whose inf or NaN gradient (or one of 2^63 or more, which the optimizer state
   cannot take: eps.h's EPS_GRAD_LIMIT) the EPS kept out of their masters this step: said
   on stderr once per relay, or an error when the config asks for one. `layer` is the
   0-based index of the last layer using the first such record (said counting from 1). */
static l2l_status nonfinite_report(l2l_relay *run, int skips, const char *name, int layer) {
  if (skips == 0) return L2L_OK;
  if (run->config.nonfinite_error)
    return core_fail(L2L_ERR_STATE, "the gradient of %d parameter record%s held an inf or NaN "
                     "or a value of 2^63 or more, which the optimizer state cannot take (the "
                     "first: '%s' of layer %d): %s updates skipped", skips,
                     skips == 1 ? "" : "s", name ? name : "?", layer + 1, skips == 1 ? "its" : "their");
  if (!run->warned_nonfinite) {
    run->warned_nonfinite = true;
    fprintf(stderr, "l2l: warning: the gradient of '%s' (layer %d) held an inf or NaN or a "
            "value of 2^63 or more, which the optimizer state cannot take: its update was "
            "skipped and the gradient dropped (stats skipped_records; said once; the "
            "relay's nonfinite = \"error\", in C nonfinite_error = 1, makes it an error)\n",
            name ? name : "?", layer + 1);
  }
  return L2L_OK;
}

static void stats_record(l2l_relay *run, const struct step *s, const struct step_plan *p,
                         double loss, bool applied, double norm, double seconds) {
  l2l_relay_stats *st = &run->stats;
  l2l_pool_stats device;
  l2l_pool_get_stats(&device, L2L_POOL_DEVICE);
  st->steps = run->steps;
  st->updates = run->updates;
  st->loss = core_plain_nan(loss);
  if (applied) st->lr = p->lr;
  st->loss_scale = run->config.loss_scale > 0 ? run->scale : 0;
  st->loss_scale_good = run->scale_good;
  st->skipped_updates = run->skipped;
  st->overflow = p->update && !applied;
  st->grad_norm = core_plain_nan(norm);
  st->updates_deferred = p->defer;
  int64_t rise = atomic_load(&run->device_meter.peak) - run->meter_at_start;
  st->device_peak = run->device_at_start + (uint64_t)(rise > 0 ? rise : 0);
  st->device_start = run->device_at_start;
  st->device_current = device.current;
  st->step_seconds = seconds;
  st->compute_seconds = s->compute;
  st->wait_copy_seconds = s->wait_copy;
  st->exposed_copy_seconds = s->exposed_copy;
  st->wait_update_seconds = s->wait_update;
  st->exposed_comm_seconds = s->exposed_comm;
  pthread_mutex_lock(&run->lock);
  st->h2d_bytes = run->h2d_bytes;
  st->d2h_bytes = run->d2h_bytes;
  st->host_stash_peak = run->stash_peak;
  pthread_mutex_unlock(&run->lock);
}

/* Whether a frugal layer's LayerNorm guard may read the host copies of records on the
   device. */
static bool guards_read(const l2l_relay *run) {
  bool frugal = false;
  for (int k = 0; k < run->count; k++) {
    l2l_layer_config c;
    l2l_layer_get_config(&c, run->layers[k].layer);
    frugal |= c.memory == L2L_MEMORY_FRUGAL;
  }
  return frugal;
}

/* The host copies the frugal LayerNorm guard reads of the records on the device made
   current (when a frugal layer reads them: queued behind the last training step's
   updates, or one wait now) and given to their parameters, before the step's replay or
   any layer reads them. */
static l2l_status guard_copies(l2l_relay *run, bool training) {
  for (int k = 0; k < run->count; k++)
    for (int r = 0; r < l2l_layer_param_count(run->layers[k].layer); r++) {
      l2l_param *p = l2l_layer_param(run->layers[k].layer, r);
      struct eps_record *rec = eps_find(&run->eps, p);
      /* (the EPS told of values written through l2l_param_write first: the copies below
         are made again for them) */
      if (rec != NULL) eps_note_writes(&run->eps, rec, param_writes(p));
      param_set_guard_copy(p, rec ? eps_guard_copy(rec) : NULL);
    }
  return guards_read(run) ? eps_device_guard_copies(&run->eps, training) : L2L_OK;
}

/* Where the step's records live (placement auto), its schedule and its budget's check. */
static l2l_status step_placed(struct step *s) {
  l2l_status status = relay_place_auto(s);
  if (status == L2L_OK) status = relay_schedule(s);
  if (status == L2L_OK) status = relay_check_budget(s);
  return status;
}

/* Everything before the first visit: checks, the placement, the plan of visits and the
   budget's check (with ranks after their exchange of sizes: the ranks place together), the
   step's arrays, the EPS's bookkeeping (its host budget's check), then with ranks whether
   every rank began: one that could not makes every rank refuse the step. A failure frees
   the step and changes nothing (but records placement auto moved stay moved). */
static l2l_status step_begin(struct step *s, struct step_plan *p) {
  bool ranks = s->run->config.dist != L2L_DIST_NONE;
  l2l_status status = relay_check_step(s, s->in);
  /* (the guard's copies first: placement auto replays the step, which reads them; a record
     it moves gets a copy made as it moves) */
  if (status == L2L_OK) status = guard_copies(s->run, s->training);
  if (status == L2L_OK && !ranks) status = step_placed(s);
  if (status == L2L_OK) status = dist_begin(s);   /* (every rank refuses a failed one alike) */
  if (status == L2L_OK) {   /* from here every rank reaches the second exchange */
    bool began = false;
    l2l_status own = ranks ? step_placed(s) : L2L_OK;
    if (own == L2L_OK) own = relay_step_alloc(s);
    if (own == L2L_OK) own = plan_step(p, s);
    if (own == L2L_OK && s->training) {
      own = eps_begin(s, p);
      began = own == L2L_OK;
    }
    status = dist_begun(s, own);
    if (began) eps_step_agreed(&s->run->eps, status == L2L_OK);   /* (else: undone) */
  }
  if (status != L2L_OK) relay_step_free(s);
  return status;
}

/* The step itself, once the relay is entered and the last step's troubles are known. */
static l2l_status relay_run_step(double *loss, l2l_relay *run, const l2l_relay_batch *batch,
                                 bool training) {
  struct step s = {.run = run, .in = batch, .training = training};
  struct step_plan p;
  atomic_store(&run->eps.step, run->steps + 1);
  /* The step's time starts before its beginning: with ranks, the exchange of sizes there
     is a wait for MPI (exposed_comm), and every part of the step lies within its time. */
  double t0 = core_now();
  /* the spill file's counts before this step's first read ahead */
  eps_spill_counts(&run->eps, &run->spill_at);
  run->pass_bytes_at = eps_pass_bytes(&run->eps);
  TRY(step_begin(&s, &p));
  counters_reset(run);
  l2l_status status = relay_run_visits(&s);
  double norm = -1;
  bool applied = p.update;
  if (status == L2L_OK && p.defer) {
    /* relay_run_visits waited for every gradient job, so every gradient has been given. */
    status = relay_check_async(run);
    double released = core_now();   /* with ranks it waits for every record's agreed norm */
    if (status == L2L_OK)
      applied = eps_step_release(&run->eps, run->config.clip_global_norm,
                                        1.0 / p.dynamic, &norm);
    if (run->config.dist != L2L_DIST_NONE) relay_waited(&s, L2L_WAIT_COMM, released);
  }
  if (training) eps_device_flags_queue(&run->eps);   /* (back with the step's one wait) */
  /* the next step's guard copies, behind this step's updates: that wait sees them too */
  if (training && run->config.dist == L2L_DIST_NONE && guards_read(run))
    eps_device_guard_copies_queue(&run->eps);
  relay_step_free(&s);   /* drains the copy threads: every gradient has been given */
  if (status == L2L_OK) status = relay_check_async(run);
  if (status == L2L_OK) status = dist_loss(&s);
  if (training) eps_device_guards_settled(&run->eps, status == L2L_OK);
  if (status != L2L_OK) {
    dist_diverged(run);
    if (training) eps_step_end(&run->eps, false, NULL);
    return status;
  }

  *loss = core_plain_nan(s.loss_sum / (double)s.real);
  double agreed = core_now();   /* with ranks, skips are known once every record is agreed */
  struct eps_outcome outcome = {.skips = 0, .name = NULL, .layer = -1};
  if (training) eps_step_end(&run->eps, true, &outcome);
  int skips = outcome.skips;
  if (run->config.dist != L2L_DIST_NONE) relay_waited(&s, L2L_WAIT_COMM, agreed);
  if (training) {
    run->steps++;
    if (applied) run->updates++;
    if ((p.update && !applied) || skips > 0) run->skipped++;
  }
  if (p.update && run->config.loss_scale > 0) loss_scale_adjust(run, applied);
  stats_record(run, &s, &p, *loss, applied, norm, core_now() - t0);
  run->stats.skipped_records = skips;
  return nonfinite_report(run, skips, outcome.name, outcome.layer);
}

static l2l_status relay_run(double *loss, l2l_relay *run, const l2l_relay_batch *batch,
                            bool training) {
  const char *func = training ? "l2l_relay_step" : "l2l_relay_evaluate";
  if (loss == NULL) return core_fail_in(func, L2L_ERR_INVALID, "loss is NULL");
  RELAY_ENTER_AS(run, func);
  RELAY_METER_BIND(run);
  /* Updates of the last step may still run (each layer's forward waits for its own);
     its gradient arrivals must be counted before this step's bookkeeping starts. */
  eps_wait_arrivals(&run->eps);
  TRY(error_as(func, relay_check_async(run)));
  TRY(error_as(func, eps_io_status(&run->eps)));   /* the last step's updates could not read or write */
  bool profiled = profile_step_begin(training);
  l2l_status status = relay_run_step(loss, run, batch, training);
  profile_step_end(profiled, status == L2L_OK);
  return error_as(func, status);
}

l2l_status l2l_relay_step(double *loss, l2l_relay *run, const l2l_relay_batch *batch) {
  return relay_run(loss, run, batch, true);
}

l2l_status l2l_relay_evaluate(double *loss, l2l_relay *run, const l2l_relay_batch *batch) {
  return relay_run(loss, run, batch, false);
}
