/* sched_export: what qevict-sched tells its monitoring: Prometheus metrics on GET /metrics
 * (prefix qevict_, vLLM-style request metrics plus KV bytes by tier per worker and per tenant,
 * window transitions and routing events) and GET /healthz. Counters and histograms are updated
 * as things happen; gauges are rebuilt from the live state at each scrape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_log.h"
#include "qe_proc.h"
#include "qe_status.h"
#include "sched_internal.h"

struct smetrics {
  sm_fam_t *running, *waiting, *finished, *prompt_tok, *gen_tok;
  sm_fam_t *ttft, *itl, *e2e, *queue, *tpot, *req_prompt, *req_gen;
  sm_fam_t *pool, *pool_cap, *pool_admit, *pool_res, *tenant, *tenant_quota, *tenant_res;
  sm_fam_t *transitions, *routing, *workers, *refused;
  sm_fam_t *rejected, *resumes, *t_finished, *t_prompt, *t_gen;
  sm_fam_t *build, *cpu, *rss, *vsize, *start, *fds, *max_fds, *calls, *w_rss, *w_cpu;
  double cpu_last; /* process_cpu_seconds_total as last scraped */
};

static const char *reason_name(int r) {
  static const char *n[] = {"unspecified", "length", "eos", "stop", "cancelled", "error"};
  return r >= 0 && r <= 5 ? n[r] : "unspecified";
}

/* Upper bounds of the request latency histograms, seconds: the standard ones, then up to two
 * hours (vLLM's e2e reach), so that a long-context request's quantiles are not all +Inf. */
static const double latency_buckets[] = {.005, .01, .025, .05, .1,  .25, .5,   1,    2.5,  5,   10,
                                         20,   40,  80,   160, 320, 640, 1280, 2560, 5120, 7680};
/* ... and of the gaps between tokens (a step of a large batch, a stall). */
static const double itl_buckets[] = {.001, .0025, .005, .01, .025, .05, .1, .25,
                                     .5,   1,     2.5,  5,   10,   20,  40, 80};
/* ... and of a request's prompt and generated tokens: 1, 2, 5, 10, ... 500,000. */
static const double token_buckets[] = {1,   2,   5,   10,  20,  50,  100, 200, 500,
                                       1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5};

/* A family with the labels of l (NULL-terminated, at most 4) and, for a histogram, bounds. */
static int fam_b(sched_t *s, sm_fam_t **f, const char *name, const char *help, int type,
                 const char *const *l, const double *b, int nb) {
  int n = 0;
  while (l && l[n]) n++;
  return sm_family(s->metrics, name, help, type, l, n, b, nb, f);
}

static int fam(sched_t *s, sm_fam_t **f, const char *name, const char *help, int type,
               const char *const *l) {
  return fam_b(s, f, name, help, type, l, NULL, 0);
}

#define NB(a) (int)(sizeof(a) / sizeof((a)[0]))

static int request_families(sched_t *s, struct smetrics *m) {
  static const char *const reason[] = {"reason", NULL};
  int rc = 0;
  rc |= fam(s, &m->running, "qevict_requests_running", "Requests running on a worker.", SM_GAUGE,
            NULL);
  rc |= fam(s, &m->waiting, "qevict_requests_waiting",
            "Requests waiting for admission or a worker.", SM_GAUGE, NULL);
  rc |= fam(s, &m->finished, "qevict_requests_finished_total", "Finished requests by reason.",
            SM_COUNTER, reason);
  rc |= fam(s, &m->prompt_tok, "qevict_prompt_tokens_total", "Prompt tokens of started requests.",
            SM_COUNTER, NULL);
  rc |= fam(s, &m->gen_tok, "qevict_generation_tokens_total", "Generated tokens streamed.",
            SM_COUNTER, NULL);
  rc |= fam_b(s, &m->ttft, "qevict_time_to_first_token_seconds",
              "From arrival to the first generated token.", SM_HISTOGRAM, NULL, latency_buckets,
              NB(latency_buckets));
  rc |= fam_b(s, &m->itl, "qevict_inter_token_latency_seconds",
              "Time between generated tokens as received by the scheduler.", SM_HISTOGRAM, NULL,
              itl_buckets, NB(itl_buckets));
  rc |= fam_b(s, &m->e2e, "qevict_e2e_request_latency_seconds", "From arrival to the end.",
              SM_HISTOGRAM, NULL, latency_buckets, NB(latency_buckets));
  rc |= fam_b(s, &m->queue, "qevict_request_queue_time_seconds",
              "From arrival to dispatch on a worker (requests that started).", SM_HISTOGRAM, NULL,
              latency_buckets, NB(latency_buckets));
  rc |= fam_b(s, &m->tpot, "qevict_request_time_per_output_token_seconds",
              "A finished request's mean time between its generated tokens (two or more).",
              SM_HISTOGRAM, NULL, itl_buckets, NB(itl_buckets));
  rc |= fam_b(s, &m->req_prompt, "qevict_request_prompt_tokens",
              "A finished request's prompt tokens.", SM_HISTOGRAM, NULL, token_buckets,
              NB(token_buckets));
  rc |= fam_b(s, &m->req_gen, "qevict_request_generation_tokens",
              "A finished request's generated tokens.", SM_HISTOGRAM, NULL, token_buckets,
              NB(token_buckets));
  return rc;
}

/* Per tenant (a tenant's series start at 0 with the tenant's first scrape, see tenant_gauges,
 * and go with it: sched_export_tenant_deleted). */
static int tenant_families(sched_t *s, struct smetrics *m) {
  static const char *const t[] = {"tenant", NULL}, *const tr[] = {"tenant", "reason", NULL};
  int rc = 0;
  rc |= fam(s, &m->rejected, "qevict_requests_rejected_total",
            "Generate and Submit calls refused before a request was accepted, by tenant and gRPC "
            "code (invalid_argument, resource_exhausted, already_exists, unavailable, ...).",
            SM_COUNTER, (const char *const[]){"tenant", "code", NULL});
  rc |= fam(s, &m->t_finished, "qevict_tenant_requests_finished_total",
            "A tenant's finished requests by reason.", SM_COUNTER, tr);
  rc |= fam(s, &m->t_prompt, "qevict_tenant_prompt_tokens_total",
            "Prompt tokens of a tenant's started requests.", SM_COUNTER, t);
  rc |= fam(s, &m->t_gen, "qevict_tenant_generation_tokens_total",
            "Tokens generated for a tenant's requests.", SM_COUNTER, t);
  rc |= fam(s, &m->resumes, "qevict_request_resumes_total",
            "Running requests moved to another worker group after theirs went down (each resumes "
            "from the tokens already sent).",
            SM_COUNTER, NULL);
  return rc;
}

static int kv_families(sched_t *s, struct smetrics *m) {
  static const char *const wrk[] = {"worker", "rank", "kind", NULL};
  static const char *const tn[] = {"tenant", "kind", NULL};
  static const char *const tr[] = {"worker", "rank", "from", "to", NULL};
  int rc = 0;
  rc |= fam(s, &m->pool, "qevict_pool_bytes",
            "KV bytes a worker rank holds now by kind (full, int2, other); their sum is what it "
            "uses.",
            SM_GAUGE, wrk);
  rc |= fam(s, &m->pool_cap, "qevict_pool_capacity_bytes",
            "KV bytes of its share a connected worker rank lets the scheduler reserve (its "
            "--pool-bytes).",
            SM_GAUGE, (const char *const[]){"worker", "rank", NULL});
  rc |= fam(s, &m->pool_admit, "qevict_pool_reservable_bytes",
            "Whole-request KV bytes (all ranks) a worker group admits: its ranks' capacities as "
            "whole requests, the smallest; counted in admission since the group was first up.",
            SM_GAUGE, (const char *const[]){"worker", NULL});
  rc |= fam(s, &m->pool_res, "qevict_pool_reserved_bytes",
            "Whole-request KV bytes reserved by the requests running on a worker group (0 while "
            "it is down: they wait for a group).",
            SM_GAUGE, (const char *const[]){"worker", NULL});
  rc |= fam(s, &m->tenant, "qevict_tenant_kv_bytes",
            "KV bytes a tenant's running requests hold now by kind (full, int2, other).", SM_GAUGE,
            tn);
  rc |= fam(s, &m->tenant_quota, "qevict_tenant_kv_quota_bytes", "A tenant's KV quota.", SM_GAUGE,
            (const char *const[]){"tenant", NULL});
  rc |= fam(s, &m->tenant_res, "qevict_tenant_kv_reserved_bytes",
            "KV bytes reserved by a tenant's admitted requests.", SM_GAUGE,
            (const char *const[]){"tenant", NULL});
  rc |= fam(s, &m->transitions, "qevict_window_transitions_total",
            "KV window transitions by (from, to) tier, per worker rank.", SM_COUNTER, tr);
  rc |= fam(s, &m->routing, "qevict_routing_events_total",
            "Routing decisions taken, per worker rank.", SM_COUNTER,
            (const char *const[]){"worker", "rank", NULL});
  rc |= fam(s, &m->w_rss, "qevict_worker_resident_memory_bytes",
            "A worker rank's process's resident memory, as of its last report.", SM_GAUGE,
            (const char *const[]){"worker", "rank", NULL});
  rc |= fam(s, &m->w_cpu, "qevict_worker_cpu_seconds_total",
            "User and system CPU time of a worker rank's process (a restarted one starts again).",
            SM_COUNTER, (const char *const[]){"worker", "rank", NULL});
  return rc;
}

/* The labelled counters whose label values are known start at 0 too (rate() sees their first
 * increment); the per-rank ones start at a rank's first report (sched_export_worker). */
static int zero_counters(struct smetrics *m) {
  static const char *const refused[] = {"tls", "refused"};
  int rc = 0;
  for (int r = 1; r <= 5; r++) rc |= sm_add(m->finished, (const char *const[]){reason_name(r)}, 0);
  for (int i = 0; i < 2; i++) rc |= sm_add(m->refused, &refused[i], 0);
  rc |= sm_add(m->resumes, NULL, 0);
  return rc;
}

/* The scheduler process's own, as Prometheus' client libraries name them, and its version. */
static int process_families(sched_t *s, struct smetrics *m) {
  int rc = 0;
  rc |= fam(s, &m->build, "qevict_build_info", "1, labelled with the scheduler's version.",
            SM_GAUGE, (const char *const[]){"version", NULL});
  rc |= fam(s, &m->cpu, "process_cpu_seconds_total",
            "User and system CPU time the scheduler process spent, seconds.", SM_COUNTER, NULL);
  rc |= fam(s, &m->rss, "process_resident_memory_bytes", "The scheduler's resident memory.",
            SM_GAUGE, NULL);
  rc |= fam(s, &m->vsize, "process_virtual_memory_bytes", "The scheduler's virtual memory.",
            SM_GAUGE, NULL);
  rc |= fam(s, &m->start, "process_start_time_seconds",
            "When the scheduler process started, seconds since the Unix epoch.", SM_GAUGE, NULL);
  rc |=
      fam(s, &m->fds, "process_open_fds", "The scheduler's open file descriptors.", SM_GAUGE, NULL);
  rc |= fam(s, &m->max_fds, "process_max_fds", "The scheduler's limit on open file descriptors.",
            SM_GAUGE, NULL);
  return rc || sm_set(m->build, (const char *const[]){QE_VERSION}, 1) || sm_add(m->cpu, NULL, 0);
}

static int families(sched_t *s, struct smetrics *m) {
  int rc = request_families(s, m) | kv_families(s, m) | tenant_families(s, m);
  rc |= process_families(s, m);
  rc |= fam(s, &m->workers, "qevict_workers", "Worker groups by state.", SM_GAUGE,
            (const char *const[]){"state", NULL});
  rc |= fam(s, &m->calls, "grpc_server_handled_total",
            "gRPC calls the scheduler ended, by type, service, method and the code its client "
            "was sent (Canceled: it ended before its status went out), as gRPC's Prometheus "
            "interceptors count them.",
            SM_COUNTER,
            (const char *const[]){"grpc_type", "grpc_service", "grpc_method", "grpc_code", NULL});
  rc |= fam(s, &m->refused, "qevict_worker_connections_refused_total",
            "Worker connections refused before registering, by reason (tls: the TLS handshake or a "
            "certificate; refused: the scheduler said no).",
            SM_COUNTER, (const char *const[]){"reason", NULL});
  return rc || zero_counters(m);
}

void sched_export_started(sched_t *s, const sreq_t *r) {
  const char *t[1] = {r->tenant};
  sm_add(s->m->prompt_tok, NULL, r->n_prompt);
  if (!r->orphan) sm_add(s->m->t_prompt, t, r->n_prompt);
  sm_observe(s->m->queue, NULL, (double)(r->t_started - r->t_created) * 1e-6);
}

void sched_export_tokens(sched_t *s, const sreq_t *r, size_t n, uint64_t now) {
  const char *t[1] = {r->tenant};
  sm_add(s->m->gen_tok, NULL, (double)n);
  if (!r->orphan) sm_add(s->m->t_gen, t, (double)n);
  if (!r->t_first) {
    sm_observe(s->m->ttft, NULL, (double)(now - r->t_created) * 1e-6);
    return;
  }
  double gap = (double)(now - r->t_last_tok) * 1e-6 / (double)n;
  for (size_t i = 0; i < n; i++) sm_observe(s->m->itl, NULL, gap);
}

void sched_export_finished(sched_t *s, const sreq_t *r) {
  const char *v[1] = {reason_name(r->finish_reason)}, *tv[2] = {r->tenant, v[0]};
  sm_add(s->m->finished, v, 1);
  if (!r->orphan) /* (a deleted tenant's request: its counters went with it) */
    sm_add(s->m->t_finished, tv, 1);
  sm_observe(s->m->e2e, NULL, (double)(r->t_finished - r->t_created) * 1e-6);
  sm_observe(s->m->req_prompt, NULL, (double)r->n_prompt);
  sm_observe(s->m->req_gen, NULL, (double)r->n_gen);
  if (r->n_gen >= 2 && r->t_last_tok > r->t_first)
    sm_observe(s->m->tpot, NULL, (double)(r->t_last_tok - r->t_first) * 1e-6 / (r->n_gen - 1));
}

void sched_export_rejected(sched_t *s, const char *tenant, int code) {
  const char *v[2] = {tenant, qe_grpc_code_name(code, 1)};
  sm_add(s->m->rejected, v, 1);
}

/* Drops a deleted tenant's counters (tenants that come and go would pile them up for good; a
 * tenant created again under the id starts at 0, which Prometheus reads as a counter reset). */
void sched_export_tenant_deleted(sched_t *s, const char *tenant) {
  const char *t[1] = {tenant};
  sm_remove(s->m->t_prompt, t);
  sm_remove(s->m->t_gen, t);
  for (int r = 0; r <= 5; r++)
    sm_remove(s->m->t_finished, (const char *const[]){tenant, reason_name(r)});
  for (int c = 0; c <= 16; c++)
    sm_remove(s->m->rejected, (const char *const[]){tenant, qe_grpc_code_name(c, 1)});
}

void sched_export_resumed(sched_t *s) { sm_add(s->m->resumes, NULL, 1); }

void sched_export_call(sched_t *s, const char *path, int streaming, int status, int count) {
  char service[128] = "unknown";
  const char *method = "unknown", *slash = path ? strrchr(path, '/') : NULL;
  if (slash && slash > path && (size_t)(slash - path) < sizeof service)
    snprintf(service, sizeof service, "%.*s", (int)(slash - path - 1), path + 1),
        method = slash + 1;
  const char *v[4] = {!path       ? "unknown"
                      : streaming ? "server_stream"
                                  : "unary",
                      service, method, qe_grpc_code_name(status, 2)};
  sm_add(s->m->calls, v, count ? 1 : 0);
}

void sched_export_worker_refused(sched_t *s, const char *reason) {
  const char *v[1] = {reason};
  sm_add(s->m->refused, v, 1);
}

/* Cumulative worker counters become counter increments (a restarted worker starts at 0); the
 * series exists from a rank's first report, at 0 if nothing happened yet. */
static void counter_step(sm_fam_t *f, const char *const *v, uint64_t *last, uint64_t now,
                         double unit) {
  uint64_t d = now >= *last ? now - *last : now;
  *last = now;
  sm_add(f, v, (double)d * unit);
}

void sched_export_worker(sched_t *s, const sgroup_t *g, int rank,
                         const Qevict__Worker__V1__MemoryReport *m) {
  char k[16];
  snprintf(k, sizeof k, "%d", rank);
  uint64_t *last = ((sgroup_t *)g)->rank[rank].transitions;
  const char *p[4] = {g->name, k, "int2", "full"}, *d[4] = {g->name, k, "full", "int2"},
             *e[4] = {g->name, k, "resident", "evicted"}, *r[2] = {g->name, k};
  counter_step(s->m->transitions, p, &last[0], m->promotions, 1);
  counter_step(s->m->transitions, d, &last[1], m->demotions, 1);
  counter_step(s->m->transitions, e, &last[2], m->evictions, 1);
  counter_step(s->m->routing, r, &last[3], m->routing_events, 1);
  if (m->process_rss_bytes) /* (0: a worker that could not read /proc) */
    counter_step(s->m->w_cpu, r, &((sgroup_t *)g)->rank[rank].cpu_us, m->process_cpu_us, 1e-6);
}

static void set3(sm_fam_t *f, const char *a, const char *b, const char *c, double v) {
  const char *vals[3] = {a, b, c};
  sm_set(f, vals, v);
}

/* A group's gauges, whether it is up or not: its ranks' capacities (of those that ever
 * connected), what it admits (counted in admission once it was up, down or not) and what it has
 * reserved (0 while down); the bytes its ranks hold only while it is up (their reports). */
static void group_gauges(struct smetrics *m, const sgroup_t *g) {
  for (int k = 0; k < g->tp_size; k++) {
    const srank_t *rk = &g->rank[k];
    char rank[16];
    snprintf(rank, sizeof rank, "%d", k);
    if (rk->pool_bytes) set3(m->pool_cap, g->name, rank, NULL, (double)rk->pool_bytes);
    if (!g->up) continue;
    set3(m->pool, g->name, rank, "full", (double)rk->full);
    set3(m->pool, g->name, rank, "int2", (double)rk->int2);
    set3(m->pool, g->name, rank, "other", (double)rk->other);
    if (rk->rss) set3(m->w_rss, g->name, rank, NULL, (double)rk->rss);
  }
  if (g->ever_up) set3(m->pool_admit, g->name, NULL, NULL, (double)g->pool_bytes);
  set3(m->pool_res, g->name, NULL, NULL, (double)g->reserved);
}

static void pool_gauges(sched_t *s) {
  struct smetrics *m = s->m;
  sm_clear(m->pool), sm_clear(m->pool_cap), sm_clear(m->pool_admit), sm_clear(m->pool_res);
  sm_clear(m->w_rss);
  int up = 0, down = 0, draining = 0, stopping = 0;
  for (sgroup_t *g = s->groups; g; g = g->next) {
    up += g->up && !g->draining && !g->leaving, down += !g->up;
    draining += g->up && g->draining, stopping += g->up && g->leaving && !g->draining;
    group_gauges(m, g);
  }
  const char *su[1] = {"up"}, *sd[1] = {"down"}, *sr[1] = {"draining"}, *ss[1] = {"stopping"};
  sm_set(m->workers, su, up);
  sm_set(m->workers, sd, down);
  sm_set(m->workers, sr, draining);
  sm_set(m->workers, ss, stopping);
}

/* A tenant's counters exist from its first scrape, at 0 (rate() sees their first increment). */
static void tenant_zero(struct smetrics *m, const char *tenant) {
  const char *t[1] = {tenant};
  sm_add(m->t_prompt, t, 0);
  sm_add(m->t_gen, t, 0);
  for (int r = 1; r <= 5; r++)
    sm_add(m->t_finished, (const char *const[]){tenant, reason_name(r)}, 0);
}

static void tenant_gauges(sched_t *s) {
  struct smetrics *m = s->m;
  sm_clear(m->tenant), sm_clear(m->tenant_quota), sm_clear(m->tenant_res);
  sched_tenant_t *all = NULL;
  size_t n = 0;
  if (sched_tenants_list(s->tenants, &all, &n)) return;
  for (size_t i = 0; i < n; i++) {
    sched_admit_tenant_stats_t ts = {0};
    sched_admit_tenant_stats(s->admit, all[i].id, &ts);
    double full = 0, int2 = 0, other = 0;
    for (sreq_t *r = s->reqs; r; r = r->next_all) {
      if (r->state != SREQ_RUNNING || r->orphan || strcmp(r->tenant, all[i].id)) continue;
      Qevict__V1__MemorySummary mem;
      sched_req_memory(r, &mem);
      full += (double)mem.full_bytes, int2 += (double)mem.int2_bytes;
      other += (double)(mem.bytes - mem.full_bytes - mem.int2_bytes);
    }
    set3(m->tenant_quota, all[i].id, NULL, NULL, (double)all[i].kv_quota_bytes);
    set3(m->tenant_res, all[i].id, NULL, NULL, (double)ts.reserved_bytes);
    set3(m->tenant, all[i].id, "full", NULL, full);
    set3(m->tenant, all[i].id, "int2", NULL, int2);
    set3(m->tenant, all[i].id, "other", NULL, other);
    tenant_zero(m, all[i].id);
  }
  free(all);
}

static void request_gauges(sched_t *s) {
  double running = 0, waiting = 0;
  for (sreq_t *r = s->reqs; r; r = r->next_all)
    running += r->state == SREQ_RUNNING, waiting += r->state == SREQ_QUEUED;
  sm_set(s->m->running, NULL, running);
  sm_set(s->m->waiting, NULL, waiting);
}

/* At each scrape (a /proc read failing leaves the last values). */
static void process_gauges(struct smetrics *m) {
  qe_proc_stats_t p;
  if (qe_proc_stats(&p)) {
    qe_log(QE_LOG_WARN, "metrics: %s", qe_errmsg());
    return;
  }
  if (p.cpu_seconds > m->cpu_last) sm_add(m->cpu, NULL, p.cpu_seconds - m->cpu_last);
  m->cpu_last = p.cpu_seconds > m->cpu_last ? p.cpu_seconds : m->cpu_last;
  sm_set(m->rss, NULL, (double)p.rss_bytes);
  sm_set(m->vsize, NULL, (double)p.vsize_bytes);
  sm_set(m->start, NULL, p.start_time);
  if (p.open_fds) sm_set(m->fds, NULL, (double)p.open_fds);
  if (p.max_fds) sm_set(m->max_fds, NULL, (double)p.max_fds);
}

static void text(sh_response_t *resp, int status, const char *body) {
  resp->status = status;
  resp->content_type = "text/plain; charset=utf-8";
  resp->body = strdup(body);
  resp->len = resp->body ? strlen(body) : 0;
}

static void on_http(void *ud, const char *method, const char *path, sh_response_t *resp) {
  sched_t *s = ud;
  (void)method;
  if (!strcmp(path, "/healthz")) {
    /* (as gRPC Health says: a scheduler whose every group drains takes no request) */
    char why[160];
    const int ok = sched_groups_accepting(s);
    snprintf(why, sizeof why, "%s\n",
             ok           ? "ok"
             : s->closing ? "shutting down: finishing the accepted requests"
                          : sched_groups_closed_why(s));
    text(resp, ok ? 200 : 503, why);
    return;
  }
  if (strcmp(path, "/metrics")) {
    text(resp, 404, "not found\n");
    return;
  }
  request_gauges(s);
  pool_gauges(s);
  tenant_gauges(s);
  process_gauges(s->m);
  char *out = NULL;
  size_t len = 0;
  if (sm_render(s->metrics, &out, &len)) {
    text(resp, 500, "render failed\n");
    return;
  }
  resp->status = 200;
  resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
  resp->body = out;
  resp->len = len;
}

int sched_export_start(sched_t *s) {
  int rc = sm_create(&s->metrics);
  if (!rc && !(s->m = calloc(1, sizeof *s->m))) rc = qe_errf(QE_ENOMEM, "out of memory");
  if (!rc && families(s, s->m)) rc = qe_errf(QE_EINVAL, "metrics: bad family");
  if (!rc && s->cfg.metrics_listen && *s->cfg.metrics_listen) {
    sh_options_t opt = {0};
    if (s->cfg.metrics_tls)
      opt.tls_cert = s->cfg.tls_cert, opt.tls_key = s->cfg.tls_key,
      opt.tls_client_ca = s->cfg.tls_client_ca;
    rc = sh_server_create_opts(s->loop, s->cfg.metrics_listen, &opt, on_http, s, &s->http);
  }
  return rc;
}

void sched_export_stop(sched_t *s) {
  if (s->http) sh_server_close(s->http);
  s->http = NULL;
  sm_destroy(s->metrics);
  s->metrics = NULL;
  free(s->m);
  s->m = NULL;
}
