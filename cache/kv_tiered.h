/* kv_tiered: the three-tier KV cache (Full / INT2 / Evicted) behind kv_cache_ops_t, driven by
 * a kv_policy_cfg_t. Per sequence and layer: the sink (first n_sink tokens, always Full), then
 * windows of omega tokens; windows still overlapping the most recent n_local tokens are
 * protected (Full); older ("aged") windows are routed by the policy whenever one ages and
 * after each layer's prefill. Keys in Full pages are post-RoPE; INT2 ledgers hold keys in the
 * policy's frame (cfg.quant.key_frame: post-RoPE by default, or pre-RoPE / window-relative,
 * re-rotated at attention time). Persistent bytes of a sequence never exceed its
 * budget; the prompt's transient Full KV is held one layer at a time.
 * Not thread-safe: one engine thread drives a cache. */
#ifndef QE_KV_TIERED_H
#define QE_KV_TIERED_H

#include <stdio.h>

#include "kv_cache.h"
#include "kv_policy.h"
#include "kv_route.h"

typedef struct {
  size_t budget;     /* persistent byte budget of the sequence (all layers) */
  size_t bytes;      /* persistent bytes now */
  size_t peak_bytes; /* highest persistent bytes after any routing */
  size_t full_bytes, int2_bytes, meta_bytes, sink_bytes; /* bytes now, by kind */
  size_t peak_transient; /* highest bytes above the budget while a prefill layer was routed */
  size_t workspace;      /* attention gather workspace of the cache (transient, shared) */
  long windows[3];       /* windows per tier (FULL, INT2, EVICTED), summed over layers */
  long promotions, demotions, evictions, quantizations, routing_events;
} kv_mem_stats_t;

/* One routing event (for --trace): layer, the sequence length when it ran, per-tier counts,
 * transitions. */
typedef struct {
  int seq, layer, len;
  int n_cand, n_full, n_int2, n_evicted;
  int promoted, demoted, evicted;
  size_t bytes, budget;
} kv_route_event_t;

typedef void (*kv_trace_fn)(void *ud, const kv_route_event_t *ev);

/* Creates the cache. rope: the model's RoPE (re-applied to INT2 keys, inverted at
 * demotion). pool_bytes: the page arena. cfg is copied; check it with kv_policy_check. */
int kv_tiered_create(kern_backend_t *be, const kv_geom_t *geom, const kern_rope_t *rope,
                     const kv_policy_cfg_t *cfg, size_t pool_bytes, kv_cache_t **out);

/* How slots opened without an explicit budget get one: `bytes` when non-zero; otherwise
 * `fraction` of the FullKV bytes of the slot's capacity (2 x n_kv x head_dim floats per token
 * and layer, the policy-independent base of equal-bytes comparisons); a fraction >= 1 means
 * "hold everything at Full" (kv_tiered_fullkv_bytes). Default: fraction 1. */
void kv_tiered_set_budget_spec(kv_cache_t *kv, double fraction, size_t bytes);
/* Budget (bytes) the next seq_open of `seq` will use (overrides the spec; 0: the spec); seq_open
 * refuses it (QE_EINVAL) below the slot's protected regions for its capacity (kv_tiered_bounds)
 * and keeps it for the next try; an open that succeeds uses it up (later opens take the spec). */
int kv_tiered_set_budget(kv_cache_t *kv, int seq, size_t budget);
/* The smallest budget of a slot whose sink and local regions fit its capacity (sink + protected
 * local region, all layers); a shorter slot's regions, and its minimum, hold only its tokens. */
size_t kv_tiered_min_budget(const kv_cache_t *kv);
/* Bytes this cache needs to hold n tokens all at Full (all layers), metadata and the
 * protected-region reserve included: a budget of at least this never evicts or quantizes. A
 * sink or local region longer than n tokens counts only those tokens (the sink its first
 * min(sink, n), the local region the windows past it: then no window ages and this is every
 * token at Full, in windows past the sink). */
size_t kv_tiered_fullkv_bytes(const kv_cache_t *kv, long n_tokens);
/* Re-sizes the (empty) page pool for n_seqs sequences of up to `capacity` tokens under the
 * budget spec: their budgets, one layer of prompt at Full during prefill routing, and slack
 * for partly filled INT2 slots. QE_ENOSPC if the memory cannot be had. */
int kv_tiered_reserve(kv_cache_t *kv, int n_seqs, int capacity);
/* Re-sizes the (empty) page pool to `bytes` (QE_EINVAL while pages are in use). */
int kv_tiered_set_pool(kv_cache_t *kv, size_t bytes);
/* Two figures without a cache, for a cache of geometry geom and configuration cfg (fitted and
 * checked as kv_tiered_create does: QE_EINVAL naming the field): the smallest budget of a slot
 * of n_tokens (its protected regions, capped at its tokens) and the bytes that hold n_tokens all
 * at Full (kv_tiered_fullkv_bytes). Pure: the scheduler's admission uses it. */
int kv_tiered_bounds(const kv_geom_t *geom, const kv_policy_cfg_t *cfg, long n_tokens,
                     size_t *min_budget, size_t *fullkv);
/* Full page bytes of one window of one layer (pool sizing). */
size_t kv_tiered_page_bytes(const kv_cache_t *kv);
/* The pool bytes that hold `charged` bytes of budget however routing splits them between the
 * tiers: an INT2 ledger is charged its own bytes but takes 1/k of a Full page's slot (k ledgers
 * fit a page, at most 64), so where k ledgers do not fill a page (windows of 1 token: one
 * ledger a slot) the policy's INT2 share q costs more pool than budget: charged x max(1,
 * (1 - q) + q x page / (k x ledger)). */
size_t kv_tiered_pool_for(const kv_cache_t *kv, size_t charged);
/* Live stats of an open slot, or the final stats of the slot's last sequence once closed. */
void kv_tiered_stats(const kv_cache_t *kv, int seq, kv_mem_stats_t *out);
void kv_tiered_set_trace(kv_cache_t *kv, kv_trace_fn fn, void *ud);
/* Attention gathers every accessible token's rows into one buffer (dequantizing INT2 windows)
 * when `on`, instead of reading the windows in place, a KV head and a window at a time, as it
 * does on a host backend for post-RoPE keys. The results are the same bits either way; the
 * environment variable QE_TIERED_GATHER=1 sets it at creation (benchmarks: bench/cpu_tiered.sh). */
void kv_tiered_set_gather(kv_cache_t *kv, int on);

/* Test hooks: the tier of window w of (seq, layer), -1 if absent; the ledger bytes of that
 * window (NULL if never quantized) and their size. */
int kv_tiered_window_tier(const kv_cache_t *kv, int seq, int layer, int w);
const uint8_t *kv_tiered_window_ledger(const kv_cache_t *kv, int seq, int layer, int w,
                                       size_t *bytes);
int kv_tiered_n_windows(const kv_cache_t *kv, int seq, int layer);
/* Test hooks: overwrite a window's score; run one routing event of (seq, layer) now; the Full
 * page of a window (NULL unless Full) and its size. */
void kv_tiered_test_set_score(kv_cache_t *kv, int seq, int layer, int w, float score);
int kv_tiered_test_route(kv_cache_t *kv, int seq, int layer);
const float *kv_tiered_test_page(const kv_cache_t *kv, int seq, int layer, int w, size_t *bytes);
/* Checks every invariant of a sequence (bytes <= budget, accounting matches the window
 * tables, tiers valid); QE_ERANGE with a detail on the first violation. */
int kv_tiered_check(const kv_cache_t *kv, int seq);

#endif
