/* kern_cpu_attn: CPU reference for RoPE and causal GQA attention over many sequences, with
 * the per-key attention mass (summed over query heads and queries, divided by n_head) that
 * the KV cache's scorers consume. Plain fp32 loops: this is the reference the CUDA kernels
 * are checked against. */
#include <math.h>
#include <stdlib.h>

#include "kern_cpu_internal.h"

/* YaRN ramp (llama.cpp semantics): 1 below `low`, 0 above `high`, linear between. */
static float rope_yarn_ramp(float low, float high, int i0) {
  float y = (i0 / 2 - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

static float rope_corr_dim(int n_rot, int n_ctx_orig, float beta, float base) {
  return n_rot * logf(n_ctx_orig / (beta * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

/* cos/sin of rotation pair i (dims 2i or i) at position pos. */
static void rope_cs(const kern_rope_t *r, int pos, int i, float *c, float *s) {
  float freq = 1.0f / powf(r->theta, (float)(2 * i) / (float)r->n_rot);
  if (r->factors) freq /= r->factors[i];
  float extrap = (float)pos * freq, theta = extrap * r->freq_scale, mscale = r->attn_factor;
  if (r->ext_factor != 0.0f) {
    float lo = fmaxf(0.0f, floorf(rope_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_fast, r->theta)));
    float hi = fminf(r->n_rot - 1.0f,
                     ceilf(rope_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_slow, r->theta)));
    float mix = rope_yarn_ramp(lo, hi, 2 * i) * r->ext_factor;
    theta = theta * (1.0f - mix) + extrap * mix;
    mscale *= 1.0f + 0.1f * logf(1.0f / r->freq_scale);
  }
  *c = cosf(theta) * mscale;
  *s = sinf(theta) * mscale;
}

static void rope_head(float *x, int pos, const kern_rope_t *r) {
  int half = r->n_rot / 2;
  for (int i = 0; i < half; i++) {
    float c, s;
    rope_cs(r, pos, i, &c, &s);
    int a = r->mode == KERN_ROPE_NEOX ? i : 2 * i;
    int b = r->mode == KERN_ROPE_NEOX ? i + half : 2 * i + 1;
    float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

void kern_cpu_rope(kern_backend_t *be, float *x, const int32_t *pos, int m, int n_heads,
                   int head_dim, const kern_rope_t *r) {
  for (int t = 0; t < m; t++)
    for (int h = 0; h < n_heads; h++)
      rope_head(x + ((size_t)t * n_heads + h) * head_dim, pos[t], r);
}

/* One query head against keys [0, n_keys): out[head_dim], optional mass accumulation. */
static void attn_one(const float *q, const kern_attn_seq_t *sq, int kvh, int n_keys,
                     const kern_attn_shape_t *sh, float *out, float *p) {
  int hd = sh->head_dim, stride = sh->n_kv_head * hd;
  for (int j = 0; j < n_keys; j++) {
    const float *k = sq->k + (size_t)j * stride + (size_t)kvh * hd;
    float dot = 0;
    for (int d = 0; d < hd; d++) dot += q[d] * k[d];
    p[j] = dot * sh->scale;
  }
  kern_cpu_softmax_row(p, n_keys);
  for (int d = 0; d < hd; d++) out[d] = 0;
  for (int j = 0; j < n_keys; j++) {
    const float *v = sq->v + (size_t)j * stride + (size_t)kvh * hd;
    for (int d = 0; d < hd; d++) out[d] += p[j] * v[d];
    if (sq->key_mass) sq->key_mass[j] += p[j] / (float)sh->n_head;
  }
}

/* Keys visible to the query at position qp: a prefix, since key positions ascend. */
static int visible_keys(const kern_attn_seq_t *sq, int qp) {
  if (!sq->k_pos) return qp + 1 < sq->n_kv ? qp + 1 : sq->n_kv;
  int lo = 0, hi = sq->n_kv;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (sq->k_pos[mid] <= qp) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static void attn_seq(const kern_attn_seq_t *sq, const kern_attn_shape_t *sh, float *p) {
  int group = sh->n_head / sh->n_kv_head, hd = sh->head_dim;
  for (int i = 0; i < sq->n_q; i++) {
    int n_keys = visible_keys(sq, sq->q_pos0 + i);
    kern_attn_seq_t one = *sq;
    if (i < sq->mass_q0) one.key_mass = NULL;
    for (int h = 0; h < sh->n_head && n_keys > 0; h++) {
      size_t off = ((size_t)i * sh->n_head + h) * hd;
      attn_one(sq->q + off, &one, h / group, n_keys, sh, sq->out + off, p);
    }
  }
}

void kern_cpu_attention(kern_backend_t *be, const kern_attn_seq_t *seqs, int n_seqs,
                        const kern_attn_shape_t *shape) {
  int max_kv = 1;
  for (int s = 0; s < n_seqs; s++) max_kv = seqs[s].n_kv > max_kv ? seqs[s].n_kv : max_kv;
  float *p = malloc(sizeof(float) * (size_t)max_kv);
  if (!p) abort(); /* transient workspace of one row: only fails when the host is exhausted */
  for (int s = 0; s < n_seqs; s++) attn_seq(&seqs[s], shape, p);
  free(p);
}
