/* test_util: assertion helpers shared by the unit tests. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdlib.h>

#include "qe_status.h"

int tu_failures;

void tu_fail(const char *file, int line, const char *expr) {
  fprintf(stderr, "FAIL %s:%d: %s\n", file, line, expr);
  tu_failures++;
}

void tu_fail_rc(const char *file, int line, const char *expr, int rc) {
  fprintf(stderr, "FAIL %s:%d: %s -> %d (%s: %s)\n", file, line, expr, rc, qe_strerror(rc),
          qe_errmsg());
  tu_failures++;
}

int tu_done(const char *name) {
  if (tu_failures) {
    fprintf(stderr, "%s: %d failure(s)\n", name, tu_failures);
    return 1;
  }
  fprintf(stderr, "%s: ok\n", name);
  return 0;
}

void tu_skip(const char *why) {
  fprintf(stderr, "SKIP: %s\n", why);
  exit(77);
}

char *tu_read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (!buf) return NULL;
  buf[n] = '\0';
  if (size) *size = (size_t)n;
  return buf;
}

const char *tu_env_path(const char *env, const char *name) {
  static char buf[4096];
  const char *d = getenv(env);
  if (!d) return NULL;
  snprintf(buf, sizeof buf, "%s/%s", d, name);
  return buf;
}

float tu_randf(uint64_t *s, float lo, float hi) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return lo + (hi - lo) * (float)((*s >> 40) * (1.0 / 16777216.0));
}

double tu_rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 1e-12;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
    if (fabs(b[i]) > den) den = fabs(b[i]);
  }
  return num / den;
}

int tu_wait_ok(const pid_t *pids, int n) {
  int ok = 1;
  for (int i = 0; i < n; i++) {
    int st = 1;
    if (pids[i] <= 0) continue;
    if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) ok = 0;
  }
  return ok;
}

int tu_fork_ranks(int size, void (*child)(void *ud, int rank, int fd), void *ud, int *fds,
                  pid_t *pids) {
  for (int r = 1; r < size; r++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return -1;
    fflush(NULL);
    if ((pids[r] = fork()) == 0) {
      close(sv[0]);
      child(ud, r, sv[1]);
      _exit(1); /* child returned: a test bug */
    }
    close(sv[1]);
    fds[r] = sv[0];
  }
  return 0;
}
