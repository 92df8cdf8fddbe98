/* model_gen: drives generation over a model and a KV cache. The step engine (gen_engine_*)
 * keeps a set of sequences in cache slots that join and leave between steps; each step is
 * one forward pass mixing every running sequence's decode token with chunks of the prompts
 * still being prefilled, then sampling on rank 0. Under tensor parallelism rank 0 owns the
 * engine and broadcasts every open, close and step; the other ranks follow (gen_follow).
 * gen_run is the run-to-completion wrapper used by `qevict generate` and the tests.
 * Not thread-safe: one thread per model. */
#ifndef QE_MODEL_GEN_H
#define QE_MODEL_GEN_H

#include "model.h"

enum {
  GEN_FINISH_NONE = 0,
  GEN_FINISH_LENGTH = 1,    /* n_predict (or the context) reached */
  GEN_FINISH_EOG = 2,       /* an end-of-generation token */
  GEN_FINISH_CANCELLED = 3, /* gen_engine_cancel */
  GEN_FINISH_ERROR = 4      /* the step it was in failed (the step's error is returned), or its
                               logits were not finite (NaN, +inf, only -inf: qe_errmsg says so
                               in on_finish; the step goes on) */
};

/* Largest open argument (gen_req_t.open_arg) in bytes. */
#define GEN_OPEN_ARG_MAX 4096

typedef struct {
  double prefill_s, decode_s; /* wall time of steps with prompt tokens / decode only */
  long n_prompt, n_gen;
  int n_steps;
  int n_decode_steps; /* steps without prompt tokens (decode_s's): decode_s over them is a TPOT
                         while every decoding sequence fits one step (generate: batch <= rows) */
  long n_decode_gen;  /* tokens those steps sampled */
} gen_stats_t;

/* ---- step engine ------------------------------------------------------------------------- */

typedef struct gen_engine gen_engine_t;

/* One request. Everything is copied by gen_engine_add. */
typedef struct {
  const int32_t *prompt; /* [n_prompt], 0 < n_prompt < the model context */
  int n_prompt;
  int n_predict;          /* max new tokens (> 0), forced ones included; capped by the context */
  kern_sampler_t sampler; /* temp <= 0: greedy */
  uint64_t seed;          /* the sampler's state is kern_rng_seed(seed) */
  int ignore_eog;         /* keep generating past end-of-generation tokens */
  /* Teacher forcing (may be NULL): token i generated is forced[i] for i < n_forced, fed back
   * instead of the sampled one (the sampler still runs, so its state advances as if it had
   * sampled it). Resuming a request = its prompt + the tokens it had generated, forced. */
  const int32_t *forced;
  int n_forced;
  /* Opaque bytes (<= GEN_OPEN_ARG_MAX) broadcast to every rank with the open and passed to
   * the open hook (e.g. the request's KV policy and budget); may be NULL / 0. */
  const void *open_arg;
  size_t open_arg_len;
} gen_req_t;

/* Opens `slot` of kv for `capacity` tokens on this rank; every rank calls it with the same
 * arguments (arg: the request's open_arg, valid during the call). Returns 0 or QE_E*. */
typedef int (*gen_open_fn)(void *ud, kv_cache_t *kv, int slot, int capacity, const void *arg,
                           size_t len);

typedef struct {
  gen_open_fn open; /* NULL: kv->ops->seq_open(kv, slot, capacity) */
  /* Rank 0, for each new token of a slot: index among its generated tokens, the id fed back,
   * forced = 1 if it came from gen_req_t.forced. May be NULL. */
  void (*on_token)(void *ud, int slot, int index, int id, int forced);
  /* Rank 0, after the slot was closed: reason is GEN_FINISH_*. May be NULL. */
  void (*on_finish)(void *ud, int slot, int reason);
  void *ud;
  int max_prompt_per_step; /* prompt tokens one step may take, over all sequences (0: the
                              model's max batch) */
  /* Rank 0, for each row sampled, before sampling: the row's logits (host memory, n_vocab).
   * May be NULL; when set, greedy steps take the logits path (no device argmax). */
  void (*on_logits)(void *ud, int slot, const float *logits, int n_vocab);
} gen_engine_opts_t;

/* Rank 0: creates an engine over m, kv (slots [0, kv->geom.max_seqs)) and comm, all borrowed
 * and outliving the engine; o is copied. Callbacks run inside gen_engine_step/cancel and must
 * not call back into the engine. QE_EINVAL on a rank other than 0; QE_ENOMEM. */
int gen_engine_create(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const gen_engine_opts_t *o,
                      gen_engine_t **out);

/* Starts request r in `slot` (opened on every rank through the open hook with capacity
 * n_prompt + n_predict capped at the context). QE_EINVAL with a detail naming the problem
 * (empty prompt, prompt >= context, token outside the vocabulary, n_predict <= 0, slot busy or
 * out of range, open_arg too long); the open's error (QE_ENOSPC...) of any rank is returned
 * and the slot stays free on every rank. QE_ECOMM if the group is broken. */
int gen_engine_add(gen_engine_t *e, int slot, const gen_req_t *r);

/* Closes a busy slot now (on every rank) and reports on_finish(GEN_FINISH_CANCELLED).
 * QE_EINVAL if the slot is not busy. */
int gen_engine_cancel(gen_engine_t *e, int slot);

/* One forward pass: every running sequence's decode token, then prompt tokens of sequences
 * still prefilling in slot order (at most max_prompt_per_step, and the model's max batch in
 * all; longer prompts continue in later steps); samples, reports tokens and finishes.
 * *active = 0 when there was nothing to run. On a forward error every sequence of the step
 * is closed with on_finish(GEN_FINISH_ERROR) and the error returned (under tensor
 * parallelism the group is then broken: destroy the engine), except QE_ECOMM (a rank went
 * away): the sequences then stay open with no on_finish, to be resumed elsewhere. */
int gen_engine_step(gen_engine_t *e, int *active);

/* Rank 0 while idle: a no-op broadcast so that the followers' I/O timeouts do not fire. */
int gen_engine_idle(gen_engine_t *e);

int gen_engine_n_active(const gen_engine_t *e);
int gen_engine_slot_busy(const gen_engine_t *e, int slot);
/* Tokens generated in slot (forced ones included), *n their count; NULL / 0 for a slot never
 * used. Valid after the slot finished too (during on_finish and until the slot is added
 * again); the pointer is invalidated by the next gen_engine_add of that slot. */
const int32_t *gen_engine_tokens(const gen_engine_t *e, int slot, int *n);
/* Steps where the sampled token equalled the forced one, in slot (same lifetime as tokens). */
int gen_engine_n_agree(const gen_engine_t *e, int slot);
/* Totals since creation: wall time of steps with prompt tokens / decode only, prompt tokens
 * fed, tokens generated, steps. */
void gen_engine_stats(const gen_engine_t *e, gen_stats_t *out);

/* Closes the open slots (no on_finish), tells the followers to stop (like gen_release) and
 * frees the engine. NULL-safe. */
void gen_engine_destroy(gen_engine_t *e);

/* What a follower calls back (all may be NULL; they run on the follower's thread, inside
 * gen_follow_hooks, and must not use comm). */
typedef struct {
  gen_open_fn open; /* opens a slot (NULL: kv->ops->seq_open) */
  /* Just before a CLOSE from rank 0 closes `slot` (in [0, max_seqs)), so that its final
   * figures can still be read; not called for the slots closed when the follower returns,
   * nor for an open that failed on some rank. */
  void (*closed)(void *ud, int slot);
  /* After every operation from rank 0 (open, close, step, no-op; an idle rank 0 sends a no-op
   * at least every report interval), e.g. to report memory periodically. */
  void (*tick)(void *ud);
  void *ud;
} gen_follow_hooks_t;

/* Ranks > 0: executes rank 0's opens, closes and steps until it stops, calling h's hooks
 * (h is read during the call only; NULL: no hooks). Closes every slot before returning.
 * Returns 0 when told to stop, or the error that ended it (QE_ECOMM when rank 0 went away). */
int gen_follow_hooks(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const gen_follow_hooks_t *h);

/* gen_follow_hooks with an open hook only: opens go through `open` (NULL: kv->ops->seq_open)
 * with ud. */
int gen_follow_ex(model_t *m, kv_cache_t *kv, tp_comm_t *comm, gen_open_fn open, void *ud);

/* gen_follow_ex without an open hook. */
int gen_follow(model_t *m, kv_cache_t *kv, tp_comm_t *comm);

/* Rank 0: tells followers to stop without running anything (after a local error). */
void gen_release(tp_comm_t *comm);

/* ---- run to completion -------------------------------------------------------------------- */

typedef struct {
  int n_predict;          /* max new tokens per sequence (> 0) */
  kern_sampler_t sampler; /* temp <= 0: greedy */
  uint64_t seed;          /* sequence i samples from kern_rng_seed(seed + i) */
  int ignore_eog;         /* keep generating past end-of-generation tokens */
  /* Called on rank 0 for each sampled token (may be NULL). */
  void (*on_token)(void *ud, int seq, int id);
  void *ud;
  /* Called on rank 0 with each row's logits before it is sampled (may be NULL; see
   * gen_engine_opts_t.on_logits). */
  void (*on_logits)(void *ud, int seq, const float *logits, int n_vocab);
} gen_opts_t;

typedef struct {
  const int32_t *prompt; /* borrowed */
  int n_prompt;
  int32_t *out; /* generated ids, malloc'd by gen_run (caller frees) */
  int n_out;
  int finish; /* GEN_FINISH_* (NONE if the run failed before it finished) */
  /* Teacher forcing (may be NULL): the tokens fed back instead of the sampled ones; n_agree
   * counts the steps where the sampled token equalled the forced one. */
  const int32_t *forced;
  int n_forced;
  int n_agree;
} gen_seq_t;

/* Prompt tokens a forward pass of gen_run takes at most (gen_engine_opts_t.max_prompt_per_step)
 * for seqs[0..n) on a model of cap rows a pass: cap when every prompt fits one pass; else cap - n,
 * a row kept for each sequence's decode beside a pass's prompts (cap when a prompt is longer than
 * that), rounded down to a whole number of prompts when they are all of one length (generate's):
 * those then go whole. Passes are filled in slot order, so a prompt of another length may be
 * split. */
int gen_prompt_budget(int cap, const gen_seq_t *seqs, int n);

/* Rank 0: runs seqs[0..n) to completion in one continuous batch (n <= kv max_seqs; sequence
 * i in slot i; the prompts in passes of at most gen_prompt_budget tokens), then tells followers
 * to stop. QE_EINVAL (with detail) for a prompt that does not fit the model's context or the
 * batch; QE_ERANGE when a sequence's logits were not finite (it ended there, the others ran on);
 * on any error the followers are released too. Built on the engine. */
int gen_run(model_t *m, kv_cache_t *kv, tp_comm_t *comm, gen_seq_t *seqs, int n,
            const gen_opts_t *o, gen_stats_t *st);

/* Convenience: encodes text (BOS per the model) into *ids (malloc'd) / *n. */
int gen_encode(const model_t *m, const char *text, size_t len, int parse_special, int32_t **ids,
               int *n);

#endif
