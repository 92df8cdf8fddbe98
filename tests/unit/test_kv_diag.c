/* test_kv_diag: the mechanism diagnostics on hand-made observations whose FMM, churn,
 * Global LIR, time-to-return, QSA and INT2 mass ratio are computed by hand; and what `qevict
 * eval` adds: FMM per sequence length (with and without INT2 counted as missed) and
 * kv_diag_clear_policy (one shadow serving two policy runs). */
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

static void policy_step(kv_diag_t *d, int len, const float *mass, const int *tier) {
  kv_obs_t o = {KV_OBS_STEP, 0, 0, len, 1, 4, 4, mass, 0, tier};
  kv_diag_observe_policy(d, &o);
}

static void policy_route(kv_diag_t *d, int len, const int *tier) {
  kv_obs_t o = {KV_OBS_ROUTE, 0, 0, len, 0, 4, 4, NULL, 0, tier};
  kv_diag_observe_policy(d, &o);
}

static int near(double a, double b) { return fabs(a - b) < 1e-5; }

/* kv_diag_fmm_steps and kv_diag_clear_policy. */
static void check_steps(void) {
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
}

int main(void) {
  kv_diag_t *d = NULL;
  CHECK_OK(kv_diag_create(1, 2, 1, &d));
  const float s10[4] = {.1f, .2f, .3f, .2f}, s11[4] = {.1f, .1f, .4f, .2f},
              s12[4] = {.2f, .2f, .2f, .2f}, s13[4] = {.5f, .1f, .1f, .1f};
  shadow_step(d, 10, s10, .2f), shadow_step(d, 11, s11, .2f);
  shadow_step(d, 12, s12, .2f), shadow_step(d, 13, s13, .2f);
  const int t10[4] = {F, Q, E, F}, t12s[4] = {Q, Q, E, F}, t13[4] = {F, F, E, F};
  const float p10[4] = {.1f, .3f, 0, .2f}, p12[4] = {.2f, .1f, 0, .2f}, p13[4] = {.4f, .1f, 0, .1f};
  policy_step(d, 10, p10, t10), policy_route(d, 10, t10);
  policy_step(d, 12, p12, t10), policy_route(d, 12, t12s);
  policy_step(d, 13, p13, t12s), policy_route(d, 13, t13);
  kv_diag_result_t r;
  CHECK_OK(kv_diag_compute(d, &r));
  fprintf(stderr, "fmm %g churn %g lir %g ttr %g qsa %g ratio %g\n", r.fmm, r.churn, r.lir,
          r.ttr_median, r.qsa, r.int2_mass_ratio);
  CHECK(near(r.fmm, (0.6 / 2.0 + 0.1 / 1.0) / 2));    /* events at 10 and 12 */
  CHECK(near(r.churn, (0.5 + (1 - 1.0 / 3)) / 2));    /* {0,3}->{3}->{0,1,3} */
  CHECK(near(r.lir, 2.0 / 3) && r.lir_eligible == 3); /* w0, w1 return; w2 evicted */
  CHECK(near(r.ttr_median, 2));                       /* returns after 1 and 2 events */
  /* QSA: event 10: one INT2 window (cos 1); 12: INT2 {1} under the step's tiers t10 (cos 1);
   * 13: INT2 {0, 1}: (.4*.5 + .1*.1) / (|(.4,.1)| |(.5,.1)|). */
  double c13 = (.4 * .5 + .1 * .1) / (sqrt(.17) * sqrt(.26));
  CHECK(near(r.qsa, (1 + 1 + c13) / 3));
  /* INT2 mass ratio: steps 10 {1}, 12 {1}, 13 {0,1}. */
  CHECK(near(r.int2_mass_ratio, (.3 + .1 + (.4 + .1)) / (.2 + .2 + (.5 + .1))));
  kv_diag_destroy(d);
  check_steps();
  return tu_done("test_kv_diag");
}
