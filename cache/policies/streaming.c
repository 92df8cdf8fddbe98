/* streaming: StreamingLLM: the attention sink plus the most recent tokens. */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_streaming = {"streaming",
                                              "sink + recent tokens",
                                              0,
                                              {.omega = 1,
                                               .n_sink = 5,
                                               .n_local = 32,
                                               .q = 0.0f,
                                               .quant = {2, 32},
                                               .scorer = KV_SCORE_RECENCY,
                                               .n_obs = 32,
                                               .pool_kernel = 1}};
