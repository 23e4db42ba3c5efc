/* SPDX-License-Identifier: MIT */
/* cudnn_sdpa.c — attention through cuDNN's fused scaled-dot-product attention, built with
 * cuDNN's backend C API (cudnn_graph.h): tensor and operation descriptors, an operation
 * graph, engine heuristics, an execution plan, a variant pack.
 *
 * Purpose: the graphs are the node patterns cuDNN's runtime-fusion attention engines
 * recognise (learnt from NVIDIA's cudnn-frontend, whose SDPA nodes expand into them).
 * Forward: S = Q K^T, S *= scale, [causal: S = row >= col ? S : -inf], M = max_j S,
 * E = exp(S - M), Z = sum_j E, stats = M + log Z, P = E / Z (16-bit), O = P V. Backward:
 * Dsum = sum_d dO * O (times 1, f32 in the scratch), S as above less stats, [mask], E =
 * exp(S - stats), dV = E^T dO, dP = dO V^T, dS = (dP - Dsum) * E * scale, dK = dS^T Q,
 * dQacc = dS K (f32, zeroed, in the scratch), dQ = identity(dQacc). Stats is exactly the
 * own kernels' lse (natural log, [B, H, S]), so either path's lse serves either backward;
 * still, both directions take the path cudnn_routes picks by one predicate per shape,
 * whose plans (forward and backward) are built together and cached (16 shapes).
 * q, k, v and o are f32 (cast to packed 16-bit copies in the scratch, one kernel each, and
 * o cast back) or, as the block keeps them on a 16-bit run, the graph's own 16 bits: o read
 * and written in place where packed and aligned, q, k, v read in place by graphs built with
 * their rows' stride (a cache entry of their own) where aligned and planned, else copied
 * packed. dQ, dK, dV likewise: cast back to f32, or in 16 bits written in place by the
 * graphs that read q, k, v in place (with the same stride), else copied from packed ones.
 * dO likewise: cast from f32, or in 16 bits read in place where packed and aligned (the
 * projection's GEMM writes it so), else copied packed.
 * Must never: be taken for dropout, a key mask, f32 products, kept probabilities, or a
 * graph cuDNN refuses on the device (the own kernels serve those).
 */
#include <math.h>
#include <float.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef L2L_CUDA

#include "cudnn_sdpa.h"

#include "kernels/cast_rows.h"
#include "kernels/dtype.h"

static atomic_int enabled = 1, refusals_asked;
static atomic_llong runs;
void cudnn_enable(int on) { atomic_store(&enabled, on != 0); }
int64_t cudnn_runs(void) { return atomic_load(&runs); }
void cudnn_refuse_next(int n) { atomic_store(&refusals_asked, n > 0 ? n : 0); }

#ifndef L2L_CUDNN_HEADERS

bool cudnn_routes(const struct backend_attention_shape *sh, const void *probs,
                  const void *dropped, const void *mask, const void *key_mask) {
  (void)sh, (void)probs, (void)dropped, (void)mask, (void)key_mask;
  return false;
}
l2l_status cudnn_check_graphs(const struct backend_attention_shape *sh, int backward, int miswire,
                              char *report, size_t len) {
  (void)sh, (void)backward, (void)miswire, (void)report, (void)len;
  char why[512];
  cudnn_probe(why, sizeof why);
  return core_fail(L2L_ERR_UNSUPPORTED, "%s", why);
}
l2l_status cudnn_describe(const struct backend_attention_shape *sh, int backward,
                          struct backend_sdpa_view *out) {
  (void)sh, (void)backward, (void)out;
  return core_fail(L2L_ERR_UNSUPPORTED, "this build has no cuDNN support");
}
void cudnn_forget_plans(void) {}
uint64_t cudnn_sdpa_scratch_bytes(const struct backend_attention_shape *sh,
                                  const struct sdpa_call *c, int backward) {
  (void)sh, (void)c, (void)backward;
  return 0;
}
l2l_status cudnn_sdpa_forward(bool *ran, void *o, float *lse, const void *q, const void *k,
                              const void *v, const struct backend_attention_shape *sh,
                              void *scratch) {
  (void)ran, (void)o, (void)lse, (void)q, (void)k, (void)v, (void)sh, (void)scratch;
  return core_fail(L2L_ERR_UNSUPPORTED, "this build has no cuDNN support");
}
int cudnn_sdpa_launches(const struct backend_attention_shape *sh, const struct sdpa_call *c,
                        int backward) {
  (void)sh, (void)c, (void)backward;
  return 0;
}
l2l_status cudnn_sdpa_backward(bool *ran, void *dq, void *dk, void *dv, const void *d_o,
                               const void *o, const float *lse, const void *q, const void *k,
                               const void *v, const struct backend_attention_shape *sh,
                               void *scratch) {
  (void)ran, (void)dq, (void)dk, (void)dv, (void)d_o, (void)o, (void)lse, (void)q, (void)k;
  (void)v, (void)sh, (void)scratch;
  return core_fail(L2L_ERR_UNSUPPORTED, "this build has no cuDNN support");
}

#else

#include "cudnn_graph_build.h"

/* ---------------------------------------------------------------- the plan cache */

struct key {
  int64_t batch, heads, seq, head_dim;
  int causal;
  l2l_dtype precision;
  int64_t ld_q;   /* q, k, v's row stride read in place (16-bit), 0 for packed copies */
  int dq_in_place;   /* dq, dk, dv written in place at that stride (16-bit) */
};

struct entry {
  struct key key;
  bool usable;
  struct sdpa_graph *fwd, *bwd;   /* with their plans */
  uint64_t stamp;                 /* last use, for eviction */
};

enum { CACHE_SLOTS = 16 };
static struct entry cache[CACHE_SLOTS];
static uint64_t cache_clock;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t handle;
static bool handle_tried;
static char handle_why[256];

/* The one handle, on the compute stream; NULL (with handle_why) when cuDNN cannot start. */
static cudnnHandle_t get_handle(void) {
  if (!handle_tried) {
    handle_tried = true;
    const char *call = "cudnnCreate";
    cudnnStatus_t st = cudnn.create(&handle);
    if (st == CUDNN_STATUS_SUCCESS) {
      call = "cudnnSetStream";
      st = cudnn.set_stream(handle, cuda_rt.compute);
      if (st != CUDNN_STATUS_SUCCESS) cudnn.destroy(handle);   /* (no handle kept: none leaks) */
    }
    if (st != CUDNN_STATUS_SUCCESS) {
      snprintf(handle_why, sizeof handle_why, "%s: %s", call, cudnn.error_string(st));
      handle = NULL;
    }
  }
  return handle;
}

static struct key key_of(const struct backend_attention_shape *sh) {
  struct key k;
  memset(&k, 0, sizeof k);
  k.batch = sh->batch, k.heads = sh->heads, k.seq = sh->seq, k.head_dim = sh->head_dim;
  k.causal = sh->causal != 0, k.precision = sh->precision;
  k.ld_q = sh->qkv_dtype == L2L_F32 ? 0 : sh->ld_qkv;
  k.dq_in_place = sh->qkv_dtype != L2L_F32 && sh->dqkv_dtype != L2L_F32;
  return k;
}

/* What runs a call whose entry cannot: the graphs that write packed dq, dk, dv (for those
   writing them in place), the packed copies' graphs (for those reading q, k, v in place),
   or the own kernels (for the packed copies' graphs). */
static const char *next_path(const struct key *k) {
  return k->dq_in_place ? "its graphs writing packed dq, dk, dv"
         : k->ld_q != 0 ? "its graphs on packed copies"
                        : "l2l's own kernels";
}

/* An entry emptied: its plans given back (cache_lock held). */
static void entry_drop(struct entry *e) {
  sdpa_graph_free(e->fwd), sdpa_graph_free(e->bwd);
  memset(e, 0, sizeof *e);
}

/* The cache's entry for this shape, its plans built when first met (cache_lock held). */
static struct entry *entry_for(const struct backend_attention_shape *sh) {
  struct key k = key_of(sh);
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (cache[i].stamp != 0 && memcmp(&cache[i].key, &k, sizeof k) == 0) {
      cache[i].stamp = ++cache_clock;
      return &cache[i];
    }
  struct entry *e = &cache[0];
  for (int i = 1; i < CACHE_SLOTS; i++)
    if (cache[i].stamp < e->stamp) e = &cache[i];
  entry_drop(e);
  e->key = k, e->stamp = ++cache_clock;
  cudnnHandle_t h = get_handle();
  char why[400] = "";
  if (h == NULL) {
    snprintf(why, sizeof why, "%s", handle_why);
  } else {
    e->fwd = sdpa_graph_build(sh, 0, 0, why, sizeof why);
    if (e->fwd != NULL && sdpa_graph_plan(e->fwd, h, why, sizeof why))
      e->bwd = sdpa_graph_build(sh, 1, 0, why, sizeof why);
    e->usable = e->bwd != NULL && sdpa_graph_plan(e->bwd, h, why, sizeof why);
  }
  if (!e->usable) {   /* (each once: in place, the packed copies' graphs run instead) */
    static atomic_int warned[3];   /* packed; q, k, v in place; and dq, dk, dv too */
    if (atomic_exchange(&warned[k.ld_q == 0 ? 0 : k.dq_in_place ? 2 : 1], 1) == 0)
      fprintf(stderr, "l2l: cuDNN cannot run attention B=%lld H=%lld S=%lld d=%lld%s%s%s here "
              "(%s); %s run it (said once)\n", (long long)k.batch, (long long)k.heads,
              (long long)k.seq, (long long)k.head_dim, k.causal ? " causal" : "",
              k.ld_q != 0 ? " reading q, k, v in place" : "",
              k.dq_in_place ? " and writing dq, dk, dv so" : "", why, next_path(&k));
  }
  return e;
}

void cudnn_forget_plans(void) {
  pthread_mutex_lock(&cuda_rt.lock);
  pthread_mutex_lock(&cache_lock);
  for (int i = 0; i < CACHE_SLOTS; i++) entry_drop(&cache[i]);
  pthread_mutex_unlock(&cache_lock);
  pthread_mutex_unlock(&cuda_rt.lock);
}

/* What cuDNN's SDPA covers and this path serves; the rest stays on the own kernels. */
static bool covered(const struct backend_attention_shape *sh, const void *probs, const void *dropped,
                    const void *mask, const void *key_mask) {
  if (probs != NULL || dropped != NULL || mask != NULL || key_mask != NULL) return false;
  if (sh->dropout != 0 || (sh->precision != L2L_BF16 && sh->precision != L2L_F16)) return false;
  if (sh->head_dim % 8 != 0 || sh->head_dim < 8 || sh->head_dim > 128) return false;
  if (sh->batch < 1 || sh->heads < 1 || sh->seq < 1) return false;
  if (sh->ld_qkv < sh->heads * sh->head_dim || sh->ld_o < sh->heads * sh->head_dim) return false;
  /* o, and q, k, v: f32 (cast to and from the graph's 16 bits), or the graph's own dtype */
  if (sh->o_dtype != L2L_F32 && sh->o_dtype != sh->precision) return false;
  if (sh->qkv_dtype != L2L_F32 && sh->qkv_dtype != sh->precision) return false;
  if (sh->dqkv_dtype != L2L_F32 && sh->dqkv_dtype != sh->precision) return false;
  if (sh->do_dtype != L2L_F32 && sh->do_dtype != sh->precision) return false;
  /* before 9.16 the backward needed a padding mask when S is not a multiple of 128
     (cudnn-frontend adds one); l2l's graphs have none */
  if (cudnn_loaded_version() <= 91500 && sh->seq % 128 != 0) return false;
  return true;
}

/* The shape of the graphs that read packed 16-bit copies of q, k, v in the scratch (and
   write packed dq, dk, dv there): the way every covered call can run (a call whose 16-bit
   tensors cannot be used in place copies them). The graphs' shape marks a tensor used in
   place by its 16-bit dtype (shapes_of in cudnn_graph_build.c). */
static struct backend_attention_shape packed_of(const struct backend_attention_shape *sh) {
  struct backend_attention_shape p = *sh;
  p.qkv_dtype = p.dqkv_dtype = L2L_F32;
  return p;
}

/* (With cuda_rt.lock, as every run holds it from its route to its last launch: an entry
   this lookup evicts is no other thread's running one.) */
bool cudnn_routes(const struct backend_attention_shape *sh, const void *probs,
                  const void *dropped, const void *mask, const void *key_mask) {
  if (!atomic_load(&enabled) || !cudnn_loaded() || !covered(sh, probs, dropped, mask, key_mask))
    return false;
  struct backend_attention_shape packed = packed_of(sh);
  pthread_mutex_lock(&cuda_rt.lock);
  pthread_mutex_lock(&cache_lock);
  bool usable = entry_for(&packed)->usable;
  pthread_mutex_unlock(&cache_lock);
  pthread_mutex_unlock(&cuda_rt.lock);
  return usable;
}

/* ---------------------------------------------------------------- running */

static uint64_t up256(uint64_t n) { return (n + 255) & ~(uint64_t)255; }

/* cuDNN is told its real tensors are 16-byte aligned: an lse that is not (a slice of a
   larger tensor) goes through `spare` in the scratch. */
static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static struct entry *entry_locked(const struct backend_attention_shape *sh) {
  pthread_mutex_lock(&cache_lock);
  struct entry *e = entry_for(sh);
  pthread_mutex_unlock(&cache_lock);
  return e;
}

/* Where a call runs: the graphs that read the caller's 16-bit q, k, v in place
   (qkv_in_place) where each is 16-byte aligned, as are their rows, and cuDNN plans them,
   writing 16-bit dq, dk, dv in place too (dq_in_place) where those are aligned (a forward's,
   not known yet, are taken to be) and cuDNN plans that, else into packed ones; else the
   packed copies' graphs. */
struct route {
  struct entry *e;
  bool qkv_in_place, dq_in_place;
};

static struct route route_of(const struct backend_attention_shape *sh, const struct sdpa_call *c) {
  if (sh->qkv_dtype != L2L_F32 && aligned16(c->q) && aligned16(c->k) && aligned16(c->v) &&
      sh->ld_qkv * 2 % 16 == 0) {
    struct backend_attention_shape s = *sh;
    bool dq = sh->dqkv_dtype != L2L_F32 &&
              (c->dq == NULL || (aligned16(c->dq) && aligned16(c->dk) && aligned16(c->dv)));
    if (!dq) s.dqkv_dtype = L2L_F32;
    struct entry *e = entry_locked(&s);
    if (!e->usable && dq) {   /* (refused writing dq, dk, dv in place: read q, k, v so still) */
      s.dqkv_dtype = L2L_F32, dq = false;
      e = entry_locked(&s);
    }
    if (e->usable) return (struct route){e, true, dq};
  }
  struct backend_attention_shape packed = packed_of(sh);
  return (struct route){entry_locked(&packed), false, false};
}

/* Bytes of one packed 16-bit [B, S, H, D] copy. */
static uint64_t half_bytes(const struct backend_attention_shape *sh) {
  return up256((uint64_t)sh->batch * sh->seq * sh->heads * sh->head_dim * 2);
}

uint64_t cudnn_sdpa_scratch_bytes(const struct backend_attention_shape *sh,
                                  const struct sdpa_call *c, int backward) {
  struct entry *e = route_of(sh, c).e;
  int64_t ws = !e->usable ? 0 : backward ? sdpa_graph_workspace(e->bwd) : sdpa_graph_workspace(e->fwd);
  uint64_t rows = (uint64_t)sh->batch * sh->heads * sh->seq;
  /* 16-bit copies, then [backward: Dsum, dQ's accumulator], the stats, cuDNN's workspace */
  if (!backward) return 4 * half_bytes(sh) + up256(rows * 4) + up256((uint64_t)ws);
  return 8 * half_bytes(sh) + 2 * up256(rows * 4) + up256(rows * sh->head_dim * 4) +
         up256((uint64_t)ws);
}

#define CAST(dst, dst_t, dst_ld, src, src_t, src_ld)                                        \
  do {                                                                                     \
    CUDA_TRY(k_cast_rows(dst, dst_t, dst_ld, src, src_t, src_ld, sh->batch * sh->seq,  \
                         sh->heads * sh->head_dim, cuda_rt.compute));                  \
  } while (0)

/* An o (or do) of the graph's own 16 bits is its O (dO) where it is packed and aligned: no
   copy. */
static bool packed16(const void *x, l2l_dtype dtype, const struct backend_attention_shape *sh) {
  return dtype != L2L_F32 && sh->ld_o == sh->heads * sh->head_dim && aligned16(x);
}
static bool o_is_packed16(const void *o, const struct backend_attention_shape *sh) {
  return packed16(o, sh->o_dtype, sh);
}

/* dst (16 bits, row stride dst_ld) := src (the same dtype, src_ld), rows of the heads. */
static l2l_status copy_rows16(void *dst, int64_t dst_ld, const void *src, int64_t src_ld,
                              const struct backend_attention_shape *sh) {
  CUDA_TRY(cudaMemcpy2DAsync(dst, (size_t)dst_ld * 2, src, (size_t)src_ld * 2,
                             (size_t)(sh->heads * sh->head_dim) * 2, (size_t)(sh->batch * sh->seq),
                             cudaMemcpyDeviceToDevice, cuda_rt.compute));
  return L2L_OK;
}

/* One plan run; where cuDNN refuses it (it planned it, and then could not run it on this
   device), its entry is retired: *ran false, nothing of the caller's written yet (the plan
   is the first write into o, or dq, dk, dv; before it only the scratch), so the caller
   runs the call on the own kernels, and the shape's later calls take its next graph or the
   own kernels (next_path; said once on stderr; an evicted entry is planned and tried
   anew). The CUDA error the refusal left is cleared, so the own kernels' launch check does
   not take it for theirs; a sticky one (the device is lost, and earlier work's error it may
   be) stays: an error then, the entry kept. */
static l2l_status execute(bool *ran, struct entry *e, struct sdpa_graph *g, const int64_t *uids,
                          void **ptrs, int n, void *workspace) {
  char why[400] = "a test's refusal (cudnn_refuse_next)";
  int asked = atomic_load(&refusals_asked);
  while (asked > 0 && !atomic_compare_exchange_weak(&refusals_asked, &asked, asked - 1)) {}
  if (asked <= 0 && sdpa_graph_execute(g, get_handle(), uids, ptrs, n, workspace, why, sizeof why)) {
    atomic_fetch_add(&runs, 1);
    return L2L_OK;
  }
  (void)cudaGetLastError();
  cudaError_t sticky = cudaPeekAtLastError();
  if (sticky == cudaSuccess) {   /* (an error inside cuDNN, whose runtime may be its own copy,
                                    need not show in ours; the stream reports the context's) */
    cudaError_t queried = cudaStreamQuery(cuda_rt.compute);
    if (queried != cudaSuccess && queried != cudaErrorNotReady) sticky = queried;
    (void)cudaGetLastError();
  }
  if (sticky != cudaSuccess)
    return core_fail(L2L_ERR_BACKEND, "cuDNN attention: %s, with the device in error (%s)", why,
                     cudaGetErrorString(sticky));
  pthread_mutex_lock(&cache_lock);
  e->usable = false;
  pthread_mutex_unlock(&cache_lock);
  *ran = false;
  static atomic_int warned;
  if (atomic_exchange(&warned, 1) == 0)
    fprintf(stderr, "l2l: cuDNN could not run its attention plan for B=%lld H=%lld S=%lld d=%lld "
            "(%s); l2l's own kernels run the call, and %s run that shape from here (said once)\n",
            (long long)e->key.batch, (long long)e->key.heads, (long long)e->key.seq,
            (long long)e->key.head_dim, why, next_path(&e->key));
  return L2L_OK;
}

/* Forward: q, k, v cast or copied unless in place, the plan, o cast or copied unless in
   place; backward: the same for q, k, v and o, dO cast or copied unless in place, dQ's
   accumulator zeroed, the plan, dQ, dK, dV cast or copied back unless in place; either
   way the stats copied where lse is not 16-byte aligned. */
int cudnn_sdpa_launches(const struct backend_attention_shape *sh, const struct sdpa_call *c,
                        int backward) {
  struct route r = route_of(sh, c);
  int for_qkv = r.qkv_in_place ? 0 : 3, for_o = o_is_packed16(c->o, sh) ? 0 : 1;
  int for_do = packed16(c->d_o, sh->do_dtype, sh) ? 0 : 1, for_lse = aligned16(c->lse) ? 0 : 1;
  return for_qkv + for_o + 1 + for_lse + (backward ? for_do + 1 + (r.dq_in_place ? 0 : 3) : 0);
}

/* Between a caller's tensor x (dtype, rows ld apart) and the graph's packed 16-bit p: into
   p (to_packed) or back into x, cast where x is f32, copied where it is 16-bit; nothing
   where p is x itself (read or written in place). */
static l2l_status packed_move(void *p, void *x, l2l_dtype dtype, int64_t ld, bool to_packed,
                              const struct backend_attention_shape *sh) {
  if (p == x) return L2L_OK;
  const int t = (int)sh->precision;
  const int64_t hd = sh->heads * sh->head_dim;
  if (dtype == L2L_F32 && to_packed) CAST(p, t, hd, x, DT_F32, ld);
  else if (dtype == L2L_F32) CAST(x, DT_F32, ld, p, t, hd);
  else if (to_packed) TRY(copy_rows16(p, hd, x, ld, sh));
  else TRY(copy_rows16(x, ld, p, hd, sh));
  return L2L_OK;
}

/* q16, k16, v16 := q, k, v themselves where read in place, else their packed copies in the
   scratch at `at` (three half_bytes). */
static l2l_status qkv_packed(void *qkv16[3], char *at, const void *q, const void *k,
                             const void *v, bool in_place,
                             const struct backend_attention_shape *sh) {
  const void *x[3] = {q, k, v};
  for (int i = 0; i < 3; i++) {
    qkv16[i] = in_place ? (void *)x[i] : at + (uint64_t)i * half_bytes(sh);
    TRY(packed_move(qkv16[i], (void *)x[i], sh->qkv_dtype, sh->ld_qkv, true, sh));
  }
  return L2L_OK;
}

l2l_status cudnn_sdpa_forward(bool *ran, void *o, float *lse, const void *q, const void *k,
                              const void *v, const struct backend_attention_shape *sh,
                              void *scratch) {
  const struct sdpa_call c = {q, k, v, o, NULL, NULL, NULL, NULL, lse};
  struct route r = route_of(sh, &c);
  if (!r.e->usable) {   /* retired by another call since cudnn_routes said yes */
    *ran = false;
    return L2L_OK;
  }
  char *s = scratch;
  uint64_t hb = half_bytes(sh);
  uint64_t rows = (uint64_t)sh->batch * sh->heads * sh->seq;
  void *qkv16[3], *spare = s + 4 * hb;
  void *o16 = o_is_packed16(o, sh) ? o : s + 3 * hb;
  void *ws = s + 4 * hb + up256(rows * 4), *stats = aligned16(lse) ? (void *)lse : spare;
  TRY(qkv_packed(qkv16, s, q, k, v, r.qkv_in_place, sh));
  float scale = sh->scale, hidden = sdpa_hidden_value();
  int64_t uids[] = {SDPA_Q, SDPA_K, SDPA_V, SDPA_O, SDPA_STATS, SDPA_SCALE, SDPA_HIDDEN};
  void *ptrs[] = {qkv16[0], qkv16[1], qkv16[2], o16, stats, &scale, &hidden};
  TRY(execute(ran, r.e, r.e->fwd, uids, ptrs, sh->causal ? 7 : 6, ws));   /* hidden: the mask's only */
  if (!*ran) return L2L_OK;
  if (stats != lse)
    CUDA_TRY(cudaMemcpyAsync(lse, stats, rows * 4, cudaMemcpyDeviceToDevice, cuda_rt.compute));
  return packed_move(o16, o, sh->o_dtype, sh->ld_o, false, sh);
}

l2l_status cudnn_sdpa_backward(bool *ran, void *dq, void *dk, void *dv, const void *d_o,
                               const void *o, const float *lse, const void *q, const void *k,
                               const void *v, const struct backend_attention_shape *sh,
                               void *scratch) {
  const struct sdpa_call c = {q, k, v, o, d_o, dq, dk, dv, lse};
  struct route r = route_of(sh, &c);
  if (!r.e->usable) {   /* retired by another call since cudnn_routes said yes */
    *ran = false;
    return L2L_OK;
  }
  uint64_t hb = half_bytes(sh), rows = (uint64_t)sh->batch * sh->heads * sh->seq;
  char *s = scratch;
  void *qkv16[3];
  void *do16 = packed16(d_o, sh->do_dtype, sh) ? (void *)d_o : s + 4 * hb;
  void *o16 = o_is_packed16(o, sh) ? (void *)o : s + 3 * hb;
  void *g16[3] = {s + 5 * hb, s + 6 * hb, s + 7 * hb}, *grads[3] = {dq, dk, dv};
  void *dsum = s + 8 * hb, *dq_acc = s + 8 * hb + up256(rows * 4);
  void *spare = (char *)dq_acc + up256(rows * sh->head_dim * 4);
  void *ws = (char *)spare + up256(rows * 4), *stats = aligned16(lse) ? (void *)lse : spare;
  if (stats != lse)
    CUDA_TRY(cudaMemcpyAsync(stats, lse, rows * 4, cudaMemcpyDeviceToDevice, cuda_rt.compute));
  TRY(qkv_packed(qkv16, s, q, k, v, r.qkv_in_place, sh));
  if (r.dq_in_place) memcpy(g16, grads, sizeof g16);
  TRY(packed_move(o16, (void *)o, sh->o_dtype, sh->ld_o, true, sh));
  TRY(packed_move(do16, (void *)d_o, sh->do_dtype, sh->ld_o, true, sh));
  CUDA_TRY(cudaMemsetAsync(dq_acc, 0, rows * sh->head_dim * 4, cuda_rt.compute));
  float scale = sh->scale, hidden = sdpa_hidden_value(), one = 1.0f;
  int64_t uids[] = {SDPA_Q,  SDPA_K,  SDPA_V,  SDPA_O,   SDPA_STATS, SDPA_SCALE, SDPA_ONE,
                    SDPA_DO, SDPA_DQ, SDPA_DK, SDPA_DV, SDPA_DSUM,  SDPA_DQ_ACC, SDPA_HIDDEN};
  void *ptrs[] = {qkv16[0], qkv16[1], qkv16[2], o16, stats, &scale, &one,
                  do16, g16[0], g16[1], g16[2], dsum, dq_acc, &hidden};
  TRY(execute(ran, r.e, r.e->bwd, uids, ptrs, sh->causal ? 14 : 13, ws));
  if (!*ran) return L2L_OK;
  for (int i = 0; i < 3; i++)   /* (nothing where written in place) */
    TRY(packed_move(g16[i], grads[i], sh->dqkv_dtype, sh->ld_qkv, false, sh));
  return L2L_OK;
}

/* ---------------------------------------------------------------- the check */

l2l_status cudnn_describe(const struct backend_attention_shape *sh, int backward,
                          struct backend_sdpa_view *out) {
  char why[512];
  if (out == NULL) return core_fail(L2L_ERR_INVALID, "out is NULL");
  if (!cudnn_loaded()) {
    cudnn_probe(why, sizeof why);
    return core_fail(L2L_ERR_UNSUPPORTED, "cuDNN is not loaded: %s", why);
  }
  struct sdpa_graph *g = sdpa_graph_build(sh, backward, 0, why, sizeof why);
  if (g == NULL) return core_fail(L2L_ERR_BACKEND, "%s", why);
  sdpa_graph_describe(g, out);
  sdpa_graph_free(g);
  return L2L_OK;
}

l2l_status cudnn_check_graphs(const struct backend_attention_shape *sh, int backward, int miswire,
                              char *report, size_t len) {
  char why[512];
  if (!cudnn_loaded()) {
    cudnn_probe(why, sizeof why);
    return core_fail(L2L_ERR_UNSUPPORTED, "cuDNN is not loaded: %s", why);
  }
  struct sdpa_graph *g = sdpa_graph_build(sh, backward, miswire, why, sizeof why);
  if (g == NULL) return core_fail(L2L_ERR_BACKEND, "%s", why);
  int tensors = 0, ops = 0;
  sdpa_graph_counts(g, &tensors, &ops);
  char plan[640];
  if (cuda_probe(NULL, 0)) {
    cudnnHandle_t h = get_handle();
    if (h == NULL)
      snprintf(plan, sizeof plan, "no plan: %s", handle_why);
    else if (sdpa_graph_plan(g, h, why, sizeof why))
      snprintf(plan, sizeof plan, "planned, workspace %lld bytes",
               (long long)sdpa_graph_workspace(g));
    else
      snprintf(plan, sizeof plan, "refused on this GPU: %s", why);
  } else if (cudnn_loaded_version() >= 90800) {   /* the graph itself needs no handle */
    char cuda_why[320];
    cuda_probe(cuda_why, sizeof cuda_why);
    if (!sdpa_graph_finalize(g, NULL, why, sizeof why)) {
      sdpa_graph_free(g);
      return core_fail(L2L_ERR_BACKEND, "the %s graph is refused: %s",
                       backward ? "backward" : "forward", why);
    }
    snprintf(plan, sizeof plan, "operation graph finalized without a GPU; engine choice, plan "
             "and execution skipped: they need a GPU, and CUDA cannot run here (%.300s)", cuda_why);
  } else {
    cuda_probe(why, sizeof why);
    snprintf(plan, sizeof plan, "graph finalize, plan and execution skipped: they need a GPU, "
             "and CUDA cannot run here (%.300s)", why);
  }
  if (report != NULL && len > 0)
    snprintf(report, len, "%d tensors and %d operations finalized; %s", tensors, ops, plan);
  sdpa_graph_free(g);
  return L2L_OK;
}

#endif /* L2L_CUDNN_HEADERS */
#endif /* L2L_CUDA */
