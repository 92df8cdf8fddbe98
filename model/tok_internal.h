/* tok_internal: the tokenizer's private state shared by tokenizer.c (creation, specials,
 * decoding), tok_spm.c (SentencePiece merges), tok_bpe.c (byte-level BPE merges) and
 * tok_pretok.c (pre-tokenizer scanners). Not part of the public API. */
#ifndef QE_TOK_INTERNAL_H
#define QE_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* GGUF token types (llama.cpp numbering). */
enum {
  TOK_TYPE_UNDEFINED = 0,
  TOK_TYPE_NORMAL = 1,
  TOK_TYPE_UNKNOWN = 2,
  TOK_TYPE_CONTROL = 3,
  TOK_TYPE_USER = 4,
  TOK_TYPE_UNUSED = 5,
  TOK_TYPE_BYTE = 6
};

/* Pre-tokenizers (tokenizer.ggml.pre). */
enum { TOK_PRE_GPT2 = 1, TOK_PRE_SMOLLM = 2, TOK_PRE_LLAMA3 = 3, TOK_PRE_QWEN2 = 4 };

/* BPE merge: (left id, right id) -> merged id, rank (lower merges first). */
typedef struct {
  int32_t a, b, id, rank;
} tok_merge_t;

struct tok {
  int kind; /* tok_kind_t */
  int pre;  /* TOK_PRE_* (BPE only) */
  int n_vocab;
  char *text;         /* all pieces, each NUL-terminated */
  uint32_t *off;      /* [n_vocab + 1] piece i = text + off[i], length off[i+1] - off[i] - 1 */
  float *scores;      /* [n_vocab] SPM merge scores (NULL for BPE) */
  uint8_t *types;     /* [n_vocab] TOK_TYPE_* */
  int32_t *vhash;     /* [vcap] open addressing piece -> id, -1 empty */
  uint32_t vcap;      /* power of two */
  tok_merge_t *mhash; /* [mcap] open addressing (a, b) -> merge, a = -1 empty */
  uint32_t mcap;
  int32_t byte_id[256]; /* SPM: <0xXX> tokens; BPE: the byte-level character of each byte */
  int32_t *spec;        /* ids of specials matched in text, grouped by first byte, longest first */
  int n_spec;
  int spec_at[257]; /* specials starting with byte c: spec[spec_at[c] .. spec_at[c+1]) */
  int32_t *eog;     /* end-of-generation ids */
  int n_eog;
  int bos, eos, eot, unk;
  int add_bos, add_space_prefix;
};

/* A growable id vector. */
typedef struct {
  int32_t *v;
  size_t n, cap;
} tok_ivec_t;

int tok_ivec_push(tok_ivec_t *v, int32_t id);

static inline const char *tok__piece(const struct tok *t, int id) { return t->text + t->off[id]; }
static inline size_t tok__piece_len(const struct tok *t, int id) {
  return t->off[id + 1] - t->off[id] - 1;
}

/* Vocabulary lookup of s[0..n): id, or -1. */
int tok_vocab_find(const struct tok *t, const char *s, size_t n);
/* The byte an SPM byte-fallback piece "<0xXX>" stands for, or -1. */
int tok_byte_piece(const char *s, size_t n);
/* Whether a token of this type may come out of merging text (normal / user / undefined). */
int tok_type_mergeable(int type);

/* A binary min-heap of merge candidates ordered by (prio, left). */
typedef struct {
  float prio;
  int left, right;
  int size; /* SPM: byte length of the pair; BPE: merged id */
} tok_cand_t;
typedef struct {
  tok_cand_t *v;
  int n, cap;
} tok_heap_t;
int tok_heap_push(tok_heap_t *h, tok_cand_t c);
tok_cand_t tok_heap_pop(tok_heap_t *h);

/* SPM: encodes one raw-text fragment (no specials inside); prefix adds the dummy space. */
int tok_spm_encode(const struct tok *t, const char *s, size_t n, int prefix, tok_ivec_t *out);

/* BPE: builds t->mhash and t->byte_id from tokenizer.ggml.merges. */
int tok_bpe_load(struct tok *t, const gguf_t *g);
/* BPE: encodes one raw-text fragment: pre-tokenize, then merge each chunk. */
int tok_bpe_encode(const struct tok *t, const char *s, size_t n, tok_ivec_t *out);
/* BPE: appends the bytes a byte-level piece stands for; returns length or QE_ENOSPC. */
int tok_bpe_unmap(const char *piece, size_t len, char *buf, size_t cap);

/* Pre-tokenizer: TOK_PRE_* for a tokenizer.ggml.pre value, or QE_EUNSUPPORTED. */
int tok_pre_from_name(const char *name, size_t len);
/* Splits s[0..n) into chunks per pre, calling emit(ctx, chunk, len) in order. Returns the
 * first nonzero emit result, QE_ENOMEM, or 0. */
typedef int (*tok_emit_fn)(void *ctx, const char *s, size_t n);
int tok_pretok_split(int pre, const char *s, size_t n, tok_emit_fn emit, void *ctx);

#endif
