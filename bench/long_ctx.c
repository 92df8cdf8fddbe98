/* long_ctx: how many long sequences fit on one GPU and how fast they decode, FullKV against a
 * tiered policy at a budget (issue 5, "long context"). A random-weight model of a named shape
 * (model_create_random) on the CUDA backend; the cache is sized from the GPU memory left after
 * the weights and a workspace reserve, for as many slots of ctx + new tokens as it can hold
 * (the tiered cache at its budget, FullKV at full size). Each slot is filled with ctx tokens of
 * random K/V through the cache's own store and prefill path (the last n_obs positions as the
 * observation queries, so the tiered cache scores and routes every layer as after a real prompt;
 * the prompt's other hidden states are not computed: this measures memory and decode, not
 * prefill), then every slot decodes `new` tokens in one batch through the whole model
 * (model_forward_greedy). Prints one JSON line.
 * Usage: long_ctx [--shape llama3-8b] [--ctx 32768] [--new 32] [--policy full|qevict]
 *                 [--budget 0.2] [--device 0] [--reserve-gb 4] [--max-seqs N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/kern_cuda.h"
#include "kv_gpu.h"
#include "model.h"
#include "qe_status.h"

typedef struct {
  const char *shape, *policy;
  int ctx, n_new, device, max_seqs;
  double budget, reserve_gb;
} lc_args_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse(int argc, char **argv, lc_args_t *a) {
  *a = (lc_args_t){"llama3-8b", "full", 32768, 32, 0, 0, 0.2, 4.0};
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *f = argv[i], *v = argv[i + 1];
    if (!strcmp(f, "--shape"))
      a->shape = v;
    else if (!strcmp(f, "--policy"))
      a->policy = v;
    else if (!strcmp(f, "--ctx"))
      a->ctx = atoi(v);
    else if (!strcmp(f, "--new"))
      a->n_new = atoi(v);
    else if (!strcmp(f, "--device"))
      a->device = atoi(v);
    else if (!strcmp(f, "--max-seqs"))
      a->max_seqs = atoi(v);
    else if (!strcmp(f, "--budget"))
      a->budget = atof(v);
    else if (!strcmp(f, "--reserve-gb"))
      a->reserve_gb = atof(v);
    else
      return fprintf(stderr, "long_ctx: unknown option %s\n", f), 2;
  }
  if (a->ctx < 64 || a->n_new < 1 || a->budget <= 0 || a->budget > 1)
    return fprintf(stderr, "long_ctx: bad --ctx, --new or --budget\n"), 2;
  return 0;
}

/* A cache of n slots; *per_slot: its device bytes per slot (pool share). */
static int make_cache(const lc_args_t *a, kern_backend_t *be, const model_t *m, int n,
                      kv_cache_t **kv) {
  kv_geom_t g = model_kv_geom(m, n);
  int cap = a->ctx + a->n_new;
  if (!strcmp(a->policy, "full"))
    return kv_gpu_create(be, &g, KV_GPU_OMEGA, cap, kv_gpu_pool_bytes(&g, KV_GPU_OMEGA, n, cap),
                         kv);
  kv_policy_desc_t d;
  int rc = kv_policy_find(a->policy, &d);
  return rc ? rc
            : kv_gpu_create_tiered(be, &g, &model_hparams(m)->rope, &d.cfg, cap, n, a->budget, 0,
                                   kv);
}

/* Device bytes a cache of n slots takes (made and destroyed), or 0 when it does not fit. */
static size_t cache_cost(const lc_args_t *a, kern_backend_t *be, const model_t *m, int n) {
  size_t f0 = 0, f1 = 0, total = 0;
  kv_cache_t *kv = NULL;
  kern_cuda_mem_info(be, &f0, &total);
  if (make_cache(a, be, m, n, &kv)) return 0;
  kern_cuda_mem_info(be, &f1, &total);
  kv_cache_destroy(kv);
  return f0 > f1 ? f0 - f1 : 1;
}

/* The most slots whose cache fits in the free memory less the reserve: the per-slot and fixed
 * costs from caches of 8 and 16 slots, then creation from that estimate downwards. */
static int fit_slots(const lc_args_t *a, kern_backend_t *be, const model_t *m, kv_cache_t **kv) {
  size_t free_b = 0, total = 0, reserve = (size_t)(a->reserve_gb * (1 << 30));
  size_t c1 = cache_cost(a, be, m, 8), c2 = cache_cost(a, be, m, 16);
  if (kern_cuda_mem_info(be, &free_b, &total) || !c1 || !c2 || free_b <= reserve + c1)
    return qe_errf(QE_ENOSPC, "long_ctx: no memory left for a cache");
  size_t per = c2 > c1 ? (c2 - c1) / 8 : c1 / 8, fixed = c1 > 8 * per ? c1 - 8 * per : 0;
  int n = (int)((free_b - reserve - fixed) / per), rc = 0;
  if (a->max_seqs > 0 && n > a->max_seqs) n = a->max_seqs;
  for (; n > 0; n -= n / 32 > 1 ? n / 32 : 1) {
    if (!(rc = make_cache(a, be, m, n, kv))) return n;
    if (rc != QE_ENOSPC) return rc;
  }
  return qe_errf(QE_ENOSPC, "long_ctx: not even one slot fits");
}

/* Fills slot s with ctx tokens of the given K/V rows on every layer, then the prefill path with
 * the last n_obs positions as queries (scores and routing as after a prompt). */
static int fill_slot(kv_cache_t *kv, int s, int ctx, int cap, const float *k, const float *v,
                     float *q, float *out) {
  int rc = kv->ops->seq_open(kv, s, cap), n_obs = 32;
  for (int l = 0; !rc && l < kv->geom.n_layer; l++) {
    rc = kv->ops->store(kv, s, l, 0, ctx, k, v);
    kv_attn_req_t r = {s, ctx - n_obs, n_obs, q, out};
    if (!rc) rc = kv->ops->attend(kv, l, &r, 1);
  }
  return rc;
}

static int random_rows(kern_backend_t *be, size_t n, float **out) {
  float *h = malloc(sizeof(float) * n);
  uint64_t st = 0x6c6f6e67ULL;
  if (!h || !(*out = kern_alloc(be, sizeof(float) * n))) return free(h), QE_ENOMEM;
  for (size_t i = 0; i < n; i++) h[i] = kern_rng_uniform(&st) * 2.0f - 1.0f;
  int rc = be->ops->upload(be, *out, h, sizeof(float) * n);
  free(h);
  return rc;
}

static int decode(model_t *m, kv_cache_t *kv, int n, int ctx, int steps, double *step_s) {
  tp_comm_t *c = NULL;
  int32_t *tok = calloc((size_t)n, 4), *pos = calloc((size_t)n, 4), *seq = calloc((size_t)n, 4);
  int rc = tp_comm_create_single(&c);
  if (!tok || !pos || !seq) rc = QE_ENOMEM;
  double t0 = 0;
  for (int t = 0; !rc && t < steps; t++) {
    if (t == 1) t0 = now_s(); /* the first step warms the GEMM plans */
    for (int i = 0; i < n; i++) pos[i] = ctx + t, seq[i] = i;
    model_batch_t b = {n, tok, pos, seq, NULL};
    rc = model_forward_greedy(m, kv, c, &b, tok);
  }
  *step_s = steps > 1 ? (now_s() - t0) / (steps - 1) : 0;
  tp_comm_destroy(c);
  free(tok), free(pos), free(seq);
  return rc;
}

int main(int argc, char **argv) {
  lc_args_t a;
  if (parse(argc, argv, &a)) return 2;
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  kv_cache_t *kv = NULL;
  model_hparams_t hp;
  float *k = NULL, *v = NULL, *q = NULL, *o = NULL;
  double fill_s = 0, step_s = 0;
  int rc = model_shape_named(a.shape, &hp), n = 0;
  if (!rc) rc = kern_cuda_create(a.device, &be);
  model_load_opts_t mo = {be, 0, 1, a.ctx > 4096 ? 4096 : a.ctx};
  if (!rc) rc = model_create_random(&hp, 1, &mo, &m);
  if (!rc) rc = (n = fit_slots(&a, be, m, &kv)) < 0 ? n : 0;
  size_t row = (size_t)hp.n_head_kv * hp.head_dim;
  if (!rc) rc = random_rows(be, row * (size_t)a.ctx, &k);
  if (!rc) rc = random_rows(be, row * (size_t)a.ctx, &v);
  if (!rc) rc = random_rows(be, (size_t)32 * hp.n_head * hp.head_dim, &q);
  if (!rc && !(o = kern_alloc(be, sizeof(float) * 32 * hp.n_head * hp.head_dim))) rc = QE_ENOMEM;
  double t0 = now_s();
  for (int s = 0; !rc && s < n; s++) rc = fill_slot(kv, s, a.ctx, a.ctx + a.n_new, k, v, q, o);
  fill_s = now_s() - t0;
  if (!rc) rc = decode(m, kv, n, a.ctx, a.n_new, &step_s);
  size_t free_b = 0, total = 0;
  if (be) kern_cuda_mem_info(be, &free_b, &total);
  if (!rc)
    printf("{\"bench\":\"long_ctx\",\"shape\":\"%s\",\"policy\":\"%s\",\"budget\":%.3f,\"ctx\":%d,"
           "\"sequences\":%d,\"slot_bytes\":%zu,\"fill_s\":%.2f,\"step_ms\":%.3f,"
           "\"tokens_per_s\":%.1f,\"gpu_used_gb\":%.2f}\n",
           a.shape, a.policy, strcmp(a.policy, "full") ? a.budget : 1.0, a.ctx, n,
           kv ? kv->ops->seq_bytes(kv, 0) : 0, fill_s, step_s * 1e3, n / step_s,
           (double)(total - free_b) / (1 << 30));
  else
    fprintf(stderr, "long_ctx: %s (%s)\n", qe_strerror(rc), qe_errmsg());
  if (be) kern_free(be, k), kern_free(be, v), kern_free(be, q), kern_free(be, o);
  kv_cache_destroy(kv);
  model_destroy(m);
  kern_destroy(be);
  return rc ? 1 : 0;
}
