/* sched_admit: admission accounting (see sched_admit.h). Requests and tenants live in two
 * chained hash tables (a removed tenant whose requests still run leaves its table for a list,
 * a->gone, so that its id is free); each tenant keeps its waiting requests in a FIFO list, and the
 * tenants that have waiting requests form a ring whose cursor (a->turn) is the tenant served next.
 * After every public call the state is a fixpoint: no waiting request could be admitted. */
#include "sched_admit.h"

#include <stdlib.h>
#include <string.h>

#include "qe_log.h"
#include "qe_status.h"

typedef struct atenant atenant_t;

typedef struct areq {
  uint64_t id, seq; /* seq: arrival order, oldest first when two heads starve */
  int64_t bytes;
  atenant_t *t;
  int state;
  unsigned bypass;          /* times passed over as its tenant's head while it fit the quota */
  struct areq *hnext;       /* hash chain */
  struct areq *prev, *next; /* tenant queue */
} areq_t;

struct atenant {
  char id[SCHED_ADMIT_TENANT_MAX + 1];
  int64_t quota, reserved, queued_bytes;
  size_t n_running, n_queued;
  int removed;              /* unlinked from the id table, its running requests still held */
  areq_t *head, *tail;      /* FIFO of waiting requests */
  atenant_t *hnext;         /* hash chain (removed: the list a->gone) */
  atenant_t *rprev, *rnext; /* ring of tenants with waiting requests */
};

typedef struct {
  uint64_t id;
  int status;
} aevent_t;

struct sched_admit {
  int64_t pool, used, queued_bytes;
  size_t n_running, n_queued, n_tenants;
  unsigned max_bypass;
  uint64_t next_seq;
  sched_admit_cb cb;
  void *user;
  areq_t **rb;     /* [n_rb] request buckets */
  atenant_t **tb;  /* [n_tb] tenant buckets */
  atenant_t *gone; /* removed tenants whose running requests are not all released yet */
  size_t n_rb, n_req, n_tb;
  atenant_t *turn; /* ring cursor; NULL when nothing waits */
  aevent_t *ev;    /* [ev_cap] pending events; ev_head..ev_n not yet delivered */
  size_t ev_n, ev_head, ev_cap;
  int delivering;
};

/* ---- hash tables ---- */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27, x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static uint64_t str_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
  return mix64(h);
}

static areq_t *req_find(const sched_admit_t *a, uint64_t id) {
  areq_t *r = a->rb[mix64(id) & (a->n_rb - 1)];
  while (r && r->id != id) r = r->hnext;
  return r;
}

/* Doubles the request buckets when full; on failure nothing changes. */
static int req_reserve_slot(sched_admit_t *a) {
  if (a->n_req < a->n_rb) return 0;
  size_t nb = a->n_rb * 2;
  areq_t **b = calloc(nb, sizeof *b);
  if (!b) return qe_errf(QE_ENOMEM, "admission: request table of %zu", nb);
  for (size_t i = 0; i < a->n_rb; i++)
    for (areq_t *r = a->rb[i], *next; r; r = next) {
      next = r->hnext;
      size_t k = mix64(r->id) & (nb - 1);
      r->hnext = b[k], b[k] = r;
    }
  free(a->rb);
  a->rb = b, a->n_rb = nb;
  return 0;
}

static void req_link(sched_admit_t *a, areq_t *r) {
  size_t k = mix64(r->id) & (a->n_rb - 1);
  r->hnext = a->rb[k], a->rb[k] = r;
  a->n_req++;
}

static void req_unlink(sched_admit_t *a, areq_t *r) {
  areq_t **p = &a->rb[mix64(r->id) & (a->n_rb - 1)];
  while (*p != r) p = &(*p)->hnext;
  *p = r->hnext;
  a->n_req--;
}

static atenant_t *tenant_find(const sched_admit_t *a, const char *id) {
  atenant_t *t = a->tb[str_hash(id) & (a->n_tb - 1)];
  while (t && strcmp(t->id, id)) t = t->hnext;
  return t;
}

static int tenant_grow(sched_admit_t *a) {
  if (a->n_tenants < a->n_tb) return 0;
  size_t nb = a->n_tb * 2;
  atenant_t **b = calloc(nb, sizeof *b);
  if (!b) return qe_errf(QE_ENOMEM, "admission: tenant table of %zu", nb);
  for (size_t i = 0; i < a->n_tb; i++)
    for (atenant_t *t = a->tb[i], *next; t; t = next) {
      next = t->hnext;
      size_t k = str_hash(t->id) & (nb - 1);
      t->hnext = b[k], b[k] = t;
    }
  free(a->tb);
  a->tb = b, a->n_tb = nb;
  return 0;
}

static void tenant_unlink(sched_admit_t *a, atenant_t *t) {
  atenant_t **p = &a->tb[str_hash(t->id) & (a->n_tb - 1)];
  while (*p != t) p = &(*p)->hnext;
  *p = t->hnext;
  a->n_tenants--;
}

/* Frees a removed tenant once its last request was released. */
static void gone_free(sched_admit_t *a, atenant_t *t) {
  atenant_t **p = &a->gone;
  while (*p != t) p = &(*p)->hnext;
  *p = t->hnext;
  free(t);
}

/* ---- the ring of waiting tenants and their queues ---- */

/* Joins the ring last in turn order (just before the cursor). */
static void ring_join(sched_admit_t *a, atenant_t *t) {
  if (!a->turn) {
    t->rprev = t->rnext = t, a->turn = t;
    return;
  }
  t->rnext = a->turn, t->rprev = a->turn->rprev;
  t->rprev->rnext = t, a->turn->rprev = t;
}

static void ring_leave(sched_admit_t *a, atenant_t *t) {
  if (t->rnext == t) {
    a->turn = NULL;
  } else {
    t->rprev->rnext = t->rnext, t->rnext->rprev = t->rprev;
    if (a->turn == t) a->turn = t->rnext;
  }
  t->rprev = t->rnext = NULL;
}

static void queue_push(sched_admit_t *a, areq_t *r) {
  atenant_t *t = r->t;
  r->state = SCHED_ADMIT_QUEUED, r->prev = t->tail, r->next = NULL;
  if (t->tail)
    t->tail->next = r;
  else
    t->head = r, ring_join(a, t);
  t->tail = r;
  t->n_queued++, t->queued_bytes += r->bytes;
  a->n_queued++, a->queued_bytes += r->bytes;
}

static void queue_remove(sched_admit_t *a, areq_t *r) {
  atenant_t *t = r->t;
  if (r->prev)
    r->prev->next = r->next;
  else
    t->head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  else
    t->tail = r->prev;
  r->prev = r->next = NULL;
  t->n_queued--, t->queued_bytes -= r->bytes;
  a->n_queued--, a->queued_bytes -= r->bytes;
  if (!t->head) ring_leave(a, t);
}

/* ---- events ---- */

/* Room for `more` events past the pending ones, so pushes never fail. */
static int ev_room(sched_admit_t *a, size_t more) {
  size_t need = a->ev_n + more;
  if (need <= a->ev_cap) return 0;
  size_t cap = a->ev_cap * 2 > need ? a->ev_cap * 2 : need + 16;
  aevent_t *e = realloc(a->ev, cap * sizeof *e);
  if (!e) return qe_errf(QE_ENOMEM, "admission: event queue of %zu", cap);
  a->ev = e, a->ev_cap = cap;
  return 0;
}

/* Room for one event per request that may still leave the queue. */
static int ev_reserve(sched_admit_t *a) { return ev_room(a, a->n_queued + 1); }

static void ev_push(sched_admit_t *a, uint64_t id, int status) {
  QE_ASSERT(a->ev_n < a->ev_cap);
  a->ev[a->ev_n++] = (aevent_t){id, status};
}

/* Delivers pending events in order; a nested call leaves them to the outermost one. */
static void ev_deliver(sched_admit_t *a) {
  if (a->delivering) return;
  a->delivering = 1;
  while (a->ev_head < a->ev_n) {
    aevent_t e = a->ev[a->ev_head++];
    if (a->cb) a->cb(a->user, e.id, e.status);
  }
  a->ev_n = a->ev_head = 0;
  a->delivering = 0;
}

/* ---- admission ---- */

static int fits_tenant(const areq_t *r) { return r->t->reserved + r->bytes <= r->t->quota; }

static int fits_pool(const sched_admit_t *a, const areq_t *r) {
  return a->used + r->bytes <= a->pool;
}

/* Every other tenant's head that fit its quota was passed over by this admission. */
static void count_bypass(sched_admit_t *a, const atenant_t *admitted) {
  atenant_t *t = a->turn;
  if (!t) return;
  do {
    if (t != admitted && fits_tenant(t->head)) t->head->bypass++;
    t = t->rnext;
  } while (t != a->turn);
}

/* Reserves r's bytes; a queued r leaves its queue and gets an event. */
static void grant(sched_admit_t *a, areq_t *r) {
  int was_queued = r->state == SCHED_ADMIT_QUEUED;
  if (was_queued) queue_remove(a, r);
  r->state = SCHED_ADMIT_RUNNING;
  r->t->reserved += r->bytes, r->t->n_running++;
  a->used += r->bytes, a->n_running++;
  QE_ASSERT(r->t->reserved <= r->t->quota && a->used <= a->pool);
  count_bypass(a, r->t);
  if (was_queued) ev_push(a, r->id, 0);
}

/* The oldest head that has been passed over max_bypass times and fits its quota, if any. */
static areq_t *starving(const sched_admit_t *a) {
  areq_t *best = NULL;
  atenant_t *t = a->turn;
  if (!t) return NULL;
  do {
    areq_t *h = t->head;
    if (h->bypass >= a->max_bypass && fits_tenant(h) && (!best || h->seq < best->seq)) best = h;
    t = t->rnext;
  } while (t != a->turn);
  return best;
}

/* One round-robin turn: admits the first head, from the cursor on, that fits; the turn then
 * passes to the tenant after it. Returns 1 if it admitted one. */
static int admit_turn(sched_admit_t *a) {
  atenant_t *t = a->turn;
  do {
    areq_t *h = t->head;
    if (fits_tenant(h) && fits_pool(a, h)) {
      a->turn = t->rnext;
      grant(a, h);
      return 1;
    }
    t = t->rnext;
  } while (t != a->turn);
  return 0;
}

/* Admits waiting requests until none fits (the fixpoint every public call ends in). */
static void admit_pass(sched_admit_t *a) {
  while (a->turn) {
    areq_t *s = starving(a);
    if (s && !fits_pool(a, s)) return; /* the pool is held for it */
    if (s)
      a->turn = s->t->rnext, grant(a, s); /* counts as its tenant's turn */
    else if (!admit_turn(a))
      return;
  }
}

/* Drops the queued requests of t larger than max_bytes, each with an event of status. */
static void drop_queued(sched_admit_t *a, atenant_t *t, int64_t max_bytes, int status) {
  for (areq_t *r = t->head, *next; r; r = next) {
    next = r->next;
    if (r->bytes <= max_bytes) continue;
    queue_remove(a, r);
    req_unlink(a, r);
    ev_push(a, r->id, status);
    free(r);
  }
}

/* Ends r, queued or reserved, with an event of status (a refusal). */
static void refuse(sched_admit_t *a, areq_t *r, int status) {
  if (r->state == SCHED_ADMIT_QUEUED) {
    queue_remove(a, r);
  } else {
    r->t->reserved -= r->bytes, r->t->n_running--;
    a->used -= r->bytes, a->n_running--;
  }
  req_unlink(a, r);
  ev_push(a, r->id, status);
  free(r);
}

/* r's bytes become bytes (> 0; a reserved r's no more than it holds). */
static void resize(sched_admit_t *a, areq_t *r, int64_t bytes) {
  const int64_t d = bytes - r->bytes;
  QE_ASSERT(bytes > 0 && (r->state == SCHED_ADMIT_QUEUED || d <= 0));
  if (r->state == SCHED_ADMIT_QUEUED)
    r->t->queued_bytes += d, a->queued_bytes += d;
  else
    r->t->reserved += d, a->used += d;
  r->bytes = bytes;
}

/* Each request of t takes the bytes fit gives it, or is refused. */
static void refit(sched_admit_t *a, atenant_t *t, sched_admit_fit_cb fit, void *user) {
  for (size_t i = 0; i < a->n_rb; i++)
    for (areq_t *r = a->rb[i], *next; r; r = next) {
      next = r->hnext;
      if (r->t != t) continue;
      const int64_t bytes = fit(user, r->id, r->bytes);
      if (bytes < 0)
        refuse(a, r, (int)bytes);
      else
        resize(a, r, bytes);
    }
}

/* ---- public ---- */

int sched_admit_create(int64_t pool_bytes, sched_admit_cb cb, void *user, sched_admit_t **out) {
  if (!out) return qe_errf(QE_EINVAL, "admission: no output handle");
  *out = NULL;
  if (pool_bytes < 0) return qe_errf(QE_EINVAL, "pool_bytes: must be >= 0");
  sched_admit_t *a = calloc(1, sizeof *a);
  if (!a) return qe_errf(QE_ENOMEM, "admission: handle");
  a->pool = pool_bytes, a->cb = cb, a->user = user;
  a->max_bypass = SCHED_ADMIT_DEFAULT_BYPASS;
  a->n_rb = 64, a->n_tb = 16;
  a->rb = calloc(a->n_rb, sizeof *a->rb);
  a->tb = calloc(a->n_tb, sizeof *a->tb);
  if (!a->rb || !a->tb) {
    sched_admit_destroy(a);
    return qe_errf(QE_ENOMEM, "admission: tables");
  }
  *out = a;
  return 0;
}

void sched_admit_destroy(sched_admit_t *a) {
  if (!a) return;
  for (size_t i = 0; a->rb && i < a->n_rb; i++)
    for (areq_t *r = a->rb[i], *next; r; r = next) next = r->hnext, free(r);
  for (size_t i = 0; a->tb && i < a->n_tb; i++)
    for (atenant_t *t = a->tb[i], *next; t; t = next) next = t->hnext, free(t);
  for (atenant_t *t = a->gone, *next; t; t = next) next = t->hnext, free(t);
  free(a->rb);
  free(a->tb);
  free(a->ev);
  free(a);
}

int sched_admit_set_pool(sched_admit_t *a, int64_t pool_bytes) {
  if (pool_bytes < 0) return qe_errf(QE_EINVAL, "pool_bytes: must be >= 0");
  a->pool = pool_bytes;
  for (size_t i = 0; i < a->n_tb; i++)
    for (atenant_t *t = a->tb[i]; t; t = t->hnext) drop_queued(a, t, pool_bytes, QE_ERANGE);
  admit_pass(a);
  ev_deliver(a);
  return 0;
}

int sched_admit_set_max_bypass(sched_admit_t *a, unsigned max_bypass) {
  if (max_bypass < 1) return qe_errf(QE_EINVAL, "max_bypass: must be >= 1");
  a->max_bypass = max_bypass;
  admit_pass(a);
  ev_deliver(a);
  return 0;
}

static int check_tenant_id(const char *tenant) {
  if (!tenant || !*tenant || strnlen(tenant, SCHED_ADMIT_TENANT_MAX + 1) > SCHED_ADMIT_TENANT_MAX)
    return qe_errf(QE_EINVAL, "tenant: id must be 1 to %d bytes", SCHED_ADMIT_TENANT_MAX);
  return 0;
}

static int tenant_add(sched_admit_t *a, const char *tenant, int64_t quota) {
  int rc = tenant_grow(a);
  atenant_t *t = rc ? NULL : calloc(1, sizeof *t);
  if (!t) return rc ? rc : qe_errf(QE_ENOMEM, "admission: tenant");
  strcpy(t->id, tenant);
  t->quota = quota;
  size_t k = str_hash(t->id) & (a->n_tb - 1);
  t->hnext = a->tb[k], a->tb[k] = t;
  a->n_tenants++;
  return 0;
}

int sched_admit_set_tenant(sched_admit_t *a, const char *tenant, int64_t quota_bytes) {
  return sched_admit_refit_tenant(a, tenant, quota_bytes, NULL, NULL);
}

int sched_admit_refit_tenant(sched_admit_t *a, const char *tenant, int64_t quota_bytes,
                             sched_admit_fit_cb fit, void *user) {
  int rc = check_tenant_id(tenant);
  if (rc) return rc;
  if (quota_bytes <= 0)
    return qe_errf(QE_EINVAL, "kv_quota_bytes: must be > 0 (got %lld)", (long long)quota_bytes);
  atenant_t *t = tenant_find(a, tenant);
  if (!t) return tenant_add(a, tenant, quota_bytes);
  if (fit && (rc = ev_room(a, a->n_req + 1))) return rc;
  t->quota = quota_bytes;
  if (fit) refit(a, t, fit, user);
  drop_queued(a, t, quota_bytes, QE_ERANGE);
  admit_pass(a);
  ev_deliver(a);
  return 0;
}

int sched_admit_remove_tenant(sched_admit_t *a, const char *tenant) {
  int rc = check_tenant_id(tenant);
  atenant_t *t = rc ? NULL : tenant_find(a, tenant);
  if (rc) return rc;
  if (!t) return qe_errf(QE_ENOTFOUND, "tenant: '%s' unknown", tenant);
  drop_queued(a, t, -1, QE_ENOTFOUND);
  tenant_unlink(a, t); /* (its id is free at once: a tenant set again under it starts clean) */
  if (!t->n_running)
    free(t);
  else
    t->removed = 1, t->hnext = a->gone, a->gone = t;
  admit_pass(a);
  ev_deliver(a);
  return 0;
}

static int check_reserve(sched_admit_t *a, uint64_t id, const char *tenant, int64_t bytes,
                         atenant_t **t) {
  int rc = check_tenant_id(tenant);
  if (rc) return rc;
  *t = tenant_find(a, tenant);
  if (!*t) return qe_errf(QE_ENOTFOUND, "tenant: '%s' unknown", tenant);
  if (bytes <= 0) return qe_errf(QE_EINVAL, "bytes: must be > 0 (got %lld)", (long long)bytes);
  if (req_find(a, id))
    return qe_errf(QE_EINVAL, "request id: %llu is already reserved or queued",
                   (unsigned long long)id);
  if (bytes > (*t)->quota)
    return qe_errf(QE_ERANGE, "bytes: %lld exceed the tenant's kv_quota_bytes %lld",
                   (long long)bytes, (long long)(*t)->quota);
  if (bytes > a->pool)
    return qe_errf(QE_ERANGE, "bytes: %lld exceed the KV pool of %lld", (long long)bytes,
                   (long long)a->pool);
  return 0;
}

int sched_admit_reserve(sched_admit_t *a, uint64_t id, const char *tenant, int64_t bytes,
                        int *state) {
  atenant_t *t = NULL;
  int rc = check_reserve(a, id, tenant, bytes, &t);
  if (!rc) rc = req_reserve_slot(a);
  if (!rc) rc = ev_reserve(a);
  areq_t *r = rc ? NULL : calloc(1, sizeof *r);
  if (!r) return rc ? rc : qe_errf(QE_ENOMEM, "admission: request");
  r->id = id, r->seq = a->next_seq++, r->bytes = bytes, r->t = t;
  req_link(a, r);
  if (!t->head && fits_tenant(r) && fits_pool(a, r) && !starving(a))
    grant(a, r);
  else
    queue_push(a, r);
  if (state) *state = r->state;
  return 0;
}

int sched_admit_release(sched_admit_t *a, uint64_t id) {
  areq_t *r = req_find(a, id);
  if (!r)
    return qe_errf(QE_ENOTFOUND, "request id: %llu is not reserved or queued",
                   (unsigned long long)id);
  atenant_t *t = r->t;
  if (r->state == SCHED_ADMIT_RUNNING) {
    t->reserved -= r->bytes, t->n_running--;
    a->used -= r->bytes, a->n_running--;
  } else {
    queue_remove(a, r);
  }
  req_unlink(a, r);
  free(r);
  if (t->removed && !t->n_running) gone_free(a, t);
  admit_pass(a);
  ev_deliver(a);
  return 0;
}

int sched_admit_state(const sched_admit_t *a, uint64_t id) {
  const areq_t *r = req_find(a, id);
  return r ? r->state : SCHED_ADMIT_NONE;
}

int sched_admit_tenant_stats(const sched_admit_t *a, const char *tenant,
                             sched_admit_tenant_stats_t *out) {
  int rc = check_tenant_id(tenant);
  const atenant_t *t = rc ? NULL : tenant_find(a, tenant);
  if (rc) return rc;
  if (!t) return qe_errf(QE_ENOTFOUND, "tenant: '%s' unknown", tenant);
  *out = (sched_admit_tenant_stats_t){t->quota, t->reserved, t->queued_bytes, t->n_running,
                                      t->n_queued};
  return 0;
}

void sched_admit_stats(const sched_admit_t *a, sched_admit_stats_t *out) {
  *out = (sched_admit_stats_t){a->pool,      a->used,     a->queued_bytes,
                               a->n_running, a->n_queued, a->n_tenants};
}
