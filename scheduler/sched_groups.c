/* sched_groups: the workers as the scheduler sees them. Ranks connect over the transport and
 * introduce themselves (group, rank, tp_size, pool bytes); a group is up once all its ranks are
 * connected. Requests are dispatched to rank 0 of the up group with the most free bytes (and a
 * free sequence slot); rank 0 streams their tokens back. Every rank reports the memory of its
 * share of the KV heads; a request finishes when rank 0 says so and every other rank of the
 * group has sent its final figures (RequestFinished), which the summary sums. A group that
 * loses a rank is down: a request only waiting for its ranks' figures finishes as it is; its
 * other running requests go back to the front of the dispatch list and resume elsewhere from
 * the scheduler's copy of their prompt and the tokens already sent (StartRequest.resume_ids), so
 * the client sees neither a gap nor a repeat. Pool bytes of every group ever seen count in
 * admission (a restarting worker does not make requests unfittable). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_log.h"
#include "qe_pem.h"
#include "qe_status.h"
#include "qe_tls.h"
#include "sched_internal.h"

#define ENV(x) QEVICT__WORKER__V1__ENVELOPE__MSG_##x

static char g_fingerprint[MODEL_FP_LEN + 1];

static sgroup_t *group_find(sched_t *s, const char *name) {
  for (sgroup_t *g = s->groups; g; g = g->next)
    if (!strcmp(g->name, name)) return g;
  return NULL;
}

static sgroup_t *group_of(tr_conn_t *c, int *rank) {
  const tr_hello_t *h = tr_conn_hello(c);
  sgroup_t *g = tr_conn_data(c);
  if (h && rank) *rank = (int)h->rank;
  return g && h && g->rank[h->rank].conn == c ? g : NULL;
}

static void update_pool(sched_t *s) {
  int64_t pool = 0;
  for (sgroup_t *g = s->groups; g; g = g->next)
    if (g->ever_up) pool += g->pool_bytes;
  sched_admit_set_pool(s->admit, pool);
}

/* 1 if Hello.device strings a and b name one kind of device: "cuda:N" for any N, else the
 * whole name ("cpu", "cpu-packed": CPU ranks holding 8-bit weights). */
static int same_device_kind(const char *a, const char *b) {
  size_t na = strchr(a, ':') ? (size_t)(strchr(a, ':') - a) : strlen(a);
  size_t nb = strchr(b, ':') ? (size_t)(strchr(b, ':') - b) : strlen(b);
  return na == nb && !strncmp(a, b, na);
}

/* Every rank of the scheduler runs on one kind of device with one kind of weights: a request
 * resumed on another group after a fault must give the tokens it would have given. */
static int check_device(const sched_t *s, const tr_hello_t *h) {
  for (const sgroup_t *g = s->groups; g; g = g->next)
    for (int r = 0; r < g->tp_size; r++) {
      const char *d = g->rank[r].device;
      if (*d && !same_device_kind(d, h->device ? h->device : ""))
        return qe_errf(QE_EINVAL,
                       "device %s: this scheduler's workers run on %s (one kind of "
                       "device and weights a scheduler)",
                       h->device, d);
    }
  return 0;
}

/* The groups with a rank connected run one tensor-parallel size: a request's budget bounds (the
 * split over the ranks' KV heads, sched_validate) and a resumed request's tokens depend on it.
 * Groups with no rank connected do not count (a stray worker's, or a fleet's before it moved to
 * another --tp); a rank of an existing group is checked against its group in on_hello. */
static int check_tp(const sched_t *s, const tr_hello_t *h) {
  for (const sgroup_t *g = s->groups; g; g = g->next)
    if (g->n_conn && g->tp_size != (int)h->tp_size && strcmp(g->name, h->group))
      return qe_errf(QE_EINVAL,
                     "tp_size %u: this scheduler's groups run tp %d (one tensor-parallel size a "
                     "scheduler)",
                     h->tp_size, g->tp_size);
  return 0;
}

static int check_hello(sched_t *s, const tr_hello_t *h) {
  if (strcmp(h->model_fingerprint, g_fingerprint))
    return qe_errf(QE_EINVAL, "model fingerprint %.40s differs from the scheduler's %s",
                   h->model_fingerprint, g_fingerprint);
  if (!h->tp_size || h->tp_size > SREQ_MAX_RANKS || h->rank >= h->tp_size)
    return qe_errf(QE_EINVAL, "rank %u of %u is out of range", h->rank, h->tp_size);
  if (!*h->group || strlen(h->group) >= sizeof((sgroup_t *)0)->name)
    return qe_errf(QE_EINVAL, "group name must be 1..63 bytes");
  if (h->context_length < (uint32_t)s->hp.n_ctx_train)
    return qe_errf(QE_EINVAL, "context length %u below the model's %d", h->context_length,
                   s->hp.n_ctx_train);
  if (!h->max_sequences) return qe_errf(QE_EINVAL, "max_sequences is 0");
  int rc = check_tp(s, h);
  return rc ? rc : check_device(s, h);
}

static int on_hello(tr_conn_t *c, const tr_hello_t *h, tr_hello_ack_t *ack) {
  sched_t *s = tr_conn_ud(c);
  int rc = check_hello(s, h);
  if (rc) return rc;
  sgroup_t *g = group_find(s, h->group);
  if (g && g->tp_size != (int)h->tp_size)
    return qe_errf(QE_EINVAL, "group %s has tp_size %d, not %u", g->name, g->tp_size, h->tp_size);
  if (g && g->rank[h->rank].conn && g->leaving) /* (its worker is in its shutdown grace) */
    return qe_errf(QE_EBUSY, "rank %u of group %s is still held by a stopping worker", h->rank,
                   g->name);
  if (g && g->rank[h->rank].conn)
    return qe_errf(QE_EINVAL, "rank %u of group %s is already connected", h->rank, g->name);
  if (!g) {
    if (!(g = calloc(1, sizeof *g))) return qe_errf(QE_ENOMEM, "out of memory");
    snprintf(g->name, sizeof g->name, "%s", h->group);
    snprintf(g->worker_id, sizeof g->worker_id, "%s", h->group);
    g->tp_size = (int)h->tp_size;
    g->next = s->groups;
    s->groups = g;
  }
  tr_conn_set_data(c, g);
  ack->worker_id = g->worker_id;
  ack->heartbeat_ms = 1000;
  return 0;
}

/* The whole-request bytes g's pools hold: each rank holds its share (model_kv_share, by KV
 * heads) in its own pool, so the rank that fills first bounds the group (under an even split
 * and equal pools, the sum of the pools). */
static int64_t group_pool(const sched_t *s, const sgroup_t *g) {
  uint64_t pool = UINT64_MAX, sum = 0;
  for (int k = 0; k < g->tp_size; k++) {
    const uint64_t p = tr_conn_hello(g->rank[k].conn)->pool_bytes;
    model_shard_t sh;
    sum += p;
    if (model_shard_of(&s->hp, k, g->tp_size, &sh)) return (int64_t)sum; /* (not this model's) */
    const uint64_t whole = model_kv_within(&s->hp, &sh, p);
    pool = whole < pool ? whole : pool;
  }
  return (int64_t)(pool < sum ? pool : sum);
}

static void group_up(sched_t *s, sgroup_t *g) {
  int64_t pool = group_pool(s, g);
  int seqs = 1 << 30;
  uint64_t bpt = 0;
  uint32_t ctx = UINT32_MAX, page = 1;
  for (int k = 0; k < g->tp_size; k++) {
    const tr_hello_t *h = tr_conn_hello(g->rank[k].conn);
    seqs = (int)h->max_sequences < seqs ? (int)h->max_sequences : seqs;
    bpt += h->full_kv_bytes_per_token;
    page = h->full_kv_page_tokens > page ? h->full_kv_page_tokens : page;
    ctx = h->context_length < ctx ? h->context_length : ctx;
  }
  g->pool_bytes = pool, g->max_seqs = seqs, g->bytes_per_token = bpt, g->context_length = ctx;
  g->page_tokens = page;
  g->up = 1, g->ever_up = 1, g->reserved = 0, g->n_running = 0, g->leaving = 0;
  qe_log(QE_LOG_INFO, "sched: group %s up (%d ranks, pool %lld bytes, %d sequences)", g->name,
         g->tp_size, (long long)pool, seqs);
  update_pool(s);
  sched_req_end_over_groups(s); /* (a group that came back smaller) */
  sched_health_changed(s);
  sched_groups_pump(s);
}

static void on_open(tr_conn_t *c) {
  sched_t *s = tr_conn_ud(c);
  sgroup_t *g = tr_conn_data(c);
  const tr_hello_t *h = tr_conn_hello(c);
  srank_t *rk = &g->rank[h->rank];
  /* the same worker back on a new link (a heartbeat timeout, a network blip) reports the same
     cumulative counters (and CPU time): the last seen stay, or its whole history was counted
     again */
  uint64_t seen[4], cpu_us = rk->cpu_us, start = rk->start_ticks;
  const int same = !strcmp(rk->name, h->name);
  memcpy(seen, rk->transitions, sizeof seen);
  memset(rk, 0, sizeof *rk);
  if (same) /* (a new process under the old name: sched_rank_process, at its first report) */
    memcpy(rk->transitions, seen, sizeof seen), rk->cpu_us = cpu_us, rk->start_ticks = start;
  rk->conn = c;
  rk->pool_bytes = h->pool_bytes;
  snprintf(rk->name, sizeof rk->name, "%s", h->name);
  snprintf(rk->device, sizeof rk->device, "%s", h->device);
  qe_log(QE_LOG_INFO, "sched: worker %s (group %s rank %u/%u, %s) connected from %s", h->name,
         g->name, h->rank, h->tp_size, h->device, tr_conn_peer(c));
  if (++g->n_conn == g->tp_size) group_up(s, g);
}

/* Requests of g that rank 0 finished but other ranks had not reported yet, and those ending
 * (stopped by a stop string, cancelled), finish now, with rank 0's outcome (or the ending's)
 * and the figures they have (they are done: never resumed). */
static void finish_waiting(sched_t *s, sgroup_t *g) {
  for (sreq_t *r = s->reqs; r; r = r->next_all)
    if (r->group == g && r->state == SREQ_RUNNING && ((r->fin_ranks & 1) || r->ending))
      sched_req_finish(s, r, r->fin_reason, r->fin_error, 0);
}

/* r, running on g as g went down, goes back to the front of the dispatch list (*head, *tail: the
 * ones already sent back, in order). A down in g's own stop (its shutdown grace over) is no
 * fault of r's; any other counts against --max-resumes (faults). */
static void send_back(sched_t *s, sgroup_t *g, sreq_t *r, sreq_t **head, sreq_t **tail) {
  r->group = NULL;
  r->state = SREQ_QUEUED;
  r->resumes++;
  r->faults += !g->leaving;
  sched_export_resumed(s);
  memset(r->mem, 0, sizeof r->mem);
  r->fin_ranks = 0;
  r->dispatch_wait = 1;
  r->next_wait = NULL;
  if (*tail)
    (*tail)->next_wait = r;
  else
    *head = r;
  *tail = r;
}

/* r, running on g as g went down in a fault, after --max-resumes such faults: it ends with an
 * error (a request that brings down every worker it runs on, a crash or a GPU fault of its
 * own, had taken each group down in turn, and each group's other requests with it, for good). */
static void out_of_resumes(sched_t *s, sgroup_t *g, sreq_t *r) {
  char why[256];
  snprintf(why, sizeof why,
           "its worker group went down while it ran, %d time(s) (the last: group %s); "
           "--max-resumes %u: not run again",
           r->faults + 1, g->name, s->cfg.max_resumes);
  qe_log(QE_LOG_WARN, "sched: request %s: %s", r->id_str, why);
  sched_req_finish(s, r, QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR, why, 0);
}

/* The group lost a rank: its requests go back to the front of the dispatch list; those out of
 * resumes end after that (their ends may dispatch others: not ahead of the ones sent back). */
static void group_down(sched_t *s, sgroup_t *g) {
  const int had = g->n_running;
  int ended = 0;
  g->up = 0;
  finish_waiting(s, g);
  sreq_t *head = NULL, *tail = NULL;
  for (sreq_t *r = s->reqs; r; r = r->next_all)
    if (r->group == g && r->state == SREQ_RUNNING &&
        (g->leaving || (unsigned)r->faults < s->cfg.max_resumes))
      send_back(s, g, r, &head, &tail);
  if (head) {
    tail->next_wait = s->wait_head;
    s->wait_head = head;
    if (!s->wait_tail) s->wait_tail = tail;
  }
  for (sreq_t *r = s->reqs; r; r = r->next_all)
    if (r->group == g && r->state == SREQ_RUNNING) out_of_resumes(s, g, r), ended++;
  g->reserved = 0, g->n_running = 0;
  if (g->leaving && !had)
    qe_log(QE_LOG_INFO, "sched: group %s stopped (its shutdown)", g->name);
  else
    qe_log(QE_LOG_WARN, "sched: group %s down; its %d running request(s) resume elsewhere%s",
           g->name, had - ended, ended ? " (the others were out of resumes)" : "");
  for (int k = 0; k < g->tp_size; k++)
    if (g->rank[k].conn) tr_close(g->rank[k].conn); /* the group restarts as a whole */
  sched_health_changed(s);
  sched_groups_pump(s);
  sched_req_end_queued_if_drained(s); /* (a draining group's requests had nowhere to resume) */
}

static void on_close(tr_conn_t *c, int reason, const char *detail) {
  sched_t *s = tr_conn_ud(c);
  int rank = 0;
  sgroup_t *g = group_of(c, &rank);
  if (!g && reason == TR_CLOSE_BUSY)
    qe_log(QE_LOG_INFO, "sched: a worker waits for its place: %s", detail);
  if (!g && (reason == TR_CLOSE_TLS || reason == TR_CLOSE_REFUSED)) {
    qe_log(QE_LOG_WARN, "sched: a worker connection failed: %s (%s)", tr_close_reason_str(reason),
           detail);
    sched_export_worker_refused(s, reason == TR_CLOSE_TLS ? "tls" : "refused");
  }
  if (!g) return;
  qe_log(g->leaving ? QE_LOG_INFO : QE_LOG_WARN, "sched: worker %s (group %s rank %d) %s: %s (%s)",
         g->rank[rank].name, g->name, rank, g->leaving ? "left (it was stopping)" : "gone",
         tr_close_reason_str(reason), detail);
  g->rank[rank].conn = NULL;
  g->n_conn--;
  if (g->up) group_down(s, g);
}

static void copy_mem(smem_t *m, const Qevict__Worker__V1__MemorySummary *w) {
  if (!w) return;
  uint64_t v[18] = {w->budget_bytes,    w->bytes,
                    w->peak_bytes,      w->full_bytes,
                    w->int2_bytes,      w->sink_bytes,
                    w->meta_bytes,      w->windows_full,
                    w->windows_int2,    w->windows_evicted,
                    w->promotions,      w->demotions,
                    w->evictions,       w->quantizations,
                    w->routing_events,  w->peak_transient_bytes,
                    w->workspace_bytes, 0};
  memcpy(m->v, v, sizeof v);
  m->have = 1;
}

static sreq_t *running_on(sched_t *s, sgroup_t *g, uint64_t id) {
  sreq_t *r = sched_req_find(s, id);
  return r && r->group == g && r->state == SREQ_RUNNING ? r : NULL;
}

static int reason_of(int w) {
  switch (w) {
  case QEVICT__WORKER__V1__FINISH_REASON__FINISH_REASON_LENGTH:
    return QEVICT__V1__FINISH_REASON__FINISH_REASON_LENGTH;
  case QEVICT__WORKER__V1__FINISH_REASON__FINISH_REASON_EOS:
    return QEVICT__V1__FINISH_REASON__FINISH_REASON_EOS;
  case QEVICT__WORKER__V1__FINISH_REASON__FINISH_REASON_CANCELLED:
    return QEVICT__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
  default:
    return QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR;
  }
}

/* Whether every rank of g has sent r's RequestFinished. */
static int all_finished(const sgroup_t *g, const sreq_t *r) {
  uint64_t all = g->tp_size >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << g->tp_size) - 1;
  return (r->fin_ranks & all) == all;
}

/* A rank's RequestFinished: its final memory; rank 0's carries the outcome too (kept while the
 * other ranks' figures are awaited). An error finishes at once: a failed start never reached
 * the other ranks. */
static void on_finished(sched_t *s, sgroup_t *g, int rank,
                        const Qevict__Worker__V1__RequestFinished *f) {
  sreq_t *r = running_on(s, g, f->request_id);
  if (!r) return;
  copy_mem(&r->mem[rank], f->memory);
  r->fin_ranks |= (uint64_t)1 << rank;
  if (rank == 0) {
    r->fin_reason = reason_of(f->reason);
    snprintf(r->fin_error, sizeof r->fin_error, "%s", f->error ? f->error : "");
  }
  if (!(r->fin_ranks & 1)) return;
  int err = r->fin_reason == QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR;
  if (err && rank == 0)
    qe_log(QE_LOG_ERROR, "sched: request %s failed on %s: %s", r->id_str, g->name, r->fin_error);
  if (err || all_finished(g, r)) sched_req_finish(s, r, r->fin_reason, r->fin_error, 0);
}

void sched_rank_process(srank_t *rk, const Qevict__Worker__V1__MemoryReport *m) {
  if (!m->process_start_ticks || m->process_start_ticks == rk->start_ticks) return;
  if (rk->start_ticks) memset(rk->transitions, 0, sizeof rk->transitions), rk->cpu_us = 0;
  rk->start_ticks = m->process_start_ticks;
}

static void on_report(sched_t *s, sgroup_t *g, int rank,
                      const Qevict__Worker__V1__MemoryReport *m) {
  srank_t *rk = &g->rank[rank];
  sched_rank_process(rk, m);
  rk->full = m->full_bytes, rk->int2 = m->int2_bytes, rk->other = m->other_bytes;
  if (m->process_rss_bytes) rk->rss = m->process_rss_bytes;
  sched_export_worker(s, g, rank, m);
  for (size_t i = 0; i < m->n_requests; i++) {
    sreq_t *r = running_on(s, g, m->requests[i]->request_id);
    if (r) copy_mem(&r->mem[rank], m->requests[i]->memory);
  }
}

/* A rank of g is stopping (its shutdown grace): g takes no new requests; its running ones
 * finish there, or resume elsewhere if the group goes down first. */
static void on_leaving(sched_t *s, sgroup_t *g, int rank) {
  if (g->leaving) return;
  g->leaving = 1;
  qe_log(QE_LOG_INFO,
         "sched: worker %s (group %s rank %d) is stopping: the group takes no new requests%s",
         g->rank[rank].name, g->name, rank,
         g->n_running ? "; its running requests may finish" : "");
  if (rank && g->up) { /* (rank 0 ends the group: then the follower stops) */
    Qevict__Worker__V1__Drain d = QEVICT__WORKER__V1__DRAIN__INIT;
    tr_env_t env = QEVICT__WORKER__V1__ENVELOPE__INIT;
    d.stop = 1;
    env.msg_case = ENV(DRAIN), env.drain = &d;
    tr_send(g->rank[0].conn, &env);
  }
  sched_health_changed(s);
}

static void on_message(tr_conn_t *c, const tr_env_t *m) {
  sched_t *s = tr_conn_ud(c);
  int rank = 0;
  sgroup_t *g = group_of(c, &rank);
  if (!g) return;
  switch (m->msg_case) {
  case ENV(TOKEN_BATCH): {
    sreq_t *r = rank == 0 ? running_on(s, g, m->token_batch->request_id) : NULL;
    if (r)
      sched_req_tokens(s, r, m->token_batch->token_ids, m->token_batch->n_token_ids,
                       m->token_batch->offset);
    break;
  }
  case ENV(REQUEST_FINISHED):
    on_finished(s, g, rank, m->request_finished);
    break;
  case ENV(MEMORY_REPORT):
    on_report(s, g, rank, m->memory_report);
    break;
  case ENV(DRAIN):
    on_leaving(s, g, rank);
    break;
  case ENV(ERROR):
    qe_log(QE_LOG_WARN, "sched: worker %s: error %d: %s", g->rank[rank].name, m->error->code,
           m->error->message);
    break;
  default:
    qe_log(QE_LOG_WARN, "sched: worker %s sent an unexpected message (%d)", g->rank[rank].name,
           m->msg_case);
  }
}

/* The worker link's TLS context from the configured files (checked first, naming the flags). */
static int worker_tls(sched_t *s) {
  const sched_config_t *c = &s->cfg;
  int rc = qe_check_pem(c->worker_tls_cert, "--worker-tls-cert", "CERTIFICATE");
  if (!rc) rc = qe_check_pem(c->worker_tls_key, "--worker-tls-key", "PRIVATE KEY");
  if (!rc) rc = qe_check_pem(c->worker_tls_ca, "--worker-tls-ca", "CERTIFICATE");
  if (!rc)
    rc = qe_tls_server_ctx("worker tls", c->worker_tls_cert, c->worker_tls_key, c->worker_tls_ca,
                           &s->worker_tls);
  return rc;
}

/* Whether addr (a --worker-listen address) is reachable from this host only: a Unix socket,
 * or loopback. */
static int local_only(const char *addr) {
  return !strncmp(addr, "unix:", 5) || !strncmp(addr, "127.", 4) || !strncmp(addr, "[::1]", 5) ||
         !strncmp(addr, "localhost:", 10);
}

int sched_groups_listen(sched_t *s) {
  int rc = model_fingerprint(s->cfg.model, g_fingerprint);
  if (rc) return rc;
  if (s->cfg.worker_tls_cert && (rc = worker_tls(s))) return rc;
  if (!s->cfg.worker_tls_cert && !local_only(s->cfg.worker_listen))
    qe_log(QE_LOG_WARN,
           "sched: the worker link on %s is plaintext and unauthenticated: any host that reaches "
           "it with the model's file can register as a worker and receive the tenants' prompts "
           "(--worker-tls-cert, --worker-tls-key and --worker-tls-ca make it mutual TLS)",
           s->cfg.worker_listen);
  tr_options_t opt = {0};
  opt.tls = s->worker_tls;
  opt.timeout_ms = s->cfg.worker_timeout_ms;
  tr_callbacks_t cb = {s, on_hello, on_open, on_message, on_close};
  return tr_listen(s->loop, s->cfg.worker_listen, &opt, &cb, &s->workers);
}

/* ---- dispatch ---- */

static sgroup_t *best_group(sched_t *s, const sreq_t *r) {
  sgroup_t *best = NULL;
  for (sgroup_t *g = s->groups; g; g = g->next) {
    if (!g->up || g->draining || g->leaving || g->n_running >= g->max_seqs) continue;
    if (g->pool_bytes - g->reserved < r->budget) continue;
    if (!best || g->pool_bytes - g->reserved > best->pool_bytes - best->reserved) best = g;
  }
  return best;
}

static int send_start(sgroup_t *g, sreq_t *r) {
  Qevict__Worker__V1__StartRequest st = QEVICT__WORKER__V1__START_REQUEST__INIT;
  st.request_id = r->id;
  st.prompt_ids = (uint32_t *)r->prompt, st.n_prompt_ids = (size_t)r->n_prompt;
  st.max_tokens = (uint32_t)r->max_tokens;
  st.sampling = &r->sampling;
  st.budget_bytes = (uint64_t)r->budget;
  st.policy = &r->wpolicy;
  st.ignore_eos = r->ignore_eos;
  st.resume_ids = (uint32_t *)r->gen, st.n_resume_ids = (size_t)r->n_gen;
  tr_env_t env = QEVICT__WORKER__V1__ENVELOPE__INIT;
  env.msg_case = ENV(START_REQUEST), env.start_request = &st;
  return tr_send(g->rank[0].conn, &env);
}

int sched_groups_dispatch(sched_t *s, sreq_t *r) {
  sgroup_t *g = best_group(s, r);
  if (!g) return 0;
  if (send_start(g, r)) {
    qe_log(QE_LOG_WARN, "sched: dispatch of %s to %s failed: %s", r->id_str, g->name, qe_errmsg());
    return 0;
  }
  if (r->resumes)
    qe_log(QE_LOG_WARN, "sched: request %s resumes on %s after %d tokens", r->id_str, g->name,
           r->n_gen);
  r->group = g;
  r->dispatch_wait = 0;
  r->fin_ranks = 0;
  g->reserved += r->budget;
  g->n_running++;
  sched_req_started(s, r);
  return 1;
}

void sched_groups_pump(sched_t *s) {
  sreq_t **p = &s->wait_head, *prev = NULL;
  while (*p) {
    sreq_t *r = *p;
    if (!sched_groups_dispatch(s, r)) {
      prev = r;
      p = &r->next_wait;
      continue;
    }
    *p = r->next_wait;
    r->next_wait = NULL;
    if (s->wait_tail == r) s->wait_tail = prev;
  }
}

int sched_groups_cancel(sched_t *s, sreq_t *r) {
  (void)s;
  sgroup_t *g = r->group;
  if (!g || !g->up || !g->rank[0].conn) return 0;
  Qevict__Worker__V1__CancelRequest c = QEVICT__WORKER__V1__CANCEL_REQUEST__INIT;
  c.request_id = r->id;
  c.reason = "cancelled";
  tr_env_t env = QEVICT__WORKER__V1__ENVELOPE__INIT;
  env.msg_case = ENV(CANCEL_REQUEST), env.cancel_request = &c;
  return tr_send(g->rank[0].conn, &env) == 0;
}

void sched_groups_release(sched_t *s, sreq_t *r) {
  (void)s;
  sgroup_t *g = r->group;
  if (!g || !g->up) return;
  g->reserved -= r->budget;
  g->n_running--;
}

int sched_groups_up(const sched_t *s) {
  int n = 0;
  for (const sgroup_t *g = s->groups; g; g = g->next) n += g->up;
  return n;
}

int sched_groups_serving(const sched_t *s) {
  int n = 0;
  for (const sgroup_t *g = s->groups; g; g = g->next) n += g->up && !g->draining && !g->leaving;
  return n;
}

const char *sched_groups_closed_why(const sched_t *s) {
  int leaving = 0;
  for (const sgroup_t *g = s->groups; g; g = g->next) leaving += g->up && g->leaving;
  if (!sched_groups_up(s)) return "no worker group is up";
  if (leaving)
    return "every worker is stopping or draining: none takes new requests until one starts "
           "again";
  return "every worker is draining (qevict drain): none takes new requests until the scheduler "
         "restarts";
}

int sched_groups_accepting(const sched_t *s) {
  return !s->stopping && !s->closing && sched_groups_serving(s);
}

int sched_groups_drained(const sched_t *s) {
  for (const sgroup_t *g = s->groups; g; g = g->next)
    if (!g->draining) return 0;
  return s->groups != NULL;
}

uint64_t sched_groups_full_kv_bytes(const sched_t *s, long n) {
  for (const sgroup_t *g = s->groups; g; g = g->next)
    if (g->ever_up) {
      const uint64_t page = g->page_tokens > 1 ? g->page_tokens : 1;
      return g->bytes_per_token * (((uint64_t)n + page - 1) / page * page);
    }
  return 0; /* no group yet: requests are refused as UNAVAILABLE before they get here */
}

int sched_groups_tp(const sched_t *s) {
  for (const sgroup_t *g = s->groups; g; g = g->next)
    if (g->n_conn) return g->tp_size;
  return s->groups ? s->groups->tp_size : 1;
}

int64_t sched_groups_largest_pool(const sched_t *s) {
  int64_t most = 0;
  for (const sgroup_t *g = s->groups; g; g = g->next)
    if (g->ever_up && g->pool_bytes > most) most = g->pool_bytes;
  return most;
}

int sched_groups_drain(sched_t *s, const char *worker, Qevict__V1__DrainResponse *resp,
                       char ***names) {
  size_t n = 0;
  for (sgroup_t *g = s->groups; g; g = g->next) n += !*worker || !strcmp(worker, g->worker_id);
  if (!n) return qe_errf(QE_ENOTFOUND, "worker: no worker '%.64s'", worker);
  *names = calloc(n, sizeof **names);
  if (!*names) return qe_errf(QE_ENOMEM, "out of memory");
  Qevict__Worker__V1__Drain d = QEVICT__WORKER__V1__DRAIN__INIT;
  tr_env_t env = QEVICT__WORKER__V1__ENVELOPE__INIT;
  env.msg_case = ENV(DRAIN), env.drain = &d;
  for (sgroup_t *g = s->groups; g; g = g->next) {
    if (*worker && strcmp(worker, g->worker_id)) continue;
    g->draining = 1;
    if (g->up) tr_send(g->rank[0].conn, &env);
    (*names)[resp->n_workers++] = g->worker_id;
    resp->running += (uint32_t)g->n_running;
  }
  resp->workers = *names;
  sched_health_changed(s); /* (every group draining: NOT_SERVING) */
  sched_req_end_queued_if_drained(s);
  return 0;
}

void sched_groups_destroy(sched_t *s) {
  for (sgroup_t *g = s->groups; g; g = g->next)
    for (int k = 0; k < g->tp_size; k++)
      if (g->rank[k].conn) tr_conn_set_data(g->rank[k].conn, NULL);
  if (s->workers) tr_server_close(s->workers);
  s->workers = NULL;
  while (s->groups) {
    sgroup_t *g = s->groups;
    s->groups = g->next;
    free(g);
  }
}
