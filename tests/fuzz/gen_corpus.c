/* gen_corpus: writes the fuzzer's seed corpus (small valid GGUF files made by gguf_write)
 * into the directory given as argv[1]: every metadata type, a string array, one tensor of
 * each supported type (one block each), and a non-default alignment. A few KB in all.
 * No .gguf extension: the repository's .gitignore ignores *.gguf (model files). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_write.h"
#include "qe_status.h"

/* One tensor per supported type, one block each, bytes 0..n-1 (fp16 scales stay finite). */
static int add_tensors(gguf_writer_t *w) {
  static const int types[] = {GGUF_T_F32,  GGUF_T_F16,  GGUF_T_BF16, GGUF_T_Q4_0, GGUF_T_Q4_1,
                              GGUF_T_Q8_0, GGUF_T_Q4_K, GGUF_T_Q5_K, GGUF_T_Q6_K};
  uint8_t buf[256];
  for (int i = 0; i < 256; i++) buf[i] = (uint8_t)(i * 37 + 11) & 0xbf;
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    int64_t ne[2] = {gguf_type_block(types[k]), 1};
    char name[32];
    snprintf(name, sizeof name, "blk.%zu.%s", k, gguf_type_name(types[k]));
    size_t nb = gguf_type_nbytes(types[k], ne[0]);
    int rc = gguf_writer_add_tensor(w, name, types[k], 2, ne, buf, nb);
    if (rc) return rc;
  }
  return 0;
}

static int add_meta(gguf_writer_t *w) {
  static const char *const toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81the", "a"};
  const float scores[] = {0, -1, -2, -3.5f, -4};
  const int32_t types[] = {2, 3, 3, 1, 1};
  uint8_t u8 = 1;
  int64_t i64 = -3;
  double f64 = 0.5;
  uint16_t u16s[] = {1, 2, 3};
  int rc = gguf_writer_add_str(w, "general.architecture", "llama");
  if (!rc) rc = gguf_writer_add_u32(w, "llama.embedding_length", 64);
  if (!rc) rc = gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  if (!rc) rc = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1);
  if (!rc) rc = gguf_writer_add_scalar(w, "x.u8", GGUF_VT_UINT8, &u8);
  if (!rc) rc = gguf_writer_add_scalar(w, "x.i64", GGUF_VT_INT64, &i64);
  if (!rc) rc = gguf_writer_add_scalar(w, "x.f64", GGUF_VT_FLOAT64, &f64);
  if (!rc) rc = gguf_writer_add_arr(w, "x.u16s", GGUF_VT_UINT16, u16s, 3);
  if (!rc) rc = gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", toks, 5);
  if (!rc) rc = gguf_writer_add_f32_arr(w, "tokenizer.ggml.scores", scores, 5);
  if (!rc) rc = gguf_writer_add_i32_arr(w, "tokenizer.ggml.token_type", types, 5);
  return rc;
}

static int save(const char *dir, const char *name, int meta, int tensors, uint32_t align) {
  char path[4096];
  gguf_writer_t *w;
  int rc = gguf_writer_create(&w);
  if (rc) return rc;
  if (align) rc = gguf_writer_set_alignment(w, align);
  if (!rc && meta) rc = add_meta(w);
  if (!rc && tensors) rc = add_tensors(w);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!rc) rc = gguf_writer_save(w, path);
  gguf_writer_destroy(w);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  int rc = save(argv[1], "meta_only", 1, 0, 0);
  if (!rc) rc = save(argv[1], "tensors_all_types", 0, 1, 0);
  if (!rc) rc = save(argv[1], "model_align64", 1, 1, 64);
  if (rc) fprintf(stderr, "gen_corpus: %s: %s\n", qe_strerror(rc), qe_errmsg());
  return rc ? 1 : 0;
}
