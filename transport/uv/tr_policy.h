/* tr_policy: the KV policy of a request as the scheduler<->worker frames carry it
 * (qevict.worker.v1.Policy: a name and optional overrides), resolved into the cache's
 * configuration. Both ends resolve the same message with the same code: the scheduler to
 * check the request and size its budget, the worker to build its cache. Pure, thread-safe. */
#ifndef QE_TR_POLICY_H
#define QE_TR_POLICY_H

#include "kv_policy.h"
#include "worker.pb-c.h"

typedef Qevict__Worker__V1__Policy tr_policy_t;

/* Resolves p (NULL or an empty name: "full") for a model with head_dim into *out: the
 * registered policy, "+graphkv" when p->graphkv, then the overrides, fitted and checked.
 * QE_EINVAL with a detail naming the field ("policy.name: unknown policy 'x'", "policy.q:
 * ..."). */
int tr_policy_resolve(const tr_policy_t *p, int head_dim, kv_policy_desc_t *out);

#endif
