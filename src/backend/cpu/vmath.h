/* SPDX-License-Identifier: MIT */
/* vmath.h — exp and log that the compiler vectorizes, for the CPU backend's loops.
 *
 * Purpose: glibc's expf/logf are calls GCC cannot turn into SIMD code; these inline
 * polynomial versions can, inside `omp simd` loops. Accurate to a few ulp on the ranges
 * stated, which is all the backend's softmax, GELU and dropout paths need.
 * Must never: be used where inputs can fall outside the stated ranges unchecked.
 */
#ifndef L2L_VMATH_H
#define L2L_VMATH_H

#include <stdint.h>

/* e^x for x in about [-87, 80], to ~2 ulp: Cody-Waite reduction x = n ln2 + r and a
   degree-6 polynomial for e^r (Cephes' expf coefficients), scaled by 2^n through the
   exponent bits. Inputs are clamped so that 2^n stays a normal float (no inf, no
   denormals: both slow or poison the loops that use this); callers only need e^x there. */
static inline float vexp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 80.0f ? 80.0f : x;
  float n = __builtin_rintf(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  union {
    uint32_t u;
    float f;
  } scale = {.u = (uint32_t)((int32_t)n + 127) << 23};
  return y * scale.f;
}

/* ln x for positive normal x, to ~2 ulp: x = m 2^e with m in [sqrt(1/2), sqrt(2)) and
   Cephes' logf polynomial for ln m. */
static inline float vlog(float x) {
  union {
    float f;
    uint32_t u;
  } bits = {.f = x};
  int32_t e = (int32_t)(bits.u >> 23) - 127;
  bits.u = (bits.u & 0x007fffffu) | 0x3f800000u; /* m in [1, 2) */
  float m = bits.f;
  if (m > 1.41421356f) {
    m *= 0.5f;
    e += 1;
  }
  float z = m - 1.0f, z2 = z * z;
  float p = 7.0376836292e-2f;
  p = p * z - 1.1514610310e-1f;
  p = p * z + 1.1676998740e-1f;
  p = p * z - 1.2420140846e-1f;
  p = p * z + 1.4249322787e-1f;
  p = p * z - 1.6668057665e-1f;
  p = p * z + 2.0000714765e-1f;
  p = p * z - 2.4999993993e-1f;
  p = p * z + 3.3333331174e-1f;
  return z + z * z2 * p - 0.5f * z2 + (float)e * 0.693147180559945f;
}

#endif /* L2L_VMATH_H */
