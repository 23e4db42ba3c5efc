/* SPDX-License-Identifier: MIT */
/* optim.c — the EPS's optimizers as a table (SGD with momentum, AdamW, LAMB): their state
 * counts, config checks and the chunk of an update each runs; the checks of schedule
 * configs, and l2l_schedule_lr.
 *
 * Purpose: what the EPS needs to know of an optimizer beyond its arithmetic: how many
 * state arrays and waves it takes, which array is a second moment, how a chunk of a
 * record's update calls the host kernels. The kernels themselves are the backend's
 * (backend/optim_kernels.c): the CPU backend runs the same ones on records placed on the
 * device, so both placements give the same bits.
 * The maths is stated once, in l2l.h ("optimizers").
 * Must never: allocate, lock or spawn threads in a chunk (the EPS runs chunks on its own
 * workers), or write the gradient (grad_scale is applied on the fly).
 */
#include <math.h>

#include "eps.h"

/* ---------------------------------------------------------------- config checks */

/* The rules of an optimizer beyond its fields' own (the table's rows hold those); their
   messages name the public check. */
static const char CHECKER[] = "optimizer_check";

static l2l_status sgd_check(const l2l_optimizer_config *c) {
  if (c->nesterov && c->momentum == 0.0f)
    return core_fail_in(CHECKER, L2L_ERR_INVALID,
                        "optimizer nesterov = 1 needs momentum > 0, got momentum %g",
                        (double)c->momentum);
  return L2L_OK;
}

static l2l_status adam_check(const l2l_optimizer_config *c) {
  (void)c;   /* AdamW's and LAMB's bounds are all their rows' */
  return L2L_OK;
}

/* The table's checks of each field (core/options.def), then the optimizer's own rules. */
l2l_status optimizer_check(const l2l_optimizer_config *c) {
  if (c == NULL) return FAIL(L2L_ERR_INVALID, "optimizer config is NULL");
  TRY(options_check(L2L_OPTION_OPTIMIZER, c, c->kind, __func__, "optimizer "));
  return optimizer_ops(c->kind)->check(c);
}

l2l_status schedule_check(const l2l_schedule_config *s) {
  if (s == NULL) return FAIL(L2L_ERR_INVALID, "schedule config is NULL");
  TRY(options_check(L2L_OPTION_SCHEDULE, s, -1, __func__, "schedule "));
  if (s->kind != L2L_SCHEDULE_CONSTANT && s->total <= s->warmup)
    return FAIL(L2L_ERR_INVALID, "schedule total must be > warmup (%lld) for %s, got %lld",
                (long long)s->warmup, s->kind == L2L_SCHEDULE_COSINE ? "cosine" : "linear",
                (long long)s->total);
  return L2L_OK;
}

int optim_state_count(const l2l_optimizer_config *c) {
  const struct optimizer_ops *ops = c != NULL ? optimizer_ops(c->kind) : NULL;
  return ops != NULL ? ops->state_count(c) : -1; /* unknown kind: the config was not checked */
}

l2l_status l2l_optimizer_state_arrays(int *out, const l2l_optimizer_config *config) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (config == NULL) return FAIL(L2L_ERR_INVALID, "config is NULL");
  TRY_AS(optimizer_check(config));
  *out = optim_state_count(config);
  return L2L_OK;
}

l2l_status l2l_state_array_bytes(uint64_t *out, l2l_state_precision state, int64_t n) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (state != L2L_STATE_F32 && state != L2L_STATE_BF16 && state != L2L_STATE_8BIT)
    return FAIL(L2L_ERR_INVALID, "state %d is unknown (0 f32, 1 bf16, 2 8bit)", (int)state);
  if (n < 0 || n > INT64_MAX / 8)
    return FAIL(L2L_ERR_INVALID, "n must be in [0, 2^60), got %lld", (long long)n);
  *out = host_state_bytes(state, n);
  return L2L_OK;
}

/* ---------------------------------------------------------------- schedules */

l2l_status l2l_schedule_lr(double *out, const l2l_schedule_config *schedule, double base_lr,
                           int64_t t) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (t < 1) return FAIL(L2L_ERR_INVALID, "t must be >= 1 (updates count from 1), got %lld",
                         (long long)t);
  if (!isfinite(base_lr) || base_lr < 0)
    return FAIL(L2L_ERR_INVALID, "base_lr must be finite and >= 0, got %g", base_lr);
  TRY_AS(schedule_check(schedule));
  const l2l_schedule_config *s = schedule;
  double factor, final = (double)s->final_ratio;
  if (t <= s->warmup) {
    factor = (double)t / (double)s->warmup;
  } else if (s->kind == L2L_SCHEDULE_CONSTANT) {
    factor = 1.0;
  } else if (t >= s->total) {
    factor = final; /* the curves end exactly there, and stay */
  } else {
    double frac = (double)(t - s->warmup) / (double)(s->total - s->warmup);
    double shape = s->kind == L2L_SCHEDULE_COSINE ? 0.5 * (1.0 + cos(M_PI * frac)) : 1.0 - frac;
    factor = final + (1.0 - final) * shape;
  }
  *out = base_lr * factor;
  return L2L_OK;
}

/* ---------------------------------------------------------------- the table */

static int sgd_state_count(const l2l_optimizer_config *c) { return c->momentum > 0.0f ? 1 : 0; }
static int adam_state_count(const l2l_optimizer_config *c) {
  (void)c;
  return 2;
}

static void sgd_chunk(const struct optim_chunk *c) {
  optim_sgd(c->p, c->state[0], c->grad, c->n, c->h);
}

static void adamw_chunk(const struct optim_chunk *c) {
  optim_adamw(c->p, c->state[0], c->state[1], c->grad, c->n, c->h);
}

/* Wave 0: the moments and the norms of p and r; wave 1: the step with the trust ratio of
   the whole record's norms. */
static void lamb_chunk(const struct optim_chunk *c) {
  if (c->wave == 0)
    optim_lamb_moments(c->state[0], c->state[1], c->p, c->grad, c->n, c->h, c->sums);
  else
    optim_lamb_apply(c->p, c->state[0], c->state[1], c->n, c->h,
                     optim_lamb_trust(c->record_sums));
}

static const struct optimizer_ops optimizers[] = {
    [L2L_OPTIMIZER_SGD] = {"sgd", 1, sgd_state_count, sgd_check, sgd_chunk},
    [L2L_OPTIMIZER_ADAMW] = {"adamw", 1, adam_state_count, adam_check, adamw_chunk},
    [L2L_OPTIMIZER_LAMB] = {"lamb", 2, adam_state_count, adam_check, lamb_chunk},
};

const struct optimizer_ops *optimizer_ops(l2l_optimizer_kind kind) {
  if ((int)kind < 0 || (size_t)kind >= sizeof optimizers / sizeof optimizers[0]) return NULL;
  return optimizers[kind].name != NULL ? &optimizers[kind] : NULL;
}
