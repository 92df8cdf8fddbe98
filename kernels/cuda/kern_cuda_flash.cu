/* kern_cuda_flash: fused causal prefill attention on tensor cores (see kern_cuda_internal.h).
 * One call's sequences run longest first, up to KCF_MAXB a launch: their K and V are first
 * rounded to fp16 (kcf_half_kv, into c->flash_kv), then one block of KCF_WARPS warps per (tile
 * of queries of a sequence, KV head): its KCF_ROWS rows are (query, head) pairs of the KV head's
 * group, query-major (row r: query i0 + r / G, head kvh * G + r % G), so every K/V tile it
 * streams serves the whole group. Q waits in shared memory (fp16, pre-scaled by scale * log2 e);
 * key tiles of KCF_KT keys stream in with cp.async, one tile ahead (two stages). Each warp owns
 * KCF_MT m-tiles of 16 rows, so every K / V fragment it reads from shared memory feeds KCF_MT
 * mma.m16n8k16 (fp16 in, fp32 accumulation): S = Q K^T, its online softmax (base 2), O += P V
 * with P in fp16; nothing is materialized. Keys past a row's query are masked (only in tiles at
 * the diagonal); key tiles past the block's last query are not read.
 * Numerics: fp16 operands have TF32's 10-bit mantissa (the GEMM path's), with fp32 range lost
 * above 65504 (inputs are clamped; post-RoPE activations are far below it). */
#include <math.h>

#include "kern_cuda_flash_dev.cuh"
#include "kern_cuda_internal.h"

int kcu_flash_takes(const kern_attn_seq_t *s, const kern_attn_shape_t *sh) {
  const int g = sh->n_head / sh->n_kv_head;
  return kcu_attn_gemm_takes(s) && (sh->head_dim == 64 || sh->head_dim == 128) && g <= KCF_ROWS;
}

/* The fp16 copies of K and V (clamped) of sequence blockIdx.y of the batch; row: floats a key. */
__global__ void kcf_half_kv(const __grid_constant__ kcf_batch_t b, int row) {
  const kcf_seq_t &s = b.s[blockIdx.y];
  const size_t n4 = (size_t)s.n_kv * row / 4;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
       i += (size_t)gridDim.x * blockDim.x) {
    const float4 a = ((const float4 *)s.k)[i], v = ((const float4 *)s.v)[i];
    ((uint2 *)s.kh)[i] = make_uint2(kcf_pack(a.x, a.y), kcf_pack(a.z, a.w));
    ((uint2 *)s.vh)[i] = make_uint2(kcf_pack(v.x, v.y), kcf_pack(v.z, v.w));
  }
}

template <int HD>
__global__ __launch_bounds__(KCF_WARPS * 32) void kcf_flash_k(const __grid_constant__ kcf_batch_t b,
                                                              int n_head, int n_kv_head,
                                                              float qsc) {
  extern __shared__ __align__(16) uint16_t kcf_sm[];
  kcf_flash_body<HD>(b, n_head, n_kv_head, qsc, kcf_sm, (int)blockIdx.x, (int)blockIdx.y,
                     (int)threadIdx.x);
}

template <int HD>
static int kcf_launch(kcu_t *c, const kcf_batch_t *b, int n_tiles, const kern_attn_shape_t *sh) {
  if (KCU_CUDA(c, cudaFuncSetAttribute(kcf_flash_k<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kcf_smem<HD>()))) /* (per device: set at every launch) */
    return QE_EBACKEND;
  const dim3 grid((unsigned)n_tiles, (unsigned)sh->n_kv_head);
  return KCU_LAUNCH(c, kcf_flash_k<HD>, grid, KCF_WARPS * 32, kcf_smem<HD>(), *b, sh->n_head,
                    sh->n_kv_head, sh->scale * KCF_LOG2E);
}

static int kcf_longer_first(const void *a, const void *b) {
  const kern_attn_seq_t *x = (const kern_attn_seq_t *)a, *y = (const kern_attn_seq_t *)b;
  const int lx = x->q_pos0 + x->n_q, ly = y->q_pos0 + y->n_q;
  return (lx < ly) - (lx > ly);
}

/* Sequences [i0, i1) of s as one launch's batch over the fp16 buffer kh (K copies, then V's
 * after `half` halves); returns the launch's query tiles. */
static int kcf_batch(const kern_attn_seq_t *s, int i0, int i1, int qpb, int row, uint16_t *kh,
                     size_t half, kcf_batch_t *b) {
  size_t off = 0;
  int tiles = 0;
  b->n = i1 - i0;
  for (int i = i0; i < i1; i++) {
    const kern_attn_seq_t *q = &s[i];
    b->s[i - i0] = (kcf_seq_t){q->q,      q->k,        q->v,        q->out,  kh + off,
                               kh + half + off, q->n_q, q->n_kv, q->q_pos0, tiles};
    off += (size_t)q->n_kv * row, tiles += (q->n_q + qpb - 1) / qpb;
  }
  return tiles;
}

int kcu_flash(kcu_t *c, kern_attn_seq_t *s, int n, const kern_attn_shape_t *sh) {
  const int row = sh->n_kv_head * sh->head_dim, qpb = KCF_ROWS / (sh->n_head / sh->n_kv_head);
  qsort(s, (size_t)n, sizeof *s, kcf_longer_first);
  size_t half = 0; /* halves of K of the largest batch */
  for (int i0 = 0; i0 < n; i0 += KCF_MAXB) {
    size_t h = 0;
    for (int i = i0; i < n && i < i0 + KCF_MAXB; i++) h += (size_t)s[i].n_kv * row;
    half = h > half ? h : half;
  }
  int rc = kcu_grow(c, &c->flash_kv, &c->flash_kv_cap, 4 * half);
  for (int i0 = 0; !rc && i0 < n; i0 += KCF_MAXB) {
    kcf_batch_t b;
    const int i1 = i0 + KCF_MAXB < n ? i0 + KCF_MAXB : n;
    const int tiles = kcf_batch(s, i0, i1, qpb, row, (uint16_t *)c->flash_kv, half, &b);
    unsigned per = 1; /* conversion blocks a sequence: at most ~4096 in all */
    for (int i = 0; i < b.n; i++) {
      const unsigned k = kcu_blocks((size_t)b.s[i].n_kv * row / 4);
      per = k > per ? k : per;
    }
    per = per < 4096u / b.n ? per : 4096u / b.n;
    rc = KCU_LAUNCH(c, kcf_half_kv, dim3(per, (unsigned)b.n), 256, 0, b, row);
    if (!rc)
      rc = sh->head_dim == 64 ? kcf_launch<64>(c, &b, tiles, sh)
                              : kcf_launch<128>(c, &b, tiles, sh);
  }
  return rc;
}
