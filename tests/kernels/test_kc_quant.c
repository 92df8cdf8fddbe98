/* test_kc_quant: the GPU window migrations (kern_cuda_quant.h) against the CPU path they replace
 * (bf16 page -> fp32 -> kern_cpu rope at -pos -> kv_quant_keys / kv_quant_values, and back with
 * kv_dequant_* -> rope at +pos -> bf16 round to nearest even), on fresh seeded random data over
 * head_dim 64 / 80 / 128, n_kv 1 / 3 / 8, omega 5 / 8 / 16 / 512 (shared memory past 48 KiB),
 * full and partial windows (and pos0 = 0), bits 2 / 4 / 8, group 16 / 32, NORM and NEOX (n_rot
 * == head_dim and below), llama3 frequency factors and YaRN, with an arena and with addresses:
 *   - rotate = 0, and rotate = 1 with an exact rotation (freq_scale 0: angle 0, cos/sin exactly
 *     1/0, so the un-rotation only multiplies by attn_factor, giving fp32 inputs that are not
 *     bf16): codes, scales and zeros byte-identical to kv_quant_*, including NaN / inf / huge /
 *     tiny / constant inputs and narrow groups that send kv_quant.c into its fallback search
 *     (the test counts those groups and requires some); dequantized pages equal bf16_rne of
 *     kv_dequant_* (re-rotated) exactly;
 *   - rotate = 1 with real RoPE: value parts byte-identical; every key's GPU reconstruction
 *     within scale/2 (plus a few fp32 ulps of the rotated pair) of the CPU's un-rotated input,
 *     >= 99.9% of key codes equal to the CPU's; promoted K pages within one bf16 ulp (plus the
 *     pair's fp32 rounding) of the CPU's and 1e-2 normalized error, no NaN/Inf; V pages exact;
 *   - post_rope = 1 (with rotate = 1 and real RoPE): keys moved as they are, byte-identical to
 *     the rotate = 0 path (post-RoPE ledgers, KV_KEY_FRAME_ABS);
 *   - every byte the call may not write (pages during demotion, ledgers and rows >= n_tok during
 *     promotion, gaps between ledger parts, other jobs) is unchanged;
 *   - kc_quant_ledger_layout agrees with kv_qsizes and kern_paged.h, 16-byte aligned; bad
 *     arguments return QE_EINVAL (these host checks also run without a device).
 * Exits 77 when there is no CUDA device (after the host checks). */
#include <cuda_runtime_api.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"
#include "kern_cuda_quant.h"
#include "kv_quant.h"
#include "qe_half.h"
#include "qe_status.h"
#include "test_util.h"

enum { D_NORMAL, D_SPECIAL, D_NARROW }; /* data kinds */
enum {
  R_NONE,
  R_EXACT,
  R_ROPE,
  R_POST
};                                     /* rotate 0; rotate 1 at angle 0; real RoPE; real RoPE
                                         with post_rope (keys moved as they are) */
enum { RK_PLAIN, RK_LLAMA3, RK_YARN }; /* RoPE kinds for R_ROPE */
#define CASE_MAX_ROT 256               /* n_rot / 2 entries of factors and table, at most */

typedef struct {
  int hd, n_kv, omega, bits, group;
  int rot, mode, n_rot, rope_kind;
  float m; /* R_EXACT: attn_factor */
  int data, n_jobs, use_arena;
} tcase_t;

typedef struct {
  const tcase_t *c;
  kern_paged_geom_t g;
  kv_qparams_t qp;
  kc_quant_layout_t lay; /* slot layout (n_tok = omega) */
  size_t page, stride, bytes, row;
  kc_quant_job_t *jobs; /* host [n_jobs]: offsets from the arena start */
  uint8_t *img;         /* host arena image [bytes] (pages bf16, ledgers sentinel) */
  uint8_t *dev;         /* device arena */
  kc_quant_job_t *djobs;
  float *dtab;
  kern_rope_t rope;
  float factors[CASE_MAX_ROT];
  kc_attn_rope_t kr;
  int rotate; /* the CPU path's (0 for R_POST) */
  int post;   /* R_POST: the GPU gets rotate 1 and post_rope 1 */
} rig_t;

static kern_backend_t *g_cpu;
static uint64_t rs = 0x6b63717561ULL;
static long g_fallback, g_codes, g_code_miss;

static uint64_t rnd(void) { /* xorshift64* */
  rs ^= rs >> 12, rs ^= rs << 25, rs ^= rs >> 27;
  return rs * 0x2545F4914F6CDD1DULL;
}

static float urand(float lo, float hi) { return tu_randf(&rs, lo, hi); }

static float san(float x) { /* kv_quant.c's input sanitation */
  if (x != x) return 0.0f;
  return x < -65504.0f ? -65504.0f : x > 65504.0f ? 65504.0f : x;
}

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

static int cuda_ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 1;
  fprintf(stderr, "cuda: %s: %s\n", what, cudaGetErrorString(e));
  return 0;
}

/* ---- host-only checks ---------------------------------------------------------------------- */

static void check_layout_one(const kern_paged_geom_t *g, int n_tok) {
  kc_quant_layout_t l, slot;
  CHECK_OK(kc_quant_ledger_layout(g, n_tok, &l));
  CHECK_OK(kc_quant_ledger_layout(g, g->omega, &slot));
  kv_qparams_t qp = {g->bits, g->group, 0};
  kv_qsizes_t q = kv_qsizes(&qp, n_tok, g->n_kv, g->head_dim);
  CHECK(l.codes_bytes == q.k_codes && l.codes_bytes == q.v_codes);
  CHECK(2 * l.kmeta_bytes == q.k_meta && 2 * l.vmeta_bytes == q.v_meta);
  size_t off[7] = {l.k_codes, l.k_scale, l.k_zero, l.v_codes, l.v_scale, l.v_zero, l.total};
  size_t sz[6] = {l.codes_bytes, l.kmeta_bytes, l.kmeta_bytes,
                  l.codes_bytes, l.vmeta_bytes, l.vmeta_bytes};
  size_t soff[6] = {slot.k_codes, slot.k_scale, slot.k_zero,
                    slot.v_codes, slot.v_scale, slot.v_zero};
  CHECK(l.k_codes == 0);
  for (int i = 0; i < 6; i++) {
    CHECK(off[i] % 16 == 0 && off[i] + sz[i] <= off[i + 1] && off[i + 1] - off[i] < sz[i] + 16);
    CHECK(soff[i] + sz[i] <= (i < 5 ? soff[i + 1] : slot.total)); /* fits the slot's part */
  }
  CHECK(l.total % 16 == 0 && l.total <= slot.total);
}

static void test_layout(void) {
  const int hds[] = {64, 80, 128}, nkvs[] = {1, 3, 8}, omegas[] = {5, 8, 16}, groups[] = {16, 32};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 3; c++)
        for (int bits = 2; bits <= 8; bits *= 2)
          for (int d = 0; d < 2; d++) {
            kern_paged_geom_t g = {nkvs[b], hds[a], omegas[c], bits, groups[d]};
            if (hds[a] % groups[d]) continue;
            int ntoks[3] = {1, omegas[c] / 2 + 1, omegas[c]};
            for (int t = 0; t < 3; t++) check_layout_one(&g, ntoks[t]);
          }
  kern_paged_geom_t g = {8, 128, 16, 2, 32};
  kc_quant_layout_t l;
  CHECK(kc_quant_ledger_layout(NULL, 16, &l) == QE_EINVAL);
  CHECK(kc_quant_ledger_layout(&g, 16, NULL) == QE_EINVAL);
  CHECK(kc_quant_ledger_layout(&g, 0, &l) == QE_EINVAL);
  CHECK(kc_quant_ledger_layout(&g, 17, &l) == QE_EINVAL);
  g.group = 24;
  CHECK(kc_quant_ledger_layout(&g, 8, &l) == QE_EINVAL);
}

/* Both launch functions reject a (with no device access). */
static void expect_einval(const kc_quant_args_t *a, int line) {
  int rq = kc_quant_windows(a, NULL), rd = kc_dequant_windows(a, NULL), rc = kc_quant_check(a);
  if (rq != QE_EINVAL || rd != QE_EINVAL || rc != QE_EINVAL) {
    fprintf(stderr, "bad-argument case at line %d: quant %d, dequant %d, check %d\n", line, rq, rd,
            rc);
    tu_fail(__FILE__, line, "expect_einval");
  }
}

static kc_quant_args_t valid_args(void) {
  kc_quant_args_t a;
  memset(&a, 0, sizeof a);
  a.geom = (kern_paged_geom_t){8, 128, 16, 2, 32};
  a.rotate = 1;
  a.rope = (kc_attn_rope_t){KERN_ROPE_NEOX, 128, 1.0f, 0, 1.0f, (const float *)(uintptr_t)256};
  a.n_jobs = 0; /* valid and empty: nothing is launched, nothing dereferenced */
  return a;
}

#define BAD(field, value)                                                                          \
  do {                                                                                             \
    kc_quant_args_t b = valid_args();                                                              \
    b.field = value;                                                                               \
    expect_einval(&b, __LINE__);                                                                   \
  } while (0)

static void test_bad_args(void) {
  kc_quant_args_t a = valid_args();
  CHECK_OK(kc_quant_check(&a));
  CHECK_OK(kc_quant_windows(&a, NULL));
  CHECK_OK(kc_dequant_windows(&a, NULL));
  expect_einval(NULL, __LINE__);
  BAD(geom.bits, 3);
  BAD(geom.bits, 0);
  BAD(geom.group, 0);
  BAD(geom.group, 24); /* does not divide 128 */
  BAD(geom.group, 2);  /* 2 channels of 2 bits: not a whole byte */
  BAD(geom.head_dim, 0);
  BAD(geom.head_dim, 6); /* 6 * 2 bits per head row: not whole bytes (group must divide too) */
  BAD(geom.n_kv, 0);
  BAD(geom.n_kv, 65536);
  BAD(geom.omega, 0);
  BAD(geom.omega, 1025);
  BAD(n_jobs, -1);
  BAD(n_jobs, 1); /* jobs NULL */
  BAD(rotate, 2);
  BAD(rotate, -1);
  BAD(rope.table, NULL);
  BAD(rope.n_rot, 0);
  BAD(rope.n_rot, 63);
  BAD(rope.n_rot, 130);
  BAD(rope.mode, 1);
  kc_quant_args_t b = valid_args(); /* too large: 1024 * 65535 * 128 elements */
  b.geom.omega = 1024, b.geom.n_kv = 65535;
  expect_einval(&b, __LINE__);
  b = valid_args(); /* the RoPE is not looked at without rotate */
  b.rotate = 0, b.rope.table = NULL, b.rope.n_rot = 3;
  CHECK_OK(kc_quant_check(&b));
  b.geom.head_dim = 6, b.geom.group = 3, b.geom.bits = 8; /* 8 bits: any head_dim and group */
  CHECK_OK(kc_quant_check(&b));
}

/* ---- rig ----------------------------------------------------------------------------------- */

/* llama3-style rope_freqs (factor 8, low/high frequency factors 1/4, original context 8192). */
static void llama3_factors(float *f, int n_rot, float theta) {
  const float factor = 8.0f, lo = 1.0f, hi = 4.0f, old = 8192.0f;
  for (int i = 0; i < n_rot / 2; i++) {
    float freq = powf(theta, -2.0f * (float)i / (float)n_rot), wl = 2.0f * (float)M_PI / freq;
    if (wl < old / hi)
      f[i] = 1.0f;
    else if (wl > old / lo)
      f[i] = factor;
    else {
      float sm = (old / wl - lo) / (hi - lo);
      f[i] = 1.0f / ((1.0f - sm) / factor + sm);
    }
  }
}

static void rig_rope(rig_t *r) {
  const tcase_t *c = r->c;
  kern_rope_t *p = &r->rope;
  memset(p, 0, sizeof *p);
  p->mode = c->mode, p->n_rot = c->n_rot, p->theta = 10000.0f, p->freq_scale = 1.0f;
  p->attn_factor = 1.0f, p->beta_fast = 32.0f, p->beta_slow = 1.0f, p->n_ctx_orig = 4096;
  if (c->rot == R_EXACT) p->freq_scale = 0.0f, p->attn_factor = c->m;
  if (c->rot == R_ROPE && c->rope_kind == RK_LLAMA3) {
    p->theta = 500000.0f;
    llama3_factors(r->factors, c->n_rot, p->theta);
    p->factors = r->factors;
  }
  if (c->rot == R_ROPE && c->rope_kind == RK_YARN) p->ext_factor = 1.0f, p->freq_scale = 0.25f;
  float tab[2 * CASE_MAX_ROT];
  CHECK_OK(kc_attn_rope_init(p, tab, &r->kr));
  size_t tb = sizeof(float) * (size_t)c->n_rot;
  CHECK(cuda_ok(cudaMalloc((void **)&r->dtab, tb), "malloc table"));
  CHECK(cuda_ok(cudaMemcpy(r->dtab, tab, tb, cudaMemcpyHostToDevice), "upload table"));
  r->kr.table = r->dtab;
  r->rotate = c->rot != R_NONE && c->rot != R_POST;
  r->post = c->rot == R_POST;
}

/* Token counts: a full window, a partial one, a single token, then random. */
static int pick_ntok(int i, int omega) {
  if (i == 0 || omega == 1) return omega;
  if (i == 1) return 1 + (int)(rnd() % (uint64_t)(omega - 1));
  if (i == 2) return 1;
  return 1 + (int)(rnd() % (uint64_t)omega);
}

static void rig_jobs(rig_t *r) {
  const tcase_t *c = r->c;
  r->jobs = calloc((size_t)c->n_jobs, sizeof *r->jobs);
  for (int i = 0; i < c->n_jobs; i++) {
    size_t base = (size_t)i * r->stride, led = base + 2 * al16(r->page);
    kc_quant_job_t *j = &r->jobs[i];
    j->k = base, j->v = base + al16(r->page);
    j->k_codes = led + r->lay.k_codes, j->k_scale = led + r->lay.k_scale;
    j->k_zero = led + r->lay.k_zero, j->v_codes = led + r->lay.v_codes;
    j->v_scale = led + r->lay.v_scale, j->v_zero = led + r->lay.v_zero;
    j->n_tok = pick_ntok(i, c->omega);
    j->pos0 = i == 1 ? 0 : (int)(rnd() % 40000);
  }
}

static float special_value(void) {
  static const float sp[] = {NAN, INFINITY, -INFINITY, 1e5f, -7e4f, 1e-7f, 0.0f, -0.0f, 65504.0f};
  return sp[rnd() % (sizeof sp / sizeof sp[0])];
}

/* One page element before bf16 rounding. mu/sc: the channel's (keys) offset and spread; base:
 * the channel's (keys) or group's (values) centre for narrow data. */
static float gen(int data, int key, int j, float mu, float sc, float base) {
  if (data == D_NARROW) {
    float b = qe_bf16_to_f32(qe_f32_to_bf16(base)), ulp = fabsf(b) * 0x1p-8f;
    return b + ulp * (float)(rnd() % 5);
  }
  float x = key ? mu + sc * urand(-1.0f, 1.0f) : urand(-1.5f, 1.5f);
  if (data == D_SPECIAL) {
    if (key && j % 16 == 1) x = 0.75f;                    /* constant channels */
    if (key && j % 16 == 2) x = 1e-6f * urand(-1, 1);     /* tiny channels */
    if (!key && j < 16) x = 0.3f;                         /* constant value groups */
    if (!key && j >= 16 && j < 32) x = urand(0.f, 1e-7f); /* tiny value groups */
    if (rnd() % 48 == 0) x = special_value();
  }
  return x;
}

static float rand_base(void) { return (rnd() & 1 ? 1.0f : -1.0f) * urand(100.0f, 3000.0f); }

/* Fills job i's K and V pages in the image: rows >= n_tok with 3e4 (read by mistake, they would
 * change the groups' ranges). Narrow data centres keys per channel, values per group. */
static void rig_fill_job(rig_t *r, int i) {
  const tcase_t *c = r->c;
  const int ng = c->hd / c->group;
  uint16_t *kp = (uint16_t *)(r->img + r->jobs[i].k), *vp = (uint16_t *)(r->img + r->jobs[i].v);
  float *vb = malloc(sizeof(float) * (size_t)c->omega * (size_t)ng); /* [omega][ng] */
  for (int h = 0; h < c->n_kv; h++) {
    for (int q = 0; q < c->omega * ng; q++) vb[q] = rand_base();
    for (int j = 0; j < c->hd; j++) {
      float mu = urand(-2, 2), sc = urand(0.05f, 3.0f) * (rnd() % 16 == 0 ? 10.0f : 1.0f);
      float kb = rand_base();
      for (int t = 0; t < c->omega; t++) {
        size_t e = (size_t)t * r->row + (size_t)h * c->hd + j;
        int live = t < r->jobs[i].n_tok;
        kp[e] = qe_f32_to_bf16(live ? gen(c->data, 1, j, mu, sc, kb) : 3e4f);
        vp[e] = qe_f32_to_bf16(live ? gen(c->data, 0, j, mu, sc, vb[t * ng + j / c->group]) : 3e4f);
      }
    }
  }
  free(vb);
}

static int rig_init(rig_t *r, const tcase_t *c) {
  memset(r, 0, sizeof *r);
  r->c = c;
  r->g = (kern_paged_geom_t){c->n_kv, c->hd, c->omega, c->bits, c->group};
  r->qp = (kv_qparams_t){c->bits, c->group, 0};
  CHECK_OK(kv_qparams_check(&r->qp, c->hd));
  if (kc_quant_ledger_layout(&r->g, c->omega, &r->lay)) return -1;
  r->row = (size_t)c->n_kv * c->hd;
  r->page = kern_paged_full_bytes(&r->g);
  r->stride = 2 * al16(r->page) + r->lay.total + 48; /* 48: a gap between jobs */
  r->bytes = r->stride * (size_t)c->n_jobs;
  r->img = malloc(r->bytes);
  memset(r->img, 0xa5, r->bytes);
  rig_rope(r);
  rig_jobs(r);
  for (int i = 0; i < c->n_jobs; i++) rig_fill_job(r, i);
  int ok = cuda_ok(cudaMalloc((void **)&r->dev, r->bytes), "malloc arena") &&
           cuda_ok(cudaMalloc((void **)&r->djobs, sizeof *r->jobs * (size_t)c->n_jobs), "malloc");
  return ok ? 0 : -1;
}

static void rig_dispose(rig_t *r) {
  cudaFree(r->dev), cudaFree(r->djobs), cudaFree(r->dtab);
  free(r->jobs), free(r->img);
}

/* Uploads img and the job table (offsets, or addresses without an arena); runs one call. */
static int rig_run(rig_t *r, int dequant, uint8_t *out) {
  const tcase_t *c = r->c;
  kc_quant_job_t *dj = malloc(sizeof *dj * (size_t)c->n_jobs);
  uint64_t add = c->use_arena ? 0 : (uint64_t)(uintptr_t)r->dev;
  for (int i = 0; i < c->n_jobs; i++) {
    dj[i] = r->jobs[i];
    dj[i].k += add, dj[i].v += add, dj[i].k_codes += add, dj[i].k_scale += add;
    dj[i].k_zero += add, dj[i].v_codes += add, dj[i].v_scale += add, dj[i].v_zero += add;
  }
  int ok = cuda_ok(cudaMemcpy(r->dev, r->img, r->bytes, cudaMemcpyHostToDevice), "upload") &&
           cuda_ok(cudaMemcpy(r->djobs, dj, sizeof *dj * (size_t)c->n_jobs, cudaMemcpyHostToDevice),
                   "upload jobs");
  free(dj);
  kc_quant_args_t a = {
      r->g,   r->rotate || r->post, r->kr, c->use_arena ? r->dev : NULL, r->djobs, c->n_jobs, NULL,
      r->post};
  /* address mode also takes the job count from the device, set past n_jobs: capped at n_jobs */
  int32_t *dcount = NULL, count = c->n_jobs + 5;
  if (!c->use_arena)
    ok = ok && cuda_ok(cudaMalloc((void **)&dcount, sizeof count), "count") &&
         cuda_ok(cudaMemcpy(dcount, &count, sizeof count, cudaMemcpyHostToDevice), "count");
  a.n_jobs_dev = dcount;
  int rc = ok ? (dequant ? kc_dequant_windows(&a, NULL) : kc_quant_windows(&a, NULL)) : -1;
  CHECK_OK(rc);
  ok = ok && !rc && cuda_ok(cudaDeviceSynchronize(), "kernel") &&
       cuda_ok(cudaMemcpy(out, r->dev, r->bytes, cudaMemcpyDeviceToHost), "download");
  if (dcount) cudaFree(dcount);
  return ok ? 0 : -1;
}

/* ---- CPU reference ------------------------------------------------------------------------- */

/* Job i's keys or values as fp32 [n_tok][n_kv][hd] from the image's page; keys un-rotated. */
static float *cpu_input(const rig_t *r, int i, int key) {
  const kc_quant_job_t *j = &r->jobs[i];
  size_t n = (size_t)j->n_tok * r->row;
  const uint16_t *p = (const uint16_t *)(r->img + (key ? j->k : j->v));
  float *x = malloc(sizeof(float) * n);
  for (size_t e = 0; e < n; e++) x[e] = qe_bf16_to_f32(p[e]);
  if (key && r->rotate) {
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)j->n_tok);
    for (int t = 0; t < j->n_tok; t++) pos[t] = -(j->pos0 + t);
    g_cpu->ops->rope(g_cpu, x, pos, j->n_tok, r->c->n_kv, r->c->hd, &r->rope);
    free(pos);
  }
  return x;
}

/* Job i's CPU ledger, written into led (an arena-sized buffer) at the job's offsets. */
static void cpu_ledger(const rig_t *r, int i, uint8_t *led, const float *kin, const float *vin) {
  const kc_quant_job_t *j = &r->jobs[i];
  kv_quant_keys(&r->qp, kin, j->n_tok, r->c->n_kv, r->c->hd, led + j->k_codes,
                (uint16_t *)(led + j->k_scale), (uint16_t *)(led + j->k_zero));
  kv_quant_values(&r->qp, vin, j->n_tok, r->c->n_kv, r->c->hd, led + j->v_codes,
                  (uint16_t *)(led + j->v_scale), (uint16_t *)(led + j->v_zero));
}

/* 1 when (z, s) is kv_quant.c's rule R for the group (else its fallback search chose it). */
static int is_rule(const float *x, size_t base, size_t stride, int n, int L, uint16_t z,
                   uint16_t s) {
  float mn = san(x[base]), mx = mn;
  for (int i = 1; i < n; i++) {
    float v = san(x[base + (size_t)i * stride]);
    mn = v < mn ? v : mn, mx = v > mx ? v : mx;
  }
  uint16_t up = (z & 0x7fffu) == 0 ? 1 : (z & 0x8000u) ? (z == 0x8001u ? 0 : z - 1) : z + 1;
  float zf = qe_half_to_f32(z), sf = qe_half_to_f32(s);
  int zfloor = zf <= mn && (z == 0x7bffu || qe_half_to_f32(up) > mn);
  int cover =
      (float)L * sf + zf >= mx && (s == 0x400u || (float)L * qe_half_to_f32(s - 1) + zf < mx);
  return zfloor && cover;
}

static void count_fallback(const rig_t *r, int i, const uint8_t *led, const float *kin,
                           const float *vin) {
  const kc_quant_job_t *j = &r->jobs[i];
  const uint16_t *ks = (const uint16_t *)(led + j->k_scale),
                 *kz = (const uint16_t *)(led + j->k_zero);
  const uint16_t *vs = (const uint16_t *)(led + j->v_scale),
                 *vz = (const uint16_t *)(led + j->v_zero);
  int L = (1 << r->c->bits) - 1;
  for (size_t m = 0; m < r->row; m++)
    g_fallback += !is_rule(kin, m, r->row, j->n_tok, L, kz[m], ks[m]);
  size_t ng = (size_t)j->n_tok * r->row / r->c->group;
  for (size_t m = 0; m < ng; m++)
    g_fallback += !is_rule(vin, m * r->c->group, 1, r->c->group, L, vz[m], vs[m]);
}

/* ---- comparisons --------------------------------------------------------------------------- */

/* Every byte outside [lo[k], hi[k]) ranges of the jobs is unchanged. */
static void check_untouched(const rig_t *r, const uint8_t *before, const uint8_t *after,
                            const uint8_t *mask, const char *what) {
  size_t bad = 0, first = 0;
  for (size_t b = 0; b < r->bytes; b++)
    if (!mask[b] && before[b] != after[b]) first = bad++ ? first : b;
  if (bad)
    fprintf(stderr, "%s: %zu bytes written outside their parts (first at %zu)\n", what, bad, first);
  CHECK(bad == 0);
}

/* The six parts of job i's ledger for its n_tok: byte ranges [off, off + size). */
static void ledger_parts(const rig_t *r, int i, size_t off[6], size_t sz[6]) {
  const kc_quant_job_t *j = &r->jobs[i];
  kc_quant_layout_t l;
  CHECK_OK(kc_quant_ledger_layout(&r->g, j->n_tok, &l));
  size_t o[6] = {j->k_codes, j->k_scale, j->k_zero, j->v_codes, j->v_scale, j->v_zero};
  size_t s[6] = {l.codes_bytes, l.kmeta_bytes, l.kmeta_bytes,
                 l.codes_bytes, l.vmeta_bytes, l.vmeta_bytes};
  memcpy(off, o, sizeof o), memcpy(sz, s, sizeof s);
}

/* Largest |x| of a head row's pair partner magnitudes: |x[a]| + |x[b]| bound by 2 max|row|. */
static float row_mag(const float *page, size_t base, int hd) {
  float m = 0;
  for (int j = 0; j < hd; j++) m = fmaxf(m, fabsf(san(page[base + (size_t)j])));
  return 2.0f * m;
}

static float ulp32(float x) { return nextafterf(fabsf(x), INFINITY) - fabsf(x); }

/* R_ROPE keys: the GPU's reconstruction against the CPU's un-rotated input; counts the codes
 * that differ (run_case requires >= 99.9% equal over the case). */
static void check_rope_keys(const rig_t *r, int i, const uint8_t *gpu, const uint8_t *cpu,
                            const float *kin, const float *kraw) {
  const kc_quant_job_t *j = &r->jobs[i];
  const uint16_t *gs = (const uint16_t *)(gpu + j->k_scale),
                 *gz = (const uint16_t *)(gpu + j->k_zero);
  long n = (long)j->n_tok * (long)r->row, miss = 0, far = 0;
  for (long e = 0; e < n; e++) {
    size_t m = (size_t)e % r->row;
    unsigned cg = kv_code_at(gpu + j->k_codes, (size_t)e, r->c->bits);
    miss += cg != kv_code_at(cpu + j->k_codes, (size_t)e, r->c->bits);
    float s = qe_half_to_f32(gs[m]), y = (float)cg * s + qe_half_to_f32(gz[m]), x = san(kin[e]);
    float mag = row_mag(kraw, (size_t)e - m % r->c->hd, r->c->hd) * r->kr.mscale;
    double tol = 0.5 * s + 1e-4 * s + 0.5 * ulp32(y) + 4.0 * FLT_EPSILON * mag;
    if (!(fabs((double)x - y) <= tol) && far++ == 0)
      fprintf(stderr, "job %d key %ld: cpu %.9g gpu recon %.9g (s %g, tol %g)\n", i, e, x, y, s,
              tol);
    CHECK(gs[m] >= 0x400u && gs[m] <= 0x7bffu);
  }
  CHECK(far == 0);
  g_codes += n, g_code_miss += miss;
}

static void check_quant(rig_t *r, const uint8_t *gpu, uint8_t *mask) {
  uint8_t *cpu = malloc(r->bytes);
  memcpy(cpu, r->img, r->bytes);
  for (int i = 0; i < r->c->n_jobs; i++) {
    float *kin = cpu_input(r, i, 1), *vin = cpu_input(r, i, 0), *kraw = NULL;
    cpu_ledger(r, i, cpu, kin, vin);
    size_t off[6], sz[6];
    ledger_parts(r, i, off, sz);
    for (int p = 0; p < 6; p++) {
      memset(mask + off[p], 1, sz[p]);
      if (r->c->rot != R_ROPE || p >= 3) CHECK(memcmp(gpu + off[p], cpu + off[p], sz[p]) == 0);
    }
    if (r->c->rot == R_ROPE) {
      r->rotate = 0, kraw = cpu_input(r, i, 1), r->rotate = 1;
      check_rope_keys(r, i, gpu, cpu, kin, kraw);
    } else if (r->c->data == D_NARROW)
      count_fallback(r, i, cpu, kin, vin);
    free(kin), free(vin), free(kraw);
  }
  check_untouched(r, r->img, gpu, mask, "quant");
  memcpy(r->img, cpu, r->bytes); /* the CPU ledgers: the promotion's input */
  free(cpu);
}

/* The CPU promotion of job i: fp32 K (re-rotated) and V [n_tok][n_kv][hd]. */
static void cpu_dequant(const rig_t *r, int i, float *k, float *v) {
  const kc_quant_job_t *j = &r->jobs[i];
  const uint8_t *led = r->img;
  kv_dequant_keys(&r->qp, led + j->k_codes, (const uint16_t *)(led + j->k_scale),
                  (const uint16_t *)(led + j->k_zero), j->n_tok, r->c->n_kv, r->c->hd, k);
  kv_dequant_values(&r->qp, led + j->v_codes, (const uint16_t *)(led + j->v_scale),
                    (const uint16_t *)(led + j->v_zero), j->n_tok, r->c->n_kv, r->c->hd, v);
  if (!r->rotate) return;
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)j->n_tok);
  for (int t = 0; t < j->n_tok; t++) pos[t] = j->pos0 + t;
  g_cpu->ops->rope(g_cpu, k, pos, j->n_tok, r->c->n_kv, r->c->hd, &r->rope);
  free(pos);
}

/* R_ROPE promoted keys: within a bf16 ulp plus the pair's fp32 rounding; normalized 1e-2. */
static void check_rope_pages(const rig_t *r, int i, const uint16_t *g, const float *k,
                             const float *kpre) {
  long n = (long)r->jobs[i].n_tok * (long)r->row, bad = 0;
  float mx = 0, dmax = 0;
  for (long e = 0; e < n; e++) {
    float gv = qe_bf16_to_f32(g[e]), cv = qe_bf16_to_f32(qe_f32_to_bf16(k[e]));
    size_t m = (size_t)e % r->row;
    float mag = row_mag(kpre, (size_t)e - m % r->c->hd, r->c->hd) * r->kr.mscale;
    float ulp = ldexpf(1.0f, (int)floorf(log2f(fmaxf(fmaxf(fabsf(gv), fabsf(cv)), 1e-30f))) - 7);
    bad += !isfinite(gv) || !(fabsf(gv - cv) <= ulp + 4.0f * FLT_EPSILON * mag);
    mx = fmaxf(mx, fabsf(cv)), dmax = fmaxf(dmax, fabsf(gv - cv));
  }
  if (bad) fprintf(stderr, "job %d: %ld promoted keys off the CPU's\n", i, bad);
  CHECK(bad == 0 && dmax <= 1e-2f * mx);
}

static void check_dequant(rig_t *r, const uint8_t *gpu, uint8_t *mask) {
  for (int i = 0; i < r->c->n_jobs; i++) {
    const kc_quant_job_t *j = &r->jobs[i];
    size_t n = (size_t)j->n_tok * r->row;
    float *k = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * n);
    float *kpre = malloc(sizeof(float) * n);
    cpu_dequant(r, i, k, v);
    int rot = r->rotate;
    r->rotate = 0, cpu_dequant(r, i, kpre, v), r->rotate = rot;
    const uint16_t *gk = (const uint16_t *)(gpu + j->k), *gv = (const uint16_t *)(gpu + j->v);
    size_t vbad = 0, kbad = 0;
    for (size_t e = 0; e < n; e++) {
      vbad += gv[e] != qe_f32_to_bf16(v[e]);
      kbad += gk[e] != qe_f32_to_bf16(k[e]);
    }
    CHECK(vbad == 0);
    if (r->c->rot == R_ROPE)
      check_rope_pages(r, i, gk, k, kpre);
    else
      CHECK(kbad == 0);
    memset(mask + j->k, 1, n * 2), memset(mask + j->v, 1, n * 2);
    free(k), free(v), free(kpre);
  }
  check_untouched(r, r->img, gpu, mask, "dequant");
}

/* One case: demotion checked against the CPU, then promotion of the CPU's ledgers into pages
 * filled with a sentinel. */
static void run_case(const tcase_t *c, int idx) {
  rig_t r;
  if (rig_init(&r, c)) {
    CHECK(!"rig_init");
    rig_dispose(&r);
    return;
  }
  long fb0 = g_fallback, miss0 = g_code_miss, codes0 = g_codes;
  uint8_t *out = malloc(r.bytes), *mask = calloc(r.bytes, 1);
  if (!rig_run(&r, 0, out)) check_quant(&r, out, mask);
  for (int i = 0; i < c->n_jobs; i++) /* sentinel pages for the promotion */
    memset(r.img + r.jobs[i].k, 0x5a, 2 * al16(r.page));
  memset(mask, 0, r.bytes);
  if (!rig_run(&r, 1, out)) check_dequant(&r, out, mask);
  fprintf(stderr,
          "case %2d: hd %3d n_kv %d omega %3d bits %d group %2d rot %d mode %d n_rot %3d data %d"
          " | fallback groups %ld, key codes off %ld / %ld\n",
          idx, c->hd, c->n_kv, c->omega, c->bits, c->group, c->rot, c->mode, c->n_rot, c->data,
          g_fallback - fb0, g_code_miss - miss0, g_codes - codes0);
  CHECK((g_code_miss - miss0) * 1000 <= g_codes - codes0); /* >= 99.9% of key codes equal */
  free(out), free(mask);
  rig_dispose(&r);
}

static const tcase_t g_cases[] = {
    /* hd  nkv om  b  g   rot      mode            n_rot kind       m      data       jobs arena */
    {128, 8, 8, 2, 32, R_NONE, KERN_ROPE_NORM, 128, RK_PLAIN, 1, D_NORMAL, 6, 1},
    {64, 3, 16, 4, 16, R_NONE, KERN_ROPE_NEOX, 64, RK_PLAIN, 1, D_SPECIAL, 6, 0},
    {128, 1, 16, 8, 32, R_NONE, KERN_ROPE_NORM, 128, RK_PLAIN, 1, D_SPECIAL, 5, 1},
    {64, 8, 8, 8, 16, R_NONE, KERN_ROPE_NEOX, 64, RK_PLAIN, 1, D_NORMAL, 4, 0},
    {80, 3, 8, 2, 16, R_NONE, KERN_ROPE_NORM, 80, RK_PLAIN, 1, D_SPECIAL, 4, 1},
    {64, 3, 5, 4, 32, R_NONE, KERN_ROPE_NORM, 64, RK_PLAIN, 1, D_NORMAL, 4, 1},
    {128, 1, 512, 4, 32, R_NONE, KERN_ROPE_NORM, 128, RK_PLAIN, 1, D_NORMAL, 3, 1},
    {128, 3, 16, 4, 16, R_EXACT, KERN_ROPE_NORM, 128, RK_PLAIN, 1.01f, D_NARROW, 6, 1},
    {64, 1, 8, 2, 32, R_EXACT, KERN_ROPE_NEOX, 64, RK_PLAIN, 1.01f, D_NARROW, 6, 0},
    {64, 8, 16, 8, 16, R_EXACT, KERN_ROPE_NEOX, 32, RK_PLAIN, 0.77f, D_NARROW, 4, 1},
    {128, 3, 8, 4, 32, R_EXACT, KERN_ROPE_NORM, 64, RK_PLAIN, 0.77f, D_SPECIAL, 4, 1},
    {128, 8, 8, 2, 32, R_ROPE, KERN_ROPE_NORM, 128, RK_LLAMA3, 1, D_NORMAL, 6, 1},
    {128, 3, 16, 4, 16, R_ROPE, KERN_ROPE_NEOX, 128, RK_LLAMA3, 1, D_NORMAL, 6, 0},
    {64, 1, 16, 8, 32, R_ROPE, KERN_ROPE_NEOX, 64, RK_PLAIN, 1, D_NORMAL, 6, 1},
    {64, 8, 8, 4, 16, R_ROPE, KERN_ROPE_NORM, 32, RK_PLAIN, 1, D_NORMAL, 4, 1},
    {128, 3, 16, 8, 32, R_ROPE, KERN_ROPE_NEOX, 128, RK_YARN, 1, D_NORMAL, 4, 1},
    {64, 3, 16, 2, 16, R_ROPE, KERN_ROPE_NEOX, 48, RK_PLAIN, 1, D_NORMAL, 4, 0},
    {128, 8, 16, 4, 32, R_ROPE, KERN_ROPE_NORM, 128, RK_LLAMA3, 1, D_NARROW, 4, 1},
    {128, 8, 8, 2, 32, R_POST, KERN_ROPE_NORM, 128, RK_PLAIN, 1, D_NORMAL, 6, 1},
    {64, 3, 16, 4, 16, R_POST, KERN_ROPE_NEOX, 64, RK_PLAIN, 1, D_SPECIAL, 5, 0},
};

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  test_layout();
  test_bad_args();
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev <= 0) {
    (void)cudaGetLastError();
    if (tu_failures) return tu_done("kc_quant (host checks)");
    tu_skip("no CUDA device visible (host checks passed)");
  }
  CHECK_OK(kern_cpu_create(1, &g_cpu));
  int n = (int)(sizeof g_cases / sizeof g_cases[0]);
  for (int i = 0; i < n; i++) run_case(&g_cases[i], i);
  fprintf(stderr,
          "fallback-search groups (bit-exact cases): %ld; key codes off the CPU's (RoPE cases): "
          "%ld / %ld\n",
          g_fallback, g_code_miss, g_codes);
  CHECK(g_fallback > 0); /* the narrow cases did reach kv_quant.c's fallback search */
  kern_destroy(g_cpu);
  return tu_done("kc_quant");
}
