/* kv_route: the QEvict routing decision for one layer, as a pure function over candidate
 * windows (so it can be tested on hand-made score sequences). With B_hist the history budget:
 * if every candidate fits in FULL within B_hist (and the policy has a Full tier), all are FULL;
 * otherwise FULL is filled in score order while Full bytes stay within (1-q)*B_hist, then INT2
 * in score order within the rest of B_hist (what Full leaves unused rolls over); everything
 * else is EVICTED. Costs are real bytes per window. Ties in score: the older window first. */
#ifndef QE_KV_ROUTE_H
#define QE_KV_ROUTE_H

#include <stddef.h>

enum { KV_TIER_FULL = 0, KV_TIER_INT2 = 1, KV_TIER_EVICTED = 2 };

typedef struct {
  float score;
  int tier;         /* current tier (FULL or INT2) */
  size_t full_cost; /* bytes if FULL (includes a kept ledger) */
  size_t q_cost;    /* bytes if INT2 */
} kv_cand_t;

typedef struct {
  size_t b_hist;
  float q;      /* INT2 share of b_hist */
  int use_int2; /* the policy has an INT2 tier */
  int use_full; /* the policy keeps history at Full (0 for KIVI-style all-INT2) */
  int promote;  /* INT2 candidates may become FULL */
} kv_route_params_t;

/* Decides out_tier[n] for n candidates. order: workspace of n ints. Returns the bytes used. */
size_t kv_route_decide(const kv_cand_t *c, int n, const kv_route_params_t *p, int *out_tier,
                       int *order);

#endif
