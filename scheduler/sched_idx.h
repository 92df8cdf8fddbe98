/* sched_idx: a map from 64-bit keys to non-NULL pointers (the scheduler's requests by id):
 * open addressing with linear probing, a power-of-two capacity at most half full, deletion by
 * backward shift (no tombstones). Not thread-safe. */
#ifndef QE_SCHED_IDX_H
#define QE_SCHED_IDX_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint64_t key;
  void *val; /* NULL: an empty slot */
} sidx_ent_t;

typedef struct {
  sidx_ent_t *e;
  size_t cap, n;
} sidx_t; /* zeroed: empty */

/* Room for one more entry (grows the table); -1 when out of memory, the map unchanged. */
int sidx_room(sidx_t *x);
/* Adds key -> val (val non-NULL, key absent) after sidx_room returned 0. */
void sidx_put(sidx_t *x, uint64_t key, void *val);
/* The value of key, or NULL. */
void *sidx_get(const sidx_t *x, uint64_t key);
/* Removes key if present. */
void sidx_del(sidx_t *x, uint64_t key);
void sidx_free(sidx_t *x);

#endif
