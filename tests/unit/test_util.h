/* test_util: tiny assertion helpers for the unit tests (no framework). A failed CHECK prints
 * file:line and the expression, counts the failure, and the test exits 1 at the end. */
#ifndef QE_TEST_UTIL_H
#define QE_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

extern int tu_failures;

#define CHECK(e)                                                                                   \
  do {                                                                                             \
    if (!(e)) tu_fail(__FILE__, __LINE__, #e);                                                     \
  } while (0)
#define CHECK_OK(e)                                                                                \
  do {                                                                                             \
    int tu__rc = (e);                                                                              \
    if (tu__rc != 0) tu_fail_rc(__FILE__, __LINE__, #e, tu__rc);                                   \
  } while (0)

void tu_fail(const char *file, int line, const char *expr);
void tu_fail_rc(const char *file, int line, const char *expr, int rc);
/* Returns the process exit code: 0 if no failure, 1 otherwise (prints a summary). */
int tu_done(const char *name);
/* Exits 77 (meson "skipped") after printing why. */
void tu_skip(const char *why) __attribute__((noreturn));
/* Reads a whole file into a malloc'd buffer (NUL-terminated); NULL on failure. */
char *tu_read_file(const char *path, size_t *size);
/* Joins env var dir and a name into a static buffer; NULL if the env var is unset. */
const char *tu_env_path(const char *env, const char *name);
/* Deterministic uniform floats in [lo, hi) from a seed state. */
float tu_randf(uint64_t *state, float lo, float hi);
/* Forks ranks 1..size-1 of a tensor-parallel test, each joined to rank 0 by a socketpair: child
 * r runs child(ud, r, its end) and must _exit; rank 0's ends go to fds[r], the pids to pids[r]
 * (fds[0], pids[0] untouched). Returns 0, or -1 when a socketpair fails. */
int tu_fork_ranks(int size, void (*child)(void *ud, int rank, int fd), void *ud, int *fds,
                  pid_t *pids);
/* Waits for the forked children pids[0..n) (entries <= 0 skipped); 1 when every one exited
 * with status 0. */
int tu_wait_ok(const pid_t *pids, int n);
/* Max |a-b| / max(max|b|, eps) over n. */
double tu_rel_err(const float *a, const float *b, size_t n);

#endif
