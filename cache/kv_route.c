/* kv_route: byte-exact greedy tier assignment (see kv_route.h). */
#include "kv_route.h"

#include <stdlib.h>

static _Thread_local const kv_cand_t *g_cands;

static int by_score_desc(const void *a, const void *b) {
  int i = *(const int *)a, j = *(const int *)b;
  if (g_cands[i].score != g_cands[j].score) return g_cands[i].score < g_cands[j].score ? 1 : -1;
  return i - j;
}

/* All candidates FULL when they fit and nothing forbids it. */
static int fits_all_full(const kv_cand_t *c, int n, const kv_route_params_t *p, size_t *used) {
  size_t total = 0;
  if (!p->use_full) return 0;
  for (int i = 0; i < n; i++) {
    if (c[i].tier == KV_TIER_INT2 && !p->promote) return 0;
    total += c[i].full_cost;
  }
  *used = total;
  return total <= p->b_hist;
}

size_t kv_route_decide(const kv_cand_t *c, int n, const kv_route_params_t *p, int *out,
                       int *order) {
  size_t used = 0;
  if (fits_all_full(c, n, p, &used)) {
    for (int i = 0; i < n; i++) out[i] = KV_TIER_FULL;
    return used;
  }
  for (int i = 0; i < n; i++) order[i] = i, out[i] = KV_TIER_EVICTED;
  g_cands = c;
  qsort(order, (size_t)n, sizeof *order, by_score_desc);
  size_t full_cap = p->use_int2 ? (size_t)((1.0 - p->q) * (double)p->b_hist) : p->b_hist;
  size_t full_used = 0, q_used = 0;
  for (int r = 0; p->use_full && r < n; r++) {
    const kv_cand_t *w = &c[order[r]];
    if (w->tier == KV_TIER_INT2 && !p->promote) continue;
    if (full_used + w->full_cost <= full_cap)
      full_used += w->full_cost, out[order[r]] = KV_TIER_FULL;
  }
  size_t q_cap = p->b_hist - full_used;
  for (int r = 0; p->use_int2 && r < n; r++) {
    const kv_cand_t *w = &c[order[r]];
    if (out[order[r]] == KV_TIER_FULL) continue;
    if (q_used + w->q_cost <= q_cap) q_used += w->q_cost, out[order[r]] = KV_TIER_INT2;
  }
  return full_used + q_used;
}
