/* chat: the two chat templates qevict renders natively (no Jinja engine), recognised from
 * tokenizer.chat_template:
 *   ChatML  "<|im_start|>" role "\n" content "<|im_end|>\n" per message, generation prompt
 *           "<|im_start|>assistant\n". A default system message the template inserts when
 *           the first message is not a system one (SmolLM2, Qwen2.5) is read out of the
 *           template's own string literal "<|im_start|>system\n...<|im_end|>".
 *   Llama-3 "<|begin_of_text|>" (the BOS; tok_encode keeps one when add_bos is also set), then
 *           "<|start_header_id|>" role "<|end_header_id|>\n\n" content|trim "<|eot_id|>" per
 *           message, generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n". */
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "tokenizer.h"
#include "unicode_tables.h"

#define CHAT_KEY "tokenizer.chat_template"

typedef struct {
  char *s;
  size_t n, cap;
  int rc;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *s, size_t n) {
  if (b->rc) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) {
      b->rc = qe_errf(QE_ENOMEM, "chat: %zu bytes", cap);
      return;
    }
    b->s = p;
    b->cap = cap;
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = '\0';
}

static void sb_str(sbuf_t *b, const char *s) { sb_add(b, s, strlen(s)); }

static int template_of(const gguf_t *g, const char **s, size_t *n) {
  if (!g || gguf_find_key(g, CHAT_KEY) < 0) return QE_ENOTFOUND;
  return gguf_get_str(g, CHAT_KEY, s, n);
}

int chat_kind_of(const gguf_t *g) {
  const char *s;
  size_t n;
  if (template_of(g, &s, &n)) return CHAT_NONE;
  if (memmem(s, n, "<|im_start|>", 12)) return CHAT_CHATML;
  if (memmem(s, n, "<|start_header_id|>", 19)) return CHAT_LLAMA3;
  return CHAT_NONE;
}

/* ---- the default system message of a ChatML template ---- */

/* Length of "\n" or the Jinja escape "\\n" at s, else 0. */
static size_t newline_at(const char *s, const char *end) {
  if (s < end && *s == '\n') return 1;
  return end - s >= 2 && s[0] == '\\' && s[1] == 'n' ? 2 : 0;
}

/* Whether s[0..n) lies inside one string literal: no unescaped quote, no Jinja braces. */
static int literal_text(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\\')
      i++;
    else if (s[i] == '\'' || s[i] == '"' || s[i] == '{' || s[i] == '}')
      return 0;
  }
  return 1;
}

static void unescape_into(sbuf_t *b, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '\\' && i + 1 < n) {
      c = s[++i];
      c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
    }
    sb_add(b, &c, 1);
  }
}

/* Appends the template's default system text to b; returns 1 if there is one. */
static int default_system(const gguf_t *g, sbuf_t *b) {
  static const char tag[] = "<|im_start|>system", fin[] = "<|im_end|>";
  const char *s, *end;
  size_t n;
  if (template_of(g, &s, &n)) return 0;
  for (end = s + n; (s = memmem(s, (size_t)(end - s), tag, sizeof tag - 1)); s++) {
    const char *p = s + sizeof tag - 1;
    size_t nl = newline_at(p, end);
    const char *q = nl ? memmem(p + nl, (size_t)(end - p - nl), fin, sizeof fin - 1) : NULL;
    if (!q || q == p + nl || !literal_text(p + nl, (size_t)(q - p - nl))) continue;
    unescape_into(b, p + nl, (size_t)(q - p - nl));
    return 1;
  }
  return 0;
}

/* ---- renderers ---- */

static void chatml_msg(sbuf_t *b, const char *role, const char *content) {
  sb_str(b, "<|im_start|>");
  sb_str(b, role);
  sb_str(b, "\n");
  sb_str(b, content);
  sb_str(b, "<|im_end|>\n");
}

static void render_chatml(sbuf_t *b, const gguf_t *g, const chat_msg_t *m, size_t n, int gen) {
  if (n > 0 && strcmp(m[0].role, "system") != 0) {
    sbuf_t sys = {0};
    if (default_system(g, &sys) && !sys.rc) chatml_msg(b, "system", sys.s);
    if (sys.rc) b->rc = sys.rc;
    free(sys.s);
  }
  for (size_t i = 0; i < n; i++) chatml_msg(b, m[i].role, m[i].content);
  if (gen) sb_str(b, "<|im_start|>assistant\n");
}

/* Jinja's |trim (Python str.strip()): white space at both ends removed. */
static int py_space(uint32_t cp) {
  return (cp >= 0x1C && cp <= 0x1F) || tok_uni_class(cp) == TOK_UNI_S;
}

static void add_trimmed(sbuf_t *b, const char *s) {
  size_t n = strlen(s), start = n, stop = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp = 0xFFFD;
    int r = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
    size_t len = r > 0 ? (size_t)r : r < 0 ? (size_t)-r : n - i;
    if (r <= 0 || !py_space(cp)) {
      if (start == n) start = i;
      stop = i + len;
    }
    i += len;
  }
  if (start < stop) sb_add(b, s + start, stop - start);
}

static void render_llama3(sbuf_t *b, const chat_msg_t *m, size_t n, int gen) {
  for (size_t i = 0; i < n; i++) {
    if (i == 0) sb_str(b, "<|begin_of_text|>");
    sb_str(b, "<|start_header_id|>");
    sb_str(b, m[i].role);
    sb_str(b, "<|end_header_id|>\n\n");
    add_trimmed(b, m[i].content);
    sb_str(b, "<|eot_id|>");
  }
  if (gen) sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

int chat_render(int kind, const gguf_t *g, const chat_msg_t *msgs, size_t n,
                int add_generation_prompt, char **out) {
  *out = NULL;
  if (kind != CHAT_CHATML && kind != CHAT_LLAMA3)
    return qe_errf(QE_EUNSUPPORTED, "chat: no supported chat template (kind %d)", kind);
  for (size_t i = 0; i < n; i++)
    if (!msgs[i].role || !msgs[i].content)
      return qe_errf(QE_EINVAL, "chat: message %zu without role or content", i);
  sbuf_t b = {0};
  sb_add(&b, "", 0);
  if (kind == CHAT_CHATML)
    render_chatml(&b, g, msgs, n, add_generation_prompt);
  else
    render_llama3(&b, msgs, n, add_generation_prompt);
  if (b.rc) {
    free(b.s);
    return b.rc;
  }
  *out = b.s;
  return 0;
}
