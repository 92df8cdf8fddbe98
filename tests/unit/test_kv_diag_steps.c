/* test_kv_diag_steps: the two additions to kv_diag that `qevict eval` uses, on hand-made
 * observations computed by hand: FMM per sequence length (with and without INT2 counted as
 * missed) and kv_diag_clear_policy (one shadow serving two policy runs). */
#include <math.h>
#include <stdio.h>

#include "kv_diag.h"
#include "test_util.h"

enum { F = KV_TIER_FULL, Q = KV_TIER_INT2, E = KV_TIER_EVICTED };

static void shadow_step(kv_diag_t *d, int len, const float *mass, float sink) {
  int tier[4] = {F, F, F, F};
  kv_obs_t o = {KV_OBS_STEP, 0, 0, len, 1, 4, 4, mass, sink, tier};
  kv_diag_observe_shadow(d, &o);
}

static void policy_route(kv_diag_t *d, int len, const int *tier) {
  kv_obs_t o = {KV_OBS_ROUTE, 0, 0, len, 0, 4, 4, NULL, 0, tier};
  kv_diag_observe_policy(d, &o);
}

static int near(double a, double b) { return fabs(a - b) < 1e-5; }

int main(void) {
  kv_diag_t *d = NULL;
  CHECK_OK(kv_diag_create(1, 2, 1, &d));
  const float s11[4] = {.1f, .1f, .4f, .2f}, s12[4] = {.2f, .2f, .2f, .2f},
              s13[4] = {.5f, .1f, .1f, .1f};
  shadow_step(d, 11, s11, .2f), shadow_step(d, 12, s12, .2f), shadow_step(d, 13, s13, .2f);
  const int t10[4] = {F, Q, E, F}, t12[4] = {Q, Q, E, F}, all_full[4] = {F, F, F, F};
  policy_route(d, 10, t10), policy_route(d, 12, t12);
  double st[5], fp[5];
  kv_diag_fmm_steps(d, 10, 5, 0, st);
  kv_diag_fmm_steps(d, 10, 5, 1, fp);
  /* at 10: steps 11, 12 (sink .2 each): evicted w2 .4 + .2 over 2.0; at 12: step 13 only */
  CHECK(near(st[0], 0.6 / 2.0) && isnan(st[1]) && near(st[2], 0.1) && isnan(st[3]));
  CHECK(isnan(st[4]));
  /* INT2 counted missed: at 10 w1 too (.1 + .2); at 12 w0, w1 (.5 + .1) */
  CHECK(near(fp[0], (0.6 + 0.3) / 2.0) && near(fp[2], 0.7) && isnan(fp[1]));
  kv_diag_result_t r;
  CHECK_OK(kv_diag_compute(d, &r));
  CHECK(near(r.fmm, (0.3 + 0.1) / 2) && r.events == 2);
  /* a second policy over the same shadow */
  kv_diag_clear_policy(d);
  policy_route(d, 10, all_full);
  CHECK_OK(kv_diag_compute(d, &r));
  CHECK(near(r.fmm, 0.0) && r.events == 1);
  kv_diag_fmm_steps(d, 10, 3, 1, st);
  CHECK(near(st[0], 0.0) && isnan(st[2]));
  kv_diag_destroy(d);
  return tu_done("test_kv_diag_steps");
}
