/* sched_http: the scheduler's small HTTP/1.1 server for GET /metrics and GET /healthz, on a
 * libuv loop. Two parts:
 *
 * - sh_parse_request: a pure parser of one request head (no I/O, no allocation), which the
 *   server and the fuzzer (tests/fuzz/fuzz_http.c) drive. It answers as soon as the bytes seen
 *   decide: a request is complete, more bytes are needed, or the request is refused with an
 *   HTTP status. Its answer for a prefix that decides never changes as more bytes arrive.
 * - sh_server_*: the server. GET and HEAD (headers only) go to the caller's handler; any other
 *   method gets 405 with "Allow: GET, HEAD". The head is limited to SH_HEAD_MAX bytes (431) and
 *   the request target to SH_TARGET_MAX (414); the query string is dropped before routing
 *   (/metrics?x=1 is /metrics). Keep-alive follows HTTP/1.1 (Connection: close honoured;
 *   HTTP/1.0 closes unless it asks for keep-alive); pipelined requests are answered in order,
 *   one at a time. A request body (Content-Length) is read and discarded up to body_max bytes,
 *   larger ones get 413; Transfer-Encoding (chunked) gets 501. A connection idle for
 *   idle_timeout_ms is closed; a request head not complete head_timeout_ms after its first
 *   byte gets 408. At max_conns connections, a new one closes the one idle the longest
 *   (waiting for a request, nothing of it received), or is closed at once when none is idle. Every
 * response carries Content-Length, Content-Type and Connection; after a refusal (4xx/5xx from the
 *   parser or a timeout) the server answers, shuts its side down and closes the connection
 *   once the peer does (or after head_timeout_ms).
 *
 * Threading: the server lives on one libuv loop; call its functions and expect the handler on
 * that loop's thread only. sh_parse_request is pure and thread-safe. */
#ifndef QE_SCHED_HTTP_H
#define QE_SCHED_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define SH_HEAD_MAX   8192 /* bytes of a request head, final empty line included (else 431) */
#define SH_TARGET_MAX 2048 /* bytes of the request target, query included (else 414) */

/* ---- the parser --------------------------------------------------------------------------- */

enum { SH_PARSE_MORE = 0, SH_PARSE_DONE = 1 }; /* errors: QE_EFORMAT with status set */

/* One parsed request head; pointers point into the caller's buffer. */
typedef struct {
  int status;         /* on QE_EFORMAT: 400, 405, 414, 431, 501 or 505 */
  size_t head_len;    /* bytes of the head, leading empty lines and the final one included */
  const char *method; /* "GET" or "HEAD" (not NUL-terminated) */
  size_t method_len;
  int is_head;      /* method is HEAD */
  const char *path; /* the target's path ('/'...), query dropped, not decoded; a
                       static "/" for "http://host" */
  size_t path_len;
  int version_minor;       /* 0 or 1 (HTTP/1.x with x > 1 is taken as 1.1) */
  int keep_alive;          /* the connection may stay open after the response */
  uint64_t content_length; /* body bytes that follow the head (0 when absent) */
} sh_request_t;

/* Parses the request head at the start of buf[0..n). Returns SH_PARSE_DONE (*out filled; the
 * head is out->head_len bytes and out->content_length body bytes follow), SH_PARSE_MORE (the
 * bytes seen so far are a valid beginning: call again with more), or QE_EFORMAT with
 * out->status the HTTP status to answer: 400 malformed (bad characters, bare CR, folded or bad
 * header lines, a bad or conflicting Content-Length, an HTTP/1.1 request without exactly one
 * Host), 405 a method other than GET and HEAD (known as soon as the method ends), 414 a target
 * over SH_TARGET_MAX, 431 a head over SH_HEAD_MAX, 501 Transfer-Encoding, 505 an HTTP major
 * version other than 1. Leading empty lines are skipped; lines may end in CRLF or LF. Accepts
 * origin-form ("/path?q") and absolute-form ("http://host/path") targets. */
int sh_parse_request(const char *buf, size_t n, sh_request_t *out);

/* The reason phrase of an HTTP status ("OK", "Not Found", ...; "Unknown" if not known). */
const char *sh_reason(int status);

/* ---- the server --------------------------------------------------------------------------- */

/* A response. The server presets status 200, content_type NULL (text/plain; charset=utf-8),
 * body NULL, len 0; the handler sets what it needs. body is malloc'd by the handler and freed
 * by the server (also for HEAD, where it only gives the Content-Length). A status outside
 * 200..599 becomes 500; 204 and 304 carry no body. A content_type with control characters is
 * replaced by the default. */
typedef struct {
  int status;
  const char *content_type; /* static or outliving the call */
  char *body;
  size_t len;
} sh_response_t;

/* Called on the loop thread for each GET or HEAD request, in order. method is "GET" or "HEAD",
 * path the NUL-terminated path without the query. Both are valid during the call only. The
 * handler may call sh_server_close (the response is then dropped). */
typedef void (*sh_handler_t)(void *ud, const char *method, const char *path, sh_response_t *resp);

typedef struct sh_server sh_server_t;

/* Server limits; zero fields take the defaults. */
typedef struct {
  unsigned idle_timeout_ms; /* a connection with no request in progress (default 30000) */
  unsigned head_timeout_ms; /* from a head's first byte to its end (default 10000); also the
                               longest wait for the peer to close after a refusal */
  unsigned max_conns;       /* open connections (default 256) */
  size_t body_max;          /* Content-Length accepted and discarded (default 65536) */
  /* TLS (when tls_cert is set): every connection must speak TLS 1.2 or 1.3 with tls_cert (PEM
   * chain) and tls_key; with tls_client_ca (PEM bundle), clients must present a certificate
   * it verifies. A failed handshake or a bad record closes the connection (after the alert). */
  const char *tls_cert, *tls_key, *tls_client_ca;
} sh_options_t;

/* Listens on addr, "IPv4:PORT" (also "localhost:PORT") or "[IPv6]:PORT"; port 0 lets the system
 * pick (see sh_server_port). opt may be NULL (defaults). *out is owned by the caller until
 * sh_server_close. QE_EINVAL for a bad address or TLS files that cannot be used (detail), QE_EIO
 * when binding fails (the handle made for it is freed when the loop next runs), QE_ENOMEM. */
int sh_server_create_opts(uv_loop_t *loop, const char *addr, const sh_options_t *opt,
                          sh_handler_t h, void *ud, sh_server_t **out);
/* Same with the default options. */
int sh_server_create(uv_loop_t *loop, const char *addr, sh_handler_t h, void *ud,
                     sh_server_t **out);

/* The port the server listens on. */
int sh_server_port(const sh_server_t *s);
/* Connections open now. */
unsigned sh_server_conns(const sh_server_t *s);

/* Stops listening and closes every connection (pending responses are dropped); the server is
 * freed once libuv has closed its handles (run the loop). s must not be used afterwards. NULL
 * is allowed. */
void sh_server_close(sh_server_t *s);

#endif
