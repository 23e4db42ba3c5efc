/* SPDX-License-Identifier: MIT */
/* l2l.h — the one public header of libl2l.
 *
 * Purpose: everything a C program, or LuaJIT's FFI, needs to use l2l. This file declares
 * status codes and the per-thread error message, compute threads, memory pools, the
 * device, tensors, the counter-based random generator and the tensor ops of the backends;
 * it includes the rest from its parts in l2l/ beside it, in order: layers.h (layers),
 * relay.h (optimizers, the relay and the EPS), dist.h (data parallel), plan.h (the
 * planner), safetensors.h (safetensors files). A program includes this file alone. It must never expose a backend's
 * internals, include a CUDA header, or declare anything a user cannot call.
 *
 * Conventions, stated once for every function below:
 *  - Fallible calls return l2l_status. On failure l2l_last_error() (per thread) names what
 *    was wrong, and no output tensor or statistic has been changed: arguments are checked
 *    in full before anything is written.
 *  - Constructors return their object through `T **out`, which comes first; op arguments
 *    come outputs first, then inputs, then parameters, then sizes. Destructors accept NULL.
 *    A handle is valid until its destructor: a freed one must not be passed again (its
 *    memory is gone; a check may catch it, but that is not promised).
 *  - Tensors are contiguous and row-major with 1 to 4 dims, each at least 1. Where an op
 *    treats a tensor as a matrix, its columns are the last dim and its rows are the product
 *    of the others ("rows" below).
 *  - Parameter gradients accumulate (+=); activation gradients are written (=).
 *  - Threads. What is process-wide (the pools, the compute threads, the device, MPI) may
 *    be used from any thread. A tensor, layer, parameter or plan is used by one thread at
 *    a time while it changes: threads may read one object together, but one that changes
 *    it must be alone (l2l does not check this). A relay checks: it takes one call at a
 *    time from any thread, and a call that overlaps another on the same relay (from
 *    another thread, or from a callback of its own layers inside its step) is refused
 *    with L2L_ERR_STATE and changes nothing; its queries then answer -1 or NULL, and
 *    l2l_relay_free leaves it whole. Relays that share no layer run on threads at once.
 *  - All tensors of one op live in one backend: the host and pinned pools belong to the
 *    CPU; the device pool belongs to the accelerator (on a CPU-only build, to the CPU too,
 *    but mixing it with host tensors is still refused, so that what runs on a CPU-only
 *    build runs unchanged on a GPU build).
 *
 * The block between L2L_FFI_BEGIN and L2L_FFI_END, here and in each part, is plain C that
 * LuaJIT's ffi.cdef accepts (L2L_API aside, which the generator drops); lua/l2l/cdef.lua
 * is generated from the blocks in order (make; scripts/public_header.lua reads them) and
 * a spec fails if they drift. Keep includes and macros outside them.
 */
#ifndef L2L_H
#define L2L_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's surface: libl2l is built with hidden visibility, so the functions marked
   L2L_API here are exactly what libl2l.so exports (a spec compares them with nm's list);
   everything else inside is the parts' business. */
#if defined(__GNUC__)
#define L2L_API __attribute__((visibility("default")))
#else
#define L2L_API
#endif
/* A name kept for one release after it was renamed: a call still works, and the compiler
   warns, naming the new one (the comment above the declaration says more). */
#if defined(__GNUC__)
#define L2L_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define L2L_DEPRECATED(msg)
#endif

/* L2L_FFI_BEGIN */

/* ---------------------------------------------------------------- status and errors */

typedef enum l2l_status {
  L2L_OK = 0,
  L2L_ERR_INVALID = 1,     /* a bad argument: NULL, shape, dtype, pool, value out of range */
  L2L_ERR_NOMEM = 2,       /* the system could not provide memory */
  L2L_ERR_BUDGET = 3,      /* a pool's byte budget would be exceeded */
  L2L_ERR_STATE = 4,       /* not possible in the object's present state */
  L2L_ERR_UNSUPPORTED = 5, /* a valid request this build cannot serve */
  L2L_ERR_BACKEND = 6,     /* a library below (BLAS, CUDA) failed */
  L2L_ERR_IO = 7           /* a file could not be made, read or written (the message names
                              it and why: a full disk, a missing directory, a file cut
                              short by another program) */
} l2l_status;

enum { L2L_MAX_DIMS = 4, L2L_ALIGN = 64, L2L_MAX_PARAMS = 12, L2L_PARAM_NAME_MAX = 24 };

/* The message of this thread's last failed call ("" if none). Valid until the next call
   into l2l on this thread. */
L2L_API const char *l2l_last_error(void);
L2L_API void l2l_clear_error(void);
/* What the calling thread's last error was about, beside its words, so that a front end
   words it in its own terms without reading the message: each field says nothing (-1, 0,
   "") where the error does not name it. A front end words the message again by putting
   its own names for the layer, micro-batch and field in place of the spans that name them
   (counting from 1, naming an option as it does). */
/* Where a message names something: its bytes [at, at + bytes) of l2l_last_error()
   (bytes 0: it does not name it). */
typedef struct l2l_error_span {
  int at;
  int bytes;
} l2l_error_span;
typedef struct l2l_error_detail {
  int layer;              /* the layer it names, counted from 0 in the caller's list */
  uint64_t needed_bytes;  /* a budget refused: the smallest that works, in bytes */
  char field[48];         /* the config field or argument it names ("micro_batch", "tokens") */
  int64_t micro_batch;    /* the micro-batch of a step it names, counted from 0 */
  int text;               /* l2l_last_error() + text: the message without the failing
                             function's name in front ("l2l_relay_new: ") */
  int element_dims;       /* an element of the field it names: its index in each of */
  int64_t element[L2L_MAX_DIMS];  /* element_dims dims, from 0 (element_dims 0: none) */
  l2l_error_span layer_named;        /* "layer 2", "layers[2]" */
  l2l_error_span micro_batch_named;  /* "micro-batch 0" */
  l2l_error_span field_named;        /* "config->accumulate", "batch->tokens" */
  l2l_error_span element_named;      /* "[0][3]" (after the field's name) */
} l2l_error_detail;
L2L_API l2l_status l2l_last_error_detail(l2l_error_detail *out);
L2L_API const char *l2l_status_name(l2l_status status);
L2L_API const char *l2l_version(void);

/* ---------------------------------------------------------------- compute threads */

/* Threads used by the CPU backend's loops and by OpenBLAS (never nested in each other).
   Default: the L2L_THREADS environment variable, else every core. */
L2L_API l2l_status l2l_set_threads(int threads);
L2L_API int l2l_get_threads(void);

/* ---------------------------------------------------------------- memory pools */

/* host:   jemalloc, called explicitly (mallocx/dallocx in an arena of l2l's own;
           jemalloc never replaces malloc).
   pinned: host memory for transfers: page-locked (cudaHostAlloc) when CUDA serves the
           device pool, plain host memory otherwise; kept for reuse up to a cap
           (l2l_pinned_set_cap), past which it falls back to pageable memory.
   device: the accelerator's memory; on a CPU-only build a host-backed pool with the same
           budget and accounting, so device-memory claims are testable without a GPU.
   Every allocation is counted as its size rounded up to L2L_ALIGN bytes. */
typedef enum l2l_pool_kind {
  L2L_POOL_HOST = 0,
  L2L_POOL_PINNED = 1,
  L2L_POOL_DEVICE = 2
} l2l_pool_kind;

typedef struct l2l_pool_stats {
  uint64_t current;  /* bytes in use now */
  uint64_t peak;     /* most bytes in use since start or the last reset_peak */
  uint64_t budget;   /* 0: no budget. The host pool's starts at the machine's memory, so
                        an allocation that can never succeed is refused at once */
  uint64_t allocs;   /* allocations served */
  uint64_t frees;
  uint64_t refused;  /* allocations refused (budget or out of memory) */
  uint64_t reserved;       /* bytes held from the system: current, plus what is kept
                              for reuse (freed pages; the CUDA device pool's and the
                              pinned pool's cached blocks) */
  uint64_t system_allocs;  /* calls to the system allocator (cudaMalloc on CUDA,
                              cudaHostAlloc for pinned): flat in a training loop's steady
                              state */
  uint64_t cap;            /* pinned: the most it holds page-locked (0: no cap) */
  uint64_t fallback;       /* pinned: bytes in use that came from pageable memory because
                              the cap was reached or the system refused to lock more */
  uint64_t fallback_allocs;
  uint64_t backend;        /* device: bytes the backend keeps for itself (CUDA: its scratch
                              and cuBLAS's workspace), in reserved and counted against the
                              budget: tensors get budget - backend - current */
} l2l_pool_stats;

L2L_API l2l_status l2l_pool_get_stats(l2l_pool_stats *out, l2l_pool_kind pool);
/* The spill files of every relay in this process (l2l_relay_config.spill_dir) in the same
   form: current (and peak) the bytes of regions that hold optimizer state, reserved the
   files' sizes (regions given back stay in a file for the next to reuse), allocs and frees
   the regions reserved and given back, system_allocs the files made; the rest 0. */
L2L_API l2l_status l2l_spill_get_stats(l2l_pool_stats *out);
/* 0 removes the budget; a budget below the bytes now in use is refused. */
L2L_API l2l_status l2l_pool_set_budget(l2l_pool_kind pool, uint64_t bytes);
L2L_API l2l_status l2l_pool_reset_peak(l2l_pool_kind pool);  /* peak := current */
/* The pinned pool holds at most `bytes` from the system (blocks in use and blocks kept
   for reuse; 0: no cap). Default: a quarter of the machine's memory. Past the cap a
   pinned allocation still succeeds, from pageable memory (copies from it are slower),
   and l2l warns on stderr the first time; stats.fallback counts those bytes. A lower cap
   gives cached blocks back at once; blocks in use stay until freed. */
L2L_API l2l_status l2l_pinned_set_cap(uint64_t bytes);
L2L_API const char *l2l_pool_name(l2l_pool_kind pool);      /* "host", "pinned", "device"; NULL if invalid */

/* ---------------------------------------------------------------- the device

   The device pool's memory and ops belong to one backend, chosen on first use: "cuda"
   (GPU memory through a caching allocator, CUDA kernels and cuBLAS) when this build has
   CUDA and a GPU is present, else "cpu" (host memory with the device pool's budget and
   accounting). The environment variable L2L_DEVICE=cpu|cuda overrides the choice. */
L2L_API const char *l2l_device_backend(void);               /* "cpu" or "cuda" */
/* Serve the device pool from `backend` ("cpu" or "cuda") from now on. Refused while
   device tensors exist, and for "cuda" when it cannot run here (the message says why). */
L2L_API l2l_status l2l_device_use(const char *backend);
/* 1 if the CUDA backend can run here; else 0, with the reason (built without CUDA, no
   GPU, driver too old, ...) in why[0..len) when why is not NULL. */
L2L_API int l2l_cuda_available(char *why, size_t len);

typedef struct l2l_cuda_info {
  char name[256];          /* e.g. "NVIDIA H100 80GB HBM3" */
  int major, minor;        /* compute capability */
  int multiprocessors;
  uint64_t total_bytes, free_bytes;
  int runtime_version, driver_version;  /* as CUDA encodes them: 13000 is 13.0 */
  int cudnn_version;       /* l2l_cudnn_available's: 91900 is 9.19.0; 0 without cuDNN */
} l2l_cuda_info;
L2L_API l2l_status l2l_cuda_get_info(l2l_cuda_info *out);
/* cuDNN, which the CUDA backend's bf16/f16 attention uses where it can (the rest runs on
   l2l's own kernels): the version of the libcudnn.so.9 loaded (91900 is 9.19.0), opened at
   the first ask, GPU or not, with "cuDNN 9.19.0 from PATH" in about[0..len); 0 when none
   is, with why (this build has none, L2L_CUDNN=0, nothing found, the file L2L_CUDNN names
   cannot be opened). L2L_CUDNN=PATH names the library; else l2l looks in the CUDA
   toolkit's folders, then PyTorch's (nvidia/cudnn/lib in python3's site-packages), then
   the loader's paths. about may be NULL. */
L2L_API int l2l_cudnn_available(char *about, size_t len);
/* f32 GEMMs on the GPU through TF32 tensor cores (about 1e-3 relative error instead of
   fp32's 1e-6; off by default). */
L2L_API l2l_status l2l_cuda_set_tf32(int enable);
/* Waits for all queued GPU work; a failure of that work is reported here. The CPU
   device backend has nothing queued: always L2L_OK. */
L2L_API l2l_status l2l_device_synchronize(void);
/* Returns the memory that freed tensors left cached, in every pool, to the system: the
   device cache (cudaFree) and the host-side arenas' pages. */
L2L_API l2l_status l2l_device_release_cache(void);

/* ---------------------------------------------------------------- the profile

   Where a relay step's time goes, op by op. While a profile runs, every op on the device
   pool inside a relay's training step (evaluations are left out) is timed on the device's
   own clock (CUDA events on a GPU, the host clock on the CPU backend) and summed by op and
   shape:
   calls, seconds, FLOPs and bytes moved (from the op's arguments), and the fraction of
   its roofline it reached: the device copy rate for memory-bound ops, the GEMM rate of
   its precision for GEMMs and attention, the host-to-device rate for transfers, each
   probed when the profile starts. Ops on the step's own thread run on the compute stream
   ("op" rows); ops on other threads (the relay's copy threads) on copy lanes ("lane"
   rows). The step's time not spent in "op" rows is its idle time, split by cause: the
   host waiting for a copy (of parameters onto the device, of activations onto it or off
   it, of gradients off it), for an update, for the ranks (MPI), or after a sync (the
   device drained, and waits while the host queues again), the rest launch gaps (the
   host slower than the device). Syncs count every host wait for the device, whatever
   the backend: a CPU run counts the ones a GPU would make. The environment variable
   L2L_PROFILE=FILE profiles a program's steps with no call: the TSV goes to FILE and the
   table to stderr at exit (L2L_PROFILE_SKIP=N leaves the first N steps out; default 1,
   whose one-time costs would hide the steady state). One relay stepping at a time. */
typedef struct l2l_profile_row {
  char kind[8];          /* "op" (the step's thread) or "lane" (another thread) */
  char op[32];           /* the ops table's name: "gemm", "attention_forward", "copy", ... */
  char shape[96];        /* its sizes and dtypes, e.g. "m=4096 n=2304 k=768 NT bf16" */
  int64_t calls;
  double seconds;        /* summed over the calls, on the device's clock */
  double host_seconds;   /* summed: the host's time inside the calls (queueing their work,
                            and any wait in them); near seconds where the host, not the
                            device, set the op's pace */
  double flops, bytes;   /* summed; flops 0 for ops bound by memory */
  char bound[8];         /* "flop", "mem" or "link": which probed rate it is held to */
  double roofline;       /* rate reached / that probed rate; -1 when it was not probed */
} l2l_profile_row;

typedef struct l2l_profile_summary {
  char backend[16];       /* the device pool's backend */
  int64_t steps;          /* steps profiled (skipped ones not counted) */
  int64_t rows;
  double step_seconds;    /* summed over the steps: each from its start to its end, on the
                             device's clock */
  double op_seconds;      /* the "op" rows' seconds */
  double idle_copy_seconds, idle_update_seconds, idle_comm_seconds, idle_sync_seconds,
      idle_launch_seconds;  /* the rest of the steps' time, by cause (see above) */
  /* idle_copy_seconds by the copy waited for: a visit's parameters onto the device,
     activations (stashed or swapped) onto it, activations off it (a stash-out or swap-out
     holding device memory the step needs), a visit's gradients off it (their slot reused) */
  double idle_copy_params_seconds, idle_copy_acts_in_seconds, idle_copy_acts_out_seconds,
      idle_copy_grads_seconds;
  int64_t ops;            /* calls of "op" rows */
  int64_t lane_ops;       /* calls of "lane" rows (copies on the copy threads) */
  int64_t syncs;          /* host waits for the device */
  int64_t launches;       /* kernels and library calls queued (-1: the backend has none) */
  int64_t dropped;        /* ops whose stamps could not be read (left out of the rows) */
  double copy_rate;       /* probed: device-to-device bytes a second (read + written) */
  double link_rate;       /* probed: pinned host to device bytes a second */
  double gemm_rate_f32, gemm_rate_16;  /* probed: GEMM FLOP/s with f32 and 16-bit inputs */
  char probe[128];        /* how the rates were probed, or why one was not */
} l2l_profile_summary;

/* Starts a profile (clearing the last): probes the rates first (a few hundred ms), then
   times every step after the first skip_steps (>= 0). Refused while one runs. */
L2L_API l2l_status l2l_profile_start(int skip_steps);
/* Stops it; what it collected stays readable until the next start. */
L2L_API l2l_status l2l_profile_stop(void);
L2L_API l2l_status l2l_profile_get_summary(l2l_profile_summary *out);
/* Rows first .. first+count-1 (count <= summary.rows - first), slowest first. */
L2L_API l2l_status l2l_profile_rows(l2l_profile_row *out, int64_t first, int64_t count);
/* The rows and the summary as one TSV file; an existing file is refused unless overwrite. */
L2L_API l2l_status l2l_profile_write(const char *path, int overwrite);
/* The one-screen table (at most 32 lines of `width` columns, 80 to 1000) into out[0..size),
   cut short to fit where size is less, and always ended by a NUL (size >= 1). */
L2L_API l2l_status l2l_profile_table(char *out, size_t size, int width);

/* ---------------------------------------------------------------- tensors */

typedef enum l2l_dtype {
  L2L_F32 = 0,
  L2L_F16 = 1,
  L2L_BF16 = 2,
  L2L_I32 = 3,   /* token ids, targets */
  L2L_U8 = 4     /* masks, packed bits */
} l2l_dtype;

typedef struct l2l_tensor l2l_tensor;

L2L_API size_t l2l_dtype_size(l2l_dtype dtype);        /* 0 if invalid */
L2L_API const char *l2l_dtype_name(l2l_dtype dtype);   /* "f32", ...; NULL if invalid */

/* A new tensor with fresh storage from `pool`; its contents are undefined. */
L2L_API l2l_status l2l_tensor_new(l2l_tensor **out, l2l_pool_kind pool, l2l_dtype dtype, int ndim,
                                  const int64_t *shape);
/* Releases the handle; the storage goes when its last view goes. NULL is fine. */
L2L_API void l2l_tensor_free(l2l_tensor *t);
/* A view of rows [first, first+count) along dim 0: same storage, no copy. */
L2L_API l2l_status l2l_tensor_view_rows(l2l_tensor **out, const l2l_tensor *t, int64_t first,
                                        int64_t count);
/* A view with another shape of the same number of elements. */
L2L_API l2l_status l2l_tensor_reshape(l2l_tensor **out, const l2l_tensor *t, int ndim,
                                      const int64_t *shape);

/* Accessors never fail: for a NULL tensor (or a pointer that is no tensor) -1 / NULL. */
L2L_API int l2l_tensor_ndim(const l2l_tensor *t);
L2L_API int64_t l2l_tensor_dim(const l2l_tensor *t, int axis);
L2L_API int64_t l2l_tensor_numel(const l2l_tensor *t);
L2L_API int l2l_tensor_dtype(const l2l_tensor *t);
L2L_API int l2l_tensor_pool(const l2l_tensor *t);
L2L_API void *l2l_tensor_data(const l2l_tensor *t);
L2L_API int64_t l2l_tensor_offset(const l2l_tensor *t);        /* first element's index in its storage */
L2L_API int l2l_tensor_storage_refs(const l2l_tensor *t);      /* handles sharing the storage */

/* dst := src, same dtype and number of elements; any pools (a transfer). */
L2L_API l2l_status l2l_tensor_copy(l2l_tensor *dst, const l2l_tensor *src);
/* dst := src converted among f32, f16, bf16 and i32 (round to nearest even). A float to
   i32 cast refuses, before writing, any value that is not an integer within int32 range.
   dst and src in pools of one backend. */
L2L_API l2l_status l2l_tensor_cast(l2l_tensor *dst, const l2l_tensor *src);
/* Every element := value (converted to t's dtype; integer dtypes need an integer value
   within their range). */
L2L_API l2l_status l2l_tensor_fill(l2l_tensor *t, double value);

/* ---------------------------------------------------------------- random numbers */

/* Philox4x32-10 (Salmon et al., SC 2011): out = 10 rounds of the bijection of `counter`
   keyed by `key`. Every random number in l2l is a function of (seed, stream, index), so
   splitting a batch into micro-batches never changes a draw. */
L2L_API l2l_status l2l_philox4x32(uint32_t *out4, const uint32_t *counter4, const uint32_t *key2);

/* Element i of t gets the draw with index first+i of (seed, stream). Pass the element's
   position in the whole batch as `first` and any split gives the same numbers. */
L2L_API l2l_status l2l_tensor_uniform(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                                      double lo, double hi);
L2L_API l2l_status l2l_tensor_normal(l2l_tensor *t, uint64_t seed, uint64_t stream, int64_t first,
                                     double mean, double std);

/* Scalar conversions with round to nearest even (NaN stays NaN, overflow gives inf). */
L2L_API uint16_t l2l_f32_to_bf16(float x);
L2L_API float l2l_bf16_to_f32(uint16_t x);
L2L_API uint16_t l2l_f32_to_f16(float x);
L2L_API float l2l_f16_to_f32(uint16_t x);

/* ---------------------------------------------------------------- ops
   f32 tensors unless stated. Shapes in comments: R = rows, C = columns. */

/* c = alpha * op(a) @ op(b) + beta * c, op(x) = x^T when trans_x is 1, x when 0 (other
   values are refused). As matrices: op(a) (M,K), op(b) (K,N), c (M,N); alpha and beta
   finite. With beta = 0, c is not read (NaN in c does not propagate). a and b may both
   be f16 or both bf16 (mixed precision): products accumulate in f32 into c (f32). */
L2L_API l2l_status l2l_gemm(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b, int trans_a,
                            int trans_b, float alpha, float beta);
/* The same for a batch of matrices: each tensor is (batch..., rows, cols) with the batch
   dims (all but the last two) multiplied into one count that must agree. */
L2L_API l2l_status l2l_gemm_batched(l2l_tensor *c, const l2l_tensor *a, const l2l_tensor *b,
                                    int trans_a, int trans_b, float alpha, float beta);

L2L_API l2l_status l2l_bias_add(l2l_tensor *y, const l2l_tensor *bias);          /* y (R,C) += bias (C) */
/* dbias (C) += sum_r dy; dy may also be f16 or bf16 (widened, summed in f32) */
L2L_API l2l_status l2l_bias_backward(l2l_tensor *dbias, const l2l_tensor *dy);
/* out = a + b (the residual add); out may be a or b. */
L2L_API l2l_status l2l_add(l2l_tensor *out, const l2l_tensor *a, const l2l_tensor *b);

/* GELU, tanh form: y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). y may be x. */
L2L_API l2l_status l2l_gelu_forward(l2l_tensor *y, const l2l_tensor *x);
L2L_API l2l_status l2l_gelu_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *x);

/* LayerNorm over the last dim: y = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var+eps)
   with the biased variance; eps finite and > 0. mean and rstd (R) are saved for backward
   (NULL to skip). */
L2L_API l2l_status l2l_layernorm_forward(l2l_tensor *y, l2l_tensor *mean, l2l_tensor *rstd,
                                         const l2l_tensor *x, const l2l_tensor *weight,
                                         const l2l_tensor *bias, float eps);
/* dx written; dweight, dbias accumulated (either may be NULL). */
L2L_API l2l_status l2l_layernorm_backward(l2l_tensor *dx, l2l_tensor *dweight, l2l_tensor *dbias,
                                          const l2l_tensor *dy, const l2l_tensor *x,
                                          const l2l_tensor *weight, const l2l_tensor *mean,
                                          const l2l_tensor *rstd);

/* Row softmax of scale * x over the last dim (Tk), x (..., Tq, Tk). causal is 0 or 1; 1
   hides key j from query i when j > i + (Tk - Tq). key_mask (B, Tk) u8, 1 = real token,
   0 = padding, hides padded keys of sample b, where b is x's first index (x needs at least
   3 dims); NULL for none. A row whose keys are all hidden is all zeros. y may be x. */
L2L_API l2l_status l2l_softmax_forward(l2l_tensor *y, const l2l_tensor *x, const l2l_tensor *key_mask,
                                       int causal, float scale);
/* dx = scale * y * (dy - sum(dy * y)) per row; masked entries (y = 0) get 0. */
L2L_API l2l_status l2l_softmax_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *y,
                                        float scale);

/* out (N..., C) = table (V, C) rows picked by ids (N...) i32. The table may also be f16 or
   bf16 (widened exactly into out). Ids outside [0, V) are refused before anything is
   written. */
L2L_API l2l_status l2l_embedding_forward(l2l_tensor *out, const l2l_tensor *ids, const l2l_tensor *table);
/* dtable[ids[n]] += dout[n] (scatter-add; repeated ids sum). */
L2L_API l2l_status l2l_embedding_backward(l2l_tensor *dtable, const l2l_tensor *dout,
                                          const l2l_tensor *ids);

/* losses (R) = -log softmax(logits (R,V))[target] per row; rows whose target equals
   ignore_index get 0. Other targets outside [0, V) are refused. */
L2L_API l2l_status l2l_cross_entropy_forward(l2l_tensor *losses, const l2l_tensor *logits,
                                             const l2l_tensor *targets, int32_t ignore_index);
/* dlogits = scale * (softmax(logits) - onehot(target)); ignored rows get 0. For the mean
   over real tokens, scale = 1 / (number of real tokens in the whole batch). */
L2L_API l2l_status l2l_cross_entropy_backward(l2l_tensor *dlogits, const l2l_tensor *logits,
                                              const l2l_tensor *targets, int32_t ignore_index,
                                              float scale);

/* Inverted dropout: element i is kept when uniform draw first+i of (seed, stream) is below
   1 - p; y = x * kept / (1 - p). mask (ceil(numel/8)) u8 gets the kept bits, bit i%8 of
   byte i/8. 0 <= p < 1; y may be x. */
L2L_API l2l_status l2l_dropout_forward(l2l_tensor *y, l2l_tensor *mask, const l2l_tensor *x, float p,
                                       uint64_t seed, uint64_t stream, int64_t first);
L2L_API l2l_status l2l_dropout_backward(l2l_tensor *dx, const l2l_tensor *dy, const l2l_tensor *mask,
                                        float p);

/* Reductions over every element, accumulated in double. */
L2L_API l2l_status l2l_sum(double *out, const l2l_tensor *x);
L2L_API l2l_status l2l_max_abs(double *out, const l2l_tensor *x);
L2L_API l2l_status l2l_norm2(double *out, const l2l_tensor *x);   /* sqrt(sum x^2) */

/* AdamW (Loshchilov & Hutter), one step t >= 1, bias-corrected, decoupled weight decay:
   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
   p -= lr * ( m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + weight_decay * p ).
   Refused: lr < 0, beta outside [0, 1), eps <= 0, weight_decay < 0, anything not finite. */
typedef struct l2l_adamw_config { float lr, beta1, beta2, eps, weight_decay; } l2l_adamw_config;
L2L_API l2l_status l2l_adamw_update(l2l_tensor *param, l2l_tensor *m, l2l_tensor *v,
                                    const l2l_tensor *grad, const l2l_adamw_config *config, int64_t step);

/* L2L_FFI_END */

/* The rest of the API, in its parts (each an FFI block of its own, read after this one in
   this order by scripts/public_header.lua). */
#include "l2l/layers.h"
#include "l2l/relay.h"
#include "l2l/dist.h"
#include "l2l/plan.h"
#include "l2l/safetensors.h"

#ifdef __cplusplus
}
#endif
#endif /* L2L_H */
