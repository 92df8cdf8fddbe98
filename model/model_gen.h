/* model_gen: drives generation over a model and a KV cache: continuous batching of many
 * sequences (prompt chunks and decode tokens share forward passes), sampling on rank 0, and
 * the tensor-parallel lockstep (rank 0 broadcasts every step's plan; other ranks follow).
 * Not thread-safe: one thread per model. */
#ifndef QE_MODEL_GEN_H
#define QE_MODEL_GEN_H

#include "model.h"

enum { GEN_FINISH_NONE = 0, GEN_FINISH_LENGTH = 1, GEN_FINISH_EOG = 2 };

typedef struct {
  int n_predict;          /* max new tokens per sequence (> 0) */
  kern_sampler_t sampler; /* temp <= 0: greedy */
  uint64_t seed;          /* sequence i samples from kern_rng_seed(seed + i) */
  int ignore_eog;         /* keep generating past end-of-generation tokens */
  /* Called on rank 0 for each sampled token (may be NULL). */
  void (*on_token)(void *ud, int seq, int id);
  void *ud;
} gen_opts_t;

typedef struct {
  const int32_t *prompt; /* borrowed */
  int n_prompt;
  int32_t *out; /* generated ids, malloc'd by gen_run (caller frees) */
  int n_out;
  int finish; /* GEN_FINISH_* */
  /* Teacher forcing (may be NULL): the tokens fed back instead of the sampled ones; n_agree
   * counts the steps where the sampled token equalled the forced one. */
  const int32_t *forced;
  int n_forced;
  int n_agree;
} gen_seq_t;

typedef struct {
  double prefill_s, decode_s; /* wall time of steps with prompt tokens / decode only */
  long n_prompt, n_gen;
  int n_steps;
} gen_stats_t;

/* Rank 0: runs seqs[0..n) to completion in one continuous batch (n <= kv max_seqs), then
 * tells followers to stop. QE_EINVAL (with detail) for a prompt that does not fit the
 * model's context or the batch; on any error the followers are released too. */
int gen_run(model_t *m, kv_cache_t *kv, tp_comm_t *comm, gen_seq_t *seqs, int n,
            const gen_opts_t *o, gen_stats_t *st);

/* Rank 0: tells followers to stop without running anything (after a local error). */
void gen_release(tp_comm_t *comm);

/* Ranks > 0: executes rank 0's plan until it stops. */
int gen_follow(model_t *m, kv_cache_t *kv, tp_comm_t *comm);

/* Convenience: encodes text (BOS per the model) into *ids (malloc'd) / *n. */
int gen_encode(const model_t *m, const char *text, size_t len, int parse_special, int32_t **ids,
               int *n);

#endif
