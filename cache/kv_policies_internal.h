/* kv_policies_internal: the registered policy descriptors (one file each in policies/). */
#ifndef QE_KV_POLICIES_INTERNAL_H
#define QE_KV_POLICIES_INTERNAL_H

#include "kv_policy.h"

extern const kv_policy_desc_t kv_policy_full, kv_policy_streaming, kv_policy_snapkv,
    kv_policy_pyramidkv, kv_policy_knorm, kv_policy_h2o, kv_policy_kivi, kv_policy_qevict;

#endif
