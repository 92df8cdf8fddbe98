/* kern_cuda_attn_block: the decode-attention kernels' blocks (kern_cuda_attn_dev.cuh's design):
 * the chunk block (Q, the walk, the epilogue), the combine block, and the host-side helpers
 * that size their launches.
 * Included by kern_cuda_attn_dev.cuh only, after kern_cuda_attn_tile.cuh. */

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

