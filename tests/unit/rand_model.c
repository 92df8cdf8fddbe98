/* rand_model: random GGUF models for tests. Weights are random block encodings of the chosen
 * type with small scales (so activations stay finite); norms are F32 around 1. */
#include "rand_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_write.h"
#include "model.h"
#include "qe_status.h"

static uint64_t rm_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static float rm_uniform(uint64_t *s) { return (float)((rm_next(s) >> 40) / 16777216.0) * 2 - 1; }

/* Byte offsets of fp16 scale fields inside one block of each type (value written: d). */
static void rm_fix_scales(int type, uint8_t *blk, uint64_t *s) {
  uint16_t d = qe_f32_to_fp16(0.0005f + 0.0002f * rm_uniform(s));
  uint16_t small = qe_f32_to_fp16(0.0001f);
  switch (type) {
  case GGUF_T_Q8_0:
    memcpy(blk, &d, 2);
    break;
  case GGUF_T_Q4_0:
    d = qe_f32_to_fp16(0.01f);
    memcpy(blk, &d, 2);
    break;
  case GGUF_T_Q4_1:
    d = qe_f32_to_fp16(0.01f);
    memcpy(blk, &d, 2);
    memcpy(blk + 2, &small, 2);
    break;
  case GGUF_T_Q4_K:
  case GGUF_T_Q5_K:
    memcpy(blk, &small, 2);
    memcpy(blk + 2, &small, 2);
    break;
  case GGUF_T_Q6_K:
    d = qe_f32_to_fp16(0.00002f);
    memcpy(blk + 208, &d, 2);
    break;
  default:
    break;
  }
}

/* Random data of n elements in `type`, values of magnitude ~amp. Caller frees. */
static void *rm_tensor(int type, int64_t n, float amp, uint64_t *s, size_t *nbytes) {
  *nbytes = gguf_type_nbytes(type, n);
  uint8_t *buf = malloc(*nbytes);
  if (!buf) return NULL;
  if (type == GGUF_T_F32 || type == GGUF_T_F16 || type == GGUF_T_BF16) {
    for (int64_t i = 0; i < n; i++) {
      float v = amp * rm_uniform(s);
      if (type == GGUF_T_F32) memcpy(buf + 4 * i, &v, 4);
      uint16_t h = type == GGUF_T_F16 ? qe_f32_to_fp16(v) : qe_f32_to_bf16(v);
      if (type != GGUF_T_F32) memcpy(buf + 2 * i, &h, 2);
    }
    return buf;
  }
  for (size_t i = 0; i < *nbytes; i++) buf[i] = (uint8_t)rm_next(s);
  size_t bb = gguf_type_block_bytes(type);
  for (size_t off = 0; off < *nbytes; off += bb) rm_fix_scales(type, buf + off, s);
  return buf;
}

static int rm_add(gguf_writer_t *w, const char *name, int type, int64_t ne0, int64_t ne1, float amp,
                  uint64_t *s) {
  size_t nb;
  int64_t ne[2] = {ne0, ne1};
  void *data = rm_tensor(type, ne0 * ne1, amp, s, &nb);
  if (!data) return QE_ENOMEM;
  int rc = gguf_writer_add_tensor(w, name, type, ne1 > 1 ? 2 : 1, ne, data, nb);
  free(data);
  return rc;
}

static int rm_norm(gguf_writer_t *w, const char *name, int64_t n, uint64_t *s, int nan) {
  float *g = malloc(sizeof(float) * n);
  if (!g) return QE_ENOMEM;
  for (int64_t i = 0; i < n; i++) g[i] = nan ? NAN : 1.0f + 0.1f * rm_uniform(s);
  int64_t ne[1] = {n};
  int rc = gguf_writer_add_tensor(w, name, GGUF_T_F32, 1, ne, g, sizeof(float) * n);
  free(g);
  return rc;
}

/* SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, ▁ and a few pieces. */
static int rm_vocab_spm(gguf_writer_t *w) {
  static const char *extra[] = {"\xe2\x96\x81",
                                "\xe2\x96\x81t",
                                "he",
                                "\xe2\x96\x81the",
                                "in",
                                "er",
                                "an",
                                "\xe2\x96\x81"
                                "a"};
  enum { N = 3 + 256 + 8 };
  char *toks[N];
  float scores[N];
  int32_t types[N];
  char bytes[256][8];
  const char *fixed[3] = {"<unk>", "<s>", "</s>"};
  for (int i = 0; i < N; i++) {
    if (i < 3)
      toks[i] = (char *)fixed[i], types[i] = i ? 3 : 2;
    else if (i < 259)
      snprintf(bytes[i - 3], 8, "<0x%02X>", i - 3), toks[i] = bytes[i - 3], types[i] = 6;
    else
      toks[i] = (char *)extra[i - 259], types[i] = 1;
    scores[i] = i < 259 ? 0.0f : -(float)(i - 259);
  }
  int rc = gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  if (!rc) rc = gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)toks, N);
  if (!rc) rc = gguf_writer_add_f32_arr(w, "tokenizer.ggml.scores", scores, N);
  if (!rc) rc = gguf_writer_add_i32_arr(w, "tokenizer.ggml.token_type", types, N);
  if (!rc) rc = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
  if (!rc) rc = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
  return rc;
}

/* GPT-2 byte-level vocabulary: the 256 byte symbols, two merges, three specials. */
static int rm_vocab_bpe(gguf_writer_t *w) {
  enum { N = 256 + 2 + 3 };
  char sym[256][4], *toks[N];
  int32_t types[N];
  int k = 0;
  for (int b = 0; b < 256; b++) {
    int cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b : 256 + k++;
    char *o = sym[b];
    if (cp < 0x80)
      o[0] = (char)cp, o[1] = 0;
    else
      o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F)), o[2] = 0;
  }
  static const char *rest[] = {"\xc4\xa0t", "he", "<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int i = 0; i < N; i++) {
    toks[i] = i < 256 ? sym[i] : (char *)rest[i - 256];
    types[i] = i < 258 ? 1 : 3;
  }
  static const char *merges[] = {"\xc4\xa0 t", "h e"};
  int rc = gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
  if (!rc) rc = gguf_writer_add_str(w, "tokenizer.ggml.pre", "qwen2");
  if (!rc) rc = gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)toks, N);
  if (!rc) rc = gguf_writer_add_i32_arr(w, "tokenizer.ggml.token_type", types, N);
  if (!rc) rc = gguf_writer_add_str_arr(w, "tokenizer.ggml.merges", merges, 2);
  if (!rc) rc = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 258);
  if (!rc) rc = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 258);
  if (!rc) rc = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 0);
  return rc;
}

static int rm_hparams(gguf_writer_t *w, const rand_model_spec_t *sp, const char *arch, int n_ctx) {
  char k[96];
  int rc = gguf_writer_add_str(w, "general.architecture", arch);
#define RM_U32(name, v)                                                                            \
  if (!rc) {                                                                                       \
    snprintf(k, sizeof k, "%s." name, arch);                                                       \
    rc = gguf_writer_add_u32(w, k, (uint32_t)(v));                                                 \
  }
  RM_U32("context_length", n_ctx);
  RM_U32("embedding_length", RAND_MODEL_EMBD);
  RM_U32("block_count", sp->n_layer);
  RM_U32("feed_forward_length", RAND_MODEL_FF);
  RM_U32("attention.head_count", sp->n_head);
  RM_U32("attention.head_count_kv", sp->n_kv);
#undef RM_U32
  snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
  if (!rc) rc = gguf_writer_add_f32(w, k, 1e-5f);
  snprintf(k, sizeof k, "%s.rope.freq_base", arch);
  if (!rc) rc = gguf_writer_add_f32(w, k, 10000.0f);
  return rc;
}

static int rm_layer(gguf_writer_t *w, const rand_model_spec_t *sp, int l, uint64_t *s) {
  int E = RAND_MODEL_EMBD, hd = E / sp->n_head, F = RAND_MODEL_FF, t = sp->wtype;
  char n[96];
#define RM_NAME(what) (snprintf(n, sizeof n, "blk.%d." what, l), n)
  int rc = rm_norm(w, RM_NAME("attn_norm.weight"), E, s, 0);
  if (!rc) rc = rm_add(w, RM_NAME("attn_q.weight"), t, E, sp->n_head * hd, 0.08f, s);
  if (!rc) rc = rm_add(w, RM_NAME("attn_k.weight"), t, E, sp->n_kv * hd, 0.08f, s);
  if (!rc) rc = rm_add(w, RM_NAME("attn_v.weight"), t, E, sp->n_kv * hd, 0.08f, s);
  if (!rc) rc = rm_add(w, RM_NAME("attn_output.weight"), t, sp->n_head * hd, E, 0.08f, s);
  const float bs = sp->bias == 2 ? 0.0f : 0.1f;
  if (!rc && (sp->arch == MODEL_ARCH_QWEN2 || sp->bias)) {
    rc = rm_add(w, RM_NAME("attn_q.bias"), GGUF_T_F32, sp->n_head * hd, 1, bs, s);
    if (!rc) rc = rm_add(w, RM_NAME("attn_k.bias"), GGUF_T_F32, sp->n_kv * hd, 1, bs, s);
    if (!rc) rc = rm_add(w, RM_NAME("attn_v.bias"), GGUF_T_F32, sp->n_kv * hd, 1, bs, s);
  }
  if (!rc && sp->bias == 3) rc = rm_add(w, RM_NAME("attn_output.bias"), GGUF_T_F32, E, 1, bs, s);
  if (!rc) rc = rm_norm(w, RM_NAME("ffn_norm.weight"), E, s, 0);
  if (!rc) rc = rm_add(w, RM_NAME("ffn_gate.weight"), t, E, F, 0.08f, s);
  if (!rc) rc = rm_add(w, RM_NAME("ffn_up.weight"), t, E, F, 0.08f, s);
  if (!rc) rc = rm_add(w, RM_NAME("ffn_down.weight"), t, F, E, 0.08f, s);
#undef RM_NAME
  return rc;
}

int rand_model_write(const rand_model_spec_t *sp, const char *path) {
  return rand_model_write_ctx(sp, 256, path);
}

int rand_model_write_ctx(const rand_model_spec_t *sp, int n_ctx, const char *path) {
  return rand_model_write_ex(sp, n_ctx, 0, path);
}

int rand_model_write_ex(const rand_model_spec_t *sp, int n_ctx, int nan, const char *path) {
  gguf_writer_t *w = NULL;
  uint64_t s = sp->seed * 2654435761u + 1;
  int qwen = sp->arch == MODEL_ARCH_QWEN2, V = qwen ? 261 : 267;
  int rc = gguf_writer_create(&w);
  if (!rc) rc = rm_hparams(w, sp, qwen ? "qwen2" : "llama", n_ctx);
  if (!rc) rc = qwen ? rm_vocab_bpe(w) : rm_vocab_spm(w);
  if (!rc) rc = rm_add(w, "token_embd.weight", sp->wtype, RAND_MODEL_EMBD, V, 0.5f, &s);
  if (!rc) rc = rm_norm(w, "output_norm.weight", RAND_MODEL_EMBD, &s, nan);
  if (!rc && !sp->tied) rc = rm_add(w, "output.weight", sp->wtype, RAND_MODEL_EMBD, V, 0.1f, &s);
  for (int l = 0; !rc && l < sp->n_layer; l++) rc = rm_layer(w, sp, l, &s);
  if (!rc) rc = gguf_writer_save(w, path);
  gguf_writer_destroy(w);
  return rc;
}
