/* test_kern_cpu_src: the CPU backend's attention bit for bit against its documented arithmetic
 * (each score the eight-lane dot product of fused multiply-adds, scaled; the backend's softmax;
 * each output the values summed in key order by fused multiply-adds; each key's mass the heads'
 * probabilities divided by n_head and summed in head order), with the keys and values given as
 * k and v, or through a key-value source of runs (kern_kv_src_t: some runs in place, some copied
 * into the backend's buffer as a cache dequantizing them would), for decode calls (the
 * three-pass split) and for prompts (the blocked path), on fresh random data, several shapes,
 * batches and thread counts, the pool spinning or not; and the softmax row and SwiGLU against
 * their documented arithmetic. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kern_cpu_internal.h"
#include "kern.h"
#include "test_util.h"

static uint64_t rs = 0x5eed0f;

static float *randv(size_t n, float amp) {
  float *x = malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) x[i] = tu_randf(&rs, -amp, amp);
  return x;
}

/* The backend's dot product, written out: eight lanes of fused multiply-adds, then their fixed
 * pairing. */
static float ref_dot(const float *a, const float *b, int n) {
  float s = 0;
  int d = 0;
  if (n % 8 == 0) {
    float acc[8] = {0};
    for (; d < n; d += 8)
      for (int l = 0; l < 8; l++) acc[l] = fmaf(a[d + l], b[d + l], acc[l]);
    s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
  for (; d < n; d++) s = fmaf(a[d], b[d], s);
  return s;
}

typedef struct {
  kern_attn_shape_t sh;
  int n_q, n_kv, q_pos0, mass_q0;
  float *q, *k, *v;
  int32_t *kpos;
} case_t;

static int visible(const case_t *c, int i) {
  int n = 0;
  while (n < c->n_kv && c->kpos[n] <= c->q_pos0 + i) n++;
  return n;
}

/* The expected outputs and masses of one sequence, from the arithmetic above. */
static void reference(kern_backend_t *be, const case_t *c, float *out, float *mass) {
  int hd = c->sh.head_dim, nh = c->sh.n_head, st = c->sh.n_kv_head * hd;
  int grp = nh / c->sh.n_kv_head;
  float *p = malloc(sizeof(float) * (c->n_kv + 1)), *hm = calloc((size_t)nh * c->n_kv + 1, 4);
  for (int h = 0; h < nh; h++)
    for (int i = 0; i < c->n_q; i++) {
      int nk = visible(c, i), kvh = h / grp;
      const float *q = c->q + ((size_t)i * nh + h) * hd;
      float *o = out + ((size_t)i * nh + h) * hd;
      if (nk == 0) continue;
      for (int j = 0; j < nk; j++)
        p[j] = ref_dot(q, c->k + (size_t)j * st + kvh * hd, hd) * c->sh.scale;
      be->ops->softmax(be, p, 1, nk);
      for (int d = 0; d < hd; d++) o[d] = 0;
      for (int j = 0; j < nk; j++)
        for (int d = 0; d < hd; d++) o[d] = fmaf(p[j], c->v[(size_t)j * st + kvh * hd + d], o[d]);
      for (int j = 0; i >= c->mass_q0 && j < nk; j++) hm[(size_t)h * c->n_kv + j] += p[j];
    }
  for (int h = 0; h < nh; h++)
    for (int j = 0; j < c->n_kv; j++) mass[j] += hm[(size_t)h * c->n_kv + j] / (float)nh;
  free(p), free(hm);
}

/* A source over a case's k and v: runs of 1..max_rows keys (every seventh empty), odd runs
 * copied into buf. */
typedef struct {
  kern_kv_src_t src; /* first */
  const case_t *c;
  int32_t first[640];
} test_src_t;

static int test_view(const kern_kv_src_t *s, int r, int which, int kvh, int c0, int nc, float *buf,
                     const float **rows, size_t *stride) {
  const test_src_t *t = (const test_src_t *)s;
  const case_t *c = t->c;
  size_t st = (size_t)c->sh.n_kv_head * c->sh.head_dim;
  int j0 = t->first[r], n = t->first[r + 1] - j0;
  const float *base = (which ? c->v : c->k) + (size_t)j0 * st + (size_t)kvh * c->sh.head_dim + c0;
  if (r % 2 == 0) {
    *rows = base, *stride = st;
    return n;
  }
  for (int i = 0; i < n; i++) memcpy(buf + (size_t)i * nc, base + i * st, sizeof(float) * nc);
  *rows = buf, *stride = (size_t)nc;
  return n;
}

static void make_src(test_src_t *t, const case_t *c, int max_rows) {
  int nr = 0;
  for (int j = 0; j < c->n_kv; nr++) {
    t->first[nr] = j;
    if (nr % 7 != 3) /* every seventh run empty */
      j += 1 + (int)(tu_randf(&rs, 0, 1) * max_rows) % max_rows;
    if (j > c->n_kv) j = c->n_kv;
  }
  t->first[nr] = c->n_kv;
  t->src = (kern_kv_src_t){nr, max_rows, t->first, test_view, NULL};
  t->c = c;
}

static void new_case(case_t *c, kern_attn_shape_t sh, int n_q, int n_kv) {
  *c = (case_t){.sh = sh, .n_q = n_q, .n_kv = n_kv};
  c->kpos = malloc(sizeof(int32_t) * n_kv);
  for (int j = 0, p = 0; j < n_kv; j++) c->kpos[j] = p, p += 1 + (j % 5 == 3);
  c->q_pos0 = c->kpos[n_kv - 1] - n_q + 2; /* the first queries see fewer keys */
  c->mass_q0 = n_q > 2 ? 1 : 0;
  c->q = randv((size_t)n_q * sh.n_head * sh.head_dim, 1);
  c->k = randv((size_t)n_kv * sh.n_kv_head * sh.head_dim, 2);
  c->v = randv((size_t)n_kv * sh.n_kv_head * sh.head_dim, 1);
}

static void free_case(case_t *c) { free(c->q), free(c->k), free(c->v), free(c->kpos); }

/* One call over n_seqs sequences (k and v, or sources when `src`), against the reference. */
static int run_call(kern_backend_t *be, kern_attn_shape_t sh, int n_seqs, int n_q, int src,
                    int max_rows) {
  case_t c[6];
  test_src_t ts[6];
  kern_attn_seq_t w[6] = {0};
  float *out[6], *want[6], *mass[6], *mref[6];
  int ok = 1;
  for (int s = 0; s < n_seqs; s++) {
    new_case(&c[s], sh, n_q, 20 + 37 * s + (int)(tu_randf(&rs, 0, 1) * 200));
    size_t no = (size_t)n_q * sh.n_head * sh.head_dim;
    out[s] = malloc(sizeof(float) * no), want[s] = malloc(sizeof(float) * no);
    for (size_t i = 0; i < no; i++) out[s][i] = want[s][i] = 3.0f;
    mass[s] = calloc(c[s].n_kv, 4), mref[s] = calloc(c[s].n_kv, 4);
    make_src(&ts[s], &c[s], max_rows);
    w[s] = (kern_attn_seq_t){.q = c[s].q,
                             .k = src ? NULL : c[s].k,
                             .v = src ? NULL : c[s].v,
                             .src = src ? &ts[s].src : NULL,
                             .out = out[s],
                             .key_mass = mass[s],
                             .k_pos = c[s].kpos,
                             .n_q = n_q,
                             .n_kv = c[s].n_kv,
                             .q_pos0 = c[s].q_pos0,
                             .mass_q0 = c[s].mass_q0};
  }
  be->ops->attention(be, w, n_seqs, &sh);
  for (int s = 0; s < n_seqs; s++) {
    reference(be, &c[s], want[s], mref[s]);
    size_t no = (size_t)n_q * sh.n_head * sh.head_dim;
    ok &= !memcmp(out[s], want[s], sizeof(float) * no);
    ok &= !memcmp(mass[s], mref[s], sizeof(float) * c[s].n_kv);
    free(out[s]), free(want[s]), free(mass[s]), free(mref[s]);
    free_case(&c[s]);
  }
  return ok;
}

static void check_shapes(kern_backend_t *be, int threads) {
  static const kern_attn_shape_t shapes[] = {{9, 3, 64, 0.125f},
                                             {8, 2, 16, 0.25f},
                                             {6, 2, 24, 0.2f},
                                             {4, 4, 128, 0.09f},
                                             {8, 1, 32, 0.18f}};
  static const int batches[] = {1, 2, 5};
  int bad = 0, runs = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int b = 0; b < 3; b++)
      for (int src = 0; src < 2; src++)
        for (int nq = 1; nq <= 21; nq += 20, runs++)
          if (!run_call(be, shapes[i], batches[b], nq, src, 1 + (int)(i * 7 % 16))) {
            bad++;
            fprintf(stderr, "threads %d shape %zu batch %d src %d n_q %d: not the same bits\n",
                    threads, i, batches[b], src, nq);
          }
  fprintf(stderr, "threads %d: %d of %d calls bit for bit\n", threads, runs - bad, runs);
  CHECK(bad == 0);
}

/* kern_cpu_exp1's documented arithmetic, written out here in scalars (kern_cpu_internal.h). */
static float doc_exp(float x) {
  if (x != x) return x;
  if (x < -87.0f) return 0.0f;
  const float y = x > 88.0f ? 88.0f : x;
  const float nf = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (y - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * (r * r) + r) + 1.0f;
  const int32_t e = ((int32_t)nf + 127) << 23;
  float two_n;
  memcpy(&two_n, &e, sizeof two_n);
  return p * two_n;
}

/* kern_cpu_exp1 equals its documented arithmetic bit for bit and e^x within 2 ulp, on a sweep
 * of [-90, 89] (every 1/4096), the ends, infinities and NaN. */
static void check_exp(void) {
  int bad = 0, far = 0;
  for (int i = -90 * 4096; i <= 89 * 4096; i++) {
    const float x = (float)i / 4096.0f, got = kern_cpu_exp1(x), want = doc_exp(x);
    bad += memcmp(&got, &want, sizeof got) != 0;
    const double e = exp((double)x);
    if (x >= -87.0f && x <= 88.0f && e >= 1.2e-38)
      far += fabs(got - e) > 2.0 * (nextafterf((float)e, INFINITY) - (float)e);
  }
  const float sp[] = {-INFINITY, INFINITY, NAN, -87.0f, -87.00001f, 88.0f, 88.5f, 0.0f, -0.0f};
  for (int i = 0; i < 9; i++) {
    const float got = kern_cpu_exp1(sp[i]), want = doc_exp(sp[i]);
    bad += memcmp(&got, &want, sizeof got) != 0 && !(got != got && want != want);
  }
  CHECK(kern_cpu_exp1(-INFINITY) == 0.0f && kern_cpu_exp1(0.0f) == 1.0f);
  CHECK(kern_cpu_exp1(NAN) != kern_cpu_exp1(NAN));
  fprintf(stderr, "exp: %d values differ from the documented arithmetic, %d beyond 2 ulp\n", bad,
          far);
  CHECK(bad == 0 && far == 0);
}

/* The backend's softmax row equals its documented arithmetic (the maximum by m = x > m ? x : m,
 * then doc_exp(x - m), summed in eight lanes in order and the lanes in a fixed tree, then each
 * divided by the sum), bit for bit: lengths 1 to 300, random rows, rows with zeros of both signs
 * at the maximum, and rows with NaNs (passed over by the maximum). */
static void check_softmax(kern_backend_t *be) {
  int bad = 0;
  float x[300], y[300];
  for (int n = 1; n <= 300; n++)
    for (int kind = 0; kind < 3; kind++) {
      for (int j = 0; j < n; j++) x[j] = tu_randf(&rs, -9, 3);
      if (kind == 1)
        for (int j = 0; j < n; j++) x[j] = j % 3 ? -fabsf(x[j]) : (j % 2 ? -0.0f : 0.0f);
      if (kind == 2) x[(n * 7) % n] = NAN, x[n / 2] = NAN;
      if (kind == 2 && n % 50 == 11) /* (a row of -inf and NaN: every output NaN, as before) */
        for (int j = 0; j < n; j++) x[j] = j % 4 ? -INFINITY : NAN;
      float mx = -INFINITY, lane[8] = {0};
      for (int j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
      for (int j = 0; j < n; j++) {
        y[j] = doc_exp(x[j] - mx);
        lane[j % 8] += y[j];
      }
      const float s =
          ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      for (int j = 0; j < n; j++) y[j] /= s;
      be->ops->softmax(be, x, 1, n);
      bad += memcmp(x, y, sizeof(float) * n) != 0;
    }
  fprintf(stderr, "softmax: %d of 900 rows differ from the documented arithmetic\n", bad);
  CHECK(bad == 0);
}

/* The backend's SwiGLU equals g / (1 + doc_exp(-g)) * u bit for bit: lengths 1 to 40 (the
 * eight-lane body and every tail), gates over [-100, 100] so both clamps of e^x are reached. */
static void check_swiglu(kern_backend_t *be) {
  int bad = 0;
  float g[40], u[40], y[40];
  for (int n = 1; n <= 40; n++)
    for (int rep = 0; rep < 20; rep++) {
      for (int j = 0; j < n; j++) g[j] = tu_randf(&rs, -100, 100), u[j] = tu_randf(&rs, -3, 3);
      be->ops->swiglu(be, y, g, u, 1, n);
      for (int j = 0; j < n; j++) {
        const float want = g[j] / (1.0f + doc_exp(-g[j])) * u[j];
        bad += memcmp(&y[j], &want, sizeof want) != 0;
      }
    }
  fprintf(stderr, "swiglu: %d of 16400 values differ from the documented arithmetic\n", bad);
  CHECK(bad == 0);
}

int main(void) {
  static const int threads[] = {1, 2, 3, 7};
  for (int i = 0; i < 4; i++) {
    kern_backend_t *be = NULL;
    setenv("QE_CPU_SPIN_US", i % 2 ? "0" : "100", 1);
    CHECK_OK(kern_cpu_create(threads[i], &be));
    if (!i) check_softmax(be), check_exp(), check_swiglu(be);
    check_shapes(be, threads[i]);
    kern_destroy(be);
  }
  return tu_done("test_kern_cpu_src");
}
