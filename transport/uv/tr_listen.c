/* tr_listen: the listening side of the transport: binding TCP and Unix-domain addresses
 * (replacing a stale socket file, never a live one), accepting connections into tr_conn_t and
 * closing a server with its connections. See tr_conn.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qe_status.h"
#include "tr_conn_internal.h"

/* ---- accepting ---------------------------------------------------------------------------- */

static void link_conn(tr_server_t *s, tr_conn_t *c) {
  c->server = s;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
}

static void name_peer(tr_server_t *s, tr_conn_t *c) {
  struct sockaddr_storage sa;
  int len = (int)sizeof sa;
  if (s->is_unix) {
    snprintf(c->peer, sizeof c->peer, "unix:%s#%lu", s->path, s->n_accepted);
  } else if (uv_tcp_getpeername(&c->sock.tcp, (struct sockaddr *)&sa, &len) == 0) {
    tr_addr_format_sa((struct sockaddr *)&sa, c->peer, sizeof c->peer);
  } else {
    snprintf(c->peer, sizeof c->peer, "tcp peer #%lu", s->n_accepted);
  }
}

static void on_connection(uv_stream_t *listener, int status) {
  tr_server_t *s = listener->data;
  tr_conn_t *c;
  int rc;
  if (status < 0 || s->closing) return;
  if (!(c = tr__conn_new(s->loop, &s->cb, &s->opt, 0, s->is_unix))) return;
  link_conn(s, c);
  s->n_accepted++;
  if ((rc = uv_accept(listener, &c->sock.stream))) {
    snprintf(c->peer, sizeof c->peer, "%s", s->addr);
    tr__conn_abort(c, TR_CLOSE_IO, uv_strerror(rc));
    return;
  }
  name_peer(s, c);
  tr__conn_start(c);
}

/* ---- closing ------------------------------------------------------------------------------ */

static void server_maybe_free(tr_server_t *s) {
  if (s->closing && s->listener_closed && !s->conns) free(s);
}

void tr__server_unlink(tr_conn_t *c) {
  tr_server_t *s = c->server;
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  c->server = NULL;
  server_maybe_free(s);
}

static void on_listener_closed(uv_handle_t *h) {
  tr_server_t *s = h->data;
  s->listener_closed = 1;
  server_maybe_free(s);
}

void tr_server_close(tr_server_t *s) {
  tr_conn_t *c;
  if (!s || s->closing) return;
  s->closing = 1;
  if (s->is_unix) unlink(s->path);
  for (c = s->conns; c; c = c->next) tr_close(c);
  uv_close(&s->sock.handle, on_listener_closed);
}

/* ---- binding ------------------------------------------------------------------------------ */

/* Is a process listening on the Unix socket at path? */
static int unix_live(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), live;
  if (fd < 0) return 0;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  live = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return live;
}

/* A socket file at path: removed when no one listens on it; anything else is an error. */
static int clear_unix_path(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return 0;
  if (!S_ISSOCK(st.st_mode))
    return qe_errf(QE_EIO, "transport: %s exists and is not a socket", path);
  if (unix_live(path))
    return qe_errf(QE_EIO, "transport: a server already listens on unix:%s", path);
  if (unlink(path) != 0)
    return qe_errf(QE_EIO, "transport: removing stale socket %s: %s", path, strerror(errno));
  return 0;
}

static int bind_unix(tr_server_t *s, const tr_addr_t *a) {
  int rc = clear_unix_path(a->path);
  if (rc) return rc;
  if ((rc = uv_pipe_bind(&s->sock.pipe, a->path)))
    return qe_errf(QE_EIO, "transport: bind unix:%s: %s", a->path, uv_strerror(rc));
  snprintf(s->path, sizeof s->path, "%s", a->path);
  snprintf(s->addr, sizeof s->addr, "unix:%s", a->path);
  return 0;
}

static int bind_tcp(tr_server_t *s, const tr_addr_t *a, const char *text) {
  int rc = uv_tcp_bind(&s->sock.tcp, (const struct sockaddr *)&a->sa, 0);
  if (rc) return qe_errf(QE_EIO, "transport: bind %s: %s", text, uv_strerror(rc));
  tr_addr_format(a, s->addr, sizeof s->addr);
  return 0;
}

static void free_on_close(uv_handle_t *h) { free(h->data); }

/* Binds and listens; on failure the handle is closed and s freed from the loop. */
static int start_listening(tr_server_t *s, const tr_addr_t *a, const char *text) {
  int rc = a->is_unix ? bind_unix(s, a) : bind_tcp(s, a, text);
  if (!rc && (rc = uv_listen(&s->sock.stream, 128, on_connection)))
    rc = qe_errf(QE_EIO, "transport: listen on %s: %s", text, uv_strerror(rc));
  if (!rc && !a->is_unix) { /* the port is known once listening */
    struct sockaddr_storage sa;
    int len = (int)sizeof sa;
    if (uv_tcp_getsockname(&s->sock.tcp, (struct sockaddr *)&sa, &len) == 0)
      tr_addr_format_sa((struct sockaddr *)&sa, s->addr, sizeof s->addr);
  }
  if (rc) {
    if (a->is_unix && s->path[0]) unlink(s->path);
    uv_close(&s->sock.handle, free_on_close);
  }
  return rc;
}

int tr_listen(uv_loop_t *loop, const char *addr, const tr_options_t *opt, const tr_callbacks_t *cb,
              tr_server_t **out) {
  tr_addr_t a;
  tr_server_t *s;
  int rc;
  *out = NULL;
  if ((rc = tr_addr_parse(addr, &a))) return rc;
  if (!(s = calloc(1, sizeof *s))) return qe_errf(QE_ENOMEM, "transport: server");
  s->loop = loop;
  s->cb = *cb;
  s->is_unix = a.is_unix;
  tr__options_resolve(opt, &s->opt);
  rc = a.is_unix ? uv_pipe_init(loop, &s->sock.pipe, 0) : uv_tcp_init(loop, &s->sock.tcp);
  if (rc) {
    free(s);
    return qe_errf(QE_EIO, "transport: socket: %s", uv_strerror(rc));
  }
  s->sock.handle.data = s;
  if ((rc = start_listening(s, &a, addr))) return rc;
  *out = s;
  return 0;
}

const char *tr_server_address(const tr_server_t *s) { return s->addr; }
