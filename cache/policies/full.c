/* full: no cache policy at all (FullKV): every token at full precision. */
#include "kv_policies_internal.h"

const kv_policy_desc_t kv_policy_full = {"full", "FullKV, no eviction", 1, {.omega = 1}};
