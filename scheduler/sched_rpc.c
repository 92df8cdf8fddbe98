/* sched_rpc: the gRPC surface of qevict-sched: the method table, authentication (tenant keys
 * on Generation, the admin key on Admin, none on Health), and the standard health service. */
#include <grpc/status.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qe_log.h"
#include "qe_pem.h"
#include "qe_status.h"
#include "qe_tls.h"
#include "sched_internal.h"

enum {
  M_GENERATE,
  M_SUBMIT,
  M_WATCH,
  M_CANCEL,
  M_GET,
  M_SET_TENANT,
  M_GET_TENANT,
  M_LIST_TENANTS,
  M_DELETE_TENANT,
  M_LIST_REQUESTS,
  M_DRAIN,
  M_HEALTH_CHECK,
  M_HEALTH_WATCH,
  M_COUNT
};

static const sgrpc_method_t methods[M_COUNT] = {
    {"/qevict.v1.Generation/Generate", 1},   {"/qevict.v1.Generation/Submit", 0},
    {"/qevict.v1.Generation/Watch", 1},      {"/qevict.v1.Generation/Cancel", 0},
    {"/qevict.v1.Generation/GetRequest", 0}, {"/qevict.v1.Admin/SetTenant", 0},
    {"/qevict.v1.Admin/GetTenant", 0},       {"/qevict.v1.Admin/ListTenants", 0},
    {"/qevict.v1.Admin/DeleteTenant", 0},    {"/qevict.v1.Admin/ListRequests", 0},
    {"/qevict.v1.Admin/Drain", 0},           {"/grpc.health.v1.Health/Check", 0},
    {"/grpc.health.v1.Health/Watch", 1},
};

/* A Health.Watch stream. */
typedef struct shealth {
  sgrpc_call_t *call;
  int sending, sent_state, dirty;
  struct shealth *next;
  int unknown; /* a service this server does not know: SERVICE_UNKNOWN, which never changes */
} shealth_t;

void sched_rpc_reply(sgrpc_call_t *call, const ProtobufCMessage *m) {
  size_t n = m ? protobuf_c_message_get_packed_size(m) : 0;
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    sgrpc_finish(call, GRPC_STATUS_INTERNAL, "out of memory", NULL, 0);
    return;
  }
  if (m) protobuf_c_message_pack(m, buf);
  sgrpc_finish(call, GRPC_STATUS_OK, "", buf, n);
  free(buf);
}

void sched_rpc_error(sgrpc_call_t *call, int status, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  sched_utf8_clean(msg); /* (ids and names are echoed as the client sent them) */
  sgrpc_finish(call, status, msg, NULL, 0);
}

int sched_rpc_status_of(int rc) {
  switch (rc) {
  case QE_EINVAL:
  case QE_EFORMAT:
    return GRPC_STATUS_INVALID_ARGUMENT;
  case QE_ENOTFOUND:
    return GRPC_STATUS_NOT_FOUND;
  case QE_ERANGE:
  case QE_ENOSPC:
    return GRPC_STATUS_RESOURCE_EXHAUSTED;
  case QE_EUNSUPPORTED:
    return GRPC_STATUS_UNIMPLEMENTED;
  case QE_EBUSY: /* (the tenant store locked by another process: a retry may pass) */
    return GRPC_STATUS_UNAVAILABLE;
  default:
    return GRPC_STATUS_INTERNAL;
  }
}

/* The bearer token of the call into key; 0, or an UNAUTHENTICATED answer (absent, or not
 * "Bearer <key>" with a key shorter than n) and -1. who: "API" or "admin". */
static int bearer(sgrpc_call_t *call, char *key, size_t n, const char *who) {
  char v[256];
  const int rc = sgrpc_call_metadata(call, "authorization", v, sizeof v);
  if (rc == QE_ENOTFOUND)
    return sched_rpc_error(call, GRPC_STATUS_UNAUTHENTICATED,
                           "missing %s key (metadata authorization: Bearer <key>)", who),
           -1;
  const char *k = v + 7;
  while (!strncasecmp(v, "Bearer ", 7) && *k == ' ') k++;
  if (rc || strncasecmp(v, "Bearer ", 7) || strlen(k) >= n) /* (rc: over 255 bytes) */
    return sched_rpc_error(call, GRPC_STATUS_UNAUTHENTICATED,
                           "malformed authorization metadata: want 'Bearer <%s key>', a key "
                           "of at most %zu bytes",
                           who, n - 1),
           -1;
  strcpy(key, k);
  return 0;
}

/* Generation: the tenant of a valid key, or an UNAUTHENTICATED answer. */
static int auth_tenant(sched_t *s, sgrpc_call_t *call, char tenant[SCHED_TENANT_ID_MAX + 1]) {
  char key[128];
  if (bearer(call, key, sizeof key, "API")) return -1;
  if (sched_tenants_verify_key(s->tenants, key, tenant)) {
    sched_rpc_error(call, GRPC_STATUS_UNAUTHENTICATED, "invalid API key");
    return -1;
  }
  return 0;
}

/* Admin: the admin key; a tenant key is PERMISSION_DENIED, anything else UNAUTHENTICATED. */
static int auth_admin(sched_t *s, sgrpc_call_t *call) {
  char key[128], tenant[SCHED_TENANT_ID_MAX + 1];
  if (bearer(call, key, sizeof key, "admin")) return -1;
  if (!sched_tenants_verify_admin_key(s->tenants, key)) return 0;
  if (!sched_tenants_verify_key(s->tenants, key, tenant))
    sched_rpc_error(call, GRPC_STATUS_PERMISSION_DENIED, "tenant keys cannot use Admin");
  else
    sched_rpc_error(call, GRPC_STATUS_UNAUTHENTICATED, "invalid admin key");
  return -1;
}

/* ---- grpc.health.v1.Health ---- */

static int serving_status(const sched_t *s) {
  return sched_groups_accepting(s)
             ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
             : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

static int known_service(const char *svc) {
  return !*svc || !strcmp(svc, "qevict.v1.Generation") || !strcmp(svc, "qevict.v1.Admin");
}

static void health_send(sched_t *s, shealth_t *h) {
  Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  r.status = h->unknown ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN
                        : serving_status(s);
  uint8_t buf[16];
  size_t n = grpc__health__v1__health_check_response__pack(&r, buf);
  h->dirty = 0;
  h->sent_state = r.status;
  h->sending = sgrpc_send(h->call, buf, n) == 0;
}

void sched_health_changed(sched_t *s) {
  for (shealth_t *h = s->health_watchers; h; h = h->next) {
    if (h->unknown || h->sent_state == serving_status(s)) continue;
    if (h->sending)
      h->dirty = 1;
    else
      health_send(s, h);
  }
}

static void health_rpc(sched_t *s, sgrpc_call_t *call, int method, const uint8_t *msg, size_t n) {
  Grpc__Health__V1__HealthCheckRequest *q =
      grpc__health__v1__health_check_request__unpack(NULL, n, msg);
  if (!q) {
    sched_rpc_error(call, GRPC_STATUS_INVALID_ARGUMENT, "request: malformed protobuf");
    return;
  }
  int known = known_service(q->service);
  grpc__health__v1__health_check_request__free_unpacked(q, NULL);
  if (method == M_HEALTH_CHECK) {
    if (!known) {
      sched_rpc_error(call, GRPC_STATUS_NOT_FOUND, "service: unknown");
      return;
    }
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = serving_status(s);
    sched_rpc_reply(call, &r.base);
    return;
  }
  shealth_t *h = calloc(1, sizeof *h);
  if (!h) {
    sched_rpc_error(call, GRPC_STATUS_INTERNAL, "out of memory");
    return;
  }
  h->call = call;
  h->unknown = !known;
  h->next = s->health_watchers;
  s->health_watchers = h;
  sgrpc_call_set_data(call, h);
  health_send(s, h);
}

static void health_drop(sched_t *s, shealth_t *h, int status) {
  for (shealth_t **p = &s->health_watchers; *p; p = &(*p)->next)
    if (*p == h) {
      *p = h->next;
      break;
    }
  sgrpc_call_set_data(h->call, NULL);
  sgrpc_finish(h->call, status, "", NULL, 0);
  free(h);
}

static int is_health(sched_t *s, void *data) {
  for (shealth_t *h = s->health_watchers; h; h = h->next)
    if ((void *)h == data) return 1;
  return 0;
}

/* ---- dispatch ---- */

static void on_call(void *ud, sgrpc_call_t *call, int method, const uint8_t *req, size_t n) {
  sched_t *s = ud;
  char tenant[SCHED_TENANT_ID_MAX + 1];
  if (s->stopping) {
    sched_rpc_error(call, GRPC_STATUS_UNAVAILABLE, "shutting down");
    return;
  }
  if (method >= M_HEALTH_CHECK) {
    health_rpc(s, call, method, req, n);
    return;
  }
  if (method >= M_SET_TENANT) {
    if (!auth_admin(s, call)) sched_admin_rpc(s, call, method - M_SET_TENANT, req, n);
    return;
  }
  if (auth_tenant(s, call, tenant)) return;
  switch (method) {
  case M_GENERATE:
    sched_req_generate(s, call, tenant, req, n, 0);
    break;
  case M_SUBMIT:
    sched_req_generate(s, call, tenant, req, n, 1);
    break;
  case M_WATCH:
    sched_req_watch(s, call, tenant, req, n);
    break;
  case M_CANCEL:
    sched_req_cancel_rpc(s, call, tenant, req, n);
    break;
  default:
    sched_req_get_rpc(s, call, tenant, req, n);
    break;
  }
}

static void on_cancel(void *ud, sgrpc_call_t *call) {
  sched_t *s = ud;
  void *data = sgrpc_call_data(call);
  if (!data) return;
  if (is_health(s, data))
    health_drop(s, data, GRPC_STATUS_CANCELLED);
  else
    sched_req_stream_cancelled(s, data);
}

static void on_sent(void *ud, sgrpc_call_t *call, int ok) {
  sched_t *s = ud;
  void *data = sgrpc_call_data(call);
  if (!data) return;
  if (!is_health(s, data)) {
    sched_req_stream_sent(s, data, ok);
    return;
  }
  shealth_t *h = data;
  h->sending = 0;
  if (ok && h->dirty) health_send(s, h);
}

/* The TLS files of the configuration, read into o (NULL where not configured). */
static int read_tls(const sched_config_t *c, sgrpc_options_t *o) {
  char **dst[3] = {(char **)&o->tls_cert_pem, (char **)&o->tls_key_pem,
                   (char **)&o->tls_client_ca_pem};
  const char *path[3] = {c->tls_cert, c->tls_key, c->tls_client_ca};
  const char *flag[3] = {"--tls-cert", "--tls-key", "--tls-client-ca"};
  const char *label[3] = {"CERTIFICATE", "PRIVATE KEY", "CERTIFICATE"};
  for (int i = 0; i < 3; i++) {
    int rc = path[i] ? qe_read_pem(path[i], flag[i], label[i], dst[i]) : 0;
    if (rc) return rc;
  }
  if (o->tls_cert_pem && o->tls_key_pem) /* (gRPC's own refusal names neither file) */
    return qe_tls_check_pair(o->tls_cert_pem, o->tls_key_pem, c->tls_cert, c->tls_key);
  return 0;
}

static void on_done(void *ud, int method, int status) {
  const sgrpc_method_t *m = method >= 0 && method < M_COUNT ? &methods[method] : NULL;
  sched_export_call(ud, m ? m->path : NULL, m && m->streaming, status, 1);
}

int sched_rpc_start(sched_t *s) {
  sgrpc_handlers_t h = {s, on_call, on_cancel, on_sent, on_done};
  for (int i = 0; i < M_COUNT; i++) /* (each method's OK series from the start, at 0) */
    sched_export_call(s, methods[i].path, methods[i].streaming, GRPC_STATUS_OK, 0);
  sgrpc_options_t o = {s->cfg.max_message, s->cfg.max_message, NULL, NULL, NULL};
  int rc = read_tls(&s->cfg, &o);
  if (!rc) rc = sgrpc_server_create(s->loop, s->cfg.listen, &o, methods, M_COUNT, &h, &s->grpc);
  if (!rc && o.tls_cert_pem)
    qe_log(QE_LOG_INFO, "sched: gRPC on %s speaks TLS only%s", s->cfg.listen,
           o.tls_client_ca_pem ? ", client certificates required" : "");
  if (o.tls_key_pem) explicit_bzero((char *)o.tls_key_pem, strlen(o.tls_key_pem));
  free((char *)o.tls_cert_pem), free((char *)o.tls_key_pem), free((char *)o.tls_client_ca_pem);
  return rc;
}

void sched_rpc_stop(sched_t *s) {
  while (s->health_watchers) health_drop(s, s->health_watchers, GRPC_STATUS_UNAVAILABLE);
  if (s->grpc) sgrpc_server_destroy(s->grpc);
  s->grpc = NULL;
}
