/* tp_comm: the backend-independent part of the tensor-parallel collective interface —
 * tp_comm_destroy, and the single-rank backend (rank 0 of 1), where all-reduce and broadcast
 * are no-ops and all-gather is a copy of send into recv. The CPU socket backend lives in
 * tp_comm_cpu.c. */
#include "tp_comm.h"

#include <stdlib.h>
#include <string.h>

#include "qe_status.h"

static int tp__single_allreduce(tp_comm_t *c, float *buf, size_t n) { return 0; }

static int tp__single_broadcast(tp_comm_t *c, void *buf, size_t bytes, int root) {
  if (root != 0) return qe_errf(QE_EINVAL, "tp: broadcast root %d of a size-1 group", root);
  return 0;
}

static int tp__single_allgather(tp_comm_t *c, const void *send, void *recv, size_t bytes) {
  if (bytes && send != recv) memmove(recv, send, bytes);
  return 0;
}

static void tp__single_destroy(tp_comm_t *c) { free(c); }

static const tp_comm_ops_t tp__single_ops = {
    .name = "single",
    .allreduce_sum_f32 = tp__single_allreduce,
    .broadcast = tp__single_broadcast,
    .allgather = tp__single_allgather,
    .destroy = tp__single_destroy,
};

int tp_comm_create_single(tp_comm_t **out) {
  if (!out) return qe_errf(QE_EINVAL, "tp: create_single: out is NULL");
  tp_comm_t *c = calloc(1, sizeof *c);
  if (!c) return qe_errf(QE_ENOMEM, "tp: create_single: out of memory");
  c->ops = &tp__single_ops;
  c->rank = 0;
  c->size = 1;
  *out = c;
  return 0;
}

void tp_comm_destroy(tp_comm_t *c) {
  if (c) c->ops->destroy(c);
}
