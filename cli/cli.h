/* cli: the qevict command's sub-commands and their shared argument helpers. */
#ifndef QE_CLI_H
#define QE_CLI_H

#include <stdint.h>

int cli_generate(int argc, char **argv);
int cli_inspect(int argc, char **argv);

/* Prints "qevict: <what>: <strerror>: <detail>" and returns exit code 1. */
int cli_fail(const char *what, int rc);
/* Prints "qevict <cmd>: <msg>" plus a hint to --help and returns exit code 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Strict numeric parsing: the whole string must be a number within [lo, hi]. 0 or -1. */
int cli_parse_int(const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *s, double lo, double hi, double *out);
int cli_parse_u64(const char *s, uint64_t *out);

#endif
