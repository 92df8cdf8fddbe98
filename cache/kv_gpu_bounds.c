/* kv_gpu_bounds: the GPU cache's byte sizes as pure arithmetic (kv_gpu.h), so that code without
 * a GPU (the scheduler's admission, the worker sizing its arenas) sizes budgets exactly as the
 * cache charges them. Built in every configuration. */
#include "kv_gpu.h"
#include "qe_status.h"

size_t kv_gpu_page_bytes(const kv_geom_t *g, int omega) {
  return (size_t)2 * omega * g->n_kv_head * g->head_dim * 2;
}

int kv_gpu_bounds(const kv_geom_t *g, const kv_policy_cfg_t *cfg, long n_tokens, size_t *floor,
                  size_t *min_budget, size_t *fullkv) {
  int o = cfg->omega;
  if (o != 8 && (o < 16 || o % 16 || o > 1024))
    return qe_errf(QE_EUNSUPPORTED,
                   "kv_gpu: the GPU cache takes windows of 8 or a multiple of 16 tokens up to 1024 "
                   "(--window; got %d)",
                   o);
  size_t unit = kv_gpu_page_bytes(g, o) + KV_GPU_WIN_META, L = (size_t)g->n_layer;
  size_t sink = (size_t)(cfg->n_sink + o - 1) / (size_t)o;
  size_t prot = (size_t)(cfg->n_local + o - 1) / (size_t)o + 1;
  size_t per = (sink + prot) * unit, wins = (size_t)((n_tokens + o - 1) / o);
  if (floor) *floor = per;
  if (min_budget) *min_budget = per * L;
  if (fullkv) *fullkv = (per + wins * unit) * L;
  return 0;
}
