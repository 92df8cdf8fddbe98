/* kv_gpu_obs: the observer of the GPU cache's tiered mode (kv_cache_set_observer), with the CPU
 * tiered cache's semantics (kv_cache.h's kv_obs_t). Windows are those past the sink, which the
 * GPU rounds up to whole windows: with n_sink a multiple of omega they are kv_tiered's windows.
 * Step masses: the decode kernel writes them to the observer's buffer instead of accumulating
 * them into the scores, which then get them with one add (the same fp32 sum); a prefill's are
 * its observation queries' key masses, summed per window on the host. Tiers are read from the
 * window descriptors. The device routes decoding slots after the last layer, so observations
 * are held until the step's routing has run, then given in kv_tiered's order: per layer, per
 * request in call order, the step and, when that request's slot routed that layer, the routing.
 * Every hook waits for the device; none runs while no observer is set. */
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kv_gpu_internal.h"
#include "kv_route.h"
#include "qe_status.h"

/* One held observation: a layer's step of one request, and whether its slot routes there. */
typedef struct {
  int layer, seq, len, n_q, routed;
  int n_wins, n_aged;
  float sink;
  float *mass; /* [n_wins] */
  int *tier;   /* [n_wins] during the step */
} kvg_orec_t;

struct kvg_obs {
  kv_obs_fn fn;
  void *ud;
  kvg_buf_t d_mass; /* device [max_seqs][max_win]: one decode call's window masses */
  kvg_orec_t *rec;  /* held observations, in the order they are given */
  int n_rec, cap_rec;
  kern_pwin_t *h_win; /* host [max_win] descriptors */
  float *h_key;       /* host [max_win * omega] key masses */
  float *h_win_mass;  /* host [max_win] window masses, the sink's included */
};

static void drop_records(kvg_obs_t *o) {
  for (int i = 0; i < o->n_rec; i++) free(o->rec[i].mass), free(o->rec[i].tier);
  o->n_rec = 0;
}

void kv_gpu__obs_free(kv_gpu_t *g) {
  kvg_obs_t *o = g->obs;
  if (!o) return;
  drop_records(o);
  kern_free(g->base.be, o->d_mass.p);
  free(o->rec), free(o->h_win), free(o->h_key), free(o->h_win_mass), free(o);
  g->obs = NULL;
}

int kv_gpu__obs_set(kv_cache_t *kv, kv_obs_fn fn, void *ud) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  if (!fn || g->obs) kv_gpu__obs_free(g); /* nothing held from an earlier observer */
  if (!fn) return 0;
  size_t nw = (size_t)g->max_win;
  kvg_obs_t *o = g->obs = calloc(1, sizeof *o);
  if (o) {
    o->fn = fn, o->ud = ud;
    o->h_win = malloc(sizeof *o->h_win * nw), o->h_win_mass = malloc(sizeof(float) * nw);
    o->h_key = malloc(sizeof(float) * nw * (size_t)g->omega);
  }
  if (o && o->h_win && o->h_key && o->h_win_mass) return 0;
  kv_gpu__obs_free(g);
  return qe_errf(QE_ENOMEM, "kv_gpu: out of memory for an observer");
}

int kv_gpu__obs_args(kv_gpu_t *g, kc_attn_args_t *a) {
  size_t bytes = sizeof(float) * (size_t)g->base.geom.max_seqs * (size_t)g->max_win;
  int rc = kv_gpu__buf_need(g, &g->obs->d_mass, bytes);
  if (!rc) rc = kc_memset_async(g->obs->d_mass.p, 0, bytes, g->stream);
  a->mass = g->obs->d_mass.p; /* indexed as the layer's scores: slot * max_win + window */
  a->flags &= ~KC_ATTN_MASS_ACCUMULATE;
  return rc;
}

void kv_gpu__obs_fold(kv_gpu_t *g, int layer) {
  if (!kv_gpu__tier_accumulates(g)) return; /* frozen prefill scores */
  kern_backend_t *be = g->base.be;          /* windows the call did not write hold 0 */
  be->ops->add(be, g->t->rt.score + kv_gpu__tab_index(g, layer, 0, 0), g->obs->d_mass.p,
               (size_t)g->base.geom.max_seqs * (size_t)g->max_win);
}

/* Windows of a slot of len tokens, the sink's included. */
static int windows_of(const kv_gpu_t *g, int len) { return (len + g->omega - 1) / g->omega; }

static int tier_of(const kern_pwin_t *w) {
  if (w->n_tok <= 0 || w->tier == KERN_PW_EVICTED) return KV_TIER_EVICTED;
  return w->tier == KERN_PW_QUANT ? KV_TIER_INT2 : KV_TIER_FULL;
}

/* tier[0..) of the windows past the sink of (layer, seq) at len tokens, as the device holds them
 * now (waits for the device). */
static int read_tiers(kv_gpu_t *g, int layer, int seq, int len, int *tier) {
  int nw = windows_of(g, len), sw = g->t->rt.sink_win;
  kern_pwin_t *h = g->obs->h_win;
  if (nw <= sw) return 0;
  kern_backend_t *be = g->base.be;
  int rc = be->ops->download(be, h, g->tab + kv_gpu__tab_index(g, layer, seq, 0),
                             sizeof *h * (size_t)nw);
  for (int w = sw; !rc && w < nw; w++) tier[w - sw] = tier_of(&h[w]);
  return rc;
}

/* h_win_mass[0..nw): the step's mass of every window of r's slot, the sink's included: from the
 * decode buffer (key_mass NULL) or summed from a prefill's key masses [n_kv] in position order. */
static int read_masses(kv_gpu_t *g, const kv_attn_req_t *r, const float *key_mass, int nw) {
  kvg_obs_t *o = g->obs;
  kern_backend_t *be = g->base.be;
  if (!key_mass)
    return be->ops->download(be, o->h_win_mass,
                             (const float *)o->d_mass.p + (size_t)r->seq * g->max_win,
                             sizeof(float) * (size_t)nw);
  int n_kv = r->pos0 + r->n_q;
  int rc = be->ops->download(be, o->h_key, key_mass, sizeof(float) * (size_t)n_kv);
  memset(o->h_win_mass, 0, sizeof(float) * (size_t)nw);
  for (int t = 0; !rc && t < n_kv; t++) o->h_win_mass[t / g->omega] += o->h_key[t];
  return rc;
}

static kvg_orec_t *new_record(kvg_obs_t *o) {
  if (o->n_rec == o->cap_rec) {
    int cap = o->cap_rec ? 2 * o->cap_rec : 64;
    kvg_orec_t *p = realloc(o->rec, sizeof *p * (size_t)cap);
    if (!p) return NULL;
    o->rec = p, o->cap_rec = cap;
  }
  kvg_orec_t *r = &o->rec[o->n_rec++];
  memset(r, 0, sizeof *r);
  return r;
}

/* Records request r's step at layer (key_mass: a prefill's, NULL for a decode). */
static int capture_one(kv_gpu_t *g, int layer, const kv_attn_req_t *r, const float *key_mass) {
  kvg_orec_t *rec = new_record(g->obs);
  int len = g->seqs[r->seq].len, nw = windows_of(g, len), sw = g->t->rt.sink_win;
  if (!rec) return qe_errf(QE_ENOMEM, "kv_gpu: out of memory for an observation");
  int n = nw > sw ? nw - sw : 0, aged = kv_gpu__tier_aged(g, len) - sw;
  int routed = r->n_q > 1 || kv_gpu__tier_aged(g, len) > kv_gpu__tier_aged(g, len - 1);
  *rec = (kvg_orec_t){layer,
                      r->seq,
                      len,
                      r->n_q,
                      routed,
                      n,
                      aged < n ? aged : n,
                      0,
                      malloc(sizeof(float) * (size_t)(n + 1)),
                      malloc(sizeof(int) * (size_t)(n + 1))};
  if (!rec->mass || !rec->tier) return qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
  int rc = read_tiers(g, layer, r->seq, len, rec->tier);
  if (!rc) rc = read_masses(g, r, key_mass, nw);
  for (int w = 0; !rc && w < nw; w++) {
    const float m = g->obs->h_win_mass[w];
    if (w < sw)
      rec->sink += m;
    else
      rec->mass[w - sw] = rec->tier[w - sw] == KV_TIER_EVICTED ? 0.0f : m;
  }
  return rc;
}

int kv_gpu__obs_capture(kv_gpu_t *g, int layer, const kv_attn_req_t *reqs, int n_reqs) {
  int rc = 0;
  for (int i = 0, k = 0; i < n_reqs && !rc; i++) /* prefills are g->work[0..) in call order */
    rc = capture_one(g, layer, &reqs[i], reqs[i].n_q > 1 ? g->work[k++].key_mass : NULL);
  return rc;
}

/* Gives one held observation: the step, then the routing when its slot routed that layer. */
static int emit_one(kv_gpu_t *g, kvg_orec_t *r) {
  kvg_obs_t *o = g->obs;
  kv_obs_t ob = {KV_OBS_STEP, r->seq,    r->layer, r->len,  r->n_q,
                 r->n_wins,   r->n_aged, r->mass,  r->sink, r->tier};
  o->fn(o->ud, &ob);
  if (!r->routed) return 0;
  int rc = read_tiers(g, r->layer, r->seq, r->len, r->tier);
  ob.kind = KV_OBS_ROUTE, ob.n_q = 0, ob.mass = NULL, ob.sink_mass = 0;
  if (!rc) o->fn(o->ud, &ob);
  return rc;
}

int kv_gpu__obs_emit(kv_gpu_t *g, int layer, int nd) {
  kvg_obs_t *o = g->obs;
  int rc = 0;
  if (nd && layer != g->base.geom.n_layer - 1) return 0; /* decoding slots route after the last */
  for (int i = 0; i < o->n_rec && !rc; i++) rc = emit_one(g, &o->rec[i]);
  drop_records(o);
  return rc;
}
