/* tok_spm: SentencePiece-BPE encoding ("llama" GGUF vocabularies), bit-for-bit the algorithm
 * of llama2.c / llama.cpp: spaces become U+2581 (with one dummy-prefix space in front of the
 * text when asked), the text is split into UTF-8 characters, and the adjacent pair whose
 * concatenation is a vocabulary piece with the highest score is merged, leftmost first on ties,
 * until no pair is a piece. A character that is no piece comes out as byte-fallback tokens
 * <0xXX> (or <unk> without them). Also holds the merge-candidate heap shared with tok_bpe.c. */
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "tok_internal.h"
#include "unicode_tables.h"

/* ---- the candidate heap: min on (prio, left) ---- */

static int cand_less(const tok_cand_t *a, const tok_cand_t *b) {
  return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

int tok_heap_push(tok_heap_t *h, tok_cand_t c) {
  if (h->n == h->cap) {
    int cap = h->cap ? h->cap * 2 : 64;
    tok_cand_t *v = realloc(h->v, (size_t)cap * sizeof *v);
    if (!v) return qe_errf(QE_ENOMEM, "tokenizer: merge heap");
    h->v = v;
    h->cap = cap;
  }
  int i = h->n++;
  while (i > 0 && cand_less(&c, &h->v[(i - 1) / 2])) {
    h->v[i] = h->v[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->v[i] = c;
  return 0;
}

tok_cand_t tok_heap_pop(tok_heap_t *h) {
  tok_cand_t top = h->v[0], last = h->v[--h->n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && cand_less(&h->v[c + 1], &h->v[c])) c++;
    if (!cand_less(&h->v[c], &last)) break;
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n > 0) h->v[i] = last;
  return top;
}

/* ---- SPM ---- */

typedef struct {
  int start, len, prev, next; /* len 0: merged away */
} spm_sym_t;

typedef struct {
  const struct tok *t;
  const char *buf;
  spm_sym_t *sym;
  tok_heap_t heap;
} spm_t;

/* " " -> U+2581, with a leading one when prefix. *out malloc'd. */
static int spm_escape(const char *s, size_t n, int prefix, char **out, size_t *len) {
  char *b = malloc(3 * (n + 1));
  if (!b) return qe_errf(QE_ENOMEM, "tokenizer: %zu bytes of text", n);
  size_t k = 0;
  if (prefix) memcpy(b + k, "\xE2\x96\x81", 3), k += 3;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == ' ')
      memcpy(b + k, "\xE2\x96\x81", 3), k += 3;
    else
      b[k++] = s[i];
  }
  *out = b;
  *len = k;
  return 0;
}

/* One symbol per UTF-8 character (per byte where malformed). Returns the count. */
static int spm_split(spm_sym_t *sym, const char *b, size_t n) {
  int k = 0;
  for (size_t i = 0; i < n; k++) {
    uint32_t cp;
    int r = tok_utf8_next((const unsigned char *)b + i, n - i, &cp);
    int len = r > 0 ? r : 1;
    sym[k] = (spm_sym_t){(int)i, len, k - 1, -1};
    if (k > 0) sym[k - 1].next = k;
    i += (size_t)len;
  }
  return k;
}

static int spm_try_pair(spm_t *m, int l, int r) {
  if (l < 0 || r < 0) return 0;
  int size = m->sym[l].len + m->sym[r].len;
  int id = tok_vocab_find(m->t, m->buf + m->sym[l].start, (size_t)size);
  if (id < 0 || !tok_type_mergeable(m->t->types[id])) return 0;
  return tok_heap_push(&m->heap, (tok_cand_t){-m->t->scores[id], l, r, size});
}

static int spm_merge(spm_t *m, int n) {
  int rc = 0;
  for (int i = 0; i + 1 < n && !rc; i++) rc = spm_try_pair(m, i, i + 1);
  while (!rc && m->heap.n > 0) {
    tok_cand_t c = tok_heap_pop(&m->heap);
    spm_sym_t *l = &m->sym[c.left], *r = &m->sym[c.right];
    if (l->len == 0 || r->len == 0 || l->next != c.right || l->len + r->len != c.size) continue;
    l->len += r->len;
    r->len = 0;
    l->next = r->next;
    if (r->next >= 0) m->sym[r->next].prev = c.left;
    rc = spm_try_pair(m, l->prev, c.left);
    if (!rc) rc = spm_try_pair(m, c.left, l->next);
  }
  return rc;
}

/* A final symbol: its piece, else its bytes as <0xXX>, else <unk>. */
static int spm_emit(const spm_t *m, const spm_sym_t *s, tok_ivec_t *out) {
  const struct tok *t = m->t;
  int id = tok_vocab_find(t, m->buf + s->start, (size_t)s->len);
  if (id >= 0 && tok_type_mergeable(t->types[id])) return tok_ivec_push(out, id);
  for (int i = 0; i < s->len; i++) {
    int b = t->byte_id[(unsigned char)m->buf[s->start + i]];
    int rc = b >= 0 ? tok_ivec_push(out, b) : t->unk >= 0 ? tok_ivec_push(out, t->unk) : 0;
    if (rc) return rc;
  }
  return 0;
}

int tok_spm_encode(const struct tok *t, const char *s, size_t n, int prefix, tok_ivec_t *out) {
  char *buf = NULL;
  size_t len = 0;
  if (n > (size_t)(INT32_MAX / 4)) return qe_errf(QE_ERANGE, "tokenizer: text of %zu bytes", n);
  int rc = spm_escape(s, n, prefix, &buf, &len);
  if (rc) return rc;
  spm_t m = {.t = t, .buf = buf, .sym = malloc((len + 1) * sizeof(spm_sym_t))};
  if (!m.sym) rc = qe_errf(QE_ENOMEM, "tokenizer: %zu symbols", len);
  int nsym = rc ? 0 : spm_split(m.sym, buf, len);
  if (!rc) rc = spm_merge(&m, nsym);
  for (int i = 0; !rc && nsym > 0 && i >= 0; i = m.sym[i].next) rc = spm_emit(&m, &m.sym[i], out);
  free(m.heap.v);
  free(m.sym);
  free(buf);
  return rc;
}
