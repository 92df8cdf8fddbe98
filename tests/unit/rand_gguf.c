/* rand_gguf: writes a random llama model (SentencePiece vocabulary, F32 weights) for tests that
 * need a shape no downloadable model has, e.g. a 40K-token context:
 *   rand_gguf OUT [--ctx N] [--layers N] [--heads N] [--kv N] [--seed N] [--nan 1]
 * (--nan 1: output_norm.weight all NaN, so every logit is NaN) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model.h"
#include "rand_model.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: rand_gguf OUT [--ctx N] [--layers N] [--heads N] [--kv N] [--seed N] "
                    "[--nan 1]\n");
    return 2;
  }
  rand_model_spec_t sp = {MODEL_ARCH_LLAMA, GGUF_T_F32, 8, 2, 0, 1, 1};
  int n_ctx = 256, nan = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    long v = strtol(argv[i + 1], NULL, 10);
    if (!strcmp(argv[i], "--ctx"))
      n_ctx = (int)v;
    else if (!strcmp(argv[i], "--layers"))
      sp.n_layer = (int)v;
    else if (!strcmp(argv[i], "--heads"))
      sp.n_head = (int)v;
    else if (!strcmp(argv[i], "--kv"))
      sp.n_kv = (int)v;
    else if (!strcmp(argv[i], "--seed"))
      sp.seed = (uint64_t)v;
    else if (!strcmp(argv[i], "--nan"))
      nan = (int)v;
    else
      return fprintf(stderr, "rand_gguf: unknown option %s\n", argv[i]), 2;
  }
  int rc = rand_model_write_ex(&sp, n_ctx, nan, argv[1]);
  if (rc) fprintf(stderr, "rand_gguf: cannot write %s (%d)\n", argv[1], rc);
  return rc ? 1 : 0;
}
