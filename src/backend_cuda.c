/* backend_cuda.c — the CUDA ops table: cuBLAS for GEMMs, kernels/ for everything else,
 * and the device pool's caching allocator.
 *
 * Purpose: run every op of the ops table on the GPU with the meaning the CPU backend
 * (backend_cpu.c) defines, so that a layer computes the same numbers on either. Work is
 * queued on one compute stream in call order; an op that hands a result to the host
 * (a reduction, a range check, a copy to host memory) waits for the stream first.
 * The relay's copy threads are "lanes": each copies on a stream of its own, so that
 * transfers in both directions overlap the kernels. A lane copy first waits for a mark
 * (an event recorded on the compute stream when the relay queued the copy: everything
 * it depends on, or whose memory it overwrites, was queued before), and returns when
 * the copy is done. Device memory comes from a caching allocator over cudaMalloc: a
 * block freed by a tensor goes to a list of free blocks of its size and serves the next
 * request of that size, so a training step's steady state calls neither cudaMalloc nor
 * cudaFree. Reuse is safe because a block is freed in the compute stream's order (its
 * kernels queued before the free) and a lane that takes a block first waits for the
 * compute stream as it is at that moment.
 *
 * Every CUDA, cuBLAS or launch error becomes L2L_ERR_BACKEND with file, line, the call
 * and CUDA's own words. A build without CUDA (NO_CUDA=1, no nvcc, or SANITIZE=1) compiles
 * only the stubs at the end, which say so.
 * Must never: exit or abort on a CUDA error, allocate from a pool, or include a CUDA
 * header outside this file and kernels/.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

#ifdef L2L_CUDA

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "../kernels/attention.h"
#include "../kernels/elementwise.h"
#include "../kernels/norm.h"
#include "../kernels/reduce.h"
#include "blocks.h"
#include "half.h"

/* ---------------------------------------------------------------- errors */

static l2l_status cuda_error(cudaError_t err, const char *file, int line, const char *call) {
  return l2l_fail(L2L_ERR_BACKEND, "%s:%d: %s failed: %s (%s)", file, line, call,
                  cudaGetErrorString(err), cudaGetErrorName(err));
}

/* cuBLAS is opened when CUDA first starts, not linked: its libraries are some 700 MB,
   and mapping them cost every l2l process about 0.45 s at start-up, GPU or not. */
static struct {
  __typeof__(cublasCreate_v2) *create;
  __typeof__(cublasSetStream_v2) *set_stream;
  __typeof__(cublasSetWorkspace_v2) *set_workspace;
  __typeof__(cublasSetPointerMode_v2) *set_pointer_mode;
  __typeof__(cublasGemmEx) *gemm;
  __typeof__(cublasGemmStridedBatchedEx) *gemm_strided_batched;
  __typeof__(cublasGetStatusString) *status_string;
  __typeof__(cublasGetStatusName) *status_name;
} blas;

static l2l_status cublas_error(cublasStatus_t err, const char *file, int line,
                               const char *call) {
  return l2l_fail(L2L_ERR_BACKEND, "%s:%d: %s failed: %s (%s)", file, line, call,
                  blas.status_string(err), blas.status_name(err));
}

/* A CUDA runtime call, or a launcher's returned cudaError_t. */
#define CUDA_TRY(call)                                                          \
  do {                                                                          \
    cudaError_t cuda_err_ = (cudaError_t)(call);                                \
    if (cuda_err_ != cudaSuccess) return cuda_error(cuda_err_, __FILE__, __LINE__, #call); \
  } while (0)

#define CUBLAS_TRY(call)                                                        \
  do {                                                                          \
    cublasStatus_t cublas_err_ = (call);                                        \
    if (cublas_err_ != CUBLAS_STATUS_SUCCESS)                                   \
      return cublas_error(cublas_err_, __FILE__, __LINE__, #call);              \
  } while (0)

/* ---------------------------------------------------------------- the runtime */

/* Bytes of device scratch the backend keeps for ops that need a little (reduction
   partials, a result to copy back, column-sum partials) and for cuBLAS's workspace. */
enum { SCRATCH_BYTES = 32 << 20, CUBLAS_WORKSPACE_BYTES = 32 << 20 };

static struct {
  pthread_once_t once;
  int usable;
  char why[512];            /* when not usable */
  int device;
  cudaStream_t compute;
  cublasHandle_t blas;
  void *cublas_workspace;
  void *scratch;            /* SCRATCH_BYTES */
  atomic_int tf32;
  pthread_mutex_t lock;     /* serializes ops that use the scratch */
} rt = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void runtime_say(const char *what, cudaError_t err) {
  snprintf(rt.why, sizeof rt.why, "%s: %s (%s)", what, cudaGetErrorString(err),
           cudaGetErrorName(err));
}

/* libcublas of the toolkit l2l was built with: from its lib folder (compiled in), else
   wherever the dynamic loader finds that version. */
static bool open_cublas(void) {
  char path[512];
  void *lib = NULL;
#ifdef L2L_CUDA_LIBDIR
  snprintf(path, sizeof path, "%s/libcublas.so.%d", L2L_CUDA_LIBDIR, CUBLAS_VER_MAJOR);
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
#endif
  if (lib == NULL) {
    snprintf(path, sizeof path, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  if (lib == NULL) {
    snprintf(rt.why, sizeof rt.why, "cannot open %.200s: %.250s", path, dlerror());
    return false;
  }
  void *fns[] = {
      dlsym(lib, "cublasCreate_v2"),         dlsym(lib, "cublasSetStream_v2"),
      dlsym(lib, "cublasSetWorkspace_v2"),   dlsym(lib, "cublasSetPointerMode_v2"),
      dlsym(lib, "cublasGemmEx"),            dlsym(lib, "cublasGemmStridedBatchedEx"),
      dlsym(lib, "cublasGetStatusString"),   dlsym(lib, "cublasGetStatusName"),
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
    if (fns[i] == NULL) {
      snprintf(rt.why, sizeof rt.why, "%.200s lacks a function l2l needs (number %zu)", path, i);
      return false;
    }
  /* POSIX lets a void * from dlsym become a function pointer; memcpy says so to C. */
  memcpy(&blas.create, &fns[0], sizeof fns[0]);
  memcpy(&blas.set_stream, &fns[1], sizeof fns[1]);
  memcpy(&blas.set_workspace, &fns[2], sizeof fns[2]);
  memcpy(&blas.set_pointer_mode, &fns[3], sizeof fns[3]);
  memcpy(&blas.gemm, &fns[4], sizeof fns[4]);
  memcpy(&blas.gemm_strided_batched, &fns[5], sizeof fns[5]);
  memcpy(&blas.status_string, &fns[6], sizeof fns[6]);
  memcpy(&blas.status_name, &fns[7], sizeof fns[7]);
  return true;
}

static void runtime_start(void) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    runtime_say("cudaGetDeviceCount", err);
    return;
  }
  if (count == 0) {
    snprintf(rt.why, sizeof rt.why, "no CUDA device is present");
    return;
  }
  struct cudaDeviceProp prop;
  if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
    runtime_say("cudaGetDeviceProperties", err);
    return;
  }
  /* kernels/ are built for sm_80 and sm_90 (plus PTX for newer GPUs): older GPUs would
     fail at the first launch with "no kernel image". */
  if (prop.major < 8) {
    snprintf(rt.why, sizeof rt.why,
             "%.200s has compute capability %d.%d; l2l's kernels need 8.0 or newer", prop.name,
             prop.major, prop.minor);
    return;
  }
  rt.device = 0;
  if ((err = cudaSetDevice(rt.device)) != cudaSuccess ||
      (err = cudaStreamCreateWithFlags(&rt.compute, cudaStreamNonBlocking)) != cudaSuccess ||
      (err = cudaMalloc(&rt.scratch, SCRATCH_BYTES)) != cudaSuccess ||
      (err = cudaMalloc(&rt.cublas_workspace, CUBLAS_WORKSPACE_BYTES)) != cudaSuccess) {
    runtime_say("setting up the device (stream, scratch)", err);
    return;
  }
  if (!open_cublas()) return;
  cublasStatus_t st = blas.create(&rt.blas);
  if (st == CUBLAS_STATUS_SUCCESS) st = blas.set_stream(rt.blas, rt.compute);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = blas.set_workspace(rt.blas, rt.cublas_workspace, CUBLAS_WORKSPACE_BYTES);
  if (st == CUBLAS_STATUS_SUCCESS) st = blas.set_pointer_mode(rt.blas, CUBLAS_POINTER_MODE_HOST);
  if (st != CUBLAS_STATUS_SUCCESS) {
    snprintf(rt.why, sizeof rt.why, "cuBLAS could not start: %s", blas.status_string(st));
    return;
  }
  rt.usable = 1;
}

int l2l_cuda_probe(char *why, size_t len) {
  pthread_once(&rt.once, runtime_start);
  if (!rt.usable && why != NULL && len > 0) snprintf(why, len, "%s", rt.why);
  return rt.usable;
}

static l2l_status need_runtime(void) {
  if (l2l_cuda_probe(NULL, 0)) return L2L_OK;
  return l2l_fail(L2L_ERR_UNSUPPORTED, "CUDA cannot run here: %s", rt.why);
}

/* Waits for the compute stream: before the host reads what the GPU wrote. */
static l2l_status wait_stream(void) {
  CUDA_TRY(cudaStreamSynchronize(rt.compute));
  return L2L_OK;
}

l2l_status l2l_cuda_synchronize(void) {
  TRY(need_runtime());
  return wait_stream();
}

void l2l_cuda_use_tf32(int enable) { atomic_store(&rt.tf32, enable); }

l2l_status l2l_cuda_fill_info(l2l_cuda_info *out) {
  struct cudaDeviceProp prop;
  l2l_cuda_info info;
  memset(&info, 0, sizeof info);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_TRY(cudaGetDeviceProperties(&prop, rt.device));
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
struct lane {
  cudaStream_t stream;
  cudaEvent_t done;
};
static pthread_key_t lane_key;
static pthread_once_t lane_key_once = PTHREAD_ONCE_INIT;
static _Thread_local struct lane *this_lane;

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
  if (this_lane != NULL) return;
  pthread_once(&lane_key_once, lane_key_make);
  struct lane *lane = lane_key_made ? calloc(1, sizeof *lane) : NULL;
  if (lane == NULL) return;
  cudaError_t err = cudaSetDevice(rt.device);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&lane->done, LANE_EVENT_FLAGS);
  if (err != cudaSuccess || pthread_setspecific(lane_key, lane) != 0) {
    cudaGetLastError();
    lane_end(lane);
    return;
  }
  this_lane = lane;
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
  if (!l2l_cuda_probe(NULL, 0)) return NULL;
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

void *l2l_cuda_mark(void) {
  cudaEvent_t mark = event_record(rt.compute);
  if (mark == NULL && l2l_cuda_probe(NULL, 0))
    cudaStreamSynchronize(rt.compute); /* no mark: the order then holds by waiting now */
  return mark;
}

l2l_status l2l_cuda_wait_mark(void *mark) {
  TRY(need_runtime());
  lane_start();
  if (mark == NULL) return L2L_OK;
  cudaError_t err = cudaEventSynchronize((cudaEvent_t)mark);
  if (err == cudaSuccess)
    event_give_back((cudaEvent_t)mark);
  else
    cudaEventDestroy((cudaEvent_t)mark);
  CUDA_TRY(err);
  return L2L_OK;
}

/* ---------------------------------------------------------------- stamps */

void *l2l_cuda_stamp(void) {
  return event_record(this_lane != NULL ? this_lane->stream : rt.compute);
}

bool l2l_cuda_stamp_wait(void *stamp) {
  if (cudaEventSynchronize((cudaEvent_t)stamp) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

bool l2l_cuda_stamp_seconds(double *out, void *from, void *to) {
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

void l2l_cuda_stamp_release(void *stamp) { event_give_back((cudaEvent_t)stamp); }

/* ---------------------------------------------------------------- caching allocator */

/* Device memory through a block cache (blocks.h): after a training step's first round
   nothing reaches cudaMalloc. */
static int device_block_alloc(void **out, uint64_t size) {
  int err = (int)cudaMalloc(out, size);
  if (err != cudaSuccess) cudaGetLastError();   /* clear it: the caller explains it */
  return err;
}
static void device_block_free(void *ptr) { cudaFree(ptr); }
static const struct l2l_block_source device_blocks = {device_block_alloc, device_block_free};
static struct l2l_block_cache cache = L2L_BLOCK_CACHE(&device_blocks);

l2l_status l2l_cuda_malloc(void **out, uint64_t bytes) {
  char want[32], held[32];
  TRY(need_runtime());
  int err = l2l_blocks_get(&cache, out, bytes);
  if (err == 0 && this_lane != NULL) {
    /* A cached block may still be read or written by kernels queued before its free: a
       lane (whose copies do not follow the compute stream) waits for them. (A KARMA
       swap-in allocates here, so it waits for the compute stream queued so far.) */
    l2l_status status = l2l_cuda_wait_mark(l2l_cuda_mark());
    if (status != L2L_OK) {
      l2l_blocks_put(&cache, *out, bytes);
      return status;
    }
  }
  if (err != 0) {
    uint64_t size = l2l_block_size(bytes), reserved = 0;
    l2l_blocks_counts(&cache, &reserved, NULL, NULL);
    return l2l_fail(L2L_ERR_NOMEM,
                    "device pool: the GPU refused %llu bytes (%s): %s; l2l holds %llu bytes (%s) "
                    "of device memory",
                    (unsigned long long)size, l2l_human_bytes(want, 32, size),
                    cudaGetErrorString((cudaError_t)err), (unsigned long long)reserved,
                    l2l_human_bytes(held, 32, reserved));
  }
  return L2L_OK;
}

void l2l_cuda_free(void *ptr, uint64_t bytes) { l2l_blocks_put(&cache, ptr, bytes); }

void l2l_cuda_pool_counts(uint64_t *reserved, uint64_t *system_allocs) {
  l2l_blocks_counts(&cache, reserved, NULL, system_allocs);
}

int l2l_cuda_host_alloc(void **out, uint64_t bytes) {
  int err = (int)cudaHostAlloc(out, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) cudaGetLastError();
  return err;
}

void l2l_cuda_host_free(void *ptr) { cudaFreeHost(ptr); }

l2l_status l2l_cuda_release_cache(void) {
  TRY(need_runtime());
  TRY(wait_stream());
  l2l_blocks_release_cached(&cache);
  return L2L_OK;
}

/* ---------------------------------------------------------------- GEMM */

/* Row-major c = alpha op(a) op(b) + beta c is column-major c^T = alpha op(b)^T op(a)^T
   + beta c^T: cuBLAS gets b first, and the same transposes (a row-major matrix read as
   column-major is already its transpose). a and b are f32, f16 or bf16 (both the same);
   c and the accumulation are f32. */
static l2l_status cuda_gemm_batched(float *c, const void *a, const void *b, l2l_dtype ab_dtype,
                                    int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                                    int trans_b, float alpha, float beta) {
  int lda = (int)(trans_a ? m : k), ldb = (int)(trans_b ? k : n), ldc = (int)n;
  cudaDataType_t type = ab_dtype == L2L_BF16 ? CUDA_R_16BF
                        : ab_dtype == L2L_F16 ? CUDA_R_16F
                                              : CUDA_R_32F;
  cublasComputeType_t compute = ab_dtype == L2L_F32 && atomic_load(&rt.tf32)
                                    ? CUBLAS_COMPUTE_32F_FAST_TF32
                                    : CUBLAS_COMPUTE_32F;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    CUBLAS_TRY(blas.gemm(rt.blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, b, type, ldb,
                            a, type, lda, &beta, c, CUDA_R_32F, ldc, compute,
                            CUBLAS_GEMM_DEFAULT));
  } else {
    CUBLAS_TRY(blas.gemm_strided_batched(rt.blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha,
                                          b, type, ldb, k * n, a, type, lda, m * k, &beta, c,
                                          CUDA_R_32F, ldc, m * n, (int)batch, compute,
                                          CUBLAS_GEMM_DEFAULT));
  }
  return L2L_OK;
}

/* ---------------------------------------------------------------- copies */

/* Between any two pools; the host side may be pageable (jemalloc) or pinned memory.
   A copy that touches host memory waits for it: the caller may reuse that memory next.
   On a lane: on the lane's stream, and done when this returns. */
static l2l_status cuda_copy(void *dst, l2l_pool_kind dst_pool, const void *src,
                            l2l_pool_kind src_pool, uint64_t bytes) {
  struct lane *lane = this_lane;
  if (lane != NULL) {
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, lane->stream));
    cudaError_t err = cudaEventRecord(lane->done, lane->stream);
    if (err == cudaSuccess) err = cudaEventSynchronize(lane->done);
    if (err != cudaSuccess) {
      cudaStreamSynchronize(lane->stream);   /* the caller frees the buffers next */
      return cuda_error(err, __FILE__, __LINE__, "waiting for a copy lane's copy");
    }
    return L2L_OK;
  }
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, rt.compute));
  if (dst_pool != L2L_POOL_DEVICE || src_pool != L2L_POOL_DEVICE) TRY(wait_stream());
  return L2L_OK;
}

/* ---------------------------------------------------------------- scratch */

/* The backend's own device scratch: results the host reads back (a double, an index)
   and partial sums of the ops that need them. It grows when an op needs more (rarely:
   at the first call of a larger shape), never in the steady state. Ops that use it hold
   rt.lock from their first launch to their last read, so that two host threads' ops
   never interleave on it. */
enum { RESULT_BYTES = 256, REDUCE_BYTES = L2L_K_REDUCE_SCRATCH_DOUBLES * sizeof(double) };
static uint64_t scratch_bytes = SCRATCH_BYTES;

/* Floats of scratch after the result and reduction areas, at least `floats` of them.
   Called with rt.lock held. */
static l2l_status scratch_floats(float **out, int64_t floats) {
  uint64_t need = RESULT_BYTES + REDUCE_BYTES + (uint64_t)floats * sizeof(float);
  if (need > scratch_bytes) {
    TRY(wait_stream());
    void *grown = NULL;
    CUDA_TRY(cudaMalloc(&grown, need));
    cudaFree(rt.scratch);
    rt.scratch = grown, scratch_bytes = need;
  }
  *out = (float *)((char *)rt.scratch + RESULT_BYTES + REDUCE_BYTES);
  return L2L_OK;
}

static double *scratch_reduce(void) { return (double *)((char *)rt.scratch + RESULT_BYTES); }

/* Copies `bytes` of the result area to the host, after everything queued. */
static l2l_status read_result(void *host, uint64_t bytes) {
  CUDA_TRY(cudaMemcpyAsync(host, rt.scratch, bytes, cudaMemcpyDeviceToHost, rt.compute));
  return wait_stream();
}

/* A launcher's returned cudaError_t, with where it was called. */
#define LAUNCH(call) CUDA_TRY(call)

/* Returns `call` (an op body that uses the scratch), run with rt.lock held. */
#define WITH_SCRATCH(call)                      \
  do {                                          \
    pthread_mutex_lock(&rt.lock);               \
    l2l_status locked_status_ = (call);         \
    pthread_mutex_unlock(&rt.lock);             \
    return locked_status_;                      \
  } while (0)

/* ---------------------------------------------------------------- element-wise */

static l2l_status cuda_add(float *out, const float *a, const float *b, int64_t n) {
  LAUNCH(l2l_k_add(out, a, b, n, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_bias_add(float *y, const float *bias, int64_t rows, int64_t cols) {
  LAUNCH(l2l_k_bias_add(y, bias, rows, cols, rt.compute));
  return L2L_OK;
}

static l2l_status bias_backward_locked(float *dbias, const float *dy, int64_t rows,
                                       int64_t cols) {
  float *scratch = NULL;
  TRY(scratch_floats(&scratch, l2l_k_bias_backward_scratch_floats(rows, cols)));
  LAUNCH(l2l_k_bias_backward(dbias, dy, rows, cols, scratch, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_bias_backward(float *dbias, const float *dy, int64_t rows, int64_t cols) {
  WITH_SCRATCH(bias_backward_locked(dbias, dy, rows, cols));
}

static l2l_status cuda_gelu_forward(float *y, const float *x, int64_t n) {
  LAUNCH(l2l_k_gelu_forward(y, x, n, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_gelu_backward(float *dx, const float *dy, const float *x, int64_t n) {
  LAUNCH(l2l_k_gelu_backward(dx, dy, x, n, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_gelu_forward_bits(float *y, uint8_t *bits, const float *x, int64_t n) {
  LAUNCH(l2l_k_gelu_forward_bits(y, bits, x, n, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_gelu_backward_from_output(float *dx, const float *dy, const float *y,
                                                 const uint8_t *bits, int64_t n) {
  LAUNCH(l2l_k_gelu_backward_from_output(dx, dy, y, bits, n, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_bias_gelu_forward(float *pre, float *y, uint8_t *bits, const float *bias,
                                         int64_t rows, int64_t cols) {
  LAUNCH(l2l_k_bias_gelu_forward(pre, y, bits, bias, rows, cols, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_dropout_forward(float *y, uint8_t *mask, const float *x, float p,
                                       uint64_t seed, uint64_t stream, int64_t first, int64_t n) {
  LAUNCH(l2l_k_dropout_forward(y, mask, x, p, l2l_keep_threshold(p), seed, stream, first, n,
                               rt.compute));
  return L2L_OK;
}

static l2l_status cuda_dropout_backward(float *dx, const float *dy, const uint8_t *mask, float p,
                                        int64_t n) {
  LAUNCH(l2l_k_dropout_backward(dx, dy, mask, p, n, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_adamw(float *param, float *m, float *v, const float *grad, int64_t n,
                             const l2l_adamw_config *c, float bias_correction1,
                             float bias_correction2) {
  LAUNCH(l2l_k_adamw(param, m, v, grad, n, c->lr, c->beta1, c->beta2, c->eps, c->weight_decay,
                     bias_correction1, bias_correction2, rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- LayerNorm, softmax */

static l2l_status cuda_layernorm_forward(float *y, float *mean, float *rstd, const float *x,
                                         const float *weight, const float *bias, float eps,
                                         int64_t rows, int64_t cols) {
  LAUNCH(l2l_k_layernorm_forward(y, mean, rstd, x, weight, bias, eps, rows, cols, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_add_layernorm_forward(float *sum, float *y, float *mean, float *rstd,
                                             const float *a, const float *b, const float *weight,
                                             const float *bias, float eps, int64_t rows,
                                             int64_t cols) {
  LAUNCH(l2l_k_add_layernorm_forward(sum, y, mean, rstd, a, b, weight, bias, eps, rows, cols,
                                     rt.compute));
  return L2L_OK;
}

static l2l_status layernorm_backward_locked(float *dx, float *dweight, float *dbias,
                                            const float *dy, const float *src,
                                            const float *weight, const float *mean,
                                            const float *bias, const float *rstd, int64_t rows,
                                            int64_t cols) {
  float *scratch = NULL;
  if (dweight != NULL || dbias != NULL)
    TRY(scratch_floats(&scratch, l2l_k_layernorm_backward_scratch_floats(rows, cols)));
  if (mean != NULL)
    LAUNCH(l2l_k_layernorm_backward(dx, dweight, dbias, dy, src, weight, mean, rstd, rows, cols,
                                    scratch, rt.compute));
  else
    LAUNCH(l2l_k_layernorm_backward_from_output(dx, dweight, dbias, dy, src, weight, bias, rstd,
                                                rows, cols, scratch, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_layernorm_backward(float *dx, float *dweight, float *dbias,
                                          const float *dy, const float *x, const float *weight,
                                          const float *mean, const float *rstd, int64_t rows,
                                          int64_t cols) {
  WITH_SCRATCH(layernorm_backward_locked(dx, dweight, dbias, dy, x, weight, mean, NULL, rstd,
                                         rows, cols));
}

static l2l_status cuda_layernorm_backward_from_output(float *dx, float *dweight, float *dbias,
                                                      const float *dy, const float *y,
                                                      const float *weight, const float *bias,
                                                      const float *rstd, int64_t rows,
                                                      int64_t cols) {
  WITH_SCRATCH(layernorm_backward_locked(dx, dweight, dbias, dy, y, weight, NULL, bias, rstd,
                                         rows, cols));
}

static l2l_status cuda_softmax_forward(float *y, const float *x, const uint8_t *key_mask,
                                       int causal, float scale, int64_t samples,
                                       int64_t rows_per_sample, int64_t tq, int64_t tk) {
  LAUNCH(l2l_k_softmax_forward(y, x, key_mask, causal, scale, samples, rows_per_sample, tq, tk,
                               rt.compute));
  return L2L_OK;
}

static l2l_status cuda_softmax_backward(float *dx, const float *dy, const float *y, float scale,
                                        int64_t rows, int64_t cols) {
  LAUNCH(l2l_k_softmax_backward(dx, dy, y, scale, rows, cols, rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- embedding, loss */

static l2l_status cuda_embedding_forward(float *out, const int32_t *ids, const void *table,
                                         l2l_dtype table_dtype, int64_t n, int64_t cols) {
  LAUNCH(l2l_k_embedding_forward(out, ids, table, (int)table_dtype, n, cols, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                          int64_t n, int64_t vocab, int64_t cols) {
  LAUNCH(l2l_k_embedding_backward(dtable, dout, ids, n, vocab, cols, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_cross_entropy_forward(float *losses, const float *logits,
                                             const int32_t *targets, int32_t ignore_index,
                                             int64_t rows, int64_t vocab) {
  LAUNCH(l2l_k_cross_entropy_forward(losses, logits, targets, ignore_index, rows, vocab,
                                     rt.compute));
  return L2L_OK;
}

static l2l_status cuda_cross_entropy_backward(float *dlogits, const float *logits,
                                              const int32_t *targets, int32_t ignore_index,
                                              float scale, int64_t rows, int64_t vocab) {
  LAUNCH(l2l_k_cross_entropy_backward(dlogits, logits, targets, ignore_index, scale, rows, vocab,
                                      rt.compute));
  return L2L_OK;
}

static l2l_status cuda_cross_entropy_fused(float *losses, float *dlogits, const float *logits,
                                           const int32_t *targets, int32_t ignore_index,
                                           float scale, int64_t rows, int64_t vocab) {
  LAUNCH(l2l_k_cross_entropy_fused(losses, dlogits, logits, targets, ignore_index, scale, rows,
                                   vocab, rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- attention */

/* The launchers take no per-thread workspace: the backward's row terms D = do . o go to
   the backend's scratch. */
static int64_t cuda_attention_workspace(int64_t seq, int backward) {
  (void)seq, (void)backward;
  return 0;
}

static l2l_status cuda_attention_forward(float *o, float *lse, float *probs, float *dropped,
                                         uint8_t *mask, const float *q, const float *k,
                                         const float *v, const uint8_t *key_mask,
                                         const struct l2l_attention_shape *sh, float *workspace,
                                         int64_t workspace_floats) {
  (void)workspace, (void)workspace_floats;
  LAUNCH(l2l_k_attention_forward(o, lse, probs, dropped, mask, q, k, v, key_mask, sh->batch,
                                 sh->heads, sh->seq, sh->head_dim, sh->ld_qkv, sh->ld_o,
                                 sh->causal, sh->scale, sh->dropout,
                                 l2l_keep_threshold(sh->dropout), sh->seed, sh->stream,
                                 sh->first_sample, (int)sh->precision, NULL, rt.compute));
  return L2L_OK;
}

static l2l_status attention_backward_locked(float *dq, float *dk, float *dv, const float *d_o,
                                            const float *o, const float *lse, const float *probs,
                                            const float *dropped, const uint8_t *mask,
                                            const float *q, const float *k, const float *v,
                                            const uint8_t *key_mask,
                                            const struct l2l_attention_shape *sh) {
  float *scratch = NULL;
  TRY(scratch_floats(&scratch, l2l_k_attention_scratch_floats(sh->batch, sh->heads, sh->seq, 1)));
  LAUNCH(l2l_k_attention_backward(dq, dk, dv, d_o, o, lse, probs, dropped, mask, q, k, v,
                                  key_mask, sh->batch, sh->heads, sh->seq, sh->head_dim,
                                  sh->ld_qkv, sh->ld_o, sh->causal, sh->scale, sh->dropout,
                                  l2l_keep_threshold(sh->dropout), sh->seed, sh->stream,
                                  sh->first_sample, (int)sh->precision, scratch, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_attention_backward(float *dq, float *dk, float *dv, const float *d_o,
                                          const float *o, const float *lse, const float *probs,
                                          const float *dropped, const uint8_t *mask,
                                          const float *q, const float *k, const float *v,
                                          const uint8_t *key_mask,
                                          const struct l2l_attention_shape *sh,
                                          float *workspace, int64_t workspace_floats) {
  (void)workspace, (void)workspace_floats;
  WITH_SCRATCH(attention_backward_locked(dq, dk, dv, d_o, o, lse, probs, dropped, mask, q, k, v,
                                         key_mask, sh));
}

/* ---------------------------------------------------------------- results for the host */

static l2l_status reduce_locked(double *out, enum l2l_reduction kind, const float *x,
                                int64_t n) {
  LAUNCH(l2l_k_reduce((double *)rt.scratch, (int)kind, x, n, scratch_reduce(), rt.compute));
  return read_result(out, sizeof *out);
}

static l2l_status cuda_reduce(double *out, enum l2l_reduction kind, const float *x, int64_t n) {
  WITH_SCRATCH(reduce_locked(out, kind, x, n));
}

static l2l_status find_out_of_range_locked(int64_t *index, int32_t *value,
                                           const int32_t *values, int64_t n, int32_t lo,
                                           int32_t hi, int32_t except) {
  LAUNCH(l2l_k_find_out_of_range((int64_t *)rt.scratch, values, n, lo, hi, except, rt.compute));
  TRY(read_result(index, sizeof *index));
  if (*index >= 0) {
    CUDA_TRY(cudaMemcpyAsync(value, values + *index, sizeof *value, cudaMemcpyDeviceToHost,
                             rt.compute));
    TRY(wait_stream());
  }
  return L2L_OK;
}

static l2l_status cuda_find_out_of_range(int64_t *index, int32_t *value, const int32_t *values,
                                         int64_t n, int32_t lo, int32_t hi, int32_t except) {
  WITH_SCRATCH(find_out_of_range_locked(index, value, values, n, lo, hi, except));
}

/* ---------------------------------------------------------------- whole tensors */

/* The element's bit pattern made on the host, as cpu_fill converts the value. */
static l2l_status cuda_fill(void *dst, l2l_dtype dtype, double value, int64_t n) {
  uint32_t pattern = 0;
  switch (dtype) {
    case L2L_F32: {
      float f = (float)value;
      memcpy(&pattern, &f, sizeof f);
      break;
    }
    case L2L_F16: pattern = half_from_f32_f16((float)value); break;
    case L2L_BF16: pattern = half_from_f32_bf16((float)value); break;
    case L2L_I32: pattern = (uint32_t)(int32_t)value; break;
    case L2L_U8: pattern = (uint8_t)(int)value; break;
  }
  LAUNCH(l2l_k_fill(dst, (int)dtype, pattern, n, rt.compute));
  return L2L_OK;
}

/* A float-to-i32 conversion is refused, before anything is written, at the first value
   that is not an integer in range: the check runs and is read back first. */
static l2l_status convert_locked(void *dst, l2l_dtype dst_dtype, const void *src,
                                 l2l_dtype src_dtype, int64_t n, int64_t *bad) {
  *bad = -1;
  if (dst_dtype == L2L_I32 && src_dtype != L2L_I32) {
    LAUNCH(l2l_k_find_non_i32((int64_t *)rt.scratch, src, (int)src_dtype, n, rt.compute));
    TRY(read_result(bad, sizeof *bad));
    if (*bad >= 0) return L2L_OK;
  }
  LAUNCH(l2l_k_convert(dst, (int)dst_dtype, src, (int)src_dtype, n, rt.compute));
  return L2L_OK;
}

static l2l_status cuda_convert(void *dst, l2l_dtype dst_dtype, const void *src,
                               l2l_dtype src_dtype, int64_t n, int64_t *bad) {
  WITH_SCRATCH(convert_locked(dst, dst_dtype, src, src_dtype, n, bad));
}

static l2l_status cuda_random(void *dst, l2l_dtype dtype, int64_t n, enum l2l_distribution dist,
                              uint64_t seed, uint64_t stream, int64_t first, double a, double b) {
  LAUNCH(l2l_k_random(dst, (int)dtype, n, dist == L2L_NORMAL ? 1 : 0, seed, stream, first, a, b,
                      rt.compute));
  return L2L_OK;
}

/* ---------------------------------------------------------------- the table */

static const struct l2l_backend_ops cuda_backend = {
    .name = "cuda",
    .gemm_batched = cuda_gemm_batched,
    .bias_add = cuda_bias_add,
    .bias_backward = cuda_bias_backward,
    .add = cuda_add,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .softmax_forward = cuda_softmax_forward,
    .softmax_backward = cuda_softmax_backward,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .cross_entropy_forward = cuda_cross_entropy_forward,
    .cross_entropy_backward = cuda_cross_entropy_backward,
    .dropout_forward = cuda_dropout_forward,
    .dropout_backward = cuda_dropout_backward,
    .gelu_forward_bits = cuda_gelu_forward_bits,
    .gelu_backward_from_output = cuda_gelu_backward_from_output,
    .bias_gelu_forward = cuda_bias_gelu_forward,
    .add_layernorm_forward = cuda_add_layernorm_forward,
    .cross_entropy_fused = cuda_cross_entropy_fused,
    .layernorm_backward_from_output = cuda_layernorm_backward_from_output,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_workspace = cuda_attention_workspace,
    .reduce = cuda_reduce,
    .adamw = cuda_adamw,
    .find_out_of_range = cuda_find_out_of_range,
    .fill = cuda_fill,
    .convert = cuda_convert,
    .random = cuda_random,
    .copy = cuda_copy,
};

const struct l2l_backend_ops *l2l_cuda_ops(void) { return &cuda_backend; }

#else /* no CUDA in this build ---------------------------------------------------------- */

static const char no_cuda[] =
    "this build of l2l has no CUDA backend (built with NO_CUDA=1 or SANITIZE=1, or without "
    "nvcc)";

int l2l_cuda_probe(char *why, size_t len) {
  if (why != NULL && len > 0) snprintf(why, len, "%s", no_cuda);
  return 0;
}

const struct l2l_backend_ops *l2l_cuda_ops(void) { return &l2l_cpu_backend; } /* never asked */

l2l_status l2l_cuda_malloc(void **out, uint64_t bytes) {
  (void)out, (void)bytes;
  return l2l_fail(L2L_ERR_UNSUPPORTED, "device pool: %s", no_cuda);
}

void l2l_cuda_free(void *ptr, uint64_t bytes) { (void)ptr, (void)bytes; }

void l2l_cuda_pool_counts(uint64_t *reserved, uint64_t *system_allocs) {
  *reserved = 0, *system_allocs = 0;
}

int l2l_cuda_host_alloc(void **out, uint64_t bytes) {
  (void)out, (void)bytes;
  return -1;
}

void l2l_cuda_host_free(void *ptr) { (void)ptr; }

l2l_status l2l_cuda_release_cache(void) { return L2L_OK; }

l2l_status l2l_cuda_synchronize(void) { return L2L_OK; }

void *l2l_cuda_mark(void) { return NULL; }

void *l2l_cuda_stamp(void) { return NULL; }

bool l2l_cuda_stamp_wait(void *stamp) {
  (void)stamp;
  return false;
}

bool l2l_cuda_stamp_seconds(double *out, void *from, void *to) {
  (void)out, (void)from, (void)to;
  return false;
}

void l2l_cuda_stamp_release(void *stamp) { (void)stamp; }

l2l_status l2l_cuda_wait_mark(void *mark) {
  (void)mark;
  return L2L_OK;
}

void l2l_cuda_use_tf32(int enable) { (void)enable; } /* matters only where CUDA runs */

l2l_status l2l_cuda_fill_info(l2l_cuda_info *out) {
  (void)out;
  return l2l_fail(L2L_ERR_UNSUPPORTED, "%s", no_cuda);
}

#endif /* L2L_CUDA */
