/* snapkv: SnapKV: token selection at prefill from the observation window's attention,
 * max-pooled (kernel 7); scores stay frozen; Full only. */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_snapkv = {
    "snapkv",
    "prefill-time selection by observation window (pooled), Full only",
    0,
    {KV_SNAPKV_CFG}};
