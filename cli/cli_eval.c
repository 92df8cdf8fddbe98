/* cli_eval: `qevict eval`: parses the grid (tasks, lengths, samples, policies, budgets,
 * ablations), loads the model once on the CPU backend, runs every sample (cli_eval_run.c,
 * cli_eval_ppl.c) and writes the JSON and markdown reports (cli_eval_report.c). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cli_eval.h"
#include "qe_status.h"
#ifdef QE_HAVE_CUDA
#include "cuda/kern_cuda.h"
#endif

#define EVAL_DEFAULT_PPL_TEXT "/usr/share/common-licenses/GPL-3"

static const char *eval_help =
    "usage: qevict eval --model FILE [options]\n"
    "  --tasks a,b       niah_single, niah_multikey, niah_multivalue, vt, cwe, qa, ppl, or all\n"
    "                    (default: every generation task; ppl = teacher-forced perplexity)\n"
    "  --lengths L,...   prompt lengths in tokens (default 1024,2048): each at least every\n"
    "                    task's shortest prompt and, with the new tokens, at most the context\n"
    "  --samples N       samples per task and length (default 2)\n"
    "  --first-sample K  start at sample K (default 0): a grid split over processes gives\n"
    "                    the same samples as one run\n"
    "  --policies P,...  qevict, h2o, snapkv, pyramidkv, streaming, kivi, knorm, NAME+graphkv,\n"
    "                    each optionally NAME:window=W (tokens per window) and/or\n"
    "                    NAME:keyframe=pos|window|abs (keys quantized pre-RoPE,\n"
    "                    window-relative (CPU only) or post-RoPE, the default);\n"
    "                    full is always\n"
    "                    run first (default qevict,h2o,snapkv,pyramidkv,streaming,kivi)\n"
    "  --budgets B,...   persistent KV bytes as fractions of FullKV (default 0.05,0.1,0.2,0.4)\n"
    "  --new N           max new tokens (default: each task's own; ppl: 64 scored tokens)\n"
    "  --seed S          generator seed (default 0)\n"
    "  --ablations       add qevict variants: q 0.3/0.5/0.9, INT4, window 4/16/32, no\n"
    "                    promotion, +graphkv\n"
    "  --all-samples     run the policies on samples FullKV fails too (still not compared)\n"
    "  --no-diagnostics  skip the teacher-forced diagnostics runs (accuracy only)\n"
    "  --ppl-text FILE   the text of the ppl task (default " EVAL_DEFAULT_PPL_TEXT ")\n"
    "  --json FILE       write the results as one JSON object ('-': stdout)\n"
    "  --markdown FILE   write the tables (default: stdout unless --json -)\n"
    "  --threads N       CPU threads (default: all cores)\n" CLI_CPU_WEIGHTS_HELP
    "  --device N        run on CUDA GPU N (CUDA builds): FullKV and the policies the GPU cache\n"
    "                    runs (qevict, kivi; h2o, streaming, snapkv and pyramidkv with\n"
    "                    :window=4, 8 or a multiple of 16; +graphkv on qevict and h2o),\n"
    "                    diagnostics\n"
    "                    included (the shadow is the GPU cache); the others' rows report the\n"
    "                    refusal\n"
    "  --quiet           no progress lines on stderr\n";

/* Splits a comma list in place into items (at most EVAL_MAX_LIST). -1 if too many, with an
 * empty item (",a", "a,", "a,,b": the list was cut short somewhere) or an item twice (a
 * repeated row or column of the report). */
static int split(char *s, char **items, int *n) {
  *n = 0;
  for (char *p = s;;) {
    char *comma = strchr(p, ',');
    if (comma) *comma = '\0';
    if (!*p || *n == EVAL_MAX_LIST) return -1;
    for (int i = 0; i < *n; i++)
      if (!strcmp(items[i], p)) return -1;
    items[(*n)++] = p;
    if (!comma) return 0;
    p = comma + 1;
  }
}

static int add_variant(eval_cfg_t *c, const char *label, const char *name, int ablation,
                       cli_policy_t **out) {
  for (int v = 0; v < c->n_variants; v++)
    if (!strcmp(c->variants[v].label, label)) return *out = NULL, 0;
  if (c->n_variants == EVAL_MAX_LIST) return -1;
  eval_variant_t *a = &c->variants[c->n_variants++];
  snprintf(a->label, sizeof a->label, "%s", label);
  snprintf(a->name, sizeof a->name, "%s", name);
  cli_policy_init(&a->pol);
  a->pol.name = a->name, a->ablation = ablation;
  *out = &a->pol;
  return 0;
}

/* --ablations: qevict's variants (its defaults are q 0.7, INT2, window 8, promotion on). */
static int add_ablations(eval_cfg_t *c) {
  cli_policy_t *p;
  char lab[64];
  int rc = add_variant(c, "qevict", "qevict", 0, &p);
  const float qs[] = {0.3f, 0.5f, 0.9f};
  for (int i = 0; !rc && i < 3; i++) {
    snprintf(lab, sizeof lab, "qevict q=%.1f", qs[i]);
    if (!(rc = add_variant(c, lab, "qevict", 1, &p)) && p) p->q = qs[i];
  }
  if (!rc && !(rc = add_variant(c, "qevict bits=4", "qevict", 1, &p)) && p) p->bits = 4;
  const int ws[] = {4, 16, 32};
  for (int i = 0; !rc && i < 3; i++) {
    snprintf(lab, sizeof lab, "qevict window=%d", ws[i]);
    if (!(rc = add_variant(c, lab, "qevict", 1, &p)) && p) p->omega = ws[i];
  }
  if (!rc && !(rc = add_variant(c, "qevict promote=off", "qevict", 1, &p)) && p) p->promote = 0;
  if (!rc) rc = add_variant(c, "qevict+graphkv", "qevict+graphkv", 1, &p);
  return rc;
}

/* The options of a --policies item after NAME (":window=W", ":keyframe=F", in any order, each
 * once): 0, or -2 (usage error printed). */
static int parse_policy_opts(const char *label, char *opt, long *w, int *key_frame) {
  static const char *frames[] = {"keyframe=pos", "keyframe=window", "keyframe=abs"};
  int seen_w = 0, seen_f = 0;
  while (opt) {
    char *next = strchr(opt, ':');
    if (next) *next++ = '\0';
    int frame = -1; /* index = KV_KEY_FRAME_POS, _WINDOW, _ABS */
    for (int i = 0; i < 3; i++)
      if (!strcmp(opt, frames[i])) frame = i;
    int ok = !strncmp(opt, "window=", 7) ? !cli_parse_int(opt + 7, 1, 1 << 16, w) : frame >= 0;
    if (!ok)
      return cli_usage_error("eval",
                             "bad policy option '%s' (NAME[:window=W][:keyframe=pos|window|abs])",
                             label),
             -2;
    if (frame >= 0 ? seen_f++ : seen_w++) /* (the last had won, the label naming both) */
      return cli_usage_error("eval", "policy '%s' gives its %s twice", label,
                             frame >= 0 ? "keyframe" : "window"),
             -2;
    if (frame >= 0) *key_frame = frame;
    opt = next;
  }
  return 0;
}

/* One --policies item: NAME with options. 0, -1 (too many) or -2 (usage error printed). An
 * item longer than a label (only repeated options make one) is refused: cut, it could equal
 * another and be dropped as its duplicate. */
static int parse_policy(eval_cfg_t *c, char *item) {
  char label[sizeof c->variants[0].label], *colon = strchr(item, ':');
  long w = 0;
  int key_frame = -1;
  kv_policy_desc_t d;
  cli_policy_t *p;
  if (strlen(item) >= sizeof label)
    return cli_usage_error("eval", "policy '%.40s...' is longer than %d characters", item,
                           (int)sizeof label - 1),
           -2;
  snprintf(label, sizeof label, "%s", item);
  if (colon) *colon = '\0';
  if (colon && parse_policy_opts(label, colon + 1, &w, &key_frame)) return -2;
  if (kv_policy_find(item, &d))
    return cli_usage_error("eval", "bad policy '%s': %s", item, qe_errmsg()), -2;
  if (d.full) return 0;
  if (add_variant(c, label, item, 0, &p)) return -1;
  if (p && w) p->omega = (int)w;
  if (p) p->key_frame = key_frame;
  return 0;
}

static int parse_policies(eval_cfg_t *c, char *v) {
  char *items[EVAL_MAX_LIST];
  int n, rc = 0;
  if (split(v, items, &n)) return -1;
  c->n_variants = 0;
  for (int i = 0; !rc && i < n; i++) rc = parse_policy(c, items[i]);
  return rc;
}

static int parse_tasks(eval_cfg_t *c, char *v) {
  if (!strcmp(v, "all")) {
    c->n_tasks = 0;
    for (const eval_task_t *const *t = eval_task_list(); *t; t++)
      c->tasks[c->n_tasks++] = eval_task_name(*t);
    c->tasks[c->n_tasks++] = EVAL_TASK_PPL;
    return 0;
  }
  char *items[EVAL_MAX_LIST];
  if (split(v, (char **)items, &c->n_tasks)) return -1;
  for (int i = 0; i < c->n_tasks; i++) {
    if (!strcmp(items[i], "all"))
      return cli_usage_error("eval", "--tasks: 'all' (every task) stands alone"), -2;
    if (!eval_task_find(items[i]) && strcmp(items[i], EVAL_TASK_PPL))
      return cli_usage_error("eval", "unknown task '%s'", items[i]), -2;
    c->tasks[i] = items[i];
  }
  return 0;
}

static int parse_numbers(char *v, int ints, double lo, double hi, double *out, int *n) {
  char *items[EVAL_MAX_LIST];
  if (split(v, items, n)) return -1;
  for (int i = 0; i < *n; i++) {
    long l;
    if (ints ? cli_parse_int(items[i], (long)lo, (long)hi, &l)
             : cli_parse_float(items[i], lo, hi, &out[i]))
      return -1;
    if (ints) out[i] = (double)l;
  }
  return 0;
}

/* Whether option f takes a comma list. */
static int is_list_option(const char *f) {
  return !strcmp(f, "--tasks") || !strcmp(f, "--policies") || !strcmp(f, "--budgets") ||
         !strcmp(f, "--lengths");
}

/* One option with a value: 0 handled, -1 bad value, -2 usage error already printed, 1 not
 * an option of eval. */
static int parse_valued(eval_cfg_t *c, const char *f, char *v) {
  long l;
  double tmp[EVAL_MAX_LIST];
  if (!strcmp(f, "--model")) return c->model = v, 0;
  if (!strcmp(f, "--json")) return c->json = v, 0;
  if (!strcmp(f, "--markdown")) return c->markdown = v, 0;
  if (!strcmp(f, "--ppl-text")) return c->ppl_text = v, 0;
  if (!strcmp(f, "--tasks")) return parse_tasks(c, v);
  if (!strcmp(f, "--policies")) return parse_policies(c, v);
  if (!strcmp(f, "--seed")) return cli_parse_u64(v, &c->seed);
  if (!strcmp(f, "--budgets")) return parse_numbers(v, 0, 1e-6, 1.0, c->budgets, &c->n_budgets);
  if (!strcmp(f, "--lengths")) {
    if (parse_numbers(v, 1, 16, 1 << 22, tmp, &c->n_lengths)) return -1;
    for (int i = 0; i < c->n_lengths; i++) c->lengths[i] = (int)tmp[i];
    return 0;
  }
  if (!strcmp(f, "--device")) {
    if (cli_parse_int(v, 0, 255, &l)) return -1;
    return c->device = (int)l, 0;
  }
  if (!strcmp(f, "--cpu-weights")) return cli_parse_cpu_weights(v, &c->cpu_weights);
  if (!strcmp(f, "--first-sample")) {
    if (cli_parse_int(v, 0, 1 << 20, &l)) return -1;
    return c->first_sample = (int)l, 0;
  }
  int *dst = !strcmp(f, "--samples")   ? &c->samples
             : !strcmp(f, "--new")     ? &c->n_new
             : !strcmp(f, "--threads") ? &c->threads
                                       : NULL;
  if (!dst) return 1;
  /* threads: generate's bound (a thread each: 30,000 of them had exhausted the memory) */
  if (cli_parse_int(v, 1, dst == &c->threads ? 256 : 1 << 20, &l)) return -1;
  *dst = (int)l;
  return 0;
}

static void cfg_defaults(eval_cfg_t *c) {
  static const char *pols[] = {"qevict", "h2o", "snapkv", "pyramidkv", "streaming", "kivi"};
  static const double budgets[] = {0.05, 0.1, 0.2, 0.4};
  cli_policy_t *p;
  *c = (eval_cfg_t){.samples = 2, .diag = 1, .ppl_text = EVAL_DEFAULT_PPL_TEXT, .device = -1};
  c->lengths[0] = 1024, c->lengths[1] = 2048, c->n_lengths = 2;
  for (int i = 0; i < 6; i++) add_variant(c, pols[i], pols[i], 0, &p);
  for (int i = 0; i < 4; i++) c->budgets[c->n_budgets++] = budgets[i];
  for (const eval_task_t *const *t = eval_task_list(); *t; t++)
    c->tasks[c->n_tasks++] = eval_task_name(*t);
}

/* Whether the two report paths are one destination: both stdout ("-"), the same name, or the
 * same existing file under two names. */
static int same_report(const char *a, const char *b) {
  if (!a || !b) return 0;
  if (!strcmp(a, b)) return 1;
  struct stat sa, sb;
  return strcmp(a, "-") && strcmp(b, "-") && !stat(a, &sa) && !stat(b, &sb) &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int has_ppl(const eval_cfg_t *c) {
  for (int t = 0; t < c->n_tasks; t++)
    if (!strcmp(c->tasks[t], EVAL_TASK_PPL)) return 1;
  return 0;
}

/* 0 parsed, -1 --help printed, 2 usage error printed. argv items may be modified. */
static int parse_args(int argc, char **argv, eval_cfg_t *c) {
  cfg_defaults(c);
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (!strcmp(f, "--help") || !strcmp(f, "-h")) return fputs(eval_help, stdout), -1;
    if (!strcmp(f, "--ablations"))
      c->ablations = 1;
    else if (!strcmp(f, "--all-samples"))
      c->all_samples = 1;
    else if (!strcmp(f, "--no-diagnostics"))
      c->diag = 0;
    else if (!strcmp(f, "--quiet"))
      c->quiet = 1;
    else if (i + 1 >= argc)
      return cli_usage_error("eval", "unknown option or missing value: %s", f);
    else {
      char orig[256]; /* the lists are split in place */
      snprintf(orig, sizeof orig, "%s", argv[++i]);
      cli_parse_note_set(NULL);
      int rc = parse_valued(c, f, argv[i]);
      if (rc == 1) return cli_usage_error("eval", "unknown option %s", f);
      if (rc == -2) return 2;
      if (rc)
        return cli_usage_error("eval", "bad value '%s' for %s%s", orig, f,
                               is_list_option(f) && (strchr(orig, ',') || !*orig)
                                   ? " (a comma list: each item valid, none empty or repeated)"
                                   : cli_parse_note());
    }
  }
  if (!c->model) return cli_usage_error("eval", "--model is required");
  if (same_report(c->json, c->markdown))
    return cli_usage_error("eval",
                           "--json and --markdown name the same destination '%s' (the "
                           "reports would overwrite or interleave each other)",
                           c->json);
  if (c->ablations && add_ablations(c)) return cli_usage_error("eval", "too many policies");
  if (!c->n_variants) return cli_usage_error("eval", "no policy to compare with FullKV");
  if (strcmp(c->ppl_text, EVAL_DEFAULT_PPL_TEXT) && !has_ppl(c)) /* (it went unread, unchecked) */
    return cli_usage_error("eval", "--ppl-text is the ppl task's text; --tasks has no ppl");
  return cli_check_backend("eval", c->device, c->cpu_weights);
}

/* Each task's new tokens at each length: a generation task's prompt and new tokens within the
 * context n_ctx, ppl's scored tokens and the one before them fewer than the length. 0, or 2
 * after a usage error. */
static int check_new_tokens(const eval_cfg_t *c, int n_ctx) {
  for (int t = 0; t < c->n_tasks; t++) {
    const eval_task_t *k = eval_task_find(c->tasks[t]); /* NULL: ppl */
    int n_new = c->n_new ? c->n_new : k ? eval_task_new_tokens(k) : EVAL_PPL_NEW;
    for (int i = 0; i < c->n_lengths; i++) {
      int len = c->lengths[i];
      if (k && len + n_new > n_ctx)
        return cli_usage_error("eval",
                               "task %s: length %d + %d new tokens exceed the model "
                               "context (%d)",
                               c->tasks[t], len, n_new, n_ctx);
      if (!k && n_new + 1 >= len)
        return cli_usage_error("eval",
                               "task ppl: length %d must be longer than the %d tokens it scores "
                               "(--new) and the token before them",
                               len, n_new);
    }
  }
  return 0;
}

/* Resolves every variant's windows against the model and checks the lengths against its
 * context: 0, or 2 after a usage error. */
static int check_model_cfg(eval_cfg_t *c, const model_hparams_t *hp) {
  kv_policy_desc_t d;
  for (int v = 0; v < c->n_variants; v++) {
    eval_variant_t *a = &c->variants[v];
    if (cli_policy_resolve(&a->pol, hp->head_dim, &d))
      return cli_usage_error("eval", "policy %s: %s", a->label, qe_errmsg());
    a->omega = d.cfg.omega, a->sink = d.cfg.n_sink;
  }
  for (int i = 0; i < c->n_lengths; i++)
    if (c->lengths[i] > hp->n_ctx_train)
      return cli_usage_error("eval", "length %d exceeds the model context (%d)", c->lengths[i],
                             hp->n_ctx_train);
  if (check_new_tokens(c, hp->n_ctx_train)) return 2;
  if (!c->threads) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = cores > 0 ? (int)cores : 1;
  }
  return 0;
}

/* Tokenizes the perplexity text (no BOS) into *ids (malloc'd); QE_EINVAL when it is shorter
 * than a window of some length (BOS, then the text). */
static int load_ppl_text(const eval_cfg_t *c, const tok_t *tok, int32_t **ids, int *n) {
  char *buf = NULL;
  size_t len = 0, nn = 0;
  int rc = cli_read_text_file("the ppl text", c->ppl_text, (size_t)1 << 30, &buf);
  if (rc) return rc;
  len = strlen(buf);
  rc = tok_encode(tok, buf, len, 0, 0, ids, &nn);
  free(buf);
  *n = rc ? 0 : (int)nn;
  int bos = tok_add_bos(tok) && tok_bos(tok) >= 0;
  if (!rc && !nn) return qe_errf(QE_EINVAL, "the ppl text '%s' is empty", c->ppl_text);
  for (int i = 0; !rc && i < c->n_lengths; i++)
    if (c->lengths[i] - bos > *n)
      rc = qe_errf(QE_EINVAL, "the ppl text '%s' has %d tokens, fewer than length %d needs (%d)",
                   c->ppl_text, *n, c->lengths[i], c->lengths[i] - bos);
  return rc;
}

/* *need: the fewest tokens task t's samples of the grid take at length len (the first that
 * fits, else the least of them all). */
static int task_need(const eval_cfg_t *c, const eval_task_t *t, const eval_fmt_t *f, int len,
                     int *need) {
  *need = INT_MAX;
  for (int s = c->first_sample; *need > len && s < c->first_sample + c->samples; s++) {
    int n0, rc = eval_sample_min_tokens(t, f, eval_sample_seed(c->seed, eval_task_name(t), len, s),
                                        &n0);
    if (rc) return rc;
    *need = n0 < *need ? n0 : *need;
  }
  return 0;
}

/* Each generation task at each length: some sample must fit (the rest are row errors). 0, 1
 * after an error or 2 after a usage error. */
static int check_task_lengths(const eval_cfg_t *c, const eval_fmt_t *f) {
  for (int t = 0; t < c->n_tasks; t++) {
    const eval_task_t *k = eval_task_find(c->tasks[t]);
    for (int i = 0; k && i < c->n_lengths; i++) {
      int need, rc = task_need(c, k, f, c->lengths[i], &need);
      if (rc) return cli_fail("eval", rc);
      if (need > c->lengths[i])
        return cli_usage_error("eval", "task %s needs at least %d tokens: length %d is too short",
                               c->tasks[t], need, c->lengths[i]);
    }
  }
  return 0;
}

/* What the arguments rule out under the model's tokenizer, before it loads: lengths below a
 * task's shortest prompt, a ppl text too short; the ppl text's tokens into *ids (malloc'd).
 * 0, 1 after an error or 2 after a usage error. */
static int check_data_cfg(const eval_cfg_t *c, const gguf_t *g, int32_t **ids, int *n) {
  tok_t *tok = NULL;
  int rc = tok_create(g, &tok), code = rc ? cli_fail("eval", rc) : 0;
  eval_fmt_t f = {tok, g, chat_kind_of(g)};
  if (!code) code = check_task_lengths(c, &f);
  if (!code && has_ppl(c) && (rc = load_ppl_text(c, tok, ids, n))) code = cli_fail("eval", rc);
  tok_destroy(tok);
  return code;
}

static int run_grid(eval_ctx_t *x) {
  const eval_cfg_t *c = x->cfg;
  int rc = 0;
  for (int t = 0; !rc && t < c->n_tasks; t++)
    for (int l = 0; !rc && l < c->n_lengths; l++)
      for (int s = c->first_sample; !rc && s < c->first_sample + c->samples; s++)
        rc = strcmp(c->tasks[t], EVAL_TASK_PPL) ? eval_run_sample(x, t, l, s)
                                                : eval_run_ppl(x, t, l, s);
  return rc;
}

/* The report files, opened before the grid runs so that a path that cannot be written fails
 * at once rather than after the whole grid (NULL where a report goes to stdout), each written
 * as PATH.partial and renamed to PATH once complete, so that a failed or interrupted run leaves
 * an earlier report in place (it had emptied it at start). */
typedef struct {
  FILE *json, *md;
  char json_tmp[PATH_MAX], md_tmp[PATH_MAX];
} eval_outs_t;

/* Opens the report at path through path.partial (renamed over path at the end, so that a run
 * that fails leaves no half report), or straight at path when path exists and is no regular file
 * (a FIFO, /dev/null, /dev/stdout: a rename would replace it with a file); tmp "" then. */
static int open_report(const char *path, const char *flag, FILE **f, char *tmp) {
  if (!path || !strcmp(path, "-")) return 0;
  struct stat st;
  tmp[0] = '\0';
  if (stat(path, &st) || S_ISREG(st.st_mode)) {
    if (snprintf(tmp, PATH_MAX, "%s.partial", path) >= PATH_MAX)
      return qe_errf(QE_EIO, "%s: the path '%s' is too long", flag, path);
  }
  if (!(*f = fopen(tmp[0] ? tmp : path, "w")))
    return qe_errf(QE_EIO, "%s: cannot write '%s'%s%s%s: %s", flag, path,
                   tmp[0] ? " (through '" : "", tmp, tmp[0] ? "')" : "", strerror(errno));
  return 0;
}

static int open_reports(const eval_cfg_t *c, eval_outs_t *o) {
  int rc = open_report(c->json, "--json", &o->json, o->json_tmp);
  return rc ? rc : open_report(c->markdown, "--markdown", &o->md, o->md_tmp);
}

/* Closes *f (not stdout) and renames its tmp to path, or removes it after rc (an error before);
 * QE_EIO naming flag and path when the close or the rename failed. */
static int close_report(FILE **f, const char *flag, const char *path, const char *tmp, int rc) {
  if (!*f) return rc;
  if (fclose(*f) && !rc)
    rc = qe_errf(QE_EIO, "%s: cannot write '%s': %s", flag, tmp[0] ? tmp : path, strerror(errno));
  *f = NULL;
  if (!tmp[0]) return rc; /* (written in place) */
  if (!rc && rename(tmp, path))
    rc = qe_errf(QE_EIO, "%s: cannot rename '%s' to '%s': %s", flag, tmp, path, strerror(errno));
  if (rc) unlink(tmp);
  return rc;
}

static int write_reports(const eval_cfg_t *c, const eval_results_t *r, eval_outs_t *o) {
  int rc = 0;
  if (c->json) eval_report_json(c, r, o->json ? o->json : stdout);
  rc = close_report(&o->json, "--json", c->json, o->json_tmp, rc);
  if (!rc && (c->markdown || !c->json || strcmp(c->json, "-")))
    eval_report_markdown(c, r, o->md ? o->md : stdout);
  return close_report(&o->md, "--markdown", c->markdown, o->md_tmp, rc);
}

/* The CPU backend, or with --device the CUDA GPU. */
static int make_backend(const eval_cfg_t *c, kern_backend_t **be) {
#ifdef QE_HAVE_CUDA
  if (c->device >= 0) {
    int n = kern_cuda_device_count();
    if (c->device >= n)
      return qe_errf(QE_EINVAL, "--device %d: %d CUDA device(s) visible", c->device, n);
    return kern_cuda_create(c->device, be);
  }
#endif
  return kern_cpu_create_ex(c->threads, c->cpu_weights, be);
}

/* Loads the model for prompts of up to the longest length in one forward pass and runs over
 * the ppl text's tokens ppl_ids[n_ppl] (borrowed). */
static int run_loaded(eval_cfg_t *c, eval_results_t *res, int32_t *ppl_ids, int n_ppl,
                      eval_outs_t *outs) {
  eval_ctx_t x = {.cfg = c, .res = res, .ppl_ids = ppl_ids, .n_ppl_ids = n_ppl};
  int max_len = 512;
  for (int i = 0; i < c->n_lengths; i++)
    max_len = c->lengths[i] > max_len ? c->lengths[i] : max_len;
  double t0 = cli_now_s();
  int rc = make_backend(c, &x.be);
  model_load_opts_t o = {x.be, 0, 1, max_len + 64, 0};
  if (!rc) rc = model_load(c->model, &o, &x.m);
  if (!rc) rc = tp_comm_create_single(&x.comm);
  res->load_s = cli_now_s() - t0;
  if (!rc) {
    x.fmt = (eval_fmt_t){model_tok(x.m), model_gguf(x.m), chat_kind_of(model_gguf(x.m))};
    rc = run_grid(&x);
  }
  res->total_s = cli_now_s() - t0;
  if (!rc) rc = write_reports(c, res, outs);
  tp_comm_destroy(x.comm);
  model_destroy(x.m);
  kern_destroy(x.be);
  return rc;
}

int cli_eval(int argc, char **argv) {
  eval_cfg_t *c = calloc(1, sizeof *c);
  eval_results_t res = {0};
  gguf_t *g = NULL;
  model_hparams_t hp;
  int32_t *ppl_ids = NULL;
  int n_ppl = 0;
  if (!c) return cli_fail("eval", qe_errf(QE_ENOMEM, "out of memory"));
  int rc = parse_args(argc, argv, c), code = rc < 0 ? 0 : rc;
  if (rc) goto out;
  rc = gguf_open(c->model, &g);
  if (!rc) rc = model_read_hparams(g, &hp);
  if (rc) {
    code = cli_fail("eval", rc);
    goto out;
  }
  const char *base = strrchr(c->model, '/');
  snprintf(res.model_name, sizeof res.model_name, "%s", base ? base + 1 : c->model);
  res.n_ctx = hp.n_ctx_train;
  if ((code = check_model_cfg(c, &hp))) goto out;
  if ((code = check_data_cfg(c, g, &ppl_ids, &n_ppl))) goto out;
  eval_outs_t outs = {0};
  rc = open_reports(c, &outs);
  if (!rc) rc = run_loaded(c, &res, ppl_ids, n_ppl, &outs);
  close_report(&outs.json, "--json", c->json, outs.json_tmp,
               1); /* (on errors: the partial files go) */
  close_report(&outs.md, "--markdown", c->markdown, outs.md_tmp, 1);
  code = rc ? cli_fail("eval", rc) : 0;
out:
  free(ppl_ids);
  gguf_close(g);
  eval_results_dispose(&res);
  free(c);
  return code;
}
