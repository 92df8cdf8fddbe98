/* wrk_main: qevictd's loop thread: the connection to the scheduler (Hello with the model's
 * fingerprint, pool bytes and limits; StartRequest / CancelRequest / Drain in; tokens, finishes
 * and memory reports out), reconnection, signals, and the engine thread's lifecycle. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qe_log.h"
#include "qe_pem.h"
#include "qe_proc.h"
#include "qe_status.h"
#include "qe_tls.h"
#include "tr_policy.h"
#include "wrk_internal.h"

#define ENV(x) QEVICT__WORKER__V1__ENVELOPE__MSG_##x

void wrk_config_init(wrk_config_t *c) {
  memset(c, 0, sizeof *c);
  c->scheduler = "127.0.0.1:50052";
  c->group = "g0";
  c->tp = 1;
  c->device = -1;
  c->max_seqs = 64;
  c->max_batch = 4096;
  c->pool_bytes = (size_t)4 << 30;
  c->pool_share = -1;
  c->report_ms = 500;
  c->timeout_ms = 5000;
  c->shutdown_grace_s = 30;
  c->step_timeout_s = -1;
}

double wrk_pool_share(const wrk_config_t *c) {
  if (c->pool_share >= 0) return c->pool_share;
  return c->device >= 0 ? WRK_GPU_POOL_SHARE : 0;
}

static void connect_scheduler(wrk_t *w);
static void enter_leaving(wrk_t *w, const char *why);

static void stop(wrk_t *w) {
  if (w->stopping) return;
  w->stopping = 1;
  pthread_mutex_lock(&w->mu);
  w->quit = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (w->conn) tr_close(w->conn);
  uv_async_send(&w->wake);
  uv_close((uv_handle_t *)&w->retry, NULL);
  uv_close((uv_handle_t *)&w->grace, NULL);
  uv_close((uv_handle_t *)&w->sig_int, NULL);
  uv_close((uv_handle_t *)&w->sig_term, NULL);
  uv_close((uv_handle_t *)&w->sig_hup, NULL);
}

/* ---- scheduler -> engine ---- */

static wcmd_t *start_cmd(wrk_t *w, const Qevict__Worker__V1__StartRequest *s) {
  wcmd_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->kind = WCMD_START;
  c->request_id = s->request_id;
  c->prompt = malloc(sizeof(int32_t) * (s->n_prompt_ids ? s->n_prompt_ids : 1));
  c->resume = malloc(sizeof(int32_t) * (s->n_resume_ids ? s->n_resume_ids : 1));
  if (!c->prompt || !c->resume) return wrk_free_cmd(c), NULL;
  for (size_t i = 0; i < s->n_prompt_ids; i++) c->prompt[i] = (int32_t)s->prompt_ids[i];
  for (size_t i = 0; i < s->n_resume_ids; i++) c->resume[i] = (int32_t)s->resume_ids[i];
  c->n_prompt = (int)s->n_prompt_ids, c->n_resume = (int)s->n_resume_ids;
  c->max_tokens = (int)s->max_tokens, c->ignore_eos = s->ignore_eos;
  if (s->sampling) {
    c->sampler.temp = s->sampling->temperature;
    c->sampler.top_k = (int)s->sampling->top_k;
    c->sampler.top_p = s->sampling->top_p > 0 ? s->sampling->top_p : 1.0f;
    c->seed = s->sampling->seed;
  } else
    c->sampler.top_p = 1.0f;
  kv_policy_desc_t d;
  int rc = tr_policy_resolve(s->policy, model_hparams(w->m)->head_dim, &d);
  c->arg.request_id = s->request_id;
  c->arg.budget = s->budget_bytes;
  c->arg.full = rc || d.full;
  if (!rc) c->arg.cfg = d.cfg, snprintf(c->arg.policy, sizeof c->arg.policy, "%s", d.name);
  if (rc)
    qe_log(QE_LOG_ERROR, "wrk: request %llu: %s (run as FullKV)", (unsigned long long)s->request_id,
           qe_errmsg());
  return c;
}

static void on_message(tr_conn_t *conn, const tr_env_t *m) {
  wrk_t *w = tr_conn_ud(conn);
  wcmd_t *c = NULL;
  if (w->cfg.rank != 0) return; /* followers get everything from rank 0 */
  switch (m->msg_case) {
  case ENV(START_REQUEST):
    c = start_cmd(w, m->start_request);
    break;
  case ENV(CANCEL_REQUEST):
    if ((c = calloc(1, sizeof *c)))
      c->kind = WCMD_CANCEL, c->request_id = m->cancel_request->request_id;
    break;
  case ENV(DRAIN):
    if (m->drain->stop) { /* (another rank is stopping: this one ends the group when idle) */
      if (!w->leaving) enter_leaving(w, "another rank of the group is stopping");
      break;
    }
    if (m->drain->cancel_running && (c = calloc(1, sizeof *c))) c->kind = WCMD_CANCEL_ALL;
    qe_log(QE_LOG_INFO, "wrk: draining");
    break;
  case ENV(ERROR):
    qe_log(QE_LOG_WARN, "wrk: scheduler error: %s", m->error->message);
    break;
  default:
    break;
  }
  if (c) wrk_push_cmd(w, c);
}

static void on_open(tr_conn_t *conn) {
  wrk_t *w = tr_conn_ud(conn);
  w->retry_ms = 1000, w->busy_told = 0;
  qe_log(QE_LOG_INFO, "wrk: %s registered with the scheduler as %s", w->name,
         tr_conn_hello_ack(conn)->worker_id);
}

static void on_retry(uv_timer_t *t) { connect_scheduler(t->data); }

static void on_close(tr_conn_t *conn, int reason, const char *detail) {
  wrk_t *w = tr_conn_ud(conn);
  w->conn = NULL;
  if (w->stopping) return;
  /* a refusal (another model, another kind of weights, a group clash) is retried less and less
     often, up to once a minute (once a second it had filled both logs); a place held by a
     stopping worker of the same rank (busy) once a second: it frees within its grace */
  const int refused = reason == TR_CLOSE_REFUSED;
  const unsigned ms = refused && w->retry_ms > 1000 ? w->retry_ms : 1000;
  w->retry_ms = refused ? (ms * 2 > 60000 ? 60000 : ms * 2) : 1000;
  if (w->leaving) { /* (nobody waits for the running requests: the scheduler resumes them) */
    qe_log(QE_LOG_INFO, "wrk: scheduler connection: %s (%s); stopping", tr_close_reason_str(reason),
           detail);
    stop(w);
    return;
  }
  const int busy = reason == TR_CLOSE_BUSY; /* (told once at WARN: it repeats each second) */
  qe_log(busy && w->busy_told ? QE_LOG_INFO : QE_LOG_WARN,
         "wrk: scheduler connection: %s (%s); reconnecting in %u s", tr_close_reason_str(reason),
         detail, ms / 1000);
  w->busy_told |= busy;
  /* nobody waits for the requests any more (rank 0 runs them; followers take no commands) */
  wcmd_t *c = w->cfg.rank == 0 ? calloc(1, sizeof *c) : NULL;
  if (c) c->kind = WCMD_CANCEL_ALL, wrk_push_cmd(w, c);
  uv_timer_start(&w->retry, on_retry, ms, 0);
}

static void connect_scheduler(wrk_t *w) {
  const model_hparams_t *hp = model_hparams(w->m);
  tr_hello_t h = QEVICT__WORKER__V1__HELLO__INIT;
  h.model_fingerprint = w->fingerprint, h.group = (char *)w->cfg.group;
  h.rank = (uint32_t)w->cfg.rank, h.tp_size = (uint32_t)w->cfg.tp;
  h.pool_bytes = w->cfg.pool_bytes, h.device = w->device, h.name = w->name;
  h.context_length = (uint32_t)hp->n_ctx_train, h.max_sequences = (uint32_t)w->cfg.max_seqs;
  h.full_kv_bytes_per_token = w->kv_bytes_per_token; /* fp32, or bf16 in GPU pages */
  h.full_kv_page_tokens = w->kv_page_tokens;
  tr_options_t opt = {0};
  opt.timeout_ms = w->cfg.timeout_ms;
  opt.hello = &h;
  opt.tls = w->tls, opt.tls_server_name = w->cfg.tls_server_name;
  tr_callbacks_t cb = {w, NULL, on_open, on_message, on_close};
  if (tr_connect(w->loop, w->cfg.scheduler, &opt, &cb, &w->conn)) {
    qe_log(QE_LOG_ERROR, "wrk: connect %s: %s", w->cfg.scheduler, qe_errmsg());
    uv_timer_start(&w->retry, on_retry, 1000, 0);
  }
}

/* ---- engine -> scheduler ---- */

static void fill_mem(Qevict__Worker__V1__MemorySummary *s, const wreqmem_t *m) {
  const kv_mem_stats_t *k = &m->m;
  s->policy = "";
  s->budget_bytes = k->budget, s->bytes = k->bytes, s->peak_bytes = k->peak_bytes;
  s->full_bytes = k->full_bytes, s->int2_bytes = k->int2_bytes, s->sink_bytes = k->sink_bytes;
  s->meta_bytes = k->meta_bytes, s->windows_full = (uint64_t)k->windows[0];
  s->windows_int2 = (uint64_t)k->windows[1], s->windows_evicted = (uint64_t)k->windows[2];
  s->promotions = (uint64_t)k->promotions, s->demotions = (uint64_t)k->demotions;
  s->evictions = (uint64_t)k->evictions, s->quantizations = (uint64_t)k->quantizations;
  s->routing_events = (uint64_t)k->routing_events, s->peak_transient_bytes = k->peak_transient;
  s->workspace_bytes = k->workspace;
}

static void send_tokens(wrk_t *w, const wout_t *o) {
  Qevict__Worker__V1__TokenBatch t = QEVICT__WORKER__V1__TOKEN_BATCH__INIT;
  t.request_id = o->request_id, t.offset = o->offset;
  t.token_ids = (uint32_t *)o->ids, t.n_token_ids = (size_t)o->n_ids;
  tr_env_t env = QEVICT__WORKER__V1__ENVELOPE__INIT;
  env.msg_case = ENV(TOKEN_BATCH), env.token_batch = &t;
  tr_send(w->conn, &env);
}

static void send_finished(wrk_t *w, const wout_t *o) {
  Qevict__Worker__V1__RequestFinished f = QEVICT__WORKER__V1__REQUEST_FINISHED__INIT;
  Qevict__Worker__V1__MemorySummary m = QEVICT__WORKER__V1__MEMORY_SUMMARY__INIT;
  fill_mem(&m, &o->mem);
  f.request_id = o->request_id, f.reason = o->reason;
  f.prompt_tokens = (uint32_t)o->prompt_tokens,
  f.completion_tokens = (uint32_t)o->completion_tokens;
  f.memory = &m, f.error = (char *)o->error;
  tr_env_t env = QEVICT__WORKER__V1__ENVELOPE__INIT;
  env.msg_case = ENV(REQUEST_FINISHED), env.request_finished = &f;
  tr_send(w->conn, &env);
}

static void send_report(wrk_t *w, const wout_t *o) {
  Qevict__Worker__V1__MemoryReport r = QEVICT__WORKER__V1__MEMORY_REPORT__INIT;
  Qevict__Worker__V1__RequestMemory *rm = calloc((size_t)o->n_reqs + 1, sizeof *rm);
  Qevict__Worker__V1__MemorySummary *ms = calloc((size_t)o->n_reqs + 1, sizeof *ms);
  Qevict__Worker__V1__RequestMemory **ptr = calloc((size_t)o->n_reqs + 1, sizeof *ptr);
  if (rm && ms && ptr) {
    for (int i = 0; i < o->n_reqs; i++) {
      qevict__worker__v1__request_memory__init(&rm[i]);
      qevict__worker__v1__memory_summary__init(&ms[i]);
      fill_mem(&ms[i], &o->reqs[i]);
      rm[i].request_id = o->reqs[i].request_id, rm[i].generated_tokens = o->reqs[i].generated;
      rm[i].memory = &ms[i], ptr[i] = &rm[i];
    }
    r.pool_bytes = w->cfg.pool_bytes, r.reserved_bytes = o->reserved, r.used_bytes = o->used;
    r.full_bytes = o->full, r.int2_bytes = o->int2, r.other_bytes = o->other;
    r.running = o->running, r.promotions = o->promotions, r.demotions = o->demotions;
    r.evictions = o->evictions, r.routing_events = o->routing;
    r.requests = ptr, r.n_requests = (size_t)o->n_reqs;
    qe_proc_stats_t p; /* (none when /proc cannot be read: the scheduler keeps the last) */
    if (!qe_proc_usage(&p))
      r.process_rss_bytes = p.rss_bytes, r.process_cpu_us = (uint64_t)(p.cpu_seconds * 1e6),
      r.process_start_ticks = p.start_ticks;
    tr_env_t env = QEVICT__WORKER__V1__ENVELOPE__INIT;
    env.msg_case = ENV(MEMORY_REPORT), env.memory_report = &r;
    tr_send(w->conn, &env);
  }
  free(rm);
  free(ms);
  free(ptr);
}

static void on_wake(uv_async_t *a) {
  wrk_t *w = a->data;
  pthread_mutex_lock(&w->mu);
  wout_t *o = w->out_head;
  w->out_head = w->out_tail = NULL;
  pthread_mutex_unlock(&w->mu);
  while (o) {
    wout_t *next = o->next;
    int open = w->conn && tr_conn_is_open(w->conn);
    if (o->kind == WOUT_FATAL) {
      qe_log(QE_LOG_ERROR, "wrk: engine stopped: %s", o->error);
      w->fatal = o->reason ? o->reason : QE_ECOMM;
      stop(w);
    } else if (o->kind == WOUT_STOPPED) {
      qe_log(QE_LOG_INFO, "wrk: rank 0 stopped the group; this rank exits");
      stop(w);
    } else if (o->kind == WOUT_IDLE) {
      qe_log(QE_LOG_INFO, "wrk: no request left to run; stopping");
      stop(w);
    } else if (open && o->kind == WOUT_TOKENS)
      send_tokens(w, o);
    else if (open && o->kind == WOUT_FINISHED)
      send_finished(w, o);
    else if (open && o->kind == WOUT_REPORT)
      send_report(w, o);
    wrk_free_out(o);
    o = next;
  }
  pthread_mutex_lock(&w->mu);
  int done = w->thread_done;
  pthread_mutex_unlock(&w->mu);
  /* a follower blocked on rank 0 is not waited for: the process exits around it; rank 0 waits
     for its engine under the step timeout's watch, closed only now (closed at the stop, it had
     left a stuck engine holding rank 0 until its supervisor killed it) */
  if (w->stopping && (done || w->cfg.rank > 0) && !uv_is_closing((uv_handle_t *)&w->wake)) {
    uv_close((uv_handle_t *)&w->wake, NULL);
    uv_close((uv_handle_t *)&w->watch, NULL);
  }
}

static void on_grace_over(uv_timer_t *t) {
  wrk_t *w = t->data;
  if (w->cfg.rank)
    qe_log(QE_LOG_WARN,
           "wrk: the shutdown grace (%u s) is over before rank 0 ended the group; "
           "stopping",
           w->cfg.shutdown_grace_s);
  else
    qe_log(QE_LOG_WARN,
           "wrk: the shutdown grace (%u s) is over with requests still running; stopping (the "
           "scheduler resumes them elsewhere)",
           w->cfg.shutdown_grace_s);
  stop(w);
}

/* The shutdown grace (why: its cause, for the log): rank 0 runs what it has and what still comes
 * and stops when nothing is left (WOUT_IDLE), a follower when rank 0 ends the group; at the
 * grace's end at once. */
static void enter_leaving(wrk_t *w, const char *why) {
  pthread_mutex_lock(&w->mu);
  w->leaving = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  uv_timer_start(&w->grace, on_grace_over, (uint64_t)w->cfg.shutdown_grace_s * 1000u, 0);
  qe_log(QE_LOG_INFO,
         "wrk: %s: stopping once %s (up to %u s; no new requests come; a second signal stops at "
         "once)",
         why, w->cfg.rank ? "rank 0 ends the group" : "the running requests finish",
         w->cfg.shutdown_grace_s);
}

/* A stop signal: the first, with a grace and a scheduler link, tells the scheduler that this
 * rank is stopping (a Drain from the worker: its group takes no new requests; the scheduler has
 * rank 0 end the group when a follower stops) and begins the grace; otherwise at once. */
static void on_signal(uv_signal_t *h, int sig) {
  wrk_t *w = h->data;
  if (w->signalled || !w->cfg.shutdown_grace_s || !w->conn || !tr_conn_is_open(w->conn)) {
    qe_log(QE_LOG_INFO, "wrk: signal %d: stopping now%s", sig,
           w->signalled ? " (a second signal)" : "");
    stop(w);
    return;
  }
  w->signalled = 1; /* (a grace the scheduler began, for another rank, is not a signal) */
  Qevict__Worker__V1__Drain d = QEVICT__WORKER__V1__DRAIN__INIT;
  tr_env_t env = QEVICT__WORKER__V1__ENVELOPE__INIT;
  env.msg_case = ENV(DRAIN), env.drain = &d;
  tr_send(w->conn, &env);
  char why[32];
  snprintf(why, sizeof why, "signal %d", sig);
  if (!w->leaving) enter_leaving(w, why);
}

/* The step timeout in seconds (wrk.h step_timeout_s): 0 for none. */
static unsigned step_timeout(const wrk_config_t *c) {
  return c->step_timeout_s >= 0 ? (unsigned)c->step_timeout_s : c->device >= 0 ? 300u : 0u;
}

/* The engine thread silent past the step timeout: nothing in this process can free it (a CUDA
 * call or a collective that never returns), so the process exits for its supervisor to start
 * it again; the scheduler resumes its requests on another group. */
static void on_watch(uv_timer_t *t) {
  wrk_t *w = t->data;
  const uint64_t now = wrk_now_ms();
  /* a tick far past its second: the whole process was held (SIGSTOP, a paused VM), the engine
     too; its silence counts from now (a worker resumed after 3 s had exited 70 at once) */
  if (now - w->watch_last > 2500) w->watch_resumed = now;
  w->watch_last = now;
  uint64_t beat = atomic_load(&w->beat_ms);
  beat = beat && beat < w->watch_resumed ? w->watch_resumed : beat;
  const unsigned limit = step_timeout(&w->cfg);
  if (!limit || !beat || now < beat || now - beat < (uint64_t)limit * 1000u) return;
  qe_log(QE_LOG_ERROR,
         "wrk: %s: the engine has not come back for %llu s (a hung GPU or collective, or a "
         "stopped peer rank; --step-timeout %u): exiting with status %d for a supervisor to "
         "restart this worker",
         w->name, (unsigned long long)((now - beat) / 1000u), limit, WRK_EXIT_RESTART);
  fflush(NULL);
  _exit(WRK_EXIT_RESTART);
}

static void default_name(wrk_t *w) {
  char host[64] = "localhost";
  gethostname(host, sizeof host - 1);
  if (w->cfg.name)
    snprintf(w->name, sizeof w->name, "%s", w->cfg.name);
  else
    snprintf(w->name, sizeof w->name, "%s:%d", host, (int)getpid());
}

static int loop_init(wrk_t *w, uv_loop_t *loop) {
  if (uv_loop_init(loop)) return qe_errf(QE_EIO, "uv_loop_init failed");
  w->loop = loop;
  uv_async_init(loop, &w->wake, on_wake);
  uv_timer_init(loop, &w->retry);
  uv_timer_init(loop, &w->grace);
  uv_timer_init(loop, &w->watch);
  w->watch_last = wrk_now_ms();
  if (step_timeout(&w->cfg)) uv_timer_start(&w->watch, on_watch, 1000, 1000);
  uv_signal_init(loop, &w->sig_int);
  uv_signal_init(loop, &w->sig_term);
  uv_signal_init(loop, &w->sig_hup);
  w->wake.data = w->retry.data = w->grace.data = w->watch.data = w;
  w->sig_int.data = w->sig_term.data = w->sig_hup.data = w;
  uv_signal_start(&w->sig_int, on_signal, SIGINT);
  uv_signal_start(&w->sig_term, on_signal, SIGTERM);
  uv_signal_start(&w->sig_hup, on_signal, SIGHUP); /* (no reload: an orderly stop) */
  return 0;
}

/* The scheduler link's TLS context from the configured files (checked first, naming the flags). */
static int load_tls(wrk_t *w) {
  const wrk_config_t *c = &w->cfg;
  if (!c->tls_ca) return 0;
  if (!c->tls_cert || !c->tls_key)
    return qe_errf(QE_EINVAL, "--tls-ca needs --tls-cert and --tls-key (the scheduler verifies "
                              "workers by their certificates)");
  int rc = qe_check_pem(c->tls_ca, "--tls-ca", "CERTIFICATE");
  if (!rc) rc = qe_check_pem(c->tls_cert, "--tls-cert", "CERTIFICATE");
  if (!rc) rc = qe_check_pem(c->tls_key, "--tls-key", "PRIVATE KEY");
  if (!rc) rc = qe_tls_client_ctx("worker tls", c->tls_ca, c->tls_cert, c->tls_key, &w->tls);
  return rc;
}

/* Whether the engine thread ended (and was joined): rank 0 waits for it; a follower, which may
 * be blocked on a rank 0 that is gone or still running, 2 s at most (its state then stays
 * allocated: the process exits around the thread, which may still touch it; on the stack, that
 * had crashed followers at exit). */
static int join_engine(wrk_t *w) {
  if (w->cfg.rank == 0) return pthread_join(w->thread, NULL) == 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 2;
  return pthread_timedjoin_np(w->thread, NULL, &ts) == 0;
}

/* Up to the engine thread's start: 0, or the error (what was set up undone). */
static int wrk_start(wrk_t *w, uv_loop_t *loop) {
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  signal(SIGPIPE, SIG_IGN);
  int rc = load_tls(w);
  if (!rc) rc = model_fingerprint(w->cfg.model, w->fingerprint);
  if (!rc) rc = wrk_engine_load(w);
  if (!rc) rc = loop_init(w, loop);
  if (!rc && pthread_create(&w->thread, NULL, wrk_engine_main, w))
    rc = qe_errf(QE_EIO, "cannot start the engine thread");
  if (rc) {
    wrk_engine_unload(w);
    qe_tls_ctx_destroy(w->tls);
  }
  return rc;
}

int wrk_run(const wrk_config_t *c) {
  wrk_t *w = calloc(1, sizeof *w);
  uv_loop_t *loop = calloc(1, sizeof *loop);
  int rc = w && loop ? 0 : qe_errf(QE_ENOMEM, "wrk: out of memory");
  if (!rc) {
    w->cfg = *c;
    default_name(w);
    rc = wrk_start(w, loop);
  }
  if (rc) {
    free(w);
    free(loop);
    return rc;
  }
  qe_log(QE_LOG_INFO, "wrk: %s (group %s rank %d/%d, %s) loaded %s; connecting to %s%s", w->name,
         c->group, c->rank, c->tp, w->device, c->model, c->scheduler, w->tls ? " over TLS" : "");
  connect_scheduler(w);
  uv_run(loop, UV_RUN_DEFAULT);
  const int fatal = w->fatal;
  if (join_engine(w)) {
    uv_loop_close(loop);
    wrk_engine_unload(w);
    qe_tls_ctx_destroy(w->tls);
    free(loop);
    free(w);
  } else
    qe_log(QE_LOG_INFO, "wrk: the engine thread still waits for rank 0; exiting around it");
  if (fatal) /* (a runtime failure: its status tells a supervisor it started, unlike a load's) */
    qe_log(QE_LOG_ERROR,
           "wrk: the engine stopped; exiting with status %d for a supervisor to "
           "restart this worker",
           WRK_EXIT_RESTART);
  return fatal ? WRK_EXIT_RESTART : 0;
}
