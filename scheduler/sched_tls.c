/* sched_tls: server-side TLS over memory BIOs (see sched_tls.h). */
#include "sched_tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <limits.h>
#include <stdlib.h>

#include "qe_status.h"

struct sh_tls_ctx {
  SSL_CTX *ssl;
};

struct sh_tls {
  SSL *ssl;
  BIO *in, *out; /* ciphertext from the peer; ciphertext for the peer (owned by ssl) */
};

/* OpenSSL's earliest queued error as one line (the queue cleared). */
static const char *ssl_reason(char *buf, size_t n) {
  unsigned long e = ERR_get_error();
  if (!e) return "unknown error";
  ERR_error_string_n(e, buf, n);
  ERR_clear_error();
  return buf;
}

static int ctx_fail(sh_tls_ctx_t *c, const char *what, const char *file) {
  char r[256];
  int rc = qe_errf(QE_EINVAL, "metrics tls: %s %s: %s", what, file, ssl_reason(r, sizeof r));
  sh_tls_ctx_destroy(c);
  return rc;
}

int sh_tls_ctx_create(const char *cert, const char *key, const char *client_ca,
                      sh_tls_ctx_t **out) {
  *out = NULL;
  sh_tls_ctx_t *c = calloc(1, sizeof *c);
  if (!c || !(c->ssl = SSL_CTX_new(TLS_server_method()))) {
    free(c);
    return qe_errf(QE_ENOMEM, "metrics tls: no memory for a context");
  }
  SSL_CTX_set_min_proto_version(c->ssl, TLS1_2_VERSION);
  SSL_CTX_set_options(c->ssl, SSL_OP_NO_RENEGOTIATION); /* (TLS 1.2 clients may not ask) */
  SSL_CTX_set_mode(c->ssl, SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_use_certificate_chain_file(c->ssl, cert) != 1)
    return ctx_fail(c, "cannot use the certificate chain", cert);
  if (SSL_CTX_use_PrivateKey_file(c->ssl, key, SSL_FILETYPE_PEM) != 1)
    return ctx_fail(c, "cannot use the private key", key);
  if (SSL_CTX_check_private_key(c->ssl) != 1)
    return ctx_fail(c, "the private key does not match the certificate in", cert);
  /* (a session id context: without one, resuming a session under client verification fails) */
  static const unsigned char sid[] = "qevict-metrics";
  SSL_CTX_set_session_id_context(c->ssl, sid, sizeof sid - 1);
  if (client_ca) {
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(client_ca);
    if (!names || SSL_CTX_load_verify_locations(c->ssl, client_ca, NULL) != 1) {
      sk_X509_NAME_pop_free(names, X509_NAME_free);
      return ctx_fail(c, "cannot load the client CA bundle", client_ca);
    }
    SSL_CTX_set_client_CA_list(c->ssl, names); /* (told to clients; the context owns it) */
    SSL_CTX_set_verify(c->ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  }
  *out = c;
  return 0;
}

void sh_tls_ctx_destroy(sh_tls_ctx_t *c) {
  if (!c) return;
  SSL_CTX_free(c->ssl);
  free(c);
}

sh_tls_t *sh_tls_new(sh_tls_ctx_t *ctx) {
  sh_tls_t *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->ssl = SSL_new(ctx->ssl);
  t->in = BIO_new(BIO_s_mem()), t->out = BIO_new(BIO_s_mem());
  if (!t->ssl || !t->in || !t->out) {
    SSL_free(t->ssl), BIO_free(t->in), BIO_free(t->out);
    free(t);
    return NULL;
  }
  SSL_set_bio(t->ssl, t->in, t->out); /* ssl owns both now */
  SSL_set_accept_state(t->ssl);
  return t;
}

void sh_tls_free(sh_tls_t *t) {
  if (!t) return;
  SSL_free(t->ssl);
  free(t);
}

int sh_tls_feed(sh_tls_t *t, const char *buf, size_t n) {
  while (n) {
    int k = BIO_write(t->in, buf, n > 1 << 30 ? 1 << 30 : (int)n);
    if (k <= 0) return qe_errf(QE_ENOMEM, "metrics tls: no memory for received bytes");
    buf += k, n -= (size_t)k;
  }
  return 0;
}

int sh_tls_read(sh_tls_t *t, char *out, size_t cap, size_t *got) {
  *got = 0;
  ERR_clear_error(); /* (SSL_get_error reads the queue: nothing older may be in it) */
  while (*got < cap) {
    size_t k = 0;
    if (SSL_read_ex(t->ssl, out + *got, cap - *got, &k) == 1) {
      *got += k;
      continue;
    }
    int e = SSL_get_error(t->ssl, 0);
    ERR_clear_error();
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return 0;
    if (e == SSL_ERROR_ZERO_RETURN) return *got ? 0 : SH_TLS_EOF;
    return qe_errf(QE_EIO, "metrics tls: the session failed (OpenSSL error %d)", e);
  }
  return 0;
}

int sh_tls_write(sh_tls_t *t, const void *buf, size_t n) {
  size_t k = 0;
  if (!n) return 0;
  if (SSL_write_ex(t->ssl, buf, n, &k) == 1 && k == n) return 0;
  ERR_clear_error();
  return qe_errf(QE_EIO, "metrics tls: cannot encrypt a response");
}

void sh_tls_close_notify(sh_tls_t *t) {
  SSL_shutdown(t->ssl);
  ERR_clear_error();
}

int sh_tls_take(sh_tls_t *t, char **buf, size_t *n) {
  *buf = NULL, *n = 0;
  size_t pend = BIO_ctrl_pending(t->out);
  if (!pend) return 0;
  if (pend > INT_MAX) pend = INT_MAX; /* (the rest on the next take) */
  char *b = malloc(pend);
  if (!b) return qe_errf(QE_ENOMEM, "metrics tls: no memory for %zu bytes to send", pend);
  int k = BIO_read(t->out, b, (int)pend);
  if (k <= 0) {
    free(b);
    return 0;
  }
  *buf = b, *n = (size_t)k;
  return 0;
}
