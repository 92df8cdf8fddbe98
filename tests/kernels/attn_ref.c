/* attn_ref: test problems and the fp64 CPU reference of decode attention over tiered paged KV
 * (see attn_ref.h). */
#include "attn_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_quant.h"
#include "qe_half.h"

uint64_t attn_rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double attn_rng_normal(uint64_t *s) {
  double u1 = ((attn_rng_next(s) >> 11) + 0.5) * 0x1.0p-53;
  double u2 = (attn_rng_next(s) >> 11) * 0x1.0p-53;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static uint16_t ref_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float ref_bf16_f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static size_t ref_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* ---------------------------------------------------------------- windows and tiers */

/* Windows of one sequence: (pos0, n_tok) into w, returns the count. */
static int ref_split(const attn_spec_t *s, int len, kern_pwin_t *w) {
  int n = 0, pos = 0;
  if (s->sink > 0 && len > 0) {
    int t = s->sink < len ? s->sink : len;
    w[n].pos0 = 0, w[n].n_tok = t, n++, pos = t;
  }
  while (pos < len) {
    int t = len - pos < s->geom.omega ? len - pos : s->geom.omega;
    w[n].pos0 = pos, w[n].n_tok = t, n++, pos += t;
  }
  return n;
}

/* Tiers of one sequence's n windows: sink and the last n_local FULL, the rest by the spec. */
static void ref_tiers(const attn_spec_t *s, kern_pwin_t *w, int n, uint64_t *rng) {
  int *idx = malloc(sizeof(int) * (size_t)(n + 1)), m = 0, forced = 0;
  for (int i = 0; i < n; i++) {
    int fixed = (i == 0 && s->sink > 0) || i >= n - s->n_local;
    w[i].tier = fixed ? KERN_PW_FULL : KERN_PW_EVICTED;
    forced += fixed;
    if (!fixed) idx[m++] = i;
  }
  for (int i = m - 1; i > 0; i--) { /* shuffle the others */
    int j = (int)(attn_rng_next(rng) % (uint64_t)(i + 1)), t = idx[i];
    idx[i] = idx[j], idx[j] = t;
  }
  for (int k = 0; k < m; k++) {
    int tier = KERN_PW_EVICTED;
    if (s->n_full >= 0) {
      tier = k < s->n_full - forced                ? KERN_PW_FULL
             : k < s->n_full - forced + s->n_quant ? KERN_PW_QUANT
                                                   : KERN_PW_EVICTED;
    } else {
      double u = (attn_rng_next(rng) >> 11) * 0x1.0p-53;
      tier = u < s->p_full ? KERN_PW_FULL : u < s->p_full + s->p_quant ? KERN_PW_QUANT : tier;
    }
    w[idx[k]].tier = tier;
  }
  free(idx);
}

/* ---------------------------------------------------------------- arena */

/* Sizes of a QUANT ledger's sections (each 16-byte aligned), in kern_pwin_t field order. */
static size_t ref_qsections(const kern_paged_geom_t *g, int n_tok, size_t sec[6]) {
  sec[0] = ref_up(kern_paged_codes_bytes(g, n_tok), 16);
  sec[1] = sec[2] = ref_up(kern_paged_kmeta_bytes(g), 16);
  sec[3] = sec[0];
  sec[4] = sec[5] = ref_up(kern_paged_vmeta_bytes(g, n_tok), 16);
  return sec[0] + sec[1] + sec[2] + sec[3] + sec[4] + sec[5];
}

/* Blob sizes (two per window: K and V pages, or the ledger and nothing), shuffled placement. */
static int ref_place(attn_prob_t *p, uint64_t *rng) {
  int nb = 2 * p->n_win;
  size_t *sz = calloc((size_t)nb + 1, sizeof(size_t));
  int *ord = malloc(sizeof(int) * (size_t)(nb + 1));
  if (!sz || !ord) {
    free(sz), free(ord);
    return -1;
  }
  size_t page = kern_paged_full_bytes(&p->geom), sec[6];
  for (int w = 0; w < p->n_win; w++) {
    if (p->win[w].tier == KERN_PW_FULL) sz[2 * w] = sz[2 * w + 1] = page;
    if (p->win[w].tier == KERN_PW_QUANT) sz[2 * w] = ref_qsections(&p->geom, p->win[w].n_tok, sec);
  }
  for (int i = 0; i < nb; i++) ord[i] = i;
  for (int i = nb - 1; i > 0; i--) {
    int j = (int)(attn_rng_next(rng) % (uint64_t)(i + 1)), t = ord[i];
    ord[i] = ord[j], ord[j] = t;
  }
  size_t at = 0, *off = calloc((size_t)nb + 1, sizeof(size_t));
  if (!off) {
    free(sz), free(ord);
    return -1;
  }
  for (int i = 0; i < nb; i++) off[ord[i]] = at, at += ref_up(sz[ord[i]], 64);
  for (int w = 0; w < p->n_win; w++) {
    kern_pwin_t *d = &p->win[w];
    d->k = off[2 * w], d->v = off[2 * w + 1];
    if (d->tier != KERN_PW_QUANT) continue;
    ref_qsections(&p->geom, d->n_tok, sec);
    d->k_scale = d->k + sec[0], d->k_zero = d->k_scale + sec[1];
    d->v = d->k_zero + sec[2], d->v_scale = d->v + sec[3], d->v_zero = d->v_scale + sec[4];
  }
  p->arena_bytes = at > 0 ? at : 64;
  free(sz), free(ord), free(off);
  return 0;
}

/* Random K (with a per-channel bias, keys pre-RoPE for QUANT) and V for one window. */
static void ref_rand_kv(const attn_prob_t *p, const float *bias, int n_tok, float *k, float *v,
                        uint64_t *rng) {
  size_t row = (size_t)p->geom.n_kv * p->geom.head_dim;
  for (int t = 0; t < n_tok; t++)
    for (size_t e = 0; e < row; e++) {
      k[t * row + e] = (float)attn_rng_normal(rng) + bias[e];
      v[t * row + e] = (float)attn_rng_normal(rng);
    }
}

static void ref_fill_window(attn_prob_t *p, const kern_pwin_t *d, const float *bias, float *k,
                            float *v, uint64_t *rng) {
  const kern_paged_geom_t *g = &p->geom;
  size_t row = (size_t)g->n_kv * g->head_dim;
  ref_rand_kv(p, bias, d->n_tok, k, v, rng);
  if (d->tier == KERN_PW_FULL) {
    uint16_t *kp = (uint16_t *)(p->arena + d->k), *vp = (uint16_t *)(p->arena + d->v);
    for (size_t e = 0; e < (size_t)g->omega * row; e++) { /* rows past n_tok: never read */
      kp[e] = e < (size_t)d->n_tok * row ? ref_bf16(k[e]) : 0x7fc0u;
      vp[e] = e < (size_t)d->n_tok * row ? ref_bf16(v[e]) : 0x7fc0u;
    }
    return;
  }
  kv_qparams_t qp = {g->bits, g->group, 0};
  kv_quant_keys(&qp, k, d->n_tok, g->n_kv, g->head_dim, p->arena + d->k,
                (uint16_t *)(p->arena + d->k_scale), (uint16_t *)(p->arena + d->k_zero));
  kv_quant_values(&qp, v, d->n_tok, g->n_kv, g->head_dim, p->arena + d->v,
                  (uint16_t *)(p->arena + d->v_scale), (uint16_t *)(p->arena + d->v_zero));
}

static int ref_fill(attn_prob_t *p, uint64_t *rng) {
  const kern_paged_geom_t *g = &p->geom;
  size_t row = (size_t)g->n_kv * g->head_dim;
  float *k = malloc(sizeof(float) * row * (size_t)g->omega * 2),
        *bias = malloc(sizeof(float) * row);
  if (!k || !bias) {
    free(k), free(bias);
    return -1;
  }
  for (size_t e = 0; e < row; e++) bias[e] = (float)(0.5 * attn_rng_normal(rng));
  memset(p->arena, 0xff, p->arena_bytes); /* gaps and padding hold NaN patterns */
  for (int w = 0; w < p->n_win; w++)
    if (kern_pwin_live(&p->win[w]))
      ref_fill_window(p, &p->win[w], bias, k, k + row * (size_t)g->omega, rng);
  for (size_t i = 0; i < (size_t)p->n_seq * p->n_head * g->head_dim; i++)
    p->q[i] = (float)attn_rng_normal(rng);
  free(k), free(bias);
  return 0;
}

/* ---------------------------------------------------------------- make / free */

static void ref_count(attn_prob_t *p) {
  const kern_paged_geom_t *g = &p->geom;
  size_t sec[6], row2 = (size_t)g->n_kv * g->head_dim * 2 * 2; /* K + V bf16 per token */
  for (int w = 0; w < p->n_win; w++) {
    const kern_pwin_t *d = &p->win[w];
    p->full_bytes += (size_t)d->n_tok * row2;
    if (d->tier == KERN_PW_FULL) p->n_full++, p->kv_bytes += (size_t)d->n_tok * row2;
    if (d->tier == KERN_PW_QUANT) {
      p->n_quant++, p->has_quant = 1;
      ref_qsections(g, d->n_tok, sec);
      p->kv_bytes += 2 * kern_paged_codes_bytes(g, d->n_tok) + 2 * kern_paged_kmeta_bytes(g) +
                     2 * kern_paged_vmeta_bytes(g, d->n_tok);
    }
    if (d->tier == KERN_PW_EVICTED) p->n_evicted++;
  }
}

int attn_prob_make(const attn_spec_t *s, attn_prob_t *p) {
  memset(p, 0, sizeof *p);
  const kern_paged_geom_t *g = &s->geom;
  if (g->omega < 1 || g->n_kv < 1 || s->n_seq < 1 || s->n_head % g->n_kv) return -1;
  uint64_t rng = s->seed * 0x9e3779b97f4a7c15ull + 1;
  p->geom = *g, p->n_seq = s->n_seq, p->n_head = s->n_head, p->abs_keys = s->abs_keys;
  p->scale = 1.0f / sqrtf((float)g->head_dim);
  p->rope =
      (kern_rope_t){s->rope_mode, s->n_rot, s->rope_theta, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 0};
  if (s->rope_yarn)
    p->rope.freq_scale = 0.25f, p->rope.ext_factor = 1.0f, p->rope.n_ctx_orig = 4096;
  int cap = 0;
  for (int b = 0; b < s->n_seq; b++) cap += s->seq_len[b] / g->omega + 2;
  p->win = calloc((size_t)cap + 1, sizeof(kern_pwin_t));
  p->seq_win = calloc((size_t)s->n_seq + 1, sizeof(int32_t));
  p->q = malloc(sizeof(float) * (size_t)s->n_seq * s->n_head * g->head_dim);
  if (!p->win || !p->seq_win || !p->q) goto fail;
  for (int b = 0; b < s->n_seq; b++) {
    int n = ref_split(s, s->seq_len[b], p->win + p->n_win);
    ref_tiers(s, p->win + p->n_win, n, &rng);
    p->max_win = n > p->max_win ? n : p->max_win;
    p->n_win += n;
    p->seq_win[b + 1] = p->n_win;
  }
  if (ref_place(p, &rng)) goto fail;
  ref_count(p);
  if (posix_memalign((void **)&p->arena, 256, p->arena_bytes)) goto fail;
  if (s->realistic && ref_fill(p, &rng)) goto fail;
  return 0;
fail:
  attn_prob_free(p);
  return -1;
}

void attn_prob_free(attn_prob_t *p) {
  if (!p) return;
  free(p->arena), free(p->win), free(p->seq_win), free(p->q);
  memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------- the reference */

/* Keys (post-RoPE) and values of window d as fp32 [n_tok][n_kv][hd]. */
static void ref_window_kv(const attn_prob_t *p, kern_backend_t *be, const kern_pwin_t *d, float *k,
                          float *v, int32_t *pos) {
  const kern_paged_geom_t *g = &p->geom;
  size_t n = (size_t)d->n_tok * g->n_kv * g->head_dim;
  if (d->tier == KERN_PW_FULL) {
    const uint16_t *kp = (const uint16_t *)(p->arena + d->k),
                   *vp = (const uint16_t *)(p->arena + d->v);
    for (size_t e = 0; e < n; e++) k[e] = ref_bf16_f(kp[e]), v[e] = ref_bf16_f(vp[e]);
    return;
  }
  kv_qparams_t qp = {g->bits, g->group, 0};
  kv_dequant_keys(&qp, p->arena + d->k, (const uint16_t *)(p->arena + d->k_scale),
                  (const uint16_t *)(p->arena + d->k_zero), d->n_tok, g->n_kv, g->head_dim, k);
  kv_dequant_values(&qp, p->arena + d->v, (const uint16_t *)(p->arena + d->v_scale),
                    (const uint16_t *)(p->arena + d->v_zero), d->n_tok, g->n_kv, g->head_dim, v);
  if (p->abs_keys) return; /* post-RoPE ledger keys */
  for (int t = 0; t < d->n_tok; t++) pos[t] = d->pos0 + t;
  be->ops->rope(be, k, pos, d->n_tok, g->n_kv, g->head_dim, &p->rope);
}

/* One sequence: gathers its live tokens, then fp64 softmax attention per head. */
static int ref_seq(const attn_prob_t *p, kern_backend_t *be, int b, double *out, double *mass) {
  const kern_paged_geom_t *g = &p->geom;
  const int hd = g->head_dim, grp = p->n_head / g->n_kv, w0 = p->seq_win[b], w1 = p->seq_win[b + 1];
  size_t row = (size_t)g->n_kv * hd;
  int T = 0;
  for (int w = w0; w < w1; w++) T += kern_pwin_live(&p->win[w]) ? p->win[w].n_tok : 0;
  float *K = malloc(sizeof(float) * row * (size_t)(T + g->omega)),
        *V = malloc(sizeof(float) * row * (size_t)(T + g->omega));
  int *tw = malloc(sizeof(int) * (size_t)(T + 1)),
      *pos = malloc(sizeof(int32_t) * (size_t)g->omega);
  double *sc = malloc(sizeof(double) * (size_t)(T + 1));
  int rc = -1, t = 0;
  if (!K || !V || !tw || !pos || !sc) goto out;
  for (int w = w0; w < w1; w++) {
    const kern_pwin_t *d = &p->win[w];
    mass[w] = 0.0;
    if (!kern_pwin_live(d)) continue;
    ref_window_kv(p, be, d, K + (size_t)t * row, V + (size_t)t * row, pos);
    for (int i = 0; i < d->n_tok; i++) tw[t + i] = w;
    t += d->n_tok;
  }
  for (int h = 0; h < p->n_head; h++) {
    const float *q = p->q + ((size_t)b * p->n_head + h) * hd;
    const size_t ko = (size_t)(h / grp) * hd;
    double mx = -INFINITY, sum = 0.0, *o = out + ((size_t)b * p->n_head + h) * hd;
    for (int i = 0; i < T; i++) {
      double s = 0.0;
      for (int d = 0; d < hd; d++) s += (double)q[d] * K[(size_t)i * row + ko + d];
      sc[i] = s * p->scale, mx = sc[i] > mx ? sc[i] : mx;
    }
    for (int d = 0; d < hd; d++) o[d] = 0.0;
    for (int i = 0; i < T; i++) sc[i] = exp(sc[i] - mx), sum += sc[i];
    for (int i = 0; i < T; i++) {
      double pr = sc[i] / sum;
      for (int d = 0; d < hd; d++) o[d] += pr * V[(size_t)i * row + ko + d];
      mass[tw[i]] += pr / p->n_head;
    }
  }
  rc = 0;
out:
  free(K), free(V), free(tw), free(pos), free(sc);
  return rc;
}

int attn_ref_run(const attn_prob_t *p, double *out, double *mass) {
  kern_backend_t *be = NULL;
  if (kern_cpu_create(1, &be)) return -1;
  int rc = 0;
  for (int b = 0; b < p->n_seq && !rc; b++) rc = ref_seq(p, be, b, out, mass);
  kern_destroy(be);
  return rc;
}
