/* test_graphkv: GraphKV re-scoring. The seed's teaching example (top-2 {A,B} -> {A,C}), hand-
 * computed products of two sources' discounts over two rounds (sources decaying too), ties,
 * zero keys, negative similarities, determinism, permutation equivariance, an O(n^2) brute-force
 * reference on random data (same float ops in the same order: exact equality), bad params. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphkv.h"
#include "qe_status.h"
#include "test_util.h"

/* ---- helpers ---- */

static graphkv_params_t params(float frac, int m, int rounds) {
  graphkv_params_t p = {frac, m, rounds};
  return p;
}

/* Runs graphkv_rescore with a fresh workspace of exactly graphkv_workspace bytes, deliberately
 * misaligned by one byte (the function must align it itself). */
static int rescore(float *s, const float *keys, int n, int dim, int n_slots,
                   const graphkv_params_t *p) {
  char *ws = malloc(graphkv_workspace(n, dim) + 1);
  int rc = graphkv_rescore(s, keys, n, dim, n_slots, p, ws + 1);
  free(ws);
  return rc;
}

/* Bitmask of the indices of the top 2 of s[n] (n <= 32; ties -> lower index). */
static unsigned top2(const float *s, int n) {
  int a = 0;
  for (int j = 1; j < n; j++)
    if (s[j] > s[a]) a = j;
  int b = a == 0 ? 1 : 0;
  for (int j = 0; j < n; j++)
    if (j != a && s[j] > s[b]) b = j;
  return (1u << a) | (1u << b);
}

static int near(float got, double want, double tol) { return fabs((double)got - want) <= tol; }

/* ---- 1: the seed's teaching example (summary 2.4) ---- */

static void test_teaching_example(void) {
  /* A source (k = ceil(0.5 * 2) = 1), m = 2, e_AB = 0.9, e_AC = 0.1, e_AD = 0 (not in N(A)). */
  enum { A, B, C, D };
  float keys[4 * 4] = {1, 0, 0, 0, 0.9f, sqrtf(0.19f), 0, 0, 0.1f, 0, sqrtf(0.99f), 0, 0, 0, 0, 1};
  float s[4] = {1.0f, 0.9f, 0.7f, 0.6f};
  CHECK(top2(s, 4) == ((1u << A) | (1u << B)));
  graphkv_params_t p = params(0.5f, 2, 1);
  CHECK(graphkv_n_sources(&p, 4, 2) == 1);
  CHECK_OK(rescore(s, keys, 4, 4, 2, &p));
  CHECK(s[A] == 1.0f);
  CHECK(near(s[B], 0.09, 1e-6));
  CHECK(near(s[C], 0.63, 1e-6));
  CHECK(s[D] == 0.6f);
  CHECK(top2(s, 4) == ((1u << A) | (1u << C)));
}

/* ---- 2: hand-computed products and rounds ---- */

/* S1 = 0 (score 1.0), S2 = 1 (0.8), X = 2 (0.5), Y = 3 (0.4). e(S1,X) = 0.5, e(S2,X) = 0.6,
 * e(S1,S2) = 0.3, e(S1,Y) = -0.5, e(S2,Y) = -0.6. Sources: S1, S2 (frac 1, 2 slots). */
static const float hand_keys[4 * 3] = {0.5f, 0.8660254f, 0, 0.6f, 0, 0.8f, 1, 0, 0, -1, 0, 0};

static void test_shared_neighbour(void) {
  float s[4] = {1.0f, 0.8f, 0.5f, 0.4f};
  graphkv_params_t p = params(1.0f, 1, 1); /* m = 1: both sources pick X */
  CHECK_OK(rescore(s, hand_keys, 4, 3, 2, &p));
  CHECK(s[0] == 1.0f && s[1] == 0.8f && s[3] == 0.4f);
  CHECK(near(s[2], 0.5 * 0.5 * 0.4, 1e-6)); /* 0.1: product of the two discounts */

  float s2[4] = {1.0f, 0.8f, 0.5f, 0.4f};
  p.rounds = 2; /* the same discount applied twice: 0.5 * 0.2^2 */
  CHECK_OK(rescore(s2, hand_keys, 4, 3, 2, &p));
  CHECK(near(s2[2], 0.02, 1e-6));
  CHECK(s2[0] == 1.0f && s2[1] == 0.8f && s2[3] == 0.4f);
}

static void test_sources_decay(void) {
  /* m = 2: N(S1) = {X, S2}, N(S2) = {X, S1}. Each source is discounted by the other one. */
  float s[4] = {1.0f, 0.8f, 0.5f, 0.4f};
  graphkv_params_t p = params(1.0f, 2, 1);
  CHECK_OK(rescore(s, hand_keys, 4, 3, 2, &p));
  CHECK(near(s[0], 1.0 * 0.7, 1e-6));
  CHECK(near(s[1], 0.8 * 0.7, 1e-6));
  CHECK(near(s[2], 0.1, 1e-6));
  CHECK(s[3] == 0.4f);
  /* m = 3 also reaches Y, through negative edges: clipped, so Y is unchanged. */
  float s3[4] = {1.0f, 0.8f, 0.5f, 0.4f};
  p.m = 3;
  CHECK_OK(rescore(s3, hand_keys, 4, 3, 2, &p));
  CHECK(!memcmp(s3, s, sizeof s));
  /* One source only (k = ceil(0.5 * 2) = 1): S1 discounts S2 and X; nothing discounts S1. */
  float s1[4] = {1.0f, 0.8f, 0.5f, 0.4f};
  p = params(0.5f, 2, 1);
  CHECK_OK(rescore(s1, hand_keys, 4, 3, 2, &p));
  CHECK(s1[0] == 1.0f && near(s1[1], 0.56, 1e-6) && near(s1[2], 0.25, 1e-6) && s1[3] == 0.4f);
}

/* ---- 3: properties ---- */

static void test_ties_and_zero_keys(void) {
  /* Equal scores: the source is index 0. Candidates 1..3 all have e = 1/sqrt(2) with it;
   * m = 1 picks the lowest index (1). Duplicate direction (index 4, e = 1): m = 2 -> {4, 1}. */
  float keys[5 * 2] = {1, 0, 1, 1, 1, 1, 1, -1, 3, 0};
  float s[5] = {1, 1, 1, 1, 0.5f};
  graphkv_params_t p = params(0.25f, 1, 1); /* k = ceil(0.25 * 4) = 1 */
  float t[5];
  memcpy(t, s, sizeof s);
  CHECK_OK(rescore(t, keys, 4, 2, 4, &p)); /* only the first 4 candidates */
  CHECK(t[0] == 1 && near(t[1], 1 - sqrt(0.5), 1e-6) && t[2] == 1 && t[3] == 1);
  memcpy(t, s, sizeof s);
  p.m = 2;
  CHECK_OK(rescore(t, keys, 5, 2, 4, &p));
  CHECK(t[4] == 0.0f); /* cos exactly 1 -> discount to 0, never negative */
  CHECK(near(t[1], 1 - sqrt(0.5), 1e-6) && t[2] == 1 && t[3] == 1 && t[0] == 1);

  /* Zero keys: a zero source discounts nothing; a zero candidate is never discounted. */
  float zk[3 * 2] = {0, 0, 1, 0, 1, 0};
  float zs[3] = {1, 0.5f, 0.4f};
  p = params(1.0f, 2, 1);
  CHECK_OK(rescore(zs, zk, 3, 2, 1, &p)); /* k = 1: the zero key is the source */
  CHECK(zs[0] == 1 && zs[1] == 0.5f && zs[2] == 0.4f);
  float zs2[3] = {0.3f, 1, 0.4f};
  CHECK_OK(rescore(zs2, zk, 3, 2, 1, &p)); /* source 1 discounts 2 to 0, not the zero key */
  CHECK(zs2[0] == 0.3f && zs2[1] == 1 && zs2[2] == 0.0f);

  /* n = 1 (m clamps to 0) and n = 0 are no-ops. */
  float one = 0.7f, kk = 2;
  CHECK_OK(rescore(&one, &kk, 1, 1, 5, &p));
  CHECK(one == 0.7f);
  CHECK_OK(graphkv_rescore(NULL, NULL, 0, 4, 3, &p, NULL));
}

static void test_negative_similarity(void) {
  /* The source (index 0) has negative cosine with every other candidate: nothing changes. */
  enum { N = 6, DIM = 3 };
  uint64_t st = 11;
  float keys[N * DIM], s[N], s0[N];
  keys[0] = 1, keys[1] = 0, keys[2] = 0;
  for (int j = 1; j < N; j++) {
    keys[j * DIM] = tu_randf(&st, -2, -0.1f);
    keys[j * DIM + 1] = tu_randf(&st, -1, 1);
    keys[j * DIM + 2] = tu_randf(&st, -1, 1);
  }
  for (int j = 0; j < N; j++) s0[j] = s[j] = j == 0 ? 2.0f : tu_randf(&st, 0, 1);
  graphkv_params_t p = params(1.0f, N - 1, 3);
  CHECK_OK(rescore(s, keys, N, DIM, 1, &p));
  CHECK(!memcmp(s, s0, sizeof s));
}

/* Random keys around a few centroids (so neighbours are really similar), some zero and some
 * negated; scores in [0, 1), quantised to 4 levels when `ties`, some exactly 0. */
static void gen(uint64_t *st, float *s, float *keys, int n, int dim, int ties) {
  int nc = 1 + n / 16;
  float *cent = malloc(sizeof(float) * nc * dim);
  for (int i = 0; i < nc * dim; i++) cent[i] = tu_randf(st, -1, 1);
  for (int j = 0; j < n; j++) {
    int c = (int)tu_randf(st, 0, (float)nc) % nc;
    float r = tu_randf(st, 0, 1), noise = tu_randf(st, 0.01f, 0.8f);
    for (int d = 0; d < dim; d++) {
      float x = cent[c * dim + d] + noise * tu_randf(st, -1, 1);
      keys[(size_t)j * dim + d] = r < 0.05f ? 0.0f : r < 0.15f ? -x : x;
    }
    s[j] = tu_randf(st, 0, 1);
    if (ties) s[j] = floorf(s[j] * 4) / 4;
    if (r > 0.97f) s[j] = 0;
  }
  free(cent);
}

static void test_properties_random(void) {
  uint64_t st = 3;
  int n = 300, dim = 16;
  float *s = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n);
  float *b = malloc(sizeof(float) * n), *keys = malloc(sizeof(float) * n * dim);
  gen(&st, s, keys, n, dim, 1);
  graphkv_params_t p = params(0.3f, 8, 2);
  memcpy(a, s, sizeof(float) * n);
  memcpy(b, s, sizeof(float) * n);
  CHECK_OK(rescore(a, keys, n, dim, 64, &p));
  CHECK_OK(rescore(b, keys, n, dim, 64, &p));
  CHECK(!memcmp(a, b, sizeof(float) * n)); /* deterministic */
  int bad = 0, changed = 0;
  for (int j = 0; j < n; j++) {
    bad += !(a[j] >= 0.0f && a[j] <= s[j]);
    changed += a[j] != s[j];
  }
  CHECK(bad == 0);
  CHECK(changed > 0);
  free(s), free(a), free(b), free(keys);
}

/* Permuting the candidates permutes the results bit for bit (distinct scores and, with
 * probability ~1, distinct similarities: no ties for the tie-break to resolve differently). */
static void test_permutation(void) {
  uint64_t st = 21;
  enum { N = 200, DIM = 24 };
  static float s[N], keys[N * DIM], out[N], ps[N], pkeys[N * DIM];
  int perm[N];
  gen(&st, s, keys, N, DIM, 0);
  for (int j = 0; j < N; j++) s[j] = 0.1f + (float)j / N * tu_randf(&st, 0.999f, 1.0f);
  for (int j = 0; j < N; j++) perm[j] = j;
  for (int j = N - 1; j > 0; j--) {
    int r = (int)tu_randf(&st, 0, (float)(j + 1)) % (j + 1), t = perm[j];
    perm[j] = perm[r], perm[r] = t;
  }
  for (int j = 0; j < N; j++) {
    ps[j] = s[perm[j]];
    memcpy(pkeys + j * DIM, keys + perm[j] * DIM, sizeof(float) * DIM);
  }
  graphkv_params_t p = params(0.3f, 5, 2);
  memcpy(out, s, sizeof s);
  CHECK_OK(rescore(out, keys, N, DIM, 50, &p));
  CHECK_OK(rescore(ps, pkeys, N, DIM, 50, &p));
  int diff = 0;
  for (int j = 0; j < N; j++) diff += ps[j] != out[perm[j]];
  CHECK(diff == 0);
}

/* ---- 4: brute-force O(n^2) reference ---- */

static const float *g_rank_key;

static int ref_cmp(const void *pa, const void *pb) {
  int a = *(const int *)pa, b = *(const int *)pb;
  if (g_rank_key[a] != g_rank_key[b]) return g_rank_key[a] > g_rank_key[b] ? -1 : 1;
  return (a > b) - (a < b);
}

static float ref_cos(const float *x, const float *y, int dim) {
  double dot = 0, nx = 0, ny = 0;
  for (int d = 0; d < dim; d++) dot += (double)x[d] * y[d];
  for (int d = 0; d < dim; d++) nx += (double)x[d] * x[d];
  for (int d = 0; d < dim; d++) ny += (double)y[d] * y[d];
  nx = sqrt(nx), ny = sqrt(ny);
  if (nx == 0 || ny == 0) return 0;
  double c = dot / (nx * ny);
  if (!isfinite(c)) return 0;
  return (float)(c > 1 ? 1 : c < -1 ? -1 : c);
}

/* Full similarity matrix, full sorts, decay products in source rank order, T rounds. */
static void ref_rescore(float *s, const float *keys, int n, int dim, int k, int m, int rounds) {
  float *e = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n);
  int *order = malloc(sizeof(int) * n), *nb = malloc(sizeof(int) * n);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++)
      e[i * n + j] = ref_cos(keys + (size_t)i * dim, keys + (size_t)j * dim, dim);
  for (int j = 0; j < n; j++) order[j] = j, c[j] = 1.0f;
  g_rank_key = s;
  qsort(order, n, sizeof(int), ref_cmp);
  if (m > n - 1) m = n - 1;
  for (int t = 0; t < k; t++) {
    int i = order[t], cnt = 0;
    for (int j = 0; j < n; j++)
      if (j != i) nb[cnt++] = j;
    g_rank_key = e + (size_t)i * n;
    qsort(nb, cnt, sizeof(int), ref_cmp);
    for (int u = 0; u < m; u++) c[nb[u]] *= 1.0f - fmaxf(e[i * n + nb[u]], 0.0f);
  }
  for (int r = 0; r < rounds; r++)
    for (int j = 0; j < n; j++) s[j] *= c[j];
  free(e), free(c), free(order), free(nb);
}

static int ref_k(float frac, int n, int n_slots) {
  int k = (int)ceil((double)frac * n_slots - 1e-4); /* fracs below are short decimals */
  return k < 1 ? 1 : k > n ? n : k;
}

static void test_reference(void) {
  static const int ns[] = {1, 2, 3, 9, 17, 64, 200, 500};
  static const int dims[] = {1, 3, 16, 40};
  static const float fracs[] = {0.1f, 0.3f, 0.5f, 1.0f};
  static const int ms[] = {1, 3, 8, 1000};
  uint64_t st = 7;
  int runs = 0, mismatches = 0, kmis = 0;
  double worst = 0;
  for (int a = 0; a < 8; a++)
    for (int t = 0; t < 6; t++) {
      int n = ns[a], dim = dims[(a + t) % 4], m = ms[(a * 3 + t) % 4];
      float frac = fracs[t % 4];
      int slots = t % 3 == 0 ? n / 4 : t % 3 == 1 ? n : 2 * n + 1, rounds = 1 + t % 3;
      float *s = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n);
      float *keys = malloc(sizeof(float) * n * dim);
      gen(&st, s, keys, n, dim, t & 1);
      memcpy(r, s, sizeof(float) * n);
      graphkv_params_t p = params(frac, m, rounds);
      kmis += graphkv_n_sources(&p, n, slots) != ref_k(frac, n, slots);
      CHECK_OK(rescore(s, keys, n, dim, slots, &p));
      ref_rescore(r, keys, n, dim, ref_k(frac, n, slots), m, rounds);
      for (int j = 0; j < n; j++) {
        mismatches += s[j] != r[j];
        double den = fabs(r[j]) > 1e-30 ? fabs(r[j]) : 1e-30, rel = fabs(s[j] - r[j]) / den;
        if (rel > worst) worst = rel;
      }
      runs++;
      free(s), free(r), free(keys);
    }
  printf("reference: %d runs, %d mismatching scores, worst rel err %.3g\n", runs, mismatches,
         worst);
  CHECK(kmis == 0);
  CHECK(worst <= 1e-6);
  CHECK(mismatches == 0); /* same float ops in the same order */
}

static void test_n_sources(void) {
  graphkv_params_t p = params(0.3f, 8, 1);
  CHECK(graphkv_n_sources(&p, 100, 10) == 3);
  CHECK(graphkv_n_sources(&p, 100, 11) == 4);
  CHECK(graphkv_n_sources(&p, 100, 1000) == 100);
  CHECK(graphkv_n_sources(&p, 100, 0) == 1);
  CHECK(graphkv_n_sources(&p, 0, 10) == 0);
  p.source_frac = 0.01f;
  CHECK(graphkv_n_sources(&p, 100, 5) == 1);
  p.source_frac = 0.1f;
  CHECK(graphkv_n_sources(&p, 100000, 70000) == 7000);
  graphkv_params_t d = graphkv_defaults();
  CHECK(d.source_frac == 0.3f && d.m == 8 && d.rounds == 1);
  CHECK_OK(graphkv_check(&d));
  CHECK(graphkv_workspace(0, 8) == 0 && graphkv_workspace(10, 8) > 0);
}

/* A large case: finishes quickly and still only decays. */
static void test_large(void) {
  uint64_t st = 99;
  int n = 20000, dim = 64;
  float *s = malloc(sizeof(float) * n), *s0 = malloc(sizeof(float) * n);
  float *keys = malloc(sizeof(float) * n * dim);
  gen(&st, s, keys, n, dim, 0);
  memcpy(s0, s, sizeof(float) * n);
  graphkv_params_t p = graphkv_defaults();
  CHECK_OK(rescore(s, keys, n, dim, 200, &p));
  int bad = 0, changed = 0;
  for (int j = 0; j < n; j++) bad += !(s[j] >= 0 && s[j] <= s0[j]), changed += s[j] != s0[j];
  CHECK(bad == 0 && changed > 0 && changed <= 60 * 8);
  free(s), free(s0), free(keys);
}

/* ---- 5: bad parameters ---- */

static void expect_einval(int rc, const char *field) {
  CHECK(rc == QE_EINVAL);
  if (!strstr(qe_errmsg(), field)) {
    printf("message '%s' does not name '%s'\n", qe_errmsg(), field);
    CHECK(!"detail names the field");
  }
}

static void test_bad_params(void) {
  graphkv_params_t p = params(0.0f, 8, 1);
  expect_einval(graphkv_check(&p), "source_frac");
  p.source_frac = 1.5f;
  expect_einval(graphkv_check(&p), "source_frac");
  p.source_frac = -0.2f;
  expect_einval(graphkv_check(&p), "source_frac");
  p.source_frac = NAN;
  expect_einval(graphkv_check(&p), "source_frac");
  p = params(1.0f, 0, 1);
  expect_einval(graphkv_check(&p), "m (neighbours)");
  p = params(1.0f, 2, 0);
  expect_einval(graphkv_check(&p), "rounds");
  p.rounds = GRAPHKV_MAX_ROUNDS + 1; /* (a round is a pass over the scores: 2^31 of them hung) */
  expect_einval(graphkv_check(&p), "rounds");
  p.rounds = GRAPHKV_MAX_ROUNDS;
  CHECK_OK(graphkv_check(&p));
  expect_einval(graphkv_check(NULL), "params");

  float keys[3 * 2] = {1, 0, 1, 1, 0, 1}, s[3] = {1, 0.5f, 0.2f}, s0[3];
  memcpy(s0, s, sizeof s);
  char ws[1024];
  p = params(0.3f, 2, 1);
  expect_einval(graphkv_rescore(s, keys, 3, 2, 2, NULL, ws), "params");
  p.rounds = -1;
  expect_einval(graphkv_rescore(s, keys, 3, 2, 2, &p, ws), "rounds");
  p.rounds = 1;
  expect_einval(graphkv_rescore(s, keys, -1, 2, 2, &p, ws), "n must");
  expect_einval(graphkv_rescore(s, keys, 3, 0, 2, &p, ws), "dim");
  expect_einval(graphkv_rescore(s, keys, 3, 2, -1, &p, ws), "n_slots");
  expect_einval(graphkv_rescore(s, keys, 3, 2, 2, &p, NULL), "ws");
  expect_einval(graphkv_rescore(s, NULL, 3, 2, 2, &p, ws), "keys");
  s[1] = -0.5f;
  expect_einval(graphkv_rescore(s, keys, 3, 2, 2, &p, ws), "scores[1]");
  s[1] = NAN;
  expect_einval(graphkv_rescore(s, keys, 3, 2, 2, &p, ws), "scores[1]");
  s[1] = INFINITY;
  expect_einval(graphkv_rescore(s, keys, 3, 2, 2, &p, ws), "scores[1]");
  s[1] = 0.5f;
  CHECK(!memcmp(s, s0, sizeof s)); /* rejected calls leave the scores alone */
}

int main(void) {
  test_teaching_example();
  test_shared_neighbour();
  test_sources_decay();
  test_ties_and_zero_keys();
  test_negative_similarity();
  test_properties_random();
  test_permutation();
  test_reference();
  test_n_sources();
  test_large();
  test_bad_params();
  return tu_done("test_graphkv");
}
