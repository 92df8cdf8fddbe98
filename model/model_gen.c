/* model_gen: continuous-batching generation with tensor-parallel lockstep. Each step rank 0
 * fills a batch (pending prompt tokens first, then one decode token per running sequence),
 * broadcasts it, all ranks run model_forward, rank 0 samples. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_gen.h"
#include "qe_status.h"

enum { GEN_OP_STOP = 0, GEN_OP_OPEN = 1, GEN_OP_CLOSE = 2, GEN_OP_FWD = 3 };

typedef struct {
  int32_t op, n, a, b;
} gen_hdr_t;

/* The plan of one step, as broadcast. */
typedef struct {
  int32_t *tokens, *pos, *seq;
  uint8_t *want;
  int n;
} gen_plan_t;

/* Rank 0's state for one sequence. */
typedef struct {
  int fed; /* prompt tokens already in the cache */
  int done;
  int limit; /* max new tokens (n_predict capped by the context) */
  uint64_t rng;
} gen_state_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int plan_alloc(gen_plan_t *p, int cap) {
  p->tokens = malloc(sizeof(int32_t) * cap);
  p->pos = malloc(sizeof(int32_t) * cap);
  p->seq = malloc(sizeof(int32_t) * cap);
  p->want = malloc((size_t)cap);
  if (p->tokens && p->pos && p->seq && p->want) return 0;
  return qe_errf(QE_ENOMEM, "gen: out of memory");
}

static void plan_free(gen_plan_t *p) {
  free(p->tokens);
  free(p->pos);
  free(p->seq);
  free(p->want);
}

static int bcast_hdr(tp_comm_t *c, gen_hdr_t *h) { return tp_broadcast(c, h, sizeof *h, 0); }

static int bcast_plan(tp_comm_t *c, gen_plan_t *p) {
  size_t n = (size_t)p->n;
  int rc = tp_broadcast(c, p->tokens, n * sizeof(int32_t), 0);
  if (!rc) rc = tp_broadcast(c, p->pos, n * sizeof(int32_t), 0);
  if (!rc) rc = tp_broadcast(c, p->seq, n * sizeof(int32_t), 0);
  if (!rc) rc = tp_broadcast(c, p->want, n, 0);
  return rc;
}

/* Runs one planned step on every rank (rank 0 side). */
static int step_forward(model_t *m, kv_cache_t *kv, tp_comm_t *c, gen_plan_t *p, float *lg) {
  gen_hdr_t h = {GEN_OP_FWD, p->n, 0, 0};
  int rc = bcast_hdr(c, &h);
  if (!rc) rc = bcast_plan(c, p);
  model_batch_t b = {p->n, p->tokens, p->pos, p->seq, p->want};
  return rc ? rc : model_forward(m, kv, c, &b, lg);
}

static int seq_cmd(kv_cache_t *kv, tp_comm_t *c, int op, int seq, int cap) {
  gen_hdr_t h = {op, 0, seq, cap};
  int rc = bcast_hdr(c, &h);
  if (rc) return rc;
  if (op == GEN_OP_CLOSE) {
    kv->ops->seq_close(kv, seq);
    return 0;
  }
  return kv->ops->seq_open(kv, seq, cap);
}

/* The last token of sequence s (prompt tail or last generated). */
static int32_t last_token(const gen_seq_t *s) {
  return s->n_out ? s->out[s->n_out - 1] : s->prompt[s->n_prompt - 1];
}

/* Adds sequence i's next tokens to the plan; returns 1 if any prompt tokens were added. */
static int plan_seq(gen_plan_t *p, int cap, gen_seq_t *s, gen_state_t *st, int i) {
  if (st->done || p->n >= cap) return 0;
  if (st->fed < s->n_prompt) {
    int take = s->n_prompt - st->fed < cap - p->n ? s->n_prompt - st->fed : cap - p->n;
    for (int j = 0; j < take; j++, p->n++) {
      p->tokens[p->n] = s->prompt[st->fed + j];
      p->pos[p->n] = st->fed + j;
      p->seq[p->n] = i;
      p->want[p->n] = st->fed + j == s->n_prompt - 1;
    }
    st->fed += take;
    return 1;
  }
  p->tokens[p->n] = last_token(s);
  p->pos[p->n] = s->n_prompt + s->n_out - 1;
  p->seq[p->n] = i;
  p->want[p->n++] = 1;
  return 0;
}

static int is_finished(const model_t *m, const gen_seq_t *s, const gen_state_t *st,
                       const gen_opts_t *o, int id) {
  if (!o->ignore_eog && tok_is_eog(model_tok(m), id)) return GEN_FINISH_EOG;
  return s->n_out >= st->limit ? GEN_FINISH_LENGTH : GEN_FINISH_NONE;
}

/* Samples a token for each planned row that wanted logits and ends a sequence's turn. */
static int sample_rows(model_t *m, kv_cache_t *kv, tp_comm_t *c, gen_plan_t *p, gen_seq_t *seqs,
                       gen_state_t *st, const gen_opts_t *o, const float *lg, void *scratch) {
  int V = model_hparams(m)->n_vocab, row = 0, rc = 0;
  kern_backend_t *be = model_backend(m);
  for (int j = 0; j < p->n && !rc; j++) {
    if (!p->want[j]) continue;
    int i = p->seq[j];
    gen_seq_t *s = &seqs[i];
    int id = be->ops->sample(be, lg + (size_t)row++ * V, V, &o->sampler, &st[i].rng, scratch);
    if (s->forced && s->n_out < s->n_forced) {
      s->n_agree += id == s->forced[s->n_out];
      id = s->forced[s->n_out];
    }
    s->out[s->n_out++] = id;
    if (o->on_token) o->on_token(o->ud, i, id);
    if ((s->finish = is_finished(m, s, &st[i], o, id))) {
      st[i].done = 1;
      rc = seq_cmd(kv, c, GEN_OP_CLOSE, i, 0);
    }
  }
  return rc;
}

static int check_seqs(const model_t *m, const kv_cache_t *kv, gen_seq_t *seqs, int n,
                      const gen_opts_t *o) {
  int ctx = model_hparams(m)->n_ctx_train;
  if (n <= 0 || n > kv->geom.max_seqs)
    return qe_errf(QE_EINVAL, "gen: %d sequences (cache holds %d)", n, kv->geom.max_seqs);
  if (o->n_predict <= 0) return qe_errf(QE_EINVAL, "gen: n_predict must be positive");
  for (int i = 0; i < n; i++) {
    if (seqs[i].n_prompt <= 0) return qe_errf(QE_EINVAL, "gen: sequence %d has an empty prompt", i);
    if (seqs[i].n_prompt >= ctx)
      return qe_errf(QE_EINVAL, "gen: prompt of %d tokens exceeds the model context (%d)",
                     seqs[i].n_prompt, ctx);
  }
  return 0;
}

/* Opens every sequence: capacity = prompt + n_predict, capped at the context. */
static int open_all(const model_t *m, kv_cache_t *kv, tp_comm_t *c, gen_seq_t *seqs,
                    gen_state_t *st, int n, const gen_opts_t *o) {
  int ctx = model_hparams(m)->n_ctx_train, rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    gen_seq_t *s = &seqs[i];
    int cap = s->n_prompt + o->n_predict > ctx ? ctx : s->n_prompt + o->n_predict;
    s->out = malloc(sizeof(int32_t) * (size_t)o->n_predict);
    s->n_out = 0;
    s->finish = GEN_FINISH_NONE;
    st[i] = (gen_state_t){0, 0, cap - s->n_prompt, kern_rng_seed(o->seed + (uint64_t)i)};
    rc = s->out ? seq_cmd(kv, c, GEN_OP_OPEN, i, cap) : qe_errf(QE_ENOMEM, "gen: out of memory");
  }
  return rc;
}

/* One scheduling step: plan, forward, sample. *active tells whether anything ran. */
static int gen_step(model_t *m, kv_cache_t *kv, tp_comm_t *c, gen_seq_t *seqs, gen_state_t *st,
                    int n, const gen_opts_t *o, gen_plan_t *p, float *lg, void *scratch,
                    gen_stats_t *stats, int *active) {
  int cap = model_max_batch(m), prompt = 0;
  p->n = 0;
  for (int i = 0; i < n; i++) prompt |= plan_seq(p, cap, &seqs[i], &st[i], i);
  *active = p->n > 0;
  if (!p->n) return 0;
  double t0 = now_s();
  int rc = step_forward(m, kv, c, p, lg);
  if (!rc) rc = sample_rows(m, kv, c, p, seqs, st, o, lg, scratch);
  double dt = now_s() - t0;
  *(prompt ? &stats->prefill_s : &stats->decode_s) += dt;
  stats->n_steps++;
  return rc;
}

int gen_run(model_t *m, kv_cache_t *kv, tp_comm_t *c, gen_seq_t *seqs, int n, const gen_opts_t *o,
            gen_stats_t *stats) {
  int V = model_hparams(m)->n_vocab, cap = model_max_batch(m), active = 1;
  gen_plan_t p = {0};
  gen_state_t *st = calloc((size_t)n > 0 ? (size_t)n : 1, sizeof *st);
  /* one logits row per sequence at most per step: its prompt's end or its decode token */
  float *lg = malloc(sizeof(float) * (size_t)kv->geom.max_seqs * V);
  void *scratch = malloc((sizeof(float) + sizeof(int)) * (size_t)V);
  memset(stats, 0, sizeof *stats);
  int rc = st && lg && scratch ? 0 : qe_errf(QE_ENOMEM, "gen: out of memory");
  if (!rc) rc = check_seqs(m, kv, seqs, n, o);
  if (!rc) rc = plan_alloc(&p, cap);
  if (!rc) rc = open_all(m, kv, c, seqs, st, n, o);
  while (!rc && active) rc = gen_step(m, kv, c, seqs, st, n, o, &p, lg, scratch, stats, &active);
  for (int i = 0; i < n; i++) {
    stats->n_prompt += seqs[i].n_prompt;
    stats->n_gen += seqs[i].n_out;
    if (!st || !st[i].done) kv->ops->seq_close(kv, i);
  }
  gen_release(c);
  plan_free(&p);
  free(st);
  free(lg);
  free(scratch);
  return rc;
}

void gen_release(tp_comm_t *c) {
  gen_hdr_t stop = {GEN_OP_STOP, 0, 0, 0};
  bcast_hdr(c, &stop);
}

int gen_follow(model_t *m, kv_cache_t *kv, tp_comm_t *c) {
  gen_plan_t p = {0};
  int rc = plan_alloc(&p, model_max_batch(m));
  while (!rc) {
    gen_hdr_t h;
    if ((rc = bcast_hdr(c, &h)) || h.op == GEN_OP_STOP) break;
    if (h.op == GEN_OP_OPEN)
      rc = kv->ops->seq_open(kv, h.a, h.b);
    else if (h.op == GEN_OP_CLOSE)
      kv->ops->seq_close(kv, h.a);
    else if (h.op == GEN_OP_FWD && h.n > 0 && h.n <= model_max_batch(m)) {
      p.n = h.n;
      rc = bcast_plan(c, &p);
      model_batch_t b = {p.n, p.tokens, p.pos, p.seq, p.want};
      if (!rc) rc = model_forward(m, kv, c, &b, NULL);
    } else
      rc = qe_errf(QE_ECOMM, "gen: bad step header (op %d, n %d)", h.op, h.n);
  }
  for (int i = 0; i < kv->geom.max_seqs; i++) kv->ops->seq_close(kv, i);
  plan_free(&p);
  return rc;
}

int gen_encode(const model_t *m, const char *text, size_t len, int parse_special, int32_t **ids,
               int *n) {
  size_t nn = 0;
  const tok_t *t = model_tok(m);
  int rc = tok_encode(t, text, len, tok_add_bos(t), parse_special, ids, &nn);
  *n = (int)nn;
  return rc;
}
