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

/* Four of kern_cpu_attn_dot_n's sums at once, each with exactly its operations. */
static inline __attribute__((always_inline)) void attn_dot4_n(const float *q, const float *r,
                                                              size_t st, int n, float *out) {
  if (n % 8) {
    for (int i = 0; i < 4; i++) out[i] = kern_cpu_attn_dot_n(q, r + i * st, n);
    return;
  }
  attn_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  for (int d = 0; d < n; d += 8) {
    attn_v8 x = *(const attn_v8 *)(q + d);
    a0 = kern_cpu_fma8(x, *(const attn_v8 *)(r + d), a0);
    a1 = kern_cpu_fma8(x, *(const attn_v8 *)(r + st + d), a1);
    a2 = kern_cpu_fma8(x, *(const attn_v8 *)(r + 2 * st + d), a2);
    a3 = kern_cpu_fma8(x, *(const attn_v8 *)(r + 3 * st + d), a3);
  }
  attn_v8 *a[4] = {&a0, &a1, &a2, &a3};
  for (int i = 0; i < 4; i++) {
    attn_v8 v = *a[i];
    out[i] = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
  }
}

/* Each vector's halves added: lane j of the result is x[j] + x[j + 4] for j < 4 and
 * y[j - 4] + y[j] for j >= 4. */
static inline attn_v8 attn_fold(attn_v8 x, attn_v8 y) {
  return __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15);
}

/* Pairwise sums within each half: lanes (a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5,
 * b6+b7), as the horizontal add of two vectors. */
static inline attn_v8 attn_hadd(attn_v8 a, attn_v8 b) {
  return __builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14) +
         __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}

/* Eight of kern_cpu_attn_dot_n's sums at once (n a multiple of 8), each with exactly its
 * operations: lane l of row i's accumulator takes q[d] r_i[d] for d = l mod 8 in order, and the
 * lanes are summed as ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7)), here for the eight rows at once
 * by folding the halves (attn_fold: s_i = lanes 0-3 + lanes 4-7) and two horizontal adds
 * ((s_i0 + s_i1) + (s_i2 + s_i3)), which leave row i's sum in lane i. */
static inline __attribute__((always_inline)) attn_v8 attn_reduce8(const attn_v8 *a) {
  attn_v8 t04 = attn_fold(a[0], a[4]), t15 = attn_fold(a[1], a[5]);
  attn_v8 t26 = attn_fold(a[2], a[6]), t37 = attn_fold(a[3], a[7]);
  return attn_hadd(attn_hadd(t04, t15), attn_hadd(t26, t37));
}

static inline __attribute__((always_inline)) attn_v8 attn_dot8_n(const float *q, const float *r,
                                                                 size_t st, int n) {
  attn_v8 a[8] = {{0}};
  for (int d = 0; d < n; d += 8) {
    attn_v8 x = *(const attn_v8 *)(q + d);
    for (int i = 0; i < 8; i++) a[i] = kern_cpu_fma8(x, *(const attn_v8 *)(r + i * st + d), a[i]);
  }
  return attn_reduce8(a);
}

#ifdef __AVX512VL__
/* kern_cpu_attn_dots for two query rows over the same m keys (n a multiple of 8; 16 of the 32
 * vector registers accumulate): each key row is loaded once for both, every score gets
 * attn_dot8_n's operations, the rest of the keys go one row at a time. The same bits. */
static inline __attribute__((always_inline)) void attn_dots2_n(const float *const *q,
                                                               const float *rows, size_t st, int m,
                                                               int n, float scale,
                                                               float *const *out) {
  int i = 0;
  for (; i + 8 <= m; i += 8) {
    attn_v8 a[8] = {{0}}, b[8] = {{0}};
    for (int d = 0; d < n; d += 8) {
      attn_v8 x0 = *(const attn_v8 *)(q[0] + d), x1 = *(const attn_v8 *)(q[1] + d);
      for (int k = 0; k < 8; k++) {
        attn_v8 kv = *(const attn_v8 *)(rows + (i + k) * st + d);
        a[k] = kern_cpu_fma8(x0, kv, a[k]), b[k] = kern_cpu_fma8(x1, kv, b[k]);
      }
    }
    attn_v8 s0 = attn_reduce8(a) * scale, s1 = attn_reduce8(b) * scale;
    memcpy(out[0] + i, &s0, sizeof s0), memcpy(out[1] + i, &s1, sizeof s1);
  }
  for (int r = 0; r < 2 && i < m; r++)
    kern_cpu_attn_dots(q[r], rows + i * st, st, m - i, n, scale, out[r] + i);
}

static void attn_dots2(const float *const *q, const float *rows, size_t st, int m, int n,
                       float scale, float *const *out) {
  if (n == 64)
    attn_dots2_n(q, rows, st, m, 64, scale, out);
  else if (n == 128)
    attn_dots2_n(q, rows, st, m, 128, scale, out);
  else
    attn_dots2_n(q, rows, st, m, n, scale, out);
}
#endif

static inline __attribute__((always_inline)) void
attn_dots_n(const float *q, const float *rows, size_t st, int m, int n, float scale, float *out) {
  int i = 0;
  for (; n % 8 == 0 && i + 8 <= m; i += 8) {
    attn_v8 s = attn_dot8_n(q, rows + i * st, st, n) * scale;
    memcpy(out + i, &s, sizeof s);
  }
  for (; i + 4 <= m; i += 4) {
    attn_dot4_n(q, rows + i * st, st, n, out + i);
    for (int u = 0; u < 4; u++) out[i + u] *= scale;
  }
  for (; i < m; i++) out[i] = kern_cpu_attn_dot_n(q, rows + i * st, n) * scale;
}

void kern_cpu_attn_dots(const float *q, const float *rows, size_t stride, int m, int n, float scale,
                        float *out) {
  if (n == 64)
    attn_dots_n(q, rows, stride, m, 64, scale, out);
  else if (n == 128)
    attn_dots_n(q, rows, stride, m, 128, scale, out);
  else
    attn_dots_n(q, rows, stride, m, n, scale, out);
}

/* kern_cpu_attn_axpys for n a multiple of 8 up to 128: the sums in registers. */
static inline __attribute__((always_inline)) void
attn_axpys_n(float *y, const float *p, const float *rows, size_t st, int m, int n) {
  attn_v8 acc[16];
  for (int c = 0; c < n / 8; c++) acc[c] = *(const attn_v8 *)(y + 8 * c);
  for (int i = 0; i < m; i++) {
    const float *x = rows + i * st;
    const attn_v8 pi = {p[i], p[i], p[i], p[i], p[i], p[i], p[i], p[i]};
    for (int c = 0; c < n / 8; c++)
      acc[c] = kern_cpu_fma8(pi, *(const attn_v8 *)(x + 8 * c), acc[c]);
  }
  for (int c = 0; c < n / 8; c++) *(attn_v8 *)(y + 8 * c) = acc[c];
}

void kern_cpu_attn_axpys(float *y, const float *p, const float *rows, size_t stride, int m, int n) {
  if (n == 64)
    attn_axpys_n(y, p, rows, stride, m, 64);
  else if (n == 128)
    attn_axpys_n(y, p, rows, stride, m, 128);
  else if (n == 32)
    attn_axpys_n(y, p, rows, stride, m, 32);
  else if (n == 16)
    attn_axpys_n(y, p, rows, stride, m, 16);
  else
    for (int i = 0; i < m; i++) kern_cpu_attn_axpy_n(y, p[i], rows + i * stride, n);
}

/* Keys visible to the query at position qp: a prefix, since key positions ascend. */
int kern_cpu_visible_keys(const kern_attn_seq_t *sq, int qp) {
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

/* A task: the queries of one head of one sequence. */
typedef struct {
  int seq, h;
} attn_task_t;

/* The work of one call: a task's key masses go to private rows ([n_head][n_kv] a sequence),
 * reduced in head order afterwards (deterministic). */
typedef struct {
  const kern_attn_seq_t *seqs;
  const kern_attn_shape_t *sh;
  size_t *mass_off; /* [n_seqs] offset of the sequence's [n_head][n_kv] rows in mass */
  float *mass;
} attn_job_t;

/* Queries attended together: each key and value row is read once per block instead of once
 * per query. (Measured on 2 cores: worth little alone, the prefill being bound by arithmetic,
 * not memory; with attn_dot and attn_axpy unrolled, 1.40x; bench/README.md.) */
enum { ATTN_QB = 16 };

/* The keys (which 0) or values (1) of one KV head, a run at a time. */
typedef struct {
  const kern_attn_seq_t *sq;
  int which, kvh, run;
  size_t stride; /* floats from a row of k or v to the next */
  float *buf;    /* a source's rows: [max_rows][head_dim] */
} attn_rows_t;

/* The next run: its length (possibly 0; -1 past the last), its first row and stride. */
static int attn_next(attn_rows_t *it, int hd, const float **rows, size_t *stride) {
  const kern_attn_seq_t *sq = it->sq;
  if (sq->src) {
    if (it->run >= sq->src->n_run) return -1;
    return sq->src->view(sq->src, it->run++, it->which, it->kvh, 0, hd, it->buf, rows, stride);
  }
  if (it->run++) return -1;
  *rows = (it->which ? sq->v : sq->k) + (size_t)it->kvh * hd;
  *stride = it->stride;
  return sq->n_kv;
}

/* One block's rows: row b is query qi[b] of the task's head. */
typedef struct {
  int nb, nmax;
  int nk[ATTN_QB], qi[ATTN_QB];
  const float *q[ATTN_QB];
  float *out[ATTN_QB];
} attn_rowset_t;

/* Keys a tile of a run holds: the tile's rows are read from cache by every row of the block. */
enum { ATTN_TILE = 64 };

/* Rows of the tile at key j0 (of n) that block row b sees. */
static int attn_seen(const attn_rowset_t *R, int b, int j0, int n) {
  int m = R->nk[b] - j0;
  return m < 0 ? 0 : m < n ? m : n;
}

#ifdef __AVX512F__
#include <immintrin.h>
/* kern_cpu_attn_axpys for nr rows at once (nr * nc <= 16 accumulators, nc = n / 16 vectors of
 * 16 a row), every row over keys [0, m): each value row is loaded once for the nr rows. An
 * element of y_r gets exactly kern_cpu_attn_axpys's fused multiply-adds, in key order: the same
 * bits. */
static inline __attribute__((always_inline)) void attn_axpys_zmm(float *const *y,
                                                                 const float *const *p,
                                                                 const float *rows, size_t st,
                                                                 int m, int nr, int nc) {
  __m512 acc[4][8], v[8];
  for (int r = 0; r < nr; r++)
    for (int c = 0; c < nc; c++) acc[r][c] = _mm512_loadu_ps(y[r] + 16 * c);
  for (int i = 0; i < m; i++) {
    for (int c = 0; c < nc; c++) v[c] = _mm512_loadu_ps(rows + i * st + 16 * c);
    for (int r = 0; r < nr; r++) {
      __m512 pr = _mm512_set1_ps(p[r][i]);
      for (int c = 0; c < nc; c++) acc[r][c] = _mm512_fmadd_ps(pr, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < nr; r++)
    for (int c = 0; c < nc; c++) _mm512_storeu_ps(y[r] + 16 * c, acc[r][c]);
}

/* Rows [b, b + nr) of R over the tile's keys from j (nt of them): the keys all of them see
 * together, then each row's own rest, so every row still takes its keys in order. */
static void attn_out_group(const attn_rowset_t *R, int b, int nr, const float *p, size_t prow,
                           const float *x, size_t st, int j, int nt, int hd) {
  float *y[4];
  const float *pp[4];
  int m0 = nt;
  for (int r = 0; r < nr; r++) {
    y[r] = R->out[b + r], pp[r] = p + (b + r) * prow + j;
    int m = attn_seen(R, b + r, j, nt);
    m0 = m < m0 ? m : m0;
  }
  if (hd == 64)
    attn_axpys_zmm(y, pp, x, st, m0, 4, 4);
  else
    attn_axpys_zmm(y, pp, x, st, m0, 2, 8);
  for (int r = 0; r < nr; r++) {
    int rest = attn_seen(R, b + r, j, nt) - m0;
    if (rest > 0) kern_cpu_attn_axpys(y[r], pp[r] + m0, x + (size_t)m0 * st, st, rest, hd);
  }
}
#endif

/* The outputs' pass over one tile (keys from j, nt of them, rows x): out_b += p[b][j..] v. */
static void attn_out_tile(const attn_rowset_t *R, const float *p, size_t prow, const float *x,
                          size_t st, int j, int nt, int hd) {
  int b = 0;
#ifdef __AVX512F__
  int nr = hd == 64 ? 4 : hd == 128 ? 2 : 0; /* (the rows a group's 16 accumulators hold) */
  for (; nr && b + nr <= R->nb; b += nr) attn_out_group(R, b, nr, p, prow, x, st, j, nt, hd);
#endif
  for (; b < R->nb; b++)
    kern_cpu_attn_axpys(R->out[b], p + b * prow + j, x, st, attn_seen(R, b, j, nt), hd);
}

/* The scores' pass over one tile (keys from j, nt of them, rows x): p[b][j..] = scale q_b . k. */
static void attn_score_tile(const attn_rowset_t *R, float *p, size_t prow, const float *x,
                            size_t st, int j, int nt, int hd, float scale) {
  int b = 0;
#ifdef __AVX512VL__
  for (; hd % 8 == 0 && b + 2 <= R->nb; b += 2) {
    int m0 = attn_seen(R, b, j, nt), m1 = attn_seen(R, b + 1, j, nt), m = m0 < m1 ? m0 : m1;
    const float *q[2] = {R->q[b], R->q[b + 1]};
    float *o[2] = {p + b * prow + j, p + (b + 1) * prow + j};
    attn_dots2(q, x, st, m, hd, scale, o);
    for (int r = 0; r < 2; r++) { /* (a row's keys past the pair's common ones) */
      int rest = (r ? m1 : m0) - m;
      if (rest > 0) kern_cpu_attn_dots(q[r], x + (size_t)m * st, st, rest, hd, scale, o[r] + m);
    }
  }
#endif
  for (; b < R->nb; b++)
    kern_cpu_attn_dots(R->q[b], x, st, attn_seen(R, b, j, nt), hd, scale, p + b * prow + j);
}

/* A pass over the keys, a tile at a time: the scores (which 0: p[b][j] = scale * q_b . k_j for
 * the keys each row sees) or the outputs (which 1: out_b = sum_j p[b][j] v_j, in key order). */
static void attn_pass(const attn_job_t *J, attn_rows_t *it, const attn_rowset_t *R, int which,
                      float *p, size_t prow) {
  int hd = J->sh->head_dim, n;
  const float *rows;
  size_t st;
  it->which = which, it->run = 0;
  for (int j0 = 0; j0 < R->nmax && (n = attn_next(it, hd, &rows, &st)) >= 0; j0 += n)
    for (int t = 0; t < n && j0 + t < R->nmax; t += ATTN_TILE) {
      int nt = n - t < ATTN_TILE ? n - t : ATTN_TILE;
      if (which) {
        attn_out_tile(R, p, prow, rows + t * st, st, j0 + t, nt, hd);
        continue;
      }
      attn_score_tile(R, p, prow, rows + t * st, st, j0 + t, nt, hd, J->sh->scale);
    }
}

/* One block of rows: every query's scores, softmax and output are computed with exactly the
 * operations, in exactly the order, of a query on its own (the dot of attn_dot, then the
 * softmax, then the values summed in key order), so blocking changes no bit, nor does reading
 * the keys through a source. p: [ATTN_QB][n_kv + 1]; mass (or NULL) takes each head's
 * probabilities in query order. */
static void attn_block(const attn_job_t *J, attn_rows_t *it, const attn_rowset_t *R, float *p,
                       float *mrow) {
  const kern_attn_seq_t *sq = it->sq;
  size_t prow = (size_t)sq->n_kv + 1;
  attn_pass(J, it, R, 0, p, prow);
  for (int b = 0; b < R->nb; b++) {
    if (R->nk[b] <= 0) continue; /* no visible key: the output is left as it is */
    kern_cpu_softmax_row(p + b * prow, R->nk[b]);
    for (int d = 0; d < J->sh->head_dim; d++) R->out[b][d] = 0;
  }
  attn_pass(J, it, R, 1, p, prow);
  for (int b = 0; mrow && b < R->nb; b++)
    for (int j = 0; R->qi[b] >= sq->mass_q0 && j < R->nk[b]; j++) mrow[j] += p[b * prow + j];
}

/* Queries [r0, r0 + nb) of a task. */
static void attn_rowset(const attn_job_t *J, attn_task_t T, int r0, int nb, attn_rowset_t *R) {
  const kern_attn_seq_t *sq = &J->seqs[T.seq];
  int hd = J->sh->head_dim;
  R->nb = nb, R->nmax = 0;
  for (int b = 0; b < nb; b++) {
    int i = r0 + b;
    size_t off = ((size_t)i * J->sh->n_head + T.h) * hd;
    R->qi[b] = i, R->nk[b] = kern_cpu_visible_keys(sq, sq->q_pos0 + i);
    R->q[b] = sq->q + off, R->out[b] = sq->out + off;
    R->nmax = R->nk[b] > R->nmax ? R->nk[b] : R->nmax;
  }
}

static void attn_task(void *ctx, int task) {
  const attn_job_t *J = ctx;
  attn_task_t T = {task / J->sh->n_head, task % J->sh->n_head};
  const kern_attn_seq_t *sq = &J->seqs[T.seq];
  int blk = sq->n_q < ATTN_QB ? sq->n_q : ATTN_QB;
  int hd = J->sh->head_dim, group = J->sh->n_head / J->sh->n_kv_head;
  size_t pn = (size_t)(sq->n_kv + 1) * (size_t)(blk > 0 ? blk : 1);
  size_t bn = sq->src ? (size_t)sq->src->max_rows * hd : 0;
  float *p = malloc(sizeof(float) * (pn + bn));
  if (!p) abort(); /* the block's probabilities: fails only on an exhausted host */
  attn_rows_t it = {sq, 0, T.h / group, 0, (size_t)J->sh->n_kv_head * hd, p + pn};
  float *mrow = sq->key_mass ? J->mass + J->mass_off[T.seq] + (size_t)T.h * sq->n_kv : NULL;
  for (int r0 = 0; r0 < sq->n_q; r0 += ATTN_QB) {
    attn_rowset_t R;
    attn_rowset(J, T, r0, sq->n_q - r0 < ATTN_QB ? sq->n_q - r0 : ATTN_QB, &R);
    attn_block(J, &it, &R, p, mrow);
  }
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
  attn_job_t J = {seqs, shape, off, calloc(total + 1, sizeof(float))};
  if (!J.mass) abort(); /* transient workspace: fails only on an exhausted host */
  if (kern_cpu_attn_split_takes(seqs, n_seqs)) {
    kern_cpu_attn_split((kern_cpu_t *)be, seqs, n_seqs, shape, J.mass, off);
  } else { /* a task a (sequence, head) */
    kern_cpu_pool_run(((kern_cpu_t *)be)->pool, attn_task, &J, n_seqs * shape->n_head);
  }
  for (int s = 0; s < n_seqs; s++) {
    const kern_attn_seq_t *sq = &seqs[s];
    for (int h = 0; sq->key_mass && h < shape->n_head; h++)
      for (int j = 0; j < sq->n_kv; j++)
        sq->key_mass[j] += J.mass[off[s] + (size_t)h * sq->n_kv + j] / (float)shape->n_head;
  }
  free(J.mass);
  free(off);
}
