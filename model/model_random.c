/* model_random: a model built from a shape alone, with no file and no tokenizer, for benchmarks
 * and tests at real sizes (an 8B or 70B model without downloading one). Each weight element is
 * splitmix64 of (a seed per tensor, from the seed and the tensor's GGUF name) at the element's
 * index in the full tensor, so every tensor-parallel shard is a slice of the 1-rank model. The
 * host generates one tensor at a time on all cores and hands it to the backend's weight_upload.
 * Also the named shapes (llama3-8b, llama3-70b, tiny). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_internal.h"
#include "qe_status.h"

#define RND_STD         0.02f /* of every matrix, as HF's initializer_range */
#define RND_MAX_DIM     (1 << 20)
#define RND_MAX_THREADS 64
#define RND_GOLDEN      0x9E3779B97F4A7C15ULL

/* ---- named shapes ------------------------------------------------------------------------ */

#define RND_L3_NROT 128
static float rnd_l3_factors[RND_L3_NROT / 2];
static pthread_once_t rnd_l3_once = PTHREAD_ONCE_INIT;

/* rope_freqs as llama.cpp's converter computes them (fp32) for rope_scaling type llama3:
 * factor 8, low_freq_factor 1, high_freq_factor 4, original context 8192, theta 500000. */
static void rnd_l3_init(void) {
  const float base = 500000.0f, factor = 8.0f, lo = 1.0f, hi = 4.0f, old_ctx = 8192.0f;
  const float lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
  for (int i = 0; i < RND_L3_NROT / 2; i++) {
    float freq = 1.0f / powf(base, (float)(2 * i) / (float)RND_L3_NROT);
    float wavelen = 2.0f * (float)M_PI / freq, f;
    if (wavelen < hi_wavelen) {
      f = 1.0f;
    } else if (wavelen > lo_wavelen) {
      f = factor;
    } else {
      float smooth = (old_ctx / wavelen - lo) / (hi - lo);
      f = 1.0f / ((1.0f - smooth) / factor + smooth);
    }
    rnd_l3_factors[i] = f;
  }
}

/* A llama of the given dimensions with head_dim 128, 8 KV heads, Llama 3.1's vocabulary,
 * context and rope. */
static model_hparams_t rnd_llama3(int n_embd, int n_layer, int n_head, int n_ff) {
  pthread_once(&rnd_l3_once, rnd_l3_init);
  return (model_hparams_t){.arch = MODEL_ARCH_LLAMA,
                           .n_vocab = 128256,
                           .n_embd = n_embd,
                           .n_layer = n_layer,
                           .n_head = n_head,
                           .n_head_kv = 8,
                           .head_dim = 128,
                           .n_ff = n_ff,
                           .n_ctx_train = 131072,
                           .rms_eps = 1e-5f,
                           .rope = {.mode = KERN_ROPE_NORM,
                                    .n_rot = RND_L3_NROT,
                                    .theta = 500000.0f,
                                    .freq_scale = 1.0f,
                                    .factors = rnd_l3_factors,
                                    .attn_factor = 1.0f,
                                    .beta_fast = 32.0f,
                                    .beta_slow = 1.0f,
                                    .n_ctx_orig = 131072}};
}

/* A 2-layer GQA llama small enough for unit tests. */
static model_hparams_t rnd_tiny(void) {
  return (model_hparams_t){.arch = MODEL_ARCH_LLAMA,
                           .n_vocab = 512,
                           .n_embd = 256,
                           .n_layer = 2,
                           .n_head = 8,
                           .n_head_kv = 2,
                           .head_dim = 32,
                           .n_ff = 512,
                           .n_ctx_train = 4096,
                           .rms_eps = 1e-5f,
                           .rope = {.mode = KERN_ROPE_NORM,
                                    .n_rot = 32,
                                    .theta = 10000.0f,
                                    .freq_scale = 1.0f,
                                    .attn_factor = 1.0f,
                                    .beta_fast = 32.0f,
                                    .beta_slow = 1.0f,
                                    .n_ctx_orig = 4096}};
}

int model_shape_named(const char *name, model_hparams_t *hp) {
  if (!name) name = "";
  if (!strcmp(name, "llama3-8b"))
    *hp = rnd_llama3(4096, 32, 32, 14336);
  else if (!strcmp(name, "llama3-70b"))
    *hp = rnd_llama3(8192, 80, 64, 28672);
  else if (!strcmp(name, "tiny"))
    *hp = rnd_tiny();
  else
    return qe_errf(QE_EINVAL, "model: unknown shape '%s' (known: llama3-8b, llama3-70b, tiny)",
                   name);
  return 0;
}

/* ---- values ------------------------------------------------------------------------------ */

static inline uint64_t rnd_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/* The seed of tensor `name`: splitmix64 of the model seed mixed with FNV-1a of the name. */
static uint64_t rnd_tensor_seed(uint64_t seed, const char *name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *name; name++) h = (h ^ (uint8_t)*name) * 0x100000001b3ULL;
  return rnd_mix(rnd_mix(seed + RND_GOLDEN) ^ h);
}

/* Element i of a tensor seeded ts: the (i+1)-th splitmix64 output, uniform in [-amp, amp). */
static inline float rnd_val(uint64_t ts, uint64_t i, float amp) {
  uint64_t u = rnd_mix(ts + (i + 1) * RND_GOLDEN) >> 40; /* 24 bits */
  return ((float)u * 0x1p-23f - 1.0f) * amp;
}

/* A slice of a full [ne1][ne0] tensor: rows [r0, r0+nr), columns [c0, c0+nc). */
typedef struct {
  int64_t ne0, ne1;
  int r0, nr, c0, nc;
} rnd_slice_t;

/* One thread's share of filling dst [nr][nc] with the slice's values. */
typedef struct {
  float *dst;
  uint64_t ts;
  const rnd_slice_t *s;
  int row0, row1; /* rows of the slice */
} rnd_task_t;

static void *rnd_task_run(void *arg) {
  const rnd_task_t *t = arg;
  const rnd_slice_t *s = t->s;
  const float amp = RND_STD * 1.7320508f; /* uniform [-a, a) has std a / sqrt(3) */
  for (int r = t->row0; r < t->row1; r++) {
    uint64_t base = (uint64_t)(s->r0 + r) * (uint64_t)s->ne0 + (uint64_t)s->c0;
    float *d = t->dst + (size_t)r * (size_t)s->nc;
    for (int c = 0; c < s->nc; c++) d[c] = rnd_val(t->ts, base + (uint64_t)c, amp);
  }
  return NULL;
}

/* Fills dst [s->nr][s->nc] on up to n_threads threads (the caller's among them); a thread
 * that cannot be started has its rows done by the caller. */
static void rnd_fill(float *dst, uint64_t ts, const rnd_slice_t *s, int n_threads) {
  size_t n = (size_t)s->nr * (size_t)s->nc;
  int nt = n < ((size_t)1 << 16) ? 1 : n_threads < s->nr ? n_threads : s->nr;
  pthread_t th[RND_MAX_THREADS];
  rnd_task_t tk[RND_MAX_THREADS];
  int started[RND_MAX_THREADS] = {0};
  for (int t = 0; t < nt; t++)
    tk[t] = (rnd_task_t){dst, ts, s, (int)((int64_t)s->nr * t / nt),
                         (int)((int64_t)s->nr * (t + 1) / nt)};
  for (int t = 1; t < nt; t++) started[t] = !pthread_create(&th[t], NULL, rnd_task_run, &tk[t]);
  rnd_task_run(&tk[0]);
  for (int t = 1; t < nt; t++) {
    if (started[t])
      pthread_join(th[t], NULL);
    else
      rnd_task_run(&tk[t]);
  }
}

/* ---- the model's tensors ----------------------------------------------------------------- */

/* The generator: the model being filled and one host buffer reused by every tensor. */
typedef struct {
  model_t *m;
  uint64_t seed;
  float *buf;
  size_t cap; /* floats */
  int n_threads;
} rnd_gen_t;

/* The host buffer with room for n floats; NULL (with a detail) when out of memory. */
static float *rnd_host(rnd_gen_t *g, size_t n, const char *name) {
  if (n <= g->cap) return g->buf;
  free(g->buf);
  g->cap = 0;
  if (!(g->buf = malloc(sizeof(float) * n))) {
    qe_errf(QE_ENOMEM, "model: no host memory to generate tensor '%s'", name);
    return NULL;
  }
  g->cap = n;
  return g->buf;
}

static int rnd_matrix(rnd_gen_t *g, const char *name, const rnd_slice_t *s, kern_weight_t *w) {
  float *h = rnd_host(g, (size_t)s->nr * (size_t)s->nc, name);
  if (!h) return QE_ENOMEM;
  rnd_fill(h, rnd_tensor_seed(g->seed, name), s, g->n_threads);
  return model__weight(g->m, w, h, s->nr, s->nc, name);
}

/* A vector [n] of one value (norms 1, biases 0). */
static int rnd_const(rnd_gen_t *g, const char *name, int n, float v, float **out) {
  float *h = rnd_host(g, (size_t)n, name);
  if (!h) return QE_ENOMEM;
  for (int i = 0; i < n; i++) h[i] = v;
  return model__vec(g->m, out, h, (size_t)n, name);
}

static const char *rnd_name(char *buf, int layer, const char *what) {
  snprintf(buf, 96, "blk.%d.%s", layer, what);
  return buf;
}

/* Attention: column-parallel Q/K/V (local rows), row-parallel O (local columns). */
static int rnd_attn(rnd_gen_t *g, int l, model_layer_t *L) {
  const model_hparams_t *hp = &g->m->hp;
  const model_shard_t *sh = &g->m->sh;
  int hd = hp->head_dim, E = hp->n_embd, NQ = hp->n_head * hd, NK = hp->n_head_kv * hd;
  int q0 = sh->head0 * hd, nq = sh->n_head * hd, k0 = sh->kv0 * hd, nk = sh->n_kv * hd;
  rnd_slice_t sq = {E, NQ, q0, nq, 0, E}, sk = {E, NK, k0, nk, 0, E}, so = {NQ, E, 0, E, q0, nq};
  char b[96];
  int rc = rnd_const(g, rnd_name(b, l, "attn_norm.weight"), E, 1.0f, &L->attn_norm);
  if (!rc) rc = rnd_matrix(g, rnd_name(b, l, "attn_q.weight"), &sq, &L->wq);
  if (!rc) rc = rnd_matrix(g, rnd_name(b, l, "attn_k.weight"), &sk, &L->wk);
  if (!rc) rc = rnd_matrix(g, rnd_name(b, l, "attn_v.weight"), &sk, &L->wv);
  if (!rc) rc = rnd_matrix(g, rnd_name(b, l, "attn_output.weight"), &so, &L->wo);
  if (rc || !hp->qkv_bias) return rc;
  rc = rnd_const(g, rnd_name(b, l, "attn_q.bias"), nq, 0.0f, &L->bq);
  if (!rc) rc = rnd_const(g, rnd_name(b, l, "attn_k.bias"), nk, 0.0f, &L->bk);
  if (!rc) rc = rnd_const(g, rnd_name(b, l, "attn_v.bias"), nk, 0.0f, &L->bv);
  return rc;
}

/* FFN: column-parallel gate/up (local rows), row-parallel down (local columns). */
static int rnd_ffn(rnd_gen_t *g, int l, model_layer_t *L) {
  const model_hparams_t *hp = &g->m->hp;
  int E = hp->n_embd, F = hp->n_ff, f0 = g->m->sh.ff0, nf = g->m->sh.n_ff;
  rnd_slice_t su = {E, F, f0, nf, 0, E}, sd = {F, E, 0, E, f0, nf};
  char b[96];
  int rc = rnd_const(g, rnd_name(b, l, "ffn_norm.weight"), E, 1.0f, &L->ffn_norm);
  if (!rc) rc = rnd_matrix(g, rnd_name(b, l, "ffn_gate.weight"), &su, &L->wg);
  if (!rc) rc = rnd_matrix(g, rnd_name(b, l, "ffn_up.weight"), &su, &L->wu);
  if (!rc) rc = rnd_matrix(g, rnd_name(b, l, "ffn_down.weight"), &sd, &L->wd);
  return rc;
}

/* token_embd (every rank: embed), output_norm, and output on rank 0 when untied. */
static int rnd_globals(rnd_gen_t *g) {
  model_t *m = g->m;
  int E = m->hp.n_embd, V = m->hp.n_vocab;
  rnd_slice_t se = {E, V, 0, V, 0, E};
  int rc = rnd_const(g, "output_norm.weight", E, 1.0f, &m->out_norm);
  float *h = rc ? NULL : rnd_host(g, (size_t)V * (size_t)E, "token_embd.weight");
  if (!rc && !h) rc = QE_ENOMEM;
  if (!rc) rnd_fill(h, rnd_tensor_seed(g->seed, "token_embd.weight"), &se, g->n_threads);
  if (!rc) rc = model__embd(m, h);
  if (rc || m->hp.tied_output || m->sh.rank != 0) return rc;
  return rnd_matrix(g, "output.weight", &se, &m->out);
}

static int rnd_weights(model_t *m, uint64_t seed) {
  long nc = sysconf(_SC_NPROCESSORS_ONLN);
  rnd_gen_t g = {m, seed, NULL, 0, nc < 1 ? 1 : nc > RND_MAX_THREADS ? RND_MAX_THREADS : (int)nc};
  int rc = 0;
  if (!(m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers)))
    rc = qe_errf(QE_ENOMEM, "model: out of memory");
  for (int l = 0; !rc && l < m->hp.n_layer; l++) {
    rc = rnd_attn(&g, l, &m->layers[l]);
    if (!rc) rc = rnd_ffn(&g, l, &m->layers[l]);
  }
  if (!rc) rc = rnd_globals(&g);
  free(g.buf);
  return rc;
}

/* ---- creation ------------------------------------------------------------------------------ */

static int rnd_check(const model_hparams_t *hp) {
  const int dims[] = {hp->n_vocab,   hp->n_embd,   hp->n_layer, hp->n_head,
                      hp->n_head_kv, hp->head_dim, hp->n_ff};
  const char *names[] = {"n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff"};
  for (int i = 0; i < 7; i++)
    if (dims[i] <= 0 || dims[i] > RND_MAX_DIM)
      return qe_errf(QE_EINVAL, "model: shape has %s = %d (1 .. %d)", names[i], dims[i],
                     RND_MAX_DIM);
  if (hp->arch != MODEL_ARCH_LLAMA && hp->arch != MODEL_ARCH_QWEN2)
    return qe_errf(QE_EINVAL, "model: shape has unknown architecture %d", hp->arch);
  if (hp->n_head % hp->n_head_kv)
    return qe_errf(QE_EINVAL, "model: %d heads are not a multiple of %d KV heads", hp->n_head,
                   hp->n_head_kv);
  const kern_rope_t *r = &hp->rope;
  if (r->n_rot <= 0 || r->n_rot > hp->head_dim || r->n_rot % 2 || r->n_rot / 2 > 512 ||
      !(r->theta > 0) || !(hp->rms_eps >= 0))
    return qe_errf(QE_EINVAL,
                   "model: bad rope or norm parameters (n_rot %d, head_dim %d, theta %g)", r->n_rot,
                   hp->head_dim, r->theta);
  return 0;
}

int model_create_random(const model_hparams_t *hp, uint64_t seed, const model_load_opts_t *o,
                        model_t **out) {
  int rc = rnd_check(hp);
  if (rc) return rc;
  model_t *m = model__new(o);
  if (!m) return qe_errf(QE_ENOMEM, "model: out of memory");
  m->hp = *hp;
  model__own_rope_factors(m);
  rc = model_shard_of(&m->hp, o->rank, o->size, &m->sh);
  if (!rc) rc = rnd_weights(m, seed);
  if (!rc) rc = model__fuse_proj(m);
  if (!rc) rc = model__alloc_scratch(m);
  if (rc) {
    model_destroy(m);
    return rc;
  }
  *out = m;
  return 0;
}
