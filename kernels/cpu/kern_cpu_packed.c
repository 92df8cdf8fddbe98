/* kern_cpu_packed: the CPU backend's packed weights (kern_cpu_create_ex KERN_WEIGHT_PACKED):
 * weight_upload_blocks keeps a weight as int8 codes with one fp32 scale and offset per block of
 * 32 (w = fma(code, scale, offset)), which is exact for the block formats of GGUF (Q4_0, Q4_1,
 * Q8_0, Q4_K, Q5_K: model_load converts them without rounding), at 1.25 bytes a weight instead
 * of 4, or 0.75 where every code fits in 4 bits (Q4_0, Q4_1, Q4_K: two codes a byte, element t
 * of a block in the low nibble of byte t and element t + 16 in its high nibble). Activations
 * stay fp32: a matmul reads a third to a fifth of the bytes and computes the fp32 products of
 * the same weights.
 *
 * The arithmetic, exactly (the AVX2 path and the plain C path give the same bits; the test
 * compares both with this formula):
 *   w[t] = fma(code[t], scale[b], offset[b]) for t in block b;
 *   y[i][j] = sum over 8 lanes, ((0+4)+(1+5))+((2+6)+(3+7)), of the lane sums of two
 *     accumulators a0 + a1, where, block by block in order, a0[l] = fma(x[t], w[t], a0[l]) for
 *     t = 32 b + l and 32 b + 16 + l (in that order), a1[l] the same for 32 b + 8 + l and
 *     32 b + 24 + l; then (y + r) + bias as the fp32 matmul.
 * Large batches (m > CPU_SKINNY_M with BLAS) go through sgemm on rows dequantized by that same
 * formula. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cpu_internal.h"
#include "qe_env.h"
#include "qe_status.h"
#ifdef QE_HAVE_BLAS
#include <cblas.h>
#endif

#define PK_BLK 32

typedef struct {
  const uint8_t *code;         /* [rows][cols] int8, or [rows][cols / 2] nibbles (bits 4) */
  const float *scale, *offset; /* [rows][cols / 32] */
  int bits;                    /* 8 or 4 */
} pk_view_t;

/* The codes, then the scales, then the offsets. */
static pk_view_t pk_view(const kern_weight_t *w) {
  int bits = w->dtype == KERN_WEIGHT_PACKED4 ? 4 : 8;
  size_t n = (size_t)w->rows * w->cols;
  const uint8_t *c = w->data;
  const float *s = (const float *)(c + n * bits / 8);
  return (pk_view_t){c, s, s + n / PK_BLK, bits};
}

/* The bits the codes need: 4 when every code is in [0, 15], or in [-8, 7] with every offset 0
 * and every scale within FLT_MAX / 16 (*shift 8: stored as code + 8 with offset -8 * scale, which
 * fma turns into the same values: (code + 8) * scale - 8 * scale is code * scale exactly before its
 * one rounding; an infinite scale would give inf - inf, NaN, where code * scale is infinite, and
 * one over FLT_MAX / 8 an infinite offset), else 8.
 */
static int pk_bits(const int8_t *code, const float *scale, const float *offset, size_t n,
                   int *shift) {
  int lo = 0, hi = 0, zero_off = 1;
  for (size_t t = 0; t < n; t++) lo = code[t] < lo ? code[t] : lo, hi = code[t] > hi ? code[t] : hi;
  for (size_t b = 0; b < n / PK_BLK; b++)
    zero_off &= offset[b] == 0.0f && fabsf(scale[b]) <= FLT_MAX / 16;
  *shift = lo < 0 && lo >= -8 && hi <= 7 && zero_off ? 8 : 0;
  return (lo >= 0 && hi <= 15) || *shift ? 4 : 8;
}

int kern_cpu_packed_upload(kern_weight_t *w, const int8_t *code, const float *scale,
                           const float *offset, int rows, int cols) {
  memset(w, 0, sizeof *w);
  if (rows < 0 || cols <= 0 || cols % PK_BLK)
    return qe_errf(QE_EINVAL, "kern: packed weight of [%d][%d] (cols a multiple of 32)", rows,
                   cols);
  size_t n = (size_t)rows * cols, nb = n / PK_BLK;
  int shift, bits = pk_bits(code, scale, offset, n, &shift);
  size_t cb = n * bits / 8;
  uint8_t *p = malloc(cb + 2 * nb * sizeof(float) + 1);
  if (!p) return qe_errf(QE_ENOMEM, "kern: no memory for a [%d][%d] weight", rows, cols);
  float *s = (float *)(p + cb), *o = s + nb;
  memcpy(s, scale, nb * sizeof(float));
  if (bits == 8) memcpy(p, code, n);
  for (size_t b = 0; bits == 4 && b < nb; b++) { /* byte t: elements t (low) and t + 16 */
    const int8_t *c = code + b * PK_BLK;
    for (int t = 0; t < 16; t++)
      p[b * 16 + t] = (uint8_t)((c[t] + shift) | (c[t + 16] + shift) << 4);
  }
  for (size_t b = 0; b < nb; b++) o[b] = shift ? -8.0f * scale[b] : offset[b];
  *w = (kern_weight_t){p, rows, cols, bits == 4 ? KERN_WEIGHT_PACKED4 : KERN_WEIGHT_PACKED};
  return 0;
}

/* The 32 codes of block b of row j (k values a row). */
static void pk_codes(const pk_view_t *v, int k, int j, int b, int8_t *c) {
  if (v->bits == 8) {
    memcpy(c, v->code + (size_t)j * k + (size_t)b * PK_BLK, PK_BLK);
    return;
  }
  const uint8_t *q = v->code + ((size_t)j * k + (size_t)b * PK_BLK) / 2;
  for (int t = 0; t < 16; t++) c[t] = (int8_t)(q[t] & 15), c[t + 16] = (int8_t)(q[t] >> 4);
}

/* Row j of w as fp32 (k values; the BLAS path's rows, and embeddings). */
static void pk_row(const pk_view_t *v, int k, int j, float *out) {
  const float *s = v->scale + (size_t)j * (k / PK_BLK), *o = v->offset + (size_t)j * (k / PK_BLK);
  for (int b = 0; b < k / PK_BLK; b++) {
    int8_t c[PK_BLK];
    pk_codes(v, k, j, b, c);
    for (int t = 0; t < PK_BLK; t++) out[b * PK_BLK + t] = fmaf((float)c[t], s[b], o[b]);
  }
}

void kern_cpu_packed_rows(const kern_weight_t *w, const int32_t *ids, int m, float *y) {
  pk_view_t v = pk_view(w);
  for (int i = 0; i < m; i++) pk_row(&v, w->cols, ids[i], y + (size_t)i * w->cols);
}

static float pk_hsum(const float *l) {
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

/* out[i] = x row i . weight row j, i < nx, by the formula above in plain C. */
static void pk_dot_scalar(const float *x, int nx, size_t ldx, const pk_view_t *v, int k, int j,
                          float *out) {
  const float *s = v->scale + (size_t)j * (k / PK_BLK), *o = v->offset + (size_t)j * (k / PK_BLK);
  for (int i = 0; i < nx; i++) {
    float a0[8] = {0}, a1[8] = {0};
    const float *xr = x + i * ldx;
    for (int b = 0; b < k / PK_BLK; b++) {
      int8_t c[PK_BLK];
      pk_codes(v, k, j, b, c);
      for (int h = 0; h < 2; h++)
        for (int l = 0; l < 8; l++) {
          int t0 = 16 * h + l, t1 = t0 + 8, x0 = PK_BLK * b + t0, x1 = x0 + 8;
          a0[l] = fmaf(xr[x0], fmaf((float)c[t0], s[b], o[b]), a0[l]);
          a1[l] = fmaf(xr[x1], fmaf((float)c[t1], s[b], o[b]), a1[l]);
        }
    }
    float sum[8];
    for (int l = 0; l < 8; l++) sum[l] = a0[l] + a1[l];
    out[i] = pk_hsum(sum);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The same for up to 4 activation rows sharing each block's weights (AVX2 + FMA). */
__attribute__((target("avx2,fma"))) static void
pk_dot_avx2(const float *x, int nx, size_t ldx, const pk_view_t *v, int k, int j, float *out) {
  const float *s = v->scale + (size_t)j * (k / PK_BLK), *o = v->offset + (size_t)j * (k / PK_BLK);
  __m256 a[4][2];
  for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
  for (int b = 0; b < k / PK_BLK; b++) {
    const __m256 vs = _mm256_set1_ps(s[b]), vo = _mm256_set1_ps(o[b]);
    __m128i c8[4]; /* codes 8q .. 8q + 7 in the low 8 bytes */
    if (v->bits == 8) {
      const uint8_t *c = v->code + (size_t)j * k + (size_t)b * PK_BLK;
      for (int q = 0; q < 4; q++) c8[q] = _mm_loadl_epi64((const __m128i *)(c + 8 * q));
    } else {
      const __m128i q16 =
          _mm_loadu_si128((const __m128i *)(v->code + ((size_t)j * k) / 2 + b * 16));
      const __m128i m4 = _mm_set1_epi8(15), lo = _mm_and_si128(q16, m4);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(q16, 4), m4);
      c8[0] = lo, c8[1] = _mm_srli_si128(lo, 8), c8[2] = hi, c8[3] = _mm_srli_si128(hi, 8);
    }
    __m256 w[4];
    for (int q = 0; q < 4; q++)
      w[q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c8[q])), vs, vo);
    for (int i = 0; i < nx; i++) {
      const float *xb = x + i * ldx + (size_t)b * PK_BLK;
      a[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), w[0], a[i][0]);
      a[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), w[1], a[i][1]);
      a[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), w[2], a[i][0]);
      a[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), w[3], a[i][1]);
    }
  }
  for (int i = 0; i < nx; i++) {
    float sum[8];
    _mm256_storeu_ps(sum, _mm256_add_ps(a[i][0], a[i][1]));
    out[i] = pk_hsum(sum);
  }
}

static int pk_use_avx2(void) {
  static int v = -1;
  if (v < 0) {
    static const char *const off_on[] = {"0", "1"}; /* 1: the plain C path (tests run both) */
    v = !qe_env_choice("QE_CPU_PACKED_SCALAR", off_on, 2, 0) && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma");
  }
  return v;
}
#else
static int pk_use_avx2(void) { return 0; }
#define pk_dot_avx2 pk_dot_scalar
#endif

typedef struct {
  float *y;
  const float *x, *bias;
  pk_view_t v;
  int m, n, k, acc, chunk;
} pk_job_t;

/* Weight rows a task walks against every block of 4 activation rows before the next (their
 * codes stay in the core's L2). */
#define PK_JB 256

static void pk_put(const pk_job_t *g, int i, int j, float r) { /* (y + r) + bias */
  float *o = g->y + (size_t)i * g->n + j;
  float v = g->acc ? *o + r : r;
  *o = g->bias ? v + g->bias[j] : v;
}

static void pk_stream_rows(const pk_job_t *g, int j0, int j1) {
  const int avx = pk_use_avx2();
  for (int jb = j0; jb < j1; jb += PK_JB) {
    int je = jb + PK_JB < j1 ? jb + PK_JB : j1;
    for (int i0 = 0; i0 < g->m; i0 += 4) {
      int nx = g->m - i0 < 4 ? g->m - i0 : 4;
      const float *x = g->x + (size_t)i0 * g->k;
      for (int j = jb; j < je; j++) {
        float r[4];
        if (avx)
          pk_dot_avx2(x, nx, (size_t)g->k, &g->v, g->k, j, r);
        else
          pk_dot_scalar(x, nx, (size_t)g->k, &g->v, g->k, j, r);
        for (int i = 0; i < nx; i++) pk_put(g, i0 + i, j, r[i]);
      }
    }
  }
}

#ifdef QE_HAVE_BLAS
/* Weight rows dequantized for one sgemm call: as many as fit PK_GEMM_BYTES (at least 64). Every
 * call packs the whole activation matrix again, so the blocks are as large as the workspace
 * allows. */
enum { PK_GEMM_BYTES = 2 << 20 };

/* Rows [j0, j1) of a large batch: a block of weight rows at a time dequantized, then sgemm. */
static void pk_gemm_rows(const pk_job_t *g, int j0, int j1) {
  int blk = PK_GEMM_BYTES / (int)sizeof(float) / g->k;
  blk = blk < 64 ? 64 : blk > j1 - j0 ? j1 - j0 : blk;
  float *wf = malloc(sizeof(float) * (size_t)blk * (size_t)g->k);
  if (!wf) abort(); /* transient workspace: fails only on an exhausted host */
  for (int jb = j0; jb < j1; jb += blk) {
    int nr = j1 - jb < blk ? j1 - jb : blk;
    for (int r = 0; r < nr; r++) pk_row(&g->v, g->k, jb + r, wf + (size_t)r * g->k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->m, nr, g->k, 1.0f, g->x, g->k, wf, g->k,
                g->acc ? 1.0f : 0.0f, g->y + jb, g->n);
    for (int i = 0; g->bias && i < g->m; i++)
      for (int r = 0; r < nr; r++) g->y[(size_t)i * g->n + jb + r] += g->bias[jb + r];
  }
  free(wf);
}
#endif

static void pk_task(void *ctx, int t) {
  const pk_job_t *g = ctx;
  int j0 = t * g->chunk, j1 = j0 + g->chunk < g->n ? j0 + g->chunk : g->n;
  if (j0 >= j1) return;
#ifdef QE_HAVE_BLAS
  if (g->m > CPU_SKINNY_M) {
    pk_gemm_rows(g, j0, j1);
    return;
  }
#endif
  pk_stream_rows(g, j0, j1);
}

void kern_cpu_packed_matmul(kern_cpu_t *c, float *y, const float *x, const kern_weight_t *w,
                            const float *bias, int m, int acc) {
  int n = w->rows, tasks = n >= 64 ? c->base.n_threads : 1;
  pk_job_t g = {y, x, bias, pk_view(w), m, n, w->cols, acc, (n + tasks - 1) / tasks};
  kern_cpu_pool_run(c->pool, pk_task, &g, tasks);
}
