/* eval_ppl: the arithmetic of `qevict eval`'s perplexity task, apart from the model so that it
 * can be checked on made-up logits: perplexity of the scored tokens, the mean KL(FullKV ||
 * policy) of the next-token distributions over the whole vocabulary (natural log, nats) and
 * how often both argmaxes agree. Pure; thread-safe. */
#ifndef QE_EVAL_PPL_H
#define QE_EVAL_PPL_H

#include <stdint.h>

typedef struct {
  double ppl;  /* exp(mean over the rows of -log p(target)) */
  double kl;   /* mean over the rows of sum_v p_ref(v) (log p_ref(v) - log p(v)); 0 without ref */
  double top1; /* fraction of rows whose argmax (lowest id on ties) equals ref's */
} eval_ppl_t;

/* Scores n rows of raw logits lg[n][n_vocab] against the reference's ref[n][n_vocab] (NULL: no
 * reference, kl 0 and top1 1); target[n] are the tokens the rows predict. Log-softmax, KL and
 * log-probabilities are taken in double from the logits (no float rounding of the log-sum-exp).
 * A logit of -inf is a probability of 0 (its KL term is 0 where ref's is -inf; KL and
 * perplexity are +inf where only the scored row's is). QE_ERANGE (with a detail naming the
 * row) when a row holds NaN or +inf or only -inf; then *out is unchanged. */
int eval_ppl_score(const float *lg, const float *ref, const int32_t *target, int n, int n_vocab,
                   eval_ppl_t *out);

#endif
