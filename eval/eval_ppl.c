/* eval_ppl: perplexity, KL(FullKV || policy) and top-1 agreement of teacher-forced rows of
 * logits (see eval_ppl.h). */
#include "eval_ppl.h"

#include <math.h>
#include <stddef.h>

#include "qe_status.h"

/* Log-sum-exp of row x[n] in double; and *am: its argmax (lowest id on ties). NAN when the row
 * holds NaN or +inf, or only -inf. */
static double row_lse(const float *x, int n, int *am) {
  int m = 0;
  for (int v = 0; v < n; v++) {
    if (isnan(x[v]) || (isinf(x[v]) && x[v] > 0)) return NAN;
    m = x[v] > x[m] ? v : m;
  }
  *am = m;
  if (isinf(x[m])) return NAN;
  double sum = 0;
  for (int v = 0; v < n; v++) sum += exp((double)x[v] - x[m]);
  return (double)x[m] + log(sum);
}

/* sum_v p_f(v) (log p_f(v) - log p_a(v)) for rows f, a with log-sum-exps lf, la. */
static double row_kl(const float *f, double lf, const float *a, double la, int n) {
  double kl = 0;
  for (int v = 0; v < n; v++) {
    double lpf = (double)f[v] - lf;
    if (isinf(lpf)) continue; /* p_f(v) = 0 */
    kl += exp(lpf) * (lpf - ((double)a[v] - la));
  }
  return kl > 0 ? kl : 0; /* >= 0 but for rounding at the last bits */
}

int eval_ppl_score(const float *lg, const float *ref, const int32_t *target, int n, int n_vocab,
                   eval_ppl_t *out) {
  double nll = 0, kl = 0;
  int agree = 0;
  for (int i = 0; i < n; i++) {
    const float *a = lg + (size_t)i * n_vocab, *f = ref ? ref + (size_t)i * n_vocab : NULL;
    int am = 0, fm = 0;
    double la = row_lse(a, n_vocab, &am), lf = f ? row_lse(f, n_vocab, &fm) : 0;
    if (isnan(la) || isnan(lf))
      return qe_errf(QE_ERANGE, "ppl: the %s logits of scored token %d hold NaN, +inf or only -inf",
                     isnan(la) ? "run's" : "reference's", i);
    nll -= (double)a[target[i]] - la;
    if (!f) continue;
    kl += row_kl(f, lf, a, la, n_vocab);
    agree += am == fm;
  }
  out->ppl = exp(nll / n), out->kl = ref ? kl / n : 0.0;
  out->top1 = ref ? (double)agree / n : 1.0;
  return 0;
}
