/* kv_full: the plain FullKV cache (no policy). Per sequence and layer one buffer
 * [capacity][n_kv_head][head_dim] for K and one for V, in backend memory. It is the baseline
 * every policy is compared against and the reference for bit-identical output at budget 100%. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_cache.h"
#include "qe_status.h"

typedef struct {
  int capacity; /* tokens; 0 = closed */
  int len;      /* highest stored position + 1 */
  float **k;    /* [n_layer] -> [capacity][n_kv_head][head_dim] */
  float **v;
} kv_full_seq_t;

typedef struct {
  kv_cache_t base;
  kv_full_seq_t *seqs;   /* [max_seqs] */
  kern_attn_seq_t *work; /* [max_seqs] */
} kv_full_t;

static size_t row_floats(const kv_geom_t *g) { return (size_t)g->n_kv_head * g->head_dim; }

static void full_seq_close(kv_cache_t *kv, int seq) {
  kv_full_t *f = (kv_full_t *)kv;
  if (seq < 0 || seq >= kv->geom.max_seqs) return;
  kv_full_seq_t *s = &f->seqs[seq];
  for (int l = 0; s->k && l < kv->geom.n_layer; l++) {
    kern_free(kv->be, s->k[l]);
    kern_free(kv->be, s->v[l]);
  }
  free(s->k);
  free(s->v);
  memset(s, 0, sizeof *s);
}

static int full_seq_open(kv_cache_t *kv, int seq, int capacity) {
  kv_full_t *f = (kv_full_t *)kv;
  if (seq < 0 || seq >= kv->geom.max_seqs || capacity <= 0)
    return qe_errf(QE_EINVAL, "kv_full: bad slot %d or capacity %d", seq, capacity);
  full_seq_close(kv, seq);
  kv_full_seq_t *s = &f->seqs[seq];
  int nl = kv->geom.n_layer;
  size_t bytes = sizeof(float) * row_floats(&kv->geom) * (size_t)capacity;
  s->k = calloc((size_t)nl, sizeof *s->k);
  s->v = calloc((size_t)nl, sizeof *s->v);
  if (!s->k || !s->v) goto fail;
  for (int l = 0; l < nl; l++) {
    s->k[l] = kern_alloc(kv->be, bytes);
    s->v[l] = kern_alloc(kv->be, bytes);
    if (!s->k[l] || !s->v[l]) goto fail;
  }
  s->capacity = capacity;
  return 0;
fail:
  full_seq_close(kv, seq);
  return qe_errf(QE_ENOSPC, "kv_full: no memory for %d tokens in slot %d", capacity, seq);
}

static int full_store(kv_cache_t *kv, int seq, int layer, int pos0, int n, const float *k,
                      const float *v) {
  kv_full_t *f = (kv_full_t *)kv;
  kv_full_seq_t *s = &f->seqs[seq];
  if (pos0 < 0 || pos0 + n > s->capacity)
    return qe_errf(QE_ERANGE, "kv_full: positions [%d, %d) exceed slot %d capacity %d", pos0,
                   pos0 + n, seq, s->capacity);
  size_t row = row_floats(&kv->geom), off = (size_t)pos0 * row, bytes = sizeof(float) * row * n;
  int rc = kv->be->ops->copy(kv->be, s->k[layer] + off, k, bytes);
  if (!rc) rc = kv->be->ops->copy(kv->be, s->v[layer] + off, v, bytes);
  if (pos0 + n > s->len) s->len = pos0 + n;
  return rc;
}

static int full_attend(kv_cache_t *kv, int layer, const kv_attn_req_t *reqs, int n_reqs) {
  kv_full_t *f = (kv_full_t *)kv;
  const kv_geom_t *g = &kv->geom;
  for (int i = 0; i < n_reqs; i++) {
    kv_full_seq_t *s = &f->seqs[reqs[i].seq];
    if (reqs[i].pos0 + reqs[i].n_q > s->len)
      return qe_errf(QE_ERANGE, "kv_full: attention past stored tokens in slot %d", reqs[i].seq);
    f->work[i] = (kern_attn_seq_t){.q = reqs[i].q,
                                   .k = s->k[layer],
                                   .v = s->v[layer],
                                   .out = reqs[i].out,
                                   .n_q = reqs[i].n_q,
                                   .n_kv = reqs[i].pos0 + reqs[i].n_q,
                                   .q_pos0 = reqs[i].pos0,
                                   .k_pos = NULL,
                                   .mass_q0 = 0};
  }
  kern_attn_shape_t sh = {g->n_head, g->n_kv_head, g->head_dim, 0};
  sh.scale = 1.0f / sqrtf((float)g->head_dim);
  kv->be->ops->attention(kv->be, f->work, n_reqs, &sh);
  return 0;
}

static size_t full_seq_bytes(const kv_cache_t *kv, int seq) {
  const kv_full_t *f = (const kv_full_t *)kv;
  return 2 * sizeof(float) * row_floats(&kv->geom) * (size_t)f->seqs[seq].len * kv->geom.n_layer;
}

static void full_destroy(kv_cache_t *kv) {
  kv_full_t *f = (kv_full_t *)kv;
  for (int s = 0; s < kv->geom.max_seqs; s++) full_seq_close(kv, s);
  free(f->seqs);
  free(f->work);
  free(f);
}

static const kv_cache_ops_t full_ops = {.name = "full",
                                        .seq_open = full_seq_open,
                                        .seq_close = full_seq_close,
                                        .store = full_store,
                                        .attend = full_attend,
                                        .seq_bytes = full_seq_bytes,
                                        .destroy = full_destroy};

int kv_full_create(kern_backend_t *be, const kv_geom_t *geom, kv_cache_t **out) {
  if (geom->n_layer <= 0 || geom->n_kv_head <= 0 || geom->head_dim <= 0 || geom->max_seqs <= 0 ||
      geom->n_head % geom->n_kv_head)
    return qe_errf(QE_EINVAL, "kv_full: bad geometry");
  kv_full_t *f = calloc(1, sizeof *f);
  if (!f) return qe_errf(QE_ENOMEM, "kv_full: out of memory");
  f->seqs = calloc((size_t)geom->max_seqs, sizeof *f->seqs);
  f->work = calloc((size_t)geom->max_seqs, sizeof *f->work);
  if (!f->seqs || !f->work) {
    free(f->seqs);
    free(f->work);
    free(f);
    return qe_errf(QE_ENOMEM, "kv_full: out of memory");
  }
  f->base = (kv_cache_t){&full_ops, *geom, be};
  *out = &f->base;
  return 0;
}

void kv_cache_destroy(kv_cache_t *kv) {
  if (kv) kv->ops->destroy(kv);
}

int kv_cache_prompt_room(const kv_cache_t *kv) {
  return kv->ops->prompt_room ? kv->ops->prompt_room(kv) : 0;
}

int kv_cache_set_observer(kv_cache_t *kv, kv_obs_fn fn, void *ud) {
  if (kv->ops->set_observer) return kv->ops->set_observer(kv, fn, ud);
  return fn ? qe_errf(QE_EUNSUPPORTED, "kv_cache: a %s cache has no observations (diagnostics)",
                      kv->ops->name)
            : 0;
}
