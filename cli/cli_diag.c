/* cli_diag: the FullKV shadow and the teacher-forced policy run of the diagnostics (see
 * cli_diag.h). */
#include "cli_diag.h"

#include "qe_status.h"

int cli_diag_shadow_policy(const cli_policy_t *p, int head_dim, cli_policy_t *out) {
  kv_policy_desc_t d;
  int rc = cli_policy_resolve(p, head_dim, &d);
  if (rc) return rc;
  if (d.full) return qe_errf(QE_EINVAL, "diagnostics: policy %s has no windows", p->name);
  cli_policy_init(out); /* qevict's routing, everything Full (q 0: no INT2 tier) */
  out->name = "qevict", out->q = 0.0f;
  out->omega = d.cfg.omega, out->sink = d.cfg.n_sink, out->local = d.cfg.n_local;
  return 0;
}

int cli_diag_shadow_cache(const cli_policy_t *p, kern_backend_t *be, const model_t *m, int capacity,
                          kv_cache_t **out) {
  cli_policy_t full;
  int rc = cli_diag_shadow_policy(p, model_hparams(m)->head_dim, &full);
  return rc ? rc : cli_policy_make_cache(&full, be, m, 1, capacity, NULL, out);
}

int cli_diag_observed_run(model_t *m, kv_cache_t *kv, tp_comm_t *c, const gen_opts_t *o,
                          kv_obs_fn fn, void *ud, gen_seq_t *s) {
  gen_stats_t st;
  int rc = kv_cache_set_observer(kv, fn, ud);
  if (!rc) rc = gen_run(m, kv, c, s, 1, o, &st);
  kv_cache_set_observer(kv, NULL, NULL);
  return rc;
}

int cli_diag_run(model_t *m, kern_backend_t *be, tp_comm_t *c, const cli_policy_t *p,
                 kv_cache_t *kv, int capacity, const gen_opts_t *o, gen_seq_t *sh, gen_seq_t *pol,
                 kv_diag_result_t *r) {
  kv_cache_t *shadow = NULL;
  kv_diag_t *d = NULL;
  int rc = cli_diag_shadow_cache(p, be, m, capacity, &shadow);
  if (!rc) rc = kv_diag_create(model_hparams(m)->n_layer, 32, 3, &d);
  if (!rc) rc = cli_diag_observed_run(m, shadow, c, o, kv_diag_observe_shadow, d, sh);
  pol->prompt = sh->prompt, pol->n_prompt = sh->n_prompt;
  pol->forced = sh->out, pol->n_forced = sh->n_out;
  if (!rc) rc = cli_diag_observed_run(m, kv, c, o, kv_diag_observe_policy, d, pol);
  if (!rc) rc = kv_diag_compute(d, r);
  kv_diag_destroy(d);
  kv_cache_destroy(shadow);
  return rc;
}
