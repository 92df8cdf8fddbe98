/* test_wrk_held: the worker's queue of held starts (daemon/wrk_held): a start waiting for a cache
 * child does not hold the starts behind it, one waiting for room in a step does; removal by
 * request and the queue's tail through every path. */
#include <stddef.h>
#include <string.h>

#include "test_util.h"
#include "wrk_held.h"

/* Each start's conditions by request id (1..N). */
#define N 6
typedef struct {
  int child[N + 1], room[N + 1];
} conds_t;

static int child_ok(void *ctx, const wcmd_t *c) { return ((conds_t *)ctx)->child[c->request_id]; }
static int room_ok(void *ctx, const wcmd_t *c) { return ((conds_t *)ctx)->room[c->request_id]; }

/* The ids of q in order into ids (0-terminated); also checks that the tail is the last. */
static void ids_of(const wrk_held_t *q, int *ids) {
  int n = 0;
  const wcmd_t *last = NULL;
  for (const wcmd_t *c = q->head; c && n < N; c = c->next) ids[n++] = (int)c->request_id, last = c;
  ids[n] = 0;
  CHECK(q->tail == last);
}

static int same(const int *got, const int *want) {
  for (int i = 0;; i++) {
    if (got[i] != want[i]) return 0;
    if (!want[i]) return 1;
  }
}

/* A queue of starts 1..n, every one able to start. */
static void fill(wrk_held_t *q, wcmd_t *cmds, conds_t *k, int n) {
  memset(q, 0, sizeof *q);
  memset(k, 0, sizeof *k);
  for (int i = 1; i <= n; i++) {
    memset(&cmds[i], 0, sizeof cmds[i]);
    cmds[i].request_id = (uint64_t)i, k->child[i] = k->room[i] = 1;
    wrk_held_push(q, &cmds[i]);
  }
}

static void test_child_wait_passed_over(void) {
  wrk_held_t q;
  wcmd_t cmds[N + 1];
  conds_t k;
  int ids[N + 1];
  fill(&q, cmds, &k, 3);
  k.child[1] = 0; /* a 17th policy configuration: no cache child until one frees */
  CHECK(wrk_held_next(&q, child_ok, room_ok, &k, 0) == &cmds[2]); /* peek: nothing unlinked */
  ids_of(&q, ids);
  CHECK(same(ids, (int[]){1, 2, 3, 0}));
  CHECK(wrk_held_next(&q, child_ok, room_ok, &k, 1) == &cmds[2]);
  CHECK(wrk_held_next(&q, child_ok, room_ok, &k, 1) == &cmds[3]);
  CHECK(wrk_held_next(&q, child_ok, room_ok, &k, 1) == NULL);
  ids_of(&q, ids);
  CHECK(same(ids, (int[]){1, 0}));
  k.child[1] = 1; /* a child freed: the oldest start takes it */
  CHECK(wrk_held_next(&q, child_ok, room_ok, &k, 1) == &cmds[1]);
  CHECK(!q.head && !q.tail);
}

static void test_room_wait_holds(void) {
  wrk_held_t q;
  wcmd_t cmds[N + 1];
  conds_t k;
  int ids[N + 1];
  fill(&q, cmds, &k, 4);
  k.child[1] = 0, k.room[2] = 0; /* 2's whole prompt does not fit the next step */
  CHECK(wrk_held_next(&q, child_ok, room_ok, &k, 1) == NULL); /* 3, 4 wait behind 2 */
  k.room[2] = 1;
  CHECK(wrk_held_next(&q, child_ok, room_ok, &k, 1) == &cmds[2]);
  ids_of(&q, ids);
  CHECK(same(ids, (int[]){1, 3, 4, 0}));
  CHECK(wrk_held_next(&q, child_ok, room_ok, &k, 1) == &cmds[3]);
  CHECK(wrk_held_next(&q, child_ok, room_ok, &k, 1) == &cmds[4]); /* the tail taken */
  ids_of(&q, ids);
  CHECK(same(ids, (int[]){1, 0}));
  memset(&cmds[5], 0, sizeof cmds[5]);
  cmds[5].request_id = 5;
  wrk_held_push(&q, &cmds[5]); /* (after the tail's removal) */
  ids_of(&q, ids);
  CHECK(same(ids, (int[]){1, 5, 0}));
}

static void test_remove(void) {
  wrk_held_t q;
  wcmd_t cmds[N + 1];
  conds_t k;
  int ids[N + 1];
  fill(&q, cmds, &k, 4);
  cmds[4].request_id = 2; /* two starts of request 2 (a retry) */
  wcmd_t *out = wrk_held_remove(&q, 2, 0);
  CHECK(out == &cmds[2] && out->next == &cmds[4] && !cmds[4].next);
  ids_of(&q, ids);
  CHECK(same(ids, (int[]){1, 3, 0}));
  CHECK(wrk_held_remove(&q, 9, 0) == NULL);
  out = wrk_held_remove(&q, 0, 1);
  CHECK(out == &cmds[1] && out->next == &cmds[3] && !cmds[3].next);
  CHECK(!q.head && !q.tail);
  wrk_held_push(&q, &cmds[1]);
  ids_of(&q, ids);
  CHECK(same(ids, (int[]){1, 0}));
}

int main(void) {
  test_child_wait_passed_over();
  test_room_wait_holds();
  test_remove();
  return tu_done("wrk_held");
}
