/* wrk_held: a worker's held starts (see wrk_held.h). */
#include "wrk_held.h"

#include <stddef.h>

void wrk_held_push(wrk_held_t *q, wcmd_t *c) {
  c->next = NULL;
  if (q->tail)
    q->tail->next = c;
  else
    q->head = c;
  q->tail = c;
}

/* Unlinks the entry at *p (prev: the one before it, or NULL). */
static wcmd_t *unlink_at(wrk_held_t *q, wcmd_t **p, wcmd_t *prev) {
  wcmd_t *c = *p;
  *p = c->next;
  if (q->tail == c) q->tail = prev;
  c->next = NULL;
  return c;
}

wcmd_t *wrk_held_next(wrk_held_t *q, wrk_held_fn child_ok, wrk_held_fn room_ok, void *ctx,
                      int take) {
  wcmd_t *prev = NULL;
  for (wcmd_t **p = &q->head; *p; prev = *p, p = &(*p)->next) {
    if (!child_ok(ctx, *p)) continue;
    if (!room_ok(ctx, *p)) return NULL;
    return take ? unlink_at(q, p, prev) : *p;
  }
  return NULL;
}

wcmd_t *wrk_held_remove(wrk_held_t *q, uint64_t id, int all) {
  wcmd_t *out = NULL, **out_tail = &out, *prev = NULL;
  for (wcmd_t **p = &q->head; *p;) {
    if (!all && (*p)->request_id != id) {
      prev = *p, p = &(*p)->next;
      continue;
    }
    *out_tail = unlink_at(q, p, prev);
    out_tail = &(*out_tail)->next;
  }
  return out;
}
