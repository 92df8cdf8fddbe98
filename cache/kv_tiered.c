/* kv_tiered: lifecycle, budgets, token storage and accounting of the three-tier cache.
 * Attention and scoring live in kv_tiered_attn.c, routing and migrations in
 * kv_tiered_route.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_internal.h"
#include "qe_env.h"
#include "qe_log.h"
#include "qe_status.h"

static size_t meta_of(const kv_policy_cfg_t *c, size_t row) {
  (void)row;
  return KV_WIN_META + (c->scorer == KV_SCORE_KNORM ? sizeof(float) : 0); /* + norm sum */
}

static void sizes_init(kv_tiered_t *t) {
  const kv_geom_t *g = &t->base.geom;
  size_t o = (size_t)t->cfg.omega;
  t->row = (size_t)g->n_kv_head * g->head_dim;
  t->qs = kv_qsizes(&t->cfg.quant, t->cfg.omega, g->n_kv_head, g->head_dim);
  t->page_bytes = 2 * o * t->row * sizeof(float);
  t->ledger_bytes = t->qs.k_codes + t->qs.k_meta + t->qs.v_codes + t->qs.v_meta;
  t->sink_bytes = (size_t)t->cfg.n_sink * 2 * t->row * sizeof(float);
  t->meta_bytes = meta_of(&t->cfg, t->row);
  size_t n_prot = ((size_t)t->cfg.n_local + o - 1) / o + 1;
  t->local_reserve = n_prot * (t->page_bytes + t->meta_bytes);
}

static const kv_cache_ops_t tiered_ops;

/* A quantizing policy's INT2 ledger must fit its window's Full page: the pool gives a ledger at
 * most a page, and quantizing it would save nothing. Only a window of 1 over an odd head_dim
 * (a quantization group of 1) is over it. */
static int ledger_fits(const kv_tiered_t *t) {
  if (t->cfg.q <= 0 || t->ledger_bytes <= t->page_bytes) return 0;
  return qe_errf(QE_EINVAL,
                 "policy: a window's %d-bit ledger (%zu bytes) would be over its Full page (%zu "
                 "bytes) at window %d and head_dim %d (quantization group %d): use a window of "
                 "2 or more",
                 t->cfg.quant.bits, t->ledger_bytes, t->page_bytes, t->cfg.omega,
                 t->base.geom.head_dim, t->cfg.quant.group);
}

/* A ledger's pool page (kv_pool_create): the ledger, which ledger_fits keeps within a page;
 * a policy that never quantizes still gets a valid size. */
static size_t q_page_of(const kv_tiered_t *t) {
  return t->ledger_bytes < t->page_bytes ? t->ledger_bytes : t->page_bytes;
}

int kv_tiered_create(kern_backend_t *be, const kv_geom_t *geom, const kern_rope_t *rope,
                     const kv_policy_cfg_t *cfg_in, size_t pool_bytes, kv_cache_t **out) {
  kv_policy_cfg_t fitted = kv_policy_fit(cfg_in, geom->head_dim), *cfg = &fitted;
  int rc = kv_policy_check(cfg, geom->head_dim);
  if (rc) return rc;
  kv_tiered_t *t = calloc(1, sizeof *t);
  if (!t) return qe_errf(QE_ENOMEM, "kv_tiered: out of memory");
  t->base = (kv_cache_t){&tiered_ops, *geom, be};
  t->cfg = *cfg;
  t->rope = *rope;
  t->spec_fraction = 1.0;
  static const char *const off_on[] = {"0", "1"};
  t->gather = qe_env_choice("QE_TIERED_GATHER", off_on, 2, 0);
  sizes_init(t);
  rc = ledger_fits(t);
  if (rc) {
    free(t);
    return rc;
  }
  t->seqs = calloc((size_t)geom->max_seqs, sizeof *t->seqs);
  t->pending_budget = calloc((size_t)geom->max_seqs, sizeof *t->pending_budget);
  t->final = calloc((size_t)geom->max_seqs, sizeof *t->final);
  t->tmp = malloc(sizeof(float) * (size_t)cfg->omega * t->row);
  t->tmp2 = malloc(sizeof(float) * (size_t)cfg->omega * t->row);
  if (!t->seqs || !t->pending_budget || !t->final || !t->tmp || !t->tmp2)
    rc = qe_errf(QE_ENOMEM, "kv_tiered: out of memory");
  if (!rc) rc = kv_pool_create(be, pool_bytes, t->page_bytes, q_page_of(t), &t->pool);
  if (rc) {
    tiered_ops.destroy(&t->base);
    return rc;
  }
  *out = &t->base;
  return 0;
}

static size_t min_budget_of(const kv_tiered_t *t) {
  return (t->sink_bytes + t->local_reserve) * (size_t)t->base.geom.n_layer;
}

/* The protected regions of a slot of n tokens, per layer, capped at what the slot can hold:
 * sink, the bytes of its first min(n_sink, n) tokens; floor, the sink's and the local windows'
 * (at most the windows past the sink: all of them when the local region covers the slot, whose
 * windows then never age); hist, the windows past the sink at Full where some can age, else 0.
 * A slot whose regions fit has the cache's sink_bytes and local_reserve. */
typedef struct {
  size_t sink, floor, hist;
} kv_tregions_t;

static kv_tregions_t regions_of(const kv_tiered_t *t, long n) {
  const kv_slot_regions_t w = kv_slot_regions(n, t->cfg.n_sink, t->cfg.n_local, t->cfg.omega);
  const size_t unit = t->page_bytes + t->meta_bytes;
  const size_t sink = (size_t)w.sink * 2 * t->row * sizeof(float);
  return (kv_tregions_t){sink, sink + (size_t)w.prot * unit, (size_t)w.hist * unit};
}

static size_t fullkv_bytes_of(const kv_tiered_t *t, long n_tokens) {
  kv_tregions_t r = regions_of(t, n_tokens);
  return (r.floor + r.hist) * (size_t)t->base.geom.n_layer;
}

/* The smallest budget of a slot of n tokens: its protected regions, all layers. */
static size_t slot_min_budget(const kv_tiered_t *t, long n) {
  return regions_of(t, n).floor * (size_t)t->base.geom.n_layer;
}

size_t kv_tiered_min_budget(const kv_cache_t *kv) { return min_budget_of((const kv_tiered_t *)kv); }

size_t kv_tiered_fullkv_bytes(const kv_cache_t *kv, long n_tokens) {
  return fullkv_bytes_of((const kv_tiered_t *)kv, n_tokens);
}

int kv_tiered_bounds(const kv_geom_t *geom, const kv_policy_cfg_t *cfg, long n_tokens,
                     size_t *min_budget, size_t *fullkv) {
  kv_tiered_t t;
  memset(&t, 0, sizeof t);
  t.base.geom = *geom;
  t.cfg = kv_policy_fit(cfg, geom->head_dim);
  int rc = kv_policy_check(&t.cfg, geom->head_dim);
  if (rc) return rc;
  sizes_init(&t);
  rc = ledger_fits(&t);
  if (rc) return rc;
  *min_budget = slot_min_budget(&t, n_tokens);
  *fullkv = fullkv_bytes_of(&t, n_tokens);
  return 0;
}

size_t kv_tiered_page_bytes(const kv_cache_t *kv) { return ((const kv_tiered_t *)kv)->page_bytes; }

size_t kv_tiered_pool_for(const kv_cache_t *kv, size_t charged) {
  const kv_tiered_t *t = (const kv_tiered_t *)kv;
  if (t->cfg.q <= 0 || !t->ledger_bytes) return charged;
  const int k = kv_pool_q_per_slot(t->page_bytes, q_page_of(t)); /* (the pool's packing) */
  const double rho = (double)t->page_bytes / ((double)k * (double)t->ledger_bytes);
  const double f = (1.0 - t->cfg.q) + t->cfg.q * rho;
  return f > 1.0 ? (size_t)((double)charged * f) + 1 : charged;
}

void kv_tiered_set_gather(kv_cache_t *kv, int on) { ((kv_tiered_t *)kv)->gather = on != 0; }

void kv_tiered_set_budget_spec(kv_cache_t *kv, double fraction, size_t bytes) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  t->spec_fraction = fraction;
  t->spec_bytes = bytes;
}

/* The budget of a slot opened for `capacity` tokens under the budget spec. */
static size_t spec_budget(const kv_tiered_t *t, int capacity) {
  if (t->spec_bytes) return t->spec_bytes;
  if (t->spec_fraction >= 1.0) return kv_tiered_fullkv_bytes(&t->base, capacity);
  double full = (double)capacity * 2.0 * (double)t->row * sizeof(float) * t->base.geom.n_layer;
  return (size_t)(t->spec_fraction * full);
}

int kv_tiered_set_budget(kv_cache_t *kv, int seq, size_t budget) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  if (seq < 0 || seq >= kv->geom.max_seqs) return qe_errf(QE_EINVAL, "kv_tiered: bad slot %d", seq);
  t->pending_budget[seq] = budget;
  return 0;
}

int kv_tiered_reserve(kv_cache_t *kv, int n_seqs, int capacity) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  size_t full = kv_tiered_fullkv_bytes(kv, capacity);
  size_t budget = t->spec_bytes ? t->spec_bytes : spec_budget(t, capacity);
  size_t per_seq = budget < full ? budget : full;
  /* one layer's prompt at Full while it is routed, and partly filled INT2 slots per layer */
  size_t windows = (size_t)capacity / (size_t)t->cfg.omega + 2;
  size_t transient = windows * t->page_bytes + 2 * t->page_bytes * (size_t)kv->geom.n_layer;
  per_seq = kv_tiered_pool_for(kv, per_seq); /* (INT2 ledgers that do not fill a page) */
  return kv_tiered_set_pool(kv, (size_t)n_seqs * (per_seq + per_seq / 8 + transient));
}

int kv_tiered_set_pool(kv_cache_t *kv, size_t bytes) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  kv_pool_stats_t ps;
  kv_pool_stats(t->pool, &ps);
  if (ps.full_pages || ps.q_pages) return qe_errf(QE_EINVAL, "kv_tiered: resizing a pool in use");
  kv_pool_t *np = NULL;
  int rc = kv_pool_create(kv->be, bytes, t->page_bytes, q_page_of(t), &np);
  if (rc) return rc;
  kv_pool_destroy(t->pool);
  t->pool = np;
  return 0;
}

/* kv_cache_set_observer of the tiered cache. */
static int tiered_set_observer(kv_cache_t *kv, kv_obs_fn fn, void *ud) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  t->obs = fn;
  t->obs_ud = ud;
  return 0;
}

void kv_tiered_observe(kv_tiered_t *t, int kind, int seq, int layer, int n_q, const float *mass,
                       float sink_mass) {
  kv_tlayer_t *L = &t->seqs[seq].layers[layer];
  int *tier = malloc(sizeof(int) * (size_t)(L->n_wins + 1)), aged = 0;
  if (!tier) return;
  for (int i = 0; i < L->n_wins; i++) {
    tier[i] = L->wins[i].tier;
    aged += kv_win_aged(t, &L->wins[i], L->len);
  }
  kv_obs_t o = {kind, seq, layer, L->len, n_q, L->n_wins, aged, mass, sink_mass, tier};
  t->obs(t->obs_ud, &o);
  free(tier);
}

void kv_tiered_set_trace(kv_cache_t *kv, kv_trace_fn fn, void *ud) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  t->trace = fn;
  t->trace_ud = ud;
}

/* Layer l's share of slot s's budget: uniform, or decreasing with depth (pyramid, 1.5x to
 * 0.5x of what exceeds the layers' floors, no layer's share past its history at Full). */
static size_t layer_budget(const kv_tiered_t *t, const kv_tseq_t *s, int l) {
  const size_t hist = regions_of(t, s->capacity).hist; /* (the pyramid's cap) */
  return s->floor +
         kv_layer_hist(s->budget, s->floor, hist, t->cfg.pyramid, l, t->base.geom.n_layer);
}

size_t kv_tiered_win_bytes(const kv_tiered_t *t, const kv_win_t *w) {
  if (w->tier == KV_TIER_EVICTED) return 0;
  size_t b = t->meta_bytes + (w->ledger ? t->ledger_bytes : 0);
  return w->tier == KV_TIER_FULL ? b + t->page_bytes : b;
}

static void free_window(kv_tiered_t *t, kv_win_t *w) {
  if (w->page) kv_pool_free_full(t->pool, w->page);
  if (w->ledger) kv_pool_free_q(t->pool, w->ledger);
  memset(w, 0, sizeof *w);
  w->tier = KV_TIER_EVICTED;
}

static void count_windows(const kv_tiered_t *t, const kv_tseq_t *s, kv_mem_stats_t *st);
static size_t tiered_seq_bytes(const kv_cache_t *kv, int seq);

static void tiered_seq_close(kv_cache_t *kv, int seq) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  if (seq < 0 || seq >= kv->geom.max_seqs || !t->seqs[seq].open) return;
  kv_tseq_t *s = &t->seqs[seq];
  kv_tiered_stats(kv, seq, &s->st); /* (the figures at the end) */
  t->final[seq] = s->st;
  for (int l = 0; l < kv->geom.n_layer; l++) {
    kv_tlayer_t *L = &s->layers[l];
    for (int i = 0; i < L->n_wins; i++) free_window(t, &L->wins[i]);
    free(L->wins);
    free(L->sink);
  }
  free(s->layers);
  memset(s, 0, sizeof *s);
}

/* Each layer's budget share and sink rows (the slot's sink: at most its capacity). */
static int open_layers(kv_tiered_t *t, kv_tseq_t *s) {
  for (int l = 0; l < t->base.geom.n_layer; l++) {
    kv_tlayer_t *L = &s->layers[l];
    L->budget = layer_budget(t, s, l);
    L->sink = s->sink_bytes ? malloc(s->sink_bytes) : NULL;
    if (s->sink_bytes && !L->sink) return qe_errf(QE_ENOMEM, "kv_tiered: out of memory");
  }
  return 0;
}

static int tiered_seq_open(kv_cache_t *kv, int seq, int capacity) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  if (seq < 0 || seq >= kv->geom.max_seqs || capacity <= 0)
    return qe_errf(QE_EINVAL, "kv_tiered: bad slot %d or capacity %d", seq, capacity);
  size_t budget = t->pending_budget[seq] ? t->pending_budget[seq] : spec_budget(t, capacity);
  if (budget < slot_min_budget(t, capacity))
    return qe_errf(QE_EINVAL,
                   "budget %zu bytes is below the cost of the protected regions (sink %d + "
                   "local %d tokens, at most the slot's %d): %zu bytes",
                   budget, t->cfg.n_sink, t->cfg.n_local, capacity, slot_min_budget(t, capacity));
  tiered_seq_close(kv, seq);
  kv_tseq_t *s = &t->seqs[seq];
  s->layers = calloc((size_t)kv->geom.n_layer, sizeof *s->layers);
  if (!s->layers) return qe_errf(QE_ENOMEM, "kv_tiered: out of memory");
  kv_tregions_t r = regions_of(t, capacity);
  t->pending_budget[seq] = 0; /* (for this open only, as kv_gpu's) */
  s->open = 1, s->capacity = capacity, s->budget = budget;
  s->sink_bytes = r.sink, s->floor = r.floor;
  s->st.budget = s->budget;
  s->st.workspace = kv_tiered_workspace(t);
  int rc = open_layers(t, s);
  if (rc) tiered_seq_close(kv, seq);
  return rc;
}

static int new_window(kv_tiered_t *t, kv_tlayer_t *L, int start) {
  if (L->n_wins == L->cap_wins) {
    int cap = L->cap_wins ? 2 * L->cap_wins : 16;
    kv_win_t *w = realloc(L->wins, sizeof *w * (size_t)cap);
    if (!w) return qe_errf(QE_ENOMEM, "kv_tiered: out of memory");
    L->wins = w, L->cap_wins = cap;
  }
  kv_win_t *w = &L->wins[L->n_wins];
  *w = (kv_win_t){.start = start, .tier = KV_TIER_FULL};
  w->page = kv_pool_alloc_full(t->pool);
  if (!w->page) return qe_errf(QE_ENOSPC, "kv_tiered: the page pool is exhausted");
  L->n_wins++;
  L->bytes += t->page_bytes + t->meta_bytes;
  return 0;
}

/* Adds the L2 norm of one token's pre-RoPE key (at position pos) to the window (knorm). */
static void add_key_norm(kv_tiered_t *t, kv_win_t *w, const float *k, int pos) {
  memcpy(t->tmp, k, sizeof(float) * t->row);
  kv_tiered_rotate(t, t->tmp, pos, 1, -1);
  int hd = t->base.geom.head_dim;
  for (int h = 0; h < t->base.geom.n_kv_head; h++) {
    float ss = 0;
    for (int d = 0; d < hd; d++) ss += t->tmp[h * hd + d] * t->tmp[h * hd + d];
    w->norm_sum += sqrtf(ss) / (float)t->base.geom.n_kv_head;
  }
}

static int store_token(kv_tiered_t *t, const kv_tseq_t *s, kv_tlayer_t *L, int p, const float *k,
                       const float *v) {
  size_t row = t->row, rb = sizeof(float) * row;
  if (p < t->cfg.n_sink) { /* (p < the slot's capacity: within its sink) */
    memcpy(L->sink + (size_t)p * 2 * row, k, rb);
    memcpy(L->sink + ((size_t)p * 2 + 1) * row, v, rb);
    if (p == 0) L->bytes += s->sink_bytes;
    return 0;
  }
  int wi = (p - t->cfg.n_sink) / t->cfg.omega, rc = 0;
  if (wi == L->n_wins) rc = new_window(t, L, t->cfg.n_sink + wi * t->cfg.omega);
  if (rc) return rc;
  kv_win_t *w = &L->wins[wi];
  int off = p - w->start, om = t->cfg.omega;
  memcpy(w->page + (size_t)off * row, k, rb);
  memcpy(w->page + ((size_t)om + off) * row, v, rb);
  w->n = off + 1;
  if (t->cfg.scorer == KV_SCORE_KNORM) add_key_norm(t, w, k, p);
  return 0;
}

static int tiered_store(kv_cache_t *kv, int seq, int layer, int pos0, int n, const float *k,
                        const float *v) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  kv_tseq_t *s = &t->seqs[seq];
  kv_tlayer_t *L = &s->layers[layer];
  if (pos0 != L->len || pos0 + n > s->capacity)
    return qe_errf(QE_ERANGE, "kv_tiered: store of [%d, %d) in slot %d (stored %d, capacity %d)",
                   pos0, pos0 + n, seq, L->len, s->capacity);
  int rc = 0;
  for (int i = 0; i < n && !rc; i++)
    rc = store_token(t, s, L, pos0 + i, k + (size_t)i * t->row, v + (size_t)i * t->row);
  if (!rc) L->len = pos0 + n;
  if (layer == kv->geom.n_layer - 1) s->len = L->len;
  return rc;
}

static size_t tiered_seq_bytes(const kv_cache_t *kv, int seq) {
  const kv_tiered_t *t = (const kv_tiered_t *)kv;
  const kv_tseq_t *s = &t->seqs[seq];
  size_t b = 0;
  for (int l = 0; s->open && l < kv->geom.n_layer; l++) b += s->layers[l].bytes;
  return b;
}

/* Fills the by-kind byte and window counts of st from the window tables. */
static void count_windows(const kv_tiered_t *t, const kv_tseq_t *s, kv_mem_stats_t *st) {
  st->full_bytes = st->int2_bytes = st->meta_bytes = st->sink_bytes = 0;
  st->windows[0] = st->windows[1] = st->windows[2] = 0;
  for (int l = 0; l < t->base.geom.n_layer; l++) {
    const kv_tlayer_t *L = &s->layers[l];
    st->sink_bytes += L->len > 0 ? s->sink_bytes : 0;
    for (int i = 0; i < L->n_wins; i++) {
      const kv_win_t *w = &L->wins[i];
      st->windows[w->tier]++;
      if (w->tier == KV_TIER_EVICTED) continue;
      st->meta_bytes += t->meta_bytes;
      st->full_bytes += w->tier == KV_TIER_FULL ? t->page_bytes : 0;
      st->int2_bytes += w->ledger ? t->ledger_bytes : 0;
    }
  }
}

void kv_tiered_stats(const kv_cache_t *kv, int seq, kv_mem_stats_t *out) {
  const kv_tiered_t *t = (const kv_tiered_t *)kv;
  const kv_tseq_t *s = &t->seqs[seq];
  if (!s->open) {
    *out = t->final[seq];
    return;
  }
  *out = s->st;
  count_windows(t, s, out);
  out->bytes = tiered_seq_bytes(kv, seq);
  if (out->bytes > out->peak_bytes) out->peak_bytes = out->bytes; /* (between routings) */
}

int kv_tiered_check(const kv_cache_t *kv, int seq) {
  const kv_tiered_t *t = (const kv_tiered_t *)kv;
  const kv_tseq_t *s = &t->seqs[seq];
  for (int l = 0; s->open && l < kv->geom.n_layer; l++) {
    const kv_tlayer_t *L = &s->layers[l];
    size_t b = L->len > 0 ? s->sink_bytes : 0;
    for (int i = 0; i < L->n_wins; i++) {
      const kv_win_t *w = &L->wins[i];
      if ((w->tier == KV_TIER_FULL) != (w->page != NULL) ||
          (w->tier == KV_TIER_INT2 && !w->ledger) || (w->tier == KV_TIER_EVICTED && w->ledger))
        return qe_errf(QE_ERANGE, "kv_tiered: layer %d window %d is in an inconsistent state", l,
                       i);
      b += kv_tiered_win_bytes(t, w);
    }
    if (b != L->bytes)
      return qe_errf(QE_ERANGE, "kv_tiered: layer %d accounts %zu bytes, windows hold %zu", l,
                     L->bytes, b);
  }
  size_t total = tiered_seq_bytes(kv, seq);
  if (total > s->budget)
    return qe_errf(QE_ERANGE, "kv_tiered: slot %d holds %zu bytes over its budget %zu", seq, total,
                   s->budget);
  return 0;
}

static const kv_win_t *win_at(const kv_cache_t *kv, int seq, int layer, int w) {
  const kv_tiered_t *t = (const kv_tiered_t *)kv;
  const kv_tseq_t *s = &t->seqs[seq];
  if (!s->open || layer < 0 || layer >= kv->geom.n_layer || w < 0 || w >= s->layers[layer].n_wins)
    return NULL;
  return &s->layers[layer].wins[w];
}

int kv_tiered_window_tier(const kv_cache_t *kv, int seq, int layer, int w) {
  const kv_win_t *x = win_at(kv, seq, layer, w);
  return x ? x->tier : -1;
}

const uint8_t *kv_tiered_window_ledger(const kv_cache_t *kv, int seq, int layer, int w,
                                       size_t *bytes) {
  const kv_win_t *x = win_at(kv, seq, layer, w);
  *bytes = ((const kv_tiered_t *)kv)->ledger_bytes;
  return x ? x->ledger : NULL;
}

int kv_tiered_n_windows(const kv_cache_t *kv, int seq, int layer) {
  const kv_tiered_t *t = (const kv_tiered_t *)kv;
  return t->seqs[seq].open ? t->seqs[seq].layers[layer].n_wins : 0;
}

void kv_tiered_test_set_score(kv_cache_t *kv, int seq, int layer, int w, float score) {
  kv_win_t *x = (kv_win_t *)win_at(kv, seq, layer, w);
  if (x) x->score = score;
}

int kv_tiered_test_route(kv_cache_t *kv, int seq, int layer) {
  return kv_tiered_route_layer((kv_tiered_t *)kv, seq, layer);
}

const float *kv_tiered_test_page(const kv_cache_t *kv, int seq, int layer, int w, size_t *bytes) {
  const kv_win_t *x = win_at(kv, seq, layer, w);
  *bytes = ((const kv_tiered_t *)kv)->page_bytes;
  return x ? x->page : NULL;
}

static void tiered_destroy(kv_cache_t *kv) {
  kv_tiered_t *t = (kv_tiered_t *)kv;
  for (int s = 0; t->seqs && s < kv->geom.max_seqs; s++) tiered_seq_close(kv, s);
  kv_pool_destroy(t->pool);
  free(t->seqs);
  free(t->pending_budget);
  free(t->final);
  free(t->tmp);
  free(t->tmp2);
  free(t->gk), free(t->gv), free(t->gmass), free(t->gpos), free(t->runs), free(t->rfirst);
  free(t);
}

static const kv_cache_ops_t tiered_ops = {.name = "tiered",
                                          .seq_open = tiered_seq_open,
                                          .seq_close = tiered_seq_close,
                                          .store = tiered_store,
                                          .attend = kv_tiered_attend,
                                          .seq_bytes = tiered_seq_bytes,
                                          .destroy = tiered_destroy,
                                          .set_observer = tiered_set_observer};
