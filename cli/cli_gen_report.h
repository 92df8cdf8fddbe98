/* cli_gen_report: what `qevict generate --json` reports beside the tokens: each tensor-parallel
 * rank's memory, KV cache memory summary, KV pool use and all-reduce time (gathered to rank 0 over
 * the CPU link), the top two logits of sequence 0 at every step (--top2), and the ids read for
 * teacher forcing
 * (--force-ids). */
#ifndef QE_CLI_GEN_REPORT_H
#define QE_CLI_GEN_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "cli_policy.h"
#include "kern.h"
#include "kv_cache.h"
#include "model.h"
#include "tp_comm.h"

/* One rank's figures; -1 where they do not apply (a CPU rank, a cache without a GPU pool,
 * all-reduces not timed). */
typedef struct {
  int32_t rank, device;
  int64_t weight_bytes, gpu_used, gpu_total;
  int64_t pool_unit_bytes, pool_units, pool_in_use, pool_peak, pool_arena_bytes;
  double allreduce_ms;
  int64_t allreduce_calls;
  cli_policy_mem_t mem; /* its KV cache's slot 0 */
} gen_rank_report_t;

/* This rank's figures (nc: its NCCL communicator or NULL; timed when timing was turned on). */
int gen_report_fill(kern_backend_t *be, const model_t *m, kv_cache_t *kv, tp_comm_t *c,
                    tp_comm_t *nc, gen_rank_report_t *r);
/* A JSON array of n reports (policy: --policy's name, for each rank's "memory"). */
void gen_report_json(const gen_rank_report_t *all, int n, const char *policy, FILE *f);

/* Per step: id and logit of the best and second-best token. */
typedef struct {
  float *v; /* [cap][4]: id1, logit1, id2, logit2 */
  int n, cap;
} gen_top2_t;
void gen_top2_push(gen_top2_t *t, const float *logits, int n_vocab);
void gen_top2_json(const gen_top2_t *t, FILE *f); /* [[id1,l1,id2,l2],...] */

/* Reads the ids of a file into *ids (malloc'd): a JSON array of integers or integers separated
 * by whitespace, each in 0..INT32_MAX. QE_EIO for a file that cannot be read (missing, a
 * directory), QE_EINVAL naming the file and the offending token for anything else (a sign, a
 * fraction, hex, a word, a missing or extra bracket or comma) and for no ids. */
int gen_read_ids(const char *path, int32_t **ids, int *n);

#endif
