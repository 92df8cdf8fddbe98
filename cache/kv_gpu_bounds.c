/* kv_gpu_bounds: the GPU cache's byte sizes as pure arithmetic, and the policies it runs
 * (kv_gpu.h), so that code without a GPU (the scheduler's admission and validation, the worker
 * sizing its arenas) sizes budgets exactly as the cache charges them and refuses what it cannot
 * run. Built in every configuration. */
#include "kv_gpu.h"
#include "qe_status.h"

int kv_gpu_policy_check(const kv_policy_cfg_t *c, const char *name, int scorer_named, int head_dim,
                        int n_head, int n_kv) {
  if (head_dim &&
      ((head_dim != 64 && head_dim != 128) || n_kv <= 0 || n_head % n_kv || n_head / n_kv > 8))
    return qe_errf(QE_EUNSUPPORTED,
                   "policy.name: '%s' needs the GPU tiered cache, which takes head_dim 64 or 128 "
                   "and at most 8 query heads per KV head (this model: %d, %d/%d); use policy full",
                   name, head_dim, n_head, n_kv);
  if (c->graphkv && c->scorer != KV_SCORE_CUMULATIVE)
    return qe_errf(QE_EUNSUPPORTED,
                   "policy.graphkv: '%s': the GPU cache re-scores only a cumulative scorer's "
                   "scores (qevict, h2o)",
                   name);
  if (c->graphkv && c->gkv.m > KV_GPU_GRAPHKV_MAX_M)
    return qe_errf(QE_EUNSUPPORTED,
                   "policy.graphkv: '%s': the GPU cache re-scores with at most %d neighbours per "
                   "source (got m = %d)",
                   name, KV_GPU_GRAPHKV_MAX_M, c->gkv.m);
  if (c->scorer != KV_SCORE_CUMULATIVE && c->scorer != KV_SCORE_RECENCY &&
      c->scorer != KV_SCORE_PREFILL)
    return qe_errf(QE_EUNSUPPORTED,
                   "%s: '%s' does not run on the GPU cache, which routes by cumulative attention, "
                   "recency or the prefill's observation window (qevict, kivi; h2o, streaming, "
                   "snapkv and pyramidkv with policy.window 4, 8 or a multiple of 16)",
                   scorer_named ? "policy.scorer" : "policy.name", name);
  if (c->quant.key_frame == KV_KEY_FRAME_WINDOW)
    return qe_errf(QE_EUNSUPPORTED,
                   "policy.key_frame: '%s': the GPU cache keeps quantized keys pre-RoPE or "
                   "post-RoPE (pos or abs), not window-relative",
                   name);
  if (!kv_gpu_omega_ok(c->omega))
    return qe_errf(QE_EUNSUPPORTED,
                   "policy.window: '%s' has windows of %d token(s); the GPU cache takes 4, 8 or a "
                   "multiple of 16 up to 1024 (set policy.window)",
                   name, c->omega);
  if (c->omega == 4 && c->q > 0 && c->quant.key_frame != KV_KEY_FRAME_ABS)
    return qe_errf(QE_EUNSUPPORTED,
                   "policy.key_frame: '%s': the GPU cache takes windows of 4 tokens with INT2 "
                   "only with keys quantized post-RoPE (abs, the default)",
                   name);
  return 0;
}

int kv_gpu_omega_ok(int omega) {
  return omega == 4 || omega == 8 || (omega >= 16 && omega % 16 == 0 && omega <= 1024);
}

size_t kv_gpu_page_bytes(const kv_geom_t *g, int omega) {
  return (size_t)2 * omega * g->n_kv_head * g->head_dim * 2;
}

int kv_gpu_bounds(const kv_geom_t *g, const kv_policy_cfg_t *cfg, long n_tokens, size_t *floor,
                  size_t *min_budget, size_t *fullkv) {
  int o = cfg->omega;
  if (!kv_gpu_omega_ok(o))
    return qe_errf(QE_EUNSUPPORTED,
                   "kv_gpu: the GPU cache takes windows of 4, 8 or a multiple of 16 tokens up to "
                   "1024 (--window; got %d)",
                   o);
  const size_t unit = kv_gpu_page_bytes(g, o) + KV_GPU_WIN_META, L = (size_t)g->n_layer;
  const long sink_tok = ((long)cfg->n_sink + o - 1) / o * o; /* (whole windows) */
  size_t sink = (size_t)(sink_tok / o), prot = (size_t)(((long)cfg->n_local + o - 1) / o) + 1;
  size_t hist = 0;
  if (n_tokens > 0) { /* kv_tiered's regions of the slot, in the GPU's windows */
    const kv_slot_regions_t r = kv_slot_regions(n_tokens, sink_tok, cfg->n_local, o);
    sink = (size_t)((r.sink + o - 1) / o), prot = (size_t)r.prot, hist = (size_t)r.hist;
  }
  const size_t per = (sink + prot) * unit;
  if (floor) *floor = per;
  if (min_budget) *min_budget = per * L;
  if (fullkv) *fullkv = (per + hist * unit) * L;
  return 0;
}
