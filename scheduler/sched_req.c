/* sched_req: a request's life in the scheduler: created from Generate/Submit (after
 * sched_validate), admitted, dispatched, fed tokens by its worker, finished; its events are
 * packed once into a log that every stream (Generate, Watch) replays at its own pace, one
 * message in flight per stream, so a slow client never stalls another. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_log.h"
#include "qe_status.h"
#include "sched_internal.h"
#include "sched_validate.h"

#define GS(x) GRPC_STATUS_##x
#include <grpc/status.h>

static void req_free(sreq_t *r) {
  free(r->prompt);
  free(r->gen);
  free(r->held);
  for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
  for (uint64_t i = 0; i < r->n_ev; i++) free(r->ev[i]);
  free(r->ev);
  free(r->ev_len);
  free(r);
}

/* The by_cid key of a tenant's client_request_id: FNV-1a over both (with the tenant's NUL). */
static uint64_t cid_key(const char *tenant, const char *cid) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = tenant;; p++) {
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
    if (!*p) break;
  }
  for (const char *p = cid; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h;
}

static void unlink_req(sched_t *s, sreq_t *r) {
  sidx_del(&s->by_id, r->id);
  const uint64_t ck = cid_key(r->tenant, r->client_id);
  if (*r->client_id && sidx_get(&s->by_cid, ck) == r) sidx_del(&s->by_cid, ck);
  if (r->prev_all)
    r->prev_all->next_all = r->next_all;
  else
    s->reqs = r->next_all;
  if (r->next_all) r->next_all->prev_all = r->prev_all;
}

static void on_timer_closed(uv_handle_t *h) { req_free(h->data); }

static void req_forget(sched_t *s, sreq_t *r) {
  unlink_req(s, r);
  if (r->timer_live)
    uv_close((uv_handle_t *)&r->expire, on_timer_closed);
  else
    req_free(r);
}

/* (by id through s->by_id: a scan of every kept request had run once per worker message) */
sreq_t *sched_req_find(sched_t *s, uint64_t id) { return sidx_get(&s->by_id, id); }

/* Whether id is written as request ids are: a decimal number below 2^64, no leading zero. */
static int id_str_ok(const char *id, uint64_t *v) {
  char *end;
  if (!isdigit((unsigned char)*id) || (id[0] == '0' && id[1]) || strlen(id) > 20) return 0;
  errno = 0;
  *v = strtoull(id, &end, 10);
  return !*end && !errno;
}

/* Whether r ended, or is ending, without its result: cancelled (a Cancel, or its client gone:
 * the drop a retry follows) or failed. A retry under its client_request_id runs anew. */
static int superseded(const sreq_t *r) {
  const int why = r->state == SREQ_FINISHED ? r->finish_reason : r->ending;
  return why == QEVICT__V1__FINISH_REASON__FINISH_REASON_CANCELLED ||
         why == QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR;
}

/* The newest request of tenant under client_request_id cid that a retry attaches to: by_cid's,
 * or, when another pair shares its key, the newest one found by a scan (none older can be
 * attached to: a retry attaches to a request that it does not supersede). */
static sreq_t *find_client_id(sched_t *s, const char *tenant, const char *cid) {
  if (!*cid) return NULL;
  sreq_t *r = sidx_get(&s->by_cid, cid_key(tenant, cid));
  if (r && (strcmp(r->client_id, cid) || strcmp(r->tenant, tenant)))
    for (r = s->reqs; r && (r->orphan || strcmp(r->client_id, cid) || strcmp(r->tenant, tenant));)
      r = r->next_all;
  return r && !r->orphan && !superseded(r) ? r : NULL;
}

/* ---- the event log and its streams ---- */

#define PAST_END "from_offset: the request has %llu events" /* (Watch past a request's end) */

static void watcher_remove(sreq_t *r, swatch_t *w) {
  for (swatch_t **p = &r->watchers; *p; p = &(*p)->next_w)
    if (*p == w) {
      *p = w->next_w;
      r->n_owners -= w->owner;
      return;
    }
}

static void watcher_pump(sreq_t *r, swatch_t *w) {
  if (w->sending) return;
  if (w->next < r->n_ev) {
    if (sgrpc_send(w->call, r->ev[w->next], r->ev_len[w->next]) == 0) {
      w->sending = 1;
      return;
    }
  } else if (r->state != SREQ_FINISHED)
    return;
  /* everything sent (or the stream failed, or it waited from an offset that the request ended
     before: OUT_OF_RANGE, as Watch answers for a finished request): end it */
  watcher_remove(r, w);
  sgrpc_call_set_data(w->call, NULL);
  char why[96] = "";
  if (w->next > r->n_ev) snprintf(why, sizeof why, PAST_END, (unsigned long long)r->n_ev);
  sgrpc_finish(w->call,
               w->next < r->n_ev ? GS(UNAVAILABLE)
               : *why            ? GS(OUT_OF_RANGE)
                                 : GS(OK),
               why, NULL, 0);
  free(w);
}

static void pump_all(sreq_t *r) {
  swatch_t *w = r->watchers, *nx;
  for (; w; w = nx) {
    nx = w->next_w;
    watcher_pump(r, w);
  }
}

static int push_event(sreq_t *r, Qevict__V1__Event *e) {
  e->request_id = r->id_str;
  e->offset = r->n_ev;
  if (r->n_ev == r->cap_ev) {
    uint64_t cap = r->cap_ev ? 2 * r->cap_ev : 16;
    uint8_t **ev = realloc(r->ev, sizeof *ev * cap);
    if (ev) r->ev = ev;
    size_t *len = realloc(r->ev_len, sizeof *len * cap);
    if (len) r->ev_len = len;
    if (!ev || !len) return QE_ENOMEM;
    r->cap_ev = cap;
  }
  size_t n = qevict__v1__event__get_packed_size(e);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return QE_ENOMEM;
  qevict__v1__event__pack(e, buf);
  r->ev[r->n_ev] = buf;
  r->ev_len[r->n_ev++] = n;
  pump_all(r);
  return 0;
}

static swatch_t *watcher_add(sreq_t *r, sgrpc_call_t *call, uint64_t from, int owner) {
  swatch_t *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  *w = (swatch_t){call, r, from, 0, owner, r->watchers};
  r->watchers = w;
  r->n_owners += owner;
  sgrpc_call_set_data(call, w);
  watcher_pump(r, w);
  return w;
}

void sched_req_stream_sent(sched_t *s, swatch_t *w, int ok) {
  (void)s;
  w->sending = 0;
  if (!ok) return; /* on_cancel follows */
  w->next++;
  watcher_pump(w->req, w);
}

/* An owner stream of r gone (its client cancelled or disconnected): r is cancelled only when
 * no other owner is attached (a retry that attached under r's client_request_id while the first
 * stream was still connected gets r's output). */
static void owner_gone(sched_t *s, sreq_t *r) {
  if (r->state == SREQ_FINISHED) return;
  if (r->n_owners > 0) {
    qe_log(QE_LOG_INFO,
           "sched: request %s: client disconnected, %d other Generate stream(s) attached: "
           "running on",
           r->id_str, r->n_owners);
    return;
  }
  qe_log(QE_LOG_INFO, "sched: request %s: client disconnected, cancelling", r->id_str);
  sched_req_finish(s, r, QEVICT__V1__FINISH_REASON__FINISH_REASON_CANCELLED, "", 1);
}

void sched_req_stream_cancelled(sched_t *s, swatch_t *w) {
  sreq_t *r = w->req;
  watcher_remove(r, w);
  sgrpc_call_set_data(w->call, NULL);
  sgrpc_finish(w->call, GS(CANCELLED), "client went away", NULL, 0);
  if (w->owner) owner_gone(s, r);
  free(w);
}

/* ---- memory summaries ---- */

void sched_req_memory(const sreq_t *r, Qevict__V1__MemorySummary *m) {
  qevict__v1__memory_summary__init(m);
  uint64_t v[18] = {0};
  for (int k = 0; k < SREQ_MAX_RANKS; k++)
    if (r->mem[k].have)
      for (int i = 0; i < 18; i++) v[i] += r->mem[k].v[i];
  m->policy = (char *)r->policy;
  m->budget_bytes = v[0] ? v[0] : (uint64_t)r->budget;
  m->bytes = v[1], m->peak_bytes = v[2], m->full_bytes = v[3], m->int2_bytes = v[4];
  m->sink_bytes = v[5], m->meta_bytes = v[6], m->windows_full = v[7], m->windows_int2 = v[8];
  m->windows_evicted = v[9], m->promotions = v[10], m->demotions = v[11], m->evictions = v[12];
  m->quantizations = v[13], m->routing_events = v[14], m->peak_transient_bytes = v[15];
  m->workspace_bytes = v[16];
}

/* ---- tokens, stop strings ---- */

static int append_gen(sreq_t *r, int32_t id) {
  if (r->n_gen == r->cap_gen) {
    int cap = r->cap_gen ? 2 * r->cap_gen : 64;
    int32_t *g = realloc(r->gen, sizeof *g * (size_t)cap);
    if (!g) return QE_ENOMEM;
    r->gen = g, r->cap_gen = cap;
  }
  r->gen[r->n_gen++] = id;
  return 0;
}

/* Holds a token's text; a NUL byte (a token such as <0x00>) becomes U+FFFD, since Tokens.text
 * (a protobuf-c string) and the stop-string search end at a NUL. */
static int hold_text(sreq_t *r, const char *t, size_t n) {
  size_t nul = 0;
  for (size_t i = 0; i < n; i++) nul += !t[i];
  char *h = realloc(r->held, r->n_held + n + 2 * nul + 1);
  if (!h) return QE_ENOMEM;
  r->held = h;
  for (size_t i = 0; i < n; i++) {
    if (t[i]) {
      h[r->n_held++] = t[i];
      continue;
    }
    memcpy(h + r->n_held, "\xEF\xBF\xBD", 3);
    r->n_held += 3;
  }
  h[r->n_held] = 0;
  return 0;
}

/* How much of the held text may go out now: up to a stop match (*hit = its index), or all but
 * the longest tail that could still become a stop string. */
static size_t releasable(const sreq_t *r, int *hit) {
  size_t best = (size_t)-1, keep = 0;
  *hit = -1;
  for (int i = 0; i < r->n_stop; i++) {
    const char *p = strstr(r->held ? r->held : "", r->stop[i]);
    if (p && (size_t)(p - r->held) < best) best = (size_t)(p - r->held), *hit = i;
    size_t ls = strlen(r->stop[i]);
    for (size_t k = ls - 1; k > keep; k--)
      if (k <= r->n_held && !memcmp(r->held + r->n_held - k, r->stop[i], k)) {
        keep = k;
        break;
      }
  }
  return *hit >= 0 ? best : r->n_held - keep;
}

static void emit_tokens(sreq_t *r, const uint32_t *ids, size_t n, uint32_t index, size_t take) {
  Qevict__V1__Event e = QEVICT__V1__EVENT__INIT;
  Qevict__V1__Tokens t = QEVICT__V1__TOKENS__INIT;
  char *text = malloc(take + 1);
  if (!text) return;
  memcpy(text, r->held ? r->held : "", take);
  text[take] = 0;
  memmove(r->held, r->held + take, r->n_held - take);
  r->n_held -= take;
  t.ids = (uint32_t *)ids, t.n_ids = n, t.text = text, t.index = index;
  e.kind_case = QEVICT__V1__EVENT__KIND_TOKENS, e.tokens = &t;
  push_event(r, &e);
  free(text);
}

static void hold_cb(void *r, const char *text, size_t n) { hold_text(r, text, n); }

/* The text token id completes, held for release (a piece of any length: some vocabularies have
 * tokens of 80 bytes and more). */
static void push_text(sreq_t *r, int id) {
  if (tok_stream_emit(&r->detok, id, hold_cb, r) < 0)
    qe_log(QE_LOG_ERROR, "sched: request %s: token %d's text: %s", r->id_str, id, qe_errmsg());
}

/* Stop string hit matched: the worker stops the request, whose Finished (reason STOP) waits for
 * the worker's final memory figures (sched_req_finish); later tokens are dropped. */
static void stop_at(sched_t *s, sreq_t *r, int hit) {
  snprintf(r->stop_hit, sizeof r->stop_hit, "%s", r->stop[hit]);
  r->n_held = 0;
  sched_req_finish(s, r, QEVICT__V1__FINISH_REASON__FINISH_REASON_STOP, "", 1);
}

void sched_req_tokens(sched_t *s, sreq_t *r, const uint32_t *ids, size_t n, uint64_t offset) {
  if (r->state != SREQ_RUNNING || r->ending) return;
  if (offset > (uint64_t)r->n_gen) {
    qe_log(QE_LOG_ERROR, "sched: request %s: tokens from offset %llu, expected %d", r->id_str,
           (unsigned long long)offset, r->n_gen);
    return;
  }
  size_t skip = (size_t)((uint64_t)r->n_gen - offset); /* already received (a resume) */
  if (skip >= n) return;
  uint32_t index = (uint32_t)r->n_gen;
  for (size_t i = skip; i < n; i++) {
    append_gen(r, (int32_t)ids[i]);
    push_text(r, (int)ids[i]);
  }
  uint64_t now = sched_now_us();
  sched_export_tokens(s, r, n - skip, now);
  if (!r->t_first) r->t_first = now;
  r->t_last_tok = now;
  int hit;
  size_t take = releasable(r, &hit);
  emit_tokens(r, ids + skip, n - skip, index, take);
  if (hit >= 0) stop_at(s, r, hit);
}

/* ---- finishing ---- */

static void on_expire(uv_timer_t *t) {
  sreq_t *r = t->data;
  if (r->watchers) return; /* still streaming: the repeat fires again */
  uv_timer_stop(t);
  req_forget(r->s, r);
}

static void push_finished(sreq_t *r, int reason, const char *error) {
  Qevict__V1__Event e = QEVICT__V1__EVENT__INIT;
  Qevict__V1__Finished f = QEVICT__V1__FINISHED__INIT;
  Qevict__V1__Usage u = QEVICT__V1__USAGE__INIT;
  Qevict__V1__MemorySummary m;
  sched_req_memory(r, &m);
  u.prompt_tokens = (uint32_t)r->n_prompt, u.completion_tokens = (uint32_t)r->n_gen;
  u.queue_time_us = r->t_started ? r->t_started - r->t_created : r->t_finished - r->t_created;
  u.time_to_first_token_us = r->t_first ? r->t_first - r->t_created : 0;
  u.total_time_us = r->t_finished - r->t_created;
  f.reason = reason, f.usage = &u, f.memory = &m;
  f.error = (char *)(error ? error : ""), f.stop = r->stop_hit;
  e.kind_case = QEVICT__V1__EVENT__KIND_FINISHED, e.finished = &f;
  push_event(r, &e);
}

static void wait_remove(sched_t *s, sreq_t *r) {
  sreq_t **p = &s->wait_head, *prev = NULL;
  for (; *p; prev = *p, p = &(*p)->next_wait)
    if (*p == r) {
      *p = r->next_wait;
      if (s->wait_tail == r) s->wait_tail = prev;
      break;
    }
  r->next_wait = NULL;
  r->dispatch_wait = 0;
}

void sched_req_finish(sched_t *s, sreq_t *r, int reason, const char *error, int cancel_worker) {
  if (r->state == SREQ_FINISHED) return;
  if (r->ending) { /* however its worker ended it; a Cancel or a disconnect meanwhile waits */
    if (cancel_worker) return;
    reason = r->ending, error = r->end_error;
  } else if (cancel_worker && r->state == SREQ_RUNNING && sched_groups_cancel(s, r)) {
    r->ending = reason; /* finished when the worker reports */
    snprintf(r->end_error, sizeof r->end_error, "%s", error ? error : "");
    return;
  }
  int was = r->state;
  r->state = SREQ_FINISHED;
  if (r->dispatch_wait) wait_remove(s, r);
  if (was == SREQ_RUNNING && r->group) {
    if (cancel_worker) sched_groups_cancel(s, r);
    sched_groups_release(s, r);
  }
  r->t_finished = sched_now_us();
  r->finished_ms = sched_unix_ms();
  r->finish_reason = reason;
  snprintf(r->error, sizeof r->error, "%s", error ? error : "");
  char tail[16];
  int k = reason == QEVICT__V1__FINISH_REASON__FINISH_REASON_STOP
              ? 0
              : tok_stream_flush(&r->detok, tail, sizeof tail);
  if (k > 0) hold_text(r, tail, (size_t)k);
  if (r->n_held) emit_tokens(r, NULL, 0, (uint32_t)r->n_gen, r->n_held);
  push_finished(r, reason, error);
  sched_export_finished(s, r);
  if (uv_timer_init(s->loop, &r->expire) == 0) {
    r->expire.data = r;
    r->timer_live = 1;
    uint64_t ms = (uint64_t)s->cfg.keep_finished_s * 1000u;
    uv_timer_start(&r->expire, on_expire, ms, 1000);
  }
  /* release last: admission events may dispatch other requests right away */
  if (sched_admit_state(s->admit, r->id) != SCHED_ADMIT_NONE) sched_admit_release(s->admit, r->id);
  sched_groups_pump(s);
}

void sched_req_started(sched_t *s, sreq_t *r) {
  r->state = SREQ_RUNNING;
  if (r->t_started) return; /* a resume: the client saw Started already */
  r->t_started = sched_now_us();
  r->started_ms = sched_unix_ms();
  Qevict__V1__Event e = QEVICT__V1__EVENT__INIT;
  Qevict__V1__Started st = QEVICT__V1__STARTED__INIT;
  st.worker = r->group->worker_id, st.reserved_bytes = (uint64_t)r->budget;
  st.prompt_tokens = (uint32_t)r->n_prompt, st.full_kv_bytes = (uint64_t)r->full_kv_bytes;
  st.policy = r->policy, st.queue_time_us = r->t_started - r->t_created;
  e.kind_case = QEVICT__V1__EVENT__KIND_STARTED, e.started = &st;
  push_event(r, &e);
  sched_export_started(s, r);
}

/* An admitted request joins the back of the dispatch wait list, which is then served oldest
 * first: dispatched at once, it took a slot that a request admitted before it still waited for
 * (a finished request frees its slot before its quota), so one tenant's stream of admissions
 * starved the others' waiting requests. */
void sched_req_admitted(sched_t *s, sreq_t *r) {
  if (r->state != SREQ_QUEUED) return;
  r->dispatch_wait = 1;
  if (s->wait_tail)
    s->wait_tail->next_wait = r;
  else
    s->wait_head = r;
  s->wait_tail = r;
  sched_groups_pump(s);
}

void sched_req_end_queued_if_drained(sched_t *s) {
  if (!sched_groups_drained(s)) return;
  for (int again = 1; again;) { /* (a release may admit a request queued for quota) */
    again = 0;
    for (sreq_t *r = s->reqs; r; r = r->next_all)
      if (r->state == SREQ_QUEUED)
        again = 1, sched_req_finish(s, r, QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR,
                                    "every worker is draining (qevict drain): none takes "
                                    "requests until the scheduler restarts",
                                    0);
  }
}

/* 1 with why[n] saying so when budget is over every group's pool (a request runs on one group,
 * while admission counts their sum); now: "now " for a request already accepted. */
static int over_groups(const sched_t *s, int64_t budget, const char *now, char *why, size_t n) {
  const int64_t most = sched_groups_largest_pool(s);
  if (!most || budget <= most) return 0;
  snprintf(why, n,
           "budget: %lld bytes can never fit (a request runs on one worker group; the largest "
           "group's pool is %s%lld bytes)",
           (long long)budget, now, (long long)most);
  return 1;
}

void sched_req_end_over_groups(sched_t *s) {
  char why[200];
  for (int again = 1; again;) { /* (a release may admit a request queued for quota) */
    again = 0;
    for (sreq_t *r = s->reqs; r && !again; r = r->next_all)
      if (r->state == SREQ_QUEUED && over_groups(s, r->budget, "now ", why, sizeof why))
        again = 1, sched_req_finish(s, r, QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR, why, 0);
  }
}

void sched_admit_event(void *ud, uint64_t id, int status) {
  sched_t *s = ud;
  sreq_t *r = sched_req_find(s, id);
  if (!r) return;
  if (status == 0) {
    sched_req_admitted(s, r);
    return;
  }
  char why[sizeof r->error]; /* (sched_req_refit's refusal, if it was one) */
  snprintf(why, sizeof why, "%s",
           status == QE_ENOTFOUND ? "tenant removed"
           : *r->error            ? r->error
                                  : "can no longer fit the tenant's quota or the pool");
  sched_req_finish(s, r, QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR, why, 0);
}

int64_t sched_req_refit(void *user, uint64_t id, int64_t bytes) {
  const sched_refit_t *c = user;
  sreq_t *r = sched_req_find(c->s, id);
  if (!r || r->orphan || r->state != SREQ_QUEUED || r->t_started) return bytes;
  int64_t budget = 0;
  sval_err_t e = {0};
  if (sval_clamp_budget(r, c->t, &budget, &e)) {
    snprintf(r->error, sizeof r->error, "the tenant's limits changed: %.220s", e.msg);
    return QE_ERANGE;
  }
  if (budget < r->budget) {
    qe_log(QE_LOG_INFO,
           "sched: request %s (tenant %s): %lld bytes under the tenant's new limits "
           "(was %lld)",
           r->id_str, r->tenant, (long long)budget, (long long)r->budget);
    r->budget = budget;
  }
  return r->budget;
}

/* ---- creation ---- */

static sreq_t *req_new(sched_t *s, const char *tenant) {
  sreq_t *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->s = s;
  r->id = s->next_id++;
  snprintf(r->id_str, sizeof r->id_str, "%llu", (unsigned long long)r->id);
  snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
  r->state = SREQ_QUEUED;
  r->t_created = sched_now_us();
  r->created_ms = sched_unix_ms();
  tok_stream_init(&r->detok, s->tok, 0, 0);
  return r;
}

static void link_req(sched_t *s, sreq_t *r) {
  r->next_all = s->reqs;
  if (s->reqs) s->reqs->prev_all = r;
  s->reqs = r;
}

/* Whether the tenant of r already has max_queued requests accepted and not finished (running,
 * waiting for a slot or for its quota): a client that floods the queue is refused, not held in
 * the scheduler's memory for good (4,000 Submits past a one-request quota had all queued). */
static int over_queue(sched_t *s, const sreq_t *r, sval_err_t *e) {
  sched_admit_tenant_stats_t ts;
  if (!s->cfg.max_queued || sched_admit_tenant_stats(s->admit, r->tenant, &ts)) return 0;
  if (ts.n_queued + ts.n_running < s->cfg.max_queued) return 0;
  snprintf(e->msg, sizeof e->msg,
           "tenant %s has %zu requests accepted and not finished, the scheduler's bound "
           "(--max-queued %u): retry when some have finished",
           r->tenant, ts.n_queued + ts.n_running, s->cfg.max_queued);
  e->status = SVAL_EXHAUSTED;
  return 1;
}

static int admit(sched_t *s, sreq_t *r, sval_err_t *e) {
  int state = 0;
  if (over_groups(s, r->budget, "", e->msg, sizeof e->msg)) /* (admission would hold it) */
    return e->status = SVAL_EXHAUSTED, -1;
  if (over_queue(s, r, e)) return -1;
  if (sidx_room(&s->by_id) || sidx_room(&s->by_cid)) {
    snprintf(e->msg, sizeof e->msg, "out of memory (the request index)");
    e->status = SVAL_INTERNAL;
    return -1;
  }
  int rc = sched_admit_reserve(s->admit, r->id, r->tenant, r->budget, &state);
  if (rc == QE_ERANGE) {
    sched_admit_tenant_stats_t ts;
    sched_admit_stats_t ps;
    sched_admit_tenant_stats(s->admit, r->tenant, &ts);
    sched_admit_stats(s->admit, &ps);
    snprintf(e->msg, sizeof e->msg,
             "budget: %lld bytes can never fit (tenant quota %lld bytes, pool %lld bytes)",
             (long long)r->budget, (long long)ts.quota_bytes, (long long)ps.pool_bytes);
    e->status = SVAL_EXHAUSTED;
    return -1;
  }
  if (rc) {
    snprintf(e->msg, sizeof e->msg, "admission: %s", qe_errmsg());
    e->status = SVAL_INTERNAL;
    return -1;
  }
  link_req(s, r);
  sidx_put(&s->by_id, r->id, r);
  if (*r->client_id) { /* (the newest of its pair: a retry attaches to it) */
    const uint64_t ck = cid_key(r->tenant, r->client_id);
    sidx_del(&s->by_cid, ck);
    sidx_put(&s->by_cid, ck, r);
  }
  if (state == SCHED_ADMIT_RUNNING) sched_req_admitted(s, r);
  return 0;
}

static int status_of(int sval) {
  return sval == SVAL_INVALID           ? GS(INVALID_ARGUMENT)
         : sval == SVAL_EXHAUSTED       ? GS(RESOURCE_EXHAUSTED)
         : sval == SVAL_UNAUTHENTICATED ? GS(UNAUTHENTICATED)
                                        : GS(INTERNAL);
}

static void reply_submit(sgrpc_call_t *call, sreq_t *r, int attached) {
  Qevict__V1__SubmitResponse resp = QEVICT__V1__SUBMIT_RESPONSE__INIT;
  resp.request_id = r->id_str;
  resp.attached = attached;
  sched_rpc_reply(call, &resp.base);
}

/* A ProtobufCBuffer that folds what is packed into it into an FNV-1a hash. */
typedef struct {
  ProtobufCBuffer base;
  uint64_t h;
} hash_buf_t;

static void hash_append(ProtobufCBuffer *b, size_t len, const uint8_t *data) {
  hash_buf_t *hb = (hash_buf_t *)b;
  for (size_t i = 0; i < len; i++) hb->h = (hb->h ^ data[i]) * 0x100000001b3ull;
}

/* FNV-1a of a request as protobuf-c packs it again (sreq.body_hash): fields in number order,
 * a repeated field's elements packed, a field sent twice once, so that a retry another protobuf
 * library serializes differently hashes as the first. */
static uint64_t body_hash(const ProtobufCMessage *m) {
  hash_buf_t hb = {{hash_append}, 0xcbf29ce484222325ull};
  protobuf_c_message_pack_to_buffer(m, &hb.base);
  return hb.h;
}

/* A retry under r's client_request_id: the same request attaches; another body is refused
 * (it would silently stream the first request's output). A Generate retry of a request that a
 * Generate started is one of its owners: the request runs while any of them is connected. */
static void attach(sched_t *s, sgrpc_call_t *call, sreq_t *r, int submit, uint64_t hash) {
  if (hash != r->body_hash) {
    sched_export_rejected(s, r->tenant, GS(ALREADY_EXISTS));
    sched_rpc_error(call, GS(ALREADY_EXISTS),
                    "client_request_id: '%s' names request %s, sent with another body (a retry "
                    "sends the same request; a new one needs a new id)",
                    r->client_id, r->id_str);
  } else if (submit)
    reply_submit(call, r, 1);
  else if (!watcher_add(r, call, 0, !r->submitted))
    sched_rpc_error(call, GS(INTERNAL), "out of memory");
}

/* A Generate or Submit refused before a request was accepted: counted, then answered. */
static void refuse(sched_t *s, sgrpc_call_t *call, const char *tenant, int code, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));
static void refuse(sched_t *s, sgrpc_call_t *call, const char *tenant, int code, const char *fmt,
                   ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  sched_export_rejected(s, tenant, code);
  sched_rpc_error(call, code, "%s", msg);
}

void sched_req_generate(sched_t *s, sgrpc_call_t *call, const char *tenant, const uint8_t *msg,
                        size_t n, int submit) {
  Qevict__V1__GenerateRequest *g = qevict__v1__generate_request__unpack(NULL, n, msg);
  if (!g) {
    refuse(s, call, tenant, GS(INVALID_ARGUMENT), "request: malformed protobuf");
    return;
  }
  char nul[128];
  if (sched_pb_nul_string(&qevict__v1__generate_request__descriptor, msg, n, nul, sizeof nul)) {
    qevict__v1__generate_request__free_unpacked(g, NULL);
    refuse(s, call, tenant, GS(INVALID_ARGUMENT), "%s: holds a NUL byte", nul);
    return;
  }
  sreq_t *old = find_client_id(s, tenant, g->client_request_id);
  if (!old && s->closing) { /* (a retry of an accepted request attaches even so) */
    qevict__v1__generate_request__free_unpacked(g, NULL);
    refuse(s, call, tenant, GS(UNAVAILABLE),
           "shutting down: finishing the accepted requests, taking no new ones");
    return;
  }
  if (!old && !sched_groups_serving(s)) { /* (a retry of a known request attaches even so) */
    qevict__v1__generate_request__free_unpacked(g, NULL);
    refuse(s, call, tenant, GS(UNAVAILABLE), "%s", sched_groups_closed_why(s));
    return;
  }
  sreq_t *r = old ? NULL : req_new(s, tenant);
  sval_err_t e = {0};
  int rc = old ? 0 : !r ? (e.status = SVAL_INTERNAL, -1) : sval_request(s, tenant, g, r, &e);
  const uint64_t hash = body_hash(&g->base);
  qevict__v1__generate_request__free_unpacked(g, NULL);
  if (old) {
    attach(s, call, old, submit, hash);
    return;
  }
  if (r) r->body_hash = hash, r->submitted = submit;
  if (!rc) rc = admit(s, r, &e);
  if (rc) {
    if (r) req_free(r);
    refuse(s, call, tenant, status_of(e.status), "%s", e.msg[0] ? e.msg : "out of memory");
    return;
  }
  qe_log(QE_LOG_INFO,
         "sched: request %s (tenant %s): %d prompt tokens, max %d, policy %s, %lld "
         "bytes",
         r->id_str, r->tenant, r->n_prompt, r->max_tokens, r->policy, (long long)r->budget);
  if (submit)
    reply_submit(call, r, 0);
  else if (!watcher_add(r, call, 0, 1))
    sched_rpc_error(call, GS(INTERNAL), "out of memory");
}

/* ---- Watch, Cancel, GetRequest ---- */

static sreq_t *lookup(sched_t *s, sgrpc_call_t *call, const char *tenant, const char *id) {
  if (!*id) {
    sched_rpc_error(call, GS(INVALID_ARGUMENT), "request_id: empty");
    return NULL;
  }
  uint64_t v;
  if (!id_str_ok(id, &v)) { /* (it had been NOT_FOUND, as an unknown id) */
    sched_rpc_error(call, GS(INVALID_ARGUMENT),
                    "request_id: not a request id (the decimal number Submit returned)");
    return NULL;
  }
  sreq_t *r = sched_req_find(s, v);
  if (!r || r->orphan || strcmp(r->tenant, tenant)) {
    sched_rpc_error(call, GS(NOT_FOUND), "request_id: no request '%.64s'", id);
    return NULL;
  }
  return r;
}

void sched_req_watch(sched_t *s, sgrpc_call_t *call, const char *tenant, const uint8_t *msg,
                     size_t n) {
  char nul[128];
  if (sched_pb_nul_string(&qevict__v1__watch_request__descriptor, msg, n, nul, sizeof nul)) {
    sched_rpc_error(call, GS(INVALID_ARGUMENT), "%s: holds a NUL byte", nul);
    return;
  }
  Qevict__V1__WatchRequest *w = qevict__v1__watch_request__unpack(NULL, n, msg);
  if (!w) {
    sched_rpc_error(call, GS(INVALID_ARGUMENT), "request: malformed protobuf");
    return;
  }
  sreq_t *r = lookup(s, call, tenant, w->request_id);
  uint64_t from = w->from_offset;
  qevict__v1__watch_request__free_unpacked(w, NULL);
  if (!r) return;
  if (from > r->n_ev && r->state == SREQ_FINISHED) {
    sched_rpc_error(call, GS(OUT_OF_RANGE), PAST_END, (unsigned long long)r->n_ev);
    return;
  }
  /* a live request has at most a Tokens event a token, its Started and Finished and a few
     more on resumption: an offset far past them would wait for the request to end in vain */
  const uint64_t most = r->n_ev + 2 * (uint64_t)r->max_tokens + 16;
  if (from > most) {
    sched_rpc_error(call, GS(OUT_OF_RANGE),
                    "from_offset: %llu is past any event the request can have (%llu so "
                    "far, at most %llu)",
                    (unsigned long long)from, (unsigned long long)r->n_ev,
                    (unsigned long long)most);
    return;
  }
  if (!watcher_add(r, call, from, 0)) sched_rpc_error(call, GS(INTERNAL), "out of memory");
}

/* The request named by a CancelRequest or GetRequestRequest (both are {request_id = 1}: one
 * layout); NULL after answering the call (malformed, or not this tenant's). */
static sreq_t *lookup_msg(sched_t *s, sgrpc_call_t *call, const char *tenant,
                          const ProtobufCMessageDescriptor *d, const uint8_t *msg, size_t n) {
  char nul[128];
  if (sched_pb_nul_string(d, msg, n, nul, sizeof nul)) {
    sched_rpc_error(call, GS(INVALID_ARGUMENT), "%s: holds a NUL byte", nul);
    return NULL;
  }
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, n, msg);
  if (!m) {
    sched_rpc_error(call, GS(INVALID_ARGUMENT), "request: malformed protobuf");
    return NULL;
  }
  sreq_t *r = lookup(s, call, tenant, ((Qevict__V1__GetRequestRequest *)m)->request_id);
  protobuf_c_message_free_unpacked(m, NULL);
  return r;
}

void sched_req_cancel_rpc(sched_t *s, sgrpc_call_t *call, const char *tenant, const uint8_t *msg,
                          size_t n) {
  sreq_t *r = lookup_msg(s, call, tenant, &qevict__v1__cancel_request__descriptor, msg, n);
  if (!r) return;
  Qevict__V1__CancelResponse resp = QEVICT__V1__CANCEL_RESPONSE__INIT;
  resp.cancelled = r->state != SREQ_FINISHED && !r->ending;
  sched_req_finish(s, r, QEVICT__V1__FINISH_REASON__FINISH_REASON_CANCELLED, "", 1);
  resp.state = r->state; /* (RUNNING while its worker stops it) */
  sched_rpc_reply(call, &resp.base);
}

void sched_req_info(const sreq_t *r, Qevict__V1__RequestInfo *i, Qevict__V1__MemorySummary *m) {
  qevict__v1__request_info__init(i);
  sched_req_memory(r, m);
  i->request_id = (char *)r->id_str, i->client_request_id = (char *)r->client_id;
  i->tenant = (char *)r->tenant;
  i->state = r->state;
  i->worker = r->group && r->state == SREQ_RUNNING ? r->group->worker_id : "";
  i->prompt_tokens = (uint32_t)r->n_prompt, i->generated_tokens = (uint32_t)r->n_gen;
  i->max_tokens = (uint32_t)r->max_tokens;
  i->reserved_bytes =
      r->state != SREQ_FINISHED && sched_admit_state(r->s->admit, r->id) == SCHED_ADMIT_RUNNING
          ? (uint64_t)r->budget
          : 0;
  i->memory = m, i->events = r->n_ev;
  i->finish_reason = r->state == SREQ_FINISHED ? r->finish_reason : 0;
  i->created_unix_ms = r->created_ms, i->started_unix_ms = r->started_ms;
  i->finished_unix_ms = r->finished_ms;
}

void sched_req_get_rpc(sched_t *s, sgrpc_call_t *call, const char *tenant, const uint8_t *msg,
                       size_t n) {
  sreq_t *r = lookup_msg(s, call, tenant, &qevict__v1__get_request_request__descriptor, msg, n);
  if (!r) return;
  Qevict__V1__RequestInfo info;
  Qevict__V1__MemorySummary mem;
  sched_req_info(r, &info, &mem);
  sched_rpc_reply(call, &info.base);
}

unsigned sched_req_cancel_tenant(sched_t *s, const char *tenant) {
  unsigned n = 0;
  for (sreq_t *r = s->reqs; r; r = r->next_all) {
    if (r->orphan || strcmp(r->tenant, tenant)) continue;
    if (r->state != SREQ_FINISHED) {
      sched_req_finish(s, r, QEVICT__V1__FINISH_REASON__FINISH_REASON_CANCELLED, "tenant deleted",
                       1);
      n++;
    }
    r->orphan = 1;
  }
  return n;
}

int sched_req_live(const sched_t *s) {
  int n = 0;
  for (const sreq_t *r = s->reqs; r; r = r->next_all) n += r->state != SREQ_FINISHED || r->watchers;
  return n;
}

void sched_req_destroy_all(sched_t *s) {
  while (s->reqs) {
    sreq_t *r = s->reqs;
    while (r->watchers) {
      swatch_t *w = r->watchers;
      r->watchers = w->next_w;
      sgrpc_call_set_data(w->call, NULL);
      sgrpc_finish(w->call, GS(UNAVAILABLE), "scheduler shutting down", NULL, 0);
      free(w);
    }
    if (r->timer_live) uv_timer_stop(&r->expire);
    req_forget(s, r);
  }
  sidx_free(&s->by_id);
  sidx_free(&s->by_cid);
}
