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
int qe_proc_usage(qe_proc_stats_t *out) {
  char buf[1024], *save = NULL;
  unsigned long long v[25] = {0};
  memset(out, 0, sizeof *out);
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
  out->cpu_seconds = (double)(v[14] + v[15]) / (double)sysconf(_SC_CLK_TCK);
  out->vsize_bytes = v[23];
  out->rss_bytes = v[24] * (uint64_t)sysconf(_SC_PAGESIZE);
  out->start_ticks = v[22];
  return 0;
}

/* The entries of /proc/self/fd less the one the listing itself holds open; 0 if it cannot be
 * listed. */
static uint64_t count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return 0;
  uint64_t n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n ? n - 1 : 0;
}

int qe_mem_available(uint64_t *bytes) {
  double kib = 0;
  int rc = read_key("/proc/meminfo", "MemAvailable:", &kib);
  *bytes = rc ? 0 : (uint64_t)kib * 1024;
  return rc;
}

int qe_proc_stats(qe_proc_stats_t *out) {
  double btime = 0;
  struct rlimit rl;
  int rc = qe_proc_usage(out);
  if (!rc) rc = read_key("/proc/stat", "btime ", &btime);
  if (rc) return rc;
  out->start_time = btime + (double)out->start_ticks / (double)sysconf(_SC_CLK_TCK);
  out->open_fds = count_fds();
  out->max_fds = getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY ? 0 : rl.rlim_cur;
  return 0;
}
