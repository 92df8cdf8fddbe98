/* cli_diag: the diagnostics runs shared by `qevict generate --diagnostics` and `qevict eval`:
 * a FullKV shadow (the policy's own tiered cache at a budget that holds everything, so that its
 * windows align with the policy's) and the policy teacher-forced on the shadow's tokens, both
 * observed by kv_diag (see kv_diag.h). Single sequence, slot 0, tensor parallelism 1. Not
 * thread-safe: one thread per model. */
#ifndef QE_CLI_DIAG_H
#define QE_CLI_DIAG_H

#include "cli_policy.h"
#include "kv_diag.h"
#include "model_gen.h"

/* Builds the shadow cache of policy p for one sequence of up to capacity tokens: the same
 * windows, sink and local region, budget fraction 1 and q 0 (everything Full), no trace.
 * *out owned by the caller (kv_cache_destroy). Errors of cli_policy_make_cache. */
int cli_diag_shadow_cache(const cli_policy_t *p, kern_backend_t *be, const model_t *m, int capacity,
                          kv_cache_t **out);

/* One observed run of s over slot 0 of the tiered cache kv (fn(ud, ...) sees every
 * observation; s->forced may name teacher-forced tokens). s->out is malloc'd by gen_run
 * (caller frees). Returns gen_run's result. */
int cli_diag_observed_run(model_t *m, kv_cache_t *kv, tp_comm_t *c, const gen_opts_t *o,
                          kv_obs_fn fn, void *ud, gen_seq_t *s);

/* The whole of --diagnostics: the shadow of p generates s->prompt (teacher-forced on
 * sh->forced when given), then the policy's cache kv is teacher-forced on the shadow's tokens
 * (pol->prompt = sh->prompt). On success *r holds the diagnostics; sh->out and pol->out are
 * malloc'd (caller frees, also on failure). */
int cli_diag_run(model_t *m, kern_backend_t *be, tp_comm_t *c, const cli_policy_t *p,
                 kv_cache_t *kv, int capacity, const gen_opts_t *o, gen_seq_t *sh, gen_seq_t *pol,
                 kv_diag_result_t *r);

#endif
