/* cli_policy: the KV cache options of `qevict generate` (--policy, --budget, --q, --window,
 * --bits, --sink, --local, --graphkv, --trace), building the cache of a rank, and the memory
 * summary (human and JSON). */
#ifndef QE_CLI_POLICY_H
#define QE_CLI_POLICY_H

#include <stdio.h>

#include "kv_tiered.h"
#include "model.h"

typedef struct {
  const char *name; /* policy (default "full") */
  double frac;      /* budget as a fraction of FullKV bytes (default 1) */
  size_t bytes;     /* budget in bytes for the whole request (all ranks); 0 = use frac */
  float q;          /* overrides; negative / zero = the policy's default */
  int omega, bits, sink, local;
  int scorer;  /* kv_scorer_t override, -1 = the policy's */
  int graphkv; /* --graphkv given */
  graphkv_params_t gkv;
  const char *trace; /* --trace FILE */
  int promote;       /* INT2 windows may return to Full: -1 = the policy's, 0 or 1 (eval) */
  int key_frame;     /* --key-frame: -1 = the policy's (post-RoPE), else KV_KEY_FRAME_* */
} cli_policy_t;

void cli_policy_init(cli_policy_t *p);
/* 0: handled; 1: not a policy flag; 2: bad value (usage error printed by the caller). A flag
 * without a value (--graphkv) is passed with v == NULL. */
int cli_policy_parse(cli_policy_t *p, const char *flag, const char *v);
/* The first cache option p sets that only a policy with windows takes (--budget, --q, --window,
 * --bits, --sink, --local, --scorer, --key-frame, --graphkv, --trace), or NULL. */
const char *cli_policy_stray(const cli_policy_t *p);
/* Resolves the policy descriptor with overrides; QE_EINVAL with a detail naming the field. */
int cli_policy_resolve(const cli_policy_t *p, int head_dim, kv_policy_desc_t *out);
/* Builds rank's cache for n_seqs sequences of up to capacity tokens (a tp-size share of a
 * byte budget). trace_out: an open FILE for routing events on rank 0, or NULL. */
int cli_policy_make_cache(const cli_policy_t *p, kern_backend_t *be, const model_t *m, int n_seqs,
                          int capacity, FILE *trace_out, kv_cache_t **out);
/* Memory summary of slot 0 after the run (nothing for FullKV): cli_policy_mem_print of kv's as
 * rank 0's. */
void cli_policy_print(const cli_policy_t *p, kv_cache_t *kv, FILE *f);
/* The same as one JSON object (cli_policy_mem_json of kv's, labelled with rank when rank >= 0),
 * and the GPU pool's warning on stderr. */
void cli_policy_json(const cli_policy_t *p, kv_cache_t *kv, int rank, FILE *f);

enum { CLI_MEM_FULL, CLI_MEM_CPU, CLI_MEM_GPU };
/* One rank's memory summary of slot 0: plain data (the ranks of generate --tp gather theirs). */
typedef struct {
  int kind;               /* CLI_MEM_FULL (no figures), _CPU (tiered) or _GPU (tiered) */
  kv_mem_stats_t s;       /* cli_policy_mem_stats's */
  int pool_faults;        /* GPU: kv_gpu_stats_t's err_flags */
  double routing_ms[2];   /* GPU: the routing passes' device time, prefill and decode */
  long routing_passes[2]; /* GPU: their passes */
} cli_policy_mem_t;
void cli_policy_mem(kv_cache_t *kv, cli_policy_mem_t *out);
/* m as one JSON object: "policy" (policy's name, or "full"), "rank" when rank >= 0, then the
 * figures of its kind (a FullKV cache has none). */
void cli_policy_mem_json(const char *policy, int rank, const cli_policy_mem_t *m, FILE *f);
/* m as one line of text labelled with policy and rank, "qevict: memory (policy P, rank R): ..."
 * (GPU: "policy P, GPU, rank R", then the pool's warning when it ran out); nothing for FullKV. */
void cli_policy_mem_print(const char *policy, int rank, const cli_policy_mem_t *m, FILE *f);
/* Slot 0's memory figures of a tiered cache, CPU (kv_tiered_stats) or GPU (kv_gpu_stats: the
 * figures as of its last routing; peak_bytes is those bytes, the transient and workspace fields
 * are 0). 1 when filled, 0 for a cache without them (FullKV). */
int cli_policy_mem_stats(kv_cache_t *kv, kv_mem_stats_t *out);
/* FullKV's bytes for n_tokens of one sequence in kv's shard: the GPU caches' bf16 pages
 * (kv_gpu_fullkv_bytes: the base of their budget fractions), else fp32 rows (the CPU caches'). */
size_t cli_policy_fullkv_bytes(const kv_cache_t *kv, long n_tokens);

/* 0 when name is a known policy (NAME or NAME+graphkv), -1 otherwise. */
int cli_check_policy(const char *name);
/* A comma list of the known policy names into buf (for error messages). */
const char *cli_policy_names(char *buf, size_t size);

#endif
