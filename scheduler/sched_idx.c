/* sched_idx: open addressing with linear probing (sched_idx.h). */
#include "sched_idx.h"

#include <stdlib.h>

static size_t home(uint64_t key, size_t cap) {
  return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & (cap - 1);
}

void sidx_put(sidx_t *x, uint64_t key, void *val) {
  size_t i = home(key, x->cap);
  while (x->e[i].val) i = (i + 1) & (x->cap - 1);
  x->e[i].key = key, x->e[i].val = val, x->n++;
}

int sidx_room(sidx_t *x) {
  if (2 * (x->n + 1) <= x->cap) return 0;
  const size_t cap = x->cap ? 2 * x->cap : 64, old_cap = x->cap;
  sidx_ent_t *old = x->e, *t = calloc(cap, sizeof *t);
  if (!t) return -1;
  x->e = t, x->cap = cap, x->n = 0;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].val) sidx_put(x, old[i].key, old[i].val);
  free(old);
  return 0;
}

void *sidx_get(const sidx_t *x, uint64_t key) {
  if (!x->cap) return NULL;
  for (size_t i = home(key, x->cap); x->e[i].val; i = (i + 1) & (x->cap - 1))
    if (x->e[i].key == key) return x->e[i].val;
  return NULL;
}

void sidx_del(sidx_t *x, uint64_t key) {
  if (!x->cap) return;
  const size_t mask = x->cap - 1;
  size_t i = home(key, x->cap);
  while (x->e[i].val && x->e[i].key != key) i = (i + 1) & mask;
  if (!x->e[i].val) return;
  x->e[i].val = NULL, x->n--;
  for (size_t j = (i + 1) & mask; x->e[j].val; j = (j + 1) & mask) {
    const size_t h = home(x->e[j].key, x->cap);
    if (((j - h) & mask) >= ((j - i) & mask)) /* the hole lies on j's probe path: fill it */
      x->e[i] = x->e[j], x->e[j].val = NULL, i = j;
  }
}

void sidx_free(sidx_t *x) {
  free(x->e);
  x->e = NULL, x->cap = x->n = 0;
}
