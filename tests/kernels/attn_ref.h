/* attn_ref: test problems for decode attention over tiered paged KV (kernels/kern_paged.h) and
 * their CPU reference, shared by the GPU check/benchmark (attn_decode.cu) and the CPU emulation
 * of the CUDA kernel (attn_emu.cu).
 *
 * attn_prob_make builds, in host memory, one layer of a batch: windows in position order (an
 * optional partial FULL sink window first, then windows of omega tokens, the last one partial
 * when the sequence length says so), their tiers, a shuffled arena holding the FULL pages and the
 * QUANT ledgers, and the queries. With `realistic` the data are random normals and QUANT windows
 * are quantized by cache/kv_quant (keys pre-RoPE); without, the arena is left for the caller to
 * fill (benchmarks write random bf16 on the GPU: any bytes are valid codes and scales there).
 *
 * attn_ref_run is the reference: fp64 softmax attention of each query head over the live
 * tokens of its sequence, FULL pages read as bf16, QUANT windows dequantized with
 * kv_dequant_keys / kv_dequant_values and the keys rotated by the CPU backend's RoPE at
 * positions pos0 .. pos0 + n_tok - 1 (not with abs_keys: post-RoPE ledger keys); masses (1/n_head)
 * sum_h sum_{t in w} p_h(t). Single-threaded, not reentrant over one problem. */
#ifndef QE_ATTN_REF_H
#define QE_ATTN_REF_H

#include <stddef.h>
#include <stdint.h>

#include "kern.h"
#include "kern_paged.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  kern_paged_geom_t geom; /* n_kv, head_dim, omega, bits, group */
  int n_seq, n_head;
  int rope_mode, n_rot; /* RoPE of QUANT keys (theta 10000 or 500000, no scaling) */
  float rope_theta;
  int rope_yarn;      /* 1: YaRN (freq_scale 1/4, ext_factor 1, original context 4096) */
  int abs_keys;       /* 1: QUANT keys are post-RoPE (KV_KEY_FRAME_ABS): the reference does not
                         rotate them (kc_attn_args_t.abs_keys) */
  const int *seq_len; /* [n_seq] tokens per sequence (>= 0) */
  int sink;           /* tokens of a partial FULL first window (0: none) */
  int n_local;        /* trailing windows kept FULL */
  double p_full;      /* tier mix of the other windows (p_full, p_quant, rest evicted) */
  double p_quant;
  int n_full, n_quant; /* >= 0: exact counts of the other windows instead (per sequence) */
  int realistic;       /* 1: fill the arena with random data (kv_quant for QUANT windows) */
  uint64_t seed;
} attn_spec_t;

typedef struct {
  kern_paged_geom_t geom;
  int n_seq, n_head;
  float scale;
  kern_rope_t rope;
  uint8_t *arena; /* [arena_bytes], 256-aligned */
  size_t arena_bytes;
  kern_pwin_t *win; /* [n_win] */
  int n_win, max_win, has_quant, abs_keys;
  int32_t *seq_win;  /* [n_seq + 1] */
  float *q;          /* [n_seq][n_head][head_dim] */
  size_t kv_bytes;   /* bytes the attention must read: FULL pages' rows + QUANT ledgers */
  size_t full_bytes; /* the same if every window were FULL (n_tok rows of K and V) */
  int n_full, n_quant, n_evicted;
} attn_prob_t;

/* Builds p from s. Returns 0, or -1 (bad spec or out of memory; p left empty). */
int attn_prob_make(const attn_spec_t *s, attn_prob_t *p);
void attn_prob_free(attn_prob_t *p); /* NULL-safe, idempotent */

/* Reference: out [n_seq][n_head][head_dim], mass [n_win]. Returns 0 or -1 (out of memory). */
int attn_ref_run(const attn_prob_t *p, double *out, double *mass);

/* Uniform 64-bit generator (splitmix64) and a standard normal from it. */
uint64_t attn_rng_next(uint64_t *s);
double attn_rng_normal(uint64_t *s);

#ifdef __cplusplus
}
#endif

#endif
