/* test_eval_report: `qevict eval`'s aggregates (cli/cli_eval_report.c) on made-up rows: a mean
 * leaves out the rows whose value is not finite (a KL of +inf, a NaN) and says how many, in
 * the JSON (`left_out`) and in the markdown ("(1 inf, 1 NaN left out)"), for the perplexity
 * task, a generation task and the average over tasks, whose `tasks` counts the tasks with an
 * accuracy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_eval.h"
#include "test_util.h"

enum { T_NIAH, T_PPL };

/* FullKV and qevict on three samples of each task; qevict's sample 1 has a KL and perplexity of
 * +inf and an FMM of NaN, its sample 2 a KL of NaN. */
static void make_rows(eval_row_t *rows, int *n) {
  const double kl[3] = {0.5, INFINITY, NAN}, fmm[3] = {0.1, NAN, 0.3};
  for (int s = 0; s < 3; s++)
    for (int v = -1; v < 1; v++) {
      eval_row_t g = {.task = T_NIAH, .sample = s, .variant = v, .budget = v, .compared = 1};
      g.score = v < 0 || s != 1, g.pass = g.score == 1;
      g.has_diag = v >= 0, g.diag.fmm = fmm[s];
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
               "\"left_out\":{\"ppl\":{\"inf\":1,\"nan\":0},\"kl\":{\"inf\":1,\"nan\":1}}}"));
  CHECK(has(j, "\"task\":\"ppl\",\"length\":null,\"policy\":\"full\",\"budget\":1,"
               "\"runs\":3,\"errors\":0,\"passed\":0,\"compared\":0,\"bytes_over_budget\":null,"
               "\"ppl\":6,\"kl\":0,\"top1\":1,\"left_out\":{}}"));
  CHECK(has(j, "\"task\":\"niah_single\",\"length\":300,\"policy\":\"qevict\""));
  CHECK(has(j, "\"fmm\":0.2,"));
  CHECK(has(j, "\"left_out\":{\"fmm\":{\"inf\":0,\"nan\":1}}}"));
  CHECK(has(j, "\"left_out\":{\"fmm\":{\"inf\":0,\"nan\":1}},\"tasks\":1}"));
  CHECK(has(md, "| qevict | 30% | 300 | 6.000 (1 inf left out) | 0.50000 (1 inf, 1 NaN left "
                "out) | 1.000 | 0 |"));
  CHECK(has(md, "| qevict | 30% | 0.667 | 0.2000 (1 NaN left out) | 0.667 | 0.2000 (1 NaN left "
                "out) |"));
  free(j), free(md);
  return tu_done("eval_report");
}
