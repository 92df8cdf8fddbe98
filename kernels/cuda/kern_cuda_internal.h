/* kern_cuda_internal: the CUDA backend's object and the helpers shared by kern_cuda.cu (memory,
 * errors, GEMM, the ops table) and kern_cuda_ops.cu (the kernels of the other ops). CUDA C++:
 * included only by .cu files of this backend. */
#ifndef QE_KERN_CUDA_INTERNAL_H
#define QE_KERN_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "kern_cuda.h"
#include "qe_status.h"
}

/* A cuBLASLt plan for one GEMM shape (descriptors and the heuristic's algorithm). */
typedef struct {
  int m, n, k, align_c; /* key */
  int ok;               /* an algorithm was found; else GemmEx */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
} kcu_plan_t;

#define KCU_PLANS   64
#define KCU_HD_MAX  256 /* largest head_dim of the attention kernels */
#define KCU_WS_SIZE ((size_t)32 << 20)
/* Largest device fp32 staging buffer of weight_upload. */
#define KCU_STAGE_BYTES ((size_t)64 << 20)

typedef struct {
  kern_backend_t base;
  int device;
  cudaStream_t stream;
  cublasLtHandle_t lt;
  cublasHandle_t blas;
  void *ws; /* cuBLASLt workspace [KCU_WS_SIZE] */
  int gemmex_only;
  int err;                      /* sticky: the first failure (QE_EBACKEND), 0 if none */
  char errmsg[256];             /* its detail */
  void *xb;                     /* bf16 activations of the current GEMM */
  const float *xb_src;          /* the fp32 x that xb holds (NULL: none) ... */
  size_t xb_n;                  /* ... its elements ... */
  unsigned long xb_seq, op_seq; /* ... as of op number xb_seq; ops counted by kcu_enter */
  size_t xb_cap;                /* bytes */
  int xb_fuse;   /* RMSNorm and SwiGLU also write xb for the matmul after them (kcu_xb_out) */
  int add_fuse;  /* kcu_add_rmsnorm in one kernel where the vector RMSNorm serves */
  void *wb;      /* bf16 of a plain fp32 weight for the current GEMM (tests) */
  size_t wb_cap; /* bytes */
  kcu_plan_t plans[KCU_PLANS];
  int n_plans, next_plan;
  kern_rope_t rope_key; /* parameters of the device rope table */
  int rope_valid;
  float *rope_tab;  /* device [n_rot/2][2]: frequency, YaRN mix */
  float *rope_host; /* host staging of the same */
  float rope_mscale;
  void *attn_desc; /* device kcu_attn_desc_t array */
  size_t attn_desc_cap;
  void *attn_host; /* host staging of the same */
  size_t attn_host_cap;
  float *attn_stats; /* device [sum n_q * n_head][2] softmax max and sum */
  void *amax;        /* device int32 [rows] of argmax */
  size_t amax_cap;
  size_t attn_stats_cap;
  /* the GEMM path of prefill attention (kern_cuda_prefill.cu) */
  float *attn_s;        /* device scores/probabilities of one chunk [n_head][cq][n] */
  size_t attn_s_cap;    /* bytes */
  size_t attn_s_budget; /* most bytes a chunk's scores may take (QE_CUDA_PREFILL_MB, 1 GiB) */
  int attn_ref_only;    /* QE_CUDA_PREFILL=ref: no GEMM path */
  int attn_no_flash;    /* QE_CUDA_PREFILL=gemm: the GEMM path, not the fused kernel */
  int attn_mass_gemm;   /* a fused sequence's mass queries over KCU_TAIL_GEMM_KV keys by the GEMM
                         * path (default; QE_CUDA_MASS=ref: by the reference kernel) */
  void *flash_kv;       /* device fp16 copies of a batch's K and V (fused kernel) */
  size_t flash_kv_cap;  /* bytes */
  kern_attn_seq_t *flash_seqs; /* host: the sequences (heads) of one call for the fused kernel */
  size_t flash_seqs_cap;       /* bytes */
  kern_attn_seq_t *attn_rest;  /* host: the sequences left to the reference kernel */
  size_t attn_rest_cap;        /* bytes */
  /* graphs (kern_cuda_graph.cu) */
  int capturing;       /* between graph_begin and graph_end */
  int capture_bad;     /* an op could not be recorded (scratch had to move) */
  unsigned long epoch; /* bumped whenever device scratch is reallocated (kcu_grow, rope table) */
} kcu_t;

#define KCU(be) ((kcu_t *)(be))

/* Records the first failure (sticky) and returns qe_errf(QE_EBACKEND, "cuda: ..."). */
int kcu_fail(kcu_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 0 if e is cudaSuccess, else kcu_fail with the call's text, file and line. */
int kcu_cuda_at(kcu_t *c, cudaError_t e, const char *what, const char *file, int line);
/* 0 if the backend has no sticky error and its device is selected; else QE_EBACKEND. */
int kcu_enter(kcu_t *c);
/* While capturing, scratch cannot move: marks the capture bad and returns QE_EUNSUPPORTED
 * (not sticky); else 0. */
int kcu_capture_refuse(kcu_t *c, const char *what);
/* Grows device buffer *p to at least `need` bytes (contents lost; bumps c->epoch). 0 or
 * QE_EBACKEND (QE_EUNSUPPORTED while capturing: kcu_capture_refuse). */
int kcu_grow(kcu_t *c, void **p, size_t *cap, size_t need);
/* Grows host buffer *p to at least `need` bytes (contents lost). 0 or QE_EBACKEND. */
int kcu_grow_host(kcu_t *c, void **p, size_t *cap, size_t need);

#define KCU_CUDA(c, call) kcu_cuda_at((c), (call), #call, __FILE__, __LINE__)
/* 0 if s is CUBLAS_STATUS_SUCCESS, else kcu_fail with the call's text, file and line. */
int kcu_blas_at(kcu_t *c, cublasStatus_t s, const char *what, const char *file, int line);
#define KCU_BLAS(c, call) kcu_blas_at((c), (call), #call, __FILE__, __LINE__)
/* Launches kern on the backend's stream and checks the launch (an int expression). */
#define KCU_LAUNCH(c, kern, grid, block, smem, ...)                                                \
  (kern<<<(grid), (block), (smem), (c)->stream>>>(__VA_ARGS__),                                    \
   kcu_cuda_at((c), cudaGetLastError(), #kern, __FILE__, __LINE__))

/* Blocks for a grid-stride loop over n elements with 256 threads. */
static inline unsigned kcu_blocks(size_t n) {
  size_t b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 16384 ? 16384 : b);
}

/* Launchers of kern_cuda_ops.cu used by the GEMM path: dst[i] = bf16(src[i]); y[i][j] +=
 * bias[j] over [m][n]. 0 or QE_EBACKEND. */
int kcu_to_bf16(kcu_t *c, void *dst, const float *src, size_t n);
int kcu_add_bias(kcu_t *c, float *y, const float *bias, int m, int n);

/* Graph ops (kern_cuda_graph.cu; signatures as in kern.h). */
int kcu_graph_begin(kern_backend_t *be);
int kcu_graph_end(kern_backend_t *be, kern_graph_t **out);
int kcu_graph_launch(kern_backend_t *be, kern_graph_t *g);
void kcu_graph_free(kern_backend_t *be, kern_graph_t *g);
unsigned long kcu_scratch_epoch(kern_backend_t *be);
void *kcu_host_alloc(kern_backend_t *be, size_t bytes);
void kcu_host_free(kern_backend_t *be, void *p);
int kcu_upload_async(kern_backend_t *be, void *dst, const void *src, size_t bytes);

/* The table's ops implemented in kern_cuda_ops.cu (signatures as in kern.h). */
void kcu_rmsnorm(kern_backend_t *be, float *y, const float *x, const float *g, int m, int n,
                 float eps);
void kcu_rope(kern_backend_t *be, float *x, const int32_t *pos, int m, int n_heads, int head_dim,
              const kern_rope_t *r);
void kcu_swiglu(kern_backend_t *be, float *y, const float *gate, const float *up, int m, int n);
void kcu_swiglu_cat(kern_backend_t *be, float *y, const float *gu, int m, int n);
void kcu_qkv_rope(kern_backend_t *be, float *q, float *k, float *v, const float *qkv,
                  const int32_t *pos, int m, int n_q, int n_kv, int head_dim, const kern_rope_t *r);
void kcu_add(kern_backend_t *be, float *y, const float *x, size_t n);
void kcu_add_rmsnorm(kern_backend_t *be, float *x, const float *d, float *y, const float *g, int m,
                     int n, float eps);
void kcu_embed(kern_backend_t *be, float *y, const float *table, const int32_t *ids, int m, int n);
void kcu_softmax(kern_backend_t *be, float *x, int m, int n);
int kcu_argmax(kern_backend_t *be, const float *x, int m, int n, int32_t *ids);
int kcu_argmax_dev(kern_backend_t *be, const float *x, int m, int n, int32_t *ids);
void kcu_attention(kern_backend_t *be, const kern_attn_seq_t *seqs, int n_seqs,
                   const kern_attn_shape_t *shape);

/* Prefill attention through tensor-core GEMMs (kern_cuda_prefill.cu), for sequences with at least
 * KCU_GEMM_MIN_Q queries whose keys sit at positions 0..n_kv-1 (k_pos NULL): scores = scale Q K^T
 * by cuBLAS (TF32 tensor cores, fp32 accumulation) for chunks of queries, a causal softmax kernel,
 * out = P V by cuBLAS, key masses summed from P. kcu_attn_gemm_takes says whether a sequence goes
 * this way; kcu_attn_gemm runs one. 0 or QE_EBACKEND. */
#define KCU_GEMM_MIN_Q 64
int kcu_attn_gemm_takes(const kern_attn_seq_t *s);
int kcu_attn_gemm(kcu_t *c, const kern_attn_seq_t *s, const kern_attn_shape_t *sh);

/* Fused causal prefill attention on tensor cores (kern_cuda_flash.cu): the sequences the GEMM
 * path takes, at head_dim 64 or 128 and at most KCF_ROWS (128) query heads per KV head, without
 * key masses; Q, K, V rounded to fp16, fp32 accumulation, online softmax, nothing
 * materialized. With key masses the queries before mass_q0 go this way and the (at most
 * KCU_FLASH_MASS_Q) others to the GEMM path (over KCU_TAIL_GEMM_KV keys or more) or the fp32
 * reference kernel, which sum the masses (kcu_attention). kcu_flash runs n such sequences
 * (key_mass ignored; s is reordered, longest first), up to 32 per launch. 0 or QE_EBACKEND. */
#define KCU_FLASH_MASS_Q 256
/* With QE_CUDA_MASS=gemm, over this many keys the mass queries take the GEMM path (TF32, its own
 * mass kernel) whatever their count: the reference kernel reads K and V once per (query, head),
 * ~11 ms a layer for QEvict's 32 observation queries over 32K keys on an H200. */
#define KCU_TAIL_GEMM_KV 4096
int kcu_flash_takes(const kern_attn_seq_t *s, const kern_attn_shape_t *sh);
int kcu_flash(kcu_t *c, kern_attn_seq_t *s, int n, const kern_attn_shape_t *sh); /* s: sorted */

#endif
