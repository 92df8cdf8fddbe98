/* tok_decode: token ids -> text. One token's bytes (SPM: U+2581 -> space, <0xXX> -> byte;
 * BPE: GPT-2 byte-level characters -> bytes; control / unknown / unused tokens only when
 * render_special), the streaming detokenizer that holds back an incomplete UTF-8 sequence
 * until the token that completes it arrives (malformed bytes become U+FFFD, one per maximal
 * subpart, as Python's errors="replace" does), and whole-sequence decoding on top of it. */
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "tok_internal.h"
#include "unicode_tables.h"

static int copy_out(const char *s, size_t n, char *buf, size_t cap) {
  if (n > cap)
    return qe_errf(QE_ENOSPC, "tokenizer: token text of %zu bytes, room for %zu", n, cap);
  memcpy(buf, s, n);
  return (int)n;
}

/* SPM text: U+2581 -> ' '. */
static int spm_unescape(const char *s, size_t n, char *buf, size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < n; k++) {
    int sp = i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0;
    if (k >= cap) return qe_errf(QE_ENOSPC, "tokenizer: token text longer than %zu", cap);
    buf[k] = sp ? ' ' : s[i];
    i += sp ? 3 : 1;
  }
  return (int)k;
}

static int is_text_type(int ty) {
  return ty == TOK_TYPE_NORMAL || ty == TOK_TYPE_USER || ty == TOK_TYPE_BYTE ||
         ty == TOK_TYPE_UNDEFINED;
}

int tok_token_bytes(const tok_t *t, int id, int render_special, char *buf, size_t cap) {
  if (id < 0 || id >= t->n_vocab)
    return qe_errf(QE_ERANGE, "tokenizer: token id %d (vocabulary of %d)", id, t->n_vocab);
  const char *p = tok__piece(t, id);
  size_t n = tok__piece_len(t, id);
  int ty = t->types[id];
  if (!is_text_type(ty)) return render_special ? copy_out(p, n, buf, cap) : 0;
  int b = ty == TOK_TYPE_BYTE ? tok_byte_piece(p, n) : -1;
  if (b >= 0) {
    char c = (char)b;
    return copy_out(&c, 1, buf, cap);
  }
  if (t->kind == TOK_KIND_SPM) return spm_unescape(p, n, buf, cap);
  if (ty == TOK_TYPE_USER) return copy_out(p, n, buf, cap);
  return tok_bpe_unmap(p, n, buf, cap);
}

/* ---- streaming ---- */

void tok_stream_init(tok_stream_t *s, const tok_t *t, int render_special, int strip_lead) {
  memset(s, 0, sizeof *s);
  s->tok = t;
  s->render_special = render_special;
  s->strip_lead = strip_lead;
}

static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Writes the complete code points of b[0..n) to out, keeps an incomplete tail in s->pend. */
static int stream_utf8(tok_stream_t *s, const unsigned char *b, size_t n, char *out, size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int r = tok_utf8_next(b + i, n - i, &cp);
    if (r == 0) { /* a well-formed beginning cut short: at most 3 bytes */
      memcpy(s->pend, b + i, n - i);
      s->n_pend = (int)(n - i);
      break;
    }
    size_t len = r > 0 ? (size_t)r : 3;
    if (k + len > cap) return qe_errf(QE_ENOSPC, "tokenizer: stream output over %zu bytes", cap);
    memcpy(out + k, r > 0 ? (const char *)b + i : fffd, len);
    k += len;
    i += r > 0 ? (size_t)r : (size_t)-r;
  }
  return (int)k;
}

/* The token's bytes into tb (room for its piece), less a stripped leading space. */
static int stream_token(tok_stream_t *s, int id, char *tb, size_t room, int *skip) {
  const struct tok *t = s->tok;
  int n = tok_token_bytes(t, id, s->render_special, tb, room);
  *skip = 0;
  if (n <= 0 || !is_text_type(t->types[id])) return n;
  if (s->strip_lead && !s->n_seen && t->kind == TOK_KIND_SPM && t->add_space_prefix && tb[0] == ' ')
    *skip = 1;
  s->n_seen++;
  return n;
}

int tok_stream_push(tok_stream_t *s, int id, char *out, size_t cap) {
  const struct tok *t = s->tok;
  if (id < 0 || id >= t->n_vocab)
    return qe_errf(QE_ERANGE, "tokenizer: token id %d (vocabulary of %d)", id, t->n_vocab);
  char stack[512], *heap = NULL, *b = stack;
  size_t room = tok__piece_len(t, id) + 1, pre = sizeof s->pend;
  if (pre + room > sizeof stack && !(b = heap = malloc(pre + room)))
    return qe_errf(QE_ENOMEM, "tokenizer: token %d", id);
  int skip, n = stream_token(s, id, b + pre, room, &skip);
  if (n >= 0) {
    unsigned char *start = (unsigned char *)b + pre + skip - s->n_pend;
    memcpy(start, s->pend, (size_t)s->n_pend);
    size_t total = (size_t)s->n_pend + (size_t)(n - skip);
    s->n_pend = 0;
    n = stream_utf8(s, start, total, out, cap);
  }
  free(heap);
  return n;
}

size_t tok_stream_room(const tok_stream_t *s, int id) {
  if (id < 0 || id >= s->tok->n_vocab) return 0;
  return 3 * (tok__piece_len(s->tok, id) + sizeof s->pend);
}

int tok_stream_emit(tok_stream_t *s, int id, void (*emit)(void *ud, const char *text, size_t n),
                    void *ud) {
  char stack[256], *buf = stack;
  const size_t room = tok_stream_room(s, id);
  if (room > sizeof stack && !(buf = malloc(room)))
    return qe_errf(QE_ENOMEM, "tokenizer: %zu bytes for token %d's text", room, id);
  const int n = tok_stream_push(s, id, buf, room > sizeof stack ? room : sizeof stack);
  if (n > 0) emit(ud, buf, (size_t)n);
  if (buf != stack) free(buf);
  return n;
}

int tok_stream_flush(tok_stream_t *s, char *out, size_t cap) {
  if (s->n_pend == 0) return 0;
  if (cap < 3) return qe_errf(QE_ENOSPC, "tokenizer: stream flush needs 3 bytes");
  s->n_pend = 0;
  memcpy(out, fffd, 3);
  return 3;
}

/* ---- whole sequences ---- */

static int grow(char **buf, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  char *p = realloc(*buf, c);
  if (!p) return qe_errf(QE_ENOMEM, "tokenizer: %zu bytes of text", c);
  *buf = p;
  *cap = c;
  return 0;
}

int tok_decode(const tok_t *t, const int32_t *ids, size_t n, int render_special, int strip_lead,
               char **text) {
  size_t len = 0;
  return tok_decode_len(t, ids, n, render_special, strip_lead, text, &len);
}

int tok_decode_len(const tok_t *t, const int32_t *ids, size_t n, int render_special, int strip_lead,
                   char **text, size_t *out_len) {
  tok_stream_t s;
  tok_stream_init(&s, t, render_special, strip_lead);
  char *buf = NULL;
  size_t cap = 0, len = 0;
  int rc = grow(&buf, &cap, 16);
  for (size_t i = 0; i < n && rc >= 0; i++) {
    rc = grow(&buf, &cap, len + tok_stream_room(&s, ids[i]) + 4);
    if (rc >= 0) rc = tok_stream_push(&s, ids[i], buf + len, cap - len - 4);
    if (rc > 0) len += (size_t)rc;
  }
  if (rc >= 0) rc = tok_stream_flush(&s, buf + len, cap - len);
  if (rc < 0) {
    free(buf);
    *text = NULL;
    return rc;
  }
  len += (size_t)rc;
  buf[len] = '\0';
  *text = buf, *out_len = len;
  return 0;
}
