/* SPDX-License-Identifier: MIT */
/* test_api_misuse.c — every public function of include/l2l.h called with what it must refuse.
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
 * All test names start with "misuse_", so `l2l_ctest misuse_` runs just these files:
 * test_api_misuse.c (errors, threads, pools, the device, the profile, tensors),
 * test_api_misuse_ops.c, test_api_misuse_layers.c (built-in and custom layers),
 * test_api_misuse_relay.c (optimizers, schedules, the relay), test_api_misuse_plan.c
 * (the planner, data parallel), test_api_misuse_checkpoint.c (checkpoints in C) and
 * test_api_misuse_safetensors.c (safetensors files);
 * misuse.h holds the harness they share.
 * Must never: pass a freed handle (the header does not promise to catch one: its memory
 * is gone); switch the device backend; leave a pool budget, the pinned cap, the thread
 * count or the TF32 setting other than it found them; read a device tensor's bytes unless
 * the device pool is host memory (the CPU backend).
 */
#include <ctype.h>
#include <dirent.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "misuse.h"

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

/* Every misuse file's text (spec/c/api/test_api_misuse*.c, found beside this one), joined;
   *files gets their count. NULL when the folder cannot be read. */
static char *misuse_sources(int *files) {
  char dir[1024];
  const char *me = __FILE__, *slash = strrchr(me, '/');
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - me) : 1, slash ? me : ".");
  *files = 0;
  DIR *d = opendir(dir);
  if (d == NULL) return NULL;
  size_t len = 0;
  char *all = xmalloc(1);
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (!starts_with(e->d_name, "test_api_misuse") || !ends_with(e->d_name, ".c")) continue;
    char path[1280];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    char *text = read_text(path);
    if (text == NULL) continue;
    size_t n = strlen(text);
    char *grown = realloc(all, len + n + 2);
    if (grown == NULL) {
      free(text);
      break;
    }
    all = grown;
    memcpy(all + len, text, n);
    len += n;
    all[len++] = '\n';
    all[len] = '\0';
    free(text);
    (*files)++;
  }
  closedir(d);
  return all;
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

/* Covers: that every function declared in include/l2l.h (with its parts) is called in one of
   the misuse files (spec/c/api/test_api_misuse*.c). Their declarations are read from
   lua/l2l/cdef.lua, which is the header's FFI blocks in order (made by
   scripts/gen_cdef.lua; ffi_spec fails when it drifts from them). */
TEST(misuse_every_public_function_has_cases) {
  int files = 0;
  char *header = repo_file("lua/l2l/cdef.lua"), *self = misuse_sources(&files);
  if (!CHECK(header != NULL && self != NULL && files >= 2,
             "cannot read lua/l2l/cdef.lua or the spec/c/api/test_api_misuse*.c files from %s "
             "(%d read; run from the repository root)",
             __FILE__, files)) {
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
      CHECK(false, "%s (declared in include/l2l.h) has no misuse case in spec/c/api/test_api_misuse*.c",
            name);
    }
    i += n;
  }
  CHECK(functions >= 100, "found only %d functions in include/l2l.h's FFI blocks", functions);
  printf("  misuse: %d public functions, %d without a case in %d files\n", functions, missing,
         files);
  free(header);
  free(self);
}

/* ---------------------------------------------------------------- errors, threads, pools */

/* Covers: l2l_last_error, l2l_clear_error, l2l_last_error_detail, l2l_status_name, l2l_version,
   l2l_set_threads, l2l_get_threads. */
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
  /* the detail of the last error: none after a clear; out NULL refused */
  l2l_error_detail detail;
  memset(&detail, 0x5a, sizeof detail);
  CHECK_OK(l2l_last_error_detail(&detail));
  CHECK(detail.layer == -1 && detail.needed_bytes == 0 && detail.field[0] == '\0',
        "a cleared error's detail: layer %d, needed %llu, field '%.47s'", detail.layer,
        (unsigned long long)detail.needed_bytes, detail.field);
  CHECK(detail.micro_batch == -1 && detail.text == 0 && detail.element_dims == 0 &&
        detail.layer_named.bytes == 0 && detail.micro_batch_named.bytes == 0 &&
        detail.field_named.bytes == 0 && detail.element_named.bytes == 0,
        "a cleared error's detail: micro-batch %lld, text at %d, element dims %d, spans %d %d %d %d",
        (long long)detail.micro_batch, detail.text, detail.element_dims, detail.layer_named.bytes,
        detail.micro_batch_named.bytes, detail.field_named.bytes, detail.element_named.bytes);
  REFUSES(l2l_last_error_detail(NULL), L2L_ERR_INVALID, "out");
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

/* Covers: l2l_cudnn_available. The same answer however about is given; the words go into
   about[0..len) only, terminated. */
TEST(misuse_cudnn_available) {
  int version = l2l_cudnn_available(NULL, 0);
  CHECK(version == 0 || (version >= 90000 && version < 100000), "version %d", version);
  char about[64];
  memset(about, 'x', sizeof about);
  CHECK(l2l_cudnn_available(NULL, 100) == version, "NULL about with a length");
  CHECK(l2l_cudnn_available(about, 0) == version, "len 0");
  bool untouched = true;
  for (size_t i = 0; i < sizeof about; i++) untouched &= about[i] == 'x';
  CHECK(untouched, "len 0: about written");
  CHECK(l2l_cudnn_available(about, 8) == version, "len 8");
  untouched = true;
  for (size_t i = 8; i < sizeof about; i++) untouched &= about[i] == 'x';
  CHECK(untouched, "len 8: about written past 8 bytes");
  CHECK(memchr(about, '\0', 8) != NULL, "len 8: the words are not terminated");
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
    REFUSES(l2l_tensor_cast(idst, src), L2L_ERR_INVALID, "src[3][4] is not an integer"); /* element 19 of (4,5) */
    float rounded = l2l_bf16_to_f32(l2l_f32_to_bf16(not_int32[k]));
    if (rounded == floorf(rounded) && rounded >= -2147483648.0f && rounded < 2147483648.0f)
      continue; /* -2^31 - 256 rounds to -2^31 in bf16: an int32 */
    l2l_tensor *half = remake(src, L2L_POOL_HOST, L2L_BF16);
    CHECK_OK(l2l_tensor_cast(half, src));
    REFUSES(l2l_tensor_cast(idst, half), L2L_ERR_INVALID, "src[3][4] is not an integer");
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
