/* qevict: the command line entry point; dispatches to sub-commands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qe_status.h"

static const char *usage =
    "usage: qevict <command> [options]\n"
    "commands:\n"
    "  generate   run a model on a prompt in this process (see qevict generate --help)\n"
    "  inspect    print a GGUF model's architecture, hyperparameters and tensors\n"
    "  version    print the version\n";

int cli_fail(const char *what, int rc) {
  const char *d = qe_errmsg();
  fprintf(stderr, "qevict: %s: %s%s%s\n", what, qe_strerror(rc), *d ? ": " : "", d);
  return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "qevict %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see qevict %s --help)\n", cmd);
  return 2;
}

int cli_parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int cli_parse_float(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || !(v >= lo && v <= hi)) return -1;
  *out = v;
  return 0;
}

int cli_parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (!*s || *end || errno || *s == '-') return -1;
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "generate")) return cli_generate(argc - 1, argv + 1);
  if (!strcmp(argv[1], "inspect")) return cli_inspect(argc - 1, argv + 1);
  if (!strcmp(argv[1], "version")) return puts("qevict 0.1.0") < 0;
  fprintf(stderr, "qevict: unknown command '%s' (see qevict --help)\n", argv[1]);
  return 2;
}
