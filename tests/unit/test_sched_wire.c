/* test_sched_wire: sched_pb_nul_string, which finds a string field of an encoded request that
 * holds a NUL byte (protobuf-c would hand the scheduler the string cut at it). Encodings packed
 * by protobuf-c, then a byte of one string set to 0: the field's path is named; NUL bytes in
 * other fields (token ids, numbers) are not strings; and random and cut-short encodings are
 * walked without reading past them (ASan in CI). And sched_rank_process, a worker rank's
 * counter baselines across a restart under the same name. */
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"
#include "test_util.h"

/* A GenerateRequest with a text prompt, a policy, token-free fields; packed into *n bytes. */
static uint8_t *packed(const char *text, const char *policy, size_t *n) {
  Qevict__V1__GenerateRequest g = QEVICT__V1__GENERATE_REQUEST__INIT;
  Qevict__V1__Prompt p = QEVICT__V1__PROMPT__INIT;
  Qevict__V1__Policy pol = QEVICT__V1__POLICY__INIT;
  p.kind_case = QEVICT__V1__PROMPT__KIND_TEXT, p.text = (char *)text;
  pol.name = (char *)policy;
  g.prompt = &p, g.policy = &pol, g.max_tokens = 4;
  *n = qevict__v1__generate_request__get_packed_size(&g);
  uint8_t *b = malloc(*n);
  qevict__v1__generate_request__pack(&g, b);
  return b;
}

/* Sets the byte of b[n] where needle's k-th character sits to 0. */
static void nul_at(uint8_t *b, size_t n, const char *needle, size_t k) {
  for (size_t i = 0; i + strlen(needle) <= n; i++)
    if (!memcmp(b + i, needle, strlen(needle))) {
      b[i + k] = 0;
      return;
    }
  CHECK(!"needle found");
}

static int nul_in(const uint8_t *b, size_t n, char *path) {
  return sched_pb_nul_string(&qevict__v1__generate_request__descriptor, b, n, path, 64);
}

static void test_named(void) {
  char path[64];
  size_t n;
  uint8_t *b = packed("Once upon a time", "qevict", &n);
  CHECK(!nul_in(b, n, path));
  nul_at(b, n, "upon", 1);
  CHECK(nul_in(b, n, path) && !strcmp(path, "prompt.text"));
  free(b);
  b = packed("Once upon a time", "qevict", &n);
  nul_at(b, n, "qevict", 6 - 1);
  CHECK(nul_in(b, n, path) && !strcmp(path, "policy.name"));
  free(b);
}

/* A NUL in a repeated message's string names the element: prompt.chat.messages[2].role. */
static void test_indexed(void) {
  Qevict__V1__GenerateRequest g = QEVICT__V1__GENERATE_REQUEST__INIT;
  Qevict__V1__Prompt p = QEVICT__V1__PROMPT__INIT;
  Qevict__V1__ChatMessages c = QEVICT__V1__CHAT_MESSAGES__INIT;
  Qevict__V1__ChatMessage m[3], *mp[3] = {&m[0], &m[1], &m[2]};
  char *role[3] = {"system", "user", "assistant"}, *text[3] = {"Be brief.", "Hi", "Hello"};
  for (int i = 0; i < 3; i++)
    qevict__v1__chat_message__init(&m[i]), m[i].role = role[i], m[i].content = text[i];
  c.n_messages = 3, c.messages = mp;
  p.kind_case = QEVICT__V1__PROMPT__KIND_CHAT, p.chat = &c, g.prompt = &p;
  uint8_t b[128];
  size_t n = qevict__v1__generate_request__pack(&g, b);
  char path[64];
  CHECK(!nul_in(b, n, path));
  nul_at(b, n, "assistant", 4);
  CHECK(nul_in(b, n, path) && !strcmp(path, "prompt.chat.messages[2].role"));
  nul_at(b, n, "Hi", 1);
  CHECK(nul_in(b, n, path) && !strcmp(path, "prompt.chat.messages[1].content"));
}

/* Error messages echo the client's bytes: each byte that starts no valid UTF-8 sequence (stray,
 * overlong, surrogate, cut short) becomes '?', valid text stays as it is. */
static void test_utf8_clean(void) {
  char a[] = "tenant 'caf\xc3\xa9 \xff\xfe' \xc0\xaf \xed\xa0\x80 \xf0\x9f\x98\x80 \xe4\xb8";
  sched_utf8_clean(a);
  CHECK(!strcmp(a, "tenant 'caf\xc3\xa9 ?"
                   "?' ?? ??? \xf0\x9f\x98\x80 ??"));
  CHECK(sched_utf8_valid(a, strlen(a)));
  char b[] = "plain";
  sched_utf8_clean(b);
  CHECK(!strcmp(b, "plain"));
}

static void test_not_strings(void) {
  Qevict__V1__GenerateRequest g = QEVICT__V1__GENERATE_REQUEST__INIT;
  Qevict__V1__Prompt p = QEVICT__V1__PROMPT__INIT;
  Qevict__V1__TokenIds t = QEVICT__V1__TOKEN_IDS__INIT;
  uint32_t ids[3] = {0, 5, 0};
  t.n_ids = 3, t.ids = ids;
  p.kind_case = QEVICT__V1__PROMPT__KIND_TOKEN_IDS, p.token_ids = &t;
  g.prompt = &p, g.max_tokens = 0; /* (zeros on the wire, none in a string) */
  uint8_t b[64];
  size_t n = qevict__v1__generate_request__pack(&g, b);
  char path[64];
  CHECK(!nul_in(b, n, path));
}

static void test_random(void) {
  char path[64];
  size_t n;
  uint8_t *good = packed("Once upon a time", "qevict:window=8", &n);
  for (size_t k = 0; k <= n; k++) { /* every cut: a heap copy of exactly k bytes */
    uint8_t *c = malloc(k ? k : 1);
    memcpy(c, good, k);
    nul_in(c, k, path);
    free(c);
  }
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int t = 0; t < 20000; t++) {
    size_t k = (size_t)(t % 97);
    uint8_t *c = malloc(k ? k : 1);
    for (size_t i = 0; i < k; i++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      c[i] = t % 3 ? (uint8_t)s : i < n ? good[i] ^ (uint8_t)(s & (s >> 8) & 0x41) : 0;
    }
    nul_in(c, k, path);
    CHECK(strlen(path) < 64);
    free(c);
  }
  free(good);
}

/* sched_rank_process: a rank's counters' last values go back to 0 at a new process's first
 * report (a restart under the old name), and only then. */
static void test_rank_process(void) {
  srank_t rk = {0};
  Qevict__Worker__V1__MemoryReport m = QEVICT__WORKER__V1__MEMORY_REPORT__INIT;
  const uint64_t seen[4] = {5, 6, 7, 8};
  m.process_start_ticks = 1000;
  memcpy(rk.transitions, seen, sizeof seen), rk.cpu_us = 900; /* kept over a reconnect */
  sched_rank_process(&rk, &m); /* the first report after it: the start becomes known */
  CHECK(rk.start_ticks == 1000 && rk.cpu_us == 900 && !memcmp(rk.transitions, seen, sizeof seen));
  sched_rank_process(&rk, &m); /* the same process */
  CHECK(rk.cpu_us == 900 && rk.transitions[3] == 8);
  m.process_start_ticks = 0; /* a worker that could not read /proc: nothing known */
  sched_rank_process(&rk, &m);
  CHECK(rk.start_ticks == 1000 && rk.cpu_us == 900);
  m.process_start_ticks = 2000; /* a new process under the old name */
  sched_rank_process(&rk, &m);
  CHECK(rk.start_ticks == 2000 && rk.cpu_us == 0 && rk.transitions[0] == 0 &&
        rk.transitions[3] == 0);
}

int main(void) {
  test_rank_process();
  test_named();
  test_indexed();
  test_utf8_clean();
  test_not_strings();
  test_random();
  return tu_done("sched_wire");
}
