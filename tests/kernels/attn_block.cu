/* attn_block: an experiment on FullKV decode attention (2026-12-06, twenty-ninth session):
 * cuDNN's structure (notes v20 item 8: `sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x128_1x4x1`)
 * over qevict's paged windows, against the tree's kc_attn_decode without masses (the FullKV
 * cache's call). The tree's chunk kernel gives each warp its own tiles of 16 tokens and its own
 * two-stage copy ring; here a block of four warps shares block-wide tiles of TK tokens (TK / 16
 * windows of 16), copied by all 128 threads into an NS-stage ring (one barrier a tile), and each
 * warp takes a quarter of a tile's keys: S = Q K^T and O += P V by mma.m16n8k16 with the query
 * heads as the rows (G <= 8 of 16), an online softmax per warp, the four warps merged through
 * shared memory at the end, the chunks of a sequence by a second, programmatically dependent
 * kernel. Only bf16 FULL windows (EVICTED ones and rows past n_tok are masked), head_dim 128,
 * windows of 16 tokens, no masses. SW variants (a name ending in "x"; 2026-12-06, thirty-third
 * session) swap the mma's roles: the keys (then the channels) are its 16 rows and the query heads
 * its 8 columns, so that a warp's 16 keys take 16 mma instead of 32 (fb_sstate).
 *
 *   attn_block [--bench [--shapes SUBSTR[,...]] [--rounds N]]
 * Check (default): fresh random problems (attn_ref.c) against the fp64 CPU reference for every
 * variant (TK, NS) and several chunkings: ||out - ref|| / ||ref|| < 1e-2, nothing NaN/Inf.
 * Exit 0, 1 on a failure, 77 without a CUDA device.
 * Bench: FullKV B=32 S=1280, B=8 S=32768 and B=32 S=32768 (GQA 32/8): the tree's kernel and every
 * variant, rounds alternating, each round the median of 30 (32K) or 100 launches, each queued
 * behind a spin kernel between two events (the GPU's own time, bench/sdpa_queued.py's method;
 * inputs rotated over copies of the arena where it fits L2); each variant's output compared with
 * the tree's. One line a variant, then a table: the median of the rounds' medians, their range,
 * GB/s and the ratio to the tree. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

extern "C" {
#include "attn_ref.h"
#include "qe_status.h"
}
#include "cuda_check.h"
#include "kern_cuda_attn.h"

#define FB_HD  128 /* head_dim */
#define FB_ROW 256 /* bytes of one token's K (or V) row of one KV head */

struct fb_params {
  const uint8_t *arena;
  const kern_pwin_t *win;
  const int32_t *seq_win;
  const float *q;
  float *out, *part_o, *part_lse; /* partials: [n_seq][n_head][n_chunk] (x 128 for part_o) */
  int n_kv, n_head, chunk_win, n_chunk;
  float qscale; /* softmax scale * log2(e) */
};

/* ---------------------------------------------------------------- device helpers */

__device__ __forceinline__ uint32_t fb_sa(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
/* Byte offset of (row r, 16-byte chunk c) in a tile: rows of 256 bytes, chunks XOR-swizzled by the
 * row's low 3 bits so that ldmatrix's eight rows of one chunk fall in distinct banks. */
__device__ __forceinline__ uint32_t fb_swz(int r, int c) {
  return (uint32_t)(r * FB_ROW + ((c ^ (r & 7)) << 4));
}
/* FB_L2HINT (an experiment's build flag): the copies' L2 prefetch size, 0 (none), 128 or 256. */
#if FB_L2HINT == 256
#define FB_CP16_OP "cp.async.cg.shared.global.L2::256B"
#elif FB_L2HINT == 128
#define FB_CP16_OP "cp.async.cg.shared.global.L2::128B"
#else
#define FB_CP16_OP "cp.async.cg.shared.global"
#endif
__device__ __forceinline__ void fb_cp16(uint32_t dst, const void *src, int bytes) {
  asm volatile(FB_CP16_OP " [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fb_commit(void) {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void fb_wait(void) {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fb_ldsm(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void fb_ldsm_t(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
/* c += A B, A rows g (a0, a2; rows g + 8 zero), B (b0, b1). */
__device__ __forceinline__ void fb_mma(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                       uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
/* c += A B with all four A registers (SW: the keys or channels as the rows). */
__device__ __forceinline__ void fb_mma4(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* The transpose of an 8 x 8 b16 matrix held as mma accumulator rows (lane g, c: row g, columns
 * 2c, 2c + 1). */
__device__ __forceinline__ uint32_t fb_movt(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ uint32_t fb_bf2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *(const uint32_t *)&h;
}

/* The descriptors of a tile's TK / 16 windows (w0 .. below wend) a thread needs: page offsets
 * and live rows (0 for an EVICTED window or one past wend). Loaded a tile ahead (fb_desc_load),
 * so that no global load stands between a tile's barrier and its copies. */
template <int TK> struct fb_desc {
  uint64_t k[TK / 16], v[TK / 16];
  int n[TK / 16];
};

template <int TK>
__device__ __forceinline__ void fb_desc_load(const fb_params &p, int w0, int wend, fb_desc<TK> &d) {
#pragma unroll
  for (int i = 0; i < TK / 16; i++) {
    d.n[i] = 0, d.k[i] = d.v[i] = 0;
    if (w0 + i >= wend) continue;
    const kern_pwin_t *w = p.win + w0 + i;
    const int4 meta = __ldg((const int4 *)&w->pos0); /* pos0, n_tok, tier, reserved */
    const ulonglong2 kv = __ldg((const ulonglong2 *)w);
    d.n[i] = meta.z == KERN_PW_FULL && meta.y > 0 ? meta.y : 0, d.k[i] = kv.x, d.v[i] = kv.y;
  }
}

/* Copies a tile of KV head kvh into a stage (NW warps): thread t copies 16-byte chunk t % 16 of
 * K and V rows t / 16 + 2 NW k; rows past a window's live rows are zero-filled; vlen[i] gets
 * window i's live rows (thread i writes it). */
template <int TK, int NW>
__device__ __forceinline__ void fb_issue(const fb_params &p, uint8_t *stage, int *vlen,
                                         const fb_desc<TK> &d, int kvh, int t) {
  constexpr int RP = 2 * NW; /* rows a pass */
  const int c = t & 15, r0 = t >> 4;
  const uint32_t ks = fb_sa(stage), vs = ks + TK * FB_ROW;
  const size_t rowb = (size_t)p.n_kv * FB_ROW, col = (size_t)kvh * FB_ROW + (size_t)c * 16;
#pragma unroll
  for (int i = 0; i < TK / 16; i++) {
    if (t == i) vlen[i] = d.n[i];
#pragma unroll
    for (int h = 0; h < 16 / RP; h++) {
      const int rr = r0 + RP * h, r = 16 * i + rr, ok = rr < d.n[i];
      const uint8_t *kp = ok ? p.arena + d.k[i] + rr * rowb + col : (const uint8_t *)p.win;
      const uint8_t *vp = ok ? p.arena + d.v[i] + rr * rowb + col : (const uint8_t *)p.win;
      fb_cp16(ks + fb_swz(r, c), kp, ok ? 16 : 0);
      fb_cp16(vs + fb_swz(r, c), vp, ok ? 16 : 0);
    }
  }
}

/* The warp's running state: max and sum of its lane's row g (log2 units), O[row g][8 dn + 2c + e]
 * in o[dn][e] (o[dn][2, 3]: the zero rows g + 8). */
struct fb_state {
  float m, l;
  float o[16][4];
};

/* Scores of the warp's KW keys of a tile: s[nt] (keys nt * 8 + 2c, + 1 in [0], [1]). */
template <int KW>
__device__ __forceinline__ void fb_scores(uint32_t ks, int kbase, int lane,
                                          const uint32_t (&qa)[8][2], float (&s)[KW / 8][4]) {
#pragma unroll
  for (int nt = 0; nt < KW / 8; nt++) {
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    const int key = kbase + nt * 8 + (lane & 7);
#pragma unroll
    for (int cc = 0; cc < 16; cc += 4) {
      uint32_t b[4];
      fb_ldsm(b, ks + fb_swz(key, cc + (lane >> 3)));
      fb_mma(s[nt], qa[cc / 2][0], qa[cc / 2][1], b[0], b[1]);
      fb_mma(s[nt], qa[cc / 2 + 1][0], qa[cc / 2 + 1][1], b[2], b[3]);
    }
  }
}

/* One tile of the warp's KW = TK / NW keys: scores, mask, online softmax, O += P V. */
template <int TK, int NW>
__device__ __forceinline__ void fb_tile(const uint8_t *stage, const int *vlen, int warp, int lane,
                                        const uint32_t (&qa)[8][2], fb_state &st) {
  constexpr int KW = TK / NW, NT = KW / 8;
  const uint32_t ks = fb_sa(stage), vs = ks + TK * FB_ROW;
  const int c = lane & 3, kbase = warp * KW;
  float s[NT][4];
  fb_scores<KW>(ks, kbase, lane, qa, s);
  float mx = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int kk = kbase + nt * 8 + 2 * c + e;
      if ((kk & 15) >= vlen[kk >> 4]) s[nt][e] = -INFINITY;
      mx = fmaxf(mx, s[nt][e]);
    }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float mn = fmaxf(st.m, mx), mu = mn == -INFINITY ? 0.0f : mn;
  const float alpha = exp2f(st.m - mu);
  st.m = mn;
  uint32_t pk[NT];
  float ps = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    const float p0 = exp2f(s[nt][0] - mu), p1 = exp2f(s[nt][1] - mu);
    ps += p0 + p1;
    pk[nt] = fb_bf2(p0, p1);
  }
  st.l = st.l * alpha + ps;
  if (__any_sync(0xffffffffu, alpha != 1.0f))
#pragma unroll
    for (int dn = 0; dn < 16; dn++) st.o[dn][0] *= alpha, st.o[dn][1] *= alpha;
  const int mi = lane >> 3;
#pragma unroll
  for (int kp = 0; kp < KW / 16; kp++) {
    const int key = kbase + 16 * kp + (lane & 7) + 8 * (mi & 1);
#pragma unroll
    for (int dp = 0; dp < 8; dp++) {
      uint32_t b[4];
      fb_ldsm_t(b, vs + fb_swz(key, 2 * dp + (mi >> 1)));
      fb_mma(st.o[2 * dp], pk[2 * kp], pk[2 * kp + 1], b[0], b[1]);
      fb_mma(st.o[2 * dp + 1], pk[2 * kp], pk[2 * kp + 1], b[2], b[3]);
    }
  }
}

/* SW, the swapped layout: the keys (then the channels) as the mma rows and the query heads as its
 * eight columns, so a warp's 16 keys take 8 mma for S^T = K Q^T and 8 for O^T += V^T P^T, where
 * the heads-as-rows layout above takes 16 and 16 (12 of its 16 rows are zero at GQA 4). Lane
 * (g, c) holds heads 2c + e (e = 0, 1): m[e], its own keys' share of l[e], and o[dp] =
 * O^T[channels 16 dp + g, + 8][heads 2c, 2c + 1] (o[dp][0, 1]: channel 16 dp + g). */
struct fb_sstate {
  float m[2], l[2];
  float o[8][4];
};

__device__ __forceinline__ void fb_state_init(fb_state &st) {
  st.m = -INFINITY, st.l = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; i++) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.0f;
}
__device__ __forceinline__ void fb_state_init(fb_sstate &st) {
  st.m[0] = st.m[1] = -INFINITY, st.l[0] = st.l[1] = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; i++) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.0f;
}

/* SW: S^T of the warp's KW keys: s[kp] = S[key kbase + 16 kp + g, + 8][heads 2c, 2c + 1] (the
 * B operand, Q^T, is fb_load_q's fragments as they are); two chains over the channels. */
template <int KW>
__device__ __forceinline__ void fb_sscores(uint32_t ks, int kbase, int lane,
                                           const uint32_t (&qa)[8][2], float (&s)[KW / 16][4]) {
#pragma unroll
  for (int kp = 0; kp < KW / 16; kp++) {
    float t[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    const int key = kbase + 16 * kp + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      uint32_t a[4];
      fb_ldsm(a, ks + fb_swz(key, 2 * k + (lane >> 4)));
      fb_mma4(t[k & 1], a, qa[k][0], qa[k][1]);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) s[kp][i] = t[0][i] + t[1][i];
  }
}

/* SW: one tile of the warp's KW = TK / NW keys (KW a multiple of 16). */
template <int TK, int NW>
__device__ __forceinline__ void fb_tile(const uint8_t *stage, const int *vlen, int warp, int lane,
                                        const uint32_t (&qa)[8][2], fb_sstate &st) {
  constexpr int KW = TK / NW, NK = KW / 16;
  static_assert(KW % 16 == 0, "SW: 16 keys a warp at least");
  const uint32_t ks = fb_sa(stage), vs = ks + TK * FB_ROW;
  const int g = lane >> 2, kbase = warp * KW;
  float s[NK][4];
  fb_sscores<KW>(ks, kbase, lane, qa, s);
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int kp = 0; kp < NK; kp++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int kk = kbase + 16 * kp + g + 8 * (i >> 1);
      if ((kk & 15) >= vlen[kk >> 4]) s[kp][i] = -INFINITY;
      mx[i & 1] = fmaxf(mx[i & 1], s[kp][i]);
    }
  float mu[2], alpha[2];
#pragma unroll
  for (int e = 0; e < 2; e++) {
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], x));
    const float mn = fmaxf(st.m[e], mx[e]);
    mu[e] = mn == -INFINITY ? 0.0f : mn, alpha[e] = exp2f(st.m[e] - mu[e]), st.m[e] = mn;
  }
  uint32_t pb[NK][2];
  float ps[2] = {0.0f, 0.0f};
#pragma unroll
  for (int kp = 0; kp < NK; kp++) {
    float p[4];
#pragma unroll
    for (int i = 0; i < 4; i++) p[i] = exp2f(s[kp][i] - mu[i & 1]), ps[i & 1] += p[i];
    pb[kp][0] = fb_movt(fb_bf2(p[0], p[1])), pb[kp][1] = fb_movt(fb_bf2(p[2], p[3]));
  }
  st.l[0] = st.l[0] * alpha[0] + ps[0], st.l[1] = st.l[1] * alpha[1] + ps[1];
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
    for (int dp = 0; dp < 8; dp++)
#pragma unroll
      for (int i = 0; i < 4; i++) st.o[dp][i] *= alpha[i & 1];
  const int mi = lane >> 3;
#pragma unroll
  for (int kp = 0; kp < NK; kp++) {
    const int key = kbase + 16 * kp + (lane & 7) + 8 * (mi >> 1);
#pragma unroll
    for (int dp = 0; dp < 8; dp++) {
      uint32_t a[4];
      fb_ldsm_t(a, vs + fb_swz(key, 2 * dp + (mi & 1)));
      fb_mma4(st.o[dp], a, pb[kp][0], pb[kp][1]);
    }
  }
}

/* Q of head kvh * G + g (rows g >= G zero), scaled and rounded to bf16, as A fragments. */
__device__ __forceinline__ void fb_load_q(const fb_params &p, int b, int kvh, int lane,
                                          uint32_t (&qa)[8][2]) {
  const int g = lane >> 2, c = lane & 3, G = p.n_head / p.n_kv;
  const float *q = p.q + ((size_t)b * p.n_head + (size_t)kvh * G + g) * FB_HD;
#pragma unroll
  for (int k = 0; k < 8; k++) {
    float2 x = make_float2(0.0f, 0.0f), y = x;
    if (g < G)
      x = *(const float2 *)(q + 16 * k + 2 * c), y = *(const float2 *)(q + 16 * k + 8 + 2 * c);
    qa[k][0] = fb_bf2(x.x * p.qscale, x.y * p.qscale);
    qa[k][1] = fb_bf2(y.x * p.qscale, y.y * p.qscale);
  }
}

/* A warp's state into its rows of sm (head h: row warp * 8 + h, O then m and l), for fb_merge. */
__device__ __forceinline__ void fb_put(fb_state &st, float *sm, int warp, int lane, int G) {
  const int g = lane >> 2, c = lane & 3;
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
  float *ws = sm + (warp * 8 + g) * (FB_HD + 2);
  if (g < G) {
    if (c == 0) ws[FB_HD] = st.m, ws[FB_HD + 1] = st.l;
#pragma unroll
    for (int dn = 0; dn < 16; dn++)
      ws[8 * dn + 2 * c] = st.o[dn][0], ws[8 * dn + 2 * c + 1] = st.o[dn][1];
  }
}
__device__ __forceinline__ void fb_put(fb_sstate &st, float *sm, int warp, int lane, int G) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int e = 0; e < 2; e++) {
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) st.l[e] += __shfl_xor_sync(0xffffffffu, st.l[e], x);
    if (2 * c + e >= G) continue;
    float *ws = sm + (warp * 8 + 2 * c + e) * (FB_HD + 2);
    if (g == 0) ws[FB_HD] = st.m[e], ws[FB_HD + 1] = st.l[e];
#pragma unroll
    for (int dp = 0; dp < 8; dp++)
      ws[16 * dp + g] = st.o[dp][e], ws[16 * dp + g + 8] = st.o[dp][2 + e];
  }
}

/* The NW warps' states (S: fb_state or fb_sstate) merged through shared memory (sm: >= NW * 8 *
 * 130 floats); writes the output (one chunk) or the chunk's normalized partial and log2-sum-exp. */
template <int NW, class S>
__device__ void fb_merge(const fb_params &p, S &st, float *sm, int b, int kvh, int ch, int t) {
  const int G = p.n_head / p.n_kv;
  fb_put(st, sm, t >> 5, t & 31, G);
  __syncthreads();
  for (int i = t; i < G * FB_HD; i += 32 * NW) {
    const int gg = i / FB_HD, d = i % FB_HD;
    float M = -INFINITY, L = 0.0f, O = 0.0f;
    for (int w = 0; w < NW; w++) M = fmaxf(M, sm[(w * 8 + gg) * (FB_HD + 2) + FB_HD]);
    for (int w = 0; w < NW && M != -INFINITY; w++) {
      const float *r = sm + (w * 8 + gg) * (FB_HD + 2), f = exp2f(r[FB_HD] - M);
      L += r[FB_HD + 1] * f, O += r[d] * f;
    }
    const size_t h = (size_t)b * p.n_head + (size_t)kvh * G + gg;
    const float v = L > 0.0f ? O / L : 0.0f;
    if (p.n_chunk == 1) {
      p.out[h * FB_HD + d] = v;
      continue;
    }
    p.part_o[(h * p.n_chunk + ch) * FB_HD + d] = v;
    if (d == 0) p.part_lse[h * p.n_chunk + ch] = L > 0.0f ? M + log2f(L) : -INFINITY;
  }
}

/* Block (chunk x, KV head y, sequence z) of NW warps: the chunk's windows in tiles of TK tokens
 * through an NS-stage ring. */
template <int TK, int NS, int NW, bool SW>
__global__ void __launch_bounds__(32 * NW) fb_kernel(const __grid_constant__ fb_params p) {
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ int vlen[NS][TK / 16];
  constexpr int WT = TK / 16, SB = TK * FB_ROW * 2; /* windows a tile, bytes a stage */
  const int ch = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
  const int w0 = p.seq_win[b] + ch * p.chunk_win, wend = min(p.seq_win[b + 1], w0 + p.chunk_win);
  const int ntile = w0 < wend ? (wend - w0 + WT - 1) / WT : 0;
  fb_desc<TK> dn;
#pragma unroll
  for (int s = 0; s < NS - 1; s++) {
    if (s < ntile) {
      fb_desc_load<TK>(p, w0 + s * WT, wend, dn);
      fb_issue<TK, NW>(p, sm + s * SB, vlen[s], dn, kvh, t);
    }
    fb_commit();
  }
  if (NS - 1 < ntile) fb_desc_load<TK>(p, w0 + (NS - 1) * WT, wend, dn);
  uint32_t qa[8][2];
  fb_load_q(p, b, kvh, t & 31, qa);
  typename std::conditional<SW, fb_sstate, fb_state>::type st;
  fb_state_init(st);
  for (int j = 0; j < ntile; j++) {
    fb_wait<NS - 2>();
    __syncthreads(); /* tile j landed; every warp is done with tile j - 1's stage */
    const int jn = j + NS - 1;
    if (jn < ntile) fb_issue<TK, NW>(p, sm + (jn % NS) * SB, vlen[jn % NS], dn, kvh, t);
    fb_commit();
    if (jn + 1 < ntile) fb_desc_load<TK>(p, w0 + (jn + 1) * WT, wend, dn);
    fb_tile<TK, NW>(sm + (j % NS) * SB, vlen[j % NS], t >> 5, t & 31, qa, st);
  }
  fb_wait<0>();
  __syncthreads();
  fb_merge<NW>(p, st, (float *)sm, b, kvh, ch, t);
}

/* out[b][h][d] from the chunks' partials (block (b, h), thread d), after the chunk kernel. */
__global__ void __launch_bounds__(FB_HD) fb_combine(const __grid_constant__ fb_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory"); /* the chunk kernel's writes are visible */
#endif
  const size_t h = blockIdx.x;
  const int d = threadIdx.x, n = p.n_chunk;
  const float *lse = p.part_lse + h * n;
  float M = -INFINITY, L = 0.0f, O = 0.0f;
  for (int c = 0; c < n; c++) M = fmaxf(M, lse[c]);
  for (int c = 0; c < n && M != -INFINITY; c++) {
    const float f = exp2f(lse[c] - M);
    L += f, O += f * p.part_o[(h * n + c) * FB_HD + d];
  }
  p.out[h * FB_HD + d] = L > 0.0f ? O / L : 0.0f;
}

/* ---------------------------------------------------------------- host */

typedef void (*fb_fn)(fb_params);

struct Variant {
  const char *name;
  int tk, ns, nt; /* tile tokens, stages, threads a block */
  fb_fn fn;
  int smem, occ; /* dynamic shared bytes, resident blocks a multiprocessor */
};

/* A variant, or one with occ 0 when its ring does not fit the device's shared memory (t64s7w4x
 * and t128s3w8x need more than an sm_80 block may have). */
template <int TK, int NS, int NW, bool SW = false> static Variant fb_variant(const char *name) {
  const fb_fn fn = fb_kernel<TK, NS, NW, SW>;
  Variant v = {name, TK, NS, 32 * NW, fn, NS * TK * FB_ROW * 2, 0};
  int dev = 0, optin = 0;
  cudaFuncAttributes fa;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  CK(cudaFuncGetAttributes(&fa, fn));
  if (v.smem + (int)fa.sharedSizeBytes > optin) return v;
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v.occ, fn, v.nt, v.smem));
  return v;
}

static std::vector<Variant> fb_variants(void) {
  /* (an "x": the swapped layout, SW; of v34's heads-as-rows shapes only its best stays listed,
   * as the same-call reference) */
  const std::vector<Variant> all = {
      fb_variant<64, 2, 4>("t64s2w4"),         fb_variant<64, 2, 4, true>("t64s2w4x"),
      fb_variant<64, 3, 4, true>("t64s3w4x"),  fb_variant<32, 3, 2, true>("t32s3w2x"),
      fb_variant<32, 2, 2, true>("t32s2w2x"),  fb_variant<64, 2, 2, true>("t64s2w2x"),
      fb_variant<64, 7, 4, true>("t64s7w4x"),  fb_variant<128, 3, 8, true>("t128s3w8x")};
  std::vector<Variant> vs;
  for (const Variant &v : all)
    if (v.occ > 0) vs.push_back(v);
    else printf("variant %s: %d B shared does not fit this device, skipped\n", v.name, v.smem);
  return vs;
}

/* A problem's device copies and the launch's buffers. */
struct Prob {
  attn_prob_t pr;
  std::vector<uint8_t *> arenas;
  kern_pwin_t *win = nullptr;
  int32_t *seq_win = nullptr;
  float *q = nullptr, *out = nullptr, *part = nullptr, *lse = nullptr;
  void *ws = nullptr;
  int n_part = 0; /* chunks the partial buffers hold */
};

template <class T> static T *upload(const T *h, size_t n) {
  T *d = nullptr;
  CK(cudaMalloc((void **)&d, sizeof(T) * (n ? n : 1)));
  if (n) CK(cudaMemcpy(d, h, sizeof(T) * n, cudaMemcpyHostToDevice));
  return d;
}

/* Device copies of P's problem: n_rot arenas (copied from the host's, or with `fill` left for
 * the caller), tables, queries, and the output and partial buffers. */
static void prob_upload(Prob *P, int n_rot, int fill) {
  const attn_prob_t &pr = P->pr;
  for (int r = 0; r < n_rot; r++) {
    uint8_t *a = nullptr;
    CK(cudaMalloc((void **)&a, pr.arena_bytes));
    if (!fill) CK(cudaMemcpy(a, pr.arena, pr.arena_bytes, cudaMemcpyHostToDevice));
    P->arenas.push_back(a);
  }
  P->win = upload(pr.win, (size_t)pr.n_win);
  P->seq_win = upload(pr.seq_win, (size_t)pr.n_seq + 1);
  const size_t nq = (size_t)pr.n_seq * pr.n_head * FB_HD;
  P->q = upload(pr.q, nq);
  CK(cudaMalloc((void **)&P->out, sizeof(float) * nq));
  P->n_part = 16;
  CK(cudaMalloc((void **)&P->part, sizeof(float) * nq * P->n_part));
  CK(cudaMalloc((void **)&P->lse, sizeof(float) * (nq / FB_HD) * P->n_part));
}

static void prob_free(Prob *P) {
  for (uint8_t *a : P->arenas) cudaFree(a);
  cudaFree(P->win), cudaFree(P->seq_win), cudaFree(P->q), cudaFree(P->out), cudaFree(P->part);
  cudaFree(P->lse), cudaFree(P->ws);
  attn_prob_free(&P->pr);
}

/* Chunks a sequence: chunks (> 0) or enough for one wave of the variant's blocks. */
static int fb_chunk_win(const Variant &v, const Prob &P, int chunks) {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int pairs = P.pr.n_seq * P.pr.geom.n_kv, wt = v.tk / 16;
  const char *env = getenv("FB_CHUNKS"); /* (bench: a fixed chunk count for every variant) */
  if (chunks <= 0 && env && atoi(env) > 0) chunks = atoi(env);
  if (chunks <= 0) chunks = std::max(1, sms * v.occ / pairs);
  chunks = std::min(chunks, P.n_part);
  int cw = (P.pr.max_win + chunks - 1) / chunks;
  return std::max(wt, (cw + wt - 1) / wt * wt);
}

static void fb_launch(const Variant &v, const Prob &P, int arena, int chunk_win) {
  fb_params p;
  p.arena = P.arenas[arena], p.win = P.win, p.seq_win = P.seq_win, p.q = P.q, p.out = P.out;
  p.part_o = P.part, p.part_lse = P.lse, p.n_kv = P.pr.geom.n_kv, p.n_head = P.pr.n_head;
  p.chunk_win = chunk_win, p.n_chunk = std::max(1, (P.pr.max_win + chunk_win - 1) / chunk_win);
  p.qscale = P.pr.scale * 1.4426950408889634f;
  const dim3 grid(p.n_chunk, p.n_kv, P.pr.n_seq);
  v.fn<<<grid, v.nt, v.smem>>>(p);
  CK(cudaGetLastError());
  if (p.n_chunk == 1) return;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.gridDim = dim3(P.pr.n_seq * P.pr.n_head), cfg.blockDim = dim3(FB_HD);
  cfg.attrs = attr, cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, fb_combine, p));
}

/* The tree's call without masses. */
static kc_attn_args_t tree_args(Prob *P) {
  kc_attn_args_t a;
  memset(&a, 0, sizeof a);
  a.geom = P->pr.geom, a.n_seq = P->pr.n_seq, a.n_head = P->pr.n_head, a.scale = P->pr.scale;
  a.arena = P->arenas[0], a.win = P->win, a.seq_win = P->seq_win, a.n_win = P->pr.n_win;
  a.max_win = P->pr.max_win, a.q = P->q, a.out = P->out;
  size_t need = 0;
  if (kc_attn_ws_bytes(&a, &need)) {
    fprintf(stderr, "attn_block: kc_attn_ws_bytes: %s\n", qe_errmsg());
    exit(1);
  }
  if (!P->ws) CK(cudaMalloc(&P->ws, need));
  a.ws = P->ws, a.ws_bytes = need;
  return a;
}

static std::vector<float> download_out(const Prob &P) {
  std::vector<float> o((size_t)P.pr.n_seq * P.pr.n_head * FB_HD);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(o.data(), P.out, sizeof(float) * o.size(), cudaMemcpyDeviceToHost));
  return o;
}

/* ||a - b|| / ||b||, and whether a is all finite. */
template <class T>
static double rel_err(const std::vector<float> &a, const std::vector<T> &b, int *nonfinite) {
  double num = 0, den = 0;
  *nonfinite = 0;
  for (size_t i = 0; i < a.size(); i++) {
    *nonfinite += !isfinite(a[i]);
    num += (a[i] - (double)b[i]) * (a[i] - (double)b[i]), den += (double)b[i] * b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---------------------------------------------------------------- check */

static int check_one(const char *name, int n_head, int n_kv, std::vector<int> lens, double p_full,
                     int sink, uint64_t seed, const std::vector<Variant> &vs) {
  Prob P;
  attn_spec_t s;
  memset(&s, 0, sizeof s);
  s.geom = {n_kv, FB_HD, 16, 2, 32};
  s.n_seq = (int)lens.size(), s.n_head = n_head, s.rope_mode = KERN_ROPE_NORM, s.n_rot = FB_HD;
  s.rope_theta = 10000.0f, s.seq_len = lens.data(), s.sink = sink, s.n_local = 1;
  s.p_full = p_full, s.p_quant = 0.0, s.n_full = -1, s.n_quant = -1, s.realistic = 1, s.seed = seed;
  if (attn_prob_make(&s, &P.pr)) {
    printf("FAIL %s: cannot build the problem\n", name);
    return 1;
  }
  std::vector<double> ref((size_t)P.pr.n_seq * n_head * FB_HD), mass(P.pr.n_win + 1);
  if (attn_ref_run(&P.pr, ref.data(), mass.data())) return 1;
  prob_upload(&P, 1, 0);
  int fails = 0;
  for (const Variant &v : vs)
    for (int chunks : {0, 1, 3, 7}) {
      const int cw = fb_chunk_win(v, P, chunks);
      CK(cudaMemset(P.out, 0xff, sizeof(float) * ref.size())); /* NaN */
      fb_launch(v, P, 0, cw);
      int nf = 0;
      const double err = rel_err(download_out(P), ref, &nf);
      const int bad = nf || !(err < 1e-2);
      fails += bad;
      printf("%s %-28s %-7s chunk %4d  err %.2e  nonfinite %d\n", bad ? "FAIL" : "ok  ", name,
             v.name, cw, err, nf);
    }
  prob_free(&P);
  return fails;
}

static int check_all(const std::vector<Variant> &vs) {
  uint64_t seed = (uint64_t)time(NULL);
  printf("seed %llu\n", (unsigned long long)seed);
  int f = 0;
  f += check_one("gqa4 full", 32, 8, {1, 16, 17, 100, 1280, 3001}, 1.0, 0, seed++, vs);
  f += check_one("gqa4 sink5 evicted30%", 32, 8, {5, 40, 700, 2049}, 0.7, 5, seed++, vs);
  f += check_one("gqa8 full", 16, 2, {33, 512, 1000}, 1.0, 3, seed++, vs);
  f += check_one("mha evicted50%", 8, 8, {0, 64, 300, 1500}, 0.5, 0, seed++, vs);
  printf("%s: %d failures\n", f ? "FAIL" : "ok", f);
  return f != 0;
}

/* ---------------------------------------------------------------- bench */

__global__ void fb_fill(uint16_t *p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    z ^= z >> 29;
    const float x = ((float)(z & 0xffffff) / 16777216.0f - 0.5f) * 4.0f;
    p[i] = (uint16_t)(__float_as_uint(x) >> 16);
  }
}

/* Holds the stream for ~cycles (the host enqueues what follows meanwhile). */
__global__ void fb_spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

/* The median ms of `reps` launches (after 5), each queued behind fb_spin so that the events time
 * the GPU's own work (bench/sdpa_queued.py's method for torch), arenas rotated. */
template <typename F> static double time_queued(int n_rot, int reps, F launch) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < reps + 5; i++) {
    l2_flush();
    fb_spin<<<1, 1>>>(4000000ll);
    CK(cudaEventRecord(e0));
    launch(i % n_rot);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 5) t.push_back(ms);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static int shape_on(const char *name, const char *filter) {
  if (!filter) return 1;
  std::string f(filter);
  size_t at = 0;
  while (at <= f.size()) {
    const size_t end = std::min(f.find(',', at), f.size());
    if (strstr(name, f.substr(at, end - at).c_str())) return 1;
    at = end + 1;
  }
  return 0;
}

static void bench_one(const char *name, int n_seq, int seq, int rounds,
                      const std::vector<Variant> &vs) {
  Prob P;
  std::vector<int> lens(n_seq, seq);
  attn_spec_t s;
  memset(&s, 0, sizeof s);
  s.geom = {8, FB_HD, 16, 2, 32};
  s.n_seq = n_seq, s.n_head = 32, s.rope_mode = KERN_ROPE_NORM, s.n_rot = FB_HD;
  s.rope_theta = 500000.0f, s.seq_len = lens.data(), s.n_local = 2;
  s.p_full = 1.0, s.n_full = -1, s.n_quant = -1, s.realistic = 0, s.seed = 42;
  if (attn_prob_make(&s, &P.pr)) {
    fprintf(stderr, "bench %s: cannot build the problem\n", name);
    exit(1);
  }
  int dev = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const int n_rot =
      (int)std::min<size_t>(4, (4 * (size_t)l2 + P.pr.arena_bytes - 1) / P.pr.arena_bytes);
  for (int i = 0; i < P.pr.n_seq * P.pr.n_head * FB_HD; i++)
    P.pr.q[i] = (float)attn_rng_normal(&s.seed);
  prob_upload(&P, n_rot, 1);
  for (int r = 0; r < n_rot; r++) {
    fb_fill<<<8192, 256>>>((uint16_t *)P.arenas[r], P.pr.arena_bytes / 2, 1000 + r);
    CK(cudaGetLastError());
  }
  kc_attn_args_t a = tree_args(&P);
  auto tree = [&](int r) {
    a.arena = P.arenas[r];
    if (kc_attn_decode(&a, nullptr)) {
      fprintf(stderr, "kc_attn_decode: %s\n", qe_errmsg());
      exit(1);
    }
  };
  tree(0);
  const std::vector<float> ref = download_out(P);
  std::vector<int> cws;
  for (const Variant &v : vs) {
    cws.push_back(fb_chunk_win(v, P, 0));
    fb_launch(v, P, 0, cws.back());
    int nf = 0;
    const double err = rel_err(download_out(P), ref, &nf);
    printf("{\"bench\": \"%s\", \"variant\": \"%s\", \"chunk_win\": %d, \"occ\": %d, "
           "\"err_vs_tree\": %.3e, \"nonfinite\": %d}\n",
           name, v.name, cws.back(), v.occ, err, nf);
  }
  std::vector<std::vector<double>> ms(vs.size() + 1);
  const int reps = seq > 4096 ? 30 : 100;
  for (int r = 0; r < rounds; r++) {
    ms[0].push_back(time_queued(n_rot, reps, tree));
    for (size_t i = 0; i < vs.size(); i++)
      ms[i + 1].push_back(time_queued(n_rot, reps, [&](int k) { fb_launch(vs[i], P, k, cws[i]); }));
  }
  const double bytes = (double)P.pr.kv_bytes;
  for (auto &m : ms) std::sort(m.begin(), m.end());
  const double tree_med = ms[0][ms[0].size() / 2];
  for (size_t i = 0; i <= vs.size(); i++) {
    const std::vector<double> &m = ms[i];
    const double med = m[m.size() / 2], ratio = med / tree_med;
    printf("%-16s %-7s median %.4f ms (min %.4f max %.4f)  %.1f GB/s  / tree %.3f\n", name,
           i ? vs[i - 1].name : "tree", med, m.front(), m.back(), bytes / med / 1e6, ratio);
  }
  prob_free(&P);
}

int main(int argc, char **argv) {
  int bench = 0, rounds = 5;
  const char *filter = nullptr;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bench"))
      bench = 1;
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc)
      filter = argv[++i];
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc && atoi(argv[i + 1]) > 0)
      rounds = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--bench [--shapes SUBSTR[,...]] [--rounds N]]\n", argv[0]);
      return 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("attn_block: no CUDA device, skipped\n");
    return 77;
  }
  CK(cudaSetDevice(0));
  const std::vector<Variant> vs = fb_variants();
  for (const Variant &v : vs)
    printf("variant %s: %d B shared, %d blocks a multiprocessor\n", v.name, v.smem, v.occ);
  if (!bench) return check_all(vs);
  const struct {
    const char *name;
    int n_seq, seq;
  } sh[] = {
      {"full_b32_s1280", 32, 1280}, {"full_b8_s32768", 8, 32768}, {"full_b32_s32768", 32, 32768}};
  for (const auto &x : sh)
    if (shape_on(x.name, filter)) bench_one(x.name, x.n_seq, x.seq, rounds, vs);
  return 0;
}
