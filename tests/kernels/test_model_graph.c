/* test_model_graph: decode steps replayed as CUDA graphs (model_graph.c) against the same
 * generation run eagerly (model_set_graphs off, as QE_CUDA_GRAPHS=0), on a random llama shape
 * (head_dim 64, GQA 8/2, 2 layers) over the GPU FullKV cache and the tiered QEvict cache (a
 * budget of 1.5 times the protected regions: INT2 windows attended, windows routed during
 * decode). 21 sequences of different prompt lengths and lengths to generate, 13 of them added
 * three steps after the others (mixed prefill + decode steps run eagerly in between), so
 * decode-only steps of 21..1 rows hit the buckets 32 (padded), 16, 8, 4, 2 and 1, and
 * sequences finish at different steps. Checks:
 * - greedy (device argmax) and logits (host sampling path) runs: every sequence's tokens equal
 *   the eager run's;
 * - logits equal the eager run's to 1e-4 of the row's largest magnitude: the recorded step runs
 *   the same kernels with the same attention chunking (read from the device) on the same rows,
 *   so only cuBLASLt may pick another GEMM kernel for a padded row count (m = bucket instead of
 *   n); rows of unpadded steps are usually bitwise equal (counted and printed);
 * - graphs were recorded and replayed (captures > 0, replays > captures) for each new cache
 *   (graphs of another cache are never replayed), and none with graphs off;
 * - the same through a kv_mux (the daemon's cache) over a FullKV and a tiered child: every row
 *   in one child, and rows split between them (steps with both: graphs in which each child
 *   launches over every row and writes its own rows, KV_FIXED_SKIP; of one child: that child's
 *   graphs; recorded again whenever the set of children changes): no decode step eager.
 * Exits 77 when there is no CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kern_cuda.h"
#include "kv_gpu.h"
#include "kv_mux.h"
#include "kv_policy.h"
#include "model.h"
#include "model_gen.h"
#include "qe_status.h"
#include "test_util.h"

#define N_SEQ     21
#define N_LATE    13 /* sequences 8..20 join after LATE_STEP steps */
#define LATE_STEP 3
#define MAX_GEN   80
#define VOCAB     512

typedef struct {
  int32_t tok[N_SEQ][MAX_GEN];
  int n_tok[N_SEQ];
  float *logits; /* [N_SEQ][MAX_GEN][VOCAB] when recorded */
  int n_logits[N_SEQ];
} run_out_t;

static int n_prompt(int i) { return 60 + 7 * i; }
static int n_predict(int i) { return 4 + (i * 13) % 60; }

static void on_logits(void *ud, int slot, const float *lg, int n) {
  run_out_t *o = ud;
  if (n != VOCAB || o->n_logits[slot] >= MAX_GEN) return;
  memcpy(o->logits + ((size_t)slot * MAX_GEN + o->n_logits[slot]++) * VOCAB, lg, sizeof *lg * n);
}

static int add_seq(gen_engine_t *e, int i) {
  int32_t prompt[256];
  uint64_t st = kern_rng_seed(1000 + (uint64_t)i);
  for (int t = 0; t < n_prompt(i); t++) prompt[t] = (int32_t)(kern_rng_uniform(&st) * VOCAB);
  gen_req_t r = {.prompt = prompt,
                 .n_prompt = n_prompt(i),
                 .n_predict = n_predict(i),
                 .sampler = {0, 0, 1.0f},
                 .ignore_eog = 1};
  return gen_engine_add(e, i, &r);
}

/* Runs the staggered batch to completion; fills o's tokens (and logits when recording). */
static int run(model_t *m, kv_cache_t *kv, tp_comm_t *c, run_out_t *o, int want_logits) {
  gen_engine_opts_t eo = {.ud = o, .on_logits = want_logits ? on_logits : NULL};
  gen_engine_t *e = NULL;
  int rc = gen_engine_create(m, kv, c, &eo, &e), active = 1;
  for (int i = 0; i < N_SEQ - N_LATE && !rc; i++) rc = add_seq(e, i);
  for (int step = 0; !rc && active; step++) {
    for (int i = N_SEQ - N_LATE; step == LATE_STEP && i < N_SEQ && !rc; i++) rc = add_seq(e, i);
    if (!rc) rc = gen_engine_step(e, &active);
    active |= step < LATE_STEP;
  }
  for (int i = 0; i < N_SEQ && !rc; i++) {
    const int32_t *t = gen_engine_tokens(e, i, &o->n_tok[i]);
    CHECK(t && o->n_tok[i] == n_predict(i));
    if (t) memcpy(o->tok[i], t, sizeof *t * (size_t)o->n_tok[i]);
  }
  gen_engine_destroy(e);
  return rc;
}

enum { FULLKV, TIERED, MUX_ONE, MUX_TWO, N_KINDS };
static const char *kind_name[N_KINDS] = {"FullKV", "tiered qevict", "mux, every row in its FullKV",
                                         "mux, FullKV + tiered rows"};

static kv_cache_t *make_child(model_t *m, int tiered) {
  kv_geom_t g = model_kv_geom(m, N_SEQ);
  int cap = 256 + MAX_GEN;
  kv_cache_t *kv = NULL;
  if (!tiered) {
    CHECK_OK(kv_gpu_create(model_backend(m), &g, KV_GPU_OMEGA, cap,
                           kv_gpu_pool_bytes(&g, KV_GPU_OMEGA, N_SEQ, cap), &kv));
    return kv;
  }
  kv_policy_desc_t d;
  size_t min_budget = 0;
  CHECK_OK(kv_policy_find("qevict", &d));
  CHECK_OK(kv_gpu_bounds(&g, &d.cfg, 0, NULL, &min_budget, NULL));
  /* half again the protected regions: longer sequences are under pressure (INT2, evictions) */
  CHECK_OK(kv_gpu_create_tiered(model_backend(m), &g, &model_hparams(m)->rope, &d.cfg, cap, N_SEQ,
                                1.0, min_budget + min_budget / 2, &kv));
  return kv;
}

/* The cache of a kind: a GPU cache, or the daemon's kind of cache, a kv_mux over a FullKV and a
 * tiered child with every slot bound to the FullKV child (MUX_ONE: every fixed step forwarded to
 * it) or the first sequences' slots to the tiered one (MUX_TWO: steps with rows of both run
 * eagerly, steps of one child's rows as graphs, recorded again when the child changes). */
static kv_cache_t *make_cache(model_t *m, int kind) {
  if (kind == FULLKV || kind == TIERED) return make_child(m, kind == TIERED);
  kv_geom_t g = model_kv_geom(m, N_SEQ);
  kv_cache_t *mux = NULL, *ch[2] = {make_child(m, 0), make_child(m, 1)};
  int id[2] = {-1, -1};
  CHECK_OK(kv_mux_create(model_backend(m), &g, &mux));
  for (int k = 0; k < 2; k++)
    if (mux && ch[k] && kv_mux_add_child(mux, ch[k], &id[k])) kv_cache_destroy(ch[k]);
  for (int i = 0; mux && id[0] >= 0 && id[1] >= 0 && i < N_SEQ; i++)
    CHECK_OK(kv_mux_bind(mux, i, id[kind == MUX_TWO && i < N_SEQ - N_LATE], i));
  return mux;
}

/* Largest |a - b| over a row, relative to the row's largest |b|. */
static double row_err(const float *a, const float *b) {
  double e = 0, mx = 1e-30;
  for (int j = 0; j < VOCAB; j++) {
    e = fmax(e, fabs((double)a[j] - b[j]));
    mx = fmax(mx, fabs((double)b[j]));
  }
  return e / mx;
}

static void compare(const char *what, const run_out_t *g, const run_out_t *e, int logits) {
  long rows = 0, exact = 0;
  double worst = 0;
  for (int i = 0; i < N_SEQ; i++) {
    int same = g->n_tok[i] == e->n_tok[i] &&
               !memcmp(g->tok[i], e->tok[i], sizeof(int32_t) * (size_t)e->n_tok[i]);
    if (!same) fprintf(stderr, "%s: sequence %d differs\n", what, i);
    CHECK(same);
    for (int k = 0; logits && k < e->n_logits[i]; k++, rows++) {
      const float *a = g->logits + ((size_t)i * MAX_GEN + k) * VOCAB;
      const float *b = e->logits + ((size_t)i * MAX_GEN + k) * VOCAB;
      double err = row_err(a, b);
      worst = fmax(worst, err), exact += !memcmp(a, b, sizeof(float) * VOCAB);
      CHECK(err <= 1e-4 && err == err);
    }
    if (logits) CHECK(g->n_logits[i] == e->n_logits[i]);
  }
  printf("%s: tokens equal; %ld logits rows, %ld bitwise equal, worst %.2e\n", what, rows, exact,
         worst);
}

/* One cache kind and output path: graphs on (twice the captures check) against graphs off. */
static void check_case(model_t *m, tp_comm_t *c, int kind, int logits) {
  char what[96];
  snprintf(what, sizeof what, "%s, %s", kind_name[kind], logits ? "logits" : "greedy ids");
  run_out_t *o[2] = {calloc(1, sizeof(run_out_t)), calloc(1, sizeof(run_out_t))};
  for (int k = 0; k < 2 && logits; k++)
    o[k]->logits = calloc((size_t)N_SEQ * MAX_GEN * VOCAB, sizeof(float));
  for (int on = 1; on >= 0; on--) {
    model_graph_stats_t before, after;
    kv_cache_t *kv = make_cache(m, kind);
    model_set_graphs(m, on);
    model_graph_stats(m, &before);
    if (kv) CHECK_OK(run(m, kv, c, o[on], logits));
    model_graph_stats(m, &after);
    long cap = after.captures - before.captures, rep = after.replays - before.replays;
    printf("%s, graphs %s: %ld captures, %ld replays, %ld warm-ups, %ld eager decode steps\n", what,
           on ? "on" : "off", cap, rep, after.warmups - before.warmups,
           after.eager_steps - before.eager_steps);
    CHECK(on ? cap > 0 && rep > cap : cap == 0 && rep == 0);
    if (on && kind == MUX_TWO) CHECK(cap >= 2 && after.eager_steps == before.eager_steps);
    kv_cache_destroy(kv);
  }
  compare(what, o[1], o[0], logits);
  for (int k = 0; k < 2; k++) free(o[k]->logits), free(o[k]);
}

static model_hparams_t shape(void) {
  model_hparams_t hp;
  CHECK_OK(model_shape_named("tiny", &hp));
  hp.n_embd = 512, hp.n_head = 8, hp.n_head_kv = 2, hp.head_dim = 64, hp.n_ff = 1024;
  hp.rope.n_rot = 64, hp.n_vocab = VOCAB;
  return hp;
}

int main(void) {
  if (kern_cuda_device_count() <= 0) tu_skip("no CUDA device visible (the CUDA backend is built)");
  kern_backend_t *be = NULL;
  model_t *m = NULL;
  tp_comm_t *c = NULL;
  model_hparams_t hp = shape();
  CHECK_OK(kern_cuda_create(0, &be));
  model_load_opts_t o = {be, 0, 1, 4096, 0}; /* every prompt in one step: the tiered GPU cache
                                             takes a prompt in one piece */
  if (be) CHECK_OK(model_create_random(&hp, 7, &o, &m));
  CHECK_OK(tp_comm_create_single(&c));
  for (int k = 0; m && c && k < N_KINDS; k++)
    for (int l = 0; l < 2; l++) check_case(m, c, k, l);
  tp_comm_destroy(c);
  model_destroy(m);
  kern_destroy(be);
  return tu_done("model_graph");
}
