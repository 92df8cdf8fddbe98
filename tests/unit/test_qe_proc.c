/* test_qe_proc: this process's figures from /proc (common/qe_proc.h) against what the process
 * knows itself: descriptors it opens, memory it touches, CPU time it burns
 * (CLOCK_PROCESS_CPUTIME_ID), its start (a fork's is later), its descriptor limit, and a command
 * name that holds ") (". */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qe_proc.h"
#include "test_util.h"

static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void check_fds(void) {
  qe_proc_stats_t a, b, c;
  int fd[5];
  CHECK_OK(qe_proc_stats(&a));
  for (int i = 0; i < 5; i++) fd[i] = open("/dev/null", O_RDONLY);
  CHECK_OK(qe_proc_stats(&b));
  for (int i = 0; i < 5; i++) close(fd[i]);
  CHECK_OK(qe_proc_stats(&c));
  CHECK(a.open_fds >= 3 && b.open_fds == a.open_fds + 5 && c.open_fds == a.open_fds);
  struct rlimit rl;
  CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
  rl.rlim_cur = 500;
  CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
  CHECK_OK(qe_proc_stats(&a));
  CHECK(a.max_fds == 500);
}

static void check_memory(void) {
  qe_proc_stats_t a, b;
  const size_t n = 64u << 20;
  CHECK_OK(qe_proc_stats(&a));
  char *p = malloc(n);
  CHECK(p != NULL);
  if (!p) return;
  memset(p, 1, n);
  CHECK_OK(qe_proc_stats(&b));
  CHECK(((volatile char *)p)[n - 1] == 1); /* (the stores are kept) */
  CHECK(b.rss_bytes >= a.rss_bytes + (n - (4u << 20)));
  CHECK(b.vsize_bytes >= a.vsize_bytes + n && b.vsize_bytes >= b.rss_bytes);
  free(p);
}

static void check_cpu(void) {
  qe_proc_stats_t a, b;
  CHECK_OK(qe_proc_stats(&a));
  const double t0 = cpu_now();
  volatile double x = 0;
  while (cpu_now() - t0 < 0.3) x += 1e-9;
  CHECK_OK(qe_proc_stats(&b));
  const double own = cpu_now(); /* /proc counts whole ticks: within two of the clock */
  CHECK(b.cpu_seconds - a.cpu_seconds >= 0.25 && b.cpu_seconds <= own + 0.02 &&
        b.cpu_seconds >= own - 0.03);
}

/* A fork's start is at or after its parent's; both within the last minute. */
static void check_start(void) {
  qe_proc_stats_t a;
  CHECK_OK(qe_proc_stats(&a));
  const double now = (double)time(NULL);
  CHECK(a.start_time <= now + 1 && a.start_time > now - 60);
  int fd[2];
  CHECK(pipe(fd) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    qe_proc_stats_t c;
    usleep(50000);
    int ok = !qe_proc_stats(&c) && c.start_time >= a.start_time;
    _exit(write(fd[1], &ok, sizeof ok) == sizeof ok ? 0 : 1);
  }
  int ok = 0, st = 0;
  CHECK(read(fd[0], &ok, sizeof ok) == sizeof ok && ok);
  CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(fd[0]), close(fd[1]);
}

int main(void) {
  qe_proc_stats_t a, b;
  CHECK_OK(qe_proc_stats(&a));
  CHECK(prctl(PR_SET_NAME, "a) b (c", 0, 0, 0) == 0); /* the name the stat line opens with */
  CHECK_OK(qe_proc_stats(&b));
  CHECK(b.start_time == a.start_time && b.vsize_bytes > 0 && b.rss_bytes > 0);
  qe_proc_stats_t u; /* the cheap part alone */
  CHECK_OK(qe_proc_usage(&u));
  CHECK(u.start_ticks == b.start_ticks && u.start_ticks > 0 && u.rss_bytes > 0 &&
        u.cpu_seconds >= b.cpu_seconds && u.start_time == 0 && u.open_fds == 0);
  check_fds();
  check_memory();
  check_cpu();
  check_start();
  return tu_done("qe_proc");
}
