/* SPDX-License-Identifier: MIT */
/* relay_rig.h — what the relay's tests (test_relay*.c) share: their tolerances, each with
 * why it is what it is; a relay's usual config and calls; every record of a relay against
 * the plain executor's (compare_to_plain); snapshots of records, to show that something
 * left them alone or changed them all; minibatches; relay_rig.c defines them.
 *
 * Purpose: one statement of what the relay is held to against plain training, for every
 * file that tests it; test_relay.c says how they test.
 * Must never: take an expected value from the relay or the EPS.
 */
#ifndef L2L_RELAY_RIG_H
#define L2L_RELAY_RIG_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "reference.h"
#include "relay/relay.h"

/* ---------------------------------------------------------------- tolerances */

/* The relay against the plain executor (spec/c/plain.c) split into the relay's own
   micro-batches: both run the same f32 kernels in the same order (each layer's forward
   over the micro-batches, backward in reverse, each visit's gradient added into the
   accumulator with the EPS's axpy, the update with the EPS's optimizer kernels and the
   gradient scale passed in as the EPS passes it), so a correct relay gives the plain
   executor's bits: measured, 0 difference in every weight and state of every comparison
   here over 600 seeds (2026-11-26). The one freedom left is a double sum of squares
   grouped otherwise (clipping norms, LAMB's trust ratio: ~1e-16 of it), which can round
   an f32 scale one ulp the other way; that moves one update by 2^-24 of itself, which SGD
   and LAMB pass on linearly, over at most 8 steps under 8 x 6e-8 = 5e-7 of a record's
   scale: TOL_WEIGHT and TOL_STATE are 1e-6. A wrong dropout mask, a missed or doubled
   micro-batch, a stale weight or a wrong scale moves records by 1e-3 or more.
   Whether splitting a minibatch changes the arithmetic itself (plain whole against plain
   split) is the layers' part, tested once by plain_training_is_split_invariant on one
   step's gradients (see TOL_GRAD_SPLIT): after several AdamW steps, two correct
   executions that sum in other orders drift apart in the odd entry whose gradient
   nearly cancels (AdamW moves it by lr g / (|g| + eps) whatever |g| is), by up to a few
   percent of lr (measured over 2,000 seeds), with no bound arithmetic can give, so
   weights after several steps are compared only with the same split. Losses are means
   over every target: drifting entries move them by ~1e-7 (over 600 seeds, 6,000 losses
   of five steps: median 3e-8, 99.9th percentile 1.2e-6, worst 2.6e-6), so split and
   whole runs compare losses at TOL_LOSS; a wrong mask moved the first step's loss from
   6.24 to 6.56. */
#define TOL_LOSS 2e-5     /* relative, per step: split against whole minibatches */
#define TOL_WEIGHT 1e-6   /* relative to the record's RMS: the relay against the plain
                             executor split alike */
#define TOL_STATE 1e-6    /* m and v, relative to the record's RMS */
/* stats.grad_norm against the plain norm (one sum of squares in double of f32 values). */
#define TOL_NORM 1e-5

enum { MAX_STEPS = 8 };

/* ---------------------------------------------------------------- small helpers */

/* max_i |got_i - want_i| / (|want_i| + floor) over i outside [skip_from, skip_to), with
   floor = the RMS of those want_i (at least 1e-30): relative to the tensor's scale, so
   tiny entries do not dominate. Entries inside the range need only be finite in got.
   Writes the worst index. */
double rel_err_f32(const float *got, const float *want, int64_t n, int64_t skip_from,
                   int64_t skip_to, int64_t *worst);
/* [from, to): the entries of a record whose exact gradient is zero (the key bias), compared
   for finiteness only (relay_rig.c says why). */
void noise_range(const l2l_param *param, int64_t *from, int64_t *to);
/* |got - want| <= tol |want|, and got finite. */
bool rel_close(double got, double want, double tol);
/* A refused call: a non-OK status among the accepted ones and a message naming `needle`
   (for refusals where the header leaves the status open between two codes). */
bool refused2_at(l2l_status got, l2l_status want1, l2l_status want2, const char *needle,
                 const char *file, int line, const char *expr);
#define CHECK_FAILS2(call, s1, s2, needle) \
  refused2_at((call), (s1), (s2), (needle), __FILE__, __LINE__, #call)
const char *stash_name(int s);
const char *inner_name(int s);

static inline l2l_relay_batch relay_batch(const struct data *d, const uint8_t *skip) {
  l2l_relay_batch b = {d->tokens, d->targets, d->types, d->key_mask, skip};
  return b;
}

/* ---------------------------------------------------------------- configs and relays */

/* The tests' usual config: AdamW (lr 1e-2, betas 0.9 / 0.99, eps 1e-5, weight decay 0.1),
   micro-batch 1, host stash, recompute, no clipping, two optimizer threads, a fresh seed. */
l2l_relay_config adamw_config(void);

static inline l2l_relay *relay_new(struct model *m, const l2l_relay_config *c) {
  l2l_relay *r = NULL;
  if (!CHECK_OK(l2l_relay_new(&r, m->layer, m->n, c))) return NULL;
  return r;
}

static inline l2l_relay_stats relay_stats(const l2l_relay *r) {
  l2l_relay_stats s;
  memset(&s, 0, sizeof s);
  CHECK_OK(l2l_relay_get_stats(&s, r));
  return s;
}

static inline bool relay_step(double *loss, l2l_relay *r, const struct data *d, const uint8_t *skip) {
  l2l_relay_batch b = relay_batch(d, skip);
  *loss = NAN;
  return CHECK_OK(l2l_relay_step(loss, r, &b));
}


/* Events of the last step, copied out (caller frees). */
static inline l2l_relay_event *relay_events(const l2l_relay *r, int64_t *count) {
  l2l_relay_stats s = relay_stats(r);
  *count = s.events;
  l2l_relay_event *ev = xmalloc((size_t)(s.events > 0 ? s.events : 1) * sizeof *ev);
  if (s.events > 0) CHECK_OK(l2l_relay_events(ev, r, 0, s.events));
  return ev;
}

/* ---------------------------------------------------------------- comparisons */

/* Every record of the relay's model (weights after sync, and the optimizer state)
   against the plain executor's, layer by layer and record by record. */
bool compare_to_plain(l2l_relay *r, const struct model *rm, struct plain *p, const char *what);

/* The bytes of every record of a relay (values, and both optimizer states), to show
   later that something left them alone. */
struct rec_snap {
  const l2l_param *param;
  int layer, index;
  void *value;
  void *state[2];
  size_t bytes;
};
struct snapshot {
  int n;
  struct rec_snap r[PLAIN_MAX_RECORDS];
};

/* Records of layers [from, to) of the relay (every record once). */
void snapshot_take(struct snapshot *s, l2l_relay *r, int from, int to);
void snapshot_free(struct snapshot *s);
/* Every snapshotted record is bit for bit as it was (a check per record that is not). */
bool check_unchanged(l2l_relay *r, const struct snapshot *s, const char *what);
/* Every snapshotted record's value changed (it trained). */
bool check_all_changed(l2l_relay *r, const struct snapshot *s, const char *what);

/* ---------------------------------------------------------------- models and minibatches */

void make_batches(struct data *batches, int steps, const struct shape *g, int64_t B, int pad,
                  double mask_frac);
void free_batches(struct data *batches, int steps);
/* A plain stack for memory and timing: D 64, H 4, F 128, V 50, S 16, no dropout, an
   untied LM head. */
struct shape stack_shape(int blocks);
/* Boundaries alternate device / host / recompute, layers' inner policy alternates
   recompute / keep / swap. */
void mixed_policies(l2l_relay *r);

#endif /* L2L_RELAY_RIG_H */
