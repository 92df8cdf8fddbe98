/* sched_validate: checks a GenerateRequest and resolves it into a request (sched_validate.c). */
#ifndef QE_SCHED_VALIDATE_H
#define QE_SCHED_VALIDATE_H

#include "sched_internal.h"

/* How a refusal maps onto gRPC. */
enum { SVAL_INVALID = 1, SVAL_EXHAUSTED = 2, SVAL_UNAUTHENTICATED = 3, SVAL_INTERNAL = 4 };

typedef struct {
  int status;    /* SVAL_* */
  char msg[400]; /* names the field: "max_tokens: must be > 0" */
} sval_err_t;

/* Fills r's prompt, lengths, sampling, stop strings, client id, policy and budget from g under
 * tenant's limits. 0, or -1 with *e set (r may hold partial allocations: free it as usual). */
int sval_request(sched_t *s, const char *tenant, const Qevict__V1__GenerateRequest *g, sreq_t *r,
                 sval_err_t *e);

/* The budget of r (resolved by sval_request: its r->ask*) under tenant t's limits into *budget:
 * clamped to the per-request limit (max_request_budget_bytes, else the quota); refused when
 * named bytes exceed the quota, a FullKV request exceeds the limit (SVAL_EXHAUSTED) or the
 * clamped budget is below the policy's minimum (SVAL_INVALID). 0, or -1 with *e set. The one
 * rule for a request sent (sval_request) and for one waiting when its tenant's limits change
 * (sched_req_refit). */
int sval_clamp_budget(const sreq_t *r, const sched_tenant_t *t, int64_t *budget, sval_err_t *e);

#endif
