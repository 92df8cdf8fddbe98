/* tp_comm_cpu: the CPU socket backend of tp_comm. The ranks of a tensor-parallel group live
 * in separate processes joined over Unix stream sockets in a star through rank 0:
 * - all-reduce: every peer sends its buffer to rank 0, which adds them in rank order
 *   0,1,...,T-1 in fp32 (so the bits depend only on the inputs) and sends the sum back;
 * - broadcast: the root's buffer goes out from rank 0 (a non-zero root sends to rank 0 first,
 *   which relays chunk by chunk);
 * - all-gather: rank 0 assembles [size][bytes] in rank order and sends it back.
 * Wire format: every message is a chunk of at most TP_CHUNK bytes behind a header (magic, op,
 * arg, sequence number, total bytes, offset) that the receiver checks against what it
 * expects, so a desynchronised peer is caught. All I/O is non-blocking per call (MSG_DONTWAIT)
 * behind poll() with an inactivity timeout, sends use MSG_NOSIGNAL: a dead or silent peer
 * gives QE_ECOMM, never a hang or a SIGPIPE. A failing rank shuts its sockets down so that
 * the others fail promptly too. Connections open with a handshake (magic, version, rank,
 * size) that rank 0 answers with an accept or a refusal. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "qe_log.h"
#include "qe_status.h"
#include "tp_comm.h"

#define TP_MAGIC            0x54504551u         /* "QEPT" in memory order on little-endian hosts */
#define TP_VERSION          1u                  /* bump on any wire-format change */
#define TP_CHUNK            ((uint64_t)4 << 20) /* payload bytes per message; a multiple of 4 */
#define TP_MAX_SIZE         4096                /* ranks per group at most (fits the uint16 arg) */
#define TP_HELLO_TIMEOUT_MS 5000      /* rank 0 waits this long for an accepted peer's hello */
#define TP_CONNECT_RETRY_NS 20000000L /* 20 ms between connect attempts */
#define TP_WAIT_NOTE_MS     5000      /* a rank still waiting for its group says so this often */

enum { TP_OP_AR_UP = 1, TP_OP_AR_DOWN, TP_OP_BC_UP, TP_OP_BC_DOWN, TP_OP_AG_UP, TP_OP_AG_DOWN };

/* Message header; the payload (len = min(TP_CHUNK, total - off) bytes) follows. */
typedef struct {
  uint32_t magic;
  uint16_t op;
  uint16_t arg; /* sender rank (up), root (broadcast), 0 (down) */
  uint64_t seq; /* the collective's sequence number, the same on every rank */
  uint64_t total;
  uint64_t off;
} tp__hdr_t;

typedef struct {
  uint32_t magic, version;
  int32_t rank, size;
} tp__hello_t;

enum { TP_ACK_OK = 0, TP_ACK_BAD_MAGIC, TP_ACK_BAD_SIZE, TP_ACK_BAD_RANK, TP_ACK_DUPLICATE };

typedef struct {
  uint32_t magic, version;
  int32_t status, size; /* TP_ACK_*, rank 0's group size */
} tp__ack_t;

typedef struct tp_cpu {
  tp_comm_t base;
  int *fds; /* [size]: rank 0 uses fds[1..size-1], rank r > 0 uses fds[0]; -1 if unused */
  int timeout_ms;
  uint64_t seq;
  const char *op; /* the collective in progress, for error lines */
  float *scratch; /* [TP_CHUNK / 4] on rank 0: one peer's chunk during the all-reduce */
  int broken;
  char why[384]; /* the error that broke the communicator */
} tp_cpu_t;

static const tp_comm_ops_t tp__cpu_ops;

/* ---- time and raw I/O ---------------------------------------------------------------- */

static int64_t tp__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for events on fd until deadline. 0 ready, 1 timed out, QE_ECOMM on poll failure. */
static int tp__wait(int fd, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - tp__now_ms();
    if (left <= 0) return 1;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
    if (r > 0) return 0;
    if (r < 0 && errno != EINTR) return qe_errf(QE_ECOMM, "poll: %s", strerror(errno));
  }
}

/* Drops the first r bytes of the iovec array *iov (count *n), skipping emptied entries. */
static void tp__advance(struct iovec **iov, int *n, size_t r) {
  while (*n && r >= (*iov)->iov_len) {
    r -= (*iov)->iov_len;
    (*iov)++;
    (*n)--;
  }
  if (*n) {
    (*iov)->iov_base = (char *)(*iov)->iov_base + r;
    (*iov)->iov_len -= r;
  }
}

/* Moves at least `want` bytes of the iovec array over fd (at most all of it), consuming the
 * array in place, waiting at most timeout_ms for each bit of progress. Returns 0 or QE_ECOMM
 * whose detail is the bare reason (callers add the context). */
static int tp__xferv(int fd, struct iovec **iov, int *n, size_t want, int sending, int timeout_ms) {
  int64_t deadline = tp__now_ms() + timeout_ms;
  tp__advance(iov, n, 0);
  while (want) {
    struct msghdr m = {.msg_iov = *iov, .msg_iovlen = (size_t)*n};
    ssize_t r =
        sending ? sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) : recvmsg(fd, &m, MSG_DONTWAIT);
    if (r > 0) {
      tp__advance(iov, n, (size_t)r);
      want -= (size_t)r < want ? (size_t)r : want;
      deadline = tp__now_ms() + timeout_ms;
    } else if (r == 0) {
      return qe_errf(QE_ECOMM, sending ? "send made no progress" : "connection closed");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = tp__wait(fd, sending ? POLLOUT : POLLIN, deadline);
      if (w == 1) return qe_errf(QE_ECOMM, "no progress for %d ms", timeout_ms);
      if (w) return w;
    } else if (errno != EINTR) {
      return qe_errf(QE_ECOMM, "%s", strerror(errno));
    }
  }
  return 0;
}

/* Moves exactly len bytes of buf over fd (see tp__xferv). */
static int tp__xfer(int fd, void *buf, size_t len, int sending, int timeout_ms) {
  struct iovec v = {buf, len}, *iov = &v;
  int n = 1;
  return tp__xferv(fd, &iov, &n, len, sending, timeout_ms);
}

static size_t tp__iov_bytes(const struct iovec *iov, int n) {
  size_t b = 0;
  for (int i = 0; i < n; i++) b += iov[i].iov_len;
  return b;
}

/* ---- framed messages ------------------------------------------------------------------- */

static const char *tp__op_name(unsigned op) {
  static const char *const names[] = {"?",          "allreduce-up", "allreduce-down", "bcast-up",
                                      "bcast-down", "allgather-up", "allgather-down"};
  return op < sizeof names / sizeof names[0] ? names[op] : "?";
}

static size_t tp__chunk_len(uint64_t total, uint64_t off) {
  return (size_t)(total - off < TP_CHUNK ? total - off : TP_CHUNK);
}

/* Marks c broken with the current detail line and shuts its sockets so peers fail too. */
static void tp__break(tp_cpu_t *c) {
  snprintf(c->why, sizeof c->why, "%s", qe_errmsg());
  c->broken = 1;
  for (int i = 0; i < c->base.size; i++)
    if (c->fds[i] >= 0) shutdown(c->fds[i], SHUT_RDWR);
}

/* tp__xferv to/from a peer rank, with "who, what, during which collective" on failure. */
static int tp__io(tp_cpu_t *c, int peer, struct iovec **iov, int *n, size_t want, int sending) {
  int rc = tp__xferv(c->fds[peer], iov, n, want, sending, c->timeout_ms);
  if (rc == 0) return 0;
  char why[256];
  snprintf(why, sizeof why, "%s", qe_errmsg());
  return qe_errf(QE_ECOMM, "tp: rank %d %s rank %d during %s: %s", c->base.rank,
                 sending ? "->" : "<-", peer, c->op, why);
}

static tp__hdr_t tp__hdr(const tp_cpu_t *c, int op, int arg, uint64_t total, uint64_t off) {
  tp__hdr_t h = {TP_MAGIC, (uint16_t)op, (uint16_t)arg, c->seq, total, off};
  return h;
}

/* Sends the chunk at off of a total-byte message (src points at the chunk's bytes), header
 * and payload in one system call where the socket takes it. */
static int tp__send_chunk(tp_cpu_t *c, int peer, int op, int arg, const void *src, uint64_t total,
                          uint64_t off) {
  tp__hdr_t h = tp__hdr(c, op, arg, total, off);
  struct iovec v[2] = {{&h, sizeof h}, {(void *)src, tp__chunk_len(total, off)}}, *iov = v;
  int n = 2;
  return tp__io(c, peer, &iov, &n, tp__iov_bytes(v, 2), 1);
}

static int tp__check_hdr(const tp_cpu_t *c, int peer, const tp__hdr_t *got, const tp__hdr_t *want) {
  if (memcmp(got, want, sizeof *got) == 0) return 0;
  if (got->magic != TP_MAGIC)
    return qe_errf(QE_ECOMM, "tp: rank %d <- rank %d during %s: bad frame magic 0x%08x",
                   c->base.rank, peer, c->op, (unsigned)got->magic);
  return qe_errf(QE_ECOMM,
                 "tp: rank %d <- rank %d during %s: desynchronised: expected %s(arg %u) seq %llu "
                 "%llu@%llu, got %s(arg %u) seq %llu %llu@%llu",
                 c->base.rank, peer, c->op, tp__op_name(want->op), (unsigned)want->arg,
                 (unsigned long long)want->seq, (unsigned long long)want->total,
                 (unsigned long long)want->off, tp__op_name(got->op), (unsigned)got->arg,
                 (unsigned long long)got->seq, (unsigned long long)got->total,
                 (unsigned long long)got->off);
}

/* Receives the chunk at off of a total-byte message into dst (the chunk's bytes). The header
 * is checked as soon as it is in, so a shorter or different message fails at once rather
 * than waiting for bytes that will never come. */
static int tp__recv_chunk(tp_cpu_t *c, int peer, int op, int arg, void *dst, uint64_t total,
                          uint64_t off) {
  tp__hdr_t got, want = tp__hdr(c, op, arg, total, off);
  struct iovec v[2] = {{&got, sizeof got}, {dst, tp__chunk_len(total, off)}}, *iov = v;
  int n = 2;
  int rc = tp__io(c, peer, &iov, &n, sizeof got, 0);
  if (rc == 0) rc = tp__check_hdr(c, peer, &got, &want);
  if (rc == 0) rc = tp__io(c, peer, &iov, &n, tp__iov_bytes(iov, n), 0);
  return rc;
}

/* Whole messages over one link (peers to and from rank 0). */
static int tp__send_msg(tp_cpu_t *c, int peer, int op, int arg, const void *buf, uint64_t total) {
  uint64_t off = 0;
  do {
    int rc = tp__send_chunk(c, peer, op, arg, (const char *)buf + off, total, off);
    if (rc) return rc;
    off += TP_CHUNK;
  } while (off < total);
  return 0;
}

static int tp__recv_msg(tp_cpu_t *c, int peer, int op, int arg, void *buf, uint64_t total) {
  uint64_t off = 0;
  do {
    int rc = tp__recv_chunk(c, peer, op, arg, (char *)buf + off, total, off);
    if (rc) return rc;
    off += TP_CHUNK;
  } while (off < total);
  return 0;
}

/* Rank 0: buf (total bytes) to every peer except skip, chunk by chunk round the peers. */
static int tp__fan_out(tp_cpu_t *c, int op, int arg, const void *buf, uint64_t total, int skip) {
  uint64_t off = 0;
  do {
    for (int p = 1; p < c->base.size; p++) {
      if (p == skip) continue;
      int rc = tp__send_chunk(c, p, op, arg, (const char *)buf + off, total, off);
      if (rc) return rc;
    }
    off += TP_CHUNK;
  } while (off < total);
  return 0;
}

/* ---- collectives -------------------------------------------------------------------- */

static int tp__begin(tp_cpu_t *c, const char *op) {
  if (c->broken)
    return qe_errf(QE_ECOMM, "tp: rank %d: %s on a communicator broken by: %s", c->base.rank, op,
                   c->why);
  c->op = op;
  c->seq++;
  return 0;
}

static int tp__end(tp_cpu_t *c, int rc) {
  if (rc == QE_ECOMM) tp__break(c);
  return rc;
}

/* Rank 0 of the all-reduce: buf += peer 1's, then peer 2's, ... chunk by chunk (each element
 * gets its terms in rank order), then the sum goes back to every peer. */
static int tp__allreduce_root(tp_cpu_t *c, float *buf, uint64_t total) {
  uint64_t off = 0;
  do {
    size_t n = tp__chunk_len(total, off) / sizeof(float);
    float *acc = buf + off / sizeof(float);
    for (int p = 1; p < c->base.size; p++) {
      int rc = tp__recv_chunk(c, p, TP_OP_AR_UP, p, c->scratch, total, off);
      if (rc) return rc;
      for (size_t i = 0; i < n; i++) acc[i] += c->scratch[i];
    }
    off += TP_CHUNK;
  } while (off < total);
  return tp__fan_out(c, TP_OP_AR_DOWN, 0, buf, total, 0);
}

static int tp__cpu_allreduce(tp_comm_t *base, float *buf, size_t n) {
  tp_cpu_t *c = (tp_cpu_t *)base;
  if (n > SIZE_MAX / sizeof(float) || (n && !buf))
    return qe_errf(QE_EINVAL, "tp: allreduce of %zu floats at %p", n, (void *)buf);
  int rc = tp__begin(c, "allreduce");
  if (rc) return rc;
  uint64_t total = (uint64_t)n * sizeof(float);
  if (base->rank == 0) return tp__end(c, tp__allreduce_root(c, buf, total));
  rc = tp__send_msg(c, 0, TP_OP_AR_UP, base->rank, buf, total);
  if (rc == 0) rc = tp__recv_msg(c, 0, TP_OP_AR_DOWN, 0, buf, total);
  return tp__end(c, rc);
}

/* Rank 0 relays a non-zero root's buffer: each chunk in from the root, out to the others. */
static int tp__broadcast_relay(tp_cpu_t *c, char *buf, uint64_t total, int root) {
  uint64_t off = 0;
  do {
    int rc = tp__recv_chunk(c, root, TP_OP_BC_UP, root, buf + off, total, off);
    for (int p = 1; rc == 0 && p < c->base.size; p++)
      if (p != root) rc = tp__send_chunk(c, p, TP_OP_BC_DOWN, root, buf + off, total, off);
    if (rc) return rc;
    off += TP_CHUNK;
  } while (off < total);
  return 0;
}

static int tp__cpu_broadcast(tp_comm_t *base, void *buf, size_t bytes, int root) {
  tp_cpu_t *c = (tp_cpu_t *)base;
  if (root < 0 || root >= base->size || (bytes && !buf))
    return qe_errf(QE_EINVAL, "tp: broadcast of %zu bytes from root %d of %d", bytes, root,
                   base->size);
  int rc = tp__begin(c, "broadcast");
  if (rc) return rc;
  if (base->rank == 0)
    rc = root == 0 ? tp__fan_out(c, TP_OP_BC_DOWN, 0, buf, bytes, 0)
                   : tp__broadcast_relay(c, buf, bytes, root);
  else if (base->rank == root)
    rc = tp__send_msg(c, 0, TP_OP_BC_UP, root, buf, bytes);
  else
    rc = tp__recv_msg(c, 0, TP_OP_BC_DOWN, root, buf, bytes);
  return tp__end(c, rc);
}

/* Rank 0 of the all-gather: own block, then each peer's into its slot, then all to all. */
static int tp__allgather_root(tp_cpu_t *c, const void *send, char *recv, uint64_t bytes) {
  if (bytes && send != recv) memmove(recv, send, bytes);
  uint64_t off = 0;
  do {
    for (int p = 1; p < c->base.size; p++) {
      int rc = tp__recv_chunk(c, p, TP_OP_AG_UP, p, recv + p * bytes + off, bytes, off);
      if (rc) return rc;
    }
    off += TP_CHUNK;
  } while (off < bytes);
  return tp__fan_out(c, TP_OP_AG_DOWN, 0, recv, bytes * (uint64_t)c->base.size, 0);
}

static int tp__cpu_allgather(tp_comm_t *base, const void *send, void *recv, size_t bytes) {
  tp_cpu_t *c = (tp_cpu_t *)base;
  if (bytes > SIZE_MAX / (size_t)base->size || (bytes && (!send || !recv)))
    return qe_errf(QE_EINVAL, "tp: allgather of %zu bytes x %d ranks", bytes, base->size);
  int rc = tp__begin(c, "allgather");
  if (rc) return rc;
  if (base->rank == 0) return tp__end(c, tp__allgather_root(c, send, recv, bytes));
  rc = tp__send_msg(c, 0, TP_OP_AG_UP, base->rank, send, bytes);
  if (rc == 0) rc = tp__recv_msg(c, 0, TP_OP_AG_DOWN, 0, recv, bytes * (uint64_t)base->size);
  return tp__end(c, rc);
}

static void tp__cpu_destroy(tp_comm_t *base) {
  tp_cpu_t *c = (tp_cpu_t *)base;
  for (int i = 0; i < base->size; i++)
    if (c->fds[i] >= 0) close(c->fds[i]);
  free(c->scratch);
  free(c->fds);
  free(c);
}

static const tp_comm_ops_t tp__cpu_ops = {
    .name = "cpu",
    .allreduce_sum_f32 = tp__cpu_allreduce,
    .broadcast = tp__cpu_broadcast,
    .allgather = tp__cpu_allgather,
    .destroy = tp__cpu_destroy,
};

/* ---- creation ------------------------------------------------------------------------ */

static int tp__env_timeout(void) {
  const char *s = getenv("QEVICT_TP_TIMEOUT_MS");
  char *end;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || end == s || *end || v <= 0 || v > INT32_MAX) return TP_COMM_DEFAULT_TIMEOUT_MS;
  return (int)v;
}

static int tp__alloc(int rank, int size, tp_cpu_t **out) {
  tp_cpu_t *c = calloc(1, sizeof *c);
  if (!c) return qe_errf(QE_ENOMEM, "tp: out of memory");
  c->fds = malloc((size_t)size * sizeof *c->fds);
  c->scratch = rank == 0 && size > 1 ? malloc(TP_CHUNK) : NULL;
  if (!c->fds || (rank == 0 && size > 1 && !c->scratch)) {
    free(c->fds);
    free(c->scratch);
    free(c);
    return qe_errf(QE_ENOMEM, "tp: out of memory");
  }
  for (int i = 0; i < size; i++) c->fds[i] = -1;
  c->base = (tp_comm_t){.ops = &tp__cpu_ops, .rank = rank, .size = size};
  c->timeout_ms = tp__env_timeout();
  c->op = "handshake";
  *out = c;
  return 0;
}

/* Bigger socket buffers mean fewer wake-ups per chunk; failure is harmless. */
static void tp__tune(int fd) {
  int sz = (int)TP_CHUNK;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

static const char *tp__ack_reason(int status) {
  switch (status) {
  case TP_ACK_BAD_MAGIC:
    return "bad magic or protocol version";
  case TP_ACK_BAD_SIZE:
    return "group size mismatch";
  case TP_ACK_BAD_RANK:
    return "rank out of range or not the one expected on this link";
  case TP_ACK_DUPLICATE:
    return "rank already joined";
  default:
    return "unknown refusal";
  }
}

static int tp__hello_status(const tp_cpu_t *c, const tp__hello_t *h, int want_rank) {
  if (h->magic != TP_MAGIC || h->version != TP_VERSION) return TP_ACK_BAD_MAGIC;
  if (h->size != c->base.size) return TP_ACK_BAD_SIZE;
  if (h->rank < 1 || h->rank >= c->base.size) return TP_ACK_BAD_RANK;
  if (want_rank > 0 && h->rank != want_rank) return TP_ACK_BAD_RANK;
  if (want_rank <= 0 && c->fds[h->rank] >= 0) return TP_ACK_DUPLICATE;
  return TP_ACK_OK;
}

/* Rank 0: reads a peer's hello on fd, answers accept or refusal. want_rank > 0 requires that
 * rank (pre-connected links), else any rank not yet joined. Sets *rank when accepted. */
static int tp__greet_peer(tp_cpu_t *c, int fd, int timeout_ms, int want_rank, int *rank) {
  tp__hello_t h;
  int rc = tp__xfer(fd, &h, sizeof h, 0, timeout_ms);
  if (rc) {
    char why[256];
    snprintf(why, sizeof why, "%s", qe_errmsg());
    return qe_errf(QE_ECOMM, "tp: rank 0: handshake with a peer: %s", why);
  }
  int status = tp__hello_status(c, &h, want_rank);
  tp__ack_t a = {TP_MAGIC, TP_VERSION, status, c->base.size};
  rc = tp__xfer(fd, &a, sizeof a, 1, timeout_ms);
  if (status != TP_ACK_OK)
    return qe_errf(QE_ECOMM, "tp: rank 0: refused a peer claiming rank %d of %d: %s", (int)h.rank,
                   (int)h.size, tp__ack_reason(status));
  if (rc) return qe_errf(QE_ECOMM, "tp: rank 0: handshake with rank %d: ack not sent", (int)h.rank);
  *rank = h.rank;
  return 0;
}

/* Rank r > 0: announces itself on fd (its link to rank 0) and waits for the answer. */
static int tp__greet_root(tp_cpu_t *c, int fd, int timeout_ms) {
  tp__hello_t h = {TP_MAGIC, TP_VERSION, c->base.rank, c->base.size};
  tp__ack_t a;
  int rc = tp__xfer(fd, &h, sizeof h, 1, timeout_ms);
  if (rc == 0) rc = tp__xfer(fd, &a, sizeof a, 0, timeout_ms);
  if (rc) {
    char why[256];
    snprintf(why, sizeof why, "%s", qe_errmsg());
    return qe_errf(QE_ECOMM, "tp: rank %d: handshake with rank 0: %s", c->base.rank, why);
  }
  if (a.magic != TP_MAGIC || a.version != TP_VERSION)
    return qe_errf(QE_ECOMM, "tp: rank %d: handshake: rank 0 speaks another protocol",
                   c->base.rank);
  if (a.status != TP_ACK_OK)
    return qe_errf(QE_ECOMM, "tp: rank %d of %d: refused by rank 0 (size %d): %s", c->base.rank,
                   c->base.size, (int)a.size, tp__ack_reason(a.status));
  return 0;
}

static int tp__check_args(int rank, int size) {
  if (size < 1 || size > TP_MAX_SIZE || rank < 0 || rank >= size)
    return qe_errf(QE_EINVAL, "tp: rank %d of size %d (size must be 1..%d)", rank, size,
                   TP_MAX_SIZE);
  return 0;
}

static void tp__close_links(const int *fds, int rank, int size) {
  for (int i = rank == 0 ? 1 : 0; i < (rank == 0 ? size : 1); i++)
    if (fds[i] >= 0) close(fds[i]);
}

/* Takes the caller's links into c and runs the handshake over them. */
static int tp__adopt_links(tp_cpu_t *c, const int *fds) {
  int rank = c->base.rank, size = c->base.size, rc = 0, got;
  for (int i = rank == 0 ? 1 : 0; i < (rank == 0 ? size : 1); i++) {
    c->fds[i] = fds[i];
    if (fds[i] < 0) rc = qe_errf(QE_EINVAL, "tp: create_cpu_fds: fds[%d] is %d", i, fds[i]);
    if (fds[i] >= 0) tp__tune(fds[i]);
  }
  for (int p = 1; rc == 0 && rank == 0 && p < size; p++)
    rc = tp__greet_peer(c, c->fds[p], c->timeout_ms, p, &got);
  if (rc == 0 && rank > 0) rc = tp__greet_root(c, c->fds[0], c->timeout_ms);
  return rc;
}

int tp_comm_create_cpu_fds(const int *fds, int rank, int size, tp_comm_t **out) {
  int rc = tp__check_args(rank, size);
  if (rc == 0 && !fds) rc = qe_errf(QE_EINVAL, "tp: create_cpu_fds: fds is NULL");
  if (rc) return rc; /* which fds are ours is unknown: leave them */
  tp_cpu_t *c = NULL;
  rc = out ? tp__alloc(rank, size, &c) : qe_errf(QE_EINVAL, "tp: create_cpu_fds: out is NULL");
  if (rc) {
    tp__close_links(fds, rank, size);
    return rc;
  }
  rc = tp__adopt_links(c, fds);
  if (rc) {
    tp__cpu_destroy(&c->base);
    return rc;
  }
  *out = &c->base;
  return 0;
}

/* Rank 0: a listening socket at path, replacing a stale socket file left there. */
static int tp__listen(const char *path, int backlog, int *out) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct stat st;
  if (strlen(path) >= sizeof sa.sun_path)
    return qe_errf(QE_EINVAL, "tp: socket path too long: %s", path);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return qe_errf(QE_EINVAL, "tp: %s exists and is no socket", path);
    unlink(path);
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return qe_errf(QE_ECOMM, "tp: socket: %s", strerror(errno));
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, backlog) < 0) {
    int e = errno;
    close(fd);
    return qe_errf(QE_ECOMM, "tp: listen on %s: %s", path, strerror(e));
  }
  *out = fd;
  return 0;
}

/* Whether a wait that timed out at *note, before deadline, goes on: then says so in the log
 * (rank 0 with joined of size - 1 peers in, or a rank r > 0 waiting for rank 0; a warning, so
 * that it shows at the default level) and sets the next note. */
static int tp__waiting(int64_t *note, int64_t deadline, int rank, int size, int joined,
                       const char *path) {
  const int64_t now = tp__now_ms();
  if (now >= deadline) return 0;
  const long left = (long)((deadline - now + 999) / 1000);
  if (rank == 0)
    qe_log(QE_LOG_WARN, "tp: rank 0: %d of %d peers joined on %s; waiting (%ld s left)", joined,
           size - 1, path, left);
  else
    qe_log(QE_LOG_WARN, "tp: rank %d of %d: waiting for rank 0 to listen on %s (%ld s left)", rank,
           size, path, left);
  *note = now + TP_WAIT_NOTE_MS;
  return 1;
}

/* Rank 0: accepts peers on path until size-1 have joined or the deadline passes, saying so every
 * TP_WAIT_NOTE_MS. A peer with a bad handshake is refused and dropped; the rest of the group may
 * still join. */
static int tp__accept_peers(tp_cpu_t *c, int lfd, const char *path, int timeout_ms) {
  int64_t deadline = tp__now_ms() + timeout_ms, note = tp__now_ms() + TP_WAIT_NOTE_MS;
  int joined = 0;
  while (joined < c->base.size - 1) {
    int w = tp__wait(lfd, POLLIN, note < deadline ? note : deadline);
    if (w == 1 && tp__waiting(&note, deadline, 0, c->base.size, joined, path)) continue;
    if (w == 1)
      return qe_errf(QE_ECOMM, "tp: rank 0: %d of %d peers joined within %d ms", joined,
                     c->base.size - 1, timeout_ms);
    if (w) return w;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      return qe_errf(QE_ECOMM, "tp: rank 0: accept: %s", strerror(errno));
    }
    int64_t left = deadline - tp__now_ms();
    int hello_ms = left < TP_HELLO_TIMEOUT_MS ? (int)(left > 1 ? left : 1) : TP_HELLO_TIMEOUT_MS;
    int r;
    if (tp__greet_peer(c, fd, hello_ms, 0, &r) == 0) {
      tp__tune(fd);
      c->fds[r] = fd;
      joined++;
    } else {
      qe_log(QE_LOG_WARN, "%s", qe_errmsg());
      close(fd);
    }
  }
  return 0;
}

/* Rank r > 0 of size: connects to path, retrying while rank 0 is not listening yet (and saying
 * so every TP_WAIT_NOTE_MS). */
static int tp__connect(const char *path, int rank, int size, int64_t deadline, int *out) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int64_t note = tp__now_ms() + TP_WAIT_NOTE_MS;
  if (strlen(path) >= sizeof sa.sun_path)
    return qe_errf(QE_EINVAL, "tp: socket path too long: %s", path);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return qe_errf(QE_ECOMM, "tp: socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
      *out = fd;
      return 0;
    }
    int e = errno;
    close(fd);
    if (e != ENOENT && e != ECONNREFUSED && e != EAGAIN && e != EINTR)
      return qe_errf(QE_ECOMM, "tp: rank %d: connect to %s: %s", rank, path, strerror(e));
    if (tp__now_ms() >= deadline)
      return qe_errf(QE_ECOMM, "tp: rank %d: no rank 0 listening on %s in time: %s", rank, path,
                     strerror(e));
    if (tp__now_ms() >= note) tp__waiting(&note, deadline, rank, size, 0, path);
    struct timespec ts = {0, TP_CONNECT_RETRY_NS};
    nanosleep(&ts, NULL);
  }
}

static int tp__join(tp_cpu_t *c, const char *path, int timeout_ms) {
  int64_t deadline = tp__now_ms() + timeout_ms;
  int rc, fd = -1;
  if (c->base.rank == 0) {
    rc = tp__listen(path, c->base.size, &fd);
    if (rc) return rc;
    rc = tp__accept_peers(c, fd, path, timeout_ms);
    close(fd);
    unlink(path);
    return rc;
  }
  rc = tp__connect(path, c->base.rank, c->base.size, deadline, &fd);
  if (rc) return rc;
  c->fds[0] = fd;
  tp__tune(fd);
  int64_t left = deadline - tp__now_ms();
  return tp__greet_root(c, fd, left < 100 ? 100 : (int)left);
}

int tp_comm_create_cpu(const char *path, int rank, int size, int timeout_ms, tp_comm_t **out) {
  int rc = tp__check_args(rank, size);
  if (rc) return rc;
  if (!path || !*path || !out || timeout_ms <= 0)
    return qe_errf(QE_EINVAL, "tp: create_cpu: bad path, out or timeout (%d ms)", timeout_ms);
  tp_cpu_t *c;
  rc = tp__alloc(rank, size, &c);
  if (rc) return rc;
  if (size > 1) rc = tp__join(c, path, timeout_ms);
  if (rc) {
    tp__cpu_destroy(&c->base);
    return rc;
  }
  *out = &c->base;
  return 0;
}

int tp_comm_cpu_set_timeout(tp_comm_t *c, int timeout_ms) {
  if (!c || c->ops != &tp__cpu_ops || timeout_ms <= 0)
    return qe_errf(QE_EINVAL, "tp: set_timeout: not a cpu communicator or %d ms", timeout_ms);
  ((tp_cpu_t *)c)->timeout_ms = timeout_ms;
  return 0;
}
