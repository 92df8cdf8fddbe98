/* gguf_quant: the tensor-type table (block sizes, bytes per block), exact fp16/bf16
 * conversions, and dequantization to fp32 of the ggml block formats qevict supports:
 * F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K. The block layouts and the order of
 * the fp32 operations follow ggml's reference (dequantize_row_*) so results are bit-exact
 * with it. Plain scalar loops: a model load dequantizes ~1e8 weights, which this does in
 * well under a second. Assumes a little-endian host (checked at compile time). */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "gguf.h"
#include "qe_half.h"
#include "qe_status.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_quant.c assumes a little-endian host"
#endif

#define QK_K 256 /* elements per K-quant super-block */

typedef struct {
  const char *name;
  int block;          /* elements per block */
  size_t block_bytes; /* bytes per block */
} gguf__type_info_t;

/* Indexed by ggml type number; entries with block == 0 are unsupported. */
static const gguf__type_info_t gguf__types[GGUF_T_BF16 + 1] = {
    [GGUF_T_F32] = {"F32", 1, 4},
    [GGUF_T_F16] = {"F16", 1, 2},
    [GGUF_T_Q4_0] = {"Q4_0", 32, 2 + 16},
    [GGUF_T_Q4_1] = {"Q4_1", 32, 2 + 2 + 16},
    [GGUF_T_Q8_0] = {"Q8_0", 32, 2 + 32},
    [GGUF_T_Q4_K] = {"Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2},
    [GGUF_T_Q5_K] = {"Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2},
    [GGUF_T_Q6_K] = {"Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2},
    [GGUF_T_BF16] = {"BF16", 1, 2},
};

static const gguf__type_info_t *gguf__type(int type) {
  if (type < 0 || type > GGUF_T_BF16 || gguf__types[type].block == 0) return NULL;
  return &gguf__types[type];
}

const char *gguf_type_name(int type) {
  const gguf__type_info_t *t = gguf__type(type);
  return t ? t->name : "?";
}

int gguf_type_block(int type) {
  const gguf__type_info_t *t = gguf__type(type);
  return t ? t->block : 0;
}

size_t gguf_type_block_bytes(int type) {
  const gguf__type_info_t *t = gguf__type(type);
  return t ? t->block_bytes : 0;
}

size_t gguf_type_nbytes(int type, int64_t n) {
  const gguf__type_info_t *t = gguf__type(type);
  if (!t || n < 0 || n % t->block != 0) return 0;
  uint64_t nb = (uint64_t)n / (uint64_t)t->block;
  if (nb > SIZE_MAX / t->block_bytes) return 0;
  return (size_t)nb * t->block_bytes;
}

/* ---- fp16 / bf16 ------------------------------------------------------------------------ */

/* fp16 and bf16 conversions are common/qe_half.h's (exact, round-to-nearest-even). */
static inline float gguf__fp16_f32(uint16_t h) { return qe_half_to_f32(h); }
float qe_fp16_to_f32(uint16_t h) { return qe_half_to_f32(h); }
uint16_t qe_f32_to_fp16(float f) { return qe_f32_to_half(f); }

/* ---- dequantization --------------------------------------------------------------------- */

static inline uint16_t gguf__u16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

static inline float gguf__h(const uint8_t *p) { return gguf__fp16_f32(gguf__u16(p)); }

static void gguf__deq_f16(const uint8_t *s, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = gguf__h(s + 2 * i);
}

static void gguf__deq_bf16(const uint8_t *s, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)gguf__u16(s + 2 * i) << 16;
    memcpy(&y[i], &u, 4);
  }
}

/* Q4_0 block: d (fp16), qs[16]; low nibbles are elements 0..15, high nibbles 16..31. */
static void gguf__deq_q4_0(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
    float d = gguf__h(b);
    for (int j = 0; j < 16; j++) {
      y[j] = (float)((b[2 + j] & 0x0f) - 8) * d;
      y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
  }
}

/* Q4_1 block: d, m (fp16), qs[16]; y = q*d + m. */
static void gguf__deq_q4_1(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
    float d = gguf__h(b), m = gguf__h(b + 2);
    for (int j = 0; j < 16; j++) {
      y[j] = (float)(b[4 + j] & 0x0f) * d + m;
      y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
  }
}

/* Q8_0 block: d (fp16), qs[32] (int8). */
static void gguf__deq_q8_0(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
    float d = gguf__h(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
  }
}

/* 6-bit scale and min j (0..7) from the 12 packed bytes of a Q4_K/Q5_K super-block:
 * j < 4: low 6 bits of q[j] (scale) and q[j+4] (min); j >= 4: low/high nibble of q[j+4]
 * plus the top 2 bits of q[j-4] (scale) / q[j] (min) as bits 4..5. */
static void gguf__scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/* Q4_K super-block: d, dmin (fp16), scales[12], qs[128]. Each 64-element group j uses
 * sub-blocks 2j (low nibbles of 32 bytes) and 2j+1 (high nibbles of the same bytes). */
static void gguf__deq_q4_k(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 144) {
    float d = gguf__h(b), dmin = gguf__h(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int is = 0; is < 8; is += 2, q += 32) {
      uint8_t sc, m;
      gguf__scale_min_k4(is, scales, &sc, &m);
      float d1 = d * sc, m1 = dmin * m;
      gguf__scale_min_k4(is + 1, scales, &sc, &m);
      float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
    }
  }
}

/* Q5_K super-block: d, dmin (fp16), scales[12], qh[32], qs[128]. Like Q4_K with a fifth
 * bit per element from qh: bit 2j (low-nibble half) and 2j+1 (high-nibble half) of qh[l]. */
static void gguf__deq_q5_k(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 176) {
    float d = gguf__h(b), dmin = gguf__h(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      gguf__scale_min_k4(is, scales, &sc, &m);
      float d1 = d * sc, m1 = dmin * m;
      gguf__scale_min_k4(is + 1, scales, &sc, &m);
      float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

/* Q6_K super-block: ql[128], qh[64], scales[16] (int8), d (fp16). Two halves of 128
 * elements; in each, element l+32k (k = 0..3) takes a nibble of ql and 2 bits of qh[l], and
 * the scale of its 16-element group. y = (d*scale)*q as in ggml. */
static void gguf__deq_q6_k(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 210) {
    float d = gguf__h(b + 208), ds[16];
    for (int k = 0; k < 16; k++) ds[k] = d * (float)(int8_t)b[192 + k];
    const uint8_t *ql = b, *qh = b + 128;
    for (int n = 0; n < 2; n++, y += 128, ql += 64, qh += 32) {
      const float *s = ds + 8 * n;
      for (int l = 0; l < 32; l++) {
        int is = l / 16;
        y[l] = s[is] * (float)(((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32);
        y[l + 32] = s[is + 2] * (float)(((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
        y[l + 64] = s[is + 4] * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        y[l + 96] = s[is + 6] * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
  }
}

int gguf_dequant(int type, const void *src, float *dst, int64_t n) {
  const gguf__type_info_t *t = gguf__type(type);
  if (!t) return qe_errf(QE_EUNSUPPORTED, "gguf: cannot dequantize tensor type %d", type);
  if (n < 0 || n % t->block != 0)
    return qe_errf(QE_EINVAL, "gguf: dequantize %s: %lld elements is not a multiple of %d", t->name,
                   (long long)n, t->block);
  const uint8_t *s = src;
  int64_t nb = n / t->block;
  switch (type) {
  case GGUF_T_F32:
    memcpy(dst, s, (size_t)n * 4);
    break;
  case GGUF_T_F16:
    gguf__deq_f16(s, dst, n);
    break;
  case GGUF_T_BF16:
    gguf__deq_bf16(s, dst, n);
    break;
  case GGUF_T_Q4_0:
    gguf__deq_q4_0(s, dst, nb);
    break;
  case GGUF_T_Q4_1:
    gguf__deq_q4_1(s, dst, nb);
    break;
  case GGUF_T_Q8_0:
    gguf__deq_q8_0(s, dst, nb);
    break;
  case GGUF_T_Q4_K:
    gguf__deq_q4_k(s, dst, nb);
    break;
  case GGUF_T_Q5_K:
    gguf__deq_q5_k(s, dst, nb);
    break;
  case GGUF_T_Q6_K:
    gguf__deq_q6_k(s, dst, nb);
    break;
  }
  return 0;
}

int gguf_type_has_blocks32(int type) {
  return type == GGUF_T_Q4_0 || type == GGUF_T_Q4_1 || type == GGUF_T_Q8_0 || type == GGUF_T_Q4_K ||
         type == GGUF_T_Q5_K;
}

/* Q4_0, Q4_1, Q8_0: one block of 32 at b (codes as gguf__deq_* reads them). */
static void gguf__b32_simple(int type, const uint8_t *b, int8_t *c, float *s, float *o) {
  *s = gguf__h(b);
  *o = type == GGUF_T_Q4_1 ? gguf__h(b + 2) : 0.0f;
  if (type == GGUF_T_Q8_0) {
    for (int j = 0; j < 32; j++) c[j] = (int8_t)b[2 + j];
    return;
  }
  const uint8_t *q = b + (type == GGUF_T_Q4_1 ? 4 : 2);
  int z = type == GGUF_T_Q4_0 ? 8 : 0;
  for (int j = 0; j < 16; j++)
    c[j] = (int8_t)((q[j] & 0x0f) - z), c[j + 16] = (int8_t)((q[j] >> 4) - z);
}

/* Q4_K / Q5_K: the 8 sub-blocks of one super-block at b (as gguf__deq_q4_k / _q5_k). */
static void gguf__b32_k(int type, const uint8_t *b, int8_t *c, float *s, float *o) {
  float d = gguf__h(b), dmin = gguf__h(b + 2);
  const uint8_t *scales = b + 4, *qh = b + 16, *q = type == GGUF_T_Q5_K ? b + 48 : b + 16;
  for (int is = 0; is < 8; is++) {
    uint8_t sc, mn;
    gguf__scale_min_k4(is, scales, &sc, &mn);
    s[is] = d * sc, o[is] = -(dmin * mn);
    const uint8_t *ql = q + 32 * (is / 2), hbit = (uint8_t)(1u << is);
    for (int l = 0; l < 32; l++) {
      int v = is & 1 ? ql[l] >> 4 : ql[l] & 0x0f;
      if (type == GGUF_T_Q5_K && (qh[l] & hbit)) v += 16;
      c[32 * is + l] = (int8_t)v;
    }
  }
}

int gguf_blocks32(int type, const void *src, int64_t n, int8_t *code, float *scale, float *offset) {
  if (!gguf_type_has_blocks32(type))
    return qe_errf(QE_EUNSUPPORTED, "gguf: %s has no blocks of 32", gguf_type_name(type));
  const gguf__type_info_t *t = gguf__type(type);
  if (n < 0 || n % t->block != 0)
    return qe_errf(QE_EINVAL, "gguf: blocks of %s: %lld elements is not a multiple of %d", t->name,
                   (long long)n, t->block);
  const uint8_t *b = src;
  for (int64_t i = 0; i < n / t->block; i++, b += t->block_bytes) {
    int64_t e = i * t->block;
    if (t->block == 32)
      gguf__b32_simple(type, b, code + e, scale + e / 32, offset + e / 32);
    else
      gguf__b32_k(type, b, code + e, scale + e / 32, offset + e / 32);
  }
  return 0;
}
