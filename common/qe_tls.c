/* qe_tls: TLS sessions over memory BIOs (see qe_tls.h). */
#include "qe_tls.h"

#include <arpa/inet.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qe_status.h"

/* KeyUpdates a peer may send in a minute: each costs a key derivation and an answer, so a flood
 * of them is work without end for a loop serving other connections; a real peer sends none or
 * a few. Past this the session fails. */
#define QE_TLS_KEY_UPDATES_PER_MIN 16

struct qe_tls_ctx {
  SSL_CTX *ssl;
  int is_server;
  const char *who; /* static */
};

struct qe_tls {
  SSL *ssl;
  BIO *in, *out; /* ciphertext from the peer; ciphertext for the peer (owned by ssl) */
  const char *who;
  long ku_minute; /* the minute (monotonic) the KeyUpdates below were counted in */
  int ku_count, ku_flood;
};

/* Counts the peer's KeyUpdate messages (handshake type 24) once the handshake is done. */
static void on_msg(int write_p, int version, int type, const void *buf, size_t len, SSL *ssl,
                   void *arg) {
  qe_tls_t *t = arg;
  struct timespec ts;
  (void)version, (void)ssl;
  if (write_p || type != 22 || len < 1 || ((const unsigned char *)buf)[0] != 24) return;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  if (ts.tv_sec / 60 != t->ku_minute) t->ku_minute = ts.tv_sec / 60, t->ku_count = 0;
  if (++t->ku_count > QE_TLS_KEY_UPDATES_PER_MIN) t->ku_flood = 1;
}

/* OpenSSL's earliest queued error as one line (the queue cleared). */
static const char *ssl_reason(char *buf, size_t n) {
  unsigned long e = ERR_get_error();
  const char *r = e ? ERR_reason_error_string(e) : NULL;
  if (!e)
    snprintf(buf, n, "unknown error");
  else if (r)
    snprintf(buf, n, "%s", r);
  else
    ERR_error_string_n(e, buf, n);
  ERR_clear_error();
  return buf;
}

static int ctx_fail(qe_tls_ctx_t *c, const char *what, const char *file) {
  char r[256];
  int rc = qe_errf(QE_EINVAL, "%s: %s %s: %s", c->who, what, file, ssl_reason(r, sizeof r));
  qe_tls_ctx_destroy(c);
  return rc;
}

static int ctx_new(const char *who, int server, qe_tls_ctx_t **out) {
  qe_tls_ctx_t *c = calloc(1, sizeof *c);
  *out = NULL;
  if (!c || !(c->ssl = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()))) {
    free(c);
    return qe_errf(QE_ENOMEM, "%s: no memory for a context", who);
  }
  c->who = who;
  c->is_server = server;
  SSL_CTX_set_min_proto_version(c->ssl, TLS1_2_VERSION);
  SSL_CTX_set_options(c->ssl, SSL_OP_NO_RENEGOTIATION); /* (TLS 1.2 peers may not ask) */
  SSL_CTX_set_mode(c->ssl, SSL_MODE_RELEASE_BUFFERS);
  *out = c;
  return 0;
}

/* OpenSSL's passphrase callback: none is given (OpenSSL's own prompted on the terminal and
 * waited there); *ud notes that one was asked for. */
static int no_passphrase(char *buf, int size, int rwflag, void *ud) {
  (void)buf, (void)size, (void)rwflag;
  if (ud) *(int *)ud = 1;
  return 0;
}

/* The certificate chain and its key (both given). */
static int use_cert(qe_tls_ctx_t *c, const char *cert, const char *key) {
  int asked = 0;
  if (SSL_CTX_use_certificate_chain_file(c->ssl, cert) != 1)
    return ctx_fail(c, "cannot use the certificate chain", cert);
  SSL_CTX_set_default_passwd_cb(c->ssl, no_passphrase);
  SSL_CTX_set_default_passwd_cb_userdata(c->ssl, &asked);
  const int used = SSL_CTX_use_PrivateKey_file(c->ssl, key, SSL_FILETYPE_PEM) == 1;
  SSL_CTX_set_default_passwd_cb_userdata(c->ssl, NULL); /* (the callback stays: no prompt) */
  if (!used && asked)
    return ctx_fail(c,
                    "the private key is encrypted (no passphrase is taken: decrypt it, e.g. "
                    "openssl pkey -in KEY -out PLAIN.key):",
                    key);
  if (!used) return ctx_fail(c, "cannot use the private key", key);
  if (SSL_CTX_check_private_key(c->ssl) != 1)
    return ctx_fail(c, "the private key does not match the certificate in", cert);
  return 0;
}

int qe_tls_check_pair(const char *cert_pem, const char *key_pem, const char *cert_path,
                      const char *key_path) {
  char r[256];
  int asked = 0, rc = 0;
  BIO *cb = BIO_new_mem_buf(cert_pem, -1), *kb = BIO_new_mem_buf(key_pem, -1);
  X509 *x = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  EVP_PKEY *k = kb ? PEM_read_bio_PrivateKey(kb, NULL, no_passphrase, &asked) : NULL;
  if (!x)
    rc = qe_errf(QE_EINVAL, "%s: no certificate that parses: %s", cert_path,
                 ssl_reason(r, sizeof r));
  else if (!k)
    rc = qe_errf(QE_EINVAL, "%s: %s: %s", key_path,
                 asked ? "the private key is encrypted (no passphrase is taken: decrypt it, e.g. "
                         "openssl pkey -in KEY -out PLAIN.key)"
                       : "no private key that parses",
                 ssl_reason(r, sizeof r));
  else if (X509_check_private_key(x, k) != 1)
    rc = qe_errf(QE_EINVAL, "%s: the private key does not match the certificate in %s: %s",
                 key_path, cert_path, ssl_reason(r, sizeof r));
  X509_free(x), EVP_PKEY_free(k), BIO_free(cb), BIO_free(kb);
  ERR_clear_error();
  return rc;
}

/* Peers must present a certificate that the bundle at ca verifies. */
static int verify_peers(qe_tls_ctx_t *c, const char *ca) {
  if (SSL_CTX_load_verify_locations(c->ssl, ca, NULL) != 1)
    return ctx_fail(c, "cannot load the CA bundle", ca);
  if (c->is_server) {
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca);
    if (!names) return ctx_fail(c, "cannot load the CA bundle", ca);
    SSL_CTX_set_client_CA_list(c->ssl, names); /* (told to clients; the context owns it) */
  }
  SSL_CTX_set_verify(c->ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  return 0;
}

int qe_tls_server_ctx(const char *who, const char *cert, const char *key, const char *client_ca,
                      qe_tls_ctx_t **out) {
  qe_tls_ctx_t *c;
  int rc = ctx_new(who, 1, &c);
  if (rc || (rc = use_cert(c, cert, key))) return rc;
  /* (a session id context: without one, resuming a session under client verification fails) */
  static const unsigned char sid[] = "qevict";
  SSL_CTX_set_session_id_context(c->ssl, sid, sizeof sid - 1);
  if (client_ca && (rc = verify_peers(c, client_ca))) return rc;
  *out = c;
  return 0;
}

int qe_tls_client_ctx(const char *who, const char *ca, const char *cert, const char *key,
                      qe_tls_ctx_t **out) {
  qe_tls_ctx_t *c;
  int rc = ctx_new(who, 0, &c);
  if (rc) return rc;
  if (!ca || !cert != !key) {
    qe_tls_ctx_destroy(c);
    return qe_errf(QE_EINVAL, "%s: a client needs a CA bundle, and a key with a certificate", who);
  }
  if ((cert && (rc = use_cert(c, cert, key))) || (rc = verify_peers(c, ca))) return rc;
  *out = c;
  return 0;
}

void qe_tls_ctx_destroy(qe_tls_ctx_t *c) {
  if (!c) return;
  SSL_CTX_free(c->ssl);
  free(c);
}

/* The name the server's certificate must carry: an IP literal (IPv6 with or without its
 * brackets) or a DNS name (also sent as SNI). */
static int expect_name(SSL *ssl, const char *name) {
  unsigned char ip[16];
  char bare[64];
  size_t n = strlen(name);
  if (n > 2 && n < sizeof bare + 2 && name[0] == '[' && name[n - 1] == ']') {
    memcpy(bare, name + 1, n - 2), bare[n - 2] = '\0';
    name = bare;
  }
  if (inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1)
    return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1;
  return SSL_set1_host(ssl, name) == 1 && SSL_set_tlsext_host_name(ssl, name) == 1;
}

qe_tls_t *qe_tls_new(qe_tls_ctx_t *ctx, const char *server_name) {
  qe_tls_t *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->who = ctx->who;
  t->ssl = SSL_new(ctx->ssl);
  t->in = BIO_new(BIO_s_mem()), t->out = BIO_new(BIO_s_mem());
  if (!t->ssl || !t->in || !t->out) {
    SSL_free(t->ssl), BIO_free(t->in), BIO_free(t->out);
    free(t);
    return NULL;
  }
  SSL_set_bio(t->ssl, t->in, t->out); /* ssl owns both now */
  SSL_set_msg_callback(t->ssl, on_msg);
  SSL_set_msg_callback_arg(t->ssl, t);
  if (ctx->is_server) {
    SSL_set_accept_state(t->ssl);
  } else {
    SSL_set_connect_state(t->ssl);
    if (server_name && !expect_name(t->ssl, server_name)) {
      qe_tls_free(t);
      return NULL;
    }
  }
  return t;
}

void qe_tls_free(qe_tls_t *t) {
  if (!t) return;
  SSL_free(t->ssl);
  free(t);
}

int qe_tls_feed(qe_tls_t *t, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    int k = BIO_write(t->in, p, n > 1 << 30 ? 1 << 30 : (int)n);
    if (k <= 0) return qe_errf(QE_ENOMEM, "%s: no memory for received bytes", t->who);
    p += k, n -= (size_t)k;
  }
  return 0;
}

/* After a failed call: 0 when it only wants more bytes, QE_TLS_EOF, or QE_EIO with the reason
 * (OpenSSL's, and the certificate check's when that failed). */
static int session_error(qe_tls_t *t, int ret) {
  int e = SSL_get_error(t->ssl, ret);
  char r[200];
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return ERR_clear_error(), 0;
  if (e == SSL_ERROR_ZERO_RETURN) return ERR_clear_error(), QE_TLS_EOF;
  long v = SSL_get_verify_result(t->ssl);
  ssl_reason(r, sizeof r);
  if (v != X509_V_OK)
    return qe_errf(QE_EIO, "%s: %s (%s)", t->who, r, X509_verify_cert_error_string(v));
  return qe_errf(QE_EIO, "%s: the session failed: %s", t->who, r);
}

int qe_tls_handshake(qe_tls_t *t) {
  ERR_clear_error(); /* (SSL_get_error reads the queue: nothing older may be in it) */
  int ret = SSL_do_handshake(t->ssl);
  if (ret == 1) return 0;
  int rc = session_error(t, ret);
  return rc == QE_TLS_EOF ? qe_errf(QE_EIO, "%s: closed during the handshake", t->who) : rc;
}

int qe_tls_established(const qe_tls_t *t) { return SSL_is_init_finished(t->ssl); }

int qe_tls_read(qe_tls_t *t, void *out, size_t cap, size_t *got) {
  *got = 0;
  ERR_clear_error();
  while (*got < cap) {
    size_t k = 0;
    int ret = SSL_read_ex(t->ssl, (char *)out + *got, cap - *got, &k);
    if (t->ku_flood)
      return qe_errf(QE_EIO, "%s: more than %d key updates a minute from the peer", t->who,
                     QE_TLS_KEY_UPDATES_PER_MIN);
    if (ret == 1) {
      *got += k;
      continue;
    }
    int rc = session_error(t, ret);
    return rc == QE_TLS_EOF && *got ? 0 : rc;
  }
  return 0;
}

int qe_tls_write(qe_tls_t *t, const void *buf, size_t n) {
  size_t k = 0;
  if (!n) return 0;
  ERR_clear_error();
  if (SSL_write_ex(t->ssl, buf, n, &k) == 1 && k == n) return 0;
  ERR_clear_error();
  return qe_errf(QE_EIO, "%s: cannot encrypt %zu bytes", t->who, n);
}

void qe_tls_close_notify(qe_tls_t *t) {
  SSL_shutdown(t->ssl);
  ERR_clear_error();
}

size_t qe_tls_pending(const qe_tls_t *t) { return BIO_ctrl_pending(t->out); }

size_t qe_tls_take_into(qe_tls_t *t, void *buf, size_t cap) {
  if (cap > INT_MAX) cap = INT_MAX;
  int k = cap ? BIO_read(t->out, buf, (int)cap) : 0;
  return k > 0 ? (size_t)k : 0;
}

int qe_tls_take(qe_tls_t *t, char **buf, size_t *n) {
  *buf = NULL, *n = 0;
  size_t pend = qe_tls_pending(t);
  if (!pend) return 0;
  if (pend > INT_MAX) pend = INT_MAX; /* (the rest on the next take) */
  char *b = malloc(pend);
  if (!b) return qe_errf(QE_ENOMEM, "%s: no memory for %zu bytes to send", t->who, pend);
  if (!(*n = qe_tls_take_into(t, b, pend))) {
    free(b);
    return 0;
  }
  *buf = b;
  return 0;
}

const char *qe_tls_peer_cn(const qe_tls_t *t, char *buf, size_t n) {
  X509 *x = SSL_get0_peer_certificate(t->ssl);
  if (n) buf[0] = 0;
  if (x && n) X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, buf, (int)n);
  return buf;
}
