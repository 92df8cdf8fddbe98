/* cli_eval_report: the results of `qevict eval` as one JSON object (config, runs, aggregated
 * table, FullKV per task, timings apart) and as markdown tables. Aggregates: accuracy is the
 * mean score over the samples FullKV solved (the others are left out of the comparison; FullKV
 * itself thus scores 1 wherever it solved one, and its mean over every sample is mean_score); the
 * diagnostics and memory figures are means over every run that has them; per task they pool
 * every length, and the average over tasks is the mean of the per-task means (tasks FullKV
 * fails entirely have no accuracy and do not enter it). A mean is over the finite values: each
 * one left out (a KL of +inf, a NaN, a diagnostic undefined on its run: kv_diag_result_t's count
 * for it 0, counted apart from NaN, the value it has) is counted and reported beside it, in the
 * JSON's left_out and in the markdown's cell; the average over tasks reports the sum of its
 * tasks' counts. Nothing timed enters the results. */
#include <math.h>
#include <string.h>

#include "cli_eval.h"
#include "qe_json.h"

typedef struct {
  double sum;           /* of the n finite values */
  long n;               /* finite values */
  long inf, nan, undef; /* values left out: infinite, NaN, a diagnostic undefined on its run */
} eval_acc_t;

enum {
  A_SCORE,
  A_ALL,
  A_FMM,
  A_CHURN,
  A_LIR,
  A_TTR,
  A_QSA,
  A_RATIO,
  A_PROMO,
  A_AGREE,
  A_BYTES,
  A_PPL,
  A_KL,
  A_TOP1,
  A_N
};
static const char *acc_names[A_N] = {[A_SCORE] = "accuracy",
                                     [A_ALL] = "mean_score",
                                     [A_FMM] = "fmm",
                                     [A_CHURN] = "churn",
                                     [A_LIR] = "global_lir",
                                     [A_TTR] = "ttr_median",
                                     [A_QSA] = "qsa",
                                     [A_RATIO] = "int2_mass_ratio",
                                     [A_PROMO] = "promotions",
                                     [A_AGREE] = "agreement",
                                     [A_BYTES] = "bytes_over_budget",
                                     [A_PPL] = "ppl",
                                     [A_KL] = "kl",
                                     [A_TOP1] = "top1"};

typedef struct {
  eval_acc_t a[A_N];
  long rows, errors, passed;
} eval_cell_t;

static void add(eval_acc_t *a, double v) {
  if (isfinite(v))
    a->sum += v, a->n++;
  else
    isnan(v) ? a->nan++ : a->inf++;
}
/* A diagnostic's value, or its run's undefined one (defined: 0). */
static void add_diag(eval_acc_t *a, double v, int defined) {
  if (defined)
    add(a, v);
  else
    a->undef++;
}
static double mean(const eval_acc_t *a) { return a->n ? a->sum / (double)a->n : NAN; }
static long left_out(const eval_acc_t *a) { return a->inf + a->nan + a->undef; }

/* A row's diagnostics in the order A_FMM..A_RATIO, then agreement (A_AGREE), as v, and whether
 * each is defined on the run (its count not 0) as def. */
enum { N_DIAG = A_RATIO - A_FMM + 2 };
static void diag_values(const eval_row_t *r, double *v, int *def) {
  const kv_diag_result_t *d = &r->diag;
  const double x[N_DIAG] = {d->fmm,
                            d->churn,
                            d->lir,
                            d->ttr_median,
                            d->qsa,
                            d->int2_mass_ratio,
                            r->n_forced ? (double)r->n_agree / r->n_forced : NAN};
  const int y[N_DIAG] = {d->fmm_events > 0,   d->churn_pairs > 0, d->lir_eligible > 0,
                         d->lir_returned > 0, d->qsa_events > 0,  d->int2_full_mass != 0,
                         r->n_forced > 0};
  memcpy(v, x, sizeof x), memcpy(def, y, sizeof y);
}
static int diag_acc(int i) { return i < N_DIAG - 1 ? A_FMM + i : A_AGREE; }

static void add_row(const eval_row_t *r, eval_cell_t *c) {
  c->rows++;
  if (r->error) {
    c->errors++;
    return;
  }
  c->passed += r->pass;
  if (r->is_ppl) {
    add(&c->a[A_PPL], r->ppl), add(&c->a[A_KL], r->kl), add(&c->a[A_TOP1], r->top1);
  } else {
    add(&c->a[A_ALL], r->score);
    if (r->compared) add(&c->a[A_SCORE], r->score);
  }
  if (r->has_mem && r->mem.budget) add(&c->a[A_BYTES], (double)r->mem.peak_bytes / r->mem.budget);
  if (!r->has_diag) return;
  double v[N_DIAG];
  int def[N_DIAG];
  diag_values(r, v, def);
  for (int i = 0; i < N_DIAG - 1; i++) add_diag(&c->a[diag_acc(i)], v[i], def[i]);
  add(&c->a[A_PROMO], (double)r->tf_promotions);
  if (r->n_forced) add(&c->a[A_AGREE], v[N_DIAG - 1]);
}

/* The cell of task t (length index l, -1: all), variant v, budget b (-1, -1: FullKV). */
static eval_cell_t cell_of(const eval_results_t *res, int t, int l, int v, int b) {
  eval_cell_t c = {0};
  for (int i = 0; i < res->n; i++) {
    const eval_row_t *r = &res->rows[i];
    if (r->task == t && (l < 0 || r->length == l) && r->variant == v && r->budget == b)
      add_row(r, &c);
  }
  return c;
}

static int is_ppl(const eval_cfg_t *c, int t) { return !strcmp(c->tasks[t], EVAL_TASK_PPL); }

/* A task FullKV fails on every sample it ran (perplexity is never excluded). */
static int excluded(const eval_cfg_t *c, const eval_results_t *r, int t) {
  if (is_ppl(c, t)) return 0;
  eval_cell_t f = cell_of(r, t, -1, -1, -1);
  return f.passed == 0;
}

/* Over the non-excluded generation tasks: the per-task means of aggregate k (n: the tasks
 * with one) and the sums of the values they left out. */
static eval_acc_t over_tasks(const eval_cfg_t *c, const eval_results_t *r, int v, int b, int k) {
  eval_acc_t m = {0};
  for (int t = 0; t < c->n_tasks; t++) {
    if (is_ppl(c, t) || excluded(c, r, t)) continue;
    eval_cell_t cell = cell_of(r, t, -1, v, b);
    const eval_acc_t *a = &cell.a[k];
    if (a->n) m.sum += mean(a), m.n++;
    m.inf += a->inf, m.nan += a->nan, m.undef += a->undef;
  }
  return m;
}

/* Whether aggregate k belongs to the entry of task t (t < 0: the average over tasks). */
static int shown(const eval_cfg_t *c, int t, int k) {
  if (k >= A_PPL) return t >= 0 && is_ppl(c, t);
  return t < 0 || !is_ppl(c, t) || k == A_BYTES;
}

static const char *label(const eval_cfg_t *c, int v) {
  return v < 0 ? "full" : c->variants[v].label;
}
static double budget(const eval_cfg_t *c, int b) { return b < 0 ? 1.0 : c->budgets[b]; }

/* ---- JSON -------------------------------------------------------------------------------- */

static void jstr(FILE *f, const char *s) { qe_json_str(f, s ? s : "", s ? strlen(s) : 0); }

static void json_config(const eval_cfg_t *c, const eval_results_t *r, FILE *f) {
  fprintf(f, "{\"model\":");
  jstr(f, r->model_name);
  fprintf(f, ",\"n_ctx\":%d,\"tasks\":[", r->n_ctx);
  for (int t = 0; t < c->n_tasks; t++) {
    const eval_task_t *et = eval_task_find(c->tasks[t]);
    fprintf(f, "%s{\"name\":", t ? "," : "");
    jstr(f, c->tasks[t]);
    fprintf(f, ",\"rule\":");
    jstr(f, et ? eval_task_rule(et)
               : "teacher-forced perplexity of the last new tokens, KL(FullKV || policy)");
    fprintf(f, "}");
  }
  fprintf(f, "],\"lengths\":[");
  for (int i = 0; i < c->n_lengths; i++) fprintf(f, "%s%d", i ? "," : "", c->lengths[i]);
  fprintf(f, "],\"samples\":%d,\"first_sample\":%d,\"budgets\":[", c->samples, c->first_sample);
  for (int i = 0; i < c->n_budgets; i++) fprintf(f, "%s%g", i ? "," : "", c->budgets[i]);
  fprintf(f, "],\"policies\":[");
  for (int v = 0; v < c->n_variants; v++) {
    const eval_variant_t *a = &c->variants[v];
    fprintf(f, "%s{\"label\":", v ? "," : "");
    jstr(f, a->label);
    fprintf(f, ",\"policy\":");
    jstr(f, a->name);
    fprintf(f, ",\"window\":%d,\"sink\":%d,\"ablation\":%s}", a->omega, a->sink,
            a->ablation ? "true" : "false");
  }
  fprintf(f,
          "],\"new_tokens\":%d,\"seed\":%llu,\"diagnostics\":%s,\"all_samples\":%s,"
          "\"threads\":%d,\"device\":%d,\"ppl_text\":",
          c->n_new, (unsigned long long)c->seed, c->diag ? "true" : "false",
          c->all_samples ? "true" : "false", c->threads, c->device);
  jstr(f, c->ppl_text);
  fprintf(f, "}");
}

static void json_steps(FILE *f, const double *v, int n) {
  fputc('[', f);
  for (int i = 0; i < n; i++) {
    if (i) fputc(',', f);
    qe_json_num(f, v[i]);
  }
  fputc(']', f);
}

static void json_mem(const kv_mem_stats_t *m, FILE *f) {
  fprintf(f,
          ",\"memory\":{\"budget_bytes\":%zu,\"bytes\":%zu,\"peak_bytes\":%zu,\"full_bytes\":%zu,"
          "\"int2_bytes\":%zu,\"windows_full\":%ld,\"windows_int2\":%ld,\"windows_evicted\":%ld,"
          "\"promotions\":%ld,\"demotions\":%ld,\"evictions\":%ld,\"routing_events\":%ld}",
          m->budget, m->bytes, m->peak_bytes, m->full_bytes, m->int2_bytes, m->windows[0],
          m->windows[1], m->windows[2], m->promotions, m->demotions, m->evictions,
          m->routing_events);
}

/* What a row's null stands for: "inf", "-inf", "nan" or "undefined" (a diagnostic undefined on
 * its run); NULL for a number. */
static const char *null_kind(double v, int defined) {
  if (isfinite(v)) return NULL;
  if (!defined) return "undefined";
  return isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

/* ,"nulls":{"kl":"inf",...}: what each of the n values v (keys k, defined d) written as null
 * stands for; nothing when all are numbers. */
static void json_nulls(FILE *f, const char *const *k, const double *v, const int *d, int n) {
  int w = 0;
  for (int i = 0; i < n; i++) {
    const char *s = null_kind(v[i], d[i]);
    if (s) fprintf(f, "%s\"%s\":\"%s\"", w++ ? "," : ",\"nulls\":{", k[i], s);
  }
  if (w) fputc('}', f);
}

static void json_diag(const eval_row_t *r, FILE *f) {
  const kv_diag_result_t *d = &r->diag;
  double v[N_DIAG];
  int def[N_DIAG];
  const char *k[N_DIAG];
  diag_values(r, v, def);
  fprintf(f,
          ",\"diagnostics\":{\"routing_events\":%ld,\"lir_eligible\":%ld,\"promotions\":%ld,"
          "\"forced\":%d,\"shadow_agreement\":%d",
          d->events, d->lir_eligible, r->tf_promotions, r->n_forced, r->shadow_agree);
  for (int i = 0; i < N_DIAG; i++) {
    k[i] = acc_names[diag_acc(i)];
    fprintf(f, ",\"%s\":", k[i]);
    qe_json_num(f, v[i]);
  }
  json_nulls(f, k, v, def, N_DIAG);
  fprintf(f, ",\"fmm_steps\":");
  json_steps(f, r->fmm_steps, r->n_steps);
  fprintf(f, ",\"fmm_fp_steps\":");
  json_steps(f, r->fmm_fp_steps, r->n_steps);
  fprintf(f, "}");
}

static void json_row(const eval_cfg_t *c, const eval_row_t *r, FILE *f) {
  fprintf(f, "{\"task\":");
  jstr(f, c->tasks[r->task]);
  fprintf(f, ",\"length\":%d,\"sample\":%d,\"policy\":", c->lengths[r->length], r->sample);
  jstr(f, label(c, r->variant));
  fprintf(f, ",\"budget\":%g,\"n_prompt\":%d,\"n_out\":%d,\"compared\":%s", budget(c, r->budget),
          r->n_prompt, r->n_out, r->compared ? "true" : "false");
  if (r->error) {
    fprintf(f, ",\"error\":");
    jstr(f, r->error);
  }
  if (r->is_ppl) {
    fprintf(f, ",\"ppl\":");
    qe_json_num(f, r->ppl);
    fprintf(f, ",\"kl\":");
    qe_json_num(f, r->kl);
    fprintf(f, ",\"top1\":");
    qe_json_num(f, r->top1);
    const char *k[] = {"ppl", "kl", "top1"};
    json_nulls(f, k, (const double[]){r->ppl, r->kl, r->top1}, (const int[]){1, 1, 1}, 3);
  } else if (!r->error) {
    fprintf(f, ",\"score\":");
    qe_json_num(f, r->score);
    json_nulls(f, (const char *const[]){"score"}, &r->score, (const int[]){1}, 1);
    fprintf(f, ",\"pass\":%s,\"output\":", r->pass ? "true" : "false");
    jstr(f, r->output);
  }
  if (r->has_mem) json_mem(&r->mem, f);
  if (r->has_diag) json_diag(r, f);
  fprintf(f, "}");
}

/* ,"left_out":{"kl":{"inf":1,"nan":0,"undefined":0},...}: the values the means of task t's
 * entry left out ("undefined": diagnostics undefined on their runs, not counted as NaN). */
static void json_left_out(const eval_cfg_t *c, int t, const eval_acc_t *a, FILE *f) {
  fprintf(f, ",\"left_out\":{");
  for (int k = 0, n = 0; k < A_N; k++)
    if (shown(c, t, k) && left_out(&a[k]))
      fprintf(f, "%s\"%s\":{\"inf\":%ld,\"nan\":%ld,\"undefined\":%ld}", n++ ? "," : "",
              acc_names[k], a[k].inf, a[k].nan, a[k].undef);
  fprintf(f, "}");
}

/* One aggregate entry (t < 0: the average over tasks). */
static void json_cell(const eval_cfg_t *c, const eval_results_t *r, int t, int l, int v, int b,
                      FILE *f) {
  fprintf(f, "{\"task\":");
  if (t < 0) fprintf(f, "\"average\"");
  if (t >= 0) jstr(f, c->tasks[t]);
  fprintf(f, ",\"length\":");
  if (l < 0) fprintf(f, "null");
  if (l >= 0) fprintf(f, "%d", c->lengths[l]);
  fprintf(f, ",\"policy\":");
  jstr(f, label(c, v));
  fprintf(f, ",\"budget\":%g", budget(c, b));
  eval_cell_t cell = t >= 0 ? cell_of(r, t, l, v, b) : (eval_cell_t){0};
  if (t >= 0)
    fprintf(f, ",\"runs\":%ld,\"errors\":%ld,\"passed\":%ld,\"compared\":%ld", cell.rows,
            cell.errors, cell.passed, cell.a[A_SCORE].n);
  for (int k = 0; k < A_N && t < 0; k++) cell.a[k] = over_tasks(c, r, v, b, k);
  for (int k = 0; k < A_N; k++) {
    if (!shown(c, t, k)) continue;
    fprintf(f, ",\"%s\":", acc_names[k]);
    qe_json_num(f, mean(&cell.a[k]));
  }
  json_left_out(c, t, cell.a, f);
  if (t < 0) fprintf(f, ",\"tasks\":%ld", cell.a[A_SCORE].n);
  fprintf(f, "}");
}

static void json_table(const eval_cfg_t *c, const eval_results_t *r, FILE *f) {
  int first = 1;
  for (int v = -1; v < c->n_variants; v++)
    for (int b = v < 0 ? -1 : 0; b < (v < 0 ? 0 : c->n_budgets); b++)
      for (int t = -1; t < c->n_tasks; t++)
        for (int l = -1; l < (t < 0 ? 0 : c->n_lengths); l++) {
          fprintf(f, "%s", first ? "" : ",\n");
          first = 0;
          json_cell(c, r, t, l, v, b, f);
        }
}

void eval_report_json(const eval_cfg_t *c, const eval_results_t *r, FILE *f) {
  fprintf(f, "{\"config\":");
  json_config(c, r, f);
  fprintf(f, ",\n\"excluded_tasks\":[");
  for (int t = 0, n = 0; t < c->n_tasks; t++)
    if (excluded(c, r, t)) fprintf(f, "%s", n++ ? "," : ""), jstr(f, c->tasks[t]);
  fprintf(f, "],\n\"runs\":[\n");
  for (int i = 0; i < r->n; i++) {
    json_row(c, &r->rows[i], f);
    fprintf(f, "%s\n", i + 1 < r->n ? "," : "");
  }
  fprintf(f, "],\n\"table\":[\n");
  json_table(c, r, f);
  fprintf(f, "],\n\"timings\":{\"load_s\":%.3f,\"total_s\":%.3f,\"runs_s\":[", r->load_s,
          r->total_s);
  for (int i = 0; i < r->n; i++) fprintf(f, "%s%.3f", i ? "," : "", r->rows[i].wall_s);
  fprintf(f, "]}}\n");
}

/* ---- markdown ---------------------------------------------------------------------------- */

static void md_num(FILE *f, double v, const char *fmt) {
  if (isfinite(v))
    fprintf(f, fmt, v);
  else
    fprintf(f, "n/a");
}

/* The mean of a, then the values it left out: "0.123 (2 inf, 1 NaN, 3 undefined left out)". */
static void md_mean(FILE *f, const eval_acc_t *a, const char *fmt) {
  md_num(f, mean(a), fmt);
  if (!left_out(a)) return;
  const long n[3] = {a->inf, a->nan, a->undef};
  const char *what[3] = {"inf", "NaN", "undefined"};
  fprintf(f, " (");
  for (int i = 0, k = 0; i < 3; i++)
    if (n[i]) fprintf(f, "%s%ld %s", k++ ? ", " : "", n[i], what[i]);
  fprintf(f, " left out)");
}

static void md_fullkv(const eval_cfg_t *c, const eval_results_t *r, FILE *f) {
  fprintf(f, "FullKV on every sample (a sample FullKV fails is left out of the comparison; a "
             "task it fails everywhere is excluded):\n\n| task | length | FullKV passed | FullKV "
             "mean score | errors |\n|---|---|---|---|---|\n");
  for (int t = 0; t < c->n_tasks; t++)
    for (int l = 0; l < c->n_lengths; l++) {
      if (is_ppl(c, t)) continue;
      eval_cell_t cell = cell_of(r, t, l, -1, -1);
      fprintf(f, "| %s | %d | %ld / %ld | ", c->tasks[t], c->lengths[l], cell.passed, cell.rows);
      md_mean(f, &cell.a[A_ALL], "%.3f");
      fprintf(f, " | %ld |\n", cell.errors);
    }
  fprintf(f, "\nExcluded (FullKV solves no sample):");
  int n = 0;
  for (int t = 0; t < c->n_tasks; t++)
    if (excluded(c, r, t)) fprintf(f, "%s %s", n++ ? "," : "", c->tasks[t]);
  fprintf(f, "%s\n\n", n ? "" : " none");
}

static void md_accuracy(const eval_cfg_t *c, const eval_results_t *r, FILE *f) {
  fprintf(f, "Accuracy on the samples FullKV solves (mean score) and FMM (H = 32), per task "
             "over all lengths:\n\n| policy | budget |");
  for (int t = 0; t < c->n_tasks; t++)
    if (!is_ppl(c, t)) fprintf(f, " %s acc | FMM |", c->tasks[t]);
  fprintf(f, " mean acc | mean FMM |\n|---|---|");
  for (int t = 0; t < c->n_tasks; t++)
    if (!is_ppl(c, t)) fprintf(f, "---|---|");
  fprintf(f, "---|---|\n");
  for (int v = -1; v < c->n_variants; v++)
    for (int b = v < 0 ? -1 : 0; b < (v < 0 ? 0 : c->n_budgets); b++) {
      fprintf(f, "| %s | %g%% |", label(c, v), 100 * budget(c, b));
      for (int t = 0; t < c->n_tasks; t++) {
        if (is_ppl(c, t)) continue;
        eval_cell_t cell = cell_of(r, t, -1, v, b);
        fprintf(f, " ");
        if (excluded(c, r, t)) cell.a[A_SCORE] = (eval_acc_t){0};
        md_mean(f, &cell.a[A_SCORE], "%.3f");
        fprintf(f, " | ");
        md_mean(f, &cell.a[A_FMM], "%.4f");
        fprintf(f, " |");
      }
      eval_acc_t acc = over_tasks(c, r, v, b, A_SCORE), fmm = over_tasks(c, r, v, b, A_FMM);
      fprintf(f, " ");
      md_mean(f, &acc, "%.3f");
      fprintf(f, " | ");
      md_mean(f, &fmm, "%.4f");
      fprintf(f, " |\n");
    }
  fprintf(f, "\n");
}

static void md_diag(const eval_cfg_t *c, const eval_results_t *r, FILE *f) {
  fprintf(f, "Mechanism diagnostics, means over the generation tasks' runs (teacher-forced on "
             "FullKV's tokens):\n\n| policy | budget | peak bytes / budget | FMM | churn | "
             "Global LIR | TTR | QSA | INT2 mass ratio | promotions | agreement | errors |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int v = 0; v < c->n_variants; v++)
    for (int b = 0; b < c->n_budgets; b++) {
      eval_cell_t all = {0};
      for (int i = 0; i < r->n; i++)
        if (r->rows[i].variant == v && r->rows[i].budget == b && !r->rows[i].is_ppl)
          add_row(&r->rows[i], &all);
      fprintf(f, "| %s | %g%% |", label(c, v), 100 * budget(c, b));
      const int ks[] = {A_BYTES, A_FMM, A_CHURN, A_LIR, A_TTR, A_QSA, A_RATIO, A_PROMO, A_AGREE};
      const char *fm[] = {"%.3f", "%.4f", "%.4f", "%.4f", "%.1f", "%.4f", "%.4f", "%.1f", "%.3f"};
      for (int i = 0; i < 9; i++) {
        fprintf(f, " ");
        md_mean(f, &all.a[ks[i]], fm[i]);
        fprintf(f, " |");
      }
      fprintf(f, " %ld |\n", all.errors);
    }
  fprintf(f, "\n");
}

static void md_ppl(const eval_cfg_t *c, const eval_results_t *r, int t, FILE *f) {
  fprintf(f,
          "Perplexity of the last scored tokens, teacher-forced on `%s`:\n\n| policy | budget "
          "| length | PPL | KL(FullKV ‖ policy) | top-1 agreement | errors |\n"
          "|---|---|---|---|---|---|---|\n",
          c->ppl_text);
  for (int v = -1; v < c->n_variants; v++)
    for (int b = v < 0 ? -1 : 0; b < (v < 0 ? 0 : c->n_budgets); b++)
      for (int l = 0; l < c->n_lengths; l++) {
        eval_cell_t cell = cell_of(r, t, l, v, b);
        fprintf(f, "| %s | %g%% | %d | ", label(c, v), 100 * budget(c, b), c->lengths[l]);
        md_mean(f, &cell.a[A_PPL], "%.3f");
        fprintf(f, " | ");
        md_mean(f, &cell.a[A_KL], "%.5f");
        fprintf(f, " | ");
        md_mean(f, &cell.a[A_TOP1], "%.3f");
        fprintf(f, " | %ld |\n", cell.errors);
      }
  fprintf(f, "\n");
}

void eval_report_markdown(const eval_cfg_t *c, const eval_results_t *r, FILE *f) {
  fprintf(f,
          "qevict eval on %s: seed %llu, %d sample(s) per task and length (from sample %d), "
          "budgets as fractions of FullKV bytes.\n\n",
          r->model_name, (unsigned long long)c->seed, c->samples, c->first_sample);
  int gen = 0, ppl = -1;
  for (int t = 0; t < c->n_tasks; t++) is_ppl(c, t) ? (void)(ppl = t) : (void)gen++;
  if (gen) md_fullkv(c, r, f), md_accuracy(c, r, f);
  if (gen && c->diag) md_diag(c, r, f);
  if (ppl >= 0) md_ppl(c, r, ppl, f);
}
