/* sched_grpc: gRPC C core server glue (see sched_grpc.h).
 *
 * One completion queue, one thread blocked in grpc_completion_queue_next. Every completion's
 * tag is an sgrpc_tag_t embedded in a call (or the server); the thread records ok in it, links
 * it onto a mutex-protected FIFO (no allocation: each tag is in flight at most once) and wakes
 * the loop with uv_async_send. The loop thread drains the FIFO and dispatches; all call state
 * is touched on the loop thread only.
 *
 * A call is a request slot first (one outstanding per registered method, plus one for
 * unregistered methods), then, once gRPC publishes it, a live call: RECV_CLOSE_ON_SERVER is
 * started at once; `ops` counts its batches in flight. It is freed when it is finished and no
 * batch is in flight (so the close and the status have both completed), never from inside one
 * of its own callbacks. */
#include "sched_grpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qe_log.h"
#include "qe_status.h"
#include "qe_target.h"

enum { TAG_NEW, TAG_CLOSE, TAG_SEND, TAG_STATUS, TAG_SHUTDOWN };

typedef struct sgrpc_tag sgrpc_tag_t;
struct sgrpc_tag {
  int kind;
  int ok;             /* written by the cq thread before it links the tag */
  sgrpc_tag_t *next;  /* FIFO link, guarded by the server's mutex */
  sgrpc_call_t *call; /* NULL for TAG_SHUTDOWN */
};

struct sgrpc_call {
  sgrpc_server_t *srv;
  sgrpc_call_t *prev, *next; /* the server's live list (published calls not yet freed) */
  grpc_call *call;
  int method; /* index into the methods, -1 for an unregistered method */
  grpc_metadata_array md;
  grpc_byte_buffer *payload; /* the request (registered methods) */
  gpr_timespec deadline;     /* registered methods */
  grpc_call_details details; /* unregistered methods */
  sgrpc_tag_t t_new, t_close, t_send, t_status;
  int cancelled;              /* RECV_CLOSE_ON_SERVER's result */
  int ops;                    /* batches in flight (the request itself not counted) */
  grpc_byte_buffer *send_bb;  /* sgrpc_send's message in flight */
  grpc_byte_buffer *final_bb; /* the message sent with the status */
  grpc_slice status_text;
  int status;
  char *peer; /* gpr_malloc'd by grpc_call_get_peer */
  void *data;
  unsigned live : 1;      /* linked in the live list */
  unsigned owned : 1;     /* handed to on_call */
  unsigned closed : 1;    /* RECV_CLOSE_ON_SERVER completed */
  unsigned broken : 1;    /* cancelled, or a send failed */
  unsigned cancel_cb : 1; /* on_cancel delivered */
  unsigned finished : 1;  /* sgrpc_finish (or the glue itself) ended it */
  unsigned has_text : 1;  /* status_text holds a slice */
  unsigned md_sent : 1;   /* initial metadata sent */
  unsigned send_busy : 1; /* a send is in flight */
  unsigned deferred : 1;  /* the status waits for send_busy to clear */
  unsigned in_cb : 1;     /* an owner callback for this call is running */
  unsigned sent : 1;      /* the status batch completed */
  unsigned no_msg : 1;    /* the call came without its request message */
  unsigned aborted : 1;   /* call_abort ended it with INTERNAL */
  unsigned late : 1;      /* it was cancelled at (or near) its deadline */
};

struct sgrpc_server {
  uv_loop_t *loop;
  uv_async_t async;
  grpc_server *server;
  grpc_completion_queue *cq;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sgrpc_tag_t *head, *tail; /* completions for the loop, guarded by mu */
  int thread_done;          /* guarded by mu */
  sgrpc_tag_t t_shutdown;
  sgrpc_handlers_t h;
  int n_methods;
  int *streaming; /* [n_methods] */
  void **reg;     /* [n_methods] registered method handles */
  size_t max_send;
  int port;
  int closing;     /* sgrpc_server_destroy has begun */
  int in_dispatch; /* the async callback is running */
  sgrpc_call_t *live;
};

/* ---- the completion-queue thread ---- */

static void srv_push(sgrpc_server_t *s, sgrpc_tag_t *t) {
  t->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = t;
  else
    s->head = t;
  s->tail = t;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->async);
}

static void *srv_thread_main(void *arg) {
  sgrpc_server_t *s = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    sgrpc_tag_t *t = ev.tag;
    t->ok = ev.success;
    srv_push(s, t);
  }
  pthread_mutex_lock(&s->mu);
  s->thread_done = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* ---- calls: allocation, release ---- */

static sgrpc_call_t *call_new(sgrpc_server_t *s, int method) {
  sgrpc_call_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->srv = s;
  c->method = method;
  grpc_metadata_array_init(&c->md);
  grpc_call_details_init(&c->details);
  sgrpc_tag_t *tags[] = {&c->t_new, &c->t_close, &c->t_send, &c->t_status};
  for (int i = 0; i < 4; i++) tags[i]->kind = TAG_NEW + i, tags[i]->call = c;
  return c;
}

/* on_done's report of a call that reached the server (see sgrpc_handlers_t). */
static void call_report(sgrpc_call_t *c) {
  sgrpc_server_t *s = c->srv;
  const int through = c->sent && c->closed && !c->cancelled;
  if (!s->h.on_done || !c->live || !c->finished || s->closing || (c->no_msg && !through)) return;
  s->h.on_done(s->h.ud, c->method,
               c->aborted ? GRPC_STATUS_INTERNAL
               : through  ? c->status
               : c->late  ? GRPC_STATUS_DEADLINE_EXCEEDED
                          : GRPC_STATUS_CANCELLED);
}

static void call_free(sgrpc_call_t *c) {
  sgrpc_server_t *s = c->srv;
  call_report(c);
  if (c->live) {
    if (c->prev)
      c->prev->next = c->next;
    else
      s->live = c->next;
    if (c->next) c->next->prev = c->prev;
  }
  if (c->call) grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->md);
  grpc_call_details_destroy(&c->details);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  if (c->final_bb) grpc_byte_buffer_destroy(c->final_bb);
  if (c->has_text) grpc_slice_unref(c->status_text);
  if (c->peer) gpr_free(c->peer);
  free(c);
}

/* Frees c once it is finished and no batch of it is in flight (not inside its callbacks). */
static void call_maybe_free(sgrpc_call_t *c) {
  if (c->finished && c->ops == 0 && !c->in_cb) call_free(c);
}

static grpc_byte_buffer *bb_from(const uint8_t *msg, size_t n) {
  grpc_slice sl = n ? grpc_slice_from_copied_buffer((const char *)msg, n) : grpc_empty_slice();
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

/* Starts a batch of n ops on c with tag t; counts it in flight. */
static int call_batch(sgrpc_call_t *c, const grpc_op *ops, size_t n, sgrpc_tag_t *t) {
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, t, NULL);
  if (e != GRPC_CALL_OK)
    return qe_errf(QE_EBACKEND, "grpc_call_start_batch: %s", grpc_call_error_to_string(e));
  c->ops++;
  return 0;
}

/* Adds SEND_INITIAL_METADATA to ops[*n] unless it went already. */
static void call_add_initial_md(sgrpc_call_t *c, grpc_op *ops, size_t *n) {
  if (c->md_sent) return;
  ops[(*n)++].op = GRPC_OP_SEND_INITIAL_METADATA;
  c->md_sent = 1;
}

/* Cancels c after a local failure; its close completion then releases it. */
static void call_abort(sgrpc_call_t *c, const char *why) {
  qe_log(QE_LOG_WARN, "sched_grpc: call from %s aborted: %s", c->peer ? c->peer : "?", why);
  c->broken = 1;
  c->aborted = !c->closed; /* (a client already gone was sent nothing; one whose close is still
                              queued is counted as Internal, not Canceled: rare) */
  grpc_call_cancel_with_status(c->call, GRPC_STATUS_INTERNAL, why, NULL);
}

/* Sends the status (with final_bb, and the initial metadata if not sent yet). */
static int call_start_status(sgrpc_call_t *c) {
  grpc_op ops[3];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  call_add_initial_md(c, ops, &n);
  if (c->final_bb) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->final_bb;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = (grpc_status_code)c->status;
  ops[n++].data.send_status_from_server.status_details = &c->status_text;
  int rc = call_batch(c, ops, n, &c->t_status);
  if (rc) call_abort(c, qe_errmsg());
  return rc;
}

/* Ends c: records the status and starts it unless the call is over or a send is in flight. */
static int call_finish(sgrpc_call_t *c, int status, const char *text, const uint8_t *msg,
                       size_t n) {
  sgrpc_server_t *s = c->srv;
  int streaming = c->method >= 0 && s->streaming[c->method];
  c->finished = 1;
  c->status = status;
  c->status_text = grpc_slice_from_copied_string(text ? text : "");
  c->has_text = 1;
  if (c->closed || s->closing) return 0; /* nothing more reaches the client */
  if (n > s->max_send) {
    call_abort(c, "response larger than the maximum send message size");
    return qe_errf(QE_ERANGE, "response of %zu bytes over the limit of %zu", n, s->max_send);
  }
  if ((!streaming && status == GRPC_STATUS_OK) || (streaming && n > 0))
    c->final_bb = bb_from(msg, n);
  if (c->send_busy) {
    c->deferred = 1;
    return 0;
  }
  return call_start_status(c);
}

/* ---- completions, on the loop thread ---- */

static int srv_request(sgrpc_server_t *s, int method);

static void call_deliver(sgrpc_call_t *c) {
  sgrpc_server_t *s = c->srv;
  grpc_byte_buffer_reader rd;
  if (!grpc_byte_buffer_reader_init(&rd, c->payload)) {
    call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, "cannot read the request message", NULL, 0);
    return;
  }
  grpc_slice req = grpc_byte_buffer_reader_readall(&rd);
  grpc_byte_buffer_reader_destroy(&rd);
  grpc_byte_buffer_destroy(c->payload);
  c->payload = NULL;
  c->owned = 1;
  c->in_cb = 1;
  s->h.on_call(s->h.ud, c, c->method, GRPC_SLICE_START_PTR(req), GRPC_SLICE_LENGTH(req));
  c->in_cb = 0;
  grpc_slice_unref(req);
}

static void call_unknown(sgrpc_call_t *c) {
  char text[256];
  grpc_slice m = c->details.method;
  int len = GRPC_SLICE_LENGTH(m) > 200 ? 200 : (int)GRPC_SLICE_LENGTH(m);
  snprintf(text, sizeof text, "unknown method %.*s", len, (const char *)GRPC_SLICE_START_PTR(m));
  qe_log(QE_LOG_DEBUG, "sched_grpc: %s from %s", text, c->peer);
  call_finish(c, GRPC_STATUS_UNIMPLEMENTED, text, NULL, 0);
}

static void call_on_new(sgrpc_server_t *s, sgrpc_call_t *c, int ok) {
  if (!ok || s->closing) { /* shutdown (the slot's request failed) or a late arrival */
    if (ok && c->call) grpc_call_cancel(c->call, NULL);
    call_free(c);
    return;
  }
  srv_request(s, c->method);
  c->live = 1;
  c->next = s->live;
  if (s->live) s->live->prev = c;
  s->live = c;
  c->peer = grpc_call_get_peer(c->call);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->cancelled;
  if (call_batch(c, &op, 1, &c->t_close)) { /* cannot happen on a fresh call */
    qe_log(QE_LOG_ERROR, "sched_grpc: %s", qe_errmsg());
    grpc_call_cancel(c->call, NULL);
    c->finished = c->closed = 1;
  } else if (c->method < 0) {
    call_unknown(c);
  } else if (!c->payload) { /* no message (or one over the limit: grpc has answered already) */
    c->no_msg = 1;
    call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, "missing request message", NULL, 0);
  } else {
    call_deliver(c);
  }
  call_maybe_free(c);
}

/* Whether c's deadline has passed, or is within 0.25 s (a client's deadline passes up to ~0.1 s
 * before the server's copy of it). Registered methods only (the others are answered at once). */
static int call_late(const sgrpc_call_t *c) {
  const gpr_timespec slack = gpr_time_from_millis(250, GPR_TIMESPAN);
  return c->method >= 0 &&
         gpr_time_cmp(gpr_time_add(gpr_now(c->deadline.clock_type), slack), c->deadline) >= 0;
}

static void call_on_close(sgrpc_server_t *s, sgrpc_call_t *c, int ok) {
  c->ops--;
  c->closed = 1;
  if (!ok || c->cancelled) c->broken = 1, c->late = call_late(c);
  if (c->broken && c->owned && !c->finished && !c->cancel_cb) {
    c->cancel_cb = 1;
    if (s->h.on_cancel) {
      c->in_cb = 1;
      s->h.on_cancel(s->h.ud, c);
      c->in_cb = 0;
    }
  }
  call_maybe_free(c);
}

static void call_on_sent(sgrpc_server_t *s, sgrpc_call_t *c, int ok) {
  c->ops--;
  c->send_busy = 0;
  grpc_byte_buffer_destroy(c->send_bb);
  c->send_bb = NULL;
  if (!ok) c->broken = 1;
  if (c->finished) {
    if (c->deferred && !c->closed && !s->closing) call_start_status(c);
    c->deferred = 0;
  } else if (!s->closing) {
    c->in_cb = 1;
    s->h.on_sent(s->h.ud, c, ok);
    c->in_cb = 0;
  }
  call_maybe_free(c);
}

static void call_on_status(sgrpc_call_t *c, int ok) {
  c->ops--;
  c->sent = ok != 0;
  if (c->final_bb) grpc_byte_buffer_destroy(c->final_bb);
  c->final_bb = NULL;
  call_maybe_free(c);
}

static void srv_dispatch(sgrpc_server_t *s, sgrpc_tag_t *t) {
  switch (t->kind) {
  case TAG_NEW:
    call_on_new(s, t->call, t->ok);
    break;
  case TAG_CLOSE:
    call_on_close(s, t->call, t->ok);
    break;
  case TAG_SEND:
    call_on_sent(s, t->call, t->ok);
    break;
  case TAG_STATUS:
    call_on_status(t->call, t->ok);
    break;
  case TAG_SHUTDOWN:
    grpc_completion_queue_shutdown(s->cq);
    break;
  }
}

static sgrpc_tag_t *srv_take_all(sgrpc_server_t *s) {
  pthread_mutex_lock(&s->mu);
  sgrpc_tag_t *list = s->head;
  s->head = s->tail = NULL;
  pthread_mutex_unlock(&s->mu);
  return list;
}

static void srv_dispatch_list(sgrpc_server_t *s, sgrpc_tag_t *t) {
  while (t) {
    sgrpc_tag_t *next = t->next; /* t may be freed by its dispatch */
    srv_dispatch(s, t);
    t = next;
  }
}

static void srv_on_async(uv_async_t *a) {
  sgrpc_server_t *s = a->data;
  s->in_dispatch = 1;
  srv_dispatch_list(s, srv_take_all(s));
  s->in_dispatch = 0;
}

/* Requests the next call of method (-1: unregistered methods) into a fresh slot. */
static int srv_request(sgrpc_server_t *s, int method) {
  sgrpc_call_t *c = call_new(s, method);
  if (!c) {
    qe_log(QE_LOG_ERROR, "sched_grpc: out of memory: method %d no longer served", method);
    return QE_ENOMEM;
  }
  grpc_call_error e;
  if (method >= 0)
    e = grpc_server_request_registered_call(s->server, s->reg[method], &c->call, &c->deadline,
                                            &c->md, &c->payload, s->cq, s->cq, &c->t_new);
  else
    e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq, &c->t_new);
  if (e == GRPC_CALL_OK) return 0;
  qe_log(QE_LOG_ERROR, "sched_grpc: requesting calls of method %d: %s", method,
         grpc_call_error_to_string(e));
  call_free(c);
  return QE_EBACKEND;
}

/* ---- server life ---- */

static int srv_clamp(size_t v) {
  if (v == 0) v = SGRPC_DEFAULT_MAX_MSG;
  return v > INT_MAX ? INT_MAX : (int)v;
}

/* Plaintext, or TLS with the options' certificate (and client verification with a client CA). */
static grpc_server_credentials *srv_creds(const sgrpc_options_t *opt) {
  if (!opt || !opt->tls_cert_pem) return grpc_insecure_server_credentials_create();
  grpc_ssl_pem_key_cert_pair kp = {opt->tls_key_pem, opt->tls_cert_pem};
  return grpc_ssl_server_credentials_create_ex(
      opt->tls_client_ca_pem, &kp, 1,
      opt->tls_client_ca_pem ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
      NULL);
}

/* Creates the grpc server and its queue, registers the methods and binds addr (not started;
 * a port past 65535, which gRPC would take modulo 65536, refused first). */
static int srv_setup(sgrpc_server_t *s, const char *addr, const sgrpc_options_t *opt,
                     const sgrpc_method_t *methods) {
  if (!qe_listen_addr_ok(addr))
    return qe_errf(QE_EINVAL,
                   "grpc: listen address \"%s\" needs a port in 0..65535 (HOST:PORT) or a path "
                   "(unix:PATH)",
                   addr);
  grpc_arg args[3];
  memset(args, 0, sizeof args);
  args[0].type = args[1].type = args[2].type = GRPC_ARG_INTEGER;
  args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = srv_clamp(opt ? opt->max_recv_msg : 0);
  args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = srv_clamp(opt ? opt->max_send_msg : 0);
  args[2].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
  args[2].value.integer = 0;
  grpc_channel_args ca = {3, args};
  s->max_send = (size_t)args[1].value.integer;
  s->server = grpc_server_create(&ca, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  if (!s->server || !s->cq) return qe_errf(QE_EBACKEND, "cannot create the grpc server");
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  for (int i = 0; i < s->n_methods; i++) {
    s->reg[i] = grpc_server_register_method(s->server, methods[i].path, NULL,
                                            GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (!s->reg[i]) return qe_errf(QE_EINVAL, "cannot register method %s", methods[i].path);
  }
  const int tls = opt && opt->tls_cert_pem;
  grpc_server_credentials *creds = srv_creds(opt);
  int port = creds ? grpc_server_add_http2_port(s->server, addr, creds) : 0;
  if (creds) grpc_server_credentials_release(creds);
  if (port <= 0 && tls)
    return qe_errf(QE_EIO,
                   "cannot listen on %s with TLS (an address in use, or a certificate, "
                   "key or client CA that the TLS library refused)",
                   addr);
  if (port <= 0) return qe_errf(QE_EIO, "cannot listen on %s", addr);
  s->port = strncmp(addr, "unix", 4) == 0 ? 0 : port; /* unix: and unix-abstract: */
  return 0;
}

/* Undoes srv_setup for a server that was never started (the cq thread not running). */
static void srv_teardown_unstarted(sgrpc_server_t *s) {
  if (s->server) grpc_server_destroy(s->server);
  if (s->cq) {
    grpc_completion_queue_shutdown(s->cq);
    grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_completion_queue_destroy(s->cq);
  }
}

static int srv_check_args(uv_loop_t *loop, const char *addr, const sgrpc_method_t *methods,
                          int n_methods, const sgrpc_handlers_t *h, sgrpc_server_t **out) {
  if (!loop || !addr || !h || !out || n_methods < 0 || (n_methods && !methods) || !h->on_call)
    return qe_errf(QE_EINVAL, "sgrpc_server_create: missing argument");
  for (int i = 0; i < n_methods; i++) {
    if (!methods[i].path || methods[i].path[0] != '/')
      return qe_errf(QE_EINVAL, "method %d: path must start with '/'", i);
    if (methods[i].streaming && !h->on_sent)
      return qe_errf(QE_EINVAL, "method %s is streaming but on_sent is NULL", methods[i].path);
  }
  return 0;
}

static void srv_free_mem(sgrpc_server_t *s) {
  free(s->streaming);
  free(s->reg);
  free(s);
}

int sgrpc_server_create(uv_loop_t *loop, const char *addr, const sgrpc_options_t *opt,
                        const sgrpc_method_t *methods, int n_methods, const sgrpc_handlers_t *h,
                        sgrpc_server_t **out) {
  int rc = srv_check_args(loop, addr, methods, n_methods, h, out);
  if (rc) return rc;
  if (opt &&
      (!opt->tls_cert_pem != !opt->tls_key_pem || (opt->tls_client_ca_pem && !opt->tls_cert_pem)))
    return qe_errf(QE_EINVAL, "TLS needs a certificate and its key (a client CA only with both)");
  *out = NULL;
  sgrpc_server_t *s = calloc(1, sizeof *s);
  if (!s) return qe_errf(QE_ENOMEM, "sgrpc_server_create");
  s->streaming = calloc((size_t)n_methods + 1, sizeof *s->streaming);
  s->reg = calloc((size_t)n_methods + 1, sizeof *s->reg);
  if (!s->streaming || !s->reg) {
    rc = qe_errf(QE_ENOMEM, "sgrpc_server_create");
    goto fail_mem;
  }
  s->loop = loop;
  s->h = *h;
  s->n_methods = n_methods;
  for (int i = 0; i < n_methods; i++) s->streaming[i] = methods[i].streaming != 0;
  s->t_shutdown.kind = TAG_SHUTDOWN;
  if (pthread_mutex_init(&s->mu, NULL)) {
    rc = qe_errf(QE_EBACKEND, "pthread_mutex_init");
    goto fail_mem;
  }
  if (pthread_cond_init(&s->cv, NULL)) {
    rc = qe_errf(QE_EBACKEND, "pthread_cond_init");
    goto fail_mutex;
  }
  grpc_init();
  if ((rc = srv_setup(s, addr, opt, methods))) goto fail_grpc;
  if (pthread_create(&s->thread, NULL, srv_thread_main, s)) {
    rc = qe_errf(QE_EBACKEND, "pthread_create");
    goto fail_grpc;
  }
  int e = uv_async_init(loop, &s->async, srv_on_async);
  if (e) {
    rc = qe_errf(QE_EBACKEND, "uv_async_init: %s", uv_strerror(e));
    goto fail_thread;
  }
  s->async.data = s;
  grpc_server_start(s->server);
  for (int i = -1; i < n_methods; i++) srv_request(s, i);
  *out = s;
  return 0;

fail_thread:
  grpc_completion_queue_shutdown(s->cq);
  pthread_join(s->thread, NULL);
  grpc_server_destroy(s->server);
  grpc_completion_queue_destroy(s->cq);
  s->server = NULL, s->cq = NULL;
fail_grpc:
  srv_teardown_unstarted(s);
  grpc_shutdown();
  pthread_cond_destroy(&s->cv);
fail_mutex:
  pthread_mutex_destroy(&s->mu);
fail_mem:
  srv_free_mem(s);
  return rc;
}

int sgrpc_server_port(const sgrpc_server_t *s) { return s ? s->port : 0; }

/* Dispatches completions (no on_call/on_sent: closing) until the cq thread has exited. */
static void srv_drain(sgrpc_server_t *s) {
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (!s->head && !s->thread_done) pthread_cond_wait(&s->cv, &s->mu);
    sgrpc_tag_t *list = s->head;
    int done = s->thread_done;
    s->head = s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    if (!list && done) return;
    srv_dispatch_list(s, list);
  }
}

static void srv_on_async_closed(uv_handle_t *h) { srv_free_mem(h->data); }

void sgrpc_server_destroy(sgrpc_server_t *s) {
  if (!s) return;
  QE_ASSERT(!s->in_dispatch && !s->closing); /* not from a handler callback, not twice */
  s->closing = 1;
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
  grpc_server_cancel_all_calls(s->server);
  srv_drain(s); /* the shutdown tag shuts the queue down; the thread then exits */
  pthread_join(s->thread, NULL);
  while (s->live) { /* calls whose handler never finished them */
    qe_log(QE_LOG_WARN, "sched_grpc: call from %s never finished; freed at shutdown",
           s->live->peer ? s->live->peer : "?");
    call_free(s->live);
  }
  grpc_server_destroy(s->server);
  grpc_completion_queue_destroy(s->cq);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  uv_close((uv_handle_t *)&s->async, srv_on_async_closed);
  grpc_shutdown();
}

/* ---- calls: the owner's API ---- */

int sgrpc_call_metadata(const sgrpc_call_t *c, const char *key, char *buf, size_t n) {
  if (!c || !key || !buf || n == 0) return qe_errf(QE_EINVAL, "sgrpc_call_metadata: bad argument");
  size_t klen = strlen(key);
  for (size_t i = 0; i < c->md.count; i++) {
    const grpc_metadata *m = &c->md.metadata[i];
    if (GRPC_SLICE_LENGTH(m->key) != klen ||
        strncasecmp((const char *)GRPC_SLICE_START_PTR(m->key), key, klen) != 0)
      continue;
    const size_t len = GRPC_SLICE_LENGTH(m->value), vlen = len > n - 1 ? n - 1 : len;
    memcpy(buf, GRPC_SLICE_START_PTR(m->value), vlen);
    buf[vlen] = '\0';
    return vlen < len ? QE_ERANGE : 0;
  }
  return QE_ENOTFOUND;
}

int sgrpc_send(sgrpc_call_t *c, const uint8_t *msg, size_t n) {
  sgrpc_server_t *s = c->srv;
  if (!s->streaming[c->method]) return qe_errf(QE_EINVAL, "sgrpc_send on a unary call");
  if (c->finished) return qe_errf(QE_EINVAL, "sgrpc_send after sgrpc_finish");
  if (c->send_busy) return qe_errf(QE_EINVAL, "send pending");
  if (c->broken || c->closed || s->closing) return qe_errf(QE_ECANCELED, "call cancelled");
  if (n > s->max_send)
    return qe_errf(QE_ERANGE, "message of %zu bytes over the limit of %zu", n, s->max_send);
  grpc_op ops[2];
  size_t k = 0;
  memset(ops, 0, sizeof ops);
  int md_was_sent = c->md_sent;
  call_add_initial_md(c, ops, &k);
  c->send_bb = bb_from(msg, n);
  ops[k].op = GRPC_OP_SEND_MESSAGE;
  ops[k++].data.send_message.send_message = c->send_bb;
  int rc = call_batch(c, ops, k, &c->t_send);
  if (rc) {
    grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
    c->md_sent = md_was_sent;
    return rc;
  }
  c->send_busy = 1;
  return 0;
}

int sgrpc_finish(sgrpc_call_t *c, int status, const char *message, const uint8_t *msg, size_t n) {
  QE_ASSERT(c && !c->finished);
  int bad = status < GRPC_STATUS_OK || status > GRPC_STATUS_UNAUTHENTICATED;
  int rc = bad ? call_finish(c, GRPC_STATUS_INTERNAL, "invalid status", NULL, 0)
               : call_finish(c, status, message, msg, n);
  if (bad) rc = qe_errf(QE_EINVAL, "invalid grpc status %d", status);
  call_maybe_free(c);
  return rc;
}

void sgrpc_call_set_data(sgrpc_call_t *c, void *data) { c->data = data; }
void *sgrpc_call_data(const sgrpc_call_t *c) { return c->data; }
int sgrpc_call_method(const sgrpc_call_t *c) { return c->method; }
const char *sgrpc_call_peer(const sgrpc_call_t *c) { return c->peer ? c->peer : "?"; }
