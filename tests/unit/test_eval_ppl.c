/* test_eval_ppl: the arithmetic of `qevict eval`'s perplexity task (eval_ppl_score) against
 * sums taken here in long double: perplexity, KL(ref || run) over the whole vocabulary and
 * top-1 agreement (lowest id on ties) on hand-made rows; KL at the size of real models' logits
 * (lse about 60) where the distributions barely differ; -inf logits (probability 0); NaN and
 * +inf refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "eval_ppl.h"
#include "qe_status.h"
#include "test_util.h"

/* log-sum-exp of x[n] in long double. */
static long double lse_ld(const float *x, int n) {
  long double m = -INFINITY, s = 0;
  for (int v = 0; v < n; v++) m = x[v] > m ? x[v] : m;
  for (int v = 0; v < n; v++) s += expl((long double)x[v] - m);
  return m + logl(s);
}

/* KL(softmax(f) || softmax(a)) in long double. */
static long double kl_ld(const float *f, const float *a, int n) {
  long double lf = lse_ld(f, n), la = lse_ld(a, n), kl = 0;
  for (int v = 0; v < n; v++) {
    long double pf = expl((long double)f[v] - lf);
    if (pf > 0) kl += pf * (((long double)f[v] - lf) - ((long double)a[v] - la));
  }
  return kl;
}

static void check_hand(void) {
  /* row 0: ref (0, 0, ln 2) is (1/4, 1/4, 1/2), run uniform: KL = ln(9/8) / 2; ref's argmax 2,
   * run's 0 (the lowest of a three-way tie). Row 1: both tie at ids 0 and 1: argmax 0 both. */
  float ref[6] = {0, 0, (float)M_LN2, 2, 2, 0}, run[6] = {5, 5, 5, 3, 3, 0};
  int32_t tg[2] = {2, 1};
  eval_ppl_t s;
  CHECK_OK(eval_ppl_score(run, ref, tg, 2, 3, &s));
  long double kl = (kl_ld(ref, run, 3) + kl_ld(ref + 3, run + 3, 3)) / 2;
  long double nll = (-(run[2] - lse_ld(run, 3)) - (run[4] - lse_ld(run + 3, 3))) / 2;
  CHECK(fabs(s.kl - (double)kl) < 1e-12);
  CHECK(fabsl(kl_ld(ref, run, 3) - 0.5L * logl(9.0L / 8)) < 1e-7); /* ln 2 rounded to float */
  CHECK(fabs(s.ppl - (double)expl(nll)) < 1e-12 * s.ppl);
  CHECK(s.top1 == 0.5);
  CHECK_OK(eval_ppl_score(ref, NULL, tg, 2, 3, &s));
  CHECK(s.kl == 0 && s.top1 == 1);
}

/* Logits of a large model's size: lse near 60, the run's row the reference's plus noise of
 * 1e-5, so the true KL is about 1e-11 a token; float log-probabilities lose it (their rounding
 * is ~1e-6 a row and may make it negative). Also the run equal to the reference shifted by 32,
 * exactly, in float: the same distribution, KL 0. */
static void check_precision(void) {
  enum { N = 8, V = 4096 };
  float *f = malloc(sizeof(float) * N * V), *a = malloc(sizeof(float) * N * V);
  int32_t tg[N] = {0};
  uint64_t st = 7;
  for (int i = 0; i < N * V; i++) {
    f[i] = 60 + roundf(tu_randf(&st, -8, 8) * 1024) / 1024;
    a[i] = f[i] + tu_randf(&st, -1e-5f, 1e-5f);
  }
  long double kl = 0;
  for (int i = 0; i < N; i++) kl += kl_ld(f + (size_t)i * V, a + (size_t)i * V, V) / N;
  eval_ppl_t s;
  CHECK_OK(eval_ppl_score(a, f, tg, N, V, &s));
  CHECK(s.kl >= 0 && fabs(s.kl - (double)kl) <= 1e-3 * (double)kl + 1e-15);
  for (int i = 0; i < N * V; i++) a[i] = f[i] - 32;
  CHECK_OK(eval_ppl_score(a, f, tg, N, V, &s));
  CHECK(s.kl >= 0 && s.kl < 1e-13 && s.top1 == 1);
  free(f), free(a);
}

/* A logit of -inf is a probability of 0. */
static void check_neg_inf(void) {
  float ref[3] = {1, 2, -INFINITY}, run[3] = {2, 1, 0}, both[3] = {1, 2, -INFINITY};
  int32_t tg[1] = {1};
  eval_ppl_t s;
  CHECK_OK(eval_ppl_score(run, ref, tg, 1, 3, &s));
  CHECK(isfinite(s.kl) && fabs(s.kl - (double)kl_ld(ref, run, 3)) < 1e-12);
  CHECK_OK(eval_ppl_score(both, ref, tg, 1, 3, &s));
  CHECK(s.kl == 0 && s.top1 == 1 && isfinite(s.ppl));
  CHECK_OK(eval_ppl_score(ref, run, tg, 1, 3, &s)); /* run gives 0 where ref has mass */
  CHECK(isinf(s.kl) && s.kl > 0);
  tg[0] = 2;
  CHECK_OK(eval_ppl_score(ref, NULL, tg, 1, 3, &s)); /* the target at probability 0 */
  CHECK(isinf(s.ppl));
}

/* NaN, +inf or a row of only -inf: QE_ERANGE, *out untouched. */
static void check_refused(void) {
  float ok[3] = {0, 1, 2},
        bad[4][3] = {{0, NAN, 1}, {0, INFINITY, 1}, {-INFINITY, -INFINITY, -INFINITY}, {NAN, 0, 0}};
  int32_t tg[1] = {0};
  for (int k = 0; k < 4; k++) {
    eval_ppl_t s = {-1, -1, -1};
    CHECK(eval_ppl_score(bad[k], ok, tg, 1, 3, &s) == QE_ERANGE);
    CHECK(s.ppl == -1 && s.kl == -1 && s.top1 == -1);
    CHECK(eval_ppl_score(ok, bad[k], tg, 1, 3, &s) == QE_ERANGE);
  }
}

int main(void) {
  check_hand();
  check_precision();
  check_neg_inf();
  check_refused();
  return tu_done("eval_ppl");
}
