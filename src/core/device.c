/* SPDX-License-Identifier: MIT */
/* device.c — the device table the core gets device memory and ordering from, and the
 * marks and stamps built on it.
 *
 * Purpose: one decision, made once and visible to every file: which table (if any) the
 * device pool's memory, the pinned pool's page-locking and the ordering of queued work
 * come from. The backend registers a chooser at load; the first use of the device asks
 * it. No table means the device pool is host memory run by the CPU backend (a CPU-only
 * build, a machine without a GPU, or L2L_DEVICE=cpu): ops are done when they return, so
 * marks are nothing to wait for and stamps read the host clock.
 * Must never: change the table while device memory is in use (a pointer would change
 * meaning under its tensor), or name a backend.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core.h"

/* The installed table, once `decided`; read on every device allocation, so atomic. */
static _Atomic(const struct device_ops *) installed = NULL;
static atomic_bool decided = false;
static pthread_mutex_t choice_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct device_ops *(*chooser)(void) = NULL;

void device_set_chooser(const struct device_ops *(*choose)(void)) {
  pthread_mutex_lock(&choice_lock);
  chooser = choose;
  pthread_mutex_unlock(&choice_lock);
}

/* Called with choice_lock held. */
static void decide_locked(void) {
  if (atomic_load(&decided)) return;
  atomic_store(&installed, chooser != NULL ? chooser() : NULL);
  atomic_store_explicit(&decided, true, memory_order_release);
}

const struct device_ops *core_device(void) {
  if (!atomic_load_explicit(&decided, memory_order_acquire)) {
    pthread_mutex_lock(&choice_lock);
    decide_locked();
    pthread_mutex_unlock(&choice_lock);
  }
  return atomic_load_explicit(&installed, memory_order_acquire);
}

uint64_t device_own_bytes(void) {
  const struct device_ops *device = core_device();
  return device != NULL ? device->own_bytes() : 0;
}

bool device_memory(uint64_t *free_bytes, uint64_t *total_bytes) {
  const struct device_ops *device = core_device();
  if (device != NULL) return device->memory(free_bytes, total_bytes) == L2L_OK;
  const char *env = getenv("L2L_DEVICE_MEMORY");
  unsigned long long f = 0, t = 0;
  char tail = 0;
  if (env == NULL || sscanf(env, "%llu,%llu%c", &f, &t, &tail) != 2) return false;
  *free_bytes = f, *total_bytes = t;
  return true;
}

l2l_status device_switch(const struct device_ops *to, const char *to_name) {
  pthread_mutex_lock(&choice_lock);
  decide_locked();
  const struct device_ops *now = atomic_load(&installed);
  if (now != to) {
    l2l_pool_stats stats;
    l2l_pool_get_stats(&stats, L2L_POOL_DEVICE);
    if (stats.current != 0) {
      pthread_mutex_unlock(&choice_lock);
      char held[32];
      return FAIL(L2L_ERR_STATE,
                  "the device pool holds %llu bytes (%s) of tensors on the %s backend: free "
                  "them before switching to %s",
                  (unsigned long long)stats.current,
                  core_human_bytes(held, sizeof held, stats.current),
                  now != NULL ? now->name : "cpu", to_name);
    }
    if (now != NULL) now->release_cache();
    atomic_store_explicit(&installed, to, memory_order_release);
  }
  pthread_mutex_unlock(&choice_lock);
  return L2L_OK;
}

/* Host waits for the device, counted whatever the backend (see core.h). */
static atomic_llong device_syncs = 0;

void device_note_sync(void) { atomic_fetch_add_explicit(&device_syncs, 1, memory_order_relaxed); }

int64_t device_sync_count(void) {
  return atomic_load_explicit(&device_syncs, memory_order_relaxed);
}

l2l_status l2l_device_synchronize(void) {
  device_note_sync();
  const struct device_ops *device = core_device();
  return device != NULL ? device->synchronize() : L2L_OK;
}

l2l_status l2l_device_release_cache(void) {
  pool_release_cached();
  const struct device_ops *device = core_device();
  return device != NULL ? device->release_cache() : L2L_OK;
}

/* ---------------------------------------------------------------- marks and stamps */

struct device_mark *device_mark(void) {
  const struct device_ops *device = core_device();
  return device != NULL ? (struct device_mark *)device->mark() : NULL;
}

l2l_status device_wait_mark(struct device_mark *mark) {
  return mark != NULL ? core_device()->wait_mark(mark) : L2L_OK;
}

void device_stamp(struct core_stamp *out) {
  const struct device_ops *device = core_device();
  out->event = device != NULL ? device->stamp() : NULL;
  out->host = core_now();
}

void device_stamp_anchor(struct core_stamp *out) {
  device_note_sync();
  const struct device_ops *device = core_device();
  out->event = NULL;
  if (device != NULL) {
    out->event = device->stamp();
    if (out->event != NULL && !device->stamp_wait(out->event)) {
      device->stamp_release(out->event);
      out->event = NULL;
    }
    /* without an event, the wait the anchor promises all the same: what was queued before
       it (a step's flags and guard copies) is read as done after it */
    if (out->event == NULL) (void)device->synchronize();
  }
  out->host = core_now();
}

bool device_stamp_seconds(double *out, const struct core_stamp *from,
                          const struct core_stamp *to) {
  const struct device_ops *device = core_device();
  if (from->event == NULL && to->event == NULL && device == NULL) {
    *out = to->host - from->host;
    return true;
  }
  if (from->event == NULL || to->event == NULL) return false;
  return device->stamp_seconds(out, from->event, to->event);
}

void device_stamp_release(struct core_stamp *stamp) {
  if (stamp->event != NULL) core_device()->stamp_release(stamp->event);
  stamp->event = NULL;
}

void device_wait_queued(void) {
  const struct device_ops *device = core_device();
  if (device == NULL) return;   /* (no table: a copy is done when it returns) */
  void *stamp = device->stamp();
  bool waited = stamp != NULL && device->stamp_wait(stamp);
  if (stamp != NULL) device->stamp_release(stamp);
  if (!waited) (void)l2l_device_synchronize();
}
