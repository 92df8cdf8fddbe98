/* kv_tiered_internal: the tiered cache's private state, shared by its source files. */
#ifndef QE_KV_TIERED_INTERNAL_H
#define QE_KV_TIERED_INTERNAL_H

#include <stdint.h>

#include "kv_pool.h"
#include "kv_tiered.h"

/* Persistent bookkeeping bytes of a window: start position, score, state (knorm adds its
 * key-norm sum; GraphKV's mean keys are computed from the pages at routing, never stored). */
#define KV_WIN_META 12

typedef struct {
  int32_t start;    /* first position */
  int32_t n;        /* tokens stored (<= omega) */
  int tier;         /* KV_TIER_* */
  float *page;      /* Full page: K [omega][row] (post-RoPE) then V [omega][row]; or NULL */
  uint8_t *ledger;  /* INT2 ledger (write-once); NULL until first quantized */
  float score, acc; /* policy score; accumulator (p-norm) */
  float norm_sum;   /* sum of per-token pre-RoPE key L2 norms (knorm) */
} kv_win_t;

typedef struct {
  float *sink; /* [min(n_sink, capacity)][2][row]: K (post-RoPE) then V per token */
  kv_win_t *wins;
  int n_wins, cap_wins;
  int n_aged;    /* aged windows at the last routing */
  int len;       /* tokens stored in this layer */
  size_t budget; /* this layer's share */
  size_t bytes;  /* persistent bytes now */
} kv_tlayer_t;

typedef struct {
  int open;
  int len; /* tokens stored (all layers move together) */
  int capacity;
  size_t budget;
  size_t sink_bytes; /* a layer's sink rows: min(n_sink, capacity) tokens */
  size_t floor;      /* a layer's protected regions, capped at the capacity (kv_tiered.c) */
  kv_tlayer_t *layers;
  kv_mem_stats_t st;
} kv_tseq_t;

/* A run of a sequence's accessible keys, as attention reads them in place: fp32 rows (k, v,
 * `stride` floats apart: the sink, a Full page) or an INT2 window's ledger. */
typedef struct {
  const float *k, *v;
  const uint8_t *ledger;
  size_t stride;
  int n;
} kv_trun_t;

typedef struct {
  kv_cache_t base;
  kv_policy_cfg_t cfg;
  kern_rope_t rope;
  kv_qsizes_t qs;
  size_t row; /* floats per token per K or V: n_kv * head_dim */
  size_t page_bytes, ledger_bytes, sink_bytes, meta_bytes; /* sink: all n_sink tokens */
  size_t local_reserve; /* protected windows' worst-case bytes per layer (a long slot's) */
  kv_pool_t *pool;
  kv_tseq_t *seqs;
  size_t *pending_budget;
  kv_mem_stats_t *final; /* stats of each slot when it was last closed */
  double spec_fraction;  /* budget spec for slots without an explicit budget */
  size_t spec_bytes;
  kv_trace_fn trace;
  void *trace_ud;
  kv_obs_fn obs;
  void *obs_ud;
  /* attention workspace (host/backend memory), grown on demand */
  float *gk, *gv, *gmass; /* gk, gv: [rcap][row] when gathering; gmass: [gcap] */
  int32_t *gpos;          /* [gcap] */
  int gcap, rcap;
  kv_trun_t *runs; /* [runcap] when reading in place */
  int32_t *rfirst; /* [runcap]: each run's first key (kern_kv_src_t.first) */
  int runcap;
  int gather;  /* gather even where in place would do (kv_tiered_set_gather) */
  float *tmp;  /* [omega][row] */
  float *tmp2; /* [omega][row] */
} kv_tiered_t;

static inline int kv_win_aged(const kv_tiered_t *t, const kv_win_t *w, int len) {
  return w->start + t->cfg.omega <= len - t->cfg.n_local;
}

/* kv_tiered_route.c */
int kv_tiered_route_layer(kv_tiered_t *t, int seq, int layer);
int kv_tiered_promote(kv_tiered_t *t, kv_win_t *w);
size_t kv_tiered_win_bytes(const kv_tiered_t *t, const kv_win_t *w);
/* kv_tiered.c */
void kv_tiered_observe(kv_tiered_t *t, int kind, int seq, int layer, int n_q, const float *mass,
                       float sink_mass);
/* kv_tiered_attn.c */
int kv_tiered_attend(kv_cache_t *kv, int layer, const kv_attn_req_t *reqs, int n_reqs);
/* Bytes of attention workspace (the per-slot stats' workspace). */
size_t kv_tiered_workspace(const kv_tiered_t *t);
/* Rotates x [n][n_kv][hd] to positions start.. (sign = +1) or back (sign = -1). */
void kv_tiered_rotate(kv_tiered_t *t, float *x, int start, int n, int sign);
/* Rotates the keys x [n][row] of a window starting at `start` between post-RoPE and the frame
 * the ledger keeps them in (cfg.quant.key_frame): sign -1 from post-RoPE to the frame, +1 back. */
void kv_tiered_key_frame(kv_tiered_t *t, float *x, int start, int n, int sign);

#endif
