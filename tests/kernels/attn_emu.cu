/* attn_emu: runs the CUDA decode-attention kernels' own code (kern_cuda_attn_dev.cuh) on the CPU
 * and checks it against the fp64 reference (attn_ref.c), so the kernel's logic (fragment
 * layouts, masking, chunking, masses, RoPE) is tested on machines without a GPU.
 *
 * Emulation: every CUDA thread of a block is a fiber (ucontext) of one OS thread; warp
 * collectives (shuffles, votes, mma.sync) and barriers switch fibers until all participants
 * arrived, so a divergent collective shows up as a reported deadlock. mma is computed in fp64
 * from the PTX fragment layouts; fp16 arithmetic rounds each result to fp16. Shared memory
 * starts filled with garbage. Exit 0 when every case passes, 1 otherwise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <string>
#include <vector>

#define KCA_EMU 1
#define KCA_LSEG 64 /* KCA_LIST kernels: chunks of more than 64 windows walk several segments */
extern "C" {
#include "attn_ref.h"
}
#include "kern_cuda_attn_dev.cuh"

#include "emu_fiber.h"

/* ---------------------------------------------------------------- running the kernels */

template <int HD, int BITS, int ROT, int PK, int VG, bool G4>
static int emu_chunks(const kca_params_t &p, int n_seq) {
  constexpr int nb = kca_smem_bytes<HD, BITS, ROT, PK>();
  std::vector<uint64_t> smem(nb / 8 + 2);
  uint8_t *sm = (uint8_t *)smem.data();
  int rc = 0;
  for (int z = 0; z < n_seq && !rc; z++)
    for (int y = 0; y < p.n_kv && !rc; y++)
      for (int x = 0; x < p.n_chunk && !rc; x++) {
        memset(sm, 0xa5, nb); /* garbage, as on the GPU */
        rc = emu_block(KCA_NT, [&](int tid) {
          kca_chunk_body<HD, BITS, ROT, PK, VG, G4>(p, sm, x, y, z, tid);
        });
      }
  return rc;
}

template <int HD, int BITS, int R, int VG>
static int emu_pick_pk(const kca_params_t &p, int n_seq, int pk) {
  if (pk == 2) {
    if constexpr (kca_g4<HD, BITS, R, 2>::v)
      if (kca_g4_grp(p.grp_q)) return emu_chunks<HD, BITS, R, 2, VG, true>(p, n_seq);
    return emu_chunks<HD, BITS, R, 2, VG, false>(p, n_seq);
  }
  if constexpr (BITS == 0 || R == KCA_ROT_ABS)
    if (pk == 4) return emu_chunks<HD, BITS, R, 4, VG, false>(p, n_seq);
  return emu_chunks<HD, BITS, R, 1, VG, false>(p, n_seq);
}

template <int HD, int BITS, int R>
static int emu_pick_vg(const kca_params_t &p, int n_seq, int pk, int vg) {
  if constexpr (HD == 128 && BITS == 2)
    if (vg == 5) return emu_pick_pk<HD, BITS, R, 5>(p, n_seq, pk);
  return emu_pick_pk<HD, BITS, R, 0>(p, n_seq, pk);
}

template <int HD, int BITS>
static int emu_pick_rot(const kca_params_t &p, int n_seq, int rot, int pk, int vg) {
  if (BITS == 0 || rot == KCA_ROT_NORM)
    return emu_pick_vg<HD, BITS, KCA_ROT_NORM>(p, n_seq, pk, vg);
  if (rot == KCA_ROT_NEOX) return emu_pick_vg<HD, BITS, KCA_ROT_NEOX>(p, n_seq, pk, vg);
  return emu_pick_vg<HD, BITS, KCA_ROT_ABS>(p, n_seq, pk, vg);
}

template <int HD>
static int emu_pick_hd(const kca_params_t &p, int n_seq, int bits, int rot, int pk, int vg) {
  if (bits == 0) return emu_pick_rot<HD, 0>(p, n_seq, rot, pk, vg);
  if (bits == 2) return emu_pick_rot<HD, 2>(p, n_seq, rot, pk, vg);
  if (bits == 4) return emu_pick_rot<HD, 4>(p, n_seq, rot, pk, vg);
  return emu_pick_rot<HD, 8>(p, n_seq, rot, pk, vg);
}

/* The whole call (both kernels) on host memory. */
static int emu_decode(const kc_attn_args_t *a, int parts_only = 0, int lead = 0,
                      int spread = 0) {
  kca_params_t p = kca_params(a, a->chunk_win);
  p.lead = lead | (spread ? KC_ATTN_SPREAD : 0); /* (the grid order, cmaj, is the GPU's: the
                                                    emulator runs every block) */
  const int bits = a->has_quant ? a->geom.bits : 0, rot = kca_rot_kind(a);
  const int pk = kca_pk(a->geom.omega), vg = kca_vg(a);
  int rc = a->geom.head_dim == 64 ? emu_pick_hd<64>(p, a->n_seq, bits, rot, pk, vg)
                                  : emu_pick_hd<128>(p, a->n_seq, bits, rot, pk, vg);
  const int parts = parts_only > 0 ? parts_only : kca_combine_parts(a);
  std::vector<float> lse_s(kca_combine_smem(a->n_head));
  for (int b = 0; b < a->n_seq && !rc; b++)
    for (int part = 0; part < parts && !rc; part++)
      rc = emu_block(KCA_CT, [&](int tid) {
        kca_combine_body(p, a->geom.head_dim, b, part, parts, tid, lse_s.data());
      });
  return rc;
}

/* ---------------------------------------------------------------- cases */

struct Case {
  const char *name;
  int n_head, n_kv, hd, omega, bits, group, mode, n_rot;
  int sink, n_local;
  double p_full, p_quant;
  std::vector<int> lens;
  int chunk_win;
  int yarn = 0;
  int abs_keys = 0; /* QUANT keys post-RoPE (no rotation in the kernel or the reference) */
};

/* One emulated call on pr at chunk_win (tickets: with ticket counters): out gets the outputs
 * then the masses (outputs poisoned first; masses too, or with acc accumulated onto 0.25, which
 * is taken off again; nomass: a call without masses, which leaves them poisoned), *tk_left the
 * counters not back to zero. */
static int emu_run(const attn_prob_t &pr, int chunk_win, int tickets, int acc, float *out,
                   int *tk_left, int skip = -1, int parts = 0, int lead = 0, int spread = 0,
                   int nomass = 0) {
  const size_t n_out = (size_t)pr.n_seq * pr.n_head * pr.geom.head_dim;
  std::vector<float> tab(pr.geom.head_dim + 2);
  std::vector<uint32_t> tk(pr.n_seq, 0u);
  kc_attn_args_t a;
  memset(&a, 0, sizeof a);
  if (kca_rope_fill(&pr.rope, tab.data(), &a.rope)) return 1;
  a.rope.table = tab.data();
  a.geom = pr.geom, a.n_seq = pr.n_seq, a.n_head = pr.n_head, a.scale = pr.scale;
  a.arena = pr.arena, a.win = pr.win, a.seq_win = pr.seq_win, a.n_win = pr.n_win;
  a.max_win = pr.max_win, a.has_quant = pr.has_quant, a.q = pr.q, a.out = out;
  a.abs_keys = pr.abs_keys;
  std::vector<int32_t> nwin(pr.n_seq); /* skip >= 0: sequence skip's count negative */
  for (int b = 0; b < pr.n_seq; b++) nwin[b] = b == skip ? -1 : pr.seq_win[b + 1] - pr.seq_win[b];
  if (skip >= 0) a.seq_nwin = nwin.data();
  a.mass = nomass ? nullptr : out + n_out, a.chunk_win = chunk_win;
  a.tickets = tickets ? tk.data() : nullptr;
  const kca_ws_t wl = kca_ws_layout(&a, a.chunk_win);
  std::vector<float> ws(wl.total / 4 + 64, NAN);
  a.ws = ws.data(), a.ws_bytes = wl.total;
  for (size_t i = 0; i < n_out + pr.n_win; i++) out[i] = i < n_out || !acc ? NAN : 0.25f;
  a.flags = acc ? KC_ATTN_MASS_ACCUMULATE : 0; /* (the last block's sums are added once) */
  const int rc = emu_decode(&a, parts, lead, spread);
  for (int w = 0; acc && w < pr.n_win; w++) out[n_out + w] -= 0.25f;
  *tk_left = 0;
  for (uint32_t t : tk) *tk_left += t != 0;
  return rc;
}

/* The case's chunking with sequence 0 skipped (seq_nwin[0] < 0): its outputs and masses stay as
 * poisoned, every other value the same bits as the run without the skip (ref). */
static int emu_skip(const attn_prob_t &pr, const Case &cs, const std::vector<float> &ref) {
  const size_t n_out = (size_t)pr.n_seq * pr.n_head * cs.hd, own = (size_t)pr.n_head * cs.hd;
  std::vector<float> out(n_out + pr.n_win);
  int tk_left = 0, f = emu_run(pr, cs.chunk_win, 1, 0, out.data(), &tk_left, 0), touched = 0;
  int differ = 0;
  for (size_t i = 0; i < out.size(); i++) {
    const bool mine = i < own || (i >= n_out && (int)(i - n_out) < pr.seq_win[1]);
    if (mine)
      touched += !isnan(out[i]);
    else
      differ += memcmp(&out[i], &ref[i], sizeof(float)) != 0;
  }
  f |= touched || differ || tk_left;
  printf("%s %-40s sequence 0 skipped: %d of its values written, %d others differ%s\n",
         f ? "FAIL" : "ok  ", cs.name, touched, differ, tk_left ? ", tickets left" : "");
  return f;
}

/* The case's chunking without masses (the FullKV cache's calls), with and without tickets: the
 * outputs of the run with masses (ref: its outputs, bitwise), the masses untouched. */
static int emu_nomass(const attn_prob_t &pr, const Case &cs, const std::vector<float> &ref) {
  const size_t n_out = (size_t)pr.n_seq * pr.n_head * pr.geom.head_dim;
  int f = 0;
  for (int tickets = 1; tickets >= 0; tickets--) {
    std::vector<float> out(n_out + pr.n_win);
    int tk_left = 0, rc = emu_run(pr, cs.chunk_win, tickets, 0, out.data(), &tk_left, -1, 0, 0, 0,
                                  1);
    int differ = 0, touched = 0;
    for (size_t i = 0; i < n_out; i++) differ += memcmp(&out[i], &ref[i], sizeof(float)) != 0;
    for (int w = 0; w < pr.n_win; w++) touched += !isnan(out[n_out + w]);
    const int g = rc || differ || touched || tk_left;
    printf("%s %-40s no masses%s: %d outputs differ from the run with masses, %d masses "
           "written%s\n",
           g ? "FAIL" : "ok  ", cs.name, tickets ? "" : " no tickets",
           differ, touched, tk_left ? ", tickets left" : "");
    f |= g;
  }
  return f;
}

/* The masses beyond the absolute check of each against the reference (1e-3, loose where a
 * sequence has hundreds of windows of ~2e-3). Normalization: a sequence's masses (head averages
 * of probabilities, evicted windows' exactly 0) sum to 1 (to 0, every one 0, when it attends
 * nothing) whatever the kernel's rounding of Q and K, since the window sums and the heads'
 * log-sum-exps come from the same probabilities; only fp32 arithmetic moves the sum. An fp32 sum
 * of N terms errs by at most (N - 1) u relative (u = 2^-24); the longest sums behind a mass are
 * its head's log-sum-exp (at most the sequence's len tokens), its window's (omega tokens) and
 * the heads' (n_head + n_kv terms); exp2f and log2f err by a few u, and the log2-domain values
 * (scores below 2^7 here) carry an absolute error of 2^7 u each, 2 ln 2 2^7 u relative through
 * 2^(wlse - lse). Hence |sum - 1| <= (len + omega + n_head + n_kv + 2 ln2 2^7 + 8) u; the runs
 * accumulating onto 0.25 add half an ulp of 0.25, 2^-26, per window. Relative: a mass of at
 * least 2^-16 within 1e-2 of the reference's (the outputs' bound; those rounding errors of 0.25
 * are below 1e-3 of it), where the kernel's fp16/bf16 Q and K move each window's share. */
struct MassErr {
  double sum, sum_tol, rel; /* the worst sequence's |sum - 1| / its bound; worst relative error */
  int bad;                  /* sums past their bound, evicted windows not at 0 */
};
static MassErr mass_err(const attn_prob_t &pr, const Case &cs, const float *mass,
                        const double *rmass, int acc) {
  MassErr e = {0, 0, 0, 0};
  const double u = 0x1p-24;
  for (int b = 0; b < pr.n_seq; b++) {
    const int w0 = pr.seq_win[b], nw = pr.seq_win[b + 1] - w0;
    double s = 0, r = 0;
    for (int w = w0; w < w0 + nw; w++) {
      s += mass[w], r += rmass[w];
      e.bad += rmass[w] == 0 && mass[w] != 0;
      if (rmass[w] >= 0x1p-16) e.rel = fmax(e.rel, fabs(mass[w] - rmass[w]) / rmass[w]);
    }
    const double tol = (cs.lens[b] + cs.omega + cs.n_head + cs.n_kv + 2 * M_LN2 * 128 + 8) * u +
                       (acc ? nw * 0x1p-26 : 0), d = fabs(s - (r > 0 ? 1.0 : 0.0));
    e.bad += !(d <= tol);
    if (d / tol >= e.sum / fmax(e.sum_tol, 1e-300)) e.sum = d, e.sum_tol = tol;
  }
  return e;
}

static int emu_case(const Case &cs, uint64_t seed) {
  attn_spec_t s;
  memset(&s, 0, sizeof s);
  s.geom = {cs.n_kv, cs.hd, cs.omega, cs.bits, cs.group};
  s.n_seq = (int)cs.lens.size(), s.n_head = cs.n_head;
  s.rope_mode = cs.mode, s.n_rot = cs.n_rot, s.rope_theta = 10000.0f;
  s.rope_yarn = cs.yarn, s.abs_keys = cs.abs_keys;
  s.seq_len = cs.lens.data(), s.sink = cs.sink, s.n_local = cs.n_local;
  s.p_full = cs.p_full, s.p_quant = cs.p_quant, s.n_full = -1, s.n_quant = -1;
  s.realistic = 1, s.seed = seed;
  attn_prob_t pr;
  if (attn_prob_make(&s, &pr)) {
    printf("FAIL %s: cannot build the problem\n", cs.name);
    return 1;
  }
  const size_t n_out = (size_t)pr.n_seq * pr.n_head * cs.hd;
  std::vector<double> ref(n_out), rmass(pr.n_win + 1);
  int fail = attn_ref_run(&pr, ref.data(), rmass.data()) != 0;
  /* the case's chunking, then one chunk per sequence accumulating masses with tickets (the
   * chunk kernel alone) and without (the combine kernel): those two the same bits; then the
   * case's chunking again, its combine in one block a sequence (a warp's windows in several
   * passes): the same bits as the first; then the case's chunking with a lead (the first half
   * of a sequence's chunks longer, kca_chunk_beg) of up to half a chunk; then the case's
   * chunking with the FULL tiles spread among the quads (kca_lfull) */
  const int one = pr.max_win > 0 ? pr.max_win : 1, unit = kca_pk(cs.omega);
  const int lead = cs.chunk_win / 2 / unit * unit;
  const int cws[6] = {cs.chunk_win, one, one, cs.chunk_win, cs.chunk_win, cs.chunk_win};
  const int tks[6] = {1, 1, 0, 1, 1, 1};
  std::vector<float> got[6];
  for (int v = 0; v < 6; v++) {
    if (v == 4 && lead <= 0) continue;
    std::vector<float> out(n_out + pr.n_win);
    const int acc = v == 1 || v == 2;
    int tk_left = 0, f = emu_run(pr, cws[v], tks[v], acc, out.data(), &tk_left, -1, v == 3,
                                 v == 4 ? lead : 0, v == 5);
    double num = 0, den = 0, merr = 0;
    int bad = 0;
    for (size_t i = 0; i < n_out; i++) {
      bad += !isfinite(out[i]);
      num += (out[i] - ref[i]) * (out[i] - ref[i]), den += ref[i] * ref[i];
    }
    for (int w = 0; w < pr.n_win; w++) {
      bad += !isfinite(out[n_out + w]);
      merr = fmax(merr, fabs(out[n_out + w] - rmass[w]));
    }
    const double err = den > 0 ? sqrt(num / den) : sqrt(num);
    const MassErr me = mass_err(pr, cs, out.data() + n_out, rmass.data(), acc);
    const int same = v < 2 || v >= 4 || got[v == 2 ? 1 : 0] == out; /* (bad counts NaN) */
    f |= bad || tk_left || !same || !(err < 1e-2) || !(merr < 1e-3) || me.bad || !(me.rel < 1e-2);
    printf("%s %-40s wins %4d (F %d Q %d E %d) chunk %3d%s  err %.2e  mass %.2e (sum %.1e of "
           "%.1e, rel %.1e)  nonfinite %d%s%s%s%s\n",
           f ? "FAIL" : "ok  ", cs.name, pr.n_win, pr.n_full, pr.n_quant, pr.n_evicted, cws[v],
           tks[v] ? "" : " no tickets", err, merr, me.sum, me.sum_tol, me.rel, bad,
           tk_left ? "  tickets left" : "",
           v == 4 ? "  lead " : v == 5 ? "  spread" : "",
           v == 4 ? std::to_string(lead).c_str() : "",
           v == 2   ? (same ? "  = alone" : "  DIFFERS from alone")
           : v == 3 ? (same ? "  = one combine block" : "  DIFFERS with one combine block")
                    : "");
    got[v] = out, fail |= f;
  }
  fail |= pr.n_seq > 1 && emu_skip(pr, cs, got[0]);
  fail |= emu_nomass(pr, cs, got[0]);
  attn_prob_free(&pr);
  return fail;
}

int main(int argc, char **argv) {
  Emu emu;
  E = &emu;
  const int NORM = KERN_ROPE_NORM, NEOX = KERN_ROPE_NEOX;
  const std::vector<Case> cases = {
      {"gqa4 d128 w16 int2 norm mix",
       8,
       2,
       128,
       16,
       2,
       32,
       NORM,
       128,
       5,
       1,
       0.3,
       0.5,
       {203, 77},
       5},
      {"gqa4 d128 w16 full only", 8, 2, 128, 16, 2, 32, NORM, 128, 0, 1, 1.0, 0.0, {150, 33}, 4},
      {"gqa4 d128 w16 full+evicted", 8, 2, 128, 16, 2, 32, NORM, 128, 0, 2, 0.5, 0.0, {250, 9}, 3},
      /* long enough that a warp walks three and more tiles (a FullKV walk's steady state) */
      {"gqa4 d128 w16 full long", 8, 2, 128, 16, 2, 32, NORM, 128, 0, 1, 1.0, 0.0, {1500, 700}, 20},
      {"gqa4 d128 w32 full+evicted long", 8, 2, 128, 32, 2, 32, NORM, 128, 0, 2, 0.6, 0.0,
       {1200, 333}, 8},
      /* a warp walks three batches of 32 positions (a descriptor prefetch a batch ahead,
         refuted 2026-12-05, failed a planted bug here only) */
      {"gqa4 d128 w16 full+evicted longest", 8, 2, 128, 16, 2, 32, NORM, 128, 0, 2, 0.7, 0.0,
       {6500, 37}, 400},
      {"mha d128 w16 int4 neox", 2, 2, 128, 16, 4, 32, NEOX, 128, 0, 0, 0.2, 0.6, {181, 64}, 16},
      {"gqa4 d64 w8 int2 neox pairs", 8, 2, 64, 8, 2, 16, NEOX, 64, 3, 1, 0.3, 0.5, {157, 40}, 7},
      {"gqa4 d64 w8 full pairs", 8, 2, 64, 8, 2, 16, NORM, 64, 0, 0, 0.6, 0.0, {101, 8}, 4},
      {"gqa8 d128 w32 int8 norm rot96",
       16,
       2,
       128,
       32,
       8,
       64,
       NORM,
       96,
       0,
       0,
       0.25,
       0.5,
       {300, 31},
       3},
      {"gqa2 d64 w16 int4 norm g8", 4, 2, 64, 16, 4, 8, NORM, 64, 1, 1, 0.2, 0.7, {170, 17}, 2},
      {"gqa4 d128 w16 int2 evicted seq",
       8,
       2,
       128,
       16,
       2,
       32,
       NORM,
       128,
       0,
       0,
       0.0,
       0.0,
       {120, 0},
       4},
      {"gqa3 d128 w16 int2 long", 6, 2, 128, 16, 2, 32, NORM, 128, 4, 2, 0.1, 0.6, {1100}, 20},
      {"gqa4 d128 w16 int2 g8 yarn", 8, 2, 128, 16, 2, 8, NORM, 128, 2, 1, 0.2, 0.6, {300}, 6, 1},
      {"gqa8 d128 w64 int4 neox", 16, 2, 128, 64, 4, 32, NEOX, 128, 0, 1, 0.2, 0.6, {700, 130}, 3},
      {"gqa4 d128 w16 int2 chunk1", 8, 2, 128, 16, 2, 16, NORM, 128, 5, 1, 0.3, 0.5, {170}, 1},
      {"gqa1 d64 w8 int8 norm yarn odd", 2, 2, 64, 8, 8, 32, NORM, 64, 0, 0, 0.3, 0.5, {133}, 5, 1},
      /* post-RoPE QUANT keys: one query operand for every tier, mixed tiers in one pass */
      {"abs gqa4 d128 w8 int2 pairs", 8, 2, 128, 8, 2, 32, NORM, 128, 5, 1, 0.3, 0.5, {203, 77}, 7,
       0, 1},
      {"abs gqa4 d128 w16 int2 mix", 8, 2, 128, 16, 2, 32, NEOX, 128, 3, 1, 0.2, 0.6, {250, 40}, 5,
       0, 1},
      {"abs gqa8 d64 w8 int4 pairs yarn", 16, 2, 64, 8, 4, 16, NORM, 64, 0, 0, 0.3, 0.5, {157, 9}, 4,
       1, 1},
      {"abs gqa2 d128 w32 int8", 4, 2, 128, 32, 8, 32, NORM, 96, 0, 1, 0.25, 0.5, {300, 31}, 3, 0, 1},
      /* 288 windows in sequence 0: a combine block of the whole sequence passes twice */
      {"abs gqa4 d128 w8 int2 long", 8, 2, 128, 8, 2, 32, NORM, 128, 5, 1, 0.3, 0.5, {2300, 600},
       64, 0, 1},
      /* the copy plan's other value groups (kca_issue_half_pl: the general value metadata) */
      {"abs gqa4 d128 w8 int2 g16", 8, 2, 128, 8, 2, 16, NORM, 128, 1, 1, 0.3, 0.5, {93, 12}, 5, 0,
       1},
      {"abs gqa4 d128 w16 int2 g64", 8, 2, 128, 16, 2, 64, NORM, 128, 1, 1, 0.3, 0.5, {150, 9}, 4,
       0, 1},
      /* windows of 4: four of one tier per tile (post-RoPE keys or FULL only) */
      {"abs gqa4 d128 w4 int2 quads", 8, 2, 128, 4, 2, 32, NORM, 128, 3, 1, 0.3, 0.5, {203, 77}, 9,
       0, 1},
      {"gqa4 d64 w4 full quads", 8, 2, 64, 4, 2, 16, NORM, 64, 0, 0, 0.6, 0.0, {101, 8}, 5},
      /* Llama-3.1-8B's head shape: 32 heads on 8 KV heads (the combine's masses by warps of 32
       * windows, several warps a block) */
      {"abs gqa4 h32 d128 w8 int2 kv8", 32, 8, 128, 8, 2, 32, NORM, 128, 1, 1, 0.3, 0.5,
       {2300, 300}, 40, 0, 1},
      /* 8 and 300 KV heads (the combine's masses loop over them a window at a time) */
      {"mha8 d64 w16 int2 kv8", 8, 8, 64, 16, 2, 16, NORM, 64, 1, 1, 0.3, 0.5, {170, 41}, 3},
      {"mha300 d64 w16 full kv300", 300, 300, 64, 16, 2, 16, NORM, 64, 0, 0, 0.7, 0.0, {40, 23}, 1},
      {"abs gqa8 d64 w4 int4 quads", 16, 2, 64, 4, 4, 16, NORM, 64, 2, 1, 0.3, 0.5, {157, 9}, 6, 0,
       1},
      /* the quad kernels at GQA 8 (no KCA_G4) and at GQA 3 (KCA_G4 with a padding head) */
      {"abs gqa8 d128 w8 int2 quads", 16, 2, 128, 8, 2, 32, NORM, 128, 5, 1, 0.3, 0.5, {260, 45}, 7,
       0, 1},
      {"abs gqa3 d128 w8 int2 quads", 6, 2, 128, 8, 2, 32, NORM, 128, 3, 1, 0.2, 0.6, {230, 61}, 6,
       0, 1},
      {"abs gqa2 d128 w4 int8 quads", 4, 2, 128, 4, 8, 32, NORM, 128, 1, 1, 0.25, 0.5, {130, 3}, 10,
       0, 1},
  };
  const char *only = argc > 1 ? argv[1] : NULL;
  int fails = 0;
  for (size_t i = 0; i < cases.size(); i++)
    if (!only || strstr(cases[i].name, only)) fails += emu_case(cases[i], 1000 + i);
  printf("attn_emu: %d case(s) failed\n", fails);
  return fails ? 1 : 0;
}
