/* eval_tasks: the synthetic long-context tasks of `qevict eval`, in the style of RULER:
 * seeded, self-contained (every word comes from generators in this folder, nothing is
 * downloaded), and sized in tokens of the model's own tokenizer. A sample is the whole prompt
 * as it is fed (the user message in the model's chat template, then an answer prefix that
 * starts the assistant's reply) and the strings a correct answer contains.
 *
 *   niah_single    one "special magic number" needle (7 digits) in generated filler prose;
 *   niah_multikey  four needles with different keys; the question names one of them;
 *   niah_multivalue four needles with the same key; every value must be given;
 *   vt             variable tracking: a chain of five assignments (VAR X = 12345, VAR Y =
 *                  VAR X, ...) scattered in filler; every variable of the chain must be named;
 *   cwe            common-word extraction: a numbered list of invented words where ten appear
 *                  far more often than the rest; the ten must be named;
 *   qa             a report about invented towns (eight facts each); one fact of one town is
 *                  asked (its good, dish, founding year or hall material).
 *
 * Scoring (eval_score): the fraction of a sample's answers found in the output, each matched
 * case-insensitively as a whole word (not preceded or followed by a letter or digit, so
 * "1234567" does not match inside "12345678"). A sample passes when the score is 1.
 * Everything here is deterministic: the same task, length, seed and tokenizer give the same
 * bytes. Thread-safe (no shared state). */
#ifndef QE_EVAL_TASKS_H
#define QE_EVAL_TASKS_H

#include <stdint.h>

#include "tokenizer.h"

#define EVAL_MAX_ANSWERS 16

/* How a prompt is rendered and measured. */
typedef struct {
  const tok_t *tok; /* borrowed: measures lengths and encodes the prompt */
  const gguf_t *g;  /* borrowed, may be NULL: the chat template's default system prompt */
  int chat_kind;    /* chat_kind_t; CHAT_NONE renders the plain text */
} eval_fmt_t;

/* One generated sample. Owned by the caller: eval_sample_dispose. */
typedef struct {
  char *text;   /* the prompt as fed: template, user message, answer prefix */
  int32_t *ids; /* [n_ids] its tokens (BOS as the model wants, special tokens parsed) */
  int n_ids;
  char *answers[EVAL_MAX_ANSWERS]; /* what a correct output contains */
  int n_answers;
  int units; /* filler units the length search settled on (sentences, list entries, facts) */
} eval_sample_t;

typedef struct eval_task eval_task_t;

/* A task by name; NULL if unknown. */
const eval_task_t *eval_task_find(const char *name);
/* NULL-terminated list of every task. */
const eval_task_t *const *eval_task_list(void);
const char *eval_task_name(const eval_task_t *t);
/* One line: what the task asks and how it is scored. */
const char *eval_task_rule(const eval_task_t *t);
/* Suggested max new tokens for an answer of this task. */
int eval_task_new_tokens(const eval_task_t *t);

/* Generates the sample of task t closest to n_tokens prompt tokens (ties: the shorter) for
 * seed. QE_EINVAL with a detail when even the shortest prompt of the task (no filler) is
 * longer than n_tokens; QE_ENOMEM; the tokenizer's errors. */
int eval_sample_make(const eval_task_t *t, const eval_fmt_t *f, int n_tokens, uint64_t seed,
                     eval_sample_t *out);
void eval_sample_dispose(eval_sample_t *s); /* NULL-safe; leaves *s zeroed */
/* *n: the tokens of task t's shortest prompt (no filler) for seed, the least n_tokens that
 * eval_sample_make takes; QE_ENOMEM, the tokenizer's errors. */
int eval_sample_min_tokens(const eval_task_t *t, const eval_fmt_t *f, uint64_t seed, int *n);

/* The seed of sample `index` of task `name` at `length` tokens under a run's seed: distinct
 * (with overwhelming probability) across tasks, lengths and indexes. */
uint64_t eval_sample_seed(uint64_t seed, const char *name, int length, int index);

/* Fraction of s's answers found in output (NUL-terminated) under the rule above, in [0, 1]. */
double eval_score(const eval_sample_t *s, const char *output);
/* Whether word occurs in text as a whole word, case-insensitively (ASCII folding). */
int eval_contains_word(const char *text, const char *word);

#endif
