/* model_rig: test scaffolding around a loaded model (see model_rig.h). */
#include "model_rig.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

int rig_open(rig_t *r, const char *path, int rank, int size, tp_comm_t *c, int max_batch) {
  return rig_open_ex(r, path, rank, size, c, max_batch, KERN_WEIGHT_F32);
}

int rig_open_ex(rig_t *r, const char *path, int rank, int size, tp_comm_t *c, int max_batch,
                int weights) {
  memset(r, 0, sizeof *r);
  r->c = c;
  int rc = kern_cpu_create_ex(1, weights, &r->be);
  model_load_opts_t o = {r->be, rank, size, max_batch, 0};
  if (!rc) rc = model_load(path, &o, &r->m);
  if (!rc) {
    kv_geom_t g = model_kv_geom(r->m, 4);
    rc = kv_full_create(r->be, &g, &r->kv);
  }
  return rc;
}

void rig_close(rig_t *r) {
  kv_cache_destroy(r->kv);
  model_destroy(r->m);
  kern_destroy(r->be);
}

int run_prefill(rig_t *r, const int32_t *tokens, int n, float *out) {
  int32_t *pos = malloc(sizeof(int32_t) * n), *seq = calloc((size_t)n, sizeof(int32_t));
  uint8_t *want = malloc((size_t)n);
  for (int i = 0; i < n; i++) pos[i] = i, want[i] = 1;
  int rc = r->kv->ops->seq_open(r->kv, 0, n);
  model_batch_t b = {n, tokens, pos, seq, want};
  if (!rc) rc = model_forward(r->m, r->kv, r->c, &b, out);
  r->kv->ops->seq_close(r->kv, 0);
  free(pos);
  free(seq);
  free(want);
  return rc;
}

typedef struct {
  const char *path;
  int size, n, weights;
  const int32_t *tokens;
} tp_job_t;

static void tp_child(void *ud, int rank, int fd) {
  const tp_job_t *j = ud;
  tp_comm_t *c = NULL;
  rig_t rg;
  int rc = tp_comm_create_cpu_fds(&fd, rank, j->size, &c);
  if (!rc) rc = rig_open_ex(&rg, j->path, rank, j->size, c, j->n, j->weights);
  if (!rc) rc = run_prefill(&rg, j->tokens, j->n, NULL);
  _exit(rc ? 1 : 0);
}

double tp_prefill_err(const char *path, int size, const int32_t *tokens, int n, const float *ref,
                      int V) {
  return tp_prefill_err_ex(path, size, tokens, n, ref, V, KERN_WEIGHT_F32);
}

double tp_prefill_err_ex(const char *path, int size, const int32_t *tokens, int n, const float *ref,
                         int V, int weights) {
  int fds[16] = {-1};
  pid_t pids[16] = {0};
  tp_job_t job = {path, size, n, weights, tokens};
  if (tu_fork_ranks(size, tp_child, &job, fds, pids)) return INFINITY;
  tp_comm_t *c = NULL;
  rig_t rg;
  float *lg = malloc(sizeof(float) * (size_t)n * V);
  int rc = tp_comm_create_cpu_fds(fds, 0, size, &c);
  if (!rc) rc = rig_open_ex(&rg, path, 0, size, c, n, weights);
  if (!rc) rc = run_prefill(&rg, tokens, n, lg);
  double err = rc ? INFINITY : tu_rel_err(lg, ref, (size_t)n * V);
  if (!tu_wait_ok(pids + 1, size - 1)) err = INFINITY;
  rig_close(&rg);
  tp_comm_destroy(c);
  free(lg);
  return err;
}
