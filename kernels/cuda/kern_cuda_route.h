/* kern_cuda_route: the tiered cache's bookkeeping on the GPU, so that nothing per window crosses
 * PCIe during decode: page and ledger allocation from device free stacks, QEvict routing
 * (kv_route.h's byte-exact greedy decision: FULL in score order within (1-q) * B_hist, then INT2
 * within the rest, everything else EVICTED; ties: the older window first), and the descriptor
 * and accounting updates of the migrations. Quantizing and dequantizing the windows themselves is
 * kern_cuda_quant.h's; this module fills its job lists.
 *
 * State (all device memory, owned by the caller, indexed i = (layer * max_seqs + slot) * max_win
 * + w for window w; j = layer * max_seqs + slot for a (layer, slot)):
 *   win    kern_pwin_t [..]  the descriptors the decode kernel reads (FULL pages and ledgers are
 *                            offsets from one arena of units of page_bytes: page p is unit p;
 *                            ledger id l is slot l % led_per of unit l / led_per)
 *   score  float [..]        the routing scores: cumulative attention mass (the decode kernel
 *                            accumulates into it), or the prefill's masses alone (frozen)
 *   page   int32 [..]        FULL page id, or -1
 *   ledger int32 [..]        ledger id (write-once: kept while promoted), or -1
 *   plan   int8 [..]         scratch: the tier decided by the last routing
 *   aged   int32 [per j]     aged windows at the last routing
 *   st     kc_route_stat_t [per j]
 * Windows [0, sink_win) are the sink (always FULL); window w is aged when (w + 1) * omega <=
 * len - n_local; aged windows are the routing candidates while FULL or QUANT.
 * One pool of units serves both tiers: a FULL window takes a unit; ledgers are carved led_per to a
 * unit (a "slab"). Free stacks: units, ledgers (ids of free slab slots), and spares (slots of a
 * slab just cut, merged into the ledger stack by the next push launch); the kernels pop in one
 * launch and push in another (never both on one stack in one launch), so plain atomics suffice.
 * When units run low, a coalescing pass at the start of a routing call returns every slab whose
 * slots are all free to the unit stack. A pop that finds no unit sets err_flag (bit 1: units)
 * and the window keeps a tier it can hold (a demotion without a ledger becomes an eviction; a
 * promotion stays QUANT; a new window without a page leaves its descriptor EVICTED and its
 * tokens unstored). units_low records the fewest free units there have been (pool usage peaks).
 * Every launch function enqueues on the stream and returns 0, QE_EINVAL or QE_EBACKEND. */
#ifndef QE_KERN_CUDA_ROUTE_H
#define QE_KERN_CUDA_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "kern_cuda_quant.h"
#include "kern_paged.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Accounting of one (layer, slot) after its last routing, kept on the device. bytes: FULL pages
 * with their kept ledgers, QUANT ledgers, and meta_bytes per live window. */
typedef struct {
  int64_t bytes;
  int32_t n_full, n_quant, n_evicted; /* windows per tier (sink and local included in FULL) */
  int32_t promotions, demotions, evictions, quantizations, routings;
} kc_route_stat_t;

/* GraphKV re-scoring before the decision (cache/graphkv.h, kern_cuda_graphkv.h), as the CPU
 * tiered cache does it: for every routed (slot, layer) under pressure with more than one
 * candidate, the candidates' scores (clamped to [0, FLT_MAX]) are re-scored over their mean
 * pre-RoPE keys (kc_mean_keys), with "the slots being filled" = the windows B_hist holds at
 * (1 - q) FULL and q QUANT; the decision ranks by the result (gscore), the cumulative scores stay.
 * Scratch for `chunk` layers of max_seqs groups of max_win candidates: kc_route_gkv_bytes. */
typedef struct {
  int on;            /* re-score (scorer-based policies only: not with recency) */
  float source_frac; /* graphkv_params_t's */
  int m, rounds;
  int chunk;                 /* layers re-scored per pass over the scratch (>= 1) */
  int row;                   /* key length: n_kv * head_dim */
  float *gscore;             /* [as score] the scores the decision ranks by */
  kern_pwin_t *cwin;         /* [chunk * max_seqs * max_win]: candidates' descriptors, */
  int32_t *cw;               /*   their windows, */
  float *cscore;             /*   their scores, re-scored in place, */
  float *keys;               /*   their mean keys [.][row], */
  double *norm;              /*   and kc_graphkv_args_t's scratch */
  float *decay, *sim;        /* sim: 8 times as long */
  int32_t *n_cand, *n_slots; /* [chunk * max_seqs] */
} kc_route_gkv_t;

typedef struct {
  /* geometry */
  int max_seqs, max_win, n_layer, omega, sink_win, n_local;
  kern_paged_geom_t pg;  /* for the ledger layout */
  kc_quant_layout_t lay; /* one ledger slot (n_tok = omega) */
  uint64_t page_bytes;   /* one FULL window: K page then V page; also the unit size */
  int led_per;           /* ledgers per unit: page_bytes / lay.total (>= 1) */
  int n_units;           /* units in the arena */
  uint64_t meta_bytes;   /* bookkeeping bytes charged per live window (descriptor, score,
                            ids), as kv_tiered charges KV_WIN_META */
  /* policy (kv_route_params_t) */
  float q;      /* INT2 share of B_hist */
  int use_int2; /* the policy has an INT2 tier (q > 0) */
  int use_full; /* history may stay FULL (q < 1) */
  int promote;  /* QUANT candidates may become FULL */
  int recency;  /* rank by position (newest first) instead of score (KIVI-style) */
  int pool;     /* >1: a prefill's window masses max-pooled over this many windows past the
                   sink (SnapKV), as kv_tiered pools them; 1: none */
  /* state */
  kern_pwin_t *win;
  float *score;
  int32_t *page, *ledger;
  int8_t *plan;
  int32_t *aged;
  kc_route_stat_t *st;
  int32_t *page_stack, *page_top;     /* free units [n_units] */
  int32_t *units_low;                 /* low-water mark of *page_top (the caller sets it to the
                                         top it starts from); every successful unit pop lowers
                                         it; NULL: not tracked */
  int32_t *ledger_stack, *ledger_top; /* free ledger slots [n_units * led_per] */
  int32_t *spare_stack, *spare_top;   /* slots of newly cut slabs [n_units * led_per] */
  int32_t *led_need;                  /* scratch: new ledgers a pass's demotions need (counted
                                         in the evict phase; whole slabs are cut for them before
                                         the ledger phase pops) */
  int32_t *unit_cnt;                  /* scratch [n_units] for coalescing */
  int32_t *err_flag;
  /* migration job lists (capacity job_cap each; may be one buffer: the demotions' list is
     done with before the promotions' is filled) and their device counts */
  kc_quant_job_t *qjobs, *djobs;
  int32_t *n_qjobs, *n_djobs;
  int job_cap;
  int32_t *routed; /* [max_seqs * n_layer]: 1 when the last decide changed something there */
  kc_route_gkv_t gkv;
} kc_route_t;

/* Per-call inputs: the slots to look at and, per slot, its length and its history budget on each
 * layer (B_hist, bytes; per layer: PyramidKV's budgets differ by layer). */
typedef struct {
  const int32_t *slots; /* device [n_slots] */
  int n_slots;
  int layer0, n_layers;  /* layers [layer0, layer0 + n_layers) */
  const int32_t *len;    /* device [max_seqs] */
  const int64_t *b_hist; /* device [n_layer * max_seqs], indexed layer * max_seqs + slot */
  int force;             /* route even when no window aged (after a prefill) */
} kc_route_call_t;

/* Resets slot `slot` on every layer: no pages, no ledgers, descriptors EVICTED with n_tok 0,
 * scores 0, aged 0, stats 0. The slot must hold nothing (kc_route_release first). */
int kc_route_reset_slot(const kc_route_t *r, int slot, void *stream);
/* Pushes every page and ledger of `slot` (all layers) back to the free stacks. */
int kc_route_release_slot(const kc_route_t *r, int slot, void *stream);
/* Gives a FULL page to every window that the n tokens (tok_slot, tok_pos) will write into and
 * that has none (the first token of a window, or of a batch run), on layers layer0 ..
 * layer0 + n_layers - 1 (one launch). Tokens with a negative tok_slot (inactive rows, after the
 * active ones) are skipped. */
int kc_route_alloc_windows(const kc_route_t *r, int layer0, int n_layers, const int32_t *tok_slot,
                           const int32_t *tok_pos, int n, void *stream);
/* score[w] += the window's mass, one layer of one slot: the sum of key_mass[t] over its tokens t
 * (positions 0 .. n_tok - 1, key_mass [n_tok] in position order), max-pooled over r->pool windows
 * past the sink (the window and r->pool / 2 on each side among windows sink_win .. the last) when
 * r->pool > 1. */
int kc_route_add_masses(const kc_route_t *r, int layer, int slot, const float *key_mass, int n_tok,
                        void *stream);
/* One routing pass over c's slots and layers: decide, allocate, quantize / dequantize (through
 * kern_cuda_quant with qa's geometry and RoPE), commit (descriptors, frees, stats). */
int kc_route_run(const kc_route_t *r, const kc_route_call_t *c, const kc_quant_args_t *qa,
                 void *stream);

/* Device bytes of gkv's scratch for `chunk` layers (gscore excluded: n_layer * max_seqs *
 * max_win floats). */
size_t kc_route_gkv_bytes(int max_seqs, int max_win, int row, int chunk);

/* Dynamic shared memory the decide kernel needs for max_win candidates (padded to a power of two,
 * at least 256). */
size_t kc_route_smem(int max_win);

#ifdef __cplusplus
}
#endif

#endif
