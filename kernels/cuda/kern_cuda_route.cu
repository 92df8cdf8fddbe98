/* kern_cuda_route: allocation, QEvict routing and migration bookkeeping of the tiered cache on
 * the GPU (see kern_cuda_route.h). The CPU reference of the decision is cache/kv_route.c's
 * kv_route_decide (tests/kernels/test_kv_gpu.c compares them on random candidates). */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "qe_status.h"
}
#include "kern_cuda_route.h"

#define KCR_NT      256
#define KCR_MAX_P   16384 /* candidates one decide block sorts (pow2) */
#define KCR_NEWLED  0x10  /* plan flag: the window took a new ledger (first quantization) */
#define KCR_TIER(p) ((p)&0x0f)

enum { KCR_FULL = 0, KCR_QUANT = 1, KCR_EVICTED = 2 }; /* kv_route.h's KV_TIER_* */

static int kcr_cuda_at(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return 0;
  return qe_errf(QE_EBACKEND, "cuda: %s: %s (%s:%d)", what, cudaGetErrorString(e), file, line);
}
#define KCR_CUDA(call) kcr_cuda_at((call), #call, __FILE__, __LINE__)
#define KCR_LAUNCHED() kcr_cuda_at(cudaGetLastError(), "launch", __FILE__, __LINE__)

__device__ __forceinline__ int64_t kcr_idx(const kc_route_t &r, int layer, int slot, int w) {
  return ((int64_t)layer * r.max_seqs + slot) * r.max_win + w;
}

/* Pops one id (-1 when the stack is empty; see the header for why this is safe). */
__device__ int kcr_pop(int32_t *stack, int32_t *top, int32_t *err, int bit) {
  int old = atomicSub(top, 1);
  if (old > 0) return stack[old - 1];
  atomicAdd(top, 1);
  atomicOr(err, bit);
  return -1;
}

__device__ void kcr_push(int32_t *stack, int32_t *top, int id) { stack[atomicAdd(top, 1)] = id; }

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
  const uint64_t b = r.ledger_base + (uint64_t)led * r.lay.total;
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
__global__ void kcr_alloc_k(const kc_route_t r, int layer, const int32_t *ts, const int32_t *tp,
                            int n) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int s = ts[t], p = tp[t], w = p / r.omega;
  const bool first = p % r.omega == 0 || t == 0 || ts[t - 1] != s || tp[t - 1] != p - 1;
  const int64_t i = kcr_idx(r, layer, s, w);
  if (!first || r.page[i] >= 0 || r.win[i].tier != KERN_PW_EVICTED || r.win[i].n_tok > 0) return;
  const int pg = kcr_pop(r.page_stack, r.page_top, r.err_flag, 1);
  if (pg < 0) return;
  r.page[i] = pg;
  r.win[i] = kcr_full_desc(r, pg, w, 0);
}

/* One thread per window of the slot's first n_tok positions. */
__global__ void kcr_masses_k(const kc_route_t r, int layer, int slot, const float *m, int n_tok) {
  const int w = blockIdx.x * blockDim.x + threadIdx.x, t0 = w * r.omega;
  if (t0 >= n_tok) return;
  float s = 0.0f;
  for (int t = t0; t < t0 + r.omega && t < n_tok; t++) s += m[t];
  r.score[kcr_idx(r, layer, slot, w)] += s;
}

/* ---- decide ---------------------------------------------------------------------------------- */

__device__ int64_t kcr_block_sum(int64_t v, int64_t *sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  int64_t t = 0;
  for (int k = 0; k < (int)(blockDim.x >> 5); k++) t += sh[k];
  return t;
}

/* (score desc, window asc): true when a sorts before b. */
__device__ __forceinline__ bool kcr_before(float ka, int ia, float kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}

__device__ void kcr_sort(float *key, int *idx, int P) {
  for (int k = 2; k <= P; k <<= 1)
    for (int jj = k >> 1; jj > 0; jj >>= 1) {
      for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int l = i ^ jj;
        if (l <= i) continue;
        const bool up = (i & k) == 0; /* this pair's run sorts "before" first */
        const bool sw = up ? kcr_before(key[l], idx[l], key[i], idx[i])
                           : kcr_before(key[i], idx[i], key[l], idx[l]);
        if (sw) {
          float tk = key[i];
          int ti = idx[i];
          key[i] = key[l], idx[i] = idx[l], key[l] = tk, idx[l] = ti;
        }
      }
      __syncthreads();
    }
}

/* Thread 0: kv_route_decide's greedy fill over the sorted candidates; tiers into tier[]. */
__device__ void kcr_fill(const kc_route_t &r, int layer, int slot, const int *idx, int n,
                         int64_t b_hist, int8_t *tier) {
  const int64_t L = (int64_t)r.lay.total, M = (int64_t)r.meta_bytes;
  const int64_t full_cap = r.use_int2 ? (int64_t)((1.0 - (double)r.q) * (double)b_hist) : b_hist;
  int64_t full_used = 0, q_used = 0;
  for (int k = 0; k < n; k++) {
    const int64_t i = kcr_idx(r, layer, slot, idx[k]);
    tier[k] = KCR_EVICTED;
    if (!r.use_full || (r.win[i].tier == KERN_PW_QUANT && !r.promote)) continue;
    const int64_t fc = (int64_t)r.page_bytes + M + (r.ledger[i] >= 0 ? L : 0);
    if (full_used + fc <= full_cap) full_used += fc, tier[k] = KCR_FULL;
  }
  const int64_t q_cap = b_hist - full_used;
  for (int k = 0; r.use_int2 && k < n; k++)
    if (tier[k] != KCR_FULL && q_used + L + M <= q_cap) q_used += L + M, tier[k] = KCR_QUANT;
}

__global__ void kcr_decide_k(const kc_route_t r, const kc_route_call_t c, int P) {
  extern __shared__ __align__(16) uint8_t kcr_sm[];
  float *key = (float *)kcr_sm;
  int *idx = (int *)(key + P);
  int8_t *tier = (int8_t *)(idx + P);
  __shared__ int n_c;
  __shared__ int64_t red[32];
  const int s = c.slots[blockIdx.x], l = c.layer0 + blockIdx.y, j = l * r.max_seqs + s;
  const int len = c.len[s], lim = len - r.n_local;
  int A = lim > 0 ? lim / r.omega : 0;
  A = A < r.sink_win ? r.sink_win : A;
  if (threadIdx.x == 0) r.routed[j] = 0;
  if (!c.force && A <= r.aged[j]) return;
  if (threadIdx.x == 0) n_c = 0, r.aged[j] = A, r.routed[j] = 1;
  __syncthreads();
  int64_t full = 0;
  int quant = 0;
  for (int w = r.sink_win + threadIdx.x; w < A; w += blockDim.x) {
    const int64_t i = kcr_idx(r, l, s, w);
    const kern_pwin_t d = r.win[i];
    if (d.n_tok <= 0 || d.tier == KERN_PW_EVICTED) continue;
    const int k = atomicAdd(&n_c, 1);
    if (k < P) key[k] = r.recency ? (float)w : r.score[i], idx[k] = w;
    full += (int64_t)(r.page_bytes + r.meta_bytes) + (r.ledger[i] >= 0 ? (int64_t)r.lay.total : 0);
    quant |= d.tier == KERN_PW_QUANT;
  }
  full = kcr_block_sum(full, red);
  const int anyq = __syncthreads_or(quant), n = n_c;
  if (n > P) {
    if (threadIdx.x == 0) atomicOr(r.err_flag, 4), r.routed[j] = 0;
    return;
  }
  const int64_t b_hist = c.b_hist[s];
  if (r.use_full && (r.promote || !anyq) && full <= b_hist) { /* no pressure: all FULL */
    for (int k = threadIdx.x; k < n; k += blockDim.x) r.plan[kcr_idx(r, l, s, idx[k])] = KCR_FULL;
    return;
  }
  for (int k = n + threadIdx.x; k < P; k += blockDim.x)
    key[k] = -__int_as_float(0x7f800000), idx[k] = 0x7fffffff;
  __syncthreads();
  kcr_sort(key, idx, P);
  if (threadIdx.x == 0) kcr_fill(r, l, s, idx, n, b_hist, tier);
  __syncthreads();
  for (int k = threadIdx.x; k < n; k += blockDim.x) r.plan[kcr_idx(r, l, s, idx[k])] = tier[k];
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

/* Pops what the planned transitions need and lists the quantize / dequantize jobs. */
__global__ void kcr_migrate_k(const kc_route_t r, const kc_route_call_t c) {
  const int s = c.slots[blockIdx.x], l = c.layer0 + blockIdx.y, j = l * r.max_seqs + s;
  if (!r.routed[j]) return;
  for (int w = r.sink_win + threadIdx.x; w < r.aged[j]; w += blockDim.x) {
    const int64_t i = kcr_idx(r, l, s, w);
    const kern_pwin_t d = r.win[i];
    if (d.n_tok <= 0 || d.tier == KERN_PW_EVICTED) continue;
    const int cur = d.tier == KERN_PW_FULL ? KCR_FULL : KCR_QUANT, nt = KCR_TIER(r.plan[i]);
    if (nt == cur || nt == KCR_EVICTED) continue;
    if (nt == KCR_QUANT && r.ledger[i] >= 0) continue; /* write-once ledger: codes kept */
    int32_t *cnt = nt == KCR_QUANT ? r.n_qjobs : r.n_djobs;
    const int k = atomicAdd(cnt, 1);
    if (k >= r.job_cap) { /* no room to migrate: a demotion evicts, a promotion stays */
      atomicOr(r.err_flag, 8);
      r.plan[i] = nt == KCR_QUANT ? KCR_EVICTED : KCR_QUANT;
      continue;
    }
    if (nt == KCR_QUANT) {
      const int led = kcr_pop(r.ledger_stack, r.ledger_top, r.err_flag, 2);
      if (led < 0) { /* the job slot stays, as a 0-token no-op */
        r.plan[i] = KCR_EVICTED, r.qjobs[k] = kc_quant_job_t{}, r.qjobs[k].n_tok = 0;
        continue;
      }
      r.ledger[i] = led, r.plan[i] = KCR_QUANT | KCR_NEWLED;
      r.qjobs[k] = kcr_job(r, r.page[i], led, w, d.n_tok);
    } else {
      const int pg = kcr_pop(r.page_stack, r.page_top, r.err_flag, 1);
      if (pg < 0) {
        r.plan[i] = KCR_QUANT, r.djobs[k] = kc_quant_job_t{}, r.djobs[k].n_tok = 0;
        continue;
      }
      r.page[i] = pg;
      r.djobs[k] = kcr_job(r, pg, r.ledger[i], w, d.n_tok);
    }
  }
}

/* Applies the plan: descriptors, frees, and the (layer, slot)'s accounting. */
__global__ void kcr_commit_k(const kc_route_t r, const kc_route_call_t c) {
  __shared__ int64_t red[32];
  const int s = c.slots[blockIdx.x], l = c.layer0 + blockIdx.y, j = l * r.max_seqs + s;
  if (!r.routed[j]) return;
  int prom = 0, dem = 0, evi = 0, qz = 0;
  for (int w = r.sink_win + threadIdx.x; w < r.aged[j]; w += blockDim.x) {
    const int64_t i = kcr_idx(r, l, s, w);
    const kern_pwin_t d = r.win[i];
    if (d.n_tok <= 0 || d.tier == KERN_PW_EVICTED) continue;
    const int cur = d.tier == KERN_PW_FULL ? KCR_FULL : KCR_QUANT, nt = KCR_TIER(r.plan[i]);
    qz += (r.plan[i] & KCR_NEWLED) != 0;
    r.plan[i] = 0;
    if (nt == cur) continue;
    if (nt == KCR_EVICTED) {
      if (r.page[i] >= 0) kcr_push(r.page_stack, r.page_top, r.page[i]);
      if (r.ledger[i] >= 0) kcr_push(r.ledger_stack, r.ledger_top, r.ledger[i]);
      r.page[i] = -1, r.ledger[i] = -1, evi++;
      kern_pwin_t e = d;
      e.tier = KERN_PW_EVICTED;
      r.win[i] = e;
    } else if (nt == KCR_QUANT) {
      kcr_push(r.page_stack, r.page_top, r.page[i]);
      r.page[i] = -1, dem++;
      r.win[i] = kcr_quant_desc(r, r.ledger[i], w, d.n_tok);
    } else {
      prom++;
      r.win[i] = kcr_full_desc(r, r.page[i], w, d.n_tok);
    }
  }
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
  const int64_t moves = kcr_block_sum(((int64_t)prom << 42) | ((int64_t)dem << 21) | evi, red);
  const int nqz = (int)kcr_block_sum(qz, red);
  if (threadIdx.x) return;
  kc_route_stat_t *st = &r.st[j];
  st->bytes = bytes;
  st->n_full = (int)(packed >> 42), st->n_quant = (int)((packed >> 21) & 0x1fffff);
  st->n_evicted = (int)(packed & 0x1fffff);
  st->promotions += (int)(moves >> 42), st->demotions += (int)((moves >> 21) & 0x1fffff);
  st->evictions += (int)(moves & 0x1fffff), st->quantizations += nqz, st->routings++;
}

/* ---- launchers ------------------------------------------------------------------------------ */

static int kcr_pow2(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

extern "C" size_t kc_route_smem(int max_win) {
  const int P = kcr_pow2(max_win > 1 ? max_win : 1);
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

extern "C" int kc_route_alloc_windows(const kc_route_t *r, int layer, const int32_t *ts,
                                      const int32_t *tp, int n, void *stream) {
  if (!r || layer < 0 || layer >= r->n_layer || n < 0)
    return qe_errf(QE_EINVAL, "kc_route_alloc_windows: bad arguments");
  if (!n) return 0;
  kcr_alloc_k<<<(n + KCR_NT - 1) / KCR_NT, KCR_NT, 0, (cudaStream_t)stream>>>(*r, layer, ts, tp, n);
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

extern "C" int kc_route_run(const kc_route_t *r, const kc_route_call_t *c,
                            const kc_quant_args_t *qa, void *stream) {
  if (!r || !c || !qa || c->n_slots < 0 || c->layer0 < 0 || c->n_layers < 1 ||
      c->layer0 + c->n_layers > r->n_layer || c->n_slots > 65535)
    return qe_errf(QE_EINVAL, "kc_route_run: bad arguments");
  if (!c->n_slots) return 0;
  cudaStream_t st = (cudaStream_t)stream;
  const int P = kcr_pow2(r->max_win);
  if (P > KCR_MAX_P)
    return qe_errf(QE_EUNSUPPORTED, "kc_route: %d windows per sequence (at most %d)", r->max_win,
                   KCR_MAX_P);
  const size_t smem = kc_route_smem(r->max_win);
  if (KCR_CUDA(cudaFuncSetAttribute(kcr_decide_k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem)))
    return QE_EBACKEND;
  const dim3 grid((unsigned)c->n_slots, (unsigned)c->n_layers);
  kcr_decide_k<<<grid, KCR_NT, smem, st>>>(*r, *c, P);
  if (KCR_LAUNCHED() || KCR_CUDA(cudaMemsetAsync(r->n_qjobs, 0, sizeof(int32_t), st)) ||
      KCR_CUDA(cudaMemsetAsync(r->n_djobs, 0, sizeof(int32_t), st)))
    return QE_EBACKEND;
  kcr_migrate_k<<<grid, KCR_NT, 0, st>>>(*r, *c);
  if (KCR_LAUNCHED()) return QE_EBACKEND;
  kc_quant_args_t q = *qa;
  q.jobs = r->qjobs, q.n_jobs = r->job_cap, q.n_jobs_dev = r->n_qjobs;
  int rc = kc_quant_windows(&q, stream);
  q.jobs = r->djobs, q.n_jobs_dev = r->n_djobs;
  if (!rc) rc = kc_dequant_windows(&q, stream);
  if (rc) return rc;
  kcr_commit_k<<<grid, KCR_NT, 0, st>>>(*r, *c);
  return KCR_LAUNCHED();
}
