/* SPDX-License-Identifier: MIT */
/* runtime.h — what the CUDA backend's files share (private to backend/cuda/; built with
 * L2L_CUDA only).
 *
 * Purpose: the runtime state both runtime.c (start-up, copy lanes, stamps, the caching
 * allocator, the device table) and cuda_ops.c (the ops table) use: the compute stream,
 * cuBLAS's functions, the scratch, the calling thread's lane, and turning CUDA's and
 * cuBLAS's errors into statuses with messages. Everything here has hidden visibility:
 * none of it leaves libl2l.
 * Must never: be included outside backend/cuda/ (no other part sees a CUDA header).
 */
#ifndef L2L_CUDA_RUNTIME_H
#define L2L_CUDA_RUNTIME_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/accelerators.h"

#define CUDA_INTERNAL __attribute__((visibility("hidden")))

/* cuBLAS is opened when CUDA first starts, not linked: its libraries are some 700 MB,
   and mapping them cost every l2l process about 0.45 s at start-up, GPU or not. */
struct cuda_cublas {
  __typeof__(cublasCreate_v2) *create;
  __typeof__(cublasSetStream_v2) *set_stream;
  __typeof__(cublasSetWorkspace_v2) *set_workspace;
  __typeof__(cublasSetPointerMode_v2) *set_pointer_mode;
  __typeof__(cublasGemmEx) *gemm;
  __typeof__(cublasGemmStridedBatchedEx) *gemm_strided_batched;
  __typeof__(cublasGetStatusString) *status_string;
  __typeof__(cublasGetStatusName) *status_name;
};
extern CUDA_INTERNAL struct cuda_cublas cublas;

/* The library at `path` opened (dlopen) and its functions `names[0 .. n)` taken into
   fns (dlsym), for a table of function pointers in the same order (cuBLAS's above,
   cuDNN's); NULL with the reason in why (the library closed again) when it cannot be
   opened or lacks one. */
CUDA_INTERNAL void *cuda_open_functions(const char *path, const char *const *names, size_t n,
                                        void **fns, char *why, size_t why_len);
/* The same for `name` (libcublas, libcublasLt) of the toolkit l2l was built with: from its
   lib folder (compiled in), else wherever the dynamic loader finds that version (the
   major version of cuBLAS's headers); path gets the last one tried. */
CUDA_INTERNAL void *cuda_open_toolkit_library(const char *name, const char *const *names,
                                              size_t n, void **fns, char *path, size_t path_len,
                                              char *why, size_t why_len);

/* A GEMM operand's or result's l2l dtype (f32, bf16, f16) as CUDA's data type, for
   cuBLAS and cuBLASLt alike. */
static inline cudaDataType_t cuda_data_type(l2l_dtype dtype) {
  return dtype == L2L_BF16 ? CUDA_R_16BF : dtype == L2L_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Bytes of device scratch the backend keeps for ops that need a little (reduction
   partials, a result to copy back, column-sum partials) and for cuBLAS's workspace. */
enum { SCRATCH_BYTES = 32 << 20, CUBLAS_WORKSPACE_BYTES = 32 << 20 };

struct cuda_runtime {
  pthread_once_t once;
  int usable;
  char why[512];            /* when not usable */
  int device;
  cudaStream_t compute;
  cublasHandle_t blas;
  void *cublas_workspace;
  void *scratch;            /* scratch_bytes, at least SCRATCH_BYTES */
  uint64_t scratch_bytes;
  void *gelu_slopes;        /* backend/gelu_table.c's slope tables (3, GELU_TABLE), copied
                               once as the device starts */
  atomic_int tf32;
  pthread_mutex_t lock;     /* serializes ops that use the scratch */
};
extern CUDA_INTERNAL struct cuda_runtime cuda_rt;

/* A lane: the calling thread's stream and an event to wait on its copies, made when the
   thread first waits for a mark (runtime.c), destroyed when the thread exits. */
struct lane {
  cudaStream_t stream;
  cudaEvent_t done;
};
extern CUDA_INTERNAL _Thread_local struct lane *cuda_lane;   /* NULL: not a lane */

CUDA_INTERNAL l2l_status cuda_error(cudaError_t err, const char *file, int line,
                                    const char *call);
CUDA_INTERNAL l2l_status cublas_error(cublasStatus_t err, const char *file, int line,
                                      const char *call);

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

/* ---- what the ops table's files share (cuda_ops.c defines them; attention_ops.c uses them) */

/* One more kernel or library call queued, for the profile's count. */
CUDA_INTERNAL void cuda_launched(void);
/* `floats` of the backend's scratch past its result and reduction parts (called with
   cuda_rt.lock held). */
CUDA_INTERNAL l2l_status cuda_scratch_floats(float **out, int64_t floats);

/* A kernel's launcher call: counted, its cudaError_t turned into a status. */
#define LAUNCH(call)       \
  do {                     \
    cuda_launched();       \
    CUDA_TRY(call);        \
  } while (0)

/* Returns `call` (an op body that uses the scratch), run with cuda_rt.lock held. */
#define WITH_SCRATCH(call)                   \
  do {                                       \
    pthread_mutex_lock(&cuda_rt.lock);       \
    l2l_status locked_status_ = (call);      \
    pthread_mutex_unlock(&cuda_rt.lock);     \
    return locked_status_;                   \
  } while (0)

/* The ops table's attention entries (attention_ops.c). */
CUDA_INTERNAL int64_t cuda_attention_workspace(const struct backend_attention_shape *sh,
                                               int backward);
CUDA_INTERNAL l2l_status cuda_attention_forward(void *o, float *lse, float *probs,
                                                float *dropped, uint8_t *mask, const void *q,
                                                const void *k, const void *v,
                                                const uint8_t *key_mask,
                                                const struct backend_attention_shape *sh,
                                                float *workspace, int64_t workspace_floats);
CUDA_INTERNAL l2l_status cuda_attention_backward(void *dq, void *dk, void *dv, const void *d_o,
                                                 const void *o, const float *lse,
                                                 const float *probs, const float *dropped,
                                                 const uint8_t *mask, const void *q,
                                                 const void *k, const void *v,
                                                 const uint8_t *key_mask,
                                                 const struct backend_attention_shape *sh,
                                                 float *workspace, int64_t workspace_floats);

/* L2L_ERR_UNSUPPORTED with the reason when CUDA cannot run here. */
CUDA_INTERNAL l2l_status cuda_need_runtime(void);
/* A scratch of at least `bytes` (called with cuda_rt.lock held): the old one goes back to
   the device cache behind the kernels queued so far. */
CUDA_INTERNAL l2l_status cuda_scratch_grow(uint64_t bytes);
/* Waits for the compute stream: before the host reads what the GPU wrote. */
CUDA_INTERNAL l2l_status cuda_wait_stream(void);

#endif /* L2L_CUDA_RUNTIME_H */
