/* kern_cuda_flash: fused causal prefill attention on tensor cores (see kern_cuda_internal.h).
 * One block of KCF_WARPS warps per (tile of queries, KV head, sequence): its KCF_ROWS rows are
 * (query, head) pairs of the KV head's group, query-major (row r: query i0 + r / G, head
 * kvh * G + r % G), so every K/V tile it streams serves the whole group. Per key tile of KCF_KT
 * keys: K and V are read as fp32, rounded to fp16 into shared memory, then each warp (16 rows)
 * computes S = Q K^T with mma.m16n8k16 (fp16 in, fp32 accumulation), its online softmax (base 2,
 * Q pre-scaled by scale * log2 e), and O += P V with P in fp16; nothing is materialized. Keys past
 * a row's query position are masked; key tiles past the block's last query are not read.
 * Numerics: fp16 operands have TF32's 10-bit mantissa (the GEMM path's), with fp32 range lost
 * above 65504 (inputs are clamped; post-RoPE activations are far below it). */
#include <math.h>

#include "kern_cuda_internal.h"

#define KCF_WARPS 4
#define KCF_ROWS  (KCF_WARPS * 16)
#define KCF_KT    64            /* keys per tile */
#define KCF_PAD   8             /* fp16 padding per shared row (bank spread for ldmatrix) */
#define KCF_LOG2E 1.4426950408889634f

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

/* Keys [j0, j0 + KCF_KT) of KV head kvh (fp32 rows of stride `row` floats) into kt / vt as fp16
 * [KCF_KT][HD + KCF_PAD]; keys at or past n are zero. */
template <int HD>
__device__ void kcf_load_kv(uint16_t *kt, uint16_t *vt, const float *k, const float *v, int row,
                            int kvh, int j0, int n) {
  constexpr int Q4 = HD / 4; /* float4 per key row */
  for (int e = threadIdx.x; e < KCF_KT * Q4; e += KCF_WARPS * 32) {
    const int j = e / Q4, c = (e % Q4) * 4;
    float4 a = make_float4(0, 0, 0, 0), b = a;
    if (j0 + j < n) {
      const size_t at = (size_t)(j0 + j) * row + (size_t)kvh * HD + c;
      a = *(const float4 *)(k + at), b = *(const float4 *)(v + at);
    }
    uint32_t *kd = (uint32_t *)(kt + j * (HD + KCF_PAD) + c);
    uint32_t *vd = (uint32_t *)(vt + j * (HD + KCF_PAD) + c);
    kd[0] = kcf_pack(a.x, a.y), kd[1] = kcf_pack(a.z, a.w);
    vd[0] = kcf_pack(b.x, b.y), vd[1] = kcf_pack(b.z, b.w);
  }
}

/* The warp's Q fragments (rows r0 + g, r0 + g + 8; channels of k-step t), scaled to log2 units;
 * rows past the block's valid rows are zero. qrow(r) gives a row's query index and head. */
template <int HD>
__device__ void kcf_load_q(uint32_t (&qa)[HD / 16][4], const float *q, int n_head, int g_sz,
                           int i0, int n_q, int kvh, int r0, float qs) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int r = r0 + g + 8 * hh, qi = i0 + r / g_sz, h = kvh * g_sz + r % g_sz;
    const bool ok = r / g_sz < KCF_ROWS / g_sz && qi < n_q;
    const float *p = q + ((size_t)qi * n_head + h) * HD;
#pragma unroll
    for (int t = 0; t < HD / 16; t++) {
      float2 x = ok ? *(const float2 *)(p + 16 * t + 2 * c) : make_float2(0, 0);
      float2 y = ok ? *(const float2 *)(p + 16 * t + 8 + 2 * c) : make_float2(0, 0);
      qa[t][hh] = kcf_pack(x.x * qs, x.y * qs), qa[t][2 + hh] = kcf_pack(y.x * qs, y.y * qs);
    }
  }
}

/* S (16 rows x KCF_KT keys) of the warp: s[n][..] = the n-th block of 8 keys (C layout). */
template <int HD>
__device__ void kcf_scores(float (&s)[KCF_KT / 8][4], const uint32_t (&qa)[HD / 16][4],
                           const uint16_t *kt) {
  const int lane = threadIdx.x & 31, m = lane >> 3;
#pragma unroll
  for (int n = 0; n < KCF_KT / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int t = 0; t < HD / 16; t++) {
#pragma unroll
    for (int n2 = 0; n2 < KCF_KT / 16; n2++) { /* keys 16 n2 .. + 15: two n-blocks */
      uint32_t b[4];
      kcf_ldm4(b, kt + (16 * n2 + (m >> 1) * 8 + (lane & 7)) * (HD + KCF_PAD) + 16 * t + (m & 1) * 8,
               false);
      kcf_mma(s[2 * n2], qa[t][0], qa[t][1], qa[t][2], qa[t][3], b[0], b[1]);
      kcf_mma(s[2 * n2 + 1], qa[t][0], qa[t][1], qa[t][2], qa[t][3], b[2], b[3]);
    }
  }
}

/* O += P V for the warp: P from s (rounded to fp16 as the A operand), V^T by ldmatrix.trans. */
template <int HD>
__device__ void kcf_pv(float (&o)[HD / 8][4], const float (&s)[KCF_KT / 8][4], const uint16_t *vt) {
  const int lane = threadIdx.x & 31, m = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < KCF_KT / 16; kk++) {
    const uint32_t a0 = kcf_pack(s[2 * kk][0], s[2 * kk][1]);
    const uint32_t a1 = kcf_pack(s[2 * kk][2], s[2 * kk][3]);
    const uint32_t a2 = kcf_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    const uint32_t a3 = kcf_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int n2 = 0; n2 < HD / 16; n2++) { /* channels 16 n2 .. + 15 */
      uint32_t b[4];
      kcf_ldm4(b, vt + (16 * kk + (m & 1) * 8 + (lane & 7)) * (HD + KCF_PAD) + 16 * n2 + (m >> 1) * 8,
               true);
      kcf_mma(o[2 * n2], a0, a1, a2, a3, b[0], b[1]);
      kcf_mma(o[2 * n2 + 1], a0, a1, a2, a3, b[2], b[3]);
    }
  }
}

/* Online softmax over the tile: masks keys past each row's query (qp[hh]: its position, -1 for an
 * invalid row), moves the running max, rescales o and l, turns s into probabilities. */
template <int HD>
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
        x = j <= qp[hh] ? x : -INFINITY;
        m = fmaxf(m, x);
      }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float alpha = m == -INFINITY ? 1.0f : exp2f(mx[hh] - m), base = m == -INFINITY ? 0 : m;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < KCF_KT / 8; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        float &x = s[n][2 * hh + e];
        x = exp2f(x - base), sum += x;
      }
    l[hh] = l[hh] * alpha + sum, mx[hh] = m;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][2 * hh] *= alpha, o[n][2 * hh + 1] *= alpha;
  }
}

template <int HD>
__global__ __launch_bounds__(KCF_WARPS * 32) void kcf_flash_k(kern_attn_seq_t s, int n_head,
                                                              int n_kv_head, float qs) {
  __shared__ __align__(16) uint16_t kt[KCF_KT * (HD + KCF_PAD)], vt[KCF_KT * (HD + KCF_PAD)];
  const int G = n_head / n_kv_head, qpb = KCF_ROWS / G, kvh = blockIdx.y;
  const int i0 = blockIdx.x * qpb, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3, r0 = warp * 16;
  uint32_t qa[HD / 16][4];
  kcf_load_q<HD>(qa, s.q, n_head, G, i0, s.n_q, kvh, r0, qs);
  float o[HD / 8][4], mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  int qp[2];
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int r = r0 + g + 8 * hh, qi = i0 + r / G;
    qp[hh] = r / G < qpb && qi < s.n_q ? s.q_pos0 + qi : -1;
  }
#pragma unroll
  for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const int last_q = (i0 + qpb < s.n_q ? i0 + qpb : s.n_q) - 1;
  const int n_keys = s.q_pos0 + last_q + 1 < s.n_kv ? s.q_pos0 + last_q + 1 : s.n_kv;
  const int row = n_kv_head * HD;
  for (int j0 = 0; j0 < n_keys; j0 += KCF_KT) {
    __syncthreads(); /* the previous tile is consumed */
    kcf_load_kv<HD>(kt, vt, s.k, s.v, row, kvh, j0, n_keys);
    __syncthreads();
    if (qp[0] < j0 && qp[1] < j0 && __all_sync(0xffffffffu, qp[0] < j0 && qp[1] < j0)) continue;
    float sc[KCF_KT / 8][4];
    kcf_scores<HD>(sc, qa, kt);
    kcf_softmax<HD>(sc, o, mx, l, qp, j0);
    kcf_pv<HD>(o, sc, vt);
  }
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
    if (qp[hh] < 0) continue;
    const int r = r0 + g + 8 * hh, qi = i0 + r / G, h = kvh * G + r % G;
    float *out = s.out + ((size_t)qi * n_head + h) * HD;
    const float inv = 1.0f / l[hh];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
      *(float2 *)(out + 8 * n + 2 * c) = make_float2(o[n][2 * hh] * inv, o[n][2 * hh + 1] * inv);
  }
}

int kcu_flash(kcu_t *c, const kern_attn_seq_t *s, const kern_attn_shape_t *sh) {
  const int G = sh->n_head / sh->n_kv_head, qpb = KCF_ROWS / G;
  const dim3 grid((unsigned)((s->n_q + qpb - 1) / qpb), (unsigned)sh->n_kv_head);
  const float qs = sh->scale * KCF_LOG2E;
  if (sh->head_dim == 64)
    return KCU_LAUNCH(c, kcf_flash_k<64>, grid, KCF_WARPS * 32, 0, *s, sh->n_head, sh->n_kv_head,
                      qs);
  return KCU_LAUNCH(c, kcf_flash_k<128>, grid, KCF_WARPS * 32, 0, *s, sh->n_head, sh->n_kv_head,
                    qs);
}
