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

/* gRPC status codes by number: upper-case, lower-case and Go's names (codes.Code's String) */
static const char *const qe__grpc[][3] = {
    {"OK", "ok", "OK"},
    {"CANCELLED", "cancelled", "Canceled"},
    {"UNKNOWN", "unknown", "Unknown"},
    {"INVALID_ARGUMENT", "invalid_argument", "InvalidArgument"},
    {"DEADLINE_EXCEEDED", "deadline_exceeded", "DeadlineExceeded"},
    {"NOT_FOUND", "not_found", "NotFound"},
    {"ALREADY_EXISTS", "already_exists", "AlreadyExists"},
    {"PERMISSION_DENIED", "permission_denied", "PermissionDenied"},
    {"RESOURCE_EXHAUSTED", "resource_exhausted", "ResourceExhausted"},
    {"FAILED_PRECONDITION", "failed_precondition", "FailedPrecondition"},
    {"ABORTED", "aborted", "Aborted"},
    {"OUT_OF_RANGE", "out_of_range", "OutOfRange"},
    {"UNIMPLEMENTED", "unimplemented", "Unimplemented"},
    {"INTERNAL", "internal", "Internal"},
    {"UNAVAILABLE", "unavailable", "Unavailable"},
    {"DATA_LOSS", "data_loss", "DataLoss"},
    {"UNAUTHENTICATED", "unauthenticated", "Unauthenticated"}};

const char *qe_grpc_code_name(int code, int style) {
  static const char *const unknown[3] = {"UNKNOWN_STATUS", "unknown_status", "UnknownStatus"};
  const int n = (int)(sizeof qe__grpc / sizeof qe__grpc[0]),
            k = style >= 0 && style <= 2 ? style : 0;
  return code < 0 || code >= n ? unknown[k] : qe__grpc[code][k];
}
