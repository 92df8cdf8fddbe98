/* tokenizer: builds a tok_t from GGUF metadata (tokenizer.ggml.*) and encodes text.
 * Creation copies the vocabulary into one NUL-separated blob with an open-addressing hash
 * (piece -> id), reads the scores/types, the special ids and flags, and lets tok_spm.c or
 * tok_bpe.c add what their model needs. Encoding splits the text around special tokens
 * (leftmost-longest match, as HF's added-token matcher does) and hands each stretch of
 * raw text to the SPM or BPE encoder. Decoding lives in tok_decode.c. */
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "tok_internal.h"

#define TOK_KEY "tokenizer.ggml."

/* ---- small shared helpers ---- */

int tok_ivec_push(tok_ivec_t *v, int32_t id) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 64;
    int32_t *p = realloc(v->v, cap * sizeof *p);
    if (!p) return qe_errf(QE_ENOMEM, "tokenizer: %zu ids", cap);
    v->v = p;
    v->cap = cap;
  }
  v->v[v->n++] = id;
  return 0;
}

static uint32_t tok_hash(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

int tok_vocab_find(const struct tok *t, const char *s, size_t n) {
  uint32_t mask = t->vcap - 1;
  for (uint32_t i = tok_hash(s, n) & mask;; i = (i + 1) & mask) {
    int32_t id = t->vhash[i];
    if (id < 0) return -1;
    if (tok__piece_len(t, id) == n && memcmp(tok__piece(t, id), s, n) == 0) return id;
  }
}

static int hex_digit(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                : -1;
}

int tok_byte_piece(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
  int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

int tok_type_mergeable(int type) {
  return type == TOK_TYPE_NORMAL || type == TOK_TYPE_USER || type == TOK_TYPE_UNDEFINED;
}

/* ---- creation ---- */

/* Copies the pieces into t->text / t->off. */
static int load_pieces(struct tok *t, const gguf_arr_t *a) {
  size_t total = 0;
  for (size_t i = 0; i < a->n; i++) {
    const char *s;
    size_t len;
    int rc = gguf_arr_str(a, i, &s, &len);
    if (rc) return rc;
    total += len + 1;
  }
  if (total > UINT32_MAX) return qe_errf(QE_EFORMAT, "tokenizer: vocabulary text too large");
  t->text = malloc(total ? total : 1);
  t->off = malloc((a->n + 1) * sizeof *t->off);
  if (!t->text || !t->off) return qe_errf(QE_ENOMEM, "tokenizer: vocabulary");
  uint32_t pos = 0;
  for (size_t i = 0; i < a->n; i++) {
    const char *s;
    size_t len;
    gguf_arr_str(a, i, &s, &len);
    t->off[i] = pos;
    memcpy(t->text + pos, s, len);
    t->text[pos + len] = '\0';
    pos += (uint32_t)len + 1;
  }
  t->off[a->n] = pos;
  return 0;
}

/* Builds the piece -> id hash; a duplicated piece maps to its last id (as llama.cpp and HF). */
static int build_vhash(struct tok *t) {
  uint32_t cap = 16;
  while (cap < (uint32_t)t->n_vocab * 2u) cap *= 2;
  t->vhash = malloc(cap * sizeof *t->vhash);
  if (!t->vhash) return qe_errf(QE_ENOMEM, "tokenizer: vocabulary hash");
  memset(t->vhash, 0xFF, cap * sizeof *t->vhash);
  t->vcap = cap;
  for (int id = 0; id < t->n_vocab; id++) {
    const char *s = tok__piece(t, id);
    size_t n = tok__piece_len(t, id);
    uint32_t i = tok_hash(s, n) & (cap - 1);
    while (t->vhash[i] >= 0 &&
           !(tok__piece_len(t, t->vhash[i]) == n && memcmp(tok__piece(t, t->vhash[i]), s, n) == 0))
      i = (i + 1) & (cap - 1);
    t->vhash[i] = id;
  }
  return 0;
}

static int load_vocab(struct tok *t, const gguf_t *g) {
  gguf_arr_t a;
  int rc = gguf_get_arr(g, TOK_KEY "tokens", &a);
  if (rc == QE_ENOTFOUND)
    return qe_errf(rc, "tokenizer: no vocabulary (" TOK_KEY "tokens missing)");
  if (rc) return rc;
  if (a.elem_type != GGUF_VT_STRING)
    return qe_errf(QE_EFORMAT, "tokenizer: " TOK_KEY "tokens is not a string array");
  if (a.n == 0 || a.n > (1u << 30))
    return qe_errf(QE_EFORMAT, "tokenizer: vocabulary of %zu tokens", a.n);
  t->n_vocab = (int)a.n;
  rc = load_pieces(t, &a);
  return rc ? rc : build_vhash(t);
}

/* An optional per-token numeric array that must have n_vocab elements; *a->n == 0 if absent. */
static int get_vocab_arr(const struct tok *t, const gguf_t *g, const char *key, gguf_arr_t *a) {
  memset(a, 0, sizeof *a);
  if (gguf_find_key(g, key) < 0) return 0;
  int rc = gguf_get_arr(g, key, a);
  if (rc) return rc;
  if (a->elem_type == GGUF_VT_STRING || a->elem_type == GGUF_VT_BOOL)
    return qe_errf(QE_EFORMAT, "tokenizer: %s is not a numeric array", key);
  if (a->n != (size_t)t->n_vocab)
    return qe_errf(QE_EFORMAT, "tokenizer: %s has %zu entries for %d tokens", key, a->n,
                   t->n_vocab);
  return 0;
}

static int load_scores(struct tok *t, const gguf_t *g) {
  gguf_arr_t a;
  int rc = get_vocab_arr(t, g, TOK_KEY "scores", &a);
  if (rc) return rc;
  if (a.n == 0 && t->kind != TOK_KIND_SPM) return 0;
  if (a.n == 0)
    return qe_errf(QE_ENOTFOUND, "tokenizer: SentencePiece vocabulary without " TOK_KEY "scores");
  t->scores = malloc((size_t)t->n_vocab * sizeof *t->scores);
  if (!t->scores) return qe_errf(QE_ENOMEM, "tokenizer: scores");
  for (int i = 0; i < t->n_vocab && !rc; i++) {
    if (a.elem_type == GGUF_VT_FLOAT32)
      memcpy(&t->scores[i], (const char *)a.data + (size_t)i * 4, 4);
    else
      rc = gguf_arr_f32(&a, (size_t)i, &t->scores[i]);
  }
  return rc;
}

static int load_types(struct tok *t, const gguf_t *g) {
  gguf_arr_t a;
  int rc = get_vocab_arr(t, g, TOK_KEY "token_type", &a);
  if (rc) return rc;
  t->types = malloc((size_t)t->n_vocab);
  if (!t->types) return qe_errf(QE_ENOMEM, "tokenizer: token types");
  memset(t->types, TOK_TYPE_NORMAL, (size_t)t->n_vocab);
  for (int i = 0; i < (int)a.n; i++) {
    int64_t v = 0;
    if (a.elem_type == GGUF_VT_INT32) {
      int32_t x;
      memcpy(&x, (const char *)a.data + (size_t)i * 4, 4);
      v = x;
    } else if ((rc = gguf_arr_i64(&a, (size_t)i, &v)) != 0) {
      return rc;
    }
    if (v < 0 || v > TOK_TYPE_BYTE)
      return qe_errf(QE_EFORMAT, "tokenizer: token %d has type %lld", i, (long long)v);
    t->types[i] = (uint8_t)v;
  }
  return 0;
}

/* An optional token id: -1 when absent or "none" (0xFFFFFFFF / negative). */
static int get_id(const struct tok *t, const gguf_t *g, const char *key, int *out) {
  *out = -1;
  if (gguf_find_key(g, key) < 0) return 0;
  int64_t v;
  int rc = gguf_get_i64(g, key, &v);
  if (rc) return rc;
  if (v < 0 || v == 0xFFFFFFFFll) return 0;
  if (v >= t->n_vocab)
    return qe_errf(QE_EFORMAT, "tokenizer: %s = %lld but the vocabulary has %d tokens", key,
                   (long long)v, t->n_vocab);
  *out = (int)v;
  return 0;
}

static int get_flag(const gguf_t *g, const char *key, int dflt, int *out) {
  *out = dflt;
  return gguf_find_key(g, key) < 0 ? 0 : gguf_get_bool(g, key, out);
}

/* The id of the first control/user token whose text is one of names, or -1. */
static int find_named(const struct tok *t, const char *const *names) {
  for (; *names; names++) {
    int id = tok_vocab_find(t, *names, strlen(*names));
    if (id >= 0 && (t->types[id] == TOK_TYPE_CONTROL || t->types[id] == TOK_TYPE_USER)) return id;
  }
  return -1;
}

static const char *const eot_names[] = {"<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>",
                                        "<|endoftext|>", "<EOT>",      NULL};

static int load_ids(struct tok *t, const gguf_t *g) {
  int rc = get_id(t, g, TOK_KEY "bos_token_id", &t->bos);
  if (!rc) rc = get_id(t, g, TOK_KEY "eos_token_id", &t->eos);
  if (!rc) rc = get_id(t, g, TOK_KEY "unknown_token_id", &t->unk);
  if (!rc) rc = get_id(t, g, TOK_KEY "eot_token_id", &t->eot);
  if (rc) return rc;
  if (t->eot < 0) t->eot = find_named(t, eot_names);
  int def_bos = t->kind == TOK_KIND_SPM;
  rc = get_flag(g, TOK_KEY "add_bos_token", def_bos, &t->add_bos);
  if (!rc)
    rc = get_flag(g, TOK_KEY "add_space_prefix", t->kind == TOK_KIND_SPM, &t->add_space_prefix);
  return rc;
}

/* Without token types, the declared special ids still must not come out of text. */
static void mark_specials(struct tok *t, int had_types) {
  if (had_types) return;
  int ids[] = {t->bos, t->eos, t->eot};
  for (int i = 0; i < 3; i++)
    if (ids[i] >= 0) t->types[ids[i]] = TOK_TYPE_CONTROL;
  if (t->unk >= 0) t->types[t->unk] = TOK_TYPE_UNKNOWN;
}

static int build_eog(struct tok *t) {
  t->eog = malloc(8 * sizeof *t->eog);
  if (!t->eog) return qe_errf(QE_ENOMEM, "tokenizer: eog ids");
  int cand[8] = {t->eos, t->eot, -1};
  int n = 2;
  for (const char *const *p = eot_names; *p && n < 8; p++) {
    const char *const one[] = {*p, NULL};
    cand[n++] = find_named(t, one);
  }
  for (int i = 0; i < n; i++) {
    int dup = cand[i] < 0;
    for (int j = 0; j < t->n_eog && !dup; j++) dup = t->eog[j] == cand[i];
    if (!dup) t->eog[t->n_eog++] = cand[i];
  }
  return 0;
}

static int spec_cmp(const void *pa, const void *pb, void *pt) {
  const struct tok *t = pt;
  int a = *(const int32_t *)pa, b = *(const int32_t *)pb;
  unsigned char ca = (unsigned char)tok__piece(t, a)[0], cb = (unsigned char)tok__piece(t, b)[0];
  if (ca != cb) return ca < cb ? -1 : 1;
  size_t la = tok__piece_len(t, a), lb = tok__piece_len(t, b);
  if (la != lb) return la > lb ? -1 : 1;
  return a < b ? -1 : a > b;
}

/* Control and user-defined tokens, grouped by first byte, longest first. */
static int build_specials(struct tok *t) {
  t->spec = malloc((size_t)t->n_vocab * sizeof *t->spec);
  if (!t->spec) return qe_errf(QE_ENOMEM, "tokenizer: special tokens");
  for (int id = 0; id < t->n_vocab; id++) {
    int ty = t->types[id];
    if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER) && tok__piece_len(t, id) > 0)
      t->spec[t->n_spec++] = id;
  }
  qsort_r(t->spec, (size_t)t->n_spec, sizeof *t->spec, spec_cmp, t);
  int k = 0;
  for (int c = 0; c < 256; c++) {
    t->spec_at[c] = k;
    while (k < t->n_spec && (unsigned char)tok__piece(t, t->spec[k])[0] == c) k++;
  }
  t->spec_at[256] = t->n_spec;
  return 0;
}

/* SPM byte-fallback tokens <0xXX>. */
static void find_byte_tokens(struct tok *t) {
  for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
  for (int id = 0; id < t->n_vocab; id++) {
    const char *p = tok__piece(t, id);
    int v = tok_byte_piece(p, tok__piece_len(t, id));
    if (v < 0 || (t->types[id] != TOK_TYPE_BYTE && t->types[id] != TOK_TYPE_NORMAL)) continue;
    if (t->byte_id[v] < 0) t->byte_id[v] = id;
  }
}

static int load_model_kind(struct tok *t, const gguf_t *g) {
  const char *s;
  size_t n;
  int rc = gguf_get_str(g, TOK_KEY "model", &s, &n);
  if (rc == QE_ENOTFOUND)
    return qe_errf(rc, "tokenizer: no tokenizer metadata (" TOK_KEY "model missing)");
  if (rc) return rc;
  if (n == 5 && memcmp(s, "llama", 5) == 0)
    t->kind = TOK_KIND_SPM;
  else if (n == 4 && memcmp(s, "gpt2", 4) == 0)
    t->kind = TOK_KIND_BPE;
  else
    return qe_errf(QE_EUNSUPPORTED, "tokenizer: model type '%.*s' (" TOK_KEY "model)",
                   (int)(n > 64 ? 64 : n), s);
  return 0;
}

static int load_pre(struct tok *t, const gguf_t *g) {
  const char *s = "default";
  size_t n = 7;
  if (gguf_find_key(g, TOK_KEY "pre") >= 0) {
    int rc = gguf_get_str(g, TOK_KEY "pre", &s, &n);
    if (rc) return rc;
  }
  int pre = tok_pre_from_name(s, n);
  if (pre < 0) return pre;
  t->pre = pre;
  return 0;
}

static int tok_load(struct tok *t, const gguf_t *g) {
  int rc = load_model_kind(t, g);
  if (!rc && t->kind == TOK_KIND_BPE) rc = load_pre(t, g);
  if (!rc) rc = load_vocab(t, g);
  if (!rc) rc = load_scores(t, g);
  if (!rc) rc = load_types(t, g);
  if (!rc) rc = load_ids(t, g);
  if (rc) return rc;
  mark_specials(t, gguf_find_key(g, TOK_KEY "token_type") >= 0);
  rc = build_specials(t);
  if (!rc) rc = build_eog(t);
  if (rc) return rc;
  if (t->kind == TOK_KIND_SPM) {
    find_byte_tokens(t);
    return 0;
  }
  return tok_bpe_load(t, g);
}

int tok_create(const gguf_t *g, tok_t **out) {
  *out = NULL;
  if (!g) return qe_errf(QE_EINVAL, "tokenizer: no gguf");
  struct tok *t = calloc(1, sizeof *t);
  if (!t) return qe_errf(QE_ENOMEM, "tokenizer");
  t->bos = t->eos = t->eot = t->unk = -1;
  int rc = tok_load(t, g);
  if (rc) {
    tok_destroy(t);
    return rc;
  }
  *out = t;
  return 0;
}

void tok_destroy(tok_t *t) {
  if (!t) return;
  free(t->text);
  free(t->off);
  free(t->scores);
  free(t->types);
  free(t->vhash);
  free(t->mhash);
  free(t->spec);
  free(t->eog);
  free(t);
}

/* ---- accessors ---- */

int tok_kind(const tok_t *t) { return t->kind; }
int tok_n_vocab(const tok_t *t) { return t->n_vocab; }
int tok_bos(const tok_t *t) { return t->bos; }
int tok_eos(const tok_t *t) { return t->eos; }
int tok_eot(const tok_t *t) { return t->eot; }
int tok_add_bos(const tok_t *t) { return t->add_bos && t->bos >= 0; }

int tok_is_eog(const tok_t *t, int id) {
  if (!t) return 0; /* a model without a tokenizer (model_create_random) has none */
  for (int i = 0; i < t->n_eog; i++)
    if (t->eog[i] == id) return 1;
  return 0;
}

const char *tok_piece(const tok_t *t, int id) {
  return id >= 0 && id < t->n_vocab ? tok__piece(t, id) : NULL;
}

size_t tok_max_piece_len(const tok_t *t) {
  size_t max = 0;
  for (int i = 0; i < t->n_vocab; i++)
    if (tok__piece_len(t, i) > max) max = tok__piece_len(t, i);
  return max;
}

/* ---- encoding ---- */

/* The longest special token at s (control ones only when parse_special): id or -1. */
static int match_special(const struct tok *t, const char *s, size_t n, int parse_special,
                         size_t *mlen) {
  unsigned char c = (unsigned char)s[0];
  for (int k = t->spec_at[c]; k < t->spec_at[c + 1]; k++) {
    int id = t->spec[k];
    size_t len = tok__piece_len(t, id);
    if (!parse_special && t->types[id] != TOK_TYPE_USER) continue;
    if (len <= n && memcmp(tok__piece(t, id), s, len) == 0) {
      *mlen = len;
      return id;
    }
  }
  return -1;
}

static int encode_raw(const struct tok *t, const char *s, size_t n, int at_start, tok_ivec_t *v) {
  if (n == 0) return 0;
  if (t->kind == TOK_KIND_SPM) return tok_spm_encode(t, s, n, at_start && t->add_space_prefix, v);
  return tok_bpe_encode(t, s, n, v);
}

static int encode_all(const struct tok *t, const char *text, size_t len, int parse_special,
                      tok_ivec_t *v) {
  size_t frag = 0, pos = 0, mlen = 0;
  while (pos < len) {
    int id = t->n_spec ? match_special(t, text + pos, len - pos, parse_special, &mlen) : -1;
    if (id < 0) {
      pos++;
      continue;
    }
    int rc = encode_raw(t, text + frag, pos - frag, frag == 0, v);
    if (!rc) rc = tok_ivec_push(v, id);
    if (rc) return rc;
    pos += mlen;
    frag = pos;
  }
  return encode_raw(t, text + frag, len - frag, frag == 0, v);
}

int tok_encode(const tok_t *t, const char *text, size_t len, int add_bos, int parse_special,
               int32_t **ids, size_t *n) {
  *ids = NULL;
  *n = 0;
  if (!text && len) return qe_errf(QE_EINVAL, "tokenizer: NULL text");
  tok_ivec_t v = {0};
  int bos = add_bos && t->bos >= 0;
  int rc = bos ? tok_ivec_push(&v, t->bos) : 0;
  if (!rc) rc = encode_all(t, text, len, parse_special, &v);
  if (!rc && !v.v && !(v.v = malloc(sizeof *v.v))) /* an empty result still gets a buffer */
    rc = qe_errf(QE_ENOMEM, "tokenizer: ids");
  if (rc) {
    free(v.v);
    return rc;
  }
  if (bos && v.n >= 2 && v.v[1] == t->bos) { /* text began with the BOS text: keep one */
    memmove(v.v + 1, v.v + 2, (v.n - 2) * sizeof *v.v);
    v.n--;
  }
  *ids = v.v;
  *n = v.n;
  return 0;
}
