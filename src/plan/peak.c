/* SPDX-License-Identifier: MIT */
/* peak.c — the device peak of one step, replayed allocation by allocation.
 *
 * Purpose: the planner must know, before a step runs, whether a policy fits a device
 * budget: a step that overruns fails half-way, after some layers were updated. The relay's
 * compute thread makes and frees every device tensor in the step's visit order
 * (src/order/walk.h), so executing the same walk with counted blocks and the layers'
 * memory statements gives the peak exactly: parameter and gradient slots for the whole
 * step; per visit and micro-batch the input (and the next one prefetched), the
 * micro-batch's ids, the output, the call's saved and work arenas; what waits between
 * visits (device boundaries read again, rebuilt stretches, gradients handed down, kept
 * saved states and the inputs and outputs they refer to); host-stashed outputs until the
 * copy thread has them (at most two in flight). Swap is the one move made on a copy thread:
 * its bytes are counted from when a swap-out is queued to the end of the forward visit, and
 * a swap-in from when it is queued, which bounds every timing.
 * Every allocation counts as its size rounded up to L2L_ALIGN, as the pool counts it.
 * A step of many micro-batches is not replayed whole: every micro-batch but the first
 * three and the last two does exactly what its neighbours do, so the bytes in use, and
 * the most of them in each stretch of a visit (its first micro-batches, its middle ones,
 * its last ones), are affine in the number of middle micro-batches. Three short replays
 * (1, 2 and 3 middle micro-batches) give each stretch's line, checked on the third, and
 * the peak is the highest line at the real count: exact, in time and memory independent
 * of the batch (a replay of 2^24 micro-batches took minutes and gigabytes). A check that
 * fails falls back to the whole replay.
 * Must never: read the relay's state or decide an order of its own (the order's walk
 * is the order; a spec compares the replay with the pool's measured peak on random models
 * and policies, which also checks what the acts count).
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* ---------------------------------------------------------------- counted blocks */

/* A device allocation of the replay; refs > 1 when a saved state refers to it too. */
struct block {
  uint64_t bytes;
  int refs;
  struct block *next_free;
};

/* Blocks come from chunks of the replay's own, reused through a free list: a replay makes
   and drops a few blocks per micro-batch and visit, and the search replays thousands of
   times. */
enum { CHUNK_BLOCKS = 1024 };
struct chunk {
  struct chunk *next;
  struct block blocks[CHUNK_BLOCKS];
};

struct replay {
  const struct plan_chain *c;
  int64_t mb, nmb, last;     /* micro-batches replayed; the last one's rows */
  uint64_t now, peak;
  /* The most in use per stretch (see the top: 0 before the visits, then three per visit),
     NULL when not asked; `stretch` is where the replay is. */
  uint64_t *stretch_peak;
  int stretch, visit_base;
  bool failed;
  /* memory statements per layer for a full and for the last micro-batch */
  const l2l_layer_memory *mem_full, *mem_last;
  struct chunk *chunks;
  struct block *free_blocks;
  int64_t head_width;   /* targets and losses per sample: S for an LM head, 1 for a classifier */
};

static struct block *take(struct replay *r, uint64_t bytes) {
  if (bytes == 0) return NULL;
  if (r->free_blocks == NULL) {
    struct chunk *ch = malloc(sizeof *ch);
    if (ch == NULL) {
      r->failed = true;
      return NULL;
    }
    ch->next = r->chunks;
    r->chunks = ch;
    for (int i = 0; i < CHUNK_BLOCKS; i++) {
      ch->blocks[i].next_free = r->free_blocks;
      r->free_blocks = &ch->blocks[i];
    }
  }
  struct block *b = r->free_blocks;
  r->free_blocks = b->next_free;
  b->bytes = pool_accounted(bytes);
  b->refs = 1;
  r->now += b->bytes;
  if (r->now > r->peak) r->peak = r->now;
  if (r->stretch_peak && r->now > r->stretch_peak[r->stretch]) r->stretch_peak[r->stretch] = r->now;
  return b;
}

static void hold(struct block *b) {
  if (b) b->refs++;
}

static void drop(struct replay *r, struct block *b) {
  if (b == NULL || --b->refs > 0) return;
  r->now -= b->bytes;
  b->next_free = r->free_blocks;
  r->free_blocks = b;
}

/* ---------------------------------------------------------------- the step's objects */

/* A boundary activation (or the gradient crossing it) of one micro-batch: on the device,
   on the host, or both (a host stash brought back). */
struct act {
  struct block *dev;
  bool host;
};

/* A kept saved state: its arena and the x / y it refers to; `away` while swapped out. */
struct saved {
  struct block *arena, *input, *output;
  uint64_t bytes[3];   /* arena, input, output: what a swap-in brings back */
  bool away;
};

static int64_t rows_of(const struct replay *r, int64_t u) { return u + 1 == r->nmb ? r->last : r->mb; }

/* The micro-batches at a visit's start and end that differ from the middle ones: the
   first three (the first is brought in ahead; the queue of host stash-outs fills over
   two), the last two (the last may be smaller, and its predecessor fetches it ahead). */
enum { FIRST_SPECIAL = 3, LAST_SPECIAL = 2, STRETCHES = 3 };

/* Micro-batch u's stretch of the visit being replayed. */
static void stretch_at(struct replay *r, int64_t u) {
  r->stretch = r->visit_base + (u < FIRST_SPECIAL ? 0 : u >= r->nmb - LAST_SPECIAL ? 2 : 1);
}

static const l2l_layer_memory *mem_of(const struct replay *r, int k, int64_t u) {
  return u + 1 == r->nmb ? &r->mem_last[k] : &r->mem_full[k];
}

static uint64_t act_bytes(const struct replay *r, int64_t u) {
  return (uint64_t)(rows_of(r, u) * r->c->seq * r->c->dim) * sizeof(float);
}

static struct block *new_act(struct replay *r, int64_t u) { return take(r, act_bytes(r, u)); }

static void prefetch(struct replay *r, struct act *a, int64_t u) {
  if (a->dev == NULL && a->host) a->dev = new_act(r, u);
}

static void act_free(struct replay *r, struct act *a) {
  drop(r, a->dev);
  a->dev = NULL;
  a->host = false;
}

static void release_device(struct replay *r, struct act *a) {
  drop(r, a->dev);
  a->dev = NULL;
}

static void saved_free(struct replay *r, struct saved *s) {
  drop(r, s->arena);
  drop(r, s->input);
  drop(r, s->output);
  memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- stash-outs */

/* Host-stashed outputs whose copy may still be reading them: at most two (acts.c). */
struct outs {
  struct block *q[2];
};

static void throttle(struct replay *r, struct outs *o, int keep) {
  while ((o->q[0] != NULL) + (o->q[1] != NULL) > keep) {
    drop(r, o->q[0]);
    o->q[0] = o->q[1];
    o->q[1] = NULL;
  }
}

/* As the relay's (acts.c): a copy that keeps its device block is waited for when the
   block is released, so the block counts until then, as the act's own. */
static void stash_out(struct replay *r, struct outs *o, struct act *a, enum order_out how) {
  if (how == ORDER_OUT_DEVICE) return;
  a->host = true;
  if (how == ORDER_OUT_BOTH) return;
  throttle(r, o, 1);
  o->q[o->q[0] ? 1 : 0] = a->dev;
  a->dev = NULL;
}

/* ---------------------------------------------------------------- a micro-batch's inputs */

/* The micro-batch's rows of the batch fields the layer's role reads (acts.c): tokens
   (and types) for the input, targets for a head, the key mask for a body layer. */
static void inputs_take(struct replay *r, int k, int64_t u, struct block **ids) {
  const struct plan_chain *c = r->c;
  int64_t rows = rows_of(r, u), S = c->seq;
  ids[0] = ids[1] = NULL;
  switch (c->layers[k].role) {
    case L2L_ROLE_INPUT:
      ids[0] = take(r, (uint64_t)(rows * S) * 4);
      if (c->token_types) ids[1] = take(r, (uint64_t)(rows * S) * 4);
      break;
    case L2L_ROLE_HEAD:
      ids[0] = take(r, (uint64_t)(rows * r->head_width) * 4);
      break;
    default:
      if (c->key_mask) ids[0] = take(r, (uint64_t)(rows * S));
  }
}

static void inputs_drop(struct replay *r, struct block **ids) {
  drop(r, ids[0]);
  drop(r, ids[1]);
}

/* ---------------------------------------------------------------- layer calls */

/* A forward call (call.c): the saved arena, the references a kept state holds, the work
   arena for the call's length. Returns the state when kept. */
static void forward_call(struct replay *r, struct saved *out, const l2l_layer_memory *m,
                         bool keep, struct block *x, struct block *y) {
  struct saved s = {.arena = take(r, m->saved)};
  s.bytes[0] = m->saved;
  if (keep && m->input_kept && x) {
    hold(x);
    s.input = x;
    s.bytes[1] = x->bytes;
  }
  if (keep && m->output_kept && y) {
    hold(y);
    s.output = y;
    s.bytes[2] = y->bytes;
  }
  drop(r, take(r, m->work_forward));
  if (keep && out) *out = s;
  else saved_free(r, &s);
}

/* ---------------------------------------------------------------- the schedule's acts */

/* The replay's state of a step: what the relay's step holds, as counted blocks. */
struct step {
  struct replay *r;
  int L;
  struct act **x, **g;      /* [L + 1][nmb] */
  struct act scratch;
  struct saved **saved;     /* [L][nmb] */
  struct block *ids[2];     /* the micro-batch's batch fields */
  struct outs outs;
};

static struct act *act_at(struct step *s, enum order_act a, int k, int64_t u) {
  return a == ORDER_X ? &s->x[k][u] : a == ORDER_G ? &s->g[k][u] : &s->scratch;
}

/* The stretches (see the top): a visit's first three, of its micro-batches. */
static void visit_start(void *ctx, int i) {
  struct replay *r = ((struct step *)ctx)->r;
  r->visit_base = 1 + STRETCHES * i;
  r->stretch = r->visit_base;
}

static void micro_batch(void *ctx, int64_t u) { stretch_at(((struct step *)ctx)->r, u); }

/* The slots live through the step: nothing to bind. */
static l2l_status visit_bind(void *ctx, int i, const struct order_visit *v, bool grads) {
  (void)ctx, (void)i, (void)v, (void)grads;
  return L2L_OK;
}

static l2l_status on_device(void *ctx, enum order_act a, int k, int64_t u) {
  struct step *s = ctx;
  prefetch(s->r, act_at(s, a, k, u), u);
  return L2L_OK;
}

static l2l_status make(void *ctx, enum order_act a, int k, int64_t u) {
  struct step *s = ctx;
  act_at(s, a, k, u)->dev = new_act(s->r, u);
  return L2L_OK;
}

static void free_act(void *ctx, enum order_act a, int k, int64_t u) {
  struct step *s = ctx;
  act_free(s->r, act_at(s, a, k, u));
}

static l2l_status release(void *ctx, enum order_act a, int k, int64_t u) {
  struct step *s = ctx;
  release_device(s->r, act_at(s, a, k, u));
  return L2L_OK;
}

static l2l_status stash(void *ctx, enum order_act a, int k, int64_t u, enum order_out how) {
  struct step *s = ctx;
  stash_out(s->r, &s->outs, act_at(s, a, k, u), how);
  return L2L_OK;
}

static l2l_status retire(void *ctx, int keep) {
  struct step *s = ctx;
  throttle(s->r, &s->outs, keep);
  return L2L_OK;
}

static l2l_status inputs(void *ctx, int k, int64_t u, bool training) {
  struct step *s = ctx;
  (void)training;
  inputs_take(s->r, k, u, s->ids);
  return L2L_OK;
}

static void inputs_free(void *ctx) {
  struct step *s = ctx;
  inputs_drop(s->r, s->ids);
  s->ids[0] = s->ids[1] = NULL;
}

static l2l_status forward(void *ctx, int k, int64_t u, bool keep, bool rebuild) {
  struct step *s = ctx;
  (void)rebuild;
  forward_call(s->r, &s->saved[k][u], mem_of(s->r, k, u), keep, k > 0 ? s->x[k][u].dev : NULL,
               s->x[k + 1][u].dev);
  return L2L_OK;
}

static l2l_status head(void *ctx, int k, int64_t u, bool backward) {
  struct step *s = ctx;
  struct replay *r = s->r;
  struct block *losses = take(r, (uint64_t)(rows_of(r, u) * r->head_width) * sizeof(float));
  if (backward) s->g[k][u].dev = new_act(r, u);
  const l2l_layer_memory *m = mem_of(r, k, u);
  struct saved sv = {0};
  forward_call(r, &sv, m, backward, s->x[k][u].dev, NULL);
  if (backward) drop(r, take(r, m->work_backward));
  saved_free(r, &sv);
  drop(r, losses);
  return L2L_OK;
}

static l2l_status backward(void *ctx, int k, int64_t u, bool recompute) {
  struct step *s = ctx;
  const l2l_layer_memory *m = mem_of(s->r, k, u);
  if (recompute)
    forward_call(s->r, &s->saved[k][u], m, true, k > 0 ? s->x[k][u].dev : NULL, s->scratch.dev);
  drop(s->r, take(s->r, m->work_backward));
  return L2L_OK;
}

static void saved_drop(void *ctx, int k, int64_t u) {
  struct step *s = ctx;
  saved_free(s->r, &s->saved[k][u]);
}

/* Swap runs on the copy threads: a swapped-out state's bytes count until the visit's end
   (when the relay has waited for every swap-out), a swap-in's from when it is queued. */
static l2l_status swap_out(void *ctx, int k, int64_t u) {
  struct step *s = ctx;
  s->saved[k][u].away = true;
  return L2L_OK;
}

static l2l_status swap_out_done(void *ctx, int k, int64_t u) {
  struct step *s = ctx;
  struct saved *sv = &s->saved[k][u];
  uint64_t bytes[3] = {sv->bytes[0], sv->bytes[1], sv->bytes[2]};
  saved_free(s->r, sv);
  memcpy(sv->bytes, bytes, sizeof bytes);
  sv->away = true;
  return L2L_OK;
}

static l2l_status swap_in(void *ctx, int k, int64_t u) {
  struct step *s = ctx;
  struct saved *sv = &s->saved[k][u];
  if (!sv->away) return L2L_OK;
  sv->away = false;
  sv->arena = take(s->r, sv->bytes[0]);
  sv->input = take(s->r, sv->bytes[1]);
  sv->output = take(s->r, sv->bytes[2]);
  return L2L_OK;
}

static l2l_status swap_in_wait(void *ctx, int k, int64_t u) {
  (void)ctx, (void)k, (void)u;
  return L2L_OK;
}

static l2l_status prefetch_act(void *ctx, enum order_act a, int k, int64_t u) {
  return on_device(ctx, a, k, u);   /* the replay counts a copy's bytes from its start */
}

static l2l_status prefetch_ahead(void *ctx, enum order_act a, int k) {
  return on_device(ctx, a, k, 0);
}

static const struct order_ops replay_acts = {
    .visit_start = visit_start, .micro_batch = micro_batch, .visit_bind = visit_bind,
    .visit_end = visit_bind, .prefetch = prefetch_act, .prefetch_ahead = prefetch_ahead,
    .on_device = on_device, .make = make,
    .free = free_act, .release_device = release, .stash_out = stash, .throttle = retire,
    .inputs = inputs, .inputs_free = inputs_free, .forward = forward, .head = head,
    .backward = backward, .saved_free = saved_drop, .swap_out = swap_out,
    .swap_out_wait = swap_out_done, .swap_in = swap_in, .swap_in_wait = swap_in_wait,
};

/* ---------------------------------------------------------------- the step */

l2l_status plan_schedule(struct order *sc, const struct plan_chain *c) {
  TRY(order_new(sc, c->L, !c->evaluation));
  for (int k = 0; k < c->L; k++)
    sc->layers[k] = (struct order_layer){c->layers[k].layer, c->layers[k].frozen,
                                         c->layers[k].inner, c->layers[k].stash,
                                         c->layers[k].on_device};
  order_build(sc);
  return L2L_OK;
}

/* The memory statements and slot sizes a replay of sc reads, for micro-batch mb (arrays
   NULL when out of memory). */
static void memo_fill(struct plan_memo *m, const struct plan_chain *c, const struct order *sc,
                      int64_t mb) {
  int L = c->L;
  int64_t nmb = (c->batch + mb - 1) / mb, last = c->batch - (nmb - 1) * mb;
  m->micro_batch = mb;
  m->evaluation = c->evaluation;
  for (int i = 0; i < 2; i++) {
    free(m->mem[i]);
    m->mem[i] = calloc((size_t)L, sizeof *m->mem[i]);
  }
  for (int k = 0; m->mem[0] && m->mem[1] && k < L; k++) {
    void (*statement)(l2l_layer_memory *, const l2l_layer *, int64_t, int64_t, l2l_dtype, bool) =
        c->any_weights ? layer_memory_bound : layer_memory_in;
    statement(&m->mem[0][k], c->layers[k].layer, mb, c->seq, c->precision, !c->evaluation);
    statement(&m->mem[1][k], c->layers[k].layer, last, c->seq, c->precision, !c->evaluation);
  }
  for (int i = 0; i < 3; i++)
    m->slots[i] = order_slot_size(sc, (enum order_slot_content)i, c->precision,
                                  c->grad_precision);
}

l2l_status plan_chain_memo(struct plan_chain *c) {
  if (c->memo == NULL && (c->memo = calloc(1, sizeof *c->memo)) == NULL)
    return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  int64_t mb = c->micro_batch < c->batch ? c->micro_batch : c->batch;
  struct order sc;
  l2l_status status = plan_schedule(&sc, c);
  if (status == L2L_OK) memo_fill(c->memo, c, &sc, mb);
  order_free(&sc);
  TRY(status);
  if (c->memo->mem[0] == NULL || c->memo->mem[1] == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  return L2L_OK;
}

void plan_memo_free(struct plan_chain *c) {
  if (c->memo == NULL) return;
  free(c->memo->mem[0]);
  free(c->memo->mem[1]);
  free(c->memo);
  c->memo = NULL;
}

/* A replay of `nmb` micro-batches of mb rows, the last of `last` rows, by the memory
   statements and slot sizes of `memo`; replay_end frees its blocks. */
static struct replay replay_begin(const struct plan_chain *c, const struct plan_memo *memo,
                                  int64_t mb, int64_t nmb, int64_t last) {
  l2l_layer_config head;
  l2l_layer_get_config(&head, c->layers[c->L - 1].layer);
  return (struct replay){.c = c, .mb = mb, .nmb = nmb, .last = last,
                         .head_width = head.kind == L2L_LAYER_CLASSIFIER ? 1 : c->seq,
                         .mem_full = memo->mem[0], .mem_last = memo->mem[1]};
}

static void replay_end(struct replay *r) {
  while (r->chunks) {
    struct chunk *next = r->chunks->next;
    free(r->chunks);
    r->chunks = next;
  }
}

/* The slots, which live through the step (the relay's slots.c): parameters, gradients,
   16-bit gradients going out. */
static void slots_take(struct replay *r, struct block *slots[3], const struct plan_memo *memo) {
  const struct plan_chain *c = r->c;
  slots[0] = take(r, memo->slots[ORDER_SLOT_VALUES] * (uint64_t)c->param_slots);
  slots[1] = c->evaluation ? NULL : take(r, 2 * memo->slots[ORDER_SLOT_GRADS]);
  slots[2] = c->grad_precision != L2L_F32 && !c->evaluation
                 ? take(r, 2 * memo->slots[ORDER_SLOT_GRADS_OUT])
                 : NULL;
}

/* One replay of a step of `nmb` micro-batches of mb rows, the last of `last` rows: its
   peak, and each stretch's into stretch_peak (NULL: not asked). Flattened: the walk's
   calls to the acts (direct once the table is known, but left as calls by GCC) are
   inlined; without it the 800-layer plan took a fifth to a third longer (bench/RESULTS.md). */
static __attribute__((flatten)) l2l_status replay_step(uint64_t *peak, uint64_t *stretch_peak, const struct plan_chain *c,
                              const struct order *sc, const struct plan_memo *memo, int64_t mb,
                              int64_t nmb, int64_t last) {
  struct replay r = replay_begin(c, memo, mb, nmb, last);
  r.stretch_peak = stretch_peak;
  plan_replayed_micro_batches += nmb;
  struct step s = {.r = &r, .L = c->L};
  int L = c->L;
  s.x = calloc((size_t)L + 1, sizeof *s.x);
  s.g = calloc((size_t)L + 1, sizeof *s.g);
  s.saved = calloc((size_t)L, sizeof *s.saved);
  bool ok = s.x && s.g && s.saved;
  for (int k = 0; ok && k <= L; k++) {
    s.x[k] = calloc((size_t)r.nmb, sizeof **s.x);
    s.g[k] = calloc((size_t)r.nmb, sizeof **s.g);
    if (k < L) s.saved[k] = calloc((size_t)r.nmb, sizeof **s.saved);
    ok = s.x[k] && s.g[k] && (k == L || s.saved[k]);
  }
  l2l_status status = L2L_OK;
  if (ok) {
    struct block *slots[3];
    slots_take(&r, slots, memo);
    (void)order_walk(sc, r.nmb, &replay_acts, &s);   /* the replay's acts cannot fail */
    inputs_free(&s);
    drop(&r, s.scratch.dev);
    for (int i = 0; i < 3; i++) drop(&r, slots[i]);
    /* whatever the replay left (none on a consistent chain) goes with it */
    for (int k = 0; k <= L; k++)
      for (int64_t u = 0; u < r.nmb; u++) {
        drop(&r, s.x[k][u].dev);
        drop(&r, s.g[k][u].dev);
        if (k < L) saved_free(&r, &s.saved[k][u]);
      }
    throttle(&r, &s.outs, 0);
  }
  if (!ok || r.failed) status = FAIL(L2L_ERR_NOMEM, "no memory to replay a step of %d layers", L);
  else *peak = r.peak;
  for (int k = 0; s.x && k <= L; k++) {
    free(s.x[k]);
    if (s.g) free(s.g[k]);
    if (k < L && s.saved) free(s.saved[k]);
  }
  free(s.x);
  free(s.g);
  free(s.saved);
  replay_end(&r);
  return status;
}

/* What every policy's step holds at once (see plan.h): the slots, and a forward call's
   input, batch fields, output (a head's losses) and arenas, for the first micro-batch,
   counted by the replay's own blocks. */
static l2l_status floor_of(uint64_t *floor, const struct plan_chain *c, const struct plan_memo *memo,
                           int64_t mb, int64_t nmb, int64_t last) {
  struct replay r = replay_begin(c, memo, mb, nmb, last);
  struct block *slots[3];
  slots_take(&r, slots, memo);
  for (int k = 0; k < c->L && !r.failed; k++) {
    struct block *held[4], *ids[2];
    held[0] = k > 0 ? new_act(&r, 0) : NULL;
    inputs_take(&r, k, 0, ids);
    held[1] = c->layers[k].role == L2L_ROLE_HEAD
                  ? take(&r, (uint64_t)(rows_of(&r, 0) * r.head_width) * sizeof(float))
                  : new_act(&r, 0);
    held[2] = take(&r, mem_of(&r, k, 0)->saved);
    held[3] = take(&r, mem_of(&r, k, 0)->work_forward);
    inputs_drop(&r, ids);
    for (int i = 0; i < 4; i++) drop(&r, held[i]);
  }
  for (int i = 0; i < 3; i++) drop(&r, slots[i]);
  bool failed = r.failed;
  *floor = failed ? 0 : r.peak;
  replay_end(&r);
  return failed ? FAIL(L2L_ERR_NOMEM, "no memory to plan") : L2L_OK;
}

int64_t plan_peak_whole_replay_max = 16;
_Atomic int64_t plan_peak_fallbacks;
_Atomic int64_t plan_replayed_micro_batches;

/* The peak of a step of nmb > FIRST_SPECIAL + LAST_SPECIAL + 3 micro-batches from three
   short replays (see the top); *exact false when a stretch's three values are not on a
   line (then the caller replays the whole step). */
static l2l_status extrapolate(uint64_t *peak, bool *exact, const struct plan_chain *c,
                              const struct order *sc, const struct plan_memo *memo, int64_t mb,
                              int64_t nmb, int64_t last) {
  int n = 1 + STRETCHES * sc->nvisits;
  uint64_t *v = calloc((size_t)n * 3, sizeof *v);
  if (v == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  l2l_status status = L2L_OK;
  uint64_t whole[3];
  for (int m = 1; m <= 3 && status == L2L_OK; m++)
    status = replay_step(&whole[m - 1], v + (size_t)n * (size_t)(m - 1), c, sc, memo, mb,
                         FIRST_SPECIAL + m + LAST_SPECIAL, last);
  *exact = status == L2L_OK;
  int64_t middle = nmb - FIRST_SPECIAL - LAST_SPECIAL;
  uint64_t best = 0;
  for (int i = 0; i < n && *exact; i++) {
    int64_t v1 = (int64_t)v[i], v2 = (int64_t)v[n + i], v3 = (int64_t)v[2 * n + i];
    if (v3 - v2 != v2 - v1 || v2 < v1) {
      *exact = false;
      break;
    }
    uint64_t at = (uint64_t)v1 + (uint64_t)(middle - 1) * (uint64_t)(v2 - v1);
    if (at > best) best = at;
  }
  /* the stretches cover every allocation: their highest is the peak of each replay */
  for (int m = 0; m < 3 && *exact; m++) {
    uint64_t most = 0;
    for (int i = 0; i < n; i++) most = v[(size_t)n * (size_t)m + (size_t)i] > most ? v[(size_t)n * (size_t)m + (size_t)i] : most;
    if (most != whole[m]) *exact = false;
  }
  free(v);
  *peak = best;
  return status;
}

/* The chain's step at its micro-batch, replayed for its peak (or counted for its floor,
   `floor`): its order, and the memo of its sizes (the chain's own when it is of this
   micro-batch, else one filled here). */
static l2l_status of_step(uint64_t *peak, const struct plan_chain *c, bool floor) {
  *peak = 0;
  if (c->L < 2) return FAIL(L2L_ERR_INVALID, "a chain needs an input layer and a head");
  int64_t mb = c->micro_batch < c->batch ? c->micro_batch : c->batch;
  int64_t nmb = (c->batch + mb - 1) / mb, last = c->batch - (nmb - 1) * mb;
  struct order sc;
  l2l_status status = plan_schedule(&sc, c);
  struct plan_memo own = {0};
  const struct plan_memo *memo = c->memo;
  if (status == L2L_OK &&
      (memo == NULL || memo->micro_batch != mb || memo->evaluation != c->evaluation)) {
    memo_fill(&own, c, &sc, mb);
    memo = &own;
  }
  if (status == L2L_OK && (memo->mem[0] == NULL || memo->mem[1] == NULL))
    status = FAIL(L2L_ERR_NOMEM, "no memory to plan");
  if (status == L2L_OK && floor) {
    status = floor_of(peak, c, memo, mb, nmb, last);
  } else if (status == L2L_OK) {
    bool exact = false;
    if (nmb > plan_peak_whole_replay_max && nmb > FIRST_SPECIAL + LAST_SPECIAL + 3)
      status = extrapolate(peak, &exact, c, &sc, memo, mb, nmb, last);
    if (status == L2L_OK && !exact) {
      if (nmb > plan_peak_whole_replay_max) plan_peak_fallbacks++;
      status = replay_step(peak, NULL, c, &sc, memo, mb, nmb, last);
    }
  }
  order_free(&sc);
  free(own.mem[0]);
  free(own.mem[1]);
  return status;
}

l2l_status plan_peak(uint64_t *peak, const struct plan_chain *c) { return of_step(peak, c, false); }

l2l_status plan_peak_floor(uint64_t *floor, const struct plan_chain *c) { return of_step(floor, c, true); }
