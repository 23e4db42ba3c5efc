/* SPDX-License-Identifier: MIT */
/* record.c — the bottom of the EPS: what every file of it reads of a record.
 *
 * Purpose: a record's bytes in host memory and on disk (core's host_record_bytes,
 * the one formula the planner and the host budget use too), and the order backward
 * completes a step's due records in (the read-ahead list of state_tier.c and the places
 * on the ranks' streams of exchange.c). The core (eps.c) and its parts (exchange.c,
 * state_tier.c, quant.c, spill.c) call these; they call nothing of the EPS above them.
 * Must never: call a function of another file of src/eps/ (it is the EPS's bottom), or
 * take the EPS's lock.
 */
#include <stdlib.h>

#include "record.h"

struct host_record eps_record_bytes(const struct eps *eps, const struct eps_record *rec) {
  struct host_record b;
  host_record_bytes(&b, l2l_tensor_numel(rec->master), rec->shard_n,
                    optim_state_count(&eps->optimizer), eps->optimizer.state,
                    (l2l_dtype)l2l_tensor_dtype(rec->master),
                    rec->staging ? eps->precision : L2L_F32, eps->dist != NULL);
  return b;
}

/* A record completes at the visit of its lowest user, and eps_expect names the layers from
   the lowest up, so the later a record was first named, the sooner it completes. */
static int by_completion(const void *a, const void *b) {
  const struct eps_record *x = *(struct eps_record *const *)a, *y = *(struct eps_record *const *)b;
  return (y->first_expect > x->first_expect) - (y->first_expect < x->first_expect);
}

void eps_sort_by_completion(struct eps_record **list, int n) {
  qsort(list, (size_t)n, sizeof *list, by_completion);
}
