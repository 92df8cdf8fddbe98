/* test_sched_idx: the key -> pointer map against a plain array, over fresh random runs of
 * inserts, lookups and deletes (keys drawn from a small range, consecutive ids as the
 * scheduler makes them, and multiples of a large power of two, so that probes collide and
 * deletions shift long runs), with the table growing through many sizes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sched_idx.h"
#include "test_util.h"

#define N_KEYS 5000

static uint64_t key_of(int mode, int i) {
  return mode == 0   ? (uint64_t)i
         : mode == 1 ? 1764979200000000ull + (uint64_t)i
                     : (uint64_t)i << 40;
}

static int run(int mode, uint64_t seed) {
  static char vals[N_KEYS];
  static int in[N_KEYS];
  sidx_t x = {0};
  int fails = 0, live = 0;
  srand((unsigned)seed);
  for (int i = 0; i < N_KEYS; i++) in[i] = 0;
  for (int op = 0; op < 200000 && fails < 5; op++) {
    const int i = rand() % (op < 100000 ? N_KEYS : N_KEYS / 3), r = rand() % 3;
    const uint64_t k = key_of(mode, i);
    if (r == 0 && !in[i]) {
      if (sidx_room(&x)) return fprintf(stderr, "out of memory\n"), 1;
      sidx_put(&x, k, &vals[i]), in[i] = 1, live++;
    } else if (r == 1) {
      sidx_del(&x, k), live -= in[i], in[i] = 0;
    }
    const int j = rand() % N_KEYS;
    void *got = sidx_get(&x, key_of(mode, j));
    if (got != (in[j] ? (void *)&vals[j] : NULL) || x.n != (size_t)live || 2 * x.n > x.cap)
      fails++, fprintf(stderr, "mode %d op %d: key %d: got %p, want %s (n %zu live %d)\n", mode, op,
                       j, got, in[j] ? "its value" : "NULL", x.n, live);
  }
  for (int i = 0; i < N_KEYS; i++) /* every key at the end */
    if (sidx_get(&x, key_of(mode, i)) != (in[i] ? (void *)&vals[i] : NULL)) fails++;
  sidx_free(&x);
  return fails;
}

int main(void) {
  const uint64_t seed = (uint64_t)time(NULL);
  printf("seed %llu\n", (unsigned long long)seed);
  for (int mode = 0; mode < 3; mode++) {
    const int f = run(mode, seed + (uint64_t)mode);
    CHECK(f == 0);
    printf("%s keys of kind %d: %d failure(s)\n", f ? "FAIL" : "ok  ", mode, f);
  }
  sidx_t empty = {0};
  CHECK(sidx_get(&empty, 7) == NULL);
  sidx_del(&empty, 7); /* (nothing to remove) */
  return tu_done("sched_idx");
}
