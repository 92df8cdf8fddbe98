/* route_emu: runs the routing decision's tier fill (kernels/cuda/kern_cuda_route_fill.cuh, the
 * code warp 0 of kcr_decide_k runs on the GPU, built with KCR_EMU as host C++, one fiber per
 * lane through emu_fiber.h) on the CPU against cache/kv_route.c's kv_route_decide, so that CI
 * checks it on machines without a GPU. On fresh random candidates in score order: 0 to 300 of
 * them (chunk edges of 32 included), FULL costs of a page plus bookkeeping, some with a kept
 * ledger on top, some not allowed FULL (INT2 without promotion), budgets from none to more than
 * every candidate holds (and exactly the costs of a prefix of them), q from 0 to 1, with and
 * without an INT2 tier, and the KIVI-style case without a FULL tier. Every candidate's tier must
 * equal the reference's; the cases where the reference takes its everything-fits shortcut (the
 * GPU's kcr_relaxed, before any fill) are counted and not compared. test_kv_gpu compares the
 * whole decision on a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

#define KCR_EMU 1
#include "kern_cuda_route_fill.cuh"
extern "C" {
#include "kv_route.h"
#include "qe_half.h"
}

#define KCA_CT 256 /* emu_fiber.h: most threads a block (the fill is one warp) */
#include "emu_fiber.h"

int kcr_emu_lane(void) { return E->cur & 31; }

static uint64_t g_rs = 0x726f757465656d75ULL;

static uint64_t rnd(void) { /* xorshift64* */
  g_rs ^= g_rs >> 12, g_rs ^= g_rs << 25, g_rs ^= g_rs >> 27;
  return g_rs * 0x2545f4914f6cdd1dULL;
}
static int urange(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }

/* One case: the fill's tiers against kv_route_decide's for n candidates in score order. Returns
 * 1 when compared and equal, 0 when the reference took its shortcut, -1 on a mismatch. */
static int run_case(int id) {
  static const int edges[] = {0, 1, 31, 32, 33, 63, 64, 65, 255, 256, 257};
  const int n = id < 11 ? edges[id] : urange(0, 300);
  kc_route_t r;
  memset(&r, 0, sizeof r);
  r.page_bytes = (uint64_t)urange(1000, 40000);
  r.meta_bytes = (uint64_t)urange(0, 600);
  r.lay.total = (size_t)urange(1, 800) * 16;
  static const float qs[] = {0.0f, 0.3f, 0.7f, 1.0f};
  r.q = id % 5 == 4 ? (float)(rnd() % 1000) / 1000.0f : qs[id % 4];
  r.use_int2 = r.q > 0.0f && id % 7 != 3;
  r.use_full = id % 11 != 5;
  const int ledger_pct = urange(0, 100), barred_pct = urange(0, 40);
  std::vector<kv_cand_t> c((size_t)n + 1);
  std::vector<int32_t> fc((size_t)n + 1);
  int64_t total = 0;
  for (int k = 0; k < n; k++) {
    const int barred = urange(1, 100) <= barred_pct, led = urange(1, 100) <= ledger_pct;
    const int64_t cost = (int64_t)(r.page_bytes + r.meta_bytes) + (led ? (int64_t)r.lay.total : 0);
    c[k].score = (float)(n - k); /* distinct, descending: the reference's order is k's */
    c[k].tier = barred ? KV_TIER_INT2 : KV_TIER_FULL;
    c[k].full_cost = (size_t)cost;
    c[k].q_cost = (size_t)(r.lay.total + r.meta_bytes);
    fc[k] = barred || !r.use_full ? -1 : (int32_t)cost; /* kcr_full_costs (promote off) */
    total += cost;
  }
  int64_t b_hist = (int64_t)(rnd() % (uint64_t)(total + total / 5 + 2));
  if (id % 3 == 0 && n > 0) { /* exactly the FULL costs of a prefix: a fill that ends on the cap */
    const double keep = 1.0 - (r.use_int2 ? (double)r.q : 0.0);
    int64_t pre = 0;
    for (int k = 0, j = urange(1, n); k < j; k++) pre += fc[k] > 0 ? fc[k] : 0;
    if (keep > 0.99) b_hist = pre; /* (q 0 or no INT2 tier: the FULL cap is B_hist itself) */
  }
  kv_route_params_t p = {(size_t)b_hist, r.q, r.use_int2, r.use_full, 0};
  std::vector<int> want((size_t)n + 1), order((size_t)n + 1);
  kv_route_decide(c.data(), n, &p, want.data(), order.data());
  int shortcut = r.use_full && total <= b_hist;
  for (int k = 0; k < n; k++) shortcut &= c[k].tier == KV_TIER_FULL;
  if (shortcut) return 0;
  std::vector<int8_t> got((size_t)n + 1, (int8_t)-1);
  if (emu_block(32, [&](int) { kcr_fill(r, fc.data(), n, b_hist, got.data()); })) return -1;
  for (int k = 0; k < n; k++)
    if (got[k] != want[k]) {
      fprintf(stderr,
              "FAIL case %d: candidate %d of %d: tier %d, kv_route_decide %d (b_hist %lld, q %g, "
              "int2 %d, full %d)\n",
              id, k, n, got[k], want[k], (long long)b_hist, (double)r.q, r.use_int2, r.use_full);
      return -1;
    }
  return 1;
}

int main(void) {
  Emu emu;
  E = &emu;
  const int cases = 3000;
  int compared = 0, shortcuts = 0, fails = 0;
  for (int id = 0; id < cases; id++) {
    const int rc = run_case(id);
    compared += rc == 1, shortcuts += rc == 0, fails += rc < 0;
  }
  if (fails || compared < cases / 2) {
    fprintf(stderr, "route_emu: %d failure(s), %d cases compared\n", fails, compared);
    return 1;
  }
  fprintf(stderr,
          "route_emu: %d cases: every tier equal to kv_route_decide's (%d more took the "
          "everything-fits shortcut, not compared)\n",
          compared, shortcuts);
  return 0;
}
