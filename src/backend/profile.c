/* SPDX-License-Identifier: MIT */
/* profile.c — where a relay step's time goes, op by op (l2l.h, "the profile").
 *
 * Purpose: collect the calls profile_ops.c times during a step, resolve their stamps on
 * the device's clock when the step ends, and sum them by op and shape into rows; split
 * the step's time outside its ops by cause; probe the rates the rows are held to; and
 * give it all back as rows, a summary, a TSV file and a one-screen table.
 * How the idle time is split: the compute stream's ops, in order, leave gaps between one
 * op's end and the next one's start on the device's clock. The host waits the relay
 * reports (profile_wait) that ended between the two ops' queueing fill the gap first,
 * by cause, as far as they last; what is left was a sync's when the host waited for the
 * device in between (the stream had drained, and idled while the host queued again), else
 * a launch gap (the host queued more slowly than the device ran). On the CPU backend ops
 * run when called, so the gaps are the host's own time between them, waits included.
 * Must never: change what a step does (a profile that finds no memory drops calls and
 * counts them); allocate from a pool inside a cur.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend.h"

/* ---------------------------------------------------------------- state */

struct event {
  char op[32], shape[96];
  bool lane;                         /* on a copy lane, not the step's thread */
  enum profile_bound bound;
  double flops, bytes;
  int64_t syncs_open, syncs_close;   /* the sync count at the call's open and close */
  struct core_stamp start, end;
};

struct wait {
  enum profile_wait cause;
  double start, end;
};

struct row {
  l2l_profile_row r;
  enum profile_bound bound;
  uint64_t hash;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool running = false;   /* a profile runs */
static atomic_bool in_step = false;   /* a step is being recorded */
static _Thread_local bool step_thread = false;

static struct {
  int skip;                        /* steps still to leave out */
  struct event *events;            /* (nevents) this step's calls, in the order they closed */
  int64_t nevents, events_cap;
  struct wait *waits;              /* (nwaits) this step's host waits, in order */
  int64_t nwaits, waits_cap;
  struct core_stamp begin;
  int64_t syncs_begin, launches_begin;
} cur;   /* the step being recorded */

static struct {
  struct row *rows;
  int64_t nrows, rows_cap;
  l2l_profile_summary sum;
} result;

/* ---------------------------------------------------------------- recording */

const struct backend_ops *profile_wrap(const struct backend_ops *base) {
  return atomic_load_explicit(&running, memory_order_relaxed) ? &profile_ops : base;
}

bool profile_on_step_thread(void) { return step_thread; }

void profile_open(struct profile_probe *p) {
  p->on = atomic_load_explicit(&in_step, memory_order_acquire);
  if (!p->on) return;
  p->step_thread = step_thread;
  p->syncs = device_sync_count();
  device_stamp(&p->start);
}

/* Grows *array (of *cap elements of `size`) to hold one more than `count`; false when no
   memory. */
static bool room(void **array, int64_t *cap, int64_t count, size_t size) {
  if (count < *cap) return true;
  int64_t grown = *cap ? 2 * *cap : 1024;
  void *more = realloc(*array, (size_t)grown * size);
  if (more == NULL) return false;
  *array = more, *cap = grown;
  return true;
}

void profile_close(struct profile_probe *p, const char *op, double flops, double bytes,
                   enum profile_bound bound, bool sync, const char *fmt, ...) {
  if (sync) device_note_sync();
  struct event e = {.lane = !p->step_thread, .bound = bound, .flops = flops,
                    .bytes = bytes, .syncs_open = p->syncs, .start = p->start};
  device_stamp(&e.end);
  e.syncs_close = device_sync_count();
  snprintf(e.op, sizeof e.op, "%s", op);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e.shape, sizeof e.shape, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&lock);
  bool kept = atomic_load(&in_step) &&
              room((void **)&cur.events, &cur.events_cap, cur.nevents, sizeof e);
  if (kept) cur.events[cur.nevents++] = e;
  else result.sum.dropped++;
  pthread_mutex_unlock(&lock);
  if (!kept) {
    device_stamp_release(&e.start);
    device_stamp_release(&e.end);
  }
}

void profile_wait(enum profile_wait cause, double start, double end) {
  if (!step_thread || !atomic_load(&in_step)) return;
  pthread_mutex_lock(&lock);
  if (room((void **)&cur.waits, &cur.waits_cap, cur.nwaits, sizeof *cur.waits))
    cur.waits[cur.nwaits++] = (struct wait){cause, start, end};
  pthread_mutex_unlock(&lock);
}

static int64_t launches_now(void) {
  const struct backend_ops *ops = backend_device_base();
  return ops->launches ? ops->launches() : -1;
}

/* ---------------------------------------------------------------- the environment's profile */

static char env_path[4096];

/* At exit: the TSV to the file named, the table to stderr (as wide as COLUMNS says, when
   it says 80 to 1000; else 100). */
static void env_report(void) {
  static char table[64 * 1024];
  const char *columns = getenv("COLUMNS");
  int width = columns != NULL ? atoi(columns) : 0;
  if (width < 80 || width > 1000) width = 100;
  if (l2l_profile_write(env_path, 1) != L2L_OK)
    fprintf(stderr, "l2l: L2L_PROFILE: %s\n", l2l_last_error());
  else if (l2l_profile_table(table, sizeof table, width) == L2L_OK)
    fprintf(stderr, "%s(the profile's rows: %s)\n", table, env_path);
}

/* L2L_PROFILE=FILE starts a profile at the first step (once). */
static void env_start(void) {
  const char *path = getenv("L2L_PROFILE");
  if (path == NULL || *path == '\0') return;
  if (strlen(path) >= sizeof env_path) {
    fprintf(stderr, "l2l: L2L_PROFILE: a path of %zu bytes is too long\n", strlen(path));
    return;
  }
  const char *skip_env = getenv("L2L_PROFILE_SKIP");
  char *end = NULL;
  long skip = skip_env != NULL ? strtol(skip_env, &end, 10) : 1;
  if (skip_env != NULL && (*skip_env == '\0' || *end != '\0' || skip < 0 || skip > 1000000)) {
    fprintf(stderr, "l2l: L2L_PROFILE_SKIP='%.40s' is not a count of steps (0 to 1000000)\n",
            skip_env);
    return;
  }
  snprintf(env_path, sizeof env_path, "%s", path);
  if (l2l_profile_start((int)skip) != L2L_OK) {
    fprintf(stderr, "l2l: L2L_PROFILE: %s\n", l2l_last_error());
    return;
  }
  atexit(env_report);
}

/* ---------------------------------------------------------------- steps */

bool profile_step_begin(bool training) {
  static pthread_once_t env_once = PTHREAD_ONCE_INIT;
  pthread_once(&env_once, env_start);
  if (!training || !atomic_load(&running)) return false;
  pthread_mutex_lock(&lock);
  bool skipped = cur.skip > 0;
  if (skipped) cur.skip--;
  /* one step at a time: a step that begins inside another (a layer's callback stepping
     another relay) or beside it is not recorded */
  bool recording = !skipped && !atomic_load(&in_step);
  if (recording) {
    step_thread = true;
    cur.nevents = cur.nwaits = 0;
    cur.syncs_begin = device_sync_count();
    cur.launches_begin = launches_now();
    device_stamp(&cur.begin);
    atomic_store_explicit(&in_step, true, memory_order_release);
  }
  pthread_mutex_unlock(&lock);
  return recording;
}

static const char *bound_name(enum profile_bound b) {
  return b == L2L_BOUND_MEM ? "mem" : b == L2L_BOUND_LINK ? "link" : "flop";
}

static uint64_t row_hash(const struct event *e) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)e->lane;
  for (const char *c = e->op; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
  for (const char *c = e->shape; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
  return h;
}

static struct row *row_of(const struct event *e) {
  uint64_t h = row_hash(e);
  for (int64_t i = 0; i < result.nrows; i++) {
    struct row *r = &result.rows[i];
    if (r->hash == h && strcmp(r->r.op, e->op) == 0 && strcmp(r->r.shape, e->shape) == 0 &&
        (strcmp(r->r.kind, "lane") == 0) == e->lane)
      return r;
  }
  if (!room((void **)&result.rows, &result.rows_cap, result.nrows, sizeof *result.rows))
    return NULL;
  struct row *r = &result.rows[result.nrows++];
  memset(r, 0, sizeof *r);
  snprintf(r->r.kind, sizeof r->r.kind, "%s", e->lane ? "lane" : "op");
  snprintf(r->r.op, sizeof r->r.op, "%s", e->op);
  snprintf(r->r.shape, sizeof r->r.shape, "%s", e->shape);
  snprintf(r->r.bound, sizeof r->r.bound, "%s", bound_name(e->bound));
  r->bound = e->bound;
  r->hash = h;
  return r;
}

/* The gap before an op (or the step's end), given the waits that ended before it was
   queued and whether the host waited for the device since the last op: see the top. */
struct gaps {
  double last_end;          /* the last op's end, seconds after the step's begin */
  int64_t last_syncs;       /* the sync count at its close */
  int64_t next_wait;        /* the first wait not yet given to a gap */
  double waited[L2L_PROFILE_WAITS];
};

static void gap_split(struct gaps *g, double start, double queued, int64_t syncs) {
  for (; g->next_wait < cur.nwaits && cur.waits[g->next_wait].end <= queued; g->next_wait++) {
    const struct wait *w = &cur.waits[g->next_wait];
    g->waited[w->cause] += w->end - w->start;
  }
  double gap = start - g->last_end;
  if (gap <= 0) return;
  l2l_profile_summary *s = &result.sum;
  double *by_cause[L2L_PROFILE_WAITS] = {
      &s->idle_copy_params_seconds, &s->idle_copy_acts_in_seconds,
      &s->idle_copy_acts_out_seconds, &s->idle_copy_grads_seconds, &s->idle_update_seconds,
      &s->idle_comm_seconds};
  for (int c = 0; c < L2L_PROFILE_WAITS && gap > 0; c++) {
    double take = fmin(gap, g->waited[c]);
    *by_cause[c] += take;
    if (profile_wait_is_copy((enum profile_wait)c)) s->idle_copy_seconds += take;
    g->waited[c] -= take;
    gap -= take;
  }
  *(syncs > g->last_syncs ? &s->idle_sync_seconds : &s->idle_launch_seconds) += gap;
}

static int by_seconds(const void *a, const void *b) {
  double x = ((const struct row *)a)->r.seconds, y = ((const struct row *)b)->r.seconds;
  return (x < y) - (x > y);
}

/* Called with the lock held, once every stamp of the step has happened. */
static void step_resolve(const struct core_stamp *end, int64_t syncs_end) {
  l2l_profile_summary *s = &result.sum;
  double step_seconds = 0;
  if (!device_stamp_seconds(&step_seconds, &cur.begin, end)) {
    s->dropped += cur.nevents;
    return;
  }
  struct gaps g = {.last_syncs = cur.syncs_begin};
  for (int64_t i = 0; i < cur.nevents; i++) {
    const struct event *e = &cur.events[i];
    double t0 = 0, t1 = 0;
    struct row *r = NULL;
    if (!device_stamp_seconds(&t0, &cur.begin, &e->start) ||
        !device_stamp_seconds(&t1, &cur.begin, &e->end) || (r = row_of(e)) == NULL) {
      s->dropped++;
      continue;
    }
    double seconds = fmax(0, t1 - t0);
    r->r.calls++, r->r.seconds += seconds, r->r.flops += e->flops, r->r.bytes += e->bytes;
    r->r.host_seconds += fmax(0, e->end.host - e->start.host);
    if (e->lane) {
      s->lane_ops++;
      continue;
    }
    gap_split(&g, t0, e->start.host, e->syncs_open);
    s->ops++, s->op_seconds += seconds;
    g.last_end = fmax(g.last_end, t1);
    g.last_syncs = e->syncs_close;
  }
  gap_split(&g, step_seconds, end->host, syncs_end);
  s->steps++;
  s->step_seconds += step_seconds;
  s->syncs += syncs_end - cur.syncs_begin;
  int64_t launches = launches_now();
  if (launches >= 0 && cur.launches_begin >= 0)
    s->launches = (s->launches < 0 ? 0 : s->launches) + launches - cur.launches_begin;
  qsort(result.rows, (size_t)result.nrows, sizeof *result.rows, by_seconds);
}

void profile_step_end(bool began, bool completed) {
  if (!began) return;
  int64_t syncs_end = device_sync_count();
  atomic_store(&in_step, false);
  step_thread = false;
  /* every stamp of the step has happened after this wait (it is the profile's own: its
     sync is not the step's) */
  struct core_stamp end;
  device_stamp_anchor(&end);
  pthread_mutex_lock(&lock);
  if (completed && atomic_load(&running)) step_resolve(&end, syncs_end);
  for (int64_t i = 0; i < cur.nevents; i++) {
    device_stamp_release(&cur.events[i].start);
    device_stamp_release(&cur.events[i].end);
  }
  cur.nevents = cur.nwaits = 0;
  pthread_mutex_unlock(&lock);
  device_stamp_release(&cur.begin);
  device_stamp_release(&end);
}

/* ---------------------------------------------------------------- the rates (probed at start) */

/* The best of three timed calls of `run` after one untimed, on the device's clock. */
static bool best_seconds(double *best, l2l_status (*run)(void *), void *arg) {
  *best = INFINITY;
  for (int i = 0; i < 4; i++) {
    struct core_stamp a, b, done;
    device_stamp(&a);
    l2l_status status = run(arg);
    device_stamp(&b);
    device_stamp_anchor(&done);
    double s = 0;
    bool ok = status == L2L_OK && device_stamp_seconds(&s, &a, &b);
    device_stamp_release(&a);
    device_stamp_release(&b);
    device_stamp_release(&done);
    if (!ok) return false;
    if (i > 0 && s > 0) *best = fmin(*best, s);
  }
  return isfinite(*best);
}

struct probe_args {
  const struct backend_ops *ops;
  l2l_tensor *a, *b, *c;
  l2l_dtype dtype;
  int64_t n;          /* bytes of a copy; the side of a GEMM */
};

static l2l_status run_copy(void *arg) {
  struct probe_args *p = arg;
  return p->ops->copy(l2l_tensor_data(p->b), l2l_tensor_pool(p->b), l2l_tensor_data(p->a),
                      l2l_tensor_pool(p->a), (uint64_t)p->n);
}

static l2l_status run_gemm(void *arg) {
  struct probe_args *p = arg;
  return p->ops->gemm_batched(l2l_tensor_data(p->c), l2l_tensor_data(p->a), l2l_tensor_data(p->b),
                              p->dtype, 1, p->n, p->n, p->n, 0, 0, 1.0f, 0.0f, 0, 0, 0);
}

static void free_args(struct probe_args *p) {
  l2l_tensor_free(p->a);
  l2l_tensor_free(p->b);
  l2l_tensor_free(p->c);
  p->a = p->b = p->c = NULL;
}

/* Bytes a second of a copy of `bytes` from pool `from` into the device pool (0: not
   measured, e.g. no room under the device budget). */
static double copy_rate(const struct backend_ops *ops, l2l_pool_kind from, int64_t bytes) {
  struct probe_args p = {.ops = ops, .n = bytes};
  double s = 0, rate = 0;
  if (l2l_tensor_new(&p.a, from, L2L_U8, 1, &bytes) == L2L_OK &&
      l2l_tensor_new(&p.b, L2L_POOL_DEVICE, L2L_U8, 1, &bytes) == L2L_OK &&
      l2l_tensor_fill(p.a, 1.0) == L2L_OK && best_seconds(&s, run_copy, &p))
    rate = (double)bytes * (from == L2L_POOL_DEVICE ? 2 : 1) / s;
  free_args(&p);
  return rate;
}

/* FLOP/s of an n x n x n GEMM with `dtype` inputs (0: not measured). */
static double gemm_rate(const struct backend_ops *ops, l2l_dtype dtype, int64_t n) {
  struct probe_args p = {.ops = ops, .dtype = dtype, .n = n};
  int64_t shape[2] = {n, n};
  double s = 0, rate = 0;
  if (l2l_tensor_new(&p.a, L2L_POOL_DEVICE, dtype, 2, shape) == L2L_OK &&
      l2l_tensor_new(&p.b, L2L_POOL_DEVICE, dtype, 2, shape) == L2L_OK &&
      l2l_tensor_new(&p.c, L2L_POOL_DEVICE, L2L_F32, 2, shape) == L2L_OK &&
      l2l_tensor_fill(p.a, 1.0 / (double)n) == L2L_OK &&
      l2l_tensor_fill(p.b, 0.5) == L2L_OK && best_seconds(&s, run_gemm, &p))
    rate = 2.0 * (double)n * (double)n * (double)n / s;
  free_args(&p);
  return rate;
}

/* The rates the rows are held to: a 64 MiB copy within the device and from pinned memory,
   and a square GEMM (4096 on an accelerator, 512 on the CPU, where a larger one takes a
   second) with f32 and with bf16 inputs. Outside any step, its memory on no relay's meter
   and out of the pools' peaks (a program's "device peak" is its own, not the probe's 128
   MiB). */
static void probe_rates(l2l_profile_summary *s) {
  const struct backend_ops *ops = backend_device_base();
  struct pool_meter *meter = pool_meter_bind(NULL);
  pool_measuring_begin();
  const int64_t bytes = 64 << 20, side = backend_device_is_host() ? 512 : 4096;
  s->copy_rate = copy_rate(ops, L2L_POOL_DEVICE, bytes);
  s->link_rate = copy_rate(ops, L2L_POOL_PINNED, bytes);
  s->gemm_rate_f32 = gemm_rate(ops, L2L_F32, side);
  s->gemm_rate_16 = gemm_rate(ops, L2L_BF16, side);
  pool_measuring_end();
  pool_meter_bind(meter);
  l2l_clear_error();
  bool all = s->copy_rate > 0 && s->link_rate > 0 && s->gemm_rate_f32 > 0 && s->gemm_rate_16 > 0;
  snprintf(s->probe, sizeof s->probe, "best of 3: 64 MiB copies, GEMM %lld^3%s", (long long)side,
           all ? "" : "; a rate of 0 was not measured (no room?)");
}

/* ---------------------------------------------------------------- the public calls */

l2l_status l2l_profile_start(int skip_steps) {
  if (skip_steps < 0) return FAIL(L2L_ERR_INVALID, "skip_steps is %d (want >= 0)", skip_steps);
  if (atomic_load(&running))
    return FAIL(L2L_ERR_STATE, "a profile is running: stop it first (l2l_profile_stop)");
  cpu_runtime_init();
  l2l_profile_summary fresh = {.launches = -1};
  snprintf(fresh.backend, sizeof fresh.backend, "%s", l2l_device_backend());
  probe_rates(&fresh);
  pthread_mutex_lock(&lock);
  result.sum = fresh;
  result.nrows = 0;
  cur.skip = skip_steps;
  atomic_store(&running, true);
  pthread_mutex_unlock(&lock);
  return L2L_OK;
}

l2l_status l2l_profile_stop(void) {
  atomic_store(&running, false);
  return L2L_OK;
}

static bool flop_bound(const struct row *r) { return r->bound >= L2L_BOUND_FLOP32; }

/* The rate a row reached: FLOP/s where arithmetic bounds it, else bytes/s (0: no time). */
static double row_rate(const struct row *r) {
  return r->r.seconds > 0 ? (flop_bound(r) ? r->r.flops : r->r.bytes) / r->r.seconds : 0;
}

/* A row's fraction of its probed rate, or -1. */
static double roofline(const struct row *r, const l2l_profile_summary *s) {
  double probed = r->bound == L2L_BOUND_MEM      ? s->copy_rate
                  : r->bound == L2L_BOUND_LINK   ? s->link_rate
                  : r->bound == L2L_BOUND_FLOP32 ? s->gemm_rate_f32
                                                 : s->gemm_rate_16;
  return probed > 0 && r->r.seconds > 0 ? row_rate(r) / probed : -1;
}

l2l_status l2l_profile_get_summary(l2l_profile_summary *out) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  pthread_mutex_lock(&lock);
  *out = result.sum;
  out->rows = result.nrows;
  pthread_mutex_unlock(&lock);
  return L2L_OK;
}

l2l_status l2l_profile_rows(l2l_profile_row *out, int64_t first, int64_t count) {
  if (out == NULL && count > 0) return FAIL(L2L_ERR_INVALID, "out is NULL");
  pthread_mutex_lock(&lock);
  int64_t n = result.nrows;
  if (first < 0 || count < 0 || first > n || count > n - first) {
    pthread_mutex_unlock(&lock);
    return FAIL(L2L_ERR_INVALID, "%lld rows from row %lld asked of %lld", (long long)count,
                (long long)first, (long long)n);
  }
  for (int64_t i = 0; i < count; i++) {
    const struct row *r = &result.rows[first + i];
    out[i] = r->r;
    out[i].roofline = roofline(r, &result.sum);
  }
  pthread_mutex_unlock(&lock);
  return L2L_OK;
}

/* ---------------------------------------------------------------- the TSV and the table */

/* Per step: a row's figure over the profiled steps. */
static double per_step(double x, const l2l_profile_summary *s) {
  return s->steps > 0 ? x / (double)s->steps : 0;
}

/* A rate in words: FLOP/s or bytes/s with an SI prefix. */
static const char *rate_words(char *buf, size_t len, double rate, bool flops) {
  static const char *const prefix[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (rate >= 1000 && p < 5) rate /= 1000, p++;
  snprintf(buf, len, "%.3g %s%s", rate, prefix[p], flops ? "FLOP/s" : "B/s");
  return buf;
}

static void tsv_rows(FILE *f, const l2l_profile_summary *s) {
  double step = per_step(s->step_seconds, s);
  fprintf(f, "kind\top\tshape\tcalls\tms\tshare\tgflop\tmbytes\trate\tbound\troofline\thost_ms\n");
  fprintf(f, "step\tstep\t\t1\t%.6f\t1\t\t\t\t\t\t\n", 1e3 * step);
  for (int64_t i = 0; i < result.nrows; i++) {
    const struct row *r = &result.rows[i];
    double sec = per_step(r->r.seconds, s), rate = row_rate(r), roof = roofline(r, s);
    fprintf(f, "%s\t%s\t%s\t%.6g\t%.6f\t%.6f\t%.6g\t%.6g\t%.6g\t%s\t", r->r.kind, r->r.op,
            r->r.shape, per_step((double)r->r.calls, s), 1e3 * sec, step > 0 ? sec / step : 0,
            per_step(r->r.flops, s) / 1e9, per_step(r->r.bytes, s) / 1e6, rate,
            bound_name(r->bound));
    if (roof >= 0) fprintf(f, "%.4f", roof);
    fprintf(f, "\t%.6f\n", 1e3 * per_step(r->r.host_seconds, s));
  }
  /* (kind "idle": the causes, which make the step with the ops; "idle_copy": the copy's
     waits by what was copied, which make its row) */
  const struct { const char *kind, *cause; double seconds; } idle[] = {
      {"idle", "copy", s->idle_copy_seconds},   {"idle", "update", s->idle_update_seconds},
      {"idle", "ranks", s->idle_comm_seconds},  {"idle", "sync", s->idle_sync_seconds},
      {"idle", "launch", s->idle_launch_seconds},
      {"idle_copy", "params", s->idle_copy_params_seconds},
      {"idle_copy", "acts_in", s->idle_copy_acts_in_seconds},
      {"idle_copy", "acts_out", s->idle_copy_acts_out_seconds},
      {"idle_copy", "grads", s->idle_copy_grads_seconds}};
  for (size_t i = 0; i < sizeof idle / sizeof idle[0]; i++)
    fprintf(f, "%s\t%s\t\t\t%.6f\t%.6f\t\t\t\t\t\t\n", idle[i].kind, idle[i].cause,
            1e3 * per_step(idle[i].seconds, s), step > 0 ? per_step(idle[i].seconds, s) / step : 0);
  const struct { const char *what; int64_t n; } counts[] = {
      {"ops", s->ops}, {"lane_ops", s->lane_ops}, {"syncs", s->syncs},
      {"launches", s->launches}, {"dropped", s->dropped}};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
    fprintf(f, "count\t%s\t\t%.6g\t\t\t\t\t\t\t\t\n", counts[i].what,
            counts[i].n < 0 ? -1.0 : per_step((double)counts[i].n, s));
  const struct { const char *what, *bound; double rate; } rates[] = {
      {"copy_rate", "mem", s->copy_rate}, {"link_rate", "link", s->link_rate},
      {"gemm_rate_f32", "flop", s->gemm_rate_f32}, {"gemm_rate_16", "flop", s->gemm_rate_16}};
  for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
    fprintf(f, "probe\t%s\t\t\t\t\t\t\t%.6g\t%s\t\t\n", rates[i].what, rates[i].rate, rates[i].bound);
}

l2l_status l2l_profile_write(const char *path, int overwrite) {
  if (path == NULL || *path == '\0') return FAIL(L2L_ERR_INVALID, "path is NULL or empty");
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (overwrite ? O_TRUNC : O_EXCL),
                0644);
  if (fd < 0)
    return FAIL(L2L_ERR_IO, "cannot write the profile to '%s': %s%s", path, strerror(errno),
                errno == EEXIST ? " (pass overwrite to replace it)" : "");
  FILE *f = fdopen(fd, "w");
  if (f == NULL) {
    close(fd);
    return FAIL(L2L_ERR_IO, "cannot write the profile to '%s': %s", path, strerror(errno));
  }
  pthread_mutex_lock(&lock);
  const l2l_profile_summary *s = &result.sum;
  fprintf(f, "# l2l profile: backend %s, %lld steps; figures a step (ms, calls, GFLOP, MB); "
          "rate in FLOP/s (bound flop) or bytes/s; roofline = rate / the probed rate; host_ms = the "
          "host's time in the calls (near ms: the host set their pace); %s\n",
          s->backend, (long long)s->steps, s->probe);
  tsv_rows(f, s);
  pthread_mutex_unlock(&lock);
  bool failed = ferror(f) != 0;
  if (fclose(f) != 0) failed = true;
  if (failed) return FAIL(L2L_ERR_IO, "writing the profile to '%s' failed: %s", path, strerror(errno));
  return L2L_OK;
}

/* Appends to out[*used .. size), keeping a NUL at the end (what does not fit is cut). */
static void put(char *out, size_t size, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *out, size_t size, size_t *used, const char *fmt, ...) {
  if (*used >= size) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out + *used, size - *used, fmt, ap);
  va_end(ap);
  if (n > 0) *used = *used + (size_t)n < size ? *used + (size_t)n : size - 1;
}

enum { TABLE_ROWS = 24, OP_WIDTH = 24 };

/* The table's columns: kind, op, shape, calls, ms, share of the step, [rate,] roofline;
   the shape takes what the width leaves, and the rate shows from 100 columns on. */
l2l_status l2l_profile_table(char *out, size_t size, int width) {
  if (out == NULL || size == 0) return FAIL(L2L_ERR_INVALID, "out is NULL or size is 0");
  if (width < 80 || width > 1000) return FAIL(L2L_ERR_INVALID, "width is %d (want 80 to 1000)", width);
  size_t used = 0;
  out[0] = '\0';
  char a[64], b[64], c[64], e[64];
  const bool rates = width >= 100;
  const int shape_width = width - (4 + 1 + OP_WIDTH + 1 + 1 + 6 + 1 + 9 + 1 + 5 + 1 + 5) - (rates ? 13 : 0);
  pthread_mutex_lock(&lock);
  const l2l_profile_summary *s = &result.sum;
  double step = per_step(s->step_seconds, s), ops = per_step(s->op_seconds, s);
  put(out, size, &used, "l2l profile: %s, %lld step%s, %.2f ms a step, ops %.2f ms (%.0f %%)\n",
      s->backend, (long long)s->steps, s->steps == 1 ? "" : "s", 1e3 * step, 1e3 * ops,
      step > 0 ? 100 * ops / step : 0);
  put(out, size, &used, "rates: copy %s, link %s, GEMM f32 %s, bf16 %s\n",
      rate_words(a, sizeof a, s->copy_rate, false), rate_words(b, sizeof b, s->link_rate, false),
      rate_words(c, sizeof c, s->gemm_rate_f32, true), rate_words(e, sizeof e, s->gemm_rate_16, true));
  put(out, size, &used, "%-4s %-*s %-*s %6s %9s %5s%s %5s\n", "", OP_WIDTH, "op", shape_width,
      "shape", "calls", "ms", "step", rates ? "         rate" : "", "roof");
  int64_t shown = 0;
  for (int64_t i = 0; i < result.nrows && shown < TABLE_ROWS; i++, shown++) {
    const struct row *r = &result.rows[i];
    double sec = per_step(r->r.seconds, s), roof = roofline(r, s);
    put(out, size, &used, "%-4s %-*.*s %-*.*s %6.0f %9.3f %4.0f%%", r->r.kind, OP_WIDTH, OP_WIDTH,
        r->r.op, shape_width, shape_width, r->r.shape, per_step((double)r->r.calls, s), 1e3 * sec,
        step > 0 ? 100 * sec / step : 0);
    if (rates)
      put(out, size, &used, " %12s", rate_words(a, sizeof a, row_rate(r), flop_bound(r)));
    if (roof >= 0) put(out, size, &used, " %5.2f\n", roof);
    else put(out, size, &used, " %5s\n", "-");
  }
  if (result.nrows > shown)
    put(out, size, &used, "(%lld more rows in the TSV)\n", (long long)(result.nrows - shown));
  put(out, size, &used, "idle ms a step: copy %.2f, update %.2f, ranks %.2f, sync %.2f, launch %.2f\n",
      1e3 * per_step(s->idle_copy_seconds, s), 1e3 * per_step(s->idle_update_seconds, s),
      1e3 * per_step(s->idle_comm_seconds, s), 1e3 * per_step(s->idle_sync_seconds, s),
      1e3 * per_step(s->idle_launch_seconds, s));
  put(out, size, &used, "copy waits, ms: params %.2f, acts in %.2f, acts out %.2f, grads %.2f\n",
      1e3 * per_step(s->idle_copy_params_seconds, s), 1e3 * per_step(s->idle_copy_acts_in_seconds, s),
      1e3 * per_step(s->idle_copy_acts_out_seconds, s), 1e3 * per_step(s->idle_copy_grads_seconds, s));
  put(out, size, &used, "a step: %.1f syncs, %.0f ops, %s launches, %.0f lane copies%s\n",
      per_step((double)s->syncs, s), per_step((double)s->ops, s),
      s->launches < 0 ? "no" : (snprintf(a, sizeof a, "%.0f", per_step((double)s->launches, s)), a),
      per_step((double)s->lane_ops, s),
      s->dropped > 0 ? (snprintf(b, sizeof b, "; %lld calls dropped", (long long)s->dropped), b) : "");
  pthread_mutex_unlock(&lock);
  return L2L_OK;
}
