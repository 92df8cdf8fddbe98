/* test_sha256: SHA-256 against the FIPS 180-4 / NIST CAVP example vectors (empty, "abc", the
 * 448- and 896-bit messages, one million 'a'), padding boundaries in one-shot and streamed
 * form, HMAC-SHA256 against RFC 4231, and the constant-time comparison. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_sha256.h"
#include "test_util.h"

static void hex(const uint8_t *d, char out[2 * QE_SHA256_LEN + 1]) {
  for (int i = 0; i < QE_SHA256_LEN; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static int digest_is(const uint8_t *d, const char *want) {
  char got[2 * QE_SHA256_LEN + 1];
  hex(d, got);
  if (!strcmp(got, want)) return 1;
  fprintf(stderr, "  got  %s\n  want %s\n", got, want);
  return 0;
}

/* The digest of msg one-shot, byte by byte, and in uneven chunks must all equal want. */
static int sha_is(const void *msg, size_t n, const char *want) {
  uint8_t d[QE_SHA256_LEN];
  qe_sha256(msg, n, d);
  int ok = digest_is(d, want);
  qe_sha256_t c;
  qe_sha256_init(&c);
  for (size_t i = 0; i < n; i++) qe_sha256_update(&c, (const uint8_t *)msg + i, 1);
  qe_sha256_final(&c, d);
  ok &= digest_is(d, want);
  qe_sha256_init(&c);
  for (size_t i = 0, step = 1; i < n; i += step, step = step * 3 % 97 + 1)
    qe_sha256_update(&c, (const uint8_t *)msg + i, step < n - i ? step : n - i);
  qe_sha256_final(&c, d);
  return ok & digest_is(d, want);
}

static void test_nist(void) {
  CHECK(sha_is("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
  CHECK(sha_is("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(strlen(m448) * 8 == 448);
  CHECK(sha_is(m448, strlen(m448),
               "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
  const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklm"
                     "nopqklmnopqrlmnopqrsmnopqrstnopqrstu";
  CHECK(strlen(m896) * 8 == 896);
  CHECK(sha_is(m896, strlen(m896),
               "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"));
  size_t n = 1000000;
  char *a = malloc(n);
  CHECK(a != NULL);
  if (!a) return;
  memset(a, 'a', n);
  CHECK(sha_is(a, n, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
  free(a);
}

/* Lengths around the 55/56/64-byte padding edges (expected values from an independent
 * implementation), message bytes (7i+1) mod 256. */
static void test_padding_edges(void) {
  static const struct {
    size_t n;
    const char *want;
  } v[] = {
      {55, "16fa57a0a3423a715d594516339f36189d6b5f93754a9714fef202616a9fabfe"},
      {56, "c37b44e5f1b18554b36966f4f8e08bfbf3164c4b6c10374d12d89850892073c5"},
      {57, "12b234922502022f755ab8550a3d4e202ad39c81d961a4f59ec39d5fd83d15a7"},
      {63, "bbba992d2c85af960fb2987a1fd05e0aa82a3db3c740dd8982a9e273b75e36a3"},
      {64, "66bd4633ed6f71c4ecfa4763bf7ba1c8ec7612de9aa6c0578a7b675207c71e0b"},
      {65, "9f7dc47107b750a1f3d35db5d9547f24ef40da5b731b9540d4f43710a154f6c9"},
      {119, "a3ed307b730fa77c07531300c6e4a282330011d4d4caf6bb7b63ae05950f4b66"},
      {120, "8e3b15d9fea7472655aa069620b7f8c2e55ee1499f763200a7515fe826e99d20"},
      {128, "e462c130fef8c97e34f7dc3ff3ad2f8b3533ab849af21c10531552a2852387a4"},
  };
  uint8_t m[128];
  for (int i = 0; i < 128; i++) m[i] = (uint8_t)(i * 7 + 1);
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) CHECK(sha_is(m, v[i].n, v[i].want));
}

static int hmac_is(const void *k, size_t kn, const void *m, size_t mn, const char *want) {
  uint8_t d[QE_SHA256_LEN];
  qe_hmac_sha256(k, kn, m, mn, d);
  return digest_is(d, want);
}

/* RFC 4231 test cases 1, 2, 3, 6, 7 (6 and 7: keys longer than a block), and a key of exactly
 * one block. */
static void test_hmac(void) {
  uint8_t k[131], m[50];
  memset(k, 0x0b, 20);
  CHECK(hmac_is(k, 20, "Hi There", 8,
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"));
  CHECK(hmac_is("Jefe", 4, "what do ya want for nothing?", 28,
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"));
  memset(k, 0xaa, sizeof k);
  memset(m, 0xdd, sizeof m);
  CHECK(hmac_is(k, 20, m, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"));
  const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  CHECK(hmac_is(k, 131, t6, strlen(t6),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"));
  const char *t7 = "This is a test using a larger than block-size key and a larger than "
                   "block-size data. The key needs to be hashed before being used by the HMAC "
                   "algorithm.";
  CHECK(hmac_is(k, 131, t7, strlen(t7),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"));
  memset(k, 'k', 64);
  CHECK(hmac_is(k, 64, "", 0, "83026a325aaee70e36cfe607536aa1054104ad1077c36134810d4ccded1ccd3b"));
}

static void test_ct_equal(void) {
  uint8_t a[32], b[32];
  for (int i = 0; i < 32; i++) a[i] = b[i] = (uint8_t)(i * 37);
  CHECK(qe_ct_equal(a, b, 32) == 1);
  CHECK(qe_ct_equal(a, b, 0) == 1);
  for (int i = 0; i < 32; i++)
    for (int bit = 0; bit < 8; bit++) {
      b[i] ^= (uint8_t)(1u << bit);
      CHECK(qe_ct_equal(a, b, 32) == 0);
      b[i] ^= (uint8_t)(1u << bit);
    }
  CHECK(qe_ct_equal(a, b, 32) == 1);
  qe_secure_zero(a, sizeof a);
  for (int i = 0; i < 32; i++) CHECK(a[i] == 0);
}

int main(void) {
  test_nist();
  test_padding_edges();
  test_hmac();
  test_ct_equal();
  return tu_done("sha256");
}
