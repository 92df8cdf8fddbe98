/* cli_serve: `qevict sched` (the scheduler process, also installed as qevict-sched), `qevict
 * worker` (one worker rank, also installed as qevictd) and `qevict serve` (the whole system on
 * one machine: a scheduler and local workers as child processes, supervised: a child that dies
 * is started again). */
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "kern.h"
#include "qe_log.h"
#include "qe_status.h"
#include "qe_target.h"
#include "sched_server.h"
#include "tr_addr.h"
#include "wrk.h"

/* The bytes of a Unix socket's path, its NUL included. */
#define UNIX_PATH_BYTES sizeof(((tr_addr_t *)0)->path)
#ifdef QE_HAVE_CUDA
#include "cuda/kern_cuda.h"
#endif

#define TLS_HELP                                                                                   \
  "  --tls-cert FILE --tls-key FILE   serve gRPC over TLS only (PEM certificate chain and key)\n"  \
  "  --tls-client-ca FILE        with them: require client certificates this PEM CA verifies\n"    \
  "  --metrics-tls               with them: /metrics and /healthz over TLS too (same files)\n"

static const char *sched_help =
    "usage: qevict sched --model FILE --state-dir DIR [options]   (also: qevict-sched)\n"
    "  --listen HOST:PORT          gRPC address (default 127.0.0.1:50051)\n"
    "  --metrics-listen HOST:PORT  /metrics and /healthz, HTTP or with --metrics-tls HTTPS\n"
    "                              (default 127.0.0.1:9464; '' off)\n"
    "  --worker-listen ADDR        where workers connect (default 127.0.0.1:50052; unix:PATH)\n"
    "  --admin-key-file FILE       admin key (read, or created with a new key; default\n"
    "                              STATE_DIR/admin.key)\n"
    "  --max-message BYTES         gRPC message limit, at least 4K (default 64M)\n"
    "  --keep-finished SECONDS     finished requests stay watchable (default 600)\n"
    "  --max-queued N              a tenant's accepted, unfinished requests at most; past it\n"
    "                              RESOURCE_EXHAUSTED (default 10000; 0: no bound)\n"
    "  --worker-timeout MS         a silent worker is down after this (default 5000)\n"
    "  --max-resumes N             a request whose worker group fails while it runs (a\n"
    "                              crash, a timeout; not the group's own stop) is resumed at\n"
    "                              most N times, then ends with an error (default 3; 0: never)\n"
    "  --shutdown-grace SECONDS    on SIGTERM, SIGINT or SIGHUP the accepted requests may finish\n"
    "                              for this long, no new ones taken (default 30; 0 none; a\n"
    "                              second signal stops at once)\n"
    "  --ready-file FILE           written once a worker group is up\n" TLS_HELP
    "  --worker-tls-cert FILE --worker-tls-key FILE --worker-tls-ca FILE\n"
    "                              the worker link over TLS only (this PEM chain and key), and\n"
    "                              workers must present certificates the PEM CA verifies\n";

static const char *worker_help =
    "usage: qevict worker --model FILE [options]   (also: qevictd)\n"
    "  --scheduler ADDR    the scheduler's worker address (default 127.0.0.1:50052)\n"
    "  --group NAME        TP group (default g0)      --name NAME   for logs\n"
    "  --rank R --tp T     position in the group (default 0 of 1)\n"
    "  --tp-addr PATH      Unix socket where rank 0 meets the other ranks (tp > 1)\n"
    "  --threads N         CPU threads (default: cores / tp)\n"
    "  --max-seqs N        concurrent sequences (default 64)\n"
    "  --max-batch N       tokens per forward pass (default 4096)\n"
    "  --pool-bytes B      KV bytes this rank lets the scheduler reserve (default 4G on the\n"
    "                      CPU, 40% with --device; suffixes K, M, G: powers of 1024, KB or KiB\n"
    "                      alike, not a lower-case b), or N%: that share of the memory free\n"
    "                      once the model is loaded (the GPU's with --device, where it is the\n"
    "                      whole FullKV arena; on the CPU MemAvailable, or the memory cgroup's\n"
    "                      room when less). Each policy configuration in use on a GPU holds an\n"
    "                      arena of its own: about 40% serves FullKV and one tiered policy at\n"
    "                      once, 80-90% one alone\n"
    "  --shutdown-grace SECONDS   on SIGTERM, SIGINT or SIGHUP the scheduler sends this group\n"
    "                      no new requests and the running ones may finish for this long\n"
    "                      (default 30; 0 none; a second signal stops at once)\n"
    "  --step-timeout SECONDS   a step (or a TP follower's wait for rank 0) that has not come\n"
    "                      back in this long (a hung GPU or collective) makes the worker exit\n"
    "                      with status 70 for its supervisor to restart it (default 300 with\n"
    "                      --device, none on the CPU; 0 none)\n"
    "  --device N          CUDA GPU of the group's rank 0 (CUDA builds): rank R runs on GPU\n"
    "                      (N + R) mod the GPU count, KV on the GPU, NCCL between the ranks\n"
    "  --cpu               the CPU backend (the default)\n" CLI_CPU_WEIGHTS_HELP
    "  --tls-ca FILE --tls-cert FILE --tls-key FILE   the scheduler link over TLS (for a\n"
    "                      scheduler with --worker-tls-*): its certificate must chain to this\n"
    "                      PEM CA; this worker's PEM certificate chain and key\n"
    "  --tls-server-name NAME   the name the scheduler's certificate carries (default:\n"
    "                      --scheduler's host, localhost as a name, an IP as an IP address;\n"
    "                      none checked on a unix: address)\n";

static const char *serve_help =
    "usage: qevict serve --model FILE [options]\n"
    "Starts a scheduler and local workers as child processes and supervises them.\n"
    "  --listen HOST:PORT          gRPC (default 127.0.0.1:50051)\n"
    "  --metrics-listen HOST:PORT  /metrics and /healthz (default 127.0.0.1:9464; '' off)\n"
    "  --state-dir DIR             tenants and admin key (default: a new temporary directory,\n"
    "                              removed at exit)\n"
    "  --admin-key-file FILE       (default STATE_DIR/admin.key)\n"
    "  --workers N                 TP groups (default 1)     --tp T   ranks per group (1)\n"
    "  --device N                  GPU workers (CUDA builds): rank R of group G runs on GPU\n"
    "                              (N + G * T + R) mod the GPU count\n"
    "  --cpu                       CPU workers (the default)\n"
    "  --cpu-weights f32|packed    their weights (default f32; see qevict worker --help)\n"
    "  --threads N --max-seqs N --max-batch N --pool-bytes B|N% --step-timeout S   per worker\n"
    "                              rank (N%: split evenly among the ranks that share a GPU, or\n"
    "                              among all of them on the CPU; see qevict worker --help)\n"
    "  --max-message BYTES --keep-finished SECONDS --max-queued N --max-resumes N\n"
    "  --ready-file FILE           (see qevict sched --help)\n"
    "  --shutdown-grace SECONDS    on a stop, the accepted requests may finish for this long\n"
    "                              (default 30) before the workers stop\n" TLS_HELP;

/* Which commands take option f (S: sched, W: worker, V: serve); 0 when none does. */
enum { OPT_S = 1, OPT_W = 2, OPT_V = 4 };
static int opt_cmds(const char *f) {
  static const struct {
    const char *flag;
    int cmds;
  } t[] = {{"--model", OPT_S | OPT_W | OPT_V},
           {"--listen", OPT_S | OPT_V},
           {"--metrics-listen", OPT_S | OPT_V},
           {"--worker-listen", OPT_S},
           {"--state-dir", OPT_S | OPT_V},
           {"--admin-key-file", OPT_S | OPT_V},
           {"--ready-file", OPT_S | OPT_V},
           {"--tls-cert", OPT_S | OPT_W | OPT_V},
           {"--tls-key", OPT_S | OPT_W | OPT_V},
           {"--tls-client-ca", OPT_S | OPT_V},
           {"--worker-tls-cert", OPT_S},
           {"--worker-tls-key", OPT_S},
           {"--worker-tls-ca", OPT_S},
           {"--tls-ca", OPT_W},
           {"--tls-server-name", OPT_W},
           {"--max-message", OPT_S | OPT_V},
           {"--keep-finished", OPT_S | OPT_V},
           {"--max-queued", OPT_S | OPT_V},
           {"--max-resumes", OPT_S | OPT_V},
           {"--shutdown-grace", OPT_S | OPT_W | OPT_V},
           {"--worker-timeout", OPT_S},
           {"--step-timeout", OPT_W | OPT_V},
           {"--scheduler", OPT_W},
           {"--group", OPT_W},
           {"--name", OPT_W},
           {"--rank", OPT_W},
           {"--tp-addr", OPT_W},
           {"--tp", OPT_W | OPT_V},
           {"--threads", OPT_W | OPT_V},
           {"--max-seqs", OPT_W | OPT_V},
           {"--max-batch", OPT_W | OPT_V},
           {"--pool-bytes", OPT_W | OPT_V},
           {"--cpu-weights", OPT_W | OPT_V},
           {"--device", OPT_W | OPT_V},
           {"--workers", OPT_V}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (!strcmp(f, t[i].flag)) return t[i].cmds;
  return 0;
}

/* Whether cmd takes option argv[i] with its value: 0, or the exit code after a usage error (an
 * unknown option, one of another command, a missing value). */
static int check_opt(const char *cmd, int i, int argc, char **argv) {
  const int want = !strcmp(cmd, "sched") ? OPT_S : !strcmp(cmd, "worker") ? OPT_W : OPT_V;
  const int cmds = opt_cmds(argv[i]);
  if (!cmds) return cli_usage_error(cmd, "unknown option '%s'", argv[i]);
  static const char *const of[] = {
      "",      "sched",           "worker",           "sched and worker",
      "serve", "sched and serve", "worker and serve", ""};
  if (!(cmds & want))
    return cli_usage_error(cmd, "%s is a%s option (of qevict %s)", argv[i],
                           cmds & OPT_S   ? " scheduler"
                           : cmds & OPT_W ? " worker"
                                          : "n",
                           of[cmds]);
  if (i + 1 < argc) return 0;
  return cli_usage_error(cmd, "%s needs a value", argv[i]);
}

/* Options every process shares, for both the scheduler's and the workers' configurations. */
typedef struct {
  sched_config_t s;
  wrk_config_t w;
  int workers;
  int cpu;    /* --cpu given */
  int n_gpus; /* with --device in serve: the GPU count */
  const char *state_dir;
} serve_opts_t;

static int parse_num(const char *cmd, const char *f, const char *v, long lo, long hi, int *out) {
  long l;
  if (cli_parse_int(v, lo, hi, &l))
    return cli_usage_error(cmd, "bad value for %s: '%s'%s", f, v, cli_parse_note());
  *out = (int)l;
  return 0;
}

/* The TLS options (files and names); 1 if f is none of them. */
static int parse_tls(serve_opts_t *o, const char *f, const char *v) {
  const struct {
    const char *flag;
    const char **dst, **dst2;
  } t[] = {{"--tls-cert", &o->s.tls_cert, &o->w.tls_cert},
           {"--tls-key", &o->s.tls_key, &o->w.tls_key},
           {"--tls-client-ca", &o->s.tls_client_ca, NULL},
           {"--worker-tls-cert", &o->s.worker_tls_cert, NULL},
           {"--worker-tls-key", &o->s.worker_tls_key, NULL},
           {"--worker-tls-ca", &o->s.worker_tls_ca, NULL},
           {"--tls-ca", &o->w.tls_ca, NULL},
           {"--tls-server-name", &o->w.tls_server_name, NULL}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    if (strcmp(f, t[i].flag)) continue;
    *t[i].dst = v;
    if (t[i].dst2) *t[i].dst2 = v;
    return 0;
  }
  return 1;
}

/* Whether v is 1..max printable ASCII characters other than a blank (a group or rank name). */
static int label_ok(const char *v, size_t max) {
  size_t n = 0;
  while (v[n] > ' ' && v[n] < 0x7f) n++;
  return n && n <= max && !v[n];
}

/* --pool-bytes N%: a share of the memory free once the model is loaded (wrk.h's pool_share);
 * N in decimal digits with at most one point, as the byte sizes take them. */
static int pool_share(const char *cmd, const char *v, wrk_config_t *w) {
  char *end = NULL;
  const size_t digits = strspn(v, "0123456789.");
  const char *dot = strchr(v, '.');
  double p = digits && (!dot || !strchr(dot + 1, '.')) ? strtod(v, &end) : 0;
  if (end != v + digits || *end != '%' || end[1] || !(p > 0 && p <= 100))
    return cli_usage_error(cmd,
                           "--pool-bytes: '%s': a share of the free memory is N%% with 0 < N <= "
                           "100",
                           v);
  w->pool_share = p / 100, w->pool_bytes = 0;
  return 0;
}

/* One option of any of the three commands; 1 if not one of them. */
static int parse_common(const char *cmd, serve_opts_t *o, const char *f, const char *v) {
  uint64_t b;
  if (!strcmp(f, "--model")) return o->s.model = o->w.model = v, 0;
  if (!strcmp(f, "--listen"))
    return qe_listen_addr_ok(v) ? (o->s.listen = v, 0)
                                : cli_usage_error(cmd,
                                                  "--listen '%s' needs a port in 0..65535 "
                                                  "(HOST:PORT, [V6]:PORT) or a path "
                                                  "(unix:PATH)",
                                                  v);
  if (!strcmp(f, "--metrics-listen")) return o->s.metrics_listen = v, 0; /* ("": off) */
  if (!*v &&
      (!strcmp(f, "--worker-listen") || !strcmp(f, "--state-dir") ||
       !strcmp(f, "--admin-key-file") || !strcmp(f, "--ready-file") || !strcmp(f, "--tp-addr")))
    return cli_usage_error(cmd, "%s: empty", f); /* ("cannot create : No such file ...") */
  if (!strcmp(f, "--worker-listen")) {
    tr_addr_t a; /* (a malformed address had failed at bind, without the option's name) */
    return tr_addr_parse(v, &a) ? cli_usage_error(cmd, "--worker-listen: %s", qe_errmsg())
                                : (o->s.worker_listen = v, 0);
  }
  if (!strcmp(f, "--state-dir")) return o->s.state_dir = o->state_dir = v, 0;
  if (!strcmp(f, "--admin-key-file")) return o->s.admin_key_file = v, 0;
  if (!strcmp(f, "--ready-file")) return o->s.ready_file = v, 0;
  if (!strcmp(f, "--cpu-weights"))
    return cli_parse_cpu_weights(v, &o->w.cpu_weights)
               ? cli_usage_error(cmd, "bad value '%s' for --cpu-weights (f32 or packed)", v)
               : 0;
  if (!parse_tls(o, f, v)) return 0;
  if (!strcmp(f, "--scheduler")) return o->w.scheduler = v, 0;
  /* (the scheduler refused an empty or long group at each retry; the worker cut long names) */
  if (!strcmp(f, "--group") || !strcmp(f, "--name")) {
    const size_t max = f[2] == 'g' ? 63 : 95;
    if (!label_ok(v, max))
      return cli_usage_error(cmd, "%s: 1..%zu printable characters, no blank", f, max);
    return *(f[2] == 'g' ? &o->w.group : &o->w.name) = v, 0;
  }
  if (!strcmp(f, "--tp-addr"))
    return strlen(v) < UNIX_PATH_BYTES
               ? (o->w.tp_addr = v, 0)
               : cli_usage_error(cmd,
                                 "--tp-addr: a path of %zu bytes (a Unix socket's: at most %zu)",
                                 strlen(v), UNIX_PATH_BYTES - 1);
  if (!strcmp(f, "--pool-bytes") && *v && v[strlen(v) - 1] == '%') return pool_share(cmd, v, &o->w);
  if (!strcmp(f, "--max-message") || !strcmp(f, "--pool-bytes")) {
    if (f[2] == 'p') o->w.pool_share = 0; /* (a byte size after a share: the last wins) */
    if (cli_parse_bytes(v, &b))
      return cli_usage_error(cmd, "bad byte size for %s: '%s'%s", f, v, cli_parse_note());
    if (f[2] == 'm' && b < 4096) /* (1 had refused every call, SetTenant's 11 bytes too) */
      return cli_usage_error(cmd, "--max-message: %s is below 4K, too small for any call", v);
    *(f[2] == 'm' ? &o->s.max_message : &o->w.pool_bytes) = (size_t)b;
    return 0;
  }
  int n = 0, rc;
  struct {
    const char *flag;
    long lo, hi;
  } nums[] = {{"--keep-finished", 0, 86400 * 7},
              {"--worker-timeout", 100, 600000},
              {"--rank", 0, 63},
              {"--tp", 1, 64},
              {"--threads", 1, 1024},
              {"--max-seqs", 1, 4096},
              {"--max-batch", 16, 1 << 20},
              {"--workers", 1, 64},
              {"--device", 0, 255},
              {"--shutdown-grace", 0, 86400},
              {"--step-timeout", 0, 86400},
              {"--max-queued", 0, 1 << 24},
              {"--max-resumes", 0, 1000}};
  for (int i = 0; i < (int)(sizeof nums / sizeof nums[0]); i++) {
    if (strcmp(f, nums[i].flag)) continue;
    if ((rc = parse_num(cmd, f, v, nums[i].lo, nums[i].hi, &n))) return rc;
    int *dst[] = {NULL,          NULL,           &o->w.rank,           &o->w.tp,
                  &o->w.threads, &o->w.max_seqs, &o->w.max_batch,      &o->workers,
                  &o->w.device,  NULL,           &o->w.step_timeout_s, NULL,
                  NULL};
    if (i == 0) o->s.keep_finished_s = (unsigned)n;
    if (i == 1) o->s.worker_timeout_ms = (unsigned)n;
    if (i == 9) o->s.shutdown_grace_s = o->w.shutdown_grace_s = (unsigned)n;
    if (i == 11) o->s.max_queued = (unsigned)n;
    if (i == 12) o->s.max_resumes = (unsigned)n;
    if (dst[i]) *dst[i] = n;
    return 0;
  }
  return 1;
}

/* --device: a CUDA build, not with --cpu, a GPU index below the count and a GPU for each rank of
 * a group (*count: the GPUs visible to this process; 0 without --device). 0, or the exit code
 * after a message. */
static int check_device(const char *cmd, const serve_opts_t *o, int *count) {
  *count = 0;
  if (o->w.device < 0) return 0;
  if (o->cpu) return cli_usage_error(cmd, "give one of --cpu and --device");
#ifdef QE_HAVE_CUDA
  *count = kern_cuda_device_count();
  if (o->w.device >= *count || o->w.tp > *count) {
    fprintf(stderr,
            "qevict %s: --device %d --tp %d: %d CUDA device(s) visible (a group needs a GPU "
            "per rank)\n",
            cmd, o->w.device, o->w.tp, *count);
    return 1;
  }
  return 0;
#else
  return cli_usage_error(cmd, "--device needs a CUDA build of qevict (this build has the CPU "
                              "backend only)");
#endif
}

/* The worker link's TLS options: all three on the scheduler, or none; on a worker --tls-ca
 * with --tls-cert and --tls-key, or none of them. 0, or the exit code after a usage error. */
static int check_link_tls(const char *cmd, const serve_opts_t *o) {
  const sched_config_t *s = &o->s;
  int n = !!s->worker_tls_cert + !!s->worker_tls_key + !!s->worker_tls_ca;
  if (n && n < 3)
    return cli_usage_error(cmd, "give all of --worker-tls-cert, --worker-tls-key and "
                                "--worker-tls-ca, or none");
  if (strcmp(cmd, "worker")) return 0;
  if (o->w.tls_ca && !o->w.tls_cert)
    return cli_usage_error(cmd, "--tls-ca needs --tls-cert and --tls-key (the scheduler "
                                "verifies workers by their certificates)");
  if (!o->w.tls_ca && (o->w.tls_cert || o->w.tls_server_name))
    return cli_usage_error(cmd, "--tls-cert, --tls-key and --tls-server-name need --tls-ca (the "
                                "CA of the scheduler's certificate)");
  return 0;
}

static int parse_all(const char *cmd, const char *help, int argc, char **argv, serve_opts_t *o) {
  sched_config_init(&o->s);
  wrk_config_init(&o->w);
  o->workers = 1;
  o->cpu = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return printf("%s", help), -1;
    if (!strcmp(argv[i], "--metrics-tls")) {
      if (!strcmp(cmd, "worker"))
        return cli_usage_error(cmd, "--metrics-tls is a scheduler option (of qevict sched and "
                                    "serve)");
      o->s.metrics_tls = 1;
      continue;
    }
    if (!strcmp(argv[i], "--cpu")) {
      if (!strcmp(cmd, "sched"))
        return cli_usage_error(cmd, "--cpu is a worker option (of qevict worker and serve)");
      o->cpu = 1;
      continue;
    }
    int rc = check_opt(cmd, i, argc, argv);
    if (!rc) rc = parse_common(cmd, o, argv[i], argv[i + 1]);
    if (rc == 1) return cli_usage_error(cmd, "unknown option '%s'", argv[i]);
    if (rc) return rc;
    i++;
  }
  if (!o->s.model) return cli_usage_error(cmd, "--model is required");
  if (access(o->s.model, R_OK)) return cli_usage_error(cmd, "cannot read --model '%s'", o->s.model);
  if (!o->s.tls_cert != !o->s.tls_key)
    return cli_usage_error(cmd, "give both --tls-cert and --tls-key, or neither");
  if (o->s.tls_client_ca && !o->s.tls_cert)
    return cli_usage_error(cmd, "--tls-client-ca needs --tls-cert and --tls-key");
  if (o->s.metrics_tls && !o->s.tls_cert)
    return cli_usage_error(cmd, "--metrics-tls needs --tls-cert and --tls-key");
  if (o->s.metrics_tls && !*o->s.metrics_listen)
    return cli_usage_error(cmd, "--metrics-tls with --metrics-listen '' (no metrics endpoint)");
  if (o->w.cpu_weights != KERN_WEIGHT_F32 && o->w.device >= 0)
    return cli_usage_error(cmd, "--cpu-weights is for CPU workers");
  int rc = check_link_tls(cmd, o);
  if (rc) return rc;
  return strcmp(cmd, "sched") ? check_device(cmd, o, &o->n_gpus) : 0;
}

int cli_sched(int argc, char **argv) {
  serve_opts_t o;
  int rc = parse_all("sched", sched_help, argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  if (!o.s.state_dir) return cli_usage_error("sched", "--state-dir is required");
  rc = sched_run(&o.s);
  return rc < 0 ? cli_fail("sched", rc) : rc; /* (SCHED_EXIT_UNFINISHED, or 0) */
}

static int default_threads(int per_host_ranks) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores / per_host_ranks > 0 ? (int)(cores / per_host_ranks) : 1;
}

int cli_worker(int argc, char **argv) {
  serve_opts_t o;
  int rc = parse_all("worker", worker_help, argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  if (o.w.rank >= o.w.tp) return cli_usage_error("worker", "--rank must be below --tp");
  if (o.w.tp > 1 && !o.w.tp_addr) return cli_usage_error("worker", "--tp-addr is required");
  tr_addr_t sa; /* (a malformed address never connects: refused now, not retried) */
  if (tr_addr_parse(o.w.scheduler, &sa))
    return cli_usage_error("worker", "--scheduler: %s", qe_errmsg());
  if (!o.w.threads) o.w.threads = default_threads(o.w.tp);
  rc = wrk_run(&o.w);
  return rc < 0 ? cli_fail("worker", rc) : rc; /* (WRK_EXIT_RESTART, or 0) */
}

/* ---- serve: the supervisor ---- */

typedef struct {
  pid_t pid;
  char **argv;
  double started; /* cli_now_s() when last started (time() in whole seconds made the 3 s window
                   * 2 to 3 s, by where in its second the child started) */
  int restarts;
  int quick_fails; /* exits within SERVE_QUICK_S of a start, in a row */
} child_t;

/* A child that exits within SERVE_QUICK_S seconds of starting has failed quickly; serve waits
 * 1, 2, 4, ... s before each restart of such a child and stops everything once one has failed
 * quickly SERVE_MAX_QUICK times in a row (a model file gone bad, a port taken for good), or at
 * its first start without a signal. */
#define SERVE_QUICK_S   3
#define SERVE_MAX_QUICK 5

static volatile sig_atomic_t g_stop, g_signals;
static void on_stop(int sig) { g_stop = sig, g_signals++; }
static void on_child(int sig) { (void)sig; }

/* The strings fmt made for the children's argv, freed together by fmt_free_all. */
static char **fmt_owned;
static size_t fmt_n;

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  char buf[4200];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  char *r = strdup(buf), **g = realloc(fmt_owned, (fmt_n + 1) * sizeof *g);
  if (g) fmt_owned = g, fmt_owned[fmt_n++] = r;
  return r;
}

static void fmt_free_all(void) {
  for (size_t i = 0; i < fmt_n; i++) free(fmt_owned[i]);
  free(fmt_owned);
  fmt_owned = NULL, fmt_n = 0;
}

static pid_t spawn(char **argv) {
  fflush(NULL);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGCHLD, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    sigset_t none; /* (supervise blocks the stop signals and SIGCHLD: not in the child; unblocked
                      once they are back to their defaults, so none reaches serve's handler) */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* a supervisor killed outright (SIGKILL) takes its children along: SIGTERM, their orderly
       stop, instead of a scheduler and workers left serving on the ports */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) || getppid() != parent) _exit(1);
    /* a process group of its own: a Ctrl-C (or a signal to serve's whole group) reaches serve
       alone, which stops the scheduler first, in its grace, and then the workers (the scheduler
       had taken the terminal's SIGINT and serve's SIGTERM after it as two signals: at once) */
    setpgid(0, 0);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "qevict serve: exec failed: %s\n", strerror(errno));
    _exit(127);
  }
  return pid;
}

static char **sched_argv(const serve_opts_t *o, const char *state, const char *wsock) {
  char **a = calloc(48, sizeof *a); /* (33 at most, and the NULL) */
  int n = 0;
  a[n++] = "qevict", a[n++] = "sched", a[n++] = "--model", a[n++] = (char *)o->s.model;
  a[n++] = "--listen", a[n++] = (char *)o->s.listen;
  a[n++] = "--metrics-listen", a[n++] = (char *)o->s.metrics_listen;
  a[n++] = "--worker-listen", a[n++] = (char *)wsock, a[n++] = "--state-dir",
  a[n++] = (char *)state;
  if (o->s.admin_key_file) a[n++] = "--admin-key-file", a[n++] = (char *)o->s.admin_key_file;
  if (o->s.ready_file) a[n++] = "--ready-file", a[n++] = (char *)o->s.ready_file;
  a[n++] = "--max-message", a[n++] = fmt("%zu", o->s.max_message);
  a[n++] = "--keep-finished", a[n++] = fmt("%u", o->s.keep_finished_s);
  a[n++] = "--max-queued", a[n++] = fmt("%u", o->s.max_queued);
  a[n++] = "--max-resumes", a[n++] = fmt("%u", o->s.max_resumes);
  a[n++] = "--shutdown-grace", a[n++] = fmt("%u", o->s.shutdown_grace_s);
  if (o->s.tls_cert) a[n++] = "--tls-cert", a[n++] = (char *)o->s.tls_cert;
  if (o->s.tls_key) a[n++] = "--tls-key", a[n++] = (char *)o->s.tls_key;
  if (o->s.tls_client_ca) a[n++] = "--tls-client-ca", a[n++] = (char *)o->s.tls_client_ca;
  if (o->s.metrics_tls) a[n++] = "--metrics-tls";
  return a;
}

/* The GPU of rank r of group g: (device + g * tp + r) mod n_gpus (the group's rank 0 gets
 * --device, the worker adds its rank). */
static int rank_gpu(const serve_opts_t *o, int g, int r) {
  return (o->w.device + g * o->w.tp + r) % o->n_gpus;
}

/* How many of serve's worker ranks share rank r of group g's device: every rank on the CPU; on
 * GPUs the ranks over n_gpus wrap onto the first ones. A --pool-bytes share is split among them. */
static int share_split(const serve_opts_t *o, int g, int r) {
  if (o->w.device < 0 || o->n_gpus <= 0) return o->workers * o->w.tp;
  int n = 0;
  for (int gg = 0; gg < o->workers; gg++)
    for (int rr = 0; rr < o->w.tp; rr++) n += rank_gpu(o, gg, rr) == rank_gpu(o, g, r);
  return n;
}

/* A worker's --pool-bytes N%: in decimal digits and a point, as its parser takes them (%g would
 * write 5e-05 for a share split below 0.0001%). */
static char *share_arg(double pct) {
  char *s = fmt("%.15f%%", pct), *end;
  if (!s) return NULL;     /* (out of memory: the argv ends early, as with fmt's other strings) */
  end = s + strlen(s) - 1; /* (at the '%') */
  while (end[-1] == '0') end--;
  if (end[-1] == '.') end--;
  end[0] = '%', end[1] = 0;
  return s;
}

static char **worker_argv(const serve_opts_t *o, const char *state, const char *wsock, int g,
                          int r) {
  char **a = calloc(40, sizeof *a);
  int n = 0;
  a[n++] = "qevict", a[n++] = "worker", a[n++] = "--model", a[n++] = (char *)o->s.model;
  a[n++] = "--scheduler", a[n++] = (char *)wsock, a[n++] = "--group", a[n++] = fmt("g%d", g);
  a[n++] = "--rank", a[n++] = fmt("%d", r), a[n++] = "--tp", a[n++] = fmt("%d", o->w.tp);
  a[n++] = "--tp-addr", a[n++] = fmt("%s/tp-g%d.sock", state, g);
  a[n++] = "--threads", a[n++] = fmt("%d", o->w.threads);
  a[n++] = "--max-seqs", a[n++] = fmt("%d", o->w.max_seqs);
  a[n++] = "--max-batch", a[n++] = fmt("%d", o->w.max_batch);
  a[n++] = "--pool-bytes";
  const double share = wrk_pool_share(&o->w); /* (on GPUs by default WRK_GPU_POOL_SHARE) */
  a[n++] = share > 0 ? share_arg(share * 100 / share_split(o, g, r)) : fmt("%zu", o->w.pool_bytes);
  if (o->w.cpu_weights == KERN_WEIGHT_PACKED) a[n++] = "--cpu-weights", a[n++] = "packed";
  if (o->w.step_timeout_s >= 0) a[n++] = "--step-timeout", a[n++] = fmt("%d", o->w.step_timeout_s);
  if (o->w.device >= 0) /* the group's rank 0; the worker adds its rank */
    a[n++] = "--device", a[n++] = fmt("%d", rank_gpu(o, g, 0));
  return a;
}

/* Whether a child's exit status says it failed to start: an exit code other than 0 (a worker
 * that stopped in its grace exits 0) and WRK_EXIT_RESTART (a worker whose engine ran and then
 * stopped: a TP peer killed within 3 s of the start had made its peers stop everything). */
static int start_failure(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) && WEXITSTATUS(status) != WRK_EXIT_RESTART;
}

/* Waits for a signal (a child's exit, or a stop) for at most secs seconds (< 0: no limit) with
 * `open` as the mask: supervise keeps the stop signals and SIGCHLD blocked and takes them only
 * here, so one that comes after its last look at g_stop ends this wait instead of being missed
 * (a stop that landed just before a blocking waitpid had waited until some child exited: with
 * its worker stopped by SIGSTOP, for good). */
static void wait_signal(const sigset_t *open, double secs) {
  struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
  pselect(0, NULL, NULL, NULL, secs < 0 ? NULL : &ts, open);
}

/* The pause before a quick failure's restart: secs seconds, or until a stop. */
static void pause_s(const sigset_t *open, unsigned secs) {
  const double end = cli_now_s() + secs;
  for (double left; !g_stop && (left = end - cli_now_s()) > 0;) wait_signal(open, left);
}

/* Child i exited with status: restarts it (after a pause when it failed quickly), or gives up,
 * setting g_stop and *failed. */
static void reaped(child_t *ch, int i, int status, const sigset_t *open, int *failed) {
  ch[i].pid = 0; /* (reaped: the stop must not signal the number, which may be reused) */
  const int quick = cli_now_s() - ch[i].started < SERVE_QUICK_S;
  ch[i].quick_fails = quick ? ch[i].quick_fails + 1 : 0;
  const int first = ch[i].restarts == 0 && quick && start_failure(status);
  const int giveup = first || ch[i].quick_fails >= SERVE_MAX_QUICK;
  char why[96]; /* (one fprintf: the children share this stderr) */
  if (first)
    snprintf(why, sizeof why, "it failed at start: stopping");
  else if (giveup)
    snprintf(why, sizeof why, "it failed within %d s of each of its last %d starts: stopping",
             SERVE_QUICK_S, SERVE_MAX_QUICK);
  else
    snprintf(why, sizeof why, "restarting%s", quick ? " after a pause" : "");
  int w = ch[i].argv[1][0] == 'w';
  fprintf(stderr, "qevict serve: %s%s%s exited (%s %d); %s\n", ch[i].argv[1], w ? " of group " : "",
          w ? ch[i].argv[7] : "", WIFSIGNALED(status) ? "signal" : "code",
          WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), why);
  if (giveup) {
    g_stop = SIGTERM;
    *failed = 1;
    return;
  }
  if (quick) pause_s(open, 1u << (ch[i].quick_fails - 1)); /* (a stop ends it early) */
  if (g_stop) return;
  ch[i].restarts++;
  ch[i].pid = spawn(ch[i].argv);
  ch[i].started = cli_now_s();
}

/* Waits for children; restarts the ones that die (at most once a second each). A child that
 * fails (start_failure) within 3 s of its first start is a configuration error (a port in use,
 * an unreadable model): everything stops and *failed is set. */
static void supervise(child_t *ch, int n, int *failed) {
  sigset_t block, open;
  sigemptyset(&block);
  sigaddset(&block, SIGINT), sigaddset(&block, SIGTERM), sigaddset(&block, SIGHUP);
  sigaddset(&block, SIGCHLD);
  sigprocmask(SIG_BLOCK, &block, &open);
  /* the mask in the wait: these four open even if serve was started with them blocked (a
     dead child had then been left unreaped for good) */
  sigdelset(&open, SIGINT), sigdelset(&open, SIGTERM), sigdelset(&open, SIGHUP);
  sigdelset(&open, SIGCHLD);
  while (!g_stop) {
    int status;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) { /* (none exited; -1: no child at all, which should not be) */
      wait_signal(&open, pid < 0 ? 1.0 : -1.0);
      continue;
    }
    for (int i = 0; i < n; i++)
      if (ch[i].pid == pid) reaped(ch, i, status, &open, failed);
  }
  signal(SIGCHLD, SIG_DFL);              /* (the stop's waits are timed by usleep: no early ends) */
  sigprocmask(SIG_SETMASK, &open, NULL); /* (a second stop signal still reaches on_stop) */
}

/* The scheduler (ch[0]) first, while the workers run: its accepted requests may finish on them
 * for its shutdown grace; a later signal to serve is passed on (it stops at once then) as
 * SIGINT: a second SIGTERM sent before the scheduler took the first would merge with it (one
 * pending signal of a kind), and the scheduler would wait out its grace. Returns its exit
 * status (-1: none, or it did not exit in time). */
static int stop_scheduler(child_t *ch, unsigned grace_s) {
  if (ch[0].pid <= 0) return -1;
  kill(ch[0].pid, SIGTERM);
  sig_atomic_t seen = g_signals > 0 ? 1 : 0; /* (a second signal already in: passed on now) */
  for (long waited = 0; waited < (grace_s + 10L) * 10; waited++) {
    int status = 0;
    const pid_t r = waitpid(ch[0].pid, &status, WNOHANG);
    if (r != 0) {
      ch[0].pid = 0;
      return r > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    if (g_signals != seen) seen = g_signals, kill(ch[0].pid, SIGINT);
    usleep(100000);
  }
  return -1;
}

/* Stops the scheduler, then the workers; returns the scheduler's exit status (stop_scheduler). */
static int stop_children(child_t *ch, int n, unsigned grace_s) {
  const int sched_status = stop_scheduler(ch, grace_s);
  for (int i = n - 1; i >= 0; i--)
    if (ch[i].pid > 0) kill(ch[i].pid, SIGTERM);
  for (int waited = 0; waited < 100; waited++) { /* 10 s, then kill what is left */
    int left = 0;
    for (int i = 0; i < n; i++)
      if (ch[i].pid > 0 && waitpid(ch[i].pid, NULL, WNOHANG) == 0)
        left++;
      else
        ch[i].pid = 0;
    if (!left) return sched_status;
    usleep(100000);
  }
  for (int i = 0; i < n; i++)
    if (ch[i].pid > 0) kill(ch[i].pid, SIGKILL), waitpid(ch[i].pid, NULL, 0);
  return sched_status;
}

/* Whether the Unix sockets serve makes under its state directory fit a socket path; else a
 * usage error naming --state-dir (or TMPDIR). workers.sock is the longest name (tp-gN.sock, N
 * below --workers' 64, is shorter). 0 or 2. */
static int check_state_len(const serve_opts_t *o) {
  const char *tmp = getenv("TMPDIR");
  const char *dir = o->state_dir ? o->state_dir : tmp && *tmp ? tmp : "/tmp";
  size_t n = strlen(dir) + (o->state_dir ? 0 : strlen("/qevict-XXXXXX")) + strlen("/workers.sock");
  if (n < UNIX_PATH_BYTES) return 0;
  return cli_usage_error("serve",
                         "%s '%s' is too long for the Unix sockets made under it (%zu of "
                         "at most %zu bytes)",
                         o->state_dir ? "--state-dir" : "TMPDIR", dir, n, UNIX_PATH_BYTES - 1);
}

static int make_state(serve_opts_t *o, char *dir, size_t n, int *temp) {
  *temp = !o->state_dir;
  if (!*temp) {
    snprintf(dir, n, "%s", o->state_dir);
    if (mkdir(dir, 0700) && errno != EEXIST)
      return fprintf(stderr, "qevict serve: cannot create %s: %s\n", dir, strerror(errno)), 1;
    return 0;
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, n, "%s/qevict-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) return fprintf(stderr, "qevict serve: mkdtemp failed\n"), 1;
  return 0;
}

/* nftw's callback removing the temporary state directory depth first (no shell). */
static int remove_entry(const char *path, const struct stat *st, int kind, struct FTW *ftw) {
  (void)st, (void)kind, (void)ftw;
  return remove(path);
}

/* The banner's note for a listen address of port 0 (the system picks one when the scheduler
 * binds, and the scheduler's start line names it). */
static const char *any_port(const char *addr) {
  const size_t n = addr ? strlen(addr) : 0;
  return n >= 2 && !strcmp(addr + n - 2, ":0") ? " (a free port: the scheduler's line names it)"
                                               : "";
}

int cli_serve(int argc, char **argv) {
  serve_opts_t o;
  int rc = parse_all("serve", serve_help, argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  if (check_state_len(&o)) return 2;
  if (o.s.ready_file) unlink(o.s.ready_file); /* (an earlier run's, until this one is ready) */
  char state[4096], wsock[4200];
  int temp;
  if (make_state(&o, state, sizeof state, &temp)) return 1;
  snprintf(wsock, sizeof wsock, "unix:%s/workers.sock", state);
  if (!o.w.threads) o.w.threads = default_threads(o.workers * o.w.tp);
  int n = 1 + o.workers * o.w.tp;
  child_t *ch = calloc((size_t)n, sizeof *ch);
  if (!ch) return 1;
  struct sigaction sa; /* no SA_RESTART: the stop's usleep returns on a second signal */
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL); /* (a closed terminal stops the children too) */
  sa.sa_handler = on_child, sa.sa_flags = SA_NOCLDSTOP; /* (ends supervise's wait_signal) */
  sigaction(SIGCHLD, &sa, NULL);
  signal(SIGPIPE, SIG_IGN); /* output into a pipe whose reader went away: EPIPE, not death */
  ch[0].argv = sched_argv(&o, state, wsock);
  for (int g = 0, k = 1; g < o.workers; g++)
    for (int r = 0; r < o.w.tp; r++, k++) ch[k].argv = worker_argv(&o, state, wsock, g, r);
  for (int i = 0; i < n; i++) ch[i].pid = spawn(ch[i].argv), ch[i].started = cli_now_s();
  char keyfile[4200];
  snprintf(keyfile, sizeof keyfile, "%s", o.s.admin_key_file ? o.s.admin_key_file : "");
  if (!*keyfile) snprintf(keyfile, sizeof keyfile, "%s/admin.key", state);
  fprintf(stderr,
          "qevict serve: gRPC on %s%s%s, metrics %s%s%s%s%s%s, %d worker group(s) of %d rank(s), "
          "state in %s%s, admin key in %s\n",
          o.s.listen, any_port(o.s.listen), o.s.tls_cert ? " (TLS)" : "",
          *o.s.metrics_listen ? "on http" : "off",
          *o.s.metrics_listen && o.s.metrics_tls ? "s" : "", *o.s.metrics_listen ? "://" : "",
          o.s.metrics_listen, *o.s.metrics_listen ? "/metrics" : "", any_port(o.s.metrics_listen),
          o.workers, o.w.tp, state, temp ? " (temporary)" : "", keyfile);
  int failed = 0;
  supervise(ch, n, &failed);
  const int sched_status = stop_children(ch, n, o.s.shutdown_grace_s);
  if (temp && nftw(state, remove_entry, 16, FTW_DEPTH | FTW_PHYS))
    fprintf(stderr, "qevict serve: could not remove %s: %s\n", state, strerror(errno));
  for (int i = 0; i < n; i++) free(ch[i].argv);
  free(ch);
  fmt_free_all();
  /* (the scheduler's stop with accepted requests unfinished is serve's status too) */
  return failed ? 1 : sched_status == SCHED_EXIT_UNFINISHED ? SCHED_EXIT_UNFINISHED : 0;
}
