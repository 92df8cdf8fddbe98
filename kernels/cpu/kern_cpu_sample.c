/* kern_cpu_sample: token sampling on the host (greedy, temperature, top-k, top-p) with a
 * per-sequence xorshift64* state, so the same seed always gives the same tokens. */
#include <math.h>
#include <stdlib.h>

#include "kern_cpu_internal.h"

uint64_t kern_rng_seed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z ? z : 1;
}

float kern_rng_uniform(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return (float)((x * 0x2545F4914F6CDD1Dull) >> 40) * (1.0f / 16777216.0f);
}

static int argmax(const float *x, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

static _Thread_local const float *g_sort_vals; /* qsort has no context argument in C11 */
static int by_value_desc(const void *a, const void *b) {
  float x = g_sort_vals[*(const int *)a], y = g_sort_vals[*(const int *)b];
  if (x != y) return x < y ? 1 : -1;
  return *(const int *)a - *(const int *)b;
}

/* Keeps the top k ids (sorted by probability, descending) in idx; returns how many remain. */
static int sort_candidates(const float *prob, int *idx, int n, int top_k) {
  for (int i = 0; i < n; i++) idx[i] = i;
  g_sort_vals = prob;
  qsort(idx, (size_t)n, sizeof *idx, by_value_desc);
  return top_k > 0 && top_k < n ? top_k : n;
}

int kern_cpu_sample(kern_backend_t *be, const float *logits, int n, const kern_sampler_t *s,
                    uint64_t *rng, void *scratch) {
  if (s->temp <= 0.0f) return argmax(logits, n);
  float *prob = scratch;
  int *idx = (int *)(prob + n);
  int inf = 0;
  for (int i = 0; i < n; i++) prob[i] = logits[i] / s->temp, inf |= isinf(prob[i]);
  if (inf) { /* a temperature so small that logits / temp overflow: from the best logit (the
                others' -inf weigh 0), so the choice is greedy among the best, not NaN */
    const float mx = logits[argmax(logits, n)];
    for (int i = 0; i < n; i++) prob[i] = (logits[i] - mx) / s->temp;
  }
  kern_cpu_softmax_row(prob, n);
  int m = sort_candidates(prob, idx, n, s->top_k);
  float total = 0;
  for (int i = 0; i < m; i++) {
    total += prob[idx[i]];
    if (s->top_p < 1.0f && total >= s->top_p) {
      m = i + 1;
      break;
    }
  }
  float u = kern_rng_uniform(rng) * total, acc = 0;
  for (int i = 0; i < m; i++) {
    acc += prob[idx[i]];
    if (u < acc) return idx[i];
  }
  return idx[m - 1];
}

/* argmax, or -1 for a row holding a NaN or +inf, or only -inf (kern.h). */
static int argmax_checked(const float *x, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) bad |= x[i] != x[i] || x[i] == INFINITY;
  const int best = argmax(x, n);
  return bad || x[best] == -INFINITY ? -1 : best;
}

int kern_cpu_argmax(kern_backend_t *be, const float *x, int m, int n, int32_t *ids) {
  (void)be;
  for (int i = 0; i < m; i++) ids[i] = argmax_checked(x + (size_t)i * n, n);
  return 0;
}
