/* kern_cuda_flash_dev: the fused prefill kernel's block (kern_cuda_flash.cu), as code that
 * compiles for the device and, with KCF_EMU (and KCA_EMU's collectives), for the host, where
 * tests/kernels/flash_emu runs it block by block against an fp64 reference (emu_fiber.h).
 * Device-only instructions (mma.sync, ldmatrix, cp.async, ex2, shuffles, barriers) sit behind
 * the kcf_ wrappers below; everything else is the kernel itself. */
#ifndef QE_KERN_CUDA_FLASH_DEV_CUH
#define QE_KERN_CUDA_FLASH_DEV_CUH
#include <math.h>
#include <stdint.h>
#include <string.h>

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

#ifndef KCF_EMU
#define KCF_FN     __device__ __forceinline__
#define KCF_UNROLL _Pragma("unroll")

KCF_FN uint32_t kcf_pack(float lo, float hi) {
  lo = fminf(fmaxf(lo, -65504.0f), 65504.0f), hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

KCF_FN void kcf_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                    uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
               "{%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* ldmatrix .x4 (.trans): four 8x8 fp16 matrices, row addresses from lanes 8i .. 8i + 7. */
KCF_FN void kcf_ldm4(uint32_t *r, const void *p, bool trans) {
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

/* KCF_L2HINT: the copies' L2 prefetch size, 0 (none: the default), 128 or 256 bytes, as the
 * decode kernels' KCA_L2HINT (256 there since 2026-12-06). Timed at 256 on an H100 (2026-12-06,
 * bench/README.md "The prefill kernel's L2 prefetch"): level, so none stays the default
 * (`VARIANTS="l2=-DKCF_L2HINT=256" bench/device_pack.sh --variants`, bench/gpu_prefill_ab.sh). */
#ifndef KCF_L2HINT
#define KCF_L2HINT 0
#endif
#if KCF_L2HINT == 256
#define KCF_CP16_OP "cp.async.cg.shared.global.L2::256B"
#elif KCF_L2HINT == 128
#define KCF_CP16_OP "cp.async.cg.shared.global.L2::128B"
#else
#define KCF_CP16_OP "cp.async.cg.shared.global"
#endif
/* 16 bytes from global src into shared dst, or zeros when !ok (cp.async, one group a call). */
KCF_FN void kcf_cp16(uint16_t *dst, const uint16_t *src, int ok) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile(KCF_CP16_OP " [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}
KCF_FN void kcf_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
KCF_FN void kcf_wait1(void) { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
KCF_FN float kcf_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
KCF_FN float kcf_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
KCF_FN void kcf_sync(void) { __syncthreads(); }
KCF_FN void kcf_st2(float *p, float a, float b) { *(float2 *)p = make_float2(a, b); }

#else /* KCF_EMU: host forms over the decode kernel's emulation hooks (KCA_EMU; emu_fiber.h) */
#ifndef KCA_EMU
#error "KCF_EMU needs KCA_EMU (the emulator's collectives)"
#endif
#define KCF_FN static inline
#define KCF_UNROLL
#include "kern_cuda_attn_dev.cuh"
#include "qe_half.h"

const void *kca_emu_shfl_ptr(const void *p, int lane); /* the pointer lane `lane` holds */
int kcf_emu_lane(void);                                /* the calling fiber's lane */

KCF_FN uint32_t kcf_pack(float lo, float hi) {
  lo = fminf(fmaxf(lo, -65504.0f), 65504.0f), hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
  return (uint32_t)qe_f32_to_half(lo) | (uint32_t)qe_f32_to_half(hi) << 16;
}
KCF_FN void kcf_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                    uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  kca_emu_mma(d, a, b, 16, 1);
}
/* Lane l gets, of matrix i (rows at lanes 8i ..), row l / 4 halves 2 (l % 4) and + 1; .trans:
 * rows 2 (l % 4) and + 1, half l / 4 of each. */
KCF_FN void kcf_ldm4(uint32_t *r, const void *p, bool trans) {
  const int l = kcf_emu_lane(), g = l >> 2, c = l & 3;
  for (int i = 0; i < 4; i++) {
    const uint16_t *r0 = (const uint16_t *)kca_emu_shfl_ptr(p, 8 * i + (trans ? 2 * c : g));
    const uint16_t *r1 = (const uint16_t *)kca_emu_shfl_ptr(p, 8 * i + (trans ? 2 * c + 1 : g));
    r[i] = trans ? (uint32_t)r0[g] | (uint32_t)r1[g] << 16
                 : (uint32_t)r0[2 * c] | (uint32_t)r0[2 * c + 1] << 16;
  }
}
KCF_FN void kcf_cp16(uint16_t *dst, const uint16_t *src, int ok) { kca_cp16(dst, src, ok); }
KCF_FN void kcf_commit(void) {}
KCF_FN void kcf_wait1(void) {}
KCF_FN float kcf_ex2(float x) { return exp2f(x); }
KCF_FN float kcf_shfl_xor(float v, int m) { return kca_emu_shfl(v, m, 1); }
KCF_FN void kcf_sync(void) { kca_emu_syncthreads(); }
KCF_FN void kcf_st2(float *p, float a, float b) { p[0] = a, p[1] = b; }
#endif

/* Issues the copies of keys [j0, j0 + KCF_KT) of KV head kvh (fp16 rows of `row` halves) into
 * kt / vt [KCF_KT][HD + KCF_PAD]; keys at or past n are zero-filled. */
template <int HD>
KCF_FN void kcf_issue_kv(uint16_t *kt, uint16_t *vt, const uint16_t *k, const uint16_t *v,
                         int row, int kvh, int j0, int n, int tid) {
  constexpr int P = HD / 8; /* 16-byte pieces per key row */
  for (int e = tid; e < KCF_KT * P; e += KCF_WARPS * 32) {
    const int j = e / P, c = (e % P) * 8, ok = j0 + j < n;
    const size_t at = (size_t)(ok ? j0 + j : 0) * row + (size_t)kvh * HD + c;
    kcf_cp16(kt + j * (HD + KCF_PAD) + c, k + at, ok);
    kcf_cp16(vt + j * (HD + KCF_PAD) + c, v + at, ok);
  }
  kcf_commit();
}

/* Q of the block into shared memory: qs [KCF_ROWS][HD + KCF_PAD] fp16, scaled to log2 units;
 * rows past the block's valid rows are zero (row r: query i0 + r / G, head kvh * G + r % G). */
template <int HD>
KCF_FN void kcf_stage_q(uint16_t *qs, const float *q, int n_head, int g_sz, int i0, int n_q,
                        int kvh, float sc, int tid) {
  for (int e = tid; e < KCF_ROWS * (HD / 4); e += KCF_WARPS * 32) {
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
KCF_FN void kcf_scores(float (&s)[KCF_MT][KCF_KT / 8][4], const uint16_t *qs, int r0,
                       const uint16_t *kt, int lane) {
  const int m = lane >> 3;
KCF_UNROLL
  for (int mt = 0; mt < KCF_MT; mt++)
KCF_UNROLL
    for (int n = 0; n < KCF_KT / 8; n++)
      s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
KCF_UNROLL
  for (int t = 0; t < HD / 16; t++) {
    uint32_t a[KCF_MT][4];
KCF_UNROLL
    for (int mt = 0; mt < KCF_MT; mt++)
      kcf_ldm4(a[mt],
               qs + (r0 + 16 * mt + (m & 1) * 8 + (lane & 7)) * (HD + KCF_PAD) + 16 * t +
                   (m >> 1) * 8,
               false);
KCF_UNROLL
    for (int n2 = 0; n2 < KCF_KT / 16; n2++) { /* keys 16 n2 .. + 15: two n-blocks */
      uint32_t b[4];
      kcf_ldm4(b,
               kt + (16 * n2 + (m >> 1) * 8 + (lane & 7)) * (HD + KCF_PAD) + 16 * t + (m & 1) * 8,
               false);
KCF_UNROLL
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
KCF_FN void kcf_pv(float (&o)[KCF_MT][HD / 8][4], const float (&s)[KCF_MT][KCF_KT / 8][4],
                   const uint16_t *vt, int lane) {
  const int m = lane >> 3;
KCF_UNROLL
  for (int kk = 0; kk < KCF_KT / 16; kk++) {
    uint32_t a[KCF_MT][4];
KCF_UNROLL
    for (int mt = 0; mt < KCF_MT; mt++) {
      a[mt][0] = kcf_pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      a[mt][1] = kcf_pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      a[mt][2] = kcf_pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      a[mt][3] = kcf_pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
KCF_UNROLL
    for (int n2 = 0; n2 < HD / 16; n2++) { /* channels 16 n2 .. + 15 */
      uint32_t b[4];
      kcf_ldm4(b,
               vt + (16 * kk + (m & 1) * 8 + (lane & 7)) * (HD + KCF_PAD) + 16 * n2 + (m >> 1) * 8,
               true);
KCF_UNROLL
      for (int mt = 0; mt < KCF_MT; mt++) {
        kcf_mma(o[mt][2 * n2], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
        kcf_mma(o[mt][2 * n2 + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
      }
    }
  }
}

/* Online softmax of one m-tile over the tile: masks keys past each row's query (qp[hh]: its
 * position, -1 for an invalid row), moves the running max, rescales o and l, turns s into
 * probabilities. */
template <int HD, bool MASK>
KCF_FN void kcf_softmax(float (&s)[KCF_KT / 8][4], float (&o)[HD / 8][4], float (&mx)[2],
                        float (&l)[2], const int (&qp)[2], int j0, int c) {
KCF_UNROLL
  for (int hh = 0; hh < 2; hh++) {
    float m = mx[hh];
KCF_UNROLL
    for (int n = 0; n < KCF_KT / 8; n++)
KCF_UNROLL
      for (int e = 0; e < 2; e++) {
        const int j = j0 + 8 * n + 2 * c + e;
        float &x = s[n][2 * hh + e];
        if (MASK) x = j <= qp[hh] ? x : -INFINITY;
        m = fmaxf(m, x);
      }
    m = fmaxf(m, kcf_shfl_xor(m, 1));
    m = fmaxf(m, kcf_shfl_xor(m, 2));
    const float alpha = m == -INFINITY ? 1.0f : kcf_ex2(mx[hh] - m), base = m == -INFINITY ? 0 : m;
    float sum = 0.0f;
KCF_UNROLL
    for (int n = 0; n < KCF_KT / 8; n++)
KCF_UNROLL
      for (int e = 0; e < 2; e++) {
        float &x = s[n][2 * hh + e];
        x = kcf_ex2(x - base), sum += x;
      }
    l[hh] = l[hh] * alpha + sum, mx[hh] = m;
KCF_UNROLL
    for (int n = 0; n < HD / 8; n++) o[n][2 * hh] *= alpha, o[n][2 * hh + 1] *= alpha;
  }
}

/* Dynamic shared memory of the kernel: Q, then two stages of K and V tiles. */
template <int HD> constexpr int kcf_smem() { return (KCF_ROWS + 4 * KCF_KT) * (HD + KCF_PAD) * 2; }

/* The position of row r's query, -1 for a row past the block's valid rows (row r: query i0 + r /
 * G of the sequence). */
KCF_FN int kcf_qpos(int r, int G, int i0, const kcf_seq_t &s) {
  const int q = r / G;
  return q < KCF_ROWS / G && i0 + q < s.n_q ? s.q_pos0 + i0 + q : -1;
}

/* Block (bx, by = the KV head) of a launch over batch b, thread tid; kcf_sm: kcf_smem<HD>()
 * bytes of shared memory. */
template <int HD>
KCF_FN void kcf_flash_body(const kcf_batch_t &b, int n_head, int n_kv_head, float qsc,
                           uint16_t *kcf_sm, int bx, int by, int tid) {
  constexpr int T = KCF_KT * (HD + KCF_PAD); /* halves of one K or V tile */
  uint16_t *qs = kcf_sm, *kv = kcf_sm + KCF_ROWS * (HD + KCF_PAD);
  int si = 0; /* the block's sequence */
  while (si + 1 < b.n && b.s[si + 1].tile0 <= bx) si++;
  const kcf_seq_t &s = b.s[si];
  const uint16_t *kh = s.kh, *vh = s.vh;
  const int G = n_head / n_kv_head, qpb = KCF_ROWS / G, kvh = by;
  /* a sequence's last query tiles (the most keys) first: the causal work's tail then is the
   * short tiles (and the launch's sequences come longest first) */
  const int n_tiles = (s.n_q + qpb - 1) / qpb;
  const int i0 = (n_tiles - 1 - (bx - s.tile0)) * qpb, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3, r0 = warp * 16 * KCF_MT;
  kcf_stage_q<HD>(qs, s.q, n_head, G, i0, s.n_q, kvh, qsc, tid);
  float o[KCF_MT][HD / 8][4], mx[KCF_MT][2], l[KCF_MT][2];
KCF_UNROLL
  for (int mt = 0; mt < KCF_MT; mt++)
KCF_UNROLL
    for (int hh = 0; hh < 2; hh++) {
      mx[mt][hh] = -INFINITY, l[mt][hh] = 0.0f;
KCF_UNROLL
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
  kcf_issue_kv<HD>(kv, kv + T, kh, vh, row, kvh, 0, n_keys, tid);
  for (int j0 = 0, st = 0; j0 < n_keys; j0 += KCF_KT, st ^= 1) {
    uint16_t *kt = kv + 2 * st * T, *vt = kt + T;
    if (j0 + KCF_KT < n_keys) /* the next tile into the other stage (consumed at the last sync) */
      kcf_issue_kv<HD>(kv + 2 * (st ^ 1) * T, kv + 2 * (st ^ 1) * T + T, kh, vh, row, kvh,
                       j0 + KCF_KT, n_keys, tid);
    else
      kcf_commit();
    kcf_wait1();
    kcf_sync(); /* (the first time: Q's stores too) */
    if (q_hi >= j0) { /* some row of the warp sees a key of the tile */
      float sc[KCF_MT][KCF_KT / 8][4];
      kcf_scores<HD>(sc, qs, r0, kt, lane);
      /* keys past a row's query only in the tiles at the diagonal (qp -1: an invalid row) */
      if (q_lo < j0 + KCF_KT - 1) {
KCF_UNROLL
        for (int mt = 0; mt < KCF_MT; mt++) {
          const int qp[2] = {kcf_qpos(r0 + 16 * mt + g, G, i0, s),
                             kcf_qpos(r0 + 16 * mt + g + 8, G, i0, s)};
          kcf_softmax<HD, true>(sc[mt], o[mt], mx[mt], l[mt], qp, j0, c);
        }
      } else {
        const int qp[2] = {0, 0}; /* (unused) */
KCF_UNROLL
        for (int mt = 0; mt < KCF_MT; mt++)
          kcf_softmax<HD, false>(sc[mt], o[mt], mx[mt], l[mt], qp, j0, c);
      }
      kcf_pv<HD>(o, sc, vt, lane);
    }
    kcf_sync(); /* this stage is free for the tile after next */
  }
KCF_UNROLL
  for (int mt = 0; mt < KCF_MT; mt++)
KCF_UNROLL
    for (int hh = 0; hh < 2; hh++) {
      float lt = l[mt][hh];
      lt += kcf_shfl_xor(lt, 1);
      lt += kcf_shfl_xor(lt, 2);
      const int r = r0 + 16 * mt + g + 8 * hh, qi = i0 + r / G, h = kvh * G + r % G;
      if (kcf_qpos(r, G, i0, s) < 0) continue;
      float *out = s.out + ((size_t)qi * n_head + h) * HD;
      const float inv = 1.0f / lt;
KCF_UNROLL
      for (int n = 0; n < HD / 8; n++)
        kcf_st2(out + 8 * n + 2 * c, o[mt][n][2 * hh] * inv, o[mt][n][2 * hh + 1] * inv);
    }
}

#endif
