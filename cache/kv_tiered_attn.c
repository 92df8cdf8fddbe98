/* kv_tiered_attn: attention over a sequence's accessible tokens (the sink, Full windows and
 * INT2 windows), one backend attention call for all requests, then the per-window attention
 * masses update the policy scores and aged windows are routed. A decode step on a host backend
 * hands the backend a source of runs (kern_kv_src_t): the sink and Full pages read in place, an
 * INT2 window dequantized a KV head at a time when a thread needs it. Otherwise (prompts, keys
 * kept pre-RoPE or window-relative, QE_TIERED_GATHER=1) every accessible token is gathered
 * into one buffer with explicit positions (INT2 windows dequantized, RoPE re-applied unless
 * post-RoPE): the same bits, and the CPU reference of the fused tiered kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_internal.h"
#include "qe_status.h"

#define KV_TATTN_MAX 64 /* sequences of one backend call (kv_tiered_attend splits a step) */

/* Rotates token j of x [n][n_kv][hd] by sign * (start + step * j). */
static void rotate_by(kv_tiered_t *t, float *x, int start, int step, int n, int sign) {
  int32_t pos[256];
  kern_backend_t *be = t->base.be;
  for (int i = 0; i < n; i += 256) {
    int m = n - i < 256 ? n - i : 256;
    for (int j = 0; j < m; j++) pos[j] = sign * (start + step * (i + j));
    be->ops->rope(be, x + (size_t)i * t->row, pos, m, t->base.geom.n_kv_head, t->base.geom.head_dim,
                  &t->rope);
  }
}

void kv_tiered_rotate(kv_tiered_t *t, float *x, int start, int n, int sign) {
  rotate_by(t, x, start, 1, n, sign);
}

/* Window-relative keys: every token by the window's start (step 0); post-RoPE keys: none. */
void kv_tiered_key_frame(kv_tiered_t *t, float *x, int start, int n, int sign) {
  if (t->cfg.quant.key_frame == KV_KEY_FRAME_ABS) return;
  rotate_by(t, x, start, t->cfg.quant.key_frame == KV_KEY_FRAME_WINDOW ? 0 : 1, n, sign);
}

/* Ledger layout: k codes, k scale, k zero, v codes, v scale, v zero. */
void kv_tiered_dequant(const kv_tiered_t *t, const uint8_t *led, float *k, float *v) {
  const kv_geom_t *g = &t->base.geom;
  const kv_qsizes_t *q = &t->qs;
  const uint16_t *ks = (const uint16_t *)(led + q->k_codes), *kz = ks + q->k_meta / 4;
  const uint8_t *vc = led + q->k_codes + q->k_meta;
  const uint16_t *vs = (const uint16_t *)(vc + q->v_codes), *vz = vs + q->v_meta / 4;
  kv_dequant_keys(&t->cfg.quant, led, ks, kz, t->cfg.omega, g->n_kv_head, g->head_dim, k);
  kv_dequant_values(&t->cfg.quant, vc, vs, vz, t->cfg.omega, g->n_kv_head, g->head_dim, v);
}

/* Grows p to n elements of `size` bytes; 0, or -1 (p unchanged). */
static int grow(void **p, size_t size, int n) {
  void *q = realloc(*p, size * (size_t)n);
  if (!q) return -1;
  *p = q;
  return 0;
}

size_t kv_tiered_workspace(const kv_tiered_t *t) {
  return (size_t)t->gcap * 2 * sizeof(float) + (size_t)t->rcap * 2 * t->row * sizeof(float) +
         (size_t)t->runcap * (sizeof(kv_trun_t) + sizeof(int32_t));
}

/* Room for n keys' masses and positions, their rows too when `rows`, and n_runs runs. */
static int grow_gather(kv_tiered_t *t, int n, int rows, int n_runs) {
  int cap = n + n / 2 + 64, rc = 0;
  if (n > t->gcap) {
    rc |= grow((void **)&t->gmass, sizeof(float), cap) |
          grow((void **)&t->gpos, sizeof(int32_t), cap);
    if (!rc) t->gcap = cap;
  }
  if (rows && n > t->rcap) {
    rc |= grow((void **)&t->gk, sizeof(float) * t->row, cap);
    rc |= grow((void **)&t->gv, sizeof(float) * t->row, cap);
    if (!rc) t->rcap = cap;
  }
  if (n_runs > t->runcap) {
    int rcap = n_runs + n_runs / 2 + 16;
    rc |= grow((void **)&t->runs, sizeof(kv_trun_t), rcap) | grow((void **)&t->rfirst, 4, rcap);
    if (!rc) t->runcap = rcap;
  }
  if (rc) return qe_errf(QE_ENOMEM, "kv_tiered: no memory to gather %d keys", n);
  for (int i = 0; i < t->base.geom.max_seqs; i++) t->seqs[i].st.workspace = kv_tiered_workspace(t);
  return 0;
}

static int accessible(const kv_tiered_t *t, const kv_tlayer_t *L) {
  int n = L->len < t->cfg.n_sink ? L->len : t->cfg.n_sink;
  for (int i = 0; i < L->n_wins; i++) n += L->wins[i].tier == KV_TIER_EVICTED ? 0 : L->wins[i].n;
  return n;
}

/* Copies one window's keys and values (post-RoPE) to gather slot `at`. */
static void gather_window(kv_tiered_t *t, const kv_win_t *w, int at) {
  size_t row = t->row, om = (size_t)t->cfg.omega;
  float *k = t->gk + (size_t)at * row, *v = t->gv + (size_t)at * row;
  if (w->tier == KV_TIER_FULL) {
    memcpy(k, w->page, sizeof(float) * row * (size_t)w->n);
    memcpy(v, w->page + om * row, sizeof(float) * row * (size_t)w->n);
  } else {
    kv_tiered_dequant(t, w->ledger, t->tmp, v);
    kv_tiered_key_frame(t, t->tmp, w->start, w->n, 1);
    memcpy(k, t->tmp, sizeof(float) * row * (size_t)w->n);
  }
  for (int j = 0; j < w->n; j++) t->gpos[at + j] = w->start + j;
}

/* Gathers a layer's accessible tokens at slot `at`; returns how many. */
static int gather_layer(kv_tiered_t *t, const kv_tlayer_t *L, int at) {
  int n_sink = L->len < t->cfg.n_sink ? L->len : t->cfg.n_sink, n = 0;
  for (int p = 0; p < n_sink; p++, n++) {
    memcpy(t->gk + (size_t)(at + n) * t->row, L->sink + (size_t)p * 2 * t->row,
           sizeof(float) * t->row);
    memcpy(t->gv + (size_t)(at + n) * t->row, L->sink + ((size_t)p * 2 + 1) * t->row,
           sizeof(float) * t->row);
    t->gpos[at + n] = p;
  }
  for (int i = 0; i < L->n_wins; i++) {
    if (L->wins[i].tier == KV_TIER_EVICTED) continue;
    gather_window(t, &L->wins[i], at + n);
    n += L->wins[i].n;
  }
  return n;
}

/* A sequence's keys and values for the backend: its runs, in key order. */
typedef struct {
  kern_kv_src_t src; /* first: view() gets this */
  const kv_trun_t *runs;
} kv_tsrc_t;

/* A source's run r (kern_kv_src_t.view): fp32 rows in place, or a ledger's rows dequantized
 * into buf (post-RoPE keys: the ledger keeps them so, no rotation). */
static int run_view(const kern_kv_src_t *src, int r, int which, int kvh, int c0, int nc, float *buf,
                    const float **rows, size_t *stride) {
  const kv_tiered_t *t = src->ctx;
  const kv_trun_t *u = &((const kv_tsrc_t *)src)->runs[r];
  const kv_geom_t *g = &t->base.geom;
  if (!u->ledger) {
    *rows = (which ? u->v : u->k) + (size_t)kvh * g->head_dim + c0;
    *stride = u->stride;
    return u->n;
  }
  const kv_qsizes_t *q = &t->qs;
  const uint8_t *led = u->ledger, *vc = led + q->k_codes + q->k_meta;
  const uint16_t *ks = (const uint16_t *)(led + q->k_codes),
                 *vs = (const uint16_t *)(vc + q->v_codes);
  if (which)
    kv_dequant_values_head(&t->cfg.quant, vc, vs, vs + q->v_meta / 4, u->n, g->n_kv_head,
                           g->head_dim, kvh, c0, nc, buf);
  else
    kv_dequant_keys_head(&t->cfg.quant, led, ks, ks + q->k_meta / 4, u->n, g->n_kv_head,
                         g->head_dim, kvh, c0, nc, buf);
  *rows = buf;
  *stride = (size_t)nc;
  return u->n;
}

/* A layer's accessible tokens as runs at runs[0..], their first keys at first[0..] (and the
 * count after the last), positions at gpos + at; returns how many runs. */
static int layer_runs(kv_tiered_t *t, const kv_tlayer_t *L, int at, kv_trun_t *runs,
                      int32_t *first) {
  int n_sink = L->len < t->cfg.n_sink ? L->len : t->cfg.n_sink, nr = 0, k = 0;
  size_t om = (size_t)t->cfg.omega;
  if (n_sink)
    first[nr] = 0, runs[nr++] = (kv_trun_t){L->sink, L->sink + t->row, NULL, 2 * t->row, n_sink};
  for (; k < n_sink; k++) t->gpos[at + k] = k;
  for (int i = 0; i < L->n_wins; i++) {
    const kv_win_t *w = &L->wins[i];
    if (w->tier == KV_TIER_EVICTED) continue;
    first[nr] = k;
    if (w->tier == KV_TIER_FULL)
      runs[nr++] = (kv_trun_t){w->page, w->page + om * t->row, NULL, t->row, w->n};
    else
      runs[nr++] = (kv_trun_t){NULL, NULL, w->ledger, 0, w->n};
    for (int j = 0; j < w->n; j++) t->gpos[at + k++] = w->start + j;
  }
  first[nr] = k;
  return nr;
}

/* Mass per window from the gathered per-key masses (skipping the sink). wm: [n_wins]. */
static void window_masses(const kv_tiered_t *t, const kv_tlayer_t *L, const float *mass,
                          float *wm) {
  int at = L->len < t->cfg.n_sink ? L->len : t->cfg.n_sink;
  for (int i = 0; i < L->n_wins; i++) {
    const kv_win_t *w = &L->wins[i];
    wm[i] = 0;
    if (w->tier == KV_TIER_EVICTED) continue;
    for (int j = 0; j < w->n; j++) wm[i] += mass[at + j];
    at += w->n;
  }
}

/* Max-pools window masses over a width-k neighbourhood (SnapKV's clustering). */
static void pool_masses(float *wm, int n, int k, float *tmp) {
  int r = k / 2;
  for (int i = 0; i < n; i++) {
    float m = wm[i];
    for (int j = i - r; j <= i + r; j++)
      if (j >= 0 && j < n && wm[j] > m) m = wm[j];
    tmp[i] = m;
  }
  memcpy(wm, tmp, sizeof(float) * (size_t)n);
}

static void update_score(const kv_policy_cfg_t *c, kv_win_t *w, float m, int prefill) {
  switch (c->scorer) {
  case KV_SCORE_CUMULATIVE:
    w->score += m;
    break;
  case KV_SCORE_DECAYED:
    w->score = c->decay * w->score + m;
    break;
  case KV_SCORE_PNORM:
    w->acc += powf(m, c->pnorm);
    w->score = powf(w->acc, 1.0f / c->pnorm);
    break;
  case KV_SCORE_PREFILL:
    if (prefill) w->score = m;
    break;
  default:
    break; /* static scorers are set at routing */
  }
}

static int score_layer(kv_tiered_t *t, int seq, int layer, const float *mass, int n_q) {
  kv_tlayer_t *L = &t->seqs[seq].layers[layer];
  int prefill = n_q > 1;
  float *wm = malloc(sizeof(float) * 2 * (size_t)(L->n_wins + 1)), sink = 0;
  if (!wm) return qe_errf(QE_ENOMEM, "kv_tiered: out of memory");
  window_masses(t, L, mass, wm);
  for (int p = 0; p < L->len && p < t->cfg.n_sink; p++) sink += mass[p];
  if (t->obs) kv_tiered_observe(t, KV_OBS_STEP, seq, layer, n_q, wm, sink);
  if (prefill && t->cfg.pool_kernel > 1)
    pool_masses(wm, L->n_wins, t->cfg.pool_kernel, wm + L->n_wins);
  for (int i = 0; i < L->n_wins; i++)
    if (L->wins[i].tier != KV_TIER_EVICTED) update_score(&t->cfg, &L->wins[i], wm[i], prefill);
  free(wm);
  return 0;
}

/* Routes the layer when it was just prefilled or a window has aged since the last routing. */
static int maybe_route(kv_tiered_t *t, int seq, int layer, int prefill) {
  kv_tlayer_t *L = &t->seqs[seq].layers[layer];
  int aged = 0;
  for (int i = 0; i < L->n_wins; i++) aged += kv_win_aged(t, &L->wins[i], L->len);
  if (!prefill && aged <= L->n_aged) return 0;
  L->n_aged = aged;
  return kv_tiered_route_layer(t, seq, layer);
}

/* Whether attention reads a request's windows in place (a source of runs) rather than
 * gathered: for a decode step's one query (a prompt's queries are better served by one long
 * run of gathered rows) on a host backend, for post-RoPE keys (the others are rotated on
 * gathering), unless the cache was told to gather (kv_tiered_set_gather). */
static int in_place(const kv_tiered_t *t, const kv_attn_req_t *r) {
  return r->n_q == 1 && t->base.be->ops->host_memory &&
         t->cfg.quant.key_frame == KV_KEY_FRAME_ABS && !t->gather;
}

/* One backend call for the requests read in place (the backend's decode split takes a call
 * whose sequences all have sources) and one for the gathered ones. */
static void attend_calls(kv_tiered_t *t, const kern_attn_seq_t *work, int n) {
  kern_attn_seq_t part[2][KV_TATTN_MAX];
  int np[2] = {0, 0};
  for (int i = 0; i < n; i++) {
    int k = work[i].src != NULL;
    part[k][np[k]++] = work[i];
  }
  const kv_geom_t *g = &t->base.geom;
  kern_attn_shape_t sh = {g->n_head, g->n_kv_head, g->head_dim, 1.0f / sqrtf((float)g->head_dim)};
  for (int k = 0; k < 2; k++)
    if (np[k]) t->base.be->ops->attention(t->base.be, part[k], np[k], &sh);
}

/* Sets a request's keys: runs behind a source (place), or rows gathered at slot `at`; returns
 * how many. */
static int layer_keys(kv_tiered_t *t, const kv_tlayer_t *L, int at, int place, int *run_at,
                      kv_tsrc_t *src, kern_attn_seq_t *w) {
  int n;
  if (!place) {
    n = gather_layer(t, L, at);
    w->k = t->gk + (size_t)at * t->row, w->v = t->gv + (size_t)at * t->row;
    return n;
  }
  kv_trun_t *runs = t->runs + *run_at;
  int32_t *first = t->rfirst + *run_at;
  int nr = layer_runs(t, L, at, runs, first);
  n = first[nr];
  int longest = t->cfg.omega > t->cfg.n_sink ? t->cfg.omega : t->cfg.n_sink;
  *src = (kv_tsrc_t){{nr, longest, first, run_view, t}, runs};
  *run_at += nr + 1;
  w->src = &src->src;
  return n;
}

/* One call of at most KV_TATTN_MAX sequences (kv_tiered_attend). */
static int attend_part(kv_tiered_t *t, int layer, const kv_attn_req_t *reqs, int n_reqs) {
  kern_attn_seq_t work[KV_TATTN_MAX];
  kv_tsrc_t srcs[KV_TATTN_MAX];
  int total = 0, n_runs = 0, rc = 0, gathered = 0;
  for (int i = 0; i < n_reqs; i++) {
    const kv_tlayer_t *L = &t->seqs[reqs[i].seq].layers[layer];
    total += accessible(t, L);
    if (in_place(t, &reqs[i]))
      n_runs += L->n_wins + 2;
    else
      gathered = 1;
  }
  if ((rc = grow_gather(t, total, gathered, n_runs))) return rc;
  memset(t->gmass, 0, sizeof(float) * (size_t)total);
  for (int i = 0, at = 0, run_at = 0; i < n_reqs; i++) {
    const kv_attn_req_t *r = &reqs[i];
    int obs = r->n_q > t->cfg.n_obs ? r->n_q - t->cfg.n_obs : 0;
    work[i] = (kern_attn_seq_t){.q = r->q,
                                .out = r->out,
                                .key_mass = t->gmass + at,
                                .k_pos = t->gpos + at,
                                .n_q = r->n_q,
                                .q_pos0 = r->pos0,
                                .mass_q0 = obs};
    work[i].n_kv = layer_keys(t, &t->seqs[r->seq].layers[layer], at, in_place(t, r), &run_at,
                              &srcs[i], &work[i]);
    at += work[i].n_kv;
  }
  attend_calls(t, work, n_reqs);
  for (int i = 0, at = 0; i < n_reqs && !rc; i++) {
    rc = score_layer(t, reqs[i].seq, layer, t->gmass + at, reqs[i].n_q);
    at += work[i].n_kv;
    if (!rc) rc = maybe_route(t, reqs[i].seq, layer, reqs[i].n_q > 1);
  }
  return rc;
}

/* A step of more sequences than one call holds (a serving batch of up to 4,096) is attended
 * KV_TATTN_MAX sequences at a time: each sequence's attention, scores and routing are its own,
 * so the parts give the same results as one call would. */
int kv_tiered_attend(kv_cache_t *kv, int layer, const kv_attn_req_t *reqs, int n_reqs) {
  int rc = 0;
  for (int i = 0; i < n_reqs && !rc; i += KV_TATTN_MAX)
    rc = attend_part((kv_tiered_t *)kv, layer, reqs + i,
                     n_reqs - i < KV_TATTN_MAX ? n_reqs - i : KV_TATTN_MAX);
  return rc;
}
