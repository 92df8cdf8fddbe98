/* kern_cuda_route: allocation, QEvict routing and migration bookkeeping of the tiered cache on
 * the GPU (see kern_cuda_route.h). The CPU reference of the decision is cache/kv_route.c's
 * kv_route_decide (tests/kernels/test_kv_gpu.c compares them on random candidates). */
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cub/block/block_radix_sort.cuh>

extern "C" {
#include "qe_env.h"
#include "qe_status.h"
}
#include "kern_cuda_graphkv.h"
#include "kern_cuda_route.h"
#include "kern_cuda_route_fill.cuh"
#include "kern_cuda_sort.cuh"

#define KCR_NT      256
#define KCR_MAX_P   16384 /* candidates one decide block sorts (pow2) */
#define KCR_MOVE    0x20  /* plan flag: the planned tier is not the window's tier (the phases
                             read the descriptors of these windows only) */
#define KCR_ROUNDS  3     /* rounds of the ledger and demote phases per routing pass */
#define KCR_TIER(p) ((p)&0x0f)


static int kcr_cuda_at(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return 0;
  return qe_errf(QE_EBACKEND, "cuda: %s: %s (%s:%d)", what, cudaGetErrorString(e), file, line);
}
#define KCR_CUDA(call) kcr_cuda_at((call), #call, __FILE__, __LINE__)
#define KCR_LAUNCHED() kcr_cuda_at(cudaGetLastError(), "launch", __FILE__, __LINE__)

__device__ __forceinline__ int64_t kcr_idx(const kc_route_t &r, int layer, int slot, int w) {
  return ((int64_t)layer * r.max_seqs + slot) * r.max_win + w;
}

/* Pops one id (-1 when the stack is empty; see the header for why this is safe). low (may be
 * NULL) takes the stack's new height when that is its lowest yet: pushes never share a launch with
 * pops, so old - 1 is the true height. */
__device__ int kcr_pop(int32_t *stack, int32_t *top, int32_t *low, int32_t *err, int bit) {
  int old = atomicSub(top, 1);
  if (old > 0) {
    if (low) atomicMin(low, old - 1);
    return stack[old - 1];
  }
  atomicAdd(top, 1);
  atomicOr(err, bit);
  return -1;
}

__device__ void kcr_push(int32_t *stack, int32_t *top, int id) { stack[atomicAdd(top, 1)] = id; }

/* A free ledger slot: from the ledger stack, else a unit cut into a slab (slot 0 taken, the
 * others to the spare stack). -1 (err_flag bit 1) when no unit is left either. */
__device__ int kcr_pop_ledger(const kc_route_t &r, int bit) {
  int old = atomicSub(r.ledger_top, 1);
  if (old > 0) return r.ledger_stack[old - 1];
  atomicAdd(r.ledger_top, 1);
  const int u = kcr_pop(r.page_stack, r.page_top, r.units_low, r.err_flag, bit);
  if (u < 0) return -1;
  for (int k = 1; k < r.led_per; k++) kcr_push(r.spare_stack, r.spare_top, u * r.led_per + k);
  return u * r.led_per;
}

__device__ kern_pwin_t kcr_full_desc(const kc_route_t &r, int page, int w, int n_tok) {
  kern_pwin_t d = {};
  d.k = (uint64_t)page * r.page_bytes;
  d.v = d.k + r.page_bytes / 2;
  d.pos0 = w * r.omega;
  d.n_tok = n_tok;
  d.tier = KERN_PW_FULL;
  return d;
}

__device__ kern_pwin_t kcr_quant_desc(const kc_route_t &r, int led, int w, int n_tok) {
  const uint64_t b =
      (uint64_t)(led / r.led_per) * r.page_bytes + (uint64_t)(led % r.led_per) * r.lay.total;
  kern_pwin_t d = {};
  d.k = b + r.lay.k_codes, d.v = b + r.lay.v_codes;
  d.k_scale = b + r.lay.k_scale, d.k_zero = b + r.lay.k_zero;
  d.v_scale = b + r.lay.v_scale, d.v_zero = b + r.lay.v_zero;
  d.pos0 = w * r.omega;
  d.n_tok = n_tok;
  d.tier = KERN_PW_QUANT;
  return d;
}

/* ---- slots ------------------------------------------------------------------------------------
 */

__global__ void kcr_reset_k(const kc_route_t r, int slot) {
  const int l = blockIdx.y;
  for (int w = blockIdx.x * blockDim.x + threadIdx.x; w < r.max_win; w += gridDim.x * blockDim.x) {
    const int64_t i = kcr_idx(r, l, slot, w);
    kern_pwin_t d = {};
    d.tier = KERN_PW_EVICTED;
    r.win[i] = d, r.score[i] = 0.0f, r.page[i] = -1, r.ledger[i] = -1, r.plan[i] = 0;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const int j = l * r.max_seqs + slot;
    r.aged[j] = 0, r.st[j] = kc_route_stat_t{};
  }
}

__global__ void kcr_release_k(const kc_route_t r, int slot) {
  const int l = blockIdx.y;
  for (int w = blockIdx.x * blockDim.x + threadIdx.x; w < r.max_win; w += gridDim.x * blockDim.x) {
    const int64_t i = kcr_idx(r, l, slot, w);
    if (r.page[i] >= 0) kcr_push(r.page_stack, r.page_top, r.page[i]);
    if (r.ledger[i] >= 0) kcr_push(r.ledger_stack, r.ledger_top, r.ledger[i]);
    r.page[i] = -1, r.ledger[i] = -1;
  }
}

/* One thread per token: the first token of a window (or of a run) gives the window its page. */
__global__ void kcr_alloc_k(const kc_route_t r, int layer0, const int32_t *ts, const int32_t *tp,
                            int n) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x, layer = layer0 + (int)blockIdx.y;
  if (t >= n) return;
  const int s = ts[t], p = tp[t], w = p / r.omega;
  if (s < 0) return; /* an inactive row (a padded fixed-shape step) */
  const bool first = p % r.omega == 0 || t == 0 || ts[t - 1] != s || tp[t - 1] != p - 1;
  const int64_t i = kcr_idx(r, layer, s, w);
  if (!first || r.page[i] >= 0 || r.win[i].tier != KERN_PW_EVICTED || r.win[i].n_tok > 0) return;
  const int pg = kcr_pop(r.page_stack, r.page_top, r.units_low, r.err_flag, 1);
  if (pg < 0) return;
  r.page[i] = pg;
  r.win[i] = kcr_full_desc(r, pg, w, 0);
}

/* Window w's mass: the sum of the key masses m[t] of its tokens below n_tok. */
__device__ __forceinline__ float kcr_win_mass(const kc_route_t &r, const float *m, int w,
                                              int n_tok) {
  float s = 0.0f;
  for (int t = w * r.omega; t < (w + 1) * r.omega && t < n_tok; t++) s += m[t];
  return s;
}

/* One thread per window of the slot's first n_tok positions (nw windows); past the sink, the
 * largest mass among the windows within r.pool / 2 (kv_tiered's pool_masses: its window list
 * starts after the sink). */
__global__ void kcr_masses_k(const kc_route_t r, int layer, int slot, const float *m, int n_tok) {
  const int w = blockIdx.x * blockDim.x + threadIdx.x, nw = (n_tok + r.omega - 1) / r.omega;
  if (w >= nw) return;
  float s = kcr_win_mass(r, m, w, n_tok);
  const int h = w >= r.sink_win ? r.pool / 2 : 0;
  for (int j = max(w - h, r.sink_win); j <= min(w + h, nw - 1); j++)
    if (j != w) s = fmaxf(s, kcr_win_mass(r, m, j, n_tok));
  r.score[kcr_idx(r, layer, slot, w)] += s;
}

/* Block-wide ordered compaction: the rank of this thread's flag among the block's set flags
 * (thread order) and, in *total, how many are set. Every thread calls it. */
__device__ int kcr_block_rank(bool f, int *warp_cnt, int *total) {
  const unsigned b = __ballot_sync(0xffffffffu, f);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  if (lane == 0) warp_cnt[wid] = __popc(b);
  __syncthreads();
  int before = 0, tot = 0;
  for (int k = 0; k < (int)(blockDim.x >> 5); k++)
    before += k < wid ? warp_cnt[k] : 0, tot += warp_cnt[k];
  __syncthreads();
  *total = tot;
  return before + __popc(b & ((1u << lane) - 1u));
}

/* ---- decide ---------------------------------------------------------------------------------- */

/* Windows of slot s aged (routing candidates, sink included) at its current length. */
__device__ __forceinline__ int kcr_aged_now(const kc_route_t &r, const kc_route_call_t &c, int s) {
  const int lim = c.len[s] - r.n_local, A = lim > 0 ? lim / r.omega : 0;
  return A < r.sink_win ? r.sink_win : A;
}

/* Bytes window i costs while FULL (its kept ledger included). */
__device__ __forceinline__ int64_t kcr_full_cost(const kc_route_t &r, int64_t i) {
  return (int64_t)(r.page_bytes + r.meta_bytes) + (r.ledger[i] >= 0 ? (int64_t)r.lay.total : 0);
}

/* No pressure: every candidate may stay FULL (the decision's shortcut). */
__device__ __forceinline__ bool kcr_relaxed(const kc_route_t &r, int64_t full, int anyq,
                                            int64_t b_hist) {
  return r.use_full && (r.promote || !anyq) && full <= b_hist;
}

__device__ int64_t kcr_block_sum(int64_t v, int64_t *sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  int64_t t = 0;
  for (int k = 0; k < (int)(blockDim.x >> 5); k++) t += sh[k];
  return t;
}

/* Every thread: the FULL cost of sorted candidate k into fc[k] (its kept ledger included), or
 * -1 where it may not be FULL; read from global memory in parallel so that kcr_fill's warp
 * touches shared memory only (one thread's dependent global reads over ~2,300 candidates
 * took 18 ms a pass at 122 slots of 32K tokens, H200 2026-12-03). Syncs after. */
__device__ void kcr_full_costs(const kc_route_t &r, int layer, int slot, const int *idx, int n,
                               int32_t *fc) {
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    fc[k] = -1;
    if (idx[k] < 0 || idx[k] >= r.max_win) continue; /* cannot happen: the sort is total */
    const int64_t i = kcr_idx(r, layer, slot, idx[k]);
    if (!r.use_full || (r.win[i].tier == KERN_PW_QUANT && !r.promote)) continue;
    fc[k] = (int32_t)kcr_full_cost(r, i); /* a window's bytes: well under 2^31 */
  }
  __syncthreads();
}

/* The decision's ranking of key[P], idx[P] (P a power of two): score descending, window ascending
 * on ties. IT > 0 (P = KCR_NT IT): a stable block radix sort of the pairs, gathered in window
 * order (so ties keep it; -0 was made +0); IT 0: the bitonic kc_sort_pairs. Ends with a barrier. */
template <int IT> __device__ void kcr_sort(float *key, int *idx, int P) {
  if constexpr (IT == 0) {
    kc_sort_pairs(key, idx, P);
  } else {
    using S = cub::BlockRadixSort<float, KCR_NT, IT, int>;
    __shared__ typename S::TempStorage ts;
    float k[IT];
    int v[IT];
    const int t = threadIdx.x;
    for (int i = 0; i < IT; i++) k[i] = key[t * IT + i], v[i] = idx[t * IT + i]; /* blocked */
    S(ts).SortDescendingBlockedToStriped(k, v);
    __syncthreads(); /* every thread has read its keys */
    for (int i = 0; i < IT; i++) key[i * KCR_NT + t] = k[i], idx[i * KCR_NT + t] = v[i];
    __syncthreads();
  }
}

/* Candidate i's planned tier t, flagged KCR_MOVE when it is not the window's tier now. */
__device__ __forceinline__ void kcr_plan(const kc_route_t &r, int64_t i, int t) {
  const int cur = r.win[i].tier == KERN_PW_FULL ? KCR_FULL : KCR_QUANT; /* (a candidate) */
  r.plan[i] = (int8_t)(t | (t != cur ? KCR_MOVE : 0));
}

template <int IT> __global__ void kcr_decide_k(const kc_route_t r, const kc_route_call_t c, int P) {
  extern __shared__ __align__(16) uint8_t kcr_sm[];
  float *key = (float *)kcr_sm;
  int *idx = (int *)(key + P);
  int8_t *tier = (int8_t *)(idx + P);
  __shared__ int cnt[KCR_NT / 32];
  __shared__ int64_t red[32];
  const int s = c.slots[blockIdx.x], l = c.layer0 + blockIdx.y, j = l * r.max_seqs + s;
  const int A = kcr_aged_now(r, c, s);
  __shared__ int go;
  if (threadIdx.x == 0) { /* one thread reads and writes aged: every thread sees one answer */
    go = c.force || A > r.aged[j];
    r.routed[j] = go;
    if (go) r.aged[j] = A;
  }
  __syncthreads();
  if (!go) return;
  int64_t full = 0;
  int quant = 0, n = 0;
  for (int w0 = r.sink_win; w0 < A; w0 += KCR_NT) { /* the candidates in window order */
    const int w = w0 + threadIdx.x;
    const int64_t i = w < A ? kcr_idx(r, l, s, w) : 0;
    kern_pwin_t d = {};
    if (w < A) d = r.win[i];
    const bool f = w < A && d.n_tok > 0 && d.tier != KERN_PW_EVICTED;
    int tot = 0;
    const int k = n + kcr_block_rank(f, cnt, &tot);
    n += tot;
    if (!f) continue;
    const float sc = r.recency ? (float)w : r.gkv.on ? r.gkv.gscore[i] : r.score[i];
    /* NaN last; -0 as +0 (the radix sort would put it after +0) */
    const float ks = sc != sc ? -__int_as_float(0x7f800000) : sc == 0.0f ? 0.0f : sc;
    if (k < P) key[k] = ks, idx[k] = w;
    full += kcr_full_cost(r, i);
    quant |= d.tier == KERN_PW_QUANT;
  }
  full = kcr_block_sum(full, red);
  const int anyq = __syncthreads_or(quant);
  if (n > P) {
    if (threadIdx.x == 0) atomicOr(r.err_flag, 4), r.routed[j] = 0;
    return;
  }
  const int64_t b_hist = c.b_hist[j];
  if (kcr_relaxed(r, full, anyq, b_hist)) { /* no pressure: all FULL */
    for (int k = threadIdx.x; k < n; k += blockDim.x)
      kcr_plan(r, kcr_idx(r, l, s, idx[k]), KCR_FULL);
    return;
  }
  for (int k = n + threadIdx.x; k < P; k += blockDim.x)
    key[k] = -__int_as_float(0x7f800000), idx[k] = 0x7fffffff;
  __syncthreads();
  kcr_sort<IT>(key, idx, P);
  int32_t *fc = (int32_t *)key; /* the sorted keys are not read again */
  kcr_full_costs(r, l, s, idx, n, fc);
  if (threadIdx.x < 32) kcr_fill(r, fc, n, b_hist, tier);
  __syncthreads();
  for (int k = threadIdx.x; k < n; k += blockDim.x) kcr_plan(r, kcr_idx(r, l, s, idx[k]), tier[k]);
}

/* ---- GraphKV re-scoring ------------------------------------------------------------------------
 */

/* GraphKV's "slots being filled": the windows B_hist holds at (1 - q) FULL and q QUANT (at most n;
 * cache/kv_tiered_route.c's budget_slots). */
__device__ int kcr_budget_slots(const kc_route_t &r, int64_t b_hist, int n) {
  const double q = (double)r.q, b = (double)b_hist;
  const double full = (double)(r.page_bytes + r.meta_bytes),
               quant = (double)(r.lay.total + r.meta_bytes);
  const double slots = __dadd_rn(__ddiv_rn(__dmul_rn(__dsub_rn(1.0, q), b), full),
                                 q > 0 ? __ddiv_rn(__dmul_rn(q, b), quant) : 0.0);
  return slots < (double)n ? (int)slots : n;
}

/* One (slot, layer) of a pass (group g = blockIdx.y * n_slots + blockIdx.x, layer l0 + y): when
 * the decision will rank it (routed and under pressure), its candidates in window order into
 * the group's scratch (scores clamped to [0, FLT_MAX]); gscore takes the cumulative scores. */
__global__ void kcr_gkv_cand_k(const kc_route_t r, const kc_route_call_t c, int l0) {
  __shared__ int64_t red[32];
  __shared__ int wc[32];
  const int s = c.slots[blockIdx.x], l = l0 + blockIdx.y, j = l * r.max_seqs + s;
  const int g = blockIdx.y * c.n_slots + blockIdx.x, A = kcr_aged_now(r, c, s);
  const int64_t base = (int64_t)g * r.max_win;
  const kc_route_gkv_t &G = r.gkv;
  if (!(c.force || A > r.aged[j])) { /* not routed in this pass */
    if (threadIdx.x == 0) G.n_cand[g] = 0;
    return;
  }
  int64_t full = 0;
  int quant = 0, n = 0;
  for (int w0 = r.sink_win; w0 < A; w0 += blockDim.x) {
    const int w = w0 + threadIdx.x;
    const int64_t i = w < A ? kcr_idx(r, l, s, w) : 0;
    const kern_pwin_t d = w < A ? r.win[i] : kern_pwin_t{};
    const bool live = w < A && d.n_tok > 0 && d.tier != KERN_PW_EVICTED;
    int cnt;
    const int k = n + kcr_block_rank(live, wc, &cnt);
    n += cnt;
    if (!live) continue;
    const float sc = r.score[i];
    G.cwin[base + k] = d, G.cw[base + k] = w, G.gscore[i] = sc;
    G.cscore[base + k] = sc > 0.0f ? fminf(sc, FLT_MAX) : 0.0f;
    full += kcr_full_cost(r, i), quant |= d.tier == KERN_PW_QUANT;
  }
  full = kcr_block_sum(full, red);
  const int anyq = __syncthreads_or(quant);
  if (threadIdx.x) return;
  const int64_t b_hist = c.b_hist[j];
  const bool rank = n > 1 && !kcr_relaxed(r, full, anyq, b_hist);
  G.n_cand[g] = rank ? n : 0;
  G.n_slots[g] = kcr_budget_slots(r, b_hist, n);
}

/* The re-scored scores of the group's candidates into gscore. */
__global__ void kcr_gkv_scatter_k(const kc_route_t r, const kc_route_call_t c, int l0) {
  const int s = c.slots[blockIdx.x], l = l0 + blockIdx.y, g = blockIdx.y * c.n_slots + blockIdx.x;
  const int64_t base = (int64_t)g * r.max_win;
  for (int k = threadIdx.x; k < r.gkv.n_cand[g]; k += blockDim.x)
    r.gkv.gscore[kcr_idx(r, l, s, r.gkv.cw[base + k])] = r.gkv.cscore[base + k];
}

/* ---- migrations --------------------------------------------------------------------------------
 */

/* A migration job between window i's page and ledger (one side may not exist yet: ids given). */
__device__ kc_quant_job_t kcr_job(const kc_route_t &r, int page, int led, int w, int n_tok) {
  const kern_pwin_t f = kcr_full_desc(r, page, w, n_tok), q = kcr_quant_desc(r, led, w, n_tok);
  kc_quant_job_t jb;
  jb.k = f.k, jb.v = f.v, jb.k_codes = q.k, jb.k_scale = q.k_scale, jb.k_zero = q.k_zero;
  jb.v_codes = q.v, jb.v_scale = q.v_scale, jb.v_zero = q.v_zero;
  jb.pos0 = w * r.omega, jb.n_tok = n_tok;
  return jb;
}

/* The migration phases, each one launch over the routed (slot, layer)s. Frees and allocations
 * never share a launch, and every free comes before the allocation that may need it: evictions
 * free, demotions take ledgers, are quantized, then free their pages, promotions take pages, are
 * dequantized, then are committed. */
enum { KCR_PH_EVICT = 0, KCR_PH_LEDGER, KCR_PH_DEMOTE, KCR_PH_PAGE, KCR_PH_COMMIT };

__device__ void kcr_set_tier(const kc_route_t &r, int64_t i, const kern_pwin_t &d, int tier) {
  kern_pwin_t e = d;
  e.tier = tier;
  r.win[i] = e;
}

/* Window i (w) in phase ph; cur and nt its tier now and planned; last: the last round of the
 * ledger and demote phases (before it, a demotion that finds no ledger waits for the next round,
 * after the round's demotions have freed their pages). */
__device__ void kcr_step(const kc_route_t &r, int ph, int last, int j, int64_t i, int w,
                         const kern_pwin_t &d, int cur, int nt) {
  kc_route_stat_t *st = &r.st[j];
  if (ph == KCR_PH_EVICT && nt == KCR_EVICTED) {
    if (r.page[i] >= 0) kcr_push(r.page_stack, r.page_top, r.page[i]);
    if (r.ledger[i] >= 0) kcr_push(r.ledger_stack, r.ledger_top, r.ledger[i]);
    r.page[i] = -1, r.ledger[i] = -1;
    kcr_set_tier(r, i, d, KERN_PW_EVICTED);
    atomicAdd(&st->evictions, 1);
  } else if (ph == KCR_PH_EVICT && cur == KCR_FULL && nt == KCR_QUANT && r.ledger[i] < 0) {
    atomicAdd(r.led_need, 1); /* kcr_cut_k cuts whole slabs for these before the ledger phase */
  } else if (ph == KCR_PH_LEDGER && cur == KCR_FULL && nt == KCR_QUANT && r.ledger[i] < 0) {
    const int k = atomicAdd(r.n_qjobs, 1);
    const int led = k < r.job_cap ? kcr_pop_ledger(r, last) : -1;
    if (k >= r.job_cap) atomicOr(r.err_flag, 8);
    if (led < 0) { /* no ledger: the next round, or (last) the demotion becomes an eviction */
      if (last) r.plan[i] = KCR_EVICTED | KCR_MOVE;
      if (k < r.job_cap) r.qjobs[k] = kc_quant_job_t{};
      return;
    }
    r.ledger[i] = led, r.plan[i] = KCR_QUANT | KCR_MOVE;
    r.qjobs[k] = kcr_job(r, r.page[i], led, w, d.n_tok);
    atomicAdd(&st->quantizations, 1);
  } else if (ph == KCR_PH_DEMOTE && cur == KCR_FULL && nt == KCR_QUANT && r.ledger[i] < 0) {
    atomicAdd(r.led_need, 1); /* waits for a ledger: the next round's cut counts it */
  } else if (ph == KCR_PH_DEMOTE && cur == KCR_FULL && nt != KCR_FULL) {
    kcr_push(r.page_stack, r.page_top, r.page[i]);
    r.page[i] = -1;
    if (nt == KCR_QUANT)
      r.win[i] = kcr_quant_desc(r, r.ledger[i], w, d.n_tok);
    else
      kcr_set_tier(r, i, d, KERN_PW_EVICTED);
    atomicAdd(nt == KCR_QUANT ? &st->demotions : &st->evictions, 1);
  } else if (ph == KCR_PH_PAGE && cur == KCR_QUANT && nt == KCR_FULL) {
    /* the page first: a job per popped page, so a list of n_units jobs never overflows */
    const int pg = kcr_pop(r.page_stack, r.page_top, r.units_low, r.err_flag, 1);
    const int k = pg < 0 ? 0 : atomicAdd(r.n_djobs, 1);
    if (pg >= 0 && k >= r.job_cap) atomicOr(r.err_flag, 8); /* not with job_cap >= n_units */
    if (pg < 0 || k >= r.job_cap) { /* no page (or no job): stays INT2 */
      r.plan[i] = KCR_QUANT | KCR_MOVE; /* (COMMIT clears it) */
      return;
    }
    r.page[i] = pg;
    r.djobs[k] = kcr_job(r, pg, r.ledger[i], w, d.n_tok);
  } else if (ph == KCR_PH_COMMIT && cur == KCR_QUANT && nt == KCR_FULL) {
    r.win[i] = kcr_full_desc(r, r.page[i], w, d.n_tok);
    atomicAdd(&st->promotions, 1);
  }
}

/* The (layer, slot)'s bytes and windows per tier after its routing. */
__device__ void kcr_account(const kc_route_t &r, const kc_route_call_t &c, int s, int l, int j) {
  __shared__ int64_t red[32];
  int64_t bytes = 0;
  int nf = 0, nq = 0, ne = 0;
  const int n_win = (c.len[s] + r.omega - 1) / r.omega;
  for (int w = threadIdx.x; w < n_win; w += blockDim.x) {
    const int64_t i = kcr_idx(r, l, s, w);
    const int t = r.win[i].tier;
    nf += t == KERN_PW_FULL, nq += t == KERN_PW_QUANT, ne += t == KERN_PW_EVICTED;
    bytes += (r.page[i] >= 0 ? (int64_t)r.page_bytes : 0) +
             (r.ledger[i] >= 0 ? (int64_t)r.lay.total : 0) +
             (t != KERN_PW_EVICTED ? (int64_t)r.meta_bytes : 0);
  }
  bytes = kcr_block_sum(bytes, red);
  const int64_t packed = kcr_block_sum(((int64_t)nf << 42) | ((int64_t)nq << 21) | ne, red);
  if (threadIdx.x) return;
  kc_route_stat_t *st = &r.st[j];
  st->bytes = bytes;
  st->n_full = (int)(packed >> 42), st->n_quant = (int)((packed >> 21) & 0x1fffff);
  st->n_evicted = (int)(packed & 0x1fffff), st->routings++;
}

/* Moves the spare slots of slabs cut in the ledger phase to the ledger stack (a push launch). */
__global__ void kcr_merge_k(const kc_route_t r) {
  const int n = *r.spare_top;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    kcr_push(r.ledger_stack, r.ledger_top, r.spare_stack[i]);
  __syncthreads();
  if (threadIdx.x == 0) *r.spare_top = 0;
}

/* Between the evict and the ledger phases (one block; alone on the stacks): cuts just enough
 * units into slabs that the ledger phase's led_need pops all find a slot on the ledger stack.
 * Without it every pop past the free slots cuts a unit of its own (its other led_per - 1 slots
 * reach the ledger stack only after the launch), so a pass with many demotions (the lockstep
 * onset of pressure: every (slot, layer) demotes ~q of its history at once) takes led_per times
 * the units its ledgers need while the demoted pages are still held. Units that are not there
 * are not cut: those pops fault as before. */
__global__ void kcr_cut_k(const kc_route_t r) {
  __shared__ int n_cut, u0, l0;
  if (threadIdx.x == 0) {
    const int lack = *r.led_need - *r.ledger_top;
    int k = lack > 0 ? (lack + r.led_per - 1) / r.led_per : 0;
    k = k < *r.page_top ? k : *r.page_top;
    *r.page_top -= k;
    u0 = *r.page_top, l0 = *r.ledger_top, n_cut = k;
    if (k > 0 && r.units_low && u0 < *r.units_low) *r.units_low = u0;
    *r.led_need = 0;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_cut * r.led_per; i += blockDim.x)
    r.ledger_stack[l0 + i] = r.page_stack[u0 + i / r.led_per] * r.led_per + i % r.led_per;
  __syncthreads();
  if (threadIdx.x == 0) *r.ledger_top = l0 + n_cut * r.led_per;
}

/* When fewer than `low` units are free: every slab whose led_per slots are all in the ledger
 * stack goes back to the unit stack, its slots out of the ledger stack (one block; alone on the
 * stacks). */
__global__ void kcr_coalesce_k(const kc_route_t r, int low) {
  __shared__ int m;
  if (*r.page_top >= low || r.led_per < 1) return;
  const int n = *r.ledger_top;
  for (int u = threadIdx.x; u < r.n_units; u += blockDim.x) r.unit_cnt[u] = 0;
  if (threadIdx.x == 0) m = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    atomicAdd(&r.unit_cnt[r.ledger_stack[i] / r.led_per], 1);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int id = r.ledger_stack[i], u = id / r.led_per;
    if (r.unit_cnt[u] < r.led_per)
      r.spare_stack[atomicAdd(&m, 1)] = id;
    else if (id % r.led_per == 0)
      kcr_push(r.page_stack, r.page_top, u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += blockDim.x) r.ledger_stack[i] = r.spare_stack[i];
  if (threadIdx.x == 0) *r.ledger_top = m;
}

__global__ void kcr_phase_k(const kc_route_t r, const kc_route_call_t c, int ph, int last) {
  const int s = c.slots[blockIdx.x], l = c.layer0 + blockIdx.y, j = l * r.max_seqs + s;
  if (!r.routed[j]) return;
  for (int w = r.sink_win + threadIdx.x; w < r.aged[j]; w += blockDim.x) {
    const int64_t i = kcr_idx(r, l, s, w);
    const int pl = r.plan[i];
    if (!(pl & KCR_MOVE)) continue; /* (its descriptor is not read) */
    const kern_pwin_t d = r.win[i];
    if (d.n_tok > 0 && d.tier != KERN_PW_EVICTED) {
      const int cur = d.tier == KERN_PW_FULL ? KCR_FULL : KCR_QUANT, nt = KCR_TIER(pl);
      if (nt != cur) kcr_step(r, ph, last, j, i, w, d, cur, nt);
    }
    if (ph == KCR_PH_COMMIT) r.plan[i] = 0;
  }
  if (ph == KCR_PH_COMMIT) {
    __syncthreads();
    kcr_account(r, c, s, l, j);
  }
}

/* ---- launchers ------------------------------------------------------------------------------ */

/* QE_ROUTE_PROF=1 (a diagnostic): every routing pass records a CUDA event after each of its
 * stages (kcr_mark: the stage that ends there), waits for the last, and adds each stage's GPU time
 * to that stage name's sum; the process prints the sums to stderr at exit (the wait serializes
 * the host with each pass: for timings only). Passes of one layer (prefill) are not profiled. */
#define KCR_PROF_MAX 24
static struct {
  int on, n, n_names; /* on: 1 profiling, 0 not, -1 (the first pass) not yet read */
  cudaEvent_t ev[KCR_PROF_MAX];
  const char *at[KCR_PROF_MAX];   /* this pass's marks */
  const char *name[KCR_PROF_MAX]; /* the stages seen, first-seen order */
  double ms[KCR_PROF_MAX];
  long passes;
} kcr_prof = {-1, 0, 0, {}, {}, {}, {}, 0};

static void kcr_prof_print(void) {
  double all = 0, np = kcr_prof.passes ? (double)kcr_prof.passes : 1.0;
  for (int k = 0; k < kcr_prof.n_names; k++) all += kcr_prof.ms[k];
  fprintf(stderr, "route prof: %ld passes, %.3f ms a pass\n", kcr_prof.passes, all / np);
  for (int k = 0; k < kcr_prof.n_names; k++)
    fprintf(stderr, "route prof: %-10s %8.3f ms a pass (%4.1f%%)\n", kcr_prof.name[k],
            kcr_prof.ms[k] / np, all > 0 ? 100.0 * kcr_prof.ms[k] / all : 0.0);
}

/* The end of stage `name` of a profiled pass: an event. */
static void kcr_mark(cudaStream_t st, const char *name) {
  if (kcr_prof.on < 1 || kcr_prof.n >= KCR_PROF_MAX) return;
  kcr_prof.at[kcr_prof.n] = name;
  cudaEventRecord(kcr_prof.ev[kcr_prof.n++], st);
}

/* A pass's start: profiled (QE_ROUTE_PROF=1, read once) when `whole` (a decode pass, every
 * layer); its first event. */
static void kcr_prof_begin(cudaStream_t st, bool whole) {
  if (kcr_prof.on < 0) {
    kcr_prof.on = (int)qe_env_long("QE_ROUTE_PROF", 0, 1, 0);
    for (int k = 0; kcr_prof.on && k < KCR_PROF_MAX; k++) cudaEventCreate(&kcr_prof.ev[k]);
    if (kcr_prof.on) atexit(kcr_prof_print);
  }
  kcr_prof.n = whole ? 0 : KCR_PROF_MAX; /* (KCR_PROF_MAX: the pass records nothing) */
  kcr_mark(st, "begin");
}

static int kcr_prof_slot(const char *name) {
  for (int k = 0; k < kcr_prof.n_names; k++)
    if (!strcmp(kcr_prof.name[k], name)) return k;
  if (kcr_prof.n_names >= KCR_PROF_MAX) return -1;
  kcr_prof.name[kcr_prof.n_names] = name;
  return kcr_prof.n_names++;
}

/* The pass's end: its stages' GPU times added to their sums. */
static void kcr_prof_end(void) {
  if (kcr_prof.on < 1 || kcr_prof.n < 2 || kcr_prof.n >= KCR_PROF_MAX) return;
  cudaEventSynchronize(kcr_prof.ev[kcr_prof.n - 1]);
  for (int k = 1; k < kcr_prof.n; k++) {
    float ms = 0;
    const int x = kcr_prof_slot(kcr_prof.at[k]);
    if (x >= 0 && cudaEventElapsedTime(&ms, kcr_prof.ev[k - 1], kcr_prof.ev[k]) == cudaSuccess)
      kcr_prof.ms[x] += ms;
  }
  kcr_prof.passes++;
}

typedef void (*kcr_decide_fn)(kc_route_t, kc_route_call_t, int);

/* The decide kernel for P candidates: the radix sort's up to 8,192 (KCR_NT 32), else bitonic. */
static kcr_decide_fn kcr_decide_of(int P) {
  switch (P) {
  case KCR_NT: return kcr_decide_k<1>;
  case 2 * KCR_NT: return kcr_decide_k<2>;
  case 4 * KCR_NT: return kcr_decide_k<4>;
  case 8 * KCR_NT: return kcr_decide_k<8>;
  case 16 * KCR_NT: return kcr_decide_k<16>;
  case 32 * KCR_NT: return kcr_decide_k<32>;
  default: return kcr_decide_k<0>;
  }
}

static int kcr_pow2(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

extern "C" size_t kc_route_gkv_bytes(int max_seqs, int max_win, int row, int chunk) {
  const size_t groups = (size_t)chunk * (size_t)max_seqs, e = groups * (size_t)max_win;
  const size_t per = sizeof(kern_pwin_t) + sizeof(int32_t) + sizeof(float) * (2 + 8 + (size_t)row) +
                     sizeof(double);
  return e * per + groups * 2 * sizeof(int32_t);
}

/* Candidates a decide block ranks: max_win rounded up to a power of two, at least KCR_NT (one
 * key a thread for the radix sort). */
static int kcr_sort_p(int max_win) {
  const int P = kcr_pow2(max_win > 1 ? max_win : 1);
  return P > KCR_NT ? P : KCR_NT;
}

extern "C" size_t kc_route_smem(int max_win) {
  const int P = kcr_sort_p(max_win);
  return (size_t)P * (sizeof(float) + sizeof(int) + 1);
}

static dim3 kcr_slot_grid(const kc_route_t *r) {
  return dim3((unsigned)((r->max_win + KCR_NT - 1) / KCR_NT), (unsigned)r->n_layer);
}

extern "C" int kc_route_reset_slot(const kc_route_t *r, int slot, void *stream) {
  if (!r || slot < 0 || slot >= r->max_seqs)
    return qe_errf(QE_EINVAL, "kc_route: bad slot %d", slot);
  kcr_reset_k<<<kcr_slot_grid(r), KCR_NT, 0, (cudaStream_t)stream>>>(*r, slot);
  return KCR_LAUNCHED();
}

extern "C" int kc_route_release_slot(const kc_route_t *r, int slot, void *stream) {
  if (!r || slot < 0 || slot >= r->max_seqs)
    return qe_errf(QE_EINVAL, "kc_route: bad slot %d", slot);
  kcr_release_k<<<kcr_slot_grid(r), KCR_NT, 0, (cudaStream_t)stream>>>(*r, slot);
  return KCR_LAUNCHED();
}

extern "C" int kc_route_alloc_windows(const kc_route_t *r, int layer0, int n_layers,
                                      const int32_t *ts, const int32_t *tp, int n, void *stream) {
  if (!r || layer0 < 0 || n_layers < 1 || n_layers > 65535 || layer0 + n_layers > r->n_layer ||
      n < 0)
    return qe_errf(QE_EINVAL, "kc_route_alloc_windows: bad arguments");
  if (!n) return 0;
  const dim3 grid((unsigned)((n + KCR_NT - 1) / KCR_NT), (unsigned)n_layers);
  kcr_alloc_k<<<grid, KCR_NT, 0, (cudaStream_t)stream>>>(*r, layer0, ts, tp, n);
  return KCR_LAUNCHED();
}

extern "C" int kc_route_add_masses(const kc_route_t *r, int layer, int slot, const float *m,
                                   int n_tok, void *stream) {
  if (!r || layer < 0 || layer >= r->n_layer || slot < 0 || slot >= r->max_seqs || n_tok < 0)
    return qe_errf(QE_EINVAL, "kc_route_add_masses: bad arguments");
  const int nw = (n_tok + r->omega - 1) / r->omega;
  if (!nw) return 0;
  kcr_masses_k<<<(nw + KCR_NT - 1) / KCR_NT, KCR_NT, 0, (cudaStream_t)stream>>>(*r, layer, slot, m,
                                                                                n_tok);
  return KCR_LAUNCHED();
}

/* One phase launch over c's (slot, layer)s; after the evict phase, and after a demote round that
 * left demotions waiting, whole slabs are cut for the ledgers still needed (kcr_cut_k). */
static int kcr_phase(const kc_route_t *r, const kc_route_call_t *c, int ph, int last,
                     cudaStream_t st) {
  const dim3 grid((unsigned)c->n_slots, (unsigned)c->n_layers);
  kcr_phase_k<<<grid, KCR_NT, 0, st>>>(*r, *c, ph, last);
  if (KCR_LAUNCHED()) return QE_EBACKEND;
  if (ph == KCR_PH_EVICT || (ph == KCR_PH_DEMOTE && !last)) kcr_cut_k<<<1, KCR_NT, 0, st>>>(*r);
  return KCR_LAUNCHED();
}

/* GraphKV over c's (slot, layer)s, gkv.chunk layers at a time: candidates, their mean keys, the
 * re-scoring, the results into gscore. */
static int kcr_gkv(const kc_route_t *r, const kc_route_call_t *c, const kc_quant_args_t *qa,
                   cudaStream_t st) {
  const kc_route_gkv_t *G = &r->gkv;
  const int end = c->layer0 + c->n_layers;
  for (int l0 = c->layer0; l0 < end; l0 += G->chunk) {
    const int nl = end - l0 < G->chunk ? end - l0 : G->chunk, ng = nl * c->n_slots;
    const dim3 grid((unsigned)c->n_slots, (unsigned)nl);
    kcr_gkv_cand_k<<<grid, KCR_NT, 0, st>>>(*r, *c, l0);
    int rc = KCR_LAUNCHED();
    if (!rc) rc = kc_mean_keys(qa, G->cwin, G->n_cand, ng, r->max_win, G->keys, st);
    const kc_graphkv_args_t a = {G->source_frac, G->m,      G->rounds,  ng,        r->max_win,
                                 G->row,         G->n_cand, G->n_slots, G->cscore, G->keys,
                                 G->norm,        G->decay,  G->sim};
    if (!rc) rc = kc_graphkv_rescore(&a, st);
    if (rc) return rc;
    kcr_gkv_scatter_k<<<grid, KCR_NT, 0, st>>>(*r, *c, l0);
    if ((rc = KCR_LAUNCHED())) return rc;
  }
  return 0;
}

/* Round `round` of the demotions: FULL pages -> new ledgers (quantized), then the pages freed.
 * A demotion that finds no ledger waits for the next round, whose ledgers come from the pages
 * this round freed (the pool's peak stays near the pass's end state); in the last round it
 * becomes an eviction. */
static int kcr_demote_round(const kc_route_t *r, const kc_route_call_t *c, kc_quant_args_t *q,
                            int round, cudaStream_t st) {
  const int last = round == KCR_ROUNDS - 1;
  int rc = KCR_CUDA(cudaMemsetAsync(r->n_qjobs, 0, sizeof(int32_t), st)) ? QE_EBACKEND : 0;
  if (!rc) rc = kcr_phase(r, c, KCR_PH_LEDGER, last, st);
  kcr_mark(st, "ledger");
  if (!rc) q->jobs = r->qjobs, q->n_jobs_dev = r->n_qjobs, rc = kc_quant_windows(q, st);
  kcr_mark(st, "quantize");
  if (!rc) kcr_merge_k<<<1, KCR_NT, 0, st>>>(*r); /* cut slabs' spares to the ledger stack */
  if (!rc) rc = KCR_LAUNCHED();
  kcr_mark(st, "merge");
  if (!rc) rc = kcr_phase(r, c, KCR_PH_DEMOTE, last, st);
  kcr_mark(st, "demote");
  return rc;
}

extern "C" int kc_route_run(const kc_route_t *r, const kc_route_call_t *c,
                            const kc_quant_args_t *qa, void *stream) {
  if (!r || !c || !qa || c->n_slots < 0 || c->layer0 < 0 || c->n_layers < 1 ||
      c->layer0 + c->n_layers > r->n_layer || c->n_slots > 65535)
    return qe_errf(QE_EINVAL, "kc_route_run: bad arguments");
  if (r->job_cap < r->n_units)
    return qe_errf(QE_EINVAL, "kc_route_run: job lists of %d for %d units", r->job_cap,
                   r->n_units);
  if (!c->n_slots) return 0;
  cudaStream_t st = (cudaStream_t)stream;
  const int P = kcr_sort_p(r->max_win);
  if (P > KCR_MAX_P)
    return qe_errf(QE_EUNSUPPORTED, "kc_route: %d windows per sequence (at most %d)", r->max_win,
                   KCR_MAX_P);
  const size_t smem = kc_route_smem(r->max_win);
  const kcr_decide_fn decide = kcr_decide_of(P);
  if (KCR_CUDA(cudaFuncSetAttribute(decide, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem)))
    return QE_EBACKEND;
  const dim3 grid((unsigned)c->n_slots, (unsigned)c->n_layers);
  const int low = r->n_units / 32 > 64 ? r->n_units / 32 : 64;
  kcr_prof_begin(st, c->n_layers > 1);
  kcr_coalesce_k<<<1, 1024, 0, st>>>(*r, low);
  if (KCR_LAUNCHED()) return QE_EBACKEND;
  kcr_mark(st, "coalesce");
  if (r->gkv.on && !r->recency) {
    if (r->gkv.chunk < 1 || !r->gkv.gscore)
      return qe_errf(QE_EINVAL, "kc_route_run: GraphKV on without its scratch");
    const int rc = kcr_gkv(r, c, qa, st);
    if (rc) return rc;
    kcr_mark(st, "graphkv");
  }
  decide<<<grid, KCR_NT, smem, st>>>(*r, *c, P);
  if (KCR_LAUNCHED() || KCR_CUDA(cudaMemsetAsync(r->n_djobs, 0, sizeof(int32_t), st)) ||
      KCR_CUDA(cudaMemsetAsync(r->led_need, 0, sizeof(int32_t), st)))
    return QE_EBACKEND;
  kcr_mark(st, "decide");
  kc_quant_args_t q = *qa;
  q.n_jobs = r->job_cap;
  int rc = kcr_phase(r, c, KCR_PH_EVICT, 1, st);
  kcr_mark(st, "evict");
  for (int round = 0; !rc && round < KCR_ROUNDS; round++)
    rc = kcr_demote_round(r, c, &q, round, st);
  if (!rc) rc = kcr_phase(r, c, KCR_PH_PAGE, 1, st);
  kcr_mark(st, "page");
  if (!rc) /* promotions: ledgers -> new pages */
    q.jobs = r->djobs, q.n_jobs_dev = r->n_djobs, rc = kc_dequant_windows(&q, stream);
  kcr_mark(st, "dequantize");
  if (!rc) rc = kcr_phase(r, c, KCR_PH_COMMIT, 1, st);
  kcr_mark(st, "commit");
  kcr_prof_end();
  return rc;
}
