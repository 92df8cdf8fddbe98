/* quant_emu: runs the GPU window migrations' own code (kernels/cuda/kern_cuda_quant.cu, built
 * with KQ_EMU as host C++, one fiber per CUDA thread through emu_fiber.h) on the CPU against
 * cache/kv_quant.c, so that CI checks them on machines without a GPU. On fresh seeded random
 * bf16 pages (with NaN, infinities, huge, tiny and constant runs) over head_dim 64 / 80 / 128,
 * n_kv 1 / 3 / 8, windows of 5 / 8 / 16 tokens, full and partial, bits 2 / 4 / 8, value groups
 * 16 / 32 (32: the values staged in shared memory), with an arena and with addresses, the job
 * count given by the host or read from "device" memory (set past n_jobs: capped):
 *   - demotion: each job's ledger (codes, scales, zeros) byte-identical to kv_quant_keys /
 *     kv_quant_values of the page's fp32 values (keys as they are: post-RoPE ledgers);
 *   - promotion of those ledgers: the K and V pages equal bf16_rne of kv_dequant_keys /
 *     kv_dequant_values bit for bit (the 8-channel path at head_dim % 8 == 0, which all are);
 *   - neither writes a byte outside its job's parts (rows >= n_tok of a page included);
 *   - the rule's round-down conversion (kq_hfloor_f) equal to kv_quant.c's search (kq_hfloor)
 *     on a sample of all floats in range.
 * test_kc_quant runs the same kernels on a GPU, RoPE included. Exit 0 when every case passes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

#define KQ_EMU 1
#include "kern_cuda_quant.cu"
extern "C" {
#include "kv_quant.h"
#include "qe_half.h"
}

#define KCA_CT 256 /* emu_fiber.h: most threads a block (the migrations use 128 and 256) */
#include "emu_fiber.h"

int kq_emu_grid(unsigned grid, int block, size_t smem,
                const std::function<void(int, int, float *)> &body) {
  std::vector<float> sm(smem ? smem : 1);
  for (unsigned bx = 0; bx < grid; bx++) {
    for (float &x : sm) x = nanf(""); /* garbage, as on the GPU */
    if (emu_block(block, [&](int tid) { body((int)bx, tid, sm.data()); })) return -1;
  }
  return 0;
}

static int g_fail;
static uint64_t g_rs = 0x71756e74656d75ULL;

static uint64_t rnd(void) { /* xorshift64* */
  g_rs ^= g_rs >> 12, g_rs ^= g_rs << 25, g_rs ^= g_rs >> 27;
  return g_rs * 0x2545f4914f6cdd1dULL;
}
static float urand(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 40) * 0x1p-24); }

#define EXPECT(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      g_fail++;                                                                                    \
    }                                                                                              \
  } while (0)

typedef struct {
  int hd, n_kv, omega, bits, group, special, n_jobs, arena;
  int n_rot; /* > 0: pre-RoPE ledgers (rotate = 1) with an exact rotation over n_rot channels */
} tcase_t;

/* The exact rotation of the pre-RoPE cases: NORM RoPE with freq_scale 0, so every angle is 0,
 * cos and sin exactly 1 and 0, and RoPE at +-pos only multiplies rotated channels by the
 * magnitude scale (kv_quant.c then sees fp32 keys that are not bf16). */
#define ROT_M 1.01f
static float g_tab[2 * 128];

/* One element of a page: mostly a window-wide base plus noise; with `special`, some NaN,
 * infinities, huge, tiny values and (per row) constants. */
static float gen(const tcase_t *c, float base, float sc, int constant) {
  if (constant) return base;
  if (c->special && rnd() % 97 == 0) {
    const float sp[] = {nanf(""), INFINITY, -INFINITY, 1e6f, -1e6f, 1e-30f, -3e-8f, 0.0f};
    return sp[rnd() % 8];
  }
  return base + urand(-sc, sc);
}

/* The arena: per job a K page, a V page (bf16 [omega][n_kv][hd]) and a ledger for its n_tok. */
typedef struct {
  std::vector<uint8_t> img;
  std::vector<kc_quant_job_t> jobs;
  kern_paged_geom_t g;
} rig_t;

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

static void rig_make(const tcase_t *c, rig_t *r) {
  r->g = kern_paged_geom_t{c->n_kv, c->hd, c->omega, c->bits, c->group};
  const size_t page = (size_t)c->omega * c->n_kv * c->hd * 2;
  size_t off = 64;
  r->jobs.resize((size_t)c->n_jobs);
  for (int i = 0; i < c->n_jobs; i++) {
    kc_quant_job_t &j = r->jobs[(size_t)i];
    j.n_tok = i % 3 == 2 ? 1 + (int)(rnd() % (uint64_t)c->omega) : c->omega;
    j.pos0 = (int)(rnd() % 5000);
    kc_quant_layout_t l;
    if (kc_quant_ledger_layout(&r->g, j.n_tok, &l)) abort();
    j.k = off, j.v = off + al16(page), off += 2 * al16(page);
    j.k_codes = off + l.k_codes, j.k_scale = off + l.k_scale, j.k_zero = off + l.k_zero;
    j.v_codes = off + l.v_codes, j.v_scale = off + l.v_scale, j.v_zero = off + l.v_zero;
    off += l.total + 16;
  }
  r->img.resize(off);
  for (size_t b = 0; b < off; b++) r->img[b] = (uint8_t)rnd(); /* bytes nobody may touch */
  for (int i = 0; i < c->n_jobs; i++) {
    const kc_quant_job_t &j = r->jobs[(size_t)i];
    const float base = urand(-3.0f, 3.0f), sc = urand(0.01f, 2.0f);
    for (int kv = 0; kv < 2; kv++) {
      uint16_t *p = (uint16_t *)&r->img[kv ? j.v : j.k];
      for (int t = 0; t < j.n_tok; t++) {
        const int constant = c->special && rnd() % 13 == 0;
        for (int e = 0; e < c->n_kv * c->hd; e++)
          p[(size_t)t * c->n_kv * c->hd + e] = qe_f32_to_bf16(gen(c, base, sc, constant));
      }
    }
  }
}

/* Runs the migration on a copy of the image; the job table with addresses when !c->arena. */
static std::vector<uint8_t> run(const tcase_t *c, const rig_t *r, int dequant,
                                const std::vector<uint8_t> &in) {
  std::vector<uint8_t> img = in;
  std::vector<kc_quant_job_t> jobs = r->jobs;
  const uint64_t add = c->arena ? 0 : (uint64_t)(uintptr_t)img.data();
  for (kc_quant_job_t &j : jobs) {
    j.k += add, j.v += add, j.k_codes += add, j.k_scale += add, j.k_zero += add;
    j.v_codes += add, j.v_scale += add, j.v_zero += add;
  }
  int32_t count = c->n_jobs + 5; /* read "on the device" when !arena: capped at n_jobs */
  kc_quant_args_t a = {};
  a.geom = r->g, a.rotate = c->n_rot > 0, a.arena = c->arena ? img.data() : NULL;
  a.jobs = jobs.data(), a.n_jobs = c->n_jobs, a.n_jobs_dev = c->arena ? NULL : &count;
  a.post_rope = c->n_rot == 0;
  a.rope = kc_attn_rope_t{KERN_ROPE_NORM, c->n_rot, 0.0f, 0, ROT_M, g_tab};
  const int rc = dequant ? kc_dequant_windows(&a, NULL) : kc_quant_windows(&a, NULL);
  EXPECT(rc == 0, "kc_%squant_windows returned %d", dequant ? "de" : "", rc);
  return img;
}

/* The job's fp32 page (rows < n_tok) as kv_quant.c takes it; keys of the pre-RoPE cases
 * through the exact rotation (times ROT_M on rotated channels). */
static std::vector<float> page_f32(const tcase_t *c, const std::vector<uint8_t> &img, uint64_t off,
                                   int n_tok, int key) {
  std::vector<float> x((size_t)n_tok * c->n_kv * c->hd);
  const uint16_t *p = (const uint16_t *)&img[off];
  for (size_t e = 0; e < x.size(); e++) {
    x[e] = qe_bf16_to_f32(p[e]);
    if (key && (int)(e % (size_t)c->hd) < c->n_rot) x[e] *= ROT_M;
  }
  return x;
}

/* Equal bf16 bits, a zero's sign aside (RoPE's x * cos - y * sin of a zero may carry either). */
static int same_bf16(uint16_t a, uint16_t b) { return a == b || ((a | b) & 0x7fffu) == 0; }

/* Marks [off, off + n) as the job's own bytes. */
static void mark(std::vector<uint8_t> &m, uint64_t off, size_t n) { memset(&m[off], 1, n); }

static void check_rest(const std::vector<uint8_t> &before, const std::vector<uint8_t> &after,
                       const std::vector<uint8_t> &mine, const char *what, int idx) {
  size_t bad = 0;
  for (size_t b = 0; b < before.size(); b++) bad += !mine[b] && before[b] != after[b];
  EXPECT(bad == 0, "case %d %s: %zu bytes written outside the jobs' parts", idx, what, bad);
}

static void run_case(const tcase_t *c, int idx) {
  rig_t r;
  rig_make(c, &r);
  const kv_qparams_t qp = {c->bits, c->group, KV_KEY_FRAME_ABS};
  std::vector<uint8_t> q = run(c, &r, 0, r.img), cpu = r.img, mq(r.img.size(), 0);
  std::vector<uint8_t> mdq(r.img.size(), 0);
  long led_bad = 0, page_bad = 0;
  for (const kc_quant_job_t &j : r.jobs) {
    kc_quant_layout_t l;
    if (kc_quant_ledger_layout(&r.g, j.n_tok, &l)) abort();
    const std::vector<float> k = page_f32(c, r.img, j.k, j.n_tok, 1);
    const std::vector<float> v = page_f32(c, r.img, j.v, j.n_tok, 0);
    memset(&cpu[j.k_codes], 0, l.codes_bytes), memset(&cpu[j.v_codes], 0, l.codes_bytes);
    kv_quant_keys(&qp, k.data(), j.n_tok, c->n_kv, c->hd, &cpu[j.k_codes],
                  (uint16_t *)&cpu[j.k_scale], (uint16_t *)&cpu[j.k_zero]);
    kv_quant_values(&qp, v.data(), j.n_tok, c->n_kv, c->hd, &cpu[j.v_codes],
                    (uint16_t *)&cpu[j.v_scale], (uint16_t *)&cpu[j.v_zero]);
    const uint64_t o[6] = {j.k_codes, j.k_scale, j.k_zero, j.v_codes, j.v_scale, j.v_zero};
    const size_t n[6] = {l.codes_bytes, l.kmeta_bytes, l.kmeta_bytes,
                         l.codes_bytes, l.vmeta_bytes, l.vmeta_bytes};
    for (int part = 0; part < 6; part++) {
      led_bad += memcmp(&q[o[part]], &cpu[o[part]], n[part]) != 0;
      mark(mq, o[part], n[part]);
    }
    /* promotion of the CPU's ledger: pages = bf16_rne(kv_dequant_*) */
    std::vector<float> kd(k.size()), vd(v.size());
    kv_dequant_keys(&qp, &cpu[j.k_codes], (const uint16_t *)&cpu[j.k_scale],
                    (const uint16_t *)&cpu[j.k_zero], j.n_tok, c->n_kv, c->hd, kd.data());
    kv_dequant_values(&qp, &cpu[j.v_codes], (const uint16_t *)&cpu[j.v_scale],
                      (const uint16_t *)&cpu[j.v_zero], j.n_tok, c->n_kv, c->hd, vd.data());
    for (size_t e = 0; e < kd.size(); e++) {
      if ((int)(e % (size_t)c->hd) < c->n_rot) kd[e] *= ROT_M; /* re-rotated at +pos */
      ((uint16_t *)&cpu[j.k])[e] = qe_f32_to_bf16(kd[e]);
      ((uint16_t *)&cpu[j.v])[e] = qe_f32_to_bf16(vd[e]);
    }
    mark(mdq, j.k, kd.size() * 2), mark(mdq, j.v, vd.size() * 2);
  }
  EXPECT(led_bad == 0, "case %d: %ld ledger parts differ from kv_quant.c's", idx, led_bad);
  check_rest(r.img, q, mq, "demotion", idx);
  std::vector<uint8_t> ledgers = r.img; /* the CPU's ledgers, pages as they were */
  for (size_t b = 0; b < ledgers.size(); b++)
    if (mq[b]) ledgers[b] = cpu[b];
  std::vector<uint8_t> d = run(c, &r, 1, ledgers);
  for (size_t b = 0; b + 1 < d.size(); b += 2) /* pages: bf16 pairs of bytes */
    page_bad += (mdq[b] || mdq[b + 1]) &&
                !same_bf16((uint16_t)(d[b] | d[b + 1] << 8), (uint16_t)(cpu[b] | cpu[b + 1] << 8));
  EXPECT(page_bad == 0, "case %d: %ld promoted page bytes differ from bf16(kv_dequant)", idx,
         page_bad);
  check_rest(ledgers, d, mdq, "promotion", idx);
}

/* kq_hfloor_f (the round-down conversion the kernels use) against kq_hfloor (kv_quant.c's search
 * for the largest fp16 <= v) over every 61st float pattern in [-65504, 65504] and the edges; the
 * whole range was checked once (2026-12-03: 2,399,125,506 floats, none apart). */
static void check_hfloor(void) {
  long n = 0, bad = 0;
  const float edge[] = {0.0f,      -0.0f,    65504.0f,  -65504.0f, 0x1p-24f, -0x1p-24f, 0x1p-25f,
                        -0x1p-25f, 0x1p-14f, -0x1p-14f, 65503.9f,  1.0f,     -1.0f,     3e-8f};
  for (float f : edge) bad += kq_hfloor_f(f) != kq_hfloor((double)f), n++;
  for (uint64_t u = 0; u < (1ull << 32); u += 61) {
    const float f = kq_emu_u2f((uint32_t)u);
    if (!(f >= -65504.0f && f <= 65504.0f)) continue;
    bad += kq_hfloor_f(f) != kq_hfloor((double)f), n++;
  }
  EXPECT(bad == 0, "kq_hfloor_f differs from kq_hfloor on %ld of %ld floats", bad, n);
}

/* kq_cover (its walk from an fp32 estimate) against kq_cover_ref (kv_quant.c's start: the fp64
 * quotient rounded up by kv__hceil_pos) for L = 3, 15, 255 over (mn, mx) pairs at every scale:
 * mn uniform at a random binade in [2^-26, 2^16] of either sign, the range mx - mn likewise or 0,
 * and the edges of the fp16 range. */
static float rnd_mag(void) { return ldexpf(urand(1.0f, 2.0f), (int)(rnd() % 43) - 26); }
static void check_cover(void) {
  long n = 0, bad = 0;
  const float edge[][2] = {{0, 0},
                           {-65504, 65504},
                           {65504, 65504},
                           {-65504, -65504},
                           {0x1p-24f, 0x1p-23f},
                           {-0x1p-14f, 0x1p-14f},
                           {0, 65504},
                           {-1, 1}};
  for (int L : {3, 15, 255}) {
    for (const auto &e : edge) {
      const uint16_t z = kq_hfloor_f(e[0]);
      bad += kq_cover(z, e[1], L) != kq_cover_ref(z, e[1], L), n++;
    }
    for (int i = 0; i < 400000; i++) {
      float mn = (rnd() & 1 ? -1.0f : 1.0f) * rnd_mag();
      mn = mn < -65504.0f ? -65504.0f : mn > 65504.0f ? 65504.0f : mn;
      float mx = rnd() % 16 == 0 ? mn : mn + rnd_mag();
      mx = mx > 65504.0f ? 65504.0f : mx;
      const uint16_t z = kq_hfloor_f(mn);
      bad += kq_cover(z, mx, L) != kq_cover_ref(z, mx, L), n++;
    }
  }
  EXPECT(bad == 0, "kq_cover differs from kq_cover_ref on %ld of %ld groups", bad, n);
}

static const tcase_t g_cases[] = {
    /* hd nkv om bits grp special jobs arena n_rot (> 0: pre-RoPE, promotions element by element) */
    {128, 8, 8, 2, 32, 0, 12, 1, 0},  {128, 8, 16, 2, 32, 1, 6, 0, 0},
    {64, 3, 16, 4, 16, 1, 6, 0, 0},   {128, 1, 16, 8, 32, 1, 5, 1, 0},
    {80, 3, 8, 2, 16, 1, 6, 1, 0},    {64, 3, 5, 4, 32, 0, 5, 1, 0},
    {128, 3, 8, 4, 32, 1, 7, 0, 0},   {64, 8, 8, 8, 16, 0, 4, 1, 0},
    {128, 8, 8, 2, 32, 0, 6, 1, 128}, {64, 3, 16, 4, 16, 0, 5, 0, 32},
};

int main(void) {
  Emu emu;
  E = &emu;
  for (int i = 0; i < 2 * 128; i++) g_tab[i] = i % 2 ? 0.0f : powf(10000.0f, -(float)i / 256.0f);
  check_hfloor();
  check_cover();
  const int n = (int)(sizeof g_cases / sizeof g_cases[0]);
  for (int i = 0; i < n; i++) run_case(&g_cases[i], i);
  if (g_fail) {
    fprintf(stderr, "quant_emu: %d failure(s)\n", g_fail);
    return 1;
  }
  fprintf(stderr,
          "quant_emu: %d cases: ledgers byte-identical to kv_quant.c, promoted pages "
          "bit-identical, nothing else written\n",
          n);
  return 0;
}
