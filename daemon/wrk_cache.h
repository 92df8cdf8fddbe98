/* wrk_cache: a worker rank's KV cache: one kv_mux whose children are a FullKV cache and one
 * tiered cache per distinct policy configuration in use (created on first use, dropped when
 * idle and too many), so that every request runs its own policy and budget. The open hook of
 * the step engine binds a slot to a free slot of the right child and sets its budget (this
 * rank's share of the request's). Not thread-safe: the engine thread owns it.
 *
 * On a GPU backend (host_memory == 0) the children live on the device: FullKV in bf16 pages
 * (kv_gpu_create) where the paged decode kernel takes the geometry (head_dim 64 or 128, at most
 * 8 query heads per KV head), else kv_full in device buffers; a tiered policy in kv_gpu's tiered
 * mode (scorer cumulative or recency, no graphkv or pyramid budgets, windows of 4, 8 or a multiple
 * of 16 tokens, the kv_gpu geometry), any other is refused at open with QE_EUNSUPPORTED naming
 * the field. Each child's device arena is sized for every byte this rank can reserve; when the
 * device cannot hold a new child, idle ones are dropped first. */
#ifndef QE_WRK_CACHE_H
#define QE_WRK_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_tiered.h"
#include "model.h"

/* What travels with an open to every rank (gen_req_t.open_arg): plain data. */
typedef struct {
  uint64_t request_id;
  uint64_t budget; /* whole request, all ranks */
  int full;        /* FullKV: no policy */
  kv_policy_cfg_t cfg;
  char policy[64];
} wrk_open_arg_t;

typedef struct wrk_cache wrk_cache_t;

/* A cache of max_seqs slots over m's geometry; pool_bytes is this rank's reservable KV. */
int wrk_cache_create(model_t *m, int max_seqs, size_t pool_bytes, wrk_cache_t **out);
void wrk_cache_destroy(wrk_cache_t *c);
kv_cache_t *wrk_cache_kv(wrk_cache_t *c);
/* The engine's open hook (ud = the wrk_cache_t). */
int wrk_cache_open(void *ud, kv_cache_t *kv, int slot, int capacity, const void *arg, size_t len);
/* 1 when an open of a's configuration can find its cache child now: the configuration's child
 * exists, or an entry is free, or an idle child can be dropped for it; 0 while every one of the
 * WC_MAX_CHILDREN (16) children serves open slots of other configurations (the worker holds
 * such a start until one ends). */
int wrk_cache_can_open(const wrk_cache_t *c, const wrk_open_arg_t *a);
/* Memory of slot (live while open, final once closed, until the slot is opened again). */
void wrk_cache_stats(const wrk_cache_t *c, int slot, kv_mem_stats_t *out);
/* Records the bytes of an open FullKV slot (its final figure once closed); call after each
 * token. */
void wrk_cache_touch(wrk_cache_t *c, int slot);
/* The request bound to slot by the last open. */
uint64_t wrk_cache_request(const wrk_cache_t *c, int slot);
/* 1 when a's cache must see its whole prompt in one forward pass (the GPU tiered cache routes a
 * prompt once, after its last layer: a later multi-token chunk is refused), else 0. */
int wrk_cache_whole_prompt(const wrk_cache_t *c, const wrk_open_arg_t *a);
/* FullKV bytes of one token on this rank, as its FullKV child stores them: bf16 pages on the
 * GPU (kv_gpu), fp32 otherwise. Pure: reads the geometry only. */
uint64_t wrk_cache_full_bytes_per_token(const wrk_cache_t *c);
/* Tokens of the pages a FullKV slot takes whole on this rank: KV_GPU_OMEGA (16) in kv_gpu's bf16
 * pages, else 1 (token by token). Pure. */
uint32_t wrk_cache_full_page_tokens(const wrk_cache_t *c);
/* Sets the pool (see wrk_cache_create) before the first open. */
void wrk_cache_set_pool(wrk_cache_t *c, size_t pool_bytes);
/* Device bytes of the FullKV child's arena on a GPU rank (kv_gpu: the pool plus each slot's partly
 * filled window in every layer), which every policy configuration's arena is at least; 0 where
 * the children live in host memory or kv_gpu does not take the geometry. Pure. */
size_t wrk_cache_gpu_arena_bytes(const wrk_cache_t *c);

#endif
