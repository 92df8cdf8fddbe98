/* qe_log: leveled stderr logging and assertion failures. */
#include "qe_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int qe__level = -1;

static int qe__env_level(void) {
  const char *e = getenv("QEVICT_LOG");
  if (!e) return QE_LOG_WARN;
  if (!strcmp(e, "error")) return QE_LOG_ERROR;
  if (!strcmp(e, "info")) return QE_LOG_INFO;
  if (!strcmp(e, "debug")) return QE_LOG_DEBUG;
  return QE_LOG_WARN;
}

int qe_log_level(void) {
  if (qe__level < 0) qe__level = qe__env_level();
  return qe__level;
}

void qe_log_set_level(int level) { qe__level = level; }

void qe_log(int level, const char *fmt, ...) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  if (level > qe_log_level()) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "qevict %s: %s\n", names[level & 3], line);
}

void qe__assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "qevict: assertion failed: %s (%s:%d)\n", expr, file, line);
  abort();
}
