/* SPDX-License-Identifier: MIT */
/* runtime.c — the CUDA backend's runtime: start-up (device, stream, scratch, cuBLAS),
 * copy lanes, marks and stamps, the caching allocator over cudaMalloc, page-locked host
 * memory, and the device table it installs in the core (cuda_device).
 *
 * Purpose: the relay's copy threads are "lanes": each copies on a stream of its own, so
 * that transfers in both directions overlap the kernels. A lane copy first waits for a
 * mark (an event recorded on the compute stream when the relay queued the copy:
 * everything it depends on, or whose memory it overwrites, was queued before), and
 * returns when the copy is done (a queued one: when the lane's next waited copy is).
 * Device memory comes from a caching allocator over
 * cudaMalloc: a block freed by a tensor goes to a list of free blocks of its size and
 * serves the next request of that size, so a training step's steady state calls neither
 * cudaMalloc nor cudaFree. Reuse is safe because a block is freed in the compute
 * stream's order (its kernels queued before the free) and a lane that takes a block
 * first waits for the compute stream as it is at that moment.
 * Every CUDA or cuBLAS error becomes L2L_ERR_BACKEND with file, line, the call and CUDA's
 * own words.
 * Must never: exit or abort on a CUDA error, or allocate from a pool.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef L2L_CUDA

#include "runtime.h"

/* ---------------------------------------------------------------- errors */

l2l_status cuda_error(cudaError_t err, const char *file, int line, const char *call) {
  return core_fail(L2L_ERR_BACKEND, "%s:%d: %s failed: %s (%s)", file, line, call,
                   cudaGetErrorString(err), cudaGetErrorName(err));
}

l2l_status cublas_error(cublasStatus_t err, const char *file, int line,
                               const char *call) {
  return core_fail(L2L_ERR_BACKEND, "%s:%d: %s failed: %s (%s)", file, line, call,
                   cublas.status_string(err), cublas.status_name(err));
}

/* ---------------------------------------------------------------- the runtime */

struct cuda_cublas cublas;
struct cuda_runtime cuda_rt = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

/* The backend's own device memory (below, "the backend's own blocks"). */
static int own_alloc(void **out, uint64_t bytes);

static void runtime_say(const char *what, cudaError_t err) {
  snprintf(cuda_rt.why, sizeof cuda_rt.why, "%s: %s (%s)", what, cudaGetErrorString(err),
           cudaGetErrorName(err));
}

void *cuda_open_functions(const char *path, const char *const *names, size_t n, void **fns,
                          char *why, size_t why_len) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char *e = dlerror();
    snprintf(why, why_len, "cannot open %.200s: %.250s", path, e ? e : "?");
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    if ((fns[i] = dlsym(lib, names[i])) == NULL) {
      snprintf(why, why_len, "%.200s lacks %s, which l2l needs", path, names[i]);
      dlclose(lib);
      return NULL;
    }
  return lib;
}

void *cuda_open_toolkit_library(const char *name, const char *const *names, size_t n, void **fns,
                                 char *path, size_t path_len, char *why, size_t why_len) {
  void *lib = NULL;
#ifdef L2L_CUDA_LIBDIR
  snprintf(path, path_len, "%s/%s.so.%d", L2L_CUDA_LIBDIR, name, CUBLAS_VER_MAJOR);
  lib = cuda_open_functions(path, names, n, fns, why, why_len);
#endif
  if (lib == NULL) {
    snprintf(path, path_len, "%s.so.%d", name, CUBLAS_VER_MAJOR);
    lib = cuda_open_functions(path, names, n, fns, why, why_len);
  }
  return lib;
}

static bool open_cublas(void) {
  static const char *const names[] = {
      "cublasCreate_v2",       "cublasSetStream_v2",         "cublasSetWorkspace_v2",
      "cublasSetPointerMode_v2", "cublasGemmEx",             "cublasGemmStridedBatchedEx",
      "cublasGetStatusString", "cublasGetStatusName"};
  void *fns[sizeof names / sizeof names[0]];
  _Static_assert(sizeof cublas == sizeof fns, "struct cuda_cublas and the names listed disagree");
  char path[512];
  void *lib = cuda_open_toolkit_library("libcublas", names, sizeof names / sizeof names[0], fns,
                                        path, sizeof path, cuda_rt.why, sizeof cuda_rt.why);
  if (lib == NULL) return false;
  memcpy(&cublas, fns, sizeof cublas);   /* POSIX lets a void * from dlsym become a function pointer */
  return true;
}

/* cudaErrorInsufficientDriver means "no driver" as well as "a driver too old": the runtime
   says the second for both. The kernel module's /proc file and the driver's library tell
   them apart, so that a machine without NVIDIA's driver (a CPU-only machine) is named as
   such. */
static void explain_driver(cudaError_t err) {
  char version[160] = "";
  FILE *f = fopen("/proc/driver/nvidia/version", "r");
  if (f != NULL) {
    if (fgets(version, sizeof version, f) == NULL) version[0] = '\0';
    fclose(f);
    version[strcspn(version, "\n")] = '\0';
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  const char *lib_error = lib == NULL ? dlerror() : NULL;
  if (lib != NULL) dlclose(lib);
  if (f == NULL && lib == NULL) {
    snprintf(cuda_rt.why, sizeof cuda_rt.why,
             "no NVIDIA driver on this machine (no /proc/driver/nvidia/version, and libcuda.so.1 "
             "cannot be opened): a GPU needs NVIDIA's driver installed");
  } else if (f == NULL) {
    snprintf(cuda_rt.why, sizeof cuda_rt.why,
             "the NVIDIA driver's kernel module is not loaded (no /proc/driver/nvidia/version; "
             "libcuda.so.1 is installed): is there an NVIDIA GPU, and is its driver running?");
  } else if (lib == NULL) {
    snprintf(cuda_rt.why, sizeof cuda_rt.why,
             "the NVIDIA kernel driver is loaded (%.100s) but its library libcuda.so.1 cannot be "
             "opened: %.200s", version, lib_error ? lib_error : "?");
  } else {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    snprintf(cuda_rt.why, sizeof cuda_rt.why,
             "the NVIDIA driver (%.100s; CUDA %d.%d) is older than the CUDA runtime l2l was built "
             "with (CUDA %d.%d): update the driver (%s)", version, driver / 1000, driver % 1000 / 10,
             runtime / 1000, runtime % 1000 / 10, cudaGetErrorName(err));
  }
}

static void runtime_start(void) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorInsufficientDriver) {
    explain_driver(err);
    return;
  }
  if (err != cudaSuccess) {
    runtime_say("cudaGetDeviceCount", err);
    return;
  }
  if (count == 0) {
    snprintf(cuda_rt.why, sizeof cuda_rt.why, "no CUDA device is present");
    return;
  }
  cuda_rt.device = backend_accelerator_index(count, cuda_rt.why, sizeof cuda_rt.why);
  if (cuda_rt.device < 0) return;
  struct cudaDeviceProp prop;
  if ((err = cudaGetDeviceProperties(&prop, cuda_rt.device)) != cudaSuccess) {
    runtime_say("cudaGetDeviceProperties", err);
    return;
  }
  /* kernels/ are built for sm_80 and sm_90 (plus PTX for newer GPUs): older GPUs would
     fail at the first launch with "no kernel image". */
  if (prop.major < 8) {
    snprintf(cuda_rt.why, sizeof cuda_rt.why,
             "%.200s has compute capability %d.%d; l2l's kernels need 8.0 or newer", prop.name,
             prop.major, prop.minor);
    return;
  }
  if ((err = cudaSetDevice(cuda_rt.device)) != cudaSuccess ||
      (err = cudaStreamCreateWithFlags(&cuda_rt.compute, cudaStreamNonBlocking)) != cudaSuccess ||
      (err = (cudaError_t)own_alloc(&cuda_rt.scratch, SCRATCH_BYTES)) != cudaSuccess ||
      (err = (cudaError_t)own_alloc(&cuda_rt.cublas_workspace, CUBLAS_WORKSPACE_BYTES)) != cudaSuccess ||
      (err = (cudaError_t)own_alloc(&cuda_rt.gelu_slopes, sizeof gelu_slopes()->slope)) != cudaSuccess ||
      /* (on the compute stream, which every kernel reading the tables runs on: a cudaMemcpy
         from pageable memory may return before its copy lands, and the compute stream does
         not wait for the legacy stream's work; the tables are static, so the copy may read
         them later) */
      (err = cudaMemcpyAsync(cuda_rt.gelu_slopes, gelu_slopes()->slope,
                             sizeof gelu_slopes()->slope, cudaMemcpyHostToDevice,
                             cuda_rt.compute)) != cudaSuccess) {
    runtime_say("setting up the device (stream, scratch, GELU's slope tables)", err);
    return;
  }
  if (!open_cublas()) return;
  cublasStatus_t st = cublas.create(&cuda_rt.blas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublas.set_stream(cuda_rt.blas, cuda_rt.compute);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublas.set_workspace(cuda_rt.blas, cuda_rt.cublas_workspace, CUBLAS_WORKSPACE_BYTES);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublas.set_pointer_mode(cuda_rt.blas, CUBLAS_POINTER_MODE_HOST);
  if (st != CUBLAS_STATUS_SUCCESS) {
    snprintf(cuda_rt.why, sizeof cuda_rt.why, "cuBLAS could not start: %s", cublas.status_string(st));
    return;
  }
  cuda_rt.scratch_bytes = SCRATCH_BYTES;
  cuda_rt.usable = 1;
}

/* The CUDA runtime's current device is a thread's own: each thread that reaches the GPU
   through here selects the process's device once (the starting thread did in
   runtime_start). */
static _Thread_local bool thread_on_device;

int cuda_probe(char *why, size_t len) {
  pthread_once(&cuda_rt.once, runtime_start);
  if (!cuda_rt.usable && why != NULL && len > 0) snprintf(why, len, "%s", cuda_rt.why);
  if (cuda_rt.usable && !thread_on_device) {
    thread_on_device = true;
    if (cudaSetDevice(cuda_rt.device) != cudaSuccess) cudaGetLastError();
  }
  return cuda_rt.usable;
}

l2l_status cuda_need_runtime(void) {
  if (cuda_probe(NULL, 0)) return L2L_OK;
  return core_fail(L2L_ERR_UNSUPPORTED, "CUDA cannot run here: %s", cuda_rt.why);
}

l2l_status cuda_wait_stream(void) {
  CUDA_TRY(cudaStreamSynchronize(cuda_rt.compute));
  return L2L_OK;
}

static l2l_status cuda_synchronize(void) {
  TRY(cuda_need_runtime());
  return cuda_wait_stream();
}

void cuda_use_tf32(int enable) { atomic_store(&cuda_rt.tf32, enable); }

l2l_status cuda_fill_info(l2l_cuda_info *out) {
  struct cudaDeviceProp prop;
  l2l_cuda_info info;
  memset(&info, 0, sizeof info);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_TRY(cudaGetDeviceProperties(&prop, cuda_rt.device));
  CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  CUDA_TRY(cudaRuntimeGetVersion(&info.runtime_version));
  CUDA_TRY(cudaDriverGetVersion(&info.driver_version));
  snprintf(info.name, sizeof info.name, "%s", prop.name);
  info.major = prop.major, info.minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.total_bytes = total_bytes, info.free_bytes = free_bytes;
  *out = info;
  return L2L_OK;
}

/* ---------------------------------------------------------------- copy lanes */

/* A lane: the calling thread's stream and an event to wait on its copies, made when the
   thread first waits for a mark, destroyed when the thread exits. Events block (the
   host thread sleeps rather than spins: the EPS's optimizer threads want the cores). */
static pthread_key_t lane_key;
static pthread_once_t lane_key_once = PTHREAD_ONCE_INIT;
_Thread_local struct lane *cuda_lane;

static void lane_end(void *p) {
  struct lane *lane = p;
  if (lane->done) cudaEventDestroy(lane->done);
  if (lane->stream) cudaStreamDestroy(lane->stream);
  free(lane);
}
static bool lane_key_made;
static void lane_key_make(void) { lane_key_made = pthread_key_create(&lane_key, lane_end) == 0; }

static const unsigned LANE_EVENT_FLAGS = cudaEventDisableTiming | cudaEventBlockingSync;

/* Makes the calling thread a lane. Failing is harmless: its copies then stay on the
   compute stream, in order, only without overlap. */
static void lane_start(void) {
  if (cuda_lane != NULL) return;
  pthread_once(&lane_key_once, lane_key_make);
  struct lane *lane = lane_key_made ? calloc(1, sizeof *lane) : NULL;
  if (lane == NULL) return;
  cudaError_t err = cudaSetDevice(cuda_rt.device);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&lane->done, LANE_EVENT_FLAGS);
  if (err != cudaSuccess || pthread_setspecific(lane_key, lane) != 0) {
    cudaGetLastError();
    lane_end(lane);
    return;
  }
  cuda_lane = lane;
}

/* Events recorded once and then waited for or read (marks, stamps), kept for reuse: a
   step takes several per layer visit, and making one each time costs more than what it
   orders or times. Blocking-sync (a waiting thread sleeps), with timing (stamps read it). */
enum { EVENT_POOL_MAX = 4096 };
static cudaEvent_t event_pool[EVENT_POOL_MAX];
static int event_pool_count;
static pthread_mutex_t event_pool_lock = PTHREAD_MUTEX_INITIALIZER;

/* An event from the pool recorded on `stream`, or NULL (the error cleared). */
static cudaEvent_t event_record(cudaStream_t stream) {
  if (!cuda_probe(NULL, 0)) return NULL;
  cudaEvent_t ev = NULL;
  pthread_mutex_lock(&event_pool_lock);
  if (event_pool_count > 0) ev = event_pool[--event_pool_count];
  pthread_mutex_unlock(&event_pool_lock);
  if (ev == NULL && cudaEventCreateWithFlags(&ev, cudaEventBlockingSync) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  if (cudaEventRecord(ev, stream) != cudaSuccess) {
    cudaGetLastError();
    cudaEventDestroy(ev);
    return NULL;
  }
  return ev;
}

static void event_give_back(cudaEvent_t ev) {
  pthread_mutex_lock(&event_pool_lock);
  bool kept = event_pool_count < EVENT_POOL_MAX;
  if (kept) event_pool[event_pool_count++] = ev;
  pthread_mutex_unlock(&event_pool_lock);
  if (!kept) cudaEventDestroy(ev);
}

static void *cuda_mark(void) {
  cudaEvent_t mark = event_record(cuda_rt.compute);
  if (mark == NULL && cuda_probe(NULL, 0))
    cudaStreamSynchronize(cuda_rt.compute); /* no mark: the order then holds by waiting now */
  return mark;
}

/* The GPU keeps the order, not the host: the lane's stream waits for the mark, and the
   lane's next copy queues at once behind it (a waited copy then waits for it and for the
   copies queued before it on the lane, not for the compute stream). A thread that could
   not become a lane copies on the compute stream, behind the mark already. The event goes back to the pool at once: a stream wait uses the record
   it was given, whatever later records do. */
static l2l_status cuda_wait_mark(void *mark) {
  TRY(cuda_need_runtime());
  lane_start();
  if (mark == NULL) return L2L_OK;
  cudaEvent_t ev = (cudaEvent_t)mark;
  cudaError_t err = cuda_lane != NULL ? cudaStreamWaitEvent(cuda_lane->stream, ev, 0)
                                      : cudaSuccess;
  if (err != cudaSuccess) {   /* the host then keeps the order */
    cudaGetLastError();
    err = cudaEventSynchronize(ev);
  }
  if (err == cudaSuccess)
    event_give_back(ev);
  else
    cudaEventDestroy(ev);
  CUDA_TRY(err);
  return L2L_OK;
}

/* ---------------------------------------------------------------- stamps */

static void *cuda_stamp(void) {
  return event_record(cuda_lane != NULL ? cuda_lane->stream : cuda_rt.compute);
}

static bool cuda_stamp_wait(void *stamp) {
  if (cudaEventSynchronize((cudaEvent_t)stamp) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

static bool cuda_stamp_seconds(double *out, void *from, void *to) {
  float ms = 0.0f;
  /* cudaErrorNotReady from either: not happened yet (not an error to keep) */
  if (cudaEventQuery((cudaEvent_t)from) != cudaSuccess ||
      cudaEventQuery((cudaEvent_t)to) != cudaSuccess ||
      cudaEventElapsedTime(&ms, (cudaEvent_t)from, (cudaEvent_t)to) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *out = (double)ms * 1e-3;
  return true;
}

static void cuda_stamp_release(void *stamp) { event_give_back((cudaEvent_t)stamp); }

/* ---------------------------------------------------------------- caching allocator */

/* Device memory through a block cache (core.h): after a training step's first round
   nothing reaches cudaMalloc. A block freed by the compute thread is cached with an event
   recorded on the compute stream (its tag): the kernels queued before the free, the last
   that can touch it. The compute stream reuses the block in order anyway; a copy lane
   that takes it (a KARMA swap-in) makes its stream wait for that event on the GPU, and
   so waits for those kernels alone, not for everything queued since. */
static int device_block_alloc(void **out, uint64_t size) {
  int err = (int)cudaMalloc(out, size);
  if (err != cudaSuccess) cudaGetLastError();   /* clear it: the caller explains it */
  return err;
}
static void device_block_free(void *ptr, void *tag) {
  cudaFree(ptr);   /* synchronizes the device: the tag's event is past */
  if (tag != NULL) event_give_back((cudaEvent_t)tag);
}
static const struct block_source device_blocks = {device_block_alloc, device_block_free};
static struct block_cache cache = L2L_BLOCK_CACHE(&device_blocks);

/* The calling thread may use a block taken from the cache with `tag`: a lane's stream
   waits for the tag on the GPU (the host, if that fails); the compute stream is in order. */
static cudaError_t block_ready(void *tag) {
  if (tag == NULL) return cudaSuccess;
  cudaEvent_t ev = (cudaEvent_t)tag;
  cudaError_t err = cudaSuccess;
  if (cuda_lane != NULL && cudaStreamWaitEvent(cuda_lane->stream, ev, 0) != cudaSuccess) {
    cudaGetLastError();
    err = cudaEventSynchronize(ev);
  }
  event_give_back(ev);
  return err;
}

static l2l_status cuda_malloc(void **out, uint64_t bytes) {
  char want[32], held[32];
  TRY(cuda_need_runtime());
  void *tag = NULL;
  int err = blocks_get(&cache, out, bytes, &tag);
  if (err == 0) {
    cudaError_t ready = block_ready(tag);
    if (ready != cudaSuccess) {
      blocks_put(&cache, *out, bytes, NULL);
      CUDA_TRY(ready);
    }
    return L2L_OK;
  }
  uint64_t size = block_size(bytes), reserved = 0;
  blocks_counts(&cache, &reserved, NULL, NULL);
  return core_fail(L2L_ERR_NOMEM,
                   "device pool: the GPU refused %llu bytes (%s): %s; l2l holds %llu bytes (%s) "
                   "of device memory",
                   (unsigned long long)size, core_human_bytes(want, 32, size),
                   cudaGetErrorString((cudaError_t)err), (unsigned long long)reserved,
                   core_human_bytes(held, 32, reserved));
}

/* Back to the cache, tagged with an event after the kernels queued so far when kernels
   may still use the block (without an event, after waiting for the stream instead). */
static void put_back(void *ptr, uint64_t bytes, bool after_compute) {
  void *tag = NULL;
  if (after_compute && ptr != NULL) {
    tag = event_record(cuda_rt.compute);
    if (tag == NULL) cudaStreamSynchronize(cuda_rt.compute);
  }
  blocks_put(&cache, ptr, bytes, tag);
}

/* A lane frees a block after its own copy of it is done (the copy waited for the kernels
   before it), so the block is free now; the compute thread's frees follow its kernels. */
static void cuda_free(void *ptr, uint64_t bytes) { put_back(ptr, bytes, cuda_lane == NULL); }

/* ---------------------------------------------------------------- the backend's own blocks */

/* The scratch and cuBLAS's workspace are blocks of the same cache, so that the pool's
   reserved counts them and the budget leaves room for them (own_bytes); a scratch that
   grows puts its old block back like a tensor's, never calling cudaFree (which would
   wait for the whole device). */
static _Atomic uint64_t own_bytes_now;

static int own_alloc(void **out, uint64_t bytes) {
  void *tag = NULL;
  int err = blocks_get(&cache, out, bytes, &tag);
  if (err == 0) {
    err = (int)block_ready(tag);
    if (err != 0) blocks_put(&cache, *out, bytes, NULL);
  }
  if (err == 0) atomic_fetch_add(&own_bytes_now, block_size(bytes));
  return err;
}

l2l_status cuda_scratch_grow(uint64_t bytes) {
  void *grown = NULL;
  int err = own_alloc(&grown, bytes);
  if (err != 0) {
    char want[32];
    return core_fail(L2L_ERR_NOMEM, "the CUDA backend's scratch cannot grow to %s: %s",
                     core_human_bytes(want, 32, bytes), cudaGetErrorString((cudaError_t)err));
  }
  put_back(cuda_rt.scratch, cuda_rt.scratch_bytes, true);   /* after the kernels using it */
  atomic_fetch_sub(&own_bytes_now, block_size(cuda_rt.scratch_bytes));
  cuda_rt.scratch = grown, cuda_rt.scratch_bytes = bytes;
  return L2L_OK;
}

static uint64_t cuda_own_bytes(void) { return atomic_load(&own_bytes_now); }

static void cuda_pool_counts(uint64_t *reserved, uint64_t *system_allocs) {
  blocks_counts(&cache, reserved, NULL, system_allocs);
}

static int cuda_host_alloc(void **out, uint64_t bytes) {
  int err = (int)cudaHostAlloc(out, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) cudaGetLastError();
  return err;
}

static void cuda_host_free(void *ptr) { cudaFreeHost(ptr); }

static l2l_status cuda_release_cache(void) {
  TRY(cuda_need_runtime());
  TRY(cuda_wait_stream());
  blocks_release_cached(&cache);
  return L2L_OK;
}

static l2l_status cuda_memory(uint64_t *free_bytes, uint64_t *total_bytes) {
  TRY(cuda_need_runtime());
  size_t f = 0, t = 0;
  CUDA_TRY(cudaMemGetInfo(&f, &t));
  *free_bytes = f, *total_bytes = t;
  return L2L_OK;
}

/* ---------------------------------------------------------------- the device table */

const struct device_ops cuda_device = {
    .name = "cuda",
    .alloc = cuda_malloc,
    .free = cuda_free,
    .counts = cuda_pool_counts,
    .own_bytes = cuda_own_bytes,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .release_cache = cuda_release_cache,
    .synchronize = cuda_synchronize,
    .mark = cuda_mark,
    .wait_mark = cuda_wait_mark,
    .stamp = cuda_stamp,
    .stamp_wait = cuda_stamp_wait,
    .stamp_seconds = cuda_stamp_seconds,
    .stamp_release = cuda_stamp_release,
    .memory = cuda_memory,
};

#endif /* L2L_CUDA */
