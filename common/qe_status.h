/* qe_status: the one error convention of qevict.
 * Functions return int: 0 (QE_OK) or a negative QE_E* code from the X-macro table below.
 * qe_errf() records a human-readable detail line for the calling thread (thread-local), so
 * the CLI and the servers can print one clear error line: "<strerror>: <detail>". */
#ifndef QE_STATUS_H
#define QE_STATUS_H

#define QE_STATUS_TABLE(X)                                                                         \
  X(QE_OK, 0, "ok")                                                                                \
  X(QE_EINVAL, -1, "invalid argument")                                                             \
  X(QE_ENOMEM, -2, "out of memory")                                                                \
  X(QE_EIO, -3, "i/o error")                                                                       \
  X(QE_EFORMAT, -4, "malformed input")                                                             \
  X(QE_EUNSUPPORTED, -5, "unsupported")                                                            \
  X(QE_ERANGE, -6, "out of range")                                                                 \
  X(QE_ENOTFOUND, -7, "not found")                                                                 \
  X(QE_ENOSPC, -8, "out of pool memory")                                                           \
  X(QE_ECOMM, -9, "communication error")                                                           \
  X(QE_ECANCELED, -10, "canceled")                                                                 \
  X(QE_EBACKEND, -11, "backend error")                                                             \
  X(QE_EBUSY, -12, "busy")

enum {
#define QE__ENUM(name, code, text) name = code,
  QE_STATUS_TABLE(QE__ENUM)
#undef QE__ENUM
};

/* Static string for a status code; never NULL ("unknown error" for codes not in the table). */
const char *qe_strerror(int code);

/* Records a detail message for this thread and returns code (use as `return qe_errf(...)`). */
int qe_errf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last detail message set on this thread ("" if none). Valid until the next qe_errf. */
const char *qe_errmsg(void);

/* Clears this thread's detail message. */
void qe_errclear(void);

/* The name of gRPC status code `code` (0..16) in a style: 0 "INVALID_ARGUMENT" as the CLI
 * prints it, 1 "invalid_argument" as qevict's own metrics label it, 2 "InvalidArgument" as the
 * grpc_server_* metrics of gRPC's Prometheus interceptors do (Go's names: "Canceled");
 * "UNKNOWN_STATUS", "unknown_status" or "UnknownStatus" for codes outside the range. */
const char *qe_grpc_code_name(int code, int style);

#endif
