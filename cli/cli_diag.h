/* cli_diag: the diagnostics runs shared by `qevict generate --diagnostics` and `qevict eval`, on
 * the CPU or the GPU's tiered cache: a FullKV shadow (a tiered cache with the policy's windows at
 * a budget that holds everything, so that its windows align with the policy's) and the policy
 * teacher-forced on the shadow's tokens, both observed by kv_diag (see kv_diag.h). Single sequence,
 * slot 0, tensor parallelism 1. Not thread-safe: one thread per model. */
#ifndef QE_CLI_DIAG_H
#define QE_CLI_DIAG_H

#include "cli_policy.h"
#include "kv_diag.h"
#include "model_gen.h"

/* The shadow's policy for policy p on a model of head_dim: p's windows, sink and local region
 * under qevict's routing (cumulative scores, no GraphKV, no pyramid or pooling: what the GPU cache
 * runs too), budget fraction 1 and q 0, so that everything stays Full; no trace. 0, or the
 * errors of cli_policy_resolve; QE_EINVAL for FullKV (no windows). */
int cli_diag_shadow_policy(const cli_policy_t *p, int head_dim, cli_policy_t *out);

/* Builds the shadow cache of policy p (cli_diag_shadow_policy) for one sequence of up to capacity
 * tokens on be: the CPU's tiered cache, or the GPU's, whose windows then align with p's GPU
 * cache's. *out owned by the caller (kv_cache_destroy). Errors of cli_policy_make_cache
 * (QE_EUNSUPPORTED: windows the GPU cache does not take). */
int cli_diag_shadow_cache(const cli_policy_t *p, kern_backend_t *be, const model_t *m, int capacity,
                          kv_cache_t **out);

/* One observed run of s over slot 0 of the tiered cache kv, CPU or GPU (fn(ud, ...) sees every
 * observation; s->forced may name teacher-forced tokens). s->out is malloc'd by gen_run
 * (caller frees). Returns gen_run's result, or kv_cache_set_observer's error (QE_EUNSUPPORTED
 * for a cache without observations) before running. */
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
