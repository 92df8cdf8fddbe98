/* kern_cuda_quant: the tiered cache's window migrations on the GPU (see kern_cuda_quant.h).
 *
 * The quantizer is a port of cache/kv_quant.c, function for function (kq_X is kv__X; read the
 * reasons there): the same fp32 and fp64 operations in the same order, the fp16 conversions of
 * qe_half.h in integer code, and every fp32 product and sum written with __fmul_rn / __fadd_rn
 * (the file is also built with -fmad=false), so a group gets the CPU's codes, scale and zero bit
 * for bit. One thread chooses the (z, s) of one group:
 *   - keys: a warp per (job, KV head, 32 channels); each lane stages its channel's n_tok keys
 *     (bf16 -> fp32, un-rotated, sanitized) in a column of shared memory [n_tok][32], quantizes
 *     it, and the lanes sharing a code byte OR their codes together with warp shuffles (head rows
 *     start on byte boundaries: head_dim * bits % 8 == 0);
 *   - values: one thread per (job, token, head, group), reading its group's bf16 run (groups of
 *     32 staged once in a column of shared memory, others read directly); a group owns whole code
 *     bytes (group * bits % 8 == 0). The rule's zero point is one round-down conversion.
 * Dequantization: one thread per (job, token, head, 8 channels) decodes 8 K and 8 V codes with
 * 16-byte scale, zero and page accesses when keys are not turned (post-RoPE ledgers, the
 * default); otherwise one thread per (job, token, head, channel) decodes its K and V codes (and
 * the key's RoPE partner channel), re-rotates the key and rounds both to bf16.
 * Every kernel spreads all (job, item) pairs of a call over one grid-stride loop, so a batch of
 * many small jobs runs as wide as one of few large ones (a block per job, striding over the jobs,
 * made each block walk hundreds of jobs one after another: 97 ms a routing pass of 262,144 jobs
 * on the H200, 2026-12-03). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#ifdef KQ_EMU
#include <functional>
#endif

extern "C" {
#include "qe_status.h"
}
#include "kern_cuda_quant.h"

#define KQ_GRID_MAX 4096    /* blocks of a grid-stride launch at most */
#define KQ_HMAX     0x7bffu /* 65504 */
#define KQ_HTINY    0x0001u /* 2^-24, the smallest positive fp16 */
#define KQ_HMINS    0x0400u /* 2^-14, the smallest normal fp16: the smallest scale */
#define KQ_SEARCH_S 1024    /* scale candidates tried per zero in the fallback search */
#define KQ_KW       32      /* lanes (channels) per key task: one warp */
#define KQ_KWARPS   8       /* key tasks (warps) per block when their staging fits 48 KiB */
#define KQ_VT       128     /* threads per value-quantization block */
#define KQ_VSTAGE   32      /* value groups of this size are staged in shared memory */
#define KQ_DT       256     /* threads per dequantization block */

/* The layer between this code and the GPU: with KQ_EMU defined (tests/kernels/quant_emu.cu)
 * the same source builds as host C++ (fp32 and fp64 operations rounded to nearest, which the
 * intrinsics are; warp shuffles and barriers through emu_fiber.h's fibers), so that CI runs
 * the kernels' own code against cache/kv_quant.c on machines without a GPU. */
#ifndef KQ_EMU
#define KQ_FN                   static __device__ __forceinline__
#define KQ_DFN                  static __device__
#define KQ_MFN                  __device__
#define KQ_SHFL_XOR(v, o, lane) __shfl_xor_sync(0xffffffffu, (v), (o))
#define KQ_SYNCWARP()           __syncwarp()
#define KQ_CLZ(x)               __clz((int)(x))
#else
#define KQ_FN  static inline
#define KQ_DFN static
#define KQ_MFN
uint32_t kca_emu_shfl_u(uint32_t v, int src); /* emu_fiber.h */
void kca_emu_syncwarp(void);
#define KQ_SHFL_XOR(v, o, lane) kca_emu_shfl_u((v), (lane) ^ (o))
#define KQ_SYNCWARP()           kca_emu_syncwarp()
#define KQ_CLZ(x)               __builtin_clz((unsigned)(x))
static inline float kq_emu_u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t kq_emu_f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
#define __uint_as_float(u)      kq_emu_u2f((uint32_t)(u))
#define __int_as_float(u)       kq_emu_u2f((uint32_t)(u))
#define __float_as_uint(f)      kq_emu_f2u(f)
#define __fmul_rn(a, b)         ((float)(a) * (float)(b))
#define __fadd_rn(a, b)         ((float)(a) + (float)(b))
#define __fsub_rn(a, b)         ((float)(a) - (float)(b))
#define __fdiv_rn(a, b)         ((float)(a) / (float)(b))
#define __dmul_rn(a, b)         ((double)(a) * (double)(b))
#define __dadd_rn(a, b)         ((double)(a) + (double)(b))
#define __dsub_rn(a, b)         ((double)(a) - (double)(b))
#endif

/* A thread's place in its launch (blockIdx.x, gridDim.x, threadIdx.x, blockDim.x). */
typedef struct {
  int bx, gx, tx, bd;
} kq_thr_t;

#ifndef KQ_EMU
static int kq_cuda_at(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return 0;
  return qe_errf(QE_EBACKEND, "cuda: %s: %s (%s:%d)", what, cudaGetErrorString(e), file, line);
}
#define KQ_CUDA(call) kq_cuda_at((call), #call, __FILE__, __LINE__)
#define KQ_LAUNCHED() kq_cuda_at(cudaGetLastError(), "launch", __FILE__, __LINE__)
#endif

/* The kernels' view of a checked kc_quant_args_t. */
typedef struct {
  uintptr_t arena; /* 0: job offsets are addresses */
  const kc_quant_job_t *jobs;
  const int32_t *n_dev; /* jobs to do, read on the device (capped at n_jobs); NULL: n_jobs */
  int n_jobs;
  const float *rope_tab;                               /* [n_rot / 2][2]: freq, YaRN mix */
  int n_kv, hd, bits, group, omega, rotate, post_rope; /* rotate: off for post_rope */
  int mode, n_rot, yarn;
  float freq_scale, mscale;
} kq_params_t;

template <class T> KQ_FN T *kq_ptr(const kq_params_t &p, uint64_t off) {
  return (T *)(p.arena + (uintptr_t)off);
}

/* ---- fp16 conversions: qe_half.h's integer code ---- */

KQ_FN float kq_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return __uint_as_float(sign);
  uint32_t e = 113;
  while (!(mant & 0x400u)) mant <<= 1, e--;
  return __uint_as_float(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

KQ_FN uint16_t kq_half_subnormal(uint32_t ax) {
  uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
  if (e < 102) return 0;
  uint32_t shift = 126 - e, q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  return (uint16_t)(q + (rem > half || (rem == half && (q & 1u))));
}

KQ_FN uint16_t kq_f2h(float f) {
  uint32_t x = __float_as_uint(f), ax = x & 0x7fffffffu;
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x38800000u) return (uint16_t)(sign | kq_half_subnormal(ax));
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* ---- elementwise arithmetic (kv_quant.c's definitions) ---- */

KQ_FN float kq_san(float x) {
  if (x != x) return 0.0f;
  return x < -65504.0f ? -65504.0f : x > 65504.0f ? 65504.0f : x;
}

KQ_FN int kq_code(float x, float z, float s, int L) {
  const float d = __fsub_rn(x, z);
  if (d == 0.0f) return 0; /* +-0 / s rounds to code 0; the division's slow path, on the GPU */
  const float u = rintf(__fdiv_rn(d, s));
  return u <= 0.0f ? 0 : u >= (float)L ? L : (int)u;
}

KQ_FN float kq_recon(int c, float z, float s) { return __fadd_rn(__fmul_rn((float)c, s), z); }

/* Keys: one channel's staged column, x[i * KQ_KW] (shared memory, already sanitized). */
struct kq_kgrp {
  const float *x;
  int n;
  KQ_MFN float at(int i) const { return x[i * KQ_KW]; }
};

/* Values: one token's run of `group` channels of a bf16 V page. */
struct kq_vgrp {
  const __nv_bfloat16 *x;
  int n;
  KQ_MFN float at(int i) const { return kq_san(__bfloat162float(x[i])); }
};

/* Values staged in shared memory by kq_stage_vgrp: x[i * stride] = kq_vgrp's at(i). */
struct kq_sgrp {
  const float *x;
  int n, stride;
  KQ_MFN float at(int i) const { return x[i * stride]; }
};

/* ---- fp16 ordering (finite values only) ---- */

KQ_FN double kq_h(uint16_t h) { return (double)kq_h2f(h); }

KQ_FN uint16_t kq_hup(uint16_t h) {
  if ((h & 0x7fffu) == 0) return KQ_HTINY;
  if (h & 0x8000u) return h == 0x8001u ? 0 : (uint16_t)(h - 1);
  return (uint16_t)(h + 1);
}

KQ_FN uint16_t kq_hdown(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x8001u;
  return (h & 0x8000u) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}

KQ_FN int kq_hfinite(uint16_t h) { return (h & 0x7fffu) <= KQ_HMAX; }

#ifdef KQ_EMU /* kq_hfloor_f's reference in quant_emu: the kernels use the conversion */
/* Largest fp16 <= v, for v in [-65504, 65504]; zero is +0 (kv_quant.c's search). */
KQ_FN uint16_t kq_hfloor(double v) {
  uint16_t h = kq_f2h((float)v);
  if ((h & 0x7fffu) > KQ_HMAX) h = (uint16_t)((h & 0x8000u) | KQ_HMAX);
  while (kq_h(h) > v) h = kq_hdown(h);
  while (h != KQ_HMAX && kq_h(kq_hup(h)) <= v) h = kq_hup(h);
  return (h & 0x7fffu) == 0 ? 0 : h;
}
#endif

/* Smallest positive fp16 >= v (at least 2^-24; at most 65504). */
KQ_FN uint16_t kq_hceil_pos(double v) {
  if (!(v > kq_h(KQ_HTINY))) return KQ_HTINY;
  if (v >= 65504.0) return KQ_HMAX;
  uint16_t h = kq_f2h((float)v);
  while (h > KQ_HTINY && kq_h((uint16_t)(h - 1)) >= v) h--;
  while (kq_h(h) < v) h++;
  return h;
}

/* ---- the rule R and the fixed-point test ---- */

/* A finite fp16 (a ledger's scales and zeros always are: kq_rule, kq_search) as fp32 through
 * the hardware conversion: the same value as kq_h2f's integer code, in one instruction. */
KQ_FN float kq_h2f_finite(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* Smallest fp16 s >= 2^-14 whose top reconstruction fl(L * s + z) >= mx, walking from s0: the
 * walk up stops at the first scale that covers, the walk down at the last one, and fl(L * s + z)
 * is monotone in s, so the answer does not depend on s0. */
KQ_FN uint16_t kq_cover_from(uint16_t s, float z, float mx, int L) {
  s = s < KQ_HMINS ? KQ_HMINS : s;
  while (s < KQ_HMAX && kq_recon(L, z, kq_h2f_finite(s)) < mx) s++;
  while (s > KQ_HMINS && kq_recon(L, z, kq_h2f_finite((uint16_t)(s - 1))) >= mx) s--;
  return s;
}

#ifdef KQ_EMU /* kq_cover's reference in quant_emu: kv_quant.c's start, an fp64 quotient */
KQ_FN uint16_t kq_cover_ref(uint16_t zh, float mx, int L) {
  const float z = kq_h2f(zh);
  return kq_cover_from(kq_hceil_pos(((double)mx - (double)z) / (double)L), z, mx, L);
}
#endif

/* kv_quant.c's cover (the smallest fp16 s >= 2^-14 with fl(L * s + z) >= mx), its walk started
 * from an fp32 estimate rounded up to fp16 instead of kv__hceil_pos of an fp64 quotient (an fp64
 * division and two walks in fp64 a group); mn <= mx and z <= mn, so the estimate is >= 0. */
KQ_FN uint16_t kq_cover(uint16_t zh, float mx, int L) {
  const float z = kq_h2f_finite(zh), v = __fdiv_rn(__fsub_rn(mx, z), (float)L);
  const uint16_t s0 = !(v > 0x1p-14f) ? KQ_HMINS
                      : v >= 65504.0f ? KQ_HMAX
                                      : __half_as_ushort(__float2half_ru(v));
  return kq_cover_from(s0, z, mx, L);
}

/* kq_hfloor of a float in [-65504, 65504] (every value here is kq_san'd): the round-down
 * conversion, -0 as +0. The same for each of the 2,399,125,506 such floats (checked exhaustively
 * on the host, 2026-12-03; quant_emu re-checks a sample). */
KQ_FN uint16_t kq_hfloor_f(float v) {
  const uint16_t h = __half_as_ushort(__float2half_rd(v));
  return (h & 0x7fffu) == 0 ? 0 : h;
}

/* The rule R: z = the largest fp16 <= mn, s = its cover. */
KQ_FN void kq_rule(float mn, float mx, int L, uint16_t *zh, uint16_t *sh) {
  *zh = kq_hfloor_f(mn);
  *sh = kq_cover(*zh, mx, L);
}

template <class G> KQ_FN void kq_minmax(const G &g, float *mn, float *mx) {
  float lo = g.at(0), hi = lo;
  for (int i = 1; i < g.n; i++) {
    const float x = g.at(i);
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  *mn = lo;
  *mx = hi;
}

/* |x - y| <= s/2 + half an fp32 ulp of y, in fp64 (the products by 0.5 are exact). */
KQ_FN int kq_within(float x, float y, float s) {
  const float ay = fabsf(y);
  const double ulp = __dsub_rn((double)nextafterf(ay, __int_as_float(0x7f800000)), (double)ay);
  const double d = fabs(__dsub_rn((double)x, (double)y));
  return d <= __dadd_rn(__dmul_rn(0.5, (double)s), __dmul_rn(0.5, ulp));
}

/* Is (z, s) a fixed point for the n values xs? */
KQ_FN int kq_is_fixed_vals(const float *xs, int n, int L, uint16_t zh, uint16_t sh) {
  const float z = kq_h2f_finite(zh), s = kq_h2f_finite(sh);
  float ylo = 0, yhi = 0;
  for (int i = 0; i < n; i++) {
    const int c = kq_code(xs[i], z, s, L);
    const float y = kq_san(kq_recon(c, z, s));
    if (!kq_within(xs[i], y, s) || kq_code(y, z, s, L) != c) return 0;
    ylo = (i == 0 || y < ylo) ? y : ylo;
    yhi = (i == 0 || y > yhi) ? y : yhi;
  }
  uint16_t z2, s2;
  kq_rule(ylo, yhi, L, &z2, &s2);
  return z2 == zh && s2 == sh;
}

/* Every reconstruction maps back to its code when fp32 resolves s well at the magnitude. */
KQ_FN int kq_trip_exact(float z, float s, int L) {
  const double m = fmax(fabs((double)z), fabs(__dadd_rn((double)z, __dmul_rn((double)L, s))));
  return m <= 65504.0 && __dmul_rn((double)s, 1048576.0) >= m; /* s 2^20, exactly */
}

template <class G>
KQ_FN int kq_is_fixed(const G &g, float mn, float mx, int L, uint16_t zh, uint16_t sh) {
  const float ends[2] = {mn, mx};
  if (!kq_is_fixed_vals(ends, 2, L, zh, sh)) return 0;
  const float z = kq_h2f_finite(zh), s = kq_h2f_finite(sh);
  if (kq_trip_exact(z, s, L)) return 1;
  for (int i = 0; i < g.n; i++) {
    const int c = kq_code(g.at(i), z, s, L);
    if (kq_code(kq_san(kq_recon(c, z, s)), z, s, L) != c) return 0;
  }
  return 1;
}

template <class G>
KQ_FN int kq_rule_is_fixed(const G &g, float mn, float mx, int L, uint16_t zh, uint16_t sh) {
  const float z = kq_h2f_finite(zh), s = kq_h2f_finite(sh);
  if (kq_code(mn, z, s, L) == 0 && kq_code(mx, z, s, L) == L && kq_trip_exact(z, s, L)) return 1;
  return kq_is_fixed(g, mn, mx, L, zh, sh);
}

/* Scales for zero z in increasing order from the s/2-bound minimum (kv__search_scales). */
template <class G>
KQ_FN int kq_search_scales(const G &g, float mn, float mx, int L, uint16_t zh, uint16_t *sh) {
  const double z = kq_h(zh), w = __dsub_rn((double)mx, z);
  const double lo = fmax(w / (L + 0.5), 2.0 * __dsub_rn(z, (double)mn)), hi = w / (L - 0.5);
  uint16_t s = kq_hceil_pos(lo);
  s = s < KQ_HMINS ? KQ_HMINS : s;
  for (int k = 0, extra = 0; k < KQ_SEARCH_S && s <= KQ_HMAX && extra < 4; k++, s++) {
    if (kq_h(s) > hi) extra++;
    if (kq_is_fixed(g, mn, mx, L, zh, s)) {
      *sh = s;
      return 1;
    }
  }
  return 0;
}

/* Fallback when R(mn, mx) is not a fixed point: zeros floor(mn), the next fp16 up, two down. */
template <class G>
KQ_FN int kq_search(const G &g, float mn, float mx, int L, uint16_t *zh, uint16_t *sh) {
  const uint16_t z0 = kq_hfloor_f(mn);
  uint16_t zs[4] = {z0, kq_hup(z0), kq_hdown(z0), 0};
  zs[3] = kq_hdown(zs[2]);
  for (int i = 0; i < 4; i++) {
    if (!kq_hfinite(zs[i]) || (i == 1 && z0 == KQ_HMAX)) continue;
    if (kq_search_scales(g, mn, mx, L, zs[i], sh)) {
      *zh = zs[i];
      return 1;
    }
  }
  return 0;
}

/* The (z, s) of one group (kv__quant_group without the code writes). */
template <class G> KQ_FN void kq_choose(const G &g, int L, uint16_t *zh, uint16_t *sh) {
  float mn, mx;
  kq_minmax(g, &mn, &mx);
  kq_rule(mn, mx, L, zh, sh);
  if (!kq_rule_is_fixed(g, mn, mx, L, *zh, *sh) && !kq_search(g, mn, mx, L, zh, sh))
    kq_rule(mn, mx, L, zh, sh); /* no fixed point: keep R (the s/2 bound still holds) */
}

/* ---- RoPE: kern_cpu_attn.c's rope_cs / rope_head ---- */

/* Rotation pair of channel j: pair index i and channels a, b. Returns j's role (0: a, 1: b), or
 * -1 for a channel past n_rot (not rotated). */
KQ_FN int kq_pair(const kq_params_t &p, int j, int *i, int *a, int *b) {
  if (j >= p.n_rot) return -1;
  if (p.mode == KERN_ROPE_NEOX) {
    const int half = p.n_rot / 2;
    *i = j < half ? j : j - half;
    *a = *i;
    *b = *i + half;
    return j >= half;
  }
  *i = j >> 1;
  *a = j & ~1;
  *b = *a + 1;
  return j & 1;
}

/* cos and sin (times mscale) of pair i at pos: the table row of |pos|, sin negated for pos < 0. */
KQ_FN void kq_cs(const kq_params_t &p, int pos, int i, float *c, float *s) {
  const int ap = pos < 0 ? -pos : pos;
  const float extrap = __fmul_rn((float)ap, p.rope_tab[2 * i]);
  float theta = __fmul_rn(extrap, p.freq_scale), sn, cs;
  if (p.yarn) {
    const float mix = p.rope_tab[2 * i + 1];
    theta = __fadd_rn(__fmul_rn(theta, __fsub_rn(1.0f, mix)), __fmul_rn(extrap, mix));
  }
  sincosf(theta, &sn, &cs);
  *c = __fmul_rn(cs, p.mscale);
  *s = __fmul_rn(pos < 0 ? -1.0f : 1.0f, __fmul_rn(sn, p.mscale));
}

/* Channel j of one head row (bf16 [head_dim]) rotated to pos (unchanged when not rotating). */
KQ_FN float kq_rope_bf16(const kq_params_t &p, const __nv_bfloat16 *row, int j, int pos) {
  int i, a, b;
  const int role = p.rotate ? kq_pair(p, j, &i, &a, &b) : -1;
  if (role < 0) return __bfloat162float(row[j]);
  float c, s;
  kq_cs(p, pos, i, &c, &s);
  const float x0 = __bfloat162float(row[a]), x1 = __bfloat162float(row[b]);
  return role ? __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c))
              : __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
}

/* ---- kernels ---- */

/* log2 of the codes a byte holds (8 / bits = 1, 2 or 4): code indices split by shifts and
 * masks, not divisions (an integer division is a subroutine call on the GPU). */
KQ_FN int kq_pshift(int bits) { return bits == 2 ? 2 : bits == 4 ? 1 : 0; }

/* Code e of a packed buffer. */
KQ_FN int kq_code_at(const uint8_t *codes, int e, int bits) {
  const int ps = kq_pshift(bits);
  return (codes[e >> ps] >> ((e & ((1 << ps) - 1)) * bits)) & ((1 << bits) - 1);
}

/* u / d for d > 0: a shift when d is a power of two (the head counts and head_dims that split
 * the tasks usually are), else the division (a subroutine on the GPU). */
KQ_FN unsigned kq_udiv(unsigned u, unsigned d) {
  return d & (d - 1) ? u / d : u >> (31 - KQ_CLZ(d));
}

/* u % d for d > 0 (kq_udiv's). */
KQ_FN unsigned kq_umod(unsigned u, unsigned d) { return u - kq_udiv(u, d) * d; }

/* Item x of a grid-stride loop as (job, item within the job), per items a job: in 32 bits while
 * x allows it (a 64-bit division is a longer subroutine). */
KQ_FN int kq_split(int64_t x, int per, int *item) {
  if (x < ((int64_t)1 << 31)) {
    const unsigned u = (unsigned)x, q = kq_udiv(u, (unsigned)per);
    *item = (int)(u - q * (unsigned)per);
    return (int)q;
  }
  const int64_t q = x / per;
  *item = (int)(x - q * per);
  return (int)q;
}

/* Channel j of rows 0 .. n - 1 (sanitized; turned back by RoPE at -(pos0 + t) when the keys
 * are turned) into xs[t * KQ_KW]. Keys as they are: four rows' loads in flight at once. */
KQ_FN void kq_stage_keys(const kq_params_t &p, const __nv_bfloat16 *kp, size_t row, int j, int pos0,
                         int n, float *xs) {
  if (p.rotate) {
    for (int t = 0; t < n; t++)
      xs[t * KQ_KW] = kq_san(kq_rope_bf16(p, kp + t * row, j, -(pos0 + t)));
    return;
  }
  for (int t0 = 0; t0 < n; t0 += 4) {
    __nv_bfloat16 v[4];
    for (int u = 0; u < 4; u++) v[u] = kp[(t0 + u < n ? t0 + u : t0) * row + j];
    for (int u = 0; u < 4 && t0 + u < n; u++) xs[(t0 + u) * KQ_KW] = kq_san(__bfloat162float(v[u]));
  }
}

/* One warp: (job, head h, channels 32 z .. 32 z + 31), kq_xs its [omega][KQ_KW] floats of
 * shared memory. Every lane takes part in the shuffles (lanes past head_dim with 0). */
KQ_DFN void kq_quant_keys_job(const kq_params_t &p, const kc_quant_job_t &jb, float *kq_xs, int h,
                              int z, int lane) {
  if (jb.n_tok <= 0) return; /* a window that got no ledger or page: nothing to move */
  const int j = z * KQ_KW + lane;
  const int n = jb.n_tok, live = j < p.hd, L = (1 << p.bits) - 1, per = 8 / p.bits;
  const int ps = kq_pshift(p.bits); /* per = 1 << ps */
  const size_t row = (size_t)p.n_kv * p.hd;
  const __nv_bfloat16 *kp = kq_ptr<const __nv_bfloat16>(p, jb.k) + (size_t)h * p.hd;
  kq_kgrp g = {kq_xs + lane, n};
  float zf = 0.0f, s = 1.0f;
  if (live) {
    kq_stage_keys(p, kp, row, j, jb.pos0, n, kq_xs + lane);
    uint16_t zh, sh;
    kq_choose(g, L, &zh, &sh);
    kq_ptr<uint16_t>(p, jb.k_scale)[h * p.hd + j] = sh;
    kq_ptr<uint16_t>(p, jb.k_zero)[h * p.hd + j] = zh;
    zf = kq_h2f_finite(zh), s = kq_h2f_finite(sh);
  }
  uint8_t *codes = kq_ptr<uint8_t>(p, jb.k_codes);
  for (int t = 0; t < n; t++) {
    unsigned v = live ? (unsigned)kq_code(g.at(t), zf, s, L) << ((lane & (per - 1)) * p.bits) : 0u;
    for (int o = 1; o < per; o <<= 1) v |= KQ_SHFL_XOR(v, o, lane);
    if (live && (lane & (per - 1)) == 0) codes[(t * (int)row + h * p.hd + j) >> ps] = (uint8_t)v;
  }
}

/* Jobs this launch covers: the device count when set (grid-stride over it), else n_jobs. */
KQ_FN int kq_njobs(const kq_params_t &p) {
  const int n = p.n_dev ? *p.n_dev : p.n_jobs;
  return n < p.n_jobs ? n : p.n_jobs;
}

/* Warps stride over the (job, head, 32-channel block) tasks, nz blocks a head row; kq_xs: the
 * block's [warps][omega][KQ_KW] floats of shared memory (column lane = channel j's keys). */
KQ_DFN void kq_quant_keys_body(const kq_params_t &p, int nz, float *kq_xs, const kq_thr_t &t) {
  const int nw = t.bd / KQ_KW, w = t.tx / KQ_KW;
  const int per = p.n_kv * nz;
  const int64_t total = kq_njobs(p) * (int64_t)per;
  float *xs = kq_xs + (size_t)w * p.omega * KQ_KW;
  for (int64_t x = (int64_t)t.bx * nw + w; x < total; x += (int64_t)t.gx * nw) {
    int rem;
    const int ji = kq_split(x, per, &rem), h = (int)kq_udiv((unsigned)rem, (unsigned)nz);
    kq_quant_keys_job(p, p.jobs[ji], xs, h, rem - h * nz, t.tx % KQ_KW);
    KQ_SYNCWARP();
  }
}

/* One value group (g: its values, any accessor): choose (z, s), write them and the group's code
 * bytes. */
template <class G>
KQ_DFN void kq_quant_vgroup(const kq_params_t &p, const kc_quant_job_t &jb, int gi, const G &g) {
  const int L = (1 << p.bits) - 1, per = 8 / p.bits, nb = p.group / per;
  const int base = gi * p.group; /* < 2^24 (kq_check_geom) */
  uint16_t zh, sh;
  kq_choose(g, L, &zh, &sh);
  kq_ptr<uint16_t>(p, jb.v_scale)[gi] = sh;
  kq_ptr<uint16_t>(p, jb.v_zero)[gi] = zh;
  const float z = kq_h2f_finite(zh), s = kq_h2f_finite(sh);
  uint8_t *out = kq_ptr<uint8_t>(p, jb.v_codes) + (base >> kq_pshift(p.bits));
  for (int b = 0; b < nb; b++) {
    unsigned v = 0;
    for (int k = 0; k < per; k++)
      v |= (unsigned)kq_code(g.at(b * per + k), z, s, L) << (k * p.bits);
    out[b] = (uint8_t)v;
  }
}

/* Stages a group of KQ_VSTAGE values (16-byte loads) as kq_vgrp reads them into column xs of a
 * [KQ_VSTAGE][KQ_VT] shared array, so that the group's passes read shared memory. */
KQ_FN kq_sgrp kq_stage_vgrp(const __nv_bfloat16 *src, float *xs) {
  for (int q = 0; q < KQ_VSTAGE / 8; q++) {
    union { /* (a union, not a cast of &w: the host compiler's aliasing rules, quant_emu) */
      uint4 v;
      __nv_bfloat16 h[8];
    } w;
    w.v = ((const uint4 *)src)[q];
    for (int i = 0; i < 8; i++) xs[(8 * q + i) * KQ_VT] = kq_san(__bfloat162float(w.h[i]));
  }
  return kq_sgrp{xs, KQ_VSTAGE, KQ_VT};
}

/* Threads stride over (job, group) pairs, a job's [omega][n_kv][head_dim / group] groups (those
 * of tokens >= n_tok skipped); groups of KQ_VSTAGE staged in xs, the block's [KQ_VSTAGE][KQ_VT]
 * floats of shared memory, first. */
KQ_DFN void kq_quant_values_body(const kq_params_t &p, float *xs, const kq_thr_t &t) {
  const int per = p.omega * p.n_kv * (p.hd / p.group);
  const int64_t total = kq_njobs(p) * (int64_t)per;
  for (int64_t x = (int64_t)t.bx * t.bd + t.tx; x < total; x += (int64_t)t.gx * t.bd) {
    int gi;
    const kc_quant_job_t jb = p.jobs[kq_split(x, per, &gi)];
    if (gi >= jb.n_tok * p.n_kv * (p.hd / p.group)) continue;
    const __nv_bfloat16 *src = kq_ptr<const __nv_bfloat16>(p, jb.v) + (size_t)gi * p.group;
    if (p.group == KQ_VSTAGE)
      kq_quant_vgroup(p, jb, gi, kq_stage_vgrp(src, xs + t.tx));
    else
      kq_quant_vgroup(p, jb, gi, kq_vgrp{src, p.group});
  }
}

/* Key element e (channel j) of a job: c * s + z, re-rotated to pos. */
KQ_FN float kq_dequant_key(const kq_params_t &p, const kc_quant_job_t &jb, int e, int j, int pos) {
  const uint8_t *codes = kq_ptr<const uint8_t>(p, jb.k_codes);
  const uint16_t *ks = kq_ptr<const uint16_t>(p, jb.k_scale),
                 *kz = kq_ptr<const uint16_t>(p, jb.k_zero);
  const int m = e % (p.n_kv * p.hd), e0 = e - j, m0 = m - j; /* meta index (h, j); row starts */
  int i, a, b;
  const int role = p.rotate ? kq_pair(p, j, &i, &a, &b) : -1;
  if (role < 0) return kq_recon(kq_code_at(codes, e, p.bits), kq_h2f(kz[m]), kq_h2f(ks[m]));
  const float x0 =
      kq_recon(kq_code_at(codes, e0 + a, p.bits), kq_h2f(kz[m0 + a]), kq_h2f(ks[m0 + a]));
  const float x1 =
      kq_recon(kq_code_at(codes, e0 + b, p.bits), kq_h2f(kz[m0 + b]), kq_h2f(ks[m0 + b]));
  float c, s;
  kq_cs(p, pos, i, &c, &s);
  return role ? __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c))
              : __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
}

/* Element e (of [n_tok][n_kv][head_dim]) of a job's K and V pages. */
KQ_DFN void kq_dequant_elem(const kq_params_t &p, const kc_quant_job_t &jb, int e) {
  const int row = p.n_kv * p.hd, j = e % p.hd, gv = e / p.group;
  const uint8_t *vc = kq_ptr<const uint8_t>(p, jb.v_codes);
  const uint16_t *vs = kq_ptr<const uint16_t>(p, jb.v_scale),
                 *vz = kq_ptr<const uint16_t>(p, jb.v_zero);
  kq_ptr<__nv_bfloat16>(p, jb.k)[e] =
      __float2bfloat16_rn(kq_dequant_key(p, jb, e, j, jb.pos0 + e / row));
  kq_ptr<__nv_bfloat16>(p, jb.v)[e] =
      __float2bfloat16_rn(kq_recon(kq_code_at(vc, e, p.bits), kq_h2f(vz[gv]), kq_h2f(vs[gv])));
}

/* The 8 codes of elements e0 .. e0 + 7 (e0 a multiple of 8: whole, aligned bytes). */
KQ_FN uint64_t kq_codes8(const uint8_t *codes, int e0, int bits) {
  const uint8_t *b = codes + (size_t)e0 * bits / 8;
  if (bits == 2) return *(const uint16_t *)b;
  if (bits == 4) return *(const uint32_t *)b;
  return *(const uint64_t *)b;
}

/* 8 bf16 of c * s + z, codes from w, scale and zero i from sc[i], zr[i] (fp16 bits). */
KQ_FN uint4 kq_recon8(uint64_t w, int bits, const uint16_t *sc, const uint16_t *zr) {
  uint32_t o[4];
  const int L = (1 << bits) - 1;
  for (int i = 0; i < 8; i += 2) {
    const __nv_bfloat16 a = __float2bfloat16_rn(
        kq_recon((int)(w >> (i * bits)) & L, kq_h2f_finite(zr[i]), kq_h2f_finite(sc[i])));
    const __nv_bfloat16 b = __float2bfloat16_rn(kq_recon(
        (int)(w >> ((i + 1) * bits)) & L, kq_h2f_finite(zr[i + 1]), kq_h2f_finite(sc[i + 1])));
    o[i / 2] = (uint32_t)__bfloat16_as_ushort(a) | (uint32_t)__bfloat16_as_ushort(b) << 16;
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

/* Elements e0 .. e0 + 7 of a job's K and V pages, keys not turned (head_dim % 8 == 0: the 8 are
 * channels of one head row, their key scales and zeros 16 contiguous bytes). */
KQ_DFN void kq_dequant_chunk(const kq_params_t &p, const kc_quant_job_t &jb, int e0) {
  const int m0 = (int)kq_umod((unsigned)e0, (unsigned)(p.n_kv * p.hd));
  union {
    uint4 v;
    uint16_t h[8];
  } ks, kz;
  ks.v = *(const uint4 *)(kq_ptr<const uint16_t>(p, jb.k_scale) + m0);
  kz.v = *(const uint4 *)(kq_ptr<const uint16_t>(p, jb.k_zero) + m0);
  *(uint4 *)(kq_ptr<__nv_bfloat16>(p, jb.k) + e0) =
      kq_recon8(kq_codes8(kq_ptr<const uint8_t>(p, jb.k_codes), e0, p.bits), p.bits, ks.h, kz.h);
  const uint16_t *vs = kq_ptr<const uint16_t>(p, jb.v_scale),
                 *vz = kq_ptr<const uint16_t>(p, jb.v_zero);
  uint16_t sc[8], zr[8];
  if (p.group % 8 == 0) { /* e0 % 8 == 0: the 8 share one group, one load each */
    const unsigned gi = kq_udiv((unsigned)e0, (unsigned)p.group);
    const uint16_t s1 = vs[gi], z1 = vz[gi];
    for (int i = 0; i < 8; i++) sc[i] = s1, zr[i] = z1;
  } else {
    for (int i = 0; i < 8; i++) sc[i] = vs[(e0 + i) / p.group], zr[i] = vz[(e0 + i) / p.group];
  }
  *(uint4 *)(kq_ptr<__nv_bfloat16>(p, jb.v) + e0) =
      kq_recon8(kq_codes8(kq_ptr<const uint8_t>(p, jb.v_codes), e0, p.bits), p.bits, sc, zr);
}

/* Threads stride over (job, item) pairs: items of `step` elements (8: kq_dequant_chunk; 1:
 * kq_dequant_elem) of a job's [omega][n_kv][head_dim] (those of tokens >= n_tok skipped). */
KQ_DFN void kq_dequant_body(const kq_params_t &p, int step, const kq_thr_t &t) {
  const int per = p.omega * p.n_kv * p.hd / step;
  const int64_t total = kq_njobs(p) * (int64_t)per;
  for (int64_t x = (int64_t)t.bx * t.bd + t.tx; x < total; x += (int64_t)t.gx * t.bd) {
    int e;
    const kc_quant_job_t jb = p.jobs[kq_split(x, per, &e)];
    e *= step;
    if (e >= jb.n_tok * p.n_kv * p.hd) continue;
    if (step == 8)
      kq_dequant_chunk(p, jb, e);
    else
      kq_dequant_elem(p, jb, e);
  }
}

/* Element e (channel j) of a window's mean pre-RoPE key (cache/kv_tiered_route.c's mean_key):
 * FULL keys un-rotated (RoPE at -position), QUANT keys dequantized, summed in token order in
 * fp32, divided by n_tok; 0 for an evicted or empty window. */
KQ_FN float kq_mean_key(const kq_params_t &p, const kern_pwin_t &d, int e, int j) {
  const int row = p.n_kv * p.hd;
  float s = 0.0f;
  if (d.n_tok <= 0 || (d.tier != KERN_PW_FULL && d.tier != KERN_PW_QUANT)) return 0.0f;
  if (d.tier == KERN_PW_FULL) {
    const __nv_bfloat16 *kp = kq_ptr<const __nv_bfloat16>(p, d.k) + (e - j);
    for (int t = 0; t < d.n_tok; t++)
      s = __fadd_rn(s, kq_rope_bf16(p, kp + (size_t)t * row, j, -(d.pos0 + t)));
  } else { /* post-RoPE ledger keys are un-rotated as kq_dequant_key re-rotates pre-RoPE ones */
    kc_quant_job_t jb;
    jb.k_codes = d.k, jb.k_scale = d.k_scale, jb.k_zero = d.k_zero;
    kq_params_t q = p;
    q.rotate = p.rotate && p.post_rope;
    for (int t = 0; t < d.n_tok; t++)
      s = __fadd_rn(s, kq_dequant_key(q, jb, t * row + e, j, -(d.pos0 + t)));
  }
  return __fdiv_rn(s, (float)d.n_tok);
}

/* ---- kernels ---- */

#ifndef KQ_EMU
#define KQ_THR() (kq_thr_t{(int)blockIdx.x, (int)gridDim.x, (int)threadIdx.x, (int)blockDim.x})

__global__ void kq_quant_keys_k(const kq_params_t p, int nz) {
  extern __shared__ float kq_xs[]; /* [warps][omega][KQ_KW] */
  kq_quant_keys_body(p, nz, kq_xs, KQ_THR());
}

__global__ void __launch_bounds__(KQ_VT) kq_quant_values_k(const kq_params_t p) {
  __shared__ float xs[KQ_VSTAGE * KQ_VT];
  kq_quant_values_body(p, xs, KQ_THR());
}

__global__ void kq_dequant_k(const kq_params_t p, int step) { kq_dequant_body(p, step, KQ_THR()); }

/* Grid (x: strides over group g's n[g] * row elements, y: g). */
__global__ void kq_mean_keys_k(const kq_params_t p, const kern_pwin_t *win, const int32_t *n,
                               int stride, float *out) {
  const int g = blockIdx.y, row = p.n_kv * p.hd;
  const int64_t total = (int64_t)n[g] * row;
  for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < total;
       x += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = x / row;
    const int e = (int)(x % row);
    out[((int64_t)g * stride + k) * row + e] =
        kq_mean_key(p, win[(int64_t)g * stride + k], e, e % p.hd);
  }
}

#else
/* tests/kernels/quant_emu.cu: runs body(bx, tx, smem) for every block bx < grid, its `block`
 * threads as fibers sharing smem floats of shared memory. 0, or -1 on a deadlock. */
int kq_emu_grid(unsigned grid, int block, size_t smem,
                const std::function<void(int, int, float *)> &body);
#endif

/* ---- host side ---- */

static int kq_check_geom(const kern_paged_geom_t *g) {
  if (g->n_kv < 1 || g->n_kv > 65535)
    return qe_errf(QE_EINVAL, "kc_quant: n_kv must be in 1..65535 (got %d)", g->n_kv);
  if (g->omega < 1 || g->omega > 1024)
    return qe_errf(QE_EINVAL, "kc_quant: omega must be in 1..1024 (got %d)", g->omega);
  if (g->bits != 2 && g->bits != 4 && g->bits != 8)
    return qe_errf(QE_EINVAL, "kc_quant: bits must be 2, 4 or 8 (got %d)", g->bits);
  if (g->head_dim < 1 || g->head_dim * g->bits % 8 != 0)
    return qe_errf(QE_EINVAL, "kc_quant: head_dim * bits must be a positive multiple of 8 (got %d)",
                   g->head_dim);
  if (g->group < 1 || g->head_dim % g->group != 0 || g->group * g->bits % 8 != 0)
    return qe_errf(QE_EINVAL,
                   "kc_quant: group must divide head_dim %d, group * bits a multiple of 8 (got %d)",
                   g->head_dim, g->group);
  if ((int64_t)g->omega * g->n_kv * g->head_dim > ((int64_t)1 << 24))
    return qe_errf(QE_EINVAL, "kc_quant: omega * n_kv * head_dim beyond 2^24");
  return 0;
}

static int kq_check_rope(const kc_attn_rope_t *r, int hd) {
  if (r->mode != KERN_ROPE_NORM && r->mode != KERN_ROPE_NEOX)
    return qe_errf(QE_EINVAL, "kc_quant: rope.mode must be NORM or NEOX (got %d)", r->mode);
  if (r->n_rot < 2 || r->n_rot > hd || r->n_rot % 2 != 0)
    return qe_errf(QE_EINVAL, "kc_quant: rope.n_rot must be even, in 2..%d (got %d)", hd, r->n_rot);
  if (!r->table) return qe_errf(QE_EINVAL, "kc_quant: rope.table is NULL");
  return 0;
}

extern "C" int kc_quant_check(const kc_quant_args_t *a) {
  if (!a) return qe_errf(QE_EINVAL, "kc_quant: no arguments");
  int rc = kq_check_geom(&a->geom);
  if (rc) return rc;
  if (a->n_jobs < 0 || (a->n_jobs > 0 && !a->jobs))
    return qe_errf(QE_EINVAL, "kc_quant: n_jobs %d with jobs %s", a->n_jobs,
                   a->jobs ? "set" : "NULL");
  if (a->rotate != 0 && a->rotate != 1)
    return qe_errf(QE_EINVAL, "kc_quant: rotate must be 0 or 1 (got %d)", a->rotate);
  if (a->post_rope != 0 && a->post_rope != 1)
    return qe_errf(QE_EINVAL, "kc_quant: post_rope must be 0 or 1 (got %d)", a->post_rope);
  return a->rotate ? kq_check_rope(&a->rope, a->geom.head_dim) : 0;
}

static size_t kq_align16(size_t n) { return (n + 15) & ~(size_t)15; }

extern "C" int kc_quant_ledger_layout(const kern_paged_geom_t *g, int n_tok,
                                      kc_quant_layout_t *out) {
  if (!g || !out) return qe_errf(QE_EINVAL, "kc_quant_ledger_layout: NULL argument");
  int rc = kq_check_geom(g);
  if (rc) return rc;
  if (n_tok < 1 || n_tok > g->omega)
    return qe_errf(QE_EINVAL, "kc_quant_ledger_layout: n_tok must be in 1..%d (got %d)", g->omega,
                   n_tok);
  kc_quant_layout_t l;
  l.codes_bytes = kern_paged_codes_bytes(g, n_tok);
  l.kmeta_bytes = kern_paged_kmeta_bytes(g);
  l.vmeta_bytes = kern_paged_vmeta_bytes(g, n_tok);
  l.k_codes = 0;
  l.k_scale = l.k_codes + kq_align16(l.codes_bytes);
  l.k_zero = l.k_scale + kq_align16(l.kmeta_bytes);
  l.v_codes = l.k_zero + kq_align16(l.kmeta_bytes);
  l.v_scale = l.v_codes + kq_align16(l.codes_bytes);
  l.v_zero = l.v_scale + kq_align16(l.vmeta_bytes);
  l.total = l.v_zero + kq_align16(l.vmeta_bytes);
  *out = l;
  return 0;
}

static kq_params_t kq_params(const kc_quant_args_t *a) {
  kq_params_t p;
  p.arena = (uintptr_t)a->arena;
  p.jobs = a->jobs;
  p.n_jobs = a->n_jobs;
  p.n_dev = a->n_jobs_dev;
  p.rope_tab = a->rope.table;
  p.n_kv = a->geom.n_kv;
  p.hd = a->geom.head_dim;
  p.bits = a->geom.bits;
  p.group = a->geom.group;
  p.omega = a->geom.omega;
  p.rotate = a->rotate && !a->post_rope; /* kc_mean_keys sets its own */
  p.post_rope = a->post_rope;
  p.mode = a->rope.mode;
  p.n_rot = a->rotate ? a->rope.n_rot : 0;
  p.yarn = a->rope.yarn;
  p.freq_scale = a->rope.freq_scale;
  p.mscale = a->rope.mscale;
  return p;
}

/* Blocks of a grid-stride launch over n_jobs * per items, `items` a block (the kernels read the
 * device count, at most n_jobs, and stride over what it leaves). */
static unsigned kq_blocks(const kc_quant_args_t *a, int64_t per, int items) {
  const int64_t b = ((int64_t)a->n_jobs * per + items - 1) / items;
  return (unsigned)(b < 1 ? 1 : b > KQ_GRID_MAX ? KQ_GRID_MAX : b);
}

extern "C" int kc_quant_windows(const kc_quant_args_t *a, void *stream) {
  int rc = kc_quant_check(a);
  if (rc || !a->n_jobs) return rc;
  const kq_params_t p = kq_params(a);
  const cudaStream_t st = (cudaStream_t)stream;
  const kern_paged_geom_t *g = &a->geom;
  const size_t col = (size_t)g->omega * KQ_KW * sizeof(float); /* one warp's staging */
  const int nw = col * KQ_KWARPS <= 48 * 1024 ? KQ_KWARPS : 1,
            nz = (g->head_dim + KQ_KW - 1) / KQ_KW;
  const size_t smem = col * (size_t)nw;
  const unsigned gk = kq_blocks(a, (int64_t)g->n_kv * nz, nw);
  const int64_t ng = (int64_t)g->omega * g->n_kv * (g->head_dim / g->group);
  const unsigned gv = kq_blocks(a, ng, KQ_VT);
#ifndef KQ_EMU
  if (smem > 48 * 1024 &&
      (rc = KQ_CUDA(cudaFuncSetAttribute(kq_quant_keys_k,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem))))
    return rc;
  kq_quant_keys_k<<<gk, nw * KQ_KW, smem, st>>>(p, nz);
  if ((rc = KQ_LAUNCHED())) return rc;
  kq_quant_values_k<<<gv, KQ_VT, 0, st>>>(p);
  return KQ_LAUNCHED();
#else
  (void)st;
  rc = kq_emu_grid(gk, nw * KQ_KW, smem / sizeof(float), [&](int bx, int tx, float *sm) {
    kq_quant_keys_body(p, nz, sm, kq_thr_t{bx, (int)gk, tx, nw * KQ_KW});
  });
  return rc ? rc : kq_emu_grid(gv, KQ_VT, KQ_VSTAGE * KQ_VT, [&](int bx, int tx, float *sm) {
    kq_quant_values_body(p, sm, kq_thr_t{bx, (int)gv, tx, KQ_VT});
  });
#endif
}

extern "C" int kc_dequant_windows(const kc_quant_args_t *a, void *stream) {
  int rc = kc_quant_check(a);
  if (rc || !a->n_jobs) return rc;
  const kq_params_t p = kq_params(a);
  const int step = !p.rotate && a->geom.head_dim % 8 == 0 ? 8 : 1;
  const int64_t per = (int64_t)a->geom.omega * a->geom.n_kv * a->geom.head_dim / step;
  const unsigned gd = kq_blocks(a, per, KQ_DT);
#ifndef KQ_EMU
  kq_dequant_k<<<gd, KQ_DT, 0, (cudaStream_t)stream>>>(p, step);
  return KQ_LAUNCHED();
#else
  (void)stream;
  return kq_emu_grid(gd, KQ_DT, 0, [&](int bx, int tx, float *) {
    kq_dequant_body(p, step, kq_thr_t{bx, (int)gd, tx, KQ_DT});
  });
#endif
}

extern "C" int kc_mean_keys(const kc_quant_args_t *a, const kern_pwin_t *win, const int32_t *n,
                            int n_groups, int stride, float *out, void *stream) {
  int rc = kc_quant_check(a);
  if (rc) return rc;
  if (n_groups < 0 || n_groups > 65535 || stride < 1 || (n_groups && (!win || !n || !out)))
    return qe_errf(QE_EINVAL, "kc_mean_keys: bad arguments (%d groups, stride %d)", n_groups,
                   stride);
  if (!n_groups) return 0;
  kq_params_t p = kq_params(a);
  p.rotate = a->rotate; /* FULL keys un-rotated (and post-RoPE ledger keys) */
  const int64_t per = (int64_t)stride * a->geom.n_kv * a->geom.head_dim;
  const unsigned gx =
      (unsigned)((per + KQ_DT - 1) / KQ_DT > 1024 ? 1024 : (per + KQ_DT - 1) / KQ_DT);
#ifndef KQ_EMU
  kq_mean_keys_k<<<dim3(gx, (unsigned)n_groups), KQ_DT, 0, (cudaStream_t)stream>>>(p, win, n,
                                                                                   stride, out);
  return KQ_LAUNCHED();
#else
  (void)p, (void)gx, (void)stream;
  return qe_errf(QE_EUNSUPPORTED, "kc_mean_keys: not emulated");
#endif
}
