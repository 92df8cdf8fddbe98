/* kv_policies: the policy registry (one line per policy), lookup by name with the
 * "+graphkv" suffix, validation of a policy configuration, PyramidKV's layer shares, and the
 * slot regions and layer budgets both tiered caches (CPU and GPU) size with. */
#include <stdint.h>
#include <string.h>

#include "kv_policies_internal.h"
#include "qe_status.h"

static const kv_policy_desc_t *const registry[] = {
    &kv_policy_full,      &kv_policy_streaming, &kv_policy_snapkv,
    &kv_policy_pyramidkv, &kv_policy_knorm,     &kv_policy_h2o,
    &kv_policy_kivi,      &kv_policy_qevict,    NULL};

const kv_policy_desc_t *const *kv_policy_list(void) { return registry; }

int kv_policy_find(const char *name, kv_policy_desc_t *out) {
  static const char suffix[] = "+graphkv";
  size_t n = strlen(name), sl = sizeof suffix - 1;
  int gkv = n > sl && !strcmp(name + n - sl, suffix);
  size_t base = gkv ? n - sl : n;
  for (int i = 0; registry[i]; i++) {
    if (strlen(registry[i]->name) != base || strncmp(registry[i]->name, name, base)) continue;
    if (gkv && (registry[i]->full || registry[i]->cfg.scorer == KV_SCORE_RECENCY))
      return qe_errf(QE_EINVAL, "policy: '%s' has no scores for graphkv to re-score", name);
    *out = *registry[i];
    out->cfg.graphkv = gkv;
    out->cfg.gkv = graphkv_defaults();
    if (out->cfg.decay == 0) out->cfg.decay = 0.95f;
    if (out->cfg.pnorm == 0) out->cfg.pnorm = 2.0f;
    return 0;
  }
  return qe_errf(QE_EINVAL,
                 "policy: unknown policy '%s' (full, streaming, snapkv, pyramidkv, "
                 "knorm, h2o, kivi, qevict; '+graphkv' on scorer-based ones)",
                 name);
}

int kv_policy_check(const kv_policy_cfg_t *c, int head_dim) {
  if (c->omega < 1 || c->omega > 256)
    return qe_errf(QE_EINVAL, "policy: window must be in [1, 256] (got %d)", c->omega);
  if (!(c->q >= 0.0f && c->q <= 1.0f))
    return qe_errf(QE_EINVAL, "policy: q must be in [0, 1] (got %g)", c->q);
  if (c->n_sink < 0 || c->n_local < 0)
    return qe_errf(QE_EINVAL, "policy: sink and local must be >= 0 (got %d, %d)", c->n_sink,
                   c->n_local);
  if (c->n_obs < 1 || c->pool_kernel < 1 || c->pool_kernel % 2 == 0)
    return qe_errf(QE_EINVAL, "policy: observation window must be >= 1 and pool kernel odd");
  if (c->scorer < KV_SCORE_CUMULATIVE || c->scorer > KV_SCORE_PREFILL)
    return qe_errf(QE_EINVAL, "policy: unknown scorer %d", c->scorer);
  if (c->scorer == KV_SCORE_DECAYED && !(c->decay > 0 && c->decay <= 1))
    return qe_errf(QE_EINVAL, "policy: decay must be in (0, 1] (got %g)", c->decay);
  if (c->scorer == KV_SCORE_PNORM && !(c->pnorm > 0))
    return qe_errf(QE_EINVAL, "policy: p-norm exponent must be > 0 (got %g)", c->pnorm);
  int rc = kv_qparams_check(&c->quant, head_dim);
  if (!rc && c->graphkv) rc = graphkv_check(&c->gkv);
  return rc;
}

/* Layer l's pyramid weight (1.5 at the first layer down to 0.5 at the last). */
static double pyramid_weight(int l, int L) { return 1.5 - (double)l / (L - 1); }

size_t kv_pyramid_share_capped(size_t spare, size_t cap, int l, int L) {
  if (L <= 1) return spare < cap ? spare : cap;
  double total = 0;
  for (int i = 0; i < L; i++) total += pyramid_weight(i, L);
  int k = 0; /* layers [0, k) take cap (the weights decrease, so the first ones fill first) */
  while (k < L && (double)(spare - (size_t)k * cap) * pyramid_weight(k, L) / total >= (double)cap)
    total -= pyramid_weight(k++, L);
  if (l < k) return cap;
  return (size_t)((double)(spare - (size_t)k * cap) * pyramid_weight(l, L) / total);
}

size_t kv_pyramid_share(size_t spare, int l, int L) {
  return kv_pyramid_share_capped(spare, SIZE_MAX, l, L);
}

size_t kv_layer_hist(size_t budget, size_t floor, size_t cap, int pyramid, int l, int L) {
  const size_t even = budget / (size_t)L, all = floor * (size_t)L;
  if (!pyramid || L <= 1) return even > floor ? even - floor : 0;
  return kv_pyramid_share_capped(budget > all ? budget - all : 0, cap, l, L);
}

kv_slot_regions_t kv_slot_regions(long n, long n_sink, long n_local, long omega) {
  if (n < 0) n = 0;
  const long sink = n < n_sink ? n : n_sink, past = n - sink, wins = (past + omega - 1) / omega;
  const long prot = (n_local + omega - 1) / omega + 1;
  if (past <= n_local) return (kv_slot_regions_t){sink, wins, wins, 0}; /* none can age */
  return (kv_slot_regions_t){sink, wins, prot < wins ? prot : wins, wins};
}

kv_policy_cfg_t kv_policy_fit(const kv_policy_cfg_t *cfg, int head_dim) {
  kv_policy_cfg_t c = *cfg;
  int a = c.quant.group, b = head_dim;
  while (a > 0 && b) {
    int r = a % b;
    a = b, b = r;
  }
  if (c.quant.group > 0 && head_dim > 0 && head_dim % c.quant.group) c.quant.group = a;
  return c;
}
