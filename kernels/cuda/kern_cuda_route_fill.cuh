/* kern_cuda_route_fill: the routing decision's tier fill (kern_cuda_route.cu's kcr_decide_k runs
 * it in warp 0 of a block), in a header of its own so that tests/kernels/route_emu.cu runs the
 * same code on the CPU (KCR_EMU: the warp's votes and shuffles through emu_fiber.h's fibers)
 * against cache/kv_route.c's serial fill (kv_route_decide). CUDA C++ only. */
#ifndef QE_KERN_CUDA_ROUTE_FILL_CUH
#define QE_KERN_CUDA_ROUTE_FILL_CUH

#include <stdint.h>

#include "kern_cuda_route.h"

enum { KCR_FULL = 0, KCR_QUANT = 1, KCR_EVICTED = 2 }; /* kv_route.h's KV_TIER_* */

#ifndef KCR_EMU
#define KCR_FFN              __device__ __forceinline__
#define KCR_LANE()           ((int)(threadIdx.x & 31))
#define KCR_BALLOT(p)        __ballot_sync(0xffffffffu, (p))
#define KCR_SHFL_UP64(v, o)  __shfl_up_sync(0xffffffffu, (v), (o))
#define KCR_SHFL64(v, src)   __shfl_sync(0xffffffffu, (v), (src))
#define KCR_CLZ(x)           __clz(x)
#define KCR_POPC(x)          __popc(x)
#define KCR_SYNCWARP()       __syncwarp()
#else
/* emu_fiber.h's collectives, and the fiber's lane (defined by the test) */
uint32_t kca_emu_ballot(int pred);
uint32_t kca_emu_shfl_u(uint32_t v, int src);
void kca_emu_syncwarp(void);
int kcr_emu_lane(void);
static inline int64_t kcr_emu_shfl64(int64_t v, int src) {
  const uint32_t lo = kca_emu_shfl_u((uint32_t)(uint64_t)v, src);
  const uint32_t hi = kca_emu_shfl_u((uint32_t)((uint64_t)v >> 32), src);
  return (int64_t)((uint64_t)hi << 32 | lo);
}
#define KCR_FFN             static inline
#define KCR_LANE()          kcr_emu_lane()
#define KCR_BALLOT(p)       kca_emu_ballot((p) ? 1 : 0)
#define KCR_SHFL_UP64(v, o) kcr_emu_shfl64((v), kcr_emu_up(o))
static inline int kcr_emu_up(int o) { /* a lane below o reads its own value, as on the GPU */
  return kcr_emu_lane() >= o ? kcr_emu_lane() - o : kcr_emu_lane();
}
#define KCR_SHFL64(v, src)  kcr_emu_shfl64((v), (src))
#define KCR_CLZ(x)          __builtin_clz((unsigned)(x))
#define KCR_POPC(x)         __builtin_popcount((unsigned)(x))
#define KCR_SYNCWARP()      kca_emu_syncwarp()
#endif

/* Warp 0: kv_route_decide's greedy fill over the sorted candidates (FULL costs fc from
 * kcr_full_costs, -1 where a candidate may not be FULL); tiers into tier[]. FULL: a candidate is
 * taken when it fits after every one taken before it; a chunk of 32 candidates at a time, each
 * round taking the pending lanes before the first that overflows (prefix sums) and rejecting it,
 * until nothing can fit (every FULL cost is at least page + meta bytes). QUANT: the first
 * (B_hist - FULL bytes) / (ledger + meta) candidates that are not FULL. */
KCR_FFN void kcr_fill(const kc_route_t &r, const int32_t *fc, int n, int64_t b_hist,
                      int8_t *tier) {
  const int lane = KCR_LANE();
  const int64_t LM = (int64_t)r.lay.total + (int64_t)r.meta_bytes;
  const int64_t lo = (int64_t)(r.page_bytes + r.meta_bytes);
  const int64_t full_cap = r.use_int2 ? (int64_t)((1.0 - (double)r.q) * (double)b_hist) : b_hist;
  int64_t used = 0;
  bool open = full_cap >= lo; /* (warp-uniform) */
  for (int k0 = 0; k0 < n; k0 += 32) {
    const int k = k0 + lane;
    const int64_t c = k < n ? fc[k] : -1;
    uint32_t pend = open ? KCR_BALLOT(c >= 0) : 0u, full = 0u;
    while (pend) {
      int64_t pre = pend >> lane & 1 ? c : 0;
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t t = KCR_SHFL_UP64(pre, o);
        if (lane >= o) pre += t;
      }
      const uint32_t bad = pend & KCR_BALLOT(used + pre > full_cap);
      const uint32_t first = bad & (0u - bad), take = bad ? pend & (first - 1u) : pend;
      if (take) used += KCR_SHFL64(pre, 31 - KCR_CLZ(take));
      full |= take, pend &= ~(take | first);
      if (full_cap - used < lo) open = false, pend = 0u;
    }
    if (k < n) tier[k] = full >> lane & 1 ? KCR_FULL : KCR_EVICTED;
  }
  KCR_SYNCWARP();
  const int64_t q_cap = b_hist - used;
  const int64_t K = !r.use_int2 || q_cap < 0 ? 0 : LM > 0 ? q_cap / LM : (int64_t)n;
  int64_t before = 0;
  for (int k0 = 0; k0 < n && before < K; k0 += 32) {
    const int k = k0 + lane;
    const bool nf = k < n && tier[k] != KCR_FULL;
    const uint32_t b = KCR_BALLOT(nf);
    if (nf && before + KCR_POPC(b & ((1u << lane) - 1u)) < K) tier[k] = KCR_QUANT;
    before += KCR_POPC(b);
  }
}

#endif
