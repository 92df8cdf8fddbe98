/* sched_admin: the qevict.v1.Admin service (tenants, requests, drain), called after the admin
 * key was checked. Tenants live in SQLite (sched_tenants) and in admission (sched_admit). */
#include <ctype.h>
#include <errno.h>
#include <grpc/status.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "sched_internal.h"

enum { A_SET, A_GET, A_LIST, A_DELETE, A_REQUESTS, A_DRAIN };

#define UNPACK(type, fn)                                                                           \
  char nul_[128];                                                                                  \
  if (sched_pb_nul_string(&fn##__descriptor, msg, n, nul_, sizeof nul_)) {                         \
    sched_rpc_error(call, GRPC_STATUS_INVALID_ARGUMENT, "%s: holds a NUL byte", nul_);             \
    return;                                                                                        \
  }                                                                                                \
  type *q = fn##__unpack(NULL, n, msg);                                                            \
  if (!q) {                                                                                        \
    sched_rpc_error(call, GRPC_STATUS_INVALID_ARGUMENT, "request: malformed protobuf");            \
    return;                                                                                        \
  }

static void fail(sgrpc_call_t *call, int rc) {
  sched_rpc_error(call, sched_rpc_status_of(rc), "%s", qe_errmsg());
}

/* The stored default "NAME" or "NAME:BUDGET" from the message's policy and budget; limit: the
 * tenant's per-request limit in bytes (its max_request_budget_bytes, else its quota). */
static int default_of(const Qevict__V1__Tenant *t, int64_t limit, char *out, size_t n) {
  const Qevict__V1__Policy *p = t->default_policy;
  const Qevict__V1__Budget *b = t->default_budget;
  if (p && (p->q_opt_case || p->window_opt_case || p->bits_opt_case || p->sink_opt_case ||
            p->local_opt_case || *p->scorer || p->graphkv))
    return qe_errf(QE_EINVAL, "tenant.default_policy: only the policy name is kept (no overrides)");
  const char *name = p ? p->name : "";
  kv_policy_desc_t d = {0};
  if (*name && kv_policy_find(name, &d))
    return qe_errf(QE_EINVAL, "tenant.default_policy.name: unknown policy '%.64s'", name);
  if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_BYTES && !b->bytes)
    return qe_errf(QE_EINVAL, "tenant.default_budget.bytes: must be > 0");
  if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_BYTES && b->bytes > (uint64_t)INT64_MAX)
    return qe_errf(QE_EINVAL, "tenant.default_budget.bytes: at most 2^63 - 1");
  if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_BYTES && b->bytes > (uint64_t)limit)
    return qe_errf(QE_EINVAL, /* (it had been kept, and clamped in every request) */
                   "tenant.default_budget.bytes: %llu exceeds the tenant's per-request limit "
                   "(%lld bytes: max_request_budget_bytes, else kv_quota_bytes)",
                   (unsigned long long)b->bytes, (long long)limit);
  if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_FRACTION) {
    if (!(b->fraction > 0 && b->fraction <= 1))
      return qe_errf(QE_EINVAL, "tenant.default_budget.fraction: must be in (0, 1]");
    if ((!*name || d.full) && b->fraction < 1) /* (it had been kept, and ignored) */
      return qe_errf(QE_EINVAL, "tenant.default_budget.fraction: policy full keeps every token "
                                "(also the policy when none is named); a fraction below 1 needs "
                                "a tenant.default_policy.name that evicts or quantizes");
    /* (%e keeps a float's digits, where %.6f stored 1e-7 as 0.0, and always has a '.': a
       fraction, not bytes, when read back; 17 digits read back to the same double) */
    snprintf(out, n, "%s:%.16e", *name ? name : "full", b->fraction);
  } else if (b && b->kind_case == QEVICT__V1__BUDGET__KIND_BYTES)
    snprintf(out, n, "%s:%llu", *name ? name : "full", (unsigned long long)b->bytes);
  else
    snprintf(out, n, "%s", name);
  return 0;
}

/* Fills m (strings point into t and the static buffers of the caller) from a stored tenant. */
typedef struct {
  Qevict__V1__Tenant t;
  Qevict__V1__Policy p;
  Qevict__V1__Budget b;
  char name[SCHED_POLICY_MAX + 1], prefix[32];
} tenant_msg_t;

static void tenant_msg(sched_t *s, sched_tenant_t *st, tenant_msg_t *m) {
  qevict__v1__tenant__init(&m->t);
  qevict__v1__policy__init(&m->p);
  qevict__v1__budget__init(&m->b);
  snprintf(m->name, sizeof m->name, "%s", st->default_policy);
  char *at = strchr(m->name, ':');
  if (at) {
    *at++ = 0;
    if (strchr(at, '.'))
      m->b.kind_case = QEVICT__V1__BUDGET__KIND_FRACTION, m->b.fraction = strtod(at, NULL);
    else
      m->b.kind_case = QEVICT__V1__BUDGET__KIND_BYTES, m->b.bytes = strtoull(at, NULL, 10);
    m->t.default_budget = &m->b;
  }
  m->p.name = m->name;
  if (*m->name) m->t.default_policy = &m->p;
  m->t.id = st->id;
  m->t.kv_quota_bytes = (uint64_t)st->kv_quota_bytes;
  m->t.max_request_budget_bytes = (uint64_t)st->max_request_budget_bytes;
  sched_admit_tenant_stats_t ts = {0};
  sched_admit_tenant_stats(s->admit, st->id, &ts);
  m->t.reserved_bytes = (uint64_t)ts.reserved_bytes;
  m->t.running = (uint32_t)ts.n_running, m->t.queued = (uint32_t)ts.n_queued;
  snprintf(m->prefix, sizeof m->prefix, "%s%.8s", *st->key_id ? "qk_" : "", st->key_id);
  m->t.api_key_prefix = m->prefix;
  m->t.created_unix_ms = st->created_at_ms;
  m->t.key_created_unix_ms = st->key_created_at_ms;
}

static void set_tenant(sched_t *s, sgrpc_call_t *call, const uint8_t *msg, size_t n) {
  UNPACK(Qevict__V1__SetTenantRequest, qevict__v1__set_tenant_request);
  sched_tenant_t st = {0};
  char key[SCHED_KEY_STRLEN + 1] = "";
  int created = 0, rc = q->tenant ? 0 : qe_errf(QE_EINVAL, "tenant: missing");
  if (!rc) rc = sched_tenants_check_id(q->tenant->id, "tenant.id");
  if (!rc) {
    snprintf(st.id, sizeof st.id, "%s", q->tenant->id);
    st.kv_quota_bytes = (int64_t)q->tenant->kv_quota_bytes;
    st.max_request_budget_bytes = (int64_t)q->tenant->max_request_budget_bytes;
    if (q->tenant->kv_quota_bytes > INT64_MAX || q->tenant->max_request_budget_bytes > INT64_MAX)
      rc = qe_errf(QE_EINVAL, "tenant.%s: at most 2^63 - 1",
                   q->tenant->kv_quota_bytes > INT64_MAX ? "kv_quota_bytes"
                                                         : "max_request_budget_bytes");
    else if (st.kv_quota_bytes <= 0)
      rc = qe_errf(QE_EINVAL, "tenant.kv_quota_bytes: must be > 0");
    else if (st.max_request_budget_bytes > st.kv_quota_bytes) /* (the store's said no "tenant.") */
      rc = qe_errf(QE_EINVAL, "tenant.max_request_budget_bytes: %lld exceeds kv_quota_bytes %lld",
                   (long long)st.max_request_budget_bytes, (long long)st.kv_quota_bytes);
  }
  const int64_t limit =
      st.max_request_budget_bytes ? st.max_request_budget_bytes : st.kv_quota_bytes;
  if (!rc) rc = default_of(q->tenant, limit, st.default_policy, sizeof st.default_policy);
  unsigned flags = q->rotate_key ? SCHED_TENANT_ROTATE_KEY : 0;
  qevict__v1__set_tenant_request__free_unpacked(q, NULL);
  if (!rc) rc = sched_tenants_set(s->tenants, &st, flags, key, &created);
  sched_refit_t fit = {s, &st}; /* (the tenant's waiting requests clamped as a fresh one) */
  if (!rc) rc = sched_admit_refit_tenant(s->admit, st.id, st.kv_quota_bytes, sched_req_refit, &fit);
  if (!rc) rc = sched_tenants_get(s->tenants, st.id, &st);
  if (rc) {
    fail(call, rc);
    return;
  }
  tenant_msg_t m;
  tenant_msg(s, &st, &m);
  Qevict__V1__SetTenantResponse r = QEVICT__V1__SET_TENANT_RESPONSE__INIT;
  r.tenant = &m.t, r.api_key = key, r.created = created;
  sched_rpc_reply(call, &r.base);
}

static void get_tenant(sched_t *s, sgrpc_call_t *call, const uint8_t *msg, size_t n) {
  UNPACK(Qevict__V1__GetTenantRequest, qevict__v1__get_tenant_request);
  sched_tenant_t st;
  int rc = sched_tenants_check_id(q->id, "id");
  if (!rc) rc = sched_tenants_get(s->tenants, q->id, &st);
  qevict__v1__get_tenant_request__free_unpacked(q, NULL);
  if (rc) {
    fail(call, rc);
    return;
  }
  tenant_msg_t m;
  tenant_msg(s, &st, &m);
  sched_rpc_reply(call, &m.t.base);
}

#define LIST_PAGE 1000 /* a page of ListTenants or ListRequests by default */

/* A page of `want` (0 or past LIST_PAGE: LIST_PAGE) tenants of all[n] (ordered by id) after token
 * (empty: from the first): its first index into *first and its size; next: the last one's id when
 * more follow, else empty. */
static size_t tenant_page(const sched_tenant_t *all, size_t n, const char *token, uint32_t want,
                          size_t *first, char *next, size_t cap) {
  size_t i = 0;
  while (*token && i < n && strcmp(all[i].id, token) <= 0) i++;
  const size_t page = want && want < LIST_PAGE ? want : LIST_PAGE;
  const size_t cnt = n - i < page ? n - i : page;
  *first = i, *next = '\0';
  if (i + cnt < n) snprintf(next, cap, "%s", all[i + cnt - 1].id);
  return cnt;
}

static void list_tenants(sched_t *s, sgrpc_call_t *call, const uint8_t *msg, size_t n) {
  UNPACK(Qevict__V1__ListTenantsRequest, qevict__v1__list_tenants_request);
  char token[SCHED_TENANT_ID_MAX + 1], next[SCHED_TENANT_ID_MAX + 1];
  const uint32_t want = q->page_size;
  const int bad = *q->page_token && sched_tenants_check_id(q->page_token, "page_token");
  snprintf(token, sizeof token, "%s", bad ? "" : q->page_token);
  qevict__v1__list_tenants_request__free_unpacked(q, NULL);
  if (bad) {
    fail(call, QE_EINVAL);
    return;
  }
  sched_tenant_t *all = NULL;
  size_t n_all = 0, first = 0;
  int rc = sched_tenants_list(s->tenants, &all, &n_all);
  if (rc) {
    fail(call, rc);
    return;
  }
  const size_t cnt = tenant_page(all, n_all, token, want, &first, next, sizeof next);
  tenant_msg_t *m = calloc(cnt ? cnt : 1, sizeof *m);
  Qevict__V1__Tenant **ptrs = calloc(cnt ? cnt : 1, sizeof *ptrs);
  if (m && ptrs) {
    for (size_t i = 0; i < cnt; i++) tenant_msg(s, &all[first + i], &m[i]), ptrs[i] = &m[i].t;
    Qevict__V1__ListTenantsResponse r = QEVICT__V1__LIST_TENANTS_RESPONSE__INIT;
    r.tenants = ptrs, r.n_tenants = cnt, r.next_page_token = next;
    sched_rpc_reply(call, &r.base);
  } else
    sched_rpc_error(call, GRPC_STATUS_INTERNAL, "out of memory");
  free(ptrs);
  free(m);
  free(all);
}

static void delete_tenant(sched_t *s, sgrpc_call_t *call, const uint8_t *msg, size_t n) {
  UNPACK(Qevict__V1__DeleteTenantRequest, qevict__v1__delete_tenant_request);
  char id[SCHED_TENANT_ID_MAX + 1];
  if (sched_tenants_check_id(q->id, "id")) { /* (not cut to another tenant's id) */
    qevict__v1__delete_tenant_request__free_unpacked(q, NULL);
    fail(call, QE_EINVAL);
    return;
  }
  snprintf(id, sizeof id, "%s", q->id);
  int force = q->force;
  qevict__v1__delete_tenant_request__free_unpacked(q, NULL);
  sched_tenant_t st;
  int rc = sched_tenants_get(s->tenants, id, &st);
  if (rc) {
    fail(call, rc);
    return;
  }
  sched_admit_tenant_stats_t ts = {0};
  sched_admit_tenant_stats(s->admit, id, &ts);
  if ((ts.n_running || ts.n_queued) && !force) {
    sched_rpc_error(call, GRPC_STATUS_FAILED_PRECONDITION,
                    "tenant %s has %zu running and %zu queued requests (set force)", id,
                    ts.n_running, ts.n_queued);
    return;
  }
  /* the store first: a delete that fails there (a lock, a full disk) changes nothing, where
   * the requests had been cancelled and hidden from a tenant that stayed */
  rc = sched_tenants_delete(s->tenants, id);
  if (rc) {
    fail(call, rc);
    return;
  }
  Qevict__V1__DeleteTenantResponse r = QEVICT__V1__DELETE_TENANT_RESPONSE__INIT;
  r.cancelled = sched_req_cancel_tenant(s, id);
  sched_admit_remove_tenant(s->admit, id);
  sched_export_tenant_deleted(s, id);
  sched_rpc_reply(call, &r.base);
}

/* Whether r passes q's filters: a tenant's requests are those of the tenant now under that id
 * (a deleted tenant's, still kept, are not a recreated one's). */
static int wanted(const sreq_t *r, const Qevict__V1__ListRequestsRequest *q) {
  if (*q->tenant && (r->orphan || strcmp(q->tenant, r->tenant))) return 0;
  if (!q->n_states) return 1;
  for (size_t i = 0; i < q->n_states; i++)
    if ((int)q->states[i] == r->state) return 1;
  return 0;
}

/* The index of the first state filter that names no state (UNSPECIFIED or unknown), or -1. */
static long bad_state(const Qevict__V1__ListRequestsRequest *q) {
  for (size_t i = 0; i < q->n_states; i++)
    if (q->states[i] == QEVICT__V1__REQUEST_STATE__REQUEST_STATE_UNSPECIFIED ||
        !protobuf_c_enum_descriptor_get_value(&qevict__v1__request_state__descriptor,
                                              (int)q->states[i]))
      return (long)i;
  return -1;
}

/* A ListRequests page token (a request id, decimal) into *id; -1 when it is not one. */
static int parse_page_token(const char *t, uint64_t *id) {
  char *end;
  if (!isdigit((unsigned char)*t) || strlen(t) > 20) return -1;
  errno = 0;
  const unsigned long long v = strtoull(t, &end, 10);
  if (*end || errno) return -1;
  *id = (uint64_t)v;
  return 0;
}

static void list_requests(sched_t *s, sgrpc_call_t *call, const uint8_t *msg, size_t n) {
  UNPACK(Qevict__V1__ListRequestsRequest, qevict__v1__list_requests_request);
  if (*q->tenant && sched_tenants_check_id(q->tenant, "tenant")) {
    qevict__v1__list_requests_request__free_unpacked(q, NULL);
    fail(call, QE_EINVAL);
    return;
  }
  const long bad = bad_state(q);
  if (bad >= 0) {
    const int v = (int)q->states[bad];
    qevict__v1__list_requests_request__free_unpacked(q, NULL);
    sched_rpc_error(call, GRPC_STATUS_INVALID_ARGUMENT, "states[%ld]: %d is not a state", bad, v);
    return;
  }
  uint64_t after = UINT64_MAX; /* page_token: the last id of the previous page */
  if (*q->page_token && parse_page_token(q->page_token, &after)) {
    qevict__v1__list_requests_request__free_unpacked(q, NULL);
    sched_rpc_error(call, GRPC_STATUS_INVALID_ARGUMENT,
                    "page_token: not a token of ListRequests (pass next_page_token)");
    return;
  }
  sreq_t *from = s->reqs; /* newest first: ids fall along the list */
  while (from && from->id >= after) from = from->next_all;
  const size_t page = q->limit && q->limit < LIST_PAGE ? q->limit : LIST_PAGE;
  size_t cnt = 0, more = 0;
  for (sreq_t *r = from; r && !more; r = r->next_all)
    if (wanted(r, q)) cnt < page ? (void)cnt++ : (void)(more = 1);
  Qevict__V1__RequestInfo *info = calloc(cnt ? cnt : 1, sizeof *info);
  Qevict__V1__MemorySummary *mem = calloc(cnt ? cnt : 1, sizeof *mem);
  Qevict__V1__RequestInfo **ptrs = calloc(cnt ? cnt : 1, sizeof *ptrs);
  if (info && mem && ptrs) {
    size_t i = 0;
    char next[24] = "";
    for (sreq_t *r = from; r && i < cnt; r = r->next_all)
      if (wanted(r, q)) sched_req_info(r, &info[i], &mem[i]), ptrs[i] = &info[i], i++;
    if (more) snprintf(next, sizeof next, "%s", info[cnt - 1].request_id);
    Qevict__V1__ListRequestsResponse resp = QEVICT__V1__LIST_REQUESTS_RESPONSE__INIT;
    resp.requests = ptrs, resp.n_requests = cnt, resp.next_page_token = next;
    sched_rpc_reply(call, &resp.base);
  } else
    sched_rpc_error(call, GRPC_STATUS_INTERNAL, "out of memory");
  qevict__v1__list_requests_request__free_unpacked(q, NULL);
  free(info);
  free(mem);
  free(ptrs);
}

static void drain(sched_t *s, sgrpc_call_t *call, const uint8_t *msg, size_t n) {
  UNPACK(Qevict__V1__DrainRequest, qevict__v1__drain_request);
  Qevict__V1__DrainResponse r = QEVICT__V1__DRAIN_RESPONSE__INIT;
  char **names = NULL;
  int rc = sched_groups_drain(s, q->worker, &r, &names);
  qevict__v1__drain_request__free_unpacked(q, NULL);
  if (rc)
    fail(call, rc);
  else
    sched_rpc_reply(call, &r.base);
  free(names);
}

void sched_admin_rpc(sched_t *s, sgrpc_call_t *call, int method, const uint8_t *msg, size_t n) {
  switch (method) {
  case A_SET:
    set_tenant(s, call, msg, n);
    break;
  case A_GET:
    get_tenant(s, call, msg, n);
    break;
  case A_LIST:
    list_tenants(s, call, msg, n);
    break;
  case A_DELETE:
    delete_tenant(s, call, msg, n);
    break;
  case A_REQUESTS:
    list_requests(s, call, msg, n);
    break;
  default:
    drain(s, call, msg, n);
    break;
  }
}
