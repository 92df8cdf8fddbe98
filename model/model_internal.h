/* model_internal: the model's private layout and the loading helpers shared by model_load.c
 * (GGUF), model_random.c (random weights) and model_forward.c. */
#ifndef QE_MODEL_INTERNAL_H
#define QE_MODEL_INTERNAL_H

#include "model.h"

/* The logits scratch: rows of logits per output-layer call (model.out_rows) are, unless the load
 * options set them, as many as MODEL_OUT_BYTES of fp32 logits hold, at least MODEL_OUT_MIN and
 * at most max_batch. Every chunk of rows reads the whole output matrix (1 GiB in bf16 for
 * Llama 3's vocabulary), so a decode step's rows should fit one chunk. */
#define MODEL_OUT_BYTES ((size_t)128 << 20)
#define MODEL_OUT_MIN   64
#define MODEL_MAX_SEGS  1024

/* A run of one sequence's tokens in the batch, rows [off, off + n). */
typedef struct {
  int seq, pos0, off, n;
} model_seg_t;

/* Where output rows go: logits [n_out][n_vocab] (host), their greedy ids [n_out] (host), or
 * ids_dev (backend memory, not waited for); keep: the logits of at most out_rows rows
 * stay in the logits scratch. */
typedef struct {
  float *logits;
  int32_t *ids;
  int32_t *ids_dev;
  int keep;
} model_out_t;

typedef struct model_graphs model_graphs_t; /* model_graph.c */

typedef struct {
  float *attn_norm, *ffn_norm;  /* [n_embd] */
  kern_weight_t wq, wk, wv, wo; /* local rows (q/k/v) or local columns (o); weight_upload */
  kern_weight_t wg, wu, wd;     /* local rows (gate/up) or local columns (down) */
  float *bq, *bk, *bv;          /* with qkv_bias, local slices */
  /* Where the backend asks for it (kern_backend.fuse_proj, model__fuse_proj): wq, wk, wv stacked
   * into wqkv (and bq, bk, bv into bqkv), wg, wu into wgu; the parts are then empty. */
  kern_weight_t wqkv, wgu;
  float *bqkv;
} model_layer_t;

/* Rows of a forward call up to which stacked gate, up weights run as one matmul (decode steps
 * and small prefills, whose GEMMs read their weights at the memory's pace); past it the two
 * halves run apart, so that the scratch holds [B][2 n_ff] only for these rows. */
#define MODEL_FUSE_ROWS 512

/* Scratch for one forward call of up to max_batch tokens, in backend memory. */
typedef struct {
  float *x, *xn, *tmp; /* [B][n_embd] */
  float *q, *att;      /* [B][n_head_local * hd] */
  float *k, *v;        /* [B][n_kv_local * hd] */
  float *gate, *up;    /* [B][n_ff_local]; with stacked projections gate also holds their
                        * outputs: [B][nq + 2 nk] and [MODEL_FUSE_ROWS][2 n_ff_local] */
  float *logits;       /* [out_rows][n_vocab] (rank 0) */
  int32_t *ids, *pos;  /* [B] (a recorded step points them at its own buffer meanwhile) */
  float *host_tmp;     /* host [B][n_embd] for all-reduce on non-host backends */
} model_scratch_t;

struct model {
  model_hparams_t hp;
  model_shard_t sh;
  gguf_t *g;  /* NULL for a random model */
  tok_t *tok; /* NULL for a random model */
  kern_backend_t *be;
  float *tok_embd; /* fp32 [n_vocab][n_embd], read by embed; may alias out.data; NULL when
                    * embd_w holds the table */
  const kern_weight_t *embd_w; /* a packed table read by embed_w: &out (tied) or &embd */
  kern_weight_t embd;          /* the packed table of an untied model (or of ranks past 0) */
  float *out_norm;             /* [n_embd] */
  kern_weight_t out;           /* [n_vocab][n_embd] on rank 0 (zeroed elsewhere); weight_upload */
  float rope_factors[512];
  model_layer_t *layers;
  model_scratch_t s;
  int max_batch;
  int out_rows;        /* rows of logits per output-layer call (the logits scratch) */
  size_t weight_bytes; /* backend bytes of every weight and vector above */
  int graphs_on;       /* decode steps as recorded graphs where the backend has them */
  model_graphs_t *gr;  /* their state (NULL until the first one) */
};

/* An empty model for opts (backend, batch size); NULL when out of memory. */
model_t *model__new(const model_load_opts_t *opts);
/* Uploads the weight host [rows][cols] (fp32) through the backend's weight_upload into *w and
 * counts its bytes; errors name the tensor. */
int model__weight(model_t *m, kern_weight_t *w, const float *host, int rows, int cols,
                  const char *name);
/* Copies the fp32 vector host [n] into a new backend buffer *out and counts its bytes. */
int model__vec(model_t *m, float **out, const float *host, size_t n, const char *name);
/* Uploads token_embd host [n_vocab][n_embd]: the fp32 table of embed and, for a tied output on
 * rank 0, the output weight too (one buffer when the backend's weights are fp32). */
int model__embd(model_t *m, const float *host);
/* Copies hp->rope.factors (if any) into the model and points m->hp.rope.factors at the copy. */
void model__own_rope_factors(model_t *m);
/* Stacks every layer's projections where the backend asks for it (kern_backend.fuse_proj);
 * before model__alloc_scratch. Returns 0 or the backend's error. */
int model__fuse_proj(model_t *m);
/* Allocates the forward scratch for m->max_batch tokens. */
int model__alloc_scratch(model_t *m);

/* model_forward.c: embedding, layers and the output of batch b (runs segs; ids and positions
 * already in m->s), everything queued on the backend without waiting unless o asks for host
 * output. */
int model__forward_dev(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const model_batch_t *b,
                       const model_seg_t *segs, int n_segs, const model_out_t *o);
/* model_graph.c: runs b (n_segs runs, checked) as a recorded decode step when it is one that a
 * graph can express (1 otherwise: run it eagerly); 0 or a negative QE_E*. */
int model__graph_forward(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const model_batch_t *b,
                         int n_segs, const model_out_t *o);
/* Frees m's graphs (NULL-safe state). */
void model__graph_free(model_t *m);

#endif
