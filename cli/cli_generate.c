/* cli_generate: `qevict generate`: loads a model in this process (and, with --tp N, in N-1
 * forked ranks joined by the CPU collective backend), runs a prompt, streams the text to
 * stdout and a summary to stderr (or one JSON object with --json). */
#include <errno.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_diag.h"
#include "cli_gen_report.h"
#include "cli_policy.h"
#include "kv_diag.h"
#include "model_gen.h"
#include "qe_env.h"
#include "qe_json.h"
#include "qe_status.h"
#ifdef QE_HAVE_CUDA
#include "cuda/kern_cuda.h"
#endif

typedef struct {
  const char *model, *prompt, *prompt_file;
  const char *shape; /* --shape: random weights of a named shape instead of --model */
  long prompt_len;   /* --prompt-len: random prompt ids (with --shape) */
  long max_batch;    /* --max-batch: rows a forward pass holds (0: gen_pass_rows) */
  int chat, json, tp, threads, batch, ignore_eos, diag;
  int top2, time_allreduce; /* --top2, --time-allreduce */
  int no_graphs;            /* --no-graphs, or QE_CUDA_GRAPHS=0 */
  const char *force_ids;    /* --force-ids FILE */
  int32_t *forced;          /* its ids, fed back instead of the sampled ones */
  int n_forced;
  int device;      /* CUDA GPU of rank 0 (-1: the CPU backend) */
  int cpu_weights; /* --cpu-weights: kern_weight_dtype_t of the CPU backend */
  long n_predict;
  kern_sampler_t sampler;
  uint64_t seed;
  cli_policy_t pol;
  char pol_name[80]; /* pol.name with "+graphkv" when --graphkv was given alone */
  int32_t *ids;      /* the prompt, tokenized before any rank starts */
  int n_ids, capacity;
  FILE *trace;
} gen_args_t;

static const char *gen_help =
    "usage: qevict generate --model FILE (--prompt TEXT | --prompt-file F, - for stdin) [options]\n"
    "       qevict generate --shape NAME --prompt-len N [options]\n"
    "  --shape NAME      random weights of a named shape (llama3-8b, llama3-70b, tiny), no file\n"
    "                    and no tokenizer: the prompt is N random ids (--seed), output is ids\n"
    "  --chat            wrap the prompt as a user message in the model's chat template\n"
    "  -n N              max new tokens (default 128)\n"
    "  --temp T          sampling temperature (default 0: greedy)\n"
    "  --top-k K         keep the K most likely tokens (default 0: off)\n"
    "  --top-p P         nucleus sampling threshold in (0, 1] (default 1: off)\n"
    "  --seed S          sampler seed (default 0)\n"
    "  --tp N            tensor-parallel ranks (processes, CPU collectives; default 1)\n"
    "  --batch B         run B copies of the prompt in one batch (throughput; default 1)\n"
    "  --max-batch N     tokens a forward pass holds (its scratch): every prompt, or one prompt\n"
    "                    and a decode row a sequence; passes take whole prompts (default: every\n"
    "                    prompt when they hold 16384 tokens, else as many as that holds and a\n"
    "                    decode row a sequence; at least 512)\n"
    "  --threads N       CPU threads per rank (default: cores / tp)\n" CLI_CPU_WEIGHTS_HELP
    "  --device N        run on CUDA GPU N (CUDA builds; rank r of --tp uses GPU (N + r) mod\n"
    "                    the GPU count); policies full, qevict, kivi; h2o, streaming, snapkv\n"
    "                    and pyramidkv with --window 4, 8 or a multiple of 16 up to 256;\n"
    "                    +graphkv on qevict and h2o\n"
    "  --ignore-eos      keep generating past end-of-generation tokens\n"
    "  --json            print one JSON object (ids, text, summary, memory, ranks) instead of\n"
    "                    streaming\n"
    "  --top2            with --json: the two best tokens and logits of sequence 0 at each step\n"
    "                    (greedy steps then download logits instead of ids)\n"
    "  --force-ids FILE  teacher forcing: feed back these ids (a JSON array or whitespace-\n"
    "                    separated) instead of the sampled ones; --json reports the agreement\n"
    "  --time-allreduce  with --device and --tp > 1: time each NCCL all-reduce (CUDA events);\n"
    "                    --json reports each rank's total\n"
    "  --no-graphs       with --device: run every decode step eagerly instead of replaying\n"
    "                    CUDA graphs (also QE_CUDA_GRAPHS=0; 1, the default, uses them)\n";
/* (two strings: ISO C guarantees string literals of 4,095 characters only) */
static const char *gen_help_kv =
    "KV cache:\n"
    "  --policy NAME     full (default), streaming, snapkv, pyramidkv, knorm, h2o, kivi, qevict;\n"
    "                    NAME+graphkv re-scores a scorer-based policy with GraphKV\n"
    "  --budget B        persistent KV bytes: a fraction of FullKV in (0, 1], or bytes (> 1,\n"
    "                    with an optional suffix K, M or G, alone or with B or iB: powers of\n"
    "                    1024; or B; a lower-case b, bits, is refused);\n"
    "                    1: room for every window at Full, the cache's metadata included\n"
    "  --q Q             INT2 share of the history budget in [0, 1] (qevict default 0.7; 1: no\n"
    "                    Full tier for history, every aged window INT2 as kivi's, whatever the\n"
    "                    budget)\n"
    "  --window W        tokens per window (qevict default 8)\n"
    "  --bits B          INT2/INT4/INT8 ledger: 2, 4 or 8\n"
    "  --key-frame F     abs (default: keys quantized post-RoPE, as Full pages hold them),\n"
    "                    pos (pre-RoPE, re-rotated at attention) or window (rotated by\n"
    "                    their offset inside the window; CPU only, an experiment)\n"
    "  --sink N --local N  always-Full first and most recent tokens (default 5, 32)\n"
    "  --scorer S        cumulative, decayed (0.95), pnorm (p = 2), knorm, recency, prefill\n"
    "  --graphkv[=k,m,T] GraphKV re-scoring: source fraction, neighbours, rounds (0.3,8,1)\n"
    "  --trace FILE      one JSON line per routing event\n"
    "  --diagnostics     evaluation mode: a FullKV shadow generates, the policy is teacher-forced\n"
    "                    on the same tokens; prints FMM, churn, Global LIR, QSA, INT2 mass ratio\n";

/* Parses a flag with a value; returns 0 handled, 1 not this flag, 2 usage error printed. */
static int parse_valued(gen_args_t *a, const char *f, const char *v) {
  long l;
  double d;
  if (!strcmp(f, "--model"))
    a->model = v;
  else if (!strcmp(f, "--shape"))
    a->shape = v;
  else if (!strcmp(f, "--prompt-len"))
    return cli_parse_int(v, 1, 1 << 24, &a->prompt_len) ? 2 : 0;
  else if (!strcmp(f, "--max-batch"))
    return cli_parse_int(v, 1, 1 << 24, &a->max_batch) ? 2 : 0;
  else if (!strcmp(f, "--prompt"))
    a->prompt = v;
  else if (!strcmp(f, "--prompt-file"))
    a->prompt_file = v;
  else if (!strcmp(f, "--force-ids"))
    a->force_ids = v;
  else if (!strcmp(f, "-n"))
    return cli_parse_int(v, 1, 1 << 24, &a->n_predict) ? 2 : 0;
  else if (!strcmp(f, "--temp")) {
    if (cli_parse_float(v, 0, 100, &d)) return 2;
    a->sampler.temp = (float)d;
  } else if (!strcmp(f, "--top-k")) {
    if (cli_parse_int(v, 0, 1 << 24, &l)) return 2;
    a->sampler.top_k = (int)l;
  } else if (!strcmp(f, "--top-p")) {
    if (cli_parse_float(v, 1e-6, 1, &d)) return 2;
    a->sampler.top_p = (float)d;
  } else if (!strcmp(f, "--seed"))
    return cli_parse_u64(v, &a->seed) ? 2 : 0;
  else if (!strcmp(f, "--device")) {
    if (cli_parse_int(v, 0, 255, &l)) return 2;
    a->device = (int)l;
  } else if (!strcmp(f, "--cpu-weights"))
    return cli_parse_cpu_weights(v, &a->cpu_weights) ? 2 : 0;
  else if (!strcmp(f, "--tp") || !strcmp(f, "--batch") || !strcmp(f, "--threads")) {
    if (cli_parse_int(v, 1, 256, &l)) return 2;
    *(!strcmp(f, "--tp") ? &a->tp : !strcmp(f, "--batch") ? &a->batch : &a->threads) = (int)l;
  } else
    return 1;
  return 0;
}

/* generate's flags that take no value (--help and --graphkv[=...] apart) and their fields. */
static const struct {
  const char *name;
  size_t off;
} gen_flags[] = {{"--chat", offsetof(gen_args_t, chat)},
                 {"--json", offsetof(gen_args_t, json)},
                 {"--ignore-eos", offsetof(gen_args_t, ignore_eos)},
                 {"--diagnostics", offsetof(gen_args_t, diag)},
                 {"--top2", offsetof(gen_args_t, top2)},
                 {"--time-allreduce", offsetof(gen_args_t, time_allreduce)},
                 {"--no-graphs", offsetof(gen_args_t, no_graphs)}};

/* gen_flags' entry of f, or -1. */
static int gen_flag(const char *f) {
  for (int k = 0; k < (int)(sizeof gen_flags / sizeof gen_flags[0]); k++)
    if (!strcmp(f, gen_flags[k].name)) return k;
  return -1;
}

static int is_graphkv(const char *f) {
  return !strncmp(f, "--graphkv", 9) && (f[9] == '\0' || f[9] == '=');
}

int cli_generate_takes_value(const char *f) {
  return strcmp(f, "--help") && strcmp(f, "-h") && !is_graphkv(f) && gen_flag(f) < 0;
}

static int parse_args(int argc, char **argv, gen_args_t *a) {
  *a = (gen_args_t){.tp = 1, .batch = 1, .device = -1, .n_predict = 128, .sampler = {0, 0, 1.0f}};
  cli_policy_init(&a->pol);
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (!strcmp(f, "--help") || !strcmp(f, "-h"))
      return fputs(gen_help, stdout), fputs(gen_help_kv, stdout), -1;
    int k = gen_flag(f);
    if (is_graphkv(f)) {
      if (cli_policy_parse(&a->pol, "--graphkv", f[9] ? f + 10 : NULL))
        return cli_usage_error("generate",
                               "bad value '%s' for --graphkv (k in (0, 1], m in 1..%d, T in 1..%d)",
                               f + 10, 1 << 20, GRAPHKV_MAX_ROUNDS);
    } else if (k >= 0)
      *(int *)((char *)a + gen_flags[k].off) = 1;
    else if (i + 1 >= argc)
      return cli_usage_error("generate", "unknown option or missing value: %s", f);
    else {
      cli_parse_note_set(NULL);
      int rc = parse_valued(a, f, argv[++i]);
      if (rc == 1) rc = cli_policy_parse(&a->pol, f, argv[i]);
      if (rc == 1) return cli_usage_error("generate", "unknown option %s", f);
      if (rc == 2)
        return cli_usage_error("generate", "bad value '%s' for %s%s", argv[i], f, cli_parse_note());
    }
  }
  if (!a->model == !a->shape) return cli_usage_error("generate", "give one of --model and --shape");
  if (a->shape && (a->prompt || a->prompt_file || !a->prompt_len || a->chat || a->diag))
    return cli_usage_error("generate", "--shape takes --prompt-len N (random ids), not a text "
                                       "prompt, --chat or --diagnostics");
  if (a->model && a->prompt_len)
    return cli_usage_error("generate", "--prompt-len goes with --shape");
  if (a->model && !a->prompt == !a->prompt_file)
    return cli_usage_error("generate", "give exactly one of --prompt and --prompt-file");
  if ((a->top2 && !a->json) || (a->diag && (a->top2 || a->force_ids)))
    return cli_usage_error("generate", "--top2 needs --json; --diagnostics takes neither --top2 "
                                       "nor --force-ids");
  if (a->diag && (a->tp != 1 || a->batch != 1 || !strcmp(a->pol.name, "full")))
    return cli_usage_error("generate",
                           "--diagnostics needs a policy other than full, --tp 1 and --batch 1");
  const char *gpu_only = a->time_allreduce ? "--time-allreduce times NCCL all-reduces"
                         : a->no_graphs    ? "--no-graphs turns CUDA graphs off"
                                           : NULL; /* (QE_CUDA_GRAPHS=0 is a knob: no check) */
  if (gpu_only && a->device < 0)
    return cli_usage_error("generate", "%s: it needs --device", gpu_only);
  int rc = cli_check_backend("generate", a->device, a->cpu_weights);
  if (rc) return rc;
  static const char *const off_on[] = {"0", "1"};
  a->no_graphs |= !qe_env_choice("QE_CUDA_GRAPHS", off_on, 2, 1);
  if (a->pol.graphkv && strcmp(a->pol.name, "full") && !strstr(a->pol.name, "+graphkv")) {
    snprintf(a->pol_name, sizeof a->pol_name, "%s+graphkv", a->pol.name); /* (the reports') */
    a->pol.name = a->pol_name;
  }
  return 0;
}

/* Reads the prompt text (from the argument or the file) into a malloc'd string. A prompt file
 * is read no further than the most bytes n_ctx tokens can hold (tok_max_piece_len), at most
 * 1 GiB: a larger one cannot fit the context (/dev/zero was read for 1 GiB first). */
static int read_prompt(const gen_args_t *a, const tok_t *tok, int n_ctx, char **text) {
  if (a->prompt) return (*text = strdup(a->prompt)) ? 0 : QE_ENOMEM;
  const size_t piece = tok_max_piece_len(tok), ceiling = (size_t)1 << 30;
  const size_t max = piece && (size_t)n_ctx * piece < ceiling ? (size_t)n_ctx * piece : ceiling;
  char why[160];
  snprintf(why, sizeof why,
           max == ceiling ? "the most any prompt file can be (the model's context: %d tokens of "
                            "at most %zu bytes, its longest vocabulary piece)"
                          : "the most a prompt within the model's context can take (%d tokens "
                            "of at most %zu bytes, its longest vocabulary piece)",
           n_ctx, piece);
  return cli_read_prompt_file(a->prompt_file, max, why, text);
}

/* Encodes the prompt, wrapped in the chat template with --chat. */
static int prompt_ids(const gguf_t *g, const tok_t *tok, int n_ctx, const gen_args_t *a,
                      int32_t **ids, int *n) {
  char *text = NULL, *chat = NULL;
  size_t nn = 0;
  int rc = read_prompt(a, tok, n_ctx, &text);
  if (rc) return rc;
  if (!*text) rc = qe_errf(QE_EINVAL, "the prompt is empty");
  if (!rc && a->chat) {
    chat_msg_t msg = {"user", text};
    int kind = chat_kind_of(g);
    rc = kind == CHAT_NONE
             ? qe_errf(QE_EUNSUPPORTED, "--chat: the model declares no known chat template")
             : chat_render(kind, g, &msg, 1, 1, &chat);
  }
  const char *src = a->chat ? chat : text;
  if (!rc) rc = tok_encode(tok, src, strlen(src), tok_add_bos(tok), a->chat, ids, &nn);
  *n = (int)nn;
  free(text);
  free(chat);
  return rc;
}

/* --shape: the shape's hyperparameters and a prompt of random ids (seeded). */
static int prepare_shape(gen_args_t *a, model_hparams_t *hp) {
  int rc = model_shape_named(a->shape, hp);
  if (rc) return rc;
  if (!(a->ids = malloc(sizeof(int32_t) * (size_t)a->prompt_len)))
    return qe_errf(QE_ENOMEM, "out of memory");
  uint64_t st = kern_rng_seed(a->seed ^ 0x70726f6d7074ULL);
  for (long i = 0; i < a->prompt_len; i++)
    a->ids[i] = (int32_t)(kern_rng_uniform(&st) * (float)hp->n_vocab) % hp->n_vocab;
  a->n_ids = (int)a->prompt_len;
  a->ignore_eos = 1; /* no tokenizer: no end-of-generation token */
  return 0;
}

/* Bytes of MemAvailable (/proc/meminfo), or 0 where unknown. */
static double mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[128];
  double kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb * 1024.0;
}

/* A --shape on the CPU: its fp32 weights must fit the memory available (llama3-70b grew until
 * the kernel killed it). 0 or QE_ENOMEM. */
static int check_shape_memory(const gen_args_t *a, const model_hparams_t *hp) {
  const double E = hp->n_embd, L = hp->n_layer, q = (double)hp->n_head * hp->head_dim;
  const double kv = (double)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
  const double params = (double)hp->n_vocab * E * (hp->tied_output ? 1 : 2) +
                        L * (2 * E * q + 2 * E * kv + 3 * E * F + 2 * E) + E;
  const double need = params * sizeof(float), avail = mem_available();
  if (a->device >= 0 || avail <= 0 || need < avail) return 0;
  return qe_errf(QE_ENOMEM,
                 "--shape %s: its fp32 weights take %.1f GB on the CPU and %.1f GB of memory is "
                 "available (--device N puts them on a GPU in bf16)",
                 a->shape, need / 1e9, avail / 1e9);
}

/* A resolved policy d against the model's context n_ctx: its sink and local regions within it;
 * for FullKV, no cache option given (they would be ignored). 0 or QE_EINVAL. */
static int check_regions(const gen_args_t *a, const kv_policy_desc_t *d, int n_ctx) {
  const char *stray = d->full ? cli_policy_stray(&a->pol) : NULL;
  if (stray)
    return qe_errf(QE_EINVAL,
                   "%s needs a tiered --policy (qevict, h2o, kivi, ...): policy %s keeps every "
                   "token at full precision",
                   stray, a->pol.name);
  const int sink = !d->full && d->cfg.n_sink > n_ctx;
  if (sink || (!d->full && d->cfg.n_local > n_ctx))
    return qe_errf(QE_EINVAL, "--%s %d exceeds the model context (%d)", sink ? "sink" : "local",
                   sink ? d->cfg.n_sink : d->cfg.n_local, n_ctx);
  return 0;
}

/* Before any rank starts: the model's metadata, the TP split, the policy, the prompt (so that
 * every rank sizes its cache for the same capacity) and the trace file. One clear error. */
static int prepare(gen_args_t *a) {
  gguf_t *g = NULL;
  tok_t *tok = NULL;
  model_hparams_t hp;
  model_shard_t sh;
  kv_policy_desc_t d;
  int rc = a->shape ? prepare_shape(a, &hp) : gguf_open(a->model, &g);
  if (!rc && !a->shape) rc = model_read_hparams(g, &hp);
  if (!rc && a->shape) rc = check_shape_memory(a, &hp);
  if (!rc) rc = model_shard_of(&hp, 0, a->tp, &sh);
  if (!rc) rc = cli_policy_resolve(&a->pol, hp.head_dim, &d);
  if (!rc) rc = check_regions(a, &d, hp.n_ctx_train);
  if (!rc && !a->shape) rc = tok_create(g, &tok);
  if (!rc && !a->shape) rc = prompt_ids(g, tok, hp.n_ctx_train, a, &a->ids, &a->n_ids);
  if (!rc && a->n_ids >= hp.n_ctx_train)
    rc = qe_errf(QE_EINVAL,
                 "prompt of %d tokens exceeds the model context (%d tokens, one of which a new "
                 "token needs)",
                 a->n_ids, hp.n_ctx_train);
  if (!rc && a->max_batch && a->max_batch < a->n_ids)
    rc = qe_errf(QE_EINVAL,
                 "--max-batch %ld holds less than the prompt's %d tokens (a prompt goes whole "
                 "into one forward pass)",
                 a->max_batch, a->n_ids);
  else if (!rc && a->max_batch && a->max_batch < (long)a->n_ids * a->batch &&
           a->max_batch < (long)a->n_ids + a->batch)
    rc = qe_errf(QE_EINVAL,
                 "--max-batch %ld holds neither every prompt (%ld tokens) nor one prompt of %d "
                 "tokens beside a decode row for each of the %d sequences (%ld)",
                 a->max_batch, (long)a->n_ids * a->batch, a->n_ids, a->batch,
                 (long)a->n_ids + a->batch);
  a->capacity =
      a->n_ids + (int)a->n_predict < hp.n_ctx_train ? a->n_ids + (int)a->n_predict : hp.n_ctx_train;
  if (!rc && a->n_ids + a->n_predict > hp.n_ctx_train)
    fprintf(stderr,
            "qevict: warning: %ld new tokens (-n) stop at the model's context of %d tokens: at "
            "most %d after the %d of the prompt\n",
            (long)a->n_predict, hp.n_ctx_train, hp.n_ctx_train - a->n_ids, a->n_ids);
  if (!rc && a->force_ids) rc = gen_read_ids(a->force_ids, &a->forced, &a->n_forced);
  if (!rc && a->pol.trace && !(a->trace = fopen(a->pol.trace, "w")))
    rc = qe_errf(QE_EIO, "cannot write trace file '%s'", a->pol.trace);
  tok_destroy(tok);
  gguf_close(g);
  return rc;
}

/* The rank's compute backend: CUDA GPU (device + rank) mod count with --device, else the CPU.
 * Called after the ranks are forked (no CUDA state crosses a fork). */
static int make_backend(const gen_args_t *a, int rank, kern_backend_t **be) {
#ifdef QE_HAVE_CUDA
  if (a->device >= 0) {
    int n = kern_cuda_device_count();
    if (a->device >= n)
      return qe_errf(QE_EINVAL, "--device %d: %d CUDA device(s) visible", a->device, n);
    return kern_cuda_create((a->device + rank) % n, be);
  }
#endif
  int threads = a->threads ? a->threads : 0;
  if (!threads) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores / a->tp > 0 ? (int)(cores / a->tp) : 1;
  }
  return kern_cpu_create_ex(threads, a->cpu_weights, be);
}

/* Rows of a forward pass (the model's scratch): whole prompts, each layer sees a prompt entire
 * before it is routed; all batch prompts at once when they hold at most CLI_PASS_TOKENS, else as
 * many as that holds (at least one) and a decode row for each sequence beside them (gen_run's
 * gen_prompt_budget then fills the passes with whole prompts). All eight prompts of 32K tokens in
 * one pass of an 8B model took 54 GB of scratch. */
#define CLI_PASS_TOKENS 16384
static int gen_pass_rows(int n_ids, int batch) {
  if (n_ids < 1) return 512;
  int per = n_ids >= CLI_PASS_TOKENS ? 1 : CLI_PASS_TOKENS / n_ids;
  per = per < batch ? per : batch;
  long rows = (long)per * n_ids + (per < batch ? batch : 0);
  return rows > 512 ? (int)rows : 512;
}

static int load_rank(const gen_args_t *a, int rank, kern_backend_t **be, model_t **m,
                     kv_cache_t **kv) {
  int rc = make_backend(a, rank, be);
  int rows = a->max_batch ? (int)a->max_batch : gen_pass_rows(a->n_ids, a->batch);
  model_load_opts_t o = {*be, rank, a->tp, rows, 0};
  model_hparams_t hp;
  if (!rc && a->shape) rc = model_shape_named(a->shape, &hp);
  if (!rc) rc = a->shape ? model_create_random(&hp, a->seed, &o, m) : model_load(a->model, &o, m);
  if (!rc) model_set_graphs(*m, !a->no_graphs);
  if (!rc)
    rc = cli_policy_make_cache(&a->pol, *be, *m, a->batch, a->capacity, rank ? NULL : a->trace, kv);
  return rc;
}

static void unload_rank(kern_backend_t *be, model_t *m, kv_cache_t *kv) {
  kv_cache_destroy(kv);
  model_destroy(m);
  kern_destroy(be);
}

/* With --device and --tp > 1 in NCCL builds: every rank joins an NCCL communicator (rank 0 makes
 * the unique id and broadcasts it over c) ordered on its backend's stream, and c->dev points at
 * it, so the forward pass all-reduces activations on the GPUs. *nc: destroy after c's use. */
static int join_device_comm(const gen_args_t *a, kern_backend_t *be, tp_comm_t *c, tp_comm_t **nc) {
  *nc = NULL;
#if defined(QE_HAVE_CUDA) && defined(QE_HAVE_NCCL)
  if (a->device < 0 || c->size == 1) return 0;
  unsigned char id[TP_NCCL_ID_BYTES] = {0};
  int rc = c->rank == 0 ? tp_comm_nccl_unique_id(id) : 0, ok = rc == 0, all[256];
  int brc = tp_allgather(c, &ok, all, sizeof ok); /* rank 0's id failure stops every rank */
  if (!brc && !all[0]) brc = rc ? rc : qe_errf(QE_ECOMM, "rank 0 could not make an NCCL id");
  if (!brc) brc = tp_broadcast(c, id, sizeof id, 0);
  if (!brc) brc = tp_comm_create_nccl(id, c->rank, c->size, kern_cuda_device(be), nc);
  if (!brc) brc = tp_comm_nccl_set_stream(*nc, kern_cuda_stream(be));
  if (!brc && a->time_allreduce) brc = tp_comm_nccl_timing(*nc, 1);
  if (!brc) c->dev = *nc;
  return brc;
#else
  (void)a, (void)be, (void)c;
  return 0;
#endif
}

/* Every rank reports whether it loaded; all fail together if any did not (rank 0 reports). */
static int load_barrier(tp_comm_t *c, int lrc, int *r0_failed) {
  int ok = lrc == 0, all[256];
  int rc = tp_allgather(c, &ok, all, sizeof ok);
  *r0_failed = !rc && !all[0];
  for (int r = 0; !rc && r < c->size; r++)
    if (!all[r]) rc = lrc ? lrc : qe_errf(QE_ECOMM, "tensor-parallel rank %d failed to load", r);
  return rc;
}

/* Whether the ranks gather their reports after the run: for --json, and for the text's memory
 * summary of every rank under --tp. */
static int gathers(const gen_args_t *a) { return a->json || a->tp > 1; }

/* A forked rank > 0: loads its shard and follows rank 0 until told to stop. */
static int run_follower(const gen_args_t *a, int rank, int fd) {
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  kv_cache_t *kv = NULL;
  tp_comm_t *c = NULL;
  int fds[1] = {fd};
  int rc = tp_comm_create_cpu_fds(fds, rank, a->tp, &c);
  tp_comm_t *nc = NULL;
  int lrc = rc ? rc : load_rank(a, rank, &be, &m, &kv), brc = 0, r0_failed = 0;
  if (!rc) rc = brc = load_barrier(c, lrc, &r0_failed);
  if (!rc) rc = join_device_comm(a, be, c, &nc);
  if (!rc) rc = gen_follow(m, kv, c);
  gen_rank_report_t mine, all[256];
  if (!rc && gathers(a)) rc = gen_report_fill(be, m, kv, c, nc, &mine);
  if (!rc && gathers(a)) rc = tp_allgather(c, &mine, all, sizeof mine);
  /* its own failure only, and a failure to load only when rank 0 loaded (else rank 0's message,
     most often the same, is the one line) */
  if (rc && (lrc ? !r0_failed : !brc)) cli_fail("generate (tp rank)", rc);
  if (m) model_set_graphs(m, 0); /* graphs that recorded NCCL calls go before nc */
  tp_comm_destroy(c);
  tp_comm_destroy(nc);
  unload_rank(be, m, kv);
  return rc ? 1 : 0;
}

/* Forks ranks 1..tp-1; *c is rank 0's communicator. */
static int spawn_ranks(const gen_args_t *a, pid_t *pids, tp_comm_t **c) {
  int fds[256] = {-1};
  for (int r = 1; r < a->tp; r++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return qe_errf(QE_ECOMM, "socketpair failed");
    fflush(NULL);
    pids[r] = fork();
    if (pids[r] < 0) return qe_errf(QE_ECOMM, "fork failed");
    if (pids[r] == 0) {
      close(sv[0]);
      for (int j = 1; j < r; j++) close(fds[j]);
      _exit(run_follower(a, r, sv[1]));
    }
    close(sv[1]);
    fds[r] = sv[0];
  }
  return a->tp > 1 ? tp_comm_create_cpu_fds(fds, 0, a->tp, c) : tp_comm_create_single(c);
}

/* Waits for ranks 1..tp-1; 1 when any failed (the message is set by the caller, so that an
 * earlier failure's stays). */
static int wait_ranks(const gen_args_t *a, const pid_t *pids) {
  int bad = 0;
  for (int r = 1; r < a->tp; r++) {
    int st = 0;
    if (pids[r] > 0 && (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))) bad = 1;
  }
  return bad;
}

typedef struct {
  const tok_t *tok;
  tok_stream_t stream;
  int stream_out;
  int n_ids;                    /* ids printed (--shape: no tokenizer, the output is ids) */
  gen_top2_t top2;              /* --top2: sequence 0's */
  gen_rank_report_t ranks[256]; /* every rank's, gathered after the run (gathers) */
  int lost;                     /* a streamed token's text could not be written out */
} gen_out_t;

static void on_logits(void *ud, int seq, const float *logits, int n_vocab) {
  gen_out_t *o = ud;
  if (seq == 0) gen_top2_push(&o->top2, logits, n_vocab);
}

static void put_text(void *ud, const char *text, size_t n) {
  (void)ud;
  fwrite(text, 1, n, stdout);
}

static void on_token(void *ud, int seq, int id) {
  gen_out_t *o = ud;
  if (seq != 0 || !o->stream_out) return;
  if (!o->tok) {
    printf("%s%d", o->n_ids++ ? " " : "", id);
    return;
  }
  if (tok_stream_emit(&o->stream, id, put_text, NULL) < 0) o->lost = 1;
  fflush(stdout);
}

static const char *finish_name(int f) {
  return f == GEN_FINISH_EOG ? "stop" : f == GEN_FINISH_LENGTH ? "length" : "none";
}

static void print_summary(const gen_args_t *a, const gen_seq_t *s, const gen_stats_t *st) {
  double pf = st->prefill_s > 0 ? st->n_prompt / st->prefill_s : 0;
  double dc = st->decode_s > 0 ? st->n_decode_gen / st->decode_s : 0;
  fprintf(stderr,
          "\nqevict: prompt %d tokens, generated %d tokens (finish: %s), batch %d, tp %d; "
          "prefill %.1f tok/s, decode %.1f tok/s\n",
          s->n_prompt, s->n_out, finish_name(s->finish), a->batch, a->tp, pf, dc);
}

static void print_json(const gen_args_t *a, const model_t *m, kv_cache_t *kv, const gen_seq_t *s,
                       const gen_stats_t *st, const gen_out_t *out) {
  char *text = NULL;
  size_t n_text = 0; /* (a token may decode to a NUL byte: escaped, not an end) */
  if (model_tok(m)) tok_decode_len(model_tok(m), s->out, (size_t)s->n_out, 0, 0, &text, &n_text);
  printf("{\"prompt_tokens\":");
  qe_json_ids(stdout, s->prompt, (size_t)s->n_prompt);
  printf(",\"tokens\":");
  qe_json_ids(stdout, s->out, (size_t)s->n_out);
  printf(",\"text\":");
  qe_json_str(stdout, text ? text : "", text ? n_text : 0);
  /* sequence 0's tokens on rank 0 at FullKV: the base of the budgets' fractions */
  const size_t fullkv = cli_policy_fullkv_bytes(kv, (long)s->n_prompt + s->n_out);
  printf(",\"finish\":\"%s\",\"summary\":{\"prompt_tokens\":%d,\"generated_tokens\":%d,"
         "\"batch\":%d,\"tp\":%d,\"prefill_s\":%.6f,\"decode_s\":%.6f,\"steps\":%d,"
         "\"decode_steps\":%d,\"decode_tokens\":%ld,\"weight_bytes\":%zu,\"backend\":\"%s\","
         "\"fullkv_bytes\":%zu},\"memory\":",
         finish_name(s->finish), s->n_prompt, s->n_out, a->batch, a->tp, st->prefill_s,
         st->decode_s, st->n_steps, st->n_decode_steps, st->n_decode_gen, model_weight_bytes(m),
         model_backend(m)->ops->name, fullkv);
  cli_policy_json(&a->pol, kv, 0, stdout); /* rank 0's; "ranks" has every rank's */
  model_graph_stats_t gs;
  model_graph_stats(m, &gs);
  printf(",\"graphs\":{\"enabled\":%s,\"used\":%s,\"captures\":%ld,\"replays\":%ld,"
         "\"warmups\":%ld,\"eager_steps\":%ld}",
         model_graphs_on(m) ? "true" : "false", gs.replays > 0 ? "true" : "false", gs.captures,
         gs.replays, gs.warmups, gs.eager_steps);
  printf(",\"ranks\":");
  gen_report_json(out->ranks, a->tp, a->pol.name, stdout);
  if (a->forced) printf(",\"forced\":%d,\"agree\":%d", a->n_forced, s->n_agree);
  if (a->top2) printf(",\"top2\":"), gen_top2_json(&out->top2, stdout);
  printf("}\n");
  free(text);
}

/* The run's sequences: the prompt in each, teacher-forced with --force-ids. */
static void init_seqs(const gen_args_t *a, gen_seq_t *seqs) {
  for (int i = 0; i < a->batch; i++)
    seqs[i] = (gen_seq_t){
        .prompt = a->ids, .n_prompt = a->n_ids, .forced = a->forced, .n_forced = a->n_forced};
}

static int run_rank0(const gen_args_t *a, kern_backend_t *be, model_t *m, kv_cache_t *kv,
                     tp_comm_t *c, tp_comm_t *nc) {
  gen_seq_t seqs[256] = {0};
  gen_stats_t st;
  gen_out_t out;
  init_seqs(a, seqs);
  out = (gen_out_t){.tok = model_tok(m), .stream_out = !a->json};
  tok_stream_init(&out.stream, out.tok, 0, 0); /* (the continuation keeps its space) */
  gen_opts_t o = {(int)a->n_predict,         a->sampler, a->seed, a->ignore_eos, on_token, &out,
                  a->top2 ? on_logits : NULL};
  out.top2.cap = a->top2 ? (int)a->n_predict : 0;
  out.top2.v = a->top2 ? malloc(sizeof(float) * 4 * (size_t)a->n_predict) : NULL;
  int rc = a->top2 && !out.top2.v ? qe_errf(QE_ENOMEM, "out of memory") : 0;
  if (!rc) rc = gen_run(m, kv, c, seqs, a->batch, &o, &st);
  gen_rank_report_t mine;
  if (gathers(a) && !gen_report_fill(be, m, kv, c, nc, &mine)) {
    int grc = tp_allgather(c, &mine, out.ranks, sizeof mine); /* the followers wait */
    if (!rc) rc = grc;
  }
  if (!rc && a->json) print_json(a, m, kv, &seqs[0], &st, &out);
  if (!rc && out.lost) rc = qe_errf(QE_ENOMEM, "a token's text could not be streamed");
  if (!rc && !a->json) {
    char buf[64];
    int k = out.tok ? tok_stream_flush(&out.stream, buf, sizeof buf) : 0;
    if (k > 0) fwrite(buf, 1, (size_t)k, stdout);
    if (out.n_ids) putchar('\n');
    fflush(stdout);
    print_summary(a, &seqs[0], &st);
    if (a->tp == 1) cli_policy_print(&a->pol, kv, stderr);
    for (int r = 0; a->tp > 1 && r < a->tp; r++) /* one line a rank, each its own cache */
      cli_policy_mem_print(a->pol.name, out.ranks[r].rank, &out.ranks[r].mem, stderr);
  }
  for (int i = 0; i < a->batch; i++) free(seqs[i].out);
  free(out.top2.v);
  return rc;
}

static void print_diag(const gen_args_t *a, const kv_diag_result_t *r, const gen_seq_t *pol) {
  double agree = pol->n_out ? (double)pol->n_agree / pol->n_out : 0.0;
  if (!a->json) {
    fprintf(stderr,
            "qevict: diagnostics (policy %s): FMM %.4f, churn %.4f, Global LIR %.4f, median "
            "time-to-return %.1f events, QSA %.4f, INT2 mass ratio %.4f; %ld routing events, "
            "%ld eligible episodes; teacher-forced agreement %.3f\n",
            a->pol.name, r->fmm, r->churn, r->lir, r->ttr_median, r->qsa, r->int2_mass_ratio,
            r->events, r->lir_eligible, agree);
    return;
  }
  const char *names[] = {"fmm", "churn",           "global_lir", "ttr_median",
                         "qsa", "int2_mass_ratio", "agreement"};
  double vals[] = {r->fmm, r->churn, r->lir, r->ttr_median, r->qsa, r->int2_mass_ratio, agree};
  printf("{\"policy\":\"%s\",\"diagnostics\":{\"routing_events\":%ld,\"lir_eligible\":%ld",
         a->pol.name, r->events, r->lir_eligible);
  for (int i = 0; i < 7; i++) {
    printf(",\"%s\":", names[i]);
    qe_json_num(stdout, vals[i]);
  }
  printf("},\"memory\":");
}

/* --diagnostics: the FullKV shadow generates; the policy is teacher-forced on its tokens. */
static int run_diagnostics(const gen_args_t *a, model_t *m, kern_backend_t *be, kv_cache_t *kv,
                           tp_comm_t *c) {
  kv_diag_result_t r;
  gen_seq_t sh = {.prompt = a->ids, .n_prompt = a->n_ids}, pol = {0};
  gen_opts_t o = {(int)a->n_predict, a->sampler, a->seed, a->ignore_eos, NULL, NULL, NULL};
  int rc = cli_diag_run(m, be, c, &a->pol, kv, a->capacity, &o, &sh, &pol, &r);
  if (!rc) print_diag(a, &r, &pol);
  if (!rc && a->json) cli_policy_json(&a->pol, kv, 0, stdout), printf("}\n");
  if (!rc && !a->json) cli_policy_print(&a->pol, kv, stderr);
  free(sh.out), free(pol.out);
  return rc;
}

int cli_generate_usage(int argc, char **argv) {
  gen_args_t a;
  int rc = parse_args(argc, argv, &a);
  return rc < 0 ? 0 : rc;
}

int cli_generate(int argc, char **argv) {
  gen_args_t a;
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  if (a.sampler.temp == 0 && (a.sampler.top_k || a.sampler.top_p < 1))
    fprintf(stderr, "qevict generate: note: --top-k and --top-p act with --temp above 0; this run "
                    "decodes greedily\n");
  if (a.batch * a.tp > 256) return cli_usage_error("generate", "--batch and --tp are too large");
  pid_t pids[256] = {0};
  tp_comm_t *c = NULL;
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  kv_cache_t *kv = NULL;
  if ((rc = prepare(&a))) {
    free(a.ids);
    free(a.forced);
    return cli_fail("generate", rc);
  }
  rc = spawn_ranks(&a, pids, &c);
  tp_comm_t *nc = NULL;
  int lrc = load_rank(&a, 0, &be, &m, &kv), r0_failed = 0;
  if (!rc) rc = load_barrier(c, lrc, &r0_failed);
  if (!rc) rc = join_device_comm(&a, be, c, &nc);
  if (!rc) rc = a.diag ? run_diagnostics(&a, m, be, kv, c) : run_rank0(&a, be, m, kv, c, nc);
  if (m) model_set_graphs(m, 0); /* graphs that recorded NCCL calls go before nc */
  tp_comm_destroy(c);
  tp_comm_destroy(nc);
  int wrc = wait_ranks(&a, pids);
  unload_rank(be, m, kv);
  const int trc =
      a.trace && fclose(a.trace) ? qe_errf(QE_EIO, "writing --trace: %s", strerror(errno)) : 0;
  free(a.ids);
  free(a.forced);
  if (!rc && wrc) rc = qe_errf(QE_ECOMM, "a tensor-parallel rank failed");
  if (!rc && trc) rc = trc;
  return rc ? cli_fail("generate", rc) : 0;
}
