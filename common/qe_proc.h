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
} qe_proc_stats_t;

/* Fills *out from /proc/self; QE_EIO naming the file when one cannot be read or parsed. */
int qe_proc_stats(qe_proc_stats_t *out);

#endif
