/* model: a transformer (llama / qwen2 architectures) loaded from GGUF into a backend, with
 * tensor-parallel sharding (rank r of T holds a contiguous range of KV-head groups and of FFN
 * columns; the output layer is replicated on rank 0), and a batched forward pass over many
 * sequences through a kv_cache_t. A model_t is read-only after load; model_forward uses the
 * model's scratch buffers, so one thread drives one model. */
#ifndef QE_MODEL_H
#define QE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kern.h"
#include "kv_cache.h"
#include "tokenizer.h"
#include "tp_comm.h"

typedef enum { MODEL_ARCH_LLAMA = 1, MODEL_ARCH_QWEN2 = 2 } model_arch_t;

typedef struct {
  int arch;
  int n_vocab, n_embd, n_layer;
  int n_head, n_head_kv, head_dim, n_ff;
  int n_ctx_train;
  float rms_eps;
  int tied_output;  /* output layer shares token_embd */
  int qkv_bias;     /* Q/K/V biases: qwen2, and llama files that have them */
  kern_rope_t rope; /* factors: into the model (rope_freqs), static (model_shape_named), NULL */
} model_hparams_t;

/* This rank's shard. */
typedef struct {
  int rank, size;
  int head0, n_head; /* local query heads [head0, head0 + n_head) */
  int kv0, n_kv;     /* local KV heads */
  int ff0, n_ff;     /* local FFN columns */
} model_shard_t;

typedef struct model model_t;

typedef struct {
  kern_backend_t *be; /* borrowed; must outlive the model */
  int rank, size;     /* tensor-parallel position (0, 1 for no TP) */
  int max_batch;      /* max tokens per forward call (scratch sizing); default 512 */
  int out_rows;       /* rows of logits per output-layer GEMM (the logits scratch); 0: as many
                         as MODEL_OUT_BYTES of logits hold, at least 64, at most max_batch */
} model_load_opts_t;

/* Reads hyperparameters only (cheap; used by `inspect` and validation). */
int model_read_hparams(const gguf_t *g, model_hparams_t *hp);
/* Computes rank's shard of hp; QE_EINVAL if size exceeds the KV heads or FFN columns. */
int model_shard_of(const model_hparams_t *hp, int rank, int size, model_shard_t *sh);
/* A rank's share of a whole-request KV byte budget: proportional to its KV heads (rounded
 * down), the split every rank of a TP group and the scheduler agree on. */
uint64_t model_kv_share(const model_hparams_t *hp, const model_shard_t *sh, uint64_t bytes);
/* The whole-request budget whose share (model_kv_share) gives a rank at least rank_bytes:
 * the inverse, rounded up. */
uint64_t model_kv_whole(const model_hparams_t *hp, const model_shard_t *sh, uint64_t rank_bytes);
/* A whole-request budget whose share (model_kv_share) never passes rank_bytes: rank_bytes
 * times the KV heads over the rank's, rounded down (a TP group's bound by one rank's pool). */
uint64_t model_kv_within(const model_hparams_t *hp, const model_shard_t *sh, uint64_t rank_bytes);

/* Loads path: validates metadata, dequantizes this rank's weights into the backend, builds
 * the tokenizer. *out owned by caller: model_destroy(). Errors carry a qe_errf detail. */
int model_load(const char *path, const model_load_opts_t *opts, model_t **out);
void model_destroy(model_t *m); /* NULL-safe */

/* Fills *hp with a named architecture's shape: "llama3-8b" (Llama-3.1-8B), "llama3-70b"
 * (Llama-3.1-70B), both with llama3 rope frequency factors (hp->rope.factors points to static
 * storage, valid for the process), and "tiny" (a 2-layer GQA llama for tests). Thread-safe.
 * Returns 0, or QE_EINVAL naming the unknown shape and listing the known ones. */
int model_shape_named(const char *name, model_hparams_t *hp);
/* Builds a model of shape hp with no file and no tokenizer (model_tok and model_gguf return
 * NULL): every weight is a deterministic function of (seed, tensor name, element index of the
 * full tensor), uniform with std 0.02 for matrices and 1 for norms (biases 0), so rank r's
 * shard holds exactly the matching rows / columns of the 1-rank model. Generated on the host
 * one tensor at a time (on all cores) and uploaded with weight_upload. hp is copied (its rope
 * factors too). *out owned by caller: model_destroy(). Returns 0, QE_EINVAL for an
 * inconsistent shape or shard, QE_ENOMEM, or a backend error; errors carry a qe_errf detail. */
int model_create_random(const model_hparams_t *hp, uint64_t seed, const model_load_opts_t *opts,
                        model_t **out);

const model_hparams_t *model_hparams(const model_t *m);
const model_shard_t *model_shard(const model_t *m);
const tok_t *model_tok(const model_t *m);   /* NULL for a random model */
const gguf_t *model_gguf(const model_t *m); /* NULL for a random model */
kern_backend_t *model_backend(const model_t *m);
int model_max_batch(const model_t *m);
/* A model file's fingerprint: hex of SHA-256 over its first 4 MiB (header, metadata, the
 * start of the weights) and its size. Equal on every host holding the same file. */
#define MODEL_FP_LEN 32
int model_fingerprint(const char *path, char out[MODEL_FP_LEN + 1]);
/* Weight bytes this rank holds in its backend. */
size_t model_weight_bytes(const model_t *m);
/* Geometry for this rank's KV cache with max_seqs slots. */
kv_geom_t model_kv_geom(const model_t *m, int max_seqs);

/* A batch: n tokens; a sequence's tokens are contiguous and in position order. */
typedef struct {
  int n;
  const int32_t *tokens; /* [n] */
  const int32_t *pos;    /* [n] */
  const int32_t *seq;    /* [n] cache slots */
  const uint8_t *logits; /* [n] 1 = output logits for this token; NULL = last of each seq */
} model_batch_t;

/* Runs the forward pass. Collective over comm (every rank calls it with the same batch).
 * On rank 0, logits receives [n_out][n_vocab] rows in batch order (n_out = tokens flagged);
 * other ranks may pass NULL. Returns 0 or QE_E*. */
int model_forward(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const model_batch_t *b,
                  float *logits);
/* The same forward pass, but rank 0 receives only the greedy choice of each output row: ids
 * [n_out] (kern_ops_t.argmax on the backend: lowest id on ties, as greedy sampling), so a GPU
 * backend copies n_out ids to the host instead of n_out * n_vocab logits. */
int model_forward_greedy(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const model_batch_t *b,
                         int32_t *ids);

/* Decode steps as recorded graphs (CUDA graphs; model_graph.c). A step that is decode only (one
 * token of each of n distinct sequences, every row wanting output) on a backend that records
 * graphs (kern_ops_t.graph_begin), a cache with fixed-shape steps (kv_cache_ops_t.fixed_fill)
 * and one rank is padded to its bucket (the next power of two, capped at the cache's slots and
 * the model's batch) and replays that bucket's graph: every layer, the logits and, for
 * model_forward_greedy, the argmax; model_forward's logits only for buckets of at most 64 rows.
 * Each bucket's first step runs the same launches without recording (warm-up), its second
 * records them; a graph is recorded again when the backend's or the cache's scratch moved or
 * the cache changed. Other steps (prefill, mixed, larger logits buckets, all-reduces that are
 * synchronous or timed) run eagerly. On by default; QE_CUDA_GRAPHS=0 in the environment at load, or
 * model_set_graphs(m, 0), runs everything eagerly. Under tensor parallelism (NCCL on the
 * backend's stream, not timed) the ranks agree on every such step over the CPU link (recording
 * and launching captured collectives is collective), and record and replay together.
 * model_set_graphs(m, 0) also frees the graphs: call it before destroying the NCCL
 * communicator whose collectives they recorded (its destruction waits for them). */
void model_set_graphs(model_t *m, int on);
/* 1 when decode steps may replay graphs: switched on, on a backend that records them. */
int model_graphs_on(const model_t *m);
typedef struct {
  long captures;    /* graphs recorded */
  long replays;     /* steps run by launching a graph */
  long warmups;     /* fixed-shape steps run without a graph (first of a bucket, failed records) */
  long eager_steps; /* decode-only steps that could not take a graph (QE_ERANGE from the cache) */
} model_graph_stats_t;
void model_graph_stats(const model_t *m, model_graph_stats_t *out);

#endif
