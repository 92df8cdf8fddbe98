/* eval_gen: the task builders (see eval_tasks.h for what each asks). A builder turns a number
 * of filler units and a seed into the user message, the answer prefix and the answers. Needle
 * depths and values depend on the seed only; filler sentence i is the same at every length. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval_internal.h"
#include "qe_status.h"

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* n distinct numbers in [lo, lo + span) into v. */
static void distinct_numbers(eval_rng_t *r, int lo, int span, int n, int *v) {
  for (int i = 0; i < n;) {
    v[i] = lo + eval_rng_below(r, span);
    int dup = 0;
    for (int k = 0; k < i && !dup; k++) dup = v[k] == v[i];
    if (!dup) i++;
  }
}

/* n sorted insertion points in [0, units] drawn from depths uniform in [0, 1]. */
static void insertion_points(eval_rng_t *r, int units, int n, int *at) {
  for (int i = 0; i < n; i++) {
    double d = (double)(eval_rng_next(r) >> 11) / 9007199254740992.0;
    at[i] = (int)(d * (units + 1));
    if (at[i] > units) at[i] = units;
  }
  for (int i = 1; i < n; i++)
    for (int k = i; k > 0 && at[k - 1] > at[k]; k--) {
      int t = at[k];
      at[k] = at[k - 1], at[k - 1] = t;
    }
}

/* Filler sentences [0, units) with the texts ins[i] placed before sentence at[i] (sorted). */
static void haystack(eval_sb_t *b, uint64_t seed, int units, char (*ins)[96], const int *at,
                     int n) {
  int k = 0;
  for (int i = 0; i <= units; i++) {
    for (; k < n && at[k] == i; k++) eval_sb_printf(b, "%s ", ins[k]);
    if (i < units) eval_filler(b, seed, i);
  }
  eval_sb_rtrim(b);
}

/* ---- needle in a haystack ------------------------------------------------------------------ */

static int niah(eval_build_t *b, int units, uint64_t seed, int n_keys, int n_vals) {
  char keys[4][32], ins[16][96];
  int vals[16], at[16], n = n_keys * n_vals;
  eval_rng_t r = eval_rng(seed, 1);
  eval_keys(seed, n_keys, keys);
  distinct_numbers(&r, 1000000, 9000000, n, vals);
  int q = eval_rng_below(&r, n_keys);
  int order[16];
  for (int i = 0; i < n; i++) order[i] = i;
  eval_shuffle(&r, order, n);
  for (int i = 0; i < n; i++)
    snprintf(ins[i], sizeof ins[i], "One of the special magic numbers for %s is: %d.",
             keys[order[i] / n_vals], vals[order[i]]);
  insertion_points(&r, units, n, at);
  eval_sb_add(&b->user, "Some special magic numbers are hidden within the following text. Make "
                        "sure to memorize it. I will quiz you about the numbers afterwards.\n\n");
  haystack(&b->user, seed, units, ins, at, n);
  const char *s = n_vals > 1 ? "s" : "";
  eval_sb_printf(&b->user,
                 "\n\nWhat %s the special magic number%s for %s mentioned in the "
                 "provided text?",
                 n_vals > 1 ? "are all" : "is", s, keys[q]);
  eval_sb_printf(&b->prefix, "The special magic number%s for %s mentioned in the provided text %s",
                 s, keys[q], n_vals > 1 ? "are" : "is");
  for (int v = 0; v < n_vals; v++) snprintf(b->answers[v], 32, "%d", vals[q * n_vals + v]);
  b->n_answers = n_vals;
  return b->user.rc ? b->user.rc : b->prefix.rc;
}

static int niah_single(eval_build_t *b, int units, uint64_t seed) {
  return niah(b, units, seed, 1, 1);
}
static int niah_multikey(eval_build_t *b, int units, uint64_t seed) {
  return niah(b, units, seed, 4, 1);
}
static int niah_multivalue(eval_build_t *b, int units, uint64_t seed) {
  return niah(b, units, seed, 1, 4);
}

/* ---- variable tracking ---------------------------------------------------------------------- */

static int vt(eval_build_t *b, int units, uint64_t seed) {
  enum { HOPS = 5 };
  char names[HOPS][8], ins[HOPS][96];
  int at[HOPS], value;
  eval_rng_t r = eval_rng(seed, 2);
  for (int i = 0; i < HOPS;) {
    for (int c = 0; c < 5; c++) names[i][c] = (char)('A' + eval_rng_below(&r, 26));
    names[i][5] = '\0';
    int dup = 0;
    for (int k = 0; k < i && !dup; k++) dup = !strcmp(names[k], names[i]);
    if (!dup) i++;
  }
  value = 10000 + eval_rng_below(&r, 90000);
  snprintf(ins[0], sizeof ins[0], "VAR %s = %d.", names[0], value);
  for (int i = 1; i < HOPS; i++)
    snprintf(ins[i], sizeof ins[i], "VAR %s = VAR %s.", names[i], names[i - 1]);
  insertion_points(&r, units, HOPS, at);
  eval_sb_add(&b->user, "Memorize and track the chain(s) of variable assignment hidden in the "
                        "following text.\n\n");
  haystack(&b->user, seed, units, ins, at, HOPS);
  eval_sb_printf(&b->user,
                 "\n\nQuestion: Find all variables that are assigned the value %d in the text "
                 "above.",
                 value);
  eval_sb_printf(&b->prefix,
                 "Answer: According to the chain(s) of variable assignment in the text above, %d "
                 "variables are assigned the value %d, they are:",
                 HOPS, value);
  for (int i = 0; i < HOPS; i++) memcpy(b->answers[i], names[i], 6);
  b->n_answers = HOPS;
  return b->user.rc ? b->user.rc : b->prefix.rc;
}

/* ---- common-word extraction ---------------------------------------------------------------- */

static int cwe(eval_build_t *b, int units, uint64_t seed) {
  enum { N_COMMON = 10, F_RARE = 3 };
  int f_common = 5 + units / 20, n_words = N_COMMON + units;
  int n = N_COMMON * f_common + F_RARE * units;
  char(*w)[16] = malloc(sizeof *w * (size_t)n_words);
  int *list = malloc(sizeof(int) * (size_t)n);
  if (!w || !list) {
    free(w), free(list);
    return qe_errf(QE_ENOMEM, "eval: out of memory");
  }
  eval_words(seed, n_words, 0, w);
  for (int i = 0, k = 0; i < n_words; i++)
    for (int c = 0; c < (i < N_COMMON ? f_common : F_RARE); c++) list[k++] = i;
  eval_rng_t r = eval_rng(seed, 0x4000000ull + (uint64_t)units);
  eval_shuffle(&r, list, n);
  eval_sb_add(&b->user, "Below is a numbered list of words. In these words, some appear more "
                        "often than others. Memorize the ones that appear most often.\n");
  for (int i = 0; i < n; i++) eval_sb_printf(&b->user, "%d. %s ", i + 1, w[list[i]]);
  eval_sb_rtrim(&b->user);
  eval_sb_printf(&b->user, "\nQuestion: What are the %d most common words in the above list?",
                 N_COMMON);
  eval_sb_printf(&b->prefix,
                 "Answer: The top %d words that appear most often in the list are:", N_COMMON);
  for (int i = 0; i < N_COMMON; i++) memcpy(b->answers[i], w[i], 16);
  b->n_answers = N_COMMON;
  free(w), free(list);
  return b->user.rc ? b->user.rc : b->prefix.rc;
}

/* ---- question answering over a report about invented towns --------------------------------- */

static const char *origins[] = {"coast", "north", "hills", "south", "islands", "east"};
static const char *goods[] = {"copper", "wool",    "salt",   "amber",   "pepper",  "linen", "tin",
                              "honey",  "timber",  "silk",   "barley",  "leather", "glass", "iron",
                              "cotton", "saffron", "pearls", "tobacco", "indigo",  "furs"};
static const char *days[] = {"Monday", "Tuesday",  "Wednesday", "Thursday",
                             "Friday", "Saturday", "Sunday"};
static const char *materials[] = {"grey stone", "red brick", "oak timber", "white marble",
                                  "slate",      "sandstone", "granite",    "pine logs"};
static const char *foods[] = {"bread",    "stew",    "cheese",   "pie",       "soup",  "porridge",
                              "trout",    "venison", "cider",    "dumplings", "plums", "mutton",
                              "pancakes", "oysters", "sausages", "apple cake"};

typedef struct {
  int year, origin, good, mills, later, day, material, arches, children, food, hours;
} eval_town_t;

static eval_town_t town_of(uint64_t seed, int j) {
  eval_rng_t r = eval_rng(seed, 0x5000000ull + (uint64_t)j);
  eval_town_t t;
  t.year = 1600 + eval_rng_below(&r, 300), t.origin = eval_rng_below(&r, N_OF(origins));
  t.good = eval_rng_below(&r, N_OF(goods)), t.mills = 2 + eval_rng_below(&r, 13);
  t.later = t.year + 10 + eval_rng_below(&r, 50), t.day = eval_rng_below(&r, N_OF(days));
  t.material = eval_rng_below(&r, N_OF(materials)), t.arches = 3 + eval_rng_below(&r, 27);
  t.children = 8 + eval_rng_below(&r, 53), t.food = eval_rng_below(&r, N_OF(foods));
  t.hours = 1 + eval_rng_below(&r, 6);
  return t;
}

/* Fact sentence f (0..7) of town t called name. */
static void town_fact(eval_sb_t *b, const eval_town_t *t, const char *name, int f) {
  switch (f) {
  case 0:
    eval_sb_printf(b, "The town of %s was founded in %d by settlers from the %s. ", name, t->year,
                   origins[t->origin]);
    break;
  case 1:
    eval_sb_printf(b, "Its market traded mostly in %s. ", goods[t->good]);
    break;
  case 2:
    eval_sb_printf(b, "By %d it had %d mills along the river. ", t->later, t->mills);
    break;
  case 3:
    eval_sb_printf(b, "The town council met every %s in a hall built of %s. ", days[t->day],
                   materials[t->material]);
    break;
  case 4:
    eval_sb_printf(b, "A famous bridge in %s has %d arches. ", name, t->arches);
    break;
  case 5:
    eval_sb_printf(b, "The local school taught %d children each year. ", t->children);
    break;
  case 6:
    eval_sb_printf(b, "Travellers said the inn at %s served the best %s in the valley. ", name,
                   foods[t->food]);
    break;
  default:
    eval_sb_printf(b, "The road to the next town took %d hours by cart.\n\n", t->hours);
  }
}

static int qa(eval_build_t *b, int units, uint64_t seed) {
  int facts = units + 8, n_towns = (facts + 7) / 8, complete = facts / 8;
  char(*names)[16] = malloc(sizeof *names * (size_t)n_towns);
  if (!names) return qe_errf(QE_ENOMEM, "eval: out of memory");
  eval_words(seed, n_towns, 1, names);
  eval_rng_t r = eval_rng(seed, 3);
  int target = (int)((double)(eval_rng_next(&r) >> 11) / 9007199254740992.0 * complete);
  int kind = eval_rng_below(&r, 4);
  eval_sb_add(&b->user, "Read the report and answer the question.\n\n");
  for (int f = 0; f < facts; f++) {
    eval_town_t t = town_of(seed, f / 8);
    town_fact(&b->user, &t, names[f / 8], f % 8);
  }
  eval_sb_rtrim(&b->user);
  eval_town_t t = town_of(seed, target);
  const char *nm = names[target];
  static const char *qs[] = {"Which good did the market of %s mostly trade in?",
                             "Which dish did the inn at %s serve best?",
                             "In which year was the town of %s founded?",
                             "What was the council hall of %s built of?"};
  eval_sb_add(&b->user, "\n\nQuestion: ");
  eval_sb_printf(&b->user, qs[kind], nm);
  eval_sb_add(&b->prefix, "Answer:");
  if (kind == 0) snprintf(b->answers[0], 32, "%s", goods[t.good]);
  if (kind == 1) snprintf(b->answers[0], 32, "%s", foods[t.food]);
  if (kind == 2) snprintf(b->answers[0], 32, "%d", t.year);
  if (kind == 3) snprintf(b->answers[0], 32, "%s", materials[t.material]);
  b->n_answers = 1;
  free(names);
  return b->user.rc ? b->user.rc : b->prefix.rc;
}

/* ---- the table --------------------------------------------------------------------------------
 */

static const eval_task_t tasks[] = {
    {"niah_single", "one needle (7-digit number) in filler prose; the number must appear", 24,
     niah_single},
    {"niah_multikey", "four needles with different keys; the asked key's number must appear", 24,
     niah_multikey},
    {"niah_multivalue", "four numbers under one key; score = share of the four that appear", 64,
     niah_multivalue},
    {"vt", "a chain of five variable assignments; score = share of the five names that appear", 40,
     vt},
    {"cwe", "ten frequent invented words in a numbered list; score = share of the ten named", 64,
     cwe},
    {"qa", "one fact of one invented town in a generated report; the fact must appear", 24, qa},
};

static const eval_task_t *const task_list[] = {&tasks[0], &tasks[1], &tasks[2], &tasks[3],
                                               &tasks[4], &tasks[5], NULL};

const eval_task_t *const *eval_task_list(void) { return task_list; }
