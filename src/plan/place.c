/* SPDX-License-Identifier: MIT */
/* place.c — placement auto (l2l_relay_config.placement): which records live on the device.
 *
 * Purpose: a model whose records fit on the device beside its step trains as an ordinary
 * GPU trainer does, every record there (no weight, gradient or optimizer state crosses
 * the link); one that does not fit keeps on the device what the budget holds, record by
 * record, the rest on the host, so a model a little too large degrades a little, not off
 * a cliff. A record on the device costs its device bytes (core's device_record_bytes) and
 * spares the step its slot, its copies and its host update; the step's peak with any
 * placement is the replay's (the slots shrink as the records of the largest layers leave
 * them), so each choice is checked by a replay, exactly. A layer's own records move
 * together (its LayerNorm's weight and bias are read side by side by the frugal guard,
 * which takes them in one place), and with those of the layers it shares a record with
 * (a tied table's embedding and head): every visit's records are in one place, so
 * per-layer clipping finds a visit's factor where its gradients are.
 * With ranks the relay places within what every rank allows (`allowed`: the layers whose
 * group may go on the device; relay/auto_plan.c narrows it until the ranks agree).
 * Must never: place a group `allowed` keeps on the host, or choose a placement whose
 * records and step are over the budget when one with fewer is not.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* A group's own records (those its layers are the first users of) and their bytes on the
   device: they move together, so that a layer's LayerNorm weight and bias, which its
   backward's guard reads side by side, are in one place, and so are all the records a
   visit gives (a group: the layers joined by a record they share). Named by its first
   layer. */
struct candidate {
  int layer, records;
  uint64_t bytes;
};

/* group[k]: the first layer of layer k's group (the layers that share a record, through
   each other: a tied table's embedding and head). */
static void groups_of(int *group, const struct plan_layer *layers, int L,
                      const struct layers_record *recs, int n) {
  for (int k = 0; k < L; k++) group[k] = k;
  for (int i = 0; i < n; i++)
    for (int k = 0; recs[i].users > 1 && k < L; k++)
      for (int r = 0; r < l2l_layer_param_count(layers[k].layer); r++) {
        int a = group[recs[i].layer], b = group[k];
        if (l2l_layer_param(layers[k].layer, r) != recs[i].param || a == b) continue;
        int keep = a < b ? a : b, gone = a < b ? b : a;
        for (int j = 0; j < L; j++) group[j] = group[j] == gone ? keep : group[j];
      }
}

static int larger_first(const void *a, const void *b) {
  const struct candidate *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  return x->layer - y->layer;   /* (stable) */
}

/* Every layer's bits for the own records of the layers of group `g` set to `on` (a record
   shared by layers: in each of them). A record's users are its first (recs[i].layer) and,
   where it has more, layers after it: only those are looked through (looking through
   every layer for every record made placing 800 blocks take seconds). */
static void mark(struct plan_layer *layers, int L, const struct layers_record *recs, int n,
                 const int *group, int g, bool on) {
  for (int i = 0; i < n; i++) {
    if (group[recs[i].layer] != g) continue;
    int end = recs[i].users > 1 ? L : recs[i].layer + 1;
    for (int k = recs[i].layer; k < end; k++)
      for (int r = 0; r < l2l_layer_param_count(layers[k].layer); r++)
        if (l2l_layer_param(layers[k].layer, r) == recs[i].param)
          layers[k].on_device = on ? layers[k].on_device | 1u << r : layers[k].on_device & ~(1u << r);
  }
}

/* The records placed (their bytes, and their words: n of them) and the step's peak with
   them fit the budget. */
static l2l_status fits(bool *out, struct plan_chain *c, uint64_t bytes, int n, uint64_t budget) {
  uint64_t peak = 0, records = bytes + device_words_bytes(n);
  plan_memo_free(c);   /* (the slots' sizes follow the placement) */
  TRY(plan_peak(&peak, c));
  *out = records <= budget && peak <= budget - records;
  return L2L_OK;
}

l2l_status plan_place(struct plan_chain *c, const l2l_relay_config *config, uint64_t budget,
                      const uint32_t *allowed, int most, int *groups, uint64_t *bytes) {
  *bytes = 0;
  if (groups != NULL) *groups = 0;
  for (int k = 0; k < c->L; k++) c->layers[k].on_device = 0;
  int arrays = 0, n = 0;
  TRY(l2l_optimizer_state_arrays(&arrays, &config->optimizer));
  const l2l_layer **list = calloc((size_t)(c->L > 0 ? c->L : 1), sizeof *list);
  if (list == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to place %d layers' records", c->L);
  for (int k = 0; k < c->L; k++) list[k] = c->layers[k].layer;
  struct layers_record *recs = NULL;
  l2l_status status = layers_records(&recs, &n, list, NULL, c->L);
  free(list);
  TRY(status);
  struct candidate *cand = calloc((size_t)(c->L > 0 ? c->L : 1), sizeof *cand);
  int *group = calloc((size_t)(c->L > 0 ? c->L : 1), sizeof *group);
  if (cand == NULL || group == NULL) {
    free(recs), free(cand), free(group);
    return FAIL(L2L_ERR_NOMEM, "no memory to place %d layers' records", c->L);
  }
  groups_of(group, c->layers, c->L, recs, n);
  uint64_t all = 0;
  for (int k = 0; k < c->L; k++) cand[k].layer = k;
  for (int i = 0; i < n; i++) {
    const l2l_param *p = recs[i].param;
    if (allowed != NULL && allowed[group[recs[i].layer]] == 0) continue;   /* (kept home) */
    struct layers_record_dtypes held = layers_record_dtypes(p, config->precision, config->master);
    uint64_t its = device_record_bytes(l2l_tensor_numel(param_value(p)), held.master, arrays,
                                       config->optimizer.state, held.staging);
    cand[group[recs[i].layer]].bytes += its;   /* (a group's: its first layer's candidate) */
    cand[group[recs[i].layer]].records++;
    all += its;
  }
  for (int k = 0; k < c->L; k++)
    if (cand[k].records > 0) mark(c->layers, c->L, recs, n, group, k, true);
  bool ok = false;
  int candidates = 0, nonempty = 0, taken = 0;   /* (the records and groups allowed) */
  for (int k = 0; k < c->L; k++) candidates += cand[k].records, nonempty += cand[k].records > 0;
  if (nonempty <= most)   /* every record, the ordinary GPU trainer's way */
    status = fits(&ok, c, all, candidates, budget);
  int placed = 0;
  int *order = allowed == NULL ? c->placed_order : NULL;
  const bool record = order != NULL && c->placed_count < 0;
  if (status == L2L_OK && ok) {
    *bytes = all, placed = candidates, taken = nonempty;
    if (record) qsort(cand, (size_t)c->L, sizeof *cand, larger_first);   /* (the greedy's order) */
    for (int i = 0; record && i < nonempty; i++) order[i] = cand[i].layer;
  } else if (status == L2L_OK && order != NULL && !record && most < c->placed_count) {
    /* fewer groups than an earlier call took: the greedy below would take the first `most`
       of those again, one replay each, wherever each shorter run of them fits too (as it
       does unless placing a group shrinks the slots by more than its records take) */
    for (int k = 0; k < c->L; k++) c->layers[k].on_device = 0;
    uint64_t some = 0;
    for (int i = 0; i < most; i++) {
      mark(c->layers, c->L, recs, n, group, order[i], true);
      some += cand[order[i]].bytes, placed += cand[order[i]].records;
    }
    status = fits(&ok, c, some, placed, budget);
    if (status == L2L_OK && ok) *bytes = some, taken = most;
    else placed = 0;
  }
  if (status == L2L_OK && !ok) {   /* else the largest layer's first, each while it fits */
    for (int k = 0; k < c->L; k++) c->layers[k].on_device = 0;
    qsort(cand, (size_t)c->L, sizeof *cand, larger_first);
    for (int i = 0; status == L2L_OK && i < c->L && cand[i].bytes > 0 && taken < most; i++) {
      mark(c->layers, c->L, recs, n, group, cand[i].layer, true);
      status = fits(&ok, c, *bytes + cand[i].bytes, placed + cand[i].records, budget);
      if (status == L2L_OK && ok) {
        if (record) order[taken] = cand[i].layer;
        *bytes += cand[i].bytes, placed += cand[i].records, taken++;
      } else {
        mark(c->layers, c->L, recs, n, group, cand[i].layer, false);
      }
    }
  }
  if (status == L2L_OK && record) c->placed_count = taken;
  if (groups != NULL) *groups = taken;
  *bytes += device_words_bytes(placed);
  free(recs);
  plan_memo_free(c);
  free(cand), free(group);
  return status;
}
