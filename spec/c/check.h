/* SPDX-License-Identifier: MIT */
/* check.h — the small harness behind l2l's C tests (spec/c/).
 *
 * Purpose: register tests with TEST(name), check conditions with CHECK (a failed check
 * marks the test failed, prints where and why, and the test goes on), and give tests
 * what every op test needs: fresh random inputs from a generator independent of l2l's
 * own, NaN-poisoned outputs, and float64 comparison helpers. The runner prints
 * "ctest: N passed, M failed, K skipped" as its last line.
 * Random inputs are drawn from a seed taken from the clock (printed at start), or from
 * L2L_SEED to repeat a run; each test's generator is seeded from the run's seed and the
 * test's place in the list, so `L2L_SEED=s l2l_ctest NAME` replays one test alone.
 */
#ifndef L2L_CHECK_H
#define L2L_CHECK_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "l2l.h"

typedef void (*check_test_fn)(void);
void check_register(const char *name, check_test_fn fn);

#define TEST(name)                                                                   \
  static void test_##name(void);                                                     \
  __attribute__((constructor)) static void register_##name(void) {                   \
    check_register(#name, test_##name);                                              \
  }                                                                                  \
  static void test_##name(void)

/* Records a failure (and returns false) when cond is false. */
bool check_that(bool cond, const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define CHECK(cond, ...) check_that((cond), __FILE__, __LINE__, #cond, __VA_ARGS__)
/* CHECK(err <= tol, ...) with the margin recorded (check_margin, below; `what` names the
   comparison there). */
#define CHECK_WITHIN(err, tol, what, ...)                                                   \
  check_that(check_margin(__FILE__, __LINE__, (what), (err), (tol)), __FILE__, __LINE__,    \
             #err " <= " #tol, __VA_ARGS__)
/* An l2l call that must succeed; on failure prints l2l_last_error(). */
#define CHECK_OK(call) \
  check_that((call) == L2L_OK, __FILE__, __LINE__, #call, "failed: %s", l2l_last_error())
/* An l2l call that must fail with `status` and a message containing `needle`. */
#define CHECK_FAILS(call, status, needle) \
  check_fails((call), (status), (needle), __FILE__, __LINE__, #call)
bool check_fails(l2l_status got, l2l_status want, const char *needle, const char *file, int line,
                 const char *expr);

/* A comparison's error against its tolerance: whether err <= tol (a NaN err is not). With
   L2L_TEST_MARGINS=FILE, each call also appends a line to FILE: "file:line <tab> err/tol <tab>
   the running test <tab> what", so that how near each comparison came to its tolerance can be
   seen over many seeds before one fails (`make flakes` lists the nearest). The comparison
   helpers (compare_at, close_at, ...) call it; their messages stay their own. */
bool check_margin(const char *file, int line, const char *what, double err, double tol);

/* Marks the running test skipped, with the reason (printed; counted apart from passes).
   The test should return right after. A test that also failed a check counts as failed. */
void check_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---------------------------------------------------------------- test data */

/* xoshiro256** seeded per test from the run's seed: independent of l2l's Philox. */
uint64_t check_rand_u64(void);
double check_rand_uniform(double lo, double hi);
double check_rand_normal(void);
int64_t check_rand_int(int64_t lo, int64_t hi); /* inclusive */

/* Shapes written inline: check_tensor(pool, dtype, DIMS(2, 3)), or NEW(pool, dtype, 2, 3). */
#define DIMS(...)                                                  \
  (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), \
      (const int64_t[]) { __VA_ARGS__ }
#define NEW(pool, dtype, ...) check_tensor((pool), (dtype), DIMS(__VA_ARGS__))

/* Frees every tensor listed: FREE(a, b, c). */
void check_free_tensors(l2l_tensor *const *ts, size_t n);
#define FREE(...)                                         \
  check_free_tensors((l2l_tensor *const[]){__VA_ARGS__},  \
                     sizeof((l2l_tensor *const[]){__VA_ARGS__}) / sizeof(l2l_tensor *))

/* Zeroed memory; running out ends the run (tests cannot go on without it). */
void *xmalloc(size_t bytes);

/* One of the sizes listed, drawn at random: PICK(1, 7, 33, 257). */
int64_t check_pick(const int64_t *sizes, int count);
#define PICK(...)                                \
  check_pick((const int64_t[]){__VA_ARGS__},     \
             (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

/* New tensors; a failure aborts the test run (tests cannot go on without their inputs). */
l2l_tensor *check_tensor(l2l_pool_kind pool, l2l_dtype dtype, int ndim, const int64_t *shape);
l2l_tensor *check_f32(int ndim, ...);          /* host f32 tensor with the given dims */
l2l_tensor *check_randn(double scale, int ndim, ...); /* host f32, N(0, scale^2) entries */
void check_poison(l2l_tensor *t);              /* every f32 element := NaN */
float *check_data(const l2l_tensor *t);

/* max_i |got_i - want_i| / (|want_i| + floor): a relative error that does not blow up
   near zero. NaN in got gives +inf. */
double check_rel_err(const float *got, const double *want, int64_t n, double floor);
/* ||got - want|| / ||want||, the normwise relative error (want all 0: the error's norm). NaN
   in got gives NaN, which no tolerance passes. */
double check_norm_err(const float *got, const float *want, int64_t n);

/* Temporary directories: a fresh one under $TMPDIR (or /tmp) named from `stem` into dir
   (false, a failed check, when none could be made); the entries in one (-1: unreadable);
   one removed with the files in it. */
bool check_temp_dir(char *dir, size_t len, const char *stem);
int check_dir_entries(const char *dir);
void check_remove_dir(const char *dir);

/* String tests for parameter names and messages. */
bool starts_with(const char *s, const char *prefix);
bool ends_with(const char *s, const char *suffix);

#endif /* L2L_CHECK_H */
