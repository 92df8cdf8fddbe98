/* kern_cuda: the CUDA backend's host side: device memory (cudaMalloc, copies on the backend's
 * stream), the sticky error, bf16 weights (weight_upload), GEMMs through cuBLASLt (cuBLAS GemmEx
 * as the fallback) and the ops table. The kernels of the other ops are in kern_cuda_ops.cu;
 * sampling runs the CPU sampler on the host (logits are host memory by kern.h's contract). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "kern_cuda_internal.h"

extern "C" {
#include "cpu/kern_cpu_internal.h" /* kern_cpu_sample */
#include "qe_env.h"
}

/* ---- errors ---------------------------------------------------------------------------- */

int kcu_fail(kcu_t *c, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!c->err) {
    c->err = QE_EBACKEND;
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
  }
  return qe_errf(QE_EBACKEND, "cuda: %s", msg);
}

int kcu_cuda_at(kcu_t *c, cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return 0;
  return kcu_fail(c, "%s:%d: %s: %s", file, line, what, cudaGetErrorString(e));
}

int kcu_blas_at(kcu_t *c, cublasStatus_t s, const char *what, const char *file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  return kcu_fail(c, "%s:%d: %s: %s", file, line, what, cublasGetStatusString(s));
}

/* The error an int-returning op gives once a void op has failed. */
static int kcu_sticky(const kcu_t *c) {
  return qe_errf(QE_EBACKEND, "cuda: %s (an earlier operation failed)", c->errmsg);
}

int kcu_enter(kcu_t *c) {
  c->op_seq++; /* every op: a matmul reuses its bf16 x only right after another matmul */
  if (c->err) return c->err;
  return KCU_CUDA(c, cudaSetDevice(c->device));
}

int kcu_capture_refuse(kcu_t *c, const char *what) {
  if (!c->capturing) return 0;
  c->capture_bad = 1;
  return qe_errf(QE_EUNSUPPORTED, "cuda: %s cannot move while a graph is recorded", what);
}

int kcu_grow(kcu_t *c, void **p, size_t *cap, size_t need) {
  if (need <= *cap && *p) return 0;
  int rc = kcu_capture_refuse(c, "scratch");
  if (rc) return rc;
  c->epoch++;
  size_t n = need + need / 2 > 4096 ? need + need / 2 : 4096;
  if (*p && KCU_CUDA(c, cudaFree(*p))) return QE_EBACKEND;
  *p = NULL;
  *cap = 0;
  if (KCU_CUDA(c, cudaMalloc(p, n))) return QE_EBACKEND;
  *cap = n;
  return 0;
}

int kcu_grow_host(kcu_t *c, void **p, size_t *cap, size_t need) {
  if (need <= *cap && *p) return 0;
  size_t n = need + need / 2 > 4096 ? need + need / 2 : 4096;
  void *q = realloc(*p, n);
  if (!q) return kcu_fail(c, "out of host memory (%zu bytes of staging)", n);
  *p = q;
  *cap = n;
  return 0;
}

/* ---- memory ops -------------------------------------------------------------------------- */

static void *kcu_alloc(kern_backend_t *be, size_t bytes) {
  kcu_t *c = KCU(be);
  void *p = NULL;
  if (cudaSetDevice(c->device) != cudaSuccess ||
      cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
    (void)cudaGetLastError(); /* an allocation failure is the caller's NULL, not sticky */
    return NULL;
  }
  return p;
}

static void kcu_free(kern_backend_t *be, void *p) {
  kcu_t *c = KCU(be);
  if (!p) return;
  KCU_CUDA(c, cudaSetDevice(c->device));
  KCU_CUDA(c, cudaFree(p));
}

/* Returns after src has been read (so the caller may reuse it at once). */
static int kcu_upload(kern_backend_t *be, void *dst, const void *src, size_t bytes) {
  kcu_t *c = KCU(be);
  if (kcu_enter(c)) return kcu_sticky(c);
  if (!bytes) return 0;
  int rc = KCU_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
  if (!rc) rc = KCU_CUDA(c, cudaStreamSynchronize(c->stream));
  return rc;
}

/* Waits for every op queued before it. */
static int kcu_download(kern_backend_t *be, void *dst, const void *src, size_t bytes) {
  kcu_t *c = KCU(be);
  if (kcu_enter(c)) return kcu_sticky(c);
  int rc =
      bytes ? KCU_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream)) : 0;
  if (!rc) rc = KCU_CUDA(c, cudaStreamSynchronize(c->stream));
  return rc;
}

static int kcu_copy(kern_backend_t *be, void *dst, const void *src, size_t bytes) {
  kcu_t *c = KCU(be);
  if (kcu_enter(c)) return kcu_sticky(c);
  if (!bytes) return 0;
  return KCU_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

/* ---- weights ------------------------------------------------------------------------------ */

/* Converts host fp32 [n] into device bf16 dst through a device fp32 staging buffer of at most
 * KCU_STAGE_BYTES, one chunk at a time on the stream; returns once the device is done. */
static int kcu_stage_bf16(kcu_t *c, __nv_bfloat16 *dst, const float *host, size_t n) {
  size_t chunk = KCU_STAGE_BYTES / sizeof(float);
  chunk = n < chunk ? n : chunk;
  float *stage = NULL;
  if (!chunk) return 0;
  if (cudaMalloc((void **)&stage, chunk * sizeof(float)) != cudaSuccess) {
    (void)cudaGetLastError(); /* out of memory is the caller's error, not sticky */
    return qe_errf(QE_ENOMEM, "cuda: no device memory for %zu bytes of weight staging",
                   chunk * sizeof(float));
  }
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i += chunk) {
    size_t k = n - i < chunk ? n - i : chunk;
    rc = KCU_CUDA(
        c, cudaMemcpyAsync(stage, host + i, k * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    if (!rc) rc = kcu_to_bf16(c, dst + i, stage, k);
  }
  if (!rc) rc = KCU_CUDA(c, cudaStreamSynchronize(c->stream));
  int rf = KCU_CUDA(c, cudaFree(stage));
  return rc ? rc : rf;
}

static int kcu_weight_upload(kern_backend_t *be, kern_weight_t *w, const float *host, int rows,
                             int cols) {
  kcu_t *c = KCU(be);
  memset(w, 0, sizeof *w);
  if (rows < 0 || cols < 0)
    return qe_errf(QE_EINVAL, "cuda: weight of [%d][%d] is invalid", rows, cols);
  if (kcu_enter(c)) return kcu_sticky(c);
  size_t n = (size_t)rows * (size_t)cols;
  __nv_bfloat16 *bf = NULL;
  if (cudaMalloc((void **)&bf, n ? n * sizeof *bf : 256) != cudaSuccess) {
    (void)cudaGetLastError();
    return qe_errf(QE_ENOMEM, "cuda: no device memory for a [%d][%d] bf16 weight (%zu bytes)", rows,
                   cols, n * sizeof *bf);
  }
  int rc = kcu_stage_bf16(c, bf, host, n);
  if (rc) {
    cudaFree(bf);
    return rc;
  }
  *w = (kern_weight_t){bf, rows, cols, KERN_WEIGHT_BF16};
  return 0;
}

static void kcu_weight_free(kern_backend_t *be, kern_weight_t *w) {
  kcu_t *c = KCU(be);
  if (w->data) {
    KCU_CUDA(c, cudaSetDevice(c->device));
    KCU_CUDA(c, cudaFree(w->data));
  }
  memset(w, 0, sizeof *w);
}

/* parts[0..n) (bf16, made by weight_upload, the same cols) stacked by rows into *out; the parts
 * are freed (zeroed) once copied, and left as they were on failure. */
static int kcu_weight_concat(kern_backend_t *be, kern_weight_t *out, kern_weight_t *parts, int n) {
  kcu_t *c = KCU(be);
  memset(out, 0, sizeof *out);
  size_t rows;
  const int bad = kern_weight_stack_rows("cuda", parts, n, KERN_WEIGHT_BF16, &rows);
  if (bad) return bad;
  if (kcu_enter(c)) return kcu_sticky(c);
  const size_t row_b = (size_t)parts[0].cols * sizeof(__nv_bfloat16);
  char *d = NULL;
  const size_t bytes = rows * row_b;
  if (cudaMalloc((void **)&d, bytes > 0 ? bytes : 256) != cudaSuccess) {
    (void)cudaGetLastError();
    return qe_errf(QE_ENOMEM, "cuda: no device memory for a [%zu][%d] bf16 weight", rows,
                   parts[0].cols);
  }
  size_t off = 0;
  int rc = 0;
  for (int i = 0; i < n && !rc; off += (size_t)parts[i++].rows * row_b)
    rc = KCU_CUDA(c, cudaMemcpyAsync(d + off, parts[i].data, (size_t)parts[i].rows * row_b,
                                     cudaMemcpyDeviceToDevice, c->stream));
  if (!rc) rc = KCU_CUDA(c, cudaStreamSynchronize(c->stream));
  if (rc) {
    cudaFree(d);
    return rc;
  }
  *out = (kern_weight_t){d, (int)rows, parts[0].cols, KERN_WEIGHT_BF16};
  for (int i = 0; i < n; i++) kcu_weight_free(be, &parts[i]); /* (after their cols are read) */
  return 0;
}

/* The bf16 operand of w: its data when weight_upload made it, else its fp32 buffer rounded
 * into the scratch c->wb (a plain fp32 weight: tests). NULL on failure (sticky). */
static const __nv_bfloat16 *kcu_weight(kcu_t *c, const kern_weight_t *w) {
  if (w->dtype == KERN_WEIGHT_BF16) return (const __nv_bfloat16 *)w->data;
  size_t n = (size_t)w->rows * (size_t)w->cols;
  if (kcu_grow(c, &c->wb, &c->wb_cap, n * sizeof(__nv_bfloat16))) return NULL;
  if (kcu_to_bf16(c, c->wb, (const float *)w->data, n)) return NULL;
  return (const __nv_bfloat16 *)c->wb;
}

/* ---- GEMM -------------------------------------------------------------------------------- */

/* Largest power of two (<= 256) dividing the address. */
static int kcu_align(const void *p) {
  int a = 256;
  while (a > 1 && (uintptr_t)p % (uintptr_t)a) a /= 2;
  return a;
}

static void plan_release(kcu_plan_t *p) {
  if (p->a) cublasLtMatrixLayoutDestroy(p->a);
  if (p->b) cublasLtMatrixLayoutDestroy(p->b);
  if (p->c) cublasLtMatrixLayoutDestroy(p->c);
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  memset(p, 0, sizeof *p);
}

/* Column-major view of y[m][n] = x[m][k] · w[n][k]ᵀ: C (n×m, ld n) = Aᵀ B with A = w (k×n,
 * ld k) and B = x (k×m, ld k). Asks the heuristic for one algorithm for these alignments. */
static int plan_build(kcu_t *c, kcu_plan_t *p) {
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  uint64_t ws = KCU_WS_SIZE;
  uint32_t al_c = (uint32_t)p->align_c, al_ab = 256;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  int rc = KCU_BLAS(c, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (!rc)
    rc = KCU_BLAS(
        c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  if (!rc)
    rc = KCU_BLAS(
        c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (!rc) rc = KCU_BLAS(c, cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, p->k, p->n, p->k));
  if (!rc) rc = KCU_BLAS(c, cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, p->k, p->m, p->k));
  if (!rc) rc = KCU_BLAS(c, cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, p->n, p->m, p->n));
  if (!rc) rc = KCU_BLAS(c, cublasLtMatmulPreferenceCreate(&pref));
  if (!rc)
    rc = KCU_BLAS(c, cublasLtMatmulPreferenceSetAttribute(
                         pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulPreferenceAttributes_t al[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && !rc; i++)
    rc = KCU_BLAS(
        c, cublasLtMatmulPreferenceSetAttribute(pref, al[i], i < 2 ? &al_ab : &al_c, sizeof al_c));
  /* no algorithm for this shape is not an error: the GemmEx path takes it */
  if (!rc &&
      cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &found) ==
          CUBLAS_STATUS_SUCCESS &&
      found > 0 && res.workspaceSize <= KCU_WS_SIZE) {
    p->algo = res.algo;
    p->ok = 1;
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  return rc;
}

/* The cached plan for (m, n, k, alignment of y), built on first use (round-robin eviction). */
static kcu_plan_t *plan_get(kcu_t *c, int m, int n, int k, int align_c) {
  for (int i = 0; i < c->n_plans; i++) {
    kcu_plan_t *p = &c->plans[i];
    if (p->m == m && p->n == n && p->k == k && p->align_c == align_c) return p;
  }
  kcu_plan_t *p;
  if (c->n_plans < KCU_PLANS) {
    p = &c->plans[c->n_plans++];
  } else {
    p = &c->plans[c->next_plan];
    c->next_plan = (c->next_plan + 1) % KCU_PLANS;
  }
  plan_release(p);
  p->m = m, p->n = n, p->k = k, p->align_c = align_c;
  if (plan_build(c, p)) {
    plan_release(p);
    return NULL;
  }
  return p;
}

/* y[m][n] (fp32) = (acc ? y : 0) + xb[m][k] · wb[n][k]ᵀ, bf16 operands, fp32 accumulation. */
static int kcu_gemm(kcu_t *c, float *y, const void *xb, const void *wb, int m, int n, int k,
                    int acc) {
  float one = 1.0f, beta = acc ? 1.0f : 0.0f;
  if (!c->gemmex_only) {
    kcu_plan_t *p = plan_get(c, m, n, k, kcu_align(y));
    if (!p) return QE_EBACKEND;
    /* an algorithm that refuses to run sends this shape to GemmEx from now on */
    if (p->ok && cublasLtMatmul(c->lt, p->op, &one, wb, p->a, xb, p->b, &beta, y, p->c, y, p->c,
                                &p->algo, c->ws, KCU_WS_SIZE, c->stream) == CUBLAS_STATUS_SUCCESS)
      return 0;
    if (p->ok) (void)cudaGetLastError(); /* GemmEx reports a fault that persists */
    p->ok = 0;
  }
  return KCU_BLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, wb, CUDA_R_16BF,
                                  k, xb, CUDA_R_16BF, k, &beta, y, CUDA_R_32F, n,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void kcu_matmul(kern_backend_t *be, float *y, const float *x, const kern_weight_t *w,
                       const float *bias, int m, int acc) {
  kcu_t *c = KCU(be);
  if (kcu_enter(c) || m <= 0 || w->rows <= 0) return;
  if (w->cols <= 0) {
    if (!acc) KCU_CUDA(c, cudaMemsetAsync(y, 0, sizeof(float) * (size_t)m * w->rows, c->stream));
    if (bias) kcu_add_bias(c, y, bias, m, w->rows);
    return;
  }
  const __nv_bfloat16 *wb = kcu_weight(c, w);
  size_t nx = (size_t)m * (size_t)w->cols;
  /* the bf16 copy of x made by the previous call serves again when nothing ran in between */
  int reuse = c->xb_src == x && c->xb_n == nx && c->xb_seq == c->op_seq - 1;
  if (!wb || (!reuse && kcu_grow(c, &c->xb, &c->xb_cap, nx * sizeof(__nv_bfloat16)))) return;
  if (!reuse && kcu_to_bf16(c, c->xb, x, nx)) return;
  if (kcu_gemm(c, y, c->xb, wb, m, w->rows, w->cols, acc)) return;
  if (bias) kcu_add_bias(c, y, bias, m, w->rows);
  int overlap = (const char *)y < (const char *)(x + nx) &&
                (const char *)(y + (size_t)m * w->rows) > (const char *)x;
  c->xb_src = overlap ? NULL : x, c->xb_n = nx, c->xb_seq = c->op_seq;
}

/* ---- sampling, lifetime, table ----------------------------------------------------------- */

static int kcu_sample(kern_backend_t *be, const float *logits, int n, const kern_sampler_t *s,
                      uint64_t *rng, void *scratch) {
  return kern_cpu_sample(be, logits, n, s, rng, scratch);
}

static void kcu_destroy(kern_backend_t *be) {
  kcu_t *c = KCU(be);
  cudaSetDevice(c->device);
  if (c->stream) cudaStreamSynchronize(c->stream);
  for (int i = 0; i < c->n_plans; i++) plan_release(&c->plans[i]);
  void *dev[] = {c->ws,         c->xb,   c->wb,     c->rope_tab, c->attn_desc,
                 c->attn_stats, c->amax, c->attn_s, c->flash_kv};
  for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
    if (dev[i]) cudaFree(dev[i]);
  if (c->blas) cublasDestroy(c->blas);
  if (c->lt) cublasLtDestroy(c->lt);
  if (c->stream) cudaStreamDestroy(c->stream);
  (void)cudaGetLastError();
  free(c->rope_host);
  free(c->attn_host);
  free(c->attn_rest);
  free(c->flash_seqs);
  free(c);
}

static const kern_ops_t kcu_ops = {
    .name = "cuda",
    .host_memory = 0,
    .destroy = kcu_destroy,
    .alloc = kcu_alloc,
    .free = kcu_free,
    .upload = kcu_upload,
    .download = kcu_download,
    .copy = kcu_copy,
    .weight_upload = kcu_weight_upload,
    .weight_upload_blocks = NULL, /* packed weights are the CPU backend's only */
    .weight_free = kcu_weight_free,
    .weight_concat = kcu_weight_concat,
    .matmul = kcu_matmul,
    .rmsnorm = kcu_rmsnorm,
    .rope = kcu_rope,
    .swiglu = kcu_swiglu,
    .qkv_rope = kcu_qkv_rope,
    .swiglu_cat = kcu_swiglu_cat,
    .add = kcu_add,
    .add_rmsnorm = kcu_add_rmsnorm,
    .embed = kcu_embed,
    .embed_w = NULL, /* (packed weights are the CPU backend's) */
    .softmax = kcu_softmax,
    .attention = kcu_attention,
    .sample = kcu_sample,
    .argmax = kcu_argmax,
    .argmax_dev = kcu_argmax_dev,
    .host_alloc = kcu_host_alloc,
    .host_free = kcu_host_free,
    .upload_async = kcu_upload_async,
    .graph_begin = kcu_graph_begin,
    .graph_end = kcu_graph_end,
    .graph_launch = kcu_graph_launch,
    .graph_free = kcu_graph_free,
    .scratch_epoch = kcu_scratch_epoch,
};

extern "C" int kern_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  (void)cudaGetLastError();
  return n;
}

static int kcu_init(kcu_t *c) {
  int rc = KCU_CUDA(c, cudaSetDevice(c->device));
  if (!rc) rc = KCU_CUDA(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  if (!rc) rc = KCU_BLAS(c, cublasLtCreate(&c->lt));
  if (!rc) rc = KCU_BLAS(c, cublasCreate(&c->blas));
  if (!rc) rc = KCU_BLAS(c, cublasSetStream(c->blas, c->stream));
  if (!rc) rc = KCU_CUDA(c, cudaMalloc(&c->ws, KCU_WS_SIZE));
  return rc;
}

extern "C" int kern_cuda_create(int device, kern_backend_t **out) {
  int n = kern_cuda_device_count();
  if (device < 0 || device >= n)
    return qe_errf(QE_EINVAL, "cuda: device %d does not exist (%d visible)", device, n);
  kcu_t *c = (kcu_t *)calloc(1, sizeof *c);
  if (!c) return qe_errf(QE_ENOMEM, "cuda: cannot allocate the backend");
  c->base.ops = &kcu_ops;
  c->base.n_threads = 1;
  c->device = device;
  static const char *const gemm[] = {"lt", "gemmex"}, *const mass[] = {"gemm", "ref"};
  static const char *const prefill[] = {"fused", "gemm", "ref"};
  c->gemmex_only = qe_env_choice("QE_CUDA_GEMM", gemm, 2, 0) == 1;
  c->xb_fuse = (int)qe_env_long("QE_CUDA_FUSE_BF16", 0, 1, 1); /* (0: the A/B's base) */
  c->add_fuse = (int)qe_env_long("QE_CUDA_FUSE_ADD", 0, 1, 1); /* (0: add, then rmsnorm) */
  /* (0: the model keeps q, k, v and gate, up as separate matmuls) */
  c->base.fuse_proj = (int)qe_env_long("QE_CUDA_FUSE_PROJ", 0, 1, 1);
  /* tests: a small budget forces many chunks */
  c->attn_s_budget = (size_t)qe_env_long("QE_CUDA_PREFILL_MB", 1, 1 << 20, 1024) << 20;
  const int pf = qe_env_choice("QE_CUDA_PREFILL", prefill, 3, 0);
  c->attn_ref_only = pf == 2; /* every sequence to the reference kernel */
  c->attn_no_flash = pf == 1; /* the GEMM path, not the fused kernel */
  /* ref: long prompts' mass queries by the reference kernel */
  c->attn_mass_gemm = qe_env_choice("QE_CUDA_MASS", mass, 2, 0) == 0;
  int rc = kcu_init(c);
  if (rc) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", c->errmsg);
    kcu_destroy(&c->base);
    return qe_errf(QE_EBACKEND, "cuda: device %d: %s", device, msg);
  }
  *out = &c->base;
  return 0;
}

extern "C" void *kern_cuda_stream(kern_backend_t *be) { return KCU(be)->stream; }

extern "C" int kern_cuda_mem_info(kern_backend_t *be, size_t *free_bytes, size_t *total_bytes) {
  kcu_t *c = KCU(be);
  int rc = kcu_enter(c);
  return rc ? rc : KCU_CUDA(c, cudaMemGetInfo(free_bytes, total_bytes));
}

extern "C" int kern_cuda_device(const kern_backend_t *be) { return ((const kcu_t *)be)->device; }

extern "C" int kern_cuda_profile(kern_backend_t *be, int on) {
  kcu_t *c = KCU(be);
  int rc = kcu_enter(c);
  if (!rc) rc = KCU_CUDA(c, cudaStreamSynchronize(c->stream));
  if (!rc) rc = KCU_CUDA(c, on ? cudaProfilerStart() : cudaProfilerStop());
  return rc;
}
