/* qevict: the command line entry point; dispatches to sub-commands. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "graphkv.h"
#include "kern.h"
#include "qe_status.h"

static const char *usage =
    "usage: qevict <command> [options]\n"
    "commands:\n"
    "  generate   run a model on a prompt in this process (see qevict generate --help)\n"
    "  inspect    print a GGUF model's architecture, hyperparameters and tensors\n"
    "  eval       KV policies against FullKV at equal bytes: long-context tasks, diagnostics\n"
    "  bench latency  one generation under several KV policies: speed, KV bytes, memory\n"
    "  version    print the version\n"
#ifdef QE_HAVE_SERVING
    "client of a running qevict-sched (see qevict COMMAND --help):\n"
    "  submit     run a prompt on the server and stream its text (or queue it: --detach)\n"
    "  watch      stream a request's events\n"
    "  cancel     cancel a queued or running request\n"
    "  tenant     set, get, list or delete tenants (admin)\n"
    "  requests   list the server's requests and their KV memory (admin)\n"
    "  drain      stop dispatching to a worker (admin)\n"
    "  bench serve  load-test the server (latency percentiles, throughput, KV reserved)\n"
    "the daemon:\n"
    "  serve      a scheduler and local workers, supervised (the whole system on one machine)\n"
    "  sched      the scheduler process alone (installed as qevict-sched)\n"
    "  worker     one worker rank alone (installed as qevictd)\n"
#endif
    "";

#ifdef QE_HAVE_SERVING
static const struct {
  const char *name;
  int (*fn)(int argc, char **argv);
} client_cmds[] = {{"submit", cli_submit}, {"watch", cli_watch},       {"cancel", cli_cancel},
                   {"tenant", cli_tenant}, {"requests", cli_requests}, {"drain", cli_drain},
                   {"serve", cli_serve},   {"sched", cli_sched},       {"worker", cli_worker}};
#endif

double cli_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_fail(const char *what, int rc) {
  const char *d = qe_errmsg();
  fprintf(stderr, "qevict: %s: %s%s%s\n", what, qe_strerror(rc), *d ? ": " : "", d);
  return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  char msg[1024], out[4 * sizeof msg + 8] = "";
  size_t n = 0;
  va_list ap;
  va_start(ap, fmt);
  const int len = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* a value's control bytes (an ESC, a newline) shown as \xNN rather than sent to the terminal */
  for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
    n += (size_t)snprintf(out + n, sizeof out - n, *p < ' ' || *p == 0x7f ? "\\x%02x" : "%c", *p);
  if (len >= (int)sizeof msg) snprintf(out + n, sizeof out - n, "...");
  fprintf(stderr, "qevict %s: %s (see qevict %s --help)\n", cmd, out, cmd); /* (one write) */
  return 2;
}

/* What the last failed cli_parse_int, cli_parse_float, cli_parse_u64 or cli_parse_bytes wanted,
 * " (an integer in 1..64)", or "" after a success. */
static char parse_expected[256];

const char *cli_parse_note(void) { return parse_expected; }

void cli_parse_note_set(const char *note) {
  snprintf(parse_expected, sizeof parse_expected, "%s", note ? note : "");
}

/* Whether s cannot start a number: empty, a leading blank or '+' (which strtol, strtoull and
 * strtod skip or take: "-n +5" was 5), or a hexadecimal one (strtod took "--temp 0x10" as 16). */
static int bad_start(const char *s) {
  return !*s || isspace((unsigned char)*s) || *s == '+' || strpbrk(s, "xX");
}

int cli_parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  parse_expected[0] = '\0';
  if (bad_start(s) || *end || errno || v < lo || v > hi) {
    snprintf(parse_expected, sizeof parse_expected, " (an integer in %ld..%ld)", lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_parse_float(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  parse_expected[0] = '\0';
  if (bad_start(s) || *end || errno || !(v >= lo && v <= hi)) {
    snprintf(parse_expected, sizeof parse_expected, " (a number in [%g, %g])", lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

/* The multiplier of a size suffix: none or "B" (1); K, M or G in either case (powers of 1024),
 * alone or followed by "B" or "iB". 0 when not one: a lower-case b is bits ("100Kb" had been
 * taken as 100 KiB). */
static uint64_t bytes_suffix(const char *s) {
  static const char *units = "KMG";
  if (!*s || !strcmp(s, "B")) return 1;
  const char *u = strchr(units, toupper((unsigned char)s[0]));
  if (!u || (s[1] && strcmp(s + 1, "iB") && strcmp(s + 1, "B"))) return 0;
  return (uint64_t)1 << (10 * (u - units + 1));
}

/* cli_parse_bytes without its note. */
static int bytes_value(const char *s, uint64_t *out) {
  size_t nd = strspn(s, "0123456789."), dots = 0;
  for (size_t i = 0; i < nd; i++) dots += s[i] == '.';
  uint64_t mult = bytes_suffix(s + nd);
  if (!nd || s[0] == '.' || dots > 1 || !mult || (dots && mult == 1)) return -1;
  if (!dots) {
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno || v == 0 || v > (uint64_t)INT64_MAX / mult) return -1;
    *out = (uint64_t)v * mult;
    return 0;
  }
  double d = strtod(s, NULL) * (double)mult; /* "1.5G" */
  if (!(d >= 1 && d < 9.2e18)) return -1;
  *out = (uint64_t)d;
  return 0;
}

int cli_parse_bytes(const char *s, uint64_t *out) {
  const int rc = bytes_value(s, out);
  cli_parse_note_set(rc ? CLI_BYTES_NOTE : NULL);
  return rc;
}

int cli_parse_u64(const char *s, uint64_t *out) {
  parse_expected[0] = '\0';
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (bad_start(s) || *end || errno || *s == '-') {
    snprintf(parse_expected, sizeof parse_expected, " (an integer in 0..%llu)", ULLONG_MAX);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_read_text_file(const char *what, const char *path, size_t max, char **out) {
  const int in = !strcmp(path, "-"); /* (standard input) */
  FILE *f = in ? stdin : fopen(path, "rb");
  if (!f) return qe_errf(QE_EIO, "%s '%s': %s", what, path, strerror(errno));
  /* no more than max + 1 bytes are read (the one past max says it is larger): cap <= max + 1 */
  size_t cap = max < (1 << 16) ? max + 1 : 1 << 16, n = 0, r;
  char *buf = malloc(cap + 1);
  while (buf && n <= max && (r = fread(buf + n, 1, cap - n, f)) > 0) {
    n += r;
    const size_t grow = n < cap || n > max ? cap : cap <= max / 2 ? cap * 2 : max + 1;
    char *grown = grow > cap ? realloc(buf, grow + 1) : buf;
    if (!grown) free(buf);
    buf = grown, cap = grow;
  }
  const int err = ferror(f) ? errno : 0;
  if (!in) fclose(f);
  if (!buf) return qe_errf(QE_ENOMEM, "%s '%s': out of memory", what, path);
  const char *nul = memchr(buf, 0, n);
  const size_t at = nul ? (size_t)(nul - buf) : n; /* (n: none) */
  buf[n] = '\0';
  if (err || n > max || at < n) free(buf);
  if (err) return qe_errf(QE_EIO, "%s '%s': %s", what, path, strerror(err));
  if (n > max) return qe_errf(QE_ERANGE, "%s '%s': larger than %zu bytes", what, path, max);
  if (at < n)
    return qe_errf(QE_EINVAL, "%s '%s': a NUL byte at offset %zu (not text)", what, path, at);
  *out = buf;
  return 0;
}

int cli_read_prompt_file(const char *path, size_t max, const char *why, char **out) {
  int rc = cli_read_text_file("--prompt-file", path, max, out);
  char b[32];
  if (rc == QE_ERANGE)
    rc = qe_errf(rc, "--prompt-file '%s': larger than %zu bytes (%s), %s", path, max,
                 cli_fmt_bytes(b, sizeof b, max), why);
  return rc;
}

int cli_parse_graphkv(const char *s, double *k, long *m, long *t) {
  char buf[64], *m_s, *t_s;
  if (strlen(s) >= sizeof buf) return -1;
  memcpy(buf, s, strlen(s) + 1);
  if (!(m_s = strchr(buf, ',')) || !(t_s = strchr(m_s + 1, ','))) return -1;
  *m_s++ = 0, *t_s++ = 0;
  if (cli_parse_float(buf, 0.0, 1.0, k) || !(*k > 0)) return -1;
  return cli_parse_int(m_s, 1, 1 << 20, m) || cli_parse_int(t_s, 1, GRAPHKV_MAX_ROUNDS, t) ? -1 : 0;
}

const char *cli_fmt_bytes(char *buf, size_t size, uint64_t n) {
  static const char *units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) {
    snprintf(buf, size, "%llu B", (unsigned long long)n);
    return buf;
  }
  double v = (double)n / 1024;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  snprintf(buf, size, "%.1f %s", v, units[u]);
  return buf;
}

int cli_parse_cpu_weights(const char *s, int *out) {
  if (!strcmp(s, "f32")) return *out = KERN_WEIGHT_F32, 0;
  if (!strcmp(s, "packed")) return *out = KERN_WEIGHT_PACKED, 0;
  return -1;
}

int cli_check_backend(const char *cmd, int device, int cpu_weights) {
  if (device >= 0 && cpu_weights != KERN_WEIGHT_F32)
    return cli_usage_error(cmd, "--cpu-weights is for the CPU backend, not --device");
#ifndef QE_HAVE_CUDA
  if (device >= 0)
    return cli_usage_error(cmd, "--device needs a CUDA build of qevict (this build has the CPU "
                                "backend only)");
#endif
  return 0;
}

/* `qevict bench latency|serve`. */
static int bench(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs("usage: qevict bench latency|serve [options]   (see qevict bench KIND --help)\n"
          "  latency  one generation under several KV policies, each in a process of its own\n"
          "  serve    a load test of a running qevict-sched over gRPC\n",
          argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "latency")) return cli_bench_latency(argc - 1, argv + 1);
#ifdef QE_HAVE_SERVING
  if (!strcmp(argv[1], "serve")) return cli_bench_serve(argc - 1, argv + 1);
#else
  if (!strcmp(argv[1], "serve"))
    return fprintf(stderr, "qevict bench serve: this build has no serving (gRPC)\n"), 2;
#endif
  return cli_usage_error("bench", "unknown benchmark '%s' (latency, serve)", argv[1]);
}

/* A command's exit code rc, or 1 when it succeeded but its standard output could not be written
 * (a full disk, a closed pipe): the output is then incomplete, and exit 0 would hide it. */
static int output_checked(int rc) {
  if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
  if (rc == 0) fprintf(stderr, "qevict: writing the standard output failed: %s\n", strerror(errno));
  return rc ? rc : 1;
}

static int run_command(int argc, char **argv);

int main(int argc, char **argv) { return output_checked(run_command(argc, argv)); }

static int run_command(int argc, char **argv) {
#ifdef QE_HAVE_SERVING
  /* installed under the daemons' names: qevict-sched and qevictd */
  const char *base = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  if (!strcmp(base, "qevict-sched")) return cli_sched(argc, argv);
  if (!strcmp(base, "qevictd")) return cli_worker(argc, argv);
#endif
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "generate")) return cli_generate(argc - 1, argv + 1);
  if (!strcmp(argv[1], "inspect")) return cli_inspect(argc - 1, argv + 1);
  if (!strcmp(argv[1], "eval")) return cli_eval(argc - 1, argv + 1);
  if (!strcmp(argv[1], "bench")) return bench(argc - 1, argv + 1);
  if (!strcmp(argv[1], "version") && argc == 3 &&
      (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")))
    return puts("usage: qevict version\nPrints the version.") < 0;
  if (!strcmp(argv[1], "version") && argc > 2)
    return fprintf(stderr, "qevict version: takes no arguments (got '%s')\n", argv[2]), 2;
  if (!strcmp(argv[1], "version")) return puts("qevict " QE_VERSION) < 0;
#ifdef QE_HAVE_SERVING
  for (size_t i = 0; i < sizeof client_cmds / sizeof client_cmds[0]; i++)
    if (!strcmp(argv[1], client_cmds[i].name)) return client_cmds[i].fn(argc - 1, argv + 1);
#endif
  fprintf(stderr, "qevict: unknown command '%s' (see qevict --help)\n", argv[1]);
  return 2;
}
