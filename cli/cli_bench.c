/* cli_bench: `qevict bench serve`, a load generator for a running qevict-sched: N Generate
 * streams over gRPC, C at a time (or arriving at a Poisson rate), with submit's request
 * options, reporting time to first token, time per output token, inter-token latency,
 * end-to-end latency and the scheduler's queue time (mean and percentiles), throughput and
 * the KV bytes each request reserved. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_rpc.h"
#include "cli_submit.h"
#include "gguf.h"
#include "qe_json.h"
#include "qe_status.h"
#include "tokenizer.h"

static const char *bench_help =
    "usage: qevict bench serve [options]\n"
    "Load-tests a running qevict-sched: --requests Generate streams, --concurrency at a time\n"
    "(or arriving at --rate per second), and prints time to first token (TTFT), time per\n"
    "output token after the first (TPOT), the gaps between streamed token events (ITL), end-to-\n"
    "end latency (E2E) and the scheduler's queue time, as mean and percentiles, with the\n"
    "throughput and the KV bytes each request reserved. Compare KV policies by running it\n"
    "once per policy (e.g. --policy full, then --policy qevict --budget 0.2).\n"
    "  --requests N      requests in all (default 64)\n"
    "  --concurrency C   at most C streams at once (default 8; with --rate, every request's\n"
    "                    own, up to 1024)\n"
    "  --rate R          requests per second, exponential gaps (--prompt-seed); default: all\n"
    "                    at once, C at a time\n"
    "  --input-words W   each request a different synthetic prompt of W words (default 256)\n"
    "  --input-len N --tokenizer MODEL.gguf   ... of exactly N tokens instead, by that file's\n"
    "                    tokenizer (the served model's, or one of the same vocabulary), sent\n"
    "                    as token ids\n"
    "  --prompt-seed S   seed of the synthetic prompts, lengths and arrivals (default 0)\n"
    "  --random-range-ratio R   each request's prompt length (synthetic prompts) and max new\n"
    "                    tokens drawn uniformly from [L(1-R), L(1+R)] around --input-words\n"
    "                    or --input-len and -n (0 <= R < 1; default 0: the same lengths)\n"
    "  --goodput SLO[,SLO...]   also report the requests/s that met every SLO, each\n"
    "                    ttft:MS, tpot:MS or e2e:MS (e.g. --goodput ttft:500,tpot:50)\n"
    "  --warmup N        requests run one at a time before the measured ones (default 0)\n"
    "  --save-result F   also write one JSON line per request sent to F (its times, tokens,\n"
    "                    KV bytes, status)\n"
    "  --prompt TEXT | --prompt-file F | --ids 1,2,3   every request sends this prompt instead\n"
    "  --chat [--system TEXT]   the prompt as a chat's user message (the model's template)\n"
    "  -n N              max new tokens per request (default 128)\n"
    "  --ignore-eos      generate exactly N tokens per request\n"
    "  --temp T --top-k K --top-p P --seed S --stop STR   sampling and stop strings\n"
    "  --policy NAME --budget B --q Q --window W --bits B --sink N --local N --scorer S\n"
    "  --graphkv[=k,m,T] the KV cache of every request (as qevict submit)\n"
    "A request that fails is counted, the report printed and the first failure told on\n"
    "stderr (exit 1); a warm-up request that fails stops the run; Ctrl-C cancels the streams\n"
    "and prints the report so far (exit 130). With --json: one JSON object (the figures in ms,\n"
    "bytes, tokens and seconds).\n" CLI_CLIENT_HELP;

enum { SLO_TTFT, SLO_TPOT, SLO_E2E, SLO_N };
static const char *const slo_name[SLO_N] = {"ttft", "tpot", "e2e"};

typedef struct {
  sub_args_t s; /* the request (submit's options) */
  long requests, concurrency, warmup, words;
  long input_len;              /* --input-len: synthetic prompts of this many tokens (0: words) */
  const char *tokenizer;       /* --tokenizer's GGUF file */
  int conc_given, words_given; /* --concurrency, --input-words were given */
  double rate, range;
  double slo[SLO_N]; /* --goodput's bounds in ms (0: none) */
  int has_slo;
  uint64_t seed;
  const char *save; /* --save-result FILE */
} bench_args_t;

/* One request's record: times in seconds from the start of the run. */
typedef struct {
  double t_send, t_first, t_last, t_end;
  long n_out;       /* tokens streamed */
  int sent;         /* the request was started */
  int interrupted;  /* Ctrl-C cancelled it */
  int code, finish; /* gRPC status; FinishReason (-1: no Finished event) */
  uint32_t prompt_tokens;
  uint64_t queue_us, reserved;
  double *gaps; /* between successive token events */
  size_t n_gaps, cap;
  char err[200];
} breq_t;

typedef struct {
  const bench_args_t *a;
  cli_rpc_t *c;
  uint8_t *req; /* the shared prompt's packed GenerateRequest (else each is packed when sent) */
  size_t len;
  int shared;
  double *arrival; /* --rate: each request's start, seconds from t0 */
  double t0;
  breq_t *rec;
  atomic_long next;
  atomic_int stop;    /* interrupted: start nothing more */
  atomic_int refused; /* a key refused, or (unreachable) the server: start nothing more (every
                         request would be refused, or fail) */
  atomic_int reached; /* a stream got an answer other than UNAVAILABLE */
  FILE *save;         /* --save-result's file, opened before the run */
  int32_t *stream;    /* --input-len: a synthetic text tokenized once (no BOS) ... */
  long n_stream;      /* ... its ids, more than the longest prompt needs */
  int32_t bos;        /* the BOS each prompt starts with (-1: the model adds none) */
} bench_run_t;

/* ---- options ---- */

/* Whether a comma list has an item of blanks alone or none ("a,", ",a", "a, ,b"). */
static int has_empty_item(const char *v) {
  int blank = 1;
  for (const char *p = v;; p++) {
    if (*p == ',' || !*p) {
      if (blank) return 1;
      if (!*p) return 0;
      blank = 1;
    } else if (*p != ' ') {
      blank = 0;
    }
  }
}

/* --goodput's value: KEY:MS items separated by commas or spaces (KEY ttft, tpot or e2e, MS >
 * 0, each key once), into a->slo (a later flag adds to or replaces earlier bounds). 0 or
 * CLI_OPT_PRINTED. */
static int parse_goodput(bench_args_t *a, const char *v) {
  char buf[256], *save = NULL;
  int n = 0, seen = 0;
  if (strlen(v) >= sizeof buf)
    return cli_usage_error("bench serve", "--goodput: too long"), CLI_OPT_PRINTED;
  if (strchr(v, ',') && has_empty_item(v)) /* (strtok_r skipped "ttft:5,"'s empty item) */
    return cli_usage_error("bench serve", "--goodput: an empty item in '%s'", v), CLI_OPT_PRINTED;
  strcpy(buf, v);
  for (char *it = strtok_r(buf, ", ", &save); it; it = strtok_r(NULL, ", ", &save), n++) {
    char *colon = strchr(it, ':');
    int k = 0;
    double ms = 0;
    if (colon) *colon = '\0';
    while (k < SLO_N && strcmp(it, slo_name[k])) k++;
    if (!colon || k == SLO_N || cli_parse_float(colon + 1, 1e-3, 1e9, &ms))
      return cli_usage_error("bench serve",
                             "--goodput: '%s%s%s' is not ttft:MS, tpot:MS or e2e:MS (MS > 0)", it,
                             colon ? ":" : "", colon ? colon + 1 : ""),
             CLI_OPT_PRINTED;
    if (seen & 1 << k)
      return cli_usage_error("bench serve", "--goodput: %s given twice", slo_name[k]),
             CLI_OPT_PRINTED;
    seen |= 1 << k;
    a->slo[k] = ms;
  }
  if (!n) return cli_usage_error("bench serve", "--goodput: no SLO given"), CLI_OPT_PRINTED;
  a->has_slo = 1;
  return 0;
}

static int bench_opt(void *ud, const char *f, const char *v) {
  bench_args_t *a = ud;
  if (!strcmp(f, "--detach") || !strcmp(f, "--request-id")) return 1; /* (submit's alone) */
  if (v && !strcmp(f, "--requests")) return cli_parse_int(v, 1, 1 << 22, &a->requests) ? 2 : 0;
  if (v && !strcmp(f, "--concurrency"))
    return a->conc_given = 1, cli_parse_int(v, 1, 4096, &a->concurrency) ? 2 : 0;
  if (v && !strcmp(f, "--warmup")) return cli_parse_int(v, 0, 1 << 20, &a->warmup) ? 2 : 0;
  if (v && !strcmp(f, "--input-words"))
    return a->words_given = 1, cli_parse_int(v, 1, 1 << 20, &a->words) ? 2 : 0;
  if (v && !strcmp(f, "--input-len")) return cli_parse_int(v, 1, 1 << 20, &a->input_len) ? 2 : 0;
  if (v && !strcmp(f, "--tokenizer")) return *v ? (a->tokenizer = v, 0) : 2;
  if (v && !strcmp(f, "--prompt-seed")) return cli_parse_u64(v, &a->seed) ? 2 : 0;
  if (v && !strcmp(f, "--rate")) return cli_parse_float(v, 1e-6, 1e6, &a->rate) ? 2 : 0;
  if (v && !strcmp(f, "--random-range-ratio"))
    return cli_parse_float(v, 0, 0.999, &a->range) ? 2 : 0;
  if (v && !strcmp(f, "--goodput")) return parse_goodput(a, v);
  if (v && !strcmp(f, "--save-result")) return *v ? (a->save = v, 0) : 2;
  return cli_sub_opt(&a->s, f, v);
}

/* 0, -1 (help printed) or an exit code. */
static int bench_parse(int argc, char **argv, bench_args_t *a) {
  static const char *const flags[] = {"--json", "--chat", "--ignore-eos", "--graphkv", NULL};
  const char *pos[1];
  int n_pos;
  memset(a, 0, sizeof *a);
  cli_sub_init(&a->s, "bench serve");
  a->requests = 64, a->concurrency = 8, a->words = 256;
  int rc =
      cli_args_parse("bench serve", argc, argv, bench_help, flags, bench_opt, a, pos, 0, &n_pos);
  if (rc) return rc;
  if (!!a->s.prompt + !!a->s.prompt_file + !!a->s.ids > 1)
    return cli_usage_error("bench serve", "give at most one of --prompt, --prompt-file and --ids");
  if (a->s.chat && a->s.ids)
    return cli_usage_error("bench serve", "--chat needs a text prompt, not --ids");
  if (a->s.system && !a->s.chat) return cli_usage_error("bench serve", "--system needs --chat");
  if (!!a->input_len != !!a->tokenizer)
    return cli_usage_error("bench serve", "--input-len and --tokenizer go together");
  if (a->input_len && (a->words_given || a->s.prompt || a->s.prompt_file || a->s.ids))
    return cli_usage_error("bench serve", "--input-len makes the prompts: give no --input-words, "
                                          "--prompt, --prompt-file or --ids with it");
  if (a->words_given && (a->s.prompt || a->s.prompt_file || a->s.ids)) /* (it had been ignored) */
    return cli_usage_error("bench serve", "--input-words makes the prompts: give no --prompt, "
                                          "--prompt-file or --ids with it");
  if (a->input_len && a->s.chat)
    return cli_usage_error("bench serve", "--chat needs a text prompt, not --input-len's ids");
  if (a->rate > 0 && !a->conc_given) a->concurrency = a->requests < 1024 ? a->requests : 1024;
  if (a->concurrency > a->requests) a->concurrency = a->requests;
  return 0;
}

/* ---- the requests ---- */

/* A length drawn uniformly from [floor(L(1-R)), ceil(L(1+R))] (at least 1) by z. */
static long draw_len(long L, double r, uint64_t z) {
  long lo = (long)floor((double)L * (1 - r)), hi = (long)ceil((double)L * (1 + r));
  lo = lo < 1 ? 1 : lo, hi = hi < lo ? lo : hi;
  return lo + (long)(z % (uint64_t)(hi - lo + 1));
}

/* Request i's synthetic prompt length (words, or tokens with --input-len) and max new tokens
 * (--random-range-ratio around them, from the prompt seed). */
static void req_lens(const bench_args_t *a, long i, long *in, long *n) {
  uint64_t st = (a->seed ^ 0x1e4b7ull) * 0x9e3779b97f4a7c15ull + (uint64_t)i;
  uint64_t zw = cli_splitmix64(&st), zn = cli_splitmix64(&st);
  const long L = a->input_len ? a->input_len : a->words;
  *in = a->range > 0 ? draw_len(L, a->range, zw) : L;
  *n = a->range > 0 ? draw_len(a->s.n, a->range, zn) : a->s.n;
}

/* Request i's synthetic prompt of exactly n_tok tokens into *out (malloc'd): the model's BOS
 * where it adds one, then a window of the tokenized text R->stream at an offset drawn from the
 * prompt seed (no tokenizer call while the run is timed). */
static int token_prompt(bench_run_t *R, long i, long n_tok, uint32_t **out) {
  const long body = R->bos >= 0 ? n_tok - 1 : n_tok;
  uint64_t st = (R->a->seed ^ 0x70fe11ull) * 0x9e3779b97f4a7c15ull + (uint64_t)i;
  const long off = (long)(cli_splitmix64(&st) % (uint64_t)(R->n_stream - body + 1));
  uint32_t *ids = *out = malloc(sizeof *ids * (size_t)n_tok);
  if (!ids) return qe_errf(QE_ENOMEM, "no memory for a prompt");
  if (R->bos >= 0) ids[0] = (uint32_t)R->bos;
  for (long k = 0; k < body; k++) ids[(R->bos >= 0) + k] = (uint32_t)R->stream[off + k];
  return 0;
}

/* --tokenizer: tokenizes a synthetic text once, past the longest prompt --input-len (with
 * --random-range-ratio) asks for, into R->stream. 0 or an exit code after a message. */
static int tokenize_stream(const bench_args_t *a, bench_run_t *R) {
  gguf_t *g = NULL;
  tok_t *t = NULL;
  const long most = (long)ceil((double)a->input_len * (1 + a->range)) + 1;
  long words;
  int rc = gguf_open(a->tokenizer, &g);
  if (!rc) rc = tok_create(g, &t);
  if (rc) {
    gguf_close(g);
    return cli_usage_error("bench serve", "--tokenizer '%s': %s", a->tokenizer, qe_errmsg());
  }
  R->bos = tok_add_bos(t) ? tok_bos(t) : -1;
  for (words = 2 * most + 16; !rc && R->n_stream < most && words <= 64 * most + 64; words *= 2) {
    char *text = cli_bench_words(words, a->seed, -1);
    size_t n = 0;
    free(R->stream), R->stream = NULL;
    rc = text ? tok_encode(t, text, strlen(text), 0, 0, &R->stream, &n) : QE_ENOMEM;
    R->n_stream = rc ? 0 : (long)n;
    free(text);
  }
  tok_destroy(t), gguf_close(g);
  if (!rc && R->n_stream < most)
    rc = qe_errf(QE_ERANGE, "--tokenizer '%s' makes fewer than %ld tokens of the synthetic text",
                 a->tokenizer, most);
  return rc ? cli_fail("bench serve", rc) : 0;
}

/* Packs request i (its own synthetic prompt, or the given one) into *buf (malloc'd). 0, or a
 * QE_E* code from building it (an unreadable or empty prompt, bad ids) or QE_ENOMEM. */
static int pack_one(bench_run_t *R, long i, uint8_t **buf, size_t *len) {
  const bench_args_t *a = R->a;
  sub_args_t s = a->s;
  sub_req_t r;
  char *text = NULL;
  uint32_t *ids = NULL;
  long in;
  int rc = 0;
  *buf = NULL;
  req_lens(a, i, &in, &s.n);
  if (a->input_len)
    rc = token_prompt(R, i, in, &ids), s.id_vec = ids, s.n_id_vec = (size_t)in;
  else if (!s.prompt && !s.prompt_file && !s.ids &&
           !(s.prompt = text = cli_bench_words(in, a->seed, i)))
    rc = qe_errf(QE_ENOMEM, "no memory for a prompt");
  if (rc) return rc;
  rc = cli_sub_build(&s, &r) ? QE_EINVAL : 0;
  if (!rc) {
    *len = protobuf_c_message_get_packed_size(&r.req.base);
    if (!(*buf = malloc(*len ? *len : 1)))
      rc = qe_errf(QE_ENOMEM, "no memory for a request of %zu bytes", *len);
    else
      protobuf_c_message_pack(&r.req.base, *buf);
    cli_sub_req_free(&r);
  }
  free(text), free(ids);
  return rc;
}

/* The shared prompt packed once, or the first synthetic one built as a check. 0 or an exit
 * code after a message. */
static int pack_first(const bench_args_t *a, bench_run_t *R) {
  if (a->tokenizer) {
    int rc = tokenize_stream(a, R);
    if (rc) return rc;
  }
  R->shared = (a->s.prompt || a->s.prompt_file || a->s.ids) && a->range == 0;
  int rc = pack_one(R, 0, &R->req, &R->len);
  if (rc == QE_EINVAL) return CLI_EXIT_USAGE; /* (cli_sub_build printed why) */
  if (rc) return cli_fail("bench serve", rc);
  if (!R->shared) free(R->req), R->req = NULL;
  return 0;
}

/* --rate: exponential gaps of mean 1/rate from the prompt seed. */
static int make_arrivals(const bench_args_t *a, bench_run_t *R) {
  if (a->rate <= 0) return 0;
  if (!(R->arrival = malloc(sizeof(double) * (size_t)a->requests)))
    return cli_fail("bench serve", QE_ENOMEM);
  uint64_t s = a->seed ^ 0x5eedull;
  double t = 0;
  for (long i = 0; i < a->requests; i++) {
    R->arrival[i] = t;
    double u = ((cli_splitmix64(&s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* in (0, 1) */
    t += -log(u) / a->rate;
  }
  return 0;
}

/* ---- running ---- */

static void rec_gap(breq_t *q, double gap) {
  if (q->n_gaps == q->cap) {
    size_t c = q->cap ? 2 * q->cap : 64;
    double *g = realloc(q->gaps, c * sizeof *g);
    if (!g) return; /* (a gap less in the percentiles) */
    q->gaps = g, q->cap = c;
  }
  q->gaps[q->n_gaps++] = gap;
}

typedef struct {
  breq_t *q;
  double t0;
} ev_ctx_t;

static int on_event(void *ud, const uint8_t *msg, size_t len) {
  ev_ctx_t *x = ud;
  breq_t *q = x->q;
  double t = cli_now_s() - x->t0;
  Qevict__V1__Event *e = qevict__v1__event__unpack(NULL, len, msg);
  if (!e) return qe_errf(QE_EFORMAT, "an event from the server does not decode");
  if (e->kind_case == QEVICT__V1__EVENT__KIND_TOKENS && e->tokens->n_ids) {
    if (q->n_out)
      rec_gap(q, t - q->t_last);
    else
      q->t_first = t;
    q->t_last = t;
    q->n_out += (long)e->tokens->n_ids;
  } else if (e->kind_case == QEVICT__V1__EVENT__KIND_STARTED) {
    q->reserved = e->started->reserved_bytes;
  } else if (e->kind_case == QEVICT__V1__EVENT__KIND_FINISHED) {
    const Qevict__V1__Finished *f = e->finished;
    q->finish = f->reason;
    if (f->usage) q->prompt_tokens = f->usage->prompt_tokens, q->queue_us = f->usage->queue_time_us;
    if (*f->error) snprintf(q->err, sizeof q->err, "%s", f->error);
  }
  qevict__v1__event__free_unpacked(e, NULL);
  return 0;
}

/* Records the ending of a stream (rc, st) in q. */
static void rec_end(bench_run_t *R, breq_t *q, int rc, const cli_rpc_status_t *st) {
  q->t_end = cli_now_s() - R->t0;
  q->code = rc ? (rc == QE_ECOMM ? st->code : -1) : 0;
  if (rc == QE_ECOMM)
    snprintf(q->err, sizeof q->err, "%s: %.160s", qe_grpc_code_name(st->code, 0), st->message);
  else if (rc)
    snprintf(q->err, sizeof q->err, "%s", rc == QE_ECANCELED ? "interrupted" : qe_errmsg());
  if (rc == QE_ECANCELED) atomic_store(&R->stop, 1), q->interrupted = 1;
  if (q->code == 16 || q->code == 7) atomic_store(&R->refused, 1); /* UNAUTHENTICATED, ... */
  /* UNAVAILABLE before the server ever answered: none would reach it (4M requests to a dead
   * port had run on for minutes); after an answer, a passing outage is counted, not a stop */
  if (q->code != 14 || q->t_first >= 0)
    atomic_store(&R->reached, 1);
  else if (!atomic_load(&R->reached))
    atomic_store(&R->refused, 1);
}

/* One stream (request i, packed here unless shared) into its record q. */
static void run_one(bench_run_t *R, long i, breq_t *q) {
  cli_rpc_status_t st = {0, ""};
  uint8_t *own = NULL;
  size_t len = R->len;
  memset(q, 0, sizeof *q);
  q->finish = -1, q->t_first = -1, q->sent = 1;
  ev_ctx_t x = {q, R->t0};
  int rc = R->shared ? 0 : pack_one(R, i, &own, &len);
  q->t_send = cli_now_s() - R->t0;
  if (!rc)
    rc = cli_rpc_stream(R->c, "/qevict.v1.Generation/Generate", R->shared ? R->req : own, len,
                        R->a->s.cl.timeout_s, on_event, &x, &st);
  free(own);
  rec_end(R, q, rc, &st);
}

/* Waits until time t in slices of at most 50 ms, while no Ctrl-C came and nothing was refused
 * (a refused key or an unreachable server: the requests still waiting are not sent). */
static void sleep_until(bench_run_t *R, double t) {
  for (double d;
       (d = t - cli_now_s()) > 0 && !cli_rpc_interrupted() && !atomic_load(&R->refused);) {
    d = d < 0.05 ? d : 0.05;
    struct timespec ts = {0, (long)(d * 1e9)};
    nanosleep(&ts, NULL);
  }
  if (cli_rpc_interrupted()) atomic_store(&R->stop, 1);
}

static void *bench_thread(void *arg) {
  bench_run_t *R = arg;
  for (;;) {
    long i = atomic_fetch_add(&R->next, 1);
    if (i >= R->a->requests || atomic_load(&R->stop) || atomic_load(&R->refused)) break;
    if (R->arrival) sleep_until(R, R->t0 + R->arrival[i]);
    if (!atomic_load(&R->stop) && !atomic_load(&R->refused)) run_one(R, i, &R->rec[i]);
  }
  return NULL;
}

/* The warm-up requests, one at a time: 0, or the exit code after telling why one failed. */
static int warm_up(bench_run_t *R) {
  breq_t q;
  R->t0 = cli_now_s();
  for (long w = 0; w < R->a->warmup; w++) {
    run_one(R, 0, &q);
    free(q.gaps);
    if (q.interrupted)
      return fprintf(stderr, "qevict bench serve: interrupted\n"), CLI_EXIT_INTERRUPTED;
    if (q.code || q.finish <= 0 || q.finish == QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR) {
      fprintf(stderr, "qevict bench serve: the warm-up request failed: %s\n",
              *q.err ? q.err : "no Finished event");
      return q.code == 16 || q.code == 7 ? CLI_EXIT_AUTH : CLI_EXIT_RPC;
    }
  }
  return 0;
}

/* The measured requests on concurrency threads. 0 or QE_ECANCELED (interrupted). */
static int run_all(bench_run_t *R) {
  long nt = R->a->concurrency;
  pthread_t *th = calloc((size_t)nt, sizeof *th);
  if (!th) return cli_fail("bench serve", QE_ENOMEM), QE_ENOMEM;
  R->t0 = cli_now_s();
  long started = 0;
  for (; started < nt; started++)
    if (pthread_create(&th[started], NULL, bench_thread, R)) break;
  if (!started) bench_thread(R); /* (no thread could start: run them here, one at a time) */
  for (long k = 0; k < started; k++) pthread_join(th[k], NULL);
  free(th);
  return atomic_load(&R->stop) || cli_rpc_interrupted() ? QE_ECANCELED : 0;
}

/* ---- the report ---- */

static int ok_finish(const breq_t *q) {
  return q->sent && q->code == 0 && q->finish > 0 &&
         q->finish != QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR &&
         q->finish != QEVICT__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
}

typedef struct {
  double mean, std, p50, p90, p99, max; /* std: the population standard deviation */
  long n;
} dist_t;

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* Percentile p of sorted v (linear between the closest ranks). */
static double pct(const double *v, long n, double p) {
  double r = p / 100.0 * (double)(n - 1);
  long lo = (long)r;
  return lo + 1 < n ? v[lo] + (r - (double)lo) * (v[lo + 1] - v[lo]) : v[n - 1];
}

/* Summary of n values in ms (v is sorted in place). */
static dist_t dist_of(double *v, long n) {
  dist_t d = {NAN, NAN, NAN, NAN, NAN, NAN, n};
  if (!n) return d;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  double s = 0, s2 = 0;
  for (long i = 0; i < n; i++) s += v[i];
  for (long i = 0; i < n; i++) s2 += (v[i] - s / (double)n) * (v[i] - s / (double)n);
  d.mean = s / (double)n * 1e3, d.max = v[n - 1] * 1e3, d.std = sqrt(s2 / (double)n) * 1e3;
  d.p50 = pct(v, n, 50) * 1e3, d.p90 = pct(v, n, 90) * 1e3, d.p99 = pct(v, n, 99) * 1e3;
  return d;
}

enum { D_TTFT, D_TPOT, D_ITL, D_E2E, D_QUEUE, D_N };
static const char *const dist_name[D_N] = {"ttft", "tpot", "itl", "e2e", "queue"};

typedef struct {
  long done, failed, auth_failed, interrupted, out_tokens, in_tokens;
  long met;        /* completed requests within every --goodput bound */
  double duration; /* first send to last end */
  double reserved_mean;
  uint64_t reserved_max;
  dist_t d[D_N];
  const breq_t *first_fail;
} bench_sum_t;

/* The latency values of the completed requests, one kind at a time. */
static long collect(const bench_run_t *R, int kind, double *v) {
  long n = 0;
  for (long i = 0; i < R->a->requests; i++) {
    const breq_t *q = &R->rec[i];
    if (!ok_finish(q)) continue;
    if (kind == D_TTFT && q->n_out) v[n++] = q->t_first - q->t_send;
    if (kind == D_TPOT && q->n_out > 1) v[n++] = (q->t_last - q->t_first) / (double)(q->n_out - 1);
    if (kind == D_E2E) v[n++] = q->t_end - q->t_send;
    if (kind == D_QUEUE) v[n++] = (double)q->queue_us * 1e-6;
    for (size_t g = 0; kind == D_ITL && g < q->n_gaps; g++) v[n++] = q->gaps[g];
  }
  return n;
}

/* Whether completed request q met every --goodput bound (TPOT 0 below two tokens; no TTFT
 * without a token). */
static int slo_met(const bench_args_t *a, const breq_t *q) {
  const double ttft = q->n_out ? (q->t_first - q->t_send) * 1e3 : INFINITY;
  const double tpot = q->n_out > 1 ? (q->t_last - q->t_first) / (double)(q->n_out - 1) * 1e3 : 0;
  const double v[SLO_N] = {ttft, tpot, (q->t_end - q->t_send) * 1e3};
  for (int k = 0; k < SLO_N; k++)
    if (a->slo[k] > 0 && !(v[k] <= a->slo[k])) return 0;
  return ok_finish(q);
}

static void count(const bench_run_t *R, bench_sum_t *S) {
  double t_lo = INFINITY, t_hi = 0, res = 0;
  for (long i = 0; i < R->a->requests; i++) {
    const breq_t *q = &R->rec[i];
    if (!q->sent) continue; /* (interrupted, or a key refused, first) */
    if (q->interrupted) {
      S->interrupted++;
      continue;
    }
    t_lo = q->t_send < t_lo ? q->t_send : t_lo, t_hi = q->t_end > t_hi ? q->t_end : t_hi;
    if (!ok_finish(q)) {
      S->failed++;
      S->auth_failed += q->code == 16 || q->code == 7; /* UNAUTHENTICATED, PERMISSION_DENIED */
      if (!S->first_fail) S->first_fail = q;
      continue;
    }
    S->done++, S->out_tokens += q->n_out, S->in_tokens += q->prompt_tokens;
    S->met += R->a->has_slo && slo_met(R->a, q);
    res += (double)q->reserved;
    S->reserved_max = q->reserved > S->reserved_max ? q->reserved : S->reserved_max;
  }
  S->duration = t_hi > t_lo ? t_hi - t_lo : 0;
  S->reserved_mean = S->done ? res / (double)S->done : 0;
}

static int summarize(const bench_run_t *R, bench_sum_t *S) {
  size_t cap = 1;
  memset(S, 0, sizeof *S);
  count(R, S);
  for (long i = 0; i < R->a->requests; i++) cap += R->rec[i].n_gaps + 1;
  double *v = malloc(cap * sizeof *v);
  if (!v) return QE_ENOMEM;
  for (int k = 0; k < D_N; k++) S->d[k] = dist_of(v, collect(R, k, v));
  free(v);
  return 0;
}

static void print_dist_json(const char *name, const dist_t *d) {
  printf(",\"%s_ms\":{\"n\":%ld,\"mean\":", name, d->n);
  qe_json_num(stdout, d->mean);
  printf(",\"std\":"), qe_json_num(stdout, d->std);
  printf(",\"p50\":"), qe_json_num(stdout, d->p50);
  printf(",\"p90\":"), qe_json_num(stdout, d->p90);
  printf(",\"p99\":"), qe_json_num(stdout, d->p99);
  printf(",\"max\":"), qe_json_num(stdout, d->max);
  printf("}");
}

/* ,"goodput":{"slo_ms":{..},"met":N,"request_goodput":X} */
static void print_goodput_json(const bench_args_t *a, const bench_sum_t *S, double dur) {
  printf(",\"goodput\":{\"slo_ms\":{");
  for (int k = 0, n = 0; k < SLO_N; k++)
    if (a->slo[k] > 0) printf("%s\"%s\":%.6g", n++ ? "," : "", slo_name[k], a->slo[k]);
  printf("},\"met\":%ld,\"request_goodput\":", S->met);
  qe_json_num(stdout, (double)S->met / dur);
  printf("}");
}

static long not_sent(const bench_args_t *a, const bench_sum_t *S) {
  return a->requests - S->done - S->failed - S->interrupted;
}

static void print_json(const bench_args_t *a, const bench_sum_t *S) {
  double dur = S->duration > 0 ? S->duration : NAN;
  printf("{\"requests\":%ld,\"concurrency\":%ld,\"rate\":", a->requests, a->concurrency);
  qe_json_num(stdout, a->rate > 0 ? a->rate : NAN);
  printf(",\"max_tokens\":%ld,\"completed\":%ld,\"failed\":%ld,\"interrupted\":%ld,"
         "\"not_sent\":%ld,\"duration_s\":",
         a->s.n, S->done, S->failed, S->interrupted, not_sent(a, S));
  qe_json_num(stdout, S->duration);
  printf(",\"prompt_tokens\":%ld,\"output_tokens\":%ld,\"request_throughput\":", S->in_tokens,
         S->out_tokens);
  qe_json_num(stdout, (double)S->done / dur);
  printf(",\"output_throughput\":"), qe_json_num(stdout, (double)S->out_tokens / dur);
  printf(",\"total_token_throughput\":");
  qe_json_num(stdout, (double)(S->in_tokens + S->out_tokens) / dur);
  printf(",\"reserved_bytes_mean\":"), qe_json_num(stdout, S->reserved_mean);
  printf(",\"reserved_bytes_max\":%llu", (unsigned long long)S->reserved_max);
  if (a->has_slo) print_goodput_json(a, S, dur);
  for (int k = 0; k < D_N; k++) print_dist_json(dist_name[k], &S->d[k]);
  printf("}\n");
}

static void print_text(const bench_args_t *a, const bench_sum_t *S) {
  static const char *const label[D_N] = {"TTFT", "TPOT", "ITL", "E2E", "queue"};
  char res[32], rmax[32];
  double dur = S->duration > 0 ? S->duration : NAN;
  printf("requests %ld (at most %ld at a time%s): completed %ld, failed %ld, ", a->requests,
         a->concurrency < a->requests ? a->concurrency : a->requests,
         a->rate > 0 ? ", Poisson arrivals" : "", S->done, S->failed);
  if (S->interrupted) printf("interrupted %ld, ", S->interrupted); /* (and the rest not sent) */
  printf("not sent %ld, in %.2f s\n", not_sent(a, S), S->duration);
  if (dur > 0)
    printf("throughput: %.2f requests/s, %.1f output tokens/s, %.1f tokens/s in all (%ld prompt "
           "and %ld output tokens)\n",
           (double)S->done / dur, (double)S->out_tokens / dur,
           (double)(S->in_tokens + S->out_tokens) / dur, S->in_tokens, S->out_tokens);
  else
    printf("throughput: - (nothing was timed)\n");
  if (a->has_slo) {
    if (dur > 0)
      printf("goodput: %.2f requests/s (", (double)S->met / dur);
    else
      printf("goodput: - (");
    printf("%ld of %ld completed requests within", S->met, S->done);
    for (int k = 0, n = 0; k < SLO_N; k++)
      if (a->slo[k] > 0) printf("%s %s %.6g ms", n++ ? "," : "", slo_name[k], a->slo[k]);
    printf(")\n");
  }
  printf("KV reserved per request: mean %s, max %s\n",
         cli_fmt_bytes(res, sizeof res, (uint64_t)S->reserved_mean),
         cli_fmt_bytes(rmax, sizeof rmax, S->reserved_max));
  printf("%-8s %10s %10s %10s %10s %10s %10s %8s\n", "ms", "mean", "std", "p50", "p90", "p99",
         "max", "n");
  for (int k = 0; k < D_N; k++) {
    const dist_t *d = &S->d[k];
    printf("%-8s %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %8ld\n", label[k], d->mean, d->std,
           d->p50, d->p90, d->p99, d->max, d->n);
  }
}

/* One request's line of --save-result. */
static void save_line(FILE *f, const bench_args_t *a, long i, const breq_t *q) {
  char fin[32];
  long in, n;
  req_lens(a, i, &in, &n);
  fprintf(f, "{\"request\":%ld,\"sent_s\":%.6f,\"max_tokens\":%ld,", i, q->t_send, n);
  if (!a->s.prompt && !a->s.prompt_file && !a->s.ids)
    fprintf(f, "\"input_%s\":%ld,", a->input_len ? "len" : "words", in);
  if (a->has_slo) fprintf(f, "\"slo_met\":%s,", slo_met(a, q) ? "true" : "false");
  fprintf(f, "\"ttft_ms\":");
  qe_json_num(f, q->n_out ? (q->t_first - q->t_send) * 1e3 : NAN);
  fprintf(f, ",\"tpot_ms\":");
  qe_json_num(f, q->n_out > 1 ? (q->t_last - q->t_first) / (double)(q->n_out - 1) * 1e3 : NAN);
  fprintf(f,
          ",\"e2e_ms\":%.3f,\"queue_ms\":%.3f,\"prompt_tokens\":%u,\"output_tokens\":%ld,"
          "\"reserved_bytes\":%llu,\"status\":\"%s\",\"finish\":\"%s\",\"error\":",
          (q->t_end - q->t_send) * 1e3, (double)q->queue_us * 1e-3, q->prompt_tokens, q->n_out,
          (unsigned long long)q->reserved,
          q->interrupted ? "INTERRUPTED"
          : q->code < 0  ? "CLIENT_ERROR"
                         : qe_grpc_code_name(q->code, 0),
          q->finish > 0
              ? cli_enum_short(&qevict__v1__finish_reason__descriptor, q->finish, fin, sizeof fin)
              : "");
  qe_json_str(f, q->err, strlen(q->err));
  fputs("}\n", f);
}

/* --save-result: the requests sent, a JSON line each, into R->save (closed). 0, or 1 after a
 * message. */
static int save_results(bench_run_t *R) {
  FILE *f = R->save;
  R->save = NULL;
  for (long i = 0; i < R->a->requests; i++)
    if (R->rec[i].sent) save_line(f, R->a, i, &R->rec[i]);
  int bad = ferror(f) | fclose(f);
  if (bad) fprintf(stderr, "qevict bench serve: --save-result '%s': a write failed\n", R->a->save);
  return bad ? CLI_EXIT_RPC : 0;
}

/* The exit status of a finished run, the first failure told on stderr. */
static int bench_status(const bench_sum_t *S, int interrupted) {
  if (interrupted)
    return fprintf(stderr, "qevict bench serve: interrupted\n"), CLI_EXIT_INTERRUPTED;
  if (!S->failed) return 0;
  fprintf(stderr, "qevict bench serve: %ld of %ld requests failed; the first: %s\n", S->failed,
          S->failed + S->done, *S->first_fail->err ? S->first_fail->err : "no Finished event");
  return S->auth_failed == S->failed ? CLI_EXIT_AUTH : CLI_EXIT_RPC;
}

static void run_free(bench_run_t *R) {
  for (long i = 0; R->rec && i < R->a->requests; i++) free(R->rec[i].gaps);
  free(R->req), free(R->arrival), free(R->rec);
  if (R->save) fclose(R->save);
  free(R->stream);
  cli_rpc_close(R->c);
}

/* The warm-up and the measured run (Ctrl-C handled throughout), then the report. */
static int run_and_report(bench_run_t *R) {
  bench_sum_t S;
  cli_rpc_sigint_hold();
  int rc = warm_up(R), run = rc ? 0 : run_all(R);
  cli_rpc_sigint_release();
  if (rc) return rc;
  if (run == QE_ENOMEM || summarize(R, &S)) return cli_fail("bench serve", QE_ENOMEM);
  if (R->a->s.cl.json)
    print_json(R->a, &S);
  else
    print_text(R->a, &S);
  rc = bench_status(&S, run == QE_ECANCELED);
  int saved = R->save ? save_results(R) : 0;
  return rc ? rc : saved;
}

static int bench_serve(const bench_args_t *a) {
  bench_run_t R = {.a = a};
  int rc = pack_first(a, &R);
  if (!rc) rc = make_arrivals(a, &R);
  if (!rc && !(R.rec = calloc((size_t)a->requests, sizeof *R.rec)))
    rc = cli_fail("bench serve", QE_ENOMEM);
  if (!rc && a->save && !(R.save = fopen(a->save, "w")))
    rc = cli_usage_error("bench serve", "--save-result '%s': %s", a->save, strerror(errno));
  if (!rc) rc = cli_client_open("bench serve", &a->s.cl, &R.c);
  if (!rc) rc = run_and_report(&R);
  run_free(&R);
  return rc;
}

int cli_bench_serve(int argc, char **argv) {
  bench_args_t a;
  int rc = bench_parse(argc, argv, &a);
  return rc ? (rc < 0 ? 0 : rc) : bench_serve(&a);
}
