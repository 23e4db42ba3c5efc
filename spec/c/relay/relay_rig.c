/* SPDX-License-Identifier: MIT */
/* relay_rig.c — the relay tests' shared helpers (relay_rig.h): relative errors over a
 * record, the key bias's noise range, refusals with either of two statuses, the usual
 * AdamW config, every record of a relay against the plain executor's, snapshots of
 * records, minibatches, a plain stack, mixed policies.
 * Must never: take an expected value from the relay or the EPS (the plain executor,
 * plain.c, is the reference).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "relay_rig.h"

/* ---------------------------------------------------------------- small helpers */

/* max_i |got_i - want_i| / (|want_i| + floor) over i outside [skip_from, skip_to), with
   floor = the RMS of those want_i (at least 1e-30): relative to the tensor's scale, so
   tiny entries do not dominate. Entries inside the range need only be finite in got.
   Writes the worst index. */
double rel_err_f32(const float *got, const float *want, int64_t n, int64_t skip_from,
                   int64_t skip_to, int64_t *worst) {
  double sq = 0.0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; i++)
    if (i < skip_from || i >= skip_to) sq += (double)want[i] * want[i], counted++;
  double floor = counted > 0 ? sqrt(sq / (double)counted) : 0.0;
  if (floor < 1e-30) floor = 1e-30;
  double err = 0.0;
  *worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double e;
    if (i >= skip_from && i < skip_to)
      e = isfinite(got[i]) ? 0.0 : INFINITY;
    else
      e = fabs((double)got[i] - (double)want[i]) / (fabs((double)want[i]) + floor);
    if (isnan(e) || (isnan(got[i]) && !isnan(want[i]))) e = INFINITY;
    if (e > err) err = e, *worst = i;
  }
  return err;
}

/* Entries of a record whose exact gradient is zero, so that their f32 gradient is pure
   rounding noise (~1e-9): the key bias, columns [D, 2D) of attn.qkv.bias. Adding b to
   every key adds q_i . b to every score of query i, which softmax ignores: d/db =
   sum_i q_i sum_j dS_ij = 0 since each row of dS sums to zero. AdamW divides a gradient
   by the root of its own second moment, so noise of 1e-9 still moves these entries by
   up to lr per step in a direction set by rounding: two correct executions that sum in
   different orders disagree there by ~lr, while nothing else depends on them (they do
   not change any output). They are compared for finiteness only. */
void noise_range(const l2l_param *param, int64_t *from, int64_t *to) {
  *from = *to = 0;
  const char *name = l2l_param_name(param);
  if (name != NULL && strcmp(name, "attn.qkv.bias") == 0) {
    int64_t d = numel(param_value(param)) / 3;
    *from = d, *to = 2 * d;
  }
}

bool rel_close(double got, double want, double tol) {
  return fabs(got - want) <= tol * fabs(want) && isfinite(got);
}

/* A refused call: a non-OK status among the accepted ones and a message naming `needle`
   (for refusals where the header leaves the status open between two codes). */
bool refused2_at(l2l_status got, l2l_status want1, l2l_status want2, const char *needle,
                 const char *file, int line, const char *expr) {
  const char *msg = l2l_last_error();
  return check_that((got == want1 || got == want2) && strstr(msg, needle) != NULL, file, line,
                    expr, "want status %d or %d with \"%s\", got %d: \"%s\"", want1, want2,
                    needle, got, msg);
}

const char *stash_name(int s) {
  return s == L2L_STASH_DEVICE ? "device" : s == L2L_STASH_HOST ? "host" : "recompute";
}
const char *inner_name(int s) {
  return s == L2L_INNER_RECOMPUTE ? "recompute" : s == L2L_INNER_KEEP ? "keep" : "swap";
}

/* ---------------------------------------------------------------- configs and relays */

l2l_relay_config adamw_config(void) {
  l2l_relay_config c;
  memset(&c, 0, sizeof c);
  l2l_relay_config_default(&c);
  c.micro_batch = 1;
  c.stash = L2L_STASH_HOST;
  c.recompute_every = 1;
  c.inner = L2L_INNER_RECOMPUTE;
  c.optimizer = (l2l_optimizer_config){.kind = L2L_OPTIMIZER_ADAMW, .lr = 1e-2f, .beta1 = 0.9f,
                                       .beta2 = 0.99f, .eps = 1e-5f, .weight_decay = 0.1f};
  c.schedule = (l2l_schedule_config){.kind = L2L_SCHEDULE_CONSTANT};
  c.clip_global_norm = 0;
  c.clip_layer_norm = 0;
  c.accumulate = 1;
  c.optimizer_threads = 2;
  c.seed = check_rand_u64();
  return c;
}

/* ---------------------------------------------------------------- comparisons */

/* Every record of the relay's model (weights after sync, and the optimizer state)
   against the plain executor's, layer by layer and record by record. */
bool compare_to_plain(l2l_relay *r, const struct model *rm, struct plain *p,
                      const char *what) {
  if (!CHECK_OK(l2l_relay_sync(r))) return false;
  if (!CHECK(rm->n == p->model.n, "%s: %d layers vs %d", what, rm->n, p->model.n)) return false;
  bool ok = true;
  for (int l = 0; l < rm->n; l++) {
    int np = l2l_layer_param_count(rm->layer[l]);
    for (int j = 0; j < np; j++) {
      l2l_param *rp = l2l_layer_param(rm->layer[l], j);
      l2l_param *pp = l2l_layer_param(p->model.layer[l], j);
      const char *name = l2l_param_name(rp);
      l2l_tensor *rv = param_value(rp), *pv = param_value(pp);
      int64_t n = numel(pv), worst = 0, nf, nt;
      noise_range(rp, &nf, &nt);
      double err = rel_err_f32(check_data(rv), check_data(pv), n, nf, nt, &worst);
      ok &= CHECK_WITHIN(err, TOL_WEIGHT, what,
                         "%s: layer %d %s: weights off by %.3g (> %.3g) at [%lld]: relay %.9g, "
                         "plain %.9g",
                         what, l, name, err, TOL_WEIGHT, (long long)worst,
                         (double)check_data(rv)[worst], (double)check_data(pv)[worst]);
      struct prec *pr = plain_rec(p, pp);
      int nstate = p->cfg.optimizer.kind == L2L_OPTIMIZER_SGD
                       ? (p->cfg.optimizer.momentum > 0 ? 1 : 0)
                       : 2;
      for (int which = 0; which < nstate; which++) {
        l2l_tensor *st = NULL;
        if (!CHECK_OK(l2l_relay_param_state(&st, r, rp, which))) {
          ok = false;
          continue;
        }
        if (pr->t == 0) {
          ok &= CHECK(st == NULL, "%s: layer %d %s: state %d exists before any update", what,
                      l, name, which);
          continue;
        }
        if (!CHECK(st != NULL && numel(st) == n, "%s: layer %d %s: state %d missing after %lld "
                   "updates", what, l, name, which, (long long)pr->t)) {
          ok = false;
          continue;
        }
        const l2l_tensor *want = which == 0 ? pr->m : pr->v;
        err = rel_err_f32(check_data(st), check_data(want), n, nf, nt, &worst);
        ok &= CHECK_WITHIN(err, TOL_STATE, what,
                           "%s: layer %d %s: state %d off by %.3g (> %.3g) at [%lld]: relay "
                           "%.9g, plain %.9g",
                           what, l, name, which, err, TOL_STATE, (long long)worst,
                           (double)check_data(st)[worst], (double)check_data(want)[worst]);
      }
    }
  }
  return ok;
}

static bool in_snapshot(const struct snapshot *s, const l2l_param *param) {
  for (int i = 0; i < s->n; i++)
    if (s->r[i].param == param) return true;
  return false;
}

/* Records of layers [from, to) of the relay (every record once). */
void snapshot_take(struct snapshot *s, l2l_relay *r, int from, int to) {
  memset(s, 0, sizeof *s);
  CHECK_OK(l2l_relay_sync(r));
  for (int l = from; l < to; l++) {
    l2l_layer *layer = l2l_relay_layer(r, l);
    for (int j = 0; j < l2l_layer_param_count(layer); j++) {
      l2l_param *param = l2l_layer_param(layer, j);
      if (in_snapshot(s, param)) continue;
      struct rec_snap *e = &s->r[s->n++];
      e->param = param;
      e->layer = l, e->index = j;
      e->value = snapshot(param_value(param));
      e->bytes = tensor_bytes(param_value(param));
      for (int w = 0; w < 2; w++) {
        l2l_tensor *st = NULL;
        CHECK_OK(l2l_relay_param_state(&st, r, param, w));
        e->state[w] = st ? snapshot(st) : NULL;
      }
    }
  }
}

void snapshot_free(struct snapshot *s) {
  for (int i = 0; i < s->n; i++) {
    free(s->r[i].value);
    free(s->r[i].state[0]);
    free(s->r[i].state[1]);
  }
  s->n = 0;
}

static bool record_in_relay(l2l_relay *r, const l2l_param *param) {
  for (int l = 0; l < l2l_relay_layer_count(r); l++) {
    l2l_layer *layer = l2l_relay_layer(r, l);
    for (int j = 0; j < l2l_layer_param_count(layer); j++)
      if (l2l_layer_param(layer, j) == param) return true;
  }
  return false;
}

/* Whether record e is bit for bit as snapshotted: its value, and (while it is in the
   relay) both optimizer states, present or absent alike. */
static bool record_same(l2l_relay *r, const struct rec_snap *e) {
  if (memcmp(l2l_tensor_data(param_value(e->param)), e->value, e->bytes) != 0) return false;
  if (!record_in_relay(r, e->param)) return true;
  for (int w = 0; w < 2; w++) {
    l2l_tensor *st = NULL;
    if (l2l_relay_param_state(&st, r, e->param, w) != L2L_OK) return false;
    if ((st == NULL) != (e->state[w] == NULL)) return false;
    if (st && memcmp(l2l_tensor_data(st), e->state[w], e->bytes) != 0) return false;
  }
  return true;
}

/* Every snapshotted record is bit for bit as it was (a check per record that is not). */
bool check_unchanged(l2l_relay *r, const struct snapshot *s, const char *what) {
  CHECK_OK(l2l_relay_sync(r));
  bool ok = true;
  for (int i = 0; i < s->n; i++)
    ok &= CHECK(record_same(r, &s->r[i]),
                "%s: record '%s' (layer %d at the snapshot) changed its value or optimizer "
                "state", what, l2l_param_name(s->r[i].param), s->r[i].layer);
  return ok;
}

/* Every snapshotted record's value changed (it trained). */
bool check_all_changed(l2l_relay *r, const struct snapshot *s, const char *what) {
  CHECK_OK(l2l_relay_sync(r));
  bool ok = true;
  for (int i = 0; i < s->n; i++)
    ok &= CHECK(memcmp(l2l_tensor_data(param_value(s->r[i].param)), s->r[i].value,
                       s->r[i].bytes) != 0,
                "%s: record '%s' (layer %d) did not change", what,
                l2l_param_name(s->r[i].param), s->r[i].layer);
  return ok;
}

/* ---------------------------------------------------------------- models and minibatches */

void make_batches(struct data *batches, int steps, const struct shape *g, int64_t B,
                  int pad, double mask_frac) {
  for (int k = 0; k < steps; k++) data_new(&batches[k], g, B, g->S, pad, mask_frac);
}

void free_batches(struct data *batches, int steps) {
  for (int k = 0; k < steps; k++) data_free(&batches[k]);
}

/* A plain stack for memory and timing: D 64, H 4, F 128, V 50, S 16, no dropout, an
   untied LM head. */
struct shape stack_shape(int blocks) {
  struct shape g = {.D = 64, .H = 4, .F = 128, .V = 50, .S = 16, .blocks = blocks, .post_ln = 0,
                    .causal = 1, .type_vocab = 0, .head = L2L_LAYER_LM_HEAD, .tie = 0,
                    .dropout = 0, .attn_dropout = 0, .frugal_block = -1};
  return g;
}

/* Boundaries alternate device / host / recompute, layers' inner policy alternates
   recompute / keep / swap. */
void mixed_policies(l2l_relay *r) {
  int n = l2l_relay_layer_count(r);
  for (int b = 1; b < n; b++) CHECK_OK(l2l_relay_set_stash(r, b, (l2l_stash_policy)(b % 3)));
  for (int l = 0; l < n; l++) CHECK_OK(l2l_relay_set_inner(r, l, (l2l_inner_policy)((l + 1) % 3)));
}
