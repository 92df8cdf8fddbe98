/* sched_admit: admission accounting of qevict-sched, pure C with no I/O. Each request reserves
 * its whole KV budget (bytes) against its tenant's quota and against one global pool. A request
 * that fits both at once runs; one that could never fit (more than its tenant's quota or the
 * whole pool) is refused with QE_ERANGE (gRPC RESOURCE_EXHAUSTED); any other waits in its
 * tenant's FIFO queue. When bytes come free, waiting requests are admitted round-robin across
 * tenants: a request at the head of one tenant's queue that does not fit yet never blocks the
 * other tenants, except that a head passed over max_bypass times while it fit its own quota
 * (waiting only for the pool) is then served first, the oldest such head first: the pool admits
 * nothing else until it fits. So while it could run, a request is passed by at most max_bypass
 * requests that arrived after it, and none starves while running requests keep finishing.
 * Invariants: a tenant's reserved bytes never exceed its quota (a lowered quota applies to new
 * admissions: requests already running keep their bytes, or what sched_admit_refit_tenant's
 * caller leaves them) and the reserved sum never exceeds the pool. Not thread-safe: one
 * sched_admit is driven by one thread (the scheduler's loop). */
#ifndef QE_SCHED_ADMIT_H
#define QE_SCHED_ADMIT_H

#include <stddef.h>
#include <stdint.h>

#define SCHED_ADMIT_TENANT_MAX     64 /* tenant id length */
#define SCHED_ADMIT_DEFAULT_BYPASS 16 /* default max_bypass */

typedef struct sched_admit sched_admit_t;

/* A queued request left the queue: status 0 = admitted (its bytes are now reserved; release it
 * when it ends), QE_ERANGE = refused because a lowered quota or pool means it can never fit,
 * QE_ENOTFOUND = its tenant was removed; or a queued or reserved one was refused by
 * sched_admit_refit_tenant's fit (its status). Refused requests are forgotten. Events are
 * delivered in order, after the accounting is consistent, from inside the call that caused them
 * (release, set_tenant, ...); the callback may call any sched_admit function except destroy (the
 * events that raises are delivered after the current one). */
typedef void (*sched_admit_cb)(void *user, uint64_t request_id, int status);

enum { SCHED_ADMIT_NONE = 0, SCHED_ADMIT_QUEUED = 1, SCHED_ADMIT_RUNNING = 2 };

typedef struct {
  int64_t quota_bytes, reserved_bytes, queued_bytes;
  size_t n_running, n_queued;
} sched_admit_tenant_stats_t;

typedef struct {
  int64_t pool_bytes, reserved_bytes, queued_bytes;
  size_t n_running, n_queued, n_tenants;
} sched_admit_stats_t;

/* A new accountant over a pool of pool_bytes (>= 0); cb (may be NULL) gets the queue events.
 * *out is owned by the caller (sched_admit_destroy). */
int sched_admit_create(int64_t pool_bytes, sched_admit_cb cb, void *user, sched_admit_t **out);
/* Frees everything, delivering no events; NULL is allowed. */
void sched_admit_destroy(sched_admit_t *a);

/* Changes the pool (workers joined or left). Queued requests larger than the new pool are
 * refused (QE_ERANGE events); if it grew, waiting requests may be admitted. */
int sched_admit_set_pool(sched_admit_t *a, int64_t pool_bytes);
/* How many times a waiting head may be passed over before it is served first (>= 1). */
int sched_admit_set_max_bypass(sched_admit_t *a, unsigned max_bypass);

/* Adds a tenant (id: 1..64 bytes) or changes its quota (> 0). A lower quota refuses queued
 * requests that exceed it (QE_ERANGE events); a higher one may admit waiting requests. A tenant
 * set again after sched_admit_remove_tenant is a new one, whatever the removed one still holds. */
int sched_admit_set_tenant(sched_admit_t *a, const char *tenant, int64_t quota_bytes);
/* The bytes of a tenant's request (queued, or reserved) under its tenant's new limits, for
 * sched_admit_refit_tenant: > 0 (at most bytes for a reserved one), or a negative QE_E* code
 * that refuses it. It may not call sched_admit functions. */
typedef int64_t (*sched_admit_fit_cb)(void *user, uint64_t request_id, int64_t bytes);
/* sched_admit_set_tenant that, first, asks fit (NULL: none) for the new bytes of each of the
 * tenant's requests: a queued one takes them and keeps its place in the queue, a reserved one
 * gives back the bytes it no longer needs, and a refused one, queued or reserved, leaves (its
 * bytes come free) with an event of fit's status. Then the queued requests that exceed the new
 * quota are refused as in sched_admit_set_tenant, and waiting ones may be admitted: all in one
 * step, so nothing is admitted under the old quota with the new bytes or the reverse. */
int sched_admit_refit_tenant(sched_admit_t *a, const char *tenant, int64_t quota_bytes,
                             sched_admit_fit_cb fit, void *user);
/* Removes a tenant: its queued requests are refused (QE_ENOTFOUND events), new reservations
 * get QE_ENOTFOUND, and its running requests keep their bytes of the pool until released. Its
 * id is free at once: a tenant set again under it starts with nothing reserved, running or
 * queued, and the removed one's requests never count against its quota or in its stats. */
int sched_admit_remove_tenant(sched_admit_t *a, const char *tenant);

/* Reserves bytes (> 0) for request id (unique among reserved and queued requests) of tenant.
 * 0: *state (optional) is SCHED_ADMIT_RUNNING (reserved now) or SCHED_ADMIT_QUEUED (an event
 * comes later). QE_ERANGE: it can never fit (bytes above the quota or the pool); QE_EINVAL: bad
 * bytes or a duplicate id; QE_ENOTFOUND: unknown tenant. */
int sched_admit_reserve(sched_admit_t *a, uint64_t id, const char *tenant, int64_t bytes,
                        int *state);
/* Ends request id, running (its bytes come free and waiting requests may be admitted, with
 * events) or queued (a cancel: it leaves the queue). QE_ENOTFOUND if it is neither. */
int sched_admit_release(sched_admit_t *a, uint64_t id);

/* SCHED_ADMIT_NONE, _QUEUED or _RUNNING. */
int sched_admit_state(const sched_admit_t *a, uint64_t id);
/* QE_ENOTFOUND for a tenant that is unknown or removed. */
int sched_admit_tenant_stats(const sched_admit_t *a, const char *tenant,
                             sched_admit_tenant_stats_t *out);
void sched_admit_stats(const sched_admit_t *a, sched_admit_stats_t *out);

#endif
