/* sched_http: the request-head parser and the libuv HTTP/1.1 server of qevict-sched (see
 * sched_http.h). The parser reads bytes in order and answers at the first byte that decides,
 * so a prefix's answer holds for every longer input. The server runs one request at a time per
 * connection: it parses a head, discards its body, calls the handler, writes the response, and
 * only then looks at the next pipelined request; reading pauses while a response is written. */
#include "sched_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "qe_tls.h"

/* ---- the parser --------------------------------------------------------------------------- */

typedef struct {
  const char *b;
  size_t n;   /* bytes given */
  size_t lim; /* bytes looked at: min(n, SH_HEAD_MAX) */
  size_t pos;
  sh_request_t *r;
  int n_host, have_cl, conn_close, conn_keep;
} sh_parser_t;

static int fail(sh_parser_t *p, int status) {
  p->r->status = status;
  return QE_EFORMAT;
}

/* The bytes looked at ran out: 431 if the head can no longer fit, else wait for more. */
static int more(sh_parser_t *p) { return p->n >= SH_HEAD_MAX ? fail(p, 431) : SH_PARSE_MORE; }

static int is_tchar(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
  return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* A byte allowed in a request target (visible ASCII but '#'). */
static int is_target_char(unsigned char c) { return c > 0x20 && c < 0x7f && c != '#'; }

/* A byte allowed in a field value (HTAB, SP, visible ASCII, obs-text). */
static int is_value_char(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static int ieq(const char *a, size_t n, const char *lit) {
  size_t i = 0;
  for (; i < n && lit[i]; i++)
    if (lower((unsigned char)a[i]) != lit[i]) return 0;
  return i == n && !lit[i];
}

/* Skips empty lines before the request line (RFC 9112 2.2). */
static int skip_empty_lines(sh_parser_t *p) {
  while (p->pos < p->lim) {
    char c = p->b[p->pos];
    if (c == '\n') {
      p->pos++;
    } else if (c == '\r') {
      if (p->pos + 1 >= p->lim) return more(p);
      if (p->b[p->pos + 1] != '\n') return fail(p, 400);
      p->pos += 2;
    } else {
      return 1;
    }
  }
  return more(p);
}

static int parse_method(sh_parser_t *p) {
  size_t start = p->pos;
  sh_request_t *r = p->r;
  while (p->pos < p->lim && is_tchar((unsigned char)p->b[p->pos])) p->pos++;
  if (p->pos == p->lim) return more(p);
  if (p->pos == start || p->b[p->pos] != ' ') return fail(p, 400);
  r->method = p->b + start, r->method_len = p->pos - start;
  if (r->method_len == 4 && !memcmp(r->method, "HEAD", 4))
    r->is_head = 1;
  else if (r->method_len != 3 || memcmp(r->method, "GET", 3))
    return fail(p, 405);
  p->pos++;
  return 1;
}

/* The path of a complete target t[0..n): origin-form, or absolute-form with its scheme and
 * authority dropped; the query is cut off. */
static int target_path(sh_parser_t *p, const char *t, size_t n) {
  size_t i = 0, k;
  if (n > 0 && t[0] != '/') {
    if (n >= 7 && ieq(t, 7, "http://"))
      i = 7;
    else if (n >= 8 && ieq(t, 8, "https://"))
      i = 8;
    else
      return fail(p, 400);
    k = i;
    while (i < n && t[i] != '/' && t[i] != '?') i++;
    if (i == k) return fail(p, 400); /* no authority */
  }
  if (n == 0) return fail(p, 400);
  for (k = i; k < n && t[k] != '?';) k++;
  if (k == i)
    p->r->path = "/", p->r->path_len = 1; /* "http://host" or "http://host?q" */
  else
    p->r->path = t + i, p->r->path_len = k - i;
  return 1;
}

static int parse_target(sh_parser_t *p) {
  size_t start = p->pos;
  for (; p->pos < p->lim; p->pos++) {
    unsigned char c = (unsigned char)p->b[p->pos];
    if (p->pos - start > SH_TARGET_MAX) return fail(p, 414);
    if (c == ' ') break;
    if (!is_target_char(c)) return fail(p, 400);
  }
  if (p->pos == p->lim) return more(p);
  if (target_path(p, p->b + start, p->pos - start) < 0) return QE_EFORMAT;
  p->pos++;
  return 1;
}

/* The line end at pos: CRLF or LF. */
static int parse_eol(sh_parser_t *p) {
  if (p->pos >= p->lim) return more(p);
  if (p->b[p->pos] == '\n') {
    p->pos++;
    return 1;
  }
  if (p->b[p->pos] != '\r') return fail(p, 400);
  if (p->pos + 1 >= p->lim) return more(p);
  if (p->b[p->pos + 1] != '\n') return fail(p, 400);
  p->pos += 2;
  return 1;
}

static int parse_version(sh_parser_t *p) {
  static const char pat[] = "HTTP/d.d"; /* d: a digit */
  const char *v = p->b + p->pos;
  for (size_t i = 0; i < 8; i++) {
    if (p->pos + i >= p->lim) return more(p);
    if (pat[i] == 'd' ? (v[i] < '0' || v[i] > '9') : v[i] != pat[i]) return fail(p, 400);
  }
  if (v[5] != '1') return fail(p, 505);
  p->r->version_minor = v[7] == '0' ? 0 : 1;
  p->pos += 8;
  return parse_eol(p);
}

/* Connection: a comma-separated list of options; close and keep-alive matter. */
static void parse_connection(sh_parser_t *p, const char *v, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t s, e;
    while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    s = i;
    while (i < n && v[i] != ',') i++;
    e = i;
    while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
    if (ieq(v + s, e - s, "close")) p->conn_close = 1;
    if (ieq(v + s, e - s, "keep-alive")) p->conn_keep = 1;
  }
}

static int parse_content_length(sh_parser_t *p, const char *v, size_t n) {
  uint64_t x = 0;
  if (n == 0 || n > 15) return fail(p, 400);
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9') return fail(p, 400);
    x = x * 10 + (uint64_t)(v[i] - '0');
  }
  if (p->have_cl && x != p->r->content_length) return fail(p, 400);
  p->have_cl = 1;
  p->r->content_length = x;
  return 1;
}

/* One header line b[s..e) (no line end). */
static int parse_field(sh_parser_t *p, size_t s, size_t e) {
  const char *b = p->b;
  size_t colon = s, vs, ve;
  if (b[s] == ' ' || b[s] == '\t') return fail(p, 400); /* obsolete line folding */
  while (colon < e && is_tchar((unsigned char)b[colon])) colon++;
  if (colon == s || colon == e || b[colon] != ':') return fail(p, 400);
  for (vs = colon + 1; vs < e && (b[vs] == ' ' || b[vs] == '\t');) vs++;
  for (ve = e; ve > vs && (b[ve - 1] == ' ' || b[ve - 1] == '\t');) ve--;
  for (size_t i = vs; i < ve; i++)
    if (!is_value_char((unsigned char)b[i])) return fail(p, 400);
  if (ieq(b + s, colon - s, "host") && ++p->n_host > 1) return fail(p, 400);
  if (ieq(b + s, colon - s, "transfer-encoding")) return fail(p, 501);
  if (ieq(b + s, colon - s, "content-length")) return parse_content_length(p, b + vs, ve - vs);
  if (ieq(b + s, colon - s, "connection")) parse_connection(p, b + vs, ve - vs);
  return 1;
}

/* Header lines up to the empty line that ends the head. */
static int parse_fields(sh_parser_t *p) {
  for (;;) {
    const char *lf = memchr(p->b + p->pos, '\n', p->lim - p->pos);
    size_t s = p->pos, e;
    int rc;
    if (!lf) return more(p);
    e = (size_t)(lf - p->b);
    if (e > s && p->b[e - 1] == '\r') e--;
    if (memchr(p->b + s, '\r', e - s)) return fail(p, 400);
    p->pos = (size_t)(lf - p->b) + 1;
    if (e == s) return 1;
    if ((rc = parse_field(p, s, e)) < 0) return rc;
  }
}

int sh_parse_request(const char *buf, size_t n, sh_request_t *out) {
  sh_parser_t p = {.b = buf, .n = n, .lim = n < SH_HEAD_MAX ? n : SH_HEAD_MAX, .r = out};
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = skip_empty_lines(&p)) <= 0) return rc;
  if ((rc = parse_method(&p)) <= 0) return rc;
  if ((rc = parse_target(&p)) <= 0) return rc;
  if ((rc = parse_version(&p)) <= 0) return rc;
  if ((rc = parse_fields(&p)) <= 0) return rc;
  if (out->version_minor >= 1 && p.n_host != 1) return fail(&p, 400);
  out->keep_alive = !p.conn_close && (out->version_minor >= 1 || p.conn_keep);
  out->head_len = p.pos;
  return SH_PARSE_DONE;
}

const char *sh_reason(int status) {
  switch (status) {
  case 200:
    return "OK";
  case 204:
    return "No Content";
  case 301:
    return "Moved Permanently";
  case 302:
    return "Found";
  case 304:
    return "Not Modified";
  case 400:
    return "Bad Request";
  case 401:
    return "Unauthorized";
  case 403:
    return "Forbidden";
  case 404:
    return "Not Found";
  case 405:
    return "Method Not Allowed";
  case 408:
    return "Request Timeout";
  case 413:
    return "Content Too Large";
  case 414:
    return "URI Too Long";
  case 431:
    return "Request Header Fields Too Large";
  case 500:
    return "Internal Server Error";
  case 501:
    return "Not Implemented";
  case 503:
    return "Service Unavailable";
  case 505:
    return "HTTP Version Not Supported";
  default:
    return "Unknown";
  }
}

/* ---- the server --------------------------------------------------------------------------- */

typedef struct sh_conn sh_conn_t;

struct sh_server {
  uv_tcp_t listener;
  uv_loop_t *loop;
  sh_handler_t handler;
  void *ud;
  sh_options_t opt;
  qe_tls_ctx_t *tls; /* NULL: plain HTTP */
  sh_conn_t *conns;  /* open connections, a doubly linked list */
  unsigned n_conns;
  int closing, listener_closed;
};

/* What the connection's one timer is waiting for. */
enum { T_NONE, T_IDLE, T_HEAD, T_BODY, T_WRITE, T_LINGER };

struct sh_conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_shutdown_t shut;
  sh_server_t *s;
  sh_conn_t *prev, *next;
  int timer_kind, handles_open;
  unsigned closing : 1;  /* uv_close called */
  unsigned writing : 1;  /* a response is being written */
  unsigned draining : 1; /* the last response is out: discard input until the peer closes */
  unsigned eof : 1;      /* the peer sent everything it will */
  unsigned reading : 1;
  unsigned have_req : 1; /* a head is parsed, its body (body_left bytes) not read yet */
  unsigned is_head : 1;  /* the pending request is a HEAD */
  unsigned keep : 1;     /* the pending request lets the connection stay open */
  qe_tls_t *tls;         /* NULL: plain HTTP */
  char *cbuf;            /* TLS: ciphertext as read (SH_CBUF bytes) */
  uint64_t body_left;
  size_t n;                     /* bytes in buf */
  char path[SH_TARGET_MAX + 1]; /* the pending request's path */
  char buf[SH_HEAD_MAX];        /* received bytes not consumed yet */
};

/* One response being written. */
typedef struct {
  uv_write_t req;
  sh_conn_t *c;
  char *body;
  char head[512];
} sh_write_t;

#define SH_DEFAULT_TYPE "text/plain; charset=utf-8"
#define SH_CBUF         16384

static void conn_pump(sh_conn_t *c);
static void conn_update(sh_conn_t *c);

static void server_free(sh_server_t *s) {
  qe_tls_ctx_destroy(s->tls);
  free(s);
}

static void server_maybe_free(sh_server_t *s) {
  if (s->closing && s->listener_closed && !s->conns) server_free(s);
}

static void on_conn_closed(uv_handle_t *h) {
  sh_conn_t *c = h->data;
  sh_server_t *s = c->s;
  if (--c->handles_open) return;
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->n_conns--;
  qe_tls_free(c->tls);
  free(c->cbuf);
  free(c);
  server_maybe_free(s);
}

static void conn_close(sh_conn_t *c) {
  if (c->closing) return;
  c->closing = 1;
  uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
  uv_close((uv_handle_t *)&c->timer, on_conn_closed);
}

static unsigned timer_ms(const sh_conn_t *c, int kind) {
  const sh_options_t *o = &c->s->opt;
  return kind == T_HEAD || kind == T_LINGER ? o->head_timeout_ms : o->idle_timeout_ms;
}

static void conn_refuse(sh_conn_t *c, int status);

static void on_timer(uv_timer_t *t) {
  sh_conn_t *c = t->data;
  if (c->timer_kind == T_HEAD)
    conn_refuse(c, 408);
  else
    conn_close(c);
}

/* (Re)starts the timer when what it waits for changes. */
static void set_timer(sh_conn_t *c, int kind) {
  if (kind == c->timer_kind) return;
  c->timer_kind = kind;
  uv_timer_start(&c->timer, on_timer, timer_ms(c, kind), 0);
}

/* ---- TLS ---------------------------------------------------------------------------------- */

/* A write of ciphertext that is not a response's. */
typedef struct {
  uv_write_t req;
  sh_conn_t *c;
  char *buf;
} sh_flush_t;

/* Ciphertext queued beyond which the connection stops reading (a peer that makes the session
 * answer, e.g. by key updates, without reading the answers). */
#define SH_TLS_QUEUE_MAX 65536

static int queue_full(const sh_conn_t *c) {
  return c->tls && uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > SH_TLS_QUEUE_MAX;
}

static void on_flushed(uv_write_t *req, int status) {
  sh_flush_t *f = req->data;
  sh_conn_t *c = f->c;
  free(f->buf);
  free(f);
  if (c->closing || status == UV_ECANCELED) return;
  if (status < 0)
    conn_close(c);
  else if (!c->writing)
    conn_pump(c); /* reading may resume */
}

/* Sends the ciphertext the session has pending (handshake records, alerts, close_notify). */
static int tls_flush(sh_conn_t *c) {
  char *b;
  size_t n;
  if (qe_tls_take(c->tls, &b, &n)) return QE_ENOMEM;
  if (!n) return 0;
  sh_flush_t *f = malloc(sizeof *f);
  uv_buf_t ub = uv_buf_init(b, (unsigned)n);
  if (f) f->c = c, f->buf = b, f->req.data = f;
  if (!f || uv_write(&f->req, (uv_stream_t *)&c->tcp, &ub, 1, on_flushed)) {
    free(b);
    free(f);
    return QE_EIO;
  }
  return 0;
}

static void on_dead_shutdown(uv_shutdown_t *req, int status) { conn_close(req->data); }

/* The session failed: its alert is queued, then this side shuts down and the connection closes
 * (input is discarded meanwhile; the peer's end of stream closes it at once, alert or not). */
static void tls_fail(sh_conn_t *c) {
  c->draining = 1, c->n = 0, c->have_req = 0, c->keep = 0;
  c->shut.data = c;
  if (tls_flush(c) || uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_dead_shutdown))
    conn_close(c);
}

/* Moves decrypted bytes into buf while it has room, and sends what the handshake answers.
 * Returns the bytes moved. */
static size_t tls_fill(sh_conn_t *c) {
  size_t got = 0;
  int rc = qe_tls_read(c->tls, c->buf + c->n, sizeof c->buf - c->n, &got);
  c->n += got;
  if (rc < 0) {
    tls_fail(c);
    return got;
  }
  if (rc == QE_TLS_EOF) c->eof = 1;
  if (tls_flush(c)) conn_close(c);
  return got;
}

/* ---- writing responses ---------------------------------------------------------------------- */

static void on_shutdown(uv_shutdown_t *req, int status) {
  sh_conn_t *c = req->data;
  if (status < 0 && !c->closing) conn_close(c);
}

static void on_write(uv_write_t *req, int status) {
  sh_write_t *w = req->data;
  sh_conn_t *c = w->c;
  free(w->body);
  free(w);
  if (c->closing) return;
  if (status < 0) {
    conn_close(c);
    return;
  }
  c->writing = 0;
  if (!c->keep && !c->draining) {
    c->draining = 1, c->n = 0, c->have_req = 0;
    c->shut.data = c;
    if (c->tls) qe_tls_close_notify(c->tls);
    if ((c->tls && tls_flush(c)) || uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown)) {
      conn_close(c);
      return;
    }
  }
  conn_pump(c);
}

/* A content type without control characters, else the default. */
static const char *safe_type(const char *t) {
  if (!t || strlen(t) > 200) return SH_DEFAULT_TYPE;
  for (const char *p = t; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) return SH_DEFAULT_TYPE;
  return t;
}

/* Encrypts a response's buffers into one of ciphertext, which w then owns instead of the body. */
static int tls_seal(sh_conn_t *c, sh_write_t *w, uv_buf_t *bufs, int *nb) {
  char *ct;
  size_t n;
  for (int i = 0; i < *nb; i++)
    if (qe_tls_write(c->tls, bufs[i].base, bufs[i].len)) return QE_EIO;
  if (qe_tls_take(c->tls, &ct, &n)) return QE_ENOMEM;
  free(w->body);
  w->body = ct;
  bufs[0] = uv_buf_init(ct, (unsigned)n), *nb = 1;
  return 0;
}

/* Writes a response (taking body) and marks the connection busy until it is out. */
static void conn_send(sh_conn_t *c, int status, const char *type, char *body, size_t len,
                      int send_body) {
  sh_write_t *w = calloc(1, sizeof *w);
  uv_buf_t bufs[2];
  int no_body = status == 204 || status == 304, nb = 1;
  char clen[40] = "";
  if (!w) {
    free(body);
    conn_close(c);
    return;
  }
  if (!no_body) snprintf(clen, sizeof clen, "Content-Length: %zu\r\n", len);
  bufs[0].len = (size_t)snprintf(
      w->head, sizeof w->head, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%sConnection: %s\r\n%s\r\n",
      status, sh_reason(status), safe_type(type), clen, c->keep ? "keep-alive" : "close",
      status == 405 ? "Allow: GET, HEAD\r\n" : "");
  bufs[0].base = w->head;
  if (send_body && !no_body && len) bufs[1].base = body, bufs[1].len = len, nb = 2;
  w->c = c, w->body = body, w->req.data = w;
  if (c->tls && tls_seal(c, w, bufs, &nb)) {
    free(w->body);
    free(w);
    conn_close(c);
    return;
  }
  c->writing = 1;
  if (uv_write(&w->req, (uv_stream_t *)&c->tcp, bufs, (unsigned)nb, on_write)) {
    free(w->body);
    free(w);
    c->writing = 0;
    conn_close(c);
  }
}

/* Answers status with a one-line body and closes the connection after it. */
static void conn_refuse(sh_conn_t *c, int status) {
  char *body = malloc(64);
  size_t len = 0;
  if (body) len = (size_t)snprintf(body, 64, "%s\n", sh_reason(status));
  c->keep = 0, c->have_req = 0, c->n = 0;
  conn_send(c, status, SH_DEFAULT_TYPE, body, len, 1);
  conn_update(c);
}

/* Calls the handler for the pending request and sends its response. */
static void conn_respond(sh_conn_t *c) {
  sh_server_t *s = c->s;
  sh_response_t resp = {.status = 200};
  c->have_req = 0;
  s->handler(s->ud, c->is_head ? "HEAD" : "GET", c->path, &resp);
  if (c->closing) { /* the handler closed the server */
    free(resp.body);
    return;
  }
  if (resp.status < 200 || resp.status > 599) {
    free(resp.body);
    resp = (sh_response_t){.status = 500};
  }
  if (!resp.body) resp.len = 0;
  conn_send(c, resp.status, resp.content_type, resp.body, resp.len, !c->is_head);
}

/* ---- reading requests ----------------------------------------------------------------------- */

static void consume(sh_conn_t *c, size_t k) {
  memmove(c->buf, c->buf + k, c->n - k);
  c->n -= k;
}

/* Takes a parsed head: the request waits for its body, if any. */
static void take_request(sh_conn_t *c, const sh_request_t *r) {
  memcpy(c->path, r->path, r->path_len);
  c->path[r->path_len] = 0;
  c->is_head = (unsigned)r->is_head;
  c->keep = (unsigned)r->keep_alive;
  c->body_left = r->content_length;
  c->have_req = 1;
  consume(c, r->head_len);
}

/* Handles what is buffered, one request at a time, then sets reading and the timer. */
static void conn_pump(sh_conn_t *c) {
  while (!c->closing && !c->writing && !c->draining) {
    sh_request_t r;
    int rc;
    size_t got = 0; /* TLS: plaintext taken out of the session this round */
    if (c->tls && (got = tls_fill(c), c->closing || c->draining)) break;
    if (c->have_req) {
      size_t k = c->body_left < c->n ? (size_t)c->body_left : c->n;
      consume(c, k);
      c->body_left -= k;
      if (c->body_left && got) continue; /* the session may hold more of the body */
      if (c->body_left) break;
      conn_respond(c);
      continue;
    }
    if (!c->n || (rc = sh_parse_request(c->buf, c->n, &r)) == SH_PARSE_MORE) break;
    if (rc < 0) {
      conn_refuse(c, r.status);
      return;
    }
    if (r.content_length > c->s->opt.body_max) {
      conn_refuse(c, 413);
      return;
    }
    take_request(c, &r);
  }
  conn_update(c);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  sh_conn_t *c = h->data;
  if (c->tls)
    *buf = uv_buf_init(c->cbuf, SH_CBUF); /* ciphertext (discarded while draining) */
  else if (c->draining)
    *buf = uv_buf_init(c->buf, sizeof c->buf); /* discarded */
  else
    *buf = uv_buf_init(c->buf + c->n, (unsigned)(sizeof c->buf - c->n));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  sh_conn_t *c = st->data;
  if (c->closing || nread == 0) return;
  if (nread == UV_EOF) {
    c->eof = 1;
  } else if (nread < 0) {
    conn_close(c);
    return;
  } else if (c->draining) { /* discarded */
  } else if (!c->tls) {
    c->n += (size_t)nread;
  } else if (qe_tls_feed(c->tls, buf->base, (size_t)nread)) {
    conn_close(c);
    return;
  }
  conn_pump(c);
}

static void set_reading(sh_conn_t *c, int on) {
  if (on == (int)c->reading) return;
  c->reading = (unsigned)on;
  if (on && uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read))
    conn_close(c);
  else if (!on)
    uv_read_stop((uv_stream_t *)&c->tcp);
}

/* Sets reading and the timer for the connection's state. */
static void conn_update(sh_conn_t *c) {
  if (c->closing) return;
  if (c->writing) {
    set_reading(c, 0);
    set_timer(c, T_WRITE);
  } else if (c->eof) { /* nothing more will come, and everything buffered is handled */
    conn_close(c);
  } else if (c->draining) {
    set_reading(c, 1);
    set_timer(c, T_LINGER);
  } else if (queue_full(c)) { /* until the peer reads what the session answered */
    set_reading(c, 0);
    set_timer(c, T_WRITE);
  } else {
    set_reading(c, 1);
    set_timer(c, c->have_req ? T_BODY : c->n ? T_HEAD : T_IDLE);
  }
}

/* ---- accepting -------------------------------------------------------------------------- */

static void free_handle(uv_handle_t *h) { free(h); }

/* Accepts one connection only to close it (over the limit or out of memory). */
static void reject(uv_stream_t *listener) {
  uv_tcp_t *t = malloc(sizeof *t);
  if (!t) return;
  if (uv_tcp_init(listener->loop, t)) {
    free(t);
    return;
  }
  uv_accept(listener, (uv_stream_t *)t);
  uv_close((uv_handle_t *)t, free_handle);
}

/* How readily a connection is closed to make room at max_conns: 1 idle (waiting for a request,
 * nothing of one received: only a reconnect lost), 2 answered and lingering (a close may reset
 * the answer before its client reads it), 3 inside a request head; 0 never (a body being read or
 * a response being written). */
static int drop_rank(const sh_conn_t *c) {
  return c->closing                  ? 0
         : c->timer_kind == T_IDLE   ? 1
         : c->timer_kind == T_LINGER ? 2
         : c->timer_kind == T_HEAD   ? 3
                                     : 0;
}

/* At max_conns: closes the oldest (first accepted) connection of the lowest drop_rank, so that
 * neither idle connections nor heads sent a few bytes at a time can lock probes and scrapers out
 * (256 heads of 6 bytes had refused /healthz for 20 s: the head timeout and a linger); 1 when one
 * was found. The list is newest first. */
static int drop_one(sh_server_t *s) {
  sh_conn_t *pick = NULL;
  for (sh_conn_t *c = s->conns; c; c = c->next)
    if (drop_rank(c) && (!pick || drop_rank(c) <= drop_rank(pick))) pick = c;
  if (pick) conn_close(pick);
  return pick != NULL;
}

/* Open connections not being closed. */
static unsigned live_conns(const sh_server_t *s) {
  unsigned n = 0;
  for (const sh_conn_t *c = s->conns; c; c = c->next) n += !c->closing;
  return n;
}

static void on_connection(uv_stream_t *listener, int status) {
  sh_server_t *s = listener->data;
  sh_conn_t *c;
  if (status < 0 || s->closing) return;
  const int full = s->n_conns >= s->opt.max_conns && live_conns(s) >= s->opt.max_conns;
  if ((full && !drop_one(s)) || !(c = calloc(1, sizeof *c))) {
    reject(listener);
    return;
  }
  uv_tcp_init(s->loop, &c->tcp); /* neither fails: no socket is made before uv_accept */
  uv_timer_init(s->loop, &c->timer);
  c->tcp.data = c->timer.data = c;
  c->handles_open = 2;
  c->s = s;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_conns++;
  if (uv_accept(listener, (uv_stream_t *)&c->tcp)) {
    conn_close(c);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  if (s->tls && (!(c->tls = qe_tls_new(s->tls, NULL)) || !(c->cbuf = malloc(SH_CBUF)))) {
    conn_close(c);
    return;
  }
  conn_update(c);
}

/* ---- creating and closing -------------------------------------------------------------------- */

static int parse_port(const char *p, const char *addr, int *port) {
  long v = 0;
  if (!*p) return qe_errf(QE_EINVAL, "http: no port in \"%s\"", addr);
  for (; *p; p++) {
    if (*p < '0' || *p > '9' || (v = v * 10 + (*p - '0')) > 65535)
      return qe_errf(QE_EINVAL, "http: bad port in \"%s\"", addr);
  }
  *port = (int)v;
  return 0;
}

/* "IPv4:PORT", "localhost:PORT" or "[IPv6]:PORT" into *sa. */
static int parse_addr(const char *addr, struct sockaddr_storage *sa) {
  char host[64];
  const char *h = addr, *colon;
  size_t hl;
  int port = 0, rc, v6 = addr && addr[0] == '[';
  if (!addr || !*addr) return qe_errf(QE_EINVAL, "http: empty address");
  if (v6) {
    const char *close = strchr(addr, ']');
    if (!close || close[1] != ':') return qe_errf(QE_EINVAL, "http: bad address \"%s\"", addr);
    h = addr + 1, hl = (size_t)(close - h), colon = close + 1;
  } else {
    if (!(colon = strrchr(addr, ':'))) return qe_errf(QE_EINVAL, "http: \"%s\" has no :PORT", addr);
    hl = (size_t)(colon - addr);
  }
  if (hl == 0 || hl >= sizeof host) return qe_errf(QE_EINVAL, "http: bad host in \"%s\"", addr);
  memcpy(host, h, hl);
  host[hl] = 0;
  if ((rc = parse_port(colon + 1, addr, &port))) return rc;
  if (!v6 && !strcmp(host, "localhost")) strcpy(host, "127.0.0.1");
  rc = v6 ? uv_ip6_addr(host, port, (struct sockaddr_in6 *)sa)
          : uv_ip4_addr(host, port, (struct sockaddr_in *)sa);
  if (rc) return qe_errf(QE_EINVAL, "http: \"%s\": the host must be an IP address", addr);
  return 0;
}

static void on_listener_closed(uv_handle_t *h) {
  sh_server_t *s = h->data;
  s->listener_closed = 1;
  server_maybe_free(s);
}

static void resolve_options(const sh_options_t *opt, sh_options_t *o) {
  *o = opt ? *opt : (sh_options_t){0};
  if (!o->idle_timeout_ms) o->idle_timeout_ms = 30000;
  if (!o->head_timeout_ms) o->head_timeout_ms = 10000;
  if (!o->max_conns) o->max_conns = 256;
  if (!o->body_max) o->body_max = 65536;
}

static int start_listening(sh_server_t *s, const struct sockaddr_storage *sa, const char *addr) {
  int rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)sa, 0);
  if (rc) return qe_errf(QE_EIO, "http: bind %s: %s", addr, uv_strerror(rc));
  if ((rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection)))
    return qe_errf(QE_EIO, "http: listen on %s: %s", addr, uv_strerror(rc));
  return 0;
}

static void free_server(uv_handle_t *h) { server_free(h->data); }

int sh_server_create_opts(uv_loop_t *loop, const char *addr, const sh_options_t *opt,
                          sh_handler_t h, void *ud, sh_server_t **out) {
  struct sockaddr_storage sa;
  sh_server_t *s;
  int rc;
  *out = NULL;
  if (!loop || !h) return qe_errf(QE_EINVAL, "http: no loop or handler");
  memset(&sa, 0, sizeof sa);
  if ((rc = parse_addr(addr, &sa))) return rc;
  if (!(s = calloc(1, sizeof *s))) return qe_errf(QE_ENOMEM, "http: server");
  s->loop = loop, s->handler = h, s->ud = ud;
  resolve_options(opt, &s->opt);
  if (s->opt.tls_cert && (rc = qe_tls_server_ctx("metrics tls", s->opt.tls_cert, s->opt.tls_key,
                                                 s->opt.tls_client_ca, &s->tls))) {
    free(s);
    return rc;
  }
  if ((rc = uv_tcp_init(loop, &s->listener))) {
    server_free(s);
    return qe_errf(QE_EIO, "http: socket: %s", uv_strerror(rc));
  }
  s->listener.data = s;
  if ((rc = start_listening(s, &sa, addr))) {
    uv_close((uv_handle_t *)&s->listener, free_server);
    return rc;
  }
  *out = s;
  return 0;
}

int sh_server_create(uv_loop_t *loop, const char *addr, sh_handler_t h, void *ud,
                     sh_server_t **out) {
  return sh_server_create_opts(loop, addr, NULL, h, ud, out);
}

int sh_server_port(const sh_server_t *s) {
  struct sockaddr_storage sa;
  int len = (int)sizeof sa;
  if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&sa, &len)) return -1;
  if (sa.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
  return ntohs(((struct sockaddr_in *)&sa)->sin_port);
}

unsigned sh_server_conns(const sh_server_t *s) { return s->n_conns; }

void sh_server_close(sh_server_t *s) {
  if (!s || s->closing) return;
  s->closing = 1;
  for (sh_conn_t *c = s->conns; c; c = c->next) conn_close(c);
  uv_close((uv_handle_t *)&s->listener, on_listener_closed);
}
