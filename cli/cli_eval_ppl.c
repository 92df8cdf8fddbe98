/* cli_eval_ppl: the perplexity task of `qevict eval`: a window of L tokens of a real text
 * (BOS, then the text from a seeded offset) is prefilled up to L - N - 1 tokens and the rest are
 * teacher-forced one decode step at a time, so that each of the last N tokens is predicted by a
 * decode step after the policy routed, as while generating (the prefill's own prediction
 * attends the whole prompt under every policy). FullKV's logits are the reference: each
 * variant x budget reports its perplexity over the N tokens, the mean KL(FullKV || policy) of
 * the next-token distributions and how often both argmaxes agree (eval_ppl.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_eval.h"
#include "eval_ppl.h"
#include "qe_status.h"

/* Forward passes of seq[0..L-1) under a fresh cache of policy p (N + 1 < L): the first
 * L - N - 1 tokens in one batch (its logits, into lp's first row, are overwritten), then one
 * token per step; lp[i] (i < N) = the logits of the token at L - N + i. */
static int forced_logits(eval_ctx_t *x, const cli_policy_t *p, const int32_t *seq, int L, int N,
                         float *lp, kv_mem_stats_t *mem) {
  kv_cache_t *kv = NULL;
  int V = model_hparams(x->m)->n_vocab, P = L - N - 1;
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)L), *sid = calloc((size_t)L, sizeof(int32_t));
  int rc = pos && sid ? 0 : qe_errf(QE_ENOMEM, "eval: out of memory");
  for (int i = 0; !rc && i < L; i++) pos[i] = i;
  if (!rc) rc = cli_policy_make_cache(p, x->be, x->m, 1, L, NULL, &kv);
  int opened = !rc && !(rc = kv->ops->seq_open(kv, 0, L));
  model_batch_t b = {P, seq, pos, sid, NULL};
  if (!rc) rc = model_forward(x->m, kv, x->comm, &b, lp);
  for (int i = 0; !rc && i < N; i++) {
    b = (model_batch_t){1, seq + P + i, pos + P + i, sid, NULL};
    rc = model_forward(x->m, kv, x->comm, &b, lp + (size_t)i * V);
  }
  if (!rc && mem) cli_policy_mem_stats(kv, mem);
  if (opened) kv->ops->seq_close(kv, 0);
  kv_cache_destroy(kv);
  free(pos), free(sid);
  return rc;
}

static void ppl_progress(const eval_ctx_t *x, const eval_row_t *r) {
  const eval_cfg_t *c = x->cfg;
  if (c->quiet) return;
  fprintf(stderr, "eval: ppl len %d sample %d: %s @ %.0f%%: ", c->lengths[r->length], r->sample,
          r->variant < 0 ? "full" : c->variants[r->variant].label,
          r->budget < 0 ? 100.0 : 100 * c->budgets[r->budget]);
  if (r->error) fprintf(stderr, "%s\n", r->error);
  if (!r->error) fprintf(stderr, "ppl %.4f, KL %.5f (%.1f s)\n", r->ppl, r->kl, r->wall_s);
}

/* One variant x budget (v < 0: FullKV into ref) over the window seq. */
static int ppl_run(eval_ctx_t *x, int task, int length, int sample, int v, int b,
                   const int32_t *seq, int L, int N, float *ref, float *lp) {
  double t0 = cli_now_s();
  eval_row_t *r = eval_row_add(x->res, task, length, sample, v, b);
  if (!r) return qe_errf(QE_ENOMEM, "eval: out of memory");
  cli_policy_t p;
  cli_policy_init(&p);
  if (v >= 0) p = x->cfg->variants[v].pol, p.frac = x->cfg->budgets[b], p.bytes = 0;
  r->n_prompt = L - N - 1, r->n_out = N, r->compared = 1;
  int rc = forced_logits(x, &p, seq, L, N, v < 0 ? ref : lp, &r->mem);
  r->has_mem = !rc && v >= 0;
  eval_ppl_t s;
  if (!rc)
    rc = eval_ppl_score(v < 0 ? ref : lp, v < 0 ? NULL : ref, seq + L - N, N,
                        model_hparams(x->m)->n_vocab, &s);
  if (!rc) r->is_ppl = 1, r->n_scored = N, r->ppl = s.ppl, r->kl = s.kl, r->top1 = s.top1;
  r->wall_s = cli_now_s() - t0;
  if (rc) {
    int fatal = eval_row_error(r, rc);
    rc = v < 0 ? rc : fatal; /* FullKV failing is the engine's failure */
  }
  ppl_progress(x, r);
  return rc;
}

/* The window of sample `sample` at L tokens: BOS (if the model wants one), then the text from a
 * seeded offset. QE_EINVAL when the text is too short. */
static int ppl_window(const eval_ctx_t *x, int L, int sample, int32_t *seq) {
  const tok_t *tok = model_tok(x->m);
  int bos = tok_add_bos(tok) && tok_bos(tok) >= 0, need = L - bos;
  if (need > x->n_ppl_ids)
    return qe_errf(QE_EINVAL, "eval: ppl text has %d tokens, fewer than %d", x->n_ppl_ids, need);
  uint64_t h = eval_sample_seed(x->cfg->seed, EVAL_TASK_PPL, L, sample);
  int off = (int)(h % (uint64_t)(x->n_ppl_ids - need + 1));
  if (bos) seq[0] = tok_bos(tok);
  memcpy(seq + bos, x->ppl_ids + off, sizeof(int32_t) * (size_t)need);
  return 0;
}

int eval_run_ppl(eval_ctx_t *x, int task, int length, int sample) {
  const eval_cfg_t *c = x->cfg;
  int L = c->lengths[length], N = c->n_new ? c->n_new : EVAL_PPL_NEW;
  size_t V = (size_t)model_hparams(x->m)->n_vocab;
  int32_t *seq = malloc(sizeof(int32_t) * (size_t)L);
  float *ref = malloc(sizeof(float) * V * (size_t)N), *lp = malloc(sizeof(float) * V * (size_t)N);
  int rc = seq && ref && lp ? 0 : qe_errf(QE_ENOMEM, "eval: out of memory");
  if (!rc && N + 1 >= L)
    rc = qe_errf(QE_EINVAL, "eval: ppl needs more than %d tokens (got %d)", N + 1, L);
  if (!rc) rc = ppl_window(x, L, sample, seq);
  if (rc == QE_EINVAL) { /* reported as the FullKV row's error */
    eval_row_t *r = eval_row_add(x->res, task, length, sample, -1, -1);
    rc = r ? eval_row_error(r, rc) : QE_ENOMEM;
    if (r) ppl_progress(x, r);
    free(seq), free(ref), free(lp);
    return rc;
  }
  if (!rc) rc = ppl_run(x, task, length, sample, -1, -1, seq, L, N, ref, lp);
  for (int v = 0; !rc && v < c->n_variants; v++)
    for (int b = 0; !rc && b < c->n_budgets; b++)
      rc = ppl_run(x, task, length, sample, v, b, seq, L, N, ref, lp);
  free(seq), free(ref), free(lp);
  return rc;
}
