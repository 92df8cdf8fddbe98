/* kern_cpu: the CPU reference backend (fp32). GEMMs go through OpenBLAS (cblas) when built
 * with it, otherwise through a plain C loop. Element-wise ops are plain loops; attention
 * (kern_cpu_attn.c) and sampling (kern_cpu_sample.c) live in their own files. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kern.h"
#include "kern_cpu_internal.h"
#include "qe_status.h"
#ifdef QE_HAVE_BLAS
#include <cblas.h>
#endif

static void cpu_destroy(kern_backend_t *be) { free(be); }

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

#ifndef QE_HAVE_BLAS
static void cpu_gemm_plain(float *y, const float *x, const float *w, int m, int n, int k,
                           int acc) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      const float *xr = x + (size_t)i * k, *wr = w + (size_t)j * k;
      float s = 0;
      for (int t = 0; t < k; t++) s += xr[t] * wr[t];
      y[(size_t)i * n + j] = acc ? y[(size_t)i * n + j] + s : s;
    }
}
#endif

static void cpu_matmul(kern_backend_t *be, float *y, const float *x, const kern_weight_t *w,
                       const float *bias, int m, int acc) {
  int n = w->rows, k = w->cols;
#ifdef QE_HAVE_BLAS
  if (m == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w->data, k, x, 1, acc ? 1.0f : 0.0f,
                y, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w->data, k,
                acc ? 1.0f : 0.0f, y, n);
#else
  cpu_gemm_plain(y, x, w->data, m, n, k, acc);
#endif
  if (!bias) return;
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) y[(size_t)i * n + j] += bias[j];
}

static void cpu_rmsnorm(kern_backend_t *be, float *y, const float *x, const float *g, int m,
                        int n, float eps) {
  for (int i = 0; i < m; i++) {
    const float *xr = x + (size_t)i * n;
    float *yr = y + (size_t)i * n;
    float ss = 0;
    for (int j = 0; j < n; j++) ss += xr[j] * xr[j];
    float inv = 1.0f / sqrtf(ss / n + eps);
    for (int j = 0; j < n; j++) yr[j] = xr[j] * inv * g[j];
  }
}

static void cpu_swiglu(kern_backend_t *be, float *y, const float *gate, const float *up, int m,
                       int n) {
  size_t total = (size_t)m * n;
  for (size_t i = 0; i < total; i++) {
    float gv = gate[i];
    y[i] = gv / (1.0f + expf(-gv)) * up[i];
  }
}

static void cpu_add(kern_backend_t *be, float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_embed(kern_backend_t *be, float *y, const float *table, const int32_t *ids,
                      int m, int n) {
  for (int i = 0; i < m; i++)
    memcpy(y + (size_t)i * n, table + (size_t)ids[i] * n, sizeof(float) * n);
}

void kern_cpu_softmax_row(float *x, int n) {
  float mx = -INFINITY, s = 0;
  for (int j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
  for (int j = 0; j < n; j++) {
    x[j] = expf(x[j] - mx);
    s += x[j];
  }
  for (int j = 0; j < n; j++) x[j] /= s;
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
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = kern_cpu_rope,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .embed = cpu_embed,
    .softmax = cpu_softmax,
    .attention = kern_cpu_attention,
    .sample = kern_cpu_sample,
};

int kern_cpu_create(int n_threads, kern_backend_t **out) {
  kern_backend_t *be = calloc(1, sizeof *be);
  if (!be) return qe_errf(QE_ENOMEM, "kern: cannot allocate the cpu backend");
  be->ops = &cpu_ops;
  be->n_threads = n_threads > 0 ? n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
#ifdef QE_HAVE_BLAS
  if (n_threads > 0) openblas_set_num_threads(n_threads);
#endif
  *out = be;
  return 0;
}

void kern_destroy(kern_backend_t *be) {
  if (be) be->ops->destroy(be);
}
