/* qevict: QEvict (seed 000): windows of 8 tokens, cumulative attention scores, 30% of the
 * history budget Full and 70% INT2 (keys post-RoPE: kv_quant.h, KV_KEY_FRAME_ABS), promotions,
 * routing every window of decode. */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_qevict = {
    "qevict",
    "three tiers: Full, INT2 (attended, promotable), Evicted",
    0,
    {.omega = 8,
     .n_sink = 5,
     .n_local = 32,
     .q = 0.7f,
     .quant = {2, 32, KV_KEY_FRAME_ABS},
     .scorer = KV_SCORE_CUMULATIVE,
     .n_obs = 32,
     .pool_kernel = 1,
     .promote = 1}};
