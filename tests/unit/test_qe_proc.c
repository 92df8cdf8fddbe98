/* test_qe_proc: this process's figures from /proc (common/qe_proc.h) against what the process
 * knows itself: descriptors it opens, memory it touches, CPU time it burns
 * (CLOCK_PROCESS_CPUTIME_ID), its start (a fork's is later), its descriptor limit, a command
 * name that holds ") (", and the memory left to it (MemAvailable, cgroup limits' files). */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
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

/* Writes text to dir/name. */
static void put(const char *dir, const char *name, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) fputs(text, f), fclose(f);
}

/* The memory left: MemAvailable read here within 5% (the two reads are apart in time), unless
 * a cgroup limit leaves less; the cgroup files as v2 and v1 write them. */
static void check_available(void) {
  uint64_t avail = 0, kib = 0;
  CHECK_OK(qe_mem_available(&avail));
  FILE *f = fopen("/proc/meminfo", "r");
  char line[128];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kib) == 1) break;
  if (f) fclose(f);
  CHECK(kib > 0 && avail > 0 && (double)avail <= kib * 1024.0 * 1.05);
  char dir[] = "/tmp/qe-cgroup-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  CHECK(qe_cgroup_room(dir, 0) == UINT64_MAX); /* no files: no limit */
  put(dir, "memory.max", "max\n");
  put(dir, "memory.current", "1000\n");
  CHECK(qe_cgroup_room(dir, 0) == UINT64_MAX);
  put(dir, "memory.max", "4096\n");
  CHECK(qe_cgroup_room(dir, 0) == 3096);
  put(dir, "memory.stat", "active_file 7\ninactive_file_x 9\ninactive_file 600\n");
  CHECK(qe_cgroup_room(dir, 0) == 3696); /* (inactive page cache is reclaimed first) */
  put(dir, "memory.current", "5000\n");
  CHECK(qe_cgroup_room(dir, 0) == 0); /* (over its limit) */
  put(dir, "memory.stat", "inactive_file 5000\n");
  CHECK(qe_cgroup_room(dir, 0) == 4096);
  put(dir, "memory.stat", "inactive_file 600\ntotal_inactive_file 24\n");
  put(dir, "memory.limit_in_bytes", "9223372036854771712\n");
  put(dir, "memory.usage_in_bytes", "1000\n");
  CHECK(qe_cgroup_room(dir, 1) == UINT64_MAX); /* (v1's "none") */
  put(dir, "memory.limit_in_bytes", "1048576\n");
  CHECK(qe_cgroup_room(dir, 1) == 1048576 - 1000 + 24);
  const char *names[] = {"memory.max", "memory.current", "memory.limit_in_bytes",
                         "memory.usage_in_bytes", "memory.stat"};
  for (int i = 0; i < 5; i++) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    unlink(path);
  }
  rmdir(dir);
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
  check_available();
  return tu_done("qe_proc");
}
