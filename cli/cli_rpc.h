/* cli_rpc: the client side of the qevict commands that talk to qevict-sched (submit, watch,
 * cancel, tenant, requests, drain): a small blocking gRPC client over the gRPC C core (a
 * channel, unary calls, server-streaming calls with a callback per message, a Bearer key,
 * deadlines, 64 MiB messages, SIGINT cancels the call), the options every client command
 * shares (--server, --key, --key-file, --admin-key-file, --timeout, --json), their argument
 * loop, and helpers for sizes, budgets, policies and JSON output of protobuf-c messages.
 * Built only with serving (gRPC and protobuf-c present). Calls may run concurrently from
 * several threads, on one channel or several (`qevict bench serve`); a SIGINT cancels every
 * call in flight. The option and value helpers are for one thread. */
#ifndef QE_CLI_RPC_H
#define QE_CLI_RPC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h" /* (cli_fmt_bytes) */
#include "qevict.pb-c.h"

/* Largest request or response message (a 32K-token prompt and its events fit easily). */
#define CLI_RPC_MAX_MSG (64 << 20)
_Static_assert(CLI_PROMPT_FILE_MAX + (1 << 16) <= CLI_RPC_MAX_MSG, "a prompt file fits a request");
/* Deadline of a unary call when --timeout is not given (connecting included). */
#define CLI_RPC_UNARY_TIMEOUT_S 10.0

/* Exit codes of the client commands (documented in their --help). */
enum { CLI_EXIT_RPC = 1, CLI_EXIT_USAGE = 2, CLI_EXIT_AUTH = 3, CLI_EXIT_INTERRUPTED = 130 };

typedef struct cli_rpc cli_rpc_t;

/* How a call ended: a gRPC status code (grpc_status_code: 0 OK, 14 UNAVAILABLE, ...) and the
 * server's (or the client library's) message, truncated to fit. */
typedef struct {
  int code;
  char message[1024];
} cli_rpc_status_t;

/* Called once per message of a server-streaming call; msg (len bytes, the serialized message)
 * is valid during the call only. Return 0 to go on, or non-zero to cancel the call: that
 * value is then what cli_rpc_stream returns. */
typedef int (*cli_rpc_msg_fn)(void *ud, const uint8_t *msg, size_t len);

/* TLS for a channel: PEM text (NULL where not given). ca_pem: the roots that verify the server
 * (NULL: gRPC's default roots, $GRPC_DEFAULT_SSL_ROOTS_FILE_PATH first); cert_pem and key_pem:
 * a client certificate (both or neither); server_name: the name the server's certificate must
 * carry (NULL: the target's host). */
typedef struct {
  const char *ca_pem, *cert_pem, *key_pem, *server_name;
} cli_rpc_tls_t;

/* Opens a channel to target ("127.0.0.1:50051", "host:port", "unix:/path"), plaintext or (tls
 * not NULL) TLS, with
 * 64 MiB send/receive limits; key (may be NULL or "") is sent on every call as
 * `authorization: Bearer <key>` (printable ASCII; QE_EINVAL otherwise). Connecting happens
 * lazily on the first call. *out is owned by the caller (cli_rpc_close). 0 or QE_E*. */
int cli_rpc_connect(const char *target, const char *key, const cli_rpc_tls_t *tls, cli_rpc_t **out);
/* Closes the channel and releases the library; NULL is ignored. */
void cli_rpc_close(cli_rpc_t *c);

/* A unary call: method is the full path ("/qevict.v1.Admin/Drain"), req the serialized
 * request; timeout_s > 0 is the deadline (<= 0: none). On success *resp (malloc'd, caller
 * frees) holds the serialized response. Returns 0 (status OK), QE_ECOMM (the call ended with a
 * non-OK status: st says which), QE_ECANCELED (interrupted by SIGINT: the call was cancelled),
 * QE_EFORMAT (OK without a response) or QE_ENOMEM. st is always filled. */
int cli_rpc_unary(cli_rpc_t *c, const char *method, const void *req, size_t req_len,
                  double timeout_s, uint8_t **resp, size_t *resp_len, cli_rpc_status_t *st);
/* A server-streaming call: sends req, then calls fn for each message until the status.
 * timeout_s as for cli_rpc_unary (streams usually pass 0). SIGINT cancels the call cleanly.
 * Returns 0 (status OK), QE_ECOMM (non-OK status, in st), QE_ECANCELED (SIGINT), fn's non-zero
 * return (the call was cancelled), or QE_ENOMEM. st is always filled. */
int cli_rpc_stream(cli_rpc_t *c, const char *method, const void *req, size_t req_len,
                   double timeout_s, cli_rpc_msg_fn fn, void *ud, cli_rpc_status_t *st);
/* cli_rpc_unary over protobuf-c messages: packs req, unpacks the response as resp_desc into
 * *resp (caller frees with protobuf_c_message_free_unpacked(*resp, NULL)). Same returns, plus
 * QE_EFORMAT when the response does not decode. */
int cli_rpc_call(cli_rpc_t *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, double timeout_s,
                 ProtobufCMessage **resp, cli_rpc_status_t *st);
/* SIGINT handling across many calls (a load test): between hold and release a SIGINT cancels
 * the calls in flight and makes cli_rpc_interrupted() 1, also while no call is (calls then
 * started are cancelled at once). Release returns whether a SIGINT came. */
void cli_rpc_sigint_hold(void);
int cli_rpc_sigint_release(void);
int cli_rpc_interrupted(void);

/* Writes m as one JSON object: every field under its proto name, proto3 scalars always (also
 * at their default), unset messages and oneof members left out, enums by value name, 64-bit
 * integers as numbers. */
void cli_rpc_json(FILE *f, const ProtobufCMessage *m);

/* ---- options shared by the client commands ---- */

typedef struct {
  int admin;            /* the command calls Admin: the key is the admin key */
  const char *server;   /* --server (default $QEVICT_SERVER or 127.0.0.1:50051) */
  const char *key;      /* --key KEY */
  const char *key_file; /* --key-file FILE, or --admin-key-file FILE with admin */
  double timeout_s;     /* --timeout seconds; 0: the default (unary 10 s, streams none) */
  int json;             /* --json */
  int tls;              /* --tls, or implied by the TLS files below or $QEVICT_TLS_CA */
  const char *tls_ca, *tls_cert, *tls_key, *tls_server_name; /* --tls-ca FILE ... */
} cli_client_opts_t;

/* Help text of the shared options, for the end of a command's --help. */
#define CLI_CLIENT_HELP_SERVER                                                                     \
  "connection:\n"                                                                                  \
  "  --server ADDR     the scheduler: HOST:PORT or unix:/PATH (default $QEVICT_SERVER, else\n"     \
  "                    127.0.0.1:50051)\n"
#define CLI_CLIENT_HELP_TAIL                                                                       \
  "  --tls             TLS (the server's certificate checked against gRPC's default roots)\n"      \
  "  --tls-ca FILE     TLS, the server's certificate checked against this PEM CA bundle\n"         \
  "                    (default $QEVICT_TLS_CA)\n"                                                 \
  "  --tls-cert FILE --tls-key FILE   a client certificate (servers run with --tls-client-ca)\n"   \
  "  --tls-server-name NAME   the name the server's certificate must carry (default: ADDR's\n"     \
  "                    host)\n"                                                                    \
  "  --timeout S       deadline of the call in seconds (default: 10 for single calls, none for\n"  \
  "                    streams)\n"                                                                 \
  "  --json            print one JSON object instead of text\n"                                    \
  "exit status: 0 done; 1 an error from the server or the connection (printed as\n"                \
  "  STATUS_NAME: message), or a request that failed; 2 bad usage; 3 UNAUTHENTICATED or\n"         \
  "  PERMISSION_DENIED (a wrong or missing key); 130 interrupted (Ctrl-C).\n"
#define CLI_CLIENT_HELP                                                                            \
  CLI_CLIENT_HELP_SERVER                                                                           \
  "  --key KEY         tenant API key (default $QEVICT_API_KEY)\n"                                 \
  "  --key-file FILE   read the tenant API key from FILE\n" CLI_CLIENT_HELP_TAIL
#define CLI_ADMIN_HELP                                                                             \
  CLI_CLIENT_HELP_SERVER                                                                           \
  "  --admin-key-file FILE  read the admin key from FILE (default "                                \
  "$QEVICT_ADMIN_KEY)\n" CLI_CLIENT_HELP_TAIL
void cli_client_init(cli_client_opts_t *o, int admin);
/* One shared option: 0 handled, 1 not a shared option, 2 bad value. Flags without a value
 * (--json) come with v == NULL. */
int cli_client_parse(cli_client_opts_t *o, const char *flag, const char *v);
/* Resolves the key (--key, --key-file / --admin-key-file, else $QEVICT_API_KEY /
 * $QEVICT_ADMIN_KEY) and connects. Returns 0, or an exit code after printing the error
 * (2: unreadable or malformed key file; 1: anything else). */
int cli_client_open(const char *cmd, const cli_client_opts_t *o, cli_rpc_t **out);
/* Deadline for a unary call under these options. */
double cli_client_unary_timeout(const cli_client_opts_t *o);
/* Reports a failed call and returns its exit code: QE_ECOMM prints
 * "qevict <cmd>: <STATUS_NAME>: <message>" (exit 3 for UNAUTHENTICATED / PERMISSION_DENIED,
 * 1 otherwise); QE_ECANCELED prints "qevict <cmd>: interrupted" (130); others print the
 * qe_strerror and detail (1). */
int cli_client_fail(const char *cmd, int rc, const cli_rpc_status_t *st);

/* Option callback of cli_args_parse: 0 handled, 1 unknown option, 2 bad value (a message is
 * then printed naming the option and value), 3 a usage error the callback printed itself
 * (cli_usage_error). */
typedef int (*cli_opt_fn)(void *ud, const char *flag, const char *v);
enum { CLI_OPT_OK = 0, CLI_OPT_UNKNOWN = 1, CLI_OPT_BAD = 2, CLI_OPT_PRINTED = 3 };

/* The argument loop of a client command (argv[0] is the command): "--help"/"-h" prints help
 * to stdout; "--flag=value" and "--flag value" both work; flags named in no_value (a
 * NULL-terminated list) take none (fn gets v == NULL unless written "--flag=value"); other
 * words are positionals, at most max_pos of them, stored in pos. Returns 0, -1 (help printed:
 * exit 0) or 2 (usage error printed). */
int cli_args_parse(const char *cmd, int argc, char **argv, const char *help,
                   const char *const *no_value, cli_opt_fn fn, void *ud, const char **pos,
                   int max_pos, int *n_pos);

/* ---- values ---- */

/* A budget: a value with a '.' or <= 1 is a fraction of FullKV in (0, 1]; otherwise bytes
 * (cli_parse_bytes). Fills b (kind and value). 0 or -1. */
int cli_parse_budget(const char *s, Qevict__V1__Budget *b);
/* A budget as text: "0.25 of FullKV", "1.50 GiB", or "-" when unset. Returns buf. */
const char *cli_fmt_budget(char *buf, size_t size, const Qevict__V1__Budget *b);
/* Lower-case name of an enum value without its enum's prefix ("REQUEST_STATE_RUNNING" ->
 * "running") into buf; "?" when unknown. Returns buf. */
const char *cli_enum_short(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t size);

#endif
