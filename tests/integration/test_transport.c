/* test_transport: the libuv transport end to end (transport/uv/tr_conn.h). A server loop runs
 * in its own thread (echoing token batches), clients run on the main thread's loop, and raw
 * POSIX sockets play misbehaving peers. Checks: handshake and 10k messages round trip over
 * TCP and a Unix socket; version mismatch and on_hello refusal reported on both ends; a peer
 * silent past the timeout reported down (on either side); garbage, oversize and
 * out-of-sequence frames close only the offending connection while another keeps working;
 * a peer that stops reading is cut off; a server going away is seen by its clients. Then the
 * same over TLS (certificates made with the openssl command at run time): mutual TLS round
 * trips over TCP and a Unix socket, frames of hundreds of KiB across many TLS records,
 * heartbeats keeping an idle session up; refused: a server certificate of another CA or for
 * another name, no client certificate, a client certificate of another CA; a plaintext peer on
 * either side named as such; TLS garbage dropped while another session keeps working. Every
 * wait is bounded; a watchdog alarm ends a hung run. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "qe_status.h"
#include "qe_tls.h"
#include "test_util.h"
#include "tr_addr.h"
#include "tr_conn.h"

#define ENV_CASE(name) QEVICT__WORKER__V1__ENVELOPE__MSG_##name
#define ERR_CODE(name) QEVICT__WORKER__V1__ERROR_CODE__ERROR_CODE_##name
#define N_REASONS      16

/* Short enough to keep the run quick, long enough for a loaded machine: a live peer
 * heartbeats every 50 ms and is only declared down after 1 s of silence. */
#define TIMEOUT_MS 1000
static const tr_options_t fast = {.heartbeat_ms = 50, .timeout_ms = TIMEOUT_MS};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) { nanosleep(&(struct timespec){0, ms * 1000000L}, NULL); }

/* ---- the server thread -------------------------------------------------------------------- */

typedef struct {
  uv_loop_t loop;
  uv_async_t stop;
  pthread_t th;
  const char *listen;
  tr_options_t opt;
  tr_server_t *srv;
  char addr[160];
  pthread_mutex_t mu; /* guards what follows */
  int ready, listen_rc, n_hello, n_open, n_closed, closes[N_REASONS];
  long echoed;
  char last_detail[512], last_peer[200];
  int worker_no;
  char worker_id[32];
} server_t;

static void srv_lock(server_t *s) { pthread_mutex_lock(&s->mu); }
static void srv_unlock(server_t *s) { pthread_mutex_unlock(&s->mu); }

static int srv_on_hello(tr_conn_t *c, const tr_hello_t *h, tr_hello_ack_t *ack) {
  server_t *s = tr_conn_ud(c);
  srv_lock(s);
  s->n_hello++;
  snprintf(s->worker_id, sizeof s->worker_id, "w-%d", ++s->worker_no);
  srv_unlock(s);
  if (strcmp(h->model_fingerprint, "fp") != 0)
    return qe_errf(QE_EINVAL, "model fingerprint \"%s\", expected \"fp\"", h->model_fingerprint);
  ack->worker_id = s->worker_id;
  return 0;
}

/* A peer named "flood" gets 64 KiB frames until the transport gives up on it. */
static void flood(tr_conn_t *c) {
  static uint32_t ids[16384];
  Qevict__Worker__V1__TokenBatch b = QEVICT__WORKER__V1__TOKEN_BATCH__INIT;
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  b.n_token_ids = 16384, b.token_ids = ids;
  e.msg_case = ENV_CASE(TOKEN_BATCH), e.token_batch = &b;
  for (int i = 0; i < 4000; i++) {
    for (int k = 0; k < 16384; k++) ids[k] = 100000u + (uint32_t)k; /* 3-byte varints */
    if (tr_send(c, &e)) break;
  }
}

static void srv_on_open(tr_conn_t *c) {
  server_t *s = tr_conn_ud(c);
  const tr_hello_t *h = tr_conn_hello(c);
  srv_lock(s);
  s->n_open++;
  snprintf(s->last_peer, sizeof s->last_peer, "%s", tr_conn_peer(c));
  srv_unlock(s);
  if (h && !strcmp(h->name, "flood")) flood(c);
}

static void srv_on_message(tr_conn_t *c, const tr_env_t *m) {
  server_t *s = tr_conn_ud(c);
  if (m->msg_case != ENV_CASE(TOKEN_BATCH)) return;
  if (tr_send(c, m) == 0) {
    srv_lock(s);
    s->echoed++;
    srv_unlock(s);
  }
}

static void srv_on_close(tr_conn_t *c, int reason, const char *detail) {
  server_t *s = tr_conn_ud(c);
  srv_lock(s);
  s->n_closed++;
  if (reason >= 0 && reason < N_REASONS) s->closes[reason]++;
  snprintf(s->last_detail, sizeof s->last_detail, "%s", detail);
  srv_unlock(s);
}

static void srv_on_stop(uv_async_t *a) {
  server_t *s = a->data;
  tr_server_close(s->srv);
  uv_close((uv_handle_t *)a, NULL);
}

static void *server_main(void *arg) {
  server_t *s = arg;
  tr_callbacks_t cb = {s, srv_on_hello, srv_on_open, srv_on_message, srv_on_close};
  uv_loop_init(&s->loop);
  uv_async_init(&s->loop, &s->stop, srv_on_stop);
  s->stop.data = s;
  int rc = tr_listen(&s->loop, s->listen, &s->opt, &cb, &s->srv);
  srv_lock(s);
  s->listen_rc = rc;
  if (!rc)
    snprintf(s->addr, sizeof s->addr, "%s", tr_server_address(s->srv));
  else
    fprintf(stderr, "listen: %s\n", qe_errmsg());
  s->ready = 1;
  srv_unlock(s);
  if (rc) uv_close((uv_handle_t *)&s->stop, NULL);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&s->loop) == 0); /* every handle closed */
  return NULL;
}

static int srv_get(server_t *s, const int *field) {
  srv_lock(s);
  int v = *field;
  srv_unlock(s);
  return v;
}

/* Waits (bounded) until *field reaches want. */
static int srv_wait(server_t *s, const int *field, int want, int ms) {
  double t0 = now_ms();
  while (srv_get(s, field) < want) {
    if (now_ms() - t0 > ms) return 0;
    sleep_ms(2);
  }
  return 1;
}

static void server_start(server_t *s, const char *listen, const tr_options_t *opt) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  s->listen = listen;
  s->opt = *opt;
  pthread_create(&s->th, NULL, server_main, s);
  CHECK(srv_wait(s, &s->ready, 1, 5000));
  CHECK(s->listen_rc == 0);
}

static void server_stop(server_t *s) {
  if (!s->listen_rc) uv_async_send(&s->stop);
  pthread_join(s->th, NULL);
  pthread_mutex_destroy(&s->mu);
}

/* ---- clients on the main thread ----------------------------------------------------------- */

typedef struct {
  int n_msgs;        /* messages to exchange */
  int pipelined;     /* send all at once (1) or one per reply (0) */
  int width;         /* token ids per message (0: 3) */
  atomic_int *until; /* ping-pong: keep going until *until != 0 (then 100 more) */
  int sent, received, bad, opened, closed, reason, after_until;
  char detail[512], worker_id[32];
} client_t;

static uint32_t tok(int i) { return (uint32_t)i * 2654435761u % 151936u; }

#define MAX_WIDTH 100000
static int width_of(const client_t *k) { return k->width ? k->width : 3; }

static int client_send(tr_conn_t *c, int i) {
  static uint32_t ids[MAX_WIDTH];
  int w = width_of(tr_conn_ud(c));
  for (int j = 0; j < w; j++) ids[j] = tok(i + j);
  Qevict__Worker__V1__TokenBatch b = QEVICT__WORKER__V1__TOKEN_BATCH__INIT;
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  b.request_id = 7, b.offset = (uint64_t)i, b.n_token_ids = (size_t)w, b.token_ids = ids;
  e.msg_case = ENV_CASE(TOKEN_BATCH), e.token_batch = &b;
  return tr_send(c, &e);
}

static void cl_on_open(tr_conn_t *c) {
  client_t *k = tr_conn_ud(c);
  const tr_hello_ack_t *ack = tr_conn_hello_ack(c);
  k->opened = 1;
  if (ack) snprintf(k->worker_id, sizeof k->worker_id, "%s", ack->worker_id);
  for (int i = 0; i < (k->pipelined ? k->n_msgs : 1); i++) CHECK_OK(client_send(c, k->sent++));
}

static int more_to_send(client_t *k) {
  if (!k->until) return k->sent < k->n_msgs;
  if (!atomic_load(k->until)) return 1;
  return k->after_until++ < 100;
}

static void cl_on_message(tr_conn_t *c, const tr_env_t *m) {
  client_t *k = tr_conn_ud(c);
  const Qevict__Worker__V1__TokenBatch *b = m->token_batch;
  int i = k->received++, w = width_of(k);
  if (m->msg_case != ENV_CASE(TOKEN_BATCH) || b->offset != (uint64_t)i ||
      b->n_token_ids != (size_t)w || b->token_ids[0] != tok(i) ||
      b->token_ids[w - 1] != tok(i + w - 1))
    k->bad++;
  if (!k->pipelined && more_to_send(k))
    CHECK_OK(client_send(c, k->sent++));
  else if (k->received == k->sent)
    tr_close(c);
}

static void cl_on_close(tr_conn_t *c, int reason, const char *detail) {
  client_t *k = tr_conn_ud(c);
  k->closed++;
  k->reason = reason;
  snprintf(k->detail, sizeof k->detail, "%s", detail);
}

static tr_conn_t *client_connect_opt(uv_loop_t *loop, const char *addr, client_t *k,
                                     const tr_hello_t *h, const tr_options_t *opt) {
  tr_callbacks_t cb = {k, NULL, cl_on_open, cl_on_message, cl_on_close};
  tr_options_t o = *opt;
  tr_conn_t *c = NULL;
  o.hello = h;
  CHECK_OK(tr_connect(loop, addr, &o, &cb, &c));
  return c;
}

static tr_conn_t *client_connect(uv_loop_t *loop, const char *addr, client_t *k,
                                 const tr_hello_t *h) {
  return client_connect_opt(loop, addr, k, h, &fast);
}

static tr_hello_t good_hello(void) {
  tr_hello_t h = QEVICT__WORKER__V1__HELLO__INIT;
  h.model_fingerprint = "fp";
  h.tp_size = 1;
  h.device = "cpu";
  h.name = "test";
  return h;
}

/* ---- raw sockets (misbehaving peers) ------------------------------------------------------ */

static int raw_connect(const char *addr) {
  tr_addr_t a;
  struct sockaddr_un un = {.sun_family = AF_UNIX};
  struct timeval tv = {10, 0};
  int fd, rc;
  if (tr_addr_parse(addr, &a)) return -1;
  fd = socket(a.is_unix ? AF_UNIX : a.sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (a.is_unix) {
    memcpy(un.sun_path, a.path, strlen(a.path) + 1);
    rc = connect(fd, (struct sockaddr *)&un, sizeof un);
  } else {
    rc = connect(fd, (struct sockaddr *)&a.sa, sizeof(struct sockaddr_in));
  }
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (rc) close(fd);
  return rc ? -1 : fd;
}

static int raw_write(int fd, const void *p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

static int raw_send_env(int fd, const tr_env_t *e) {
  uint8_t *f;
  size_t n;
  int rc = tr_frame_encode(e, 0, &f, &n);
  if (!rc) rc = raw_write(fd, f, n);
  free(f);
  return rc;
}

static int raw_send_hello(int fd, const tr_hello_t *h) {
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  e.msg_case = ENV_CASE(HELLO), e.hello = (tr_hello_t *)h;
  return raw_send_env(fd, &e);
}

/* Reads the next frame (blocking, with a receive timeout); NULL at EOF, error or garbage. */
static tr_env_t *raw_read_env(int fd, tr_decoder_t *d) {
  uint8_t buf[4096];
  for (;;) {
    tr_env_t *m;
    size_t used;
    ssize_t n = recv(fd, buf, 1, 0); /* one byte at a time: nothing past the frame is eaten */
    if (n <= 0) return NULL;
    if (tr_decoder_feed(d, buf, 1, &used, &m) == 1) return m;
    if (d->err) return NULL;
  }
}

typedef struct {
  int closed;     /* the server closed the socket (EOF or reset) within the timeout */
  int error_code; /* code of the last Error frame read, or -1 */
  int fatal;
  double ms; /* time to the close */
} raw_end_t;

/* Reads until the server closes the socket, noting any Error frame; r.ms counts from t0 (the
 * moment before the connection was made, so a stall between the handshake and this call cannot
 * make the server's close look early). */
static raw_end_t raw_expect_close_from(int fd, tr_decoder_t *d, double t0) {
  raw_end_t r = {0, -1, 0, 0};
  uint8_t buf[4096];
  while (now_ms() - t0 < TIMEOUT_MS + 5000) { /* heartbeats may keep arriving: bounded */
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      r.closed = 1;
      break;
    }
    if (n < 0) break; /* timeout */
    for (size_t off = 0; off < (size_t)n;) {
      tr_env_t *m;
      size_t used;
      int rc = tr_decoder_feed(d, buf + off, (size_t)n - off, &used, &m);
      off += used;
      if (rc < 0) break;
      if (rc == 1 && m->msg_case == ENV_CASE(ERROR))
        r.error_code = m->error->code, r.fatal = m->error->fatal;
      if (rc == 1) tr_env_free(m);
    }
  }
  r.ms = now_ms() - t0;
  return r;
}

static raw_end_t raw_expect_close(int fd, tr_decoder_t *d) {
  return raw_expect_close_from(fd, d, now_ms());
}

/* A raw peer that completes the handshake; returns the fd (decoder d past the HelloAck). */
static int raw_handshake(const char *addr, const char *name, tr_decoder_t *d) {
  tr_hello_t h = good_hello();
  tr_env_t *m;
  int fd = raw_connect(addr);
  h.protocol_version = TR_PROTOCOL_VERSION; /* a raw peer fills it in itself */
  h.name = (char *)name;
  tr_decoder_init(d, 0);
  CHECK(fd >= 0);
  if (fd < 0) return -1;
  CHECK_OK(raw_send_hello(fd, &h));
  m = raw_read_env(fd, d);
  CHECK(m && m->msg_case == ENV_CASE(HELLO_ACK) && m->hello_ack->protocol_version == 1);
  tr_env_free(m);
  return fd;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void run_loop(uv_loop_t *loop) { uv_run(loop, UV_RUN_DEFAULT); }

/* n token batches of width ids echoed, pipelined (all sent at once) or ping-pong. */
static void roundtrip(server_t *s, uv_loop_t *loop, const tr_options_t *o, int pipelined, int n,
                      int width) {
  client_t k = {.n_msgs = n, .pipelined = pipelined, .width = width};
  tr_hello_t h = good_hello();
  double t0 = now_ms();
  client_connect_opt(loop, s->addr, &k, &h, o);
  run_loop(loop);
  CHECK(k.opened && k.closed == 1 && k.reason == TR_CLOSE_LOCAL);
  CHECK(k.received == n && k.sent == n && k.bad == 0);
  CHECK(!strncmp(k.worker_id, "w-", 2));
  if (k.closed != 1 || k.reason != TR_CLOSE_LOCAL) printf("  closed: %s\n", k.detail);
  printf("  %s%s %s: %d messages of %d ids round trip in %.1f ms\n", o->tls ? "TLS " : "", s->addr,
         pipelined ? "pipelined" : "ping-pong", n, width_of(&k), now_ms() - t0);
}

static void test_roundtrip(server_t *s, uv_loop_t *loop, int pipelined, int n) {
  roundtrip(s, loop, &fast, pipelined, n, 0);
}

static void test_version_mismatch(server_t *s, uv_loop_t *loop) {
  client_t k = {.n_msgs = 1};
  tr_hello_t h = good_hello();
  int v0 = srv_get(s, &s->closes[TR_CLOSE_VERSION]), open0 = srv_get(s, &s->n_open);
  h.protocol_version = 99;
  client_connect(loop, s->addr, &k, &h);
  run_loop(loop);
  CHECK(!k.opened && k.closed == 1 && k.reason == TR_CLOSE_VERSION);
  CHECK(strstr(k.detail, "version 99") != NULL);
  CHECK(srv_wait(s, &s->closes[TR_CLOSE_VERSION], v0 + 1, 3000));
  CHECK(srv_get(s, &s->n_open) == open0);
  printf("  version mismatch: client: %s\n", k.detail);
}

static void test_refused(server_t *s, uv_loop_t *loop) {
  client_t k = {.n_msgs = 1};
  tr_hello_t h = good_hello();
  int r0 = srv_get(s, &s->closes[TR_CLOSE_REFUSED]);
  h.model_fingerprint = "other";
  client_connect(loop, s->addr, &k, &h);
  run_loop(loop);
  CHECK(!k.opened && k.closed == 1 && k.reason == TR_CLOSE_REFUSED);
  CHECK(strstr(k.detail, "fingerprint") != NULL);
  CHECK(srv_wait(s, &s->closes[TR_CLOSE_REFUSED], r0 + 1, 3000));
}

/* A raw peer that shakes hands and then says nothing is reported down by the server; one that
 * never shakes hands too. */
static void test_server_sees_silence(server_t *s) {
  tr_decoder_t d;
  int t0 = srv_get(s, &s->closes[TR_CLOSE_TIMEOUT]);
  double start = now_ms();
  int fd = raw_handshake(s->addr, "silent", &d);
  raw_end_t r = raw_expect_close_from(fd, &d, start); /* heartbeats meanwhile, then the close */
  CHECK(r.closed && r.ms >= TIMEOUT_MS * 0.75 && r.ms < TIMEOUT_MS + 3000);
  CHECK(srv_wait(s, &s->closes[TR_CLOSE_TIMEOUT], t0 + 1, 3000));
  printf("  silent peer reported down after %.0f ms (timeout %u ms)\n", r.ms, fast.timeout_ms);
  close(fd);
  tr_decoder_dispose(&d);

  fd = raw_connect(s->addr); /* no Hello at all */
  tr_decoder_init(&d, 0);
  r = raw_expect_close(fd, &d);
  CHECK(r.closed && r.ms < TIMEOUT_MS + 3000);
  CHECK(srv_wait(s, &s->closes[TR_CLOSE_TIMEOUT], t0 + 2, 3000));
  close(fd);
  tr_decoder_dispose(&d);
}

/* A raw "server" that answers the Hello and then goes silent: the client reports it down. */
static void *silent_server(void *arg) {
  int lfd = *(int *)arg, fd = accept(lfd, NULL, NULL);
  tr_decoder_t d;
  tr_hello_ack_t ack = QEVICT__WORKER__V1__HELLO_ACK__INIT;
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT, *m;
  tr_decoder_init(&d, 0);
  m = raw_read_env(fd, &d);
  CHECK(m && m->msg_case == ENV_CASE(HELLO));
  tr_env_free(m);
  ack.protocol_version = TR_PROTOCOL_VERSION, ack.worker_id = "w-silent";
  e.msg_case = ENV_CASE(HELLO_ACK), e.hello_ack = &ack;
  CHECK_OK(raw_send_env(fd, &e));
  raw_expect_close(fd, &d); /* until the client gives up */
  tr_decoder_dispose(&d);
  close(fd);
  return NULL;
}

static void test_client_sees_silence(uv_loop_t *loop) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  char addr[64];
  pthread_t th;
  client_t k = {.n_msgs = 0, .pipelined = 1};
  tr_hello_t h = good_hello();
  bind(lfd, (struct sockaddr *)&sa, sizeof sa);
  listen(lfd, 4);
  getsockname(lfd, (struct sockaddr *)&sa, &len);
  snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
  pthread_create(&th, NULL, silent_server, &lfd);
  double t0 = now_ms();
  client_connect(loop, addr, &k, &h);
  run_loop(loop);
  CHECK(k.opened && k.closed == 1 && k.reason == TR_CLOSE_TIMEOUT);
  CHECK(!strcmp(k.worker_id, "w-silent"));
  CHECK(now_ms() - t0 >= TIMEOUT_MS * 0.75 && now_ms() - t0 < TIMEOUT_MS + 3000);
  printf("  client: %s\n", k.detail);
  pthread_join(th, NULL);
  close(lfd);
}

/* Garbage of several kinds, each on its own raw connection, while a good client keeps
 * exchanging messages with the same server. */
typedef struct {
  server_t *s;
  atomic_int *done;
  void (*runs)(server_t *s);
} garbage_args_t;

static void expect_dropped(int fd, tr_decoder_t *d, int code, const char *what) {
  raw_end_t r = raw_expect_close(fd, d);
  CHECK(r.closed);
  if (code >= 0) CHECK(r.error_code == code && r.fatal);
  if (!r.closed || (code >= 0 && r.error_code != code))
    fprintf(stderr, "  %s: closed %d, error code %d\n", what, r.closed, r.error_code);
  close(fd);
  tr_decoder_dispose(d);
}

static void garbage_runs(server_t *s) {
  static const uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
  static const uint8_t junk[] = {0x05, 0, 0, 0, 0x0f, 0xff, 0xff, 0xff, 0xff};
  static const uint8_t mid[4] = {0x01, 0x00, 0x01, 0x00}; /* 64 KiB + 1 declared */
  tr_decoder_t d;
  tr_hello_t h = good_hello();
  uint8_t rnd[4096];
  int fd;
  fd = raw_connect(s->addr); /* an absurd length before the handshake */
  tr_decoder_init(&d, 0);
  CHECK_OK(raw_write(fd, huge, 4));
  expect_dropped(fd, &d, ERR_CODE(FRAME_TOO_LARGE), "huge length");
  fd = raw_connect(s->addr); /* 64 KiB + 1: fine later, too big for a Hello */
  tr_decoder_init(&d, 0);
  CHECK_OK(raw_write(fd, mid, 4));
  expect_dropped(fd, &d, ERR_CODE(FRAME_TOO_LARGE), "large hello");
  fd = raw_handshake(s->addr, "junk", &d); /* a payload that is not an Envelope */
  CHECK_OK(raw_write(fd, junk, sizeof junk));
  expect_dropped(fd, &d, ERR_CODE(PROTOCOL), "junk payload");
  fd = raw_handshake(s->addr, "again", &d); /* a second Hello */
  CHECK_OK(raw_send_hello(fd, &h));
  expect_dropped(fd, &d, ERR_CODE(PROTOCOL), "second hello");
  fd = raw_handshake(s->addr, "oversize", &d); /* above the server's 1 MiB maximum */
  CHECK_OK(raw_write(fd, (uint8_t[]){0x01, 0x00, 0x10, 0x00}, 4));
  expect_dropped(fd, &d, ERR_CODE(FRAME_TOO_LARGE), "oversize");
  fd = raw_handshake(s->addr, "cut", &d); /* half a frame, then hang up */
  CHECK_OK(raw_write(fd, (uint8_t[]){0x10, 0x00, 0x00, 0x00, 0x1a}, 5));
  shutdown(fd, SHUT_WR);
  expect_dropped(fd, &d, -1, "cut");
  srand(7);
  for (int i = 0; i < 20; i++) { /* random bytes: dropped (size, protocol or silence) */
    size_t n = 5 + (size_t)rand() % (sizeof rnd - 5);
    for (size_t j = 0; j < n; j++) rnd[j] = (uint8_t)rand();
    if (i % 2) { /* a random payload behind a right header, after the handshake */
      fd = raw_handshake(s->addr, "random", &d);
      rnd[0] = (uint8_t)(n - 4), rnd[1] = (uint8_t)((n - 4) >> 8), rnd[2] = rnd[3] = 0;
    } else {
      fd = raw_connect(s->addr);
      tr_decoder_init(&d, 0);
    }
    raw_write(fd, rnd, n);
    expect_dropped(fd, &d, -1, "random");
  }
}

static void *garbage_main(void *arg) {
  garbage_args_t *g = arg;
  CHECK(srv_wait(g->s, &g->s->n_open, 1, 5000)); /* the good client is up */
  g->runs(g->s);
  atomic_store(g->done, 1);
  return NULL;
}

/* A good client (options o) ping-pongs with s while runs(s) sends garbage from another thread;
 * returns what it exchanged. */
static int garbage_beside(server_t *s, uv_loop_t *loop, const tr_options_t *o,
                          void (*runs)(server_t *s)) {
  atomic_int done = 0;
  client_t k = {.until = &done};
  tr_hello_t h = good_hello();
  garbage_args_t g = {s, &done, runs};
  pthread_t th;
  CHECK(srv_get(s, &s->n_open) == 0); /* a fresh server: garbage_main waits for the good client */
  pthread_create(&th, NULL, garbage_main, &g);
  client_connect_opt(loop, s->addr, &k, &h, o);
  run_loop(loop); /* ping-pong until the garbage is done, then 100 more */
  pthread_join(th, NULL);
  CHECK(k.opened && k.closed == 1 && k.reason == TR_CLOSE_LOCAL && k.bad == 0);
  CHECK(k.received == k.sent && k.received > 100);
  return k.received;
}

static void test_garbage_isolated(server_t *s, uv_loop_t *loop) {
  int proto0 = srv_get(s, &s->closes[TR_CLOSE_PROTOCOL]);
  int size0 = srv_get(s, &s->closes[TR_CLOSE_OVERSIZE]);
  int n = garbage_beside(s, loop, &fast, garbage_runs);
  CHECK(srv_get(s, &s->closes[TR_CLOSE_PROTOCOL]) >= proto0 + 2);
  CHECK(srv_get(s, &s->closes[TR_CLOSE_OVERSIZE]) >= size0 + 3);
  printf("  good client exchanged %d messages while 26 bad peers were dropped\n", n);
}

/* A peer that never reads is cut off once max_queued bytes wait. */
static void test_overload(server_t *s) {
  tr_decoder_t d;
  int o0 = srv_get(s, &s->closes[TR_CLOSE_OVERLOAD]);
  int fd = raw_handshake(s->addr, "flood", &d); /* the server floods it on open */
  CHECK(srv_wait(s, &s->closes[TR_CLOSE_OVERLOAD], o0 + 1, 5000));
  close(fd);
  tr_decoder_dispose(&d);
}

/* The server goes away: a connected client sees it. */
static void test_server_gone(uv_loop_t *loop) {
  server_t s;
  client_t k = {.n_msgs = 0, .pipelined = 1};
  tr_hello_t h = good_hello();
  server_start(&s, "127.0.0.1:0", &fast);
  client_connect(loop, s.addr, &k, &h);
  while (!k.opened && !k.closed) uv_run(loop, UV_RUN_ONCE);
  CHECK(k.opened);
  server_stop(&s);
  run_loop(loop);
  CHECK(k.closed == 1 && (k.reason == TR_CLOSE_EOF || k.reason == TR_CLOSE_IO));
  printf("  server gone: client: %s: %s\n", tr_close_reason_str(k.reason), k.detail);
}

static void test_connect_refused(uv_loop_t *loop) {
  client_t k = {0};
  tr_hello_t h = good_hello();
  char path[64];
  snprintf(path, sizeof path, "unix:/tmp/qe-tr-none-%d.sock", (int)getpid());
  client_connect(loop, path, &k, &h);
  run_loop(loop);
  CHECK(!k.opened && k.closed == 1 && k.reason == TR_CLOSE_CONNECT);
}

static void test_listen_errors(uv_loop_t *loop, const char *busy_unix) {
  tr_callbacks_t cb = {0};
  tr_server_t *srv;
  CHECK(tr_listen(loop, "nonsense", NULL, &cb, &srv) == QE_EINVAL && !srv);
  CHECK(tr_listen(loop, busy_unix, NULL, &cb, &srv) == QE_EIO); /* a live listener there */
  CHECK(strstr(qe_errmsg(), "already listens") != NULL);
  run_loop(loop);
}

/* ---- TLS ---------------------------------------------------------------------------------- */

static char pki_dir[64];

static const char *pki(const char *name) { /* a file of the test PKI (8 rotating buffers) */
  static char buf[8][128];
  static int i;
  char *b = buf[i++ % 8];
  snprintf(b, sizeof buf[0], "%s/%s", pki_dir, name);
  return b;
}

/* Two CAs, a server certificate for 127.0.0.1 and localhost, a client certificate of the first
 * CA (CN worker-a) and one of the second (stranger), made with the openssl command. 0, or -1
 * when the command is absent or fails. */
static int make_pki(void) {
  char cmd[2048];
  snprintf(pki_dir, sizeof pki_dir, "/tmp/qe-tr-tls-%d", (int)getpid());
  snprintf(
      cmd, sizeof cmd,
      "(set -e; command -v openssl; mkdir -p %s; cd %s;"
      " ec='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';"
      " for ca in ca otherca; do openssl req -x509 $ec -keyout $ca.key -out $ca.pem -days 2"
      "  -subj \"/CN=test $ca\" -addext basicConstraints=critical,CA:TRUE"
      "  -addext keyUsage=critical,keyCertSign,cRLSign; done;"
      " leaf() { openssl req $ec -keyout $1.key -out $1.csr -subj /CN=$1; printf \"$3\" >$1.ext;"
      "  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem"
      "  -days 2 -extfile $1.ext; };"
      " leaf server ca "
      "'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n';"
      " leaf worker-a ca 'extendedKeyUsage=clientAuth\\n';"
      " leaf dnsonly ca 'subjectAltName=DNS:localhost\\nextendedKeyUsage=serverAuth\\n';"
      " leaf stranger otherca 'extendedKeyUsage=clientAuth\\n') >/dev/null 2>&1",
      pki_dir, pki_dir);
  return system(cmd) == 0 ? 0 : -1;
}

typedef struct {
  qe_tls_ctx_t *srv;                                /* server.pem, clients verified by ca.pem */
  qe_tls_ctx_t *good, *nocert, *otherca, *stranger; /* clients */
} ctxs_t;

static void make_ctxs(ctxs_t *x) {
  const char *W = "worker tls";
  CHECK_OK(qe_tls_server_ctx(W, pki("server.pem"), pki("server.key"), pki("ca.pem"), &x->srv));
  CHECK_OK(qe_tls_client_ctx(W, pki("ca.pem"), pki("worker-a.pem"), pki("worker-a.key"), &x->good));
  CHECK_OK(qe_tls_client_ctx(W, pki("ca.pem"), NULL, NULL, &x->nocert));
  CHECK_OK(qe_tls_client_ctx(W, pki("otherca.pem"), pki("worker-a.pem"), pki("worker-a.key"),
                             &x->otherca));
  CHECK_OK(
      qe_tls_client_ctx(W, pki("ca.pem"), pki("stranger.pem"), pki("stranger.key"), &x->stranger));
}

static void free_ctxs(ctxs_t *x) {
  qe_tls_ctx_t *all[] = {x->srv, x->good, x->nocert, x->otherca, x->stranger};
  for (int i = 0; i < 5; i++) qe_tls_ctx_destroy(all[i]);
}

/* Unusable files are refused when a context is made, naming the file. */
static void test_tls_ctx_errors(void) {
  qe_tls_ctx_t *x = NULL;
  CHECK(qe_tls_server_ctx("t", pki("server.pem"), pki("worker-a.key"), NULL, &x) == QE_EINVAL);
  CHECK(!x && strstr(qe_errmsg(), "mismatch") && strstr(qe_errmsg(), "worker-a.key"));
  CHECK(qe_tls_server_ctx("t", pki("nosuch.pem"), pki("server.key"), NULL, &x) == QE_EINVAL);
  CHECK(!x && strstr(qe_errmsg(), "nosuch.pem"));
  CHECK(qe_tls_server_ctx("t", pki("server.pem"), pki("server.key"), pki("ca.key"), &x) ==
        QE_EINVAL);
  CHECK(!x && strstr(qe_errmsg(), "ca.key"));
  CHECK(qe_tls_client_ctx("t", pki("ca.pem"), pki("worker-a.pem"), NULL, &x) == QE_EINVAL && !x);
  CHECK(qe_tls_client_ctx("t", NULL, NULL, NULL, &x) == QE_EINVAL && !x);
  CHECK(qe_tls_client_ctx("t", pki("worker-a.csr"), NULL, NULL, &x) == QE_EINVAL && !x);
}

static tr_options_t with_tls(const tr_options_t *base, qe_tls_ctx_t *ctx, const char *name) {
  tr_options_t o = *base;
  o.tls = ctx, o.tls_server_name = name;
  return o;
}

/* A client (options o) that must not get through: it closes with a reason in want (TR_CLOSE_*
 * bits) and says what contains (when not NULL); the server closes it with server_reason. */
static void expect_refused(server_t *s, uv_loop_t *loop, const tr_options_t *o, const char *what,
                           unsigned want, const char *says, int server_reason) {
  client_t k = {.n_msgs = 1, .pipelined = 1};
  tr_hello_t h = good_hello();
  int open0 = srv_get(s, &s->n_open), c0 = srv_get(s, &s->closes[server_reason]);
  client_connect_opt(loop, s->addr, &k, &h, o);
  run_loop(loop);
  CHECK(!k.opened && k.closed == 1 && (want >> k.reason & 1));
  CHECK(!says || strstr(k.detail, says));
  CHECK(srv_wait(s, &s->closes[server_reason], c0 + 1, 3000));
  CHECK(srv_get(s, &s->n_open) == open0);
  srv_lock(s);
  printf("  %s: client: %s: %s\n    server: %s\n", what, tr_close_reason_str(k.reason), k.detail,
         s->last_detail);
  srv_unlock(s);
}

#define BIT(r) (1u << (r))

static void test_tls_refusals(server_t *stls, server_t *plain, uv_loop_t *loop, ctxs_t *x) {
  tr_options_t o = with_tls(&fast, x->otherca, NULL);
  expect_refused(stls, loop, &o, "server certificate of another CA", BIT(TR_CLOSE_TLS),
                 "certificate verify failed", TR_CLOSE_TLS);
  o = with_tls(&fast, x->good, "other.example");
  expect_refused(stls, loop, &o, "server certificate for another name", BIT(TR_CLOSE_TLS),
                 "hostname mismatch", TR_CLOSE_TLS);
  o = with_tls(&fast, x->nocert, NULL);
  expect_refused(stls, loop, &o, "no client certificate", BIT(TR_CLOSE_TLS) | BIT(TR_CLOSE_EOF),
                 NULL, TR_CLOSE_TLS);
  o = with_tls(&fast, x->stranger, NULL);
  expect_refused(stls, loop, &o, "client certificate of another CA",
                 BIT(TR_CLOSE_TLS) | BIT(TR_CLOSE_EOF), NULL, TR_CLOSE_TLS);
  CHECK(strstr(stls->last_detail, "certificate"));
  expect_refused(stls, loop, &fast, "plaintext client, TLS server",
                 BIT(TR_CLOSE_PROTOCOL) | BIT(TR_CLOSE_EOF), NULL, TR_CLOSE_TLS);
  CHECK(strstr(stls->last_detail, "does not speak TLS"));
  o = with_tls(&fast, x->good, NULL);
  expect_refused(plain, loop, &o, "TLS client, plaintext server",
                 BIT(TR_CLOSE_TLS) | BIT(TR_CLOSE_EOF), NULL, TR_CLOSE_PROTOCOL);
  CHECK(strstr(plain->last_detail, "speaks TLS"));
}

static void idle_send(uv_timer_t *t) {
  tr_conn_t *c = t->data;
  client_t *k = tr_conn_ud(c);
  if (tr_conn_is_open(c)) CHECK_OK(client_send(c, k->sent++));
  uv_close((uv_handle_t *)t, NULL);
}

/* A session left idle for 2.5 timeouts stays up on heartbeats, then carries a message. */
static void test_tls_idle(server_t *s, uv_loop_t *loop, const tr_options_t *o) {
  client_t k = {.n_msgs = 0, .pipelined = 1};
  tr_hello_t h = good_hello();
  uv_timer_t t;
  int t0 = srv_get(s, &s->closes[TR_CLOSE_TIMEOUT]);
  tr_conn_t *c = client_connect_opt(loop, s->addr, &k, &h, o);
  while (!k.opened && !k.closed) uv_run(loop, UV_RUN_ONCE);
  CHECK(k.opened);
  uv_timer_init(loop, &t);
  t.data = c;
  uv_timer_start(&t, idle_send, TIMEOUT_MS * 5 / 2, 0);
  run_loop(loop);
  CHECK(k.closed == 1 && k.reason == TR_CLOSE_LOCAL && k.sent == 1 && k.received == 1);
  CHECK(srv_get(s, &s->closes[TR_CLOSE_TIMEOUT]) == t0);
}

/* A peer with a good certificate that floods TLS 1.3 KeyUpdates instead of speaking is cut off
 * (each would cost the loop a key derivation and an answer), with the reason named. */
static void test_tls_key_update_flood(server_t *s) {
  int t0 = srv_get(s, &s->closes[TR_CLOSE_TLS]), fd = raw_connect(s->addr), sent = 0;
  SSL_CTX *cx = SSL_CTX_new(TLS_client_method());
  SSL *ssl = NULL;
  CHECK(fd >= 0 && cx);
  if (fd < 0 || !cx) return;
  SSL_CTX_set_min_proto_version(cx, TLS1_3_VERSION);
  CHECK(SSL_CTX_use_certificate_chain_file(cx, pki("worker-a.pem")) == 1);
  CHECK(SSL_CTX_use_PrivateKey_file(cx, pki("worker-a.key"), SSL_FILETYPE_PEM) == 1);
  ssl = SSL_new(cx);
  SSL_set_fd(ssl, fd);
  CHECK(SSL_connect(ssl) == 1);
  for (; sent < 500; sent++)
    if (SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED) != 1 || SSL_do_handshake(ssl) != 1) break;
  CHECK(srv_wait(s, &s->closes[TR_CLOSE_TLS], t0 + 1, 5000));
  srv_lock(s);
  CHECK(strstr(s->last_detail, "key updates") != NULL);
  printf("  %d KeyUpdates sent: server: %s\n", sent, s->last_detail);
  srv_unlock(s);
  SSL_free(ssl);
  SSL_CTX_free(cx);
  close(fd);
}

/* A server whose certificate names only DNS:localhost: "localhost:PORT" checks that name and
 * gets through; "127.0.0.1:PORT" checks the IP, which the certificate lacks. */
static void test_tls_localhost(uv_loop_t *loop, const tr_options_t *o) {
  server_t s;
  qe_tls_ctx_t *ctx = NULL;
  char addr[64];
  client_t k = {.n_msgs = 3, .pipelined = 1}, k2 = {.n_msgs = 1};
  tr_hello_t h = good_hello();
  CHECK_OK(qe_tls_server_ctx("t", pki("dnsonly.pem"), pki("dnsonly.key"), pki("ca.pem"), &ctx));
  tr_options_t so = with_tls(&fast, ctx, NULL);
  server_start(&s, "127.0.0.1:0", &so);
  snprintf(addr, sizeof addr, "localhost:%s", strrchr(s.addr, ':') + 1);
  client_connect_opt(loop, addr, &k, &h, o);
  run_loop(loop);
  CHECK(k.opened && k.received == 3 && k.reason == TR_CLOSE_LOCAL);
  client_connect_opt(loop, s.addr, &k2, &h, o);
  run_loop(loop);
  CHECK(!k2.opened && k2.reason == TR_CLOSE_TLS && strstr(k2.detail, "IP address mismatch"));
  printf("  a DNS:localhost certificate: %s served; %s: %s\n", addr, s.addr, k2.detail);
  server_stop(&s);
  qe_tls_ctx_destroy(ctx);
}

/* TLS garbage on raw connections: dropped, each alone. */
static void tls_garbage_runs(server_t *s) {
  uint8_t rnd[2048];
  tr_decoder_t d;
  srand(11);
  for (int i = 0; i < 12; i++) {
    size_t n = 5 + (size_t)rand() % (sizeof rnd - 5);
    for (size_t j = 0; j < n; j++) rnd[j] = (uint8_t)rand();
    rnd[0] = i % 3 ? 0x16 : 0x17, rnd[1] = 3, rnd[2] = 1; /* a record header, then junk */
    if (i % 4 == 1) rnd[3] = 0x40, rnd[4] = 0x00;         /* a plausible length */
    int fd = raw_connect(s->addr);
    tr_decoder_init(&d, 0);
    CHECK(fd >= 0);
    raw_write(fd, rnd, n);
    expect_dropped(fd, &d, -1, "TLS garbage");
  }
}

static void test_tls(uv_loop_t *loop, server_t *plain) {
  server_t stls, sunix;
  ctxs_t x = {0};
  char upath[96];
  if (make_pki()) {
    printf("TLS: SKIPPED (the openssl command is absent or failed)\n");
    return;
  }
  test_tls_ctx_errors();
  make_ctxs(&x);
  tr_options_t so = with_tls(&fast, x.srv, NULL), good = with_tls(&fast, x.good, NULL);
  so.max_frame = 1 << 20, so.max_queued = 4 << 20;
  server_start(&stls, "127.0.0.1:0", &so);
  printf("TLS server on %s\n", stls.addr);
  int tls0 = srv_get(&stls, &stls.closes[TR_CLOSE_TLS]);
  int n = garbage_beside(&stls, loop, &good, tls_garbage_runs);
  CHECK(srv_get(&stls, &stls.closes[TR_CLOSE_TLS]) >= tls0 + 6);
  printf("  good TLS client exchanged %d messages while 12 TLS garbage peers were dropped\n", n);
  CHECK(strstr(stls.last_peer, "(CN=worker-a)") != NULL);
  roundtrip(&stls, loop, &good, 1, 10000, 0);
  roundtrip(&stls, loop, &good, 0, 2000, 0);
  roundtrip(&stls, loop, &good, 0, 40, MAX_WIDTH); /* ~300 KiB frames: many TLS records */
  test_tls_idle(&stls, loop, &good);
  test_tls_key_update_flood(&stls);
  test_tls_localhost(loop, &good);
  test_tls_refusals(&stls, plain, loop, &x);
  server_stop(&stls);

  snprintf(upath, sizeof upath, "unix:/tmp/qe-tr-tls-%d.sock", (int)getpid());
  server_start(&sunix, upath, &so);
  roundtrip(&sunix, loop, &good, 1, 10000, 0); /* Unix socket: the chain is checked, no name */
  tr_options_t named = with_tls(&fast, x.good, "localhost");
  roundtrip(&sunix, loop, &named, 0, 1000, 0);
  server_stop(&sunix);
  free_ctxs(&x);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", pki_dir);
  CHECK(system(cmd) == 0);
}

static void on_alarm(int sig) {
  static const char msg[] = "test_transport: watchdog: hung, aborting\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(1);
}

int main(void) {
  uv_loop_t loop;
  server_t tcp, unx;
  tr_options_t big = fast;
  char upath[96];
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGALRM, on_alarm);
  alarm(540);
  signal(SIGPIPE, SIG_IGN);
  uv_loop_init(&loop);
  big.max_frame = 1 << 20;
  big.max_queued = 4 << 20;
  snprintf(upath, sizeof upath, "unix:/tmp/qe-tr-test-%d.sock", (int)getpid());

  server_start(&tcp, "127.0.0.1:0", &big);
  printf("server on %s\n", tcp.addr);
  test_garbage_isolated(&tcp, &loop); /* first: it needs the server's n_open at 0 */
  test_roundtrip(&tcp, &loop, 1, 10000);
  test_roundtrip(&tcp, &loop, 0, 10000);
  test_version_mismatch(&tcp, &loop);
  test_refused(&tcp, &loop);
  test_server_sees_silence(&tcp);
  test_overload(&tcp);
  test_client_sees_silence(&loop);

  server_start(&unx, upath, &fast);
  printf("server on %s\n", unx.addr);
  test_roundtrip(&unx, &loop, 1, 10000);
  test_roundtrip(&unx, &loop, 0, 10000);
  test_version_mismatch(&unx, &loop);
  test_listen_errors(&loop, upath);
  server_stop(&unx);
  CHECK(access(upath + 5, F_OK) != 0); /* the socket file is removed */

  test_server_gone(&loop);
  test_connect_refused(&loop);
  test_tls(&loop, &tcp);
  server_stop(&tcp);
  CHECK(uv_loop_close(&loop) == 0);
  return tu_done("transport");
}
