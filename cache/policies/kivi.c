/* kivi: KIVI: everything outside the recent region in INT2 (keys per channel, values per
 * token); at a budget below that, the oldest windows are evicted. */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_kivi = {"kivi",
                                         "all history INT2, recent region Full",
                                         0,
                                         {.omega = 32,
                                          .n_sink = 0,
                                          .n_local = 32,
                                          .q = 1.0f,
                                          .quant = {2, 32, KV_KEY_FRAME_ABS},
                                          .scorer = KV_SCORE_RECENCY,
                                          .n_obs = 32,
                                          .pool_kernel = 1}};
