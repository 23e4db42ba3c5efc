/* SPDX-License-Identifier: MIT */
/* walk.h — a step's visits, micro-batch by micro-batch, as acts of an executor (included by
 * order.h, the part's interface; nothing else includes it).
 *
 * Purpose: the one place that says in which order a step brings activations in, makes
 * them, calls the layers, and releases, stashes or frees what they made, as the policies
 * of each layer's boundary (stash) and of its saved state (inner: keep, swap, recompute)
 * say. The relay's acts are real tensors and copies; the planner's are counted blocks (its
 * peak) and timed channels (its step time).
 * Every device allocation happens in an act called from here, so both see the same order.
 * The walk is inline: each executor's copy calls its own acts directly, and the planner's
 * executors (thousands of replays, a few blocks counted per act) have them inlined too
 * (flatten): as calls through pointers the 800-layer plan took a quarter longer.
 * A boundary the next visit reads stays on the device for it where order_kept says (a
 * visit's first and last micro-batches), its host stash still written when a later visit
 * reads it too: no visit fetches back what the one before it just made first, nor waits
 * at its end for its last micro-batch's copy out. In the backward,
 * the next visit's first input from the host starts on its way as a visit starts, so that
 * its copy runs under this visit's compute.
 * Must never: keep a saved state past its backward, a device input nobody reads again, or
 * more than two micro-batches of a host-stashed boundary on their way to the host beside
 * the kept ones (whose device copies stay anyway).
 */
#ifndef L2L_SCHEDULE_WALK_H
#define L2L_SCHEDULE_WALK_H

/* The walk's own names end in _: being inline, they are compiled into each executor's
   file beside its acts. */
struct order_walk_ {
  const struct order *sc;
  const struct order_ops *ops;
  void *ctx;
  int64_t nmb;
};

/* How micro-batch u of a visit's output boundary waits, the boundary's policy being host:
   order_kept's stay on the device when the next visit reads the boundary (`next_reads`),
   with a host stash only where a later visit reads it again (`reread`). */
static inline enum order_out order_out_(const struct order_walk_ *w, int64_t u,
                                        bool next_reads, bool reread) {
  if (!next_reads || !order_kept(u, w->nmb)) return ORDER_OUT_HOST;
  return reread ? ORDER_OUT_BOTH : ORDER_OUT_DEVICE;
}

static inline void order_micro_batch_(const struct order_walk_ *w, int64_t u) {
  if (w->ops->micro_batch) w->ops->micro_batch(w->ctx, u);
}

/* Forward (or rebuild) of layer k over every micro-batch: x[k] -> x[k+1]. */
static inline l2l_status order_visit_forward_(const struct order_walk_ *w, int k,
                                              bool rebuild, bool next_reads) {
  const struct order *sc = w->sc;
  const struct order_ops *op = w->ops;
  const struct order_layer *sl = &sc->layers[k];
  bool keep = !rebuild && order_keeps(sc, k);
  bool swap = keep && sl->inner == L2L_INNER_SWAP;
  /* Whether x[k] is read again (by its backward or a rebuild), and whether it then waits
     on the device (stash device, or rebuilt for the backward) rather than on the host. */
  bool input_needed = rebuild ? sc->training && sl->inner == L2L_INNER_RECOMPUTE && k >= sc->lowest
                              : sc->reread[k];
  bool input_home_device = sl->stash == L2L_STASH_DEVICE || (rebuild && sc->rebuilt[k]);
  /* The output boundary: host-stashed in forward when its policy says so (never when
     rebuilding: rebuilt boundaries stay on the device until their backward). */
  bool out_host = !rebuild && sc->layers[k + 1].stash == L2L_STASH_HOST;
  for (int64_t u = 0; u < w->nmb; u++) {
    order_micro_batch_(w, u);
    if (k > 0) {
      if (u + 1 < w->nmb) TRY(op->prefetch(w->ctx, ORDER_X, k, u + 1));
      TRY(op->on_device(w->ctx, ORDER_X, k, u));
    }
    TRY(op->inputs(w->ctx, k, u, sc->training));
    TRY(op->make(w->ctx, ORDER_X, k + 1, u));
    TRY(op->forward(w->ctx, k, u, keep, rebuild));
    op->inputs_free(w->ctx);
    if (swap) TRY(op->swap_out(w->ctx, k, u));
    /* The input: freed when nobody reads it again; else its device copy goes unless the
       device is where it waits (a host stash stays; a dropped one is rebuilt later). */
    if (k > 0) {
      if (!input_needed || (!input_home_device && sl->stash == L2L_STASH_RECOMPUTE))
        op->free(w->ctx, ORDER_X, k, u);
      else if (!input_home_device)
        TRY(op->release_device(w->ctx, ORDER_X, k, u));
    }
    if (out_host)
      TRY(op->stash_out(w->ctx, ORDER_X, k + 1, u,
                        order_out_(w, u, next_reads, sc->reread[k + 1])));
  }
  /* A swap finishes by the visit's end: its device bytes are free then. */
  for (int64_t u = 0; swap && u < w->nmb; u++) TRY(op->swap_out_wait(w->ctx, k, u));
  return op->throttle(w->ctx, 0);
}

/* g[k][u], the gradient for x[k]: kept on the device for the layer below (and stashed to
   the host when boundary k's policy says so, but where the next visit is that layer's and
   reads it first), or freed when no layer below wants it. */
static inline l2l_status order_pass_down_(const struct order_walk_ *w, int k, int64_t u,
                                          bool keep, bool host, bool next_reads) {
  if (!keep) {
    w->ops->free(w->ctx, ORDER_G, k, u);
    return L2L_OK;
  }
  return host ? w->ops->stash_out(w->ctx, ORDER_G, k, u, order_out_(w, u, next_reads, false))
              : L2L_OK;
}

/* The head: forward of each micro-batch, its loss, and (training) its backward at once. */
static inline l2l_status order_visit_head_(const struct order_walk_ *w, int k, bool next_reads) {
  const struct order *sc = w->sc;
  const struct order_ops *op = w->ops;
  bool backward = sc->training && sc->lowest < sc->L;
  bool keep_dx = backward && k > sc->lowest;   /* a layer below wants the gradient */
  bool grad_host = sc->layers[k].stash == L2L_STASH_HOST;
  for (int64_t u = 0; u < w->nmb; u++) {
    order_micro_batch_(w, u);
    if (u + 1 < w->nmb) TRY(op->prefetch(w->ctx, ORDER_X, k, u + 1));
    TRY(op->on_device(w->ctx, ORDER_X, k, u));
    TRY(op->inputs(w->ctx, k, u, sc->training));
    TRY(op->head(w->ctx, k, u, backward));
    op->inputs_free(w->ctx);
    op->free(w->ctx, ORDER_X, k, u);
    if (backward) TRY(order_pass_down_(w, k, u, keep_dx, grad_host, next_reads));
  }
  return op->throttle(w->ctx, 0);
}

/* Backward of layer k over every micro-batch: g[k+1] -> g[k], gradients summed over
   micro-batches on the device. */
static inline l2l_status order_visit_backward_(const struct order_walk_ *w, int k,
                                               bool next_reads) {
  const struct order *sc = w->sc;
  const struct order_ops *op = w->ops;
  bool recompute = sc->layers[k].inner == L2L_INNER_RECOMPUTE;
  bool keep_dx = k > sc->lowest;    /* a layer below wants the gradient */
  bool grad_host = k > 0 && sc->layers[k].stash == L2L_STASH_HOST;
  for (int64_t u = 0; u < w->nmb; u++) {
    order_micro_batch_(w, u);
    if (u + 1 < w->nmb) {
      TRY(op->prefetch(w->ctx, ORDER_G, k + 1, u + 1));
      if (recompute && k > 0) TRY(op->prefetch(w->ctx, ORDER_X, k, u + 1));
    }
    TRY(op->on_device(w->ctx, ORDER_G, k + 1, u));
    /* A swapped state comes back one micro-batch ahead of its use. */
    for (int64_t v = u; v < w->nmb && v <= u + 1; v++) TRY(op->swap_in(w->ctx, k, v));
    TRY(op->swap_in_wait(w->ctx, k, u));
    TRY(op->inputs(w->ctx, k, u, true));
    if (recompute) {
      if (k > 0) TRY(op->on_device(w->ctx, ORDER_X, k, u));
      TRY(op->make(w->ctx, ORDER_SCRATCH, k, u));
    }
    if (k > 0) TRY(op->make(w->ctx, ORDER_G, k, u));
    TRY(op->backward(w->ctx, k, u, recompute));
    op->inputs_free(w->ctx);
    op->saved_free(w->ctx, k, u);
    if (recompute) op->free(w->ctx, ORDER_SCRATCH, k, u);
    op->free(w->ctx, ORDER_G, k + 1, u);
    if (k > 0) {
      op->free(w->ctx, ORDER_X, k, u);
      TRY(order_pass_down_(w, k, u, keep_dx, grad_host, next_reads));
    }
  }
  return op->throttle(w->ctx, 0);
}

/* Whether visit i + 1 reads first what visit i hands on: x[k + 1] from a forward (the next
   forward or the head), g[k] from the head or a backward (the backward of k - 1; not when
   rebuild visits come between). */
static inline bool order_next_reads_(const struct order *sc, int i) {
  if (i + 1 >= sc->nvisits) return false;
  const struct order_visit *v = &sc->visits[i], *n = &sc->visits[i + 1];
  if (v->kind == ORDER_REBUILD) return false;
  if (v->kind == ORDER_FORWARD)
    return n->k == v->k + 1 && (n->kind == ORDER_FORWARD || n->kind == ORDER_HEAD);
  return n->kind == ORDER_BACKWARD && n->k == v->k - 1;
}

/* The boundary whose first micro-batch visit i brings in for visit i + 1 (0: none): in
   the backward (from the head on), the input of a recomputing backward or of a rebuild,
   which no visit makes in between (a no-op where it is on the device anyway). */
static inline int order_input_ahead_(const struct order *sc, int i) {
  if (i + 1 >= sc->nvisits) return 0;
  const struct order_visit *v = &sc->visits[i], *n = &sc->visits[i + 1];
  if (v->kind != ORDER_HEAD && v->kind != ORDER_BACKWARD) return 0;
  bool reads = n->kind == ORDER_REBUILD ||
               (n->kind == ORDER_BACKWARD && sc->layers[n->k].inner == L2L_INNER_RECOMPUTE);
  return reads && n->k > 0 ? n->k : 0;
}

static inline l2l_status order_walk(const struct order *sc, int64_t nmb,
                                    const struct order_ops *ops, void *ctx) {
  struct order_walk_ w = {sc, ops, ctx, nmb};
  for (int i = 0; i < sc->nvisits; i++) {
    const struct order_visit *v = &sc->visits[i];
    int k = v->k;
    bool next_reads = order_next_reads_(sc, i);
    if (ops->visit_start) ops->visit_start(ctx, i);
    /* What the visit's first two micro-batches read from the host stash starts on its way
       first: the next visit's parameters copy behind it (visit_bind), on the same thread,
       and a layer's parameters take far longer than a micro-batch's activations (queued
       at the first micro-batch, the second's waited behind them). No device memory is
       made between here and the first layer call, which holds both anyway. */
    bool reads_input = v->kind != ORDER_BACKWARD || sc->layers[k].inner == L2L_INNER_RECOMPUTE;
    for (int64_t u = 0; u < 2 && u < nmb; u++) {
      if (v->kind == ORDER_BACKWARD) TRY(ops->prefetch(ctx, ORDER_G, k + 1, u));
      if (reads_input && k > 0) TRY(ops->prefetch(ctx, ORDER_X, k, u));
    }
    int ahead = order_input_ahead_(sc, i);
    if (ahead > 0) TRY(ops->prefetch_ahead(ctx, ORDER_X, ahead));
    bool grads = order_visit_grads(sc, v);
    TRY(ops->visit_bind(ctx, i, v, grads));
    switch (v->kind) {
      case ORDER_FORWARD: TRY(order_visit_forward_(&w, k, false, next_reads)); break;
      case ORDER_REBUILD: TRY(order_visit_forward_(&w, k, true, false)); break;
      case ORDER_HEAD: TRY(order_visit_head_(&w, k, next_reads)); break;
      case ORDER_BACKWARD: TRY(order_visit_backward_(&w, k, next_reads)); break;
    }
    TRY(ops->visit_end(ctx, i, v, grads));
  }
  return L2L_OK;
}

#endif /* L2L_SCHEDULE_WALK_H */
