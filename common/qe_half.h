/* qe_half: exact IEEE 754 binary16 <-> binary32 conversions, header-only (static inline).
 *   - qe_half_to_f32 is exact for every half (subnormals, +-0, +-inf; NaN stays NaN with its
 *     payload in the top mantissa bits);
 *   - qe_f32_to_half rounds to nearest, ties to even, with half subnormals; values from 65520
 *     up round to inf; NaN stays a (quiet) NaN with its sign.
 * Pure functions of their argument: thread-safe, no state, no libm. */
#ifndef QE_HALF_H
#define QE_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

static inline float qe__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint32_t qe__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float qe_half_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return qe__bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return qe__bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return qe__bits_f32(sign);
  uint32_t e = 113; /* subnormal: mant * 2^-24, normalized into a float */
  while (!(mant & 0x400u)) mant <<= 1, e--;
  return qe__bits_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

/* |f| < 2^-14 (a float exponent field <= 112): round |f| / 2^-24 to an integer, ties to even. */
static inline uint16_t qe__half_subnormal(uint32_t ax) {
  uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
  if (e < 102) return 0; /* below 2^-25: rounds to zero */
  uint32_t shift = 126 - e, q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  return (uint16_t)(q + (rem > half || (rem == half && (q & 1u))));
}

static inline uint16_t qe_f32_to_half(float f) {
  uint32_t x = qe__f32_bits(f), ax = x & 0x7fffffffu;
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: inf */
  if (ax < 0x38800000u) return (uint16_t)(sign | qe__half_subnormal(ax));
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u); /* ties to even; carries into the exponent */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* f[i] = qe_half_to_f32(h[i]) for i < n, eight at a time by the F16C instruction where the
 * build targets it: the same values for every half but a signalling NaN, which comes out
 * quiet. */
static inline void qe_half_to_f32_n(const uint16_t *h, float *f, size_t n) {
  size_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
  for (; i < n; i++) f[i] = qe_half_to_f32(h[i]);
}

/* fp32 -> bf16 bits, rounded to nearest even (as CUDA's __float2bfloat16); NaN stays a quiet
 * NaN. */
static inline uint16_t qe_f32_to_bf16(float f) {
  uint32_t u = qe__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* bf16 bits -> fp32 (exact). */
static inline float qe_bf16_to_f32(uint16_t h) { return qe__bits_f32((uint32_t)h << 16); }

#endif
