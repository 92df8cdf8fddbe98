/* test_gen_engine: the step engine on a random model. Sequences joining at different steps
 * while others decode give the tokens each gives alone (gen_run); teacher forcing resumes a
 * sampled run exactly; cancel frees a slot for reuse; long prompts are chunked; a cache's prompt
 * room defers whole prompts to later passes; EOG and the context cap finish sequences; bad
 * requests and refused opens leave the slot free; over a tiered cache, decode steps read in
 * place next to prompts give the gathered path's tokens; and two tensor-parallel ranks (forked,
 * CPU socket collective) agree on opens (argument bytes included) and give the tokens of one
 * rank, the follower's hooks seeing each close before it happens and ticking once per
 * operation; a follower that dies mid-request leaves the step QE_ECOMM and its sequences open
 * and unreported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_policy.h"
#include "kv_tiered.h"
#include "model_gen.h"
#include "model_rig.h"
#include "qe_status.h"
#include "rand_model.h"
#include "test_util.h"

enum { MAXT = 64 };

static const kern_sampler_t greedy = {0, 0, 1};
static const kern_sampler_t warm = {0.9f, 40, 0.95f};

static int32_t p0[12], p1[20], p2[7], plong[45];

/* The state of tp_hook (its ud): open arguments are [slot, flags, pattern...] of 100 + slot
 * bytes; flags 1: rank 1 refuses, 2: rank 0 refuses. The hook checks every byte. */
typedef struct {
  int rank, opens, bad;
} tp_hook_t;

/* What the callbacks saw, per slot (the engine's ud: also the open hook's, hence `hook`
 * first). */
typedef struct {
  tp_hook_t hook;
  int n[4];
  int32_t tok[4][MAXT];
  uint8_t forced[4][MAXT];
  int first_step[4]; /* engine step (rec_t.step) of the first token */
  int finish[4];
  int step;
  int bad_index;
} rec_t;

static void rec_token(void *ud, int slot, int index, int id, int forced) {
  rec_t *r = ud;
  if (index != r->n[slot] || index >= MAXT) {
    r->bad_index++;
    return;
  }
  if (!index) r->first_step[slot] = r->step;
  r->tok[slot][index] = id;
  r->forced[slot][index] = (uint8_t)forced;
  r->n[slot]++;
}

static void rec_finish(void *ud, int slot, int reason) { ((rec_t *)ud)->finish[slot] = reason; }

static void rec_reset(rec_t *r, int slot) {
  r->n[slot] = 0;
  r->finish[slot] = GEN_FINISH_NONE;
  r->first_step[slot] = -1;
}

static gen_engine_t *engine(rig_t *r, rec_t *rec, int max_prompt) {
  gen_engine_t *e = NULL;
  gen_engine_opts_t o = {NULL, rec_token, rec_finish, rec, max_prompt, NULL};
  memset(rec, 0, sizeof *rec);
  for (int i = 0; i < 4; i++) rec_reset(rec, i);
  CHECK_OK(gen_engine_create(r->m, r->kv, r->c, &o, &e));
  return e;
}

static gen_req_t req(const int32_t *p, int np, int n_predict, kern_sampler_t s, uint64_t seed) {
  return (gen_req_t){p, np, n_predict, s, seed, 1, NULL, 0, NULL, 0};
}

/* Runs steps until idle (at most `max` steps); returns the steps run. */
static int run_steps(gen_engine_t *e, rec_t *rec, int max) {
  int active = 1, n = 0;
  while (active && n < max) {
    CHECK_OK(gen_engine_step(e, &active));
    n += active;
    rec->step++;
  }
  return n;
}

/* The sequence alone through gen_run (slot 0, seed as given); tokens into out, returns n. */
static int alone(rig_t *r, const int32_t *p, int np, int n_predict, kern_sampler_t s, uint64_t seed,
                 int32_t *out) {
  gen_seq_t q = {.prompt = p, .n_prompt = np};
  gen_opts_t o = {n_predict, s, seed, 1, NULL, NULL, NULL};
  gen_stats_t st;
  CHECK_OK(gen_run(r->m, r->kv, r->c, &q, 1, &o, &st));
  int n = q.n_out;
  if (n) memcpy(out, q.out, sizeof(int32_t) * n);
  free(q.out);
  return n;
}

static int same(const int32_t *a, int na, const int32_t *b, int nb) {
  return na == nb && !memcmp(a, b, sizeof(int32_t) * (size_t)na);
}

/* (a) Sequences join at different steps while others decode. */
static void check_staggered(rig_t *r) {
  int32_t ref[3][MAXT];
  int nr[3] = {alone(r, p0, 12, 24, greedy, 0, ref[0]), alone(r, p1, 20, 16, greedy, 0, ref[1]),
               alone(r, p2, 7, 30, greedy, 0, ref[2])};
  rec_t rec;
  gen_engine_t *e = engine(r, &rec, 0);
  gen_req_t a = req(p0, 12, 24, greedy, 0), b = req(p1, 20, 16, greedy, 0),
            c = req(p2, 7, 30, greedy, 0);
  CHECK_OK(gen_engine_add(e, 0, &a));
  CHECK(run_steps(e, &rec, 3) == 3 && rec.n[0] == 3);
  CHECK_OK(gen_engine_add(e, 2, &b));
  CHECK(run_steps(e, &rec, 5) == 5 && rec.n[0] == 8 && rec.n[2] == 5);
  CHECK_OK(gen_engine_add(e, 1, &c));
  CHECK(gen_engine_n_active(e) == 3 && gen_engine_slot_busy(e, 1) && !gen_engine_slot_busy(e, 3));
  int n = 0;
  const int32_t *t = gen_engine_tokens(e, 2, &n);
  CHECK(n == 5 && same(t, n, rec.tok[2], 5));
  run_steps(e, &rec, 100);
  CHECK(gen_engine_n_active(e) == 0);
  CHECK(same(rec.tok[0], rec.n[0], ref[0], nr[0]));
  CHECK(same(rec.tok[2], rec.n[2], ref[1], nr[1]));
  CHECK(same(rec.tok[1], rec.n[1], ref[2], nr[2]));
  CHECK(rec.finish[0] == GEN_FINISH_LENGTH && rec.finish[1] == GEN_FINISH_LENGTH &&
        rec.finish[2] == GEN_FINISH_LENGTH && rec.bad_index == 0);
  t = gen_engine_tokens(e, 1, &n); /* still readable after the finish */
  CHECK(same(t, n, ref[2], nr[2]));
  gen_stats_t st;
  gen_engine_stats(e, &st);
  CHECK(st.n_prompt == 12 + 20 + 7 && st.n_gen == 24 + 16 + 30);
  fprintf(stderr, "staggered joins: %d + %d + %d tokens in %d steps, as alone\n", nr[0], nr[1],
          nr[2], st.n_steps);
  gen_engine_destroy(e);
}

/* Staggered joins over a tiered cache (qevict at `frac`): sequences prefill while others
 * decode, so the cache gets calls that mix prompts (gathered) and decode steps (read in place,
 * unless `gather`). Tokens into tok[3][MAXT], counts into n[3]; returns the demotions. */
static long tiered_staggered(rig_t *r, double frac, int gather, int32_t tok[3][MAXT], int *n) {
  kv_policy_desc_t d;
  kv_geom_t g = model_kv_geom(r->m, 4);
  kv_cache_t *full = r->kv, *kv = NULL;
  CHECK_OK(kv_policy_find("qevict", &d));
  CHECK_OK(kv_tiered_create(r->be, &g, &model_hparams(r->m)->rope, &d.cfg, 16u << 20, &kv));
  kv_tiered_set_budget_spec(kv, frac, 0);
  kv_tiered_set_gather(kv, gather);
  r->kv = kv;
  rec_t rec;
  gen_engine_t *e = engine(r, &rec, 0);
  gen_req_t a = req(plong, 45, 40, greedy, 0), b = req(p1, 20, 50, greedy, 0),
            c = req(plong, 45, 30, greedy, 0);
  CHECK_OK(gen_engine_add(e, 0, &a));
  run_steps(e, &rec, 4);
  CHECK_OK(gen_engine_add(e, 1, &b));
  run_steps(e, &rec, 3);
  CHECK_OK(gen_engine_add(e, 2, &c));
  run_steps(e, &rec, 200);
  long dem = 0;
  for (int i = 0; i < 3; i++) { /* each slot's last sequence's, once closed */
    kv_mem_stats_t st;
    kv_tiered_stats(kv, i, &st);
    dem += st.demotions;
  }
  for (int i = 0; i < 3; i++) n[i] = rec.n[i], memcpy(tok[i], rec.tok[i], sizeof(int32_t) * MAXT);
  CHECK(rec.bad_index == 0 && rec.n[0] == 40 && rec.n[1] == 50 && rec.n[2] == 30);
  gen_engine_destroy(e);
  kv_cache_destroy(kv);
  r->kv = full;
  return dem;
}

/* (a') The in-place decode in mixed calls gives the gathered path's tokens, INT2 windows and
 * all (the cache's logits are the same bits either way: test_kv_tiered). */
static void check_tiered_mixed(rig_t *r) {
  int32_t want[3][MAXT], got[3][MAXT];
  int nw[3], ng[3];
  long dem = tiered_staggered(r, 0.7, 1, want, nw);
  tiered_staggered(r, 0.7, 0, got, ng);
  int same3 = 1;
  for (int i = 0; i < 3; i++) same3 &= same(want[i], nw[i], got[i], ng[i]);
  fprintf(stderr, "tiered, staggered joins: in place %s gathered (demotions %ld)\n",
          same3 ? "gives the tokens of" : "DIFFERS from", dem);
  CHECK(same3 && dem > 0);
}

/* (b) A sampled run resumed from its first 8 tokens (forced) continues exactly. */
static void check_resume(rig_t *r) {
  int32_t ref[MAXT];
  CHECK(alone(r, p0, 12, 20, warm, 99, ref) == 20);
  rec_t rec;
  gen_engine_t *e = engine(r, &rec, 0);
  gen_req_t q = req(p0, 12, 20, warm, 99);
  q.forced = ref, q.n_forced = 8;
  CHECK_OK(gen_engine_add(e, 3, &q));
  run_steps(e, &rec, 100);
  CHECK(same(rec.tok[3], rec.n[3], ref, 20));
  int forced_ok = 1;
  for (int i = 0; i < rec.n[3]; i++) forced_ok &= rec.forced[3][i] == (i < 8);
  int agree = gen_engine_n_agree(e, 3);
  CHECK(forced_ok && agree == 8);
  /* the same through gen_run's teacher forcing */
  gen_seq_t s = {.prompt = p0, .n_prompt = 12, .forced = ref, .n_forced = 8};
  gen_opts_t o = {20, warm, 99, 1, NULL, NULL, NULL};
  gen_stats_t st;
  CHECK_OK(gen_run(r->m, r->kv, r->c, &s, 1, &o, &st));
  CHECK(same(s.out, s.n_out, ref, 20) && s.n_agree == 8 && s.finish == GEN_FINISH_LENGTH);
  free(s.out);
  /* forcing other tokens: they are fed back, and the continuation changes */
  int32_t other[8];
  for (int i = 0; i < 8; i++) other[i] = (ref[i] + 1) % 200 + 3;
  q.forced = other;
  rec_reset(&rec, 3);
  CHECK_OK(gen_engine_add(e, 3, &q));
  run_steps(e, &rec, 100);
  CHECK(rec.n[3] == 20 && !memcmp(rec.tok[3], other, sizeof other));
  CHECK(memcmp(rec.tok[3] + 8, ref + 8, sizeof(int32_t) * 12));
  fprintf(stderr, "resume: forced 8 + sampled 12 equal the original run (agreement %d/8)\n", agree);
  gen_engine_destroy(e);
}

/* (c) Cancel mid-run frees the slot; it is reused; the other sequence is unaffected. */
static void check_cancel(rig_t *r) {
  int32_t ref0[MAXT], ref2[MAXT];
  int n0 = alone(r, p0, 12, 30, greedy, 0, ref0), n2 = alone(r, p2, 7, 10, greedy, 0, ref2);
  rec_t rec;
  gen_engine_t *e = engine(r, &rec, 0);
  gen_req_t a = req(p0, 12, 30, greedy, 0), b = req(p1, 20, 30, greedy, 0),
            c = req(p2, 7, 10, greedy, 0);
  CHECK_OK(gen_engine_add(e, 0, &a));
  CHECK_OK(gen_engine_add(e, 1, &b));
  run_steps(e, &rec, 5);
  CHECK_OK(gen_engine_cancel(e, 1));
  CHECK(rec.finish[1] == GEN_FINISH_CANCELLED && !gen_engine_slot_busy(e, 1));
  CHECK(gen_engine_n_active(e) == 1 && r->kv->ops->seq_bytes(r->kv, 1) == 0);
  CHECK(gen_engine_cancel(e, 1) == QE_EINVAL && gen_engine_cancel(e, 3) == QE_EINVAL);
  int n = 0;
  gen_engine_tokens(e, 1, &n);
  CHECK(n == 5 && rec.n[1] == 5);
  rec_reset(&rec, 1);
  CHECK_OK(gen_engine_add(e, 1, &c));
  run_steps(e, &rec, 100);
  CHECK(same(rec.tok[0], rec.n[0], ref0, n0) && same(rec.tok[1], rec.n[1], ref2, n2));
  CHECK(rec.finish[1] == GEN_FINISH_LENGTH && gen_engine_n_active(e) == 0);
  gen_engine_destroy(e);
}

/* (d) A prompt longer than max_prompt_per_step is fed in chunks beside a decoding stream. */
static void check_chunked(rig_t *r) {
  int32_t ref0[MAXT], refl[MAXT];
  int n0 = alone(r, p0, 12, 20, greedy, 0, ref0), nl = alone(r, plong, 45, 10, greedy, 0, refl);
  rec_t rec;
  gen_engine_t *e = engine(r, &rec, 8);
  gen_req_t a = req(p0, 12, 20, greedy, 0), b = req(plong, 45, 10, greedy, 0);
  CHECK_OK(gen_engine_add(e, 0, &a));
  run_steps(e, &rec, 2); /* 12 prompt tokens at 8 per step */
  CHECK(rec.n[0] == 1 && rec.first_step[0] == 1);
  CHECK_OK(gen_engine_add(e, 1, &b));
  int over = 0, active = 1, added_at = rec.step;
  while (active) {
    gen_stats_t s0, s1;
    gen_engine_stats(e, &s0);
    CHECK_OK(gen_engine_step(e, &active));
    gen_engine_stats(e, &s1);
    over += s1.n_prompt - s0.n_prompt > 8;
    rec.step++;
  }
  CHECK(over == 0);
  CHECK(rec.first_step[1] == added_at + 5); /* ceil(45 / 8) = 6 steps of prompt */
  CHECK(same(rec.tok[0], rec.n[0], ref0, n0) && same(rec.tok[1], rec.n[1], refl, nl));
  fprintf(stderr, "chunked prefill: 45 tokens over %d steps, tokens as gen_run's\n",
          rec.first_step[1] - added_at + 1);
  gen_engine_destroy(e);
}

/* (e) A cache with a prompt room (kv_cache_prompt_room; the tiered GPU cache has one): the rig's
 * FullKV cache given a room of 25 tokens through a copy of its ops. Prompts of 12, 20 and 7
 * tokens added together go in three passes, each whole; a 45-token prompt goes whole in a pass of
 * its own (a pass's first prompt always goes); the tokens are gen_run's. */
static int room25(const kv_cache_t *kv) {
  (void)kv;
  return 25;
}

static void check_prompt_room(rig_t *r) {
  int32_t ref[4][MAXT];
  const int32_t *ps[4] = {p0, p1, p2, plong};
  const int np[4] = {12, 20, 7, 45};
  int nr[4];
  for (int i = 0; i < 4; i++) nr[i] = alone(r, ps[i], np[i], 6, greedy, 0, ref[i]);
  const kv_cache_ops_t *own = r->kv->ops;
  kv_cache_ops_t roomy = *own;
  roomy.prompt_room = room25;
  r->kv->ops = &roomy;
  CHECK(kv_cache_prompt_room(r->kv) == 25);
  rec_t rec;
  gen_engine_t *e = engine(r, &rec, 0);
  for (int i = 0; i < 4; i++) {
    gen_req_t q = req(ps[i], np[i], 6, greedy, 0);
    CHECK_OK(gen_engine_add(e, i, &q));
  }
  int fed[8] = {0}, k = 0, active = 1;
  while (active && k < 8) {
    gen_stats_t s0, s1;
    gen_engine_stats(e, &s0);
    CHECK_OK(gen_engine_step(e, &active));
    gen_engine_stats(e, &s1);
    fed[k++] = (int)(s1.n_prompt - s0.n_prompt);
    rec.step++;
  }
  CHECK(fed[0] == 12 && fed[1] == 20 && fed[2] == 7 && fed[3] == 45 && fed[4] == 0);
  CHECK(rec.first_step[0] == 0 && rec.first_step[1] == 1 && rec.first_step[2] == 2 &&
        rec.first_step[3] == 3);
  run_steps(e, &rec, 100);
  for (int i = 0; i < 4; i++) CHECK(same(rec.tok[i], rec.n[i], ref[i], nr[i]));
  fprintf(stderr, "prompt room 25: prompts of 12, 20, 7, 45 in passes of %d, %d, %d, %d\n", fed[0],
          fed[1], fed[2], fed[3]);
  gen_engine_destroy(e);
  r->kv->ops = own;
}

/* (f) gen_run's prompt budget: all prompts in the first pass when they fit the model's rows,
 * else whole prompts beside a decode row a sequence (gen_prompt_budget). Four prompts of 20
 * tokens on the rig's 64 rows: an engine with that budget feeds 60 and 20 prompt tokens in its
 * first two passes (each prompt whole), then decodes; its decode-only steps and their tokens
 * (gen_stats_t: a TPOT's denominator) are counted; gen_run gives the tokens of each alone. */
static void check_prompt_budget(rig_t *r) {
  gen_seq_t q[4];
  for (int i = 0; i < 4; i++) q[i] = (gen_seq_t){.prompt = p1, .n_prompt = 20};
  CHECK(gen_prompt_budget(64, q, 2) == 64); /* 40 tokens: one pass */
  q[0].n_prompt = 45;
  CHECK(gen_prompt_budget(64, q, 2) == 62); /* 65 tokens: 62 a pass, two decode rows */
  q[0].n_prompt = 63, q[1].n_prompt = 5;
  CHECK(gen_prompt_budget(64, q, 2) == 64); /* 63 > 62: no room for a decode row beside it */
  for (int i = 0; i < 4; i++) q[i] = (gen_seq_t){.prompt = p1, .n_prompt = 20};
  CHECK(gen_prompt_budget(64, q, 4) == 60);
  CHECK(gen_prompt_budget(70, q, 4) == 60); /* 66 rows hold three prompts of 20 */
  CHECK(gen_prompt_budget(80, q, 4) == 80); /* all in one pass */
  int32_t ref[MAXT];
  const int nr = alone(r, p1, 20, 6, greedy, 0, ref);
  rec_t rec;
  gen_engine_t *e = engine(r, &rec, gen_prompt_budget(64, q, 4));
  for (int i = 0; i < 4; i++) {
    gen_req_t a = req(p1, 20, 6, greedy, 0);
    CHECK_OK(gen_engine_add(e, i, &a));
  }
  int fed[3] = {0}, active = 1;
  for (int k = 0; k < 3 && active; k++) {
    gen_stats_t s0, s1;
    gen_engine_stats(e, &s0);
    CHECK_OK(gen_engine_step(e, &active));
    gen_engine_stats(e, &s1);
    fed[k] = (int)(s1.n_prompt - s0.n_prompt);
    rec.step++;
  }
  CHECK(fed[0] == 60 && fed[1] == 20 && fed[2] == 0);
  run_steps(e, &rec, 100);
  gen_stats_t st;
  gen_engine_stats(e, &st);
  /* passes 1-2 give 3 and 4 tokens; then 4 more for three sequences and 5 for the last */
  CHECK(st.n_steps == 7 && st.n_decode_steps == 5 && st.n_decode_gen == 17);
  for (int i = 0; i < 4; i++) CHECK(same(rec.tok[i], rec.n[i], ref, nr));
  gen_engine_destroy(e);
  gen_opts_t o = {6, greedy, 0, 1, NULL, NULL, NULL};
  CHECK_OK(gen_run(r->m, r->kv, r->c, q, 4, &o, &st));
  for (int i = 0; i < 4; i++) {
    CHECK(same(q[i].out, q[i].n_out, ref, nr));
    free(q[i].out);
  }
  CHECK(st.n_prompt == 80 && st.n_gen == 24 && st.n_decode_gen == 17);
  fprintf(stderr,
          "prompt budget 60 of 64 rows: prompts of 20 x 4 in passes of %d and %d; "
          "%d decode-only steps of %d\n",
          fed[0], fed[1], st.n_decode_steps, st.n_steps);
}

/* Finishing on EOG and on the context; bad requests. */
static int refuse_hook(void *ud, kv_cache_t *kv, int slot, int cap, const void *arg, size_t len) {
  if (len && *(const char *)arg == 'R') return qe_errf(QE_ENOSPC, "test: refused slot %d", slot);
  return kv->ops->seq_open(kv, slot, cap);
}

static void check_finish_and_errors(rig_t *r) {
  rec_t rec;
  gen_engine_opts_t o = {refuse_hook, rec_token, rec_finish, &rec, 0, NULL};
  gen_engine_t *e = NULL;
  memset(&rec, 0, sizeof rec);
  CHECK_OK(gen_engine_create(r->m, r->kv, r->c, &o, &e));
  int32_t eos[4] = {5, 6, 7, 2}, longp[256] = {0};
  gen_req_t q = req(p0, 12, 20, greedy, 0);
  q.ignore_eog = 0, q.forced = eos, q.n_forced = 4;
  CHECK_OK(gen_engine_add(e, 0, &q));
  run_steps(e, &rec, 100);
  CHECK(rec.n[0] == 4 && rec.finish[0] == GEN_FINISH_EOG);
  q = req(longp, 250, 20, greedy, 0); /* capacity capped at the context (256) */
  CHECK_OK(gen_engine_add(e, 0, &q));
  rec_reset(&rec, 0);
  run_steps(e, &rec, 100);
  CHECK(rec.n[0] == 6 && rec.finish[0] == GEN_FINISH_LENGTH);
  struct {
    gen_req_t q;
    int slot;
    const char *msg;
  } bad[] = {{req(p0, 0, 5, greedy, 0), 0, "empty prompt"},
             {req(longp, 256, 5, greedy, 0), 0, "context"},
             {req(p0, 12, 0, greedy, 0), 0, "n_predict"},
             {req(p0, 12, 5, greedy, 0), 4, "out of range"},
             {req(p0, 12, 5, greedy, 0), -1, "out of range"},
             {req(p0, 12, 5, greedy, 0), 2, "busy"},
             {req(eos, 4, 5, greedy, 0), 0, "vocabulary"},
             {req(p0, 12, 5, greedy, 0), 0, "open argument"}};
  bad[6].q.prompt = (int32_t[]){1, 100000};
  bad[6].q.n_prompt = 2;
  bad[7].q.open_arg = longp, bad[7].q.open_arg_len = GEN_OPEN_ARG_MAX + 1;
  gen_req_t busy = req(p1, 20, 50, greedy, 0);
  CHECK_OK(gen_engine_add(e, 2, &busy));
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = gen_engine_add(e, bad[i].slot, &bad[i].q);
    if (rc != QE_EINVAL || !strstr(qe_errmsg(), bad[i].msg))
      fprintf(stderr, "bad request %zu: %d '%s'\n", i, rc, qe_errmsg());
    CHECK(rc == QE_EINVAL && strstr(qe_errmsg(), bad[i].msg));
  }
  q = req(p0, 12, 5, greedy, 0);
  q.open_arg = "R", q.open_arg_len = 1;
  CHECK(gen_engine_add(e, 1, &q) == QE_ENOSPC && strstr(qe_errmsg(), "refused"));
  CHECK(!gen_engine_slot_busy(e, 1) && gen_engine_n_active(e) == 1);
  q.open_arg = "ok", q.open_arg_len = 2;
  CHECK_OK(gen_engine_add(e, 1, &q));
  CHECK(gen_engine_n_active(e) == 2);
  gen_engine_destroy(e); /* closes the two running slots */
  CHECK(r->kv->ops->seq_bytes(r->kv, 1) == 0 && r->kv->ops->seq_bytes(r->kv, 2) == 0);
  /* gen_run's errors stay what they were */
  gen_seq_t s = {.prompt = p0, .n_prompt = 12};
  gen_opts_t go = {0, greedy, 0, 1, NULL, NULL, NULL};
  gen_stats_t st;
  CHECK(gen_run(r->m, r->kv, r->c, &s, 1, &go, &st) == QE_EINVAL && s.out == NULL);
  go.n_predict = 4;
  gen_seq_t five[5];
  for (int i = 0; i < 5; i++) five[i] = s;
  CHECK(gen_run(r->m, r->kv, r->c, five, 5, &go, &st) == QE_EINVAL); /* 4 slots */
  CHECK(strstr(qe_errmsg(), "5 sequences") && five[0].out == NULL);
  gen_engine_opts_t neg = {NULL, NULL, NULL, NULL, -1, NULL};
  CHECK(gen_engine_create(r->m, r->kv, r->c, &neg, &e) == QE_EINVAL && e == NULL);
}

/* ---- (e) tensor parallel ---------------------------------------------------------------- */

static void make_arg(uint8_t *a, int slot, int flags) {
  a[0] = (uint8_t)slot, a[1] = (uint8_t)flags;
  for (int i = 2; i < 100 + slot; i++) a[i] = (uint8_t)(i * 13 + slot);
}

static int tp_hook(void *ud, kv_cache_t *kv, int slot, int cap, const void *arg, size_t len) {
  tp_hook_t *h = ud;
  uint8_t want[128];
  const uint8_t *a = arg;
  h->opens++;
  int flags = len >= 2 ? a[1] : 0;
  make_arg(want, slot, flags);
  if (len != (size_t)(100 + slot) || memcmp(a, want, len)) h->bad++;
  if ((flags & 1 && h->rank == 1) || (flags & 2 && h->rank == 0))
    return qe_errf(QE_ENOSPC, "test: rank %d refuses slot %d", h->rank, slot);
  return kv->ops->seq_open(kv, slot, cap);
}

/* Rank 1's follower hooks: which slots were closed (and whether they were still open, i.e.
 * held bytes, when told), and how many operations ran. */
typedef struct {
  tp_hook_t open;
  kv_cache_t *kv;
  int closed[4], closed_empty, ticks;
} tp_follow_t;

static int tp_follow_open(void *ud, kv_cache_t *kv, int slot, int cap, const void *arg,
                          size_t len) {
  return tp_hook(&((tp_follow_t *)ud)->open, kv, slot, cap, arg, len);
}

static void tp_follow_closed(void *ud, int slot) {
  tp_follow_t *f = ud;
  f->closed[slot]++;
  f->closed_empty += f->kv->ops->seq_bytes(f->kv, slot) == 0;
}

static void tp_follow_tick(void *ud) { ((tp_follow_t *)ud)->ticks++; }

/* Rank 1: follows with hooks and writes its tick count to out_fd; exits 0 if the opens and
 * closes were the ones rank 0 made. */
static void tp_follower(const char *path, int fd, int out_fd) {
  tp_comm_t *c = NULL;
  rig_t rg;
  tp_follow_t f = {{1, 0, 0}, NULL, {0}, 0, 0};
  gen_follow_hooks_t hk = {tp_follow_open, tp_follow_closed, tp_follow_tick, &f};
  int rc = tp_comm_create_cpu_fds(&fd, 1, 2, &c);
  if (!rc) rc = rig_open(&rg, path, 1, 2, c, 64);
  f.kv = rg.kv;
  if (!rc) rc = gen_follow_hooks(rg.m, rg.kv, c, &hk);
  int bad = rc || f.open.bad || f.open.opens != 4 || f.closed[0] != 1 || f.closed[1] != 1 ||
            f.closed[2] || f.closed[3] || f.closed_empty;
  if (bad)
    fprintf(stderr,
            "rank 1: rc %d (%s), %d opens, %d bad arguments, closes %d %d %d %d (%d empty)\n", rc,
            qe_errmsg(), f.open.opens, f.open.bad, f.closed[0], f.closed[1], f.closed[2],
            f.closed[3], f.closed_empty);
  if (write(out_fd, &f.ticks, sizeof f.ticks) != sizeof f.ticks) bad = 1;
  _exit(bad);
}

static void check_tp(rig_t *r1, const char *path) {
  int32_t ref0[MAXT], ref1[MAXT];
  int n0 = alone(r1, p0, 12, 16, greedy, 0, ref0), n1 = alone(r1, p1, 20, 12, greedy, 0, ref1);
  int sv[2], pp[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 && pipe(pp) == 0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]), close(pp[0]);
    tp_follower(path, sv[1], pp[1]);
  }
  close(sv[1]), close(pp[1]);
  tp_comm_t *c = NULL;
  rig_t rg;
  rec_t rec;
  uint8_t arg[128];
  gen_engine_t *e = NULL;
  gen_engine_opts_t o = {tp_hook, rec_token, rec_finish, &rec, 0, NULL};
  memset(&rec, 0, sizeof rec);
  tp_hook_t *h = &rec.hook; /* rank 0 */
  int fds[2] = {-1, sv[0]};
  CHECK_OK(tp_comm_create_cpu_fds(fds, 0, 2, &c));
  CHECK_OK(rig_open(&rg, path, 0, 2, c, 64));
  CHECK_OK(gen_engine_create(rg.m, rg.kv, c, &o, &e));
  gen_req_t a = req(p0, 12, 16, greedy, 0), b = req(p1, 20, 12, greedy, 0);
  make_arg(arg, 0, 0);
  a.open_arg = arg, a.open_arg_len = 100;
  CHECK_OK(gen_engine_add(e, 0, &a));
  run_steps(e, &rec, 2);
  CHECK_OK(gen_engine_idle(e));
  CHECK_OK(gen_engine_idle(e));
  b.open_arg = arg, b.open_arg_len = 101;
  make_arg(arg, 1, 1); /* rank 1 refuses: the slot stays free on both ranks */
  CHECK(gen_engine_add(e, 1, &b) == QE_ENOSPC && strstr(qe_errmsg(), "rank 1"));
  make_arg(arg, 1, 2); /* rank 0 refuses */
  CHECK(gen_engine_add(e, 1, &b) == QE_ENOSPC && strstr(qe_errmsg(), "rank 0 refuses"));
  CHECK(!gen_engine_slot_busy(e, 1));
  make_arg(arg, 1, 0);
  CHECK_OK(gen_engine_add(e, 1, &b));
  run_steps(e, &rec, 100);
  CHECK(same(rec.tok[0], rec.n[0], ref0, n0) && same(rec.tok[1], rec.n[1], ref1, n1));
  CHECK(h->opens == 4 && h->bad == 0);
  gen_stats_t gs;
  gen_engine_stats(e, &gs);
  gen_engine_destroy(e);
  int st = 1, ticks = -1;
  CHECK(read(pp[0], &ticks, sizeof ticks) == sizeof ticks);
  close(pp[0]);
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  /* one tick per operation: 4 opens, 2 no-ops, 2 closes and every step */
  CHECK(ticks == 4 + 2 + 2 + gs.n_steps);
  fprintf(stderr,
          "tp 2: open arguments reached rank 1 intact; tokens as tp 1; rank 1 saw both closes "
          "while the slots were open, and %d ticks for %d steps\n",
          ticks, gs.n_steps);
  rig_close(&rg);
  tp_comm_destroy(c);
}

/* Rank 1 of check_tp_broken: follows rank 0 for `ticks` operations, then dies (no goodbye). */
static void tp_dying_tick(void *ud) {
  if (--*(int *)ud == 0) _exit(0);
}

static void tp_dying_follower(const char *path, int fd) {
  tp_comm_t *c = NULL;
  rig_t rg;
  int left = 6; /* the open and five steps */
  gen_follow_hooks_t hk = {NULL, NULL, tp_dying_tick, &left};
  int rc = tp_comm_create_cpu_fds(&fd, 1, 2, &c);
  if (!rc) rc = rig_open(&rg, path, 1, 2, c, 64);
  if (!rc) rc = gen_follow_hooks(rg.m, rg.kv, c, &hk);
  _exit(1); /* (rank 0 never stops it first) */
}

/* A follower that dies mid-request breaks the group: the step returns QE_ECOMM and the running
 * sequence stays open and unreported (no GEN_FINISH_ERROR: the serving worker exits for a restart
 * and the scheduler resumes the request elsewhere; an error finish had failed the request, or
 * not, by which of the two reached the scheduler first). */
static void check_tp_broken(const char *path) {
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    tp_dying_follower(path, sv[1]);
  }
  close(sv[1]);
  tp_comm_t *c = NULL;
  rig_t rg;
  rec_t rec;
  int fds[2] = {-1, sv[0]}, rc = 0, active = 1, steps = 0;
  CHECK_OK(tp_comm_create_cpu_fds(fds, 0, 2, &c));
  CHECK_OK(rig_open(&rg, path, 0, 2, c, 64));
  gen_engine_t *e = engine(&rg, &rec, 0);
  gen_req_t a = req(p0, 12, 40, greedy, 0);
  CHECK_OK(gen_engine_add(e, 0, &a));
  while (!rc && active && steps < 40) rc = gen_engine_step(e, &active), steps++;
  CHECK(rc == QE_ECOMM);
  CHECK(rec.finish[0] == GEN_FINISH_NONE && gen_engine_slot_busy(e, 0));
  CHECK(rec.n[0] >= 4 && rec.n[0] < 40);
  fprintf(stderr,
          "tp 2, rank 1 gone after %d tokens: step %d returned QE_ECOMM (%s), the "
          "sequence still open and unreported\n",
          rec.n[0], steps, qe_errmsg());
  gen_engine_destroy(e);
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  rig_close(&rg);
  tp_comm_destroy(c);
}

/* A model whose logits are all NaN: every sequence ends with GEN_FINISH_ERROR at its first
 * token, naming the logits, and the step goes on (a worker's engine keeps serving); gen_run
 * fails with QE_ERANGE. The samplers had returned id 0 (greedy) every step, and exit 0. */
static void check_nan_logits(void) {
  char path[] = "/tmp/qe_test_gen_nan_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  rand_model_spec_t sp = {MODEL_ARCH_LLAMA, GGUF_T_F32, 8, 2, 0, 2, 31};
  CHECK_OK(rand_model_write_ex(&sp, 256, 1, path));
  tp_comm_t *c = NULL;
  rig_t r;
  CHECK_OK(tp_comm_create_single(&c));
  CHECK_OK(rig_open(&r, path, 0, 1, c, 64));
  if (r.m) {
    rec_t rec;
    gen_engine_t *e = engine(&r, &rec, 0);
    gen_req_t a = req(p0, 12, 5, greedy, 0), b = req(p1, 20, 5, warm, 3);
    CHECK_OK(gen_engine_add(e, 0, &a));
    CHECK_OK(gen_engine_add(e, 1, &b));
    run_steps(e, &rec, 10);
    CHECK(rec.n[0] == 0 && rec.n[1] == 0);
    CHECK(rec.finish[0] == GEN_FINISH_ERROR && rec.finish[1] == GEN_FINISH_ERROR);
    CHECK(strstr(qe_errmsg(), "hold NaN, +inf or only -inf") != NULL);
    CHECK(gen_engine_n_active(e) == 0);
    gen_engine_destroy(e);
    gen_seq_t q = {.prompt = p0, .n_prompt = 12};
    gen_opts_t o = {5, greedy, 0, 1, NULL, NULL, NULL};
    gen_stats_t st;
    CHECK(gen_run(r.m, r.kv, r.c, &q, 1, &o, &st) == QE_ERANGE && q.n_out == 0);
    CHECK(strstr(qe_errmsg(), "logits of token 0 of sequence 0") != NULL);
    free(q.out);
  }
  rig_close(&r);
  tp_comm_destroy(c);
  unlink(path);
}

int main(void) {
  char path[] = "/tmp/qe_test_gen_engine_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  rand_model_spec_t sp = {MODEL_ARCH_LLAMA, GGUF_T_F32, 8, 2, 0, 2, 31};
  CHECK_OK(rand_model_write(&sp, path));
  uint64_t s = 9;
  int32_t *ps[4] = {p0, p1, p2, plong}, ns[4] = {12, 20, 7, 45};
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < ns[k]; i++) ps[k][i] = 3 + (int)tu_randf(&s, 0, 250);
  tp_comm_t *c = NULL;
  rig_t r;
  CHECK_OK(tp_comm_create_single(&c));
  CHECK_OK(rig_open(&r, path, 0, 1, c, 64));
  if (r.m) {
    check_staggered(&r);
    check_tiered_mixed(&r);
    check_resume(&r);
    check_cancel(&r);
    check_chunked(&r);
    check_prompt_room(&r);
    check_prompt_budget(&r);
    check_finish_and_errors(&r);
    check_tp(&r, path);
    check_tp_broken(path);
  }
  check_nan_logits();
  rig_close(&r);
  tp_comm_destroy(c);
  unlink(path);
  return tu_done("test_gen_engine");
}
