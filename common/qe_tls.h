/* qe_tls: TLS sessions over memory buffers (OpenSSL), for event-loop servers and clients that
 * do their own I/O: the metrics endpoint (sched_http) and the scheduler-worker link (tr_conn).
 * A session does no I/O: the caller feeds the ciphertext it read (qe_tls_feed), takes the
 * plaintext out (qe_tls_read), puts plaintext in (qe_tls_write, qe_tls_close_notify) and sends
 * whatever ciphertext is pending (qe_tls_take). The handshake runs inside qe_tls_read as bytes
 * arrive (a client starts it with qe_tls_handshake). TLS 1.2 and 1.3 only; no renegotiation.
 *
 * Errors name the context's `who` (a static string: "metrics tls", "worker tls") and OpenSSL's
 * reason.
 *
 * Threading: a context may be shared by the sessions of one thread; a session is used by one
 * thread. A context must outlive its sessions. */
#ifndef QE_TLS_H
#define QE_TLS_H
#include <stddef.h>

typedef struct qe_tls_ctx qe_tls_ctx_t;
typedef struct qe_tls qe_tls_t;

/* A server context from PEM files: cert (the certificate chain, leaf first), key (its private
 * key) and, when client_ca is not NULL, a CA bundle that every client must present a
 * certificate verified by (mutual TLS). QE_EINVAL with a message naming the file and OpenSSL's
 * reason when a file cannot be used or the key does not match the certificate; QE_ENOMEM. */
int qe_tls_server_ctx(const char *who, const char *cert, const char *key, const char *client_ca,
                      qe_tls_ctx_t **out);

/* A client context: ca (required) is the CA bundle the server's certificate must chain to;
 * cert and key (both or neither) a client certificate to present. Errors as above. */
int qe_tls_client_ctx(const char *who, const char *ca, const char *cert, const char *key,
                      qe_tls_ctx_t **out);

void qe_tls_ctx_destroy(qe_tls_ctx_t *ctx);

/* Checks PEM texts cert_pem (a chain, leaf first) and key_pem, read from cert_path and key_path
 * (for the messages), for a key that is the leaf's: for the gRPC library's TLS, whose own
 * refusal names neither. 0, or QE_EINVAL naming the files (a mismatch, a key or certificate that
 * does not parse, a passphrase-protected key). */
int qe_tls_check_pair(const char *cert_pem, const char *key_pem, const char *cert_path,
                      const char *key_path);

/* A session of ctx's side. Client side: server_name, when not NULL, is the name the server's
 * certificate must carry (an IPv4/IPv6 literal is matched against its IP addresses, anything
 * else against its DNS names, and sent as SNI); NULL checks the chain only. NULL when out of
 * memory. */
qe_tls_t *qe_tls_new(qe_tls_ctx_t *ctx, const char *server_name);
void qe_tls_free(qe_tls_t *t);

/* Ciphertext received from the peer. 0, or QE_ENOMEM. */
int qe_tls_feed(qe_tls_t *t, const void *buf, size_t n);

/* Client side: starts (or continues) the handshake; its first flight is then pending for
 * qe_tls_take. 0, or QE_EIO as qe_tls_read. */
int qe_tls_handshake(qe_tls_t *t);
/* 1 once the handshake is complete. */
int qe_tls_established(const qe_tls_t *t);

enum { QE_TLS_EOF = 1 }; /* qe_tls_read: the peer closed the session (close_notify) */
/* Decrypts up to cap bytes into out (*got of them; 0 when the handshake or a record needs more
 * ciphertext). 0, QE_TLS_EOF, or QE_EIO with a detail (a bad record, a failed handshake, a
 * certificate refused): the connection must then be closed, after sending what qe_tls_take
 * gives (an alert). */
int qe_tls_read(qe_tls_t *t, void *out, size_t cap, size_t *got);

/* Encrypts n bytes of plaintext (once established). 0, or QE_EIO. */
int qe_tls_write(qe_tls_t *t, const void *buf, size_t n);

/* Queues the close_notify alert (the end of this side's data). */
void qe_tls_close_notify(qe_tls_t *t);

/* Bytes of ciphertext waiting to be sent. */
size_t qe_tls_pending(const qe_tls_t *t);
/* Moves up to cap bytes of them into buf; returns how many. */
size_t qe_tls_take_into(qe_tls_t *t, void *buf, size_t cap);
/* All of them as a malloc'd buffer the caller frees (*buf NULL, *n 0 when none). 0, or
 * QE_ENOMEM. */
int qe_tls_take(qe_tls_t *t, char **buf, size_t *n);

/* The peer certificate's subject common name into buf (truncated to n; "" when the peer sent
 * none or it has no CN). Returns buf. */
const char *qe_tls_peer_cn(const qe_tls_t *t, char *buf, size_t n);
#endif
