/* SPDX-License-Identifier: MIT */
/* softmax.cu — the softmax-based row-wise ops on the GPU: masked/causal softmax (forward,
 * backward) and cross-entropy (forward, backward, and loss and gradient fused).
 *
 * Purpose: match the CPU backend's ops of the same names (src/backend/cpu/: fp32
 * throughout, the same formulas in the same operand order, accurate expf/logf) while
 * touching each row of global memory as few times as possible, in the row-wise kernels'
 * shape (rows.cuh: a warp or a block owns a row, cached on chip where it fits). Their
 * launchers are declared with LayerNorm's in norm.h.
 * Must never: synchronize, allocate, print, keep state between launches, or read an
 * output before writing it.
 */
#include "norm.h"

#include <math.h>

#include "rows.cuh"

namespace {

/* ---------------------------------------------------------------- softmax */

/* As cpu_softmax_forward: max of the visible scale x, then the sum of their exps, then y;
   the row is cached by the first pass where it fits. */
template <bool WARP>
__global__ void __launch_bounds__(1024)
    softmax_forward_kernel(float *y, const float *x, const uint8_t *key_mask, int causal,
                           float scale, int64_t rows, int64_t rows_per_sample, int64_t tq,
                           int64_t tk, bool cache_rows) {
  K_STATIC_SHARED(float, red, [32]);
  K_DYNAMIC_SHARED(float4, row_cache);
  const RowGroup g = row_group<WARP>();
  float *slice =
      cache_rows ? reinterpret_cast<float *>(row_cache) + g.slot * padded_cols(tk) : nullptr;
  const bool vec_out = congruent(y, x);

  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int64_t off = row * tk;
    const float *xr = x + off;
    float *yr = y + off;
    const uint8_t *mask = key_mask ? key_mask + (row / rows_per_sample) * tk : nullptr;
    const int64_t query = row % tq;
    int64_t limit = causal ? query + (tk - tq) + 1 : tk; /* keys [0, limit) are visible */
    if (limit > tk) limit = tk;
    if (limit < 0) limit = 0;
    float *cache = slice ? slice + cache_shift(xr) : nullptr;

    float mx = -INFINITY;
    for_row(xr, limit, true, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      const Pack<W> v = load_pack<W>(xr + j);
      if (cache) store_pack<W>(cache + j, v);
#pragma unroll
      for (int e = 0; e < W; e++) {
        const float z = (mask && !mask[j + e]) ? -INFINITY : scale * v.v[e];
        mx = z > mx ? z : mx;
      }
    });
    mx = group_max<WARP>(mx, red); /* a block's barrier also publishes the cache */
    if constexpr (WARP) group_sync<WARP>(); /* (a warp's shuffles do not: the write pass may
                                              read another lane's cache, vec_out or not) */
    const bool hidden = mx == -INFINITY; /* every key hidden: the row is all zeros */

    const float *src = cache ? cache : xr;
    float sum = 0.0f;
    if (!hidden)
      for_row(src, limit, true, g.t, g.T, [&](auto w, int64_t j) {
        constexpr int W = decltype(w)::value;
        const Pack<W> v = load_pack<W>(src + j);
#pragma unroll
        for (int e = 0; e < W; e++)
          if (!mask || mask[j + e]) sum += expf(scale * v.v[e] - mx);
      });
    sum = group_sum<WARP>(sum, red); /* outside the branch: hidden is group-uniform anyway */
    const float inv = 1.0f / sum;    /* unused when hidden */

    /* y may be x: each thread reads the elements it writes, after every read above. A
       float4 chunk straddling limit reads x (or the cache's spare floats) past limit but
       inside the row; those values are discarded. */
    for_row(src, tk, vec_out, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      Pack<W> o;
      if (!hidden && j < limit) {
        const Pack<W> v = load_pack<W>(src + j);
#pragma unroll
        for (int e = 0; e < W; e++) {
          const int64_t k = j + e;
          o.v[e] = (k < limit && (!mask || mask[k])) ? expf(scale * v.v[e] - mx) * inv : 0.0f;
        }
      } else {
#pragma unroll
        for (int e = 0; e < W; e++) o.v[e] = 0.0f;
      }
      store_pack<W>(yr + j, o);
    });
    group_sync<WARP>(); /* the next row lays the cache out with another thread map */
  }
}

/* dx = scale y (dy - dot(dy, y)); dy and y are cached by the dot pass where they fit. */
template <bool WARP>
__global__ void __launch_bounds__(1024)
    softmax_backward_kernel(float *dx, const float *dy, const float *y, float scale,
                            int64_t rows, int64_t cols, bool cache_rows) {
  K_STATIC_SHARED(float, red, [32]);
  K_DYNAMIC_SHARED(float4, row_cache);
  const RowGroup g = row_group<WARP>();
  const int64_t padded = padded_cols(cols);
  float *slice =
      cache_rows ? reinterpret_cast<float *>(row_cache) + g.slot * 2 * padded : nullptr;
  const bool vec_in = congruent(dy, y), vec_out = vec_in && congruent(dx, dy);

  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int64_t off = row * cols;
    const float *dyr = dy + off, *yr = y + off;
    float *dxr = dx + off;
    float *cache_dy = slice ? slice + cache_shift(dyr) : nullptr;
    float *cache_y = slice ? slice + padded + cache_shift(yr) : nullptr;

    float dot = 0.0f;
    for_row(dyr, cols, vec_in, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      const Pack<W> a = load_pack<W>(dyr + j), b = load_pack<W>(yr + j);
      if (cache_dy) store_pack<W>(cache_dy + j, a), store_pack<W>(cache_y + j, b);
#pragma unroll
      for (int e = 0; e < W; e++) dot += a.v[e] * b.v[e];
    });
    dot = group_sum<WARP>(dot, red);
    group_sync<WARP>(); /* dx may be dy: the row's dy is all read (and cached) first */

    const float *pdy = cache_dy ? cache_dy : dyr, *py = cache_dy ? cache_y : yr;
    for_row(pdy, cols, vec_out, g.t, g.T, [&](auto w, int64_t j) {
      constexpr int W = decltype(w)::value;
      const Pack<W> a = load_pack<W>(pdy + j), b = load_pack<W>(py + j);
      Pack<W> o;
#pragma unroll
      for (int e = 0; e < W; e++) o.v[e] = scale * b.v[e] * (a.v[e] - dot);
      store_pack<W>(dxr + j, o);
    });
    group_sync<WARP>(); /* the next row lays the cache out with another thread map */
  }
}

/* ---------------------------------------------------------------- cross-entropy */

/* The largest row cache cross-entropy asks for: Hopper's most dynamic shared memory a block
   may opt in to. A device that allows less refuses the attribute, and the launcher then
   streams the row instead (the CPU emulation sets a lower bound, so that both kernels run
   in make test). */
#ifndef K_CE_ROW_CACHE_MAX_BYTES
#define K_CE_ROW_CACHE_MAX_BYTES (227 * 1024)
#endif

/* float4 chunks each thread of a block row loads at once while reading it: 4 loads in
   flight. (A warp's rows, at most 256 words, give a lane 2 chunks: it takes them one at a
   time; unrolled, its kernel spilled.) */
template <bool WARP>
constexpr int ce_unroll = WARP ? 1 : 4;

/* The largest of a pack's values (NaN skipped, as the CPU's max skips it). */
template <int W>
__device__ __forceinline__ float pack_max(const Pack<W> &v) {
  float m = v.v[0];
#pragma unroll
  for (int e = 1; e < W; e++) m = fmaxf(m, v.v[e]);
  return m;
}

/* A pack of W floats loaded from src and stored at dst as they came (a float4 copied whole
   is one 16-byte store; rebuilt from four floats, nvcc splits it, below). */
template <int W>
__device__ __forceinline__ Pack<W> copy_pack(float *dst, const float *src) {
  Pack<W> out;
  if constexpr (W == 4) {
    const float4 q = *reinterpret_cast<const float4 *>(src);
    *reinterpret_cast<float4 *>(dst) = q;
    out.v[0] = q.x, out.v[1] = q.y, out.v[2] = q.z, out.v[3] = q.w;
  } else {
    out.v[0] = *dst = *src;
  }
  return out;
}

/* A pack of W floats into shared memory at p (16-byte aligned when W = 4) as one store:
   nvcc splits a float4 made of four computed floats into 4-, 4- and 8-byte stores where it
   cannot prove the address aligned, each with bank conflicts. */
template <int W>
__device__ __forceinline__ void store_shared_pack(float *p, const Pack<W> &v) {
#if defined(__CUDA_ARCH__)
  if constexpr (W == 4) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(
                     (unsigned)__cvta_generic_to_shared(p)),
                 "f"(v.v[0]), "f"(v.v[1]), "f"(v.v[2]), "f"(v.v[3])
                 : "memory");
    return;
  }
#endif
  store_pack<W>(p, v);
}

/* The pack at j of a row of dlogits into f32 (dr: one float4 store where `vec`, dr congruent
   to the logits, else four) and/or 16 bits (hr: one 8-byte store where 8-byte aligned). */
template <bool HALF, int W>
__device__ __forceinline__ void store_dlogits(float *dr, bool vec, uint16_t *hr, int d16_dtype,
                                              int64_t j, const Pack<W> &o) {
  if (dr) {
    if (W == 1 || vec) {
      store_pack<W>(dr + j, o);
    } else {
#pragma unroll
      for (int e = 0; e < W; e++) dr[j + e] = o.v[e];
    }
  }
  if constexpr (HALF) store_half_pack<W>(hr + j, o, d16_dtype);
}

struct CrossEntropyArgs {
  float *losses, *dlogits; /* either may be NULL */
  uint16_t *d16;           /* NULL unless HALF */
  int d16_dtype;
  const float *logits;
  const int32_t *targets;
  int32_t ignore_index;
  float scale;
  int64_t rows, vocab, ld;
};

/* Losses and dlogits of vocabulary-long rows, ld elements apart, a row group a row; every
   pass walks the row with the same thread map (for_row over the logits, float4 chunks), so
   a thread reads back only what it cached itself.
   CACHE (the row fits the group's slice of shared memory): each thread copies its chunks
   into the cache with their max m_t, then replaces them by e = exp(x - m_t) as it sums them
   (one expf an element, and no barrier between the copy and the exps: a warp's exps run
   while others still load); the group's max M and sum S = sum_t s_t exp(m_t - M) follow,
   and dlogits = e * exp(m_t - M) * scale / S come from the cache. Without (block rows
   only): one streaming read finds max and sum online (the running sum rescaled once a pack
   when the max grows), and the write pass reads the row again (mostly from L2) for
   scale * exp(x - lse). */
template <bool WARP, bool HALF, bool CACHE> /* HALF: d16 is given */
__global__ void __launch_bounds__(WARP ? 32 * WARPS_PER_BLOCK : 1024) /* (row_launch's) */
    cross_entropy_kernel(const CrossEntropyArgs a) {
  static_assert(CACHE || !WARP, "a warp's rows always fit its cache");
  float *const losses = a.losses, *const dlogits = a.dlogits;
  uint16_t *const d16 = a.d16;
  const int d16_dtype = a.d16_dtype;
  const float *const logits = a.logits;
  const int32_t *const targets = a.targets;
  const int32_t ignore_index = a.ignore_index;
  const float scale = a.scale;
  const int64_t rows = a.rows, vocab = a.vocab, ld = a.ld;
  K_STATIC_SHARED(float, red, [32]);
  K_DYNAMIC_SHARED(float4, row_cache);
  const RowGroup g = row_group<WARP>();
  float *slice = CACHE ? reinterpret_cast<float *>(row_cache) + g.slot * padded_cols(vocab)
                       : nullptr;
  const bool vec_out = !dlogits || congruent(dlogits, logits);
  const bool writes = dlogits || HALF;

  for (int64_t row = g.first; row < rows; row += g.stride) {
    const int32_t target = targets[row];
    const bool ignored = target == ignore_index; /* group-uniform: so are the barriers */
    const bool known = !ignored && target >= 0 && (int64_t)target < vocab;
    const float *lr = logits + row * ld;
    float *dr = dlogits ? dlogits + row * ld : nullptr;
    uint16_t *hr = HALF ? d16 + row * ld : nullptr;
    if (ignored) {
      if (losses && g.t == 0) losses[row] = 0.0f;
      if (writes)
        for_row(lr, vocab, true, g.t, g.T, [&](auto w, int64_t j) {
          constexpr int W = decltype(w)::value;
          Pack<W> o;
#pragma unroll
          for (int e = 0; e < W; e++) o.v[e] = 0.0f;
          store_dlogits<HALF>(dr, vec_out, hr, d16_dtype, j, o);
        });
      continue;
    }
    /* Taken before any write: dlogits may be logits. */
    float target_logit = 0.0f;
    if (losses && known && g.t == 0) target_logit = lr[target];

    float lse, factor = 0.0f; /* factor: CACHE's dlogits = e * factor, this thread's e */
    float *cache = CACHE ? slice + cache_shift(lr) : nullptr;
    if constexpr (CACHE) {
      float m = -INFINITY;
      for_row<ce_unroll<WARP>>(lr, vocab, true, g.t, g.T, [&](auto w, int64_t j) {
        constexpr int W = decltype(w)::value;
        m = fmaxf(m, pack_max(copy_pack<W>(cache + j, lr + j)));
      });
      /* while this thread's values are all -inf (or NaN, or none), its exps are taken
         relative to 0: -inf gives 0, NaN NaN (it poisons the sum, as on the CPU) */
      const float base = m == -INFINITY ? 0.0f : m;
      float s = 0.0f;
      for_row(lr, vocab, true, g.t, g.T, [&](auto w, int64_t j) {
        constexpr int W = decltype(w)::value;
        Pack<W> v = load_pack<W>(cache + j);
#pragma unroll
        for (int e = 0; e < W; e++) v.v[e] = expf(v.v[e] - base), s += v.v[e];
        if (writes) store_shared_pack<W>(cache + j, v);
      });
      const float mx = group_max<WARP>(m, red);
      const float rescale = s == 0.0f ? 0.0f : expf(base - mx); /* (0 * inf would be NaN) */
      const float sum = group_sum<WARP>(s * rescale, red);
      lse = mx + logf(sum);
      factor = rescale * (scale / sum);
    } else {
      float m = -INFINITY, s = 0.0f;
      for_row<ce_unroll<WARP>>(lr, vocab, true, g.t, g.T, [&](auto w, int64_t j) {
        constexpr int W = decltype(w)::value;
        const Pack<W> v = load_pack<W>(lr + j);
        const float pm = pack_max(v);
        if (pm > m) {
          s = s * expf(m - pm); /* m = -inf at first: s is 0 and stays 0 * 0 */
          m = pm;
        }
        const float base = m == -INFINITY ? 0.0f : m; /* as the cached kernel's */
#pragma unroll
        for (int e = 0; e < W; e++) s += expf(v.v[e] - base);
      });
      const float m_all = group_max<WARP>(m, red);
      const float s_all = group_sum<WARP>(s == 0.0f ? 0.0f : s * expf(m - m_all), red);
      lse = m_all + logf(s_all);
    }
    if (losses && g.t == 0) losses[row] = known ? lse - target_logit : NAN;

    if (writes) {
      /* in place: every read of the row precedes the writes (a warp's shuffles do not order
         memory; a block's reductions end in a barrier) */
      if constexpr (!CACHE || WARP) group_sync<WARP>();
      const float *src = CACHE ? cache : lr;
      for_row(lr, vocab, true, g.t, g.T, [&](auto w, int64_t j) {
        constexpr int W = decltype(w)::value;
        Pack<W> o = load_pack<W>(src + j);
#pragma unroll
        for (int e = 0; e < W; e++) {
          float d = CACHE ? o.v[e] * factor : scale * expf(o.v[e] - lse);
          if (j + e == target) d -= scale;
          o.v[e] = d;
        }
        store_dlogits<HALF>(dr, vec_out, hr, d16_dtype, j, o);
      });
    }
    if constexpr (CACHE) group_sync<WARP>(); /* the next row lays the cache out anew */
  }
}

/* One block-row cross-entropy kernel's launch. CACHE first asks the device for the row
   cache's bytes (cudaFuncSetAttribute, needed past 48 KiB) and launches nothing where they
   are too many or refused: false. */
template <bool HALF, bool CACHE>
bool launch_cross_entropy_rows(const RowLaunch &l, size_t cache_bytes, cudaStream_t s,
                               const CrossEntropyArgs &args) {
  void (*kernel)(const CrossEntropyArgs) = cross_entropy_kernel<false, HALF, CACHE>;
  if (CACHE) {
    if (cache_bytes > (size_t)K_CE_ROW_CACHE_MAX_BYTES) return false;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)cache_bytes) != cudaSuccess) {
      (void)cudaGetLastError(); /* the refusal is no launch's error */
      return false;
    }
  }
  K_LAUNCH(l.blocks, l.threads, CACHE ? cache_bytes : 0, s, kernel)(args);
  return true;
}

/* need_losses / need_dlogits: that output is required (the unfused ops); the fused one
   writes whichever it is given. A warp's rows are cached (a block's 8 slices fit in 48 KiB:
   rows.cuh); a block's where it writes dlogits and the device gives it the bytes, else
   streamed. Losses alone always stream: their one online pass reads each logit once either
   way, and a cache would only copy it into shared memory and, at GPT-2's 50,257 words
   (201 KB a row), hold an SM to one block. */
int launch_cross_entropy(bool need_losses, bool need_dlogits, float *losses, float *dlogits,
                         void *d16, int d16_dtype, const float *logits, const int32_t *targets,
                         int32_t ignore_index, float scale, int64_t rows, int64_t vocab,
                         int64_t ld, void *stream) {
  if (rows < 0 || vocab < 0 || ld < vocab) return INVALID;
  if (rows == 0 || vocab == 0) return 0;
  if (!logits || !targets || (need_losses && !losses) || (need_dlogits && !dlogits))
    return INVALID;
  if (d16 && d16_dtype != DT_BF16 && d16_dtype != DT_F16) return INVALID;
  if (!losses && !dlogits && !d16) return 0;
  const RowLaunch l = row_launch(rows, vocab, 1, MAX_BLOCKS);
  const cudaStream_t s = (cudaStream_t)stream;
  const CrossEntropyArgs args = {losses, dlogits, static_cast<uint16_t *>(d16), d16_dtype, logits,
                                 targets, ignore_index, scale, rows, vocab, ld};
  if (l.warp_mode) {
    if (d16) K_LAUNCH(l.blocks, l.threads, l.smem, s, cross_entropy_kernel<true, true, true>)(args);
    else K_LAUNCH(l.blocks, l.threads, l.smem, s, cross_entropy_kernel<true, false, true>)(args);
    return k_launched();
  }
  const size_t cache_bytes = (size_t)padded_cols(vocab) * sizeof(float); /* (one row) */
  const bool launched = d16        ? launch_cross_entropy_rows<true, true>(l, cache_bytes, s, args)
                        : dlogits ? launch_cross_entropy_rows<false, true>(l, cache_bytes, s, args)
                                  : false;
  if (!launched) {
    if (d16) launch_cross_entropy_rows<true, false>(l, 0, s, args);
    else launch_cross_entropy_rows<false, false>(l, 0, s, args);
  }
  return k_launched();
}

} /* namespace */

/* ---------------------------------------------------------------- launchers */

extern "C" int k_softmax_forward(float *y, const float *x, const uint8_t *key_mask,
                                 int causal, float scale, int64_t samples,
                                 int64_t rows_per_sample, int64_t tq, int64_t tk,
                                 void *stream) {
  if (samples < 0 || rows_per_sample < 0 || tk < 0) return INVALID;
  const int64_t rows = samples * rows_per_sample;
  if (rows == 0 || tk == 0) return 0;
  if (!y || !x || tq < 1) return INVALID;
  const RowLaunch l = row_launch(rows, tk, 1, MAX_BLOCKS);
  cudaStream_t s = (cudaStream_t)stream;
  if (l.warp_mode)
    K_LAUNCH(l.blocks, l.threads, l.smem, s, softmax_forward_kernel<true>)(
        y, x, key_mask, causal, scale, rows, rows_per_sample, tq, tk, l.cache);
  else
    K_LAUNCH(l.blocks, l.threads, l.smem, s, softmax_forward_kernel<false>)(
        y, x, key_mask, causal, scale, rows, rows_per_sample, tq, tk, l.cache);
  return k_launched();
}

extern "C" int k_softmax_backward(float *dx, const float *dy, const float *y, float scale,
                                  int64_t rows, int64_t cols, void *stream) {
  if (rows < 0 || cols < 0) return INVALID;
  if (rows == 0 || cols == 0) return 0;
  if (!dx || !dy || !y) return INVALID;
  const RowLaunch l = row_launch(rows, cols, 2, MAX_BLOCKS);
  cudaStream_t s = (cudaStream_t)stream;
  if (l.warp_mode)
    K_LAUNCH(l.blocks, l.threads, l.smem, s, softmax_backward_kernel<true>)(dx, dy, y, scale, rows,
                                                                      cols, l.cache);
  else
    K_LAUNCH(l.blocks, l.threads, l.smem, s, softmax_backward_kernel<false>)(dx, dy, y, scale, rows,
                                                                       cols, l.cache);
  return k_launched();
}

extern "C" int k_cross_entropy_forward(float *losses, const float *logits,
                                       const int32_t *targets, int32_t ignore_index,
                                       int64_t rows, int64_t vocab, int64_t ld, void *stream) {
  return launch_cross_entropy(true, false, losses, nullptr, nullptr, 0, logits, targets,
                              ignore_index, 1.0f, rows, vocab, ld, stream);
}

extern "C" int k_cross_entropy_backward(float *dlogits, const float *logits,
                                        const int32_t *targets, int32_t ignore_index,
                                        float scale, int64_t rows, int64_t vocab, int64_t ld,
                                        void *stream) {
  return launch_cross_entropy(false, true, nullptr, dlogits, nullptr, 0, logits, targets,
                              ignore_index, scale, rows, vocab, ld, stream);
}

extern "C" int k_cross_entropy_fused(float *losses, float *dlogits, void *dlogits16,
                                     int dlogits16_dtype, const float *logits,
                                     const int32_t *targets, int32_t ignore_index,
                                     float scale, int64_t rows, int64_t vocab, int64_t ld,
                                     void *stream) {
  return launch_cross_entropy(false, false, losses, dlogits, dlogits16, dlogits16_dtype, logits,
                              targets, ignore_index, scale, rows, vocab, ld, stream);
}
