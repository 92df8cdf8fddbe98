/* kern_cuda_attn_tile: the decode-attention kernels' work on a tile (kern_cuda_attn_dev.cuh's
 * design): the online softmax, S = Q K^T and O += P V by mma, dequantization and RoPE of QUANT
 * halves, the per-window masses, and the KCA_G4 quad tiles.
 * Included by kern_cuda_attn_dev.cuh only, after kern_cuda_attn_walk.cuh. */

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

