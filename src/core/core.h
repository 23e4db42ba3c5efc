/* SPDX-License-Identifier: MIT */
/* core.h — the core's interface: what every part of libl2l builds on, and users never see.
 *
 * Purpose: errors with messages, half floats, the counter-based generator, tensor handles
 * and their layout, the memory pools and the device table they get device memory from,
 * the block cache, queues of jobs served by threads, the clock, the relay's timeline, and
 * safetensors files (read and written atomically, with checksums).
 * The core knows the device only through the table a backend installs (struct
 * device_ops): it never names a backend, never runs an op, and never includes a
 * header of the parts above it (backend, layers, eps, relay); scripts/archcheck keeps it
 * so.
 * Must never: print, exit or abort on user input or a refused allocation; be included by
 * code outside src/ (the tests' white-box files aside).
 */
#ifndef L2L_CORE_H
#define L2L_CORE_H

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "l2l.h"

/* ---------------------------------------------------------------- errors */

/* Records a formatted message as this thread's last error and returns `status`, so that
   a check reads `if (bad) return core_fail(L2L_ERR_INVALID, "...", ...);`. */
l2l_status core_fail(l2l_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The same, prefixed with the calling function's name. */
#define FAIL(status, ...) core_fail_in(__func__, (status), __VA_ARGS__)
l2l_status core_fail_in(const char *func, l2l_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* What the message just recorded names (l2l_last_error_detail): each returns `status`, so
   that a check reads `return error_note_layer(FAIL(...), k);`. */
l2l_status error_note_layer(l2l_status status, int layer);
l2l_status error_note_needed(l2l_status status, uint64_t bytes);
l2l_status error_note_field(l2l_status status, const char *field);
l2l_status error_note_micro_batch(l2l_status status, int64_t micro_batch);
l2l_status error_note_element(l2l_status status, int dims, const int64_t *index);
/* Marks in a message's format around the words that name the layer, micro-batch or field
   the detail notes: "%s must be >= 1" with L2L_NAMED_FIELD "config->accumulate" L2L_NAMED_END
   as its argument, or in the format itself. The marks are not in the message; the detail
   says where those words are (l2l_error_detail's spans), so that a front end puts its own
   names there. */
#define L2L_NAMED_START "\x1e"
#define L2L_NAMED_END "\x1f"
#define L2L_NAMED_LAYER L2L_NAMED_START "L"
#define L2L_NAMED_MICRO_BATCH L2L_NAMED_START "M"
#define L2L_NAMED_FIELD L2L_NAMED_START "F"
#define L2L_NAMED_ELEMENT L2L_NAMED_START "E"
/* The words most messages mark: a layer counted from 0, a field of the relay's config or of
   a step's batch. */
#define NAMED_LAYER L2L_NAMED_LAYER "layer %d" L2L_NAMED_END
#define NAMED_CONFIG(field) L2L_NAMED_FIELD "config->" #field L2L_NAMED_END
#define NAMED_BATCH(field) L2L_NAMED_FIELD "batch->" #field L2L_NAMED_END
/* The last message with fmt's words (marks and all) in front in place of its function's
   name, its spans moved behind them: "layers[2]: " + "the layer has dim 16, ...". The
   caller notes what its words name (the layer, the micro-batch). */
l2l_status error_wrap(l2l_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The last message named after func in place of the function it was, all else kept. */
l2l_status error_rename(const char *func, l2l_status status);
/* What a public function returns of a failure its parts or other public functions
   reported: named after itself (error_rename), so that a C caller reads the function it
   called in front ("l2l_relay_insert: the layer has dim 16 ..."), not a part's; L2L_OK as
   it is. TRY_AS is TRY doing so. */
l2l_status error_as(const char *func, l2l_status status);
#define TRY_AS(expr)                                          \
  do {                                                        \
    l2l_status try_as_status_ = (expr);                       \
    if (try_as_status_ != L2L_OK) return error_as(__func__, try_as_status_); \
  } while (0)

/* Propagate a failed status unchanged (its message is already set). */
#define TRY(expr)                                   \
  do {                                              \
    l2l_status try_status_ = (expr);                \
    if (try_status_ != L2L_OK) return try_status_;  \
  } while (0)

/* "1.50 MiB" into buf (for messages beside the exact byte count). */
const char *core_human_bytes(char *buf, size_t len, uint64_t bytes);

/* ---------------------------------------------------------------- the options' table (options.c) */
/* The rows of options.def (see l2l_option in l2l.h) and their number. */
extern const l2l_option options_rows[];
extern const int options_count;
/* Every field the table's defaults (precision f32: l2l_relay_config_default picks a GPU's). */
void options_default(l2l_relay_config *out);
/* The name of `value` among the choices of the relay's option `name` ("?" if none). */
const char *options_choice_name(const char *name, int value);
/* The struct a group's fields are in: c, its optimizer or its schedule. */
const void *option_base(const l2l_relay_config *c, l2l_option_group group);
/* A row's field in `base` (its group's struct) as a word: an integer or enum as it is, a
   float's bits, a path 1 when given. */
int64_t option_word(const l2l_option *o, const void *base);
/* Each field of `group` in `base` against its row (bounds, choices, 0 or 1, finite floats,
   a non-empty path); the bounds of SGD's or Adam's rows only for that optimizer. The first
   that fails is L2L_ERR_INVALID, "func: <prefix><field> must be ...". */
l2l_status options_check(l2l_option_group group, const void *base, int optimizer_kind,
                         const char *func, const char *prefix);

/* ---------------------------------------------------------------- half floats */

/* f32 <-> bf16 / f16, round to nearest even, as inline functions: exact conversions (what
   cross mixed precision's 16-bit device copies rely on), done with integer arithmetic so
   the result never depends on the compiler's or the CPU's rounding mode; inline so cast
   loops vectorize. The one copy of this logic in l2l: never flush subnormals or turn NaN
   into a number. */
static inline uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static inline uint16_t half_from_f32_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry out of
     the mantissa correctly bumps the exponent (up to infinity). */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float half_bf16_to_f32(uint16_t x) { return bits_float((uint32_t)x << 16); }

/* x rounded to bf16 stochastically by the low 16 bits of r: up (in magnitude) with
   probability the fraction of a bf16 ulp x lies past the value below, so the rounding is
   unbiased (a bf16 master's update, on the host and on a device alike); inf and NaN as
   nearest-even rounding keeps them. */
static inline uint16_t half_bf16_stochastic(float x, uint32_t r) {
  uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return half_from_f32_bf16(x);
  return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

/* Rounds `value >> shift` to nearest, ties to even (shift >= 1). */
static inline uint32_t shift_round_even(uint32_t value, int shift) {
  uint32_t kept = value >> shift;
  uint32_t rest = value & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1u))) kept++;
  return kept;
}

static inline uint16_t half_from_f32_f16(float x) {
  uint32_t u = float_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (a >= 0x477ff000u) return sign | 0x7c00u;  /* >= 65520 rounds past 65504: infinity */
  if (a >= 0x38800000u) {                        /* normal f16: rebias exponent by 127-15 */
    return sign | (uint16_t)shift_round_even(a - 0x38000000u, 13);
  }
  /* Subnormal f16 (units of 2^-24), or zero: the f32 significand m * 2^(e-150) is
     m * 2^(e-126) units, i.e. m shifted right by 126-e. */
  int e = (int)(a >> 23);
  if (e < 102) return sign;                      /* below 2^-25: rounds to zero */
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  return sign | (uint16_t)shift_round_even(m, 126 - e);
}

static inline float half_f16_to_f32(uint16_t x) {
  uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
  uint32_t e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
  if (e == 0) {
    float magnitude = (float)m * 0x1p-24f;       /* exact: m < 2^10 */
    return sign ? -magnitude : magnitude;
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---------------------------------------------------------------- NaNs handed out */

/* x, with any NaN made the one quiet NaN (no payload, no sign). Every double or float a
   public function hands back goes through it where it may be a NaN from data (a loss, a
   reduction, a widened 16-bit value): LuaJIT keeps its other values inside NaNs' bits
   and takes a double with such a payload for a pointer (a weight's bits from a damaged
   file crashed run:step). */
static inline double core_plain_nan(double x) { return x != x ? (double)NAN : x; }

/* ---------------------------------------------------------------- Philox (rng.c) */

/* The four 32-bit draws of Philox block `block` of (seed, stream): counter = (block,
   stream), key = seed, as rng.c states. Every backend draws through this layout. */
void philox_draws(uint32_t *out4, uint64_t seed, uint64_t stream, uint64_t block);
/* out[i] := draw first + i of (seed, stream) for i < n (word (first+i)%4 of block
   (first+i)/4): the same numbers as philox_draws, many blocks per SIMD pass. */
void philox_range(uint32_t *out, uint64_t seed, uint64_t stream, uint64_t first, int64_t n);
/* out[i] := 16-bit draw first + i of (seed, stream) for i < n: 16-bit draw j is the low half
   (j even) or the high half (j odd) of draw j / 2, so a Philox block serves eight (a bf16
   master's stochastic rounding, which takes 16 bits an element). */
void philox_halves(uint16_t *out, uint64_t seed, uint64_t stream, uint64_t first, int64_t n);

/* ---------------------------------------------------------------- pools (pool.c) */

/* Bytes an allocation of `bytes` is counted as (rounded up to L2L_ALIGN); 0 on overflow. */
uint64_t pool_accounted(uint64_t bytes);

/* ---------------------------------------------------------------- the host tier (host_tier.c) */

/* A parameter record's bytes in the EPS: `fixed` in host memory whatever the budget
   (the master, with ranks the reduced shard, a 16-bit staging copy unless staging is
   f32), `grad` its gradient accumulator, `state` its optimizer state in host memory
   (arrays of the shard, as the pool counts them), `moved` the bytes of that state a spill
   file reads or writes. */
struct host_record {
  uint64_t fixed, grad, state, moved;
};
void host_record_bytes(struct host_record *out, int64_t numel, int64_t shard_n,
                       int arrays, l2l_state_precision state, l2l_dtype master,
                       l2l_dtype staging, bool dist);
/* A record placed on the device (placement device): its bytes in the device pool, as the
   pool counts them (the master in its dtype, the f32 gradient accumulator and `arrays`
   state arrays in `state`'s precision, a 16-bit copy the device reads unless staging is
   f32); and the words of n such records (a flag, i32, and a norm, two f64, each: two
   arrays; and one f32 beside them, a visit's per-layer clipping factor). */
uint64_t device_record_bytes(int64_t numel, l2l_dtype master, int arrays,
                             l2l_state_precision state, l2l_dtype staging);
uint64_t device_words_bytes(int n);
/* ... and, with ranks, its host bytes: the pinned array its gradient goes out from and
   comes back to, whole (f32), and the reduced gradient of this rank's part_n elements. */
uint64_t device_record_host_bytes(int64_t numel, int64_t part_n);
/* Bytes of one optimizer state array of n elements in precision `state` (l2l.h, "optimizers":
   8bit is n codes padded to 4 bytes, then an f32 scale a block); 0 for an unknown one. */
uint64_t host_state_bytes(l2l_state_precision state, int64_t n);
/* The layout of an 8-bit state array of n elements (l2l/relay.h, "optimizers"), written
   once: its n codes, zero padding to 4 bytes, then the f32 scale of each block of
   L2L_STATE_BLOCK elements. */
static inline uint64_t state8_codes_bytes(int64_t n) {
  return ((uint64_t)(n > 0 ? n : 0) + 3) & ~(uint64_t)3;   /* where the scales begin */
}
static inline int64_t state8_blocks(int64_t n) {
  return n > 0 ? (n + L2L_STATE_BLOCK - 1) / L2L_STATE_BLOCK : 0;
}
/* An element's bytes in the state's precision (8 bits: a code's, the scales aside), and
   the dtype of an array kept in it (8 bits: a vector of bytes, codes and scales). */
static inline int state_elem_bytes(l2l_state_precision state) {
  return state == L2L_STATE_F32 ? 4 : state == L2L_STATE_BF16 ? 2 : 1;
}
static inline l2l_dtype state_dtype(l2l_state_precision state) {
  return state == L2L_STATE_F32 ? L2L_F32 : state == L2L_STATE_BF16 ? L2L_BF16 : L2L_U8;
}
/* Rank `rank`'s shard of a record of n elements over `ranks`: the elements [*begin,
   *begin + *count) with s = ceil(n / ranks) rounded up to a multiple of `align` (8-bit
   state: a shard holds whole blocks), rank·s clipped to n (the last shards may be shorter
   or empty). */
void host_shard(int64_t n, int ranks, int rank, int64_t align, int64_t *begin, int64_t *count);
/* The shards' alignment for optimizer state kept in `state`. */
static inline int64_t host_shard_align(l2l_state_precision state) {
  return state == L2L_STATE_8BIT ? L2L_STATE_BLOCK : 1;
}
/* Whether a record's gradient accumulator may pass this step: when the tier makes them
   pass (a spill file, and a budget that cannot hold them all), an accumulator's pages are
   given back whenever it is cleared (it is zero between updates), and one that passes
   comes back at its one arrival and goes at its update, within the tier's gradient
   window (with ranks: from its arrival to its reduce-scatter); any other (tied, deferred,
   accumulating over steps) is in memory through the step. `users`: relay layers holding
   it; `arrivals`: gradients it expects. */
bool host_grad_passes(bool spill, bool defer, bool due, int users, int arrivals);
/* The host budget over records whose fixed bytes (with every accumulator in memory this
   step that cannot pass), state, largest state, and largest and total accumulators that
   may pass are given (budget 0: none; spill: a spill file holds what the budget leaves
   out): the smallest budget that works (need), whether the accumulators pass (only when
   the budget cannot hold them all), the state that stays in memory (keep: the records
   first in the EPS's order that fit, host_tier_keeps), the window (at most that many
   bytes of state read ahead, and as many of updates under way, or one record) and the
   gradient window (passing accumulators in memory at once, or one). */
enum { L2L_TIER_WINDOW_MOST = 64 << 20, L2L_TIER_GRAD_MOST = 1 << 30 };
struct host_tier {
  uint64_t need, keep, window, grad_window;
  bool grads_pass;
};
void host_tier_plan(struct host_tier *out, uint64_t fixed, uint64_t state, uint64_t largest,
                    uint64_t passing, uint64_t passing_total, uint64_t budget, bool spill);
/* The next record in order, of `bytes` of state, keeps it in memory (kept counts so far). */
bool host_tier_keeps(const struct host_tier *tier, uint64_t *kept, uint64_t bytes);
/* Allocates L2L_ALIGN-aligned memory counted against the pool's budget. */
l2l_status pool_alloc(void **out, l2l_pool_kind pool, uint64_t bytes);
/* Returns memory from pool_alloc; `bytes` must be the size that was asked for. */
void pool_free(l2l_pool_kind pool, void *ptr, uint64_t bytes);
bool pool_valid(int pool);
/* Zeroes `bytes` at ptr (memory of `pool`, host or pinned: memory the host writes): the
   whole pages among them are given back to
   the system instead where the pool allows (host memory: they read as zero, and take
   memory again only when written); returns the bytes given back. The EPS's gradient
   accumulators between updates under a host budget. */
uint64_t pool_zero_pages(l2l_pool_kind pool, void *ptr, uint64_t bytes);
/* For each block of `block` bytes from ptr within [ptr, ptr + bytes) of `pool`'s memory
   (the last may be shorter), whether no page holding a byte of it has anything behind it,
   in memory or swapped out (/proc/self/pagemap): such a block reads as zero, never
   written since allocated or given back by pool_zero_pages. absent[i] (1 or 0) for block
   i; false (absent then undefined) for any pool but the host's (whose memory alone is
   private and anonymous), where the system cannot say, in a process forked after the
   first call, or for more than n blocks. Reading such a page brings it in, and where a
   machine has no shared zero page (some VMs) gives it memory of its own: the EPS's check
   of an accumulator it has not seen zeroed asks first. */
bool pool_blocks_absent(l2l_pool_kind pool, const void *ptr, uint64_t bytes, uint64_t block,
                        uint8_t *absent, size_t n);
/* A meter of the device pool's bytes made and freed by whoever binds it: a relay binds
   its own on the threads that run its step, so its step's device peak is its own (the
   pool's peak is the process's, and relays stepping at once on other threads would show
   in it). Allocations and frees on a thread add to the meter bound there, if any. */
struct pool_meter {
  _Atomic int64_t current, peak;
};
/* Binds `meter` (NULL: none) to the calling thread; returns the one bound before. */
struct pool_meter *pool_meter_bind(struct pool_meter *meter);
void pool_meter_reset(struct pool_meter *meter);   /* peak := current */
/* Gives back the pages pool `kind`'s arena keeps for reuse, once they come to
   POOL_TRIM_BYTES or more (host, or the device pool where it is host memory; else
   nothing): for frees that no step will make again, such as a relay's f32 masters once
   their records are kept bf16 or pinned, which the arena would otherwise keep for good
   (pool.c's trim_if_fragmented gives back only a cache past the most bytes ever in use). */
enum { POOL_TRIM_BYTES = 64 << 20 };
void pool_trim(l2l_pool_kind kind);
/* Gives the pages that freed tensors left cached in the pools' jemalloc arenas and the
   pinned pool's blocks back to the system (the device's own cache is its table's). */
void pool_release_cached(void);
/* Measuring (the profile's probe of the rates, the planner's calibration): what the
   calling thread allocates between pool_measuring_begin and _end (they nest) is left out
   of the pools' peaks, theirs and their arenas', while other threads' allocations count as
   ever; at the end a host-memory arena's cache of POOL_TRIM_BYTES or more is given back.
   What the thread still holds at the end is the program's from then on. */
void pool_measuring_begin(void);
void pool_measuring_end(void);

/* ---------------------------------------------------------------- the device (device.c) */

/* What the core needs of an accelerator, installed by the backend that runs it: device
   memory for the device pool (behind the backend's own cache), page-locked host memory
   for the pinned pool, and the ordering and timing of its queued work. No table
   installed (NULL) means the device pool is host memory run by the CPU backend: ops are
   done when they return, copies are memcpy, and the pools use their own arenas. */
struct device_ops {
  const char *name;
  /* Device memory of `bytes` (a multiple of L2L_ALIGN, as counted by the pool); a refusal
     says why in its message. */
  l2l_status (*alloc)(void **out, uint64_t bytes);
  void (*free)(void *ptr, uint64_t bytes);
  /* Bytes held from the system (in use and cached) and the number of system allocations. */
  void (*counts)(uint64_t *reserved, uint64_t *system_allocs);
  /* Device bytes the backend holds for itself (scratch, a library's workspace): part of
     reserved, and counted against the device pool's budget. */
  uint64_t (*own_bytes)(void);
  /* Page-locked host memory for the pinned pool: 0, or the device's own error code. */
  int (*host_alloc)(void **out, uint64_t bytes);
  void (*host_free)(void *ptr);
  l2l_status (*release_cache)(void);
  l2l_status (*synchronize)(void);
  /* Copy lanes (device_mark): an event after the compute stream's work so far, or NULL
     once the stream has been waited for; waiting for one makes the calling thread a lane,
     and frees it. */
  void *(*mark)(void);
  l2l_status (*wait_mark)(void *mark);
  /* Stamps (device_stamp): a timing event recorded on the calling thread's stream, or
     NULL; whether it has happened after waiting for it; seconds between two that have
     happened (false otherwise); back to the table's pool. */
  void *(*stamp)(void);
  bool (*stamp_wait)(void *stamp);
  bool (*stamp_seconds)(double *out, void *from, void *to);
  void (*stamp_release)(void *stamp);
  /* The device's memory as its system sees it: bytes free now, and in all. */
  l2l_status (*memory)(uint64_t *free_bytes, uint64_t *total_bytes);
};

/* The installed table, or NULL while the device pool is host memory. The first call asks
   the chooser the backend registered (device_set_chooser), once: until then nothing
   of the device has been used, so the choice cannot change a pointer's meaning. */
const struct device_ops *core_device(void);
/* The backend registers how the first choice is made (at load: it only keeps the
   function; the choice itself waits for the first use of the device). */
void device_set_chooser(const struct device_ops *(*choose)(void));
/* The installed table's own_bytes (0 with none, or before the device has started). */
uint64_t device_own_bytes(void);
/* The device's free and total bytes: the installed table's; with none (the device pool is
   host memory), what L2L_DEVICE_MEMORY=FREE,TOTAL says, for tests of a bounded device on
   the CPU backend. false: neither (host memory bounds nothing of its own), or the table's
   call failed. */
bool device_memory(uint64_t *free_bytes, uint64_t *total_bytes);
/* Installs `to` (NULL: host memory) when the device pool holds no tensor; otherwise
   L2L_ERR_STATE naming the bytes in use and both backends (`to_name` for the message). */
l2l_status device_switch(const struct device_ops *to, const char *to_name);

/* Host waits for the device's compute stream: every l2l_device_synchronize and stamp
   anchor, and each op a backend's caller knows hands a result to the host
   (device_note_sync). Counted whatever the backend, so a run on the CPU backend
   counts the waits a GPU would make (the profile reports them a step). */
void device_note_sync(void);
int64_t device_sync_count(void);

/* A mark stands after everything queued on the device's compute stream so far: an event
   of the table, or NULL where the device's ops are done when they return (no table). A
   thread that waits for a mark becomes a copy lane: on a GPU its copies then run on a
   stream of its own, overlapping the kernels, and are done when the copy returns. The
   relay marks every job it queues for its copy threads, and the worker waits for the
   mark before it runs the job (queue.c). */
struct device_mark;
struct device_mark *device_mark(void);
/* Waits for the mark and frees it (NULL: nothing to wait for). */
l2l_status device_wait_mark(struct device_mark *mark);

/* A stamp is a moment on the device's clock, taken in the calling thread's order: on a
   GPU a timing event recorded on its stream (the compute stream, or a copy lane's), so it
   happens when the GPU reaches it; with no table, where ops are done when they return,
   the host clock now. The relay times compute and exposed copies with them: on a GPU the
   host only queues kernels, and its clock says when, not when they ran. */
struct core_stamp {
  double host;  /* core_now() when taken */
  void *event;  /* the table's event; NULL with no table, or when none could be made (the
                   stamp then never happens) */
};
void device_stamp(struct core_stamp *out);
/* A stamp to relate the device's clock to the host's: taken when the device has done
   everything queued before it, so its host time is its device time (where no event could
   be made or waited for, after a synchronize: the wait holds either way). */
void device_stamp_anchor(struct core_stamp *out);
/* Seconds from `from` to `to` on the device's clock (negative when `to` came first), or
   false when either has not happened (yet). */
bool device_stamp_seconds(double *out, const struct core_stamp *from,
                          const struct core_stamp *to);
void device_stamp_release(struct core_stamp *stamp);
/* Waits until what the calling copy lane queued on its stream is done (a stamp recorded
   now and waited for; with none to be had, the device synchronized): after a queued copy
   failed, so that the host memory the earlier ones read may be freed. */
void device_wait_queued(void);

/* ---------------------------------------------------------------- tensors (tensor.c) */

#define L2L_TENSOR_MAGIC 0x6c326c74u  /* "l2lt": catches freed or foreign handles */

struct core_storage {
  atomic_int refs;       /* tensor handles (views included) using this storage */
  l2l_pool_kind pool;
  uint64_t bytes;        /* as asked of the pool */
  void *data;
  atomic_bool handed_out;   /* tensor_hand_out: a caller may write it at any time */
};

struct l2l_tensor {
  uint32_t magic;
  l2l_dtype dtype;
  int ndim;
  int64_t shape[L2L_MAX_DIMS];
  int64_t numel;
  int64_t offset;        /* in elements, from the start of the storage */
  struct core_storage *storage;
};

static inline bool tensor_ok(const l2l_tensor *t) {
  return t != NULL && t->magic == L2L_TENSOR_MAGIC;
}

/* The first element of a tensor already checked with tensor_ok. */
static inline void *tensor_ptr(const l2l_tensor *t) {
  return (char *)t->storage->data + (size_t)t->offset * l2l_dtype_size(t->dtype);
}

/* Rows and columns of a tensor seen as a matrix (see l2l.h). */
static inline int64_t tensor_cols(const l2l_tensor *t) { return t->shape[t->ndim - 1]; }
static inline int64_t tensor_rows(const l2l_tensor *t) {
  return t->numel / tensor_cols(t);
}

/* Whether two tensors share any byte of storage. */
static inline bool tensors_overlap(const l2l_tensor *a, const l2l_tensor *b) {
  if (a == NULL || b == NULL || a->storage != b->storage) return false;
  int64_t sa = (int64_t)l2l_dtype_size(a->dtype), sb = (int64_t)l2l_dtype_size(b->dtype);
  int64_t a0 = a->offset * sa, a1 = a0 + a->numel * sa;
  int64_t b0 = b->offset * sb, b1 = b0 + b->numel * sb;
  return a0 < b1 && b0 < a1;
}

/* A new tensor of `like`'s shape with its own dtype and pool (contents undefined). */
l2l_status tensor_new_like(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype,
                           const l2l_tensor *like);
/* A view of `dtype` in `like`'s shape on t's storage starting byte_offset bytes after t's
   first element (aligned to the dtype's size, within the storage): the relay's slots hold
   records of several dtypes. */
l2l_status tensor_view_bytes(l2l_tensor **out, const l2l_tensor *t, uint64_t byte_offset,
                             l2l_dtype dtype, const l2l_tensor *like);
/* Marks t's storage as handed out: the public API gave it to a caller who may write it
   at any time, unseen (l2l_param_grad's accumulator). For good: what the library last
   wrote there is no longer all it can know of its contents (the EPS then reads an
   accumulator it cleared itself, rather than take it as zero). */
void tensor_hand_out(const l2l_tensor *t);
bool tensor_handed_out(const l2l_tensor *t);
/* t is a live tensor; else L2L_ERR_INVALID naming `name`, with func's name in front. */
l2l_status tensor_check(const char *func, const char *name, const l2l_tensor *t);
/* "(2,3,5)" into buf, for messages. */
const char *core_shape_str(char *buf, size_t len, const l2l_tensor *t);
/* The element at row-major offset `flat` of t as C indexes it, "[1][2]" for 5 of a (2,3)
   tensor, into buf, for messages (the Lua front end shows them counted from 1). */
const char *core_index_str(char *buf, size_t len, const l2l_tensor *t, int64_t flat);
/* The index of element `flat` of t in each of its dims (returned: their number). */
int core_index_of(int64_t index[L2L_MAX_DIMS], const l2l_tensor *t, int64_t flat);
/* The same two for an array of `ndim` dims (0: one element) `shape` that is no tensor (a
   file's, say). */
const char *core_shape_index_str(char *buf, size_t len, int ndim, const int64_t *shape, int64_t flat);
int core_shape_index(int64_t index[L2L_MAX_DIMS], int ndim, const int64_t *shape, int64_t flat);
/* t is a live tensor of `dtype` with exactly the dims given (ndim of them); else
   L2L_ERR_INVALID naming `name`, with func's name in front. */
/* a and b (live tensors) have the same dims; else L2L_ERR_INVALID naming both (an, bn),
   with func's name in front. */
l2l_status core_same_shape(const char *func, const char *an, const l2l_tensor *a,
                           const char *bn, const l2l_tensor *b);
l2l_status core_need_shape(const char *func, const char *name, const l2l_tensor *t,
                           l2l_dtype dtype, int ndim, const int64_t *dims);

/* ---------------------------------------------------------------- the block cache (block_cache.c) */

/* A cache of memory blocks by exact size over a system allocator. Memory whose system
   allocator is slow (cudaMalloc, cudaHostAlloc) is kept for reuse instead of given back:
   a training step asks for the same few sizes every step, so after the first one nothing
   reaches the system. One cache serves a GPU backend's device memory, another the pinned
   pool (pool.c). A cap bounds what a cache holds from the system (blocks in use plus
   cached ones): past it, cached blocks of other sizes are given back first, then the
   request is refused with L2L_BLOCKS_OVER_CAP and the caller decides what to do (the
   pinned pool falls back to pageable memory). It never calls the system allocator for a
   size it holds a cached block of, nor holds more than its cap. */
/* The system side. alloc returns 0 and a block of at least `size` bytes, or a code of
   its own (e.g. a cudaError_t) that the caller explains; free gives a block back with
   the tag it was cached with (below); both are called with the cache's lock held.
   A tag is the caller's note on a freed block, kept with it until the block is handed
   out again or given back: a GPU backend's event after the last kernels that used it, so
   that a copy stream taking the block waits for those and nothing later. */
struct block_source {
  int (*alloc)(void **out, uint64_t size);
  void (*free)(void *ptr, void *tag);
};

struct block_list;

struct block_cache {
  pthread_mutex_t lock;
  const struct block_source *source;
  uint64_t cap;                /* reserved stays at or below it; 0: no cap */
  struct block_list *lists;
  int list_count, list_capacity;
  uint64_t reserved;           /* from the system: in use plus cached */
  uint64_t cached;
  uint64_t system_allocs;      /* calls to source->alloc that succeeded */
};

#define L2L_BLOCK_CACHE(src) \
  { .lock = PTHREAD_MUTEX_INITIALIZER, .source = (src) }

enum { L2L_BLOCKS_OVER_CAP = -1 };

/* The size a request of `bytes` is served with: rounded up (512 B below 1 MiB, 2 MiB
   above) so that near sizes share blocks. */
uint64_t block_size(uint64_t bytes);
/* A block of block_size(bytes): a cached one, else one from the system; when the
   system refuses or the cap would be passed, the cache is given back and the system
   asked once more. Returns 0, the source's code, or L2L_BLOCKS_OVER_CAP; *tag gets the
   tag a cached block was put back with (NULL for a block new from the system), which the
   caller now owns. */
int blocks_get(struct block_cache *c, void **out, uint64_t bytes, void **tag);
/* Takes back a block from blocks_get (the same `bytes`) for reuse, with its tag. */
void blocks_put(struct block_cache *c, void *ptr, uint64_t bytes, void *tag);
/* Gives every cached block back to the system. */
void blocks_release_cached(struct block_cache *c);
/* A new cap (0: none); cached blocks go back until reserved fits under it if they can. */
void blocks_set_cap(struct block_cache *c, uint64_t cap);
uint64_t blocks_cap(struct block_cache *c);
void blocks_counts(struct block_cache *c, uint64_t *reserved, uint64_t *cached,
                   uint64_t *system_allocs);

/* ---------------------------------------------------------------- queues and threads (queue.c) */

/* The relay's and the EPS's asynchronous units of work. A queue is a FIFO served by its
   own threads: one thread per copy direction (host to device, device to host) so copies
   in one direction stay in order like a CUDA stream, several for the optimizer. A job is
   embedded in the struct of its kind; the thread that queued it waits for it with
   job_wait. A copy job carries a device mark that its worker waits for first: on a
   GPU, the kernels it depends on run after the queuing thread has moved on. Errors on a
   worker are recorded in the job and surface on the waiting thread. A job never runs on
   the thread that queued it, and never touches Lua. */
struct core_queue;

struct core_job {
  void (*run)(struct core_job *job, int thread);   /* thread: the worker's id */
  struct core_job *next;
  struct core_queue *queue;
  bool done;                  /* under the queue's lock */
  bool free_when_done;        /* nobody waits: the worker frees it (with `release`) */
  void (*release)(struct core_job *job);
  struct device_mark *after;  /* the worker waits for it before run() (NULL: no wait) */
  l2l_status status;          /* set by run(); message below when not OK */
  char message[256];
};

struct core_queue {
  pthread_mutex_t lock;
  pthread_cond_t work, finished;
  struct core_job *head, *tail;
  int threads, first_id;      /* worker ids first_id .. first_id + threads - 1 */
  int busy;                   /* jobs taken and not done */
  bool stop;
  pthread_t *tids;
};

/* Starts `threads` workers whose ids begin at first_id. */
l2l_status queue_start(struct core_queue *q, int threads, int first_id, const char *what);
/* Starts one of l2l's own threads (copies, the optimizer's workers, communication, I/O)
   as pthread_create does: when OpenMP binds its threads (OMP_PROC_BIND set) on every CPU
   of OpenMP's places, since OpenMP binds the initial thread to its first place (a core)
   as the process starts and a thread started later would inherit that one core; else (or
   when the system refuses those CPUs) where its creator may run. */
int core_thread_create(pthread_t *tid, void *(*fn)(void *), void *arg);
/* The CPUs l2l's threads may run on: OpenMP's places when OpenMP binds its threads, else
   the calling thread's affinity (a container's cpuset, taskset), at least 1. */
int core_cpus(void);
/* Finishes every queued job, then stops the workers. */
void queue_stop(struct core_queue *q);
void queue_push(struct core_queue *q, struct core_job *job);
/* Blocks until job is done; returns its status (this thread's last error gets its message). */
l2l_status job_wait(struct core_job *job);
/* Blocks until the queue is empty and idle. */
void queue_drain(struct core_queue *q);
/* Records a failed status and this thread's message in the job (for run()). */
void job_fail(struct core_job *job, l2l_status status);

/* Seconds on a monotonic clock. */
double core_now(void);

/* ---------------------------------------------------------------- the timeline (timeline.c) */

/* A relay's record of every unit of work, appended from any thread (best effort: an event
   that finds no memory is dropped), with the busy seconds the stats report: summed by
   phase and by thread number, whatever the writers mean by them (the owner reads the
   sums it needs). A phase or thread number beyond the arrays is in no sum. */
enum { L2L_TIMELINE_PHASES = 32, L2L_TIMELINE_THREADS = 8 };
struct core_timeline {
  pthread_mutex_t lock;
  l2l_relay_event *events;
  int64_t count, cap;
  double origin;             /* core_now() when the timeline began */
  double phase_seconds[L2L_TIMELINE_PHASES];     /* since the last reset */
  double thread_seconds[L2L_TIMELINE_THREADS];   /* since the last reset */
};
void timeline_init(struct core_timeline *t);
void timeline_free(struct core_timeline *t);
/* Forgets the events and sums of the last step. */
void timeline_reset(struct core_timeline *t);
void timeline_add(struct core_timeline *t, int layer, int micro_batch, int phase, int thread,
                  double start, double end);

/* ---------------------------------------------------------------- safetensors files
   (safetensors.c reads, safetensors_write.c writes: the format and its promises are stated
   there.) Messages name the file; a damaged or foreign file is L2L_ERR_INVALID, one that
   cannot be opened, read or written L2L_ERR_IO. */
enum { SAFETENSORS_MAX_HEADER = L2L_SAFETENSORS_MAX_HEADER };   /* the largest header l2l reads or writes (l2l/safetensors.h) */
#define SAFETENSORS_CHECKSUMS "l2l_xxh3"      /* the metadata key of the checksums */

/* The format's dtypes (Hugging Face's list, as of safetensors 0.7), each with how l2l reads
   it: floats into f32, f16 or bf16 (one rounding at most), integers into i32 or u8 (where
   every value fits), the packed 4- and 6-bit floats and the complex C64 not at all (a file
   holding them opens and lists them). */
enum safetensors_format {
  SAFETENSORS_BOOL, SAFETENSORS_U8, SAFETENSORS_I8, SAFETENSORS_I16, SAFETENSORS_U16,
  SAFETENSORS_I32, SAFETENSORS_U32, SAFETENSORS_I64, SAFETENSORS_U64, SAFETENSORS_F8_E4M3,
  SAFETENSORS_F8_E5M2, SAFETENSORS_F8_E8M0, SAFETENSORS_F16, SAFETENSORS_BF16,
  SAFETENSORS_F32, SAFETENSORS_F64, SAFETENSORS_F4, SAFETENSORS_F6_E2M3, SAFETENSORS_F6_E3M2,
  SAFETENSORS_C64, SAFETENSORS_FORMATS
};
enum safetensors_kind { SAFETENSORS_FLOAT, SAFETENSORS_INTEGER, SAFETENSORS_NOT_READ };
#define SAFETENSORS_NO_DTYPE ((l2l_dtype)-1)   /* (a stored dtype l2l has no dtype of its own for) */
struct safetensors_dtype {
  enum safetensors_format format;
  const char *name;                /* the format's: "F32", "I64", "BOOL", "F8_E4M3", ... */
  int bits;                        /* an element's */
  enum safetensors_kind kind;
  l2l_dtype own;                   /* the l2l dtype it is, or SAFETENSORS_NO_DTYPE */
  l2l_dtype reads_as;              /* a read's dtype unless told another: its own where l2l
                                      has it, f32 for the other floats, u8 for BOOL, i32 for
                                      the other integers; SAFETENSORS_NO_DTYPE where
                                      l2l does not read it */
};

struct safetensors_entry {
  char *name;
  l2l_dtype dtype;                 /* stored->own: the relay's checkpoints hold no other */
  const struct safetensors_dtype *stored;
  int ndim;                        /* 0 (one element) to L2L_MAX_DIMS */
  int64_t shape[L2L_MAX_DIMS];     /* a size may be 0 (an empty tensor: listed, not read) */
  int64_t numel;
  uint64_t offset, bytes;          /* its range within the data */
  bool summed;                     /* the file holds its checksum: sum */
  uint64_t sum;
};
struct safetensors_file {
  char *path;
  int fd;
  uint64_t data_start;             /* the data's first byte in the file */
  struct safetensors_entry *entries;   /* in the data's order */
  int *order;                      /* entries by name, for safetensors_find */
  int count;
  char **meta;                     /* nmeta pairs: key, value */
  int nmeta;
};
/* Opens and checks a file: its header, every entry's range, the checksums' names. */
l2l_status safetensors_open(struct safetensors_file **out, const char *path);
void safetensors_close(struct safetensors_file *file);   /* NULL is fine */
const struct safetensors_entry *safetensors_find(const struct safetensors_file *file, const char *name);
const char *safetensors_metadata(const struct safetensors_file *file, const char *key);   /* NULL: none */
/* An entry's bytes into dst (entry->bytes of room), checked against its checksum. */
l2l_status safetensors_read(const struct safetensors_file *file, const struct safetensors_entry *entry,
                            void *dst);
/* A new host tensor of the entry's dtype and shape holding its bytes, checked (an entry
   of l2l's own dtype, not empty). */
l2l_status safetensors_read_tensor(l2l_tensor **out, const struct safetensors_file *file,
                                   const struct safetensors_entry *entry);
/* The entry's bytes hashed in pieces (none held whole) against its checksum. */
l2l_status safetensors_check(const struct safetensors_file *file, const struct safetensors_entry *entry);
/* "F32", "BF16", ... (NULL for a dtype the format's l2l files do not hold). */
const char *safetensors_dtype_name(l2l_dtype dtype);
/* Whether the entry's values read into `to` (safetensors_convert.c). */
bool safetensors_reads_into(const struct safetensors_entry *entry, l2l_dtype to);
/* What the entry reads into, for a message: "f32, f16 or bf16", "i32 or u8"; NULL for a
   dtype l2l does not read (F4, F6_*, C64). */
const char *safetensors_read_targets(const struct safetensors_entry *entry);
/* dst (entry->numel elements of `to`) := stored (its bytes as the file holds them, checked),
   converted: floats with one rounding to nearest even, integers exactly. An integer `to`
   cannot hold (or a BOOL neither 0 nor 1) is L2L_ERR_INVALID naming the element, dst
   untouched. `to` must be one safetensors_reads_into allows. */
l2l_status safetensors_convert(void *dst, l2l_dtype to, const void *stored, const struct safetensors_file *file,
                               const struct safetensors_entry *entry);
/* What a stat's mode says a path is, for a message: "a directory", "a character device",
   "a FIFO (a named pipe)", ... (lua/l2l/filesys.lua's words; "a regular file" for one). */
const char *safetensors_file_kind(unsigned mode);

/* A file written in the order of `entries` (each tensor's name, dtype, shape), with the
   metadata pairs meta[2i] (key), meta[2i + 1] (value); replace: a file at path may be
   replaced, else it is refused (L2L_ERR_STATE) and left as it is. Anything at path but a
   regular file (a directory, a device, a FIFO) is refused; a link to a regular file is
   written through (the file it names is replaced, the link stays). safetensors_put gives
   the next tensor's bytes; safetensors_commit puts the file in place (and frees the writer,
   whatever happens); safetensors_abandon removes what was written. */
struct safetensors_spec {
  const char *name;
  l2l_dtype dtype;
  int ndim;
  int64_t shape[L2L_MAX_DIMS];
};
struct safetensors_writer;
l2l_status safetensors_create(struct safetensors_writer **out, const char *path, bool replace,
                              const struct safetensors_spec *entries, int count,
                              const char *const *meta, int nmeta);
const char *safetensors_next(const struct safetensors_writer *writer);   /* NULL: all written */
l2l_status safetensors_put(struct safetensors_writer *writer, const void *data, uint64_t bytes);
l2l_status safetensors_commit(struct safetensors_writer *writer);
void safetensors_abandon(struct safetensors_writer *writer);   /* NULL is fine */

#endif /* L2L_CORE_H */
