/* SPDX-License-Identifier: MIT */
/* state_tier.c — the optimizer state in the spill file between a record's updates.
 *
 * Purpose: the EPS's first use of its third tier (issue "Beyond host memory"): with a
 * spill file (l2l_eps_spill_state) a record's optimizer state is read back into host
 * memory for its update alone and written out after the update's last wave, while the
 * record is still pending, so that neither its next update nor a checkpoint can start
 * before it is on disk. The file and its I/O are spill.c's; what to read ahead of the
 * update, in the schedule's order, is to come.
 * Must never: free a state array that is not on disk, or leave a failure unreported (the
 * first one on a worker is kept for the step).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

/* Moves rec's state arrays to the spill file (each its own region, reserved the first
   time) and frees their host memory; a failure leaves them in memory. */
l2l_status eps_state_out(struct l2l_eps *eps, struct eps_record *rec) {
  int arrays = l2l_optim_state_count(&eps->optimizer);
  if (rec->state[0] == NULL) return L2L_OK;
  uint64_t bytes = (uint64_t)rec->shard_n * sizeof(float);
  for (int a = 0; !rec->spill_reserved && a < arrays; a++)
    TRY(eps_spill_reserve(eps->spill, bytes, &rec->spill_at[a]));
  rec->spill_reserved = true;
  struct eps_spill_io io[2];
  l2l_status status = L2L_OK;
  int queued = 0;
  for (int a = 0; a < arrays && status == L2L_OK; a++) {
    status = eps_spill_queue(eps->spill, &io[a], true, l2l_tensor_data(rec->state[a]),
                             rec->spill_at[a], bytes);
    if (status == L2L_OK) queued++;
  }
  for (int a = 0; a < queued; a++) {
    l2l_status done = eps_spill_wait(&io[a]);
    if (status == L2L_OK) status = done;
  }
  if (status != L2L_OK) return status;
  for (int a = 0; a < arrays; a++) {
    l2l_tensor_free(rec->state[a]);
    rec->state[a] = NULL;
  }
  rec->spilled = true;
  return L2L_OK;
}

l2l_status eps_spill_read_state(struct l2l_eps *eps, struct eps_record *rec, int which,
                                l2l_tensor **out) {
  TRY(eps_state_new(out, rec));
  struct eps_spill_io io;
  l2l_status status = eps_spill_queue(eps->spill, &io, false, l2l_tensor_data(*out),
                                      rec->spill_at[which], (uint64_t)rec->shard_n * sizeof(float));
  if (status == L2L_OK) status = eps_spill_wait(&io);
  if (status != L2L_OK) {
    l2l_tensor_free(*out);
    *out = NULL;
  }
  return status;
}

/* Brings a spilled record's state back to host memory; a failure leaves it on disk. */
static l2l_status state_in(struct l2l_eps *eps, struct eps_record *rec) {
  if (!rec->spilled) return L2L_OK;
  int arrays = l2l_optim_state_count(&eps->optimizer);
  l2l_tensor *fresh[2] = {NULL, NULL};
  for (int a = 0; a < arrays; a++) {
    l2l_status status = eps_spill_read_state(eps, rec, a, &fresh[a]);
    if (status != L2L_OK) {
      l2l_tensor_free(fresh[0]);
      return status;
    }
  }
  for (int a = 0; a < arrays; a++) rec->state[a] = fresh[a];
  rec->spilled = false;
  return L2L_OK;
}

/* A spill failure on a worker: the first is kept for the step to report. */
void eps_io_failed(struct l2l_eps *eps, l2l_status status) {
  pthread_mutex_lock(&eps->lock);
  if (eps->io_status == L2L_OK) {
    eps->io_status = status;
    snprintf(eps->io_message, sizeof eps->io_message, "%s", l2l_last_error());
  }
  pthread_mutex_unlock(&eps->lock);
}

l2l_status l2l_eps_io_status(struct l2l_eps *eps) {
  pthread_mutex_lock(&eps->lock);
  l2l_status status = eps->io_status;
  char message[sizeof eps->io_message];
  memcpy(message, eps->io_message, sizeof message);
  eps->io_status = L2L_OK;
  pthread_mutex_unlock(&eps->lock);
  return status == L2L_OK ? L2L_OK : l2l_fail(status, "%s", message);
}

l2l_status l2l_eps_spill_state(struct l2l_eps *eps, const char *dir) {
  if (eps->dist)
    return FAIL(L2L_ERR_UNSUPPORTED, "the optimizer state cannot spill under data parallel yet");
  if (eps->spill) return FAIL(L2L_ERR_STATE, "the optimizer state spills already (to %s)", eps->spill->path);
  struct eps_spill *sp = calloc(1, sizeof *sp);
  if (sp == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a spill file");
  char found[1024];
  l2l_status status = eps_spill_open(sp, dir, 1, found, sizeof found);
  if (status != L2L_OK) {
    free(sp);
    return status;
  }
  if (found[0]) fprintf(stderr, "l2l: warning: %s\n", found);
  eps->spill = sp;
  int moved = 0;
  for (; moved < eps->count && status == L2L_OK; moved++) status = eps_state_out(eps, eps->records[moved]);
  if (status == L2L_OK) return L2L_OK;
  for (int i = 0; i < moved; i++) state_in(eps, eps->records[i]);   /* as it was */
  eps->spill = NULL;
  eps_spill_close(sp);
  free(sp);
  return status;
}

/* With a spill file: rec's state in memory for its update (read back, or zero for its
   first). */
l2l_status eps_state_for_update(struct l2l_eps *eps, struct eps_record *rec) {
  if (rec->spilled) return state_in(eps, rec);
  for (int a = 0; a < l2l_optim_state_count(&eps->optimizer); a++) {
    if (rec->state[a] != NULL) continue;
    TRY(eps_state_new(&rec->state[a], rec));
    TRY(l2l_tensor_fill(rec->state[a], 0.0));
  }
  return L2L_OK;
}
