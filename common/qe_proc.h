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

/* The system's MemAvailable (/proc/meminfo: memory that can be given to a new workload without
 * swapping). QE_EIO when it cannot be read. */
int qe_mem_available(uint64_t *bytes);

#endif
