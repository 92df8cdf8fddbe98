/* kv_policies_internal: the registered policy descriptors (one file each in policies/). */
#ifndef QE_KV_POLICIES_INTERNAL_H
#define QE_KV_POLICIES_INTERNAL_H

#include "kv_policy.h"

extern const kv_policy_desc_t kv_policy_full, kv_policy_streaming, kv_policy_snapkv,
    kv_policy_pyramidkv, kv_policy_knorm, kv_policy_h2o, kv_policy_kivi, kv_policy_qevict;

/* SnapKV's configuration, shared by snapkv and pyramidkv (which adds layer-wise budgets). */
#define KV_SNAPKV_CFG                                                                              \
  .omega = 1, .n_sink = 5, .n_local = 32, .q = 0.0f, .quant = {2, 32}, .scorer = KV_SCORE_PREFILL, \
  .n_obs = 32, .pool_kernel = 7

#endif
