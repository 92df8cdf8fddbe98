/* test_tokenizer: the tokenizer and chat templates.
 *   - pure logic: UTF-8 decoding, Unicode classes, each pre-tokenizer's chunks (expected lists
 *     checked against Python's `regex` module with the models' regexes)
 *   - toy SPM and BPE vocabularies written with gguf_writer: merge order, ties, byte fallback,
 *     specials, decoding, the streaming detokenizer on code points split across tokens
 *   - malformed tokenizer metadata: each failure's code
 *   - stories260K (llama2.c golden ids and text), SmolLM2-135M-Instruct (ids from HF
 *     transformers in tests/fixtures/smollm2_tok.json, round trips, chat, speed); each part
 *     is skipped when its file is absent.
 *   - chat templates: ChatML with the default system message, Llama-3 (expected strings as
 *     jinja2 renders the models' templates). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf_write.h"
#include "qe_status.h"
#include "test_util.h"
#include "tok_internal.h"
#include "tokenizer.h"
#include "unicode_tables.h"

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))
#define SP        "\xE2\x96\x81" /* U+2581 */

/* ---- helpers ---- */

typedef struct {
  uint8_t *buf;
  gguf_t *g;
} mem_gguf_t;

static int mem_open(gguf_writer_t *w, mem_gguf_t *m) {
  size_t size = 0;
  m->g = NULL;
  int rc = gguf_writer_finish(w, &m->buf, &size);
  gguf_writer_destroy(w);
  return rc ? rc : gguf_open_mem(m->buf, size, &m->g);
}

static void mem_close(mem_gguf_t *m) {
  gguf_close(m->g);
  free(m->buf);
}

/* Encodes s and compares with want[0..nw). */
static int enc_is(const tok_t *t, const char *s, int add_bos, int ps, const int32_t *want,
                  size_t nw) {
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = tok_encode(t, s, strlen(s), add_bos, ps, &ids, &n);
  int ok = rc == 0 && n == nw && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
  if (!ok) {
    fprintf(stderr, "  encode '%s' (rc %d) gave [", s, rc);
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
    fprintf(stderr, "]\n");
  }
  free(ids);
  return ok;
}
#define ENC_IS(t, s, bos, ps, ...)                                                                 \
  do {                                                                                             \
    static const int32_t want_[] = {__VA_ARGS__};                                                  \
    CHECK(enc_is(t, s, bos, ps, want_, NELEMS(want_)));                                            \
  } while (0)

static int dec_is(const tok_t *t, const int32_t *ids, size_t n, int rs, int strip,
                  const char *want) {
  char *text = NULL;
  int rc = tok_decode(t, ids, n, rs, strip, &text);
  int ok = rc == 0 && strcmp(text, want) == 0;
  if (!ok) fprintf(stderr, "  decode gave '%s' (rc %d), wanted '%s'\n", text ? text : "", rc, want);
  free(text);
  return ok;
}

/* ---- pure logic ---- */

static void test_utf8(void) {
  uint32_t cp = 0;
  CHECK(tok_utf8_next((const unsigned char *)"A", 1, &cp) == 1 && cp == 'A');
  CHECK(tok_utf8_next((const unsigned char *)"\xC3\xA9", 2, &cp) == 2 && cp == 0xE9);
  CHECK(tok_utf8_next((const unsigned char *)"\xE4\xB8\xAD", 3, &cp) == 3 && cp == 0x4E2D);
  CHECK(tok_utf8_next((const unsigned char *)"\xF0\x9F\x98\x80", 4, &cp) == 4 && cp == 0x1F600);
  CHECK(tok_utf8_next((const unsigned char *)"\xE4\xB8", 2, &cp) == 0);      /* cut short */
  CHECK(tok_utf8_next((const unsigned char *)"\x80", 1, &cp) == -1);         /* stray */
  CHECK(tok_utf8_next((const unsigned char *)"\xC0\xAF", 2, &cp) == -1);     /* overlong */
  CHECK(tok_utf8_next((const unsigned char *)"\xED\xA0\x80", 3, &cp) == -1); /* surrogate */
  CHECK(tok_utf8_next((const unsigned char *)"\xE4\x41", 2, &cp) == -1);
  CHECK(tok_utf8_next((const unsigned char *)"\xF0\x9F\x41", 3, &cp) == -2);
  CHECK(tok_utf8_next((const unsigned char *)"\xF4\x90\x80\x80", 4, &cp) == -1); /* > 10FFFF */
  char out[4];
  CHECK(tok_utf8_put(0x1F600, out) == 4 && memcmp(out, "\xF0\x9F\x98\x80", 4) == 0);
  CHECK(tok_utf8_put(0x2581, out) == 3 && memcmp(out, SP, 3) == 0);
}

static void test_classes(void) {
  CHECK(tok_uni_class('a') == TOK_UNI_L && tok_uni_class('Z') == TOK_UNI_L);
  CHECK(tok_uni_class('7') == TOK_UNI_N && tok_uni_class(0xBD) == TOK_UNI_N); /* ½ */
  CHECK(tok_uni_class(0x4E2D) == TOK_UNI_L && tok_uni_class(0xAC00) == TOK_UNI_L);
  CHECK(tok_uni_class(0x0663) == TOK_UNI_N && tok_uni_class(0x216B) == TOK_UNI_N); /* ٣ Ⅻ */
  CHECK(tok_uni_class(' ') == TOK_UNI_S && tok_uni_class('\t') == TOK_UNI_S);
  CHECK(tok_uni_class(0x85) == TOK_UNI_S && tok_uni_class(0xA0) == TOK_UNI_S);
  CHECK(tok_uni_class(0x3000) == TOK_UNI_S && tok_uni_class(0x2028) == TOK_UNI_S);
  CHECK(tok_uni_class(0x200B) == 0 && tok_uni_class(0x1C) == 0); /* not White_Space */
  CHECK(tok_uni_class(0x301) == TOK_UNI_M && tok_uni_class('!') == 0);
  CHECK(tok_uni_class(0x1F600) == 0 && tok_uni_class(0x1D518) == TOK_UNI_L); /* 😀 𝔘 */
  for (int i = 1; i < tok_uni_n_ranges; i++) CHECK(tok_uni_ranges[i - 1].hi < tok_uni_ranges[i].lo);
}

typedef struct {
  char chunks[32][32];
  int n;
} chunks_t;

static int collect(void *ctx, const char *s, size_t n) {
  chunks_t *c = ctx;
  if (c->n < 32 && n < 32) {
    memcpy(c->chunks[c->n], s, n);
    c->chunks[c->n][n] = '\0';
  }
  c->n++;
  return 0;
}

static int split_is(const char *pre, const char *s, const char *const *want, int nw) {
  chunks_t c = {.n = 0};
  int p = tok_pre_from_name(pre, strlen(pre));
  int ok = p > 0 && tok_pretok_split(p, s, strlen(s), collect, &c) == 0 && c.n == nw;
  for (int i = 0; ok && i < nw; i++) ok = strcmp(c.chunks[i], want[i]) == 0;
  if (!ok) {
    fprintf(stderr, "  %s split of '%s' gave %d chunks:", pre, s, c.n);
    for (int i = 0; i < c.n && i < 32; i++) fprintf(stderr, " [%s]", c.chunks[i]);
    fprintf(stderr, "\n");
  }
  return ok;
}
#define SPLIT_IS(pre, s, ...)                                                                      \
  do {                                                                                             \
    static const char *const want_[] = {__VA_ARGS__};                                              \
    CHECK(split_is(pre, s, want_, (int)NELEMS(want_)));                                            \
  } while (0)

static void test_pretok(void) {
  SPLIT_IS("gpt2", "Hello world's  12 ab\t\n!!", "Hello", " world", "'s", " ", " 12", " ab", "\t",
           "\n", "!!");
  SPLIT_IS("gpt2", "DON'T 'x  ", "DON", "'", "T", " '", "x", "  ");
  SPLIT_IS("smollm", "a  12 x3", "a", "  ", "1", "2", " x", "3");
  SPLIT_IS("smollm", "\xC2\xBD\xC3\xA9", "\xC2\xBD", "\xC3\xA9"); /* ½ is \p{N}: isolated */
  SPLIT_IS("llama-bpe", "I'M 12345 x\n\n  y(z)", "I", "'M", " ", "123", "45", " x", "\n\n", " ",
           " y", "(z", ")");
  SPLIT_IS("llama3", "a\xC5\xBFs 'LL", "a\xC5\xBFs", " '", "LL"); /* ſ: a letter */
  SPLIT_IS("llama3", "x'\xC5\xBF!?\r\n\r\n y", "x", "'\xC5\xBF", "!?\r\n\r\n",
           " y"); /* (?i) folds ſ to s */
  SPLIT_IS("qwen2", "12345 it's\r\n", "1", "2", "3", "4", "5", " it", "'s", "\r\n");
  SPLIT_IS("default", "a\xFF\xFE b", "a", "\xFF\xFE", " b"); /* malformed bytes: "other" */
  CHECK(tok_pre_from_name("nonesuch", 8) == QE_EUNSUPPORTED);
  CHECK(strstr(qe_errmsg(), "nonesuch") != NULL);
}

/* ---- toy SPM vocabulary ---- */

static const char *const spm_extra[] = {SP,     "a",  "b", "c", "ab", "bc", "abc",
                                        SP "a", "aa", "<", "s", ">",  "<s", "\xC3\xA9"};
static const float spm_extra_score[] = {-1, -2, -2, -2, -5, -1, -3, -4, -2, -6, -6, -6, -1, -3};
enum {
  S_SP = 259,
  S_A,
  S_B,
  S_C,
  S_AB,
  S_BC,
  S_ABC,
  S_SPA,
  S_AA,
  S_LT,
  S_S,
  S_GT,
  S_LTS,
  S_EACUTE
};
#define NSPM    (259 + (int)NELEMS(spm_extra))
#define BYTE(b) (3 + (b))

/* Writes a toy SPM vocabulary; `drop` skips one key, n_scores/n_types override lengths. */
static int spm_gguf(mem_gguf_t *m, const char *drop, int n_scores, int n_types) {
  static char bytes[256][8];
  const char *tokens[NSPM];
  float scores[NSPM];
  int32_t types[NSPM];
  tokens[0] = "<unk>", tokens[1] = "<s>", tokens[2] = "</s>";
  types[0] = TOK_TYPE_UNKNOWN, types[1] = types[2] = TOK_TYPE_CONTROL;
  for (int b = 0; b < 256; b++) {
    snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
    tokens[3 + b] = bytes[b];
    types[3 + b] = TOK_TYPE_BYTE;
  }
  for (int i = 0; i < (int)NELEMS(spm_extra); i++) {
    tokens[259 + i] = spm_extra[i];
    types[259 + i] = TOK_TYPE_NORMAL;
  }
  for (int i = 0; i < NSPM; i++) scores[i] = i >= 259 ? spm_extra_score[i - 259] : 0.0f;
  gguf_writer_t *w;
  int rc = gguf_writer_create(&w);
  if (rc) return rc;
  if (!drop || strcmp(drop, "model")) gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  if (!drop || strcmp(drop, "tokens"))
    gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", tokens, NSPM);
  if (!drop || strcmp(drop, "scores"))
    gguf_writer_add_f32_arr(w, "tokenizer.ggml.scores", scores,
                            (size_t)(n_scores ? n_scores : NSPM));
  gguf_writer_add_i32_arr(w, "tokenizer.ggml.token_type", types,
                          (size_t)(n_types ? n_types : NSPM));
  gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
  gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
  gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
  return mem_open(w, m);
}

static void test_spm_toy(void) {
  mem_gguf_t m;
  tok_t *t = NULL;
  CHECK_OK(spm_gguf(&m, NULL, 0, 0));
  CHECK_OK(tok_create(m.g, &t));
  mem_close(&m); /* the tok_t must not need the gguf any more */
  if (!t) return;
  CHECK(tok_kind(t) == TOK_KIND_SPM && tok_n_vocab(t) == NSPM && tok_add_bos(t) == 1);
  CHECK(tok_bos(t) == 1 && tok_eos(t) == 2 && tok_eot(t) == -1 && tok_is_eog(t, 2));
  CHECK(!tok_is_eog(t, 1) && strcmp(tok_piece(t, S_ABC), "abc") == 0 && !tok_piece(t, NSPM));
  CHECK(tok_max_piece_len(t) == strlen("<0x00>"));
  ENC_IS(t, "abc", 1, 0, 1, S_SP, S_ABC);  /* bc (-1) first, then a+bc = abc (-3) */
  ENC_IS(t, "aaa", 0, 0, S_SP, S_AA, S_A); /* equal scores: leftmost first */
  ENC_IS(t, "a b", 0, 0, S_SPA, S_SP, S_B);
  ENC_IS(t, "\xC3\xA9\xE4\xB8\xAD", 0, 0, S_SP, S_EACUTE, BYTE(0xE4), BYTE(0xB8), BYTE(0xAD));
  ENC_IS(t, "x\xFF", 0, 0, S_SP, BYTE('x'), BYTE(0xFF));
  ENC_IS(t, "<s>abc", 0, 1, 1, S_ABC);       /* no dummy prefix after a special */
  ENC_IS(t, "<s>", 0, 0, S_SP, S_LTS, S_GT); /* '<s' + '>' would be the control <s> */
  ENC_IS(t, "abc</s>", 1, 1, 1, S_SP, S_ABC, 2);
  ENC_IS(t, "", 1, 0, 1);
  int32_t *ids = NULL;
  size_t n = 9;
  CHECK_OK(tok_encode(t, "", 0, 0, 0, &ids, &n));
  CHECK(n == 0 && ids != NULL);
  free(ids);

  static const int32_t seq[] = {1, S_SP, S_ABC, 2};
  CHECK(dec_is(t, seq, 4, 0, 1, "abc"));
  CHECK(dec_is(t, seq, 4, 0, 0, " abc"));
  CHECK(dec_is(t, seq, 4, 1, 0, "<s> abc</s>"));
  CHECK(dec_is(t, seq, 4, 1, 1, "<s>abc</s>"));
  char buf[64];
  CHECK(tok_token_bytes(t, S_SPA, 0, buf, sizeof buf) == 2 && memcmp(buf, " a", 2) == 0);
  CHECK(tok_token_bytes(t, BYTE(0x0A), 0, buf, sizeof buf) == 1 && buf[0] == '\n');
  CHECK(tok_token_bytes(t, 0, 0, buf, sizeof buf) == 0);
  CHECK(tok_token_bytes(t, S_ABC, 0, buf, 2) == QE_ENOSPC);
  CHECK(tok_token_bytes(t, NSPM, 0, buf, sizeof buf) == QE_ERANGE);
  CHECK(tok_token_bytes(t, -1, 0, buf, sizeof buf) == QE_ERANGE);

  /* streaming: a code point split over byte-fallback tokens comes out whole */
  tok_stream_t st;
  tok_stream_init(&st, t, 0, 1);
  CHECK(tok_stream_push(&st, 1, buf, sizeof buf) == 0);
  CHECK(tok_stream_push(&st, S_SP, buf, sizeof buf) == 0); /* the dummy space, stripped */
  CHECK(tok_stream_push(&st, BYTE(0xE4), buf, sizeof buf) == 0);
  CHECK(tok_stream_push(&st, BYTE(0xB8), buf, sizeof buf) == 0);
  CHECK(tok_stream_push(&st, BYTE(0xAD), buf, sizeof buf) == 3 &&
        memcmp(buf, "\xE4\xB8\xAD", 3) == 0);
  CHECK(tok_stream_push(&st, S_SP, buf, sizeof buf) == 1 && buf[0] == ' '); /* kept later on */
  CHECK(tok_stream_push(&st, BYTE(0xF0), buf, sizeof buf) == 0);
  CHECK(tok_stream_push(&st, BYTE(0x9F), buf, sizeof buf) == 0);
  CHECK(tok_stream_push(&st, S_A, buf, sizeof buf) == 4 && memcmp(buf,
                                                                  "\xEF\xBF\xBD"
                                                                  "a",
                                                                  4) == 0);
  CHECK(tok_stream_push(&st, BYTE(0xE4), buf, sizeof buf) == 0);
  CHECK(tok_stream_push(&st, NSPM, buf, sizeof buf) == QE_ERANGE);
  CHECK(tok_stream_flush(&st, buf, sizeof buf) == 3 && memcmp(buf, "\xEF\xBF\xBD", 3) == 0);
  CHECK(tok_stream_flush(&st, buf, sizeof buf) == 0);
  tok_stream_init(&st, t, 0, 1);
  CHECK(tok_stream_push(&st, BYTE(0xFF), buf, sizeof buf) == 3); /* never valid: at once */
  CHECK(tok_stream_push(&st, BYTE(0xC3), buf, sizeof buf) == 0);
  CHECK(tok_stream_push(&st, S_EACUTE, buf, 2) == QE_ENOSPC); /* U+FFFD + é is 5 bytes */
  static const int32_t bad[] = {BYTE(0xE4), BYTE(0xB8), S_A, BYTE(0xC3)};
  CHECK(dec_is(t, bad, 4, 0, 1,
               "\xEF\xBF\xBD"
               "a\xEF\xBF\xBD"));
  tok_destroy(t);
}

/* ---- toy BPE vocabulary ---- */

/* GPT-2's bytes_to_unicode() as Python writes it: printable Latin-1 first, the rest after. */
static void byte_chars(char out[256][4]) {
  int direct[256] = {0}, next = 256;
  for (int b = 0; b < 256; b++)
    direct[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  for (int b = 0; b < 256; b++) {
    char u[4] = {0};
    tok_utf8_put(direct[b] ? (uint32_t)b : (uint32_t)next++, u);
    memcpy(out[b], u, 4);
  }
}

static const char *const bpe_extra[] = {"\xC4\xA0t",
                                        "he",
                                        "\xC4\xA0the",
                                        "<|endoftext|>",
                                        "<|im_start|>",
                                        "<|im_end|>",
                                        "<tool>",
                                        "<|begin_of_text|>",
                                        "<|"};
static const int32_t bpe_extra_type[] = {1, 1, 1, 3, 3, 3, 4, 3, 1};
enum { B_GT = 256, B_HE, B_GTHE, B_EOT, B_IMS, B_IME, B_TOOL, B_BOT, B_LTBAR };
#define NBPE (256 + (int)NELEMS(bpe_extra))

static int bpe_gguf(mem_gguf_t *m, const char *pre, const char *const *merges, size_t n_merges,
                    const char *chat_template) {
  static const char *const good_merges[] = {"\xC4\xA0 t", "h e", "\xC4\xA0t he", "< |"};
  static char chars[256][4];
  const char *tokens[NBPE];
  int32_t types[NBPE];
  byte_chars(chars);
  for (int b = 0; b < 256; b++) tokens[b] = chars[b], types[b] = 1;
  for (int i = 0; i < (int)NELEMS(bpe_extra); i++)
    tokens[256 + i] = bpe_extra[i], types[256 + i] = bpe_extra_type[i];
  if (!merges) merges = good_merges, n_merges = NELEMS(good_merges);
  gguf_writer_t *w;
  int rc = gguf_writer_create(&w);
  if (rc) return rc;
  gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
  if (pre) gguf_writer_add_str(w, "tokenizer.ggml.pre", pre);
  gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", tokens, NBPE);
  gguf_writer_add_i32_arr(w, "tokenizer.ggml.token_type", types, NBPE);
  if (n_merges) gguf_writer_add_str_arr(w, "tokenizer.ggml.merges", merges, n_merges);
  gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", B_BOT);
  gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", B_EOT);
  if (chat_template) gguf_writer_add_str(w, "tokenizer.chat_template", chat_template);
  return mem_open(w, m);
}

static void test_bpe_toy(void) {
  mem_gguf_t m;
  tok_t *t = NULL;
  CHECK_OK(bpe_gguf(&m, "gpt2", NULL, 0, NULL));
  CHECK_OK(tok_create(m.g, &t));
  mem_close(&m);
  if (!t) return;
  CHECK(tok_kind(t) == TOK_KIND_BPE && tok_add_bos(t) == 0 && tok_eot(t) == B_IME);
  CHECK(tok_is_eog(t, B_EOT) && tok_is_eog(t, B_IME) && !tok_is_eog(t, B_IMS));
  CHECK(tok_max_piece_len(t) == strlen("<|begin_of_text|>"));
  ENC_IS(t, "the the", 0, 0, 't', B_HE, B_GTHE); /* he (rank 1) before Ġt+h: no rank */
  ENC_IS(t, "<|im_start|>the", 0, 1, B_IMS, 't', B_HE);
  ENC_IS(t, "<|im_start|>", 0, 0, B_LTBAR, 'i', 'm', '_', 's', 't', 'a', 'r', 't', '|', '>');
  ENC_IS(t, "<tool>x", 0, 0, B_TOOL, 'x');                 /* user-defined: always matched */
  ENC_IS(t, "<|begin_of_text|>hi", 1, 1, B_BOT, 'h', 'i'); /* one BOS */
  ENC_IS(t, "hi", 1, 1, B_BOT, 'h', 'i');
  ENC_IS(t, "a \n", 0, 0, 'a', ' ', '\n'); /* byte b is token b in this toy */
  static const int32_t seq[] = {B_IMS, 't', B_HE, B_GTHE, B_IME};
  CHECK(dec_is(t, seq, 5, 0, 0, "the the"));
  CHECK(dec_is(t, seq, 5, 1, 0, "<|im_start|>the the<|im_end|>"));
  /* every byte value survives encode + per-token bytes */
  char all[256], back[512];
  for (int i = 0; i < 256; i++) all[i] = (char)i;
  int32_t *ids = NULL;
  size_t n = 0, k = 0;
  CHECK_OK(tok_encode(t, all, 256, 0, 0, &ids, &n));
  for (size_t i = 0; i < n; i++) {
    int r = tok_token_bytes(t, ids[i], 0, back + k, sizeof back - k);
    CHECK(r > 0);
    if (r > 0) k += (size_t)r;
  }
  CHECK(k == 256 && memcmp(all, back, 256) == 0);
  free(ids);
  tok_destroy(t);
}

/* ---- malformed metadata ---- */

static int create_rc(mem_gguf_t *m, int build_rc) {
  if (build_rc) return build_rc;
  tok_t *t = NULL;
  int rc = tok_create(m->g, &t);
  CHECK((rc == 0) == (t != NULL));
  tok_destroy(t);
  mem_close(m);
  return rc;
}

static int create_with(const char *model, const char *key, int type, const void *v, size_t n) {
  gguf_writer_t *w;
  mem_gguf_t m;
  static const char *const toks[] = {"a", "b", "ab"};
  gguf_writer_create(&w);
  if (model) gguf_writer_add_str(w, "tokenizer.ggml.model", model);
  if (strcmp(key, "tokenizer.ggml.tokens") != 0)
    gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", toks, 3);
  if (type == GGUF_VT_STRING)
    gguf_writer_add_str_arr(w, key, v, n);
  else if (type == GGUF_VT_UINT32)
    gguf_writer_add_u32(w, key, *(const uint32_t *)v);
  else
    gguf_writer_add_arr(w, key, type, v, n);
  return create_rc(&m, mem_open(w, &m));
}

static void test_bad_metadata(void) {
  mem_gguf_t m;
  CHECK(create_rc(&m, spm_gguf(&m, "model", 0, 0)) == QE_ENOTFOUND);
  CHECK(strstr(qe_errmsg(), "tokenizer.ggml.model") != NULL);
  CHECK(create_rc(&m, spm_gguf(&m, "tokens", 0, 0)) == QE_ENOTFOUND);
  CHECK(create_rc(&m, spm_gguf(&m, "scores", 0, 0)) == QE_ENOTFOUND);
  CHECK(create_rc(&m, spm_gguf(&m, NULL, NSPM - 1, 0)) == QE_EFORMAT);
  CHECK(strstr(qe_errmsg(), "scores") != NULL);
  CHECK(create_rc(&m, spm_gguf(&m, NULL, 0, 5)) == QE_EFORMAT);
  CHECK(strstr(qe_errmsg(), "token_type") != NULL);
  float sc[3] = {0, 0, 0};
  CHECK(create_with("bert", "tokenizer.ggml.scores", GGUF_VT_FLOAT32, sc, 3) == QE_EUNSUPPORTED);
  CHECK(strstr(qe_errmsg(), "bert") != NULL);
  CHECK(create_with("llama", "tokenizer.ggml.scores", GGUF_VT_FLOAT32, sc, 3) == 0);
  int32_t notstr[2] = {1, 2};
  CHECK(create_with("llama", "tokenizer.ggml.tokens", GGUF_VT_INT32, notstr, 2) == QE_EFORMAT);
  uint32_t bos = 0;
  CHECK(create_with("gpt2", "tokenizer.ggml.bos_token_id", GGUF_VT_UINT32, &bos, 1) ==
        QE_ENOTFOUND); /* no merges */
  CHECK(strstr(qe_errmsg(), "merges") != NULL);
  static const char *const m_ok[] = {"a b"}, *const m_nosp[] = {"a b", "ab"},
                           *const m_oov[] = {"a zz"}, *const m_empty[] = {"a "};
  CHECK(create_with("gpt2", "tokenizer.ggml.merges", GGUF_VT_STRING, m_ok, 1) == 0);
  CHECK(create_with("gpt2", "tokenizer.ggml.merges", GGUF_VT_STRING, m_nosp, 2) == QE_EFORMAT);
  CHECK(strstr(qe_errmsg(), "merge 1") != NULL);
  CHECK(create_with("gpt2", "tokenizer.ggml.merges", GGUF_VT_STRING, m_oov, 1) == QE_EFORMAT);
  CHECK(strstr(qe_errmsg(), "zz") != NULL);
  CHECK(create_with("gpt2", "tokenizer.ggml.merges", GGUF_VT_STRING, m_empty, 1) == QE_EFORMAT);
  CHECK(create_rc(&m, bpe_gguf(&m, "nonesuch-pre", NULL, 0, NULL)) == QE_EUNSUPPORTED);
  CHECK(strstr(qe_errmsg(), "nonesuch-pre") != NULL);
  CHECK(create_rc(&m, bpe_gguf(&m, NULL, NULL, 0, NULL)) == 0); /* no pre: GPT-2's */

  /* an out-of-range id and a bad token type (on the SPM toy, full key set) */
  gguf_writer_t *w;
  static const char *const toks[] = {"a", "b"};
  float s2[2] = {0, 0};
  int32_t t2[2] = {1, 7};
  gguf_writer_create(&w);
  gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", toks, 2);
  gguf_writer_add_f32_arr(w, "tokenizer.ggml.scores", s2, 2);
  gguf_writer_add_i32_arr(w, "tokenizer.ggml.token_type", t2, 2);
  CHECK(create_rc(&m, mem_open(w, &m)) == QE_EFORMAT);
  t2[1] = 1;
  gguf_writer_create(&w);
  gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", toks, 2);
  gguf_writer_add_f32_arr(w, "tokenizer.ggml.scores", s2, 2);
  gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 2);
  CHECK(create_rc(&m, mem_open(w, &m)) == QE_EFORMAT);
  CHECK(strstr(qe_errmsg(), "bos_token_id") != NULL);

  /* byte tokens that are no <0xXX> are not byte fallbacks (and never index out of range) */
  static const char *const bt[] = {"<unk>", "<0x-1>", "<0xG0>", "<0x 1>"};
  float s4[4] = {0, 0, 0, 0};
  int32_t t4[4] = {TOK_TYPE_UNKNOWN, TOK_TYPE_BYTE, TOK_TYPE_BYTE, TOK_TYPE_BYTE};
  uint32_t unk = 0;
  tok_t *t = NULL;
  gguf_writer_create(&w);
  gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", bt, 4);
  gguf_writer_add_f32_arr(w, "tokenizer.ggml.scores", s4, 4);
  gguf_writer_add_i32_arr(w, "tokenizer.ggml.token_type", t4, 4);
  gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", unk);
  CHECK_OK(mem_open(w, &m));
  CHECK_OK(tok_create(m.g, &t));
  mem_close(&m);
  if (!t) return;
  ENC_IS(t, "\x01", 0, 0, 0, 0, 0, 0); /* U+2581's three bytes, then 0x01: all <unk> */
  static const int32_t one[] = {1};
  CHECK(dec_is(t, one, 1, 0, 0, "<0x-1>"));
  tok_destroy(t);
}

/* ---- chat templates ---- */

static const char smol_template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";
/* Qwen2.5-like: a system message from content first, the default one later, "\\n" escapes */
static const char qwen_template[] =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
    "Qwen, created by Alibaba Cloud. You\\'re helpful.<|im_end|>\\n' }}{%- endif %}...";
static const char llama3_template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

static int render_is(int kind, const gguf_t *g, const chat_msg_t *msgs, size_t n, int gen,
                     const char *want) {
  char *out = NULL;
  int rc = chat_render(kind, g, msgs, n, gen, &out);
  int ok = rc == 0 && strcmp(out, want) == 0;
  if (!ok)
    fprintf(stderr, "  chat rendered (rc %d):\n%s\n  wanted:\n%s\n", rc, out ? out : "", want);
  free(out);
  return ok;
}

static const chat_msg_t conv3[] = {{"user", "Hi there"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
static const chat_msg_t conv_sys[] = {{"system", " Be brief.\n"}, {"user", "\xE3\x80\x80 Hi \t"}};

static void test_chat(void) {
  mem_gguf_t m;
  CHECK_OK(bpe_gguf(&m, NULL, NULL, 0, smol_template));
  CHECK(chat_kind_of(m.g) == CHAT_CHATML);
  CHECK(render_is(CHAT_CHATML, m.g, conv3, 3, 1,
                  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                  "Hugging Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>"
                  "assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>"
                  "assistant\n"));
  CHECK(render_is(CHAT_CHATML, m.g, conv_sys, 2, 0,
                  "<|im_start|>system\n Be brief.\n<|im_end|>\n<|im_start|>user\n\xE3\x80\x80 Hi "
                  "\t<|im_end|>\n"));
  CHECK(render_is(CHAT_CHATML, m.g, conv3, 0, 1, "<|im_start|>assistant\n"));
  CHECK(render_is(CHAT_CHATML, m.g, conv3, 0, 0, ""));
  CHECK(render_is(CHAT_CHATML, NULL, conv3, 1, 0, "<|im_start|>user\nHi there<|im_end|>\n"));
  mem_close(&m);

  CHECK_OK(bpe_gguf(&m, NULL, NULL, 0, qwen_template));
  CHECK(chat_kind_of(m.g) == CHAT_CHATML);
  CHECK(render_is(CHAT_CHATML, m.g, conv3, 1, 0,
                  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You're "
                  "helpful.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"));
  mem_close(&m);

  CHECK_OK(bpe_gguf(&m, NULL, NULL, 0, llama3_template));
  CHECK(chat_kind_of(m.g) == CHAT_LLAMA3);
  CHECK(render_is(CHAT_LLAMA3, m.g, conv3, 3, 1,
                  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n"));
  CHECK(render_is(CHAT_LLAMA3, m.g, conv_sys, 2, 0,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief."
                  "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"));
  CHECK(render_is(CHAT_LLAMA3, m.g, conv3, 0, 1,
                  "<|start_header_id|>assistant<|end_header_id|>\n\n"));
  mem_close(&m);

  CHECK_OK(bpe_gguf(&m, NULL, NULL, 0, "{{ messages }}"));
  CHECK(chat_kind_of(m.g) == CHAT_NONE);
  char *out = (char *)"x";
  CHECK(chat_render(CHAT_NONE, m.g, conv3, 1, 1, &out) == QE_EUNSUPPORTED && out == NULL);
  mem_close(&m);
  CHECK(chat_kind_of(NULL) == CHAT_NONE);
  static const chat_msg_t broken[] = {{NULL, "x"}};
  CHECK(chat_render(CHAT_CHATML, NULL, broken, 1, 0, &out) == QE_EINVAL);
}

/* ---- stories260K: llama2.c's golden ids ---- */

/* The JSON string opening at the first '"' at or after p (escapes \n \" \\ \uXXXX):
 * malloc'd, *end just after it. */
static char *json_str_at(const char *p, const char **end) {
  if (!(p = strchr(p, '"'))) return NULL;
  char *out = malloc(strlen(p) + 1);
  size_t k = 0;
  for (p++; *p && *p != '"'; p++) {
    if (*p != '\\') {
      out[k++] = *p;
      continue;
    }
    char c = *++p;
    if (c == 'u') {
      unsigned v = (unsigned)strtoul((char[5]){p[1], p[2], p[3], p[4], 0}, NULL, 16);
      p += 4;
      if (v >= 0xD800 && v < 0xDC00 && p[1] == '\\' && p[2] == 'u') {
        unsigned lo = (unsigned)strtoul((char[5]){p[3], p[4], p[5], p[6], 0}, NULL, 16);
        v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        p += 6;
      }
      k += (size_t)tok_utf8_put(v, out + k);
    } else {
      out[k++] = c == 'n'   ? '\n'
                 : c == 't' ? '\t'
                 : c == 'r' ? '\r'
                 : c == 'b' ? '\b'
                 : c == 'f' ? '\f'
                            : c;
    }
  }
  out[k] = '\0';
  *end = *p ? p + 1 : p;
  return out;
}

/* The string value of the next `key` ("\"name\"") in s. */
static char *json_str_after(const char *s, const char *key, const char **end) {
  const char *p = strstr(s, key);
  return p ? json_str_at(p + strlen(key), end) : NULL;
}

/* The next JSON integer array after `key`: count, ids into out (cap). */
static size_t json_ids_after(const char *s, const char *key, int32_t *out, size_t cap,
                             const char **end) {
  const char *p = strstr(s, key);
  size_t n = 0;
  if (!p || !(p = strchr(p, '['))) return 0;
  for (p++; *p && *p != ']';) {
    char *e;
    long v = strtol(p, &e, 10);
    if (e == p) {
      p++;
      continue;
    }
    if (n < cap) out[n] = (int32_t)v;
    n++;
    p = e;
  }
  *end = p;
  return n;
}

static int is_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
  return na <= nb && memcmp(a, b, na * sizeof *a) == 0;
}

static void stories_case(const tok_t *t, const char *prompt, const int32_t *gold, size_t ng,
                         const char *text) {
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK_OK(tok_encode(t, prompt, strlen(prompt), tok_add_bos(t), 0, &ids, &n));
  CHECK(n > 1 && ids[0] == 1 && is_prefix(ids, n, gold, ng));
  CHECK(dec_is(t, gold, ng, 0, 1, text));
  /* the stream gives the same text, token by token */
  tok_stream_t st;
  tok_stream_init(&st, t, 0, 1);
  char *acc = calloc(1, strlen(text) + 64), buf[64];
  size_t k = 0;
  for (size_t i = 0; i < ng; i++) {
    int r = tok_stream_push(&st, gold[i], buf, sizeof buf);
    CHECK(r >= 0);
    if (r > 0 && k + (size_t)r < strlen(text) + 64) memcpy(acc + k, buf, (size_t)r), k += (size_t)r;
  }
  CHECK(strcmp(acc, text) == 0);
  free(acc);
  free(ids);
}

static void test_stories(void) {
  const char *mp = tu_env_path("QE_SHARED_MODELS", "stories260K.gguf");
  gguf_t *g = NULL;
  if (!mp || gguf_open(mp, &g) != 0) {
    fprintf(stderr, "  (stories260K.gguf absent: skipped)\n");
    return;
  }
  tok_t *t = NULL;
  CHECK_OK(tok_create(g, &t));
  gguf_close(g);
  char *json = tu_read_file(tu_env_path("QE_SHARED_MODELS", "stories260K.golden.json"), NULL);
  CHECK(t && json);
  const char *p = json ? strstr(json, "\"cases\"") : NULL;
  p = p ? strchr(p, '{') : NULL; /* cases: {"prompt": {"tokens": [...], "text": "..."}, ...} */
  int n_cases = 0;
  while (t && p && (p = strpbrk(p + 1, "\"}")) && *p == '"') {
    const char *e;
    char *prompt = json_str_at(p, &e);
    int32_t gold[1024];
    size_t ng = json_ids_after(e, "\"tokens\"", gold, 1024, &e);
    char *text = json_str_after(e, "\"text\"", &e);
    if (prompt && text && ng > 0 && ng <= 1024) stories_case(t, prompt, gold, ng, text), n_cases++;
    free(prompt);
    free(text);
    p = strchr(e, '}'); /* the case's closing brace */
  }
  CHECK(n_cases >= 2);
  free(json);
  tok_destroy(t);
}

/* ---- SmolLM2-135M-Instruct against HF transformers ---- */

static int smol_case(const tok_t *t, const char *text, const int32_t *want, size_t nw) {
  int ok = enc_is(t, text, 0, 1, want, nw);
  char *back = NULL;
  int32_t *ids = NULL;
  size_t n = 0;
  if (tok_encode(t, text, strlen(text), 0, 1, &ids, &n) == 0 &&
      tok_decode(t, ids, n, 1, 0, &back) == 0 && strcmp(back, text) != 0) {
    fprintf(stderr, "  round trip of '%s' gave '%s'\n", text, back);
    ok = 0;
  }
  free(back);
  free(ids);
  return ok;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void smol_long_doc(const tok_t *t) {
  static const char para[] =
      "The quick brown fox, 1234 times; naïve café — 你好世界! \tdef f(x): return x**2\n";
  size_t plen = strlen(para), reps = 400;
  char *doc = malloc(plen * reps + 1);
  for (size_t i = 0; i < reps; i++) memcpy(doc + i * plen, para, plen);
  doc[plen * reps] = '\0';
  int32_t *ids = NULL;
  size_t n = 0;
  double t0 = now_ms();
  CHECK_OK(tok_encode(t, doc, plen * reps, 0, 0, &ids, &n));
  double ms = now_ms() - t0;
  fprintf(stderr, "  encoded %zu bytes -> %zu tokens in %.1f ms\n", plen * reps, n, ms);
  CHECK(n >= 10000); /* the time is printed, never asserted (speed belongs to bench/) */
  free(ids);
  free(doc);
}

static void smol_chat(const tok_t *t, const gguf_t *g) {
  CHECK(chat_kind_of(g) == CHAT_CHATML);
  char *s = NULL;
  CHECK_OK(chat_render(chat_kind_of(g), g, conv3, 1, 1, &s));
  CHECK(s && strcmp(s, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
                       "by Hugging Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                       "<|im_start|>assistant\n") == 0);
  /* HF: tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}],
   * add_generation_prompt=True, tokenize=True) */
  static const int32_t want[] = {1,    9690,  198,   2683, 359, 253, 5356,  5646, 11173, 3365, 3511,
                                 308,  34519, 28,    7018, 411, 407, 19712, 8182, 2,     198,  1,
                                 4093, 198,   26843, 665,  2,   198, 1,     520,  9531,  198};
  int32_t *ids = NULL;
  size_t n = 0;
  if (s) CHECK_OK(tok_encode(t, s, strlen(s), tok_add_bos(t), 1, &ids, &n));
  CHECK(n == NELEMS(want) && memcmp(ids, want, sizeof want) == 0);
  CHECK(tok_eot(t) == 2 && tok_is_eog(t, 2) && tok_is_eog(t, 0) && !tok_is_eog(t, 1));
  free(ids);
  free(s);
}

static void test_smollm2(void) {
  const char *mp = getenv("QE_SMOLLM2");
  gguf_t *g = NULL;
  if (!mp || gguf_open(mp, &g) != 0) {
    fprintf(stderr, "  (SmolLM2 GGUF absent at $QE_SMOLLM2: skipped)\n");
    return;
  }
  tok_t *t = NULL;
  CHECK_OK(tok_create(g, &t));
  char *json = tu_read_file(tu_env_path("QE_FIXTURES", "smollm2_tok.json"), NULL);
  CHECK(t && json);
  const char *p = json ? strstr(json, "\"cases\"") : NULL;
  int n_cases = 0, n_ok = 0;
  while (t && p && strstr(p, "\"text\"")) {
    const char *e;
    char *text = json_str_after(p, "\"text\"", &e);
    int32_t want[512];
    size_t nw = json_ids_after(e, "\"ids\"", want, 512, &e);
    if (text && nw <= 512) n_ok += smol_case(t, text, want, nw), n_cases++;
    free(text);
    p = strchr(e, '}');
  }
  fprintf(stderr, "  SmolLM2: %d/%d fixture strings match HF\n", n_ok, n_cases);
  CHECK(n_cases >= 40 && n_ok == n_cases);
  if (t) smol_long_doc(t), smol_chat(t, g);
  free(json);
  tok_destroy(t);
  gguf_close(g);
}

int main(void) {
  test_utf8();
  test_classes();
  test_pretok();
  test_spm_toy();
  test_bpe_toy();
  test_bad_metadata();
  test_chat();
  test_stories();
  test_smollm2();
  return tu_done("tokenizer");
}
