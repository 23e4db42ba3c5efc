/* SPDX-License-Identifier: MIT */
/* l2l/relay.h — a part of the public header l2l.h: the host optimizers, and the relay with
 * its eager parameter server (EPS).
 *
 * Purpose: one seam of the C API. A program includes l2l.h, never a part: a part uses the
 * types the header and the parts before it declare, and l2l.h's conventions hold for it.
 * Its FFI block is read after theirs (scripts/public_header.lua).
 * Must never: be included but by l2l.h.
 */
#ifndef L2L_H
#error "include l2l.h, not its parts"
#endif

/* L2L_FFI_BEGIN */

/* ---------------------------------------------------------------- optimizers
   Host optimizers of the EPS, applied per parameter record in fp32 on worker threads.
   g below is the gradient after accumulation and clipping; t counts updates from 1.
   SGD:   b = momentum b + g (b = g at t = 1); p -= lr (g + momentum b) with nesterov,
          else lr b; weight decay (decoupled): p -= lr weight_decay p first.
   AdamW: as l2l_adamw_update.
   LAMB:  r = m^/(sqrt(v^) + eps) + weight_decay p (m^, v^ as AdamW);
          p -= lr * trust * r, trust = |p| / |r| (1 when either norm is 0), per record.
   Weight decay applies to the records l2l_param_decays marks (linear weights) unless
   decay_all = 1. */
typedef enum l2l_optimizer_kind {
  L2L_OPTIMIZER_SGD = 0,
  L2L_OPTIMIZER_ADAMW = 1,
  L2L_OPTIMIZER_LAMB = 2
} l2l_optimizer_kind;

/* The precision the optimizer state is kept in, on the host and in a spill file:
   f32 (4 bytes an element); bf16 (2: rounded to nearest even after every update); 8bit
   (1, and an f32 scale a block: blockwise dynamic quantisation after Dettmers et al.,
   2022). The update decodes a block into f32, runs the f32 kernel on it and encodes it
   again, so each state byte is read and written once an update.
   8bit: each block of L2L_STATE_BLOCK elements (counted from the array's start) is kept
   as its scale s, the largest magnitude in it, and per element the code byte whose value
   times s is nearest (ties to the smaller magnitude; s = 0: every byte 0). A momentum (SGD's
   buffer, Adam's m) uses the signed code: bit 7 the sign, the low 7 bits j the magnitude
   M7[j]; Adam's v is kept as sqrt(v) in the unsigned code, the byte j meaning M8[j] (so
   an element far below its block's largest is 0 only when its momentum is too, and the
   error is relative to the step's denominator). Mb[0] = 0; Mb[1 ..] ascending are the
   values 10^-E (0.1 + 0.9 (k + 1) / 2^(b-1-E)) for E = b - 1 down to 0 and k = 0 ..
   2^(b-1-E) - 1 (Dettmers' dynamic code: the leading zeros of the index set a decade,
   the rest a linear fraction): 1 is exact, 1e-6 (M7) and 1e-7 (M8) the smallest.
   One state array of n elements takes l2l_state_array_bytes. As a tensor
   (l2l_relay_param_state, l2l_relay_restore_param) it is f32 or bf16 in the parameter's
   shape, or for 8bit a u8 vector: the n code bytes, zero bytes up to a multiple of 4,
   then ceil(n / L2L_STATE_BLOCK) f32 scales, little-endian. */
enum { L2L_STATE_BLOCK = 2048 };
typedef enum l2l_state_precision {
  L2L_STATE_F32 = 0,
  L2L_STATE_BF16 = 1,
  L2L_STATE_8BIT = 2
} l2l_state_precision;

typedef struct l2l_optimizer_config {
  l2l_optimizer_kind kind;
  float lr;              /* >= 0, the base rate the schedule scales */
  float momentum;        /* SGD, in [0, 1) */
  int nesterov;          /* SGD, 0 or 1 (needs momentum > 0) */
  float beta1, beta2;    /* AdamW, LAMB: in [0, 1) */
  float eps;             /* AdamW, LAMB: > 0 */
  float weight_decay;    /* >= 0 */
  int decay_all;         /* 1: decay biases, LayerNorm and embeddings too */
  l2l_state_precision state;   /* the state arrays' precision (0: f32) */
} l2l_optimizer_config;

/* The optimizer state arrays a record keeps from its first update on, each with an element
   for each of its parameter's: SGD 1 with momentum > 0, else 0; AdamW and LAMB 2. The config is
   checked first. */
L2L_API l2l_status l2l_optimizer_state_arrays(int *out, const l2l_optimizer_config *config);
/* Bytes of one state array of n >= 0 elements kept in `state` (see above). */
L2L_API l2l_status l2l_state_array_bytes(uint64_t *out, l2l_state_precision state, int64_t n);
/* Whether `array`, state array `which` (0: the first, SGD's momentum or Adam's m; 1: Adam's
   v) of a parameter of n >= 1 elements under `optimizer`, holds what
   l2l_relay_restore_param takes: f32 or bf16 of n elements or 8bit's u8 vector, each value
   decoding finite and a second moment >= 0; L2L_ERR_INVALID names the first that does not.
   It reads and changes nothing else. run:save checks every array it writes with it, before
   its file takes the place of another: what a save writes, a load takes. */
L2L_API l2l_status l2l_state_array_check(const l2l_tensor *array,
                                         const l2l_optimizer_config *optimizer, int which,
                                         int64_t n);

/* Learning rate at update t (1-based): base * factor(t).
   constant: 1 after warm-up. cosine: after warm-up, from 1 down to final_ratio at t =
   total along half a cosine. linear: likewise along a straight line. Warm-up: factor
   t / warmup for t <= warmup. After total: final_ratio. */
typedef enum l2l_schedule_kind {
  L2L_SCHEDULE_CONSTANT = 0,
  L2L_SCHEDULE_COSINE = 1,
  L2L_SCHEDULE_LINEAR = 2
} l2l_schedule_kind;

typedef struct l2l_schedule_config {
  l2l_schedule_kind kind;
  int64_t warmup;        /* >= 0 updates */
  int64_t total;         /* cosine, linear: > warmup */
  float final_ratio;     /* in [0, 1] */
} l2l_schedule_config;

L2L_API l2l_status l2l_schedule_lr(double *out, const l2l_schedule_config *schedule, double base_lr,
                                   int64_t t);

/* ---------------------------------------------------------------- the relay and the EPS
   A relay trains a list of layers whose parameters live in the host pool: the eager
   parameter server (EPS) keeps, per parameter record, the fp32 master (the record's value
   tensor), the gradient accumulator (the record's grad tensor), the optimizer state and
   a staging copy in the pinned pool. A step runs the layers one at a time on the device
   pool's backend: forward over layers with a micro-batch inner loop, then backward in
   reverse; each layer's parameters are copied into one of two device slots while the
   previous layer computes; when a layer's gradient is complete for the minibatch, its
   update runs on the optimizer threads while the device goes on with earlier layers.
   The next step's forward of a layer waits only for that layer's update.
   A layer may be in one relay at a time; freed while there, it is freed when the relay
   lets it go. Between steps the model may change (insert, remove,
   replace, freeze); every other record keeps its weights and optimizer state.
   Result: the same as plain whole-batch training (one pass, every activation kept) to
   float rounding, for any micro-batch size and any policy. */
typedef struct l2l_relay l2l_relay;

/* Where the activations at a layer boundary (the input of layer l, l >= 1) wait for the
   backward: device (memory grows with depth), host (copied out and back, overlapped:
   device memory constant in depth), or recompute (dropped; rebuilt in backward from the
   nearest earlier boundary that is kept). The gradient crossing a host boundary goes
   through the host too. */
typedef enum l2l_stash_policy {
  L2L_STASH_DEVICE = 0,
  L2L_STASH_HOST = 1,
  L2L_STASH_RECOMPUTE = 2
} l2l_stash_policy;

/* What a layer's backward needs from its forward: recompute (rerun the forward from the
   stashed input, L2L's default), keep (the saved state stays in the device pool from
   forward to backward), swap (the saved state goes to the host after forward and comes
   back before backward, overlapped with other work: KARMA's swap). */
typedef enum l2l_inner_policy {
  L2L_INNER_RECOMPUTE = 0,
  L2L_INNER_KEEP = 1,
  L2L_INNER_SWAP = 2
} l2l_inner_policy;

/* Data parallel (see "data parallel" below). */
typedef enum l2l_dist_mode { L2L_DIST_NONE = 0, L2L_DIST_MPI = 1 } l2l_dist_mode;

/* Where the parameter records live and are updated (see l2l_relay_config.placement). */
typedef enum l2l_placement {
  L2L_PLACE_HOST = 0,
  L2L_PLACE_DEVICE = 1,
  L2L_PLACE_AUTO = 2
} l2l_placement;

typedef struct l2l_relay_config {
  int64_t micro_batch;          /* samples per micro-batch, >= 1; the last may be smaller */
  l2l_stash_policy stash;       /* every boundary's policy to begin with */
  int recompute_every;          /* stash = recompute: boundaries k, 2k, ... stay on the
                                   device, the others are rebuilt; >= 1 */
  l2l_inner_policy inner;       /* every layer's policy to begin with */
  l2l_optimizer_config optimizer;
  l2l_schedule_config schedule;
  float clip_global_norm;       /* > 0: scale all gradients to this global norm at most;
                                   updates then wait for the end of backward. 0: off */
  float clip_layer_norm;        /* > 0: each layer's gradient (its visit's contribution)
                                   to this norm at most; updates stay eager. 0: off */
  int accumulate;               /* minibatches whose mean gradient makes one update, >= 1 */
  int optimizer_threads;        /* EPS worker threads, >= 1; 0: the CPUs the process may
                                   run on (its affinity: a container's cpuset, taskset),
                                   on a GPU less the relay's own 3 (its compute thread and
                                   copy lanes; 4 with ranks), at least 1 */
  uint64_t seed;                /* dropout draws (l2l_layer_batch.seed) */
  int param_slots;              /* device buffers for layer parameters, each the size of the
                                   largest layer: 2 (L2L's double buffer: the visit's and
                                   the next one's; 0 means 2) to 4096. Each more one keeps
                                   one more of the forward's last layers on the device for
                                   their backward, which then copies nothing for them;
                                   slots >= layers copy each layer in once a step. */
  float loss_scale;             /* > 0: dynamic loss scaling (for 16-bit gradients; works on
                                   any device) starting at this scale: the loss gradient is
                                   multiplied by it and the update divides it out; a
                                   minibatch whose gradients hold an inf or NaN anywhere
                                   updates nothing (stats.skipped_updates) and halves the
                                   scale, loss_scale_window updates in a row without one
                                   double it (within 2^-64 .. 2^100). Updates then wait for
                                   the end of backward. 0: off */
  int loss_scale_window;        /* updates without overflow before the scale doubles,
                                   >= 1 (the default: 2000; 0 means 2000 too) */
  l2l_dtype precision;          /* the device's weights: f32, or bf16 / f16 ("cross mixed
                                   precision"; l2l_relay_config_default picks bf16 when the
                                   device pool is a GPU's, f32 on the CPU backend): the
                                   masters stay f32 on the host (the optimizer state in
                                   optimizer.state's precision); each GEMM weight and token
                                   table has a 16-bit staging copy the EPS workers rewrite
                                   at every step's start, so transfers move 16-bit weights
                                   and the layers' GEMMs read 16-bit weights and 16-bit-
                                   rounded activations, accumulating in f32 (so do the
                                   attention products on a GPU); an activation that only
                                   those GEMMs read (LayerNorm's and GELU's outputs where
                                   no backward reads them in f32, the logits' gradient) is
                                   kept in 16 bits, half its bytes, written so by the op
                                   that makes it. f16 wants loss_scale. */
  l2l_dtype grad_precision;     /* gradients out of the device: f32 (0, the default), or
                                   bf16 / f16: the gradient of each GEMM weight and token
                                   table (the parameters `precision` makes 16-bit, whatever
                                   `precision` is) still accumulates over the visit's
                                   micro-batches in f32 on the device, is rounded once to
                                   16 bits and crosses at half the bytes; the host widens
                                   it and accumulates in f32. Other gradients stay f32. f16
                                   needs loss_scale, which keeps gradients in f16's range and
                                   skips a step where one became inf. */
  l2l_dist_mode dist;           /* L2L_DIST_NONE (0): this process alone. L2L_DIST_MPI: data
                                   parallel across the ranks of MPI_COMM_WORLD (see "data
                                   parallel"); every rank makes the same relay over the
                                   same model and steps it with its own slice of each
                                   minibatch */
  int nonfinite_error;          /* a record whose gradient holds an inf or NaN is not updated
                                   (with loss scaling or global clipping: no record is), nor
                                   one with an element of 2^63 or more as the update takes it
                                   (unscaled and clipped: Adam's second moment, its square,
                                   would near f32's largest; optimizer state stays finite).
                                   0: said once on stderr; 1: the step, done and counted
                                   (the other records updated, *loss its loss, which may
                                   be the inf or NaN), then returns L2L_ERR_STATE */
  uint64_t device_budget;       /* > 0: the device bytes this relay's steps and evaluations
                                   may hold at their peak (its slots, activations and
                                   working memory: the planner's replay of the step, checked
                                   before it runs, which refuses a step over it with the
                                   smallest budget that works). Two relays may hold
                                   different budgets. 0: none of its own. The device pool's
                                   budget (l2l_pool_set_budget) is the process's cap over
                                   every relay and tensor, checked too */
  uint64_t host_budget;         /* > 0: the host bytes this relay's EPS may hold (masters,
                                   gradient accumulators, staging copies, optimizer state
                                   in memory and read ahead), checked before each training
                                   step: with spill_dir the optimizer state of the records
                                   beyond it lives in the spill file, else a step over it
                                   is refused, naming the smallest that works. 0: none */
  const char *spill_dir;        /* NULL: the EPS lives in host memory. A directory (which
                                   must exist, on a local disk): the relay's spill file
                                   (l2l-spill-<pid>-<n>.bin) is made there, and the
                                   optimizer state of every record host_budget does not
                                   keep in memory lives in it between its updates, read
                                   ahead of its update in the schedule's order and written
                                   back behind it; the numbers are the same to the bit.
                                   The file is removed with the relay; one a crashed run
                                   left is named on stderr, never reused. Copied. With
                                   dist each rank spills its own shard's state. Under a
                                   host_budget too small for them all, the gradient
                                   accumulators, zero between updates, give their pages
                                   back then (stats.spill_grad_waits) */
  l2l_dtype master;             /* the masters of the GEMM weights and token tables (the
                                   parameters `precision` makes 16-bit): f32 (0), or bf16,
                                   which needs precision bf16. bf16: while its
                                   layer is in the relay such a parameter's value is a bf16
                                   tensor in the pinned pool (l2l_param_value: a view taken
                                   before the relay is of the f32 values it had, which stop
                                   changing), itself what the device reads (no staging copy:
                                   2 bytes a parameter instead of 6); each update runs in f32
                                   and rounds the result to bf16 stochastically (unbiased:
                                   an update far below a bf16 ulp still moves the weight on
                                   average), with Philox draws keyed by (seed, the layer's
                                   rng id and the parameter, the update count and the
                                   element), so the same run gives the same bits and a
                                   resumed one continues exactly. A layer leaving the relay
                                   (remove, replace, the relay freed) gets f32 values again,
                                   equal to the bf16 ones. The others stay f32 */
  l2l_placement placement;      /* where every record's master, gradient accumulator and
                                   optimizer state live and are updated. L2L_PLACE_HOST
                                   (0): the EPS in host memory, updated by its workers while
                                   the device runs on; the device reads 16-bit staging
                                   copies over the link. L2L_PLACE_DEVICE: in the device
                                   pool, for a model whose records fit there: a parameter's
                                   value (f32, or its bf16 master) and grad (f32) become
                                   device tensors while its layer is in the relay (f32 host
                                   tensors again, equal, when it leaves), each gradient is
                                   added there as its visit ends
                                   and each record is updated there by the same optimizer
                                   as soon as it is complete, so no weight, gradient or
                                   state crosses the link; on the CPU backend the same bits
                                   as host placement. The state in its precision (f32,
                                   bf16 or 8 bits) and bf16 masters rounded by the same
                                   draws, and per-layer clipping with each visit's factor
                                   found there, as on the host. With dist mpi each
                                   rank updates the whole record on its device from the
                                   ranks' reduced gradient (through pinned memory), to
                                   host placement's bits. With spill_dir the file holds
                                   the host's records' state alone. L2L_PLACE_AUTO: before each training
                                   step the planner places on the device the records that
                                   fit beside the step's peak within the device budget
                                   (device_budget, or what the device pool's leaves; none:
                                   what the device's free memory leaves as it places,
                                   less a twentieth of the device, or every record where
                                   the device is host memory): every one when all fit, else a layer's
                                   records at a time (with those of the layers it shares a
                                   record with: a visit's records in one place), the
                                   largest first, each while they fit (the rest on the
                                   host), moved
                                   between steps as the batch's shape, the budgets or the
                                   layers change; the same bits whatever it moved. With
                                   dist mpi the ranks place together: each within its own
                                   budget, then, where they differ, within the groups
                                   every rank placed, until all place alike (a record
                                   moving to the device takes the whole state gathered
                                   from every rank's shard, one moving back its own part).
                                   The ranks must agree on it. C's default config holds
                                   L2L_PLACE_HOST; l2l.Relay and l2l.plan take
                                   L2L_PLACE_AUTO where a device budget is given. */
} l2l_relay_config;

/* AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), constant schedule, micro-
   batch 1, stash host, every 1, inner recompute, no clipping, accumulate 1, threads 0,
   param slots 2, precision bf16 when the device pool is on a GPU (f32 on the CPU backend),
   grad_precision f32. */
L2L_API void l2l_relay_config_default(l2l_relay_config *out);

/* What one step (or evaluation) gets. tokens (B,S) i32 in [0, V) and targets ((B,S) for an
   LM head, (B) for a classifier; i32, -1 = ignored) in the host or pinned pool; optional
   token_types (B,S) i32 and key_mask (B,S) u8 likewise. skip: NULL, or one byte per layer,
   1 = skip that block this step (LayerDrop: it acts as the identity and is not updated;
   only blocks and custom layers can be skipped). */
typedef struct l2l_relay_batch {
  const l2l_tensor *tokens;
  const l2l_tensor *targets;
  const l2l_tensor *token_types;
  const l2l_tensor *key_mask;
  const uint8_t *skip;
} l2l_relay_batch;

/* Work the relay records for a timeline: every unit of work with its layer (-1: none),
   micro-batch (-1: none), phase, thread (0 the calling thread, 1 the host-to-device copy
   thread, 2 the device-to-host copy thread, 3.. optimizer workers) and times in seconds
   since the relay was made. */
typedef enum l2l_relay_phase {
  L2L_PHASE_FORWARD = 0,
  L2L_PHASE_BACKWARD = 1,     /* includes the forward rerun of inner = recompute */
  L2L_PHASE_REBUILD = 2,      /* a dropped boundary rebuilt by rerunning forward */
  L2L_PHASE_PARAMS_IN = 3,    /* parameters into a device slot */
  L2L_PHASE_GRADS_OUT = 4,    /* a layer's gradient out of the device */
  L2L_PHASE_STASH_OUT = 5,    /* boundary activations or gradients to the host */
  L2L_PHASE_STASH_IN = 6,
  L2L_PHASE_SWAP_OUT = 7,     /* a saved state to the host */
  L2L_PHASE_SWAP_IN = 8,
  L2L_PHASE_UPDATE = 9,       /* the optimizer on one parameter record */
  L2L_PHASE_WAIT_COPY = 10,   /* the calling thread waited for a copy */
  L2L_PHASE_WAIT_UPDATE = 11, /* the calling thread waited for an update */
  L2L_PHASE_REDUCE_SCATTER = 12,  /* data parallel: a record's gradient summed across ranks
                                     (from posting to completion, on the communication
                                     thread's lane: 3 + optimizer_threads) */
  L2L_PHASE_ALL_GATHER = 13   /* data parallel: a record's updated master gathered */
} l2l_relay_phase;

typedef struct l2l_relay_event {
  int32_t layer;
  int32_t micro_batch;
  int32_t phase;
  int32_t thread;
  double start, end;
} l2l_relay_event;

/* After each step (figures of that step unless "total"). Seconds are wall time on the
   thread that did the work. */
typedef struct l2l_relay_stats {
  int64_t steps;                /* total steps run */
  int64_t updates;              /* total optimizer updates (of the whole model) */
  double loss;                  /* the last step's loss */
  double lr;                    /* the rate of the last update */
  double grad_norm;             /* global gradient norm before clipping, computed with global
                                   clipping or loss scaling (inf or NaN: an overflow; -1:
                                   not computed) */
  int updates_deferred;         /* 1: updates waited for the end of backward (global
                                   clipping, loss scaling) */
  uint64_t device_peak;         /* the step's device peak: the device pool's bytes in use when
                                   it began plus the most its own allocations added (those
                                   of relays stepping at once on other threads do not count;
                                   the pool's own peak is the process's, left to the user) */
  uint64_t device_current;      /* in use after it */
  uint64_t host_eps_bytes;      /* EPS: masters, accumulators, optimizer state, staging */
  uint64_t host_stash_peak;     /* most host bytes holding stashed activations or states */
  uint64_t h2d_bytes, d2h_bytes;
  double step_seconds;          /* the call, from its checks to its return: every time below
                                   spent on the calling or a copy thread lies within it */
  double compute_seconds;       /* layers' forward and backward: on the CPU backend the
                                   calling thread's time in them, on a GPU the device's
                                   (timed by events on its compute stream) */
  double wait_copy_seconds;     /* the calling thread waiting for copies (on a GPU the
                                   device may still be computing meanwhile) */
  double exposed_copy_seconds;  /* the copy time compute did not hide: compute idle until
                                   parameters or activations it needed were in (on the CPU
                                   backend the calling thread's waits for them, on a GPU
                                   the device's idle time before those copies ended) */
  double wait_update_seconds;   /* the calling thread waiting for updates: the optimizer
                                   time compute did not hide */
  double optimizer_seconds;     /* summed over optimizer threads */
  double h2d_seconds, d2h_seconds;  /* busy on each copy thread (its bytes / its seconds:
                                       the rate that direction reached) */
  int64_t events;               /* events recorded in the step (l2l_relay_events) */
  double loss_scale;            /* dynamic loss scaling: the scale the next step uses (0:
                                   off) */
  int64_t loss_scale_good;      /* updates without overflow since the scale last changed */
  int64_t skipped_updates;      /* total steps whose update was skipped for an inf or NaN:
                                   in whole (overflow) or for some records (skipped_records) */
  int overflow;                 /* 1: the last step's gradients overflowed (no update) */
  int64_t skipped_records;      /* last step: records whose inf or NaN gradient (or one of
                                   2^63 or more) was dropped and their update skipped (see
                                   nonfinite_error) */
  int dist_ranks;               /* data parallel: the ranks (1: this process alone) */
  uint64_t dist_sent_bytes;     /* the last update's exchanges: what this rank's collectives */
  uint64_t dist_received_bytes; /* send and receive, as a ring moves them ((N - 1) / N of each
                                   record's f32 gradient by reduce-scatter, as much again by
                                   all-gather; none for a skipped record; not counted on
                                   the wire) */
  uint64_t spill_read_bytes;    /* the spill file (config.spill_dir), since the last step
                                   began: bytes read back and written out (a step's updates
                                   may end after it returns: read the stats after
                                   l2l_relay_sync for a step's whole) */
  uint64_t spill_written_bytes;
  int64_t spill_late_reads;     /* of them, records whose state was read at their update
                                   rather than ahead of it (the read-ahead window was full) */
  int64_t spill_grad_waits;     /* gradient arrivals that waited for room among the passing
                                   accumulators (in memory from their arrival to their
                                   update: with a spill file every gradient accumulator
                                   is zero between updates and gives its pages back; see
                                   host_budget) */
  uint64_t spill_file_bytes;    /* the spill file's size */
  double exposed_comm_seconds;  /* last step: the calling thread waiting for MPI: the
                                   exchanges of counts and losses, and records whose
                                   exchange was not done when it needed them */
  uint64_t host_pass_bytes;     /* host memory the EPS's passes read and wrote since the
                                   last step began (gradient adds or the checks of held
                                   gradients, updates with their gradient, master, state
                                   and the accumulator's clear, staging rewrites), counted
                                   from each pass's elements and sizes as bench/optim
                                   counts them (its updates may end after the step
                                   returns: read after l2l_relay_sync for a step's whole) */
  uint64_t device_records_bytes;   /* the records placed on the device (placement device or
                                   auto): their bytes there (masters, gradients, state,
                                   16-bit copies), held between steps */
  uint64_t device_start;        /* the device pool's bytes in use as the step's visits began
                                   (with the records placement auto moved there for it):
                                   device_peak less this is the step's own peak, what a
                                   plan's device_peak predicts */
} l2l_relay_stats;

/* A relay over layers[0..nlayers) (the list may be empty only until the first step):
   checks the config and each layer (parameters in the host pool, f32; one dim for all) and
   makes the EPS records. The model's order (an input layer first, a head last, body layers
   between) is checked by each step and each save, not here nor by the changes below: a
   list may be built, or changed, through shapes no step could run. */
L2L_API l2l_status l2l_relay_new(l2l_relay **out, l2l_layer *const *layers, int nlayers,
                                 const l2l_relay_config *config);
/* The checks l2l_relay_new makes of a config, alone (l2l.plan asks them of the settings it
   plans for, so that a plan is never made for a relay that would be refused). */
L2L_API l2l_status l2l_relay_config_check(const l2l_relay_config *config);

/* The options, one table. Every field of l2l_relay_config, of its optimizer and of its
   schedule is a row of one table (src/core/options.def), from which come
   l2l_relay_config_default's defaults, the field-by-field checks above, the ranks' digest,
   the replay's step key, the Lua readers of l2l.Relay's options, a checkpoint's keys and
   `l2l train`'s flags. A row: */
typedef enum l2l_option_group {
  L2L_OPTION_RELAY = 0,         /* a field of l2l_relay_config */
  L2L_OPTION_OPTIMIZER = 1,     /* of its optimizer (l2l_optimizer_config) */
  L2L_OPTION_SCHEDULE = 2       /* of its schedule (l2l_schedule_config) */
} l2l_option_group;
typedef enum l2l_option_type {
  L2L_OPTION_INT = 0,           /* int */
  L2L_OPTION_INT64 = 1,         /* int64_t */
  L2L_OPTION_UINT64 = 2,        /* uint64_t */
  L2L_OPTION_FLOAT = 3,         /* float, always finite */
  L2L_OPTION_CHOICE = 4,        /* an enum (int-sized): one of the row's choices */
  L2L_OPTION_BOOL = 5,          /* int, 0 or 1 */
  L2L_OPTION_PATH = 6           /* const char *: NULL (none) or a non-empty string */
} l2l_option_type;
/* What a checkpoint does with an option: keeps it (RUN); keeps it and lets a load give
   another, as the machine's rather than the run's (LOAD); keeps it in a form of its own,
   the optimizer's and the schedule's fields (OWN). */
typedef enum l2l_option_keep { L2L_KEEP_RUN = 0, L2L_KEEP_LOAD = 1, L2L_KEEP_OWN = 2 } l2l_option_keep;
enum {
  L2L_OPTION_AGREE = 1,         /* every rank of a data-parallel run must hold the same */
  L2L_OPTION_STEP = 2,          /* the device replay of a step depends on it */
  L2L_OPTION_OPEN_LOW = 4,      /* min is excluded */
  L2L_OPTION_OPEN_HIGH = 8,     /* max is excluded */
  L2L_OPTION_SGD = 16,          /* its bounds apply to SGD only */
  L2L_OPTION_ADAM = 32,         /* its bounds apply to AdamW and LAMB only */
  L2L_OPTION_DECAY = 64,        /* a cosine or linear schedule's only (a checkpoint keeps it
                                   for those) */
  L2L_OPTION_PLAN = 128         /* the planner takes it: it sets memory or time and a plan
                                   does not choose it (l2l.plan's options) */
};
/* The kinds of optimizer (SGD, AdamW, LAMB) and of schedule (constant, cosine, linear): a
   row's kind_default has a value for each, by the kind's value. */
enum { L2L_OPTION_KINDS = 3 };
typedef struct l2l_option {
  const char *name;             /* as l2l.Relay, the optimizers, schedules and flags take it */
  const char *field;            /* the C field in the group's struct */
  l2l_option_group group;
  l2l_option_type type;
  size_t offset;                /* of the field in the group's struct */
  double min, max;              /* the bounds the check applies (numbers) */
  int flags;                    /* L2L_OPTION_AGREE | ... */
  l2l_option_keep keep;
  int nchoices;                 /* CHOICE: its names and values, in the order of the values */
  const char *const *choice_names;
  const int *choice_values;
  const char *help;             /* one line */
  double kind_default[L2L_OPTION_KINDS];  /* OPTIMIZER, SCHEDULE rows: the field's value in a
                                   config of each kind (l2l_optimizer_kind, l2l_schedule_kind)
                                   made with no options: the default where the kind takes the
                                   option (flags SGD, ADAM, DECAY say which do), what its field
                                   holds where not; NAN where that kind must be given it.
                                   l2l_relay_config_default's are AdamW's and the constant
                                   schedule's. RELAY rows: 0 (l2l_relay_config_default's) */
} l2l_option;
/* The number of rows, and row `index` (0 .. count - 1) into *out (never to be freed). */
L2L_API int l2l_relay_option_count(void);
L2L_API l2l_status l2l_relay_option(const l2l_option **out, int index);
/* Waits for pending work, then frees the EPS's state (not the layers, but those freed while
   it held them). NULL is fine. A relay in another call (see "Threads" above) is not freed:
   l2l_last_error says so. */
L2L_API void l2l_relay_free(l2l_relay *run);

L2L_API int l2l_relay_layer_count(const l2l_relay *run);  /* -1 if not a relay or in another call */
L2L_API l2l_layer *l2l_relay_layer(const l2l_relay *run, int index);    /* NULL if out of range */
/* The relay holding the layer: NULL if none (or not a layer). */
L2L_API l2l_relay *l2l_layer_relay(const l2l_layer *layer);
/* Dynamic architecture, between steps. insert: the layer goes to position index (0..n),
   its new records start with fresh optimizer state. remove: the layer leaves the relay
   (not freed, unless l2l_layer_free was called while it was there); records nobody else
   uses leave the EPS. replace: remove + insert. A layer whose record a later layer holds
   and no earlier one does (the embedding of a tied head) may not leave while that layer
   stays (L2L_ERR_STATE, naming it). */
L2L_API l2l_status l2l_relay_insert(l2l_relay *run, int index, l2l_layer *layer);
L2L_API l2l_status l2l_relay_remove(l2l_relay *run, int index);
L2L_API l2l_status l2l_relay_replace(l2l_relay *run, int index, l2l_layer *layer);
/* A frozen layer still passes gradients back but its records are not updated (a record
   shared with a trainable layer is updated from that layer's gradient alone). Frozen part
   way through an accumulation, its records drop the gradient they collected in it (one a
   trainable layer also holds keeps its sum). */
L2L_API l2l_status l2l_relay_set_frozen(l2l_relay *run, int index, int frozen);
L2L_API int l2l_relay_frozen(const l2l_relay *run, int index);           /* -1 if out of range */
/* Boundary b is the input of layer b, 1 <= b < layers. Policies follow their boundary or
   layer through insertions and removals; new ones get the config's default. */
L2L_API l2l_status l2l_relay_set_stash(l2l_relay *run, int boundary, l2l_stash_policy policy);
L2L_API l2l_status l2l_relay_set_inner(l2l_relay *run, int index, l2l_inner_policy policy);
L2L_API l2l_status l2l_relay_set_micro_batch(l2l_relay *run, int64_t micro_batch);
/* config.device_budget from the next step on (0: none of its own). */
L2L_API l2l_status l2l_relay_set_device_budget(l2l_relay *run, uint64_t bytes);
/* config.host_budget from the next training step on (0: none). */
L2L_API l2l_status l2l_relay_set_host_budget(l2l_relay *run, uint64_t bytes);
/* The policy of a boundary or layer (an l2l_stash_policy / l2l_inner_policy), -1 if out
   of range. */
L2L_API int l2l_relay_stash(const l2l_relay *run, int boundary);
L2L_API int l2l_relay_inner(const l2l_relay *run, int index);

/* One training step on a minibatch: *loss = mean loss over all real targets. The update
   (on the last of `accumulate` minibatches) may still be running on the optimizer threads
   when this returns; the next step, l2l_relay_sync and reading a parameter through the
   relay's functions wait for it. A step its checks refuse (the batch, the budgets, the
   model's shape) changes nothing. One that fails after its backward began (a custom
   layer's error, a copy or disk failure) has updated the records whose gradients were
   complete before it (each is updated the moment its gradient is, on the last minibatch
   of an accumulation): those updates stand, the step is not counted, the other records'
   gradients of this step are dropped; a checkpoint is the way back. (The one failure of
   a step that is done and counted: nonfinite_error's.) */
L2L_API l2l_status l2l_relay_step(double *loss, l2l_relay *run, const l2l_relay_batch *batch);
/* Forward only, no dropout, nothing stashed, no update: the mean loss. */
L2L_API l2l_status l2l_relay_evaluate(double *loss, l2l_relay *run, const l2l_relay_batch *batch);
/* *peak: the device bytes a training step of a (batch, seq) minibatch needs at its peak
   with the relay's layers, policies and settings as they are (every layer active),
   whatever values the weights take as training goes on (the frugal modes keep more for a
   LayerNorm whose weight gets tiny): the planner's replay of the step, exact to the byte
   for the weights that need the most (with swap, the bound that holds whatever the
   copies' timing), plus the relay's records placed on the device (placement device, or
   auto's present choice), which its budget holds too. A relay device_budget of this runs
   every such step (so does a device pool budget of the bytes in use, those records
   among them, plus this less the records).
   token_types, key_mask: 0 or 1, whether the batch has them. */
L2L_API l2l_status l2l_relay_step_peak(uint64_t *peak, const l2l_relay *run, int64_t batch, int64_t seq,
                                       int token_types, int key_mask);
/* Waits until every queued update is done (parameters readable and stable). */
L2L_API l2l_status l2l_relay_sync(l2l_relay *run);

L2L_API l2l_status l2l_relay_get_stats(l2l_relay_stats *out, const l2l_relay *run);
/* Copies events first .. first+count-1 of the last step (count <= stats.events - first). */
L2L_API l2l_status l2l_relay_events(l2l_relay_event *out, const l2l_relay *run, int64_t first,
                                    int64_t count);
/* The optimizer state of a record in the relay: which = 0 the first moment (SGD: the
   momentum buffer), 1 the second moment, in the precision the optimizer keeps it in (see
   "optimizers": 8bit is a u8 vector of codes and scales). *out is borrowed (NULL while the record has none
   yet, e.g. before its first update) until the next step, or until this is asked of
   another record (a copy read from the spill file or gathered from the ranks is freed
   then: a checkpoint holds one record's state at a time). Waits for pending updates. */
L2L_API l2l_status l2l_relay_param_state(l2l_tensor **out, l2l_relay *run, const l2l_param *param,
                                         int which);

/* Checkpoints: what a relay holds beyond its layers' parameters, read and restored, so a
   run rebuilt from saved layers continues exactly. A record's update count is the t of its
   last update (0 before the first); every count a restore takes is at most 2^53 - 1 (the
   largest integer a checkpoint's JSON holds exactly: later steps count on from it without
   reaching int64's end). l2l_relay_restore_param gives a record that count and
   copies of its optimizer state (first, second: in any of the state's precisions, f32 or
   bf16 with the parameter's element count or 8bit's u8 vector, converted into the relay's
   own — the same precision is copied to the bit; every value must be finite and a second
   moment >= 0 — NULL for arrays the optimizer does not keep, both NULL when updates is 0).
   l2l_relay_restore_progress sets the steps and updates done, which place the schedule and
   the dropout draws; l2l_relay_restore_loss_scale the dynamic loss scale, its count of good
   updates and the skipped updates (as stats report them; the relay must scale its loss).
   All wait for pending updates; a refused call changes nothing. */
L2L_API l2l_status l2l_relay_param_updates(int64_t *out, l2l_relay *run, const l2l_param *param);
L2L_API l2l_status l2l_relay_restore_param(l2l_relay *run, const l2l_param *param, int64_t updates,
                                           const l2l_tensor *first, const l2l_tensor *second);
L2L_API l2l_status l2l_relay_restore_progress(l2l_relay *run, int64_t steps, int64_t updates);
L2L_API l2l_status l2l_relay_restore_loss_scale(l2l_relay *run, double scale, int64_t good,
                                                int64_t skipped);

/* A relay's training state in one file, the front end's checkpoint (run:save, l2l.load):
   a file either writes the other reads. It is safetensors: each parameter record's master
   ("<layer from 1>.<param>", f32, or bf16 for a bf16 master; a record shared by two
   layers once, under its first), its optimizer state ("<name>.m", "<name>.v": in the
   relay's state precision, 8bit as its u8 vector) and, part way through `accumulate`
   minibatches, its gradient ("<name>.grad"), each with an XXH3-64 checksum; and under the
   metadata key "l2l" a JSON description: the layers (kind, constructor options, rng id,
   frozen flag, policies), the records' update counts, every option of the relay with the
   optimizer and schedule, the steps and updates done, the loss scale's state, and the
   caller's "extra" (docs/design.md, "Checkpoints in C"; src/relay/describe.c the document).
   l2l_relay_save writes it atomically, one record at a time (one record's state in
   memory at once, read from the spill file if it lives there): a temporary beside path
   (made new, O_EXCL | O_NOFOLLOW, mode 0600 until renamed), synced, renamed over path; a
   failure removes the temporary and leaves a file at path as it was. Every state array
   is checked as l2l_relay_restore_param would check it before it is written (what a save
   writes, a load takes). A model no step could run (the order an embedding first, a head
   last, body layers between, which a change may pass through) is refused before anything
   is written, as is a path holding anything but a regular file (a device, a FIFO); a link
   to a regular file is written through. Mid-accumulation with dist = L2L_DIST_MPI it is
   refused (each rank holds a part of the gradient); otherwise with ranks every rank calls
   it (the state is gathered from the shards) and rank 0 writes the file one process would.
   options may be NULL (all 0):
     replace  1: a file at path may be replaced; 0: one is refused (L2L_ERR_STATE) and left
              as it is, even one that appears while the save writes;
     extra    NULL, or JSON text (an object or array) kept as the description's "extra";
     layers   NULL: the relay describes its layers (a custom layer by its kind's name, with
              options {}); or JSON text, an array of one object per layer with its "kind",
              "options" (and "custom") as the front end writes them: for layers whose
              constructor options only the caller knows. Checked as a load checks them;
              the rng ids, frozen flags and policies are the relay's either way;
     relay    NULL: the relay's options as its config holds them; or JSON text, an object
              as the front end writes it (checked as a load checks it).
   Counts and sizes the description holds must be at most 2^53 - 1 (the seed, budgets). */
typedef struct l2l_save_options {
  int replace;
  const char *extra;
  const char *layers;
  const char *relay;
} l2l_save_options;
L2L_API l2l_status l2l_relay_save(l2l_relay *run, const char *path, const l2l_save_options *options);
/* Loads a file l2l_relay_save (or run:save) wrote into a relay over the same model: the
   caller builds the layers (the same kinds, constructor options and parameter shapes; the
   weights may be anything) and the relay (the options that change the numbers as the
   file's run had them: the optimizer but its state's precision, the schedule, clipping,
   accumulate, seed, loss scaling, precision, grad_precision, nonfinite_error; the rest
   are this relay's: micro-batch, budgets, threads, slots, spill, dist, master, placement,
   and the state's precision, into which the state is converted). It restores the weights, each
   record's optimizer state and update count, a gradient saved mid-accumulation, the
   steps and updates done, the loss scale's state, and each layer's rng id, frozen flag
   and policies: training goes on as the saved run would have, to the bit on the CPU. The
   whole file is checked before anything changes (the description against the relay,
   every record's name, shape and dtype, every checksum, every state array as
   l2l_relay_restore_param checks it): a refused load leaves the relay as it was
   (L2L_ERR_INVALID for a file that does not fit or is damaged, L2L_ERR_IO for one that
   cannot be read), its message naming the file, the record and what is wrong. The data
   is read twice (checked, then restored), one record at a time. Only a failure past the
   checks (the disk, memory, a file changed meanwhile) leaves the relay partly loaded, and
   says so: load it again, or free it. */
L2L_API l2l_status l2l_relay_load(l2l_relay *run, const char *path);
/* The JSON description a checkpoint at path holds (see l2l_relay_save), read from its
   header alone (no tensor is read): its extra, steps, layers, to decide before loading.
   *length gets its length in bytes; out, when not NULL, gets it and a terminating NUL, for
   which capacity must leave room (else L2L_ERR_INVALID, nothing written to out, and
   *length says what it takes). */
L2L_API l2l_status l2l_checkpoint_description(char *out, size_t capacity, size_t *length,
                                              const char *path);

/* ---------------------------------------------------------------- calibrating the planner
   The planner (l2l/plan.h) times a step from rates measured on this machine. One of them,
   the fixed cost of a layer visit, shows only when a relay runs, so the relay measures
   them: the planner, below the relay, never runs one. */

/* The rates, declared with the planner (l2l/plan.h, which comes after this part). */
typedef struct l2l_plan_rates l2l_plan_rates;
/* This machine's rates for the device backend in use and this many threads: from the
   cache ($XDG_CACHE_HOME/l2l/, else ~/.cache/l2l/), measured when missing or when
   remeasure is 1: copies each way, the host optimizer, and a visit's fixed cost (a small
   model trained a few steps). Layers are timed (and cached) when first planned. Until
   this has run once, plans with rates NULL count no visit cost. */
L2L_API l2l_status l2l_relay_calibrate_plan(l2l_plan_rates *out, int remeasure);
/* Deprecated: l2l_relay_calibrate_plan's name in l2l 0.1 (it is the relay's: src/relay/
   defines it), the same function; gone in the next release. */
L2L_API l2l_status l2l_plan_calibrate(l2l_plan_rates *out, int remeasure)
        L2L_DEPRECATED("use l2l_relay_calibrate_plan");

/* L2L_FFI_END */
