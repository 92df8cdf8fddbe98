/* kv_gpu: FullKV on the GPU in bf16 pages (kernels/kern_paged.h): every token's K and V, in
 * windows of omega tokens, decoded by the fused paged kernel (kern_cuda_attn.h) and prefilled
 * through the backend's attention over the gathered pages. Pages come from one device arena;
 * a slot's pages are taken at seq_open for its whole capacity (QE_ENOSPC when the arena cannot
 * hold them) and their descriptors written then, so a decode step uploads only its per-token
 * slots and positions. Needs the CUDA backend (kern_cuda.h); built in CUDA builds only
 * (users get QE_HAVE_KV_GPU). Not thread-safe: one engine thread drives a cache. */
#ifndef QE_KV_GPU_H
#define QE_KV_GPU_H

#include <stddef.h>

#include "kv_cache.h"
#include "kv_policy.h"

/* Default tokens per page. */
#define KV_GPU_OMEGA 16

/* Bytes of one window's K and V pages (one layer). */
size_t kv_gpu_page_bytes(const kv_geom_t *geom, int omega);

/* 1 when the GPU cache takes windows of omega tokens: 4, 8 or a multiple of 16 up to 1024 (the
 * decode kernel's tiles; windows of 4 only with post-RoPE quantized keys, kv_gpu_policy_check). */
int kv_gpu_omega_ok(int omega);
/* Arena bytes that hold n_seqs slots of `capacity` tokens (all layers). */
size_t kv_gpu_pool_bytes(const kv_geom_t *geom, int omega, int n_seqs, int capacity);

/* Creates the cache on be (a CUDA backend: QE_EINVAL otherwise) with an arena of pool_bytes and
 * slots of up to max_tokens tokens. omega: 4, 8 or a multiple of 16 (kern_paged.h); head_dim 64 or
 * 128 and n_head / n_kv_head <= 8 (the decode kernel's limits: QE_EUNSUPPORTED naming them).
 * *out owned by caller: kv_cache_destroy(). */
int kv_gpu_create(kern_backend_t *be, const kv_geom_t *geom, int omega, int max_tokens,
                  size_t pool_bytes, kv_cache_t **out);

/* The tiered mode (QEvict routing on the device; kern_cuda_route.h): windows of cfg->omega tokens
 * (4, 8 or a multiple of 16) in FULL bf16 pages or INT2/4/8 ledgers, routed with cfg's q, sink,
 * local region, bits, group and promotion after each prefilled layer and whenever a window ages.
 * The sink is rounded up to whole windows. Budgets are persistent bytes per slot (all layers,
 * split evenly over them, or by kv_pyramid_share with cfg->pyramid): FULL pages with kept
 * ledgers, ledgers, and a fixed bookkeeping charge per live window, as kv_tiered charges them.
 * Scores: cumulative attention (the decode kernel adds each step's window masses), recency, or
 * the prefill's observation-window masses, max-pooled over cfg->pool_kernel windows and frozen
 * (SnapKV; the pooling applies to any scorer's prefill masses, as in kv_tiered). GraphKV
 * re-scoring (cfg->graphkv) runs on the device before each decision, as kv_tiered does it
 * (kern_cuda_route.h's kc_route_gkv_t). Limits: scorer cumulative, recency or prefill, graphkv
 * with a cumulative scorer and at most KV_GPU_GRAPHKV_MAX_M neighbours (QE_EUNSUPPORTED
 * otherwise); a prompt arrives in one piece (a multi-token attention of a slot that already holds
 * tokens is QE_EUNSUPPORTED).
 * The arena holds n_seqs slots of max_tokens under the budget spec (fraction of
 * kv_gpu_fullkv_bytes, or bytes when non-zero): their steady FULL and ledger shares plus one layer
 * of prompt at FULL each. A pool that runs dry on the device does not fail a call: the affected
 * window is evicted (a demotion, a new window) or stays INT2 (a promotion), and kv_gpu_stats
 * reports it in err_flags. */
int kv_gpu_create_tiered(kern_backend_t *be, const kv_geom_t *geom, const kern_rope_t *rope,
                         const kv_policy_cfg_t *cfg, int max_tokens, int n_seqs, double fraction,
                         size_t bytes, kv_cache_t **out);
/* 1 for a cache made by kv_gpu_create_tiered; kv_gpu_is: by either kv_gpu_create. */
int kv_gpu_is_tiered(const kv_cache_t *kv);
int kv_gpu_is(const kv_cache_t *kv);
/* Budget spec of later seq_opens (as kv_tiered_set_budget_spec), and one slot's next budget. */
void kv_gpu_set_budget_spec(kv_cache_t *kv, double fraction, size_t bytes);
int kv_gpu_set_budget(kv_cache_t *kv, int seq, size_t budget);
/* Bookkeeping bytes a tiered GPU slot is charged per live window (descriptor, score, page and
 * ledger ids, plan), as kv_tiered charges its window metadata. */
#define KV_GPU_WIN_META 77
/* Neighbours per GraphKV source the GPU cache takes (kern_cuda_graphkv.h's KC_GRAPHKV_MAX_M). */
#define KV_GPU_GRAPHKV_MAX_M 32

/* The tiered GPU cache's sizes for geometry g and policy cfg, without a cache (pure; the
 * scheduler and the worker size budgets with it): *floor, the bytes per layer every slot holds
 * whatever its budget (the sink rounded up to whole windows, the protected local windows and
 * one in flight, each a FULL page plus KV_GPU_WIN_META); *min_budget, that over all layers;
 * *fullkv, the bytes that hold n_tokens all at FULL: the floor plus every window past the sink,
 * per layer (kv_tiered's rule: kv_slot_regions, with the sink in whole windows). n_tokens > 0: a
 * slot of that many tokens, whose regions hold only its windows (a sink or local region longer
 * than the request reserves the request's windows, each once: its floor and FullKV bytes are
 * then its windows at FULL); 0: a slot of any length. Any output may be NULL. 0, or
 * QE_EUNSUPPORTED for a window the GPU kernels do not take. */
int kv_gpu_bounds(const kv_geom_t *g, const kv_policy_cfg_t *cfg, long n_tokens, size_t *floor,
                  size_t *min_budget, size_t *fullkv);

/* Whether the tiered GPU cache runs policy c (called `name` in messages) on a rank of head_dim
 * with n_head / n_kv heads (head_dim 0: the geometry is not checked): 0, or QE_EUNSUPPORTED with
 * a detail that starts with the request field to change: policy.name (geometry), policy.graphkv,
 * policy.scorer (policy.name when !scorer_named: the scorer came with the policy), policy.window.
 * Pure; the scheduler, the workers and kv_gpu_create_tiered share it. */
int kv_gpu_policy_check(const kv_policy_cfg_t *c, const char *name, int scorer_named, int head_dim,
                        int n_head, int n_kv);

/* The smallest budget (sink and protected local windows, all layers); bytes holding n_tokens
 * all at FULL (with bookkeeping) in a tiered cache, or FullKV page bytes otherwise. */
size_t kv_gpu_min_budget(const kv_cache_t *kv);
size_t kv_gpu_fullkv_bytes(const kv_cache_t *kv, long n_tokens);

/* A tiered slot's accounting as of its last routing (read from the device: synchronizes). */
typedef struct {
  size_t budget, bytes;
  long windows[3]; /* FULL, INT2, EVICTED, summed over layers */
  long promotions, demotions, evictions, quantizations, routings;
  int err_flags; /* pools ran dry: 1 pages, 2 ledgers; 4 too many windows; 8 job lists full */
} kv_gpu_stats_t;
int kv_gpu_stats(kv_cache_t *kv, int seq, kv_gpu_stats_t *out);
/* GPU milliseconds spent in the routing passes (allocation, decision, migrations) since the
 * cache was made, and how many passes: [0] after prefilled layers, [1] during decode (one pass
 * per step in which a window aged, all layers). Waits for the device. QE_EINVAL for FullKV. */
int kv_gpu_routing_time(kv_cache_t *kv, double ms[2], long calls[2]);

/* The device KV pool of one cache (one GPU worker's), in allocation units of unit_bytes:
 * units_total in the arena (arena_bytes), units_in_use now, units_peak the most in use at once
 * since the cache was made. FullKV: a unit is one window's K and V page of one layer; a slot holds
 * its pages from seq_open to seq_close (tracked on the host). Tiered: a unit is a FULL page or a
 * slab of ledgers; in use now are FULL pages and slabs with a ledger slot in use (a slab whose
 * slots are all free counts as free); the peak is the low-water mark of the device's free unit
 * stack, where a slab counts until coalesced back (so it may exceed the in-use count ever seen).
 * Tiered reads the device (synchronizes). 0, or QE_EINVAL when kv is not a GPU cache; *out
 * zeroed on error. */
typedef struct {
  size_t unit_bytes;
  long units_total, units_in_use, units_peak;
  size_t arena_bytes;
} kv_gpu_pool_t;
int kv_gpu_pool_usage(kv_cache_t *kv, kv_gpu_pool_t *out); /* synchronizes for the tiered cache */

#endif
