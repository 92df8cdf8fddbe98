/* test_stories: stories260K.gguf (shared test data) must reproduce every token of an
 * independent implementation's greedy fp32 output (stories260K.golden.json), starting from
 * the prompt text (tokenizer included), and the decoded text; tensor parallel 2 and 4 give
 * the same logits within fp32 rounding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_rig.h"
#include "qe_status.h"
#include "test_util.h"
#include "tjson.h"

static void check_case(rig_t *r, const char *prompt, const tj_t *c) {
  const tj_t *toks = tj_get(c, "tokens"), *text = tj_get(c, "text");
  int32_t *ids = NULL;
  int n = 0;
  CHECK_OK(gen_encode(r->m, prompt, strlen(prompt), 0, &ids, &n));
  CHECK(toks && (size_t)n < toks->n);
  for (int i = 0; i < n && toks && (size_t)i < toks->n; i++)
    CHECK(ids[i] == (int)toks->items[i]->num);
  gen_seq_t s = {.prompt = ids, .n_prompt = n};
  gen_stats_t st;
  gen_opts_t o = {(int)toks->n - n, {0, 0, 1}, 0, 1, NULL, NULL, NULL};
  CHECK_OK(gen_run(r->m, r->kv, r->c, &s, 1, &o, &st));
  int same = s.n_out == (int)toks->n - n, first_diff = -1;
  for (int i = 0; same && i < s.n_out; i++)
    if (s.out[i] != (int)toks->items[n + i]->num) same = 0, first_diff = n + i;
  if (!same) fprintf(stderr, "'%s': first divergence at token %d\n", prompt, first_diff);
  CHECK(same);
  int32_t *all = malloc(sizeof(int32_t) * toks->n);
  for (size_t i = 0; i < toks->n; i++) all[i] = (int32_t)toks->items[i]->num;
  char *dec = NULL;
  CHECK_OK(tok_decode(model_tok(r->m), all + 1, toks->n - 1, 0, 1, &dec));
  CHECK(dec && text && !strcmp(dec, text->str));
  fprintf(stderr, "'%s': %d prompt tokens + %d generated: %s\n", prompt, n, s.n_out,
          same ? "identical" : "DIFFERENT");
  free(dec);
  free(all);
  free(s.out);
  free(ids);
}

static void check_tp(const char *path, const tj_t *c, int V) {
  const tj_t *toks = tj_get(c, "tokens");
  int n = 64;
  int32_t ids[64];
  for (int i = 0; i < n; i++) ids[i] = (int32_t)toks->items[i]->num;
  tp_comm_t *one = NULL;
  rig_t r;
  float *ref = malloc(sizeof(float) * n * V);
  CHECK_OK(tp_comm_create_single(&one));
  CHECK_OK(rig_open(&r, path, 0, 1, one, n));
  CHECK_OK(run_prefill(&r, ids, n, ref));
  rig_close(&r);
  tp_comm_destroy(one);
  for (int size = 2; size <= 4; size *= 2) {
    double e = tp_prefill_err(path, size, ids, n, ref, V);
    fprintf(stderr, "tp %d: logits max rel err %.3g over %d positions\n", size, e, n);
    CHECK(e < 1e-5);
  }
  free(ref);
}

int main(void) {
  const char *path = tu_env_path("QE_SHARED_MODELS", "stories260K.gguf");
  if (!path || access(path, R_OK)) tu_skip("../shared/models/stories260K.gguf is absent");
  char model_path[4096];
  snprintf(model_path, sizeof model_path, "%s", path);
  tj_t *gold = tj_load(tu_env_path("QE_SHARED_MODELS", "stories260K.golden.json"));
  const tj_t *cases = tj_get(gold, "cases");
  CHECK(cases && cases->n >= 1);
  tp_comm_t *c = NULL;
  rig_t r;
  CHECK_OK(tp_comm_create_single(&c));
  CHECK_OK(rig_open(&r, model_path, 0, 1, c, 256));
  for (size_t i = 0; r.m && cases && i < cases->n; i++)
    check_case(&r, cases->items[i]->key, cases->items[i]);
  int V = r.m ? model_hparams(r.m)->n_vocab : 0;
  rig_close(&r);
  tp_comm_destroy(c);
  if (V && cases) check_tp(model_path, cases->items[0], V);
  tj_free(gold);
  return tu_done("test_stories");
}
