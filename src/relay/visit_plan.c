/* SPDX-License-Identifier: MIT */
/* visit_plan.c — the order of a step's layer visits, made before anything runs.
 *
 * Purpose: forward 0 .. L-2, the head, then backward from L-2 down to the lowest
 * trainable layer, with rebuild visits (a forward rerun of a stretch of layers from the
 * last boundary kept) before a backward whose input boundary was dropped; and, per
 * boundary, whether its input is read again after the forward.
 * Must never: depend on anything but the active layers' policies (the plan is the same
 * for every micro-batch size).
 */
#include <stdlib.h>

#include "relay.h"

l2l_status relay_plan_visits(struct step *s) {
  int L = s->L;
  s->visits = calloc((size_t)(4 * L + 4), sizeof *s->visits);
  s->rebuilt = calloc((size_t)L + 1, sizeof *s->rebuilt);
  s->reread = calloc((size_t)L + 1, sizeof *s->reread);
  if (s->visits == NULL || s->rebuilt == NULL || s->reread == NULL)
    return FAIL(L2L_ERR_NOMEM, "no memory for a step");
  for (int k = 0; k < L - 1; k++) s->visits[s->nvisits++] = (struct visit){k, V_FORWARD};
  s->visits[s->nvisits++] = (struct visit){L - 1, V_HEAD};
  if (!s->training) return L2L_OK;
  /* Backward reaches down to the lowest trainable layer: below it nobody needs a gradient. */
  s->lowest = L;
  for (int k = 0; k < L; k++)
    if (!active_layer(s, k)->frozen) {
      s->lowest = k;
      break;
    }
  for (int k = L - 2; k >= s->lowest; k--) {
    bool recompute = active_layer(s, k)->inner == L2L_INNER_RECOMPUTE;
    if (k >= 1 && recompute && dropped(s, k) && !s->rebuilt[k]) {
      int j = k - 1;
      while (j >= 1 && dropped(s, j) && !s->rebuilt[j]) j--;
      for (int m = j; m < k; m++) s->visits[s->nvisits++] = (struct visit){m, V_REBUILD};
      for (int m = j + 1; m <= k; m++) s->rebuilt[m] = true;
      if (!s->rebuilt[j]) s->reread[j] = true;
    }
    if (recompute && !s->rebuilt[k]) s->reread[k] = true;
    s->visits[s->nvisits++] = (struct visit){k, V_BACKWARD};
  }
  return L2L_OK;
}
