/* eval_text: the building blocks of the generated prompts: a growing string, splitmix64,
 * filler prose from a small fixed grammar, invented words and needle keys. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval_internal.h"
#include "qe_status.h"

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int sb_reserve(eval_sb_t *b, size_t extra) {
  if (b->rc) return b->rc;
  if (b->n + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap < b->n + extra + 1) cap *= 2;
  char *p = realloc(b->s, cap);
  if (!p) return b->rc = qe_errf(QE_ENOMEM, "eval: out of memory (%zu bytes)", cap);
  b->s = p, b->cap = cap;
  return 0;
}

void eval_sb_add(eval_sb_t *b, const char *s) {
  size_t n = strlen(s);
  if (sb_reserve(b, n)) return;
  memcpy(b->s + b->n, s, n + 1);
  b->n += n;
}

void eval_sb_printf(eval_sb_t *b, const char *fmt, ...) {
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    eval_sb_add(b, small);
    return;
  }
  if (sb_reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)n;
}

void eval_sb_rtrim(eval_sb_t *b) {
  while (b->n && (b->s[b->n - 1] == ' ' || b->s[b->n - 1] == '\n')) b->s[--b->n] = '\0';
}

void eval_sb_free(eval_sb_t *b) {
  free(b->s);
  *b = (eval_sb_t){0};
}

uint64_t eval_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

eval_rng_t eval_rng(uint64_t seed, uint64_t stream) {
  return (eval_rng_t){eval_mix(seed ^ eval_mix(stream + 0x51ed270b2f9a5c3dull))};
}

uint64_t eval_rng_next(eval_rng_t *r) {
  r->s += 0x9e3779b97f4a7c15ull;
  return eval_mix(r->s);
}

int eval_rng_below(eval_rng_t *r, int n) { return (int)(eval_rng_next(r) % (uint64_t)n); }

void eval_shuffle(eval_rng_t *r, int *a, int n) {
  for (int i = n - 1; i > 0; i--) {
    int j = eval_rng_below(r, i + 1), t = a[i];
    a[i] = a[j], a[j] = t;
  }
}

/* ---- filler prose ------------------------------------------------------------------------ */

static const char *subjects[] = {"The old miller",       "A young teacher",
                                 "The village council",  "Our neighbour",
                                 "The river guide",      "A travelling tinker",
                                 "The baker's daughter", "The harbour master",
                                 "A quiet shepherd",     "The night watchman",
                                 "The blacksmith",       "A visiting scholar",
                                 "The ferry captain",    "The choir",
                                 "A curious child",      "The gardener",
                                 "The postman",          "An elderly weaver",
                                 "The innkeeper",        "A pair of carpenters",
                                 "The school board",     "The lighthouse keeper",
                                 "A group of pilgrims",  "The potter"};
static const char *verbs[] = {
    "carried",  "painted",  "repaired",  "counted",   "described", "watched",  "cleaned", "sold",
    "measured", "found",    "borrowed",  "delivered", "admired",   "gathered", "planted", "moved",
    "sketched", "polished", "inspected", "wrapped",   "returned",  "stacked",  "lifted",  "traded"};
static const char *objects[] = {
    "the wooden fence",      "a basket of apples",   "the evening lanterns", "an old map",
    "the copper kettle",     "a crate of candles",   "the garden gate",      "a bundle of letters",
    "the broken cart wheel", "a jar of honey",       "the church bell rope", "a stack of blankets",
    "the fishing nets",      "a sack of flour",      "the iron lantern",     "a roll of canvas",
    "the stone steps",       "a box of nails",       "the rowing boat",      "a loaf of rye bread",
    "the tall ladder",       "a bolt of blue cloth", "the market stall",     "a barrel of cider"};
static const char *tails[] = {"before the rain came",       "near the quiet harbour",
                              "while the bells rang",       "on a cold morning",
                              "after the long winter",      "beside the mill pond",
                              "under the old oak tree",     "at the edge of the square",
                              "during the spring fair",     "in the late afternoon",
                              "without saying a word",      "with great care",
                              "behind the town hall",       "as the sun went down",
                              "on the way to the coast",    "for the third time that week",
                              "in front of the bakery",     "along the narrow lane",
                              "before anyone else woke up", "while the kettle boiled",
                              "next to the stables",        "in the cellar of the inn",
                              "by the light of a candle",   "at the end of the road"};

void eval_filler(eval_sb_t *b, uint64_t seed, int i) {
  eval_rng_t r = eval_rng(seed, 0x1000000ull + (uint64_t)i);
  const char *s = subjects[eval_rng_below(&r, N_OF(subjects))];
  const char *v = verbs[eval_rng_below(&r, N_OF(verbs))];
  const char *o = objects[eval_rng_below(&r, N_OF(objects))];
  const char *t = tails[eval_rng_below(&r, N_OF(tails))];
  eval_sb_printf(b, "%s %s %s %s.%s", s, v, o, t, i % 6 == 5 ? "\n\n" : " ");
}

/* ---- invented words and keys -------------------------------------------------------------- */

static const char *onsets[] = {"b", "d", "f", "g", "k",  "l",  "m",  "n",  "p",  "r",
                               "s", "t", "v", "z", "br", "dr", "gl", "st", "tr", "sh"};
static const char *vowels[] = {"a", "e", "i", "o", "u", "ai", "ou", "ea"};
static const char *codas[] = {"", "", "n", "r", "l", "s", "m", "th", "x", "nd"};

void eval_word(uint64_t seed, int i, char *buf, size_t cap) {
  eval_rng_t r = eval_rng(seed, 0x2000000ull + (uint64_t)i);
  int syl = 2 + eval_rng_below(&r, 2);
  size_t n = 0;
  buf[0] = '\0';
  for (int k = 0; k < syl && n + 8 < cap; k++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s%s", onsets[eval_rng_below(&r, N_OF(onsets))],
                          vowels[eval_rng_below(&r, N_OF(vowels))],
                          k == syl - 1 ? codas[eval_rng_below(&r, N_OF(codas))] : "");
}

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* Inserts words[i] into the open-addressed set (slots hold index + 1); 0 if already there. */
static int set_insert(int *set, size_t mask, char (*words)[16], int i) {
  for (size_t k = hash_str(words[i]) & mask;; k = (k + 1) & mask) {
    if (!set[k]) return set[k] = i + 1, 1;
    if (!strcmp(words[set[k] - 1], words[i])) return 0;
  }
}

void eval_words(uint64_t seed, int n, int capital, char (*words)[16]) {
  size_t cap = 16;
  while (cap < 2 * (size_t)n) cap *= 2;
  int *set = calloc(cap, sizeof(int)), small[16] = {0};
  if (!set) set = n <= 8 ? small : NULL, cap = 16;
  for (int i = 0, j = 0; i < n; j++) {
    eval_word(seed, j, words[i], sizeof words[i]);
    int dup = 0;
    if (set)
      dup = !set_insert(set, cap - 1, words, i);
    else
      for (int k = 0; k < i && !dup; k++) dup = !strcmp(words[k], words[i]);
    if (dup) continue;
    i++;
  }
  for (int i = 0; capital && i < n; i++) words[i][0] = (char)toupper((unsigned char)words[i][0]);
  if (set != small) free(set);
}

static const char *key_adj[] = {"quiet",  "golden", "hollow",  "silver", "crimson",  "gentle",
                                "frozen", "hidden", "ancient", "bright", "restless", "humble"};
static const char *key_noun[] = {"lantern", "harbour", "meadow", "falcon",  "compass", "orchard",
                                 "anvil",   "willow",  "beacon", "thistle", "garnet",  "ferry"};

void eval_keys(uint64_t seed, int n, char (*keys)[32]) {
  eval_rng_t r = eval_rng(seed, 0x3000000ull);
  for (int i = 0; i < n;) {
    snprintf(keys[i], sizeof keys[i], "%s-%s", key_adj[eval_rng_below(&r, N_OF(key_adj))],
             key_noun[eval_rng_below(&r, N_OF(key_noun))]);
    int dup = 0;
    for (int k = 0; k < i && !dup; k++) dup = !strcmp(keys[k], keys[i]);
    if (!dup) i++;
  }
}
