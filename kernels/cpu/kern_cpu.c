/* kern_cpu: the CPU reference backend (fp32). GEMMs go through OpenBLAS (cblas) when built
 * with it, otherwise through a plain C loop. Element-wise ops are plain loops; attention
 * (kern_cpu_attn.c) and sampling (kern_cpu_sample.c) live in their own files. */
#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kern.h"
#include "kern_cpu_internal.h"
#include "qe_env.h"
#include "qe_status.h"
#ifdef QE_HAVE_BLAS
#include <cblas.h>
#endif

static void cpu_destroy(kern_backend_t *be) {
  kern_cpu_pool_destroy(((kern_cpu_t *)be)->pool);
  free(((kern_cpu_t *)be)->rope.cs);
  free(be);
}

static void *cpu_alloc(kern_backend_t *be, size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64)) return NULL;
  return p;
}

static void cpu_free(kern_backend_t *be, void *p) { free(p); }

static int cpu_copy(kern_backend_t *be, void *dst, const void *src, size_t bytes) {
  memmove(dst, src, bytes);
  return 0;
}

/* Weights stay fp32 on the CPU: a plain copy of host. */
static int cpu_weight_upload(kern_backend_t *be, kern_weight_t *w, const float *host, int rows,
                             int cols) {
  memset(w, 0, sizeof *w);
  if (rows < 0 || cols < 0)
    return qe_errf(QE_EINVAL, "kern: weight of [%d][%d] is invalid", rows, cols);
  size_t bytes = sizeof(float) * (size_t)rows * (size_t)cols;
  void *p = cpu_alloc(be, bytes);
  if (!p) return qe_errf(QE_ENOMEM, "kern: no memory for a [%d][%d] weight", rows, cols);
  if (bytes) memcpy(p, host, bytes);
  *w = (kern_weight_t){p, rows, cols, KERN_WEIGHT_F32};
  return 0;
}

static int cpu_weight_upload_blocks(kern_backend_t *be, kern_weight_t *w, const int8_t *code,
                                    const float *scale, const float *offset, int rows, int cols) {
  return kern_cpu_packed_upload(w, code, scale, offset, rows, cols);
}

static void cpu_weight_free(kern_backend_t *be, kern_weight_t *w) {
  free(w->data);
  memset(w, 0, sizeof *w);
}

int kern_weight_stack_rows(const char *backend, const kern_weight_t *parts, int n, int dtype,
                           size_t *rows) {
  *rows = 0;
  for (int i = 0; i < n; i++) {
    if (parts[i].dtype != dtype || parts[i].cols != parts[0].cols)
      return qe_errf(QE_EUNSUPPORTED, "%s: weight_concat of part %d: not %s [%d] columns", backend,
                     i, dtype == KERN_WEIGHT_BF16 ? "bf16" : "f32", parts[0].cols);
    *rows += (size_t)parts[i].rows;
  }
  if (n <= 0 || *rows > INT_MAX)
    return qe_errf(QE_EINVAL, "%s: weight_concat of %d parts", backend, n);
  return 0;
}

/* F32 parts stacked by rows (packed ones are not: QE_EUNSUPPORTED, the model keeps them). */
static int cpu_weight_concat(kern_backend_t *be, kern_weight_t *out, kern_weight_t *parts, int n) {
  memset(out, 0, sizeof *out);
  size_t rows;
  int rc = kern_weight_stack_rows("kern", parts, n, KERN_WEIGHT_F32, &rows);
  if (rc) return rc;
  const size_t row_b = sizeof(float) * (size_t)parts[0].cols;
  char *d = cpu_alloc(be, rows * row_b);
  if (!d) return qe_errf(QE_ENOMEM, "kern: no memory for a stacked weight");
  for (int i = 0, off = 0; i < n; off += parts[i++].rows)
    memcpy(d + (size_t)off * row_b, parts[i].data, (size_t)parts[i].rows * row_b);
  *out = (kern_weight_t){d, (int)rows, parts[0].cols, KERN_WEIGHT_F32};
  for (int i = 0; i < n; i++) cpu_weight_free(be, &parts[i]);
  return 0;
}

typedef float cpu_v8 __attribute__((vector_size(32), aligned(4)));

static float cpu_hsum(cpu_v8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* out[i] = x[i]·w for up to 4 activation rows, sharing each weight load; two accumulators
 * per row hide the add latency. k tail handled in scalar code. */
static void cpu_dot_rows(const float *x, int nx, size_t ldx, const float *w, int k, float *out) {
  cpu_v8 a[4][2] = {{{0}}};
  int t = 0;
  for (; t + 16 <= k; t += 16) {
    cpu_v8 w0 = *(const cpu_v8 *)(w + t), w1 = *(const cpu_v8 *)(w + t + 8);
    for (int i = 0; i < nx; i++) {
      a[i][0] += *(const cpu_v8 *)(x + i * ldx + t) * w0;
      a[i][1] += *(const cpu_v8 *)(x + i * ldx + t + 8) * w1;
    }
  }
  for (int i = 0; i < nx; i++) {
    float s = cpu_hsum(a[i][0] + a[i][1]);
    for (int r = t; r < k; r++) s += x[i * ldx + r] * w[r];
    out[i] = s;
  }
}

/* One matmul split into tasks over ranges of weight rows. */
typedef struct {
  float *y;
  const float *x, *w;
  int m, n, k, acc, chunk;
} cpu_gemm_job_t;

/* Rows [j0, j1) by the streaming kernel: y[m][n] (+)= x[m][k] · w[n][k]ᵀ. */
static void cpu_gemm_stream_rows(const cpu_gemm_job_t *g, int j0, int j1) {
  for (int j = j0; j < j1; j++) {
    float r[4];
    for (int i0 = 0; i0 < g->m; i0 += 4) {
      int nx = g->m - i0 < 4 ? g->m - i0 : 4;
      cpu_dot_rows(g->x + (size_t)i0 * g->k, nx, (size_t)g->k, g->w + (size_t)j * g->k, g->k, r);
      for (int i = 0; i < nx; i++) {
        float *o = g->y + (size_t)(i0 + i) * g->n + j;
        *o = g->acc ? *o + r[i] : r[i];
      }
    }
  }
}

static void cpu_gemm_task(void *ctx, int t) {
  const cpu_gemm_job_t *g = ctx;
  int j0 = t * g->chunk, j1 = j0 + g->chunk < g->n ? j0 + g->chunk : g->n;
  if (j0 >= j1) return;
#ifdef QE_HAVE_BLAS
  /* Large m: single-threaded BLAS on this task's slice of weight rows. */
  if (g->m > CPU_SKINNY_M) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->m, j1 - j0, g->k, 1.0f, g->x, g->k,
                g->w + (size_t)j0 * g->k, g->k, g->acc ? 1.0f : 0.0f, g->y + j0, g->n);
    return;
  }
#endif
  cpu_gemm_stream_rows(g, j0, j1);
}

static void cpu_matmul(kern_backend_t *be, float *y, const float *x, const kern_weight_t *w,
                       const float *bias, int m, int acc) {
  if (w->dtype == KERN_WEIGHT_PACKED || w->dtype == KERN_WEIGHT_PACKED4) {
    kern_cpu_packed_matmul((kern_cpu_t *)be, y, x, w, bias, m, acc);
    return;
  }
  assert(w->dtype == KERN_WEIGHT_F32); /* the cpu backend makes no other */
  int n = w->rows, tasks = n >= 64 ? be->n_threads : 1;
  cpu_gemm_job_t g = {y, x, w->data, m, n, w->cols, acc, (n + tasks - 1) / tasks};
  kern_cpu_pool_run(((kern_cpu_t *)be)->pool, cpu_gemm_task, &g, tasks);
  if (!bias) return;
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) y[(size_t)i * n + j] += bias[j];
}

static void cpu_rmsnorm(kern_backend_t *be, float *y, const float *x, const float *g, int m, int n,
                        float eps) {
  for (int i = 0; i < m; i++) {
    const float *xr = x + (size_t)i * n;
    float *yr = y + (size_t)i * n;
    float ss = 0;
    for (int j = 0; j < n; j++) ss += xr[j] * xr[j];
    float inv = 1.0f / sqrtf(ss / n + eps);
    for (int j = 0; j < n; j++) yr[j] = xr[j] * inv * g[j];
  }
}

static void cpu_add(kern_backend_t *be, float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_embed(kern_backend_t *be, float *y, const float *table, const int32_t *ids, int m,
                      int n) {
  for (int i = 0; i < m; i++)
    memcpy(y + (size_t)i * n, table + (size_t)ids[i] * n, sizeof(float) * n);
}

static void cpu_embed_w(kern_backend_t *be, float *y, const kern_weight_t *w, const int32_t *ids,
                        int m, int n) {
  if (w->dtype == KERN_WEIGHT_F32)
    cpu_embed(be, y, w->data, ids, m, n);
  else
    kern_cpu_packed_rows(w, ids, m, y);
}

typedef int32_t cpu_i8 __attribute__((vector_size(32)));

/* m ? a : b lane by lane (m: a comparison's all-ones or zero lanes). */
static inline cpu_v8 sel8(cpu_i8 m, cpu_v8 a, cpu_v8 b) {
  cpu_i8 ia, ib;
  memcpy(&ia, &a, sizeof ia);
  memcpy(&ib, &b, sizeof ib);
  ia = (ia & m) | (ib & ~m);
  memcpy(&a, &ia, sizeof a);
  return a;
}

/* e^x lane by lane (kern_cpu_exp1's arithmetic, documented in kern_cpu_internal.h). */
static inline cpu_v8 exp8(cpu_v8 x) {
  const cpu_v8 zero = {0}, lo = zero - 87.0f, hi = zero + 88.0f;
  /* (a NaN lane is made 0 here, so that no NaN reaches the conversion to integers) */
  const cpu_v8 y = sel8(x != x, zero, sel8(x > hi, hi, sel8(x < lo, lo, x)));
  const cpu_v8 nf = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* rint */
  const cpu_v8 r = (y - nf * 0.693359375f) - nf * -2.12194440e-4f;
  cpu_v8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * (r * r) + r) + 1.0f;
  const cpu_i8 e = (__builtin_convertvector(nf, cpu_i8) + 127) << 23;
  cpu_v8 two_n;
  memcpy(&two_n, &e, sizeof two_n);
  return sel8(x != x, x, sel8(x < lo, zero, p * two_n));
}

/* y = g / (1 + e^-g) * u, eight lanes at a time (e^x as kern_cpu_exp1). */
static void cpu_swiglu(kern_backend_t *be, float *y, const float *gate, const float *up, int m,
                       int n) {
  const size_t total = (size_t)m * n;
  for (size_t i = 0; i < total; i += 8) {
    const size_t nl = total - i < 8 ? total - i : 8;
    cpu_v8 g = {0}, u = {0};
    memcpy(&g, gate + i, sizeof(float) * nl);
    memcpy(&u, up + i, sizeof(float) * nl);
    const cpu_v8 r = g / (1.0f + exp8(-g)) * u;
    memcpy(y + i, &r, sizeof(float) * nl);
  }
}

static void cpu_swiglu_cat(kern_backend_t *be, float *y, const float *gu, int m, int n) {
  for (int r = 0; r < m; r++) /* (lane-wise: the bits of one swiglu over the halves) */
    cpu_swiglu(be, y + (size_t)r * n, gu + (size_t)r * 2 * n, gu + (size_t)r * 2 * n + n, 1, n);
}

/* The columns of q, k and v copied out of qkv, then rope on q and k (the reference itself). */
static void cpu_qkv_rope(kern_backend_t *be, float *q, float *k, float *v, const float *qkv,
                         const int32_t *pos, int m, int n_q, int n_kv, int head_dim,
                         const kern_rope_t *r) {
  const size_t wq = (size_t)n_q * head_dim, wk = (size_t)n_kv * head_dim, w = wq + 2 * wk;
  for (int t = 0; t < m; t++) {
    memcpy(q + t * wq, qkv + t * w, sizeof(float) * wq);
    memcpy(k + t * wk, qkv + t * w + wq, sizeof(float) * wk);
    memcpy(v + t * wk, qkv + t * w + wq + wk, sizeof(float) * wk);
  }
  kern_cpu_rope(be, q, pos, m, n_q, head_dim, r);
  kern_cpu_rope(be, k, pos, m, n_kv, head_dim, r);
}

float kern_cpu_exp1(float x) {
  cpu_v8 v = {x};
  return exp8(v)[0];
}

/* The maximum of x[0..n) as m = x > m ? x : m from -inf (NaNs passed over), eight lanes at a
 * time: the same value as one chain (the order can only choose between +0 and -0, which
 * subtract alike from every other value and give e^0 = 1 alike). */
static float max_row(const float *x, int n) {
  const cpu_v8 ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                       -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  cpu_v8 m8 = ninf;
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    cpu_v8 v;
    memcpy(&v, x + j, sizeof v);
    m8 = sel8(v > m8, v, m8);
  }
  float mx = -INFINITY;
  for (int l = 0; l < 8; l++) mx = m8[l] > mx ? m8[l] : mx;
  for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
  return mx;
}

void kern_cpu_softmax_row(float *x, int n) {
  const float mx = max_row(x, n);
  cpu_v8 acc = {0};
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    cpu_v8 v;
    memcpy(&v, x + j, sizeof v);
    v = exp8(v - mx);
    memcpy(x + j, &v, sizeof v);
    acc += v;
  }
  if (j < n) { /* the tail through the same lanes, padded with -inf (e^-inf = 0) */
    cpu_v8 v = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    memcpy(&v, x + j, sizeof(float) * (size_t)(n - j));
    v = exp8(v - mx);
    memcpy(x + j, &v, sizeof(float) * (size_t)(n - j));
    acc += v;
  }
  const float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (j = 0; j < n; j++) x[j] /= s;
}

static void cpu_softmax(kern_backend_t *be, float *x, int m, int n) {
  for (int i = 0; i < m; i++) kern_cpu_softmax_row(x + (size_t)i * n, n);
}

static const kern_ops_t cpu_ops = {
    .name = "cpu",
    .host_memory = 1,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .weight_upload = cpu_weight_upload,
    .weight_upload_blocks = cpu_weight_upload_blocks,
    .weight_free = cpu_weight_free,
    .weight_concat = cpu_weight_concat, /* (used with $QE_CPU_FUSE_PROJ=1) */
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = kern_cpu_rope,
    .swiglu = cpu_swiglu,
    .qkv_rope = cpu_qkv_rope,
    .swiglu_cat = cpu_swiglu_cat,
    .add = cpu_add,
    .add_rmsnorm = NULL, /* (add, then rmsnorm: the CPU gains nothing from one pass) */
    .embed = cpu_embed,
    .embed_w = cpu_embed_w,
    .softmax = cpu_softmax,
    .attention = kern_cpu_attention,
    .sample = kern_cpu_sample,
    .argmax = kern_cpu_argmax,
};

int kern_cpu_create(int n_threads, kern_backend_t **out) {
  return kern_cpu_create_ex(n_threads, KERN_WEIGHT_F32, out);
}

int kern_cpu_create_ex(int n_threads, int weights, kern_backend_t **out) {
  if (weights != KERN_WEIGHT_F32 && weights != KERN_WEIGHT_PACKED)
    return qe_errf(QE_EINVAL, "kern: the cpu backend holds weights as f32 or packed (got %d)",
                   weights);
  kern_cpu_t *c = calloc(1, sizeof *c);
  if (!c) return qe_errf(QE_ENOMEM, "kern: cannot allocate the cpu backend");
  c->base.ops = &cpu_ops;
  c->base.packed_weights = weights == KERN_WEIGHT_PACKED;
  /* (1: stacked projections, as on the GPU: the same logits; off by default) */
  c->base.fuse_proj = (int)qe_env_long("QE_CPU_FUSE_PROJ", 0, 1, 0);
  c->base.n_threads = n_threads > 0 ? n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  c->pool = kern_cpu_pool_create(c->base.n_threads);
#ifdef QE_HAVE_BLAS
  openblas_set_num_threads(1); /* our pool parallelizes; OpenBLAS workers would only spin */
#endif
  *out = &c->base;
  return 0;
}

void kern_destroy(kern_backend_t *be) {
  if (be) be->ops->destroy(be);
}
