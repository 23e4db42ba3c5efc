/* SPDX-License-Identifier: MIT */
/* misuse.h — the misuse tests' harness (test_api_misuse*.c): pointers that are no handle,
 * the tensors a group of refusals must leave alone (watched, snapshotted by arm(), checked
 * by REFUSES), small tensors and layers for the calls, and a relay with two steps behind
 * it (struct rig); misuse.c defines them.
 *
 * Purpose: one statement of what a refusal must leave as it was, for every file of misuse
 * cases; test_api_misuse.c says what they test.
 * Must never: pass a freed handle, or read a device tensor's bytes unless the device pool
 * is host memory (the CPU backend).
 */
#ifndef L2L_MISUSE_H
#define L2L_MISUSE_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "check.h"
#include "reference.h"

/* ---------------------------------------------------------------- what is no handle */

/* Bytes that are no handle of any kind: no magic number anywhere in them. */
void *junk(void);
#define JUNK(type) ((type *)junk())
/* A handle of one kind passed as another. */
#define AS(type, handle) ((type *)(void *)(handle))

/* Where *out must stay: a refused constructor writes nothing there. */
extern char sentinel_byte;
#define SENTINEL(type) ((type *)(void *)&sentinel_byte)

/* Pool numbers that are no pool. */
static const int bad_pools[] = {-1, 3, 99, INT_MIN, INT_MAX};
enum { BAD_POOLS = sizeof bad_pools / sizeof bad_pools[0] };

/* ---------------------------------------------------------------- what must not change */

/* The most tensors watched at once; the pools (host, pinned, device). */
enum { WATCH_MAX = 160, POOLS = 3 };

/* Whether t's bytes can be read here: host memory, or the device pool on the CPU backend. */
bool host_readable(const l2l_tensor *t);
/* The tensors a group of refusals must leave alone (at most 160), and the pools' bytes in
   use: watched one by one or by WATCH(a, b, ...), each parameter value and gradient of a
   layer by watch_layer; unwatch forgets them (before any of them is freed). */
void watch(const l2l_tensor *t);
void watch_list(const l2l_tensor *const *ts, size_t n);
#define WATCH(...)                                     \
  watch_list((const l2l_tensor *const[]){__VA_ARGS__}, \
             sizeof((const l2l_tensor *const[]){__VA_ARGS__}) / sizeof(const l2l_tensor *))
void watch_layer(const l2l_layer *layer);
void unwatch(void);
/* Takes the snapshot a refusal is compared with, and clears the error message so that the
   refusal's message is its own. */
void arm(void);
/* A refused call: its status, a fresh message containing needle (which starts with the
   function's name where `call` is a call of one: "l2l_relay_insert: ..."), and nothing
   changed. */
bool refused_at(l2l_status got, l2l_status want, const char *needle, const char *file, int line,
                const char *expr);
#define REFUSES(call, status, needle) \
  refused_at((arm(), (call)), (status), (needle), __FILE__, __LINE__, #call)

/* ---------------------------------------------------------------- tensors for the tests */

/* Bytes no op computes: 0xa5 everywhere (an f32 of -2.9e-16, an i32 of -1515870811). */
l2l_tensor *poison(l2l_tensor *t);
/* A new tensor of t's shape in `pool` with `dtype`, all zeros. */
l2l_tensor *remake(const l2l_tensor *t, l2l_pool_kind pool, l2l_dtype dtype);
/* Rows [first, first + count) of t. */
l2l_tensor *view(const l2l_tensor *t, int64_t first, int64_t count);
l2l_tensor *reshaped(const l2l_tensor *t, int ndim, const int64_t *shape);
#define RESHAPED(t, ...) reshaped((t), DIMS(__VA_ARGS__))
/* Host i32 ids in [0, hi). */
l2l_tensor *ids_new(int ndim, const int64_t *shape, int32_t hi);
#define IDS(hi, ...) ids_new(DIMS(__VA_ARGS__), (hi))
/* Host u8 ones. */
l2l_tensor *ones_u8(int ndim, const int64_t *shape);
/* A small block (D 8, 2 heads, F 16, dropout on) in `pool`, for foreign handles and calls. */
l2l_layer_config block_config(void);
l2l_layer *layer_in(const l2l_layer_config *c, l2l_pool_kind pool);
l2l_layer *small_block(void);

/* ---------------------------------------------------------------- a relay */

/* micro-batch 2, two optimizer threads, lr 1e-2, seed 5. */
l2l_relay_config relay_config(void);
l2l_relay_batch batch_of(const struct data *d);
/* Every parameter value and gradient of the model's layers. */
void watch_model(const struct model *m);
/* A relay over a fresh GPT model, with two good steps behind it (optimizer state exists). */
struct rig {
  struct shape g;
  struct model m;
  struct data d;
  l2l_relay *r;
};
bool rig_new(struct rig *rig, const l2l_relay_config *c);
void rig_free(struct rig *rig);

#endif /* L2L_MISUSE_H */
