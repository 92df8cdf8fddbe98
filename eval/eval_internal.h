/* eval_internal: what the task generators share: a growing string, a seeded generator
 * (splitmix64), the deterministic filler prose, invented words and needle keys, and the table
 * entry of a task. Internal to eval/. */
#ifndef QE_EVAL_INTERNAL_H
#define QE_EVAL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "eval_tasks.h"

/* A NUL-terminated string that grows; rc keeps the first allocation failure (later appends
 * are then no-ops). */
typedef struct {
  char *s;
  size_t n, cap;
  int rc;
} eval_sb_t;

void eval_sb_add(eval_sb_t *b, const char *s);
void eval_sb_printf(eval_sb_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void eval_sb_rtrim(eval_sb_t *b); /* drops trailing spaces and newlines */
void eval_sb_free(eval_sb_t *b);

/* splitmix64: a fixed, portable sequence for a seed. */
typedef struct {
  uint64_t s;
} eval_rng_t;

uint64_t eval_mix(uint64_t x); /* one splitmix64 finalisation of x */
eval_rng_t eval_rng(uint64_t seed, uint64_t stream);
uint64_t eval_rng_next(eval_rng_t *r);
int eval_rng_below(eval_rng_t *r, int n); /* uniform in [0, n), n > 0 */
/* Fisher-Yates shuffle of a[0..n). */
void eval_shuffle(eval_rng_t *r, int *a, int n);

/* Appends filler sentence i of seed (the same sentence whatever comes around it), with a
 * paragraph break after every sixth. */
void eval_filler(eval_sb_t *b, uint64_t seed, int i);
/* Writes invented word number i of seed (2 or 3 syllables, lower case) into buf (cap >= 16). */
void eval_word(uint64_t seed, int i, char *buf, size_t cap);
/* n distinct invented words of seed into words[n][16] (first letter upper case if cap). */
void eval_words(uint64_t seed, int n, int capital, char (*words)[16]);
/* n distinct needle keys ("quiet-lantern") of seed into keys[n][32]. */
void eval_keys(uint64_t seed, int n, char (*keys)[32]);

/* What a task builder produces for a number of filler units. */
typedef struct {
  eval_sb_t user;   /* the user message */
  eval_sb_t prefix; /* the start of the assistant's reply (the answer prefix) */
  char answers[EVAL_MAX_ANSWERS][32];
  int n_answers;
} eval_build_t;

struct eval_task {
  const char *name, *rule;
  int n_new;
  /* Builds the sample of seed with `units` filler units (>= 0) into b (zeroed by the caller).
   * Must be deterministic in (units, seed). Returns 0 or QE_ENOMEM. */
  int (*build)(eval_build_t *b, int units, uint64_t seed);
};

#endif
