/* cli_bench_latency: `qevict bench latency`: one generation run under several KV policies,
 * each in a `qevict generate --json` process of its own (this program, re-executed), in an
 * order that rotates every round; reports per policy the medians of prefill and decode speed,
 * the KV bytes held against FullKV's, the process's peak memory and how many of the first
 * policy's tokens it reproduced. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_policy.h"
#include "qe_status.h"

static const char *lat_help =
    "usage: qevict bench latency (--model FILE | --shape NAME --prompt-len N) [options]\n"
    "Runs the same generation under each KV policy, each in a qevict generate process of its\n"
    "own, --rounds times in a rotating order, and prints the medians: prefill and decode\n"
    "tokens/s, time per output token, the KV bytes of sequence 0 (rank 0) against FullKV's,\n"
    "the process's peak memory, and how many of the first policy's tokens each reproduced.\n"
    "  --policies LIST   comma-separated NAME or NAME:BUDGET (budget as in --budget: a\n"
    "                    fraction of FullKV, or bytes; default full,qevict:0.2)\n"
    "  --rounds R        runs of each policy (default 3)\n"
    "  --input-words W   with --model and no prompt: a synthetic prompt of W words (default\n"
    "                    2000)\n"
    "  -n N              new tokens, at least 2 (default 128), generated with --ignore-eos\n"
    "  --json            one JSON object instead of the table\n"
    "Every other option goes to qevict generate as given (--prompt, --prompt-file, --chat,\n"
    "--batch, --threads, --tp, --device, --cpu-weights, --q, --window, --scorer, ...); see\n"
    "qevict generate --help, and checked by its rules before any input is read; the argument\n"
    "after an option of generate that takes a value is its value, whatever it looks like\n"
    "(--prompt --json: the prompt \"--json\"). --prompt-file\n"
    "F (a file, a FIFO, - for standard input) is read once, at most 64 MiB less 64 KiB, for\n"
    "every run. exit status: 0; 1 a run failed (its last message is printed); 2 bad usage.\n";

#define LAT_MAX_POL  16
#define LAT_MAX_ARGS 256

typedef struct {
  char name[64], budget[32];
} lat_pol_t;

typedef struct {
  lat_pol_t pol[LAT_MAX_POL];
  int n_pol, rounds, json, has_prompt, words_given;
  const char *prompt_file; /* --prompt-file F: read here once, each run reads its copy as "-" */
  int prompt_fd;           /* each run's standard input: F's copy or the synthetic prompt, or -1 */
  long n, words;
  const char *model;              /* --model's or --shape's value */
  const char *pass[LAT_MAX_ARGS]; /* options for generate */
  int n_pass;
  char names[LAT_MAX_ARGS / 2][64]; /* the flags of --flag=value options, split for generate */
  int n_names;
} lat_args_t;

/* One run's figures. */
typedef struct {
  double prefill_s, decode_s, prompt, gen, batch, fullkv, kv_bytes, rss_kb, dsteps, dtok;
  long *tokens;
  long n_tokens;
} lat_run_t;

/* ---- options ---- */

static int add_policy(lat_args_t *a, const char *item, size_t len) {
  lat_pol_t *p = &a->pol[a->n_pol];
  char buf[128];
  if (a->n_pol == LAT_MAX_POL || !len || len >= sizeof buf) return -1;
  memcpy(buf, item, len), buf[len] = '\0';
  char *colon = strchr(buf, ':');
  if (colon) *colon = '\0';
  if (!*buf || strlen(buf) >= sizeof p->name || (colon && (!colon[1] || strlen(colon + 1) >= 32)))
    return -1;
  cli_policy_t chk; /* the budget as generate's --budget takes it, checked before any run */
  cli_policy_init(&chk);
  if (cli_policy_parse(&chk, "--policy", buf) ||
      (colon && cli_policy_parse(&chk, "--budget", colon + 1)))
    return -1;
  snprintf(p->name, sizeof p->name, "%s", buf);
  snprintf(p->budget, sizeof p->budget, "%s", colon ? colon + 1 : "");
  for (int i = 0; i < a->n_pol; i++) /* (the same run twice: a repeated row) */
    if (!strcmp(a->pol[i].name, p->name) && !strcmp(a->pol[i].budget, p->budget)) return -1;
  a->n_pol++;
  return 0;
}

static int parse_policies(lat_args_t *a, const char *v) {
  char names[256];
  a->n_pol = 0;
  for (const char *p = v;; p++) {
    size_t len = strcspn(p, ",");
    if (add_policy(a, p, len))
      return cli_usage_error("bench latency",
                             "bad --policies '%s' (NAME or NAME:BUDGET, "
                             "comma-separated, none repeated, at most %d; NAME one of %s)",
                             v, LAT_MAX_POL, cli_policy_names(names, sizeof names));
    p += len;
    if (!*p) return 0;
  }
}

/* One of bench latency's own options with its value: 0 or the exit code after a message. */
static int own_opt(lat_args_t *a, const char *f, const char *v) {
  long l;
  if (!strcmp(f, "--policies")) return parse_policies(a, v);
  if (cli_parse_int(v, !strcmp(f, "-n") ? 2 : 1, !strcmp(f, "--rounds") ? 100 : 1 << 24, &l))
    return cli_usage_error("bench latency", "bad value '%s' for %s%s", v, f, cli_parse_note());
  if (!strcmp(f, "--rounds"))
    a->rounds = (int)l;
  else if (!strcmp(f, "-n"))
    a->n = l;
  else
    a->words = l, a->words_given = 1;
  return 0;
}

static int is_own(const char *f) {
  return !strcmp(f, "--policies") || !strcmp(f, "--rounds") || !strcmp(f, "--input-words") ||
         !strcmp(f, "-n");
}

static int lat_parse(int argc, char **argv, lat_args_t *a) {
  memset(a, 0, sizeof *a);
  a->rounds = 3, a->n = 128, a->words = 2000;
  parse_policies(a, "full,qevict:0.2");
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(f, "--help") || !strcmp(f, "-h")) return printf("%s", lat_help), -1;
    if (!strcmp(f, "--json")) {
      a->json = 1;
      continue;
    }
    if (!strcmp(f, "--ignore-eos")) continue; /* (always given to generate) */
    if (!strcmp(f, "--policy") || !strcmp(f, "--budget"))
      return cli_usage_error("bench latency", "%s: give the policies with --policies", f);
    char name[64];
    const char *eq = strncmp(f, "--", 2) ? NULL : strchr(f, '=');
    if (eq && (size_t)(eq - f) < sizeof name) /* --flag=value */
      memcpy(name, f, (size_t)(eq - f)), name[eq - f] = '\0', v = eq + 1;
    else
      snprintf(name, sizeof name, "%s", f), eq = NULL;
    if (is_own(name)) {
      int rc = v ? own_opt(a, name, v) : cli_usage_error("bench latency", "%s needs a value", f);
      if (rc) return rc;
      i += !eq;
      continue;
    }
    if (a->n_pass + 2 >= LAT_MAX_ARGS) return cli_usage_error("bench latency", "too many options");
    a->has_prompt |=
        !strcmp(name, "--prompt") || !strcmp(name, "--prompt-file") || !strcmp(name, "--shape");
    if ((!strcmp(name, "--model") || !strcmp(name, "--shape")) && v) a->model = v;
    if (!strcmp(name, "--prompt-file") && v) { /* (a FIFO reached the first run alone) */
      a->prompt_file = v, i += !eq;
      a->pass[a->n_pass++] = "--prompt-file", a->pass[a->n_pass++] = "-";
    } else if (!cli_generate_takes_value(name)) { /* a flag (--graphkv=... too), as given */
      a->pass[a->n_pass++] = f;
    } else if (eq) { /* (generate takes "--flag value"; n_names < n_pass / 2) */
      char *nm = a->names[a->n_names++];
      memcpy(nm, name, sizeof a->names[0]);
      a->pass[a->n_pass++] = nm, a->pass[a->n_pass++] = v;
    } else { /* the value, whatever it looks like ("--json" too), is the option's */
      a->pass[a->n_pass++] = f;
      if (v) a->pass[a->n_pass++] = v, i++;
    }
  }
  if (!a->model)
    return cli_usage_error("bench latency", "give --model FILE (or --shape NAME --prompt-len N)");
  if (a->words_given && a->has_prompt) /* (it had been ignored) */
    return cli_usage_error("bench latency", "--input-words makes the prompt: give no --prompt, "
                                            "--prompt-file or --shape with it");
  return 0;
}

/* ---- the runs ---- */

uint64_t cli_splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The synthetic prompt (cli.h). */
char *cli_bench_words(long words, uint64_t seed, long i) {
  static const char *const w[] = {
      "the",    "town",   "river",   "bridge", "market", "council", "honey", "wool",
      "salt",   "winter", "harbor",  "ledger", "stone",  "mill",    "road",  "lantern",
      "garden", "letter", "morning", "bread",  "copper", "tower",   "field", "weaver",
      "north",  "quiet",  "old",     "new",    "and",    "of",      "in",    "over"};
  uint64_t s = seed * 0x100000001b3ull + (uint64_t)i;
  size_t n = 0, cap = (size_t)words * 9 + 2;
  char *t = malloc(cap);
  if (!t) return NULL;
  for (long k = 0; k < words; k++) {
    uint64_t z = cli_splitmix64(&s);
    n += (size_t)snprintf(t + n, cap - n, "%s%s", k ? " " : "", w[z % (sizeof w / sizeof w[0])]);
  }
  t[n] = '\0';
  return t;
}

/* The child's argv for policy p (strings borrowed; n_text: -n's value): the bench's own options
 * (the synthetic prompt from standard input without a prompt), then generate's as given, last,
 * so that one given without its value ends the line (it took the bench's next argument for its
 * value: "bad value '--prompt-file' for --threads"). */
static void child_argv(const lat_args_t *a, const lat_pol_t *p, const char *n_text,
                       const char **av) {
  int k = 0;
  av[k++] = "qevict", av[k++] = "generate";
  if (!a->has_prompt) av[k++] = "--prompt-file", av[k++] = "-";
  av[k++] = "-n", av[k++] = n_text, av[k++] = "--ignore-eos", av[k++] = "--json";
  av[k++] = "--policy", av[k++] = p->name;
  if (*p->budget) av[k++] = "--budget", av[k++] = p->budget;
  for (int i = 0; i < a->n_pass; i++) av[k++] = a->pass[i];
  av[k] = NULL;
}

/* Reads all of fd into a malloc'd NUL-terminated buffer (NULL when out of memory). */
static char *read_all(int fd) {
  size_t n = 0, cap = 1 << 16;
  char *b = malloc(cap + 1);
  ssize_t r;
  while (b && (r = read(fd, b + n, cap - n)) > 0)
    if ((n += (size_t)r) == cap) {
      char *g = realloc(b, (cap *= 2) + 1);
      if (!g) free(b);
      b = g;
    }
  if (b) b[n] = '\0';
  return b;
}

/* The child: standard input from the start of in (unless -1), stdout into the pipe, stderr into
 * errf, killed with this process. */
static void child_exec(const char **av, int in, int pfd[2], int errf, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(127); /* (the parent died before the line above) */
  dup2(pfd[1], 1), dup2(errf, 2), close(pfd[0]), close(pfd[1]);
  if (in >= 0 && (lseek(in, 0, SEEK_SET) != 0 || dup2(in, 0) != 0)) {
    dprintf(2, "qevict bench latency: cannot give the prompt to a run: %s\n", strerror(errno));
    _exit(127);
  }
  execv("/proc/self/exe", (char *const *)av);
  dprintf(2, "qevict bench latency: cannot run qevict generate: %s\n", strerror(errno));
  _exit(127);
}

/* Runs av with stdin from in (-1: this process's), stdout into *out and stderr into errf: 0 when
 * it exited 0 and wrote something, else its exit status (> 0), or -1 (*rss_kb: its peak resident
 * memory). */
static int spawn(const char **av, int in, int errf, char **out, double *rss_kb) {
  int pfd[2];
  struct rusage ru;
  int status = 0;
  pid_t parent = getpid();
  *out = NULL;
  if (pipe(pfd)) return -1;
  fflush(stdout), fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) child_exec(av, in, pfd, errf, parent);
  close(pfd[1]);
  if (pid > 0) *out = read_all(pfd[0]);
  close(pfd[0]);
  if (pid < 0 || wait4(pid, &status, 0, &ru) != pid) return -1;
  *rss_kb = (double)ru.ru_maxrss;
  if (!WIFEXITED(status)) return -1;
  return WEXITSTATUS(status) ? WEXITSTATUS(status) : *out ? 0 : -1;
}

/* ---- a run's figures from generate's JSON ---- */

/* The number of "key": in doc after the first `after` (NAN when either is absent). */
static double jnum(const char *doc, const char *after, const char *key) {
  char k[64];
  const char *p = after ? strstr(doc, after) : doc;
  snprintf(k, sizeof k, "\"%s\":", key);
  if (!p || !(p = strstr(p, k))) return NAN;
  char *end;
  double v = strtod(p + strlen(k), &end);
  return end == p + strlen(k) ? NAN : v;
}

/* The generated ids ("tokens":[...]) into r. 0 or -1. */
static int jtokens(const char *doc, lat_run_t *r) {
  const char *p = strstr(doc, "\"tokens\":[");
  if (!p) return -1;
  p += 10;
  size_t cap = 1;
  for (const char *q = p; *q && *q != ']'; q++) cap += *q == ',';
  if (!(r->tokens = malloc(cap * sizeof *r->tokens))) return -1;
  while (*p && *p != ']') {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) break;
    r->tokens[r->n_tokens++] = v;
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}

static int parse_run(const char *doc, lat_run_t *r) {
  r->prefill_s = jnum(doc, "\"summary\":", "prefill_s");
  r->decode_s = jnum(doc, "\"summary\":", "decode_s");
  r->prompt = jnum(doc, "\"summary\":", "prompt_tokens");
  r->gen = jnum(doc, "\"summary\":", "generated_tokens");
  r->batch = jnum(doc, "\"summary\":", "batch");
  r->fullkv = jnum(doc, "\"summary\":", "fullkv_bytes");
  /* decode-only steps and their tokens (a prompt in several passes: fewer than gen - 1) */
  r->dsteps = jnum(doc, "\"summary\":", "decode_steps");
  r->dtok = jnum(doc, "\"summary\":", "decode_tokens");
  if (isnan(r->dsteps) || isnan(r->dtok)) r->dsteps = r->gen - 1, r->dtok = r->dsteps * r->batch;
  r->kv_bytes = jnum(doc, "\"memory\":", "bytes");
  if (isnan(r->kv_bytes)) r->kv_bytes = r->fullkv; /* FullKV: every token held */
  return isnan(r->prefill_s) || isnan(r->decode_s) || isnan(r->gen) || jtokens(doc, r) ? -1 : 0;
}

/* The last line of the text in f (a child's stderr) into buf. */
static void last_line(FILE *f, char *buf, size_t n) {
  char line[512];
  buf[0] = '\0';
  rewind(f);
  while (fgets(line, sizeof line, f))
    if (line[0] != '\n') snprintf(buf, n, "%s", line);
  buf[strcspn(buf, "\n")] = '\0';
}

/* What a run's message that its prompt is past the model's context means here (a run's '-' is
 * bench latency's copy of the prompt file or its synthetic prompt), into buf; "" otherwise. */
static const char *ctx_hint(const lat_args_t *a, const char *msg, char *buf, size_t n) {
  const int ctx = strstr(msg, "exceeds the model context") || /* tokens */
                  strstr(msg, "within the model's context");  /* bytes */
  buf[0] = '\0';
  if (ctx && a->prompt_file)
    snprintf(buf, n, " (the prompt of --prompt-file '%s', each run's input)", a->prompt_file);
  else if (ctx && !a->has_prompt)
    snprintf(buf, n, " (the synthetic prompt of --input-words words: give fewer, or --prompt)");
  return buf;
}

/* One run of policy p. 0, or the exit code after a message naming the policy and the child's
 * (2 when generate found its options bad, else 1). */
static int run_policy(const lat_args_t *a, const lat_pol_t *p, lat_run_t *r) {
  const char *av[LAT_MAX_ARGS + 16];
  char n_text[24], *out = NULL, msg[512] = "";
  FILE *ef = tmpfile();
  snprintf(n_text, sizeof n_text, "%ld", a->n);
  child_argv(a, p, n_text, av);
  int rc = ef ? spawn(av, a->prompt_fd, fileno(ef), &out, &r->rss_kb) : -1;
  if (!rc && parse_run(out, r)) rc = -2;
  if (rc == 127) rc = -1; /* (exec failed: its message is in ef) */
  if (rc) {
    if (ef) last_line(ef, msg, sizeof msg);
    char whose[4200];
    fprintf(stderr, "qevict bench latency: policy %s%s%s: %s%s\n", p->name, *p->budget ? ":" : "",
            p->budget,
            rc == -2     ? "generate's output does not read"
            : ef && *msg ? msg
                         : "failed",
            ctx_hint(a, msg, whose, sizeof whose));
  }
  if (ef) fclose(ef);
  free(out);
  return !rc ? 0 : rc == 2 ? 2 : 1;
}

/* ---- the report ---- */

typedef struct {
  double prefill_tps, decode_tps, tpot_ms, kv, fullkv, rss_kb;
  long same, n_tok;
} lat_row_t;

static int cmp_d(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Leading tokens of r that equal ref's. */
static long same_prefix(const lat_run_t *r, const lat_run_t *ref) {
  long k = 0;
  while (k < r->n_tokens && k < ref->n_tokens && r->tokens[k] == ref->tokens[k]) k++;
  return k;
}

/* Policy runs[0..rounds) summarized (ref: the first policy's first run). */
static lat_row_t row_of(const lat_run_t *runs, int rounds, const lat_run_t *ref) {
  double v[5][100];
  lat_row_t w = {0};
  for (int r = 0; r < rounds; r++) {
    const lat_run_t *x = &runs[r];
    v[0][r] = x->prompt * x->batch / x->prefill_s;
    v[1][r] = x->dtok / x->decode_s;
    v[2][r] = x->decode_s / x->dsteps * 1e3;
    v[3][r] = x->kv_bytes, v[4][r] = x->rss_kb;
  }
  w.prefill_tps = median(v[0], rounds), w.decode_tps = median(v[1], rounds);
  w.tpot_ms = median(v[2], rounds), w.kv = median(v[3], rounds), w.rss_kb = median(v[4], rounds);
  w.fullkv = runs[0].fullkv, w.same = same_prefix(&runs[0], ref), w.n_tok = runs[0].n_tokens;
  return w;
}

static void print_table(const lat_args_t *a, const lat_row_t *w, const lat_run_t *ref) {
  char kv[32], rss[32];
  char asked[48] = ""; /* (the model's context may stop a run short of -n) */
  if ((long)ref->gen != a->n) snprintf(asked, sizeof asked, " (of %ld asked)", a->n);
  printf("%d round(s), prompt %.0f tokens, %.0f new%s, batch %.0f; medians, ratios to %s%s%s\n",
         a->rounds, ref->prompt, ref->gen, asked, ref->batch, a->pol[0].name,
         *a->pol[0].budget ? ":" : "", a->pol[0].budget);
  printf("%-22s %18s %18s %9s %22s %11s %12s\n", "policy", "prefill tok/s", "decode tok/s",
         "TPOT ms", "KV bytes (of FullKV)", "peak RSS", "same tokens");
  for (int i = 0; i < a->n_pol; i++) {
    char name[100], pre[32], dec[32], kvs[48];
    snprintf(name, sizeof name, "%s%s%s", a->pol[i].name, *a->pol[i].budget ? ":" : "",
             a->pol[i].budget);
    snprintf(pre, sizeof pre, "%.1f (%.2fx)", w[i].prefill_tps,
             w[i].prefill_tps / w[0].prefill_tps);
    snprintf(dec, sizeof dec, "%.1f (%.2fx)", w[i].decode_tps, w[i].decode_tps / w[0].decode_tps);
    snprintf(kvs, sizeof kvs, "%s (%.3f)", cli_fmt_bytes(kv, sizeof kv, (uint64_t)w[i].kv),
             w[i].kv / w[i].fullkv);
    printf("%-22s %18s %18s %9.2f %22s %11s %5ld/%-6ld\n", name, pre, dec, w[i].tpot_ms, kvs,
           cli_fmt_bytes(rss, sizeof rss, (uint64_t)(w[i].rss_kb * 1024)), w[i].same, w[i].n_tok);
  }
}

static void print_json(const lat_args_t *a, const lat_row_t *w, const lat_run_t *ref) {
  printf("{\"rounds\":%d,\"prompt_tokens\":%.0f,\"new_tokens\":%.0f,\"new_tokens_asked\":%ld,"
         "\"batch\":%.0f,\"policies\":[",
         a->rounds, ref->prompt, ref->gen, a->n, ref->batch);
  for (int i = 0; i < a->n_pol; i++) {
    printf("%s{\"policy\":\"%s\",\"budget\":", i ? "," : "", a->pol[i].name);
    if (*a->pol[i].budget)
      printf("\"%s\"", a->pol[i].budget);
    else
      printf("null");
    printf(",\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"tpot_ms\":%.4f,\"kv_bytes\":%.0f,"
           "\"fullkv_bytes\":%.0f,\"peak_rss_bytes\":%.0f,\"same_tokens\":%ld,\"tokens\":%ld}",
           w[i].prefill_tps, w[i].decode_tps, w[i].tpot_ms, w[i].kv, w[i].fullkv,
           w[i].rss_kb * 1024, w[i].same, w[i].n_tok);
  }
  printf("]}\n");
}

/* Every run's options as generate checks them, before any input is read (a conflict such as
 * --prompt with --prompt-file - was reported after all of standard input): 0 or 2. */
static int check_runs(const lat_args_t *a) {
  const char *av[LAT_MAX_ARGS + 16];
  char n_text[24];
  int rc = 0;
  snprintf(n_text, sizeof n_text, "%ld", a->n);
  for (int p = 0; !rc && p < a->n_pol; p++) {
    int n = 0;
    child_argv(a, &a->pol[p], n_text, av);
    while (av[n]) n++;
    rc = cli_generate_usage(n - 1, (char **)av + 1);
  }
  return rc;
}

/* Every policy, --rounds times in rotating order, into runs[policy * rounds + round]. */
static int run_all(const lat_args_t *a, lat_run_t *runs) {
  for (int r = 0; r < a->rounds; r++)
    for (int k = 0; k < a->n_pol; k++) {
      int p = (k + r) % a->n_pol;
      if (!a->json)
        fprintf(stderr, "qevict bench latency: round %d/%d, %s%s%s\n", r + 1, a->rounds,
                a->pol[p].name, *a->pol[p].budget ? ":" : "", a->pol[p].budget);
      int rc = run_policy(a, &a->pol[p], &runs[p * a->rounds + r]);
      if (rc) return rc;
    }
  return 0;
}

/* The runs' prompt, --prompt-file's (read once, at most CLI_PROMPT_FILE_MAX bytes: no model
 * here to bound it; each run's generate bounds it by its model's) or the synthetic one, in an
 * unlinked temporary file that each run reads as its standard input (nothing is left behind
 * however this process ends). The descriptor, or -1 after a message. */
static int write_prompt(const lat_args_t *a) {
  const char *dir = getenv("TMPDIR");
  char tmpl[4096], *text = NULL;
  snprintf(tmpl, sizeof tmpl, "%s/qevict-bench-XXXXXX", dir && *dir ? dir : "/tmp");
  static const char *why = "the most bench latency reads of a prompt file";
  int rc =
      a->prompt_file ? cli_read_prompt_file(a->prompt_file, CLI_PROMPT_FILE_MAX, why, &text) : 0;
  if (!a->prompt_file && !(text = cli_bench_words(a->words, 0, 0)))
    rc = qe_errf(QE_ENOMEM, "the synthetic prompt: out of memory");
  int fd = rc ? -1 : mkstemp(tmpl);
  size_t len = text ? strlen(text) : 0;
  if (fd >= 0) unlink(tmpl);
  int ok = fd >= 0 && write(fd, text, len) == (ssize_t)len;
  free(text);
  if (ok) return fd;
  if (fd >= 0) close(fd);
  if (!rc) rc = qe_errf(QE_EIO, "cannot write the prompt to a temporary file");
  cli_fail("bench latency", rc);
  return -1;
}

/* 0 when every run timed decode steps; else (no TPOT to report: the model's context left room
 * for fewer than two new tokens) exit 1 with a message, not a table of NaNs. */
static int check_decoded(const lat_args_t *a, const lat_run_t *runs) {
  for (int i = 0; i < a->n_pol * a->rounds; i++)
    if (!(runs[i].dsteps > 0) || !(runs[i].decode_s > 0))
      return cli_fail("bench latency",
                      qe_errf(QE_ERANGE,
                              "no decode step to time: the prompt leaves the model's "
                              "context room for %.0f new token(s); a shorter prompt "
                              "is needed",
                              runs[i].gen));
  return 0;
}

int cli_bench_latency(int argc, char **argv) {
  lat_args_t a;
  int rc = lat_parse(argc, argv, &a);
  if (!rc) rc = check_runs(&a);
  if (rc) return rc < 0 ? 0 : rc;
  lat_run_t *runs = calloc((size_t)(a.n_pol * a.rounds), sizeof *runs);
  lat_row_t w[LAT_MAX_POL];
  if (!runs) rc = cli_fail("bench latency", QE_ENOMEM);
  a.prompt_fd = -1;
  if (!rc && (!a.has_prompt || a.prompt_file) && (a.prompt_fd = write_prompt(&a)) < 0) rc = 1;
  if (!rc) rc = run_all(&a, runs);
  if (!rc) rc = check_decoded(&a, runs);
  for (int i = 0; !rc && i < a.n_pol; i++) w[i] = row_of(&runs[i * a.rounds], a.rounds, &runs[0]);
  if (!rc && a.json)
    print_json(&a, w, &runs[0]);
  else if (!rc)
    print_table(&a, w, &runs[0]);
  for (int i = 0; runs && i < a.n_pol * a.rounds; i++) free(runs[i].tokens);
  free(runs);
  if (a.prompt_fd >= 0) close(a.prompt_fd);
  return rc;
}
