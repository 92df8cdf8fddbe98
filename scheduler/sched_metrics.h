/* sched_metrics: the scheduler's Prometheus metrics registry, rendered in the text exposition
 * format 0.0.4 (served on GET /metrics by sched_http). A registry holds metric families
 * (counter, gauge, histogram); each family fixes its label names, and a series (one set of
 * label values) is created the first time it is used. Series are found through a hash table,
 * so thousands of them cost no more per update than a few. Rendering sorts families by name
 * and series by their label values (byte order, label by label), so the output is stable.
 *
 * Names: a family name matches [a-zA-Z_:][a-zA-Z0-9_:]*; a label name [a-zA-Z_][a-zA-Z0-9_]*,
 * not starting with "__" (reserved by Prometheus), not "le" in a histogram, no duplicates. Label
 * values and help text are any valid UTF-8 (escaped when rendered). Samples are doubles;
 * histogram bucket counts are integers. promtool's lint rules (counter names ending in _total,
 * base units) are the caller's to follow.
 *
 * Threading: none; the scheduler's loop thread owns a registry and everything in it. */
#ifndef QE_SCHED_METRICS_H
#define QE_SCHED_METRICS_H

#include <stddef.h>

typedef struct sm_reg sm_reg_t;
typedef struct sm_fam sm_fam_t;

enum { SM_COUNTER, SM_GAUGE, SM_HISTOGRAM };

#define SM_MAX_LABELS  16  /* label names per family */
#define SM_MAX_BUCKETS 128 /* histogram buckets (the +Inf bucket is implied) */

/* A new, empty registry; *out is owned by the caller (sm_destroy). QE_ENOMEM. */
int sm_create(sm_reg_t **out);
/* Frees the registry with its families and series; NULL is allowed. Family handles die too. */
void sm_destroy(sm_reg_t *r);

/* Adds a family. name: the metric name (unique in the registry, and for histograms its
 * _bucket/_sum/_count names may not clash with another family's names either); help: one
 * line of text (NULL or "": no # HELP line); type: SM_COUNTER, SM_GAUGE or SM_HISTOGRAM;
 * labels: n_labels (0..SM_MAX_LABELS) label names (may be NULL when n_labels is 0), copied.
 * Histograms: buckets are n_buckets (1..SM_MAX_BUCKETS) finite, strictly increasing upper
 * bounds, copied; NULL (n_buckets ignored) gives the Prometheus defaults .005 .01 .025 .05 .1
 * .25 .5 1 2.5 5 10. Other types must pass NULL. *out (optional) is the family's handle, owned
 * by the registry and valid until sm_destroy. QE_EINVAL (detail names what is wrong),
 * QE_ENOMEM. */
int sm_family(sm_reg_t *r, const char *name, const char *help, int type, const char *const *labels,
              int n_labels, const double *buckets, int n_buckets, sm_fam_t **out);

/* values: one label value per label name of the family, in the same order (NULL when the family
 * has no labels); a series is created on first use. Each returns QE_EINVAL for the wrong family
 * type, a NULL or non-UTF-8 value, or a bad sample (below); QE_ENOMEM; on error nothing
 * changes. */

/* Counter: adds v (>= 0, not NaN). Gauge: adds v (any finite or infinite value). */
int sm_add(sm_fam_t *f, const char *const *values, double v);
/* Gauge: sets the series to v (NaN and infinities allowed). */
int sm_set(sm_fam_t *f, const char *const *values, double v);
/* Histogram: counts v (not NaN) in every bucket whose bound is >= v and adds it to the sum. */
int sm_observe(sm_fam_t *f, const char *const *values, double v);
/* Drops one series (e.g. a deleted tenant's); QE_ENOTFOUND when it does not exist. */
int sm_remove(sm_fam_t *f, const char *const *values);
/* Drops every series of the family (gauges rebuilt at each scrape). */
void sm_clear(sm_fam_t *f);
/* Number of series in the family. */
size_t sm_series_count(const sm_fam_t *f);

/* Renders every family that has at least one series as Prometheus text (0.0.4): # HELP and
 * # TYPE lines, then the samples; histograms as cumulative name_bucket{...,le="..."} lines
 * ending with le="+Inf", then name_sum and name_count. Numbers are written so that they read
 * back to the same double ("0.005", "1e+21", "NaN", "+Inf", "-Inf"). *out is malloc'd and
 * NUL-terminated (the caller frees it), *len its length without the NUL. QE_ENOMEM. */
int sm_render(const sm_reg_t *r, char **out, size_t *len);

#endif
