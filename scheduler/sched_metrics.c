/* sched_metrics: the Prometheus metrics registry (see sched_metrics.h). Families are kept
 * sorted by name; each family's series live in a chained hash table keyed by their label
 * values (each value followed by a NUL byte), sorted only when rendered. */
#include "sched_metrics.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"

typedef struct sm_series {
  struct sm_series *next; /* hash chain */
  uint64_t hash;
  size_t key_len;    /* bytes of key: every label value followed by a NUL */
  double value;      /* counter or gauge value; histogram: the sum */
  uint64_t count;    /* histogram: observations */
  uint64_t *buckets; /* histogram: [n_buckets] counts per bucket (not cumulative), else NULL */
  char key[];
} sm_series_t;

struct sm_fam {
  char *name, *help;
  int type, n_labels, n_buckets;
  char *labels[SM_MAX_LABELS];
  double *bounds;    /* [n_buckets] histogram upper bounds */
  sm_series_t **tab; /* [cap] hash chains; cap is 0 or a power of two */
  size_t cap, n;
};

struct sm_reg {
  sm_fam_t **fams; /* [n] sorted by name */
  size_t n, cap;
};

static const double default_buckets[] = {.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10};

/* ---- names and text ----------------------------------------------------------------------- */

static int is_alpha_(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }

static int valid_metric_name(const char *s) {
  if (!s || !(is_alpha_(*s) || *s == ':')) return 0;
  for (s++; *s; s++)
    if (!(is_alpha_(*s) || is_digit(*s) || *s == ':')) return 0;
  return 1;
}

static int valid_label_name(const char *s) {
  if (!s || !is_alpha_(*s) || (s[0] == '_' && s[1] == '_')) return 0;
  for (s++; *s; s++)
    if (!(is_alpha_(*s) || is_digit(*s))) return 0;
  return 1;
}

/* Length of the UTF-8 sequence at s (1..4), or 0 if it is not valid UTF-8. */
static int utf8_seq(const unsigned char *s) {
  unsigned c = s[0], n, cp, i;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf)
    n = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef)
    n = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 4, cp = c & 0x07;
  else
    return 0;
  for (i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if (cp >= 0xd800 && cp <= 0xdfff) return 0;
  return (int)n;
}

static int valid_utf8(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    int n = utf8_seq(p);
    if (!n) return 0;
    p += n;
  }
  return 1;
}

/* ---- families ----------------------------------------------------------------------------- */

/* Is name one of the names f's samples carry (its name; a histogram's _bucket, _sum, _count)? */
static int emits(const sm_fam_t *f, const char *name) {
  static const char *const sfx[] = {"_bucket", "_sum", "_count"};
  size_t bl = strlen(f->name);
  if (!strcmp(f->name, name)) return 1;
  if (f->type != SM_HISTOGRAM || strncmp(f->name, name, bl)) return 0;
  for (int i = 0; i < 3; i++)
    if (!strcmp(name + bl, sfx[i])) return 1;
  return 0;
}

/* Does the new family g (not yet registered) clash with an emitted name of any family? */
static int name_clash(const sm_reg_t *r, const sm_fam_t *g) {
  static const char *const sfx[] = {"", "_bucket", "_sum", "_count"};
  char buf[1024];
  int n_sfx = g->type == SM_HISTOGRAM ? 4 : 1;
  for (size_t i = 0; i < r->n; i++) {
    for (int k = 0; k < n_sfx; k++) {
      snprintf(buf, sizeof buf, "%s%s", g->name, sfx[k]);
      if (emits(r->fams[i], buf)) return 1;
    }
  }
  return 0;
}

static int check_labels(const char *name, int type, const char *const *labels, int n) {
  if (n < 0 || n > SM_MAX_LABELS || (n > 0 && !labels))
    return qe_errf(QE_EINVAL, "metrics: %s: %d labels (at most %d)", name, n, SM_MAX_LABELS);
  for (int i = 0; i < n; i++) {
    if (!valid_label_name(labels[i]))
      return qe_errf(QE_EINVAL, "metrics: %s: bad label name \"%s\"", name,
                     labels[i] ? labels[i] : "(null)");
    if (type == SM_HISTOGRAM && !strcmp(labels[i], "le"))
      return qe_errf(QE_EINVAL, "metrics: %s: a histogram cannot have a label \"le\"", name);
    for (int j = 0; j < i; j++)
      if (!strcmp(labels[i], labels[j]))
        return qe_errf(QE_EINVAL, "metrics: %s: label \"%s\" twice", name, labels[i]);
  }
  return 0;
}

static int check_buckets(const char *name, int type, const double *b, int n) {
  if (type != SM_HISTOGRAM) {
    if (b) return qe_errf(QE_EINVAL, "metrics: %s: buckets on a non-histogram", name);
    return 0;
  }
  if (!b) return 0;
  if (n < 1 || n > SM_MAX_BUCKETS)
    return qe_errf(QE_EINVAL, "metrics: %s: %d buckets (1..%d)", name, n, SM_MAX_BUCKETS);
  for (int i = 0; i < n; i++) {
    if (!isfinite(b[i]))
      return qe_errf(QE_EINVAL, "metrics: %s: bucket bounds must be finite", name);
    if (i > 0 && !(b[i] > b[i - 1]))
      return qe_errf(QE_EINVAL, "metrics: %s: buckets must be strictly increasing", name);
  }
  return 0;
}

static int check_family(const char *name, const char *help, int type, const char *const *labels,
                        int n_labels, const double *buckets, int n_buckets) {
  int rc;
  if (!valid_metric_name(name))
    return qe_errf(QE_EINVAL, "metrics: bad metric name \"%s\"", name ? name : "(null)");
  if (strlen(name) > 900) return qe_errf(QE_EINVAL, "metrics: metric name too long");
  if (type != SM_COUNTER && type != SM_GAUGE && type != SM_HISTOGRAM)
    return qe_errf(QE_EINVAL, "metrics: %s: unknown type %d", name, type);
  if (help && !valid_utf8(help))
    return qe_errf(QE_EINVAL, "metrics: %s: help text is not UTF-8", name);
  if ((rc = check_labels(name, type, labels, n_labels))) return rc;
  return check_buckets(name, type, buckets, n_buckets);
}

static void fam_free(sm_fam_t *f) {
  if (!f) return;
  sm_clear(f);
  free(f->tab);
  for (int i = 0; i < f->n_labels; i++) free(f->labels[i]);
  free(f->bounds);
  free(f->help);
  free(f->name);
  free(f);
}

static sm_fam_t *fam_new(const char *name, const char *help, int type, const char *const *labels,
                         int n_labels, const double *buckets, int n_buckets) {
  sm_fam_t *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->type = type;
  f->name = strdup(name);
  f->help = strdup(help ? help : "");
  for (int i = 0; i < n_labels; i++)
    if ((f->labels[f->n_labels++] = strdup(labels[i])) == NULL) goto fail;
  if (type == SM_HISTOGRAM) {
    if (!buckets) buckets = default_buckets, n_buckets = sizeof default_buckets / sizeof(double);
    if (!(f->bounds = malloc(sizeof(double) * (size_t)n_buckets))) goto fail;
    memcpy(f->bounds, buckets, sizeof(double) * (size_t)n_buckets);
    f->n_buckets = n_buckets;
  }
  if (!f->name || !f->help) goto fail;
  return f;
fail:
  fam_free(f);
  return NULL;
}

/* Index where name is or would be inserted in the sorted family array. */
static size_t fam_pos(const sm_reg_t *r, const char *name) {
  size_t lo = 0, hi = r->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(r->fams[mid]->name, name) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int reg_insert(sm_reg_t *r, sm_fam_t *f) {
  size_t pos = fam_pos(r, f->name);
  if (r->n == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 16;
    sm_fam_t **p = realloc(r->fams, cap * sizeof *p);
    if (!p) return qe_errf(QE_ENOMEM, "metrics: families");
    r->fams = p, r->cap = cap;
  }
  memmove(r->fams + pos + 1, r->fams + pos, (r->n - pos) * sizeof *r->fams);
  r->fams[pos] = f;
  r->n++;
  return 0;
}

static int series_get(sm_fam_t *f, const char *const *values, sm_series_t **out);

int sm_family(sm_reg_t *r, const char *name, const char *help, int type, const char *const *labels,
              int n_labels, const double *buckets, int n_buckets, sm_fam_t **out) {
  sm_fam_t *f;
  int rc;
  if (out) *out = NULL;
  if ((rc = check_family(name, help, type, labels, n_labels, buckets, n_buckets))) return rc;
  if (!(f = fam_new(name, help, type, labels, n_labels, buckets, n_buckets)))
    return qe_errf(QE_ENOMEM, "metrics: family %s", name);
  if (name_clash(r, f)) {
    fam_free(f);
    return qe_errf(QE_EINVAL, "metrics: %s clashes with a registered metric name", name);
  }
  if ((rc = reg_insert(r, f))) {
    fam_free(f);
    return rc;
  }
  if (out) *out = f;
  sm_series_t *s; /* an unlabeled counter or histogram is there at 0 from the start, so that
                     rate() and increase() see its first increment (a gauge is set when read) */
  return n_labels || type == SM_GAUGE ? 0 : series_get(f, NULL, &s);
}

int sm_create(sm_reg_t **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : qe_errf(QE_ENOMEM, "metrics: registry");
}

void sm_destroy(sm_reg_t *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n; i++) fam_free(r->fams[i]);
  free(r->fams);
  free(r);
}

/* ---- series ------------------------------------------------------------------------------- */

/* FNV-1a over the values, each with its NUL; *key_len gets the key's length. QE_EINVAL for a
 * missing value. */
static int key_hash(const sm_fam_t *f, const char *const *values, uint64_t *hash, size_t *key_len) {
  uint64_t h = 1469598103934665603ull;
  size_t len = 0;
  if (f->n_labels > 0 && !values)
    return qe_errf(QE_EINVAL, "metrics: %s: no label values", f->name);
  for (int i = 0; i < f->n_labels; i++) {
    const unsigned char *p = (const unsigned char *)values[i];
    if (!p) return qe_errf(QE_EINVAL, "metrics: %s: NULL label value", f->name);
    do {
      h = (h ^ *p) * 1099511628211ull;
      len++;
    } while (*p++);
  }
  *hash = h, *key_len = len;
  return 0;
}

static int key_equal(const sm_series_t *s, const char *const *values, int n) {
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    size_t l = strlen(values[i]) + 1;
    if (off + l > s->key_len || memcmp(s->key + off, values[i], l)) return 0;
    off += l;
  }
  return off == s->key_len;
}

/* The chain slot holding the series for values (or the NULL slot at the chain's end). */
static sm_series_t **series_slot(sm_fam_t *f, const char *const *values, uint64_t h,
                                 size_t key_len) {
  sm_series_t **p = &f->tab[h & (f->cap - 1)];
  for (; *p; p = &(*p)->next)
    if ((*p)->hash == h && (*p)->key_len == key_len && key_equal(*p, values, f->n_labels)) break;
  return p;
}

static int grow_table(sm_fam_t *f) {
  size_t cap = f->cap ? f->cap * 2 : 16;
  sm_series_t **tab = calloc(cap, sizeof *tab);
  if (!tab) return qe_errf(QE_ENOMEM, "metrics: %s: series table", f->name);
  for (size_t i = 0; i < f->cap; i++) {
    sm_series_t *s = f->tab[i], *next;
    for (; s; s = next) {
      next = s->next;
      s->next = tab[s->hash & (cap - 1)];
      tab[s->hash & (cap - 1)] = s;
    }
  }
  free(f->tab);
  f->tab = tab, f->cap = cap;
  return 0;
}

static int series_new(const sm_fam_t *f, const char *const *values, uint64_t h, size_t key_len,
                      sm_series_t **out) {
  size_t key_room = (key_len + 7) & ~(size_t)7, off = 0;
  sm_series_t *s;
  for (int i = 0; i < f->n_labels; i++)
    if (!valid_utf8(values[i]))
      return qe_errf(QE_EINVAL, "metrics: %s: label %s: value is not UTF-8", f->name, f->labels[i]);
  s = calloc(1, sizeof *s + key_room + sizeof(uint64_t) * (size_t)f->n_buckets);
  if (!s) return qe_errf(QE_ENOMEM, "metrics: %s: series", f->name);
  s->hash = h, s->key_len = key_len;
  for (int i = 0; i < f->n_labels; i++) {
    size_t l = strlen(values[i]) + 1;
    memcpy(s->key + off, values[i], l);
    off += l;
  }
  if (f->n_buckets) s->buckets = (uint64_t *)(void *)(s->key + key_room);
  *out = s;
  return 0;
}

/* Finds or creates the series for values. */
static int series_get(sm_fam_t *f, const char *const *values, sm_series_t **out) {
  uint64_t h = 0;
  size_t key_len = 0;
  sm_series_t **slot;
  int rc;
  if ((rc = key_hash(f, values, &h, &key_len))) return rc;
  if (f->n >= f->cap && (rc = grow_table(f))) return rc;
  slot = series_slot(f, values, h, key_len);
  if (!*slot) {
    if ((rc = series_new(f, values, h, key_len, slot))) return rc;
    f->n++;
  }
  *out = *slot;
  return 0;
}

static int wrong_type(const sm_fam_t *f, const char *op) {
  static const char *const names[] = {"counter", "gauge", "histogram"};
  return qe_errf(QE_EINVAL, "metrics: %s on %s %s", op, names[f->type], f->name);
}

int sm_add(sm_fam_t *f, const char *const *values, double v) {
  sm_series_t *s;
  int rc;
  if (f->type == SM_HISTOGRAM) return wrong_type(f, "add");
  if (isnan(v) || (f->type == SM_COUNTER && v < 0))
    return qe_errf(QE_EINVAL, "metrics: %s: cannot add %g", f->name, v);
  if ((rc = series_get(f, values, &s))) return rc;
  s->value += v;
  return 0;
}

int sm_set(sm_fam_t *f, const char *const *values, double v) {
  sm_series_t *s;
  int rc;
  if (f->type != SM_GAUGE) return wrong_type(f, "set");
  if ((rc = series_get(f, values, &s))) return rc;
  s->value = v;
  return 0;
}

int sm_observe(sm_fam_t *f, const char *const *values, double v) {
  sm_series_t *s;
  int rc, lo = 0, hi;
  if (f->type != SM_HISTOGRAM) return wrong_type(f, "observe");
  if (isnan(v)) return qe_errf(QE_EINVAL, "metrics: %s: cannot observe NaN", f->name);
  if ((rc = series_get(f, values, &s))) return rc;
  hi = f->n_buckets; /* first bucket whose bound >= v; n_buckets: only +Inf */
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (f->bounds[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < f->n_buckets) s->buckets[lo]++;
  s->count++;
  s->value += v;
  return 0;
}

int sm_remove(sm_fam_t *f, const char *const *values) {
  uint64_t h = 0;
  size_t key_len = 0;
  sm_series_t **slot, *s;
  int rc;
  if ((rc = key_hash(f, values, &h, &key_len))) return rc;
  if (!f->cap || !*(slot = series_slot(f, values, h, key_len)))
    return qe_errf(QE_ENOTFOUND, "metrics: %s: no such series", f->name);
  s = *slot;
  *slot = s->next;
  free(s);
  f->n--;
  return 0;
}

void sm_clear(sm_fam_t *f) {
  for (size_t i = 0; i < f->cap; i++) {
    sm_series_t *s = f->tab[i], *next;
    for (; s; s = next) {
      next = s->next;
      free(s);
    }
    f->tab[i] = NULL;
  }
  f->n = 0;
}

size_t sm_series_count(const sm_fam_t *f) { return f->n; }

/* ---- rendering ---------------------------------------------------------------------------- */

typedef struct {
  char *p;
  size_t n, cap;
  int oom;
} sm_buf_t;

static void put(sm_buf_t *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    char *p;
    while (cap < b->n + n + 1) cap *= 2;
    if (!(p = realloc(b->p, cap))) {
      b->oom = 1;
      return;
    }
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void puts_(sm_buf_t *b, const char *s) { put(b, s, strlen(s)); }

/* s with \ and newline escaped, and " too when quote is set. */
static void put_escaped(sm_buf_t *b, const char *s, int quote) {
  const char *run = s;
  for (; *s; s++) {
    const char *esc = *s == '\\' ? "\\\\" : *s == '\n' ? "\\n" : (quote && *s == '"') ? "\\\"" : 0;
    if (!esc) continue;
    put(b, run, (size_t)(s - run));
    puts_(b, esc);
    run = s + 1;
  }
  put(b, run, (size_t)(s - run));
}

/* The shortest of %.15g..%.17g that reads back as v; NaN, +Inf, -Inf as Prometheus spells them. */
static void fmt_double(double v, char out[32]) {
  if (isnan(v)) {
    strcpy(out, "NaN");
  } else if (isinf(v)) {
    strcpy(out, v > 0 ? "+Inf" : "-Inf");
  } else {
    for (int prec = 15; prec <= 17; prec++) {
      snprintf(out, 32, "%.*g", prec, v);
      if (strtod(out, NULL) == v) break;
    }
  }
}

static void put_double(sm_buf_t *b, double v) {
  char s[32];
  fmt_double(v, s);
  puts_(b, s);
}

static void put_u64(sm_buf_t *b, uint64_t v) {
  char s[24];
  snprintf(s, sizeof s, "%llu", (unsigned long long)v);
  puts_(b, s);
}

/* {a="x",b="y"[,le="<le>"]}, nothing when there is no label at all. */
static void put_labels(sm_buf_t *b, const sm_fam_t *f, const sm_series_t *s, const char *le) {
  const char *v = s->key;
  if (f->n_labels == 0 && !le) return;
  puts_(b, "{");
  for (int i = 0; i < f->n_labels; i++) {
    if (i) puts_(b, ",");
    puts_(b, f->labels[i]);
    puts_(b, "=\"");
    put_escaped(b, v, 1);
    puts_(b, "\"");
    v += strlen(v) + 1;
  }
  if (le) {
    if (f->n_labels) puts_(b, ",");
    puts_(b, "le=\"");
    puts_(b, le);
    puts_(b, "\"");
  }
  puts_(b, "}");
}

static void put_sample_head(sm_buf_t *b, const sm_fam_t *f, const char *suffix,
                            const sm_series_t *s, const char *le) {
  puts_(b, f->name);
  puts_(b, suffix);
  put_labels(b, f, s, le);
  puts_(b, " ");
}

static void put_histogram(sm_buf_t *b, const sm_fam_t *f, const sm_series_t *s) {
  uint64_t cum = 0;
  char le[32];
  for (int i = 0; i < f->n_buckets; i++) {
    cum += s->buckets[i];
    fmt_double(f->bounds[i], le);
    put_sample_head(b, f, "_bucket", s, le);
    put_u64(b, cum);
    puts_(b, "\n");
  }
  put_sample_head(b, f, "_bucket", s, "+Inf");
  put_u64(b, s->count);
  puts_(b, "\n");
  put_sample_head(b, f, "_sum", s, NULL);
  put_double(b, s->value);
  puts_(b, "\n");
  put_sample_head(b, f, "_count", s, NULL);
  put_u64(b, s->count);
  puts_(b, "\n");
}

static int series_cmp(const void *pa, const void *pb) {
  const sm_series_t *a = *(const sm_series_t *const *)pa, *b = *(const sm_series_t *const *)pb;
  size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
  int c = memcmp(a->key, b->key, n);
  return c ? c : (a->key_len > b->key_len) - (a->key_len < b->key_len);
}

static void put_family(sm_buf_t *b, const sm_fam_t *f, const sm_series_t **sorted) {
  static const char *const types[] = {"counter", "gauge", "histogram"};
  size_t k = 0;
  for (size_t i = 0; i < f->cap; i++)
    for (const sm_series_t *s = f->tab[i]; s; s = s->next) sorted[k++] = s;
  qsort(sorted, k, sizeof *sorted, series_cmp);
  if (f->help[0]) {
    puts_(b, "# HELP ");
    puts_(b, f->name);
    puts_(b, " ");
    put_escaped(b, f->help, 0);
    puts_(b, "\n");
  }
  puts_(b, "# TYPE ");
  puts_(b, f->name);
  puts_(b, " ");
  puts_(b, types[f->type]);
  puts_(b, "\n");
  for (size_t i = 0; i < k; i++) {
    if (f->type == SM_HISTOGRAM) {
      put_histogram(b, f, sorted[i]);
      continue;
    }
    put_sample_head(b, f, "", sorted[i], NULL);
    put_double(b, sorted[i]->value);
    puts_(b, "\n");
  }
}

int sm_render(const sm_reg_t *r, char **out, size_t *len) {
  sm_buf_t b = {0};
  const sm_series_t **sorted;
  size_t most = 1;
  *out = NULL, *len = 0;
  for (size_t i = 0; i < r->n; i++)
    if (r->fams[i]->n > most) most = r->fams[i]->n;
  if (!(sorted = malloc(most * sizeof *sorted))) return qe_errf(QE_ENOMEM, "metrics: render");
  put(&b, "", 0);
  for (size_t i = 0; i < r->n; i++)
    if (r->fams[i]->n) put_family(&b, r->fams[i], sorted);
  free(sorted);
  if (b.oom) {
    free(b.p);
    return qe_errf(QE_ENOMEM, "metrics: render");
  }
  *out = b.p, *len = b.n;
  return 0;
}
