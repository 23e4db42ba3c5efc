/* SPDX-License-Identifier: MIT */
/* search.c — the fastest policy that fits: the micro-batch, and per layer what backward
 * keeps and where its input boundary waits.
 *
 * Purpose: choose among everything the relay can do. Per layer the choices that can pay
 * are five modes: keep (the saved state stays on the device; the input boundary is then
 * not read again), swap (it goes to the host and back), or recompute with the input
 * boundary on the device, on the host, or dropped and rebuilt. The embedding always
 * keeps (its saved state is empty: recomputing it reruns its forward for nothing); the
 * head's input waits on the device or the host.
 * For each micro-batch size (ceil(B / n) for a ladder of counts n: see `ladder`) the
 * candidates are the start policies (`start_policy`: the uniform ones, L2L's default,
 * recompute with a host stash, among them, and periodic checkpointing, every p-th
 * boundary kept, those between dropped and rebuilt: Chen et al.'s sqrt(n) schedule and
 * its kin), and the answer of a knapsack over layers: every mode's cost in
 * time and in device bytes is measured against the leanest policy by the exact time
 * model and peak replay (layers of one kind and place share their measurement), and a
 * dynamic programme keeps the Pareto front of (added bytes, time) and takes the fastest
 * within the budget. Peaks do not add exactly (they are maxima over a step), so the
 * answer is checked by the replay: over budget, the programme runs again with the
 * overshoot taken off. Then the two fastest sizes (and any within 25 % of the fastest)
 * are polished: single-layer changes that pay by the layer's own measure, and changes of
 * two unlike neighbours at once, taken while they make the step faster and still fit.
 * The least peak of the start policies at micro-batch 1 is what a refusal names
 * (plan_least_peak): every search judges them, so a budget that passes has a plan.
 * What makes it affordable: a policy is timed first (a walk that adds) and its peak
 * replayed only where its time could be taken; a size whose floor (what every policy
 * holds at once: peak.c) is over the budget is passed over after one replay.
 * On small chains it comes within 0.5 % of what a brute force over every policy finds
 * in all but 1 chain in 11,000, and within 1.2 % in every one of 80,000 (test_plan_search).
 * Must never: return a plan whose replayed peak exceeds the budget.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

enum mode { M_KEEP, M_SWAP, M_DEV, M_HOST, M_DROP, MODES };
/* POLISH_TRIALS bounds one size's polish: a 188-layer chain whose knapsack left many short
   runs took 45,000 trials (26 s) climbing one layer at a time; the first hundreds take
   nearly all the gain. PLAN_POLISH_SEARCH (plan.h) bounds a search's: the two fastest
   sizes take up to POLISH_TRIALS each, and the others within reach polish in order of their
   time while any is left (48 blocks at a batch of 65536 had 24 sizes within reach: 9,700
   trials, five times the rest of the search, 15 s for l2l.plan with placement auto). */
enum { FRONT_MAX = 4096, RETRIES = 8, POLISH_TRIALS = 400 };
_Static_assert(PLAN_POLISH_SEARCH >= 2 * POLISH_TRIALS, "the two fastest sizes' polish");
_Atomic int64_t plan_polish_trials;
bool plan_search_shortcuts = true;

static void set_mode(struct plan_layer *pl, int k, int L, enum mode m) {
  if (k == 0) {                       /* the embedding: no input boundary, nothing to redo */
    pl->inner = L2L_INNER_KEEP;
    pl->stash = L2L_STASH_DEVICE;
    return;
  }
  if (k == L - 1) {                   /* the head: only where its input waits */
    pl->inner = L2L_INNER_RECOMPUTE;
    pl->stash = m == M_HOST ? L2L_STASH_HOST : L2L_STASH_DEVICE;
    return;
  }
  static const l2l_inner_policy inner[MODES] = {L2L_INNER_KEEP, L2L_INNER_SWAP, L2L_INNER_RECOMPUTE,
                                                L2L_INNER_RECOMPUTE, L2L_INNER_RECOMPUTE};
  static const l2l_stash_policy stash[MODES] = {L2L_STASH_DEVICE, L2L_STASH_DEVICE, L2L_STASH_DEVICE,
                                                L2L_STASH_HOST, L2L_STASH_RECOMPUTE};
  pl->inner = inner[m];
  pl->stash = stash[m];
}

/* The modes layer k may take. */
static bool mode_allowed(int k, int L, enum mode m) {
  if (k == 0) return m == M_KEEP;
  if (k == L - 1) return m == M_DEV || m == M_HOST;
  return true;
}

/* Layer k's mode in the uniform policy of mode u (where a layer cannot take u: the
   embedding keeps, the head's input waits on the host). */
static enum mode uniform_mode(int k, int L, enum mode u) {
  return mode_allowed(k, L, u) ? u : k == 0 ? M_KEEP : M_HOST;
}

struct judge {
  struct plan_chain *c;
  const struct plan_layer_costs *costs;
  const l2l_plan_rates *rates;
  enum mode *modes;
  const int *same_as;   /* per layer: the first layer alike to it (itself if none before) */
};

/* The chain under `modes`: its time and peak (exact: the models'). The time is the cheap
   half (a walk that adds; the peak is a replay, or three): a policy no faster than `beat`
   cannot be taken, so its peak is not replayed (*peak = UINT64_MAX, over any budget);
   INFINITY replays every peak. */
static l2l_status judge(struct judge *j, const enum mode *modes, double beat, double *seconds,
                        uint64_t *peak) {
  for (int k = 0; k < j->c->L; k++) set_mode(&j->c->layers[k], k, j->c->L, modes[k]);
  *seconds = plan_step_seconds(j->c, j->costs, j->rates, NULL, NULL);
  if (*seconds < 0) return FAIL(L2L_ERR_NOMEM, "no memory to time a plan");
  *peak = UINT64_MAX;
  bool could = beat == INFINITY || !(*seconds >= beat);   /* (an infinite or NaN time too) */
  return could || !plan_search_shortcuts ? plan_peak(peak, j->c) : L2L_OK;
}

l2l_status plan_leanest_peak(uint64_t *peak, struct plan_chain *c) {
  c->micro_batch = 1;
  for (int k = 0; k < c->L; k++)
    set_mode(&c->layers[k], k, c->L, uniform_mode(k, c->L, M_HOST));
  TRY(plan_chain_memo(c));
  return plan_peak(peak, c);
}

/* Two layers cost alike when they are of one kind and shape and sit alike (first body
   layer, last body layer, or between). */
static bool alike(const struct plan_chain *c, int a, int b) {
  if (a == 0 || b == 0 || a == c->L - 1 || b == c->L - 1) return a == b;
  if ((a == 1) != (b == 1) || (a == c->L - 2) != (b == c->L - 2)) return false;
  l2l_layer_config x, y;
  l2l_layer_get_config(&x, c->layers[a].layer);
  l2l_layer_get_config(&y, c->layers[b].layer);
  return memcmp(&x, &y, offsetof(l2l_layer_config, init_seed)) == 0 &&
         strcmp(l2l_layer_name(c->layers[a].layer), l2l_layer_name(c->layers[b].layer)) == 0;
}

/* The policies every size's search starts from, i = 0, 1, ...: the uniform ones in the
   order of enum mode (the leanest, L2L's default, at i = M_HOST), then checkpointing every
   p-th boundary (Chen et al.'s sqrt(n) schedule and its kin; p from 2 to 6, then half again
   each time: the knapsack and the polish fine-tune what these start), the boundaries
   between kept ones dropped and rebuilt, a run at a time, the kept ones on the device, then
   on the host. Into modes[]; false past the last. */
static bool start_policy(enum mode *modes, int L, int i) {
  if (i < MODES) {
    for (int k = 0; k < L; k++) modes[k] = uniform_mode(k, L, (enum mode)i);
    return true;
  }
  int period = 2;
  for (int n = (i - MODES) / 2; n > 0 && period < L; n--) period += period < 6 ? 1 : period / 2;
  if (period >= L) return false;
  bool host = (i - MODES) % 2;
  for (int k = 0; k < L; k++)
    modes[k] = k == 0 ? M_KEEP : k == L - 1 ? M_HOST : k % period == 0 ? (host ? M_HOST : M_DEV) : M_DROP;
  return true;
}

l2l_status plan_least_peak(uint64_t *peak, struct plan_chain *c) {
  int L = c->L, chosen = M_HOST;
  enum mode *modes = calloc((size_t)L, sizeof *modes);
  if (modes == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  c->micro_batch = 1;
  l2l_status status = plan_chain_memo(c);
  *peak = UINT64_MAX;
  for (int i = 0; status == L2L_OK && start_policy(modes, L, i); i++) {
    for (int k = 0; k < L; k++) set_mode(&c->layers[k], k, L, modes[k]);
    uint64_t p;
    status = plan_peak(&p, c);
    if (status == L2L_OK && (p < *peak || (p == *peak && i == M_HOST))) *peak = p, chosen = i;
  }
  start_policy(modes, L, chosen);
  for (int k = 0; k < L; k++) set_mode(&c->layers[k], k, L, modes[k]);
  free(modes);
  return status;
}

/* ---------------------------------------------------------------- the programme */


struct entry {
  double seconds;
  double bytes;          /* added device bytes */
  int from, mode;        /* the previous layer's front entry, this layer's mode */
};

static bool before(const struct entry *x, const struct entry *y) {
  return x->bytes < y->bytes || (x->bytes == y->bytes && x->seconds < y->seconds);
}

/* The fastest modes whose added bytes stay within `room`, by the per-layer costs
   dt[k][m], db[k][m]; false when none does. */
static bool knapsack(enum mode *out, int L, double (*dt)[MODES], double (*db)[MODES], double room) {
  struct entry **front = calloc((size_t)L, sizeof *front);
  int *size = calloc((size_t)L, sizeof *size);
  struct entry *scratch = malloc(sizeof *scratch * FRONT_MAX * MODES);
  bool ok = front && size && scratch;
  for (int k = 0; ok && k < L; k++) {
    int n = 0, prev = k == 0 ? 1 : size[k - 1];
    /* The previous front is in order of bytes, so each mode's extensions of it are too:
       merging the MODES lists puts every candidate in order of bytes (then seconds)
       without a sort (a sort of up to 5 x 4096 entries per layer was most of the time of
       planning 800 layers). */
    int at[MODES] = {0};
    for (;;) {
      struct entry pick = {0};
      int from = -1;
      for (int m = 0; m < MODES; m++) {
        if (!isfinite(dt[k][m]) || at[m] >= prev) continue;
        int e = at[m];
        struct entry cand = {(k ? front[k - 1][e].seconds : 0) + dt[k][m],
                             (k ? front[k - 1][e].bytes : 0) + db[k][m], e, m};
        if (cand.bytes > room) {   /* the rest of this list is larger still */
          at[m] = prev;
          continue;
        }
        if (from < 0 || before(&cand, &pick)) pick = cand, from = m;
      }
      if (from < 0) break;
      scratch[n++] = pick;
      at[from]++;
    }
    /* the Pareto front: as bytes grow, only entries faster than every smaller one */
    int kept = 0;
    double best = INFINITY;
    for (int i = 0; i < n; i++)
      if (scratch[i].seconds < best - 1e-15) {
        best = scratch[i].seconds;
        scratch[kept++] = scratch[i];
      }
    /* too long a front: keep entries evenly spread in bytes (the fastest always) */
    if (kept > FRONT_MAX) {
      int step = (kept + FRONT_MAX - 1) / FRONT_MAX, m = 0;
      for (int i = 0; i < kept; i += step) scratch[m++] = scratch[i];
      if (scratch[m - 1].seconds != scratch[kept - 1].seconds) scratch[m - 1] = scratch[kept - 1];
      kept = m;
    }
    front[k] = malloc(sizeof **front * (size_t)(kept > 0 ? kept : 1));
    if (front[k] == NULL || kept == 0) ok = false;
    else memcpy(front[k], scratch, sizeof *scratch * (size_t)kept);
    size[k] = kept;
  }
  if (ok) {
    int e = size[L - 1] - 1;   /* the fastest: last in order of bytes */
    for (int k = L - 1; k >= 0; k--) {
      out[k] = (enum mode)front[k][e].mode;
      e = front[k][e].from;
    }
  }
  for (int k = 0; front && k < L; k++) free(front[k]);
  free(front), free(size), free(scratch);
  return ok;
}

/* ---------------------------------------------------------------- one micro-batch size */

struct choice {
  enum mode *modes;
  double seconds;
  uint64_t peak;
  bool found, polished;
  double (*dt)[MODES];   /* each layer's modes' time against the leanest policy */
};

static void consider(struct choice *best, const enum mode *modes, int L, double seconds,
                     uint64_t peak, uint64_t budget) {
  if (peak > budget || (best->found && seconds >= best->seconds)) return;
  memcpy(best->modes, modes, (size_t)L * sizeof *modes);
  best->seconds = seconds, best->peak = peak, best->found = true;
}

/* What a policy must beat to be taken by consider(): the best so far (none yet: any). */
static double to_beat(const struct choice *best) { return best->found ? best->seconds : INFINITY; }

/* Whether layer k may be skipped in a pass of single-layer changes: inside a run of alike
   layers in one mode, only the run's ends are tried (a change anywhere in the run costs
   the same time; at an end it moves the fewest bytes past a neighbour). */
static bool inside_run(const struct plan_chain *c, const enum mode *modes, int k) {
  return k > 0 && k + 1 < c->L && alike(c, k - 1, k) && alike(c, k, k + 1) &&
         modes[k - 1] == modes[k] && modes[k + 1] == modes[k];
}

/* Tries trial[] against the best; true when it is faster and fits (then it is the best).
   Counts the trial against *left (none left: nothing is tried). */
static bool try_modes(struct judge *j, struct choice *best, const enum mode *trial, uint64_t budget,
                      l2l_status *status, int *left) {
  if (*left <= 0) return false;
  --*left;
  plan_polish_trials++;
  double s, beat = best->seconds * (1 - 1e-9);
  uint64_t p;
  *status = judge(j, trial, beat, &s, &p);
  if (*status != L2L_OK || p > budget || s >= beat) return false;
  consider(best, trial, j->c->L, s, p, budget);
  return true;
}

/* Changes of one layer, then of two unlike neighbours at once (a layer's output waits
   where the next one's policy says: some pairs only pay together), that are faster and
   fit, taken while any remain and *left (trials) lasts. */
static l2l_status polish(struct judge *j, struct choice *best, uint64_t budget, int *left_out) {
  int L = j->c->L;
  enum mode *trial = calloc((size_t)L, sizeof *trial);
  if (trial == NULL) return FAIL(L2L_ERR_NOMEM, "no memory to plan");
  l2l_status status = L2L_OK;
  int left = *left_out;
  for (bool better = best->found; better && status == L2L_OK && left > 0;) {
    better = false;
    for (int k = 0; k < L && status == L2L_OK; k++) {
      if (inside_run(j->c, best->modes, k)) continue;
      for (int m = 0; m < MODES && status == L2L_OK; m++) {
        /* only modes that pay by the layer's own measure: the rest cost it more time */
        if (!mode_allowed(k, L, (enum mode)m) || best->modes[k] == (enum mode)m ||
            best->dt[k][m] >= best->dt[k][best->modes[k]])
          continue;
        memcpy(trial, best->modes, (size_t)L * sizeof *trial);
        trial[k] = (enum mode)m;
        better |= try_modes(j, best, trial, budget, &status, &left);
      }
    }
    /* pairs where the kind or the place changes (the embedding and the first block, the
       last block and the head, ...): inside a run of alike layers one change at a time
       already finds what pays */
    for (int k = 0; k + 1 < L && !better && status == L2L_OK; k++) {
      if (alike(j->c, k, k + 1)) continue;
      for (int a = 0; a < MODES && status == L2L_OK; a++)
        for (int b = 0; b < MODES && status == L2L_OK; b++) {
          if (!mode_allowed(k, L, (enum mode)a) || !mode_allowed(k + 1, L, (enum mode)b) ||
              best->modes[k] == (enum mode)a || best->modes[k + 1] == (enum mode)b)
            continue;
          memcpy(trial, best->modes, (size_t)L * sizeof *trial);
          trial[k] = (enum mode)a, trial[k + 1] = (enum mode)b;
          better |= try_modes(j, best, trial, budget, &status, &left);
        }
    }
  }
  free(trial);
  *left_out = left;
  return status;
}

/* For the chain's micro-batch (c->micro_batch set): the start policies and the
   programme's answer, the best of them into `best`. A size whose floor (plan_peak_floor:
   what every policy holds) is over the budget has no policy that fits, so nothing more is
   judged there (where a tight budget leaves few sizes that fit, as placement auto's
   searches do, most of a search's sizes were judged some 57 times for nothing). */
static l2l_status programme(struct judge *j, struct choice *best, uint64_t budget) {
  struct plan_chain *c = j->c;
  int L = c->L;
  enum mode *modes = calloc((size_t)L, sizeof *modes), *trial = calloc((size_t)L, sizeof *trial);
  double (*dt)[MODES] = best->dt, (*db)[MODES] = calloc((size_t)L, sizeof *db);
  l2l_status status = modes && trial && dt && db ? L2L_OK : FAIL(L2L_ERR_NOMEM, "no memory to plan");
  double base_s = 0;
  uint64_t base_p = 0;
  /* the leanest policy (L2L's default), then the start policies in order (on a tie in time
     the first considered stays) */
  uint64_t floor = 0;
  if (status == L2L_OK) {
    for (int k = 0; k < L; k++) modes[k] = uniform_mode(k, L, M_HOST);
    status = judge(j, modes, INFINITY, &base_s, &base_p);
  }
  if (status == L2L_OK) status = plan_peak_floor(&floor, c);
  if (status == L2L_OK && floor > budget && plan_search_shortcuts) {
    free(modes), free(trial), free(db);
    return L2L_OK;
  }
  for (int i = 0; status == L2L_OK && start_policy(modes, L, i); i++) {
    double s = base_s;
    uint64_t p = base_p;
    if (i != M_HOST) status = judge(j, modes, to_beat(best), &s, &p);
    if (status == L2L_OK) consider(best, modes, L, s, p, budget);
  }
  /* each layer's modes against the leanest policy, one per kind of layer */
  for (int k = 0; k < L && status == L2L_OK; k++) {
    int same = j->same_as[k] < k ? j->same_as[k] : -1;
    for (int m = 0; m < MODES; m++) {
      if (!mode_allowed(k, L, (enum mode)m)) {
        dt[k][m] = INFINITY;
        continue;
      }
      if (same >= 0) {
        dt[k][m] = dt[same][m], db[k][m] = db[same][m];
        continue;
      }
      for (int i = 0; i < L; i++) trial[i] = i == 0 ? M_KEEP : M_HOST;
      trial[k] = (enum mode)m;
      double s;
      uint64_t p;
      status = judge(j, trial, INFINITY, &s, &p);
      if (status != L2L_OK) break;
      dt[k][m] = s - base_s;
      db[k][m] = (double)p - (double)base_p;
    }
  }
  /* the programme, with the overshoot of its last answer taken off the room it has */
  double room = (double)budget - (double)base_p;
  for (int r = 0; r < RETRIES && status == L2L_OK && room >= 0; r++) {
    if (!knapsack(modes, L, dt, db, room)) break;
    double s;
    uint64_t p;
    status = judge(j, modes, INFINITY, &s, &p);   /* (the overshoot steers the next answer) */
    if (status != L2L_OK) break;
    if (p <= budget) {
      consider(best, modes, L, s, p, budget);
      break;
    }
    room -= (double)(p - budget);
  }
  free(modes), free(trial), free(db);
  return status;
}

/* ---------------------------------------------------------------- every micro-batch size */

/* The micro-batch sizes tried: ceil(B / n) for counts n of micro-batches in [lo, hi] on a
   ladder: every count up to EVERY_COUNT, then counts growing by 1/`spread` of themselves
   (and n = B: one sample a micro-batch, the leanest there is, when hi reaches it). Every
   distinct size is about 2 sqrt(B) of them (a batch of 2^20 took minutes): the search
   first takes a coarse ladder (counts doubling: 8 + log2(B / 8) sizes, 29 at 2^24), then
   a fine one (an eighth apart) between the coarse neighbours of its two fastest sizes.
   Appends to sizes[*count] (room: its length; sizes NULL counts only), skipping sizes
   already there. */
enum { EVERY_COUNT = 8 };
static void ladder(int64_t *sizes, int *count, int room, int64_t batch, int64_t lo, int64_t hi,
                   int spread) {
  for (int64_t n = lo; n <= hi && n <= batch && !(sizes && *count >= room);) {
    int64_t mb = (batch + n - 1) / n;
    bool seen = false;
    for (int i = 0; sizes && i < *count && !seen; i++) seen = sizes[i] == mb;
    if (!seen) {
      if (sizes && *count < room) sizes[*count] = mb;
      (*count)++;
    }
    if (n == batch) break;
    int64_t next = n < EVERY_COUNT ? n + 1 : n + (n / spread > 1 ? n / spread : 1);
    n = next > batch && n < hi ? batch : next;   /* the last count reaches B */
  }
}

/* The count of micro-batches of size mb. */
static int64_t count_of(int64_t batch, int64_t mb) { return (batch + mb - 1) / mb; }

/* Whether size i's plan beats size j's (j < 0: none yet). Times from rates alone grow with
   the rows, so sizes often tie in arithmetic and differ only in rounding (sums taken in
   another order): within a part in 10^9 the larger micro-batch wins (in practice the faster:
   fuller GEMMs, fewer launches), so the choice does not follow rounding noise. */
static bool faster(const struct choice *choices, const int64_t *sizes, int i, int j) {
  if (j < 0) return true;
  double a = choices[i].seconds, b = choices[j].seconds;
  if (a < b * (1 - 1e-9)) return true;
  return a <= b * (1 + 1e-9) && sizes[i] > sizes[j];
}

l2l_status plan_search(struct plan_result *out, struct plan_chain *c, const l2l_plan_rates *rates,
                       uint64_t budget) {
  int L = c->L;
  double *layer_seconds = out->layer_seconds;
  *out = (struct plan_result){.layer_seconds = layer_seconds};
  int64_t B = c->batch;
  int nsizes = 0, fine = 0;
  ladder(NULL, &nsizes, 0, B, 1, B, 1);
  ladder(NULL, &fine, 0, INT64_MAX / 4, EVERY_COUNT, 4 * EVERY_COUNT, 8);   /* a fine ladder over 4x */
  int room = nsizes + 2 * fine;
  int64_t *sizes = calloc((size_t)room, sizeof *sizes);
  struct choice *choices = calloc((size_t)room, sizeof *choices);
  struct plan_layer_costs *costs = calloc((size_t)L, sizeof *costs);
  int *same_as = calloc((size_t)L, sizeof *same_as);
  l2l_status status = sizes && choices && costs && same_as ? L2L_OK : FAIL(L2L_ERR_NOMEM, "no memory to plan");
  for (int i = 0; i < room && status == L2L_OK; i++) {
    choices[i].modes = calloc((size_t)L, sizeof(enum mode));
    choices[i].dt = calloc((size_t)L, sizeof *choices[i].dt);
    if (choices[i].modes == NULL || choices[i].dt == NULL) status = FAIL(L2L_ERR_NOMEM, "no memory to plan");
  }
  /* layers that cost alike share their measurements (one pass: alike is transitive) */
  for (int k = 0; k < L && status == L2L_OK; k++) {
    same_as[k] = k;
    for (int i = 0; i < k && same_as[k] == k; i++)
      if (same_as[i] == i && alike(c, i, k)) same_as[k] = i;
  }
  struct judge j = {c, costs, rates, NULL, same_as};
  /* the coarse ladder through the programme, then fine ones around its two fastest */
  nsizes = 0;
  if (status == L2L_OK) ladder(sizes, &nsizes, room, B, 1, B, 1);
  int done = 0;
  for (int pass = 0; pass < 2 && status == L2L_OK; pass++) {
    for (int i = done; i < nsizes && status == L2L_OK; i++) {
      c->micro_batch = sizes[i];
      status = plan_chain_memo(c);
      if (status == L2L_OK) status = plan_layer_costs(costs, c, rates);
      /* timing a layer at this size takes device memory the budget does not have: no plan
         at this size would fit either (its peak holds that layer's working memory) */
      if (status == L2L_ERR_BUDGET) {
        l2l_clear_error();
        status = L2L_OK;
        continue;
      }
      if (status == L2L_OK) status = programme(&j, &choices[i], budget);
    }
    done = nsizes;
    if (pass == 1) break;
    int best[2] = {-1, -1};
    for (int i = 0; i < nsizes; i++) {
      if (!choices[i].found) continue;
      if (faster(choices, sizes, i, best[0])) best[1] = best[0], best[0] = i;
      else if (faster(choices, sizes, i, best[1])) best[1] = i;
    }
    for (int b = 0; b < 2 && best[b] >= 0; b++) {
      int64_t n = count_of(B, sizes[best[b]]);
      ladder(sizes, &nsizes, room, B, n / 2 > 1 ? n / 2 : 1, 2 * n, 8);
    }
  }
  /* polished: the two fastest sizes, and others within 25 % of the fastest, fastest first,
     while the search's trials last (near ties between sizes are common, and the polish may
     turn them) */
  double fastest = INFINITY;
  for (int i = 0; i < nsizes; i++)
    if (choices[i].found && choices[i].seconds < fastest) fastest = choices[i].seconds;
  int search_left = PLAN_POLISH_SEARCH;
  for (int round = 0; status == L2L_OK && search_left > 0; round++) {
    int pick = -1;
    for (int i = 0; i < nsizes; i++)
      if (choices[i].found && !choices[i].polished && (pick < 0 || choices[i].seconds < choices[pick].seconds))
        pick = i;
    if (pick < 0 || (round >= 2 && choices[pick].seconds > 1.25 * fastest)) break;
    c->micro_batch = sizes[pick];
    status = plan_chain_memo(c);
    if (status == L2L_OK) status = plan_layer_costs(costs, c, rates);
    int left = search_left < POLISH_TRIALS ? search_left : POLISH_TRIALS, given = left;
    if (status == L2L_OK) status = polish(&j, &choices[pick], budget, &left);
    search_left -= given - left;
    choices[pick].polished = true;
  }
  int chosen = -1;
  for (int i = 0; i < nsizes && status == L2L_OK; i++)
    if (choices[i].found && faster(choices, sizes, i, chosen)) chosen = i;
  if (status == L2L_OK && chosen >= 0) {
    struct choice *b = &choices[chosen];
    *out = (struct plan_result){.found = true, .micro_batch = sizes[chosen], .seconds = b->seconds,
                                .peak = b->peak, .layer_seconds = layer_seconds};
    c->micro_batch = sizes[chosen];
    for (int k = 0; k < L; k++) set_mode(&c->layers[k], k, L, b->modes[k]);
    status = plan_layer_costs(costs, c, rates);
    if (status == L2L_OK) plan_step_seconds(c, costs, rates, out->layer_seconds, &out->channels);
  }
  for (int i = 0; choices && i < room; i++) free(choices[i].modes), free(choices[i].dt);
  free(sizes), free(choices), free(costs), free(same_as);
  plan_memo_free(c);
  return status;
}
