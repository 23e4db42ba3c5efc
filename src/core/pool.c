/* SPDX-License-Identifier: MIT */
/* pool.c — the three memory pools: host, pinned and device.
 *
 * Purpose: hand out aligned memory for tensors and account for every byte (current, peak,
 * budget), so that claims like "device peak stays constant in depth" are measurable on any
 * build. The device pool is the installed device table's memory when a backend installed
 * one (a GPU's caching allocator; the budget and accounting stay here), and otherwise
 * host memory with the same budget and the same over-budget message.
 *
 * Host memory comes from jemalloc through its explicit API (mallocx/dallocx) in arenas
 * that l2l creates for itself, one per pool: jemalloc never replaces malloc here (libl2l
 * links it as an ordinary dependency, and glibc's malloc stays first in symbol lookup).
 * These arenas keep the pages of freed tensors instead of decaying them back to the
 * system: a training step frees and allocates the same sizes every step, and with
 * jemalloc's default 10 s decay a fraction of them went back and was faulted in again
 * each step (bench/relay: about 12 % of a step on the CPU backend). Like a GPU's
 * caching allocator, the cache is counted in `reserved` and l2l_device_release_cache
 * gives it back.
 * A sanitizer build (L2L_SANITIZE) uses posix_memalign instead, so that AddressSanitizer
 * sees every buffer.
 * The pinned pool hands out blocks of a block cache (core.h) whose memory the device
 * table page-locks when one is installed, else plain host memory (nothing to lock for:
 * the copies are memcpy). Locked memory is taken from every other
 * program on the machine, so the pool holds at most a cap of it (a quarter of the
 * machine's memory unless set); past the cap, or when the system refuses to lock more, a
 * pinned allocation comes from pageable memory instead, with a warning the first time:
 * it works, only its copies are slower. Each block carries a header that says which it is.
 *
 * Must never: exit or abort when memory runs out, or let a refused allocation change the
 * statistics other than the `refused` count.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef L2L_SANITIZE
#include <jemalloc/jemalloc.h>
#endif

#include "core.h"

enum { POOL_COUNT = 3 };   /* the l2l_pool_kind values */

struct pool {
  pthread_mutex_t lock;
  l2l_pool_stats stats;
  unsigned arena;        /* jemalloc arena index */
  bool arena_ready;
  uint64_t fallback_held;  /* pinned: bytes of pageable blocks in use (headers included) */
  uint64_t window_peak;    /* most bytes in use since the arena was last trimmed */
  uint64_t freed_unchecked;  /* bytes freed into the arena since its cache was last looked at */
  uint64_t measuring;      /* of current, what threads measuring (pool_measuring_begin) hold:
                              left out of the peaks */
};

/* The arena's cache is looked at once per this many bytes freed into it, and trimmed when
   in use plus cached has grown past the most ever in use since the last trim by this much
   (or a quarter of it): see trim_if_fragmented. */
enum { TRIM_CHECK_BYTES = 64 << 20, TRIM_SLACK_BYTES = 64 << 20 };

static struct pool pools[POOL_COUNT] = {
    {.lock = PTHREAD_MUTEX_INITIALIZER},
    {.lock = PTHREAD_MUTEX_INITIALIZER},
    {.lock = PTHREAD_MUTEX_INITIALIZER},
};

static const char *const pool_names[POOL_COUNT] = {"host", "pinned", "device"};

static _Thread_local struct pool_meter *bound_meter;
/* This thread's measuring depth, and the bytes it allocated while measuring, still held. */
static _Thread_local int measuring_depth;
static _Thread_local uint64_t measured[POOL_COUNT];

struct pool_meter *pool_meter_bind(struct pool_meter *meter) {
  struct pool_meter *before = bound_meter;
  bound_meter = meter;
  return before;
}

void pool_meter_reset(struct pool_meter *meter) {
  atomic_store(&meter->peak, atomic_load(&meter->current));
}

/* The device pool's bytes changed by `delta` on this thread: its meter follows. */
static void meter_add(l2l_pool_kind kind, int64_t delta) {
  struct pool_meter *m = bound_meter;
  if (m == NULL || kind != L2L_POOL_DEVICE) return;
  int64_t now = atomic_fetch_add(&m->current, delta) + delta;
  int64_t peak = atomic_load(&m->peak);
  while (now > peak && !atomic_compare_exchange_weak(&m->peak, &peak, now)) {
  }
}

/* The pinned pool's blocks (see the top of this file and "the pinned pool" below). */
static int pinned_block_alloc(void **out, uint64_t size);
static void pinned_block_free(void *block, void *tag);
static const struct block_source pinned_source = {pinned_block_alloc, pinned_block_free};
static struct block_cache pinned_blocks = L2L_BLOCK_CACHE(&pinned_source);
static struct block_cache *pinned_cache(void);   /* with its default cap set */

bool pool_valid(int pool) { return pool >= 0 && pool < POOL_COUNT; }

/* The host pool's budget starts at the machine's physical memory: an allocation larger
   than what is left of it can never be served, and asking the system anyway (jemalloc maps
   it, overcommitted, and the first touch brings the OOM killer) would end the process
   instead of returning a status. Set once, before anything reads or changes the budget. */
static uint64_t physical_bytes;   /* the machine's memory (0: unknown) */
static void host_default_budget(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) physical_bytes = (uint64_t)pages * (uint64_t)page;
  pools[L2L_POOL_HOST].stats.budget = physical_bytes;
}

/* The pool, with its defaults in place. */
static struct pool *pool_of(l2l_pool_kind kind) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, host_default_budget);
  return &pools[kind];
}

const char *l2l_pool_name(l2l_pool_kind pool) {
  return pool_valid((int)pool) ? pool_names[pool] : NULL;
}

uint64_t pool_accounted(uint64_t bytes) {
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
    return core_fail(L2L_ERR_NOMEM, "%s pool: jemalloc could not create an arena (error %d)", name,
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

/* The bytes in use the peaks see: all but what measuring threads hold. Under p's lock. */
static uint64_t peak_bytes(const struct pool *p) { return p->stats.current - p->measuring; }

/* p's arena's cache given back; the most in use counts again from now. Under p's lock. */
static void arena_purge(struct pool *p) {
  arena_ctl(p, false, "purge", NULL, NULL, NULL, 0);
  p->window_peak = peak_bytes(p);
  p->freed_unchecked = 0;
}

/* The arenas never decay (see the top of this file), so that a step's freed pages serve the
   next step; but jemalloc does not serve a small request from a much larger free extent
   (opt.lg_extent_max_active_fit), and pages freed in an order unlike their allocation's
   (layers the Lua collector frees in whatever order) coalesce into extents too large to
   reuse: the cache then grew by a whole working set each time, without bound. A cache
   holding more than the most bytes ever in use at once (plus slack) is such garbage: given
   back. A training step's cache stays below that bound, and is kept: the slack is a
   quarter of that most (an eighth purged a CPU step's device pool every step, its live
   and cached pages 12.6 % past it: a 304 M model's bf16 step faulted its pages in again
   each time, 5 s of 7; bench/RESULTS.md). Called with p's lock held, for an arena that
   exists. */
static void trim_if_fragmented(struct pool *p) {
  uint64_t slack = p->window_peak / 4 > TRIM_SLACK_BYTES ? p->window_peak / 4 : TRIM_SLACK_BYTES;
  if (p->stats.current + arena_cached_bytes(p) > p->window_peak + slack) arena_purge(p);
}

void pool_trim(l2l_pool_kind kind) {
  if (!pool_valid((int)kind) || kind == L2L_POOL_PINNED) return;
  if (kind == L2L_POOL_DEVICE && core_device() != NULL) return;   /* (the table's own cache) */
  struct pool *p = &pools[kind];
  pthread_mutex_lock(&p->lock);
  if (p->arena_ready && arena_cached_bytes(p) >= POOL_TRIM_BYTES) arena_purge(p);
  pthread_mutex_unlock(&p->lock);
}

#ifdef L2L_SANITIZE
/* A sanitizer build's large buffers, kept after their free instead of unmapped. Under
   AddressSanitizer every buffer past 128 KiB is a fresh mapping, unmapped when it leaves
   the sanitizer's quarantine, so each step faulted its activations in again a page at a
   time: most of the sanitized specs' time went to the kernel (bench/RESULTS.md, "the
   sanitized specs"). Here a freed buffer is poisoned (any access is reported, as the
   sanitizer reports a freed one) and kept; a request of its exact size takes it back only
   once SAN_QUARANTINE bytes of other large buffers were freed after it, the sanitizer's
   own quarantine (256 MiB on 64-bit Linux), so a use after free goes unreported no sooner
   than the sanitizer would let it. Past SAN_HELD bytes kept, the oldest go back to the
   sanitizer. (ThreadSanitizer's build keeps them alike, unpoisoned: the poisoning macros
   are no-ops there, and the lock orders a buffer's last user before its next.) */
#include <sanitizer/asan_interface.h>
#include <malloc.h>

enum { SAN_LARGE = 128 << 10, SAN_MAX_KEPT = 4096 };
#define SAN_QUARANTINE ((uint64_t)256 << 20)
#define SAN_HELD ((uint64_t)512 << 20)

static struct {
  pthread_mutex_t lock;
  struct san_kept { void *ptr; uint64_t bytes, freed_at; } list[SAN_MAX_KEPT];  /* oldest first */
  int n;
  uint64_t held, freed;   /* bytes kept; bytes of large buffers freed so far */
} san_kept = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Forgets kept buffer i; `give_back`: to the sanitizer. With the lock held. */
static void san_forget(int i, bool give_back) {
  if (give_back) free(san_kept.list[i].ptr);
  san_kept.held -= san_kept.list[i].bytes;
  san_kept.n--;
  memmove(&san_kept.list[i], &san_kept.list[i + 1], (size_t)(san_kept.n - i) * sizeof san_kept.list[0]);
}

/* A kept buffer of exactly `bytes`, out of quarantine, unpoisoned; NULL if none. */
static void *san_take(uint64_t bytes) {
  void *ptr = NULL;
  pthread_mutex_lock(&san_kept.lock);
  for (int i = 0; i < san_kept.n && san_kept.freed - san_kept.list[i].freed_at >= SAN_QUARANTINE; i++)
    if (san_kept.list[i].bytes == bytes) {
      ptr = san_kept.list[i].ptr;
      san_forget(i, false);
      break;
    }
  pthread_mutex_unlock(&san_kept.lock);
  if (ptr != NULL) ASAN_UNPOISON_MEMORY_REGION(ptr, bytes);
  return ptr;
}

/* Keeps a freed buffer (poisoned) or gives it to the sanitizer. */
static void san_free(void *ptr) {
  uint64_t bytes = ptr != NULL ? malloc_usable_size(ptr) : 0;
  if (bytes < SAN_LARGE) { free(ptr); return; }
  ASAN_POISON_MEMORY_REGION(ptr, bytes);
  pthread_mutex_lock(&san_kept.lock);
  while (san_kept.n > 0 && (san_kept.n == SAN_MAX_KEPT || san_kept.held + bytes > SAN_HELD))
    san_forget(0, true);
  san_kept.freed += bytes;
  san_kept.list[san_kept.n++] = (struct san_kept){ ptr, bytes, san_kept.freed };
  san_kept.held += bytes;
  pthread_mutex_unlock(&san_kept.lock);
}

static void san_release_kept(void) {
  pthread_mutex_lock(&san_kept.lock);
  while (san_kept.n > 0) san_forget(0, true);
  pthread_mutex_unlock(&san_kept.lock);
}
#endif

void pool_release_cached(void) {
  blocks_release_cached(pinned_cache());
#ifdef L2L_SANITIZE
  san_release_kept();
#endif
  for (int kind = 0; kind < POOL_COUNT; kind++) {
    struct pool *p = &pools[kind];
    pthread_mutex_lock(&p->lock);
    if (p->arena_ready) arena_ctl(p, false, "purge", NULL, NULL, NULL, 0);
    pthread_mutex_unlock(&p->lock);
  }
}

/* Host memory of pool p's arena (posix_memalign in a sanitizer build, or a buffer it kept);
   NULL if refused. The arena exists: pool_alloc made it before. A buffer of a page or more
   starts on a page: the EPS's spill file moves such buffers around the page cache (O_DIRECT
   wants page-aligned memory), and jemalloc otherwise offsets large ones by a random cache line. */
static void *arena_alloc(const struct pool *p, uint64_t bytes) {
  size_t align = bytes >= 4096 ? 4096 : L2L_ALIGN;
#ifdef L2L_SANITIZE
  (void)p;
  void *ptr = bytes >= SAN_LARGE ? san_take(bytes) : NULL;
  if (ptr != NULL) return ptr;
  /* (posix_memalign: any size; C11's aligned_alloc wants a multiple) */
  return posix_memalign(&ptr, align, bytes) == 0 ? ptr : NULL;
#else
  return mallocx(bytes, MALLOCX_ALIGN(align) | MALLOCX_ARENA(p->arena) | MALLOCX_TCACHE_NONE);
#endif
}

static void arena_free(void *ptr) {
#ifdef L2L_SANITIZE
  san_free(ptr);
#else
  dallocx(ptr, MALLOCX_TCACHE_NONE);
#endif
}

uint64_t pool_zero_pages(l2l_pool_kind pool, void *ptr, uint64_t bytes) {
  uintptr_t begin = (uintptr_t)ptr, end = begin + bytes;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  /* Only the host pool's memory is the process's own anonymous memory, whose pages read
     as zero once given back (pinned memory is locked; the device pool's is a table's). */
  if (pool != L2L_POOL_HOST || last <= first) {
    memset(ptr, 0, bytes);
    return 0;
  }
  /* 2 MiB pages where the range holds some (and the kernel allows them on request): the
     pages come back at the next write, and one fault for 512 pages costs a fraction of
     512 faults (bench/RESULTS.md, spill_capacity: 18-21 s a step against 22-26) */
  uintptr_t huge = (uintptr_t)2 << 20, hfirst = (begin + huge - 1) / huge * huge, hlast = end / huge * huge;
  if (hlast > hfirst) madvise((void *)hfirst, hlast - hfirst, MADV_HUGEPAGE);
  if (madvise((void *)first, last - first, MADV_DONTNEED) != 0) {
    memset(ptr, 0, bytes);
    return 0;
  }
  memset(ptr, 0, first - begin);
  memset((void *)last, 0, end - last);
  return last - first;
}

/* /proc/self/pagemap, once: -1 where it cannot be read, or where it does not say that a
   page just written is in memory (a system that hides the flags would make every page
   look absent, and so zero). */
static int pagemap_fd = -1;
static pid_t pagemap_pid;   /* whose page tables the file shows (a forked child's are its own) */
static pthread_once_t pagemap_once = PTHREAD_ONCE_INIT;

static void pagemap_open(void) {
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  long page = sysconf(_SC_PAGESIZE);
  volatile char *probe = page > 0 ? mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
  bool ok = false;
  if (fd >= 0 && probe != MAP_FAILED) {
    probe[0] = 1;
    uint64_t entry = 0;   /* bit 63: in memory, bit 62: swapped out (proc(5)) */
    off_t at = (off_t)((uintptr_t)probe / (uintptr_t)page * sizeof entry);
    ok = pread(fd, &entry, sizeof entry, at) == sizeof entry && (entry >> 63 & 1);
  }
  if (probe != MAP_FAILED) munmap((void *)probe, (size_t)page);
  if (!ok && fd >= 0) close(fd);
  pagemap_fd = ok ? fd : -1;
  pagemap_pid = getpid();
}

bool pool_blocks_absent(l2l_pool_kind pool, const void *ptr, uint64_t bytes, uint64_t block,
                        uint8_t *absent, size_t n) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), begin = (uintptr_t)ptr;
  /* (only the host pool's memory is the process's own anonymous memory, as pool_zero_pages) */
  if (pool != L2L_POOL_HOST || block == 0 || bytes == 0 || (bytes + block - 1) / block > n)
    return false;
  pthread_once(&pagemap_once, pagemap_open);
  if (pagemap_fd < 0 || pagemap_pid != getpid()) return false;
  enum { BATCH = 512 };
  uint64_t entry[BATCH];
  uintptr_t first = begin / page, count = (begin + bytes - 1) / page - first + 1;
  memset(absent, 1, (size_t)((bytes + block - 1) / block));
  for (uintptr_t at = 0; at < count; at += BATCH) {
    size_t want = (count - at < BATCH ? count - at : BATCH) * sizeof *entry;
    if (pread(pagemap_fd, entry, want, (off_t)((first + at) * sizeof *entry)) != (ssize_t)want)
      return false;
    for (size_t i = 0; i < want / sizeof *entry; i++) {
      if ((entry[i] >> 62 & 3) == 0) continue;   /* (nothing behind this page) */
      /* the blocks this page holds a byte of */
      uintptr_t lo = (first + at + i) * page, hi = lo + page;
      uintptr_t b0 = lo > begin ? (lo - begin) / block : 0;
      uintptr_t b1 = (hi < begin + bytes ? hi - begin : bytes) - 1;
      for (uintptr_t b = b0; b <= b1 / block; b++) absent[b] = 0;
    }
  }
  return true;
}

/* ---------------------------------------------------------------- the pinned pool */

enum { PINNED_MAGIC = 0x6c32706eu,  /* "l2pn" */
       FROM_DEVICE = 1, FROM_HOST = 2, FROM_PAGEABLE = 3 };

/* Before each pinned block's data (L2L_ALIGN bytes, so the data stays aligned). */
struct pinned_header {
  uint32_t magic;
  uint32_t from;
  const struct device_ops *device;  /* FROM_DEVICE: the table that page-locked it */
};
_Static_assert(sizeof(struct pinned_header) <= L2L_ALIGN, "the header fits before the data");

static struct pinned_header *header_of(void *block) { return (struct pinned_header *)block; }

static int pinned_block_alloc(void **out, uint64_t size) {
  void *block = NULL;
  uint32_t from = FROM_HOST;
  const struct device_ops *device = core_device();
  if (device != NULL) {
    int err = device->host_alloc(&block, size);
    if (err != 0) return err;
    from = FROM_DEVICE;
  } else {
    block = arena_alloc(&pools[L2L_POOL_PINNED], size);
    if (block == NULL) return -2;
  }
  *header_of(block) = (struct pinned_header){PINNED_MAGIC, from, device};
  *out = block;
  return 0;
}

static void pinned_block_free(void *block, void *tag) {
  (void)tag;
  if (header_of(block)->from == FROM_DEVICE) header_of(block)->device->host_free(block);
  else arena_free(block);
}

/* The default cap: a quarter of the machine's memory (no cap if it cannot be told). */
static void pinned_default_cap(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0)
    blocks_set_cap(&pinned_blocks, (uint64_t)pages * (uint64_t)page / 4);
}

/* Every use goes through here, so the default is set before anything reads or changes
   the cap (and never after a cap the caller set). */
static struct block_cache *pinned_cache(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, pinned_default_cap);
  return &pinned_blocks;
}

l2l_status l2l_pinned_set_cap(uint64_t bytes) {
  blocks_set_cap(pinned_cache(), bytes);
  return L2L_OK;
}

/* Said once per process: a pinned allocation that had to come from pageable memory. */
static void warn_pageable(int err, uint64_t bytes) {
  static atomic_flag warned = ATOMIC_FLAG_INIT;
  if (atomic_flag_test_and_set(&warned)) return;
  char size[32], cap[32];
  uint64_t limit = blocks_cap(pinned_cache());
  if (err == L2L_BLOCKS_OVER_CAP)
    fprintf(stderr, "l2l: warning: the pinned pool is at its cap (%s): %s and later pinned "
            "allocations past it come from pageable memory (slower copies); raise the cap "
            "with l2l_pinned_set_cap (Lua: l2l.set_pinned_cap)\n",
            core_human_bytes(cap, sizeof cap, limit), core_human_bytes(size, sizeof size, bytes));
  else
    fprintf(stderr, "l2l: warning: the system refused to page-lock %s (error %d): pinned "
            "allocations it refuses come from pageable memory (slower copies)\n",
            core_human_bytes(size, sizeof size, bytes), err);
}

/* A pinned allocation of `accounted` bytes: a block of the cache, or a pageable one. */
static void *pinned_alloc(struct pool *p, uint64_t accounted) {
  uint64_t size = accounted + L2L_ALIGN;
  void *block = NULL, *no_tag = NULL;   /* the pinned cache keeps no tags */
  int err = blocks_get(pinned_cache(), &block, size, &no_tag);
  if (err != 0) {
    warn_pageable(err, size);
    struct pool *host = &pools[L2L_POOL_HOST];
    pthread_mutex_lock(&host->lock);
    l2l_status made = L2L_OK;
#ifndef L2L_SANITIZE
    made = ensure_arena(host, pool_names[L2L_POOL_HOST]);
#endif
    pthread_mutex_unlock(&host->lock);
    block = made == L2L_OK ? arena_alloc(host, size) : NULL;
    if (block == NULL) return NULL;
    *header_of(block) = (struct pinned_header){PINNED_MAGIC, FROM_PAGEABLE, NULL};
    pthread_mutex_lock(&p->lock);
    p->stats.fallback += accounted;
    p->stats.fallback_allocs++;
    p->fallback_held += size;
    pthread_mutex_unlock(&p->lock);
  }
  return (char *)block + L2L_ALIGN;
}

static void pinned_free(struct pool *p, void *ptr, uint64_t accounted) {
  void *block = (char *)ptr - L2L_ALIGN;
  if (header_of(block)->from != FROM_PAGEABLE) {
    blocks_put(pinned_cache(), block, accounted + L2L_ALIGN, NULL);
    return;
  }
  arena_free(block);
  pthread_mutex_lock(&p->lock);
  p->stats.fallback -= accounted;
  p->fallback_held -= accounted + L2L_ALIGN;
  pthread_mutex_unlock(&p->lock);
}

/* ---------------------------------------------------------------- allocation */

l2l_status pool_alloc(void **out, l2l_pool_kind kind, uint64_t bytes) {
  char want[32], used[32], limit[32];
  if (!pool_valid((int)kind)) return core_fail(L2L_ERR_INVALID, "no pool with number %d", kind);
  struct pool *p = pool_of(kind);
  const char *name = pool_names[kind];
  uint64_t accounted = pool_accounted(bytes);
  if (bytes == 0 || accounted == 0 || accounted > (uint64_t)PTRDIFF_MAX)
    return core_fail(L2L_ERR_INVALID, "%s pool: cannot allocate %llu bytes", name,
                     (unsigned long long)bytes);

  const struct device_ops *device = kind == L2L_POOL_DEVICE ? core_device() : NULL;
  /* A GPU backend's own bytes (scratch, cuBLAS's workspace) come out of the budget too. */
  uint64_t own = device != NULL ? device->own_bytes() : 0;
  /* Reserve the bytes under the lock, allocate outside it. */
  pthread_mutex_lock(&p->lock);
  uint64_t budget = p->stats.budget, current = p->stats.current;
  if (budget != 0 && (current + own > budget || accounted > budget - current - own)) {
    char backend[96] = "";
    if (own != 0)
      snprintf(backend, sizeof backend, " (and %s the backend keeps for itself)",
               core_human_bytes(limit, 32, own));
    p->stats.refused++;
    pthread_mutex_unlock(&p->lock);
    /* (the smallest budget that works now: what is in use, the backend's and this) */
    return error_note_needed(
        core_fail(L2L_ERR_BUDGET,
                  "%s pool: cannot allocate %llu bytes (%s): %llu bytes (%s) in use%s, budget "
                  "%llu bytes (%s)",
                  name, (unsigned long long)accounted, core_human_bytes(want, 32, accounted),
                  (unsigned long long)current, core_human_bytes(used, 32, current), backend,
                  (unsigned long long)budget, core_human_bytes(limit, 32, budget)),
        current + own + accounted);
  }
  /* Host memory (the host and pinned pools, the device pool of the CPU backend) is never
     asked for more than the machine has, whatever the budget: the system might map it,
     and the first touch would bring the OOM killer (a sanitizer's allocator aborts). */
  if (device == NULL && physical_bytes != 0 && accounted > physical_bytes) {
    p->stats.refused++;
    pthread_mutex_unlock(&p->lock);
    return core_fail(L2L_ERR_NOMEM, "%s pool: cannot allocate %llu bytes (%s): more than this "
                     "machine's memory (%s)", name, (unsigned long long)accounted,
                     core_human_bytes(want, 32, accounted), core_human_bytes(limit, 32, physical_bytes));
  }
#ifndef L2L_SANITIZE
  l2l_status arena_status = device != NULL ? L2L_OK : ensure_arena(p, name);
  if (arena_status != L2L_OK) {
    p->stats.refused++;
    pthread_mutex_unlock(&p->lock);
    return arena_status;
  }
#endif
  p->stats.current += accounted;
  pthread_mutex_unlock(&p->lock);

  void *ptr = NULL;
  if (device != NULL) {
    l2l_status status = device->alloc(&ptr, accounted);
    if (status != L2L_OK) { /* its message says why */
      pthread_mutex_lock(&p->lock);
      p->stats.current -= accounted;
      p->stats.refused++;
      pthread_mutex_unlock(&p->lock);
      return status;
    }
  } else if (kind == L2L_POOL_PINNED) {
    ptr = pinned_alloc(p, accounted);
  } else {
    ptr = arena_alloc(p, accounted);
  }

  pthread_mutex_lock(&p->lock);
  if (ptr == NULL) {
    p->stats.current -= accounted;
    p->stats.refused++;
    current = p->stats.current;
    pthread_mutex_unlock(&p->lock);
    return core_fail(L2L_ERR_NOMEM,
                     "%s pool: the system refused %llu bytes (%s); %llu bytes (%s) in use", name,
                     (unsigned long long)accounted, core_human_bytes(want, 32, accounted),
                     (unsigned long long)current, core_human_bytes(used, 32, current));
  }
  p->stats.allocs++;
  meter_add(kind, (int64_t)accounted);
  if (measuring_depth > 0) p->measuring += accounted, measured[kind] += accounted;
  uint64_t seen = peak_bytes(p);
  if (seen > p->stats.peak) p->stats.peak = seen;
  if (seen > p->window_peak) p->window_peak = seen;
  pthread_mutex_unlock(&p->lock);
  *out = ptr;
  return L2L_OK;
}

void pool_free(l2l_pool_kind kind, void *ptr, uint64_t bytes) {
  if (ptr == NULL || !pool_valid((int)kind)) return;
  struct pool *p = &pools[kind];
  uint64_t accounted = pool_accounted(bytes);
  const struct device_ops *device = kind == L2L_POOL_DEVICE ? core_device() : NULL;
  bool to_arena = device == NULL && kind != L2L_POOL_PINNED;
  if (device != NULL) device->free(ptr, accounted);
  else if (kind == L2L_POOL_PINNED) pinned_free(p, ptr, accounted);
  else arena_free(ptr);
  meter_add(kind, -(int64_t)accounted);
  pthread_mutex_lock(&p->lock);
  p->stats.current -= accounted;
  p->stats.frees++;
  if (measuring_depth > 0 && measured[kind] >= accounted)
    p->measuring -= accounted, measured[kind] -= accounted;
  if (to_arena && p->arena_ready && (p->freed_unchecked += accounted) >= TRIM_CHECK_BYTES) {
    p->freed_unchecked = 0;
    trim_if_fragmented(p);
  }
  pthread_mutex_unlock(&p->lock);
}

l2l_status l2l_pool_get_stats(l2l_pool_stats *out, l2l_pool_kind kind) {
  if (out == NULL) return FAIL(L2L_ERR_INVALID, "out is NULL");
  if (!pool_valid((int)kind)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", kind);
  pool_of(kind);
  pthread_mutex_lock(&pools[kind].lock);
  *out = pools[kind].stats;
  out->reserved = out->current + arena_cached_bytes(&pools[kind]);
  uint64_t fallback_held = pools[kind].fallback_held;
  pthread_mutex_unlock(&pools[kind].lock);
  out->system_allocs = out->allocs;
  const struct device_ops *device = kind == L2L_POOL_DEVICE ? core_device() : NULL;
  if (device != NULL) {
    device->counts(&out->reserved, &out->system_allocs);
    out->backend = device->own_bytes();
  }
  if (kind == L2L_POOL_PINNED) {
    uint64_t held = 0, made = 0;
    blocks_counts(pinned_cache(), &held, NULL, &made);
    out->reserved = held + fallback_held;
    out->system_allocs = made + out->fallback_allocs;
    out->cap = blocks_cap(pinned_cache());
  }
  return L2L_OK;
}

l2l_status l2l_pool_set_budget(l2l_pool_kind kind, uint64_t bytes) {
  char used[32], limit[32];
  if (!pool_valid((int)kind)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", kind);
  struct pool *p = pool_of(kind);
  uint64_t own = kind == L2L_POOL_DEVICE ? device_own_bytes() : 0;
  pthread_mutex_lock(&p->lock);
  uint64_t current = p->stats.current;
  if (bytes != 0 && bytes < current + own) {
    char backend[96] = "";
    if (own != 0)
      snprintf(backend, sizeof backend, " (with %s the backend keeps for itself)",
               core_human_bytes(used, 32, own));
    pthread_mutex_unlock(&p->lock);
    return FAIL(L2L_ERR_STATE,
                "%s pool: budget %llu bytes (%s) is below the %llu bytes in use%s",
                pool_names[kind], (unsigned long long)bytes, core_human_bytes(limit, 32, bytes),
                (unsigned long long)(current + own), backend);
  }
  p->stats.budget = bytes;
  pthread_mutex_unlock(&p->lock);
  return L2L_OK;
}

void pool_measuring_begin(void) { measuring_depth++; }

void pool_measuring_end(void) {
  if (measuring_depth == 0 || --measuring_depth > 0) return;
  for (int k = 0; k < POOL_COUNT; k++) {
    pthread_mutex_lock(&pools[k].lock);   /* (what is still held is the program's now) */
    pools[k].measuring -= measured[k] < pools[k].measuring ? measured[k] : pools[k].measuring;
    measured[k] = 0;
    pthread_mutex_unlock(&pools[k].lock);
    pool_trim((l2l_pool_kind)k);
  }
}

l2l_status l2l_pool_reset_peak(l2l_pool_kind kind) {
  if (!pool_valid((int)kind)) return FAIL(L2L_ERR_INVALID, "no pool with number %d", kind);
  pthread_mutex_lock(&pools[kind].lock);
  pools[kind].stats.peak = peak_bytes(&pools[kind]);
  pthread_mutex_unlock(&pools[kind].lock);
  return L2L_OK;
}
