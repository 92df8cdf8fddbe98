/* kern_cuda_kv: the paged KV caches' data movement on the GPU (see kern_cuda_kv.h). CPU
 * references of each kernel: tests/kernels/test_kv_gpu.c. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdlib.h>

extern "C" {
#include "qe_status.h"
}
#include "kern_cuda_kv.h"

static int kck_cuda_at(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return 0;
  return qe_errf(QE_EBACKEND, "cuda: %s: %s (%s:%d)", what, cudaGetErrorString(e), file, line);
}
#define KCK_CUDA(call) kck_cuda_at((call), #call, __FILE__, __LINE__)
#define KCK_LAUNCHED() kck_cuda_at(cudaGetLastError(), "launch", __FILE__, __LINE__)

__global__ void kck_scatter_k(kern_pwin_t *table, const kc_kv_upd_t *upd, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) table[upd[i].index] = upd[i].w;
}

/* One block per token: threads over the row's K and V values. */
__global__ void kck_store_k(const kc_kv_store_t a) {
  const int i = blockIdx.x, pos = a.tok_pos[i], r = pos % a.omega;
  if (a.tok_slot[i] < 0) return; /* an inactive row (a padded fixed-shape step) */
  kern_pwin_t *w = a.table + a.tok_slot[i] * a.slot_stride + pos / a.omega;
  if (w->tier != KERN_PW_FULL) return; /* no page (a tiered pool ran dry): not stored */
  __nv_bfloat16 *kp = (__nv_bfloat16 *)(a.arena + w->k) + (size_t)r * a.row;
  __nv_bfloat16 *vp = (__nv_bfloat16 *)(a.arena + w->v) + (size_t)r * a.row;
  const float *ks = a.k + (size_t)i * a.row, *vs = a.v + (size_t)i * a.row;
  for (int j = threadIdx.x; j < a.row; j += blockDim.x) {
    kp[j] = __float2bfloat16(ks[j]);
    vp[j] = __float2bfloat16(vs[j]);
  }
  if (threadIdx.x == 0) atomicMax(&w->n_tok, r + 1);
}

/* One block per token of the sequence. */
__global__ void kck_gather_k(const uint8_t *arena, const kern_pwin_t *win, int omega, int row,
                             float *k, float *v) {
  const int t = blockIdx.x;
  const kern_pwin_t w = win[t / omega];
  const __nv_bfloat16 *kp = (const __nv_bfloat16 *)(arena + w.k) + (size_t)(t % omega) * row;
  const __nv_bfloat16 *vp = (const __nv_bfloat16 *)(arena + w.v) + (size_t)(t % omega) * row;
  for (int j = threadIdx.x; j < row; j += blockDim.x) {
    k[(size_t)t * row + j] = __bfloat162float(kp[j]);
    v[(size_t)t * row + j] = __bfloat162float(vp[j]);
  }
}

__global__ void kck_rows_k(float *dst, const float *src, const int32_t *idx, int row, int scatter) {
  const int i = blockIdx.x;
  const size_t d = (size_t)(scatter ? idx[i] : i) * row, s = (size_t)(scatter ? i : idx[i]) * row;
  for (int j = threadIdx.x; j < row; j += blockDim.x) dst[d + j] = src[s + j];
}

static int kck_threads(int row) { return row >= 512 ? 256 : row >= 128 ? 128 : 64; }

extern "C" int kc_kv_scatter(kern_pwin_t *table, const kc_kv_upd_t *upd, int n, void *stream) {
  if (n < 0 || (n && (!table || !upd))) return qe_errf(QE_EINVAL, "kc_kv_scatter: bad arguments");
  if (!n) return 0;
  kck_scatter_k<<<(n + 127) / 128, 128, 0, (cudaStream_t)stream>>>(table, upd, n);
  return KCK_LAUNCHED();
}

extern "C" int kc_kv_store(const kc_kv_store_t *a, void *stream) {
  if (!a || a->n < 0 || a->omega < 1 || a->row < 1 || a->n > 2147483647)
    return qe_errf(QE_EINVAL, "kc_kv_store: bad arguments");
  if (!a->n) return 0;
  kck_store_k<<<a->n, kck_threads(a->row), 0, (cudaStream_t)stream>>>(*a);
  return KCK_LAUNCHED();
}

extern "C" int kc_kv_gather(const uint8_t *arena, const kern_pwin_t *win, int omega, int row,
                            int n_tok, float *k, float *v, void *stream) {
  if (n_tok < 0 || omega < 1 || row < 1 || (n_tok && (!win || !k || !v)))
    return qe_errf(QE_EINVAL, "kc_kv_gather: bad arguments");
  if (!n_tok) return 0;
  kck_gather_k<<<n_tok, kck_threads(row), 0, (cudaStream_t)stream>>>(arena, win, omega, row, k, v);
  return KCK_LAUNCHED();
}

extern "C" int kc_kv_rows(float *dst, const float *src, const int32_t *idx, int n, int row,
                          int scatter, void *stream) {
  if (n < 0 || row < 1 || (n && (!dst || !src || !idx)))
    return qe_errf(QE_EINVAL, "kc_kv_rows: bad arguments");
  if (!n) return 0;
  kck_rows_k<<<n, kck_threads(row), 0, (cudaStream_t)stream>>>(dst, src, idx, row, scatter);
  return KCK_LAUNCHED();
}

extern "C" void *kc_host_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMallocHost(&p, bytes ? bytes : 64) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}

extern "C" void kc_host_free(void *p) {
  if (p) (void)cudaFreeHost(p);
}

extern "C" int kc_upload_async(void *dst, const void *src, size_t bytes, void *stream) {
  if (!bytes) return 0;
  return KCK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
}

extern "C" int kc_memset_async(void *dst, int value, size_t bytes, void *stream) {
  if (!bytes) return 0;
  return KCK_CUDA(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)stream));
}

extern "C" int kc_stream_sync(void *stream) {
  return KCK_CUDA(cudaStreamSynchronize((cudaStream_t)stream));
}

/* ---- timers ---------------------------------------------------------------------------------- */

#define KCK_PAIRS 64

struct kc_timer {
  cudaEvent_t beg[KCK_PAIRS], end[KCK_PAIRS];
  int n, open; /* pairs recorded and not yet folded in; a begin without its end */
  double ms;
  long count;
};

extern "C" void kc_timer_destroy(kc_timer_t *t) {
  if (!t) return;
  for (int i = 0; i < KCK_PAIRS; i++) {
    if (t->beg[i]) cudaEventDestroy(t->beg[i]);
    if (t->end[i]) cudaEventDestroy(t->end[i]);
  }
  free(t);
}

extern "C" int kc_timer_create(kc_timer_t **out) {
  kc_timer_t *t = (kc_timer_t *)calloc(1, sizeof *t);
  if (!t) return qe_errf(QE_ENOMEM, "kc_timer: out of memory");
  int rc = 0;
  for (int i = 0; i < KCK_PAIRS && !rc; i++)
    if (!(rc = KCK_CUDA(cudaEventCreate(&t->beg[i])))) rc = KCK_CUDA(cudaEventCreate(&t->end[i]));
  if (rc) {
    kc_timer_destroy(t);
    return rc;
  }
  *out = t;
  return 0;
}

/* Adds every recorded pair's time (waits for the last one) and empties the set. */
static int kck_fold(kc_timer_t *t) {
  for (int i = 0; i < t->n; i++) {
    float ms = 0.0f;
    int rc = KCK_CUDA(cudaEventSynchronize(t->end[i]));
    if (!rc) rc = KCK_CUDA(cudaEventElapsedTime(&ms, t->beg[i], t->end[i]));
    if (rc) return rc;
    t->ms += ms, t->count++;
  }
  t->n = 0;
  return 0;
}

extern "C" int kc_timer_begin(kc_timer_t *t, void *stream) {
  int rc = t->n == KCK_PAIRS ? kck_fold(t) : 0;
  if (!rc) rc = KCK_CUDA(cudaEventRecord(t->beg[t->n], (cudaStream_t)stream));
  t->open = !rc;
  return rc;
}

extern "C" int kc_timer_end(kc_timer_t *t, void *stream) {
  if (!t->open) return qe_errf(QE_EINVAL, "kc_timer: end without begin");
  int rc = KCK_CUDA(cudaEventRecord(t->end[t->n], (cudaStream_t)stream));
  t->open = 0;
  if (!rc) t->n++;
  return rc;
}

extern "C" int kc_timer_ms(kc_timer_t *t, double *ms, long *count) {
  int rc = kck_fold(t);
  *ms = t->ms, *count = t->count;
  return rc;
}
