/* test_kern_cpu: the CPU backend against straightforward double-precision formulas on fresh
 * random data: GEMM/GEMV (+bias, accumulate), RMSNorm, RoPE (both conventions, linear scaling,
 * frequency factors), SwiGLU, softmax, embedding, causal GQA attention over several sequences
 * with per-key masses, and sampling (greedy, seeded determinism, top-k/top-p support, and
 * frequencies that follow the softmax); the packed weights of kern_cpu_create_ex bit for bit
 * against their documented arithmetic, on both of their code paths. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kern.h"
#include "qe_status.h"
#include "test_util.h"

static uint64_t rs = 0x1234567;

static float *randv(size_t n, float amp) {
  float *v = malloc(sizeof(float) * n);
  for (size_t i = 0; i < n; i++) v[i] = tu_randf(&rs, -amp, amp);
  return v;
}

static void check_matmul(kern_backend_t *be, int m) {
  int n = 37, k = 70;
  float *x = randv((size_t)m * k, 1), *w = randv((size_t)n * k, 1), *b = randv(n, 1);
  float *y = randv((size_t)m * n, 1), *y0 = malloc(sizeof(float) * m * n),
        *ref = malloc(sizeof(float) * m * n);
  memcpy(y0, y, sizeof(float) * m * n);
  kern_weight_t W = {w, n, k, KERN_WEIGHT_F32};
  for (int acc = 0; acc < 2; acc++) {
    memcpy(y, y0, sizeof(float) * m * n);
    be->ops->matmul(be, y, x, &W, acc ? NULL : b, m, acc);
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double s = acc ? y0[i * n + j] : b[j];
        for (int t = 0; t < k; t++) s += (double)x[i * k + t] * w[j * k + t];
        ref[i * n + j] = (float)s;
      }
    CHECK(tu_rel_err(y, ref, (size_t)m * n) < 1e-5);
  }
  free(x), free(w), free(b), free(y), free(y0), free(ref);
}

/* x row . packed weight row by the formula of kern_cpu_packed.c: per block, 8 lanes in two
 * accumulators (elements l and 16 + l to a0, 8 + l and 24 + l to a1), fma throughout. */
static float pk_ref_dot(const float *x, const int8_t *c, const float *s, const float *o, int k) {
  float a0[8] = {0}, a1[8] = {0}, sum[8];
  for (int b = 0; b < k / 32; b++)
    for (int h = 0; h < 2; h++)
      for (int l = 0; l < 8; l++) {
        int t0 = 32 * b + 16 * h + l, t1 = t0 + 8;
        a0[l] = fmaf(x[t0], fmaf((float)c[t0], s[b], o[b]), a0[l]);
        a1[l] = fmaf(x[t1], fmaf((float)c[t1], s[b], o[b]), a1[l]);
      }
  for (int l = 0; l < 8; l++) sum[l] = a0[l] + a1[l];
  return ((sum[0] + sum[4]) + (sum[1] + sum[5])) + ((sum[2] + sum[6]) + (sum[3] + sum[7]));
}

/* embed_w of the packed weight W (n rows of k, from codes c, scales s, offsets o): rows in a
 * random order, repeats included, each value fma(code, scale, offset) bit for bit. */
static void check_embed_w(kern_backend_t *be, const kern_weight_t *W, const int8_t *c,
                          const float *s, const float *o, int n, int k) {
  int32_t ids[7];
  float *y = malloc(sizeof(float) * 7 * (size_t)k);
  int same = 1;
  for (int i = 0; i < 7; i++) ids[i] = (int32_t)(tu_randf(&rs, 0, 1) * n) % n;
  ids[6] = ids[0];
  be->ops->embed_w(be, y, W, ids, 7, k);
  for (int i = 0; i < 7; i++)
    for (int t = 0; t < k; t++) {
      size_t w = (size_t)ids[i] * k + t;
      float want = fmaf((float)c[w], s[w / 32], o[w / 32]);
      same &= memcmp(&want, &y[(size_t)i * k + t], sizeof want) == 0;
    }
  CHECK(same);
  free(y);
}

/* One packed matmul [m][k] x [n][k]^T (+ bias, or accumulating) against pk_ref_dot bit for bit
 * (the streaming path: m <= 16), or against the fp64 product of the same weights (m > 16: sgemm
 * on dequantized rows where BLAS is built in). */
/* Codes: 0 int8, 1 [0, 15] (4-bit), 2 [-8, 7] with offsets 0 (4-bit, stored shifted), 3 [-8, 7]
 * with offsets (8-bit). */
static void check_packed_case(kern_backend_t *be, int m, int n, int k, int acc, int codes) {
  size_t nw = (size_t)n * k, nb = nw / 32;
  int8_t *c = malloc(nw);
  float *s = randv(nb, 0.05f), *o = randv(nb, 0.2f), *x = randv((size_t)m * k, 2), *b = randv(n, 1),
        *y = randv((size_t)m * n, 1), *y0 = malloc(sizeof(float) * m * n);
  const float lo[4] = {-128.4f, -0.4f, -8.4f, -8.4f}, hi[4] = {127.4f, 15.4f, 7.4f, 7.4f};
  for (size_t t = 0; t < nw; t++) c[t] = (int8_t)lrintf(tu_randf(&rs, lo[codes], hi[codes]));
  for (size_t t = 0; codes == 2 && t < nb; t++) o[t] = 0.0f;
  memcpy(y0, y, sizeof(float) * m * n);
  kern_weight_t W;
  CHECK(be->packed_weights && be->ops->weight_upload_blocks);
  CHECK_OK(be->ops->weight_upload_blocks(be, &W, c, s, o, n, k));
  int four = codes == 1 || codes == 2;
  CHECK(W.dtype == (four ? KERN_WEIGHT_PACKED4 : KERN_WEIGHT_PACKED));
  CHECK(kern_weight_bytes(&W) == (four ? nw / 2 : nw) + 2 * nb * 4);
  be->ops->matmul(be, y, x, &W, acc ? NULL : b, m, acc);
  int same = 1;
  double e2 = 0, r2 = 0;
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      size_t w0 = (size_t)j * k;
      float r = pk_ref_dot(x + (size_t)i * k, c + w0, s + w0 / 32, o + w0 / 32, k);
      float want = acc ? y0[i * n + j] + r : r + b[j];
      double d = acc ? y0[i * n + j] : b[j];
      for (int t = 0; t < k; t++)
        d += (double)x[i * k + t] * fmaf((float)c[w0 + t], s[(w0 + t) / 32], o[(w0 + t) / 32]);
      same &= memcmp(&want, &y[i * n + j], sizeof want) == 0;
      e2 += (y[i * n + j] - d) * (y[i * n + j] - d), r2 += d * d;
    }
  double e = sqrt(e2 / (r2 > 0 ? r2 : 1));
  CHECK(m > 16 || same);
  CHECK(e < 1e-5);
  if ((m <= 16 && !same) || e >= 1e-5)
    fprintf(stderr, "packed %dx%dx%d acc %d codes %d: same %d, rel err %g\n", m, n, k, acc, codes,
            same, e);
  check_embed_w(be, &W, c, s, o, n, k);
  be->ops->weight_free(be, &W);
  free(c), free(s), free(o), free(x), free(b), free(y), free(y0);
}

/* A Q4_0-like row (codes in [-8, 7], offsets 0) whose first block's scale is +inf: its values
 * and the product with ones are +inf, as code * scale is; the shifted 4-bit form gave NaN
 * (inf - inf), so such a weight keeps 8 bits. */
static void check_packed_inf(kern_backend_t *be) {
  int8_t c[64];
  float s[2] = {INFINITY, 1.0f}, o[2] = {0, 0}, x[64], y[1], e[64];
  for (int t = 0; t < 64; t++) c[t] = t < 32 ? 1 : -1, x[t] = 1.0f;
  kern_weight_t W;
  CHECK_OK(be->ops->weight_upload_blocks(be, &W, c, s, o, 1, 64));
  be->ops->matmul(be, y, x, &W, NULL, 1, 0);
  int32_t id = 0;
  be->ops->embed_w(be, e, &W, &id, 1, 64);
  CHECK(isinf(y[0]) && y[0] > 0 && isinf(e[0]) && e[0] > 0 && e[40] == -1.0f);
  be->ops->weight_free(be, &W);
}

/* kern_cpu_create_ex's packed weights, through the AVX2 path (where the CPU has it) and the
 * plain C one (QE_CPU_PACKED_SCALAR=1, read once per process: a child runs it). Shapes cover
 * one to 37 activation rows (blocks of 4 and a tail; 37 through sgemm where BLAS is built in),
 * row chunks across 2 threads and the 256-row blocks. */
static void check_packed_all(void) {
  kern_backend_t *be = NULL;
  CHECK(kern_cpu_create_ex(2, 7, &be) == QE_EINVAL && be == NULL);
  CHECK_OK(kern_cpu_create(1, &be));
  CHECK(!be->packed_weights); /* the default: every weight fp32 */
  kern_destroy(be);
  CHECK_OK(kern_cpu_create_ex(2, KERN_WEIGHT_PACKED, &be));
  const int shapes[][3] = {{1, 64, 96}, {3, 37, 32}, {5, 300, 64}, {16, 70, 160}, {37, 600, 96}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int acc = 0; acc < 2; acc++)
      for (int codes = 0; codes < 4; codes++)
        check_packed_case(be, shapes[i][0], shapes[i][1], shapes[i][2], acc, codes);
  check_packed_inf(be);
  kern_weight_t W;
  int8_t c[64] = {0};
  float f[2] = {1, 1};
  CHECK(be->ops->weight_upload_blocks(be, &W, c, f, f, 2, 30) == QE_EINVAL && !W.data);
  kern_destroy(be);
}

static void check_packed(void) {
  check_packed_all();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("QE_CPU_PACKED_SCALAR", "1", 1);
    check_packed_all();
    _exit(tu_done("test_kern_cpu (packed, plain C)"));
  }
  int st = 0;
  CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void check_rmsnorm_swiglu_softmax(kern_backend_t *be) {
  int m = 3, n = 64;
  float *x = randv(m * n, 2), *g = randv(n, 1), *y = malloc(sizeof(float) * m * n), ref[192];
  be->ops->rmsnorm(be, y, x, g, m, n, 1e-5f);
  for (int i = 0; i < m; i++) {
    double ss = 0;
    for (int j = 0; j < n; j++) ss += (double)x[i * n + j] * x[i * n + j];
    for (int j = 0; j < n; j++) ref[i * n + j] = (float)(x[i * n + j] / sqrt(ss / n + 1e-5) * g[j]);
  }
  CHECK(tu_rel_err(y, ref, m * n) < 1e-5);
  be->ops->swiglu(be, y, x, g, 1, n);
  for (int j = 0; j < n; j++) ref[j] = (float)(x[j] / (1 + exp(-(double)x[j])) * g[j]);
  CHECK(tu_rel_err(y, ref, n) < 1e-5);
  memcpy(y, x, sizeof(float) * n);
  be->ops->softmax(be, y, 1, n);
  double z = 0;
  for (int j = 0; j < n; j++) z += exp((double)x[j]);
  for (int j = 0; j < n; j++) ref[j] = (float)(exp((double)x[j]) / z);
  CHECK(tu_rel_err(y, ref, n) < 1e-5);
  int32_t ids[2] = {2, 0};
  be->ops->embed(be, y, x, ids, 2, n);
  CHECK(!memcmp(y, x + 2 * n, sizeof(float) * n) && !memcmp(y + n, x, sizeof(float) * n));
  free(x), free(g), free(y);
}

/* Reference rotation of one head in double precision. */
static void rope_ref(float *x, int pos, int hd, const kern_rope_t *r) {
  for (int i = 0; i < r->n_rot / 2; i++) {
    double f =
        pow(r->theta, -2.0 * i / r->n_rot) * r->freq_scale / (r->factors ? r->factors[i] : 1);
    double c = cos(pos * f), s = sin(pos * f);
    int a = r->mode == KERN_ROPE_NEOX ? i : 2 * i,
        b = r->mode == KERN_ROPE_NEOX ? i + r->n_rot / 2 : 2 * i + 1;
    double x0 = x[a], x1 = x[b];
    x[a] = (float)(x0 * c - x1 * s);
    x[b] = (float)(x0 * s + x1 * c);
  }
  (void)hd;
}

static void check_rope(kern_backend_t *be) {
  int hd = 32, nh = 3, m = 4;
  int32_t pos[4] = {0, 1, 17, 511};
  float factors[12];
  for (int i = 0; i < 12; i++) factors[i] = 1.0f + i * 0.5f;
  kern_rope_t cases[3] = {{KERN_ROPE_NORM, 32, 10000, 1, NULL, 0, 1, 32, 1, 512},
                          {KERN_ROPE_NEOX, 24, 500000, 0.25f, NULL, 0, 1, 32, 1, 512},
                          {KERN_ROPE_NORM, 24, 10000, 1, factors, 0, 1, 32, 1, 512}};
  for (int c = 0; c < 3; c++) {
    float *x = randv(m * nh * hd, 1), *ref = malloc(sizeof(float) * m * nh * hd);
    memcpy(ref, x, sizeof(float) * m * nh * hd);
    be->ops->rope(be, x, pos, m, nh, hd, &cases[c]);
    for (int t = 0; t < m; t++)
      for (int h = 0; h < nh; h++) rope_ref(ref + (t * nh + h) * hd, pos[t], hd, &cases[c]);
    CHECK(tu_rel_err(x, ref, m * nh * hd) < 1e-4);
    free(x), free(ref);
  }
}

/* Double-precision causal GQA attention of one sequence, with key masses. */
static void attn_ref(const kern_attn_seq_t *s, const kern_attn_shape_t *sh, float *out,
                     double *mass) {
  int hd = sh->head_dim, grp = sh->n_head / sh->n_kv_head, st = sh->n_kv_head * hd;
  double *p = malloc(sizeof(double) * s->n_kv);
  for (int i = 0; i < s->n_q; i++)
    for (int h = 0; h < sh->n_head; h++) {
      const float *q = s->q + (i * sh->n_head + h) * hd;
      int nk = s->q_pos0 + i + 1, kvh = h / grp;
      double mx = -1e300, z = 0;
      for (int j = 0; j < nk; j++) {
        double d = 0;
        for (int e = 0; e < hd; e++) d += (double)q[e] * s->k[j * st + kvh * hd + e];
        p[j] = d * sh->scale;
        mx = fmax(mx, p[j]);
      }
      for (int j = 0; j < nk; j++) z += (p[j] = exp(p[j] - mx));
      for (int e = 0; e < hd; e++) {
        double o = 0;
        for (int j = 0; j < nk; j++) o += p[j] / z * s->v[j * st + kvh * hd + e];
        out[(i * sh->n_head + h) * hd + e] = (float)o;
      }
      for (int j = 0; j < nk; j++) mass[j] += p[j] / z / sh->n_head;
    }
  free(p);
}

static void check_attention(kern_backend_t *be) {
  kern_attn_shape_t sh = {8, 2, 16, 0.25f};
  int nq[3] = {5, 1, 3}, pos0[3] = {0, 40, 9};
  kern_attn_seq_t s[3];
  for (int i = 0; i < 3; i++) {
    int nkv = pos0[i] + nq[i];
    s[i] = (kern_attn_seq_t){.q = randv(nq[i] * 8 * 16, 1),
                             .k = randv(nkv * 2 * 16, 2),
                             .v = randv(nkv * 2 * 16, 1),
                             .out = malloc(sizeof(float) * nq[i] * 8 * 16),
                             .key_mass = calloc(nkv, sizeof(float)),
                             .n_q = nq[i],
                             .n_kv = nkv,
                             .q_pos0 = pos0[i]};
  }
  be->ops->attention(be, s, 3, &sh);
  for (int i = 0; i < 3; i++) {
    float *out = malloc(sizeof(float) * nq[i] * 8 * 16), *mf = malloc(sizeof(float) * s[i].n_kv);
    double *mass = calloc(s[i].n_kv, sizeof(double)), total = 0;
    attn_ref(&s[i], &sh, out, mass);
    for (int j = 0; j < s[i].n_kv; j++) mf[j] = (float)mass[j], total += s[i].key_mass[j];
    CHECK(tu_rel_err(s[i].out, out, nq[i] * 8 * 16) < 1e-5);
    CHECK(tu_rel_err(s[i].key_mass, mf, s[i].n_kv) < 1e-5);
    CHECK(fabs(total - nq[i]) < 1e-4); /* each query distributes one unit of mass */
    free(out), free(mf), free(mass);
    free((void *)s[i].q), free((void *)s[i].k), free((void *)s[i].v), free(s[i].out),
        free(s[i].key_mass);
  }
}

/* Keys at explicit positions (a gathered subset) equal attention over exactly those keys, and
 * mass_q0 restricts the mass to the last queries. */
static void check_attention_positions(kern_backend_t *be) {
  kern_attn_shape_t sh = {4, 2, 8, 0.3f};
  enum { NK = 6, NQ = 3 };
  int32_t kpos[NK] = {0, 1, 5, 6, 9, 10};
  float *q = randv(NQ * 4 * 8, 1), *k = randv(NK * 16, 1), *v = randv(NK * 16, 1);
  float out[NQ * 32], ref[NQ * 32], mass[NK] = {0}, mref[NK] = {0};
  kern_attn_seq_t s = {.q = q,
                       .k = k,
                       .v = v,
                       .out = out,
                       .key_mass = mass,
                       .k_pos = kpos,
                       .n_q = NQ,
                       .n_kv = NK,
                       .q_pos0 = 8,
                       .mass_q0 = 1};
  be->ops->attention(be, &s, 1, &sh);
  /* query 0 (pos 8) sees keys 0..3; queries 1, 2 (pos 9, 10) see 0..4 and 0..5. */
  for (int i = 0; i < NQ; i++) {
    int nk = i == 0 ? 4 : i == 1 ? 5 : 6;
    kern_attn_seq_t one = {.q = q + i * 32,
                           .k = k,
                           .v = v,
                           .out = ref + i * 32,
                           .key_mass = i ? mref : NULL,
                           .n_q = 1,
                           .n_kv = nk,
                           .q_pos0 = nk - 1};
    be->ops->attention(be, &one, 1, &sh);
  }
  CHECK(tu_rel_err(out, ref, NQ * 32) < 1e-6);
  CHECK(tu_rel_err(mass, mref, NK) < 1e-6);
  free(q), free(k), free(v);
}

/* Queries attended in blocks (the backend reads each key row once per block of queries) give
 * bit for bit the outputs of each query attended alone: 37 queries (blocks of 16, 16, 5), keys
 * at positions with gaps so that the queries of a block see different numbers of keys, the
 * first query none (its output stays untouched); masses of the queries from mass_q0 on equal
 * the single-query sums (to rounding: the per-call division by n_head reassociates them). */
static void check_attention_blocks(kern_backend_t *be) {
  kern_attn_shape_t sh = {6, 2, 24, 0.2f};
  enum { NK = 80, NQ = 37, QW = 6 * 24, KW = 2 * 24 };
  int32_t kpos[NK];
  for (int j = 0, p = 3; j < NK; j++) kpos[j] = p, p += 1 + j % 3; /* 3, 4, 6, 9, 10, ... */
  float *q = randv(NQ * QW, 4), *k = randv(NK * KW, 5), *v = randv(NK * KW, 6);
  float *out = malloc(sizeof(float) * NQ * QW), *ref = malloc(sizeof(float) * NQ * QW);
  float mass[NK] = {0}, mref[NK] = {0};
  for (int i = 0; i < NQ * QW; i++) out[i] = ref[i] = 7.0f; /* untouched where nothing is seen */
  kern_attn_seq_t s = {.q = q,
                       .k = k,
                       .v = v,
                       .out = out,
                       .key_mass = mass,
                       .k_pos = kpos,
                       .n_q = NQ,
                       .n_kv = NK,
                       .q_pos0 = 2,
                       .mass_q0 = 10};
  be->ops->attention(be, &s, 1, &sh);
  for (int i = 0; i < NQ; i++) {
    kern_attn_seq_t one = s;
    one.q = q + i * QW, one.out = ref + i * QW, one.n_q = 1, one.q_pos0 = 2 + i;
    one.key_mass = i >= 10 ? mref : NULL, one.mass_q0 = 0;
    be->ops->attention(be, &one, 1, &sh);
  }
  CHECK(!memcmp(out, ref, sizeof(float) * NQ * QW));
  CHECK(out[0] == 7.0f && out[QW - 1] == 7.0f); /* query 0 at position 2 sees no key */
  CHECK(out[QW] != 7.0f);
  CHECK(tu_rel_err(mass, mref, NK) < 1e-6);
  free(q), free(k), free(v), free(out), free(ref);
}

static void check_sampling(kern_backend_t *be) {
  enum { V = 50, N = 40000 };
  float *lg = randv(V, 3), scratch[2 * V];
  lg[7] = 4.0f;
  uint64_t a = kern_rng_seed(9), b = kern_rng_seed(9);
  kern_sampler_t greedy = {0, 0, 1}, hot = {0.7f, 0, 1}, k1 = {1, 1, 1}, p0 = {1, 0, 1e-6f};
  CHECK(be->ops->sample(be, lg, V, &greedy, &a, scratch) == 7);
  CHECK(be->ops->sample(be, lg, V, &k1, &a, scratch) == 7);
  CHECK(be->ops->sample(be, lg, V, &p0, &a, scratch) == 7);
  /* temperatures so small that logits / temp overflow: greedy, not NaN's last candidate */
  for (int e = 0; e < 3; e++) {
    kern_sampler_t tiny = {e == 0 ? 1e-38f : e == 1 ? 1e-45f : 1e-40f, e == 2 ? 5 : 0, 0.9f};
    for (int i = 0; i < 20; i++) CHECK(be->ops->sample(be, lg, V, &tiny, &a, scratch) == 7);
  }
  int same = 1;
  a = b = kern_rng_seed(9);
  for (int i = 0; i < 100; i++)
    same &= be->ops->sample(be, lg, V, &hot, &a, scratch) ==
            be->ops->sample(be, lg, V, &hot, &b, scratch);
  CHECK(same);
  /* Frequencies follow softmax(lg / T) within 4 standard deviations. */
  double p[V], z = 0;
  int cnt[V] = {0};
  for (int j = 0; j < V; j++) z += (p[j] = exp(lg[j] / 0.7));
  for (int i = 0; i < N; i++) cnt[be->ops->sample(be, lg, V, &hot, &a, scratch)]++;
  int ok = 1;
  for (int j = 0; j < V; j++) {
    double q = p[j] / z, sd = sqrt(N * q * (1 - q)) + 1;
    ok &= fabs(cnt[j] - N * q) <= 4 * sd;
  }
  CHECK(ok);
  /* top-k 3 only ever returns the three most likely ids. */
  kern_sampler_t k3 = {1, 3, 1};
  int top[3] = {7, -1, -1};
  for (int j = 0; j < V; j++) {
    if (j == 7) continue;
    if (top[1] < 0 || lg[j] > lg[top[1]])
      top[2] = top[1], top[1] = j;
    else if (top[2] < 0 || lg[j] > lg[top[2]])
      top[2] = j;
  }
  int in = 1;
  for (int i = 0; i < 2000; i++) {
    int t = be->ops->sample(be, lg, V, &k3, &a, scratch);
    in &= t == top[0] || t == top[1] || t == top[2];
  }
  CHECK(in);
  free(lg);
}

/* argmax: the greedy sampler's choice on every row (ties to the lowest index), and -1 for a row
 * holding a NaN or +inf, or only -inf (logits no token can be drawn from, kern.h). */
static void check_argmax(kern_backend_t *be) {
  enum { M = 8, V = 33 };
  float *x = randv(M * V, 3), scratch[2 * V];
  int32_t ids[M];
  x[1 * V + 4] = x[1 * V + 20] = 9.0f;                                        /* a tie: 4 */
  x[2 * V + 0] = NAN;                                                         /* NaN first: -1 */
  x[3 * V + 2] = NAN, x[3 * V + 30] = 12.0f;                                  /* NaN later: -1 */
  x[5 * V + 7] = INFINITY;                                                    /* +inf: -1 */
  for (int j = 0; j < V; j++) x[4 * V + j] = -1.0f, x[6 * V + j] = -INFINITY; /* 0; -1 */
  x[7 * V + 9] = -INFINITY; /* one -inf among finite values: the largest as usual */
  CHECK_OK(be->ops->argmax(be, x, M, V, ids));
  kern_sampler_t greedy = {0, 0, 1.0f};
  uint64_t rng = kern_rng_seed(1);
  for (int i = 0; i < M; i++)
    CHECK(ids[i] == -1 || ids[i] == be->ops->sample(be, x + i * V, V, &greedy, &rng, scratch));
  CHECK(ids[0] >= 0 && ids[1] == 4 && ids[2] == -1 && ids[3] == -1 && ids[4] == 0);
  CHECK(ids[5] == -1 && ids[6] == -1 && ids[7] >= 0);
  free(x);
}

int main(void) {
  kern_backend_t *be = NULL;
  CHECK_OK(kern_cpu_create(2, &be));
  check_matmul(be, 1);
  check_matmul(be, 9);
  check_rmsnorm_swiglu_softmax(be);
  check_rope(be);
  check_attention(be);
  check_attention_positions(be);
  check_attention_blocks(be);
  check_sampling(be);
  check_argmax(be);
  kern_destroy(be);
  check_packed();
  return tu_done("test_kern_cpu");
}
