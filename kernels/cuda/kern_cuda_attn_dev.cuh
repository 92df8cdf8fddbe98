/* kern_cuda_attn_dev: the device code of kern_cuda_attn (decode attention over tiered paged KV),
 * written against a thin layer of warp operations (loads, shuffles, votes, mma, fp16 pairs) so
 * that the same source compiles for the GPU and, with KCA_EMU defined, as host C++ that
 * tests/kernels/attn_emu.cu runs with one fiber per CUDA thread (CI checks the kernel's logic on
 * machines without a GPU). Included by kern_cuda_attn.cu and by that test only.
 * Four files: this one (the layer, small helpers, shared-memory layout, per-warp state, code
 * unpacking, RoPE tables, the windows' list), then kern_cuda_attn_walk.cuh (issuing a tile,
 * walking the units), kern_cuda_attn_tile.cuh (computing a tile, masses, KCA_G4 tiles) and
 * kern_cuda_attn_block.cuh (the chunk and combine blocks, host-side helpers), included at its end.
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
 *   S^T = K Q^T (kca_qk): A = the keys (row g: token g of the tile's first half, row g + 8: of
 *     its second), B = the query heads as the 8 columns (g < G valid). Dot products do not care
 *     about channel order, so lane c takes the 16-byte channel chunks c, c + 4, c + 8, ... of a
 *     row and Q is packed in the same order. Its result s[2h + e] = S[token g of half h][head
 *     2c + e].
 *   O^T += V^T P^T per half (m16n8k8): A = V^T (rows = channels), B = P^T (k = tokens 2c,
 *     2c + 1, n = head g): the lane's probabilities packed in pairs and transposed by one
 *     movmatrix a half (kca_movt). Lane (g, c) reads tokens 2c, 2c + 1 and pairs them with byte
 *     permutes. Accumulator j = 4u + r: O[head 2c, 2c + 1][d], O[head 2c, 2c + 1][d + 1],
 *     d = 8 (g + 8u) + 2r.
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

/* The kernels' copies and walk, their work on a tile, and their blocks, in that order. */
#include "kern_cuda_attn_walk.cuh"
#include "kern_cuda_attn_tile.cuh"
#include "kern_cuda_attn_block.cuh"

#endif
