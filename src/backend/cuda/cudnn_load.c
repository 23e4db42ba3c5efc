/* SPDX-License-Identifier: MIT */
/* cudnn_load.c — finding and opening libcudnn.so.9, once, GPU or not.
 *
 * Purpose: cuDNN is opened as cuBLAS is (runtime.c's open_cublas: dlopen, a table of
 * functions from dlsym), and only when first asked (l2l.device(), or the first attention
 * call that could use it). Where from, in order: L2L_CUDNN when set (a path: that file
 * and no other; "0" or "off": cuDNN is not used); the toolkit's lib64 and lib folders
 * (compiled in); the folders PyTorch's wheels install it in (nvidia/cudnn/lib under the
 * site-packages and dist-packages of /usr/lib/python3*, /usr/local/lib/python3* and
 * ~/.local/lib/python3*); then the plain soname through the loader's own paths. What was
 * loaded, from where, or why nothing was, cudnn_probe says. Without cuDNN every
 * attention call runs on the project's own kernels, as before.
 * Must never: fail a call because cuDNN is missing (it is optional), or abort.
 */
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef L2L_CUDA

#include "cudnn_sdpa.h"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded_version;     /* 0: not loaded */
static char about[512];        /* where from, or why not */

#ifndef L2L_CUDNN_HEADERS

static void load(void) {
  snprintf(about, sizeof about,
           "this build of l2l has no cuDNN support (cuDNN's headers, cudnn_graph.h, were not in "
           "the CUDA toolkit's include folder when it was built)");
}

#else

struct cuda_cudnn cudnn;

/* Opens `path` and takes l2l's functions from it; false with the reason in about. */
static bool open_at(const char *path) {
  static const char *const names[] = {
      "cudnnGetVersion",          "cudnnGetErrorString",           "cudnnGetLastErrorString",
      "cudnnCreate",              "cudnnSetStream",                "cudnnDestroy",
      "cudnnBackendCreateDescriptor", "cudnnBackendDestroyDescriptor", "cudnnBackendSetAttribute",
      "cudnnBackendGetAttribute", "cudnnBackendFinalize",      "cudnnBackendExecute"};
  void *fns[sizeof names / sizeof names[0]];
  void *lib =
      cuda_open_functions(path, names, sizeof names / sizeof names[0], fns, about, sizeof about);
  if (lib == NULL) return false;
  struct cuda_cudnn t;
  _Static_assert(sizeof t == sizeof fns, "struct cuda_cudnn and the names listed disagree");
  memcpy(&t, fns, sizeof t);   /* POSIX lets a void * from dlsym become a function pointer */
  int version = (int)t.get_version();
  if (version < 90000 || version >= 100000) {
    snprintf(about, sizeof about, "%.200s is cuDNN %d.%d, not 9.x", path, version / 10000,
             version / 100 % 100);
    dlclose(lib);
    return false;
  }
  cudnn = t;
  loaded_version = version;
  Dl_info info;   /* the file the loader chose (a soname names none) */
  const char *from = dladdr(fns[0], &info) != 0 && info.dli_fname ? info.dli_fname : path;
  snprintf(about, sizeof about, "cuDNN %d.%d.%d from %.400s", version / 10000, version / 100 % 100,
           version % 100, from);
  return true;
}

/* The first of the files matching `pattern` that opens. */
static bool open_glob(const char *pattern) {
  glob_t g;
  bool ok = false;
  if (glob(pattern, 0, NULL, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc && !ok; i++) ok = open_at(g.gl_pathv[i]);
  globfree(&g);
  return ok;
}

static void load(void) {
  const char *named = getenv("L2L_CUDNN");
  if (named != NULL && named[0] != '\0') {
    if (strcmp(named, "0") == 0 || strcmp(named, "off") == 0) {
      snprintf(about, sizeof about, "L2L_CUDNN=%s turns cuDNN off", named);
      return;
    }
    if (!open_at(named)) {
      char why[sizeof about];
      snprintf(why, sizeof why, "%s", about);
      snprintf(about, sizeof about, "L2L_CUDNN names a library l2l cannot use: %.400s", why);
    }
    return;
  }
  char path[600];
  const char *home = getenv("HOME");
#ifdef L2L_CUDA_LIBDIR
  snprintf(path, sizeof path, "%s/libcudnn.so.9", L2L_CUDA_LIBDIR);
  if (open_at(path)) return;
  snprintf(path, sizeof path, "%s/../lib/libcudnn.so.9", L2L_CUDA_LIBDIR);
  if (open_at(path)) return;
#endif
  static const char *const wheels[] = {"/usr/lib/python3*", "/usr/local/lib/python3*", "~"};
  for (size_t i = 0; i < sizeof wheels / sizeof wheels[0]; i++)
    for (int dist = 0; dist < 2; dist++) {
      if (wheels[i][0] == '~' && (home == NULL || dist == 1)) continue;
      if (wheels[i][0] == '~')
        snprintf(path, sizeof path, "%.400s/.local/lib/python3*/site-packages/nvidia/cudnn/lib/"
                 "libcudnn.so.9", home);
      else
        snprintf(path, sizeof path, "%s/%s/nvidia/cudnn/lib/libcudnn.so.9", wheels[i],
                 dist ? "dist-packages" : "site-packages");
      if (open_glob(path)) return;
    }
  if (open_at("libcudnn.so.9")) return;
  char why[sizeof about];
  snprintf(why, sizeof why, "%s", about);
  snprintf(about, sizeof about,
           "no libcudnn.so.9 found (the toolkit's folders, PyTorch's nvidia/cudnn/lib, the "
           "loader's paths; L2L_CUDNN names one): %.300s", why);
}

#endif /* L2L_CUDNN_HEADERS */

int cudnn_loaded(void) {
  pthread_once(&load_once, load);
  return loaded_version != 0;
}

int cudnn_loaded_version(void) { return cudnn_loaded() ? loaded_version : 0; }

int cudnn_probe(char *out, size_t len) {
  int version = cudnn_loaded_version();
  if (out != NULL && len > 0) snprintf(out, len, "%s", about);
  return version;
}

#endif /* L2L_CUDA */
