/* kern_cuda_attn_walk: the decode-attention kernels' copies and walk (kern_cuda_attn_dev.cuh's
 * design): issuing a tile's bytes into a warp's stage, and walking the live units.
 * Included by kern_cuda_attn_dev.cuh only, after its layer, helpers and per-warp state. */

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

