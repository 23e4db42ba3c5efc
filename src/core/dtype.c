/* SPDX-License-Identifier: MIT */
/* dtype.c — element types: sizes, names, scalar 16-bit float conversions.
 *
 * Purpose: the public names for the type table and the scalar conversions of core.h's
 * half floats.
 * Must never: hold conversion logic of its own (core.h's inline functions are the one copy).
 */
#include "core.h"

size_t l2l_dtype_size(l2l_dtype dtype) {
  switch (dtype) {
    case L2L_F32: return 4;
    case L2L_F16: return 2;
    case L2L_BF16: return 2;
    case L2L_I32: return 4;
    case L2L_U8: return 1;
  }
  return 0;
}

const char *l2l_dtype_name(l2l_dtype dtype) {
  switch (dtype) {
    case L2L_F32: return "f32";
    case L2L_F16: return "f16";
    case L2L_BF16: return "bf16";
    case L2L_I32: return "i32";
    case L2L_U8: return "u8";
  }
  return NULL;
}

uint16_t l2l_f32_to_bf16(float x) { return half_from_f32_bf16(x); }
float l2l_bf16_to_f32(uint16_t x) { return (float)core_plain_nan(half_bf16_to_f32(x)); }
uint16_t l2l_f32_to_f16(float x) { return half_from_f32_f16(x); }
float l2l_f16_to_f32(uint16_t x) { return (float)core_plain_nan(half_f16_to_f32(x)); }
