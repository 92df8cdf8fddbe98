/* cli_submit: `qevict submit` (Generate, or Submit with --detach), `qevict watch` (Watch) and
 * `qevict cancel` (Cancel) against qevict-sched: builds the GenerateRequest from the command
 * line, streams the text to stdout and a memory summary to stderr (or one JSON object). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_policy.h"
#include "cli_rpc.h"
#include "cli_submit.h"
#include "graphkv.h"
#include "qe_json.h"
#include "qe_status.h"

static const char *submit_help =
    "usage: qevict submit (--prompt TEXT | --prompt-file FILE | --ids 1,2,3) [options]\n"
    "Runs a prompt on qevict-sched, streams its text to stdout and a memory summary to stderr.\n"
    "  --prompt TEXT     the prompt (plain text, the model's BOS rule applies)\n"
    "  --prompt-file F   read the prompt from F (- for standard input): at most 64 MiB less\n"
    "                    64 KiB (what one request carries); reading stops there\n"
    "  --ids 1,2,3       an already tokenized prompt (vocabulary ids)\n"
    "  --chat            send the prompt as the user message of a chat (the model's template)\n"
    "  --system TEXT     with --chat: a system message before it\n"
    "  -n N              max new tokens (default 128)\n"
    "  --temp T          sampling temperature in [0, 100] (default 0: greedy)\n"
    "  --top-k K         keep the K most likely tokens (default 0: off)\n"
    "  --top-p P         nucleus sampling threshold in (0, 1] (default: off)\n"
    "  --seed S          sampler seed (default 0)\n"
    "  --stop STR        end when the text contains STR (1..256 bytes; up to 16 times)\n"
    "  --request-id ID   idempotency key (1..128 printable ASCII, no blank): a retry with\n"
    "                    the same ID attaches to the running request instead of starting another\n"
    "  --ignore-eos      keep generating past end-of-generation tokens\n"
    "  --detach          queue the request (Submit), print its id and return; follow it with\n"
    "                    qevict watch ID\n"
    "KV cache (default: the tenant's default policy and budget):\n"
    "  --policy NAME     full, streaming, snapkv, pyramidkv, knorm, h2o, kivi, qevict;\n"
    "                    NAME+graphkv re-scores a scorer-based policy with GraphKV\n"
    "  --budget B        persistent KV bytes: a fraction of FullKV in (0, 1] (a value with a '.'\n"
    "                    or <= 1), or bytes with an optional suffix K, M or G (powers of 1024;\n"
    "                    KB or KiB alike) or B; a lower-case b, bits, is refused\n"
    "  --q Q             INT2 share of the history budget in [0, 1]\n"
    "  --window W        tokens per window (1..256)\n"
    "  --bits B          quantized tier: 2, 4 or 8 bits\n"
    "  --sink N --local N  always-Full first and most recent tokens\n"
    "  --scorer S        cumulative, decayed, pnorm, knorm, recency, prefill\n"
    "  --graphkv[=k,m,T] GraphKV re-scoring: source fraction, neighbours, rounds (0.3,8,1)\n"
    "With --json: one JSON object at the end (request_id, text, tokens, finish, usage, memory).\n"
    "A request that finishes with an error or is cancelled exits 1. Ctrl-C cancels "
    "it.\n" CLI_CLIENT_HELP;

static const char *watch_help =
    "usage: qevict watch ID [--from N] [options]\n"
    "Streams the events of request ID like qevict submit does (earlier ones replayed first).\n"
    "  --from N          first event offset to show (default 0: from the start)\n"
    "Ctrl-C stops watching; the request keeps running.\n" CLI_CLIENT_HELP;

static const char *cancel_help =
    "usage: qevict cancel ID [options]\n"
    "Cancels a queued or running request; its KV reservation is freed at once. Cancelling a\n"
    "finished request is not an error.\n" CLI_CLIENT_HELP;

/* --graphkv[=k,m,T]: present without a value keeps the policy's parameters. */
static int sub_graphkv(sub_args_t *a, const char *v) {
  double k;
  long m, t;
  a->policy.graphkv = &a->gkv, a->has_policy = 1;
  if (!v) return 0;
  if (cli_parse_graphkv(v, &k, &m, &t))
    return cli_usage_error(a->cmd,
                           "bad value '%s' for --graphkv (k in (0, 1], m in 1..%d, T in 1..%d)", v,
                           1 << 20, GRAPHKV_MAX_ROUNDS),
           CLI_OPT_PRINTED;
  a->gkv.k_opt_case = QEVICT__V1__GRAPH_KV__K_OPT_K, a->gkv.k = k;
  a->gkv.m_opt_case = QEVICT__V1__GRAPH_KV__M_OPT_M, a->gkv.m = m;
  a->gkv.t_opt_case = QEVICT__V1__GRAPH_KV__T_OPT_T, a->gkv.t = t;
  return 0;
}

static int sub_policy_name(sub_args_t *a, const char *v) {
  char names[256];
  if (cli_check_policy(v))
    return cli_usage_error(a->cmd, "unknown policy '%s' for --policy (%s; NAME+graphkv)", v,
                           cli_policy_names(names, sizeof names)),
           CLI_OPT_PRINTED;
  a->policy.name = (char *)v;
  return 0;
}

static int sub_scorer(sub_args_t *a, const char *v) {
  static const char *names[] = {"cumulative", "decayed", "pnorm", "knorm", "recency", "prefill"};
  for (int i = 0; i < 6; i++)
    if (!strcmp(v, names[i])) return a->policy.scorer = (char *)v, 0;
  return 2;
}

/* The KV cache options; 1 when f is none of them. */
static int sub_policy(sub_args_t *a, const char *f, const char *v) {
  Qevict__V1__Policy *p = &a->policy;
  double d;
  long l;
  int rc = 0;
  if (!strcmp(f, "--graphkv")) return sub_graphkv(a, v);
  if (!v) return 1;
  if (!strcmp(f, "--policy"))
    rc = sub_policy_name(a, v);
  else if (!strcmp(f, "--scorer"))
    rc = sub_scorer(a, v);
  else if (!strcmp(f, "--q")) {
    if (cli_parse_float(v, 0, 1, &d)) return 2;
    p->q_opt_case = QEVICT__V1__POLICY__Q_OPT_Q, p->q = (float)d;
  } else if (!strcmp(f, "--window")) {
    if (cli_parse_int(v, 1, 256, &l)) return 2; /* (the policies' limit, kv_policies.c) */
    p->window_opt_case = QEVICT__V1__POLICY__WINDOW_OPT_WINDOW, p->window = (uint32_t)l;
  } else if (!strcmp(f, "--bits")) {
    if (strcmp(v, "2") && strcmp(v, "4") && strcmp(v, "8")) return 2;
    p->bits_opt_case = QEVICT__V1__POLICY__BITS_OPT_BITS, p->bits = (uint32_t)atoi(v);
  } else if (!strcmp(f, "--sink")) {
    if (cli_parse_int(v, 0, 1 << 24, &l)) return 2;
    p->sink_opt_case = QEVICT__V1__POLICY__SINK_OPT_SINK, p->sink = (uint32_t)l;
  } else if (!strcmp(f, "--local")) {
    if (cli_parse_int(v, 0, 1 << 24, &l)) return 2;
    p->local_opt_case = QEVICT__V1__POLICY__LOCAL_OPT_LOCAL, p->local = (uint32_t)l;
  } else
    return 1;
  if (!rc) a->has_policy = 1;
  return rc;
}

static int sub_sampling(sub_args_t *a, const char *f, const char *v) {
  Qevict__V1__Sampling *s = &a->sampling;
  double d;
  long l;
  if (!strcmp(f, "--temp")) {
    if (cli_parse_float(v, 0, 100, &d)) return 2;
    s->temperature = (float)d;
  } else if (!strcmp(f, "--top-k")) {
    if (cli_parse_int(v, 0, 1 << 24, &l)) return 2;
    s->top_k = (uint32_t)l;
  } else if (!strcmp(f, "--top-p")) {
    if (cli_parse_float(v, 1e-6, 1, &d)) return 2;
    s->top_p = (float)d;
  } else if (!strcmp(f, "--seed")) {
    if (cli_parse_u64(v, &s->seed)) return 2;
  } else
    return 1;
  a->has_sampling = 1;
  return 0;
}

/* Whether s is printable ASCII other than a blank (the scheduler's rule for an id). */
static int printable(const char *s) {
  for (; *s; s++)
    if (*s < 0x21 || *s > 0x7e) return 0;
  return 1;
}

static int sub_text_opt(sub_args_t *a, const char *f, const char *v) {
  size_t n = strlen(v);
  if (!strcmp(f, "--stop")) {
    if (a->n_stop == SUB_MAX_STOP)
      return cli_usage_error(a->cmd, "--stop: at most %d stop strings", SUB_MAX_STOP),
             CLI_OPT_PRINTED;
    if (n < 1 || n > 256) return 2;
    a->stop[a->n_stop++] = (char *)v;
  } else if (!strcmp(f, "--request-id")) {
    if (n < 1 || n > 128 || !printable(v))
      return cli_parse_note_set(" (1..128 printable ASCII characters, no blank)"), 2;
    a->request_id = v;
  } else if (!strcmp(f, "--budget")) {
    if (cli_parse_budget(v, &a->budget))
      return cli_usage_error(a->cmd, "bad value '%s' for --budget%s", v, CLI_BUDGET_NOTE),
             CLI_OPT_PRINTED;
    a->has_budget = 1;
  } else
    return 1;
  return 0;
}

int cli_sub_opt(void *ud, const char *f, const char *v) {
  sub_args_t *a = ud;
  int rc = cli_client_parse(&a->cl, f, v);
  if (rc != 1) return rc;
  if (!strcmp(f, "--chat") || !strcmp(f, "--ignore-eos") || !strcmp(f, "--detach")) {
    if (v) return 2;
    *(!strcmp(f, "--chat") ? &a->chat : !strcmp(f, "--detach") ? &a->detach : &a->ignore_eos) = 1;
    return 0;
  }
  if ((rc = sub_policy(a, f, v)) != 1) return rc;
  if (!v) return 1;
  if ((rc = sub_sampling(a, f, v)) != 1 || (rc = sub_text_opt(a, f, v)) != 1) return rc;
  if (!strcmp(f, "-n")) return cli_parse_int(v, 1, 1 << 24, &a->n) ? 2 : 0;
  const char **dst = !strcmp(f, "--prompt")        ? &a->prompt
                     : !strcmp(f, "--prompt-file") ? &a->prompt_file
                     : !strcmp(f, "--ids")         ? &a->ids
                     : !strcmp(f, "--system")      ? &a->system
                                                   : NULL;
  if (!dst) return 1;
  *dst = v;
  return 0;
}

void cli_sub_init(sub_args_t *a, const char *cmd) {
  memset(a, 0, sizeof *a);
  a->cmd = cmd;
  cli_client_init(&a->cl, 0);
  a->n = 128;
  a->sampling = (Qevict__V1__Sampling)QEVICT__V1__SAMPLING__INIT;
  a->budget = (Qevict__V1__Budget)QEVICT__V1__BUDGET__INIT;
  a->policy = (Qevict__V1__Policy)QEVICT__V1__POLICY__INIT;
  a->gkv = (Qevict__V1__GraphKV)QEVICT__V1__GRAPH_KV__INIT;
}

static int sub_parse(int argc, char **argv, sub_args_t *a) {
  static const char *const flags[] = {"--json",   "--chat",    "--ignore-eos",
                                      "--detach", "--graphkv", NULL};
  const char *pos[1];
  int n_pos;
  cli_sub_init(a, "submit");
  int rc = cli_args_parse("submit", argc, argv, submit_help, flags, cli_sub_opt, a, pos, 0, &n_pos);
  if (rc) return rc;
  if (!!a->prompt + !!a->prompt_file + !!a->ids != 1)
    return cli_usage_error(a->cmd, "give exactly one of --prompt, --prompt-file and --ids");
  if (a->chat && a->ids) return cli_usage_error(a->cmd, "--chat needs a text prompt, not --ids");
  if (a->system && !a->chat) return cli_usage_error(a->cmd, "--system needs --chat");
  return 0;
}

/* --ids 1,2,3 into a malloc'd array. */
static int parse_ids(const char *s, uint32_t **out, size_t *n) {
  size_t cap = 1;
  for (const char *p = s; *p; p++) cap += *p == ',';
  uint32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return QE_ENOMEM;
  *n = 0;
  for (const char *p = s;; p++) {
    char num[16];
    size_t len = strcspn(p, ",");
    long l;
    if (!len || len >= sizeof num) break;
    memcpy(num, p, len), num[len] = '\0';
    if (cli_parse_int(num, 0, 4294967295L, &l)) break;
    ids[(*n)++] = (uint32_t)l;
    p += len;
    if (!*p) return *out = ids, 0;
  }
  free(ids);
  return -1;
}

void cli_sub_req_free(sub_req_t *r) {
  free(r->text);
  free(r->tids.ids);
}

/* The prompt of the request: text, chat messages or token ids. 0 or an exit code. */
static int sub_build_prompt(const sub_args_t *a, sub_req_t *r) {
  r->prompt = (Qevict__V1__Prompt)QEVICT__V1__PROMPT__INIT;
  if (a->id_vec) {
    r->tids = (Qevict__V1__TokenIds)QEVICT__V1__TOKEN_IDS__INIT;
    if (!(r->tids.ids = malloc(sizeof *r->tids.ids * (a->n_id_vec ? a->n_id_vec : 1))))
      return fprintf(stderr, "qevict %s: out of memory\n", a->cmd), CLI_EXIT_RPC;
    memcpy(r->tids.ids, a->id_vec, sizeof *r->tids.ids * a->n_id_vec);
    r->tids.n_ids = a->n_id_vec;
    r->prompt.kind_case = QEVICT__V1__PROMPT__KIND_TOKEN_IDS, r->prompt.token_ids = &r->tids;
    return 0;
  }
  if (a->ids) {
    r->tids = (Qevict__V1__TokenIds)QEVICT__V1__TOKEN_IDS__INIT;
    if (parse_ids(a->ids, &r->tids.ids, &r->tids.n_ids))
      return cli_usage_error(a->cmd, "bad value '%s' for --ids (comma-separated token ids)",
                             a->ids);
    r->prompt.kind_case = QEVICT__V1__PROMPT__KIND_TOKEN_IDS, r->prompt.token_ids = &r->tids;
    return 0;
  }
  if (a->prompt_file && cli_read_prompt_file(a->prompt_file, CLI_PROMPT_FILE_MAX,
                                             "the most one request message carries", &r->text))
    return cli_usage_error(a->cmd, "bad %s", qe_errmsg());
  if (a->prompt && !(r->text = strdup(a->prompt))) return cli_fail(a->cmd, QE_ENOMEM);
  if (!*r->text) return cli_usage_error(a->cmd, "the prompt is empty");
  if (!a->chat) {
    r->prompt.kind_case = QEVICT__V1__PROMPT__KIND_TEXT, r->prompt.text = r->text;
    return 0;
  }
  r->chat = (Qevict__V1__ChatMessages)QEVICT__V1__CHAT_MESSAGES__INIT;
  size_t n = 0;
  if (a->system) {
    r->msgs[n] = (Qevict__V1__ChatMessage)QEVICT__V1__CHAT_MESSAGE__INIT;
    r->msgs[n].role = "system", r->msgs[n++].content = (char *)a->system;
  }
  r->msgs[n] = (Qevict__V1__ChatMessage)QEVICT__V1__CHAT_MESSAGE__INIT;
  r->msgs[n].role = "user", r->msgs[n++].content = r->text;
  for (size_t i = 0; i < n; i++) r->msgp[i] = &r->msgs[i];
  r->chat.n_messages = n, r->chat.messages = r->msgp;
  r->prompt.kind_case = QEVICT__V1__PROMPT__KIND_CHAT, r->prompt.chat = &r->chat;
  return 0;
}

int cli_sub_build(const sub_args_t *a, sub_req_t *r) {
  memset(r, 0, sizeof *r);
  int rc = sub_build_prompt(a, r);
  if (rc) return rc;
  Qevict__V1__GenerateRequest *q = &r->req;
  *q = (Qevict__V1__GenerateRequest)QEVICT__V1__GENERATE_REQUEST__INIT;
  q->prompt = &r->prompt;
  q->max_tokens = (uint32_t)a->n;
  /* (the request only reads these parts of a) */
  q->sampling = a->has_sampling ? (Qevict__V1__Sampling *)&a->sampling : NULL;
  q->n_stop = a->n_stop, q->stop = (char **)a->stop;
  q->budget = a->has_budget ? (Qevict__V1__Budget *)&a->budget : NULL;
  q->policy = a->has_policy ? (Qevict__V1__Policy *)&a->policy : NULL;
  if (a->request_id) q->client_request_id = (char *)a->request_id;
  q->ignore_eos = a->ignore_eos;
  return 0;
}

/* ---- the event stream (submit and watch) ---- */

typedef struct {
  const char *cmd;
  int json;
  char *request_id;
  uint64_t from, next_offset;  /* the first offset asked for; that of the next event expected */
  Qevict__V1__Event *started;  /* the Started event, when seen */
  Qevict__V1__Event *finished; /* the Finished event, when seen */
  char *text;                  /* --json: the text so far */
  size_t text_len, text_cap;
  uint32_t *ids; /* the generated ids so far */
  size_t n_ids, ids_cap;
  int streamed; /* text written to stdout: 1 ending with a newline, 2 without */
} ev_out_t;

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return QE_ENOMEM;
  *p = q, *cap = c;
  return 0;
}

static int ev_tokens(ev_out_t *o, const Qevict__V1__Tokens *t) {
  size_t tl = strlen(t->text);
  if (grow((void **)&o->ids, &o->ids_cap, o->n_ids + t->n_ids, sizeof *o->ids)) return QE_ENOMEM;
  memcpy(o->ids + o->n_ids, t->ids, t->n_ids * sizeof *o->ids);
  o->n_ids += t->n_ids;
  if (o->json) {
    if (grow((void **)&o->text, &o->text_cap, o->text_len + tl + 1, 1)) return QE_ENOMEM;
    memcpy(o->text + o->text_len, t->text, tl + 1);
    o->text_len += tl;
    return 0;
  }
  if (tl) fwrite(t->text, 1, tl, stdout), o->streamed = t->text[tl - 1] != '\n' ? 2 : 1;
  if (fflush(stdout) || ferror(stdout)) return qe_errf(QE_EIO, "cannot write to stdout");
  return 0;
}

/* One streamed Event; a non-zero return cancels the stream. */
static int ev_on_msg(void *ud, const uint8_t *msg, size_t len) {
  ev_out_t *o = ud;
  Qevict__V1__Event *e = qevict__v1__event__unpack(NULL, len, msg);
  int rc = 0, keep = 0;
  if (!e) return qe_errf(QE_EFORMAT, "an event from the server does not decode");
  if (!o->request_id && *e->request_id && !(o->request_id = strdup(e->request_id))) rc = QE_ENOMEM;
  o->next_offset = e->offset + 1;
  if (e->kind_case == QEVICT__V1__EVENT__KIND_TOKENS)
    rc = rc ? rc : ev_tokens(o, e->tokens);
  else if (e->kind_case == QEVICT__V1__EVENT__KIND_STARTED && !o->started)
    o->started = e, keep = 1;
  else if (e->kind_case == QEVICT__V1__EVENT__KIND_FINISHED && !o->finished)
    o->finished = e, keep = 1;
  if (!keep) qevict__v1__event__free_unpacked(e, NULL);
  return rc;
}

static void ev_out_free(ev_out_t *o) {
  if (o->started) qevict__v1__event__free_unpacked(o->started, NULL);
  if (o->finished) qevict__v1__event__free_unpacked(o->finished, NULL);
  free(o->request_id);
  free(o->text);
  free(o->ids);
}

static void print_memory(const Qevict__V1__MemorySummary *m) {
  fprintf(stderr,
          "qevict: memory (policy %s): budget %llu bytes, persistent %llu (peak %llu): Full "
          "%llu, INT2 %llu, sink %llu, metadata %llu; windows Full/INT2/Evicted %llu/%llu/%llu; "
          "promotions %llu, demotions %llu, evictions %llu, quantizations %llu, routing events "
          "%llu; peak transient %llu bytes, workspace %llu bytes\n",
          m->policy, (unsigned long long)m->budget_bytes, (unsigned long long)m->bytes,
          (unsigned long long)m->peak_bytes, (unsigned long long)m->full_bytes,
          (unsigned long long)m->int2_bytes, (unsigned long long)m->sink_bytes,
          (unsigned long long)m->meta_bytes, (unsigned long long)m->windows_full,
          (unsigned long long)m->windows_int2, (unsigned long long)m->windows_evicted,
          (unsigned long long)m->promotions, (unsigned long long)m->demotions,
          (unsigned long long)m->evictions, (unsigned long long)m->quantizations,
          (unsigned long long)m->routing_events, (unsigned long long)m->peak_transient_bytes,
          (unsigned long long)m->workspace_bytes);
}

/* The summary on stderr after the streamed text. */
static void print_summary(const ev_out_t *o, const Qevict__V1__Finished *f) {
  const Qevict__V1__Started *s = o->started ? o->started->started : NULL;
  const Qevict__V1__Usage *u = f->usage;
  char reason[32], res[32], full[32];
  cli_enum_short(&qevict__v1__finish_reason__descriptor, f->reason, reason, sizeof reason);
  fprintf(stderr, "%sqevict: request %s", o->streamed == 2 ? "\n" : "",
          o->request_id ? o->request_id : "?");
  if (s)
    fprintf(stderr, " on worker %s (reserved %s of FullKV %s)", s->worker,
            cli_fmt_bytes(res, sizeof res, s->reserved_bytes),
            cli_fmt_bytes(full, sizeof full, s->full_kv_bytes));
  fprintf(stderr, ": finish %s%s%s", reason, *f->stop ? ", stop string " : "", f->stop);
  if (u)
    fprintf(stderr,
            "; prompt %u tokens, generated %u tokens; queued %.1f ms, first token %.1f ms, "
            "total %.1f ms",
            u->prompt_tokens, u->completion_tokens, u->queue_time_us / 1e3,
            u->time_to_first_token_us / 1e3, u->total_time_us / 1e3);
  fputc('\n', stderr);
  if (f->memory) print_memory(f->memory);
}

static void json_field_str(const char *key, const char *v) {
  printf(",\"%s\":", key);
  qe_json_str(stdout, v, strlen(v));
}

static void print_json(const ev_out_t *o, const Qevict__V1__Finished *f) {
  const Qevict__V1__Started *s = o->started ? o->started->started : NULL;
  char reason[32];
  printf("{\"request_id\":");
  qe_json_str(stdout, o->request_id ? o->request_id : "",
              o->request_id ? strlen(o->request_id) : 0);
  if (s) {
    json_field_str("worker", s->worker);
    json_field_str("policy", s->policy);
    printf(",\"reserved_bytes\":%llu,\"full_kv_bytes\":%llu,\"prompt_tokens\":%u",
           (unsigned long long)s->reserved_bytes, (unsigned long long)s->full_kv_bytes,
           s->prompt_tokens);
  }
  json_field_str("text", o->text ? o->text : "");
  printf(",\"tokens\":[");
  for (size_t i = 0; i < o->n_ids; i++) printf("%s%u", i ? "," : "", o->ids[i]);
  printf("]");
  json_field_str("finish", cli_enum_short(&qevict__v1__finish_reason__descriptor, f->reason, reason,
                                          sizeof reason));
  if (*f->stop) json_field_str("stop", f->stop);
  if (*f->error) json_field_str("error", f->error);
  if (f->usage) printf(",\"usage\":"), cli_rpc_json(stdout, &f->usage->base);
  if (f->memory) printf(",\"memory\":"), cli_rpc_json(stdout, &f->memory->base);
  printf("}\n");
}

/* The outcome of a stream that ended with OK: the summary, and the request's own ending. */
static int ev_finish(const ev_out_t *o) {
  const Qevict__V1__Finished *f = o->finished ? o->finished->finished : NULL;
  if (!f && o->from && o->next_offset == o->from) { /* (the server ends it so at the end) */
    fprintf(stderr,
            "qevict %s: request %s has no events from offset %llu on: it ended with the one "
            "before (a lower --from shows its end)\n",
            o->cmd, o->request_id, (unsigned long long)o->from);
    return 0;
  }
  if (!f) {
    fprintf(stderr, "%sqevict %s: the stream ended without a Finished event\n",
            o->streamed == 2 ? "\n" : "", o->cmd);
    return CLI_EXIT_RPC;
  }
  if (o->json)
    print_json(o, f);
  else
    print_summary(o, f);
  if (f->reason == QEVICT__V1__FINISH_REASON__FINISH_REASON_ERROR) {
    fprintf(stderr, "qevict %s: request %s failed: %s\n", o->cmd, o->request_id, f->error);
    return CLI_EXIT_RPC;
  }
  if (f->reason == QEVICT__V1__FINISH_REASON__FINISH_REASON_CANCELLED) {
    fprintf(stderr, "qevict %s: request %s was cancelled\n", o->cmd, o->request_id);
    return CLI_EXIT_RPC;
  }
  return 0;
}

/* Ctrl-C during the stream: Generate's request ends with it, Watch's keeps running. */
static int ev_interrupted(const ev_out_t *o) {
  if (!strcmp(o->cmd, "watch"))
    fprintf(stderr,
            "qevict watch: interrupted; request %s keeps running (resume: qevict watch %s "
            "--from %llu)\n",
            o->request_id, o->request_id, (unsigned long long)o->next_offset);
  else
    fprintf(stderr, "qevict %s: interrupted; request %s is cancelled with its stream\n", o->cmd,
            o->request_id);
  return CLI_EXIT_INTERRUPTED;
}

/* Streams method's events and reports them (id: the request's, when known; from: the first
 * offset asked for). 0 or an exit code. */
static int ev_stream(const char *cmd, const cli_client_opts_t *cl, const char *method,
                     const ProtobufCMessage *req, const char *id, uint64_t from) {
  ev_out_t o = {.cmd = cmd, .json = cl->json, .from = from, .next_offset = from};
  cli_rpc_t *c = NULL;
  cli_rpc_status_t st;
  size_t n = protobuf_c_message_get_packed_size(req);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return cli_client_fail(cmd, QE_ENOMEM, NULL);
  protobuf_c_message_pack(req, buf);
  int rc = id && !(o.request_id = strdup(id)) ? QE_ENOMEM : 0;
  if (rc || (rc = cli_client_open(cmd, cl, &c))) {
    free(buf);
    return rc == QE_ENOMEM ? cli_client_fail(cmd, rc, NULL) : rc;
  }
  rc = cli_rpc_stream(c, method, buf, n, cl->timeout_s, ev_on_msg, &o, &st);
  if (o.streamed == 2 && rc) fputc('\n', stderr);
  if (!rc)
    rc = ev_finish(&o);
  else if (rc == QE_ECANCELED && o.request_id)
    rc = ev_interrupted(&o);
  else
    rc = cli_client_fail(cmd, rc, &st);
  cli_rpc_close(c);
  ev_out_free(&o);
  free(buf);
  return rc;
}

/* --detach: Submit, then the request id on stdout. */
static int sub_detach(const sub_args_t *a, const sub_req_t *r) {
  cli_rpc_t *c = NULL;
  cli_rpc_status_t st;
  ProtobufCMessage *resp = NULL;
  int rc = cli_client_open("submit", &a->cl, &c);
  if (rc) return rc;
  rc = cli_rpc_call(c, "/qevict.v1.Generation/Submit", &r->req.base,
                    &qevict__v1__submit_response__descriptor, cli_client_unary_timeout(&a->cl),
                    &resp, &st);
  if (rc) {
    rc = cli_client_fail("submit", rc, &st);
  } else if (a->cl.json) {
    cli_rpc_json(stdout, resp), putchar('\n');
  } else {
    Qevict__V1__SubmitResponse *s = (Qevict__V1__SubmitResponse *)resp;
    puts(s->request_id);
    if (s->attached)
      fprintf(stderr, "qevict submit: --request-id matched an existing request: attached to it, "
                      "nothing new was started\n");
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  cli_rpc_close(c);
  return rc;
}

int cli_submit(int argc, char **argv) {
  sub_args_t a;
  sub_req_t r;
  int rc = sub_parse(argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  rc = cli_sub_build(&a, &r);
  if (!rc && a.detach)
    rc = sub_detach(&a, &r);
  else if (!rc)
    rc = ev_stream("submit", &a.cl, "/qevict.v1.Generation/Generate", &r.req.base, NULL, 0);
  cli_sub_req_free(&r);
  return rc;
}

/* ---- watch, cancel ---- */

typedef struct {
  cli_client_opts_t cl;
  uint64_t from;
} watch_args_t;

static int watch_opt(void *ud, const char *f, const char *v) {
  watch_args_t *a = ud;
  int rc = cli_client_parse(&a->cl, f, v);
  if (rc != 1 || !v) return rc;
  if (!strcmp(f, "--from")) return cli_parse_u64(v, &a->from) ? 2 : 0;
  return 1;
}

int cli_watch(int argc, char **argv) {
  static const char *const flags[] = {"--json", NULL};
  watch_args_t a = {.from = 0};
  const char *id[1];
  int n_pos;
  cli_client_init(&a.cl, 0);
  int rc = cli_args_parse("watch", argc, argv, watch_help, flags, watch_opt, &a, id, 1, &n_pos);
  if (rc) return rc < 0 ? 0 : rc;
  if (n_pos != 1 || !*id[0]) return cli_usage_error("watch", "missing request ID");
  Qevict__V1__WatchRequest req = QEVICT__V1__WATCH_REQUEST__INIT;
  req.request_id = (char *)id[0], req.from_offset = a.from;
  return ev_stream("watch", &a.cl, "/qevict.v1.Generation/Watch", &req.base, id[0], a.from);
}

static int cancel_opt(void *ud, const char *f, const char *v) { return cli_client_parse(ud, f, v); }

static void cancel_print(const char *id, const Qevict__V1__CancelResponse *r) {
  char state[32];
  cli_enum_short(&qevict__v1__request_state__descriptor, r->state, state, sizeof state);
  const int stopping = r->state == QEVICT__V1__REQUEST_STATE__REQUEST_STATE_RUNNING;
  if (r->cancelled)
    printf("request %s cancelled (%s)\n", id,
           stopping ? "its worker is stopping it" : "now finished");
  else if (stopping)
    printf("request %s is already being stopped\n", id);
  else
    printf("request %s had already finished: nothing to cancel (state %s)\n", id, state);
}

int cli_cancel(int argc, char **argv) {
  static const char *const flags[] = {"--json", NULL};
  cli_client_opts_t cl;
  const char *id[1];
  int n_pos;
  cli_client_init(&cl, 0);
  int rc = cli_args_parse("cancel", argc, argv, cancel_help, flags, cancel_opt, &cl, id, 1, &n_pos);
  if (rc) return rc < 0 ? 0 : rc;
  if (n_pos != 1 || !*id[0]) return cli_usage_error("cancel", "missing request ID");
  Qevict__V1__CancelRequest req = QEVICT__V1__CANCEL_REQUEST__INIT;
  req.request_id = (char *)id[0];
  cli_rpc_t *c = NULL;
  cli_rpc_status_t st;
  ProtobufCMessage *resp = NULL;
  if ((rc = cli_client_open("cancel", &cl, &c))) return rc;
  rc = cli_rpc_call(c, "/qevict.v1.Generation/Cancel", &req.base,
                    &qevict__v1__cancel_response__descriptor, cli_client_unary_timeout(&cl), &resp,
                    &st);
  if (rc)
    rc = cli_client_fail("cancel", rc, &st);
  else if (cl.json)
    cli_rpc_json(stdout, resp), putchar('\n');
  else
    cancel_print(id[0], (Qevict__V1__CancelResponse *)resp);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  cli_rpc_close(c);
  return rc;
}
