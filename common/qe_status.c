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

/* gRPC status codes by number: upper- and lower-case names */
static const char *const qe__grpc[][2] = {{"OK", "ok"},
                                          {"CANCELLED", "cancelled"},
                                          {"UNKNOWN", "unknown"},
                                          {"INVALID_ARGUMENT", "invalid_argument"},
                                          {"DEADLINE_EXCEEDED", "deadline_exceeded"},
                                          {"NOT_FOUND", "not_found"},
                                          {"ALREADY_EXISTS", "already_exists"},
                                          {"PERMISSION_DENIED", "permission_denied"},
                                          {"RESOURCE_EXHAUSTED", "resource_exhausted"},
                                          {"FAILED_PRECONDITION", "failed_precondition"},
                                          {"ABORTED", "aborted"},
                                          {"OUT_OF_RANGE", "out_of_range"},
                                          {"UNIMPLEMENTED", "unimplemented"},
                                          {"INTERNAL", "internal"},
                                          {"UNAVAILABLE", "unavailable"},
                                          {"DATA_LOSS", "data_loss"},
                                          {"UNAUTHENTICATED", "unauthenticated"}};

const char *qe_grpc_code_name(int code, int lower) {
  int n = (int)(sizeof qe__grpc / sizeof qe__grpc[0]);
  if (code < 0 || code >= n) return lower ? "unknown_status" : "UNKNOWN_STATUS";
  return qe__grpc[code][lower != 0];
}
