/* h2o: Heavy-Hitter Oracle: token-level, cumulative attention, Full only, decode-time
 * eviction of the lowest-scored tokens. */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_h2o = {"h2o",
                                        "token-level cumulative attention, Full only",
                                        0,
                                        {.omega = 1,
                                         .n_sink = 5,
                                         .n_local = 32,
                                         .q = 0.0f,
                                         .quant = {2, 32},
                                         .scorer = KV_SCORE_CUMULATIVE,
                                         .n_obs = 32,
                                         .pool_kernel = 1}};
