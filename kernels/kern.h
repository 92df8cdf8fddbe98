/* kern: the compute backend interface. A backend is a table of function pointers plus a
 * context; model and cache code call the table and never include a CUDA header.
 * Buffers passed to the table live in the backend's memory (host memory for `cpu`, device
 * memory for `cuda`): allocate them with kern_alloc. Shapes are noted as [rows][cols],
 * row-major. A backend is used by one thread at a time. */
#ifndef QE_KERN_H
#define QE_KERN_H

#include <stddef.h>
#include <stdint.h>

typedef struct kern_backend kern_backend_t;
/* A recorded sequence of a backend's ops, replayed as a whole (a CUDA graph). */
typedef struct kern_graph kern_graph_t;

/* How a weight's data is stored (kern_weight_t.dtype). */
typedef enum {
  KERN_WEIGHT_F32 = 0,
  KERN_WEIGHT_BF16 = 1,
  KERN_WEIGHT_PACKED = 2,
  KERN_WEIGHT_PACKED4 = 3
} kern_weight_dtype_t;

/* A weight matrix [rows][cols], row-major, in backend memory.
 * - dtype KERN_WEIGHT_F32 (0: what `{data, rows, cols}` gives): data is a plain fp32 backend
 *   buffer, usable wherever kern.h takes an fp32 buffer. Every backend's matmul accepts it (the
 *   cuda backend rounds it to bf16 on each call: meant for tests, not for model weights).
 * - Weights made by weight_upload are in the backend's compute type for weights: F32 on cpu,
 *   BF16 on cuda. The caller owns them and releases them with weight_free.
 * - KERN_WEIGHT_PACKED (made by weight_upload_blocks, cpu only): [rows][cols] int8 codes, then
 *   the fp32 scales and then the fp32 offsets of the blocks of 32, [rows][cols / 32] each; a
 *   weight is fma(code, scale, offset) (kernels/cpu/kern_cpu_packed.c). KERN_WEIGHT_PACKED4:
 *   the same with two 4-bit codes a byte (made when every code fits). */
typedef struct {
  void *data;
  int rows;
  int cols;
  int dtype; /* kern_weight_dtype_t */
} kern_weight_t;

/* Bytes held by w's data. */
static inline size_t kern_weight_bytes(const kern_weight_t *w) {
  size_t n = (size_t)(w->rows > 0 ? w->rows : 0) * (size_t)(w->cols > 0 ? w->cols : 0);
  if (w->dtype == KERN_WEIGHT_PACKED) return n + 2 * (n / 32) * sizeof(float);
  if (w->dtype == KERN_WEIGHT_PACKED4) return n / 2 + 2 * (n / 32) * sizeof(float);
  return (w->dtype == KERN_WEIGHT_BF16 ? 2 : 4) * n;
}

/* Rows r0 .. r0 + n - 1 of w (F32 or BF16) as a weight of their own that shares w's data (not
 * to be freed). */
static inline kern_weight_t kern_weight_rows(const kern_weight_t *w, int r0, int n) {
  const size_t el = w->dtype == KERN_WEIGHT_BF16 ? 2 : 4;
  return (kern_weight_t){(char *)w->data + (size_t)r0 * (size_t)w->cols * el, n, w->cols, w->dtype};
}

/* RoPE parameters. mode NORM rotates interleaved pairs (2i, 2i+1) (GGUF llama: weights are
 * permuted at conversion); NEOX rotates half-split pairs (i, i + n_rot/2) (qwen2, HF).
 * freq(i) = freq_scale * theta^(-2i/n_rot) / factors[i] (factors may be NULL: llama3-style
 * rope_freqs); YaRN when ext_factor != 0 (llama.cpp's rope_yarn semantics). */
typedef enum { KERN_ROPE_NORM = 0, KERN_ROPE_NEOX = 2 } kern_rope_mode_t;
typedef struct {
  int mode;
  int n_rot;            /* rotated dims per head (<= head_dim, even) */
  float theta;          /* freq_base */
  float freq_scale;     /* 1 / linear scaling factor */
  const float *factors; /* [n_rot/2] or NULL (host memory on every backend) */
  float ext_factor;     /* YaRN; 0 disables */
  float attn_factor;    /* YaRN magnitude scale; 1 normally */
  float beta_fast, beta_slow;
  int n_ctx_orig; /* YaRN original context */
} kern_rope_t;

/* Keys and values read where a cache keeps them (host backends only), instead of gathered into
 * k and v: n_run runs of consecutive keys, in key order, run r holding keys [first[r],
 * first[r + 1]) (first[n_run] == n_kv), none longer than max_rows. */
typedef struct kern_kv_src {
  int n_run;
  int max_rows;
  const int32_t *first; /* [n_run + 1] */
  /* Channels [c0, c0 + nc) of run r's keys (which 0, post-RoPE) or values (which 1) of KV head
   * kvh (c0 and nc multiples of 16, or the whole head): sets *rows, pointing into the cache or
   * into buf (room for max_rows * nc floats), and *stride (floats from one row to the next),
   * and returns the run's length. Called from the backend's threads at once: it must not
   * change shared state. */
  int (*view)(const struct kern_kv_src *src, int r, int which, int kvh, int c0, int nc, float *buf,
              const float **rows, size_t *stride);
  const void *ctx;
} kern_kv_src_t;

/* One sequence's attention work: n_q queries at positions q_pos0 .. q_pos0+n_q-1 attend
 * causally to the keys whose position is <= the query's. Key j is at position k_pos[j], or at
 * position j when k_pos is NULL (then n_kv >= q_pos0 + n_q). */
typedef struct {
  const float *q;           /* [n_q][n_head][head_dim] */
  const float *k;           /* [n_kv][n_kv_head][head_dim] (post-RoPE); unused with src */
  const float *v;           /* [n_kv][n_kv_head][head_dim]; unused with src */
  const kern_kv_src_t *src; /* optional (host backends): the keys and values, in place of k, v */
  float *out;               /* [n_q][n_head][head_dim] */
  float *key_mass;          /* optional [n_kv]: += (1/n_head) sum_h sum_{i >= mass_q0} a_i^h(j) */
  const int32_t *k_pos;     /* optional [n_kv], ascending */
  int n_q;
  int n_kv;
  int q_pos0;
  int mass_q0; /* first query that contributes to key_mass (0: all) */
} kern_attn_seq_t;

typedef struct {
  int n_head;    /* query heads (local to this rank) */
  int n_kv_head; /* KV heads (local); n_head % n_kv_head == 0 (GQA) */
  int head_dim;
  float scale; /* usually 1/sqrt(head_dim) */
} kern_attn_shape_t;

/* Sampling parameters: temp <= 0 means greedy (argmax, lowest id on ties). top_k <= 0 and
 * top_p >= 1 disable those filters. */
typedef struct {
  float temp;
  int top_k;
  float top_p;
} kern_sampler_t;

typedef struct kern_ops {
  const char *name;
  int host_memory; /* 1 if backend buffers are plain host memory (cpu) */
  void (*destroy)(kern_backend_t *be);
  void *(*alloc)(kern_backend_t *be, size_t bytes); /* NULL on failure */
  void (*free)(kern_backend_t *be, void *p);
  int (*upload)(kern_backend_t *be, void *dst, const void *src, size_t bytes);
  int (*download)(kern_backend_t *be, void *dst, const void *src, size_t bytes);
  /* Copy within backend memory. */
  int (*copy)(kern_backend_t *be, void *dst, const void *src, size_t bytes);
  /* Makes *w a weight [rows][cols] in the backend's compute type for weights (cpu: an fp32
   * copy; cuda: bf16, converted on the device through a small fp32 staging buffer), filled from
   * host, fp32 [rows][cols] in host memory, which is read before the call returns. The caller
   * owns *w: weight_free. Returns 0; QE_EINVAL for negative dimensions; QE_ENOMEM when the
   * backend has no memory for it (nothing held, *w zeroed); QE_EBACKEND on a device fault. */
  int (*weight_upload)(kern_backend_t *be, kern_weight_t *w, const float *host, int rows, int cols);
  /* Backends with packed_weights set (kern_backend.packed_weights): makes *w a
   * KERN_WEIGHT_PACKED weight [rows][cols] (cols a multiple of 32) from host codes [rows][cols]
   * and the scales and offsets [rows][cols / 32] of its blocks of 32, copied. NULL elsewhere.
   * Returns 0, QE_EINVAL (bad shape) or QE_ENOMEM. */
  int (*weight_upload_blocks)(kern_backend_t *be, kern_weight_t *w, const int8_t *code,
                              const float *scale, const float *offset, int rows, int cols);
  /* Frees a weight made by weight_upload or weight_upload_blocks and zeroes *w (a NULL data is
   * a no-op). */
  void (*weight_free)(kern_backend_t *be, kern_weight_t *w);
  /* Optional (NULL: the model keeps its projections apart; see kern_backend.fuse_proj): makes *out
   * the weights parts[0..n) (made by this backend's weight_upload, the same cols) stacked by
   * rows, and frees the parts (zeroed). On failure the parts are left as they were. Returns 0,
   * QE_EUNSUPPORTED (parts of another kind or width: the model keeps them apart), QE_EINVAL
   * (no parts) or QE_ENOMEM. */
  int (*weight_concat)(kern_backend_t *be, kern_weight_t *out, kern_weight_t *parts, int n);
  /* y[m][w.rows] = x[m][w.cols] · wᵀ (+ bias[w.rows] if bias; accumulate into y if acc). w is a
   * plain fp32 weight or one made by this backend's weight_upload. */
  void (*matmul)(kern_backend_t *be, float *y, const float *x, const kern_weight_t *w,
                 const float *bias, int m, int acc);
  /* y[m][n] = x / rms(x) * g, g [n]. y may equal x. */
  void (*rmsnorm)(kern_backend_t *be, float *y, const float *x, const float *g, int m, int n,
                  float eps);
  /* x [m][n_heads][head_dim] rotated in place at positions pos[m]. */
  void (*rope)(kern_backend_t *be, float *x, const int32_t *pos, int m, int n_heads, int head_dim,
               const kern_rope_t *r);
  /* y[m][n] = silu(gate) * up. y may equal gate. */
  void (*swiglu)(kern_backend_t *be, float *y, const float *gate, const float *up, int m, int n);
  /* Optional, with weight_concat: qkv [m][n_q + 2 n_kv][head_dim] (the output of a fused q, k,
   * v projection) split into q [m][n_q][head_dim] and k [m][n_kv][head_dim], rotated as rope
   * rotates them in place, and v [m][n_kv][head_dim] copied: the same bits as copying the
   * columns out and calling rope on q and k. head_dim even; the outputs differ from qkv. */
  void (*qkv_rope)(kern_backend_t *be, float *q, float *k, float *v, const float *qkv,
                   const int32_t *pos, int m, int n_q, int n_kv, int head_dim,
                   const kern_rope_t *r);
  /* Optional, with weight_concat: y[m][n] = silu(gate) * up where gu [m][2n] holds each row's
   * gate then its up (a fused projection's output): swiglu's bits. y differs from gu. */
  void (*swiglu_cat)(kern_backend_t *be, float *y, const float *gu, int m, int n);
  /* y[i] += x[i]. */
  void (*add)(kern_backend_t *be, float *y, const float *x, size_t n);
  /* Optional (NULL: add, then rmsnorm): x[m][n] += d, then y[m][n] = x / rms(x) * g, the same
   * bits as those two calls (the residual add before the next layer's norm in one pass). y
   * differs from x and d. */
  void (*add_rmsnorm)(kern_backend_t *be, float *x, const float *d, float *y, const float *g, int m,
                      int n, float eps);
  /* y[m][n] = table[ids[m]][n]. table is fp32 [vocab][n] backend memory on every backend (a
   * plain buffer, or the data of a KERN_WEIGHT_F32 weight), never bf16. */
  void (*embed)(kern_backend_t *be, float *y, const float *table, const int32_t *ids, int m, int n);
  /* Optional (NULL where the backend has none: cuda): y[m][n] = rows ids of the weight w
   * ([vocab][n], made by weight_upload or weight_upload_blocks), the values its matmul uses; a
   * packed embedding table then needs no fp32 copy. */
  void (*embed_w)(kern_backend_t *be, float *y, const kern_weight_t *w, const int32_t *ids, int m,
                  int n);
  /* In-place row softmax of x [m][n]. */
  void (*softmax)(kern_backend_t *be, float *x, int m, int n);
  /* Attention for n_seqs sequences. */
  void (*attention)(kern_backend_t *be, const kern_attn_seq_t *seqs, int n_seqs,
                    const kern_attn_shape_t *shape);
  /* Samples one id from logits [n] (host memory); rng is the caller's per-sequence state.
   * scratch: n floats + n ints of host workspace owned by the caller. */
  int (*sample)(kern_backend_t *be, const float *logits, int n, const kern_sampler_t *s,
                uint64_t *rng, void *scratch);
  /* ids[i] = the index of the largest value of row i of x [m][n] (backend memory), the lowest
   * index on ties (the greedy choice of sample); -1 when the row holds a NaN or +inf, or only
   * -inf (logits no token can be drawn from: the engine ends that sequence with an error).
   * ids: host [m]; complete on return. 0 or a negative QE_E* (QE_EBACKEND on a device fault). */
  int (*argmax)(kern_backend_t *be, const float *x, int m, int n, int32_t *ids);

  /* Optional, NULL where the backend has none (cpu): steps recorded once and replayed
   * (model_graph.c). All of them return 0 or a negative QE_E*. */
  /* argmax into ids, backend memory [m], without waiting (queued like any op). */
  int (*argmax_dev)(kern_backend_t *be, const float *x, int m, int n, int32_t *ids);
  /* Host memory that upload_async reads (pinned); NULL on failure. host_free is NULL-safe. */
  void *(*host_alloc)(kern_backend_t *be, size_t bytes);
  void (*host_free)(kern_backend_t *be, void *p);
  /* Queues a copy of host memory from host_alloc to backend memory without waiting; src must
   * stay unchanged until the copy ran (e.g. until a later download returned). */
  int (*upload_async)(kern_backend_t *be, void *dst, const void *src, size_t bytes);
  /* Starts recording: the ops called until graph_end are recorded, not run (work outside the
   * backend that the caller enqueues on the backend's stream, e.g. a KV cache's kernels, is
   * recorded too). Nothing may wait for the device meanwhile. */
  int (*graph_begin)(kern_backend_t *be);
  /* Ends the recording and makes *out, owned by the caller (graph_free). When an op could not be
   * recorded (its scratch had to grow): QE_EUNSUPPORTED and *out = NULL; none of the recorded
   * ops has run, and the backend stays usable. */
  int (*graph_end)(kern_backend_t *be, kern_graph_t **out);
  /* Queues one replay of g (asynchronous, like any op). */
  int (*graph_launch)(kern_backend_t *be, kern_graph_t *g);
  void (*graph_free)(kern_backend_t *be, kern_graph_t *g); /* NULL-safe */
  /* A number that changes whenever scratch memory the backend's ops use internally moved (was
   * regrown): graphs recorded under another number may read freed memory and must be recorded
   * again. */
  unsigned long (*scratch_epoch)(kern_backend_t *be);
} kern_ops_t;

struct kern_backend {
  const kern_ops_t *ops;
  int n_threads;
  /* 1: model weights stored in blocks of 32 are given to weight_upload_blocks as they are
   * (exactly) rather than dequantized to weight_upload (kern_cpu_create_ex PACKED). */
  int packed_weights;
  /* 1: the model stacks each layer's q, k, v weights and its gate, up weights into one matmul
   * each (weight_concat, qkv_rope and swiglu_cat must be set): fewer, larger GEMMs where they
   * pay (the cuda backend; $QE_CUDA_FUSE_PROJ=0 turns it off there). */
  int fuse_proj;
};

/* The CPU backend (OpenBLAS when built with it, plain C otherwise). n_threads <= 0: all
 * cores. *out owned by caller: kern_destroy(). */
int kern_cpu_create(int n_threads, kern_backend_t **out);
/* The same with a choice of model weights: KERN_WEIGHT_F32 (kern_cpu_create's: every weight
 * dequantized to fp32), or KERN_WEIGHT_PACKED (weights a GGUF stores in blocks of 32 kept as
 * int8 codes with their blocks' scales and offsets, exactly: 1.25 bytes a weight instead of 4,
 * the same products; fp32 for the others). QE_EINVAL for any other value. */
int kern_cpu_create_ex(int n_threads, int weights, kern_backend_t **out);
void kern_destroy(kern_backend_t *be); /* NULL-safe */

/* Seeds a per-sequence sampler state (splitmix64 of seed; never 0). */
uint64_t kern_rng_seed(uint64_t seed);
/* weight_concat's check of parts[0..n): 0 and their rows in *rows; QE_EUNSUPPORTED (naming
 * backend) when a part is not of dtype or not as wide as the first; QE_EINVAL for no parts or
 * more than INT_MAX rows. */
int kern_weight_stack_rows(const char *backend, const kern_weight_t *parts, int n, int dtype,
                           size_t *rows);
/* Next uniform float in [0, 1) from state (xorshift64*). */
float kern_rng_uniform(uint64_t *state);

#define kern_alloc(be, n) ((be)->ops->alloc((be), (n)))
#define kern_free(be, p)  ((be)->ops->free((be), (p)))

#endif
