/* gguf_write: builds small GGUF v3 files in memory (tests, fuzz seeds, random models).
 * Not thread-safe; one writer per file. All functions return 0 or a QE_E* code. */
#ifndef QE_GGUF_WRITE_H
#define QE_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

typedef struct gguf_writer gguf_writer_t;

int gguf_writer_create(gguf_writer_t **out);
void gguf_writer_destroy(gguf_writer_t *w);
int gguf_writer_add_u32(gguf_writer_t *w, const char *key, uint32_t v);
int gguf_writer_add_f32(gguf_writer_t *w, const char *key, float v);
int gguf_writer_add_bool(gguf_writer_t *w, const char *key, int v);
int gguf_writer_add_str(gguf_writer_t *w, const char *key, const char *v);
int gguf_writer_add_str_arr(gguf_writer_t *w, const char *key, const char *const *v, size_t n);
int gguf_writer_add_f32_arr(gguf_writer_t *w, const char *key, const float *v, size_t n);
int gguf_writer_add_i32_arr(gguf_writer_t *w, const char *key, const int32_t *v, size_t n);
/* Any numeric or bool scalar: `type` is a gguf_vtype_t, v points at its little-endian bytes
 * (1, 2, 4 or 8 of them; bool is one byte 0/1). Used to round-trip every metadata type. */
int gguf_writer_add_scalar(gguf_writer_t *w, const char *key, int type, const void *v);
/* An array of n numeric or bool elements of elem_type (v: n packed little-endian elements). */
int gguf_writer_add_arr(gguf_writer_t *w, const char *key, int elem_type, const void *v, size_t n);
/* Writes `general.alignment` (u32) and lays tensor data out at that power-of-two alignment
 * instead of the default 32. */
int gguf_writer_set_alignment(gguf_writer_t *w, uint32_t alignment);
/* Adds a tensor with raw data already in `type`'s encoding (copied). ne[0] is the row length. */
int gguf_writer_add_tensor(gguf_writer_t *w, const char *name, int type, int n_dims,
                           const int64_t *ne, const void *data, size_t nbytes);
/* Serializes to a malloc'd buffer (*buf owned by caller, free()). */
int gguf_writer_finish(gguf_writer_t *w, uint8_t **buf, size_t *size);
/* Serializes straight to a file. */
int gguf_writer_save(gguf_writer_t *w, const char *path);

#endif
