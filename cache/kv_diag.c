/* kv_diag: records the shadow's and the policy's observations per layer and computes the
 * mechanism diagnostics (see kv_diag.h). */
#include "kv_diag.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"

typedef struct {
  int len, n_wins, n_aged;
  float sink;
  float *mass; /* [n_wins] or NULL (route records) */
  int *tier;   /* [n_wins] */
} kv_drec_t;

typedef struct {
  kv_drec_t *r;
  int n, cap;
} kv_dlist_t;

struct kv_diag {
  int n_layer, horizon, lir_m;
  kv_dlist_t *shadow_steps, *policy_steps, *policy_routes; /* [n_layer] each */
};

int kv_diag_create(int n_layer, int horizon, int lir_m, kv_diag_t **out) {
  kv_diag_t *d = calloc(1, sizeof *d);
  if (!d) return qe_errf(QE_ENOMEM, "kv_diag: out of memory");
  *d = (kv_diag_t){n_layer,
                   horizon,
                   lir_m,
                   calloc((size_t)n_layer, sizeof(kv_dlist_t)),
                   calloc((size_t)n_layer, sizeof(kv_dlist_t)),
                   calloc((size_t)n_layer, sizeof(kv_dlist_t))};
  if (!d->shadow_steps || !d->policy_steps || !d->policy_routes) {
    kv_diag_destroy(d);
    return qe_errf(QE_ENOMEM, "kv_diag: out of memory");
  }
  *out = d;
  return 0;
}

static void list_free(kv_dlist_t *l, int n) {
  for (int i = 0; l && i < n; i++) {
    for (int j = 0; j < l[i].n; j++) free(l[i].r[j].mass), free(l[i].r[j].tier);
    free(l[i].r);
  }
  free(l);
}

void kv_diag_destroy(kv_diag_t *d) {
  if (!d) return;
  list_free(d->shadow_steps, d->n_layer);
  list_free(d->policy_steps, d->n_layer);
  list_free(d->policy_routes, d->n_layer);
  free(d);
}

/* Appends a copy of the observation (masses only when with_mass). */
static void record(kv_dlist_t *l, const kv_obs_t *o, int with_mass) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    kv_drec_t *r = realloc(l->r, sizeof *r * (size_t)cap);
    if (!r) return;
    l->r = r, l->cap = cap;
  }
  size_t n = (size_t)o->n_wins + 1;
  kv_drec_t *r = &l->r[l->n];
  *r = (kv_drec_t){o->len, o->n_wins, o->n_aged, o->sink_mass, NULL, malloc(sizeof(int) * n)};
  if (with_mass) r->mass = malloc(sizeof(float) * n);
  if (!r->tier || (with_mass && !r->mass)) {
    free(r->tier);
    free(r->mass);
    return;
  }
  memcpy(r->tier, o->tier, sizeof(int) * (size_t)o->n_wins);
  if (with_mass) memcpy(r->mass, o->mass, sizeof(float) * (size_t)o->n_wins);
  l->n++;
}

void kv_diag_observe_shadow(void *ud, const kv_obs_t *o) {
  kv_diag_t *d = ud;
  if (o->kind == KV_OBS_STEP && o->n_q == 1 && o->layer < d->n_layer)
    record(&d->shadow_steps[o->layer], o, 1);
}

void kv_diag_observe_policy(void *ud, const kv_obs_t *o) {
  kv_diag_t *d = ud;
  if (o->layer >= d->n_layer) return;
  if (o->kind == KV_OBS_STEP && o->n_q == 1) record(&d->policy_steps[o->layer], o, 1);
  if (o->kind == KV_OBS_ROUTE) record(&d->policy_routes[o->layer], o, 0);
}

/* The record of list l at sequence length len, or NULL. Records ascend in len. */
static const kv_drec_t *at_len(const kv_dlist_t *l, int len) {
  int lo = 0, hi = l->n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (l->r[mid].len < len)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < l->n && l->r[lo].len == len ? &l->r[lo] : NULL;
}

typedef struct {
  double sum;
  long n;
} kv_mean_t;

static void mean_add(kv_mean_t *m, double v) {
  if (isfinite(v)) m->sum += v, m->n++;
}

static double mean_of(const kv_mean_t *m) { return m->n ? m->sum / (double)m->n : NAN; }

/* Windows that were complete at the routing event ev: all but the last when the shadow's next
 * step s (the first after the event) still has no window past ev's, i.e. when the tokens after
 * the event join ev's last window (a prefill event, or a local region that is not whole
 * windows). That window is local (Full, never missed), and its mass cannot be split between
 * the states of the event and later ones, so FMM leaves it out of its denominator. */
static int wins_at_event(const kv_drec_t *ev, const kv_drec_t *s) {
  return s->n_wins > ev->n_wins || !ev->n_wins ? ev->n_wins : ev->n_wins - 1;
}

/* FMM of one routing event against the shadow's next `horizon` steps (int2_missed: INT2
 * windows count as missed): the FullKV mass on states existing at the event (the sink and the
 * windows then complete) that falls on windows then missed, over all of it. */
static void fmm_event_x(const kv_diag_t *d, const kv_dlist_t *sh, const kv_drec_t *ev,
                        int int2_missed, kv_mean_t *m) {
  double miss = 0, all = 0;
  int n_old = -1;
  for (int len = ev->len + 1; len <= ev->len + d->horizon; len++) {
    const kv_drec_t *s = at_len(sh, len);
    if (!s) continue;
    if (n_old < 0) n_old = wins_at_event(ev, s);
    all += s->sink;
    for (int w = 0; w < n_old && w < s->n_wins; w++) {
      all += s->mass[w];
      if (ev->tier[w] == KV_TIER_EVICTED || (int2_missed && ev->tier[w] == KV_TIER_INT2))
        miss += s->mass[w];
    }
  }
  if (all > 0) mean_add(m, miss / all);
}

static void fmm_event(const kv_diag_t *d, const kv_dlist_t *sh, const kv_drec_t *ev, kv_mean_t *m) {
  fmm_event_x(d, sh, ev, 0, m);
}

static int is_full_aged(const kv_drec_t *r, int w) {
  return w < r->n_aged && r->tier[w] == KV_TIER_FULL;
}

/* Churn between consecutive events a, b over the windows aged at both: a window that left the
 * local region between them (the recent region's deterministic slide, which seed 000's 3.5
 * excludes) is not compared, so a policy under no pressure churns 0. */
static void churn_pair(const kv_drec_t *a, const kv_drec_t *b, kv_mean_t *m) {
  long inter = 0, uni = 0;
  const int n = a->n_aged < b->n_aged ? a->n_aged : b->n_aged;
  for (int w = 0; w < n; w++) {
    int x = w < a->n_wins && is_full_aged(a, w), y = w < b->n_wins && is_full_aged(b, w);
    inter += x && y, uni += x || y;
  }
  if (uni) mean_add(m, 1.0 - (double)inter / (double)uni);
}

/* Inactive episodes of window w over the routing events of one layer. */
static void lir_window(const kv_dlist_t *rt, int w, int m, long *elig, long *ret, int *ttr,
                       int *n_ttr, int cap_ttr) {
  int run = 0;
  for (int i = 0; i < rt->n; i++) {
    const kv_drec_t *r = &rt->r[i];
    if (w >= r->n_aged) continue;
    if (r->tier[w] != KV_TIER_FULL) {
      run++;
      continue;
    }
    if (run >= m) {
      (*elig)++, (*ret)++;
      if (*n_ttr < cap_ttr) ttr[(*n_ttr)++] = run;
    }
    run = 0;
  }
  if (run >= m) (*elig)++;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* QSA at one routing event: cosine of policy vs shadow masses over the INT2 windows. */
static void qsa_event(const kv_dlist_t *ps, const kv_dlist_t *sh, const kv_drec_t *ev,
                      kv_mean_t *m) {
  const kv_drec_t *p = at_len(ps, ev->len), *s = at_len(sh, ev->len);
  if (!p || !s) return;
  double dot = 0, np = 0, ns = 0;
  for (int w = 0; w < p->n_wins && w < s->n_wins; w++) {
    if (p->tier[w] != KV_TIER_INT2) continue;
    dot += (double)p->mass[w] * s->mass[w];
    np += (double)p->mass[w] * p->mass[w], ns += (double)s->mass[w] * s->mass[w];
  }
  if (np > 0 && ns > 0) mean_add(m, dot / sqrt(np * ns));
}

/* INT2 mass ratio over every policy step of one layer. */
static void int2_mass(const kv_dlist_t *ps, const kv_dlist_t *sh, double *q, double *f) {
  for (int i = 0; i < ps->n; i++) {
    const kv_drec_t *p = &ps->r[i], *s = at_len(sh, p->len);
    for (int w = 0; s && w < p->n_wins && w < s->n_wins; w++)
      if (p->tier[w] == KV_TIER_INT2) *q += p->mass[w], *f += s->mass[w];
  }
}

int kv_diag_compute(const kv_diag_t *d, kv_diag_result_t *o) {
  kv_mean_t fmm = {0}, churn = {0}, qsa = {0};
  double qm = 0, fm = 0;
  int cap = 1 << 20, n_ttr = 0, *ttr = malloc(sizeof(int) * (size_t)cap);
  if (!ttr) return qe_errf(QE_ENOMEM, "kv_diag: out of memory");
  memset(o, 0, sizeof *o);
  for (int l = 0; l < d->n_layer; l++) {
    const kv_dlist_t *rt = &d->policy_routes[l], *sh = &d->shadow_steps[l],
                     *ps = &d->policy_steps[l];
    int max_w = 0;
    for (int i = 0; i < rt->n; i++) {
      fmm_event(d, sh, &rt->r[i], &fmm);
      if (i) churn_pair(&rt->r[i - 1], &rt->r[i], &churn);
      qsa_event(ps, sh, &rt->r[i], &qsa);
      max_w = rt->r[i].n_wins > max_w ? rt->r[i].n_wins : max_w;
    }
    for (int w = 0; w < max_w; w++)
      lir_window(rt, w, d->lir_m, &o->lir_eligible, &o->lir_returned, ttr, &n_ttr, cap);
    int2_mass(ps, sh, &qm, &fm);
    o->events += rt->n;
  }
  qsort(ttr, (size_t)n_ttr, sizeof *ttr, cmp_int);
  o->fmm = mean_of(&fmm), o->churn = mean_of(&churn), o->qsa = mean_of(&qsa);
  o->qsa_events = qsa.n, o->fmm_events = fmm.n, o->churn_pairs = churn.n;
  o->lir = o->lir_eligible ? (double)o->lir_returned / (double)o->lir_eligible : NAN;
  o->ttr_median = n_ttr ? ttr[n_ttr / 2] : NAN;
  o->int2_mass_ratio = fm > 0 ? qm / fm : NAN;
  o->int2_full_mass = fm;
  free(ttr);
  return 0;
}

void kv_diag_clear_policy(kv_diag_t *d) {
  for (int l = 0; l < d->n_layer; l++) {
    kv_dlist_t *lists[2] = {&d->policy_steps[l], &d->policy_routes[l]};
    for (int k = 0; k < 2; k++) {
      for (int j = 0; j < lists[k]->n; j++) free(lists[k]->r[j].mass), free(lists[k]->r[j].tier);
      lists[k]->n = 0;
    }
  }
}

void kv_diag_fmm_steps(const kv_diag_t *d, int len0, int n, int int2_missed, double *out) {
  for (int i = 0; i < n; i++) {
    kv_mean_t m = {0};
    for (int l = 0; l < d->n_layer; l++) {
      const kv_drec_t *ev = at_len(&d->policy_routes[l], len0 + i);
      if (ev) fmm_event_x(d, &d->shadow_steps[l], ev, int2_missed, &m);
    }
    out[i] = mean_of(&m);
  }
}
