/* tok_bpe: byte-level BPE ("gpt2" GGUF vocabularies) as GPT-2 / HF tokenizers do it. The
 * text is cut into chunks by the model's pre-tokenizer (tok_pretok.c); each chunk's bytes
 * become GPT-2 byte-level characters (one vocabulary token each), and the adjacent pair with
 * the lowest merge rank (tokenizer.ggml.merges order, "left right" strings) is merged,
 * leftmost first on ties, until no pair has a merge. Merges are kept as (left id, right id)
 * -> (merged id, rank) in an open-addressing hash. Merges that would produce a control
 * token are dropped, so specials only ever come from matching their text. */
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "tok_internal.h"
#include "unicode_tables.h"

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
 * bytes map in order to U+0100.. (0x00-0x20 -> U+0100-0120, 0x7F-0xA0 -> U+0121-0142,
 * 0xAD -> U+0143). */
static uint32_t byte_to_cp(int b) {
  if (b <= 0x20) return 0x100u + (uint32_t)b;
  if (b >= 0x7F && b <= 0xA0) return (uint32_t)b + 0xA2u;
  if (b == 0xAD) return 0x143;
  return (uint32_t)b;
}

static int cp_to_byte(uint32_t cp) {
  if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xFF && cp != 0xAD)) return (int)cp;
  if (cp >= 0x100 && cp <= 0x120) return (int)(cp - 0x100);
  if (cp >= 0x121 && cp <= 0x142) return (int)(cp - 0xA2);
  if (cp == 0x143) return 0xAD;
  return -1;
}

int tok_bpe_unmap(const char *piece, size_t len, char *buf, size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < len;) {
    uint32_t cp;
    int r = tok_utf8_next((const unsigned char *)piece + i, len - i, &cp);
    size_t step = r > 0 ? (size_t)r : 1;
    int b = r > 0 ? cp_to_byte(cp) : -1;
    size_t nb = b >= 0 ? 1 : step; /* text that is no byte-level character is copied as is */
    if (k + nb > cap) return qe_errf(QE_ENOSPC, "tokenizer: token text longer than %zu", cap);
    if (b >= 0)
      buf[k] = (char)b;
    else
      memcpy(buf + k, piece + i, nb);
    k += nb;
    i += step;
  }
  return (int)k;
}

/* ---- merges ---- */

static uint32_t pair_hash(int32_t a, int32_t b) {
  uint64_t x = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (uint32_t)x;
}

static const tok_merge_t *merge_find(const struct tok *t, int32_t a, int32_t b) {
  uint32_t mask = t->mcap - 1;
  for (uint32_t i = pair_hash(a, b) & mask;; i = (i + 1) & mask) {
    const tok_merge_t *m = &t->mhash[i];
    if (m->a < 0) return NULL;
    if (m->a == a && m->b == b) return m;
  }
}

/* Inserts unless the pair is already there (the first, lowest rank wins). */
static void merge_insert(struct tok *t, tok_merge_t m) {
  uint32_t mask = t->mcap - 1;
  uint32_t i = pair_hash(m.a, m.b) & mask;
  while (t->mhash[i].a >= 0 && !(t->mhash[i].a == m.a && t->mhash[i].b == m.b)) i = (i + 1) & mask;
  if (t->mhash[i].a < 0) t->mhash[i] = m;
}

/* Parses merge `rank` ("left right"; the separator is the first space after the first byte). */
static int merge_parse(struct tok *t, const gguf_arr_t *a, size_t rank, char *tmp) {
  const char *s;
  size_t n;
  int rc = gguf_arr_str(a, rank, &s, &n);
  if (rc) return rc;
  const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
  if (!sp || sp == s + n - 1)
    return qe_errf(QE_EFORMAT, "tokenizer: merge %zu '%.*s' is not 'left right'", rank,
                   (int)(n > 64 ? 64 : n), s);
  size_t nl = (size_t)(sp - s), nr = n - nl - 1;
  memcpy(tmp, s, nl);
  memcpy(tmp + nl, sp + 1, nr);
  int l = tok_vocab_find(t, s, nl), r = tok_vocab_find(t, sp + 1, nr);
  int id = tok_vocab_find(t, tmp, nl + nr);
  if (l < 0 || r < 0 || id < 0)
    return qe_errf(QE_EFORMAT, "tokenizer: merge %zu '%.*s': '%.*s' is not in the vocabulary", rank,
                   (int)(n > 64 ? 64 : n), s,
                   (int)(l < 0   ? nl
                         : r < 0 ? nr
                                 : nl + nr),
                   l < 0   ? s
                   : r < 0 ? sp + 1
                           : tmp);
  if (tok_type_mergeable(t->types[id])) merge_insert(t, (tok_merge_t){l, r, id, (int32_t)rank});
  return 0;
}

static int load_merges(struct tok *t, const gguf_t *g) {
  gguf_arr_t a;
  int rc = gguf_get_arr(g, "tokenizer.ggml.merges", &a);
  if (rc == QE_ENOTFOUND)
    return qe_errf(rc, "tokenizer: BPE vocabulary without tokenizer.ggml.merges");
  if (rc) return rc;
  if (a.elem_type != GGUF_VT_STRING)
    return qe_errf(QE_EFORMAT, "tokenizer: tokenizer.ggml.merges is not a string array");
  if (a.n > (1u << 24)) /* ranks must stay exact as heap priorities (float) */
    return qe_errf(QE_EFORMAT, "tokenizer: %zu merges", a.n);
  uint32_t cap = 16;
  while (cap < a.n * 2) cap *= 2;
  t->mhash = malloc(cap * sizeof *t->mhash);
  char *tmp = malloc(t->off[t->n_vocab] + 1); /* no merge is longer than all pieces */
  if (!t->mhash || !tmp) {
    free(tmp);
    return qe_errf(QE_ENOMEM, "tokenizer: %zu merges", a.n);
  }
  memset(t->mhash, 0xFF, cap * sizeof *t->mhash);
  t->mcap = cap;
  for (size_t i = 0; i < a.n && !rc; i++) rc = merge_parse(t, &a, i, tmp);
  free(tmp);
  return rc;
}

int tok_bpe_load(struct tok *t, const gguf_t *g) {
  for (int b = 0; b < 256; b++) {
    char u[4];
    int n = tok_utf8_put(byte_to_cp(b), u);
    t->byte_id[b] = tok_vocab_find(t, u, (size_t)n);
  }
  return load_merges(t, g);
}

/* ---- encoding ---- */

typedef struct {
  int32_t id;
  int prev, next; /* next -2: merged away */
} bpe_sym_t;

typedef struct {
  const struct tok *t;
  tok_ivec_t *out;
  bpe_sym_t *sym; /* scratch, grown to the longest chunk */
  size_t cap;
  tok_heap_t heap;
} bpe_t;

static int bpe_try_pair(bpe_t *w, int l, int r) {
  if (l < 0 || r < 0 || w->sym[l].id < 0 || w->sym[r].id < 0) return 0;
  const tok_merge_t *m = merge_find(w->t, w->sym[l].id, w->sym[r].id);
  return m ? tok_heap_push(&w->heap, (tok_cand_t){(float)m->rank, l, r, m->id}) : 0;
}

static int bpe_merge(bpe_t *w, int n) {
  int rc = 0;
  w->heap.n = 0;
  for (int i = 0; i + 1 < n && !rc; i++) rc = bpe_try_pair(w, i, i + 1);
  while (!rc && w->heap.n > 0) {
    tok_cand_t c = tok_heap_pop(&w->heap);
    bpe_sym_t *l = &w->sym[c.left], *r = &w->sym[c.right];
    if (l->next != c.right || r->next == -2) continue;
    const tok_merge_t *m = merge_find(w->t, l->id, r->id);
    if (!m || m->id != c.size) continue; /* stale: a side changed since */
    l->id = c.size;
    l->next = r->next;
    r->next = -2;
    if (l->next >= 0) w->sym[l->next].prev = c.left;
    rc = bpe_try_pair(w, l->prev, c.left);
    if (!rc) rc = bpe_try_pair(w, c.left, l->next);
  }
  return rc;
}

static int bpe_chunk(void *ctx, const char *s, size_t n) {
  bpe_t *w = ctx;
  if (n > w->cap) {
    bpe_sym_t *p = realloc(w->sym, n * sizeof *p);
    if (!p) return qe_errf(QE_ENOMEM, "tokenizer: chunk of %zu bytes", n);
    w->sym = p;
    w->cap = n;
  }
  for (size_t i = 0; i < n; i++)
    w->sym[i] =
        (bpe_sym_t){w->t->byte_id[(unsigned char)s[i]], (int)i - 1, i + 1 < n ? (int)i + 1 : -1};
  int rc = bpe_merge(w, (int)n);
  for (int i = 0; !rc && i >= 0; i = w->sym[i].next) {
    int32_t id = w->sym[i].id >= 0 ? w->sym[i].id : w->t->unk;
    if (id >= 0) rc = tok_ivec_push(w->out, id);
  }
  return rc;
}

int tok_bpe_encode(const struct tok *t, const char *s, size_t n, tok_ivec_t *out) {
  if (n > (size_t)INT32_MAX) return qe_errf(QE_ERANGE, "tokenizer: text of %zu bytes", n);
  bpe_t w = {.t = t, .out = out};
  int rc = tok_pretok_split(t->pre, s, n, bpe_chunk, &w);
  free(w.sym);
  free(w.heap.v);
  return rc;
}
