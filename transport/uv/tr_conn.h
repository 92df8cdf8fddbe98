/* tr_conn: scheduler<->worker connections over libuv streams (TCP and Unix-domain), carrying
 * the frames of tr_frame.h.
 *
 * A session: the connecting side (the worker, tr_connect) sends Hello; the listening side
 * (the scheduler, tr_listen) checks its protocol version (and lets on_hello vet the rest),
 * then answers HelloAck, or a fatal Error and closes. Only then is the connection open:
 * on_open, then on_message for every frame but heartbeats, which the transport sends itself
 * (every heartbeat_ms without other traffic) and consumes. A peer that sends nothing for
 * timeout_ms, or does not complete the handshake within it, is reported down.
 *
 * Hostile input never crashes and never harms another connection: a declared frame length
 * above max_frame (TR_FRAME_MAX_HELLO until the handshake is done), a payload that is not an
 * Envelope, a message out of sequence or a peer that stops reading (more than max_queued
 * bytes waiting) closes that connection, with a fatal Error frame to the peer saying why when
 * the stream is still writable.
 *
 * With a TLS context in the options (qe_tls.h), the stream is TLS 1.2/1.3 under the frames: the
 * TLS handshake comes first (within timeout_ms, as the Hello does), then the same session; the
 * connecting side checks the listener's certificate against the context's CA bundle (and
 * tls_server_name), a listener whose context names a client CA checks the connecting side's.
 * Graceful closes send close_notify. A failed TLS handshake or a bad record closes that
 * connection (TR_CLOSE_TLS, OpenSSL's reason in the detail); a peer that speaks TLS to a
 * plaintext side, or plaintext to a TLS side, is named as such in the detail.
 *
 * Every connection, accepted or connecting, ends with exactly one on_close(reason, detail);
 * the tr_conn_t is freed right after that callback returns. Nothing is called after it.
 *
 * Threading: a connection and a server belong to the thread running their uv loop; call
 * these functions on that thread only (several loops in several threads are fine: there is no
 * global state). Callbacks run on the loop thread. */
#ifndef QE_TR_CONN_H
#define QE_TR_CONN_H

#include <stddef.h>
#include <uv.h>

#include "tr_frame.h"

struct qe_tls_ctx; /* qe_tls.h */

typedef struct tr_conn tr_conn_t;
typedef struct tr_server tr_server_t;

typedef Qevict__Worker__V1__Hello tr_hello_t;
typedef Qevict__Worker__V1__HelloAck tr_hello_ack_t;

/* Why a connection ended: LOCAL tr_close or tr_server_close; EOF the peer hung up; IO a reset or
 * failed write; CONNECT tr_connect could not connect; PROTOCOL garbage or a message out of
 * sequence; OVERSIZE a declared length above the maximum; VERSION protocol versions differ;
 * REFUSED on_hello said no; TIMEOUT no handshake in time or a silent peer; PEER_ERROR the
 * peer sent a fatal Error; OVERLOAD the peer stopped reading (write queue > max_queued); TLS the
 * TLS handshake or a record failed (a certificate refused, a peer not speaking TLS); BUSY
 * on_hello said not yet (QE_EBUSY: the place is held for now; connect again soon). */
#define TR_CLOSE_REASONS(X)                                                                        \
  X(TR_CLOSE_LOCAL, "closed locally")                                                              \
  X(TR_CLOSE_EOF, "peer closed the connection")                                                    \
  X(TR_CLOSE_IO, "i/o error")                                                                      \
  X(TR_CLOSE_CONNECT, "connect failed")                                                            \
  X(TR_CLOSE_PROTOCOL, "protocol error")                                                           \
  X(TR_CLOSE_OVERSIZE, "frame too large")                                                          \
  X(TR_CLOSE_VERSION, "protocol version mismatch")                                                 \
  X(TR_CLOSE_REFUSED, "refused")                                                                   \
  X(TR_CLOSE_TIMEOUT, "timed out")                                                                 \
  X(TR_CLOSE_PEER_ERROR, "peer reported an error")                                                 \
  X(TR_CLOSE_OVERLOAD, "peer not reading")                                                         \
  X(TR_CLOSE_TLS, "tls failed")                                                                    \
  X(TR_CLOSE_BUSY, "busy")

typedef enum {
#define TR__ENUM(name, text) name,
  TR_CLOSE_REASONS(TR__ENUM)
#undef TR__ENUM
} tr_close_reason_t;

/* Static text of a close reason ("unknown" outside the table). */
const char *tr_close_reason_str(int reason);

typedef struct tr_callbacks {
  void *ud; /* for the callbacks: tr_conn_ud(c) */
  /* Listening side only, may be NULL (accept every peer of the right version): vets a peer's
   * Hello. Return 0 to accept (fields set in ack, e.g. worker_id, are sent; strings must stay
   * valid until this returns) or a negative QE_E* with a qe_errf detail, sent to the peer in
   * a fatal Error before closing (TR_CLOSE_REFUSED; QE_EBUSY: TR_CLOSE_BUSY). */
  int (*on_hello)(tr_conn_t *c, const tr_hello_t *hello, tr_hello_ack_t *ack);
  /* The handshake is done; tr_send may be used. May be NULL. */
  void (*on_open)(tr_conn_t *c);
  /* A frame from the open peer (never Hello, HelloAck or Heartbeat). m is valid during the
   * call only. May call tr_send and tr_close. */
  void (*on_message)(tr_conn_t *c, const tr_env_t *m);
  /* The connection is gone; reason: a tr_close_reason_t, detail: one line (the peer, why).
   * Called once per connection, including connects that failed and accepted peers that never
   * completed the handshake. c is freed when this returns. May be NULL. */
  void (*on_close)(tr_conn_t *c, int reason, const char *detail);
} tr_callbacks_t;

typedef struct tr_options {
  size_t max_frame;      /* largest payload accepted and sent; 0: TR_FRAME_MAX_DEFAULT */
  unsigned heartbeat_ms; /* send a Heartbeat after this long without sending; 0: 1000 */
  unsigned timeout_ms;   /* peer silent this long, or no handshake by then: down; 0: 5000 */
  size_t max_queued;     /* bytes waiting to be written before the peer counts as stuck;
                          * 0: 64 MiB (and at least max_frame + 4) */
  /* tr_connect only: the Hello to send (copied; NULL: an empty one). Its protocol_version 0
   * means TR_PROTOCOL_VERSION (set another only to test a mismatch). */
  const tr_hello_t *hello;
  /* TLS (NULL: plaintext): a server context for tr_listen, a client context for tr_connect
   * (borrowed: it must outlive every connection made with it). */
  struct qe_tls_ctx *tls;
  /* tr_connect with tls: the name the listener's certificate must carry (an IP literal or a DNS
   * name; copied). NULL: for TCP the address's host (localhost as a name, else the IP), for
   * Unix sockets no name check. */
  const char *tls_server_name;
} tr_options_t;

/* Listens on addr (tr_addr.h syntax) and accepts connections on loop; each one gets a copy of
 * *cb and *opt (opt may be NULL: defaults). A Unix socket file left at the path by a dead
 * process is replaced; one with a live listener is not (QE_EIO). Returns 0 with *out, or a
 * negative code with a detail (bad address, bind or listen failure). */
int tr_listen(uv_loop_t *loop, const char *addr, const tr_options_t *opt, const tr_callbacks_t *cb,
              tr_server_t **out);
/* The address actually listened on ("tcp://127.0.0.1:40123", "unix:/run/q.sock"): with port
 * 0, the port the system chose. Static storage of s. */
const char *tr_server_address(const tr_server_t *s);
/* Stops accepting and closes every connection accepted by s (each gets on_close with
 * TR_CLOSE_LOCAL). s is freed once they are all gone; a Unix socket file is removed. */
void tr_server_close(tr_server_t *s);

/* Connects to addr and sends the Hello of opt. Returns 0 with *out (the connection, open once
 * on_open is called), or QE_EINVAL (bad address) / QE_ENOMEM synchronously; a failure to
 * connect is reported later through on_close (TR_CLOSE_CONNECT). */
int tr_connect(uv_loop_t *loop, const char *addr, const tr_options_t *opt, const tr_callbacks_t *cb,
               tr_conn_t **out);

/* Queues one frame. m is packed at once (the caller keeps ownership). Returns 0, QE_ECOMM if
 * the connection is not open (handshake pending or closing), QE_EINVAL for an Envelope with
 * no message or a handshake message, QE_ERANGE if its payload exceeds max_frame, QE_ENOMEM
 * (for both: nothing sent, the connection stays). A peer that has stopped reading
 * (max_queued exceeded) or a write libuv refuses closes the connection (TR_CLOSE_OVERLOAD,
 * TR_CLOSE_IO) and QE_ECOMM is returned: a frame accepted with 0 is written unless the
 * connection closes. */
int tr_send(tr_conn_t *c, const tr_env_t *m);

/* Closes c: frames already queued are flushed first (for at most timeout_ms), then on_close
 * is called with TR_CLOSE_LOCAL (from the loop, not from within tr_close). No on_message
 * after this. Safe to call more than once and from callbacks. */
void tr_close(tr_conn_t *c);

/* 1 once the handshake is done and until the connection starts closing. */
int tr_conn_is_open(const tr_conn_t *c);
/* The callbacks' ud. */
void *tr_conn_ud(const tr_conn_t *c);
/* A pointer of the application's own, NULL until set. */
void *tr_conn_data(const tr_conn_t *c);
void tr_conn_set_data(tr_conn_t *c, void *data);
/* The peer, for logs ("tcp://127.0.0.1:51234", "unix:/run/q.sock"). Static storage of c. */
const char *tr_conn_peer(const tr_conn_t *c);
/* Listening side: the peer's Hello once received (NULL before). Connecting side: NULL. */
const tr_hello_t *tr_conn_hello(const tr_conn_t *c);
/* Connecting side: the peer's HelloAck once open (NULL before). Listening side: NULL. */
const tr_hello_ack_t *tr_conn_hello_ack(const tr_conn_t *c);

#endif
