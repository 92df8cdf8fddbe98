/* kern_cuda_prefill: the GEMM path of prefill attention (see kern_cuda_internal.h). For each
 * chunk of cq queries [i0, i0 + cq) of one sequence, over the n keys they can see
 * (n = min(n_kv, q_pos0 + i0 + cq)):
 *   S[h][i][j] = scale * q_i^h . k_j^{h/g}    cuBLAS, one strided-batched call per group member
 *   P = causal softmax of S's rows in place   kcu_causal_softmax_k (keys past the query: 0)
 *   key_mass[j] += (1/H) sum_h sum_{i >= mass_q0} P[h][i][j]   kcu_gemm_mass_k (one writer per j)
 *   out_i^h = sum_j P[h][i][j] v_j^{h/g}      cuBLAS, as the first
 * The GEMMs take fp32 inputs on TF32 tensor cores with fp32 accumulation; the chunk's scores live
 * in one device buffer of at most attn_s_budget bytes. */
#include <math.h>

#include "kern_cuda_internal.h"

#define KCU_SM_THREADS 256

int kcu_attn_gemm_takes(const kern_attn_seq_t *s) {
  return s->n_q >= KCU_GEMM_MIN_Q && !s->k_pos && s->n_kv >= s->q_pos0 + s->n_q;
}

/* Block-wide reduction of v (max when is_max, else sum) over KCU_SM_THREADS threads. */
__device__ float kcu_block_reduce(float v, int is_max, float *sh) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads(); /* sh may still be read by the previous reduction */
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = is_max ? -INFINITY : 0.0f;
  for (int w = 0; w < KCU_SM_THREADS / 32; w++) r = is_max ? fmaxf(r, sh[w]) : r + sh[w];
  return r;
}

/* Row (h, i) = blockIdx.x of a chunk of cq rows per head: softmax over the keys j <= the query's
 * position (pos0 + i), zeros after it, in place over the row's n entries. */
__global__ __launch_bounds__(KCU_SM_THREADS) void kcu_causal_softmax_k(float *s, int cq, int n,
                                                                       int pos0) {
  __shared__ float sh[KCU_SM_THREADS / 32];
  float *row = s + (size_t)blockIdx.x * n;
  int i = (int)(blockIdx.x % (unsigned)cq), last = pos0 + i < n - 1 ? pos0 + i : n - 1;
  float m = -INFINITY, l = 0.0f;
  for (int j = threadIdx.x; j <= last; j += KCU_SM_THREADS) m = fmaxf(m, row[j]);
  m = kcu_block_reduce(m, 1, sh);
  for (int j = threadIdx.x; j <= last; j += KCU_SM_THREADS) l += expf(row[j] - m);
  l = kcu_block_reduce(l, 0, sh);
  float inv = 1.0f / l;
  for (int j = threadIdx.x; j < n; j += KCU_SM_THREADS)
    row[j] = j <= last ? expf(row[j] - m) * inv : 0.0f;
}

/* key_mass[j] += (1/n_head) sum over heads and rows i >= r0 of P[h][i][j]. */
__global__ void kcu_gemm_mass_k(const float *p, float *mass, int n_head, int cq, int n, int r0) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float acc = 0.0f;
  for (int h = 0; h < n_head; h++)
    for (int i = r0; i < cq; i++) acc += p[((size_t)h * cq + i) * n + j];
  mass[j] += acc / (float)n_head;
}

/* One strided-batched TF32 GEMM (column-major, as cuBLAS sees it) over the n_kv_head KV heads. */
static int kcu_gemm_heads(kcu_t *c, cublasOperation_t ta, int m, int n, int k, float alpha,
                          const float *a, int lda, long long sa, const float *b, int ldb,
                          long long sb, float *d, int ldd, long long sd, int batch) {
  const float beta = 0.0f;
  return KCU_BLAS(c, cublasGemmStridedBatchedEx(c->blas, ta, CUBLAS_OP_N, m, n, k, &alpha, a,
                                                CUDA_R_32F, lda, sa, b, CUDA_R_32F, ldb, sb, &beta,
                                                d, CUDA_R_32F, ldd, sd, batch,
                                                CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
}

/* Queries [i0, i0 + cq) of s. */
static int kcu_gemm_chunk(kcu_t *c, const kern_attn_seq_t *s, const kern_attn_shape_t *sh, int i0,
                          int cq) {
  const int H = sh->n_head, KH = sh->n_kv_head, d = sh->head_dim, g = H / KH;
  const int pos0 = s->q_pos0 + i0, n = s->n_kv < pos0 + cq ? s->n_kv : pos0 + cq;
  const float *q = s->q + (size_t)i0 * H * d;
  const long long sc = (long long)cq * n; /* one head's scores */
  int rc = 0;
  for (int gi = 0; !rc && gi < g; gi++) /* S^T (n x cq) = K (n x d) Q^T (d x cq), per head */
    rc = kcu_gemm_heads(c, CUBLAS_OP_T, n, cq, d, sh->scale, s->k, KH * d, d, q + gi * d, H * d,
                        (long long)g * d, c->attn_s + gi * sc, n, g * sc, KH);
  if (!rc)
    rc = KCU_LAUNCH(c, kcu_causal_softmax_k, (unsigned)(H * cq), KCU_SM_THREADS, 0, c->attn_s, cq,
                    n, pos0);
  int r0 = s->mass_q0 - i0 > 0 ? s->mass_q0 - i0 : 0;
  if (!rc && s->key_mass && r0 < cq)
    rc = KCU_LAUNCH(c, kcu_gemm_mass_k, (unsigned)((n + 255) / 256), 256, 0, c->attn_s, s->key_mass,
                    H, cq, n, r0);
  float *out = s->out + (size_t)i0 * H * d;
  for (int gi = 0; !rc && gi < g; gi++) /* O^T (d x cq) = V^T (d x n) P^T (n x cq), per head */
    rc = kcu_gemm_heads(c, CUBLAS_OP_N, d, cq, n, 1.0f, s->v, KH * d, d, c->attn_s + gi * sc, n,
                        g * sc, out + gi * d, H * d, (long long)g * d, KH);
  return rc;
}

int kcu_attn_gemm(kcu_t *c, const kern_attn_seq_t *s, const kern_attn_shape_t *sh) {
  size_t row = sizeof(float) * (size_t)sh->n_head * (size_t)s->n_kv; /* one query, all heads */
  long cq = (long)(c->attn_s_budget / row) / 16 * 16;
  if (cq < 16) cq = 16;
  if (cq > s->n_q) cq = s->n_q;
  int rc = kcu_grow(c, (void **)&c->attn_s, &c->attn_s_cap, row * (size_t)cq);
  for (int i0 = 0; !rc && i0 < s->n_q; i0 += (int)cq)
    rc = kcu_gemm_chunk(c, s, sh, i0, s->n_q - i0 < cq ? s->n_q - i0 : (int)cq);
  return rc;
}
