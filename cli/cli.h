/* cli: the qevict command's sub-commands and their shared argument helpers. */
#ifndef QE_CLI_H
#define QE_CLI_H

#include <stddef.h>
#include <stdint.h>

int cli_generate(int argc, char **argv);
/* `qevict generate`'s options checked as cli_generate checks them before it reads anything (no
 * file opened, no input read): 0, or 2 after its usage message. bench latency checks its runs'
 * options with it before it reads their prompt. */
int cli_generate_usage(int argc, char **argv);
/* 1 when `qevict generate` takes the argument after option f as f's value (every option but
 * its flags, --help and --graphkv[=...]: also an unknown one, as its parser does). Pure. */
int cli_generate_takes_value(const char *f);
int cli_inspect(int argc, char **argv);
/* `qevict eval` (cli_eval.c): KV policies against FullKV at matched bytes; exit 0, 1 or 2. */
int cli_eval(int argc, char **argv);
/* `qevict bench latency` (cli_bench_latency.c): generate under several KV policies, compared. */
int cli_bench_latency(int argc, char **argv);
/* A synthetic prompt: `words` words drawn from a fixed list by (seed, i), malloc'd (NULL when
 * out of memory). The benchmarks' prompts. */
char *cli_bench_words(long words, uint64_t seed, long i);
/* splitmix64: the next pseudo-random 64 bits of the state *s (the benchmarks' seeded draws). */
uint64_t cli_splitmix64(uint64_t *s);

/* The client commands that talk to qevict-sched over gRPC (cli_submit.c, cli_admin.c; built
 * only with serving, where QE_HAVE_SERVING is defined). argv[0] is the command name; each
 * returns the process exit code: 0, 1 (a gRPC error or a failed request), 2 (bad usage), 3
 * (UNAUTHENTICATED or PERMISSION_DENIED), 130 (interrupted by SIGINT). */
int cli_submit(int argc, char **argv);
int cli_watch(int argc, char **argv);
int cli_cancel(int argc, char **argv);
int cli_tenant(int argc, char **argv);
int cli_requests(int argc, char **argv);
int cli_drain(int argc, char **argv);
/* `qevict bench serve` (cli_bench.c): a load test of a running qevict-sched. */
int cli_bench_serve(int argc, char **argv);
/* The daemon (cli_serve.c): the scheduler, one worker rank, or both supervised. */
int cli_serve(int argc, char **argv);
int cli_sched(int argc, char **argv);
int cli_worker(int argc, char **argv);

/* Prints "qevict: <what>: <strerror>: <detail>" and returns exit code 1. */
int cli_fail(const char *what, int rc);
/* Seconds on the monotonic clock (for durations and ages, never dates). */
double cli_now_s(void);
/* Prints "qevict <cmd>: <msg>" plus a hint to --help in one write and returns exit code 2 (the
 * message's control bytes as \xNN; past 1,023 bytes it is cut, ending "..."). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Strict numeric parsing: the whole string must be a decimal number within [lo, hi], without
 * leading blanks or '+' (nor hexadecimal: strtod took "0x10"). 0 or -1. */
int cli_parse_int(const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *s, double lo, double hi, double *out);
/* What the last failed cli_parse_int, cli_parse_float, cli_parse_u64 or cli_parse_bytes took, " (an
 * integer in 1..64)" or " (a number in [0, 1])", for the usage error that follows; "" after a
 * success. */
const char *cli_parse_note(void);
/* Sets the note (NULL: none): an option loop clears it before each option, and a parser that
 * tries several forms states them all. */
void cli_parse_note_set(const char *note);
/* The suffixes of a byte size (K, M and G in either case: powers of 1024; a lower-case b, bits,
 * is none of them). */
#define CLI_BYTES_SUFFIXES "an optional suffix B, K, KB, KiB, M, MB, MiB, G, GB or GiB"
/* The notes of a byte size, and of a budget, that is neither form. */
#define CLI_BYTES_NOTE  " (bytes with " CLI_BYTES_SUFFIXES ")"
#define CLI_BUDGET_NOTE " (a fraction in (0, 1] or bytes with " CLI_BYTES_SUFFIXES ")"
/* A decimal integer without sign (--seed, --from): 0 or -1. */
int cli_parse_u64(const char *s, uint64_t *out);
/* A byte size: digits (a '.' among them before a suffix: "1.5G") with an optional suffix (the
 * letter K, M or G alone or followed by B or iB, or B), > 0 and below 2^63. 0, or -1 with the
 * note CLI_BYTES_NOTE. */
int cli_parse_bytes(const char *s, uint64_t *out);
/* Reads a text file of at most max bytes (max < SIZE_MAX) into *out (malloc'd, NUL-terminated),
 * reading no more than max + 1 bytes of it: QE_EIO (cannot open or read, a directory too),
 * QE_ERANGE (larger) or QE_EINVAL (it holds a NUL byte, which would cut the text), each with a
 * detail "<what> '<path>': <reason>". */
int cli_read_text_file(const char *what, const char *path, size_t max, char **out);
/* Reads a --prompt-file (path, or - for standard input) as cli_read_text_file does: one larger
 * than max is QE_ERANGE "--prompt-file '<path>': larger than <max> bytes (<max in KiB/MiB>),
 * <why>" (why: what bounds it). Every command's prompt files are read here. */
int cli_read_prompt_file(const char *path, size_t max, const char *why, char **out);
/* The most a --prompt-file may hold where no model is at hand to bound it: the client commands
 * (the server's model is not known here) and bench latency's prompt file (read before any
 * model, once for all its runs). 64 MiB, the most one request message carries (CLI_RPC_MAX_MSG),
 * less 64 KiB for the rest of the request. */
#define CLI_PROMPT_FILE_MAX (((size_t)64 << 20) - ((size_t)1 << 16))
/* A --graphkv value "k,m,T": source fraction k in (0, 1], m in 1..2^20 neighbours, T in
 * 1..GRAPHKV_MAX_ROUNDS rounds. 0 or -1. */
int cli_parse_graphkv(const char *s, double *k, long *m, long *t);
/* --cpu-weights: "f32" (KERN_WEIGHT_F32) or "packed" (KERN_WEIGHT_PACKED). 0 or -1. */
int cli_parse_cpu_weights(const char *s, int *out);
/* generate's and eval's backend options together: --cpu-weights other than f32 with --device
 * (device >= 0), and --device in a build without CUDA, are usage errors. 0, or 2 after the
 * message. */
int cli_check_backend(const char *cmd, int device, int cpu_weights);
/* "512 B", "12.5 KiB", "1.5 GiB" into buf (>= 16 bytes); returns buf. */
const char *cli_fmt_bytes(char *buf, size_t size, uint64_t n);
/* Help line of --cpu-weights, shared by the commands that take it. */
#define CLI_CPU_WEIGHTS_HELP                                                                       \
  "  --cpu-weights W   CPU backend weights: f32 (default: every weight dequantized to fp32) or\n"  \
  "                    packed (a GGUF's Q4_0/Q4_1/Q8_0/Q4_K/Q5_K weights kept as their codes,\n"   \
  "                    two 4-bit codes a byte or int8, with their blocks' scales, exactly:\n"      \
  "                    0.75 to 1.25 bytes a weight instead of 4)\n"

#endif
