/* SPDX-License-Identifier: MIT */
/* test_api_misuse.c — every public function of src/l2l.h called with what it must refuse.
 *
 * What it tests: each function of the header gets NULL for each pointer; pointers that are
 * no handle (bytes with no magic number, and objects of another kind: a tensor where a
 * layer is wanted, a layer where a relay is, a layer where a tensor is); negative, zero
 * and huge sizes (INT64_MAX, INT64_MIN, shapes whose products overflow int64); enums out
 * of range (dtype 99, pool -1); wrong dtypes (i32 where f32 is needed); mismatched shapes
 * (transposed, off by one); tensors of the other pool domain where one is required; and
 * aliasing. A refusal must return the documented status with a message that names what
 * is wrong, set by this very call (the message is cleared before it), and leave
 * everything as it was: the bytes of every watched tensor (outputs, parameters, gradients
 * and optimizer state), the handles on their storage, `*out`, and the bytes in use in
 * every pool (nothing leaked on the refusal path). Functions that answer a value (the
 * accessors) must answer -1, NULL or 0 for NULL and for pointers that are no handle of
 * their kind; destructors must ignore them. After the refusals of each group a good call
 * still works. The first test reads the header's declarations (lua/l2l/cdef.lua) and
 * fails when one of its functions is never called here, so a new public function without
 * misuse cases fails the suite.
 * Which tests cover which functions is said above each test.
 * All test names start with "misuse_", so `l2l_ctest misuse_` runs just this file.
 * Must never: pass a freed handle (the header does not promise to catch one: its memory
 * is gone); switch the device backend; leave a pool budget, the pinned cap, the thread
 * count or the TF32 setting other than it found them; read a device tensor's bytes unless
 * the device pool is host memory (the CPU backend).
 */
#include <ctype.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "reference.h"

/* ---------------------------------------------------------------- what is no handle */

/* Bytes that are no handle of any kind: no magic number anywhere in them. */
static unsigned char junk_bytes[4096] __attribute__((aligned(64)));
static void *junk(void) {
  memset(junk_bytes, 0x5a, sizeof junk_bytes);
  return junk_bytes;
}
#define JUNK(type) ((type *)junk())
/* A handle of one kind passed as another. */
#define AS(type, handle) ((type *)(void *)(handle))

/* Where *out must stay: a refused constructor writes nothing there. */
static char sentinel_byte;
#define SENTINEL(type) ((type *)(void *)&sentinel_byte)

/* ---------------------------------------------------------------- what must not change */

/* The tensors a group of refusals must leave alone, and the pools' bytes in use. */
enum { WATCH_MAX = 160, POOLS = 3 };
static struct {
  int n;
  const l2l_tensor *t[WATCH_MAX];
  void *snap[WATCH_MAX]; /* NULL: not readable from the host (a GPU's device tensor) */
  int refs[WATCH_MAX];
  uint64_t current[POOLS];
} W;

/* Whether t's bytes can be read here: host memory, or the device pool on the CPU backend. */
static bool host_readable(const l2l_tensor *t) {
  return l2l_tensor_pool(t) != L2L_POOL_DEVICE || strcmp(l2l_device_backend(), "cpu") == 0;
}

static void watch(const l2l_tensor *t) {
  if (t == NULL) return;
  for (int i = 0; i < W.n; i++)
    if (W.t[i] == t) return;
  if (!CHECK(W.n < WATCH_MAX, "more than %d watched tensors", WATCH_MAX)) return;
  W.t[W.n] = t;
  W.snap[W.n] = NULL;
  W.n++;
}

static void watch_list(const l2l_tensor *const *ts, size_t n) {
  for (size_t i = 0; i < n; i++) watch(ts[i]);
}
#define WATCH(...)                                     \
  watch_list((const l2l_tensor *const[]){__VA_ARGS__}, \
             sizeof((const l2l_tensor *const[]){__VA_ARGS__}) / sizeof(const l2l_tensor *))

/* Every parameter value and gradient of a layer. */
static void watch_layer(const l2l_layer *layer) {
  for (int i = 0; i < l2l_layer_param_count(layer); i++) {
    watch(l2l_param_value(l2l_layer_param(layer, i)));
    watch(l2l_param_grad(l2l_layer_param(layer, i)));
  }
}

/* Forgets the watched tensors (before any of them is freed). */
static void unwatch(void) {
  for (int i = 0; i < W.n; i++) free(W.snap[i]);
  W.n = 0;
}

/* Takes the snapshot a refusal is compared with, and clears the error message so that the
   refusal's message is its own. */
static void arm(void) {
  for (int i = 0; i < W.n; i++) {
    free(W.snap[i]);
    W.snap[i] = host_readable(W.t[i]) ? snapshot(W.t[i]) : NULL;
    W.refs[i] = l2l_tensor_storage_refs(W.t[i]);
  }
  for (int p = 0; p < POOLS; p++) W.current[p] = stats_of((l2l_pool_kind)p).current;
  l2l_clear_error();
}

/* A refused call: its status, a fresh message containing needle, and nothing changed. */
static bool refused_at(l2l_status got, l2l_status want, const char *needle, const char *file,
                       int line, const char *expr) {
  bool ok = check_fails(got, want, needle, file, line, expr);
  for (int i = 0; i < W.n; i++) {
    char shape[64] = "?";
    if (W.snap[i] != NULL && !same_bytes(W.t[i], W.snap[i])) {
      int nd = l2l_tensor_ndim(W.t[i]);
      size_t used = 0;
      for (int d = 0; d < nd && used < sizeof shape; d++)
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%lld", d ? "," : "(",
                                 (long long)l2l_tensor_dim(W.t[i], d));
      if (used < sizeof shape) snprintf(shape + used, sizeof shape - used, ")");
      ok &=
          check_that(false, file, line, expr, "watched tensor %d (%s %s) changed by a refused call",
                     i, l2l_dtype_name((l2l_dtype)l2l_tensor_dtype(W.t[i])), shape);
    }
    int refs = l2l_tensor_storage_refs(W.t[i]);
    ok &= check_that(refs == W.refs[i], file, line, expr,
                     "watched tensor %d: %d handles on its storage before, %d after", i, W.refs[i],
                     refs);
  }
  for (int p = 0; p < POOLS; p++) {
    uint64_t now = stats_of((l2l_pool_kind)p).current;
    ok &= check_that(now == W.current[p], file, line, expr,
                     "the %s pool holds %llu bytes, %llu before the refused call (a leak on "
                     "the refusal path?)",
                     l2l_pool_name((l2l_pool_kind)p), (unsigned long long)now,
                     (unsigned long long)W.current[p]);
  }
  return ok;
}
#define REFUSES(call, status, needle) \
  refused_at((arm(), (call)), (status), (needle), __FILE__, __LINE__, #call)

/* ---------------------------------------------------------------- tensors for the tests */

/* Bytes no op computes: 0xa5 everywhere (an f32 of -2.9e-16, an i32 of -1515870811). */
static l2l_tensor *poison(l2l_tensor *t) {
  if (host_readable(t)) memset(l2l_tensor_data(t), 0xa5, tensor_bytes(t));
  return t;
}

/* A new tensor of t's shape in `pool` with `dtype`, all zeros. */
static l2l_tensor *remake(const l2l_tensor *t, l2l_pool_kind pool, l2l_dtype dtype) {
  int64_t shape[L2L_MAX_DIMS];
  int nd = l2l_tensor_ndim(t);
  for (int i = 0; i < nd; i++) shape[i] = l2l_tensor_dim(t, i);
  l2l_tensor *r = check_tensor(pool, dtype, nd, shape);
  CHECK_OK(l2l_tensor_fill(r, 0.0));
  return r;
}

static l2l_tensor *view(const l2l_tensor *t, int64_t first, int64_t count) {
  l2l_tensor *v = NULL;
  CHECK_OK(l2l_tensor_view_rows(&v, t, first, count));
  return v;
}

static l2l_tensor *reshaped(const l2l_tensor *t, int ndim, const int64_t *shape) {
  l2l_tensor *r = NULL;
  CHECK_OK(l2l_tensor_reshape(&r, t, ndim, shape));
  return r;
}
#define RESHAPED(t, ...) reshaped((t), DIMS(__VA_ARGS__))

static l2l_tensor *ids_new(int ndim, const int64_t *shape, int32_t hi) {
  l2l_tensor *t = check_tensor(L2L_POOL_HOST, L2L_I32, ndim, shape);
  return random_ids(t, 0, hi - 1);
}
#define IDS(hi, ...) ids_new(DIMS(__VA_ARGS__), (hi))

static l2l_tensor *ones_u8(int ndim, const int64_t *shape) {
  l2l_tensor *t = check_tensor(L2L_POOL_HOST, L2L_U8, ndim, shape);
  CHECK_OK(l2l_tensor_fill(t, 1.0));
  return t;
}

/* A small block (D 8, 2 heads, F 16, dropout on) in `pool`, for foreign handles and calls. */
static l2l_layer_config block_config(void) {
  l2l_layer_config c = default_layer_config(L2L_LAYER_BLOCK);
  c.dim = 8, c.heads = 2, c.mlp = 16, c.causal = 1, c.dropout = 0.1f, c.attn_dropout = 0.1f;
  return c;
}

static l2l_layer *layer_in(const l2l_layer_config *c, l2l_pool_kind pool) {
  l2l_layer *layer = NULL;
  if (l2l_layer_new(&layer, c, pool) != L2L_OK) {
    fprintf(stderr, "misuse: cannot make a test layer: %s\n", l2l_last_error());
    exit(2);
  }
  return layer;
}

static l2l_layer *small_block(void) {
  l2l_layer_config c = block_config();
  return layer_in(&c, L2L_POOL_HOST);
}

/* ---------------------------------------------------------------- every function covered */

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = xmalloc((size_t)size + 1);
  size_t got = fread(text, 1, (size_t)size, f);
  text[got] = '\0';
  fclose(f);
  return text;
}

/* A file of the repository, found from this file's path as the compiler saw it (relative
   to the repository root, where the suites run, or absolute). */
static char *repo_file(const char *rel) {
  char path[1024];
  const char *me = __FILE__, *cut = strstr(me, "spec/c/");
  int prefix = cut != NULL ? (int)(cut - me) : 0;
  snprintf(path, sizeof path, "%.*s%s", prefix, me, rel);
  return read_text(path);
}

/* C comments blanked out (so that only code counts). */
static void strip_comments(char *s) {
  for (char *p = s; *p; p++) {
    if (p[0] == '/' && p[1] == '*') {
      char *end = strstr(p + 2, "*/");
      char *stop = end ? end + 2 : p + strlen(p);
      memset(p, ' ', (size_t)(stop - p));
      p = stop - 1;
    } else if (p[0] == '/' && p[1] == '/') {
      while (*p && *p != '\n') *p++ = ' ';
      if (!*p) break;
    }
  }
}

static bool ident_char(char c) {
  return isalnum((unsigned char)c) || c == '_';
}

/* Whether `text` calls `name`: the name, not part of a longer identifier, then "(". */
static bool calls(const char *text, const char *name) {
  size_t n = strlen(name);
  for (const char *p = strstr(text, name); p; p = strstr(p + 1, name)) {
    if (p > text && ident_char(p[-1])) continue;
    const char *q = p + n;
    while (*q == ' ' || *q == '\n') q++;
    if (*q == '(' && !ident_char(p[n])) return true;
  }
  return false;
}

/* Covers: that every function declared in src/l2l.h (with its parts) is called in this
   file. Their declarations are read from lua/l2l/cdef.lua, which is the header's FFI
   blocks in order (made by scripts/gen_cdef.lua; ffi_spec fails when it drifts from them). */
TEST(misuse_every_public_function_has_cases) {
  char *header = repo_file("lua/l2l/cdef.lua"), *self = repo_file("spec/c/test_api_misuse.c");
  if (!CHECK(header != NULL && self != NULL,
             "cannot read lua/l2l/cdef.lua or spec/c/test_api_misuse.c from %s (run from the "
             "repository root)",
             __FILE__)) {
    free(header), free(self);
    return;
  }
  /* the declarations: inside the generated file's long string */
  char *b = strstr(header, "[==["), *e = strstr(header, "]==]");
  CHECK(b != NULL && e != NULL && b < e, "no [==[ ... ]==] string in lua/l2l/cdef.lua");
  size_t from = b ? (size_t)(b - header) : 0, to = e ? (size_t)(e - header) : strlen(header);
  strip_comments(header);
  strip_comments(self);
  int functions = 0, missing = 0;
  for (size_t i = from; i < to; i++) {
    if (strncmp(header + i, "l2l_", 4) != 0 || (i > 0 && ident_char(header[i - 1]))) continue;
    size_t n = 0;
    while (ident_char(header[i + n])) n++;
    size_t k = i + n;
    while (header[k] == ' ' || header[k] == '\n') k++;
    if (header[k] != '(') { /* a type, or a function pointer's name */
      i += n;
      continue;
    }
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)n, header + i);
    functions++;
    if (!calls(self, name)) {
      missing++;
      CHECK(false, "%s (declared in src/l2l.h) has no misuse case here", name);
    }
    i += n;
  }
  CHECK(functions >= 100, "found only %d functions in src/l2l.h's FFI blocks", functions);
  printf("  misuse: %d public functions, %d without a case\n", functions, missing);
  free(header);
  free(self);
}

/* ---------------------------------------------------------------- errors, threads, pools */

/* Covers: l2l_last_error, l2l_clear_error, l2l_status_name, l2l_version, l2l_set_threads,
   l2l_get_threads. */
TEST(misuse_errors_threads_and_version) {
  l2l_clear_error();
  CHECK(l2l_last_error() != NULL && l2l_last_error()[0] == '\0', "cleared, the error is \"%s\"",
        l2l_last_error());
  int threads = l2l_get_threads();
  CHECK(threads >= 1, "l2l_get_threads() = %d", threads);
  const int bad[] = {0, -1, -4096, INT_MIN, 4097, INT_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    REFUSES(l2l_set_threads(bad[i]), L2L_ERR_INVALID, "threads");
    CHECK(l2l_get_threads() == threads, "threads %d after refusing %d", l2l_get_threads(), bad[i]);
  }
  /* each refusal writes its own message: the value refused is in it */
  REFUSES(l2l_set_threads(-7), L2L_ERR_INVALID, "-7");
  REFUSES(l2l_set_threads(5000), L2L_ERR_INVALID, "5000");
  CHECK(strstr(l2l_last_error(), "-7") == NULL, "the last message is the last refusal's");
  l2l_clear_error();
  CHECK(l2l_last_error()[0] == '\0', "l2l_clear_error left \"%s\"", l2l_last_error());
  CHECK_OK(l2l_set_threads(threads));
  CHECK(l2l_get_threads() == threads, "threads %d, want %d", l2l_get_threads(), threads);

  /* status names: every status has one; values no status has get a name too, never NULL */
  for (int s = L2L_OK; s <= L2L_ERR_IO; s++) {
    const char *name = l2l_status_name((l2l_status)s);
    CHECK(name != NULL && name[0] != '\0', "status %d has no name", s);
  }
  const int not_status[] = {-1, 8, 99, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof not_status / sizeof not_status[0]; i++) {
    const char *name = l2l_status_name((l2l_status)not_status[i]);
    CHECK(name != NULL && strcmp(name, l2l_status_name(L2L_OK)) != 0, "status %d is named \"%s\"",
          not_status[i], name ? name : "(NULL)");
  }
  CHECK(l2l_version() != NULL && l2l_version()[0] != '\0', "no version");
}

static const int bad_pools[] = {-1, 3, 99, INT_MIN, INT_MAX};
enum { BAD_POOLS = sizeof bad_pools / sizeof bad_pools[0] };

/* Covers: l2l_pool_get_stats, l2l_spill_get_stats, l2l_pool_set_budget, l2l_pool_reset_peak,
   l2l_pinned_set_cap, l2l_pool_name; budget refusals of l2l_tensor_new. */
TEST(misuse_pools) {
  l2l_pool_stats s, poisoned;
  memset(&poisoned, 0xa5, sizeof poisoned);
  REFUSES(l2l_pool_get_stats(NULL, L2L_POOL_HOST), L2L_ERR_INVALID, "out");
  REFUSES(l2l_spill_get_stats(NULL), L2L_ERR_INVALID, "out");
  for (int i = 0; i < BAD_POOLS; i++) {
    s = poisoned;
    REFUSES(l2l_pool_get_stats(&s, (l2l_pool_kind)bad_pools[i]), L2L_ERR_INVALID, "pool");
    CHECK(memcmp(&s, &poisoned, sizeof s) == 0, "pool %d: *out written by a refusal", bad_pools[i]);
    REFUSES(l2l_pool_set_budget((l2l_pool_kind)bad_pools[i], 1 << 20), L2L_ERR_INVALID, "pool");
    REFUSES(l2l_pool_reset_peak((l2l_pool_kind)bad_pools[i]), L2L_ERR_INVALID, "pool");
    CHECK(l2l_pool_name((l2l_pool_kind)bad_pools[i]) == NULL, "pool %d has a name", bad_pools[i]);
  }
  for (int p = 0; p < POOLS; p++)
    CHECK(l2l_pool_name((l2l_pool_kind)p) != NULL, "pool %d has no name", p);

  /* a budget below the bytes in use: refused, the budget as it was */
  l2l_tensor *held = NEW(L2L_POOL_DEVICE, L2L_F32, 1000);
  l2l_pool_stats before = stats_of(L2L_POOL_DEVICE);
  REFUSES(l2l_pool_set_budget(L2L_POOL_DEVICE, before.current - 1), L2L_ERR_STATE, "budget");
  REFUSES(l2l_pool_set_budget(L2L_POOL_DEVICE, 1), L2L_ERR_STATE, "in use");
  CHECK(stats_of(L2L_POOL_DEVICE).budget == before.budget, "budget changed by a refusal");
  /* the largest budget is a budget like any */
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, UINT64_MAX));
  CHECK(stats_of(L2L_POOL_DEVICE).budget == UINT64_MAX, "budget UINT64_MAX not kept");

  /* allocations past a budget: BUDGET naming it, counted as refused, nothing held */
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, before.current + 4096));
  l2l_tensor *out = SENTINEL(l2l_tensor);
  REFUSES(l2l_tensor_new(&out, L2L_POOL_DEVICE, L2L_F32, DIMS(2048)), L2L_ERR_BUDGET, "budget");
  REFUSES(l2l_tensor_new(&out, L2L_POOL_DEVICE, L2L_F32, DIMS(INT64_C(1) << 40)), L2L_ERR_BUDGET,
          "device pool");
  CHECK(out == SENTINEL(l2l_tensor), "*out written by a refused allocation");
  CHECK(stats_of(L2L_POOL_DEVICE).refused == before.refused + 2, "refused allocations not counted");
  CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, before.budget));
  /* the host pool's budget is the machine's memory: 512 TiB is refused at once */
  if (stats_of(L2L_POOL_HOST).budget != 0) {
    REFUSES(l2l_tensor_new(&out, L2L_POOL_HOST, L2L_F32, DIMS(INT64_C(1) << 24, INT64_C(1) << 23)),
            L2L_ERR_BUDGET, "host pool");
    CHECK(out == SENTINEL(l2l_tensor), "*out written by a refused allocation");
  }
  for (int p = 0; p < POOLS; p++) CHECK_OK(l2l_pool_reset_peak((l2l_pool_kind)p));

  /* the pinned cap takes any value (0: none); the default comes back */
  uint64_t cap = stats_of(L2L_POOL_PINNED).cap;
  CHECK_OK(l2l_pinned_set_cap(UINT64_MAX));
  CHECK(stats_of(L2L_POOL_PINNED).cap == UINT64_MAX, "cap UINT64_MAX not kept");
  CHECK_OK(l2l_pinned_set_cap(0));
  CHECK_OK(l2l_pinned_set_cap(cap));
  CHECK(stats_of(L2L_POOL_PINNED).cap == cap, "cap not restored");
  l2l_tensor_free(held);
}

/* Covers: l2l_device_backend, l2l_device_use, l2l_cuda_available, l2l_cuda_get_info,
   l2l_cuda_set_tf32, l2l_device_synchronize, l2l_device_release_cache. */
TEST(misuse_device) {
  const char *backend = l2l_device_backend();
  if (!CHECK(backend != NULL && (strcmp(backend, "cpu") == 0 || strcmp(backend, "cuda") == 0),
             "backend \"%s\"", backend ? backend : "(NULL)"))
    return;
  /* a device tensor is held throughout, so that no call here can switch the backend */
  l2l_tensor *held = NEW(L2L_POOL_DEVICE, L2L_F32, 16);
  CHECK_OK(l2l_tensor_fill(held, 3.0));
  WATCH(held);
  REFUSES(l2l_device_use(NULL), L2L_ERR_INVALID, "backend");
  REFUSES(l2l_device_use(""), L2L_ERR_INVALID, "backend");
  REFUSES(l2l_device_use("gpu"), L2L_ERR_INVALID, "\"gpu\"");
  REFUSES(l2l_device_use("CPU"), L2L_ERR_INVALID, "backend");
  REFUSES(l2l_device_use("cpu "), L2L_ERR_INVALID, "backend");
  char *longname = xmalloc(4000);
  memset(longname, 'x', 3999);
  REFUSES(l2l_device_use(longname), L2L_ERR_INVALID, "backend");
  free(longname);
  int avail = l2l_cuda_available(NULL, 0);
  CHECK(avail == 0 || avail == 1, "l2l_cuda_available = %d", avail);
  const char *other = strcmp(backend, "cpu") == 0 ? "cuda" : "cpu";
  if (strcmp(other, "cuda") == 0 && !avail)
    REFUSES(l2l_device_use(other), L2L_ERR_UNSUPPORTED, "CUDA");
  else
    REFUSES(l2l_device_use(other), L2L_ERR_STATE, "device pool holds");
  CHECK(strcmp(l2l_device_backend(), backend) == 0, "the backend changed to %s",
        l2l_device_backend());
  CHECK_OK(l2l_device_use(backend)); /* the backend in use: nothing to switch */

  /* the reason goes into why[0..len) only */
  char why[64];
  memset(why, 'x', sizeof why);
  CHECK(l2l_cuda_available(NULL, 100) == avail, "NULL why with a length");
  CHECK(l2l_cuda_available(why, 0) == avail, "len 0");
  bool untouched = true;
  for (size_t i = 0; i < sizeof why; i++) untouched &= why[i] == 'x';
  CHECK(untouched, "len 0: why written");
  CHECK(l2l_cuda_available(why, 8) == avail, "len 8");
  untouched = true;
  for (size_t i = 8; i < sizeof why; i++) untouched &= why[i] == 'x';
  CHECK(untouched, "len 8: why written past 8 bytes");
  if (!avail) CHECK(memchr(why, '\0', 8) != NULL, "len 8: the reason is not terminated");

  REFUSES(l2l_cuda_get_info(NULL), L2L_ERR_INVALID, "out");
  l2l_cuda_info info, poisoned;
  memset(&poisoned, 0xa5, sizeof poisoned);
  info = poisoned;
  if (!avail) {
    REFUSES(l2l_cuda_get_info(&info), L2L_ERR_UNSUPPORTED, "CUDA");
    CHECK(memcmp(&info, &poisoned, sizeof info) == 0, "*out written by a refusal");
  } else {
    CHECK_OK(l2l_cuda_get_info(&info));
  }
  const int bad_flags[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_flags / sizeof bad_flags[0]; i++)
    REFUSES(l2l_cuda_set_tf32(bad_flags[i]), L2L_ERR_INVALID, "enable");
  CHECK_OK(l2l_cuda_set_tf32(0));
  CHECK_OK(l2l_device_synchronize());
  uint64_t current = stats_of(L2L_POOL_DEVICE).current;
  CHECK_OK(l2l_device_release_cache());
  CHECK(stats_of(L2L_POOL_DEVICE).current == current, "release_cache changed the bytes in use");
  double sum = 0;
  CHECK_OK(l2l_sum(&sum, held));
  CHECK(sum == 48.0, "a held device tensor changed across release_cache: sum %g", sum);
  unwatch();
  l2l_tensor_free(held);
}

/* Covers: l2l_profile_start, l2l_profile_stop, l2l_profile_get_summary, l2l_profile_rows,
   l2l_profile_write, l2l_profile_table. */
TEST(misuse_profile) {
  REFUSES(l2l_profile_start(-1), L2L_ERR_INVALID, "skip_steps");
  REFUSES(l2l_profile_start(INT_MIN), L2L_ERR_INVALID, "skip_steps");
  if (!CHECK_OK(l2l_profile_start(0))) return;
  REFUSES(l2l_profile_start(0), L2L_ERR_STATE, "running");
  CHECK_OK(l2l_profile_stop());
  CHECK_OK(l2l_profile_stop());   /* stopping a stopped profile changes nothing */
  REFUSES(l2l_profile_get_summary(NULL), L2L_ERR_INVALID, "out");
  l2l_profile_summary sum;
  if (!CHECK_OK(l2l_profile_get_summary(&sum))) return;
  CHECK(sum.steps == 0 && sum.rows == 0, "no step ran, yet %lld steps and %lld rows",
        (long long)sum.steps, (long long)sum.rows);
  l2l_profile_row row, poisoned;
  memset(&poisoned, 0xa5, sizeof poisoned);
  row = poisoned;
  REFUSES(l2l_profile_rows(NULL, 0, 1), L2L_ERR_INVALID, "out");
  REFUSES(l2l_profile_rows(&row, -1, 1), L2L_ERR_INVALID, "rows");
  REFUSES(l2l_profile_rows(&row, 0, -1), L2L_ERR_INVALID, "rows");
  REFUSES(l2l_profile_rows(&row, 0, 1), L2L_ERR_INVALID, "rows");
  REFUSES(l2l_profile_rows(&row, INT64_MAX, INT64_MAX), L2L_ERR_INVALID, "rows");
  CHECK(memcmp(&row, &poisoned, sizeof row) == 0, "a refusal wrote *out");
  CHECK_OK(l2l_profile_rows(NULL, 0, 0));
  REFUSES(l2l_profile_write(NULL, 0), L2L_ERR_INVALID, "path");
  REFUSES(l2l_profile_write("", 1), L2L_ERR_INVALID, "path");
  REFUSES(l2l_profile_write("/nonexistent-dir-of-l2l/p.tsv", 1), L2L_ERR_IO, "nonexistent");
  char path[] = "/tmp/l2l-misuse-profile-XXXXXX";
  int fd = mkstemp(path);
  if (CHECK(fd >= 0, "mkstemp")) {
    static const char mine[] = "a user's file";
    CHECK(write(fd, mine, sizeof mine - 1) == (ssize_t)(sizeof mine - 1), "write");
    close(fd);
    REFUSES(l2l_profile_write(path, 0), L2L_ERR_IO, "overwrite");
    FILE *f = fopen(path, "r");
    char back[64] = {0};
    CHECK(f != NULL && fread(back, 1, sizeof back - 1, f) == sizeof mine - 1 &&
              strcmp(back, mine) == 0, "a refused write changed the file: '%s'", back);
    if (f) fclose(f);
    CHECK_OK(l2l_profile_write(path, 1));
    unlink(path);
  }
  char table[4096];
  REFUSES(l2l_profile_table(NULL, 100, 100), L2L_ERR_INVALID, "out");
  REFUSES(l2l_profile_table(table, 0, 100), L2L_ERR_INVALID, "size");
  REFUSES(l2l_profile_table(table, sizeof table, 79), L2L_ERR_INVALID, "width");
  REFUSES(l2l_profile_table(table, sizeof table, 1001), L2L_ERR_INVALID, "width");
  REFUSES(l2l_profile_table(table, sizeof table, INT_MIN), L2L_ERR_INVALID, "width");
  memset(table, 'x', sizeof table);
  CHECK_OK(l2l_profile_table(table, 16, 80));   /* cut short, and ended */
  CHECK(memchr(table, '\0', 16) != NULL && table[16] == 'x', "a 16-byte table is not ended "
        "within its 16 bytes");
}

/* ---------------------------------------------------------------- tensors */

/* Covers: l2l_tensor_new, l2l_tensor_view_rows, l2l_tensor_reshape. */
TEST(misuse_tensor_new_views_and_reshapes) {
  l2l_tensor *out = SENTINEL(l2l_tensor);
  const int64_t good[2] = {2, 3};
  REFUSES(l2l_tensor_new(NULL, L2L_POOL_HOST, L2L_F32, 2, good), L2L_ERR_INVALID, "out");
  for (int i = 0; i < BAD_POOLS; i++)
    REFUSES(l2l_tensor_new(&out, (l2l_pool_kind)bad_pools[i], L2L_F32, 2, good), L2L_ERR_INVALID,
            "pool");
  const int bad_dtypes[] = {-1, 5, 99, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_dtypes / sizeof bad_dtypes[0]; i++)
    REFUSES(l2l_tensor_new(&out, L2L_POOL_HOST, (l2l_dtype)bad_dtypes[i], 2, good), L2L_ERR_INVALID,
            "dtype");
  const int bad_ndims[] = {0, -1, 5, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_ndims / sizeof bad_ndims[0]; i++)
    REFUSES(l2l_tensor_new(&out, L2L_POOL_HOST, L2L_F32, bad_ndims[i], good), L2L_ERR_INVALID,
            "ndim");
  REFUSES(l2l_tensor_new(&out, L2L_POOL_HOST, L2L_F32, 2, NULL), L2L_ERR_INVALID, "shape");
  const int64_t big = INT64_C(1) << 32, mid = INT64_C(1) << 21;
  const struct {
    int ndim;
    int64_t shape[4];
    const char *needle;
  } bad[] = {
      {1, {0}, "dim 0"},
      {2, {3, -1}, "dim 1"},
      {1, {INT64_MIN}, "dim 0"},
      {4, {1, 1, 1, 0}, "dim 3"},
      {3, {2, INT64_MIN, 2}, "dim 1"},
      {1, {INT64_MAX}, "2^48"},
      {2, {big, big}, "2^48"}, /* 2^64: overflows int64 */
      {2, {INT64_MAX, 2}, "2^48"},
      {2, {2, INT64_MAX}, "2^48"},
      {3, {mid, mid, mid}, "2^48"}, /* 2^63 */
      {4, {1 << 16, 1 << 16, 1 << 16, 1 << 16}, "2^48"},
      {4, {INT64_C(1) << 40, 1, 1, 1 << 9}, "2^48"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    REFUSES(l2l_tensor_new(&out, L2L_POOL_HOST, L2L_F32, bad[i].ndim, bad[i].shape),
            L2L_ERR_INVALID, bad[i].needle);
  CHECK(out == SENTINEL(l2l_tensor), "*out written by a refused l2l_tensor_new");

  l2l_layer *layer = small_block();
  l2l_tensor *t = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 3));
  WATCH(t);
  const l2l_tensor *not_tensors[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, layer),
                                     AS(l2l_tensor, l2l_layer_param(layer, 0))};
  REFUSES(l2l_tensor_view_rows(NULL, t, 0, 1), L2L_ERR_INVALID, "out");
  REFUSES(l2l_tensor_reshape(NULL, t, 2, good), L2L_ERR_INVALID, "out");
  for (size_t i = 0; i < sizeof not_tensors / sizeof not_tensors[0]; i++) {
    REFUSES(l2l_tensor_view_rows(&out, not_tensors[i], 0, 1), L2L_ERR_INVALID, "t is");
    REFUSES(l2l_tensor_reshape(&out, not_tensors[i], 2, good), L2L_ERR_INVALID, "t is");
  }
  const int64_t rows[][2] = {{-1, 1},
                             {INT64_MIN, 1},
                             {0, 0},
                             {0, -1},
                             {0, INT64_MIN},
                             {0, 5},
                             {4, 1},
                             {3, 2},
                             {1, INT64_MAX},
                             {INT64_MAX, 1},
                             {INT64_MAX, INT64_MAX},
                             {INT64_MIN, INT64_MAX},
                             {2, INT64_MIN}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    REFUSES(l2l_tensor_view_rows(&out, t, rows[i][0], rows[i][1]), L2L_ERR_INVALID, "dim 0");
  for (size_t i = 0; i < sizeof bad_ndims / sizeof bad_ndims[0]; i++)
    REFUSES(l2l_tensor_reshape(&out, t, bad_ndims[i], good), L2L_ERR_INVALID, "ndim");
  REFUSES(l2l_tensor_reshape(&out, t, 2, NULL), L2L_ERR_INVALID, "shape");
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    REFUSES(l2l_tensor_reshape(&out, t, bad[i].ndim, bad[i].shape), L2L_ERR_INVALID, bad[i].needle);
  REFUSES(l2l_tensor_reshape(&out, t, DIMS(13)), L2L_ERR_INVALID, "12 elements");
  REFUSES(l2l_tensor_reshape(&out, t, DIMS(11)), L2L_ERR_INVALID, "12 elements");
  REFUSES(l2l_tensor_reshape(&out, t, DIMS(3, 5)), L2L_ERR_INVALID, "12 elements");
  REFUSES(l2l_tensor_reshape(&out, t, DIMS(4, 3, 2)), L2L_ERR_INVALID, "12 elements");
  CHECK(out == SENTINEL(l2l_tensor), "*out written by a refused view or reshape");
  /* good calls afterwards: a view of the last row, the transposed shape */
  CHECK_OK(l2l_tensor_view_rows(&out, t, 3, 1));
  CHECK(l2l_tensor_data(out) == (float *)l2l_tensor_data(t) + 9, "the view after refusals");
  l2l_tensor_free(out);
  CHECK_OK(l2l_tensor_reshape(&out, t, DIMS(3, 4)));
  l2l_tensor_free(out);
  unwatch();
  l2l_tensor_free(t);
  l2l_layer_free(layer);
}

/* Covers: l2l_tensor_ndim, l2l_tensor_dim, l2l_tensor_numel, l2l_tensor_dtype,
   l2l_tensor_pool, l2l_tensor_data, l2l_tensor_offset, l2l_tensor_storage_refs,
   l2l_tensor_free, l2l_dtype_size, l2l_dtype_name. */
TEST(misuse_tensor_accessors_and_free) {
  l2l_layer *layer = small_block();
  unsigned char stack_bytes[256];
  memset(stack_bytes, 0, sizeof stack_bytes);
  const l2l_tensor *nots[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, layer),
                              AS(l2l_tensor, l2l_layer_param(layer, 0)),
                              AS(l2l_tensor, stack_bytes)};
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    const l2l_tensor *n = nots[i];
    CHECK(l2l_tensor_ndim(n) == -1 && l2l_tensor_dim(n, 0) == -1 && l2l_tensor_numel(n) == -1 &&
              l2l_tensor_dtype(n) == -1 && l2l_tensor_pool(n) == -1 && l2l_tensor_data(n) == NULL &&
              l2l_tensor_offset(n) == -1 && l2l_tensor_storage_refs(n) == -1,
          "case %zu: an accessor answered for what is no tensor", i);
  }
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 2, 3);
  const int axes[] = {-1, 2, 4, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof axes / sizeof axes[0]; i++)
    CHECK(l2l_tensor_dim(t, axes[i]) == -1, "dim(t, %d) = %lld", axes[i],
          (long long)l2l_tensor_dim(t, axes[i]));
  /* destructors ignore what is no tensor: the layer and its records live on */
  uint64_t host = stats_of(L2L_POOL_HOST).current;
  l2l_tensor_free(NULL);
  l2l_tensor_free(JUNK(l2l_tensor));
  l2l_tensor_free(AS(l2l_tensor, layer));
  l2l_tensor_free(AS(l2l_tensor, l2l_layer_param(layer, 0)));
  l2l_tensor_free(AS(l2l_tensor, stack_bytes));
  CHECK(stats_of(L2L_POOL_HOST).current == host, "l2l_tensor_free freed something");
  CHECK(l2l_layer_param_count(layer) > 0 && l2l_param_name(l2l_layer_param(layer, 0)) != NULL,
        "the layer was hurt by l2l_tensor_free");
  CHECK_OK(l2l_layer_zero_grad(layer));
  const int bad_dtypes[] = {-1, 5, 99, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_dtypes / sizeof bad_dtypes[0]; i++)
    CHECK(l2l_dtype_size((l2l_dtype)bad_dtypes[i]) == 0 &&
              l2l_dtype_name((l2l_dtype)bad_dtypes[i]) == NULL,
          "dtype %d has a size or a name", bad_dtypes[i]);
  for (int d = L2L_F32; d <= L2L_U8; d++)
    CHECK(l2l_dtype_size((l2l_dtype)d) > 0 && l2l_dtype_name((l2l_dtype)d) != NULL,
          "dtype %d has no size or name", d);
  l2l_tensor_free(t);
  l2l_layer_free(layer);
}

/* Covers: l2l_tensor_copy, l2l_tensor_cast, l2l_tensor_fill. */
TEST(misuse_tensor_copy_cast_and_fill) {
  l2l_layer *layer = small_block();
  l2l_tensor *dst = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5)), *src = check_randn(1.0, 2, 4, 5);
  l2l_tensor *idst = poison(NEW(L2L_POOL_HOST, L2L_I32, 4, 5));
  l2l_tensor *big = poison(NEW(L2L_POOL_HOST, L2L_F32, 6, 5));
  l2l_tensor *lo = view(big, 0, 4), *hi = view(big, 2, 4);
  WATCH(dst, src, idst, big);
  const l2l_tensor *nots[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, layer)};
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    REFUSES(l2l_tensor_copy((l2l_tensor *)nots[i], src), L2L_ERR_INVALID, "dst is");
    REFUSES(l2l_tensor_copy(dst, nots[i]), L2L_ERR_INVALID, "src is");
    REFUSES(l2l_tensor_cast((l2l_tensor *)nots[i], src), L2L_ERR_INVALID, "dst is");
    REFUSES(l2l_tensor_cast(dst, nots[i]), L2L_ERR_INVALID, "src is");
    REFUSES(l2l_tensor_fill((l2l_tensor *)nots[i], 1.0), L2L_ERR_INVALID, "t is");
  }
  /* copy: same dtype and element count; no partial overlap */
  l2l_tensor *isrc = remake(src, L2L_POOL_HOST, L2L_I32), *longer = NEW(L2L_POOL_HOST, L2L_F32, 21);
  l2l_tensor *shorter = NEW(L2L_POOL_HOST, L2L_F32, 4, 4), *u8 = remake(src, L2L_POOL_HOST, L2L_U8);
  l2l_tensor *dev = remake(src, L2L_POOL_DEVICE, L2L_F32);
  REFUSES(l2l_tensor_copy(dst, isrc), L2L_ERR_INVALID, "src is i32");
  REFUSES(l2l_tensor_copy(idst, src), L2L_ERR_INVALID, "dst is i32");
  REFUSES(l2l_tensor_copy(dst, longer), L2L_ERR_INVALID, "elements");
  REFUSES(l2l_tensor_copy(dst, shorter), L2L_ERR_INVALID, "elements");
  REFUSES(l2l_tensor_copy(lo, hi), L2L_ERR_INVALID, "overlap");
  REFUSES(l2l_tensor_copy(hi, lo), L2L_ERR_INVALID, "overlap");
  /* cast: among f32, f16, bf16, i32; one backend; integers within int32 for i32 */
  REFUSES(l2l_tensor_cast(u8, src), L2L_ERR_INVALID, "u8");
  REFUSES(l2l_tensor_cast(dst, u8), L2L_ERR_INVALID, "u8");
  REFUSES(l2l_tensor_cast(dst, longer), L2L_ERR_INVALID, "elements");
  REFUSES(l2l_tensor_cast(dev, src), L2L_ERR_INVALID, "pool");
  REFUSES(l2l_tensor_cast(dst, dev), L2L_ERR_INVALID, "pool");
  REFUSES(l2l_tensor_cast(lo, hi), L2L_ERR_INVALID, "overlap");
  float *s = check_data(src);
  for (int i = 0; i < 20; i++) s[i] = (float)(i - 10);
  const float not_int32[] = {2.5f,           NAN,    INFINITY, -INFINITY, 2147483648.0f,
                             -2147483904.0f, 1e-30f, -0.5f};
  for (size_t k = 0; k < sizeof not_int32 / sizeof not_int32[0]; k++) {
    s[19] = not_int32[k];
    REFUSES(l2l_tensor_cast(idst, src), L2L_ERR_INVALID, "element 19");
    float rounded = l2l_bf16_to_f32(l2l_f32_to_bf16(not_int32[k]));
    if (rounded == floorf(rounded) && rounded >= -2147483648.0f && rounded < 2147483648.0f)
      continue; /* -2^31 - 256 rounds to -2^31 in bf16: an int32 */
    l2l_tensor *half = remake(src, L2L_POOL_HOST, L2L_BF16);
    CHECK_OK(l2l_tensor_cast(half, src));
    REFUSES(l2l_tensor_cast(idst, half), L2L_ERR_INVALID, "element 19");
    l2l_tensor_free(half);
  }
  /* fill: integer dtypes take integers within their range */
  const double not_i32[] = {0.5, NAN, INFINITY, -INFINITY, 2147483648.0, -2147483649.0, 1e300};
  for (size_t k = 0; k < sizeof not_i32 / sizeof not_i32[0]; k++)
    REFUSES(l2l_tensor_fill(idst, not_i32[k]), L2L_ERR_INVALID, "int32");
  WATCH(u8);
  poison(u8);
  const double not_u8[] = {256, -1, 0.5, NAN, INFINITY, -1e300};
  for (size_t k = 0; k < sizeof not_u8 / sizeof not_u8[0]; k++)
    REFUSES(l2l_tensor_fill(u8, not_u8[k]), L2L_ERR_INVALID, "u8");
  /* good calls afterwards */
  s[19] = 9.0f;
  CHECK_OK(l2l_tensor_cast(idst, src));
  CHECK(((int32_t *)l2l_tensor_data(idst))[19] == 9, "cast after refusals");
  CHECK_OK(l2l_tensor_copy(dst, src));
  CHECK_OK(l2l_tensor_fill(u8, 255));
  CHECK_OK(l2l_tensor_copy(dev, src)); /* a transfer between pools is a copy's job */
  unwatch();
  FREE(dst, src, idst, big, lo, hi, isrc, longer, shorter, u8, dev);
  l2l_layer_free(layer);
}

/* Covers: l2l_philox4x32, l2l_tensor_uniform, l2l_tensor_normal, l2l_f32_to_bf16,
   l2l_bf16_to_f32, l2l_f32_to_f16, l2l_f16_to_f32. Found here: uniform bounds beyond the
   dtype's finite range were accepted, and about half the draws came out -inf, outside
   [lo, hi). */
TEST(misuse_random_fills_and_scalars) {
  uint32_t out4[4] = {1, 2, 3, 4}, counter[4] = {0}, key[2] = {0};
  REFUSES(l2l_philox4x32(NULL, counter, key), L2L_ERR_INVALID, "out4");
  REFUSES(l2l_philox4x32(out4, NULL, key), L2L_ERR_INVALID, "counter4");
  REFUSES(l2l_philox4x32(out4, counter, NULL), L2L_ERR_INVALID, "key2");
  CHECK(out4[0] == 1 && out4[1] == 2 && out4[2] == 3 && out4[3] == 4, "out4 written by a refusal");
  CHECK_OK(l2l_philox4x32(out4, counter, key));

  l2l_layer *layer = small_block();
  l2l_tensor *t = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5));
  l2l_tensor *i32 = poison(NEW(L2L_POOL_HOST, L2L_I32, 4, 5)),
             *u8 = poison(NEW(L2L_POOL_HOST, L2L_U8, 7));
  WATCH(t, i32, u8);
  const l2l_tensor *nots[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, layer)};
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    REFUSES(l2l_tensor_uniform((l2l_tensor *)nots[i], 1, 2, 0, 0, 1), L2L_ERR_INVALID, "t is");
    REFUSES(l2l_tensor_normal((l2l_tensor *)nots[i], 1, 2, 0, 0, 1), L2L_ERR_INVALID, "t is");
  }
  REFUSES(l2l_tensor_uniform(i32, 1, 2, 0, 0, 1), L2L_ERR_INVALID, "i32");
  REFUSES(l2l_tensor_normal(u8, 1, 2, 0, 0, 1), L2L_ERR_INVALID, "u8");
  const int64_t bad_first[] = {-1, INT64_MIN, -20};
  for (size_t i = 0; i < sizeof bad_first / sizeof bad_first[0]; i++) {
    REFUSES(l2l_tensor_uniform(t, 1, 2, bad_first[i], 0, 1), L2L_ERR_INVALID, "first");
    REFUSES(l2l_tensor_normal(t, 1, 2, bad_first[i], 0, 1), L2L_ERR_INVALID, "first");
  }
  const double bounds[][2] = {{1, 0},        {NAN, 1},       {0, NAN},
                              {0, INFINITY}, {-INFINITY, 0}, {DBL_MAX, -DBL_MAX}};
  for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
    REFUSES(l2l_tensor_uniform(t, 1, 2, 0, bounds[i][0], bounds[i][1]), L2L_ERR_INVALID, "lo");
  /* bounds beyond the dtype's finite values (draws there rounded to -inf: outside [lo, hi)) */
  l2l_tensor *h16 = poison(NEW(L2L_POOL_HOST, L2L_F16, 64)),
             *b16 = poison(NEW(L2L_POOL_HOST, L2L_BF16, 64));
  WATCH(h16, b16);
  REFUSES(l2l_tensor_uniform(h16, 1, 2, 0, -1e6, 1e6), L2L_ERR_INVALID, "f16's finite range");
  REFUSES(l2l_tensor_uniform(h16, 1, 2, 0, 0, 65536), L2L_ERR_INVALID, "f16's finite range");
  REFUSES(l2l_tensor_uniform(b16, 1, 2, 0, -1e39, 0), L2L_ERR_INVALID, "bf16's finite range");
  REFUSES(l2l_tensor_uniform(t, 1, 2, 0, -1e39, 1e39), L2L_ERR_INVALID, "f32's finite range");
  REFUSES(l2l_tensor_uniform(t, 1, 2, 0, -DBL_MAX, 0), L2L_ERR_INVALID, "f32's finite range");
  CHECK_OK(l2l_tensor_uniform(h16, 1, 2, 0, -65504, 65504));
  bool finite16 = true;
  for (int i = 0; i < 64; i++)
    finite16 &= isfinite(l2l_f16_to_f32(((uint16_t *)l2l_tensor_data(h16))[i]));
  CHECK(finite16, "f16 draws within +-65504 are not all finite");
  const double moments[][2] = {{0, -1},       {NAN, 1},      {0, NAN},
                               {INFINITY, 1}, {0, INFINITY}, {0, -DBL_MIN}};
  for (size_t i = 0; i < sizeof moments / sizeof moments[0]; i++)
    REFUSES(l2l_tensor_normal(t, 1, 2, 0, moments[i][0], moments[i][1]), L2L_ERR_INVALID, "std");
  /* the last draws before first + i leaves int64: good calls, finite values */
  CHECK_OK(l2l_tensor_uniform(t, UINT64_MAX, UINT64_MAX, INT64_MAX - 20, -1, 1));
  bool in_range = true;
  for (int i = 0; i < 20; i++) in_range &= check_data(t)[i] >= -1 && check_data(t)[i] < 1;
  CHECK(in_range, "uniform draws near the end of the index range left [-1, 1)");
  CHECK_OK(l2l_tensor_normal(t, UINT64_MAX, 0, INT64_MAX - 20, 0, 1));
  bool finite = true;
  for (int i = 0; i < 20; i++) finite &= isfinite(check_data(t)[i]);
  CHECK(finite, "normal draws near the end of the index range are not finite");
  unwatch();
  FREE(t, i32, u8, h16, b16);
  l2l_layer_free(layer);

  /* scalar conversions: NaN stays NaN, overflow gives inf */
  uint16_t h = l2l_f32_to_f16(NAN);
  CHECK((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0, "f16(NaN) = 0x%04x", h);
  CHECK(l2l_f32_to_f16(1e10f) == 0x7c00 && l2l_f32_to_f16(-FLT_MAX) == 0xfc00,
        "f16 of huge values is not inf");
  CHECK(l2l_f32_to_f16(INFINITY) == 0x7c00, "f16(inf)");
  h = l2l_f32_to_bf16(NAN);
  CHECK((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0, "bf16(NaN) = 0x%04x", h);
  CHECK(l2l_f32_to_bf16(FLT_MAX) == 0x7f80 && l2l_f32_to_bf16(-FLT_MAX) == 0xff80,
        "bf16(FLT_MAX) = 0x%04x, want inf", l2l_f32_to_bf16(FLT_MAX));
  CHECK(isnan(l2l_bf16_to_f32(0x7fc1)) && isnan(l2l_bf16_to_f32(0xffff)) &&
            isinf(l2l_bf16_to_f32(0xff80)),
        "bf16 NaN or inf widened wrong");
  CHECK(isnan(l2l_f16_to_f32(0x7e00)) && isnan(l2l_f16_to_f32(0xfc01)) &&
            isinf(l2l_f16_to_f32(0x7c00)) && l2l_f16_to_f32(0xffff) != l2l_f16_to_f32(0xffff),
        "f16 NaN or inf widened wrong");
}

/* ---------------------------------------------------------------- ops */

typedef l2l_status (*op_fn)(l2l_tensor *const *t);
struct slot {
  const char *name; /* as the op's messages name the argument */
  bool optional;    /* NULL is allowed */
};

/* Every tensor argument of an op in turn replaced by NULL (unless optional), bytes that
   are no handle, a layer, a parameter record, a tensor of its shape with the wrong dtype
   (i32 for a float, f32 for ids and masks) and one in the device pool (the others being in
   the host pool): each refused naming the argument (or the device pool), nothing changed.
   Then the good arguments t[] still work. */
static void sweep_at(const char *op, op_fn fn, l2l_tensor **t, const struct slot *s, int n,
                     const char *file, int line) {
  l2l_layer *layer = small_block();
  for (int i = 0; i < n; i++) watch(t[i]);
  for (int i = 0; i < n; i++) {
    l2l_tensor *good = t[i];
    l2l_dtype dtype = (l2l_dtype)l2l_tensor_dtype(good);
    l2l_tensor *wrong = remake(good, L2L_POOL_HOST, dtype == L2L_F32 ? L2L_I32 : L2L_F32);
    l2l_tensor *dev = n > 1 ? remake(good, L2L_POOL_DEVICE, dtype) : NULL;
    char named[64];
    snprintf(named, sizeof named, ": %s is ", s[i].name);
    const struct {
      l2l_tensor *t;
      const char *what, *needle;
    } cases[] = {
        {NULL, "NULL", named},
        {JUNK(l2l_tensor), "bytes that are no handle", named},
        {AS(l2l_tensor, layer), "a layer", named},
        {AS(l2l_tensor, l2l_layer_param(layer, 0)), "a parameter record", named},
        {wrong, "a tensor of the wrong dtype", named},
        {dev, "a device tensor", "pool 'device'"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      if (cases[c].t == NULL && (c != 0 || s[i].optional)) continue;
      char expr[200];
      snprintf(expr, sizeof expr, "%s with %s = %s", op, s[i].name, cases[c].what);
      t[i] = cases[c].t;
      refused_at((arm(), fn(t)), L2L_ERR_INVALID, cases[c].needle, file, line, expr);
      t[i] = good;
    }
    l2l_tensor_free(wrong);
    l2l_tensor_free(dev);
  }
  l2l_layer_free(layer);
  char expr[200];
  snprintf(expr, sizeof expr, "%s with good arguments after the refusals", op);
  l2l_status st = fn(t);
  check_that(st == L2L_OK, file, line, expr, "failed: %s", l2l_last_error());
}
#define SWEEP(op, fn, t, ...)                                                                 \
  sweep_at((op), (fn), (t), (const struct slot[]){__VA_ARGS__},                               \
           (int)(sizeof((const struct slot[]){__VA_ARGS__}) / sizeof(struct slot)), __FILE__, \
           __LINE__)

static l2l_status call_gemm(l2l_tensor *const *t) {
  return l2l_gemm(t[0], t[1], t[2], 0, 0, 1.0f, 0.0f);
}
static l2l_status call_gemm_batched(l2l_tensor *const *t) {
  return l2l_gemm_batched(t[0], t[1], t[2], 0, 0, 1.0f, 0.0f);
}

/* Covers: l2l_gemm, l2l_gemm_batched. */
TEST(misuse_gemm) {
  l2l_tensor *c = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 6)), *a = check_randn(1.0, 2, 4, 5),
             *b = check_randn(1.0, 2, 5, 6);
  l2l_tensor *t[3] = {c, a, b};
  SWEEP("l2l_gemm", call_gemm, t, {"c", false}, {"a", false}, {"b", false});
  poison(c);
  const int flags[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
    REFUSES(l2l_gemm(c, a, b, flags[i], 0, 1, 0), L2L_ERR_INVALID, "trans_a");
    REFUSES(l2l_gemm(c, a, b, 0, flags[i], 1, 0), L2L_ERR_INVALID, "trans_b");
    REFUSES(l2l_gemm_batched(c, a, b, flags[i], 0, 1, 0), L2L_ERR_INVALID, "trans_a");
  }
  const float not_finite[] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < 3; i++) {
    REFUSES(l2l_gemm(c, a, b, 0, 0, not_finite[i], 0), L2L_ERR_INVALID, "alpha");
    REFUSES(l2l_gemm(c, a, b, 0, 0, 1, not_finite[i]), L2L_ERR_INVALID, "beta");
    REFUSES(l2l_gemm_batched(c, a, b, 0, 0, 1, not_finite[i]), L2L_ERR_INVALID, "beta");
  }
  /* shapes: off by one, transposed, the wrong transpose flag */
  l2l_tensor *b6 = check_randn(1.0, 2, 6, 6), *ct = poison(NEW(L2L_POOL_HOST, L2L_F32, 6, 4));
  l2l_tensor *c5 = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 7));
  WATCH(b6, ct, c5);
  REFUSES(l2l_gemm(c, a, b6, 0, 0, 1, 0), L2L_ERR_INVALID, "inner dims");
  REFUSES(l2l_gemm(ct, a, b, 0, 0, 1, 0), L2L_ERR_INVALID, "c is (6,4)");
  REFUSES(l2l_gemm(c5, a, b, 0, 0, 1, 0), L2L_ERR_INVALID, "c is (4,7)");
  REFUSES(l2l_gemm(c, a, b, 1, 0, 1, 0), L2L_ERR_INVALID, "inner dims");
  REFUSES(l2l_gemm(c, a, b, 0, 1, 1, 0), L2L_ERR_INVALID, "inner dims");
  REFUSES(l2l_gemm(c, a, b, 1, 1, 1, 0), L2L_ERR_INVALID, "inner dims");
  REFUSES(l2l_gemm(c, b, a, 1, 1, 1, 0), L2L_ERR_INVALID, "c is (4,6) but op(a) op(b) is (6,4)");
  /* 16-bit inputs come in pairs of one kind */
  l2l_tensor *ah = remake(a, L2L_POOL_HOST, L2L_F16), *bh = remake(b, L2L_POOL_HOST, L2L_BF16);
  l2l_tensor *ch = remake(c, L2L_POOL_HOST, L2L_F16);
  WATCH(ah, bh, ch);
  REFUSES(l2l_gemm(c, ah, b, 0, 0, 1, 0), L2L_ERR_INVALID, "b is f32, need f16");
  REFUSES(l2l_gemm(c, ah, bh, 0, 0, 1, 0), L2L_ERR_INVALID, "b is bf16, need f16");
  REFUSES(l2l_gemm(c, a, bh, 0, 0, 1, 0), L2L_ERR_INVALID, "b is bf16, need f32");
  REFUSES(l2l_gemm(ch, ah, ah, 0, 1, 1, 0), L2L_ERR_INVALID, "c is f16");
  /* c may not alias an input */
  l2l_tensor *sq = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 4)), *sqv = view(sq, 0, 4);
  WATCH(sq);
  REFUSES(l2l_gemm(sq, sqv, sqv, 0, 0, 1, 0), L2L_ERR_INVALID, "overlaps");
  /* batched: batch counts agree, at least 2 dims each */
  l2l_tensor *cb = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 4, 6)), *ab = check_randn(1.0, 3, 2, 4, 5),
             *bb = check_randn(1.0, 3, 2, 5, 6);
  l2l_tensor *bb3 = check_randn(1.0, 3, 3, 5, 6), *v5 = check_randn(1.0, 1, 5);
  l2l_tensor *tb[3] = {cb, ab, bb};
  SWEEP("l2l_gemm_batched", call_gemm_batched, tb, {"c", false}, {"a", false}, {"b", false});
  poison(cb);
  WATCH(bb3, v5);
  REFUSES(l2l_gemm_batched(cb, ab, bb3, 0, 0, 1, 0), L2L_ERR_INVALID, "batch counts");
  REFUSES(l2l_gemm_batched(cb, v5, bb, 0, 0, 1, 0), L2L_ERR_INVALID, "2 dims");
  REFUSES(l2l_gemm_batched(cb, ab, bb, 1, 0, 1, 0), L2L_ERR_INVALID, "inner dims");
  unwatch();
  CHECK_OK(l2l_gemm(c, a, b, 0, 0, 1, 0));
  FREE(c, a, b, b6, ct, c5, ah, bh, ch, sq, sqv, cb, ab, bb, bb3, v5);
}

static l2l_status call_bias_add(l2l_tensor *const *t) {
  return l2l_bias_add(t[0], t[1]);
}
static l2l_status call_bias_backward(l2l_tensor *const *t) {
  return l2l_bias_backward(t[0], t[1]);
}
static l2l_status call_add(l2l_tensor *const *t) {
  return l2l_add(t[0], t[1], t[2]);
}
static l2l_status call_gelu_forward(l2l_tensor *const *t) {
  return l2l_gelu_forward(t[0], t[1]);
}
static l2l_status call_gelu_backward(l2l_tensor *const *t) {
  return l2l_gelu_backward(t[0], t[1], t[2]);
}

/* Covers: l2l_bias_add, l2l_bias_backward, l2l_add, l2l_gelu_forward, l2l_gelu_backward. */
TEST(misuse_elementwise) {
  l2l_tensor *y = check_randn(1.0, 2, 4, 5), *bias = check_randn(1.0, 1, 5);
  l2l_tensor *dy = check_randn(1.0, 2, 4, 5), *x = check_randn(1.0, 2, 4, 5);
  l2l_tensor *out = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5));
  l2l_tensor *t2[2] = {y, bias}, *t3[3] = {out, x, dy};
  SWEEP("l2l_bias_add", call_bias_add, t2, {"y", false}, {"bias", false});
  l2l_tensor *db[2] = {bias, dy};
  SWEEP("l2l_bias_backward", call_bias_backward, db, {"dbias", false}, {"dy", false});
  SWEEP("l2l_add", call_add, t3, {"out", false}, {"a", false}, {"b", false});
  l2l_tensor *gf[2] = {out, x};
  SWEEP("l2l_gelu_forward", call_gelu_forward, gf, {"y", false}, {"x", false});
  SWEEP("l2l_gelu_backward", call_gelu_backward, t3, {"dx", false}, {"dy", false}, {"x", false});
  poison(out);

  l2l_tensor *b6 = check_randn(1.0, 1, 6), *b4 = check_randn(1.0, 1, 4);
  l2l_tensor *xt = check_randn(1.0, 2, 5, 4), *x6 = check_randn(1.0, 2, 4, 6);
  l2l_tensor *x1 = check_randn(1.0, 1, 20), *x3 = check_randn(1.0, 3, 4, 5, 1);
  l2l_tensor *big = check_randn(1.0, 2, 6, 5), *lo = view(big, 0, 4), *hi = view(big, 2, 4);
  l2l_tensor *row = view(y, 1, 1);
  WATCH(b6, b4, xt, x6, x1, x3, big);
  /* bias: one per column, off by one either way; a bias inside y */
  REFUSES(l2l_bias_add(y, b6), L2L_ERR_INVALID, "bias has 6 elements");
  REFUSES(l2l_bias_add(y, b4), L2L_ERR_INVALID, "bias has 4 elements");
  REFUSES(l2l_bias_add(xt, bias), L2L_ERR_INVALID, "bias has 5 elements, need 4");
  REFUSES(l2l_bias_add(y, row), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_bias_backward(b6, dy), L2L_ERR_INVALID, "dbias has 6 elements");
  REFUSES(l2l_bias_backward(bias, xt), L2L_ERR_INVALID, "dbias has 5 elements, need 4");
  REFUSES(l2l_bias_backward(row, y), L2L_ERR_INVALID, "overlaps");
  /* same shapes: transposed, off by one, flattened, an extra dim; partial aliasing */
  const l2l_tensor *misfits[] = {xt, x6, x1, x3};
  for (size_t i = 0; i < sizeof misfits / sizeof misfits[0]; i++) {
    REFUSES(l2l_add(out, x, misfits[i]), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_add(out, misfits[i], x), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_add((l2l_tensor *)misfits[i], x, dy), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_forward(out, misfits[i]), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_forward((l2l_tensor *)misfits[i], x), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_backward(out, misfits[i], x), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_backward(out, dy, misfits[i]), L2L_ERR_INVALID, "shape");
    REFUSES(l2l_gelu_backward((l2l_tensor *)misfits[i], dy, x), L2L_ERR_INVALID, "shape");
  }
  REFUSES(l2l_add(hi, lo, x), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_add(lo, x, hi), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_gelu_forward(hi, lo), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_gelu_backward(lo, hi, x), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_gelu_backward(lo, dy, hi), L2L_ERR_INVALID, "overlaps");
  /* in place is allowed where the header says so */
  unwatch();
  CHECK_OK(l2l_add(x, x, dy));
  CHECK_OK(l2l_gelu_forward(x, x));
  FREE(y, bias, dy, x, out, b6, b4, xt, x6, x1, x3, big, lo, hi, row);
}

static l2l_status call_ln_forward(l2l_tensor *const *t) {
  return l2l_layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], 1e-5f);
}
static l2l_status call_ln_backward(l2l_tensor *const *t) {
  return l2l_layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
}

/* Covers: l2l_layernorm_forward, l2l_layernorm_backward. */
TEST(misuse_layernorm) {
  l2l_tensor *y = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5)),
             *mean = poison(NEW(L2L_POOL_HOST, L2L_F32, 4));
  l2l_tensor *rstd = poison(NEW(L2L_POOL_HOST, L2L_F32, 4)), *x = check_randn(1.0, 2, 4, 5);
  l2l_tensor *w = check_randn(1.0, 1, 5), *b = check_randn(1.0, 1, 5);
  l2l_tensor *tf[6] = {y, mean, rstd, x, w, b};
  SWEEP("l2l_layernorm_forward", call_ln_forward, tf, {"y", false}, {"mean", true}, {"rstd", true},
        {"x", false}, {"weight", false}, {"bias", false});
  l2l_tensor *dx = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5)), *dw = check_randn(1.0, 1, 5);
  l2l_tensor *dbias = check_randn(1.0, 1, 5), *dy = check_randn(1.0, 2, 4, 5);
  l2l_tensor *tb[8] = {dx, dw, dbias, dy, x, w, mean, rstd};
  SWEEP("l2l_layernorm_backward", call_ln_backward, tb, {"dx", false}, {"dweight", true},
        {"dbias", true}, {"dy", false}, {"x", false}, {"weight", false}, {"mean", false},
        {"rstd", false});
  poison(y), poison(dx);

  const float bad_eps[] = {0.0f, -1e-5f, NAN, INFINITY, -INFINITY, -0.0f};
  for (size_t i = 0; i < sizeof bad_eps / sizeof bad_eps[0]; i++)
    REFUSES(l2l_layernorm_forward(y, mean, rstd, x, w, b, bad_eps[i]), L2L_ERR_INVALID, "eps");
  l2l_tensor *w6 = check_randn(1.0, 1, 6), *w4 = check_randn(1.0, 1, 4),
             *m5 = check_randn(1.0, 1, 5);
  l2l_tensor *m3 = check_randn(1.0, 1, 3), *xt = check_randn(1.0, 2, 5, 4);
  l2l_tensor *yt = poison(NEW(L2L_POOL_HOST, L2L_F32, 5, 4));
  l2l_tensor *wide = check_randn(1.0, 2, 4, 6), *in_y = view(wide, 0, 1);
  l2l_tensor *flat5 = RESHAPED(in_y, 6);
  WATCH(w6, w4, m5, m3, xt, yt, wide);
  REFUSES(l2l_layernorm_forward(y, mean, rstd, x, w6, b, 1e-5f), L2L_ERR_INVALID, "weight has 6");
  REFUSES(l2l_layernorm_forward(y, mean, rstd, x, w, w4, 1e-5f), L2L_ERR_INVALID, "bias has 4");
  REFUSES(l2l_layernorm_forward(y, m5, rstd, x, w, b, 1e-5f), L2L_ERR_INVALID, "mean has 5");
  REFUSES(l2l_layernorm_forward(y, mean, m3, x, w, b, 1e-5f), L2L_ERR_INVALID, "rstd has 3");
  REFUSES(l2l_layernorm_forward(yt, mean, rstd, x, w, b, 1e-5f), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_layernorm_forward(y, mean, rstd, xt, w, b, 1e-5f), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_layernorm_forward(y, mean, mean, x, w, b, 1e-5f), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_layernorm_forward(wide, mean, rstd, wide, flat5, flat5, 1e-5f), L2L_ERR_INVALID,
          "overlaps");
  REFUSES(l2l_layernorm_backward(dx, dw, dbias, dy, x, w6, mean, rstd), L2L_ERR_INVALID,
          "weight has 6");
  REFUSES(l2l_layernorm_backward(dx, w4, dbias, dy, x, w, mean, rstd), L2L_ERR_INVALID,
          "dweight has 4");
  REFUSES(l2l_layernorm_backward(dx, dw, w6, dy, x, w, mean, rstd), L2L_ERR_INVALID, "dbias has 6");
  REFUSES(l2l_layernorm_backward(dx, dw, dbias, dy, x, w, m5, rstd), L2L_ERR_INVALID, "mean has 5");
  REFUSES(l2l_layernorm_backward(dx, dw, dbias, dy, x, w, mean, m3), L2L_ERR_INVALID, "rstd has 3");
  REFUSES(l2l_layernorm_backward(dx, dw, dbias, xt, x, w, mean, rstd), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_layernorm_backward(yt, dw, dbias, dy, x, w, mean, rstd), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_layernorm_backward(dx, dw, dw, dy, x, w, mean, rstd), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_layernorm_backward(dx, w, dbias, dy, x, w, mean, rstd), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_layernorm_backward(x, dw, dbias, dy, x, w, mean, rstd), L2L_ERR_INVALID, "overlaps");
  unwatch();
  CHECK_OK(l2l_layernorm_forward(y, NULL, NULL, x, w, b, 1e-5f));
  CHECK_OK(l2l_layernorm_backward(dy, NULL, NULL, dy, x, w, mean, rstd)); /* dx may be dy */
  FREE(y, mean, rstd, x, w, b, dx, dw, dbias, dy, w6, w4, m5, m3, xt, yt, wide, in_y, flat5);
}

static l2l_status call_softmax_forward(l2l_tensor *const *t) {
  return l2l_softmax_forward(t[0], t[1], t[2], 1, 0.5f);
}
static l2l_status call_softmax_backward(l2l_tensor *const *t) {
  return l2l_softmax_backward(t[0], t[1], t[2], 0.5f);
}

/* Covers: l2l_softmax_forward, l2l_softmax_backward. */
TEST(misuse_softmax) {
  l2l_tensor *y = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 4)), *x = check_randn(1.0, 3, 2, 3, 4);
  l2l_tensor *mask = ones_u8(DIMS(2, 4));
  l2l_tensor *tf[3] = {y, x, mask};
  SWEEP("l2l_softmax_forward", call_softmax_forward, tf, {"y", false}, {"x", false},
        {"key_mask", true});
  l2l_tensor *dx = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 4)), *dy = check_randn(1.0, 3, 2, 3, 4);
  l2l_tensor *tb[3] = {dx, dy, y};
  SWEEP("l2l_softmax_backward", call_softmax_backward, tb, {"dx", false}, {"dy", false},
        {"y", false});
  poison(y), poison(dx);
  const int flags[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    REFUSES(l2l_softmax_forward(y, x, mask, flags[i], 1), L2L_ERR_INVALID, "causal");
  const float not_finite[] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < 3; i++) {
    REFUSES(l2l_softmax_forward(y, x, mask, 0, not_finite[i]), L2L_ERR_INVALID, "scale");
    REFUSES(l2l_softmax_backward(dx, dy, y, not_finite[i]), L2L_ERR_INVALID, "scale");
  }
  l2l_tensor *m5 = ones_u8(DIMS(2, 5)), *m3 = ones_u8(DIMS(3, 4)), *mt = ones_u8(DIMS(4, 2));
  l2l_tensor *m1 = ones_u8(DIMS(8)), *m3d = ones_u8(DIMS(2, 1, 4));
  l2l_tensor *x2 = check_randn(1.0, 2, 3, 4), *y2 = poison(NEW(L2L_POOL_HOST, L2L_F32, 3, 4));
  l2l_tensor *xt = check_randn(1.0, 3, 2, 4, 3), *yo = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 5));
  l2l_tensor *big = check_randn(1.0, 3, 3, 3, 4), *lo = view(big, 0, 2), *hi = view(big, 1, 2);
  WATCH(m5, m3, mt, m1, m3d, x2, y2, xt, yo, big);
  const l2l_tensor *bad_masks[] = {m5, m3, mt, m1, m3d};
  for (size_t i = 0; i < sizeof bad_masks / sizeof bad_masks[0]; i++)
    REFUSES(l2l_softmax_forward(y, x, bad_masks[i], 0, 1), L2L_ERR_INVALID, "key_mask has shape");
  REFUSES(l2l_softmax_forward(y2, x2, m3, 0, 1), L2L_ERR_INVALID, "3 dims");
  REFUSES(l2l_softmax_forward(y, xt, NULL, 0, 1), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_softmax_forward(yo, x, NULL, 0, 1), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_softmax_forward(hi, lo, NULL, 0, 1), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_softmax_backward(dx, xt, y, 1), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_softmax_backward(yo, dy, y, 1), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_softmax_backward(lo, dy, hi, 1), L2L_ERR_INVALID, "overlaps");
  unwatch();
  CHECK_OK(l2l_softmax_forward(x, x, mask, 1, 1.0f)); /* y may be x */
  FREE(y, x, mask, dx, dy, m5, m3, mt, m1, m3d, x2, y2, xt, yo, big, lo, hi);
}

static l2l_status call_embedding_forward(l2l_tensor *const *t) {
  return l2l_embedding_forward(t[0], t[1], t[2]);
}
static l2l_status call_embedding_backward(l2l_tensor *const *t) {
  return l2l_embedding_backward(t[0], t[1], t[2]);
}
static l2l_status call_ce_forward(l2l_tensor *const *t) {
  return l2l_cross_entropy_forward(t[0], t[1], t[2], -1);
}
static l2l_status call_ce_backward(l2l_tensor *const *t) {
  return l2l_cross_entropy_backward(t[0], t[1], t[2], -1, 0.25f);
}

/* Covers: l2l_embedding_forward, l2l_embedding_backward, l2l_cross_entropy_forward,
   l2l_cross_entropy_backward. */
TEST(misuse_embedding_and_cross_entropy) {
  enum { V = 7 };
  l2l_tensor *out = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 5)), *ids = IDS(V, 2, 3);
  l2l_tensor *table = check_randn(1.0, 2, V, 5), *dtable = check_randn(1.0, 2, V, 5);
  l2l_tensor *dout = check_randn(1.0, 3, 2, 3, 5);
  l2l_tensor *ef[3] = {out, ids, table}, *eb[3] = {dtable, dout, ids};
  SWEEP("l2l_embedding_forward", call_embedding_forward, ef, {"out", false}, {"ids", false},
        {"table", false});
  SWEEP("l2l_embedding_backward", call_embedding_backward, eb, {"dtable", false}, {"dout", false},
        {"ids", false});
  poison(out);
  /* ids outside [0, V): refused before anything is written */
  const int32_t bad_ids[] = {V, -1, INT32_MIN, INT32_MAX, V + 1};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    l2l_tensor *bad = IDS(V, 2, 3);
    ((int32_t *)l2l_tensor_data(bad))[5] = bad_ids[i];
    WATCH(bad);
    REFUSES(l2l_embedding_forward(out, bad, table), L2L_ERR_INVALID, "ids[1][2]");
    REFUSES(l2l_embedding_backward(dtable, dout, bad), L2L_ERR_INVALID, "ids[1][2]");
    unwatch();
    l2l_tensor_free(bad);
  }
  l2l_tensor *t3 = check_randn(1.0, 3, V, 5, 1), *t1 = check_randn(1.0, 1, V * 5);
  l2l_tensor *o6 = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 6)),
             *o4 = poison(NEW(L2L_POOL_HOST, L2L_F32, 2, 3, 4));
  l2l_tensor *ofl = poison(NEW(L2L_POOL_HOST, L2L_F32, 30)), *tt = check_randn(1.0, 2, 5, V);
  l2l_tensor *half = remake(table, L2L_POOL_HOST, L2L_BF16),
             *dhalf = remake(table, L2L_POOL_HOST, L2L_F16);
  l2l_tensor *i7 = IDS(V, 7), *wide = check_randn(1.0, 2, 8, 5);
  l2l_tensor *in_out = view(wide, 0, V), *mid = view(wide, 2, 6), *rows = RESHAPED(mid, 2, 3, 5);
  WATCH(t3, t1, o6, o4, ofl, tt, half, dhalf, i7, wide);
  REFUSES(l2l_embedding_forward(out, ids, t3), L2L_ERR_INVALID, "(V, C)");
  REFUSES(l2l_embedding_forward(out, ids, t1), L2L_ERR_INVALID, "(V, C)");
  REFUSES(l2l_embedding_forward(o6, ids, table), L2L_ERR_INVALID, "out has 36 elements");
  REFUSES(l2l_embedding_forward(o4, ids, table), L2L_ERR_INVALID, "out has 24 elements");
  REFUSES(l2l_embedding_forward(ofl, ids, table), L2L_ERR_INVALID, "last dim");
  REFUSES(l2l_embedding_forward(out, ids, tt), L2L_ERR_INVALID, "out has 30 elements, need 42");
  REFUSES(l2l_embedding_forward(out, i7, table), L2L_ERR_INVALID, "out has 30 elements, need 35");
  REFUSES(l2l_embedding_forward(rows, ids, in_out), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_embedding_backward(dhalf, dout, ids), L2L_ERR_INVALID, "dtable is f16");
  REFUSES(l2l_embedding_backward(t3, dout, ids), L2L_ERR_INVALID, "(V, C)");
  REFUSES(l2l_embedding_backward(dtable, o6, ids), L2L_ERR_INVALID, "dout has 36 elements");
  REFUSES(l2l_embedding_backward(in_out, rows, ids), L2L_ERR_INVALID, "overlaps");
  CHECK_OK(l2l_embedding_forward(out, ids, half)); /* a 16-bit table is gathered */
  poison(out);

  /* cross-entropy: targets in [0, V) or the ignore index, one per row */
  l2l_tensor *losses = poison(NEW(L2L_POOL_HOST, L2L_F32, 4)), *logits = check_randn(1.0, 2, 4, V);
  l2l_tensor *targets = IDS(V, 4), *dlogits = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, V));
  l2l_tensor *cf[3] = {losses, logits, targets}, *cb[3] = {dlogits, logits, targets};
  SWEEP("l2l_cross_entropy_forward", call_ce_forward, cf, {"losses", false}, {"logits", false},
        {"targets", false});
  SWEEP("l2l_cross_entropy_backward", call_ce_backward, cb, {"dlogits", false}, {"logits", false},
        {"targets", false});
  poison(losses), poison(dlogits);
  WATCH(losses, dlogits);
  const int32_t bad_targets[] = {V, -2, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof bad_targets / sizeof bad_targets[0]; i++) {
    l2l_tensor *bad = IDS(V, 4);
    ((int32_t *)l2l_tensor_data(bad))[3] = bad_targets[i];
    WATCH(bad);
    REFUSES(l2l_cross_entropy_forward(losses, logits, bad, -1), L2L_ERR_INVALID, "targets[3]");
    REFUSES(l2l_cross_entropy_backward(dlogits, logits, bad, -1, 1), L2L_ERR_INVALID, "targets[3]");
    unwatch();
    WATCH(losses, dlogits);
    l2l_tensor_free(bad);
  }
  /* -1 is a target like any when the ignore index is another */
  ((int32_t *)l2l_tensor_data(targets))[0] = -1;
  REFUSES(l2l_cross_entropy_forward(losses, logits, targets, -100), L2L_ERR_INVALID, "targets[0]");
  REFUSES(l2l_cross_entropy_forward(losses, logits, targets, INT32_MIN), L2L_ERR_INVALID,
          "targets[0]");
  l2l_tensor *l5 = poison(NEW(L2L_POOL_HOST, L2L_F32, 5)), *tg5 = IDS(V, 5),
             *lt = check_randn(1.0, 2, V, 4);
  l2l_tensor *dlt = poison(NEW(L2L_POOL_HOST, L2L_F32, V, 4)),
             *dl8 = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, V + 1));
  l2l_tensor *tg2 = IDS(V, 2, 2);
  WATCH(l5, tg5, lt, dlt, dl8, tg2);
  REFUSES(l2l_cross_entropy_forward(l5, logits, targets, -1), L2L_ERR_INVALID, "losses has 5");
  REFUSES(l2l_cross_entropy_forward(losses, logits, tg5, -1), L2L_ERR_INVALID, "targets has 5");
  REFUSES(l2l_cross_entropy_forward(losses, lt, targets, -1), L2L_ERR_INVALID, "targets has 4");
  REFUSES(l2l_cross_entropy_backward(dlt, logits, targets, -1, 1), L2L_ERR_INVALID, "last dim");
  REFUSES(l2l_cross_entropy_backward(dl8, logits, targets, -1, 1), L2L_ERR_INVALID,
          "dlogits has 32");
  REFUSES(l2l_cross_entropy_backward(dlogits, logits, tg5, -1, 1), L2L_ERR_INVALID,
          "targets has 5");
  REFUSES(l2l_cross_entropy_backward(logits, logits, targets, -1, 1), L2L_ERR_INVALID, "overlaps");
  const float not_finite[] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < 3; i++)
    REFUSES(l2l_cross_entropy_backward(dlogits, logits, targets, -1, not_finite[i]),
            L2L_ERR_INVALID, "scale");
  unwatch();
  CHECK_OK(l2l_cross_entropy_forward(losses, logits, targets, -1));
  CHECK_OK(l2l_cross_entropy_forward(losses, logits, tg2, -1)); /* (R) as (2,2): R values */
  FREE(out, ids, table, dtable, dout, t3, t1, o6, o4, ofl, tt, half, dhalf, i7, wide, in_out, mid,
       rows, losses, logits, targets, dlogits, l5, tg5, lt, dlt, dl8, tg2);
}

static l2l_status call_dropout_forward(l2l_tensor *const *t) {
  return l2l_dropout_forward(t[0], t[1], t[2], 0.25f, 1, 2, 0);
}
static l2l_status call_dropout_backward(l2l_tensor *const *t) {
  return l2l_dropout_backward(t[0], t[1], t[2], 0.25f);
}
static l2l_status call_sum(l2l_tensor *const *t) {
  double out;
  return l2l_sum(&out, t[0]);
}
static l2l_status call_max_abs(l2l_tensor *const *t) {
  double out;
  return l2l_max_abs(&out, t[0]);
}
static l2l_status call_norm2(l2l_tensor *const *t) {
  double out;
  return l2l_norm2(&out, t[0]);
}

/* Covers: l2l_dropout_forward, l2l_dropout_backward, l2l_sum, l2l_max_abs, l2l_norm2. */
TEST(misuse_dropout_and_reductions) {
  l2l_tensor *y = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5)),
             *mask = poison(NEW(L2L_POOL_HOST, L2L_U8, 3));
  l2l_tensor *x = check_randn(1.0, 2, 4, 5), *dx = poison(NEW(L2L_POOL_HOST, L2L_F32, 4, 5));
  l2l_tensor *tf[3] = {y, mask, x};
  SWEEP("l2l_dropout_forward", call_dropout_forward, tf, {"y", false}, {"mask", false},
        {"x", false});
  l2l_tensor *tb[3] = {dx, x, mask};
  SWEEP("l2l_dropout_backward", call_dropout_backward, tb, {"dx", false}, {"dy", false},
        {"mask", false});
  poison(y), poison(dx);
  const float bad_p[] = {1.0f, -0.1f, NAN, INFINITY, -INFINITY, 1.5f, -0.0f - 1e-30f};
  for (size_t i = 0; i < sizeof bad_p / sizeof bad_p[0]; i++) {
    REFUSES(l2l_dropout_forward(y, mask, x, bad_p[i], 1, 2, 0), L2L_ERR_INVALID, "p must");
    REFUSES(l2l_dropout_backward(dx, x, mask, bad_p[i]), L2L_ERR_INVALID, "p must");
  }
  REFUSES(l2l_dropout_forward(y, mask, x, 0.5f, 1, 2, -1), L2L_ERR_INVALID, "first");
  REFUSES(l2l_dropout_forward(y, mask, x, 0.5f, 1, 2, INT64_MIN), L2L_ERR_INVALID, "first");
  l2l_tensor *m2 = poison(NEW(L2L_POOL_HOST, L2L_U8, 2)),
             *m4 = poison(NEW(L2L_POOL_HOST, L2L_U8, 4));
  l2l_tensor *xt = check_randn(1.0, 2, 5, 4), *x21 = check_randn(1.0, 1, 21);
  l2l_tensor *big = check_randn(1.0, 2, 6, 5), *lo = view(big, 0, 4), *hi = view(big, 2, 4);
  WATCH(m2, m4, xt, x21, big);
  REFUSES(l2l_dropout_forward(y, m2, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "mask has 2");
  REFUSES(l2l_dropout_forward(y, m4, x, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "mask has 4");
  REFUSES(l2l_dropout_forward(y, mask, xt, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_dropout_forward(y, mask, x21, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_dropout_forward(hi, mask, lo, 0.5f, 1, 2, 0), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_dropout_backward(dx, xt, mask, 0.5f), L2L_ERR_INVALID, "shape");
  REFUSES(l2l_dropout_backward(dx, x, m2, 0.5f), L2L_ERR_INVALID, "mask has 2");
  REFUSES(l2l_dropout_backward(lo, hi, mask, 0.5f), L2L_ERR_INVALID, "overlaps");
  /* the largest first: a good call (draw indexes are unsigned) */
  CHECK_OK(l2l_dropout_forward(y, mask, x, 0.5f, UINT64_MAX, UINT64_MAX, INT64_MAX));

  /* reductions: out, and an f32 tensor */
  l2l_tensor *r[1] = {x};
  SWEEP("l2l_sum", call_sum, r, {"x", false});
  SWEEP("l2l_max_abs", call_max_abs, r, {"x", false});
  SWEEP("l2l_norm2", call_norm2, r, {"x", false});
  REFUSES(l2l_sum(NULL, x), L2L_ERR_INVALID, "out");
  REFUSES(l2l_max_abs(NULL, x), L2L_ERR_INVALID, "out");
  REFUSES(l2l_norm2(NULL, x), L2L_ERR_INVALID, "out");
  double value = 12345.0;
  REFUSES(l2l_sum(&value, mask), L2L_ERR_INVALID, "x is u8");
  REFUSES(l2l_max_abs(&value, NULL), L2L_ERR_INVALID, "x is NULL");
  REFUSES(l2l_norm2(&value, JUNK(l2l_tensor)), L2L_ERR_INVALID, "x is not");
  CHECK(value == 12345.0, "*out written by a refused reduction: %g", value);
  unwatch();
  l2l_tensor *dev = remake(x, L2L_POOL_DEVICE, L2L_F32);
  CHECK_OK(l2l_norm2(&value, dev)); /* a device tensor alone is fine */
  CHECK(value == 0.0, "norm of zeros: %g", value);
  FREE(y, mask, x, dx, m2, m4, xt, x21, big, lo, hi, dev);
}

static l2l_status call_adamw(l2l_tensor *const *t) {
  const l2l_adamw_config c = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  return l2l_adamw_update(t[0], t[1], t[2], t[3], &c, 1);
}

/* Covers: l2l_adamw_update. Issue 21's defect: it took a v of shape (5,4) for a (4,5)
   parameter (any state array of the parameter's size, whatever its shape). */
TEST(misuse_adamw) {
  l2l_tensor *p = check_randn(1.0, 2, 4, 5), *m = check_randn(0.1, 2, 4, 5);
  l2l_tensor *v = check_randn(0.1, 2, 4, 5), *g = check_randn(1.0, 2, 4, 5);
  float *vd = check_data(v);
  for (int i = 0; i < 20; i++) vd[i] = fabsf(vd[i]);
  l2l_tensor *t[4] = {p, m, v, g};
  SWEEP("l2l_adamw_update", call_adamw, t, {"param", false}, {"m", false}, {"v", false},
        {"grad", false});
  const l2l_adamw_config ok = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  REFUSES(l2l_adamw_update(p, m, v, g, NULL, 1), L2L_ERR_INVALID, "config");
  struct {
    const char *needle;
    l2l_adamw_config c;
  } bad[] = {
      {"lr = -0.001", {-1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f}},
      {"lr = nan", {NAN, 0.9f, 0.999f, 1e-8f, 0.01f}},
      {"lr = inf", {INFINITY, 0.9f, 0.999f, 1e-8f, 0.01f}},
      {"beta1 = 1", {1e-3f, 1.0f, 0.999f, 1e-8f, 0.01f}},
      {"beta1 = -0.1", {1e-3f, -0.1f, 0.999f, 1e-8f, 0.01f}},
      {"beta1 = nan", {1e-3f, NAN, 0.999f, 1e-8f, 0.01f}},
      {"beta2 = 1", {1e-3f, 0.9f, 1.0f, 1e-8f, 0.01f}},
      {"beta2 = 2", {1e-3f, 0.9f, 2.0f, 1e-8f, 0.01f}},
      {"eps = 0", {1e-3f, 0.9f, 0.999f, 0.0f, 0.01f}},
      {"eps = -1", {1e-3f, 0.9f, 0.999f, -1.0f, 0.01f}},
      {"eps = inf", {1e-3f, 0.9f, 0.999f, INFINITY, 0.01f}},
      {"weight_decay = -0.01", {1e-3f, 0.9f, 0.999f, 1e-8f, -0.01f}},
      {"weight_decay = nan", {1e-3f, 0.9f, 0.999f, 1e-8f, NAN}},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    REFUSES(l2l_adamw_update(p, m, v, g, &bad[i].c, 1), L2L_ERR_INVALID, bad[i].needle);
  const int64_t bad_steps[] = {0, -1, INT64_MIN};
  for (size_t i = 0; i < sizeof bad_steps / sizeof bad_steps[0]; i++)
    REFUSES(l2l_adamw_update(p, m, v, g, &ok, bad_steps[i]), L2L_ERR_INVALID, "step");
  /* every state array has the parameter's shape: transposed, flattened, off by one */
  l2l_tensor *tr = check_randn(0.1, 2, 5, 4), *flat = check_randn(0.1, 1, 20);
  l2l_tensor *more = check_randn(0.1, 2, 4, 6), *less = check_randn(0.1, 2, 3, 5);
  l2l_tensor *extra = check_randn(0.1, 3, 4, 5, 1);
  for (int i = 0; i < 20; i++) check_data(tr)[i] = fabsf(check_data(tr)[i]);
  WATCH(tr, flat, more, less, extra);
  const l2l_tensor *misfits[] = {tr, flat, more, less, extra};
  for (size_t i = 0; i < sizeof misfits / sizeof misfits[0]; i++) {
    l2l_tensor *mf = (l2l_tensor *)misfits[i];
    REFUSES(l2l_adamw_update(p, mf, v, g, &ok, 1), L2L_ERR_INVALID, "m has");
    REFUSES(l2l_adamw_update(p, m, mf, g, &ok, 1), L2L_ERR_INVALID, "v has");
    REFUSES(l2l_adamw_update(p, m, v, mf, &ok, 1), L2L_ERR_INVALID, "grad has");
    /* a parameter of another size makes the others the odd ones out */
    REFUSES(l2l_adamw_update(mf, m, v, g, &ok, 1), L2L_ERR_INVALID,
            l2l_tensor_numel(mf) == 20 ? "but param has shape" : "one per parameter");
  }
  /* no two arrays in one storage */
  REFUSES(l2l_adamw_update(p, m, m, g, &ok, 1), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_adamw_update(p, p, v, g, &ok, 1), L2L_ERR_INVALID, "overlaps");
  REFUSES(l2l_adamw_update(p, m, v, p, &ok, 1), L2L_ERR_INVALID, "overlaps");
  unwatch();
  CHECK_OK(l2l_adamw_update(p, m, v, g, &ok, INT64_MAX)); /* a late step is a step */
  bool finite = true;
  for (int i = 0; i < 20; i++) finite &= isfinite(check_data(p)[i]);
  CHECK(finite, "AdamW at step INT64_MAX left a non-finite parameter");
  FREE(p, m, v, g, tr, flat, more, less, extra);
}

/* ---------------------------------------------------------------- layers */

/* A config every built-in kind accepts (each reads its fields): D 8, 2 heads, F 16, V 11,
   6 positions, 3 classes, a final LayerNorm. */
static l2l_layer_config config_of(l2l_layer_kind kind) {
  l2l_layer_config c = block_config();
  c.kind = kind;
  c.vocab = 11, c.max_seq = 6, c.classes = 3, c.final_ln = 1;
  return c;
}

/* Every parameter record of a layer and its count of users, to compare after refusals. */
struct records {
  int n;
  l2l_param *param[16];
  int users[16];
};
static struct records records_of(const l2l_layer *layer) {
  struct records r = {0};
  r.n = l2l_layer_param_count(layer);
  for (int i = 0; i < r.n && i < 16; i++) {
    r.param[i] = l2l_layer_param(layer, i);
    r.users[i] = l2l_param_users(r.param[i]);
  }
  return r;
}
static bool same_records(const l2l_layer *layer, const struct records *r) {
  struct records now = records_of(layer);
  return now.n == r->n && memcmp(now.param, r->param, sizeof now.param) == 0 &&
         memcmp(now.users, r->users, sizeof now.users) == 0;
}

/* Covers: l2l_layer_new, l2l_layer_clone, l2l_layer_tie, l2l_layer_free. */
TEST(misuse_layer_new_clone_tie_and_free) {
  l2l_layer *out = SENTINEL(l2l_layer);
  l2l_layer_config base = config_of(L2L_LAYER_BLOCK);
  REFUSES(l2l_layer_new(NULL, &base, L2L_POOL_HOST), L2L_ERR_INVALID, "out");
  REFUSES(l2l_layer_new(&out, NULL, L2L_POOL_HOST), L2L_ERR_INVALID, "config");
  for (int i = 0; i < BAD_POOLS; i++)
    REFUSES(l2l_layer_new(&out, &base, (l2l_pool_kind)bad_pools[i]), L2L_ERR_INVALID, "pool");
  static struct {
    const char *needle;
    l2l_layer_config c;
  } bad[128];
  int nb = 0;
#define BAD(kind_, needle_, stmt)       \
  do {                                  \
    bad[nb].needle = (needle_);         \
    bad[nb].c = config_of(kind_);       \
    {                                   \
      l2l_layer_config *c = &bad[nb].c; \
      stmt;                             \
    }                                   \
    nb++;                               \
  } while (0)
  BAD(L2L_LAYER_BLOCK, "kind with number 99", c->kind = (l2l_layer_kind)99);
  BAD(L2L_LAYER_BLOCK, "kind with number -1", c->kind = (l2l_layer_kind)-1);
  BAD(L2L_LAYER_BLOCK, "kind with number 5", c->kind = (l2l_layer_kind)5);
  BAD(L2L_LAYER_CUSTOM, "l2l_layer_new_custom", (void)c);
  for (int k = L2L_LAYER_EMBEDDING; k <= L2L_LAYER_CLASSIFIER; k++) {
    l2l_layer_kind kind = (l2l_layer_kind)k;
    BAD(kind, "dim", c->dim = 0);
    BAD(kind, "dim", c->dim = -1);
    BAD(kind, "dim", c->dim = INT64_MIN);
    BAD(kind, "dim", c->dim = INT64_MAX);
    BAD(kind, "dim", c->dim = (INT64_C(1) << 24) + 1);
    BAD(kind, "init_std", c->init_std = 0);
    BAD(kind, "init_std", c->init_std = -1);
    BAD(kind, "init_std", c->init_std = NAN);
    BAD(kind, "init_std", c->init_std = INFINITY);
    BAD(kind, "dropout", c->dropout = 1);
    BAD(kind, "dropout", c->dropout = -0.1f);
    BAD(kind, "dropout", c->dropout = NAN);
  }
  BAD(L2L_LAYER_BLOCK, "heads", c->heads = 0);
  BAD(L2L_LAYER_BLOCK, "heads", c->heads = -2);
  BAD(L2L_LAYER_BLOCK, "heads", c->heads = INT64_MAX);
  BAD(L2L_LAYER_BLOCK, "divide", c->heads = 3);
  BAD(L2L_LAYER_BLOCK, "mlp", c->mlp = 0);
  BAD(L2L_LAYER_BLOCK, "mlp", c->mlp = INT64_MIN);
  BAD(L2L_LAYER_BLOCK, "mlp", c->mlp = (INT64_C(1) << 24) + 1);
  BAD(L2L_LAYER_BLOCK, "causal", c->causal = 2);
  BAD(L2L_LAYER_BLOCK, "causal", c->causal = -1);
  BAD(L2L_LAYER_BLOCK, "post_ln", c->post_ln = 2);
  BAD(L2L_LAYER_BLOCK, "bias", c->bias = INT_MIN);
  BAD(L2L_LAYER_BLOCK, "memory", c->memory = (l2l_memory_mode)2);
  BAD(L2L_LAYER_BLOCK, "memory", c->memory = (l2l_memory_mode)-1);
  BAD(L2L_LAYER_BLOCK, "attn_dropout", c->attn_dropout = 1);
  BAD(L2L_LAYER_BLOCK, "attn_dropout", c->attn_dropout = NAN);
  BAD(L2L_LAYER_BLOCK, "resid_std", c->resid_std = 0);
  BAD(L2L_LAYER_BLOCK, "resid_std", c->resid_std = INFINITY);
  BAD(L2L_LAYER_BLOCK, "eps", c->eps = 0);
  BAD(L2L_LAYER_BLOCK, "eps", c->eps = -1e-5f);
  BAD(L2L_LAYER_BLOCK, "eps", c->eps = NAN);
  BAD(L2L_LAYER_EMBEDDING, "vocab", c->vocab = 0);
  BAD(L2L_LAYER_EMBEDDING, "vocab", c->vocab = INT64_MAX);
  BAD(L2L_LAYER_EMBEDDING, "max_seq", c->max_seq = -1);
  BAD(L2L_LAYER_EMBEDDING, "max_seq", c->max_seq = INT64_MIN);
  BAD(L2L_LAYER_EMBEDDING, "type_vocab", c->type_vocab = -1);
  BAD(L2L_LAYER_EMBEDDING, "type_vocab", c->type_vocab = (INT64_C(1) << 24) + 1);
  BAD(L2L_LAYER_LM_HEAD, "vocab", c->vocab = -11);
  BAD(L2L_LAYER_LM_HEAD, "final_ln", c->final_ln = 2);
  BAD(L2L_LAYER_LM_HEAD, "eps", c->eps = INFINITY);
  BAD(L2L_LAYER_CLASSIFIER, "classes", c->classes = 0);
  BAD(L2L_LAYER_CLASSIFIER, "classes", c->classes = INT64_MAX);
#undef BAD
  for (int i = 0; i < nb; i++) {
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_layer_new case %d (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_layer_new(&out, &bad[i].c, L2L_POOL_HOST)), L2L_ERR_INVALID,
               bad[i].needle, __FILE__, __LINE__, expr);
  }
  CHECK(out == SENTINEL(l2l_layer), "*out written by a refused l2l_layer_new");

  /* l2l_layer_config_params: the same configs refused with the same needles; count,
     out and capacity checked; nothing written on a refusal */
  l2l_param_info infos[L2L_MAX_PARAMS + 1];
  memset(infos, 0x5a, sizeof infos);
  unsigned char untouched[sizeof infos];
  memcpy(untouched, infos, sizeof infos);
  int count = -7;
  for (int i = 0; i < nb; i++) {
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_layer_config_params case %d (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_layer_config_params(infos, L2L_MAX_PARAMS, &count, &bad[i].c)),
               L2L_ERR_INVALID, bad[i].needle, __FILE__, __LINE__, expr);
  }
  REFUSES(l2l_layer_config_params(infos, L2L_MAX_PARAMS, NULL, &base), L2L_ERR_INVALID, "count");
  REFUSES(l2l_layer_config_params(NULL, L2L_MAX_PARAMS, &count, &base), L2L_ERR_INVALID, "out");
  REFUSES(l2l_layer_config_params(infos, L2L_MAX_PARAMS, &count, NULL), L2L_ERR_INVALID, "config");
  REFUSES(l2l_layer_config_params(infos, -1, &count, &base), L2L_ERR_INVALID, "room for");
  REFUSES(l2l_layer_config_params(infos, 0, &count, &base), L2L_ERR_INVALID, "room for");
  REFUSES(l2l_layer_config_params(infos, INT_MIN, &count, &base), L2L_ERR_INVALID, "room for");
  CHECK(memcmp(infos, untouched, sizeof infos) == 0, "a refused l2l_layer_config_params wrote out");
  CHECK_OK(l2l_layer_config_params(infos, INT_MAX, &count, &base));
  CHECK(count >= 1 && count <= L2L_MAX_PARAMS &&
            memcmp(&infos[count], &untouched[count * sizeof *infos], sizeof *infos) == 0,
        "l2l_layer_config_params: %d records, or it wrote past them", count);

  /* configs whose parameters cannot be made: refused, and what was made before is freed */
  if (stats_of(L2L_POOL_HOST).budget != 0) {
    l2l_layer_config c = config_of(L2L_LAYER_EMBEDDING);
    c.dim = INT64_C(1) << 20, c.vocab = 1, c.max_seq = INT64_C(1) << 24; /* wpe: 64 TiB */
    REFUSES(l2l_layer_new(&out, &c, L2L_POOL_HOST), L2L_ERR_BUDGET, "host pool");
    c = config_of(L2L_LAYER_LM_HEAD);
    c.dim = INT64_C(1) << 20, c.vocab = INT64_C(1) << 24;
    REFUSES(l2l_layer_new(&out, &c, L2L_POOL_HOST), L2L_ERR_BUDGET, "host pool");
    c = config_of(L2L_LAYER_CLASSIFIER);
    c.dim = INT64_C(1) << 24, c.classes = INT64_C(1) << 24;
    REFUSES(l2l_layer_new(&out, &c, L2L_POOL_HOST), L2L_ERR_BUDGET, "host pool");
    c = config_of(L2L_LAYER_BLOCK);
    c.dim = INT64_C(1) << 24, c.heads = 1, c.mlp = 1; /* attn.qkv.weight: 3 x 2^48 */
    REFUSES(l2l_layer_new(&out, &c, L2L_POOL_HOST), L2L_ERR_INVALID, "2^48");
  }
  /* a device budget that runs out half-way through a block's parameters */
  l2l_pool_stats dev = stats_of(L2L_POOL_DEVICE);
  l2l_layer *on_device = layer_in(&base, L2L_POOL_DEVICE);
  if (CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, stats_of(L2L_POOL_DEVICE).current + 4096))) {
    REFUSES(l2l_layer_new(&out, &base, L2L_POOL_DEVICE), L2L_ERR_BUDGET, "device pool");
    REFUSES(l2l_layer_clone(&out, on_device), L2L_ERR_BUDGET, "device pool");
    CHECK_OK(l2l_pool_set_budget(L2L_POOL_DEVICE, dev.budget));
  }
  CHECK(out == SENTINEL(l2l_layer), "*out written by a refused l2l_layer_new");

  /* clone: out, and a live layer */
  l2l_layer *block = small_block();
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  const l2l_layer *nots[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, t),
                             AS(l2l_layer, l2l_layer_param(block, 0))};
  REFUSES(l2l_layer_clone(NULL, block), L2L_ERR_INVALID, "out");
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++)
    REFUSES(l2l_layer_clone(&out, nots[i]), L2L_ERR_INVALID, "layer");
  CHECK(out == SENTINEL(l2l_layer), "*out written by a refused l2l_layer_clone");

  /* tie: a live LM head and a live embedding of its vocab and dim, in one domain */
  l2l_layer_config hc = config_of(L2L_LAYER_LM_HEAD), ec = config_of(L2L_LAYER_EMBEDDING);
  l2l_layer *head = layer_in(&hc, L2L_POOL_HOST), *emb = layer_in(&ec, L2L_POOL_HOST);
  l2l_layer *dev_head = layer_in(&hc, L2L_POOL_DEVICE);
  l2l_layer_config wc = ec;
  wc.vocab = 12;
  l2l_layer *emb12 = layer_in(&wc, L2L_POOL_HOST);
  wc = ec, wc.dim = 16;
  l2l_layer *emb16 = layer_in(&wc, L2L_POOL_HOST);
  watch_layer(head), watch_layer(emb);
  struct records hr = records_of(head), er = records_of(emb);
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    REFUSES(l2l_layer_tie((l2l_layer *)nots[i], emb), L2L_ERR_INVALID, "head");
    REFUSES(l2l_layer_tie(head, (l2l_layer *)nots[i]), L2L_ERR_INVALID, "embedding");
  }
  REFUSES(l2l_layer_tie(block, emb), L2L_ERR_INVALID, "head must be");
  REFUSES(l2l_layer_tie(emb, emb), L2L_ERR_INVALID, "head must be");
  REFUSES(l2l_layer_tie(head, block), L2L_ERR_INVALID, "embedding must be");
  REFUSES(l2l_layer_tie(head, head), L2L_ERR_INVALID, "embedding must be");
  REFUSES(l2l_layer_tie(head, emb12), L2L_ERR_INVALID, "vocab 12");
  REFUSES(l2l_layer_tie(head, emb16), L2L_ERR_INVALID, "dim 16");
  REFUSES(l2l_layer_tie(dev_head, emb), L2L_ERR_INVALID, "pool");
  CHECK(same_records(head, &hr) && same_records(emb, &er), "records changed by a refused tie");
  unwatch();
  CHECK_OK(l2l_layer_tie(head, emb));
  CHECK(l2l_layer_param(head, l2l_layer_param_count(head) - 1) == l2l_layer_param(emb, 0),
        "the tie after refusals");

  /* destructors ignore what is no layer */
  uint64_t host = stats_of(L2L_POOL_HOST).current;
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) l2l_layer_free((l2l_layer *)nots[i]);
  CHECK(stats_of(L2L_POOL_HOST).current == host, "l2l_layer_free freed something");
  CHECK(l2l_tensor_numel(t) == 8 && l2l_param_name(l2l_layer_param(block, 0)) != NULL,
        "a tensor or a record was hurt by l2l_layer_free");
  CHECK_OK(l2l_layer_clone(&out, block));
  l2l_layer_free(out);
  l2l_tensor_free(t);
  l2l_layer *all[] = {on_device, block, head, emb, dev_head, emb12, emb16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) l2l_layer_free(all[i]);
}

/* Covers: l2l_layer_get_config, l2l_layer_set_memory, l2l_layer_rng_id,
   l2l_layer_set_rng_id, l2l_layer_param_count, l2l_layer_param, l2l_layer_nparams,
   l2l_layer_zero_grad, l2l_layer_memory_use, l2l_layer_name, l2l_param_name,
   l2l_param_value, l2l_param_grad, l2l_param_users, l2l_param_decays. */
TEST(misuse_layer_settings_and_accessors) {
  l2l_layer *block = small_block();
  l2l_layer_config ec = config_of(L2L_LAYER_EMBEDDING);
  l2l_layer *emb = layer_in(&ec, L2L_POOL_HOST);
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  unsigned char stack_bytes[256];
  memset(stack_bytes, 0, sizeof stack_bytes);
  const l2l_layer *nots[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, t),
                             AS(l2l_layer, l2l_layer_param(block, 0)), AS(l2l_layer, stack_bytes)};
  watch_layer(block);
  l2l_layer_config cfg, poisoned, before;
  memset(&poisoned, 0xa5, sizeof poisoned);
  CHECK_OK(l2l_layer_get_config(&before, block));
  uint32_t rng = l2l_layer_rng_id(block);
  REFUSES(l2l_layer_get_config(NULL, block), L2L_ERR_INVALID, "out");
  l2l_layer_memory mem, mem_poisoned;
  memset(&mem_poisoned, 0xa5, sizeof mem_poisoned);
  mem = mem_poisoned;
  REFUSES(l2l_layer_memory_use(NULL, block, 2, 3), L2L_ERR_INVALID, "out");
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    const l2l_layer *n = nots[i];
    cfg = poisoned;
    REFUSES(l2l_layer_get_config(&cfg, n), L2L_ERR_INVALID, "layer");
    CHECK(memcmp(&cfg, &poisoned, sizeof cfg) == 0, "*out written by a refused get_config");
    REFUSES(l2l_layer_set_memory((l2l_layer *)n, L2L_MEMORY_FRUGAL), L2L_ERR_INVALID, "layer");
    REFUSES(l2l_layer_set_rng_id((l2l_layer *)n, 5), L2L_ERR_INVALID, "layer");
    REFUSES(l2l_layer_zero_grad((l2l_layer *)n), L2L_ERR_INVALID, "layer");
    REFUSES(l2l_layer_memory_use(&mem, n, 2, 3), L2L_ERR_INVALID, "layer");
    CHECK(l2l_layer_rng_id(n) == 0 && l2l_layer_param_count(n) == -1 &&
              l2l_layer_param(n, 0) == NULL && l2l_layer_nparams(n) == -1 &&
              l2l_layer_name(n) == NULL,
          "case %zu: a layer accessor answered for what is no layer", i);
  }
  const int bad_modes[] = {2, -1, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_modes / sizeof bad_modes[0]; i++)
    REFUSES(l2l_layer_set_memory(block, (l2l_memory_mode)bad_modes[i]), L2L_ERR_INVALID, "memory");
  const uint32_t bad_ids[] = {1u << 24, (1u << 24) + 1, UINT32_MAX};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++)
    REFUSES(l2l_layer_set_rng_id(block, bad_ids[i]), L2L_ERR_INVALID, "rng_id");
  CHECK_OK(l2l_layer_get_config(&cfg, block));
  CHECK(memcmp(&cfg, &before, sizeof cfg) == 0 && l2l_layer_rng_id(block) == rng,
        "config or rng id changed by refusals");
  const int bad_index[] = {-1, 12, INT_MAX, INT_MIN, l2l_layer_param_count(block)};
  for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++)
    CHECK(l2l_layer_param(block, bad_index[i]) == NULL, "param %d of a block", bad_index[i]);
  /* memory_use: sizes 1 to 2^24, within an embedding's positions, a call a tensor can hold */
  const int64_t bad_sizes[] = {0, -1, INT64_MIN, INT64_MAX, (INT64_C(1) << 24) + 1};
  for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
    REFUSES(l2l_layer_memory_use(&mem, block, bad_sizes[i], 3), L2L_ERR_INVALID, "micro_batch");
    REFUSES(l2l_layer_memory_use(&mem, block, 2, bad_sizes[i]), L2L_ERR_INVALID, "seq");
  }
  REFUSES(l2l_layer_memory_use(&mem, emb, 2, 7), L2L_ERR_INVALID, "max_seq");
  REFUSES(l2l_layer_memory_use(&mem, block, INT64_C(1) << 24, INT64_C(1) << 24), L2L_ERR_INVALID,
          "2^48");
  REFUSES(l2l_layer_memory_use(&mem, block, INT64_C(1) << 20, INT64_C(1) << 14), L2L_ERR_INVALID,
          "2^48");
  CHECK(memcmp(&mem, &mem_poisoned, sizeof mem) == 0, "*out written by a refused memory_use");
  unwatch();
  CHECK_OK(l2l_layer_memory_use(&mem, block, 2, 3));
  CHECK_OK(l2l_layer_set_memory(block, L2L_MEMORY_FRUGAL));
  CHECK_OK(l2l_layer_set_rng_id(block, (1u << 24) - 1));
  CHECK_OK(l2l_layer_zero_grad(block));

  /* parameter records */
  const l2l_param *not_params[] = {NULL, JUNK(l2l_param), AS(l2l_param, block), AS(l2l_param, t),
                                   AS(l2l_param, stack_bytes)};
  for (size_t i = 0; i < sizeof not_params / sizeof not_params[0]; i++) {
    const l2l_param *p = not_params[i];
    CHECK(l2l_param_name(p) == NULL && l2l_param_value(p) == NULL && l2l_param_grad(p) == NULL &&
              l2l_param_users(p) == -1 && l2l_param_decays(p) == -1,
          "case %zu: a record accessor answered for what is no record", i);
  }
  CHECK(l2l_param_users(l2l_layer_param(block, 0)) == 1, "a record of one layer");
  l2l_tensor_free(t);
  l2l_layer_free(block);
  l2l_layer_free(emb);
}

/* The record of a layer by name (NULL if none). */
static l2l_param *param_named(const l2l_layer *layer, const char *name) {
  for (int i = 0; i < l2l_layer_param_count(layer); i++)
    if (strcmp(l2l_param_name(l2l_layer_param(layer, i)), name) == 0)
      return l2l_layer_param(layer, i);
  return NULL;
}

#define F32(...) poison(NEW(L2L_POOL_HOST, L2L_F32, __VA_ARGS__))

/* Covers: l2l_layer_forward, l2l_layer_backward, l2l_saved_free, l2l_saved_bytes (a block).
   Found here: a y, dx or dy sharing memory with the layer's own parameters or gradients was
   accepted (the call overwrote the weights it computed with); a first_sample near INT64_MAX
   overflowed int64 in the CPU attention's and the frugal backward's dropout indexes. */
TEST(misuse_block_calls) {
  enum { B = 2, S = 3, D = 8 };
  l2l_layer *block = small_block(), *copy = NULL;
  randomize_params(block);
  CHECK_OK(l2l_layer_clone(&copy, block));
  l2l_layer_config ec = config_of(L2L_LAYER_EMBEDDING);
  l2l_layer *emb = layer_in(&ec, L2L_POOL_HOST);
  l2l_tensor *x = check_randn(1.0, 3, B, S, D), *y = F32(B, S, D),
             *dy = check_randn(1.0, 3, B, S, D);
  l2l_tensor *dx = F32(B, S, D), *mask = ones_u8(DIMS(B, S));
  l2l_layer_batch bt = {.key_mask = mask, .seed = 7, .step = 3, .training = 1, .loss_scale = 1};
  watch_layer(block);
  WATCH(x, y, dy, dx, mask);
  const l2l_layer *nots[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, x),
                             AS(l2l_layer, l2l_layer_param(block, 0))};
  l2l_saved *saved = SENTINEL(l2l_saved);
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++)
    REFUSES(l2l_layer_forward(&saved, (l2l_layer *)nots[i], y, x, &bt), L2L_ERR_INVALID, "layer");
  REFUSES(l2l_layer_forward(&saved, block, y, x, NULL), L2L_ERR_INVALID, "batch");
  /* x: a live (B,S,D) f32 tensor in y's domain */
  l2l_tensor *xi = remake(x, L2L_POOL_HOST, L2L_I32), *x9 = F32(B, S, D + 1), *x2 = F32(B * S, D);
  l2l_tensor *x4 = F32(B, S, D, 1), *xdev = remake(x, L2L_POOL_DEVICE, L2L_F32);
  l2l_tensor *ydev = remake(y, L2L_POOL_DEVICE, L2L_F32);
  const l2l_tensor *bad_x[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, block), xi, x9, x2, x4};
  for (size_t i = 0; i < sizeof bad_x / sizeof bad_x[0]; i++)
    REFUSES(l2l_layer_forward(&saved, block, y, bad_x[i], &bt), L2L_ERR_INVALID, "x ");
  REFUSES(l2l_layer_forward(&saved, block, y, xdev, &bt), L2L_ERR_INVALID, "pool");
  REFUSES(l2l_layer_forward(&saved, block, ydev, xdev, &bt), L2L_ERR_INVALID, "parameter");
  l2l_layer_config bc = block_config();
  l2l_layer *dev_block = layer_in(&bc, L2L_POOL_DEVICE);
  REFUSES(l2l_layer_forward(&saved, dev_block, y, x, &bt), L2L_ERR_INVALID, "parameter");
  l2l_layer_free(dev_block);
  /* y: (B,S,D) f32: transposed, off by one, flattened, another dtype */
  l2l_tensor *yt = F32(S, B, D), *ys = F32(B, D, S), *y9 = F32(B, S, D + 1), *y2 = F32(B * S, D);
  l2l_tensor *yi = remake(y, L2L_POOL_HOST, L2L_I32);
  WATCH(yt, ys, y9, y2, yi);
  const l2l_tensor *bad_y[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, block), yt, ys, y9, y2, yi};
  for (size_t i = 0; i < sizeof bad_y / sizeof bad_y[0]; i++)
    REFUSES(l2l_layer_forward(&saved, block, (l2l_tensor *)bad_y[i], x, &bt), L2L_ERR_INVALID,
            "y ");
  /* y overlapping x, or the layer's own parameters or gradients */
  l2l_tensor *both = check_randn(1.0, 3, B + 1, S, D), *lo = view(both, 0, B),
             *hi = view(both, 1, B);
  WATCH(both);
  REFUSES(l2l_layer_forward(&saved, block, x, x, &bt), L2L_ERR_INVALID, "overlap");
  REFUSES(l2l_layer_forward(&saved, block, hi, lo, &bt), L2L_ERR_INVALID, "overlap");
  l2l_param *fc = param_named(block, "mlp.fc.weight"); /* (8,16): 128 = 2 x 8 x 8 */
  l2l_tensor *x88 = check_randn(1.0, 3, 2, 8, D);
  l2l_tensor *in_value = RESHAPED(l2l_param_value(fc), 2, 8, D);
  l2l_tensor *in_grad = RESHAPED(l2l_param_grad(fc), 2, 8, D);
  l2l_tensor *mask88 = ones_u8(DIMS(2, 8));
  l2l_layer_batch b88 = bt;
  b88.key_mask = mask88;
  REFUSES(l2l_layer_forward(&saved, block, in_value, x88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
  REFUSES(l2l_layer_forward(&saved, block, in_grad, x88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
  /* batch fields */
  l2l_layer_batch b = bt;
  const int64_t bad_first[] = {-1, INT64_MIN};
  for (size_t i = 0; i < 2; i++) {
    b = bt, b.first_sample = bad_first[i];
    REFUSES(l2l_layer_forward(&saved, block, y, x, &b), L2L_ERR_INVALID, "first_sample");
  }
  const int bad_training[] = {2, -1, INT_MIN};
  for (size_t i = 0; i < 3; i++) {
    b = bt, b.training = bad_training[i];
    REFUSES(l2l_layer_forward(&saved, block, y, x, &b), L2L_ERR_INVALID, "training");
  }
  l2l_tensor *mi = remake(mask, L2L_POOL_HOST, L2L_I32), *mt = ones_u8(DIMS(S, B));
  l2l_tensor *m4 = ones_u8(DIMS(B, S + 1)), *mdev = remake(mask, L2L_POOL_DEVICE, L2L_U8);
  const l2l_tensor *bad_masks[] = {JUNK(l2l_tensor), AS(l2l_tensor, block), mi, mt, m4, mdev};
  for (size_t i = 0; i < sizeof bad_masks / sizeof bad_masks[0]; i++) {
    b = bt, b.key_mask = bad_masks[i];
    REFUSES(l2l_layer_forward(&saved, block, y, x, &b), L2L_ERR_INVALID, "key_mask");
  }
  CHECK(saved == SENTINEL(l2l_saved), "*saved written by a refused forward");

  /* a good forward, then the backward's refusals */
  saved = NULL;
  l2l_saved *other = NULL, *emb_saved = NULL;
  l2l_tensor *y_copy = F32(B, S, D), *tokens = IDS(11, B, S);
  l2l_tensor *emb_y = F32(B, S, D);
  l2l_layer_batch eb = {.tokens = tokens, .training = 1, .loss_scale = 1};
  if (!CHECK_OK(l2l_layer_forward(&saved, block, y, x, &bt)) ||
      !CHECK_OK(l2l_layer_forward(&other, copy, y_copy, x, &bt)) ||
      !CHECK_OK(l2l_layer_forward(&emb_saved, emb, emb_y, NULL, &eb)))
    goto done;
  CHECK(l2l_saved_bytes(saved) > 0, "a standard block keeps something");
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++)
    REFUSES(l2l_layer_backward((l2l_layer *)nots[i], dx, dy, saved, &bt), L2L_ERR_INVALID, "layer");
  REFUSES(l2l_layer_backward(block, dx, dy, saved, NULL), L2L_ERR_INVALID, "batch");
  const l2l_saved *not_saved[] = {NULL, JUNK(l2l_saved), AS(l2l_saved, x), AS(l2l_saved, block)};
  for (size_t i = 0; i < sizeof not_saved / sizeof not_saved[0]; i++)
    REFUSES(l2l_layer_backward(block, dx, dy, (l2l_saved *)not_saved[i], &bt), L2L_ERR_INVALID,
            "saved");
  REFUSES(l2l_layer_backward(block, dx, dy, other, &bt), L2L_ERR_INVALID, "another");
  REFUSES(l2l_layer_backward(block, dx, dy, emb_saved, &bt), L2L_ERR_INVALID, "saved comes from");
  REFUSES(l2l_layer_backward(emb, NULL, dy, saved, &eb), L2L_ERR_INVALID, "saved comes from");
  for (size_t i = 0; i < sizeof bad_y / sizeof bad_y[0]; i++) {
    REFUSES(l2l_layer_backward(block, dx, bad_y[i], saved, &bt), L2L_ERR_INVALID, "dy ");
    REFUSES(l2l_layer_backward(block, (l2l_tensor *)bad_y[i], dy, saved, &bt), L2L_ERR_INVALID,
            "dx ");
  }
  REFUSES(l2l_layer_backward(block, dy, dy, saved, &bt), L2L_ERR_INVALID, "overlap");
  l2l_layer_memory mem;
  CHECK_OK(l2l_layer_memory_use(&mem, block, B, S));
  if (mem.input_kept > 0)
    REFUSES(l2l_layer_backward(block, x, dy, saved, &bt), L2L_ERR_INVALID, "saved state");
  l2l_tensor *dydev = remake(dy, L2L_POOL_DEVICE, L2L_F32),
             *dxdev = remake(dx, L2L_POOL_DEVICE, L2L_F32);
  REFUSES(l2l_layer_backward(block, dx, dydev, saved, &bt), L2L_ERR_INVALID, "pool");
  REFUSES(l2l_layer_backward(block, dxdev, dy, saved, &bt), L2L_ERR_INVALID, "pool");
  for (size_t i = 0; i < sizeof bad_masks / sizeof bad_masks[0]; i++) {
    b = bt, b.key_mask = bad_masks[i];
    REFUSES(l2l_layer_backward(block, dx, dy, saved, &b), L2L_ERR_INVALID, "key_mask");
  }
  b = bt, b.first_sample = -1;
  REFUSES(l2l_layer_backward(block, dx, dy, saved, &b), L2L_ERR_INVALID, "first_sample");
  /* the backward adds into the gradients: dx and dy must not be one of them */
  l2l_tensor *dy88 = check_randn(1.0, 3, 2, 8, D), *dx88 = F32(2, 8, D), *y88 = F32(2, 8, D);
  l2l_saved *s88 = NULL;
  WATCH(dy88, dx88);
  if (CHECK_OK(l2l_layer_forward(&s88, block, y88, x88, &b88))) {
    REFUSES(l2l_layer_backward(block, in_grad, dy88, s88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
    REFUSES(l2l_layer_backward(block, in_value, dy88, s88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
    REFUSES(l2l_layer_backward(block, dx88, in_grad, s88, &b88), L2L_ERR_INVALID, "mlp.fc.weight");
  }
  /* a layer whose config changed since the forward */
  CHECK_OK(l2l_layer_set_memory(block, L2L_MEMORY_FRUGAL));
  REFUSES(l2l_layer_backward(block, dx, dy, saved, &bt), L2L_ERR_STATE, "config changed");
  CHECK_OK(l2l_layer_set_memory(block, L2L_MEMORY_STANDARD));
  /* after the refusals the saved state serves its backward, once */
  CHECK_OK(l2l_layer_backward(block, dx, dy, saved, &bt));
  REFUSES(l2l_layer_backward(block, dx, dy, saved, &bt), L2L_ERR_STATE, "already");
  /* what is no saved state: freed as nothing, 0 bytes */
  unwatch();
  for (size_t i = 0; i < sizeof not_saved / sizeof not_saved[0]; i++) {
    CHECK(l2l_saved_bytes(not_saved[i]) == 0, "case %zu: bytes of what is no saved state", i);
    l2l_saved_free((l2l_saved *)not_saved[i]);
  }
  CHECK(l2l_tensor_numel(x) == B * S * D && l2l_layer_param_count(block) > 0,
        "l2l_saved_free hurt a tensor or a layer");
  l2l_saved_free(s88);
  /* the largest first_sample is a sample index like any: draw indexes wrap modulo 2^64 (in
     int64 they overflowed: UB in the CPU attention's dropout and the frugal backward's) */
  for (int mode = L2L_MEMORY_STANDARD; mode <= L2L_MEMORY_FRUGAL; mode++) {
    CHECK_OK(l2l_layer_set_memory(block, (l2l_memory_mode)mode));
    b = bt, b.first_sample = INT64_MAX;
    l2l_saved *late = NULL;
    if (CHECK_OK(l2l_layer_forward(&late, block, y, x, &b)))
      CHECK_OK(l2l_layer_backward(block, dx, dy, late, &b));
    l2l_saved_free(late);
  }
  CHECK_OK(l2l_layer_set_memory(block, L2L_MEMORY_STANDARD));
  FREE(dy88, dx88, y88, dydev, dxdev);
done:
  l2l_saved_free(saved);
  l2l_saved_free(other);
  l2l_saved_free(emb_saved);
  unwatch();
  FREE(x, y, dy, dx, mask, xi, x9, x2, x4, xdev, ydev, yt, ys, y9, y2, yi, both, lo, hi, x88,
       in_value, in_grad, mask88, mi, mt, m4, mdev, y_copy, tokens, emb_y);
  l2l_layer_free(block);
  l2l_layer_free(copy);
  l2l_layer_free(emb);
}

/* Covers: l2l_layer_forward and l2l_layer_backward of an embedding, an LM head and a
   classifier: the batch fields each reads. */
TEST(misuse_input_and_head_calls) {
  enum { B = 2, S = 3, D = 8, V = 11 };
  l2l_layer_config ec = config_of(L2L_LAYER_EMBEDDING), hc = config_of(L2L_LAYER_LM_HEAD);
  l2l_layer_config cc = config_of(L2L_LAYER_CLASSIFIER), tc = ec;
  tc.type_vocab = 2;
  l2l_layer *emb = layer_in(&ec, L2L_POOL_HOST), *head = layer_in(&hc, L2L_POOL_HOST);
  l2l_layer *cls = layer_in(&cc, L2L_POOL_HOST), *typed = layer_in(&tc, L2L_POOL_HOST);
  l2l_tensor *tokens = IDS(V, B, S), *targets = IDS(V, B, S), *labels = IDS(3, B);
  l2l_tensor *x = check_randn(1.0, 3, B, S, D), *y = F32(B, S, D), *losses = F32(B, S);
  l2l_tensor *closses = F32(B), *dx = F32(B, S, D), *dy = check_randn(1.0, 3, B, S, D);
  l2l_layer_batch eb = {.tokens = tokens, .training = 1, .loss_scale = 1};
  l2l_layer_batch hb = {.targets = targets, .training = 1, .loss_scale = 0.25f};
  l2l_layer_batch cb = {.targets = labels, .training = 1, .loss_scale = 0.5f};
  watch_layer(emb), watch_layer(head), watch_layer(cls);
  WATCH(tokens, targets, labels, x, y, losses, closses, dx, dy);
  l2l_saved *saved = SENTINEL(l2l_saved);
  l2l_layer_batch b;

  /* the embedding reads batch->tokens (and token types when it has a type table) */
  REFUSES(l2l_layer_forward(&saved, emb, y, x, &eb), L2L_ERR_INVALID, "x must be NULL");
  l2l_tensor *tf = remake(tokens, L2L_POOL_HOST, L2L_F32), *t1 = IDS(V, B * S);
  l2l_tensor *t7 = IDS(V, B, 7), *tt = IDS(V, S, B),
             *tdev = remake(tokens, L2L_POOL_DEVICE, L2L_I32);
  WATCH(tf, t1, t7, tt);
  const l2l_tensor *bad_tokens[] = {NULL, JUNK(l2l_tensor), AS(l2l_tensor, emb), tf, t1, tdev};
  for (size_t i = 0; i < sizeof bad_tokens / sizeof bad_tokens[0]; i++) {
    b = eb, b.tokens = bad_tokens[i];
    REFUSES(l2l_layer_forward(&saved, emb, y, NULL, &b), L2L_ERR_INVALID, "tokens");
  }
  b = eb, b.tokens = t7;
  l2l_tensor *y7 = F32(B, 7, D);
  WATCH(y7);
  REFUSES(l2l_layer_forward(&saved, emb, y7, NULL, &b), L2L_ERR_INVALID, "max_seq");
  b = eb, b.tokens = tt;
  REFUSES(l2l_layer_forward(&saved, emb, y, NULL, &b), L2L_ERR_INVALID, "y is");
  const int32_t bad_ids[] = {V, -1, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    l2l_tensor *bad = IDS(V, B, S);
    ((int32_t *)l2l_tensor_data(bad))[4] = bad_ids[i];
    WATCH(bad);
    b = eb, b.tokens = bad;
    REFUSES(l2l_layer_forward(&saved, emb, y, NULL, &b), L2L_ERR_INVALID, "batch->tokens[1][1]");
    l2l_tensor *types = IDS(2, B, S);
    ((int32_t *)l2l_tensor_data(types))[4] = bad_ids[i] == V ? 2 : bad_ids[i];
    b = eb, b.token_types = types;
    REFUSES(l2l_layer_forward(&saved, typed, y, NULL, &b), L2L_ERR_INVALID, "token_types[1][1]");
    l2l_tensor_free(types);
    unwatch();
    watch_layer(emb), watch_layer(head), watch_layer(cls);
    WATCH(tokens, targets, labels, x, y, losses, closses, dx, dy, tf, t1, t7, tt, y7);
    l2l_tensor_free(bad);
  }
  b = eb, b.token_types = tokens;
  REFUSES(l2l_layer_forward(&saved, emb, y, NULL, &b), L2L_ERR_INVALID, "token_types");
  REFUSES(l2l_layer_forward(&saved, typed, y, NULL, &eb), L2L_ERR_INVALID, "token_types");
  l2l_tensor *y9 = F32(B, S, D + 1);
  WATCH(y9);
  REFUSES(l2l_layer_forward(&saved, emb, y9, NULL, &eb), L2L_ERR_INVALID, "y is");

  /* heads read batch->targets: (B,S) for an LM head, (B) for a classifier, in [0, V) or -1 */
  l2l_tensor *gf = remake(targets, L2L_POOL_HOST, L2L_F32), *g4 = IDS(V, B, S + 1);
  l2l_tensor *gt = IDS(V, S, B), *gdev = remake(targets, L2L_POOL_DEVICE, L2L_I32);
  WATCH(gf, g4, gt);
  const l2l_tensor *bad_targets[] = {
      JUNK(l2l_tensor), AS(l2l_tensor, head), gf, g4, gt, gdev, labels};
  for (size_t i = 0; i < sizeof bad_targets / sizeof bad_targets[0]; i++) {
    b = hb, b.targets = bad_targets[i];
    REFUSES(l2l_layer_forward(&saved, head, losses, x, &b), L2L_ERR_INVALID, "targets");
  }
  const int32_t bad_classes[] = {V, -2, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof bad_classes / sizeof bad_classes[0]; i++) {
    l2l_tensor *bad = IDS(V, B, S), *badc = IDS(3, B);
    ((int32_t *)l2l_tensor_data(bad))[5] = bad_classes[i];
    ((int32_t *)l2l_tensor_data(badc))[1] = bad_classes[i] == V ? 3 : bad_classes[i];
    b = hb, b.targets = bad;
    REFUSES(l2l_layer_forward(&saved, head, losses, x, &b), L2L_ERR_INVALID, "targets[1][2]");
    b = cb, b.targets = badc;
    REFUSES(l2l_layer_forward(&saved, cls, closses, x, &b), L2L_ERR_INVALID, "targets[1]");
    FREE(bad, badc);
  }
  b = cb, b.targets = targets; /* (B,S) where a classifier reads (B) */
  REFUSES(l2l_layer_forward(&saved, cls, closses, x, &b), L2L_ERR_INVALID, "targets");
  l2l_tensor *logits = F32(B, S, V), *clogits = F32(B, 3);
  WATCH(logits, clogits);
  REFUSES(l2l_layer_forward(&saved, head, logits, x, &hb), L2L_ERR_INVALID, "y is");
  b = hb, b.targets = NULL;
  REFUSES(l2l_layer_forward(&saved, head, losses, x, &b), L2L_ERR_INVALID, "y is");
  REFUSES(l2l_layer_forward(&saved, cls, clogits, x, &cb), L2L_ERR_INVALID, "y is");
  REFUSES(l2l_layer_forward(&saved, cls, losses, x, &cb), L2L_ERR_INVALID, "y is");
  CHECK(saved == SENTINEL(l2l_saved), "*saved written by a refused forward");
  /* a head without targets keeps nothing: *saved is NULL */
  b = hb, b.targets = NULL;
  CHECK_OK(l2l_layer_forward(&saved, head, logits, x, &b));
  CHECK(saved == NULL, "a head without targets gave a saved state");

  /* backward: heads take no dy and need targets and a finite loss scale */
  l2l_saved *hs = NULL, *es = NULL, *cs = NULL;
  if (!CHECK_OK(l2l_layer_forward(&hs, head, losses, x, &hb)) ||
      !CHECK_OK(l2l_layer_forward(&es, emb, y, NULL, &eb)) ||
      !CHECK_OK(l2l_layer_forward(&cs, cls, closses, x, &cb)))
    goto done;
  REFUSES(l2l_layer_backward(head, dx, dy, hs, &hb), L2L_ERR_INVALID, "dy must be NULL");
  b = hb, b.targets = NULL;
  REFUSES(l2l_layer_backward(head, dx, NULL, hs, &b), L2L_ERR_INVALID, "targets");
  b = cb, b.targets = NULL;
  REFUSES(l2l_layer_backward(cls, dx, NULL, cs, &b), L2L_ERR_INVALID, "targets");
  const float bad_scales[] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < 3; i++) {
    b = hb, b.loss_scale = bad_scales[i];
    REFUSES(l2l_layer_backward(head, dx, NULL, hs, &b), L2L_ERR_INVALID, "loss_scale");
    b = cb, b.loss_scale = bad_scales[i];
    REFUSES(l2l_layer_backward(cls, dx, NULL, cs, &b), L2L_ERR_INVALID, "loss_scale");
  }
  b = hb, b.targets = gt;
  REFUSES(l2l_layer_backward(head, dx, NULL, hs, &b), L2L_ERR_INVALID, "targets");
  REFUSES(l2l_layer_backward(head, NULL, NULL, hs, &hb), L2L_ERR_INVALID, "dx is NULL");
  REFUSES(l2l_layer_backward(head, y9, NULL, hs, &hb), L2L_ERR_INVALID, "dx is");
  /* the embedding takes no dx, and the forward's tokens */
  REFUSES(l2l_layer_backward(emb, dx, dy, es, &eb), L2L_ERR_INVALID, "dx must be NULL");
  REFUSES(l2l_layer_backward(emb, NULL, NULL, es, &eb), L2L_ERR_INVALID, "dy is NULL");
  REFUSES(l2l_layer_backward(emb, NULL, y9, es, &eb), L2L_ERR_INVALID, "dy is");
  b = eb, b.tokens = tt;
  REFUSES(l2l_layer_backward(emb, NULL, dy, es, &b), L2L_ERR_INVALID, "tokens");
  b = eb, b.tokens = NULL;
  REFUSES(l2l_layer_backward(emb, NULL, dy, es, &b), L2L_ERR_INVALID, "tokens");
  unwatch();
  CHECK_OK(l2l_layer_backward(head, dx, NULL, hs, &hb));
  CHECK_OK(l2l_layer_backward(emb, NULL, dy, es, &eb));
  CHECK_OK(l2l_layer_backward(cls, dx, NULL, cs, &cb));
done:
  unwatch();
  l2l_saved_free(hs);
  l2l_saved_free(es);
  l2l_saved_free(cs);
  FREE(tokens, targets, labels, x, y, losses, closses, dx, dy, tf, t1, t7, tt, tdev, y7, y9, gf, g4,
       gt, gdev, logits, clogits);
  l2l_layer *all[] = {emb, head, cls, typed};
  for (size_t i = 0; i < 4; i++) l2l_layer_free(all[i]);
}

/* ---------------------------------------------------------------- custom layers */

/* user: NULL, or an int: 1 the forward fails, 2 the backward fails. */
static int identity_forward(void *user, l2l_layer *layer, l2l_tensor *y, const l2l_tensor *x,
                            const l2l_layer_batch *batch) {
  (void)layer, (void)batch;
  if (user != NULL && *(int *)user == 1) return 1;
  return l2l_tensor_copy(y, x) != L2L_OK;
}
static int identity_backward(void *user, l2l_layer *layer, l2l_tensor *dx, const l2l_tensor *dy,
                             const l2l_tensor *x, const l2l_layer_batch *batch) {
  (void)layer, (void)x, (void)batch;
  if (user != NULL && *(int *)user == 2) return 1;
  return l2l_tensor_copy(dx, dy) != L2L_OK;
}

/* Covers: l2l_layer_new_custom, and calls of a custom layer whose functions fail. */
TEST(misuse_custom_layers) {
  l2l_layer *out = SENTINEL(l2l_layer);
  l2l_custom_param good[2] = {{"scale", 1, {8}, 0.0f, 1.0f, 0}, {"w", 2, {8, 8}, 0.02f, 0, 1}};
  l2l_custom_forward_fn fw = identity_forward;
  l2l_custom_backward_fn bw = identity_backward;
  REFUSES(l2l_layer_new_custom(NULL, "c", 8, good, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
          L2L_ERR_INVALID, "out");
  const char *bad_names[] = {NULL, "", "a_name_of_24_characters_"};
  for (size_t i = 0; i < 3; i++)
    REFUSES(l2l_layer_new_custom(&out, bad_names[i], 8, good, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_INVALID, "name");
  const int64_t bad_dims[] = {0, -1, INT64_MIN, INT64_MAX, (INT64_C(1) << 24) + 1};
  for (size_t i = 0; i < sizeof bad_dims / sizeof bad_dims[0]; i++)
    REFUSES(l2l_layer_new_custom(&out, "c", bad_dims[i], good, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_INVALID, "dim");
  const int bad_counts[] = {-1, 13, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_counts / sizeof bad_counts[0]; i++)
    REFUSES(l2l_layer_new_custom(&out, "c", 8, good, bad_counts[i], fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_INVALID, "nparams");
  REFUSES(l2l_layer_new_custom(&out, "c", 8, NULL, 1, fw, bw, NULL, 1, L2L_POOL_HOST),
          L2L_ERR_INVALID, "nparams");
  REFUSES(l2l_layer_new_custom(&out, "c", 8, good, 2, NULL, bw, NULL, 1, L2L_POOL_HOST),
          L2L_ERR_INVALID, "forward");
  REFUSES(l2l_layer_new_custom(&out, "c", 8, good, 2, fw, NULL, NULL, 1, L2L_POOL_HOST),
          L2L_ERR_INVALID, "backward");
  for (int i = 0; i < BAD_POOLS; i++)
    REFUSES(
        l2l_layer_new_custom(&out, "c", 8, good, 2, fw, bw, NULL, 1, (l2l_pool_kind)bad_pools[i]),
        L2L_ERR_INVALID, "pool");
  struct {
    const char *needle;
    l2l_custom_param p;
  } bad[] = {
      {"name", {NULL, 1, {8}, 0, 1, 0}},
      {"name", {"", 1, {8}, 0, 1, 0}},
      {"name", {"a_name_of_24_characters_", 1, {8}, 0, 1, 0}},
      {"two parameters", {"scale", 1, {8}, 0, 1, 0}},
      {"ndim", {"p", 0, {8}, 0, 1, 0}},
      {"ndim", {"p", 5, {8, 1, 1, 1}, 0, 1, 0}},
      {"ndim", {"p", -1, {8}, 0, 1, 0}},
      {"dim 0", {"p", 1, {0}, 0, 1, 0}},
      {"dim 1", {"p", 2, {8, -1}, 0, 1, 0}},
      {"dim 3", {"p", 4, {1, 1, 1, INT64_MIN}, 0, 1, 0}},
      {"dim 0", {"p", 1, {(INT64_C(1) << 31) + 1}, 0, 1, 0}},
      {"init_std", {"p", 1, {8}, NAN, 1, 0}},
      {"init_std", {"p", 1, {8}, -1, 1, 0}},
      {"init_std", {"p", 1, {8}, INFINITY, 1, 0}},
      {"init_value", {"p", 1, {8}, 0, NAN, 0}},
      {"init_value", {"p", 1, {8}, 0, -INFINITY, 0}},
      {"decays", {"p", 1, {8}, 0, 1, 2}},
      {"decays", {"p", 1, {8}, 0, 1, -1}},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    l2l_custom_param list[2] = {good[0], bad[i].p};
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_layer_new_custom, parameter case %zu (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_layer_new_custom(&out, "c", 8, list, 2, fw, bw, NULL, 1, L2L_POOL_HOST)),
               L2L_ERR_INVALID, bad[i].needle, __FILE__, __LINE__, expr);
  }
  /* a parameter that cannot be made after one that was: refused, nothing kept */
  if (stats_of(L2L_POOL_HOST).budget != 0) {
    l2l_custom_param huge[2] = {good[0],
                                {"huge", 2, {INT64_C(1) << 31, INT64_C(1) << 16}, 0, 0, 0}};
    REFUSES(l2l_layer_new_custom(&out, "c", 8, huge, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_BUDGET, "host pool");
    l2l_custom_param wide[2] = {good[0],
                                {"wide", 4, {1 << 30, 1 << 30, 1 << 30, 1 << 30}, 0, 0, 0}};
    REFUSES(l2l_layer_new_custom(&out, "c", 8, wide, 2, fw, bw, NULL, 1, L2L_POOL_HOST),
            L2L_ERR_INVALID, "2^48");
  }
  CHECK(out == SENTINEL(l2l_layer), "*out written by a refused l2l_layer_new_custom");

  /* calls whose functions fail: BACKEND naming the layer, nothing kept */
  l2l_layer *failing = NULL, *fails_back = NULL, *fine = NULL;
  int forward_fails = 1, backward_fails = 2;
  if (!CHECK_OK(l2l_layer_new_custom(&failing, "failing", 8, good, 2, fw, bw, &forward_fails, 1,
                                     L2L_POOL_HOST)) ||
      !CHECK_OK(l2l_layer_new_custom(&fails_back, "fails_back", 8, good, 2, fw, bw, &backward_fails,
                                     1, L2L_POOL_HOST)) ||
      !CHECK_OK(l2l_layer_new_custom(&fine, "fine", 8, good, 2, fw, bw, NULL, 1, L2L_POOL_HOST)))
    goto done;
  CHECK(strcmp(l2l_layer_name(failing), "failing") == 0, "name \"%s\"", l2l_layer_name(failing));
  l2l_tensor *x = check_randn(1.0, 3, 2, 3, 8), *y = F32(2, 3, 8),
             *dy = check_randn(1.0, 3, 2, 3, 8);
  l2l_tensor *dx = F32(2, 3, 8);
  l2l_layer_batch bt = {.training = 1, .loss_scale = 1};
  l2l_saved *saved = SENTINEL(l2l_saved);
  watch_layer(failing), watch_layer(fails_back);
  WATCH(x, y, dy, dx);
  REFUSES(l2l_layer_forward(&saved, failing, y, x, &bt), L2L_ERR_BACKEND, "'failing'");
  CHECK(saved == NULL || saved == SENTINEL(l2l_saved), "*saved is a state after a failure");
  saved = NULL;
  if (CHECK_OK(l2l_layer_forward(&saved, fails_back, y, x, &bt))) {
    REFUSES(l2l_layer_backward(fails_back, dx, dy, saved, &bt), L2L_ERR_BACKEND, "'fails_back'");
    REFUSES(l2l_layer_backward(fine, dx, dy, saved, &bt), L2L_ERR_INVALID, "another");
  }
  l2l_saved_free(saved);
  saved = NULL;
  unwatch();
  if (CHECK_OK(l2l_layer_forward(&saved, fine, y, x, &bt)))
    CHECK_OK(l2l_layer_backward(fine, dx, dy, saved, &bt));
  l2l_saved_free(saved);
  FREE(x, y, dy, dx);
done:
  l2l_layer_free(failing);
  l2l_layer_free(fails_back);
  l2l_layer_free(fine);
}

/* ---------------------------------------------------------------- optimizers */

/* Covers: l2l_optimizer_state_arrays, l2l_state_array_bytes (and what they answer for good
   configs). */
TEST(misuse_optimizer_state_arrays) {
  l2l_relay_config rc;
  l2l_relay_config_default(&rc);
  l2l_optimizer_config good = rc.optimizer;   /* AdamW */
  int out = -77;
  REFUSES(l2l_optimizer_state_arrays(NULL, &good), L2L_ERR_INVALID, "out");
  REFUSES(l2l_optimizer_state_arrays(&out, NULL), L2L_ERR_INVALID, "config");
  l2l_optimizer_config bad = good;
  bad.kind = (l2l_optimizer_kind)7;
  REFUSES(l2l_optimizer_state_arrays(&out, &bad), L2L_ERR_INVALID, "kind 7");
  bad = good;
  bad.lr = NAN;
  REFUSES(l2l_optimizer_state_arrays(&out, &bad), L2L_ERR_INVALID, "lr");
  CHECK(out == -77, "a refusal wrote %d", out);
  CHECK(l2l_optimizer_state_arrays(&out, &good) == L2L_OK && out == 2, "AdamW: %d arrays", out);
  l2l_optimizer_config sgd = good;
  sgd.kind = L2L_OPTIMIZER_SGD;
  sgd.momentum = 0;
  CHECK(l2l_optimizer_state_arrays(&out, &sgd) == L2L_OK && out == 0, "SGD: %d arrays", out);
  sgd.momentum = 0.9f;
  CHECK(l2l_optimizer_state_arrays(&out, &sgd) == L2L_OK && out == 1, "SGD with momentum: %d arrays", out);
  bad = good;
  bad.state = (l2l_state_precision)3;
  REFUSES(l2l_optimizer_state_arrays(&out, &bad), L2L_ERR_INVALID, "state 3");
  uint64_t bytes = 77;
  REFUSES(l2l_state_array_bytes(NULL, L2L_STATE_F32, 5), L2L_ERR_INVALID, "out");
  REFUSES(l2l_state_array_bytes(&bytes, (l2l_state_precision)-1, 5), L2L_ERR_INVALID, "state -1");
  REFUSES(l2l_state_array_bytes(&bytes, L2L_STATE_BF16, -5), L2L_ERR_INVALID, "n must be");
  REFUSES(l2l_state_array_bytes(&bytes, L2L_STATE_BF16, INT64_MAX), L2L_ERR_INVALID, "n must be");
  CHECK(bytes == 77, "a refusal wrote %llu", (unsigned long long)bytes);
  /* 4, 2 and 1 bytes an element, 8 bits with a scale a block after its padded codes */
  int64_t n = 2 * L2L_STATE_BLOCK + 3;
  CHECK(l2l_state_array_bytes(&bytes, L2L_STATE_F32, n) == L2L_OK && bytes == 4 * (uint64_t)n, "f32");
  CHECK(l2l_state_array_bytes(&bytes, L2L_STATE_BF16, n) == L2L_OK && bytes == 2 * (uint64_t)n, "bf16");
  CHECK(l2l_state_array_bytes(&bytes, L2L_STATE_8BIT, n) == L2L_OK && bytes == (uint64_t)n + 1 + 3 * 4,
        "8bit: %llu bytes", (unsigned long long)bytes);
}

/* Covers: l2l_state_array_check (its value checks: test_quant's quant_state_check). */
TEST(misuse_state_array_check) {
  l2l_relay_config rc;
  l2l_relay_config_default(&rc);
  l2l_optimizer_config adam = rc.optimizer;   /* AdamW, f32 state */
  int64_t n = 2 * L2L_STATE_BLOCK + 3;
  l2l_tensor *f32 = NEW(L2L_POOL_HOST, L2L_F32, n), *bf16 = NEW(L2L_POOL_HOST, L2L_BF16, n);
  l2l_tensor *u8 = NEW(L2L_POOL_HOST, L2L_U8, n + 1 + 3 * 4), *i32 = NEW(L2L_POOL_HOST, L2L_I32, n);
  for (int i = 0; i < 3; i++) CHECK_OK(l2l_tensor_fill((l2l_tensor *[]){f32, bf16, u8}[i], 0.0));
  WATCH(f32, bf16, u8, i32);
  REFUSES(l2l_state_array_check(NULL, &adam, 0, n), L2L_ERR_INVALID, "array");
  REFUSES(l2l_state_array_check(JUNK(l2l_tensor), &adam, 0, n), L2L_ERR_INVALID, "array");
  REFUSES(l2l_state_array_check(f32, NULL, 0, n), L2L_ERR_INVALID, "optimizer");
  l2l_optimizer_config bad = adam;
  bad.beta2 = NAN;
  REFUSES(l2l_state_array_check(f32, &bad, 0, n), L2L_ERR_INVALID, "beta2");
  bad = adam;
  bad.kind = (l2l_optimizer_kind)9;
  REFUSES(l2l_state_array_check(f32, &bad, 0, n), L2L_ERR_INVALID, "kind 9");
  const int which[] = {-1, 2, INT32_MAX, INT32_MIN};
  for (size_t i = 0; i < 4; i++)
    REFUSES(l2l_state_array_check(f32, &adam, which[i], n), L2L_ERR_INVALID, "which");
  l2l_optimizer_config sgd = adam;
  sgd.kind = L2L_OPTIMIZER_SGD;
  sgd.momentum = 0;   /* no state at all */
  REFUSES(l2l_state_array_check(f32, &sgd, 0, n), L2L_ERR_INVALID, "which");
  const int64_t sizes[] = {0, -1, INT64_MIN, INT64_MAX, n - 1, n + 1};
  for (size_t i = 0; i < 6; i++)
    REFUSES(l2l_state_array_check(f32, &adam, 0, sizes[i]), L2L_ERR_INVALID, "n");
  REFUSES(l2l_state_array_check(u8, &adam, 0, n + 5), L2L_ERR_INVALID, "elements");
  REFUSES(l2l_state_array_check(i32, &adam, 0, n), L2L_ERR_INVALID, "i32");
  /* zeros are state: every precision, either array */
  for (int a = 0; a < 2; a++) {
    CHECK_OK(l2l_state_array_check(f32, &adam, a, n));
    CHECK_OK(l2l_state_array_check(bf16, &adam, a, n));
    CHECK_OK(l2l_state_array_check(u8, &adam, a, n));
  }
  unwatch();
  l2l_tensor_free(f32), l2l_tensor_free(bf16), l2l_tensor_free(u8), l2l_tensor_free(i32);
}

/* ---------------------------------------------------------------- schedules */

/* Covers: l2l_schedule_lr. */
TEST(misuse_schedule) {
  const l2l_schedule_config good = {L2L_SCHEDULE_COSINE, 10, 100, 0.1f};
  double out = 12345.0;
  REFUSES(l2l_schedule_lr(NULL, &good, 1, 1), L2L_ERR_INVALID, "out");
  REFUSES(l2l_schedule_lr(&out, NULL, 1, 1), L2L_ERR_INVALID, "schedule");
  const int64_t bad_t[] = {0, -1, INT64_MIN};
  for (size_t i = 0; i < 3; i++)
    REFUSES(l2l_schedule_lr(&out, &good, 1, bad_t[i]), L2L_ERR_INVALID, "t must");
  const double bad_lr[] = {-1, NAN, INFINITY, -INFINITY, -DBL_MIN};
  for (size_t i = 0; i < sizeof bad_lr / sizeof bad_lr[0]; i++)
    REFUSES(l2l_schedule_lr(&out, &good, bad_lr[i], 1), L2L_ERR_INVALID, "base_lr");
  struct {
    const char *needle;
    l2l_schedule_config s;
  } bad[] = {
      {"kind 3", {(l2l_schedule_kind)3, 0, 10, 0}},
      {"kind -1", {(l2l_schedule_kind)-1, 0, 10, 0}},
      {"warmup", {L2L_SCHEDULE_CONSTANT, -1, 0, 1}},
      {"warmup", {L2L_SCHEDULE_LINEAR, INT64_MIN, 10, 0}},
      {"total", {L2L_SCHEDULE_COSINE, 10, 10, 0}},
      {"total", {L2L_SCHEDULE_COSINE, 10, 9, 0}},
      {"total", {L2L_SCHEDULE_LINEAR, 0, INT64_MIN, 0}},
      {"total", {L2L_SCHEDULE_LINEAR, INT64_MAX, INT64_MAX, 0}},
      {"final_ratio", {L2L_SCHEDULE_COSINE, 0, 10, 1.5f}},
      {"final_ratio", {L2L_SCHEDULE_LINEAR, 0, 10, -0.1f}},
      {"final_ratio", {L2L_SCHEDULE_LINEAR, 0, 10, NAN}},
      {"final_ratio", {L2L_SCHEDULE_CONSTANT, 0, 0, INFINITY}},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    REFUSES(l2l_schedule_lr(&out, &bad[i].s, 1, 1), L2L_ERR_INVALID, bad[i].needle);
  CHECK(out == 12345.0, "*out written by a refusal: %g", out);
  /* the ends of the ranges are good calls */
  CHECK_OK(l2l_schedule_lr(&out, &good, 1, INT64_MAX));
  CHECK(fabs(out - 0.1) < 1e-6, "after total: %g, want the final ratio", out);
  const l2l_schedule_config late = {L2L_SCHEDULE_LINEAR, 0, INT64_MAX, 0};
  CHECK_OK(l2l_schedule_lr(&out, &late, 1, INT64_MAX - 1));
  CHECK(isfinite(out) && out >= 0 && out <= 1, "at INT64_MAX - 1 of INT64_MAX: %g", out);
  const l2l_schedule_config warm = {L2L_SCHEDULE_CONSTANT, INT64_MAX, -5, 1};
  CHECK_OK(l2l_schedule_lr(&out, &warm, 2, INT64_MAX));
  CHECK(out == 2.0, "the last warm-up step: %g", out);
}

/* ---------------------------------------------------------------- the relay */

static l2l_relay_config relay_config(void) {
  l2l_relay_config c;
  l2l_relay_config_default(&c);
  c.micro_batch = 2;
  c.optimizer_threads = 2;
  c.optimizer.lr = 1e-2f;
  c.seed = 5;
  return c;
}

static l2l_relay_batch batch_of(const struct data *d) {
  return (l2l_relay_batch){d->tokens, d->targets, d->types, d->key_mask, NULL};
}

static void watch_model(const struct model *m) {
  for (int i = 0; i < m->n; i++) watch_layer(m->layer[i]);
}

/* Covers: l2l_relay_config_default, l2l_relay_config_check, l2l_relay_new, l2l_relay_free, l2l_relay_layer_count,
   l2l_relay_layer, l2l_relay_frozen, l2l_relay_stash, l2l_relay_inner. */
TEST(misuse_relay_new_and_accessors) {
  struct shape g = gpt_shape();
  struct model m;
  model_new(&m, &g);
  l2l_relay_config_default(NULL); /* nothing to write: nothing happens */
  l2l_relay_config base = relay_config();
  l2l_relay *out = SENTINEL(l2l_relay);
  watch_model(&m);
  REFUSES(l2l_relay_new(NULL, m.layer, m.n, &base), L2L_ERR_INVALID, "out");
  REFUSES(l2l_relay_new(&out, m.layer, m.n, NULL), L2L_ERR_INVALID, "config");
  REFUSES(l2l_relay_new(&out, NULL, 3, &base), L2L_ERR_INVALID, "layers");
  REFUSES(l2l_relay_new(&out, m.layer, -1, &base), L2L_ERR_INVALID, "nlayers");
  REFUSES(l2l_relay_new(&out, m.layer, INT_MIN, &base), L2L_ERR_INVALID, "nlayers");
  static struct {
    const char *needle;
    l2l_relay_config c;
  } bad[64];
  int nb = 0;
#define BAD(needle_, stmt)              \
  do {                                  \
    bad[nb].needle = (needle_);         \
    bad[nb].c = base;                   \
    {                                   \
      l2l_relay_config *c = &bad[nb].c; \
      stmt;                             \
    }                                   \
    nb++;                               \
  } while (0)
  BAD("micro_batch", c->micro_batch = INT64_MIN);
  BAD("stash", c->stash = (l2l_stash_policy)99);
  BAD("stash", c->stash = (l2l_stash_policy)INT_MIN);
  BAD("recompute_every", (c->stash = L2L_STASH_RECOMPUTE, c->recompute_every = INT_MIN));
  BAD("inner", c->inner = (l2l_inner_policy)-1);
  BAD("kind", c->optimizer.kind = (l2l_optimizer_kind)-1);
  BAD("lr", c->optimizer.lr = INFINITY);
  BAD("eps", c->optimizer.eps = NAN);
  BAD("momentum", c->optimizer.momentum = NAN);
  BAD("kind", c->schedule.kind = (l2l_schedule_kind)-1);
  BAD("warmup", c->schedule.warmup = INT64_MIN);
  BAD("final_ratio", c->schedule.final_ratio = NAN);
  BAD("clip_global_norm", c->clip_global_norm = INFINITY);
  BAD("clip_layer_norm", c->clip_layer_norm = NAN);
  BAD("accumulate", c->accumulate = INT_MIN);
  BAD("optimizer_threads", c->optimizer_threads = 1025);
  BAD("optimizer_threads", c->optimizer_threads = INT_MAX);
  BAD("optimizer_threads", c->optimizer_threads = INT_MIN);
  BAD("loss_scale", c->loss_scale = NAN);
  BAD("loss_scale", c->loss_scale = 0x1p101f);
  BAD("loss_scale_window", (c->loss_scale = 1024, c->loss_scale_window = INT_MIN));
  BAD("param_slots", c->param_slots = INT_MAX);
  BAD("param_slots", c->param_slots = INT_MIN);
  BAD("precision", c->precision = (l2l_dtype)99);
  BAD("precision", c->precision = (l2l_dtype)-1);
  BAD("grad_precision", c->grad_precision = (l2l_dtype)99);
  BAD("nonfinite_error", c->nonfinite_error = 2);
  BAD("nonfinite_error", c->nonfinite_error = -1);
  BAD("spill_dir", c->spill_dir = "");
  BAD("state", c->optimizer.state = (l2l_state_precision)3);
  BAD("master", c->master = L2L_F16);
  BAD("master", c->master = (l2l_dtype)-1);
  BAD("master bf16 needs precision bf16", (c->master = L2L_BF16, c->precision = L2L_F32));
#undef BAD
  for (int i = 0; i < nb; i++) {
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_relay_new config case %d (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_relay_new(&out, m.layer, m.n, &bad[i].c)), L2L_ERR_INVALID,
               bad[i].needle, __FILE__, __LINE__, expr);
    snprintf(expr, sizeof expr, "l2l_relay_config_check case %d (%s)", i, bad[i].needle);
    refused_at((arm(), l2l_relay_config_check(&bad[i].c)), L2L_ERR_INVALID, bad[i].needle,
               __FILE__, __LINE__, expr);
  }
  REFUSES(l2l_relay_config_check(NULL), L2L_ERR_INVALID, "config");
  CHECK_OK(l2l_relay_config_check(&base));
  /* layer lists: what is no layer, a layer twice, a layer that does not fit */
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  struct shape wide = g;
  wide.D = 30, wide.H = 3;
  l2l_layer *misfit = model_block_new(&wide, 0);
  l2l_layer_config dc = model_layer_config(&g, L2L_LAYER_BLOCK);
  l2l_layer *on_device = layer_in(&dc, L2L_POOL_DEVICE);
  l2l_layer *list[MAX_LAYERS + 1];
  const struct {
    l2l_layer *layer;
    const char *needle;
  } intruders[] = {{NULL, "layers[1]"},
                   {JUNK(l2l_layer), "layers[1]"},
                   {AS(l2l_layer, t), "layers[1]"},
                   {AS(l2l_layer, l2l_layer_param(m.layer[1], 0)), "layers[1]"},
                   {m.layer[0], "already"},
                   {misfit, "dim"},
                   {on_device, "pool"}};
  for (size_t i = 0; i < sizeof intruders / sizeof intruders[0]; i++) {
    list[0] = m.layer[0], list[1] = intruders[i].layer, list[2] = m.layer[m.n - 1];
    REFUSES(l2l_relay_new(&out, list, 3, &base), L2L_ERR_INVALID, intruders[i].needle);
    /* refused after the whole model joined, with 16-bit staging copies in the pinned pool */
    memcpy(list, m.layer, (size_t)m.n * sizeof *list);
    list[m.n] = intruders[i].layer;
    l2l_relay_config half = base;
    half.precision = L2L_BF16;
    REFUSES(l2l_relay_new(&out, list, m.n + 1, &half), L2L_ERR_INVALID, "layers[");
  }
  CHECK(out == SENTINEL(l2l_relay), "*out written by a refused l2l_relay_new");
  /* the layers of refused relays belong to none: a relay takes them */
  l2l_relay *r = NULL;
  if (!CHECK_OK(l2l_relay_new(&r, m.layer, m.n, &base))) goto done;

  const l2l_relay *nots[] = {NULL, JUNK(l2l_relay), AS(l2l_relay, m.layer[1]), AS(l2l_relay, t)};
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    const l2l_relay *n = nots[i];
    CHECK(l2l_relay_layer_count(n) == -1 && l2l_relay_layer(n, 0) == NULL &&
              l2l_relay_frozen(n, 0) == -1 && l2l_relay_stash(n, 1) == -1 &&
              l2l_relay_inner(n, 0) == -1,
          "case %zu: a relay accessor answered for what is no relay", i);
  }
  const int bad_index[] = {-1, m.n, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++)
    CHECK(l2l_relay_layer(r, bad_index[i]) == NULL && l2l_relay_frozen(r, bad_index[i]) == -1 &&
              l2l_relay_inner(r, bad_index[i]) == -1 && l2l_relay_stash(r, bad_index[i]) == -1,
          "index %d of a relay of %d layers answered", bad_index[i], m.n);
  CHECK(l2l_relay_stash(r, 0) == -1, "boundary 0 (before the first layer) has a policy");
  /* which relay holds a layer: none for what is no layer */
  const l2l_layer *not_layers[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, r), AS(l2l_layer, t)};
  for (size_t i = 0; i < sizeof not_layers / sizeof not_layers[0]; i++)
    CHECK(l2l_layer_relay(not_layers[i]) == NULL, "case %zu: no layer is in a relay", i);
  CHECK(l2l_layer_relay(m.layer[1]) == r, "the relay's layer is not in it");
  /* destructors ignore what is no relay */
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) l2l_relay_free((l2l_relay *)nots[i]);
  CHECK(l2l_relay_layer_count(r) == m.n && l2l_layer_param_count(m.layer[1]) > 0 &&
            l2l_tensor_numel(t) == 8,
        "l2l_relay_free hurt a relay, a layer or a tensor");
  l2l_relay_free(r);
done:
  unwatch();
  l2l_tensor_free(t);
  l2l_layer_free(misfit);
  l2l_layer_free(on_device);
  model_free(&m);
}

/* A relay over a fresh GPT model, with two good steps behind it (optimizer state exists). */
struct rig {
  struct shape g;
  struct model m;
  struct data d;
  l2l_relay *r;
};

static bool rig_new(struct rig *rig, const l2l_relay_config *c) {
  rig->g = gpt_shape();
  model_new(&rig->m, &rig->g);
  data_new(&rig->d, &rig->g, 4, rig->g.S, 1, 1.0);
  rig->r = NULL;
  if (!CHECK_OK(l2l_relay_new(&rig->r, rig->m.layer, rig->m.n, c))) return false;
  l2l_relay_batch b = batch_of(&rig->d);
  double loss;
  return CHECK_OK(l2l_relay_step(&loss, rig->r, &b)) &&
         CHECK_OK(l2l_relay_step(&loss, rig->r, &b)) && CHECK_OK(l2l_relay_sync(rig->r));
}

static void rig_free(struct rig *rig) {
  l2l_relay_free(rig->r);
  data_free(&rig->d);
  model_free(&rig->m);
}

/* Covers: the run argument of every relay call; l2l_relay_insert, l2l_relay_remove,
   l2l_relay_replace, l2l_relay_set_frozen, l2l_relay_set_stash, l2l_relay_set_inner,
   l2l_relay_set_micro_batch, l2l_relay_set_device_budget, l2l_relay_set_host_budget,
   l2l_relay_sync. */
TEST(misuse_relay_model_changes) {
  struct rig rig, other;
  l2l_relay_config c = relay_config();
  bool ready = rig_new(&rig, &c);
  ready &= rig_new(&other, &c);
  if (!ready) {
    rig_free(&rig);
    rig_free(&other);
    return;
  }
  l2l_relay *r = rig.r;
  const int n = rig.m.n;
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  l2l_layer *extra = model_block_new(&rig.g, 0);
  struct shape wide = rig.g;
  wide.D = 30, wide.H = 3;
  l2l_layer *misfit = model_block_new(&wide, 0);
  l2l_layer_config dc = model_layer_config(&rig.g, L2L_LAYER_BLOCK);
  l2l_layer *on_device = layer_in(&dc, L2L_POOL_DEVICE);
  watch_model(&rig.m);
  watch_layer(extra);
  l2l_relay_batch b = batch_of(&rig.d);
  l2l_param *p = l2l_layer_param(rig.m.layer[1], 0);
  double loss = 12345.0;
  int64_t count = -77;
  l2l_tensor *state = SENTINEL(l2l_tensor);
  l2l_relay_stats st;
  l2l_relay_event ev[4];

  /* every call that takes a relay: NULL and what is no relay */
  const l2l_relay *nots[] = {NULL, JUNK(l2l_relay), AS(l2l_relay, rig.m.layer[1]), AS(l2l_relay, t),
                             AS(l2l_relay, p)};
  for (size_t i = 0; i < sizeof nots / sizeof nots[0]; i++) {
    l2l_relay *x = (l2l_relay *)nots[i];
    REFUSES(l2l_relay_insert(x, 1, extra), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_remove(x, 1), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_replace(x, 1, extra), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_frozen(x, 1, 1), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_stash(x, 1, L2L_STASH_DEVICE), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_inner(x, 1, L2L_INNER_KEEP), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_micro_batch(x, 3), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_device_budget(x, 3), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_set_host_budget(x, 3), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_sync(x), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_step(&loss, x, &b), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_evaluate(&loss, x, &b), L2L_ERR_INVALID, "run");
    uint64_t peak_out = 7;
    REFUSES(l2l_relay_step_peak(&peak_out, x, 2, 4, 0, 0), L2L_ERR_INVALID, "run");
    CHECK(peak_out == 7, "a refused step_peak wrote its output");
    REFUSES(l2l_relay_get_stats(&st, x), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_events(ev, x, 0, 1), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_param_state(&state, x, p, 0), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_param_updates(&count, x, p), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_restore_param(x, p, 0, NULL, NULL), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_restore_progress(x, 1, 1), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_restore_loss_scale(x, 1, 0, 0), L2L_ERR_INVALID, "run");
  }
  CHECK(loss == 12345.0 && count == -77 && state == SENTINEL(l2l_tensor),
        "an output written by a call refused for its run");

  /* the model's changes: indexes, layers, policies */
  int stash[MAX_LAYERS], inner[MAX_LAYERS], frozen[MAX_LAYERS];
  for (int i = 0; i < n; i++)
    stash[i] = l2l_relay_stash(r, i), inner[i] = l2l_relay_inner(r, i),
    frozen[i] = l2l_relay_frozen(r, i);
  const int bad_insert[] = {-1, n + 1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_insert / sizeof bad_insert[0]; i++)
    REFUSES(l2l_relay_insert(r, bad_insert[i], extra), L2L_ERR_INVALID, "index");
  const int bad_index[] = {-1, n, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++) {
    REFUSES(l2l_relay_remove(r, bad_index[i]), L2L_ERR_INVALID, "index");
    REFUSES(l2l_relay_replace(r, bad_index[i], extra), L2L_ERR_INVALID, "index");
    REFUSES(l2l_relay_set_frozen(r, bad_index[i], 1), L2L_ERR_INVALID, "index");
    REFUSES(l2l_relay_set_inner(r, bad_index[i], L2L_INNER_KEEP), L2L_ERR_INVALID, "index");
  }
  const l2l_layer *not_layers[] = {NULL, JUNK(l2l_layer), AS(l2l_layer, t), AS(l2l_layer, p),
                                   AS(l2l_layer, r)};
  for (size_t i = 0; i < sizeof not_layers / sizeof not_layers[0]; i++) {
    REFUSES(l2l_relay_insert(r, 1, (l2l_layer *)not_layers[i]), L2L_ERR_INVALID, "layer");
    REFUSES(l2l_relay_replace(r, 1, (l2l_layer *)not_layers[i]), L2L_ERR_INVALID, "layer");
  }
  REFUSES(l2l_relay_insert(r, 1, rig.m.layer[2]), L2L_ERR_INVALID, "already");
  REFUSES(l2l_relay_replace(r, 1, rig.m.layer[2]), L2L_ERR_INVALID, "already");
  REFUSES(l2l_relay_insert(r, 1, other.m.layer[1]), L2L_ERR_STATE, "another relay");
  REFUSES(l2l_relay_replace(r, 1, other.m.layer[1]), L2L_ERR_STATE, "another relay");
  REFUSES(l2l_relay_insert(r, 1, misfit), L2L_ERR_INVALID, "dim");
  REFUSES(l2l_relay_replace(r, 1, misfit), L2L_ERR_INVALID, "dim");
  REFUSES(l2l_relay_insert(r, 1, on_device), L2L_ERR_INVALID, "pool");
  REFUSES(l2l_relay_replace(r, 1, on_device), L2L_ERR_INVALID, "pool");
  const int bad_flags[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_flags / sizeof bad_flags[0]; i++)
    REFUSES(l2l_relay_set_frozen(r, 1, bad_flags[i]), L2L_ERR_INVALID, "frozen");
  const int bad_boundary[] = {0, n, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_boundary / sizeof bad_boundary[0]; i++)
    REFUSES(l2l_relay_set_stash(r, bad_boundary[i], L2L_STASH_DEVICE), L2L_ERR_INVALID, "boundary");
  const int bad_policy[] = {3, -1, 99, INT_MIN};
  for (size_t i = 0; i < sizeof bad_policy / sizeof bad_policy[0]; i++) {
    REFUSES(l2l_relay_set_stash(r, 1, (l2l_stash_policy)bad_policy[i]), L2L_ERR_INVALID, "policy");
    REFUSES(l2l_relay_set_inner(r, 1, (l2l_inner_policy)bad_policy[i]), L2L_ERR_INVALID, "policy");
  }
  const int64_t bad_micro[] = {0, -1, INT64_MIN};
  for (size_t i = 0; i < 3; i++)
    REFUSES(l2l_relay_set_micro_batch(r, bad_micro[i]), L2L_ERR_INVALID, "micro_batch");
  /* all as it was, and the relay still trains */
  CHECK(l2l_relay_layer_count(r) == n, "layer count %d, want %d", l2l_relay_layer_count(r), n);
  bool same = true;
  for (int i = 0; i < n; i++)
    same &= l2l_relay_layer(r, i) == rig.m.layer[i] && l2l_relay_stash(r, i) == stash[i] &&
            l2l_relay_inner(r, i) == inner[i] && l2l_relay_frozen(r, i) == frozen[i];
  CHECK(same, "the model or its policies changed by refusals");
  unwatch();
  CHECK_OK(l2l_relay_step(&loss, r, &b));
  CHECK(isfinite(loss), "loss %g after refusals", loss);
  CHECK_OK(l2l_relay_set_micro_batch(r, INT64_MAX)); /* more than the batch: one micro-batch */
  CHECK_OK(l2l_relay_step(&loss, r, &b));
  CHECK_OK(l2l_relay_sync(r));
  l2l_tensor_free(t);
  l2l_layer_free(extra);
  l2l_layer_free(misfit);
  l2l_layer_free(on_device);
  rig_free(&other);
  rig_free(&rig);
}

/* Covers: l2l_relay_step, l2l_relay_evaluate, l2l_relay_step_peak, l2l_relay_get_stats,
   l2l_relay_events. */
TEST(misuse_relay_steps_stats_and_events) {
  struct rig rig;
  l2l_relay_config c = relay_config();
  if (!rig_new(&rig, &c)) {
    rig_free(&rig);
    return;
  }
  l2l_relay *r = rig.r;
  const int n = rig.m.n;
  l2l_relay_stats before, st, poisoned;
  CHECK_OK(l2l_relay_get_stats(&before, r));
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  l2l_tensor *tt = IDS((int32_t)rig.g.V, rig.g.S, 4);
  watch_model(&rig.m);
  WATCH(rig.d.tokens, rig.d.targets, rig.d.key_mask);
  double loss = 12345.0;
  l2l_relay_batch good = batch_of(&rig.d), b;
  REFUSES(l2l_relay_step(NULL, r, &good), L2L_ERR_INVALID, "loss");
  REFUSES(l2l_relay_evaluate(NULL, r, &good), L2L_ERR_INVALID, "loss");
  REFUSES(l2l_relay_step(&loss, r, NULL), L2L_ERR_INVALID, "batch");
  REFUSES(l2l_relay_evaluate(&loss, r, NULL), L2L_ERR_INVALID, "batch");
  /* step_peak: its output, the batch's shape and the two flags */
  uint64_t peak = 12345;
  REFUSES(l2l_relay_step_peak(NULL, r, 2, 4, 0, 0), L2L_ERR_INVALID, "peak");
  static const int64_t bad_sizes[][2] = {{0, 4}, {2, 0}, {-1, 4}, {2, -3}, {(INT64_C(1) << 24) + 1, 4},
                                         {2, (INT64_C(1) << 24) + 1}, {INT64_MIN, 4}};
  for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++)
    REFUSES(l2l_relay_step_peak(&peak, r, bad_sizes[i][0], bad_sizes[i][1], 0, 0), L2L_ERR_INVALID,
            "batch and seq");
  REFUSES(l2l_relay_step_peak(&peak, r, 2, 4, 2, 0), L2L_ERR_INVALID, "token_types");
  REFUSES(l2l_relay_step_peak(&peak, r, 2, 4, 0, -1), L2L_ERR_INVALID, "key_mask");
  CHECK(peak == 12345, "a refused step_peak wrote its output");
  CHECK_OK(l2l_relay_step_peak(&peak, r, 2, 4, 0, 0));
  CHECK(peak > 0 && peak < (UINT64_C(1) << 40), "step_peak of a small model: %llu bytes",
        (unsigned long long)peak);
  const l2l_tensor *foreign[] = {JUNK(l2l_tensor), AS(l2l_tensor, rig.m.layer[1]),
                                 AS(l2l_tensor, r)};
  for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
    b = good, b.tokens = foreign[i];
    REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "tokens");
    REFUSES(l2l_relay_evaluate(&loss, r, &b), L2L_ERR_INVALID, "tokens");
    b = good, b.targets = foreign[i];
    REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "targets");
    b = good, b.key_mask = foreign[i];
    REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "key_mask");
    b = good, b.token_types = foreign[i];
    REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "token_types");
  }
  /* the batch lives in the host or pinned pool: the relay moves its micro-batches itself */
  l2l_tensor *dtargets = remake(rig.d.targets, L2L_POOL_DEVICE, L2L_I32);
  l2l_tensor *dmask = remake(rig.d.key_mask, L2L_POOL_DEVICE, L2L_U8);
  b = good, b.targets = dtargets;
  REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "targets must be in the host");
  b = good, b.key_mask = dmask;
  REFUSES(l2l_relay_evaluate(&loss, r, &b), L2L_ERR_INVALID, "key_mask must be in the host");
  FREE(dtargets, dmask);
  b = good, b.tokens = tt, b.key_mask = NULL; /* transposed: (S,B) */
  REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "targets");
  uint8_t skip[MAX_LAYERS] = {0};
  skip[1] = 2;
  b = good, b.skip = skip;
  REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "skip[1]");
  skip[1] = 0, skip[n - 1] = 1;
  REFUSES(l2l_relay_step(&loss, r, &b), L2L_ERR_INVALID, "skip");
  skip[n - 1] = 255;
  REFUSES(l2l_relay_evaluate(&loss, r, &b), L2L_ERR_INVALID, "skip");
  CHECK(loss == 12345.0, "*loss written by a refused step: %g", loss);

  /* stats and events */
  memset(&poisoned, 0xa5, sizeof poisoned);
  st = poisoned;
  REFUSES(l2l_relay_get_stats(NULL, r), L2L_ERR_INVALID, "out");
  CHECK_OK(l2l_relay_get_stats(&st, r));
  CHECK(st.steps == before.steps && st.updates == before.updates,
        "steps %lld -> %lld, updates %lld -> %lld across refused steps", (long long)before.steps,
        (long long)st.steps, (long long)before.updates, (long long)st.updates);
  int64_t events = st.events;
  l2l_relay_event ev[4], ev_poisoned[4];
  memset(ev_poisoned, 0xa5, sizeof ev_poisoned);
  memcpy(ev, ev_poisoned, sizeof ev);
  REFUSES(l2l_relay_events(NULL, r, 0, 1), L2L_ERR_INVALID, "out");
  const int64_t ranges[][2] = {
      {-1, 1},         {INT64_MIN, 1}, {0, -1},        {0, INT64_MIN},         {events, 1},
      {events - 1, 2}, {INT64_MAX, 1}, {1, INT64_MAX}, {INT64_MAX, INT64_MAX}, {events + 1, 0 + 1}};
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    char expr[160];
    snprintf(expr, sizeof expr, "l2l_relay_events(ev, r, %lld, %lld) of %lld events",
             (long long)ranges[i][0], (long long)ranges[i][1], (long long)events);
    refused_at((arm(), l2l_relay_events(ev, r, ranges[i][0], ranges[i][1])), L2L_ERR_INVALID,
               ranges[i][0] < 0 ? "first" : "count", __FILE__, __LINE__, expr);
  }
  CHECK(memcmp(ev, ev_poisoned, sizeof ev) == 0, "events written by a refusal");
  unwatch();
  CHECK_OK(l2l_relay_events(NULL, r, 0, 0)); /* nothing to copy */
  if (events >= 2) CHECK_OK(l2l_relay_events(ev, r, events - 2, 2));
  CHECK_OK(l2l_relay_step(&loss, r, &good));
  CHECK_OK(l2l_relay_evaluate(&loss, r, &good));
  CHECK_OK(l2l_relay_get_stats(&st, r));
  CHECK(st.steps == before.steps + 1, "steps %lld, want %lld", (long long)st.steps,
        (long long)before.steps + 1);
  l2l_tensor_free(t);
  l2l_tensor_free(tt);
  rig_free(&rig);
}

/* Covers: l2l_relay_param_state, l2l_relay_param_updates, l2l_relay_restore_param,
   l2l_relay_restore_progress, l2l_relay_restore_loss_scale. Found here: restore_param took
   updates = INT64_MAX (the next update's t overflowed int64), and named a state that is no
   tensor "f32, got (null)"; then (issue 47) INT64_MAX - 1, whose second update overflowed:
   every count is capped at 2^53 - 1, where a checkpoint's loader caps it (the largest
   integer its JSON holds exactly), so no count can reach int64's end by counting on. */
TEST(misuse_relay_state_and_restores) {
  struct rig rig, scaled;
  l2l_relay_config c = relay_config(), cs = relay_config();
  cs.loss_scale = 1024;
  bool ready = rig_new(&rig, &c);
  ready &= rig_new(&scaled, &cs);
  if (!ready) {
    rig_free(&rig);
    rig_free(&scaled);
    return;
  }
  l2l_relay *r = rig.r;
  l2l_layer *outsider = model_block_new(&rig.g, 0);
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 8);
  l2l_param *p = l2l_layer_param(rig.m.layer[1], 2); /* attn.qkv.weight */
  l2l_tensor *first = NULL, *second = NULL;
  int64_t updates = -1;
  if (!CHECK_OK(l2l_relay_param_state(&first, r, p, 0)) ||
      !CHECK_OK(l2l_relay_param_state(&second, r, p, 1)) ||
      !CHECK_OK(l2l_relay_param_updates(&updates, r, p)) ||
      !CHECK(first != NULL && second != NULL && updates == 2, "no optimizer state after 2 steps"))
    goto done;
  watch_model(&rig.m);
  WATCH(first, second);
  l2l_relay_stats before;
  CHECK_OK(l2l_relay_get_stats(&before, r));
  const l2l_param *not_params[] = {NULL, JUNK(l2l_param), AS(l2l_param, rig.m.layer[1]),
                                   AS(l2l_param, t), l2l_layer_param(outsider, 2)};
  l2l_tensor *state = SENTINEL(l2l_tensor);
  int64_t count = -77;
  REFUSES(l2l_relay_param_state(NULL, r, p, 0), L2L_ERR_INVALID, "out");
  REFUSES(l2l_relay_param_updates(NULL, r, p), L2L_ERR_INVALID, "out");
  for (size_t i = 0; i < sizeof not_params / sizeof not_params[0]; i++) {
    REFUSES(l2l_relay_param_state(&state, r, not_params[i], 0), L2L_ERR_INVALID, "param");
    REFUSES(l2l_relay_param_updates(&count, r, not_params[i]), L2L_ERR_INVALID, "param");
    REFUSES(l2l_relay_restore_param(r, not_params[i], 1, first, second), L2L_ERR_INVALID, "param");
  }
  const int bad_which[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_which / sizeof bad_which[0]; i++)
    REFUSES(l2l_relay_param_state(&state, r, p, bad_which[i]), L2L_ERR_INVALID, "which");
  CHECK(state == SENTINEL(l2l_tensor) && count == -77, "*out written by a refusal");

  /* restore_param: the state arrays the optimizer keeps, f32, of the record's size */
  /* INT64_MAX: the next update (t + 1) would overflow int64 (it did, in the EPS: UB) */
  const int64_t bad_updates[] = {-1, INT64_MIN, INT64_MAX, INT64_MAX - 1, (INT64_C(1) << 53),
                                 check_rand_int(INT64_C(1) << 53, INT64_MAX)};
  for (size_t i = 0; i < sizeof bad_updates / sizeof bad_updates[0]; i++)
    REFUSES(l2l_relay_restore_param(r, p, bad_updates[i], first, second), L2L_ERR_INVALID,
            "updates");
  int64_t numel_p = l2l_tensor_numel(first);
  l2l_tensor *fi = remake(first, L2L_POOL_HOST, L2L_I32),
             *longer = NEW(L2L_POOL_HOST, L2L_F32, numel_p + 1);
  l2l_tensor *shorter = NEW(L2L_POOL_HOST, L2L_F32, numel_p - 1);
  /* 8-bit state of the record is numel_p codes, padding and scales: numel_p bytes is short */
  l2l_tensor *bytes_short = NEW(L2L_POOL_HOST, L2L_U8, numel_p);
  /* a copy of the state with one value an inf, and one negative (a second moment's) */
  l2l_tensor *poisoned = NEW(L2L_POOL_HOST, L2L_F32, numel_p),
             *negative = NEW(L2L_POOL_HOST, L2L_F32, numel_p);
  CHECK_OK(l2l_tensor_copy(poisoned, second));   /* >= 0: fits either array but for the inf */
  CHECK_OK(l2l_tensor_copy(negative, second));
  ((float *)l2l_tensor_data(poisoned))[numel_p / 2] = INFINITY;
  ((float *)l2l_tensor_data(negative))[numel_p - 1] = -1.0f;
  WATCH(fi, longer, shorter, bytes_short, poisoned, negative);
  REFUSES(l2l_relay_restore_param(r, p, 5, first, negative), L2L_ERR_INVALID, "second moment >= 0");
  REFUSES(l2l_relay_restore_param(r, p, 5, NULL, second), L2L_ERR_INVALID, "first is NULL");
  REFUSES(l2l_relay_restore_param(r, p, 5, first, NULL), L2L_ERR_INVALID, "second is NULL");
  REFUSES(l2l_relay_restore_param(r, p, 0, first, NULL), L2L_ERR_INVALID, "first must be NULL");
  REFUSES(l2l_relay_restore_param(r, p, 0, NULL, second), L2L_ERR_INVALID, "second must be NULL");
  const struct {
    const l2l_tensor *t;
    const char *needle;
  } bad_states[] = {{JUNK(l2l_tensor), "is not a live tensor"},
                    {AS(l2l_tensor, rig.m.layer[1]), "is not a live tensor"},
                    {fi, "must be f32, bf16 or u8 (8-bit state), got i32"},
                    {longer, "elements"},
                    {shorter, "elements"},
                    {bytes_short, "elements"},
                    {poisoned, "holds inf"}};
  for (size_t i = 0; i < sizeof bad_states / sizeof bad_states[0]; i++) {
    char needle[80];
    snprintf(needle, sizeof needle, "first %s", bad_states[i].needle);
    REFUSES(l2l_relay_restore_param(r, p, 5, bad_states[i].t, second), L2L_ERR_INVALID,
            strstr(needle, "elements") ? "first has" : needle);
    snprintf(needle, sizeof needle, "second %s", bad_states[i].needle);
    REFUSES(l2l_relay_restore_param(r, p, 5, first, bad_states[i].t), L2L_ERR_INVALID,
            strstr(needle, "elements") ? "second has" : needle);
  }
  l2l_tensor *now = NULL;
  CHECK_OK(l2l_relay_param_updates(&count, r, p));
  CHECK_OK(l2l_relay_param_state(&now, r, p, 0));
  CHECK(count == updates && now == first, "the record changed by refused restores");

  /* restore_progress: 0 <= updates <= steps */
  const int64_t bad_progress[][2] = {{-1, 0},
                                     {0, -1},
                                     {1, 2},
                                     {INT64_MIN, 0},
                                     {0, INT64_MIN},
                                     {5, INT64_MAX},
                                     {INT64_MIN, INT64_MIN},
                                     {INT64_MAX - 1, 0},
                                     {INT64_C(1) << 53, 1},
                                     {INT64_MAX - 1, INT64_MAX - 1}};
  for (size_t i = 0; i < sizeof bad_progress / sizeof bad_progress[0]; i++)
    REFUSES(l2l_relay_restore_progress(r, bad_progress[i][0], bad_progress[i][1]), L2L_ERR_INVALID,
            "updates <= steps");
  /* restore_loss_scale: only where the loss is scaled; scale 2^-64 to 2^100; 0 <= good <
     window; skipped >= 0 */
  REFUSES(l2l_relay_restore_loss_scale(r, 1024, 0, 0), L2L_ERR_STATE, "loss_scale");
  const double bad_scales[] = {0, -1, NAN, INFINITY, 0x1p101, 0x1p-65};
  for (size_t i = 0; i < sizeof bad_scales / sizeof bad_scales[0]; i++)
    REFUSES(l2l_relay_restore_loss_scale(scaled.r, bad_scales[i], 0, 0), L2L_ERR_INVALID, "scale");
  const int64_t bad_good[] = {-1, 2000, INT64_MAX, INT64_MIN};
  for (size_t i = 0; i < sizeof bad_good / sizeof bad_good[0]; i++)
    REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, bad_good[i], 0), L2L_ERR_INVALID, "good");
  REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, 0, -1), L2L_ERR_INVALID, "skipped");
  REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, 0, INT64_MIN), L2L_ERR_INVALID, "skipped");
  REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, 0, INT64_MAX), L2L_ERR_INVALID, "skipped");
  REFUSES(l2l_relay_restore_loss_scale(scaled.r, 8, 0, INT64_C(1) << 53), L2L_ERR_INVALID, "skipped");
  l2l_relay_stats after;
  CHECK_OK(l2l_relay_get_stats(&after, r));
  CHECK(after.steps == before.steps && after.updates == before.updates, "progress changed");
  unwatch();
  /* good restores afterwards: the record's own state and count, the progress it has */
  l2l_tensor *f2 = like_in(first, L2L_POOL_HOST), *s2 = like_in(second, L2L_POOL_HOST);
  CHECK_OK(l2l_tensor_copy(f2, first));
  CHECK_OK(l2l_tensor_copy(s2, second));
  CHECK_OK(l2l_relay_restore_param(r, p, updates, f2, s2));
  CHECK_OK(l2l_relay_restore_progress(r, before.steps, before.updates));
  CHECK_OK(l2l_relay_restore_loss_scale(scaled.r, 8, 1, 0));
  /* at the cap every count is taken, and steps count on from it (UBSan watches) */
  const int64_t cap = (INT64_C(1) << 53) - 1;
  l2l_relay_batch b = batch_of(&rig.d);
  double loss;
  if (CHECK_OK(l2l_relay_restore_param(r, p, cap, f2, s2)) &&
      CHECK_OK(l2l_relay_restore_progress(r, cap, cap)) && CHECK_OK(l2l_relay_step(&loss, r, &b)) &&
      CHECK_OK(l2l_relay_step(&loss, r, &b)) && CHECK_OK(l2l_relay_param_updates(&count, r, p)))
    CHECK(count == cap + 2, "updates %lld after two steps from %lld", (long long)count, (long long)cap);
  FREE(fi, longer, shorter, f2, s2);
done:
  unwatch();
  l2l_tensor_free(t);
  l2l_layer_free(outsider);
  rig_free(&scaled);
  rig_free(&rig);
}

/* Covers: l2l_relay_save, l2l_relay_load, l2l_checkpoint_description (what a file may
   hold wrongly is spec/c/test_checkpoint.c's; here the arguments). */
TEST(misuse_checkpoints) {
  struct rig rig;
  l2l_relay_config c = relay_config();
  char dir[256], path[512], missing[512], junk_file[512];
  if (!rig_new(&rig, &c) || !check_temp_dir(dir, sizeof dir, "l2l-misuse")) {
    rig_free(&rig);
    return;
  }
  l2l_relay *r = rig.r;
  snprintf(path, sizeof path, "%s/run.safetensors", dir);
  snprintf(missing, sizeof missing, "%s/none.safetensors", dir);
  snprintf(junk_file, sizeof junk_file, "%s/junk.safetensors", dir);
  FILE *f = fopen(junk_file, "wb");
  if (f) fputs("hello", f), fclose(f);
  CHECK_OK(l2l_relay_save(r, path, NULL));
  watch_model(&rig.m);
  l2l_relay *not_runs[] = {NULL, JUNK(l2l_relay), AS(l2l_relay, rig.m.layer[0])};
  for (size_t i = 0; i < sizeof not_runs / sizeof not_runs[0]; i++) {
    REFUSES(l2l_relay_save(not_runs[i], missing, NULL), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_load(not_runs[i], path), L2L_ERR_INVALID, "run");
  }
  REFUSES(l2l_relay_save(r, NULL, NULL), L2L_ERR_INVALID, "path");
  REFUSES(l2l_relay_save(r, "", NULL), L2L_ERR_INVALID, "path");
  REFUSES(l2l_relay_load(r, NULL), L2L_ERR_INVALID, "path");
  REFUSES(l2l_relay_load(r, ""), L2L_ERR_INVALID, "path");
  /* options: replace 0 or 1; JSON of the kinds they take */
  const int bad_replace[] = {2, -1, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof bad_replace / sizeof bad_replace[0]; i++)
    REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.replace = bad_replace[i]}), L2L_ERR_INVALID, "replace");
  const char *bad_json[] = {"{", "3", "\"text\"", "{\"a\": 1, \"a\": 2}", "\xff"};
  for (size_t i = 0; i < sizeof bad_json / sizeof bad_json[0]; i++) {
    REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.extra = bad_json[i]}), L2L_ERR_INVALID, "extra");
    REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.layers = bad_json[i]}), L2L_ERR_INVALID, "layers");
    REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.relay = bad_json[i]}), L2L_ERR_INVALID, "relay");
  }
  REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.layers = "{}"}), L2L_ERR_INVALID, "array");
  REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.layers = "[]"}), L2L_ERR_INVALID, "0 layers");
  REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.relay = "[]"}), L2L_ERR_INVALID, "object");
  REFUSES(l2l_relay_save(r, missing, &(l2l_save_options){.relay = "{}"}), L2L_ERR_INVALID, "'seed' is 0");
  /* a file there already, without leave to replace it; a folder, nothing, junk to load */
  REFUSES(l2l_relay_save(r, path, &(l2l_save_options){.replace = 0}), L2L_ERR_STATE, "exists already");
  REFUSES(l2l_relay_save(r, dir, NULL), L2L_ERR_STATE, "exists already");
  REFUSES(l2l_relay_load(r, missing), L2L_ERR_IO, "none.safetensors");
  REFUSES(l2l_relay_load(r, dir), L2L_ERR_IO, "directory");
  REFUSES(l2l_relay_load(r, junk_file), L2L_ERR_INVALID, "too short");
  CHECK(check_dir_entries(dir) == 2, "refused saves left %d entries in %s", check_dir_entries(dir), dir);
  /* the description: out and capacity, length, path */
  char small[8] = "unset";
  size_t length = 99;
  REFUSES(l2l_checkpoint_description(small, sizeof small, NULL, path), L2L_ERR_INVALID, "length");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, NULL), L2L_ERR_INVALID, "path");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, ""), L2L_ERR_INVALID, "path");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, missing), L2L_ERR_IO, "none.safetensors");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, junk_file), L2L_ERR_INVALID, "too short");
  REFUSES(l2l_checkpoint_description(small, sizeof small, &length, path), L2L_ERR_INVALID, "capacity");
  CHECK(length == 99 && strcmp(small, "unset") == 0, "a refused description wrote its outputs");
  /* good calls still work: the description's length, and the relay's own file loaded back */
  CHECK_OK(l2l_checkpoint_description(NULL, 0, &length, path));
  CHECK(length > sizeof small, "a description of %zu bytes", length);
  unwatch();
  CHECK_OK(l2l_relay_load(r, path));
  check_remove_dir(dir);
  rig_free(&rig);
}

/* ---------------------------------------------------------------- found by this file
   Each failed before its fix: a tie of a head that is in a relay freed a record the EPS
   held (the next step dereferenced NULL); progress of INT64_MAX steps overflowed the next
   step's count; an empty range of events was accepted at any first. */
TEST(misuse_tie_in_a_relay_progress_past_counting_and_empty_event_ranges) {
  struct rig rig;
  l2l_relay_config c = relay_config();
  if (!rig_new(&rig, &c)) {
    rig_free(&rig);
    return;
  }
  l2l_relay *r = rig.r;
  l2l_relay_batch b = batch_of(&rig.d);
  double loss;
  /* 1: a tie that would change the records of a layer in a relay */
  l2l_layer_config ec = model_layer_config(&rig.g, L2L_LAYER_EMBEDDING);
  l2l_layer *other = layer_in(&ec, L2L_POOL_HOST);
  l2l_layer *head = rig.m.layer[rig.m.n - 1];
  watch_model(&rig.m);
  REFUSES(l2l_layer_tie(head, other), L2L_ERR_STATE, "relay");
  unwatch();
  CHECK_OK(l2l_relay_step(&loss, r, &b));
  CHECK_OK(l2l_relay_sync(r));   /* the step's updates are done: what follows changes nothing */
  watch_model(&rig.m);
  /* 2: progress whose next step cannot be counted */
  REFUSES(l2l_relay_restore_progress(r, INT64_MAX, INT64_MAX), L2L_ERR_INVALID, "steps");
  /* 3: first out of range with nothing to copy */
  REFUSES(l2l_relay_events(NULL, r, -1, 0), L2L_ERR_INVALID, "first");
  REFUSES(l2l_relay_events(NULL, r, INT64_MAX, 0), L2L_ERR_INVALID, "first");
  unwatch();
  l2l_layer_free(other);
  rig_free(&rig);
}

/* Covers: l2l_plan_new, l2l_plan_get, l2l_plan_get_layer, l2l_plan_free,
   l2l_plan_calibrate, l2l_relay_apply_plan. */
TEST(misuse_planner) {
  struct rig rig;
  l2l_relay_config c = relay_config();
  if (!rig_new(&rig, &c)) {
    rig_free(&rig);
    return;
  }
  l2l_layer **layers = rig.m.layer;
  int n = rig.m.n;
  l2l_plan_rates rates = {.flops = 1e12, .h2d = 1e10, .d2h = 1e10, .optimizer = 1e9};
  l2l_plan_request q = {.batch = 4, .seq = rig.g.S, .device_budget = UINT64_C(1) << 30, .rates = &rates};
  l2l_plan *out = SENTINEL(l2l_plan);
  REFUSES(l2l_plan_new(NULL, layers, n, &c, &q), L2L_ERR_INVALID, "out");
  REFUSES(l2l_plan_new(&out, NULL, n, &c, &q), L2L_ERR_INVALID, "layers");
  REFUSES(l2l_plan_new(&out, layers, n, NULL, &q), L2L_ERR_INVALID, "config");
  REFUSES(l2l_plan_new(&out, layers, n, &c, NULL), L2L_ERR_INVALID, "request");
  const int bad_counts[] = {-1, 0, 1, INT_MIN, (1 << 20) + 1};
  for (size_t i = 0; i < sizeof bad_counts / sizeof bad_counts[0]; i++)
    REFUSES(l2l_plan_new(&out, layers, bad_counts[i], &c, &q), L2L_ERR_INVALID, "nlayers");
  l2l_layer *swapped[MAX_LAYERS];
  memcpy(swapped, layers, (size_t)n * sizeof *swapped);
  swapped[0] = layers[n - 1], swapped[n - 1] = layers[0];
  REFUSES(l2l_plan_new(&out, swapped, n, &c, &q), L2L_ERR_INVALID, "head");
  l2l_tensor *t = NEW(L2L_POOL_HOST, L2L_F32, 4);
  memcpy(swapped, layers, (size_t)n * sizeof *swapped);
  swapped[1] = AS(l2l_layer, t);
  REFUSES(l2l_plan_new(&out, swapped, n, &c, &q), L2L_ERR_INVALID, "live layer");
  l2l_plan_request bad = q;
  bad.batch = 0;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "batch");
  bad = q, bad.seq = INT64_MAX;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "seq");
  bad = q, bad.device_budget = 0;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "device_budget");
  bad = q, bad.key_mask = 2;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "key_mask");
  l2l_plan_rates bad_rates[6] = {rates, rates, rates, rates, rates, rates};
  bad_rates[0].h2d = 0, bad_rates[1].flops = NAN, bad_rates[2].optimizer = INFINITY, bad_rates[3].flops = 0;
  bad_rates[4].disk_read = -1, bad_rates[5].disk_write = NAN;
  for (int i = 0; i < 6; i++) {
    bad = q, bad.rates = &bad_rates[i];
    REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_INVALID, "rates");
  }
  l2l_relay_config bad_config = c;
  bad_config.param_slots = 1;
  REFUSES(l2l_plan_new(&out, layers, n, &bad_config, &q), L2L_ERR_INVALID, "param_slots");
  bad_config = c, bad_config.spill_dir = "";
  REFUSES(l2l_plan_new(&out, layers, n, &bad_config, &q), L2L_ERR_INVALID, "spill_dir");
  bad_config = c, bad_config.optimizer.kind = (l2l_optimizer_kind)9;
  REFUSES(l2l_plan_new(&out, layers, n, &bad_config, &q), L2L_ERR_INVALID, "kind 9");
  bad = q, bad.device_budget = 64;
  REFUSES(l2l_plan_new(&out, layers, n, &c, &bad), L2L_ERR_BUDGET, "the smallest needs");
  CHECK(out == SENTINEL(l2l_plan), "*out written by a refused l2l_plan_new");

  /* a plan, and the calls that read it */
  l2l_plan *plan = NULL;
  if (CHECK_OK(l2l_plan_new(&plan, layers, n, &c, &q))) {
    l2l_plan_summary s;
    l2l_plan_layer pl;
    REFUSES(l2l_plan_get(NULL, plan), L2L_ERR_INVALID, "out");
    REFUSES(l2l_plan_get(&s, NULL), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_plan_get(&s, AS(l2l_plan, t)), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_plan_get(&s, JUNK(l2l_plan)), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_plan_get_layer(NULL, plan, 0), L2L_ERR_INVALID, "out");
    REFUSES(l2l_plan_get_layer(&pl, JUNK(l2l_plan), 0), L2L_ERR_INVALID, "plan");
    const int bad_index[] = {-1, n, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++)
      REFUSES(l2l_plan_get_layer(&pl, plan, bad_index[i]), L2L_ERR_INVALID, "index");
    /* apply: the run and the plan checked, a plan for another number of layers refused,
       nothing changed on a refusal */
    int64_t mb_before = c.micro_batch;
    l2l_inner_policy inner_before = (l2l_inner_policy)l2l_relay_inner(rig.r, 1);
    REFUSES(l2l_relay_apply_plan(NULL, plan), L2L_ERR_INVALID, "run");
    REFUSES(l2l_relay_apply_plan(rig.r, NULL), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_relay_apply_plan(rig.r, AS(l2l_plan, t)), L2L_ERR_INVALID, "plan");
    REFUSES(l2l_relay_apply_plan(AS(l2l_relay, plan), plan), L2L_ERR_INVALID, "run");
    l2l_plan *shorter = NULL;
    l2l_layer *pair[2] = {layers[0], layers[n - 1]};
    if (CHECK_OK(l2l_plan_new(&shorter, pair, 2, &c, &q)))
      REFUSES(l2l_relay_apply_plan(rig.r, shorter), L2L_ERR_INVALID, "layers");
    l2l_plan_free(shorter);
    l2l_relay_stats st;
    CHECK_OK(l2l_relay_get_stats(&st, rig.r));
    CHECK(l2l_relay_inner(rig.r, 1) == (int)inner_before && mb_before == c.micro_batch,
          "a refused apply changed the relay");
    CHECK_OK(l2l_relay_apply_plan(rig.r, plan));
    CHECK_OK(l2l_plan_get(&s, plan));
    CHECK(s.nlayers == n && s.micro_batch >= 1 && s.micro_batch <= 4 && s.device_peak > 0,
          "plan summary: %d layers, micro-batch %lld, peak %llu", s.nlayers, (long long)s.micro_batch,
          (unsigned long long)s.device_peak);
    l2l_relay_batch b = batch_of(&rig.d);
    double loss;
    CHECK_OK(l2l_relay_step(&loss, rig.r, &b));
    l2l_plan_free(plan);
  }
  l2l_plan_free(NULL);
  l2l_plan_free(JUNK(l2l_plan));
  l2l_plan_free(AS(l2l_plan, t));
  l2l_plan_rates r;
  REFUSES(l2l_plan_calibrate(NULL, 0), L2L_ERR_INVALID, "out");
  REFUSES(l2l_plan_calibrate(&r, 2), L2L_ERR_INVALID, "remeasure");
  REFUSES(l2l_plan_calibrate(&r, -1), L2L_ERR_INVALID, "remeasure");
  l2l_tensor_free(t);
  rig_free(&rig);
}

/* ---------------------------------------------------------------- data parallel */

/* MPI is never started here (the C tests are one process without mpirun): what is checked
   is every refusal before it, and a plugin that cannot be opened. spec/dist_spec.lua runs
   the real thing under mpirun. */
TEST(misuse_data_parallel) {
  REFUSES(l2l_dist_rank(NULL), L2L_ERR_INVALID, "out");
  REFUSES(l2l_dist_size(NULL), L2L_ERR_INVALID, "out");
  const double bad_seconds[] = {0, -1, NAN, INFINITY, -INFINITY, 1e6 * 1.5, -0.0};
  for (size_t i = 0; i < sizeof bad_seconds / sizeof bad_seconds[0]; i++)
    REFUSES(l2l_dist_set_timeout(bad_seconds[i]), L2L_ERR_INVALID, "seconds");
  CHECK_OK(l2l_dist_finalize());   /* never started: nothing to do */
  l2l_dist_abort(NULL);            /* not running: returns */
  l2l_dist_abort("not running");

  l2l_relay_config c = relay_config();
  struct model m;
  struct shape g = gpt_shape();
  model_new(&m, &g);
  l2l_relay *run = SENTINEL(l2l_relay);
  c.dist = (l2l_dist_mode)7;
  REFUSES(l2l_relay_new(&run, m.layer, m.n, &c), L2L_ERR_INVALID, "dist");
  c.dist = (l2l_dist_mode)-1;
  REFUSES(l2l_relay_new(&run, m.layer, m.n, &c), L2L_ERR_INVALID, "dist");

  /* A plugin that is not there: refused with its path, by every call that needs MPI, and
     again the same way (MPI is never half-started). */
  setenv("L2L_MPI_PLUGIN", "/nonexistent/libl2l-mpi.so", 1);
  REFUSES(l2l_dist_init(), L2L_ERR_UNSUPPORTED, "/nonexistent/libl2l-mpi.so");
  REFUSES(l2l_dist_init(), L2L_ERR_UNSUPPORTED, "cannot open the MPI plugin");
  int out = -5;
  REFUSES(l2l_dist_rank(&out), L2L_ERR_UNSUPPORTED, "MPI plugin");
  REFUSES(l2l_dist_size(&out), L2L_ERR_UNSUPPORTED, "MPI plugin");
  CHECK(out == -5, "a refused l2l_dist_rank wrote %d", out);
  REFUSES(l2l_dist_barrier(), L2L_ERR_UNSUPPORTED, "MPI plugin");
  c.dist = L2L_DIST_MPI;
  REFUSES(l2l_relay_new(&run, m.layer, m.n, &c), L2L_ERR_UNSUPPORTED, "MPI plugin");
  CHECK(run == SENTINEL(l2l_relay), "*out written by a refused l2l_relay_new");
  unsetenv("L2L_MPI_PLUGIN");
  CHECK_OK(l2l_dist_set_timeout(30));
  CHECK_OK(l2l_dist_finalize());
  model_free(&m);
}
