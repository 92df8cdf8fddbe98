/* test_kv_tiered: the three-tier cache. A hand-made routing sequence with known Full / INT2 /
 * Evicted sets after each event (promotion included); every policy at budgets from the minimum
 * to 100% on a random model with invariants checked after every step (bytes <= budget,
 * accounting consistent, evicted windows never return, ledgers never change once written);
 * qevict at 100% bit-identical to FullKV; RoPE un-rotation; bad configurations refused;
 * kv_cache_set_observer on every kind of CPU cache; sink and local regions longer than the
 * request capped at its tokens (bounds, a slot's sink, FullKV's logits). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_gpu.h"
#include "kv_mux.h"
#include "kv_tiered.h"
#include "model_gen.h"
#include "qe_status.h"
#include "rand_model.h"
#include "test_util.h"

/* ---- worked routing example ------------------------------------------------------------ */

static int tiers_are(const int *got, const char *want) {
  for (int i = 0; want[i]; i++)
    if ("FQE"[got[i]] != want[i]) return 0;
  return 1;
}

static void check_worked_example(void) {
  int tier[8], order[8];
  /* Event 1: six Full windows, B_hist 200, q 0.5: Full cap 100 (one window), INT2 cap 100. */
  kv_cand_t e1[6] = {{5, 0, 100, 30}, {4, 0, 100, 30}, {3, 0, 100, 30},
                     {2, 0, 100, 30}, {1, 0, 100, 30}, {0, 0, 100, 30}};
  kv_route_params_t p = {200, 0.5f, 1, 1, 1};
  CHECK(kv_route_decide(e1, 6, &p, tier, order) == 190);
  CHECK(tiers_are(tier, "FQQQEE"));
  /* Event 2: w0 F (score 1), w1 Q with ledger (2; Full would cost 130), w2 Q (.2), w3 Q (.1),
   * new w6 F (.5). w1 no longer fits Full (130 > 100): w0 stays; INT2 takes w1, w6, w2. */
  kv_cand_t e2[5] = {
      {1, 0, 100, 30}, {2, 1, 130, 30}, {.2f, 1, 130, 30}, {.1f, 1, 130, 30}, {.5f, 0, 100, 30}};
  kv_route_decide(e2, 5, &p, tier, order);
  CHECK(tiers_are(tier, "FQQEQ"));
  /* Event 3: w1's score jumps: with B_hist 260 (Full cap 130) it is promoted; w0 demoted. */
  kv_cand_t e3[4] = {{.3f, 0, 100, 30}, {10, 1, 130, 30}, {.2f, 1, 130, 30}, {.5f, 1, 130, 30}};
  kv_route_params_t p3 = {260, 0.5f, 1, 1, 1};
  kv_route_decide(e3, 4, &p3, tier, order);
  CHECK(tiers_are(tier, "QFQQ"));
  /* Without promotion w1 stays INT2 and w0 keeps Full. */
  kv_route_params_t np = {260, 0.5f, 1, 1, 0};
  kv_route_decide(e3, 4, &np, tier, order);
  CHECK(tiers_are(tier, "FQQQ"));
  /* No pressure: everything fits at Full, INT2 windows come back. */
  kv_route_params_t big = {1000, 0.7f, 1, 1, 1};
  kv_route_decide(e3, 4, &big, tier, order);
  CHECK(tiers_are(tier, "FFFF"));
  /* Full-only (h2o-like) and INT2-only (kivi-like) policies. */
  kv_route_params_t fo = {250, 0.0f, 0, 1, 1}, qo = {70, 1.0f, 1, 0, 1};
  kv_route_decide(e1, 6, &fo, tier, order);
  CHECK(tiers_are(tier, "FFEEEE"));
  kv_route_decide(e1, 6, &qo, tier, order);
  CHECK(tiers_are(tier, "QQEEEE"));
}

/* PyramidKV's layer shares capped at a layer's history: never above the cap, never more than
 * the spare bytes in all, every layer's whole history when the spare holds them all (the deeper
 * layers had 0.5x: pyramidkv at 100% evicted), kv_pyramid_share's shares when nothing caps. */
static void check_pyramid_shares(void) {
  const size_t cap = 10000;
  for (int L = 2; L <= 9; L++)
    for (size_t spare = 0; spare <= cap * (size_t)L + 999; spare += 997) {
      size_t sum = 0, over = 0;
      for (int l = 0; l < L; l++) {
        size_t sh = kv_pyramid_share_capped(spare, cap, l, L);
        sum += sh, over += sh > cap;
        if (l && sh > kv_pyramid_share_capped(spare, cap, l - 1, L)) over++; /* not decreasing */
      }
      CHECK(over == 0 && sum <= spare);
      CHECK(spare < cap * (size_t)L || sum == cap * (size_t)L);
    }
  for (int l = 0; l < 4; l++) {
    CHECK(kv_pyramid_share_capped(4 * cap, cap, l, 4) == cap);
    CHECK(kv_pyramid_share_capped(cap, SIZE_MAX, l, 4) == kv_pyramid_share(cap, l, 4));
  }
  /* kv_layer_hist, the layers' B_hist of both caches: even (the budget's share less the floor),
     or the capped pyramid shares of what exceeds the floors; 0 where the floor takes it all */
  for (int l = 0; l < 4; l++) {
    CHECK(kv_layer_hist(4003, 300, cap, 0, l, 4) == 700);
    CHECK(kv_layer_hist(4003, 300, 500, 1, l, 4) == kv_pyramid_share_capped(2803, 500, l, 4));
    CHECK(kv_layer_hist(1000, 300, cap, 0, l, 4) == 0 &&
          kv_layer_hist(1000, 300, cap, 1, l, 4) == 0);
  }
  CHECK(kv_layer_hist(4003, 300, 500, 1, 0, 1) == 3703); /* one layer: the budget less its floor */
}

/* ---- policies on a random model ---------------------------------------------------------- */

enum { NP = 100, ND = 48, MAXW = 64 };

typedef struct {
  kern_backend_t *be;
  model_t *m;
  tp_comm_t *c;
  int32_t prompt[NP];
} world_t;

/* What a window looked like: its tier history and the ledger bytes first seen. */
typedef struct {
  int evicted;
  uint8_t *ledger;
} seen_t;

static void check_history(kv_cache_t *kv, int L, seen_t seen[][MAXW], int *bad_return,
                          int *bad_ledger) {
  for (int l = 0; l < L; l++)
    for (int w = 0; w < kv_tiered_n_windows(kv, 0, l) && w < MAXW; w++) {
      int tier = kv_tiered_window_tier(kv, 0, l, w);
      size_t nb;
      const uint8_t *led = kv_tiered_window_ledger(kv, 0, l, w, &nb);
      seen_t *s = &seen[l][w];
      if (s->evicted && tier != KV_TIER_EVICTED) (*bad_return)++;
      s->evicted |= tier == KV_TIER_EVICTED;
      if (led && !s->ledger)
        s->ledger = memcpy(malloc(nb), led, nb);
      else if (led && memcmp(led, s->ledger, nb))
        (*bad_ledger)++;
    }
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
  return b;
}

/* Decode steps: the window masses plus the sink's sum to the one query's attention (1). */
static double worst_mass_err;
static void mass_observer(void *ud, const kv_obs_t *o) {
  if (o->kind != KV_OBS_STEP || o->n_q != 1) return;
  double sum = o->sink_mass;
  for (int w = 0; w < o->n_wins; w++) sum += o->mass[w];
  if (fabs(sum - 1.0) > worst_mass_err) worst_mass_err = fabs(sum - 1.0);
}

/* Prefill + ND greedy decode steps; logits of every step into lg [ND+1][V] (may be NULL). */
static int run_policy(world_t *wd, kv_cache_t *kv, float *lg, kv_mem_stats_t *st, int tiered) {
  int V = model_hparams(wd->m)->n_vocab, L = model_hparams(wd->m)->n_layer, rc;
  int32_t pos[NP], seq[NP] = {0}, tok;
  uint8_t want[NP] = {0};
  float *row = malloc(sizeof(float) * V);
  static seen_t seen[4][MAXW];
  int bad_return = 0, bad_ledger = 0;
  memset(seen, 0, sizeof seen);
  for (int i = 0; i < NP; i++) pos[i] = i;
  want[NP - 1] = 1;
  rc = kv->ops->seq_open(kv, 0, NP + ND);
  model_batch_t b = {NP, wd->prompt, pos, seq, want};
  if (!rc) rc = model_forward(wd->m, kv, wd->c, &b, row);
  for (int s = 0; !rc && s <= ND; s++) {
    if (lg) memcpy(lg + (size_t)s * V, row, sizeof(float) * V);
    if (tiered) CHECK_OK(kv_tiered_check(kv, 0));
    if (tiered) check_history(kv, L, seen, &bad_return, &bad_ledger);
    if (s == ND) break;
    tok = argmax(row, V);
    int32_t p = NP + s, z = 0;
    model_batch_t d = {1, &tok, &p, &z, NULL};
    rc = model_forward(wd->m, kv, wd->c, &d, row);
  }
  CHECK(bad_return == 0);
  CHECK(bad_ledger == 0);
  if (tiered) kv_tiered_stats(kv, 0, st);
  kv->ops->seq_close(kv, 0);
  for (int l = 0; l < 4; l++)
    for (int w = 0; w < MAXW; w++) free(seen[l][w].ledger);
  free(row);
  return rc;
}

static int make_tiered(world_t *wd, const char *policy, double frac, kv_cache_t **kv) {
  kv_policy_desc_t d;
  int rc = kv_policy_find(policy, &d);
  if (rc) return rc;
  kv_geom_t g = model_kv_geom(wd->m, 1);
  rc = kv_tiered_create(wd->be, &g, &model_hparams(wd->m)->rope, &d.cfg, 64u << 20, kv);
  if (!rc) kv_tiered_set_budget_spec(*kv, frac, 0);
  return rc;
}

static void check_policies(world_t *wd) {
  worst_mass_err = 0;
  static const double fracs[] = {0.0, 0.1, 0.3, 0.6, 1.0};
  static const char *extra[] = {"qevict+graphkv", "h2o+graphkv", "snapkv+graphkv", "knorm+graphkv",
                                NULL};
  const kv_policy_desc_t *const *list = kv_policy_list();
  const char *names[32];
  int n = 0;
  for (int i = 0; list[i] && n < 28; i++)
    if (!list[i]->full) names[n++] = list[i]->name;
  for (int i = 0; extra[i]; i++) names[n++] = extra[i];
  for (int i = 0; i < n; i++) {
    const char *name = names[i];
    for (size_t f = 0; f < sizeof fracs / sizeof *fracs; f++) {
      kv_cache_t *kv = NULL;
      kv_mem_stats_t st;
      CHECK_OK(make_tiered(wd, name, 1.0, &kv));
      if (!kv) continue;
      size_t minb = kv_tiered_min_budget(kv);
      double full = (double)(NP + ND) * 2 * model_kv_geom(wd->m, 1).n_kv_head * 32 * 4 * 2;
      double fr = fracs[f] == 0.0 ? (double)minb / full + 1e-9 : fracs[f];
      kv_tiered_set_budget_spec(kv, fr, 0);
      CHECK_OK(kv_cache_set_observer(kv, mass_observer, NULL));
      int rc = run_policy(wd, kv, NULL, &st, 1);
      if (rc == QE_EINVAL && fracs[f] > 0 && fr * full < minb) rc = 0; /* below the minimum */
      CHECK_OK(rc);
      fprintf(stderr,
              "%-16s budget %5.1f%%: %7zu/%7zu bytes, windows F/Q/E %ld/%ld/%ld, "
              "promotions %ld, demotions %ld, evictions %ld\n",
              name, 100 * fr, st.bytes, st.budget, st.windows[0], st.windows[1], st.windows[2],
              st.promotions, st.demotions, st.evictions);
      kv_cache_destroy(kv);
    }
  }
  fprintf(stderr, "per-window masses + sink vs 1 per decode query: max error %.3g\n",
          worst_mass_err);
  CHECK(worst_mass_err < 1e-5);
}

/* Observations counted by kind; bad: any that breaks kv_obs_t's shape. */
typedef struct {
  long steps, routes, prefill_steps;
  int bad;
} obs_count_t;

static void count_observer(void *ud, const kv_obs_t *o) {
  obs_count_t *c = ud;
  c->steps += o->kind == KV_OBS_STEP, c->routes += o->kind == KV_OBS_ROUTE;
  c->prefill_steps += o->kind == KV_OBS_STEP && o->n_q == NP;
  c->bad += o->seq != 0 || o->n_aged > o->n_wins || (o->kind == KV_OBS_ROUTE) != !o->mass ||
            (o->kind == KV_OBS_ROUTE && o->n_q != 0);
}

/* kv_cache_set_observer: the tiered cache reports one step per layer and call (the prompt's
 * and every decode step's) and one routing per routing event; a second observer replaces the
 * first; clearing stops the reports. FullKV and the mux have no observations: setting one is
 * QE_EUNSUPPORTED naming the cache (and leaves it working), clearing is a no-op. */
static void check_observer_setter(world_t *wd) {
  long L = model_hparams(wd->m)->n_layer;
  kv_geom_t g = model_kv_geom(wd->m, 1);
  kv_cache_t *kv = NULL, *full = NULL, *mux = NULL;
  obs_count_t a = {0}, b = {0};
  kv_mem_stats_t st;
  CHECK_OK(make_tiered(wd, "qevict", 0.4, &kv));
  CHECK_OK(kv_full_create(wd->be, &g, &full));
  CHECK_OK(kv_mux_create(wd->be, &g, &mux));
  CHECK(kv_cache_set_observer(full, count_observer, &a) == QE_EUNSUPPORTED);
  CHECK(strstr(qe_errmsg(), "full cache") != NULL);
  CHECK(kv_cache_set_observer(mux, count_observer, &a) == QE_EUNSUPPORTED);
  CHECK_OK(kv_cache_set_observer(full, NULL, NULL));
  CHECK_OK(kv_cache_set_observer(mux, NULL, NULL));
  CHECK_OK(run_policy(wd, full, NULL, &st, 0));
  CHECK_OK(kv_cache_set_observer(kv, count_observer, &a));
  CHECK_OK(kv_cache_set_observer(kv, count_observer, &b));
  CHECK_OK(run_policy(wd, kv, NULL, &st, 1));
  fprintf(stderr, "observer: %ld steps (%ld of the prompt), %ld routings of %ld events\n", b.steps,
          b.prefill_steps, b.routes, st.routing_events);
  CHECK(a.steps == 0 && a.routes == 0 && b.bad == 0);
  CHECK(b.steps == L * (ND + 1) && b.prefill_steps == L);
  CHECK(b.routes == st.routing_events && b.routes > L);
  CHECK(st.windows[1] + st.windows[2] > 0); /* the budget routed windows away from Full */
  CHECK_OK(kv_cache_set_observer(kv, NULL, NULL));
  long steps = b.steps;
  CHECK_OK(run_policy(wd, kv, NULL, &st, 1));
  CHECK(b.steps == steps);
  kv_cache_destroy(kv), kv_cache_destroy(full), kv_cache_destroy(mux);
}

/* qevict at 100% (and h2o, snapkv, pyramidkv, qevict+graphkv at 100%) gives bit-identical
 * logits to FullKV (pyramidkv's deeper layers had held half their history: 2026-12-06 audit). */
static void check_identical(world_t *wd) {
  int V = model_hparams(wd->m)->n_vocab;
  float *ref = malloc(sizeof(float) * (ND + 1) * V), *got = malloc(sizeof(float) * (ND + 1) * V);
  kv_cache_t *full = NULL;
  kv_geom_t g = model_kv_geom(wd->m, 1);
  kv_mem_stats_t st;
  CHECK_OK(kv_full_create(wd->be, &g, &full));
  CHECK_OK(run_policy(wd, full, ref, &st, 0));
  kv_cache_destroy(full);
  const char *names[] = {"qevict", "h2o", "snapkv", "qevict+graphkv", "pyramidkv"};
  for (int i = 0; i < 5; i++) {
    kv_cache_t *kv = NULL;
    CHECK_OK(make_tiered(wd, names[i], 1.0, &kv));
    CHECK_OK(run_policy(wd, kv, got, &st, 1));
    int same = !memcmp(ref, got, sizeof(float) * (ND + 1) * V);
    fprintf(stderr, "%s at 100%%: logits %s FullKV's (evictions %ld, demotions %ld)\n", names[i],
            same ? "bit-identical to" : "DIFFER from", st.evictions, st.demotions);
    CHECK(same && st.evictions == 0 && st.demotions == 0);
    kv_cache_destroy(kv);
  }
  free(ref);
  free(got);
}

/* Decode attention reading the windows in place (the default on the CPU) gives the bits of
 * attention over the gathered windows (kv_tiered_set_gather), and the same routing, for the
 * quantizing and the evicting policies at budgets that leave INT2 and evicted windows. */
static void check_in_place(world_t *wd) {
  int V = model_hparams(wd->m)->n_vocab;
  float *ref = malloc(sizeof(float) * (ND + 1) * V), *got = malloc(sizeof(float) * (ND + 1) * V);
  const char *names[] = {"qevict", "kivi", "h2o", "qevict+graphkv"};
  for (int i = 0; i < 4; i++)
    for (int f = 0; f < 2; f++) {
      kv_cache_t *a = NULL, *b = NULL;
      kv_mem_stats_t sa, sb;
      CHECK_OK(make_tiered(wd, names[i], f ? 0.7 : 0.45, &a));
      CHECK_OK(make_tiered(wd, names[i], f ? 0.7 : 0.45, &b));
      kv_tiered_set_gather(a, 1);
      CHECK_OK(run_policy(wd, a, ref, &sa, 1));
      CHECK_OK(run_policy(wd, b, got, &sb, 1));
      int same = !memcmp(ref, got, sizeof(float) * (ND + 1) * V);
      same &= sa.demotions == sb.demotions && sa.evictions == sb.evictions;
      same &= sa.promotions == sb.promotions && sa.quantizations == sb.quantizations;
      fprintf(stderr, "%s at %.0f%%: in place %s gathered (demotions %ld, evictions %ld)\n",
              names[i], f ? 70.0 : 45.0, same ? "bit-identical to" : "DIFFERS from", sb.demotions,
              sb.evictions);
      CHECK(same && (f || sb.demotions + sb.evictions > 0));
      kv_cache_destroy(a), kv_cache_destroy(b);
    }
  free(ref);
  free(got);
}

static void check_bad_config(world_t *wd) {
  kv_policy_desc_t d;
  kv_cache_t *kv = NULL;
  kv_geom_t g = model_kv_geom(wd->m, 1);
  const kern_rope_t *r = &model_hparams(wd->m)->rope;
  CHECK(kv_policy_find("lru", &d) == QE_EINVAL && strstr(qe_errmsg(), "unknown policy"));
  CHECK(kv_policy_find("streaming+graphkv", &d) == QE_EINVAL);
  CHECK_OK(kv_policy_find("qevict", &d));
  kv_policy_cfg_t c = d.cfg;
  c.omega = 0;
  CHECK(kv_tiered_create(wd->be, &g, r, &c, 1 << 20, &kv) == QE_EINVAL &&
        strstr(qe_errmsg(), "window"));
  c = d.cfg, c.quant.bits = 3;
  CHECK(kv_tiered_create(wd->be, &g, r, &c, 1 << 20, &kv) == QE_EINVAL &&
        strstr(qe_errmsg(), "bits"));
  c = d.cfg, c.q = 1.5f;
  CHECK(kv_tiered_create(wd->be, &g, r, &c, 1 << 20, &kv) == QE_EINVAL &&
        strstr(qe_errmsg(), "q must"));
  CHECK_OK(kv_tiered_create(wd->be, &g, r, &d.cfg, 1 << 20, &kv));
  kv_tiered_set_budget_spec(kv, 0, kv_tiered_min_budget(kv) - 1);
  CHECK(kv->ops->seq_open(kv, 0, 64) == QE_EINVAL && strstr(qe_errmsg(), "protected regions"));
  kv_cache_destroy(kv);
}

/* An odd head_dim quantizes in groups of 1: at a window of 1 a ledger (8.6 bytes a value at
 * INT2) is over its Full page (8), and the pool's page-sized ledger slot overran into the next
 * slot. Such a quantizing policy is refused (create and bounds); a window of 2 fits; a policy
 * that never quantizes keeps a window of 1. */
static void check_odd_head_ledger(kern_backend_t *be) {
  kv_geom_t g = {1, 2, 2, 5, 1};
  kern_rope_t r = {KERN_ROPE_NORM, 4, 10000, 1, NULL, 0, 1, 32, 1, 512};
  kv_policy_desc_t d;
  kv_cache_t *kv = NULL;
  size_t min = 0, full = 0;
  CHECK_OK(kv_policy_find("qevict", &d));
  d.cfg.omega = 1;
  CHECK(kv_tiered_create(be, &g, &r, &d.cfg, 1 << 20, &kv) == QE_EINVAL &&
        strstr(qe_errmsg(), "over its Full page") && strstr(qe_errmsg(), "window 1"));
  CHECK(kv_tiered_bounds(&g, &d.cfg, 64, &min, &full) == QE_EINVAL);
  CHECK_OK(kv_policy_find("kivi", &d));
  d.cfg.omega = 1;
  CHECK(kv_tiered_create(be, &g, &r, &d.cfg, 1 << 20, &kv) == QE_EINVAL);
  d.cfg.omega = 2;
  CHECK_OK(kv_tiered_create(be, &g, &r, &d.cfg, 1 << 20, &kv));
  kv_cache_destroy(kv);
  CHECK_OK(kv_policy_find("snapkv", &d));
  d.cfg.omega = 1;
  CHECK(d.cfg.q <= 0);
  CHECK_OK(kv_tiered_create(be, &g, &r, &d.cfg, 1 << 20, &kv));
  kv_cache_destroy(kv);
}

/* Rotating to a position and back restores the keys within 1e-5. */
static void check_rope_roundtrip(world_t *wd) {
  kern_rope_t r = model_hparams(wd->m)->rope;
  uint64_t s = 3;
  float x[4 * 2 * 32], y[4 * 2 * 32];
  int32_t pos[4] = {7, 100, 1000, 4000}, neg[4] = {-7, -100, -1000, -4000};
  for (int i = 0; i < 256; i++) x[i] = y[i] = tu_randf(&s, -3, 3);
  wd->be->ops->rope(wd->be, y, pos, 4, 2, 32, &r);
  wd->be->ops->rope(wd->be, y, neg, 4, 2, 32, &r);
  double e = 0;
  for (int i = 0; i < 256; i++) e = fmax(e, fabs(x[i] - y[i]));
  fprintf(stderr, "rope un-rotation max abs error %.3g\n", e);
  CHECK(e < 1e-5);
}

/* Many promotion/demotion cycles: ledgers never change, and every promotion of a window
 * rebuilds exactly the same Full page (no compounding quantization error). */
static void check_ledger_cycles(kern_backend_t *be) {
  kv_geom_t g = {1, 2, 1, 8, 1};
  kern_rope_t r = {KERN_ROPE_NORM, 8, 10000, 1, NULL, 0, 1, 32, 1, 512};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("qevict", &d));
  d.cfg.omega = 4, d.cfg.n_sink = 0, d.cfg.n_local = 4, d.cfg.q = 0.5f, d.cfg.quant.group = 8;
  kv_cache_t *kv = NULL;
  CHECK_OK(kv_tiered_create(be, &g, &r, &d.cfg, 1 << 20, &kv));
  /* page 256 + meta 12; ledger 64: protected 2 x 268; history 700 (Full cap 350). */
  CHECK_OK(kv_tiered_set_budget(kv, 0, 536 + 700));
  CHECK_OK(kv->ops->seq_open(kv, 0, 24));
  uint64_t s = 77;
  float k[24 * 8], v[24 * 8];
  for (int i = 0; i < 24 * 8; i++) k[i] = tu_randf(&s, -2, 2), v[i] = tu_randf(&s, -2, 2);
  CHECK_OK(kv->ops->store(kv, 0, 0, 0, 24, k, v));
  uint8_t *led0[5] = {0};
  float *page0[5] = {0};
  size_t lb, pb;
  int promotions = 0, bad_ledger = 0, bad_page = 0;
  for (int c = 0; c < 40; c++) {
    for (int w = 0; w < 5; w++)
      kv_tiered_test_set_score(kv, 0, 0, w, w == c % 5 ? 10.0f : 1.0f / (w + 1));
    CHECK_OK(kv_tiered_test_route(kv, 0, 0));
    CHECK_OK(kv_tiered_check(kv, 0));
    for (int w = 0; w < 5; w++) {
      const uint8_t *led = kv_tiered_window_ledger(kv, 0, 0, w, &lb);
      const float *page = kv_tiered_test_page(kv, 0, 0, w, &pb);
      if (led && !led0[w])
        led0[w] = memcpy(malloc(lb), led, lb);
      else if (led && memcmp(led, led0[w], lb))
        bad_ledger++;
      if (!led || !page) continue; /* only promoted windows: Full with a ledger */
      promotions += !page0[w];
      if (!page0[w])
        page0[w] = memcpy(malloc(pb), page, pb);
      else if (memcmp(page, page0[w], pb))
        bad_page++;
    }
  }
  kv_mem_stats_t st;
  kv_tiered_stats(kv, 0, &st);
  fprintf(stderr, "ledger cycles: %ld promotions, %ld demotions, %ld quantizations\n",
          st.promotions, st.demotions, st.quantizations);
  CHECK(st.promotions >= 30 && st.quantizations == 5 && promotions == 5);
  CHECK(bad_ledger == 0 && bad_page == 0);
  for (int w = 0; w < 5; w++) free(led0[w]), free(page0[w]);
  kv_cache_destroy(kv);
}

/* knorm+graphkv keeps knorm's choice where GraphKV finds no similar keys: five aged windows of
 * 4 tokens whose pre-RoPE keys lie on orthogonal channel pairs, key norms 5, 4, 3, 1, 2, room
 * for two at Full: the two of lowest norm stay. knorm's scores (minus the norm) had been clipped
 * to 0 for GraphKV, so every window tied and the two oldest stayed. */
static void check_knorm_graphkv(kern_backend_t *be) {
  kv_geom_t g = {1, 2, 1, 16, 1};
  kern_rope_t r = {KERN_ROPE_NORM, 16, 10000, 1, NULL, 0, 1, 32, 1, 512};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("knorm+graphkv", &d));
  d.cfg.omega = 4, d.cfg.n_sink = 0, d.cfg.n_local = 4;
  kv_cache_t *kv = NULL;
  CHECK_OK(kv_tiered_create(be, &g, &r, &d.cfg, 1 << 20, &kv));
  if (!kv) return;
  /* page 512 + meta 16 (knorm's norm sum): protected 2 x 528, history 2 x 528 */
  CHECK_OK(kv_tiered_set_budget(kv, 0, 4 * 528));
  CHECK_OK(kv->ops->seq_open(kv, 0, 24));
  static const float norm[6] = {5, 4, 3, 1, 2, 1};
  float k[24 * 16] = {0}, v[24 * 16];
  int32_t pos[24];
  uint64_t s = 13;
  for (int i = 0; i < 24; i++) {
    pos[i] = i, k[i * 16 + 2 * (i / 4)] = norm[i / 4];
    for (int c = 0; c < 16; c++) v[i * 16 + c] = tu_randf(&s, -1, 1);
  }
  be->ops->rope(be, k, pos, 24, 1, 16, &r); /* the cache stores post-RoPE keys */
  CHECK_OK(kv->ops->store(kv, 0, 0, 0, 24, k, v));
  CHECK_OK(kv_tiered_test_route(kv, 0, 0));
  CHECK_OK(kv_tiered_check(kv, 0));
  char got[6] = {0};
  for (int w = 0; w < 5; w++) got[w] = "FQE"[kv_tiered_window_tier(kv, 0, 0, w)];
  fprintf(stderr, "knorm+graphkv, key norms 5 4 3 1 2, two Full: tiers %s\n", got);
  CHECK(!strcmp(got, "EEEFF"));
  kv_cache_destroy(kv);
}

/* The max abs difference between window x's ledger keys, dequantized, and the frame's keys:
 * pre-RoPE (k itself), rotated by each token's offset in the window, or post-RoPE (by its
 * position). */
static double ledger_frame_error(kern_backend_t *be, const kv_cache_t *kv, const kern_rope_t *r,
                                 const kv_qparams_t *qp, const float *k, int x) {
  size_t lb;
  const uint8_t *led = kv_tiered_window_ledger(kv, 0, 0, x, &lb);
  if (!led) return -1;
  kv_qsizes_t q = kv_qsizes(qp, 4, 1, 8);
  const uint16_t *ks = (const uint16_t *)(led + q.k_codes), *kz = ks + q.k_meta / 4;
  float got[4 * 8], want[4 * 8];
  int32_t off[4] = {0, 1, 2, 3}, pos[4] = {4 * x, 4 * x + 1, 4 * x + 2, 4 * x + 3};
  kv_dequant_keys(qp, led, ks, kz, 4, 1, 8, got);
  memcpy(want, k + x * 4 * 8, sizeof want);
  if (qp->key_frame == KV_KEY_FRAME_WINDOW) be->ops->rope(be, want, off, 4, 1, 8, r);
  if (qp->key_frame == KV_KEY_FRAME_ABS) be->ops->rope(be, want, pos, 4, 1, 8, r);
  double e = 0;
  for (int i = 0; i < 4 * 8; i++) e = fmax(e, fabs(got[i] - want[i]));
  return e;
}

/* Both key frames (pre-RoPE, window-relative) at INT8 through demotions and promotions: each
 * ledger holds the keys in its frame, and each promoted page's post-RoPE keys equal the stored
 * ones, within the quantization step (a key rotated by a wrong angle is off by about its own
 * size). Returns the max abs error; *n counts the ledgers and promoted pages compared. */
static double key_frame_error(kern_backend_t *be, int frame, int *n) {
  kv_geom_t g = {1, 2, 1, 8, 1};
  kern_rope_t r = {KERN_ROPE_NORM, 8, 10000, 1, NULL, 0, 1, 32, 1, 512};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("qevict", &d));
  d.cfg.omega = 4, d.cfg.n_sink = 0, d.cfg.n_local = 4, d.cfg.q = 0.5f, d.cfg.quant.group = 8;
  d.cfg.quant.bits = 8, d.cfg.quant.key_frame = frame;
  kv_cache_t *kv = NULL;
  CHECK_OK(kv_tiered_create(be, &g, &r, &d.cfg, 1 << 20, &kv));
  /* page 256 + meta 12, INT8 ledger 112: protected 2 x 268; history 1,000: one Full window and
   * its ledger (cap 500), four ledgers */
  CHECK_OK(kv_tiered_set_budget(kv, 0, 536 + 1000));
  CHECK_OK(kv->ops->seq_open(kv, 0, 24));
  uint64_t s = 91;
  float k[24 * 8], v[24 * 8], rk[24 * 8];
  int32_t pos[24];
  for (int i = 0; i < 24 * 8; i++) k[i] = tu_randf(&s, -2, 2), v[i] = tu_randf(&s, -2, 2);
  for (int i = 0; i < 24; i++) pos[i] = i;
  memcpy(rk, k, sizeof k);
  be->ops->rope(be, rk, pos, 24, 1, 8, &r); /* the cache stores post-RoPE keys */
  CHECK_OK(kv->ops->store(kv, 0, 0, 0, 24, rk, v));
  double e = 0;
  size_t pb = 0;
  for (int w = 0; w < 5; w++) { /* each window in turn the only one worth keeping Full */
    for (int x = 0; x < 5; x++) kv_tiered_test_set_score(kv, 0, 0, x, x == w ? 10.0f : 1.0f);
    CHECK_OK(kv_tiered_test_route(kv, 0, 0));
    for (int x = 0; x < 5; x++) {
      double le = ledger_frame_error(be, kv, &r, &d.cfg.quant, k, x);
      const float *page = kv_tiered_test_page(kv, 0, 0, x, &pb);
      if (le < 0) continue;
      e = fmax(e, le), ++*n;
      for (int i = 0; page && i < 4 * 8; i++) e = fmax(e, fabs(page[i] - rk[x * 4 * 8 + i]));
      *n += page != NULL; /* promoted: Full with its ledger */
    }
  }
  kv_cache_destroy(kv);
  return e;
}

static void check_key_frames(kern_backend_t *be) {
  int np = 0, nw = 0, na = 0;
  double pos = key_frame_error(be, KV_KEY_FRAME_POS, &np);
  double win = key_frame_error(be, KV_KEY_FRAME_WINDOW, &nw);
  double abs = key_frame_error(be, KV_KEY_FRAME_ABS, &na);
  fprintf(stderr,
          "key frames at INT8: %d, %d and %d ledgers and promoted pages, within %.3g (pre-RoPE), "
          "%.3g (window), %.3g (post-RoPE)\n",
          np, nw, na, pos, win, abs);
  CHECK(np >= 20 && nw >= 20 && pos > 0 && pos < 0.03 && win > 0 && win < 0.03);
  CHECK(na >= 20 && abs > 0 && abs < 0.03);
}

/* ---- requests shorter than their protected regions ----------------------------------------- */

/* FullKV bytes of n tokens of geometry g on the CPU (2 x n_kv x head_dim floats a layer). */
static size_t tokens_bytes(const kv_geom_t *g, long n) {
  return (size_t)n * 2 * (size_t)g->n_kv_head * (size_t)g->head_dim * sizeof(float) *
         (size_t)g->n_layer;
}

/* kv_tiered_bounds of qevict (window 8, sink 5, local 32) with `sink` and `local` for n tokens
 * on 4 layers of 2 KV heads of 16: *min and *full in bytes. */
static void short_bounds(int sink, int local, long n, size_t *min, size_t *full) {
  kv_geom_t g = {4, 4, 2, 16, 1};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("qevict", &d));
  d.cfg.n_sink = sink, d.cfg.n_local = local;
  *min = *full = 0;
  CHECK_OK(kv_tiered_bounds(&g, &d.cfg, n, min, full));
}

/* The 2026-12-05 audit: a 2-token request with sink 8,192 reserved the whole sink. A sink or
 * local region longer than the request is capped at the request's tokens (FullKV of them, in
 * windows past the sink); requests whose regions fit keep the figures of before. */
static void check_short_bounds(void) {
  const size_t tok = 2 * 2 * 16 * sizeof(float), unit = 8 * tok + 12, L = 4; /* meta: 12 */
  kv_geom_t g = {4, 4, 2, 16, 1};
  size_t min = 0, full = 0;
  short_bounds(8192, 32, 2, &min, &full); /* the sink holds both tokens */
  fprintf(stderr, "2 tokens, sink 8192: min %zu, FullKV %zu bytes (policy full: %zu)\n", min, full,
          tokens_bytes(&g, 2));
  CHECK(full == tokens_bytes(&g, 2) && min == full);
  short_bounds(0, 8192, 2, &min, &full); /* no sink: one window, which never ages */
  CHECK(full == unit * L && min == full);
  short_bounds(0, 8192, 20, &min, &full);
  CHECK(full == 3 * unit * L && min == full);
  short_bounds(5, 32, 37, &min, &full); /* sink + local exactly: every window protected */
  CHECK(full == (5 * tok + 4 * unit) * L && min == full);
  short_bounds(5, 32, 40, &min, &full); /* the regions fit: the figures of before */
  CHECK(min == (5 * tok + 5 * unit) * L && full == (5 * tok + 10 * unit) * L);
  short_bounds(5, 32, 1000, &min, &full);
  CHECK(min == (5 * tok + 5 * unit) * L && full == (5 * tok + 130 * unit) * L);
}

/* A slot of 2 tokens under sink 8,192 takes a budget of FullKV of its 2 tokens, and its sink
 * holds those 2 (the whole sink had been allocated per layer). */
static void check_short_slot(kern_backend_t *be) {
  kv_geom_t g = {4, 4, 2, 16, 1};
  kern_rope_t r = {KERN_ROPE_NORM, 16, 10000, 1, NULL, 0, 1, 32, 1, 512};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("qevict", &d));
  d.cfg.n_sink = 8192;
  kv_cache_t *kv = NULL;
  CHECK_OK(kv_tiered_create(be, &g, &r, &d.cfg, 1 << 20, &kv));
  if (!kv) return;
  CHECK_OK(kv_tiered_set_budget(kv, 0, tokens_bytes(&g, 2)));
  CHECK_OK(kv->ops->seq_open(kv, 0, 2));
  uint64_t s = 5;
  float k[2 * 32], v[2 * 32];
  for (int i = 0; i < 2 * 32; i++) k[i] = tu_randf(&s, -2, 2), v[i] = tu_randf(&s, -2, 2);
  for (int l = 0; l < g.n_layer; l++) CHECK_OK(kv->ops->store(kv, 0, l, 0, 2, k, v));
  kv_mem_stats_t st;
  kv_tiered_stats(kv, 0, &st);
  fprintf(stderr, "2-token slot, sink 8192: sink %zu bytes, budget %zu (FullKV %zu)\n",
          st.sink_bytes, st.budget, tokens_bytes(&g, 2));
  CHECK(st.sink_bytes == tokens_bytes(&g, 2) && st.bytes == st.sink_bytes);
  CHECK(st.budget == tokens_bytes(&g, 2));
  CHECK_OK(kv_tiered_check(kv, 0));
  kv_cache_destroy(kv);
}

/* kv_tiered_set_budget is for the next open only (as kv_gpu_set_budget): an open that succeeds
 * uses it up, one refused keeps it; later opens take the budget spec (here its fraction 1: the
 * slot's FullKV bytes). It had stayed for every later open of the slot. */
static void check_budget_once(kern_backend_t *be) {
  kv_geom_t g = {2, 4, 2, 16, 1};
  kern_rope_t r = {KERN_ROPE_NORM, 16, 10000, 1, NULL, 0, 1, 32, 1, 512};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("qevict", &d));
  kv_cache_t *kv = NULL;
  CHECK_OK(kv_tiered_create(be, &g, &r, &d.cfg, 1 << 20, &kv));
  if (!kv) return;
  const size_t min = kv_tiered_fullkv_bytes(kv, 100) / 2, full = kv_tiered_fullkv_bytes(kv, 100);
  kv_mem_stats_t st;
  CHECK_OK(kv_tiered_set_budget(kv, 0, 1));
  CHECK(kv->ops->seq_open(kv, 0, 100) == QE_EINVAL); /* below the minimum: kept for a retry */
  CHECK(kv->ops->seq_open(kv, 0, 100) == QE_EINVAL);
  CHECK_OK(kv_tiered_set_budget(kv, 0, min));
  CHECK_OK(kv->ops->seq_open(kv, 0, 100));
  kv_tiered_stats(kv, 0, &st);
  CHECK(st.budget == min);
  kv->ops->seq_close(kv, 0);
  CHECK_OK(kv->ops->seq_open(kv, 0, 100));
  kv_tiered_stats(kv, 0, &st);
  fprintf(stderr, "a slot's second open after kv_tiered_set_budget(%zu): budget %zu (spec %zu)\n",
          min, st.budget, full);
  CHECK(st.budget == full);
  kv_cache_destroy(kv);
}

/* A sink or local region past the request (NP + ND tokens) at 100%: FullKV's logits, bit for
 * bit, under a budget of what the tokens take (the sink's rows; or the sink's and windows'). */
static void check_long_regions(world_t *wd) {
  int V = model_hparams(wd->m)->n_vocab;
  float *ref = malloc(sizeof(float) * (ND + 1) * V), *got = malloc(sizeof(float) * (ND + 1) * V);
  kv_geom_t g = model_kv_geom(wd->m, 1);
  kv_mem_stats_t st;
  kv_cache_t *full = NULL;
  CHECK_OK(kv_full_create(wd->be, &g, &full));
  CHECK_OK(run_policy(wd, full, ref, &st, 0));
  kv_cache_destroy(full);
  const size_t L = (size_t)g.n_layer, tok = tokens_bytes(&g, 1) / L, wins = (NP + ND - 5 + 7) / 8;
  for (int i = 0; i < 2; i++) {
    kv_policy_desc_t d;
    kv_cache_t *kv = NULL;
    CHECK_OK(kv_policy_find("qevict", &d)); /* window 8, sink 5 */
    if (i) d.cfg.n_local = 4096;
    if (!i) d.cfg.n_sink = 4096;
    CHECK_OK(kv_tiered_create(wd->be, &g, &model_hparams(wd->m)->rope, &d.cfg, 64u << 20, &kv));
    CHECK_OK(run_policy(wd, kv, got, &st, 1));
    int same = !memcmp(ref, got, sizeof(float) * (ND + 1) * V);
    size_t want = i ? (5 * tok + wins * (8 * tok + 12)) * L : tokens_bytes(&g, NP + ND);
    fprintf(stderr, "%s 4096 at 100%%: logits %s FullKV's, budget %zu bytes (want %zu)\n",
            i ? "local" : "sink", same ? "bit-identical to" : "DIFFER from", st.budget, want);
    CHECK(same && st.evictions == 0 && st.budget == want);
    kv_cache_destroy(kv);
  }
  free(ref);
  free(got);
}

/* Every check that needs a model, on one random model. */
static void check_model(const rand_model_spec_t *sp, int full_checks) {
  const char *path = "/tmp/qe_test_tiered.gguf";
  CHECK_OK(rand_model_write(sp, path));
  world_t wd = {0};
  CHECK_OK(kern_cpu_create(sp->seed % 2 ? 4 : 1, &wd.be)); /* 4: the decode split in parts */
  CHECK_OK(tp_comm_create_single(&wd.c));
  model_load_opts_t o = {wd.be, 0, 1, 128, 0};
  CHECK_OK(model_load(path, &o, &wd.m));
  uint64_t s = 9 + sp->seed;
  for (int i = 0; i < NP; i++) wd.prompt[i] = 3 + (int32_t)(tu_randf(&s, 0, 1) * 250);
  if (full_checks) check_ledger_cycles(wd.be);
  if (full_checks) check_odd_head_ledger(wd.be);
  if (full_checks) check_knorm_graphkv(wd.be);
  if (full_checks) check_key_frames(wd.be);
  if (full_checks) check_short_slot(wd.be);
  if (full_checks) check_budget_once(wd.be);
  if (wd.m && full_checks) {
    check_rope_roundtrip(&wd);
    check_bad_config(&wd);
    check_observer_setter(&wd);
    check_long_regions(&wd);
  }
  if (wd.m) {
    check_identical(&wd);
    check_in_place(&wd);
    check_policies(&wd);
  }
  model_destroy(wd.m);
  tp_comm_destroy(wd.c);
  kern_destroy(wd.be);
  unlink(path);
}

/* The GPU cache's sizes without a GPU (the scheduler admits GPU requests with them): qevict's
 * defaults (window 8, sink 5, local 32) on 8 KV heads of 128 over 32 layers. */
static void check_gpu_bounds(void) {
  kv_geom_t g = {32, 32, 8, 128, 1};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("qevict", &d));
  size_t floor_b = 0, min_b = 0, full = 0, unit = 2 * 8 * 8 * 128 * 2 + KV_GPU_WIN_META;
  CHECK_OK(kv_gpu_bounds(&g, &d.cfg, 1000, &floor_b, &min_b, &full));
  CHECK(floor_b == (1 + 4 + 1) * unit); /* sink: 1 window; local: 4 + 1 in flight */
  CHECK(min_b == floor_b * 32);
  CHECK(full == (floor_b + 124 * unit) * 32); /* the 124 windows past the sink (not 125) */
  /* a sink or local region longer than the request: only the request's windows, each once (a
     2-token request under sink 8,192 had reserved 1,024 sink windows a layer, 34 MB in all;
     then 2 windows a layer, FullKV 3, for its one window) */
  kv_policy_cfg_t c = d.cfg;
  c.n_sink = 8192;
  CHECK_OK(kv_gpu_bounds(&g, &c, 2, &floor_b, &min_b, &full));
  CHECK(floor_b == unit && min_b == floor_b * 32 && full == unit * 32);
  c.n_sink = 5, c.n_local = 8192;
  CHECK_OK(kv_gpu_bounds(&g, &c, 100, &floor_b, NULL, &full));
  CHECK(floor_b == 13 * unit && full == 13 * unit * 32);    /* the request's 13 windows */
  CHECK_OK(kv_gpu_bounds(&g, &c, 0, &floor_b, NULL, NULL)); /* any length: the whole regions */
  CHECK(floor_b == (1 + 1024 + 1) * unit);
  d.cfg.omega = 1; /* h2o's token-level default */
  CHECK(kv_gpu_bounds(&g, &d.cfg, 1000, NULL, &min_b, &full) == QE_EUNSUPPORTED);
}

/* The 2026-12-06 GPU audit: kv_gpu_bounds counted the sink's windows twice in FullKV (in the
 * floor and again among the slot's windows) and, for a slot shorter than its regions, capped the
 * sink and the local windows each at the slot's windows (a 1-window request: floor 2 windows,
 * FullKV 3). With a sink of whole windows both caches lay a slot out alike, so their bounds must
 * count the same windows: the GPU's less its sink windows equal the CPU's less its sink bytes, in
 * each cache's window units, for every length, sink and local region (qevict, window 8). */
static void check_gpu_bounds_rule(void) {
  kv_geom_t g = {2, 4, 2, 64, 1};
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find("qevict", &d));
  const size_t gu = kv_gpu_page_bytes(&g, 8) + KV_GPU_WIN_META, tok = 2 * 2 * 64 * sizeof(float);
  const size_t cu = 8 * tok + 12, L = 2; /* the CPU's window: page and meta */
  static const int sinks[] = {0, 8, 16, 4096}, locals[] = {0, 5, 32, 4096};
  int bad = 0, cases = 0;
  for (int si = 0; si < 4; si++)
    for (int li = 0; li < 4; li++)
      for (long n = 1; n <= 300; n++, cases++) {
        d.cfg.n_sink = sinks[si], d.cfg.n_local = locals[li];
        size_t gf = 0, gfull = 0, cmin = 0, cfull = 0;
        CHECK_OK(kv_gpu_bounds(&g, &d.cfg, n, &gf, NULL, &gfull));
        CHECK_OK(kv_tiered_bounds(&g, &d.cfg, n, &cmin, &cfull));
        const size_t sink = (size_t)(n < sinks[si] ? n : sinks[si]), sw = (sink + 7) / 8;
        const size_t cf = cmin / L - sink * tok, cw = cfull / L - sink * tok;
        bad += gf / gu - sw != cf / cu || gfull / L / gu - sw != cw / cu;
        bad += gf % gu != 0 || cf % cu != 0 || gfull / L % gu != 0 || cw % cu != 0;
      }
  fprintf(stderr, "kv_gpu_bounds against kv_tiered_bounds, window for window: %d of %d differ\n",
          bad, cases);
  CHECK(bad == 0);
}

/* Which policies the GPU cache runs, and the request field each refusal names. */
static void expect_gpu_policy(const char *name, int omega, int scorer_named, int hd, int nh,
                              int nkv, const char *field) {
  kv_policy_desc_t d;
  CHECK_OK(kv_policy_find(name, &d));
  if (omega) d.cfg.omega = omega;
  int rc = kv_gpu_policy_check(&d.cfg, name, scorer_named, hd, nh, nkv);
  if (!field) {
    CHECK(rc == 0);
    return;
  }
  CHECK(rc == QE_EUNSUPPORTED && !strncmp(qe_errmsg(), field, strlen(field)));
  if (rc != QE_EUNSUPPORTED || strncmp(qe_errmsg(), field, strlen(field)))
    fprintf(stderr, "  %s: rc %d, '%s' (want %s)\n", name, rc, qe_errmsg(), field);
}

static void check_gpu_policies(void) {
  expect_gpu_policy("qevict", 0, 0, 128, 32, 8, NULL);
  expect_gpu_policy("kivi", 0, 0, 64, 9, 3, NULL);
  expect_gpu_policy("h2o", 8, 0, 128, 32, 8, NULL);
  expect_gpu_policy("streaming", 16, 0, 128, 32, 8, NULL);
  expect_gpu_policy("h2o", 0, 0, 128, 32, 8, "policy.window"); /* token-level by default */
  expect_gpu_policy("qevict", 24, 0, 128, 32, 8, "policy.window");
  expect_gpu_policy("qevict", 4, 0, 128, 32, 8, NULL); /* windows of 4: post-RoPE keys */
  expect_gpu_policy("h2o", 4, 0, 128, 32, 8, NULL);
  expect_gpu_policy("qevict", 2, 0, 128, 32, 8, "policy.window");
  expect_gpu_policy("snapkv", 0, 0, 128, 32, 8, "policy.window"); /* token-level by default */
  expect_gpu_policy("snapkv", 8, 0, 128, 32, 8, NULL);    /* frozen, pooled prefill scores */
  expect_gpu_policy("pyramidkv", 4, 0, 128, 32, 8, NULL); /* and layer-wise budgets */
  expect_gpu_policy("snapkv+graphkv", 8, 0, 128, 32, 8, "policy.graphkv"); /* not cumulative */
  expect_gpu_policy("knorm", 8, 1, 128, 32, 8, "policy.scorer");
  expect_gpu_policy("knorm", 8, 0, 128, 32, 8, "policy.name");
  expect_gpu_policy("qevict+graphkv", 0, 0, 128, 32, 8, NULL);
  kv_policy_desc_t d; /* more neighbours per source than the GPU re-scoring takes */
  CHECK_OK(kv_policy_find("qevict+graphkv", &d));
  d.cfg.gkv.m = KV_GPU_GRAPHKV_MAX_M + 1;
  CHECK(kv_gpu_policy_check(&d.cfg, "qevict+graphkv", 0, 128, 32, 8) == QE_EUNSUPPORTED &&
        !strncmp(qe_errmsg(), "policy.graphkv", 14));
  d.cfg.gkv.m = KV_GPU_GRAPHKV_MAX_M;
  CHECK_OK(kv_gpu_policy_check(&d.cfg, "qevict+graphkv", 0, 128, 32, 8));
  d.cfg.quant.key_frame = KV_KEY_FRAME_WINDOW; /* window-relative keys: the CPU cache only */
  CHECK(kv_gpu_policy_check(&d.cfg, "qevict+graphkv", 0, 128, 32, 8) == QE_EUNSUPPORTED &&
        !strncmp(qe_errmsg(), "policy.key_frame", 16));
  d.cfg.quant.key_frame = KV_KEY_FRAME_ABS; /* post-RoPE keys: both caches */
  CHECK_OK(kv_gpu_policy_check(&d.cfg, "qevict+graphkv", 0, 128, 32, 8));
  d.cfg.omega = 4, d.cfg.quant.key_frame = KV_KEY_FRAME_POS; /* windows of 4: not pre-RoPE */
  CHECK(kv_gpu_policy_check(&d.cfg, "qevict+graphkv", 0, 128, 32, 8) == QE_EUNSUPPORTED &&
        !strncmp(qe_errmsg(), "policy.key_frame", 16));
  expect_gpu_policy("qevict", 0, 0, 8, 4, 4, "policy.name");    /* head_dim 8 */
  expect_gpu_policy("qevict", 0, 0, 128, 32, 2, "policy.name"); /* 16 query heads per KV head */
  expect_gpu_policy("qevict", 0, 0, 0, 0, 0, NULL);             /* geometry not checked */
}

int main(void) {
  check_worked_example();
  check_pyramid_shares();
  check_short_bounds();
  check_gpu_bounds();
  check_gpu_bounds_rule();
  check_gpu_policies();
  rand_model_spec_t llama_gqa = {1, 0 /* F32 */, 8, 2, 0, 2, 21};
  rand_model_spec_t qwen_mha = {2, 8 /* Q8_0 */, 8, 8, 1, 2, 5};
  check_model(&llama_gqa, 1);
  check_model(&qwen_mha, 0);
  return tu_done("test_kv_tiered");
}
