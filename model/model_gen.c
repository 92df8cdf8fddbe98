/* model_gen: the step engine and the tensor-parallel lockstep. Rank 0 owns the sequences:
 * each step it plans a batch (every running sequence's decode token, then prompt chunks in
 * slot order), broadcasts it as a header and the plan arrays, all ranks run model_forward,
 * rank 0 samples. Opens (with the request's opaque argument bytes), closes, no-ops and the
 * final stop are broadcast headers too; the outcome of an open is agreed by an all-gather so
 * that a slot is open on every rank or on none. gen_run drives the engine to completion. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_gen.h"
#include "qe_status.h"

enum { GEN_OP_STOP = 0, GEN_OP_OPEN = 1, GEN_OP_CLOSE = 2, GEN_OP_FWD = 3, GEN_OP_NOOP = 4 };

/* A broadcast header. OPEN: n = argument bytes that follow, a = slot, b = capacity;
 * CLOSE: a = slot; FWD: n = tokens of the plan that follows; NOOP, STOP: nothing. */
typedef struct {
  int32_t op, n, a, b;
} gen_hdr_t;

/* The plan of one step, as broadcast. */
typedef struct {
  int32_t *tokens, *pos, *seq; /* [cap] */
  uint8_t *want;               /* [cap] */
  int n;
} gen_plan_t;

/* Rank 0's state of one slot. Buffers stay (readable) after the slot finished until the
 * slot is added again. */
typedef struct {
  int busy;
  int32_t *prompt; /* [n_prompt] */
  int n_prompt, fed;
  int32_t *out; /* [limit] */
  int n_out, limit;
  int32_t *forced; /* [n_forced], n_forced <= limit */
  int n_forced, n_agree;
  kern_sampler_t sampler;
  uint64_t rng;
  int ignore_eog;
} gen_slot_t;

struct gen_engine {
  model_t *m;
  kv_cache_t *kv;
  tp_comm_t *c;
  gen_engine_opts_t o;
  gen_slot_t *slots; /* [n_slots] */
  int n_slots, n_active;
  int rr; /* first slot whose decode is planned when they do not all fit a batch */
  gen_plan_t plan;
  float *lg;    /* [min(n_slots, max_batch)][n_vocab]: one row per sequence per step */
  int32_t *ids; /* [same rows]: the step's greedy ids when use_ids (step_greedy) */
  int use_ids;
  void *scratch; /* sampler workspace: n_vocab floats + n_vocab ints */
  gen_stats_t stats;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int min3(int a, int b, int c) {
  int m = a < b ? a : b;
  return m < c ? m : c;
}

/* ---- broadcast protocol (both sides) ---------------------------------------------------- */

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

/* The outcome of an open over the group: 0 if every rank opened, else this rank's failure,
 * else the first other rank's (with a detail naming it). */
static int open_outcome(tp_comm_t *c, int slot, int lrc, int *orc) {
  if (c->size == 1) return *orc = lrc, 0;
  int *all = malloc(sizeof(int) * (size_t)c->size);
  if (!all) return qe_errf(QE_ENOMEM, "gen: out of memory");
  int rc = tp_allgather(c, &lrc, all, sizeof lrc);
  *orc = lrc;
  for (int r = 0; !rc && !*orc && r < c->size; r++)
    if (all[r])
      *orc =
          qe_errf(all[r], "gen: rank %d could not open slot %d (%s)", r, slot, qe_strerror(all[r]));
  free(all);
  return rc;
}

/* Opens slot on this rank (hook or seq_open) and agrees on the outcome with every rank:
 * *orc = 0 if all opened, else the failure (the slot is closed again on this rank). Returns
 * a communication error (then the slot is closed too). */
static int open_agree(tp_comm_t *c, kv_cache_t *kv, gen_open_fn fn, void *ud, int slot, int cap,
                      const void *arg, size_t len, int *orc) {
  int lrc = fn ? fn(ud, kv, slot, cap, arg, len) : kv->ops->seq_open(kv, slot, cap);
  int rc = open_outcome(c, slot, lrc, orc);
  if (rc || *orc) kv->ops->seq_close(kv, slot);
  return rc;
}

/* ---- rank 0: slots ------------------------------------------------------------------------ */

static int check_req(const model_t *m, int slot, const gen_req_t *r) {
  const model_hparams_t *hp = model_hparams(m);
  if (!r->prompt || r->n_prompt <= 0) return qe_errf(QE_EINVAL, "gen: slot %d: empty prompt", slot);
  if (r->n_prompt >= hp->n_ctx_train)
    return qe_errf(QE_EINVAL,
                   "gen: prompt of %d tokens exceeds the model context (%d tokens, one of which "
                   "a new token needs)",
                   r->n_prompt, hp->n_ctx_train);
  if (r->n_predict <= 0) return qe_errf(QE_EINVAL, "gen: n_predict must be positive");
  if (r->n_forced < 0 || (r->n_forced > 0 && !r->forced))
    return qe_errf(QE_EINVAL, "gen: slot %d: bad forced tokens (%d)", slot, r->n_forced);
  if (r->open_arg_len > GEN_OPEN_ARG_MAX || (r->open_arg_len && !r->open_arg))
    return qe_errf(QE_EINVAL, "gen: open argument of %zu bytes (max %d)", r->open_arg_len,
                   GEN_OPEN_ARG_MAX);
  int nf = r->n_forced < r->n_predict ? r->n_forced : r->n_predict; /* the ones used */
  for (int i = 0; i < r->n_prompt + nf; i++) {
    int32_t id = i < r->n_prompt ? r->prompt[i] : r->forced[i - r->n_prompt];
    if (id < 0 || id >= hp->n_vocab)
      return qe_errf(QE_EINVAL, "gen: token id %d outside the vocabulary (%d)", id, hp->n_vocab);
  }
  return 0;
}

/* Copies r into s (whose previous buffers are freed) for `limit` new tokens at most. */
static int slot_init(gen_slot_t *s, const gen_req_t *r, int limit) {
  int nf = r->n_forced < limit ? r->n_forced : limit;
  free(s->prompt);
  free(s->out);
  free(s->forced);
  *s = (gen_slot_t){0};
  s->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt);
  s->out = malloc(sizeof(int32_t) * (size_t)limit);
  s->forced = nf ? malloc(sizeof(int32_t) * (size_t)nf) : NULL;
  if (!s->prompt || !s->out || (nf && !s->forced)) return qe_errf(QE_ENOMEM, "gen: out of memory");
  memcpy(s->prompt, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
  if (nf) memcpy(s->forced, r->forced, sizeof(int32_t) * (size_t)nf);
  s->n_prompt = r->n_prompt, s->limit = limit, s->n_forced = nf;
  s->sampler = r->sampler, s->rng = kern_rng_seed(r->seed), s->ignore_eog = r->ignore_eog;
  return 0;
}

static void slot_free(gen_slot_t *s) {
  free(s->prompt);
  free(s->out);
  free(s->forced);
}

/* Opens slot on every rank: header, argument bytes, then the agreed open. */
static int engine_open(gen_engine_t *e, int slot, int cap, const gen_req_t *r) {
  unsigned char arg[GEN_OPEN_ARG_MAX];
  size_t len = r->open_arg_len;
  gen_hdr_t h = {GEN_OP_OPEN, (int32_t)len, slot, cap};
  if (len) memcpy(arg, r->open_arg, len);
  int orc = 0, rc = bcast_hdr(e->c, &h);
  if (!rc && len) rc = tp_broadcast(e->c, arg, len, 0);
  if (!rc) rc = open_agree(e->c, e->kv, e->o.open, e->o.ud, slot, cap, arg, len, &orc);
  return rc ? rc : orc;
}

/* Closes a busy slot here and (broadcast) on the followers, then reports the reason. */
static int finish_slot(gen_engine_t *e, int slot, int reason, int broadcast) {
  gen_hdr_t h = {GEN_OP_CLOSE, 0, slot, 0};
  int rc = broadcast ? bcast_hdr(e->c, &h) : 0;
  e->kv->ops->seq_close(e->kv, slot);
  e->slots[slot].busy = 0;
  e->n_active--;
  if (e->o.on_finish) e->o.on_finish(e->o.ud, slot, reason);
  return rc;
}

int gen_engine_create(model_t *m, kv_cache_t *kv, tp_comm_t *c, const gen_engine_opts_t *o,
                      gen_engine_t **out) {
  *out = NULL;
  if (!m || !kv || !c || !o || c->rank != 0 || o->max_prompt_per_step < 0)
    return qe_errf(QE_EINVAL, "gen: the engine runs on rank 0 with a model, cache and options");
  int V = model_hparams(m)->n_vocab, cap = model_max_batch(m), S = kv->geom.max_seqs;
  int rows = S < cap ? S : cap;
  gen_engine_t *e = calloc(1, sizeof *e);
  if (!e) return qe_errf(QE_ENOMEM, "gen: out of memory");
  *e = (gen_engine_t){.m = m, .kv = kv, .c = c, .o = *o, .n_slots = S};
  if (!e->o.max_prompt_per_step || e->o.max_prompt_per_step > cap) e->o.max_prompt_per_step = cap;
  e->slots = calloc((size_t)S, sizeof *e->slots);
  e->lg = malloc(sizeof(float) * (size_t)rows * V);
  e->ids = malloc(sizeof(int32_t) * (size_t)rows);
  e->scratch = malloc((sizeof(float) + sizeof(int)) * (size_t)V);
  int rc = e->slots && e->lg && e->ids && e->scratch ? 0 : qe_errf(QE_ENOMEM, "gen: out of memory");
  if (!rc) rc = plan_alloc(&e->plan, cap);
  if (rc) {
    plan_free(&e->plan);
    free(e->slots), free(e->lg), free(e->ids), free(e->scratch), free(e);
    return rc;
  }
  *out = e;
  return 0;
}

int gen_engine_add(gen_engine_t *e, int slot, const gen_req_t *r) {
  if (slot < 0 || slot >= e->n_slots)
    return qe_errf(QE_EINVAL, "gen: slot %d out of range (cache holds %d)", slot, e->n_slots);
  if (e->slots[slot].busy) return qe_errf(QE_EINVAL, "gen: slot %d is busy", slot);
  int rc = check_req(e->m, slot, r), ctx = model_hparams(e->m)->n_ctx_train;
  if (rc) return rc;
  int cap = r->n_predict > ctx - r->n_prompt ? ctx : r->n_prompt + r->n_predict;
  if ((rc = slot_init(&e->slots[slot], r, cap - r->n_prompt))) return rc;
  if ((rc = engine_open(e, slot, cap, r))) return rc;
  e->slots[slot].busy = 1;
  e->n_active++;
  return 0;
}

int gen_engine_cancel(gen_engine_t *e, int slot) {
  if (slot < 0 || slot >= e->n_slots || !e->slots[slot].busy)
    return qe_errf(QE_EINVAL, "gen: slot %d is not running", slot);
  return finish_slot(e, slot, GEN_FINISH_CANCELLED, 1);
}

/* ---- rank 0: steps ------------------------------------------------------------------------ */

static void plan_push(gen_plan_t *p, int32_t tok, int pos, int seq, int want) {
  p->tokens[p->n] = tok;
  p->pos[p->n] = pos;
  p->seq[p->n] = seq;
  p->want[p->n++] = (uint8_t)want;
}

static int is_decoding(const gen_slot_t *s) { return s->busy && s->fed == s->n_prompt; }

/* Every decoding sequence's last token at its next position, in slot order (rotating the
 * start when they do not all fit one batch). */
static void plan_decodes(gen_engine_t *e, int cap) {
  int S = e->n_slots, n_dec = 0, last = -1;
  for (int i = 0; i < S; i++) n_dec += is_decoding(&e->slots[i]);
  int start = n_dec > cap ? e->rr : 0;
  for (int k = 0; k < S && e->plan.n < cap; k++) {
    int i = (start + k) % S;
    const gen_slot_t *s = &e->slots[i];
    if (!is_decoding(s)) continue;
    plan_push(&e->plan, s->out[s->n_out - 1], s->n_prompt + s->n_out - 1, i, 1);
    last = i;
  }
  if (n_dec > cap) e->rr = (last + 1) % S;
}

/* Prompt chunks of the prefilling sequences in slot order (at most max_prompt_per_step); a
 * prompt not started yet waits for a later pass when it would take the pass past the cache's
 * prompt room (a tiered GPU cache's pool holds one layer of a pass's prompts at full precision,
 * and takes each prompt in one piece: prompts are never split for the room, and the pass's first
 * one goes whatever its size). Returns the prompt tokens taken. */
static int plan_prompts(gen_engine_t *e, int cap) {
  const int room = kv_cache_prompt_room(e->kv);
  int budget = e->o.max_prompt_per_step, taken = 0;
  for (int i = 0; i < e->n_slots && budget > taken && e->plan.n < cap; i++) {
    gen_slot_t *s = &e->slots[i];
    if (!s->busy || s->fed >= s->n_prompt) continue;
    if (room > 0 && s->fed == 0 && taken > 0 && taken + (long)s->n_prompt > room) break;
    int take = min3(s->n_prompt - s->fed, budget - taken, cap - e->plan.n);
    for (int j = s->fed; j < s->fed + take; j++)
      plan_push(&e->plan, s->prompt[j], j, i, j == s->n_prompt - 1);
    s->fed += take;
    taken += take;
  }
  return taken;
}

/* 1 when every row of the step samples greedily on a device backend: the backend's argmax then
 * picks the tokens and only their ids cross to the host (the CPU backend samples its logits in
 * place either way). */
static int step_greedy(const gen_engine_t *e) {
  if (model_backend(e->m)->ops->host_memory || e->o.on_logits) return 0;
  for (int j = 0; j < e->plan.n; j++)
    if (e->plan.want[j] && e->slots[e->plan.seq[j]].sampler.temp > 0.0f) return 0;
  return 1;
}

static int step_forward(gen_engine_t *e) {
  gen_plan_t *p = &e->plan;
  gen_hdr_t h = {GEN_OP_FWD, p->n, 0, 0};
  int rc = bcast_hdr(e->c, &h);
  if (!rc) rc = bcast_plan(e->c, p);
  model_batch_t b = {p->n, p->tokens, p->pos, p->seq, p->want};
  if (rc) return rc;
  e->use_ids = step_greedy(e);
  return e->use_ids ? model_forward_greedy(e->m, e->kv, e->c, &b, e->ids)
                    : model_forward(e->m, e->kv, e->c, &b, e->lg);
}

static int finish_reason(const gen_engine_t *e, const gen_slot_t *s, int id) {
  if (!s->ignore_eog && model_tok(e->m) && tok_is_eog(model_tok(e->m), id)) return GEN_FINISH_EOG;
  return s->n_out >= s->limit ? GEN_FINISH_LENGTH : GEN_FINISH_NONE;
}

/* 1 when no token can be drawn from logits x [n]: one is NaN or +inf, or all are -inf (weights
 * or activations that are not finite). Such a sequence ends with GEN_FINISH_ERROR, where the
 * sampler would have returned id 0 or the last id, a meaningless token, every step. */
static int logits_bad(const float *x, int n) {
  int nan = 0, pinf = 0, any = 0;
  for (int i = 0; i < n; i++)
    nan |= x[i] != x[i], pinf |= x[i] == INFINITY, any |= x[i] > -INFINITY;
  return nan | pinf | !any;
}

/* Samples a token for each planned row that wanted logits; finished sequences are closed.
 * Every row is sampled even after a failed close, so no sequence is left without its token;
 * the first error is returned. A row whose logits are not finite ends its sequence with
 * GEN_FINISH_ERROR (the other rows go on; the detail is qe_errmsg's in on_finish). */
static int sample_rows(gen_engine_t *e) {
  gen_plan_t *p = &e->plan;
  int V = model_hparams(e->m)->n_vocab, row = 0, rc = 0;
  kern_backend_t *be = model_backend(e->m);
  for (int j = 0; j < p->n; j++) {
    if (!p->want[j]) continue;
    int i = p->seq[j];
    gen_slot_t *s = &e->slots[i];
    const int r = row++;
    const float *lg = e->lg + (size_t)r * V;
    if (!e->use_ids && e->o.on_logits) e->o.on_logits(e->o.ud, i, lg, V);
    if (e->use_ids ? e->ids[r] < 0 : logits_bad(lg, V)) { /* (the device's argmax: -1) */
      qe_errf(QE_ERANGE,
              "gen: the logits of token %d of sequence %d hold NaN, +inf or only -inf "
              "(the model's weights or activations are not finite)",
              s->n_out, i);
      const int frc = finish_slot(e, i, GEN_FINISH_ERROR, 1);
      if (!rc) rc = frc;
      continue;
    }
    int id = e->use_ids ? e->ids[r] : be->ops->sample(be, lg, V, &s->sampler, &s->rng, e->scratch);
    int forced = s->n_out < s->n_forced;
    if (forced) {
      s->n_agree += id == s->forced[s->n_out];
      id = s->forced[s->n_out];
    }
    s->out[s->n_out++] = id;
    e->stats.n_gen++;
    if (e->o.on_token) e->o.on_token(e->o.ud, i, s->n_out - 1, id, forced);
    int fin = finish_reason(e, s, id), frc = fin ? finish_slot(e, i, fin, 1) : 0;
    if (!rc) rc = frc;
  }
  return rc;
}

/* A failed forward pass: closes the step's sequences here (the followers, if any, are out of
 * step anyway) with GEN_FINISH_ERROR, keeping rc's detail. A broken group (QE_ECOMM: a rank
 * went away) is no fault of the sequences: they stay open, unreported, for the caller to run
 * again elsewhere (the worker exits for a restart, and the scheduler resumes them). */
static int fail_step(gen_engine_t *e, int rc) {
  if (rc == QE_ECOMM) return rc;
  char msg[256];
  snprintf(msg, sizeof msg, "%s", qe_errmsg());
  for (int j = 0; j < e->plan.n; j++) {
    int i = e->plan.seq[j];
    if (e->slots[i].busy) finish_slot(e, i, GEN_FINISH_ERROR, 0);
  }
  return qe_errf(rc, "%s", msg);
}

int gen_engine_step(gen_engine_t *e, int *active) {
  int cap = model_max_batch(e->m);
  e->plan.n = 0;
  plan_decodes(e, cap);
  int prompt = plan_prompts(e, cap);
  *active = e->plan.n > 0;
  if (!e->plan.n) return 0;
  double t0 = now_s();
  int rc = step_forward(e);
  if (rc) return fail_step(e, rc);
  rc = sample_rows(e);
  *(prompt ? &e->stats.prefill_s : &e->stats.decode_s) += now_s() - t0;
  e->stats.n_prompt += prompt;
  e->stats.n_steps++;
  if (!prompt) e->stats.n_decode_steps++, e->stats.n_decode_gen += e->plan.n;
  return rc;
}

int gen_engine_idle(gen_engine_t *e) {
  gen_hdr_t h = {GEN_OP_NOOP, 0, 0, 0};
  return bcast_hdr(e->c, &h);
}

int gen_engine_n_active(const gen_engine_t *e) { return e->n_active; }

int gen_engine_slot_busy(const gen_engine_t *e, int slot) {
  return slot >= 0 && slot < e->n_slots && e->slots[slot].busy;
}

const int32_t *gen_engine_tokens(const gen_engine_t *e, int slot, int *n) {
  const gen_slot_t *s = slot >= 0 && slot < e->n_slots ? &e->slots[slot] : NULL;
  *n = s && s->out ? s->n_out : 0;
  return s ? s->out : NULL;
}

int gen_engine_n_agree(const gen_engine_t *e, int slot) {
  return slot >= 0 && slot < e->n_slots ? e->slots[slot].n_agree : 0;
}

void gen_engine_stats(const gen_engine_t *e, gen_stats_t *out) { *out = e->stats; }

void gen_engine_destroy(gen_engine_t *e) {
  if (!e) return;
  for (int i = 0; i < e->n_slots; i++) {
    if (e->slots[i].busy) e->kv->ops->seq_close(e->kv, i);
    slot_free(&e->slots[i]);
  }
  gen_release(e->c);
  plan_free(&e->plan);
  free(e->slots);
  free(e->lg);
  free(e->ids);
  free(e->scratch);
  free(e);
}

/* ---- followers ---------------------------------------------------------------------------- */

void gen_release(tp_comm_t *c) {
  gen_hdr_t stop = {GEN_OP_STOP, 0, 0, 0};
  bcast_hdr(c, &stop);
}

/* An OPEN header: the argument bytes, then the agreed open (a failed open is not fatal). */
static int follow_open(kv_cache_t *kv, tp_comm_t *c, gen_open_fn fn, void *ud, const gen_hdr_t *h,
                       unsigned char *arg) {
  if (h->n < 0 || h->n > GEN_OPEN_ARG_MAX || h->a < 0 || h->a >= kv->geom.max_seqs || h->b <= 0)
    return qe_errf(QE_ECOMM, "gen: bad open header (slot %d, capacity %d, %d bytes)", h->a, h->b,
                   h->n);
  int orc = 0, rc = h->n ? tp_broadcast(c, arg, (size_t)h->n, 0) : 0;
  return rc ? rc : open_agree(c, kv, fn, ud, h->a, h->b, arg, (size_t)h->n, &orc);
}

/* A FWD header: the plan, then this rank's share of the forward pass. */
static int follow_step(model_t *m, kv_cache_t *kv, tp_comm_t *c, const gen_hdr_t *h,
                       gen_plan_t *p) {
  p->n = h->n;
  int rc = bcast_plan(c, p);
  model_batch_t b = {p->n, p->tokens, p->pos, p->seq, p->want};
  return rc ? rc : model_forward(m, kv, c, &b, NULL);
}

/* One operation (any header but STOP). */
static int follow_op(model_t *m, kv_cache_t *kv, tp_comm_t *c, const gen_follow_hooks_t *hk,
                     const gen_hdr_t *h, gen_plan_t *p, unsigned char *arg) {
  if (h->op == GEN_OP_NOOP) return 0;
  if (h->op == GEN_OP_OPEN) return follow_open(kv, c, hk->open, hk->ud, h, arg);
  if (h->op == GEN_OP_CLOSE) {
    if (hk->closed && h->a >= 0 && h->a < kv->geom.max_seqs) hk->closed(hk->ud, h->a);
    kv->ops->seq_close(kv, h->a);
    return 0;
  }
  if (h->op == GEN_OP_FWD && h->n > 0 && h->n <= model_max_batch(m))
    return follow_step(m, kv, c, h, p);
  return qe_errf(QE_ECOMM, "gen: bad step header (op %d, n %d)", h->op, h->n);
}

int gen_follow_hooks(model_t *m, kv_cache_t *kv, tp_comm_t *c, const gen_follow_hooks_t *h) {
  static const gen_follow_hooks_t none = {0};
  const gen_follow_hooks_t *hk = h ? h : &none;
  unsigned char arg[GEN_OPEN_ARG_MAX];
  gen_plan_t p = {0};
  int rc = plan_alloc(&p, model_max_batch(m));
  while (!rc) {
    gen_hdr_t hd;
    if ((rc = bcast_hdr(c, &hd)) || hd.op == GEN_OP_STOP) break;
    rc = follow_op(m, kv, c, hk, &hd, &p, arg);
    if (!rc && hk->tick) hk->tick(hk->ud);
  }
  for (int i = 0; i < kv->geom.max_seqs; i++) kv->ops->seq_close(kv, i);
  plan_free(&p);
  return rc;
}

int gen_follow_ex(model_t *m, kv_cache_t *kv, tp_comm_t *c, gen_open_fn fn, void *ud) {
  gen_follow_hooks_t h = {fn, NULL, NULL, ud};
  return gen_follow_hooks(m, kv, c, &h);
}

int gen_follow(model_t *m, kv_cache_t *kv, tp_comm_t *c) {
  return gen_follow_ex(m, kv, c, NULL, NULL);
}

/* ---- run to completion -------------------------------------------------------------------- */

typedef struct {
  gen_seq_t *seqs;
  const gen_opts_t *o;
  char err[256]; /* the first sequence that ended with an error in a step that did not fail */
} gen_run_ctx_t;

static void run_on_token(void *ud, int slot, int index, int id, int forced) {
  gen_run_ctx_t *x = ud;
  gen_seq_t *s = &x->seqs[slot];
  s->out[index] = id;
  s->n_out = index + 1;
  if (x->o->on_token) x->o->on_token(x->o->ud, slot, id);
}

static void run_on_logits(void *ud, int slot, const float *logits, int n_vocab) {
  gen_run_ctx_t *x = ud;
  x->o->on_logits(x->o->ud, slot, logits, n_vocab);
}

static void run_on_finish(void *ud, int slot, int reason) {
  gen_run_ctx_t *x = ud;
  x->seqs[slot].finish = reason == GEN_FINISH_ERROR ? GEN_FINISH_NONE : reason;
  if (reason == GEN_FINISH_ERROR && !*x->err) snprintf(x->err, sizeof x->err, "%s", qe_errmsg());
}

static gen_req_t req_of(const gen_seq_t *s, const gen_opts_t *o, int i) {
  return (gen_req_t){s->prompt,     s->n_prompt, o->n_predict, o->sampler, o->seed + (uint64_t)i,
                     o->ignore_eog, s->forced,   s->n_forced,  NULL,       0};
}

/* Every sequence checked before anything is allocated or opened. */
static int check_run(const model_t *m, const kv_cache_t *kv, const gen_seq_t *seqs, int n,
                     const gen_opts_t *o) {
  if (n <= 0 || n > kv->geom.max_seqs)
    return qe_errf(QE_EINVAL, "gen: %d sequences (cache holds %d)", n, kv->geom.max_seqs);
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    gen_req_t r = req_of(&seqs[i], o, i);
    rc = check_req(m, i, &r);
  }
  return rc;
}

static int alloc_outputs(gen_seq_t *seqs, int n, const gen_opts_t *o) {
  for (int i = 0; i < n; i++) {
    gen_seq_t *s = &seqs[i];
    s->out = malloc(sizeof(int32_t) * (size_t)o->n_predict);
    s->n_out = 0, s->n_agree = 0, s->finish = GEN_FINISH_NONE;
    if (!s->out) return qe_errf(QE_ENOMEM, "gen: out of memory");
  }
  return 0;
}

int gen_prompt_budget(int cap, const gen_seq_t *seqs, int n) {
  long sum = 0;
  int longest = 0;
  for (int i = 0; i < n; i++) {
    sum += seqs[i].n_prompt;
    longest = seqs[i].n_prompt > longest ? seqs[i].n_prompt : longest;
  }
  if (sum <= cap || cap - n < longest) return cap;
  /* prompts of one length: a whole number of them a pass */
  return sum == (long)n * longest ? (cap - n) / longest * longest : cap - n;
}

int gen_run(model_t *m, kv_cache_t *kv, tp_comm_t *c, gen_seq_t *seqs, int n, const gen_opts_t *o,
            gen_stats_t *stats) {
  gen_engine_t *e = NULL;
  gen_run_ctx_t x = {seqs, o, ""};
  gen_engine_opts_t eo = {NULL,
                          run_on_token,
                          run_on_finish,
                          &x,
                          gen_prompt_budget(model_max_batch(m), seqs, n),
                          o->on_logits ? run_on_logits : NULL};
  int active = 1, rc = check_run(m, kv, seqs, n, o);
  memset(stats, 0, sizeof *stats);
  if (!rc) rc = alloc_outputs(seqs, n, o);
  if (!rc) rc = gen_engine_create(m, kv, c, &eo, &e);
  for (int i = 0; i < n && !rc; i++) {
    gen_req_t r = req_of(&seqs[i], o, i);
    rc = gen_engine_add(e, i, &r);
  }
  while (!rc && active) rc = gen_engine_step(e, &active);
  if (!rc && *x.err) rc = qe_errf(QE_ERANGE, "%s", x.err); /* (a sequence's logits) */
  if (e) gen_engine_stats(e, stats);
  stats->n_prompt = stats->n_gen = 0;
  for (int i = 0; i < n; i++) {
    if (e) seqs[i].n_agree = gen_engine_n_agree(e, i);
    stats->n_prompt += seqs[i].n_prompt;
    stats->n_gen += seqs[i].n_out;
  }
  if (e)
    gen_engine_destroy(e);
  else
    gen_release(c);
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
