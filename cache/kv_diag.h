/* kv_diag: the paper's mechanism diagnostics (seed 000, section 3.5), computed from two
 * observed runs over the same tokens (teacher-forced): a FullKV shadow (the same cache at a
 * budget that holds everything, so its windows align with the policy's) and the policy run.
 *   FMM_H   future missed mass: of the FullKV attention in the H steps after a routing event
 *           that falls on states existing at the event, the share on windows then evicted;
 *   churn   Jaccard distance of consecutive Full sets of aged windows (local region excluded);
 *   LIR(m)  of the inactive (not Full) episodes of at least m consecutive routing events,
 *           the share that later return to Full (unreturned ones stay in the denominator),
 *           with the median time-to-return in routing events;
 *   QSA     cosine of the INT2 windows' executed attention masses with FullKV's at the same
 *           step, at each routing event;
 *   INT2 mass ratio  mass the INT2 windows receive / mass FullKV gives the same windows.
 * Attention is averaged over heads (the engine's mass output), not per head as in the paper.
 * Not thread-safe. */
#ifndef QE_KV_DIAG_H
#define QE_KV_DIAG_H

#include "kv_tiered.h"

typedef struct kv_diag kv_diag_t;

typedef struct {
  double fmm, churn, lir, ttr_median, qsa, int2_mass_ratio; /* NaN where undefined */
  long events, lir_eligible, lir_returned, qsa_events;
  /* What each diagnostic is over, 0 where it is undefined on the run (no value to tell an
   * undefined diagnostic from a NaN by): FMM's routing events, churn's pairs of events, LIR's
   * eligible episodes (lir_eligible), TTR's returned ones (lir_returned), QSA's events
   * (qsa_events), and FullKV's mass on the INT2 windows (the ratio's denominator). */
  long fmm_events, churn_pairs;
  double int2_full_mass;
} kv_diag_result_t;

int kv_diag_create(int n_layer, int horizon, int lir_m, kv_diag_t **out);
void kv_diag_destroy(kv_diag_t *d);
/* Observers to register with kv_cache_set_observer on the shadow and the policy cache. */
void kv_diag_observe_shadow(void *d, const kv_obs_t *o);
void kv_diag_observe_policy(void *d, const kv_obs_t *o);
/* Computes every diagnostic (NaN where undefined, e.g. QSA without INT2 windows, its count then
 * 0: kv_diag_result_t). */
int kv_diag_compute(const kv_diag_t *d, kv_diag_result_t *out);
/* Forgets the policy's observations and keeps the shadow's, so that one shadow run serves
 * several policy runs over the same tokens and windows (`qevict eval`). */
void kv_diag_clear_policy(kv_diag_t *d);
/* FMM per sequence length, for plots over decode steps: out[i] (i in [0, n)) is the mean over
 * layers of the FMM of the routing events at length len0 + i, NaN where none ran. With
 * int2_missed, INT2 windows count as missed too (the paper's "FP tier only" curve). */
void kv_diag_fmm_steps(const kv_diag_t *d, int len0, int n, int int2_missed, double *out);

#endif
