/* kv_gpu_internal: the GPU cache's private state, shared by kv_gpu.c (slots, stores, attention)
 * and kv_gpu_tiered.c (the tiered mode: budgets, routing on the device, statistics). */
#ifndef QE_KV_GPU_INTERNAL_H
#define QE_KV_GPU_INTERNAL_H

#include <stdint.h>

#include "kern_cuda_attn.h"
#include "kern_cuda_kv.h"
#include "kern_cuda_quant.h"
#include "kern_cuda_route.h"
#include "kv_gpu.h"
#include "kv_policy.h"

#define KVG_MAX_SEGS (1 << 14)
/* Bookkeeping bytes charged per live window: descriptor, score, page and ledger ids, plan. */
#define KVG_META    (sizeof(kern_pwin_t) + sizeof(float) + 2 * sizeof(int32_t) + 1)
#define KVG_PIN_MIN ((size_t)8 << 20)

typedef struct {
  int open, capacity, len;
  int routed;       /* tiered: a prefill routed the slot (later multi-token steps are refused) */
  unsigned fx_step; /* the last fixed step that took the slot (one row per slot and step) */
  int n_win;        /* windows per layer */
  int32_t *pages;   /* [n_layer][n_win] arena page ids */
} kvg_seq_t;

typedef struct {
  int seq, pos0, n;
  const float *k, *v;
} kvg_seg_t;

/* What a device buffer was last staged with (kv_gpu.c's stage_once). */
typedef struct {
  const void *dst; /* the device buffer (a regrown buffer has another address) */
  void *copy;      /* host copy of the bytes */
  size_t bytes, cap;
} kvg_last_t;

/* A device buffer grown on demand. */
typedef struct {
  void *p;
  size_t cap;
} kvg_buf_t;

typedef struct kv_gpu_tier kv_gpu_tier_t;
typedef struct kvg_obs kvg_obs_t;

typedef struct {
  kv_cache_t base;
  int omega, row, max_win;
  size_t page_bytes; /* K + V of one window */
  uint8_t *arena;
  size_t arena_bytes;
  int32_t *free_pages;
  int n_pages, n_free;
  int n_peak;       /* FullKV: most pages held by slots at once (kv_gpu_pool_usage) */
  kern_pwin_t *tab; /* device [n_layer][max_seqs][max_win] */
  kvg_seq_t *seqs;
  void *stream;
  uint8_t *pin; /* pinned staging ring */
  size_t pin_cap, pin_used;
  kvg_seg_t *segs; /* stores recorded since the last attend */
  int n_segs;
  int32_t *h_tok; /* host [2][tok_cap]: slot then position of each pending token */
  int tok_cap;
  kvg_last_t tok_last, sw_last; /* skip re-staging identical tables layer after layer */
  int alloc_all; /* tiered: layer 0's stores gave every layer's windows of the staged tokens
                    their pages (one launch); cleared when the tokens change or at the last layer */
  kvg_buf_t d_tok, d_upd, d_seqwin, d_idx, d_q, d_out, d_ws, d_gk, d_gv;
  kvg_buf_t d_tk; /* the attention's ticket counters (kc_attn_args_t.tickets), zeroed once */
  int32_t *h_seqwin, *h_idx; /* host [2 * max_seqs], [max_seqs] */
  kern_attn_seq_t *work;     /* [max_seqs] */
  kv_gpu_tier_t *t;          /* the tiered mode's state; NULL in FullKV mode */
  kvg_obs_t *obs;            /* the tiered mode's observer (kv_gpu_obs.c); NULL: none, and
                                nothing of it runs */
  int debug;                 /* QEVICT_KV_GPU_SYNC=1: synchronize after each phase */
  int fixed;                 /* in fixed mode (fx) */
  kv_fixed_t fx;
  kvg_buf_t d_fws;        /* fixed mode's attention workspace (grown only by fixed_mode) */
  unsigned long fx_epoch; /* bumped when d_fws moves */
  unsigned fx_step;       /* fixed steps filled */
  int fx_chunks[3][32];   /* bucket, n_min, max chunks of its attention launch (cached) */
  int n_fx_chunks;
  int prompt_room; /* tiered: prompt tokens a forward pass may store (kv_cache_prompt_room) */
} kv_gpu_t;

/* The tiered mode's state (kv_gpu_tiered.c; tests read it). */
struct kv_gpu_tier {
  kv_policy_cfg_t cfg;
  kc_route_t rt;
  kc_quant_args_t qa;
  kern_rope_t rope; /* the model's (factors borrowed) */
  kc_attn_rope_t arope;
  float *rope_tab;      /* device [n_rot / 2][2] */
  size_t floor;         /* per layer: sink and protected windows (kv_gpu_bounds) */
  double spec_fraction; /* budget spec for slots without an explicit budget */
  size_t spec_bytes;
  size_t *pending, *budget; /* [max_seqs] */
  int64_t *h_bhist;         /* [n_layer][max_seqs] B_hist of each (layer, slot) */
  int32_t *h_len, *h_slots; /* [max_seqs] */
  kvg_buf_t d_bhist, d_len, d_slots, d_mass;
  kc_timer_t *timer[2]; /* GPU time of the routing passes: after prefills [0], in decode [1] */
  void *dev[32];        /* device allocations of rt, freed at destroy */
  int n_dev;
};

/* kv_gpu.c */
int kv_gpu__buf_need(kv_gpu_t *g, kvg_buf_t *b, size_t bytes);
int kv_gpu__stage(kv_gpu_t *g, void *dst, const void *src, size_t bytes);
int64_t kv_gpu__tab_index(const kv_gpu_t *g, int layer, int seq, int w);
/* Fills a zeroed g (tiered: no FullKV arena, the tiered ops). Undo with kv_gpu__dispose. */
int kv_gpu__init(kv_gpu_t *g, kern_backend_t *be, const kv_geom_t *geom, int omega, int max_tokens,
                 size_t pool_bytes, int tiered);
void kv_gpu__dispose(kv_gpu_t *g); /* frees g */
/* kv_gpu_tiered.c: the tiered mode's hooks (g->t set) */
void kv_gpu__tier_destroy(kv_gpu_t *g);
int kv_gpu__tier_open(kv_gpu_t *g, int seq, int capacity);
void kv_gpu__tier_close(kv_gpu_t *g, int seq);
int kv_gpu__tier_usage(kv_gpu_t *g, kv_gpu_pool_t *out); /* units in use and peak (synchronizes) */
size_t kv_gpu__tier_bytes(kv_gpu_t *g, int seq);
/* Pages for the windows that the n tokens start, on layers layer0 .. layer0 + n_layers - 1. */
int kv_gpu__tier_alloc(kv_gpu_t *g, int layer0, int n_layers, const int32_t *tok_slot,
                       const int32_t *tok_pos, int n);
/* The decode kernel's tier arguments; the window masses accumulate into the scores unless the
 * scores are the prefill's, frozen (kv_gpu__tier_accumulates 0: SnapKV's scorer). */
void kv_gpu__tier_attn_args(const kv_gpu_t *g, int layer, kc_attn_args_t *a);
int kv_gpu__tier_accumulates(const kv_gpu_t *g);
int kv_gpu__tier_masses(kv_gpu_t *g, size_t total, float **mass);
int kv_gpu__tier_obs(const kv_gpu_t *g);
/* After the prefill attention of reqs[sel[0..np)] (g->work[i] holds the i-th one's key masses):
 * their window scores, then that layer of those slots is routed. */
int kv_gpu__tier_prefilled(kv_gpu_t *g, int layer, const kv_attn_req_t *reqs, const int *sel,
                           int np);
int kv_gpu__tier_decoded(kv_gpu_t *g, int layer, const kv_attn_req_t *reqs, const int *sel, int nd);
/* Windows aged at length len, the sink windows included (kern_cuda_route.h's rule): a decoding
 * slot routes when its new token moved this count. */
int kv_gpu__tier_aged(const kv_gpu_t *g, int len);
/* kv_gpu_obs.c: the tiered mode's observer (kv_cache_set_observer). The hooks run only while
 * g->obs is set: the decode kernel's step masses go to the observer's buffer (obs_args) and are
 * then added to the scores (obs_fold, bit-identical to accumulating them; not for frozen
 * scores); obs_capture records a layer's observations after its attention and before its
 * routing; obs_emit hands them to the observer once the step's routing has run (nd: decoding
 * requests in the call). */
int kv_gpu__obs_set(kv_cache_t *kv, kv_obs_fn fn, void *ud);
void kv_gpu__obs_free(kv_gpu_t *g);
int kv_gpu__obs_args(kv_gpu_t *g, kc_attn_args_t *a);
void kv_gpu__obs_fold(kv_gpu_t *g, int layer);
int kv_gpu__obs_capture(kv_gpu_t *g, int layer, const kv_attn_req_t *reqs, int n_reqs);
int kv_gpu__obs_emit(kv_gpu_t *g, int layer, int nd);
/* After a decode step of the slots seq[0..n) (lengths updated): routes where a window aged. */
int kv_gpu__tier_step_done(kv_gpu_t *g, const int32_t *seq, int n);

#endif
