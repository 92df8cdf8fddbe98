/* model_internal: the model's private layout, shared by model_load.c and model_forward.c. */
#ifndef QE_MODEL_INTERNAL_H
#define QE_MODEL_INTERNAL_H

#include "model.h"

/* Rows of logits computed per output-layer call (the logits scratch size). */
#define MODEL_OUT_CHUNK 64

typedef struct {
  float *attn_norm, *ffn_norm;  /* [n_embd] */
  kern_weight_t wq, wk, wv, wo; /* local rows (q/k/v) or local columns (o) */
  kern_weight_t wg, wu, wd;
  float *bq, *bk, *bv; /* qwen2 only, local slices */
} model_layer_t;

/* Scratch for one forward call of up to max_batch tokens, in backend memory. */
typedef struct {
  float *x, *xn, *tmp; /* [B][n_embd] */
  float *q, *att;      /* [B][n_head_local * hd] */
  float *k, *v;        /* [B][n_kv_local * hd] */
  float *gate, *up;    /* [B][n_ff_local] */
  float *logits;       /* [MODEL_OUT_CHUNK][n_vocab] (rank 0) */
  int32_t *ids, *pos;  /* [B] */
  float *host_tmp;     /* host [B][n_embd] for all-reduce on non-host backends */
} model_scratch_t;

struct model {
  model_hparams_t hp;
  model_shard_t sh;
  gguf_t *g;
  tok_t *tok;
  kern_backend_t *be;
  float *tok_embd;   /* [n_vocab][n_embd] */
  float *out_norm;   /* [n_embd] */
  kern_weight_t out; /* [n_vocab][n_embd]; data may alias tok_embd */
  float rope_factors[512];
  model_layer_t *layers;
  model_scratch_t s;
  int max_batch;
  size_t weight_bytes;
};

#endif
