/* kv_pool: slab arena for Full and INT2 pages (see kv_pool.h). Free slots are a stack; slots
 * holding INT2 pages carry a 64-bit occupancy mask and sit on a "partial" list while they
 * have room. */
#include "kv_pool.h"

#include <stdlib.h>

#include "qe_status.h"

enum { SLOT_FREE = 0, SLOT_FULL = 1, SLOT_Q = 2 };

typedef struct {
  uint8_t kind;
  uint64_t used;    /* INT2 pages in use (bit i = page i) */
  int next_partial; /* -1 ends the list */
  int on_partial;
} kv_slot_t;

struct kv_pool {
  kern_backend_t *be;
  uint8_t *arena;
  size_t full_page, q_page;
  int n_slots, per_slot; /* INT2 pages per slot */
  kv_slot_t *slots;
  int *free_stack, n_free;
  int partial; /* head of the partial INT2 slot list */
  size_t full_pages, q_pages;
};

int kv_pool_q_per_slot(size_t full_page, size_t q_page) {
  return full_page / q_page > 64 ? 64 : (int)(full_page / q_page);
}

int kv_pool_create(kern_backend_t *be, size_t bytes, size_t full_page, size_t q_page,
                   kv_pool_t **out) {
  if (!full_page || !q_page || q_page > full_page)
    return qe_errf(QE_EINVAL, "kv_pool: bad page sizes (%zu, %zu)", full_page, q_page);
  kv_pool_t *p = calloc(1, sizeof *p);
  if (!p) return qe_errf(QE_ENOMEM, "kv_pool: out of memory");
  *p = (kv_pool_t){.be = be, .full_page = full_page, .q_page = q_page, .partial = -1};
  p->n_slots = (int)((bytes + full_page - 1) / full_page);
  p->per_slot = kv_pool_q_per_slot(full_page, q_page);
  p->arena = kern_alloc(be, (size_t)p->n_slots * full_page);
  p->slots = calloc((size_t)p->n_slots + 1, sizeof *p->slots);
  p->free_stack = malloc(sizeof(int) * ((size_t)p->n_slots + 1));
  if (!p->arena || !p->slots || !p->free_stack) {
    kv_pool_destroy(p);
    return qe_errf(QE_ENOSPC, "kv_pool: cannot reserve %zu bytes", bytes);
  }
  for (int i = p->n_slots - 1; i >= 0; i--) p->free_stack[p->n_free++] = i;
  *out = p;
  return 0;
}

void kv_pool_destroy(kv_pool_t *p) {
  if (!p) return;
  if (p->arena) kern_free(p->be, p->arena);
  free(p->slots);
  free(p->free_stack);
  free(p);
}

static int take_slot(kv_pool_t *p, int kind) {
  if (!p->n_free) return -1;
  int s = p->free_stack[--p->n_free];
  p->slots[s] = (kv_slot_t){.kind = (uint8_t)kind, .next_partial = -1};
  return s;
}

static void give_slot(kv_pool_t *p, int s) {
  p->slots[s].kind = SLOT_FREE;
  p->free_stack[p->n_free++] = s;
}

void *kv_pool_alloc_full(kv_pool_t *p) {
  int s = take_slot(p, SLOT_FULL);
  if (s < 0) return NULL;
  p->full_pages++;
  return p->arena + (size_t)s * p->full_page;
}

void kv_pool_free_full(kv_pool_t *p, void *page) {
  int s = (int)(((uint8_t *)page - p->arena) / p->full_page);
  give_slot(p, s);
  p->full_pages--;
}

/* Removes slot s from the partial list. */
static void unlink_partial(kv_pool_t *p, int s) {
  int *link = &p->partial;
  while (*link >= 0 && *link != s) link = &p->slots[*link].next_partial;
  if (*link == s) *link = p->slots[s].next_partial;
  p->slots[s].on_partial = 0;
}

void *kv_pool_alloc_q(kv_pool_t *p) {
  int s = p->partial;
  if (s < 0 && (s = take_slot(p, SLOT_Q)) >= 0) {
    p->slots[s].next_partial = p->partial, p->slots[s].on_partial = 1;
    p->partial = s;
  }
  if (s < 0) return NULL;
  kv_slot_t *sl = &p->slots[s];
  int i = __builtin_ctzll(~sl->used);
  sl->used |= 1ull << i;
  if (sl->used == (p->per_slot == 64 ? ~0ull : (1ull << p->per_slot) - 1)) unlink_partial(p, s);
  p->q_pages++;
  return p->arena + (size_t)s * p->full_page + (size_t)i * p->q_page;
}

void kv_pool_free_q(kv_pool_t *p, void *page) {
  size_t off = (size_t)((uint8_t *)page - p->arena);
  int s = (int)(off / p->full_page), i = (int)((off % p->full_page) / p->q_page);
  kv_slot_t *sl = &p->slots[s];
  sl->used &= ~(1ull << i);
  p->q_pages--;
  if (!sl->used) {
    if (sl->on_partial) unlink_partial(p, s);
    give_slot(p, s);
  } else if (!sl->on_partial) {
    sl->next_partial = p->partial, sl->on_partial = 1;
    p->partial = s;
  }
}

void kv_pool_stats(const kv_pool_t *p, kv_pool_stats_t *o) {
  *o = (kv_pool_stats_t){(size_t)p->n_slots * p->full_page, p->full_pages, p->q_pages,
                         (size_t)(p->n_slots - p->n_free), (size_t)p->n_slots};
}
