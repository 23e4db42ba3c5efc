/* SPDX-License-Identifier: MIT */
/* check.c — the runner and helpers declared in check.h. */
#include "check.h"

#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_TESTS = 512 };
static struct {
  const char *name;
  check_test_fn fn;
} tests[MAX_TESTS];
static int test_count;
static int current_failures;
static char skip_reason[512]; /* non-empty: the current test was skipped */
static uint64_t run_seed;
static const char *running_test = "(none)"; /* its name, for died() and check_margin */
static uint64_t rng_state[4];

void check_register(const char *name, check_test_fn fn) {
  if (test_count == MAX_TESTS) {
    fprintf(stderr, "check: more than %d tests\n", MAX_TESTS);
    exit(2);
  }
  tests[test_count].name = name;
  tests[test_count].fn = fn;
  test_count++;
}

bool check_that(bool cond, const char *file, int line, const char *expr, const char *fmt, ...) {
  if (cond) return true;
  current_failures++;
  fprintf(stderr, "  FAIL %s:%d: %s: ", file, line, expr);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return false;
}

bool check_fails(l2l_status got, l2l_status want, const char *needle, const char *file, int line,
                 const char *expr) {
  const char *msg = l2l_last_error();
  bool ok = got == want && strstr(msg, needle) != NULL;
  return check_that(ok, file, line, expr, "want status %d with \"%s\", got %d: \"%s\"", want,
                    needle, got, msg);
}

void check_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(skip_reason, sizeof skip_reason, fmt, ap);
  va_end(ap);
  if (skip_reason[0] == '\0') snprintf(skip_reason, sizeof skip_reason, "(no reason given)");
}

void check_free_tensors(l2l_tensor *const *ts, size_t n) {
  for (size_t i = 0; i < n; i++) l2l_tensor_free(ts[i]);
}

void *xmalloc(size_t bytes) {
  void *p = calloc(1, bytes ? bytes : 1);
  if (p == NULL) {
    fprintf(stderr, "check: out of memory (%zu bytes)\n", bytes);
    exit(2);
  }
  return p;
}

/* ---------------------------------------------------------------- random inputs */

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void seed_rng(uint64_t seed) {
  for (int i = 0; i < 4; i++) rng_state[i] = splitmix(&seed);
}

uint64_t check_rand_u64(void) {
  uint64_t *s = rng_state;
  uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
  return result;
}

int64_t check_pick(const int64_t *sizes, int count) {
  return sizes[check_rand_int(0, count - 1)];
}

double check_rand_uniform(double lo, double hi) {
  return lo + (hi - lo) * ((double)(check_rand_u64() >> 11) * 0x1p-53);
}

double check_rand_normal(void) {
  double u1 = ((double)(check_rand_u64() >> 11) + 1.0) * 0x1p-53;
  double u2 = (double)(check_rand_u64() >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t check_rand_int(int64_t lo, int64_t hi) {
  return lo + (int64_t)(check_rand_u64() % (uint64_t)(hi - lo + 1));
}

/* ---------------------------------------------------------------- tensors */

l2l_tensor *check_tensor(l2l_pool_kind pool, l2l_dtype dtype, int ndim, const int64_t *shape) {
  l2l_tensor *t = NULL;
  if (l2l_tensor_new(&t, pool, dtype, ndim, shape) != L2L_OK) {
    fprintf(stderr, "check: cannot create a test tensor: %s\n", l2l_last_error());
    exit(2);
  }
  return t;
}

static l2l_tensor *f32_from_dims(int ndim, va_list ap) {
  int64_t shape[L2L_MAX_DIMS];
  for (int i = 0; i < ndim; i++) shape[i] = va_arg(ap, int64_t);
  return check_tensor(L2L_POOL_HOST, L2L_F32, ndim, shape);
}

l2l_tensor *check_f32(int ndim, ...) {
  va_list ap;
  va_start(ap, ndim);
  l2l_tensor *t = f32_from_dims(ndim, ap);
  va_end(ap);
  return t;
}

l2l_tensor *check_randn(double scale, int ndim, ...) {
  va_list ap;
  va_start(ap, ndim);
  l2l_tensor *t = f32_from_dims(ndim, ap);
  va_end(ap);
  float *d = check_data(t);
  for (int64_t i = 0; i < l2l_tensor_numel(t); i++) d[i] = (float)(scale * check_rand_normal());
  return t;
}

void check_poison(l2l_tensor *t) {
  float *d = check_data(t);
  for (int64_t i = 0; i < l2l_tensor_numel(t); i++) d[i] = NAN;
}

float *check_data(const l2l_tensor *t) { return (float *)l2l_tensor_data(t); }

double check_rel_err(const float *got, const double *want, int64_t n, double floor) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(got[i]) && !isnan(want[i])) return INFINITY;
    double err = fabs((double)got[i] - want[i]) / (fabs(want[i]) + floor);
    if (err > worst) worst = err;
  }
  return worst;
}

bool check_margin(const char *file, int line, const char *what, double err, double tol) {
  /* the file L2L_TEST_MARGINS names, opened at the first comparison that sees the name (a
     test may name another for a while: check_margin_records_error_over_tolerance) */
  static FILE *margins;
  static char margins_path[4096];
  const char *path = getenv("L2L_TEST_MARGINS");
  if (path == NULL) path = "";
  if (strcmp(path, margins_path) != 0) {
    if (margins) fclose(margins);
    margins = NULL;
    snprintf(margins_path, sizeof margins_path, "%s", path);
    if (*path && !(margins = fopen(path, "a")))
      fprintf(stderr, "check: L2L_TEST_MARGINS: cannot append to %s\n", path);
  }
  if (margins) { /* one line, flushed: several processes may append to the one file */
    const double ratio = tol > 0.0 ? err / tol : err == 0.0 ? 0.0 : INFINITY;
    fprintf(margins, "%s:%d\t%.4g\t%s\t", file, line, ratio, running_test);
    for (const char *c = what; c && *c; c++) fputc(*c == '\t' || *c == '\n' ? ' ' : *c, margins);
    fputc('\n', margins);
    fflush(margins);
  }
  return err <= tol;
}

/* The margins recorded: error over tolerance, written where L2L_TEST_MARGINS names (and
   nowhere once it names nothing), with the test and what; the verdict err <= tol. */
TEST(check_margin_records_error_over_tolerance) {
  char dir[512], path[600];
  if (!check_temp_dir(dir, sizeof dir, "margins")) return;
  snprintf(path, sizeof path, "%s/m.tsv", dir);
  const char *given = getenv("L2L_TEST_MARGINS");
  char *saved = given ? strdup(given) : NULL;
  const double err = check_rand_uniform(0.1, 1.0), tol = check_rand_uniform(0.1, 1.0);
  setenv("L2L_TEST_MARGINS", path, 1);
  const int line = __LINE__ + 1;
  const bool verdicts[4] = {check_margin("x.c", line, "a\tb", err, tol),
                            check_margin("x.c", line, "nan", NAN, 1.0),
                            check_margin("x.c", line, "exact", 0.0, 0.0),
                            check_margin("x.c", line, "off", 1e-9, 0.0)};
  unsetenv("L2L_TEST_MARGINS");
  check_margin("x.c", line, "not written", 0.5, 1.0);
  if (saved) setenv("L2L_TEST_MARGINS", saved, 1), free(saved);
  CHECK(verdicts[0] == (err <= tol) && !verdicts[1] && verdicts[2] && !verdicts[3],
        "verdicts %d %d %d %d for err %g tol %g", verdicts[0], verdicts[1], verdicts[2],
        verdicts[3], err, tol);
  FILE *f = fopen(path, "r");
  char got[4][256] = {{0}};
  for (int k = 0; f && k < 4; k++)
    if (!fgets(got[k], sizeof got[k], f)) got[k][0] = '\0';
  char extra[64];
  CHECK(f && !fgets(extra, sizeof extra, f), "more than 4 lines in %s", path);
  if (f) fclose(f);
  char want[4][256];
  snprintf(want[0], sizeof want[0], "x.c:%d\t%.4g\t%s\ta b\n", line, err / tol, running_test);
  snprintf(want[1], sizeof want[1], "x.c:%d\tnan\t%s\tnan\n", line, running_test);
  snprintf(want[2], sizeof want[2], "x.c:%d\t0\t%s\texact\n", line, running_test);
  snprintf(want[3], sizeof want[3], "x.c:%d\tinf\t%s\toff\n", line, running_test);
  for (int k = 0; k < 4; k++)
    CHECK(strcmp(got[k], want[k]) == 0, "line %d: got \"%s\", want \"%s\"", k + 1, got[k], want[k]);
  check_remove_dir(dir);
}

double check_norm_err(const float *got, const float *want, int64_t n) {
  double se = 0.0, sw = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double d = (double)got[i] - want[i];
    se += d * d, sw += (double)want[i] * want[i];
  }
  return sw > 0.0 ? sqrt(se / sw) : sqrt(se);
}

bool starts_with(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* ---------------------------------------------------------------- runner */

/* A test that dies (a segfault in a kernel launcher, say) says which it was and where:
   the stdout it buffered dies with it. Only async-signal-safe calls here, and then the
   signal's default action, so the exit status still says what killed it. (Not in a
   sanitizer's build, which installs its own reports for these signals.) */
#ifndef L2L_SANITIZE
static void died(int sig) {
  static const char head[] = "\nctest: the test ";
  (void)!write(STDERR_FILENO, head, sizeof head - 1);
  (void)!write(STDERR_FILENO, running_test, strlen(running_test));
  const char *what = sig == SIGSEGV ? " died of SIGSEGV; stack:\n"
                     : sig == SIGBUS ? " died of SIGBUS; stack:\n"
                     : sig == SIGFPE ? " died of SIGFPE; stack:\n"
                                     : " died of SIGABRT; stack:\n";
  (void)!write(STDERR_FILENO, what, strlen(what));
  void *frames[48];
  backtrace_symbols_fd(frames, backtrace(frames, 48), STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}
#endif

int main(int argc, char **argv) {
  const char *env = getenv("L2L_SEED");
  run_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
  /* arguments: parts of test names; a test runs when its name holds any of them. With
     --exact first, whole names only (scripts/gpu-check.sh runs each GPU test in its own
     process: cuda_backend_attention is part of another test's name). --list prints the
     chosen tests' names and runs none. */
  const char *program = argv[0];
#ifndef L2L_SANITIZE
  const int deadly[] = {SIGSEGV, SIGBUS, SIGFPE, SIGABRT};
  for (size_t k = 0; k < sizeof deadly / sizeof deadly[0]; k++) signal(deadly[k], died);
  void *warm[1];
  backtrace(warm, 1); /* loads libgcc's unwinder now, not inside the handler */
#endif
  bool exact = false, list = false;
  while (argc > 1 && (strcmp(argv[1], "--exact") == 0 || strcmp(argv[1], "--list") == 0)) {
    if (argv[1][2] == 'e') exact = true; else list = true;
    argv++, argc--;
  }
  if (list) {
    for (int i = 0; i < test_count; i++) {
      bool chosen = argc < 2;
      for (int a = 1; a < argc && !chosen; a++) chosen = strstr(tests[i].name, argv[a]) != NULL;
      if (chosen) printf("%s\n", tests[i].name);
    }
    return 0;
  }
  char names[512] = "";
  for (int a = 1; a < argc; a++)
    snprintf(names + strlen(names), sizeof names - strlen(names), " %s", argv[a]);
  printf("ctest: seed %llu (L2L_SEED=%llu %s%s%s replays it)\n", (unsigned long long)run_seed,
         (unsigned long long)run_seed, program, exact ? " --exact" : "", names);
  int passed = 0, failed = 0, skipped = 0;
  for (int i = 0; i < test_count; i++) {
    bool chosen = argc < 2;
    for (int a = 1; a < argc && !chosen; a++)
      chosen = exact ? strcmp(tests[i].name, argv[a]) == 0 : strstr(tests[i].name, argv[a]) != NULL;
    if (!chosen) continue;
    uint64_t test_seed = run_seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
    seed_rng(test_seed);
    current_failures = 0;
    skip_reason[0] = '\0';
    l2l_clear_error();
    running_test = tests[i].name;
    tests[i].fn();
    if (current_failures == 0 && skip_reason[0] != '\0') {
      skipped++;
      printf("  skip %s: %s\n", tests[i].name, skip_reason);
    } else if (current_failures == 0) {
      passed++;
      printf("  ok   %s\n", tests[i].name);
    } else {
      failed++;
      printf("  FAIL %s (%d checks)\n", tests[i].name, current_failures);
    }
    fflush(stdout);
  }
  printf("ctest: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed == 0 && passed > 0 ? 0 : 1;
}

bool check_temp_dir(char *dir, size_t len, const char *stem) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, len, "%s/%s-XXXXXX", tmp && tmp[0] ? tmp : "/tmp", stem);
  return CHECK(mkdtemp(dir) != NULL, "mkdtemp %s failed", dir);
}

int check_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

void check_remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  char path[4200];
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}
