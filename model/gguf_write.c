/* gguf_write: serializes GGUF v3 files in memory for tests, fuzz seeds and random models.
 * Metadata is encoded as it is added (one growable buffer); tensors are copied and laid out
 * at finish: header, metadata, tensor infos, padding to the alignment (32 unless
 * gguf_writer_set_alignment), then each tensor's data at an aligned offset. No padding
 * follows the last tensor, so every proper prefix of a written file is invalid. */
#include "gguf_write.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "qe_status.h"

typedef struct {
  uint8_t *p;
  size_t len, cap;
} gguf__buf_t;

typedef struct {
  char *name;
  int type, n_dims;
  int64_t ne[GGUF_MAX_DIMS];
  uint8_t *data;
  size_t nbytes;
} gguf__wtensor_t;

struct gguf_writer {
  gguf__buf_t kv; /* encoded metadata entries */
  char **keys;    /* [n_kv] copies, for duplicate checks */
  int n_kv, keys_cap;
  gguf__wtensor_t *tensors;
  int n_tensors, tensors_cap;
  uint32_t alignment;
};

/* ---- byte buffer ------------------------------------------------------------------------ */

static int gguf__buf_put(gguf__buf_t *b, const void *data, size_t n) {
  if (b->cap - b->len < n) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n) {
      if (cap > SIZE_MAX / 2) return qe_errf(QE_ENOMEM, "gguf_write: buffer too large");
      cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) return qe_errf(QE_ENOMEM, "gguf_write: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, data, n);
  b->len += n;
  return 0;
}

static int gguf__buf_u32(gguf__buf_t *b, uint32_t v) { return gguf__buf_put(b, &v, 4); }
static int gguf__buf_u64(gguf__buf_t *b, uint64_t v) { return gguf__buf_put(b, &v, 8); }

static int gguf__buf_str(gguf__buf_t *b, const char *s) {
  size_t n = strlen(s);
  int rc = gguf__buf_u64(b, n);
  return rc ? rc : gguf__buf_put(b, s, n);
}

static int gguf__buf_zeros(gguf__buf_t *b, size_t n) {
  static const uint8_t z[64];
  int rc = 0;
  for (; n && !rc; n -= n > 64 ? 64 : n) rc = gguf__buf_put(b, z, n > 64 ? 64 : n);
  return rc;
}

/* ---- create / destroy ------------------------------------------------------------------- */

int gguf_writer_create(gguf_writer_t **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return qe_errf(QE_ENOMEM, "gguf_write: out of memory");
  (*out)->alignment = 32;
  return 0;
}

void gguf_writer_destroy(gguf_writer_t *w) {
  if (!w) return;
  for (int i = 0; i < w->n_kv; i++) free(w->keys[i]);
  for (int i = 0; i < w->n_tensors; i++) {
    free(w->tensors[i].name);
    free(w->tensors[i].data);
  }
  free(w->keys);
  free(w->tensors);
  free(w->kv.p);
  free(w);
}

/* ---- metadata --------------------------------------------------------------------------- */

static size_t gguf__scalar_size(int t) {
  static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return t >= 0 && t <= GGUF_VT_FLOAT64 ? sz[t] : 0;
}

/* Starts an entry: checks the key is new, records it, writes key and value type. */
static int gguf__kv_begin(gguf_writer_t *w, const char *key, int type) {
  if (!key || !*key) return qe_errf(QE_EINVAL, "gguf_write: empty key");
  for (int i = 0; i < w->n_kv; i++)
    if (strcmp(w->keys[i], key) == 0)
      return qe_errf(QE_EINVAL, "gguf_write: duplicate key '%s'", key);
  if (w->n_kv == w->keys_cap) {
    int cap = w->keys_cap ? 2 * w->keys_cap : 16;
    char **k = realloc(w->keys, (size_t)cap * sizeof *k);
    if (!k) return qe_errf(QE_ENOMEM, "gguf_write: out of memory");
    w->keys = k;
    w->keys_cap = cap;
  }
  char *copy = strdup(key);
  if (!copy) return qe_errf(QE_ENOMEM, "gguf_write: out of memory");
  int rc = gguf__buf_str(&w->kv, key);
  if (!rc) rc = gguf__buf_u32(&w->kv, (uint32_t)type);
  if (rc) {
    free(copy);
    return rc;
  }
  w->keys[w->n_kv++] = copy;
  return 0;
}

int gguf_writer_add_scalar(gguf_writer_t *w, const char *key, int type, const void *v) {
  size_t sz = gguf__scalar_size(type);
  if (sz == 0)
    return qe_errf(QE_EINVAL, "gguf_write: key '%s': type %d is not a scalar", key, type);
  int rc = gguf__kv_begin(w, key, type);
  return rc ? rc : gguf__buf_put(&w->kv, v, sz);
}

int gguf_writer_add_arr(gguf_writer_t *w, const char *key, int elem_type, const void *v, size_t n) {
  size_t sz = gguf__scalar_size(elem_type);
  if (sz == 0)
    return qe_errf(QE_EINVAL, "gguf_write: key '%s': element type %d is not a scalar", key,
                   elem_type);
  int rc = gguf__kv_begin(w, key, GGUF_VT_ARRAY);
  if (!rc) rc = gguf__buf_u32(&w->kv, (uint32_t)elem_type);
  if (!rc) rc = gguf__buf_u64(&w->kv, n);
  return rc ? rc : gguf__buf_put(&w->kv, v, n * sz);
}

int gguf_writer_add_u32(gguf_writer_t *w, const char *key, uint32_t v) {
  return gguf_writer_add_scalar(w, key, GGUF_VT_UINT32, &v);
}

int gguf_writer_add_f32(gguf_writer_t *w, const char *key, float v) {
  return gguf_writer_add_scalar(w, key, GGUF_VT_FLOAT32, &v);
}

int gguf_writer_add_bool(gguf_writer_t *w, const char *key, int v) {
  uint8_t b = v != 0;
  return gguf_writer_add_scalar(w, key, GGUF_VT_BOOL, &b);
}

int gguf_writer_add_str(gguf_writer_t *w, const char *key, const char *v) {
  int rc = gguf__kv_begin(w, key, GGUF_VT_STRING);
  return rc ? rc : gguf__buf_str(&w->kv, v);
}

int gguf_writer_add_str_arr(gguf_writer_t *w, const char *key, const char *const *v, size_t n) {
  int rc = gguf__kv_begin(w, key, GGUF_VT_ARRAY);
  if (!rc) rc = gguf__buf_u32(&w->kv, GGUF_VT_STRING);
  if (!rc) rc = gguf__buf_u64(&w->kv, n);
  for (size_t i = 0; i < n && !rc; i++) rc = gguf__buf_str(&w->kv, v[i]);
  return rc;
}

int gguf_writer_add_f32_arr(gguf_writer_t *w, const char *key, const float *v, size_t n) {
  return gguf_writer_add_arr(w, key, GGUF_VT_FLOAT32, v, n);
}

int gguf_writer_add_i32_arr(gguf_writer_t *w, const char *key, const int32_t *v, size_t n) {
  return gguf_writer_add_arr(w, key, GGUF_VT_INT32, v, n);
}

int gguf_writer_set_alignment(gguf_writer_t *w, uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)))
    return qe_errf(QE_EINVAL, "gguf_write: alignment %u is not a power of two", alignment);
  int rc = gguf_writer_add_u32(w, "general.alignment", alignment);
  if (!rc) w->alignment = alignment;
  return rc;
}

/* ---- tensors ---------------------------------------------------------------------------- */

static int gguf__check_tensor(const gguf_writer_t *w, const char *name, int type, int n_dims,
                              const int64_t *ne, size_t nbytes) {
  if (!name || !*name) return qe_errf(QE_EINVAL, "gguf_write: empty tensor name");
  for (int i = 0; i < w->n_tensors; i++)
    if (strcmp(w->tensors[i].name, name) == 0)
      return qe_errf(QE_EINVAL, "gguf_write: duplicate tensor '%s'", name);
  if (!gguf_type_block(type))
    return qe_errf(QE_EINVAL, "gguf_write: tensor '%s': unsupported type %d", name, type);
  if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
    return qe_errf(QE_EINVAL, "gguf_write: tensor '%s': n_dims %d", name, n_dims);
  int64_t n = 1;
  for (int d = 0; d < n_dims; d++) {
    if (ne[d] <= 0 || ne[d] > ((int64_t)1 << 40) / n)
      return qe_errf(QE_EINVAL, "gguf_write: tensor '%s': bad dimension %d", name, d);
    n *= ne[d];
  }
  size_t want = gguf_type_nbytes(type, n);
  if (ne[0] % gguf_type_block(type) != 0 || want != nbytes)
    return qe_errf(QE_EINVAL, "gguf_write: tensor '%s': %zu bytes given, %s shape needs %zu", name,
                   nbytes, gguf_type_name(type), want);
  return 0;
}

int gguf_writer_add_tensor(gguf_writer_t *w, const char *name, int type, int n_dims,
                           const int64_t *ne, const void *data, size_t nbytes) {
  int rc = gguf__check_tensor(w, name, type, n_dims, ne, nbytes);
  if (rc) return rc;
  if (w->n_tensors == w->tensors_cap) {
    int cap = w->tensors_cap ? 2 * w->tensors_cap : 16;
    gguf__wtensor_t *t = realloc(w->tensors, (size_t)cap * sizeof *t);
    if (!t) return qe_errf(QE_ENOMEM, "gguf_write: out of memory");
    w->tensors = t;
    w->tensors_cap = cap;
  }
  gguf__wtensor_t *t = &w->tensors[w->n_tensors];
  memset(t, 0, sizeof *t);
  t->name = strdup(name);
  t->data = malloc(nbytes ? nbytes : 1);
  if (!t->name || !t->data) {
    free(t->name);
    free(t->data);
    return qe_errf(QE_ENOMEM, "gguf_write: out of memory for tensor '%s'", name);
  }
  memcpy(t->data, data, nbytes);
  t->type = type;
  t->n_dims = n_dims;
  t->nbytes = nbytes;
  for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
  w->n_tensors++;
  return 0;
}

/* ---- serialization ---------------------------------------------------------------------- */

static size_t gguf__pad(size_t n, uint32_t a) { return (a - n % a) % a; }

static int gguf__write_infos(const gguf_writer_t *w, gguf__buf_t *b) {
  uint64_t off = 0;
  int rc = 0;
  for (int i = 0; i < w->n_tensors && !rc; i++) {
    const gguf__wtensor_t *t = &w->tensors[i];
    rc = gguf__buf_str(b, t->name);
    if (!rc) rc = gguf__buf_u32(b, (uint32_t)t->n_dims);
    for (int d = 0; d < t->n_dims && !rc; d++) rc = gguf__buf_u64(b, (uint64_t)t->ne[d]);
    if (!rc) rc = gguf__buf_u32(b, (uint32_t)t->type);
    if (!rc) rc = gguf__buf_u64(b, off);
    off += t->nbytes + gguf__pad(t->nbytes, w->alignment);
  }
  return rc;
}

static int gguf__write_data(const gguf_writer_t *w, gguf__buf_t *b) {
  int rc = 0;
  for (int i = 0; i < w->n_tensors && !rc; i++) {
    if (i > 0) rc = gguf__buf_zeros(b, gguf__pad(b->len, w->alignment));
    if (!rc) rc = gguf__buf_put(b, w->tensors[i].data, w->tensors[i].nbytes);
  }
  return rc;
}

int gguf_writer_finish(gguf_writer_t *w, uint8_t **buf, size_t *size) {
  gguf__buf_t b = {0};
  int rc = gguf__buf_put(&b, "GGUF", 4);
  if (!rc) rc = gguf__buf_u32(&b, 3);
  if (!rc) rc = gguf__buf_u64(&b, (uint64_t)w->n_tensors);
  if (!rc) rc = gguf__buf_u64(&b, (uint64_t)w->n_kv);
  if (!rc) rc = gguf__buf_put(&b, w->kv.p, w->kv.len);
  if (!rc) rc = gguf__write_infos(w, &b);
  if (!rc && w->n_tensors) rc = gguf__buf_zeros(&b, gguf__pad(b.len, w->alignment));
  if (!rc) rc = gguf__write_data(w, &b);
  if (rc) {
    free(b.p);
    return rc;
  }
  *buf = b.p;
  *size = b.len;
  return 0;
}

int gguf_writer_save(gguf_writer_t *w, const char *path) {
  uint8_t *buf;
  size_t size;
  int rc = gguf_writer_finish(w, &buf, &size);
  if (rc) return rc;
  FILE *f = fopen(path, "wb");
  if (!f) {
    free(buf);
    return qe_errf(QE_EIO, "gguf_write: cannot create '%s'", path);
  }
  size_t put = fwrite(buf, 1, size, f);
  int closed = fclose(f);
  free(buf);
  if (put != size || closed != 0) return qe_errf(QE_EIO, "gguf_write: cannot write '%s'", path);
  return 0;
}
