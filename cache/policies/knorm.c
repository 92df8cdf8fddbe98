/* knorm: keep the tokens whose keys have the lowest L2 norm (no attention needed). */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_knorm = {"knorm",
                                          "token-level, lowest key norm kept, Full only",
                                          0,
                                          {.omega = 1,
                                           .n_sink = 5,
                                           .n_local = 32,
                                           .q = 0.0f,
                                           .quant = {2, 32},
                                           .scorer = KV_SCORE_KNORM,
                                           .n_obs = 32,
                                           .pool_kernel = 1}};
