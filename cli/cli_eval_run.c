/* cli_eval_run: the runs of one sample of `qevict eval` (see cli_eval.h). FullKV generates
 * greedily first: its output is scored and its tokens are the reference. Then, for each group
 * of variants with the same windows, one FullKV shadow (the diagnostics' aligned FullKV) is
 * teacher-forced on those tokens, and each variant x budget runs twice on a fresh cache:
 * greedily (accuracy, memory) and teacher-forced on FullKV's tokens (diagnostics). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_diag.h"
#include "cli_eval.h"
#include "qe_status.h"

eval_row_t *eval_row_add(eval_results_t *r, int task, int length, int sample, int variant,
                         int budget) {
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 64;
    eval_row_t *p = realloc(r->rows, sizeof *p * (size_t)cap);
    if (!p) return NULL;
    r->rows = p, r->cap = cap;
  }
  eval_row_t *row = &r->rows[r->n++];
  *row = (eval_row_t){.task = task,
                      .length = length,
                      .sample = sample,
                      .variant = variant,
                      .budget = budget,
                      .score = NAN,
                      .ppl = NAN,
                      .kl = NAN,
                      .top1 = NAN,
                      .shadow_agree = -1};
  return row;
}

void eval_results_dispose(eval_results_t *r) {
  for (int i = 0; i < r->n; i++) {
    eval_row_t *w = &r->rows[i];
    free(w->output), free(w->error), free(w->fmm_steps), free(w->fmm_fp_steps);
  }
  free(r->rows);
  *r = (eval_results_t){0};
}

int eval_row_error(eval_row_t *r, int rc) {
  const char *d = qe_errmsg();
  size_t n = strlen(d) + 64;
  free(r->error);
  if ((r->error = malloc(n))) snprintf(r->error, n, "%s%s%s", qe_strerror(rc), *d ? ": " : "", d);
  return rc == QE_ENOMEM ? rc : 0;
}

static void progress(const eval_ctx_t *x, const eval_row_t *r) {
  const eval_cfg_t *c = x->cfg;
  if (c->quiet) return;
  const char *who = r->variant < 0 ? "full" : c->variants[r->variant].label;
  double b = r->budget < 0 ? 1.0 : c->budgets[r->budget];
  fprintf(stderr, "eval: %s len %d sample %d: %s @ %.0f%%: ", c->tasks[r->task],
          c->lengths[r->length], r->sample, who, 100 * b);
  if (r->error)
    fprintf(stderr, "%s\n", r->error);
  else if (r->is_ppl)
    fprintf(stderr, "ppl %.4f kl %.4f (%.1f s)\n", r->ppl, r->kl, r->wall_s);
  else if (r->has_diag)
    fprintf(stderr, "score %.2f, FMM %.4f (%.1f s)\n", r->score, r->diag.fmm, r->wall_s);
  else
    fprintf(stderr, "score %.2f (%.1f s)\n", r->score, r->wall_s);
}

/* One run of a sample's prompt over a fresh cache of policy p: greedy, or teacher-forced on
 * forced[0..n_forced) when forced is given; observed by fn(ud) when fn is given (tiered
 * caches only). seq->out is malloc'd (caller frees). mem: the cache's final figures. */
static int run_once(eval_ctx_t *x, const cli_policy_t *p, const eval_sample_t *s, int n_new,
                    const int32_t *forced, int n_forced, kv_obs_fn fn, void *ud, gen_seq_t *seq,
                    kv_mem_stats_t *mem) {
  kv_cache_t *kv = NULL;
  gen_stats_t st;
  gen_opts_t o = {n_new, {0, 0, 1.0f}, 0, 0, NULL, NULL, NULL};
  *seq =
      (gen_seq_t){.prompt = s->ids, .n_prompt = s->n_ids, .forced = forced, .n_forced = n_forced};
  int rc = cli_policy_make_cache(p, x->be, x->m, 1, s->n_ids + n_new, NULL, &kv);
  if (rc) return rc;
  rc = fn ? cli_diag_observed_run(x->m, kv, x->comm, &o, fn, ud, seq)
          : gen_run(x->m, kv, x->comm, seq, 1, &o, &st);
  if (!rc && mem) cli_policy_mem_stats(kv, mem);
  kv_cache_destroy(kv);
  return rc;
}

/* Scores a finished greedy sequence into the row (its text kept). */
static int score_into(eval_ctx_t *x, const eval_sample_t *s, const gen_seq_t *g, eval_row_t *r) {
  char *text = NULL;
  int rc = tok_decode(model_tok(x->m), g->out, (size_t)g->n_out, 0, 0, &text);
  if (rc) return rc;
  r->n_out = g->n_out, r->finish = g->finish, r->output = text;
  r->score = eval_score(s, text);
  r->pass = r->score >= 1.0;
  return 0;
}

typedef struct {
  const eval_sample_t *s;
  int task, length, sample, n_new;
  gen_seq_t full; /* FullKV's greedy run: the reference tokens */
  int compared;
} eval_job_t;

/* The teacher-forced diagnostics run of a variant at a budget into row r (d holds the
 * shadow's observations). */
static int diag_into(eval_ctx_t *x, const eval_job_t *j, const cli_policy_t *p, kv_diag_t *d,
                     eval_row_t *r) {
  gen_seq_t g;
  kv_mem_stats_t mem = {0};
  kv_diag_clear_policy(d);
  int rc = run_once(x, p, j->s, j->n_new, j->full.out, j->full.n_out, kv_diag_observe_policy, d, &g,
                    &mem);
  if (!rc) rc = kv_diag_compute(d, &r->diag);
  r->n_steps = j->full.n_out + 1;
  if (!rc && (!(r->fmm_steps = malloc(sizeof(double) * (size_t)r->n_steps)) ||
              !(r->fmm_fp_steps = malloc(sizeof(double) * (size_t)r->n_steps))))
    rc = qe_errf(QE_ENOMEM, "eval: out of memory");
  if (!rc) {
    kv_diag_fmm_steps(d, j->s->n_ids, r->n_steps, 0, r->fmm_steps);
    kv_diag_fmm_steps(d, j->s->n_ids, r->n_steps, 1, r->fmm_fp_steps);
    r->has_diag = 1, r->n_agree = g.n_agree, r->n_forced = j->full.n_out;
    r->tf_promotions = mem.promotions;
  }
  free(g.out);
  return rc;
}

/* Variant v at budget b on the job's sample: greedy, then teacher-forced (when d). */
static int run_policy(eval_ctx_t *x, const eval_job_t *j, int v, int b, kv_diag_t *d,
                      int shadow_agree) {
  double t0 = cli_now_s();
  eval_row_t *r = eval_row_add(x->res, j->task, j->length, j->sample, v, b);
  if (!r) return qe_errf(QE_ENOMEM, "eval: out of memory");
  cli_policy_t p = x->cfg->variants[v].pol;
  p.frac = x->cfg->budgets[b], p.bytes = 0;
  r->n_prompt = j->s->n_ids, r->compared = j->compared, r->shadow_agree = shadow_agree;
  gen_seq_t g;
  int rc = run_once(x, &p, j->s, j->n_new, NULL, 0, NULL, NULL, &g, &r->mem);
  if (!rc) r->has_mem = 1, rc = score_into(x, j->s, &g, r);
  free(g.out);
  if (!rc && d) rc = diag_into(x, j, &p, d, r);
  r->wall_s = cli_now_s() - t0;
  rc = rc ? eval_row_error(r, rc) : 0;
  progress(x, r);
  return rc;
}

/* The shadow run of variant v0's windows into a new *d (caller destroys), teacher-forced on
 * FullKV's tokens; *agree: its agreement with them. Windows the GPU cache does not take leave *d
 * NULL (no diagnostics: the variants' own runs report the refusal). */
static int run_shadow(eval_ctx_t *x, const eval_job_t *j, int v0, kv_diag_t **d, int *agree) {
  gen_opts_t o = {j->n_new, {0, 0, 1.0f}, 0, 0, NULL, NULL, NULL};
  gen_seq_t sh = {.prompt = j->s->ids,
                  .n_prompt = j->s->n_ids,
                  .forced = j->full.out,
                  .n_forced = j->full.n_out};
  kv_cache_t *shadow = NULL;
  const cli_policy_t *p = &x->cfg->variants[v0].pol;
  int rc = cli_diag_shadow_cache(p, x->be, x->m, j->s->n_ids + j->n_new, &shadow);
  if (rc == QE_EUNSUPPORTED && !x->be->ops->host_memory) return 0;
  if (!rc) rc = kv_diag_create(model_hparams(x->m)->n_layer, 32, 3, d);
  if (!rc) rc = cli_diag_observed_run(x->m, shadow, x->comm, &o, kv_diag_observe_shadow, *d, &sh);
  *agree = rc ? -1 : sh.n_agree;
  free(sh.out);
  kv_cache_destroy(shadow);
  return rc; /* the shadow is FullKV itself: its failure is the engine's */
}

/* The variants [v0, n) whose windows match v0's share one shadow; done[] marks them. */
static int run_group(eval_ctx_t *x, const eval_job_t *j, int v0, int *done) {
  const eval_cfg_t *c = x->cfg;
  kv_diag_t *d = NULL;
  int rc = 0, shadow_agree = -1;
  if (c->diag && (rc = run_shadow(x, j, v0, &d, &shadow_agree))) {
    kv_diag_destroy(d);
    return rc;
  }
  for (int v = v0; !rc && v < c->n_variants; v++) {
    const eval_variant_t *a = &c->variants[v0], *b = &c->variants[v];
    if (done[v] || a->omega != b->omega || a->sink != b->sink) continue;
    done[v] = 1;
    for (int k = 0; !rc && k < c->n_budgets; k++) rc = run_policy(x, j, v, k, d, shadow_agree);
  }
  kv_diag_destroy(d);
  return rc;
}

/* FullKV's greedy run of the job's sample into a new row; j->full keeps its tokens. */
static int run_full(eval_ctx_t *x, eval_job_t *j) {
  double t0 = cli_now_s();
  eval_row_t *r = eval_row_add(x->res, j->task, j->length, j->sample, -1, -1);
  if (!r) return qe_errf(QE_ENOMEM, "eval: out of memory");
  cli_policy_t full;
  cli_policy_init(&full);
  r->n_prompt = j->s->n_ids;
  int rc = run_once(x, &full, j->s, j->n_new, NULL, 0, NULL, NULL, &j->full, NULL);
  if (!rc) rc = score_into(x, j->s, &j->full, r);
  r->compared = j->compared = !rc && r->pass;
  r->wall_s = cli_now_s() - t0;
  progress(x, r);
  return rc;
}

int eval_run_sample(eval_ctx_t *x, int task, int length, int sample) {
  const eval_cfg_t *c = x->cfg;
  const eval_task_t *t = eval_task_find(c->tasks[task]);
  int len = c->lengths[length];
  eval_sample_t s;
  eval_job_t j = {&s, task, length, sample, c->n_new ? c->n_new : eval_task_new_tokens(t), {0}, 0};
  int rc =
      eval_sample_make(t, &x->fmt, len, eval_sample_seed(c->seed, c->tasks[task], len, sample), &s);
  if (!rc && s.n_ids + j.n_new > x->res->n_ctx)
    rc = qe_errf(QE_EINVAL, "eval: %d prompt tokens + %d new exceed the context (%d)", s.n_ids,
                 j.n_new, x->res->n_ctx);
  if (rc == QE_EINVAL) { /* not a sample at this length: reported, not fatal */
    eval_row_t *r = eval_row_add(x->res, task, length, sample, -1, -1);
    rc = r ? eval_row_error(r, rc) : QE_ENOMEM;
    if (r) progress(x, r);
    eval_sample_dispose(&s);
    return rc;
  }
  if (!rc) rc = run_full(x, &j);
  int *done = calloc((size_t)c->n_variants + 1, sizeof(int));
  if (!done) rc = rc ? rc : qe_errf(QE_ENOMEM, "eval: out of memory");
  for (int v = 0; !rc && (j.compared || c->all_samples) && v < c->n_variants; v++)
    if (!done[v]) rc = run_group(x, &j, v, done);
  free(done);
  free(j.full.out);
  eval_sample_dispose(&s);
  return rc;
}
