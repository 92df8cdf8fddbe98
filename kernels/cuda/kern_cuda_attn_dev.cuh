/* kern_cuda_attn_dev: the device code of kern_cuda_attn (decode attention over tiered paged KV),
 * written against a thin layer of warp operations (loads, shuffles, votes, mma, fp16 pairs) so
 * that the same source compiles for the GPU and, with KCA_EMU defined, as host C++ that
 * tests/kernels/attn_emu.cu runs with one fiber per CUDA thread (CI checks the kernel's logic on
 * machines without a GPU). Included by kern_cuda_attn.cu and by that test only.
 *
 * Work split. The chunk kernel's block (chunk x, KV head y, sequence z) owns the windows
 * [seq_win[z] + x * chunk_win, ...) of that KV head; its KCA_NW warps take UNITS round-robin: one
 * window (omega a multiple of 16), two consecutive windows (omega == 8) or four (omega == 4),
 * skipping dead units with a ballot over 32 descriptors at a time. A warp walks its units in
 * TILES of 16 token rows, two HALVES of 8 rows each (tokens t0 .. t0 + 7 of one window; omega 4:
 * two windows a half, four live windows of one tier a tile, each tier of 32 walk positions in
 * turn, PK = 4), and keeps an online softmax for the group's query heads (G = n_head / n_kv <=
 * 8). The tiered pair kernels (omega 8, post-RoPE keys) instead list the chunk's attended windows
 * and deal the list's tiles to the warps in turn (KCA_LIST): FULL pairs, then INT2 quads of four
 * windows, two pairs in one stage (KCA_QUAD); at G <= 4 the quad kernels use the mma's padding
 * columns for each pair's second window and fold the INT2 key scales into Q (KCA_G4, see
 * kca_g4) and read a quad's descriptors from a ring in shared memory (KCA_DRING4). Each warp
 * runs a two-stage cp.async pipeline:
 * tile i + 1's bytes (FULL rows, or QUANT codes and metadata) stream into its shared-memory stage
 * while tile i is computed from the other, so no register holds data in flight.
 *
 * Tensor-core layout (mma.m16n8k16 for Q.K, m16n8k8 for P.V, fp32 accumulation). Lane
 * (g = lane / 4, c = lane % 4):
 *   S = Q K^T per half: A = Q (rows = heads, g < G valid), B = K^T (column g = the half's token
 *     g). Dot products do not care about channel order, so lane c takes the 16-byte channel
 *     chunks c, c + 4, c + 8, ... of a row and Q is packed in the same order. Its result
 *     c0, c1 = S[head g][tokens 2c, 2c + 1].
 *   O^T += V^T P^T per half: A = V^T (rows = channels), B = P^T, whose fragment (k = tokens
 *     2c, 2c + 1, n = head g) is exactly the lane's own S result. Lane (g, c) reads tokens 2c,
 *     2c + 1 (chunks g, g + 8) and pairs them with byte permutes. Accumulator j = 4u + r:
 *     O[head 2c, 2c + 1][d], O[head 2c, 2c + 1][d + 1], d = 8 (g + 8u) + 2r.
 * FULL-only kernels use bf16 operands; kernels that may meet QUANT windows use fp16 throughout
 * (FULL pages converted in registers): codes -> c * s + z with the scales and zeros as fp16
 * pairs; pre-RoPE keys turned by R(row offset), Q by R(window base)^T; post-RoPE keys
 * (ROT = KCA_ROT_ABS) not turned, so both halves of a tile share Q whatever their tiers.
 * Masses: per window and head, log2 sum 2^(s - m) + m (a window log-sum-exp) goes to wlse; the
 * combine kernel turns it into probability mass with the final log-sum-exp of each head.
 * A sequence whose windows form one chunk needs no combine: its blocks write their heads' outputs
 * and, with tickets, their KV head's share of each window's mass (kvmass); the last of its
 * n_kv blocks (an atomic ticket) sums the shares. kca_kv_mass fixes the order of every sum, so
 * both paths give the same bits. */
#ifndef QE_KERN_CUDA_ATTN_DEV_CUH
#define QE_KERN_CUDA_ATTN_DEV_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kern_cuda_attn.h"
#include "kern_paged.h"

#ifndef KCA_NW
#define KCA_NW 6 /* warps per chunk block: 2 blocks of 6 beat 3 of 4 (H200, 2026-12-01) */
#endif
#ifndef KCA_DREG /* PK 1: the next tile's descriptor in registers a tile ahead (1: the FullKV */
#define KCA_DREG 1 /* kernels, -1.2% on H200 2026-12-02; 2: every kernel, +2% on the tiered) */
#endif
#ifndef KCA_QLATE /* FULL-only kernels: Q loaded after the first tile's copies are issued */
#define KCA_QLATE 1 /* (-0.8%: FullKV 32K; late in the tiered kernels it cost +0.2% at long_ctx's
                       121 sequences, H100 2026-12-05, so they load it first) */
#endif
#ifndef KCA_PLAN
#define KCA_PLAN 1 /* the lanes' copy offsets computed once per block (kca_plan_t) */
#endif
#ifndef KCA_PMAGIC
#define KCA_PMAGIC 1 /* INT2 codes to fp16 without shifts (kca_c2h): -2% on post-RoPE tiered */
#endif
#ifndef KCA_LIST /* tiered pair kernels (post-RoPE, omega 8): warps walk a list of the chunk's */
#define KCA_LIST 1 /* attended windows, FULL ones first, tile j to warp j % KCA_NW (kca_list_build) */
#endif
#ifndef KCA_QUAD /* KCA_LIST kernels, INT2 at head_dim 128: an INT2 tile takes four windows (two */
#define KCA_QUAD 1 /* pairs in one stage, at 0 and kca_lay::qo of each half), one softmax step */
#endif
#ifndef KCA_G4 /* KCA_QUAD kernels at GQA <= 4: a pair's second window in the mma's padding */
#define KCA_G4 1  /* columns 4-7, INT2 key scales folded into the query (see kca_g4) */
#endif
#ifndef KCA_DRING4 /* KCA_G4: a quad's four descriptors copied into a ring in the warp's shared */
#define KCA_DRING4 1  /* memory two tiles ahead (kca_dfetch4), read from there at issue */
#endif
#ifndef KCA_DRINGF /* KCA_DRING4: a FULL pair's two descriptors through the ring too */
#define KCA_DRINGF 1
#endif
#ifndef KCA_DR0G /* KCA_DRING4: a walk's first tile reads its descriptors from global memory, */
#define KCA_DR0G 1 /* the next two come through the ring meanwhile (no wait before the walk) */
#endif
#define KCA_DRS4 256 /* a ring slot: a quad's four 64-byte descriptors */
#define KCA_DRB4 (4 * KCA_DRS4) /* a warp's ring: 4 slots */
#ifndef KCA_CPRE /* the combine loads its windows' rows before the heads' log-sum-exps */
#define KCA_CPRE 1
#endif
#ifndef KCA_COUT /* outputs a combine thread merges, at most (each one a chain of dependent loads) */
#define KCA_COUT 1
#endif
#ifndef KCA_LSEG
#define KCA_LSEG 4096 /* windows listed at a time (a longer chunk is walked in segments) */
#endif
#ifndef KCA_MINB
#define KCA_MINB 2 /* the chunk kernel's launch bound: resident blocks per multiprocessor */
#endif
#define KCA_NT     (KCA_NW * 32)
#define KCA_GMAX   8           /* query heads per KV head */
#define KCA_CT     256         /* combine threads per block */
#define KCA_MAGIC  0x64006400u /* fp16 pair (1024, 1024): code c reads as 1024 + c */
/* kca_c2h's magic for a field at bits POS: KCA_MAGIC's exponent lowered by POS */
#define KCA_MAG(pos) (KCA_MAGIC - ((uint32_t)(pos) << 10 | (uint32_t)(pos) << 26))
#define KCA_NEGINF (-__builtin_inff())

/* How QUANT keys are turned (the kernels' ROT parameter): pre-RoPE keys re-rotated with NORM or
 * NEOX RoPE, or post-RoPE keys (kc_attn_args_t.abs_keys) used as they are. */
enum { KCA_ROT_NORM = 0, KCA_ROT_NEOX = 1, KCA_ROT_ABS = 2 };

/* Kernel parameters (by value). Shapes: see kern_cuda_attn.h; partials are per chunk. */
typedef struct {
  const uint8_t *arena;
  const kern_pwin_t *win;  /* [n_win] */
  const int32_t *seq_win;  /* [n_seq + 1] */
  const int32_t *seq_nwin; /* [n_seq] or NULL (then seq_win[b + 1] ends sequence b) */
  const float *q;          /* [n_seq][n_head][hd] */
  float *out;              /* [n_seq][n_head][hd] */
  float *mass;             /* [n_win] or NULL */
  float *part_o;           /* [n_seq][n_chunk][n_head][hd], normalized per chunk */
  float *part_lse;         /* [n_seq][n_chunk][n_head], log2 domain */
  float *wlse;             /* [n_win][n_head] log2 domain, or NULL */
  float *kvmass;           /* [n_win][n_kv]: masses per KV head (single-chunk sequences) */
  uint32_t *tickets;       /* [n_seq]: KV-head blocks of a single-chunk sequence done, or NULL */
  const float *rope_tab;   /* [n_rot / 2][2]: freq, YaRN mix */
  const int32_t *cw_dev;   /* [1]: windows per chunk read at run time, or NULL (chunk_win) */
  int n_kv, n_head, grp_q; /* grp_q = n_head / n_kv */
  int omega, gshift, n_chunk, chunk_win, n_rot, yarn; /* gshift = log2(value group) */
  int mass_acc;                                       /* mass[w] += instead of = */
  int lead; /* the order word (kc_attn_lead): the windows the first half of a sequence's chunks
               take more (kca_chunk_beg), and KC_ATTN_SPREAD (kca_lfull); cw_dev: cw_dev[1]
               instead */
  int cmaj; /* the grid is (KV head, sequence, chunk): chunk-major block order (the order does
               not change the bits; the lead does) */
  uint32_t mags[5]; /* KCA_MAG(0, 2, 4, 6, 8), read from the parameters so that they stay
                       operands (mags[0] = KCA_MAGIC) */
  float qscale;   /* scale * log2(e) */
  float freq_scale, mscale;
} kca_params_t;

/* Windows per chunk of this launch: chunk_win, or the device value (CUDA graphs: the grid is
 * fixed for the bucket, the chunking follows the step). */
#define KCA_CHUNK_WIN(p) ((p).cw_dev ? *(p).cw_dev : (p).chunk_win)
/* The launch's order word: lead, or the device value (the step's eager word, so that a graph's
 * bits are the eager launch's whatever its grid order); its lead (kca_chunk_beg) and whether a
 * block's FULL tiles are spread among its quads (kca_lfull). */
#define KCA_ORDER(p)  ((p).cw_dev ? (p).cw_dev[1] : (p).lead)
#define KCA_LEAD(p)   (KCA_ORDER(p) & (KC_ATTN_SPREAD - 1))
#define KCA_SPREAD(p) ((KCA_ORDER(p) & KC_ATTN_SPREAD) != 0)

/* ---------------------------------------------------------------- the layer: GPU or host */

typedef struct {
  uint32_t v[4];
} kca_u4;

#ifndef KCA_EMU
#define KCA_FN      __device__ __forceinline__
#define KCA_UNROLL  _Pragma("unroll")
#define KCA_UNROLL1 _Pragma("unroll 1")
#define KCA_UNROLL4 _Pragma("unroll 4")

/* A cached 16-byte global load (descriptors). */
KCA_FN kca_u4 kca_ld128(const void *p) {
  kca_u4 r;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.v[0]), "=r"(r.v[1]), "=r"(r.v[2]), "=r"(r.v[3])
      : "l"(p));
  return r;
}
KCA_FN void kca_prefetch(const void *p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }
/* Cached 8- and 4-byte global loads (descriptor words). */
KCA_FN uint64_t kca_ld64(const void *p) {
  uint32_t lo, hi;
  asm("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(lo), "=r"(hi) : "l"(p));
  return (uint64_t)hi << 32 | lo;
}
KCA_FN uint32_t kca_ld32(const void *p) {
  uint32_t r;
  asm("ld.global.nc.u32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}
KCA_FN void kca_ldq8(const float *p, float *x) { /* 8 floats from 16-byte aligned p */
  const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

/* cp.async into shared memory (ok == 0: zero-fill), groups, and the wait for all but the
 * newest group. */
typedef uint32_t kca_sptr_t; /* a shared-memory address */
KCA_FN kca_sptr_t kca_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
KCA_FN int kca_pin(int x) { /* x computed here, once: the compiler may not rederive it in a loop */
  int r;
  asm("mov.b32 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}
KCA_FN kca_sptr_t kca_pin_s(kca_sptr_t a) { return (kca_sptr_t)kca_pin((int)a); }
/* KCA_L2HINT: the 16-byte copies' L2 prefetch size, 0 (none), 128 or 256 bytes (the default:
 * tiered 20% at 32K -4.5 to -4.8% on an H100, 2026-12-06, FullKV level; a KV head's INT2 code
 * row is 32 bytes of a 256-byte row of every head's, so one head's miss brings its neighbours'). */
#ifndef KCA_L2HINT
#define KCA_L2HINT 256
#endif
#if KCA_L2HINT == 256
#define KCA_CP16_OP "cp.async.cg.shared.global.L2::256B"
#elif KCA_L2HINT == 128
#define KCA_CP16_OP "cp.async.cg.shared.global.L2::128B"
#else
#define KCA_CP16_OP "cp.async.cg.shared.global"
#endif
KCA_FN void kca_cps16(kca_sptr_t d, const void *src, int ok) {
  asm volatile(KCA_CP16_OP " [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
KCA_FN void kca_cps8(kca_sptr_t d, const void *src, int ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(d), "l"(src), "r"(ok ? 8 : 0)
               : "memory");
}
KCA_FN void kca_cps4(kca_sptr_t d, const void *src, int ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(ok ? 4 : 0)
               : "memory");
}
KCA_FN void kca_cp16(void *dst, const void *src, int ok) { kca_cps16(kca_saddr(dst), src, ok); }
KCA_FN void kca_cp8(void *dst, const void *src, int ok) { kca_cps8(kca_saddr(dst), src, ok); }
KCA_FN void kca_cp4(void *dst, const void *src, int ok) { kca_cps4(kca_saddr(dst), src, ok); }
KCA_FN void kca_cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* A shared-memory load the compiler may not merge with another (keeps live ranges short). */
KCA_FN kca_u4 kca_sld128(const void *p) {
  kca_u4 r;
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.v[0]), "=r"(r.v[1]), "=r"(r.v[2]), "=r"(r.v[3])
               : "r"(a));
  return r;
}
KCA_FN void kca_cp_wait1(void) { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
KCA_FN void kca_cp_wait0(void) { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
/* The ticket of a block that is done (its earlier global writes made visible device-wide
 * first), a fence, and an L2 load (data other blocks wrote). */
KCA_FN uint32_t kca_ticket(uint32_t *t) {
  __threadfence();
  return atomicAdd(t, 1u);
}
KCA_FN void kca_fence(void) { __threadfence(); }
KCA_FN float kca_ldcg(const float *p) { return __ldcg(p); }
KCA_FN uint32_t kca_ballot(int pred) { return __ballot_sync(0xffffffffu, pred); }
KCA_FN int kca_ctz(uint32_t m) { return __ffs((int)m) - 1; }
KCA_FN int kca_popc(uint32_t m) { return __popc(m); }

KCA_FN float kca_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
KCA_FN float kca_shfl(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }
KCA_FN int kca_any(int pred) { return __any_sync(0xffffffffu, pred); }
KCA_FN void kca_syncwarp(void) { __syncwarp(); }
KCA_FN void kca_syncthreads(void) { __syncthreads(); }
/* The transpose of an 8x8 matrix of 16-bit elements in mma fragment layout (lane (g, c) holds
 * row g, columns 2c and 2c + 1): lane (g, c) gets row g of the transpose. */
KCA_FN uint32_t kca_movt(uint32_t x, int lane) {
  uint32_t d;
  (void)lane;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(x));
  return d;
}

/* d += A B: m16n8k16 (a0..a3, b0 b1) and m16n8k8 (a0 a1, b0), bf16 or fp16 operands. */
KCA_FN void kca_mma16_bf(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
KCA_FN void kca_mma16_h(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
KCA_FN void kca_mma8_bf(float *d, uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}
KCA_FN void kca_mma8_h(float *d, uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

/* fp16 pairs in a uint32 (low half = element 0). */
KCA_FN uint32_t kca_h2fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
KCA_FN uint32_t kca_h2mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
KCA_FN uint32_t kca_h2sub(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
template <uint32_t C> KCA_FN uint32_t kca_h2sub_c(uint32_t a) { /* a - C: C an immediate */
  uint32_t d;
  asm("{.reg .b32 t; mov.b32 t, %2; sub.rn.f16x2 %0, %1, t;}" : "=r"(d) : "r"(a), "n"(C));
  return d;
}
KCA_FN uint32_t kca_h2neg(uint32_t a) {
  uint32_t d;
  asm("neg.f16x2 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}
KCA_FN uint32_t kca_h2lo(uint32_t a) { /* (a.lo, a.lo): folds into an operand swizzle */
  uint32_t d;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {l, l};}" : "=r"(d) : "r"(a));
  return d;
}
KCA_FN uint32_t kca_h2hi(uint32_t a) {
  uint32_t d;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {h, h};}" : "=r"(d) : "r"(a));
  return d;
}
KCA_FN uint32_t kca_pack_h(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
KCA_FN uint32_t kca_pack_bf(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
KCA_FN uint32_t kca_prmt(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }
/* (x & M) | c in one LOP3 (c in a register: ptxas would split two immediates into two). */
template <uint32_t M> KCA_FN uint32_t kca_andor(uint32_t x, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(x), "n"(M), "r"(c));
  return d;
}
KCA_FN uint32_t kca_bf2h(uint32_t a) { /* bf16 pair -> fp16 pair */
  return kca_pack_h(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u));
}
KCA_FN float kca_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
KCA_FN float kca_lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
KCA_FN float kca_fmul(float a, float b) { return __fmul_rn(a, b); } /* never contracted */
KCA_FN float kca_fadd(float a, float b) { return __fadd_rn(a, b); }
KCA_FN void kca_sincos(float x, float *s, float *c) { sincosf(x, s, c); }
/* sin and cos of x (|x| < 2^19): 3-part Cody-Waite reduction by 2 pi, then the MUFU pair
 * (absolute error about 1e-6, far below the fp16 rounding of the tables). */
KCA_FN void kca_sincos_fast(float x, float *s, float *c) {
  const float k = rintf(x * 0.15915494309189535f);
  float r = fmaf(-k, 6.28125f, x);
  r = fmaf(-k, 1.9353071693331003e-3f, r);
  r = fmaf(-k, 1.0253131677018246e-11f, r);
  __sincosf(r, s, c);
}

#else /* KCA_EMU: host implementations; the warp operations live in the test's emulator */
#define KCA_FN static inline
#define KCA_UNROLL
#define KCA_UNROLL1
#define KCA_UNROLL4
#include <math.h>
#include <string.h>

#include "qe_half.h"

float kca_emu_shfl(float v, int lane_or_mask, int is_xor);
uint32_t kca_emu_shfl_u(uint32_t v, int lane);
int kca_emu_any(int pred);
uint32_t kca_emu_ballot(int pred);
void kca_emu_syncwarp(void);
void kca_emu_syncthreads(void);
/* d += A B for one lane; k = 16 or 8; f16: operands fp16 (else bf16). */
void kca_emu_mma(float *d, const uint32_t *a, const uint32_t *b, int k, int f16);

template <typename T> KCA_FN T kca_ldu(const void *p) { /* the loads below, any alignment */
  T r;
  memcpy(&r, p, sizeof r);
  return r;
}
KCA_FN kca_u4 kca_ld128(const void *p) { return kca_ldu<kca_u4>(p); }
KCA_FN void kca_prefetch(const void *p) { (void)p; }
KCA_FN uint64_t kca_ld64(const void *p) { return kca_ldu<uint64_t>(p); }
KCA_FN uint32_t kca_ld32(const void *p) { return kca_ldu<uint32_t>(p); }
KCA_FN void kca_ldq8(const float *p, float *x) { memcpy(x, p, 8 * sizeof *x); }
KCA_FN void kca_cp16(void *dst, const void *src, int ok) {
  if (ok)
    memcpy(dst, src, 16);
  else
    memset(dst, 0, 16);
}
KCA_FN void kca_cp8(void *dst, const void *src, int ok) {
  if (ok)
    memcpy(dst, src, 8);
  else
    memset(dst, 0, 8);
}
KCA_FN void kca_cp4(void *dst, const void *src, int ok) {
  if (ok)
    memcpy(dst, src, 4);
  else
    memset(dst, 0, 4);
}
typedef uint8_t *kca_sptr_t;
KCA_FN kca_sptr_t kca_saddr(const void *p) { return (uint8_t *)p; }
KCA_FN int kca_pin(int x) { return x; }
KCA_FN kca_sptr_t kca_pin_s(kca_sptr_t a) { return a; }
KCA_FN void kca_cps16(kca_sptr_t d, const void *src, int ok) { kca_cp16(d, src, ok); }
KCA_FN void kca_cps8(kca_sptr_t d, const void *src, int ok) { kca_cp8(d, src, ok); }
KCA_FN void kca_cps4(kca_sptr_t d, const void *src, int ok) { kca_cp4(d, src, ok); }
KCA_FN void kca_cp_commit(void) {}
KCA_FN kca_u4 kca_sld128(const void *p) {
  kca_u4 r;
  memcpy(r.v, p, 16);
  return r;
}
KCA_FN void kca_cp_wait1(void) {}
KCA_FN void kca_cp_wait0(void) {}
KCA_FN uint32_t kca_ticket(uint32_t *t) { return (*t)++; } /* blocks run one after another */
KCA_FN void kca_fence(void) {}
KCA_FN float kca_ldcg(const float *p) { return *p; }
KCA_FN uint32_t kca_ballot(int pred) { return kca_emu_ballot(pred); }
KCA_FN int kca_ctz(uint32_t m) { return __builtin_ctz(m); }
KCA_FN int kca_popc(uint32_t m) { return __builtin_popcount(m); }
KCA_FN float kca_shfl_xor(float v, int m) { return kca_emu_shfl(v, m, 1); }
KCA_FN float kca_shfl(float v, int src) { return kca_emu_shfl(v, src, 0); }
KCA_FN int kca_any(int pred) { return kca_emu_any(pred); }
KCA_FN void kca_syncwarp(void) { kca_emu_syncwarp(); }
KCA_FN void kca_syncthreads(void) { kca_emu_syncthreads(); }
KCA_FN uint32_t kca_prmt(uint32_t a, uint32_t b, uint32_t sel);
KCA_FN uint32_t kca_movt(uint32_t x, int lane) { /* element (2c + e, g) from lane 8c + 4e + g / 2 */
  const int g = lane >> 2, c = lane & 3;
  const uint32_t a = kca_emu_shfl_u(x, 8 * c + g / 2), b = kca_emu_shfl_u(x, 8 * c + 4 + g / 2);
  return kca_prmt(a, b, g & 1 ? 0x7632u : 0x5410u);
}
KCA_FN void kca_mma16_bf(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                         uint32_t b1) {
  uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  kca_emu_mma(d, a, b, 16, 0);
}
KCA_FN void kca_mma16_h(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                        uint32_t b1) {
  uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  kca_emu_mma(d, a, b, 16, 1);
}
KCA_FN void kca_mma8_bf(float *d, uint32_t a0, uint32_t a1, uint32_t b0) {
  uint32_t a[2] = {a0, a1}, b[1] = {b0};
  kca_emu_mma(d, a, b, 8, 0);
}
KCA_FN void kca_mma8_h(float *d, uint32_t a0, uint32_t a1, uint32_t b0) {
  uint32_t a[2] = {a0, a1}, b[1] = {b0};
  kca_emu_mma(d, a, b, 8, 1);
}
KCA_FN float kca__hf(uint32_t a, int hi) { return qe_half_to_f32((uint16_t)(hi ? a >> 16 : a)); }
KCA_FN uint32_t kca__h2(double lo, double hi) {
  return (uint32_t)qe_f32_to_half((float)lo) | (uint32_t)qe_f32_to_half((float)hi) << 16;
}
KCA_FN uint32_t kca_h2fma(uint32_t a, uint32_t b, uint32_t c) {
  return kca__h2((double)kca__hf(a, 0) * kca__hf(b, 0) + kca__hf(c, 0),
                 (double)kca__hf(a, 1) * kca__hf(b, 1) + kca__hf(c, 1));
}
KCA_FN uint32_t kca_h2mul(uint32_t a, uint32_t b) {
  return kca__h2((double)kca__hf(a, 0) * kca__hf(b, 0), (double)kca__hf(a, 1) * kca__hf(b, 1));
}
KCA_FN uint32_t kca_h2sub(uint32_t a, uint32_t b) {
  return kca__h2((double)kca__hf(a, 0) - kca__hf(b, 0), (double)kca__hf(a, 1) - kca__hf(b, 1));
}
KCA_FN uint32_t kca_h2neg(uint32_t a) { return a ^ 0x80008000u; }
template <uint32_t C> KCA_FN uint32_t kca_h2sub_c(uint32_t a) { return kca_h2sub(a, C); }
KCA_FN uint32_t kca_h2lo(uint32_t a) { return (a & 0xffffu) | (a << 16); }
KCA_FN uint32_t kca_h2hi(uint32_t a) { return (a >> 16) | (a & 0xffff0000u); }
KCA_FN uint32_t kca_pack_h(float lo, float hi) { return kca__h2(lo, hi); }
KCA_FN uint32_t kca__bf(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
KCA_FN uint32_t kca_pack_bf(float lo, float hi) { return kca__bf(lo) | kca__bf(hi) << 16; }
KCA_FN uint32_t kca_prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint64_t x = (uint64_t)b << 32 | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; i++)
    r |= (uint32_t)((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
template <uint32_t M> KCA_FN uint32_t kca_andor(uint32_t x, uint32_t c) { return (x & M) | c; }
KCA_FN uint32_t kca_bf2h(uint32_t a) {
  uint32_t lo = a << 16, hi = a & 0xffff0000u;
  float flo, fhi;
  memcpy(&flo, &lo, 4);
  memcpy(&fhi, &hi, 4);
  return kca_pack_h(flo, fhi);
}
KCA_FN float kca_ex2(float x) { return exp2f(x); }
KCA_FN float kca_lg2(float x) { return log2f(x); }
KCA_FN float kca_fmul(float a, float b) {
  volatile float r = a * b;
  return r;
}
KCA_FN float kca_fadd(float a, float b) {
  volatile float r = a + b;
  return r;
}
KCA_FN void kca_sincos(float x, float *s, float *c) {
  *s = sinf(x);
  *c = cosf(x);
}
KCA_FN void kca_sincos_fast(float x, float *s, float *c) {
  const float k = rintf(x * 0.15915494309189535f);
  float r = fmaf(-k, 6.28125f, x);
  r = fmaf(-k, 1.9353071693331003e-3f, r);
  r = fmaf(-k, 1.0253131677018246e-11f, r);
  *s = sinf(r);
  *c = cosf(r);
}
#endif

/* KCA_TRACE (diagnostics builds only): each chunk block stamps its SM clock at its start, when
 * its (first) list is built, each warp's first compute and walk end, and its end, plus the
 * global timer at its start and end, into kca_trace (kc_attn_trace_report reads them). */
#ifndef KCA_TRACE
#define KCA_TRACE 0
#endif
#define KCA_TR_N   (9 + 2 * KCA_NW) /* stamps a block: 0 start ns, 1 SM, 2 start, 3 list, 4 end, */
#define KCA_TR_MAX 65536 /* 5 end ns, 6 and 7: the list's tiers loaded and its scan done, 8: its
                            FULL and QUANT counts, 9 + w: warp w's first compute, 9 + KCA_NW + w:
                            its walk end */
#if KCA_TRACE && !defined(KCA_EMU)
static __device__ unsigned long long kca_trace[KCA_TR_MAX * KCA_TR_N];
KCA_FN void kca_tr(int slot, unsigned long long x = 0) {
  const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned long long v = clock64();
  if (slot == 0 || slot == 5) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  if (slot == 1) asm volatile("mov.u32 %0, %%smid;" : "=r"(*(unsigned *)&v));
  if (slot == 8) v = x;
  if (blk < KCA_TR_MAX) kca_trace[(size_t)blk * KCA_TR_N + slot] = v;
}
#else
#define kca_tr(...) ((void)0)
#endif

/* ---------------------------------------------------------------- small helpers */

/* One past sequence b's last window. */
KCA_FN int kca_seq_end(const kca_params_t &p, int b) {
  return p.seq_nwin ? p.seq_win[b] + p.seq_nwin[b] : p.seq_win[b + 1];
}

KCA_FN float kca_maxf(float a, float b) { return fmaxf(a, b); } /* one FMNMX */
KCA_FN int kca_mini(int a, int b) { return a < b ? a : b; }
KCA_FN int kca_clamp8(int x) { return x < 0 ? 0 : x > 8 ? 8 : x; }

/* One window, decoded: base pointers, position, tokens (0 when not live), tier. */
typedef struct {
  const uint8_t *k, *v, *ks, *kz, *vs, *vz;
  int pos0, n, quant;
} kca_win_t;

/* A window's 64-byte descriptor as loaded, before kca_win / kca_lwin decode it (the DREG walks'
 * register prefetch keeps these words in flight across a tile's work). */
typedef struct {
  kca_u4 a, b, c, e;
} kca_wraw_t;

KCA_FN kca_wraw_t kca_wraw(const kca_params_t &p, int w) {
  const uint8_t *d = (const uint8_t *)(p.win + w);
  return (kca_wraw_t){kca_ld128(d), kca_ld128(d + 16), kca_ld128(d + 32), kca_ld128(d + 48)};
}

KCA_FN kca_win_t kca_win_dec(const kca_params_t &p, const kca_wraw_t &W) {
  const kca_u4 a = W.a, b = W.b, c = W.c, e = W.e;
  kca_win_t r;
  r.k = p.arena + ((uint64_t)a.v[1] << 32 | a.v[0]);
  r.v = p.arena + ((uint64_t)a.v[3] << 32 | a.v[2]);
  r.ks = p.arena + ((uint64_t)b.v[1] << 32 | b.v[0]);
  r.kz = p.arena + ((uint64_t)b.v[3] << 32 | b.v[2]);
  r.vs = p.arena + ((uint64_t)c.v[1] << 32 | c.v[0]);
  r.vz = p.arena + ((uint64_t)c.v[3] << 32 | c.v[2]);
  const int tier = (int)e.v[2], ntok = (int)e.v[1];
  const int live = ntok > 0 && (tier == KERN_PW_FULL || tier == KERN_PW_QUANT);
  r.pos0 = (int)e.v[0];
  r.n = live ? kca_mini(ntok, p.omega) : 0;
  r.quant = tier == KERN_PW_QUANT;
  return r;
}

KCA_FN kca_win_t kca_win(const kca_params_t &p, int w) { return kca_win_dec(p, kca_wraw(p, w)); }

/* One window as one lane of a planned copy (kca_plan_t) reads it: only the three bases the lane
 * copies through. FULL: p0 = K page, p1 = V page; QUANT: p0 = the key codes (lanes 0-15) or
 * value codes (16-31), p1 = the key scales (lanes 0-15) or zeros (16-31), p2 = the value scales
 * (lanes with bit 3 clear) or zeros (set). Selected as 32-bit words before the arena is added.
 * !may_quant (FULL-only kernels): a QUANT window reads as not attended. */
typedef struct {
  const uint8_t *p0, *p1, *p2;
  int pos0, n, quant;
} kca_lwin_t;

KCA_FN const uint8_t *kca_at(const kca_params_t &p, uint32_t lo, uint32_t hi) {
  return p.arena + ((uint64_t)hi << 32 | lo);
}

KCA_FN kca_lwin_t kca_lwin_dec(const kca_params_t &p, const kca_wraw_t &W, int lane,
                               bool may_quant) {
  const kca_u4 a = W.a, b = W.b, c = W.c, e = W.e;
  const int tier = (int)e.v[2], ntok = (int)e.v[1];
  const bool q = may_quant && tier == KERN_PW_QUANT, hi = lane >> 4 & 1, z = lane >> 3 & 1;
  const bool live = ntok > 0 && (tier == KERN_PW_FULL || q);
  const uint32_t b0 = hi ? b.v[2] : b.v[0], b1 = hi ? b.v[3] : b.v[1];
  kca_lwin_t r;
  r.p0 = kca_at(p, q && hi ? a.v[2] : a.v[0], q && hi ? a.v[3] : a.v[1]);
  r.p1 = kca_at(p, q ? b0 : a.v[2], q ? b1 : a.v[3]);
  r.p2 = kca_at(p, z ? c.v[2] : c.v[0], z ? c.v[3] : c.v[1]);
  r.pos0 = (int)e.v[0];
  r.n = live ? kca_mini(ntok, p.omega) : 0;
  r.quant = q;
  return r;
}

KCA_FN kca_lwin_t kca_lwin(const kca_params_t &p, int w, int lane, bool may_quant) {
  return kca_lwin_dec(p, kca_wraw(p, w), lane, may_quant);
}

#ifndef KCA_QLEAN /* KCA_QUAD: a quad's windows read as QUANT (the list says so): each lane loads */
#define KCA_QLEAN 1  /* the three 8-byte words and the token count it uses, not 64 bytes (-2%) */
#endif
/* KCA_QLEAN: an attended QUANT window's descriptor at d (p.win + w; SM: its copy in shared
 * memory, KCA_DRING4) as kca_lwin reads it for the lane (pos0 not read). */
template <typename T, bool SM> KCA_FN T kca_dw(const uint8_t *d) {
  if constexpr (SM)
    return *(const T *)d;
  else if constexpr (sizeof(T) == 8)
    return kca_ld64(d);
  else
    return kca_ld32(d);
}
/* KCA_DRINGF: an attended FULL window's descriptor at d (in the warp's ring) as kca_lwin reads
 * it for the lane (pos0 not read: list kernels keep post-RoPE keys). */
KCA_FN kca_lwin_t kca_lwin_f(const kca_params_t &p, const uint8_t *d) {
  kca_lwin_t r;
  r.p0 = p.arena + kca_dw<uint64_t, true>(d), r.p1 = p.arena + kca_dw<uint64_t, true>(d + 8);
  r.p2 = r.p0, r.pos0 = 0, r.n = kca_mini((int)kca_dw<uint32_t, true>(d + 52), p.omega);
  r.quant = 0;
  return r;
}
template <bool SM = false> KCA_FN kca_lwin_t kca_lwin_q(const kca_params_t &p, const uint8_t *d,
                                                       int lane) {
  const int hi = lane >> 4 & 1, z = lane >> 3 & 1;
  const uint64_t a = kca_dw<uint64_t, SM>(d + 8 * hi), b = kca_dw<uint64_t, SM>(d + 16 + 8 * hi);
  const uint64_t c = kca_dw<uint64_t, SM>(d + 32 + 8 * z);
  kca_lwin_t r;
  r.p0 = p.arena + a, r.p1 = p.arena + b, r.p2 = p.arena + c;
  r.pos0 = 0, r.n = kca_mini((int)kca_dw<uint32_t, SM>(d + 52), p.omega), r.quant = 1;
  return r;
}

/* The window type of a kernel with (PL) or without a copy plan, and its decoding. */
template <bool PL> struct kca_wt {
  using T = kca_win_t;
};
template <> struct kca_wt<true> {
  using T = kca_lwin_t;
};
template <bool PL, int BITS>
KCA_FN typename kca_wt<PL>::T kca_getwin_dec(const kca_params_t &p, const kca_wraw_t &W, int lane) {
  if constexpr (PL)
    return kca_lwin_dec(p, W, lane, BITS != 0);
  else
    return kca_win_dec(p, W);
}
template <bool PL, int BITS>
KCA_FN typename kca_wt<PL>::T kca_getwin(const kca_params_t &p, int w, int lane) {
  return kca_getwin_dec<PL, BITS>(p, kca_wraw(p, w), lane);
}

/* 1 when window w is attended (kca_win's n > 0, from its last 16 bytes only). */
KCA_FN int kca_win_live(const kca_params_t &p, int w) {
  const kca_u4 e = kca_ld128((const uint8_t *)(p.win + w) + 48);
  const int tier = (int)e.v[2];
  return (int)e.v[1] > 0 && (tier == KERN_PW_FULL || tier == KERN_PW_QUANT);
}

/* Window w's tier, KERN_PW_EVICTED when it is not attended (from its last 16 bytes only). */
KCA_FN int kca_win_tier(const kca_params_t &p, int w) {
  const kca_u4 e = kca_ld128((const uint8_t *)(p.win + w) + 48);
  const int tier = (int)e.v[2];
  return (int)e.v[1] > 0 && (tier == KERN_PW_FULL || tier == KERN_PW_QUANT) ? tier
                                                                            : KERN_PW_EVICTED;
}

/* Window w's probability mass summed over the heads of KV head kvh (lse: their final
 * log-sum-exps, -inf for a head without any): the one order of these sums for both paths. */
KCA_FN float kca_kv_mass(const kca_params_t &p, int w, int kvh, const float (&lse)[KCA_GMAX]) {
  const float *wl = p.wlse + (size_t)w * p.n_head + kvh * p.grp_q;
  float s = 0.0f;
  KCA_UNROLL
  for (int hh = 0; hh < KCA_GMAX; hh++)
    if (hh < p.grp_q && lse[hh] != KCA_NEGINF) s += kca_ex2(wl[hh] - lse[hh]);
  return s;
}

/* 1 when sequence b is skipped (seq_nwin[b] < 0): another launch owns its outputs. */
KCA_FN bool kca_seq_skipped(const kca_params_t &p, int b) { return p.seq_nwin && p.seq_nwin[b] < 0; }

/* Chunks of sequence b at the launch's chunk size, and whether it is done without the combine
 * (at most one chunk, and its masses, if any, summed through the tickets). */
KCA_FN int kca_seq_chunks(const kca_params_t &p, int b) {
  const int cw = KCA_CHUNK_WIN(p);
  return (kca_seq_end(p, b) - p.seq_win[b] + cw - 1) / cw;
}
/* First window of chunk c of sequence b: c chunks of KCA_CHUNK_WIN(p) windows, shifted by
 * lead * min(c, nc - c) for c < nc (lead: KCA_LEAD(p); nc: the sequence's chunks) when the
 * sequence's last chunk has more than lead windows. So with a lead the first half of the chunks
 * take lead windows more each and the second half lead less: in a chunk-major grid of one wave
 * the first half are the blocks that the block scheduler places first, and a multiprocessor's
 * warp scheduler favours its older block (kca_lead_pm). Past the sequence's chunks: c chunks,
 * unshifted. */
KCA_FN int kca_chunk_beg(const kca_params_t &p, int b, int c) {
  const int cw = KCA_CHUNK_WIN(p), n = kca_seq_end(p, b) - p.seq_win[b];
  const int nc = (n + cw - 1) / cw, lead = KCA_LEAD(p);
  const bool led = lead > 0 && c < nc && n - (nc - 1) * cw > lead;
  return p.seq_win[b] + c * cw + (led ? lead * kca_mini(c, nc - c) : 0);
}
KCA_FN bool kca_seq_alone(const kca_params_t &p, int b) {
  return kca_seq_chunks(p, b) <= 1 && (!p.mass || p.tickets);
}

/* RoPE angle of pair i at position pos: the CPU formula (kern_cpu_attn.c, rope_cs). */
KCA_FN float kca_theta(const kca_params_t &p, int pos, int i) {
  const float freq = p.rope_tab[2 * i], extrap = kca_fmul((float)pos, freq);
  float theta = kca_fmul(extrap, p.freq_scale);
  if (p.yarn) {
    const float mix = p.rope_tab[2 * i + 1];
    theta = kca_fadd(kca_fmul(theta, kca_fadd(1.0f, -mix)), kca_fmul(extrap, mix));
  }
  return theta;
}

/* cos and sin of pair i at pos, times ms; the identity for pairs past n_rot. fast: the MUFU
 * path (base positions, any size below 2^19), else libm-accurate sincosf (row offsets). */
KCA_FN void kca_cs(const kca_params_t &p, int pos, int i, float ms, int fast, float *c, float *s) {
  if (2 * i >= p.n_rot) {
    *c = 1.0f, *s = 0.0f;
    return;
  }
  if (fast)
    kca_sincos_fast(kca_theta(p, pos, i), s, c);
  else
    kca_sincos(kca_theta(p, pos, i), s, c);
  *c *= ms, *s *= ms;
}

/* Rotation entry of slot j (channels 2j, 2j + 1) at pos: NORM (A, B) = ([c, s], [-s, c]) of
 * pair j; NEOX ([c_2j, c_2j+1], [s_2j, s_2j+1]) for the x half (j < hd / 4). tr: the transposed
 * rotation R^T (the angle negated). */
template <bool NEOX>
KCA_FN void kca_rot_entry(const kca_params_t &p, int pos, int j, float ms, int tr, uint32_t *A,
                          uint32_t *B) {
  float c0, s0, c1, s1;
  if (!NEOX) {
    kca_cs(p, pos, j, ms, tr, &c0, &s0);
    s0 = tr ? -s0 : s0;
    *A = kca_pack_h(c0, s0);
    *B = kca_pack_h(-s0, c0);
  } else {
    kca_cs(p, pos, 2 * j, ms, tr, &c0, &s0);
    kca_cs(p, pos, 2 * j + 1, ms, tr, &c1, &s1);
    *A = kca_pack_h(c0, c1);
    *B = tr ? kca_pack_h(-s0, -s1) : kca_pack_h(s0, s1);
  }
}

/* ---------------------------------------------------------------- shared memory */

/* Dynamic shared memory of a chunk block (byte offsets):
 *   stages [KCA_NW][2 stages][2 halves][32 HD]: one half tile's bytes, written by cp.async.
 *          FULL:  K rows [8][HD] bf16 at 0 (16-byte chunk ch of row r stored at ch ^ 4 (r & 1)),
 *                 V rows [8][HD] bf16 at 16 HD (chunk ch of row r at ch ^ (r & 6)): both
 *                 swizzles make the fragment reads conflict-free;
 *          QUANT: key codes [8][HD BITS / 8] at 0, value codes at vc, key scales then zeros
 *                 ([HD] fp16 each) at km, value scales [8][ng] then zeros at vm.
 *   ml     [KCA_NW][KCA_GMAX][2] floats, the warps' max and sum (epilogue)
 *   flag   one int: the block is its sequence's last (kca_alone_masses)
 *   (rotless: the end for kernels that turn no key, FULL-only and post-RoPE)
 *   off    QUANT: [16][HD + 4] words, the rotation by row offsets 0..15 (kca_off_init)
 *   base   QUANT: [KCA_NW][HD] words, each warp's rotation by its tile's base position
 *   lst    (at rotless, instead of off and base) KCA_LIST kernels: kca_lst_t
 *   ring   (after lst) KCA_G4 kernels with KCA_DRING4: [KCA_NW][4 slots][4 windows][64] bytes,
 *          the descriptors of each warp's quads and FULL pairs, copied two tiles ahead
 * The epilogue's per-warp outputs [KCA_NW][KCA_GMAX][HD] floats reuse the stage area. */
#define KCA_LG  (KCA_LSEG / 32)  /* groups of 32 windows a segment */
static_assert(KCA_LSEG <= 16384, "kca_lfull's float steps hold up to 19,632 tiles a segment");
#define KCA_LGL ((KCA_LG + 31) / 32) /* groups a lane of the list's scan */
typedef struct {
  uint32_t mf[KCA_LG], mq[KCA_LG]; /* a group's FULL and QUANT windows (bit i: window 32 q + i) */
  uint32_t pre[KCA_LG];            /* FULL | QUANT windows of the groups before it << 16 */
  int nf, nq, pad[2];              /* attended windows of the segment by tier */
  uint16_t ent[KCA_LSEG];          /* FULL windows then QUANT ones, in position order: offsets */
} kca_lst_t;

template <int HD, int BITS> struct kca_lay {
  static constexpr int half = 32 * HD;
  static constexpr int stage = 2 * half;
  static constexpr int warp = 2 * stage;
  static constexpr int ml = KCA_NW * warp;
  static constexpr int flag = ml + KCA_NW * KCA_GMAX * 2 * 4;
  static constexpr int rotless = flag + 16;
  static constexpr int lst = rotless; /* KCA_LIST kernels (post-RoPE: no off or base): the list */
  static constexpr int listed = lst + (BITS ? (int)sizeof(kca_lst_t) : 0);
  static constexpr int ring = listed; /* KCA_DRING4: the warps' descriptor rings */
  static constexpr int ringed = ring + (KCA_DRING4 ? KCA_NW * KCA_DRB4 : 0);
  static constexpr int off = rotless;
  static constexpr int base = off + (BITS ? 16 * (HD + 4) * 4 : 0);
  static constexpr int total = base + (BITS ? KCA_NW * HD * 4 : 0);
  static constexpr int rb = HD * (BITS ? BITS : 2) / 8; /* code bytes per row */
  static constexpr int vc = 8 * rb, km = 16 * rb, vm = 16 * rb + 4 * HD;
  static constexpr int km2 = vm + 16 * 16 * 2; /* PK 4: the key metadata of the half's rows 4-7 */
  static constexpr int qo = half / 2; /* KCA_QUAD: the second pair's offset in each half */
  static_assert(km2 + 4 * HD <= half, "a QUANT half tile fits its stage");
  static_assert(!(HD == 128 && BITS == 2) || vm + 16 * 32 <= qo, "two INT2 windows fit a half");
  static_assert(KCA_NW * KCA_GMAX * HD * 4 <= ml, "the epilogue fits the stage area");
};

/* ---------------------------------------------------------------- per-warp state */

template <int HD, int BITS> struct kca_st_t {
  float acc[HD / 16][4];  /* O^T accumulators (see the file comment) */
  uint32_t q[HD / 32][4]; /* Q pairs of head g, chunks c + 4i: bf16 (BITS 0) or fp16 */
  float m[2];             /* running max of heads 2c, 2c + 1 (log2 units) */
  float l[2];             /* this lane's part of their denominators */
};

/* One tile: two halves of 8 rows (tokens t0 .. t0 + 7 of a window, n of them valid), packed to
 * keep the two live tiles of the pipeline in few registers. */
typedef struct {
  int w[2];    /* the halves' windows (omega >= 16: both the same) */
  int base[2]; /* their RoPE base positions */
  int bits;    /* n0 | n1 << 4 | quant0 << 8 | quant1 << 9 | last << 10 (ends its window) */
} kca_tile_t;

/* Tokens of half h < 4 (KCA_QUAD: a quad's halves 2 and 3 at bits 12 and 16; its windows are w[0],
 * w[1], base[0], base[1], and bit 11 marks it). */
KCA_FN int kca_tn(const kca_tile_t &t, int h) {
  return (t.bits >> (h < 2 ? 4 * h : 4 * h + 4)) & 15;
}
KCA_FN bool kca_is_quad(const kca_tile_t &t) { return t.bits >> 11 & 1; }
KCA_FN int kca_tq(const kca_tile_t &t, int h) { return (t.bits >> (8 + h)) & 1; }

/* Probabilities of a tile of NH halves: p[2 half + e] of token g of the half, head 2c + e, and
 * the factors the running sums of heads 2c, 2c + 1 were rescaled by. */
template <int NH> struct kca_tpn {
  float p[2 * NH];
  float alpha[2];
};
using kca_tp_t = kca_tpn<2>;

/* The warp's position in its units (u = warp + k * KCA_NW) and the units' liveness. */
typedef struct {
  int k, j; /* wide windows: unit index (-1: done) and tile within it; PAIR: the positions of
               the tile's two windows in the warp's sequence (j -1: none) */
} kca_cur_t;

typedef struct {
  int nk, kbase;
  uint32_t mask;  /* live units kbase .. kbase + 31 (PK 4: the FULL ones) */
  uint32_t qmask; /* PK 4: the QUANT ones */
  int c_end;
  int wbase; /* the chunk's first window + PK warp, pinned: the warp's first walk position's
               (KCA_LIST: the segment's first window) */
  const uint16_t *ent; /* KCA_LIST: the segment's list entries (kca_lst_t) */
  int nf, nl;          /* KCA_LIST: its FULL entries, and all of them */
  int tf, jt;          /* KCA_LIST: its FULL tiles, and the warp's last tile handed out */
  float fr;            /* KCA_LIST: FULL tiles first (< 0), or spread among the quads, one
                          FULL tile every 1 / fr tiles (kca_lfull) */
} kca_live_t;

/* ---------------------------------------------------------------- code unpacking */

/* K chunk (8 channels of one row; codes 2r, 2r + 1 -> fp16 pair 1024 + c); mg = KCA_MAGIC. */
template <int BITS>
KCA_FN uint32_t kca_kpair(uint32_t w0, uint32_t w1, uint32_t w0s, int r, uint32_t mg) {
  if (BITS == 2) return kca_andor<0x00030003u>(w0s >> (4 * r), mg); /* w0s = w | w << 14 */
  if (BITS == 4) /* w0s = w >> 4: byte r of w (code 2r) and of w >> 4 (code 2r + 1) */
    return kca_andor<0x000f000fu>(kca_prmt(w0, w0s, (uint32_t)(r | (4 + r) << 8)), mg);
  const uint32_t w = r < 2 ? w0 : w1, b = (uint32_t)(2 * (r & 1));
  return kca_prmt(w, 0x64646464u, b | 4u << 4 | (b + 1) << 8 | 4u << 12);
}

/* V chunks of tokens x and y: code k of both -> fp16 pair (1024 + c_x, 1024 + c_y). */
template <int BITS>
KCA_FN uint32_t kca_vpair(uint32_t x0, uint32_t x1, uint32_t y0, uint32_t y1, uint32_t zlo,
                          uint32_t zhi, int k, uint32_t mg) {
  if (BITS == 2) return kca_andor<0x00030003u>(zlo >> (2 * k), mg); /* zlo: x | y << 16 */
  if (BITS == 4) return kca_andor<0x000f000fu>((k < 4 ? zlo : zhi) >> (4 * (k & 3)), mg);
  const uint32_t xw = k < 4 ? x0 : x1, yw = k < 4 ? y0 : y1, b = (uint32_t)(k & 3);
  return kca_andor<0x00ff00ffu>(kca_prmt(xw, yw, b | (4 + b) << 8), mg);
}

/* KCA_PMAGIC: the INT2 codes at bits POS, POS + 1 of both halves of w (POS <= 8) as the fp16 pair
 * (c, c) without a shift: with the exponent of 2^(10 - POS) (mg: KCA_MAGIC's, moved) the field is
 * the integer above that power, which the subtraction takes off exactly. */
template <int POS> KCA_FN uint32_t kca_c2h(uint32_t w, const kca_params_t &p) {
  /* the OR's operand from the parameters (LOP3 holds one immediate), the subtraction's inline */
  return kca_h2sub_c<KCA_MAG(POS)>(kca_andor<0x00030003u << POS>(w, p.mags[POS / 2]));
}

/* One 8-channel chunk of codes (BITS bytes) from shared memory, as two words. */
template <int BITS> KCA_FN void kca_codes(const uint8_t *p, uint32_t *w0, uint32_t *w1) {
  *w1 = 0;
  if (BITS == 2) *w0 = *(const uint16_t *)p;
  if (BITS == 4) *w0 = *(const uint32_t *)p;
  if (BITS == 8) *w0 = ((const uint32_t *)p)[0], *w1 = ((const uint32_t *)p)[1];
}

/* ---------------------------------------------------------------- RoPE tables */

/* Block prologue (QUANT kernels): off[r][slot] for r = 0..15. */
template <int HD, bool NEOX>
KCA_FN void kca_off_init(const kca_params_t &p, uint32_t *off, int tid) {
  const int nslot = NEOX ? HD / 4 : HD / 2;
  for (int e = tid; e < 16 * nslot; e += KCA_NT) {
    const int r = e / nslot, j = e % nslot;
    kca_rot_entry<NEOX>(p, r, j, 1.0f, 0, &off[r * (HD + 4) + 2 * j],
                        &off[r * (HD + 4) + 2 * j + 1]);
  }
}

/* The warp's base table: R(pos)^T (applied to Q), mscale folded in. Syncs before and after. */
template <int HD, bool NEOX>
KCA_FN void kca_base_init(const kca_params_t &p, uint32_t *tab, int pos, int lane) {
  const int nslot = NEOX ? HD / 4 : HD / 2;
  kca_syncwarp();
  for (int j = lane; j < nslot; j += 32)
    kca_rot_entry<NEOX>(p, pos, j, p.mscale, 1, &tab[2 * j], &tab[2 * j + 1]);
  kca_syncwarp();
}

/* x <- R x for one NORM slot: [x0 c - x1 s, x0 s + x1 c]. */
KCA_FN uint32_t kca_rot_norm(uint32_t x, uint32_t A, uint32_t B) {
  return kca_h2fma(kca_h2lo(x), A, kca_h2mul(kca_h2hi(x), B));
}

/* (x, y) <- NEOX rotation of two channel pairs: x' = x C - y S, y' = x S + y C. */
KCA_FN void kca_rot_neox(uint32_t *x, uint32_t *y, uint32_t C, uint32_t S) {
  const uint32_t x0 = *x, y0 = *y;
  *x = kca_h2fma(x0, C, kca_h2mul(kca_h2neg(y0), S));
  *y = kca_h2fma(x0, S, kca_h2mul(y0, C));
}

/* qr <- R(base)^T q for the lane's Q fragments (head g, chunks c + 4i): the window's base
 * rotation moves to the query, so each key row only turns by its offset within the tile. */
template <int HD, bool NEOX>
KCA_FN void kca_rot_q(const uint32_t (&q)[HD / 32][4], const uint32_t *base, int c,
                      uint32_t (&qr)[HD / 32][4]) {
  KCA_UNROLL
  for (int i = 0; i < (NEOX ? HD / 64 : HD / 32); i++) {
    const int j0 = 4 * (c + 4 * i); /* first slot of chunk c + 4i */
    const kca_u4 b0 = *(const kca_u4 *)&base[2 * j0], b1 = *(const kca_u4 *)&base[2 * j0 + 4];
    const uint32_t ba[4] = {b0.v[0], b0.v[2], b1.v[0], b1.v[2]};
    const uint32_t bb[4] = {b0.v[1], b0.v[3], b1.v[1], b1.v[3]};
    KCA_UNROLL
    for (int r = 0; r < 4; r++) {
      if (!NEOX) {
        qr[i][r] = kca_rot_norm(q[i][r], ba[r], bb[r]);
      } else {
        uint32_t x = q[i][r], y = q[i + HD / 64][r];
        kca_rot_neox(&x, &y, ba[r], bb[r]);
        qr[i][r] = x, qr[i + HD / 64][r] = y;
      }
    }
  }
}

/* Window of the warp's k-th walk position: wide windows, unit k; PAIR (omega 8), position k
 * of the sequence 2u, 2u + 1 over its units u (both windows of a unit, then the next unit). */
template <int PK> KCA_FN int kca_pos_win(const kca_live_t &L, int k) {
  return L.wbase + PK * KCA_NW * (k / PK) + k % PK;
}

/* KCA_LIST: the walk of the tiered pair kernels (post-RoPE keys, omega 8). The old walk gave
 * warp w the units (window pairs) w, w + KCA_NW, ... of the chunk and paired its live windows,
 * so a warp's share of attended windows and of INT2 ones varied with the tiers, and its next
 * tile came from a ballot over descriptors. Here the block first lists the segment's attended
 * windows (kca_list_build: FULL ones, then QUANT ones, each in position order), then tile j
 * (entries 2j, 2j + 1 of one tier; a tier's odd last entry alone) goes to warp j % KCA_NW:
 * every warp's share is the same to within one tile, and the walk is two shared loads a tile. */
template <int BITS, int ROT, int PK> struct kca_ls {
  static constexpr bool v = KCA_LIST && BITS != 0 && PK == 2 && ROT == KCA_ROT_ABS;
};

/* KCA_QUAD: the INT2 tiles of the list are quads (entries 4j' .. 4j' + 3 of the QUANT tier), the
 * FULL ones pairs: a quad shares a tile's fixed work (walk, wait, softmax step) among four
 * windows, and its two pairs' score chains are independent. */
template <int HD, int BITS, int ROT, int PK> struct kca_qd {
  static constexpr bool v = KCA_QUAD && KCA_PLAN && kca_ls<BITS, ROT, PK>::v && HD == 128 &&
                            BITS == 2;
};

/* KCA_G4: the quad kernels at GQA <= 4 (the launcher picks them by grp_q). At GQA <= 4 the mma
 * columns 4-7 (heads 4-7) are padding, so lanes g >= 4 hold Q of head g - 4 (column n is head
 * n & 3) and a pair's two windows use the columns in turn: after the scores, lane (g, c) keeps
 * token g of the pair's window c / 2 (its first for c < 2, rows g; its second, rows g + 8) for
 * heads (2c + e) & 3, two scores a pair instead of four, and the P.V puts the first window's
 * tokens in columns 0-3 and the second's in 4-7 (the epilogue adds column h + 4 to h). Lanes c
 * and c ^ 2 hold the same heads' running max. In a quad the INT2 keys are not scaled and shifted
 * element by element: the column of the pair's window takes its key scales into Q (kca_qk_fold),
 * the codes enter the mma as 0..3, and the zero points' part comes from one mma over the four
 * windows' zeros (kca_kzero). */
template <int HD, int BITS, int ROT, int PK> struct kca_g4 {
  static constexpr bool v = KCA_G4 && kca_qd<HD, BITS, ROT, PK>::v;
};

/* Whether list tile j is a FULL one, and (i) its index among its tier's tiles. With fr < 0 the
 * tf FULL tiles come first; else tile j is FULL when floor((j + 1) fr) passes floor(j fr), the
 * FULL tiles before it, so that a block's FULL tiles (memory-bound) run among its quads
 * (issue-bound) instead of all at its start (kca_list_live picks fr so that the count is tf). */
KCA_FN bool kca_lfull(const kca_live_t &L, int j, int &i) {
  if (L.fr < 0.0f) {
    const bool f = j < L.tf;
    i = f ? j : j - L.tf;
    return f;
  }
  const int a = (int)((float)j * L.fr), b = (int)((float)(j + 1) * L.fr);
  i = b > a ? a : j - a;
  return b > a;
}

/* The windows of list tile j, whose QUANT tiles take NQ windows (2, or 4 with KCA_QUAD): a FULL
 * pair (w[1] -1 when j is the tier's odd last entry; w[2] .. -1), or up to NQ QUANT windows (-1
 * past the tier's end). w[0] always exists. Returns whether it is a FULL tile. */
template <int NQ> KCA_FN bool kca_list_tile(const kca_live_t &L, int j, int (&w)[NQ]) {
  int i;
  const bool f = kca_lfull(L, j, i);
  const int e = f ? 2 * i : L.nf + NQ * i, end = f ? L.nf : L.nl, n = f ? 2 : NQ;
  KCA_UNROLL
  for (int x = 0; x < NQ; x++) w[x] = x < n && e + x < end ? L.wbase + L.ent[e + x] : -1;
  return f;
}

/* ---------------------------------------------------------------- issuing a tile */

/* A QUANT half's key and value codes and (kmeta) the window's key scales and zeros. In-window
 * offsets fit an int (kca_check_geom bounds a window's page). Code rows of 32 bytes (INT2 at
 * head_dim 128): one 16-byte piece per lane (lanes 0-15 the keys, 16-31 the values, two pieces a
 * row); head_dim 128: one piece of the scales (lanes 0-15) or zeros (16-31) per lane. */
template <int HD, int BITS>
KCA_FN void kca_issue_codes(const kca_params_t &p, uint8_t *dst, const kca_win_t &w, int t0,
                            int n, int kvh, int lane, bool kmeta) {
  using L = kca_lay<HD, BITS>;
  constexpr int NQ = L::rb / 16; /* 16-byte pieces per code row */
  const int crow = p.n_kv * L::rb, col = kvh * L::rb;
  if constexpr (NQ == 2) {
    const int v = lane >> 4, r = (lane >> 1) & 7, q = (lane & 1) * 16, ok = r < n;
    kca_cp16(dst + (v ? L::vc : 0) + r * L::rb + q,
             (v ? w.v : w.k) + ((t0 + (ok ? r : 0)) * crow + col + q), ok);
  } else {
    for (int e = lane; e < 8 * NQ; e += 32) {
      const int r = e / NQ, q = e % NQ * 16, ok = r < n, src = (t0 + (ok ? r : 0)) * crow + col + q;
      kca_cp16(dst + r * L::rb + q, w.k + src, ok);
      kca_cp16(dst + L::vc + r * L::rb + q, w.v + src, ok);
    }
  }
  if (!kmeta) return;
  if constexpr (HD / 4 == 32) {
    kca_cp16(dst + L::km + lane * 16, (lane >> 4 ? w.kz : w.ks) + (kvh * HD * 2 + (lane & 15) * 16),
             1);
  } else {
    for (int e = lane; e < HD / 4; e += 32) {
      const int z = e >= HD / 8, q = z ? e - HD / 8 : e;
      kca_cp16(dst + L::km + e * 16, (z ? w.kz : w.ks) + (kvh * HD * 2 + q * 16), 1);
    }
  }
}

/* A QUANT half's value scales (lanes 0-7, a row each) and zeros (lanes 8-15); zb: the window's
 * value scales (lanes 0-7) or zeros (8-15); gs: log2 of the value group. */
template <int HD, int BITS>
KCA_FN void kca_issue_vmeta(const kca_params_t &p, kca_sptr_t dst, const uint8_t *zb, int t0,
                            int n, int kvh, int lane, int gs) {
  using L = kca_lay<HD, BITS>;
  if (lane >= 16) return;
  const int mb = (2 * HD) >> gs; /* value scale bytes per row: 4, 8, 16 or 32 */
  const int r = lane & 7, z = lane >> 3, ok = r < n;
  const uint8_t *src = zb + ((t0 + (ok ? r : 0)) * p.n_kv + kvh) * mb;
  const kca_sptr_t d = dst + L::vm + (z * 8 + r) * mb;
  if (mb == 8) { /* value groups of 32 at head_dim 128: the default */
    kca_cps8(d, src, ok);
    return;
  }
  if (mb == 4) kca_cps4(d, src, ok);
  if (mb >= 16) kca_cps16(d, src, ok);
  if (mb == 32) kca_cps16(d + 16, src + 16, ok);
}

/* A lane's parts of a tile's copies that every tile shares, computed once per block (kca_plan)
 * and pinned: rederived from the lane for every copy they cost ~30 instructions a half tile.
 * Kernels with a plan (KCA_PLAN): head_dim 128, FullKV or post-RoPE INT2 keys, PK 1 or 2. */
typedef struct {
  kca_sptr_t sbase;   /* the warp's stages */
  int lane;
  int fsrc, fdst, fv; /* FULL: source offset of row r0 (rows r0 + RPI i), K and V destinations */
  int csrc, c0, cdst; /* INT2 codes: source offsets of row r and of row 0, destination */
  int kmo;            /* INT2 key scales and zeros: source offset */
  int vsrc, v0;       /* INT2 value scales and zeros (lanes < 16, groups of 32): rows r and 0 */
  int r, rv;          /* the rows of the lane's code piece and value metadata */
} kca_plan_t;

template <int HD, int BITS, int ROT, int PK>
struct kca_has_plan {
  static constexpr bool v =
      HD == 128 && PK != 4 && (BITS == 0 || (BITS == 2 && ROT == KCA_ROT_ABS));
};

template <int HD, int BITS>
KCA_FN kca_plan_t kca_plan(const kca_params_t &p, const uint8_t *stages, int kvh, int lane) {
  using L = kca_lay<HD, BITS>;
  constexpr int NCH = HD / 8;
  const int r0 = lane / NCH, ch = lane % NCH;
  kca_plan_t pl;
  pl.sbase = kca_pin_s(kca_saddr(stages));
  pl.lane = kca_pin(lane);
  pl.fsrc = kca_pin((r0 * p.n_kv + kvh) * HD * 2 + ch * 16);
  pl.fdst = kca_pin(r0 * HD * 2 + ((ch ^ ((r0 & 1) << 2)) << 4));
  pl.fv = kca_pin(16 * HD + r0 * HD * 2 + ((ch ^ (r0 & 6)) << 4));
  if constexpr (BITS != 0) {
    const int r = (lane >> 1) & 7, q = (lane & 1) * 16;
    pl.c0 = kca_pin(kvh * L::rb + q);
    pl.csrc = kca_pin(r * p.n_kv * L::rb + pl.c0);
    pl.cdst = kca_pin((lane >> 4 ? L::vc : 0) + r * L::rb + q);
    pl.kmo = kca_pin(kvh * HD * 2 + (lane & 15) * 16);
    pl.v0 = kca_pin(kvh * 8);
    pl.vsrc = kca_pin((lane & 7) * p.n_kv * 8 + pl.v0);
    pl.r = kca_pin(r), pl.rv = kca_pin(lane & 7);
  }
  return pl;
}

/* kca_issue_half's copies through the plan; soff: the half's offset in the warp's stages. */
template <int HD, int BITS>
KCA_FN void kca_issue_half_pl(const kca_params_t &p, const kca_plan_t &pl, int soff,
                              const kca_lwin_t &w, int t0, int n, bool kmeta, bool vmeta, int gs) {
  using L = kca_lay<HD, BITS>;
  if (n == 0) return;
  const kca_sptr_t d = pl.sbase + soff;
  if (!w.quant) {
    constexpr int NCH = HD / 8, RPI = 32 / NCH;
    const int row = p.n_kv * HD * 2, r0 = pl.fdst / (HD * 2), src = t0 * row + pl.fsrc;
    KCA_UNROLL
    for (int i = 0; i < NCH / 4; i++) {
      const int ok = r0 + RPI * i < n;
      kca_cps16(d + pl.fdst + RPI * i * HD * 2, w.p0 + src + i * RPI * row, ok);
      kca_cps16(d + ((pl.fv ^ ((RPI * i & 6) << 4)) + RPI * i * HD * 2), w.p1 + src + i * RPI * row,
                ok);
    }
    return;
  }
  if constexpr (BITS != 0) {
    const int crow = p.n_kv * L::rb, ok = pl.r < n;
    kca_cps16(d + pl.cdst, w.p0 + (t0 * crow + (ok ? pl.csrc : pl.c0)), ok);
    if (kmeta) kca_cps16(d + L::km + pl.lane * 16, w.p1 + pl.kmo, 1);
    if (!vmeta || pl.lane >= 16) return;
    if (gs != 5) { /* value groups other than 32: the general copies */
      kca_issue_vmeta<HD, BITS>(p, d, w.p2, t0, n, pl.v0 / 8, pl.lane, gs);
      return;
    }
    const int vrow = p.n_kv * 8, okv = pl.rv < n;
    kca_cps8(d + L::vm + (pl.lane & 15) * 8, w.p2 + (t0 * vrow + (okv ? pl.vsrc : pl.v0)), okv);
  }
}

/* PK 2, value groups of 32: both halves' value scales and zeros in one copy a lane (lanes 0-15
 * window a's into half 0, 16-31 window b's into half 1; kca_issue_half_pl's split otherwise). */
template <int HD, int BITS>
KCA_FN void kca_issue_vpair_pl(const kca_plan_t &pl, int soff, const kca_lwin_t &a,
                               const kca_lwin_t &b) {
  using L = kca_lay<HD, BITS>;
  const bool hb = pl.lane >> 4 & 1;
  const int n = hb ? b.n : a.n, okv = pl.rv < n;
  if (!(hb ? b.quant : a.quant) || n == 0) return;
  kca_cps8(pl.sbase + soff + (hb ? L::half : 0) + L::vm + (pl.lane & 15) * 8,
           (hb ? b.p2 : a.p2) + (okv ? pl.vsrc : pl.v0), okv);
}

/* Copies one half tile's bytes (rows t0 .. t0 + n - 1 of window w, KV head kvh) into dst with
 * cp.async, rows >= n zero-filled; kmeta: also the window's key scales and zeros. */
template <int HD, int BITS>
KCA_FN void kca_issue_half(const kca_params_t &p, uint8_t *dst, const kca_win_t &w, int t0, int n,
                           int kvh, int lane, bool kmeta, int gs) {
  if (n == 0) return;
  constexpr int NCH = HD / 8;
  if (!w.quant) { /* lane: chunk lane % NCH of rows lane / NCH + RPI i (rows < omega: in the page)
                   */
    constexpr int RPI = 32 / NCH;
    const int r0 = lane / NCH, ch = lane % NCH;
    const int row = p.n_kv * HD * 2, step = RPI * row;
    const int src0 = ((t0 + r0) * p.n_kv + kvh) * HD * 2 + ch * 16;
    const uint8_t *ks = w.k + src0, *vs = w.v + src0;
    uint8_t *kd = dst + r0 * HD * 2 + ((ch ^ ((r0 & 1) << 2)) << 4);
    KCA_UNROLL
    for (int i = 0; i < NCH / 4; i++) {
      const int r = r0 + RPI * i, ok = r < n;
      kca_cp16(kd + RPI * i * HD * 2, ks + i * step, ok);
      kca_cp16(dst + 16 * HD + r * HD * 2 + ((ch ^ (r & 6)) << 4), vs + i * step, ok);
    }
    return;
  }
  if constexpr (BITS != 0) {
    kca_issue_codes<HD, BITS>(p, dst, w, t0, n, kvh, lane, kmeta);
    kca_issue_vmeta<HD, BITS>(p, kca_saddr(dst), lane >> 3 & 1 ? w.vz : w.vs, t0, n, kvh, lane,
                              gs);
  }
}

/* PK 4: one half tile from two windows of one tier, a's tokens in rows 0-3 and b's in rows 4-7
 * (n = 0: none), rows past a window's tokens zero-filled; QUANT: a's key metadata at km and b's
 * at km2. The copies are those of kca_issue_half, each lane's source chosen by its row. */
template <int HD, int BITS>
KCA_FN void kca_issue_half4(const kca_params_t &p, uint8_t *dst, const kca_win_t &a,
                            const kca_win_t &b, int kvh, int lane, int gs) {
  using L = kca_lay<HD, BITS>;
  constexpr int NCH = HD / 8, RPI = 32 / NCH;
  if (!a.quant) {
    const int r0 = lane / NCH, ch = lane % NCH;
    KCA_UNROLL
    for (int i = 0; i < NCH / 4; i++) {
      const int r = r0 + RPI * i, t = r & 3, ok = t < (r < 4 ? a.n : b.n);
      const int src = (t * p.n_kv + kvh) * HD * 2 + ch * 16; /* (t < omega: in the page) */
      kca_cp16(dst + r * HD * 2 + ((ch ^ ((r & 1) << 2)) << 4), (r < 4 ? a.k : b.k) + src, ok);
      kca_cp16(dst + 16 * HD + r * HD * 2 + ((ch ^ (r & 6)) << 4), (r < 4 ? a.v : b.v) + src, ok);
    }
    return;
  }
  if constexpr (BITS != 0) {
    constexpr int NQ = L::rb / 16;
    const int crow = p.n_kv * L::rb, col = kvh * L::rb;
    for (int e = lane; e < 16 * NQ; e += 32) { /* key pieces, then value pieces */
      const int v = e >= 8 * NQ, r = (e % (8 * NQ)) / NQ, q = e % NQ * 16, t = r & 3;
      const kca_win_t &w = r < 4 ? a : b;
      const int ok = t < w.n;
      kca_cp16(dst + (v ? L::vc : 0) + r * L::rb + q,
               (v ? w.v : w.k) + ((ok ? t : 0) * crow + col + q), ok);
    }
    for (int e = lane; e < HD / 2; e += 32) { /* key scales and zeros of a, then of b */
      const int x = e >= HD / 4, z = (e % (HD / 4)) >= HD / 8, q = e % (HD / 8);
      const kca_win_t &w = x ? b : a;
      kca_cp16(dst + (x ? L::km2 : L::km) + (z * HD / 8 + q) * 16,
               (z ? w.kz : w.ks) + (kvh * HD * 2 + q * 16), 1);
    }
    const int mb = (2 * HD) >> gs;
    if (lane < 16) { /* value scales (lanes 0-7, a row each) and zeros (8-15) */
      const int r = lane & 7, z = lane >> 3, t = r & 3;
      const kca_win_t &w = r < 4 ? a : b;
      const int ok = t < w.n;
      const uint8_t *src = (z ? w.vz : w.vs) + ((ok ? t : 0) * p.n_kv + kvh) * mb;
      uint8_t *d = dst + L::vm + (z * 8 + r) * mb;
      for (int o = 0; o < mb; o += 4) kca_cp4(d + o, src + o, ok);
    }
  }
}

/* PK 4: the tile of positions cu.j (bits over cu.k): windows 0, 1 in half 0 and 2, 3 in half 1.
 * bits: each live half's n reads 8 (rows are masked by the row mask in bits 16-31 instead);
 * w[0]: the window of position cu.k, w[1]: the position bits. */
template <int HD, int BITS>
KCA_FN kca_tile_t kca_issue4(const kca_params_t &p, uint8_t *stage, const kca_live_t &L,
                             kca_cur_t cu, int kvh, int lane, int gs) {
  kca_tile_t t;
  uint32_t m = (uint32_t)cu.j, vmask = 0;
  int quant = 0, live = 0;
  t.w[0] = kca_pos_win<4>(L, cu.k), t.w[1] = cu.j, t.base[0] = t.base[1] = 0; /* (kca_masses4) */
  KCA_UNROLL
  for (int h = 0; h < 2; h++) {
    kca_win_t w[2];
    KCA_UNROLL
    for (int x = 0; x < 2; x++) {
      w[x] = m ? kca_win(p, kca_pos_win<4>(L, cu.k + kca_ctz(m))) : x ? w[0] : kca_win_t{};
      if (!m) w[x].n = 0; /* (a's pointers: valid, never read) */
      m &= m - 1u;
    }
    if (!w[0].n) break;
    if (h == 0) quant = w[0].quant;
    live |= 1 << h;
    vmask |= ((1u << w[0].n) - 1u | ((1u << w[1].n) - 1u) << 4) << (8 * h);
    kca_issue_half4<HD, BITS>(p, stage + h * kca_lay<HD, BITS>::half, w[0], w[1], kvh, lane, gs);
  }
  t.bits = (live & 1 ? 8 : 0) | (live & 2 ? 8 << 4 : 0) | quant * 3 << 8 | (int)(vmask << 16);
  return t;
}

/* A half tile's copies into stage (at soff in the warp's stages), through the plan when PL. */
template <int HD, int BITS, bool PL>
KCA_FN void kca_issue_h(const kca_params_t &p, uint8_t *stage, int soff, const kca_plan_t &pl,
                        const typename kca_wt<PL>::T &w, int t0, int n, int kvh, int lane,
                        bool kmeta, int gs, bool vmeta = true) {
  if constexpr (PL)
    kca_issue_half_pl<HD, BITS>(p, pl, soff, w, t0, n, kmeta, vmeta, gs);
  else
    kca_issue_half<HD, BITS>(p, stage, w, t0, n, kvh, lane, kmeta, gs);
}

/* PK 1: issues rows t0 .. t0 + 15 of window w (descriptor W) into stage. */
template <int HD, int BITS, bool PL>
KCA_FN kca_tile_t kca_issue1(const kca_params_t &p, uint8_t *stage, int soff, const kca_plan_t &pl,
                             const typename kca_wt<PL>::T &W, int w, int t0, int kvh, int lane,
                             int gs, int *ntile) {
  constexpr int H = kca_lay<HD, BITS>::half;
  kca_tile_t t;
  const int n0 = kca_clamp8(W.n - t0), n1 = kca_clamp8(W.n - t0 - 8);
  t.w[0] = t.w[1] = w, t.base[0] = t.base[1] = W.pos0 + t0;
  t.bits = n0 | n1 << 4 | W.quant * 3 << 8 | (t0 + 16 >= W.n) << 10;
  kca_issue_h<HD, BITS, PL>(p, stage, soff, pl, W, t0, n0, kvh, lane, true, gs);
  kca_issue_h<HD, BITS, PL>(p, stage + H, soff + H, pl, W, t0 + 8, n1, kvh, lane, false, gs);
  *ntile = (W.n + 15) / 16;
  return t;
}

/* Issues the tile (unit k, tile j; LS: windows k and j) into stage; returns its description,
 * *ntile = tiles of the unit. Descriptors were prefetched into L1 one iteration earlier. */
template <int HD, int BITS, int PK, bool PL, bool LS>
KCA_FN kca_tile_t kca_issue(const kca_params_t &p, uint8_t *stage, int soff, const kca_plan_t &pl,
                            const kca_live_t &L, kca_cur_t cu, int kvh, int lane, int gs,
                            int *ntile) {
  constexpr int H = kca_lay<HD, BITS>::half;
  kca_tile_t t;
  if constexpr (PK == 4) {
    *ntile = 1;
    return kca_issue4<HD, BITS>(p, stage, L, cu, kvh, lane, gs);
  }
  const int ln = PL ? pl.lane : lane; /* (the plan's copy is pinned) */
  if (PK == 2) {
    const int wa = LS ? cu.k : kca_pos_win<PK>(L, cu.k);
    const int wb = LS ? cu.j : cu.j >= 0 ? kca_pos_win<PK>(L, cu.j) : -1;
    using WT = typename kca_wt<PL>::T;
    const WT A = kca_getwin<PL, BITS>(p, wa, ln);
    WT B = kca_getwin<PL, BITS>(p, wb >= 0 ? wb : wa, ln); /* (loaded alongside A's) */
    if (wb < 0) B.n = 0; /* no second window: its base is never read */
    t.w[0] = wa, t.w[1] = wb, t.base[0] = A.pos0, t.base[1] = B.pos0 - 8;
    t.bits = A.n | B.n << 4 | A.quant << 8 | B.quant << 9 | 1 << 10;
    const bool vpair = PL && BITS == 2 && gs == 5; /* the value metadata in one copy a lane */
    kca_issue_h<HD, BITS, PL>(p, stage, soff, pl, A, 0, A.n, kvh, lane, true, gs, !vpair);
    kca_issue_h<HD, BITS, PL>(p, stage + H, soff + H, pl, B, 0, B.n, kvh, lane, true, gs, !vpair);
    if constexpr (PL && BITS == 2)
      if (vpair) kca_issue_vpair_pl<HD, BITS>(pl, soff, A, B);
    *ntile = 1;
  } else {
    const int w = kca_pos_win<PK>(L, cu.k);
    return kca_issue1<HD, BITS, PL>(p, stage, soff, pl, kca_getwin<PL, BITS>(p, w, ln), w,
                                    16 * cu.j, kvh, lane, gs, ntile);
  }
  return t;
}

/* KCA_QUAD: issues list tile j into stage: a FULL pair as kca_issue does, or a quad of INT2
 * windows, pair x (windows 2x, 2x + 1) at x kca_lay::qo in the halves (n = 0 past the tier). */
template <int HD, int BITS>
KCA_FN kca_tile_t kca_issue_lq(const kca_params_t &p, uint8_t *stage, int soff,
                               const kca_plan_t &pl, const kca_live_t &L, int j, int kvh, int lane,
                               int gs, const uint8_t *ds) {
  using Ly = kca_lay<HD, BITS>;
  int w[4], nt;
  const bool full = kca_list_tile<4>(L, j, w);
  if (full && KCA_DRINGF && ds) { /* a FULL pair, its descriptors in the ring */
    const kca_lwin_t A = kca_lwin_f(p, ds);
    kca_lwin_t B = kca_lwin_f(p, ds + (w[1] >= 0 ? 64 : 0));
    B.n = w[1] >= 0 ? B.n : 0;
    kca_issue_half_pl<HD, BITS>(p, pl, soff, A, 0, A.n, true, true, gs);
    kca_issue_half_pl<HD, BITS>(p, pl, soff + Ly::half, B, 0, B.n, true, true, gs);
    return (kca_tile_t){{w[0], w[1]}, {0, 0}, A.n | B.n << 4 | 1 << 10};
  }
  if (full)
    return kca_issue<HD, BITS, 2, true, true>(p, stage, soff, pl, L, (kca_cur_t){w[0], w[1]}, kvh,
                                              lane, gs, &nt);
  const bool vpair = gs == 5; /* the value metadata in one copy a lane */
  kca_tile_t t;
  int bits = 3 << 8 | 1 << 10 | 1 << 11;
  KCA_UNROLL
  for (int x = 0; x < 2; x++) {
    const int wa = w[2 * x], wb = w[2 * x + 1], so = soff + x * Ly::qo;
    const int ia = wa >= 0 ? wa : w[0], ib = wb >= 0 ? wb : w[0]; /* (w[0]: any valid one) */
    kca_lwin_t A, B;
    if (ds) { /* KCA_DRING4: the quad's descriptors in the warp's ring (window x at 64 x) */
      A = kca_lwin_q<true>(p, ds + (wa >= 0 ? 2 * x : 0) * 64, pl.lane);
      B = kca_lwin_q<true>(p, ds + (wb >= 0 ? 2 * x + 1 : 0) * 64, pl.lane);
    } else {
      A = KCA_QLEAN ? kca_lwin_q(p, (const uint8_t *)(p.win + ia), pl.lane)
                    : kca_lwin(p, ia, pl.lane, true);
      B = KCA_QLEAN ? kca_lwin_q(p, (const uint8_t *)(p.win + ib), pl.lane)
                    : kca_lwin(p, ib, pl.lane, true);
    }
    A.n = wa >= 0 ? A.n : 0, B.n = wb >= 0 ? B.n : 0;
    kca_issue_half_pl<HD, BITS>(p, pl, so, A, 0, A.n, true, !vpair, gs);
    kca_issue_half_pl<HD, BITS>(p, pl, so + Ly::half, B, 0, B.n, true, !vpair, gs);
    if (vpair) kca_issue_vpair_pl<HD, BITS>(pl, so, A, B);
    bits |= x ? A.n << 12 | B.n << 16 : A.n | B.n << 4;
  }
  t.w[0] = w[0], t.w[1] = w[1], t.base[0] = w[2], t.base[1] = w[3], t.bits = bits;
  return t;
}

/* ---------------------------------------------------------------- walking the units */

/* 1 when the window at walk position k is attended. */
template <int PK> KCA_FN int kca_unit_live(const kca_params_t &p, const kca_live_t &L, int k) {
  if (k >= L.nk) return 0;
  const int w = kca_pos_win<PK>(L, k);
  return w < L.c_end && kca_win(p, w).n > 0;
}

/* The next live position after k (-1 if none), refreshing the mask 32 positions at a time. */
template <int PK> KCA_FN int kca_next_live(const kca_params_t &p, kca_live_t &L, int k, int lane) {
  for (k++; k < L.nk;) {
    if (k >= L.kbase + 32) {
      L.kbase = k;
      L.mask = kca_ballot(kca_unit_live<PK>(p, L, k + lane));
    }
    const uint32_t m = L.mask >> (k - L.kbase);
    if (m) return k + kca_ctz(m);
    k = L.kbase + 32;
  }
  return -1;
}

/* The first tile at or after live position k: PAIR, k and the next live window after it (the
 * fixed work of a tile is shared by two live windows, adjacent or not). */
template <int PK>
KCA_FN kca_cur_t kca_tile_at(const kca_params_t &p, kca_live_t &L, int k, int lane) {
  kca_cur_t n = {k, 0};
  if (PK == 2) n.j = k >= 0 ? kca_next_live<PK>(p, L, k, lane) : -1;
  if (k >= 0) kca_prefetch(p.win + kca_pos_win<PK>(L, k));
  return n;
}

/* PK 4 (omega 4): the next tile, up to four live windows of one tier among the warp's 32 walk
 * positions from kbase, the FULL ones of those positions first, then the QUANT ones (attention
 * and masses do not depend on the order). Returns k = kbase (-1: done), j = the tile's positions
 * (bits over kbase). */
KCA_FN kca_cur_t kca_next4(const kca_params_t &p, kca_live_t &L, int lane) {
  while (!(L.mask | L.qmask)) {
    L.kbase = L.kbase < 0 ? 0 : L.kbase + 32;
    if (L.kbase >= L.nk) return (kca_cur_t){-1, 0};
    const int k = L.kbase + lane, w = kca_pos_win<4>(L, k);
    const int tier = k < L.nk && w < L.c_end ? kca_win_tier(p, w) : 0;
    L.mask = kca_ballot(tier == KERN_PW_FULL), L.qmask = kca_ballot(tier == KERN_PW_QUANT);
  }
  const bool full = L.mask != 0;
  uint32_t m = full ? L.mask : L.qmask, sel = 0;
  KCA_UNROLL
  for (int i = 0; i < 4; i++) sel |= m & (0u - m), m &= m - 1u;
  if (full)
    L.mask = m;
  else
    L.qmask = m;
  return (kca_cur_t){L.kbase, (int)sel};
}

/* The first tile of the warp's walk. */
template <int PK> KCA_FN kca_cur_t kca_first(const kca_params_t &p, kca_live_t &L, int lane) {
  if constexpr (PK == 4) return kca_next4(p, L, lane);
  return kca_tile_at<PK>(p, L, kca_next_live<PK>(p, L, -1, lane), lane);
}

/* The tile after cu (ntile tiles in its unit), and an L1 prefetch of its descriptors. */
template <int PK>
KCA_FN kca_cur_t kca_advance(const kca_params_t &p, kca_live_t &L, kca_cur_t cu, int ntile,
                             int lane) {
  if constexpr (PK == 4) return kca_next4(p, L, lane);
  if (PK == 1 && cu.j + 1 < ntile) return (kca_cur_t){cu.k, cu.j + 1};
  const int last = PK == 2 && cu.j >= 0 ? cu.j : cu.k;
  if (PK == 2) { /* two more live positions in the mask: no refresh, no bound (bits past nk and
                    c_end are clear) */
    /* (sh <= 0: the search for cu's second window ran past the mask and found none) */
    const int sh = last + 1 - L.kbase;
    const uint32_t m = sh > 0 && sh < 32 ? L.mask >> sh : 0u, m2 = m & (m - 1u);
    if (m2) {
      const kca_cur_t n = {last + 1 + kca_ctz(m), last + 1 + kca_ctz(m2)};
      kca_prefetch(p.win + kca_pos_win<PK>(L, n.k));
      return n;
    }
  }
  return kca_tile_at<PK>(p, L, kca_next_live<PK>(p, L, last, lane), lane);
}

/* KCA_LIST: exclusive prefix counts of the ng groups' FULL and QUANT windows into pre, totals
 * into nf, nq (one warp; lane l takes groups KCA_LGL l ..; sums exact in floats: < 2^24). */
KCA_FN void kca_list_scan(kca_lst_t *ls, int ng, int lane) {
  int cf[KCA_LGL], cq[KCA_LGL];
  float sf = 0.0f, sq = 0.0f;
  KCA_UNROLL
  for (int i = 0; i < KCA_LGL; i++) {
    const int q = KCA_LGL * lane + i;
    cf[i] = q < ng ? kca_popc(ls->mf[q]) : 0, cq[i] = q < ng ? kca_popc(ls->mq[q]) : 0;
    sf += (float)cf[i], sq += (float)cq[i];
  }
  KCA_UNROLL
  for (int d = 1; d < 32; d <<= 1) { /* inclusive sums over the lanes */
    const int src = lane >= d ? lane - d : 0;
    const float xf = kca_shfl(sf, src), xq = kca_shfl(sq, src);
    sf += lane >= d ? xf : 0.0f, sq += lane >= d ? xq : 0.0f;
  }
  int ef = (int)sf, eq = (int)sq;
  if (lane == 31) ls->nf = ef, ls->nq = eq;
  KCA_UNROLL
  for (int i = 0; i < KCA_LGL; i++) ef -= cf[i], eq -= cq[i];
  KCA_UNROLL
  for (int i = 0; i < KCA_LGL; i++) {
    const int q = KCA_LGL * lane + i;
    if (q < ng) ls->pre[q] = (uint32_t)ef | (uint32_t)eq << 16;
    ef += cf[i], eq += cq[i];
  }
}

/* KCA_LIST: lists the attended windows of [s0, s1) (at most KCA_LSEG) in ls, FULL ones first,
 * each tier in position order (the block; ends with a barrier). The caller's warps are done
 * with the previous segment's list: the first barrier comes before any entry is written. */
KCA_FN void kca_list_build(const kca_params_t &p, kca_lst_t *ls, int s0, int s1, int tid) {
  constexpr int QW = (KCA_LG + KCA_NW - 1) / KCA_NW; /* groups a warp */
  const int lane = tid & 31, warp = tid >> 5, ng = (s1 - s0 + 31) >> 5;
  int tier[QW]; /* every descriptor load in flight before the first ballot */
  KCA_UNROLL
  for (int i = 0; i < QW; i++) {
    const int w = s0 + 32 * (warp + KCA_NW * i) + lane;
    tier[i] = w < s1 ? kca_win_tier(p, w) : KERN_PW_EVICTED;
  }
  KCA_UNROLL
  for (int i = 0; i < QW; i++) {
    const int q = warp + KCA_NW * i;
    const uint32_t f = kca_ballot(tier[i] == KERN_PW_FULL);
    const uint32_t u = kca_ballot(tier[i] == KERN_PW_QUANT);
    if (lane == 0 && q < ng) ls->mf[q] = f, ls->mq[q] = u;
  }
  kca_syncthreads();
  if (KCA_TRACE && tid == 0) kca_tr(6);
  if (warp == 0) kca_list_scan(ls, ng, lane);
  kca_syncthreads();
  if (KCA_TRACE && tid == 0) kca_tr(7), kca_tr(8, ls->nf | (unsigned long long)ls->nq << 32);
  const uint32_t lt = (1u << lane) - 1u;
  for (int q = warp; q < ng; q += KCA_NW) {
    const uint32_t f = ls->mf[q], u = ls->mq[q], pr = ls->pre[q];
    const uint16_t e = (uint16_t)(32 * q + lane);
    if (f >> lane & 1) ls->ent[(pr & 0xffffu) + kca_popc(f & lt)] = e;
    if (u >> lane & 1) ls->ent[ls->nf + (pr >> 16) + kca_popc(u & lt)] = e;
  }
  kca_syncthreads();
}

/* KCA_LIST: the walk state of a segment from s0 listed in ls; the warp's first tile is warp.
 * quad: the INT2 tiles are quads (KCA_QUAD). */
KCA_FN void kca_list_live(const kca_lst_t *ls, int s0, int warp, bool quad, bool spread,
                          kca_live_t &L) {
  L.ent = ls->ent, L.wbase = s0, L.nf = ls->nf, L.nl = ls->nf + ls->nq;
  L.tf = (ls->nf + 1) >> 1, L.jt = warp - KCA_NW;
  L.nk = L.tf + (quad ? (ls->nq + 3) >> 2 : (ls->nq + 1) >> 1);
  /* tf / nk a little above (so that floor(nk fr) is tf) and at most 1, so that floor(j fr)
     climbs by at most one a tile: checked exhaustively for every tf <= nk <= 5,000, also with
     the quotient 2 ulp off; the float products first fail at nk = 19,633 (a climb of two where
     j fr crosses 2^14), hence the bound on KCA_LSEG below */
  const float r = L.nk > 0 ? (float)L.tf / (float)L.nk * (1.0f + 0x1p-21f) : 0.0f;
  L.fr = spread ? (r < 1.0f ? r : 1.0f) : -1.0f;
}

/* KCA_LIST: the warp's next tile (k -1: done), its descriptors prefetched. NQ 2: k, j are its
 * windows; NQ 4 (KCA_QUAD): k is its index in the list (kca_issue_lq reads the windows again). */
template <int NQ, bool RING = false>
KCA_FN kca_cur_t kca_list_next(const kca_params_t &p, kca_live_t &L) {
  L.jt += KCA_NW;
  if (L.jt >= L.nk) return (kca_cur_t){-1, -1};
  int w[NQ];
  kca_list_tile<NQ>(L, L.jt, w);
  int ti;
  if (!RING || (!KCA_DRINGF && kca_lfull(L, L.jt, ti))) { /* (RING: through kca_dfetch4) */
    kca_prefetch(p.win + w[0]);
    KCA_UNROLL
    for (int x = 1; x < NQ; x++)
      if (w[x] >= 0) kca_prefetch(p.win + w[x]);
  }
  return NQ == 2 ? (kca_cur_t){w[0], w[1]} : (kca_cur_t){L.jt, 0};
}

/* KCA_DRING4: copies list tile j's descriptors, when it is a quad (KCA_DRINGF: or a FULL pair),
 * into slot o % 4 of the warp's ring (lane l < 16: window l / 4's 16-byte piece l % 4), in the
 * caller's next cp.async group. */
KCA_FN void kca_dfetch4(const kca_params_t &p, const kca_live_t &L, uint8_t *ring, int j, int o,
                        int lane) {
  int i;
  const bool f = j < L.nk && kca_lfull(L, j, i);
  if (j >= L.nk || lane >= (f ? KCA_DRINGF ? 8 : 0 : 16)) return; /* (16 bytes a lane) */
  const int e = f ? 2 * i + (lane >> 2) : L.nf + 4 * i + (lane >> 2);
  if (e < (f ? L.nf : L.nl))
    kca_cp16(ring + (o & 3) * KCA_DRS4 + lane * 16,
             (const uint8_t *)(p.win + L.wbase + L.ent[e]) + (lane & 3) * 16, 1);
}

/* ---------------------------------------------------------------- computing a tile */

/* The online-softmax step over S (see kca_qk): masks, exponentials, running sums. The running
 * max of a head moves only when a score exceeds it by more than KCA_SLACK (log2 units; a vote,
 * not a reduction, on most tiles), so probabilities stay below 2^KCA_SLACK. */
#define KCA_SLACK 8.0f

/* The vote: when a lane's tile max mt[e] passes its running max by more than KCA_SLACK, the heads'
 * maxima are reduced over the tokens (G4: and over lanes c, c ^ 2, the pair's other window), and
 * the running sums' factors alpha applied to O^T. */
template <int HD, int BITS, bool G4>
KCA_FN void kca_vote(kca_st_t<HD, BITS> &st, float (&mt)[2], float (&alpha)[2]) {
  alpha[0] = alpha[1] = 1.0f;
  if (!kca_any(mt[0] > st.m[0] + KCA_SLACK || mt[1] > st.m[1] + KCA_SLACK)) return;
  KCA_UNROLL
  for (int e = 0; e < 2; e++) {
    if (G4) mt[e] = kca_maxf(mt[e], kca_shfl_xor(mt[e], 2));
    mt[e] = kca_maxf(mt[e], kca_shfl_xor(mt[e], 4));
    mt[e] = kca_maxf(mt[e], kca_shfl_xor(mt[e], 8));
    mt[e] = kca_maxf(mt[e], kca_shfl_xor(mt[e], 16));
    const float mn = kca_maxf(st.m[e], mt[e]); /* finite: the tile has a valid row */
    alpha[e] = kca_ex2(st.m[e] - mn);          /* 0 on the first tile (m = -inf) */
    st.m[e] = mn;
  }
  KCA_UNROLL
  for (int j = 0; j < HD / 16; j++) {
    st.acc[j][0] *= alpha[0], st.acc[j][1] *= alpha[1];
    st.acc[j][2] *= alpha[0], st.acc[j][3] *= alpha[1];
  }
}

template <int HD, int BITS, int NH = 2>
KCA_FN kca_tpn<NH> kca_softmax(kca_st_t<HD, BITS> &st, float (&s)[2 * NH], const kca_tile_t &t,
                               int g) {
  kca_tpn<NH> r;
  float mt[2];
  KCA_UNROLL
  for (int e = 0; e < 2; e++) {
    KCA_UNROLL
    for (int h = 0; h < NH; h++) s[2 * h + e] = g < kca_tn(t, h) ? s[2 * h + e] : KCA_NEGINF;
    mt[e] = kca_maxf(s[e], s[2 + e]);
    KCA_UNROLL
    for (int h = 2; h < NH; h++) mt[e] = kca_maxf(mt[e], s[2 * h + e]);
  }
  kca_vote<HD, BITS, false>(st, mt, r.alpha);
  KCA_UNROLL
  for (int e = 0; e < 2; e++) {
    KCA_UNROLL
    for (int h = 0; h < NH; h++) r.p[2 * h + e] = kca_ex2(s[2 * h + e] - st.m[e]);
    float ps = r.p[e] + r.p[2 + e];
    if constexpr (NH == 4) ps += r.p[4 + e] + r.p[6 + e];
    st.l[e] = st.l[e] * r.alpha[e] + ps;
  }
  return r;
}

/* The lane's key words of half h (its token g) for chunks c + 4i, i in the group ig (NORM:
 * {ig}; NEOX: {ig, ig + HD / 64}, the rotation's two halves): FULL rows (fp16 in QUANT-capable
 * kernels, else bf16), or QUANT codes dequantized and (pre-RoPE keys) turned by the row offset
 * R(8h + g). */
template <int HD, int BITS, int ROT, bool QUANT>
KCA_FN void kca_kwords(const kca_params_t &p, const uint8_t *hs, const uint8_t *meta, int km,
                       const uint32_t *off, int h, int g, int c, int ig, uint32_t (&k)[2][4]) {
  using L = kca_lay<HD, BITS>;
  constexpr bool NEOX = ROT == KCA_ROT_NEOX;
  constexpr int NI = NEOX ? 2 : 1;
  KCA_UNROLL
  for (int x = 0; x < NI; x++) {
    const int i = ig + x * (HD / 64);
    if (BITS == 0 || !QUANT) {
      const kca_u4 w = *(const kca_u4 *)(hs + g * HD * 2 + (((c + 4 * i) ^ ((g & 1) << 2)) << 4));
      KCA_UNROLL
      for (int r = 0; r < 4; r++) k[x][r] = BITS ? kca_bf2h(w.v[r]) : w.v[r];
      continue;
    }
    uint32_t w0, w1;
    kca_codes<BITS>(hs + g * L::rb + (c + 4 * i) * BITS, &w0, &w1);
    const uint32_t ws = BITS == 2 ? (w0 | w0 << 14) : BITS == 4 ? w0 >> 4 : 0u;
    const kca_u4 ks = kca_sld128(meta + km + (c + 4 * i) * 16);
    const kca_u4 kz = kca_sld128(meta + km + 2 * HD + (c + 4 * i) * 16);
    if constexpr (BITS == 2 && KCA_PMAGIC) { /* codes 2r, 2r + 1 at bits 4r of ws's halves */
      const uint32_t c0 = kca_c2h<0>(ws, p), c1 = kca_c2h<4>(ws, p);
      const uint32_t c2 = kca_c2h<8>(ws, p), c3 = kca_c2h<0>(ws >> 12, p);
      k[x][0] = kca_h2fma(c0, ks.v[0], kz.v[0]), k[x][1] = kca_h2fma(c1, ks.v[1], kz.v[1]);
      k[x][2] = kca_h2fma(c2, ks.v[2], kz.v[2]), k[x][3] = kca_h2fma(c3, ks.v[3], kz.v[3]);
    } else {
      KCA_UNROLL
      for (int r = 0; r < 4; r++)
        k[x][r] = kca_h2fma(kca_h2sub(kca_kpair<BITS>(w0, w1, ws, r, p.mags[0]), KCA_MAGIC),
                            ks.v[r], kz.v[r]);
    }
  }
  if (BITS == 0 || !QUANT || ROT == KCA_ROT_ABS) return; /* post-RoPE keys: no turn */
  const uint32_t *orow = off + (8 * h + g) * (HD + 4);
  const int j0 = 4 * (c + 4 * ig); /* first slot of chunk c + 4 ig */
  const kca_u4 o0 = *(const kca_u4 *)&orow[2 * j0], o1 = *(const kca_u4 *)&orow[2 * j0 + 4];
  const uint32_t oa[4] = {o0.v[0], o0.v[2], o1.v[0], o1.v[2]};
  const uint32_t ob[4] = {o0.v[1], o0.v[3], o1.v[1], o1.v[3]};
  KCA_UNROLL
  for (int r = 0; r < 4; r++) {
    if (!NEOX)
      k[0][r] = kca_rot_norm(k[0][r], oa[r], ob[r]);
    else
      kca_rot_neox(&k[0][r], &k[NI - 1][r], oa[r], ob[r]);
  }
}

/* S = K B^T: A = the keys (row g: token g of half 0 and row g + 8: of half 1 when BOTH, else row
 * g: token g of half h and rows g + 8 zero), B = the query heads (Q, or Q turned by the QUANT
 * windows' base rotation). KQ: bit y set when the y-th half computed is QUANT (pre-RoPE frames:
 * both halves of one kind; post-RoPE keys share Q whatever their tiers). s[2 h' + e] = S[token
 * g of the h'-th half computed][head 2c + e]. */
template <int HD, int BITS, int ROT, int PK, int KQ, bool BOTH>
KCA_FN void kca_qk(const kca_params_t &p, const uint32_t (&B)[HD / 32][4], const uint8_t *stage,
                   const uint32_t *off, int h, int g, int c, float *s) {
  using L = kca_lay<HD, BITS>;
  constexpr int NI = ROT == KCA_ROT_NEOX ? 2 : 1;
  float s2[4] = {0, 0, 0, 0};
  s[0] = s[1] = s[2] = s[3] = 0.0f;
  const int km = PK == 4 && g >= 4 ? L::km2 : L::km; /* the key metadata of row g's window */
  KCA_UNROLL
  for (int ig = 0; ig < HD / 32 / NI; ig++) {
    uint32_t k[2][2][4]; /* [row half][chunk of the group][word] */
    const int h0 = BOTH ? 0 : h;
    const uint8_t *hs0 = stage + h0 * L::half, *hs1 = stage + L::half;
    kca_kwords<HD, BITS, ROT, (KQ & 1) != 0>(p, hs0, PK > 1 ? hs0 : stage, km, off, h0, g, c, ig,
                                             k[0]);
    if constexpr (BOTH)
      kca_kwords<HD, BITS, ROT, (KQ & 2) != 0>(p, hs1, PK > 1 ? hs1 : stage, km, off, 1, g, c, ig,
                                               k[1]);
    if (!BOTH) {
      KCA_UNROLL
      for (int x = 0; x < 2; x++) k[1][x][0] = k[1][x][1] = k[1][x][2] = k[1][x][3] = 0u;
    }
    KCA_UNROLL
    for (int x = 0; x < NI; x++) {
      const int i = ig + x * (HD / 64);
      float *d = i & 1 ? s2 : s;
      KCA_UNROLL
      for (int hh = 0; hh < 2; hh++) {
        if constexpr (BITS == 0)
          kca_mma16_bf(d, k[0][x][2 * hh], k[1][x][2 * hh], k[0][x][2 * hh + 1],
                       k[1][x][2 * hh + 1], B[i][2 * hh], B[i][2 * hh + 1]);
        else
          kca_mma16_h(d, k[0][x][2 * hh], k[1][x][2 * hh], k[0][x][2 * hh + 1], k[1][x][2 * hh + 1],
                      B[i][2 * hh], B[i][2 * hh + 1]);
      }
    }
  }
  s[0] += s2[0], s[1] += s2[1], s[2] += s2[2], s[3] += s2[3];
}

/* O^T += V^T P^T for a FULL half: rows 2c, 2c + 1 paired by byte permutes; pb = P^T's fragment
 * (tokens 2c, 2c + 1 of head g). */
template <int HD, int BITS>
KCA_FN void kca_pv_full(kca_st_t<HD, BITS> &st, const uint8_t *hs, uint32_t pb, int g, int c) {
  const uint8_t *v0 = hs + 16 * HD + 2 * c * HD * 2;
  KCA_UNROLL
  for (int u = 0; u < HD / 64; u++) {
    const int sw = ((g + 8 * u) ^ (2 * c & 6)) << 4;
    const kca_u4 x = *(const kca_u4 *)(v0 + sw), y = *(const kca_u4 *)(v0 + HD * 2 + sw);
    KCA_UNROLL
    for (int r = 0; r < 4; r++) {
      const uint32_t lo = kca_prmt(x.v[r], y.v[r], 0x5410), hi = kca_prmt(x.v[r], y.v[r], 0x7632);
      if constexpr (BITS == 0)
        kca_mma8_bf(st.acc[4 * u + r], lo, hi, pb);
      else
        kca_mma8_h(st.acc[4 * u + r], kca_bf2h(lo), kca_bf2h(hi), pb);
    }
  }
}

/* The value codes of rows 2c, 2c + 1, chunk ch (8 channels), dequantized with the token pair's
 * scales sc and zeros zr (fp16 pairs): a[2r], a[2r + 1], the A operand of O^T's accumulators
 * 4u + r (rows g, g + 8). */
template <int HD, int BITS>
KCA_FN void kca_vwords(const kca_params_t &p, const uint8_t *hs, int c, int ch, uint32_t sc,
                       uint32_t zr, uint32_t (&a)[8]) {
  using L = kca_lay<HD, BITS>;
  uint32_t x0, x1, y0, y1;
  kca_codes<BITS>(hs + L::vc + 2 * c * L::rb + ch * BITS, &x0, &x1);
  kca_codes<BITS>(hs + L::vc + (2 * c + 1) * L::rb + ch * BITS, &y0, &y1);
  const uint32_t zlo = BITS == 2 ? (x0 | y0 << 16) : kca_prmt(x0, y0, 0x5410);
  const uint32_t zhi = BITS == 4 ? kca_prmt(x0, y0, 0x7632) : 0u;
  if constexpr (BITS == 2 && KCA_PMAGIC) { /* code k of each token at bits 2k of zlo's halves */
    const uint32_t z10 = zlo >> 10;
    const uint32_t v[8] = {kca_c2h<0>(zlo, p), kca_c2h<2>(zlo, p), kca_c2h<4>(zlo, p),
                           kca_c2h<6>(zlo, p), kca_c2h<8>(zlo, p), kca_c2h<0>(z10, p),
                           kca_c2h<2>(z10, p), kca_c2h<4>(z10, p)};
    KCA_UNROLL
    for (int k = 0; k < 8; k++) a[k] = kca_h2fma(v[k], sc, zr);
  } else {
    KCA_UNROLL
    for (int k = 0; k < 8; k++)
      a[k] = kca_h2fma(
          kca_h2sub(kca_vpair<BITS>(x0, x1, y0, y1, zlo, zhi, k, p.mags[0]), KCA_MAGIC), sc, zr);
  }
}

/* The value scales sc[u] and zeros zr[u] (fp16 pairs: rows 2c, 2c + 1) of a QUANT half's chunks
 * g + 8u. gs: log2 of the value group. */
template <int HD, int BITS>
KCA_FN void kca_vmeta(const uint8_t *hs, int g, int c, int gs, uint32_t (&sc)[HD / 64],
                      uint32_t (&zr)[HD / 64]) {
  using L = kca_lay<HD, BITS>;
  if constexpr (HD == 128 && BITS == 2) {
    if (gs == 5) { /* 8-byte metadata rows: rows 2c, 2c + 1 in one 16-byte load; chunk g + 8u's
                      group is g / 4 + 2u, the half g / 4 of word u */
      const kca_u4 s = kca_sld128(hs + L::vm + 16 * c), z = kca_sld128(hs + L::vm + 64 + 16 * c);
      const uint32_t sel = g & 4 ? 0x7632u : 0x5410u;
      KCA_UNROLL
      for (int u = 0; u < 2; u++)
        sc[u] = kca_prmt(s.v[u], s.v[2 + u], sel), zr[u] = kca_prmt(z.v[u], z.v[2 + u], sel);
      return;
    }
  }
  const int mb = (2 * HD) >> gs;
  const uint8_t *vm = hs + L::vm + 2 * c * mb;
  KCA_UNROLL
  for (int u = 0; u < HD / 64; u++) {
    const int gi = (8 * (g + 8 * u)) >> gs;
    sc[u] = *(const uint16_t *)(vm + 2 * gi) | (uint32_t) * (const uint16_t *)(vm + mb + 2 * gi)
                                                    << 16;
    zr[u] = *(const uint16_t *)(vm + 8 * mb + 2 * gi) |
            (uint32_t) * (const uint16_t *)(vm + 9 * mb + 2 * gi) << 16;
  }
}

/* O^T += V^T P^T for a QUANT half: codes of rows 2c, 2c + 1 dequantized as token pairs. */
template <int HD, int BITS>
KCA_FN void kca_pv_quant(const kca_params_t &p, kca_st_t<HD, BITS> &st, const uint8_t *hs,
                         uint32_t ph, int g, int c, int gs) {
  uint32_t sc[HD / 64], zr[HD / 64];
  kca_vmeta<HD, BITS>(hs, g, c, gs, sc, zr);
  KCA_UNROLL
  for (int u = 0; u < HD / 64; u++) {
    uint32_t a[8];
    kca_vwords<HD, BITS>(p, hs, c, g + 8 * u, sc[u], zr[u], a);
    KCA_UNROLL
    for (int r = 0; r < 4; r++) kca_mma8_h(st.acc[4 * u + r], a[2 * r], a[2 * r + 1], ph);
  }
}

/* KCA_G4: O^T += V^T P^T for a pair of QUANT windows (halves at ps and ps + half) in one
 * m16n8k16 a chunk: k 0-7 are the first window's tokens, read by columns 0-3 (b0: pb in lanes
 * g < 4), k 8-15 the second's, read by columns 4-7 (b1: pb in lanes g >= 4). A second window
 * that is not there (two false: the tier's end) is dequantized with zero scales and zeros, since
 * its stage bytes are stale. */
template <int HD, int BITS>
KCA_FN void kca_pv_pair(const kca_params_t &p, kca_st_t<HD, BITS> &st, const uint8_t *ps,
                        uint32_t pb, int g, int c, int gs, bool two) {
  using L = kca_lay<HD, BITS>;
  uint32_t sc[2][HD / 64], zr[2][HD / 64];
  kca_vmeta<HD, BITS>(ps, g, c, gs, sc[0], zr[0]);
  kca_vmeta<HD, BITS>(ps + L::half, g, c, gs, sc[1], zr[1]);
  const uint32_t b0 = g < 4 ? pb : 0u, b1 = g < 4 ? 0u : pb;
  KCA_UNROLL
  for (int u = 0; u < HD / 64; u++) {
    uint32_t a[8], a2[8];
    kca_vwords<HD, BITS>(p, ps, c, g + 8 * u, sc[0][u], zr[0][u], a);
    kca_vwords<HD, BITS>(p, ps + L::half, c, g + 8 * u, two ? sc[1][u] : 0u, two ? zr[1][u] : 0u,
                         a2);
    KCA_UNROLL
    for (int r = 0; r < 4; r++)
      kca_mma16_h(st.acc[4 * u + r], a[2 * r], a[2 * r + 1], a2[2 * r], a2[2 * r + 1], b0, b1);
  }
}

/* The query operand for FULL keys (Q) or for a QUANT window at base pos (Q turned by R(pos)^T). */
template <int HD, bool NEOX>
KCA_FN void kca_query(const kca_params_t &p, const uint32_t (&q)[HD / 32][4], uint32_t *base,
                      int quant, int pos, int lane, uint32_t (&qr)[HD / 32][4]) {
  if (quant) {
    kca_base_init<HD, NEOX>(p, base, pos, lane);
    kca_rot_q<HD, NEOX>(q, base, lane & 3, qr);
    return;
  }
  KCA_UNROLL
  for (int i = 0; i < HD / 32; i++)
    qr[i][0] = q[i][0], qr[i][1] = q[i][1], qr[i][2] = q[i][2], qr[i][3] = q[i][3];
}

/* s[2 h], s[2 h + 1] <- sp[0], sp[1] (selects: a dynamic index would put s in local memory). */
KCA_FN void kca_put_half(float *s, const float *sp, int h) {
  s[0] = h ? s[0] : sp[0], s[1] = h ? s[1] : sp[1];
  s[2] = h ? sp[0] : s[2], s[3] = h ? sp[1] : s[3];
}

/* S of a tile (see kca_qk): both halves through one set of mma when they share the query
 * operand (FULL: Q; QUANT: Q turned by one base), else (one live half, or a pair of windows of
 * different tiers or bases) one set per half. */
template <int HD, int BITS, int ROT, int PK>
KCA_FN void kca_scores(const kca_params_t &p, uint8_t *smem, const uint8_t *stage,
                       const kca_st_t<HD, BITS> &st, const kca_tile_t &t, int live, int warp,
                       int lane, float (&s)[4]) {
  using L = kca_lay<HD, BITS>;
  constexpr bool NEOX = ROT == KCA_ROT_NEOX;
  const int g = lane >> 2, c = lane & 3;
  if constexpr (BITS == 0) {
    if (live == 3) {
      kca_qk<HD, BITS, ROT, PK, 0, true>(p, st.q, stage, nullptr, 0, g, c, s);
    } else {
      const int h = live >> 1;
      float sp[4];
      kca_qk<HD, BITS, ROT, PK, 0, false>(p, st.q, stage, nullptr, h, g, c, sp);
      kca_put_half(s, sp, h);
    }
    return;
  }
  if constexpr (ROT == KCA_ROT_ABS) { /* one query operand for every tier: one set of mma */
    const int kq = kca_tq(t, 0) | kca_tq(t, 1) << 1;
    if (live == 3) {
      if (kq == 3) /* both QUANT first: the INT2 tiles are most of a tiered walk */
        kca_qk<HD, BITS, ROT, PK, 3, true>(p, st.q, stage, nullptr, 0, g, c, s);
      else if (kq == 0)
        kca_qk<HD, BITS, ROT, PK, 0, true>(p, st.q, stage, nullptr, 0, g, c, s);
      else if (kq == 1)
        kca_qk<HD, BITS, ROT, PK, 1, true>(p, st.q, stage, nullptr, 0, g, c, s);
      else
        kca_qk<HD, BITS, ROT, PK, 2, true>(p, st.q, stage, nullptr, 0, g, c, s);
      return;
    }
    const int h = live >> 1;
    float sp[4];
    if (kq >> h & 1)
      kca_qk<HD, BITS, ROT, PK, 1, false>(p, st.q, stage, nullptr, h, g, c, sp);
    else
      kca_qk<HD, BITS, ROT, PK, 0, false>(p, st.q, stage, nullptr, h, g, c, sp);
    kca_put_half(s, sp, h);
    return;
  }
  uint32_t *base = (uint32_t *)(smem + L::base) + warp * HD;
  const uint32_t *off = (const uint32_t *)(smem + L::off);
  uint32_t qr[HD / 32][4]; /* the query operand: Q, or Q turned by a QUANT window's base */
  const int k0 = kca_tq(t, 0), k1 = kca_tq(t, 1);
  if (live == 3 && k0 == k1 && (!k0 || t.base[0] == t.base[1])) {
    kca_query<HD, NEOX>(p, st.q, base, k0, t.base[0], lane, qr);
    if (k0)
      kca_qk<HD, BITS, ROT, PK, 3, true>(p, qr, stage, off, 0, g, c, s);
    else
      kca_qk<HD, BITS, ROT, PK, 0, true>(p, qr, stage, off, 0, g, c, s);
    return;
  }
  KCA_UNROLL1
  for (int h = 0; h < 2; h++) { /* (one array filled per pass: choosing between two arrays would
                                   put both in local memory) */
    if (!(live >> h & 1)) continue;
    const int kind = h ? k1 : k0;
    float sp[4];
    kca_query<HD, NEOX>(p, st.q, base, kind, h ? t.base[1] : t.base[0], lane, qr);
    if (kind)
      kca_qk<HD, BITS, ROT, PK, 1, false>(p, qr, stage, off, h, g, c, sp);
    else
      kca_qk<HD, BITS, ROT, PK, 0, false>(p, qr, stage, off, h, g, c, sp);
    kca_put_half(s, sp, h);
  }
}

/* One tile whose bytes are in stage: scores, online softmax, P.V. */
template <int HD, int BITS, int ROT, int PK>
KCA_FN kca_tp_t kca_compute(const kca_params_t &p, uint8_t *smem, const uint8_t *stage,
                            kca_st_t<HD, BITS> &st, const kca_tile_t &t, int warp, int lane,
                            int gs) {
  using L = kca_lay<HD, BITS>;
  const int g = lane >> 2, c = lane & 3;
  float s[4] = {0, 0, 0, 0};
  const int live = (kca_tn(t, 0) ? 1 : 0) | (kca_tn(t, 1) ? 2 : 0);
  kca_scores<HD, BITS, ROT, PK>(p, smem, stage, st, t, live, warp, lane, s);
  if constexpr (PK == 4) { /* the row mask (kca_issue4) */
    const uint32_t vm = (uint32_t)t.bits >> 16;
    const bool ok0 = vm >> g & 1, ok1 = vm >> (8 + g) & 1;
    s[0] = ok0 ? s[0] : KCA_NEGINF, s[1] = ok0 ? s[1] : KCA_NEGINF;
    s[2] = ok1 ? s[2] : KCA_NEGINF, s[3] = ok1 ? s[3] : KCA_NEGINF;
  }
  const kca_tp_t r = kca_softmax<HD, BITS>(st, s, t, g);
  KCA_UNROLL
  for (int h = 0; h < 2; h++) {
    if (!(live >> h & 1)) continue;
    const uint8_t *hs = stage + h * L::half;
    const uint32_t pt =
        BITS ? kca_pack_h(r.p[2 * h], r.p[2 * h + 1]) : kca_pack_bf(r.p[2 * h], r.p[2 * h + 1]);
    const uint32_t pb = kca_movt(pt, lane); /* P^T: tokens 2c, 2c + 1 of head g */
    if constexpr (BITS != 0) {
      if (kca_tq(t, h)) {
        kca_pv_quant<HD, BITS>(p, st, hs, pb, g, c, gs);
        continue;
      }
    }
    kca_pv_full<HD, BITS>(st, hs, pb, g, c);
  }
  return r;
}

/* ---------------------------------------------------------------- masses */

/* Sums of v[0..3] over the 8 lanes of each c (g = 0..7) with 4 shuffles; returns the total of
 * v[2 b2 + b1], (b2, b1) = bits 2 and 1 of g (both lanes of g and g ^ 1 hold it). */
KCA_FN float kca_sum4(const float (&v)[4], int g) {
  const int b2 = g >> 2 & 1, b1 = g >> 1 & 1;
  const float x0 = kca_shfl_xor(b2 ? v[0] : v[2], 16), x1 = kca_shfl_xor(b2 ? v[1] : v[3], 16);
  const float u0 = (b2 ? v[2] : v[0]) + x0, u1 = (b2 ? v[3] : v[1]) + x1;
  float w = (b1 ? u1 : u0) + kca_shfl_xor(b1 ? u0 : u1, 8);
  return w + kca_shfl_xor(w, 4);
}

/* Sums of v[0..1] over the 8 lanes of each c with 3 shuffles; returns the total of v[bit 2 of g].
 */
KCA_FN float kca_sum2(const float (&v)[2], int g) {
  const int b2 = g >> 2 & 1;
  float u = (b2 ? v[1] : v[0]) + kca_shfl_xor(b2 ? v[0] : v[1], 16);
  u += kca_shfl_xor(u, 8);
  return u + kca_shfl_xor(u, 4);
}

/* Writes window w's log-sum-exp for head 2c + e (sum: its probability sum this tile scale). */
KCA_FN void kca_put_wlse(const kca_params_t &p, float m, int w, int kvh, int head, float sum) {
  if (p.wlse && head < p.grp_q)
    p.wlse[(size_t)w * p.n_head + kvh * p.grp_q + head] = m + kca_lg2(sum);
}

/* The window of bit i of a PK 4 tile (kca_issue4: w[0] is position kbase's window, kbase a
 * multiple of 32; positions run in groups of 4 consecutive windows, KCA_NW groups apart). */
KCA_FN int kca_win4(const kca_tile_t &t, int i) { return t.w[0] + 4 * KCA_NW * (i >> 2) + (i & 3); }

/* PK 4: the tile's windows are done. Lane (g, c) sums rows 4 (g / 4) .. + 3 of each half (a
 * window, slot 2 h + g / 4) for heads 2c, 2c + 1 and writes the one of (h, e) = (g % 4) / 2, g % 2.
 */
template <int HD, int BITS>
KCA_FN void kca_masses4(const kca_params_t &p, const kca_st_t<HD, BITS> &st, const kca_tile_t &t,
                        const kca_tp_t &r, int kvh, int lane) {
  const int g = lane >> 2, c = lane & 3;
  float v[4];
  KCA_UNROLL
  for (int i = 0; i < 4; i++) {
    v[i] = r.p[i] + kca_shfl_xor(r.p[i], 4);
    v[i] += kca_shfl_xor(v[i], 8);
  }
  const int i = g & 3, e = i & 1, slot = 2 * (i >> 1) + (g >> 2);
  const float tot = i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3]; /* (selects) */
  uint32_t m = (uint32_t)t.w[1];
  for (int x = 0; x < slot; x++) m &= m - 1u;
  if (m) kca_put_wlse(p, e ? st.m[1] : st.m[0], kca_win4(t, kca_ctz(m)), kvh, 2 * c + e, tot);
}

/* PK 2: the lane's row of wlse (window 0, head 2c + e of kvh) when it writes one, else NULL. */
KCA_FN float *kca_wl2(const kca_params_t &p, int kvh, int lane) {
  const int g = lane >> 2, c = lane & 3, head = 2 * c + (g >> 1 & 1);
  return p.wlse && !(g & 1) && head < p.grp_q ? p.wlse + kvh * p.grp_q + head : (float *)0;
}

/* PK 2: the masses of a pair of windows wa, wb (na, nb tokens; 0: none) from v[2 h + e], the
 * probabilities of half h, head 2c + e; wl: kca_wl2. */
template <int HD, int BITS>
KCA_FN void kca_mass_pair(const kca_params_t &p, const kca_st_t<HD, BITS> &st, const float (&v)[4],
                          int wa, int wb, int na, int nb, int g, float *wl) {
  const float tot = kca_sum4(v, g); /* v[2 h + e]: window of half h, head 2c + e */
  const int h = g >> 2 & 1;
  const float m = g & 2 ? st.m[1] : st.m[0]; /* selects: a dynamic index would demote st */
  if (wl && (h ? nb : na)) wl[(size_t)(h ? wb : wa) * p.n_head] = m + kca_lg2(tot);
}

/* After a tile: a pair's two windows are done; a wide window accumulates its lane partials
 * (heads 2c, 2c + 1) until its last tile. */
template <int HD, int BITS, int PK>
KCA_FN void kca_masses(const kca_params_t &p, const kca_st_t<HD, BITS> &st, const kca_tile_t &t,
                       const kca_tp_t &r, float (&wsum)[2], int kvh, int lane, float *wl) {
  const int g = lane >> 2, c = lane & 3;
  if (!p.wlse) return; /* no masses asked (FullKV's calls) */
  if constexpr (PK == 4) {
    kca_masses4(p, st, t, r, kvh, lane);
  } else if constexpr (PK == 2) { /* wl: kca_wl2 */
    kca_mass_pair<HD, BITS>(p, st, r.p, t.w[0], t.w[1], kca_tn(t, 0), kca_tn(t, 1), g, wl);
  } else {
    KCA_UNROLL
    for (int e = 0; e < 2; e++) wsum[e] = wsum[e] * r.alpha[e] + (r.p[e] + r.p[2 + e]);
    if (t.bits >> 10 & 1) {
      const float tot = kca_sum2(wsum, g);
      const int e = g >> 2 & 1;
      if (!(g & 3)) kca_put_wlse(p, e ? st.m[1] : st.m[0], t.w[0], kvh, 2 * c + e, tot);
      wsum[0] = wsum[1] = 0.0f;
    }
  }
}

/* KCA_QUAD: a quad tile (kca_issue_lq): both pairs' scores (two independent mma chains), one
 * softmax step over the four halves, the P.V of its live halves, and its windows' masses. */
template <int HD, int BITS, int ROT, int PK>
KCA_FN void kca_compute_quad(const kca_params_t &p, const uint8_t *stage, kca_st_t<HD, BITS> &st,
                             const kca_tile_t &t, int lane, int gs, float *wl) {
  using L = kca_lay<HD, BITS>;
  const int g = lane >> 2, c = lane & 3;
  float s[8];
  kca_qk<HD, BITS, ROT, PK, 3, true>(p, st.q, stage, nullptr, 0, g, c, s);
  kca_qk<HD, BITS, ROT, PK, 3, true>(p, st.q, stage + L::qo, nullptr, 0, g, c, s + 4);
  const kca_tpn<4> r = kca_softmax<HD, BITS, 4>(st, s, t, g);
  KCA_UNROLL
  for (int h = 0; h < 4; h++) {
    if (!kca_tn(t, h)) continue; /* (a half past the tier's end: its stage bytes are stale) */
    const uint32_t pb = kca_movt(kca_pack_h(r.p[2 * h], r.p[2 * h + 1]), lane);
    kca_pv_quant<HD, BITS>(p, st, stage + (h & 1) * L::half + (h >> 1) * L::qo, pb, g, c, gs);
  }
  if (!p.wlse) return;
  KCA_UNROLL
  for (int x = 0; x < 2; x++) {
    const float v[4] = {r.p[4 * x], r.p[4 * x + 1], r.p[4 * x + 2], r.p[4 * x + 3]};
    kca_mass_pair<HD, BITS>(p, st, v, x ? t.base[0] : t.w[0], x ? t.base[1] : t.w[1],
                            kca_tn(t, 2 * x), kca_tn(t, 2 * x + 1), g, wl);
  }
}

/* ---------------------------------------------------------------- KCA_G4 tiles */

/* KCA_G4: the online-softmax step of a tile of NP pairs (see kca_softmax): lane (g, c) holds
 * s[2x + e], token g of half 2x + c / 2 for head (2c + e) & 3; the max is reduced over lanes c
 * and c ^ 2 too, so both keep the heads' running max. */
template <int HD, int BITS, int NP>
KCA_FN kca_tpn<NP> kca_softmax_g4(kca_st_t<HD, BITS> &st, float (&s)[2 * NP], const kca_tile_t &t,
                                  int g, int c) {
  kca_tpn<NP> r;
  float mt[2];
  KCA_UNROLL
  for (int e = 0; e < 2; e++) {
    KCA_UNROLL
    for (int x = 0; x < NP; x++)
      s[2 * x + e] = g < kca_tn(t, 2 * x + (c >> 1)) ? s[2 * x + e] : KCA_NEGINF;
    mt[e] = s[e];
    KCA_UNROLL
    for (int x = 1; x < NP; x++) mt[e] = kca_maxf(mt[e], s[2 * x + e]);
  }
  kca_vote<HD, BITS, true>(st, mt, r.alpha);
  KCA_UNROLL
  for (int e = 0; e < 2; e++) {
    float ps = 0.0f;
    KCA_UNROLL
    for (int x = 0; x < NP; x++) {
      r.p[2 * x + e] = kca_ex2(s[2 * x + e] - st.m[e]);
      ps += r.p[2 * x + e];
    }
    st.l[e] = st.l[e] * r.alpha[e] + ps;
  }
  return r;
}

/* KCA_G4 quads: the scores of the INT2 pair at ps (halves ps, ps + half) added to d (lane (g, c):
 * d[0..1] row g, the first window, d[2..3] row g + 8, the second; columns 2c, 2c + 1). Column n
 * holds Q of head n & 3 times the key scales of the pair's window n / 4, the A operand the codes
 * (0..3 exactly), so only rows g of columns 0-3 and rows g + 8 of columns 4-7 are scores. */
template <int HD>
KCA_FN void kca_qk_fold(const kca_params_t &p, const uint32_t (&q)[HD / 32][4], const uint8_t *ps,
                        int g, int c, float (&d)[4]) {
  using L = kca_lay<HD, 2>;
  float d2[4] = {0, 0, 0, 0};
  const uint8_t *ks = ps + (g >> 2) * L::half + L::km; /* column g's window's key scales */
  KCA_UNROLL
  for (int i = 0; i < HD / 32; i++) {
    const kca_u4 sc = kca_sld128(ks + (c + 4 * i) * 16);
    uint32_t b[4], k[2][4];
    KCA_UNROLL
    for (int r = 0; r < 4; r++) b[r] = kca_h2mul(q[i][r], sc.v[r]);
    KCA_UNROLL
    for (int h = 0; h < 2; h++) { /* codes 2r, 2r + 1 at bits 4r of ws's halves (kca_kwords) */
      uint32_t w0, w1;
      kca_codes<2>(ps + h * L::half + g * L::rb + (c + 4 * i) * 2, &w0, &w1);
      const uint32_t ws = w0 | w0 << 14;
      k[h][0] = kca_c2h<0>(ws, p), k[h][1] = kca_c2h<4>(ws, p);
      k[h][2] = kca_c2h<8>(ws, p), k[h][3] = kca_c2h<0>(ws >> 12, p);
    }
    float *dd = i & 1 ? d2 : d;
    KCA_UNROLL
    for (int hh = 0; hh < 2; hh++)
      kca_mma16_h(dd, k[0][2 * hh], k[1][2 * hh], k[0][2 * hh + 1], k[1][2 * hh + 1], b[2 * hh],
                  b[2 * hh + 1]);
  }
  d[0] += d2[0], d[1] += d2[1], d[2] += d2[2], d[3] += d2[3];
}

/* KCA_G4 quads: the zero points' part of the quad's scores, C[w][h] = z_w . Q_h for its windows
 * w = 2x + y (pair x, half y; rows 0-3 of one mma, lane (g, c) loading window g & 3's zeros),
 * given to the lanes that hold window 2x + c / 2: z[2x + e] for head (2c + e) & 3. */
template <int HD>
KCA_FN void kca_kzero(const uint8_t *stage, const uint32_t (&q)[HD / 32][4], int g, int c,
                      float (&z)[4]) {
  using L = kca_lay<HD, 2>;
  const int w = g & 3;
  const uint8_t *zp = stage + (w & 1) * L::half + (w >> 1) * L::qo + L::km + 2 * HD;
  float d[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  KCA_UNROLL
  for (int i = 0; i < HD / 32; i++) {
    const kca_u4 kz = kca_sld128(zp + (c + 4 * i) * 16);
    KCA_UNROLL
    for (int hh = 0; hh < 2; hh++)
      kca_mma16_h(d[i & 1], kz.v[2 * hh], 0u, kz.v[2 * hh + 1], 0u, q[i][2 * hh], q[i][2 * hh + 1]);
  }
  KCA_UNROLL
  for (int x = 0; x < 2; x++) {
    const int src = 4 * (2 * x + (c >> 1)) + c;
    z[2 * x] = kca_shfl(d[0][0] + d[1][0], src), z[2 * x + 1] = kca_shfl(d[0][1] + d[1][1], src);
  }
}

/* KCA_G4: lane (g, c)'s wlse row when it writes one (g % 4 == 0: head (2c + g / 4) & 3 of the
 * pair's window c / 2), else NULL. */
KCA_FN float *kca_wl_g4(const kca_params_t &p, int kvh, int lane) {
  const int g = lane >> 2, c = lane & 3, head = (2 * c + (g >> 2)) & 3;
  return p.wlse && !(g & 3) && head < p.grp_q ? p.wlse + kvh * p.grp_q + head : (float *)0;
}

/* KCA_G4: the masses of a pair of windows wa, wb (na, nb tokens) from v[e], lane (g, c)'s
 * probabilities (window c / 2, head (2c + e) & 3); wl: kca_wl_g4. */
template <int HD, int BITS>
KCA_FN void kca_mass_g4(const kca_params_t &p, const kca_st_t<HD, BITS> &st, const float (&v)[2],
                        int wa, int wb, int na, int nb, int g, int c, float *wl) {
  const float tot = kca_sum2(v, g); /* of v[g / 4] */
  const float m = g & 4 ? st.m[1] : st.m[0];
  if (wl && (c >> 1 ? nb : na)) wl[(size_t)(c >> 1 ? wb : wa) * p.n_head] = m + kca_lg2(tot);
}

/* KCA_G4: a pair tile (FULL, or INT2 through kca_scores): scores, softmax, P.V, masses. */
template <int HD, int BITS, int ROT, int PK>
KCA_FN void kca_compute_g4(const kca_params_t &p, uint8_t *smem, const uint8_t *stage,
                           kca_st_t<HD, BITS> &st, const kca_tile_t &t, int warp, int lane, int gs,
                           float *wl) {
  using L = kca_lay<HD, BITS>;
  const int g = lane >> 2, c = lane & 3;
  float s[4] = {0, 0, 0, 0};
  const int live = (kca_tn(t, 0) ? 1 : 0) | (kca_tn(t, 1) ? 2 : 0);
  kca_scores<HD, BITS, ROT, PK>(p, smem, stage, st, t, live, warp, lane, s);
  float sp[2] = {c < 2 ? s[0] : s[2], c < 2 ? s[1] : s[3]};
  const kca_tpn<1> r = kca_softmax_g4<HD, BITS, 1>(st, sp, t, g, c);
  const uint32_t pb = kca_movt(kca_pack_h(r.p[0], r.p[1]), lane);
  KCA_UNROLL
  for (int h = 0; h < 2; h++) {
    if (!(live >> h & 1)) continue;
    const uint32_t ph = (g < 4) == (h == 0) ? pb : 0u; /* half h's columns */
    if (kca_tq(t, h))
      kca_pv_quant<HD, BITS>(p, st, stage + h * L::half, ph, g, c, gs);
    else
      kca_pv_full<HD, BITS>(st, stage + h * L::half, ph, g, c);
  }
  if (p.wlse)
    kca_mass_g4<HD, BITS>(p, st, r.p, t.w[0], t.w[1], kca_tn(t, 0), kca_tn(t, 1), g, c, wl);
}

/* KCA_G4: a quad tile: the zero points' part, both pairs' folded scores, one softmax step, each
 * live pair's P.V in one set of mma, the masses. */
template <int HD, int BITS>
KCA_FN void kca_compute_quad_g4(const kca_params_t &p, const uint8_t *stage,
                                kca_st_t<HD, BITS> &st, const kca_tile_t &t, int lane, int gs,
                                float *wl) {
  using L = kca_lay<HD, BITS>;
  const int g = lane >> 2, c = lane & 3;
  float z[4], s[4];
  kca_kzero<HD>(stage, st.q, g, c, z);
  KCA_UNROLL
  for (int x = 0; x < 2; x++) {
    float d[4] = {z[2 * x], z[2 * x + 1], z[2 * x], z[2 * x + 1]};
    kca_qk_fold<HD>(p, st.q, stage + x * L::qo, g, c, d);
    s[2 * x] = c < 2 ? d[0] : d[2], s[2 * x + 1] = c < 2 ? d[1] : d[3];
  }
  const kca_tpn<2> r = kca_softmax_g4<HD, BITS, 2>(st, s, t, g, c);
  KCA_UNROLL
  for (int x = 0; x < 2; x++) {
    if (!kca_tn(t, 2 * x)) continue; /* (past the tier's end: its stage bytes are stale) */
    const uint32_t pb = kca_movt(kca_pack_h(r.p[2 * x], r.p[2 * x + 1]), lane);
    kca_pv_pair<HD, BITS>(p, st, stage + x * L::qo, pb, g, c, gs, kca_tn(t, 2 * x + 1) != 0);
  }
  if (!p.wlse) return;
  KCA_UNROLL
  for (int x = 0; x < 2; x++) {
    const float v[2] = {r.p[2 * x], r.p[2 * x + 1]};
    kca_mass_g4<HD, BITS>(p, st, v, x ? t.base[0] : t.w[0], x ? t.base[1] : t.w[1],
                          kca_tn(t, 2 * x), kca_tn(t, 2 * x + 1), g, c, wl);
  }
}

/* ---------------------------------------------------------------- the chunk block */

/* Q of head kvh * G + g (G4: g & 3), channels of chunks c + 4i, scaled by scale * log2(e). */
template <int HD, int BITS, bool G4>
KCA_FN void kca_load_q(const kca_params_t &p, kca_st_t<HD, BITS> &st, int b, int kvh, int g,
                       int c) {
  const int hq = G4 ? g & 3 : g;
  const bool ok = hq < p.grp_q;
  const float *qp = p.q + ((size_t)b * p.n_head + kvh * p.grp_q + (ok ? hq : 0)) * HD;
  KCA_UNROLL
  for (int i = 0; i < HD / 32; i++) {
    float x[8];
    kca_ldq8(qp + 8 * (c + 4 * i), x);
    KCA_UNROLL
    for (int r = 0; r < 4; r++) {
      float x0 = ok ? x[2 * r] * p.qscale : 0.0f;
      float x1 = ok ? x[2 * r + 1] * p.qscale : 0.0f;
      if constexpr (BITS == 0) {
        st.q[i][r] = kca_pack_bf(x0, x1);
      } else { /* saturate to the fp16 range */
        x0 = x0 > 65504.0f ? 65504.0f : x0 < -65504.0f ? -65504.0f : x0;
        x1 = x1 > 65504.0f ? 65504.0f : x1 < -65504.0f ? -65504.0f : x1;
        st.q[i][r] = kca_pack_h(x0, x1);
      }
    }
  }
}

/* Head hh's final log-sum-exp over the block's warps (ml: their max and sum); the sum's order is
 * the epilogue's. */
typedef float kca_ml_t[KCA_GMAX][2]; /* one warp's max and sum per head (epilogue) */

KCA_FN float kca_head_lse(const kca_ml_t *ml, int hh) {
  float mx = KCA_NEGINF, sum = 0.0f;
  for (int w = 0; w < KCA_NW; w++) mx = kca_maxf(mx, ml[w][hh][0]);
  if (mx == KCA_NEGINF) return mx;
  for (int w = 0; w < KCA_NW; w++) sum += ml[w][hh][1] * kca_ex2(ml[w][hh][0] - mx);
  return mx + kca_lg2(sum);
}

/* Block epilogue: merges the warps' softmax states and writes the chunk's partial, or (alone:
 * the sequence's only chunk) the heads' outputs. Returns the warps' max and sum (shared). G4:
 * column h + 4 is added to h first (kca_g4). */
template <int HD, int BITS, bool G4>
KCA_FN const kca_ml_t *kca_epilogue(const kca_params_t &p, uint8_t *smem, kca_st_t<HD, BITS> &st,
                                    int b, int chunk, int kvh, int tid, bool alone) {
  using L = kca_lay<HD, BITS>;
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  float(*o)[KCA_GMAX][HD] = (float(*)[KCA_GMAX][HD])smem; /* reuses the stages */
  kca_ml_t *ml = (kca_ml_t *)(smem + L::ml);
  float l[2] = {st.l[0], st.l[1]};
  KCA_UNROLL
  for (int e = 0; e < 2; e++) {
    l[e] += kca_shfl_xor(l[e], 4);
    l[e] += kca_shfl_xor(l[e], 8);
    l[e] += kca_shfl_xor(l[e], 16);
    if (G4) l[e] += kca_shfl_xor(l[e], 2);
  }
  if constexpr (G4) {
    KCA_UNROLL
    for (int j = 0; j < HD / 16; j++) KCA_UNROLL
    for (int k = 0; k < 4; k++) st.acc[j][k] += kca_shfl_xor(st.acc[j][k], 2);
  }
  kca_syncthreads(); /* every warp is done with its stages */
  if (g == 0) {
    ml[warp][2 * c][0] = st.m[0], ml[warp][2 * c][1] = l[0];
    ml[warp][2 * c + 1][0] = st.m[1], ml[warp][2 * c + 1][1] = l[1];
  }
  KCA_UNROLL
  for (int u = 0; u < HD / 64; u++) KCA_UNROLL
  for (int r = 0; r < 4; r++) {
    const int d = 8 * (g + 8 * u) + 2 * r, j = 4 * u + r;
    o[warp][2 * c][d] = st.acc[j][0], o[warp][2 * c + 1][d] = st.acc[j][1];
    o[warp][2 * c][d + 1] = st.acc[j][2], o[warp][2 * c + 1][d + 1] = st.acc[j][3];
  }
  kca_syncthreads();
  const size_t row0 = ((size_t)b * p.n_chunk + chunk) * p.n_head + (size_t)kvh * p.grp_q;
  const size_t orow0 = (size_t)b * p.n_head + (size_t)kvh * p.grp_q;
  for (int e = tid; e < p.grp_q * HD; e += KCA_NT) {
    const int hh = e / HD, d = e % HD;
    float mx = KCA_NEGINF;
    for (int w = 0; w < KCA_NW; w++) mx = kca_maxf(mx, ml[w][hh][0]);
    float acc = 0.0f, lse = KCA_NEGINF;
    if (mx != KCA_NEGINF) {
      float sum = 0.0f;
      for (int w = 0; w < KCA_NW; w++) {
        const float f = kca_ex2(ml[w][hh][0] - mx);
        sum += ml[w][hh][1] * f, acc += o[w][hh][d] * f;
      }
      acc /= sum, lse = mx + kca_lg2(sum);
    }
    if (alone) {
      p.out[(orow0 + hh) * HD + d] = acc;
      continue;
    }
    p.part_o[(row0 + hh) * HD + d] = acc;
    if (d == 0) p.part_lse[row0 + hh] = lse;
  }
  return ml;
}

/* A sequence alone in its chunk, with masses: this block's KV head's share of each window's mass
 * (kvmass), then, in the last of the sequence's n_kv blocks, the masses (the combine's sums). */
KCA_FN void kca_alone_masses(const kca_params_t &p, const kca_ml_t *ml, int b, int kvh, int tid,
                             int *last) {
  const int w_beg = p.seq_win[b], w_end = kca_seq_end(p, b);
  float lse[KCA_GMAX];
  KCA_UNROLL
  for (int hh = 0; hh < KCA_GMAX; hh++) lse[hh] = hh < p.grp_q ? kca_head_lse(ml, hh) : KCA_NEGINF;
  for (int w = w_beg + tid; w < w_end; w += KCA_NT)
    p.kvmass[(size_t)w * p.n_kv + kvh] = kca_win_live(p, w) ? kca_kv_mass(p, w, kvh, lse) : 0.0f;
  kca_fence();
  kca_syncthreads();
  if (tid == 0) *last = kca_ticket(p.tickets + b) == (uint32_t)(p.n_kv - 1);
  kca_syncthreads();
  if (!*last) return;
  kca_fence();
  for (int w = w_beg + tid; w < w_end; w += KCA_NT) {
    float s = 0.0f;
    for (int k = 0; k < p.n_kv; k++) s += kca_ldcg(p.kvmass + (size_t)w * p.n_kv + k);
    p.mass[w] = (p.mass_acc ? p.mass[w] : 0.0f) + s / (float)p.n_head;
  }
  if (tid == 0) p.tickets[b] = 0; /* ready for the next call */
}

/* KCA_QLATE: the kernel loads Q after its walk's first copies are issued. */
template <int BITS> struct kca_ql {
  static constexpr bool v = KCA_QLATE && BITS == 0;
};

/* The walk's first tile, the tile after cu (ntile: tiles of cu's unit) and a tile's issue, by
 * the kernel's walk: KCA_LIST (with KCA_QUAD: quads), or the units'. */
template <int HD, int BITS, int ROT, int PK, bool LS, bool G4>
KCA_FN kca_cur_t kca_walk_first(const kca_params_t &p, kca_live_t &L, int lane) {
  if constexpr (LS)
    return kca_list_next<kca_qd<HD, BITS, ROT, PK>::v ? 4 : 2, G4 && KCA_DRING4>(p, L);
  else
    return kca_first<PK>(p, L, lane);
}
template <int HD, int BITS, int ROT, int PK, bool LS, bool G4>
KCA_FN kca_cur_t kca_walk_next(const kca_params_t &p, kca_live_t &L, kca_cur_t cu, int ntile,
                               int lane) {
  if constexpr (LS)
    return kca_list_next<kca_qd<HD, BITS, ROT, PK>::v ? 4 : 2, G4 && KCA_DRING4>(p, L);
  else
    return kca_advance<PK>(p, L, cu, ntile, lane);
}
template <int HD, int BITS, int ROT, int PK, bool PL, bool LS>
KCA_FN kca_tile_t kca_walk_issue(const kca_params_t &p, uint8_t *stage, int soff,
                                 const kca_plan_t &pl, const kca_live_t &L, kca_cur_t cu, int kvh,
                                 int lane, int gs, int *ntile, const uint8_t *ds = nullptr) {
  if constexpr (kca_qd<HD, BITS, ROT, PK>::v)
    return kca_issue_lq<HD, BITS>(p, stage, soff, pl, L, cu.k, kvh, lane, gs, ds);
  else
    return kca_issue<HD, BITS, PK, PL, LS>(p, stage, soff, pl, L, cu, kvh, lane, gs, ntile);
}

/* One walk of a warp's tiles (the chunk's; KCA_LIST: a segment's): a two-stage cp.async
 * pipeline, tile i + 1 in flight while tile i is computed. qload: Q is still to be loaded
 * (kca_ql: after the first tile's copies are issued). */
template <int HD, int BITS, int ROT, int PK, bool PL, bool LS, bool G4>
KCA_FN void kca_walk(const kca_params_t &p, uint8_t *smem, kca_st_t<HD, BITS> &st, kca_live_t &L,
                     const kca_plan_t &pl, int b, int kvh, int tid, int gs, bool &qload) {
  using Ly = kca_lay<HD, BITS>;
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  uint8_t *stages = smem + warp * Ly::warp;
  kca_cur_t cur = kca_walk_first<HD, BITS, ROT, PK, LS, G4>(p, L, lane), nxt = {-1, 0};
  kca_tile_t tc, tn;
  int nt = 0, stage = 0;
  float wsum[2] = {0.0f, 0.0f};
  float *const wl = G4 ? kca_wl_g4(p, kvh, lane) : PK == 2 ? kca_wl2(p, kvh, lane) : (float *)0;
  constexpr bool DR = G4 && KCA_DRING4; /* tile k's descriptors in ring slot k % 4 (KCA_DR0G:
                                           tile 0 reads its own from global memory) */
  uint8_t *const ring = DR ? smem + Ly::ring + warp * KCA_DRB4 : nullptr;
  int ord = 0; /* DR: the walk's tile being computed */
  if (DR && cur.k >= 0 && KCA_DR0G) { /* tiles 1 and 2's descriptors (tile 0 reads its own) */
    kca_dfetch4(p, L, ring, L.jt + KCA_NW, 1, lane);
    kca_dfetch4(p, L, ring, L.jt + 2 * KCA_NW, 2, lane);
    kca_cp_commit();
  } else if (DR && cur.k >= 0) { /* the first two tiles' descriptors, before the walk */
    kca_dfetch4(p, L, ring, L.jt, 0, lane);
    kca_dfetch4(p, L, ring, L.jt + KCA_NW, 1, lane);
    kca_cp_commit();
    kca_cp_wait0();
    kca_syncwarp();
  }
  if (cur.k >= 0) {
    tc = kca_walk_issue<HD, BITS, ROT, PK, PL, LS>(p, stages, 0, pl, L, cur, kvh, lane, gs, &nt,
                                                    KCA_DR0G ? nullptr : ring);
    if (DR && !KCA_DR0G) kca_dfetch4(p, L, ring, L.jt + 2 * KCA_NW, 2, lane); /* with tile 0's */
    kca_cp_commit();
    nxt = kca_walk_next<HD, BITS, ROT, PK, LS, G4>(p, L, cur, nt, lane);
  }
  if (kca_ql<BITS>::v && qload) kca_load_q<HD, BITS, G4>(p, st, b, kvh, g, c); /* after copies */
  qload = false;
  constexpr bool DREG = PK == 1 && KCA_DREG >= (BITS ? 2 : 1);
  kca_wraw_t wd = {}; /* DREG: nxt's descriptor as loaded, decoded at its issue (the load's
                         latency then overlaps a tile's work; decoded at once it was 70% of
                         the FullKV walk's stall samples, 2026-12-05) */
  if (DREG && nxt.k >= 0) wd = kca_wraw(p, kca_pos_win<PK>(L, nxt.k));
  while (cur.k >= 0) {
    const int so = (stage ^ 1) * Ly::stage;
    if (nxt.k >= 0) {
      if (DR && KCA_DR0G && ord == 0) { /* tiles 1 and 2's descriptors have landed */
        kca_cp_wait1();
        kca_syncwarp();
      }
      if constexpr (DREG)
        tn = kca_issue1<HD, BITS, PL>(p, stages + so, so, pl,
                                      kca_getwin_dec<PL, BITS>(p, wd, lane),
                                      kca_pos_win<PK>(L, nxt.k), 16 * nxt.j, kvh, lane, gs, &nt);
      else
        tn = kca_walk_issue<HD, BITS, ROT, PK, PL, LS>(p, stages + so, so, pl, L, nxt, kvh, lane,
                                                        gs, &nt,
                                                        DR ? ring + ((ord + 1) & 3) * KCA_DRS4
                                                           : nullptr); /* its ring slot */
      if (DR) kca_dfetch4(p, L, ring, L.jt + 2 * KCA_NW, ord + 3, lane); /* ready two waits on */
    }
    kca_cp_commit();
    kca_cur_t nn = nxt;
    if (nxt.k >= 0) nn = kca_walk_next<HD, BITS, ROT, PK, LS, G4>(p, L, nxt, nt, lane);
    if (DREG && nn.k >= 0) wd = kca_wraw(p, kca_pos_win<PK>(L, nn.k));
    kca_cp_wait1();
    kca_syncwarp();
    if (KCA_TRACE && ord == 0 && lane == 0) kca_tr(9 + warp);
    bool done = false;
    if constexpr (G4) {
      if (kca_is_quad(tc))
        kca_compute_quad_g4<HD, BITS>(p, stages + stage * Ly::stage, st, tc, lane, gs, wl);
      else
        kca_compute_g4<HD, BITS, ROT, PK>(p, smem, stages + stage * Ly::stage, st, tc, warp, lane,
                                          gs, wl);
      done = true;
    } else if constexpr (kca_qd<HD, BITS, ROT, PK>::v) {
      if ((done = kca_is_quad(tc)))
        kca_compute_quad<HD, BITS, ROT, PK>(p, stages + stage * Ly::stage, st, tc, lane, gs, wl);
    }
    if (!done) {
      const kca_tp_t r = kca_compute<HD, BITS, ROT, PK>(p, smem, stages + stage * Ly::stage, st, tc,
                                                        warp, lane, gs);
      kca_masses<HD, BITS, PK>(p, st, tc, r, wsum, kvh, lane, wl);
    }
    kca_syncwarp(); /* the stage is free for the tile after next */
    cur = nxt, tc = tn, nxt = nn, stage ^= 1, ord++;
  }
}

/* The chunk kernel's body: block (chunk, kvh, b), thread tid, dynamic shared memory smem of
 * kca_smem_bytes bytes. PAIR: omega is 8 (units of two windows), else a multiple of 16. Each
 * warp walks its tiles (kca_walk); KCA_LIST kernels list the chunk's attended windows first, a
 * segment of KCA_LSEG windows at a time. */
template <int HD, int BITS, int ROT, int PK, int VG, bool G4>
KCA_FN void kca_chunk_body(const kca_params_t &p, uint8_t *smem, int chunk, int kvh, int b,
                           int tid) {
  using Ly = kca_lay<HD, BITS>;
  const int gs = VG ? VG : p.gshift; /* log2 of the value group: VG when the kernel has it */
  if (kca_seq_skipped(p, b)) return;
  const int w_end = kca_seq_end(p, b), c_beg = kca_chunk_beg(p, b, chunk);
  const bool alone = kca_seq_alone(p, b); /* (an empty sequence too: its outputs are zero) */
  if (c_beg >= w_end && (chunk > 0 || !alone)) return; /* past the sequence's chunks */
  const int c_end = kca_mini(kca_chunk_beg(p, b, chunk + 1), w_end);
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  if (KCA_TRACE && tid == 0) kca_tr(0), kca_tr(1), kca_tr(2);
  kca_st_t<HD, BITS> st;
  if (!kca_ql<BITS>::v) kca_load_q<HD, BITS, G4>(p, st, b, kvh, g, c);
  KCA_UNROLL
  for (int j = 0; j < HD / 16; j++) st.acc[j][0] = st.acc[j][1] = st.acc[j][2] = st.acc[j][3] = 0;
  st.m[0] = st.m[1] = KCA_NEGINF, st.l[0] = st.l[1] = 0.0f;
  if constexpr (BITS != 0 && ROT != KCA_ROT_ABS) {
    kca_off_init<HD, ROT == KCA_ROT_NEOX>(p, (uint32_t *)(smem + Ly::off), tid);
    kca_syncthreads();
  }
  constexpr bool PL = KCA_PLAN && kca_has_plan<HD, BITS, ROT, PK>::v;
  constexpr bool LS = kca_ls<BITS, ROT, PK>::v;
  kca_plan_t pl;
  if (PL) pl = kca_plan<HD, BITS>(p, smem + warp * Ly::warp, kvh, lane);
  kca_live_t L;
  bool qload = true;
  if constexpr (LS) {
    kca_lst_t *ls = (kca_lst_t *)(smem + Ly::lst);
    for (int s0 = c_beg; s0 < c_end; s0 += KCA_LSEG) {
      kca_list_build(p, ls, s0, kca_mini(s0 + KCA_LSEG, c_end), tid);
      if (KCA_TRACE && tid == 0 && s0 == c_beg) kca_tr(3);
      kca_list_live(ls, s0, warp, kca_qd<HD, BITS, ROT, PK>::v, KCA_SPREAD(p), L);
      kca_walk<HD, BITS, ROT, PK, PL, LS, G4>(p, smem, st, L, pl, b, kvh, tid, gs, qload);
    }
  } else {
    const int n_units = (c_end - c_beg + PK - 1) / PK; /* PK walk positions each */
    L.nk = (n_units > warp ? (n_units - warp + KCA_NW - 1) / KCA_NW : 0) * PK;
    L.kbase = -64, L.mask = L.qmask = 0, L.c_end = c_end;
    L.wbase = kca_pin(c_beg + PK * warp);
    if (KCA_TRACE && tid == 0) kca_tr(3);
    kca_walk<HD, BITS, ROT, PK, PL, LS, G4>(p, smem, st, L, pl, b, kvh, tid, gs, qload);
  }
  if (KCA_TRACE && lane == 0) kca_tr(9 + KCA_NW + warp);
  const kca_ml_t *ml = kca_epilogue<HD, BITS, G4>(p, smem, st, b, chunk, kvh, tid, alone);
  if (alone && p.mass) kca_alone_masses(p, ml, b, kvh, tid, (int *)(smem + Ly::flag));
  if (KCA_TRACE && tid == 0) kca_tr(4), kca_tr(5);
}

/* Dynamic shared memory of the chunk kernel <HD, BITS, ROT, PK>. */
template <int HD, int BITS, int ROT, int PK> constexpr int kca_smem_bytes(void) {
  using Ly = kca_lay<HD, BITS>;
  return ROT != KCA_ROT_ABS                        ? Ly::total
         : kca_g4<HD, BITS, ROT, PK>::v && KCA_DRING4 ? Ly::ringed
         : kca_ls<BITS, ROT, PK>::v                  ? Ly::listed
                                                     : Ly::rotless;
}

/* ---------------------------------------------------------------- the combine block */

/* The combine's window masses with n_head <= 32 (KCA_ROWS floats of shared memory a warp): a
 * warp takes 32 windows at a time; lane h loads head h's window log-sum-exp of each (one
 * coalesced row a window) into a padded row of shared memory, then lane u sums window u's row in
 * kca_kv_mass's order (heads of a KV head in turn, then the KV heads in turn; a head without any
 * mass adds +0), so that the bits are those of the one-chunk path. */
#define KCA_ROWS (32 * 33)
/* A warp's windows w0 .. w0 + 31 for kca_combine_rows: lane l's log-sum-exps of head l, loaded
 * for every window (a dead window's are never used), whether lane l's window is live, and
 * (accumulating) its mass so far. Loaded before they are needed (KCA_CPRE). */
typedef struct {
  float x[32];
  uint32_t live;
  float acc;
} kca_rows_t;

KCA_FN void kca_rows_load(const kca_params_t &p, int w0, int m_end, int lane, kca_rows_t &r) {
  const float *src = p.wlse + (size_t)w0 * p.n_head + lane;
  KCA_UNROLL
  for (int u = 0; u < 32; u++)
    r.x[u] = lane < p.n_head && w0 + u < m_end ? src[(size_t)u * p.n_head] : 0.0f;
  const int wl = w0 + lane;
  r.acc = p.mass_acc && wl < m_end ? p.mass[wl] : 0.0f;
  r.live = wl < m_end && kca_win_live(p, wl); /* (the lane's; kca_combine_rows votes) */
}

/* The masses of windows m_beg .. m_end - 1, 32 a warp at a time (r: the warp's first 32, loaded
 * by kca_rows_load). */
KCA_FN void kca_combine_rows(const kca_params_t &p, const float *lse_s, float *rows, int m_beg,
                             int m_end, int tid, kca_rows_t &r) {
  const int lane = tid & 31, G = p.grp_q, first = m_beg + (tid >> 5) * 32;
  const float lse = lane < p.n_head ? lse_s[lane] : KCA_NEGINF;
  rows += (tid >> 5) * KCA_ROWS;
  for (int w0 = first; w0 < m_end; w0 += KCA_CT) {
    if (w0 != first) kca_rows_load(p, w0, m_end, lane, r);
    const uint32_t live = kca_ballot(r.live != 0);
    const uint32_t ok = lse != KCA_NEGINF ? live : 0u; /* (lse: -inf past n_head) */
    KCA_UNROLL
    for (int u = 0; u < 32; u++) rows[u * 33 + lane] = ok >> u & 1 ? kca_ex2(r.x[u] - lse) : 0.0f;
    kca_syncwarp();
    float s = 0.0f;
    for (int k = 0; k < p.n_kv; k++) {
      float sk = 0.0f;
      for (int hh = 0; hh < G; hh++) sk += rows[lane * 33 + k * G + hh];
      s += sk;
    }
    if (w0 + lane < m_end) p.mass[w0 + lane] = r.acc + s / (float)p.n_head;
    kca_syncwarp(); /* the rows are read before the next windows overwrite them */
  }
}

/* Floats of the combine block's shared memory: the heads' log-sum-exps, then (n_head <= 32) the
 * warps' rows of kca_combine_rows. */
static inline int kca_combine_smem(int n_head) {
  return n_head <= 32 ? 32 + (KCA_CT / 32) * KCA_ROWS : n_head;
}

/* Head h's final log-sum-exp over the nc chunk partials of the sequence whose first partial row
 * is pc. */
KCA_FN float kca_chunks_lse(const kca_params_t &p, size_t pc, int h, int nc) {
  float mx = KCA_NEGINF, L = 0.0f;
  KCA_UNROLL4
  for (int ch = 0; ch < nc; ch++) mx = kca_maxf(mx, p.part_lse[pc + (size_t)ch * p.n_head + h]);
  KCA_UNROLL4
  for (int ch = 0; ch < nc; ch++) /* (every term 0 or NaN when mx is -inf: not used then) */
    L += kca_ex2(p.part_lse[pc + (size_t)ch * p.n_head + h] - mx);
  return mx == KCA_NEGINF ? mx : mx + kca_lg2(L);
}

/* Block (b, part) of n_part, for a sequence of several chunks: the part's share of out[b] (each
 * output merged with its head's final log-sum-exp, kca_chunks_lse) and of b's window masses
 * (kca_combine_rows, its first rows loaded first (KCA_CPRE); past 32 heads a thread per window),
 * with the heads' log-sum-exps in lse_s [n_head]. */
KCA_FN void kca_combine_body(const kca_params_t &p, int hd, int b, int part, int n_part, int tid,
                             float *lse_s) {
  if (kca_seq_skipped(p, b)) return;
  const int w_beg = p.seq_win[b], w_end = kca_seq_end(p, b);
  if (kca_seq_alone(p, b)) return; /* the chunk kernel finished it */
  const int nc = kca_seq_chunks(p, b);
  const size_t pc = (size_t)b * p.n_chunk * p.n_head; /* first partial row of b */
  const int nw = w_end - w_beg, wper = (nw + n_part - 1) / n_part;
  const int m_beg = w_beg + part * wper, m_end = w_beg + kca_mini(nw, (part + 1) * wper);
  const bool rows = p.mass && p.n_head <= 32;
  kca_rows_t r; /* rows: the warp's first windows, loaded before the heads' log-sum-exps */
  if (KCA_CPRE && rows && m_beg + (tid >> 5) * 32 < m_end)
    kca_rows_load(p, m_beg + (tid >> 5) * 32, m_end, tid & 31, r);
  if (p.mass) /* the heads' log-sum-exps, for the masses */
    for (int h = tid; h < p.n_head; h += KCA_CT) lse_s[h] = kca_chunks_lse(p, pc, h, nc);
  const int n_out = p.n_head * hd, per = (n_out + n_part - 1) / n_part;
  const int o_end = kca_mini(n_out, (part + 1) * per);
  for (int e = part * per + tid; e < o_end; e += KCA_CT) {
    const int h = e / hd, d = e % hd;
    const float lse = kca_chunks_lse(p, pc, h, nc); /* (its own: no wait for lse_s) */
    float o = 0.0f;
    KCA_UNROLL4
    for (int ch = 0; ch < nc; ch++) { /* loads not behind a branch: chains of 4 overlap */
      const size_t r = pc + (size_t)ch * p.n_head + h;
      const float f = kca_ex2(p.part_lse[r] - lse), x = p.part_o[r * hd + d];
      o += f > 0.0f ? f * x : 0.0f; /* an empty chunk's f is 0 and its partial unwritten */
    }
    p.out[((size_t)b * p.n_head + h) * hd + d] = lse != KCA_NEGINF ? o : 0.0f;
  }
  if (!p.mass) return;
  kca_syncthreads();
  if (rows) {
    if (!KCA_CPRE && m_beg + (tid >> 5) * 32 < m_end)
      kca_rows_load(p, m_beg + (tid >> 5) * 32, m_end, tid & 31, r);
    kca_combine_rows(p, lse_s, lse_s + 32, m_beg, m_end, tid, r);
    return;
  }
  for (int w = m_beg + tid; w < m_end; w += KCA_CT) { /* a thread per window */
    float s = 0.0f;
    const int live = kca_win_live(p, w);
    for (int k = 0; k < p.n_kv && live; k++) {
      float lse[KCA_GMAX];
      KCA_UNROLL
      for (int hh = 0; hh < KCA_GMAX; hh++)
        lse[hh] = hh < p.grp_q ? lse_s[k * p.grp_q + hh] : KCA_NEGINF;
      s += kca_kv_mass(p, w, k, lse);
    }
    p.mass[w] = (p.mass_acc ? p.mass[w] : 0.0f) + s / (float)p.n_head;
  }
}

/* ---------------------------------------------------------------- host-side helpers */

/* Workspace layout of a call: partial outputs, partial log-sum-exps, window log-sum-exps, window
 * masses per KV head (with tickets). */
typedef struct {
  size_t o, lse, wlse, kvm, total; /* byte offsets and size */
  int n_chunk;
} kca_ws_t;

static inline size_t kca_align256(size_t x) { return (x + 255) & ~(size_t)255; }

static inline kca_ws_t kca_ws_layout(const kc_attn_args_t *a, int chunk_win) {
  kca_ws_t w;
  const int mw = a->max_win > 0 ? a->max_win : 1;
  w.n_chunk = a->chunk_dev ? a->max_chunk : (mw + chunk_win - 1) / chunk_win;
  const size_t rows = (size_t)a->n_seq * (size_t)w.n_chunk * (size_t)a->n_head;
  w.o = 0;
  w.lse = kca_align256(rows * (size_t)a->geom.head_dim * sizeof(float));
  w.wlse = w.lse + kca_align256(rows * sizeof(float));
  w.kvm = w.wlse + (a->mass ? kca_align256((size_t)a->n_win * a->n_head * sizeof(float)) : 0);
  w.total = w.kvm + (a->mass && a->tickets
                         ? kca_align256((size_t)a->n_win * a->geom.n_kv * sizeof(float))
                         : 0);
  return w;
}

/* The kernels' parameters for a checked call with this chunk size. */
static inline kca_params_t kca_params(const kc_attn_args_t *a, int chunk_win) {
  const kca_ws_t w = kca_ws_layout(a, chunk_win);
  kca_params_t p;
  p.arena = (const uint8_t *)a->arena;
  p.win = a->win;
  p.seq_win = a->seq_win;
  p.seq_nwin = a->seq_nwin;
  p.mass_acc = (a->flags & KC_ATTN_MASS_ACCUMULATE) != 0;
  p.q = a->q;
  p.out = a->out;
  p.mass = a->mass;
  p.part_o = (float *)((uint8_t *)a->ws + w.o);
  p.part_lse = (float *)((uint8_t *)a->ws + w.lse);
  p.wlse = a->mass ? (float *)((uint8_t *)a->ws + w.wlse) : (float *)0;
  p.kvmass = a->mass && a->tickets ? (float *)((uint8_t *)a->ws + w.kvm) : (float *)0;
  p.tickets = a->mass ? a->tickets : (uint32_t *)0;
  p.rope_tab = a->rope.table;
  p.cw_dev = a->chunk_dev;
  p.n_kv = a->geom.n_kv;
  p.n_head = a->n_head;
  p.grp_q = a->n_head / a->geom.n_kv;
  p.omega = a->geom.omega;
  p.gshift = 5;
  for (int gs = 3; gs < 8; gs++)
    if (a->geom.group == 1 << gs) p.gshift = gs;
  p.n_chunk = w.n_chunk;
  p.chunk_win = chunk_win;
  p.lead = 0, p.cmaj = 0; /* (kc_attn_decode sets them) */
  p.n_rot = a->rope.n_rot;
  p.yarn = a->rope.yarn;
  p.qscale = a->scale * 1.4426950408889634f;
  for (int i = 0; i < 5; i++) p.mags[i] = KCA_MAG(2 * i);
  p.freq_scale = a->rope.freq_scale;
  p.mscale = a->rope.mscale;
  return p;
}

static inline float kca_yarn_ramp(float low, float high, int i0) {
  float y = (i0 / 2 - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

static inline float kca_corr_dim(int n_rot, int n_ctx_orig, float beta, float base) {
  return n_rot * logf(n_ctx_orig / (beta * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

/* The RoPE table [n_rot / 2][2] (freq, YaRN mix) and scalars, with the same expressions as
 * kern_cpu_attn.c's rope_cs (host libm). Returns 0, or -1 for a bad n_rot. */
static inline int kca_rope_fill(const kern_rope_t *r, float *tab, kc_attn_rope_t *out) {
  if (r->n_rot <= 0 || r->n_rot % 2 != 0) return -1;
  const int yarn = r->ext_factor != 0.0f;
  float lo = 0.0f, hi = 0.0f;
  if (yarn) {
    lo = fmaxf(0.0f, floorf(kca_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_fast, r->theta)));
    hi = fminf(r->n_rot - 1.0f,
               ceilf(kca_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_slow, r->theta)));
  }
  for (int i = 0; i < r->n_rot / 2; i++) {
    float freq = 1.0f / powf(r->theta, (float)(2 * i) / (float)r->n_rot);
    if (r->factors) freq /= r->factors[i];
    tab[2 * i] = freq;
    tab[2 * i + 1] = yarn ? kca_yarn_ramp(lo, hi, 2 * i) * r->ext_factor : 0.0f;
  }
  out->mode = r->mode;
  out->n_rot = r->n_rot;
  out->freq_scale = r->freq_scale;
  out->yarn = yarn;
  out->mscale = r->attn_factor * (yarn ? 1.0f + 0.1f * logf(1.0f / r->freq_scale) : 1.0f);
  return 0;
}

/* Windows per tile and walk unit for windows of omega tokens: 4 (omega 4), 2 (omega 8), else 1. */
static inline int kca_pk(int omega) { return omega == 4 ? 4 : omega == 8 ? 2 : 1; }

/* The KCA_G4 kernels serve GQA <= 4 (query heads per KV head). */
static inline bool kca_g4_grp(int grp_q) { return grp_q <= 4; }

/* The value-group shift a kernel is built for (its VG): 5 for INT2 keys at head_dim 128 with
 * value groups of 32 (the default ledger: its value metadata addressed by constants), else 0
 * (read from kca_params_t.gshift). */
static inline int kca_vg(const kc_attn_args_t *a) {
  return a->has_quant && a->geom.head_dim == 128 && a->geom.bits == 2 && a->geom.group == 32 ? 5
                                                                                               : 0;
}

/* The call's KCA_ROT_* (how its QUANT keys are turned). */
static inline int kca_rot_kind(const kc_attn_args_t *a) {
  return a->abs_keys ? KCA_ROT_ABS : a->rope.mode == KERN_ROPE_NEOX ? KCA_ROT_NEOX : KCA_ROT_NORM;
}

/* Blocks of the combine kernel per sequence: at most KCA_COUT outputs a thread (each output is a
 * chain of dependent loads, and a thread's outputs run in turn), and with masses KCA_CT windows a
 * block (32 past 32 heads: a thread per window, its loads a chain; with 4 parts of 8 warps a
 * sequence of 4,096 windows once took ~110 us on the H200). */
static inline int kca_combine_parts(const kc_attn_args_t *a) {
  const int per = KCA_COUT * KCA_CT; /* outputs a block */
  const int out_parts = (a->n_head * a->geom.head_dim + per - 1) / per;
  const int wpp = a->n_head <= 32 ? KCA_CT : KCA_CT / 8; /* windows a part */
  const int mass_parts = a->mass ? (a->max_win + wpp - 1) / wpp : 1;
  const int parts = out_parts > mass_parts ? out_parts : mass_parts;
  return parts < 1 ? 1 : parts > 128 ? 128 : parts;
}

#endif
