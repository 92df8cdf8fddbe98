/* kv_tiered_route: one routing event of one layer: candidates (aged, not evicted windows),
 * their scores (re-scored by GraphKV when the policy says so), the byte-exact decision
 * (kv_route.c) and the migrations: evictions first, then demotions (quantizing only the first
 * time: the ledger is write-once and kept through promotions), then promotions. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_internal.h"
#include "qe_status.h"

void kv_tiered_dequant(const kv_tiered_t *t, const uint8_t *led, float *k, float *v);

/* Quantizes a Full window into a new ledger (keys rotated to the ledger's frame first). */
static int quantize_window(kv_tiered_t *t, kv_win_t *w) {
  const kv_geom_t *g = &t->base.geom;
  const kv_qsizes_t *q = &t->qs;
  uint8_t *led = kv_pool_alloc_q(t->pool);
  if (!led) return qe_errf(QE_ENOSPC, "kv_tiered: the page pool is exhausted (INT2 ledger)");
  memcpy(t->tmp, w->page, sizeof(float) * t->row * (size_t)w->n);
  kv_tiered_key_frame(t, t->tmp, w->start, w->n, -1);
  uint16_t *ks = (uint16_t *)(led + q->k_codes), *kz = ks + q->k_meta / 4;
  uint8_t *vc = led + q->k_codes + q->k_meta;
  uint16_t *vs = (uint16_t *)(vc + q->v_codes), *vz = vs + q->v_meta / 4;
  const float *v = w->page + (size_t)t->cfg.omega * t->row;
  kv_quant_keys(&t->cfg.quant, t->tmp, t->cfg.omega, g->n_kv_head, g->head_dim, led, ks, kz);
  kv_quant_values(&t->cfg.quant, v, t->cfg.omega, g->n_kv_head, g->head_dim, vc, vs, vz);
  w->ledger = led;
  return 0;
}

static int demote(kv_tiered_t *t, kv_win_t *w, kv_mem_stats_t *st) {
  if (!w->ledger) {
    int rc = quantize_window(t, w);
    if (rc) return rc;
    st->quantizations++;
  }
  kv_pool_free_full(t->pool, w->page);
  w->page = NULL;
  w->tier = KV_TIER_INT2;
  st->demotions++;
  return 0;
}

int kv_tiered_promote(kv_tiered_t *t, kv_win_t *w) {
  float *page = kv_pool_alloc_full(t->pool);
  if (!page) return qe_errf(QE_ENOSPC, "kv_tiered: the page pool is exhausted (promotion)");
  kv_tiered_dequant(t, w->ledger, page, page + (size_t)t->cfg.omega * t->row);
  kv_tiered_key_frame(t, page, w->start, w->n, 1);
  w->page = page;
  w->tier = KV_TIER_FULL;
  return 0;
}

static void evict(kv_tiered_t *t, kv_win_t *w) {
  if (w->page) kv_pool_free_full(t->pool, w->page);
  if (w->ledger) kv_pool_free_q(t->pool, w->ledger);
  w->page = NULL, w->ledger = NULL;
  w->tier = KV_TIER_EVICTED;
}

/* The score routing uses: the policy's, or a static one. */
static float route_score(const kv_tiered_t *t, const kv_win_t *w) {
  if (t->cfg.scorer == KV_SCORE_RECENCY) return (float)w->start;
  if (t->cfg.scorer == KV_SCORE_KNORM) return -w->norm_sum / (float)(w->n ? w->n : 1);
  return w->score;
}

/* Number of windows the budget can hold (GraphKV's "slots being filled"). */
static int budget_slots(const kv_tiered_t *t, size_t b_hist, int n) {
  double q = t->cfg.q, full = (double)(t->page_bytes + t->meta_bytes);
  double quant = (double)(t->ledger_bytes + t->meta_bytes);
  double slots = (1.0 - q) * b_hist / full + (q > 0 ? q * b_hist / quant : 0);
  return slots < n ? (int)slots : n;
}

/* The mean pre-RoPE key of a window into out [row]: Full keys un-rotated, INT2 dequantized. */
static void mean_key(kv_tiered_t *t, const kv_win_t *w, float *out) {
  if (w->tier == KV_TIER_FULL) {
    memcpy(t->tmp, w->page, sizeof(float) * t->row * (size_t)w->n);
    kv_tiered_rotate(t, t->tmp, w->start, w->n, -1);
  } else { /* the ledger's frame to pre-RoPE: a window-relative key is rotated by its offset,
              a post-RoPE one by its position */
    const int frame = t->cfg.quant.key_frame;
    kv_tiered_dequant(t, w->ledger, t->tmp, t->tmp2);
    if (frame != KV_KEY_FRAME_POS)
      kv_tiered_rotate(t, t->tmp, frame == KV_KEY_FRAME_ABS ? w->start : 0, w->n, -1);
  }
  for (size_t d = 0; d < t->row; d++) out[d] = 0;
  for (int j = 0; j < w->n; j++)
    for (size_t d = 0; d < t->row; d++) out[d] += t->tmp[(size_t)j * t->row + d];
  for (size_t d = 0; d < t->row; d++) out[d] /= (float)w->n;
}

/* A routing score as GraphKV takes it (>= 0, higher kept): knorm's, minus the mean key norm,
 * as the inverse norm (the same ranking; clipped at 0 every knorm score had tied); the
 * attention scores as they are, clipped at 0. */
static float graphkv_score(const kv_tiered_t *t, float score) {
  if (t->cfg.scorer == KV_SCORE_KNORM) return score < 0 ? fminf(-1.0f / score, FLT_MAX) : FLT_MAX;
  return score > 0 ? score : 0;
}

/* Re-scores cand[] scores with GraphKV over the candidates' mean pre-RoPE keys. */
static int graphkv_scores(kv_tiered_t *t, kv_cand_t *c, kv_win_t **wins, int n, size_t b_hist) {
  float *keys = malloc(sizeof(float) * t->row * (size_t)n), *s = malloc(sizeof(float) * (size_t)n);
  void *ws = malloc(graphkv_workspace(n, (int)t->row));
  int rc = keys && s && ws ? 0 : qe_errf(QE_ENOMEM, "kv_tiered: out of memory (graphkv)");
  for (int i = 0; !rc && i < n; i++) {
    mean_key(t, wins[i], keys + (size_t)i * t->row);
    s[i] = graphkv_score(t, c[i].score);
  }
  if (!rc)
    rc = graphkv_rescore(s, keys, n, (int)t->row, budget_slots(t, b_hist, n), &t->cfg.gkv, ws);
  for (int i = 0; !rc && i < n; i++) c[i].score = s[i];
  free(keys), free(s), free(ws);
  return rc;
}

/* Applies decided tiers: evictions, then demotions, then promotions (frees before allocs). */
static int apply_tiers(kv_tiered_t *t, kv_win_t **wins, const int *tier, int n, kv_mem_stats_t *st,
                       kv_route_event_t *ev) {
  int rc = 0;
  for (int i = 0; i < n; i++)
    if (tier[i] == KV_TIER_EVICTED) evict(t, wins[i]), st->evictions++, ev->evicted++;
  for (int i = 0; i < n && !rc; i++)
    if (tier[i] == KV_TIER_INT2 && wins[i]->tier == KV_TIER_FULL)
      rc = demote(t, wins[i], st), ev->demoted++;
  for (int i = 0; i < n && !rc; i++)
    if (tier[i] == KV_TIER_FULL && wins[i]->tier == KV_TIER_INT2)
      rc = kv_tiered_promote(t, wins[i]), st->promotions++, ev->promoted++;
  return rc;
}

static size_t layer_bytes(const kv_tiered_t *t, const kv_tseq_t *s, const kv_tlayer_t *L) {
  size_t b = L->len > 0 ? s->sink_bytes : 0;
  for (int i = 0; i < L->n_wins; i++) b += kv_tiered_win_bytes(t, &L->wins[i]);
  return b;
}

static void finish_event(kv_tiered_t *t, kv_tseq_t *s, kv_tlayer_t *L, kv_route_event_t *ev,
                         const int *tier, int n) {
  L->bytes = layer_bytes(t, s, L);
  for (int i = 0; i < n; i++)
    tier[i] == KV_TIER_FULL   ? ev->n_full++
    : tier[i] == KV_TIER_INT2 ? ev->n_int2++
                              : ev->n_evicted++;
  ev->bytes = L->bytes, ev->budget = L->budget;
  s->st.routing_events++;
  size_t total = 0;
  for (int l = 0; l < t->base.geom.n_layer; l++) total += s->layers[l].bytes;
  if (total > s->st.peak_bytes) s->st.peak_bytes = total;
  if (t->trace) t->trace(t->trace_ud, ev);
  if (t->obs) kv_tiered_observe(t, KV_OBS_ROUTE, ev->seq, ev->layer, 0, NULL, 0);
}

int kv_tiered_route_layer(kv_tiered_t *t, int seq, int layer) {
  kv_tseq_t *s = &t->seqs[seq];
  kv_tlayer_t *L = &s->layers[layer];
  size_t b_hist = L->budget > s->floor ? L->budget - s->floor : 0;
  if (L->bytes > L->budget && L->bytes - L->budget > s->st.peak_transient)
    s->st.peak_transient = L->bytes - L->budget;
  int n = 0, rc = 0;
  kv_cand_t *c = malloc(sizeof *c * (size_t)(L->n_wins + 1));
  kv_win_t **wins = malloc(sizeof *wins * (size_t)(L->n_wins + 1));
  int *tier = malloc(sizeof(int) * 2 * (size_t)(L->n_wins + 1));
  if (!c || !wins || !tier) rc = qe_errf(QE_ENOMEM, "kv_tiered: out of memory (routing)");
  for (int i = 0; !rc && i < L->n_wins; i++) {
    kv_win_t *w = &L->wins[i];
    if (w->tier == KV_TIER_EVICTED || !kv_win_aged(t, w, L->len)) continue;
    size_t led = w->ledger ? t->ledger_bytes : 0;
    c[n] = (kv_cand_t){route_score(t, w), w->tier, t->page_bytes + t->meta_bytes + led,
                       t->ledger_bytes + t->meta_bytes};
    wins[n++] = w;
  }
  if (!rc && t->cfg.graphkv && n > 1) rc = graphkv_scores(t, c, wins, n, b_hist);
  kv_route_event_t ev = {seq, layer, L->len, n, 0, 0, 0, 0, 0, 0, 0, 0};
  if (!rc) {
    kv_route_params_t rp = {b_hist, t->cfg.q, t->cfg.q > 0, t->cfg.q < 1, t->cfg.promote};
    kv_route_decide(c, n, &rp, tier, tier + n);
    rc = apply_tiers(t, wins, tier, n, &s->st, &ev);
    finish_event(t, s, L, &ev, tier, n);
  }
  free(c), free(wins), free(tier);
  return rc;
}
