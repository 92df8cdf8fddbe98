/* wrk_cache: per-request KV policies over one kv_mux (see wrk_cache.h). Mux slot s always maps
 * to slot s of whichever child serves its request, so child slots never collide. */
#include <stdlib.h>
#include <string.h>

#include "kv_mux.h"
#include "qe_log.h"
#include "qe_status.h"
#include "wrk_cache.h"

#define WC_MAX_CHILDREN 16

typedef struct {
  int id; /* mux child id; -1: empty entry */
  int full;
  kv_policy_cfg_t cfg;
} wchild_t;

typedef struct {
  int child; /* index into ch */
  uint64_t request;
  size_t budget, full_last;
} wslot_t;

struct wrk_cache {
  model_t *m;
  kv_cache_t *mux;
  kv_geom_t geom;
  size_t pool_bytes;
  wchild_t ch[WC_MAX_CHILDREN];
  wslot_t *slot; /* [max_seqs] */
};

int wrk_cache_create(model_t *m, int max_seqs, size_t pool_bytes, wrk_cache_t **out) {
  wrk_cache_t *c = calloc(1, sizeof *c);
  if (!c) return qe_errf(QE_ENOMEM, "wrk_cache: out of memory");
  c->m = m;
  c->geom = model_kv_geom(m, max_seqs);
  c->pool_bytes = pool_bytes;
  for (int i = 0; i < WC_MAX_CHILDREN; i++) c->ch[i].id = -1;
  c->slot = calloc((size_t)max_seqs, sizeof *c->slot);
  int rc = c->slot ? kv_mux_create(model_backend(m), &c->geom, &c->mux)
                   : qe_errf(QE_ENOMEM, "wrk_cache: out of memory");
  if (rc) {
    free(c->slot);
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

void wrk_cache_destroy(wrk_cache_t *c) {
  if (!c) return;
  kv_cache_destroy(c->mux);
  free(c->slot);
  free(c);
}

kv_cache_t *wrk_cache_kv(wrk_cache_t *c) { return c->mux; }

/* Arena of a tiered child: every budget this rank can reserve, plus, per slot, one layer of a
 * full-context prompt at Full during prefill routing and partly filled INT2 pages. */
static size_t child_pool(const wrk_cache_t *c, const kv_cache_t *kv, const kv_policy_cfg_t *cfg) {
  size_t page = kv_tiered_page_bytes(kv);
  size_t ctx = (size_t)model_hparams(c->m)->n_ctx_train;
  size_t per_slot = (ctx / (size_t)cfg->omega + 2 + 2 * (size_t)c->geom.n_layer) * page;
  return c->pool_bytes + c->pool_bytes / 8 + (size_t)c->geom.max_seqs * per_slot;
}

static int make_child(wrk_cache_t *c, const wrk_open_arg_t *a, kv_cache_t **out) {
  kern_backend_t *be = model_backend(c->m);
  if (a->full) return kv_full_create(be, &c->geom, out);
  int rc = kv_tiered_create(be, &c->geom, &model_hparams(c->m)->rope, &a->cfg, 0, out);
  if (!rc) rc = kv_tiered_set_pool(*out, child_pool(c, *out, &a->cfg));
  if (rc && *out) {
    kv_cache_destroy(*out);
    *out = NULL;
  }
  return rc;
}

/* Drops an idle child to make room; -1 if every child is busy. */
static int evict_child(wrk_cache_t *c) {
  for (int i = 0; i < WC_MAX_CHILDREN; i++)
    if (c->ch[i].id >= 0 && kv_mux_remove_child(c->mux, c->ch[i].id) == 0) {
      c->ch[i].id = -1;
      return i;
    }
  return -1;
}

static int child_for(wrk_cache_t *c, const wrk_open_arg_t *a, int *idx) {
  int empty = -1;
  for (int i = 0; i < WC_MAX_CHILDREN; i++) {
    wchild_t *w = &c->ch[i];
    if (w->id < 0) {
      empty = empty < 0 ? i : empty;
      continue;
    }
    if (w->full == a->full && (a->full || !memcmp(&w->cfg, &a->cfg, sizeof a->cfg)))
      return *idx = i, 0;
  }
  if (empty < 0 && (empty = evict_child(c)) < 0)
    return qe_errf(QE_ENOSPC, "more than %d distinct KV policies in use at once", WC_MAX_CHILDREN);
  kv_cache_t *kv = NULL;
  int rc = make_child(c, a, &kv);
  int id = -1;
  if (!rc && (rc = kv_mux_add_child(c->mux, kv, &id))) kv_cache_destroy(kv);
  if (rc) return rc;
  c->ch[empty] = (wchild_t){id, a->full, a->cfg};
  *idx = empty;
  return 0;
}

/* This rank's share of a whole-request budget: proportional to its KV heads. */
static size_t rank_share(const wrk_cache_t *c, uint64_t budget) {
  int n_kv = model_hparams(c->m)->n_head_kv;
  return (size_t)(budget * (uint64_t)model_shard(c->m)->n_kv / (uint64_t)n_kv);
}

int wrk_cache_open(void *ud, kv_cache_t *kv, int slot, int capacity, const void *arg, size_t len) {
  wrk_cache_t *c = ud;
  wrk_open_arg_t a;
  if (len != sizeof a) return qe_errf(QE_EINVAL, "wrk_cache: open argument of %zu bytes", len);
  memcpy(&a, arg, sizeof a);
  a.policy[sizeof a.policy - 1] = 0;
  int idx = 0, rc = child_for(c, &a, &idx);
  if (rc) return rc;
  kv_cache_t *child = kv_mux_child(c->mux, c->ch[idx].id);
  size_t share = rank_share(c, a.budget);
  if (!a.full && (rc = kv_tiered_set_budget(child, slot, share))) return rc;
  if ((rc = kv_mux_bind(c->mux, slot, c->ch[idx].id, slot))) return rc;
  c->slot[slot] = (wslot_t){idx, a.request_id, share, 0};
  return kv->ops->seq_open(kv, slot, capacity);
}

void wrk_cache_stats(const wrk_cache_t *c, int slot, kv_mem_stats_t *out) {
  memset(out, 0, sizeof *out);
  wslot_t *s = &c->slot[slot];
  const wchild_t *w = &c->ch[s->child];
  kv_cache_t *child = w->id >= 0 ? kv_mux_child(c->mux, w->id) : NULL;
  if (!child) return;
  if (!w->full) return kv_tiered_stats(child, slot, out);
  size_t b = child->ops->seq_bytes(child, slot);
  if (b > s->full_last) s->full_last = b;
  out->budget = s->budget;
  out->bytes = out->peak_bytes = out->full_bytes = b ? b : s->full_last;
}

void wrk_cache_touch(wrk_cache_t *c, int slot) {
  kv_mem_stats_t m;
  if (c->ch[c->slot[slot].child].full) wrk_cache_stats(c, slot, &m);
}

uint64_t wrk_cache_request(const wrk_cache_t *c, int slot) { return c->slot[slot].request; }
