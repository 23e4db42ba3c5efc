/* SPDX-License-Identifier: MIT */
/* peak.c — the device peak of one training step, replayed allocation by allocation.
 *
 * Purpose: the planner must know, before a step runs, whether a policy fits a device
 * budget: a step that overruns fails half-way, after some layers were updated. The
 * relay's compute thread makes and frees every device tensor at points it chooses
 * (src/relay/visits.c, acts.c, slots.c), so replaying that order with the layers' memory
 * statements gives the peak exactly: parameter and gradient slots for the whole step;
 * per visit and micro-batch the input (and the next one prefetched), the micro-batch's
 * ids, the output, the call's saved and work arenas; what waits between visits (device
 * boundaries read again, rebuilt stretches, gradients handed down, kept saved states and
 * the inputs and outputs they refer to); host-stashed outputs until the copy thread has
 * them (at most two in flight). Swap is the one move made on a copy thread: its bytes are
 * counted from when a swap-out is queued to the end of the forward visit, and a swap-in
 * from when it is queued, which bounds every timing.
 * Every allocation counts as its size rounded up to L2L_ALIGN, as the pool counts it.
 * A step of many micro-batches is not replayed whole: every micro-batch but the first
 * three and the last two does exactly what its neighbours do, so the bytes in use, and
 * the most of them in each stretch of a visit (its first micro-batches, its middle ones,
 * its last ones), are affine in the number of middle micro-batches. Three short replays
 * (1, 2 and 3 middle micro-batches) give each stretch's line, checked on the third, and
 * the peak is the highest line at the real count: exact, in time and memory independent
 * of the batch (a replay of 2^24 micro-batches took minutes and gigabytes). A check that
 * fails falls back to the whole replay.
 * Must never: read the relay's state (the order is written down here; a spec compares the
 * replay with the pool's measured peak on random models and policies).
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
  b->bytes = l2l_pool_accounted(bytes);
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

static void stash_out(struct replay *r, struct outs *o, struct act *a) {
  throttle(r, o, 1);
  o->q[o->q[0] ? 1 : 0] = a->dev;
  a->dev = NULL;
  a->host = true;
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

/* ---------------------------------------------------------------- the visits */

struct step {
  struct replay *r;
  int L, lowest;
  bool *rebuilt, *reread;
  struct act **x, **g;      /* [L + 1][nmb] */
  struct saved **saved;     /* [L][nmb] */
  struct outs outs;
};

static void visit_forward(struct step *s, int k, bool rebuild) {
  struct replay *r = s->r;
  const struct plan_layer *pl = &r->c->layers[k];
  bool keep = !rebuild && pl->inner != L2L_INNER_RECOMPUTE && k >= s->lowest;
  bool input_needed = rebuild ? pl->inner == L2L_INNER_RECOMPUTE && k >= s->lowest : s->reread[k];
  bool home_device = pl->stash == L2L_STASH_DEVICE || (rebuild && s->rebuilt[k]);
  bool out_host = !rebuild && r->c->layers[k + 1].stash == L2L_STASH_HOST;
  for (int64_t u = 0; u < r->nmb; u++) {
    stretch_at(r, u);
    struct block *x = NULL, *ids[2];
    if (k > 0) {
      if (u + 1 < r->nmb) prefetch(r, &s->x[k][u + 1], u + 1);
      prefetch(r, &s->x[k][u], u);
      x = s->x[k][u].dev;
    }
    inputs_take(r, k, u, ids);
    struct block *y = new_act(r, u);
    s->x[k + 1][u].dev = y;
    forward_call(r, &s->saved[k][u], mem_of(r, k, u), keep, x, y);
    inputs_drop(r, ids);
    if (keep && pl->inner == L2L_INNER_SWAP) s->saved[k][u].away = true;
    if (k > 0) {
      if (!input_needed || (!home_device && pl->stash == L2L_STASH_RECOMPUTE))
        act_free(r, &s->x[k][u]);
      else if (!home_device)
        release_device(r, &s->x[k][u]);
    }
    if (out_host) stash_out(r, &s->outs, &s->x[k + 1][u]);
  }
  /* swap-outs are done by the visit's end: their device bytes are free then */
  if (keep && pl->inner == L2L_INNER_SWAP)
    for (int64_t u = 0; u < r->nmb; u++) {
      struct saved *sv = &s->saved[k][u];
      uint64_t bytes[3] = {sv->bytes[0], sv->bytes[1], sv->bytes[2]};
      saved_free(r, sv);
      memcpy(sv->bytes, bytes, sizeof bytes);
      sv->away = true;
    }
  throttle(r, &s->outs, 0);
}

/* The gradient dx of micro-batch u for the layer below, kept (and host-stashed as its
   boundary says) or dropped when nothing below wants it. */
static void pass_down(struct step *s, int k, int64_t u, struct block *dx, bool keep, bool host) {
  if (!keep) {
    drop(s->r, dx);
    return;
  }
  s->g[k][u].dev = dx;
  if (host) stash_out(s->r, &s->outs, &s->g[k][u]);
}

static void visit_head(struct step *s, int k) {
  struct replay *r = s->r;
  bool backward = s->lowest < s->L;
  bool keep_dx = backward && k > s->lowest;
  bool grad_host = r->c->layers[k].stash == L2L_STASH_HOST;
  for (int64_t u = 0; u < r->nmb; u++) {
    stretch_at(r, u);
    if (u + 1 < r->nmb) prefetch(r, &s->x[k][u + 1], u + 1);
    prefetch(r, &s->x[k][u], u);
    struct block *ids[2];
    inputs_take(r, k, u, ids);
    struct block *losses = take(r, (uint64_t)(rows_of(r, u) * r->head_width) * sizeof(float));
    struct block *dx = backward ? new_act(r, u) : NULL;
    const l2l_layer_memory *m = mem_of(r, k, u);
    struct saved sv = {0};
    forward_call(r, &sv, m, backward, s->x[k][u].dev, NULL);
    if (backward) drop(r, take(r, m->work_backward));
    saved_free(r, &sv);
    drop(r, losses);
    inputs_drop(r, ids);
    act_free(r, &s->x[k][u]);
    if (backward) pass_down(s, k, u, dx, keep_dx, grad_host);
  }
  throttle(r, &s->outs, 0);
}

static void swap_in(struct replay *r, struct saved *sv) {
  if (!sv->away) return;
  sv->away = false;
  sv->arena = take(r, sv->bytes[0]);
  sv->input = take(r, sv->bytes[1]);
  sv->output = take(r, sv->bytes[2]);
}

static void visit_backward(struct step *s, int k) {
  struct replay *r = s->r;
  const struct plan_layer *pl = &r->c->layers[k];
  bool recompute = pl->inner == L2L_INNER_RECOMPUTE;
  bool keep_dx = k > s->lowest;
  bool grad_host = k > 0 && pl->stash == L2L_STASH_HOST;
  for (int64_t u = 0; u < r->nmb; u++) {
    stretch_at(r, u);
    if (u + 1 < r->nmb) {
      prefetch(r, &s->g[k + 1][u + 1], u + 1);
      if (recompute && k > 0) prefetch(r, &s->x[k][u + 1], u + 1);
    }
    prefetch(r, &s->g[k + 1][u], u);
    /* a swapped state comes back one micro-batch ahead of its use */
    for (int64_t v = u; v < r->nmb && v <= u + 1; v++) swap_in(r, &s->saved[k][v]);
    struct block *ids[2], *x = NULL, *scratch = NULL, *dx = NULL;
    inputs_take(r, k, u, ids);
    if (recompute) {
      if (k > 0) {
        prefetch(r, &s->x[k][u], u);
        x = s->x[k][u].dev;
      }
      scratch = new_act(r, u);
    }
    if (k > 0) dx = new_act(r, u);
    const l2l_layer_memory *m = mem_of(r, k, u);
    if (recompute) forward_call(r, &s->saved[k][u], m, true, x, scratch);
    drop(r, take(r, m->work_backward));
    inputs_drop(r, ids);
    saved_free(r, &s->saved[k][u]);
    drop(r, scratch);
    act_free(r, &s->g[k + 1][u]);
    if (k > 0) act_free(r, &s->x[k][u]);
    pass_down(s, k, u, dx, keep_dx, grad_host);
  }
  throttle(r, &s->outs, 0);
}

/* ---------------------------------------------------------------- slots */

uint64_t plan_slot_bytes(const struct plan_chain *c, int k, enum plan_slot_content content) {
  const l2l_layer *layer = c->layers[k].layer;
  uint64_t n = 0;
  for (int i = 0; i < l2l_layer_param_count(layer); i++) {
    const l2l_param *p = l2l_layer_param(layer, i);
    bool low = l2l_param_low_precision(p);
    l2l_dtype dtype = content == PLAN_SLOT_VALUES ? (low ? c->precision : L2L_F32)
                      : content == PLAN_SLOT_GRADS ? L2L_F32
                                                   : (low ? c->grad_precision : L2L_F32);
    uint64_t size = content == PLAN_SLOT_GRADS_OUT && dtype == L2L_F32 ? 0 : l2l_dtype_size(dtype);
    n += l2l_pool_accounted((uint64_t)l2l_tensor_numel(l2l_param_value(p)) * size);
  }
  return n;
}

/* A slot's bytes: the largest layer's (slots.c). */
static uint64_t slot_size(const struct plan_chain *c, enum plan_slot_content content) {
  uint64_t most = L2L_ALIGN;
  for (int k = 0; k < c->L; k++) {
    uint64_t n = plan_slot_bytes(c, k, content);
    if (n > most) most = n;
  }
  return most;
}

/* ---------------------------------------------------------------- the step */

static void run_visits(struct step *s) {
  struct replay *r = s->r;
  const struct plan_chain *c = r->c;
  struct plan_visit *visits = calloc((size_t)plan_max_visits(c), sizeof *visits);
  if (visits == NULL) {
    r->failed = true;
    return;
  }
  int n = plan_visits(visits, c, s->lowest, s->rebuilt, s->reread);
  for (int i = 0; i < n && !r->failed; i++) {
    int k = visits[i].k;
    enum plan_visit_kind kind = visits[i].kind;
    r->visit_base = 1 + STRETCHES * i;
    r->stretch = r->visit_base;
    /* the first micro-batch's input, brought in ahead (visit_prefetch) */
    if (kind == PLAN_BACKWARD) prefetch(r, &s->g[k + 1][0], 0);
    bool reads_input = kind != PLAN_BACKWARD || c->layers[k].inner == L2L_INNER_RECOMPUTE;
    if (reads_input && k > 0) prefetch(r, &s->x[k][0], 0);
    switch (kind) {
      case PLAN_FORWARD: visit_forward(s, k, false); break;
      case PLAN_REBUILD: visit_forward(s, k, true); break;
      case PLAN_HEAD: visit_head(s, k); break;
      default: visit_backward(s, k); break;
    }
  }
  free(visits);
}

/* The memory statements and slot sizes a replay reads, for micro-batch mb (arrays NULL
   when out of memory). */
static void memo_fill(struct plan_memo *m, const struct plan_chain *c, int64_t mb) {
  int L = c->L;
  int64_t nmb = (c->batch + mb - 1) / mb, last = c->batch - (nmb - 1) * mb;
  m->micro_batch = mb;
  for (int i = 0; i < 2; i++) {
    free(m->mem[i]);
    m->mem[i] = calloc((size_t)L, sizeof *m->mem[i]);
  }
  for (int k = 0; m->mem[0] && m->mem[1] && k < L; k++) {
    void (*statement)(l2l_layer_memory *, const l2l_layer *, int64_t, int64_t, l2l_dtype) =
        c->any_weights ? l2l_layer_memory_bound : l2l_layer_memory_in;
    statement(&m->mem[0][k], c->layers[k].layer, mb, c->seq, c->precision);
    statement(&m->mem[1][k], c->layers[k].layer, last, c->seq, c->precision);
  }
  for (int i = 0; i < 3; i++) m->slots[i] = slot_size(c, (enum plan_slot_content)i);
}

l2l_status plan_chain_memo(struct plan_chain *c) {
  if (c->memo == NULL && (c->memo = calloc(1, sizeof *c->memo)) == NULL)
    return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  int64_t mb = c->micro_batch < c->batch ? c->micro_batch : c->batch;
  memo_fill(c->memo, c, mb);
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

/* One replay of a step of `nmb` micro-batches of mb rows, the last of `last` rows: its
   peak, and each stretch's into stretch_peak (NULL: not asked). */
static l2l_status replay_step(uint64_t *peak, uint64_t *stretch_peak, const struct plan_chain *c,
                              const struct plan_memo *memo, int64_t mb, int64_t nmb, int64_t last) {
  struct replay r = {.c = c, .mb = mb, .nmb = nmb, .last = last, .stretch_peak = stretch_peak};
  plan_replayed_micro_batches += nmb;
  struct step s = {.r = &r, .L = c->L, .lowest = plan_lowest(c)};
  int L = c->L;
  l2l_layer_config head;
  l2l_layer_get_config(&head, c->layers[c->L - 1].layer);
  r.head_width = head.kind == L2L_LAYER_CLASSIFIER ? 1 : c->seq;
  r.mem_full = memo->mem[0];
  r.mem_last = memo->mem[1];
  s.rebuilt = calloc((size_t)L + 1, sizeof *s.rebuilt);
  s.reread = calloc((size_t)L + 1, sizeof *s.reread);
  s.x = calloc((size_t)L + 1, sizeof *s.x);
  s.g = calloc((size_t)L + 1, sizeof *s.g);
  s.saved = calloc((size_t)L, sizeof *s.saved);
  bool ok = memo->mem[0] && memo->mem[1] && s.rebuilt && s.reread && s.x && s.g && s.saved;
  for (int k = 0; ok && k <= L; k++) {
    s.x[k] = calloc((size_t)r.nmb, sizeof **s.x);
    s.g[k] = calloc((size_t)r.nmb, sizeof **s.g);
    if (k < L) s.saved[k] = calloc((size_t)r.nmb, sizeof **s.saved);
    ok = s.x[k] && s.g[k] && (k == L || s.saved[k]);
  }
  l2l_status status = L2L_OK;
  if (ok) {
    /* the slots live through the step (slots.c) */
    struct block *slots = take(&r, memo->slots[PLAN_SLOT_VALUES] * (uint64_t)c->param_slots);
    struct block *grads = take(&r, 2 * memo->slots[PLAN_SLOT_GRADS]);
    struct block *grads_out = c->grad_precision != L2L_F32 ? take(&r, 2 * memo->slots[PLAN_SLOT_GRADS_OUT]) : NULL;
    run_visits(&s);
    drop(&r, slots);
    drop(&r, grads);
    drop(&r, grads_out);
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
  free(s.rebuilt);
  free(s.reread);
  while (r.chunks) {
    struct chunk *next = r.chunks->next;
    free(r.chunks);
    r.chunks = next;
  }
  return status;
}

int64_t plan_peak_whole_replay_max = 16;
_Atomic int64_t plan_peak_fallbacks;
_Atomic int64_t plan_replayed_micro_batches;

/* The peak of a step of nmb > FIRST_SPECIAL + LAST_SPECIAL + 3 micro-batches from three
   short replays (see the top); *exact false when a stretch's three values are not on a
   line (then the caller replays the whole step). */
static l2l_status extrapolate(uint64_t *peak, bool *exact, const struct plan_chain *c,
                              const struct plan_memo *memo, int64_t mb, int64_t nmb, int64_t last) {
  int n = 1 + STRETCHES * plan_max_visits(c);
  uint64_t *v = calloc((size_t)n * 3, sizeof *v);
  if (v == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  l2l_status status = L2L_OK;
  uint64_t whole[3];
  for (int m = 1; m <= 3 && status == L2L_OK; m++)
    status = replay_step(&whole[m - 1], v + (size_t)n * (size_t)(m - 1), c, memo, mb,
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

l2l_status l2l_plan_peak(uint64_t *peak, const struct plan_chain *c) {
  *peak = 0;
  if (c->L < 2) return FAIL(L2L_ERR_INVALID, "a chain needs an input layer and a head");
  int64_t mb = c->micro_batch < c->batch ? c->micro_batch : c->batch;
  int64_t nmb = (c->batch + mb - 1) / mb, last = c->batch - (nmb - 1) * mb;
  struct plan_memo own = {0};
  const struct plan_memo *memo = c->memo;
  if (memo == NULL || memo->micro_batch != mb) {
    memo_fill(&own, c, mb);
    memo = &own;
  }
  l2l_status status = L2L_OK;
  bool exact = false;
  if (nmb > plan_peak_whole_replay_max && nmb > FIRST_SPECIAL + LAST_SPECIAL + 3)
    status = extrapolate(peak, &exact, c, memo, mb, nmb, last);
  if (status == L2L_OK && !exact) {
    if (nmb > plan_peak_whole_replay_max) plan_peak_fallbacks++;
    status = replay_step(peak, NULL, c, memo, mb, nmb, last);
  }
  free(own.mem[0]);
  free(own.mem[1]);
  return status;
}
