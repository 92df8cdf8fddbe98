/* test_kv_gpu: the paged GPU FullKV cache and its kernels (kern_cuda_kv.h) against CPU
 * references on fresh random data:
 * - kc_kv_scatter + kc_kv_store: the arena and window table after random tokens are written to
 *   random slots and positions equal the CPU's byte for byte (bf16 round-to-nearest-even, n_tok);
 * - kc_kv_gather and kc_kv_rows (gather and scatter): exact;
 * - the cache: kv_gpu on the GPU against kv_full on the CPU backend fed the same K/V rounded to
 *   bf16, through prefill, chunked prefill, batched decode (consecutive queries: no gather) and
 *   mixed steps (a prefill among decodes: queries gathered), for GQA 8/2 at head_dim 128 and
 *   9/3 at head_dim 64: normalized error < 1e-2 (the decode kernel rounds q and P to bf16), no
 *   NaN; bad calls get errors;
 * - the observers (kv_cache_set_observer): the tiered GPU cache's stream equals the CPU tiered
 *   cache's on the same inputs (qevict, kivi, streaming, snapkv and pyramidkv: pooled, frozen
 *   prefill scores and layer-wise budgets; at budgets that keep the same window counts on
 *   both): every event, slot, layer, length, aged count and tier exactly, masses within
 *   2e-4 per query + 2% (check_observers says why); observing changes no output or score bit;
 *   the GPU's FullKV mode refuses an observer;
 * - GraphKV on the device: kc_graphkv_rescore against graphkv_rescore bit for bit (random
 *   scores with ties and zeros, keys with duplicates, scaled copies and zero rows, several
 *   groups per launch); kc_mean_keys against the CPU's mean pre-RoPE keys (QUANT exactly, FULL
 *   within 1e-5: the device's sincosf); the tiered cache with qevict+graphkv: every routing
 *   decision equal to graphkv_rescore + kv_route_decide on the state before it;
 * - SnapKV on the device: kc_route_add_masses' pooled window scores bit for bit against
 *   kv_tiered_attn.c's pool_masses rule; every tiered case's layer budgets within the slot's
 *   budget (even over the layers, or 3:1 with pyramid budgets on two layers);
 * - slots at their FullKV budget (check_fullkv_slot): kv_gpu_bounds' FullKV bytes equal the
 *   slot's windows counted once by kv_tiered's rule (sink rounded up to whole windows), every
 *   layer's B_hist holds the windows past the sink (pyramidkv too), and nothing leaves FULL;
 * - kv_gpu_pool_usage: FullKV counts the pages open slots hold and their peak; tiered counts the
 *   held FULL pages and slabs with a held ledger (as the device state says after every step), a
 *   peak that never falls and bounds it, and nothing in use once every slot is closed.
 * Exits 77 when there is no CUDA device. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kern_cuda.h"
#include "graphkv.h"
#include "kern_cuda_graphkv.h"
#include "kern_cuda_kv.h"
#include "attn_ref.h"
#include "kv_cache.h"
#include "kv_gpu.h"
#include "kv_gpu_internal.h"
#include "kv_route.h"
#include "kv_tiered_internal.h"
#include "qe_half.h"
#include "qe_status.h"
#include "test_util.h"

static kern_backend_t *g_cpu, *g_gpu;
static uint64_t rs = 0x6b76677075ULL;

static uint64_t rnd(void) { /* xorshift64* */
  rs ^= rs >> 12, rs ^= rs << 25, rs ^= rs >> 27;
  return rs * 0x2545F4914F6CDD1DULL;
}

static float *randv(size_t n) {
  float *v = malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) v[i] = tu_randf(&rs, -2.0f, 2.0f);
  return v;
}

static void *dput(const void *h, size_t bytes) {
  void *d = kern_alloc(g_gpu, bytes ? bytes : 4);
  CHECK(d != NULL);
  if (d && h && bytes) CHECK_OK(g_gpu->ops->upload(g_gpu, d, h, bytes));
  return d;
}

static void dget(void *h, const void *d, size_t bytes) {
  CHECK_OK(g_gpu->ops->download(g_gpu, h, d, bytes));
}

/* ---- kernels ------------------------------------------------------------------------------- */

typedef struct {
  int slots, wins, omega, row;
  size_t page; /* bytes of one K (or V) page */
  uint8_t *arena_h;
  kern_pwin_t *tab_h;
  uint8_t *arena;
  kern_pwin_t *tab;
} kv_rig_t;

/* Random page placement for every (slot, window), written through kc_kv_scatter. */
static void rig_init(kv_rig_t *r, int slots, int wins, int omega, int row) {
  memset(r, 0, sizeof *r);
  r->slots = slots, r->wins = wins, r->omega = omega, r->row = row;
  r->page = (size_t)omega * row * 2;
  int n = slots * wins;
  size_t ab = (size_t)n * 2 * r->page;
  r->arena_h = calloc(1, ab);
  r->tab_h = calloc((size_t)n, sizeof *r->tab_h);
  int *perm = malloc(sizeof(int) * (size_t)n);
  kc_kv_upd_t *u = malloc(sizeof *u * (size_t)n);
  for (int i = 0; i < n; i++) perm[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rnd() % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  for (int i = 0; i < n; i++) {
    uint64_t off = (uint64_t)perm[i] * 2 * r->page;
    r->tab_h[i] = (kern_pwin_t){
        .k = off, .v = off + r->page, .pos0 = (i % wins) * omega, .tier = KERN_PW_FULL};
    u[n - 1 - i] = (kc_kv_upd_t){i, r->tab_h[i]};
  }
  r->arena = dput(r->arena_h, ab);
  r->tab = kern_alloc(g_gpu, sizeof *r->tab * (size_t)n);
  kc_kv_upd_t *du = dput(u, sizeof *u * (size_t)n);
  CHECK_OK(kc_kv_scatter(r->tab, du, n, kern_cuda_stream(g_gpu)));
  CHECK(kc_kv_scatter(r->tab, du, -1, kern_cuda_stream(g_gpu)) == QE_EINVAL);
  kern_free(g_gpu, du);
  free(perm), free(u);
}

static void rig_dispose(kv_rig_t *r) {
  kern_free(g_gpu, r->arena), kern_free(g_gpu, r->tab);
  free(r->arena_h), free(r->tab_h);
}

/* The CPU reference of kc_kv_store. */
static void store_ref(kv_rig_t *r, const float *k, const float *v, const int32_t *slot,
                      const int32_t *pos, int n) {
  for (int i = 0; i < n; i++) {
    kern_pwin_t *w = &r->tab_h[slot[i] * r->wins + pos[i] / r->omega];
    int row = pos[i] % r->omega;
    uint16_t *kp = (uint16_t *)(r->arena_h + w->k) + (size_t)row * r->row;
    uint16_t *vp = (uint16_t *)(r->arena_h + w->v) + (size_t)row * r->row;
    for (int j = 0; j < r->row; j++) {
      kp[j] = qe_f32_to_bf16(k[(size_t)i * r->row + j]);
      vp[j] = qe_f32_to_bf16(v[(size_t)i * r->row + j]);
    }
    if (w->n_tok < row + 1) w->n_tok = row + 1;
  }
}

static void check_store_gather(int slots, int wins, int omega, int row, int n) {
  kv_rig_t r;
  rig_init(&r, slots, wins, omega, row);
  int32_t *slot = malloc(sizeof(int32_t) * (size_t)n), *pos = malloc(sizeof(int32_t) * (size_t)n);
  uint8_t *used = calloc((size_t)slots * wins * omega, 1);
  for (int i = 0; i < n; i++) { /* distinct (slot, position) pairs */
    int s, p;
    do s = (int)(rnd() % (uint64_t)slots), p = (int)(rnd() % (uint64_t)(wins * omega));
    while (used[(size_t)s * wins * omega + p]);
    used[(size_t)s * wins * omega + p] = 1, slot[i] = s, pos[i] = p;
  }
  float *k = randv((size_t)n * row), *v = randv((size_t)n * row);
  float *dk = dput(k, sizeof(float) * (size_t)n * row),
        *dv = dput(v, sizeof(float) * (size_t)n * row);
  int32_t *ds = dput(slot, sizeof(int32_t) * (size_t)n),
          *dp = dput(pos, sizeof(int32_t) * (size_t)n);
  kc_kv_store_t a = {r.arena, r.tab, wins, omega, row, n, dk, dv, ds, dp};
  CHECK_OK(kc_kv_store(&a, kern_cuda_stream(g_gpu)));
  store_ref(&r, k, v, slot, pos, n);
  size_t ab = (size_t)slots * wins * 2 * r.page, tb = sizeof(kern_pwin_t) * (size_t)slots * wins;
  uint8_t *arena = malloc(ab);
  kern_pwin_t *tab = malloc(tb);
  dget(arena, r.arena, ab), dget(tab, r.tab, tb);
  CHECK(memcmp(arena, r.arena_h, ab) == 0);
  CHECK(memcmp(tab, r.tab_h, tb) == 0);
  /* gather slot 0's first wins * omega tokens (stored or not: the arena is defined everywhere) */
  int nt = wins * omega;
  float *gk = kern_alloc(g_gpu, sizeof(float) * (size_t)nt * row);
  float *gv = kern_alloc(g_gpu, sizeof(float) * (size_t)nt * row);
  CHECK_OK(kc_kv_gather(r.arena, r.tab, omega, row, nt, gk, gv, kern_cuda_stream(g_gpu)));
  float *hk = malloc(sizeof(float) * (size_t)nt * row),
        *hv = malloc(sizeof(float) * (size_t)nt * row);
  dget(hk, gk, sizeof(float) * (size_t)nt * row), dget(hv, gv, sizeof(float) * (size_t)nt * row);
  int bad = 0;
  for (int t = 0; t < nt; t++) {
    const kern_pwin_t *w = &r.tab_h[t / omega];
    const uint16_t *kp = (const uint16_t *)(r.arena_h + w->k) + (size_t)(t % omega) * row;
    const uint16_t *vp = (const uint16_t *)(r.arena_h + w->v) + (size_t)(t % omega) * row;
    for (int j = 0; j < row; j++)
      bad += hk[(size_t)t * row + j] != qe_bf16_to_f32(kp[j]) ||
             hv[(size_t)t * row + j] != qe_bf16_to_f32(vp[j]);
  }
  CHECK(bad == 0);
  fprintf(stderr, "store/gather: %d slots x %d windows, omega %d, row %d, %d tokens: %s\n", slots,
          wins, omega, row, n, bad ? "MISMATCH" : "exact");
  kern_free(g_gpu, gk), kern_free(g_gpu, gv), kern_free(g_gpu, dk), kern_free(g_gpu, dv);
  kern_free(g_gpu, ds), kern_free(g_gpu, dp);
  free(arena), free(tab), free(hk), free(hv), free(k), free(v), free(slot), free(pos), free(used);
  rig_dispose(&r);
}

static void check_rows(int n_src, int n, int row) {
  float *src = randv((size_t)n_src * row);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)n);
  for (int i = 0; i < n; i++) idx[i] = (n_src - 1 - 3 * i % n_src + n_src) % n_src;
  for (int i = 0; i < n; i++) /* distinct for the scatter */
    idx[i] = (int32_t)((i * 7919L) % n_src);
  float *ds = dput(src, sizeof(float) * (size_t)n_src * row);
  int32_t *di = dput(idx, sizeof(int32_t) * (size_t)n);
  float *dg = kern_alloc(g_gpu, sizeof(float) * (size_t)n * row);
  float *dsc = dput(src, sizeof(float) * (size_t)n_src * row);
  void *st = kern_cuda_stream(g_gpu);
  CHECK_OK(kc_kv_rows(dg, ds, di, n, row, 0, st));
  CHECK_OK(kc_kv_rows(dsc, dg, di, n, row, 1, st)); /* scatter the gathered rows back: no change */
  float *hg = malloc(sizeof(float) * (size_t)n * row),
        *hs = malloc(sizeof(float) * (size_t)n_src * row);
  dget(hg, dg, sizeof(float) * (size_t)n * row), dget(hs, dsc, sizeof(float) * (size_t)n_src * row);
  int bad = 0;
  for (int i = 0; i < n; i++)
    bad += memcmp(hg + (size_t)i * row, src + (size_t)idx[i] * row, sizeof(float) * row) != 0;
  CHECK(bad == 0);
  CHECK(memcmp(hs, src, sizeof(float) * (size_t)n_src * row) == 0);
  CHECK(kc_kv_rows(dg, ds, di, -1, row, 0, st) == QE_EINVAL);
  kern_free(g_gpu, ds), kern_free(g_gpu, di), kern_free(g_gpu, dg), kern_free(g_gpu, dsc);
  free(src), free(idx), free(hg), free(hs);
}

/* ---- the cache against kv_full on the CPU ------------------------------------------------- */

typedef struct {
  kv_geom_t g;
  kv_cache_t *gpu, *ref;
  int nq, row;
  float *dq, *dk, *dv, *dout; /* device scratch [max_tok][nq or row] */
  double err2, ref2;
  int nan;
} cache_rig_t;

/* Runs one forward-like step: segments (seq, pos0, n) in batch order; checks every output. */
static void cache_step(cache_rig_t *c, int (*segs)[3], int n_segs) {
  int total = 0;
  for (int i = 0; i < n_segs; i++) total += segs[i][2];
  float *q = randv((size_t)total * c->nq), *k = randv((size_t)total * c->row);
  float *v = randv((size_t)total * c->row), *out = malloc(sizeof(float) * (size_t)total * c->nq);
  float *got = malloc(sizeof(float) * (size_t)total * c->nq);
  for (size_t i = 0; i < (size_t)total * c->row; i++)
    k[i] = qe_bf16_to_f32(qe_f32_to_bf16(k[i])), v[i] = qe_bf16_to_f32(qe_f32_to_bf16(v[i]));
  CHECK_OK(g_gpu->ops->upload(g_gpu, c->dq, q, sizeof(float) * (size_t)total * c->nq));
  CHECK_OK(g_gpu->ops->upload(g_gpu, c->dk, k, sizeof(float) * (size_t)total * c->row));
  CHECK_OK(g_gpu->ops->upload(g_gpu, c->dv, v, sizeof(float) * (size_t)total * c->row));
  for (int l = 0; l < c->g.n_layer; l++) {
    kv_attn_req_t rg[16], rr[16];
    for (int i = 0, off = 0; i < n_segs; i++) {
      int s = segs[i][0], p = segs[i][1], n = segs[i][2];
      CHECK_OK(c->gpu->ops->store(c->gpu, s, l, p, n, c->dk + (size_t)off * c->row,
                                  c->dv + (size_t)off * c->row));
      CHECK_OK(c->ref->ops->store(c->ref, s, l, p, n, k + (size_t)off * c->row,
                                  v + (size_t)off * c->row));
      rg[i] = (kv_attn_req_t){s, p, n, c->dq + (size_t)off * c->nq, c->dout + (size_t)off * c->nq};
      rr[i] = (kv_attn_req_t){s, p, n, q + (size_t)off * c->nq, out + (size_t)off * c->nq};
      off += n;
    }
    CHECK_OK(c->gpu->ops->attend(c->gpu, l, rg, n_segs));
    CHECK_OK(c->ref->ops->attend(c->ref, l, rr, n_segs));
    CHECK_OK(g_gpu->ops->download(g_gpu, got, c->dout, sizeof(float) * (size_t)total * c->nq));
    for (size_t i = 0; i < (size_t)total * c->nq; i++) {
      c->nan += !isfinite(got[i]);
      c->err2 += ((double)got[i] - out[i]) * ((double)got[i] - out[i]);
      c->ref2 += (double)out[i] * out[i];
    }
  }
  free(q), free(k), free(v), free(out), free(got);
}

static void obs_none(void *ud, const kv_obs_t *o) { (void)ud, (void)o; }

/* kv_gpu_pool_usage of a FullKV cache: in_use and peak pages as given, the arena's sizes. */
static void check_pool_full(kv_cache_t *kv, long in_use, long peak) {
  const kv_gpu_t *g = (const kv_gpu_t *)kv;
  kv_gpu_pool_t u;
  CHECK_OK(kv_gpu_pool_usage(kv, &u));
  if (u.units_in_use != in_use || u.units_peak != peak)
    fprintf(stderr, "FAIL pool usage: %ld pages in use (want %ld), peak %ld (want %ld)\n",
            u.units_in_use, in_use, u.units_peak, peak);
  CHECK(u.units_in_use == in_use && u.units_peak == peak);
  CHECK(u.units_total == g->n_pages && u.unit_bytes == g->page_bytes);
  CHECK(u.arena_bytes == g->arena_bytes);
}

static void check_cache(int n_head, int n_kv, int hd, int omega) {
  cache_rig_t c = {.g = {2, n_head, n_kv, hd, 4}, .nq = n_head * hd, .row = n_kv * hd};
  int cap[3] = {300, 37, 120}, max_tok = 512;
  size_t pool = 0;
  long pages = 0; /* the three slots' */
  for (int s = 0; s < 3; s++) pool += kv_gpu_pool_bytes(&c.g, omega, 1, cap[s]);
  for (int s = 0; s < 3; s++) pages += (long)(cap[s] + omega - 1) / omega * c.g.n_layer;
  CHECK_OK(kv_gpu_create(g_gpu, &c.g, omega, 300, pool, &c.gpu));
  CHECK_OK(kv_full_create(g_cpu, &c.g, &c.ref));
  if (!c.gpu || !c.ref) return;
  c.dq = kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * c.nq);
  c.dout = kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * c.nq);
  c.dk = kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * c.row);
  c.dv = kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * c.row);
  kv_gpu_pool_t pu;
  check_pool_full(c.gpu, 0, 0);
  CHECK(kv_gpu_pool_usage(c.ref, &pu) == QE_EINVAL && pu.units_total == 0); /* not a GPU cache */
  CHECK(kv_cache_set_observer(c.gpu, obs_none, NULL) == QE_EUNSUPPORTED);   /* FullKV: no tiers */
  CHECK(kv_cache_prompt_room(c.gpu) == 0 && kv_cache_prompt_room(c.ref) == 0); /* (no limit) */
  CHECK_OK(kv_cache_set_observer(c.gpu, NULL, NULL));
  for (int s = 0; s < 3; s++) {
    CHECK_OK(c.gpu->ops->seq_open(c.gpu, s, cap[s]));
    CHECK_OK(c.ref->ops->seq_open(c.ref, s, cap[s]));
  }
  check_pool_full(c.gpu, pages, pages);
  CHECK(c.gpu->ops->seq_open(c.gpu, 3, 100000) == QE_EINVAL);            /* over max_tokens */
  CHECK(c.gpu->ops->seq_open(c.gpu, 3, 300) == QE_ENOSPC);               /* the pool is full */
  CHECK(c.gpu->ops->store(c.gpu, 3, 0, 0, 1, c.dk, c.dv) == QE_EINVAL);  /* closed slot */
  CHECK(c.gpu->ops->store(c.gpu, 1, 0, 30, 8, c.dk, c.dv) == QE_EINVAL); /* past capacity */
  check_pool_full(c.gpu, pages, pages); /* the failed opens took nothing */
  int pre[3][3] = {{0, 0, 150}, {1, 0, 1}, {2, 0, 40}};
  cache_step(&c, pre, 3);
  int chunk[1][3] = {{2, 40, 33}}; /* chunked prefill */
  cache_step(&c, chunk, 1);
  int pos[3] = {150, 1, 73};
  for (int t = 0; t < 20; t++) { /* batched decode: consecutive queries */
    int dec[3][3];
    for (int s = 0; s < 3; s++) dec[s][0] = s, dec[s][1] = pos[s]++, dec[s][2] = 1;
    cache_step(&c, dec, 3);
  }
  int mixed[3][3] = {{0, 170, 1}, {2, 93, 17}, {1, 21, 1}}; /* a prefill among decodes */
  cache_step(&c, mixed, 3);
  c.gpu->ops->seq_close(c.gpu, 1);
  check_pool_full(c.gpu, pages - (37 + omega - 1) / omega * c.g.n_layer, pages);
  CHECK_OK(c.gpu->ops->seq_open(c.gpu, 3, 37)); /* its pages came back */
  check_pool_full(c.gpu, pages, pages);
  for (int s = 0; s < 4; s++) c.gpu->ops->seq_close(c.gpu, s);
  check_pool_full(c.gpu, 0, pages); /* all returned, the peak kept */
  double ne = sqrt(c.err2 / (c.ref2 > 0 ? c.ref2 : 1));
  CHECK(c.nan == 0);
  CHECK(ne < 1e-2);
  fprintf(stderr,
          "kv_gpu vs kv_full (cpu, bf16 K/V): GQA %d/%d, head_dim %d, omega %d: "
          "normalized error %.2e, %d non-finite\n",
          n_head, n_kv, hd, omega, ne, c.nan);
  kern_free(g_gpu, c.dq), kern_free(g_gpu, c.dout), kern_free(g_gpu, c.dk), kern_free(g_gpu, c.dv);
  kv_cache_destroy(c.gpu), kv_cache_destroy(c.ref);
}

/* ---- GraphKV on the GPU --------------------------------------------------------------------- */

/* The CPU's mean pre-RoPE key (cache/kv_tiered_route.c's mean_key) of window d whose bytes are at
 * arena + d's offsets: FULL bf16 keys to fp32 and the CPU backend's RoPE at -position, QUANT
 * keys by kv_dequant_keys; summed in token order, divided by n_tok; zeros when evicted. */
static void ref_mean_key(const uint8_t *arena, const kern_pwin_t *d, int n_kv, int hd,
                         const kv_qparams_t *qp, const kern_rope_t *rope, float *out) {
  int row = n_kv * hd, n = d->n_tok;
  for (int e = 0; e < row; e++) out[e] = 0.0f;
  if (n <= 0 || d->tier == KERN_PW_EVICTED) return;
  float *x = malloc(sizeof(float) * (size_t)row * (size_t)n);
  int32_t pos[1024];
  if (d->tier == KERN_PW_FULL) {
    const uint16_t *kp = (const uint16_t *)(arena + d->k);
    for (size_t i = 0; i < (size_t)n * row; i++) x[i] = qe_bf16_to_f32(kp[i]);
  } else {
    kv_dequant_keys(qp, arena + d->k, (const uint16_t *)(arena + d->k_scale),
                    (const uint16_t *)(arena + d->k_zero), n, n_kv, hd, x);
  }
  for (int t = 0; t < n; t++) pos[t] = -(d->pos0 + t);
  /* FULL keys and post-RoPE ledger keys (KV_KEY_FRAME_ABS) are un-rotated */
  if (d->tier == KERN_PW_FULL || qp->key_frame == KV_KEY_FRAME_ABS)
    g_cpu->ops->rope(g_cpu, x, pos, n, n_kv, hd, rope);
  for (int t = 0; t < n; t++)
    for (int e = 0; e < row; e++) out[e] += x[(size_t)t * row + e];
  for (int e = 0; e < row; e++) out[e] /= (float)n;
  free(x);
}

/* kc_mean_keys against ref_mean_key: windows of every tier and length in one arena, two groups;
 * QUANT exactly (post: post-RoPE ledgers, un-rotated, within 1e-5 as FULL), FULL within 1e-5 of
 * the row's largest value (device sincosf), EVICTED zeros. */
static void check_mean_keys(int mode, int post) {
  const int n_kv = 3, hd = 64, omega = 8, row = n_kv * hd, G = 2, stride = 40;
  kern_rope_t rope = {mode, hd, 10000.0f, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 0};
  kern_paged_geom_t pg = {n_kv, hd, omega, 2, 32};
  kc_quant_layout_t lay;
  CHECK_OK(kc_quant_ledger_layout(&pg, omega, &lay));
  size_t page = (size_t)omega * row * 2, slot = page > lay.total ? page : lay.total;
  size_t ne = (size_t)G * stride, bytes = ne * slot;
  uint8_t *arena = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) arena[i] = (uint8_t)rnd();
  kern_pwin_t *win = calloc(ne, sizeof *win);
  int32_t n[2] = {stride, 29};
  for (size_t i = 0; i < ne; i++) {
    kern_pwin_t *d = &win[i];
    uint64_t b = i * slot;
    d->tier = i % 3 == 0 ? KERN_PW_FULL : i % 3 == 1 ? KERN_PW_QUANT : KERN_PW_EVICTED;
    d->n_tok = 1 + (int)(rnd() % omega), d->pos0 = (int)(rnd() % 5000);
    if (i % 7 == 6) d->tier = KERN_PW_FULL; /* more FULL windows */
    if (d->tier == KERN_PW_FULL) {
      d->k = b;
      for (int e = 0; e < d->n_tok * row; e++) /* finite bf16 keys */
        ((uint16_t *)(arena + b))[e] = qe_f32_to_bf16(tu_randf(&rs, -3.0f, 3.0f));
    } else if (d->tier == KERN_PW_QUANT) {
      d->k = b + lay.k_codes, d->k_scale = b + lay.k_scale, d->k_zero = b + lay.k_zero;
      for (int e = 0; e < row; e++) {
        ((uint16_t *)(arena + d->k_scale))[e] = qe_f32_to_half(tu_randf(&rs, 0.01f, 0.5f));
        ((uint16_t *)(arena + d->k_zero))[e] = qe_f32_to_half(tu_randf(&rs, -2.0f, 2.0f));
      }
    }
  }
  float tab[2 * 64];
  kc_attn_rope_t ar;
  CHECK_OK(kc_attn_rope_init(&rope, tab, &ar));
  ar.table = dput(tab, sizeof(float) * hd);
  kc_quant_args_t qa = {
      .geom = pg, .rotate = 1, .rope = ar, .arena = dput(arena, bytes), .post_rope = post};
  kern_pwin_t *dwin = dput(win, sizeof *win * ne);
  int32_t *dn = dput(n, sizeof n);
  float *dout = dput(NULL, sizeof(float) * ne * row), *got = malloc(sizeof(float) * ne * row);
  float *want = malloc(sizeof(float) * row);
  CHECK_OK(kc_mean_keys(&qa, dwin, dn, G, stride, dout, NULL));
  CHECK_OK(kc_stream_sync(NULL));
  dget(got, dout, sizeof(float) * ne * row);
  kv_qparams_t qp = {2, 32, post ? KV_KEY_FRAME_ABS : KV_KEY_FRAME_POS};
  double worst_full = 0, worst_quant = 0;
  int bad_quant = 0, bad_zero = 0;
  for (int g = 0; g < G; g++)
    for (int k = 0; k < n[g]; k++) {
      const kern_pwin_t *d = &win[(size_t)g * stride + k];
      const float *y = got + ((size_t)g * stride + k) * row;
      ref_mean_key(arena, d, n_kv, hd, &qp, &rope, want);
      double mx = 0, err = 0;
      for (int e = 0; e < row; e++)
        mx = fmax(mx, fabs(want[e])), err = fmax(err, fabs((double)y[e] - want[e]));
      if (d->tier == KERN_PW_FULL) worst_full = fmax(worst_full, err / (mx > 0 ? mx : 1));
      if (d->tier == KERN_PW_QUANT && !post) bad_quant += memcmp(y, want, sizeof(float) * row) != 0;
      if (d->tier == KERN_PW_QUANT) worst_quant = fmax(worst_quant, err / (mx > 0 ? mx : 1));
      if (d->tier == KERN_PW_EVICTED) bad_zero += err != 0 || mx != 0;
    }
  CHECK(worst_full < 1e-5);
  CHECK(bad_quant == 0 && worst_quant < 1e-5);
  CHECK(bad_zero == 0);
  qa.rotate = 2;
  CHECK(kc_mean_keys(&qa, dwin, dn, G, stride, dout, NULL) == QE_EINVAL);
  qa.rotate = 1;
  CHECK(kc_mean_keys(&qa, dwin, dn, G, 0, dout, NULL) == QE_EINVAL);
  fprintf(stderr,
          "kc_mean_keys (%s%s): %d windows vs the CPU: FULL worst %.2e of the row's max, QUANT "
          "%d inexact (worst %.2e), EVICTED %d non-zero\n",
          mode == KERN_ROPE_NEOX ? "NEOX" : "NORM", post ? ", post-RoPE ledgers" : "", n[0] + n[1],
          worst_full, bad_quant, worst_quant, bad_zero);
  kern_free(g_gpu, (void *)ar.table), kern_free(g_gpu, (void *)qa.arena), kern_free(g_gpu, dwin);
  kern_free(g_gpu, dn), kern_free(g_gpu, dout);
  free(arena), free(win), free(got), free(want);
}

/* Group g's random problem: scores with ties and zeros, keys with duplicates and zero rows. */
static void gkv_problem(int n, int dim, float *sc, float *keys) {
  for (int j = 0; j < n; j++) {
    uint64_t r = rnd() % 10;
    sc[j] = r == 0 ? 0.0f : r < 4 ? (float)(rnd() % 6) * 0.5f : tu_randf(&rs, 0.0f, 4.0f);
    float *x = keys + (size_t)j * dim;
    uint64_t kind = rnd() % 12;
    for (int d = 0; d < dim; d++) x[d] = tu_randf(&rs, -1.0f, 1.0f);
    if (kind == 0) memset(x, 0, sizeof(float) * dim); /* zero key */
    if (kind == 1 && j > 0) memcpy(x, keys + (size_t)(rnd() % j) * dim, sizeof(float) * dim);
    if (kind == 2 && j > 0) /* a scaled copy: similarity exactly tied with the original */
      for (int d = 0; d < dim; d++) x[d] = 2.0f * keys[(size_t)(j - 1) * dim + d];
  }
}

/* kc_graphkv_rescore against graphkv_rescore: G groups of n[] candidates in one launch, bit for
 * bit. */
static int gkv_case(int dim, float frac, int m, int rounds, int small) {
  enum { G = 7 };
  const int STRIDE = small ? 320 : 1536; /* small: compute-sanitizer's racecheck */
  const int n[G] = {0, 1, 2, 9, 150, small ? 200 : 700, STRIDE};
  int32_t nn[G], ns[G];
  size_t ne = (size_t)G * STRIDE;
  float *sc = calloc(ne, sizeof(float)), *keys = calloc(ne * dim, sizeof(float));
  float *want = malloc(sizeof(float) * ne), *got = malloc(sizeof(float) * ne);
  for (int g = 0; g < G; g++) {
    nn[g] = n[g], ns[g] = (int)(rnd() % (uint64_t)(2 * n[g] + 1));
    gkv_problem(n[g], dim, sc + (size_t)g * STRIDE, keys + (size_t)g * STRIDE * dim);
  }
  memcpy(want, sc, sizeof(float) * ne);
  graphkv_params_t p = {frac, m, rounds};
  void *ws = malloc(graphkv_workspace(STRIDE, dim));
  for (int g = 0; g < G; g++)
    CHECK_OK(graphkv_rescore(want + (size_t)g * STRIDE, keys + (size_t)g * STRIDE * dim, n[g], dim,
                             ns[g], &p, ws));
  kc_graphkv_args_t a = {frac,
                         m,
                         rounds,
                         G,
                         STRIDE,
                         dim,
                         dput(nn, sizeof nn),
                         dput(ns, sizeof ns),
                         dput(sc, sizeof(float) * ne),
                         dput(keys, sizeof(float) * ne * dim),
                         dput(NULL, sizeof(double) * ne),
                         dput(NULL, sizeof(float) * ne),
                         dput(NULL, sizeof(float) * 8 * ne)};
  CHECK_OK(kc_graphkv_rescore(&a, NULL));
  CHECK_OK(kc_stream_sync(NULL));
  dget(got, a.scores, sizeof(float) * ne);
  int bad = 0, moved = 0;
  for (int g = 0; g < G; g++)
    for (int j = 0; j < n[g]; j++) {
      size_t i = (size_t)g * STRIDE + j;
      bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
      moved += want[i] != sc[i];
    }
  if (bad)
    fprintf(stderr, "FAIL kc_graphkv_rescore dim %d frac %g m %d rounds %d: %d of %zu differ\n",
            dim, (double)frac, m, rounds, bad, ne);
  CHECK(bad == 0);
  CHECK(moved > 0); /* the discounts did something */
  kern_free(g_gpu, (void *)a.n), kern_free(g_gpu, (void *)a.n_slots), kern_free(g_gpu, a.scores);
  kern_free(g_gpu, (void *)a.keys), kern_free(g_gpu, a.norm), kern_free(g_gpu, a.decay);
  kern_free(g_gpu, a.sim);
  free(sc), free(keys), free(want), free(got), free(ws);
  return moved;
}

static void check_graphkv_kernel(int small) {
  const int dims[] = {1, 7, 192}, ms[] = {1, 8, 32};
  const float fracs[] = {0.3f, 1.0f, 0.05f};
  int cases = 0, moved = 0;
  for (int i = 0; i < (small ? 1 : 3); i++)
    for (int k = 0; k < 3; k++, cases++)
      moved += gkv_case(dims[i], fracs[(i + k) % 3], ms[k], 1 + (i + k) % 3, small);
  kc_graphkv_args_t bad = {0.3f, 33, 1, 1, 10, 4, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
  CHECK(kc_graphkv_rescore(&bad, NULL) == QE_EINVAL); /* m past the GPU's limit */
  bad.m = 8;
  CHECK(kc_graphkv_rescore(&bad, NULL) == QE_EINVAL); /* NULL buffers */
  bad.n_groups = 0, bad.source_frac = 0.0f;
  CHECK(kc_graphkv_rescore(&bad, NULL) == QE_EINVAL);
  fprintf(stderr,
          "kc_graphkv_rescore: %d launches of 7 groups (n 0..%d, dim 1/7/192, m 1/8/32, 1-3 "
          "rounds, tied scores, duplicate and zero keys) bit-identical to graphkv_rescore (%d "
          "scores moved)\n",
          cases, small ? 320 : 1536, moved);
}

/* ---- the tiered mode ------------------------------------------------------------------------ */

/* A host copy of the tiered cache's device state. */
typedef struct {
  size_t nw;
  kern_pwin_t *win;
  float *score;
  int32_t *page, *ledger;
  uint8_t *arena;
} tstate_t;

static void tstate_get(kv_gpu_t *g, tstate_t *st) {
  const kv_geom_t *ge = &g->base.geom;
  st->nw = (size_t)ge->n_layer * ge->max_seqs * g->max_win;
  st->win = malloc(sizeof *st->win * st->nw), st->score = malloc(sizeof(float) * st->nw);
  st->page = malloc(sizeof(int32_t) * st->nw), st->ledger = malloc(sizeof(int32_t) * st->nw);
  st->arena = malloc(g->arena_bytes + 4 * g->page_bytes * (size_t)ge->max_seqs);
  dget(st->win, g->tab, sizeof *st->win * st->nw), dget(st->score, g->t->rt.score, 4 * st->nw);
  dget(st->page, g->t->rt.page, 4 * st->nw), dget(st->ledger, g->t->rt.ledger, 4 * st->nw);
  dget(st->arena, g->arena, g->arena_bytes);
}

static void tstate_free(tstate_t *st) {
  free(st->win), free(st->score), free(st->page), free(st->ledger), free(st->arena);
}

/* B_hist of (layer l, slot s) as the cache set it. */
static int64_t bhist(const kv_gpu_t *g, int l, int s) {
  return g->t->h_bhist[(size_t)l * g->base.geom.max_seqs + s];
}

/* Every (layer, slot): tiers agree with pages and ledgers, persistent bytes within the layer's
 * budget. Returns the number of violations. */

static int check_invariants(kv_gpu_t *g, const tstate_t *st, const int *slots, int n) {
  const kc_route_t *r = &g->t->rt;
  int bad = 0;
  for (int l = 0; l < g->base.geom.n_layer; l++)
    for (int k = 0; k < n; k++) {
      int s = slots[k], nwin = (g->seqs[s].len + g->omega - 1) / g->omega;
      size_t bytes = 0, per = (size_t)bhist(g, l, s) + g->t->floor;
      for (int w = 0; w < nwin; w++) {
        size_t i = (size_t)kv_gpu__tab_index(g, l, s, w);
        int t = st->win[i].tier;
        bad += t == KERN_PW_FULL && st->page[i] < 0;
        bad += t == KERN_PW_QUANT && (st->page[i] >= 0 || st->ledger[i] < 0);
        bad += t == KERN_PW_EVICTED && (st->page[i] >= 0 || st->ledger[i] >= 0);
        bytes += (st->page[i] >= 0 ? g->page_bytes : 0) + (st->ledger[i] >= 0 ? r->lay.total : 0);
        bytes += t != KERN_PW_EVICTED ? KVG_META : 0;
      }
      bad += bytes > per;
    }
  return bad;
}

/* The prompt's keys (k_prompt [.][row], slot s's from row off[s]) as the FULL page of window w. */
static kern_pwin_t prompt_page(kv_gpu_t *g, const float *k_prompt, int off, int w, int n_tok,
                               uint16_t *page) {
  for (size_t e = 0; e < (size_t)n_tok * g->row; e++)
    page[e] = qe_f32_to_bf16(k_prompt[((size_t)off + (size_t)w * g->omega) * g->row + e]);
  return (kern_pwin_t){.k = 0, .pos0 = w * g->omega, .n_tok = n_tok, .tier = KERN_PW_FULL};
}

/* GraphKV as the CPU tiered cache applies it before kv_route_decide: the m candidates' scores
 * (clamped) re-scored over their mean keys (ref_mean_key), "the slots being filled" as
 * kv_tiered_route.c's budget_slots with the GPU cache's costs. Windows win[] (tab indices idx[]):
 * st's state, or (force, a prompt) the prompt's keys. */
static void ref_graphkv(kv_gpu_t *g, const tstate_t *st, const int *idx, kv_cand_t *c, int m,
                        size_t b_hist, const float *k_prompt, int off) {
  const kc_route_t *r = &g->t->rt;
  const kv_geom_t *ge = &g->base.geom;
  float *keys = malloc(sizeof(float) * (size_t)m * g->row), *s = malloc(sizeof(float) * m);
  uint16_t *page = malloc((size_t)g->page_bytes);
  void *ws = malloc(graphkv_workspace(m, g->row));
  for (int j = 0; j < m; j++) {
    kern_pwin_t d = st->win[idx[j]];
    const uint8_t *arena = st->arena;
    if (k_prompt) {
      int w = (idx[j] - kv_gpu__tab_index(g, 0, 0, 0)) % g->max_win;
      d = prompt_page(g, k_prompt, off, w, g->omega, page), arena = (const uint8_t *)page;
    }
    ref_mean_key(arena, &d, ge->n_kv_head, ge->head_dim, &g->t->cfg.quant, &g->t->rope,
                 keys + (size_t)j * g->row);
    s[j] = c[j].score > 0 ? fminf(c[j].score, FLT_MAX) : 0.0f;
  }
  double q = r->q, b = (double)b_hist, full = (double)(g->page_bytes + KVG_META);
  double slots = (1.0 - q) * b / full + (q > 0 ? q * b / (double)(r->lay.total + KVG_META) : 0);
  CHECK_OK(graphkv_rescore(s, keys, m, g->row, slots < m ? (int)slots : m, &g->t->cfg.gkv, ws));
  for (int j = 0; j < m; j++) c[j].score = s[j];
  free(keys), free(s), free(page), free(ws);
}

/* Layer l of the slots that routed between before and after: the new tiers equal
 * kv_route_decide's on the candidates as they were, with the scores of the routing (re-scored
 * by GraphKV first when the policy has it; k_prompt, off: the prompt's keys for force). */
static int check_decisions(kv_gpu_t *g, const tstate_t *before, const tstate_t *after,
                           const int *slots, int n, const int *aged0, int force, int *events,
                           const float *k_prompt, const int *off) {
  const kc_route_t *r = &g->t->rt;
  int bad = 0, cap = g->max_win;
  kv_cand_t *c = malloc(sizeof *c * (size_t)cap);
  int *idx = malloc(sizeof(int) * (size_t)cap * 3), *out = idx + cap, *ord = out + cap;
  for (int l = 0; l < g->base.geom.n_layer; l++)
    for (int k = 0; k < n; k++) {
      int s = slots[k], lim = g->seqs[s].len - r->n_local, A = lim > 0 ? lim / g->omega : 0, m = 0;
      A = A < r->sink_win ? r->sink_win : A;
      if (!force && A <= aged0[l * g->base.geom.max_seqs + s]) continue;
      for (int w = r->sink_win; w < A; w++) {
        size_t i = (size_t)kv_gpu__tab_index(g, l, s, w);
        const kern_pwin_t *d = &before->win[i];
        int live = d->n_tok > 0 && d->tier != KERN_PW_EVICTED, quant = d->tier == KERN_PW_QUANT;
        if (force) live = after->win[i].n_tok > 0, quant = 0; /* a prompt: all FULL, no ledger */
        if (!live) continue;
        size_t led = !force && before->ledger[i] >= 0 ? r->lay.total : 0;
        float sc = r->recency ? (float)w : after->score[i]; /* recency: newest first */
        c[m] = (kv_cand_t){sc, quant ? KV_TIER_INT2 : KV_TIER_FULL, g->page_bytes + KVG_META + led,
                           r->lay.total + KVG_META};
        idx[m++] = (int)i;
      }
      kv_route_params_t p = {(size_t)bhist(g, l, s), r->q, r->use_int2, r->use_full, r->promote};
      if (r->gkv.on && m > 1)
        ref_graphkv(g, before, idx, c, m, p.b_hist, force ? k_prompt : NULL, force ? off[k] : 0);
      kv_route_decide(c, m, &p, out, ord);
      for (int j = 0; j < m; j++) {
        int t = after->win[idx[j]].tier;
        int got = t == KERN_PW_FULL    ? KV_TIER_FULL
                  : t == KERN_PW_QUANT ? KV_TIER_INT2
                                       : KV_TIER_EVICTED;
        bad += got != out[j];
      }
      (*events)++;
    }
  free(c), free(idx);
  return bad;
}

/* The fp64 reference of one layer's decode attention over the state before the step plus the
 * step's new tokens (host k/v rows, bf16-rounded), for the slots' queries q [n][n_head][hd]. */
static double decode_error(kv_gpu_t *g, tstate_t *st, int l, const int *slots, int n,
                           const float *q, const float *k, const float *v, const float *got,
                           const float *score_before, const float *score_after, double *mass_err) {
  const kv_geom_t *ge = &g->base.geom;
  attn_prob_t p = {
      .geom = {ge->n_kv_head, ge->head_dim, g->omega, g->t->cfg.quant.bits, g->t->cfg.quant.group},
      .n_seq = n,
      .n_head = ge->n_head,
      .scale = 1.0f / sqrtf((float)ge->head_dim),
      .rope = g->t->rope,
      .arena = st->arena,
      .has_quant = 1,
      .abs_keys = g->t->cfg.quant.key_frame == KV_KEY_FRAME_ABS};
  p.win = malloc(sizeof *p.win * (size_t)n * g->max_win);
  p.seq_win = malloc(sizeof(int32_t) * (size_t)(n + 1));
  p.q = (float *)q;
  size_t extra = g->arena_bytes; /* fresh pages for windows the step opened */
  int *map = malloc(sizeof(int) * (size_t)n * g->max_win);
  p.seq_win[0] = 0;
  for (int b = 0; b < n; b++) {
    int s = slots[b], pos = g->seqs[s].len - 1, nwin = pos / g->omega + 1;
    for (int w = 0; w < nwin; w++) {
      size_t i = (size_t)kv_gpu__tab_index(g, l, s, w);
      kern_pwin_t d = st->win[i];
      if (w == nwin - 1) { /* the new token's row */
        if (pos % g->omega == 0) {
          d = (kern_pwin_t){.k = extra,
                            .v = extra + g->page_bytes / 2,
                            .pos0 = w * g->omega,
                            .tier = KERN_PW_FULL};
          extra += g->page_bytes;
        }
        uint16_t *kp = (uint16_t *)(st->arena + d.k) + (size_t)(pos % g->omega) * g->row;
        uint16_t *vp = (uint16_t *)(st->arena + d.v) + (size_t)(pos % g->omega) * g->row;
        for (int j = 0; j < g->row; j++)
          kp[j] = qe_f32_to_bf16(k[(size_t)b * g->row + j]),
          vp[j] = qe_f32_to_bf16(v[(size_t)b * g->row + j]);
        d.n_tok = pos % g->omega + 1;
      }
      map[p.n_win] = (int)i;
      p.win[p.n_win++] = d;
    }
    p.seq_win[b + 1] = p.n_win;
    p.max_win = nwin > p.max_win ? nwin : p.max_win;
  }
  size_t no = (size_t)n * ge->n_head * ge->head_dim;
  double *out = malloc(sizeof(double) * no), *mass = malloc(sizeof(double) * (size_t)p.n_win);
  double e2 = 0, r2 = 0, me = 0;
  if (!attn_ref_run(&p, out, mass)) {
    for (size_t i = 0; i < no; i++)
      e2 += (got[i] - out[i]) * (got[i] - out[i]), r2 += out[i] * out[i];
    const int acc = kv_gpu__tier_accumulates(g); /* frozen prefill scores: no change */
    for (int w = 0; w < p.n_win; w++) {
      double d = fabs((double)score_after[map[w]] - score_before[map[w]] - (acc ? mass[w] : 0));
      me = d > me ? d : me;
    }
  } else
    e2 = 1, r2 = 1e-30;
  *mass_err = me > *mass_err ? me : *mass_err;
  free(p.win), free(p.seq_win), free(map), free(out), free(mass);
  return sqrt(e2 / (r2 > 0 ? r2 : 1));
}

/* kv_gpu_pool_usage of a tiered cache against its device state st: in use, the held FULL pages
 * and the slabs holding a ledger; the peak bounds it, stays within the pool and never falls
 * (*peak: the last one seen). */
static void check_pool_tiered(kv_gpu_t *g, const tstate_t *st, long *peak) {
  const kc_route_t *r = &g->t->rt;
  uint8_t *slab = calloc((size_t)r->n_units, 1);
  long want = 0;
  for (size_t i = 0; i < st->nw; i++) {
    int u = st->ledger[i] >= 0 ? st->ledger[i] / r->led_per : -1;
    want += st->page[i] >= 0;
    if (u >= 0 && u < r->n_units && !slab[u]) slab[u] = 1, want++;
  }
  kv_gpu_pool_t pu;
  CHECK_OK(kv_gpu_pool_usage(&g->base, &pu));
  if (pu.units_in_use != want || pu.units_peak < pu.units_in_use || pu.units_peak < *peak ||
      pu.units_peak > pu.units_total)
    fprintf(stderr,
            "FAIL pool usage: %ld units in use (device state: %ld), peak %ld (was %ld) of %ld\n",
            pu.units_in_use, want, pu.units_peak, *peak, pu.units_total);
  CHECK(pu.units_in_use == want && pu.units_in_use > 0);
  CHECK(pu.units_peak >= pu.units_in_use && pu.units_peak >= *peak);
  CHECK(pu.units_peak <= pu.units_total && pu.units_total == r->n_units);
  CHECK(pu.unit_bytes == g->page_bytes && pu.arena_bytes == g->arena_bytes);
  *peak = pu.units_peak;
  free(slab);
}

/* A recency policy's tiers follow position: at the end, no FULL or INT2 window of a routed
 * layer is older than an EVICTED one past the sink (kivi, streaming). */
static int check_recency_order(kv_gpu_t *g, const tstate_t *st, int n_slots) {
  const kc_route_t *r = &g->t->rt;
  int bad = 0;
  for (int l = 0; l < g->base.geom.n_layer; l++)
    for (int s = 0; s < n_slots; s++) {
      int lim = g->seqs[s].len - r->n_local, A = lim > 0 ? lim / g->omega : 0, evicted = -1;
      for (int w = r->sink_win; w < A; w++) {
        const kern_pwin_t *d = &st->win[kv_gpu__tab_index(g, l, s, w)];
        if (d->n_tok > 0 && d->tier == KERN_PW_EVICTED) evicted = w;
      }
      for (int w = r->sink_win; w < evicted; w++)
        bad += st->win[kv_gpu__tab_index(g, l, s, w)].tier != KERN_PW_EVICTED;
    }
  return bad;
}

/* The slots' layer budgets as set at open, against what the budget allows independently of how
 * they were computed: the layers' B_hist plus their floors within the slot's budget, none past
 * the slot's windows at Full (cap: all a layer can use); even over the layers, or with pyramid
 * budgets kv_pyramid_share_capped's shares of what exceeds the floors, to the byte. Returns the
 * violations. */
static int check_layer_budgets(const kv_gpu_t *g, int n_slots) {
  const int L = g->base.geom.n_layer;
  int bad = 0;
  for (int s = 0; s < n_slots; s++) {
    size_t floor = 0, full = 0, b = g->t->budget[s];
    CHECK_OK(kv_gpu_bounds(&g->base.geom, &g->t->cfg, g->seqs[s].capacity, &floor, NULL, &full));
    const int64_t cap = (int64_t)(full / (size_t)L - floor), first = bhist(g, 0, s);
    int64_t sum = 0;
    for (int l = 0; l < L; l++) {
      const int64_t h = bhist(g, l, s);
      sum += h + (int64_t)floor;
      bad += h < 0 || (g->t->cfg.pyramid && h > cap);
      if (g->t->cfg.pyramid)
        bad += h != (int64_t)kv_pyramid_share_capped(b - floor * (size_t)L, (size_t)cap, l, L);
      else
        bad += h != first;
    }
    bad += sum > (int64_t)b;
  }
  return bad;
}

/* PyramidKV at a budget of 1 (every window at Full): each layer's B_hist is the slot's windows
 * at Full, so no layer evicts (the uncapped 1.5x-0.5x split had left the deeper layers short). */
static void check_pyramid_full(void) {
  kv_geom_t ge = {4, 8, 2, 128, 2};
  kern_rope_t rope = {KERN_ROPE_NORM, 128, 500000.0f, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 0};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("pyramidkv", &d));
  d.cfg.omega = 8;
  kv_cache_t *kv = NULL;
  CHECK_OK(kv_gpu_create_tiered(g_gpu, &ge, &rope, &d.cfg, 300, 2, 1.0, 0, &kv));
  if (!kv) return;
  kv_gpu_t *g = (kv_gpu_t *)kv;
  for (int s = 0; s < 2; s++) CHECK_OK(kv->ops->seq_open(kv, s, s ? 300 : 37));
  size_t floor = 0, full = 0;
  int short_layers = 0;
  for (int s = 0; s < 2; s++) {
    CHECK_OK(kv_gpu_bounds(&ge, &g->t->cfg, g->seqs[s].capacity, &floor, NULL, &full));
    for (int l = 0; l < ge.n_layer; l++)
      short_layers += bhist(g, l, s) != (int64_t)(full / (size_t)ge.n_layer - floor);
  }
  fprintf(stderr, "pyramidkv at budget 1: %d (layer, slot) B_hist short of the slot's windows\n",
          short_layers);
  CHECK(short_layers == 0 && check_layer_budgets(g, 2) == 0);
  kv_cache_destroy(kv);
}

/* kc_route_add_masses with SnapKV's pooling against kv_tiered_attn.c's pool_masses rule, on the
 * device alone: random key masses over a fresh slot's 203 positions (slot 1, layer 1); past the
 * sink a window's score is the largest window sum within pool / 2 windows among the windows past
 * the sink, a sink window's its own sum; bit for bit (the same sums in the same order; the
 * maximum is exact), and some window must have been raised by a neighbour. */
static void check_pooled_masses(void) {
  kv_geom_t ge = {2, 8, 2, 64, 2};
  kern_rope_t rope = {KERN_ROPE_NORM, 64, 10000.0f, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 0};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("snapkv", &d));
  d.cfg.omega = 8;
  kv_cache_t *kv = NULL;
  enum { N = 203, CAP = 256 };
  CHECK_OK(kv_gpu_create_tiered(g_gpu, &ge, &rope, &d.cfg, CAP, 2, 0.3, 0, &kv));
  if (!kv) return;
  kv_gpu_t *g = (kv_gpu_t *)kv;
  const kc_route_t *r = &g->t->rt;
  /* a pass may carry a whole prompt: the pool's room is at least two prompts' windows */
  CHECK(kv_cache_prompt_room(kv) >= CAP);
  CHECK_OK(kv->ops->seq_open(kv, 1, CAP));
  float *m = randv(N), got[(N + 7) / 8], ws[(N + 7) / 8];
  for (int t = 0; t < N; t++) m[t] = fabsf(m[t]);
  float *dm = dput(m, sizeof(float) * N);
  CHECK_OK(kc_route_add_masses(r, 1, 1, dm, N, g->stream));
  CHECK_OK(kc_stream_sync(g->stream));
  const int nw = (N + r->omega - 1) / r->omega, h = r->pool / 2;
  dget(got, r->score + kv_gpu__tab_index(g, 1, 1, 0), sizeof(float) * (size_t)nw);
  int bad = 0, raised = 0;
  for (int w = 0; w < nw; w++) {
    ws[w] = 0.0f;
    for (int t = w * r->omega; t < (w + 1) * r->omega && t < N; t++) ws[w] += m[t];
  }
  for (int w = 0; w < nw; w++) {
    float want = ws[w];
    if (w >= r->sink_win) /* the sink's windows keep their own sums */
      for (int j = w - h; j <= w + h; j++)
        if (j >= r->sink_win && j < nw && ws[j] > want) want = ws[j];
    bad += got[w] != want, raised += want != ws[w];
  }
  fprintf(stderr,
          "kc_route_add_masses, SnapKV pooling (pool %d, %d windows, %d in the sink): %d "
          "mismatches, %d windows raised by a neighbour\n",
          r->pool, nw, r->sink_win, bad, raised);
  CHECK(r->pool == 7 && bad == 0 && raised > 0);
  kern_free(g_gpu, dm), free(m);
  kv_cache_destroy(kv);
}

static void check_tiered(const char *policy, int frame, int n_head, int n_kv, int hd, double frac,
                         int steps, int omega) {
  kv_geom_t ge = {2, n_head, n_kv, hd, 3};
  kern_rope_t rope = {KERN_ROPE_NORM, hd, 500000.0f, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 0};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find(policy, &d));
  d.cfg.quant.key_frame = frame;
  if (omega) d.cfg.omega = omega; /* (0: the policy's) */
  kv_cache_t *kv = NULL;
  int cap = 64 + 160 + steps, prompt[3] = {160, 97, 64}, slots[3] = {0, 1, 2};
  CHECK_OK(kv_gpu_create_tiered(g_gpu, &ge, &rope, &d.cfg, cap, 3, frac, 0, &kv));
  if (!kv) return;
  kv_gpu_t *g = (kv_gpu_t *)kv;
  CHECK(kv_gpu_is_tiered(kv));
  for (int s = 0; s < 3; s++) CHECK_OK(kv->ops->seq_open(kv, s, cap));
  CHECK(check_layer_budgets(g, 3) == 0);
  int nq = n_head * hd, row = n_kv * hd, max_tok = 512, bad_inv = 0, bad_dec = 0, events = 0;
  float *dq = kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * nq);
  float *dout = kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * nq);
  float *dk = kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * row);
  float *dv = kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * row);
  float *got = malloc(sizeof(float) * 3 * nq);
  double worst = 0, mass_err = 0;
  int *aged0 = calloc((size_t)ge.n_layer * 3, sizeof(int));
  long peak = 0;
  for (int t = -1; t < steps; t++) { /* t = -1: the prompts */
    int n = 0, lens[3];
    for (int s = 0; s < 3; s++) lens[s] = t < 0 ? prompt[s] : 1, n += lens[s];
    float *q = randv((size_t)n * nq), *k = randv((size_t)n * row), *v = randv((size_t)n * row);
    CHECK_OK(g_gpu->ops->upload(g_gpu, dq, q, sizeof(float) * (size_t)n * nq));
    CHECK_OK(g_gpu->ops->upload(g_gpu, dk, k, sizeof(float) * (size_t)n * row));
    CHECK_OK(g_gpu->ops->upload(g_gpu, dv, v, sizeof(float) * (size_t)n * row));
    tstate_t before, after;
    tstate_get(g, &before);
    for (int l = 0; l < ge.n_layer; l++) {
      kv_attn_req_t rq[3];
      for (int s = 0, off = 0; s < 3; s++) {
        int pos0 = t < 0 ? 0 : prompt[s] + t;
        CHECK_OK(kv->ops->store(kv, s, l, pos0, lens[s], dk + (size_t)off * row,
                                dv + (size_t)off * row));
        rq[s] = (kv_attn_req_t){s, pos0, lens[s], dq + (size_t)off * nq, dout + (size_t)off * nq};
        off += lens[s];
      }
      CHECK_OK(kv->ops->attend(kv, l, rq, 3));
      if (t < 0) continue;
      float *sc0 = malloc(sizeof(float) * before.nw);
      memcpy(sc0, before.score, sizeof(float) * before.nw);
      dget(got, dout, sizeof(float) * 3 * nq);
      tstate_t mid;
      tstate_get(g, &mid); /* scores after this layer's attention */
      double e = decode_error(g, &before, l, slots, 3, q, k, v, got, sc0, mid.score, &mass_err);
      worst = e > worst ? e : worst;
      tstate_free(&mid);
      free(sc0);
    }
    tstate_get(g, &after);
    bad_inv += check_invariants(g, &after, slots, 3);
    const int off[3] = {0, lens[0], lens[0] + lens[1]};
    bad_dec += check_decisions(g, &before, &after, slots, 3, aged0, t < 0, &events, k, off);
    check_pool_tiered(g, &after, &peak);
    CHECK_OK(g_gpu->ops->download(g_gpu, aged0, g->t->rt.aged, sizeof(int) * 2 * 3));
    tstate_free(&before), tstate_free(&after);
    free(q), free(k), free(v);
  }
  kv_gpu_stats_t st;
  CHECK_OK(kv_gpu_stats(kv, 0, &st));
  double rms[2];
  long rn[2];
  CHECK_OK(kv_gpu_routing_time(kv, rms, rn));
  CHECK(rn[0] == ge.n_layer && rn[1] > 0 && rms[0] > 0 && rms[1] > 0);
  fprintf(stderr, "  routing passes: %ld after prefill (%.3f ms), %ld in decode (%.3f ms)\n", rn[0],
          rms[0], rn[1], rms[1]);
  CHECK(st.err_flags == 0);
  CHECK(bad_inv == 0);
  CHECK(bad_dec == 0);
  CHECK(worst < 1e-2);
  CHECK(mass_err < 1e-3);
  if (g->t->rt.use_int2) CHECK(st.windows[1] > 0); /* the budget made it quantize */
  if (!g->t->rt.use_int2) CHECK(st.windows[1] == 0 && st.windows[2] > 0); /* h2o: it evicted */
  if (g->t->rt.recency) {
    tstate_t fin;
    tstate_get(g, &fin);
    int bad_order = check_recency_order(g, &fin, 3);
    CHECK(bad_order == 0);
    CHECK(st.windows[2] > 0); /* the budget made it evict the oldest */
    tstate_free(&fin);
  }
  fprintf(stderr,
          "kv_gpu tiered (%s, %s keys, budget %.2f, windows of %d): GQA %d/%d, head_dim %d, %d "
          "steps: decode "
          "error %.2e, mass error %.2e, %d routing events checked against kv_route_decide (%d "
          "mismatches), %d invariant violations; slot 0 Full/INT2/Evicted %ld/%ld/%ld, "
          "promotions %ld, demotions %ld, bytes %zu of %zu\n",
          policy, frame == KV_KEY_FRAME_ABS ? "post-RoPE" : "pre-RoPE", frac, g->omega, n_head,
          n_kv, hd, steps, worst, mass_err, events, bad_dec, bad_inv, st.windows[0], st.windows[1],
          st.windows[2], st.promotions, st.demotions, st.bytes, st.budget);
  /* every unit comes back: free, or a slab whose slots are all free; no spare left */
  for (int s = 0; s < 3; s++) kv->ops->seq_close(kv, s);
  int32_t tops[4];
  dget(tops, g->t->rt.page_top, sizeof tops);
  const kc_route_t *r = &g->t->rt;
  CHECK(tops[3] == 0);
  CHECK((long)tops[0] * r->led_per + tops[1] == (long)r->n_units * r->led_per);
  kv_gpu_pool_t pu;
  CHECK_OK(kv_gpu_pool_usage(kv, &pu));
  if (pu.units_in_use != 0 || pu.units_peak != peak)
    fprintf(stderr, "FAIL pool usage after close: %ld units in use, peak %ld (was %ld)\n",
            pu.units_in_use, pu.units_peak, peak);
  CHECK(pu.units_in_use == 0 && pu.units_peak == peak);
  fprintf(stderr,
          "  pool: %d units (%d ledgers each): %d free units and %d free ledger slots after "
          "close; peak %ld units in use\n",
          r->n_units, r->led_per, tops[0], tops[1], peak);
  kern_free(g_gpu, dq), kern_free(g_gpu, dout), kern_free(g_gpu, dk), kern_free(g_gpu, dv);
  free(got), free(aged0);
  kv_cache_destroy(kv);
}

/* ---- the observers: the GPU tiered cache's stream against the CPU tiered cache's ----------- */

/* One observation, copied. */
typedef struct {
  kv_obs_t o; /* o.mass, o.tier: unset (the copies below) */
  int has_mass;
  float *mass;
  int *tier;
} obs_rec_t;

typedef struct {
  obs_rec_t *r;
  int n, cap;
} obs_log_t;

static void obs_log(void *ud, const kv_obs_t *o) {
  obs_log_t *l = ud;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 256;
    l->r = realloc(l->r, sizeof *l->r * (size_t)l->cap);
  }
  obs_rec_t *r = &l->r[l->n++];
  size_t n = (size_t)o->n_wins + 1;
  *r = (obs_rec_t){*o, o->mass != NULL, calloc(n, sizeof(float)), calloc(n, sizeof(int))};
  if (o->mass) memcpy(r->mass, o->mass, sizeof(float) * (size_t)o->n_wins);
  memcpy(r->tier, o->tier, sizeof(int) * (size_t)o->n_wins);
  r->o.mass = NULL, r->o.tier = NULL;
}

static void obs_log_free(obs_log_t *l) {
  for (int i = 0; i < l->n; i++) free(l->r[i].mass), free(l->r[i].tier);
  free(l->r);
  memset(l, 0, sizeof *l);
}

/* The inputs of one comparison: slots 0 and 1 prefill prompt[s] tokens in one call per layer, then
 * decode `steps` tokens each, both in every call. Keys (post-RoPE) are s_w * u[kv head], where
 * s_w = 3/8 (W - w) falls with the token's window w and u has +-1/4 in every channel but the two
 * RoPE rotates (n_rot 2): windows are exact in bf16 and quantize exactly (per channel their
 * pre-RoPE keys are equal), so INT2 windows are attended as Full ones. Queries are 2 u: every
 * window's logit is 0.97 s_w, 0.36 above the next newer window's, so at every step an older
 * window gets at least 1.4 times the mass of a newer one (or any share when evicted), and
 * cumulative scores rank windows by age on both caches, far from ties that a 1% difference
 * between the CPU's fp32 and the GPU's fp16/bf16 arithmetic could flip. Values are random. */
typedef struct {
  kv_geom_t ge;
  kern_rope_t rope;
  kv_policy_cfg_t cfg;
  int prompt[2], steps, cap, W;
  float *u; /* [n_kv][head_dim] */
} obs_case_t;

/* Host q, k, v of n tokens of one slot from position pos0 ([n][n_head * hd], [n][row] twice). */
static void obs_tokens(const obs_case_t *c, int pos0, int n, float *q, float *k, float *v) {
  int hd = c->ge.head_dim, nkv = c->ge.n_kv_head, grp = c->ge.n_head / nkv;
  for (int t = 0; t < n; t++) {
    float sw = 3.0f / 8.0f * (float)(c->W - (pos0 + t) / c->cfg.omega);
    for (int h = 0; h < c->ge.n_head; h++)
      for (int d = 0; d < hd; d++)
        q[((size_t)t * c->ge.n_head + h) * hd + d] = 2.0f * c->u[(size_t)(h / grp) * hd + d];
    for (int j = 0; j < nkv * hd; j++) {
      k[(size_t)t * nkv * hd + j] = sw * c->u[j];
      v[(size_t)t * nkv * hd + j] = qe_bf16_to_f32(qe_f32_to_bf16(tu_randf(&rs, -2.0f, 2.0f)));
    }
  }
}

/* Routing costs of one cache: a Full and an INT2 window (with their bookkeeping), and the
 * per-layer floor (sink and protected windows). */
typedef struct {
  double full, quant, floor;
} obs_cost_t;

static obs_cost_t cpu_cost(const kv_cache_t *kv) {
  const kv_tiered_t *t = (const kv_tiered_t *)kv;
  return (obs_cost_t){(double)(t->page_bytes + t->meta_bytes),
                      (double)(t->ledger_bytes + t->meta_bytes),
                      (double)(t->sink_bytes + t->local_reserve)};
}

static obs_cost_t gpu_cost(const kv_cache_t *kv) {
  const kv_gpu_t *g = (const kv_gpu_t *)kv;
  return (obs_cost_t){(double)(g->page_bytes + KVG_META), (double)(g->t->rt.lay.total + KVG_META),
                      (double)g->t->floor};
}

/* The history budget per layer (B_hist) under which routing keeps nf windows Full and nq INT2
 * whenever there are more candidates, and keeps everything Full only with fewer than nf + nq + 1
 * (B = nf F + (nq + 1/2) Q: Full fills (1 - q) B, at least nf F and 2% of F short of (nf + 1)
 * F; INT2 takes what Full leaves). 0 when no such budget exists for this cache. */
static double obs_bhist(const obs_cost_t *c, float q, int nf, int nq) {
  double b = nf * c->full + (nq + 0.5) * c->quant, fcap = (1.0 - q) * b;
  if ((q == 1.0f && nf) || (q == 0.0f && nq)) return 0;
  if (q < 1.0f && (fcap < nf * c->full + 0.02 * c->full || fcap > (nf + 1 - 0.02) * c->full))
    return 0;
  return b;
}

/* Slot budgets (all layers) that make both caches keep the same counts: the fewest kept windows,
 * from 3 to max_kept, with at least one Full (q < 1) and one INT2 (q > 0). 0, or -1 when none
 * works. */
static int obs_budgets(const obs_case_t *c, const obs_cost_t *cc, const obs_cost_t *gc,
                       int max_kept, size_t *bc, size_t *bg, int *nf_out, int *nq_out) {
  float q = c->cfg.q;
  for (int kept = 3; kept <= max_kept; kept++)
    for (int nf = q < 1.0f; nf <= kept - (q > 0.0f); nf++) {
      double hc = obs_bhist(cc, q, nf, kept - nf), hg = obs_bhist(gc, q, nf, kept - nf);
      if (hc <= 0 || hg <= 0) continue;
      *bc = (size_t)ceil(cc->floor + hc) * (size_t)c->ge.n_layer;
      *bg = (size_t)ceil(gc->floor + hg) * (size_t)c->ge.n_layer;
      *nf_out = nf, *nq_out = kept - nf;
      return 0;
    }
  return -1;
}

/* Runs the case on kv (gpu: device buffers, else host), observed into log when log is given;
 * out_all [(steps + 1) * n_layer][2][n_head * hd] gets every decode output (GPU runs). */
static void obs_run(const obs_case_t *c, kv_cache_t *kv, int gpu, size_t budget, obs_log_t *log,
                    float *out_all) {
  int nq = c->ge.n_head * c->ge.head_dim, row = c->ge.n_kv_head * c->ge.head_dim;
  int max_tok = c->prompt[0] + c->prompt[1];
  float *q = malloc(sizeof(float) * (size_t)max_tok * nq),
        *k = malloc(sizeof(float) * max_tok * row);
  float *v = malloc(sizeof(float) * (size_t)max_tok * row),
        *out = malloc(sizeof(float) * max_tok * nq);
  float *dq = gpu ? kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * nq) : q;
  float *dk = gpu ? kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * row) : k;
  float *dv = gpu ? kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * row) : v;
  float *dout = gpu ? kern_alloc(g_gpu, sizeof(float) * (size_t)max_tok * nq) : out;
  for (int s = 0; s < 2; s++) {
    CHECK_OK(gpu ? kv_gpu_set_budget(kv, s, budget) : kv_tiered_set_budget(kv, s, budget));
    CHECK_OK(kv->ops->seq_open(kv, s, c->cap));
  }
  CHECK_OK(kv_cache_set_observer(kv, log ? obs_log : NULL, log));
  rs = 0x6f6273ULL; /* the same values on every run */
  for (int t = -1; t < c->steps; t++) {
    int n[2], pos0[2], off[2] = {0, 0};
    for (int s = 0; s < 2; s++) {
      n[s] = t < 0 ? c->prompt[s] : 1, pos0[s] = t < 0 ? 0 : c->prompt[s] + t;
      off[s] = s ? n[0] : 0;
      obs_tokens(c, pos0[s], n[s], q + (size_t)off[s] * nq, k + (size_t)off[s] * row,
                 v + (size_t)off[s] * row);
    }
    int total = n[0] + n[1];
    if (gpu) {
      CHECK_OK(g_gpu->ops->upload(g_gpu, dq, q, sizeof(float) * (size_t)total * nq));
      CHECK_OK(g_gpu->ops->upload(g_gpu, dk, k, sizeof(float) * (size_t)total * row));
      CHECK_OK(g_gpu->ops->upload(g_gpu, dv, v, sizeof(float) * (size_t)total * row));
    }
    for (int l = 0; l < c->ge.n_layer; l++) {
      kv_attn_req_t rq[2];
      for (int s = 0; s < 2; s++) {
        CHECK_OK(kv->ops->store(kv, s, l, pos0[s], n[s], dk + (size_t)off[s] * row,
                                dv + (size_t)off[s] * row));
        rq[s] =
            (kv_attn_req_t){s, pos0[s], n[s], dq + (size_t)off[s] * nq, dout + (size_t)off[s] * nq};
      }
      CHECK_OK(kv->ops->attend(kv, l, rq, 2));
      if (out_all && t >= 0)
        dget(out_all + ((size_t)t * c->ge.n_layer + l) * 2 * nq, dout, sizeof(float) * 2 * nq);
    }
  }
  CHECK_OK(kv_cache_set_observer(kv, NULL, NULL));
  if (gpu) kern_free(g_gpu, dq), kern_free(g_gpu, dk), kern_free(g_gpu, dv), kern_free(g_gpu, dout);
  free(q), free(k), free(v), free(out);
}

/* Mass tolerance for nm queries' summed mass m (the CPU's): 2e-4 per query plus 2% of m. The
 * GPU's decode rounds the scaled query to fp16 (relative 2^-11: at most 4e-3 of a logit of 7.3,
 * under 1% of a window's share) and its prefill rounds probabilities to bf16 (2^-9); a window
 * off by one, a score in place of a step's mass or the sink counted as a window is off by 40% or
 * more. */
static int mass_ok(float got, float want, int nm) {
  return fabs((double)got - want) <= 2e-4 * nm + 2e-2 * fabs((double)want);
}

/* Compares two observation streams record by record: kinds, slots, layers, lengths, query
 * counts, windows, aged counts and tiers exactly, masses and sink masses within mass_ok; the
 * GPU's step masses sum with the sink to the queries observed (nm). Returns the mismatches. */
static int obs_compare(const obs_log_t *cpu, const obs_log_t *gpu, int n_obs) {
  int bad = cpu->n != gpu->n;
  for (int i = 0; i < cpu->n && i < gpu->n; i++) {
    const obs_rec_t *a = &cpu->r[i], *b = &gpu->r[i];
    const kv_obs_t *x = &a->o, *y = &b->o;
    int nm = x->n_q < n_obs ? x->n_q : n_obs, hdr = 0, tiers = 0, mass = 0;
    hdr = x->kind != y->kind || x->seq != y->seq || x->layer != y->layer || x->len != y->len ||
          x->n_q != y->n_q || x->n_wins != y->n_wins || x->n_aged != y->n_aged ||
          a->has_mass != b->has_mass || a->has_mass != (x->kind == KV_OBS_STEP);
    double sum = y->sink_mass;
    for (int w = 0; !hdr && w < x->n_wins; w++) {
      tiers += a->tier[w] != b->tier[w];
      mass += a->has_mass && !mass_ok(b->mass[w], a->mass[w], nm);
      sum += b->mass[w];
    }
    if (!hdr && a->has_mass)
      mass += !mass_ok(y->sink_mass, x->sink_mass, nm) || fabs(sum - nm) > 1e-2 * nm;
    if ((hdr || tiers || mass) && bad < 5)
      fprintf(stderr,
              "FAIL observation %d: cpu kind %d seq %d layer %d len %d n_q %d wins %d aged %d "
              "sink %.5f / gpu kind %d seq %d layer %d len %d n_q %d wins %d aged %d sink %.5f: "
              "%d tiers, %d masses differ\n",
              i, x->kind, x->seq, x->layer, x->len, x->n_q, x->n_wins, x->n_aged, x->sink_mass,
              y->kind, y->seq, y->layer, y->len, y->n_q, y->n_wins, y->n_aged, y->sink_mass, tiers,
              mass);
    bad += hdr || tiers || mass;
  }
  return bad;
}

/* What the CPU stream exercised: routing events, and the tiers of routed windows seen (tiers[3]:
 * Full, INT2, Evicted); decode steps that attended an INT2 window with some mass. */
static void obs_coverage(const obs_log_t *l, long *routes, long tiers[3], long *int2_steps) {
  *routes = *int2_steps = 0, tiers[0] = tiers[1] = tiers[2] = 0;
  for (int i = 0; i < l->n; i++) {
    const obs_rec_t *r = &l->r[i];
    *routes += r->o.kind == KV_OBS_ROUTE;
    int int2 = 0;
    for (int w = 0; w < r->o.n_aged; w++) {
      if (r->o.kind == KV_OBS_ROUTE) tiers[r->tier[w]]++;
      int2 |=
          r->o.kind == KV_OBS_STEP && r->o.n_q == 1 && r->tier[w] == KV_TIER_INT2 && r->mass[w] > 0;
    }
    *int2_steps += int2;
  }
}

/* The same policy on the CPU tiered cache and the GPU's, at budgets that keep the same numbers
 * of Full and INT2 windows: their observation streams agree (obs_compare); observing the GPU
 * cache changes nothing it computes (every decode output and every window score bit-identical
 * to an unobserved run); the runs routed, and with an INT2 tier attended INT2 windows. */
static void check_observers(const char *policy, float q) {
  obs_case_t c = {.ge = {2, 8, 2, 64, 2}, .prompt = {230, 201}, .steps = 88};
  c.rope = (kern_rope_t){KERN_ROPE_NORM, 2, 10000.0f, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 0};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find(policy, &d));
  c.cfg = d.cfg, c.cfg.omega = 16, c.cfg.n_sink = 16, c.cfg.n_local = 32;
  if (q >= 0) c.cfg.q = q;
  c.cap = c.prompt[0] + c.steps, c.W = (c.cap + 15) / 16 + 1;
  int hd = c.ge.head_dim, nkv = c.ge.n_kv_head, L = c.ge.n_layer, nq = c.ge.n_head * hd;
  c.u = malloc(sizeof(float) * (size_t)nkv * hd);
  for (int j = 0; j < nkv * hd; j++) c.u[j] = j % hd < 2 ? 0.0f : (rnd() & 1 ? 0.25f : -0.25f);
  kv_cache_t *cpu = NULL, *gpu = NULL, *gpu2 = NULL;
  CHECK_OK(kv_tiered_create(g_cpu, &c.ge, &c.rope, &c.cfg, 0, &cpu));
  if (cpu) CHECK_OK(kv_tiered_reserve(cpu, 2, c.cap));
  CHECK_OK(kv_gpu_create_tiered(g_gpu, &c.ge, &c.rope, &c.cfg, c.cap, 2, 1.0, 0, &gpu));
  CHECK_OK(kv_gpu_create_tiered(g_gpu, &c.ge, &c.rope, &c.cfg, c.cap, 2, 1.0, 0, &gpu2));
  if (!cpu || !gpu || !gpu2) return;
  obs_cost_t cc = cpu_cost(cpu), gc = gpu_cost(gpu);
  size_t bc = 0, bg = 0;
  int nf = 0, nqw = 0, aged = (c.prompt[1] - c.cfg.n_local) / 16 - 1; /* slot 1's after prefill */
  CHECK(obs_budgets(&c, &cc, &gc, aged - 1, &bc, &bg, &nf, &nqw) == 0);
  obs_log_t lc = {0}, lg = {0};
  size_t n_out = (size_t)c.steps * L * 2 * nq;
  float *out1 = malloc(sizeof(float) * n_out), *out2 = malloc(sizeof(float) * n_out);
  obs_run(&c, cpu, 0, bc, &lc, NULL);
  obs_run(&c, gpu, 1, bg, &lg, out1);
  obs_run(&c, gpu2, 1, bg, NULL, out2);
  kv_gpu_t *g1 = (kv_gpu_t *)gpu, *g2 = (kv_gpu_t *)gpu2;
  size_t nw = (size_t)L * c.ge.max_seqs * g1->max_win;
  float *sc1 = malloc(sizeof(float) * nw), *sc2 = malloc(sizeof(float) * nw);
  dget(sc1, g1->t->rt.score, sizeof(float) * nw), dget(sc2, g2->t->rt.score, sizeof(float) * nw);
  int bad = obs_compare(&lc, &lg, c.cfg.n_obs);
  long routes, tiers[3], int2_steps;
  obs_coverage(&lc, &routes, tiers, &int2_steps);
  kv_gpu_stats_t st;
  CHECK_OK(kv_gpu_stats(gpu, 0, &st));
  fprintf(stderr,
          "observers (%s, q %.2f: %d Full + %d INT2 kept): %d CPU / %d GPU observations, %d "
          "mismatches; %ld routing events (routed windows F/Q/E %ld/%ld/%ld), %ld decode steps "
          "attending INT2; observed GPU run bit-identical: outputs %s, scores %s\n",
          policy, c.cfg.q, nf, nqw, lc.n, lg.n, bad, routes, tiers[0], tiers[1], tiers[2],
          int2_steps, memcmp(out1, out2, sizeof(float) * n_out) ? "NO" : "yes",
          memcmp(sc1, sc2, sizeof(float) * nw) ? "NO" : "yes");
  CHECK(bad == 0 && lc.n > 0);
  CHECK(memcmp(out1, out2, sizeof(float) * n_out) == 0);
  CHECK(memcmp(sc1, sc2, sizeof(float) * nw) == 0);
  CHECK(st.err_flags == 0);
  CHECK(routes > 2 * L && tiers[2] > 0 && (nf == 0 || tiers[0] > 0));
  CHECK(c.cfg.q == 0.0f || (tiers[1] > 0 && int2_steps > 0));
  obs_log_free(&lc), obs_log_free(&lg);
  free(out1), free(out2), free(sc1), free(sc2), free(c.u);
  kv_cache_destroy(cpu), kv_cache_destroy(gpu), kv_cache_destroy(gpu2);
}

/* A lockstep batch whose budget holds its prompts: pressure begins for every (slot, layer) in
 * one routing pass, which demotes many windows at once (the new ledgers must not each take a
 * unit of their own, and the pass's demoted pages and new ledgers must fit the pool): 32 slots,
 * prompts of 256, capacity 1,280, QEvict at frac, decoded past the onset; no pool fault, every
 * slot within its budget, INT2 windows made. */
static void check_onset(double frac, int steps) {
  enum { S = 32, P = 256, CAP = 1280 };
  kv_geom_t ge = {4, 8, 2, 128, S};
  kern_rope_t rope = {KERN_ROPE_NORM, 128, 500000.0f, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 0};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("qevict", &d));
  kv_cache_t *kv = NULL;
  CHECK_OK(kv_gpu_create_tiered(g_gpu, &ge, &rope, &d.cfg, CAP, S, frac, 0, &kv));
  if (!kv) return;
  const int nq = ge.n_head * ge.head_dim, row = ge.n_kv_head * ge.head_dim;
  for (int s = 0; s < S; s++) CHECK_OK(kv->ops->seq_open(kv, s, CAP));
  float *q = randv((size_t)S * P * nq), *k = randv((size_t)S * P * row);
  float *dq = dput(q, sizeof(float) * (size_t)S * P * nq),
        *dk = dput(k, sizeof(float) * S * P * row);
  float *dout = kern_alloc(g_gpu, sizeof(float) * (size_t)S * P * nq);
  for (int t = -1; t < steps; t++) { /* t = -1: the prompts */
    const int n = t < 0 ? P : 1;
    for (int l = 0; l < ge.n_layer; l++) {
      kv_attn_req_t rq[S];
      for (int s = 0; s < S; s++) {
        const int pos0 = t < 0 ? 0 : P + t;
        const size_t off = (size_t)s * n;
        CHECK_OK(kv->ops->store(kv, s, l, pos0, n, dk + off * row, dk + off * row));
        rq[s] = (kv_attn_req_t){s, pos0, n, dq + off * nq, dout + off * nq};
      }
      CHECK_OK(kv->ops->attend(kv, l, rq, S));
    }
  }
  int over = 0, faults = 0;
  long int2 = 0;
  for (int s = 0; s < S; s++) {
    kv_gpu_stats_t st;
    CHECK_OK(kv_gpu_stats(kv, s, &st));
    over += st.bytes > st.budget, faults |= st.err_flags, int2 += st.windows[1];
  }
  kv_gpu_pool_t pu;
  CHECK_OK(kv_gpu_pool_usage(kv, &pu));
  fprintf(stderr,
          "kv_gpu lockstep onset (qevict %.2f, %d slots x %d layers, %d steps): pool %ld units, "
          "peak %ld; err flags %d, slots over budget %d, INT2 windows %ld\n",
          frac, S, ge.n_layer, steps, pu.units_total, pu.units_peak, faults, over, int2);
  CHECK(faults == 0);
  CHECK(over == 0);
  CHECK(int2 > 0);
  kern_free(g_gpu, dq), kern_free(g_gpu, dk), kern_free(g_gpu, dout);
  free(q), free(k);
  kv_cache_destroy(kv);
}

/* A slot's FullKV bytes by kv_tiered's rule in the GPU's windows (the sink rounded up to whole
 * windows), computed here apart from kv_gpu_bounds: the sink's windows, the protected ones (the
 * local region's and one in flight; every window past the sink when none can age) and the
 * windows past the sink that can age, each a FULL page and its bookkeeping, every window once. */
static size_t fullkv_want(const kv_geom_t *ge, const kv_policy_cfg_t *c, long n) {
  const long o = c->omega, sink_tok = (c->n_sink + o - 1) / o * o,
             sink = n < sink_tok ? n : sink_tok;
  const long sw = (sink + o - 1) / o, past = n - sink, wins = (past + o - 1) / o;
  const long prot = (c->n_local + o - 1) / o + 1, ages = past > c->n_local;
  const long per = sw + (ages ? (prot < wins ? prot : wins) + wins : wins);
  return (size_t)per * (kv_gpu_page_bytes(ge, (int)o) + KVG_META) * (size_t)ge->n_layer;
}

/* A slot at its FullKV budget (fullkv_want at its capacity, which kv_gpu_bounds must give): every
 * token stays FULL within the budget, attended as the FullKV cache does, and every layer's B_hist
 * holds its windows past the sink (PyramidKV's shares capped at them). With a sink or local region
 * longer than the slot the budget is the slot's windows; the whole regions' minimum had refused
 * it, then the sink and local windows had been counted each up to all of the slot's windows, and
 * the sink's windows twice in FullKV (budgets above it; pyramid's cap above the history, so at
 * this budget the deeper layers evicted). P prompt tokens, then decode to C. */
static void check_fullkv_slot(const char *policy, int omega, int sink, int local, int P, int C) {
  enum { S = 2 };
  kv_geom_t ge = {4, 8, 2, 128, S};
  kern_rope_t rope = {KERN_ROPE_NORM, 128, 500000.0f, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 0};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find(policy, &d));
  if (omega) d.cfg.omega = omega;
  d.cfg.n_sink = sink, d.cfg.n_local = local;
  size_t full = 0, floor = 0;
  const size_t want = fullkv_want(&ge, &d.cfg, C);
  CHECK_OK(kv_gpu_bounds(&ge, &d.cfg, C, &floor, NULL, &full));
  kv_cache_t *kv = NULL, *ref = NULL;
  CHECK_OK(kv_gpu_create_tiered(g_gpu, &ge, &rope, &d.cfg, C, S, 1.0, 0, &kv));
  CHECK_OK(
      kv_gpu_create(g_gpu, &ge, KV_GPU_OMEGA, C, kv_gpu_pool_bytes(&ge, KV_GPU_OMEGA, S, C), &ref));
  if (!kv || !ref) return;
  kv_gpu_t *g = (kv_gpu_t *)kv;
  const int o = g->omega, sw = (sink + o - 1) / o, wins = (C + o - 1) / o;
  const int64_t hist = (int64_t)(want / (size_t)ge.n_layer) - (int64_t)floor;
  int short_layers = 0;
  for (int s = 0; s < S; s++) {
    CHECK_OK(kv_gpu_set_budget(kv, s, want));
    CHECK_OK(kv->ops->seq_open(kv, s, C));
    CHECK_OK(ref->ops->seq_open(ref, s, C));
    for (int l = 0; l < ge.n_layer; l++) short_layers += bhist(g, l, s) < hist;
  }
  const int nq = ge.n_head * ge.head_dim, row = ge.n_kv_head * ge.head_dim;
  float *q = randv((size_t)S * C * nq), *k = randv((size_t)S * C * row);
  float *dq = dput(q, sizeof(float) * (size_t)S * C * nq),
        *dk = dput(k, sizeof(float) * (size_t)S * C * row);
  float *o1 = kern_alloc(g_gpu, sizeof(float) * (size_t)S * C * nq),
        *o2 = kern_alloc(g_gpu, sizeof(float) * (size_t)S * C * nq);
  double err = 0;
  for (int t = -1; t < C - P; t++) { /* t = -1: the prompts */
    const int n = t < 0 ? P : 1, pos0 = t < 0 ? 0 : P + t;
    for (int l = 0; l < ge.n_layer; l++) {
      kv_attn_req_t r1[S], r2[S];
      for (int s = 0; s < S; s++) {
        const size_t off = (size_t)s * C + (size_t)pos0;
        for (int c = 0; c < 2; c++) {
          kv_cache_t *x = c ? ref : kv;
          CHECK_OK(x->ops->store(x, s, l, pos0, n, dk + off * row, dk + off * row));
        }
        r1[s] = (kv_attn_req_t){s, pos0, n, dq + off * nq, o1 + off * nq};
        r2[s] = (kv_attn_req_t){s, pos0, n, dq + off * nq, o2 + off * nq};
      }
      CHECK_OK(kv->ops->attend(kv, l, r1, S));
      CHECK_OK(ref->ops->attend(ref, l, r2, S));
    }
  }
  float *h1 = malloc(sizeof(float) * (size_t)S * C * nq), *h2 = malloc(sizeof(float) * S * C * nq);
  dget(h1, o1, sizeof(float) * (size_t)S * C * nq), dget(h2, o2, sizeof(float) * S * C * nq);
  double ref2 = 0; /* normalized error (bf16 P in the FullKV kernel, fp16 in the tiered one) */
  for (size_t i = 0; i < (size_t)S * C * nq; i++) {
    const double e = (double)h1[i] - (double)h2[i];
    err += e * e, ref2 += (double)h2[i] * h2[i];
  }
  err = sqrt(err / (ref2 > 0 ? ref2 : 1));
  int over = 0, faults = 0, lost = 0;
  for (int s = 0; s < S; s++) {
    kv_gpu_stats_t st;
    CHECK_OK(kv_gpu_stats(kv, s, &st));
    over += st.bytes > st.budget, faults |= st.err_flags, lost += st.windows[1] + st.windows[2];
  }
  fprintf(stderr,
          "kv_gpu slot at FullKV (%s, window %d, sink %d, local %d; %d tokens, %d windows, %d in "
          "the sink): FullKV %zu bytes (want %zu), layers short of their history %d, normalized "
          "error against FullKV %.2e, err flags %d, slots over budget %d, windows not FULL %d\n",
          policy, o, sink, local, C, wins, sw < wins ? sw : wins, full, want, short_layers, err,
          faults, over, lost);
  CHECK(full == want && short_layers == 0);
  CHECK(err < 1e-2 && faults == 0 && over == 0 && lost == 0);
  kern_free(g_gpu, dq), kern_free(g_gpu, dk), kern_free(g_gpu, o1), kern_free(g_gpu, o2);
  free(q), free(k), free(h1), free(h2);
  kv_cache_destroy(kv), kv_cache_destroy(ref);
}

int main(int argc, char **argv) {
  int small = argc > 1 && !strcmp(argv[1], "--small"); /* compute-sanitizer runs */
  if (kern_cuda_device_count() <= 0) tu_skip("no CUDA device visible (the CUDA backend is built)");
  CHECK_OK(kern_cpu_create(0, &g_cpu));
  CHECK_OK(kern_cuda_create(0, &g_gpu));
  if (!g_cpu || !g_gpu) return tu_done("kv_gpu");
  check_store_gather(3, 5, 16, 1024, 150);
  check_store_gather(2, 9, 8, 192, 100);
  check_rows(300, 77, small ? 256 : 4096);
  check_cache(8, 2, 128, 16);
  check_cache(8, 2, 128, 4);
  if (!small) check_cache(9, 3, 64, 8), check_cache(32, 8, 128, 64);
  const int POS = KV_KEY_FRAME_POS, ABS = KV_KEY_FRAME_ABS;
  check_tiered("qevict", POS, 8, 2, 128, 0.3, small ? 12 : 80, 0);
  check_tiered("qevict", ABS, 8, 2, 128, 0.3, small ? 12 : 80, 0);
  if (!small) check_tiered("qevict", POS, 9, 3, 64, 0.2, 60, 0);
  if (!small) check_tiered("qevict", ABS, 9, 3, 64, 0.2, 60, 0);
  if (!small) check_tiered("kivi", POS, 8, 2, 128, 0.25, 80, 0);
  /* windows of 4: post-RoPE keys (the kernel's PK 4 tiles), and h2o's FULL-only routing */
  check_tiered("qevict", ABS, 8, 2, 128, 0.3, small ? 12 : 80, 4);
  if (!small) check_tiered("qevict", ABS, 9, 3, 64, 0.15, 60, 4);
  if (!small) check_tiered("h2o", ABS, 8, 2, 128, 0.3, 80, 4);
  /* SnapKV's frozen, pooled prefill scores and PyramidKV's layer budgets, at windows of 8 */
  check_pooled_masses();
  check_tiered("snapkv", ABS, 8, 2, 128, 0.3, small ? 12 : 80, 8);
  if (!small) check_tiered("pyramidkv", ABS, 8, 2, 128, 0.3, 80, 8);
  check_pyramid_full();
  check_graphkv_kernel(small);
  check_mean_keys(KERN_ROPE_NORM, 0);
  check_mean_keys(KERN_ROPE_NORM, 1);
  if (!small) check_mean_keys(KERN_ROPE_NEOX, 0), check_mean_keys(KERN_ROPE_NEOX, 1);
  check_tiered("qevict+graphkv", POS, 8, 2, 128, 0.3, small ? 12 : 80, 0);
  if (!small) check_tiered("qevict+graphkv", POS, 9, 3, 64, 0.2, 60, 0);
  if (!small) check_tiered("qevict+graphkv", ABS, 8, 2, 128, 0.3, 80, 0);
  check_onset(0.2, small ? 16 : 64);
  check_fullkv_slot("qevict", 0, 4096, 32, 90, 100); /* regions longer than the slot */
  check_fullkv_slot("qevict", 0, 5, 4096, 90, 100);
  check_fullkv_slot("qevict", 0, 5, 32, 90, 100);      /* windows age: the sink's window once */
  check_fullkv_slot("pyramidkv", 8, 64, 32, 290, 300); /* 8 sink windows: the deeper layers */
  if (!small) check_onset(0.5, 500);
  check_observers("qevict", 0.3f);
  if (!small) check_observers("kivi", -1), check_observers("streaming", -1);
  if (!small) check_observers("snapkv", -1), check_observers("pyramidkv", -1);
  kv_geom_t bad = {2, 8, 2, 32, 1};
  kv_cache_t *kv = NULL;
  CHECK(kv_gpu_create(g_gpu, &bad, 16, 100, 1 << 20, &kv) == QE_EUNSUPPORTED);
  CHECK(kv_gpu_create(g_cpu, &bad, 16, 100, 1 << 20, &kv) == QE_EINVAL);
  kern_destroy(g_gpu), kern_destroy(g_cpu);
  return tu_done("kv_gpu");
}
