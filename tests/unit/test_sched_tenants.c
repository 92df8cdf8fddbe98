/* test_sched_tenants: the SQLite tenant store in a temporary directory: CRUD, API keys (verify,
 * reject, rotation revokes the old key, deletion revokes), the admin key, persistence across
 * close/reopen, bad input naming its field (SQL injection attempts included), schema versions,
 * and two handles (and two threads) on one WAL database at once. */
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qe_status.h"
#include "sched_tenants.h"
#include "test_util.h"

static char tmp_dir[256];

static const char *db_path(const char *name) {
  static char buf[4][512];
  static int slot;
  char *p = buf[slot++ & 3];
  snprintf(p, 512, "%s/%s", tmp_dir, name);
  return p;
}

static void rm_db(const char *name) {
  static const char *sfx[] = {"", "-wal", "-shm", "-journal"};
  for (int i = 0; i < 4; i++) {
    char p[600];
    snprintf(p, sizeof p, "%s%s", db_path(name), sfx[i]);
    unlink(p);
  }
}

static sched_tenant_t tenant(const char *id, int64_t quota, int64_t budget, const char *pol) {
  sched_tenant_t t;
  memset(&t, 0, sizeof t);
  snprintf(t.id, sizeof t.id, "%s", id);
  t.kv_quota_bytes = quota;
  t.max_request_budget_bytes = budget;
  snprintf(t.default_policy, sizeof t.default_policy, "%s", pol);
  return t;
}

/* rc == want and the detail line mentions field. */
static int fails_with(int rc, int want, const char *field) {
  if (rc == want && strstr(qe_errmsg(), field)) return 1;
  fprintf(stderr, "  got %d (%s), want %d naming '%s'\n", rc, qe_errmsg(), want, field);
  return 0;
}

static void test_crud(void) {
  sched_tenants_t *ts;
  CHECK_OK(sched_tenants_open(db_path("crud.db"), &ts));
  if (!ts) return;
  char key[SCHED_KEY_STRLEN + 1];
  int created = -1;
  sched_tenant_t t = tenant("acme", 1 << 30, 256 << 20, "qevict+graphkv");
  CHECK_OK(sched_tenants_set(ts, &t, 0, key, &created));
  CHECK(created == 1);
  CHECK(strlen(key) == SCHED_KEY_STRLEN && !strncmp(key, "qk_", 3));
  sched_tenant_t g;
  CHECK_OK(sched_tenants_get(ts, "acme", &g));
  CHECK(!strcmp(g.id, "acme") && g.kv_quota_bytes == 1 << 30);
  CHECK(g.max_request_budget_bytes == 256 << 20 && !strcmp(g.default_policy, "qevict+graphkv"));
  CHECK(g.created_at_ms > 0 && g.updated_at_ms == g.created_at_ms);
  CHECK(!strncmp(g.key_id, key + 3, SCHED_KEY_ID_LEN) && strlen(g.key_id) == SCHED_KEY_ID_LEN);
  usleep(2000);
  t = tenant("acme", 2LL << 30, 0, "");
  CHECK_OK(sched_tenants_set(ts, &t, 0, key, &created));
  CHECK(created == 0 && key[0] == '\0');
  CHECK_OK(sched_tenants_get(ts, "acme", &g));
  CHECK(g.kv_quota_bytes == 2LL << 30 && g.max_request_budget_bytes == 0);
  CHECK(g.default_policy[0] == '\0' && g.updated_at_ms > g.created_at_ms);
  t = tenant("Zeta-2", 100, 100, "full");
  CHECK_OK(sched_tenants_set(ts, &t, 0, key, NULL));
  t = tenant("b_team", 5, 0, "h2o");
  CHECK_OK(sched_tenants_set(ts, &t, 0, key, NULL));
  sched_tenant_t *all;
  size_t n;
  CHECK_OK(sched_tenants_list(ts, &all, &n));
  CHECK(n == 3);
  if (n == 3)
    CHECK(!strcmp(all[0].id, "Zeta-2") && !strcmp(all[1].id, "acme") &&
          !strcmp(all[2].id, "b_team"));
  free(all);
  CHECK_OK(sched_tenants_delete(ts, "Zeta-2"));
  CHECK(fails_with(sched_tenants_get(ts, "Zeta-2", &g), QE_ENOTFOUND, "tenant"));
  CHECK(fails_with(sched_tenants_delete(ts, "Zeta-2"), QE_ENOTFOUND, "tenant"));
  CHECK_OK(sched_tenants_list(ts, &all, &n));
  CHECK(n == 2);
  free(all);
  sched_tenants_close(ts);
}

/* The same key with one hex digit of its secret part (after the key id) changed. */
static void flip_secret(const char *key, char *out) {
  strcpy(out, key);
  out[40] = out[40] == '0' ? '1' : '0';
}

static void test_keys(void) {
  sched_tenants_t *ts;
  CHECK_OK(sched_tenants_open(db_path("keys.db"), &ts));
  if (!ts) return;
  char ka[SCHED_KEY_STRLEN + 1], kb[SCHED_KEY_STRLEN + 1], bad[SCHED_KEY_STRLEN + 8];
  char who[SCHED_TENANT_ID_MAX + 1];
  sched_tenant_t t = tenant("alpha", 1000, 0, "");
  CHECK_OK(sched_tenants_set(ts, &t, 0, ka, NULL));
  t = tenant("beta", 1000, 0, "");
  CHECK_OK(sched_tenants_set(ts, &t, 0, kb, NULL));
  CHECK(strcmp(ka, kb) != 0);
  CHECK_OK(sched_tenants_verify_key(ts, ka, who));
  CHECK(!strcmp(who, "alpha"));
  CHECK_OK(sched_tenants_verify_key(ts, kb, who));
  CHECK(!strcmp(who, "beta"));
  strcpy(bad, ka);
  for (int i = 3; bad[i]; i++)
    if (bad[i] >= 'a') bad[i] = (char)(bad[i] - 32); /* hex digits in upper case still match */
  CHECK_OK(sched_tenants_verify_key(ts, bad, who));
  flip_secret(ka, bad);
  CHECK(fails_with(sched_tenants_verify_key(ts, bad, who), QE_ENOTFOUND, "api key"));
  CHECK(who[0] == '\0');
  strcpy(bad, ka), bad[5] = bad[5] == '0' ? '1' : '0'; /* unknown key id */
  CHECK(fails_with(sched_tenants_verify_key(ts, bad, who), QE_ENOTFOUND, "api key"));
  const char *malformed[] = {
      "",         "qk_",     "qk_xyz",
      "Bearer x", "qk_0123", "qk_zz23456789abcdef0123456789abcdef0123456789abcdef0123456789abcd"};
  for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++)
    CHECK(fails_with(sched_tenants_verify_key(ts, malformed[i], who), QE_EINVAL, "api key"));
  CHECK(fails_with(sched_tenants_verify_key(ts, NULL, who), QE_EINVAL, "api key"));
  snprintf(bad, sizeof bad, "%s0", ka); /* one digit too many */
  CHECK(fails_with(sched_tenants_verify_key(ts, bad, who), QE_EINVAL, "api key"));
  snprintf(bad, sizeof bad, "xk_%s", ka + 3);
  CHECK(fails_with(sched_tenants_verify_key(ts, bad, who), QE_EINVAL, "api key"));

  /* Rotation: the new key works, the old one stops at once; an update without rotation keeps it. */
  char ka2[SCHED_KEY_STRLEN + 1], none[SCHED_KEY_STRLEN + 1];
  t = tenant("alpha", 2000, 0, "");
  CHECK_OK(sched_tenants_set(ts, &t, SCHED_TENANT_ROTATE_KEY, ka2, NULL));
  CHECK(strlen(ka2) == SCHED_KEY_STRLEN && strcmp(ka2, ka) != 0);
  CHECK(fails_with(sched_tenants_verify_key(ts, ka, who), QE_ENOTFOUND, "api key"));
  CHECK_OK(sched_tenants_verify_key(ts, ka2, who));
  CHECK(!strcmp(who, "alpha"));
  CHECK_OK(sched_tenants_set(ts, &t, 0, none, NULL));
  CHECK_OK(sched_tenants_verify_key(ts, ka2, who));
  CHECK(fails_with(sched_tenants_set(ts, &t, SCHED_TENANT_ROTATE_KEY, NULL, NULL), QE_EINVAL,
                   "key_out"));
  CHECK_OK(sched_tenants_verify_key(ts, ka2, who)); /* the refused rotation changed nothing */
  /* Deletion revokes. */
  CHECK_OK(sched_tenants_delete(ts, "beta"));
  CHECK(fails_with(sched_tenants_verify_key(ts, kb, who), QE_ENOTFOUND, "api key"));

  /* Admin key: absent, generated, imported; tenant and admin keys do not cross. */
  int present = -1;
  char adm[SCHED_KEY_STRLEN + 1], adm2[SCHED_KEY_STRLEN + 1];
  CHECK_OK(sched_tenants_has_admin_key(ts, &present));
  CHECK(present == 0);
  CHECK(fails_with(sched_tenants_verify_admin_key(ts, ka2), QE_ENOTFOUND, "admin key"));
  CHECK(fails_with(sched_tenants_set_admin_key(ts, NULL, NULL), QE_EINVAL, "key_out"));
  CHECK_OK(sched_tenants_set_admin_key(ts, NULL, adm));
  CHECK_OK(sched_tenants_has_admin_key(ts, &present));
  CHECK(present == 1 && strlen(adm) == SCHED_KEY_STRLEN);
  CHECK_OK(sched_tenants_verify_admin_key(ts, adm));
  CHECK(fails_with(sched_tenants_verify_admin_key(ts, ka2), QE_ENOTFOUND, "admin key"));
  CHECK(fails_with(sched_tenants_verify_key(ts, adm, who), QE_ENOTFOUND, "api key"));
  flip_secret(adm, bad);
  CHECK(fails_with(sched_tenants_verify_admin_key(ts, bad), QE_ENOTFOUND, "admin key"));
  CHECK(fails_with(sched_tenants_verify_admin_key(ts, "hunter2"), QE_EINVAL, "admin key"));
  const char *imported = "qk_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
  CHECK_OK(sched_tenants_set_admin_key(ts, imported, adm2));
  CHECK(!strcmp(adm2, imported));
  CHECK_OK(sched_tenants_verify_admin_key(ts, imported));
  CHECK(fails_with(sched_tenants_verify_admin_key(ts, adm), QE_ENOTFOUND, "admin key"));
  CHECK(fails_with(sched_tenants_set_admin_key(ts, "qk_short", adm2), QE_EINVAL, "admin key"));
  CHECK_OK(sched_tenants_verify_admin_key(ts, imported));
  sched_tenants_close(ts);
}

static void test_restart(void) {
  const char *path = db_path("restart.db");
  sched_tenants_t *ts;
  char k1[SCHED_KEY_STRLEN + 1], k2[SCHED_KEY_STRLEN + 1], adm[SCHED_KEY_STRLEN + 1];
  char who[SCHED_TENANT_ID_MAX + 1];
  CHECK_OK(sched_tenants_open(path, &ts));
  if (!ts) return;
  sched_tenant_t t1 = tenant("one", 123456789, 1234, "snapkv"), t2 = tenant("two", 7, 7, "");
  CHECK_OK(sched_tenants_set(ts, &t1, 0, k1, NULL));
  CHECK_OK(sched_tenants_set(ts, &t2, 0, k2, NULL));
  CHECK_OK(sched_tenants_set_admin_key(ts, NULL, adm));
  sched_tenants_close(ts);
  struct stat st;
  CHECK(stat(path, &st) == 0 && (st.st_mode & 077) == 0); /* owner-only file */
  for (int round = 0; round < 2; round++) {
    CHECK_OK(sched_tenants_open(path, &ts));
    if (!ts) return;
    sched_tenant_t g;
    CHECK_OK(sched_tenants_get(ts, "one", &g));
    CHECK(g.kv_quota_bytes == 123456789 && g.max_request_budget_bytes == 1234);
    CHECK(!strcmp(g.default_policy, "snapkv"));
    CHECK_OK(sched_tenants_verify_key(ts, k1, who));
    CHECK(!strcmp(who, "one"));
    CHECK_OK(sched_tenants_verify_key(ts, k2, who));
    CHECK(!strcmp(who, "two"));
    CHECK_OK(sched_tenants_verify_admin_key(ts, adm));
    sched_tenant_t *all;
    size_t n;
    CHECK_OK(sched_tenants_list(ts, &all, &n));
    CHECK(n == 2);
    free(all);
    sched_tenants_close(ts);
  }
}

static void test_bad_input(void) {
  sched_tenants_t *ts;
  CHECK_OK(sched_tenants_open(db_path("bad.db"), &ts));
  if (!ts) return;
  char key[SCHED_KEY_STRLEN + 1];
  sched_tenant_t t = tenant("ok", 100, 0, "");
  CHECK_OK(sched_tenants_set(ts, &t, 0, key, NULL));
  const char *bad_ids[] = {"",
                           "a b",
                           "x'; DROP TABLE tenants; --",
                           "ok' OR '1'='1",
                           "a/b",
                           "caf\xc3\xa9",
                           "tab\t",
                           "semi;colon",
                           "quote\"",
                           "%s%n"};
  for (size_t i = 0; i < sizeof bad_ids / sizeof *bad_ids; i++) {
    t = tenant(bad_ids[i], 100, 0, "");
    CHECK(fails_with(sched_tenants_set(ts, &t, 0, key, NULL), QE_EINVAL, "tenant id"));
    sched_tenant_t g;
    CHECK(fails_with(sched_tenants_get(ts, bad_ids[i], &g), QE_EINVAL, "tenant id"));
    CHECK(fails_with(sched_tenants_delete(ts, bad_ids[i]), QE_EINVAL, "tenant id"));
  }
  char long_id[SCHED_TENANT_ID_MAX + 2];
  memset(long_id, 'x', sizeof long_id - 1), long_id[sizeof long_id - 1] = '\0';
  sched_tenant_t g;
  CHECK(fails_with(sched_tenants_get(ts, long_id, &g), QE_EINVAL, "tenant id"));
  CHECK(fails_with(sched_tenants_get(ts, NULL, &g), QE_EINVAL, "tenant id"));
  long_id[SCHED_TENANT_ID_MAX] = '\0'; /* exactly 64: fine */
  t = tenant(long_id, 100, 0, "");
  CHECK_OK(sched_tenants_set(ts, &t, 0, key, NULL));
  memset(t.id, 'y', sizeof t.id); /* no NUL inside the field */
  CHECK(fails_with(sched_tenants_set(ts, &t, 0, key, NULL), QE_EINVAL, "tenant id"));
  CHECK(fails_with(sched_tenants_set(ts, NULL, 0, key, NULL), QE_EINVAL, "tenant"));

  t = tenant("q", 0, 0, "");
  CHECK(fails_with(sched_tenants_set(ts, &t, 0, key, NULL), QE_EINVAL, "kv_quota_bytes"));
  t = tenant("q", -5, 0, "");
  CHECK(fails_with(sched_tenants_set(ts, &t, 0, key, NULL), QE_EINVAL, "kv_quota_bytes"));
  t = tenant("q", 100, -1, "");
  CHECK(fails_with(sched_tenants_set(ts, &t, 0, key, NULL), QE_EINVAL, "max_request_budget_bytes"));
  t = tenant("q", 100, 101, "");
  CHECK(fails_with(sched_tenants_set(ts, &t, 0, key, NULL), QE_EINVAL, "max_request_budget_bytes"));
  t = tenant("q", 100, 0, "qevict'; DROP TABLE tenants;--");
  CHECK(fails_with(sched_tenants_set(ts, &t, 0, key, NULL), QE_EINVAL, "default_policy"));
  t = tenant("q", 100, 0, "QEVICT");
  CHECK(fails_with(sched_tenants_set(ts, &t, 0, key, NULL), QE_EINVAL, "default_policy"));
  t = tenant("q", 100, 0, "");
  memset(t.default_policy, 'a', sizeof t.default_policy);
  CHECK(fails_with(sched_tenants_set(ts, &t, 0, key, NULL), QE_EINVAL, "default_policy"));
  t = tenant("q", 100, 0, "");
  CHECK(fails_with(sched_tenants_set(ts, &t, 0, NULL, NULL), QE_EINVAL, "key_out"));
  CHECK(fails_with(sched_tenants_set(ts, &t, 8, key, NULL), QE_EINVAL, "flags"));
  CHECK(fails_with(sched_tenants_get(ts, "q", &g), QE_ENOTFOUND, "tenant")); /* rolled back */
  CHECK(fails_with(sched_tenants_get(ts, "nobody", &g), QE_ENOTFOUND, "tenant"));
  CHECK(fails_with(sched_tenants_delete(ts, "nobody"), QE_ENOTFOUND, "tenant"));
  sched_tenant_t *all;
  size_t n;
  CHECK_OK(sched_tenants_list(ts, &all, &n)); /* the table survived every attempt */
  CHECK(n == 2);
  free(all);
  sched_tenants_close(ts);
  sched_tenants_t *none = (sched_tenants_t *)1;
  CHECK(fails_with(sched_tenants_open("", &none), QE_EINVAL, "path") && none == NULL);
  CHECK(fails_with(sched_tenants_open(db_path("no/such/dir.db"), &none), QE_EIO, "tenant store"));
}

/* A file that is not SQLite, and a store from a newer build, are refused cleanly. */
static void test_foreign_files(void) {
  const char *junk = db_path("junk.db");
  FILE *f = fopen(junk, "wb");
  CHECK(f != NULL);
  if (!f) return;
  for (int i = 0; i < 4096; i++) fputc((i * 131) & 0xff, f);
  fclose(f);
  sched_tenants_t *ts;
  CHECK(fails_with(sched_tenants_open(junk, &ts), QE_EIO, "tenant store"));
  const char *newer = db_path("newer.db");
  CHECK_OK(sched_tenants_open(newer, &ts));
  sched_tenants_close(ts);
  sqlite3 *db;
  CHECK(sqlite3_open(newer, &db) == SQLITE_OK);
  CHECK(sqlite3_exec(db, "UPDATE schema_version SET version = 99", 0, 0, 0) == SQLITE_OK);
  sqlite3_stmt *s;
  CHECK(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL) == SQLITE_OK);
  CHECK(sqlite3_step(s) == SQLITE_ROW && !strcmp((const char *)sqlite3_column_text(s, 0), "wal"));
  sqlite3_finalize(s);
  sqlite3_close(db);
  CHECK(fails_with(sched_tenants_open(newer, &ts), QE_EUNSUPPORTED, "schema version"));
  /* its tables without its version: damaged, said so (it had failed re-creating the tables) */
  CHECK(sqlite3_open(newer, &db) == SQLITE_OK);
  CHECK(sqlite3_exec(db, "DELETE FROM schema_version", 0, 0, 0) == SQLITE_OK);
  sqlite3_close(db);
  CHECK(fails_with(sched_tenants_open(newer, &ts), QE_EFORMAT, "no schema version: damaged"));
  /* a store truncated to 0 bytes: found, said so (SQLite takes it for a new one) */
  const char *emptied = db_path("emptied.db");
  CHECK_OK(sched_tenants_open(emptied, &ts));
  sched_tenant_t t = tenant("kept", 100, 0, "");
  char key[SCHED_KEY_STRLEN + 1];
  CHECK_OK(sched_tenants_set(ts, &t, 0, key, NULL));
  sched_tenants_close(ts);
  struct stat st;
  CHECK(stat(emptied, &st) == 0 && st.st_size > 0); /* (closed: checkpointed into the file) */
  CHECK_OK(sched_tenants_check_emptied(emptied));
  CHECK_OK(sched_tenants_check_emptied(db_path("absent.db")));
  CHECK(truncate(emptied, 0) == 0);
  CHECK(fails_with(sched_tenants_check_emptied(emptied), QE_EFORMAT, "exists but is empty"));
  /* with a write-ahead log beside it (SQLite drops it: the tenants had gone) */
  char wal[512];
  snprintf(wal, sizeof wal, "%s-wal", emptied);
  FILE *wf = fopen(wal, "wb");
  CHECK(wf != NULL);
  if (wf) fputs("not empty", wf), fclose(wf);
  CHECK(fails_with(sched_tenants_check_emptied(emptied), QE_EFORMAT, "write-ahead log"));
}

static void test_two_handles(void) {
  const char *path = db_path("shared.db");
  sched_tenants_t *a, *b;
  CHECK_OK(sched_tenants_open(path, &a));
  CHECK_OK(sched_tenants_open(path, &b));
  if (!a || !b) return;
  char k[SCHED_KEY_STRLEN + 1], k2[SCHED_KEY_STRLEN + 1], who[SCHED_TENANT_ID_MAX + 1];
  sched_tenant_t t = tenant("shared", 4096, 1024, "kivi"), g;
  CHECK_OK(sched_tenants_set(a, &t, 0, k, NULL));
  CHECK_OK(sched_tenants_get(b, "shared", &g)); /* visible at once through the other handle */
  CHECK(g.kv_quota_bytes == 4096);
  CHECK_OK(sched_tenants_verify_key(b, k, who));
  CHECK_OK(sched_tenants_set(b, &t, SCHED_TENANT_ROTATE_KEY, k2, NULL));
  CHECK(fails_with(sched_tenants_verify_key(a, k, who), QE_ENOTFOUND, "api key"));
  CHECK_OK(sched_tenants_verify_key(a, k2, who));
  CHECK_OK(sched_tenants_delete(a, "shared"));
  CHECK(fails_with(sched_tenants_get(b, "shared", &g), QE_ENOTFOUND, "tenant"));
  sched_tenants_close(a);
  sched_tenants_close(b);
}

#define N_PER_THREAD 40

struct worker {
  const char *path;
  int index, errors;
};

/* Opens its own handle on a fresh store (racing the other thread's open and migration), then
 * creates tenants, verifies their keys, and reads the other thread's tenants as they appear. */
static void *worker_main(void *arg) {
  struct worker *w = arg;
  sched_tenants_t *ts;
  if (sched_tenants_open(w->path, &ts)) return w->errors++, NULL;
  for (int i = 0; i < N_PER_THREAD; i++) {
    char id[32], key[SCHED_KEY_STRLEN + 1], who[SCHED_TENANT_ID_MAX + 1];
    snprintf(id, sizeof id, "w%d-t%02d", w->index, i);
    sched_tenant_t t = tenant(id, 1000 + i, i, "qevict");
    if (sched_tenants_set(ts, &t, 0, key, NULL)) w->errors++;
    if (sched_tenants_verify_key(ts, key, who) || strcmp(who, id)) w->errors++;
    sched_tenant_t *all;
    size_t n;
    if (sched_tenants_list(ts, &all, &n) || n < (size_t)i + 1) w->errors++;
    free(all);
  }
  sched_tenants_close(ts);
  return NULL;
}

static void test_threads(void) {
  const char *path = db_path("threads.db");
  struct worker w[2] = {{path, 0, 0}, {path, 1, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  CHECK(w[0].errors == 0 && w[1].errors == 0);
  sched_tenants_t *ts;
  CHECK_OK(sched_tenants_open(path, &ts));
  if (!ts) return;
  sched_tenant_t *all;
  size_t n;
  CHECK_OK(sched_tenants_list(ts, &all, &n));
  CHECK(n == 2 * N_PER_THREAD);
  free(all);
  sched_tenants_close(ts);
}

int main(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmp_dir, sizeof tmp_dir, "%s/qe_tenants_XXXXXX", base);
  if (!mkdtemp(tmp_dir)) tu_skip("cannot create a temporary directory");
  test_crud();
  test_keys();
  test_restart();
  test_bad_input();
  test_foreign_files();
  test_two_handles();
  test_threads();
  const char *dbs[] = {"crud.db", "keys.db",  "restart.db", "bad.db",
                       "junk.db", "newer.db", "shared.db",  "threads.db"};
  for (size_t i = 0; i < sizeof dbs / sizeof *dbs; i++) rm_db(dbs[i]);
  rmdir(tmp_dir);
  return tu_done("sched_tenants");
}
