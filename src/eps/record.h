/* SPDX-License-Identifier: MIT */
/* record.h — a parameter record as the EPS holds it (private to src/eps/).
 *
 * Purpose: what the EPS's core (eps.c: records, arrivals, the step; update.c: the update
 * queue) and its parts below it share: the record, the order of the files' calls (down
 * only), and each file's functions.
 * Must never: be included outside src/eps/ (the relay reads a record through eps.h).
 */
#ifndef L2L_EPS_RECORD_H
#define L2L_EPS_RECORD_H

#include "cluster/cluster.h"
#include "eps.h"

enum { CHUNK = L2L_OPTIM_CHUNK };   /* (backend.h: the CPU backend's ops cut alike) */

/* A gradient the EPS owns (a GPU's, copied back to pinned memory), held for the update
   to read instead of added into the accumulator first: scale * grad, f32 or 16-bit. A
   record holds at most EPS_HELD_MAX a step (a tied table's two users). */
enum { EPS_HELD_MAX = 2 };
struct eps_held {
  l2l_tensor *grad;
  float scale;
};

/* A gradient's (or a chunk's) sum of squares and largest magnitude. */
struct eps_norm {
  double sumsq;
  float most;
};

/* Where a record's master, gradient accumulator and optimizer state live and are updated
   (issue 49): the host (the EPS's workers), or the device (device.c: the backend's ops
   table, on the relay's compute thread, in the device's order). The relay's step
   interface (eps.h) is the same for both. */
enum eps_placement { EPS_PLACE_HOST = 0, EPS_PLACE_DEVICE };

struct eps_record {
  enum eps_placement placement;
  /* On the device (placement EPS_PLACE_DEVICE; master, grad, state[] and staging are
     device tensors): its words (device.c) at index `word` (-1: none yet) of the EPS's
     arrays: its flag, 1 once an add has made a sum that is an inf, a NaN or EPS_GRAD_LIMIT
     or more, which an eager update reads on the device to leave the record as it was
     (flag_armed: the step's end reads it, counts the skip and clears it), and its
     gradient's norm, a deferred update's. */
  int word;
  bool flag_armed;
  l2l_tensor *guard_copy;      /* a 1-D record on the device: a pinned host copy of its
                                  master, which the frugal LayerNorm guard reads instead of
                                  the device (eps_device_guard_copies keeps it current) */
  l2l_param *param;            /* the key it was added under (never called into: the EPS
                                  sees records, not layers) */
  uint64_t writes_seen;        /* its parameter's writes (l2l_param_write) the relay has
                                  told of (eps_note_writes) */
  const char *name;            /* the parameter's name, for messages (lives as long as it) */
  bool decays;                 /* weight decay applies (unless the optimizer decays all) */
  struct eps *eps;         /* its EPS (for a worker's job or an exchange's completion,
                                  which get only the record) */
  l2l_tensor *master, *grad;   /* the record's own tensors (host pool) */
  l2l_tensor *state[2];        /* optimizer state (host pool), NULL until the first update
                                  and, with a spill file, while on disk */
  bool spilled;                /* its state is on disk at spill_at (eps->spill) */
  bool spill_reserved;         /* spill_at holds its regions (reserved at its first write) */
  uint64_t spill_at[2];
  uint64_t spill_sum[2];       /* the XXH3-64 of what its last write put there: a read back
                                  is checked against it */
  bool keep_state;             /* its state stays in host memory (the host budget's choice) */
  int ahead;                   /* this step: AHEAD_NONE, _QUEUED (ahead_io reading into
                                  ahead_state), _TAKEN (its update has its state) */
  l2l_tensor *ahead_state[2];
  struct eps_spill_io ahead_io[2];
  bool room;                   /* its update's state counts in eps->update_bytes */
  int turn;                    /* this step, with ranks: its turn for room (eps->turn_next),
                                  -1: none */
  float wait_grad_scale;       /* of its update waiting for room (in eps->waiting) */
  bool grad_away;              /* the accumulator's pages are given back (it reads zero) */
  bool grad_passing;           /* this step its accumulator passes (eps->grad_limit) */
  bool grad_counted;           /* ... and is in memory, counted in eps->grad_bytes */
  bool grad_give;              /* its update under way gives the pages back (set as it
                                  begins: the accumulators passed then) */
  l2l_tensor *staging;         /* device-precision copy (pinned), NULL: the master is it */
  uint64_t stream;             /* a bf16 master's stochastic rounding draws (the relay's) */
  int users;                   /* relay layers holding the record */
  struct arrival *absorb_tail; /* the last of its gradients adding (eps.c's arrivals, one
                                  after the other), NULL: none; under the EPS lock */
  /* This step's gradients held, not added (eps.c, "held arrivals"): the update reads
     them beside the accumulator, in the order given (eps_held_block). held_n under the
     EPS lock; grad_zero[c]: chunk c of the accumulator was all +0 when the last arrival's
     check read it (NULL: not known), so the update need neither read nor clear it. */
  struct eps_held held[EPS_HELD_MAX];
  int held_n;
  uint8_t *grad_zero;
  /* The accumulator is all +0 by the EPS's own clearing (its last update's, on one
     process), and nothing of the EPS has added into it or restored it since; under the
     EPS lock (a move, eps_move_commit, sets it false with no update in flight). Unless
     the API handed it out (core's tensor_handed_out: a script or a caller's layer call
     may have written it unseen), the check of held gradients then takes it as zero
     without reading it (4 bytes a parameter a step). */
  bool grad_known_zero;
  /* Its staging copy was written by its last update from the master it left (update.c,
     stages_in_update); under the EPS lock. Unless the API has handed the master out since,
     the next step's rewrite leaves it alone (eps_stage). */
  bool staging_written;
  /* With deferred updates: each chunk's norm of the gradient as the last add left it,
     found by that add as it wrote the chunk (optim_norm_blocks); norms_valid (under the EPS
     lock) once a whole add's are in, until the next step begins. NULL: none made yet (or
     no memory: found again at the end). */
  struct eps_norm *chunk_norms;
  bool norms_valid;
  int64_t updates;             /* t of its last update */
  /* This step's bookkeeping, under the EPS lock. */
  int expected, arrived;       /* gradient visits due and done (holds included) */
  int given;                   /* gradients given (eps_give_gradient), held or not */
  int holds;                   /* of them, reads of a frozen user's rebuild still to come */
  bool update_due;             /* this step ends a minibatch accumulation for it */
  bool pending;                /* an update or a staging rewrite is queued or running */
  bool stage_after;            /* rewrite the staging copy once the pending update ends */
  int last_layer;              /* the layer whose gradient completed it */
  double sumsq;                /* |grad|^2 once complete (global clipping) */
  float grad_most;             /* the largest |grad| then (deferred updates: times the
                                  update's scale, at EPS_GRAD_LIMIT or more it is skipped);
                                  with ranks the sum of the shards' largest, a bound */
  bool nonfinite;              /* the accumulator holds an inf or NaN, or a value of
                                  EPS_GRAD_LIMIT or more (until cleared) */
  int chunks_left;
  double wave_sums[2];         /* a first wave's whole-record sums (LAMB's norms) */
  double (*chunk_sums)[2];     /* ... each chunk's, added in the chunks' order once the wave
                                  ends (the same bits whichever worker ends last, and the
                                  CPU backend's for a record on the device); made by
                                  eps_prepare for an optimizer of two waves */
  struct optim_hyper hyper;
  /* Data parallel (eps->dist): this rank's shard of the record, [shard_begin,
     shard_begin + shard_n), whose master and optimizer state it updates; the others come
     back by all-gather. state[] then holds the shard alone. (A record on the device is
     updated whole on every rank: its shard is all of it.) */
  int64_t shard_begin, shard_n;
  int *counts, *displs;        /* every rank's part of the reduce-scatter (on the host its
                                  shard), for the collectives */
  l2l_tensor *shard_grad;      /* the reduced gradient of this rank's part (host pool) */
  /* A record on the device with ranks: its accumulator copied here (pinned, f32, whole) as
     it completes, then the whole reduced gradient all-gathered here; exchanged: that
     exchange is this step's, its gradient still to be taken to the device (update.c's
     eps_exchanged_updates, on the compute thread at the step's end). */
  l2l_tensor *exchange;
  bool exchanged;
  float exchange_scale;        /* ... the gradient's scale its update takes (eps_start_update) */
  l2l_tensor *gathered[2];     /* the whole optimizer state, gathered for a checkpoint */
  int first_expect;            /* this step's eps_expect call that first named it, -1 */
  int order;                   /* its place on the streams this step */
  int place;                   /* the place of the exchange under way (order at its start) */
  bool agreed;                 /* this step's norm and finiteness are known on every rank */
  double flags[3];             /* sum of squares of the shard, its non-finite count (an
                                  inf, a NaN or EPS_GRAD_LIMIT or more) and its largest
                                  |grad|, summed over ranks */
  double lamb[2];              /* LAMB's whole-record sums, summed over ranks */
  struct dist_op rs, flag, lamb_op, ag;
};

/* The files of the EPS call down only, never back up, directly or through a pointer
   (docs/design.md; scripts/archcheck finds a call cycle between them, and a table of the
   core's functions in a header):
     step.c (the relay's step interface)
       -> eps.c (the core: records, arrivals, the step)
       -> update.c (the core: the update queue and every continuation of an update)
       -> exchange.c (the ranks' exchange) -> state_tier.c (storage tier) -> spill.c (the file)
       -> quant.c (precision) -> device.c (records on the device) -> record.c (this
       header's bottom) -> optim.c (the optimizers' table)
   each calling only files after it (exchange.c, say, calls state_tier.c, record.c and
   optim.c, never eps.c or update.c). What a part finds that the core must act on comes
   back as data: the storage tier returns the waiting updates whose room has come
   (eps_room_next), which update.c begins; the exchange posts each collective with the
   completion update.c gives it, called by the communication thread (the cluster part,
   below the whole EPS), so the exchange neither calls nor keeps a function of the core. */

/* ---------------------------------------------------------------- the core's step (eps.c)

   What eps_step_begin, _agreed and _end (step.c, eps.h's step interface) are made of.
   eps_begin_step: every record's counts reset (update: this step ends an accumulation;
   defer: updates wait for eps_step_release); then eps_expect once per trainable visit
   of each record, eps_hold once per frozen rebuild's read; eps_prepare allocates missing
   optimizer state for records due and checks the host budget (a failure comes before
   anything has changed); with ranks, eps_order_exchanges then gives the due records their
   places on the exchange's streams. eps_abandon_step: a failed step's partial
   accumulators cleared; eps_nonfinite_skips: the step's records skipped for a non-finite
   gradient, and the first one's name and layer. */
void eps_begin_step(struct eps *eps, bool update, bool defer, double lr);
void eps_expect(struct eps *eps, struct eps_record *rec);
void eps_hold(struct eps *eps, struct eps_record *rec);
l2l_status eps_prepare(struct eps *eps);
void eps_order_exchanges(struct eps *eps);
void eps_abandon_step(struct eps *eps);
int eps_nonfinite_skips(struct eps *eps, const char **name, int *layer);

/* ---------------------------------------------------------------- the core's update queue (update.c) */

/* Waves of chunks (STAGE_WAVE: the staging copy rewritten from the whole master). */
enum { STAGE_WAVE = -1 };
/* rec's update (its first wave) queued with its gradient times grad_scale, once the
   storage tier gives it room (else it waits, pending, and begins when the tier hands it
   back); eps.c's arrivals and deferred release, and an exchange's agreed norm. A record on
   the device: queued there now; with ranks, its reduced gradient's all-gather posted and
   the update left to eps_exchanged_updates (grad_scale kept). */
void eps_start_update(struct eps *eps, struct eps_record *rec, float grad_scale);
/* With ranks: rec's gradient is complete on this rank: its exchange begins (reduce-scatter
   in its turn, then the norm's all-reduce, then its update or its skip). */
void eps_update_exchange(struct eps *eps, struct eps_record *rec);
/* With ranks: rec's update is skipped on every rank (an agreed inf or NaN, or an
   overflow): its turn for room and its places on the remaining streams pass (on the
   device, where its all-gather was posted with its norm: that ends first). */
void eps_update_skipped(struct eps *eps, struct eps_record *rec);
/* With ranks, on the compute thread at the step's end: each record on the device whose
   exchange is this step's (rec->exchanged) waits for it to end, then, unless skipped on
   every rank, takes its reduced gradient and is updated on the device (by the scale its
   eager start or the release gave). */
void eps_exchanged_updates(struct eps *eps);

/* ---------------------------------------------------------------- device.c (on the device)

   A record placed on the device, through the backend's ops table on the calling thread
   (the relay's compute thread: queued in the device's order). Each returns the first
   failure of an op (its message set), for the caller to keep (eps_io_failed). */

/* rec's accumulator += grad (a device tensor, f32 or 16-bit), clipped: times the EPS's
   clip word (eps_device_clip); flagged (eager updates): its flag set where a sum is not
   finite (or EPS_GRAD_LIMIT or more). */
l2l_status eps_device_add(struct eps_record *rec, const l2l_tensor *grad, bool clipped,
                          bool flagged);
/* rec's update by its hyper-parameters (eps_update_hyper); flagged: an eager update,
   which its flag skips (armed for the step's end); else the relay's release decided. */
l2l_status eps_device_update(struct eps_record *rec, const struct optim_hyper *h, bool flagged);
/* rec's gradient's norm into its word, in the host's grouping (queued: nothing read). */
l2l_status eps_device_norm(struct eps_record *rec);
/* Every record's norm read back at once (one copy: on a GPU the one sync of a deferred
   release) into its sumsq and grad_most; with ranks none (the exchange agrees them). */
l2l_status eps_device_norms(struct eps *eps);
/* rec's accumulator and flag cleared (its gradient dropped). */
l2l_status eps_device_clear(struct eps_record *rec);
/* With ranks, rec complete: its accumulator copied to rec->exchange (pinned; the host
   waits for it) for the exchange to send, then cleared for the next minibatch (a failed
   copy leaves zeros there to send, and its status). */
l2l_status eps_device_send(struct eps_record *rec);
/* ... and the whole reduced gradient the exchange left in rec->exchange queued into its
   accumulator for its update. */
l2l_status eps_device_take(struct eps_record *rec);
/* The step's armed updates on the device that their flags skipped: the flags read back at
   once (one copy), each skipped one cleared, every one disarmed, each skip counted in
   eps->nonfinite_skips (the first named) and its update count taken back. */
l2l_status eps_device_skips(struct eps *eps);
/* The 16-bit copies of every record on the device rewritten from their masters, in one
   cast (one launch on a GPU for every 64 records). */
l2l_status eps_device_stage(struct eps *eps);
/* rec's missing optimizer state arrays made on the device, zero (f32: the relay's rule). */
l2l_status eps_device_state(struct eps_record *rec);
/* A record joining on the device: its state made now (so the device's bytes are known
   before a step, and no step makes them), its words with the next step's. */
l2l_status eps_device_join(struct eps_record *rec);
/* eps_move_prepare (exchange.c) in three parts: rec settled and a spilled state read
   back into memory (state_tier.c), then with ranks the whole state gathered for the
   device, then the tensors of rec's new place (device.c): its shard there [shard_begin,
   + shard_n) (one process: all of it), and with ranks its state's arrays of that shard: to
   the device `whole` (the record's whole arrays, gathered from every rank's shard; NULL:
   never updated), to the host this rank's part of the device's. */
l2l_status eps_move_ready(struct eps_record *rec, bool to_device);
l2l_status eps_device_move_prepare(struct eps_move *m, const struct eps_record *rec, bool to_device,
                                   int64_t shard_begin, int64_t shard_n,
                                   const l2l_tensor *const whole[2]);
/* rec's state arrays on the device given the values of host arrays (NULL: zero), a
   restore's. */
l2l_status eps_device_restore(struct eps_record *rec, l2l_tensor *const host[2]);

/* ---------------------------------------------------------------- record.c (the bottom) */

/* One optimizer state array of rec (its shard), as the spill file moves it. */
static inline uint64_t eps_array_bytes(const struct eps_record *rec) {
  return host_state_bytes(rec->eps->optimizer.state, rec->shard_n);
}
/* rec's bytes in host memory and on disk (core's host_record_bytes). */
struct host_record eps_record_bytes(const struct eps *eps, const struct eps_record *rec);
/* Sorts records due this step in the order backward completes them. */
void eps_sort_by_completion(struct eps_record **list, int n);
/* g[0, n) = the accumulator's elements [begin, begin + n) (acc; NULL: zeros) plus each of
   rec's held gradients in turn, with the add kernels' own arithmetic (the sums an
   accumulator would hold had each been added as it came, to the bit; n <= one chunk);
   returns whether every partial sum is finite and below EPS_GRAD_LIMIT. */
bool eps_held_block(float *g, const struct eps_record *rec, const float *acc, int64_t begin,
                    int64_t n);
/* The check of rec's held gradients over [begin, end) (within one chunk): whether every
   partial sum is finite and below EPS_GRAD_LIMIT; the chunk's grad_zero found. The
   accumulator is read where it may hold anything: not where known_zero says it is zero,
   nor in a block with no page behind it (a record's first step: pages never touched, which
   reading would give memory on a machine without a shared zero page). */
bool eps_held_check(struct eps_record *rec, int64_t begin, int64_t end, bool known_zero);
/* rec's gradient's norm for a deferred update: its chunks' found by the last pass, summed
   in order, or (none valid) found now from the accumulator the same way. */
struct eps_norm eps_grad_norm(const struct eps_record *rec);
/* rec's update's hyper-parameters this step, its gradient times grad_scale. */
struct optim_hyper eps_update_hyper(const struct eps *eps, const struct eps_record *rec,
                                    float grad_scale);
/* A pass's host bytes counted (eps->pass_bytes). */
static inline void eps_count_bytes(struct eps *eps, uint64_t bytes) {
  atomic_fetch_add_explicit(&eps->pass_bytes, bytes, memory_order_relaxed);
}
/* Bytes an element of rec's held gradients takes, summed over them. */
uint64_t eps_held_elem_bytes(const struct eps_record *rec);
/* rec's held gradients freed (read by its update, or dropped with its accumulator). */
void eps_held_free(struct eps_record *rec);

/* ---------------------------------------------------------------- quant.c (precision) */

/* A new optimizer state array of rec (its shard's elements) in `pool`; _n: of a shard of
   shard_n elements (a record moving between placements with ranks: its new shard's). */
l2l_status eps_state_new(l2l_tensor **out, const struct eps_record *rec, l2l_pool_kind pool);
l2l_status eps_state_new_n(l2l_tensor **out, const struct eps_record *rec, int64_t shard_n,
                           l2l_pool_kind pool);
/* *out (host, new) := elements [begin, begin + n) of whole, a whole state array of rec in
   the EPS's precision in any pool (begin on a block), as they are. */
l2l_status eps_state_part(l2l_tensor **out, const struct eps_record *rec, const l2l_tensor *whole,
                          int64_t begin, int64_t n);
/* A restore (eps_restore) in two halves: the arrays given checked against the
   optimizer and the record (*arrays: how many it keeps after `updates`), then each
   converted into a new array in the EPS's precision, its values checked (on a failure
   fresh[] holds none). Neither changes the record. */
l2l_status eps_restore_check(const char *func, const struct eps *eps,
                             const struct eps_record *rec, int64_t updates,
                             const l2l_tensor *const given[2], int *arrays);
l2l_status eps_restore_convert(const char *func, const struct eps_record *rec, int arrays,
                               const l2l_tensor *const given[2], l2l_tensor *fresh[2]);

/* ---------------------------------------------------------------- state_tier.c (storage) */

/* With eps->spill: rec's state to the spill file, its host memory freed (a
   failure leaves it in memory); in memory for its update (read back, or zero for its
   first); array `which` of a spilled record read into a new host tensor (a checkpoint's);
   the first failure on a worker kept for eps_io_status. */
l2l_status eps_state_out(struct eps *eps, struct eps_record *rec);
l2l_status eps_state_for_update(struct eps *eps, struct eps_record *rec);
l2l_status eps_spill_read_state(struct eps *eps, struct eps_record *rec, int which,
                                l2l_tensor **out);
void eps_io_failed(struct eps *eps, l2l_status status);   /* (L2L_OK: nothing) */
/* Before a step's updates (eps_prepare, before anything changes): the host
   budget checked; with a spill file, which records keep their state in memory (the
   others' written out now) and the first reads ahead queued. */
enum { AHEAD_NONE, AHEAD_QUEUED, AHEAD_TAKEN };
l2l_status eps_host_plan(struct eps *eps);
/* rec's read ahead, if any, waited for and its buffers freed (its state stays on disk);
   every record's, between steps. */
void eps_ahead_drop(struct eps *eps, struct eps_record *rec);
void eps_ahead_drop_all(struct eps *eps);
/* With a spill file, before rec's update takes its state: true when there is room for it
   (it is kept in memory, or update_bytes has room: counted there now, and with ranks it
   is its turn); else its update waits (rec pending, in eps->waiting) and false.
   eps_room_return gives the room back once the update has written its state out (or
   failed). Each of the three that gives room or a turn returns the first waiting update
   that now fits, taken (its room counted, its turn passed, out of the waiting list) in
   the same hold of the lock, or NULL; eps_room_next takes the next one. The tier begins
   nothing: the caller (update.c) begins each update handed back, in that order. */
bool eps_update_room(struct eps *eps, struct eps_record *rec, float grad_scale,
                     struct eps_record **next);
struct eps_record *eps_room_return(struct eps *eps, struct eps_record *rec);
struct eps_record *eps_room_next(struct eps *eps);
/* With ranks, a due record whose update will not take room (skipped on every rank) passes
   its turn. */
struct eps_record *eps_turn_pass(struct eps *eps, struct eps_record *rec);
/* rec's accumulator cleared for its next minibatch (its update read it, or its gradient
   is dropped), and the gradients it holds freed: when the accumulators pass its pages are
   given back. `zeroed`: its elements are zero already (its update's chunks wrote them);
   it is counted out of the passing accumulators in memory either way. */
void eps_grad_clear(struct eps *eps, struct eps_record *rec, bool zeroed);

/* ---------------------------------------------------------------- exchange.c (ranks) */

/* The streams freed (after every exchange has ended). */
void eps_dist_free(struct eps *eps);
/* This step's due records get their places on the streams (eps_prepare). */
void eps_exchange_order(struct eps *eps);
/* Shards of a new record (counts, displs, begin, n) for this process's ranks;
   L2L_ERR_INVALID for a shard beyond MPI's int counts. */
l2l_status eps_shard(struct eps *eps, struct eps_record *rec);
/* rec's buffers of the exchange, made once (eps_prepare): the reduced gradient of its part
   (host pool), and for a record on the device the pinned array its accumulator goes out
   from and the whole reduced gradient comes back to (rec->exchange). */
l2l_status eps_exchange_buffers(struct eps *eps, struct eps_record *rec);
/* A record's collectives with ranks, each on a stream of its own, in the record's place
   there (a reduce-scatter takes the place, eps_exchange_order's, for the whole exchange). */
enum eps_collective {
  EPS_REDUCE_SCATTER,   /* the accumulator (on the device: rec->exchange) into this rank's
                           part of the reduced gradient (shard_grad) */
  EPS_NORM,             /* the part's sum of squares, non-finite count and largest |grad|
                           (computed here from shard_grad) summed into rec->flags */
  EPS_LAMB_SUMS,        /* a first wave's whole-record sums (wave_sums) summed into rec->lamb */
  EPS_ALL_GATHER,       /* the updated master from every rank's shard (on the device: the
                           reduced gradient from every rank's part, into rec->exchange) */
};
/* Posts rec's collective `which`; `done` (the core's, update.c) is the operation's
   completion, called on the communication thread when it has ended. */
void eps_exchange_post(struct eps *eps, struct eps_record *rec, enum eps_collective which,
                       void (*done)(struct dist_op *op));
/* The same place passed with nothing sent (a record skipped on every rank). */
void eps_exchange_pass(struct eps *eps, struct eps_record *rec, enum eps_collective which,
                       void (*done)(struct dist_op *op));
/* rec is skipped on every rank: its all-gather's bytes are not sent (the step's count). */
void eps_exchange_skipped(struct eps *eps, struct eps_record *rec);
/* The whole state eps_state_whole gathered or read for a checkpoint, freed (only
   eps->gathered_last has any). */
void eps_gathered_free(struct eps *eps);

#endif /* L2L_EPS_RECORD_H */
