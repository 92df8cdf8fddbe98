/* tp_comm_nccl: the NCCL collective backend of a tensor-parallel group (one rank per GPU,
 * any number of processes or threads). Unlike the CPU backends, every buffer passed to the
 * collectives is DEVICE memory of the communicator's GPU. By default a collective is
 * synchronous: it waits for all work already queued on the device, runs on the
 * communicator's own stream and returns when the result is in place. After
 * tp_comm_nccl_set_stream(c, s) the collectives are only queued on stream s (ordered with the
 * compute kernels queued there, e.g. kern_cuda_stream) and return at once. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "tp_comm.h"

typedef struct {
  tp_comm_t base;
  ncclComm_t comm;
  cudaStream_t own;    /* the communicator's stream */
  cudaStream_t stream; /* the caller's stream, or NULL: synchronous on `own` */
  int device;
  int broken; /* an NCCL call failed: every later call returns QE_ECOMM */
  /* tp_comm_nccl_timing: an event pair around each all-reduce, summed when drained */
  int timing, n_ev;
  cudaEvent_t *ev; /* [2 * TP_NCCL_EVENTS]: start, stop of pair i at 2i, 2i + 1 */
  double ms;
  long calls;
} tp_nccl_t;

#define TP_NCCL_EVENTS 4096

static int nccl_cuda_at(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return 0;
  return qe_errf(QE_EBACKEND, "nccl: %s:%d: %s: %s", file, line, what, cudaGetErrorString(e));
}
#define NCCL_CUDA(call) nccl_cuda_at((call), #call, __FILE__, __LINE__)

static int nccl_at(tp_nccl_t *n, ncclResult_t r, const char *what, const char *file, int line) {
  if (r == ncclSuccess) return 0;
  const char *last = n && n->comm ? ncclGetLastError(n->comm) : ncclGetLastError(NULL);
  if (n) n->broken = 1;
  return qe_errf(QE_ECOMM, "nccl: %s:%d: %s: %s%s%s", file, line, what, ncclGetErrorString(r),
                 last && *last ? ": " : "", last ? last : "");
}
#define NCCL_CALL(n, call) nccl_at((n), (call), #call, __FILE__, __LINE__)

/* Selects the device and, in synchronous mode, waits for the work queued before the call. */
static int nccl_begin(tp_nccl_t *n, cudaStream_t *s) {
  if (n->broken) return qe_errf(QE_ECOMM, "nccl: the communicator failed earlier");
  int rc = NCCL_CUDA(cudaSetDevice(n->device));
  if (!rc && !n->stream) rc = NCCL_CUDA(cudaDeviceSynchronize());
  *s = n->stream ? n->stream : n->own;
  return rc;
}

/* In synchronous mode, waits for the collective. */
static int nccl_end(tp_nccl_t *n, int rc) {
  if (rc || n->stream) return rc;
  return NCCL_CUDA(cudaStreamSynchronize(n->own));
}

/* Waits for the recorded event pairs and adds their times to the totals. */
static int nccl_drain(tp_nccl_t *n) {
  int rc = n->n_ev ? NCCL_CUDA(cudaEventSynchronize(n->ev[2 * n->n_ev - 1])) : 0;
  for (int i = 0; !rc && i < n->n_ev; i++) {
    float ms = 0;
    rc = NCCL_CUDA(cudaEventElapsedTime(&ms, n->ev[2 * i], n->ev[2 * i + 1]));
    n->ms += ms;
  }
  n->calls += rc ? 0 : n->n_ev;
  n->n_ev = 0;
  return rc;
}

/* The all-reduce, between a timing event pair when timing is on. */
static int nccl_allreduce_timed(tp_nccl_t *n, float *buf, size_t count, cudaStream_t s) {
  int rc = n->n_ev == TP_NCCL_EVENTS ? nccl_drain(n) : 0;
  if (!rc) rc = NCCL_CUDA(cudaEventRecord(n->ev[2 * n->n_ev], s));
  if (!rc) rc = NCCL_CALL(n, ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, n->comm, s));
  if (!rc) rc = NCCL_CUDA(cudaEventRecord(n->ev[2 * n->n_ev + 1], s));
  n->n_ev += rc ? 0 : 1;
  return rc;
}

static int nccl_allreduce(tp_comm_t *c, float *buf, size_t count) {
  tp_nccl_t *n = (tp_nccl_t *)c;
  cudaStream_t s = NULL;
  int rc = nccl_begin(n, &s);
  if (!rc && count && n->timing) rc = nccl_allreduce_timed(n, buf, count, s);
  if (!rc && count && !n->timing)
    rc = NCCL_CALL(n, ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, n->comm, s));
  return nccl_end(n, rc);
}

static int nccl_broadcast(tp_comm_t *c, void *buf, size_t bytes, int root) {
  tp_nccl_t *n = (tp_nccl_t *)c;
  if (root < 0 || root >= c->size)
    return qe_errf(QE_EINVAL, "nccl: broadcast root %d of a size-%d group", root, c->size);
  cudaStream_t s = NULL;
  int rc = nccl_begin(n, &s);
  if (!rc && bytes) rc = NCCL_CALL(n, ncclBroadcast(buf, buf, bytes, ncclInt8, root, n->comm, s));
  return nccl_end(n, rc);
}

static int nccl_allgather(tp_comm_t *c, const void *send, void *recv, size_t bytes) {
  tp_nccl_t *n = (tp_nccl_t *)c;
  cudaStream_t s = NULL;
  int rc = nccl_begin(n, &s);
  if (!rc && bytes) rc = NCCL_CALL(n, ncclAllGather(send, recv, bytes, ncclInt8, n->comm, s));
  return nccl_end(n, rc);
}

static void nccl_destroy(tp_comm_t *c) {
  tp_nccl_t *n = (tp_nccl_t *)c;
  cudaSetDevice(n->device);
  if (n->comm) {
    if (n->broken)
      ncclCommAbort(n->comm);
    else
      ncclCommDestroy(n->comm);
  }
  if (n->own) cudaStreamDestroy(n->own);
  for (int i = 0; n->ev && i < 2 * TP_NCCL_EVENTS; i++)
    if (n->ev[i]) cudaEventDestroy(n->ev[i]);
  free(n->ev);
  free(n);
}

/* Queued on the caller's stream and not between timing events (whose draining waits). */
static int nccl_capturable(const tp_comm_t *c) {
  const tp_nccl_t *n = (const tp_nccl_t *)c;
  return n->stream && !n->timing && !n->broken;
}

static const tp_comm_ops_t nccl_ops = {
    .name = "nccl",
    .allreduce_sum_f32 = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .destroy = nccl_destroy,
    .capturable = nccl_capturable,
};

int tp_comm_nccl_unique_id(void *out128) {
  ncclUniqueId id;
  _Static_assert(sizeof id == TP_NCCL_ID_BYTES, "ncclUniqueId is not TP_NCCL_ID_BYTES");
  if (!out128) return qe_errf(QE_EINVAL, "nccl: unique_id: out is NULL");
  int rc = NCCL_CALL(NULL, ncclGetUniqueId(&id));
  if (!rc) memcpy(out128, &id, sizeof id);
  return rc;
}

int tp_comm_create_nccl(const void *unique_id, int rank, int size, int device, tp_comm_t **out) {
  if (!unique_id || !out || size < 1 || rank < 0 || rank >= size || device < 0)
    return qe_errf(QE_EINVAL, "nccl: bad arguments (rank %d of %d, device %d)", rank, size, device);
  tp_nccl_t *n = calloc(1, sizeof *n);
  if (!n) return qe_errf(QE_ENOMEM, "nccl: out of memory");
  ncclUniqueId id;
  memcpy(&id, unique_id, sizeof id);
  n->base = (tp_comm_t){.ops = &nccl_ops, .rank = rank, .size = size};
  n->device = device;
  setenv("NCCL_NVLS_ENABLE", "0", 0); /* NVLink SHARP multicast stays off unless asked for */
  int rc = NCCL_CUDA(cudaSetDevice(device));
  if (!rc) rc = NCCL_CUDA(cudaStreamCreateWithFlags(&n->own, cudaStreamNonBlocking));
  if (!rc) rc = NCCL_CALL(n, ncclCommInitRank(&n->comm, size, id, rank));
  if (rc) {
    nccl_destroy(&n->base);
    return rc;
  }
  *out = &n->base;
  return 0;
}

int tp_comm_nccl_set_stream(tp_comm_t *c, void *cuda_stream) {
  if (!c || c->ops != &nccl_ops) return qe_errf(QE_EINVAL, "nccl: not an NCCL communicator");
  ((tp_nccl_t *)c)->stream = (cudaStream_t)cuda_stream;
  return 0;
}

int tp_comm_nccl_timing(tp_comm_t *c, int on) {
  if (!c || c->ops != &nccl_ops) return qe_errf(QE_EINVAL, "nccl: not an NCCL communicator");
  tp_nccl_t *n = (tp_nccl_t *)c;
  int rc = NCCL_CUDA(cudaSetDevice(n->device));
  if (!rc && on && !n->ev && !(n->ev = calloc(2 * TP_NCCL_EVENTS, sizeof *n->ev)))
    rc = qe_errf(QE_ENOMEM, "nccl: out of memory");
  for (int i = 0; !rc && on && i < 2 * TP_NCCL_EVENTS; i++)
    if (!n->ev[i]) rc = NCCL_CUDA(cudaEventCreate(&n->ev[i]));
  if (!rc && !on) rc = nccl_drain(n);
  if (!rc) n->timing = on;
  return rc;
}

int tp_comm_nccl_time(tp_comm_t *c, double *ms, long *calls) {
  if (!c || c->ops != &nccl_ops) return qe_errf(QE_EINVAL, "nccl: not an NCCL communicator");
  tp_nccl_t *n = (tp_nccl_t *)c;
  int rc = NCCL_CUDA(cudaSetDevice(n->device));
  if (!rc) rc = nccl_drain(n);
  *ms = n->ms, *calls = n->calls;
  return rc;
}
