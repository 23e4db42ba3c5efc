/* SPDX-License-Identifier: MIT */
/* records.c — the parameter records of a list of layers, each once: the one rule for a
 * model's records, which the planner (plan/host.c, plan/cost.c) and the relay (the
 * checkpoint's record list) share.
 *
 * Purpose: a record shared by layers (the tied token table: the embedding's and the LM
 * head's) is one record, held at its first user: its master, state and update are one,
 * its bytes counted once, its name the first user's. Layer by layer, in each layer's
 * parameter order: the order in which a relay made over the list holds them. Sorted by
 * record, not searched: O(r log r) for r parameters (a search of the layers before each
 * was O(r^2): 800 layers took seconds).
 * And how each is held on the host: its master's and staging copy's dtypes
 * (layers_record_dtypes), the rule the EPS holds records by and the planner counts.
 * Must never: count a record twice, or change a layer.
 */
#include <stdlib.h>

#include "layers.h"

struct use {
  l2l_param *param;
  int layer, place, pos;
};

static int by_param_then_pos(const void *a, const void *b) {
  const struct use *x = a, *y = b;
  if (x->param != y->param) return (uintptr_t)x->param < (uintptr_t)y->param ? -1 : 1;
  return x->pos - y->pos;
}

static int by_pos(const void *a, const void *b) {
  const struct layers_record *x = a, *y = b;
  return x->pos - y->pos;
}

l2l_status layers_records(struct layers_record **out, int *count, const l2l_layer *const *layers,
                          const bool *frozen, int n) {
  int cap = 0;
  for (int k = 0; k < n; k++) cap += l2l_layer_param_count(layers[k]);
  struct use *uses = malloc(sizeof *uses * (size_t)(cap > 0 ? cap : 1));
  struct layers_record *recs = calloc((size_t)(cap > 0 ? cap : 1), sizeof *recs);
  if (uses == NULL || recs == NULL) {
    free(uses), free(recs);
    return core_fail(L2L_ERR_NOMEM, "no memory for the records of %d layers", n);
  }
  int u = 0;
  for (int k = 0; k < n; k++)
    for (int r = 0; r < l2l_layer_param_count(layers[k]); r++, u++)
      uses[u] = (struct use){l2l_layer_param(layers[k], r), k, r, u};
  qsort(uses, (size_t)u, sizeof *uses, by_param_then_pos);
  int m = 0;
  for (int i = 0; i < u; i++) {
    bool first = i == 0 || uses[i].param != uses[i - 1].param;
    if (first)
      recs[m++] = (struct layers_record){.param = uses[i].param, .layer = uses[i].layer,
                                         .place = uses[i].place, .pos = uses[i].pos};
    struct layers_record *rec = &recs[m - 1];
    rec->users++;
    rec->trained |= frozen == NULL || !frozen[uses[i].layer];
  }
  free(uses);
  qsort(recs, (size_t)m, sizeof *recs, by_pos);
  *out = recs, *count = m;
  return L2L_OK;
}

struct layers_record_dtypes layers_record_dtypes(const l2l_param *param, l2l_dtype precision,
                                                 l2l_dtype master) {
  bool low = precision != L2L_F32 && param_low_precision(param);
  bool bf16_master = low && master == L2L_BF16;
  return (struct layers_record_dtypes){.master = bf16_master ? L2L_BF16 : L2L_F32,
                                       .staging = low && !bf16_master ? precision : L2L_F32};
}
