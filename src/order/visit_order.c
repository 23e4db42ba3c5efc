/* SPDX-License-Identifier: MIT */
/* visit_order.c — the order of a step's layer visits, made before anything runs.
 *
 * Purpose: forward 0 .. L-2, the head, then (training) backward from L-2 down to the
 * lowest trainable layer, with rebuild visits (a forward rerun of a stretch of layers from
 * the last boundary kept) before a backward whose input boundary was dropped; and, per
 * boundary, whether it is rebuilt and whether its input is read again after the forward.
 * Must never: depend on anything but the layers' policies and frozen flags (the order is
 * the same for every micro-batch size).
 */
#include <stdlib.h>
#include <string.h>

#include "order.h"

l2l_status order_new(struct order *sc, int L, bool training) {
  memset(sc, 0, sizeof *sc);
  sc->L = L, sc->training = training;
  sc->layers = calloc((size_t)L, sizeof *sc->layers);
  sc->visits = calloc((size_t)(4 * L + 4), sizeof *sc->visits);
  sc->rebuilt = calloc((size_t)L + 1, sizeof *sc->rebuilt);
  sc->reread = calloc((size_t)L + 1, sizeof *sc->reread);
  if (sc->layers == NULL || sc->visits == NULL || sc->rebuilt == NULL || sc->reread == NULL)
    return FAIL(L2L_ERR_NOMEM, "no memory for a step's visit order of %d layers", L);
  return L2L_OK;
}

void order_free(struct order *sc) {
  free(sc->layers);
  free(sc->visits);
  free(sc->rebuilt);
  free(sc->reread);
  memset(sc, 0, sizeof *sc);
}

static bool dropped(const struct order *sc, int k) {
  return sc->layers[k].stash == L2L_STASH_RECOMPUTE;
}

void order_build(struct order *sc) {
  int L = sc->L, n = 0;
  memset(sc->rebuilt, 0, ((size_t)L + 1) * sizeof *sc->rebuilt);
  memset(sc->reread, 0, ((size_t)L + 1) * sizeof *sc->reread);
  for (int k = 0; k < L - 1; k++) sc->visits[n++] = (struct order_visit){k, ORDER_FORWARD};
  sc->visits[n++] = (struct order_visit){L - 1, ORDER_HEAD};
  /* Backward reaches down to the lowest trainable layer: below it nobody needs a gradient. */
  sc->lowest = L;
  for (int k = 0; sc->training && k < L; k++)
    if (!sc->layers[k].frozen) {
      sc->lowest = k;
      break;
    }
  for (int k = L - 2; k >= sc->lowest; k--) {
    bool recompute = sc->layers[k].inner == L2L_INNER_RECOMPUTE;
    if (k >= 1 && recompute && dropped(sc, k) && !sc->rebuilt[k]) {
      int j = k - 1;
      while (j >= 1 && dropped(sc, j) && !sc->rebuilt[j]) j--;
      for (int m = j; m < k; m++) sc->visits[n++] = (struct order_visit){m, ORDER_REBUILD};
      for (int m = j + 1; m <= k; m++) sc->rebuilt[m] = true;
      if (!sc->rebuilt[j]) sc->reread[j] = true;
    }
    if (recompute && !sc->rebuilt[k]) sc->reread[k] = true;
    sc->visits[n++] = (struct order_visit){k, ORDER_BACKWARD};
  }
  sc->nvisits = n;
}
