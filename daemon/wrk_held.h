/* wrk_held: a worker's held starts (requests whose start waits for a cache child of their policy
 * configuration, or for room for their whole prompt in a step), oldest first. */
#ifndef QE_WRK_HELD_H
#define QE_WRK_HELD_H

#include <stdint.h>

#include "wrk_internal.h"

typedef struct {
  wcmd_t *head, *tail;
} wrk_held_t;

/* Whether start c could start now as far as one condition goes (ctx: the caller's). */
typedef int (*wrk_held_fn)(void *ctx, const wcmd_t *c);

/* Appends c (its next is overwritten). */
void wrk_held_push(wrk_held_t *q, wcmd_t *c);

/* The next held start that can start now, or NULL; take: unlinked from q. Walks oldest first:
 * a start waiting for a cache child (child_ok 0) is passed over, since it starts once a child
 * frees and must not hold the starts behind it; the first waiting for room in a step (room_ok 0)
 * ends the walk, since the later ones wait behind it (a long prompt is not overtaken for good). */
wcmd_t *wrk_held_next(wrk_held_t *q, wrk_held_fn child_ok, wrk_held_fn room_ok, void *ctx,
                      int take);

/* Unlinks the held starts of request id (all: every one) and returns them as a list (next). */
wcmd_t *wrk_held_remove(wrk_held_t *q, uint64_t id, int all);

#endif
