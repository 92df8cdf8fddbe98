/* kv_quant: the reference (CPU) quantization of KV windows, see kv_quant.h for the contract.
 *
 * A group is a strided run of fp32 elements sharing one fp16 scale s and zero z; with
 * L = 2^bits - 1, codes are c = clamp(rint((x - z) / s), 0, L) in fp32 and the reconstruction
 * is c * s + z in fp32 (c * s is exact, so an FMA gives the same bits).
 *
 * Inputs are first sanitized: NaN reads as 0, values beyond the fp16 range (and +-inf)
 * saturate to +-65504, the largest fp16. The error bound holds against the sanitized value.
 *
 * The rule R(mn, mx) picks z = the largest fp16 <= mn and s = the smallest fp16 >= 2^-14 whose
 * top reconstruction fl(L * s + z) >= mx, so the group's range is covered and every element is
 * within s/2 of its reconstruction (up to fp32 rounding).
 *
 * Idempotence. A pair (z, s) is a *fixed point* for a group if: the extremes meet the error
 * bound (then every element does), every reconstruction y maps back to its own code, and
 * R(min y, max y) == (z, s). Re-quantizing dequantized data then starts from R(y) = (z, s),
 * which is a fixed point for y as well, so it reproduces (z, s) and the codes exactly. The
 * quantizer uses R(mn, mx) when it is a fixed point (the usual case) and otherwise searches a
 * few zeros around mn and the scales for which the top code is L (or one slightly wider), in
 * increasing order, for a fixed point. If none exists, R(mn, mx) is kept: the s/2 bound still
 * holds but a re-quantization may choose another (z, s). R fails to be a fixed point chiefly
 * when the minimum sits within s/2 below the next fp16 above z and takes a code > 0 (a range
 * small against the fp16 spacing there): re-quantizing then rounds its reconstruction down to
 * that next fp16 rather than to z. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kv_quant.h"
#include "qe_half.h"
#include "qe_status.h"

#define KV_HMAX     0x7bffu /* 65504 */
#define KV_HTINY    0x0001u /* 2^-24, the smallest positive fp16 */
#define KV_HMINS    0x0400u /* 2^-14, the smallest normal fp16: the smallest scale */
#define KV_SEARCH_S 1024    /* scale candidates tried per zero in the fallback search */

/* One group: x[base + i * stride] for i < n. */
typedef struct {
  const float *x;
  size_t base, stride;
  int n;
} kv__grp_t;

int kv_qparams_check(const kv_qparams_t *p, int head_dim) {
  if (!p) return qe_errf(QE_EINVAL, "kv_quant: no parameters");
  if (p->bits != 2 && p->bits != 4 && p->bits != 8)
    return qe_errf(QE_EINVAL, "kv_quant: bits must be 2, 4 or 8 (got %d)", p->bits);
  if (head_dim < 1) return qe_errf(QE_EINVAL, "kv_quant: head_dim must be >= 1 (got %d)", head_dim);
  if (p->key_frame < KV_KEY_FRAME_POS || p->key_frame > KV_KEY_FRAME_ABS)
    return qe_errf(QE_EINVAL,
                   "kv_quant: key_frame must be 0 (pre-RoPE), 1 (window) or 2 (post-RoPE) (got %d)",
                   p->key_frame);
  if (p->group < 1 || head_dim % p->group != 0)
    return qe_errf(QE_EINVAL, "kv_quant: group must be >= 1 and divide head_dim %d (got %d)",
                   head_dim, p->group);
  return 0;
}

kv_qsizes_t kv_qsizes(const kv_qparams_t *p, int omega, int n_kv, int head_dim) {
  size_t n = (size_t)omega * (size_t)n_kv * (size_t)head_dim;
  size_t groups = p->group > 0 ? (size_t)(head_dim / p->group) : 0;
  kv_qsizes_t z;
  z.k_codes = (n * (size_t)p->bits + 7) / 8;
  z.k_meta = 4 * (size_t)n_kv * (size_t)head_dim;
  z.v_codes = z.k_codes;
  z.v_meta = 4 * (size_t)omega * (size_t)n_kv * groups;
  return z;
}

/* ---- elementwise arithmetic (the exact definitions both directions share) ---- */

static inline float kv__san(float x) {
  if (x != x) return 0.0f;
  return x < -65504.0f ? -65504.0f : x > 65504.0f ? 65504.0f : x;
}

static inline float kv__u(float x, float z, float s) { return rintf((x - z) / s); }

static inline int kv__code(float x, float z, float s, int L) {
  float u = kv__u(x, z, s);
  return u <= 0.0f ? 0 : u >= (float)L ? L : (int)u;
}

static inline float kv__recon(int c, float z, float s) { return (float)c * s + z; }

static inline float kv__at(const kv__grp_t *g, int i) {
  return kv__san(g->x[g->base + (size_t)i * g->stride]);
}

/* ---- fp16 ordering (finite values only) ---- */

static inline double kv__h(uint16_t h) { return (double)qe_half_to_f32(h); }

static uint16_t kv__hup(uint16_t h) {
  if ((h & 0x7fffu) == 0) return KV_HTINY;
  if (h & 0x8000u) return h == 0x8001u ? 0 : (uint16_t)(h - 1);
  return (uint16_t)(h + 1);
}

static uint16_t kv__hdown(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x8001u;
  return (h & 0x8000u) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}

static int kv__hfinite(uint16_t h) { return (h & 0x7fffu) <= KV_HMAX; }

/* Largest fp16 <= v, for v in [-65504, 65504]; zero is +0. */
static uint16_t kv__hfloor(double v) {
  uint16_t h = qe_f32_to_half((float)v);
  if ((h & 0x7fffu) > KV_HMAX) h = (uint16_t)((h & 0x8000u) | KV_HMAX);
  while (kv__h(h) > v) h = kv__hdown(h);
  while (h != KV_HMAX && kv__h(kv__hup(h)) <= v) h = kv__hup(h);
  return (h & 0x7fffu) == 0 ? 0 : h;
}

/* Smallest positive fp16 >= v (at least 2^-24; at most 65504). */
static uint16_t kv__hceil_pos(double v) {
  if (!(v > kv__h(KV_HTINY))) return KV_HTINY;
  if (v >= 65504.0) return KV_HMAX;
  uint16_t h = qe_f32_to_half((float)v);
  while (h > KV_HTINY && kv__h(h - 1) >= v) h--;
  while (kv__h(h) < v) h++;
  return h;
}

/* ---- the rule R and the fixed-point test ---- */

/* Smallest fp16 s >= 2^-14 whose top reconstruction fl(L * s + z) >= mx. Coverage is judged
 * in the fp32 arithmetic of the reconstruction itself (monotone in s), so when the top code is
 * used, the cover of the reconstructed group is the same s again. Scales are never subnormal:
 * with a subnormal s (coarse relative steps) the top code may be below L, and the cover of the
 * reconstruction then shrinks; the floor costs at most 2^-15 (3e-5) of absolute error. */
static uint16_t kv__cover(uint16_t zh, float mx, int L) {
  float z = qe_half_to_f32(zh);
  uint16_t s = kv__hceil_pos(((double)mx - z) / L);
  s = s < KV_HMINS ? KV_HMINS : s;
  while (s < KV_HMAX && kv__recon(L, z, qe_half_to_f32(s)) < mx) s++;
  while (s > KV_HMINS && kv__recon(L, z, qe_half_to_f32((uint16_t)(s - 1))) >= mx) s--;
  return s;
}

/* The rule R: z = the largest fp16 <= mn, s = its cover. */
static void kv__rule(float mn, float mx, int L, uint16_t *zh, uint16_t *sh) {
  *zh = kv__hfloor(mn);
  *sh = kv__cover(*zh, mx, L);
}

static void kv__minmax(const kv__grp_t *g, float *mn, float *mx) {
  float lo = kv__at(g, 0), hi = lo;
  for (int i = 1; i < g->n; i++) {
    float x = kv__at(g, i);
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  *mn = lo;
  *mx = hi;
}

/* The error bound: |x - y| <= s/2 + half an fp32 ulp of y (a clamped code can only land this
 * far off when the rounded top reconstruction covers x). */
static int kv__within(float x, float y, float s) {
  float ay = fabsf(y);
  return fabs((double)x - y) <= 0.5 * s + 0.5 * ((double)nextafterf(ay, INFINITY) - ay);
}

/* Is (z, s) a fixed point for values x (only the values matter, not their order)? */
static int kv__is_fixed_vals(const float *xs, int n, int L, uint16_t zh, uint16_t sh) {
  float z = qe_half_to_f32(zh), s = qe_half_to_f32(sh), ylo = 0, yhi = 0;
  for (int i = 0; i < n; i++) {
    int c = kv__code(xs[i], z, s, L);
    float y = kv__san(kv__recon(c, z, s));
    if (!kv__within(xs[i], y, s) || kv__code(y, z, s, L) != c) return 0;
    ylo = (i == 0 || y < ylo) ? y : ylo;
    yhi = (i == 0 || y > yhi) ? y : yhi;
  }
  uint16_t z2, s2;
  kv__rule(ylo, yhi, L, &z2, &s2);
  return z2 == zh && s2 == sh;
}

/* Every reconstruction maps back to its code when fp32 resolves s well at the group's magnitude
 * M: the rounding of c * s + z and of (y - z) / s then move the code by < 0.1 (so < 0.5). */
static int kv__trip_exact(float z, float s, int L) {
  double m = fmax(fabs((double)z), fabs((double)z + (double)L * s));
  return m <= 65504.0 && ldexp(s, 20) >= m;
}

/* The group's fixed-point test. Codes and reconstructions are monotone, so the extremes
 * decide the error bound and R(min y, max y) (cheap, checked first); then every element's
 * round trip, unless it is exact for this (z, s). */
static int kv__is_fixed(const kv__grp_t *g, float mn, float mx, int L, uint16_t zh, uint16_t sh) {
  float ends[2] = {mn, mx};
  if (!kv__is_fixed_vals(ends, 2, L, zh, sh)) return 0;
  float z = qe_half_to_f32(zh), s = qe_half_to_f32(sh);
  if (kv__trip_exact(z, s, L)) return 1;
  for (int i = 0; i < g->n; i++) {
    int c = kv__code(kv__at(g, i), z, s, L);
    if (kv__code(kv__san(kv__recon(c, z, s)), z, s, L) != c) return 0;
  }
  return 1;
}

/* kv__is_fixed for (z, s) = R(mn, mx) itself, with a shortcut for the usual case: when mn
 * takes code 0 and mx code L, the reconstruction's extremes are z and fl(L*s + z) >= mx, whose
 * R is (z, s) again (s - 1 does not cover mx, so it does not cover fl(L*s + z) either). */
static int kv__rule_is_fixed(const kv__grp_t *g, float mn, float mx, int L, uint16_t zh,
                             uint16_t sh) {
  float z = qe_half_to_f32(zh), s = qe_half_to_f32(sh);
  if (kv__code(mn, z, s, L) == 0 && kv__code(mx, z, s, L) == L && kv__trip_exact(z, s, L)) return 1;
  return kv__is_fixed(g, mn, mx, L, zh, sh);
}

/* Scales for zero z in increasing order from the s/2-bound minimum: those with top code L
 * (s <= (mx - z) / (L - 1/2)) and a few beyond. 1 and *sh set on finding a fixed point. */
static int kv__search_scales(const kv__grp_t *g, float mn, float mx, int L, uint16_t zh,
                             uint16_t *sh) {
  double z = kv__h(zh), w = (double)mx - z;
  double lo = fmax(w / (L + 0.5), 2.0 * (z - mn)), hi = w / (L - 0.5);
  uint16_t s = kv__hceil_pos(lo);
  s = s < KV_HMINS ? KV_HMINS : s;
  for (int k = 0, extra = 0; k < KV_SEARCH_S && s <= KV_HMAX && extra < 4; k++, s++) {
    if (kv__h(s) > hi) extra++;
    if (kv__is_fixed(g, mn, mx, L, zh, s)) {
      *sh = s;
      return 1;
    }
  }
  return 0;
}

/* Fallback when R(mn, mx) is not a fixed point: zeros floor(mn), the next fp16 up, two down. */
static int kv__search(const kv__grp_t *g, float mn, float mx, int L, uint16_t *zh, uint16_t *sh) {
  uint16_t z0 = kv__hfloor(mn), zs[4] = {z0, kv__hup(z0), kv__hdown(z0), 0};
  zs[3] = kv__hdown(zs[2]);
  for (int i = 0; i < 4; i++) {
    if (!kv__hfinite(zs[i]) || (i == 1 && z0 == KV_HMAX)) continue;
    if (kv__search_scales(g, mn, mx, L, zs[i], sh)) {
      *zh = zs[i];
      return 1;
    }
  }
  return 0;
}

/* Chooses (z, s) for one group and ORs its codes into the zeroed packed buffer. */
static void kv__quant_group(const kv__grp_t *g, int bits, uint8_t *codes, uint16_t *scale,
                            uint16_t *zero) {
  int L = (1 << bits) - 1, per = 8 / bits;
  float mn, mx;
  kv__minmax(g, &mn, &mx);
  uint16_t zh, sh;
  kv__rule(mn, mx, L, &zh, &sh);
  if (!kv__rule_is_fixed(g, mn, mx, L, zh, sh) && !kv__search(g, mn, mx, L, &zh, &sh))
    kv__rule(mn, mx, L, &zh, &sh); /* no fixed point: keep R (the s/2 bound still holds) */
  float z = qe_half_to_f32(zh), s = qe_half_to_f32(sh);
  for (int i = 0; i < g->n; i++) {
    size_t e = g->base + (size_t)i * g->stride;
    codes[e / per] |= (uint8_t)(kv__code(kv__at(g, i), z, s, L) << ((e % per) * bits));
  }
  *scale = sh;
  *zero = zh;
}

void kv_quant_keys(const kv_qparams_t *p, const float *k, int omega, int n_kv, int hd,
                   uint8_t *codes, uint16_t *scale, uint16_t *zero) {
  size_t row = (size_t)n_kv * hd;
  memset(codes, 0, ((size_t)omega * row * p->bits + 7) / 8);
  for (size_t j = 0; j < row; j++) {
    kv__grp_t g = {k, j, row, omega};
    kv__quant_group(&g, p->bits, codes, &scale[j], &zero[j]);
  }
}

void kv_quant_values(const kv_qparams_t *p, const float *v, int omega, int n_kv, int hd,
                     uint8_t *codes, uint16_t *scale, uint16_t *zero) {
  size_t n = (size_t)omega * n_kv * hd, ng = n / p->group;
  memset(codes, 0, (n * p->bits + 7) / 8);
  for (size_t j = 0; j < ng; j++) {
    kv__grp_t g = {v, j * p->group, 1, p->group};
    kv__quant_group(&g, p->bits, codes, &scale[j], &zero[j]);
  }
}

/* x[base + i * stride] = code * s + z for the n elements of one group (the general path). */
static void kv__dequant_group(int bits, const uint8_t *codes, uint16_t sh, uint16_t zh, size_t base,
                              size_t stride, int n, float *x) {
  float s = qe_half_to_f32(sh), z = qe_half_to_f32(zh);
  for (int i = 0; i < n; i++) {
    size_t e = base + (size_t)i * stride;
    x[e] = kv__recon((int)kv_code_at(codes, e, bits), z, s);
  }
}

/* The four 2-bit codes of each byte value as floats, code 0 first. */
static float kv__lut2[256][4];

static void kv__lut2_init(void) {
  for (int b = 0; b < 256; b++)
    for (int u = 0; u < 4; u++) kv__lut2[b][u] = (float)((b >> (2 * u)) & 3);
}

static void kv__lut2_ready(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, kv__lut2_init);
}

typedef int32_t kv__i32x8 __attribute__((vector_size(32)));
typedef float kv__f32x8 __attribute__((vector_size(32), aligned(4)));

static inline kv__f32x8 kv__ld8(const float *p) {
  kv__f32x8 v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline kv__f32x8 kv__bc8(float f) { return (kv__f32x8){f, f, f, f, f, f, f, f}; }

/* x[0..16) = c * s + z for the sixteen 2-bit codes of the four bytes at b (codes 0..7 with
 * s_lo, z_lo; 8..15 with s_hi, z_hi): each code shifted out of the word in its lane. c * s is
 * exact, so the one rounding of the sum is kv__recon's. */
static inline void kv__dq16(const uint8_t *b, kv__f32x8 s_lo, kv__f32x8 z_lo, kv__f32x8 s_hi,
                            kv__f32x8 z_hi, float *x) {
  const kv__i32x8 shift = {0, 2, 4, 6, 8, 10, 12, 14};
  uint32_t w;
  memcpy(&w, b, sizeof w);
  kv__i32x8 v = (kv__i32x8){1, 1, 1, 1, 1, 1, 1, 1} * (int32_t)(w & 0xffffu);
  kv__i32x8 u = (kv__i32x8){1, 1, 1, 1, 1, 1, 1, 1} * (int32_t)(w >> 16);
  kv__f32x8 lo = __builtin_convertvector((v >> shift) & 3, kv__f32x8) * s_lo + z_lo;
  kv__f32x8 hi = __builtin_convertvector((u >> shift) & 3, kv__f32x8) * s_hi + z_hi;
  memcpy(x, &lo, sizeof lo);
  memcpy(x + 8, &hi, sizeof hi);
}

/* kv__dequant_run's 2-bit codes sixteen at a time (n % 16 == 0). */
static void kv__dequant_run2v(const uint8_t *b, int n, const float *restrict s,
                              const float *restrict z, int ss, float *restrict x) {
  kv__f32x8 s8 = kv__bc8(s[0]), z8 = kv__bc8(z[0]);
  for (int t = 0; t < n; t += 16) {
    if (ss)
      kv__dq16(b + t / 4, kv__ld8(s + t), kv__ld8(z + t), kv__ld8(s + t + 8), kv__ld8(z + t + 8),
               x + t);
    else
      kv__dq16(b + t / 4, s8, z8, s8, z8, x + t);
  }
}

/* x[t] = code(e0 + t) * s[t * ss] + z[t * ss] for t < n (e0 and n multiples of the codes a
 * byte holds): the same values as kv__dequant_group's. 2-bit codes come from a table of floats,
 * four a byte (no narrow store read back wide: 0.34 against 0.42 ns an element through a byte
 * table, 1.97 element by element, one core of the 2026-12-02 VM). */
static void kv__dequant_run(int bits, const uint8_t *codes, size_t e0, int n,
                            const float *restrict s, const float *restrict z, int ss,
                            float *restrict x) {
  const uint8_t *b = codes + e0 * (size_t)bits / 8;
  if (bits == 2 && n % 16 == 0) {
    kv__dequant_run2v(b, n, s, z, ss, x);
    return;
  }
  if (bits == 2) { /* the table is filled: kv__lut2_ready by the callers */
    for (int t = 0; t < n / 4; t++) {
      const float *c = kv__lut2[b[t]];
      for (int u = 0; u < 4; u++) {
        int i = 4 * t + u;
        x[i] = c[u] * s[i * ss] + z[i * ss]; /* kv__recon's expression */
      }
    }
    return;
  }
  for (int t = 0; t < n; t++) {
    int c = bits == 8 ? b[t] : (b[t / 2] >> (4 * (t & 1))) & 15;
    x[t] = kv__recon(c, z[t * ss], s[t * ss]);
  }
}

/* Channels a pass of kv_dequant_keys converts the scales of. */
#define KV_DQ_CH 256

void kv_dequant_keys_ref(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                         const uint16_t *zero, int omega, int n_kv, int hd, float *k) {
  size_t row = (size_t)n_kv * hd;
  for (size_t j = 0; j < row; j++)
    kv__dequant_group(p->bits, codes, scale[j], zero[j], j, row, omega, k);
}

void kv_dequant_values_ref(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                           const uint16_t *zero, int omega, int n_kv, int hd, float *v) {
  size_t ng = (size_t)omega * n_kv * hd / p->group;
  for (size_t j = 0; j < ng; j++)
    kv__dequant_group(p->bits, codes, scale[j], zero[j], j * p->group, 1, p->group, v);
}

void kv_dequant_keys(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                     const uint16_t *zero, int omega, int n_kv, int hd, float *k) {
  size_t row = (size_t)n_kv * hd;
  const int per = 8 / p->bits;
  if (row % (size_t)per) { /* codes of a channel not byte-aligned across tokens */
    kv_dequant_keys_ref(p, codes, scale, zero, omega, n_kv, hd, k);
    return;
  }
  kv__lut2_ready();
  for (size_t j0 = 0; j0 < row; j0 += KV_DQ_CH) { /* a token's channels, in runs of bytes */
    int nc = row - j0 < KV_DQ_CH ? (int)(row - j0) : KV_DQ_CH;
    float s[KV_DQ_CH], z[KV_DQ_CH];
    qe_half_to_f32_n(scale + j0, s, (size_t)nc);
    qe_half_to_f32_n(zero + j0, z, (size_t)nc);
    for (int i = 0; i < omega; i++)
      kv__dequant_run(p->bits, codes, (size_t)i * row + j0, nc, s, z, 1, k + (size_t)i * row + j0);
  }
}

void kv_dequant_values(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                       const uint16_t *zero, int omega, int n_kv, int hd, float *v) {
  size_t ng = (size_t)omega * n_kv * hd / p->group;
  if (p->group % (8 / p->bits)) { /* groups not byte-aligned */
    kv_dequant_values_ref(p, codes, scale, zero, omega, n_kv, hd, v);
    return;
  }
  kv__lut2_ready();
  for (size_t j = 0; j < ng; j++) {
    float s = qe_half_to_f32(scale[j]), z = qe_half_to_f32(zero[j]);
    kv__dequant_run(p->bits, codes, j * p->group, p->group, &s, &z, 0, v + j * p->group);
  }
}

/* Whether kv_dequant_*_head can take sixteen 2-bit codes at a time: every token's channels
 * [c0, c0 + nc) start on a byte and span a multiple of 16 codes, inside one value group at a
 * time (group a multiple of 16). */
static int kv__head_fast(const kv_qparams_t *p, int n_kv, int hd, int c0, int nc) {
  return p->bits == 2 && n_kv * hd % 4 == 0 && hd % 16 == 0 && c0 % 16 == 0 && nc % 16 == 0 &&
         p->group % 16 == 0;
}

void kv_dequant_keys_head(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                          const uint16_t *zero, int n, int n_kv, int hd, int h, int c0, int nc,
                          float *k) {
  size_t row = (size_t)n_kv * hd, j0 = (size_t)h * hd + c0;
  float s[KV_DQ_CH], z[KV_DQ_CH];
  if (!kv__head_fast(p, n_kv, hd, c0, nc) || nc > KV_DQ_CH) {
    for (int i = 0; i < n; i++)
      for (int j = 0; j < nc; j++)
        k[(size_t)i * nc + j] =
            kv__recon((int)kv_code_at(codes, (size_t)i * row + j0 + j, p->bits),
                      qe_half_to_f32(zero[j0 + j]), qe_half_to_f32(scale[j0 + j]));
    return;
  }
  qe_half_to_f32_n(scale + j0, s, (size_t)nc);
  qe_half_to_f32_n(zero + j0, z, (size_t)nc);
  for (int i = 0; i < n; i++) {
    const uint8_t *b = codes + ((size_t)i * row + j0) / 4;
    for (int c = 0; c < nc; c += 16)
      kv__dq16(b + c / 4, kv__ld8(s + c), kv__ld8(z + c), kv__ld8(s + c + 8), kv__ld8(z + c + 8),
               k + (size_t)i * nc + c);
  }
}

/* Value scales and zeros kv_dequant_values_head converts in one pass, all heads' (more: the
 * head's own, a token at a time). */
#define KV_DQ_VMETA 1024

/* The scale and zero of value group m: from the converted arrays, or converted now. */
static inline void kv__vmeta(const float *sa, const float *za, const uint16_t *scale,
                             const uint16_t *zero, size_t m, float *s, float *z) {
  *s = sa ? sa[m] : qe_half_to_f32(scale[m]);
  *z = za ? za[m] : qe_half_to_f32(zero[m]);
}

void kv_dequant_values_head(const kv_qparams_t *p, const uint8_t *codes, const uint16_t *scale,
                            const uint16_t *zero, int n, int n_kv, int hd, int h, int c0, int nc,
                            float *v) {
  size_t row = (size_t)n_kv * hd, gph = (size_t)(hd / p->group), nm = (size_t)n * n_kv * gph;
  int fast = kv__head_fast(p, n_kv, hd, c0, nc), batch = nm <= KV_DQ_VMETA;
  float sb[KV_DQ_VMETA], zb[KV_DQ_VMETA], sf, zf;
  if (batch) qe_half_to_f32_n(scale, sb, nm), qe_half_to_f32_n(zero, zb, nm);
  const float *sa = batch ? sb : NULL, *za = batch ? zb : NULL;
  for (int i = 0; i < n; i++) {
    size_t e0 = (size_t)i * row + (size_t)h * hd, m0 = ((size_t)i * n_kv + h) * gph;
    float *x = v + (size_t)i * nc; /* channel c at x[c - c0] */
    for (int c = c0; fast && c < c0 + nc; c += 16) {
      kv__vmeta(sa, za, scale, zero, m0 + (size_t)c / p->group, &sf, &zf);
      kv__dq16(codes + (e0 + c) / 4, kv__bc8(sf), kv__bc8(zf), kv__bc8(sf), kv__bc8(zf),
               x + (c - c0));
    }
    for (int c = c0; !fast && c < c0 + nc; c++) {
      kv__vmeta(sa, za, scale, zero, m0 + (size_t)c / p->group, &sf, &zf);
      x[c - c0] = kv__recon((int)kv_code_at(codes, e0 + c, p->bits), zf, sf);
    }
  }
}
