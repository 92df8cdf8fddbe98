/* cli_admin: the operator's commands against qevict-sched's Admin service, with the admin key:
 * `qevict tenant set|get|list|delete`, `qevict requests` (a table of the requests the
 * scheduler knows) and `qevict drain`. Text tables on stdout, or the response as JSON. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_policy.h"
#include "cli_rpc.h"
#include "qe_status.h"

static const char *const json_flag[] = {"--json", NULL};

static const char *tenant_help =
    "usage: qevict tenant (set|get|list|delete) [options]   (see qevict tenant VERB --help)\n"
    "  set ID --quota BYTES [--max-request-budget BYTES] [--default-policy NAME]\n"
    "         [--default-budget B] [--rotate-key]   create or replace a tenant\n"
    "  get ID                                        one tenant's settings and usage\n"
    "  list                                          every tenant\n"
    "  delete ID [--force]                           delete a tenant and its key\n"
    "Sizes: bytes with an optional suffix K, M or G (powers of 1024; KB or KiB alike) or B; a\n"
    "lower-case b (bits) is refused. These commands call the Admin service with the admin key\n"
    "(--admin-key-file or $QEVICT_ADMIN_KEY).\n";

static const char *tset_help =
    "usage: qevict tenant set ID --quota BYTES [options]\n"
    "Creates tenant ID or replaces its settings (options not given go back to their defaults).\n"
    "A new tenant gets an API key, printed once on its own line: store it.\n"
    "  --quota BYTES               KV bytes the tenant's running requests may reserve together\n"
    "  --max-request-budget BYTES  largest budget of one request (default, or 0: the quota)\n"
    "  --default-policy NAME       policy of requests that name none (default: full, FullKV)\n"
    "  --default-budget B          their budget: a fraction of FullKV in (0, 1] (a value with a\n"
    "                              '.' or <= 1) or bytes (K, M, G suffixes)\n"
    "  --rotate-key                issue a new API key (the old one stops working at once)\n"
    "ID: 1 to 64 of A-Z a-z 0-9 _ . -; sizes take suffixes K, M or G (powers of 1024; KB or\n"
    "KiB alike) or B, not a lower-case b (bits).\n" CLI_ADMIN_HELP;

static const char *tget_help =
    "usage: qevict tenant get ID [options]\n"
    "Prints a tenant's settings, reserved bytes and requests.\n" CLI_ADMIN_HELP;

static const char *tlist_help = "usage: qevict tenant list [options]\n"
                                "Prints every tenant, one per line.\n" CLI_ADMIN_HELP;

static const char *tdel_help =
    "usage: qevict tenant delete ID [--force] [options]\n"
    "Deletes a tenant and its key. A tenant with queued or running requests is refused\n"
    "(FAILED_PRECONDITION) unless --force, which cancels them.\n" CLI_ADMIN_HELP;

static const char *requests_help =
    "usage: qevict requests [--tenant T] [--state S] [--limit N] [options]\n"
    "Prints the requests the scheduler knows (queued, running, finished ones still kept), newest\n"
    "first: id, tenant, state, worker, prompt and generated tokens, reserved bytes and the KV\n"
    "bytes held per tier (Full, INT2, sink, metadata).\n"
    "  --tenant T        only tenant T's\n"
    "  --state S         queued, running or finished (a comma list, or repeated)\n"
    "  --limit N         at most N requests (default 0: all)\n" CLI_ADMIN_HELP;

static const char *drain_help =
    "usage: qevict drain [WORKER] [options]\n"
    "Stops dispatching new requests to WORKER (a TP group id; default: every worker); the\n"
    "requests running there finish.\n" CLI_ADMIN_HELP;

/* ---- shared ---- */

/* Parses a command that takes only the shared options and up to max_pos positionals. */
static int admin_opt(void *ud, const char *f, const char *v) { return cli_client_parse(ud, f, v); }

/* Calls an Admin method; prints a failure. 0 or an exit code. */
static int admin_call(const char *cmd, const cli_client_opts_t *cl, const char *method,
                      const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rd,
                      ProtobufCMessage **resp) {
  cli_rpc_t *c = NULL;
  cli_rpc_status_t st;
  char path[96];
  *resp = NULL;
  int rc = cli_client_open(cmd, cl, &c);
  if (rc) return rc;
  snprintf(path, sizeof path, "/qevict.v1.Admin/%s", method);
  rc = cli_rpc_call(c, path, req, rd, cli_client_unary_timeout(cl), resp, &st);
  if (rc) rc = cli_client_fail(cmd, rc, &st);
  cli_rpc_close(c);
  return rc;
}

/* A listing RPC's pages: the request (its page_token field at token), and where a response
 * holds its items, their count and its next_page_token. */
typedef struct {
  const char *cmd, *method;
  ProtobufCMessage *req;
  char **token;
  const ProtobufCMessageDescriptor *rd;
  size_t items, count, next; /* offsets in the response */
} pager_t;

typedef struct {
  ProtobufCMessage **pages;
  void **items; /* every page's items in order (pointing into pages) */
  size_t n_pages, n_items;
} listing_t;

static void listing_free(listing_t *l) {
  for (size_t i = 0; i < l->n_pages; i++) protobuf_c_message_free_unpacked(l->pages[i], NULL);
  free(l->pages);
  free(l->items);
}

/* Calls p's RPC page after page until its last page or cap items (0: all) are in *l. */
static int list_pages(const pager_t *p, const cli_client_opts_t *cl, size_t cap, listing_t *l) {
  memset(l, 0, sizeof *l);
  int rc = 0;
  do {
    ProtobufCMessage *r = NULL, **pg = realloc(l->pages, sizeof *pg * (l->n_pages + 1));
    if (!pg) return cli_usage_error(p->cmd, "out of memory");
    l->pages = pg;
    if ((rc = admin_call(p->cmd, cl, p->method, p->req, p->rd, &r))) return rc;
    l->pages[l->n_pages++] = r;
    const size_t n = *(size_t *)((char *)r + p->count);
    void **got = *(void ***)((char *)r + p->items), **all;
    if (!(all = realloc(l->items, sizeof *all * (l->n_items + n + 1))))
      return cli_usage_error(p->cmd, "out of memory");
    if (n) memcpy(all + l->n_items, got, sizeof *all * n); /* (an empty page: got is NULL) */
    l->items = all, l->n_items += n;
    *p->token = *(char **)((char *)r + p->next);
  } while (**p->token && (!cap || l->n_items < cap));
  if (cap && l->n_items > cap) l->n_items = cap;
  return rc;
}

static void print_json_line(const ProtobufCMessage *m) {
  cli_rpc_json(stdout, m);
  putchar('\n');
}

static int tenant_id_ok(const char *id) {
  size_t n = strlen(id);
  return n >= 1 && n <= 64 &&
         strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") == n;
}

/* The one positional ID of a tenant verb. 0 or an exit code (message printed). */
static int tenant_id_arg(const char *cmd, int n_pos, const char *id) {
  if (n_pos != 1) return cli_usage_error(cmd, "missing tenant ID");
  if (!tenant_id_ok(id))
    return cli_usage_error(cmd, "bad tenant ID '%s' (1 to 64 of A-Z a-z 0-9 _ . -)", id);
  return 0;
}

static const char *fmt_time(char *buf, size_t size, int64_t unix_ms) {
  time_t t = (time_t)(unix_ms / 1000);
  struct tm tm;
  if (unix_ms <= 0 || !gmtime_r(&t, &tm) || !strftime(buf, size, "%Y-%m-%d %H:%M:%S UTC", &tm))
    snprintf(buf, size, "-");
  return buf;
}

/* A policy with its overrides: "qevict (q 0.5, window 16)"; "full" when unset. */
static const char *fmt_policy(char *buf, size_t size, const Qevict__V1__Policy *p) {
  size_t n = (size_t)snprintf(buf, size, "%s", p && *p->name ? p->name : "full");
  const char *sep = " (";
#define FMT_ADD(...)                                                                               \
  do {                                                                                             \
    if (n < size) n += (size_t)snprintf(buf + n, size - n, __VA_ARGS__);                           \
    sep = ", ";                                                                                    \
  } while (0)
  if (!p) return buf;
  if (p->q_opt_case) FMT_ADD("%sq %g", sep, p->q);
  if (p->window_opt_case) FMT_ADD("%swindow %u", sep, p->window);
  if (p->bits_opt_case) FMT_ADD("%sbits %u", sep, p->bits);
  if (p->sink_opt_case) FMT_ADD("%ssink %u", sep, p->sink);
  if (p->local_opt_case) FMT_ADD("%slocal %u", sep, p->local);
  if (*p->scorer) FMT_ADD("%sscorer %s", sep, p->scorer);
  if (p->graphkv) FMT_ADD("%sgraphkv", sep);
  if (sep[0] == ',') FMT_ADD(")");
#undef FMT_ADD
  return buf;
}

static void tenant_print(const Qevict__V1__Tenant *t) {
  char a[32], b[32], pol[160], bud[48], tm[40];
  printf("  quota               %s (%llu bytes)\n", cli_fmt_bytes(a, sizeof a, t->kv_quota_bytes),
         (unsigned long long)t->kv_quota_bytes);
  if (t->max_request_budget_bytes)
    printf("  max request budget  %s (%llu bytes)\n",
           cli_fmt_bytes(a, sizeof a, t->max_request_budget_bytes),
           (unsigned long long)t->max_request_budget_bytes);
  else
    printf("  max request budget  the quota\n");
  printf("  default policy      %s, budget %s\n", fmt_policy(pol, sizeof pol, t->default_policy),
         t->default_budget ? cli_fmt_budget(bud, sizeof bud, t->default_budget) : "FullKV");
  printf("  reserved            %s by %u running (%u queued)\n",
         cli_fmt_bytes(b, sizeof b, t->reserved_bytes), t->running, t->queued);
  if (*t->api_key_prefix)
    printf("  api key             %s... (issued %s)\n", t->api_key_prefix,
           fmt_time(tm, sizeof tm, t->key_created_unix_ms));
  else
    printf("  api key             -\n");
  printf("  created             %s\n", fmt_time(tm, sizeof tm, t->created_unix_ms));
}

/* ---- tenant set ---- */

typedef struct {
  cli_client_opts_t cl;
  Qevict__V1__Tenant t;
  Qevict__V1__Policy policy;
  Qevict__V1__Budget budget;
  int rotate;
} tset_args_t;

static int tset_opt(void *ud, const char *f, const char *v) {
  tset_args_t *a = ud;
  char names[256];
  int rc = cli_client_parse(&a->cl, f, v);
  if (rc != 1) return rc;
  if (!strcmp(f, "--rotate-key")) return v ? 2 : (a->rotate = 1, 0);
  if (!v) return 1;
  if (!strcmp(f, "--quota")) return cli_parse_bytes(v, &a->t.kv_quota_bytes) ? 2 : 0;
  if (!strcmp(f, "--max-request-budget") && !strcmp(v, "0")) /* (the proto's 0: the quota) */
    return a->t.max_request_budget_bytes = 0, 0;
  if (!strcmp(f, "--max-request-budget"))
    return cli_parse_bytes(v, &a->t.max_request_budget_bytes) ? 2 : 0;
  if (!strcmp(f, "--default-budget")) {
    if (cli_parse_budget(v, &a->budget)) return 2;
    a->t.default_budget = &a->budget;
    return 0;
  }
  if (strcmp(f, "--default-policy")) return 1;
  if (cli_check_policy(v))
    return cli_usage_error("tenant set", "unknown policy '%s' for --default-policy (%s)", v,
                           cli_policy_names(names, sizeof names)),
           CLI_OPT_PRINTED;
  a->policy.name = (char *)v;
  a->t.default_policy = &a->policy;
  return 0;
}

static void tset_print(const Qevict__V1__SetTenantResponse *r) {
  printf("tenant %s %s\n", r->tenant ? r->tenant->id : "?", r->created ? "created" : "updated");
  if (r->tenant) tenant_print(r->tenant);
  if (!*r->api_key) return;
  printf("api key (shown only this once: store it now):\n%s\n", r->api_key);
}

static int tenant_set(int argc, char **argv) {
  static const char *const flags[] = {"--json", "--rotate-key", NULL};
  tset_args_t a = {.t = QEVICT__V1__TENANT__INIT,
                   .policy = QEVICT__V1__POLICY__INIT,
                   .budget = QEVICT__V1__BUDGET__INIT};
  const char *id[1];
  int n_pos;
  ProtobufCMessage *resp = NULL;
  cli_client_init(&a.cl, 1);
  int rc = cli_args_parse("tenant set", argc, argv, tset_help, flags, tset_opt, &a, id, 1, &n_pos);
  if (rc) return rc < 0 ? 0 : rc;
  if ((rc = tenant_id_arg("tenant set", n_pos, id[0]))) return rc;
  if (!a.t.kv_quota_bytes) return cli_usage_error("tenant set", "--quota is required");
  a.t.id = (char *)id[0];
  Qevict__V1__SetTenantRequest req = QEVICT__V1__SET_TENANT_REQUEST__INIT;
  req.tenant = &a.t, req.rotate_key = a.rotate;
  rc = admin_call("tenant set", &a.cl, "SetTenant", &req.base,
                  &qevict__v1__set_tenant_response__descriptor, &resp);
  if (!rc && a.cl.json) print_json_line(resp);
  if (!rc && !a.cl.json) tset_print((Qevict__V1__SetTenantResponse *)resp);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

/* ---- tenant get, list, delete ---- */

static int tenant_get(int argc, char **argv) {
  cli_client_opts_t cl;
  const char *id[1];
  int n_pos;
  ProtobufCMessage *resp = NULL;
  cli_client_init(&cl, 1);
  int rc =
      cli_args_parse("tenant get", argc, argv, tget_help, json_flag, admin_opt, &cl, id, 1, &n_pos);
  if (rc) return rc < 0 ? 0 : rc;
  if ((rc = tenant_id_arg("tenant get", n_pos, id[0]))) return rc;
  Qevict__V1__GetTenantRequest req = QEVICT__V1__GET_TENANT_REQUEST__INIT;
  req.id = (char *)id[0];
  rc =
      admin_call("tenant get", &cl, "GetTenant", &req.base, &qevict__v1__tenant__descriptor, &resp);
  if (!rc && cl.json) print_json_line(resp);
  if (!rc && !cl.json) {
    printf("tenant %s\n", ((Qevict__V1__Tenant *)resp)->id);
    tenant_print((Qevict__V1__Tenant *)resp);
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

static void tlist_print(const Qevict__V1__ListTenantsResponse *r) {
  int w = 6;
  char q[32], res[32], mx[32], pol[160], bud[48];
  for (size_t i = 0; i < r->n_tenants; i++)
    if ((int)strlen(r->tenants[i]->id) > w) w = (int)strlen(r->tenants[i]->id);
  printf("%-*s %10s %10s %7s %6s %10s %-24s %-16s %s\n", w, "TENANT", "QUOTA", "RESERVED",
         "RUNNING", "QUEUED", "MAX REQ", "DEFAULT POLICY", "DEFAULT BUDGET", "KEY");
  for (size_t i = 0; i < r->n_tenants; i++) {
    const Qevict__V1__Tenant *t = r->tenants[i];
    printf("%-*s %10s %10s %7u %6u %10s %-24s %-16s %s%s\n", w, t->id,
           cli_fmt_bytes(q, sizeof q, t->kv_quota_bytes),
           cli_fmt_bytes(res, sizeof res, t->reserved_bytes), t->running, t->queued,
           t->max_request_budget_bytes ? cli_fmt_bytes(mx, sizeof mx, t->max_request_budget_bytes)
                                       : "quota",
           fmt_policy(pol, sizeof pol, t->default_policy),
           t->default_budget ? cli_fmt_budget(bud, sizeof bud, t->default_budget) : "FullKV",
           *t->api_key_prefix ? t->api_key_prefix : "-", *t->api_key_prefix ? "..." : "");
  }
  if (!r->n_tenants) printf("(no tenants)\n");
}

static int tenant_list(int argc, char **argv) {
  cli_client_opts_t cl;
  int n_pos;
  cli_client_init(&cl, 1);
  int rc = cli_args_parse("tenant list", argc, argv, tlist_help, json_flag, admin_opt, &cl, NULL, 0,
                          &n_pos);
  if (rc) return rc < 0 ? 0 : rc;
  Qevict__V1__ListTenantsRequest req = QEVICT__V1__LIST_TENANTS_REQUEST__INIT;
  const pager_t p = {"tenant list",
                     "ListTenants",
                     &req.base,
                     &req.page_token,
                     &qevict__v1__list_tenants_response__descriptor,
                     offsetof(Qevict__V1__ListTenantsResponse, tenants),
                     offsetof(Qevict__V1__ListTenantsResponse, n_tenants),
                     offsetof(Qevict__V1__ListTenantsResponse, next_page_token)};
  listing_t l;
  rc = list_pages(&p, &cl, 0, &l);
  Qevict__V1__ListTenantsResponse all = QEVICT__V1__LIST_TENANTS_RESPONSE__INIT;
  all.tenants = (Qevict__V1__Tenant **)l.items, all.n_tenants = l.n_items;
  if (!rc && cl.json) print_json_line(&all.base);
  if (!rc && !cl.json) tlist_print(&all);
  listing_free(&l);
  return rc;
}

typedef struct {
  cli_client_opts_t cl;
  int force;
} tdel_args_t;

static int tdel_opt(void *ud, const char *f, const char *v) {
  tdel_args_t *a = ud;
  if (strcmp(f, "--force")) return cli_client_parse(&a->cl, f, v);
  return v ? 2 : (a->force = 1, 0);
}

static int tenant_delete(int argc, char **argv) {
  static const char *const flags[] = {"--json", "--force", NULL};
  tdel_args_t a = {.force = 0};
  const char *id[1];
  int n_pos;
  ProtobufCMessage *resp = NULL;
  cli_client_init(&a.cl, 1);
  int rc =
      cli_args_parse("tenant delete", argc, argv, tdel_help, flags, tdel_opt, &a, id, 1, &n_pos);
  if (rc) return rc < 0 ? 0 : rc;
  if ((rc = tenant_id_arg("tenant delete", n_pos, id[0]))) return rc;
  Qevict__V1__DeleteTenantRequest req = QEVICT__V1__DELETE_TENANT_REQUEST__INIT;
  req.id = (char *)id[0], req.force = a.force;
  rc = admin_call("tenant delete", &a.cl, "DeleteTenant", &req.base,
                  &qevict__v1__delete_tenant_response__descriptor, &resp);
  if (!rc && a.cl.json) print_json_line(resp);
  if (!rc && !a.cl.json)
    printf("tenant %s deleted (%u requests cancelled)\n", id[0],
           ((Qevict__V1__DeleteTenantResponse *)resp)->cancelled);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

/* The index of `qevict tenant`'s verb: its first argument that is neither an option nor an
 * option's value (options given before the verb are its options: they move after it). An option
 * of no verb before it: minus its index (its value, if any, had been taken for the verb). */
static int tenant_verb_at(int argc, char **argv) {
  static const char *const no_value[] = {"--json", "--tls", "--rotate-key", "--force", NULL};
  static const char *const value[] = {"--quota",          "--max-request-budget",
                                      "--default-budget", "--default-policy",
                                      "--server",         "--timeout",
                                      "--tls-ca",         "--tls-cert",
                                      "--tls-key",        "--tls-server-name",
                                      "--admin-key-file", NULL};
  int i = 1;
  while (i < argc && argv[i][0] == '-' && argv[i][1] && strcmp(argv[i], "--")) {
    const char *a = argv[i], *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
    const size_t len = eq ? (size_t)(eq - a) : strlen(a);
    int flag_only = eq != NULL, known = 0;
    for (int k = 0; no_value[k] && !known; k++) known = flag_only |= !strcmp(a, no_value[k]);
    for (int k = 0; value[k] && !known; k++)
      known = strlen(value[k]) == len && !strncmp(a, value[k], len);
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return i;
    if (!known) return -i;
    i += flag_only ? 1 : 2;
  }
  return i;
}

int cli_tenant(int argc, char **argv) {
  static const struct {
    const char *verb;
    int (*fn)(int, char **);
  } verbs[] = {
      {"set", tenant_set}, {"get", tenant_get}, {"list", tenant_list}, {"delete", tenant_delete}};
  const int at = tenant_verb_at(argc, argv);
  if (at < 0)
    return cli_usage_error("tenant",
                           "unknown option '%s' (before the verb: set, get, list or "
                           "delete)",
                           argv[-at]);
  if (at > argc) /* (an option that takes a value, last) */
    return cli_usage_error("tenant", "%s needs a value", argv[argc - 1]);
  if (at >= argc) return cli_usage_error("tenant", "missing verb: set, get, list or delete");
  if (!strcmp(argv[at], "--help") || !strcmp(argv[at], "-h")) return fputs(tenant_help, stdout), 0;
  char *verb = argv[at]; /* rotated to argv[1], the options before it after it */
  memmove(argv + 2, argv + 1, sizeof *argv * (size_t)(at - 1));
  argv[1] = verb;
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
    if (!strcmp(verb, verbs[i].verb)) return verbs[i].fn(argc - 1, argv + 1);
  return cli_usage_error("tenant", "unknown verb '%s' (set, get, list or delete)", verb);
}

/* ---- requests ---- */

typedef struct {
  cli_client_opts_t cl;
  Qevict__V1__ListRequestsRequest req;
  Qevict__V1__RequestState states[3];
} req_args_t;

/* --state queued,running: adds each (once). */
static int req_states(req_args_t *a, const char *v) {
  static const char *names[] = {"queued", "running", "finished"};
  for (const char *p = v;; p++) {
    size_t len = strcspn(p, ","), k = 0;
    while (k < 3 && (strlen(names[k]) != len || strncmp(p, names[k], len))) k++;
    if (k == 3) return 2;
    Qevict__V1__RequestState s = (Qevict__V1__RequestState)(k + 1);
    size_t j = 0;
    while (j < a->req.n_states && a->states[j] != s) j++;
    if (j == a->req.n_states) a->states[a->req.n_states++] = s;
    p += len;
    if (!*p) return 0;
  }
}

static int req_opt(void *ud, const char *f, const char *v) {
  req_args_t *a = ud;
  long l;
  int rc = cli_client_parse(&a->cl, f, v);
  if (rc != 1 || !v) return rc;
  if (!strcmp(f, "--tenant")) return tenant_id_ok(v) ? (a->req.tenant = (char *)v, 0) : 2;
  if (!strcmp(f, "--state")) return req_states(a, v);
  if (!strcmp(f, "--limit")) {
    if (cli_parse_int(v, 0, 1000000000L, &l)) return 2;
    a->req.limit = (uint32_t)l;
    return 0;
  }
  return 1;
}

static int max_width(const Qevict__V1__ListRequestsResponse *r, size_t field, int w) {
  for (size_t i = 0; i < r->n_requests; i++) {
    const char *s = *(char *const *)((const char *)r->requests[i] + field);
    if ((int)strlen(s) > w) w = (int)strlen(s);
  }
  return w;
}

static void req_print(const Qevict__V1__ListRequestsResponse *r) {
  int wi = max_width(r, offsetof(Qevict__V1__RequestInfo, request_id), 2);
  int wt = max_width(r, offsetof(Qevict__V1__RequestInfo, tenant), 6);
  int ww = max_width(r, offsetof(Qevict__V1__RequestInfo, worker), 6);
  char st[32], b[5][32];
  printf("%-*s %-*s %-8s %-*s %7s %7s %10s %10s %10s %10s %10s\n", wi, "ID", wt, "TENANT", "STATE",
         ww, "WORKER", "PROMPT", "GEN", "RESERVED", "FULL", "INT2", "SINK", "META");
  for (size_t i = 0; i < r->n_requests; i++) {
    const Qevict__V1__RequestInfo *q = r->requests[i];
    const Qevict__V1__MemorySummary *m = q->memory;
    cli_enum_short(&qevict__v1__request_state__descriptor, q->state, st, sizeof st);
    printf("%-*s %-*s %-8s %-*s %7u %7u %10s %10s %10s %10s %10s\n", wi, q->request_id, wt,
           q->tenant, st, ww, *q->worker ? q->worker : "-", q->prompt_tokens, q->generated_tokens,
           cli_fmt_bytes(b[0], sizeof b[0], q->reserved_bytes),
           m ? cli_fmt_bytes(b[1], sizeof b[1], m->full_bytes) : "-",
           m ? cli_fmt_bytes(b[2], sizeof b[2], m->int2_bytes) : "-",
           m ? cli_fmt_bytes(b[3], sizeof b[3], m->sink_bytes) : "-",
           m ? cli_fmt_bytes(b[4], sizeof b[4], m->meta_bytes) : "-");
  }
  if (!r->n_requests) printf("(no requests)\n");
}

int cli_requests(int argc, char **argv) {
  req_args_t a = {.req = QEVICT__V1__LIST_REQUESTS_REQUEST__INIT};
  int n_pos;
  cli_client_init(&a.cl, 1);
  a.req.states = a.states;
  int rc = cli_args_parse("requests", argc, argv, requests_help, json_flag, req_opt, &a, NULL, 0,
                          &n_pos);
  if (rc) return rc < 0 ? 0 : rc;
  const size_t cap = a.req.limit; /* (--limit: in pages of at most 1,000) */
  const pager_t p = {"requests",
                     "ListRequests",
                     &a.req.base,
                     &a.req.page_token,
                     &qevict__v1__list_requests_response__descriptor,
                     offsetof(Qevict__V1__ListRequestsResponse, requests),
                     offsetof(Qevict__V1__ListRequestsResponse, n_requests),
                     offsetof(Qevict__V1__ListRequestsResponse, next_page_token)};
  listing_t l;
  rc = list_pages(&p, &a.cl, cap, &l);
  Qevict__V1__ListRequestsResponse all = QEVICT__V1__LIST_REQUESTS_RESPONSE__INIT;
  all.requests = (Qevict__V1__RequestInfo **)l.items, all.n_requests = l.n_items;
  if (!rc && a.cl.json) print_json_line(&all.base);
  if (!rc && !a.cl.json) req_print(&all);
  listing_free(&l);
  return rc;
}

/* ---- drain ---- */

static void drain_print(const Qevict__V1__DrainResponse *r) {
  if (!r->n_workers) {
    printf("no worker to drain\n");
    return;
  }
  printf("draining %zu worker%s:", r->n_workers, r->n_workers == 1 ? "" : "s");
  for (size_t i = 0; i < r->n_workers; i++) printf("%s %s", i ? "," : "", r->workers[i]);
  printf("; %u request%s still running there\n", r->running, r->running == 1 ? "" : "s");
}

int cli_drain(int argc, char **argv) {
  cli_client_opts_t cl;
  const char *worker[1] = {""};
  int n_pos;
  ProtobufCMessage *resp = NULL;
  cli_client_init(&cl, 1);
  int rc =
      cli_args_parse("drain", argc, argv, drain_help, json_flag, admin_opt, &cl, worker, 1, &n_pos);
  if (rc) return rc < 0 ? 0 : rc;
  if (n_pos == 1 && !*worker[0]) return cli_usage_error("drain", "empty WORKER");
  Qevict__V1__DrainRequest req = QEVICT__V1__DRAIN_REQUEST__INIT;
  req.worker = (char *)worker[0];
  rc = admin_call("drain", &cl, "Drain", &req.base, &qevict__v1__drain_response__descriptor, &resp);
  if (!rc && cl.json) print_json_line(resp);
  if (!rc && !cl.json) drain_print((Qevict__V1__DrainResponse *)resp);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}
