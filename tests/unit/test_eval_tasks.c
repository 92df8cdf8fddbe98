/* test_eval_tasks: the task generators of `qevict eval` with real tokenizers (stories260K's
 * SentencePiece vocabulary without a chat template; SmolLM2's byte-level BPE with ChatML when
 * its GGUF is present, 1K to 32K tokens): every task's prompt is within 5% of the requested
 * length, each answer is in the prompt (and for the needle tasks in the document, not only in
 * the question), the same seed gives the same tokens, another seed another prompt; and the
 * whole-word scoring rule on hand-made outputs. Skips (77) without stories260K. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval_tasks.h"
#include "qe_status.h"
#include "test_util.h"

static void test_scoring(void) {
  CHECK(eval_contains_word("The number is 1234567.", "1234567"));
  CHECK(!eval_contains_word("The number is 12345678.", "1234567"));
  CHECK(!eval_contains_word("x91234567", "1234567"));
  CHECK(eval_contains_word("It was built of Red Brick, they say", "red brick"));
  CHECK(!eval_contains_word("pier", "pie"));
  CHECK(eval_contains_word("pie", "pie"));
  CHECK(!eval_contains_word("", "pie"));
  eval_sample_t s = {0};
  char a[] = "ABCDE", b[] = "FGHIJ";
  s.answers[0] = a, s.answers[1] = b, s.n_answers = 2;
  CHECK(eval_score(&s, "they are: ABCDE, KLMNO") == 0.5);
  CHECK(eval_score(&s, "FGHIJ and abcde") == 1.0);
  CHECK(eval_score(&s, "nothing") == 0.0);
}

/* Where the document ends: the last question of the prompt (answers must occur before it). */
static size_t doc_end(const char *text) {
  const char *q = NULL, *p;
  for (p = text; (p = strstr(p, "\n\nWhat ")); p++) q = p;
  for (p = text; (p = strstr(p, "Question:")); p++)
    if (!q || p > q) q = p;
  return q ? (size_t)(q - text) : strlen(text);
}

static void check_task(const eval_task_t *t, const eval_fmt_t *f, int len, const char *model) {
  eval_sample_t a, b, c;
  int rc = eval_sample_make(t, f, len, 7, &a);
  CHECK_OK(rc);
  if (rc) return;
  double dev = (double)(a.n_ids - len) / len;
  if (dev < -0.05 || dev > 0.05)
    fprintf(stderr, "  %s on %s: %d tokens for %d\n", eval_task_name(t), model, a.n_ids, len);
  CHECK(dev >= -0.05 && dev <= 0.05);
  CHECK(a.n_answers >= 1 && a.n_answers <= EVAL_MAX_ANSWERS);
  size_t end = doc_end(a.text);
  for (int i = 0; i < a.n_answers; i++) {
    char *hay = strndup(a.text, end);
    CHECK(hay && eval_contains_word(hay, a.answers[i]));
    free(hay);
  }
  CHECK(eval_score(&a, a.text) == 1.0);
  CHECK_OK(eval_sample_make(t, f, len, 7, &b));
  CHECK(b.n_ids == a.n_ids && !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n_ids));
  CHECK(b.n_answers == a.n_answers && !strcmp(a.answers[0], b.answers[0]));
  CHECK_OK(eval_sample_make(t, f, len, 8, &c));
  CHECK(strcmp(a.text, c.text) != 0);
  eval_sample_dispose(&a), eval_sample_dispose(&b), eval_sample_dispose(&c);
  CHECK(a.text == NULL && a.n_answers == 0);
}

static void check_model(const char *path, const int *lens, int n_lens) {
  gguf_t *g = NULL;
  tok_t *tok = NULL;
  CHECK_OK(gguf_open(path, &g));
  CHECK_OK(tok_create(g, &tok));
  if (!g || !tok) return;
  eval_fmt_t f = {tok, g, chat_kind_of(g)};
  for (const eval_task_t *const *t = eval_task_list(); *t; t++)
    for (int i = 0; i < n_lens; i++) check_task(*t, &f, lens[i], path);
  /* a length below the task's fixed text is refused */
  eval_sample_t s;
  CHECK(eval_sample_make(eval_task_find("cwe"), &f, 40, 1, &s) == QE_EINVAL);
  /* eval_sample_min_tokens is the least length a sample takes (what `qevict eval` checks
   * --lengths against before any run) */
  for (const eval_task_t *const *t = eval_task_list(); *t; t++) {
    int n0 = 0;
    CHECK_OK(eval_sample_min_tokens(*t, &f, 5, &n0));
    CHECK(n0 > 16 && eval_sample_make(*t, &f, n0 - 1, 5, &s) == QE_EINVAL);
    CHECK_OK(eval_sample_make(*t, &f, n0, 5, &s));
    CHECK(s.n_ids == n0);
    eval_sample_dispose(&s);
  }
  tok_destroy(tok);
  gguf_close(g);
}

int main(void) {
  test_scoring();
  CHECK(eval_task_find("niah_single") && !eval_task_find("bogus"));
  CHECK(eval_task_new_tokens(eval_task_find("vt")) > 0);
  const char *stories = tu_env_path("QE_SHARED_MODELS", "stories260K.gguf");
  FILE *fp = stories ? fopen(stories, "rb") : NULL;
  if (!fp) tu_skip("stories260K.gguf absent");
  fclose(fp);
  check_model(stories, (const int[]){700, 1500}, 2);
  const char *smol = getenv("QE_SMOLLM2");
  if (smol && (fp = fopen(smol, "rb"))) {
    fclose(fp);
    check_model(smol, (const int[]){1024, 2048, 8000, 32000}, 4);
  } else {
    fprintf(stderr, "test_eval_tasks: SmolLM2 absent, BPE/ChatML part not run\n");
  }
  return tu_done("eval_tasks");
}
