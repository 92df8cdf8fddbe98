/* kern_cuda_graph: the CUDA backend's recorded steps (kern.h's graph ops): stream capture of the
 * backend's stream into a CUDA graph, instantiated once and launched on later steps; pinned host
 * staging and asynchronous uploads for the inputs a replay reads; the scratch epoch that tells a
 * caller its graphs read memory that has moved since. */
#include <stdlib.h>

#include "kern_cuda_internal.h"

struct kern_graph {
  cudaGraphExec_t exec;
};

int kcu_graph_begin(kern_backend_t *be) {
  kcu_t *c = KCU(be);
  int rc = kcu_enter(c);
  if (rc) return rc;
  if (c->capturing) return qe_errf(QE_EINVAL, "cuda: graph_begin while recording");
  /* thread-local mode: other threads' CUDA calls (another backend) do not break the capture */
  rc = KCU_CUDA(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
  c->capturing = !rc, c->capture_bad = 0;
  c->xb_src = NULL; /* no recorded matmul may rely on bf16 activations converted outside it */
  return rc;
}

/* Instantiates graph into *out (graph destroyed). */
static int kcu_graph_make(kcu_t *c, cudaGraph_t graph, kern_graph_t **out) {
  kern_graph_t *g = (kern_graph_t *)calloc(1, sizeof *g);
  int rc = g ? KCU_CUDA(c, cudaGraphInstantiate(&g->exec, graph, 0))
             : qe_errf(QE_ENOMEM, "cuda: out of memory for a graph");
  cudaGraphDestroy(graph);
  if (rc) free(g);
  *out = rc ? NULL : g;
  return rc;
}

int kcu_graph_end(kern_backend_t *be, kern_graph_t **out) {
  kcu_t *c = KCU(be);
  cudaGraph_t graph = NULL;
  *out = NULL;
  if (!c->capturing) return qe_errf(QE_EINVAL, "cuda: graph_end without graph_begin");
  c->capturing = 0;
  c->xb_src = NULL;
  int rc = KCU_CUDA(c, cudaStreamEndCapture(c->stream, &graph));
  if (!rc && (c->capture_bad || c->err)) {
    cudaGraphDestroy(graph);
    return c->err ? c->err
                  : qe_errf(QE_EUNSUPPORTED, "cuda: an op could not be recorded (scratch grew)");
  }
  return rc ? rc : kcu_graph_make(c, graph, out);
}

int kcu_graph_launch(kern_backend_t *be, kern_graph_t *g) {
  kcu_t *c = KCU(be);
  int rc = kcu_enter(c);
  c->xb_src = NULL; /* the replay rewrote the bf16 activations */
  return rc ? rc : KCU_CUDA(c, cudaGraphLaunch(g->exec, c->stream));
}

void kcu_graph_free(kern_backend_t *be, kern_graph_t *g) {
  if (!g) return;
  kcu_t *c = KCU(be);
  KCU_CUDA(c, cudaSetDevice(c->device));
  KCU_CUDA(c, cudaGraphExecDestroy(g->exec));
  free(g);
}

unsigned long kcu_scratch_epoch(kern_backend_t *be) { return KCU(be)->epoch; }

void *kcu_host_alloc(kern_backend_t *be, size_t bytes) {
  kcu_t *c = KCU(be);
  void *p = NULL;
  if (cudaSetDevice(c->device) != cudaSuccess || cudaMallocHost(&p, bytes ? bytes : 64)) {
    (void)cudaGetLastError(); /* the caller's NULL, not sticky */
    return NULL;
  }
  return p;
}

void kcu_host_free(kern_backend_t *be, void *p) {
  (void)be;
  if (p) cudaFreeHost(p);
}

int kcu_upload_async(kern_backend_t *be, void *dst, const void *src, size_t bytes) {
  kcu_t *c = KCU(be);
  int rc = kcu_enter(c);
  if (rc || !bytes) return rc;
  return KCU_CUDA(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
}
