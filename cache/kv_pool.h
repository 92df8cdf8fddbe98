/* kv_pool: the page pool of one worker: one arena carved into slots of a Full page's size;
 * a slot holds either one Full page or up to 64 INT2 pages, so memory moves between tiers as
 * routing moves windows. Running out is QE_ENOSPC, never an exit. Not thread-safe. */
#ifndef QE_KV_POOL_H
#define QE_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "kern.h"

typedef struct kv_pool kv_pool_t;

typedef struct {
  size_t capacity;            /* arena bytes */
  size_t full_pages, q_pages; /* pages in use */
  size_t slots_used, slots;   /* slots in use (Full or INT2) / all */
} kv_pool_stats_t;

/* Arena of at least `bytes` in backend memory; full_page and q_page are page sizes in bytes
 * (q_page <= full_page). */
int kv_pool_create(kern_backend_t *be, size_t bytes, size_t full_page, size_t q_page,
                   kv_pool_t **out);
void kv_pool_destroy(kv_pool_t *p);
/* INT2 pages a slot holds for page sizes full_page >= q_page > 0: as many as fit, at most 64. */
int kv_pool_q_per_slot(size_t full_page, size_t q_page);
/* Returns a page or NULL when the arena is exhausted (the caller reports QE_ENOSPC). */
void *kv_pool_alloc_full(kv_pool_t *p);
void *kv_pool_alloc_q(kv_pool_t *p);
void kv_pool_free_full(kv_pool_t *p, void *page);
void kv_pool_free_q(kv_pool_t *p, void *page);
void kv_pool_stats(const kv_pool_t *p, kv_pool_stats_t *out);

#endif
