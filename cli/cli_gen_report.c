/* cli_gen_report: per-rank reports, top-2 logits and forced ids of `qevict generate` (see
 * cli_gen_report.h). */
#include "cli_gen_report.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#ifdef QE_HAVE_CUDA
#include "cuda/kern_cuda.h"
#endif
#ifdef QE_HAVE_KV_GPU
#include "kv_gpu.h"
#endif

/* GPU memory in use on the rank's device, and the KV pool's units. */
static void report_gpu(kern_backend_t *be, kv_cache_t *kv, gen_rank_report_t *r) {
#ifdef QE_HAVE_CUDA
  size_t free_b = 0, total_b = 0;
  if (!be->ops->host_memory && !kern_cuda_mem_info(be, &free_b, &total_b)) {
    r->device = kern_cuda_device(be);
    r->gpu_used = (int64_t)(total_b - free_b), r->gpu_total = (int64_t)total_b;
  }
#endif
#ifdef QE_HAVE_KV_GPU
  kv_gpu_pool_t p;
  if (!be->ops->host_memory && !kv_gpu_pool_usage(kv, &p)) {
    r->pool_unit_bytes = (int64_t)p.unit_bytes, r->pool_units = p.units_total;
    r->pool_in_use = p.units_in_use, r->pool_peak = p.units_peak;
    r->pool_arena_bytes = (int64_t)p.arena_bytes;
  }
  qe_errclear();
#else
  (void)kv;
#endif
}

int gen_report_fill(kern_backend_t *be, const model_t *m, kv_cache_t *kv, tp_comm_t *c,
                    tp_comm_t *nc, gen_rank_report_t *r) {
  *r = (gen_rank_report_t){c->rank, -1, (int64_t)model_weight_bytes(m), -1, -1, -1, -1, -1, -1, -1,
                           0,       -1};
  report_gpu(be, kv, r);
#ifdef QE_HAVE_NCCL
  long calls = 0;
  if (nc && !tp_comm_nccl_time(nc, &r->allreduce_ms, &calls)) r->allreduce_calls = calls;
  qe_errclear();
#else
  (void)nc;
#endif
  return 0;
}

static void json_i64(FILE *f, const char *key, int64_t v, int comma) {
  if (v < 0)
    fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
  else
    fprintf(f, "\"%s\":%lld%s", key, (long long)v, comma ? "," : "");
}

void gen_report_json(const gen_rank_report_t *all, int n, FILE *f) {
  fputc('[', f);
  for (int i = 0; i < n; i++) {
    const gen_rank_report_t *r = &all[i];
    fprintf(f, "%s{\"rank\":%d,", i ? "," : "", r->rank);
    json_i64(f, "device", r->device, 1);
    json_i64(f, "weight_bytes", r->weight_bytes, 1);
    json_i64(f, "gpu_used_bytes", r->gpu_used, 1);
    json_i64(f, "gpu_total_bytes", r->gpu_total, 1);
    json_i64(f, "pool_unit_bytes", r->pool_unit_bytes, 1);
    json_i64(f, "pool_units", r->pool_units, 1);
    json_i64(f, "pool_units_in_use", r->pool_in_use, 1);
    json_i64(f, "pool_units_peak", r->pool_peak, 1);
    json_i64(f, "pool_arena_bytes", r->pool_arena_bytes, 1);
    json_i64(f, "allreduce_calls", r->allreduce_calls, 1);
    fprintf(f, "\"allreduce_ms\":%.3f}", r->allreduce_calls < 0 ? 0.0 : r->allreduce_ms);
  }
  fputc(']', f);
}

void gen_top2_push(gen_top2_t *t, const float *logits, int n_vocab) {
  if (t->n >= t->cap || n_vocab < 2) return;
  int a = logits[1] > logits[0], b = 1 - a;
  for (int i = 2; i < n_vocab; i++) {
    if (logits[i] > logits[a])
      b = a, a = i;
    else if (logits[i] > logits[b])
      b = i;
  }
  float *v = t->v + (size_t)t->n++ * 4;
  v[0] = (float)a, v[1] = logits[a], v[2] = (float)b, v[3] = logits[b];
}

void gen_top2_json(const gen_top2_t *t, FILE *f) {
  fputc('[', f);
  for (int i = 0; i < t->n; i++) {
    const float *v = t->v + (size_t)i * 4;
    fprintf(f, "%s[%d,%.6g,%d,%.6g]", i ? "," : "", (int)v[0], v[1], (int)v[2], v[3]);
  }
  fputc(']', f);
}

/* Appends id to *ids (grown as needed). */
static int push_id(int32_t **ids, int *n, int *cap, long v) {
  if (*n == *cap) {
    int32_t *g = realloc(*ids, sizeof(int32_t) * (size_t)(*cap = *cap ? 2 * *cap : 1024));
    if (!g) return qe_errf(QE_ENOMEM, "out of memory");
    *ids = g;
  }
  (*ids)[(*n)++] = (int32_t)v;
  return 0;
}

int gen_read_ids(const char *path, int32_t **ids, int *n) {
  FILE *f = fopen(path, "r");
  if (!f) return qe_errf(QE_EIO, "cannot open the ids file '%s'", path);
  int cap = 0, rc = 0, c;
  *ids = NULL, *n = 0;
  while (!rc && (c = fgetc(f)) != EOF) { /* a number is read whole: any '-' is a sign */
    long v = 0;
    if (c == '-') rc = qe_errf(QE_EINVAL, "'%s': a negative id", path);
    if (!rc && isdigit(c))
      rc = ungetc(c, f) != EOF && fscanf(f, "%ld", &v) == 1 && v <= INT32_MAX
               ? push_id(ids, n, &cap, v)
               : qe_errf(QE_EINVAL, "'%s': a bad id", path);
  }
  fclose(f);
  if (!rc && !*n) rc = qe_errf(QE_EINVAL, "'%s' holds no ids", path);
  if (rc) free(*ids), *ids = NULL, *n = 0;
  return rc;
}
