/* SPDX-License-Identifier: MIT */
/* eps.h — the eager parameter server (internal to libl2l; the relay is its one user).
 *
 * Purpose: per parameter record, what lives on the host between steps: the master (the
 * record's value tensor: f32, or bf16 with the relay's master = bf16), the fp32 gradient
 * accumulator (its grad tensor), the optimizer state (in its precision: quant.c) and the
 * update count. Gradients arrive one layer visit at a time from
 * the device-to-host copy thread; once a record has all the gradients of its minibatch
 * (every trainable user has given), its update is queued on the EPS's worker threads,
 * split into chunks, while the device goes on with earlier layers. The relay waits for a
 * record only when it next copies that record to the device.
 * The staging copy in device precision: with an f32 device, for a parameter that stays
 * f32 on the device, or for a bf16 master, the master itself (a second copy would only
 * cost host memory).
 * With a 16-bit device precision, each low-precision record (a GEMM weight or token
 * table) has a 16-bit staging tensor in the pinned pool, which the workers rewrite from the
 * master at the start of every step (after the record's pending update, if any), so that
 * every transfer moves 16-bit weights and a script's edits of the masters between steps
 * always reach the device.
 * The optimizers are a table (optim.c); gradient norms for clipping, per layer or global,
 * are computed here; the relay reads a record only through the accessors below. A record
 * whose accumulated gradient holds an inf or a NaN is never updated: the pass that adds a
 * gradient in says so, and the update is skipped and the accumulator cleared instead.
 * Must never: include a header of the parts above it (layers, relay): it knows parameter
 * records (l2l.h's handles), never a layer; or run on the compute thread.
 */
#ifndef L2L_EPS_H
#define L2L_EPS_H

#include "backend/backend.h"   /* the optimizers' host kernels */
#include "core/core.h"

/* ---------------------------------------------------------------- optimizers (optim.c) */

/* One update of one chunk of one parameter record, in fp32, by the backend's host kernels
   (backend.h, "the optimizers' arithmetic"): the EPS splits a record into chunks and runs
   them on its worker threads, so each kernel only ever sees [0, n) of its arrays. */
/* One chunk of one wave of a record's update: the arrays from `begin`, n elements. */
struct optim_chunk {
  float *p;                    /* the master */
  float *state[2];             /* the optimizer state arrays (NULL beyond its count) */
  const float *grad;
  int64_t n;
  const struct optim_hyper *h;
  int wave;                    /* 0 .. waves - 1 */
  double *sums;                /* a first wave adds its whole-record sums here (two) */
  const double *record_sums;   /* a later wave reads the sums of every chunk (two) */
};

/* An optimizer: one entry of the table in optim.c. Adding one is its kernels, an entry
   there, its kind in l2l.h and its constructor in lua/l2l/optim.lua. */
struct optimizer_ops {
  const char *name;
  /* Passes over a record: 1, or 2 when the update needs whole-record sums between them
     (LAMB's trust ratio). The EPS starts a wave once every chunk of the last is done. */
  int waves;
  /* State arrays per record (at most 2); the first wave writes them, a later one only
     reads them (compact state is encoded again after the first alone). */
  int (*state_count)(const l2l_optimizer_config *config);
  /* The config's fields of this kind (the shared ones are checked before). */
  l2l_status (*check)(const l2l_optimizer_config *config);
  void (*chunk)(const struct optim_chunk *chunk);
};
/* The table's entry for a kind, or NULL for an unknown kind. */
const struct optimizer_ops *optimizer_ops(l2l_optimizer_kind kind);

/* Config checks: L2L_ERR_INVALID naming the field and its value, or L2L_OK. */
l2l_status optimizer_check(const l2l_optimizer_config *config);
l2l_status schedule_check(const l2l_schedule_config *schedule);
/* State arrays per record (the table's state_count): SGD 1 when momentum > 0 else 0;
   AdamW and LAMB 2; -1 for an unchecked config of an unknown kind. */
int optim_state_count(const l2l_optimizer_config *config);

/* ---------------------------------------------------------------- compact state (quant.c) */

/* One chunk of an update on compact state or a bf16 master, from element `begin` of the
   record's arrays (a multiple of L2L_STATE_BLOCK): chunk's grad and n as for the f32
   kernels (state[] unused). The state is written back after the first wave, the master
   after the last. */
struct eps_compact {
  void *state[2];              /* the state arrays (NULL beyond the optimizer's count), in
                                  chunk->h's state precision */
  int64_t state_n;             /* their elements */
  uint16_t *master;            /* a bf16 master (chunk->h's master) from the chunk's first
                                  element (chunk->p NULL; rounded back by the draws
                                  chunk->h names), or NULL: chunk->p is the f32 master */
};
void eps_compact_chunk(const struct optimizer_ops *optim, const struct optim_chunk *chunk,
                       const struct eps_compact *compact, int64_t begin);

/* ---------------------------------------------------------------- records and steps (eps.c) */

/* A parameter record as the EPS holds it (eps.c); the relay reads it only through the
   accessors below. */
struct eps_record;

struct eps {
  l2l_optimizer_config optimizer;
  uint64_t seed;               /* of a bf16 master's stochastic rounding */
  const struct optimizer_ops *optim;   /* the optimizer's entry of the table */
  l2l_dtype precision;         /* the device's: f32, or f16 / bf16 for staging copies */
  bool pinned_masters;         /* eps_settings' */
  struct eps_record **records;   /* the relay's listing's order (eps_set_records) */
  int count;
  struct core_queue workers;
  struct core_timeline *timeline;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  bool defer;                  /* global clipping: updates wait for eps_step_release */
  bool deferred_step;          /* this step began with defer (which the release clears):
                                  a device record's update is then not flag-skipped */
  /* The words of its records on the device (device.c): words of them, flags (i32) and
     norms (two f64 each, as bytes), and one f32 for the visit's per-layer clipping factor
     (eps_device_clip); words_stale: those records changed since. */
  l2l_tensor *device_flags, *device_norms, *device_clip;
  int words;
  bool words_stale;
  l2l_tensor *flags_back;      /* pinned: the flags queued back before the step's wait */
  bool flags_queued;
  /* The guard copies (eps_device_guard_copies): queued behind a training step's updates
     (guards_queued), then, once that step ended well, current (guards_current) until a
     training step begins or a master is written (eps_record_written). */
  bool guards_queued, guards_current;
  bool add_arrivals;           /* every gradient added as it arrives, none held (eps.c,
                                  "held arrivals"; bench/optim's before) */
  int64_t held_checks;         /* records whose held gradients were checked for their
                                  update, since eps_init (under the lock) */
  int64_t known_zero_checks;   /* ... of them with the accumulator known zero, unread */
  _Atomic uint64_t pass_bytes; /* host memory its passes read and wrote since eps_init
                                  (eps_pass_bytes) */
  int arrivals_in_flight;      /* gradients given and not yet added */
  double lr;
  /* This step's records whose accumulated gradient held an inf or NaN: their updates
     skipped, their accumulators cleared (under the lock); the first one's name and the
     layer whose gradient completed it. */
  int nonfinite_skips;
  const char *nonfinite_name;
  int nonfinite_layer;
  int expects;                 /* eps_expect calls this step */
  /* Data parallel over MPI (exchange.c), NULL on one process. */
  struct eps_dist *dist;
  /* The spill file holding the optimizer state between updates (NULL: host memory), and
     the first failure of its I/O on a worker, for the step to report (io_status). */
  struct eps_spill *spill;
  struct eps_record *gathered_last;   /* the record whose whole state a checkpoint holds */
  l2l_status io_status;
  char io_message[1024];
  /* The host budget (0: none) and what it leaves (state_tier.c, by core's host-tier
     rules, each step): the optimizer state of the records first in this list that fit
     stays in host memory (keep_state); the state of a step's due spilled records is read in the
     order backward completes them (the schedule's: ahead[0 .. ahead_n)), ahead_bytes of
     reads queued or waiting for their update, and update_bytes of state in memory for
     updates under way, each at most ahead_limit (or one record): an update with no room
     waits in `waiting` until one under way ends. With ranks the room goes in that order
     too (each due record's turn: its index in `ahead`, which is its exchange's place):
     turn_next is the first turn not yet passed (turn_passed[i]: record ahead[i] has
     room, needs none or was skipped). Under the lock. */
  uint64_t host_budget, ahead_limit;
  struct eps_record **ahead, **waiting;
  bool *turn_passed;
  int ahead_n, ahead_next, waiting_n, lists_cap, turn_next;
  uint64_t ahead_bytes, update_bytes;
  int64_t reads_late;          /* records whose state was read at their update, not ahead */
  /* With a spill file and a budget that cannot hold every accumulator, they pass: zero
     between updates, an accumulator's pages are given back whenever it is cleared
     (grad_away); a passing one (core's host_grad_passes) comes back at its arrival,
     within grad_limit bytes of passing accumulators in memory at once (grad_bytes; an
     arrival with no room waits for an update to clear one: grad_waits counts them).
     Under the lock. */
  bool grads_pass;             /* this step the accumulators pass (the tier's choice: only
                                  when the budget cannot hold them all) */
  uint64_t grad_limit, grad_bytes;
  int64_t grad_waits;
  /* The relay's step, for a timeout's report: set by the relay as a step begins while the
     last step's updates (and their exchanges) may still run on the workers. */
  _Atomic int64_t step;
};

/* What an EPS is made with: the relay's settings of it. */
struct eps_settings {
  const l2l_optimizer_config *optimizer;   /* checked already */
  l2l_dtype precision;         /* the device's */
  int threads;                 /* the workers' */
  uint64_t seed;               /* a bf16 master's stochastic rounding draws from it */
  struct core_timeline *timeline;
  int dist_lane;               /* >= 0: data parallel over the process's MPI (dist_start
                                  first; eps_dist_start), the exchanges on this lane of
                                  the timeline; -1: one process */
  uint64_t host_budget;        /* eps_set_host_budget's, 0: none */
  const char *spill_dir;       /* the optimizer state spills there (eps_spill_state),
                                  NULL: host memory */
  bool add_arrivals;           /* (bench/optim's baseline) add every gradient as it
                                  arrives: hold none for its update to read */
  bool pinned_masters;         /* a small f32 master the device reads as it is (no
                                  staging copy) lives in pinned memory, as staging copies
                                  do (eps_master_pool): where the device's memory is not
                                  the host's */
};
/* An EPS with no records; a failure leaves nothing to free (collective with ranks). */
l2l_status eps_init(struct eps *eps, const struct eps_settings *settings);
void eps_free(struct eps *eps);
struct eps_record *eps_find(const struct eps *eps, const l2l_param *param);
/* Where a master of `dtype` and `numel` elements lives on the host: in pinned memory when
   the device reads it there (a bf16 master; an f32 one with no staging copy of at most
   EPS_PINNED_F32_MASTER_MAX bytes where settings.pinned_masters), else in host memory.
   `staged`: the record has a staging copy the device reads instead. A small record's copy
   costs its overhead, not its bytes, and from pageable memory it stages through the
   driver and waits for it (the H200's 124M profile: ~0.1 ms a 3 KiB copy); a large f32
   master (an f32 run's weights) stays pageable, so as not to take the pinned pool's cap
   from the staging copies and the buffers each visit makes there. */
enum { EPS_PINNED_F32_MASTER_MAX = 1 << 20 };
l2l_pool_kind eps_master_pool(const struct eps *eps, l2l_dtype dtype, bool staged, int64_t numel);
/* What the EPS keeps of a parameter, read from it by the caller (the relay): the EPS
   never calls into the layers part. `param` is the record's key; `name` is borrowed and
   lives as long as the parameter; master and grad are its host tensors (the master f32 or
   bf16, in the pool eps_master_pool names; the grad f32), or device ones (`device`). */
struct eps_record_source {
  l2l_param *param;
  const char *name;
  l2l_tensor *master, *grad;
  bool decays;          /* weight decay applies (unless the optimizer decays all) */
  bool device;          /* placed on the device: master and grad are device tensors (f32),
                           its state and 16-bit copy are made there, and it is updated
                           there (device.c); else the host's (the EPS's workers) */
  l2l_dtype staging;    /* its staging copy's dtype, the 16 bits the device reads (the
                           layers' rule, layers_record_dtypes); L2L_F32: none, the master
                           is what the device reads */
  uint64_t stream;      /* a bf16 master's draws for stochastic rounding: the record's own */
  int users;            /* the relay's layers that hold it (>= 1) */
};
/* Between steps (after eps_sync): the EPS's records become those listed, in that
   order: the relay's model as layers_records lists it (src/layers/records.c: each record
   once, at its first user, layer by layer; the one rule the planner and the checkpoint
   use too), so the EPS keeps no rule of its own for which parameters are records. A
   record listed that the EPS holds keeps its master, state, stream and update count
   (only its users change); a new one starts with no optimizer state (and a staging tensor
   when the source names its dtype); one no longer listed leaves, its state freed. A failure (no memory, a shard
   beyond MPI's counts, a record listed twice) changes nothing; *failed is then the index
   of the source it came from (-1: none). */
l2l_status eps_set_records(struct eps *eps, const struct eps_record_source *sources,
                           int n, int *failed);
uint64_t eps_host_bytes(const struct eps *eps);
/* The device bytes of its records placed on the device (core's device_record_bytes). */
uint64_t eps_device_bytes(const struct eps *eps);
/* A record's move between the host and the device (placement auto), between steps (after
   eps_sync), in two halves so that a failure changes nothing: prepare makes every tensor
   of its new place (master and gradient accumulator copied, f32 optimizer state copied or
   zero, a 16-bit copy; its flag goes with it; a state in the spill file read back first,
   which stays in memory whatever the move does; with ranks the state of the new place's
   shard: to the device the whole record's, gathered from every rank's shard, so prepare
   is then collective: every rank moves the same records in the same order; to the host
   this rank's part); commit makes them the record's (the old state,
   copy freed) and hands the new master and grad to the caller, to give the
   parameter (which frees the old ones: they are its own); drop frees a prepared move. */
struct eps_move {
  bool to_device;
  l2l_tensor *master, *grad, *staging, *state[2], *guard_copy;
  int64_t shard_begin, shard_n;   /* its shard there (with ranks the device's: all of it) */
};
l2l_status eps_move_prepare(struct eps_move *m, struct eps_record *rec, bool to_device);
void eps_move_commit(struct eps_move *m, struct eps_record *rec, l2l_tensor **master,
                     l2l_tensor **grad);
void eps_move_drop(struct eps_move *m);
/* The EPS's arrays of its records' words on the device (device.c) made anew when those
   records have changed (a record joined, left or moved: eps->words_stale), each record's
   flag kept (one that came from the host brings its nonfinite); at once after the change
   (eps_set_records; the relay's moves), and, if that failed, as the next training step
   begins (eps_prepare: its failure refuses the step). A failure changes nothing. */
l2l_status eps_device_words(struct eps *eps);
/* The flags of the step's armed updates on the device queued back to pinned memory, behind
   the step's work (before its one wait for the device), so that the step's end reads them
   there without a wait of its own. On the relay's compute thread. */
void eps_device_flags_queue(struct eps *eps);
/* The host copies of the 1-D records on the device (a LayerNorm's weight and bias among
   them) made equal to their masters as a step begins, before anything reads them, so they
   see the last step's updates and whatever a script wrote since: current already when the
   last training step queued them behind its updates (eps_device_guard_copies_queue) and
   no master was written or handed out since; else queued, then one wait for the device
   (none when no such record). A training step's updates leave them stale. The copy of rec
   (NULL: none), borrowed until it leaves or moves: what the relay gives its parameter's
   guard to read. */
l2l_status eps_device_guard_copies(struct eps *eps, bool training);
/* The relay tells, as a step begins, how many times rec's master was written through its
   parameter (l2l_param_write: its value never handed out) in all: news leaves the
   record's staging copy to be made again from it, and the guard copies (before
   eps_device_guard_copies). */
void eps_note_writes(struct eps *eps, struct eps_record *rec, uint64_t writes);
/* The guard copies queued behind a training step's updates, on the compute thread before
   the step's one wait (which sees them done); eps_device_guards_settled(ok) as the step
   ends: current for the next step if it ended well. (Not with ranks: their records on the
   device are updated after that wait.) */
void eps_device_guard_copies_queue(struct eps *eps);
void eps_device_guards_settled(struct eps *eps, bool ok);
const l2l_tensor *eps_guard_copy(const struct eps_record *rec);

/* What the device copies of a record: its staging copy in device precision, or the f32
   master itself (whose shape every copy has). */
const l2l_tensor *eps_device_source(const struct eps_record *rec);
/* Whether rec lives on the device (eps_record_source.device): what the device reads is
   eps_device_source there, bound as it is (no copy), and its gradients are given on the
   compute thread, each visit's as the visit ends (eps_give_gradient with kept = true). */
bool eps_on_device(const struct eps_record *rec);
l2l_param *eps_param(const struct eps_record *rec);
/* The record's updates so far; call between steps (after eps_sync). */
int64_t eps_updates(const struct eps_record *rec);
/* A checkpoint's state for rec: `updates` so far and the optimizer's state arrays
   (NULL beyond the optimizer's count, and all NULL for updates 0), checked against the
   record, then copied in whole before the old state is freed: a refusal changes
   nothing; its message names `func`, the public call. Between steps. */
l2l_status eps_restore(const char *func, struct eps *eps, struct eps_record *rec,
                       int64_t updates, const l2l_tensor *first, const l2l_tensor *second);
/* A checkpoint's load: the record's stream of stochastic rounding draws (a bf16 master's:
   eps_record_source's), from the rng id its layer gets back. Between steps. */
void eps_set_stream(struct eps_record *rec, uint64_t stream);

/* ---------------------------------------------------------------- a step (step.c)

   The relay drives a training step of the EPS through five calls, in this order:
     eps_step_begin      before the first visit: which records expect gradients
     eps_step_agreed     once every rank has begun the step alike (one process: at once)
     eps_give_gradient   each visit's gradients, on the device-to-host thread
     eps_step_release    with deferred updates, once every gradient has been given
     eps_step_end        the outcome (or the step abandoned)
   with, during the visits, eps_release (a frozen rebuild's read made),
   eps_wait_record and eps_settled_updates (a copy to the device waits for its
   record's update), eps_stage (16-bit staging copies); and before a step
   eps_wait_arrivals and eps_io_status (the last step's arrivals counted, its
   failures reported). Records join, leave and are restored between steps (above).
   Where a record's master and optimizer state live is its placement (record.h: the host
   today); a record placed on the device (a later issue) takes the same calls. */
struct eps_step {
  bool update;                 /* this step ends a minibatch accumulation: records update */
  bool defer;                  /* updates wait for eps_step_release (global clipping,
                                  loss scaling) */
  double lr;                   /* this step's learning rate, after the schedule */
  /* One entry per trainable visit of a record, from the lowest layer up and each layer's
     records from its last (the later a record is named, the sooner backward completes it:
     the order of reads ahead and of the ranks' exchanges) */
  l2l_param *const *expect;
  int n_expect;
  /* A record a frozen layer shares with a trainable one must not be updated before a later
     visit of the frozen layer this step (a rebuild) has read it, or the rebuild would not
     reproduce the forward: one entry per such read (nothing for a record no trainable user
     expects); eps_release once the read's copy is made counts it like an arrival (and
     may start the update; a record without a hold left: nothing). */
  l2l_param *const *hold;
  int n_hold;
};
/* Before a step's backward (no worker is busy): every record's counts reset, the expected
   visits and holds counted, missing optimizer state allocated for the records due and the
   host budget checked (with a spill file the first reads ahead queued), so that a failure
   comes before anything has changed (the step then undone). Every param named is a
   record. */
l2l_status eps_step_begin(struct eps *eps, const struct eps_step *step);
/* After a step_begin that succeeded: `go`, every rank began the step (one process: true):
   with ranks the due records get their places on the exchange's streams; else the step is
   undone as a failed begin is. */
void eps_step_agreed(struct eps *eps, bool go);
/* A visit's gradient for rec, scale * grad added into its accumulator; its update starts
   once it is complete. kept = false: grad is pinned and owned by the EPS from here on (f32,
   or a 16-bit gradient the add widens), added on a worker (on the device-to-host thread).
   kept = true: added now on the calling thread from memory the host can read (a device
   tensor of the CPU backend), which the caller keeps: the add leaves an f32 grad zero,
   ready to accumulate the next visit's gradient (a 16-bit one is left as it was). A
   record on the host; one on the device is given by eps_give_device. */
void eps_give_gradient(struct eps *eps, struct eps_record *rec, l2l_tensor *grad,
                       bool kept, float scale, int layer);
/* The same for a record on the device, on the compute thread (queued on the device):
   grad (a device tensor, which the caller keeps) added as it is, or, clipped, times the
   per-layer clipping factor eps_device_clip queued last. */
void eps_give_device(struct eps *eps, struct eps_record *rec, const l2l_tensor *grad,
                     bool clipped, int layer);
/* Per-layer clipping of a visit whose records are on the device: the factor of its n
   gradients (device tensors, all the visit gives) computed on the device into the EPS's
   clip word, for the eps_give_device calls of the visit that follow (nothing read back;
   the host's eps_clip_scale's arithmetic). */
l2l_status eps_device_clip(struct eps *eps, l2l_tensor *const *grads, int n, float clip);
void eps_release(struct eps *eps, struct eps_record *rec, int layer);
/* rec's master or accumulator is written outside the EPS's own passes (a checkpoint's
   restore): the accumulator no longer known zero, the staging copy rewritten as the next
   step begins (record.h: grad_known_zero, staging_written). */
void eps_record_written(struct eps *eps, struct eps_record *rec);
/* rec's gradient so far is dropped between steps (its layer frozen part way through an
   accumulation; a restore's partial gradients replaced): the accumulator cleared as the
   EPS clears it (held gradients, a device record's flag, a spill file's page accounting)
   and its non-finite mark with it, once its pending update has ended. */
void eps_drop_gradient(struct eps *eps, struct eps_record *rec);
/* Deferred updates (global clipping, loss scaling): waits for every due record to be
   complete; *norm is the global norm of their gradients times unscale. If it is finite,
   every due update starts with its gradient scaled by unscale * min(1, clip / norm) (clip
   0: no clipping) and true is returned. If not (an inf or NaN anywhere: a loss-scaling
   overflow), nothing updates: every due accumulator is cleared, and false returned. */
bool eps_step_release(struct eps *eps, float clip, double unscale, double *norm);
/* A step's outcome, once every gradient given has been added: the records skipped for a
   non-finite gradient (eager updates; deferred ones are skipped whole by
   eps_step_release), and the first one's record name and layer. */
struct eps_outcome {
  int skips;
  const char *name;            /* NULL with no skip */
  int layer;                   /* -1 with no skip */
};
/* ok: the step's outcome into *out. !ok (the step failed after gradients began to
   arrive; out may be NULL): accumulators that got part of this step's gradients are
   cleared (an update from a part would be wrong), nothing updates. */
void eps_step_end(struct eps *eps, bool ok, struct eps_outcome *out);
/* Per-layer clipping of a visit's gradients (host-readable, f32 or 16-bit): the scale
   that brings their joint norm down to clip, 1 when it is within (or clip is 0). */
float eps_clip_scale(const l2l_tensor *const *grads, int n, float clip);
/* With a 16-bit precision, before a step's first copy to the device: every staging copy
   is rewritten from its master on the workers (after a pending update). The copies wait
   for it as for an update (eps_wait_record). */
void eps_stage(struct eps *eps);
/* Waits until rec has no pending update or staging rewrite. */
void eps_wait_record(struct eps *eps, struct eps_record *rec);
/* rec's update count when no update is pending or running, else -1: a copy of the
   master made at count c is still current while this returns c. */
int64_t eps_settled_updates(struct eps *eps, struct eps_record *rec);
/* Data parallel (exchange.c): before any record joins, the EPS joins every rank of the
   process's MPI (dist_start first); from then on each rank updates its shard of every
   record (see record.h) and the records' exchanges are recorded on the timeline's lane
   `lane`. Collective. */
l2l_status eps_dist_start(struct eps *eps, int lane);
/* With ranks: waits until every record due this step has its gradient summed over ranks
   and its norm and finiteness agreed (before the global norm, and before a step's skips
   are counted). */
void eps_wait_agreed(struct eps *eps);
/* The optimizer state array `which` of rec, whole (NULL before the first update): on one
   process the state itself (read from the spill file if it is there); with ranks gathered
   from every rank's shard (collective: every rank asks for the same records in the same
   order). A copy read or gathered is kept until the next step or until another record's
   is asked for. Between steps, after eps_sync. */
l2l_status eps_state_whole(l2l_tensor **out, struct eps *eps, struct eps_record *rec,
                           int which);
/* Bytes the exchanges of the last step that updated send per rank (ring accounting:
   (N - 1) / N of a record's f32 gradient by reduce-scatter and of its master by
   all-gather, none for a record skipped on every rank). */
uint64_t eps_dist_bytes(const struct eps *eps);
/* From now on the optimizer state (with ranks, of this rank's shard) of every record the
   host budget does not keep lives in a spill file in `dir` between its updates: read
   ahead of its update, written back after its last wave, its host memory freed (the
   updates are the same to the bit). Between steps (after eps_sync). A failure leaves
   every record as it was. */
l2l_status eps_spill_state(struct eps *eps, const char *dir);
/* The host bytes the EPS may hold from the next step on (0: none): its masters,
   accumulators, staging copies and the optimizer state in memory (kept, read ahead). Each
   step's eps_prepare checks it (L2L_ERR_BUDGET naming the smallest that works) and, with
   a spill file, keeps in memory the state that fits beside a read-ahead window. */
void eps_set_host_budget(struct eps *eps, uint64_t bytes);
/* The spill file's bytes read and written so far, records whose state was read at their
   update rather than ahead of it, gradient arrivals that waited for a passing
   accumulator's room, and the file's size (all 0 without a spill file). */
struct eps_spill_counts {
  uint64_t read, written, file;
  int64_t late, grad_waits;
};
void eps_spill_counts(struct eps *eps, struct eps_spill_counts *out);
/* The bytes of host memory the EPS's passes have read and written since it was made:
   gradient adds and held gradients' checks, updates (gradient, master, optimizer state,
   the accumulator's clear), other clears and staging rewrites, each counted from its
   elements and their sizes as the pass runs (a chunk's norm, read back while in cache,
   is not counted). */
uint64_t eps_pass_bytes(const struct eps *eps);
/* L2L_OK, or the first spill I/O failure since the last call (its message set as this
   thread's error), cleared. After eps_sync. */
l2l_status eps_io_status(struct eps *eps);
/* Waits until every gradient given has been added (updates may still run). */
void eps_wait_arrivals(struct eps *eps);
/* Waits until every queued absorb and update has finished. */
void eps_sync(struct eps *eps);

/* ---------------------------------------------------------------- the spill file (spill.c) */

/* Which engine moves a spill file's bytes. */
enum eps_spill_engine {
  EPS_SPILL_ENGINE_ANY,       /* the environment's L2L_SPILL_IO ("io_uring" or "threads"),
                                 else io_uring where built and the kernel allows, else threads */
  EPS_SPILL_ENGINE_RING,      /* io_uring, or L2L_ERR_UNSUPPORTED saying why not */
  EPS_SPILL_ENGINE_THREADS,   /* a pool of pread/pwrite threads */
};

struct io_uring;

/* A spill file and its I/O engine (the EPS's third tier, below its choice of what to
   spill, which is state_tier.c's). */
struct eps_spill {
  char path[4096];
  int fd, fd_direct;           /* buffered; O_DIRECT (-1 where the file system refuses it) */
  uint64_t dev, ino;           /* the file's, and the next of the process's open files (a
                                  file named with its pid that is none of them was left by a
                                  dead process that had the pid) */
  struct eps_spill *next_open;
  uint64_t used;               /* bytes reserved, every region 4 KiB-aligned (under lock:
                                  the EPS's workers reserve as records first spill) */
  uint64_t in_use;             /* of them, in regions not given back (under lock) */
  struct eps_spill_region { uint64_t at, bytes; } *free_list;   /* given back, reused first */
  int free_n, free_cap;
  pthread_mutex_t lock;
  struct core_queue io;         /* threads: the pread/pwrite workers */
  struct io_uring *ring;       /* io_uring (NULL: threads), and what goes with it, under
                                  ring_lock: transfers on the ring (at most RING_DEPTH),
                                  room for one more, one finished; the thread reaping */
  pthread_mutex_t ring_lock;
  pthread_cond_t ring_room, ring_done;
  int ring_in_flight;
  pthread_t reaper;
  _Atomic uint64_t read, written;   /* bytes moved, for the stats */
};
/* One transfer between a buffer and a reserved region, queued and waited for. */
struct eps_spill_io {
  struct core_job job;          /* first: the threads' job; on the ring, its done and status
                                  (under ring_lock) */
  struct eps_spill *spill;
  bool write;
  bool direct;                 /* through fd_direct (aligned, and not refused yet) */
  void *buffer;
  uint64_t offset, bytes;
  uint64_t moved;              /* bytes done (a read or write may do part) */
  uint64_t sum;                /* XXH3-64 of the bytes: a write's once waited for, the one a
                                  read's must have */
  uint64_t hash;               /* ... and the one they had as the transfer ended */
};
/* Makes a new spill file in `dir` (which must exist) served by `engine` (with `threads`
   workers where that is the pool).
   found (found_len bytes, or NULL): a message naming spill files left in dir by runs whose
   process is gone (empty when none; one with this process's pid that it has not open is
   one of them): they are neither reused nor removed, the next free name taken. L2L_ERR_IO
   names the directory or file and why. */
l2l_status eps_spill_open(struct eps_spill *sp, const char *dir, enum eps_spill_engine engine,
                          int threads, char *found, size_t found_len);
/* Waits for the transfers queued, stops the engine, closes and removes the file. */
void eps_spill_close(struct eps_spill *sp);
/* A new region of at least `bytes` (4 KiB-aligned), allocated on the disk now: a full
   disk is L2L_ERR_IO here, naming the file and the bytes, not a failed write later. */
l2l_status eps_spill_reserve(struct eps_spill *sp, uint64_t bytes, uint64_t *offset);
/* A region reserved before is no longer used: the next reservation it fits takes it. */
void eps_spill_release(struct eps_spill *sp, uint64_t offset, uint64_t bytes);
/* Queues a write of buffer to [offset, offset + bytes) of reserved space (or a read into
   it); the buffer must live, unchanged for a write, until eps_spill_wait. Buffer, offset
   and length 4 KiB-aligned go around the page cache where the file system allows it.
   sum: a read's bytes must hash to it (the io->sum of the write that put them there);
   ignored for a write. */
l2l_status eps_spill_queue(struct eps_spill *sp, struct eps_spill_io *io, bool write, void *buffer,
                           uint64_t offset, uint64_t bytes, uint64_t sum);
/* Its status: L2L_ERR_IO names the file, the offset and why (e.g. a read cut short, or
   bytes that are not those written: another program changed the file). After a write,
   io->sum is the XXH3-64 of its bytes, for the read that takes them back. */
l2l_status eps_spill_wait(struct eps_spill_io *io);

#endif /* L2L_EPS_H */
