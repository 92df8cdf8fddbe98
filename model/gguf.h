/* gguf: a hostile-input-safe reader for GGUF v2/v3 files (llama.cpp's model format).
 * Everything read is bounds-checked: magic, version, counts, string lengths, array sizes,
 * tensor dims, types, offsets and sizes inside the file, alignment. Errors come back as
 * QE_EFORMAT / QE_EUNSUPPORTED / QE_EIO with a qe_errf() detail naming what was wrong.
 * A gguf_t is immutable after open and safe to read from many threads. */
#ifndef QE_GGUF_H
#define QE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "qe_half.h"

/* Metadata value types (GGUF spec numbering). */
typedef enum {
  GGUF_VT_UINT8 = 0,
  GGUF_VT_INT8 = 1,
  GGUF_VT_UINT16 = 2,
  GGUF_VT_INT16 = 3,
  GGUF_VT_UINT32 = 4,
  GGUF_VT_INT32 = 5,
  GGUF_VT_FLOAT32 = 6,
  GGUF_VT_BOOL = 7,
  GGUF_VT_STRING = 8,
  GGUF_VT_ARRAY = 9,
  GGUF_VT_UINT64 = 10,
  GGUF_VT_INT64 = 11,
  GGUF_VT_FLOAT64 = 12
} gguf_vtype_t;

/* Tensor types (ggml numbering); only these are supported. */
typedef enum {
  GGUF_T_F32 = 0,
  GGUF_T_F16 = 1,
  GGUF_T_Q4_0 = 2,
  GGUF_T_Q4_1 = 3,
  GGUF_T_Q8_0 = 8,
  GGUF_T_Q4_K = 12,
  GGUF_T_Q5_K = 13,
  GGUF_T_Q6_K = 14,
  GGUF_T_BF16 = 30
} gguf_ttype_t;

#define GGUF_MAX_DIMS 4

typedef struct gguf gguf_t;

/* One tensor's description; `data` points into the mapped file. ne[0] is the fastest-varying
 * dimension (a row of a 2-D weight), as in ggml. */
typedef struct {
  const char *name; /* NUL-terminated copy owned by the gguf_t */
  int type;         /* gguf_ttype_t */
  int n_dims;
  int64_t ne[GGUF_MAX_DIMS]; /* unused dims are 1 */
  int64_t n_elems;
  const void *data;
  size_t nbytes;
} gguf_tensor_t;

/* An array value. For GGUF_VT_STRING elements use gguf_arr_str(). */
typedef struct {
  int elem_type; /* gguf_vtype_t of the elements (never ARRAY: nested arrays are refused) */
  size_t n;
  const void *data; /* raw little-endian elements for non-string types */
  const gguf_t *owner;
  int key_index;
} gguf_arr_t;

/* Opens and validates a file (mmap, read-only). *out owned by caller: gguf_close(). */
int gguf_open(const char *path, gguf_t **out);
/* Same over a caller-owned buffer that must outlive the gguf_t (used by the fuzzer and tests). */
int gguf_open_mem(const void *data, size_t size, gguf_t **out);
void gguf_close(gguf_t *g);

uint32_t gguf_version(const gguf_t *g);
size_t gguf_file_size(const gguf_t *g);

/* Metadata. Each getter returns QE_ENOTFOUND (with detail naming the key) if absent and
 * QE_EFORMAT if the stored type does not convert (integers convert when the value fits). */
int gguf_n_kv(const gguf_t *g);
const char *gguf_key(const gguf_t *g, int i);
int gguf_kv_type(const gguf_t *g, int i);
int gguf_find_key(const gguf_t *g, const char *key); /* index, or -1 */
int gguf_get_u32(const gguf_t *g, const char *key, uint32_t *out);
int gguf_get_i64(const gguf_t *g, const char *key, int64_t *out);
int gguf_get_f32(const gguf_t *g, const char *key, float *out);
int gguf_get_bool(const gguf_t *g, const char *key, int *out);
/* String values are not NUL-terminated in the file: (*s, *len). */
int gguf_get_str(const gguf_t *g, const char *key, const char **s, size_t *len);
int gguf_get_arr(const gguf_t *g, const char *key, gguf_arr_t *out);
/* i-th string of a string array, O(1) (strings are indexed at open). */
int gguf_arr_str(const gguf_arr_t *a, size_t i, const char **s, size_t *len);
/* i-th numeric element converted; QE_EFORMAT if the element type is not numeric. */
int gguf_arr_f32(const gguf_arr_t *a, size_t i, float *out);
int gguf_arr_i64(const gguf_arr_t *a, size_t i, int64_t *out);

/* Tensors. */
int gguf_n_tensors(const gguf_t *g);
const gguf_tensor_t *gguf_tensor(const gguf_t *g, int i);
const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name); /* NULL if absent */

/* Type helpers. gguf_type_name returns "?" for unknown types. */
const char *gguf_type_name(int type);
int gguf_type_block(int type);          /* elements per block; 0 for unknown */
size_t gguf_type_block_bytes(int type); /* bytes per block; 0 for unknown */
/* Bytes of n elements of type (n must be a multiple of the block size); 0 if invalid. */
size_t gguf_type_nbytes(int type, int64_t n);

/* Dequantizes n elements (a multiple of the block size) of `type` at src into dst (fp32). */
int gguf_dequant(int type, const void *src, float *dst, int64_t n);

/* 1 if every block of 32 elements of `type` is scale * code + offset with int8 codes: Q4_0,
 * Q4_1, Q8_0, Q4_K and Q5_K (whose sub-blocks are 32 wide). */
int gguf_type_has_blocks32(int type);
/* For such a type: n elements (a multiple of its block size) at src as codes code[n] and the
 * scale and offset of each block of 32 (scale[n / 32], offset[n / 32]), so that
 * fmaf(code, scale, offset) is gguf_dequant's value (to within its last bit where gguf_dequant
 * computes a multiply then an add). QE_EUNSUPPORTED for other types, QE_EINVAL for a bad n. */
int gguf_blocks32(int type, const void *src, int64_t n, int8_t *code, float *scale, float *offset);

/* fp16 conversions (exact, round-to-nearest-even for the float->half direction); the bf16 ones
 * are common/qe_half.h's qe_bf16_to_f32 / qe_f32_to_bf16. */
float qe_fp16_to_f32(uint16_t h);
uint16_t qe_f32_to_fp16(float f);

#endif
