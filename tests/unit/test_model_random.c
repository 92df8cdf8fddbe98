/* test_model_random: models built from a shape alone (model_create_random) on the CPU backend.
 * The named shapes hold Llama 3.1's numbers (rope_freqs included) and unknown names are
 * refused; the tiny model runs a prefill through a FullKV cache with finite logits, holds the
 * weight bytes its shape implies (one table for a tied output), is identical for one seed and
 * differs for another; two tensor-parallel ranks (forked, CPU socket collective) give the
 * 1-rank logits; the output layer in chunks of rows gives the logits of one chunk; and
 * inconsistent shapes or shards are refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "qe_status.h"
#include "test_util.h"

#define NT 10 /* prompt tokens */

static const int32_t prompt[NT] = {1, 40, 260, 7, 255, 12, 99, 180, 3, 511};

static void check_shapes(void) {
  model_hparams_t hp;
  CHECK_OK(model_shape_named("llama3-8b", &hp));
  CHECK(hp.n_vocab == 128256 && hp.n_embd == 4096 && hp.n_layer == 32 && hp.n_head == 32);
  CHECK(hp.n_head_kv == 8 && hp.head_dim == 128 && hp.n_ff == 14336 && !hp.tied_output);
  CHECK(hp.n_ctx_train == 131072 && hp.rope.mode == KERN_ROPE_NORM && hp.rope.n_rot == 128);
  CHECK(hp.rope.theta == 500000.0f && hp.rope.freq_scale == 1.0f && hp.rope.factors);
  if (hp.rope.factors) {
    /* wavelengths under 2048 keep their frequency, over 8192 are slowed 8x, smooth between */
    const float *f = hp.rope.factors;
    CHECK(f[0] == 1.0f && f[20] == 1.0f && f[63] == 8.0f && f[50] == 8.0f);
    int mid = 0, mono = 1;
    for (int i = 0; i < 64; i++) mid += f[i] > 1.0f && f[i] < 8.0f;
    for (int i = 1; i < 64; i++) mono &= f[i] >= f[i - 1];
    CHECK(mid > 0 && mono);
  }
  CHECK_OK(model_shape_named("llama3-70b", &hp));
  CHECK(hp.n_embd == 8192 && hp.n_layer == 80 && hp.n_head == 64 && hp.n_head_kv == 8);
  CHECK(hp.n_ff == 28672 && hp.n_vocab == 128256 && hp.rope.factors);
  qe_errclear();
  CHECK(model_shape_named("llama3-9b", &hp) == QE_EINVAL);
  CHECK(strstr(qe_errmsg(), "llama3-9b") && strstr(qe_errmsg(), "tiny"));
  CHECK(model_shape_named(NULL, &hp) == QE_EINVAL);
}

/* A tiny random model with a FullKV cache, as rank/size over c. */
typedef struct {
  kern_backend_t *be;
  model_t *m;
  kv_cache_t *kv;
} rrig_t;

static int rrig_open_rows(rrig_t *r, const model_hparams_t *hp, uint64_t seed, int rank, int size,
                          int out_rows) {
  memset(r, 0, sizeof *r);
  int rc = kern_cpu_create(1, &r->be);
  model_load_opts_t o = {r->be, rank, size, 32, out_rows};
  if (!rc) rc = model_create_random(hp, seed, &o, &r->m);
  kv_geom_t g;
  if (!rc) g = model_kv_geom(r->m, 1), rc = kv_full_create(r->be, &g, &r->kv);
  return rc;
}

static int rrig_open(rrig_t *r, const model_hparams_t *hp, uint64_t seed, int rank, int size) {
  return rrig_open_rows(r, hp, seed, rank, size, 0);
}

static void rrig_close(rrig_t *r) {
  kv_cache_destroy(r->kv);
  model_destroy(r->m);
  kern_destroy(r->be);
}

/* Prefill of the prompt in slot 0 with logits at every position: out [NT][V] (rank 0). */
static int rrig_prefill(rrig_t *r, tp_comm_t *c, float *out) {
  int32_t pos[NT], seq[NT] = {0};
  uint8_t want[NT];
  for (int i = 0; i < NT; i++) pos[i] = i, want[i] = 1;
  int rc = r->kv->ops->seq_open(r->kv, 0, NT);
  model_batch_t b = {NT, prompt, pos, seq, want};
  if (!rc) rc = model_forward(r->m, r->kv, c, &b, out);
  r->kv->ops->seq_close(r->kv, 0);
  return rc;
}

/* Logits [NT][V] of the 1-rank model of hp and seed (malloc'd; NULL on failure). */
static float *logits_of(const model_hparams_t *hp, uint64_t seed) {
  rrig_t r;
  tp_comm_t *c = NULL;
  float *lg = malloc(sizeof(float) * NT * (size_t)hp->n_vocab);
  int rc = tp_comm_create_single(&c);
  if (!rc) rc = rrig_open(&r, hp, seed, 0, 1);
  if (!rc) rc = rrig_prefill(&r, c, lg);
  CHECK_OK(rc);
  rrig_close(&r);
  tp_comm_destroy(c);
  if (rc) free(lg);
  return rc ? NULL : lg;
}

/* Backend bytes a 1-rank CPU model of hp holds (fp32 everywhere). */
static size_t expected_bytes(const model_hparams_t *hp) {
  size_t E = hp->n_embd, V = hp->n_vocab, F = hp->n_ff;
  size_t NQ = (size_t)hp->n_head * hp->head_dim, NK = (size_t)hp->n_head_kv * hp->head_dim;
  size_t layer = 2 * E + E * NQ + 2 * E * NK + NQ * E + 3 * E * F;
  return sizeof(float) * (V * E * (hp->tied_output ? 1 : 2) + E + hp->n_layer * layer);
}

static void check_tiny(void) {
  model_hparams_t hp;
  CHECK_OK(model_shape_named("tiny", &hp));
  rrig_t r;
  CHECK_OK(rrig_open(&r, &hp, 1, 0, 1));
  if (r.m) {
    CHECK(model_tok(r.m) == NULL && model_gguf(r.m) == NULL);
    CHECK(model_weight_bytes(r.m) == expected_bytes(&hp));
  }
  rrig_close(&r);
  size_t n = (size_t)NT * hp.n_vocab;
  float *a = logits_of(&hp, 1), *b = logits_of(&hp, 1), *d = logits_of(&hp, 2);
  if (!a || !b || !d) goto out;
  int finite = 1;
  double ss = 0;
  for (size_t i = 0; i < n; i++) finite &= isfinite(a[i]), ss += (double)a[i] * a[i];
  CHECK(finite && ss > 0);
  CHECK(!memcmp(a, b, sizeof(float) * n)); /* same seed: bit-identical */
  double e = tu_rel_err(d, a, n);
  fprintf(stderr, "tiny: logits rms %.3g; seed 2 vs seed 1 rel diff %.3g\n", sqrt(ss / n), e);
  CHECK(e > 1e-2); /* another seed: another model */
out:
  free(a), free(b), free(d);
}

/* A tied output shares token_embd: one fp32 table on the CPU, still sane logits. */
static void check_tied(void) {
  model_hparams_t hp;
  CHECK_OK(model_shape_named("tiny", &hp));
  hp.tied_output = 1;
  rrig_t r;
  CHECK_OK(rrig_open(&r, &hp, 5, 0, 1));
  if (r.m) CHECK(model_weight_bytes(r.m) == expected_bytes(&hp));
  rrig_close(&r);
  float *a = logits_of(&hp, 5);
  int finite = a != NULL;
  for (size_t i = 0; a && i < (size_t)NT * hp.n_vocab; i++) finite &= isfinite(a[i]);
  CHECK(finite);
  free(a);
}

/* The output layer in chunks of 3 rows (4 GEMMs for the prompt's 10 rows of logits) gives the
 * logits of one chunk (the default: as many rows as a forward call has, here 32). */
static void check_out_rows(void) {
  model_hparams_t hp;
  CHECK_OK(model_shape_named("tiny", &hp));
  float *ref = logits_of(&hp, 3), *lg = malloc(sizeof(float) * NT * (size_t)hp.n_vocab);
  rrig_t r;
  tp_comm_t *c = NULL;
  int rc = tp_comm_create_single(&c);
  if (!rc) rc = rrig_open_rows(&r, &hp, 3, 0, 1, 3);
  if (!rc) rc = rrig_prefill(&r, c, lg);
  CHECK_OK(rc);
  if (!rc && ref) {
    const double e = tu_rel_err(lg, ref, (size_t)NT * hp.n_vocab);
    fprintf(stderr, "tiny: logits in chunks of 3 rows vs one chunk: rel err %.3g\n", e);
    CHECK(e <= 1e-6);
  }
  if (!rc) rrig_close(&r);
  tp_comm_destroy(c);
  free(ref), free(lg);
}

typedef struct {
  const model_hparams_t *hp;
  uint64_t seed;
  int size;
} tp_job_t;

static void tp_child(void *ud, int rank, int fd) {
  const tp_job_t *j = ud;
  tp_comm_t *c = NULL;
  rrig_t r;
  int rc = tp_comm_create_cpu_fds(&fd, rank, j->size, &c);
  if (!rc) rc = rrig_open(&r, j->hp, j->seed, rank, j->size);
  if (!rc) rc = rrig_prefill(&r, c, NULL);
  _exit(rc ? 1 : 0);
}

/* The prompt on `size` forked ranks: rank 0's max relative error against ref [NT][V]
 * (INFINITY if a rank failed). */
static double tp_err(const model_hparams_t *hp, uint64_t seed, int size, const float *ref) {
  int fds[8] = {-1};
  pid_t pids[8] = {0};
  tp_job_t job = {hp, seed, size};
  if (tu_fork_ranks(size, tp_child, &job, fds, pids)) return INFINITY;
  tp_comm_t *c = NULL;
  rrig_t r;
  size_t n = (size_t)NT * hp->n_vocab;
  float *lg = malloc(sizeof(float) * n);
  int rc = tp_comm_create_cpu_fds(fds, 0, size, &c);
  if (!rc) rc = rrig_open(&r, hp, seed, 0, size);
  if (!rc) rc = rrig_prefill(&r, c, lg);
  double err = rc ? INFINITY : tu_rel_err(lg, ref, n);
  if (!tu_wait_ok(pids + 1, size - 1)) err = INFINITY;
  rrig_close(&r);
  tp_comm_destroy(c);
  free(lg);
  return err;
}

/* TP=2 on tiny; TP=2, 4 and 8 on tiny with 16 heads over 8 KV heads, so that TP=8 holds one KV
 * head (two query heads) a rank, as the Llama-3.1-8B shape does on eight GPUs. */
static void check_tp(void) {
  model_hparams_t hp;
  CHECK_OK(model_shape_named("tiny", &hp));
  for (int wide = 0; wide < 2; wide++) {
    if (wide) hp.n_head = 16, hp.n_head_kv = 8, hp.head_dim = 16, hp.rope.n_rot = 16;
    float *ref = logits_of(&hp, 9);
    if (!ref) return;
    for (int size = 2; size <= (wide ? 8 : 2); size *= 2) {
      double e = tp_err(&hp, 9, size, ref);
      fprintf(stderr, "tiny (%d/%d heads): TP=%d vs TP=1 rel err %.3g\n", hp.n_head, hp.n_head_kv,
              size, e);
      CHECK(e <= 1e-4);
    }
    free(ref);
  }
}

static int create_err(const model_hparams_t *hp, int rank, int size) {
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  CHECK_OK(kern_cpu_create(1, &be));
  model_load_opts_t o = {be, rank, size, 8, 0};
  qe_errclear();
  int rc = model_create_random(hp, 1, &o, &m);
  if (rc) fprintf(stderr, "  expected error: %s: %s\n", qe_strerror(rc), qe_errmsg());
  CHECK(rc == 0 || *qe_errmsg());
  model_destroy(m);
  kern_destroy(be);
  return rc;
}

static void check_refusals(void) {
  model_hparams_t hp, bad;
  CHECK_OK(model_shape_named("tiny", &hp));
  bad = hp, bad.n_head_kv = 3;
  CHECK(create_err(&bad, 0, 1) == QE_EINVAL);
  bad = hp, bad.n_vocab = 0;
  CHECK(create_err(&bad, 0, 1) == QE_EINVAL);
  bad = hp, bad.rope.n_rot = 33;
  CHECK(create_err(&bad, 0, 1) == QE_EINVAL);
  bad = hp, bad.arch = 7;
  CHECK(create_err(&bad, 0, 1) == QE_EINVAL);
  CHECK(create_err(&hp, 0, 4) == QE_EINVAL); /* 4 ranks > 2 KV heads */
  CHECK(create_err(&hp, 2, 2) == QE_EINVAL);
  kern_backend_t *be = NULL;
  kern_weight_t w = {0};
  CHECK_OK(kern_cpu_create(1, &be));
  float x = 1.0f;
  CHECK(be->ops->weight_upload(be, &w, &x, -1, 1) == QE_EINVAL && w.data == NULL);
  CHECK_OK(be->ops->weight_upload(be, &w, &x, 1, 1));
  CHECK(w.data && w.dtype == KERN_WEIGHT_F32 && kern_weight_bytes(&w) == 4);
  be->ops->weight_free(be, &w);
  CHECK(w.data == NULL);
  kern_destroy(be);
}

int main(void) {
  check_shapes();
  check_tiny();
  check_tied();
  check_out_rows();
  check_tp();
  check_refusals();
  return tu_done("test_model_random");
}
