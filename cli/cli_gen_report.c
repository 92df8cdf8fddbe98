/* cli_gen_report: per-rank reports, top-2 logits and forced ids of `qevict generate` (see
 * cli_gen_report.h). */
#include "cli_gen_report.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
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
  char keep[512]; /* the run's failure, if any: the report's own misses must not erase it */
  snprintf(keep, sizeof keep, "%s", qe_errmsg());
  *r = (gen_rank_report_t){
      c->rank, -1, (int64_t)model_weight_bytes(m), -1, -1, -1, -1, -1, -1, -1, 0, -1, {0}};
  report_gpu(be, kv, r);
  cli_policy_mem(kv, &r->mem);
#ifdef QE_HAVE_NCCL
  long calls = 0;
  if (nc && !tp_comm_nccl_time(nc, &r->allreduce_ms, &calls)) r->allreduce_calls = calls;
  qe_errclear();
#else
  (void)nc;
#endif
  if (*keep) (void)qe_errf(QE_EINVAL, "%s", keep); /* (qe_errf keeps only the message here) */
  return 0;
}

static void json_i64(FILE *f, const char *key, int64_t v, int comma) {
  if (v < 0)
    fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
  else
    fprintf(f, "\"%s\":%lld%s", key, (long long)v, comma ? "," : "");
}

void gen_report_json(const gen_rank_report_t *all, int n, const char *policy, FILE *f) {
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
    fprintf(f, "\"allreduce_ms\":%.3f,\"memory\":", r->allreduce_calls < 0 ? 0.0 : r->allreduce_ms);
    cli_policy_mem_json(policy, -1, &r->mem, f);
    fputc('}', f);
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

/* A scanner over an ids file: the current token is t[0..k) (k 0 at the end). */
typedef struct {
  const char *path, *s, *t;
  size_t len, pos, k;
} ids_lex_t;

static int is_sep(char c) { return c && strchr("[],", c); }

/* To the next token after whitespace: '[', ']' or ',' alone, or a run of anything else. */
static void lex(ids_lex_t *x) {
  while (x->pos < x->len && isspace((unsigned char)x->s[x->pos])) x->pos++;
  size_t b = x->pos;
  x->t = x->s + b;
  if (b < x->len && is_sep(x->s[b]))
    x->pos++;
  else
    while (x->pos < x->len && !isspace((unsigned char)x->s[x->pos]) && !is_sep(x->s[x->pos]))
      x->pos++;
  x->k = x->pos - b;
}

static int lex_is(const ids_lex_t *x, char c) { return x->k == 1 && x->t[0] == c; }

/* The token printably (at most 24 characters, '?' for control bytes) into out[32]. */
static const char *shown(const char *tok, size_t n, char *out) {
  size_t k = 0;
  for (; k < n && k < 24; k++) out[k] = (unsigned char)tok[k] < 32 ? '?' : tok[k];
  snprintf(out + k, 8, "%s", n > 24 ? "..." : "");
  return out;
}

/* QE_EINVAL: `want` was expected at the current token, which is named. */
static int bad_token(const ids_lex_t *x, const char *want) {
  char b[32], got[40];
  snprintf(got, sizeof got, "'%s'", shown(x->t, x->k, b));
  return qe_errf(QE_EINVAL,
                 "ids file '%s': expected %s, got %s (the ids are a JSON array of integers or "
                 "integers separated by whitespace)",
                 x->path, want, x->k ? got : "the end of the file");
}

/* The current token as an id (decimal digits, at most INT32_MAX) appended to *ids. */
static int take_id(const ids_lex_t *x, int32_t **ids, int *n, int *cap) {
  long v = 0;
  if (x->k && x->t[0] == '-') return bad_token(x, "a non-negative id");
  if (!x->k) return bad_token(x, "an id");
  for (size_t i = 0; i < x->k; i++) {
    if (!isdigit((unsigned char)x->t[i])) return bad_token(x, "an id");
    if ((v = v * 10 + (x->t[i] - '0')) > INT32_MAX) return bad_token(x, "an id up to 2147483647");
  }
  return push_id(ids, n, cap, v);
}

/* After '[': "a, b, ...]" and nothing more. */
static int parse_json(ids_lex_t *x, int32_t **ids, int *n, int *cap) {
  lex(x);
  int rc = 0, end = lex_is(x, ']');
  while (!rc && !end) {
    rc = take_id(x, ids, n, cap);
    lex(x);
    end = lex_is(x, ']');
    if (!rc && !end && !lex_is(x, ',')) rc = bad_token(x, "',' or ']'");
    if (!rc && !end) lex(x);
  }
  if (!rc) lex(x);
  return rc ? rc : x->k ? bad_token(x, "nothing after ']'") : 0;
}

/* "[...]" or whitespace-separated ids. */
static int parse_ids(ids_lex_t *x, int32_t **ids, int *n) {
  int cap = 0, rc = 0;
  lex(x);
  if (lex_is(x, '[')) return parse_json(x, ids, n, &cap);
  for (; !rc && x->k; lex(x)) rc = take_id(x, ids, n, &cap);
  return rc;
}

int gen_read_ids(const char *path, int32_t **ids, int *n) {
  char *buf = NULL;
  size_t len = 0;
  *ids = NULL, *n = 0;
  int rc = cli_read_text_file("ids file", path, (size_t)1 << 30, &buf);
  if (rc) return rc;
  len = strlen(buf);
  ids_lex_t x = {path, buf, NULL, len, 0, 0};
  if (!rc) rc = parse_ids(&x, ids, n);
  free(buf);
  if (!rc && !*n) rc = qe_errf(QE_EINVAL, "ids file '%s' holds no ids", path);
  if (rc) free(*ids), *ids = NULL, *n = 0;
  return rc;
}
