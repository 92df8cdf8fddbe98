/* sched_grpc: the scheduler's gRPC server glue over the gRPC C core (insecure credentials).
 *
 * The server runs its own completion-queue thread; every completion is handed to the owner's
 * libuv loop through a uv_async_t, and every callback below runs on that loop thread. Methods
 * are registered up front (their request message arrives with the call); calls to any other
 * method are answered UNIMPLEMENTED without involving the owner. Every method takes one request
 * message; a method is either unary or server-streaming.
 *
 * Life of a call: on_call hands it to the owner, who answers with sgrpc_send (streaming only,
 * one message at a time, each acknowledged by on_sent) and ends it with exactly one
 * sgrpc_finish, now or later. If the client goes away first (cancel, disconnect, deadline),
 * on_cancel says so once; the owner must still call sgrpc_finish. The call is freed inside the
 * glue once gRPC is done with it; the handle is invalid after sgrpc_finish.
 *
 * Flow control: a send completes only when gRPC has taken the message (HTTP/2 windows), so a
 * client that stops reading stalls its own call only, never the others.
 *
 * Threading: every function here must be called on the thread running the loop given to
 * sgrpc_server_create (the glue starts gRPC batches from there; grpc_call_start_batch is
 * thread-safe). Several servers on several loops are fine. */
#ifndef QE_SCHED_GRPC_H
#define QE_SCHED_GRPC_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct sgrpc_server sgrpc_server_t;
typedef struct sgrpc_call sgrpc_call_t;

/* One method: its full path ("/qevict.v1.Generation/Generate") and whether its response is
 * server-streaming (1) or a single message (0). The request is always one message. */
typedef struct {
  const char *path;
  int streaming;
} sgrpc_method_t;

/* The owner's callbacks, all called on the loop thread with ud. None may call
 * sgrpc_server_destroy. */
typedef struct {
  void *ud;
  /* A new call of methods[method] with its request bytes (valid during the callback only). The
   * handler owns the call until it calls sgrpc_finish (exactly once, now or later). Required. */
  void (*on_call)(void *ud, sgrpc_call_t *call, int method, const uint8_t *req, size_t n);
  /* The client cancelled, disconnected or its deadline passed before the handler finished the
   * call, or the server is being destroyed (then it is called from within sgrpc_server_destroy).
   * Called at most once, never after sgrpc_finish. The handler must still call sgrpc_finish
   * (its status is then not delivered); it may do so from this callback. May be NULL (the
   * handler then learns of it from sgrpc_send's QE_ECANCELED or on_sent ok=0). */
  void (*on_cancel)(void *ud, sgrpc_call_t *call);
  /* The last sgrpc_send completed: ok=1 sent (the next one may be sent), ok=0 the stream is
   * broken (on_cancel follows or already came). Never after sgrpc_finish, never during
   * sgrpc_server_destroy. Required when a method is streaming. */
  void (*on_sent)(void *ud, sgrpc_call_t *call, int ok);
  /* A call ended and is being freed: methods[method] (-1: an unregistered method) and the gRPC
   * code its client was sent; when it ended before its status went out, DEADLINE_EXCEEDED (its
   * deadline had passed when it closed, or was within 0.25 s: the server's copy of a deadline
   * runs a little behind the client's) or CANCELLED (the client cancelled or went away); INTERNAL
   * when the glue aborted it. Not called for a call without a request message that gRPC ended
   * itself (one over max_recv_msg: the client got RESOURCE_EXHAUSTED from gRPC), nor during
   * sgrpc_server_destroy. May be NULL. */
  void (*on_done)(void *ud, int method, int status);
} sgrpc_handlers_t;

/* Message size limits in bytes (0: SGRPC_DEFAULT_MAX_MSG; values above INT_MAX are clamped).
 * A request over max_recv_msg reaches its client as RESOURCE_EXHAUSTED and never the owner.
 * TLS: tls_cert_pem and tls_key_pem (PEM text of the certificate chain and its private key,
 * both or neither) make the port TLS-only; tls_client_ca_pem (with them, may be NULL) then
 * requires every client to present a certificate that this CA bundle verifies. */
typedef struct {
  size_t max_recv_msg, max_send_msg;
  const char *tls_cert_pem, *tls_key_pem, *tls_client_ca_pem;
} sgrpc_options_t;

#define SGRPC_DEFAULT_MAX_MSG ((size_t)64 << 20)

/* Creates and starts a server listening on addr ("127.0.0.1:0", "[::]:50051",
 * "unix:/path"), serving methods[0..n_methods) (paths copied) with the handlers h (copied).
 * opt may be NULL (defaults). Calls grpc_init (balanced by sgrpc_server_destroy). A port
 * already in use is an error (SO_REUSEPORT is off).
 * Returns 0 and *out, QE_EINVAL (bad arguments), QE_EIO (cannot bind addr), QE_ENOMEM or
 * QE_EBACKEND; on error nothing is left to free and the loop is untouched. */
int sgrpc_server_create(uv_loop_t *loop, const char *addr, const sgrpc_options_t *opt,
                        const sgrpc_method_t *methods, int n_methods, const sgrpc_handlers_t *h,
                        sgrpc_server_t **out);

/* The bound TCP port (the real one when port 0 was asked); 0 for a Unix-domain socket. */
int sgrpc_server_port(const sgrpc_server_t *s);

/* Shuts the server down, synchronously: stops accepting, cancels every call still open, and
 * blocks until the completion-queue thread has drained and been joined. Calls the owner still
 * holds get on_cancel from within this function (no on_call or on_sent any more); each call
 * is freed once finished (one the handler never finishes is freed anyway: every handle is
 * invalid when this returns). No callback runs after it returns. Then calls grpc_shutdown.
 * Must be called on the loop thread, not from a handler callback. The uv_async_t is closed
 * with uv_close and the last of the server's memory is freed by its close callback: the owner
 * must run the loop again (as for any libuv handle), e.g. until uv_run returns 0. NULL: no-op. */
void sgrpc_server_destroy(sgrpc_server_t *s);

/* Copies the value of request metadata key (e.g. "authorization", matched without regard to
 * case) into buf, NUL-terminated and truncated to n bytes in all. Returns 0 if present,
 * QE_ERANGE if present and truncated (buf holds its first n - 1 bytes), QE_ENOTFOUND if absent,
 * QE_EINVAL if n is 0. */
int sgrpc_call_metadata(const sgrpc_call_t *c, const char *key, char *buf, size_t n);

/* Streaming calls only: sends one message (bytes copied; the first send also carries the
 * initial metadata). One send at a time: on_sent says when the next may go.
 * Returns 0; QE_EINVAL if the method is unary, the call finished or a send is still pending
 * (detail "send pending"); QE_ERANGE over max_send_msg; QE_ECANCELED once the call is known
 * to be cancelled (on_cancel came or is coming); QE_ENOMEM; QE_EBACKEND if gRPC refused. */
int sgrpc_send(sgrpc_call_t *c, const uint8_t *msg, size_t n);

/* Ends the call with a gRPC status (a grpc_status_code, 0..16) and message (may be NULL).
 * Unary calls: with status 0 the response msg[0..n) is sent (msg may be NULL when n is 0: an
 * empty message); with an error status msg is ignored. Streaming calls: msg, when n > 0, is
 * sent as one last message before the status. A streaming call may be finished while a send
 * is pending: the status then follows once that send completes (its on_sent is not
 * delivered). After cancellation the status is not delivered but the call is still released.
 * The handle must not be used after this call, whatever it returns.
 * Finishing a call twice is a bug (asserted).
 * Returns 0; QE_EINVAL for a status outside 0..16 (the call ends with INTERNAL instead);
 * QE_ERANGE for msg over max_send_msg or QE_EBACKEND if gRPC refused the batch (the call is
 * cancelled instead). */
int sgrpc_finish(sgrpc_call_t *c, int status, const char *message, const uint8_t *msg, size_t n);

/* The owner's per-call pointer (NULL until set). The glue never frees it. */
void sgrpc_call_set_data(sgrpc_call_t *c, void *data);
void *sgrpc_call_data(const sgrpc_call_t *c);

/* The method index given to on_call. */
int sgrpc_call_method(const sgrpc_call_t *c);

/* The peer's address ("ipv4:127.0.0.1:53412") for logs; valid while the call is. Never NULL. */
const char *sgrpc_call_peer(const sgrpc_call_t *c);

#endif
