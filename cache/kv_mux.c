/* kv_mux: a kv_cache_t whose slots are bound to slots of child caches (see kv_mux.h). The
 * mux keeps, per slot, its binding and whether it is open, and per child which mux slot has
 * each child slot open; the per-sequence operations forward, attend regroups by child. */
#include "kv_mux.h"

#include <stdlib.h>
#include <string.h>

#include "qe_status.h"

typedef struct {
  kv_cache_t *kv; /* NULL: a free id */
  int *owner;     /* [kv->geom.max_seqs]: the open mux slot using each child slot, or -1 */
} mux_child_t;

typedef struct {
  int child, child_slot; /* binding; child -1 = unbound */
  int open;
} mux_slot_t;

typedef struct {
  kv_cache_t base;
  mux_slot_t *slots; /* [max_seqs] */
  mux_child_t *ch;   /* [n_ch] (ids) */
  int n_ch;
  kv_attn_req_t *work; /* [work_cap]: one child's requests of an attend call */
  uint8_t *handled;    /* [work_cap] */
  int work_cap;
  int32_t *cseq;              /* [max_seqs]: a fixed step's rows as one child's slots */
  int fx_ids[KV_FIXED_PARTS]; /* the children of the last fixed_fill, in id order */
  int fx_n;                   /* how many (0: none) */
  int fx_s0[KV_FIXED_PARTS];  /* each one's first row: its slot and position (its stores) */
  int fx_p0[KV_FIXED_PARTS];
  int fx_on;            /* in fixed mode */
  unsigned long fx_gen; /* moves when fx_ids or the set of children changes */
} kv_mux_t;

static const kv_cache_ops_t mux_ops;

static kv_mux_t *as_mux(const kv_cache_t *kv) {
  return kv && kv->ops == &mux_ops ? (kv_mux_t *)kv : NULL;
}

static kv_cache_t *child_of(const kv_mux_t *x, int id) {
  return id >= 0 && id < x->n_ch ? x->ch[id].kv : NULL;
}

static const mux_slot_t *open_slot(const kv_mux_t *x, int seq) {
  return seq >= 0 && seq < x->base.geom.max_seqs && x->slots[seq].open ? &x->slots[seq] : NULL;
}

/* ---- kv_cache_ops_t ------------------------------------------------------------------------ */

static void mux_seq_close(kv_cache_t *kv, int seq) {
  kv_mux_t *x = (kv_mux_t *)kv;
  if (!open_slot(x, seq)) return;
  mux_slot_t *s = &x->slots[seq];
  mux_child_t *c = &x->ch[s->child];
  c->kv->ops->seq_close(c->kv, s->child_slot);
  c->owner[s->child_slot] = -1;
  s->open = 0;
}

static int mux_seq_open(kv_cache_t *kv, int seq, int capacity) {
  kv_mux_t *x = (kv_mux_t *)kv;
  if (seq < 0 || seq >= kv->geom.max_seqs)
    return qe_errf(QE_EINVAL, "kv_mux: slot %d out of range (%d)", seq, kv->geom.max_seqs);
  mux_seq_close(kv, seq);
  mux_slot_t *s = &x->slots[seq];
  if (!child_of(x, s->child)) return qe_errf(QE_EINVAL, "kv_mux: slot %d is not bound", seq);
  mux_child_t *c = &x->ch[s->child];
  if (c->owner[s->child_slot] >= 0)
    return qe_errf(QE_EINVAL, "kv_mux: slot %d of child %d is in use by slot %d", s->child_slot,
                   s->child, c->owner[s->child_slot]);
  int rc = c->kv->ops->seq_open(c->kv, s->child_slot, capacity);
  if (rc) return rc;
  c->owner[s->child_slot] = seq;
  s->open = 1;
  return 0;
}

static int mux_store(kv_cache_t *kv, int seq, int layer, int pos0, int n, const float *k,
                     const float *v) {
  kv_mux_t *x = (kv_mux_t *)kv;
  const mux_slot_t *s = open_slot(x, seq);
  if (!s) return qe_errf(QE_EINVAL, "kv_mux: store into slot %d, which is not open", seq);
  if (x->fx_on && x->fx_n > 1) { /* a fixed step over several children: each takes every row */
    int rc = 0;
    for (int j = 0; j < x->fx_n && !rc; j++) {
      kv_cache_t *c = x->ch[x->fx_ids[j]].kv;
      rc = c->ops->store(c, x->fx_s0[j], layer, x->fx_p0[j], n, k, v);
    }
    return rc;
  }
  kv_cache_t *c = x->ch[s->child].kv;
  return c->ops->store(c, s->child_slot, layer, pos0, n, k, v);
}

static int grow_work(kv_mux_t *x, int n) {
  if (n <= x->work_cap) return 0;
  kv_attn_req_t *w = realloc(x->work, sizeof *w * (size_t)n);
  if (w) x->work = w;
  uint8_t *h = w ? realloc(x->handled, (size_t)n) : NULL;
  if (h) x->handled = h;
  if (!w || !h) return qe_errf(QE_ENOMEM, "kv_mux: out of memory");
  x->work_cap = n;
  return 0;
}

/* The requests [from, n) of child `id` (in their order), rewritten to child slots, into work;
 * marks them handled and returns how many. */
static int gather_child(kv_mux_t *x, const kv_attn_req_t *reqs, int from, int n, int id) {
  int k = 0;
  for (int i = from; i < n; i++) {
    const mux_slot_t *s = &x->slots[reqs[i].seq];
    if (x->handled[i] || s->child != id) continue;
    x->work[k] = reqs[i];
    x->work[k++].seq = s->child_slot;
    x->handled[i] = 1;
  }
  return k;
}

static int mux_attend(kv_cache_t *kv, int layer, const kv_attn_req_t *reqs, int n_reqs) {
  kv_mux_t *x = (kv_mux_t *)kv;
  if (n_reqs <= 0) return 0;
  for (int i = 0; i < n_reqs; i++)
    if (!open_slot(x, reqs[i].seq))
      return qe_errf(QE_EINVAL, "kv_mux: attention over slot %d, which is not open", reqs[i].seq);
  int rc = 0;
  if (x->fx_on && x->fx_n > 1) { /* a fixed step over several children: each takes every row */
    for (int j = 0; j < x->fx_n && !rc; j++) {
      kv_cache_t *c = x->ch[x->fx_ids[j]].kv;
      rc = c->ops->attend(c, layer, reqs, n_reqs);
    }
    return rc;
  }
  if ((rc = grow_work(x, n_reqs))) return rc;
  memset(x->handled, 0, (size_t)n_reqs);
  for (int i = 0; i < n_reqs && !rc; i++) {
    if (x->handled[i]) continue;
    int id = x->slots[reqs[i].seq].child, k = gather_child(x, reqs, i, n_reqs, id);
    rc = x->ch[id].kv->ops->attend(x->ch[id].kv, layer, x->work, k);
  }
  return rc;
}

/* ---- fixed-shape steps: forwarded to the children of the step's rows ------------------------
 * A step whose rows are all bound to one child goes to that child as it is. A step over several
 * children (at most KV_FIXED_PARTS, each with fixed steps) gives each child part j of the input
 * and the whole step, the other children's rows marked KV_FIXED_SKIP: every child launches over
 * every row of the bucket and writes only its own rows' outputs (padded rows: zeros from each).
 * The children of a step are fixed by fixed_fill (in id order); a change of that set moves the
 * epoch, so that a step recorded for one set is never replayed for another. */

static int has_fixed(const kv_cache_t *c) {
  return c && c->ops->fixed_fill && c->ops->fixed_mode && c->ops->fixed_done;
}

/* The children of rows seq[0..n) in id order into ids (open rows, each child with fixed steps,
 * at most KV_FIXED_PARTS); returns their count, or -1. */
static int step_children(const kv_mux_t *x, const int32_t *seq, int n, int *ids) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    const mux_slot_t *s = open_slot(x, seq[i]);
    if (!s || !has_fixed(x->ch[s->child].kv)) return -1;
    int at = 0;
    while (at < k && ids[at] < s->child) at++;
    if (at < k && ids[at] == s->child) continue;
    if (k == KV_FIXED_PARTS) return -1;
    memmove(ids + at + 1, ids + at, sizeof(int) * (size_t)(k - at));
    ids[at] = s->child, k++;
  }
  return k;
}

/* Rows seq[0..n) as slots of child id into out: all (skip: KV_FIXED_SKIP for another child's
 * rows) or only its own (compacted); returns how many were written. */
static int child_rows(const kv_mux_t *x, const int32_t *seq, int n, int id, int skip,
                      int32_t *out) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    const mux_slot_t *s = &x->slots[seq[i]];
    if (s->child == id)
      out[k++] = s->child_slot;
    else if (skip)
      out[k++] = KV_FIXED_SKIP;
  }
  return k;
}

/* 1 when ids[0..k) are the children of the last fixed_fill. */
static int same_children(const kv_mux_t *x, const int *ids, int k) {
  return k == x->fx_n && !memcmp(ids, x->fx_ids, sizeof(int) * (size_t)k);
}

static int mux_fixed_fill(kv_cache_t *kv, const kv_fixed_t *f, int32_t *in, const int32_t *seq,
                          const int32_t *pos, int n) {
  kv_mux_t *x = (kv_mux_t *)kv;
  if (n < 1 || n > kv->geom.max_seqs)
    return qe_errf(QE_EINVAL, "kv_mux: fixed step of %d rows (%d slots)", n, kv->geom.max_seqs);
  int ids[KV_FIXED_PARTS], k = step_children(x, seq, n, ids), rc = 0;
  if (k < 1)
    return qe_errf(QE_ERANGE,
                   "kv_mux: a fixed step's rows must be open in at most %d child "
                   "caches with fixed steps",
                   KV_FIXED_PARTS);
  if (!same_children(x, ids, k)) memcpy(x->fx_ids, ids, sizeof ids), x->fx_n = k, x->fx_gen++;
  for (int j = 0; j < k && !rc; j++) {
    kv_cache_t *c = x->ch[ids[j]].kv;
    child_rows(x, seq, n, ids[j], k > 1, x->cseq);
    int i = 0; /* the child's first row (it has one) */
    while (x->cseq[i] == KV_FIXED_SKIP) i++;
    x->fx_s0[j] = x->cseq[i], x->fx_p0[j] = pos[i];
    rc = c->ops->fixed_fill(c, f, in + (size_t)j * KV_FIXED_PART_WORDS(f->stride), x->cseq, pos, n);
  }
  return rc;
}

static int mux_fixed_mode(kv_cache_t *kv, const kv_fixed_t *f) {
  kv_mux_t *x = (kv_mux_t *)kv;
  if (f && !x->fx_n) return qe_errf(QE_EINVAL, "kv_mux: fixed mode before a fixed_fill");
  int rc = 0;
  for (int j = 0; j < x->fx_n; j++) { /* (every child leaves fixed mode, even after an error) */
    kv_cache_t *c = x->ch[x->fx_ids[j]].kv;
    kv_fixed_t part = f ? *f : (kv_fixed_t){0};
    if (f) part.dev = f->dev + (size_t)j * KV_FIXED_PART_WORDS(f->stride);
    int r = c->ops->fixed_mode(c, f ? &part : NULL);
    rc = rc ? rc : r;
  }
  x->fx_on = f && !rc;
  return rc;
}

static int mux_fixed_done(kv_cache_t *kv, const int32_t *seq, int n) {
  kv_mux_t *x = (kv_mux_t *)kv;
  int ids[KV_FIXED_PARTS], k = n > 0 ? step_children(x, seq, n, ids) : 0, rc = 0;
  if (n > 0 && !same_children(x, ids, k))
    return qe_errf(QE_EINVAL, "kv_mux: fixed_done for rows of another step");
  for (int j = 0; j < k && !rc; j++) {
    kv_cache_t *c = x->ch[ids[j]].kv;
    rc = c->ops->fixed_done(c, x->cseq, child_rows(x, seq, n, ids[j], 0, x->cseq));
  }
  return rc;
}

/* The step's children's epochs, moved on whenever the set of the step's children (or of the
 * mux's children) changed. */
static unsigned long mux_fixed_epoch(const kv_cache_t *kv) {
  const kv_mux_t *x = (const kv_mux_t *)kv;
  unsigned long e = 0;
  for (int j = 0; j < x->fx_n; j++) {
    const kv_cache_t *c = x->ch[x->fx_ids[j]].kv;
    e += c->ops->fixed_epoch ? c->ops->fixed_epoch(c) : 0;
  }
  return (x->fx_gen << 32) ^ e;
}

static size_t mux_seq_bytes(const kv_cache_t *kv, int seq) {
  const mux_slot_t *s = open_slot((const kv_mux_t *)kv, seq);
  if (!s) return 0;
  const kv_cache_t *c = ((const kv_mux_t *)kv)->ch[s->child].kv;
  return c->ops->seq_bytes(c, s->child_slot);
}

static void mux_destroy(kv_cache_t *kv) {
  kv_mux_t *x = (kv_mux_t *)kv;
  for (int i = 0; i < x->n_ch; i++) {
    kv_cache_destroy(x->ch[i].kv);
    free(x->ch[i].owner);
  }
  free(x->ch);
  free(x->slots);
  free(x->work);
  free(x->handled);
  free(x->cseq);
  free(x);
}

/* The smallest limit of the children (0: none has one). */
static int mux_prompt_room(const kv_cache_t *kv) {
  const kv_mux_t *x = as_mux(kv);
  int room = 0;
  for (int i = 0; i < x->n_ch; i++) {
    const int r = x->ch[i].kv ? kv_cache_prompt_room(x->ch[i].kv) : 0;
    if (r > 0 && (room == 0 || r < room)) room = r;
  }
  return room;
}

static const kv_cache_ops_t mux_ops = {.name = "mux",
                                       .seq_open = mux_seq_open,
                                       .seq_close = mux_seq_close,
                                       .store = mux_store,
                                       .attend = mux_attend,
                                       .seq_bytes = mux_seq_bytes,
                                       .destroy = mux_destroy,
                                       .fixed_fill = mux_fixed_fill,
                                       .fixed_mode = mux_fixed_mode,
                                       .fixed_done = mux_fixed_done,
                                       .fixed_epoch = mux_fixed_epoch,
                                       .prompt_room = mux_prompt_room};

/* ---- public -------------------------------------------------------------------------------- */

int kv_mux_create(kern_backend_t *be, const kv_geom_t *geom, kv_cache_t **out) {
  *out = NULL;
  if (geom->n_layer <= 0 || geom->n_kv_head <= 0 || geom->head_dim <= 0 || geom->max_seqs <= 0 ||
      geom->n_head % geom->n_kv_head)
    return qe_errf(QE_EINVAL, "kv_mux: bad geometry");
  kv_mux_t *x = calloc(1, sizeof *x);
  mux_slot_t *slots = calloc((size_t)geom->max_seqs, sizeof *slots);
  int32_t *cseq = calloc((size_t)geom->max_seqs, sizeof *cseq);
  if (!x || !slots || !cseq) {
    free(x);
    free(slots);
    free(cseq);
    return qe_errf(QE_ENOMEM, "kv_mux: out of memory");
  }
  for (int i = 0; i < geom->max_seqs; i++) slots[i] = (mux_slot_t){-1, 0, 0};
  x->base = (kv_cache_t){&mux_ops, *geom, be};
  x->slots = slots, x->cseq = cseq;
  *out = &x->base;
  return 0;
}

static int same_shape(const kv_geom_t *a, const kv_geom_t *b) {
  return a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_kv_head == b->n_kv_head &&
         a->head_dim == b->head_dim;
}

/* A free id, growing the table when every id is taken; -1 when out of memory. */
static int free_id(kv_mux_t *x) {
  for (int i = 0; i < x->n_ch; i++)
    if (!x->ch[i].kv) return i;
  mux_child_t *ch = realloc(x->ch, sizeof *ch * (size_t)(x->n_ch + 1));
  if (!ch) return -1;
  x->ch = ch;
  x->ch[x->n_ch] = (mux_child_t){NULL, NULL};
  return x->n_ch++;
}

int kv_mux_add_child(kv_cache_t *kv, kv_cache_t *child, int *child_id) {
  kv_mux_t *x = as_mux(kv);
  if (!x || !child) return qe_errf(QE_EINVAL, "kv_mux: not a mux, or no child");
  if (!same_shape(&kv->geom, &child->geom) || child->be != kv->be)
    return qe_errf(QE_EINVAL,
                   "kv_mux: child '%s' geometry (%d layers, %d/%d heads, dim %d) or backend "
                   "differs from the mux's (%d layers, %d/%d heads, dim %d)",
                   child->ops->name, child->geom.n_layer, child->geom.n_head, child->geom.n_kv_head,
                   child->geom.head_dim, kv->geom.n_layer, kv->geom.n_head, kv->geom.n_kv_head,
                   kv->geom.head_dim);
  int id = free_id(x);
  int *owner = id >= 0 ? malloc(sizeof(int) * (size_t)child->geom.max_seqs) : NULL;
  if (!owner) return qe_errf(QE_ENOMEM, "kv_mux: out of memory");
  for (int i = 0; i < child->geom.max_seqs; i++) owner[i] = -1;
  x->ch[id] = (mux_child_t){child, owner};
  x->fx_gen++; /* an id may now name another cache */
  *child_id = id;
  return 0;
}

int kv_mux_bind(kv_cache_t *kv, int slot, int child_id, int child_slot) {
  kv_mux_t *x = as_mux(kv);
  if (!x || slot < 0 || slot >= kv->geom.max_seqs)
    return qe_errf(QE_EINVAL, "kv_mux: bad mux or slot %d", slot);
  if (x->slots[slot].open) return qe_errf(QE_EINVAL, "kv_mux: slot %d is open", slot);
  kv_cache_t *c = child_of(x, child_id);
  if (!c) return qe_errf(QE_EINVAL, "kv_mux: no child %d", child_id);
  if (child_slot < 0 || child_slot >= c->geom.max_seqs)
    return qe_errf(QE_EINVAL, "kv_mux: child %d has no slot %d (%d slots)", child_id, child_slot,
                   c->geom.max_seqs);
  if (x->ch[child_id].owner[child_slot] >= 0)
    return qe_errf(QE_EINVAL, "kv_mux: slot %d of child %d is in use by slot %d", child_slot,
                   child_id, x->ch[child_id].owner[child_slot]);
  x->slots[slot] = (mux_slot_t){child_id, child_slot, 0};
  return 0;
}

kv_cache_t *kv_mux_child(const kv_cache_t *kv, int child_id) {
  const kv_mux_t *x = as_mux(kv);
  return x ? child_of(x, child_id) : NULL;
}

int kv_mux_lookup(const kv_cache_t *kv, int slot, int *child_id, int *child_slot) {
  const kv_mux_t *x = as_mux(kv);
  if (!x || slot < 0 || slot >= kv->geom.max_seqs || !child_of(x, x->slots[slot].child))
    return qe_errf(QE_EINVAL, "kv_mux: slot %d is not bound", slot);
  *child_id = x->slots[slot].child;
  *child_slot = x->slots[slot].child_slot;
  return 0;
}

int kv_mux_is_open(const kv_cache_t *kv, int slot) {
  const kv_mux_t *x = as_mux(kv);
  return x && open_slot(x, slot) != NULL;
}

/* The first mux slot open on child c, or -1. */
static int child_open_slot(const mux_child_t *c) {
  for (int i = 0; i < c->kv->geom.max_seqs; i++)
    if (c->owner[i] >= 0) return c->owner[i];
  return -1;
}

int kv_mux_child_busy(const kv_cache_t *kv, int child_id) {
  const kv_mux_t *x = as_mux(kv);
  return x && child_of(x, child_id) && child_open_slot(&x->ch[child_id]) >= 0;
}

int kv_mux_remove_child(kv_cache_t *kv, int child_id) {
  kv_mux_t *x = as_mux(kv);
  if (!x || !child_of(x, child_id)) return qe_errf(QE_EINVAL, "kv_mux: no child %d", child_id);
  mux_child_t *c = &x->ch[child_id];
  const int open = child_open_slot(c);
  if (open >= 0)
    return qe_errf(QE_EINVAL, "kv_mux: child %d has open slots (slot %d)", child_id, open);
  for (int i = 0; i < kv->geom.max_seqs; i++)
    if (x->slots[i].child == child_id) x->slots[i] = (mux_slot_t){-1, 0, 0};
  kv_cache_destroy(c->kv);
  free(c->owner);
  *c = (mux_child_t){NULL, NULL};
  for (int j = 0; j < x->fx_n; j++)
    if (x->fx_ids[j] == child_id) x->fx_n = 0; /* (the next step fills again) */
  x->fx_gen++;
  return 0;
}

int kv_mux_n_children(const kv_cache_t *kv) {
  const kv_mux_t *x = as_mux(kv);
  int n = 0;
  for (int i = 0; x && i < x->n_ch; i++) n += x->ch[i].kv != NULL;
  return n;
}
