/* SPDX-License-Identifier: MIT */
/* step.c — the relay's step interface to the EPS (eps.h, "a step").
 *
 * Purpose: one training step as a few calls: begin (the step's plan: whether it updates,
 * whether updates are deferred, the learning rate, and which records expect gradients
 * and which a frozen rebuild holds), agreed (every rank began), then each visit's
 * gradients given, deferred updates released, and the end's outcome (the records skipped
 * for a non-finite gradient) or the step abandoned. The bookkeeping itself is the core's
 * (eps.c); this file orders it, as relay/step.c did call by call before (issue 48).
 * Must never: change anything when a begin fails (the begin is undone), or be called
 * from a worker.
 */
#include "record.h"

l2l_status eps_step_begin(struct eps *eps, const struct eps_step *step) {
  eps_begin_step(eps, step->update, step->defer, step->lr);
  for (int i = 0; i < step->n_expect; i++) eps_expect(eps, eps_find(eps, step->expect[i]));
  for (int i = 0; i < step->n_hold; i++) eps_hold(eps, eps_find(eps, step->hold[i]));
  l2l_status status = eps_prepare(eps);
  if (status != L2L_OK) eps_begin_step(eps, false, false, 0);
  return status;
}

void eps_step_agreed(struct eps *eps, bool go) {
  if (go) eps_order_exchanges(eps);
  else eps_begin_step(eps, false, false, 0);   /* (as a failed begin undoes itself) */
}

void eps_step_end(struct eps *eps, bool ok, struct eps_outcome *out) {
  if (!ok) {
    eps_abandon_step(eps);
    return;
  }
  eps_wait_arrivals(eps);
  eps_exchanged_updates(eps);   /* with ranks: the records on the device, updated now */
  out->skips = eps_nonfinite_skips(eps, &out->name, &out->layer);
}
