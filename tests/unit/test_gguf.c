/* test_gguf: the GGUF reader, writer and dequantization.
 * - fp16/bf16 conversions: all 65536 patterns, round-trips and round-to-nearest-even ties;
 * - dequantization of every type against gguf-py's, bit for bit (tests/fixtures/quant_ref.bin,
 *   a GGUF file made by tools/make_quant_fixture.py);
 * - writer -> reader round trip of every metadata type and every tensor type;
 * - hostile input: every proper prefix of a file, and one corruption per check, each failing
 *   with the right code and a detail line (run under ASan/UBSan in CI);
 * - the shared stories260K model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_write.h"
#include "qe_status.h"
#include "test_util.h"

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Same value bit for bit, or both NaN (NaN payload quieting may differ between converters). */
static int same_f32(float a, float b) {
  return f32_bits(a) == f32_bits(b) || (isnan(a) && isnan(b));
}

/* ---- fp16 / bf16 ------------------------------------------------------------------------ */

static void test_fp16_all(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = qe_fp16_to_f32((uint16_t)h);
#ifdef __FLT16_MAX__            /* compiler's own conversion as an independent reference */
    __extension__ _Float16 ref; /* (__extension__: ISO C has no _Float16) */
    uint16_t hb = (uint16_t)h;
    memcpy(&ref, &hb, 2);
    if (!same_f32(f, (float)ref)) bad++;
#endif
    int is_nan = ((h >> 10) & 31) == 31 && (h & 0x3ff);
    if (is_nan) {
      if (!isnan(f) || ((qe_f32_to_fp16(f) & 0x7e00) != 0x7e00)) bad++;
    } else if (qe_f32_to_fp16(f) != h) {
      bad++;
    }
  }
  CHECK(bad == 0);
  CHECK(qe_fp16_to_f32(0x0001) == ldexpf(1, -24));
  CHECK(qe_fp16_to_f32(0x03ff) == ldexpf(1023, -24));
  CHECK(qe_fp16_to_f32(0x7bff) == 65504.0f);
  CHECK(isinf(qe_fp16_to_f32(0xfc00)) && qe_fp16_to_f32(0xfc00) < 0);
}

/* Midpoints between neighbouring halves must round to the even one; a hair off must not. */
static void test_fp16_ties(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 0x7bff; h++) {
    double lo = qe_fp16_to_f32((uint16_t)h), hi = qe_fp16_to_f32((uint16_t)(h + 1));
    float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
    uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    if (qe_f32_to_fp16(mid) != even) bad++;
    if (qe_f32_to_fp16(nextafterf(mid, INFINITY)) != h + 1) bad++;
    if (qe_f32_to_fp16(nextafterf(mid, 0)) != h) bad++;
    if (qe_f32_to_fp16(-mid) != (even | 0x8000)) bad++;
#ifdef __FLT16_MAX__
    __extension__ _Float16 r = (_Float16)mid;
    uint16_t rb;
    memcpy(&rb, &r, 2);
    if (rb != even) bad++;
#endif
  }
  CHECK(bad == 0);
  CHECK(qe_f32_to_fp16(65519.99f) == 0x7bff);
  CHECK(qe_f32_to_fp16(65520.0f) == 0x7c00);
  CHECK(qe_f32_to_fp16(1e30f) == 0x7c00 && qe_f32_to_fp16(-INFINITY) == 0xfc00);
  CHECK(qe_f32_to_fp16(ldexpf(1, -25)) == 0);                     /* tie to even (0) */
  CHECK(qe_f32_to_fp16(nextafterf(ldexpf(1, -25), 1)) == 0x0001); /* just above the tie */
  CHECK(qe_f32_to_fp16(ldexpf(3, -25)) == 0x0002);                /* 1.5 ulp ties to 2 */
  CHECK(qe_f32_to_fp16(1e-30f) == 0 && qe_f32_to_fp16(-1e-30f) == 0x8000);
  CHECK((qe_f32_to_fp16(NAN) & 0x7fff) > 0x7c00);
}

static void test_bf16(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = qe_bf16_to_f32((uint16_t)h);
    if (f32_bits(f) != h << 16) bad++;
    if (!isnan(f) && qe_f32_to_bf16(f) != h) bad++;
  }
  CHECK(bad == 0);
  CHECK(qe_f32_to_bf16(bits_f32(0x3f808000)) == 0x3f80); /* tie, even stays */
  CHECK(qe_f32_to_bf16(bits_f32(0x3f818000)) == 0x3f82); /* tie, odd rounds up */
  CHECK(qe_f32_to_bf16(bits_f32(0x3f808001)) == 0x3f81);
  CHECK(qe_f32_to_bf16(bits_f32(0x7f7fffff)) == 0x7f80);           /* rounds to inf */
  CHECK((qe_f32_to_bf16(bits_f32(0x7f800001)) & 0x7fff) > 0x7f80); /* nan stays nan */
}

static void test_type_table(void) {
  CHECK(gguf_type_nbytes(GGUF_T_Q4_K, 256) == 144);
  CHECK(gguf_type_nbytes(GGUF_T_Q5_K, 512) == 352);
  CHECK(gguf_type_nbytes(GGUF_T_Q6_K, 256) == 210);
  CHECK(gguf_type_nbytes(GGUF_T_Q8_0, 64) == 68);
  CHECK(gguf_type_nbytes(GGUF_T_Q4_0, 32) == 18 && gguf_type_nbytes(GGUF_T_Q4_1, 32) == 20);
  CHECK(gguf_type_nbytes(GGUF_T_BF16, 3) == 6 && gguf_type_nbytes(GGUF_T_F32, 3) == 12);
  CHECK(gguf_type_nbytes(GGUF_T_Q4_K, 255) == 0 && gguf_type_nbytes(GGUF_T_F32, -1) == 0);
  CHECK(gguf_type_nbytes(6, 32) == 0 && gguf_type_block(6) == 0);
  CHECK(strcmp(gguf_type_name(GGUF_T_Q6_K), "Q6_K") == 0 && strcmp(gguf_type_name(99), "?") == 0);
  float y[32];
  uint8_t z[34] = {0};
  CHECK(gguf_dequant(GGUF_T_Q8_0, z, y, 31) == QE_EINVAL);
  CHECK(gguf_dequant(7, z, y, 32) == QE_EUNSUPPORTED);
}

/* ---- dequantization vs gguf-py ---------------------------------------------------------- */

static void check_fixture_type(const gguf_t *g, const char *type) {
  char qn[32], rn[32];
  snprintf(qn, sizeof qn, "q.%s", type);
  snprintf(rn, sizeof rn, "ref.%s", type);
  const gguf_tensor_t *q = gguf_find_tensor(g, qn), *r = gguf_find_tensor(g, rn);
  CHECK(q && r);
  if (!q || !r) return;
  CHECK(strcmp(gguf_type_name(q->type), type) == 0 && r->type == GGUF_T_F32);
  CHECK(q->n_elems == r->n_elems && q->ne[0] == r->ne[0] && q->ne[1] == r->ne[1]);
  float *y = malloc((size_t)q->n_elems * sizeof *y);
  CHECK_OK(gguf_dequant(q->type, q->data, y, q->n_elems));
  /* Both sides do the same fp32 operations in the same order (ggml's), so bitwise equality
   * is required; NaN (F16/BF16 inputs only) must match NaN. */
  const float *ref = r->data; /* 32-byte aligned in the file, which is page-aligned */
  int bad = 0;
  for (int64_t i = 0; i < q->n_elems; i++)
    if (!same_f32(y[i], ref[i])) {
      if (bad++ < 3)
        fprintf(stderr, "  %s[%lld] = %a, gguf-py says %a\n", type, (long long)i, y[i], ref[i]);
    }
  if (bad) fprintf(stderr, "%s: %d mismatches\n", type, bad);
  CHECK(bad == 0);
  free(y);
}

static void test_quant_fixture(void) {
  const char *path = tu_env_path("QE_FIXTURES", "quant_ref.bin");
  gguf_t *g = NULL;
  CHECK(path != NULL);
  if (!path) return;
  CHECK_OK(gguf_open(path, &g));
  if (!g) return;
  static const char *const types[] = {"F32",  "F16",  "BF16", "Q4_0", "Q4_1",
                                      "Q8_0", "Q4_K", "Q5_K", "Q6_K"};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) check_fixture_type(g, types[i]);
  gguf_close(g);
}

/* ---- round trip ------------------------------------------------------------------------- */

/* Fills n bytes with xorshift noise. */
static void fill_random(uint8_t *p, size_t n, uint64_t *s) {
  for (size_t i = 0; i < n; i++) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    p[i] = (uint8_t)(*s >> 32);
  }
}

static const int all_types[] = {GGUF_T_F32,  GGUF_T_F16,  GGUF_T_BF16, GGUF_T_Q4_0, GGUF_T_Q4_1,
                                GGUF_T_Q8_0, GGUF_T_Q4_K, GGUF_T_Q5_K, GGUF_T_Q6_K};
#define N_TYPES ((int)(sizeof all_types / sizeof all_types[0]))

static void tensor_shape(int k, int64_t *ne, int *nd) {
  *nd = 1 + k % 4;
  ne[0] = gguf_type_block(all_types[k]) * (1 + k % 3);
  ne[1] = 2 + k % 2;
  ne[2] = 3;
  ne[3] = 2;
}

static void add_all_tensors(gguf_writer_t *w, uint64_t seed) {
  for (int k = 0; k < N_TYPES; k++) {
    int64_t ne[4];
    int nd;
    char name[32];
    tensor_shape(k, ne, &nd);
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= ne[d];
    size_t nb = gguf_type_nbytes(all_types[k], n);
    uint8_t *data = malloc(nb);
    fill_random(data, nb, &seed);
    snprintf(name, sizeof name, "t.%s", gguf_type_name(all_types[k]));
    CHECK_OK(gguf_writer_add_tensor(w, name, all_types[k], nd, ne, data, nb));
    free(data);
  }
}

static void check_all_tensors(const gguf_t *g, uint64_t seed, uint32_t align) {
  CHECK(gguf_n_tensors(g) == N_TYPES);
  for (int k = 0; k < N_TYPES; k++) {
    int64_t ne[4];
    int nd;
    char name[32];
    tensor_shape(k, ne, &nd);
    snprintf(name, sizeof name, "t.%s", gguf_type_name(all_types[k]));
    const gguf_tensor_t *t = gguf_find_tensor(g, name);
    CHECK(t && t == gguf_tensor(g, k) && strcmp(t->name, name) == 0);
    if (!t) continue;
    CHECK(t->type == all_types[k] && t->n_dims == nd);
    int64_t n = 1;
    for (int d = 0; d < 4; d++) {
      CHECK(t->ne[d] == (d < nd ? ne[d] : 1));
      n *= t->ne[d];
    }
    CHECK(t->n_elems == n && t->nbytes == gguf_type_nbytes(t->type, n));
    uint8_t *want = malloc(t->nbytes);
    fill_random(want, t->nbytes, &seed);
    CHECK(memcmp(want, t->data, t->nbytes) == 0);
    CHECK(((uintptr_t)t->data - (uintptr_t)gguf_tensor(g, 0)->data) % align == 0);
    free(want);
  }
  CHECK(gguf_find_tensor(g, "t.nope") == NULL && gguf_tensor(g, N_TYPES) == NULL);
}

static const char *const vocab[] = {"<unk>", "", "hello", "\xe2\x96\x81world", "a\nb"};

static void add_all_kv(gguf_writer_t *w) {
  uint8_t u8 = 200;
  int8_t i8 = -100;
  uint16_t u16 = 60000;
  int16_t i16 = -30000;
  int32_t i32 = -2000000000;
  uint64_t u64 = 0xfedcba9876543210ull;
  int64_t i64 = -5000000000ll;
  double f64 = 3.25;
  CHECK_OK(gguf_writer_add_scalar(w, "s.u8", GGUF_VT_UINT8, &u8));
  CHECK_OK(gguf_writer_add_scalar(w, "s.i8", GGUF_VT_INT8, &i8));
  CHECK_OK(gguf_writer_add_scalar(w, "s.u16", GGUF_VT_UINT16, &u16));
  CHECK_OK(gguf_writer_add_scalar(w, "s.i16", GGUF_VT_INT16, &i16));
  CHECK_OK(gguf_writer_add_u32(w, "s.u32", 4000000000u));
  CHECK_OK(gguf_writer_add_scalar(w, "s.i32", GGUF_VT_INT32, &i32));
  CHECK_OK(gguf_writer_add_f32(w, "s.f32", 1.5f));
  CHECK_OK(gguf_writer_add_bool(w, "s.bool", 1));
  CHECK_OK(gguf_writer_add_str(w, "s.str", "llama"));
  CHECK_OK(gguf_writer_add_scalar(w, "s.u64", GGUF_VT_UINT64, &u64));
  CHECK_OK(gguf_writer_add_scalar(w, "s.i64", GGUF_VT_INT64, &i64));
  CHECK_OK(gguf_writer_add_scalar(w, "s.f64", GGUF_VT_FLOAT64, &f64));
  CHECK_OK(gguf_writer_add_str_arr(w, "a.str", vocab, 5));
  const float fa[] = {0.5f, -2.0f, 1e30f};
  const int32_t ia[] = {-7, 0, 7};
  const uint64_t ua[] = {1, 0x8000000000000000ull};
  const int16_t sa[] = {-3, 3};
  const uint8_t ba[] = {0, 1, 1};
  const double da[] = {2.0, 0.25};
  CHECK_OK(gguf_writer_add_f32_arr(w, "a.f32", fa, 3));
  CHECK_OK(gguf_writer_add_i32_arr(w, "a.i32", ia, 3));
  CHECK_OK(gguf_writer_add_arr(w, "a.u64", GGUF_VT_UINT64, ua, 2));
  CHECK_OK(gguf_writer_add_arr(w, "a.i16", GGUF_VT_INT16, sa, 2));
  CHECK_OK(gguf_writer_add_arr(w, "a.bool", GGUF_VT_BOOL, ba, 3));
  CHECK_OK(gguf_writer_add_arr(w, "a.f64", GGUF_VT_FLOAT64, da, 2));
  CHECK_OK(gguf_writer_add_arr(w, "a.empty", GGUF_VT_UINT8, NULL, 0));
}

static void check_scalars(const gguf_t *g) {
  uint32_t u;
  int64_t i;
  float f;
  int b;
  const char *s;
  size_t len;
  CHECK_OK(gguf_get_u32(g, "s.u8", &u));
  CHECK(u == 200);
  CHECK_OK(gguf_get_i64(g, "s.i8", &i));
  CHECK(i == -100);
  CHECK_OK(gguf_get_u32(g, "s.u16", &u));
  CHECK(u == 60000);
  CHECK_OK(gguf_get_i64(g, "s.i16", &i));
  CHECK(i == -30000);
  CHECK_OK(gguf_get_u32(g, "s.u32", &u));
  CHECK(u == 4000000000u);
  CHECK_OK(gguf_get_i64(g, "s.i32", &i));
  CHECK(i == -2000000000);
  CHECK_OK(gguf_get_f32(g, "s.f32", &f));
  CHECK(f == 1.5f);
  CHECK_OK(gguf_get_bool(g, "s.bool", &b));
  CHECK(b == 1);
  CHECK_OK(gguf_get_str(g, "s.str", &s, &len));
  CHECK(len == 5 && memcmp(s, "llama", 5) == 0);
  CHECK_OK(gguf_get_i64(g, "s.i64", &i));
  CHECK(i == -5000000000ll);
  CHECK_OK(gguf_get_f32(g, "s.f64", &f));
  CHECK(f == 3.25f);
  CHECK_OK(gguf_get_f32(g, "s.i16", &f));
  CHECK(f == -30000.0f);
  CHECK(gguf_kv_type(g, gguf_find_key(g, "s.u64")) == GGUF_VT_UINT64);
}

static void check_conversion_errors(const gguf_t *g) {
  uint32_t u;
  int64_t i;
  int b;
  const char *s;
  size_t len;
  gguf_arr_t a;
  qe_errclear();
  CHECK(gguf_get_u32(g, "missing.key", &u) == QE_ENOTFOUND && strstr(qe_errmsg(), "missing.key"));
  CHECK(gguf_get_u32(g, "s.i8", &u) == QE_EFORMAT && *qe_errmsg()); /* negative */
  CHECK(gguf_get_u32(g, "s.u64", &u) == QE_EFORMAT);                /* too big */
  CHECK(gguf_get_i64(g, "s.u64", &i) == QE_EFORMAT);                /* > INT64_MAX */
  CHECK(gguf_get_u32(g, "s.f32", &u) == QE_EFORMAT);
  CHECK(gguf_get_bool(g, "s.u32", &b) == QE_EFORMAT);
  CHECK(gguf_get_str(g, "s.u32", &s, &len) == QE_EFORMAT);
  CHECK(gguf_get_arr(g, "s.str", &a) == QE_EFORMAT);
  CHECK(gguf_find_key(g, "nope") == -1 && gguf_key(g, gguf_n_kv(g)) == NULL);
  CHECK(gguf_kv_type(g, -1) == -1);
}

static void check_arrays(const gguf_t *g) {
  gguf_arr_t a;
  const char *s;
  size_t len;
  float f;
  int64_t i;
  CHECK_OK(gguf_get_arr(g, "a.str", &a));
  CHECK(a.elem_type == GGUF_VT_STRING && a.n == 5);
  for (size_t k = 0; k < 5; k++) {
    CHECK_OK(gguf_arr_str(&a, k, &s, &len));
    CHECK(len == strlen(vocab[k]) && memcmp(s, vocab[k], len) == 0);
  }
  CHECK(gguf_arr_str(&a, 5, &s, &len) == QE_ERANGE && *qe_errmsg());
  CHECK(gguf_arr_f32(&a, 0, &f) == QE_EFORMAT);
  CHECK_OK(gguf_get_arr(g, "a.f32", &a));
  CHECK(a.n == 3 && gguf_arr_f32(&a, 2, &f) == 0 && f == 1e30f);
  CHECK(gguf_arr_i64(&a, 0, &i) == QE_EFORMAT); /* 0.5 is not an integer */
  CHECK(gguf_arr_str(&a, 0, &s, &len) == QE_EFORMAT);
  CHECK_OK(gguf_get_arr(g, "a.i32", &a));
  CHECK(gguf_arr_i64(&a, 0, &i) == 0 && i == -7 && gguf_arr_f32(&a, 2, &f) == 0 && f == 7.0f);
  CHECK_OK(gguf_get_arr(g, "a.u64", &a));
  CHECK(gguf_arr_i64(&a, 0, &i) == 0 && i == 1 && gguf_arr_i64(&a, 1, &i) == QE_EFORMAT);
  CHECK_OK(gguf_get_arr(g, "a.i16", &a));
  CHECK(gguf_arr_i64(&a, 0, &i) == 0 && i == -3);
  CHECK_OK(gguf_get_arr(g, "a.bool", &a));
  CHECK(a.n == 3 && ((const uint8_t *)a.data)[2] == 1 && gguf_arr_f32(&a, 0, &f) == QE_EFORMAT);
  CHECK_OK(gguf_get_arr(g, "a.f64", &a));
  CHECK(gguf_arr_f32(&a, 1, &f) == 0 && f == 0.25f && gguf_arr_i64(&a, 0, &i) == 0 && i == 2);
  CHECK_OK(gguf_get_arr(g, "a.empty", &a));
  CHECK(a.n == 0 && a.elem_type == GGUF_VT_UINT8 && gguf_arr_i64(&a, 0, &i) == QE_ERANGE);
}

/* Builds the round-trip file (all metadata types, all tensor types). */
static uint8_t *build_full(uint32_t align, size_t *size) {
  gguf_writer_t *w;
  uint8_t *buf = NULL;
  CHECK_OK(gguf_writer_create(&w));
  if (align) CHECK_OK(gguf_writer_set_alignment(w, align));
  add_all_kv(w);
  add_all_tensors(w, 42);
  CHECK_OK(gguf_writer_finish(w, &buf, size));
  gguf_writer_destroy(w);
  return buf;
}

static void check_full(const gguf_t *g, uint32_t align) {
  CHECK(gguf_version(g) == 3);
  CHECK(gguf_n_kv(g) == 20 + (align != 0));
  check_scalars(g);
  check_conversion_errors(g);
  check_arrays(g);
  check_all_tensors(g, 42, align ? align : 32);
}

static void test_round_trip(void) {
  static const uint32_t aligns[] = {0, 64, 1};
  for (int k = 0; k < 3; k++) {
    size_t size;
    uint8_t *buf = build_full(aligns[k], &size);
    gguf_t *g = NULL;
    CHECK_OK(gguf_open_mem(buf, size, &g));
    if (g) check_full(g, aligns[k]);
    CHECK(!g || gguf_file_size(g) == size);
    gguf_close(g);
    free(buf);
  }
}

static void test_file_io(void) {
  char path[] = "/tmp/test_gguf_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0) return;
  close(fd);
  gguf_writer_t *w;
  CHECK_OK(gguf_writer_create(&w));
  add_all_kv(w);
  add_all_tensors(w, 42);
  CHECK_OK(gguf_writer_save(w, path));
  gguf_writer_destroy(w);
  gguf_t *g = NULL;
  CHECK_OK(gguf_open(path, &g));
  if (g) check_full(g, 0);
  gguf_close(g);
  FILE *f = fopen(path, "wb"); /* empty file */
  fclose(f);
  CHECK(gguf_open(path, &g) == QE_EFORMAT && strstr(qe_errmsg(), path) && g == NULL);
  unlink(path);
  CHECK(gguf_open(path, &g) == QE_EIO && strstr(qe_errmsg(), path));
  CHECK(gguf_open("/", &g) == QE_EIO);
}

static void test_writer_refusals(void) {
  gguf_writer_t *w;
  float x[4] = {0};
  int64_t ne[2] = {4, 1}, bad_ne[2] = {33, 1};
  CHECK_OK(gguf_writer_create(&w));
  CHECK_OK(gguf_writer_add_u32(w, "k", 1));
  CHECK(gguf_writer_add_u32(w, "k", 2) == QE_EINVAL);
  CHECK(gguf_writer_add_tensor(w, "t", GGUF_T_F32, 2, ne, x, 12) == QE_EINVAL);
  CHECK_OK(gguf_writer_add_tensor(w, "t", GGUF_T_F32, 2, ne, x, 16));
  CHECK(gguf_writer_add_tensor(w, "t", GGUF_T_F32, 2, ne, x, 16) == QE_EINVAL);
  CHECK(gguf_writer_add_tensor(w, "q", GGUF_T_Q8_0, 2, bad_ne, x, 16) == QE_EINVAL);
  CHECK(gguf_writer_add_tensor(w, "u", 6, 1, ne, x, 16) == QE_EINVAL);
  CHECK(gguf_writer_set_alignment(w, 48) == QE_EINVAL);
  gguf_writer_destroy(w);
}

/* A big vocabulary must open fast (strings indexed in one pass) and index correctly. */
static void test_big_vocab(void) {
  enum { N = 150000 };
  char **toks = malloc(N * sizeof *toks);
  for (int i = 0; i < N; i++) {
    toks[i] = malloc(16);
    snprintf(toks[i], 16, "tok%d", i);
  }
  gguf_writer_t *w;
  uint8_t *buf;
  size_t size;
  CHECK_OK(gguf_writer_create(&w));
  CHECK_OK(gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)toks, N));
  CHECK_OK(gguf_writer_finish(w, &buf, &size));
  gguf_writer_destroy(w);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  gguf_t *g = NULL;
  CHECK_OK(gguf_open_mem(buf, size, &g));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  fprintf(stderr, "open of a %d-string vocabulary: %.2f ms (printed, never asserted)\n", N, ms);
  gguf_arr_t a;
  if (g && gguf_get_arr(g, "tokenizer.ggml.tokens", &a) == 0) {
    const char *s;
    size_t len;
    int bad = 0;
    for (int i = N - 1; i >= 0; i -= 7)
      if (gguf_arr_str(&a, (size_t)i, &s, &len) || len != strlen(toks[i]) ||
          memcmp(s, toks[i], len) != 0)
        bad++;
    CHECK(bad == 0);
  }
  gguf_close(g);
  free(buf);
  for (int i = 0; i < N; i++) free(toks[i]);
  free(toks);
}

/* ---- hostile input ---------------------------------------------------------------------- */

/* A small valid file: a few keys (one a string array) and three tensors. */
static uint8_t *build_small(size_t *size) {
  gguf_writer_t *w;
  uint8_t *buf = NULL;
  float x[64];
  uint8_t q[2 * 34];
  uint64_t seed = 7;
  int64_t ne2[2] = {8, 8}, ne1[1] = {64};
  static const char *const toks[] = {"a", "bc", "def"};
  fill_random(q, sizeof q, &seed);
  for (int i = 0; i < 64; i++) x[i] = (float)i;
  CHECK_OK(gguf_writer_create(&w));
  CHECK_OK(gguf_writer_add_str(w, "general.architecture", "llama"));
  CHECK_OK(gguf_writer_add_u32(w, "key.a", 7));
  CHECK_OK(gguf_writer_add_u32(w, "key.b", 8));
  CHECK_OK(gguf_writer_add_str_arr(w, "tokens", toks, 3));
  CHECK_OK(gguf_writer_add_i32_arr(w, "ints", (const int32_t[]){1, 2}, 2));
  CHECK_OK(gguf_writer_add_bool(w, "flag", 1));
  CHECK_OK(gguf_writer_add_tensor(w, "blk.0.attn_q.weight", GGUF_T_F32, 2, ne2, x, 256));
  CHECK_OK(gguf_writer_add_tensor(w, "blk.0.attn_k.weight", GGUF_T_Q8_0, 1, ne1, q, 68));
  CHECK_OK(gguf_writer_add_tensor(w, "norm", GGUF_T_F32, 1, ne2, x, 32));
  CHECK_OK(gguf_writer_finish(w, &buf, size));
  gguf_writer_destroy(w);
  return buf;
}

/* Opens a private exact-size copy (so ASan sees any overread). Returns the status. */
static int open_copy(const uint8_t *buf, size_t n) {
  uint8_t *copy = malloc(n ? n : 1);
  memcpy(copy, buf, n);
  gguf_t *g = (gguf_t *)1;
  qe_errclear();
  int rc = gguf_open_mem(copy, n, &g);
  if (rc == 0)
    gguf_close(g);
  else if (g != NULL)
    rc = 1; /* *out must be NULL on failure */
  free(copy);
  return rc;
}

static void test_prefixes(void) {
  size_t size;
  uint8_t *buf = build_small(&size);
  int bad = 0;
  for (size_t n = 0; n < size; n++) {
    int rc = open_copy(buf, n);
    if (rc != QE_EFORMAT || !*qe_errmsg()) {
      if (bad++ < 5) fprintf(stderr, "prefix %zu/%zu: rc %d '%s'\n", n, size, rc, qe_errmsg());
    }
  }
  CHECK(bad == 0);
  CHECK_OK(open_copy(buf, size));
  /* the messages name what was cut: a scalar value (of a one-key file, which passes the
   * header's plausibility check), a count of the header */
  CHECK(open_copy(buf, 10) == QE_EFORMAT && strstr(qe_errmsg(), "file truncated in"));
  gguf_writer_t *w;
  uint8_t *one = NULL;
  size_t n1;
  CHECK_OK(gguf_writer_create(&w));
  CHECK_OK(gguf_writer_add_u32(w, "key.a", 7));
  CHECK_OK(gguf_writer_finish(w, &one, &n1));
  gguf_writer_destroy(w);
  uint8_t *val = one ? memmem(one, n1, "key.a", 5) : NULL;
  CHECK(val != NULL);
  if (val) {
    CHECK(open_copy(one, (size_t)(val - one) + 5 + 4 + 2) == QE_EFORMAT);
    CHECK(strstr(qe_errmsg(), "file truncated in key 'key.a': ") &&
          strstr(qe_errmsg(), " value at offset"));
  }
  free(one);
  free(buf);
}

/* Pointer just past the first occurrence of s (as a GGUF string body) in buf. */
static uint8_t *after(uint8_t *buf, size_t size, const char *s) {
  uint8_t *p = memmem(buf, size, s, strlen(s));
  CHECK(p != NULL);
  return p ? p + strlen(s) : buf;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

typedef void (*corrupt_fn)(uint8_t *buf, size_t size);

/* Corrupts a fresh small file with fn and checks the code and that the message has `want`. */
static void expect_bad(const char *what, corrupt_fn fn, int code, const char *want) {
  size_t size;
  uint8_t *buf = build_small(&size);
  fn(buf, size);
  int rc = open_copy(buf, size);
  const char *m = qe_errmsg();
  if (rc != code || !*m || (want && !strstr(m, want))) {
    fprintf(stderr, "FAIL %s: rc %d (want %d), message '%s' (want '%s')\n", what, rc, code, m,
            want ? want : "");
    tu_failures++;
  }
  free(buf);
}

/* Tensor info of the F32 2-D tensor: name, n_dims, ne[2], type, offset. */
#define TI_Q "blk.0.attn_q.weight"
static void c_magic(uint8_t *b, size_t n) { b[0] = 'X'; }
static void c_v1(uint8_t *b, size_t n) { put_u32(b + 4, 1); }
static void c_v4(uint8_t *b, size_t n) { put_u32(b + 4, 4); }
static void c_v0(uint8_t *b, size_t n) { put_u32(b + 4, 0); }
static void c_big_endian(uint8_t *b, size_t n) { put_u32(b + 4, 0x03000000); }
static void c_n_tensors(uint8_t *b, size_t n) { put_u64(b + 8, 1ull << 60); }
static void c_n_kv(uint8_t *b, size_t n) { put_u64(b + 16, 1000); }
static void c_n_kv_max(uint8_t *b, size_t n) { put_u64(b + 16, ~0ull); }
static void c_type_q5_0(uint8_t *b, size_t n) { put_u32(after(b, n, TI_Q) + 4 + 16, 6); }
static void c_type_999(uint8_t *b, size_t n) { put_u32(after(b, n, TI_Q) + 4 + 16, 999); }
static void c_outside(uint8_t *b, size_t n) { put_u64(after(b, n, TI_Q) + 24, 1u << 20); }
static void c_outside_wrap(uint8_t *b, size_t n) { put_u64(after(b, n, TI_Q) + 24, ~31ull); }
static void c_misaligned(uint8_t *b, size_t n) { after(b, n, "norm")[16] += 4; }
static void c_dim0(uint8_t *b, size_t n) { put_u64(after(b, n, TI_Q) + 4, 0); }
static void c_dim_huge(uint8_t *b, size_t n) { put_u64(after(b, n, TI_Q) + 12, 1ull << 38); }
static void c_dim_wrap(uint8_t *b, size_t n) { put_u64(after(b, n, TI_Q) + 4, 1ull << 63); }
static void c_n_dims(uint8_t *b, size_t n) { put_u32(after(b, n, TI_Q), 5); }
static void c_n_dims0(uint8_t *b, size_t n) { put_u32(after(b, n, TI_Q), 0); }
static void c_row_block(uint8_t *b, size_t n) { put_u32(after(b, n, TI_Q) + 20, GGUF_T_Q8_0); }
static void c_str_len(uint8_t *b, size_t n) {
  put_u64(after(b, n, "general.architecture") + 4, 1ull << 62);
}
static void c_key_len(uint8_t *b, size_t n) { put_u64(b + 24, n); }
static void c_tok_len(uint8_t *b, size_t n) { put_u64(after(b, n, "bc"), ~0ull); }
static void c_arr_count(uint8_t *b, size_t n) { put_u64(after(b, n, "ints") + 8, 1ull << 62); }
static void c_nested(uint8_t *b, size_t n) { put_u32(after(b, n, "ints") + 4, GGUF_VT_ARRAY); }
static void c_arr_type(uint8_t *b, size_t n) { put_u32(after(b, n, "ints") + 4, 13); }
static void c_vtype(uint8_t *b, size_t n) { put_u32(after(b, n, "key.a"), 77); }
static void c_dup_key(uint8_t *b, size_t n) { after(b, n, "key.b")[-1] = 'a'; }
static void c_dup_tensor(uint8_t *b, size_t n) { after(b, n, "attn_k.weight")[-8] = 'q'; }
static void c_bool(uint8_t *b, size_t n) { after(b, n, "flag")[4] = 2; }
static void c_nul_key(uint8_t *b, size_t n) { after(b, n, "key.a")[-2] = 0; }
static void c_empty_key(uint8_t *b, size_t n) { put_u64(b + 24, 0); }

/* general.alignment corrupted to a non-power of two / a non-u32 type. */
static void test_bad_alignment(void) {
  gguf_writer_t *w;
  uint8_t *buf;
  size_t size;
  float x[8] = {0};
  int64_t ne[1] = {8};
  CHECK_OK(gguf_writer_create(&w));
  CHECK_OK(gguf_writer_set_alignment(w, 64));
  CHECK_OK(gguf_writer_add_tensor(w, "x", GGUF_T_F32, 1, ne, x, 32));
  CHECK_OK(gguf_writer_finish(w, &buf, &size));
  gguf_writer_destroy(w);
  uint8_t *v = after(buf, size, "general.alignment") + 4;
  put_u32(v, 48);
  CHECK(open_copy(buf, size) == QE_EFORMAT && strstr(qe_errmsg(), "power of two"));
  put_u32(v, 0);
  CHECK(open_copy(buf, size) == QE_EFORMAT);
  put_u32(v, 64);
  put_u32(v - 4, GGUF_VT_INT32);
  CHECK(open_copy(buf, size) == QE_EFORMAT && strstr(qe_errmsg(), "alignment"));
  put_u32(v - 4, GGUF_VT_UINT32);
  CHECK_OK(open_copy(buf, size));
  free(buf);
}

static void test_corruptions(void) {
  expect_bad("bad magic", c_magic, QE_EFORMAT, "magic");
  expect_bad("version 1", c_v1, QE_EUNSUPPORTED, "version 1");
  expect_bad("version 4", c_v4, QE_EUNSUPPORTED, "version 4");
  expect_bad("version 0", c_v0, QE_EFORMAT, "version");
  expect_bad("big endian", c_big_endian, QE_EUNSUPPORTED, "big-endian");
  expect_bad("absurd n_tensors", c_n_tensors, QE_EFORMAT, "tensors");
  expect_bad("absurd n_kv", c_n_kv, QE_EFORMAT, "keys");
  expect_bad("max n_kv", c_n_kv_max, QE_EFORMAT, "keys");
  expect_bad("type Q5_0", c_type_q5_0, QE_EUNSUPPORTED, "tensor '" TI_Q "' has type 6 (Q5_0)");
  expect_bad("type 999", c_type_999, QE_EUNSUPPORTED, "type 999");
  expect_bad("outside", c_outside, QE_EFORMAT, "tensor '" TI_Q "' data [");
  expect_bad("outside (wrap)", c_outside_wrap, QE_EFORMAT, "outside the file");
  expect_bad("misaligned", c_misaligned, QE_EFORMAT, "alignment 32");
  expect_bad("dim 0", c_dim0, QE_EFORMAT, "dimension 0 is 0");
  expect_bad("dims > 2^40", c_dim_huge, QE_EFORMAT, "2^40");
  expect_bad("dim 2^63", c_dim_wrap, QE_EFORMAT, "2^40");
  expect_bad("n_dims 5", c_n_dims, QE_EFORMAT, "5 dimensions");
  expect_bad("n_dims 0", c_n_dims0, QE_EFORMAT, "0 dimensions");
  expect_bad("row vs block", c_row_block, QE_EFORMAT, "multiple");
  expect_bad("string length", c_str_len, QE_EFORMAT, "past the end");
  expect_bad("key length", c_key_len, QE_EFORMAT, "past the end");
  expect_bad("token length", c_tok_len, QE_EFORMAT, "element 2");
  expect_bad("array count", c_arr_count, QE_EFORMAT, "array of");
  expect_bad("nested array", c_nested, QE_EUNSUPPORTED, "nested");
  expect_bad("array elem type", c_arr_type, QE_EFORMAT, "element type 13");
  expect_bad("value type", c_vtype, QE_EFORMAT, "value type 77");
  expect_bad("duplicate key", c_dup_key, QE_EFORMAT, "duplicate key 'key.a'");
  expect_bad("duplicate tensor", c_dup_tensor, QE_EFORMAT, "duplicate tensor");
  expect_bad("bool 2", c_bool, QE_EFORMAT, "bool");
  expect_bad("NUL in key", c_nul_key, QE_EFORMAT, "NUL");
  expect_bad("empty key", c_empty_key, QE_EFORMAT, "empty");
  test_bad_alignment();
}

/* Random byte flips: must never crash (the fuzzer does this at scale). */
static void test_random_flips(void) {
  size_t size;
  uint8_t *buf = build_small(&size);
  uint64_t s = 99;
  int opened = 0;
  for (int it = 0; it < 3000; it++) {
    uint8_t *copy = malloc(size);
    memcpy(copy, buf, size);
    uint8_t r[8];
    fill_random(r, sizeof r, &s);
    size_t pos = (r[0] | r[1] << 8) % size, pos2 = (r[2] | r[3] << 8) % 128;
    copy[pos] ^= (uint8_t)(r[4] | 1);
    copy[pos2] = r[5];
    gguf_t *g;
    if (gguf_open_mem(copy, size, &g) == 0) {
      opened++;
      for (int i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor_t *t = gguf_tensor(g, i);
        float y[256];
        CHECK_OK(gguf_dequant(t->type, t->data, y, gguf_type_block(t->type)));
      }
      gguf_close(g);
    } else {
      CHECK(*qe_errmsg());
    }
    free(copy);
  }
  fprintf(stderr, "random flips: %d of 3000 still valid\n", opened);
  free(buf);
}

/* ---- the shared stories260K model ------------------------------------------------------- */

static void test_stories(void) {
  const char *path = tu_env_path("QE_SHARED_MODELS", "stories260K.gguf");
  if (!path || access(path, R_OK) != 0) {
    fprintf(stderr, "SKIP stories260K part: %s not found\n", path ? path : "QE_SHARED_MODELS");
    return;
  }
  gguf_t *g = NULL;
  CHECK_OK(gguf_open(path, &g));
  if (!g) return;
  gguf_arr_t a;
  const char *s;
  size_t len;
  uint32_t u;
  float f;
  CHECK(gguf_version(g) == 3 && gguf_n_tensors(g) == 48 && gguf_n_kv(g) == 19);
  CHECK_OK(gguf_get_arr(g, "tokenizer.ggml.tokens", &a));
  CHECK(a.elem_type == GGUF_VT_STRING && a.n == 512);
  CHECK_OK(gguf_arr_str(&a, 0, &s, &len));
  CHECK(len == 5 && memcmp(s, "<unk>", 5) == 0);
  CHECK_OK(gguf_arr_str(&a, 511, &s, &len));
  CHECK_OK(gguf_get_arr(g, "tokenizer.ggml.scores", &a));
  CHECK(a.elem_type == GGUF_VT_FLOAT32 && a.n == 512 && gguf_arr_f32(&a, 3, &f) == 0);
  CHECK_OK(gguf_get_arr(g, "tokenizer.ggml.token_type", &a));
  CHECK(a.elem_type == GGUF_VT_INT32 && a.n == 512);
  CHECK_OK(gguf_get_str(g, "tokenizer.ggml.model", &s, &len));
  CHECK(len == 5 && memcmp(s, "llama", 5) == 0);
  CHECK_OK(gguf_get_u32(g, "llama.embedding_length", &u));
  CHECK(u == 64);
  CHECK_OK(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f));
  const gguf_tensor_t *t = gguf_find_tensor(g, "token_embd.weight");
  CHECK(t && t->type == GGUF_T_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512);
  CHECK(gguf_find_tensor(g, "blk.4.ffn_down.weight") != NULL);
  for (int i = 0; i < gguf_n_tensors(g); i++) {
    const gguf_tensor_t *ti = gguf_tensor(g, i);
    float *y = malloc((size_t)ti->n_elems * sizeof *y);
    CHECK_OK(gguf_dequant(ti->type, ti->data, y, ti->n_elems));
    int finite = 1;
    for (int64_t k = 0; k < ti->n_elems; k++) finite &= isfinite(y[k]) != 0;
    CHECK(finite);
    free(y);
  }
  gguf_close(g);
}

int main(void) {
  test_fp16_all();
  test_fp16_ties();
  test_bf16();
  test_type_table();
  test_quant_fixture();
  test_round_trip();
  test_file_io();
  test_writer_refusals();
  test_big_vocab();
  test_prefixes();
  test_corruptions();
  test_random_flips();
  test_stories();
  return tu_done("test_gguf");
}
