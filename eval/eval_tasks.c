/* eval_tasks: rendering a task's sample in the model's chat template, the search for the
 * filler size that meets a length in tokens, and scoring (see eval_tasks.h). */
#include "eval_tasks.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "eval_internal.h"
#include "qe_status.h"

const eval_task_t *eval_task_find(const char *name) {
  for (const eval_task_t *const *t = eval_task_list(); *t; t++)
    if (!strcmp((*t)->name, name)) return *t;
  return NULL;
}

const char *eval_task_name(const eval_task_t *t) { return t->name; }
const char *eval_task_rule(const eval_task_t *t) { return t->rule; }
int eval_task_new_tokens(const eval_task_t *t) { return t->n_new; }

static void build_free(eval_build_t *b) {
  eval_sb_free(&b->user);
  eval_sb_free(&b->prefix);
}

/* The prompt text of a build: the user message in the chat template (or plain), then the
 * answer prefix. *text malloc'd. */
static int render(const eval_fmt_t *f, const eval_build_t *b, char **text) {
  eval_sb_t out = {0};
  if (f->chat_kind == CHAT_NONE) {
    eval_sb_printf(&out, "%s\n\n%s", b->user.s, b->prefix.s);
  } else {
    char *chat = NULL;
    chat_msg_t msg = {"user", b->user.s};
    int rc = chat_render(f->chat_kind, f->g, &msg, 1, 1, &chat);
    if (rc) return rc;
    eval_sb_printf(&out, "%s%s", chat, b->prefix.s);
    free(chat);
  }
  if (out.rc) return eval_sb_free(&out), out.rc;
  *text = out.s;
  return 0;
}

/* Builds, renders and encodes the sample with `units` filler units. With s == NULL only the
 * token count is returned in *n. */
static int make_at(const eval_task_t *t, const eval_fmt_t *f, int units, uint64_t seed, int *n,
                   eval_sample_t *s) {
  eval_build_t b = {0};
  char *text = NULL;
  int32_t *ids = NULL;
  size_t nn = 0;
  int rc = t->build(&b, units, seed);
  if (!rc) rc = render(f, &b, &text);
  if (!rc)
    rc = tok_encode(f->tok, text, strlen(text), tok_add_bos(f->tok), f->chat_kind != CHAT_NONE,
                    &ids, &nn);
  *n = (int)nn;
  if (!rc && s) {
    *s = (eval_sample_t){.text = text, .ids = ids, .n_ids = (int)nn, .units = units};
    for (int i = 0; i < b.n_answers && !rc; i++)
      if (!(s->answers[i] = strdup(b.answers[i]))) rc = qe_errf(QE_ENOMEM, "eval: out of memory");
    s->n_answers = b.n_answers;
    text = NULL, ids = NULL;
  }
  free(text);
  free(ids);
  build_free(&b);
  return rc;
}

/* Largest units in [lo, hi) with length <= target, given len(lo) <= target < len(hi). */
static int bisect(const eval_task_t *t, const eval_fmt_t *f, uint64_t seed, int target, int *lo,
                  int *hi, int *n_lo, int *n_hi) {
  while (*hi - *lo > 1) {
    int mid = *lo + (*hi - *lo) / 2, n, rc = make_at(t, f, mid, seed, &n, NULL);
    if (rc) return rc;
    if (n <= target)
      *lo = mid, *n_lo = n;
    else
      *hi = mid, *n_hi = n;
  }
  return 0;
}

/* Brackets the answer: len(lo) <= target < len(hi), starting from a linear estimate. */
static int bracket(const eval_task_t *t, const eval_fmt_t *f, uint64_t seed, int target, int n0,
                   int *lo, int *hi, int *n_lo, int *n_hi) {
  int n32, rc = make_at(t, f, 32, seed, &n32, NULL);
  if (rc) return rc;
  double per = n32 > n0 ? (n32 - n0) / 32.0 : 1.0;
  int guess = (int)((target - n0) / per);
  *lo = 0, *n_lo = n0;
  *hi = guess + guess / 16 + 2;
  while (!(rc = make_at(t, f, *hi, seed, n_hi, NULL)) && *n_hi <= target) {
    *lo = *hi, *n_lo = *n_hi;
    if (*hi > (1 << 22))
      return qe_errf(QE_EINVAL, "eval: %s cannot reach %d tokens", t->name, target);
    *hi *= 2;
  }
  int probe = guess - guess / 16 - 1, n;
  if (!rc && probe > *lo && probe < *hi && !(rc = make_at(t, f, probe, seed, &n, NULL))) {
    if (n <= target) *lo = probe, *n_lo = n;
    if (n > target) *hi = probe, *n_hi = n;
  }
  return rc;
}

int eval_sample_make(const eval_task_t *t, const eval_fmt_t *f, int n_tokens, uint64_t seed,
                     eval_sample_t *out) {
  int n0, lo, hi, n_lo, n_hi;
  *out = (eval_sample_t){0};
  int rc = make_at(t, f, 0, seed, &n0, NULL);
  if (rc) return rc;
  if (n0 > n_tokens)
    return qe_errf(QE_EINVAL, "eval: task %s needs at least %d tokens (asked for %d)", t->name, n0,
                   n_tokens);
  rc = bracket(t, f, seed, n_tokens, n0, &lo, &hi, &n_lo, &n_hi);
  if (!rc) rc = bisect(t, f, seed, n_tokens, &lo, &hi, &n_lo, &n_hi);
  if (rc) return rc;
  int units = n_tokens - n_lo <= n_hi - n_tokens ? lo : hi, n;
  rc = make_at(t, f, units, seed, &n, out);
  if (rc) eval_sample_dispose(out);
  return rc;
}

int eval_sample_min_tokens(const eval_task_t *t, const eval_fmt_t *f, uint64_t seed, int *n) {
  return make_at(t, f, 0, seed, n, NULL);
}

void eval_sample_dispose(eval_sample_t *s) {
  if (!s) return;
  free(s->text);
  free(s->ids);
  for (int i = 0; i < s->n_answers; i++) free(s->answers[i]);
  *s = (eval_sample_t){0};
}

uint64_t eval_sample_seed(uint64_t seed, const char *name, int length, int index) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  h = eval_mix(h ^ eval_mix(seed));
  h = eval_mix(h ^ ((uint64_t)(uint32_t)length << 20));
  return eval_mix(h ^ (uint64_t)(uint32_t)index);
}

static int is_word_char(char c) { return isalnum((unsigned char)c); }

int eval_contains_word(const char *text, const char *word) {
  size_t n = strlen(word), tn = strlen(text);
  if (!n) return 0;
  for (size_t i = 0; i + n <= tn; i++) {
    if (strncasecmp(text + i, word, n)) continue;
    int before = i > 0 && is_word_char(text[i - 1]), after = is_word_char(text[i + n]);
    if (!before && !after) return 1;
  }
  return 0;
}

double eval_score(const eval_sample_t *s, const char *output) {
  if (s->n_answers <= 0) return 0.0;
  int found = 0;
  for (int i = 0; i < s->n_answers; i++) found += eval_contains_word(output, s->answers[i]);
  return (double)found / s->n_answers;
}
