/* test_eval_report: `qevict eval`'s aggregates (cli/cli_eval_report.c) on made-up rows: a mean
 * leaves out the rows whose value is not finite (a KL of +inf, a NaN) or whose diagnostic is
 * undefined on the run (its count 0: not a NaN, though its value is one) and says how many, in
 * the JSON (`left_out`) and in the markdown ("(1 inf, 1 NaN left out)", "(1 undefined left
 * out)"), for the perplexity task, a generation task, the average over tasks, whose `tasks`
 * counts the tasks with an accuracy, and the diagnostics table; and each row's `nulls`, what
 * each of its values written as null stands for ("inf", "nan", "undefined"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_eval.h"
#include "test_util.h"

enum { T_NIAH, T_PPL };

/* qevict's diagnostics on sample s: FMM undefined on sample 1 (no routing event with one:
 * NaN, its count 0), the INT2 mass ratio a NaN on sample 1 (FullKV's mass on the INT2 windows
 * not 0) and undefined on sample 2 (that mass 0); the others defined on every sample. */
static kv_diag_result_t diag_of(int s) {
  const double fmm[3] = {0.1, NAN, 0.3}, ratio[3] = {0.9, NAN, NAN};
  kv_diag_result_t d = {.fmm = fmm[s], .churn = 0.2, .lir = 0.5, .ttr_median = 3, .qsa = 0.8};
  d.int2_mass_ratio = ratio[s], d.int2_full_mass = s == 2 ? 0 : 0.5;
  d.events = 4, d.fmm_events = s == 1 ? 0 : 3, d.churn_pairs = 3, d.qsa_events = 4;
  d.lir_eligible = 2, d.lir_returned = 1;
  return d;
}

/* FullKV and qevict on three samples of each task; qevict's sample 1 has a KL and perplexity of
 * +inf, its sample 2 a KL of NaN; its diagnostics are diag_of's. */
static void make_rows(eval_row_t *rows, int *n) {
  const double kl[3] = {0.5, INFINITY, NAN};
  for (int s = 0; s < 3; s++)
    for (int v = -1; v < 1; v++) {
      eval_row_t g = {.task = T_NIAH, .sample = s, .variant = v, .budget = v, .compared = 1};
      g.score = v < 0 || s != 1, g.pass = g.score == 1;
      g.has_diag = v >= 0;
      if (v >= 0) g.diag = diag_of(s);
      rows[(*n)++] = g;
      eval_row_t p = {.task = T_PPL, .sample = s, .variant = v, .budget = v, .is_ppl = 1};
      p.compared = 1, p.top1 = 1, p.kl = v < 0 ? 0 : kl[s];
      p.ppl = v >= 0 && s == 1 ? INFINITY : 6;
      rows[(*n)++] = p;
    }
}

static char *report(const eval_cfg_t *c, const eval_results_t *r, int json) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  if (json) eval_report_json(c, r, f);
  if (!json) eval_report_markdown(c, r, f);
  fclose(f);
  return buf;
}

static int has(const char *text, const char *s) {
  int ok = text && strstr(text, s);
  if (!ok) fprintf(stderr, "missing: %s\n", s);
  return ok;
}

int main(void) {
  eval_cfg_t c = {.tasks = {"niah_single", EVAL_TASK_PPL}, .n_tasks = 2};
  c.lengths[0] = 300, c.n_lengths = 1, c.samples = 3, c.n_variants = 1, c.n_budgets = 1;
  c.budgets[0] = 0.3, c.diag = 1, c.ppl_text = "text";
  strcpy(c.variants[0].label, "qevict"), strcpy(c.variants[0].name, "qevict");
  eval_row_t rows[12];
  eval_results_t r = {.rows = rows, .cap = 12};
  make_rows(rows, &r.n);
  char *j = report(&c, &r, 1), *md = report(&c, &r, 0);
  CHECK(has(j, "\"task\":\"ppl\",\"length\":null,\"policy\":\"qevict\",\"budget\":0.3,"
               "\"runs\":3,\"errors\":0,\"passed\":0,\"compared\":0,\"bytes_over_budget\":null,"
               "\"ppl\":6,\"kl\":0.5,\"top1\":1,"
               "\"left_out\":{\"ppl\":{\"inf\":1,\"nan\":0,\"undefined\":0},"
               "\"kl\":{\"inf\":1,\"nan\":1,\"undefined\":0}}}"));
  CHECK(has(j, "\"task\":\"ppl\",\"length\":null,\"policy\":\"full\",\"budget\":1,"
               "\"runs\":3,\"errors\":0,\"passed\":0,\"compared\":0,\"bytes_over_budget\":null,"
               "\"ppl\":6,\"kl\":0,\"top1\":1,\"left_out\":{}}"));
  CHECK(has(j, "\"task\":\"niah_single\",\"length\":300,\"policy\":\"qevict\""));
  CHECK(has(j, "\"fmm\":0.2,"));
  const char *lo = "\"left_out\":{\"fmm\":{\"inf\":0,\"nan\":0,\"undefined\":1},"
                   "\"int2_mass_ratio\":{\"inf\":0,\"nan\":1,\"undefined\":1}}";
  char want[256];
  CHECK(has(j, "\"int2_mass_ratio\":0.9,"));
  snprintf(want, sizeof want, "%s}", lo);
  CHECK(has(j, want)); /* the task's entries */
  snprintf(want, sizeof want, "%s,\"tasks\":1}", lo);
  CHECK(has(j, want)); /* the average over tasks */
  /* the rows: what each null stands for */
  CHECK(has(j, "\"ppl\":null,\"kl\":null,\"top1\":1,\"nulls\":{\"ppl\":\"inf\",\"kl\":\"inf\"}"));
  CHECK(has(j, "\"ppl\":6,\"kl\":null,\"top1\":1,\"nulls\":{\"kl\":\"nan\"}"));
  CHECK(has(j, "\"int2_mass_ratio\":null,\"agreement\":null,\"nulls\":{\"fmm\":\"undefined\","
               "\"int2_mass_ratio\":\"nan\",\"agreement\":\"undefined\"}"));
  CHECK(has(j, "\"nulls\":{\"int2_mass_ratio\":\"undefined\",\"agreement\":\"undefined\"}"));
  CHECK(has(j, "\"int2_mass_ratio\":0.9,\"agreement\":null,\"nulls\":{\"agreement\":"
               "\"undefined\"}"));
  CHECK(!strstr(j, "\"ppl\":6,\"kl\":0.5,\"top1\":1,\"nulls\""));
  CHECK(has(md, "| qevict | 30% | 300 | 6.000 (1 inf left out) | 0.50000 (1 inf, 1 NaN left "
                "out) | 1.000 | 0 |"));
  CHECK(has(md, "| qevict | 30% | 0.667 | 0.2000 (1 undefined left out) | 0.667 | 0.2000 (1 "
                "undefined left out) |"));
  CHECK(has(md, "| qevict | 30% | n/a | 0.2000 (1 undefined left out) | 0.2000 | 0.5000 | 3.0 | "
                "0.8000 | 0.9000 (1 NaN, 1 undefined left out) | 0.0 | n/a | 0 |"));
  free(j), free(md);
  return tu_done("eval_report");
}
