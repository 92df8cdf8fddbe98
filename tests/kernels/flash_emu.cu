/* flash_emu: runs the fused prefill kernel's own block code (kern_cuda_flash_dev.cuh) on the CPU
 * (emu_fiber.h: a fiber per CUDA thread, mma.sync and ldmatrix from their PTX fragment layouts)
 * over launches of several sequences, and checks every output against causal attention computed
 * in fp64 from the same fp32 inputs: normalized error < 2e-3 per sequence (the kernel's operands
 * are fp16, its accumulation fp32), every output written (outputs start as NaN), nothing NaN or
 * Inf. GQA groups of 1, 3, 4 and 8, head_dim 64 and 128, cached prefixes, query counts off the
 * tile. Exit 0 when every case passes, 1 otherwise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define KCA_EMU 1
#define KCF_EMU 1
#include "kern_cuda_attn_dev.cuh"
#include "kern_cuda_flash_dev.cuh"

#include "emu_fiber.h"

int kcf_emu_lane(void) { return E->cur % 32; }

namespace {

struct Seq {
  int n_q, q_pos0; /* keys: q_pos0 + n_q */
};

struct Case {
  const char *name;
  int n_head, n_kv, hd;
  std::vector<Seq> seqs;
};

uint64_t g_rng = 0x9e3779b97f4a7c15ULL;

float rnd(void) { /* uniform in [-1, 1) (xorshift64*) */
  g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
  return (float)((g_rng * 2685821657736338717ULL) >> 40) / (float)(1 << 23) - 1.0f;
}

/* Causal attention of one sequence in fp64: out [n_q][n_head][hd]. */
void reference(const Case &cs, const Seq &sq, const float *q, const float *k, const float *v,
               double *out) {
  const int G = cs.n_head / cs.n_kv, n_kv = sq.q_pos0 + sq.n_q, hd = cs.hd;
  const double scale = 1.0 / sqrt((double)hd);
  std::vector<double> p(n_kv);
  for (int i = 0; i < sq.n_q; i++)
    for (int h = 0; h < cs.n_head; h++) {
      const float *qi = q + ((size_t)i * cs.n_head + h) * hd;
      const int last = sq.q_pos0 + i, kvh = h / G;
      double mx = -INFINITY, sum = 0.0;
      for (int j = 0; j <= last; j++) {
        const float *kj = k + ((size_t)j * cs.n_kv + kvh) * hd;
        double s = 0.0;
        for (int d = 0; d < hd; d++) s += (double)qi[d] * kj[d];
        p[j] = s * scale, mx = p[j] > mx ? p[j] : mx;
      }
      for (int j = 0; j <= last; j++) p[j] = exp(p[j] - mx), sum += p[j];
      double *o = out + ((size_t)i * cs.n_head + h) * hd;
      for (int d = 0; d < hd; d++) {
        double acc = 0.0;
        for (int j = 0; j <= last; j++) acc += p[j] * v[((size_t)j * cs.n_kv + kvh) * hd + d];
        o[d] = acc / sum;
      }
    }
}

template <int HD>
int run_block(const kcf_batch_t &b, const Case &cs, float qsc, std::vector<uint16_t> &sm, int bx,
              int by) {
  memset(sm.data(), 0xa5, sm.size() * 2); /* garbage, as on the GPU */
  return emu_block(KCF_WARPS * 32, [&](int tid) {
    kcf_flash_body<HD>(b, cs.n_head, cs.n_kv, qsc, sm.data(), bx, by, tid);
  });
}

/* One launch over the case's sequences; returns the number of failed checks. */
int run_case(const Case &cs) {
  const int ns = (int)cs.seqs.size(), hd = cs.hd, G = cs.n_head / cs.n_kv, qpb = KCF_ROWS / G;
  std::vector<std::vector<float>> q(ns), k(ns), v(ns), out(ns);
  std::vector<std::vector<uint16_t>> kh(ns), vh(ns);
  kcf_batch_t b;
  memset(&b, 0, sizeof b);
  b.n = ns;
  int tiles = 0;
  for (int i = 0; i < ns; i++) {
    const Seq &sq = cs.seqs[i];
    const size_t nq = (size_t)sq.n_q * cs.n_head * hd,
                 nk = (size_t)(sq.q_pos0 + sq.n_q) * cs.n_kv * hd;
    q[i].resize(nq), k[i].resize(nk), v[i].resize(nk), out[i].assign(nq, NAN);
    kh[i].resize(nk), vh[i].resize(nk);
    for (auto &x : q[i]) x = 2.0f * rnd();
    for (auto &x : k[i]) x = 2.0f * rnd();
    for (auto &x : v[i]) x = rnd();
    for (size_t e = 0; e < nk; e += 2) { /* the fp16 copies, as kcf_half_kv rounds them */
      const uint32_t a = kcf_pack(k[i][e], k[i][e + 1]), c = kcf_pack(v[i][e], v[i][e + 1]);
      kh[i][e] = (uint16_t)a, kh[i][e + 1] = (uint16_t)(a >> 16);
      vh[i][e] = (uint16_t)c, vh[i][e + 1] = (uint16_t)(c >> 16);
    }
    b.s[i] = kcf_seq_t{q[i].data(),  k[i].data(), v[i].data(),        out[i].data(), kh[i].data(),
                       vh[i].data(), sq.n_q,      sq.q_pos0 + sq.n_q, sq.q_pos0,     tiles};
    tiles += (sq.n_q + qpb - 1) / qpb;
  }
  const float qsc = (float)(1.0 / sqrt((double)hd)) * KCF_LOG2E;
  std::vector<uint16_t> sm(hd == 64 ? kcf_smem<64>() / 2 : kcf_smem<128>() / 2);
  for (int bx = 0; bx < tiles; bx++)
    for (int by = 0; by < cs.n_kv; by++)
      if ((hd == 64 ? run_block<64>(b, cs, qsc, sm, bx, by)
                    : run_block<128>(b, cs, qsc, sm, bx, by)))
        return 1; /* a deadlock */
  int fails = 0;
  for (int i = 0; i < ns; i++) {
    const Seq &sq = cs.seqs[i];
    std::vector<double> ref(out[i].size());
    reference(cs, sq, q[i].data(), k[i].data(), v[i].data(), ref.data());
    double num = 0.0, den = 0.0;
    size_t bad = 0;
    for (size_t e = 0; e < ref.size(); e++) {
      if (!isfinite(out[i][e])) bad++;
      num += (out[i][e] - ref[e]) * (out[i][e] - ref[e]), den += ref[e] * ref[e];
    }
    const double err = sqrt(num / (den > 0 ? den : 1));
    const int ok = !bad && err < 2e-3;
    printf("%s %-28s seq %d (%4d queries after %4d): error %.2e, %zu unwritten or not finite\n",
           ok ? "ok  " : "FAIL", cs.name, i, sq.n_q, sq.q_pos0, err, bad);
    fails += !ok;
  }
  return fails;
}

} // namespace

int main(void) {
  Emu emu;
  E = &emu;
  const std::vector<Case> cases = {
      {"gqa4 d128, 3 sequences", 8, 2, 128, {{150, 0}, {70, 100}, {64, 0}}},
      {"mha d64, 2 sequences", 2, 2, 64, {{200, 0}, {65, 7}}},
      {"gqa3 d128 (rows off the tile)", 6, 2, 128, {{90, 0}, {43, 61}}},
      {"gqa8 d64", 16, 2, 64, {{130, 5}}},
  };
  int fails = 0;
  for (const Case &cs : cases) fails += run_case(cs);
  printf("flash_emu: %d check(s) failed\n", fails);
  return fails ? 1 : 0;
}
