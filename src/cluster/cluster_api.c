/* SPDX-License-Identifier: MIT */
/* cluster_api.c — the public data-parallel calls (l2l.h, "data parallel") over
 * comm_thread.c.
 *
 * Purpose: argument checks and messages; MPI itself is comm_thread.c's and the plugin's.
 * Must never: start MPI where the call does not need it (finalize, abort).
 */
#include <stdio.h>

#include "cluster.h"

l2l_status l2l_dist_init(void) { return error_as(__func__, dist_start()); }

l2l_status l2l_dist_rank(int *out) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY_AS(l2l_dist_init());
  *out = dist_rank_now();
  return L2L_OK;
}

l2l_status l2l_dist_size(int *out) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  TRY_AS(l2l_dist_init());
  *out = dist_size_now();
  return L2L_OK;
}

l2l_status l2l_dist_barrier(void) {
  TRY_AS(l2l_dist_init());
  struct dist_op op = {.kind = DIST_BARRIER, .what = "barrier", .layer = -1, .step = -1};
  return error_as(__func__, dist_run(&op));
}

l2l_status l2l_dist_sum(double *values, int n) {
  if (values == NULL) return FAIL(L2L_ERR_INVALID, "values is NULL");
  if (n < 1 || n > (1 << 24)) return FAIL(L2L_ERR_INVALID, "n must be in [1, 2^24], got %d", n);
  TRY_AS(l2l_dist_init());
  struct dist_op op = {.kind = DIST_ALLREDUCE_SUM, .recv = values, .n = n, .what = "sum",
                       .layer = -1, .step = -1, .bytes = (uint64_t)n * sizeof(double)};
  return error_as(__func__, dist_run(&op));
}

l2l_status l2l_dist_set_timeout(double seconds) {
  if (!dist_set_timeout_now(seconds))
    return FAIL(L2L_ERR_INVALID, "seconds must be in (0, 1e6], got %g", seconds);
  return L2L_OK;
}

l2l_status l2l_dist_finalize(void) {
  dist_stop();
  return L2L_OK;
}

void l2l_dist_abort(const char *message) {
  dist_fail(message ? message : "l2l_dist_abort");
}
