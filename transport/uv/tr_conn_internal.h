/* tr_conn_internal: what tr_conn.c (connections) and tr_listen.c (servers) share. Not for
 * users of the transport. */
#ifndef QE_TR_CONN_INTERNAL_H
#define QE_TR_CONN_INTERNAL_H

#include <stdint.h>

#include "tr_addr.h"
#include "tr_conn.h"

#define TR__READ_BUF    ((size_t)64 << 10)
#define TR__QUEUED_DFLT ((size_t)64 << 20)
#define TR__PLAIN_BUF   ((size_t)16 << 10)

typedef union {
  uv_handle_t handle;
  uv_stream_t stream;
  uv_tcp_t tcp;
  uv_pipe_t pipe;
} tr__sock_t;

typedef enum { TR__CONNECTING, TR__HANDSHAKE, TR__OPEN, TR__CLOSING } tr__state_t;

struct tr_conn {
  tr__sock_t sock;  /* handle->data == this */
  uv_timer_t timer; /* heartbeats, timeouts, the closing deadline */
  uv_connect_t connect_req;
  uv_shutdown_t shutdown_req;
  uv_loop_t *loop;
  tr_callbacks_t cb;
  tr_options_t opt;       /* defaults applied; hello NULL */
  tr_server_t *server;    /* accepted: the server that accepted it, until freed */
  tr_conn_t *prev, *next; /* in server->conns */
  tr__state_t state;
  int is_client, is_unix;
  int reading, opened, shut_done, hard_closing;
  int handles; /* uv handles not yet closed */
  tr_decoder_t dec;
  struct qe_tls *tls;     /* the session when opt.tls is set (from tr__conn_start) */
  uint8_t *pbuf;          /* with it: decrypted bytes on their way to the decoder */
  int tls_open, tls_dead; /* its handshake is done; it failed (no more records) */
  uint8_t first[2];       /* the first two bytes received, n_first of them */
  int n_first;
  uint8_t *hello_frame; /* connecting side: the packed Hello, until sent */
  size_t hello_len;
  tr_env_t *handshake; /* the peer's Hello (accepted) or HelloAck (connecting) */
  uint64_t t_start, t_recv, t_send, t_tick, t_closing; /* uv_now() ms */
  uint64_t hb_seq;
  int reason;
  char detail[384];
  void *data;
  char peer[192];
  char tls_name[256]; /* connecting side: the name the peer's certificate must carry, or "" */
  uint8_t rbuf[TR__READ_BUF];
};

struct tr_server {
  tr__sock_t sock;
  uv_loop_t *loop;
  tr_callbacks_t cb;
  tr_options_t opt;
  tr_conn_t *conns; /* accepted and not yet freed */
  int is_unix, closing, listener_closed;
  unsigned long n_accepted;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  char addr[160];
};

/* *out = *in with defaults applied (in may be NULL); out->hello = NULL. */
void tr__options_resolve(const tr_options_t *in, tr_options_t *out);
/* A connection with its stream (TCP or pipe) and timer handles initialised; NULL on failure
 * (QE_ENOMEM detail). Not started: the caller connects or accepts, then tr__conn_start. */
tr_conn_t *tr__conn_new(uv_loop_t *loop, const tr_callbacks_t *cb, const tr_options_t *opt,
                        int is_client, int is_unix);
/* Connected: starts reading and the timer. Returns 0 or closes c (on_close follows). */
int tr__conn_start(tr_conn_t *c);
/* Closes c at once with reason and detail (on_close follows from the loop). */
void tr__conn_abort(tr_conn_t *c, int reason, const char *detail);
/* tr_listen.c: c is being freed; forget it (and free a closed server left empty). */
void tr__server_unlink(tr_conn_t *c);

#endif
