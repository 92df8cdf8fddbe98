/* tokenizer: text <-> token ids from GGUF metadata (tokenizer.ggml.*).
 *   - "llama": SentencePiece BPE (scores, byte fallback <0xXX>, dummy-prefix space, ▁ for space)
 *   - "gpt2":  byte-level BPE (merges) with the pre-tokenizer the GGUF declares in
 *              tokenizer.ggml.pre (gpt2/default, smollm, llama-bpe/llama3, qwen2, ...)
 * Special (control / user-defined) tokens are matched in the text when parse_special is set.
 * A tok_t is immutable after creation: encode/decode are thread-safe. */
#ifndef QE_TOKENIZER_H
#define QE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct tok tok_t;

typedef enum { TOK_KIND_SPM = 1, TOK_KIND_BPE = 2 } tok_kind_t;

/* Builds a tokenizer from a GGUF's metadata. QE_ENOTFOUND / QE_EFORMAT / QE_EUNSUPPORTED with
 * a detail line for missing or bad metadata. *out owned by caller: tok_destroy(). The tok_t
 * copies what it needs: the gguf_t may be closed afterwards. */
int tok_create(const gguf_t *g, tok_t **out);
void tok_destroy(tok_t *t);

int tok_kind(const tok_t *t);
int tok_n_vocab(const tok_t *t);
int tok_bos(const tok_t *t); /* -1 if none */
int tok_eos(const tok_t *t); /* -1 if none */
int tok_eot(const tok_t *t); /* end-of-turn (e.g. <|im_end|>, <|eot_id|>), -1 if none */
/* Whether generation should stop on this id (eos, eot, or any end-of-generation token). */
int tok_is_eog(const tok_t *t, int id); /* 0 when t is NULL */
/* Whether the model wants BOS prepended (tokenizer.ggml.add_bos_token, default per kind). */
int tok_add_bos(const tok_t *t);

/* The raw vocabulary piece of id (as stored in the GGUF), NULL if out of range. */
const char *tok_piece(const tok_t *t, int id);
/* Bytes of the longest raw piece. No token's text is longer than its piece (SPM's U+2581 is 3
 * bytes for a space, <0xXX> 6 for a byte; byte-level BPE's characters 1 or 2 for a byte), so a
 * text of n tokens has at most n times this many bytes (ignoring bytes dropped for want of a
 * byte token or <unk>). */
size_t tok_max_piece_len(const tok_t *t);

/* Encodes text (len bytes, any content: invalid UTF-8 is encoded via byte fallback / bytes).
 * add_bos: prepend BOS if the model has one. parse_special: match special-token texts.
 * On success *ids is malloc'd (caller frees) with *n ids. */
int tok_encode(const tok_t *t, const char *text, size_t len, int add_bos, int parse_special,
               int32_t **ids, size_t *n);

/* Appends the bytes of id's text to buf (SPM: ▁ -> space, <0xXX> -> byte; BPE: byte-level
 * unmapping). Control tokens give their text only if render_special. Returns bytes written,
 * or a negative QE_E* (QE_ERANGE if id invalid; QE_ENOSPC if cap is too small). */
int tok_token_bytes(const tok_t *t, int id, int render_special, char *buf, size_t cap);

/* Streaming detokenizer: feed ids one at a time, get out only complete UTF-8 code points.
 * The leading dummy-prefix space of SPM is dropped at the start of a stream when strip_lead
 * is set. Invalid sequences come out as U+FFFD. Not thread-safe (one per stream). */
typedef struct {
  const tok_t *tok;
  int render_special;
  int strip_lead;
  int n_seen;
  unsigned char pend[8];
  int n_pend;
} tok_stream_t;

void tok_stream_init(tok_stream_t *s, const tok_t *t, int render_special, int strip_lead);
/* Writes the text that id completes into out (cap: at least tok_stream_room(s, id); returns
 * QE_ENOSPC otherwise, the text lost); returns bytes written (>= 0). */
int tok_stream_push(tok_stream_t *s, int id, char *out, size_t cap);
/* The most bytes tok_stream_push(s, id, ...) may write: the pending bytes and id's piece, each
 * byte as a 3-byte U+FFFD at worst (0 for an id outside the vocabulary). Some vocabularies have
 * pieces of 80 bytes and more (SmolLM2's rows of '#' and runs of spaces). */
size_t tok_stream_room(const tok_stream_t *s, int id);
/* tok_stream_push into a buffer of tok_stream_room bytes (the stack's, or the heap's for a long
 * piece), then emit(ud, text, n) when n > 0. Returns n, or QE_E*. */
int tok_stream_emit(tok_stream_t *s, int id, void (*emit)(void *ud, const char *text, size_t n),
                    void *ud);
/* Flushes pending bytes (as U+FFFD if incomplete); returns bytes written. */
int tok_stream_flush(tok_stream_t *s, char *out, size_t cap);

/* Decodes a whole id sequence into a malloc'd NUL-terminated string (*text, caller frees). */
int tok_decode(const tok_t *t, const int32_t *ids, size_t n, int render_special, int strip_lead,
               char **text);
/* tok_decode with the text's length in *len (a token may decode to a NUL byte: the text is then
 * longer than its strlen). */
int tok_decode_len(const tok_t *t, const int32_t *ids, size_t n, int render_special, int strip_lead,
                   char **text, size_t *len);

/* Chat templates: recognised from tokenizer.chat_template. */
typedef enum { CHAT_NONE = 0, CHAT_CHATML = 1, CHAT_LLAMA3 = 2 } chat_kind_t;

typedef struct {
  const char *role; /* "system" | "user" | "assistant" | other */
  const char *content;
} chat_msg_t;

/* Which template the model declares (CHAT_NONE if none or unrecognised). */
int chat_kind_of(const gguf_t *g);
/* Renders messages with the template of `kind`, plus the assistant generation prompt when
 * add_generation_prompt. The default system prompt a template embeds (e.g. SmolLM2's) is
 * extracted from the template text in g when no system message is given (g may be NULL).
 * *out is malloc'd NUL-terminated (caller frees). QE_EUNSUPPORTED for CHAT_NONE. */
int chat_render(int kind, const gguf_t *g, const chat_msg_t *msgs, size_t n,
                int add_generation_prompt, char **out);

#endif
