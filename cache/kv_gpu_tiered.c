/* kv_gpu_tiered: the tiered mode of the GPU cache (kv_gpu.h): FULL bf16 pages and INT2/4/8
 * ledgers in one device arena, windows routed on the device (kern_cuda_route.h) after every
 * prefilled layer and whenever a window ages during decode, migrated by kern_cuda_quant.h, and
 * attended by the fused paged kernel with the window masses accumulated into the scores. The
 * host knows budgets and lengths; it reads the device's accounting only when asked (stats, pool
 * usage). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kern_cuda_graphkv.h"
#include "kv_gpu_internal.h"
#include "qe_log.h"
#include "qe_status.h"

_Static_assert(KV_GPU_GRAPHKV_MAX_M == KC_GRAPHKV_MAX_M, "GraphKV neighbour limits differ");
_Static_assert(KV_GPU_WIN_META == KVG_META, "kv_gpu_bounds charges other window bookkeeping");

/* ---- sizes and budgets ------------------------------------------------------------------------
 */

size_t kv_gpu_min_budget(const kv_cache_t *kv) {
  const kv_gpu_t *g = (const kv_gpu_t *)kv;
  return g->t ? g->t->floor * (size_t)kv->geom.n_layer : 0;
}

size_t kv_gpu_fullkv_bytes(const kv_cache_t *kv, long n_tokens) {
  const kv_gpu_t *g = (const kv_gpu_t *)kv;
  size_t full = 0;
  if (g->t) return kv_gpu_bounds(&kv->geom, &g->t->cfg, n_tokens, NULL, NULL, &full) ? 0 : full;
  size_t wins = (size_t)((n_tokens + g->omega - 1) / g->omega);
  return wins * g->page_bytes * (size_t)kv->geom.n_layer;
}

void kv_gpu_set_budget_spec(kv_cache_t *kv, double fraction, size_t bytes) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  if (!g->t) return;
  g->t->spec_fraction = fraction > 0 ? fraction : 1.0;
  g->t->spec_bytes = bytes;
}

int kv_gpu_set_budget(kv_cache_t *kv, int seq, size_t budget) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  if (!g->t || seq < 0 || seq >= kv->geom.max_seqs)
    return qe_errf(QE_EINVAL, "kv_gpu: budget for slot %d of a cache without tiers", seq);
  g->t->pending[seq] = budget;
  return 0;
}

/* The budget slot seq opens with for `capacity` tokens. */
static size_t budget_for(const kv_gpu_t *g, int seq, int capacity) {
  const kv_gpu_tier_t *t = g->t;
  if (t->pending[seq]) return t->pending[seq];
  if (t->spec_bytes) return t->spec_bytes;
  size_t full = kv_gpu_fullkv_bytes(&g->base, capacity);
  return t->spec_fraction >= 1.0 ? full : (size_t)(t->spec_fraction * (double)full);
}

/* ---- slots ------------------------------------------------------------------------------------
 */

int kv_gpu__tier_open(kv_gpu_t *g, int seq, int capacity) {
  kv_gpu_tier_t *t = g->t;
  const int L = g->base.geom.n_layer, S = g->base.geom.max_seqs;
  size_t b = budget_for(g, seq, capacity), floor = t->floor, full = 0; /* (its capacity's) */
  int rc = kv_gpu_bounds(&g->base.geom, &t->cfg, capacity, &floor, NULL, &full);
  if (!rc && b < floor * (size_t)L)
    rc = qe_errf(QE_EINVAL,
                 "kv_gpu: budget %zu bytes below the minimum %zu (sink and local, at most the "
                 "slot's %d tokens)",
                 b, floor * (size_t)L, capacity);
  if (rc) return rc;
  t->budget[seq] = b, t->pending[seq] = 0;
  /* B_hist by kv_tiered's rule (kv_layer_hist); pyramid shares capped at the history at FULL,
     the windows past the sink (kv_gpu_bounds: full is the floor and those, a layer) */
  const size_t cap = full / (size_t)L - floor;
  for (int l = 0; l < L; l++)
    t->h_bhist[(size_t)l * S + seq] = (int64_t)kv_layer_hist(b, floor, cap, t->cfg.pyramid, l, L);
  rc = kc_route_reset_slot(&t->rt, seq, g->stream);
  if (!rc) rc = kv_gpu__stage(g, t->d_bhist.p, t->h_bhist, sizeof(int64_t) * (size_t)L * S);
  return rc;
}

void kv_gpu__tier_close(kv_gpu_t *g, int seq) {
  (void)kc_route_release_slot(&g->t->rt, seq, g->stream); /* a launch error stays sticky */
  /* budget[seq] stays: the slot's last statistics report it */
}

/* ---- per-step work ----------------------------------------------------------------------------
 */

int kv_gpu__tier_alloc(kv_gpu_t *g, int layer0, int n_layers, const int32_t *ts, const int32_t *tp,
                       int n) {
  return kc_route_alloc_windows(&g->t->rt, layer0, n_layers, ts, tp, n, g->stream);
}

/* Uploads the lengths and the slot list of one routing call. */
static int stage_slots(kv_gpu_t *g, const int *slots, int n) {
  kv_gpu_tier_t *t = g->t;
  for (int i = 0; i < n; i++) {
    t->h_slots[i] = slots[i];
    t->h_len[slots[i]] = g->seqs[slots[i]].len;
  }
  size_t S = (size_t)g->base.geom.max_seqs;
  int rc = kv_gpu__stage(g, t->d_len.p, t->h_len, sizeof(int32_t) * S);
  return rc ? rc : kv_gpu__stage(g, t->d_slots.p, t->h_slots, sizeof(int32_t) * (size_t)n);
}

static int route(kv_gpu_t *g, const int *slots, int n, int layer0, int n_layers, int force) {
  int rc = stage_slots(g, slots, n);
  if (rc) return rc;
  kc_route_call_t c = {g->t->d_slots.p, n, layer0, n_layers, g->t->d_len.p, g->t->d_bhist.p, force};
  kc_timer_t *tm = g->t->timer[force ? 0 : 1];
  if ((rc = kc_timer_begin(tm, g->stream))) return rc;
  rc = kc_route_run(&g->t->rt, &c, &g->t->qa, g->stream);
  int trc = kc_timer_end(tm, g->stream);
  return rc ? rc : trc;
}

int kv_gpu_routing_time(kv_cache_t *kv, double ms[2], long calls[2]) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  ms[0] = ms[1] = 0, calls[0] = calls[1] = 0;
  if (!g->t) return qe_errf(QE_EINVAL, "kv_gpu: no routing in a FullKV cache");
  int rc = kc_timer_ms(g->t->timer[0], &ms[0], &calls[0]);
  return rc ? rc : kc_timer_ms(g->t->timer[1], &ms[1], &calls[1]);
}

int kv_gpu__tier_aged(const kv_gpu_t *g, int len) {
  int lim = len - g->t->rt.n_local, a = lim > 0 ? lim / g->omega : 0;
  return a < g->t->rt.sink_win ? g->t->rt.sink_win : a;
}

/* After the last layer's decode attention: every layer of the decoding slots is routed where a
 * window aged (the device decides; nothing is read back). */
int kv_gpu__tier_step_done(kv_gpu_t *g, const int32_t *seq, int nd) {
  int slots[1024], n = 0;
  for (int i = 0; i < nd && i < 1024; i++) { /* one new token: aged only if the count moved */
    int len = g->seqs[seq[i]].len;
    if (kv_gpu__tier_aged(g, len) > kv_gpu__tier_aged(g, len - 1)) slots[n++] = seq[i];
  }
  return n ? route(g, slots, n, 0, g->base.geom.n_layer, 0) : 0;
}

int kv_gpu__tier_decoded(kv_gpu_t *g, int layer, const kv_attn_req_t *reqs, const int *sel,
                         int nd) {
  if (layer != g->base.geom.n_layer - 1 || !nd) return 0;
  int32_t seq[1024];
  for (int i = 0; i < nd && i < 1024; i++) seq[i] = reqs[sel[i]].seq;
  return kv_gpu__tier_step_done(g, seq, nd);
}

/* The key-mass buffer of a prefill attention over `total` gathered keys, zeroed. */
int kv_gpu__tier_masses(kv_gpu_t *g, size_t total, float **mass) {
  int rc = kv_gpu__buf_need(g, &g->t->d_mass, sizeof(float) * (total ? total : 1));
  if (!rc) rc = kc_memset_async(g->t->d_mass.p, 0, sizeof(float) * total, g->stream);
  *mass = g->t->d_mass.p;
  return rc;
}

int kv_gpu__tier_obs(const kv_gpu_t *g) { return g->t->cfg.n_obs; }

/* After a layer's prefill attention: window scores from the observation queries' key masses
 * (g->work[i].key_mass), then that layer of those slots is routed at once. */
int kv_gpu__tier_prefilled(kv_gpu_t *g, int layer, const kv_attn_req_t *reqs, const int *sel,
                           int np) {
  int rc = 0, slots[1024];
  for (int i = 0; i < np && !rc; i++) {
    slots[i] = reqs[sel[i]].seq;
    if (layer == g->base.geom.n_layer - 1) g->seqs[slots[i]].routed = 1;
    rc = kc_route_add_masses(&g->t->rt, layer, slots[i], g->work[i].key_mass, g->work[i].n_kv,
                             g->stream);
  }
  return rc ? rc : route(g, slots, np, layer, 1, 1);
}

int kv_gpu__tier_accumulates(const kv_gpu_t *g) { return g->t->cfg.scorer != KV_SCORE_PREFILL; }

void kv_gpu__tier_attn_args(const kv_gpu_t *g, int layer, kc_attn_args_t *a) {
  a->has_quant = g->t->rt.use_int2; /* (a policy without INT2: the bf16 FULL-only kernel) */
  a->geom.bits = g->t->cfg.quant.bits, a->geom.group = g->t->cfg.quant.group;
  a->rope = g->t->arope;
  a->abs_keys = g->t->cfg.quant.key_frame == KV_KEY_FRAME_ABS;
  if (!kv_gpu__tier_accumulates(g)) return; /* frozen prefill scores: no masses */
  a->mass = g->t->rt.score + kv_gpu__tab_index(g, layer, 0, 0);
  a->flags |= KC_ATTN_MASS_ACCUMULATE;
}

/* ---- statistics -------------------------------------------------------------------------------
 */

static int tier_flags(const kv_gpu_t *g, int32_t *flags) {
  int rc = kc_stream_sync(g->stream);
  if (!rc) rc = g->base.be->ops->download(g->base.be, flags, g->t->rt.err_flag, sizeof *flags);
  return rc;
}

int kv_gpu_stats(kv_cache_t *kv, int seq, kv_gpu_stats_t *out) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  memset(out, 0, sizeof *out);
  if (!g->t || seq < 0 || seq >= kv->geom.max_seqs)
    return qe_errf(QE_EINVAL, "kv_gpu: no tiered statistics for slot %d", seq);
  int L = kv->geom.n_layer, S = kv->geom.max_seqs, rc = tier_flags(g, &out->err_flags);
  kc_route_stat_t st;
  for (int l = 0; l < L && !rc; l++) {
    rc = kv->be->ops->download(kv->be, &st, g->t->rt.st + (size_t)l * S + seq, sizeof st);
    out->bytes += (size_t)st.bytes;
    out->windows[0] += st.n_full, out->windows[1] += st.n_quant, out->windows[2] += st.n_evicted;
    out->promotions += st.promotions, out->demotions += st.demotions;
    out->evictions += st.evictions, out->quantizations += st.quantizations;
    out->routings += st.routings;
  }
  out->budget = g->t->budget[seq];
  return rc;
}

size_t kv_gpu__tier_bytes(kv_gpu_t *g, int seq) {
  kv_gpu_stats_t s;
  return kv_gpu_stats(&g->base, seq, &s) ? 0 : s.bytes;
}

/* *out: the units of slabs whose led_per slots are all among the n free ledger slots (the ledger
 * stack, read from the device). */
static int free_slabs(kv_gpu_t *g, int n, long *out) {
  const kc_route_t *r = &g->t->rt;
  *out = 0;
  if (n <= 0) return 0;
  if (n > r->n_units * r->led_per)
    return qe_errf(QE_EBACKEND, "kv_gpu: %d free ledger slots in a pool of %d units of %d", n,
                   r->n_units, r->led_per);
  size_t bytes = sizeof(int32_t) * (size_t)n;
  int32_t *ids = malloc(bytes), *cnt = calloc((size_t)r->n_units, sizeof(int32_t));
  int rc = ids && cnt ? 0 : qe_errf(QE_ENOMEM, "kv_gpu: out of memory for %d ledger ids", n);
  if (!rc) rc = g->base.be->ops->download(g->base.be, ids, r->ledger_stack, bytes);
  for (int i = 0; i < n && !rc; i++) {
    int u = ids[i] / r->led_per;
    if (u >= 0 && u < r->n_units) *out += ++cnt[u] == r->led_per;
  }
  free(ids), free(cnt);
  return rc;
}

int kv_gpu__tier_usage(kv_gpu_t *g, kv_gpu_pool_t *out) {
  const kc_route_t *r = &g->t->rt;
  int32_t tops[5]; /* free units, free ledger slots, error flag, spares, units' low-water mark */
  long slabs = 0;
  int rc = kc_stream_sync(g->stream);
  if (!rc) rc = g->base.be->ops->download(g->base.be, tops, r->page_top, sizeof tops);
  if (!rc) rc = free_slabs(g, tops[1], &slabs);
  if (rc) {
    char why[256]; /* qe_errf overwrites the message it would format */
    snprintf(why, sizeof why, "%s", qe_errmsg());
    return qe_errf(rc, "kv_gpu: reading the tiered pool's free stacks: %s", why);
  }
  out->units_total = r->n_units;
  out->units_in_use = r->n_units - tops[0] - slabs, out->units_peak = r->n_units - tops[4];
  return 0;
}

/* ---- create / destroy -------------------------------------------------------------------------
 */

static void *dev_alloc(kv_gpu_t *g, size_t bytes, int *rc) {
  kv_gpu_tier_t *t = g->t;
  void *p = *rc ? NULL : kern_alloc(g->base.be, bytes ? bytes : 16);
  if (!*rc && !p) *rc = qe_errf(QE_ENOSPC, "kv_gpu: no device memory for %zu bytes", bytes);
  if (p) t->dev[t->n_dev++] = p;
  return p;
}

/* GraphKV's scratch (kc_route_gkv_t): as many layers per pass as fit in 256 MiB (at least one). */
static int alloc_gkv(kv_gpu_t *g) {
  kc_route_gkv_t *G = &g->t->rt.gkv;
  const kv_geom_t *ge = &g->base.geom;
  const graphkv_params_t *p = &g->t->cfg.gkv;
  size_t S = (size_t)ge->max_seqs, W = (size_t)g->max_win, nw = (size_t)ge->n_layer * S * W;
  size_t per = kc_route_gkv_bytes(ge->max_seqs, g->max_win, g->row, 1);
  size_t chunk = per ? ((size_t)256 << 20) / per : 1;
  chunk = chunk < 1 ? 1 : chunk > (size_t)ge->n_layer ? (size_t)ge->n_layer : chunk;
  *G = (kc_route_gkv_t){.on = 1,
                        .source_frac = p->source_frac,
                        .m = p->m,
                        .rounds = p->rounds,
                        .chunk = (int)chunk,
                        .row = g->row};
  size_t e = chunk * S * W;
  int rc = 0;
  G->gscore = dev_alloc(g, sizeof(float) * nw, &rc);
  G->cwin = dev_alloc(g, sizeof(kern_pwin_t) * e, &rc);
  G->cw = dev_alloc(g, sizeof(int32_t) * e, &rc);
  G->cscore = dev_alloc(g, sizeof(float) * e, &rc);
  G->keys = dev_alloc(g, sizeof(float) * e * (size_t)g->row, &rc);
  G->norm = dev_alloc(g, sizeof(double) * e, &rc);
  G->decay = dev_alloc(g, sizeof(float) * e, &rc);
  G->sim = dev_alloc(g, sizeof(float) * 8 * e, &rc);
  G->n_cand = dev_alloc(g, sizeof(int32_t) * 2 * chunk * S, &rc);
  if (!rc) G->n_slots = G->n_cand + chunk * S;
  return rc;
}

/* The device state of kc_route_t: per-window arrays beside the descriptor table g->tab, the
 * free stacks of n_units units and their ledger slots. */
static int alloc_route(kv_gpu_t *g, int n_units) {
  kc_route_t *r = &g->t->rt;
  const kv_geom_t *ge = &g->base.geom;
  size_t nw = (size_t)ge->n_layer * ge->max_seqs * g->max_win,
         nj = (size_t)ge->n_layer * ge->max_seqs;
  size_t slots = (size_t)n_units * (size_t)r->led_per;
  int rc = 0;
  r->win = g->tab, r->n_units = n_units;
  r->score = dev_alloc(g, nw * sizeof(float), &rc);
  r->page = dev_alloc(g, nw * sizeof(int32_t), &rc);
  r->ledger = dev_alloc(g, nw * sizeof(int32_t), &rc);
  r->plan = dev_alloc(g, nw, &rc);
  r->aged = dev_alloc(g, nj * sizeof(int32_t), &rc);
  r->st = dev_alloc(g, nj * sizeof(kc_route_stat_t), &rc);
  r->routed = dev_alloc(g, nj * sizeof(int32_t), &rc);
  r->page_stack = dev_alloc(g, sizeof(int32_t) * (size_t)n_units, &rc);
  r->unit_cnt = dev_alloc(g, sizeof(int32_t) * (size_t)n_units, &rc);
  r->ledger_stack = dev_alloc(g, sizeof(int32_t) * slots, &rc);
  r->spare_stack = dev_alloc(g, sizeof(int32_t) * slots, &rc);
  r->page_top = dev_alloc(g, 5 * sizeof(int32_t), &rc); /* tops, error flag, units_low */
  /* A pass migrates at most one window per unit each way; the demotions' rounds are done with
   * their list before the promotions fill theirs, so both share one (kc_route_t.djobs). */
  r->job_cap = n_units;
  r->qjobs = dev_alloc(g, sizeof(kc_quant_job_t) * (size_t)n_units, &rc);
  r->djobs = r->qjobs;
  r->n_qjobs = dev_alloc(g, 3 * sizeof(int32_t), &rc); /* n_qjobs, n_djobs, led_need */
  if (!rc && g->t->cfg.graphkv) rc = alloc_gkv(g);
  if (rc) return rc;
  r->ledger_top = r->page_top + 1, r->err_flag = r->page_top + 2, r->spare_top = r->page_top + 3;
  r->units_low = r->page_top + 4;
  r->n_djobs = r->n_qjobs + 1, r->led_need = r->n_qjobs + 2;
  return 0;
}

/* Every unit free (ledger and spare stacks empty), no error, the low-water mark at the top. */
static int init_stacks(kv_gpu_t *g, int n_units) {
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n_units ? n_units : 1));
  int32_t tops[5] = {n_units, 0, 0, 0, n_units};
  if (!ids) return qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
  for (int i = 0; i < n_units; i++) ids[i] = i;
  kern_backend_t *be = g->base.be;
  int rc = be->ops->upload(be, g->t->rt.page_stack, ids, sizeof(int32_t) * (size_t)n_units);
  if (!rc) rc = be->ops->upload(be, g->t->rt.page_top, tops, sizeof tops);
  free(ids);
  return rc;
}

static int init_rope(kv_gpu_t *g, const kern_rope_t *rope) {
  kv_gpu_tier_t *t = g->t;
  float host[2 * 512];
  if (rope->n_rot > 1024) return qe_errf(QE_EUNSUPPORTED, "kv_gpu: n_rot %d", rope->n_rot);
  int rc = kc_attn_rope_init(rope, host, &t->arope), n = rope->n_rot / 2 * 2;
  t->rope_tab = rc ? NULL : dev_alloc(g, sizeof(float) * (size_t)(n ? n : 2), &rc);
  if (!rc) rc = g->base.be->ops->upload(g->base.be, t->rope_tab, host, sizeof(float) * (size_t)n);
  t->arope.table = t->rope_tab;
  return rc;
}

static int check_cfg(const kv_policy_cfg_t *c) {
  return kv_gpu_policy_check(c, "this policy", 1, 0, 0, 0);
}

/* Units (pages) for n_seqs slots of capacity tokens under a budget of `budget` bytes per slot;
 * per layer, with B the history budget: the sink, the protected local windows and two in flight,
 * then B of history at its physical cost, the larger of the two regimes: no pressure (all of it
 * FULL: B) and pressure ((1-q) B of pages, q B of ledgers at led_per to a unit: ledgers cost
 * unit / (led_per * ledger) of their charged bytes, about 1.18 at INT2; about 1.13 B in all at
 * q = 0.7). Prompts pass one layer at FULL before that layer is routed: room for every slot's
 * prompt, or for two prompts and a sixteenth of the steady units when that is less (*room: those
 * units, which bound a forward pass's prompt tokens: kv_cache_prompt_room). */
static int pool_units(const kv_gpu_t *g, size_t budget, int n_seqs, int capacity, long *room) {
  const kv_gpu_tier_t *t = g->t;
  size_t per = budget / (size_t)g->base.geom.n_layer, floor = t->floor; /* (capacity's) */
  (void)kv_gpu_bounds(&g->base.geom, &t->cfg, capacity, &floor, NULL, NULL);
  double hist = per > floor ? (double)(per - floor) : 0.0;
  double unit = (double)(g->page_bytes + KVG_META), led = (double)(t->rt.lay.total + KVG_META);
  double q = t->rt.use_int2 ? t->cfg.q : 0.0;
  double rho = (double)g->page_bytes / ((double)t->rt.led_per * led); /* unit bytes / charged */
  double pressured = (t->rt.use_full ? (1.0 - q) : 0.0) + q * rho;
  double phys = hist * (pressured > 1.0 ? pressured : 1.0);
  size_t steady = (size_t)(((double)floor + phys) / unit) + 3;
  size_t prompt = (size_t)(capacity + g->omega - 1) / (size_t)g->omega;
  size_t L = (size_t)g->base.geom.n_layer, n = (size_t)n_seqs;
  size_t base = n * steady * L, extra = base / 16 > 2 * prompt ? base / 16 : 2 * prompt;
  extra = n * prompt < extra ? n * prompt : extra;
  *room = (long)extra;
  return (int)(base + extra);
}

static int tier_init(kv_gpu_t *g, const kern_rope_t *rope, const kv_policy_cfg_t *cfg) {
  const kv_geom_t *ge = &g->base.geom;
  kv_gpu_tier_t *t = g->t;
  size_t S = (size_t)ge->max_seqs;
  t->cfg = *cfg, t->spec_fraction = 1.0, t->rope = *rope;
  kc_route_t *r = &t->rt;
  *r = (kc_route_t){.max_seqs = ge->max_seqs,
                    .max_win = g->max_win,
                    .n_layer = ge->n_layer,
                    .omega = g->omega,
                    .n_local = cfg->n_local,
                    .q = cfg->q,
                    .use_int2 = cfg->q > 0,
                    .use_full = cfg->q < 1,
                    .promote = cfg->promote,
                    .recency = cfg->scorer == KV_SCORE_RECENCY,
                    .pool = cfg->pool_kernel};
  r->sink_win = (cfg->n_sink + g->omega - 1) / g->omega;
  r->pg =
      (kern_paged_geom_t){ge->n_kv_head, ge->head_dim, g->omega, cfg->quant.bits, cfg->quant.group};
  r->page_bytes = g->page_bytes, r->meta_bytes = KVG_META;
  int rc = kc_quant_ledger_layout(&r->pg, g->omega, &r->lay);
  r->led_per = rc ? 0 : (int)(g->page_bytes / r->lay.total);
  if (!rc && r->led_per < 1)
    rc = qe_errf(QE_EUNSUPPORTED, "kv_gpu: a %zu-byte ledger does not fit a %zu-byte page",
                 r->lay.total, g->page_bytes);
  t->pending = calloc(S, sizeof(size_t)), t->budget = calloc(S, sizeof(size_t));
  t->h_bhist = calloc(S * (size_t)ge->n_layer, sizeof(int64_t));
  t->h_len = calloc(S, sizeof(int32_t));
  t->h_slots = calloc(S, sizeof(int32_t));
  if (!rc && (!t->pending || !t->budget || !t->h_bhist || !t->h_len || !t->h_slots))
    rc = qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
  if (!rc) rc = kv_gpu__buf_need(g, &t->d_bhist, sizeof(int64_t) * S * (size_t)ge->n_layer);
  if (!rc) rc = kv_gpu__buf_need(g, &t->d_len, sizeof(int32_t) * S);
  if (!rc) rc = kv_gpu__buf_need(g, &t->d_slots, sizeof(int32_t) * S);
  if (!rc) rc = kv_gpu_bounds(ge, cfg, 0, &t->floor, NULL, NULL);
  if (!rc) rc = init_rope(g, rope);
  if (!rc) rc = kc_timer_create(&t->timer[0]);
  if (!rc) rc = kc_timer_create(&t->timer[1]);
  t->qa = (kc_quant_args_t){.geom = r->pg,
                            .rotate = 1,
                            .post_rope = cfg->quant.key_frame == KV_KEY_FRAME_ABS,
                            .rope = t->arope,
                            .arena = NULL};
  return rc;
}

void kv_gpu__tier_destroy(kv_gpu_t *g) {
  kv_gpu_tier_t *t = g->t;
  if (!t) return;
  for (int i = 0; i < t->n_dev; i++) kern_free(g->base.be, t->dev[i]);
  kc_timer_destroy(t->timer[0]), kc_timer_destroy(t->timer[1]);
  kvg_buf_t *b[] = {&t->d_bhist, &t->d_len, &t->d_slots, &t->d_mass};
  for (size_t i = 0; i < sizeof b / sizeof *b; i++) kern_free(g->base.be, b[i]->p);
  free(t->pending), free(t->budget), free(t->h_bhist), free(t->h_len), free(t->h_slots);
  free(t);
  g->t = NULL;
}

/* Prompt tokens a forward pass may store when room units are free beyond the slots' routed
 * ones: each sequence of the pass may start a window more than its tokens fill (at least one
 * window of tokens, so that every pass makes progress). */
static int prompt_room(const kv_gpu_t *g, long room) {
  const long w = room - g->base.geom.max_seqs, t = (w > 1 ? w : 1) * (long)g->omega;
  return t < INT32_MAX ? (int)t : INT32_MAX;
}

/* QEVICT_KV_GPU_POOL_SLACK=P (a workaround): P percent more units, 1..1000; anything else is
 * ignored with a warning. */
static int pool_slack(void) {
  const char *sv = getenv("QEVICT_KV_GPU_POOL_SLACK");
  char *end = NULL;
  long p = sv ? strtol(sv, &end, 10) : 0;
  if (!sv || !*sv) return 0;
  if (*end || p < 1 || p > 1000) {
    qe_log(QE_LOG_WARN,
           "QEVICT_KV_GPU_POOL_SLACK='%s' ignored: a percentage of 1..1000 is expected", sv);
    return 0;
  }
  return (int)p;
}

int kv_gpu_create_tiered(kern_backend_t *be, const kv_geom_t *geom, const kern_rope_t *rope,
                         const kv_policy_cfg_t *cfg_in, int max_tokens, int n_seqs, double fraction,
                         size_t bytes, kv_cache_t **out) {
  kv_policy_cfg_t cfg = kv_policy_fit(cfg_in, geom->head_dim);
  int rc = kv_policy_check(&cfg, geom->head_dim);
  if (!rc) rc = check_cfg(&cfg);
  kv_gpu_t *g = rc ? NULL : calloc(1, sizeof *g);
  if (!rc && !g) rc = qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
  if (!rc) rc = kv_gpu__init(g, be, geom, cfg.omega, max_tokens, 0, 1);
  if (!rc && !(g->t = calloc(1, sizeof *g->t))) rc = qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
  if (!rc) rc = tier_init(g, rope, &cfg);
  int n_units = 0;
  if (!rc) {
    kv_gpu_set_budget_spec(&g->base, fraction, bytes);
    long room = 0;
    n_units = pool_units(g, budget_for(g, 0, max_tokens), n_seqs, max_tokens, &room);
    const long more = (long)n_units * pool_slack() / 100; /* (all of it room for prompts) */
    n_units += (int)more;
    g->prompt_room = prompt_room(g, room + more);
    size_t arena = (size_t)n_units * g->page_bytes;
    g->arena = kern_alloc(be, arena), g->arena_bytes = arena;
    if (!g->arena) rc = qe_errf(QE_ENOSPC, "kv_gpu: no device memory for a %zu-byte pool", arena);
    g->t->qa.arena = g->arena;
  }
  if (!rc) rc = alloc_route(g, n_units);
  if (!rc) rc = init_stacks(g, n_units);
  if (rc) {
    if (g) kv_gpu__dispose(g);
    return rc;
  }
  *out = &g->base;
  return 0;
}
