/* SPDX-License-Identifier: MIT */
/* test_relay_threads.c — the relay's threads: updates that start while earlier layers are
 * still in backward (eager), one call at a time on a relay whatever thread makes it, a
 * step's device peak its own beside another relay's, and by default as many optimizer
 * workers as CPUs the process may run on. test_relay.c says how the relay's tests test
 * (the plain executor, plain.c, as the reference); relay_rig.h holds the tolerances and
 * helpers. All test names start with "relay_".
 */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "relay_rig.h"

/* ---------------------------------------------------------------- eager updates */

/* A layer that holds the backward pass until every layer above it has been updated: an
   identity whose backward, at its first call of a step, watches the masters of the layers
   above it (the EPS updates them in place) until each differs from its copy taken before
   the step. Eager updates change them while this backward waits; updates that wait for
   the end of backward never come, and the watch gives up after WATCH_LIMIT seconds. No
   timing decides the outcome: a busy machine only makes the wait longer. */
enum { WATCH_LIMIT = 120 };
struct watcher {
  int nwatch;
  const uint32_t *live[PLAIN_MAX_RECORDS];   /* a master's words, as the optimizer writes them */
  uint32_t *before[PLAIN_MAX_RECORDS];       /* their copy from before the step */
  int64_t words[PLAIN_MAX_RECORDS];
  bool armed;                          /* the step's first backward call is still to come */
  int updated;                         /* masters seen changed at that call */
  double waited;                       /* seconds it waited */
};

static bool master_changed(const struct watcher *w, int i) {
  for (int64_t k = 0; k < w->words[i]; k++)
    if (__atomic_load_n(&w->live[i][k], __ATOMIC_RELAXED) != w->before[i][k]) return true;
  return false;
}

static int watcher_forward(void *user, l2l_layer *layer, l2l_tensor *y, const l2l_tensor *x,
                           const l2l_layer_batch *batch) {
  (void)user, (void)layer, (void)batch;
  return l2l_tensor_copy(y, x) != L2L_OK;
}

static int watcher_backward(void *user, l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                            const l2l_tensor *x, const l2l_layer_batch *batch) {
  (void)layer, (void)x, (void)batch;
  struct watcher *w = user;
  if (w->armed) {
    w->armed = false;
    struct timespec t0, now, pause = {0, 1000000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
      w->updated = 0;
      for (int i = 0; i < w->nwatch; i++) w->updated += master_changed(w, i);
      clock_gettime(CLOCK_MONOTONIC, &now);
      w->waited = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
      if (w->updated == w->nwatch || w->waited > WATCH_LIMIT) break;
      nanosleep(&pause, NULL);
    }
  }
  return l2l_tensor_copy(dx, dy) != L2L_OK;
}

TEST(relay_updates_are_eager) {
  /* With no clipping, a layer's update runs on the optimizer threads while the device
     does the backward of the layers below it: the watcher (above), placed after the
     first block, sees every layer above it updated while its own backward holds the
     step, in each of two steps (the second also waits for the first's updates at each
     forward). Also: UPDATE and BACKWARD events name real layers, and every layer has
     both. */
#ifdef L2L_TSAN
  check_skip("the watcher reads the masters while the optimizer threads write them, by design: "
             "ThreadSanitizer reports that as a race (the normal and ASan builds run this test)");
  return;
#endif
  struct shape g = stack_shape(3);
  struct model m;
  model_new(&m, &g);
  static struct watcher w;
  memset(&w, 0, sizeof w);
  l2l_layer *watch_layer = NULL;
  CHECK_OK(l2l_layer_new_custom(&watch_layer, "watcher", g.D, NULL, 0, watcher_forward,
                                watcher_backward, &w, 1, L2L_POOL_HOST));
  if (watch_layer == NULL) goto done;
  model_insert(&m, 2, watch_layer);
  struct data d;
  data_new(&d, &g, 8, g.S, 0, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  cfg.optimizer_threads = 1;
  l2l_relay *r = relay_new(&m, &cfg);
  /* the masters where the relay keeps them (pinned, where the device is a GPU's) */
  for (int l = 3; r != NULL && l < m.n; l++)
    for (int j = 0; j < l2l_layer_param_count(m.layer[l]); j++) {
      const l2l_tensor *v = l2l_param_value(l2l_layer_param(m.layer[l], j));
      int i = w.nwatch++;
      w.live[i] = l2l_tensor_data(v);
      w.words[i] = (int64_t)(tensor_bytes(v) / sizeof(uint32_t));
      w.before[i] = xmalloc(tensor_bytes(v));
    }
  for (int step = 0; r != NULL && step < 2; step++) {
    /* the masters as they are before the step (the last step's updates are done) */
    if (!CHECK_OK(l2l_relay_sync(r))) break;
    for (int i = 0; i < w.nwatch; i++)
      memcpy(w.before[i], w.live[i], (size_t)w.words[i] * sizeof(uint32_t));
    w.armed = true;
    double loss;
    if (!relay_step(&loss, r, &d, NULL) || !CHECK_OK(l2l_relay_sync(r))) break;
    CHECK(!w.armed, "step %d: the watcher's backward was never called", step);
    CHECK(w.updated == w.nwatch, "step %d: after %.0f s in the backward of layer 2, %d of the %d "
          "parameters of layers 3-%d were updated: updates wait for the end of backward", step,
          w.waited, w.updated, w.nwatch, m.n - 1);
    l2l_relay_stats s = relay_stats(r);
    CHECK(s.updates_deferred == 0, "updates deferred without clipping");
    int64_t n;
    l2l_relay_event *ev = relay_events(r, &n);
    bool has_update[MAX_LAYERS] = {0}, has_backward[MAX_LAYERS] = {0};
    int bad_layer = 0;
    for (int64_t i = 0; i < n; i++) {
      int l = ev[i].layer;
      if (ev[i].phase != L2L_PHASE_UPDATE && ev[i].phase != L2L_PHASE_BACKWARD) continue;
      if (l < 0 || l >= m.n) {
        bad_layer++;
        continue;
      }
      if (ev[i].phase == L2L_PHASE_UPDATE) has_update[l] = true;
      if (ev[i].phase == L2L_PHASE_BACKWARD) has_backward[l] = true;
    }
    free(ev);
    CHECK(bad_layer == 0, "%d UPDATE or BACKWARD events name no layer of the model", bad_layer);
    for (int l = 0; l < m.n; l++)
      CHECK(has_backward[l] && (has_update[l] || l2l_layer_param_count(m.layer[l]) == 0),
            "step %d, layer %d: no BACKWARD (%d) or no UPDATE (%d) event", step, l,
            has_backward[l], has_update[l]);
  }
  l2l_relay_free(r);
  data_free(&d);
done:
  for (int i = 0; i < w.nwatch; i++) free(w.before[i]);
  model_free(&m);
}

/* ---------------------------------------------------------------- one call at a time */

/* A layer whose forward, once armed, holds the step until another thread has made its
   calls: an identity that says it is inside and waits (up to WATCH_LIMIT seconds) to be
   released. No timing decides anything: the other thread calls while the step is held. */
struct gate {
  atomic_int armed, inside, released;
};

static int gate_forward(void *user, l2l_layer *layer, l2l_tensor *y, const l2l_tensor *x,
                        const l2l_layer_batch *batch) {
  (void)layer, (void)batch;
  struct gate *g = user;
  if (atomic_exchange(&g->armed, 0)) {
    atomic_store(&g->inside, 1);
    struct timespec pause = {0, 1000000};
    for (long i = 0; i < WATCH_LIMIT * 1000L && !atomic_load(&g->released); i++)
      nanosleep(&pause, NULL);
  }
  return l2l_tensor_copy(y, x) != L2L_OK;
}

static int gate_backward(void *user, l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                         const l2l_tensor *x, const l2l_layer_batch *batch) {
  (void)user, (void)layer, (void)x, (void)batch;
  return l2l_tensor_copy(dx, dy) != L2L_OK;
}

enum { OTHER_CALLS = 8 };
struct other_thread {
  l2l_relay *r;
  struct gate *gate;
  const struct data *d;
  l2l_layer *spare;                    /* a layer to insert */
  l2l_status status[OTHER_CALLS];
  char message[OTHER_CALLS][160];
  int count;                           /* l2l_relay_layer_count's answer */
};

static void *other_calls(void *arg) {
  struct other_thread *o = arg;
  struct timespec pause = {0, 1000000};
  for (long i = 0; i < WATCH_LIMIT * 1000L && !atomic_load(&o->gate->inside); i++)
    nanosleep(&pause, NULL);
  l2l_relay_batch b = relay_batch(o->d, NULL);
  double loss;
  l2l_relay_stats st;
  int n = 0;
#define OTHER(call)                                                          \
  do {                                                                       \
    o->status[n] = (call);                                                   \
    snprintf(o->message[n], sizeof o->message[n], "%s", l2l_last_error());  \
    n++;                                                                     \
  } while (0)
  OTHER(l2l_relay_step(&loss, o->r, &b));
  OTHER(l2l_relay_evaluate(&loss, o->r, &b));
  OTHER(l2l_relay_insert(o->r, 1, o->spare));
  OTHER(l2l_relay_remove(o->r, 1));
  OTHER(l2l_relay_set_micro_batch(o->r, 1));
  OTHER(l2l_relay_sync(o->r));
  OTHER(l2l_relay_get_stats(&st, o->r));
  l2l_relay_free(o->r);   /* refused: the relay stays whole */
  OTHER(strstr(l2l_last_error(), "is running") ? L2L_ERR_STATE : L2L_OK);
#undef OTHER
  o->count = l2l_relay_layer_count(o->r);
  atomic_store(&o->gate->released, 1);
  return NULL;
}

static void *step_twice(void *arg) {
  struct other_thread *o = arg;
  l2l_relay_batch b = relay_batch(o->d, NULL);
  double loss;
  int ok = 0, refused = 0;
  for (int i = 0; i < 2; i++) {
    l2l_status st = l2l_relay_step(&loss, o->r, &b);
    ok += st == L2L_OK;
    refused += st == L2L_ERR_STATE;
  }
  o->status[0] = ok;
  o->status[1] = refused;
  return NULL;
}

TEST(relay_takes_one_call_at_a_time) {
  /* Hardening 2, item 2: two threads stepping one relay crashed it. While one thread's
     step is held inside a layer's forward, another thread's step, evaluation, changes,
     sync, stats and free are each refused (L2L_ERR_STATE, naming the running call) and
     change nothing; the held step then completes, and the relay serves the other thread
     afterwards. Then two threads step it freely at once: every step either runs whole
     or is refused, and nothing crashes (ASan and TSan watch this one). */
  struct shape g = stack_shape(2);
  struct model m;
  model_new(&m, &g);
  static struct gate gate;
  l2l_layer *gate_layer = NULL, *spare = NULL;
  CHECK_OK(l2l_layer_new_custom(&gate_layer, "gate", g.D, NULL, 0, gate_forward, gate_backward,
                                &gate, 1, L2L_POOL_HOST));
  CHECK_OK(l2l_layer_new_custom(&spare, "spare", g.D, NULL, 0, gate_forward, gate_backward,
                                &gate, 1, L2L_POOL_HOST));
  if (gate_layer == NULL || spare == NULL) goto done;
  model_insert(&m, 1, gate_layer);
  struct data d;
  data_new(&d, &g, 4, g.S, 0, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  l2l_relay *r = relay_new(&m, &cfg);
  if (r != NULL) {
    struct other_thread o = {.r = r, .gate = &gate, .d = &d, .spare = spare};
    atomic_store(&gate.armed, 1);
    atomic_store(&gate.inside, 0);
    atomic_store(&gate.released, 0);
    pthread_t other;
    CHECK(pthread_create(&other, NULL, other_calls, &o) == 0, "pthread_create");
    double loss;
    CHECK(relay_step(&loss, r, &d, NULL), "the held step failed");
    pthread_join(other, NULL);
    static const char *const names[OTHER_CALLS] = {"step", "evaluate", "insert", "remove",
                                                   "set_micro_batch", "sync", "get_stats", "free"};
    for (int i = 0; i < OTHER_CALLS; i++) {
      CHECK(o.status[i] == L2L_ERR_STATE, "another thread's %s during a step: status %d (%s)",
            names[i], o.status[i], o.message[i]);
      CHECK(i == OTHER_CALLS - 1 || strstr(o.message[i], "l2l_relay_step is running on this relay"),
            "another thread's %s: message '%s'", names[i], o.message[i]);
    }
    CHECK(o.count == -1, "l2l_relay_layer_count during another thread's step: %d", o.count);
    CHECK(l2l_relay_layer_count(r) == m.n, "the relay has %d layers, not %d",
          l2l_relay_layer_count(r), m.n);
    CHECK(relay_stats(r).steps == 1, "%lld steps counted, 1 ran", (long long)relay_stats(r).steps);
    /* free-running: two threads, two steps each */
    struct other_thread a = {.r = r, .d = &d}, b = {.r = r, .d = &d};
    pthread_t ta, tb;
    CHECK(pthread_create(&ta, NULL, step_twice, &a) == 0, "pthread_create");
    CHECK(pthread_create(&tb, NULL, step_twice, &b) == 0, "pthread_create");
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    int ran = a.status[0] + b.status[0], refused = a.status[1] + b.status[1];
    CHECK(ran + refused == 4 && ran >= 2, "two threads' 4 steps: %d ran, %d refused", ran, refused);
    CHECK(relay_stats(r).steps == 1 + ran, "%lld steps counted, %d ran",
          (long long)relay_stats(r).steps, 1 + ran);
    CHECK(relay_step(&loss, r, &d, NULL) && isfinite(loss), "a step after the threads: %g", loss);
    l2l_relay_free(r);
  }
  data_free(&d);
done:
  l2l_layer_free(spare);
  model_free(&m);
}

struct stepper {
  l2l_relay *r;
  const struct data *d;
  l2l_status status;
};

static void *step_once(void *arg) {
  struct stepper *t = arg;
  l2l_relay_batch b = relay_batch(t->d, NULL);
  double loss;
  t->status = l2l_relay_step(&loss, t->r, &b);
  return NULL;
}

TEST(relay_device_peak_is_its_own) {
  /* Hardening 2, item 10: two relays stepping at once on two threads reported each
     other's device peak (the pool's peak is the process's, and each step reset it). Relay
     A's step starts while B is idle and is held in a gate layer's forward; B's step is
     started, and A released: A's device peak must be exactly what the same step reports
     alone (the pool's bytes at its start plus its own rise), however B's allocations
     interleave with it. */
  struct shape g = stack_shape(2);
  struct model ma, mb;
  model_new(&ma, &g);
  model_new(&mb, &g);
  static struct gate gate;
  l2l_layer *gate_layer = NULL;
  CHECK_OK(l2l_layer_new_custom(&gate_layer, "gate", g.D, NULL, 0, gate_forward, gate_backward,
                                &gate, 1, L2L_POOL_HOST));
  if (gate_layer == NULL) goto done;
  model_insert(&ma, 1, gate_layer);
  struct data d;
  data_new(&d, &g, 8, g.S, 0, 1.0);
  l2l_relay_config cfg = adamw_config();
  cfg.micro_batch = 2;
  l2l_relay *a = relay_new(&ma, &cfg), *b = relay_new(&mb, &cfg);
  if (a != NULL && b != NULL) {
    double loss;
    atomic_store(&gate.armed, 0);
    /* lasting buffers made, then A's and B's steps alone */
    for (int i = 0; i < 2; i++) CHECK(relay_step(&loss, a, &d, NULL) && relay_step(&loss, b, &d, NULL), "warm-up");
    CHECK(relay_step(&loss, a, &d, NULL), "A alone");
    uint64_t alone = relay_stats(a).device_peak;
    CHECK(relay_step(&loss, b, &d, NULL), "B alone");
    l2l_relay_stats sb = relay_stats(b);
    CHECK(sb.device_peak > sb.device_current, "B's step adds no device memory: the check has no teeth");
    /* A held in its forward, B's whole step beside the rest of A's */
    atomic_store(&gate.inside, 0);
    atomic_store(&gate.released, 0);
    atomic_store(&gate.armed, 1);
    struct stepper ta = {.r = a, .d = &d}, tb = {.r = b, .d = &d};
    pthread_t th_a, th_b;
    CHECK(pthread_create(&th_a, NULL, step_once, &ta) == 0, "pthread_create");
    struct timespec pause = {0, 1000000};
    for (long i = 0; i < WATCH_LIMIT * 1000L && !atomic_load(&gate.inside); i++) nanosleep(&pause, NULL);
    CHECK(pthread_create(&th_b, NULL, step_once, &tb) == 0, "pthread_create");
    atomic_store(&gate.released, 1);
    pthread_join(th_a, NULL);
    pthread_join(th_b, NULL);
    CHECK(ta.status == L2L_OK && tb.status == L2L_OK, "the steps at once: %d, %d", ta.status, tb.status);
    uint64_t together = relay_stats(a).device_peak;
    CHECK(together == alone, "A's device peak %llu beside B's step, %llu alone",
          (unsigned long long)together, (unsigned long long)alone);
  }
  l2l_relay_free(a);
  l2l_relay_free(b);
  data_free(&d);
done:
  model_free(&ma);
  model_free(&mb);
}

/* ---------------------------------------------------------------- the optimizer's workers */

/* A relay made on a thread the system lets run on one CPU (its children inherit that). */
struct one_cpu {
  int cpu;
  int workers;          /* the relay's EPS workers, -1: no relay */
};

/* The workers a relay made here with optimizer_threads = 0 starts. */
static int default_workers_here(void) {
  struct shape g = gpt_shape();
  struct model m;
  model_new(&m, &g);
  l2l_relay_config cfg = adamw_config();
  cfg.optimizer_threads = 0;
  l2l_relay *r = relay_new(&m, &cfg);
  int workers = r != NULL ? r->eps.workers.threads : -1;
  l2l_relay_free(r);
  model_free(&m);
  return workers;
}

static void *relay_on_one_cpu(void *arg) {
  struct one_cpu *o = arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(o->cpu, &set);
  o->workers = -1;
  if (!CHECK(sched_setaffinity(0, sizeof set, &set) == 0, "cannot bind a thread to CPU %d", o->cpu))
    return NULL;
  o->workers = default_workers_here();
  return NULL;
}

TEST(relay_optimizer_threads_leave_a_gpus_relay_its_cores) {
  /* optimizer_threads = 0 where the device is not host memory (a GPU's; L2L_GRADS_OUT=copy
     makes the CPU backend's one to the relay) starts a worker per CPU the process may run
     on less the relay's compute thread and its two copy lanes, at least one; on the CPU
     backend, one per CPU. */
  cpu_set_t set;
  CPU_ZERO(&set);
  if (!CHECK(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity failed")) return;
  if (omp_get_proc_bind() != omp_proc_bind_false) {
    check_skip("OMP_PROC_BIND is set: l2l's threads follow OpenMP's places, not an affinity");
    return;
  }
  const int cpus = CPU_COUNT(&set), spare = cpus - 3 >= 1 ? cpus - 3 : 1;
  const char *kept = getenv("L2L_GRADS_OUT");
  char *saved = kept ? strdup(kept) : NULL;
  unsetenv("L2L_GRADS_OUT");
  int host = default_workers_here();
  setenv("L2L_GRADS_OUT", "copy", 1);
  int gpu_like = default_workers_here();
  if (saved) setenv("L2L_GRADS_OUT", saved, 1);
  else unsetenv("L2L_GRADS_OUT");
  free(saved);
  CHECK(host == cpus, "on the CPU backend %d workers, want one per CPU (%d)", host, cpus);
  CHECK(gpu_like == spare, "with a device that is not host memory %d workers, want %d (%d CPUs "
        "less the relay's 3 threads, at least 1)", gpu_like, spare, cpus);
}

TEST(relay_optimizer_threads_default_to_the_cpus_it_may_run_on) {
  /* optimizer_threads = 0 starts a worker per CPU the process may run on (its affinity:
     a container's cpuset, taskset), not per CPU online: a relay made where one CPU is
     allowed has one. */
  cpu_set_t set;
  CPU_ZERO(&set);
  if (!CHECK(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity failed")) return;
  if (CPU_COUNT(&set) < 2) {
    check_skip("this process may run on one CPU: one worker either way, nothing to tell apart");
    return;
  }
  if (omp_get_proc_bind() != omp_proc_bind_false) {
    check_skip("OMP_PROC_BIND is set: l2l's threads follow OpenMP's places, not an affinity");
    return;
  }
  struct one_cpu o = {.cpu = -1};
  for (int c = 0; c < CPU_SETSIZE && o.cpu < 0; c++)
    if (CPU_ISSET(c, &set)) o.cpu = c;
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, relay_on_one_cpu, &o) == 0, "cannot start a thread")) return;
  pthread_join(t, NULL);
  CHECK(o.workers == 1, "a relay made where only CPU %d is allowed (of %d) started %d workers, "
        "want 1", o.cpu, CPU_COUNT(&set), o.workers);
}
