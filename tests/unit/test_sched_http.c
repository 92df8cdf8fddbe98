/* test_sched_http: the HTTP server of qevict-sched (scheduler/sched_http.h) over real TCP. A
 * libuv loop thread runs three servers on 127.0.0.1:0 (default limits; 300 ms head and 1 s
 * idle timeouts; at most 2 connections) whose handler serves a metrics registry on /metrics,
 * "ok" on /healthz and 404 elsewhere. Raw blocking sockets play the clients: GET and HEAD,
 * keep-alive, pipelining, query strings, HTTP/1.0, Connection: close, request bodies, 405,
 * 404, 400, 414, 431, 413, 501, 505, a half-sent head (408, then closed), an idle connection
 * (closed), the connection limit, several concurrent clients on threads, and a server closing
 * under open connections. The parser's answers are checked directly too, and TLS files that
 * cannot be used are refused at creation (test_tls.py serves TLS). Every wait is bounded by a
 * socket timeout. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "qe_status.h"
#include "sched_http.h"
#include "sched_metrics.h"
#include "test_util.h"

#define METRICS_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* ---- the server thread ------------------------------------------------------------------------
 */

enum { SRV_MAIN, SRV_FAST, SRV_SMALL, N_SRV };

typedef struct {
  uv_loop_t loop;
  uv_async_t stop;
  pthread_t th;
  sh_server_t *srv[N_SRV];
  int port[N_SRV];
  sm_reg_t *reg;    /* loop thread only */
  sm_fam_t *hits;   /* requests seen by the handler, by path */
  atomic_int calls; /* handler calls */
  atomic_int ready; /* 1: listening, -1: failed */
} server_t;

static server_t S;

static void handler(void *ud, const char *method, const char *path, sh_response_t *resp) {
  server_t *s = ud;
  atomic_fetch_add(&s->calls, 1);
  sm_add(s->hits, (const char *const[]){path[0] == '/' && strlen(path) < 64 ? path : "other"}, 1);
  if (!strcmp(path, "/metrics")) {
    resp->content_type = METRICS_TYPE;
    if (sm_render(s->reg, &resp->body, &resp->len)) resp->status = 500;
  } else if (!strcmp(path, "/healthz")) {
    resp->body = strdup("ok\n");
    resp->len = 3;
  } else if (!strcmp(path, "/bad-status")) {
    resp->status = 42;
    resp->body = strdup("dropped");
    resp->len = 7;
  } else if (!strcmp(path, "/empty")) {
    resp->status = 204;
    resp->body = strdup("dropped");
    resp->len = 7;
  } else {
    resp->status = 404;
    resp->body = strdup("not found\n");
    resp->len = 10;
  }
}

static void on_stop(uv_async_t *a) {
  for (int i = 0; i < N_SRV; i++) sh_server_close(S.srv[i]);
  uv_close((uv_handle_t *)a, NULL);
}

static int start_servers(void) {
  static const sh_options_t opts[N_SRV] = {
      {0}, {.idle_timeout_ms = 1000, .head_timeout_ms = 300}, {.max_conns = 2, .body_max = 100}};
  sm_fam_t *up;
  if (sm_create(&S.reg) ||
      sm_family(S.reg, "qevict_http_hits_total", "Handler calls by path.", SM_COUNTER,
                (const char *const[]){"path"}, 1, NULL, 0, &S.hits))
    return -1;
  if (sm_family(S.reg, "qevict_up", "1 when up.", SM_GAUGE, NULL, 0, NULL, 0, &up) ||
      sm_set(up, NULL, 1))
    return -1;
  for (int i = 0; i < N_SRV; i++) {
    if (sh_server_create_opts(&S.loop, "127.0.0.1:0", &opts[i], handler, &S, &S.srv[i])) {
      fprintf(stderr, "server %d: %s: %s\n", i, qe_strerror(QE_EIO), qe_errmsg());
      return -1;
    }
    S.port[i] = sh_server_port(S.srv[i]);
  }
  return 0;
}

static void *loop_main(void *arg) {
  int ok = start_servers() == 0;
  uv_async_init(&S.loop, &S.stop, on_stop);
  atomic_store(&S.ready, ok ? 1 : -1);
  if (!ok) uv_async_send(&S.stop);
  uv_run(&S.loop, UV_RUN_DEFAULT);
  return arg;
}

/* ---- a blocking client ------------------------------------------------------------------------
 */

typedef struct {
  int fd;
  char buf[1 << 16];
  size_t n;
} client_t;

typedef struct {
  int status;
  long content_length; /* -1: none */
  char connection[32], type[128], allow[64];
  char *body;
  size_t body_len;
} resp_t;

static client_t *dial(int port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  struct timeval tv = {5, 0};
  client_t *c = calloc(1, sizeof *c);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!c) return NULL;
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof sa)) {
    if (c->fd >= 0) close(c->fd);
    free(c);
    return NULL;
  }
  return c;
}

static void hangup(client_t *c) {
  if (!c) return;
  close(c->fd);
  free(c);
}

static int send_str(client_t *c, const char *s, size_t n) {
  while (n) {
    ssize_t k = send(c->fd, s, n, MSG_NOSIGNAL);
    if (k <= 0) return -1;
    s += k, n -= (size_t)k;
  }
  return 0;
}

static int say(client_t *c, const char *s) { return send_str(c, s, strlen(s)); }

/* Reads more bytes into c->buf: > 0 read, 0 peer closed, < 0 error or timeout. */
static ssize_t fill(client_t *c) {
  ssize_t k = recv(c->fd, c->buf + c->n, sizeof c->buf - c->n, 0);
  if (k > 0) c->n += (size_t)k;
  if (k < 0 && errno == ECONNRESET) return 0;
  return k;
}

static void header(const char *line, const char *name, char *out, size_t n) {
  size_t l = strlen(name);
  if (strncasecmp(line, name, l) || line[l] != ':') return;
  line += l + 1;
  while (*line == ' ') line++;
  snprintf(out, n, "%.*s", (int)strcspn(line, "\r"), line);
}

static int parse_head(char *h, resp_t *r) {
  char cl[32] = "";
  if (sscanf(h, "HTTP/1.1 %d ", &r->status) != 1) return -1;
  for (char *line = strstr(h, "\r\n"); line; line = strstr(line, "\r\n")) {
    line += 2;
    header(line, "Content-Length", cl, sizeof cl);
    header(line, "Connection", r->connection, sizeof r->connection);
    header(line, "Content-Type", r->type, sizeof r->type);
    header(line, "Allow", r->allow, sizeof r->allow);
  }
  r->content_length = cl[0] ? atol(cl) : -1;
  return 0;
}

/* Reads one response (no body after a HEAD request when head_req). 0 or -1 (with a reason). */
static int get_response(client_t *c, int head_req, resp_t *r) {
  char *end;
  size_t hl, bl;
  memset(r, 0, sizeof *r);
  while (!(end = memmem(c->buf, c->n, "\r\n\r\n", 4)))
    if (fill(c) <= 0) return fprintf(stderr, "  no response head\n"), -1;
  hl = (size_t)(end - c->buf) + 4;
  end[2] = 0;
  if (parse_head(c->buf, r)) return fprintf(stderr, "  bad status line\n"), -1;
  bl = head_req || r->content_length < 0 ? 0 : (size_t)r->content_length;
  while (c->n < hl + bl)
    if (fill(c) <= 0) return fprintf(stderr, "  short body\n"), -1;
  r->body = malloc(bl + 1);
  memcpy(r->body, c->buf + hl, bl);
  r->body[bl] = 0;
  r->body_len = bl;
  memmove(c->buf, c->buf + hl + bl, c->n - hl - bl);
  c->n -= hl + bl;
  return 0;
}

/* The connection ends (EOF or reset) with no further byte. */
static int closed(client_t *c) {
  ssize_t k;
  if (c->n) return 0;
  k = fill(c);
  if (k > 0) fprintf(stderr, "  unexpected bytes: %.*s\n", (int)c->n, c->buf);
  return k == 0;
}

/* Sends req and reads the response: its status, or -1. */
static int ask(client_t *c, const char *req, int head_req, resp_t *r) {
  if (say(c, req) || get_response(c, head_req, r)) return -1;
  return r->status;
}

/* One request on a fresh connection; the status, and that the server then closes. */
static int ask_once_closed(int port, const char *req) {
  client_t *c = dial(port);
  resp_t r = {0};
  int st = c ? ask(c, req, 0, &r) : -1;
  if (st >= 0 && (strcmp(r.connection, "close") || !closed(c))) st = -2;
  free(r.body);
  hangup(c);
  return st;
}

/* ---- the tests ---------------------------------------------------------------------------------
 */

#define GET(path) "GET " path " HTTP/1.1\r\nHost: t\r\n\r\n"

static void test_get_head(void) {
  client_t *c = dial(S.port[SRV_MAIN]);
  resp_t r = {0}, h = {0};
  CHECK(c != NULL);
  if (!c) return;
  CHECK(ask(c, GET("/metrics"), 0, &r) == 200);
  CHECK(!strcmp(r.type, METRICS_TYPE) && !strcmp(r.connection, "keep-alive"));
  CHECK(r.body && r.content_length == (long)r.body_len && (size_t)r.content_length > 0);
  CHECK(r.body && strstr(r.body, "# TYPE qevict_up gauge\nqevict_up 1\n"));
  CHECK(ask(c, "HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n", 1, &h) == 200);
  CHECK(h.content_length > 0 && h.body_len == 0 && !strcmp(h.type, METRICS_TYPE));
  free(r.body), free(h.body);
  /* no body came after the HEAD response: the next response starts right away */
  CHECK(ask(c, GET("/healthz"), 0, &r) == 200 && r.body && !strcmp(r.body, "ok\n"));
  CHECK(!strcmp(r.type, "text/plain; charset=utf-8") && r.content_length == 3);
  free(r.body);
  CHECK(ask(c, GET("/metrics?x=1&y=%20"), 0, &r) == 200 && r.body && strstr(r.body, "qevict_up"));
  free(r.body);
  CHECK(ask(c, "GET http://t:1/healthz?q HTTP/1.1\r\nHost: t\r\n\r\n", 0, &r) == 200);
  free(r.body);
  CHECK(ask(c, GET("/nope"), 0, &r) == 404 && r.body && !strcmp(r.body, "not found\n"));
  CHECK(!strcmp(r.connection, "keep-alive"));
  free(r.body);
  CHECK(ask(c, GET("/bad-status"), 0, &r) == 500 && r.content_length == 0);
  free(r.body);
  CHECK(ask(c, GET("/empty"), 0, &r) == 204 && r.content_length == -1 && r.body_len == 0);
  free(r.body);
  /* the handler saw each path, the query dropped */
  CHECK(ask(c, GET("/metrics"), 0, &r) == 200 && r.body);
  CHECK(r.body && strstr(r.body, "qevict_http_hits_total{path=\"/metrics\"} 4\n") &&
        strstr(r.body, "qevict_http_hits_total{path=\"/healthz\"} 2\n"));
  free(r.body);
  hangup(c);
}

static void test_pipelining(void) {
  client_t *c = dial(S.port[SRV_MAIN]);
  resp_t r[4] = {{0}};
  const char *reqs = GET("/healthz") "HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n" GET(
      "/nope") "GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" GET("/healthz");
  CHECK(c && say(c, reqs) == 0);
  if (!c) return;
  CHECK(get_response(c, 0, &r[0]) == 0 && r[0].status == 200 && !strcmp(r[0].body, "ok\n"));
  CHECK(get_response(c, 1, &r[1]) == 0 && r[1].status == 200 && r[1].content_length > 0);
  CHECK(get_response(c, 0, &r[2]) == 0 && r[2].status == 404);
  CHECK(get_response(c, 0, &r[3]) == 0 && r[3].status == 200);
  CHECK(!strcmp(r[3].connection, "close") && closed(c)); /* the fifth request is dropped */
  for (int i = 0; i < 4; i++) free(r[i].body);
  hangup(c);
}

static void test_versions_and_close(void) {
  client_t *c;
  resp_t r = {0};
  int port = S.port[SRV_MAIN];
  CHECK(ask_once_closed(port, "GET /healthz HTTP/1.0\r\n\r\n") == 200);
  CHECK(ask_once_closed(port, "GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n") ==
        200);
  CHECK(ask_once_closed(port, "GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: x, CLOSE\r\n\r\n") ==
        200);
  c = dial(port);
  CHECK(c && ask(c, "GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 0, &r) == 200);
  CHECK(!strcmp(r.connection, "keep-alive"));
  free(r.body);
  CHECK(c && ask(c, "\r\nGET /healthz HTTP/1.0\r\n\r\n", 0, &r) == 200); /* a stray CRLF first */
  CHECK(!strcmp(r.connection, "close") && c && closed(c));
  free(r.body);
  hangup(c);
  CHECK(ask_once_closed(port, "GET /healthz HTTP/2.0\r\nHost: t\r\n\r\n") == 505);
}

static void test_refusals(void) {
  int port = S.port[SRV_MAIN], calls = atomic_load(&S.calls);
  client_t *c = dial(port);
  resp_t r = {0};
  char *big = malloc(12000);
  CHECK(c &&
        ask(c, "POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi", 0, &r) == 405);
  CHECK(!strcmp(r.allow, "GET, HEAD") && !strcmp(r.connection, "close") && c && closed(c));
  free(r.body);
  hangup(c);
  CHECK(ask_once_closed(port, "\x01\x02garbage\r\n\r\n") == 400);
  CHECK(ask_once_closed(port, "GET /x HTTP/1.1\r\n\r\n") == 400);                    /* no Host */
  CHECK(ask_once_closed(port, "GET /x HTTP/1.1\r\nHost: t\r\n bad\r\n\r\n") == 400); /* folding */
  CHECK(ask_once_closed(port, "GET /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "0\r\n\r\n") == 501);
  /* a head over 8 KiB */
  snprintf(big, 12000, "GET / HTTP/1.1\r\nHost: t\r\nX-Big: %09000d\r\n\r\n", 0);
  CHECK(ask_once_closed(port, big) == 431);
  /* a target over 2 KiB */
  snprintf(big, 12000, "GET /%03000d HTTP/1.1\r\nHost: t\r\n\r\n", 0);
  CHECK(ask_once_closed(port, big) == 414);
  free(big);
  CHECK(atomic_load(&S.calls) == calls); /* the handler saw none of them */
}

static void test_bodies(void) {
  client_t *c = dial(S.port[SRV_SMALL]); /* body_max 100 */
  resp_t r = {0};
  CHECK(c && say(c, "GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n01234") == 0);
  usleep(50000); /* most likely read apart, so the body spans reads */
  CHECK(c && say(c, "567") == 0);
  usleep(50000);
  CHECK(c && say(c, "89" GET("/nope")) == 0);
  CHECK(c && get_response(c, 0, &r) == 0 && r.status == 200);
  free(r.body);
  CHECK(c && get_response(c, 0, &r) == 0 && r.status == 404);
  free(r.body);
  hangup(c);
  CHECK(ask_once_closed(S.port[SRV_SMALL],
                        "GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 101\r\n\r\n") == 413);
}

static void test_timeouts(void) {
  int port = S.port[SRV_FAST];
  client_t *half = dial(port), *idle = dial(port), *used = NULL;
  resp_t r = {0};
  CHECK(half && idle);
  if (!half || !idle) goto out;
  CHECK(say(half, "GET /metr") == 0);
  CHECK(get_response(half, 0, &r) == 0 && r.status == 408 && !strcmp(r.connection, "close"));
  CHECK(closed(half));
  free(r.body);
  CHECK(closed(idle)); /* nothing sent: closed after the idle timeout, no response */
  CHECK((used = dial(port)) != NULL);
  if (!used) goto out;
  CHECK(ask(used, GET("/healthz"), 0, &r) == 200 && !strcmp(r.connection, "keep-alive"));
  CHECK(closed(used)); /* idle again after its response */
  free(r.body);
out:
  hangup(half), hangup(idle), hangup(used);
}

/* A connection that got a 200 for /healthz, retried while the server may still hold closed
 * connections against its limit; NULL if none did within 10 s. */
static client_t *dial_served(int port) {
  for (int i = 0; i < 500; i++) {
    client_t *c = dial(port);
    resp_t r = {0};
    int st = c ? ask(c, GET("/healthz"), 0, &r) : -1;
    free(r.body);
    if (st == 200) return c;
    hangup(c);
    usleep(20000);
  }
  return NULL;
}

static void test_limit(void) {
  int port = S.port[SRV_SMALL];
  client_t *a = dial_served(port), *b = dial_served(port), *extra, *again;
  resp_t r = {0};
  CHECK(a && b);      /* both accepted and served, then idle */
  extra = dial(port); /* at the limit, the oldest idle one makes room (idle connections had
                         locked probes out until their idle timeout) */
  CHECK(extra && ask(extra, GET("/healthz"), 0, &r) == 200);
  free(r.body), r = (resp_t){0};
  CHECK(a && closed(a));
  hangup(extra), hangup(a), hangup(b);
  a = dial_served(port), b = dial_served(port); /* (once the server has seen the closes) */
  CHECK(a && b && !say(a, "GET /healthz HTTP/1.1\r\n") && !say(b, "GET /he"));
  usleep(200000); /* both inside a request head now, none idle: the older head makes room (heads
                     sent a few bytes at a time had locked probes out) */
  extra = dial(port);
  CHECK(extra && ask(extra, GET("/healthz"), 0, &r) == 200);
  free(r.body), r = (resp_t){0};
  CHECK(a && closed(a));
  CHECK(b && !say(b, "althz HTTP/1.1\r\nHost: x\r\n\r\n") && get_response(b, 0, &r) == 0 &&
        r.status == 200); /* the newer head was left alone */
  free(r.body);
  hangup(extra), hangup(a), hangup(b);
  CHECK((again = dial_served(port)) != NULL); /* a slot frees up once the server sees a close */
  hangup(again);
}

static void test_addresses(void) {
  uv_loop_t l;
  sh_server_t *s, *t;
  CHECK(uv_loop_init(&l) == 0);
  CHECK(sh_server_create(&l, "nonsense", handler, &S, &s) == QE_EINVAL && !s);
  CHECK(sh_server_create(&l, "127.0.0.1", handler, &S, &s) == QE_EINVAL);
  CHECK(sh_server_create(&l, "127.0.0.1:65536", handler, &S, &s) == QE_EINVAL);
  CHECK(sh_server_create(&l, "127.0.0.1:x", handler, &S, &s) == QE_EINVAL);
  CHECK(sh_server_create(&l, "[::1:80", handler, &S, &s) == QE_EINVAL);
  CHECK(sh_server_create(&l, "host.example:80", handler, &S, &s) == QE_EINVAL);
  CHECK(sh_server_create(NULL, "127.0.0.1:0", handler, &S, &s) == QE_EINVAL);
  CHECK_OK(sh_server_create(&l, "localhost:0", handler, &S, &s));
  if (s) {
    char addr[32];
    CHECK(sh_server_port(s) > 0 && sh_server_conns(s) == 0);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sh_server_port(s));
    CHECK(sh_server_create(&l, addr, handler, &S, &t) == QE_EIO && !t); /* port taken */
    sh_server_close(s);
  }
  if (sh_server_create(&l, "[::1]:0", handler, &S, &s) == 0) { /* where IPv6 is up */
    CHECK(sh_server_port(s) > 0);
    sh_server_close(s);
  }
  sh_server_close(NULL);
  /* TLS files that cannot be used: refused before listening, the file named */
  const sh_options_t nofile = {.tls_cert = "/nonexistent/cert.pem", .tls_key = "/nonexistent/k"};
  CHECK(sh_server_create_opts(&l, "127.0.0.1:0", &nofile, handler, &S, &s) == QE_EINVAL && !s);
  CHECK(strstr(qe_errmsg(), "/nonexistent/cert.pem") != NULL);
  const sh_options_t notpem = {.tls_cert = __FILE__, .tls_key = __FILE__};
  CHECK(sh_server_create_opts(&l, "127.0.0.1:0", &notpem, handler, &S, &s) == QE_EINVAL && !s);
  CHECK(strstr(qe_errmsg(), "certificate") != NULL);
  CHECK(uv_run(&l, UV_RUN_DEFAULT) == 0);
  CHECK(uv_loop_close(&l) == 0);
}

static void *client_thread(void *arg) {
  int ok = 1;
  client_t *c = dial(S.port[SRV_MAIN]);
  resp_t r = {0};
  for (int i = 0; c && ok && i < 50; i++) {
    ok = ask(c, i % 2 ? GET("/healthz") : GET("/metrics"), 0, &r) == 200;
    ok = ok && (i % 2 ? !strcmp(r.body, "ok\n") : strstr(r.body, "qevict_up 1") != NULL);
    free(r.body);
    r.body = NULL;
  }
  hangup(c);
  *(int *)arg = c && ok;
  return NULL;
}

static void test_concurrent(void) {
  pthread_t th[8];
  int ok[8] = {0};
  for (int i = 0; i < 8; i++) CHECK(pthread_create(&th[i], NULL, client_thread, &ok[i]) == 0);
  for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 8; i++) CHECK(ok[i]);
}

/* ---- the parser, directly ----------------------------------------------------------------------
 */

static int parse(const char *s, sh_request_t *r) { return sh_parse_request(s, strlen(s), r); }

static int refused(const char *s) {
  sh_request_t r;
  return parse(s, &r) == QE_EFORMAT ? r.status : 0;
}

static void test_parser(void) {
  sh_request_t r;
  const char *req =
      "GET /a/b?c=d HTTP/1.1\nhost:x\nConnection: keep-alive\ncontent-length: 3\n\nabc";
  CHECK(parse(req, &r) == SH_PARSE_DONE && r.head_len == strlen(req) - 3);
  CHECK(r.path_len == 4 && !memcmp(r.path, "/a/b", 4) && r.content_length == 3 && r.keep_alive);
  for (size_t n = 0; n < strlen(req) - 3; n++) CHECK(sh_parse_request(req, n, &r) == SH_PARSE_MORE);
  CHECK(parse("HEAD / HTTP/1.0\r\n\r\n", &r) == SH_PARSE_DONE && r.is_head && !r.keep_alive);
  CHECK(parse("GET http://h HTTP/1.1\r\nHost: h\r\n\r\n", &r) == SH_PARSE_DONE && r.path_len == 1 &&
        r.path[0] == '/');
  CHECK(refused("POST ") == 405 && refused("get / HTTP/1.1\r\n") == 405);
  CHECK(refused("GET / HTTP/3.0\r\n") == 505 && refused("GET / http/1.1\r\n") == 400);
  CHECK(refused("GET  / HTTP/1.1\r\n") == 400 && refused("GET * HTTP/1.1\r\n") == 400);
  CHECK(refused("GET /\r\n") == 400 && refused("GET /#f HTTP/1.1\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\rX") == 400 && refused("GET / HTTP/1.1\r\nHost: a\rb\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\nHost : a\r\n\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n") == 400);
  CHECK(refused("GET / HTTP/1.1\r\nHost: a\r\nX: a\x01\r\n") == 400);
  CHECK(parse("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 7\r\nContent-Length: 7\r\n\r\n", &r) ==
            SH_PARSE_DONE &&
        r.content_length == 7);
}

int main(void) {
  int ok;
  test_parser();
  test_addresses();
  CHECK(uv_loop_init(&S.loop) == 0);
  CHECK(pthread_create(&S.th, NULL, loop_main, NULL) == 0);
  while (!atomic_load(&S.ready)) usleep(1000);
  ok = atomic_load(&S.ready) == 1;
  CHECK(ok);
  if (ok) {
    client_t *left_open = dial(S.port[SRV_MAIN]);
    test_get_head();
    test_pipelining();
    test_versions_and_close();
    test_refusals();
    test_bodies();
    test_timeouts();
    test_limit();
    test_concurrent();
    CHECK(left_open && say(left_open, "GET /heal") == 0); /* in progress when the server closes */
    uv_async_send(&S.stop);
    pthread_join(S.th, NULL);
    CHECK(left_open && closed(left_open));
    hangup(left_open);
  } else {
    pthread_join(S.th, NULL);
  }
  CHECK(uv_loop_close(&S.loop) == 0);
  sm_destroy(S.reg);
  return tu_done("sched_http");
}
