/* test_smollm2: SmolLM2-135M-Instruct (Q4_1 GGUF from a package registry, fetched by
 * deploy/fetch-model.sh) against a Hugging Face transformers reference computed from the same
 * file (tests/fixtures/smollm2_ref.json, made by tools/make_reference.py): logits at the first
 * 64 positions within 1e-3 relative error, the same greedy continuation, and tensor parallel
 * (2 and 3 ranks, uneven KV-head splits) equal to one rank within fp32 rounding; the same with
 * packed weights (--cpu-weights packed: the Q4_1 and Q8_0 blocks kept as they are), and their
 * logits equal to the fp32 weights' within fp32 rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_rig.h"
#include "qe_status.h"
#include "test_util.h"
#include "tjson.h"

/* max |ours - ref| / max |ref| over the fixture's stored ids at one position. */
static double pos_err(const float *lg, const tj_t *ids, const tj_t *vals, double *ref_max) {
  double num = 0;
  for (size_t i = 0; i < ids->n; i++) {
    double r = vals->items[i]->num;
    num = fmax(num, fabs(lg[(int)ids->items[i]->num] - r));
    *ref_max = fmax(*ref_max, fabs(r));
  }
  return num;
}

static double l2(const float *x, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
  return sqrt(s);
}

/* Logits at the fixture's positions against transformers': the relative error and the norm's
 * within tol (1e-3 for fp32 weights), every argmax the same. */
static void check_logits(const float *lg, int V, const tj_t *ref, double tol) {
  const tj_t *pos = tj_get(ref, "positions"), *shared = tj_get(ref, "shared_ids");
  double worst = 0, worst_norm = 0;
  int argmax_ok = 1;
  for (size_t p = 0; p < pos->n; p++) {
    const tj_t *e = pos->items[p];
    const float *row = lg + p * V;
    double mx = 0, num = pos_err(row, tj_get(e, "top_ids"), tj_get(e, "top_logits"), &mx);
    num = fmax(num, pos_err(row, shared, tj_get(e, "shared_logits"), &mx));
    worst = fmax(worst, num / mx);
    worst_norm = fmax(worst_norm, fabs(l2(row, V) / tj_get(e, "norm")->num - 1));
    int am = 0;
    for (int i = 1; i < V; i++) am = row[i] > row[am] ? i : am;
    argmax_ok &= am == (int)tj_get(e, "argmax")->num;
  }
  fprintf(stderr, "logits vs transformers: max rel err %.3g, norm rel err %.3g, %zu positions\n",
          worst, worst_norm, pos->n);
  CHECK(worst <= tol);
  CHECK(worst_norm <= tol);
  CHECK(argmax_ok);
}

static int32_t *ids_of(const tj_t *arr, int *n) {
  int32_t *ids = malloc(sizeof(int32_t) * arr->n);
  for (size_t i = 0; i < arr->n; i++) ids[i] = (int32_t)arr->items[i]->num;
  *n = (int)arr->n;
  return ids;
}

static void check_greedy(rig_t *r, const tj_t *ref) {
  int n, ng;
  int32_t *prompt = ids_of(tj_get(ref, "prompt_ids"), &n),
          *gold = ids_of(tj_get(ref, "greedy_ids"), &ng);
  gen_seq_t s = {.prompt = prompt, .n_prompt = n};
  gen_stats_t st;
  gen_opts_t o = {ng, {0, 0, 1}, 0, 1, NULL, NULL, NULL};
  CHECK_OK(gen_run(r->m, r->kv, r->c, &s, 1, &o, &st));
  int same = s.n_out == ng;
  for (int i = 0; same && i < ng; i++)
    if (s.out[i] != gold[i]) {
      fprintf(stderr, "greedy: first divergence at generated token %d\n", i);
      same = 0;
    }
  fprintf(stderr, "greedy continuation (%d tokens): %s\n", ng, same ? "identical" : "DIFFERENT");
  CHECK(same);
  free(s.out);
  free(prompt);
  free(gold);
}

/* Packed weights (kern_cpu_create_ex PACKED): under 60% of the fp32 bytes, logits within
 * fp32 rounding of the fp32 weights' (ref32) and of transformers', the same greedy tokens. */
static void check_packed(const char *path, const int32_t *ids, int np, int V, const tj_t *ref,
                         tp_comm_t *c, const float *ref32, size_t bytes32) {
  rig_t r;
  float *lg = malloc(sizeof(float) * (size_t)np * V);
  CHECK_OK(rig_open_ex(&r, path, 0, 1, c, 128, KERN_WEIGHT_PACKED));
  if (r.m) {
    size_t bytes = model_weight_bytes(r.m);
    fprintf(stderr, "packed weights: %zu bytes (fp32: %zu)\n", bytes, bytes32);
    CHECK(bytes * 10 < bytes32 * 6); /* the embedding rows stay fp32 beside the packed output */
    CHECK_OK(run_prefill(&r, ids, np, lg));
    double e = tu_rel_err(lg, ref32, (size_t)np * V);
    fprintf(stderr, "packed logits vs fp32 weights: rel err %.3g\n", e);
    CHECK(e < 1e-5);
    check_logits(lg, V, ref, 1e-3);
    check_greedy(&r, ref);
  }
  rig_close(&r);
  free(lg);
}

/* tok_stream_emit's sink: appends to a buffer of 400 bytes. */
typedef struct {
  char b[400];
  size_t n;
} sink_t;

static void sink_put(void *ud, const char *text, size_t n) {
  sink_t *k = ud;
  CHECK(k->n + n <= sizeof k->b);
  if (k->n + n <= sizeof k->b) memcpy(k->b + k->n, text, n), k->n += n;
}

/* Tokens whose text is longer than a fixed buffer (45855: 80 '#'; 198: "\n") stream whole
 * through tok_stream_emit (the server's stream once cut them at 64 bytes, generate's at 256). */
static void check_long_pieces(const model_t *m) {
  tok_stream_t st;
  tok_stream_init(&st, model_tok(m), 0, 1);
  const int ids[] = {45855, 198, 45855};
  char want[161];
  sink_t k = {.n = 0};
  memset(want, '#', 80), want[80] = '\n', memset(want + 81, '#', 80);
  for (int i = 0; i < 3; i++) {
    const size_t before = k.n;
    const int n = tok_stream_emit(&st, ids[i], sink_put, &k);
    CHECK(n > 0 && (size_t)n == k.n - before && (size_t)n <= tok_stream_room(&st, ids[i]));
  }
  CHECK(k.n == 161 && !memcmp(k.b, want, 161));
  CHECK(tok_stream_room(&st, -1) == 0);
}

int main(void) {
  const char *env = getenv("QE_SMOLLM2");
  if (!env || access(env, R_OK)) tu_skip("SmolLM2 GGUF absent (run deploy/fetch-model.sh)");
  tj_t *ref = tj_load(tu_env_path("QE_FIXTURES", "smollm2_ref.json"));
  if (!ref) tu_skip("tests/fixtures/smollm2_ref.json unreadable");
  int n, V = (int)tj_get(ref, "n_vocab")->num, np = (int)tj_get(ref, "n_positions")->num;
  int32_t *ids = ids_of(tj_get(ref, "ids"), &n);
  tp_comm_t *c = NULL;
  rig_t r;
  float *lg = malloc(sizeof(float) * (size_t)np * V);
  CHECK_OK(tp_comm_create_single(&c));
  CHECK_OK(rig_open(&r, env, 0, 1, c, 128));
  CHECK(r.m && model_hparams(r.m)->n_vocab == V && n == np);
  if (r.m) {
    CHECK_OK(run_prefill(&r, ids, np, lg));
    check_logits(lg, V, ref, 1e-3);
    check_greedy(&r, ref);
    check_long_pieces(r.m);
  }
  size_t bytes32 = r.m ? model_weight_bytes(r.m) : 0;
  rig_close(&r);
  check_packed(env, ids, np, V, ref, c, lg, bytes32);
  tp_comm_destroy(c);
  for (int size = 2; size <= 3; size++) {
    double e = tp_prefill_err(env, size, ids, np, lg, V);
    fprintf(stderr, "tp %d: logits max rel err vs tp 1: %.3g\n", size, e);
    CHECK(e < 1e-5);
  }
  free(lg);
  free(ids);
  tj_free(ref);
  return tu_done("test_smollm2");
}
