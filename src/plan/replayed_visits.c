/* SPDX-License-Identifier: MIT */
/* replayed_visits.c — the order of a training step's layer visits, as the relay makes it.
 *
 * Purpose: the peak replay (peak.c) and the time model (cost.c) walk the same visits the
 * relay does (src/relay/visit_plan.c, whose rules are restated here), so that what they
 * predict is about the step that will run.
 * Must never: depend on anything but the chain's policies and frozen layers.
 */
#include "plan.h"

int plan_lowest(const struct plan_chain *c) {
  for (int k = 0; k < c->L; k++)
    if (!c->layers[k].frozen) return k;
  return c->L;
}

int plan_max_visits(const struct plan_chain *c) { return 4 * c->L + 4; }

int plan_visits(struct plan_visit *out, const struct plan_chain *c, int lowest, bool *rebuilt,
                bool *reread) {
  int n = 0, L = c->L;
  for (int k = 0; k < L - 1; k++) out[n++] = (struct plan_visit){k, PLAN_FORWARD};
  out[n++] = (struct plan_visit){L - 1, PLAN_HEAD};
  for (int k = L - 2; k >= lowest; k--) {
    bool recompute = c->layers[k].inner == L2L_INNER_RECOMPUTE;
    bool dropped = c->layers[k].stash == L2L_STASH_RECOMPUTE;
    if (k >= 1 && recompute && dropped && !rebuilt[k]) {
      int j = k - 1;
      while (j >= 1 && c->layers[j].stash == L2L_STASH_RECOMPUTE && !rebuilt[j]) j--;
      for (int m = j; m < k; m++) out[n++] = (struct plan_visit){m, PLAN_REBUILD};
      for (int m = j + 1; m <= k; m++) rebuilt[m] = true;
      if (!rebuilt[j]) reread[j] = true;
    }
    if (recompute && !rebuilt[k]) reread[k] = true;
    out[n++] = (struct plan_visit){k, PLAN_BACKWARD};
  }
  return n;
}
