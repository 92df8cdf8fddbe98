/* model_load: reads hyperparameters from GGUF metadata (llama, qwen2), checks every tensor's
 * shape, and dequantizes this rank's shard of the weights into the backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "qe_env.h"
#include "qe_status.h"

#define MODEL_MAX_DIM (1 << 20)

/* Reads "<arch>.<suffix>" as u32 into *out; keeps *out when absent and !required. */
static int hp_u32(const gguf_t *g, const char *arch, const char *suffix, int required, int *out) {
  char key[128];
  uint32_t v;
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  int rc = gguf_get_u32(g, key, &v);
  if (rc == QE_ENOTFOUND && !required) return 0;
  if (rc) return rc == QE_ENOTFOUND ? qe_errf(rc, "model: missing metadata '%s'", key) : rc;
  if (v == 0 || v > MODEL_MAX_DIM)
    return qe_errf(QE_EFORMAT, "model: metadata '%s' = %u is out of range", key, v);
  *out = (int)v;
  return 0;
}

/* Kinds of value an hp_f32 key must hold. */
enum { HP_NONNEG, HP_POS };

/* Reads "<arch>.<suffix>" as f32 into *out (kept when absent); QE_EFORMAT naming the key unless
 * the value is finite and >= 0 (HP_NONNEG) or > 0 (HP_POS). */
static int hp_f32(const gguf_t *g, const char *arch, const char *suffix, int kind, float *out) {
  char key[128];
  float v;
  snprintf(key, sizeof key, "%s.%s", arch, suffix);
  int rc = gguf_get_f32(g, key, &v);
  if (rc) return rc == QE_ENOTFOUND ? 0 : rc;
  if (!isfinite(v) || v < 0 || (kind == HP_POS && v == 0))
    return qe_errf(QE_EFORMAT, "model: metadata '%s' = %g is not a finite %s number", key, v,
                   kind == HP_POS ? "positive" : "non-negative");
  *out = v;
  return 0;
}

static int hp_arch(const gguf_t *g, model_hparams_t *hp, char *arch, size_t cap) {
  const char *s;
  size_t n;
  int rc = gguf_get_str(g, "general.architecture", &s, &n);
  if (rc) return qe_errf(rc, "model: missing metadata 'general.architecture'");
  snprintf(arch, cap, "%.*s", (int)(n < cap ? n : cap - 1), s);
  if (!strcmp(arch, "llama"))
    hp->arch = MODEL_ARCH_LLAMA;
  else if (!strcmp(arch, "qwen2"))
    hp->arch = MODEL_ARCH_QWEN2;
  else
    return qe_errf(QE_EUNSUPPORTED, "model: architecture '%s' is not supported (llama, qwen2)",
                   arch);
  return 0;
}

/* RoPE scaling as llama.cpp reads it: the factor from rope.scaling.factor, else the older
 * rope.scale_linear (absent or 0: none); the type from rope.scaling.type, "linear" when absent
 * (a factor without a type had been dropped: such a file ran unscaled). */
static int hp_rope_scaling(const gguf_t *g, const char *arch, model_hparams_t *hp) {
  char key[128];
  const char *s = "linear";
  size_t n = 6;
  float factor = -1.0f; /* (-1: no rope.scaling.factor) */
  const char *fkey = "rope.scaling.factor";
  int rc = hp_f32(g, arch, fkey, HP_NONNEG, &factor);
  if (!rc && factor < 0)
    fkey = "rope.scale_linear", factor = 0.0f, rc = hp_f32(g, arch, fkey, HP_NONNEG, &factor);
  if (rc) return rc;
  snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
  if ((rc = gguf_get_str(g, key, &s, &n)) && rc != QE_ENOTFOUND) return rc; /* (absent: linear) */
  if ((n == 4 && !memcmp(s, "none", 4)) || factor == 0.0f) return 0;
  if (!isfinite(1.0f / factor)) /* (a subnormal factor: an infinite frequency scale) */
    return qe_errf(QE_EFORMAT, "model: %s.%s = %g is too small", arch, fkey, factor);
  hp->rope.freq_scale = 1.0f / factor;
  if (n == 6 && !memcmp(s, "linear", 6)) return 0;
  if (n == 4 && !memcmp(s, "yarn", 4)) {
    hp->rope.ext_factor = 1.0f;
    return hp_u32(g, arch, "rope.scaling.original_context_length", 0, &hp->rope.n_ctx_orig);
  }
  return qe_errf(QE_EUNSUPPORTED, "model: rope scaling type '%.*s' is not supported", (int)n, s);
}

static int hp_rope(const gguf_t *g, const char *arch, model_hparams_t *hp) {
  kern_rope_t *r = &hp->rope;
  *r = (kern_rope_t){.mode = hp->arch == MODEL_ARCH_QWEN2 ? KERN_ROPE_NEOX : KERN_ROPE_NORM,
                     .n_rot = hp->head_dim,
                     .theta = 10000.0f,
                     .freq_scale = 1.0f,
                     .attn_factor = 1.0f,
                     .beta_fast = 32.0f,
                     .beta_slow = 1.0f,
                     .n_ctx_orig = hp->n_ctx_train};
  int rc = hp_u32(g, arch, "rope.dimension_count", 0, &r->n_rot);
  if (!rc) rc = hp_f32(g, arch, "rope.freq_base", HP_POS, &r->theta);
  if (!rc) rc = hp_rope_scaling(g, arch, hp);
  if (rc) return rc;
  if (r->n_rot > hp->head_dim || r->n_rot % 2 || r->n_rot / 2 > 512 || !(r->theta > 0))
    return qe_errf(QE_EFORMAT, "model: bad rope parameters (n_rot %d, head_dim %d, theta %g)",
                   r->n_rot, hp->head_dim, r->theta);
  return 0;
}

static int hp_vocab(const gguf_t *g, model_hparams_t *hp) {
  gguf_arr_t a;
  if (gguf_get_arr(g, "tokenizer.ggml.tokens", &a))
    return qe_errf(QE_ENOTFOUND, "model: missing metadata 'tokenizer.ggml.tokens'");
  if (a.n == 0 || a.n > MODEL_MAX_DIM)
    return qe_errf(QE_EFORMAT, "model: vocabulary size %zu out of range", a.n);
  hp->n_vocab = (int)a.n;
  return 0;
}

/* 1 for a Q/K/V bias (the suffix after "blk.N."), which the forward pass adds. */
static int qkv_bias_name(const char *what) {
  return !strcmp(what, "attn_q.bias") || !strcmp(what, "attn_k.bias") ||
         !strcmp(what, "attn_v.bias");
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* The file's tensors against its metadata: one of a block past block_count (blk.N. with N >=
 * n_layer) means the layers and the metadata disagree (loading the first n_layer blocks would
 * run a truncated model); a bias other than Q/K/V's has no term in the forward pass and is
 * refused rather than run without (llama.cpp takes several as optional on llama). *qkv: 1 when
 * some block has a Q/K/V bias (then every block must have all three: load_attn). */
static int check_blocks(const gguf_t *g, int n_layer, int *qkv) {
  for (int i = 0; i < gguf_n_tensors(g); i++) {
    const char *name = gguf_tensor(g, i)->name;
    int b = -1, len = 0;
    int in_blk = sscanf(name, "blk.%d.%n", &b, &len) == 1 && len > 0;
    if (in_blk && b >= n_layer)
      return qe_errf(QE_EFORMAT,
                     "model: tensor '%.80s' is of block %d, but block_count says %d blocks", name,
                     b, n_layer);
    if (in_blk && qkv_bias_name(name + len))
      *qkv = 1;
    else if (ends_with(name, ".bias"))
      return qe_errf(QE_EUNSUPPORTED, "model: tensor '%.80s': this bias is not supported", name);
  }
  return 0;
}

int model_read_hparams(const gguf_t *g, model_hparams_t *hp) {
  char arch[32];
  memset(hp, 0, sizeof *hp);
  int rc = hp_arch(g, hp, arch, sizeof arch);
  if (!rc) rc = hp_u32(g, arch, "embedding_length", 1, &hp->n_embd);
  if (!rc) rc = hp_u32(g, arch, "block_count", 1, &hp->n_layer);
  if (!rc) rc = hp_u32(g, arch, "feed_forward_length", 1, &hp->n_ff);
  if (!rc) rc = hp_u32(g, arch, "attention.head_count", 1, &hp->n_head);
  hp->n_head_kv = hp->n_head;
  if (!rc) rc = hp_u32(g, arch, "attention.head_count_kv", 0, &hp->n_head_kv);
  hp->n_ctx_train = 2048;
  if (!rc) rc = hp_u32(g, arch, "context_length", 0, &hp->n_ctx_train);
  hp->rms_eps = 1e-5f;
  if (!rc) rc = hp_f32(g, arch, "attention.layer_norm_rms_epsilon", HP_NONNEG, &hp->rms_eps);
  if (rc) return rc;
  hp->head_dim = 0; /* (attention.key_length, or n_embd / n_head when absent) */
  if ((rc = hp_u32(g, arch, "attention.key_length", 0, &hp->head_dim))) return rc;
  if ((!hp->head_dim && hp->n_embd % hp->n_head) || hp->n_head % hp->n_head_kv)
    return qe_errf(QE_EFORMAT, "model: n_embd %d, heads %d, kv heads %d are inconsistent",
                   hp->n_embd, hp->n_head, hp->n_head_kv);
  if (!hp->head_dim) hp->head_dim = hp->n_embd / hp->n_head;
  int v_dim = hp->head_dim; /* (values as long as keys: the only layout the kernels take) */
  if ((rc = hp_u32(g, arch, "attention.value_length", 0, &v_dim))) return rc;
  if (v_dim != hp->head_dim)
    return qe_errf(QE_EUNSUPPORTED,
                   "model: %s.attention.value_length %d differs from the key length %d (not "
                   "supported)",
                   arch, v_dim, hp->head_dim);
  hp->qkv_bias = hp->arch == MODEL_ARCH_QWEN2; /* (llama: when the file has them, check_blocks) */
  hp->tied_output = gguf_find_tensor(g, "output.weight") == NULL;
  if ((rc = hp_rope(g, arch, hp)) || (rc = check_blocks(g, hp->n_layer, &hp->qkv_bias))) return rc;
  return hp_vocab(g, hp);
}

int model_shard_of(const model_hparams_t *hp, int rank, int size, model_shard_t *sh) {
  if (size < 1 || rank < 0 || rank >= size)
    return qe_errf(QE_EINVAL, "model: rank %d of %d is invalid", rank, size);
  if (size > hp->n_head_kv || size > hp->n_ff)
    return qe_errf(QE_EINVAL, "model: tensor parallel size %d exceeds the %d KV heads", size,
                   hp->n_head_kv);
  int group = hp->n_head / hp->n_head_kv;
  sh->rank = rank;
  sh->size = size;
  sh->kv0 = rank * hp->n_head_kv / size;
  sh->n_kv = (rank + 1) * hp->n_head_kv / size - sh->kv0;
  sh->head0 = sh->kv0 * group;
  sh->n_head = sh->n_kv * group;
  sh->ff0 = (int)((long)rank * hp->n_ff / size);
  sh->n_ff = (int)((long)(rank + 1) * hp->n_ff / size) - sh->ff0;
  return 0;
}

uint64_t model_kv_share(const model_hparams_t *hp, const model_shard_t *sh, uint64_t bytes) {
  const uint64_t n = (uint64_t)hp->n_head_kv, k = (uint64_t)sh->n_kv;
  return bytes / n * k + bytes % n * k / n; /* (bytes * k / n without overflow) */
}

uint64_t model_kv_whole(const model_hparams_t *hp, const model_shard_t *sh, uint64_t rank_bytes) {
  const uint64_t n = (uint64_t)hp->n_head_kv, k = (uint64_t)sh->n_kv;
  return rank_bytes / k * n + (rank_bytes % k * n + k - 1) / k;
}

uint64_t model_kv_within(const model_hparams_t *hp, const model_shard_t *sh, uint64_t rank_bytes) {
  const uint64_t n = (uint64_t)hp->n_head_kv, k = (uint64_t)sh->n_kv;
  return rank_bytes / k * n + rank_bytes % k * n / k;
}

/* A slice request: rows [r0, r0+nr), columns [c0, c0+nc) of a [ne1][ne0] tensor. */
typedef struct {
  int64_t ne0, ne1;
  int r0, nr, c0, nc;
} model_slice_t;

static int check_shape(const gguf_tensor_t *t, const char *name, const model_slice_t *s) {
  int64_t ne1 = t->n_dims >= 2 ? t->ne[1] : 1;
  if (t->ne[0] != s->ne0 || ne1 != s->ne1 || t->n_dims > 2)
    return qe_errf(
        QE_EFORMAT, "model: tensor '%s' has shape [%lld, %lld] (%d dims), expected [%lld, %lld]",
        name, (long long)t->ne[0], (long long)ne1, t->n_dims, (long long)s->ne0, (long long)s->ne1);
  return 0;
}

/* Dequantizes a slice of tensor t into host memory hb [nr][nc]. */
static int dequant_slice(const gguf_tensor_t *t, const model_slice_t *s, float *hb) {
  size_t row_bytes = gguf_type_nbytes(t->type, s->ne0);
  float *row = s->nc == s->ne0 ? NULL : malloc(sizeof(float) * (size_t)s->ne0);
  if (s->nc != s->ne0 && !row) return qe_errf(QE_ENOMEM, "model: out of host memory");
  int rc = 0;
  for (int r = 0; r < s->nr && !rc; r++) {
    const uint8_t *src = (const uint8_t *)t->data + (size_t)(s->r0 + r) * row_bytes;
    float *dst = hb + (size_t)r * s->nc;
    rc = gguf_dequant(t->type, src, row ? row : dst, s->ne0);
    if (!rc && row) memcpy(dst, row + s->c0, sizeof(float) * (size_t)s->nc);
  }
  free(row);
  return rc;
}

model_t *model__new(const model_load_opts_t *o) {
  model_t *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->be = o->be;
  m->max_batch = o->max_batch > 0 ? o->max_batch : 512;
  m->out_rows = o->out_rows > 0 ? o->out_rows : 0; /* (0: sized with the vocabulary) */
  static const char *const off_on[] = {"0", "1"};  /* 0: every step eager */
  m->graphs_on = qe_env_choice("QE_CUDA_GRAPHS", off_on, 2, 1);
  return m;
}

/* After an upload of tensor `name` into *w: its bytes counted, or rc with the name in front of
 * the backend's detail. */
static int uploaded(model_t *m, int rc, const kern_weight_t *w, const char *name) {
  if (rc) {
    char why[192];
    snprintf(why, sizeof why, "%s", qe_errmsg());
    return qe_errf(rc, "model: tensor '%s': %s", name, why);
  }
  m->weight_bytes += kern_weight_bytes(w);
  return 0;
}

int model__weight(model_t *m, kern_weight_t *w, const float *host, int rows, int cols,
                  const char *name) {
  return uploaded(m, m->be->ops->weight_upload(m->be, w, host, rows, cols), w, name);
}

int model__vec(model_t *m, float **out, const float *host, size_t n, const char *name) {
  size_t bytes = sizeof(float) * n;
  float *dev = kern_alloc(m->be, bytes);
  if (!dev) return qe_errf(QE_ENOMEM, "model: no backend memory for tensor '%s'", name);
  int rc = m->be->ops->upload(m->be, dev, host, bytes);
  if (rc) {
    kern_free(m->be, dev);
    return rc;
  }
  m->weight_bytes += bytes;
  *out = dev;
  return 0;
}

int model__embd(model_t *m, const float *host) {
  int V = m->hp.n_vocab, E = m->hp.n_embd;
  if (m->hp.tied_output && m->sh.rank == 0) {
    int rc = model__weight(m, &m->out, host, V, E, "token_embd.weight");
    if (rc) return rc;
    if (m->out.dtype == KERN_WEIGHT_F32) { /* the same fp32 rows serve embed */
      m->tok_embd = m->out.data;
      return 0;
    }
  }
  return model__vec(m, &m->tok_embd, host, (size_t)V * E, "token_embd.weight");
}

void model__own_rope_factors(model_t *m) {
  if (!m->hp.rope.factors) return;
  memcpy(m->rope_factors, m->hp.rope.factors, sizeof(float) * (size_t)(m->hp.rope.n_rot / 2));
  m->hp.rope.factors = m->rope_factors;
}

/* Dequantizes a slice of tensor `name` into a new host buffer *hb [nr][nc] (NULL if absent and
 * optional). The caller frees *hb. */
static int read_slice(model_t *m, const char *name, const model_slice_t *s, int required,
                      float **hb) {
  const gguf_tensor_t *t = gguf_find_tensor(m->g, name);
  *hb = NULL;
  if (!t) return required ? qe_errf(QE_ENOTFOUND, "model: missing tensor '%s'", name) : 0;
  int rc = check_shape(t, name, s);
  if (rc) return rc;
  size_t n = (size_t)s->nr * (size_t)s->nc;
  float *h = malloc(sizeof(float) * (n ? n : 1));
  if (!h) return qe_errf(QE_ENOMEM, "model: no host memory for tensor '%s'", name);
  if ((rc = dequant_slice(t, s, h))) {
    free(h);
    return rc;
  }
  *hb = h;
  return 0;
}

static int load_vec(model_t *m, const char *name, int n, int c0, int nc, int req, float **out) {
  model_slice_t s = {n, 1, 0, 1, c0, nc};
  float *hb;
  *out = NULL;
  int rc = read_slice(m, name, &s, req, &hb);
  if (!rc && hb) rc = model__vec(m, out, hb, (size_t)nc, name);
  free(hb);
  return rc;
}

/* The slice s of t as codes and block scales and offsets, uploaded as a packed weight. */
static int load_blocks(model_t *m, const gguf_tensor_t *t, const model_slice_t *s, const char *name,
                       kern_weight_t *w) {
  size_t n = (size_t)s->nr * s->nc, row_bytes = gguf_type_nbytes(t->type, s->ne0);
  int8_t *code = malloc(n + (size_t)s->ne0);
  float *so = malloc(sizeof(float) * (2 * n / 32 + 2 * (size_t)s->ne0 / 32));
  int rc = code && so ? 0 : qe_errf(QE_ENOMEM, "model: no host memory for tensor '%s'", name);
  float *sc = so, *of = so + n / 32, *rs = of + n / 32, *ro = rs + s->ne0 / 32;
  int8_t *rc8 = code + n;
  for (int r = 0; r < s->nr && !rc; r++) { /* a whole row, then its columns [c0, c0 + nc) */
    const uint8_t *src = (const uint8_t *)t->data + (size_t)(s->r0 + r) * row_bytes;
    rc = gguf_blocks32(t->type, src, s->ne0, rc8, rs, ro);
    memcpy(code + (size_t)r * s->nc, rc8 + s->c0, (size_t)s->nc);
    memcpy(sc + (size_t)r * (s->nc / 32), rs + s->c0 / 32, sizeof(float) * (size_t)(s->nc / 32));
    memcpy(of + (size_t)r * (s->nc / 32), ro + s->c0 / 32, sizeof(float) * (size_t)(s->nc / 32));
  }
  if (!rc)
    rc = uploaded(m, m->be->ops->weight_upload_blocks(m->be, w, code, sc, of, s->nr, s->nc), w,
                  name);
  free(code);
  free(so);
  return rc;
}

/* 1 if the slice s of t goes to the backend in blocks of 32 (a backend that packs weights, a
 * block type, columns on block boundaries). */
static int packs(const model_t *m, const gguf_tensor_t *t, const model_slice_t *s) {
  return t && m->be->packed_weights && m->be->ops->weight_upload_blocks &&
         gguf_type_has_blocks32(t->type) && s->c0 % 32 == 0 && s->nc % 32 == 0 && s->ne0 % 32 == 0;
}

/* Loads the slice s of the matrix `name` as the weight *w [s->nr][s->nc]. */
static int load_weight(model_t *m, const char *name, const model_slice_t *s, kern_weight_t *w) {
  const gguf_tensor_t *t = gguf_find_tensor(m->g, name);
  if (packs(m, t, s)) {
    int rc = check_shape(t, name, s);
    return rc ? rc : load_blocks(m, t, s, name, w);
  }
  float *hb;
  int rc = read_slice(m, name, s, 1, &hb);
  if (!rc) rc = model__weight(m, w, hb, s->nr, s->nc, name);
  free(hb);
  return rc;
}

static int load_rows(model_t *m, const char *name, int ne0, int ne1, int r0, int nr,
                     kern_weight_t *w) {
  model_slice_t s = {ne0, ne1, r0, nr, 0, ne0};
  return load_weight(m, name, &s, w);
}

static int load_cols(model_t *m, const char *name, int ne0, int ne1, int c0, int nc,
                     kern_weight_t *w) {
  model_slice_t s = {ne0, ne1, 0, ne1, c0, nc};
  return load_weight(m, name, &s, w);
}

static const char *tname(char *buf, int layer, const char *what) {
  snprintf(buf, 96, "blk.%d.%s", layer, what);
  return buf;
}

static int load_attn(model_t *m, int l, model_layer_t *L) {
  const model_hparams_t *hp = &m->hp;
  const model_shard_t *sh = &m->sh;
  int hd = hp->head_dim, E = hp->n_embd, q0 = sh->head0 * hd, nq = sh->n_head * hd;
  int k0 = sh->kv0 * hd, nk = sh->n_kv * hd;
  char b[96];
  int rc = load_vec(m, tname(b, l, "attn_norm.weight"), E, 0, E, 1, &L->attn_norm);
  if (!rc) rc = load_rows(m, tname(b, l, "attn_q.weight"), E, hp->n_head * hd, q0, nq, &L->wq);
  if (!rc) rc = load_rows(m, tname(b, l, "attn_k.weight"), E, hp->n_head_kv * hd, k0, nk, &L->wk);
  if (!rc) rc = load_rows(m, tname(b, l, "attn_v.weight"), E, hp->n_head_kv * hd, k0, nk, &L->wv);
  if (!rc) rc = load_cols(m, tname(b, l, "attn_output.weight"), hp->n_head * hd, E, q0, nq, &L->wo);
  if (rc || !hp->qkv_bias) return rc;
  rc = load_vec(m, tname(b, l, "attn_q.bias"), hp->n_head * hd, q0, nq, 1, &L->bq);
  if (!rc) rc = load_vec(m, tname(b, l, "attn_k.bias"), hp->n_head_kv * hd, k0, nk, 1, &L->bk);
  if (!rc) rc = load_vec(m, tname(b, l, "attn_v.bias"), hp->n_head_kv * hd, k0, nk, 1, &L->bv);
  return rc;
}

static int load_ffn(model_t *m, int l, model_layer_t *L) {
  const model_hparams_t *hp = &m->hp;
  int E = hp->n_embd, F = hp->n_ff, f0 = m->sh.ff0, nf = m->sh.n_ff;
  char b[96];
  int rc = load_vec(m, tname(b, l, "ffn_norm.weight"), E, 0, E, 1, &L->ffn_norm);
  if (!rc) rc = load_rows(m, tname(b, l, "ffn_gate.weight"), E, F, f0, nf, &L->wg);
  if (!rc) rc = load_rows(m, tname(b, l, "ffn_up.weight"), E, F, f0, nf, &L->wu);
  if (!rc) rc = load_cols(m, tname(b, l, "ffn_down.weight"), F, E, f0, nf, &L->wd);
  return rc;
}

static int load_rope_factors(model_t *m) {
  const gguf_tensor_t *t = gguf_find_tensor(m->g, "rope_freqs.weight");
  if (!t) return 0;
  int n = m->hp.rope.n_rot / 2;
  if (t->type != GGUF_T_F32 || t->n_elems != n)
    return qe_errf(QE_EFORMAT, "model: rope_freqs.weight must be F32 [%d]", n);
  memcpy(m->rope_factors, t->data, sizeof(float) * (size_t)n);
  for (int i = 0; i < n; i++) /* each divides a frequency: its inverse finite too */
    if (!isfinite(m->rope_factors[i]) || !(m->rope_factors[i] > 0) ||
        !isfinite(1.0f / m->rope_factors[i]))
      return qe_errf(QE_EFORMAT,
                     "model: rope_freqs.weight[%d] = %g is not a finite positive number with a "
                     "finite inverse",
                     i, m->rope_factors[i]);
  m->hp.rope.factors = m->rope_factors;
  return 0;
}

/* A packed embedding table (a backend with embed_w and packed weights, a block format): the
 * tied output's weight on rank 0, else a weight of its own; no fp32 copy. 1 when it took it
 * (0 in *rc, or the error), 0 when the table is to be fp32. */
static int load_packed_embd(model_t *m, const gguf_tensor_t *te, const model_slice_t *emb,
                            int *rc) {
  const int tied = m->hp.tied_output && m->sh.rank == 0;
  if (!m->be->ops->embed_w || !packs(m, te, emb)) return 0;
  *rc = load_blocks(m, te, emb, "token_embd.weight", tied ? &m->out : &m->embd);
  m->embd_w = tied ? &m->out : &m->embd;
  return 1;
}

static int load_globals(model_t *m) {
  const model_hparams_t *hp = &m->hp;
  int E = hp->n_embd, V = hp->n_vocab;
  model_slice_t emb = {E, V, 0, V, 0, E};
  const gguf_tensor_t *te = gguf_find_tensor(m->g, "token_embd.weight");
  const int tied_packed = hp->tied_output && m->sh.rank == 0 && packs(m, te, &emb);
  float *hb = NULL;
  int rc = 0;
  if (!load_packed_embd(m, te, &emb, &rc)) {
    rc = read_slice(m, "token_embd.weight", &emb, 1, &hb);
    if (!rc && tied_packed) /* the output packed, the embedding rows fp32 */
      rc = load_blocks(m, te, &emb, "token_embd.weight", &m->out);
    if (!rc)
      rc = tied_packed ? model__vec(m, &m->tok_embd, hb, (size_t)V * E, "token_embd.weight")
                       : model__embd(m, hb);
  }
  free(hb);
  if (!rc) rc = load_vec(m, "output_norm.weight", E, 0, E, 1, &m->out_norm);
  if (!rc) rc = load_rope_factors(m);
  if (rc || hp->tied_output || m->sh.rank != 0) return rc;
  return load_rows(m, "output.weight", E, V, 0, V, &m->out);
}

static void *scratch_alloc(model_t *m, size_t floats, int *rc) {
  void *p = kern_alloc(m->be, sizeof(float) * (floats ? floats : 1));
  if (!p && !*rc) *rc = qe_errf(QE_ENOMEM, "model: no memory for forward scratch");
  return p;
}

/* Rows of the logits scratch: the load options' count, or MODEL_OUT_BYTES of logits (at least
 * MODEL_OUT_MIN rows); never more than a forward call has. */
static int out_rows_of(const model_t *m) {
  size_t r = m->out_rows; /* (the options' count here; 0: automatic) */
  if (!r) {
    r = MODEL_OUT_BYTES / (sizeof(float) * (size_t)m->hp.n_vocab);
    r = r > MODEL_OUT_MIN ? r : MODEL_OUT_MIN;
  }
  return r < (size_t)m->max_batch ? (int)r : m->max_batch;
}

/* bq, bk, bv of L (all or none: hparams.qkv_bias) copied into a new buffer *out [nq + 2 nk]
 * (NULL without biases); the parts are kept. */
static int stack_bias(model_t *m, const model_layer_t *L, size_t nq, size_t nk, float **out) {
  kern_backend_t *be = m->be;
  *out = NULL;
  if (!L->bq) return 0;
  float *b = kern_alloc(be, sizeof(float) * (nq + 2 * nk));
  if (!b) return qe_errf(QE_ENOMEM, "model: no memory for a stacked bias");
  int rc = be->ops->copy(be, b, L->bq, sizeof(float) * nq);
  if (!rc) rc = be->ops->copy(be, b + nq, L->bk, sizeof(float) * nk);
  if (!rc) rc = be->ops->copy(be, b + nq + nk, L->bv, sizeof(float) * nk);
  if (rc) kern_free(be, b);
  return rc ? rc : (*out = b, 0);
}

/* wqkv (and bqkv) from wq, wk, wv (and bq, bk, bv): all of them or, on failure, none. */
static int stack_qkv(model_t *m, model_layer_t *L) {
  kern_backend_t *be = m->be;
  size_t hd = (size_t)m->hp.head_dim;
  float *b;
  int rc = stack_bias(m, L, m->sh.n_head * hd, m->sh.n_kv * hd, &b);
  kern_weight_t qkv[3] = {L->wq, L->wk, L->wv};
  if (!rc) rc = be->ops->weight_concat(be, &L->wqkv, qkv, 3);
  if (rc) {
    if (b) kern_free(be, b);
    return rc;
  }
  memset(&L->wq, 0, sizeof L->wq), L->wk = L->wv = L->wq;
  if (b) kern_free(be, L->bq), kern_free(be, L->bk), kern_free(be, L->bv);
  if (b) L->bq = L->bk = L->bv = NULL, L->bqkv = b;
  return 0;
}

/* wgu from wg, wu. */
static int stack_gu(model_t *m, model_layer_t *L) {
  kern_weight_t gu[2] = {L->wg, L->wu};
  int rc = m->be->ops->weight_concat(m->be, &L->wgu, gu, 2);
  if (!rc) memset(&L->wg, 0, sizeof L->wg), L->wu = L->wg;
  return rc;
}

/* Out of memory for a stack (it needs room for one more copy of the parts while it is made),
 * or parts the backend cannot stack (the CPU's packed weights): that layer keeps those
 * projections apart, which the forward pass takes per layer. */
static int stack_soft(int rc) { return rc == QE_ENOMEM || rc == QE_EUNSUPPORTED ? 0 : rc; }

int model__fuse_proj(model_t *m) {
  const kern_ops_t *o = m->be->ops;
  if (!m->be->fuse_proj || !o->weight_concat || !o->qkv_rope || !o->swiglu_cat) return 0;
  if (m->hp.head_dim % 2) return 0; /* (qkv_rope's pairs) */
  int rc = 0;
  for (int l = 0; l < m->hp.n_layer && !rc; l++) {
    rc = stack_soft(stack_qkv(m, &m->layers[l]));
    if (!rc) rc = stack_soft(stack_gu(m, &m->layers[l]));
  }
  return rc;
}

/* Floats of the gate scratch: [B][n_ff], and the stacked projections' outputs (model_scratch_t). */
static size_t gate_floats(const model_t *m) {
  const size_t B = (size_t)m->max_batch, F = (size_t)m->sh.n_ff;
  const size_t qkv = (size_t)(m->sh.n_head + 2 * m->sh.n_kv) * (size_t)m->hp.head_dim;
  const size_t fr = B < MODEL_FUSE_ROWS ? B : MODEL_FUSE_ROWS;
  size_t n = B * F;
  for (int l = 0; l < m->hp.n_layer; l++) { /* (a layer may have kept its parts) */
    if (m->layers[l].wqkv.data) n = n > B * qkv ? n : B * qkv;
    if (m->layers[l].wgu.data) n = n > fr * 2 * F ? n : fr * 2 * F;
  }
  return n;
}

int model__alloc_scratch(model_t *m) {
  model_scratch_t *s = &m->s;
  size_t B = (size_t)m->max_batch, E = (size_t)m->hp.n_embd, hd = (size_t)m->hp.head_dim;
  int rc = 0;
  m->out_rows = out_rows_of(m);
  s->x = scratch_alloc(m, B * E, &rc);
  s->xn = scratch_alloc(m, B * E, &rc);
  s->tmp = scratch_alloc(m, B * E, &rc);
  s->q = scratch_alloc(m, B * m->sh.n_head * hd, &rc);
  s->att = scratch_alloc(m, B * m->sh.n_head * hd, &rc);
  s->k = scratch_alloc(m, B * m->sh.n_kv * hd, &rc);
  s->v = scratch_alloc(m, B * m->sh.n_kv * hd, &rc);
  s->gate = scratch_alloc(m, gate_floats(m), &rc);
  s->up = scratch_alloc(m, B * m->sh.n_ff, &rc);
  s->logits = m->sh.rank == 0 ? scratch_alloc(m, (size_t)m->out_rows * m->hp.n_vocab, &rc) : NULL;
  s->ids = scratch_alloc(m, B, &rc);
  s->pos = scratch_alloc(m, B, &rc);
  s->host_tmp = malloc(sizeof(float) * B * E);
  if (!s->host_tmp && !rc) rc = qe_errf(QE_ENOMEM, "model: no host memory for scratch");
  return rc;
}

static void free_scratch(model_t *m) {
  model_scratch_t *s = &m->s;
  void *bufs[] = {s->x, s->xn,   s->tmp, s->q,      s->att, s->k,
                  s->v, s->gate, s->up,  s->logits, s->ids, s->pos};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    if (bufs[i]) kern_free(m->be, bufs[i]);
  free(s->host_tmp);
}

static void free_layer(model_t *m, model_layer_t *L) {
  void *bufs[] = {L->attn_norm, L->ffn_norm, L->bq, L->bk, L->bv, L->bqkv};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    if (bufs[i]) kern_free(m->be, bufs[i]);
  kern_weight_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd, &L->wqkv, &L->wgu};
  for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) m->be->ops->weight_free(m->be, ws[i]);
}

void model_destroy(model_t *m) {
  if (!m) return;
  for (int l = 0; m->layers && l < m->hp.n_layer; l++) free_layer(m, &m->layers[l]);
  free(m->layers);
  void *emb = m->tok_embd, *out = m->out.data; /* emb == out: one buffer, owned by out */
  m->be->ops->weight_free(m->be, &m->out);
  if (m->embd.data) m->be->ops->weight_free(m->be, &m->embd);
  if (emb && emb != out) kern_free(m->be, emb);
  if (m->out_norm) kern_free(m->be, m->out_norm);
  model__graph_free(m);
  free_scratch(m);
  tok_destroy(m->tok);
  gguf_close(m->g);
  free(m);
}

static int load_all(model_t *m, const model_load_opts_t *o) {
  int rc = model_read_hparams(m->g, &m->hp);
  if (!rc) rc = model_shard_of(&m->hp, o->rank, o->size, &m->sh);
  if (!rc) rc = tok_create(m->g, &m->tok);
  if (!rc && tok_n_vocab(m->tok) != m->hp.n_vocab)
    rc = qe_errf(QE_EFORMAT, "model: tokenizer has %d ids, model %d", tok_n_vocab(m->tok),
                 m->hp.n_vocab);
  if (!rc) rc = load_globals(m);
  if (!rc && !(m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers)))
    rc = qe_errf(QE_ENOMEM, "model: out of memory");
  for (int l = 0; !rc && l < m->hp.n_layer; l++) {
    rc = load_attn(m, l, &m->layers[l]);
    if (!rc) rc = load_ffn(m, l, &m->layers[l]);
  }
  if (!rc) rc = model__fuse_proj(m);
  if (!rc) rc = model__alloc_scratch(m);
  return rc;
}

int model_load(const char *path, const model_load_opts_t *o, model_t **out) {
  model_t *m = model__new(o);
  if (!m) return qe_errf(QE_ENOMEM, "model: out of memory");
  int rc = gguf_open(path, &m->g);
  if (!rc) rc = load_all(m, o);
  if (rc) {
    model_destroy(m);
    return rc;
  }
  *out = m;
  return 0;
}

const model_hparams_t *model_hparams(const model_t *m) { return &m->hp; }
const model_shard_t *model_shard(const model_t *m) { return &m->sh; }
const tok_t *model_tok(const model_t *m) { return m->tok; }
const gguf_t *model_gguf(const model_t *m) { return m->g; }
kern_backend_t *model_backend(const model_t *m) { return m->be; }
int model_max_batch(const model_t *m) { return m->max_batch; }
size_t model_weight_bytes(const model_t *m) { return m->weight_bytes; }

kv_geom_t model_kv_geom(const model_t *m, int max_seqs) {
  return (kv_geom_t){m->hp.n_layer, m->sh.n_head, m->sh.n_kv, m->hp.head_dim, max_seqs};
}
