/* cli_inspect: `qevict inspect FILE`: architecture, hyperparameters, tokenizer and tensors of
 * a GGUF model, without loading the weights. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model.h"
#include "qe_status.h"

static void print_hparams(const model_hparams_t *hp) {
  printf("architecture: %s\n", hp->arch == MODEL_ARCH_QWEN2 ? "qwen2" : "llama");
  printf("vocab: %d\nembedding: %d\nlayers: %d\nheads: %d\nkv heads: %d\nhead dim: %d\n",
         hp->n_vocab, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim);
  printf("ffn: %d\ncontext: %d\nrms eps: %g\n", hp->n_ff, hp->n_ctx_train, hp->rms_eps);
  printf("rope: %s, dims %d, theta %g, freq scale %g%s%s\n",
         hp->rope.mode == KERN_ROPE_NEOX ? "neox" : "norm", hp->rope.n_rot, hp->rope.theta,
         hp->rope.freq_scale, hp->rope.ext_factor != 0 ? ", yarn" : "",
         hp->rope.factors ? ", freq factors" : "");
  printf("output: %s\nqkv bias: %s\n", hp->tied_output ? "tied to token_embd" : "separate",
         hp->qkv_bias ? "yes" : "no");
}

static void print_tensors(const gguf_t *g) {
  size_t by_type[64] = {0}, total = 0;
  int count[64] = {0};
  printf("tensors: %d\n", gguf_n_tensors(g));
  for (int i = 0; i < gguf_n_tensors(g); i++) {
    const gguf_tensor_t *t = gguf_tensor(g, i);
    printf("  %-32s %-5s [%lld", t->name, gguf_type_name(t->type), (long long)t->ne[0]);
    for (int d = 1; d < t->n_dims; d++) printf(", %lld", (long long)t->ne[d]);
    printf("] %zu bytes\n", t->nbytes);
    by_type[t->type & 63] += t->nbytes;
    count[t->type & 63]++;
    total += t->nbytes;
  }
  for (int ty = 0; ty < 64; ty++)
    if (count[ty])
      printf("type %s: %d tensors, %zu bytes\n", gguf_type_name(ty), count[ty], by_type[ty]);
  printf("total tensor bytes: %zu\n", total);
}

int cli_inspect(int argc, char **argv) {
  if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
    return puts("usage: qevict inspect FILE.gguf") < 0;
  if (argc != 2) return cli_usage_error("inspect", "expected exactly one GGUF file");
  gguf_t *g = NULL;
  model_hparams_t hp;
  int rc = gguf_open(argv[1], &g);
  if (!rc) rc = model_read_hparams(g, &hp);
  if (rc) {
    gguf_close(g);
    return cli_fail("inspect", rc);
  }
  printf("file: %s (GGUF v%u, %zu bytes)\n", argv[1], gguf_version(g), gguf_file_size(g));
  print_hparams(&hp);
  print_tensors(g);
  gguf_close(g);
  return 0;
}
