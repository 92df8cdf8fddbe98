/* sched_tls: server-side TLS over memory buffers (OpenSSL), for sched_http's connections. It
 * does no I/O: the caller feeds the ciphertext it read (sh_tls_feed), takes the plaintext out
 * (sh_tls_read), puts plaintext in (sh_tls_write, sh_tls_close_notify) and sends whatever
 * ciphertext is pending (sh_tls_take). The handshake runs inside sh_tls_read as bytes arrive.
 * TLS 1.2 and 1.3 only.
 *
 * Threading: a context may be shared by connections of one thread; a connection is used by one
 * thread. */
#ifndef QE_SCHED_TLS_H
#define QE_SCHED_TLS_H
#include <stddef.h>

typedef struct sh_tls_ctx sh_tls_ctx_t;
typedef struct sh_tls sh_tls_t;

/* A server context from PEM files: cert (the certificate chain, leaf first), key (its private
 * key) and, when client_ca is not NULL, a CA bundle that every client must present a
 * certificate verified by (mutual TLS). QE_EINVAL with a message naming the file and OpenSSL's
 * reason when a file cannot be read or the key does not match the certificate; QE_ENOMEM. */
int sh_tls_ctx_create(const char *cert, const char *key, const char *client_ca, sh_tls_ctx_t **out);
void sh_tls_ctx_destroy(sh_tls_ctx_t *ctx);

/* A connection's TLS state (server side); NULL when out of memory. */
sh_tls_t *sh_tls_new(sh_tls_ctx_t *ctx);
void sh_tls_free(sh_tls_t *t);

/* Ciphertext received from the peer. 0, or QE_ENOMEM. */
int sh_tls_feed(sh_tls_t *t, const char *buf, size_t n);

enum { SH_TLS_EOF = 1 }; /* sh_tls_read: the peer closed the session (close_notify) */
/* Decrypts up to cap bytes into out (*got of them; 0 when the handshake or a record needs more
 * ciphertext). 0, SH_TLS_EOF, or QE_EIO when the session failed (a bad record, a failed
 * handshake, a client certificate refused): the connection must be closed, after sending what
 * sh_tls_take gives (an alert). */
int sh_tls_read(sh_tls_t *t, char *out, size_t cap, size_t *got);

/* Encrypts n bytes of plaintext (after the handshake: call it once sh_tls_read has given
 * plaintext). 0, or QE_EIO. */
int sh_tls_write(sh_tls_t *t, const void *buf, size_t n);

/* Queues the close_notify alert (the end of this side's data). */
void sh_tls_close_notify(sh_tls_t *t);

/* The ciphertext waiting to be sent, as a malloc'd buffer the caller frees (*buf NULL, *n 0
 * when none). 0, or QE_ENOMEM. */
int sh_tls_take(sh_tls_t *t, char **buf, size_t *n);
#endif
