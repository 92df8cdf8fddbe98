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

#include "kern_cuda_internal.h"

#ifndef KCF_WARPS
#define KCF_WARPS 4
#endif
#ifndef KCF_MT
#define KCF_MT 2 /* m-tiles of 16 rows per warp: each K / V fragment read from shared serves both */
#endif
#define KCF_ROWS  (KCF_WARPS * 16 * KCF_MT)
#ifndef KCF_KT
#define KCF_KT 64 /* keys per tile */
#endif
#define KCF_PAD   8             /* fp16 padding per shared row (bank spread for ldmatrix) */
#define KCF_LOG2E 1.4426950408889634f
#define KCF_MAXB  32 /* sequences per launch (the batch travels as a kernel parameter) */

/* One sequence of a launch: its fp32 Q / K / V and output, its fp16 K / V copies, and the index
 * of its first query tile among the launch's (blockIdx.x). */
typedef struct {
  const float *q, *k, *v;
  float *out;
  uint16_t *kh, *vh;
  int n_q, n_kv, q_pos0, tile0;
} kcf_seq_t;

typedef struct {
  kcf_seq_t s[KCF_MAXB];
  int n;
} kcf_batch_t;

int kcu_flash_takes(const kern_attn_seq_t *s, const kern_attn_shape_t *sh) {
  const int g = sh->n_head / sh->n_kv_head;
  return kcu_attn_gemm_takes(s) && (sh->head_dim == 64 || sh->head_dim == 128) && g <= KCF_ROWS;
}

__device__ __forceinline__ uint32_t kcf_pack(float lo, float hi) {
  lo = fminf(fmaxf(lo, -65504.0f), 65504.0f), hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

__device__ __forceinline__ void kcf_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
               "{%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void kcf_ldm4(uint32_t *r, const void *p, bool trans) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  if (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
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

/* Issues the copies of keys [j0, j0 + KCF_KT) of KV head kvh (fp16 rows of `row` halves) into
 * kt / vt [KCF_KT][HD + KCF_PAD]; keys at or past n are zero-filled. */
template <int HD>
__device__ void kcf_issue_kv(uint16_t *kt, uint16_t *vt, const uint16_t *k, const uint16_t *v,
                             int row, int kvh, int j0, int n) {
  constexpr int P = HD / 8; /* 16-byte pieces per key row */
  for (int e = threadIdx.x; e < KCF_KT * P; e += KCF_WARPS * 32) {
    const int j = e / P, c = (e % P) * 8, ok = j0 + j < n;
    const size_t at = (size_t)(ok ? j0 + j : 0) * row + (size_t)kvh * HD + c;
    const uint32_t dk = (uint32_t)__cvta_generic_to_shared(kt + j * (HD + KCF_PAD) + c);
    const uint32_t dv = (uint32_t)__cvta_generic_to_shared(vt + j * (HD + KCF_PAD) + c);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dk), "l"(k + at),
                 "r"(ok ? 16 : 0));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dv), "l"(v + at),
                 "r"(ok ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

/* Q of the block into shared memory: qs [KCF_ROWS][HD + KCF_PAD] fp16, scaled to log2 units;
 * rows past the block's valid rows are zero (row r: query i0 + r / G, head kvh * G + r % G). */
template <int HD>
__device__ void kcf_stage_q(uint16_t *qs, const float *q, int n_head, int g_sz, int i0, int n_q,
                            int kvh, float sc) {
  for (int e = threadIdx.x; e < KCF_ROWS * (HD / 4); e += KCF_WARPS * 32) {
    const int r = e / (HD / 4), d = (e % (HD / 4)) * 4, qi = i0 + r / g_sz;
    const bool ok = r / g_sz < KCF_ROWS / g_sz && qi < n_q;
    const float *p = q + ((size_t)qi * n_head + kvh * g_sz + r % g_sz) * HD + d;
    const float4 x = ok ? *(const float4 *)p : make_float4(0, 0, 0, 0);
    *(uint2 *)(qs + r * (HD + KCF_PAD) + d) =
        make_uint2(kcf_pack(x.x * sc, x.y * sc), kcf_pack(x.z * sc, x.w * sc));
  }
}

/* S (the warp's KCF_MT x 16 rows x KCF_KT keys): s[mt][n] = m-tile mt's n-th block of 8 keys (C
 * layout). Q's A fragments by ldmatrix from qs (rows r0 ..), K's B fragments once for both
 * m-tiles. */
template <int HD>
__device__ void kcf_scores(float (&s)[KCF_MT][KCF_KT / 8][4], const uint16_t *qs, int r0,
                           const uint16_t *kt) {
  const int lane = threadIdx.x & 31, m = lane >> 3;
#pragma unroll
  for (int mt = 0; mt < KCF_MT; mt++)
#pragma unroll
    for (int n = 0; n < KCF_KT / 8; n++)
      s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
  for (int t = 0; t < HD / 16; t++) {
    uint32_t a[KCF_MT][4];
#pragma unroll
    for (int mt = 0; mt < KCF_MT; mt++)
      kcf_ldm4(a[mt],
               qs + (r0 + 16 * mt + (m & 1) * 8 + (lane & 7)) * (HD + KCF_PAD) + 16 * t +
                   (m >> 1) * 8,
               false);
#pragma unroll
    for (int n2 = 0; n2 < KCF_KT / 16; n2++) { /* keys 16 n2 .. + 15: two n-blocks */
      uint32_t b[4];
      kcf_ldm4(b,
               kt + (16 * n2 + (m >> 1) * 8 + (lane & 7)) * (HD + KCF_PAD) + 16 * t + (m & 1) * 8,
               false);
#pragma unroll
      for (int mt = 0; mt < KCF_MT; mt++) {
        kcf_mma(s[mt][2 * n2], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
        kcf_mma(s[mt][2 * n2 + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
      }
    }
  }
}

/* O += P V for the warp: P from s (rounded to fp16 as the A operand), V^T by ldmatrix.trans, each
 * V fragment used by both m-tiles. */
template <int HD>
__device__ void kcf_pv(float (&o)[KCF_MT][HD / 8][4], const float (&s)[KCF_MT][KCF_KT / 8][4],
                       const uint16_t *vt) {
  const int lane = threadIdx.x & 31, m = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < KCF_KT / 16; kk++) {
    uint32_t a[KCF_MT][4];
#pragma unroll
    for (int mt = 0; mt < KCF_MT; mt++) {
      a[mt][0] = kcf_pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      a[mt][1] = kcf_pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      a[mt][2] = kcf_pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      a[mt][3] = kcf_pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int n2 = 0; n2 < HD / 16; n2++) { /* channels 16 n2 .. + 15 */
      uint32_t b[4];
      kcf_ldm4(b,
               vt + (16 * kk + (m & 1) * 8 + (lane & 7)) * (HD + KCF_PAD) + 16 * n2 + (m >> 1) * 8,
               true);
#pragma unroll
      for (int mt = 0; mt < KCF_MT; mt++) {
        kcf_mma(o[mt][2 * n2], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
        kcf_mma(o[mt][2 * n2 + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
      }
    }
  }
}

__device__ __forceinline__ float kcf_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* Online softmax of one m-tile over the tile: masks keys past each row's query (qp[hh]: its
 * position, -1 for an invalid row), moves the running max, rescales o and l, turns s into
 * probabilities. */
template <int HD, bool MASK>
__device__ void kcf_softmax(float (&s)[KCF_KT / 8][4], float (&o)[HD / 8][4], float (&mx)[2],
                            float (&l)[2], const int (&qp)[2], int j0) {
  const int c = threadIdx.x & 3;
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    float m = mx[hh];
#pragma unroll
    for (int n = 0; n < KCF_KT / 8; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int j = j0 + 8 * n + 2 * c + e;
        float &x = s[n][2 * hh + e];
        if (MASK) x = j <= qp[hh] ? x : -INFINITY;
        m = fmaxf(m, x);
      }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float alpha = m == -INFINITY ? 1.0f : kcf_ex2(mx[hh] - m), base = m == -INFINITY ? 0 : m;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < KCF_KT / 8; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        float &x = s[n][2 * hh + e];
        x = kcf_ex2(x - base), sum += x;
      }
    l[hh] = l[hh] * alpha + sum, mx[hh] = m;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][2 * hh] *= alpha, o[n][2 * hh + 1] *= alpha;
  }
}

/* Dynamic shared memory of the kernel: Q, then two stages of K and V tiles. */
template <int HD> constexpr int kcf_smem() { return (KCF_ROWS + 4 * KCF_KT) * (HD + KCF_PAD) * 2; }

/* The position of row r's query, -1 for a row past the block's valid rows (row r: query i0 + r /
 * G of the sequence). */
__device__ __forceinline__ int kcf_qpos(int r, int G, int i0, const kcf_seq_t &s) {
  const int q = r / G;
  return q < KCF_ROWS / G && i0 + q < s.n_q ? s.q_pos0 + i0 + q : -1;
}

template <int HD>
__global__ __launch_bounds__(KCF_WARPS * 32) void kcf_flash_k(const __grid_constant__ kcf_batch_t b,
                                                              int n_head, int n_kv_head,
                                                              float qsc) {
  extern __shared__ __align__(16) uint16_t kcf_sm[];
  constexpr int T = KCF_KT * (HD + KCF_PAD); /* halves of one K or V tile */
  uint16_t *qs = kcf_sm, *kv = kcf_sm + KCF_ROWS * (HD + KCF_PAD);
  int si = 0; /* the block's sequence */
  while (si + 1 < b.n && b.s[si + 1].tile0 <= (int)blockIdx.x) si++;
  const kcf_seq_t &s = b.s[si];
  const uint16_t *kh = s.kh, *vh = s.vh;
  const int G = n_head / n_kv_head, qpb = KCF_ROWS / G, kvh = blockIdx.y;
  /* a sequence's last query tiles (the most keys) first: the causal work's tail then is the
   * short tiles (and the launch's sequences come longest first) */
  const int n_tiles = (s.n_q + qpb - 1) / qpb;
  const int i0 = (n_tiles - 1 - ((int)blockIdx.x - s.tile0)) * qpb, warp = threadIdx.x >> 5,
            lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3, r0 = warp * 16 * KCF_MT;
  kcf_stage_q<HD>(qs, s.q, n_head, G, i0, s.n_q, kvh, qsc);
  float o[KCF_MT][HD / 8][4], mx[KCF_MT][2], l[KCF_MT][2];
#pragma unroll
  for (int mt = 0; mt < KCF_MT; mt++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      mx[mt][hh] = -INFINITY, l[mt][hh] = 0.0f;
#pragma unroll
      for (int n = 0; n < HD / 8; n++) o[mt][n][2 * hh] = o[mt][n][2 * hh + 1] = 0.0f;
    }
  /* the warp's first and last valid query positions (rows r0 .. r0 + 16 KCF_MT - 1; none valid:
   * hi -1, so every tile is skipped) */
  const int q_lo = kcf_qpos(r0, G, i0, s);
  int q_hi = kcf_qpos(r0 + 16 * KCF_MT - 1, G, i0, s);
  if (q_lo >= 0 && q_hi < 0) /* the last valid row's query */
    q_hi = s.q_pos0 + (s.n_q - 1 < i0 + qpb - 1 ? s.n_q - 1 : i0 + qpb - 1);
  const int last_q = (i0 + qpb < s.n_q ? i0 + qpb : s.n_q) - 1;
  const int n_keys = s.q_pos0 + last_q + 1 < s.n_kv ? s.q_pos0 + last_q + 1 : s.n_kv;
  const int row = n_kv_head * HD;
  kcf_issue_kv<HD>(kv, kv + T, kh, vh, row, kvh, 0, n_keys);
  for (int j0 = 0, st = 0; j0 < n_keys; j0 += KCF_KT, st ^= 1) {
    uint16_t *kt = kv + 2 * st * T, *vt = kt + T;
    if (j0 + KCF_KT < n_keys) /* the next tile into the other stage (consumed at the last sync) */
      kcf_issue_kv<HD>(kv + 2 * (st ^ 1) * T, kv + 2 * (st ^ 1) * T + T, kh, vh, row, kvh,
                       j0 + KCF_KT, n_keys);
    else
      asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads(); /* (the first time: Q's stores too) */
    if (q_hi >= j0) { /* some row of the warp sees a key of the tile */
      float sc[KCF_MT][KCF_KT / 8][4];
      kcf_scores<HD>(sc, qs, r0, kt);
      /* keys past a row's query only in the tiles at the diagonal (qp -1: an invalid row) */
      if (q_lo < j0 + KCF_KT - 1) {
#pragma unroll
        for (int mt = 0; mt < KCF_MT; mt++) {
          const int qp[2] = {kcf_qpos(r0 + 16 * mt + g, G, i0, s),
                             kcf_qpos(r0 + 16 * mt + g + 8, G, i0, s)};
          kcf_softmax<HD, true>(sc[mt], o[mt], mx[mt], l[mt], qp, j0);
        }
      } else {
        const int qp[2] = {0, 0}; /* (unused) */
#pragma unroll
        for (int mt = 0; mt < KCF_MT; mt++)
          kcf_softmax<HD, false>(sc[mt], o[mt], mx[mt], l[mt], qp, j0);
      }
      kcf_pv<HD>(o, sc, vt);
    }
    __syncthreads(); /* this stage is free for the tile after next */
  }
#pragma unroll
  for (int mt = 0; mt < KCF_MT; mt++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float lt = l[mt][hh];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const int r = r0 + 16 * mt + g + 8 * hh, qi = i0 + r / G, h = kvh * G + r % G;
      if (kcf_qpos(r, G, i0, s) < 0) continue;
      float *out = s.out + ((size_t)qi * n_head + h) * HD;
      const float inv = 1.0f / lt;
#pragma unroll
      for (int n = 0; n < HD / 8; n++)
        *(float2 *)(out + 8 * n + 2 * c) =
            make_float2(o[mt][n][2 * hh] * inv, o[mt][n][2 * hh + 1] * inv);
    }
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
