/* qe_sha256: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), plus a constant-time compare.
 * Used to store API keys hashed and to sign tokens. No global state: every function is
 * thread-safe on its own context. Digests are 32 bytes, big-endian as the standard prints them. */
#ifndef QE_SHA256_H
#define QE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define QE_SHA256_LEN   32 /* digest bytes */
#define QE_SHA256_BLOCK 64 /* block bytes */

/* Streaming context; the caller owns the storage (init, update..., final). */
typedef struct qe_sha256 {
  uint32_t h[8];
  uint64_t n_bytes;             /* message bytes so far */
  uint8_t buf[QE_SHA256_BLOCK]; /* partial block */
  size_t n_buf;                 /* bytes in buf */
} qe_sha256_t;

void qe_sha256_init(qe_sha256_t *c);
/* Appends n bytes (data may be NULL when n is 0). */
void qe_sha256_update(qe_sha256_t *c, const void *data, size_t n);
/* Writes the digest to out and wipes the context. */
void qe_sha256_final(qe_sha256_t *c, uint8_t out[QE_SHA256_LEN]);
/* One-shot digest of n bytes. */
void qe_sha256(const void *data, size_t n, uint8_t out[QE_SHA256_LEN]);

/* HMAC-SHA256 of msg under key (any key length; keys over one block are hashed first). */
void qe_hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
                    uint8_t out[QE_SHA256_LEN]);

/* 1 if the n bytes of a and b are equal, else 0; the time taken depends only on n. */
int qe_ct_equal(const void *a, const void *b, size_t n);

/* Overwrites n bytes with zeros in a way the compiler cannot drop (for secrets). */
void qe_secure_zero(void *p, size_t n);

#endif
