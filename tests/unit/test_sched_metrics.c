/* test_sched_metrics: the Prometheus registry (scheduler/sched_metrics.h). Exact renderings of
 * small registries (HELP/TYPE lines, label order, family and series order), escaping of label
 * values and help text, cumulative histogram buckets (custom and default bounds), number
 * formatting that reads back exactly, refused names, labels, buckets and samples (QE_EINVAL,
 * nothing changed), removal and clearing, thousands of series checked against a mirror after
 * random updates, and, when promtool is on PATH, `promtool check metrics` over a populated
 * registry with odd label values (and over a broken exposition, which it must refuse). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qe_status.h"
#include "sched_metrics.h"
#include "test_util.h"

#define V(...) ((const char *const[]){__VA_ARGS__})

static char *render(const sm_reg_t *r) {
  char *s = NULL;
  size_t len = 0;
  CHECK_OK(sm_render(r, &s, &len));
  CHECK(s && strlen(s) == len);
  return s;
}

/* The rendering is exactly want (printed on a mismatch). */
static int renders(const sm_reg_t *r, const char *want) {
  char *got = render(r);
  int ok = got && !strcmp(got, want);
  if (!ok) fprintf(stderr, "  want:\n%s  got:\n%s", want, got ? got : "(null)\n");
  free(got);
  return ok;
}

static void test_basic(void) {
  sm_reg_t *r;
  sm_fam_t *req, *run, *empty;
  CHECK_OK(sm_create(&r));
  CHECK(renders(r, ""));
  CHECK_OK(sm_family(r, "qevict_requests_total", "Requests seen.", SM_COUNTER, V("tenant", "kind"),
                     2, NULL, 0, &req));
  CHECK_OK(sm_family(r, "qevict_running", "", SM_GAUGE, NULL, 0, NULL, 0, &run));
  CHECK_OK(sm_family(r, "qevict_aaa_empty", "never used", SM_GAUGE, NULL, 0, NULL, 0, &empty));
  CHECK_OK(sm_family(r, "qevict_tokens_total", "", SM_COUNTER, NULL, 0, NULL, 0, NULL));
  CHECK_OK(sm_add(req, V("b", "x"), 1));
  CHECK_OK(sm_add(req, V("a", "y"), 2));
  CHECK_OK(sm_add(req, V("a", "x"), 0.5));
  CHECK_OK(sm_add(req, V("b", "x"), 2));
  CHECK_OK(sm_add(req, V("ab", ""), 1));
  CHECK_OK(sm_set(run, NULL, 7));
  CHECK_OK(sm_add(run, NULL, -2));
  CHECK(sm_series_count(req) == 4 && sm_series_count(run) == 1 && sm_series_count(empty) == 0);
  CHECK(renders(r, "# HELP qevict_requests_total Requests seen.\n"
                   "# TYPE qevict_requests_total counter\n"
                   "qevict_requests_total{tenant=\"a\",kind=\"x\"} 0.5\n"
                   "qevict_requests_total{tenant=\"a\",kind=\"y\"} 2\n"
                   "qevict_requests_total{tenant=\"ab\",kind=\"\"} 1\n"
                   "qevict_requests_total{tenant=\"b\",kind=\"x\"} 3\n"
                   "# TYPE qevict_running gauge\n"
                   "qevict_running 5\n"
                   "# TYPE qevict_tokens_total counter\n" /* unlabeled, never added to: 0 */
                   "qevict_tokens_total 0\n"));
  sm_destroy(r);
  sm_destroy(NULL);
}

static void test_escaping(void) {
  sm_reg_t *r;
  sm_fam_t *g;
  CHECK_OK(sm_create(&r));
  CHECK_OK(
      sm_family(r, "esc", "back\\slash and\nnewline \"quoted\"", SM_GAUGE, V("v"), 1, NULL, 0, &g));
  CHECK_OK(sm_set(g, V("a\"b\\c\nd"), 1));
  CHECK_OK(sm_set(g, V("caf\xc3\xa9 \xf0\x9f\x98\x80 {x=1}, #"), 2));
  CHECK(renders(r, "# HELP esc back\\\\slash and\\nnewline \"quoted\"\n"
                   "# TYPE esc gauge\n"
                   "esc{v=\"a\\\"b\\\\c\\nd\"} 1\n"
                   "esc{v=\"caf\xc3\xa9 \xf0\x9f\x98\x80 {x=1}, #\"} 2\n"));
  sm_destroy(r);
}

static void test_histogram(void) {
  static const double b[] = {1, 2, 5};
  static const double obs[] = {0.5, 1, 1.5, 3, 10, -4};
  sm_reg_t *r;
  sm_fam_t *h, *d;
  char *s;
  CHECK_OK(sm_create(&r));
  CHECK_OK(sm_family(r, "lat_seconds", "Latency.", SM_HISTOGRAM, V("op"), 1, b, 3, &h));
  for (int i = 0; i < 6; i++) CHECK_OK(sm_observe(h, V("get"), obs[i]));
  CHECK_OK(sm_observe(h, V("put"), INFINITY));
  CHECK(renders(r, "# HELP lat_seconds Latency.\n"
                   "# TYPE lat_seconds histogram\n"
                   "lat_seconds_bucket{op=\"get\",le=\"1\"} 3\n"
                   "lat_seconds_bucket{op=\"get\",le=\"2\"} 4\n"
                   "lat_seconds_bucket{op=\"get\",le=\"5\"} 5\n"
                   "lat_seconds_bucket{op=\"get\",le=\"+Inf\"} 6\n"
                   "lat_seconds_sum{op=\"get\"} 12\n"
                   "lat_seconds_count{op=\"get\"} 6\n"
                   "lat_seconds_bucket{op=\"put\",le=\"1\"} 0\n"
                   "lat_seconds_bucket{op=\"put\",le=\"2\"} 0\n"
                   "lat_seconds_bucket{op=\"put\",le=\"5\"} 0\n"
                   "lat_seconds_bucket{op=\"put\",le=\"+Inf\"} 1\n"
                   "lat_seconds_sum{op=\"put\"} +Inf\n"
                   "lat_seconds_count{op=\"put\"} 1\n"));
  CHECK_OK(sm_family(r, "def_seconds", "", SM_HISTOGRAM, NULL, 0, NULL, 0, &d));
  CHECK_OK(sm_observe(d, NULL, 0.07));
  s = render(r);
  CHECK(s && strstr(s, "# TYPE def_seconds histogram\n"
                       "def_seconds_bucket{le=\"0.005\"} 0\n"
                       "def_seconds_bucket{le=\"0.01\"} 0\n"
                       "def_seconds_bucket{le=\"0.025\"} 0\n"
                       "def_seconds_bucket{le=\"0.05\"} 0\n"
                       "def_seconds_bucket{le=\"0.1\"} 1\n"
                       "def_seconds_bucket{le=\"0.25\"} 1\n"
                       "def_seconds_bucket{le=\"0.5\"} 1\n"
                       "def_seconds_bucket{le=\"1\"} 1\n"
                       "def_seconds_bucket{le=\"2.5\"} 1\n"
                       "def_seconds_bucket{le=\"5\"} 1\n"
                       "def_seconds_bucket{le=\"10\"} 1\n"
                       "def_seconds_bucket{le=\"+Inf\"} 1\n"
                       "def_seconds_sum 0.07\n"
                       "def_seconds_count 1\n"));
  CHECK(s && strstr(s, "def_seconds") < strstr(s, "lat_seconds")); /* families by name */
  free(s);
  sm_destroy(r);
}

/* Each value renders as text and reads back as the same double. */
static void test_numbers(void) {
  static const double vals[] = {0.1,  1e21,  -0.5,   1.0 / 3, 123456789012.0,        5e-324,
                                1e-7, 0.005, 2.5e15, -0.0,    1.7976931348623157e308};
  static const char *const want[] = {
      "0.1", "1e+21", "-0.5", NULL, "123456789012", NULL, "1e-07", "0.005", "2.5e+15", "-0", NULL};
  sm_reg_t *r;
  sm_fam_t *g;
  char name[16], *s, *line;
  CHECK_OK(sm_create(&r));
  CHECK_OK(sm_family(r, "num", "", SM_GAUGE, V("i"), 1, NULL, 0, &g));
  for (int i = 0; i < 11; i++) {
    snprintf(name, sizeof name, "%02d", i);
    CHECK_OK(sm_set(g, V(name), vals[i]));
  }
  CHECK_OK(sm_set(g, V("nan"), NAN));
  CHECK_OK(sm_set(g, V("pinf"), INFINITY));
  CHECK_OK(sm_set(g, V("ninf"), -INFINITY));
  s = render(r);
  for (int i = 0; s && i < 11; i++) {
    char key[32];
    snprintf(key, sizeof key, "num{i=\"%02d\"} ", i);
    CHECK((line = strstr(s, key)) != NULL);
    if (!line) continue;
    line += strlen(key);
    CHECK(strtod(line, NULL) == vals[i] && signbit(strtod(line, NULL)) == signbit(vals[i]));
    if (want[i]) CHECK(!strncmp(line, want[i], strlen(want[i])) && line[strlen(want[i])] == '\n');
  }
  CHECK(s && strstr(s, "num{i=\"nan\"} NaN\n") && strstr(s, "num{i=\"pinf\"} +Inf\n") &&
        strstr(s, "num{i=\"ninf\"} -Inf\n"));
  free(s);
  sm_destroy(r);
}

static int fam(sm_reg_t *r, const char *name, int type, const char *const *labels, int n,
               const double *b, int nb) {
  return sm_family(r, name, "h", type, labels, n, b, nb, NULL);
}

static void test_bad_families(sm_reg_t *r) {
  static const double down[] = {1, 1}, nan_b[] = {1, NAN}, inf_b[] = {1, INFINITY}, ok[] = {1};
  const char *many[SM_MAX_LABELS + 1];
  for (int i = 0; i <= SM_MAX_LABELS; i++) many[i] = "l";
  CHECK(fam(r, "", SM_GAUGE, NULL, 0, NULL, 0) == QE_EINVAL && strstr(qe_errmsg(), "name"));
  CHECK(fam(r, NULL, SM_GAUGE, NULL, 0, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "1abc", SM_GAUGE, NULL, 0, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "a-b", SM_GAUGE, NULL, 0, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "a b", SM_GAUGE, NULL, 0, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "x", 7, NULL, 0, NULL, 0) == QE_EINVAL && strstr(qe_errmsg(), "type"));
  CHECK(fam(r, "x", SM_GAUGE, V("__x"), 1, NULL, 0) == QE_EINVAL && strstr(qe_errmsg(), "label"));
  CHECK(fam(r, "x", SM_GAUGE, V("1a"), 1, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "x", SM_GAUGE, V("a:b"), 1, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "x", SM_GAUGE, V("a", NULL), 2, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "x", SM_GAUGE, V("a", "a"), 2, NULL, 0) == QE_EINVAL &&
        strstr(qe_errmsg(), "twice"));
  CHECK(fam(r, "x", SM_GAUGE, NULL, 1, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "x", SM_GAUGE, many, SM_MAX_LABELS + 1, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "x", SM_HISTOGRAM, V("le"), 1, NULL, 0) == QE_EINVAL && strstr(qe_errmsg(), "le"));
  CHECK(fam(r, "x", SM_HISTOGRAM, NULL, 0, down, 2) == QE_EINVAL && strstr(qe_errmsg(), "incr"));
  CHECK(fam(r, "x", SM_HISTOGRAM, NULL, 0, nan_b, 2) == QE_EINVAL);
  CHECK(fam(r, "x", SM_HISTOGRAM, NULL, 0, inf_b, 2) == QE_EINVAL);
  CHECK(fam(r, "x", SM_HISTOGRAM, NULL, 0, ok, 0) == QE_EINVAL);
  CHECK(fam(r, "x", SM_COUNTER, NULL, 0, ok, 1) == QE_EINVAL && strstr(qe_errmsg(), "bucket"));
  CHECK(sm_family(r, "x", "bad \xff utf-8", SM_GAUGE, NULL, 0, NULL, 0, NULL) == QE_EINVAL);
  /* names in use, including a histogram's derived names */
  CHECK_OK(fam(r, "h_seconds", SM_HISTOGRAM, NULL, 0, ok, 1));
  CHECK_OK(fam(r, "g", SM_GAUGE, NULL, 0, NULL, 0));
  CHECK(fam(r, "g", SM_COUNTER, NULL, 0, NULL, 0) == QE_EINVAL && strstr(qe_errmsg(), "clash"));
  CHECK(fam(r, "h_seconds_count", SM_GAUGE, NULL, 0, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "h_seconds_bucket", SM_GAUGE, NULL, 0, NULL, 0) == QE_EINVAL);
  CHECK(fam(r, "g_sum", SM_GAUGE, NULL, 0, NULL, 0) == 0);         /* g is no histogram */
  CHECK(fam(r, "g", SM_HISTOGRAM, NULL, 0, NULL, 0) == QE_EINVAL); /* g_sum is taken too */
  CHECK(fam(r, "k", SM_HISTOGRAM, NULL, 0, NULL, 0) == 0);
  CHECK(fam(r, "k_sum", SM_COUNTER, NULL, 0, NULL, 0) == QE_EINVAL); /* k's _sum */
  CHECK(fam(r, "k_summary", SM_HISTOGRAM, NULL, 0, NULL, 0) == 0);
  CHECK_OK(fam(r, "a:b_c", SM_GAUGE, V("_x", "Y9"), 2, NULL, 0)); /* odd but valid names */
}

static void test_bad_samples(sm_reg_t *r) {
  sm_fam_t *c, *g, *h;
  char *before, *after;
  CHECK_OK(sm_family(r, "c_total", "", SM_COUNTER, V("t"), 1, NULL, 0, &c));
  CHECK_OK(sm_family(r, "gg", "", SM_GAUGE, V("t"), 1, NULL, 0, &g));
  CHECK_OK(sm_family(r, "hh", "", SM_HISTOGRAM, V("t"), 1, NULL, 0, &h));
  CHECK_OK(sm_add(c, V("a"), 1));
  before = render(r);
  CHECK(sm_add(c, V("a"), -1) == QE_EINVAL);
  CHECK(sm_add(c, V("a"), NAN) == QE_EINVAL);
  CHECK(sm_add(g, V("a"), NAN) == QE_EINVAL);
  CHECK(sm_set(c, V("a"), 3) == QE_EINVAL && strstr(qe_errmsg(), "counter"));
  CHECK(sm_add(h, V("a"), 3) == QE_EINVAL);
  CHECK(sm_observe(g, V("a"), 3) == QE_EINVAL);
  CHECK(sm_observe(h, V("a"), NAN) == QE_EINVAL);
  CHECK(sm_add(c, NULL, 1) == QE_EINVAL);
  CHECK(sm_add(c, V(NULL), 1) == QE_EINVAL);
  CHECK(sm_add(c, V("bad \xc3\x28"), 1) == QE_EINVAL && strstr(qe_errmsg(), "UTF-8"));
  CHECK(sm_set(g, V("\xed\xa0\x80"), 1) == QE_EINVAL); /* a UTF-16 surrogate */
  CHECK(sm_set(g, V("\xc0\xaf"), 1) == QE_EINVAL);     /* overlong */
  CHECK(sm_remove(c, V("zz")) == QE_ENOTFOUND);
  CHECK(sm_remove(g, V("a")) == QE_ENOTFOUND);
  after = render(r);
  CHECK(before && after && !strcmp(before, after)); /* nothing changed */
  CHECK(sm_series_count(c) == 1 && sm_series_count(g) == 0 && sm_series_count(h) == 0);
  free(before);
  free(after);
}

static void test_bad(void) {
  sm_reg_t *r;
  CHECK_OK(sm_create(&r));
  test_bad_families(r);
  sm_destroy(r);
  CHECK_OK(sm_create(&r));
  test_bad_samples(r);
  sm_destroy(r);
}

static void test_remove(void) {
  sm_reg_t *r;
  sm_fam_t *g, *h;
  CHECK_OK(sm_create(&r));
  CHECK_OK(sm_family(r, "tenant_bytes", "", SM_GAUGE, V("tenant", "tier"), 2, NULL, 0, &g));
  CHECK_OK(sm_family(r, "w_seconds", "", SM_HISTOGRAM, V("tenant"), 1, (double[]){1}, 1, &h));
  CHECK_OK(sm_set(g, V("a", "full"), 10));
  CHECK_OK(sm_set(g, V("a", "int2"), 2));
  CHECK_OK(sm_set(g, V("b", "full"), 5));
  CHECK_OK(sm_observe(h, V("a"), 0.5));
  CHECK_OK(sm_observe(h, V("b"), 2));
  CHECK_OK(sm_remove(g, V("a", "int2")));
  CHECK(sm_remove(g, V("a", "int2")) == QE_ENOTFOUND);
  CHECK_OK(sm_remove(h, V("a")));
  CHECK(renders(r, "# TYPE tenant_bytes gauge\n"
                   "tenant_bytes{tenant=\"a\",tier=\"full\"} 10\n"
                   "tenant_bytes{tenant=\"b\",tier=\"full\"} 5\n"
                   "# TYPE w_seconds histogram\n"
                   "w_seconds_bucket{tenant=\"b\",le=\"1\"} 0\n"
                   "w_seconds_bucket{tenant=\"b\",le=\"+Inf\"} 1\n"
                   "w_seconds_sum{tenant=\"b\"} 2\n"
                   "w_seconds_count{tenant=\"b\"} 1\n"));
  sm_clear(g);
  sm_clear(g);
  CHECK(sm_series_count(g) == 0);
  CHECK_OK(sm_observe(h, V("a"), 0.25)); /* a removed series starts again from zero */
  CHECK_OK(sm_set(g, V("c", "full"), 1));
  CHECK(renders(r, "# TYPE tenant_bytes gauge\n"
                   "tenant_bytes{tenant=\"c\",tier=\"full\"} 1\n"
                   "# TYPE w_seconds histogram\n"
                   "w_seconds_bucket{tenant=\"a\",le=\"1\"} 1\n"
                   "w_seconds_bucket{tenant=\"a\",le=\"+Inf\"} 1\n"
                   "w_seconds_sum{tenant=\"a\"} 0.25\n"
                   "w_seconds_count{tenant=\"a\"} 1\n"
                   "w_seconds_bucket{tenant=\"b\",le=\"1\"} 0\n"
                   "w_seconds_bucket{tenant=\"b\",le=\"+Inf\"} 1\n"
                   "w_seconds_sum{tenant=\"b\"} 2\n"
                   "w_seconds_count{tenant=\"b\"} 1\n"));
  sm_destroy(r);
}

/* ---- many series against a mirror ------------------------------------------------------------ */

#define N_KEYS 3000

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* Every line of the rendering is a live key of the mirror with its value, in key order. */
static void check_mirror(const sm_reg_t *r, const double *val, const int *live) {
  char *s = render(r), *p, *nl;
  int n_lines = 0, n_live = 0, prev = -1;
  for (int k = 0; k < N_KEYS; k++) n_live += live[k];
  for (p = s ? strstr(s, "gauge\n") : NULL; p && (p = strchr(p, '\n')) && p[1]; p = nl) {
    int k = -1, used = 0;
    double v;
    nl = strchr(p + 1, '\n');
    if (sscanf(p + 1, "many{k=\"k%d\",j=\"x\"} %lf%n", &k, &v, &used) != 2 || k < 0 ||
        k >= N_KEYS) {
      CHECK(!"unexpected line");
      break;
    }
    CHECK(live[k] && v == val[k] && k > prev);
    prev = k;
    n_lines++;
  }
  CHECK(n_lines == n_live);
  free(s);
}

static void test_many(void) {
  static double val[N_KEYS];
  static int live[N_KEYS];
  uint64_t st = 0x9e3779b97f4a7c15ull;
  sm_reg_t *r;
  sm_fam_t *g;
  char key[16];
  CHECK_OK(sm_create(&r));
  CHECK_OK(sm_family(r, "many", "", SM_GAUGE, V("k", "j"), 2, NULL, 0, &g));
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 20000; i++) {
      int k = (int)(rnd(&st) % N_KEYS), op = (int)(rnd(&st) % 8);
      snprintf(key, sizeof key, "k%04d", k);
      if (op == 0) {
        CHECK(sm_remove(g, V(key, "x")) == (live[k] ? 0 : QE_ENOTFOUND));
        live[k] = 0, val[k] = 0;
      } else {
        double v = (double)(rnd(&st) % 1000) / 4;
        CHECK_OK(op & 1 ? sm_add(g, V(key, "x"), v) : sm_set(g, V(key, "x"), v));
        val[k] = op & 1 ? val[k] + v : v;
        live[k] = 1;
      }
    }
    size_t n_live = 0;
    for (int k = 0; k < N_KEYS; k++) n_live += (size_t)live[k];
    CHECK(sm_series_count(g) == n_live);
    check_mirror(r, val, live);
  }
  sm_destroy(r);
}

/* ---- promtool -------------------------------------------------------------------------------- */

/* Runs `promtool check metrics < path` (its output shown unless quiet); its exit status. */
static int promtool_check(const char *path, int quiet) {
  char cmd[512];
  int st;
  snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' %s", path,
           quiet ? ">/dev/null 2>&1" : "1>&2");
  st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int write_file(const char *path, const char *s) {
  FILE *f = fopen(path, "w");
  int ok = f && fputs(s, f) >= 0;
  if (f) ok = (fclose(f) == 0) && ok;
  return ok;
}

static void populate(sm_reg_t *r) {
  static const char *const odd[] = {"plain",         "",          "q\"uote",
                                    "back\\slash",   "new\nline", "caf\xc3\xa9 \xf0\x9f\x98\x80",
                                    "{a=\"b\"}, #x", "  spaced  "};
  sm_fam_t *fin, *run, *e2e, *tier;
  CHECK_OK(sm_family(r, "qevict_requests_finished_total", "Requests finished, by reason.",
                     SM_COUNTER, V("tenant", "reason"), 2, NULL, 0, &fin));
  CHECK_OK(sm_family(r, "qevict_requests_running", "Requests running now.\nSecond \\ line.",
                     SM_GAUGE, NULL, 0, NULL, 0, &run));
  CHECK_OK(sm_family(r, "qevict_request_e2e_seconds", "End-to-end request time.", SM_HISTOGRAM,
                     V("tenant"), 1, NULL, 0, &e2e));
  CHECK_OK(sm_family(r, "qevict_tenant_bytes", "Tenant KV bytes by tier.", SM_GAUGE,
                     V("tenant", "tier"), 2, NULL, 0, &tier));
  for (int i = 0; i < 8; i++) {
    CHECK_OK(sm_add(fin, V(odd[i], "stop"), i));
    CHECK_OK(sm_add(fin, V(odd[i], "length"), 1e6 * i + 0.25));
    CHECK_OK(sm_observe(e2e, V(odd[i]), 0.001 * i * i));
    CHECK_OK(sm_observe(e2e, V(odd[i]), 30));
    CHECK_OK(sm_set(tier, V(odd[i], "int2"), i % 2 ? NAN : -1.5e300));
  }
  CHECK_OK(sm_set(run, NULL, INFINITY));
}

static void test_promtool(void) {
  char path[] = "/tmp/test_sched_metrics_XXXXXX";
  sm_reg_t *r;
  char *s;
  int fd;
  if (system("command -v promtool >/dev/null 2>&1") != 0) {
    printf("SKIP promtool part: promtool not on PATH (Debian package prometheus)\n");
    return;
  }
  CHECK((fd = mkstemp(path)) >= 0);
  if (fd < 0) return;
  close(fd);
  CHECK_OK(sm_create(&r));
  populate(r);
  s = render(r);
  CHECK(s && strlen(s) > 1000 && write_file(path, s));
  CHECK(promtool_check(path, 0) == 0);
  /* the check can fail: an unescaped quote in a label value is refused */
  CHECK(write_file(path, "# TYPE x gauge\nx{a=\"b\"c\"} 1\n"));
  CHECK(promtool_check(path, 1) != 0);
  unlink(path);
  free(s);
  sm_destroy(r);
}

int main(void) {
  test_basic();
  test_escaping();
  test_histogram();
  test_numbers();
  test_bad();
  test_remove();
  test_many();
  test_promtool();
  return tu_done("sched_metrics");
}
