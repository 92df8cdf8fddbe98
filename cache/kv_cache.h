/* kv_cache: the interface between the forward pass and whatever holds K/V. The model calls
 * store() with a layer's new keys (post-RoPE) and values, then attend() for that layer's
 * queries; the cache decides where bytes live (FullKV here; the tiered QEvict cache behind the
 * same table). Sequences are slots [0, max_seqs) opened with a capacity in tokens.
 * Not thread-safe: one engine thread drives a cache. */
#ifndef QE_KV_CACHE_H
#define QE_KV_CACHE_H

#include <stddef.h>

#include "kern.h"

typedef struct kv_cache kv_cache_t;

/* What an observer (the diagnostics) sees: after each layer's attention (KV_OBS_STEP: the
 * attention mass each window received in this call, masses summed over the call's queries
 * and averaged over heads) and after each routing event (KV_OBS_ROUTE: the new tiers). Windows
 * are indexed in position order; the first n_aged are aged (routable). Arrays are valid only
 * during the call. Caches with tiers report them (kv_tiered; the GPU's tiered mode, kv_gpu.h). */
enum { KV_OBS_STEP = 0, KV_OBS_ROUTE = 1 };
typedef struct {
  int kind, seq, layer, len, n_q;
  int n_wins, n_aged;
  const float *mass; /* [n_wins] (KV_OBS_STEP) */
  float sink_mass;   /* mass on the sink tokens (KV_OBS_STEP) */
  const int *tier;   /* [n_wins] KV_TIER_* (kv_route.h) during the step / after the routing */
} kv_obs_t;
typedef void (*kv_obs_fn)(void *ud, const kv_obs_t *o);

/* One sequence's attention request at a layer: n_q queries at positions pos0.. */
typedef struct {
  int seq;
  int pos0;
  int n_q;
  const float *q; /* [n_q][n_head_local][head_dim] */
  float *out;     /* [n_q][n_head_local][head_dim] */
} kv_attn_req_t;

/* A fixed-shape decode step (kv_cache_ops_t.fixed_*): `bucket` rows, the first n (>= n_min) of
 * them active, one new token each; the launches read everything that changes from step to step
 * from dev, KV_FIXED_WORDS(stride) int32 words of backend memory at a fixed address that the
 * host fills (fixed_fill) and copies before each step: KV_FIXED_PARTS parts of
 * KV_FIXED_PART_WORDS(stride), one per cache taking part (a leaf cache uses the first; kv_mux
 * gives each child of a step one). */
#define KV_FIXED_PARTS              4
#define KV_FIXED_PART_WORDS(stride) (4 * (size_t)(stride) + 4)
#define KV_FIXED_WORDS(stride)      (KV_FIXED_PARTS * KV_FIXED_PART_WORDS(stride))
/* fixed_fill's seq[i] for a row that another cache serves (kv_mux): no store, no attention, and
 * its output rows left as they are. */
#define KV_FIXED_SKIP (-2)
typedef struct {
  const int32_t *dev; /* backend memory [KV_FIXED_WORDS(stride)] */
  int stride;         /* >= bucket */
  int bucket;
  int n_min; /* 1 .. bucket */
} kv_fixed_t;

typedef struct kv_cache_ops {
  const char *name;
  /* Opens slot `seq` for up to `capacity` tokens. QE_ENOSPC if the pool cannot hold it. */
  int (*seq_open)(kv_cache_t *kv, int seq, int capacity);
  /* Frees everything of slot `seq` (NULL-safe on a closed slot). */
  void (*seq_close)(kv_cache_t *kv, int seq);
  /* Stores n tokens' K and V ([n][n_kv_local][head_dim]) at positions pos0.. of seq. */
  int (*store)(kv_cache_t *kv, int seq, int layer, int pos0, int n, const float *k, const float *v);
  /* Attention for every request at `layer` (one backend call over all sequences). */
  int (*attend)(kv_cache_t *kv, int layer, const kv_attn_req_t *reqs, int n_reqs);
  /* Persistent bytes held by seq (all layers), for memory reports. */
  size_t (*seq_bytes)(const kv_cache_t *kv, int seq);
  void (*destroy)(kv_cache_t *kv);
  /* Optional (NULL: the cache has no observations): fn(ud, ...) sees every later observation
   * (fn NULL: none). Use kv_cache_set_observer. */
  int (*set_observer)(kv_cache_t *kv, kv_obs_fn fn, void *ud);
  /* Optional (NULL: the cache runs every step as it comes): fixed-shape decode steps, whose
   * backend launches are the same at every step of a bucket (recorded once, replayed: CUDA
   * graphs). fixed_fill writes host `in` [KV_FIXED_WORDS(f->stride)] for the step of n rows:
   * slot seq[i] (open, distinct, or KV_FIXED_SKIP) gets its token at pos[i]; the cache takes the
   * new lengths as store() would. QE_EINVAL for a bad row; QE_ERANGE when the step does not fit f's
   * launches (then run it with store / attend outside fixed mode). */
  int (*fixed_fill)(kv_cache_t *kv, const kv_fixed_t *f, int32_t *in, const int32_t *seq,
                    const int32_t *pos, int n);
  /* Enters fixed mode for f (copied; NULL leaves it). Meanwhile store() keeps only the first
   * call's k / v (row 0 of the step's rows, consecutive) and attend(layer, reqs, n) launches the
   * layer's work for all f->bucket rows, q and out rows 0.. at reqs[0]; nothing waits for the
   * device or copies from the host. Sizes the workspace first (may allocate). */
  int (*fixed_mode)(kv_cache_t *kv, const kv_fixed_t *f);
  /* After a fixed step has been queued: the work its launches leave out (the tiered cache's
   * routing when a window aged), for the rows of its fixed_fill. */
  int (*fixed_done)(kv_cache_t *kv, const int32_t *seq, int n);
  /* Changes whenever a buffer that fixed-mode launches read moved (launches recorded before
   * are stale). */
  unsigned long (*fixed_epoch)(const kv_cache_t *kv);
  /* Optional (NULL: no limit): the most prompt tokens one forward pass may store, summed over
   * its sequences, before the cache routes them (a pool sized for budgets holds one layer of a
   * step's prompts at full precision at a time). Use kv_cache_prompt_room. */
  int (*prompt_room)(const kv_cache_t *kv);
} kv_cache_ops_t;

/* Geometry shared by every implementation. */
typedef struct {
  int n_layer;
  int n_head;    /* local query heads */
  int n_kv_head; /* local KV heads */
  int head_dim;
  int max_seqs;
} kv_geom_t;

struct kv_cache {
  const kv_cache_ops_t *ops;
  kv_geom_t geom;
  kern_backend_t *be;
};

/* FullKV: every token's K and V at full precision (fp32 on cpu), one contiguous buffer per
 * sequence and layer sized at seq_open. *out owned by caller: kv_cache_destroy(). */
int kv_full_create(kern_backend_t *be, const kv_geom_t *geom, kv_cache_t **out);

void kv_cache_destroy(kv_cache_t *kv); /* NULL-safe */

/* Sets (fn non-NULL) or clears (fn NULL) the observer of any cache: 0; QE_EUNSUPPORTED naming
 * the cache when it has no observations (kv_full, kv_mux, the GPU's FullKV mode); clearing one
 * is a no-op (0); QE_ENOMEM when the cache cannot hold the observer's state. The observer runs
 * on the thread that drives the cache, inside attend(). */
int kv_cache_set_observer(kv_cache_t *kv, kv_obs_fn fn, void *ud);

/* The most prompt tokens a forward pass over kv may carry (kv_cache_ops_t.prompt_room), or 0:
 * no limit. */
int kv_cache_prompt_room(const kv_cache_t *kv);

#endif
