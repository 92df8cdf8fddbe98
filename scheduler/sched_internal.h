/* sched_internal: the state of qevict-sched shared by its files (sched_main.c: lifecycle;
 * sched_rpc.c: the gRPC surface; sched_req.c: requests, events and streams; sched_groups.c:
 * workers, dispatch and resumption; sched_admin.c: the Admin service; sched_export.c: metrics
 * and health). Everything here belongs to the loop thread. */
#ifndef QE_SCHED_INTERNAL_H
#define QE_SCHED_INTERNAL_H

#include <stdint.h>
#include <uv.h>

#include "health.pb-c.h"
#include "model.h"
#include "qevict.pb-c.h"
#include "sched_server.h"
#include "sched_admit.h"
#include "sched_grpc.h"
#include "sched_http.h"
#include "sched_idx.h"
#include "sched_metrics.h"
#include "sched_tenants.h"
#include "tokenizer.h"
#include "tr_conn.h"
#include "tr_policy.h"

typedef Qevict__Worker__V1__MemorySummary wmem_t;

enum { SREQ_QUEUED = 1, SREQ_RUNNING = 2, SREQ_FINISHED = 3 };
#define SREQ_MAX_STOP  16
#define SREQ_MAX_RANKS 64

typedef struct sreq sreq_t;
typedef struct sgroup sgroup_t;
typedef struct sched sched_t;

/* One stream of a request's events (Generate or Watch). */
typedef struct swatch {
  sgrpc_call_t *call;
  sreq_t *req;
  uint64_t next; /* next event offset to send */
  /* owner: a Generate stream of a request that a Generate started (its first or a retry's):
   * the request is cancelled when the last of them drops (sreq.n_owners) */
  int sending, owner;
  struct swatch *next_w;
} swatch_t;

/* Live memory of one request on one rank (the latest report). */
typedef struct {
  int have;
  uint64_t v[18]; /* wmem_t's numeric fields in order (budget_bytes .. workspace_bytes) */
} smem_t;

struct sreq {
  uint64_t id;
  char id_str[24];
  char tenant[SCHED_TENANT_ID_MAX + 1];
  int orphan; /* its tenant was deleted: no later tenant of the same id finds it */
  char client_id[129];
  uint64_t body_hash; /* FNV-1a of its GenerateRequest as protobuf-c packs it again: a retry must
                       * send the same request */
  int submitted;      /* started by Submit: no stream's drop cancels it */
  int n_owners;       /* its owner streams attached (swatch.owner) */
  char policy[96];    /* resolved policy name */
  int state;
  int32_t *prompt;
  int n_prompt, max_tokens, ignore_eos;
  Qevict__Worker__V1__Sampling sampling;
  Qevict__Worker__V1__Policy wpolicy; /* name points at policy_name */
  char policy_name[96], scorer[16];
  char *stop[SREQ_MAX_STOP];
  int n_stop;
  int64_t budget, full_kv_bytes;
  /* The budget it asked for, before its tenant's limits (sval_clamp_budget applies them at
   * Submit, and sched_req_refit again while it waits when they change): ask_bytes, the bytes it
   * named (budget.bytes), else 0; ask, its bytes or fraction, at most all at Full (policy full:
   * its FullKV); ask_min, the policy's minimum (sink and local windows); ask_full, policy full;
   * ask_default, its budget is its tenant's default_budget. */
  uint64_t ask_bytes, ask, ask_min;
  int ask_full, ask_default;
  sgroup_t *group; /* running: where */
  int32_t *gen;    /* tokens received so far */
  int n_gen, cap_gen;
  tok_stream_t detok;
  char *held; /* text held back while it may be the start of a stop string */
  size_t n_held;
  uint8_t **ev; /* packed Event messages */
  size_t *ev_len;
  uint64_t n_ev, cap_ev;
  swatch_t *watchers;
  int finish_reason; /* qevict.v1.FinishReason */
  /* error: what it finished with; before that, what sched_req_refit refused it with (for
   * sched_admit_event) */
  char error[256], stop_hit[257];
  smem_t mem[SREQ_MAX_RANKS]; /* per rank of its group */
  /* Finishing on a TP group: rank 0's RequestFinished gives the outcome, every rank's its
   * final memory; the request finishes once all are in (sched_groups.c). */
  uint64_t fin_ranks; /* bit k: rank k sent RequestFinished (current dispatch; 64 ranks) */
  int fin_reason;     /* rank 0's (qevict.v1.FinishReason), once fin_ranks has bit 0 */
  char fin_error[256];
  uint64_t t_created, t_started, t_first, t_last_tok, t_finished; /* monotonic us */
  int64_t created_ms, started_ms, finished_ms;
  int dispatch_wait; /* admitted, waiting for a group with room */
  /* Ended while running (a stop string, Cancel, a client gone, the tenant deleted): the worker
   * was told to stop it, and it finishes with this reason (a qevict.v1.FinishReason) and error
   * once the worker's final figures are in; 0: not ending. */
  int ending;
  char end_error[64];
  int resumes;       /* times its group went down while it ran (and it was sent to another) */
  int faults;        /* of those, the downs that were no stop of the group's own (--max-resumes) */
  uv_timer_t expire; /* finished: forgotten after keep_finished_s */
  int timer_live;
  sched_t *s;
  sreq_t *next_all, *prev_all; /* all requests, newest first */
  sreq_t *next_wait;           /* dispatch wait list */
};

/* A worker rank's connection and its last report. */
typedef struct {
  tr_conn_t *conn;
  uint64_t pool_bytes, full, int2, other; /* (what it uses: full + int2 + other) */
  uint64_t transitions[4]; /* promotions, demotions, evictions, routing events (last seen) */
  uint64_t rss, cpu_us;    /* its process's resident memory, and CPU time (last seen) */
  uint64_t start_ticks;    /* its process's start (/proc): another one, another process */
  char name[96], device[96];
} srank_t;

/* A rank's report m names its process's start: at the first report of a new process under the
 * rank's old name (--name, or a container's pid 1 again) the cumulative counters' last values
 * (transitions, cpu_us) go back to 0, so that its history is counted whole. */
void sched_rank_process(srank_t *rk, const Qevict__Worker__V1__MemoryReport *m);

struct sgroup {
  char name[64];
  char worker_id[80];
  /* draining: an admin Drain (kept across reconnections); leaving: a rank said it is stopping
   * (its shutdown grace; cleared when the group comes up again) */
  int tp_size, n_conn, up, draining, leaving, ever_up;
  srank_t rank[SREQ_MAX_RANKS];
  int64_t pool_bytes, reserved;
  int max_seqs, n_running;
  uint32_t context_length;
  uint64_t bytes_per_token;
  uint32_t page_tokens; /* FullKV pages' tokens (the ranks' largest; 1: token by token) */
  sgroup_t *next;
};

struct sched {
  sched_config_t cfg;
  uv_loop_t *loop;
  uv_signal_t sig_int, sig_term, sig_hup;
  uv_timer_t tick;
  sched_tenants_t *tenants;
  sched_admit_t *admit;
  sgrpc_server_t *grpc;
  sh_server_t *http;
  tr_server_t *workers;
  struct qe_tls_ctx *worker_tls; /* the worker link's TLS context (NULL: plaintext) */
  sm_reg_t *metrics;
  gguf_t *gguf;
  tok_t *tok;
  size_t max_piece; /* the longest vocabulary piece in bytes (at least 1) */
  model_hparams_t hp;
  int chat_kind;
  sgroup_t *groups;
  sreq_t *reqs;  /* newest first */
  sidx_t by_id;  /* the requests by id */
  sidx_t by_cid; /* the newest request of a (tenant, client_request_id) by their hash (cid_key) */
  sreq_t *wait_head, *wait_tail; /* admitted, not yet on a group */
  uint64_t next_id;
  struct shealth *health_watchers; /* Health.Watch streams */
  int stopping, ready_written;
  int closing;                /* stopping after a grace (sched_closing): no new requests */
  int unfinished;             /* accepted requests left when it stopped (sched_run's status) */
  uint64_t close_deadline_us; /* closing: the grace's end (sched_now_us) */
  struct smetrics *m;         /* metric families (sched_export.c) */
};

/* sched_util.c */
uint64_t sched_now_us(void);
int64_t sched_unix_ms(void);
int sched_utf8_valid(const char *s, size_t n);
/* Replaces each byte of s (NUL-terminated) that does not start a valid UTF-8 sequence with '?':
 * error messages that echo a client's bytes, or are cut mid-character, stay valid UTF-8. */
void sched_utf8_clean(char *s);
/* The path ("prompt.text") of the first string field of message d's encoding b[n] (unpacked
 * without error) that holds a NUL byte, into path[cap]; 0 when none does. protobuf-c's strings
 * end at their first NUL, so such a field would be read cut short. */
int sched_pb_nul_string(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t n, char *path,
                        size_t cap);

/* sched_req.c */
/* Handles Generate (stream) and Submit (unary) after auth: validates, tokenizes, admits. */
void sched_req_generate(sched_t *s, sgrpc_call_t *call, const char *tenant, const uint8_t *msg,
                        size_t n, int submit);
void sched_req_watch(sched_t *s, sgrpc_call_t *call, const char *tenant, const uint8_t *msg,
                     size_t n);
void sched_req_cancel_rpc(sched_t *s, sgrpc_call_t *call, const char *tenant, const uint8_t *msg,
                          size_t n);
void sched_req_get_rpc(sched_t *s, sgrpc_call_t *call, const char *tenant, const uint8_t *msg,
                       size_t n);
void sched_req_stream_sent(sched_t *s, swatch_t *w, int ok);
void sched_req_stream_cancelled(sched_t *s, swatch_t *w);
sreq_t *sched_req_find(sched_t *s, uint64_t id);
/* Ends a request (any state) with a reason; frees its reservation; finishes its streams once
 * they have sent everything. cancel_worker: tell its worker to stop it, and, for a running
 * request whose worker can be told, finish it when the worker has (its final memory figures
 * in the Finished event: r->ending until then; any later finish takes r->ending's reason). */
void sched_req_finish(sched_t *s, sreq_t *r, int reason, const char *error, int cancel_worker);
/* Tokens from the worker (offset = index of ids[0] among generated tokens). */
void sched_req_tokens(sched_t *s, sreq_t *r, const uint32_t *ids, size_t n, uint64_t offset);
/* Dispatched to r->group: RUNNING, with a Started event the first time. */
void sched_req_started(sched_t *s, sreq_t *r);
/* The request's bytes were admitted (from sched_admit): dispatch it. */
void sched_req_admitted(sched_t *s, sreq_t *r);
/* When every worker group is draining (sched_groups_drained), the requests still queued (for
 * quota or for a worker) end with an error and their reservations come free: none could run
 * until the scheduler restarts. */
void sched_req_end_queued_if_drained(sched_t *s);
/* Fills info (strings point into r; memory into *mem). */
void sched_req_info(const sreq_t *r, Qevict__V1__RequestInfo *info, Qevict__V1__MemorySummary *mem);
void sched_req_memory(const sreq_t *r, Qevict__V1__MemorySummary *out);
void sched_req_destroy_all(sched_t *s);
/* Requests not finished (queued or running), or whose streams have events still to send. */
int sched_req_live(const sched_t *s);
/* Cancels a deleted tenant's unfinished requests (the count) and orphans all of its requests,
 * finished ones too: a tenant created again under the same id neither watches nor attaches to
 * them. */
unsigned sched_req_cancel_tenant(sched_t *s, const char *tenant);
void sched_admit_event(void *ud, uint64_t id, int status);
/* SetTenant's sched_admit_fit_cb (user: a sched_refit_t): a request that has not started gets
 * its budget under the tenant's new limits by the rule Submit applies (sval_clamp_budget), and
 * never more than it was accepted with; one that a fresh submission would be refused is refused
 * (it ends with that refusal's error). A request that started (running, stopping, or waiting to
 * resume on another group) keeps its budget. */
typedef struct {
  sched_t *s;
  const sched_tenant_t *t;
} sched_refit_t;
int64_t sched_req_refit(void *user, uint64_t id, int64_t bytes);

/* sched_groups.c */
int sched_groups_listen(sched_t *s);
/* Sends r to the group with the most free bytes and a free slot; 0 if none has room (r waits
 * on the dispatch list). */
int sched_groups_dispatch(sched_t *s, sreq_t *r);
/* Dispatches waiting requests while groups have room. */
void sched_groups_pump(sched_t *s);
/* Tells r's worker to stop r: 1 when sent, 0 when its group cannot be told (down). */
int sched_groups_cancel(sched_t *s, sreq_t *r);
/* A running request left its group (finished or cancelled): its bytes come free there. */
void sched_groups_release(sched_t *s, sreq_t *r);
int sched_groups_up(const sched_t *s);
/* Groups up and neither draining nor leaving: the ones that take new requests. */
int sched_groups_serving(const sched_t *s);
/* Why no group takes new requests (sched_groups_serving 0): a sentence without a final stop. */
const char *sched_groups_closed_why(const sched_t *s);
/* Whether the scheduler takes new requests: serving groups, and not stopping (nor in its
 * shutdown grace); what gRPC Health and /healthz report. */
int sched_groups_accepting(const sched_t *s);
/* 1 when there are groups and every one is draining (up or not): none takes a request again
 * until the scheduler restarts. */
int sched_groups_drained(const sched_t *s);
/* The FullKV bytes of a sequence of n tokens on the groups (all alike: CPU or GPU): their bytes
 * per token times n rounded up to whole pages (GPU workers hold FullKV in pages of 16 tokens). */
uint64_t sched_groups_full_kv_bytes(const sched_t *s, long n);
/* The tensor-parallel size of the groups with a rank connected (one: check_tp), else the last
 * registered group's, else 1. */
int sched_groups_tp(const sched_t *s);
/* The largest pool of a group that has been up (0: none yet): a request runs on one group, so a
 * budget over it can never run, though the admission pool (every group's) holds it. */
int64_t sched_groups_largest_pool(const sched_t *s);
/* Ends the requests not yet started (queued for quota or pool, or waiting for a group, a resumed
 * one too) whose budget is over the largest group's pool: a group came back smaller. */
void sched_req_end_over_groups(sched_t *s);
void sched_groups_destroy(sched_t *s);
int sched_groups_drain(sched_t *s, const char *worker, Qevict__V1__DrainResponse *resp,
                       char ***names);

/* sched_admin.c */
void sched_admin_rpc(sched_t *s, sgrpc_call_t *call, int method, const uint8_t *msg, size_t n);

/* sched_rpc.c */
int sched_rpc_start(sched_t *s);
void sched_rpc_stop(sched_t *s);
/* Ends a unary call with a message packed from m (NULL: status only). */
void sched_rpc_reply(sgrpc_call_t *call, const ProtobufCMessage *m);
void sched_rpc_error(sgrpc_call_t *call, int grpc_status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* QE_E* -> gRPC status. */
int sched_rpc_status_of(int rc);
void sched_health_changed(sched_t *s);

/* sched_export.c */
int sched_export_start(sched_t *s);
void sched_export_stop(sched_t *s);
void sched_export_finished(sched_t *s, const sreq_t *r);
void sched_export_tokens(sched_t *s, const sreq_t *r, size_t n, uint64_t now);
void sched_export_started(sched_t *s, const sreq_t *r);
void sched_export_worker(sched_t *s, const sgroup_t *g, int rank,
                         const Qevict__Worker__V1__MemoryReport *m);
/* A worker connection refused before it registered: reason "tls" or "refused". */
void sched_export_worker_refused(sched_t *s, const char *reason);
/* A Generate or Submit of tenant refused with gRPC code (before a request was accepted). */
void sched_export_rejected(sched_t *s, const char *tenant, int code);
/* Drops the per-tenant counters of a tenant deleted from the store. */
void sched_export_tenant_deleted(sched_t *s, const char *tenant);
/* A running request sent back to the dispatch list after its group went down. */
void sched_export_resumed(sched_t *s);
/* A gRPC call ended (sgrpc_handlers_t's on_done): path "/service/Method" of a registered method
 * or NULL (an unregistered one), streaming whether it streams its responses, status the code
 * its client was sent; with count 0 the call's OK series is only created (at 0). */
void sched_export_call(sched_t *s, const char *path, int streaming, int status, int count);

#endif
