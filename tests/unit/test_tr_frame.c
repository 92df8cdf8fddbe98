/* test_tr_frame: the transport's frame decoder without any I/O (transport/uv/tr_frame.h):
 * frames fed whole, byte by byte and in random chunks decode to the Envelopes sent; oversize
 * declared lengths fail before any allocation; truncated frames wait; garbage payloads,
 * payloads with no message and payloads that would decode to far more memory than their size
 * are refused; a failed decoder stays failed. Also the address syntax (tr_addr.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "test_util.h"
#include "tr_addr.h"
#include "tr_frame.h"

#define ENV_CASE(name) QEVICT__WORKER__V1__ENVELOPE__MSG_##name

typedef struct {
  uint8_t *data;
  size_t len, cap;
  int n_frames;
  size_t ends[64]; /* byte offset where each frame ends */
} stream_t;

static void stream_add(stream_t *s, const tr_env_t *m) {
  uint8_t *f;
  size_t n;
  CHECK_OK(tr_frame_encode(m, 0, &f, &n));
  if (s->len + n > s->cap) {
    s->cap = (s->len + n) * 2;
    s->data = realloc(s->data, s->cap);
  }
  memcpy(s->data + s->len, f, n);
  s->len += n;
  s->ends[s->n_frames++] = s->len;
  free(f);
}

/* ---- sample envelopes --------------------------------------------------------------------- */

static uint32_t ids[5000];
static Qevict__Worker__V1__Hello hello = QEVICT__WORKER__V1__HELLO__INIT;
static Qevict__Worker__V1__TokenBatch batch = QEVICT__WORKER__V1__TOKEN_BATCH__INIT;
static Qevict__Worker__V1__Error err = QEVICT__WORKER__V1__ERROR__INIT;
static Qevict__Worker__V1__Heartbeat hb = QEVICT__WORKER__V1__HEARTBEAT__INIT;
static Qevict__Worker__V1__MemorySummary sum = QEVICT__WORKER__V1__MEMORY_SUMMARY__INIT;
static Qevict__Worker__V1__RequestMemory rm = QEVICT__WORKER__V1__REQUEST_MEMORY__INIT;
static Qevict__Worker__V1__RequestMemory *rms[3] = {&rm, &rm, &rm};
static Qevict__Worker__V1__MemoryReport rep = QEVICT__WORKER__V1__MEMORY_REPORT__INIT;
static Qevict__Worker__V1__StartRequest start = QEVICT__WORKER__V1__START_REQUEST__INIT;
static Qevict__Worker__V1__Policy pol = QEVICT__WORKER__V1__POLICY__INIT;
static Qevict__Worker__V1__Sampling samp = QEVICT__WORKER__V1__SAMPLING__INIT;

static void sample_messages(stream_t *s) {
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  for (int i = 0; i < 5000; i++) ids[i] = (uint32_t)(i * 7919u % 151936u);
  hello.protocol_version = TR_PROTOCOL_VERSION;
  hello.model_fingerprint = "sha256:0123456789abcdef";
  hello.rank = 1, hello.tp_size = 2, hello.pool_bytes = 80ull << 30, hello.device = "cpu";
  e.msg_case = ENV_CASE(HELLO), e.hello = &hello;
  stream_add(s, &e);
  batch.request_id = 42, batch.offset = 17, batch.n_token_ids = 5000, batch.token_ids = ids;
  e.msg_case = ENV_CASE(TOKEN_BATCH), e.token_batch = &batch;
  stream_add(s, &e);
  hb.seq = 3;
  e.msg_case = ENV_CASE(HEARTBEAT), e.heartbeat = &hb; /* an empty-ish message: 4 bytes */
  stream_add(s, &e);
  err.code = QEVICT__WORKER__V1__ERROR_CODE__ERROR_CODE_REQUEST, err.message = "p\xc3\xa9 failed";
  e.msg_case = ENV_CASE(ERROR), e.error = &err;
  stream_add(s, &e);
  sum.policy = "qevict", sum.budget_bytes = 1 << 20, sum.windows_int2 = 12, sum.promotions = 3;
  rm.request_id = 9, rm.memory = &sum;
  rep.pool_bytes = 1ull << 34, rep.n_requests = 3, rep.requests = rms;
  e.msg_case = ENV_CASE(MEMORY_REPORT), e.memory_report = &rep;
  stream_add(s, &e);
  pol.name = "qevict", pol.q_opt_case = QEVICT__WORKER__V1__POLICY__Q_OPT_Q, pol.q = 0.f;
  samp.temperature = 0.7f, samp.seed = 1234;
  start.request_id = 43, start.n_prompt_ids = 100, start.prompt_ids = ids, start.policy = &pol;
  start.sampling = &samp, start.budget_bytes = 123456;
  e.msg_case = ENV_CASE(START_REQUEST), e.start_request = &start;
  stream_add(s, &e);
}

/* The payload of frame i, as sent. */
static const uint8_t *frame_payload(const stream_t *s, int i, size_t *len) {
  size_t begin = i ? s->ends[i - 1] : 0;
  *len = s->ends[i] - begin - TR_FRAME_HEADER;
  return s->data + begin + TR_FRAME_HEADER;
}

/* m re-packed equals frame i's payload (protobuf-c packs deterministically). */
static int same_as_sent(const stream_t *s, int i, const tr_env_t *m) {
  size_t len, n = tr_frame_payload_size(m);
  const uint8_t *want = frame_payload(s, i, &len);
  uint8_t *got = malloc(TR_FRAME_HEADER + n + 1);
  int ok = n == len && tr_frame_pack(m, got) == TR_FRAME_HEADER + n &&
           !memcmp(got + TR_FRAME_HEADER, want, len);
  free(got);
  return ok;
}

/* ---- feeding ------------------------------------------------------------------------------ */

/* Feeds s in chunks chosen by next_chunk; every frame must come out equal, in order. */
static void feed_chunks(const stream_t *s, size_t (*next_chunk)(uint64_t *), uint64_t seed) {
  tr_decoder_t d;
  size_t off = 0;
  int got = 0;
  tr_decoder_init(&d, 0);
  while (off < s->len) {
    size_t n = next_chunk(&seed), used;
    tr_env_t *m;
    if (n > s->len - off) n = s->len - off;
    const uint8_t *p = s->data + off;
    while (n) {
      int rc = tr_decoder_feed(&d, p, n, &used, &m);
      CHECK(rc == 0 || rc == 1);
      if (rc < 0) goto out;
      CHECK(used <= n);
      if (rc == 0) CHECK(used == n);
      p += used, n -= used, off += used;
      if (rc == 1) {
        CHECK(got < s->n_frames && off == s->ends[got]);
        CHECK(same_as_sent(s, got, m));
        got++;
        tr_env_free(m);
      }
    }
  }
  CHECK(tr_decoder_pending(&d) == 0);
out:
  CHECK(got == s->n_frames);
  tr_decoder_dispose(&d);
}

static size_t chunk_one(uint64_t *st) { return 1; }
static size_t chunk_all(uint64_t *st) { return (size_t)-1 / 2; }
static size_t chunk_random(uint64_t *st) {
  *st = *st * 6364136223846793005ull + 1442695040888963407ull;
  uint64_t r = *st >> 33;
  return (r & 3) == 0 ? 1 + (r >> 2) % 3 : 1 + (r >> 2) % 9000; /* tiny and large */
}

/* With QE_FRAME_SEEDS=DIR, writes fuzzer seeds (tests/fuzz/fuzz_frame.c: a control byte, then
 * the stream): each sample frame alone, all of them in one stream, and the handshake limit. */
static void write_seed(const char *dir, const char *name, uint8_t ctl, const uint8_t *p, size_t n) {
  char path[512];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!(f = fopen(path, "wb"))) {
    tu_fail(__FILE__, __LINE__, path);
    return;
  }
  fputc(ctl, f);
  fwrite(p, 1, n, f);
  fclose(f);
}

static void write_seeds(const stream_t *s) {
  const char *dir = getenv("QE_FRAME_SEEDS");
  char name[64];
  if (!dir) return;
  for (int i = 0; i < s->n_frames; i++) {
    size_t begin = i ? s->ends[i - 1] : 0;
    snprintf(name, sizeof name, "frame_%d", i);
    write_seed(dir, name, (uint8_t)(17 * i), s->data + begin, s->ends[i] - begin);
  }
  write_seed(dir, "stream", 0x05, s->data, s->len);
  write_seed(dir, "hello_limit", 0x80, s->data, s->ends[0]);
}

static void test_roundtrip(void) {
  stream_t s = {0};
  sample_messages(&s);
  write_seeds(&s);
  feed_chunks(&s, chunk_all, 0);
  feed_chunks(&s, chunk_one, 0);
  for (uint64_t seed = 1; seed <= 50; seed++) feed_chunks(&s, chunk_random, seed);
  free(s.data);
}

/* Many small frames in one buffer, fed once: the decoder hands them out one per call. */
static void test_many_in_one_chunk(void) {
  enum { N = 3000 };
  stream_t s = {0};
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  Qevict__Worker__V1__TokenBatch b = QEVICT__WORKER__V1__TOKEN_BATCH__INIT;
  uint8_t *all = NULL;
  size_t len = 0, off = 0, used;
  tr_decoder_t d;
  tr_env_t *m;
  int n = 0;
  e.msg_case = ENV_CASE(TOKEN_BATCH), e.token_batch = &b;
  for (int i = 0; i < N; i++) {
    s.n_frames = 0; /* reuse: only the bytes matter here */
    b.request_id = 1, b.offset = (uint64_t)i, b.n_token_ids = 1, b.token_ids = ids + i;
    stream_add(&s, &e);
  }
  all = s.data, len = s.len;
  tr_decoder_init(&d, 0);
  while (off < len) {
    int rc = tr_decoder_feed(&d, all + off, len - off, &used, &m);
    off += used;
    if (rc != 1) break;
    CHECK(m->token_batch->offset == (uint64_t)n && m->token_batch->token_ids[0] == ids[n]);
    n++;
    tr_env_free(m);
  }
  CHECK(n == N && off == len && tr_decoder_pending(&d) == 0);
  CHECK(d.cap == 0); /* whole frames in the input are decoded in place */
  tr_decoder_dispose(&d);
  free(all);
}

/* ---- hostile input ------------------------------------------------------------------------ */

static int feed_all(tr_decoder_t *d, const uint8_t *p, size_t n, tr_env_t **m) {
  size_t used;
  return tr_decoder_feed(d, p, n, &used, m);
}

static void test_oversize(void) {
  static const uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
  uint8_t hdr[4] = {0x01, 0x00, 0x01, 0x00}; /* 65537 */
  tr_decoder_t d;
  tr_env_t *m;
  size_t used;
  tr_decoder_init(&d, 0);
  CHECK(tr_decoder_feed(&d, huge, 3, &used, &m) == 0 && used == 3);
  CHECK(tr_decoder_feed(&d, huge + 3, 1, &used, &m) == QE_ERANGE);
  CHECK(d.buf == NULL && d.cap == 0); /* refused before allocating */
  CHECK(strstr(qe_errmsg(), "4294967295") && strstr(qe_errmsg(), "exceeds the maximum 16777216"));
  CHECK(feed_all(&d, hdr, 4, &m) == QE_ERANGE); /* stays failed */
  tr_decoder_dispose(&d);

  tr_decoder_init(&d, TR_FRAME_MAX_HELLO); /* the handshake limit */
  CHECK(feed_all(&d, hdr, 4, &m) == QE_ERANGE && d.cap == 0);
  tr_decoder_dispose(&d);
  tr_decoder_init(&d, 0);
  tr_decoder_set_max(&d, 65536);
  CHECK(feed_all(&d, hdr, 4, &m) == QE_ERANGE);
  tr_decoder_dispose(&d);
}

/* A frame that stops early waits for the rest, holding only what arrived. */
static void test_truncated(void) {
  stream_t s = {0};
  tr_decoder_t d;
  tr_env_t *m;
  size_t used;
  sample_messages(&s);
  tr_decoder_init(&d, 0);
  size_t cut = s.ends[1] - 1; /* all of frame 0, frame 1 but its last byte */
  CHECK(tr_decoder_feed(&d, s.data, cut, &used, &m) == 1 && used == s.ends[0]);
  tr_env_free(m);
  CHECK(tr_decoder_feed(&d, s.data + used, cut - used, &used, &m) == 0 && !m);
  CHECK(tr_decoder_pending(&d) == cut - s.ends[0]);
  CHECK(d.cap <= s.ends[1] - s.ends[0]); /* never more than the declared length */
  CHECK(tr_decoder_feed(&d, s.data + cut, 1, &used, &m) == 1 && used == 1);
  CHECK(same_as_sent(&s, 1, m));
  tr_env_free(m);
  /* a header alone, then nothing */
  CHECK(tr_decoder_feed(&d, s.data + s.ends[1], 2, &used, &m) == 0);
  CHECK(tr_decoder_pending(&d) == 2);
  tr_decoder_dispose(&d);
  free(s.data);
}

/* A payload of n bytes behind a correct header. */
static int feed_payload(const uint8_t *p, uint32_t n) {
  uint8_t *f = malloc(4 + n + 1);
  tr_decoder_t d;
  tr_env_t *m = NULL;
  size_t used;
  int rc;
  f[0] = (uint8_t)n, f[1] = (uint8_t)(n >> 8), f[2] = (uint8_t)(n >> 16), f[3] = (uint8_t)(n >> 24);
  if (n) memcpy(f + 4, p, n);
  tr_decoder_init(&d, 0);
  rc = tr_decoder_feed(&d, f, 4 + n, &used, &m);
  if (rc == 1) tr_env_free(m);
  if (rc < 0) CHECK(tr_decoder_feed(&d, f, 4 + n, &used, &m) == rc); /* stays failed */
  tr_decoder_dispose(&d);
  free(f);
  return rc;
}

static void test_garbage(void) {
  static const uint8_t bad_wire[] = {0x0f, 0x01};               /* wire type 7 */
  static const uint8_t long_len[] = {0x0a, 0x7f, 0x08, 0x01};   /* hello: 127 bytes, 2 there */
  static const uint8_t bad_varint[] = {0x1a, 0x02, 0x08, 0xff}; /* heartbeat.seq cut short */
  static const uint8_t unknown[] = {0xa0, 0x06, 0x01};          /* field 100 only */
  static const uint8_t hb_ok[] = {0x1a, 0x02, 0x08, 0x05};      /* heartbeat seq 5 */
  /* memory_report { requests { memory { field 99: 1 } } }: unknown deep inside */
  static const uint8_t nested_unknown[] = {0x42, 0x07, 0x62, 0x05, 0x1a, 0x03, 0x98, 0x06, 0x01};
  static const uint8_t tag0[] = {0x1a, 0x05, 0x08, 0x01, 0x80, 0x00, 0x00}; /* bad, see fuzz */
  uint64_t st = 99;
  CHECK(feed_payload(hb_ok, sizeof hb_ok) == 1);
  CHECK(feed_payload(bad_wire, sizeof bad_wire) == QE_EFORMAT);
  CHECK(strstr(qe_errmsg(), "not a valid Envelope") != NULL);
  CHECK(feed_payload(long_len, sizeof long_len) == QE_EFORMAT);
  CHECK(feed_payload(bad_varint, sizeof bad_varint) == QE_EFORMAT);
  CHECK(feed_payload(unknown, sizeof unknown) == QE_EFORMAT);
  CHECK(strstr(qe_errmsg(), "no known message") != NULL || strstr(qe_errmsg(), "unknown field"));
  CHECK(feed_payload(nested_unknown, sizeof nested_unknown) == QE_EFORMAT);
  CHECK(strstr(qe_errmsg(), "unknown field 99 in qevict.worker.v1.MemorySummary") != NULL);
  CHECK(feed_payload(tag0, sizeof tag0) == QE_EFORMAT); /* field 0 spelled 0x80 0x00 */
  CHECK(feed_payload(NULL, 0) == QE_EFORMAT);           /* empty Envelope */
  for (int i = 0; i < 2000; i++) { /* random bytes: any outcome but a crash or a leak */
    uint8_t buf[64];
    uint32_t n = (uint32_t)(chunk_random(&st) % 64);
    for (uint32_t k = 0; k < n; k++) buf[k] = (uint8_t)(chunk_random(&st) * 31);
    int rc = feed_payload(buf, n);
    CHECK(rc == 1 || rc == QE_EFORMAT);
  }
}

/* 2-byte empty sub-messages that each cost a struct: refused for the memory, not parsed. */
static void test_amplification(void) {
  enum { N = 100000 };
  uint8_t *p = malloc(6 + 2 * N);
  size_t inner = 2 * N, k = 0;
  p[k++] = 0x42; /* memory_report (field 8, length-delimited), varint length follows */
  while (inner >= 0x80) p[k++] = (uint8_t)(inner | 0x80), inner >>= 7;
  p[k++] = (uint8_t)inner;
  for (int i = 0; i < N; i++) p[k++] = 0x62, p[k++] = 0x00; /* requests (field 12): empty */
  CHECK(feed_payload(p, (uint32_t)k) == QE_EFORMAT);
  CHECK(strstr(qe_errmsg(), "decodes to more than") != NULL);
  free(p);
}

static void test_encode_limits(void) {
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  Qevict__Worker__V1__TokenBatch b = QEVICT__WORKER__V1__TOKEN_BATCH__INIT;
  uint8_t *f;
  size_t n;
  CHECK(tr_frame_encode(&e, 0, &f, &n) == QE_EINVAL && !f);
  CHECK(!strcmp(tr_env_name(&e), "none"));
  e.msg_case = ENV_CASE(TOKEN_BATCH), e.token_batch = &b;
  b.n_token_ids = 5000, b.token_ids = ids;
  CHECK(!strcmp(tr_env_name(&e), "token_batch"));
  CHECK(tr_frame_encode(&e, 1000, &f, &n) == QE_ERANGE && !f);
  CHECK(strstr(qe_errmsg(), "token_batch frame of") != NULL);
  CHECK_OK(tr_frame_encode(&e, 0, &f, &n));
  CHECK(n == TR_FRAME_HEADER + tr_frame_payload_size(&e));
  CHECK(f[0] == (uint8_t)(n - 4) && f[1] == (uint8_t)((n - 4) >> 8) && f[2] == 0 && f[3] == 0);
  free(f);
}

/* A frame over 1 MiB goes through the buffer, which is released after it. */
static void test_large_frame(void) {
  enum { N = 400000 };
  uint32_t *big = malloc(N * sizeof *big);
  stream_t s = {0};
  tr_env_t e = QEVICT__WORKER__V1__ENVELOPE__INIT;
  Qevict__Worker__V1__StartRequest r = QEVICT__WORKER__V1__START_REQUEST__INIT;
  for (int i = 0; i < N; i++) big[i] = (uint32_t)i * 2654435761u >> 15;
  r.request_id = 1, r.n_prompt_ids = N, r.prompt_ids = big;
  e.msg_case = ENV_CASE(START_REQUEST), e.start_request = &r;
  stream_add(&s, &e);
  CHECK(s.len > (1u << 20));
  for (uint64_t seed = 1; seed <= 3; seed++) feed_chunks(&s, chunk_random, seed);
  free(s.data);
  free(big);
}

static void test_addr(void) {
  tr_addr_t a;
  char buf[160];
  CHECK_OK(tr_addr_parse("tcp://127.0.0.1:7000", &a));
  tr_addr_format(&a, buf, sizeof buf);
  CHECK(!a.is_unix && !strcmp(buf, "tcp://127.0.0.1:7000"));
  CHECK_OK(tr_addr_parse("localhost:0", &a));
  tr_addr_format(&a, buf, sizeof buf);
  CHECK(!strcmp(buf, "tcp://127.0.0.1:0"));
  CHECK_OK(tr_addr_parse("[::1]:9", &a));
  tr_addr_format(&a, buf, sizeof buf);
  CHECK(!strcmp(buf, "tcp://[::1]:9"));
  CHECK_OK(tr_addr_parse("unix:/tmp/q.sock", &a));
  CHECK(a.is_unix && !strcmp(a.path, "/tmp/q.sock"));
  CHECK_OK(tr_addr_parse("/run/q.sock", &a));
  CHECK(a.is_unix);
  CHECK(tr_addr_parse("", &a) == QE_EINVAL);
  CHECK(tr_addr_parse("127.0.0.1", &a) == QE_EINVAL);
  CHECK(tr_addr_parse("127.0.0.1:65536", &a) == QE_EINVAL);
  CHECK(tr_addr_parse("127.0.0.1:12x", &a) == QE_EINVAL);
  CHECK(tr_addr_parse("example.com:80", &a) == QE_EINVAL);
  CHECK(tr_addr_parse("[::1:80", &a) == QE_EINVAL);
  CHECK(tr_addr_parse("unix:", &a) == QE_EINVAL);
  memset(buf, 'a', 150), buf[150] = 0;
  char longp[170];
  snprintf(longp, sizeof longp, "unix:%s", buf);
  CHECK(tr_addr_parse(longp, &a) == QE_EINVAL);
}

int main(void) {
  test_roundtrip();
  test_many_in_one_chunk();
  test_oversize();
  test_truncated();
  test_garbage();
  test_amplification();
  test_encode_limits();
  test_large_frame();
  test_addr();
  return tu_done("tr_frame");
}
