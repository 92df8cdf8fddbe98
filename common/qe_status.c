/* qe_status: status-code strings and the per-thread error detail line. */
#include "qe_status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char qe__msg[512];

const char *qe_strerror(int code) {
  switch (code) {
#define QE__CASE(name, c, text)                                                                    \
  case c:                                                                                          \
    return text;
    QE_STATUS_TABLE(QE__CASE)
#undef QE__CASE
  default:
    return "unknown error";
  }
}

int qe_errf(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(qe__msg, sizeof qe__msg, fmt, ap);
  va_end(ap);
  return code;
}

const char *qe_errmsg(void) { return qe__msg; }

void qe_errclear(void) { qe__msg[0] = '\0'; }
