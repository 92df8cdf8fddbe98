/* snapkv: SnapKV: token selection at prefill from the observation window's attention,
 * max-pooled (kernel 7); scores stay frozen; Full only. */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_snapkv = {
    "snapkv",
    "prefill-time selection by observation window (pooled), Full only",
    0,
    {.omega = 1,
     .n_sink = 5,
     .n_local = 32,
     .q = 0.0f,
     .quant = {2, 32},
     .scorer = KV_SCORE_PREFILL,
     .n_obs = 32,
     .pool_kernel = 7,
     .route_decode = 1}};
