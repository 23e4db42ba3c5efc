/* SPDX-License-Identifier: MIT */
/* block_cache.c — the block cache of core.h: free lists by exact size over a system
 * allocator, with a cap on what is held from the system.
 *
 * Purpose and rules: see core.h ("the block cache"). The lists are searched linearly: a model asks for a
 * few dozen distinct sizes at most.
 * Must never: lose a block (one that cannot be listed for lack of host memory goes back
 * to the system instead).
 */
#include <stdbool.h>
#include <stdlib.h>

#include "core.h"

struct cached_block {
  void *ptr, *tag;
};

struct block_list {
  uint64_t size;
  struct cached_block *blocks;
  int count, capacity;
};

uint64_t block_size(uint64_t bytes) {
  const uint64_t small = 512, large = 2u << 20;
  uint64_t unit = bytes < (1u << 20) ? small : large;
  return (bytes + unit - 1) / unit * unit;
}

/* The free list for `size`, made if missing and `make` (NULL when out of host memory).
   Called with the lock held. */
static struct block_list *list_for(struct block_cache *c, uint64_t size, bool make) {
  for (int i = 0; i < c->list_count; i++)
    if (c->lists[i].size == size) return &c->lists[i];
  if (!make) return NULL;
  if (c->list_count == c->list_capacity) {
    int capacity = c->list_capacity ? 2 * c->list_capacity : 16;
    struct block_list *grown = realloc(c->lists, (size_t)capacity * sizeof *grown);
    if (grown == NULL) return NULL;
    c->lists = grown, c->list_capacity = capacity;
  }
  struct block_list *list = &c->lists[c->list_count++];
  *list = (struct block_list){.size = size};
  return list;
}

/* Every cached block back to the system. Called with the lock held. */
static void drop_cached(struct block_cache *c) {
  for (int i = 0; i < c->list_count; i++) {
    struct block_list *list = &c->lists[i];
    for (int b = 0; b < list->count; b++) c->source->free(list->blocks[b].ptr, list->blocks[b].tag);
    c->reserved -= (uint64_t)list->count * list->size;
    c->cached -= (uint64_t)list->count * list->size;
    list->count = 0;
  }
}

static bool over_cap(const struct block_cache *c, uint64_t size) {
  return c->cap != 0 && (c->reserved > c->cap || size > c->cap - c->reserved);
}

int blocks_get(struct block_cache *c, void **out, uint64_t bytes, void **tag) {
  uint64_t size = block_size(bytes);
  *tag = NULL;
  pthread_mutex_lock(&c->lock);
  struct block_list *list = list_for(c, size, false);
  if (list != NULL && list->count > 0) {
    struct cached_block b = list->blocks[--list->count];
    *out = b.ptr, *tag = b.tag;
    c->cached -= size;
    pthread_mutex_unlock(&c->lock);
    return 0;
  }
  if (over_cap(c, size)) drop_cached(c);
  if (over_cap(c, size)) {
    pthread_mutex_unlock(&c->lock);
    return L2L_BLOCKS_OVER_CAP;
  }
  void *ptr = NULL;
  int err = c->source->alloc(&ptr, size);
  if (err != 0 && c->cached > 0) {   /* give the cache back and try once more */
    drop_cached(c);
    err = c->source->alloc(&ptr, size);
  }
  if (err == 0) {
    c->reserved += size;
    c->system_allocs++;
    *out = ptr;
  }
  pthread_mutex_unlock(&c->lock);
  return err;
}

void blocks_put(struct block_cache *c, void *ptr, uint64_t bytes, void *tag) {
  if (ptr == NULL) return;
  uint64_t size = block_size(bytes);
  pthread_mutex_lock(&c->lock);
  struct block_list *list = list_for(c, size, true);
  if (list != NULL && list->count == list->capacity) {
    int capacity = list->capacity ? 2 * list->capacity : 8;
    struct cached_block *grown = realloc(list->blocks, (size_t)capacity * sizeof *grown);
    if (grown != NULL) list->blocks = grown, list->capacity = capacity;
  }
  if (list != NULL && list->count < list->capacity) {
    list->blocks[list->count++] = (struct cached_block){ptr, tag};
    c->cached += size;
  } else {   /* no host memory for the list: give the block back instead */
    c->source->free(ptr, tag);
    c->reserved -= size;
  }
  pthread_mutex_unlock(&c->lock);
}

void blocks_release_cached(struct block_cache *c) {
  pthread_mutex_lock(&c->lock);
  drop_cached(c);
  pthread_mutex_unlock(&c->lock);
}

void blocks_set_cap(struct block_cache *c, uint64_t cap) {
  pthread_mutex_lock(&c->lock);
  c->cap = cap;
  if (cap != 0 && c->reserved > cap) drop_cached(c);
  pthread_mutex_unlock(&c->lock);
}

uint64_t blocks_cap(struct block_cache *c) {
  pthread_mutex_lock(&c->lock);
  uint64_t cap = c->cap;
  pthread_mutex_unlock(&c->lock);
  return cap;
}

void blocks_counts(struct block_cache *c, uint64_t *reserved, uint64_t *cached,
                   uint64_t *system_allocs) {
  pthread_mutex_lock(&c->lock);
  if (reserved) *reserved = c->reserved;
  if (cached) *cached = c->cached;
  if (system_allocs) *system_allocs = c->system_allocs;
  pthread_mutex_unlock(&c->lock);
}
