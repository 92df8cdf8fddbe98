/* gguf: the GGUF v2/v3 reader. One pass over the header, the metadata and the tensor infos,
 * checking every count, length, type, dimension, offset and size against the file with
 * overflow-safe arithmetic, so that hostile files fail with a specific qe_errf() line and
 * never read out of bounds. Keys and tensor names are copied (NUL-terminated) into one
 * arena and hashed for O(1) lookup and duplicate detection; the strings of string arrays
 * are indexed at open so gguf_arr_str() is O(1). Values and tensor data stay in the file
 * (mmap'd read-only, or the caller's buffer). Layout (little-endian):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { string key, u32 type, value },
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset },
 *   padding to `general.alignment` (default 32), tensor data (offsets relative to here).
 * A string is u64 length + bytes; an array is u32 element type + u64 count + elements. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qe_status.h"

#define GGUF__KV_MIN_BYTES  14    /* key length (8) + 1-byte key + type (4) + 1-byte value */
#define GGUF__TI_MIN_BYTES  33    /* name length + 1-byte name + n_dims + ne[0] + type + offset */
#define GGUF__MAX_NAME      65535 /* longest key or tensor name accepted */
#define GGUF__MAX_ELEMS     (1ull << 40) /* per tensor */
#define GGUF__SHOW          96           /* longest name quoted in an error line */
#define GGUF__DEFAULT_ALIGN 32

typedef struct {
  const char *key;     /* in g->names */
  size_t key_off;      /* offset of key in g->names (while the arena may still move) */
  int type;            /* gguf_vtype_t */
  int elem_type;       /* arrays: element type */
  uint64_t n;          /* string length, or array element count */
  const uint8_t *data; /* scalar / string bytes / array elements (in the file) */
  size_t str_first;    /* string arrays: index of element 0 in g->strs */
} gguf__kv_t;

typedef struct {
  gguf_tensor_t pub;
  size_t name_off;
  uint64_t offset; /* relative to the data section */
} gguf__tensor_t;

typedef struct {
  const char *name;
  int idx;
} gguf__slot_t;

typedef struct {
  gguf__slot_t *slots; /* capacity mask + 1 (power of two), name NULL when empty */
  size_t mask;
} gguf__index_t;

struct gguf {
  const uint8_t *base;
  size_t size;
  int mapped;
  uint32_t version;
  uint32_t alignment;
  uint64_t data_start;
  int n_kv, n_tensors;
  gguf__kv_t *kv;          /* [n_kv] */
  gguf__tensor_t *tensors; /* [n_tensors] */
  char *names;             /* arena of NUL-terminated keys and tensor names */
  size_t names_len, names_cap;
  const uint8_t **strs; /* [n_strs]: each string-array element's length prefix */
  size_t n_strs, strs_cap;
  gguf__index_t kv_index, t_index;
};

typedef struct {
  const uint8_t *p;
  size_t size, pos;
} gguf__cur_t;

/* ---- small readers ---------------------------------------------------------------------- */

static uint32_t gguf__u32(const uint8_t *p) {
  uint32_t v = 0;
  memcpy(&v, p, 4);
  return v;
}

static uint64_t gguf__u64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static size_t gguf__left(const gguf__cur_t *c) { return c->size - c->pos; }

/* 0 when n bytes are left at the cursor, else the error naming who's `what` (and a suffix). */
static int gguf__need(const gguf__cur_t *c, size_t n, const char *who, const char *what,
                      const char *sfx) {
  if (gguf__left(c) >= n) return 0;
  return qe_errf(QE_EFORMAT, "gguf: file truncated in %s%s%s at offset %zu (size %zu)", who, what,
                 sfx, c->pos, c->size);
}

/* Reads a u32 / u64 field named `what` (for the error line). */
static int gguf__rd_u32(gguf__cur_t *c, uint32_t *v, const char *what, const char *who) {
  int rc = gguf__need(c, 4, who, what, "");
  if (rc) return rc;
  *v = gguf__u32(c->p + c->pos);
  c->pos += 4;
  return 0;
}

static int gguf__rd_u64(gguf__cur_t *c, uint64_t *v, const char *what, const char *who) {
  int rc = gguf__need(c, 8, who, what, "");
  if (rc) return rc;
  *v = gguf__u64(c->p + c->pos);
  c->pos += 8;
  return 0;
}

/* Reads a string (u64 length + bytes) without copying. */
static int gguf__rd_str(gguf__cur_t *c, const uint8_t **s, uint64_t *len, const char *who) {
  int rc = gguf__rd_u64(c, len, "string length", who);
  if (rc) return rc;
  if (*len > gguf__left(c))
    return qe_errf(QE_EFORMAT,
                   "gguf: %sstring length %llu at offset %zu runs past the end of the file "
                   "(size %zu)",
                   who, (unsigned long long)*len, c->pos - 8, c->size);
  *s = c->p + c->pos;
  c->pos += (size_t)*len;
  return 0;
}

static int gguf__show_len(uint64_t len) { return (int)(len > GGUF__SHOW ? GGUF__SHOW : len); }

/* ---- value types ------------------------------------------------------------------------ */

static const char *const gguf__vt_names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                             "int32",  "float32", "bool",   "string", "array",
                                             "uint64", "int64",   "float64"};

static const char *gguf__vt_name(int t) {
  return t >= 0 && t <= GGUF_VT_FLOAT64 ? gguf__vt_names[t] : "?";
}

/* Bytes of one scalar of type t; 0 for string, array and unknown types. */
static size_t gguf__vt_size(int t) {
  static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return t >= 0 && t <= GGUF_VT_FLOAT64 ? sz[t] : 0;
}

static int gguf__vt_is_int(int t) {
  return t == GGUF_VT_UINT8 || t == GGUF_VT_INT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_INT16 ||
         t == GGUF_VT_UINT32 || t == GGUF_VT_INT32 || t == GGUF_VT_UINT64 || t == GGUF_VT_INT64;
}

/* ---- arena and string index ------------------------------------------------------------- */

/* Copies name[0..len) + NUL into the arena; *off receives its offset. */
static int gguf__arena_add(gguf_t *g, const uint8_t *name, size_t len, size_t *off) {
  if (g->names_cap - g->names_len < len + 1) {
    size_t cap = g->names_cap ? g->names_cap : 4096;
    while (cap - g->names_len < len + 1) cap *= 2;
    char *p = realloc(g->names, cap);
    if (!p) return qe_errf(QE_ENOMEM, "gguf: out of memory for names (%zu bytes)", cap);
    g->names = p;
    g->names_cap = cap;
  }
  memcpy(g->names + g->names_len, name, len);
  g->names[g->names_len + len] = '\0';
  *off = g->names_len;
  g->names_len += len + 1;
  return 0;
}

static int gguf__strs_push(gguf_t *g, const uint8_t *p) {
  if (g->n_strs == g->strs_cap) {
    size_t cap = g->strs_cap ? 2 * g->strs_cap : 1024;
    const uint8_t **s = realloc(g->strs, cap * sizeof *s);
    if (!s) return qe_errf(QE_ENOMEM, "gguf: out of memory indexing %zu strings", cap);
    g->strs = s;
    g->strs_cap = cap;
  }
  g->strs[g->n_strs++] = p;
  return 0;
}

/* Checks a key or tensor name read from the file. */
static int gguf__check_name(const uint8_t *s, uint64_t len, const char *kind, int i) {
  if (len == 0) return qe_errf(QE_EFORMAT, "gguf: %s #%d has an empty name", kind, i);
  if (len > GGUF__MAX_NAME)
    return qe_errf(QE_EFORMAT, "gguf: %s #%d name is %llu bytes long (max %d)", kind, i,
                   (unsigned long long)len, GGUF__MAX_NAME);
  if (memchr(s, 0, (size_t)len))
    return qe_errf(QE_EFORMAT, "gguf: %s #%d name '%.*s' contains a NUL byte", kind, i,
                   gguf__show_len(len), (const char *)s);
  return 0;
}

/* ---- hash index (keys, tensor names) ---------------------------------------------------- */

static uint64_t gguf__hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static int gguf__index_lookup(const gguf__index_t *ix, const char *name) {
  if (!ix->slots) return -1;
  for (size_t i = gguf__hash(name) & ix->mask;; i = (i + 1) & ix->mask) {
    if (!ix->slots[i].name) return -1;
    if (strcmp(ix->slots[i].name, name) == 0) return ix->slots[i].idx;
  }
}

/* Builds the index over names[0..n); *dup receives the earlier index of a repeated name
 * (QE_EFORMAT returned, detail left to the caller), else -1. */
static int gguf__index_build(gguf__index_t *ix, const char *const *names, size_t stride, int n,
                             int *dup_a, int *dup_b) {
  size_t cap = 8;
  while (cap < 2 * (size_t)n) cap *= 2;
  ix->slots = calloc(cap, sizeof *ix->slots);
  if (!ix->slots) return qe_errf(QE_ENOMEM, "gguf: out of memory for a %zu-slot index", cap);
  ix->mask = cap - 1;
  for (int k = 0; k < n; k++) {
    const char *name = *(const char *const *)((const char *)names + (size_t)k * stride);
    size_t i = gguf__hash(name) & ix->mask;
    for (; ix->slots[i].name; i = (i + 1) & ix->mask) {
      if (strcmp(ix->slots[i].name, name) == 0) {
        *dup_a = ix->slots[i].idx;
        *dup_b = k;
        return QE_EFORMAT;
      }
    }
    ix->slots[i].name = name;
    ix->slots[i].idx = k;
  }
  return 0;
}

/* ---- metadata --------------------------------------------------------------------------- */

static int gguf__check_bools(const uint8_t *p, uint64_t n, const uint8_t *key, uint64_t klen) {
  for (uint64_t i = 0; i < n; i++)
    if (p[i] > 1)
      return qe_errf(QE_EFORMAT, "gguf: key '%.*s': bool element %llu has value %u (not 0/1)",
                     gguf__show_len(klen), (const char *)key, (unsigned long long)i, p[i]);
  return 0;
}

/* Fast path of gguf__rd_str for the many strings of a vocabulary: 1 if the string fits. */
static int gguf__skip_str(gguf__cur_t *c) {
  if (gguf__left(c) < 8) return 0;
  uint64_t len = gguf__u64(c->p + c->pos);
  if (len > gguf__left(c) - 8) return 0;
  c->pos += 8 + (size_t)len;
  return 1;
}

/* Reads and indexes the kv->n strings of a string array. */
static int gguf__read_str_arr(gguf_t *g, gguf__cur_t *c, gguf__kv_t *kv, const uint8_t *key,
                              uint64_t klen) {
  kv->str_first = g->n_strs;
  for (uint64_t i = 0; i < kv->n; i++) {
    int rc = gguf__strs_push(g, c->p + c->pos);
    if (rc) return rc;
    if (!gguf__skip_str(c)) { /* redo it slowly for the error line */
      char who[GGUF__SHOW + 48];
      const uint8_t *s;
      uint64_t len;
      snprintf(who, sizeof who, "key '%.*s' element %llu: ", gguf__show_len(klen),
               (const char *)key, (unsigned long long)i);
      return gguf__rd_str(c, &s, &len, who);
    }
  }
  return 0;
}

/* Reads an array value (element type, count, elements) for key[0..klen). */
static int gguf__read_arr(gguf_t *g, gguf__cur_t *c, gguf__kv_t *kv, const uint8_t *key,
                          uint64_t klen, const char *who) {
  uint32_t et = 0;
  int rc = gguf__rd_u32(c, &et, "array element type", who);
  if (!rc) rc = gguf__rd_u64(c, &kv->n, "array length", who);
  if (rc) return rc;
  kv->elem_type = (int)et;
  if (et == GGUF_VT_ARRAY)
    return qe_errf(QE_EUNSUPPORTED, "gguf: %snested arrays are not supported", who);
  if (et > GGUF_VT_FLOAT64)
    return qe_errf(QE_EFORMAT, "gguf: %sunknown array element type %u", who, et);
  size_t esz = et == GGUF_VT_STRING ? 8 : gguf__vt_size((int)et);
  if (kv->n > gguf__left(c) / esz)
    return qe_errf(QE_EFORMAT,
                   "gguf: %sarray of %llu %s elements at offset %zu runs past the end of the "
                   "file (size %zu)",
                   who, (unsigned long long)kv->n, gguf__vt_name((int)et), c->pos, c->size);
  kv->data = c->p + c->pos;
  if (et == GGUF_VT_STRING) return gguf__read_str_arr(g, c, kv, key, klen);
  if (et == GGUF_VT_BOOL && (rc = gguf__check_bools(kv->data, kv->n, key, klen))) return rc;
  c->pos += (size_t)kv->n * esz;
  return 0;
}

/* Reads the value of kv (whose type is set) for key[0..klen). */
static int gguf__read_value(gguf_t *g, gguf__cur_t *c, gguf__kv_t *kv, const uint8_t *key,
                            uint64_t klen) {
  char who[GGUF__SHOW + 16];
  snprintf(who, sizeof who, "key '%.*s': ", gguf__show_len(klen), (const char *)key);
  if (kv->type == GGUF_VT_STRING) return gguf__rd_str(c, &kv->data, &kv->n, who);
  if (kv->type == GGUF_VT_ARRAY) return gguf__read_arr(g, c, kv, key, klen, who);
  size_t sz = gguf__vt_size(kv->type);
  if (sz == 0) return qe_errf(QE_EFORMAT, "gguf: %sunknown value type %d", who, kv->type);
  int rc = gguf__need(c, sz, who, gguf__vt_name(kv->type), " value");
  if (rc) return rc;
  kv->data = c->p + c->pos;
  kv->n = 1;
  if (kv->type == GGUF_VT_BOOL && kv->data[0] > 1)
    return qe_errf(QE_EFORMAT, "gguf: %sbool has value %u (not 0/1)", who, kv->data[0]);
  c->pos += sz;
  return 0;
}

/* Applies `general.alignment` (must be a power-of-two uint32). */
static int gguf__take_alignment(gguf_t *g, const gguf__kv_t *kv) {
  if (kv->type != GGUF_VT_UINT32)
    return qe_errf(QE_EFORMAT, "gguf: general.alignment has type %s (must be uint32)",
                   gguf__vt_name(kv->type));
  uint32_t a = gguf__u32(kv->data);
  if (a == 0 || (a & (a - 1)) != 0)
    return qe_errf(QE_EFORMAT, "gguf: general.alignment %u is not a power of two", a);
  g->alignment = a;
  return 0;
}

static int gguf__read_kv(gguf_t *g, gguf__cur_t *c, int i) {
  gguf__kv_t *kv = &g->kv[i];
  char who[32];
  const uint8_t *key;
  uint64_t klen = 0;
  uint32_t type = 0;
  snprintf(who, sizeof who, "key #%d ", i);
  int rc = gguf__rd_str(c, &key, &klen, who);
  if (!rc) rc = gguf__check_name(key, klen, "key", i);
  if (!rc) rc = gguf__arena_add(g, key, (size_t)klen, &kv->key_off);
  if (!rc) rc = gguf__rd_u32(c, &type, "value type", who);
  if (rc) return rc;
  kv->type = (int)type;
  kv->elem_type = -1;
  if (type > GGUF_VT_FLOAT64)
    return qe_errf(QE_EFORMAT, "gguf: key '%.*s' has unknown value type %u", gguf__show_len(klen),
                   (const char *)key, type);
  if ((rc = gguf__read_value(g, c, kv, key, klen))) return rc;
  if (klen == 17 && memcmp(key, "general.alignment", 17) == 0) return gguf__take_alignment(g, kv);
  return 0;
}

/* ---- tensor infos ----------------------------------------------------------------------- */

/* Reads n_dims and ne[], checking each dim > 0 and the element count <= 2^40. */
static int gguf__read_dims(gguf__cur_t *c, gguf_tensor_t *t, const char *who) {
  uint32_t nd = 0;
  int rc = gguf__rd_u32(c, &nd, "n_dims", who);
  if (rc) return rc;
  if (nd < 1 || nd > GGUF_MAX_DIMS)
    return qe_errf(QE_EFORMAT, "gguf: %shas %u dimensions (must be 1..%d)", who, nd, GGUF_MAX_DIMS);
  t->n_dims = (int)nd;
  uint64_t total = 1;
  for (int d = 0; d < GGUF_MAX_DIMS; d++) {
    uint64_t ne = 1;
    if (d < (int)nd && (rc = gguf__rd_u64(c, &ne, "dimensions", who))) return rc;
    if (ne == 0) return qe_errf(QE_EFORMAT, "gguf: %sdimension %d is 0", who, d);
    if (ne > GGUF__MAX_ELEMS / total)
      return qe_errf(QE_EFORMAT, "gguf: %sdimension %d (%llu) makes more than 2^40 elements", who,
                     d, (unsigned long long)ne);
    total *= ne;
    t->ne[d] = (int64_t)ne;
  }
  t->n_elems = (int64_t)total;
  return 0;
}

/* ggml names of types qevict does not support, for error lines. */
static const char *gguf__ggml_type_name(uint32_t t) {
  static const char *const n[] = {
      [6] = "Q5_0",    [7] = "Q5_1",     [9] = "Q8_1",    [10] = "Q2_K",    [11] = "Q3_K",
      [15] = "Q8_K",   [16] = "IQ2_XXS", [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S",
      [20] = "IQ4_NL", [21] = "IQ3_S",   [22] = "IQ2_S",  [23] = "IQ4_XS",  [24] = "I8",
      [25] = "I16",    [26] = "I32",     [27] = "I64",    [28] = "F64",     [29] = "IQ1_M",
      [34] = "TQ1_0",  [35] = "TQ2_0",   [39] = "MXFP4"};
  if (gguf_type_block((int)t)) return gguf_type_name((int)t);
  return t < sizeof n / sizeof n[0] && n[t] ? n[t] : "unknown";
}

static int gguf__read_type(gguf__cur_t *c, gguf_tensor_t *t, const char *who) {
  uint32_t type = 0;
  int rc = gguf__rd_u32(c, &type, "type", who);
  if (rc) return rc;
  int block = gguf_type_block((int)type);
  if (type > INT_MAX || block == 0)
    return qe_errf(QE_EUNSUPPORTED, "gguf: %shas type %u (%s), which is not supported", who, type,
                   gguf__ggml_type_name(type));
  t->type = (int)type;
  if (t->ne[0] % block != 0)
    return qe_errf(QE_EFORMAT, "gguf: %srow length %lld is not a multiple of the %s block (%d)",
                   who, (long long)t->ne[0], gguf_type_name(t->type), block);
  t->nbytes = gguf_type_nbytes(t->type, t->n_elems);
  return 0;
}

static int gguf__read_tensor_info(gguf_t *g, gguf__cur_t *c, int i) {
  gguf__tensor_t *t = &g->tensors[i];
  char who[GGUF__SHOW + 16];
  const uint8_t *name;
  uint64_t len = 0;
  snprintf(who, sizeof who, "tensor #%d ", i);
  int rc = gguf__rd_str(c, &name, &len, who);
  if (!rc) rc = gguf__check_name(name, len, "tensor", i);
  if (!rc) rc = gguf__arena_add(g, name, (size_t)len, &t->name_off);
  if (rc) return rc;
  snprintf(who, sizeof who, "tensor '%.*s' ", gguf__show_len(len), (const char *)name);
  if ((rc = gguf__read_dims(c, &t->pub, who)) || (rc = gguf__read_type(c, &t->pub, who)) ||
      (rc = gguf__rd_u64(c, &t->offset, "offset", who)))
    return rc;
  if (t->offset % g->alignment != 0)
    return qe_errf(QE_EFORMAT, "gguf: %sdata offset %llu is not a multiple of the alignment %u",
                   who, (unsigned long long)t->offset, g->alignment);
  return 0;
}

/* Places the data section and checks every tensor's bytes lie inside the file. */
static int gguf__place_data(gguf_t *g, size_t info_end) {
  g->data_start = ((uint64_t)info_end + g->alignment - 1) & ~(uint64_t)(g->alignment - 1);
  if (g->n_tensors == 0) return 0;
  if (g->data_start > g->size)
    return qe_errf(QE_EFORMAT,
                   "gguf: data section starts at %llu, past the end of the file (size %zu)",
                   (unsigned long long)g->data_start, g->size);
  uint64_t room = g->size - g->data_start;
  for (int i = 0; i < g->n_tensors; i++) {
    gguf__tensor_t *t = &g->tensors[i];
    if (t->offset > room || t->pub.nbytes > room - t->offset)
      return qe_errf(QE_EFORMAT,
                     "gguf: tensor '%.*s' data [%llu, %llu) lies outside the file "
                     "(size %zu)",
                     (int)strnlen(g->names + t->name_off, GGUF__SHOW), g->names + t->name_off,
                     (unsigned long long)(g->data_start + t->offset),
                     (unsigned long long)(g->data_start + t->offset + t->pub.nbytes), g->size);
    t->pub.data = g->base + g->data_start + t->offset;
  }
  return 0;
}

/* ---- header and whole-file parse -------------------------------------------------------- */

static int gguf__read_version(gguf_t *g, gguf__cur_t *c) {
  uint32_t v = 0;
  int rc = gguf__rd_u32(c, &v, "version", "header ");
  if (rc) return rc;
  g->version = v;
  if (v == 0x02000000u || v == 0x03000000u)
    return qe_errf(QE_EUNSUPPORTED, "gguf: big-endian GGUF files are not supported");
  if (v == 0) return qe_errf(QE_EFORMAT, "gguf: bad version 0");
  if (v < 2 || v > 3)
    return qe_errf(QE_EUNSUPPORTED, "gguf: version %u is not supported (only 2 and 3)", v);
  return 0;
}

/* Reads and sanity-checks n_tensors and n_kv against what the file could hold. */
static int gguf__read_counts(gguf_t *g, gguf__cur_t *c) {
  uint64_t nt = 0, nkv = 0;
  int rc = gguf__rd_u64(c, &nt, "tensor count", "header ");
  if (!rc) rc = gguf__rd_u64(c, &nkv, "metadata count", "header ");
  if (rc) return rc;
  uint64_t room = gguf__left(c);
  if (nkv > room / GGUF__KV_MIN_BYTES || nkv > INT_MAX)
    return qe_errf(QE_EFORMAT,
                   "gguf: header claims %llu metadata keys, more than the file "
                   "(size %zu) can hold",
                   (unsigned long long)nkv, c->size);
  if (nt > room / GGUF__TI_MIN_BYTES || nt > INT_MAX)
    return qe_errf(QE_EFORMAT,
                   "gguf: header claims %llu tensors, more than the file "
                   "(size %zu) can hold",
                   (unsigned long long)nt, c->size);
  if (nkv * GGUF__KV_MIN_BYTES + nt * GGUF__TI_MIN_BYTES > room)
    return qe_errf(QE_EFORMAT,
                   "gguf: header claims %llu keys and %llu tensors, more than "
                   "the file (size %zu) can hold",
                   (unsigned long long)nkv, (unsigned long long)nt, c->size);
  g->n_kv = (int)nkv;
  g->n_tensors = (int)nt;
  return 0;
}

static int gguf__read_header(gguf_t *g, gguf__cur_t *c) {
  if (c->size < 4 || memcmp(c->p, "GGUF", 4) != 0)
    return qe_errf(QE_EFORMAT, "gguf: bad magic (not a GGUF file; size %zu)", c->size);
  c->pos = 4;
  int rc = gguf__read_version(g, c);
  return rc ? rc : gguf__read_counts(g, c);
}

/* Sets the name pointers (the arena no longer moves) and builds both hash indexes. */
static int gguf__finish_names(gguf_t *g) {
  int a = -1, b = -1, rc;
  for (int i = 0; i < g->n_kv; i++) g->kv[i].key = g->names + g->kv[i].key_off;
  for (int i = 0; i < g->n_tensors; i++) g->tensors[i].pub.name = g->names + g->tensors[i].name_off;
  rc = gguf__index_build(&g->kv_index, &g->kv[0].key, sizeof g->kv[0], g->n_kv, &a, &b);
  if (rc == QE_EFORMAT)
    return qe_errf(rc, "gguf: duplicate key '%.*s' (entries #%d and #%d)",
                   (int)strnlen(g->kv[b].key, GGUF__SHOW), g->kv[b].key, a, b);
  if (rc) return rc;
  rc = gguf__index_build(&g->t_index, &g->tensors[0].pub.name, sizeof g->tensors[0], g->n_tensors,
                         &a, &b);
  if (rc == QE_EFORMAT)
    return qe_errf(rc, "gguf: duplicate tensor name '%.*s' (tensors #%d and #%d)",
                   (int)strnlen(g->tensors[b].pub.name, GGUF__SHOW), g->tensors[b].pub.name, a, b);
  return rc;
}

static int gguf__parse(gguf_t *g) {
  gguf__cur_t c = {g->base, g->size, 0};
  int rc = gguf__read_header(g, &c);
  if (rc) return rc;
  g->kv = calloc((size_t)g->n_kv + 1, sizeof *g->kv);
  g->tensors = calloc((size_t)g->n_tensors + 1, sizeof *g->tensors);
  if (!g->kv || !g->tensors)
    return qe_errf(QE_ENOMEM, "gguf: out of memory for %d keys and %d tensors", g->n_kv,
                   g->n_tensors);
  for (int i = 0; i < g->n_kv; i++)
    if ((rc = gguf__read_kv(g, &c, i))) return rc;
  for (int i = 0; i < g->n_tensors; i++)
    if ((rc = gguf__read_tensor_info(g, &c, i))) return rc;
  if ((rc = gguf__place_data(g, c.pos))) return rc;
  return gguf__finish_names(g);
}

/* ---- open / close ----------------------------------------------------------------------- */

static int gguf__open_common(const void *data, size_t size, int mapped, gguf_t **out) {
  *out = NULL;
  gguf_t *g = calloc(1, sizeof *g);
  if (!g) return qe_errf(QE_ENOMEM, "gguf: out of memory");
  g->base = data;
  g->size = size;
  g->alignment = GGUF__DEFAULT_ALIGN;
  int rc = gguf__parse(g);
  g->mapped = mapped; /* set after parse: a failed open leaves the unmapping to the caller */
  if (rc) {
    g->mapped = 0;
    gguf_close(g);
    return rc;
  }
  *out = g;
  return 0;
}

int gguf_open_mem(const void *data, size_t size, gguf_t **out) {
  if (!out || (!data && size)) return qe_errf(QE_EINVAL, "gguf: gguf_open_mem: bad arguments");
  return gguf__open_common(data ? data : "", size, 0, out);
}

/* Maps path read-only; *size 0 with *p NULL for an empty file. */
static int gguf__map(const char *path, void **p, size_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return qe_errf(QE_EIO, "gguf: cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  int rc = 0;
  *p = NULL;
  *size = 0;
  if (fstat(fd, &st) != 0)
    rc = qe_errf(QE_EIO, "gguf: cannot stat '%s': %s", path, strerror(errno));
  else if (!S_ISREG(st.st_mode))
    rc = qe_errf(QE_EIO, "gguf: '%s' is not a regular file", path);
  else if (st.st_size > 0) {
    *size = (size_t)st.st_size;
    *p = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (*p == MAP_FAILED) {
      *p = NULL;
      rc = qe_errf(QE_EIO, "gguf: cannot map '%s': %s", path, strerror(errno));
    }
  }
  close(fd);
  return rc;
}

int gguf_open(const char *path, gguf_t **out) {
  if (!path || !out) return qe_errf(QE_EINVAL, "gguf: gguf_open: bad arguments");
  *out = NULL;
  void *p = NULL;
  size_t size = 0;
  int rc = gguf__map(path, &p, &size);
  if (rc) return rc;
  rc = gguf__open_common(p ? p : "", size, p != NULL, out);
  if (rc) {
    char msg[512];
    const char *m = qe_errmsg();
    snprintf(msg, sizeof msg, "%s", strncmp(m, "gguf: ", 6) == 0 ? m + 6 : m);
    if (p) munmap(p, size);
    return qe_errf(rc, "gguf: %s: %s", path, msg);
  }
  return 0;
}

void gguf_close(gguf_t *g) {
  if (!g) return;
  if (g->mapped) munmap((void *)g->base, g->size);
  free(g->kv_index.slots);
  free(g->t_index.slots);
  free(g->strs);
  free(g->names);
  free(g->tensors);
  free(g->kv);
  free(g);
}

uint32_t gguf_version(const gguf_t *g) { return g->version; }
size_t gguf_file_size(const gguf_t *g) { return g->size; }

/* ---- metadata getters ------------------------------------------------------------------- */

int gguf_n_kv(const gguf_t *g) { return g->n_kv; }

const char *gguf_key(const gguf_t *g, int i) { return i >= 0 && i < g->n_kv ? g->kv[i].key : NULL; }

int gguf_kv_type(const gguf_t *g, int i) { return i >= 0 && i < g->n_kv ? g->kv[i].type : -1; }

int gguf_find_key(const gguf_t *g, const char *key) {
  return key ? gguf__index_lookup(&g->kv_index, key) : -1;
}

static int gguf__get(const gguf_t *g, const char *key, int want, const gguf__kv_t **kv) {
  int i = gguf_find_key(g, key);
  if (i < 0) return qe_errf(QE_ENOTFOUND, "gguf: key '%s' not found", key ? key : "(null)");
  *kv = &g->kv[i];
  if (want >= 0 && (*kv)->type != want)
    return qe_errf(QE_EFORMAT, "gguf: key '%s' has type %s, wanted %s", key,
                   gguf__vt_name((*kv)->type), gguf__vt_name(want));
  return 0;
}

/* An integer element: *neg set when it is a negative signed value (then *mag = -value). */
static void gguf__int_at(int type, const uint8_t *p, int *neg, uint64_t *mag) {
  int64_t s = 0;
  uint64_t u = 0;
  int is_signed = 1;
  switch (type) {
  case GGUF_VT_UINT8:
    u = p[0];
    is_signed = 0;
    break;
  case GGUF_VT_INT8:
    s = (int8_t)p[0];
    break;
  case GGUF_VT_UINT16:
    u = (uint16_t)(p[0] | p[1] << 8);
    is_signed = 0;
    break;
  case GGUF_VT_INT16:
    s = (int16_t)(uint16_t)(p[0] | p[1] << 8);
    break;
  case GGUF_VT_UINT32:
    u = gguf__u32(p);
    is_signed = 0;
    break;
  case GGUF_VT_INT32:
    s = (int32_t)gguf__u32(p);
    break;
  case GGUF_VT_UINT64:
    u = gguf__u64(p);
    is_signed = 0;
    break;
  default:
    s = (int64_t)gguf__u64(p);
    break;
  }
  *neg = is_signed && s < 0;
  *mag = !is_signed ? u : s < 0 ? 0 - (uint64_t)s : (uint64_t)s;
}

/* Converts a numeric element to int64; floats must be integral. */
static int gguf__to_i64(int type, const uint8_t *p, int64_t *out, const char *what) {
  if (type == GGUF_VT_FLOAT32 || type == GGUF_VT_FLOAT64) {
    double d;
    float f;
    if (type == GGUF_VT_FLOAT64) {
      memcpy(&d, p, 8);
    } else {
      memcpy(&f, p, 4);
      d = f;
    }
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != floor(d))
      return qe_errf(QE_EFORMAT, "gguf: %s: %g is not an int64", what, d);
    *out = (int64_t)d;
    return 0;
  }
  if (!gguf__vt_is_int(type))
    return qe_errf(QE_EFORMAT, "gguf: %s has type %s, not a number", what, gguf__vt_name(type));
  int neg;
  uint64_t mag;
  gguf__int_at(type, p, &neg, &mag);
  if (!neg && mag > INT64_MAX)
    return qe_errf(QE_EFORMAT, "gguf: %s: %llu does not fit in int64", what,
                   (unsigned long long)mag);
  *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
  return 0;
}

static int gguf__to_f32(int type, const uint8_t *p, float *out, const char *what) {
  if (type == GGUF_VT_FLOAT32) {
    memcpy(out, p, 4);
    return 0;
  }
  if (type == GGUF_VT_FLOAT64) {
    double d;
    memcpy(&d, p, 8);
    *out = (float)d;
    return 0;
  }
  if (!gguf__vt_is_int(type))
    return qe_errf(QE_EFORMAT, "gguf: %s has type %s, not a number", what, gguf__vt_name(type));
  int neg;
  uint64_t mag;
  gguf__int_at(type, p, &neg, &mag);
  *out = neg ? -(float)mag : (float)mag;
  return 0;
}

/* Looks up key and requires an integer type. */
static int gguf__get_int(const gguf_t *g, const char *key, const gguf__kv_t **kv) {
  int rc = gguf__get(g, key, -1, kv);
  if (rc) return rc;
  if (!gguf__vt_is_int((*kv)->type))
    return qe_errf(QE_EFORMAT, "gguf: key '%s' has type %s, wanted an integer", key,
                   gguf__vt_name((*kv)->type));
  return 0;
}

int gguf_get_u32(const gguf_t *g, const char *key, uint32_t *out) {
  const gguf__kv_t *kv = NULL;
  int rc = gguf__get_int(g, key, &kv);
  if (rc) return rc;
  int neg;
  uint64_t mag;
  gguf__int_at(kv->type, kv->data, &neg, &mag);
  if (neg || mag > UINT32_MAX)
    return qe_errf(QE_EFORMAT, "gguf: key '%s' value %s%llu does not fit in uint32", key,
                   neg ? "-" : "", (unsigned long long)mag);
  *out = (uint32_t)mag;
  return 0;
}

int gguf_get_i64(const gguf_t *g, const char *key, int64_t *out) {
  const gguf__kv_t *kv = NULL;
  int rc = gguf__get_int(g, key, &kv);
  if (rc) return rc;
  char what[GGUF__SHOW + 8];
  snprintf(what, sizeof what, "key '%.*s'", (int)strnlen(key, GGUF__SHOW), key);
  return gguf__to_i64(kv->type, kv->data, out, what);
}

int gguf_get_f32(const gguf_t *g, const char *key, float *out) {
  const gguf__kv_t *kv = NULL;
  int rc = gguf__get(g, key, -1, &kv);
  if (rc) return rc;
  if (kv->type == GGUF_VT_ARRAY || kv->type == GGUF_VT_STRING || kv->type == GGUF_VT_BOOL)
    return qe_errf(QE_EFORMAT, "gguf: key '%s' has type %s, wanted a number", key,
                   gguf__vt_name(kv->type));
  return gguf__to_f32(kv->type, kv->data, out, key);
}

int gguf_get_bool(const gguf_t *g, const char *key, int *out) {
  const gguf__kv_t *kv = NULL;
  int rc = gguf__get(g, key, GGUF_VT_BOOL, &kv);
  if (rc) return rc;
  *out = kv->data[0] != 0;
  return 0;
}

int gguf_get_str(const gguf_t *g, const char *key, const char **s, size_t *len) {
  const gguf__kv_t *kv = NULL;
  int rc = gguf__get(g, key, GGUF_VT_STRING, &kv);
  if (rc) return rc;
  *s = (const char *)kv->data;
  *len = (size_t)kv->n;
  return 0;
}

int gguf_get_arr(const gguf_t *g, const char *key, gguf_arr_t *out) {
  const gguf__kv_t *kv = NULL;
  int rc = gguf__get(g, key, GGUF_VT_ARRAY, &kv);
  if (rc) return rc;
  out->elem_type = kv->elem_type;
  out->n = (size_t)kv->n;
  out->data = kv->data;
  out->owner = g;
  out->key_index = (int)(kv - g->kv);
  return 0;
}

static int gguf__arr_check(const gguf_arr_t *a, size_t i) {
  if (!a || !a->owner || a->key_index < 0 || a->key_index >= a->owner->n_kv)
    return qe_errf(QE_EINVAL, "gguf: array handle not from gguf_get_arr");
  if (i >= a->n)
    return qe_errf(QE_ERANGE, "gguf: index %zu past the end of array '%s' (%zu elements)", i,
                   a->owner->kv[a->key_index].key, a->n);
  return 0;
}

int gguf_arr_str(const gguf_arr_t *a, size_t i, const char **s, size_t *len) {
  int rc = gguf__arr_check(a, i);
  if (rc) return rc;
  const gguf__kv_t *kv = &a->owner->kv[a->key_index];
  if (kv->elem_type != GGUF_VT_STRING)
    return qe_errf(QE_EFORMAT, "gguf: array '%s' holds %s, not strings", kv->key,
                   gguf__vt_name(kv->elem_type));
  const uint8_t *p = a->owner->strs[kv->str_first + i];
  *len = (size_t)gguf__u64(p);
  *s = (const char *)p + 8;
  return 0;
}

int gguf_arr_f32(const gguf_arr_t *a, size_t i, float *out) {
  int rc = gguf__arr_check(a, i);
  if (rc) return rc;
  const gguf__kv_t *kv = &a->owner->kv[a->key_index];
  if (kv->elem_type == GGUF_VT_STRING || kv->elem_type == GGUF_VT_BOOL)
    return qe_errf(QE_EFORMAT, "gguf: array '%s' holds %s, not numbers", kv->key,
                   gguf__vt_name(kv->elem_type));
  return gguf__to_f32(kv->elem_type, kv->data + i * gguf__vt_size(kv->elem_type), out, kv->key);
}

int gguf_arr_i64(const gguf_arr_t *a, size_t i, int64_t *out) {
  int rc = gguf__arr_check(a, i);
  if (rc) return rc;
  const gguf__kv_t *kv = &a->owner->kv[a->key_index];
  char what[GGUF__SHOW + 48];
  snprintf(what, sizeof what, "array '%.*s' element %zu", (int)strnlen(kv->key, GGUF__SHOW),
           kv->key, i);
  if (kv->elem_type == GGUF_VT_STRING || kv->elem_type == GGUF_VT_BOOL)
    return qe_errf(QE_EFORMAT, "gguf: %s has type %s, not a number", what,
                   gguf__vt_name(kv->elem_type));
  return gguf__to_i64(kv->elem_type, kv->data + i * gguf__vt_size(kv->elem_type), out, what);
}

/* ---- tensors ---------------------------------------------------------------------------- */

int gguf_n_tensors(const gguf_t *g) { return g->n_tensors; }

const gguf_tensor_t *gguf_tensor(const gguf_t *g, int i) {
  return i >= 0 && i < g->n_tensors ? &g->tensors[i].pub : NULL;
}

const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name) {
  int i = name ? gguf__index_lookup(&g->t_index, name) : -1;
  return i < 0 ? NULL : &g->tensors[i].pub;
}
