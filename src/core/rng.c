/* SPDX-License-Identifier: MIT */
/* rng.c — Philox4x32-10, the counter-based generator behind every random number in l2l.
 *
 * Purpose: make each draw a pure function of (seed, stream, index), so that splitting a
 * batch into micro-batches, recomputing a layer, or running on another backend yields the
 * very same numbers. Layout: draw `index` is word index%4 of the block with counter
 * (index/4 as 64 bits, stream as 64 bits) under key = seed; 16-bit draw `index` is the low
 * (index even) or high (odd) half of draw index/2.
 * Must never: keep hidden state between calls.
 */
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core.h"

enum {
  PHILOX_M0 = 0xD2511F53u,
  PHILOX_M1 = 0xCD9E8D57u,
  PHILOX_W0 = 0x9E3779B9u,
  PHILOX_W1 = 0xBB67AE85u,
};

static void philox_block(uint32_t *out4, const uint32_t *counter4, const uint32_t *key2) {
  uint32_t c0 = counter4[0], c1 = counter4[1], c2 = counter4[2], c3 = counter4[3];
  uint32_t k0 = key2[0], k1 = key2[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out4[0] = c0, out4[1] = c1, out4[2] = c2, out4[3] = c3;
}

l2l_status l2l_philox4x32(uint32_t *out4, const uint32_t *counter4, const uint32_t *key2) {
  if (out4 == NULL || counter4 == NULL || key2 == NULL)
    return FAIL(L2L_ERR_INVALID, "out4, counter4 and key2 must not be NULL");
  philox_block(out4, counter4, key2);
  return L2L_OK;
}

void philox_draws(uint32_t *out4, uint64_t seed, uint64_t stream, uint64_t block) {
  uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                         (uint32_t)(stream >> 32)};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  philox_block(out4, counter, key);
}

/* LANES consecutive blocks at once, one per SIMD lane: the same rounds as philox_block.
   words[4 l + w] is word w of block first_block + l. (64: four vectors of 16 whose rounds
   interleave, since one vector's rounds wait on each other's products.) */
enum { LANES = 64, GROUPS = LANES / 16 };

#if defined(__AVX512F__)
/* The 32 x 32 -> 64-bit products of 16 lanes by m: even lanes by one vpmuludq, odd lanes
   (shifted down) by another, their low and high halves put back in lane order. (Written
   over arrays GCC used vpmullq, a 64 x 64 product several times slower.) */
static inline void mul_lanes(__m512i c, __m512i m, __m512i *lo, __m512i *hi) {
  __m512i even = _mm512_mul_epu32(c, m), odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

static void philox_lanes(uint32_t *words, uint64_t first_block, uint64_t stream, uint64_t seed) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i one = _mm512_set1_epi32(1), m0 = _mm512_set1_epi64(PHILOX_M0),
                m1 = _mm512_set1_epi64(PHILOX_M1);
  __m512i c0[GROUPS], c1[GROUPS], c2[GROUPS], c3[GROUPS];
  for (int v = 0; v < GROUPS; v++) {   /* group v: blocks first_block + 16 v + lane */
    uint64_t first = first_block + 16 * (uint64_t)v;
    const __m512i base = _mm512_set1_epi32((int)(uint32_t)first);
    const __m512i high = _mm512_set1_epi32((int)(uint32_t)(first >> 32));
    c0[v] = _mm512_add_epi32(base, lane);   /* the block's low word; a carry where it wrapped */
    c1[v] = _mm512_mask_add_epi32(high, _mm512_cmplt_epu32_mask(c0[v], base), high, one);
    c2[v] = _mm512_set1_epi32((int)(uint32_t)stream);
    c3[v] = _mm512_set1_epi32((int)(uint32_t)(stream >> 32));
  }
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    const __m512i key0 = _mm512_set1_epi32((int)k0), key1 = _mm512_set1_epi32((int)k1);
    for (int v = 0; v < GROUPS; v++) {
      __m512i lo0, hi0, lo1, hi1;
      mul_lanes(c0[v], m0, &lo0, &hi0);
      mul_lanes(c2[v], m1, &lo1, &hi1);
      c0[v] = _mm512_ternarylogic_epi32(hi1, c1[v], key0, 0x96);   /* (0x96: a ^ b ^ c) */
      c2[v] = _mm512_ternarylogic_epi32(hi0, c3[v], key1, 0x96);
      c1[v] = lo1, c3[v] = lo0;
    }
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  for (int v = 0; v < GROUPS; v++) {
    /* blocks' words interleaved: a 4 x 4 transpose of 32-bit words, then of 128-bit lanes */
    __m512i t0 = _mm512_unpacklo_epi32(c0[v], c1[v]), t1 = _mm512_unpackhi_epi32(c0[v], c1[v]);
    __m512i t2 = _mm512_unpacklo_epi32(c2[v], c3[v]), t3 = _mm512_unpackhi_epi32(c2[v], c3[v]);
    __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    __m512i w0 = _mm512_shuffle_i32x4(u0, u1, 0x44), w1 = _mm512_shuffle_i32x4(u2, u3, 0x44);
    __m512i w2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), w3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
    uint32_t *out = words + 64 * v;
    _mm512_storeu_si512(out, _mm512_shuffle_i32x4(w0, w1, 0x88));
    _mm512_storeu_si512(out + 16, _mm512_shuffle_i32x4(w0, w1, 0xDD));
    _mm512_storeu_si512(out + 32, _mm512_shuffle_i32x4(w2, w3, 0x88));
    _mm512_storeu_si512(out + 48, _mm512_shuffle_i32x4(w2, w3, 0xDD));
  }
}
#elif defined(__AVX2__)
/* AVX2's 8 lanes, as AVX-512's 16 above: the even lanes' products by one vpmuludq, the odd
   lanes' (shifted down) by another, put back in lane order by blends (GCC's loop below
   moves the halves across the register's 128-bit lanes instead, at several times the cost). */
static inline void mul_lanes(__m256i c, __m256i m, __m256i *lo, __m256i *hi) {
  __m256i even = _mm256_mul_epu32(c, m), odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

/* Two groups of 8 blocks at a time (their rounds interleave; four would not fit AVX2's 16
   registers), words[4 l + w] as above. */
static void philox_lanes(uint32_t *words, uint64_t first_block, uint64_t stream, uint64_t seed) {
  enum { INTERLEAVED = 2 };
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
  const __m256i m0 = _mm256_set1_epi64x(PHILOX_M0), m1 = _mm256_set1_epi64x(PHILOX_M1);
  for (int g = 0; g < LANES / 8; g += INTERLEAVED) {
    __m256i c0[INTERLEAVED], c1[INTERLEAVED], c2[INTERLEAVED], c3[INTERLEAVED];
    for (int v = 0; v < INTERLEAVED; v++) {   /* blocks first_block + 8 (g + v) + lane */
      uint64_t first = first_block + 8 * (uint64_t)(g + v);
      const __m256i base = _mm256_set1_epi32((int)(uint32_t)first);
      const __m256i high = _mm256_set1_epi32((int)(uint32_t)(first >> 32));
      c0[v] = _mm256_add_epi32(base, lane);
      /* the carry where the low word wrapped (c0 < base, unsigned: signed after flipping
         the sign bits), -1 in those lanes */
      __m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(base, sign),
                                           _mm256_xor_si256(c0[v], sign));
      c1[v] = _mm256_sub_epi32(high, wrapped);
      c2[v] = _mm256_set1_epi32((int)(uint32_t)stream);
      c3[v] = _mm256_set1_epi32((int)(uint32_t)(stream >> 32));
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
      const __m256i key0 = _mm256_set1_epi32((int)k0), key1 = _mm256_set1_epi32((int)k1);
      for (int v = 0; v < INTERLEAVED; v++) {
        __m256i lo0, hi0, lo1, hi1;
        mul_lanes(c0[v], m0, &lo0, &hi0);
        mul_lanes(c2[v], m1, &lo1, &hi1);
        c0[v] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[v]), key0);
        c2[v] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[v]), key1);
        c1[v] = lo1, c3[v] = lo0;
      }
      k0 += PHILOX_W0;
      k1 += PHILOX_W1;
    }
    for (int v = 0; v < INTERLEAVED; v++) {
      /* a 4 x 4 transpose of 32-bit words within each 128-bit half (blocks l and l + 4),
         then the halves paired in block order */
      __m256i t0 = _mm256_unpacklo_epi32(c0[v], c1[v]), t1 = _mm256_unpackhi_epi32(c0[v], c1[v]);
      __m256i t2 = _mm256_unpacklo_epi32(c2[v], c3[v]), t3 = _mm256_unpackhi_epi32(c2[v], c3[v]);
      __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
      __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
      uint32_t *out = words + 32 * (g + v);
      _mm256_storeu_si256((__m256i *)out, _mm256_permute2x128_si256(u0, u1, 0x20));
      _mm256_storeu_si256((__m256i *)(out + 8), _mm256_permute2x128_si256(u2, u3, 0x20));
      _mm256_storeu_si256((__m256i *)(out + 16), _mm256_permute2x128_si256(u0, u1, 0x31));
      _mm256_storeu_si256((__m256i *)(out + 24), _mm256_permute2x128_si256(u2, u3, 0x31));
    }
  }
}
#else
static void philox_lanes(uint32_t *words, uint64_t first_block, uint64_t stream, uint64_t seed) {
  uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int l = 0; l < LANES; l++) {
    uint64_t block = first_block + (uint64_t)l;
    c0[l] = (uint32_t)block, c1[l] = (uint32_t)(block >> 32);
    c2[l] = (uint32_t)stream, c3[l] = (uint32_t)(stream >> 32);
  }
  for (int round = 0; round < 10; round++) {
#pragma omp simd
    for (int l = 0; l < LANES; l++) {
      uint64_t p0 = (uint64_t)PHILOX_M0 * c0[l];
      uint64_t p1 = (uint64_t)PHILOX_M1 * c2[l];
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
      uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = (uint32_t)p1, c3[l] = (uint32_t)p0;
      c0[l] = n0, c2[l] = n2;
    }
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  for (int l = 0; l < LANES; l++)
    words[4 * l] = c0[l], words[4 * l + 1] = c1[l], words[4 * l + 2] = c2[l],
    words[4 * l + 3] = c3[l];
}
#endif

void philox_range(uint32_t *out, uint64_t seed, uint64_t stream, uint64_t first, int64_t n) {
  uint32_t words[4 * LANES];
  uint64_t block = first >> 2;
  int64_t skip = (int64_t)(first & 3), done = 0;
  while (done < n) {
    int64_t take = 4 * LANES - skip < n - done ? 4 * LANES - skip : n - done;
    if (take == 4 * LANES) {   /* whole blocks: straight into out */
      philox_lanes(out + done, block, stream, seed);
    } else {
      philox_lanes(words, block, stream, seed);
      memcpy(out + done, words + skip, (size_t)take * sizeof *out);
    }
    done += take;
    block += LANES;
    skip = 0;
  }
}

void philox_halves(uint16_t *out, uint64_t seed, uint64_t stream, uint64_t first, int64_t n) {
  enum { WORDS = 4 * LANES };   /* a pass's draws: one philox_lanes, LANES blocks */
  uint32_t words[WORDS];
  uint64_t block = first >> 3;   /* (8 16-bit draws a block) */
  int64_t skip = (int64_t)(first & 7);   /* 16-bit draws of the block before first */
  for (int64_t done = 0; done < n; block += LANES, skip = 0) {
    int64_t take = 2 * WORDS - skip < n - done ? 2 * WORDS - skip : n - done;
    philox_lanes(words, block, stream, seed);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__   /* (the halves in memory order: low first) */
    memcpy(out + done, (const uint16_t *)words + skip, (size_t)take * sizeof *out);
#else
    for (int64_t j = 0; j < take; j++) {
      int64_t h = skip + j;
      out[done + j] = (uint16_t)(words[h >> 1] >> (16 * (h & 1)));
    }
#endif
    done += take;
  }
}
