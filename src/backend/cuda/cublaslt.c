/* SPDX-License-Identifier: MIT */
/* cublaslt.c — a GEMM with its bias add (and its rounding to 16 bits) in cuBLASLt's
 * epilogue: one pass over c where cuBLAS's GEMM and the bias kernel made three.
 *
 * Purpose: cuda_ops.c's gemm_bias (the layers' linear maps with a bias: the block's qkv map,
 * whose sums go straight to the 16-bit q, k, v attention reads, its projections, a
 * classifier) through cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS. The row-major product
 * is the column-major c^T = op(b)^T op(a)^T, as cuda_ops.c hands it to cuBLAS: Lt's A is
 * l2l's b, its B l2l's a, its D an n x m column-major matrix, whose rows (n of them) the
 * bias runs along. Alpha is 1 and beta 0, so D is op(a) op(b) summed in f32, plus the bias
 * in f32, rounded once to D's type: the bits the GEMM, bias_add and convert give, up to
 * the algorithm's order of summation. libcublasLt is opened at the first call (the
 * toolkit's lib folder, compiled in, then the soname), not linked, as cuBLAS is; L2L_CUBLASLT=0
 * (or off) leaves it closed. A plan a shape (the operation descriptor, the three layouts,
 * the heuristic's first algorithm for the pointers' alignments) is kept, 32 of them, the
 * least recently used given back; all under one lock, which also covers the run (a plan's
 * bias pointer is set for each call).
 * Must never: queue anything for a call it reports not run, or fail a call for want of
 * cuBLASLt (it is optional: the GEMM and the bias kernel serve).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef L2L_CUDA

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"   /* (cublasLtLoggerForceDisable()) */
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "cublaslt.h"

/* ---------------------------------------------------------------- the library */

struct cuda_cublaslt {
  __typeof__(cublasLtCreate) *create;
  __typeof__(cublasLtGetVersion) *get_version;
  __typeof__(cublasLtMatmulDescCreate) *desc_create;
  __typeof__(cublasLtMatmulDescSetAttribute) *desc_set;
  __typeof__(cublasLtMatmulDescDestroy) *desc_destroy;
  __typeof__(cublasLtMatrixLayoutCreate) *layout_create;
  __typeof__(cublasLtMatrixLayoutDestroy) *layout_destroy;
  __typeof__(cublasLtMatmulPreferenceCreate) *pref_create;
  __typeof__(cublasLtMatmulPreferenceSetAttribute) *pref_set;
  __typeof__(cublasLtMatmulPreferenceDestroy) *pref_destroy;
  __typeof__(cublasLtMatmulAlgoGetHeuristic) *heuristic;
  __typeof__(cublasLtMatmul) *matmul;
};
static struct cuda_cublaslt lt;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static cublasLtHandle_t handle;   /* NULL: not loaded (about says why) */
static char about[512];
static atomic_int enabled = 1;
static atomic_llong runs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void load(void) {
  const char *env = getenv("L2L_CUBLASLT");
  if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0)) {
    snprintf(about, sizeof about, "cuBLASLt is switched off (L2L_CUBLASLT=%s)", env);
    return;
  }
  static const char *const names[] = {
      "cublasLtCreate",          "cublasLtGetVersion",          "cublasLtMatmulDescCreate",
      "cublasLtMatmulDescSetAttribute", "cublasLtMatmulDescDestroy", "cublasLtMatrixLayoutCreate",
      "cublasLtMatrixLayoutDestroy", "cublasLtMatmulPreferenceCreate",
      "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulPreferenceDestroy",
      "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul"};
  void *fns[sizeof names / sizeof names[0]];
  _Static_assert(sizeof lt == sizeof fns, "struct cuda_cublaslt and the names listed disagree");
  char path[512];
  void *lib = cuda_open_toolkit_library("libcublasLt", names, sizeof names / sizeof names[0], fns,
                                        path, sizeof path, about, sizeof about);
  if (lib == NULL) return;
  memcpy(&lt, fns, sizeof lt);   /* POSIX lets a void * from dlsym become a function pointer */
  cublasStatus_t st = lt.create(&handle);
  if (st != CUBLAS_STATUS_SUCCESS) {
    snprintf(about, sizeof about, "cublasLtCreate: %s", cublas.status_string(st));
    handle = NULL;
    return;
  }
  size_t v = lt.get_version();
  snprintf(about, sizeof about, "cuBLASLt %zu.%zu.%zu from %.300s", v / 10000, v / 100 % 100,
           v % 100, path);
}

void cublaslt_enable(int on) { atomic_store(&enabled, on != 0); }
int64_t cublaslt_runs(void) { return atomic_load(&runs); }

int cublaslt_probe(char *out, size_t len) {
  if (cuda_need_runtime() != L2L_OK) {   /* (cuBLAS's status strings come with the runtime) */
    if (out != NULL && len > 0) snprintf(out, len, "%s", cuda_rt.why);
    return 0;
  }
  pthread_once(&load_once, load);
  if (out != NULL && len > 0) snprintf(out, len, "%s", about);
  return handle != NULL;
}

/* ---------------------------------------------------------------- plans */

struct plan_key {
  int64_t m, n, k;
  int trans_a, trans_b, ab, c, bias, tf32;
  int align_a, align_b, align_c, align_bias;   /* bytes, powers of two up to 256 */
};

struct plan {
  struct plan_key key;
  bool usable;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;   /* Lt's A (l2l's b), B (l2l's a), C and D */
  cublasLtMatmulAlgo_t algo;
  uint64_t stamp;                      /* last use, for eviction (0: empty) */
};

enum { PLANS = 32 };
static struct plan plans[PLANS];
static uint64_t plan_clock;

static int alignment(const void *p) {
  int a = 256;
  while (a > 1 && (uintptr_t)p % (uintptr_t)a != 0) a >>= 1;
  return a;
}

static void plan_free(struct plan *p) {
  if (p->desc) lt.desc_destroy(p->desc);
  if (p->la) lt.layout_destroy(p->la);
  if (p->lb) lt.layout_destroy(p->lb);
  if (p->ld) lt.layout_destroy(p->ld);
  memset(p, 0, sizeof *p);
}

/* The descriptors and the heuristic's algorithm for k; false (why says where) when cuBLASLt
   refuses any of them or has no algorithm. bias: the call's (the heuristic reads its
   alignment from it). */
static bool plan_build(struct plan *p, const struct plan_key *k, const float *bias, char *why,
                       size_t len) {
#define LT_STEP(call)                                                                   \
  do {                                                                                  \
    cublasStatus_t st_ = (call);                                                        \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      snprintf(why, len, "%s: %s", #call, cublas.status_string(st_));                   \
      return false;                                                                     \
    }                                                                                   \
  } while (0)
  const cublasComputeType_t compute = k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   /* Lt's A: b */
  const cublasOperation_t op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;   /* Lt's B: a */
  const cublasLtEpilogue_t epilogue = k->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  LT_STEP(lt.desc_create(&p->desc, compute, CUDA_R_32F));
  LT_STEP(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  LT_STEP(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  LT_STEP(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (k->bias) {
    const int32_t bias_type = CUDA_R_32F;   /* (the default is D's type: a 16-bit D wants it said) */
    LT_STEP(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    LT_STEP(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  /* column-major views of row-major matrices: b (k,n) is n x k, a (m,k) is k x m, c n x m */
  const cudaDataType_t ab = cuda_data_type((l2l_dtype)k->ab);
  LT_STEP(lt.layout_create(&p->la, ab, (uint64_t)(k->trans_b ? k->k : k->n),
                           (uint64_t)(k->trans_b ? k->n : k->k), k->trans_b ? k->k : k->n));
  LT_STEP(lt.layout_create(&p->lb, ab, (uint64_t)(k->trans_a ? k->m : k->k),
                           (uint64_t)(k->trans_a ? k->k : k->m), k->trans_a ? k->m : k->k));
  LT_STEP(lt.layout_create(&p->ld, cuda_data_type((l2l_dtype)k->c), (uint64_t)k->n, (uint64_t)k->m, k->n));
  cublasLtMatmulPreference_t pref = NULL;
  LT_STEP(lt.pref_create(&pref));
  const uint64_t workspace = CUBLAS_WORKSPACE_BYTES;
  const uint32_t align_a = (uint32_t)k->align_b, align_b = (uint32_t)k->align_a;
  const uint32_t align_c = (uint32_t)k->align_c;
  cublasLtMatmulHeuristicResult_t result;
  memset(&result, 0, sizeof result);
  int count = 0;
  cublasStatus_t st = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                  sizeof workspace);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.heuristic(handle, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &result, &count);
  lt.pref_destroy(pref);
  LT_STEP(st);
  if (count < 1 || result.state != CUBLAS_STATUS_SUCCESS || result.workspaceSize > workspace) {
    snprintf(why, len, "the heuristic offers no algorithm (%d found)", count);
    return false;
  }
  p->algo = result.algo;
  return true;
#undef LT_STEP
}

/* The plan for k, built when first met (lock held). */
static struct plan *plan_for(const struct plan_key *k, const float *bias) {
  for (int i = 0; i < PLANS; i++)
    if (plans[i].stamp != 0 && memcmp(&plans[i].key, k, sizeof *k) == 0) {
      plans[i].stamp = ++plan_clock;
      return &plans[i];
    }
  struct plan *p = &plans[0];
  for (int i = 1; i < PLANS; i++)
    if (plans[i].stamp < p->stamp) p = &plans[i];
  plan_free(p);
  p->key = *k, p->stamp = ++plan_clock;
  char why[300] = "";
  p->usable = plan_build(p, k, bias, why, sizeof why);
  if (!p->usable) {
    static atomic_int warned;
    if (atomic_exchange(&warned, 1) == 0)
      fprintf(stderr, "l2l: cuBLASLt cannot run a GEMM m=%lld n=%lld k=%lld %c%c %s -> %s%s here "
              "(%s); a GEMM and a bias add run it (said once)\n", (long long)k->m,
              (long long)k->n, (long long)k->k, k->trans_a ? 'T' : 'N', k->trans_b ? 'T' : 'N',
              l2l_dtype_name((l2l_dtype)k->ab), l2l_dtype_name((l2l_dtype)k->c),
              k->bias ? " with a bias" : "", why);
  }
  return p;
}

/* ---------------------------------------------------------------- the call */

l2l_status cublaslt_gemm_bias(bool *ran, void *c, l2l_dtype c_dtype, const void *a,
                              const void *b, l2l_dtype ab_dtype, const float *bias, int64_t m,
                              int64_t n, int64_t k, int trans_a, int trans_b) {
  *ran = false;
  if (!atomic_load(&enabled) || m <= 0 || n <= 0 || k <= 0) return L2L_OK;
  pthread_once(&load_once, load);
  if (handle == NULL) return L2L_OK;
  struct plan_key key;
  memset(&key, 0, sizeof key);   /* (compared as bytes) */
  key.m = m, key.n = n, key.k = k, key.trans_a = trans_a != 0, key.trans_b = trans_b != 0;
  key.ab = (int)ab_dtype, key.c = (int)c_dtype, key.bias = bias != NULL;
  key.tf32 = ab_dtype == L2L_F32 && atomic_load(&cuda_rt.tf32);
  key.align_a = alignment(a), key.align_b = alignment(b), key.align_c = alignment(c);
  key.align_bias = bias != NULL ? alignment(bias) : 0;
  pthread_mutex_lock(&lock);
  struct plan *p = plan_for(&key, bias);
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (p->usable && bias != NULL)
    st = lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (p->usable && st == CUBLAS_STATUS_SUCCESS) {
    const float one = 1.0f, zero = 0.0f;
    st = lt.matmul(handle, p->desc, &one, b, p->la, a, p->lb, &zero, c, p->ld, c, p->ld,
                   &p->algo, cuda_rt.cublas_workspace, CUBLAS_WORKSPACE_BYTES, cuda_rt.compute);
    *ran = st == CUBLAS_STATUS_SUCCESS;
  }
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_ARCH_MISMATCH ||
      st == CUBLAS_STATUS_INVALID_VALUE) {   /* refused as it was asked: nothing queued */
    p->usable = false;
    static atomic_int warned;
    if (atomic_exchange(&warned, 1) == 0)
      fprintf(stderr, "l2l: cuBLASLt refused a GEMM m=%lld n=%lld k=%lld it had planned (%s); a "
              "GEMM and a bias add run it (said once)\n", (long long)m, (long long)n,
              (long long)k, cublas.status_string(st));
    st = CUBLAS_STATUS_SUCCESS;
  }
  pthread_mutex_unlock(&lock);
  if (*ran) atomic_fetch_add(&runs, 1);
  if (st != CUBLAS_STATUS_SUCCESS) return cublas_error(st, __FILE__, __LINE__, "cublasLtMatmul");
  return L2L_OK;
}

#endif /* L2L_CUDA */
