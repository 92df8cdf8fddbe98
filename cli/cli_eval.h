/* cli_eval: `qevict eval`, the in-process evaluation of KV policies at matched persistent
 * bytes (issue 7). cli_eval.c parses the options and drives the grid, cli_eval_run.c runs one
 * sample (FullKV, then every policy variant x budget: greedy for accuracy and teacher-forced on
 * FullKV's tokens for the diagnostics) and the teacher-forced perplexity task,
 * cli_eval_report.c aggregates and writes the JSON and the markdown. Internal to cli/; one
 * thread. */
#ifndef QE_CLI_EVAL_H
#define QE_CLI_EVAL_H

#include <stdio.h>

#include "cli_policy.h"
#include "eval_tasks.h"
#include "kv_diag.h"
#include "model_gen.h"

#define EVAL_MAX_LIST 32
#define EVAL_TASK_PPL "ppl"
#define EVAL_PPL_NEW  64 /* tokens the ppl task scores without --new */

/* One policy configuration under evaluation (a policy, or an ablation of qevict). */
typedef struct {
  char label[64];   /* "h2o", "qevict q=0.3", "qevict+graphkv" */
  char name[48];    /* the registry name (pol.name points here) */
  cli_policy_t pol; /* overrides; frac is set per budget */
  int omega, sink;  /* resolved windows: runs with equal ones share a FullKV shadow */
  int ablation;     /* added by --ablations */
} eval_variant_t;

typedef struct {
  const char *model;
  const char *tasks[EVAL_MAX_LIST]; /* task names, EVAL_TASK_PPL included */
  int n_tasks;
  int lengths[EVAL_MAX_LIST], n_lengths;
  int samples, first_sample; /* samples first_sample .. first_sample + samples - 1 */
  eval_variant_t variants[EVAL_MAX_LIST];
  int n_variants;
  double budgets[EVAL_MAX_LIST]; /* fractions of FullKV bytes */
  int n_budgets;
  int n_new; /* max new tokens (0: each task's own; ppl: 64 scored tokens) */
  uint64_t seed;
  const char *json, *markdown, *ppl_text;
  int ablations, diag, all_samples, threads, quiet;
  int device;      /* --device: CUDA GPU (-1: the CPU backend) */
  int cpu_weights; /* --cpu-weights: the CPU backend's weights (KERN_WEIGHT_F32 or _PACKED) */
} eval_cfg_t;

/* One run: FullKV (variant -1) or a variant at a budget, on one sample. */
typedef struct {
  int task, length, sample; /* indexes into the configuration's lists */
  int variant, budget;      /* -1, -1 for FullKV */
  int n_prompt, n_out, finish;
  double score; /* eval_score of the greedy output (NaN for ppl) */
  int pass;     /* score == 1 */
  int compared; /* FullKV solved this sample, so it counts in the comparison */
  char *output; /* greedy text (malloc'd) */
  char *error;  /* why it did not run (malloc'd), e.g. a budget below the protected regions */
  int has_mem;
  kv_mem_stats_t mem; /* of the greedy run */
  int has_diag;
  kv_diag_result_t diag; /* teacher-forced on FullKV's tokens */
  long tf_promotions;    /* promotions in the teacher-forced run */
  int n_agree, n_forced; /* teacher-forced steps whose own greedy token equalled FullKV's */
  int shadow_agree;      /* the shadow's agreement with FullKV (equals n_forced when exact) */
  double *fmm_steps;     /* [n_steps] FMM of the events at length n_prompt + i (NaN: none) */
  double *fmm_fp_steps;  /* [n_steps] the same with INT2 counted as missed */
  int n_steps;
  int is_ppl;           /* perplexity rows: */
  double ppl, kl, top1; /* exp(mean NLL), mean KL(FullKV || this), argmax agreement */
  int n_scored;
  double wall_s; /* timing only: never part of the results */
} eval_row_t;

typedef struct {
  eval_row_t *rows;
  int n, cap;
  double load_s, total_s;
  int n_ctx;
  char model_name[128];
} eval_results_t;

/* What the runs share: the model and its backend, the prompt format, the results. */
typedef struct {
  const eval_cfg_t *cfg;
  model_t *m;
  kern_backend_t *be;
  tp_comm_t *comm;
  eval_fmt_t fmt;
  int32_t *ppl_ids; /* the perplexity text's tokens (no BOS), or NULL */
  int n_ppl_ids;
  eval_results_t *res;
} eval_ctx_t;

/* Appends a zeroed row with the given keys; NULL when out of memory. The pointer is valid
 * until the next append. */
eval_row_t *eval_row_add(eval_results_t *r, int task, int length, int sample, int variant,
                         int budget);
void eval_results_dispose(eval_results_t *r);
/* Records error rc with this thread's detail line in r->error; returns rc if it is fatal to
 * the whole evaluation (QE_ENOMEM), else 0. */
int eval_row_error(eval_row_t *r, int rc);

/* Runs every variant x budget on sample `sample` of task `task` at length index `length`,
 * FullKV first. A sample the generator cannot make at that length, or that does not fit the
 * context, becomes a FullKV row with an error; returns only fatal errors (QE_ENOMEM...). */
int eval_run_sample(eval_ctx_t *x, int task, int length, int sample);
/* The perplexity task: a window of the text teacher-forced under FullKV and every variant x
 * budget; the last n_new tokens are scored. */
int eval_run_ppl(eval_ctx_t *x, int task, int length, int sample);

/* Writes the whole result (config, runs, aggregates, timings) as one JSON object. */
void eval_report_json(const eval_cfg_t *c, const eval_results_t *r, FILE *f);
/* Writes the markdown tables. */
void eval_report_markdown(const eval_cfg_t *c, const eval_results_t *r, FILE *f);

#endif
