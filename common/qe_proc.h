/* qe_proc: this process's own figures from Linux's /proc, for the process_* metrics that
 * Prometheus' client libraries export (the names and meanings of their process collector). */
#ifndef QE_PROC_H
#define QE_PROC_H

#include <stdint.h>

typedef struct {
  double cpu_seconds;   /* user and system CPU time spent */
  double start_time;    /* when the process started, seconds since the Unix epoch */
  uint64_t rss_bytes;   /* resident memory */
  uint64_t vsize_bytes; /* virtual memory */
  uint64_t open_fds;    /* open file descriptors */
  uint64_t max_fds;     /* the soft limit on them (RLIMIT_NOFILE) */
  uint64_t start_ticks; /* its start, clock ticks after boot: another value, another process */
} qe_proc_stats_t;

/* The cheap part, /proc/self/stat alone: cpu_seconds, rss_bytes, vsize_bytes and start_ticks
 * (the other fields 0). QE_EIO when it cannot be read or parsed. */
int qe_proc_usage(qe_proc_stats_t *out);

/* All of it: also start_time (with /proc/stat's boot time), open_fds (0 when /proc/self/fd
 * cannot be listed, e.g. at the descriptor limit) and max_fds (0 when unlimited). QE_EIO naming
 * the file when /proc/self/stat or /proc/stat cannot be read or parsed. */
int qe_proc_stats(qe_proc_stats_t *out);

/* The memory free for this process: the system's MemAvailable (/proc/meminfo: what a new
 * workload can take without swapping), or less when its memory cgroup's limit (v2 memory.max or
 * v1 memory.limit_in_bytes, its own and the namespace root's) leaves less above the cgroup's
 * working set (qe_cgroup_room). QE_EIO when /proc/meminfo cannot be read. */
int qe_mem_available(uint64_t *bytes);
/* What the memory cgroup directory dir's limit leaves: limit less the working set (cgroup v2's
 * memory.max, memory.current less memory.stat's inactive_file; with v1 memory.limit_in_bytes,
 * memory.usage_in_bytes less total_inactive_file: page cache the kernel reclaims first, such as
 * the model file's, as kubelet counts it); UINT64_MAX without a limit (v2's "max", v1's figure
 * near 2^63) or without the files; 0 at or over it. */
uint64_t qe_cgroup_room(const char *dir, int v1);

#endif
