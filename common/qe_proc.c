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

/* The number that a one-line file holds; 0 when it cannot be read or holds none ("max"). */
static uint64_t read_u64(const char *path) {
  unsigned long long v = 0;
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  if (fscanf(f, "%llu", &v) != 1) v = 0;
  fclose(f);
  return v;
}

/* The number after "key " on a line of a key-value file (memory.stat); 0 without one. */
static uint64_t read_stat(const char *path, const char *key) {
  char line[256];
  unsigned long long v = 0;
  const size_t n = strlen(key);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, n) && line[n] == ' ' && sscanf(line + n + 1, "%llu", &v) == 1) break;
  fclose(f);
  return v;
}

uint64_t qe_cgroup_room(const char *dir, int v1) {
  char lim[320], use[320], stat[320];
  snprintf(lim, sizeof lim, "%s/%s", dir, v1 ? "memory.limit_in_bytes" : "memory.max");
  snprintf(use, sizeof use, "%s/%s", dir, v1 ? "memory.usage_in_bytes" : "memory.current");
  snprintf(stat, sizeof stat, "%s/memory.stat", dir);
  const uint64_t max = read_u64(lim), cur = read_u64(use);
  if (!max || max >= (UINT64_C(1) << 62)) return UINT64_MAX;
  const uint64_t cache = read_stat(stat, v1 ? "total_inactive_file" : "inactive_file");
  const uint64_t held = cur > cache ? cur - cache : 0; /* (the working set, as kubelet counts) */
  return max > held ? max - held : 0;
}

/* The room this process's memory cgroup leaves: its own directory (from /proc/self/cgroup) and
 * the namespace's root, v2 and v1 alike; the least of the limits found, UINT64_MAX if none. */
static uint64_t cgroup_left(void) {
  char line[256], dir[300];
  uint64_t room = UINT64_MAX, r;
  FILE *f = fopen("/proc/self/cgroup", "r");
  while (f && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    const char *mem = strstr(line, ":memory:");
    const int v2 = !strncmp(line, "0::", 3), v1 = mem != NULL;
    const char *path = v2 ? line + 3 : v1 ? mem + 8 : NULL;
    if (!path || !strcmp(path, "/")) continue;
    snprintf(dir, sizeof dir, "/sys/fs/cgroup%s%s", v1 ? "/memory" : "", path);
    if ((r = qe_cgroup_room(dir, v1)) < room) room = r;
  }
  if (f) fclose(f);
  if ((r = qe_cgroup_room("/sys/fs/cgroup", 0)) < room) room = r;
  if ((r = qe_cgroup_room("/sys/fs/cgroup/memory", 1)) < room) room = r;
  return room;
}

int qe_mem_available(uint64_t *bytes) {
  double kib = 0;
  int rc = read_key("/proc/meminfo", "MemAvailable:", &kib);
  *bytes = rc ? 0 : (uint64_t)kib * 1024;
  const uint64_t room = rc ? UINT64_MAX : cgroup_left();
  if (room < *bytes) *bytes = room;
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
