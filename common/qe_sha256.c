/* qe_sha256: SHA-256 after FIPS 180-4 section 6.2 (one 64-round compression per 512-bit block,
 * message schedule of 64 words), HMAC after RFC 2104, and constant-time helpers. */
#include "qe_sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static uint32_t load_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void store_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

/* Message schedule W[0..63] of one block (FIPS 180-4 6.2.2 step 1). */
static void schedule(const uint8_t *block, uint32_t w[64]) {
  for (int t = 0; t < 16; t++) w[t] = load_be32(block + 4 * t);
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
}

static void compress(uint32_t h[8], const uint8_t *block) {
  uint32_t w[64], v[8];
  schedule(block, w);
  memcpy(v, h, sizeof v);
  for (int t = 0; t < 64; t++) {
    uint32_t S1 = rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25);
    uint32_t ch = (v[4] & v[5]) ^ (~v[4] & v[6]);
    uint32_t t1 = v[7] + S1 + ch + K[t] + w[t];
    uint32_t S0 = rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22);
    uint32_t maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
    memmove(v + 1, v, 7 * sizeof v[0]);
    v[4] += t1;
    v[0] = t1 + S0 + maj;
  }
  for (int i = 0; i < 8; i++) h[i] += v[i];
  qe_secure_zero(w, sizeof w);
  qe_secure_zero(v, sizeof v);
}

void qe_sha256_init(qe_sha256_t *c) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->h, h0, sizeof h0);
  c->n_bytes = 0;
  c->n_buf = 0;
}

void qe_sha256_update(qe_sha256_t *c, const void *data, size_t n) {
  const uint8_t *p = data;
  c->n_bytes += n;
  if (c->n_buf) {
    size_t take = QE_SHA256_BLOCK - c->n_buf < n ? QE_SHA256_BLOCK - c->n_buf : n;
    memcpy(c->buf + c->n_buf, p, take);
    c->n_buf += take, p += take, n -= take;
    if (c->n_buf < QE_SHA256_BLOCK) return;
    compress(c->h, c->buf);
    c->n_buf = 0;
  }
  for (; n >= QE_SHA256_BLOCK; p += QE_SHA256_BLOCK, n -= QE_SHA256_BLOCK) compress(c->h, p);
  if (n) memcpy(c->buf, p, n);
  c->n_buf = n;
}

/* Padding (5.1.1): 0x80, zeros to 56 mod 64, then the bit length as a 64-bit big-endian. */
void qe_sha256_final(qe_sha256_t *c, uint8_t out[QE_SHA256_LEN]) {
  uint64_t bits = c->n_bytes * 8;
  c->buf[c->n_buf++] = 0x80;
  if (c->n_buf > 56) {
    memset(c->buf + c->n_buf, 0, QE_SHA256_BLOCK - c->n_buf);
    compress(c->h, c->buf);
    c->n_buf = 0;
  }
  memset(c->buf + c->n_buf, 0, 56 - c->n_buf);
  store_be32(c->buf + 56, (uint32_t)(bits >> 32));
  store_be32(c->buf + 60, (uint32_t)bits);
  compress(c->h, c->buf);
  for (int i = 0; i < 8; i++) store_be32(out + 4 * i, c->h[i]);
  qe_secure_zero(c, sizeof *c);
}

void qe_sha256(const void *data, size_t n, uint8_t out[QE_SHA256_LEN]) {
  qe_sha256_t c;
  qe_sha256_init(&c);
  qe_sha256_update(&c, data, n);
  qe_sha256_final(&c, out);
}

/* HMAC(K, m) = H((K0 ^ opad) || H((K0 ^ ipad) || m)), K0 the key padded (or hashed) to a block. */
void qe_hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
                    uint8_t out[QE_SHA256_LEN]) {
  uint8_t k0[QE_SHA256_BLOCK] = {0}, pad[QE_SHA256_BLOCK], inner[QE_SHA256_LEN];
  qe_sha256_t c;
  if (key_len > QE_SHA256_BLOCK)
    qe_sha256(key, key_len, k0);
  else if (key_len)
    memcpy(k0, key, key_len);
  for (int i = 0; i < QE_SHA256_BLOCK; i++) pad[i] = k0[i] ^ 0x36;
  qe_sha256_init(&c);
  qe_sha256_update(&c, pad, sizeof pad);
  qe_sha256_update(&c, msg, msg_len);
  qe_sha256_final(&c, inner);
  for (int i = 0; i < QE_SHA256_BLOCK; i++) pad[i] = k0[i] ^ 0x5c;
  qe_sha256_init(&c);
  qe_sha256_update(&c, pad, sizeof pad);
  qe_sha256_update(&c, inner, sizeof inner);
  qe_sha256_final(&c, out);
  qe_secure_zero(k0, sizeof k0);
  qe_secure_zero(pad, sizeof pad);
  qe_secure_zero(inner, sizeof inner);
}

int qe_ct_equal(const void *a, const void *b, size_t n) {
  const volatile uint8_t *x = a, *y = b;
  uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= x[i] ^ y[i];
  return (int)(1 & ((d - 1u) >> 8)); /* 1 iff d == 0, without a branch on d */
}

void qe_secure_zero(void *p, size_t n) {
  volatile uint8_t *v = p;
  for (size_t i = 0; i < n; i++) v[i] = 0;
}
