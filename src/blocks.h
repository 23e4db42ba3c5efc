/* blocks.h — a cache of memory blocks by exact size over a system allocator (internal).
 *
 * Purpose: memory whose system allocator is slow (cudaMalloc, cudaHostAlloc) is kept for
 * reuse instead of given back: a training step asks for the same few sizes every step, so
 * after the first one nothing reaches the system. One cache serves the CUDA device pool
 * (backend_cuda.c), another the pinned pool (mem.c). A cap bounds what a cache holds
 * from the system (blocks in use plus cached ones): past it, cached blocks of other sizes
 * are given back first, then the request is refused with L2L_BLOCKS_OVER_CAP and the
 * caller decides what to do (the pinned pool falls back to pageable memory).
 * Must never: call the system allocator for a size it holds a cached block of, or hold
 * more than its cap.
 */
#ifndef L2L_BLOCKS_H
#define L2L_BLOCKS_H

#include <pthread.h>
#include <stdint.h>

/* The system side. alloc returns 0 and a block of at least `size` bytes, or a code of
   its own (e.g. a cudaError_t) that the caller explains; both are called with the
   cache's lock held. */
struct l2l_block_source {
  int (*alloc)(void **out, uint64_t size);
  void (*free)(void *ptr);
};

struct l2l_block_list;

struct l2l_block_cache {
  pthread_mutex_t lock;
  const struct l2l_block_source *source;
  uint64_t cap;                /* reserved stays at or below it; 0: no cap */
  struct l2l_block_list *lists;
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
uint64_t l2l_block_size(uint64_t bytes);
/* A block of l2l_block_size(bytes): a cached one, else one from the system; when the
   system refuses or the cap would be passed, the cache is given back and the system
   asked once more. Returns 0, the source's code, or L2L_BLOCKS_OVER_CAP. */
int l2l_blocks_get(struct l2l_block_cache *c, void **out, uint64_t bytes);
/* Takes back a block from l2l_blocks_get (the same `bytes`) for reuse. */
void l2l_blocks_put(struct l2l_block_cache *c, void *ptr, uint64_t bytes);
/* Gives every cached block back to the system. */
void l2l_blocks_release_cached(struct l2l_block_cache *c);
/* A new cap (0: none); cached blocks go back until reserved fits under it if they can. */
void l2l_blocks_set_cap(struct l2l_block_cache *c, uint64_t cap);
uint64_t l2l_blocks_cap(struct l2l_block_cache *c);
void l2l_blocks_counts(struct l2l_block_cache *c, uint64_t *reserved, uint64_t *cached,
                       uint64_t *system_allocs);

#endif /* L2L_BLOCKS_H */
