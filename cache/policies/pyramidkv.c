/* pyramidkv: PyramidKV: SnapKV selection with layer-wise budgets decreasing with depth. */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_pyramidkv = {
    "pyramidkv", "snapkv with layer-wise (pyramid) budgets", 0, {KV_SNAPKV_CFG, .pyramid = 1}};
