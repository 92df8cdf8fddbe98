/* model_forward: the batched transformer forward pass with tensor-parallel sharding:
 * column-parallel Q/K/V and gate/up, row-parallel O and down, one all-reduce after each;
 * the output layer runs on rank 0 over the rows that want logits. */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "qe_status.h"

static int check_batch(const model_t *m, const model_batch_t *b) {
  if (b->n <= 0 || b->n > m->max_batch)
    return qe_errf(QE_EINVAL, "model: batch of %d tokens (max %d)", b->n, m->max_batch);
  for (int i = 0; i < b->n; i++) {
    if (b->tokens[i] < 0 || b->tokens[i] >= m->hp.n_vocab)
      return qe_errf(QE_EINVAL, "model: token id %d outside the vocabulary (%d)", b->tokens[i],
                     m->hp.n_vocab);
    if (b->pos[i] < 0) return qe_errf(QE_EINVAL, "model: negative position %d", b->pos[i]);
  }
  return 0;
}

/* Splits the batch into per-sequence runs of consecutive positions. */
static int split_segments(const model_batch_t *b, model_seg_t *segs, int *n_segs) {
  int n = 0;
  for (int i = 0; i < b->n; i++) {
    model_seg_t *last = n ? &segs[n - 1] : NULL;
    if (last && last->seq == b->seq[i] && last->pos0 + last->n == b->pos[i]) {
      last->n++;
      continue;
    }
    if (n == MODEL_MAX_SEGS) return qe_errf(QE_EINVAL, "model: more than %d runs in a batch", n);
    segs[n++] = (model_seg_t){b->seq[i], b->pos[i], i, 1};
  }
  *n_segs = n;
  return 0;
}

/* Sums buf [n] over the TP group: in place on the device over the group's device communicator
 * (NCCL) when it has one, else through host memory if the backend needs it. */
static int allreduce_act(model_t *m, tp_comm_t *comm, float *buf, size_t n) {
  if (comm->size == 1) return 0;
  if (m->be->ops->host_memory) return tp_allreduce_sum(comm, buf, n);
  if (comm->dev) return tp_allreduce_sum(comm->dev, buf, n);
  int rc = m->be->ops->download(m->be, m->s.host_tmp, buf, n * sizeof(float));
  if (!rc) rc = tp_allreduce_sum(comm, m->s.host_tmp, n);
  if (!rc) rc = m->be->ops->upload(m->be, buf, m->s.host_tmp, n * sizeof(float));
  return rc;
}

/* x += d, then xn = rmsnorm(x) * g, over n rows: in one op where the backend has it. */
static void add_norm(model_t *m, float *d, const float *g, int n) {
  kern_backend_t *be = m->be;
  model_scratch_t *s = &m->s;
  if (be->ops->add_rmsnorm) {
    be->ops->add_rmsnorm(be, s->x, d, s->xn, g, n, m->hp.n_embd, m->hp.rms_eps);
    return;
  }
  be->ops->add(be, s->x, d, (size_t)n * m->hp.n_embd);
  be->ops->rmsnorm(be, s->xn, s->x, g, n, m->hp.n_embd, m->hp.rms_eps);
}

/* Layer l's attention over xn, the attention norm of x (made by the layer before). */
static int attn_block(model_t *m, kv_cache_t *kv, int l, const model_seg_t *segs, int n_segs, int n,
                      kv_attn_req_t *reqs) {
  kern_backend_t *be = m->be;
  const model_layer_t *L = &m->layers[l];
  model_scratch_t *s = &m->s;
  int hd = m->hp.head_dim, nq = m->sh.n_head * hd, nk = m->sh.n_kv * hd;
  if (L->wqkv.data) { /* one matmul into gate's scratch, split and rotated */
    be->ops->matmul(be, s->gate, s->xn, &L->wqkv, L->bqkv, n, 0);
    be->ops->qkv_rope(be, s->q, s->k, s->v, s->gate, s->pos, n, m->sh.n_head, m->sh.n_kv, hd,
                      &m->hp.rope);
  } else {
    be->ops->matmul(be, s->q, s->xn, &L->wq, L->bq, n, 0);
    be->ops->matmul(be, s->k, s->xn, &L->wk, L->bk, n, 0);
    be->ops->matmul(be, s->v, s->xn, &L->wv, L->bv, n, 0);
    be->ops->rope(be, s->q, s->pos, n, m->sh.n_head, hd, &m->hp.rope);
    be->ops->rope(be, s->k, s->pos, n, m->sh.n_kv, hd, &m->hp.rope);
  }
  for (int i = 0; i < n_segs; i++) {
    const model_seg_t *g = &segs[i];
    int rc = kv->ops->store(kv, g->seq, l, g->pos0, g->n, s->k + (size_t)g->off * nk,
                            s->v + (size_t)g->off * nk);
    if (rc) return rc;
    reqs[i] = (kv_attn_req_t){g->seq, g->pos0, g->n, s->q + (size_t)g->off * nq,
                              s->att + (size_t)g->off * nq};
  }
  return kv->ops->attend(kv, l, reqs, n_segs);
}

static int layer_forward(model_t *m, kv_cache_t *kv, tp_comm_t *comm, int l,
                         const model_seg_t *segs, int n_segs, int n, kv_attn_req_t *reqs) {
  kern_backend_t *be = m->be;
  const model_layer_t *L = &m->layers[l];
  model_scratch_t *s = &m->s;
  size_t xe = (size_t)n * m->hp.n_embd;
  int rc = attn_block(m, kv, l, segs, n_segs, n, reqs);
  if (rc) return rc;
  be->ops->matmul(be, s->tmp, s->att, &L->wo, NULL, n, 0);
  if ((rc = allreduce_act(m, comm, s->tmp, xe))) return rc;
  add_norm(m, s->tmp, L->ffn_norm, n);
  const int F = m->sh.n_ff;
  float *act = s->gate;                      /* silu(gate) * up */
  if (L->wgu.data && n <= MODEL_FUSE_ROWS) { /* gate and up in one matmul: [n][2 n_ff] */
    be->ops->matmul(be, s->gate, s->xn, &L->wgu, NULL, n, 0);
    be->ops->swiglu_cat(be, s->up, s->gate, n, F);
    act = s->up;
  } else { /* (stacked: its two halves) */
    kern_weight_t wg = L->wgu.data ? kern_weight_rows(&L->wgu, 0, F) : L->wg;
    kern_weight_t wu = L->wgu.data ? kern_weight_rows(&L->wgu, F, F) : L->wu;
    be->ops->matmul(be, s->gate, s->xn, &wg, NULL, n, 0);
    be->ops->matmul(be, s->up, s->xn, &wu, NULL, n, 0);
    be->ops->swiglu(be, s->gate, s->gate, s->up, n, F);
  }
  be->ops->matmul(be, s->tmp, act, &L->wd, NULL, n, 0);
  if ((rc = allreduce_act(m, comm, s->tmp, xe))) return rc;
  if (l + 1 < m->hp.n_layer) /* with the next layer's attention norm */
    add_norm(m, s->tmp, m->layers[l + 1].attn_norm, n);
  else
    be->ops->add(be, s->x, s->tmp, xe);
  return 0;
}

/* Gathers the rows that want logits into tmp, normalizes them, and projects them onto the
 * vocabulary m->out_rows rows at a time (the logits scratch holds one chunk), copying each
 * chunk's logits (or their argmax) to the host. */
static int output_logits(model_t *m, const model_batch_t *b, const model_seg_t *segs, int n_segs,
                         const model_out_t *o) {
  kern_backend_t *be = m->be;
  size_t E = (size_t)m->hp.n_embd, V = (size_t)m->hp.n_vocab;
  int n_out = 0, rc = 0;
  for (int i = 0; i < b->n && !rc; i++) {
    int want = b->logits ? b->logits[i] : 0;
    for (int g = 0; !b->logits && g < n_segs; g++) want |= segs[g].off + segs[g].n - 1 == i;
    if (want) rc = be->ops->copy(be, m->s.tmp + n_out++ * E, m->s.x + i * E, E * sizeof(float));
  }
  if (rc || !n_out) return rc;
  be->ops->rmsnorm(be, m->s.xn, m->s.tmp, m->out_norm, n_out, (int)E, m->hp.rms_eps);
  for (int r0 = 0; r0 < n_out && !rc; r0 += m->out_rows) {
    int nr = n_out - r0 < m->out_rows ? n_out - r0 : m->out_rows;
    be->ops->matmul(be, m->s.logits, m->s.xn + (size_t)r0 * E, &m->out, NULL, nr, 0);
    if (o->ids_dev)
      rc = be->ops->argmax_dev(be, m->s.logits, nr, (int)V, o->ids_dev + r0);
    else if (o->ids)
      rc = be->ops->argmax(be, m->s.logits, nr, (int)V, o->ids + r0);
    else if (o->logits)
      rc = be->ops->download(be, o->logits + (size_t)r0 * V, m->s.logits,
                             (size_t)nr * V * sizeof(float));
  }
  return rc;
}

int model__forward_dev(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const model_batch_t *b,
                       const model_seg_t *segs, int n_segs, const model_out_t *o) {
  static _Thread_local kv_attn_req_t reqs[MODEL_MAX_SEGS];
  int rc = 0;
  if (m->tok_embd)
    m->be->ops->embed(m->be, m->s.x, m->tok_embd, m->s.ids, b->n, m->hp.n_embd);
  else
    m->be->ops->embed_w(m->be, m->s.x, m->embd_w, m->s.ids, b->n, m->hp.n_embd);
  if (m->hp.n_layer > 0) /* (each later layer's norm comes with the residual add before it) */
    m->be->ops->rmsnorm(m->be, m->s.xn, m->s.x, m->layers[0].attn_norm, b->n, m->hp.n_embd,
                        m->hp.rms_eps);
  for (int l = 0; l < m->hp.n_layer && !rc; l++)
    rc = layer_forward(m, kv, comm, l, segs, n_segs, b->n, reqs);
  if (rc || m->sh.rank != 0 || (!o->logits && !o->ids && !o->ids_dev && !o->keep)) return rc;
  return output_logits(m, b, segs, n_segs, o);
}

static int forward(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const model_batch_t *b,
                   const model_out_t *o) {
  static _Thread_local model_seg_t segs[MODEL_MAX_SEGS];
  int n_segs = 0, rc = check_batch(m, b);
  if (!rc) rc = split_segments(b, segs, &n_segs);
  if (!rc) rc = model__graph_forward(m, kv, comm, b, n_segs, o);
  if (rc <= 0) return rc; /* 1: not a step for a graph */
  kern_backend_t *be = m->be;
  size_t nb = (size_t)b->n * sizeof(int32_t);
  rc = be->ops->upload(be, m->s.ids, b->tokens, nb);
  if (!rc) rc = be->ops->upload(be, m->s.pos, b->pos, nb);
  return rc ? rc : model__forward_dev(m, kv, comm, b, segs, n_segs, o);
}

int model_forward(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const model_batch_t *b,
                  float *logits) {
  model_out_t o = {logits, NULL, NULL, 0};
  return forward(m, kv, comm, b, &o);
}

int model_forward_greedy(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const model_batch_t *b,
                         int32_t *ids) {
  model_out_t o = {NULL, ids, NULL, 0};
  return forward(m, kv, comm, b, &o);
}
