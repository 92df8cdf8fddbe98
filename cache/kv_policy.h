/* kv_policy: what a KV cache policy is: a configuration of the one tiered cache (window size,
 * tiers, scorer, when it routes) plus a name. Every policy is compared at equal persistent
 * bytes. A new policy is one file under cache/policies/ defining a kv_policy_desc_t, plus one
 * line in the registry (kv_policies.c). Descriptors are immutable: thread-safe. */
#ifndef QE_KV_POLICY_H
#define QE_KV_POLICY_H

#include "graphkv.h"
#include "kv_quant.h"

typedef enum {
  KV_SCORE_CUMULATIVE = 0, /* S(w) += per-step attention mass (QEvict, H2O) */
  KV_SCORE_DECAYED = 1,    /* S(w) = decay * S(w) + mass */
  KV_SCORE_PNORM = 2,      /* S(w) = (sum of mass^p)^(1/p) over steps */
  KV_SCORE_KNORM = 3,      /* static: minus the mean pre-RoPE key L2 norm (low norm kept) */
  KV_SCORE_RECENCY = 4,    /* static: the window's start position (newest kept) */
  KV_SCORE_PREFILL = 5     /* frozen at prefill from the observation window (SnapKV) */
} kv_scorer_t;

/* The parameters a request may set (CLI: --window --bits --q --sink --local --graphkv). */
typedef struct {
  int omega;          /* window tokens (1 = token-level) */
  int n_sink;         /* first tokens always Full */
  int n_local;        /* most recent tokens always Full */
  float q;            /* fraction of the history budget for INT2 (0: no INT2, 1: no Full tier) */
  kv_qparams_t quant; /* bits (2, 4, 8) and value group */
  int scorer;         /* kv_scorer_t */
  float decay;        /* KV_SCORE_DECAYED */
  float pnorm;        /* KV_SCORE_PNORM exponent */
  int n_obs;          /* observation-window queries for prefill scores */
  int pool_kernel;    /* max-pool width over prefill scores (SnapKV: 7; 1 = none) */
  int promote;        /* INT2 windows may return to Full */
  int pyramid;        /* layer-wise budgets decreasing with depth (PyramidKV) */
  int graphkv;        /* re-score candidates with GraphKV before routing */
  graphkv_params_t gkv;
} kv_policy_cfg_t;

typedef struct {
  const char *name;
  const char *summary;
  int full;            /* no cache policy at all: FullKV */
  kv_policy_cfg_t cfg; /* defaults of this policy */
} kv_policy_desc_t;

/* The registered policy called name (e.g. "qevict", "h2o+graphkv" = h2o with graphkv set),
 * copied into *out; QE_EINVAL naming the unknown policy otherwise. */
int kv_policy_find(const char *name, kv_policy_desc_t *out);
/* NULL-terminated list of registered policies. */
const kv_policy_desc_t *const *kv_policy_list(void);
/* The configuration adapted to a model: a value group that does not divide head_dim (the
 * default 32 on a model with 8-wide heads) becomes their greatest common divisor. */
kv_policy_cfg_t kv_policy_fit(const kv_policy_cfg_t *cfg, int head_dim);
/* PyramidKV's share of `spare` (the budget above every layer's floor) for layer l of L: weights
 * decreasing linearly with depth from 1.5 to 0.5, normalized over the layers, rounded down. Both
 * tiered caches (CPU and GPU) size their layers with it. */
size_t kv_pyramid_share(size_t spare, int l, int L);
/* The same with no layer's share above cap (the bytes its history takes at Full, all it can
 * use): the capped layers' excess goes to the others by their weights (water-filling), so a
 * budget that holds every layer's history holds it in every layer (kv_tiered; the shares of
 * an uncapped split are kv_pyramid_share's to the byte). */
size_t kv_pyramid_share_capped(size_t spare, size_t cap, int l, int L);
/* B_hist of layer l of L under a slot budget of `budget` bytes whose every layer holds `floor`
 * bytes of protected regions: the budget split evenly over the layers less the floor, or with
 * pyramid PyramidKV's share of what exceeds the layers' floors, none above cap (the bytes the
 * slot's history takes at Full: kv_pyramid_share_capped). 0 where the floor takes it all. Both
 * tiered caches (CPU and GPU) size their layers with it. */
size_t kv_layer_hist(size_t budget, size_t floor, size_t cap, int pyramid, int l, int L);
/* The regions of a slot of n tokens (n >= 0) laid out as a sink of n_sink tokens then windows of
 * omega tokens (the GPU cache's sink is rounded up to whole windows first), in the rule both
 * tiered caches size their bounds with: the sink holds its first min(n_sink, n) tokens; `wins`
 * windows lie past it; `prot` of them are protected (the local region's windows and one in
 * flight; every one when their tokens fit the local region, so that none can age); `hist` is
 * every window past the sink when some can age (what routing may hold at Full), else 0. */
typedef struct {
  long sink, wins, prot, hist;
} kv_slot_regions_t;
kv_slot_regions_t kv_slot_regions(long n, long n_sink, long n_local, long omega);
/* Checks a configuration: QE_EINVAL with a detail naming the field (window, bits, q, sink,
 * local, group, graphkv...). */
int kv_policy_check(const kv_policy_cfg_t *cfg, int head_dim);

#endif
