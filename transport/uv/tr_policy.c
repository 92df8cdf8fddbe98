/* tr_policy: a worker.proto Policy resolved into a kv_policy_desc_t (see tr_policy.h). */
#include "tr_policy.h"

#include <stdio.h>
#include <string.h>

#include "graphkv.h"
#include "qe_status.h"

#define P(x) QEVICT__WORKER__V1__POLICY__##x

/* The first override p sets (its field's name), or NULL. */
static const char *first_override(const tr_policy_t *p) {
  return p->q_opt_case == P(Q_OPT_Q)                           ? "policy.q"
         : p->window_opt_case == P(WINDOW_OPT_WINDOW)          ? "policy.window"
         : p->bits_opt_case == P(BITS_OPT_BITS)                ? "policy.bits"
         : p->sink_opt_case == P(SINK_OPT_SINK)                ? "policy.sink"
         : p->local_opt_case == P(LOCAL_OPT_LOCAL)             ? "policy.local"
         : p->scorer && *p->scorer                             ? "policy.scorer"
         : p->graphkv_k_opt_case == P(GRAPHKV_K_OPT_GRAPHKV_K) ? "policy.graphkv.k"
         : p->graphkv_m_opt_case == P(GRAPHKV_M_OPT_GRAPHKV_M) ? "policy.graphkv.m"
         : p->graphkv_t_opt_case == P(GRAPHKV_T_OPT_GRAPHKV_T) ? "policy.graphkv.t"
                                                               : NULL;
}

/* The whole-number overrides past an int (a uint32 on the wire): QE_EINVAL naming the field. */
static int check_ranges(const tr_policy_t *p) {
  const struct {
    int set;
    uint32_t v;
    const char *field;
  } f[] = {{p->window_opt_case == P(WINDOW_OPT_WINDOW), p->window, "policy.window"},
           {p->bits_opt_case == P(BITS_OPT_BITS), p->bits, "policy.bits"},
           {p->sink_opt_case == P(SINK_OPT_SINK), p->sink, "policy.sink"},
           {p->local_opt_case == P(LOCAL_OPT_LOCAL), p->local, "policy.local"},
           {p->graphkv_m_opt_case == P(GRAPHKV_M_OPT_GRAPHKV_M), p->graphkv_m, "policy.graphkv.m"},
           {p->graphkv_t_opt_case == P(GRAPHKV_T_OPT_GRAPHKV_T), p->graphkv_t, "policy.graphkv.t"}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].set && f[i].v > (1u << 24))
      return qe_errf(QE_EINVAL, "%s: %u is out of range", f[i].field, f[i].v);
  return 0;
}

/* The overrides' own ranges, each named by its field path (kv_policy_check words them for the
 * command line): QE_EINVAL. */
static int check_values(const tr_policy_t *p) {
  if (p->q_opt_case == P(Q_OPT_Q) && !(p->q >= 0.0f && p->q <= 1.0f))
    return qe_errf(QE_EINVAL, "policy.q: must be in [0, 1] (got %g)", (double)p->q);
  if (p->window_opt_case == P(WINDOW_OPT_WINDOW) && (p->window < 1 || p->window > 256))
    return qe_errf(QE_EINVAL, "policy.window: must be in [1, 256] (got %u)", p->window);
  if (p->bits_opt_case == P(BITS_OPT_BITS) && p->bits != 2 && p->bits != 4 && p->bits != 8)
    return qe_errf(QE_EINVAL, "policy.bits: must be 2, 4 or 8 (got %u)", p->bits);
  if (p->graphkv_k_opt_case == P(GRAPHKV_K_OPT_GRAPHKV_K) &&
      !(p->graphkv_k > 0.0f && p->graphkv_k <= 1.0f))
    return qe_errf(QE_EINVAL, "policy.graphkv.k: must be in (0, 1] (got %g)", (double)p->graphkv_k);
  if (p->graphkv_m_opt_case == P(GRAPHKV_M_OPT_GRAPHKV_M) && p->graphkv_m < 1)
    return qe_errf(QE_EINVAL, "policy.graphkv.m: must be >= 1 (got %u)", p->graphkv_m);
  if (p->graphkv_t_opt_case == P(GRAPHKV_T_OPT_GRAPHKV_T) &&
      (p->graphkv_t < 1 || p->graphkv_t > GRAPHKV_MAX_ROUNDS))
    return qe_errf(QE_EINVAL, "policy.graphkv.t: must be in 1..%d (got %u)", GRAPHKV_MAX_ROUNDS,
                   p->graphkv_t);
  return 0;
}

static void apply_overrides(const tr_policy_t *p, kv_policy_cfg_t *c) {
  if (p->q_opt_case == P(Q_OPT_Q)) c->q = p->q;
  if (p->window_opt_case == P(WINDOW_OPT_WINDOW)) c->omega = (int)p->window;
  if (p->bits_opt_case == P(BITS_OPT_BITS)) c->quant.bits = (int)p->bits;
  if (p->sink_opt_case == P(SINK_OPT_SINK)) c->n_sink = (int)p->sink;
  if (p->local_opt_case == P(LOCAL_OPT_LOCAL)) c->n_local = (int)p->local;
  if (p->graphkv_k_opt_case == P(GRAPHKV_K_OPT_GRAPHKV_K)) c->gkv.source_frac = p->graphkv_k;
  if (p->graphkv_m_opt_case == P(GRAPHKV_M_OPT_GRAPHKV_M)) c->gkv.m = (int)p->graphkv_m;
  if (p->graphkv_t_opt_case == P(GRAPHKV_T_OPT_GRAPHKV_T)) c->gkv.rounds = (int)p->graphkv_t;
}

static int scorer_of(const char *name, int *out) {
  static const char *names[] = {"cumulative", "decayed", "pnorm", "knorm", "recency", "prefill"};
  for (int i = 0; i < 6; i++)
    if (!strcmp(name, names[i])) return *out = i, 0;
  return qe_errf(QE_EINVAL,
                 "policy.scorer: unknown scorer '%.32s' (cumulative, decayed, pnorm, "
                 "knorm, recency, prefill)",
                 name);
}

/* A name kv_policy_find does not know: NAME+graphkv of a known policy without token scores
 * (kivi, streaming) says so, as policy.graphkv's refusal does; anything else is unknown. */
static int unknown_policy(const char *name) {
  const char *plus = strstr(name, "+graphkv");
  char base[96];
  kv_policy_desc_t d;
  snprintf(base, sizeof base, "%.*s", plus ? (int)(plus - name) : 0, name);
  if (plus && !plus[8] && !kv_policy_find(base, &d))
    return qe_errf(QE_EINVAL, "policy.name: policy %s has no token scores for GraphKV to re-score",
                   base);
  return qe_errf(QE_EINVAL, "policy.name: unknown policy '%s'", name);
}

int tr_policy_resolve(const tr_policy_t *p, int head_dim, kv_policy_desc_t *out) {
  const char *base = p && p->name && *p->name ? p->name : "full";
  int graphkv = p && p->graphkv && !strstr(base, "+graphkv");
  char name[96];
  if (strlen(base) > 64) return qe_errf(QE_EINVAL, "policy.name: longer than 64 bytes");
  snprintf(name, sizeof name, "%s%s", base, graphkv ? "+graphkv" : "");
  if (graphkv && !kv_policy_find(base, out) && kv_policy_find(name, out))
    return qe_errf(QE_EINVAL, /* (a known policy that GraphKV cannot re-score) */
                   "policy.graphkv: policy %s has no token scores for GraphKV to re-score", base);
  if (kv_policy_find(name, out)) return unknown_policy(name);
  if (!p) return 0;
  const char *over = out->full ? first_override(p) : NULL;
  if (over)
    return qe_errf(QE_EINVAL,
                   "%s: policy full keeps every token at full precision and takes no "
                   "cache options",
                   over);
  if (out->full) return 0;
  if (check_ranges(p) || check_values(p)) return QE_EINVAL;
  kv_policy_cfg_t *c = &out->cfg;
  apply_overrides(p, c);
  if (p->bits_opt_case == P(BITS_OPT_BITS) && c->q == 0.0f)
    return qe_errf(QE_EINVAL,
                   "policy.bits: policy %s keeps no quantized windows (its q is 0); "
                   "set policy.q above 0 too",
                   name);
  if (p->scorer && *p->scorer && scorer_of(p->scorer, &c->scorer)) return QE_EINVAL;
  *c = kv_policy_fit(c, head_dim);
  int rc = kv_policy_check(c, head_dim);
  if (rc) {
    char d[200];
    snprintf(d, sizeof d, "%s", qe_errmsg());
    return qe_errf(rc, "%s%s", strncmp(d, "policy", 6) ? "policy: " : "", d);
  }
  return 0;
}
