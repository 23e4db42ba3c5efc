/* half.h — f32 <-> bf16 / f16 conversion, round to nearest even, as inline functions.
 *
 * Purpose: exact conversions (what cross mixed precision's 16-bit device copies rely on),
 * done with integer arithmetic so the result never depends on the compiler's or the CPU's
 * rounding mode; inline so cast loops vectorize. The one copy of this logic in l2l.
 * Must never: flush subnormals or turn NaN into a number.
 */
#ifndef L2L_HALF_H
#define L2L_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static inline uint16_t half_from_f32_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry out of
     the mantissa correctly bumps the exponent (up to infinity). */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float half_bf16_to_f32(uint16_t x) { return bits_float((uint32_t)x << 16); }

/* Rounds `value >> shift` to nearest, ties to even (shift >= 1). */
static inline uint32_t shift_round_even(uint32_t value, int shift) {
  uint32_t kept = value >> shift;
  uint32_t rest = value & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1u))) kept++;
  return kept;
}

static inline uint16_t half_from_f32_f16(float x) {
  uint32_t u = float_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (a >= 0x477ff000u) return sign | 0x7c00u;  /* >= 65520 rounds past 65504: infinity */
  if (a >= 0x38800000u) {                        /* normal f16: rebias exponent by 127-15 */
    return sign | (uint16_t)shift_round_even(a - 0x38000000u, 13);
  }
  /* Subnormal f16 (units of 2^-24), or zero: the f32 significand m * 2^(e-150) is
     m * 2^(e-126) units, i.e. m shifted right by 126-e. */
  int e = (int)(a >> 23);
  if (e < 102) return sign;                      /* below 2^-25: rounds to zero */
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  return sign | (uint16_t)shift_round_even(m, 126 - e);
}

static inline float half_f16_to_f32(uint16_t x) {
  uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
  uint32_t e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
  if (e == 0) {
    float magnitude = (float)m * 0x1p-24f;       /* exact: m < 2^10 */
    return sign ? -magnitude : magnitude;
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

#endif /* L2L_HALF_H */
