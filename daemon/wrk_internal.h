/* wrk_internal: what the worker's two threads share. The loop thread (wrk_main.c) owns the
 * transport connection; the engine thread (wrk_engine.c) owns the model, the cache and the step
 * engine. Commands go loop -> engine through `in`, results engine -> loop through `out` (both
 * under mu), the engine is woken by `cv` and the loop by `wake` (uv_async). */
#ifndef QE_WRK_INTERNAL_H
#define QE_WRK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "kv_tiered.h"
#include "model_gen.h"
#include "tr_conn.h"
#include "wrk.h"
#include "wrk_cache.h"

enum { WCMD_START, WCMD_CANCEL, WCMD_CANCEL_ALL, WCMD_DRAIN };
/* WOUT_STOPPED: a follower's rank 0 ended the group in order (its shutdown, or its own failure,
 * which it reports): the follower exits without an error of its own. WOUT_IDLE: rank 0 is
 * leaving and has nothing left to run: the worker stops. */
enum { WOUT_TOKENS, WOUT_FINISHED, WOUT_REPORT, WOUT_FATAL, WOUT_STOPPED, WOUT_IDLE };

typedef struct wcmd {
  int kind;
  uint64_t request_id;
  int32_t *prompt, *resume;
  int n_prompt, n_resume, max_tokens, ignore_eos;
  kern_sampler_t sampler;
  uint64_t seed;
  wrk_open_arg_t arg;
  struct wcmd *next;
} wcmd_t;

/* Memory figures of one request on this rank, in wmem order. */
typedef struct {
  uint64_t request_id;
  uint32_t generated;
  kv_mem_stats_t m;
  char policy[64];
} wreqmem_t;

typedef struct wout {
  int kind;
  uint64_t request_id, offset;
  int32_t *ids;
  int n_ids;
  int reason, prompt_tokens, completion_tokens;
  wreqmem_t mem;
  char error[256];
  /* WOUT_REPORT */
  uint64_t reserved, used, full, int2, other, promotions, demotions, evictions, routing;
  uint32_t running;
  wreqmem_t *reqs;
  int n_reqs;
  struct wout *next;
} wout_t;

typedef struct wrk {
  wrk_config_t cfg;
  char name[96], fingerprint[MODEL_FP_LEN + 1];
  char device[32];             /* "cpu" or "cuda:N" (Hello) */
  uint64_t kv_bytes_per_token; /* FullKV bytes of a token on this rank (Hello) */
  uint32_t kv_page_tokens;     /* FullKV is held in pages of this many tokens (Hello) */
  int pool_default;            /* no --pool-bytes given: cfg.pool_share is the GPU's default */
  uv_loop_t *loop;
  uv_async_t wake;
  uv_timer_t retry;
  unsigned retry_ms; /* the next reconnection's delay: 1 s, doubled after each refusal to 60 s */
  int busy_told;     /* "busy" logged at WARN since the last registration (later ones: INFO) */
  uv_signal_t sig_int, sig_term, sig_hup;
  uv_timer_t grace;         /* the shutdown grace's end (started by the first signal) */
  uv_timer_t watch;         /* every second: the engine thread's beat against step_timeout_s */
  _Atomic uint64_t beat_ms; /* the engine thread's last sign of life (wrk_now_ms; 0: none yet) */
  uint64_t watch_last, watch_resumed; /* the last watch tick; the last resumption of the process */
  tr_conn_t *conn;
  struct qe_tls_ctx *tls; /* the scheduler link's TLS context (NULL: plaintext) */
  int stopping;
  int signalled; /* a stop signal came (the next one stops at once) */
  /* shared, under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  wcmd_t *in_head, *in_tail;
  wout_t *out_head, *out_tail;
  /* leaving: the first stop signal came: rank 0 runs what it has, takes what the scheduler still
   * sends, and says WOUT_IDLE when nothing is left */
  int quit, fatal, thread_done, leaving;
  /* engine thread */
  pthread_t thread;
  kern_backend_t *be;
  model_t *m;
  tp_comm_t *comm;
  tp_comm_t *nccl; /* GPU groups: NCCL over the ranks' devices (comm->dev); destroyed after comm */
  wrk_cache_t *cache;
  int rc; /* the engine thread's exit status */
} wrk_t;

/* wrk_engine.c: loads the model (on the CPU, or on GPU (device + rank) mod count with --device,
 * joining NCCL in TP groups) and runs the engine (rank 0) or follows (ranks > 0) until w->quit;
 * then exits the loop through a WOUT_FATAL or the wake. */
int wrk_engine_load(wrk_t *w);
void *wrk_engine_main(void *arg);
void wrk_engine_unload(wrk_t *w);
void wrk_push_cmd(wrk_t *w, wcmd_t *c);
/* Milliseconds of CLOCK_MONOTONIC. */
uint64_t wrk_now_ms(void);
void wrk_free_cmd(wcmd_t *c);
void wrk_free_out(wout_t *o);

#endif
