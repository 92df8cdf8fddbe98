/* kern_paged: the page layout contract between the KV cache (which decides what lives where) and
 * the decode-attention kernels (which read it). Plain C, no CUDA header: the cache fills these
 * structs on the host and copies them to the device; kernels/cuda reads them there.
 *
 * One (sequence, layer) on one worker is a table of WINDOWS in position order. A window holds
 * the K and V of up to omega consecutive tokens for all n_kv local KV heads, in one of three
 * tiers:
 *   FULL     bf16 K page [omega][n_kv][head_dim] (keys post-RoPE) and bf16 V page of the same
 *            shape; rows >= n_tok are never read. The sink (first n_sink tokens) and the local
 *            region are simply FULL windows (a sink window may be partial: n_tok < omega).
 *   QUANT    a ledger in cache/kv_quant.h's exact format (KIVI-style, `bits` 2/4/8, value group
 *            `group`), quantized over the window's n_tok tokens (kv_quant_keys/values with
 *            omega = n_tok):
 *              key codes    packed [n_tok][n_kv][head_dim], little end first
 *              key scales   fp16 [n_kv][head_dim]     (one per (head, channel))
 *              key zeros    fp16 [n_kv][head_dim]
 *              value codes  packed [n_tok][n_kv][head_dim]
 *              value scales fp16 [n_tok][n_kv][head_dim / group]
 *              value zeros  fp16 [n_tok][n_kv][head_dim / group]
 *            Keys are post-RoPE (kc_attn_args_t.abs_keys: the kernel dequantizes, c * s + z)
 *            or pre-RoPE (it dequantizes and re-applies RoPE with the positions pos0 ..
 *            pos0 + n_tok - 1): one frame per call, the cache's (cache/kv_quant.h).
 *   EVICTED  no bytes; skipped (its attention mass is 0).
 *
 * A batch of sequences (one layer) is described by device arrays:
 *   arena     the base of one device allocation (the KV pool); every offset below is in bytes
 *             from it (a NULL arena makes the offsets plain device addresses);
 *   win       kern_pwin_t [n_win]: the windows of all sequences, sequence b's at
 *             [seq_win[b], seq_win[b + 1]) in position order;
 *   seq_win   int32 [n_seq + 1], ascending, seq_win[0] = 0, seq_win[n_seq] = n_win.
 * Alignment: every offset (pages, codes, scales, zeros) starts on a 16-byte boundary; FULL pages
 * are allocated for omega rows even when n_tok < omega. The kernels trust these tables (no
 * bounds checks on the device): the cache owns their validity.
 *
 * Geometry limits of the CUDA kernel (kc_attn_decode checks them): head_dim 64 or 128;
 * omega 4 (with QUANT keys post-RoPE only), 8 or a multiple of 16 (<= 1024); n_head / n_kv <= 8;
 * for QUANT windows group a multiple of 8 dividing head_dim and at most head_dim / 2, and NEOX
 * RoPE only with n_rot == head_dim. */
#ifndef QE_KERN_PAGED_H
#define QE_KERN_PAGED_H

#include <stddef.h>
#include <stdint.h>

/* Tier of one window (kern_pwin_t.tier). */
enum { KERN_PW_EVICTED = 0, KERN_PW_FULL = 1, KERN_PW_QUANT = 2 };

/* One window's descriptor: 64 bytes, read by every KV-head block of the window. */
typedef struct {
  uint64_t k;       /* FULL: K page; QUANT: key codes */
  uint64_t v;       /* FULL: V page; QUANT: value codes */
  uint64_t k_scale; /* QUANT: fp16 [n_kv][head_dim]; FULL: unused (0) */
  uint64_t k_zero;  /* QUANT: fp16 [n_kv][head_dim] */
  uint64_t v_scale; /* QUANT: fp16 [n_tok][n_kv][head_dim / group] */
  uint64_t v_zero;  /* QUANT: fp16 [n_tok][n_kv][head_dim / group] */
  int32_t pos0;     /* position of the window's token 0 (QUANT: its RoPE angles) */
  int32_t n_tok;    /* tokens present, 1 .. omega (a window with n_tok <= 0 counts as evicted) */
  int32_t tier;     /* KERN_PW_* */
  int32_t reserved; /* 0 */
} kern_pwin_t;

/* Geometry shared by every window of a batch (one layer on one worker). */
typedef struct {
  int n_kv;     /* KV heads in the pages (local to this rank) */
  int head_dim; /* channels per head */
  int omega;    /* tokens per window (page rows) */
  int bits;     /* QUANT ledger code width: 2, 4 or 8 */
  int group;    /* QUANT value group g (channels per value scale) */
} kern_paged_geom_t;

/* Bytes of one FULL window's K page (the V page has the same size). */
static inline size_t kern_paged_full_bytes(const kern_paged_geom_t *g) {
  return (size_t)g->omega * (size_t)g->n_kv * (size_t)g->head_dim * 2;
}

/* Bytes of a QUANT window's ledger parts for n_tok tokens (kv_qsizes with omega = n_tok). */
static inline size_t kern_paged_codes_bytes(const kern_paged_geom_t *g, int n_tok) {
  return ((size_t)n_tok * (size_t)g->n_kv * (size_t)g->head_dim * (size_t)g->bits + 7) / 8;
}
static inline size_t kern_paged_kmeta_bytes(const kern_paged_geom_t *g) { /* scales or zeros */
  return (size_t)g->n_kv * (size_t)g->head_dim * 2;
}
static inline size_t kern_paged_vmeta_bytes(const kern_paged_geom_t *g, int n_tok) {
  return (size_t)n_tok * (size_t)g->n_kv * (size_t)(g->head_dim / g->group) * 2;
}

/* 1 when the window is attended (FULL or QUANT with at least one token). */
static inline int kern_pwin_live(const kern_pwin_t *w) {
  return w->n_tok > 0 && (w->tier == KERN_PW_FULL || w->tier == KERN_PW_QUANT);
}

#endif
