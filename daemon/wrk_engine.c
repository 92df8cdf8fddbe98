/* wrk_engine: the worker's engine thread. Rank 0 drives a gen_engine (continuous batching over
 * the cache's slots): between steps it takes the scheduler's commands (start, cancel, drain),
 * after each step it sends the new tokens of every sequence as one batch each, finished
 * requests with their memory, and every report_ms a memory report. A start whose cache takes
 * its prompt in one forward pass only (the GPU tiered cache) waits until a step has room for
 * the whole prompt. Ranks > 0 follow rank 0 (gen_follow_hooks) and report their own share of
 * the KV heads: a request's final memory (a RequestFinished with no reason) when rank 0 closes
 * its slot, and every report_ms a memory report of the slots open here.
 * Any step or collective failure is fatal: the process exits and the scheduler resumes its
 * requests elsewhere (crash-only; nothing half-done is reported as done). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_mux.h"
#include "qe_log.h"
#include "qe_proc.h"
#include "qe_status.h"
#include "wrk_held.h"
#include "wrk_internal.h"
#ifdef QE_HAVE_CUDA
#include "cuda/kern_cuda.h"
#endif

#define WF(x) QEVICT__WORKER__V1__FINISH_REASON__FINISH_REASON_##x
#include "worker.pb-c.h"

typedef struct {
  uint64_t id;
  int busy, n_prompt;
  int fresh; /* started since the last step: its prompt is not fed yet */
  int32_t *pend;
  int n_pend, cap_pend;
  uint64_t first;
} wslot_t;

/* A rank's engine-thread state. Rank 0: e and slots; ranks > 0: both NULL (the cache's open
 * slots and their requests are the state). */
typedef struct {
  wrk_t *w;
  gen_engine_t *e;
  wslot_t *slots; /* [n_slots] */
  int n_slots;
  uint64_t cum[4];      /* promotions, demotions, evictions, routing events of finished requests */
  uint64_t last_report; /* wrk_now_ms() of the last memory report */
  wrk_held_t held;      /* starts waiting for room in a step or for a cache child */
  int fresh_prompt;     /* prompt tokens of the starts since the last step */
  int told_idle;        /* WOUT_IDLE sent (leaving, nothing left to run) */
} weng_t;

uint64_t wrk_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void wrk_free_cmd(wcmd_t *c) {
  if (!c) return;
  free(c->prompt);
  free(c->resume);
  free(c);
}

void wrk_free_out(wout_t *o) {
  if (!o) return;
  free(o->ids);
  free(o->reqs);
  free(o);
}

void wrk_push_cmd(wrk_t *w, wcmd_t *c) {
  pthread_mutex_lock(&w->mu);
  if (w->in_tail)
    w->in_tail->next = c;
  else
    w->in_head = c;
  w->in_tail = c;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void push_out(wrk_t *w, wout_t *o) {
  pthread_mutex_lock(&w->mu);
  if (w->out_tail)
    w->out_tail->next = o;
  else
    w->out_head = o;
  w->out_tail = o;
  pthread_mutex_unlock(&w->mu);
  uv_async_send(&w->wake);
}

/* The engine's end: WOUT_FATAL with rc and its detail, WOUT_STOPPED or WOUT_IDLE (rc 0). */
static void push_end(wrk_t *w, int kind, int rc) {
  wout_t *o = calloc(1, sizeof *o);
  if (!o) return;
  o->kind = kind;
  o->reason = rc;
  if (kind == WOUT_FATAL)
    snprintf(o->error, sizeof o->error, "%s: %s", qe_strerror(rc), qe_errmsg());
  push_out(w, o);
}

/* ---- rank 0 callbacks ---- */

static void flush_slot(weng_t *g, int slot) {
  wslot_t *s = &g->slots[slot];
  if (!s->n_pend) return;
  wout_t *o = calloc(1, sizeof *o);
  int32_t *ids = malloc(sizeof *ids * (size_t)s->n_pend);
  if (!o || !ids) {
    free(o);
    free(ids);
    return;
  }
  memcpy(ids, s->pend, sizeof *ids * (size_t)s->n_pend);
  *o = (wout_t){
      .kind = WOUT_TOKENS, .request_id = s->id, .offset = s->first, .ids = ids, .n_ids = s->n_pend};
  s->n_pend = 0;
  push_out(g->w, o);
}

static void on_token(void *ud, int slot, int index, int id, int forced) {
  weng_t *g = ud;
  wslot_t *s = &g->slots[slot];
  wrk_cache_touch(g->w->cache, slot);
  if (forced) return; /* a resumed request: the client has these already */
  if (s->n_pend == s->cap_pend) {
    int cap = s->cap_pend ? 2 * s->cap_pend : 16;
    int32_t *p = realloc(s->pend, sizeof *p * (size_t)cap);
    if (!p) return;
    s->pend = p, s->cap_pend = cap;
  }
  if (!s->n_pend) s->first = (uint64_t)index;
  s->pend[s->n_pend++] = id;
}

static int reason_of(int gen) {
  return gen == GEN_FINISH_LENGTH      ? WF(LENGTH)
         : gen == GEN_FINISH_EOG       ? WF(EOS)
         : gen == GEN_FINISH_CANCELLED ? WF(CANCELLED)
                                       : WF(ERROR);
}

/* Memory of slot's request on this rank (followers do not count tokens: generated 0). */
static void slot_mem(weng_t *g, int slot, wreqmem_t *m) {
  int n = 0;
  if (g->e) gen_engine_tokens(g->e, slot, &n);
  m->request_id = g->e ? g->slots[slot].id : wrk_cache_request(g->w->cache, slot);
  m->generated = (uint32_t)n;
  wrk_cache_stats(g->w->cache, slot, &m->m);
}

/* A finished request's transitions join the rank's totals. */
static void add_cum(weng_t *g, const kv_mem_stats_t *m) {
  g->cum[0] += (uint64_t)m->promotions, g->cum[1] += (uint64_t)m->demotions;
  g->cum[2] += (uint64_t)m->evictions, g->cum[3] += (uint64_t)m->routing_events;
}

static void on_finish(void *ud, int slot, int reason) {
  weng_t *g = ud;
  wslot_t *s = &g->slots[slot];
  flush_slot(g, slot);
  wout_t *o = calloc(1, sizeof *o);
  if (o) {
    o->kind = WOUT_FINISHED;
    o->request_id = s->id;
    o->reason = reason_of(reason);
    o->prompt_tokens = s->n_prompt;
    slot_mem(g, slot, &o->mem);
    o->completion_tokens = (int)o->mem.generated;
    if (reason == GEN_FINISH_ERROR) snprintf(o->error, sizeof o->error, "%s", qe_errmsg());
    add_cum(g, &o->mem.m);
    push_out(g->w, o);
  }
  s->busy = 0;
}

/* ---- commands ---- */

/* A request that never started ends: reason (a FinishReason) and why (may be ""). */
static void end_unstarted(weng_t *g, const wcmd_t *c, int reason, const char *why) {
  wout_t *o = calloc(1, sizeof *o);
  if (!o) return;
  o->kind = WOUT_FINISHED;
  o->request_id = c->request_id;
  o->reason = reason;
  o->prompt_tokens = c->n_prompt;
  snprintf(o->error, sizeof o->error, "%s", why);
  push_out(g->w, o);
}

static void fail_start(weng_t *g, const wcmd_t *c, const char *why) {
  end_unstarted(g, c, WF(ERROR), why);
}

static int start(weng_t *g, const wcmd_t *c) {
  int slot = -1;
  for (int i = 0; i < g->n_slots && slot < 0; i++)
    if (!g->slots[i].busy && !gen_engine_slot_busy(g->e, i)) slot = i;
  if (slot < 0) return fail_start(g, c, "no free sequence slot on the worker"), 0;
  gen_req_t r = {c->prompt,     c->n_prompt, c->max_tokens, c->sampler, c->seed,
                 c->ignore_eos, c->resume,   c->n_resume,   &c->arg,    sizeof c->arg};
  g->slots[slot].id = c->request_id;
  g->slots[slot].n_prompt = c->n_prompt;
  g->slots[slot].n_pend = 0;
  int rc = gen_engine_add(g->e, slot, &r);
  if (rc == QE_ECOMM) return rc;
  if (rc) {
    char why[256];
    snprintf(why, sizeof why, "%s: %s", qe_strerror(rc), qe_errmsg());
    fail_start(g, c, why);
    return 0;
  }
  g->slots[slot].busy = 1;
  g->slots[slot].fresh = 1;
  g->fresh_prompt += c->n_prompt;
  return 0;
}

/* Rows the next step has left for one more whole prompt: the batch less a decode row per running
 * sequence and the prompts started since the last step; -1 while an older prompt is still fed
 * in chunks (it goes first). */
static int step_room(const weng_t *g) {
  int room = g->w->cfg.max_batch - g->fresh_prompt;
  for (int i = 0; i < g->n_slots; i++) {
    const wslot_t *s = &g->slots[i];
    int n = 0;
    if (!s->busy || s->fresh) continue;
    gen_engine_tokens(g->e, i, &n);
    if (!n) return -1; /* no token yet: its prompt is not all in */
    room--;
  }
  return room;
}

/* Whether start c has a cache child for its policy (wrk_cache_can_open), and whether, where its
 * cache needs its whole prompt in one step (wrk_cache_whole_prompt), the next step has room for
 * it (the held queue's conditions, wrk_held_next). */
static int child_ok(void *ctx, const wcmd_t *c) {
  const weng_t *g = ctx;
  return wrk_cache_can_open(g->w->cache, &c->arg);
}
static int room_ok(void *ctx, const wcmd_t *c) {
  const weng_t *g = ctx;
  return !wrk_cache_whole_prompt(g->w->cache, &c->arg) || c->n_prompt <= step_room(g);
}

/* The next held start that can start now (wrk_held_next), unlinked when take. */
static wcmd_t *held_next(weng_t *g, int take) {
  return wrk_held_next(&g->held, child_ok, room_ok, g, take);
}

/* Takes a start into the held queue (FIFO) when its cache needs its whole prompt in one step,
 * or when every cache child serves open slots of other policy configurations (it starts once
 * one of them ends); fails it now when no step can hold its prompt. 1 when c was taken. */
static int hold_start(weng_t *g, wcmd_t *c) {
  int max_batch = g->w->cfg.max_batch, whole = wrk_cache_whole_prompt(g->w->cache, &c->arg);
  if (!whole && wrk_cache_can_open(g->w->cache, &c->arg)) return 0;
  if (whole && c->n_prompt > max_batch) {
    char why[256];
    snprintf(why, sizeof why,
             "unsupported: prompt: policy '%s' on the GPU takes a prompt in one forward pass; "
             "%d tokens exceed the worker's --max-batch (%d)",
             c->arg.policy, c->n_prompt, max_batch);
    fail_start(g, c, why);
    wrk_free_cmd(c);
    return 1;
  }
  wrk_held_push(&g->held, c);
  return 1;
}

/* Starts the held requests that can start now (held_next: a start waiting for a cache child no
 * longer holds the ones behind it; on a GPU worker it had held every start queued after it). */
static int start_held(weng_t *g) {
  int rc = 0;
  for (wcmd_t *c; !rc && (c = held_next(g, 1));) {
    rc = start(g, c);
    wrk_free_cmd(c);
  }
  return rc;
}

/* Ends the held starts of request id (all: every one) as cancelled. */
static void drop_held(weng_t *g, uint64_t id, int all) {
  for (wcmd_t *c = wrk_held_remove(&g->held, id, all), *next; c; c = next) {
    next = c->next;
    end_unstarted(g, c, WF(CANCELLED), "");
    wrk_free_cmd(c);
  }
}

/* After a step: the prompts of the starts before it are in (or being fed in chunks). */
static void clear_fresh(weng_t *g) {
  for (int i = 0; i < g->n_slots; i++) g->slots[i].fresh = 0;
  g->fresh_prompt = 0;
}

static int cancel(weng_t *g, uint64_t id, int all) {
  int rc = 0;
  drop_held(g, id, all);
  for (int i = 0; i < g->n_slots && !rc; i++)
    if (g->slots[i].busy && (all || g->slots[i].id == id)) rc = gen_engine_cancel(g->e, i);
  return rc == QE_ECOMM ? rc : 0;
}

static int run_cmds(weng_t *g, wcmd_t *c) {
  int rc = 0;
  while (c) {
    wcmd_t *next = c->next;
    if (!rc && c->kind == WCMD_START && hold_start(g, c))
      c = NULL; /* taken */
    else if (!rc && c->kind == WCMD_START)
      rc = start(g, c);
    if (!rc && c && c->kind == WCMD_CANCEL) rc = cancel(g, c->request_id, 0);
    if (!rc && c && c->kind == WCMD_CANCEL_ALL) rc = cancel(g, 0, 1);
    wrk_free_cmd(c);
    c = next;
  }
  return rc ? rc : start_held(g);
}

/* ---- memory reports ---- */

/* Whether slot holds a running request on this rank. */
static int slot_live(const weng_t *g, int slot) {
  return g->e ? g->slots[slot].busy : kv_mux_is_open(wrk_cache_kv(g->w->cache), slot);
}

static void report(weng_t *g) {
  wout_t *o = calloc(1, sizeof *o);
  if (!o) return;
  o->kind = WOUT_REPORT;
  o->reqs = calloc((size_t)g->n_slots, sizeof *o->reqs);
  uint64_t t[4] = {g->cum[0], g->cum[1], g->cum[2], g->cum[3]};
  for (int i = 0; o->reqs && i < g->n_slots; i++) {
    if (!slot_live(g, i)) continue;
    wreqmem_t *m = &o->reqs[o->n_reqs++];
    slot_mem(g, i, m);
    o->reserved += m->m.budget, o->used += m->m.bytes;
    o->full += m->m.full_bytes, o->int2 += m->m.int2_bytes;
    o->other += m->m.bytes - m->m.full_bytes - m->m.int2_bytes;
    t[0] += (uint64_t)m->m.promotions, t[1] += (uint64_t)m->m.demotions;
    t[2] += (uint64_t)m->m.evictions, t[3] += (uint64_t)m->m.routing_events;
  }
  o->running = (uint32_t)o->n_reqs;
  o->promotions = t[0], o->demotions = t[1], o->evictions = t[2], o->routing = t[3];
  push_out(g->w, o);
}

/* A memory report when report_ms have passed since the last one. */
static void maybe_report(weng_t *g) {
  if (wrk_now_ms() - g->last_report < g->w->cfg.report_ms) return;
  report(g);
  g->last_report = wrk_now_ms();
}

/* Waits for commands while idle (at most wait_ms); returns the commands taken, or NULL. *quit and
 * *leaving: the flags of the same name (wrk_internal.h). */
static wcmd_t *take_cmds(wrk_t *w, int idle, unsigned wait_ms, int *quit, int *leaving) {
  pthread_mutex_lock(&w->mu);
  if (idle && !w->in_head && !w->quit) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    ts.tv_sec += wait_ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
  }
  wcmd_t *c = w->in_head;
  w->in_head = w->in_tail = NULL;
  *quit = w->quit, *leaving = w->leaving;
  pthread_mutex_unlock(&w->mu);
  return c;
}

/* Leaving (the worker's shutdown grace) and nothing running or held: tells the loop thread once,
 * after this step's tokens and finishes, which then stops the worker. */
static void maybe_done_leaving(weng_t *g, int leaving) {
  if (!leaving || g->told_idle || gen_engine_n_active(g->e) || g->held.head) return;
  g->told_idle = 1;
  push_end(g->w, WOUT_IDLE, 0);
}

static int drive(weng_t *g) {
  wrk_t *w = g->w;
  int rc = 0, active = 0, quit = 0, leaving = 0;
  while (!rc) {
    atomic_store(&w->beat_ms, wrk_now_ms());   /* (at least every report_ms: take_cmds's wait) */
    const int ready = held_next(g, 0) != NULL; /* (no wait for it) */
    wcmd_t *c = take_cmds(w, !active && !ready, w->cfg.report_ms, &quit, &leaving);
    if (quit) {
      while (c) { /* dropped: the process is stopping */
        wcmd_t *n = c->next;
        wrk_free_cmd(c);
        c = n;
      }
      break;
    }
    rc = run_cmds(g, c);
    if (!rc)
      rc = gen_engine_n_active(g->e) ? gen_engine_step(g->e, &active) : gen_engine_idle(g->e);
    clear_fresh(g);
    if (!gen_engine_n_active(g->e)) active = 0;
    for (int i = 0; i < g->n_slots; i++) flush_slot(g, i);
    maybe_report(g);
    maybe_done_leaving(g, leaving);
  }
  return rc;
}

/* The engine's callbacks share one ud (the engine state): the cache's open behind it. */
static int open_hook(void *ud, kv_cache_t *kv, int slot, int cap, const void *arg, size_t len) {
  return wrk_cache_open(((weng_t *)ud)->w->cache, kv, slot, cap, arg, len);
}

/* How the decode steps ran (CUDA graphs: one per batch bucket; eager: prefill, mixed and
 * tensor-parallel steps, and decode steps whose rows use caches of different kinds). */
static void log_graphs(const wrk_t *w) {
  model_graph_stats_t s;
  model_graph_stats(w->m, &s);
  if (model_graphs_on(w->m))
    qe_log(QE_LOG_INFO,
           "wrk: decode graphs: %ld recorded, %ld steps replayed, %ld warm-up and %ld "
           "eager decode steps",
           s.captures, s.replays, s.warmups, s.eager_steps);
}

static int run_rank0(wrk_t *w) {
  weng_t g = {w, NULL, NULL, w->cfg.max_seqs, {0}, 0, {NULL, NULL}, 0, 0};
  g.slots = calloc((size_t)g.n_slots, sizeof *g.slots);
  gen_engine_opts_t o = {open_hook, on_token, on_finish, &g, w->cfg.max_batch, NULL};
  int rc = g.slots ? gen_engine_create(w->m, wrk_cache_kv(w->cache), w->comm, &o, &g.e)
                   : qe_errf(QE_ENOMEM, "out of memory");
  if (!rc) rc = drive(&g);
  for (wcmd_t *c = wrk_held_remove(&g.held, 0, 1), *next; c; c = next) /* stopping */
    next = c->next, wrk_free_cmd(c);
  gen_engine_destroy(g.e);
  for (int i = 0; g.slots && i < g.n_slots; i++) free(g.slots[i].pend);
  free(g.slots);
  log_graphs(w);
  return rc;
}

/* ---- ranks > 0 ---- */

/* Rank 0 closes slot: its request's final memory on this rank goes to the scheduler, which
 * finishes the request once every rank has reported (reason UNSPECIFIED: rank 0's counts). */
static void follow_closed(void *ud, int slot) {
  weng_t *g = ud;
  if (!kv_mux_is_open(wrk_cache_kv(g->w->cache), slot)) return;
  wout_t *o = calloc(1, sizeof *o);
  if (!o) return;
  o->kind = WOUT_FINISHED;
  slot_mem(g, slot, &o->mem);
  o->request_id = o->mem.request_id;
  add_cum(g, &o->mem.m);
  push_out(g->w, o);
}

/* (after each of rank 0's operations: at least every report_ms, its idle no-op) */
static void follow_tick(void *ud) {
  weng_t *g = ud;
  atomic_store(&g->w->beat_ms, wrk_now_ms());
  maybe_report(g);
}

static int run_follower(wrk_t *w) {
  weng_t g = {w, NULL, NULL, w->cfg.max_seqs, {0}, 0, {NULL, NULL}, 0, 0};
  gen_follow_hooks_t h = {open_hook, follow_closed, follow_tick, &g};
  return gen_follow_hooks(w->m, wrk_cache_kv(w->cache), w->comm, &h);
}

/* The rank's backend: CUDA GPU (device + rank) mod the GPU count with --device, else the CPU. */
static int make_backend(wrk_t *w) {
  const wrk_config_t *c = &w->cfg;
  snprintf(w->device, sizeof w->device,
           c->cpu_weights == KERN_WEIGHT_PACKED ? "cpu-packed" : "cpu");
  if (c->device < 0) return kern_cpu_create_ex(c->threads, c->cpu_weights, &w->be);
#ifdef QE_HAVE_CUDA
  int n = kern_cuda_device_count(), dev = n > 0 ? (c->device + c->rank) % n : 0;
  if (c->device >= n || c->tp > n)
    return qe_errf(QE_EINVAL,
                   "--device %d --tp %d: %d CUDA device(s) visible (a group needs a GPU "
                   "per rank)",
                   c->device, c->tp, n);
  snprintf(w->device, sizeof w->device, "cuda:%d", dev);
  return kern_cuda_create(dev, &w->be);
#else
  return qe_errf(QE_EUNSUPPORTED, "--device %d: this build has the CPU backend only", c->device);
#endif
}

/* GPU groups (tp > 1): every rank reports whether it loaded (lrc) so that all fail together, then
 * joins NCCL on its device: rank 0 makes the unique id, which goes to the others over the group's
 * CPU link (w->comm: the Unix socket the ranks met on), and collectives are ordered on the
 * backend's stream; comm->dev then carries the forward pass's all-reduces. Builds without NCCL
 * stage them through the CPU link. Returns lrc, or the join's error. */
static int join_device_comm(wrk_t *w, int lrc) {
  tp_comm_t *c = w->comm;
  if (w->cfg.device < 0 || c->size == 1) return lrc;
#if defined(QE_HAVE_CUDA) && defined(QE_HAVE_NCCL)
  unsigned char id[TP_NCCL_ID_BYTES] = {0};
  int rc = !lrc && c->rank == 0 ? tp_comm_nccl_unique_id(id) : lrc, ok = rc == 0, all[64];
  int brc = tp_allgather(c, &ok, all, sizeof ok);
  for (int r = 0; !brc && r < c->size; r++)
    if (!all[r]) brc = rc ? rc : qe_errf(QE_ECOMM, "rank %d of the group failed to load", r);
  if (!brc) brc = tp_broadcast(c, id, sizeof id, 0);
  if (!brc) brc = tp_comm_create_nccl(id, c->rank, c->size, kern_cuda_device(w->be), &w->nccl);
  if (!brc) brc = tp_comm_nccl_set_stream(w->nccl, kern_cuda_stream(w->be));
  if (!brc) c->dev = w->nccl;
  return brc;
#else
  if (!lrc) qe_log(QE_LOG_WARN, "wrk: no NCCL in this build: all-reduces go through the CPU link");
  return lrc;
#endif
}

/* The memory free to the rank now: the device's on a GPU, else qe_mem_available's. */
static int memory_free(const wrk_t *w, uint64_t *free_b) {
#ifdef QE_HAVE_CUDA
  size_t dev_free = 0, total = 0;
  if (w->cfg.device >= 0) {
    const int rc = kern_cuda_mem_info(w->be, &dev_free, &total);
    *free_b = dev_free;
    return rc;
  }
#endif
  return qe_mem_available(free_b);
}

/* --pool-bytes N%: the pool is that share of the memory free now, the model loaded: the device's
 * on a GPU (where the share is the whole FullKV arena: the pool and each slot's partly filled
 * windows), MemAvailable on the CPU. Sets w->cfg.pool_bytes, which the hello and reports carry. */
static int size_pool(wrk_t *w) {
  wrk_config_t *c = &w->cfg;
  if (c->pool_share <= 0) return 0;
  uint64_t free_b = 0;
  const size_t slack = wrk_cache_gpu_arena_bytes(w->cache); /* (the pool is 0 so far) */
  int rc = memory_free(w, &free_b);
  if (rc) return rc;
  const double share = c->pool_share * (double)free_b;
  const char *dflt = w->pool_default ? " (the default on a GPU: no --pool-bytes given)" : "";
  if (!free_b)
    return qe_errf(QE_EINVAL,
                   "--pool-bytes %g%%%s: no memory is free on %s after loading the model%s",
                   c->pool_share * 100, dflt, w->device,
                   c->device < 0 ? " (MemAvailable, or the memory cgroup's room)" : "");
  if (share <= (double)slack)
    return qe_errf(QE_EINVAL,
                   "--pool-bytes %g%%%s: %.0f of the %llu bytes free on %s after loading the "
                   "model is not above the %zu that the slots' partly filled windows take",
                   c->pool_share * 100, dflt, share, (unsigned long long)free_b, w->device, slack);
  c->pool_bytes = (size_t)(share - (double)slack);
  wrk_cache_set_pool(w->cache, c->pool_bytes);
  qe_log(QE_LOG_INFO, "wrk: %s: --pool-bytes %g%% of the %llu MiB free: %zu bytes%s", w->device,
         c->pool_share * 100, (unsigned long long)(free_b >> 20), c->pool_bytes, dflt);
  return 0;
}

/* The rank's FullKV figures (for the Hello); a pool below the smallest request (a one-token prompt
 * and one new token: 2 tokens, a whole page of them on a GPU) stops the rank, as every request
 * would be refused. */
static int check_least(wrk_t *w) {
  w->kv_bytes_per_token = wrk_cache_full_bytes_per_token(w->cache);
  w->kv_page_tokens = wrk_cache_full_page_tokens(w->cache);
  const uint64_t least = (w->kv_page_tokens > 2 ? w->kv_page_tokens : 2) * w->kv_bytes_per_token;
  if (w->cfg.pool_bytes >= least) return 0;
  char share[48] = "";
  if (w->cfg.pool_share > 0)
    snprintf(share, sizeof share, " (%s%g%%)", w->pool_default ? "the GPU's default " : "",
             w->cfg.pool_share * 100);
  return qe_errf(QE_EINVAL,
                 "--pool-bytes %zu%s cannot hold any request: the smallest, a one-token prompt "
                 "and one new token, takes %llu bytes of KV on this rank%s",
                 w->cfg.pool_bytes, share, (unsigned long long)least,
                 w->kv_page_tokens > 2 ? " (a whole page of 16 tokens)" : "");
}

/* A GPU rank whose FullKV arena (the smallest any policy configuration takes) cannot fit in the
 * device memory free after loading the model could serve nothing: it stops at its load, with the
 * --pool-bytes that would fit. One that fits a single arena but not two is told so (each policy
 * configuration in use holds its own, wrk_cache.h). */
static int check_device_room(wrk_t *w) {
#ifdef QE_HAVE_CUDA
  size_t arena = wrk_cache_gpu_arena_bytes(w->cache), free_b = 0, total = 0;
  if (!arena || kern_cuda_mem_info(w->be, &free_b, &total)) return 0;
  const size_t pool = w->cfg.pool_bytes, slots = arena - pool; /* (the slots' partial windows) */
  if (arena > free_b) {
    const size_t fit = free_b > slots ? (free_b - slots) / 10 * 9 : 0; /* (10% working space) */
    return qe_errf(QE_EINVAL,
                   "--pool-bytes %zu: its KV arena on %s takes %zu bytes (the pool and %zu for the "
                   "slots' partly filled windows), over the %zu bytes free after loading the "
                   "model; at most about --pool-bytes %zuM fits (or fewer --max-seqs)",
                   pool, w->device, arena, slots, free_b, fit >> 20);
  }
  if (arena > free_b / 2)
    qe_log(QE_LOG_WARN,
           "wrk: %s: a KV arena takes %zu of the %zu bytes free: one policy configuration "
           "(FullKV, or one tiered policy and window) can run at a time; a request of a second "
           "ends with an error while the first has requests",
           w->device, arena, free_b);
#else
  (void)w;
#endif
  return 0;
}

int wrk_engine_load(wrk_t *w) {
  const wrk_config_t *c = &w->cfg;
  int rc = make_backend(w);
  if (!rc)
    rc = c->tp > 1 ? tp_comm_create_cpu(c->tp_addr, c->rank, c->tp, 60000, &w->comm)
                   : tp_comm_create_single(&w->comm);
  if (rc) return rc;
  w->pool_default = c->pool_share < 0;
  w->cfg.pool_share = wrk_pool_share(c); /* (the GPU's default share) */
  model_load_opts_t o = {w->be, c->rank, c->tp, c->max_batch, 0};
  rc = model_load(c->model, &o, &w->m);
  if (!rc)
    rc = wrk_cache_create(w->m, c->max_seqs, c->pool_share > 0 ? 0 : c->pool_bytes, &w->cache);
  if (!rc) rc = size_pool(w);
  if (!rc) rc = check_least(w);
  if (!rc) rc = check_device_room(w);
  return join_device_comm(w, rc); /* (a rank's failure reaches the others) */
}

void wrk_engine_unload(wrk_t *w) {
  wrk_cache_destroy(w->cache);
  model_destroy(w->m);
  tp_comm_destroy(w->comm);
  tp_comm_destroy(w->nccl);
  kern_destroy(w->be);
  w->cache = NULL, w->m = NULL, w->comm = NULL, w->nccl = NULL, w->be = NULL;
}

/* The engine thread makes the backend's GPU its current device before any cache work (kv_gpu's
 * launches and pinned buffers use the calling thread's device), and logs its free memory. */
static void bind_device(wrk_t *w) {
#ifdef QE_HAVE_CUDA
  size_t free_b = 0, total = 0;
  if (w->cfg.device >= 0 && !kern_cuda_mem_info(w->be, &free_b, &total))
    qe_log(QE_LOG_INFO, "wrk: %s: %zu of %zu MiB free after loading", w->device, free_b >> 20,
           total >> 20);
#else
  (void)w;
#endif
}

void *wrk_engine_main(void *arg) {
  wrk_t *w = arg;
  bind_device(w);
  int rc = w->cfg.rank == 0 ? run_rank0(w) : run_follower(w);
  w->rc = rc;
  pthread_mutex_lock(&w->mu);
  int quitting = w->quit;
  pthread_mutex_unlock(&w->mu);
  if (w->cfg.rank > 0 && !rc) /* rank 0 sent STOP: the group ended in order */
    push_end(w, WOUT_STOPPED, 0);
  else if (!quitting)
    push_end(w, WOUT_FATAL, rc ? rc : QE_ECOMM);
  pthread_mutex_lock(&w->mu);
  w->thread_done = 1;
  pthread_mutex_unlock(&w->mu);
  uv_async_send(&w->wake);
  return NULL;
}
