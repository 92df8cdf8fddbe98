/* sched_tenants: the tenant store in SQLite (see sched_tenants.h). Every statement that carries
 * caller data is prepared once at open and bound; only fixed DDL goes through sqlite3_exec.
 * Schema changes are numbered migrations applied in one IMMEDIATE transaction at open, so two
 * processes opening a new store at once serialize on it. */
#include "sched_tenants.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "qe_sha256.h"
#include "qe_status.h"

#define SCHEMA_VERSION  1
#define KEY_BYTES       32
#define SALT_BYTES      16
#define KEY_PREFIX      "qk_"
#define BUSY_TIMEOUT_MS 10000 /* at open, before the scheduler serves */
/* Once serving: the scheduler's one loop thread waits this long for a lock another process holds
 * on the store (10 s had stalled everything, and the worker links' 5 s heartbeats timed out). */
#define SERVE_BUSY_MS 500

/* migrations[v] takes the schema from version v to v + 1. */
static const char *const migrations[SCHEMA_VERSION] = {
    "CREATE TABLE tenants ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  kv_quota_bytes INTEGER NOT NULL CHECK (kv_quota_bytes > 0),"
    "  max_request_budget_bytes INTEGER NOT NULL DEFAULT 0"
    "    CHECK (max_request_budget_bytes >= 0 AND max_request_budget_bytes <= kv_quota_bytes),"
    "  default_policy TEXT NOT NULL DEFAULT '',"
    "  created_at_ms INTEGER NOT NULL,"
    "  updated_at_ms INTEGER NOT NULL);"
    "CREATE TABLE api_keys ("
    "  key_id TEXT PRIMARY KEY NOT NULL,"
    "  tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,"
    "  salt BLOB NOT NULL, hash BLOB NOT NULL, created_at_ms INTEGER NOT NULL);"
    "CREATE INDEX api_keys_tenant ON api_keys(tenant_id);"
    "CREATE TABLE admin_keys ("
    "  key_id TEXT PRIMARY KEY NOT NULL,"
    "  salt BLOB NOT NULL, hash BLOB NOT NULL, created_at_ms INTEGER NOT NULL);",
};

#define TENANT_COLS                                                                                \
  "SELECT id, kv_quota_bytes, max_request_budget_bytes, default_policy, created_at_ms, "           \
  "updated_at_ms, (SELECT key_id FROM api_keys WHERE tenant_id = tenants.id LIMIT 1), "            \
  "(SELECT created_at_ms FROM api_keys WHERE tenant_id = tenants.id LIMIT 1) FROM tenants"

enum {
  ST_GET,
  ST_LIST,
  ST_EXISTS,
  ST_INSERT,
  ST_UPDATE,
  ST_DELETE,
  ST_KEY_DEL,
  ST_KEY_INS,
  ST_KEY_FIND,
  ST_ADMIN_DEL,
  ST_ADMIN_INS,
  ST_ADMIN_FIND,
  ST_ADMIN_COUNT,
  ST_N
};

static const char *const sql_text[ST_N] = {
    [ST_GET] = TENANT_COLS " WHERE id = ?1",
    [ST_LIST] = TENANT_COLS " ORDER BY id",
    [ST_EXISTS] = "SELECT 1 FROM tenants WHERE id = ?1",
    [ST_INSERT] = "INSERT INTO tenants (id, kv_quota_bytes, max_request_budget_bytes, "
                  "default_policy, created_at_ms, updated_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
    [ST_UPDATE] = "UPDATE tenants SET kv_quota_bytes = ?2, max_request_budget_bytes = ?3, "
                  "default_policy = ?4, updated_at_ms = ?5 WHERE id = ?1",
    [ST_DELETE] = "DELETE FROM tenants WHERE id = ?1",
    [ST_KEY_DEL] = "DELETE FROM api_keys WHERE tenant_id = ?1",
    [ST_KEY_INS] = "INSERT INTO api_keys (key_id, tenant_id, salt, hash, created_at_ms) "
                   "VALUES (?1, ?2, ?3, ?4, ?5)",
    [ST_KEY_FIND] = "SELECT salt, hash, tenant_id FROM api_keys WHERE key_id = ?1",
    [ST_ADMIN_DEL] = "DELETE FROM admin_keys",
    [ST_ADMIN_INS] = "INSERT INTO admin_keys (key_id, salt, hash, created_at_ms) "
                     "VALUES (?1, ?3, ?4, ?5)",
    [ST_ADMIN_FIND] = "SELECT salt, hash, '' FROM admin_keys WHERE key_id = ?1",
    [ST_ADMIN_COUNT] = "SELECT count(*) FROM admin_keys",
};

struct sched_tenants {
  sqlite3 *db;
  sqlite3_stmt *st[ST_N];
};

/* ---- database plumbing ---- */

/* A lock another process holds is QE_EBUSY (retry), any other failure QE_EIO. */
static int db_err(sched_tenants_t *ts, const char *what) {
  const int code = sqlite3_errcode(ts->db) & 0xff;
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED)
    return qe_errf(QE_EBUSY, "tenant store: %s: %s (another process holds a lock on it; retry)",
                   what, sqlite3_errmsg(ts->db));
  return qe_errf(QE_EIO, "tenant store: %s: %s", what, sqlite3_errmsg(ts->db));
}

static int exec(sched_tenants_t *ts, const char *sql) {
  char what[48]; /* the statement's start: its whole text would crowd out SQLite's reason */
  if (sqlite3_exec(ts->db, sql, NULL, NULL, NULL) == SQLITE_OK) return 0;
  snprintf(what, sizeof what, "%.40s%s", sql, strlen(sql) > 40 ? "..." : "");
  return db_err(ts, what);
}

/* A prepared statement, reset and with no bindings, ready to bind. */
static sqlite3_stmt *use(sched_tenants_t *ts, int i) {
  sqlite3_reset(ts->st[i]);
  sqlite3_clear_bindings(ts->st[i]);
  return ts->st[i];
}

/* Steps a statement that returns no rows, then resets it (so it holds no lock). */
static int run_done(sched_tenants_t *ts, sqlite3_stmt *s, const char *what) {
  int rc = sqlite3_step(s);
  int err = rc == SQLITE_DONE ? 0 : db_err(ts, what);
  sqlite3_reset(s);
  return err;
}

static int tx_begin(sched_tenants_t *ts) { return exec(ts, "BEGIN IMMEDIATE"); }

/* Commits when rc is 0, else rolls back; returns rc or the commit's error. */
static int tx_end(sched_tenants_t *ts, int rc) {
  if (!rc) return exec(ts, "COMMIT");
  sqlite3_exec(ts->db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ---- validation ---- */

static int id_char(int c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

static int policy_char(int c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c && strchr("_+.:=,-", c));
}

int sched_tenants_check_id(const char *id, const char *field) {
  if (!id) return qe_errf(QE_EINVAL, "%s: missing", field);
  size_t n = strnlen(id, SCHED_TENANT_ID_MAX + 1);
  if (n == 0 || n > SCHED_TENANT_ID_MAX)
    return qe_errf(QE_EINVAL, "%s: must be 1 to %d characters", field, SCHED_TENANT_ID_MAX);
  for (size_t i = 0; i < n; i++)
    if (!id_char((unsigned char)id[i]))
      return qe_errf(QE_EINVAL, "%s: character %zu is not one of [A-Za-z0-9_.-]", field, i + 1);
  return 0;
}

static int check_id(const char *id) { return sched_tenants_check_id(id, "tenant id"); }

static int check_policy(const char *p, size_t cap) {
  size_t n = strnlen(p, cap);
  if (n == cap) return qe_errf(QE_EINVAL, "default_policy: longer than %d", SCHED_POLICY_MAX);
  for (size_t i = 0; i < n; i++)
    if (!policy_char((unsigned char)p[i]))
      return qe_errf(QE_EINVAL, "default_policy: character %zu is not one of [a-z0-9_+.:=,-]",
                     i + 1);
  return 0;
}

static int check_tenant(const sched_tenant_t *t) {
  if (!t) return qe_errf(QE_EINVAL, "tenant: missing");
  if (!memchr(t->id, 0, sizeof t->id))
    return qe_errf(QE_EINVAL, "tenant id: longer than %d", SCHED_TENANT_ID_MAX);
  int rc = check_id(t->id);
  if (rc) return rc;
  if (t->kv_quota_bytes <= 0)
    return qe_errf(QE_EINVAL, "kv_quota_bytes: must be > 0 (got %lld)",
                   (long long)t->kv_quota_bytes);
  if (t->max_request_budget_bytes < 0)
    return qe_errf(QE_EINVAL, "max_request_budget_bytes: must be >= 0, 0 = unlimited (got %lld)",
                   (long long)t->max_request_budget_bytes);
  if (t->max_request_budget_bytes > t->kv_quota_bytes)
    return qe_errf(QE_EINVAL, "max_request_budget_bytes: %lld exceeds kv_quota_bytes %lld",
                   (long long)t->max_request_budget_bytes, (long long)t->kv_quota_bytes);
  return check_policy(t->default_policy, sizeof t->default_policy);
}

/* ---- keys ---- */

static int random_bytes(void *p, size_t n) {
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return qe_errf(QE_EIO, "random: /dev/urandom: %s", strerror(errno));
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  return got == n ? 0 : qe_errf(QE_EIO, "random: short read from /dev/urandom");
}

static void to_hex(const uint8_t *b, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) out[2 * i] = digits[b[i] >> 4], out[2 * i + 1] = digits[b[i] & 15];
  out[2 * n] = '\0';
}

static int hex_val(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* "qk_" + 64 hex digits (either case) -> 32 bytes. */
static int parse_key(const char *key, const char *field, uint8_t raw[KEY_BYTES]) {
  if (!key) return qe_errf(QE_EINVAL, "%s: missing", field);
  if (strnlen(key, SCHED_KEY_STRLEN + 1) != SCHED_KEY_STRLEN ||
      strncmp(key, KEY_PREFIX, strlen(KEY_PREFIX)))
    return qe_errf(QE_EINVAL, "%s: malformed (expected qk_ and 64 hex digits)", field);
  const char *h = key + strlen(KEY_PREFIX);
  for (int i = 0; i < KEY_BYTES; i++) {
    int hi = hex_val((unsigned char)h[2 * i]), lo = hex_val((unsigned char)h[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return qe_errf(QE_EINVAL, "%s: malformed (expected qk_ and 64 hex digits)", field);
    raw[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

static void key_hash(const uint8_t salt[SALT_BYTES], const uint8_t raw[KEY_BYTES],
                     uint8_t out[QE_SHA256_LEN]) {
  qe_sha256_t c;
  qe_sha256_init(&c);
  qe_sha256_update(&c, salt, SALT_BYTES);
  qe_sha256_update(&c, raw, KEY_BYTES);
  qe_sha256_final(&c, out);
}

/* Stores the key raw (tenant's when tenant is not NULL, else the admin's) as salt + hash. */
static int store_key(sched_tenants_t *ts, const char *tenant, const uint8_t raw[KEY_BYTES]) {
  uint8_t salt[SALT_BYTES], hash[QE_SHA256_LEN];
  char key_id[SCHED_KEY_ID_LEN + 1];
  int rc = random_bytes(salt, sizeof salt);
  if (rc) return rc;
  key_hash(salt, raw, hash);
  to_hex(raw, SCHED_KEY_ID_LEN / 2, key_id);
  sqlite3_stmt *s = use(ts, tenant ? ST_KEY_INS : ST_ADMIN_INS);
  sqlite3_bind_text(s, 1, key_id, -1, SQLITE_TRANSIENT);
  if (tenant) sqlite3_bind_text(s, 2, tenant, -1, SQLITE_TRANSIENT);
  sqlite3_bind_blob(s, 3, salt, sizeof salt, SQLITE_TRANSIENT);
  sqlite3_bind_blob(s, 4, hash, sizeof hash, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 5, now_ms());
  rc = sqlite3_step(s);
  int err = rc == SQLITE_DONE ? 0 : rc == SQLITE_CONSTRAINT ? QE_ERANGE : db_err(ts, "store key");
  sqlite3_reset(s);
  return err;
}

/* Issues a fresh random key (retrying in the 2^-64 case of a key id already taken). */
static int issue_key(sched_tenants_t *ts, const char *tenant, char key_out[SCHED_KEY_STRLEN + 1]) {
  uint8_t raw[KEY_BYTES];
  int rc = QE_ERANGE;
  for (int attempt = 0; attempt < 4 && rc == QE_ERANGE; attempt++) {
    rc = random_bytes(raw, sizeof raw);
    if (!rc) rc = store_key(ts, tenant, raw);
  }
  if (rc == QE_ERANGE) rc = qe_errf(QE_EIO, "tenant store: could not find a free key id");
  if (!rc) memcpy(key_out, KEY_PREFIX, strlen(KEY_PREFIX)), to_hex(raw, KEY_BYTES, key_out + 3);
  qe_secure_zero(raw, sizeof raw);
  return rc;
}

/* Reads the salt/hash row of key_id into salt, hash, owner; *found = 0 when there is none. */
static int find_key(sched_tenants_t *ts, int which, const char *key_id, uint8_t *salt,
                    uint8_t *hash, char owner[SCHED_TENANT_ID_MAX + 1], int *found) {
  sqlite3_stmt *s = use(ts, which);
  sqlite3_bind_text(s, 1, key_id, -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(s), err = 0;
  *found = 0;
  if (rc == SQLITE_ROW && sqlite3_column_bytes(s, 0) == SALT_BYTES &&
      sqlite3_column_bytes(s, 1) == QE_SHA256_LEN) {
    memcpy(salt, sqlite3_column_blob(s, 0), SALT_BYTES);
    memcpy(hash, sqlite3_column_blob(s, 1), QE_SHA256_LEN);
    snprintf(owner, SCHED_TENANT_ID_MAX + 1, "%s", (const char *)sqlite3_column_text(s, 2));
    *found = 1;
  } else if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
    err = db_err(ts, "find key");
  }
  sqlite3_reset(s);
  return err;
}

/* Verifies key against the table of `which`; the owner (tenant id or "") goes to owner. */
static int check_key(sched_tenants_t *ts, int which, const char *field, const char *key,
                     char owner[SCHED_TENANT_ID_MAX + 1]) {
  uint8_t raw[KEY_BYTES], salt[SALT_BYTES] = {0}, want[QE_SHA256_LEN] = {0}, got[QE_SHA256_LEN];
  char key_id[SCHED_KEY_ID_LEN + 1];
  int found = 0, rc = parse_key(key, field, raw);
  if (rc) return rc;
  to_hex(raw, SCHED_KEY_ID_LEN / 2, key_id);
  rc = find_key(ts, which, key_id, salt, want, owner, &found);
  key_hash(salt, raw, got); /* hashed even when unknown, so timing says nothing */
  int equal = qe_ct_equal(got, want, sizeof got) & found;
  qe_secure_zero(raw, sizeof raw);
  if (rc) return rc;
  return equal ? 0 : qe_errf(QE_ENOTFOUND, "%s: unknown or revoked", field);
}

/* ---- open / close ---- */

static int read_int(sched_tenants_t *ts, const char *sql, int64_t *v) {
  sqlite3_stmt *s;
  if (sqlite3_prepare_v2(ts->db, sql, -1, &s, NULL) != SQLITE_OK) return db_err(ts, sql);
  int rc = sqlite3_step(s);
  *v = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  sqlite3_finalize(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(ts, sql);
}

/* Switches to WAL. On a fresh file another handle's open may hold the lock this needs, and SQLite
 * reports that as SQLITE_BUSY at once (the busy handler is not consulted for this change), so
 * it is retried for up to BUSY_TIMEOUT_MS. */
static int set_journal_wal(sched_tenants_t *ts) {
  sqlite3_stmt *s;
  if (sqlite3_prepare_v2(ts->db, "PRAGMA journal_mode=WAL", -1, &s, NULL) != SQLITE_OK)
    return db_err(ts, "journal_mode");
  int rc = sqlite3_step(s);
  for (int waited = 0; (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) && waited < BUSY_TIMEOUT_MS;
       waited += 5) {
    sqlite3_reset(s);
    sqlite3_sleep(5);
    rc = sqlite3_step(s);
  }
  const char *mode = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(s, 0) : NULL;
  int ok = mode && (!strcmp(mode, "wal") || !strcmp(mode, "memory"));
  sqlite3_finalize(s);
  if (rc != SQLITE_ROW) return db_err(ts, "journal_mode=WAL");
  return ok ? 0 : qe_errf(QE_EIO, "tenant store: could not switch to WAL journaling");
}

static int write_version(sched_tenants_t *ts) {
  sqlite3_stmt *s;
  int rc = exec(ts, "DELETE FROM schema_version");
  if (rc) return rc;
  if (sqlite3_prepare_v2(ts->db, "INSERT INTO schema_version VALUES (?1)", -1, &s, NULL))
    return db_err(ts, "schema_version");
  sqlite3_bind_int(s, 1, SCHEMA_VERSION);
  rc = sqlite3_step(s) == SQLITE_DONE ? 0 : db_err(ts, "schema_version");
  sqlite3_finalize(s);
  return rc;
}

/* Inside the open transaction: reads the version (0 for a new file) and applies the rest. */
static int migrate_in_tx(sched_tenants_t *ts) {
  int64_t version = 0;
  int rc = exec(ts, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)");
  if (!rc) rc = read_int(ts, "SELECT max(version) FROM schema_version", &version);
  if (rc) return rc;
  if (version > SCHEMA_VERSION || version < 0)
    return qe_errf(QE_EUNSUPPORTED, "tenant store: schema version %lld, this build knows %d",
                   (long long)version, SCHEMA_VERSION);
  int64_t tables = 0; /* a store without its version but with its tables was damaged */
  if (!version &&
      !(rc = read_int(ts,
                      "SELECT count(*) FROM sqlite_master WHERE type = 'table' "
                      "AND name = 'tenants'",
                      &tables)) &&
      tables)
    return qe_errf(QE_EFORMAT,
                   "tenant store: it holds a tenants table but no schema version: damaged "
                   "(restore tenants.db from a backup, or move it away to start empty)");
  for (int64_t v = version; v < SCHEMA_VERSION && !rc; v++) rc = exec(ts, migrations[v]);
  if (!rc && version != SCHEMA_VERSION) rc = write_version(ts);
  return rc;
}

static int migrate(sched_tenants_t *ts) {
  int rc = tx_begin(ts);
  return rc ? rc : tx_end(ts, migrate_in_tx(ts));
}

static int configure(sched_tenants_t *ts) {
  sqlite3_busy_timeout(ts->db, BUSY_TIMEOUT_MS);
  int rc = set_journal_wal(ts);
  if (!rc) rc = exec(ts, "PRAGMA synchronous=FULL");
  if (!rc) rc = exec(ts, "PRAGMA foreign_keys=ON");
  if (!rc) rc = migrate(ts);
  for (int i = 0; i < ST_N && !rc; i++)
    if (sqlite3_prepare_v3(ts->db, sql_text[i], -1, SQLITE_PREPARE_PERSISTENT, &ts->st[i], NULL))
      rc = db_err(ts, "prepare");
  return rc;
}

int sched_tenants_check_emptied(const char *path) {
  struct stat st;
  char wal[4096];
  if (stat(path, &st) || !S_ISREG(st.st_mode) || st.st_size > 0) return 0;
  snprintf(wal, sizeof wal, "%s-wal", path);
  const int has_wal = !stat(wal, &st) && st.st_size > 0;
  return qe_errf(QE_EFORMAT,
                 "tenant store: %s exists but is empty (0 bytes%s): its tenants may have been "
                 "lost (restore it from a backup, or remove it to start with none)",
                 path, has_wal ? "; SQLite would drop the write-ahead log beside it" : "");
}

int sched_tenants_open(const char *path, sched_tenants_t **out) {
  if (!out) return qe_errf(QE_EINVAL, "tenant store: no output handle");
  *out = NULL;
  if (!path || !*path) return qe_errf(QE_EINVAL, "tenant store: path missing");
  sched_tenants_t *ts = calloc(1, sizeof *ts);
  if (!ts) return qe_errf(QE_ENOMEM, "tenant store: handle");
  int fresh = access(path, F_OK) != 0;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX;
  int rc = sqlite3_open_v2(path, &ts->db, flags, NULL);
  if (rc != SQLITE_OK) {
    rc = ts->db ? qe_errf(QE_EIO, "tenant store: %s: %s", path, sqlite3_errmsg(ts->db))
                : qe_errf(QE_ENOMEM, "tenant store: sqlite handle");
    goto fail;
  }
  if (fresh && strcmp(path, ":memory:")) chmod(path, 0600); /* key hashes: owner only */
  rc = configure(ts);
  if (rc) goto fail;
  sqlite3_busy_timeout(ts->db, SERVE_BUSY_MS);
  *out = ts;
  return 0;
fail:
  sched_tenants_close(ts);
  return rc;
}

void sched_tenants_close(sched_tenants_t *ts) {
  if (!ts) return;
  for (int i = 0; i < ST_N; i++) sqlite3_finalize(ts->st[i]);
  sqlite3_close(ts->db);
  free(ts);
}

/* ---- tenants ---- */

static void copy_text(char *dst, size_t cap, sqlite3_stmt *s, int col) {
  const unsigned char *t = sqlite3_column_text(s, col);
  snprintf(dst, cap, "%s", t ? (const char *)t : "");
}

static void read_row(sqlite3_stmt *s, sched_tenant_t *t) {
  memset(t, 0, sizeof *t);
  copy_text(t->id, sizeof t->id, s, 0);
  t->kv_quota_bytes = sqlite3_column_int64(s, 1);
  t->max_request_budget_bytes = sqlite3_column_int64(s, 2);
  copy_text(t->default_policy, sizeof t->default_policy, s, 3);
  t->created_at_ms = sqlite3_column_int64(s, 4);
  t->updated_at_ms = sqlite3_column_int64(s, 5);
  t->key_created_at_ms = sqlite3_column_int64(s, 7); /* (NULL without a key: 0) */
  copy_text(t->key_id, sizeof t->key_id, s, 6);
}

static int tenant_exists(sched_tenants_t *ts, const char *id, int *exists) {
  sqlite3_stmt *s = use(ts, ST_EXISTS);
  sqlite3_bind_text(s, 1, id, -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(s);
  *exists = rc == SQLITE_ROW;
  sqlite3_reset(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : db_err(ts, "tenant lookup");
}

static int write_row(sched_tenants_t *ts, const sched_tenant_t *t, int exists) {
  sqlite3_stmt *s = use(ts, exists ? ST_UPDATE : ST_INSERT);
  sqlite3_bind_text(s, 1, t->id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 2, t->kv_quota_bytes);
  sqlite3_bind_int64(s, 3, t->max_request_budget_bytes);
  sqlite3_bind_text(s, 4, t->default_policy, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 5, now_ms());
  return run_done(ts, s, exists ? "update tenant" : "insert tenant");
}

static int replace_tenant_key(sched_tenants_t *ts, const char *id,
                              char key_out[SCHED_KEY_STRLEN + 1]) {
  sqlite3_stmt *s = use(ts, ST_KEY_DEL);
  sqlite3_bind_text(s, 1, id, -1, SQLITE_TRANSIENT);
  int rc = run_done(ts, s, "revoke keys");
  return rc ? rc : issue_key(ts, id, key_out);
}

static int set_in_tx(sched_tenants_t *ts, const sched_tenant_t *t, unsigned flags, char *key_out,
                     int *exists) {
  int rc = tenant_exists(ts, t->id, exists);
  int new_key = !*exists || (flags & SCHED_TENANT_ROTATE_KEY);
  if (!rc && new_key && !key_out)
    rc = qe_errf(QE_EINVAL, "key_out: needed to return the new API key");
  if (!rc) rc = write_row(ts, t, *exists);
  if (!rc && new_key) rc = replace_tenant_key(ts, t->id, key_out);
  return rc;
}

int sched_tenants_set(sched_tenants_t *ts, const sched_tenant_t *t, unsigned flags,
                      char key_out[SCHED_KEY_STRLEN + 1], int *created) {
  int rc = check_tenant(t), exists = 0;
  if (rc) return rc;
  if (flags & ~(unsigned)SCHED_TENANT_ROTATE_KEY) return qe_errf(QE_EINVAL, "flags: unknown bits");
  if (key_out) key_out[0] = '\0';
  rc = tx_begin(ts);
  if (!rc) rc = tx_end(ts, set_in_tx(ts, t, flags, key_out, &exists));
  if (rc && key_out) qe_secure_zero(key_out, SCHED_KEY_STRLEN + 1);
  if (!rc && created) *created = !exists;
  return rc;
}

int sched_tenants_get(sched_tenants_t *ts, const char *id, sched_tenant_t *out) {
  int rc = check_id(id);
  if (rc) return rc;
  sqlite3_stmt *s = use(ts, ST_GET);
  sqlite3_bind_text(s, 1, id, -1, SQLITE_TRANSIENT);
  rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) read_row(s, out);
  sqlite3_reset(s);
  if (rc == SQLITE_ROW) return 0;
  if (rc == SQLITE_DONE) return qe_errf(QE_ENOTFOUND, "tenant: no tenant '%s'", id);
  return db_err(ts, "get tenant");
}

/* Appends the row to the growing array *v of *n (capacity *cap). */
static int push_row(sqlite3_stmt *s, sched_tenant_t **v, size_t *n, size_t *cap) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 16;
    sched_tenant_t *p = realloc(*v, c * sizeof *p);
    if (!p) return qe_errf(QE_ENOMEM, "tenant list: %zu rows", c);
    *v = p, *cap = c;
  }
  read_row(s, &(*v)[(*n)++]);
  return 0;
}

int sched_tenants_list(sched_tenants_t *ts, sched_tenant_t **out, size_t *n) {
  if (!out || !n) return qe_errf(QE_EINVAL, "tenant list: no output");
  sched_tenant_t *v = NULL;
  size_t cnt = 0, cap = 0;
  sqlite3_stmt *s = use(ts, ST_LIST);
  int rc, err = 0;
  while (!err && (rc = sqlite3_step(s)) == SQLITE_ROW) err = push_row(s, &v, &cnt, &cap);
  if (!err && rc != SQLITE_DONE) err = db_err(ts, "list tenants");
  sqlite3_reset(s);
  if (err) free(v), v = NULL, cnt = 0;
  *out = v, *n = cnt;
  return err;
}

static int delete_in_tx(sched_tenants_t *ts, const char *id) {
  sqlite3_stmt *s = use(ts, ST_KEY_DEL);
  sqlite3_bind_text(s, 1, id, -1, SQLITE_TRANSIENT);
  int rc = run_done(ts, s, "delete keys");
  if (rc) return rc;
  s = use(ts, ST_DELETE);
  sqlite3_bind_text(s, 1, id, -1, SQLITE_TRANSIENT);
  rc = run_done(ts, s, "delete tenant");
  if (!rc && sqlite3_changes(ts->db) == 0) rc = qe_errf(QE_ENOTFOUND, "tenant: no tenant '%s'", id);
  return rc;
}

int sched_tenants_delete(sched_tenants_t *ts, const char *id) {
  int rc = check_id(id);
  if (!rc) rc = tx_begin(ts);
  if (!rc) rc = tx_end(ts, delete_in_tx(ts, id));
  return rc;
}

/* ---- keys: public ---- */

int sched_tenants_verify_key(sched_tenants_t *ts, const char *key,
                             char tenant_out[SCHED_TENANT_ID_MAX + 1]) {
  char owner[SCHED_TENANT_ID_MAX + 1] = "";
  int rc = check_key(ts, ST_KEY_FIND, "api key", key, owner);
  if (tenant_out) snprintf(tenant_out, SCHED_TENANT_ID_MAX + 1, "%s", rc ? "" : owner);
  return rc;
}

static int set_admin_in_tx(sched_tenants_t *ts, const uint8_t *raw, char *key_out) {
  int rc = run_done(ts, use(ts, ST_ADMIN_DEL), "revoke admin key");
  if (rc) return rc;
  if (!raw) return issue_key(ts, NULL, key_out);
  rc = store_key(ts, NULL, raw);
  return rc == QE_ERANGE ? qe_errf(QE_EIO, "tenant store: admin key id taken") : rc;
}

int sched_tenants_set_admin_key(sched_tenants_t *ts, const char *key,
                                char key_out[SCHED_KEY_STRLEN + 1]) {
  uint8_t raw[KEY_BYTES];
  int rc = key ? parse_key(key, "admin key", raw) : 0;
  if (!rc && !key && !key_out) rc = qe_errf(QE_EINVAL, "key_out: needed to return the new key");
  if (!rc) rc = tx_begin(ts);
  if (!rc) rc = tx_end(ts, set_admin_in_tx(ts, key ? raw : NULL, key_out));
  if (!rc && key && key_out) snprintf(key_out, SCHED_KEY_STRLEN + 1, "%s", key);
  qe_secure_zero(raw, sizeof raw);
  return rc;
}

int sched_tenants_has_admin_key(sched_tenants_t *ts, int *present) {
  sqlite3_stmt *s = use(ts, ST_ADMIN_COUNT);
  int rc = sqlite3_step(s);
  *present = rc == SQLITE_ROW && sqlite3_column_int64(s, 0) > 0;
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0 : db_err(ts, "admin key count");
}

int sched_tenants_verify_admin_key(sched_tenants_t *ts, const char *key) {
  char owner[SCHED_TENANT_ID_MAX + 1];
  return check_key(ts, ST_ADMIN_FIND, "admin key", key, owner);
}
