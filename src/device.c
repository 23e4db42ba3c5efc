/* device.c — which backend serves the device pool, and the dispatch from pools to ops
 * tables.
 *
 * Purpose: one decision, made once and visible to every file: the device pool is either
 * GPU memory run by the CUDA backend, or host memory run by the CPU backend with the
 * device pool's budget and accounting (a CPU-only build, a machine without a GPU, or
 * L2L_DEVICE=cpu). Host and pinned memory always belong to the CPU backend.
 * Must never: change the device's backend while device memory is in use (a pointer would
 * change meaning under its tensor), or pick CUDA without having probed that it runs.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "jobs.h"

/* 0: not decided yet; 1: cpu; 2: cuda. Read on every op, so atomic. */
enum { UNDECIDED = 0, ON_CPU = 1, ON_CUDA = 2 };
static atomic_int device_choice = UNDECIDED;
static pthread_mutex_t choice_lock = PTHREAD_MUTEX_INITIALIZER;

/* The first choice: L2L_DEVICE if set (an unusable "cuda" falls back to the CPU, and
   the first device allocation then explains why), else CUDA when it runs here. */
static int first_choice(void) {
  const char *env = getenv("L2L_DEVICE");
  if (env != NULL && strcmp(env, "cpu") == 0) return ON_CPU;
  return l2l_cuda_probe(NULL, 0) ? ON_CUDA : ON_CPU;
}

bool l2l_device_is_cuda(void) {
  int choice = atomic_load_explicit(&device_choice, memory_order_acquire);
  if (choice == UNDECIDED) {
    pthread_mutex_lock(&choice_lock);
    choice = atomic_load(&device_choice);
    if (choice == UNDECIDED) {
      choice = first_choice();
      atomic_store_explicit(&device_choice, choice, memory_order_release);
    }
    pthread_mutex_unlock(&choice_lock);
  }
  return choice == ON_CUDA;
}

const char *l2l_device_backend(void) { return l2l_device_is_cuda() ? "cuda" : "cpu"; }

l2l_status l2l_device_use(const char *backend) {
  if (backend == NULL) return FAIL(L2L_ERR_INVALID, "backend is NULL (want \"cpu\" or \"cuda\")");
  int want;
  if (strcmp(backend, "cpu") == 0) {
    want = ON_CPU;
  } else if (strcmp(backend, "cuda") == 0) {
    char why[256];
    if (!l2l_cuda_probe(why, sizeof why))
      return FAIL(L2L_ERR_UNSUPPORTED, "cannot use CUDA: %s", why);
    want = ON_CUDA;
  } else {
    return FAIL(L2L_ERR_INVALID, "backend must be \"cpu\" or \"cuda\", got \"%s\"", backend);
  }
  l2l_device_is_cuda(); /* decide the first choice now: the lock below is not reentrant */
  pthread_mutex_lock(&choice_lock);
  int now = atomic_load(&device_choice);
  if (now != want) {
    l2l_pool_stats stats;
    l2l_pool_get_stats(&stats, L2L_POOL_DEVICE);
    if (stats.current != 0) {
      pthread_mutex_unlock(&choice_lock);
      char held[32];
      return FAIL(L2L_ERR_STATE,
                  "the device pool holds %llu bytes (%s) of tensors on the %s backend: free "
                  "them before switching to %s",
                  (unsigned long long)stats.current, l2l_human_bytes(held, sizeof held, stats.current),
                  now == ON_CUDA ? "cuda" : "cpu", backend);
    }
    if (now == ON_CUDA) l2l_cuda_release_cache();
    atomic_store_explicit(&device_choice, want, memory_order_release);
  }
  pthread_mutex_unlock(&choice_lock);
  return L2L_OK;
}

const struct l2l_backend_ops *l2l_backend_for(l2l_pool_kind pool) {
  if (pool == L2L_POOL_DEVICE && l2l_device_is_cuda()) return l2l_cuda_ops();
  return &l2l_cpu_backend;
}

/* The device pool is its own domain even on the CPU backend, so that host/device mixing
   is refused exactly as it is with a GPU. */
int l2l_pool_domain(l2l_pool_kind pool) { return pool == L2L_POOL_DEVICE ? 1 : 0; }

/* ---------------------------------------------------------------- public CUDA calls */

int l2l_cuda_available(char *why, size_t len) { return l2l_cuda_probe(why, len); }

l2l_status l2l_cuda_get_info(l2l_cuda_info *out) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  char why[256];
  if (!l2l_cuda_probe(why, sizeof why))
    return FAIL(L2L_ERR_UNSUPPORTED, "CUDA cannot run here: %s", why);
  return l2l_cuda_fill_info(out);
}

/* Accepted on any build: the setting matters only where CUDA runs. */
l2l_status l2l_cuda_set_tf32(int enable) {
  if (enable != 0 && enable != 1)
    return FAIL(L2L_ERR_INVALID, "enable must be 0 or 1, got %d", enable);
  l2l_cuda_use_tf32(enable);
  return L2L_OK;
}

l2l_status l2l_device_synchronize(void) {
  return l2l_device_is_cuda() ? l2l_cuda_synchronize() : L2L_OK;
}

struct l2l_device_mark *l2l_device_mark(void) {
  return l2l_device_is_cuda() ? (struct l2l_device_mark *)l2l_cuda_mark() : NULL;
}

l2l_status l2l_device_wait_mark(struct l2l_device_mark *mark) {
  return mark != NULL ? l2l_cuda_wait_mark(mark) : L2L_OK;
}

void l2l_device_stamp(struct l2l_stamp *out) {
  out->event = l2l_device_is_cuda() ? l2l_cuda_stamp() : NULL;
  out->host = l2l_now();
}

void l2l_device_stamp_anchor(struct l2l_stamp *out) {
  out->event = NULL;
  if (l2l_device_is_cuda()) {
    out->event = l2l_cuda_stamp();
    if (out->event != NULL && !l2l_cuda_stamp_wait(out->event)) {
      l2l_cuda_stamp_release(out->event);
      out->event = NULL;
    }
  }
  out->host = l2l_now();
}

bool l2l_device_stamp_seconds(double *out, const struct l2l_stamp *from,
                              const struct l2l_stamp *to) {
  if (from->event == NULL && to->event == NULL && !l2l_device_is_cuda()) {
    *out = to->host - from->host;
    return true;
  }
  if (from->event == NULL || to->event == NULL) return false;
  return l2l_cuda_stamp_seconds(out, from->event, to->event);
}

void l2l_device_stamp_release(struct l2l_stamp *stamp) {
  if (stamp->event != NULL) l2l_cuda_stamp_release(stamp->event);
  stamp->event = NULL;
}

l2l_status l2l_device_release_cache(void) {
  l2l_pool_release_cached();
  return l2l_device_is_cuda() ? l2l_cuda_release_cache() : L2L_OK;
}
