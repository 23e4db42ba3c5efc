/* SPDX-License-Identifier: MIT */
/* state_codes.c — the optimizer state in its precision, element by element: f32, bf16
 * (nearest even) or blockwise 8 bits (l2l.h, "optimizers": the codes and the layout are
 * stated there once), decoded into f32 and encoded back, a range of an array at a time;
 * and a bf16 master widened and rounded back stochastically by its Philox draws.
 *
 * Purpose: one evaluation of the compact codes on the host, which the EPS's compact update
 * (eps/quant.c) runs on a host-placed record and the CPU backend's optim_update on a
 * record placed on the device, so both placements give the same bits. 8-bit encoding is
 * the nearest code, computed from the code's rule (kernels/state_code.h, one inline
 * function for this file and the GPU's update) rather than searched for, so
 * that it vectorizes (test_quant checks it against a search in double); ties go to the
 * smaller magnitude. Where the CPU has AVX-512, 16 elements at a time by intrinsics: a
 * code's value by register permutes instead of a load each (compilers leave gathers out on
 * CPUs where they are slow), the decade by the binary exponent instead of a compare a
 * decade; the same values and codes as the plain loops (test_quant), which take the rest.
 * Must never: allocate, or read or write past the n elements asked for (the scales of an
 * array's blocks are addressed from its length).
 */
#include <math.h>
#include <pthread.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "backend.h"
#include "kernels/state_code.h"

#if defined(__AVX512F__)
/* Powers of ten, for the decades (the vector path's tables). */
static const float TEN_DOWN[8] = L2L_CODE_TEN_DOWN;
static const float TEN_UP[8] = L2L_CODE_TEN_UP;
#endif

/* Each byte's value, from the code's rule evaluated in double and rounded once. */
static float signed_value[256], root_value[256];
static pthread_once_t codes_once = PTHREAD_ONCE_INIT;

/* Magnitude index q of the code of `bits` bits: F = floor(log2 q), k = q - 2^F,
   E = bits - 1 - F: 10^-E (0.1 + 0.9 (k + 1) / 2^F), and 0 for q = 0. */
static double magnitude_of(int q, int bits) {
  if (q == 0) return 0.0;
  int f = 0;
  while ((2 << f) <= q) f++;
  return pow(10.0, -(bits - 1 - f)) * (0.1 + 0.9 * (q - (1 << f) + 1) / (double)(1 << f));
}

#if defined(__AVX512F__)
static void decades_build(void);
#endif

static void codes_build(void) {
  for (int byte = 0; byte < 256; byte++) {
    float m = (float)magnitude_of(byte & 127, 7);
    signed_value[byte] = byte & 128 ? -m : m;
    root_value[byte] = (float)magnitude_of(byte, 8);
  }
#if defined(__AVX512F__)
  decades_build();
#endif
}

const float *optim_code_values(enum optim_code code) {
  pthread_once(&codes_once, codes_build);
  return code == OPTIM_CODE_SIGNED ? signed_value : root_value;
}


#if defined(__AVX512F__)
/* The decade of a magnitude by its binary exponent (for nearest16): a binade [2^-i,
   2^(1-i)) (i = 0 .. 31; smaller values as i = 31) holds at most one power of ten (they are
   a factor 10 apart), so the decade E of y in it is DECADE_BASE[i] (the powers 10^-1 ..
   10^-7 at or above the binade's top) plus one where y is at or below the power within it
   (DECADE_EDGE[i], 0 where none): state_code_nearest's E, with no loop. */
static int32_t DECADE_BASE[32];
static float DECADE_EDGE[32];
/* Per decade E of a code of `bits` bits (index bits - 7): state_code_nearest's 2^F / 0.9
   (2^F 1/0.9f, exact: times a power of 2) and its first index less one, 2^F - 1 (F =
   bits - 1 - E; E past bits - 1 unused). */
static float DECADE_STEPS[2][8];
static int32_t DECADE_FIRST[2][8];

static void decades_build(void) {
  for (int i = 0; i < 32; i++) {
    float lo = ldexpf(1.0f, -i), hi = ldexpf(1.0f, 1 - i);
    DECADE_BASE[i] = 0, DECADE_EDGE[i] = 0.0f;
    for (int j = 1; j < 8; j++) {
      DECADE_BASE[i] += TEN_DOWN[j] >= hi || i == 31;   /* (the last: everything below too) */
      if (TEN_DOWN[j] >= lo && TEN_DOWN[j] < hi && i < 31) DECADE_EDGE[i] = TEN_DOWN[j];
    }
  }
  for (int b = 0; b < 2; b++)
    for (int e = 0; e < 8; e++) {
      int f = e <= 6 + b ? 6 + b - e : 0;
      DECADE_STEPS[b][e] = (float)(1 << f) * (1.0f / 0.9f);
      DECADE_FIRST[b][e] = (1 << f) - 1;
    }
}

/* state_code_nearest(y, bits) of 16 magnitudes y >= 0 (or NaN) at once, operation for
   operation where it rounds (this file is built without contracting products into FMAs, as
   the rule's GPU side rounds: test_quant holds the two paths equal, code by code); where
   it does not round, integer steps that give the same values: the binade from y's exponent
   bits, the decade's 2^F / 0.9 and 2^F - 1 from tables, the position's rounding and its
   clamps in one conversion and two integer bounds. */
static inline __m512i nearest16(__m512 y, int bits) {
  const __m512i top = _mm512_set1_epi32((1 << bits) - 1);
  /* a y past 2 gives the top code as 2 does (min returns its second operand, a NaN, as is),
     and keeps the position below 2^31 for the conversion */
  y = _mm512_min_ps(_mm512_set1_ps(2.0f), y);
  /* the binade's index: -floor(log2 y) = 127 less y's exponent field, clamped to [0, 31]; a
     zero or a subnormal y takes 31 (E = bits - 1), and a y of 2, an inf or a NaN 0, where
     no edge compares true: E = 0, as state_code_nearest's loop leaves them */
  __m512i field = _mm512_srli_epi32(
      _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(0x7fffffff)), 23);
  __m512i i = _mm512_sub_epi32(_mm512_set1_epi32(127), field);
  i = _mm512_min_epi32(_mm512_max_epi32(i, _mm512_setzero_si512()), _mm512_set1_epi32(31));
  __m512i base = _mm512_permutex2var_epi32(_mm512_loadu_si512(DECADE_BASE), i,
                                           _mm512_loadu_si512(DECADE_BASE + 16));
  __m512 edge = _mm512_permutex2var_ps(_mm512_loadu_ps(DECADE_EDGE), i,
                                       _mm512_loadu_ps(DECADE_EDGE + 16));
  __mmask16 at_or_below = _mm512_cmp_ps_mask(y, edge, _CMP_LE_OQ);
  __m512i e = _mm512_mask_add_epi32(base, at_or_below, base, _mm512_set1_epi32(1));
  e = _mm512_min_epi32(e, _mm512_set1_epi32(bits - 1));
  __m512 ten_e = _mm512_permutexvar_ps(e, _mm512_castps256_ps512(_mm256_loadu_ps(TEN_UP)));
  __m512 steps = _mm512_permutexvar_ps(
      e, _mm512_castps256_ps512(_mm256_loadu_ps(DECADE_STEPS[bits - 7])));
  __m512i first = _mm512_permutexvar_epi32(
      e, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)DECADE_FIRST[bits - 7])));
  __m512 position = _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(y, ten_e), _mm512_set1_ps(0.1f)),
                                  steps);
  /* ceil(position - 1/2) (ties to the smaller), within [-1, top]: a NaN converts to
     INT_MIN, which the lower bound makes -1, as the rule's clamps do */
  __m512i rounded = _mm512_cvt_roundps_epi32(_mm512_sub_ps(position, _mm512_set1_ps(0.5f)),
                                             _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
  rounded = _mm512_min_epi32(_mm512_max_epi32(rounded, _mm512_set1_epi32(-1)), top);
  __m512i q = _mm512_add_epi32(first, rounded);
  __mmask16 lowest = _mm512_cmp_ps_mask(y, _mm512_set1_ps(0.5f * TEN_DOWN[bits - 1]), _CMP_GT_OQ);
  __mmask16 last = _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(bits - 1));
  q = _mm512_mask_mov_epi32(q, last, _mm512_maskz_mov_epi32(lowest, _mm512_set1_epi32(1)));
  return _mm512_min_epi32(q, top);
}
#endif

int optim_code_nearest(enum optim_code code, float y) {
  if (code == OPTIM_CODE_SIGNED) {
    int q = state_code_nearest(fabsf(y), 7);
    return q != 0 && y < 0 ? q | 128 : q;
  }
  return state_code_nearest(y, 8);
}

/* ---------------------------------------------------------------- one array's blocks */

/* One block of at most L2L_STATE_BLOCK values x into codes and its scale. A root code
   keeps sqrt(x) (x >= 0: a negative x, or a NaN, counts as 0); its scale, the largest
   root, is the root of the largest x (a correctly rounded sqrt is monotone), so the roots
   are taken once, as each is encoded. */
static void block_encode(uint8_t *restrict q, float *scale, const float *restrict x, int64_t n,
                         enum optim_code code) {
  bool root = code == OPTIM_CODE_ROOT;
  float most = 0.0f;
  /* comparisons, not fmaxf: without -ffinite-math-only fmaxf is a call per element */
  if (root) {
#pragma omp simd reduction(max : most)
    for (int64_t i = 0; i < n; i++) most = x[i] > most ? x[i] : most;
    most = sqrtf(most);
  } else {
#pragma omp simd reduction(max : most)
    for (int64_t i = 0; i < n; i++) {
      float a = fabsf(x[i]);
      most = a > most ? a : most;
    }
  }
  *scale = most;
  if (!(most > 0.0f)) {   /* zero (or a NaN: nothing meaningful to keep) */
    memset(q, 0, (size_t)n);
    return;
  }
  /* the reciprocal's product (a quotient past 1 gives the top code); for a scale so small
     that its reciprocal is inf, the values are scaled up first (exactly: a power of 2) */
  float lift = most < 0x1p-100f ? 0x1p100f : 1.0f, inv = 1.0f / (most * lift);
  int64_t i0 = 0;
#if defined(__AVX512F__)
  const __m512 l = _mm512_set1_ps(lift), r = _mm512_set1_ps(inv);
  for (; i0 + 16 <= n; i0 += 16) {
    __m512 x16 = _mm512_loadu_ps(x + i0);
    __m512i c;
    if (root) {   /* (max with a NaN's second operand: 0) */
      x16 = _mm512_sqrt_ps(_mm512_max_ps(x16, _mm512_setzero_ps()));
      c = nearest16(_mm512_mul_ps(_mm512_mul_ps(x16, l), r), 8);
    } else {
      c = nearest16(_mm512_mul_ps(_mm512_mul_ps(_mm512_abs_ps(x16), l), r), 7);
      __mmask16 negative = _mm512_cmplt_epi32_mask(_mm512_castps_si512(x16), _mm512_setzero_si512()) &
                           _mm512_cmpneq_epi32_mask(c, _mm512_setzero_si512());
      c = _mm512_mask_or_epi32(c, negative, c, _mm512_set1_epi32(128));
    }
    _mm_storeu_si128((__m128i *)(q + i0), _mm512_cvtepi32_epi8(c));
  }
#endif
  if (root) {
#pragma omp simd
    for (int64_t i = i0; i < n; i++)
      q[i] = (uint8_t)state_code_nearest(sqrtf(x[i] > 0.0f ? x[i] : 0.0f) * lift * inv, 8);
  } else {
#pragma omp simd
    for (int64_t i = i0; i < n; i++) {
      int m = state_code_nearest(fabsf(x[i]) * lift * inv, 7);
      int negative = (int)(float_bits(x[i]) >> 31) & (m != 0);   /* zero is byte 0 */
      q[i] = (uint8_t)(m | negative << 7);
    }
  }
}

#if defined(__AVX512F__)
/* table[idx] for 16 codes at once without a gather (which compilers avoid on CPUs whose
   gathers are slow, leaving one load an element): the first 32 << levels values as groups
   of 32, each a two-register permute by the index's low 5 bits, then a tree of blends by
   its bits 5, 6 (and 7 for levels 3). The same values the table holds: the decode's bits
   do not depend on the path. */
static inline __m512 lookup16(const __m512 table[16], __m512i idx, int levels) {
  __m512 r[8];
  for (int g = 0; g < 1 << levels; g++)
    r[g] = _mm512_permutex2var_ps(table[2 * g], idx, table[2 * g + 1]);
  for (int level = 0; level < levels; level++) {
    __mmask16 odd = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32 << level));
    for (int g = 0; g < 1 << (levels - 1 - level); g++)
      r[g] = _mm512_mask_blend_ps(odd, r[2 * g], r[2 * g + 1]);
  }
  return r[0];
}
#endif

static void block_decode(float *restrict x, const uint8_t *restrict q, float scale, int64_t n,
                         enum optim_code code) {
  const float *value = code == OPTIM_CODE_ROOT ? root_value : signed_value;
  bool root = code == OPTIM_CODE_ROOT;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 table[16];
  for (int k = 0; k < 16; k++) table[k] = _mm512_loadu_ps(value + 16 * k);
  const __m512 s = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + i)));
    __m512 r;
    if (root) {
      r = lookup16(table, idx, 3);
    } else {   /* a signed byte's value is its magnitude's (the first 128) with bit 7 as its
                  sign bit: r | (idx << 24 & the sign bit) */
      r = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
          _mm512_castps_si512(lookup16(table, idx, 2)), _mm512_slli_epi32(idx, 24),
          _mm512_set1_epi32((int)0x80000000u), 0xF8));
    }
    r = _mm512_mul_ps(r, s);
    _mm512_storeu_ps(x + i, root ? _mm512_mul_ps(r, r) : r);
  }
#endif
  for (; i < n; i++) {   /* (the rest, or every element where the CPU has no AVX-512) */
    float r = value[q[i]] * scale;
    x[i] = root ? r * r : r;   /* (a root code keeps sqrt(v)) */
  }
}

void optim_state_decode(float *out, const void *array, int64_t array_n, int64_t begin, int64_t n,
                      l2l_state_precision state, enum optim_code code) {
  pthread_once(&codes_once, codes_build);
  if (state == L2L_STATE_F32) {
    memcpy(out, (const float *)array + begin, (size_t)n * sizeof(float));
  } else if (state == L2L_STATE_BF16) {
    const uint16_t *h = (const uint16_t *)array + begin;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = half_bf16_to_f32(h[i]);
  } else {
    const float *scale = optim_state_scales((void *)array, array_n) + begin / L2L_STATE_BLOCK;
    for (int64_t at = 0; at < n; at += L2L_STATE_BLOCK) {
      int64_t bn = n - at < L2L_STATE_BLOCK ? n - at : L2L_STATE_BLOCK;
      block_decode(out + at, (const uint8_t *)array + begin + at, scale[at / L2L_STATE_BLOCK], bn,
                   code);
    }
  }
}

void optim_state_encode(void *array, int64_t array_n, int64_t begin, const float *in, int64_t n,
                      l2l_state_precision state, enum optim_code code) {
  pthread_once(&codes_once, codes_build);
  if (state == L2L_STATE_F32) {
    memcpy((float *)array + begin, in, (size_t)n * sizeof(float));
  } else if (state == L2L_STATE_BF16) {
    uint16_t *h = (uint16_t *)array + begin;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) h[i] = half_from_f32_bf16(in[i]);
  } else {
    float *scale = optim_state_scales(array, array_n) + begin / L2L_STATE_BLOCK;
    for (int64_t at = 0; at < n; at += L2L_STATE_BLOCK) {
      int64_t bn = n - at < L2L_STATE_BLOCK ? n - at : L2L_STATE_BLOCK;
      block_encode((uint8_t *)array + begin + at, &scale[at / L2L_STATE_BLOCK], in + at, bn, code);
    }
    if (begin + n == array_n)   /* the padding before the scales: zero, as documented */
      memset((uint8_t *)array + array_n, 0, (size_t)((uint8_t *)optim_state_scales(array, array_n) -
                                                     ((uint8_t *)array + array_n)));
  }
}

/* ---------------------------------------------------------------- one block of an update */

void optim_block(void *p, void *s0, void *s1, int64_t n, int64_t i, int64_t k,
                 const struct optim_hyper *h, bool writes_state, bool moves_master,
                 optim_block_step step, void *ctx) {
  void *state[2] = {s0, s1};
  bool bf16_master = h->master == L2L_BF16;
  if (h->state == L2L_STATE_F32 && !bf16_master) {   /* (in place) */
    step((float *)p + i, s0 ? (float *)s0 + i : NULL, s1 ? (float *)s1 + i : NULL, i, k, ctx);
    return;
  }
  float scratch[2][L2L_STATE_BLOCK], master[L2L_STATE_BLOCK];
  uint16_t *mh = bf16_master ? (uint16_t *)p + i : NULL;
  if (mh != NULL) {   /* (bf16 widens exactly) */
#pragma omp simd
    for (int64_t j = 0; j < k; j++) master[j] = half_bf16_to_f32(mh[j]);
  }
  enum optim_code code[2] = {optim_state_code(h->kind, 0), optim_state_code(h->kind, 1)};
  for (int a = 0; a < 2; a++)
    if (state[a] != NULL) optim_state_decode(scratch[a], state[a], n, i, k, h->state, code[a]);
  step(mh != NULL ? master : (float *)p + i, s0 ? scratch[0] : NULL, s1 ? scratch[1] : NULL, i,
       k, ctx);
  for (int a = 0; writes_state && a < 2; a++)
    if (state[a] != NULL) optim_state_encode(state[a], n, i, scratch[a], k, h->state, code[a]);
  if (mh != NULL && moves_master) {
    uint16_t draws[L2L_STATE_BLOCK];
    philox_halves(draws, h->seed, h->stream, h->first_draw + (uint64_t)i, k);
#pragma omp simd
    for (int64_t j = 0; j < k; j++) mh[j] = half_bf16_stochastic(master[j], draws[j]);
  }
}
