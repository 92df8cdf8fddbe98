/* test_kv_quant: the reference KV quantizer (cache/kv_quant.h) and the fp16 helpers it uses
 * (common/qe_half.h): exact fp16 conversions; parameter checks and sizes; every element within
 * scale/2 of its reconstruction on random windows of many shapes; quantize -> dequantize ->
 * quantize reproducing codes, scales and zeros bit for bit (three rounds), on random data and on
 * adversarial groups (constant, two-valued, tiny and huge ranges, fp16 grid neighbourhoods,
 * saturation, NaN/inf); and the packed code layout that kv_code_at reads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_quant.h"
#include "qe_half.h"
#include "qe_status.h"
#include "test_util.h"

/* ---- fp16 conversions ---- */

static int is_nan_half(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }

/* h is the fp16 nearest to f (ties to even), judged in double against both neighbours. */
static int is_nearest_half(float f, uint16_t h) {
  double d = fabs((double)qe_half_to_f32(h) - f);
  uint16_t nb[2] = {(uint16_t)(h + 1), (uint16_t)(h - 1)};
  for (int i = 0; i < 2; i++) {
    if ((nb[i] & 0x7fffu) > 0x7c00u || ((h ^ nb[i]) & 0x8000u)) continue;
    double dn = fabs((double)qe_half_to_f32(nb[i]) - f);
    if (dn < d || (dn == d && (h & 1u))) return 0;
  }
  return 1;
}

static void test_half_roundtrip(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000u; h++) {
    float f = qe_half_to_f32((uint16_t)h);
    uint16_t back = qe_f32_to_half(f);
    if (is_nan_half((uint16_t)h) ? !isnan(f) || !is_nan_half(back) : back != h) bad++;
  }
  CHECK(bad == 0);
  CHECK(qe_half_to_f32(0x0001) == ldexpf(1, -24));
  CHECK(qe_half_to_f32(0x03ff) == ldexpf(1023, -24));
  CHECK(qe_half_to_f32(0x0400) == ldexpf(1, -14));
  CHECK(qe_half_to_f32(0x7bff) == 65504.0f);
  CHECK(qe_half_to_f32(0x3c00) == 1.0f && qe_half_to_f32(0xc000) == -2.0f);
  CHECK(isinf(qe_half_to_f32(0x7c00)) && qe_half_to_f32(0xfc00) < 0);
  CHECK(signbit(qe_half_to_f32(0x8000)) && qe_half_to_f32(0x8000) == 0);
}

/* qe_half_to_f32_n (F16C where built for it) gives qe_half_to_f32's bits for every half but
 * NaNs (a NaN stays a NaN), at every offset and length around the vector width. */
static void test_half_batch(void) {
  uint16_t *h = malloc(2 * 0x10010u);
  float *f = malloc(4 * 0x10010u);
  int bad = 0;
  for (uint32_t i = 0; i < 0x10010u; i++) h[i] = (uint16_t)i;
  for (int off = 0; off < 9; off++) {
    size_t n = 0x10000u - (size_t)off * 3;
    qe_half_to_f32_n(h + off, f, n);
    for (size_t i = 0; i < n; i++) {
      float want = qe_half_to_f32(h[off + i]);
      bad += isnan(want) ? !isnan(f[i]) : memcmp(&want, &f[i], 4) != 0;
    }
  }
  free(h), free(f);
  CHECK(bad == 0);
}

/* Midpoints between neighbouring halves tie to even; one fp32 ulp either side rounds away. */
static void test_half_ties(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 0x7bffu; h++) {
    for (int sg = 0; sg < 2; sg++) {
      uint16_t a = (uint16_t)(h | (sg ? 0x8000u : 0)), b = (uint16_t)(a + 1);
      float m = (float)(((double)qe_half_to_f32(a) + qe_half_to_f32(b)) / 2);
      uint16_t even = (a & 1u) ? b : a;
      if (qe_f32_to_half(m) != even) bad++;
      if (qe_f32_to_half(nextafterf(m, qe_half_to_f32(a))) != a) bad++;
      if (qe_f32_to_half(nextafterf(m, qe_half_to_f32(b))) != b) bad++;
    }
  }
  CHECK(bad == 0);
  CHECK(qe_f32_to_half(65519.996f) == 0x7bff && qe_f32_to_half(65520.0f) == 0x7c00);
  CHECK(qe_f32_to_half(-1e9f) == 0xfc00 && qe_f32_to_half(INFINITY) == 0x7c00);
  CHECK(is_nan_half(qe_f32_to_half(NAN)));
  CHECK(qe_f32_to_half(ldexpf(1, -25)) == 0 && qe_f32_to_half(ldexpf(3, -25)) == 2);
  CHECK(qe_f32_to_half(nextafterf(ldexpf(1, -25), 1)) == 1);
  CHECK(qe_f32_to_half(-ldexpf(1, -26)) == 0x8000 && qe_f32_to_half(1e-40f) == 0);
}

static void test_half_random(void) {
  uint64_t st = 42;
  int bad = 0;
  for (int i = 0; i < 200000; i++) {
    float f = ldexpf(tu_randf(&st, -1, 1), (int)tu_randf(&st, -30, 17));
    uint16_t h = qe_f32_to_half(f);
    if (fabsf(f) >= 65520.0f ? (h & 0x7fffu) != 0x7c00u : !is_nearest_half(f, h)) bad++;
  }
  CHECK(bad == 0);
}

/* ---- parameters and sizes ---- */

static void test_params(void) {
  kv_qparams_t ok = {2, 32, 0};
  CHECK_OK(kv_qparams_check(&ok, 128));
  kv_qparams_t b3 = {3, 32, 0}, b0 = {0, 32, 0}, b16 = {16, 32, 0};
  CHECK(kv_qparams_check(&b3, 128) == QE_EINVAL && strstr(qe_errmsg(), "bits"));
  CHECK(kv_qparams_check(&b0, 128) == QE_EINVAL && strstr(qe_errmsg(), "bits"));
  CHECK(kv_qparams_check(&b16, 128) == QE_EINVAL && strstr(qe_errmsg(), "bits"));
  kv_qparams_t g0 = {4, 0, 0}, g3 = {4, 3, 0}, g256 = {8, 256, 0}, gneg = {8, -8, 0};
  CHECK(kv_qparams_check(&g0, 128) == QE_EINVAL && strstr(qe_errmsg(), "group"));
  CHECK(kv_qparams_check(&g3, 128) == QE_EINVAL && strstr(qe_errmsg(), "group"));
  CHECK(kv_qparams_check(&g256, 128) == QE_EINVAL && strstr(qe_errmsg(), "group"));
  CHECK(kv_qparams_check(&gneg, 64) == QE_EINVAL && strstr(qe_errmsg(), "group"));
  CHECK(kv_qparams_check(&ok, 0) == QE_EINVAL);
  CHECK(kv_qparams_check(NULL, 128) == QE_EINVAL);
  kv_qparams_t f3 = {2, 32, 3}, fn = {2, 32, -1}, fw = {2, 32, KV_KEY_FRAME_WINDOW};
  kv_qparams_t fa = {2, 32, KV_KEY_FRAME_ABS};
  CHECK(kv_qparams_check(&f3, 128) == QE_EINVAL && strstr(qe_errmsg(), "key_frame"));
  CHECK(kv_qparams_check(&fn, 128) == QE_EINVAL && strstr(qe_errmsg(), "key_frame"));
  CHECK_OK(kv_qparams_check(&fw, 128));
  CHECK_OK(kv_qparams_check(&fa, 128));
  kv_qparams_t g1 = {8, 1, 0}, ghd = {4, 96, 0};
  CHECK_OK(kv_qparams_check(&g1, 7));
  CHECK_OK(kv_qparams_check(&ghd, 96));
}

static void test_sizes(void) {
  kv_qparams_t p2 = {2, 32, 0}, p4 = {4, 8, 0}, p8 = {8, 64, 0}, odd = {2, 5, 0};
  kv_qsizes_t a = kv_qsizes(&p2, 8, 4, 128);
  CHECK(a.k_codes == 8 * 4 * 128 / 4 && a.v_codes == a.k_codes);
  CHECK(a.k_meta == 4 * 4 * 128 && a.v_meta == 4 * 8 * 4 * 4);
  kv_qsizes_t b = kv_qsizes(&p4, 16, 2, 64);
  CHECK(b.k_codes == 16 * 2 * 64 / 2 && b.v_meta == 4 * 16 * 2 * 8 && b.k_meta == 4 * 2 * 64);
  kv_qsizes_t c = kv_qsizes(&p8, 8, 1, 64);
  CHECK(c.k_codes == 8 * 64 && c.v_codes == 8 * 64 && c.v_meta == 4 * 8);
  kv_qsizes_t d = kv_qsizes(&odd, 3, 1, 5); /* 15 elements * 2 bits = 30 bits -> 4 bytes */
  CHECK(d.k_codes == 4 && d.v_codes == 4 && d.k_meta == 20 && d.v_meta == 12);
  kv_qparams_t p4g1 = {4, 1, 0};
  kv_qsizes_t e = kv_qsizes(&p4g1, 1, 1, 7); /* 7 * 4 bits = 28 bits -> 4 bytes */
  CHECK(e.k_codes == 4 && e.k_meta == 28 && e.v_meta == 28);
}

/* ---- a quantized window and its checks ---- */

typedef struct {
  kv_qparams_t p;
  int omega, n_kv, hd, keys; /* keys: per-channel groups; else per-token channel groups */
  size_t n, n_groups, gsize;
  float *x, *y;
  uint8_t *codes;
  uint16_t *scale, *zero;
} win_t;

static void win_init(win_t *w, int bits, int group, int omega, int n_kv, int hd, int keys) {
  memset(w, 0, sizeof *w);
  w->p = (kv_qparams_t){bits, group, 0};
  w->omega = omega, w->n_kv = n_kv, w->hd = hd, w->keys = keys;
  w->n = (size_t)omega * n_kv * hd;
  w->n_groups = keys ? (size_t)n_kv * hd : w->n / group;
  w->gsize = keys ? (size_t)omega : (size_t)group;
  w->x = calloc(w->n, sizeof *w->x);
  w->y = calloc(w->n, sizeof *w->y);
  w->codes = calloc(w->n + 1, 1);
  w->scale = calloc(w->n_groups, sizeof *w->scale);
  w->zero = calloc(w->n_groups, sizeof *w->zero);
}

static void win_free(win_t *w) {
  free(w->x), free(w->y), free(w->codes), free(w->scale), free(w->zero);
}

/* Element i of group j, as an index into the [omega][n_kv][hd] window. */
static size_t win_elem(const win_t *w, size_t j, size_t i) {
  return w->keys ? i * (size_t)w->n_kv * w->hd + j : j * w->gsize + i;
}

static void win_quant(win_t *w, const float *in) {
  if (w->keys)
    kv_quant_keys(&w->p, in, w->omega, w->n_kv, w->hd, w->codes, w->scale, w->zero);
  else
    kv_quant_values(&w->p, in, w->omega, w->n_kv, w->hd, w->codes, w->scale, w->zero);
}

static void win_dequant(win_t *w) {
  if (w->keys)
    kv_dequant_keys(&w->p, w->codes, w->scale, w->zero, w->omega, w->n_kv, w->hd, w->y);
  else
    kv_dequant_values(&w->p, w->codes, w->scale, w->zero, w->omega, w->n_kv, w->hd, w->y);
}

static float san(float x) {
  if (isnan(x)) return 0;
  return x < -65504.0f ? -65504.0f : x > 65504.0f ? 65504.0f : x;
}

/* |x - y| <= s/2, up to fp32 rounding of the code computation and of the reconstruction. */
static int within(float x, float y, float s, float z) {
  x = san(x);
  double ulp = (double)nextafterf(fabsf(y), INFINITY) - fabsf(y);
  double tol = 0.5 * s + 0.5 * ulp + ldexp(fabs(x) + fabs(z), -22);
  return fabs((double)x - y) <= tol;
}

/* fp16 spacing at x (the gap to the next fp16 away from zero). */
static float half_ulp(float x) {
  uint16_t h = qe_f32_to_half(fabsf(x));
  return h >= 0x7bff ? 32.0f : qe_half_to_f32((uint16_t)(h + 1)) - qe_half_to_f32(h);
}

/* Checks every group of a fresh quantization: the error bound; the reconstruction is exactly
 * code * s + z; s >= 2^-14 and not much above what the range needs (the fallback may move z one
 * or two fp16 steps and widen s slightly). Counts in *plain the groups where z <= min and
 * fl(L*s + z) >= max (the rule R's choice; the others are fixed points found by the search). */
static int win_check(const win_t *w, int *plain) {
  int L = (1 << w->p.bits) - 1, bad = 0;
  for (size_t j = 0; j < w->n_groups; j++) {
    float s = qe_half_to_f32(w->scale[j]), z = qe_half_to_f32(w->zero[j]), mn = INFINITY,
          mx = -INFINITY;
    for (size_t i = 0; i < w->gsize; i++) {
      size_t e = win_elem(w, j, i);
      unsigned c = kv_code_at(w->codes, e, w->p.bits);
      if (!within(w->x[e], w->y[e], s, z) || w->y[e] != (float)c * s + z) bad++;
      mn = fminf(mn, san(w->x[e])), mx = fmaxf(mx, san(w->x[e]));
    }
    double need = ((double)mx - mn + 4.0 * half_ulp(mn)) / (L - 0.5) * 1.01;
    if (!(s >= ldexpf(1, -14) && isfinite(s) && isfinite(z))) bad++;
    if (s > fmax(ldexp(1.01, -14), need)) bad++;
    if (plain) *plain += z <= mn && (float)L * s + z >= mx;
  }
  return bad;
}

/* quantize -> dequantize -> quantize, `rounds` times: identical codes, scales and zeros. */
static int win_idempotent(win_t *w, int rounds) {
  size_t nb = (w->n * w->p.bits + 7) / 8, ms = w->n_groups * sizeof(uint16_t);
  uint8_t *c0 = malloc(nb);
  uint16_t *s0 = malloc(ms), *z0 = malloc(ms);
  float *y0 = malloc(w->n * sizeof *y0);
  memcpy(c0, w->codes, nb), memcpy(s0, w->scale, ms), memcpy(z0, w->zero, ms);
  memcpy(y0, w->y, w->n * sizeof *y0);
  int bad = 0;
  for (int r = 0; r < rounds; r++) {
    memcpy(w->x, w->y, w->n * sizeof *w->x);
    win_quant(w, w->x);
    win_dequant(w);
    bad += memcmp(c0, w->codes, nb) || memcmp(s0, w->scale, ms) || memcmp(z0, w->zero, ms) ||
           memcmp(y0, w->y, w->n * sizeof *y0);
  }
  free(c0), free(s0), free(z0), free(y0);
  return bad;
}

/* Keys-like data: per-channel offsets (some large "outlier" channels) plus noise. */
static void fill_random(win_t *w, uint64_t *st) {
  size_t row = (size_t)w->n_kv * w->hd;
  for (size_t j = 0; j < row; j++) {
    float off = tu_randf(st, -2, 2) * (j % 7 == 0 ? 20.0f : 1.0f);
    float amp = ldexpf(1, (int)tu_randf(st, -6, 4));
    for (int t = 0; t < w->omega; t++) w->x[t * row + j] = off + amp * tu_randf(st, -1, 1);
  }
}

static void test_random_shapes(void) {
  static const int omegas[] = {4, 8, 16, 32}, hds[] = {8, 64, 128}, groups[] = {8, 32, 64};
  uint64_t st = 7;
  int bad_err = 0, bad_idem = 0, n_win = 0, plain = 0, n_groups = 0;
  for (int b = 2; b <= 8; b *= 2)
    for (int oi = 0; oi < 4; oi++)
      for (int n_kv = 1; n_kv <= 4; n_kv++)
        for (int hi = 0; hi < 3; hi++)
          for (int gi = 0; gi < 3; gi++) {
            if (hds[hi] % groups[gi] != 0) continue;
            for (int keys = 0; keys < 2; keys++) {
              if (keys && gi > 0) continue; /* the group size only matters for values */
              win_t w;
              win_init(&w, b, groups[gi], omegas[oi], n_kv, hds[hi], keys);
              fill_random(&w, &st);
              win_quant(&w, w.x);
              win_dequant(&w);
              bad_err += win_check(&w, &plain) != 0;
              n_groups += (int)w.n_groups;
              bad_idem += win_idempotent(&w, 3) != 0;
              n_win++;
              win_free(&w);
            }
          }
  CHECK(bad_err == 0);
  CHECK(bad_idem == 0);
  printf("random windows: %d (%d groups, %d with z <= min and the range covered), "
         "error-bound failures %d, idempotence failures %d\n",
         n_win, n_groups, plain, bad_err, bad_idem);
}

/* ---- adversarial groups: each case quantized as one key channel and as one value group ---- */

static float ulp_step(float x, int k) {
  for (; k > 0; k--) x = nextafterf(x, INFINITY);
  for (; k < 0; k++) x = nextafterf(x, -INFINITY);
  return x;
}

typedef struct {
  float a, b, grid, r; /* two random values, a random fp16 point, a random spread */
} adv_t;

/* Element i of an adversarial group of case `kind` (groups of 8). */
static float adv_value(int kind, int i, const adv_t *c, uint64_t *st) {
  static const float specials[4] = {NAN, INFINITY, -INFINITY, 1.0f};
  switch (kind) {
  case 0: /* constant, fp16-exact */
    return 1.5f;
  case 1: /* constant, not fp16 */
    return 0.1f;
  case 2: /* zeros of both signs */
    return i & 1 ? -0.0f : 0.0f;
  case 3: /* two values */
    return (i % 3) ? c->a : c->b;
  case 4: /* a range of 2 fp32 ulps */
    return ulp_step(c->a, i % 3);
  case 5: /* fp32 neighbours of an fp16 point */
    return ulp_step(c->grid, (int)tu_randf(st, -8, 8));
  case 6: /* just below an fp16 point */
    return ulp_step(c->grid, -1 - (i & 3));
  case 7: /* an fp16 point with any spread */
    return c->grid + c->r * tu_randf(st, -1, 1);
  case 8: /* huge range */
    return i & 1 ? 60000.0f : -60000.0f;
  case 9: /* beyond the fp16 range: saturates */
    return tu_randf(st, -1e6f, 1e6f);
  case 10: /* negative only */
    return -3.0f - 4.0f * tu_randf(st, 0, 1);
  case 11: /* far below the scale floor */
    return 1e-6f * tu_randf(st, -1, 1);
  case 12: /* tiny and huge */
    return i ? 3e4f : -1e-7f;
  case 13: /* any magnitude */
    return ldexpf(tu_randf(st, -1, 1), (int)tu_randf(st, -30, 17));
  case 14: /* non-finite */
    return specials[i & 3];
  default: /* at the negative end of the fp16 range */
    return i == 0 ? -65504.0f : ulp_step(-65504.0f, i);
  }
}

static void adversarial(int kind, uint64_t *st, float *g, int n) {
  adv_t c = {tu_randf(st, -3, 3), tu_randf(st, -3, 3), 0, ldexpf(1, (int)tu_randf(st, -24, 4))};
  uint16_t h = (uint16_t)tu_randf(st, 0, 0x7bff) | (tu_randf(st, 0, 1) < 0.5f ? 0x8000u : 0);
  c.grid = qe_half_to_f32(h);
  for (int i = 0; i < n; i++) g[i] = adv_value(kind, i, &c, st);
}

#define N_ADV 16

static void test_adversarial(void) {
  uint64_t st = 99;
  int bad_err[N_ADV] = {0}, bad_idem[N_ADV] = {0}, bad = 0;
  for (int kind = 0; kind < N_ADV; kind++)
    for (int rep = 0; rep < 300; rep++)
      for (int b = 2; b <= 8; b *= 2)
        for (int keys = 0; keys < 2; keys++) {
          win_t w; /* keys: omega 8 x 1 channel; values: one token, group 8 of hd 8 */
          win_init(&w, b, 8, keys ? 8 : 1, 1, keys ? 1 : 8, keys);
          adversarial(kind, &st, w.x, 8);
          win_quant(&w, w.x);
          win_dequant(&w);
          bad_err[kind] += win_check(&w, NULL) != 0;
          bad_idem[kind] += win_idempotent(&w, 3) != 0;
          win_free(&w);
        }
  for (int kind = 0; kind < N_ADV; kind++) {
    if (bad_err[kind] || bad_idem[kind])
      printf("adversarial case %d: %d error-bound, %d idempotence failures\n", kind, bad_err[kind],
             bad_idem[kind]);
    bad += bad_err[kind] + bad_idem[kind];
  }
  CHECK(bad == 0);
}

/* Specific outcomes: constant groups reconstruct exactly when fp16, scale floor 2^-14, NaN
 * reads as 0, saturation at +-65504, two values get codes 0 and L. */
static void test_special_values(void) {
  win_t w;
  win_init(&w, 2, 8, 1, 1, 8, 0);
  for (int i = 0; i < 8; i++) w.x[i] = 1.5f;
  win_quant(&w, w.x);
  win_dequant(&w);
  CHECK(w.zero[0] == qe_f32_to_half(1.5f) && w.scale[0] == 0x0400 && w.y[5] == 1.5f);
  for (int i = 0; i < 8; i++) w.x[i] = (float[]){NAN, INFINITY, -INFINITY, 2.0f}[i & 3];
  win_quant(&w, w.x);
  win_dequant(&w);
  CHECK(w.zero[0] == 0xfbff && fabsf(w.y[1] - 65504.0f) <= 0.5f * qe_half_to_f32(w.scale[0]));
  CHECK(w.y[2] == -65504.0f && fabsf(w.y[0]) <= 0.5f * qe_half_to_f32(w.scale[0]));
  for (int i = 0; i < 8; i++) w.x[i] = i & 1 ? 1.25f : -0.25f;
  win_quant(&w, w.x);
  win_dequant(&w);
  CHECK(kv_code_at(w.codes, 0, 2) == 0 && kv_code_at(w.codes, 1, 2) == 3);
  CHECK(w.y[0] == -0.25f && w.y[1] == 1.25f && w.scale[0] == qe_f32_to_half(0.5f));
  win_free(&w);
}

/* ---- packing ---- */

/* Integer data 0..L with both ends in every group quantizes to z = 0, s = 1, codes = data. */
static void test_packing(void) {
  for (int b = 2; b <= 8; b *= 2) {
    int L = (1 << b) - 1, bad = 0;
    win_t w;
    win_init(&w, b, 7, 3, 1, 7, 0); /* 21 elements: a partial last byte for 2 and 4 bits */
    for (size_t i = 0; i < w.n; i++)
      w.x[i] = (float)(i % 7 == 0 ? 0 : i % 7 == 1 ? (size_t)L : (i * 5) % (size_t)(L + 1));
    win_quant(&w, w.x);
    for (size_t i = 0; i < w.n; i++) bad += kv_code_at(w.codes, i, b) != (unsigned)w.x[i];
    for (size_t j = 0; j < w.n_groups; j++) bad += w.scale[j] != 0x3c00 || w.zero[j] != 0;
    size_t nb = (w.n * b + 7) / 8;
    if (w.n * b % 8) bad += (w.codes[nb - 1] >> (w.n * b % 8)) != 0; /* unused bits are 0 */
    CHECK(bad == 0);
    win_free(&w);
  }
  win_t w; /* 2 bits, one value group [1 2 3 0 0 3 3 1]: bytes 0b00111001, 0b01111100 */
  win_init(&w, 2, 8, 1, 1, 8, 0);
  static const float row[8] = {1, 2, 3, 0, 0, 3, 3, 1};
  win_quant(&w, row);
  CHECK(w.codes[0] == 0x39 && w.codes[1] == 0x7c);
  win_free(&w);
  /* Dequantization reads the layout: keys use (head, channel) meta, values (token, head, group). */
  win_init(&w, 4, 4, 2, 2, 8, 1);
  for (size_t i = 0; i < w.n; i++) w.codes[i / 2] |= (uint8_t)((i % 16) << (i % 2 * 4));
  for (int j = 0; j < 16; j++)
    w.scale[j] = qe_f32_to_half(j + 1.0f), w.zero[j] = qe_f32_to_half(-j);
  win_dequant(&w);
  int bad = 0;
  for (size_t i = 0; i < w.n; i++)
    bad += w.y[i] != (float)(i % 16) * (i % 16 + 1) - (float)(i % 16);
  CHECK(bad == 0);
  win_free(&w);
}

/* How many of kv_dequant_keys_head's (values: kv_dequant_values_head's) outputs differ from
 * the reference `ref` (the whole window), over every head, the first n tokens for n = omega and
 * omega - 1, and channel ranges: the head, its halves and quarters, 16 from 16 on, and an odd
 * range (3, 5) (the fallback). *cases counts them. */
static int heads_differ(const kv_qparams_t *p, const uint8_t *c, const uint16_t *sc,
                        const uint16_t *z, int om, int n_kv, int hd, const float *ref, int values,
                        int *cases) {
  int ranges[][2] = {{0, hd},          {0, hd / 2}, {hd / 2, hd - hd / 2},
                     {hd / 4, hd / 4}, {16, 16},    {3, 5}};
  int bad = 0;
  float *out = malloc(sizeof(float) * (size_t)om * hd);
  for (int h = 0; h < n_kv; h++)
    for (int n = om; n >= om - 1 && n >= 1; n--)
      for (int r = 0; r < 6; r++) {
        int c0 = ranges[r][0], nc = ranges[r][1];
        if (nc < 1 || c0 + nc > hd) continue;
        if (values)
          kv_dequant_values_head(p, c, sc, z, n, n_kv, hd, h, c0, nc, out);
        else
          kv_dequant_keys_head(p, c, sc, z, n, n_kv, hd, h, c0, nc, out);
        for (int i = 0; i < n; i++)
          bad += memcmp(out + (size_t)i * nc, ref + ((size_t)i * n_kv + h) * hd + c0,
                        sizeof(float) * nc) != 0;
        (*cases)++;
      }
  free(out);
  return bad;
}

/* The byte-at-a-time dequantization against the element-by-element reference, bit for bit, on
 * random codes, scales and zeros (any fp16 bits but inf/NaN: subnormal and negative included)
 * for 2, 4 and 8 bits, windows of 1 to 32 tokens, 1, 2, 3 and 8 KV heads (8: over 1,024
 * value groups a window), head sizes 4 to 128 (4: a channel's codes not byte-aligned across
 * tokens at 2 bits) and value groups of 4 to 64; and so a KV head's channels at a time
 * (kv_dequant_*_head, the in-place attention's). */
static void test_fast_dequant(void) {
  uint64_t st = 11;
  int cases = 0, bad = 0;
  for (int bits = 2; bits <= 8; bits *= 2)
    for (int om = 1; om <= 32; om *= 2)
      for (int n_kv = 1; n_kv <= 8; n_kv += n_kv < 3 ? 1 : 5)
        for (int hd = 4; hd <= 128; hd *= 2)
          for (int g = 4; g <= 64 && g <= hd; g *= 4) {
            kv_qparams_t p = {.bits = bits, .group = g};
            size_t n = (size_t)om * n_kv * hd;
            uint8_t *c = malloc(n);
            uint16_t *sc = malloc(n * 2), *z = malloc(n * 2);
            float *a = malloc(n * 4), *b = malloc(n * 4);
            for (size_t i = 0; i < n; i++) {
              c[i] = (uint8_t)(tu_randf(&st, 0, 256));
              sc[i] = (uint16_t)tu_randf(&st, 0, 0x7c00), z[i] = (uint16_t)tu_randf(&st, 0, 0xfc00);
              if ((z[i] & 0x7c00) == 0x7c00) z[i] &= 0x83ff; /* no inf/NaN */
            }
            kv_dequant_keys_ref(&p, c, sc, z, om, n_kv, hd, a);
            kv_dequant_keys(&p, c, sc, z, om, n_kv, hd, b);
            bad += memcmp(a, b, n * 4) != 0;
            bad += heads_differ(&p, c, sc, z, om, n_kv, hd, a, 0, &cases);
            kv_dequant_values_ref(&p, c, sc, z, om, n_kv, hd, a);
            kv_dequant_values(&p, c, sc, z, om, n_kv, hd, b);
            bad += memcmp(a, b, n * 4) != 0;
            bad += heads_differ(&p, c, sc, z, om, n_kv, hd, a, 1, &cases);
            cases += 2;
            free(c), free(sc), free(z), free(a), free(b);
          }
  printf("fast dequantization: %d cases, %d differ from the reference\n", cases, bad);
  CHECK(bad == 0);
}

int main(void) {
  test_fast_dequant();
  test_half_roundtrip();
  test_half_batch();
  test_half_ties();
  test_half_random();
  test_params();
  test_sizes();
  test_random_shapes();
  test_adversarial();
  test_special_values();
  test_packing();
  return tu_done("kv_quant");
}
