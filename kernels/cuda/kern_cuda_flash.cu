/* kern_cuda_flash: fused causal prefill attention on tensor cores (see kern_cuda_internal.h).
 * K and V are first rounded to fp16 once (kcf_half_k, into c->flash_kv). Then one block of
 * KCF_WARPS warps per (tile of queries, KV head): its KCF_ROWS rows are (query, head) pairs of
 * the KV head's group, query-major (row r: query i0 + r / G, head kvh * G + r % G), so every K/V
 * tile it streams serves the whole group. Key tiles of KCF_KT keys stream into shared memory
 * with cp.async, one tile ahead (two stages); each warp (16 rows)
 * computes S = Q K^T with mma.m16n8k16 (fp16 in, fp32 accumulation), its online softmax (base 2,
 * Q pre-scaled by scale * log2 e), and O += P V with P in fp16; nothing is materialized. Keys past
 * a row's query position are masked; key tiles past the block's last query are not read.
 * Numerics: fp16 operands have TF32's 10-bit mantissa (the GEMM path's), with fp32 range lost
 * above 65504 (inputs are clamped; post-RoPE activations are far below it). */
#include <math.h>

#include "kern_cuda_internal.h"

#define KCF_WARPS 8
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

/* y[i] = x[i] rounded to fp16 (clamped), n a multiple of 4. */
__global__ void kcf_half_k(const float4 *x, uint2 *y, size_t n4) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
       i += (size_t)gridDim.x * blockDim.x) {
    const float4 a = x[i];
    y[i] = make_uint2(kcf_pack(a.x, a.y), kcf_pack(a.z, a.w));
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

/* The warp's Q fragments (rows r0 + g, r0 + g + 8; channels of k-step t), scaled to log2 units;
 * rows past the block's valid rows are zero (row r: query i0 + r / G, head kvh * G + r % G). */
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

/* Dynamic shared memory of the kernel: two stages of K and V tiles. */
template <int HD> constexpr int kcf_smem() { return 4 * KCF_KT * (HD + KCF_PAD) * 2; }

template <int HD>
__global__ __launch_bounds__(KCF_WARPS * 32) void kcf_flash_k(kern_attn_seq_t s, const uint16_t *kh,
                                                              const uint16_t *vh, int n_head,
                                                              int n_kv_head, float qs) {
  extern __shared__ __align__(16) uint16_t kcf_sm[];
  constexpr int T = KCF_KT * (HD + KCF_PAD); /* halves of one tile */
  const int G = n_head / n_kv_head, qpb = KCF_ROWS / G, kvh = blockIdx.y;
  /* the last query tiles (the most keys) first: the causal work's tail then is the short tiles */
  const int i0 = (gridDim.x - 1 - blockIdx.x) * qpb, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
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
  kcf_issue_kv<HD>(kcf_sm, kcf_sm + T, kh, vh, row, kvh, 0, n_keys);
  for (int j0 = 0, st = 0; j0 < n_keys; j0 += KCF_KT, st ^= 1) {
    uint16_t *kt = kcf_sm + 2 * st * T, *vt = kt + T;
    if (j0 + KCF_KT < n_keys) /* the next tile into the other stage (consumed at the last sync) */
      kcf_issue_kv<HD>(kcf_sm + 2 * (st ^ 1) * T, kcf_sm + 2 * (st ^ 1) * T + T, kh, vh, row, kvh,
                       j0 + KCF_KT, n_keys);
    else
      asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    if (!__all_sync(0xffffffffu, qp[0] < j0 && qp[1] < j0)) {
      float sc[KCF_KT / 8][4];
      kcf_scores<HD>(sc, qa, kt);
      /* keys past a row's query only in the tiles at the diagonal (qp -1: an invalid row) */
      const bool mask = !__all_sync(0xffffffffu, qp[0] < 0 || qp[0] >= j0 + KCF_KT - 1) ||
                        !__all_sync(0xffffffffu, qp[1] < 0 || qp[1] >= j0 + KCF_KT - 1);
      if (mask)
        kcf_softmax<HD, true>(sc, o, mx, l, qp, j0);
      else
        kcf_softmax<HD, false>(sc, o, mx, l, qp, j0);
      kcf_pv<HD>(o, sc, vt);
    }
    __syncthreads(); /* this stage is free for the tile after next */
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

template <int HD>
static int kcf_launch(kcu_t *c, const kern_attn_seq_t *s, const kern_attn_shape_t *sh,
                      const uint16_t *kh, const uint16_t *vh) {
  if (KCU_CUDA(c, cudaFuncSetAttribute(kcf_flash_k<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kcf_smem<HD>()))) /* (per device: set at every launch) */
    return QE_EBACKEND;
  const int G = sh->n_head / sh->n_kv_head, qpb = KCF_ROWS / G;
  const dim3 grid((unsigned)((s->n_q + qpb - 1) / qpb), (unsigned)sh->n_kv_head);
  return KCU_LAUNCH(c, kcf_flash_k<HD>, grid, KCF_WARPS * 32, kcf_smem<HD>(), *s, kh, vh,
                    sh->n_head, sh->n_kv_head, sh->scale * KCF_LOG2E);
}

int kcu_flash(kcu_t *c, const kern_attn_seq_t *s, const kern_attn_shape_t *sh) {
  const size_t n = (size_t)s->n_kv * sh->n_kv_head * sh->head_dim; /* floats of K (and of V) */
  int rc = kcu_grow(c, &c->flash_kv, &c->flash_kv_cap, 4 * n);
  if (rc) return rc;
  uint16_t *kh = (uint16_t *)c->flash_kv, *vh = kh + n;
  const unsigned blocks = (unsigned)((n / 4 + 255) / 256 < 4096 ? (n / 4 + 255) / 256 : 4096);
  if ((rc = KCU_LAUNCH(c, kcf_half_k, blocks, 256, 0, (const float4 *)s->k, (uint2 *)kh, n / 4)) ||
      (rc = KCU_LAUNCH(c, kcf_half_k, blocks, 256, 0, (const float4 *)s->v, (uint2 *)vh, n / 4)))
    return rc;
  return sh->head_dim == 64 ? kcf_launch<64>(c, s, sh, kh, vh) : kcf_launch<128>(c, s, sh, kh, vh);
}
