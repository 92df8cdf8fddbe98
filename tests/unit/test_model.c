/* test_model: the forward pass on random GGUF models of every tensor type, both
 * architectures, GQA and MHA, tied and untied output: prefill equals token-by-token decode,
 * batching sequences together changes nothing, tensor parallel (forked ranks over the CPU
 * collective backend, even and uneven head splits) equals one rank, stacked q, k, v and gate, up
 * projections (QE_CPU_FUSE_PROJ) give the separate ones' logits, and bad models and prompts are
 * refused with clear errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_write.h"
#include "model_gen.h"
#include "qe_status.h"
#include "rand_model.h"
#include "model_rig.h"
#include "test_util.h"

#define NT 12 /* prompt tokens */

static const int32_t prompt[NT] = {1, 40, 260, 7, 255, 12, 99, 180, 3, 64, 250, 17};

/* Token-by-token in slot 1 while slot 2 runs the same prompt in the same batches. */
static void check_decode_and_batching(rig_t *r, const float *ref, int V) {
  float *lg = malloc(sizeof(float) * 2 * V);
  CHECK_OK(r->kv->ops->seq_open(r->kv, 1, NT));
  CHECK_OK(r->kv->ops->seq_open(r->kv, 2, NT));
  double worst = 0;
  for (int i = 0; i < NT; i++) {
    int32_t tok[2] = {prompt[i], prompt[i]}, pos[2] = {i, i}, seq[2] = {1, 2};
    model_batch_t b = {2, tok, pos, seq, NULL};
    CHECK_OK(model_forward(r->m, r->kv, r->c, &b, lg));
    double e1 = tu_rel_err(lg, ref + (size_t)i * V, V), e2 = tu_rel_err(lg + V, lg, V);
    worst = fmax(worst, fmax(e1, e2 * 100));
  }
  if (worst > 1e-4) fprintf(stderr, "decode vs prefill rel err %g\n", worst);
  CHECK(worst <= 1e-4);
  r->kv->ops->seq_close(r->kv, 1);
  r->kv->ops->seq_close(r->kv, 2);
  free(lg);
}

static const int all_types[] = {GGUF_T_F32,  GGUF_T_F16,  GGUF_T_BF16, GGUF_T_Q8_0, GGUF_T_Q4_0,
                                GGUF_T_Q4_1, GGUF_T_Q4_K, GGUF_T_Q5_K, GGUF_T_Q6_K};

/* Packed weights (the GGUF's blocks kept as they are) give the fp32 weights' logits ref within
 * fp32 rounding, on one rank and (with_tp) on 2 and 3 (column slices on block boundaries
 * packed, the others dequantized). */
static void check_packed(const char *path, const rand_model_spec_t *sp, const float *ref, int V,
                         int with_tp) {
  rig_t a, b;
  CHECK_OK(rig_open_ex(&a, path, 0, 1, NULL, 8, KERN_WEIGHT_F32));
  CHECK_OK(rig_open_ex(&b, path, 0, 1, NULL, 8, KERN_WEIGHT_PACKED));
  if (a.m && b.m) /* the layers' weights at 1.25 bytes instead of 4 */
    CHECK(model_weight_bytes(b.m) * 2 < model_weight_bytes(a.m));
  rig_close(&a);
  rig_close(&b);
  for (int size = 1; size <= (with_tp ? 3 : 1); size++) {
    if (size > sp->n_kv) continue;
    double e = tp_prefill_err_ex(path, size, prompt, NT, ref, V, KERN_WEIGHT_PACKED);
    if (e > 1e-5)
      fprintf(stderr, "packed, tp %d: rel err %g (type %s)\n", size, e, gguf_type_name(sp->wtype));
    CHECK(e <= 1e-5);
  }
}

static void check_model(const rand_model_spec_t *sp, int with_tp) {
  char path[] = "/tmp/qe_test_model_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  CHECK_OK(rand_model_write(sp, path));
  tp_comm_t *c = NULL;
  rig_t r;
  CHECK_OK(tp_comm_create_single(&c));
  CHECK_OK(rig_open(&r, path, 0, 1, c, 64));
  if (!r.m) goto out;
  int V = model_hparams(r.m)->n_vocab;
  float *ref = malloc(sizeof(float) * NT * V);
  CHECK_OK(run_prefill(&r, prompt, NT, ref));
  int finite = 1;
  for (size_t i = 0; i < (size_t)NT * V; i++) finite &= isfinite(ref[i]);
  CHECK(finite);
  check_decode_and_batching(&r, ref, V);
  for (int size = 2; with_tp && size <= 3; size++) {
    if (size > sp->n_kv) continue;
    double e = tp_prefill_err(path, size, prompt, NT, ref, V);
    if (e > 1e-4)
      fprintf(stderr, "tp %d rel err %g (type %s)\n", size, e, gguf_type_name(sp->wtype));
    CHECK(e <= 1e-4);
  }
  if (gguf_type_has_blocks32(sp->wtype)) check_packed(path, sp, ref, V, with_tp);
  free(ref);
out:
  rig_close(&r);
  tp_comm_destroy(c);
  unlink(path);
}

static void check_all_models(void) {
  int k = 0;
  for (size_t t = 0; t < sizeof all_types / sizeof *all_types; t++)
    for (int arch = MODEL_ARCH_LLAMA; arch <= MODEL_ARCH_QWEN2; arch++)
      for (int gqa = 0; gqa < 2; gqa++, k++) {
        rand_model_spec_t sp = {arch, all_types[t], 8, gqa ? 2 : 8, k % 2, 2, (uint64_t)k + 7};
        int with_tp = all_types[t] == GGUF_T_F32 || all_types[t] == GGUF_T_Q4_K;
        check_model(&sp, with_tp);
      }
}

/* Logits of a prefill of n tokens of path (one rank), with the projections stacked or not
 * ($QE_CPU_FUSE_PROJ, read when the rig's backend is made); out [n][V]. */
static void prefill_fused(const char *path, const int32_t *ids, int n, int fused, float *out) {
  setenv("QE_CPU_FUSE_PROJ", fused ? "1" : "0", 1);
  tp_comm_t *c = NULL;
  rig_t r;
  CHECK_OK(tp_comm_create_single(&c));
  CHECK_OK(rig_open(&r, path, 0, 1, c, n));
  if (r.m) CHECK_OK(run_prefill(&r, ids, n, out));
  rig_close(&r);
  tp_comm_destroy(c);
  unsetenv("QE_CPU_FUSE_PROJ");
}

/* Stacked projections (the GPU's default, here through the CPU backend's weight_concat,
 * qkv_rope and swiglu_cat) give the separate projections' logits: a 12-token prefill, one of 600
 * tokens (past MODEL_FUSE_ROWS: the FFN runs the stacked weight's halves), and two ranks with
 * stacked shards (the environment reaches the forked ranks). */
static void check_fused(const rand_model_spec_t *sp) {
  char path[] = "/tmp/qe_test_fused_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  CHECK_OK(rand_model_write_ctx(sp, 1024, path));
  enum { NL = 600 };
  int32_t *ids = malloc(sizeof(int32_t) * NL);
  for (int i = 0; i < NL; i++) ids[i] = (prompt[i % NT] + i) % 250 + 1;
  gguf_t *g = NULL;
  model_hparams_t hp;
  CHECK_OK(gguf_open(path, &g));
  CHECK_OK(model_read_hparams(g, &hp));
  gguf_close(g);
  const int V = hp.n_vocab;
  float *a = malloc(sizeof(float) * NL * V), *b = malloc(sizeof(float) * NL * V);
  for (int k = 0; k < 2; k++) {
    const int n = k ? NL : NT;
    prefill_fused(path, ids, n, 0, a);
    prefill_fused(path, ids, n, 1, b);
    const double e = tu_rel_err(b, a, (size_t)n * V);
    if (e > 1e-6) fprintf(stderr, "stacked projections, %d tokens: rel err %g\n", n, e);
    CHECK(e <= 1e-6);
  }
  prefill_fused(path, ids, NT, 0, a);
  setenv("QE_CPU_FUSE_PROJ", "1", 1);
  const double e = tp_prefill_err(path, 2, ids, NT, a, V);
  unsetenv("QE_CPU_FUSE_PROJ");
  if (e > 1e-4) fprintf(stderr, "stacked projections, tp 2: rel err %g\n", e);
  CHECK(e <= 1e-4);
  free(ids), free(a), free(b);
  unlink(path);
}

/* A GGUF with metadata only: arch's sizes (embedding_length embd, absent when 0) and, when
 * fkey is given, "<arch>.<fkey>" = fval as f32. */
/* A model's metadata alone: arch, 4 layers and heads, embd (0: absent), and f32 key fkey = fval
 * and u32 key ukey = uval when not NULL. */
static int write_meta_kv(const char *path, const char *arch, uint32_t embd, const char *fkey,
                         float fval, const char *ukey, uint32_t uval) {
  gguf_writer_t *w = NULL;
  const char *toks[3] = {"<unk>", "<s>", "</s>"};
  char k[64];
  int rc = gguf_writer_create(&w);
  if (!rc) rc = gguf_writer_add_str(w, "general.architecture", arch);
  if (!rc) rc = gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  if (!rc) rc = gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", toks, 3);
  float scores[3] = {0, 0, 0};
  if (!rc) rc = gguf_writer_add_f32_arr(w, "tokenizer.ggml.scores", scores, 3);
  const char *keys[] = {"block_count", "feed_forward_length", "attention.head_count"};
  for (int i = 0; i < 3 && !rc; i++) {
    snprintf(k, sizeof k, "%s.%s", arch, keys[i]);
    rc = gguf_writer_add_u32(w, k, 4);
  }
  snprintf(k, sizeof k, "%s.embedding_length", arch);
  if (!rc && embd) rc = gguf_writer_add_u32(w, k, embd);
  snprintf(k, sizeof k, "%s.%s", arch, fkey ? fkey : "");
  if (!rc && fkey) rc = gguf_writer_add_f32(w, k, fval);
  snprintf(k, sizeof k, "%s.%s", arch, ukey ? ukey : "");
  if (!rc && ukey) rc = gguf_writer_add_u32(w, k, uval);
  if (!rc) rc = gguf_writer_save(w, path);
  gguf_writer_destroy(w);
  return rc;
}

static int write_meta_only(const char *path, const char *arch, uint32_t embd) {
  return write_meta_kv(path, arch, embd, NULL, 0, NULL, 0);
}

static int load_err(const char *path) {
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  kern_cpu_create(1, &be);
  model_load_opts_t o = {be, 0, 1, 16, 0};
  qe_errclear();
  int rc = model_load(path, &o, &m);
  if (rc) fprintf(stderr, "  expected error: %s: %s\n", qe_strerror(rc), qe_errmsg());
  CHECK(rc == 0 || *qe_errmsg());
  model_destroy(m);
  kern_destroy(be);
  return rc;
}

static void check_bad_models(void) {
  const char *p = "/tmp/qe_test_bad_model.gguf";
  CHECK_OK(write_meta_only(p, "gptj", 16));
  CHECK(load_err(p) == QE_EUNSUPPORTED);
  CHECK_OK(write_meta_only(p, "llama", 0));
  CHECK(load_err(p) == QE_ENOTFOUND);
  CHECK_OK(write_meta_only(p, "llama", 0xFFFFFFFFu));
  CHECK(load_err(p) == QE_EFORMAT);
  CHECK_OK(write_meta_only(p, "llama", 16));
  CHECK(load_err(p) == QE_ENOTFOUND); /* tensors are missing */
  CHECK(load_err("/nonexistent/model.gguf") == QE_EIO);
  rand_model_spec_t sp = {MODEL_ARCH_LLAMA, GGUF_T_F32, 8, 2, 0, 1, 3};
  CHECK_OK(rand_model_write(&sp, p));
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  kern_cpu_create(1, &be);
  model_load_opts_t o = {be, 0, 4, 16, 0}; /* 4 ranks > 2 KV heads */
  CHECK(model_load(p, &o, &m) == QE_EINVAL);
  kern_destroy(be);
  unlink(p);
}

/* model_read_hparams on a file whose f32 key `key` holds v: its error (the message naming the
 * key), or 0 with the hyperparameters in *hp. */
static int hparams_with(const char *key, float v, model_hparams_t *hp) {
  const char *p = "/tmp/qe_test_hparams.gguf";
  char full[96];
  gguf_t *g = NULL;
  CHECK_OK(write_meta_kv(p, "llama", 16, key, v, NULL, 0));
  CHECK_OK(gguf_open(p, &g));
  qe_errclear();
  int rc = g ? model_read_hparams(g, hp) : QE_EIO;
  snprintf(full, sizeof full, "llama.%s", key);
  if (rc) fprintf(stderr, "  expected error: %s\n", qe_errmsg());
  CHECK(!rc || strstr(qe_errmsg(), full));
  gguf_close(g);
  unlink(p);
  return rc;
}

/* Float hyperparameters: NaN, infinities and negatives are refused with the key named; a
 * RoPE base of 0 too; good values are read. */
static void check_bad_float_hparams(void) {
  const char *eps = "attention.layer_norm_rms_epsilon", *base = "rope.freq_base";
  const char *factor = "rope.scaling.factor";
  const float bad_nonneg[] = {NAN, INFINITY, -INFINITY, -1e-5f};
  model_hparams_t hp;
  for (int i = 0; i < 4; i++) {
    CHECK(hparams_with(eps, bad_nonneg[i], &hp) == QE_EFORMAT);
    CHECK(hparams_with(base, bad_nonneg[i], &hp) == QE_EFORMAT);
    CHECK(hparams_with(factor, bad_nonneg[i], &hp) == QE_EFORMAT);
  }
  CHECK(hparams_with(base, 0.0f, &hp) == QE_EFORMAT);
  CHECK(hparams_with(eps, 0.0f, &hp) == 0 && hp.rms_eps == 0.0f);
  CHECK(hparams_with(eps, 1e-6f, &hp) == 0 && hp.rms_eps == 1e-6f);
  CHECK(hparams_with(base, 5e5f, &hp) == 0 && hp.rope.theta == 5e5f);
  CHECK(hparams_with(factor, 0.0f, &hp) == 0 && hp.rope.freq_scale == 1.0f);
  /* a factor without rope.scaling.type is linear, and the older rope.scale_linear is read, as
   * llama.cpp does (both had been ignored: the model ran unscaled) */
  CHECK(hparams_with(factor, 4.0f, &hp) == 0 && hp.rope.freq_scale == 0.25f);
  CHECK(hparams_with("rope.scale_linear", 2.0f, &hp) == 0 && hp.rope.freq_scale == 0.5f);
  CHECK(hparams_with("rope.scale_linear", NAN, &hp) == QE_EFORMAT);
  /* values as long as keys (head_dim 16 / 4 here); another length is refused, naming the key */
  const char *p = "/tmp/qe_test_hparams_v.gguf";
  for (uint32_t v = 4; v <= 8; v += 4) {
    gguf_t *g = NULL;
    CHECK_OK(write_meta_kv(p, "llama", 16, NULL, 0, "attention.value_length", v));
    CHECK_OK(gguf_open(p, &g));
    int rc = g ? model_read_hparams(g, &hp) : QE_EIO;
    CHECK(v == 4 ? rc == 0 : rc == QE_EUNSUPPORTED && strstr(qe_errmsg(), "value_length 8"));
    gguf_close(g);
  }
  unlink(p);
  /* an explicit key length makes n_embd's divisibility by the heads moot (90 over 4 heads) */
  CHECK_OK(write_meta_kv(p, "llama", 90, NULL, 0, "attention.key_length", 16));
  gguf_t *g = NULL;
  CHECK_OK(gguf_open(p, &g));
  CHECK(g && model_read_hparams(g, &hp) == 0 && hp.head_dim == 16);
  gguf_close(g);
  CHECK_OK(write_meta_kv(p, "llama", 90, NULL, 0, NULL, 0));
  CHECK_OK(gguf_open(p, &g));
  CHECK(g && model_read_hparams(g, &hp) == QE_EFORMAT && strstr(qe_errmsg(), "inconsistent"));
  gguf_close(g);
  unlink(p);
}

/* A llama file with Q/K/V biases runs them, as llama.cpp does (they were dropped: the logits
 * equalled those of the same file with zero biases); one with a bias the forward pass has no
 * term for is refused, naming it. */
static void check_llama_bias(void) {
  const char *p = "/tmp/qe_test_llama_bias.gguf";
  rand_model_spec_t sp = {MODEL_ARCH_LLAMA, GGUF_T_F32, 8, 2, 0, 2, 34, 1};
  float *a = malloc(sizeof(float) * NT * 512), *b = malloc(sizeof(float) * NT * 512);
  gguf_t *g = NULL;
  model_hparams_t hp;
  CHECK_OK(rand_model_write(&sp, p));
  CHECK_OK(gguf_open(p, &g));
  CHECK(g && model_read_hparams(g, &hp) == 0 && hp.qkv_bias && hp.n_vocab <= 512);
  gguf_close(g);
  prefill_fused(p, prompt, NT, 0, a);
  sp.bias = 2; /* the same draws, the biases zero */
  CHECK_OK(rand_model_write(&sp, p));
  prefill_fused(p, prompt, NT, 0, b);
  const double e = tu_rel_err(a, b, (size_t)NT * hp.n_vocab);
  fprintf(stderr, "llama with Q/K/V biases against zero biases: rel diff %.3g\n", e);
  CHECK(e > 1e-2);
  sp.bias = 3;
  CHECK_OK(rand_model_write(&sp, p));
  CHECK_OK(gguf_open(p, &g));
  CHECK(g && model_read_hparams(g, &hp) == QE_EUNSUPPORTED &&
        strstr(qe_errmsg(), "blk.0.attn_output.bias"));
  gguf_close(g);
  free(a), free(b);
  unlink(p);
}

/* Generation: a prompt longer than the context is refused; sampling is seeded. */
static void check_generation(void) {
  const char *p = "/tmp/qe_test_gen_model.gguf";
  rand_model_spec_t sp = {MODEL_ARCH_QWEN2, GGUF_T_Q8_0, 8, 2, 1, 2, 11};
  CHECK_OK(rand_model_write(&sp, p));
  tp_comm_t *c = NULL;
  rig_t r;
  CHECK_OK(tp_comm_create_single(&c));
  CHECK_OK(rig_open(&r, p, 0, 1, c, 64));
  int32_t *longp = calloc(300, sizeof *longp);
  gen_seq_t s = {.prompt = longp, .n_prompt = 300};
  gen_stats_t st;
  gen_opts_t o = {8, {0.9f, 40, 0.95f}, 5, 1, NULL, NULL, NULL};
  CHECK(gen_run(r.m, r.kv, c, &s, 1, &o, &st) == QE_EINVAL);
  free(s.out);
  int32_t bad[2] = {1, 100000};
  gen_seq_t sb = {.prompt = bad, .n_prompt = 2};
  CHECK(gen_run(r.m, r.kv, c, &sb, 1, &o, &st) == QE_EINVAL);
  free(sb.out);
  gen_seq_t a[2] = {{.prompt = prompt, .n_prompt = NT}, {.prompt = prompt, .n_prompt = NT}};
  CHECK_OK(gen_run(r.m, r.kv, c, a, 2, &o, &st));
  gen_seq_t again = {.prompt = prompt, .n_prompt = NT};
  CHECK_OK(gen_run(r.m, r.kv, c, &again, 1, &o, &st));
  CHECK(a[0].n_out == 8 && again.n_out == 8);
  CHECK(!memcmp(a[0].out, again.out, sizeof(int32_t) * 8)); /* same seed, same tokens */
  CHECK(memcmp(a[0].out, a[1].out, sizeof(int32_t) * 8));   /* seed + 1 differs */
  free(a[0].out);
  free(a[1].out);
  free(again.out);
  free(longp);
  rig_close(&r);
  tp_comm_destroy(c);
  unlink(p);
}

/* A byte budget's shares by KV heads (model_kv_share) over every TP split of 1..8 KV heads,
 * fresh random budgets: they never sum past the whole, and model_kv_whole is the least whole
 * budget that gives a rank its bytes. */
static void check_kv_shares(void) {
  uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL);
  for (int n_kv = 1; n_kv <= 8; n_kv++)
    for (int tp = 1; tp <= n_kv; tp++)
      for (int it = 0; it < 200; it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const uint64_t bytes = it == 0 ? UINT64_MAX : x >> (it % 60), want = x % 100000007u;
        model_hparams_t hp = {0};
        hp.n_head = hp.n_head_kv = n_kv, hp.n_ff = 64;
        uint64_t sum = 0;
        for (int rank = 0; rank < tp; rank++) {
          model_shard_t sh;
          CHECK_OK(model_shard_of(&hp, rank, tp, &sh));
          sum += model_kv_share(&hp, &sh, bytes);
          const uint64_t w = model_kv_whole(&hp, &sh, want);
          CHECK(model_kv_share(&hp, &sh, w) >= want);
          CHECK(w == 0 || model_kv_share(&hp, &sh, w - 1) < want);
          CHECK(model_kv_share(&hp, &sh, model_kv_within(&hp, &sh, want)) <= want);
        }
        CHECK(sum <= bytes && (tp > 1 || sum == bytes));
      }
  model_hparams_t hp = {0}; /* SmolLM2: 3 KV heads over 2 ranks, 1 + 2 */
  hp.n_head = 9, hp.n_head_kv = 3, hp.n_ff = 64;
  model_shard_t r0, r1;
  CHECK_OK(model_shard_of(&hp, 0, 2, &r0));
  CHECK_OK(model_shard_of(&hp, 1, 2, &r1));
  CHECK(model_kv_share(&hp, &r0, 3000000) == 1000000 &&
        model_kv_share(&hp, &r1, 3000000) == 2000000);
  CHECK(model_kv_whole(&hp, &r0, 1000) == 3000 && model_kv_whole(&hp, &r1, 1000) == 1500);
  CHECK(model_kv_within(&hp, &r0, 1000) == 3000 && model_kv_within(&hp, &r1, 1001) == 1501);
}

int main(void) {
  check_kv_shares();
  check_all_models();
  rand_model_spec_t llama = {MODEL_ARCH_LLAMA, GGUF_T_F32, 8, 2, 0, 2, 31};
  rand_model_spec_t qwen = {MODEL_ARCH_QWEN2, GGUF_T_F32, 8, 4, 1, 2, 32}; /* (q, k, v biases) */
  check_fused(&llama), check_fused(&qwen);
  check_llama_bias();
  check_bad_models();
  check_bad_float_hparams();
  check_generation();
  return tu_done("test_model");
}
