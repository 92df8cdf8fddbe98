/* tok_pretok: the byte-level BPE pre-tokenizers as hand-written scanners (no regex engine),
 * plus the Unicode class lookup and UTF-8 decoding they stand on. Each scanner returns the
 * length of the regex match at a position, following the regex's alternation order:
 *   gpt2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   smollm every \p{N} is its own chunk first (HF Digits(individual_digits)); the gpt2 regex
 *          then runs on each stretch between digits, which ends its string
 *   llama3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   qwen2  the llama3 regex with \p{N} instead of \p{N}{1,3}
 * Malformed UTF-8 is scanned as U+FFFD-like "other" characters (one per maximal subpart). */
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "tok_internal.h"
#include "unicode_tables.h"

enum { C_L = TOK_UNI_L, C_N = TOK_UNI_N, C_S = TOK_UNI_S, C_LNS = C_L | C_N | C_S };

int tok_uni_class(uint32_t cp) {
  int lo = 0, hi = tok_uni_n_ranges - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (cp < tok_uni_ranges[mid].lo)
      hi = mid - 1;
    else if (cp > tok_uni_ranges[mid].hi)
      lo = mid + 1;
    else
      return (int)tok_uni_ranges[mid].cls;
  }
  return 0;
}

int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned b0 = s[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  if (b0 < 0xC2 || b0 > 0xF4) return -1;
  int need = b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  unsigned lo = b0 == 0xE0 ? 0xA0 : b0 == 0xF0 ? 0x90 : 0x80;
  unsigned hi = b0 == 0xED ? 0x9F : b0 == 0xF4 ? 0x8F : 0xBF;
  uint32_t v = b0 & (0x7Fu >> need);
  for (int k = 1; k < need; k++) {
    if ((size_t)k >= n) return 0;
    unsigned c = s[k];
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return -k;
    v = (v << 6) | (c & 0x3F);
  }
  *cp = v;
  return need;
}

int tok_utf8_put(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

static const struct {
  const char *name;
  int pre;
} pre_names[] = {
    {"default", TOK_PRE_GPT2},  {"gpt2", TOK_PRE_GPT2},        {"gpt-2", TOK_PRE_GPT2},
    {"smollm", TOK_PRE_SMOLLM}, {"starcoder", TOK_PRE_SMOLLM}, {"llama-bpe", TOK_PRE_LLAMA3},
    {"llama3", TOK_PRE_LLAMA3}, {"llama-v3", TOK_PRE_LLAMA3},  {"qwen2", TOK_PRE_QWEN2},
};

int tok_pre_from_name(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
    if (strlen(pre_names[i].name) == len && memcmp(pre_names[i].name, name, len) == 0)
      return pre_names[i].pre;
  return qe_errf(QE_EUNSUPPORTED, "tokenizer: pre-tokenizer '%.*s' (tokenizer.ggml.pre)",
                 (int)(len > 64 ? 64 : len), name);
}

/* The decoded fragment: code points, their classes and byte offsets. */
typedef struct {
  const char *s;
  uint32_t *cp; /* [n] */
  uint32_t *at; /* [n + 1] byte offset of each code point */
  uint8_t *cls; /* [n] TOK_UNI_* (0 for malformed bytes) */
  int n;
  tok_emit_fn emit;
  void *ctx;
} scan_t;

static int scan_decode(scan_t *sc, const char *s, size_t len) {
  sc->s = s;
  sc->cp = malloc((len + 1) * sizeof *sc->cp);
  sc->at = malloc((len + 1) * sizeof *sc->at);
  sc->cls = malloc(len + 1);
  if (!sc->cp || !sc->at || !sc->cls) return qe_errf(QE_ENOMEM, "tokenizer: pre-tokenizer");
  int n = 0;
  for (size_t i = 0; i < len; n++) {
    uint32_t cp = 0xFFFD;
    int r = tok_utf8_next((const unsigned char *)s + i, len - i, &cp);
    sc->cp[n] = r > 0 ? cp : 0xFFFD;
    sc->cls[n] = r > 0 ? (uint8_t)tok_uni_class(cp) : 0;
    sc->at[n] = (uint32_t)i;
    i += r > 0 ? (size_t)r : r < 0 ? (size_t)-r : 1;
  }
  sc->at[n] = (uint32_t)len;
  sc->n = n;
  return 0;
}

/* First index >= i in [i, end) whose class is not `cls`. */
static int run_of(const scan_t *sc, int i, int end, int cls) {
  while (i < end && sc->cls[i] == cls) i++;
  return i;
}

/* First index >= i whose character is a letter, number or whitespace. */
static int run_other(const scan_t *sc, int i, int end) {
  while (i < end && !(sc->cls[i] & C_LNS)) i++;
  return i;
}

/* Simple case folding for the contraction letters: ASCII, plus U+017F (long s) -> 's'. */
static uint32_t fold(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c == 0x17F ? 's' : c; }

/* 's 't 're 've 'm 'll 'd at i: the match length, or 0. */
static int contraction(const scan_t *sc, int i, int end, int icase) {
  if (sc->cp[i] != '\'' || i + 1 >= end) return 0;
  uint32_t a = sc->cp[i + 1], b = i + 2 < end ? sc->cp[i + 2] : 0;
  if (icase) {
    a = fold(a);
    b = fold(b);
  }
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

/* \s+(?!\S)|\s+ at i (a whitespace character): end index of the match. */
static int ws_tail(const scan_t *sc, int i, int end) {
  int j = run_of(sc, i, end, C_S);
  return (j < end && j - i > 1) ? j - 1 : j;
}

static int scan_gpt2(const scan_t *sc, int i, int end) {
  int k = contraction(sc, i, end, 0);
  if (k) return k;
  int j = i + (sc->cp[i] == ' ' && i + 1 < end);
  int c = sc->cls[j];
  if (c == C_L || c == C_N) return run_of(sc, j, end, c) - i;
  if (!(c & C_LNS)) return run_other(sc, j, end) - i;
  return ws_tail(sc, i, end) - i;
}

static int is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

/* \s*[\r\n]+|\s+(?!\S)|\s+ at i (a whitespace character): end index of the match. */
static int ws_llama3(const scan_t *sc, int i, int end) {
  int e = run_of(sc, i, end, C_S);
  for (int p = e - 1; p >= i; p--)
    if (is_nl(sc->cp[p])) return p + 1;
  return ws_tail(sc, i, end);
}

static int scan_llama3(const scan_t *sc, int i, int end, int max_digits) {
  int k = contraction(sc, i, end, 1);
  if (k) return k;
  int c = sc->cls[i];
  if (c == C_L) return run_of(sc, i, end, C_L) - i;
  if (c != C_N && !is_nl(sc->cp[i]) && i + 1 < end && sc->cls[i + 1] == C_L)
    return run_of(sc, i + 1, end, C_L) - i;
  if (c == C_N) {
    int j = i;
    while (j < end && j - i < max_digits && sc->cls[j] == C_N) j++;
    return j - i;
  }
  int j = i + (sc->cp[i] == ' ' && i + 1 < end);
  if (!(sc->cls[j] & C_LNS)) {
    j = run_other(sc, j, end);
    while (j < end && is_nl(sc->cp[j])) j++;
    return j - i;
  }
  return ws_llama3(sc, i, end) - i;
}

static int scan_one(const scan_t *sc, int pre, int i, int end) {
  switch (pre) {
  case TOK_PRE_LLAMA3:
    return scan_llama3(sc, i, end, 3);
  case TOK_PRE_QWEN2:
    return scan_llama3(sc, i, end, 1);
  default:
    return scan_gpt2(sc, i, end);
  }
}

static int emit_cps(const scan_t *sc, int i, int j) {
  return sc->emit(sc->ctx, sc->s + sc->at[i], sc->at[j] - sc->at[i]);
}

/* Scans [from, to) as one string with the regex of pre. */
static int scan_range(const scan_t *sc, int pre, int from, int to) {
  for (int i = from; i < to;) {
    int len = scan_one(sc, pre, i, to);
    int rc = emit_cps(sc, i, i + len);
    if (rc) return rc;
    i += len;
  }
  return 0;
}

/* smollm: digits isolated first, then gpt2 on the stretches between them. */
static int scan_digits_gpt2(const scan_t *sc) {
  int start = 0, rc = 0;
  for (int i = 0; i < sc->n && !rc; i++) {
    if (sc->cls[i] != C_N) continue;
    rc = scan_range(sc, TOK_PRE_GPT2, start, i);
    if (!rc) rc = emit_cps(sc, i, i + 1);
    start = i + 1;
  }
  return rc ? rc : scan_range(sc, TOK_PRE_GPT2, start, sc->n);
}

int tok_pretok_split(int pre, const char *s, size_t n, tok_emit_fn emit, void *ctx) {
  if (n == 0) return 0;
  if (n > UINT32_MAX - 1) return qe_errf(QE_ERANGE, "tokenizer: text of %zu bytes", n);
  scan_t sc = {.emit = emit, .ctx = ctx};
  int rc = scan_decode(&sc, s, n);
  if (!rc) rc = pre == TOK_PRE_SMOLLM ? scan_digits_gpt2(&sc) : scan_range(&sc, pre, 0, sc.n);
  free(sc.cp);
  free(sc.at);
  free(sc.cls);
  return rc;
}
