/* SPDX-License-Identifier: MIT */
/* relay.h — what the relay's files share (private to src/relay/).
 *
 * Purpose: the relay object, a step's state, the jobs its copy threads run, and the
 * functions one file of the relay calls in another. The relay runs a model one layer at
 * a time on the device pool, micro-batch by micro-batch, with the parameters streamed
 * from the EPS (see l2l.h, "the relay"). A step is a list of layer visits made before
 * anything runs (src/order): forward 0 .. L-2, the head (forward and backward of each
 * micro-batch at once: the turnaround), then backward L-2 .. lowest, with rebuild visits
 * (a forward rerun of a stretch of layers) before a backward whose input boundary was
 * dropped. While a visit computes on the compute thread (visits.c), the host-to-device
 * thread copies the next visit's parameters (slots.c) and the next micro-batch's stashed
 * input (acts.c), the device-to-host thread stashes outputs and sends finished gradients
 * to the EPS (transfer.c), and the EPS's workers update layers whose gradient is
 * complete. step.c drives a step; relay.c is the object, its dynamic architecture and
 * its restores.
 * Every device tensor of a step is made and freed by the compute thread, at points of its
 * own choosing, so device memory never depends on when a copy thread gets to run.
 * Must never: change a layer, a record or the EPS when a step is refused (every check
 * runs before the first visit; updates only begin in backward), let a copy thread touch
 * Lua (custom layers run on the compute thread only), keep more than two micro-batches of
 * a host-stashed boundary on the device, or read a record other than through eps.h's
 * accessors.
 */
#ifndef L2L_RELAY_H
#define L2L_RELAY_H

#include "backend/backend.h"
#include "cluster/cluster.h"
#include "eps/eps.h"
#include "layers/layers.h"
#include "order/order.h"

#define RELAY_MAGIC 0x6c326c72u  /* "l2lr" */
enum { MAX_RECORDS = 16, MAX_PARAM_SLOTS = 4096, THREAD_COMPUTE = 0, THREAD_H2D = 1,
       THREAD_D2H = 2 };
/* The timeline sums busy seconds by these numbers (core.h). */
_Static_assert((int)THREAD_D2H < (int)L2L_TIMELINE_THREADS &&
               (int)L2L_PHASE_ALL_GATHER < (int)L2L_TIMELINE_PHASES,
               "the timeline's sums must reach the relay's threads and every phase");
/* The loss scales the arithmetic carries. A gradient is unscaled (times 1/scale, and a
   global clipping factor) before anything squares it, in f32: 1/scale must stay a normal
   f32 with room for that factor, so scale <= 2^100 (1/scale >= 2^-100, 26 binades above
   f32's smallest normal), and at 2^100 gradients up to 2^28 still fit in f32 (a larger one
   is an overflow: the dynamic scale halves). 2^-64 keeps 1/scale = 2^64 as far from f32's
   largest. */
#define MIN_LOSS_SCALE 0x1p-64
#define MAX_LOSS_SCALE 0x1p100
/* The largest count a restore takes: 2^53 - 1, the largest integer a checkpoint's JSON
   holds exactly, where l2l.load caps the counts it reads (lua/l2l/checkpoint.lua's
   EXACT_MAX) and checkpoint.c the counts and sizes it reads and writes. Steps and updates
   count on from a restored count by one at a time, so a cap this far below int64's end
   keeps every later count an int64 (issue 47: INT64_MAX - 1 updates overflowed two steps
   later). */
#define COUNT_MAX ((INT64_C(1) << 53) - 1)

/* Where the plan applied last put a layer's own records, which placement auto follows
   (auto_plan.c): none said (no plan, or one for other placements), home, the device. */
enum relay_planned { PLANNED_NONE, PLANNED_HOME, PLANNED_DEVICE };

struct relay_layer {
  l2l_layer *layer;
  bool frozen;
  l2l_stash_policy stash;     /* the boundary before it (its input) */
  l2l_inner_policy inner;
  enum relay_planned planned;
};

struct l2l_relay {
  uint32_t magic;
  /* The public call running on the relay (its function name), NULL when none: a relay
     takes one call at a time (relay_enter). */
  _Atomic(const char *) in_call;
  l2l_relay_config config;   /* config.spill_dir is spill_dir below (the caller's copied) */
  char *spill_dir;
  /* The last training step's replayed device peak and what it depended on (budget.c). */
  uint64_t budget_key, budget_peak;
  bool budget_key_set;
  /* The plan l2l_relay_plan_auto applied and what it was made for (auto_plan.c). */
  l2l_plan *auto_plan;
  int64_t auto_key[6];   /* batch, seq, token_types, key_mask, relay budget, pool budget */
  /* Placement auto: what the records' placement was chosen for (auto_plan.c). */
  uint64_t place_key;
  bool place_key_set;
  struct relay_layer *layers;
  int count, cap;
  struct eps eps;
  struct core_queue h2d, d2h;
  struct core_timeline timeline;
  int64_t steps, updates;     /* every step is one minibatch of an accumulation */
  /* Dynamic loss scaling (config.loss_scale > 0): the scale, updates since it last
     changed, updates skipped for an overflow. */
  double scale;
  int64_t scale_good, skipped;
  l2l_relay_stats stats;
  /* The device bytes this relay's steps make and free (bound on the compute thread for a
     step, and by the swap jobs): stats.device_peak is the pool's bytes when the step
     began plus the most this meter rose in it. */
  struct pool_meter device_meter;
  uint64_t device_at_start;   /* the pool's bytes in use when the step began */
  int64_t meter_at_start;     /* the meter's then */
  /* Filled by jobs on the copy threads; read between steps. */
  pthread_mutex_t lock;
  uint64_t h2d_bytes, d2h_bytes, stash_now, stash_peak;
  l2l_status async_status;    /* a job nobody waits for failed (gradients out) */
  char async_message[256];
  bool warned_nonfinite;      /* a non-finite gradient's skip has been said on stderr */
  struct eps_spill_counts spill_at;   /* the spill file's counts when the step began */
  uint64_t pass_bytes_at;             /* the EPS's pass bytes then */
};

/* Whether the plan was made for the relay's layers as they are and its settings
   (plan_check_model: L2L_ERR_INVALID naming the first difference). */
l2l_status relay_check_plan(const l2l_relay *run, const l2l_plan *plan);
/* The plan's micro-batch and per-layer policies into a relay entered (l2l_relay_apply_plan). */
l2l_status relay_apply_plan(l2l_relay *run, const l2l_plan *plan);

static inline bool relay_ok(const l2l_relay *run) {
  return run != NULL && run->magic == RELAY_MAGIC;
}

/* One call at a time. Every public function of the relay enters before it reads or
   changes anything and leaves when it returns; a call that finds another running (from
   a layer's callback inside a step, or from another thread) is refused with
   L2L_ERR_STATE and changes nothing. It never waits: a callback waiting for its own
   step would wait forever. `func` names the caller in messages. */
l2l_status relay_enter(const l2l_relay *run, const char *func);
void relay_leave(const l2l_relay *run);
static inline void relay_leave_at(l2l_relay *const *run) {
  if (*run != NULL) relay_leave(*run);
}
/* Enters for the rest of the calling function: relay_leave runs on every return (the
   cleanup attribute of GCC and Clang), so the many early returns of a check stay simple. */
#define RELAY_ENTER_AS(run, func)           \
  TRY(relay_enter((run), (func)));          \
  l2l_relay *const relay_entered_ __attribute__((cleanup(relay_leave_at))) = (l2l_relay *)(run)
#define RELAY_ENTER(run) RELAY_ENTER_AS(run, __func__)

/* Binds the relay's device meter to the calling thread for the rest of the function. */
static inline void relay_meter_restore(struct pool_meter *const *before) {
  pool_meter_bind(*before);
}
#define RELAY_METER_BIND(run)                                                              \
  struct pool_meter *const relay_meter_before_ __attribute__((cleanup(relay_meter_restore))) = \
      pool_meter_bind(&(run)->device_meter)

/* ---------------------------------------------------------------- jobs of the copy threads */

/* dst := src on a copy thread. The tensors stay the queuing thread's: it frees them
   after waiting, at points of its choosing, so device memory does not depend on when a
   copy thread gets to run. */
struct copy_job {
  struct core_job job;
  l2l_relay *run;
  l2l_tensor *dst, *src;
  int layer, micro_batch, phase;
  struct core_stamp done;  /* a copy onto the device: its end on the device's clock
                             (copy_wait takes it) */
};

/* A saved state moved between the device and pinned host memory on a copy thread
   (KARMA's swap). */
struct swap_job {
  struct core_job job;
  l2l_relay *run;
  l2l_saved *saved;
  l2l_pool_kind pool;
  int layer, micro_batch, phase;
};

/* A layer's parameters into their device tensors, after the layer's pending updates. */
struct params_job {
  struct core_job job;
  l2l_relay *run;
  int layer, nrec;
  struct eps_record *rec[MAX_RECORDS];
  l2l_tensor *value[MAX_RECORDS];
  int64_t updates[MAX_RECORDS];   /* each record's update count when copied */
  bool device[MAX_RECORDS];       /* the record lives on the device: value is a view of it,
                                     nothing copied (eps_on_device) */
  int slot;                       /* the parameter slot it fills */
  bool releases;                  /* a frozen layer's rebuild: each record's hold released
                                     once copied (eps_step's holds) */
  struct core_stamp done;          /* as copy_job's */
};

/* A visit's gradients out to the EPS: copied to pinned buffers the EPS then owns and
   adds up on its workers. When the device pool is host memory (the CPU backend) there is
   nothing to copy: this thread adds the gradient slot into the EPS's accumulators
   directly, which saves a pass over the gradient and a buffer, and leaves the slot zero.
   Gradients rounded to a 16-bit grad_precision come from the out slot instead, and the
   EPS widens them as it adds. The compute thread waits for this job before the gradient
   slot serves another visit. */
struct grads_job {
  struct core_job job;
  l2l_relay *run;
  int layer, nrec;
  float clip;                 /* per-layer clipping, 0: off */
  bool host_readable;         /* the step's host_device: absorb (and zero) in place */
  bool drains;                /* every gradient is the f32 slot's (none rounded to 16 bits):
                                 absorbing in place leaves the whole slot zero */
  struct eps_record *rec[MAX_RECORDS];
  l2l_tensor *grad[MAX_RECORDS];
};

/* ---------------------------------------------------------------- a step's state */

/* One micro-batch's activations (or their gradients) at one boundary. */
struct act {
  l2l_tensor *dev;            /* on the device (NULL when only on the host) */
  l2l_tensor *host;           /* the host stash (pinned) */
  struct copy_job *in;        /* host -> dev in flight */
  struct copy_job *out;       /* dev -> host in flight, dev kept (ORDER_OUT_BOTH): waited
                                 for before dev is freed */
};

/* One micro-batch's rows of the batch fields a layer reads, on the device. */
/* A batch's fields as tensors of the relay's own (each NULL where the batch has none). */
struct batch_fields {
  l2l_tensor *tokens, *types, *targets, *mask;
};

/* The micro-batch's rows of the fields its layer reads, on the device. */
struct mb_inputs {
  struct batch_fields f;
  l2l_layer_batch batch;
};

struct param_slot {
  l2l_tensor *t;
  int64_t updates[MAX_RECORDS];   /* its layer's records' update counts when copied */
};

struct step {
  l2l_relay *run;
  const l2l_relay_batch *in;
  bool training;
  bool place_wanted;          /* with ranks: some rank's placement auto places again */
  int64_t B, S, D, mb, nmb;
  int L;                      /* active layers */
  int *active;                /* -> index in run->layers */
  struct act **x;             /* x[k][u]: input of active layer k (k >= 1) */
  struct act **g;             /* g[k][u]: gradient of the loss for x[k][u] */
  l2l_saved ***saved;         /* saved[k][u] of keep and swap layers */
  struct swap_job ***swap;    /* swap[k][u] in flight */
  uint8_t **where;            /* where[k][u]: 1 while saved[k][u] is on the host */
  struct act scratch;         /* the output of a recomputing backward's forward */
  struct mb_inputs mb_in;     /* the micro-batch's batch fields the visit's layer reads */
  /* The batch's fields copied into pinned memory when the step begins: a micro-batch's
     rows go to the device from here queued (backend_tensor_copy_queued), so the host never
     waits for the device on them. Freed when the step is (after its last wait). */
  struct batch_fields staged;
  /* losses[u]: the head's per-target losses of micro-batch u, copied back to pinned
     memory queued; summed into loss_sum in micro-batch order (the order the head is
     called in) when the step's last wait has passed (relay_step_free). */
  l2l_tensor **losses;
  struct order order;      /* the visits and their order (src/order) */
  int visit_layer;            /* the visit running: its layer's index in run->layers */
  /* The visit running and the next one's parameters. */
  struct params_job *params[2];
  l2l_tensor *grads[MAX_RECORDS];
  int ngrads;
  /* Parameter slots (config.param_slots, each the size of the largest layer): the visit
     running holds one while the next visit's parameters copy into the least recently
     used other one. A slot remembers the active layer it holds (-1: nothing reusable) at
     its records' update counts, so a visit whose layer is still there as the EPS has it
     now copies nothing: with two slots (L2L's double buffer) the last block's backward
     right after the head and a layer's backward after its own rebuild; each more slot
     keeps one more of the forward's last layers for the backward. */
  struct param_slot *pslots;
  struct order_slot *slot_use;   /* per slot: the layer it holds, when last chosen */
  int nslots;
  int64_t slot_ticks;         /* counts slot choices, for least recently used */
  /* Two gradient slots, the size of a parameter slot: visit i computes into slot
     gs = i % 2 while the other's gradients go out to the EPS. With a 16-bit
     grad_precision, each has an out slot for the 16-bit copies that leave the device. */
  l2l_tensor *gslot[2], *gout_slot[2];
  struct grads_job *gout[2];  /* the gradients out of the last visit of each slot */
  int gs;
  /* Device memory the host can read (the CPU backend): the copy thread adds a gradient
     slot into the EPS and zeroes it in the same pass, so a slot is all zero between
     visits (gzero) and the next visit need not clear it. False on a GPU, and on the CPU
     backend with L2L_GRADS_OUT=copy: gradients leave by a copy into pinned memory that
     the EPS owns (the GPU's path, proven on the CPU: test_relay.c). */
  bool host_device, gzero[2];
  struct copy_job *out[2];    /* stash-outs in flight (oldest first) */
  double loss_sum;
  int64_t real;               /* targets that count (with ranks: in the whole minibatch) */
  int64_t sample_base;        /* with ranks: the global index of this slice's first sample */
  double exposed_comm;        /* waits for MPI (stats.exposed_comm_seconds) */
  float loss_scale;           /* the loss gradient's seed (see relay_run) */
  float clip_layer;           /* per-layer clipping, in the loss scale's units */
  double compute, wait_copy, wait_update, exposed_copy;
  /* The compute thread's work and its waits for copies, between stamps: on the timeline
     and in compute / exposed_copy once the step is done and the device's clock can be
     read (stamped_resolve), against the anchor taken as the step began. */
  struct core_stamp anchor;
  struct stamped *stamped;
  int64_t nstamped, stamped_cap;
};

/* The step's thread waited from t0 until now: for a copy, an update or the ranks (MPI).
   Counted in the step's sum for that cause and told to the profile. */
static inline void relay_waited(struct step *s, enum profile_wait cause, double t0) {
  double t1 = core_now();
  *(profile_wait_is_copy(cause) ? &s->wait_copy
    : cause == L2L_WAIT_UPDATE  ? &s->wait_update
                                : &s->exposed_comm) += t1 - t0;
  profile_wait(cause, t0, t1);
}

/* One unit of the compute thread's work (or of its waiting for a copy) on the device's
   clock: on a GPU the host only queues kernels, so its clock says when they were queued,
   not when they ran. */
struct stamped {
  struct core_stamp start, end;
  int layer, micro_batch, phase;
};

static inline struct relay_layer *active_layer(const struct step *s, int k) {
  return &s->run->layers[s->active[k]];
}

/* ---------------------------------------------------------------- transfer.c */

void relay_copy_job_free(struct copy_job *cj);
l2l_status relay_copy_queue(struct copy_job **out, l2l_relay *run, struct core_queue *q,
                            l2l_tensor *dst, l2l_tensor *src, int layer, int micro_batch,
                            int phase);
void relay_copy_thread_push(struct core_queue *q, struct core_job *job);
void relay_count_bytes(l2l_relay *run, uint64_t *counter, uint64_t bytes);
void relay_count_stash(l2l_relay *run, int64_t bytes);
void relay_grads_release(struct core_job *job);
void relay_grads_run(struct core_job *job, int thread);
void relay_params_job_free(struct params_job *pj);
void relay_params_run(struct core_job *job, int thread);
l2l_status relay_swap_queue(l2l_relay *run, struct core_queue *q, struct swap_job **slot,
                            l2l_saved *saved, l2l_pool_kind pool, int layer, int64_t u);
/* (the step's thread's wait, told to the profile as one for activations in or out) */
l2l_status relay_swap_wait(struct step *s, struct swap_job **slot);
uint64_t relay_tensor_bytes(const l2l_tensor *t);
l2l_status relay_tensor_like(l2l_tensor **out, l2l_pool_kind pool, const l2l_tensor *t);

/* ---------------------------------------------------------------- state.c */

void relay_act_free(l2l_relay *run, struct act *a);
void relay_stamped_add(struct step *s, struct core_stamp *start, struct core_stamp *end,
                       int layer, int micro_batch, int phase);
void relay_stamped_resolve(struct step *s);
l2l_status relay_step_alloc(struct step *s);
void relay_step_free(struct step *s);

/* ---------------------------------------------------------------- checks.c */

l2l_status relay_check_step(struct step *s, const l2l_relay_batch *in);
/* The model's shape: an embedding first, a head last, body layers between, one width. */
l2l_status relay_check_model(const l2l_relay *run);

/* ---------------------------------------------------------------- budget.c */

l2l_status relay_check_budget(const struct step *s);

/* ---------------------------------------------------------------- slots.c */

l2l_status relay_copy_wait(struct step *s, struct core_job *job, struct core_stamp *done,
                           enum profile_wait cause, int layer, int micro_batch);
void relay_grads_wait(struct step *s, int slot);
l2l_status relay_params_bind(struct step *s, int k, bool grads);
l2l_status relay_params_done(struct step *s, int k, bool give);
l2l_status relay_params_queue(struct step *s, int which, int visit);
l2l_status relay_slots_new(struct step *s);
/* Whether the device's memory is the host's as the relay treats it: the CPU backend's,
   unless L2L_GRADS_OUT=copy makes it a GPU's (gradients copied out, small f32 masters the
   device reads in pinned memory); false on a GPU. Read as each step begins (host_device)
   and as the relay is made (where its masters live: only a test changes it between). */
bool relay_device_is_host(void);

/* ---------------------------------------------------------------- acts.c */

l2l_status relay_act_on_device(struct step *s, struct act *a, int layer, int64_t u,
                               l2l_tensor **out);
l2l_status relay_act_prefetch(struct step *s, struct act *a, int layer, int64_t u);
l2l_status relay_act_release_device(struct step *s, struct act *a);
l2l_status relay_act_stash_out(struct step *s, struct act *a, int layer, int64_t u,
                               enum order_out how);
void relay_compute_done(struct step *s, int layer, int64_t u, int phase,
                        struct core_stamp *start);
l2l_status relay_mb_inputs(struct step *s, struct mb_inputs *m, int k, int64_t u, bool training);
void relay_mb_inputs_free(struct mb_inputs *m);
/* The batch's fields into pinned memory (s->staged), when the step's arrays are made. */
l2l_status relay_batch_stage(struct step *s);
void relay_batch_fields_free(struct batch_fields *b);
/* Micro-batch u's per-target losses copied back to pinned memory, queued (s->losses[u]). */
l2l_status relay_loss_queue(struct step *s, int64_t u, const l2l_tensor *losses);
int64_t relay_mb_rows(const struct step *s, int64_t u);
l2l_status relay_new_activation(struct step *s, l2l_tensor **out, int64_t u);
l2l_status relay_out_throttle(struct step *s, int keep);

/* ---------------------------------------------------------------- visits.c */

/* The step's schedule from its active layers' policies. */
l2l_status relay_schedule(struct step *s);
/* What a step's device replay depends on, hashed (budget.c): its shape, the options
   marked STEP, each active layer's policies and memory statement, and (placement) where
   its records live. */
uint64_t relay_step_key(const struct step *s, bool placement);
/* Placement auto (auto_plan.c): before a training step, the records of its layers moved
   to the device or the host as the planner places them within the device budget (plan_place),
   again only when what the placement depends on changed (relay_place_wanted; with ranks
   when it did on any rank: s->place_wanted). With ranks, after the exchange of sizes and
   collective: every rank places within its own budget, and where they differ again within
   the groups every rank placed, until all place alike. A failure moves nothing. */
bool relay_place_wanted(const struct step *s);
l2l_status relay_place_auto(struct step *s);
/* A relay layer as the planner takes it: its policies, and its records on the device as
   they are (budget.c). */
struct plan_layer relay_plan_layer(const l2l_relay *run, const struct relay_layer *rl);
/* The records of layers[0 .. L) moved between the host and the device as their on_device
   bits say (bit r: record r of that layer on the device), every move prepared before any
   is made (relay.c). */
l2l_status relay_move_records(l2l_relay *run, const struct plan_layer *layers, int L);
/* A layer's records on the device as the EPS keeps them (bit r: its record r). */
uint32_t relay_on_device(const l2l_relay *run, const l2l_layer *layer);
l2l_status relay_run_visits(struct step *s);

/* ---------------------------------------------------------------- relay.c */

/* Waits for pending work (gradients out, updates) and says whether any of it failed. */
l2l_status relay_sync_now(l2l_relay *run);
/* The restores of l2l.h ("checkpoints") for a caller that has entered the relay already
   (checkpoint.c); messages name func, the public call. */
l2l_status relay_restore_param(l2l_relay *run, const char *func, const l2l_param *param,
                               int64_t updates, const l2l_tensor *first, const l2l_tensor *second);
l2l_status relay_restore_progress(l2l_relay *run, const char *func, int64_t steps, int64_t updates);
l2l_status relay_restore_loss_scale(l2l_relay *run, const char *func, double scale, int64_t good,
                                    int64_t skipped);

/* ---------------------------------------------------------------- describe.c */

/* A checkpoint's description (describe.c states the document): what the relay writes of
   itself, and the checks of a file's description against the relay, each naming the first
   difference (messages without the file's path: the caller adds it). */
struct json_t;   /* jansson's */
/* What a file says of a layer beyond its constructor: -1 where it says nothing. */
struct layer_saved {
  int rng_id, frozen, inner, stash;
};
/* A number as the description holds it (a JSON number, or {"__f64": "<digits>"}); a whole
   one in [lo, hi] (within 2^53). */
bool relay_json_number(const struct json_t *v, double *out);
bool relay_json_whole(const struct json_t *v, int64_t lo, int64_t hi, int64_t *out);
/* The relay's options, optimizer and schedule as the front end names them. */
l2l_status relay_describe_options(struct json_t **out, const l2l_relay *run);
/* A file's "relay" against the relay: every option that changes the numbers the same.
   source: where the description is from, in a message ("the file", "options->relay"). */
l2l_status relay_check_options(const l2l_relay *run, const struct json_t *relay, const char *source);
/* Layer i's kind and constructor options (tied: a head whose projection is an earlier
   layer's record); its rng id, frozen flag and policies set on a description d. */
l2l_status relay_describe_layer(struct json_t **out, const l2l_relay *run, int i, bool tied);
l2l_status relay_describe_layer_state(struct json_t *d, const l2l_relay *run, int i);
/* A file's description of layer i against the relay's: the same kind and options; what
   it says of the layer's rng id, flag and policies into *out. */
l2l_status relay_check_layer(const l2l_relay *run, int i, const struct json_t *d,
                             struct layer_saved *out, const char *source);

/* ---------------------------------------------------------------- step.c */

l2l_status relay_check_async(l2l_relay *run);

/* ---------------------------------------------------------------- ranks (agree.c) */

/* A digest of everything the ranks must hold alike for this step (agree.c says what). */
int64_t relay_agreement_digest(const struct step *s);
/* With ranks whose digests differ (every rank calls it): their descriptions exchanged,
   and L2L_ERR_INVALID naming the first difference between this rank and another. */
l2l_status relay_explain_disagreement(const struct step *s);

#endif /* L2L_RELAY_H */
