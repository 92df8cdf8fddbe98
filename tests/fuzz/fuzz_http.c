/* fuzz_http: libFuzzer harness for the HTTP request-head parser (scheduler/sched_http.h).
 * Input: one control byte, then the bytes a client would send. The whole stream is parsed as a
 * sequence of pipelined requests (each head, then its Content-Length body skipped); every answer
 * must be sane: a complete head lies inside the input and the head limit, names GET or HEAD and
 * a path starting with '/' inside the head (or the static "/"); a refusal carries one of the
 * documented statuses; "need more" only below the head limit. Then the first request is fed in
 * pieces, as socket reads would split it (the control byte seeds the sizes), each prefix copied
 * to a buffer of its own size so that ASan sees any read past it: every prefix answers "need
 * more" until one decides, and that answer must be the whole input's. Broken invariants trap.
 * Build and run: see tests/fuzz/meson.build. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "sched_http.h"

#define FUZZ_REQUIRE(e)                                                                            \
  do {                                                                                             \
    if (!(e)) __builtin_trap();                                                                    \
  } while (0)

/* Does r's path point into its head at buf (and not to the static "/")? */
static int in_head(const char *buf, const sh_request_t *r) {
  uintptr_t p = (uintptr_t)r->path, b = (uintptr_t)buf;
  return p >= b && p < b + r->head_len;
}

/* The answer rc/r of sh_parse_request over buf[0..n) is sane. */
static void check_answer(const char *buf, size_t n, int rc, const sh_request_t *r) {
  if (rc == SH_PARSE_MORE) {
    FUZZ_REQUIRE(n < SH_HEAD_MAX);
  } else if (rc == QE_EFORMAT) {
    int s = r->status;
    FUZZ_REQUIRE(s == 400 || s == 405 || s == 414 || s == 431 || s == 501 || s == 505);
  } else {
    FUZZ_REQUIRE(rc == SH_PARSE_DONE);
    FUZZ_REQUIRE(r->head_len > 0 && r->head_len <= n && r->head_len <= SH_HEAD_MAX);
    FUZZ_REQUIRE(buf[r->head_len - 1] == '\n');
    FUZZ_REQUIRE(r->method >= buf && r->method + r->method_len <= buf + r->head_len);
    FUZZ_REQUIRE(r->is_head ? (r->method_len == 4 && !memcmp(r->method, "HEAD", 4))
                            : (r->method_len == 3 && !memcmp(r->method, "GET", 3)));
    FUZZ_REQUIRE(r->path_len >= 1 && r->path_len <= SH_TARGET_MAX && r->path[0] == '/');
    FUZZ_REQUIRE(in_head(buf, r) ? r->path_len <= r->head_len - (size_t)(r->path - buf)
                                 : (r->path_len == 1 && !strcmp(r->path, "/")));
    FUZZ_REQUIRE(!memchr(r->path, '?', r->path_len) && !memchr(r->path, ' ', r->path_len));
    FUZZ_REQUIRE(r->version_minor == 0 || r->version_minor == 1);
    FUZZ_REQUIRE(r->keep_alive == 0 || r->keep_alive == 1);
    FUZZ_REQUIRE(r->content_length < 1000000000000000ull);
  }
}

/* Two answers, over buffers a and b holding the same bytes, are the same. */
static void check_same(const char *a, int ra, const sh_request_t *x, const char *b, int rb,
                       const sh_request_t *y) {
  FUZZ_REQUIRE(ra == rb);
  if (ra == QE_EFORMAT) FUZZ_REQUIRE(x->status == y->status);
  if (ra != SH_PARSE_DONE) return;
  FUZZ_REQUIRE(x->head_len == y->head_len && x->path_len == y->path_len);
  FUZZ_REQUIRE(x->is_head == y->is_head && x->version_minor == y->version_minor);
  FUZZ_REQUIRE(x->keep_alive == y->keep_alive && x->content_length == y->content_length);
  FUZZ_REQUIRE(x->method - a == y->method - b);
  if (in_head(a, x))
    FUZZ_REQUIRE(in_head(b, y) && x->path - a == y->path - b);
  else
    FUZZ_REQUIRE(!in_head(b, y));
}

static size_t next_chunk(uint32_t *st, size_t left) {
  *st = *st * 1103515245u + 12345u;
  uint32_t r = *st >> 8;
  size_t n = (r & 7) == 0 ? left : (r & 1) ? 1 + (r >> 4) % 7 : 1 + (r >> 4) % 2048;
  return n < left ? n : left;
}

/* Feeds the stream's first request in growing prefixes. */
static void check_pieces(const char *data, size_t size, int rc_all, const sh_request_t *all,
                         uint32_t st) {
  size_t k = 0;
  while (k < size) {
    sh_request_t r;
    char *p;
    int rc;
    k += next_chunk(&st, size - k);
    if (k > SH_HEAD_MAX + 1) k = size; /* past the head limit only the whole input is left */
    p = malloc(k);
    FUZZ_REQUIRE(p);
    memcpy(p, data, k);
    rc = sh_parse_request(p, k, &r);
    check_answer(p, k, rc, &r);
    if (rc != SH_PARSE_MORE) check_same(data, rc_all, all, p, rc, &r);
    free(p);
    if (rc != SH_PARSE_MORE) return;
  }
  FUZZ_REQUIRE(rc_all == SH_PARSE_MORE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *buf = (const char *)data + 1;
  sh_request_t first, r;
  size_t off = 0;
  int rc_first = 0;
  if (size < 1) return 0;
  size--;
  for (int i = 0; i < 64 && off <= size; i++) { /* pipelined requests */
    int rc = sh_parse_request(buf + off, size - off, &r);
    check_answer(buf + off, size - off, rc, &r);
    if (i == 0) rc_first = rc, first = r;
    if (rc != SH_PARSE_DONE || r.content_length > size - off - r.head_len) break;
    off += r.head_len + (size_t)r.content_length;
  }
  check_pieces(buf, size, rc_first, &first, data[0]);
  return 0;
}
