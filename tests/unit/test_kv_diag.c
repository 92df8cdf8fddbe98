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
  /* at 10: steps 11, 12 (sink .2 each): evicted w2 .4 + .2 over 1.6 (w3, partly filled at the
   * event since no step after it opens a 5th window, is not counted); at 12: step 13 only */
  CHECK(near(st[0], 0.6 / 1.6) && isnan(st[1]) && near(st[2], 0.1 / 0.9) && isnan(st[3]));
  CHECK(isnan(st[4]));
  /* INT2 counted missed: at 10 w1 too (.1 + .2); at 12 w0, w1 (.5 + .1) */
  CHECK(near(fp[0], (0.6 + 0.3) / 1.6) && near(fp[2], 0.7 / 0.9) && isnan(fp[1]));
  kv_diag_result_t r;
  CHECK_OK(kv_diag_compute(d, &r));
  CHECK(near(r.fmm, (0.6 / 1.6 + 0.1 / 0.9) / 2) && r.events == 2);
  /* a second policy over the same shadow */
  kv_diag_clear_policy(d);
  policy_route(d, 10, all_full);
  CHECK_OK(kv_diag_compute(d, &r));
  CHECK(near(r.fmm, 0.0) && r.events == 1);
  kv_diag_fmm_steps(d, 10, 3, 1, st);
  CHECK(near(st[0], 0.0) && isnan(st[2]));
  kv_diag_destroy(d);
}

/* One observation of n windows (all aged, all Full unless tier is given). */
static void observe(kv_diag_t *d, int kind, int len, int n, const float *mass, float sink,
                    const int *tier, int shadow) {
  const int full[8] = {F, F, F, F, F, F, F, F};
  kv_obs_t o = {kind, 0, 0, len, kind == KV_OBS_STEP, n, n, mass, sink, tier ? tier : full};
  (shadow ? kv_diag_observe_shadow : kv_diag_observe_policy)(d, &o);
}

/* A window only partly filled at a routing event (a prefill event, or a local region that is
 * not whole windows) also holds tokens that came after it: DESIGN.md's FMM (seed 000, 3.5)
 * counts in its denominator only the states that existed at the event, so that window's
 * future mass is left out (it is local: never missed). A window complete at the event counts. */
static void check_partial_window(void) {
  kv_diag_t *d = NULL;
  CHECK_OK(kv_diag_create(1, 2, 1, &d));
  /* event at 10: 3 windows, the 3rd partial (the shadow's next steps have no 4th) */
  const float a11[3] = {.1f, .3f, .4f}, a12[3] = {.2f, .2f, .4f};
  observe(d, KV_OBS_STEP, 11, 3, a11, .2f, NULL, 1),
      observe(d, KV_OBS_STEP, 12, 3, a12, .2f, NULL, 1);
  /* event at 20: 3 windows, all complete (the next step opens a 4th) */
  const float a21[4] = {.1f, .3f, .2f, .2f};
  observe(d, KV_OBS_STEP, 21, 4, a21, .2f, NULL, 1);
  const int t[3] = {E, F, F};
  observe(d, KV_OBS_ROUTE, 10, 3, NULL, 0, t, 0), observe(d, KV_OBS_ROUTE, 20, 3, NULL, 0, t, 0);
  double st[11];
  kv_diag_fmm_steps(d, 10, 11, 0, st);
  /* at 10: missed w0 .1 + .2 over sink + w0 + w1 (.6 + .6), not w2's .8 (all: 2.0, 0.15) */
  CHECK(near(st[0], 0.3 / 1.2));
  /* at 20: missed .1 over sink + w0..w2 (.8); the new 4th window is not counted */
  CHECK(near(st[10], 0.1 / 0.8));
  kv_diag_destroy(d);
}

/* A policy routing event of n windows, the first `aged` of them aged. */
static void route_aged(kv_diag_t *d, int len, int n, int aged, const int *tier) {
  kv_obs_t o = {KV_OBS_ROUTE, 0, 0, len, 0, n, aged, NULL, 0, tier};
  kv_diag_observe_policy(d, &o);
}

/* Churn compares the windows aged at both events: one that ages between them (the recent
 * region's slide) is not a change of the retained set (it was: 1 - 2/3 with nothing evicted). */
static void check_churn_slide(void) {
  kv_diag_t *d = NULL;
  CHECK_OK(kv_diag_create(1, 2, 1, &d));
  const int t1[4] = {F, F, F, F}, t2[4] = {E, F, F, F};
  route_aged(d, 10, 3, 2, t1), route_aged(d, 14, 4, 3, t1); /* w2 ages, stays Full: 0 */
  route_aged(d, 18, 4, 4, t2);                              /* w0 evicted: {0,1,2} -> {1,2} */
  kv_diag_result_t r;
  CHECK_OK(kv_diag_compute(d, &r));
  fprintf(stderr, "churn over the local region's slide: %g (want %g)\n", r.churn,
          (0 + 1.0 / 3) / 2);
  CHECK(near(r.churn, (0.0 + 1.0 / 3) / 2));
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
  CHECK(near(r.fmm, (0.6 / 1.6 + 0.1 / 0.9) / 2));    /* events at 10 and 12, w3 partial */
  CHECK(near(r.churn, (0.5 + (1 - 1.0 / 3)) / 2));    /* {0,3}->{3}->{0,1,3} */
  CHECK(near(r.lir, 2.0 / 3) && r.lir_eligible == 3); /* w0, w1 return; w2 evicted */
  CHECK(near(r.ttr_median, 2));                       /* returns after 1 and 2 events */
  /* QSA: event 10: one INT2 window (cos 1); 12: INT2 {1} under the step's tiers t10 (cos 1);
   * 13: INT2 {0, 1}: (.4*.5 + .1*.1) / (|(.4,.1)| |(.5,.1)|). */
  double c13 = (.4 * .5 + .1 * .1) / (sqrt(.17) * sqrt(.26));
  CHECK(near(r.qsa, (1 + 1 + c13) / 3));
  /* INT2 mass ratio: steps 10 {1}, 12 {1}, 13 {0,1}. */
  CHECK(near(r.int2_mass_ratio, (.3 + .1 + (.4 + .1)) / (.2 + .2 + (.5 + .1))));
  /* what each is over: FMM's events 10 and 12 (13 has no step after it), two pairs */
  CHECK(r.fmm_events == 2 && r.churn_pairs == 2 && r.qsa_events == 3 && r.lir_returned == 2);
  CHECK(near(r.int2_full_mass, .2 + .2 + (.5 + .1)));
  /* a policy that never routed: every diagnostic undefined, NaN, its count 0 */
  kv_diag_clear_policy(d);
  CHECK_OK(kv_diag_compute(d, &r));
  CHECK(isnan(r.fmm) && isnan(r.churn) && isnan(r.lir) && isnan(r.ttr_median));
  CHECK(isnan(r.qsa) && isnan(r.int2_mass_ratio) && r.events == 0);
  CHECK(!r.fmm_events && !r.churn_pairs && !r.lir_eligible && !r.lir_returned);
  CHECK(!r.qsa_events && r.int2_full_mass == 0);
  kv_diag_destroy(d);
  check_steps();
  check_partial_window();
  check_churn_slide();
  return tu_done("test_kv_diag");
}
