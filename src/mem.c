/* mem.c — the three memory pools: host, pinned and device.
 *
 * Purpose: hand out aligned memory for tensors and account for every byte (current, peak,
 * budget), so that claims like "device peak stays constant in depth" are measurable on any
 * build. The device pool is GPU memory when the CUDA backend serves it (backend_cuda.c's
 * caching allocator; the budget and accounting stay here), and otherwise host memory
 * with the same budget and the same over-budget message.
 *
 * Host memory comes from jemalloc through its explicit API (mallocx/dallocx) in arenas
 * that l2l creates for itself, one per pool: jemalloc never replaces malloc here (libl2l
 * links it as an ordinary dependency, and glibc's malloc stays first in symbol lookup).
 * These arenas keep the pages of freed tensors instead of decaying them back to the
 * system: a training step frees and allocates the same sizes every step, and with
 * jemalloc's default 10 s decay a fraction of them went back and was faulted in again
 * each step (bench/relay: about 12 % of a step on the CPU backend). Like the CUDA
 * caching allocator, the cache is counted in `reserved` and l2l_device_release_cache
 * gives it back.
 * A sanitizer build (L2L_SANITIZE) uses aligned_alloc instead, so that AddressSanitizer
 * sees every buffer.
 *
 * Must never: exit or abort when memory runs out, or let a refused allocation change the
 * statistics other than the `refused` count.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#ifndef L2L_SANITIZE
#include <jemalloc/jemalloc.h>
#endif

#include "backend.h"

enum { POOL_COUNT = 3 };

struct pool {
  pthread_mutex_t lock;
  l2l_pool_stats stats;
  unsigned arena;        /* jemalloc arena index */
  bool arena_ready;
};

static struct pool pools[POOL_COUNT] = {
    {.lock = PTHREAD_MUTEX_INITIALIZER},
    {.lock = PTHREAD_MUTEX_INITIALIZER},
    {.lock = PTHREAD_MUTEX_INITIALIZER},
};

static const char *const pool_names[POOL_COUNT] = {"host", "pinned", "device"};

bool l2l_pool_valid(int pool) { return pool >= 0 && pool < POOL_COUNT; }

const char *l2l_pool_name(l2l_pool_kind pool) {
  return l2l_pool_valid((int)pool) ? pool_names[pool] : NULL;
}

uint64_t l2l_pool_accounted(uint64_t bytes) {
  if (bytes > UINT64_MAX - (L2L_ALIGN - 1)) return 0;
  return (bytes + (L2L_ALIGN - 1)) / L2L_ALIGN * L2L_ALIGN;
}

/* mallctl on the pool's own arena: `leaf` names the setting under "arena.<i>." (or, with
   stats = true, "stats.arenas.<i>."). A sanitizer build has no arenas: always -1. */
static int arena_ctl(const struct pool *p, bool stats, const char *leaf, void *old,
                     size_t *old_len, void *new_value, size_t new_len) {
#ifdef L2L_SANITIZE
  (void)p, (void)stats, (void)leaf, (void)old, (void)old_len, (void)new_value, (void)new_len;
  return -1;
#else
  char key[64];
  snprintf(key, sizeof key, "%s.%u.%s", stats ? "stats.arenas" : "arena", p->arena, leaf);
  return mallctl(key, old, old_len, new_value, new_len);
#endif
}

#ifndef L2L_SANITIZE
/* Called with the pool's lock held. */
static l2l_status ensure_arena(struct pool *p, const char *name) {
  if (p->arena_ready) return L2L_OK;
  size_t size = sizeof(p->arena);
  int err = mallctl("arenas.create", &p->arena, &size, NULL, 0);
  if (err != 0)
    return l2l_fail(L2L_ERR_NOMEM, "%s pool: jemalloc could not create an arena (error %d)", name,
                    err);
  p->arena_ready = true;
  /* Never decay: freed pages stay for the next step (see the top of this file). Should
     jemalloc refuse, the arena still works with its default decay. */
  ssize_t never = -1;
  arena_ctl(p, false, "dirty_decay_ms", NULL, NULL, &never, sizeof never);
  arena_ctl(p, false, "muzzy_decay_ms", NULL, NULL, &never, sizeof never);
  return L2L_OK;
}
#endif

/* Bytes of freed tensors the pool's arena keeps for reuse (0 if jemalloc cannot say, or
   there is no arena). */
static uint64_t arena_cached_bytes(const struct pool *p) {
  if (!p->arena_ready) return 0;
  uint64_t epoch = 1;
  size_t size = sizeof epoch, pages = 0, page = 0;
#ifndef L2L_SANITIZE
  if (mallctl("epoch", &epoch, &size, &epoch, sizeof epoch) != 0) return 0;
  size = sizeof page;
  if (mallctl("arenas.page", &page, &size, NULL, 0) != 0) return 0;
#endif
  size = sizeof pages;
  if (arena_ctl(p, true, "pdirty", &pages, &size, NULL, 0) != 0) return 0;
  return (uint64_t)pages * page;
}

void l2l_pool_release_cached(void) {
  for (int kind = 0; kind < POOL_COUNT; kind++) {
    struct pool *p = &pools[kind];
    pthread_mutex_lock(&p->lock);
    if (p->arena_ready) arena_ctl(p, false, "purge", NULL, NULL, NULL, 0);
    pthread_mutex_unlock(&p->lock);
  }
}

l2l_status l2l_pool_alloc(void **out, l2l_pool_kind kind, uint64_t bytes) {
  char want[32], used[32], limit[32];
  if (!l2l_pool_valid((int)kind)) return l2l_fail(L2L_ERR_INVALID, "no pool with number %d", kind);
  struct pool *p = &pools[kind];
  const char *name = pool_names[kind];
  uint64_t accounted = l2l_pool_accounted(bytes);
  if (bytes == 0 || accounted == 0 || accounted > (uint64_t)PTRDIFF_MAX)
    return l2l_fail(L2L_ERR_INVALID, "%s pool: cannot allocate %llu bytes", name,
                    (unsigned long long)bytes);

  /* Reserve the bytes under the lock, allocate outside it. */
  pthread_mutex_lock(&p->lock);
  uint64_t budget = p->stats.budget, current = p->stats.current;
  if (budget != 0 && accounted > budget - current) {
    p->stats.refused++;
    pthread_mutex_unlock(&p->lock);
    return l2l_fail(L2L_ERR_BUDGET,
                    "%s pool: cannot allocate %llu bytes (%s): %llu bytes (%s) in use, budget "
                    "%llu bytes (%s)",
                    name, (unsigned long long)accounted, l2l_human_bytes(want, 32, accounted),
                    (unsigned long long)current, l2l_human_bytes(used, 32, current),
                    (unsigned long long)budget, l2l_human_bytes(limit, 32, budget));
  }
  const bool on_gpu = kind == L2L_POOL_DEVICE && l2l_device_is_cuda();
#ifndef L2L_SANITIZE
  l2l_status arena_status = on_gpu ? L2L_OK : ensure_arena(p, name);
  if (arena_status != L2L_OK) {
    p->stats.refused++;
    pthread_mutex_unlock(&p->lock);
    return arena_status;
  }
#endif
  p->stats.current += accounted;
  pthread_mutex_unlock(&p->lock);

  void *ptr = NULL;
  if (on_gpu) {
    if (l2l_cuda_malloc(&ptr, accounted) != L2L_OK) { /* its message says why */
      pthread_mutex_lock(&p->lock);
      p->stats.current -= accounted;
      p->stats.refused++;
      pthread_mutex_unlock(&p->lock);
      return L2L_ERR_NOMEM;
    }
  } else {
#ifdef L2L_SANITIZE
    ptr = aligned_alloc(L2L_ALIGN, accounted);
#else
    ptr = mallocx(accounted, MALLOCX_ALIGN(L2L_ALIGN) | MALLOCX_ARENA(p->arena) |
                                 MALLOCX_TCACHE_NONE);
#endif
  }

  pthread_mutex_lock(&p->lock);
  if (ptr == NULL) {
    p->stats.current -= accounted;
    p->stats.refused++;
    current = p->stats.current;
    pthread_mutex_unlock(&p->lock);
    return l2l_fail(L2L_ERR_NOMEM,
                    "%s pool: the system refused %llu bytes (%s); %llu bytes (%s) in use", name,
                    (unsigned long long)accounted, l2l_human_bytes(want, 32, accounted),
                    (unsigned long long)current, l2l_human_bytes(used, 32, current));
  }
  p->stats.allocs++;
  if (p->stats.current > p->stats.peak) p->stats.peak = p->stats.current;
  pthread_mutex_unlock(&p->lock);
  *out = ptr;
  return L2L_OK;
}

void l2l_pool_free(l2l_pool_kind kind, void *ptr, uint64_t bytes) {
  if (ptr == NULL || !l2l_pool_valid((int)kind)) return;
  struct pool *p = &pools[kind];
  uint64_t accounted = l2l_pool_accounted(bytes);
  if (kind == L2L_POOL_DEVICE && l2l_device_is_cuda()) {
    l2l_cuda_free(ptr, accounted);
  } else {
#ifdef L2L_SANITIZE
    free(ptr);
#else
    dallocx(ptr, MALLOCX_TCACHE_NONE);
#endif
  }
  pthread_mutex_lock(&p->lock);
  p->stats.current -= accounted;
  p->stats.frees++;
  pthread_mutex_unlock(&p->lock);
}

l2l_status l2l_pool_get_stats(l2l_pool_stats *out, l2l_pool_kind kind) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!l2l_pool_valid((int)kind)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", kind);
  pthread_mutex_lock(&pools[kind].lock);
  *out = pools[kind].stats;
  out->reserved = out->current + arena_cached_bytes(&pools[kind]);
  pthread_mutex_unlock(&pools[kind].lock);
  out->system_allocs = out->allocs;
  if (kind == L2L_POOL_DEVICE && l2l_device_is_cuda())
    l2l_cuda_pool_counts(&out->reserved, &out->system_allocs);
  return L2L_OK;
}

l2l_status l2l_pool_set_budget(l2l_pool_kind kind, uint64_t bytes) {
  char used[32], limit[32];
  if (!l2l_pool_valid((int)kind)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", kind);
  struct pool *p = &pools[kind];
  pthread_mutex_lock(&p->lock);
  uint64_t current = p->stats.current;
  if (bytes != 0 && bytes < current) {
    pthread_mutex_unlock(&p->lock);
    return FAIL(L2L_ERR_STATE,
                "%s pool: budget %llu bytes (%s) is below the %llu bytes (%s) in use",
                pool_names[kind], (unsigned long long)bytes, l2l_human_bytes(limit, 32, bytes),
                (unsigned long long)current, l2l_human_bytes(used, 32, current));
  }
  p->stats.budget = bytes;
  pthread_mutex_unlock(&p->lock);
  return L2L_OK;
}

l2l_status l2l_pool_reset_peak(l2l_pool_kind kind) {
  if (!l2l_pool_valid((int)kind)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", kind);
  pthread_mutex_lock(&pools[kind].lock);
  pools[kind].stats.peak = pools[kind].stats.current;
  pthread_mutex_unlock(&pools[kind].lock);
  return L2L_OK;
}
