/* sched_tenants: qevict-sched's tenant store, one SQLite database (WAL, so several handles and
 * processes may hold it open; a busy timeout rides over short write locks). It keeps tenants
 * (KV byte quota, per-request budget limit, default policy) and their API keys, and the admin key.
 * Keys are "qk_" + 64 hex digits (32 random bytes from /dev/urandom), shown once when issued and
 * stored only as a random salt and SHA-256(salt || key bytes); the first 16 hex digits are the
 * key id, stored in clear, so a lookup finds the one row to check instead of scanning.
 * A handle is not thread-safe: use it from one thread at a time (open one per thread). Errors
 * are 0 or a negative QE_E* code with a qe_errf detail naming the field: QE_EINVAL for bad input,
 * QE_ENOTFOUND for an unknown tenant or a key that does not match, QE_EIO for the database. */
#ifndef QE_SCHED_TENANTS_H
#define QE_SCHED_TENANTS_H

#include <stddef.h>
#include <stdint.h>

#define SCHED_TENANT_ID_MAX 64 /* id: 1..64 characters of [A-Za-z0-9_-] */
#define SCHED_POLICY_MAX    63 /* default_policy: 0..63 of [a-z0-9_+.:=,-]; "" = server default */
#define SCHED_KEY_STRLEN    67 /* "qk_" + 64 hex digits, without the NUL */
#define SCHED_KEY_ID_LEN    16 /* the key's first 16 hex digits */

typedef struct sched_tenants sched_tenants_t;

typedef struct sched_tenant {
  char id[SCHED_TENANT_ID_MAX + 1];
  int64_t kv_quota_bytes;           /* > 0: bytes of KV this tenant may hold reserved at once */
  int64_t max_request_budget_bytes; /* 0 = unlimited (up to the quota), else <= kv_quota_bytes */
  char default_policy[SCHED_POLICY_MAX + 1];
  /* Output only (ignored by sched_tenants_set): */
  int64_t created_at_ms, updated_at_ms; /* Unix time in milliseconds */
  int64_t key_created_at_ms;            /* when the current API key was issued (0 if none) */
  char key_id[SCHED_KEY_ID_LEN + 1];    /* id of the tenant's current API key ("" if none) */
} sched_tenant_t;

/* Flags of sched_tenants_set. */
enum { SCHED_TENANT_ROTATE_KEY = 1 };

/* Opens (creating if needed, mode 0600) the store at path and migrates its schema to this
 * build's version; a store written by a newer build is QE_EUNSUPPORTED. *out is owned by the
 * caller (sched_tenants_close). */
int sched_tenants_open(const char *path, sched_tenants_t **out);

/* QE_EFORMAT, naming the path, when the store at path exists with 0 bytes: what a truncation
 * leaves, which sched_tenants_open would take for a new store, its tenants gone without a word
 * (a write-ahead log beside it too: SQLite drops the log of an empty file; an opened store has
 * its first page written at once); 0 otherwise. For a caller that alone opens the store (the
 * scheduler, under its state directory's lock): a store another handle is creating looks the
 * same. */
int sched_tenants_check_emptied(const char *path);
/* Closes the handle; NULL is allowed. */
void sched_tenants_close(sched_tenants_t *ts);

/* Creates the tenant t->id or replaces its settings (one transaction). A new tenant always gets
 * an API key; an existing one gets a new key (its old keys stop working at once) when flags has
 * SCHED_TENANT_ROTATE_KEY. The new key is written to key_out (NUL-terminated; it is never stored
 * and cannot be shown again), otherwise key_out gets "". key_out may be NULL only when no key is
 * issued. *created (optional) says whether the tenant was new. */
int sched_tenants_set(sched_tenants_t *ts, const sched_tenant_t *t, unsigned flags,
                      char key_out[SCHED_KEY_STRLEN + 1], int *created);
/* 0 when id is a tenant id (1 to SCHED_TENANT_ID_MAX of [A-Za-z0-9_.-]), else QE_EINVAL worded
 * for the request field that holds it (e.g. "tenant.id"). */
int sched_tenants_check_id(const char *id, const char *field);
/* Copies the tenant id into *out; QE_ENOTFOUND if there is none. */
int sched_tenants_get(sched_tenants_t *ts, const char *id, sched_tenant_t *out);
/* All tenants, ordered by id, in a malloc'd array the caller frees (NULL when *n is 0). */
int sched_tenants_list(sched_tenants_t *ts, sched_tenant_t **out, size_t *n);
/* Deletes the tenant and its keys; QE_ENOTFOUND if there is none. */
int sched_tenants_delete(sched_tenants_t *ts, const char *id);

/* Checks an API key (the bearer token): 0 and the tenant id in tenant_out when it is a current
 * key of a tenant; QE_EINVAL when it is not shaped like a key; QE_ENOTFOUND when it matches
 * nothing (unknown, rotated or deleted). The hash comparison is constant-time, and an unknown
 * key id costs the same hashing as a known one. */
int sched_tenants_verify_key(sched_tenants_t *ts, const char *key,
                             char tenant_out[SCHED_TENANT_ID_MAX + 1]);

/* Replaces the admin key. key NULL: a new random key is issued into key_out (required then);
 * otherwise key (a well-formed "qk_" key, e.g. read from --admin-key-file) is stored and copied
 * to key_out when that is not NULL. Older admin keys stop working. */
int sched_tenants_set_admin_key(sched_tenants_t *ts, const char *key,
                                char key_out[SCHED_KEY_STRLEN + 1]);
/* *present = 1 if an admin key is configured, else 0. */
int sched_tenants_has_admin_key(sched_tenants_t *ts, int *present);
/* 0 when key is the admin key; QE_EINVAL if malformed, QE_ENOTFOUND otherwise (also when no
 * admin key is configured). Constant-time like sched_tenants_verify_key. */
int sched_tenants_verify_admin_key(sched_tenants_t *ts, const char *key);

#endif
