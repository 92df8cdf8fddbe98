/* kern_cuda_quant: the tiered cache's window migrations on the GPU, in batches.
 *   - kc_quant_windows (demotion): FULL bf16 K/V pages -> QUANT ledgers. Keys are converted to
 *     fp32, un-rotated (RoPE at -position, the CPU backend's formula) and quantized per channel,
 *     values per token over groups of `group` channels, exactly as cache/kv_quant.c does (the
 *     same fp32/fp64 operations in the same order, fp16 conversions bit-exact, no FMA
 *     contraction): on the same fp32 input the codes, scales and zeros are byte-identical.
 *   - kc_dequant_windows (promotion): ledgers -> FULL pages: c * s + z in fp32 (kv_dequant_*),
 *     keys re-rotated to their positions (RoPE at +position), rounded to bf16 (nearest even).
 * RoPE is the CPU's (kern_cpu_rope): interleaved pairs (NORM) or a half split over n_rot (NEOX),
 * channels >= n_rot untouched, cos/sin of the angle times mscale, a negative position rotating
 * backwards (cos, -sin). It is described by a kc_attn_rope_t (kc_attn_rope_init), so one device
 * table serves the decode attention and the migrations. cos/sin come from the device's sincosf,
 * which may differ from the host libm's by an ulp: with rotate = 1 a code may differ from the
 * CPU's where the un-rotated value sits within a few fp32 ulps of a rounding boundary. Note that
 * RoPE at -p is the exact inverse of RoPE at +p only when mscale == 1 (no YaRN magnitude scale):
 * otherwise each direction multiplies by mscale, as the CPU path does.
 *
 * Layouts are kern_paged.h's: FULL pages bf16 [omega][n_kv][head_dim] (keys post-RoPE; rows
 * >= n_tok are neither read nor written), ledgers as kc_quant_ledger_layout describes. Plain C
 * declarations (the stream is a void *, a cudaStream_t). Functions are reentrant; the launch
 * functions enqueue work on the stream and return 0, QE_EINVAL (arguments) or QE_EBACKEND (a CUDA
 * error, file and line in the qe_errf detail). */
#ifndef QE_KERN_CUDA_QUANT_H
#define QE_KERN_CUDA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kern_cuda_attn.h"
#include "kern_paged.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One window to migrate: its FULL pages and its ledger, every field a byte offset from the
 * call's arena (or a device address when the arena is NULL), each 16-byte aligned. The window
 * holds n_tok tokens (1 .. omega) at positions pos0 .. pos0 + n_tok - 1; its ledger is the one
 * of kv_quant_keys / kv_quant_values with omega = n_tok. 72 bytes. */
typedef struct {
  uint64_t k;       /* FULL K page: bf16 [omega][n_kv][head_dim], post-RoPE */
  uint64_t v;       /* FULL V page: bf16 [omega][n_kv][head_dim] */
  uint64_t k_codes; /* packed [n_tok][n_kv][head_dim], little end first */
  uint64_t k_scale; /* fp16 [n_kv][head_dim] */
  uint64_t k_zero;  /* fp16 [n_kv][head_dim] */
  uint64_t v_codes; /* packed [n_tok][n_kv][head_dim] */
  uint64_t v_scale; /* fp16 [n_tok][n_kv][head_dim / group] */
  uint64_t v_zero;  /* fp16 [n_tok][n_kv][head_dim / group] */
  int32_t pos0;     /* position of token 0 */
  int32_t n_tok;    /* 1 .. omega (not checked on the device: the cache owns the table); a job
                       with n_tok <= 0 is skipped (reads and writes nothing) */
} kc_quant_job_t;

/* A batch of migrations (one layer, or any windows sharing the geometry). The jobs of one call
 * must not write overlapping bytes, and no job may write what another reads. */
typedef struct {
  kern_paged_geom_t geom;     /* n_kv, head_dim, omega, bits, group */
  int rotate;                 /* 1: un-rotate keys before quantizing / re-rotate after; 0: keys
                                 are taken as they are (tests, or pages already pre-RoPE) */
  kc_attn_rope_t rope;        /* used when rotate (table: device [n_rot / 2][2]) */
  const void *arena;          /* device base of every job offset; NULL: offsets are addresses */
  const kc_quant_job_t *jobs; /* device [n_jobs] */
  int n_jobs;
  const int32_t *n_jobs_dev; /* optional device int: the jobs to do are the first
                                min(*n_jobs_dev, n_jobs), a count known only on the device
                                (the launch strides over them); NULL: all n_jobs */
  int post_rope;             /* 1: the ledgers hold post-RoPE keys (KV_KEY_FRAME_ABS): the
                                migrations move keys as they are whatever rotate says, and
                                kc_mean_keys un-rotates (with rotate) the dequantized keys of
                                QUANT windows as it does FULL ones */
} kc_quant_args_t;

/* One ledger's parts: byte offsets from the ledger's start (each 16-byte aligned, in the order
 * below, which is kern_paged.h's) and sizes (kern_paged_*_bytes: the sizes of kv_qsizes). */
typedef struct {
  size_t k_codes, k_scale, k_zero, v_codes, v_scale, v_zero; /* offsets */
  size_t codes_bytes;                                        /* each of k_codes, v_codes */
  size_t kmeta_bytes;                                        /* each of k_scale, k_zero */
  size_t vmeta_bytes;                                        /* each of v_scale, v_zero */
  size_t total; /* bytes of the ledger, a multiple of 16 */
} kc_quant_layout_t;

/* The layout of a ledger of n_tok tokens of geometry g (pass n_tok = g->omega to size a slot
 * that holds any window's ledger: a smaller window's parts fit at the same offsets). Host only,
 * thread-safe. Returns 0 and fills *out, or QE_EINVAL (geometry as kc_quant_check, n_tok outside
 * 1 .. omega). */
int kc_quant_ledger_layout(const kern_paged_geom_t *g, int n_tok, kc_quant_layout_t *out);

/* Checks a's geometry and RoPE (no device access): n_kv 1 .. 65535; omega 1 .. 1024; bits 2, 4
 * or 8; group dividing head_dim; head_dim * bits and group * bits multiples of 8 (whole bytes of
 * codes per head row and per value group); omega * n_kv * head_dim <= 2^24; with rotate, mode
 * NORM or NEOX, n_rot even in 2 .. head_dim and a table. Returns 0 or QE_EINVAL with a detail. */
int kc_quant_check(const kc_quant_args_t *a);

/* Enqueues the demotion of a->jobs on stream: reads each job's FULL pages (rows < n_tok),
 * writes its ledger (every byte of its six parts). Asynchronous: the device buffers must stay
 * valid until the stream passes this point. Returns 0, QE_EINVAL or QE_EBACKEND. */
int kc_quant_windows(const kc_quant_args_t *a, void *stream);

/* Enqueues the promotion of a->jobs on stream: reads each job's ledger, writes rows < n_tok of
 * its FULL K and V pages (other rows untouched). Same returns as kc_quant_windows. */
int kc_dequant_windows(const kc_quant_args_t *a, void *stream);

/* GraphKV's window vectors: the mean pre-RoPE key of windows, n_groups lists of them. Group g's
 * windows are win[g * stride + k] for k < n[g] (device [n_groups]); the result is out[(g * stride
 * + k) * n_kv * head_dim + e] (fp32). A FULL window's bf16 keys are un-rotated (RoPE at
 * -position, with a's RoPE when a->rotate) in fp32, a QUANT window's ledger is dequantized (c * s
 * + z; un-rotated too when a->post_rope and a->rotate); both summed in token order and divided by
 * n_tok, as cache/kv_tiered_route.c does on the CPU; an EVICTED or empty window gives zeros. a's
 * jobs are not used. Same returns as kc_quant_windows. */
int kc_mean_keys(const kc_quant_args_t *a, const kern_pwin_t *win, const int32_t *n, int n_groups,
                 int stride, float *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif
