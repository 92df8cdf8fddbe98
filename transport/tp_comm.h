/* tp_comm: the collective interface of a tensor-parallel group (all-reduce, broadcast,
 * all-gather), behind which sit the backends: single-rank (no-op), CPU sockets (ranks in
 * separate processes joined over Unix stream sockets, star through rank 0, deterministic
 * summation order rank 0,1,...,T-1), and NCCL (tp_comm_nccl.c, CUDA builds with NCCL). One
 * tp_comm_t per rank; calls are collective (every rank calls the same sequence) and not
 * thread-safe. */
#ifndef QE_TP_COMM_H
#define QE_TP_COMM_H

#include <stddef.h>

typedef struct tp_comm tp_comm_t;

typedef struct tp_comm_ops {
  const char *name;
  /* In place: buf[i] = sum over ranks of buf[i], identical on every rank afterwards. */
  int (*allreduce_sum_f32)(tp_comm_t *c, float *buf, size_t n);
  /* buf (bytes) of root copied to every rank. */
  int (*broadcast)(tp_comm_t *c, void *buf, size_t bytes, int root);
  /* Each rank contributes `bytes` at send; recv gets [size][bytes] in rank order. */
  int (*allgather)(tp_comm_t *c, const void *send, void *recv, size_t bytes);
  void (*destroy)(tp_comm_t *c);
  /* Optional: whether the collectives are only queued on a device stream, so that a stream
   * capture (CUDA graph) may record them; NULL means never. */
  int (*capturable)(const tp_comm_t *c);
} tp_comm_ops_t;

struct tp_comm {
  const tp_comm_ops_t *ops;
  int rank;
  int size;
  /* Optional: a communicator of the same group over DEVICE memory (NCCL), which the forward
   * pass uses for activations held on a GPU instead of staging them through this one.
   * Borrowed (the creator destroys it after this one); NULL when there is none. */
  tp_comm_t *dev;
};

static inline int tp_allreduce_sum(tp_comm_t *c, float *buf, size_t n) {
  return c->size == 1 ? 0 : c->ops->allreduce_sum_f32(c, buf, n);
}
static inline int tp_broadcast(tp_comm_t *c, void *buf, size_t bytes, int root) {
  return c->size == 1 ? 0 : c->ops->broadcast(c, buf, bytes, root);
}
/* For size 1 the caller's recv must equal a copy of send; the backend does it. */
static inline int tp_allgather(tp_comm_t *c, const void *send, void *recv, size_t bytes) {
  return c->ops->allgather(c, send, recv, bytes);
}
/* Whether a recorded step (CUDA graph) may contain this group's collectives: always for one
 * rank, else when the backend says so (NCCL queued on a stream, not timed). */
static inline int tp_capturable(const tp_comm_t *c) {
  return c->size == 1 || (c->ops->capturable && c->ops->capturable(c));
}
void tp_comm_destroy(tp_comm_t *c); /* NULL-safe */

/* Single-rank communicator (rank 0 of 1). */
int tp_comm_create_single(tp_comm_t **out);

/* CPU socket backend. Rank 0 listens on the Unix socket `path` and accepts size-1 peers;
 * rank r > 0 connects (retrying until timeout_ms). Ranks announce themselves in a handshake
 * (magic, version, rank, size) so a wrong peer is refused with QE_ECOMM. */
int tp_comm_create_cpu(const char *path, int rank, int size, int timeout_ms, tp_comm_t **out);

/* Same over already-connected stream sockets: rank 0 passes fds[1..size-1] (one per peer,
 * indexed by peer rank), rank r > 0 passes fds[0] (its link to rank 0). Takes ownership. */
int tp_comm_create_cpu_fds(const int *fds, int rank, int size, tp_comm_t **out);

/* CPU socket backend details (additions to the interface above):
 * - Every receive and send waits at most the I/O timeout for progress (default 60 s, or
 *   QEVICT_TP_TIMEOUT_MS in the environment at creation); a dead, silent or desynchronised
 *   peer gives QE_ECOMM with a detail line, never a hang.
 * - After a QE_ECOMM the communicator is broken: this rank shuts its sockets (so the other
 *   ranks fail promptly too) and every later call returns QE_ECOMM. Destroy it.
 * - tp_comm_create_cpu_fds takes ownership of the fds even when it fails (except when fds is
 *   NULL or rank/size are invalid: then it cannot tell which are its and touches none).
 * - Arguments that are wrong on this rank alone (a root out of range, a size overflow)
 *   return QE_EINVAL before any communication and leave the communicator usable. */
#define TP_COMM_DEFAULT_TIMEOUT_MS 60000

/* Sets the I/O timeout (milliseconds, > 0) of a CPU socket communicator. Returns 0, or
 * QE_EINVAL for a bad value or another backend. Not thread-safe (like the collectives). */
int tp_comm_cpu_set_timeout(tp_comm_t *c, int timeout_ms);

#ifdef QE_HAVE_NCCL
/* NCCL backend (defined in CUDA builds where nccl.h and libnccl were found; users of
 * transport_nccl_dep get QE_HAVE_NCCL). Unlike the CPU backends, the buffers of
 * allreduce_sum_f32, broadcast and allgather are DEVICE memory of `device`. A collective is
 * synchronous by default (waits for the device's queued work, returns with the result in
 * place); see tp_comm_nccl_set_stream. An NCCL failure is QE_ECOMM and breaks the
 * communicator (later calls fail; destroy aborts it); a CUDA failure is QE_EBACKEND. */
#define TP_NCCL_ID_BYTES 128

/* Writes a fresh ncclUniqueId (TP_NCCL_ID_BYTES bytes) to out128: rank 0 makes it and sends it
 * to the other ranks over the group's CPU link (tp_broadcast on the CPU communicator: `generate`
 * and the workers do so). Returns 0 or QE_ECOMM. */
int tp_comm_nccl_unique_id(void *out128);

/* Joins the group named by unique_id as rank of size on GPU `device` (collective: blocks until
 * every rank has joined). Destroy it only after every CUDA graph that recorded its collectives
 * (NCCL's destruction waits for them). Sets NCCL_NVLS_ENABLE=0 in the environment unless already
 * set. *out owned by caller: tp_comm_destroy(). Returns 0, QE_EINVAL, QE_ECOMM or QE_EBACKEND. */
int tp_comm_create_nccl(const void *unique_id, int rank, int size, int device, tp_comm_t **out);

/* Queues later collectives on cuda_stream (a cudaStream_t of the same device, e.g.
 * kern_cuda_stream) and makes them asynchronous: ordered with that stream's work, complete
 * when the stream reaches them. NULL restores the synchronous default. QE_EINVAL for another
 * backend. */
int tp_comm_nccl_set_stream(tp_comm_t *c, void *cuda_stream);

/* Timing of the all-reduces (for benchmarks): with on = 1, each later all-reduce is queued
 * between two CUDA events on its stream, and tp_comm_nccl_time sums their elapsed times (what
 * the collective took on the stream, waiting for the slowest rank included). Every 4,096 calls
 * the events are drained (waits for the device). on = 0 drains and stops. QE_EINVAL for another
 * backend, QE_EBACKEND for a CUDA failure. */
int tp_comm_nccl_timing(tp_comm_t *c, int on);
/* Waits for the timed all-reduces and returns their total milliseconds and count so far. */
int tp_comm_nccl_time(tp_comm_t *c, double *ms, long *calls);
#endif

#endif
