/* test_sched_grpc: the gRPC server glue against a real gRPC C core client on loopback.
 * The server's uv loop runs on the main thread; the client runs on its own thread with its own
 * completion queue. Covered: a unary echo reading "authorization"; a 100-message stream driven
 * by on_sent; streams finished while their last send is pending and with a last message; an error
 * status with its message; a client cancelling mid-stream (on_cancel, no on_sent after finish); a
 * deadline passing on a held call; a request over max_recv_msg (RESOURCE_EXHAUSTED, the server
 * keeps serving); a request with no message; an unknown method (UNIMPLEMENTED); 64 concurrent
 * streams, one of which never reads while the rest complete; a Unix-domain server; create errors;
 * and destroy with calls still open (one of which the handler never finishes); on_done's code of
 * each call (none for the oversize request or during the destroy). Every call carries a
 * deadline and every wait is bounded, so the test cannot hang. */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "qe_status.h"
#include "sched_grpc.h"
#include "test_util.h"

enum { M_UNARY, M_STREAM, M_FAIL, M_HOLD, N_METHODS };
static const sgrpc_method_t methods[N_METHODS] = {{"/qetest.Echo/Unary", 0},
                                                  {"/qetest.Echo/Stream", 1},
                                                  {"/qetest.Echo/Fail", 0},
                                                  {"/qetest.Echo/Hold", 0}};

#define MAX_RECV        (1u << 20)
#define N_CONCURRENT    64
#define SLOW_COUNT      1000000 /* 16 GB in all: can never be sent to a client that never reads */
#define SLOW_SIZE       16384
#define FAIL_TEXT       "tenant 'acme' is over its quota"
#define CALL_TIMEOUT_MS 60000

/* Failures seen on the client thread (tu_failures belongs to the main thread). */
static atomic_int client_failures;
#define CCHECK(e)                                                                                  \
  do {                                                                                             \
    if (!(e)) {                                                                                    \
      fprintf(stderr, "FAIL (client) %s:%d: %s\n", __FILE__, __LINE__, #e);                        \
      atomic_fetch_add(&client_failures, 1);                                                       \
    }                                                                                              \
  } while (0)

/* ---- server side (loop thread only) ---- */

typedef struct {
  char label[32];
  int method, count, size, sent, pending, cancelled, finished, send_failed;
} srec_t;

typedef struct {
  srec_t recs[256];
  int n_recs;
  char auth[128];
  int n_unary, n_held, late_sent, late_cancel, destroying, cancel_in_destroy;
  int done[N_METHODS + 1][17], n_done; /* on_done's reports by method + 1 and code */
} srv_state_t;

static srv_state_t st;

static srec_t *srv_find(const char *label) {
  for (int i = 0; i < st.n_recs; i++)
    if (strcmp(st.recs[i].label, label) == 0) return &st.recs[i];
  return NULL;
}

static void srv_finish(sgrpc_call_t *call, srec_t *r, int status, const char *text,
                       const uint8_t *msg, size_t n) {
  r->finished = 1;
  CHECK_OK(sgrpc_finish(call, status, text, msg, n));
}

/* Message seq of a stream: [seq big-endian u32][bytes (seq + i) & 0xff]. */
static void stream_msg(uint8_t *buf, int seq, int size) {
  buf[0] = (uint8_t)(seq >> 24), buf[1] = (uint8_t)(seq >> 16);
  buf[2] = (uint8_t)(seq >> 8), buf[3] = (uint8_t)seq;
  for (int i = 4; i < size; i++) buf[i] = (uint8_t)(seq + i);
}

/* Sends message r->sent. The last one of "withfinal" goes with the status; "eager" finishes
 * right after its last send, without waiting for on_sent. */
static void srv_send_next(sgrpc_call_t *call, srec_t *r) {
  static uint8_t buf[SLOW_SIZE];
  int last = r->sent == r->count - 1;
  stream_msg(buf, r->sent, r->size);
  if (last && strcmp(r->label, "withfinal") == 0) {
    r->sent++;
    srv_finish(call, r, 0, "", buf, (size_t)r->size);
    return;
  }
  CHECK_OK(sgrpc_send(call, buf, (size_t)r->size));
  r->pending = 1;
  if (last && strcmp(r->label, "eager") == 0) srv_finish(call, r, 0, "", NULL, 0);
}

static void srv_unary(sgrpc_call_t *call, srec_t *r, const uint8_t *req, size_t n) {
  char small[8];
  st.n_unary++;
  CHECK_OK(sgrpc_call_metadata(call, "authorization", st.auth, sizeof st.auth));
  CHECK(sgrpc_call_metadata(call, "Authorization", small, sizeof small) == QE_ERANGE);
  CHECK(strlen(small) == sizeof small - 1); /* truncated, NUL-terminated */
  CHECK(sgrpc_call_metadata(call, "x-absent", small, sizeof small) == QE_ENOTFOUND);
  CHECK(sgrpc_send(call, req, n) == QE_EINVAL); /* unary: no sgrpc_send */
  CHECK(sgrpc_call_method(call) == M_UNARY);
  CHECK(strncmp(sgrpc_call_peer(call), "ipv4:127.0.0.1:", 15) == 0 ||
        strncmp(sgrpc_call_peer(call), "unix:", 5) == 0);
  uint8_t *rev = malloc(n + 1);
  for (size_t i = 0; i < n; i++) rev[i] = req[n - 1 - i];
  srv_finish(call, r, 0, NULL, rev, n);
  free(rev);
}

static void srv_on_call(void *ud, sgrpc_call_t *call, int method, const uint8_t *req, size_t n) {
  CHECK(ud == &st);
  CHECK(st.n_recs < 256 && !st.destroying);
  if (st.n_recs >= 256) {
    sgrpc_finish(call, 8, "test full", NULL, 0);
    return;
  }
  srec_t *r = &st.recs[st.n_recs++];
  r->method = method;
  sgrpc_call_set_data(call, r);
  CHECK(sgrpc_call_data(call) == r);
  if (method == M_UNARY) {
    srv_unary(call, r, req, n);
    return;
  }
  if (method == M_FAIL) {
    srv_finish(call, r, 9, FAIL_TEXT, NULL, 0);
    return;
  }
  char text[64];
  snprintf(text, sizeof text, "%.*s", (int)(n < 63 ? n : 63), (const char *)req);
  if (method == M_HOLD) { /* held until its deadline or the server's destroy */
    snprintf(r->label, sizeof r->label, "%.31s", text);
    st.n_held++;
    return;
  }
  CHECK(sscanf(text, "%d %d %31s", &r->count, &r->size, r->label) == 3);
  CHECK(r->count > 0 && r->size >= 4 && r->size <= SLOW_SIZE);
  srv_send_next(call, r);
  CHECK(sgrpc_send(call, req, n) == QE_EINVAL); /* one send at a time */
}

static void srv_on_sent(void *ud, sgrpc_call_t *call, int ok) {
  srec_t *r = sgrpc_call_data(call);
  CHECK(!st.destroying);
  if (r->finished) st.late_sent++;
  r->pending = 0;
  if (!ok) {
    r->send_failed++;
    return; /* on_cancel follows (or came) */
  }
  if (++r->sent == r->count) {
    srv_finish(call, r, 0, "", NULL, 0);
    return;
  }
  srv_send_next(call, r);
}

static void srv_on_cancel(void *ud, sgrpc_call_t *call) {
  srec_t *r = sgrpc_call_data(call);
  if (r->finished) st.late_cancel++;
  r->cancelled++;
  if (st.destroying) st.cancel_in_destroy++;
  if (r->method == M_STREAM) {
    int rc = sgrpc_send(call, (const uint8_t *)"x", 1);
    if (st.destroying)
      CHECK(rc == QE_EINVAL || rc == QE_ECANCELED); /* no on_sent in destroy */
    else
      CHECK(rc == (r->pending ? QE_EINVAL : QE_ECANCELED));
  }
  if (st.destroying && strcmp(r->label, "orphan") == 0) return; /* destroy frees it anyway */
  srv_finish(call, r, 1, "cancelled", NULL, 0);
}

static void srv_on_done(void *ud, int method, int status) {
  CHECK(ud == &st && !st.destroying && method >= -1 && method < N_METHODS && status >= 0 &&
        status <= 16);
  if (method >= -1 && method < N_METHODS && status >= 0 && status <= 16)
    st.done[method + 1][status]++, st.n_done++;
}

static const sgrpc_handlers_t handlers = {&st, srv_on_call, srv_on_cancel, srv_on_sent,
                                          srv_on_done};

/* ---- client side (client thread only) ---- */

enum { K_START, K_MSG, K_STATUS };
typedef struct ccall ccall_t;
typedef struct {
  ccall_t *c;
  int kind;
} ctag_t;

struct ccall {
  grpc_call *call;
  grpc_metadata auth_md;
  grpc_metadata_array md_init, md_trail;
  grpc_byte_buffer *send_bb, *recv_bb;
  grpc_status_code status;
  grpc_slice details;
  ctag_t t[3];
  int pending;      /* batches in flight */
  int stream, read; /* streaming response; RECV_MESSAGE issued */
  int n_msgs, bad_msgs, cancel_after, status_done;
  uint8_t *resp; /* unary: the response */
  size_t resp_n;
};

typedef struct {
  grpc_channel *ch, *uch;
  grpc_completion_queue *cq;
  int port;
  const char *unix_path;
} client_t;

static atomic_int phase;         /* 1: the client's open calls are in place for destroy */
static atomic_int server_gone;   /* 1: the main thread destroyed the servers */
static atomic_int client_exited; /* 1: the client thread is done */

static gpr_timespec in_ms(int ms) {
  return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static void cc_recv(ccall_t *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->recv_bb;
  CCHECK(grpc_call_start_batch(c->call, &op, 1, &c->t[K_MSG], NULL) == GRPC_CALL_OK);
  c->pending++;
}

/* Starts a call: method, request (NULL: none sent), authorization (NULL: none), deadline. */
static void cc_start(client_t *cl, grpc_channel *ch, ccall_t *c, const char *method,
                     const void *req, size_t n, const char *auth, int deadline_ms, int read) {
  memset(c, 0, sizeof *c);
  for (int k = 0; k < 3; k++) c->t[k].c = c, c->t[k].kind = k;
  grpc_metadata_array_init(&c->md_init);
  grpc_metadata_array_init(&c->md_trail);
  c->details = grpc_empty_slice();
  c->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cl->cq,
                                     grpc_slice_from_static_string(method), NULL,
                                     in_ms(deadline_ms), NULL);
  grpc_op ops[4];
  size_t k = 0;
  memset(ops, 0, sizeof ops);
  ops[k].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (auth) {
    c->auth_md.key = grpc_slice_from_static_string("authorization");
    c->auth_md.value = grpc_slice_from_static_string(auth);
    ops[k].data.send_initial_metadata.count = 1;
    ops[k].data.send_initial_metadata.metadata = &c->auth_md;
  }
  k++;
  if (req) {
    grpc_slice sl = grpc_slice_from_copied_buffer(req, n);
    c->send_bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    ops[k].op = GRPC_OP_SEND_MESSAGE;
    ops[k++].data.send_message.send_message = c->send_bb;
  }
  ops[k++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[k].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[k++].data.recv_initial_metadata.recv_initial_metadata = &c->md_init;
  CCHECK(grpc_call_start_batch(c->call, ops, k, &c->t[K_START], NULL) == GRPC_CALL_OK);
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &c->md_trail;
  ops[0].data.recv_status_on_client.status = &c->status;
  ops[0].data.recv_status_on_client.status_details = &c->details;
  CCHECK(grpc_call_start_batch(c->call, ops, 1, &c->t[K_STATUS], NULL) == GRPC_CALL_OK);
  c->pending = 2;
  c->read = read;
  if (read) cc_recv(c);
}

static void cc_on_msg(ccall_t *c) {
  grpc_byte_buffer_reader rd;
  CCHECK(grpc_byte_buffer_reader_init(&rd, c->recv_bb));
  grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
  grpc_byte_buffer_reader_destroy(&rd);
  grpc_byte_buffer_destroy(c->recv_bb);
  c->recv_bb = NULL;
  const uint8_t *p = GRPC_SLICE_START_PTR(s);
  size_t n = GRPC_SLICE_LENGTH(s);
  if (c->stream) {
    uint8_t want[SLOW_SIZE];
    if (n < 4 || n > SLOW_SIZE)
      c->bad_msgs++;
    else
      stream_msg(want, c->n_msgs, (int)n), c->bad_msgs += memcmp(want, p, n) != 0;
  } else {
    free(c->resp);
    c->resp = malloc(n + 1);
    if (n) memcpy(c->resp, p, n);
    c->resp_n = n;
  }
  grpc_slice_unref(s);
  if (++c->n_msgs == c->cancel_after) grpc_call_cancel(c->call, NULL);
}

static void cc_event(grpc_event ev) {
  ctag_t *t = ev.tag;
  ccall_t *c = t->c;
  c->pending--;
  if (t->kind == K_STATUS) c->status_done = 1;
  if (t->kind != K_MSG) return;
  if (!ev.success || !c->recv_bb) return; /* end of the stream */
  cc_on_msg(c);
  cc_recv(c);
}

static int cc_done(const ccall_t *c) { return c->status_done && c->pending == 0; }

/* Pumps the client queue until calls[0..n) are all done (or 90 s pass: a failure). */
static void cc_wait(client_t *cl, ccall_t *calls, int n) {
  gpr_timespec limit = in_ms(90000);
  for (;;) {
    int all = 1;
    for (int i = 0; i < n && all; i++) all = cc_done(&calls[i]);
    if (all) return;
    grpc_event ev = grpc_completion_queue_next(cl->cq, in_ms(1000), NULL);
    if (ev.type == GRPC_OP_COMPLETE) cc_event(ev);
    if (gpr_time_cmp(gpr_now(GPR_CLOCK_REALTIME), limit) > 0) {
      CCHECK(!"client calls did not complete in 90 s");
      return;
    }
  }
}

static void cc_release(ccall_t *c) {
  if (!cc_done(c)) grpc_call_cancel(c->call, NULL);
  grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->md_init);
  grpc_metadata_array_destroy(&c->md_trail);
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
  grpc_slice_unref(c->details);
  free(c->resp);
}

static int cc_details_is(const ccall_t *c, const char *text) {
  return GRPC_SLICE_LENGTH(c->details) == strlen(text) &&
         memcmp(GRPC_SLICE_START_PTR(c->details), text, strlen(text)) == 0;
}

/* One unary call on ch, waited for; returns its status (the response in *c, released). */
static int cc_unary(client_t *cl, grpc_channel *ch, const char *method, const void *req, size_t n,
                    const char *auth, const char *want_resp) {
  ccall_t c;
  cc_start(cl, ch, &c, method, req, n, auth, CALL_TIMEOUT_MS, 1);
  cc_wait(cl, &c, 1);
  int status = c.status;
  if (want_resp)
    CCHECK(c.resp_n == strlen(want_resp) &&
           (!c.resp_n || memcmp(c.resp, want_resp, c.resp_n) == 0));
  cc_release(&c);
  return status;
}

static void cl_unary_cases(client_t *cl) {
  const char *echo = "/qetest.Echo/Unary";
  CCHECK(cc_unary(cl, cl->ch, echo, "hello, world", 12, "Bearer k-123", "dlrow ,olleh") == 0);
  CCHECK(cc_unary(cl, cl->uch, echo, "unix", 4, "Bearer k-unix", "xinu") == 0);
  CCHECK(cc_unary(cl, cl->ch, echo, "", 0, "Bearer k-123", "") == 0); /* an empty message */
  ccall_t c;
  cc_start(cl, cl->ch, &c, "/qetest.Echo/Fail", "x", 1, NULL, CALL_TIMEOUT_MS, 1);
  cc_wait(cl, &c, 1);
  CCHECK(c.status == GRPC_STATUS_FAILED_PRECONDITION && cc_details_is(&c, FAIL_TEXT));
  CCHECK(c.n_msgs == 0);
  cc_release(&c);
  CCHECK(cc_unary(cl, cl->ch, "/qetest.Echo/Nope", "x", 1, NULL, NULL) ==
         GRPC_STATUS_UNIMPLEMENTED);
  CCHECK(cc_unary(cl, cl->ch, echo, NULL, 0, "Bearer k-123", NULL) ==
         GRPC_STATUS_INVALID_ARGUMENT); /* no request message */
  size_t big_n = 2 * MAX_RECV;
  char *big = calloc(1, big_n);
  CCHECK(cc_unary(cl, cl->ch, echo, big, big_n, "Bearer k-big", NULL) ==
         GRPC_STATUS_RESOURCE_EXHAUSTED);
  CCHECK(cc_unary(cl, cl->ch, echo, big, MAX_RECV / 2, "Bearer k-123", NULL) == 0); /* fits */
  free(big);
  CCHECK(cc_unary(cl, cl->ch, echo, "abc", 3, "Bearer k-after", "cba") == 0); /* still serving */
}

static void cc_stream(client_t *cl, ccall_t *c, int count, int size, const char *label, int read,
                      int deadline_ms) {
  char req[64];
  int n = snprintf(req, sizeof req, "%d %d %s", count, size, label);
  cc_start(cl, cl->ch, c, "/qetest.Echo/Stream", req, (size_t)n, NULL, deadline_ms, read);
  c->stream = 1;
}

static void cl_stream_cases(client_t *cl) {
  ccall_t c;
  cc_stream(cl, &c, 100, 64, "hundred", 1, CALL_TIMEOUT_MS);
  cc_wait(cl, &c, 1);
  CCHECK(c.status == GRPC_STATUS_OK && c.n_msgs == 100 && c.bad_msgs == 0);
  cc_release(&c);
  const char *finishes[] = {"eager", "withfinal"};
  for (int i = 0; i < 2; i++) {
    cc_stream(cl, &c, 50, 100, finishes[i], 1, CALL_TIMEOUT_MS);
    cc_wait(cl, &c, 1);
    CCHECK(c.status == GRPC_STATUS_OK && c.n_msgs == 50 && c.bad_msgs == 0);
    cc_release(&c);
  }
  cc_stream(cl, &c, SLOW_COUNT, 1024, "cancel", 1, CALL_TIMEOUT_MS);
  c.cancel_after = 10;
  cc_wait(cl, &c, 1);
  CCHECK(c.status == GRPC_STATUS_CANCELLED && c.n_msgs >= 10 && c.bad_msgs == 0);
  cc_release(&c);
  /* 3 s: long enough that the call reaches the server's handler before its deadline */
  cc_start(cl, cl->ch, &c, "/qetest.Echo/Hold", "deadline", 8, NULL, 3000, 1);
  cc_wait(cl, &c, 1);
  CCHECK(c.status == GRPC_STATUS_DEADLINE_EXCEEDED);
  cc_release(&c);
}

/* 63 streams that read and one that never does; then three held unary calls stay open with
 * the slow stream until the server is destroyed (the handler never finishes "orphan"). */
static void cl_concurrent_and_destroy(client_t *cl) {
  static ccall_t c[N_CONCURRENT], open[4];
  cc_stream(cl, &open[0], SLOW_COUNT, SLOW_SIZE, "slow", 0, 120000);
  for (int i = 0; i < N_CONCURRENT - 1; i++) {
    char label[16];
    snprintf(label, sizeof label, "c%d", i);
    cc_stream(cl, &c[i], 200, 1024, label, 1, CALL_TIMEOUT_MS);
  }
  cc_wait(cl, c, N_CONCURRENT - 1);
  for (int i = 0; i < N_CONCURRENT - 1; i++) {
    CCHECK(c[i].status == GRPC_STATUS_OK && c[i].n_msgs == 200 && c[i].bad_msgs == 0);
    cc_release(&c[i]);
  }
  CCHECK(!cc_done(&open[0])); /* the slow one is still open */
  cc_start(cl, cl->ch, &open[1], "/qetest.Echo/Hold", "held1", 5, NULL, 120000, 1);
  cc_start(cl, cl->ch, &open[2], "/qetest.Echo/Hold", "held2", 5, NULL, 120000, 1);
  cc_start(cl, cl->ch, &open[3], "/qetest.Echo/Hold", "orphan", 6, NULL, 120000, 1);
  atomic_store(&phase, 1);
  for (int i = 0; i < 9000 && !atomic_load(&server_gone); i++) usleep(10000);
  CCHECK(atomic_load(&server_gone));
  open[0].read = 1; /* the status of a stream comes after the messages already received */
  cc_recv(&open[0]);
  cc_wait(cl, open, 4);
  for (int i = 0; i < 4; i++) {
    CCHECK(cc_done(&open[i]) && open[i].status != GRPC_STATUS_OK);
    CCHECK(open[i].status != GRPC_STATUS_DEADLINE_EXCEEDED); /* ended by the destroy */
    cc_release(&open[i]);
  }
}

static grpc_channel *cl_channel(const char *target) {
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  grpc_channel *ch = grpc_channel_create(target, creds, NULL);
  grpc_channel_credentials_release(creds);
  return ch;
}

static void *client_main(void *arg) {
  client_t *cl = arg;
  char target[256];
  grpc_init();
  snprintf(target, sizeof target, "127.0.0.1:%d", cl->port);
  cl->ch = cl_channel(target);
  snprintf(target, sizeof target, "unix:%s", cl->unix_path);
  cl->uch = cl_channel(target);
  cl->cq = grpc_completion_queue_create_for_next(NULL);
  cl_unary_cases(cl);
  cl_stream_cases(cl);
  cl_concurrent_and_destroy(cl);
  grpc_channel_destroy(cl->ch);
  grpc_channel_destroy(cl->uch);
  grpc_completion_queue_shutdown(cl->cq);
  while (grpc_completion_queue_next(cl->cq, in_ms(30000), NULL).type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cl->cq);
  grpc_shutdown();
  atomic_store(&client_exited, 1);
  return NULL;
}

/* ---- main thread: the loop, and the destroy once the client's open calls are in place ---- */

typedef struct {
  sgrpc_server_t *tcp, *unx;
  uv_timer_t timer;
  int ticks, ready_ticks;
} main_t;

/* The calls ended before the destroy: 7 unary (5 echoed, 1 without a message, 1 Fail; the
 * oversize one is not reported), the unknown method, 66 streams to their end, "cancel" and
 * "deadline". */
#define N_DONE 76

static int destroy_ready(void) {
  srec_t *slow = srv_find("slow"), *cancel = srv_find("cancel"), *dl = srv_find("deadline");
  return atomic_load(&phase) && st.n_held >= 4 && slow && slow->sent > 0 && cancel &&
         cancel->cancelled && dl && dl->cancelled && st.n_done >= N_DONE;
}

/* on_done: the code each call's client was sent, by method. */
static void check_done(void) {
  CHECK(st.n_done == N_DONE);
  CHECK(st.done[M_UNARY + 1][GRPC_STATUS_OK] == 5);
  CHECK(st.done[M_UNARY + 1][GRPC_STATUS_INVALID_ARGUMENT] == 1); /* no message */
  CHECK(st.done[M_UNARY + 1][GRPC_STATUS_RESOURCE_EXHAUSTED] == 0);
  CHECK(st.done[M_FAIL + 1][GRPC_STATUS_FAILED_PRECONDITION] == 1);
  CHECK(st.done[0][GRPC_STATUS_UNIMPLEMENTED] == 1);
  CHECK(st.done[M_STREAM + 1][GRPC_STATUS_OK] == 66);
  CHECK(st.done[M_STREAM + 1][GRPC_STATUS_CANCELLED] == 1);
  CHECK(st.done[M_HOLD + 1][GRPC_STATUS_DEADLINE_EXCEEDED] == 1);
}

static void check_before_destroy(void) {
  srec_t *slow = srv_find("slow"), *cancel = srv_find("cancel"), *dl = srv_find("deadline");
  CHECK(strcmp(st.auth, "Bearer k-after") == 0);
  CHECK(st.n_unary == 5); /* echo x3, the 0.5 MiB one, "abc"; not the oversize one */
  /* the client read 10 messages: the 10th was started after the 9th completed */
  CHECK(cancel && cancel->cancelled == 1 && cancel->finished && cancel->sent >= 9);
  CHECK(dl && dl->cancelled == 1 && dl->finished);
  CHECK(slow && !slow->finished && !slow->cancelled && slow->sent < slow->count);
  for (int i = 0; i < N_CONCURRENT - 1; i++) {
    char label[16];
    snprintf(label, sizeof label, "c%d", i);
    srec_t *r = srv_find(label);
    CHECK(r && r->finished && r->sent == 200 && !r->cancelled && !r->send_failed);
  }
  srec_t *e = srv_find("eager"), *f = srv_find("withfinal");
  CHECK(e && e->finished && e->sent == 49 && !e->cancelled); /* its last on_sent never came */
  CHECK(f && f->finished && f->sent == 50 && !f->cancelled);
  srec_t *h = srv_find("hundred");
  CHECK(h && h->finished && h->sent == 100);
  check_done();
}

static void on_tick(uv_timer_t *t) {
  main_t *m = t->data;
  int ready = destroy_ready();
  if (atomic_load(&phase)) m->ready_ticks++;
  /* 60 s after the client is in place, or 240 s in all: give up waiting and fail */
  if (!ready && m->ready_ticks < 6000 && ++m->ticks < 24000) return;
  CHECK(ready);
  check_before_destroy();
  st.destroying = 1;
  sgrpc_server_destroy(m->tcp);
  sgrpc_server_destroy(m->unx);
  st.destroying = 0;
  atomic_store(&server_gone, 1);
  CHECK(st.cancel_in_destroy == 4); /* slow, held1, held2, orphan */
  CHECK(st.n_done == N_DONE);       /* (calls ended by the destroy are not reported) */
  uv_close((uv_handle_t *)t, NULL);
}

static void test_create_errors(uv_loop_t *loop, int port) {
  sgrpc_server_t *s = (sgrpc_server_t *)1;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  CHECK(sgrpc_server_create(loop, addr, NULL, methods, N_METHODS, &handlers, &s) == QE_EIO);
  CHECK(s == NULL);
  sgrpc_method_t bad[2] = {{"/a/B", 0}, {"/a/B", 0}};
  CHECK(sgrpc_server_create(loop, "127.0.0.1:0", NULL, bad, 2, &handlers, &s) == QE_EINVAL);
  bad[1].path = "noslash";
  CHECK(sgrpc_server_create(loop, "127.0.0.1:0", NULL, bad, 2, &handlers, &s) == QE_EINVAL);
  sgrpc_handlers_t h = handlers;
  h.on_sent = NULL;
  CHECK(sgrpc_server_create(loop, "127.0.0.1:0", NULL, methods, N_METHODS, &h, &s) == QE_EINVAL);
  CHECK(sgrpc_server_create(NULL, "127.0.0.1:0", NULL, methods, N_METHODS, &handlers, &s) ==
        QE_EINVAL);
  /* TLS: a certificate without its key, a client CA without a certificate, a key that is not
   * one (the TLS library refuses it when the port is bound) */
  const char *pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  sgrpc_options_t t = {0, 0, pem, NULL, NULL};
  CHECK(sgrpc_server_create(loop, "127.0.0.1:0", &t, methods, N_METHODS, &handlers, &s) ==
        QE_EINVAL);
  t = (sgrpc_options_t){0, 0, NULL, NULL, pem};
  CHECK(sgrpc_server_create(loop, "127.0.0.1:0", &t, methods, N_METHODS, &handlers, &s) ==
        QE_EINVAL);
  t = (sgrpc_options_t){0, 0, pem, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
                        NULL};
  int rc = sgrpc_server_create(loop, "127.0.0.1:0", &t, methods, N_METHODS, &handlers, &s);
  fprintf(stderr, "  a bad certificate and key: %s: %s\n", qe_strerror(rc), qe_errmsg());
  CHECK(rc == QE_EIO && s == NULL);
}

int main(void) {
  uv_loop_t loop;
  main_t m;
  memset(&m, 0, sizeof m);
  CHECK_OK(uv_loop_init(&loop));
  sgrpc_options_t opt = {MAX_RECV, 0, NULL, NULL, NULL};
  CHECK_OK(sgrpc_server_create(&loop, "127.0.0.1:0", &opt, methods, N_METHODS, &handlers, &m.tcp));
  char unix_path[64];
  snprintf(unix_path, sizeof unix_path, "/tmp/qe_sgrpc_%d.sock", (int)getpid());
  unlink(unix_path);
  char uaddr[80];
  snprintf(uaddr, sizeof uaddr, "unix:%s", unix_path);
  CHECK_OK(sgrpc_server_create(&loop, uaddr, NULL, methods, N_METHODS, &handlers, &m.unx));
  if (!m.tcp || !m.unx) return tu_done("sched_grpc");
  CHECK(sgrpc_server_port(m.tcp) > 0 && sgrpc_server_port(m.unx) == 0);
  test_create_errors(&loop, sgrpc_server_port(m.tcp));

  client_t cl = {.port = sgrpc_server_port(m.tcp), .unix_path = unix_path};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, client_main, &cl) == 0);
  uv_timer_init(&loop, &m.timer);
  m.timer.data = &m;
  uv_timer_start(&m.timer, on_tick, 10, 10);
  CHECK(uv_run(&loop, UV_RUN_DEFAULT) == 0); /* returns once the servers and timer are closed */
  pthread_join(th, NULL);
  CHECK(atomic_load(&client_exited));
  CHECK(st.late_sent == 0 && st.late_cancel == 0);
  CHECK_OK(uv_loop_close(&loop));
  unlink(unix_path);
  tu_failures += atomic_load(&client_failures);
  return tu_done("sched_grpc");
}
