/* tr_conn: one scheduler<->worker connection over a libuv stream: reading frames through the
 * decoder, the Hello/HelloAck handshake, heartbeats and timeouts, writing frames, and closing
 * (gracefully: flush, shut the write side, drain the peer until it closes; bounded by
 * timeout_ms). Servers (tr_listen) are in tr_listen.c. See tr_conn.h. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "qe_tls.h"
#include "tr_addr.h"
#include "tr_conn_internal.h"

#define ENV_CASE(name) QEVICT__WORKER__V1__ENVELOPE__MSG_##name
#define ERR_CODE(name) QEVICT__WORKER__V1__ERROR_CODE__ERROR_CODE_##name

static const char *const reason_text[] = {
#define TR__TEXT(name, text) text,
    TR_CLOSE_REASONS(TR__TEXT)
#undef TR__TEXT
};

const char *tr_close_reason_str(int reason) {
  int n = (int)(sizeof reason_text / sizeof reason_text[0]);
  return reason >= 0 && reason < n ? reason_text[reason] : "unknown";
}

void tr__options_resolve(const tr_options_t *in, tr_options_t *out) {
  *out = in ? *in : (tr_options_t){0};
  out->hello = NULL;
  out->tls_server_name = NULL; /* (copied into the connection by tr_connect) */
  if (!out->max_frame) out->max_frame = TR_FRAME_MAX_DEFAULT;
  if (out->max_frame > TR_FRAME_MAX_LIMIT) out->max_frame = TR_FRAME_MAX_LIMIT;
  if (!out->heartbeat_ms) out->heartbeat_ms = 1000;
  if (!out->timeout_ms) out->timeout_ms = 5000;
  if (!out->max_queued) out->max_queued = TR__QUEUED_DFLT;
  if (out->max_queued < out->max_frame + TR_FRAME_HEADER)
    out->max_queued = out->max_frame + TR_FRAME_HEADER;
}

/* ---- closing ------------------------------------------------------------------------------ */

static void on_handle_closed(uv_handle_t *h) {
  tr_conn_t *c = h->data;
  if (--c->handles) return;
  if (c->cb.on_close) c->cb.on_close(c, c->reason, c->detail);
  if (c->server) tr__server_unlink(c);
  tr_decoder_dispose(&c->dec);
  qe_tls_free(c->tls);
  free(c->pbuf);
  tr_env_free(c->handshake);
  free(c->hello_frame);
  free(c);
}

static void hard_close(tr_conn_t *c) {
  if (c->hard_closing) return;
  c->hard_closing = 1;
  c->state = TR__CLOSING;
  uv_close(&c->sock.handle, on_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  tr_conn_t *c = req->handle->data;
  c->shut_done = 1;
  /* written out; if still reading, wait for the peer's EOF (or the deadline) */
  if (status < 0 || !c->reading) hard_close(c);
}

static int tls_flush(tr_conn_t *c);

/* Strips the "transport: " of a qe_errmsg for a detail line that already names the peer. */
static const char *bare(const char *msg) {
  return strncmp(msg, "transport: ", 11) ? msg : msg + 11;
}

/* Records why c ends and starts closing it: gracefully (queued frames flushed, write side
 * shut, the peer drained until it closes, all within timeout_ms) or at once. */
static void conn_end(tr_conn_t *c, int reason, int graceful, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void conn_end(tr_conn_t *c, int reason, int graceful, const char *fmt, ...) {
  va_list ap;
  int n;
  if (c->state == TR__CLOSING) return;
  c->reason = reason;
  n = snprintf(c->detail, sizeof c->detail, "%s: ", c->peer);
  va_start(ap, fmt);
  vsnprintf(c->detail + n, sizeof c->detail - (size_t)n, fmt, ap);
  va_end(ap);
  for (char *p = c->detail; *p; p++) /* one line, whatever the peer sent */
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
  c->state = TR__CLOSING;
  c->t_closing = uv_now(c->loop);
  if (graceful && c->tls_open && !c->tls_dead) {
    qe_tls_close_notify(c->tls);
    if (tls_flush(c)) graceful = 0;
  }
  if (graceful && c->reading && uv_shutdown(&c->shutdown_req, &c->sock.stream, on_shutdown) == 0)
    return;
  hard_close(c);
}

void tr__conn_abort(tr_conn_t *c, int reason, const char *detail) {
  conn_end(c, reason, 0, "%s", detail);
}

void tr_close(tr_conn_t *c) {
  if (c) conn_end(c, TR_CLOSE_LOCAL, 1, "%s", "closed locally");
}

/* ---- writing ------------------------------------------------------------------------------ */

typedef struct {
  uv_write_t req;
  tr_conn_t *c;
  uint8_t bytes[];
} tr__write_t;

static void on_write(uv_write_t *req, int status) {
  tr__write_t *w = (tr__write_t *)req;
  tr_conn_t *c = w->c;
  free(w);
  if (status < 0 && status != UV_ECANCELED)
    conn_end(c, TR_CLOSE_IO, 0, "write: %s", uv_strerror(status));
}

/* A write request for len bytes in *out: QE_ENOSPC when the peer has stopped reading (more
 * than max_queued bytes would wait), QE_ENOMEM. */
static int write_new(tr_conn_t *c, size_t len, tr__write_t **out) {
  size_t queued = uv_stream_get_write_queue_size(&c->sock.stream);
  if (queued && queued + len > c->opt.max_queued) /* (one write alone always goes) */
    return qe_errf(QE_ENOSPC, "transport: %zu bytes already waiting to be written", queued);
  if (!(*out = malloc(sizeof **out + len)))
    return qe_errf(QE_ENOMEM, "transport: frame of %zu bytes", len);
  (*out)->c = c;
  return 0;
}

/* Hands w (len bytes filled) to libuv; frees it on failure (QE_ECOMM). */
static int write_submit(tr_conn_t *c, tr__write_t *w, size_t len) {
  uv_buf_t buf = uv_buf_init((char *)w->bytes, (unsigned)len);
  int rc = uv_write(&w->req, &c->sock.stream, &buf, 1, on_write);
  if (rc) {
    free(w);
    return qe_errf(QE_ECOMM, "transport: write: %s", uv_strerror(rc));
  }
  c->t_send = uv_now(c->loop);
  return 0;
}

/* Queues the ciphertext the TLS session has pending (handshake records, alerts, sealed frames):
 * 0, or as write_new and write_submit. */
static int tls_flush(tr_conn_t *c) {
  size_t n;
  while ((n = qe_tls_pending(c->tls))) {
    tr__write_t *w;
    int rc = write_new(c, n, &w);
    if (rc) return rc;
    if (!(n = qe_tls_take_into(c->tls, w->bytes, n))) {
      free(w);
      break;
    }
    if ((rc = write_submit(c, w, n))) return rc;
  }
  return 0;
}

/* Queues a frame already packed (copied; sealed first under TLS). */
static int write_bytes(tr_conn_t *c, const uint8_t *frame, size_t len) {
  tr__write_t *w;
  int rc;
  if (c->tls) {
    if (!c->tls_open || c->tls_dead)
      return qe_errf(QE_ECOMM, "transport: %s: no TLS session to write to", c->peer);
    if (qe_tls_write(c->tls, frame, len)) return QE_ECOMM;
    return tls_flush(c);
  }
  if ((rc = write_new(c, len, &w))) return rc;
  memcpy(w->bytes, frame, len);
  return write_submit(c, w, len);
}

/* m packed into a buffer of its own and sealed (TLS). */
static int write_env_tls(tr_conn_t *c, const tr_env_t *m, size_t body) {
  uint8_t *f = malloc(TR_FRAME_HEADER + body);
  if (!f) return qe_errf(QE_ENOMEM, "transport: frame of %zu bytes", body);
  int rc = write_bytes(c, f, tr_frame_pack(m, f));
  free(f);
  return rc;
}

/* Packs m straight into a write request. QE_ERANGE if it exceeds max_frame, else as above. */
static int write_env(tr_conn_t *c, const tr_env_t *m) {
  size_t body = tr_frame_payload_size(m);
  tr__write_t *w;
  int rc;
  if (body > c->opt.max_frame)
    return qe_errf(QE_ERANGE, "transport: %s frame of %zu bytes exceeds the maximum %zu",
                   tr_env_name(m), body, c->opt.max_frame);
  if (c->tls) return write_env_tls(c, m, body);
  if ((rc = write_new(c, TR_FRAME_HEADER + body, &w))) return rc;
  return write_submit(c, w, tr_frame_pack(m, w->bytes));
}

/* Ends c after a failed internal write. */
static void write_failed(tr_conn_t *c, int rc) {
  if (rc == QE_ENOSPC)
    conn_end(c, TR_CLOSE_OVERLOAD, 0, "%s", bare(qe_errmsg()));
  else
    conn_end(c, TR_CLOSE_IO, 0, "%s", bare(qe_errmsg()));
}

int tr_send(tr_conn_t *c, const tr_env_t *m) {
  int rc;
  if (c->state != TR__OPEN) return qe_errf(QE_ECOMM, "transport: %s: connection not open", c->peer);
  switch (m->msg_case) {
  case QEVICT__WORKER__V1__ENVELOPE__MSG__NOT_SET:
  case ENV_CASE(HELLO):
  case ENV_CASE(HELLO_ACK):
    return qe_errf(QE_EINVAL, "transport: tr_send of a %s Envelope", tr_env_name(m));
  default:
    break;
  }
  rc = write_env(c, m);
  if (rc == QE_ENOSPC || rc == QE_ECOMM) {
    write_failed(c, rc);
    return qe_errf(QE_ECOMM, "transport: %s: %s", c->detail, tr_close_reason_str(c->reason));
  }
  return rc;
}

/* Sends a fatal Error (best effort) and closes c gracefully. */
static void conn_fail(tr_conn_t *c, int reason, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void conn_fail(tr_conn_t *c, int reason, int code, const char *fmt, ...) {
  char msg[320];
  va_list ap;
  Qevict__Worker__V1__Error err = QEVICT__WORKER__V1__ERROR__INIT;
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->state == TR__CLOSING) return;
  err.code = code;
  err.message = msg;
  err.fatal = 1;
  e.msg_case = ENV_CASE(ERROR);
  e.error = &err;
  write_env(c, &e);
  conn_end(c, reason, 1, "%s", msg);
}

static void send_heartbeat(tr_conn_t *c) {
  Qevict__Worker__V1__Heartbeat hb = QEVICT__WORKER__V1__HEARTBEAT__INIT;
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  int rc;
  hb.seq = ++c->hb_seq;
  hb.sent_us = uv_hrtime() / 1000;
  e.msg_case = ENV_CASE(HEARTBEAT);
  e.heartbeat = &hb;
  if ((rc = write_env(c, &e))) write_failed(c, rc);
}

/* ---- the handshake ------------------------------------------------------------------------ */

static void become_open(tr_conn_t *c) {
  c->state = TR__OPEN;
  c->opened = 1;
  tr_decoder_set_max(&c->dec, c->opt.max_frame);
  if (c->cb.on_open) c->cb.on_open(c);
}

/* Listening side, first frame: a Hello of our version that on_hello accepts. Takes m. */
static void server_handshake(tr_conn_t *c, tr_env_t *m) {
  tr_hello_ack_t ack = QEVICT__WORKER__V1__HELLO_ACK__INIT;
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  const tr_hello_t *h = m->hello;
  int rc;
  if (m->msg_case != ENV_CASE(HELLO)) {
    conn_fail(c, TR_CLOSE_PROTOCOL, ERR_CODE(PROTOCOL), "expected hello, got %s", tr_env_name(m));
    tr_env_free(m);
    return;
  }
  c->handshake = m;
  if (h->protocol_version != TR_PROTOCOL_VERSION) {
    conn_fail(c, TR_CLOSE_VERSION, ERR_CODE(VERSION_MISMATCH),
              "peer speaks protocol version %u, this build %u", h->protocol_version,
              TR_PROTOCOL_VERSION);
    return;
  }
  ack.protocol_version = TR_PROTOCOL_VERSION;
  ack.heartbeat_ms = c->opt.heartbeat_ms;
  qe_errclear();
  if (c->cb.on_hello && (rc = c->cb.on_hello(c, h, &ack))) {
    const int busy = rc == QE_EBUSY;
    conn_fail(c, busy ? TR_CLOSE_BUSY : TR_CLOSE_REFUSED, busy ? ERR_CODE(BUSY) : ERR_CODE(REFUSED),
              "%s: %s", busy ? "busy" : "refused", *qe_errmsg() ? qe_errmsg() : qe_strerror(rc));
    return;
  }
  if (c->state == TR__CLOSING) return; /* on_hello closed it */
  e.msg_case = ENV_CASE(HELLO_ACK);
  e.hello_ack = &ack;
  if ((rc = write_env(c, &e)))
    write_failed(c, rc);
  else
    become_open(c);
}

/* Connecting side, first frame: HelloAck of our version, or the peer's fatal Error. Takes m. */
static void client_handshake(tr_conn_t *c, tr_env_t *m) {
  if (m->msg_case == ENV_CASE(ERROR)) {
    int code = m->error->code;
    int reason = code == ERR_CODE(VERSION_MISMATCH) ? TR_CLOSE_VERSION
                 : code == ERR_CODE(REFUSED)        ? TR_CLOSE_REFUSED
                 : code == ERR_CODE(BUSY)           ? TR_CLOSE_BUSY
                                                    : TR_CLOSE_PEER_ERROR;
    conn_end(c, reason, 1, "peer: %s", m->error->message);
    tr_env_free(m);
  } else if (m->msg_case != ENV_CASE(HELLO_ACK)) {
    conn_fail(c, TR_CLOSE_PROTOCOL, ERR_CODE(PROTOCOL), "expected hello_ack, got %s",
              tr_env_name(m));
    tr_env_free(m);
  } else if (m->hello_ack->protocol_version != TR_PROTOCOL_VERSION) {
    conn_fail(c, TR_CLOSE_VERSION, ERR_CODE(VERSION_MISMATCH),
              "peer speaks protocol version %u, this build %u", m->hello_ack->protocol_version,
              TR_PROTOCOL_VERSION);
    tr_env_free(m);
  } else {
    c->handshake = m;
    become_open(c);
  }
}

/* An open connection's frame. Takes m. */
static void open_message(tr_conn_t *c, tr_env_t *m) {
  switch (m->msg_case) {
  case ENV_CASE(HEARTBEAT):
    break;
  case ENV_CASE(HELLO):
  case ENV_CASE(HELLO_ACK):
    conn_fail(c, TR_CLOSE_PROTOCOL, ERR_CODE(PROTOCOL), "unexpected %s after the handshake",
              tr_env_name(m));
    break;
  case ENV_CASE(ERROR): /* fatal: the peer is closing; else a request-level error, the app's */
    if (m->error->fatal)
      conn_end(c, TR_CLOSE_PEER_ERROR, 1, "peer: %s", m->error->message);
    else if (c->cb.on_message)
      c->cb.on_message(c, m);
    break;
  default:
    if (c->cb.on_message) c->cb.on_message(c, m);
  }
  tr_env_free(m);
}

static void dispatch(tr_conn_t *c, tr_env_t *m) {
  if (c->state == TR__OPEN)
    open_message(c, m);
  else if (c->is_client)
    client_handshake(c, m);
  else
    server_handshake(c, m);
}

/* ---- reading ------------------------------------------------------------------------------ */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  tr_conn_t *c = h->data;
  *buf = uv_buf_init((char *)c->rbuf, (unsigned)sizeof c->rbuf);
}

/* The peer's data ended (end of stream, or a TLS close_notify) while c was up. */
static void peer_ended(tr_conn_t *c) {
  size_t pending = tr_decoder_pending(&c->dec);
  if (pending)
    conn_end(c, TR_CLOSE_EOF, 0, "closed in the middle of a frame (%zu bytes in)", pending);
  else if (c->tls && !c->tls_open)
    conn_end(c, TR_CLOSE_EOF, 0, "closed during the TLS handshake (does the peer speak TLS?)");
  else if (c->state != TR__OPEN && c->is_client && !c->n_first)
    conn_end(c, TR_CLOSE_EOF, 0, "closed during the handshake without a word (does it want TLS?)");
  else if (c->state != TR__OPEN)
    conn_end(c, TR_CLOSE_EOF, 0, "closed during the handshake");
  else
    conn_end(c, TR_CLOSE_EOF, 0, "closed the connection");
}

static void read_ended(tr_conn_t *c, ssize_t nread) {
  uv_read_stop(&c->sock.stream);
  c->reading = 0;
  if (c->state == TR__CLOSING) { /* draining after a graceful close: done */
    if (nread != UV_EOF || c->shut_done) hard_close(c);
  } else if (nread != UV_EOF)
    conn_end(c, TR_CLOSE_IO, 0, "read: %s", uv_strerror((int)nread));
  else
    peer_ended(c);
}

/* Did the peer open with what looks like a TLS record (a content type, then version 3.x)? */
static int peer_sent_tls(const tr_conn_t *c) {
  return c->n_first == 2 && c->first[0] >= 0x14 && c->first[0] <= 0x17 && c->first[1] == 3;
}

/* Feeds read bytes to the decoder, one frame at a time, while c stays up. */
static void feed(tr_conn_t *c, const uint8_t *p, size_t n) {
  while (n && c->state != TR__CLOSING) {
    size_t used;
    tr_env_t *m;
    int rc = tr_decoder_feed(&c->dec, p, n, &used, &m);
    p += used;
    n -= used;
    if (rc < 0 && !c->tls && !c->opened && peer_sent_tls(c))
      conn_fail(c, TR_CLOSE_PROTOCOL, ERR_CODE(PROTOCOL),
                "the peer speaks TLS, or sent a first frame that looks like it; this side does "
                "not");
    else if (rc == QE_ERANGE)
      conn_fail(c, TR_CLOSE_OVERSIZE, ERR_CODE(FRAME_TOO_LARGE), "%s", bare(qe_errmsg()));
    else if (rc < 0)
      conn_fail(c, TR_CLOSE_PROTOCOL, ERR_CODE(PROTOCOL), "%s", bare(qe_errmsg()));
    else if (rc == 1)
      dispatch(c, m);
  }
}

/* ---- TLS under the frames ---------------------------------------------------------------- */

/* The TLS handshake is done: the connecting side sends its Hello, the listening side adds the
 * peer certificate's name to the peer's (for logs). */
static void tls_opened(tr_conn_t *c) {
  char cn[96];
  c->tls_open = 1;
  if (c->is_client) {
    int rc = write_bytes(c, c->hello_frame, c->hello_len);
    free(c->hello_frame);
    c->hello_frame = NULL;
    if (rc) write_failed(c, rc);
  } else if (*qe_tls_peer_cn(c->tls, cn, sizeof cn)) {
    size_t n = strlen(c->peer);
    snprintf(c->peer + n, sizeof c->peer - n, " (CN=%s)", cn);
  }
}

/* The session failed (why: its reason): its alert goes out, then c closes. */
static void tls_failed(tr_conn_t *c, const char *why) {
  char msg[300];
  int plain = c->n_first == 2 && !peer_sent_tls(c);
  snprintf(msg, sizeof msg, "%s", bare(why));
  c->tls_dead = 1;
  tls_flush(c);
  if (plain && !c->tls_open)
    conn_end(c, TR_CLOSE_TLS, 1, "the peer does not speak TLS (%s)", msg);
  else
    conn_end(c, TR_CLOSE_TLS, 1, "%s", msg);
}

/* Ciphertext read: decrypted and fed to the decoder while c stays up; what the session answers
 * (handshake records, alerts) is sent. */
static void tls_in(tr_conn_t *c, const uint8_t *p, size_t n) {
  int rc = qe_tls_feed(c->tls, p, n);
  size_t got = 1;
  char why[300] = "";
  while (!rc && got && c->state != TR__CLOSING) {
    rc = qe_tls_read(c->tls, c->pbuf, TR__PLAIN_BUF, &got);
    if (rc < 0) snprintf(why, sizeof why, "%s", qe_errmsg()); /* (before feed's callbacks) */
    if (!c->tls_open && qe_tls_established(c->tls)) tls_opened(c);
    if (got && c->state != TR__CLOSING) feed(c, c->pbuf, got);
  }
  if (c->state == TR__CLOSING) return;
  if (rc == QE_TLS_EOF)
    peer_ended(c);
  else if (rc < 0)
    tls_failed(c, why);
  else if ((rc = tls_flush(c)))
    write_failed(c, rc);
}

/* Connecting side: the TLS session's first flight (the Hello follows the handshake). */
static int tls_start(tr_conn_t *c) {
  if (qe_tls_handshake(c->tls)) {
    tls_failed(c, qe_errmsg());
    return QE_EIO;
  }
  return tls_flush(c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  tr_conn_t *c = s->data;
  if (nread < 0) {
    read_ended(c, nread);
  } else if (nread > 0) {
    c->t_recv = uv_now(c->loop);
    for (ssize_t i = 0; c->n_first < 2 && i < nread; i++)
      c->first[c->n_first++] = (uint8_t)buf->base[i];
    if (c->state == TR__CLOSING) return;
    if (c->tls)
      tls_in(c, (const uint8_t *)buf->base, (size_t)nread);
    else
      feed(c, (const uint8_t *)buf->base, (size_t)nread);
  }
}

/* ---- timer -------------------------------------------------------------------------------- */

static void on_timer(uv_timer_t *t) {
  tr_conn_t *c = t->data;
  uint64_t now = uv_now(c->loop), tick = uv_timer_get_repeat(t);
  int stalled = now - c->t_tick > 2 * tick + 50; /* our own loop was blocked: data may wait */
  c->t_tick = now;
  if (c->state == TR__CLOSING) {
    if (now - c->t_closing >= c->opt.timeout_ms) hard_close(c);
  } else if (c->state == TR__CONNECTING) {
    if (now - c->t_start >= c->opt.timeout_ms)
      conn_end(c, TR_CLOSE_CONNECT, 0, "connect timed out after %u ms", c->opt.timeout_ms);
  } else if (!stalled && now - c->t_recv >= c->opt.timeout_ms) {
    conn_end(c, TR_CLOSE_TIMEOUT, 0, "silent for %llu ms (timeout %u ms)",
             (unsigned long long)(now - c->t_recv), c->opt.timeout_ms);
  } else if (c->state == TR__HANDSHAKE && now - c->t_start >= c->opt.timeout_ms) {
    conn_fail(c, TR_CLOSE_TIMEOUT, ERR_CODE(TIMEOUT), "no handshake within %u ms",
              c->opt.timeout_ms);
  } else if (c->state == TR__OPEN && now - c->t_send >= c->opt.heartbeat_ms) {
    send_heartbeat(c);
  }
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static unsigned timer_tick(const tr_options_t *o) {
  unsigned t = o->heartbeat_ms < o->timeout_ms / 4 ? o->heartbeat_ms : o->timeout_ms / 4;
  return t < 5 ? 5 : t;
}

tr_conn_t *tr__conn_new(uv_loop_t *loop, const tr_callbacks_t *cb, const tr_options_t *opt,
                        int is_client, int is_unix) {
  tr_conn_t *c = calloc(1, sizeof *c);
  int rc;
  if (!c) return qe_errf(QE_ENOMEM, "transport: connection"), NULL;
  c->loop = loop;
  c->cb = *cb;
  tr__options_resolve(opt, &c->opt);
  c->is_client = is_client;
  c->is_unix = is_unix;
  c->state = is_client ? TR__CONNECTING : TR__HANDSHAKE;
  tr_decoder_init(&c->dec, TR_FRAME_MAX_HELLO);
  rc = is_unix ? uv_pipe_init(loop, &c->sock.pipe, 0) : uv_tcp_init(loop, &c->sock.tcp);
  if (rc) {
    free(c);
    return qe_errf(QE_EIO, "transport: socket: %s", uv_strerror(rc)), NULL;
  }
  uv_timer_init(loop, &c->timer);
  c->sock.handle.data = c->timer.data = c;
  c->handles = 2;
  uv_update_time(loop); /* called from outside the loop, its cached time may be old */
  c->t_start = c->t_recv = c->t_send = c->t_tick = uv_now(loop);
  uv_timer_start(&c->timer, on_timer, timer_tick(&c->opt), timer_tick(&c->opt));
  return c;
}

int tr__conn_start(tr_conn_t *c) {
  int rc;
  if (!c->is_unix) uv_tcp_nodelay(&c->sock.tcp, 1);
  c->state = TR__HANDSHAKE;
  c->t_start = c->t_recv = c->t_send = uv_now(c->loop);
  if (c->opt.tls && (!(c->pbuf = malloc(TR__PLAIN_BUF)) ||
                     !(c->tls = qe_tls_new(c->opt.tls, *c->tls_name ? c->tls_name : NULL)))) {
    conn_end(c, TR_CLOSE_IO, 0, "no memory for a TLS session");
    return QE_ENOMEM;
  }
  if ((rc = uv_read_start(&c->sock.stream, on_alloc, on_read))) {
    conn_end(c, TR_CLOSE_IO, 0, "read: %s", uv_strerror(rc));
    return QE_ECOMM;
  }
  c->reading = 1;
  return 0;
}

static void on_connect(uv_connect_t *req, int status) {
  tr_conn_t *c = req->handle->data;
  int rc;
  if (c->state == TR__CLOSING) return; /* closed while connecting (status UV_ECANCELED) */
  if (status < 0) {
    conn_end(c, TR_CLOSE_CONNECT, 0, "connect: %s", uv_strerror(status));
    return;
  }
  if (tr__conn_start(c)) return;
  if (c->tls) {
    if ((rc = tls_start(c)) && rc != QE_EIO) write_failed(c, rc);
    return;
  }
  rc = write_bytes(c, c->hello_frame, c->hello_len);
  free(c->hello_frame);
  c->hello_frame = NULL;
  if (rc) write_failed(c, rc);
}

/* The Hello to send, packed into c->hello_frame. */
static int pack_hello(tr_conn_t *c, const tr_hello_t *h) {
  tr_hello_t hello = QEVICT__WORKER__V1__HELLO__INIT;
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  if (h) hello = *h;
  if (!hello.protocol_version) hello.protocol_version = TR_PROTOCOL_VERSION;
  e.msg_case = ENV_CASE(HELLO);
  e.hello = &hello;
  return tr_frame_encode(&e, TR_FRAME_MAX_HELLO, &c->hello_frame, &c->hello_len);
}

/* The name the listener's certificate must carry: the option's, else a TCP address's host as
 * written when it is localhost, else its IP. */
static void tls_expect(tr_conn_t *c, const tr_options_t *opt, const tr_addr_t *a,
                       const char *text) {
  const struct sockaddr_in *s4 = (const struct sockaddr_in *)&a->sa;
  const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&a->sa;
  if (!opt || !opt->tls) return;
  if (!strncmp(text, "tcp://", 6)) text += 6;
  if (opt->tls_server_name)
    snprintf(c->tls_name, sizeof c->tls_name, "%s", opt->tls_server_name);
  else if (!strncmp(text, "localhost:", 10)) /* (a name, as written) */
    snprintf(c->tls_name, sizeof c->tls_name, "localhost");
  else if (!a->is_unix && a->sa.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &s6->sin6_addr, c->tls_name, sizeof c->tls_name);
  else if (!a->is_unix)
    inet_ntop(AF_INET, &s4->sin_addr, c->tls_name, sizeof c->tls_name);
}

static void start_connect(tr_conn_t *c, const tr_addr_t *a) {
  int rc = 0;
  if (a->is_unix)
    uv_pipe_connect(&c->connect_req, &c->sock.pipe, a->path, on_connect);
  else
    rc = uv_tcp_connect(&c->connect_req, &c->sock.tcp, (const struct sockaddr *)&a->sa, on_connect);
  if (rc) conn_end(c, TR_CLOSE_CONNECT, 0, "connect: %s", uv_strerror(rc));
}

int tr_connect(uv_loop_t *loop, const char *addr, const tr_options_t *opt, const tr_callbacks_t *cb,
               tr_conn_t **out) {
  tr_addr_t a;
  tr_conn_t *c;
  int rc;
  *out = NULL;
  if ((rc = tr_addr_parse(addr, &a))) return rc;
  if (!(c = tr__conn_new(loop, cb, opt, 1, a.is_unix))) return QE_ENOMEM;
  tr_addr_format(&a, c->peer, sizeof c->peer);
  tls_expect(c, opt, &a, addr);
  if ((rc = pack_hello(c, opt ? opt->hello : NULL))) {
    conn_end(c, TR_CLOSE_LOCAL, 0, "%s", bare(qe_errmsg()));
    c->cb.on_close = NULL; /* failed synchronously: no callback */
    return rc;
  }
  start_connect(c, &a);
  *out = c;
  return 0;
}

/* ---- accessors ---------------------------------------------------------------------------- */

int tr_conn_is_open(const tr_conn_t *c) { return c->state == TR__OPEN; }
void *tr_conn_ud(const tr_conn_t *c) { return c->cb.ud; }
void *tr_conn_data(const tr_conn_t *c) { return c->data; }
void tr_conn_set_data(tr_conn_t *c, void *data) { c->data = data; }
const char *tr_conn_peer(const tr_conn_t *c) { return c->peer; }

const tr_hello_t *tr_conn_hello(const tr_conn_t *c) {
  return !c->is_client && c->handshake ? c->handshake->hello : NULL;
}

const tr_hello_ack_t *tr_conn_hello_ack(const tr_conn_t *c) {
  return c->is_client && c->opened ? c->handshake->hello_ack : NULL;
}
