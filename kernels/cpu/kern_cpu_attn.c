/* kern_cpu_attn: CPU reference for RoPE and causal GQA attention over many sequences, with
 * the per-key attention mass (summed over query heads and queries, divided by n_head) that
 * the KV cache's scorers consume. Plain fp32 loops: this is the reference the CUDA kernels
 * are checked against. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cpu_internal.h"

/* YaRN ramp (llama.cpp semantics): 1 below `low`, 0 above `high`, linear between. */
static float rope_yarn_ramp(float low, float high, int i0) {
  float y = (i0 / 2 - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

static float rope_corr_dim(int n_rot, int n_ctx_orig, float beta, float base) {
  return n_rot * logf(n_ctx_orig / (beta * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

/* cos/sin of rotation pair i (dims 2i or i) at position pos. */
static void rope_cs(const kern_rope_t *r, int pos, int i, float *c, float *s) {
  float freq = 1.0f / powf(r->theta, (float)(2 * i) / (float)r->n_rot);
  if (r->factors) freq /= r->factors[i];
  float extrap = (float)pos * freq, theta = extrap * r->freq_scale, mscale = r->attn_factor;
  if (r->ext_factor != 0.0f) {
    float lo = fmaxf(0.0f, floorf(rope_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_fast, r->theta)));
    float hi = fminf(r->n_rot - 1.0f,
                     ceilf(rope_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_slow, r->theta)));
    float mix = rope_yarn_ramp(lo, hi, 2 * i) * r->ext_factor;
    theta = theta * (1.0f - mix) + extrap * mix;
    mscale *= 1.0f + 0.1f * logf(1.0f / r->freq_scale);
  }
  *c = cosf(theta) * mscale;
  *s = sinf(theta) * mscale;
}

/* Rebuilds the table when the parameters change or a position is beyond it. */
static int rope_table(kern_cpu_t *c, const kern_rope_t *r, int max_pos) {
  kern_rope_table_t *t = &c->rope;
  int same = t->cs && !memcmp(&t->key, r, sizeof *r), half = r->n_rot / 2;
  if (same && max_pos < t->n_pos) return 0;
  int n = same && 2 * t->n_pos > max_pos + 1 ? 2 * t->n_pos : max_pos + 1; /* grow by doubling */
  if (n < 4096) n = 4096;
  float *cs = malloc(sizeof(float) * 2 * (size_t)half * (size_t)n);
  if (!cs) return -1;
  for (int p = 0; p < n; p++)
    for (int i = 0; i < half; i++)
      rope_cs(r, p, i, &cs[((size_t)p * half + i) * 2], &cs[((size_t)p * half + i) * 2 + 1]);
  free(t->cs);
  *t = (kern_rope_table_t){*r, n, cs};
  return 0;
}

/* Rotates one head by the table row of |pos| (negative positions rotate backwards). */
static void rope_head(float *x, int pos, const kern_rope_t *r, const float *row) {
  int half = r->n_rot / 2;
  float sign = pos < 0 ? -1.0f : 1.0f;
  for (int i = 0; i < half; i++) {
    float c = row[2 * i], s = sign * row[2 * i + 1];
    int a = r->mode == KERN_ROPE_NEOX ? i : 2 * i;
    int b = r->mode == KERN_ROPE_NEOX ? i + half : 2 * i + 1;
    float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

void kern_cpu_rope(kern_backend_t *be, float *x, const int32_t *pos, int m, int n_heads,
                   int head_dim, const kern_rope_t *r) {
  kern_cpu_t *c = (kern_cpu_t *)be;
  int max_pos = 0, half = r->n_rot / 2;
  for (int t = 0; t < m; t++) max_pos = abs(pos[t]) > max_pos ? abs(pos[t]) : max_pos;
  if (rope_table(c, r, max_pos)) abort(); /* a table of a few MB: only fails on an exhausted host */
  for (int t = 0; t < m; t++) {
    const float *row = c->rope.cs + (size_t)abs(pos[t]) * half * 2;
    for (int h = 0; h < n_heads; h++)
      rope_head(x + ((size_t)t * n_heads + h) * head_dim, pos[t], r, row);
  }
}

typedef float attn_v8 __attribute__((vector_size(32), aligned(4)));

/* The dot product of attn_dot for a given n: inlined where n is a constant, so the common head
 * sizes get unrolled loops (the same operations in the same order: the same bits). */
static inline __attribute__((always_inline)) float attn_dot_n(const float *a, const float *b,
                                                              int n) {
  int d = 0;
  float s = 0;
  if (n % 8 == 0) {
    attn_v8 acc = {0};
    for (; d < n; d += 8) acc += *(const attn_v8 *)(a + d) * *(const attn_v8 *)(b + d);
    s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
  for (; d < n; d++) s += a[d] * b[d];
  return s;
}

static float attn_dot(const float *a, const float *b, int n) {
  if (n == 64) return attn_dot_n(a, b, 64);
  if (n == 128) return attn_dot_n(a, b, 128);
  return attn_dot_n(a, b, n);
}

static inline __attribute__((always_inline)) void attn_axpy_n(float *y, float a, const float *x,
                                                              int n) {
  for (int d = 0; d < n; d++) y[d] += a * x[d];
}

/* y += a x, unrolled for the common head sizes as attn_dot. */
static void attn_axpy(float *y, float a, const float *x, int n) {
  if (n == 64)
    attn_axpy_n(y, a, x, 64);
  else if (n == 128)
    attn_axpy_n(y, a, x, 128);
  else
    attn_axpy_n(y, a, x, n);
}

/* Keys visible to the query at position qp: a prefix, since key positions ascend. */
static int visible_keys(const kern_attn_seq_t *sq, int qp) {
  if (!sq->k_pos) return qp + 1 < sq->n_kv ? qp + 1 : sq->n_kv;
  int lo = 0, hi = sq->n_kv;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (sq->k_pos[mid] <= qp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* The work of one call: a task is one (sequence, query head) over all its queries; its key
 * masses go to a private row, reduced in head order afterwards (deterministic). */
typedef struct {
  const kern_attn_seq_t *seqs;
  const kern_attn_shape_t *sh;
  int n_seqs;
  size_t *mass_off; /* [n_seqs] offset of the sequence's [n_head][n_kv] rows in mass */
  float *mass;
} attn_job_t;

/* Queries of one head attended together: each key and value row is read once per block
 * instead of once per query. (Measured on 2 cores: worth little alone, the prefill being bound
 * by arithmetic, not memory; with attn_dot and attn_axpy unrolled, 1.40x; bench/README.md.) */
enum { ATTN_QB = 16 };

/* One head's queries [i0, i0 + nb) (nb <= ATTN_QB): every query's scores, softmax and output
 * are computed with exactly the operations, in exactly the order, of a query on its own (the
 * dot of attn_dot, then the softmax, then the values summed in key order), so blocking changes
 * no bit. p: [ATTN_QB][n_kv + 1]; mrow (or NULL) takes the probabilities in query order. */
static void attn_block(const attn_job_t *J, const kern_attn_seq_t *sq, int h, int i0, int nb,
                       float *p, float *mrow) {
  const kern_attn_shape_t *sh = J->sh;
  int hd = sh->head_dim, stride = sh->n_kv_head * hd, kvh = h / (sh->n_head / sh->n_kv_head);
  size_t prow = (size_t)sq->n_kv + 1;
  int nk[ATTN_QB], nmax = 0;
  const float *q[ATTN_QB];
  float *out[ATTN_QB];
  for (int b = 0; b < nb; b++) {
    size_t off = ((size_t)(i0 + b) * sh->n_head + h) * hd;
    nk[b] = visible_keys(sq, sq->q_pos0 + i0 + b), q[b] = sq->q + off, out[b] = sq->out + off;
    nmax = nk[b] > nmax ? nk[b] : nmax;
  }
  for (int j = 0; j < nmax; j++) {
    const float *k = sq->k + (size_t)j * stride + (size_t)kvh * hd;
    for (int b = 0; b < nb; b++)
      if (j < nk[b]) p[b * prow + j] = attn_dot(q[b], k, hd) * sh->scale;
  }
  for (int b = 0; b < nb; b++) {
    if (nk[b] <= 0) continue; /* no visible key: the output is left as it is */
    kern_cpu_softmax_row(p + b * prow, nk[b]);
    for (int d = 0; d < hd; d++) out[b][d] = 0;
  }
  for (int j = 0; j < nmax; j++) {
    const float *v = sq->v + (size_t)j * stride + (size_t)kvh * hd;
    for (int b = 0; b < nb; b++)
      if (j < nk[b]) attn_axpy(out[b], p[b * prow + j], v, hd);
  }
  for (int b = 0; mrow && b < nb; b++)
    for (int j = 0; i0 + b >= sq->mass_q0 && j < nk[b]; j++) mrow[j] += p[b * prow + j];
}

static void attn_task(void *ctx, int task) {
  const attn_job_t *J = ctx;
  const kern_attn_shape_t *sh = J->sh;
  int si = task / sh->n_head, h = task % sh->n_head;
  const kern_attn_seq_t *sq = &J->seqs[si];
  int rows = sq->n_q < ATTN_QB ? sq->n_q : ATTN_QB;
  float *p = malloc(sizeof(float) * (size_t)(sq->n_kv + 1) * (size_t)(rows > 0 ? rows : 1));
  if (!p) abort(); /* the block's probabilities: fails only on an exhausted host */
  float *mrow = sq->key_mass ? J->mass + J->mass_off[si] + (size_t)h * sq->n_kv : NULL;
  for (int i0 = 0; i0 < sq->n_q; i0 += ATTN_QB)
    attn_block(J, sq, h, i0, sq->n_q - i0 < ATTN_QB ? sq->n_q - i0 : ATTN_QB, p, mrow);
  free(p);
}

void kern_cpu_attention(kern_backend_t *be, const kern_attn_seq_t *seqs, int n_seqs,
                        const kern_attn_shape_t *shape) {
  size_t *off = malloc(sizeof(size_t) * (size_t)(n_seqs + 1)), total = 0;
  if (!off) abort();
  for (int s = 0; s < n_seqs; s++) {
    off[s] = total;
    if (seqs[s].key_mass) total += (size_t)shape->n_head * seqs[s].n_kv;
  }
  attn_job_t J = {seqs, shape, n_seqs, off, calloc(total + 1, sizeof(float))};
  if (!J.mass) abort(); /* transient workspace: fails only on an exhausted host */
  kern_cpu_pool_run(((kern_cpu_t *)be)->pool, attn_task, &J, n_seqs * shape->n_head);
  for (int s = 0; s < n_seqs; s++) {
    const kern_attn_seq_t *sq = &seqs[s];
    for (int h = 0; sq->key_mass && h < shape->n_head; h++)
      for (int j = 0; j < sq->n_kv; j++)
        sq->key_mass[j] += J.mass[off[s] + (size_t)h * sq->n_kv + j] / (float)shape->n_head;
  }
  free(J.mass);
  free(off);
}
