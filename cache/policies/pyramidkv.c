/* pyramidkv: PyramidKV: SnapKV selection with layer-wise budgets decreasing with depth. */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_pyramidkv = {"pyramidkv",
                                              "snapkv with layer-wise (pyramid) budgets",
                                              0,
                                              {.omega = 1,
                                               .n_sink = 5,
                                               .n_local = 32,
                                               .q = 0.0f,
                                               .quant = {2, 32},
                                               .scorer = KV_SCORE_PREFILL,
                                               .n_obs = 32,
                                               .pool_kernel = 7,
                                               .route_decode = 1,
                                               .pyramid = 1}};
