/* rand_model: writes small random GGUF models (llama with SentencePiece vocabulary, qwen2 with
 * byte-level BPE vocabulary) with every weight matrix in a chosen tensor type, so model
 * mechanics are tested without downloads. */
#ifndef QE_RAND_MODEL_H
#define QE_RAND_MODEL_H

#include <stdint.h>

typedef struct {
  int arch;   /* MODEL_ARCH_LLAMA or MODEL_ARCH_QWEN2 */
  int wtype;  /* gguf_ttype_t of the 2-D weights */
  int n_head; /* query heads (head_dim 32) */
  int n_kv;   /* KV heads (n_head for MHA) */
  int tied;   /* no output.weight */
  int n_layer;
  uint64_t seed;
  int bias; /* llama: 1 adds Q/K/V biases as qwen2 has, 2 the same biases all zero (the same
             * draws), 3 Q/K/V biases and an attn_output.bias (qwen2 always has Q/K/V's) */
} rand_model_spec_t;

/* n_embd of the random models (a multiple of every block size). */
#define RAND_MODEL_EMBD 256
#define RAND_MODEL_FF   512

/* Writes the model to path. Returns 0 or QE_E*. */
int rand_model_write(const rand_model_spec_t *spec, const char *path);
/* Same with context_length n_ctx (rand_model_write: 256). */
int rand_model_write_ctx(const rand_model_spec_t *spec, int n_ctx, const char *path);
/* Same; nan: output_norm.weight all NaN, so every logit is NaN (a model whose weights are not
 * finite, for the engine's check of its logits). */
int rand_model_write_ex(const rand_model_spec_t *spec, int n_ctx, int nan, const char *path);

#endif
