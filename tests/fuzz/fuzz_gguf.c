/* fuzz_gguf: libFuzzer harness for the GGUF reader. Opens the input with gguf_open_mem and,
 * when it is accepted, walks everything a model load would touch: every key through the
 * getter for its type, every array element (strings via the O(1) index), every tensor by
 * index and by name, the first and last byte of its data and the dequantization of its
 * first and last block. Any out-of-bounds read trips ASan; broken invariants trap.
 * Build and run: see tests/fuzz/meson.build. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "qe_status.h"

#define FUZZ_REQUIRE(e)                                                                            \
  do {                                                                                             \
    if (!(e)) __builtin_trap();                                                                    \
  } while (0)

static const uint8_t *fz_base;
static size_t fz_size;

/* p[0..n) lies inside the input. */
static int fz_inside(const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)fz_base;
  return a >= b && a - b <= fz_size && n <= fz_size - (a - b);
}

static void fz_walk_array(const gguf_t *g, const char *key) {
  gguf_arr_t a;
  FUZZ_REQUIRE(gguf_get_arr(g, key, &a) == 0);
  for (size_t i = 0; i < a.n; i++) {
    const char *s;
    size_t len;
    float f;
    int64_t v;
    if (a.elem_type == GGUF_VT_STRING) {
      FUZZ_REQUIRE(gguf_arr_str(&a, i, &s, &len) == 0 && fz_inside(s, len));
    } else {
      int rf = gguf_arr_f32(&a, i, &f), ri = gguf_arr_i64(&a, i, &v);
      FUZZ_REQUIRE(rf == 0 || rf == QE_EFORMAT);
      FUZZ_REQUIRE(ri == 0 || ri == QE_EFORMAT);
    }
  }
  FUZZ_REQUIRE(a.n == 0 || gguf_arr_i64(&a, a.n, &(int64_t){0}) != 0);
}

static void fz_walk_kv(const gguf_t *g) {
  for (int i = 0; i < gguf_n_kv(g); i++) {
    const char *key = gguf_key(g, i), *s;
    size_t len;
    uint32_t u;
    int64_t v;
    float f;
    int b;
    FUZZ_REQUIRE(key && *key && gguf_find_key(g, key) == i);
    switch (gguf_kv_type(g, i)) {
    case GGUF_VT_STRING:
      FUZZ_REQUIRE(gguf_get_str(g, key, &s, &len) == 0 && fz_inside(s, len));
      break;
    case GGUF_VT_ARRAY:
      fz_walk_array(g, key);
      break;
    case GGUF_VT_BOOL:
      FUZZ_REQUIRE(gguf_get_bool(g, key, &b) == 0);
      break;
    default:
      (void)gguf_get_u32(g, key, &u);
      (void)gguf_get_i64(g, key, &v);
      FUZZ_REQUIRE(gguf_get_f32(g, key, &f) == 0);
      break;
    }
  }
}

static void fz_walk_tensors(const gguf_t *g) {
  static float y[256];
  for (int i = 0; i < gguf_n_tensors(g); i++) {
    const gguf_tensor_t *t = gguf_tensor(g, i);
    FUZZ_REQUIRE(t && gguf_find_tensor(g, t->name) == t);
    FUZZ_REQUIRE(t->nbytes == gguf_type_nbytes(t->type, t->n_elems) && t->nbytes > 0);
    FUZZ_REQUIRE(fz_inside(t->data, t->nbytes));
    int block = gguf_type_block(t->type);
    size_t bb = gguf_type_block_bytes(t->type);
    const uint8_t *d = t->data;
    FUZZ_REQUIRE(gguf_dequant(t->type, d, y, block) == 0);
    FUZZ_REQUIRE(gguf_dequant(t->type, d + t->nbytes - bb, y, block) == 0);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gguf_t *g = (gguf_t *)&g;
  fz_base = data;
  fz_size = size;
  int rc = gguf_open_mem(data, size, &g);
  if (rc != 0) {
    FUZZ_REQUIRE(g == NULL && *qe_errmsg() != '\0');
    FUZZ_REQUIRE(rc == QE_EFORMAT || rc == QE_EUNSUPPORTED);
    return 0;
  }
  FUZZ_REQUIRE(gguf_file_size(g) == size);
  fz_walk_kv(g);
  fz_walk_tensors(g);
  gguf_close(g);
  return 0;
}
