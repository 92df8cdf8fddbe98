/* kern_cuda_attn: GPU decode attention over tiered paged KV (kern_paged.h), C-callable, with no
 * CUDA type in this header (the stream is a void *).
 *
 * One query token per sequence attends to its FULL and QUANT windows (EVICTED ones are skipped):
 *   out[b][h] = sum_t softmax_t(scale * q[b][h] . k_t) v_t over the live tokens of sequence b,
 * GQA-aware: one block handles one (sequence, KV head, chunk of windows) and all n_head / n_kv
 * query heads of that KV head, so each K/V byte is read once. Chunks are merged by a second
 * (combine) kernel with a log-sum-exp merge, which also writes the attention mass of every
 * window:
 *   mass[w] = (1/n_head) * sum_h sum_{t in w} p_h(t)      (0 for evicted windows).
 * Precision: q is fp32 in, out and mass fp32 out. q is scaled by scale * log2(e) and rounded to
 * bf16 (tensor-core products, fp32 accumulation) when no window is QUANT (has_quant = 0); with
 * QUANT windows every operand is fp16 instead (q saturating at +-65504; FULL bf16 pages converted
 * in registers). QUANT keys and values are dequantized (c * s + z) in fp16 registers. Post-RoPE
 * keys (abs_keys) are then used as they are, every tier of a tile against the same q; pre-RoPE
 * keys are re-rotated by R(row) for their row within a 16-row tile and the window's base
 * rotation is applied to q instead (q . R(b) R(r) k = (R(b)^T q) . R(r) k). Angles use the CPU
 * formula of kern_cpu_rope for the base position and for the row offset (composed, so they differ
 * from the CPU's angle of the sum by the fp32 rounding of pos * freq); cos/sin are rounded to fp16.
 * Probabilities are rounded to bf16 / fp16 before the P.V product. Expect |out - ref| / |ref|
 * of a few 1e-4 (QUANT) to 2e-3 (bf16 FULL) against an fp64 reference.
 * Threading: functions are reentrant; one call works on one stream. Errors are returned as
 * negative QE_E* codes with a qe_errf detail (every CUDA call and launch checked, file and
 * line in the detail). */
#ifndef QE_KERN_CUDA_ATTN_H
#define QE_KERN_CUDA_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "kern.h"
#include "kern_paged.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RoPE of the QUANT windows' keys, in the form the kernel reads (fill with kc_attn_rope_init). */
typedef struct {
  int mode;           /* KERN_ROPE_NORM or KERN_ROPE_NEOX */
  int n_rot;          /* rotated channels (even, <= head_dim; NEOX: == head_dim) */
  float freq_scale;   /* kern_rope_t.freq_scale */
  int yarn;           /* 1 when kern_rope_t.ext_factor != 0 */
  float mscale;       /* cos/sin multiplier (attn_factor, times YaRN's magnitude scale) */
  const float *table; /* device [n_rot / 2][2]: freq(i) and YaRN mix(i), from kc_attn_rope_init */
} kc_attn_rope_t;

/* Flags (kc_attn_args_t.flags). */
enum {
  KC_ATTN_SKIP_COMBINE = 1,   /* run the chunk kernel only (benchmarks: out and mass are written
                                 only for the sequences that need no combine, see tickets) */
  KC_ATTN_MASS_ACCUMULATE = 2 /* mass[w] += the step's mass (a running score) instead of = */
};

typedef struct {
  kern_paged_geom_t geom;  /* n_kv, head_dim, omega, bits, group */
  int n_seq;               /* B */
  int n_head;              /* query heads (local); n_head % n_kv == 0, n_head / n_kv <= 8 */
  float scale;             /* softmax scale, usually 1/sqrt(head_dim) */
  kc_attn_rope_t rope;     /* used when has_quant */
  const void *arena;       /* device base of every window offset (NULL: offsets are addresses) */
  const kern_pwin_t *win;  /* device [n_win] */
  const int32_t *seq_win;  /* device [n_seq + 1] */
  const int32_t *seq_nwin; /* device [n_seq] or NULL: when set, sequence b's windows are
                              [seq_win[b], seq_win[b] + seq_nwin[b]) (ranges may leave gaps,
                              e.g. one fixed-size table region per cache slot; n_win and
                              max_win still bound every index and count); a negative
                              seq_nwin[b] skips sequence b: its outputs are left as they are
                              (another call owns them: kv_mux's fixed steps over several
                              caches), where 0 writes zeros */
  int n_win;               /* total windows */
  int max_win;             /* >= the most windows of one sequence (sizes the chunking) */
  int has_quant;           /* 1 when any window may be QUANT (0 picks the bf16 FULL-only kernel,
                              which would misread a QUANT window) */
  int abs_keys;            /* 1: QUANT keys are post-RoPE (KV_KEY_FRAME_ABS): dequantized and
                              used as they are, no rotation (rope unused); 0: pre-RoPE */
  const float *q;          /* device [n_seq][n_head][head_dim] fp32, 16-byte aligned */
  float *out;              /* device [n_seq][n_head][head_dim] fp32 */
  float *mass;             /* device [n_win] fp32, or NULL */
  uint32_t *tickets;       /* device [n_seq] counters, zero before the first call (each call
                              leaves them zero), or NULL. A sequence whose windows form one
                              chunk needs no combine pass: the chunk kernel writes its outputs,
                              and with tickets its masses too (the last of its n_kv blocks
                              sums them); a call in which every sequence is such launches no
                              combine kernel. The masses are the same bits either way. */
  void *ws;                /* device workspace of kc_attn_ws_bytes(this) bytes (256-aligned) */
  size_t ws_bytes;
  int chunk_win; /* windows per chunk; 0 picks one from the device's size (kc_attn_chunk_win) */
  int flags;     /* KC_ATTN_* */
  /* Launches that stay the same from call to call (CUDA graphs): when chunk_dev is set, the
   * kernels read the windows per chunk from device chunk_dev [0] and the order word
   * (kc_attn_lead) from chunk_dev [1] when they run (chunk_win is then ignored), the grid holds
   * max_chunk chunks per sequence (surplus blocks exit) and the workspace is laid out for
   * max_chunk. The caller keeps ceil(windows of any sequence / *chunk_dev) <= max_chunk
   * (kc_attn_max_chunks gives a bound). */
  const int32_t *chunk_dev;
  int max_chunk;
} kc_attn_args_t;

/* Fills r from a model's RoPE with the CPU backend's formula (kern_cpu_rope): freq(i) =
 * freq_scale-free 1/theta^(2i/n_rot) / factors[i], YaRN ramp, magnitude scale. table_host gets
 * [r->n_rot / 2][2] floats, to be copied to the device buffer that out->table must point to
 * (set by the caller). Returns 0 or QE_EINVAL (odd or non-positive n_rot). Thread-safe. */
int kc_attn_rope_init(const kern_rope_t *r, float *table_host, kc_attn_rope_t *out);

/* Past one wave of blocks, sequences of at least 2 KC_ATTN_SPLIT_MIN windows are cut in
 * KC_ATTN_SPLIT chunks ($QE_CUDA_ATTN_SPLIT, 1..8, read once, overrides): the last wave's
 * tail is a block's time (H200, 122 x 32K tokens at QEvict 20%: 63.1 -> 61.3 ms a step). With
 * masses, past half a wave too: one chunk a sequence sums its masses in its last block (H200,
 * 32 x 32K tokens at QEvict 20%: 0.356 ms in one chunk, 0.330 in two). */
#define KC_ATTN_SPLIT     2
#define KC_ATTN_SPLIT_MIN 1024
/* A tiered call (has_quant) whose KC_ATTN_SPLIT chunks would still fill more than two waves
 * ("wide": long_ctx's 59-121 sequences of 32K tokens) cuts its long sequences in
 * KC_ATTN_SPLIT_WIDE chunks instead, and leads (kc_attn_lead) with 300 permille of a chunk in a
 * chunk-major grid: its last waves hold the short chunks, so the tail is shorter (H100, 121 x
 * 32K at QEvict 20%: 1.457 -> 1.404-1.406 ms; 59 sequences in long_ctx: 30.13 -> 29.51 ms a
 * step). */
#define KC_ATTN_SPLIT_WIDE 4

/* The chunks a long sequence splits in past one wave: $QE_CUDA_ATTN_SPLIT when in 1..8, else
 * KC_ATTN_SPLIT (read once); kc_attn_split_wide: in a wide tiered call, $QE_CUDA_ATTN_SPLIT
 * too, else KC_ATTN_SPLIT_WIDE. */
int kc_attn_split(void);
int kc_attn_split_wide(void);

/* The chunk size (windows) the call will use: a->chunk_win if set, else one that spreads
 * n_seq * n_kv * chunks over the device's multiprocessors in about one wave, or past one wave
 * KC_ATTN_SPLIT's (queries the current device, cached). Checks the geometry, not the buffers.
 * Returns >= 1, or a negative QE_E* code. */
int kc_attn_chunk_win(const kc_attn_args_t *a);

/* The order word kc_attn_decode gives a's call, a != chunk_dev: the lead (the low 30 bits) and
 * KC_ATTN_SPREAD. The lead (windows): the first half of each sequence's chunks take that many
 * windows more and the second half that many less, in a grid whose blocks are dispatched chunk
 * by chunk, for launches of one wave (a multiprocessor's warp scheduler favours the older of its
 * two blocks), and for wide tiered calls (KC_ATTN_SPLIT_WIDE). $QE_CUDA_ATTN_LEAD (permille of a
 * chunk, 0..900, read once) sets it for every call of two chunks or more. KC_ATTN_SPREAD: in tiered
 * calls of at most two waves of blocks, a block's FULL tiles (memory-bound) run spread among its
 * INT2 ones (issue-bound) instead of all first ($QE_CUDA_ATTN_SPREAD: 0 never, 1 in every call;
 * read once). A chunk_dev launch reads its step's word from chunk_dev[1], which the caller fills
 * with this function's value for the step's eager arguments. Negative: an error code. */
#define KC_ATTN_SPREAD (1 << 30)
int kc_attn_lead(const kc_attn_args_t *a);

/* The most chunks per sequence kc_attn_chunk_win's choice gives for any call of a's geometry
 * with n_seq in [n_seq_min, a->n_seq] and max_win in [1, a->max_win] (chunk_win 0): the
 * max_chunk of a fixed launch. Returns >= 1, or a negative QE_E* code. */
int kc_attn_max_chunks(const kc_attn_args_t *a, int n_seq_min);

/* Workspace bytes the call needs (partial outputs and log-sum-exps per chunk, per-window
 * log-sum-exps when mass is set); the buffers need not be set yet. Returns 0 and sets *bytes,
 * or a negative QE_E* code. */
int kc_attn_ws_bytes(const kc_attn_args_t *a, size_t *bytes);

/* Checks a's geometry and sizes against the kernel's limits (no device access). 0, or
 * QE_EINVAL / QE_EUNSUPPORTED with a detail naming the field. */
int kc_attn_check(const kc_attn_args_t *a);

/* Enqueues the decode attention on stream (a cudaStream_t; NULL: the legacy default stream).
 * Asynchronous: returns after launching; a's device buffers must stay valid until the stream
 * reaches this point. Returns 0, or QE_EINVAL / QE_EUNSUPPORTED (arguments), or QE_EBACKEND
 * (a CUDA error, with file and line in the detail). */
int kc_attn_decode(const kc_attn_args_t *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif
