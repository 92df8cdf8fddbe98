/* wrk_cache: per-request KV policies over one kv_mux (see wrk_cache.h). Mux slot s always maps
 * to slot s of whichever child serves its request, so child slots never collide. */
#include <stdlib.h>
#include <string.h>

#include "kv_gpu.h" /* its sizes and policy check are in every build; the cache itself is not */
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
  size_t peak; /* GPU tiered: the highest bytes read */
  int faulted; /* GPU tiered: a pool fault was logged */
} wslot_t;

struct wrk_cache {
  model_t *m;
  kv_cache_t *mux;
  kv_geom_t geom;
  size_t pool_bytes;
  int gpu; /* the backend holds device memory: the children live on the GPU */
  wchild_t ch[WC_MAX_CHILDREN];
  wslot_t *slot; /* [max_seqs] */
};

int wrk_cache_create(model_t *m, int max_seqs, size_t pool_bytes, wrk_cache_t **out) {
  wrk_cache_t *c = calloc(1, sizeof *c);
  if (!c) return qe_errf(QE_ENOMEM, "wrk_cache: out of memory");
  c->m = m;
  c->geom = model_kv_geom(m, max_seqs);
  c->pool_bytes = pool_bytes;
  c->gpu = !model_backend(m)->ops->host_memory;
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

void wrk_cache_set_pool(wrk_cache_t *c, size_t pool_bytes) { c->pool_bytes = pool_bytes; }

/* Arena of a tiered child: every budget this rank can reserve, plus, per slot, one layer of a
 * full-context prompt at Full during prefill routing and partly filled INT2 pages. */
static size_t child_pool(const wrk_cache_t *c, const kv_cache_t *kv, const kv_policy_cfg_t *cfg) {
  size_t page = kv_tiered_page_bytes(kv);
  size_t ctx = (size_t)model_hparams(c->m)->n_ctx_train;
  size_t per_slot = (ctx / (size_t)cfg->omega + 2 + 2 * (size_t)c->geom.n_layer) * page;
  const size_t held = kv_tiered_pool_for(kv, c->pool_bytes); /* (INT2 ledgers' slots) */
  return held + held / 8 + (size_t)c->geom.max_seqs * per_slot;
}

/* Whether the GPU tiered cache runs cfg (kv_gpu_create_tiered's limits), as QE_EUNSUPPORTED
 * naming the request's field; the scheduler refuses the same requests up front
 * (sched_validate.c). */
static int gpu_policy_check(const wrk_cache_t *c, const wrk_open_arg_t *a) {
  return kv_gpu_policy_check(&a->cfg, a->policy, 1, c->geom.head_dim, c->geom.n_head,
                             c->geom.n_kv_head);
}

#ifdef QE_HAVE_KV_GPU
/* 1 when the paged GPU kernels take the geometry (kv_gpu.h: head_dim 64 or 128, 1..8 query
 * heads per KV head). */
static int gpu_geom_fits(const kv_geom_t *g) {
  return (g->head_dim == 64 || g->head_dim == 128) && g->n_head % g->n_kv_head == 0 &&
         g->n_head / g->n_kv_head <= 8;
}

/* kv_gpu's FullKV arena: every byte this rank can reserve, plus each slot's last partly filled
 * window in every layer (reservations count tokens, pages hold KV_GPU_OMEGA of them). */
static size_t gpu_full_arena(const wrk_cache_t *c) {
  size_t page = kv_gpu_page_bytes(&c->geom, KV_GPU_OMEGA);
  return c->pool_bytes + (size_t)c->geom.max_seqs * (size_t)c->geom.n_layer * page;
}

/* The per-slot budget a tiered child's arena is sized for: an even share of the pool plus the
 * protected regions (sink and local windows, with their bookkeeping), which every open slot
 * holds whatever its budget; the pages and ledgers are shared by all slots. */
static size_t gpu_slot_spec(const wrk_cache_t *c, const kv_policy_cfg_t *p) {
  size_t prot = 0;
  (void)kv_gpu_bounds(&c->geom, p, 0, NULL, &prot, NULL); /* the window was checked before */
  return c->pool_bytes / (size_t)c->geom.max_seqs + prot;
}
#endif

/* A child on the GPU (see wrk_cache.h). */
static int make_gpu_child(wrk_cache_t *c, const wrk_open_arg_t *a, kv_cache_t **out) {
  kern_backend_t *be = model_backend(c->m);
  int rc = a->full ? 0 : gpu_policy_check(c, a);
  if (rc) return rc;
#ifdef QE_HAVE_KV_GPU
  int ctx = model_hparams(c->m)->n_ctx_train;
  if (a->full && gpu_geom_fits(&c->geom))
    return kv_gpu_create(be, &c->geom, KV_GPU_OMEGA, ctx, gpu_full_arena(c), out);
  if (!a->full)
    return kv_gpu_create_tiered(be, &c->geom, &model_hparams(c->m)->rope, &a->cfg, ctx,
                                c->geom.max_seqs, 1.0, gpu_slot_spec(c, &a->cfg), out);
#endif
  if (a->full) return kv_full_create(be, &c->geom, out);
  return qe_errf(QE_EUNSUPPORTED, "policy.name: '%s': this build has no GPU tiered cache",
                 a->policy);
}

static int make_child(wrk_cache_t *c, const wrk_open_arg_t *a, kv_cache_t **out) {
  kern_backend_t *be = model_backend(c->m);
  if (c->gpu) return make_gpu_child(c, a, out);
  if (a->full) return kv_full_create(be, &c->geom, out);
  int rc = kv_tiered_create(be, &c->geom, &model_hparams(c->m)->rope, &a->cfg, 0, out);
  if (!rc) rc = kv_tiered_set_pool(*out, child_pool(c, *out, &a->cfg));
  if (rc && *out) {
    kv_cache_destroy(*out);
    *out = NULL;
  }
  return rc;
}

/* Drops entry i's child if it is idle; 1 when dropped. */
static int drop_child(wrk_cache_t *c, int i) {
  if (c->ch[i].id < 0 || kv_mux_remove_child(c->mux, c->ch[i].id)) return 0;
  c->ch[i].id = -1;
  return 1;
}

/* Drops an idle child to make room; -1 if every child is busy. */
static int evict_child(wrk_cache_t *c) {
  for (int i = 0; i < WC_MAX_CHILDREN; i++)
    if (drop_child(c, i)) return i;
  return -1;
}

/* On the CPU a new configuration first drops every idle one (*empty: the first free entry
 * after). A tiered child's arena stays as resident as its peak use, so children kept for
 * configurations no longer in use held up to WC_MAX_CHILDREN times --pool-bytes; a GPU child's
 * arena is held whole from its start, and one is dropped only when its device memory is needed. */
static void drop_idle_children(wrk_cache_t *c, int *empty) {
  for (int i = 0; i < WC_MAX_CHILDREN; i++)
    if (drop_child(c, i) && (*empty < 0 || i < *empty)) *empty = i;
}

/* The entry of the child that serves a's configuration, or -1; *empty: the first empty entry,
 * or -1. */
static int find_child(const wrk_cache_t *c, const wrk_open_arg_t *a, int *empty) {
  *empty = -1;
  for (int i = 0; i < WC_MAX_CHILDREN; i++) {
    const wchild_t *w = &c->ch[i];
    if (w->id < 0) {
      *empty = *empty < 0 ? i : *empty;
      continue;
    }
    if (w->full == a->full && (a->full || !memcmp(&w->cfg, &a->cfg, sizeof a->cfg))) return i;
  }
  return -1;
}

int wrk_cache_can_open(const wrk_cache_t *c, const wrk_open_arg_t *a) {
  int empty, i = find_child(c, a, &empty);
  if (i >= 0 || empty >= 0) return 1;
  for (i = 0; i < WC_MAX_CHILDREN; i++)
    if (!kv_mux_child_busy(c->mux, c->ch[i].id)) return 1;
  return 0;
}

static int child_for(wrk_cache_t *c, const wrk_open_arg_t *a, int *idx) {
  int empty, i = find_child(c, a, &empty);
  if (i >= 0) return *idx = i, 0;
  if (!c->gpu) drop_idle_children(c, &empty);
  if (empty < 0 && (empty = evict_child(c)) < 0)
    return qe_errf(QE_ENOSPC, "more than %d distinct KV policies in use at once", WC_MAX_CHILDREN);
  kv_cache_t *kv = NULL;
  int rc = make_child(c, a, &kv);
  while (rc == QE_ENOSPC && c->gpu && evict_child(c) >= 0) /* device memory of idle children */
    rc = make_child(c, a, &kv);
  int id = -1;
  if (!rc && (rc = kv_mux_add_child(c->mux, kv, &id))) kv_cache_destroy(kv);
  if (rc) return rc;
  c->ch[empty] = (wchild_t){id, a->full, a->cfg};
  *idx = empty;
  return 0;
}

/* This rank's share of a whole-request budget: proportional to its KV heads. */
static size_t rank_share(const wrk_cache_t *c, uint64_t budget) {
  return (size_t)model_kv_share(model_hparams(c->m), model_shard(c->m), budget);
}

/* This rank's share of a tiered request's budget, for the next open of slot. */
static int set_budget(wrk_cache_t *c, kv_cache_t *child, int slot, size_t share) {
#ifdef QE_HAVE_KV_GPU
  if (c->gpu) return kv_gpu_set_budget(child, slot, share); /* seq_open checks the minimum */
#endif
  (void)c;
  return kv_tiered_set_budget(child, slot, share);
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
  if (!a.full && (rc = set_budget(c, child, slot, share))) return rc;
  if ((rc = kv_mux_bind(c->mux, slot, c->ch[idx].id, slot))) return rc;
  c->slot[slot] = (wslot_t){idx, a.request_id, share, 0, 0, 0};
  return kv->ops->seq_open(kv, slot, capacity);
}

#ifdef QE_HAVE_KV_GPU
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
#endif

/* A GPU tiered slot's figures (kv_gpu_stats: read from the device). kv_gpu counts bytes and
 * windows; the split by kind comes from the window counts: Full = FULL windows x page bytes,
 * INT2 = INT2 windows x ledger bytes, the rest (bookkeeping, ledgers kept by promoted windows)
 * is metadata. */
static void gpu_tiered_stats(const wrk_cache_t *c, kv_cache_t *child, const wchild_t *w, wslot_t *s,
                             int slot, kv_mem_stats_t *out) {
#ifdef QE_HAVE_KV_GPU
  kv_gpu_stats_t g;
  if (kv_gpu_stats(child, slot, &g)) {
    qe_log(QE_LOG_WARN, "wrk: request %llu: GPU cache statistics: %s",
           (unsigned long long)s->request, qe_errmsg());
    return;
  }
  const kv_geom_t *ge = &c->geom;
  kv_qsizes_t q = kv_qsizes(&w->cfg.quant, w->cfg.omega, ge->n_kv_head, ge->head_dim);
  size_t led = q.k_codes + q.k_meta + q.v_codes + q.v_meta;
  out->budget = g.budget, out->bytes = g.bytes;
  out->full_bytes = min_sz(g.bytes, (size_t)g.windows[0] * kv_gpu_page_bytes(ge, w->cfg.omega));
  out->int2_bytes = min_sz(g.bytes - out->full_bytes, (size_t)g.windows[1] * led);
  out->meta_bytes = g.bytes - out->full_bytes - out->int2_bytes;
  if (g.bytes > s->peak) s->peak = g.bytes;
  out->peak_bytes = s->peak;
  memcpy(out->windows, g.windows, sizeof out->windows);
  out->promotions = g.promotions, out->demotions = g.demotions, out->evictions = g.evictions;
  out->quantizations = g.quantizations, out->routing_events = g.routings;
  if (g.err_flags && !s->faulted)
    qe_log(QE_LOG_WARN, "wrk: request %llu: GPU cache pools ran dry (flags %d): windows evicted",
           (unsigned long long)s->request, g.err_flags);
  s->faulted |= g.err_flags != 0;
#else
  (void)c, (void)child, (void)w, (void)s, (void)slot, (void)out;
#endif
}

void wrk_cache_stats(const wrk_cache_t *c, int slot, kv_mem_stats_t *out) {
  memset(out, 0, sizeof *out);
  wslot_t *s = &c->slot[slot];
  const wchild_t *w = &c->ch[s->child];
  kv_cache_t *child = w->id >= 0 ? kv_mux_child(c->mux, w->id) : NULL;
  if (!child) return;
  if (!w->full && c->gpu) {
    gpu_tiered_stats(c, child, w, s, slot, out);
    return;
  }
  if (!w->full) {
    kv_tiered_stats(child, slot, out);
    return;
  }
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

int wrk_cache_whole_prompt(const wrk_cache_t *c, const wrk_open_arg_t *a) {
  return c->gpu && !a->full;
}

uint64_t wrk_cache_full_bytes_per_token(const wrk_cache_t *c) {
  const kv_geom_t *g = &c->geom;
  uint64_t elems =
      (uint64_t)2 * (uint64_t)g->n_kv_head * (uint64_t)g->head_dim * (uint64_t)g->n_layer;
#ifdef QE_HAVE_KV_GPU
  if (c->gpu && gpu_geom_fits(g)) return elems * 2; /* bf16 pages */
#endif
  return elems * sizeof(float);
}

uint32_t wrk_cache_full_page_tokens(const wrk_cache_t *c) {
#ifdef QE_HAVE_KV_GPU
  if (c->gpu && gpu_geom_fits(&c->geom)) return KV_GPU_OMEGA;
#endif
  (void)c;
  return 1;
}

size_t wrk_cache_gpu_arena_bytes(const wrk_cache_t *c) {
#ifdef QE_HAVE_KV_GPU
  if (c->gpu && gpu_geom_fits(&c->geom)) return gpu_full_arena(c);
#endif
  (void)c;
  return 0;
}
