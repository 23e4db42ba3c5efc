/* SPDX-License-Identifier: MIT */
/* state_tier.c — the optimizer state in the spill file between a record's updates.
 *
 * Purpose: the EPS's third tier (issue "Beyond host memory"). With a spill file
 * (eps_spill_state) the records first in the EPS's list whose state fits what the
 * host budget leaves keep it in host memory; every other record's state is in the file
 * between its updates: read back for its update alone and written out after the update's
 * last wave, while the record is still pending, so that neither its next update nor a
 * checkpoint can start before it is on disk. The reads are not left to the update: when
 * a step begins, the records due are listed in the order backward completes them (the
 * schedule's order, which eps_expect gives), and their state is read ahead into host
 * buffers, ahead_limit bytes at most waiting at once; each update that takes its state
 * queues the next read, so the disk works while the device computes and the workers
 * update. The file and its I/O are spill.c's. Which gradient accumulators pass (in memory
 * from their arrival to their update alone) is decided here too, before each step, with
 * the budget's check; their arrivals are eps.c's, their clears (eps_grad_clear) here.
 * Each array's checksum (spill.c's XXH3-64 of what was written) stays with its record, and
 * every read back is checked against it: bytes another program changed are a read failure
 * like a file cut short, the record not updated.
 * The tier holds the records on the host: one placed on the device keeps its state there
 * (none of it in the file, none read ahead, its accumulator never passes); one that
 * placement auto moves there brings its state back from the file first (eps_move_ready).
 * Must never: free a state array that is not on disk, consume a read that a restore has
 * made stale, or leave a failure unreported (the first one on a worker is kept for the
 * step).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

/* A record's optimizer state, as the host pool counts it. */
static uint64_t state_bytes(const struct eps *eps, const struct eps_record *rec) {
  return eps_record_bytes(eps, rec).state;
}

/* Moves rec's state arrays to the spill file (each its own region, reserved the first
   time) and frees their host memory; a failure leaves them in memory. */
l2l_status eps_state_out(struct eps *eps, struct eps_record *rec) {
  int arrays = optim_state_count(&eps->optimizer);
  if (rec->state[0] == NULL) return L2L_OK;
  uint64_t bytes = eps_array_bytes(rec);
  for (int a = 0; !rec->spill_reserved && a < arrays; a++)
    TRY(eps_spill_reserve(eps->spill, bytes, &rec->spill_at[a]));
  rec->spill_reserved = true;
  struct eps_spill_io io[2];
  l2l_status status = L2L_OK;
  int queued = 0;
  for (int a = 0; a < arrays && status == L2L_OK; a++) {
    status = eps_spill_queue(eps->spill, &io[a], true, l2l_tensor_data(rec->state[a]),
                             rec->spill_at[a], bytes, 0);
    if (status == L2L_OK) queued++;
  }
  for (int a = 0; a < queued; a++) {
    l2l_status done = eps_spill_wait(&io[a]);
    if (status == L2L_OK) status = done;
  }
  if (status != L2L_OK) return status;   /* (not spilled: the checksums are not read) */
  for (int a = 0; a < arrays; a++) {
    rec->spill_sum[a] = io[a].sum;
    l2l_tensor_free(rec->state[a]);
    rec->state[a] = NULL;
  }
  pthread_mutex_lock(&eps->lock);   /* a read ahead looks at it under the lock */
  rec->spilled = true;
  pthread_mutex_unlock(&eps->lock);
  return L2L_OK;
}

/* A read of state array `which` of rec queued into a new host tensor (*out, NULL when it
   cannot be queued). */
static l2l_status read_queue(struct eps *eps, struct eps_record *rec, int which,
                             l2l_tensor **out, struct eps_spill_io *io) {
  TRY(eps_state_new(out, rec, L2L_POOL_HOST));
  l2l_status status = eps_spill_queue(eps->spill, io, false, l2l_tensor_data(*out),
                                      rec->spill_at[which], eps_array_bytes(rec),
                                      rec->spill_sum[which]);
  if (status != L2L_OK) {
    l2l_tensor_free(*out);
    *out = NULL;
  }
  return status;
}

l2l_status eps_spill_read_state(struct eps *eps, struct eps_record *rec, int which,
                                l2l_tensor **out) {
  struct eps_spill_io io;
  TRY(read_queue(eps, rec, which, out, &io));
  l2l_status status = eps_spill_wait(&io);
  if (status != L2L_OK) {
    l2l_tensor_free(*out);
    *out = NULL;
  }
  return status;
}

/* Under the lock: reads of the next records in the list queued while the window has room
   (one record always: the window never stalls on a record larger than it). A read that
   cannot be queued is left to the record's update, which reports its failure. */
static l2l_status ahead_queue(struct eps *eps, struct eps_record *rec);
static void ahead_fill(struct eps *eps) {
  while (eps->ahead_next < eps->ahead_n) {
    struct eps_record *rec = eps->ahead[eps->ahead_next];
    uint64_t bytes = state_bytes(eps, rec);
    if (eps->ahead_bytes > 0 && eps->ahead_bytes + bytes > eps->ahead_limit) return;
    eps->ahead_next++;
    if (rec->ahead != AHEAD_NONE || !rec->spilled || ahead_queue(eps, rec) != L2L_OK) continue;
    rec->ahead = AHEAD_QUEUED;
    eps->ahead_bytes += bytes;
  }
}

static l2l_status ahead_queue(struct eps *eps, struct eps_record *rec) {
  int arrays = optim_state_count(&eps->optimizer), queued = 0;
  l2l_status status = L2L_OK;
  for (int a = 0; a < arrays && status == L2L_OK; a++) {
    status = read_queue(eps, rec, a, &rec->ahead_state[a], &rec->ahead_io[a]);
    if (status == L2L_OK) queued++;
  }
  if (status == L2L_OK) return L2L_OK;
  for (int a = 0; a < queued; a++) eps_spill_wait(&rec->ahead_io[a]);
  for (int a = 0; a < 2; a++) {
    l2l_tensor_free(rec->ahead_state[a]);
    rec->ahead_state[a] = NULL;
  }
  return status;
}

void eps_ahead_drop(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  bool queued = rec->ahead == AHEAD_QUEUED;
  if (queued) eps->ahead_bytes -= state_bytes(eps, rec);
  rec->ahead = AHEAD_NONE;
  pthread_mutex_unlock(&eps->lock);
  for (int a = 0; queued && a < 2; a++) {
    if (rec->ahead_state[a] == NULL) continue;
    eps_spill_wait(&rec->ahead_io[a]);
    l2l_tensor_free(rec->ahead_state[a]);
    rec->ahead_state[a] = NULL;
  }
}

void eps_ahead_drop_all(struct eps *eps) {
  for (int i = 0; i < eps->count; i++) eps_ahead_drop(eps, eps->records[i]);
  pthread_mutex_lock(&eps->lock);
  eps->ahead_n = eps->ahead_next = 0;
  pthread_mutex_unlock(&eps->lock);
}

/* Under the lock: rec's turn passed, and the turns after it that passed already. */
static void turn_pass(struct eps *eps, const struct eps_record *rec) {
  if (rec->turn < 0) return;
  eps->turn_passed[rec->turn] = true;
  while (eps->turn_next < eps->ahead_n && eps->turn_passed[eps->turn_next]) eps->turn_next++;
}

/* Whether rec must wait for its turn: with ranks the room goes in the exchanges' order, as
   a LAMB update holds its room between its waves while it waits for its place on the
   ranks' stream of norms: one of a later place holding room that an earlier place's
   update waits for would wait forever. (The updates ask for room in the order their norms'
   all-reduces end, which is not always the places'.) */
static bool turn_waits(const struct eps *eps, const struct eps_record *rec) {
  return eps->dist != NULL && rec->turn >= 0 && rec->turn != eps->turn_next;
}

/* Under the lock: the first waiting update whose room (and turn) has come, taken (first
   come first: its room counted, its turn passed, out of the list), or NULL. The core
   begins it with the lock let go (eps_room_next then takes the next). */
static struct eps_record *waiting_take(struct eps *eps) {
  int at = 0;
  while (at < eps->waiting_n && turn_waits(eps, eps->waiting[at])) at++;
  if (at == eps->waiting_n) return NULL;
  struct eps_record *next = eps->waiting[at];
  uint64_t bytes = state_bytes(eps, next);
  if (eps->update_bytes > 0 && eps->update_bytes + bytes > eps->ahead_limit) return NULL;
  memmove(eps->waiting + at, eps->waiting + at + 1, (size_t)(--eps->waiting_n - at) * sizeof *eps->waiting);
  eps->update_bytes += bytes;
  next->room = true;
  turn_pass(eps, next);
  return next;
}

struct eps_record *eps_room_next(struct eps *eps) {
  pthread_mutex_lock(&eps->lock);
  struct eps_record *next = waiting_take(eps);
  pthread_mutex_unlock(&eps->lock);
  return next;
}

bool eps_update_room(struct eps *eps, struct eps_record *rec, float grad_scale,
                     struct eps_record **next) {
  uint64_t bytes = state_bytes(eps, rec);
  *next = NULL;
  pthread_mutex_lock(&eps->lock);
  bool fits = !turn_waits(eps, rec) &&
              (eps->update_bytes == 0 || eps->update_bytes + bytes <= eps->ahead_limit);
  bool room = rec->keep_state || fits || eps->waiting_n >= eps->lists_cap;
  if (room && !rec->keep_state) {
    eps->update_bytes += bytes;
    rec->room = true;
  } else if (!room) {   /* (pending: whoever copies the record waits for this update) */
    rec->pending = true;
    rec->wait_grad_scale = grad_scale;
    eps->waiting[eps->waiting_n++] = rec;
  }
  if (room) {
    turn_pass(eps, rec);
    *next = waiting_take(eps);   /* (the next turn's update may wait) */
  }
  pthread_mutex_unlock(&eps->lock);
  return room;
}

struct eps_record *eps_room_return(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  if (rec->room) eps->update_bytes -= state_bytes(eps, rec);
  rec->room = false;
  struct eps_record *next = waiting_take(eps);
  pthread_mutex_unlock(&eps->lock);
  return next;
}

struct eps_record *eps_turn_pass(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  turn_pass(eps, rec);
  struct eps_record *next = waiting_take(eps);
  pthread_mutex_unlock(&eps->lock);
  return next;
}

/* The tier holds the records on the host alone (one on the device keeps its state there). */
static bool tiered(const struct eps_record *rec) { return rec->placement != EPS_PLACE_DEVICE; }

/* Under the lock: the state a record holds in memory or on disk, or will from this step's
   update on (a record of the last step still updating has it: its arrays are the
   worker's until it settles). */
static bool has_state(const struct eps_record *rec) {
  return rec->pending || rec->state[0] != NULL || rec->spilled ||
         (rec->update_due && rec->expected > 0);
}

/* Which records keep their state in memory by the tier's choice (the others' written out
   now), and the first reads of the step's due records queued. */
static l2l_status ahead_begin(struct eps *eps, const struct host_tier *tier) {
  /* On one process the last step's updates have all begun (their reads are taken) once
     its arrivals are counted; with ranks an update begins once its exchange has summed the
     gradient, which may come later: those are waited for. A read nobody took (an update
     skipped) is dropped. An update of the last step may still run. */
  pthread_mutex_lock(&eps->lock);
  for (int i = 0; eps->dist && i < eps->count; i++)
    while (eps->records[i]->pending) pthread_cond_wait(&eps->changed, &eps->lock);
  pthread_mutex_unlock(&eps->lock);
  eps_ahead_drop_all(eps);
  uint64_t kept = 0;
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    if (!tiered(rec)) continue;
    pthread_mutex_lock(&eps->lock);
    bool keep = host_tier_keeps(tier, &kept, has_state(rec) ? state_bytes(eps, rec) : 0);
    rec->keep_state = keep;   /* a running update reads it as it ends, and spills or not */
    bool settled = !rec->pending;
    pthread_mutex_unlock(&eps->lock);
    if (!keep && settled && rec->state[0] != NULL) TRY(eps_state_out(eps, rec));
  }
  int n = 0;
  pthread_mutex_lock(&eps->lock);   /* (a waiting update of the last step may be taken now) */
  if (eps->count > eps->lists_cap) {
    struct eps_record **list = realloc(eps->ahead, (size_t)eps->count * sizeof *list);
    if (list != NULL) eps->ahead = list;
    struct eps_record **wait = list ? realloc(eps->waiting, (size_t)eps->count * sizeof *wait) : NULL;
    if (wait != NULL) eps->waiting = wait;
    bool *passed = wait ? realloc(eps->turn_passed, (size_t)eps->count * sizeof *passed) : NULL;
    if (passed != NULL) eps->turn_passed = passed, eps->lists_cap = eps->count;
    if (passed == NULL) {
      pthread_mutex_unlock(&eps->lock);
      return FAIL(L2L_ERR_NOMEM, "no memory for the spill file's read-ahead lists");
    }
  }
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    rec->turn = -1;
    if (tiered(rec) && rec->update_due && rec->expected > 0) eps->ahead[n++] = rec;
  }
  eps_sort_by_completion(eps->ahead, n);
  /* (with ranks the last step's updates have all begun: the turns start again) */
  for (int i = 0; i < n; i++) eps->ahead[i]->turn = i, eps->turn_passed[i] = false;
  eps->turn_next = 0;
  eps->ahead_n = n;
  ahead_fill(eps);
  pthread_mutex_unlock(&eps->lock);
  return L2L_OK;
}

/* Every byte of rec's accumulator is zero (a fresh one, or one whose update cleared it). */
static bool grad_is_zero(const struct eps_record *rec) {
  const unsigned char *b = l2l_tensor_data(rec->grad);
  size_t n = (size_t)l2l_tensor_numel(rec->grad) * sizeof(float);
  /* the first byte zero and each byte equal to the next: memcmp's vector loop, where a
     byte loop with an early exit stays scalar (a model's first step reads them all) */
  return n == 0 || (b[0] == 0 && memcmp(b, b + 1, n - 1) == 0);
}

/* rec's accumulator, which holds nothing, gives its pages back. */
static void grad_give_back(struct eps *eps, struct eps_record *rec) {
  pool_zero_pages(L2L_POOL_HOST, l2l_tensor_data(rec->grad),
                  (uint64_t)l2l_tensor_numel(rec->grad) * sizeof(float));
  pthread_mutex_lock(&eps->lock);
  rec->grad_away = true;
  pthread_mutex_unlock(&eps->lock);
}

/* With a spill file, before the budget's check: which accumulators may pass this step
   (host_grad_passes; rec->grad_passing until the tier says whether they do), and the
   pages of those that expect no gradient given back when they hold nothing (a frozen
   layer's). A record of the last step still updating is cleared as its update ends. */
static void grads_candidates(struct eps *eps) {
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    pthread_mutex_lock(&eps->lock);
    bool passes = tiered(rec) &&   /* (one on the device never passes) */
                  host_grad_passes(true, eps->defer, rec->update_due, rec->users, rec->expected);
    bool idle = tiered(rec) && !rec->pending && !rec->grad_away;   /* (never read: the device's) */
    pthread_mutex_unlock(&eps->lock);
    if (idle && rec->expected == 0 && grad_is_zero(rec)) grad_give_back(eps, rec);
    pthread_mutex_lock(&eps->lock);
    rec->grad_passing = passes;
    pthread_mutex_unlock(&eps->lock);
  }
}

/* The accumulators pass: each that may and is in memory gives its pages back if it holds
   nothing (a layer's fresh one, or one cleared while they did not pass); one that holds a
   gradient (a script wrote into it) does not pass. Whether any stopped passing. */
static bool grads_release(struct eps *eps) {
  bool changed = false;
  for (int i = 0; i < eps->count; i++) {
    struct eps_record *rec = eps->records[i];
    pthread_mutex_lock(&eps->lock);
    bool check = tiered(rec) && rec->grad_passing && !rec->pending && !rec->grad_away;
    pthread_mutex_unlock(&eps->lock);
    if (!check) continue;
    if (grad_is_zero(rec)) {
      grad_give_back(eps, rec);
      continue;
    }
    pthread_mutex_lock(&eps->lock);
    rec->grad_passing = false;
    pthread_mutex_unlock(&eps->lock);
    changed = true;
  }
  return changed;
}

/* The tier over the EPS's records as they are (under the lock): an accumulator that may
   pass is the window's; any other in memory through the step counts as fixed (*fixed: the
   bytes in memory whatever the budget, with them when they do not pass). */
static void host_tier_now(struct eps *eps, struct host_tier *tier, uint64_t *fixed_out) {
  uint64_t fixed = 0, state = 0, largest = 0, passing = 0, passing_total = 0;
  pthread_mutex_lock(&eps->lock);
  for (int i = 0; i < eps->count; i++) {
    const struct eps_record *rec = eps->records[i];
    struct host_record b = eps_record_bytes(eps, rec);
    uint64_t bytes = has_state(rec) ? b.state : 0;
    fixed += b.fixed;
    if (rec->grad_passing) {
      passing = b.grad > passing ? b.grad : passing;
      passing_total += b.grad;
    } else if (rec->expected > 0 || (!rec->grad_away && !rec->pending)) {
      fixed += b.grad;
    }
    state += bytes;
    largest = bytes > largest ? bytes : largest;
  }
  pthread_mutex_unlock(&eps->lock);
  host_tier_plan(tier, fixed, state, largest, passing, passing_total, eps->host_budget,
                 eps->spill != NULL);
  *fixed_out = fixed + (tier->grads_pass ? 0 : passing_total);
}

l2l_status eps_host_plan(struct eps *eps) {
  struct host_tier tier;
  uint64_t fixed;
  if (eps->spill) grads_candidates(eps);
  host_tier_now(eps, &tier, &fixed);
  if (tier.grads_pass && grads_release(eps)) host_tier_now(eps, &tier, &fixed);
  pthread_mutex_lock(&eps->lock);
  for (int i = 0; !tier.grads_pass && i < eps->count; i++) eps->records[i]->grad_passing = false;
  eps->grads_pass = tier.grads_pass;
  pthread_mutex_unlock(&eps->lock);
  if (eps->host_budget > 0 && tier.need > eps->host_budget) {
    char a[32], b[32], c[32], d[32];
    l2l_status status = FAIL(L2L_ERR_BUDGET,
                "the relay's host budget of %llu bytes (%s) is below the %llu (%s) its EPS "
                "needs: %s of masters, staging copies and gradient accumulators in memory "
                "through the step%s %s of %s",
                (unsigned long long)eps->host_budget, core_human_bytes(a, sizeof a, eps->host_budget),
                (unsigned long long)tier.need, core_human_bytes(b, sizeof b, tier.need),
                core_human_bytes(c, sizeof c, fixed), eps->spill ? ", and" : " and",
                core_human_bytes(d, sizeof d, tier.need - fixed),
                eps->spill ? "the windows (the largest record's optimizer state twice, one read "
                             "ahead and one updating, and the largest passing accumulator once)"
                           : "optimizer state: a spill directory (" NAMED_CONFIG(spill_dir) ") keeps it "
                             "on disk instead");
    error_note_needed(status, tier.need);   /* (the smallest host budget that works) */
    return eps->spill ? status : error_note_field(status, "spill_dir");
  }
  pthread_mutex_lock(&eps->lock);
  eps->ahead_limit = tier.window;
  eps->grad_limit = tier.grad_window;
  pthread_mutex_unlock(&eps->lock);
  return eps->spill ? ahead_begin(eps, &tier) : L2L_OK;
}

void eps_set_host_budget(struct eps *eps, uint64_t bytes) {
  pthread_mutex_lock(&eps->lock);
  eps->host_budget = bytes;
  pthread_mutex_unlock(&eps->lock);
}

/* Brings a spilled record's state back to host memory for its update: the read ahead
   when there is one (the next read then queued), else read now; a failure leaves it on
   disk. */
static l2l_status state_in(struct eps *eps, struct eps_record *rec) {
  pthread_mutex_lock(&eps->lock);
  bool spilled = rec->spilled, ahead = rec->ahead == AHEAD_QUEUED;
  if (ahead) eps->ahead_bytes -= state_bytes(eps, rec);   /* its update's from here */
  if (spilled && !ahead) eps->reads_late++;
  rec->ahead = AHEAD_TAKEN;
  ahead_fill(eps);
  pthread_mutex_unlock(&eps->lock);
  if (!spilled) return L2L_OK;
  int arrays = optim_state_count(&eps->optimizer);
  l2l_tensor *fresh[2] = {NULL, NULL};
  l2l_status status = L2L_OK;
  for (int a = 0; a < arrays; a++) {
    l2l_status done = ahead ? eps_spill_wait(&rec->ahead_io[a])
                            : status == L2L_OK ? eps_spill_read_state(eps, rec, a, &fresh[a]) : status;
    if (ahead) fresh[a] = rec->ahead_state[a], rec->ahead_state[a] = NULL;
    if (status == L2L_OK) status = done;
  }
  if (status != L2L_OK) {
    l2l_tensor_free(fresh[0]);
    l2l_tensor_free(fresh[1]);
    return status;
  }
  for (int a = 0; a < arrays; a++) rec->state[a] = fresh[a];
  pthread_mutex_lock(&eps->lock);
  rec->spilled = false;
  pthread_mutex_unlock(&eps->lock);
  return L2L_OK;
}

/* A spill failure on a worker: the first is kept for the step to report. */
void eps_io_failed(struct eps *eps, l2l_status status) {
  if (status == L2L_OK) return;
  pthread_mutex_lock(&eps->lock);
  if (eps->io_status == L2L_OK) {
    eps->io_status = status;
    snprintf(eps->io_message, sizeof eps->io_message, "%s", l2l_last_error());
  }
  pthread_mutex_unlock(&eps->lock);
}

l2l_status eps_io_status(struct eps *eps) {
  pthread_mutex_lock(&eps->lock);
  l2l_status status = eps->io_status;
  char message[sizeof eps->io_message];
  memcpy(message, eps->io_message, sizeof message);
  eps->io_status = L2L_OK;
  pthread_mutex_unlock(&eps->lock);
  return status == L2L_OK ? L2L_OK : core_fail(status, "%s", message);
}

void eps_spill_counts(struct eps *eps, struct eps_spill_counts *out) {
  *out = (struct eps_spill_counts){0};
  if (eps->spill) {
    out->read = atomic_load(&eps->spill->read);
    out->written = atomic_load(&eps->spill->written);
    pthread_mutex_lock(&eps->spill->lock);
    out->file = eps->spill->used;
    pthread_mutex_unlock(&eps->spill->lock);
  }
  pthread_mutex_lock(&eps->lock);
  out->late = eps->reads_late;
  out->grad_waits = eps->grad_waits;
  pthread_mutex_unlock(&eps->lock);
}

l2l_status eps_spill_state(struct eps *eps, const char *dir) {
  if (eps->spill) return FAIL(L2L_ERR_STATE, "the optimizer state spills already (to %s)", eps->spill->path);
  struct eps_spill *sp = calloc(1, sizeof *sp);
  if (sp == NULL) return FAIL(L2L_ERR_NOMEM, "no memory for a spill file");
  char found[1024];
  /* (4 threads where the pool serves: bench/spill_io.c's transfers moved fastest with
     four, with no fewer than one at every size) */
  l2l_status status = eps_spill_open(sp, dir, EPS_SPILL_ENGINE_ANY, 4, found, sizeof found);
  if (status != L2L_OK) {
    free(sp);
    return status;
  }
  if (found[0]) fprintf(stderr, "l2l: warning: %s\n", found);
  eps->spill = sp;
  int moved = 0;
  for (; moved < eps->count && status == L2L_OK; moved++)
    if (tiered(eps->records[moved])) status = eps_state_out(eps, eps->records[moved]);
  if (status == L2L_OK) return L2L_OK;
  for (int i = 0; i < moved; i++)
    if (tiered(eps->records[i])) state_in(eps, eps->records[i]);   /* as it was */
  eps->reads_late = 0;
  eps->spill = NULL;
  eps_spill_close(sp);
  free(sp);
  return status;
}

/* With a spill file: rec's state in memory for its update (read back, or zero for its
   first). */
l2l_status eps_state_for_update(struct eps *eps, struct eps_record *rec) {
  TRY(state_in(eps, rec));
  for (int a = 0; a < optim_state_count(&eps->optimizer); a++) {
    if (rec->state[a] != NULL) continue;
    TRY(eps_state_new(&rec->state[a], rec, L2L_POOL_HOST));
    TRY(l2l_tensor_fill(rec->state[a], 0.0));
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- an accumulator cleared */

void eps_grad_clear(struct eps *eps, struct eps_record *rec, bool zeroed) {
  if (rec->placement == EPS_PLACE_DEVICE) {   /* (none of it in host memory) */
    eps_io_failed(eps, eps_device_clear(rec));
    return;
  }
  eps_held_free(rec);   /* (the gradients held beside it go with it) */
  void *g = l2l_tensor_data(rec->grad);
  uint64_t bytes = (uint64_t)l2l_tensor_numel(rec->grad) * sizeof(float);
  if (eps->spill == NULL) {
    if (!zeroed) memset(g, 0, bytes), eps_count_bytes(eps, bytes);
    return;
  }
  pthread_mutex_lock(&eps->lock);
  bool give = eps->grads_pass && !zeroed;
  pthread_mutex_unlock(&eps->lock);
  if (give) pool_zero_pages(L2L_POOL_HOST, g, bytes);   /* (the EPS's tensors are host memory) */
  else if (!zeroed) memset(g, 0, bytes), eps_count_bytes(eps, bytes);
  pthread_mutex_lock(&eps->lock);
  if (rec->grad_counted) eps->grad_bytes -= eps_record_bytes(eps, rec).grad;
  rec->grad_counted = false;
  rec->grad_away |= give;
  pthread_cond_broadcast(&eps->changed);   /* an arrival may wait for the room */
  pthread_mutex_unlock(&eps->lock);
}

/* ---------------------------------------------------------------- a record's state restored */

/* The arrays checked and converted by quant.c; the tier's part here: a read ahead of the
   old state dropped first (stale), the new state written out after (kept in memory if it
   cannot go: nothing lost). */
l2l_status eps_restore(const char *func, struct eps *eps, struct eps_record *rec,
                       int64_t updates, const l2l_tensor *first, const l2l_tensor *second) {
  const l2l_tensor *given[2] = {first, second};
  int arrays = 0;
  TRY(eps_restore_check(func, eps, rec, updates, given, &arrays));
  l2l_tensor *fresh[2] = {NULL, NULL};
  if (eps->spill) eps_ahead_drop(eps, rec);   /* a read of the old state is stale */
  TRY(eps_restore_convert(func, rec, arrays, given, fresh));
  bool device = rec->placement == EPS_PLACE_DEVICE;   /* copied into its arrays there */
  l2l_status status = device ? eps_device_restore(rec, fresh) : L2L_OK;
  for (int a = 0; a < 2; a++) {
    l2l_tensor_free(device ? fresh[a] : rec->state[a]);
    if (!device) rec->state[a] = fresh[a];
    l2l_tensor_free(rec->gathered[a]);   /* (a copy of the old) */
    rec->gathered[a] = NULL;
  }
  TRY(status);
  rec->updates = updates;
  rec->spilled = false;
  return eps->spill && arrays > 0 && !rec->keep_state && !device ? eps_state_out(eps, rec) : L2L_OK;
}

/* ---------------------------------------------------------------- a record leaving the tier */

l2l_status eps_move_ready(struct eps_record *rec, bool to_device) {
  struct eps *eps = rec->eps;
  pthread_mutex_lock(&eps->lock);   /* (its last update settled: the caller synced) */
  while (rec->pending) pthread_cond_wait(&eps->changed, &eps->lock);
  pthread_mutex_unlock(&eps->lock);
  if (to_device && eps->spill) {   /* its state read back from the file, its regions given back */
    eps_ahead_drop(eps, rec);   /* (a read nobody took) */
    int arrays = optim_state_count(&eps->optimizer);
    if (rec->spilled) {
      l2l_tensor *fresh[2] = {NULL, NULL};
      l2l_status status = L2L_OK;
      for (int a = 0; a < arrays && status == L2L_OK; a++)
        status = eps_spill_read_state(eps, rec, a, &fresh[a]);
      if (status != L2L_OK) {
        l2l_tensor_free(fresh[0]), l2l_tensor_free(fresh[1]);
        return status;
      }
      for (int a = 0; a < arrays; a++) rec->state[a] = fresh[a];
      pthread_mutex_lock(&eps->lock);
      rec->spilled = false;   /* (in memory now, whether the move is made or not) */
      pthread_mutex_unlock(&eps->lock);
    }
    for (int a = 0; rec->spill_reserved && a < arrays; a++)
      eps_spill_release(eps->spill, rec->spill_at[a], eps_array_bytes(rec));
    rec->spill_reserved = false;
  }
  return L2L_OK;
}
