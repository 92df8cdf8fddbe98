/* qe_proc: see qe_proc.h. */
#include "qe_proc.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "qe_status.h"

/* The first line of path that starts with key, its number after the key. */
static int read_key(const char *path, const char *key, double *out) {
  char line[256];
  FILE *f = fopen(path, "r");
  if (!f) return qe_errf(QE_EIO, "%s: cannot open", path);
  int found = 0;
  while (!found && fgets(line, sizeof line, f))
    found = !strncmp(line, key, strlen(key)) && sscanf(line + strlen(key), "%lf", out) == 1;
  fclose(f);
  return found ? 0 : qe_errf(QE_EIO, "%s: no %s line", path, key);
}

/* /proc/self/stat past the command name (which may hold spaces and parentheses), fields counted
 * from 1 as proc(5) does: 14 utime, 15 stime, 22 starttime (clock ticks since boot), 23 vsize
 * (bytes), 24 rss (pages). */
static int read_stat(qe_proc_stats_t *out, double *start_ticks) {
  char buf[1024], *save = NULL;
  unsigned long long v[25] = {0};
  FILE *f = fopen("/proc/self/stat", "r");
  if (!f) return qe_errf(QE_EIO, "/proc/self/stat: cannot open");
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  int field = 3; /* the state, the first field after the name */
  for (char *t = p ? strtok_r(p + 1, " \n", &save) : NULL; t && field < 25;
       t = strtok_r(NULL, " \n", &save), field++)
    v[field] = strtoull(t, NULL, 10);
  if (field < 25) return qe_errf(QE_EIO, "/proc/self/stat: cannot parse");
  const double tick = (double)sysconf(_SC_CLK_TCK);
  out->cpu_seconds = (double)(v[14] + v[15]) / tick;
  out->vsize_bytes = v[23];
  out->rss_bytes = v[24] * (uint64_t)sysconf(_SC_PAGESIZE);
  *start_ticks = (double)v[22] / tick;
  return 0;
}

/* The entries of /proc/self/fd less the one the listing itself holds open. */
static int count_fds(uint64_t *out) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return qe_errf(QE_EIO, "/proc/self/fd: cannot open");
  uint64_t n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  *out = n ? n - 1 : 0;
  return 0;
}

int qe_proc_stats(qe_proc_stats_t *out) {
  double start = 0, btime = 0;
  struct rlimit rl;
  memset(out, 0, sizeof *out);
  int rc = read_stat(out, &start);
  if (!rc) rc = read_key("/proc/stat", "btime ", &btime);
  if (!rc) rc = count_fds(&out->open_fds);
  if (rc) return rc;
  out->start_time = btime + start;
  out->max_fds = getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY ? 0 : rl.rlim_cur;
  return 0;
}
