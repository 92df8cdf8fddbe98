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

#endif
