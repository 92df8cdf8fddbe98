/* kern_cuda_kv: the GPU side of the paged KV caches (cache/kv_gpu.c): writing new tokens' K/V
 * into bf16 FULL pages (kern_paged.h layout), scattering window descriptors into a device window
 * table, gathering a sequence's FULL windows back to fp32 rows (the prefill attention input),
 * gathering and scattering activation rows, and pinned host staging for asynchronous uploads.
 * Plain C declarations (the stream is a void *, a cudaStream_t). Every function enqueues work on
 * the stream and returns 0, QE_EINVAL (arguments), or QE_EBACKEND (a CUDA error, with file and
 * line in the qe_errf detail). Reentrant; buffers are device memory unless noted. */
#ifndef QE_KERN_CUDA_KV_H
#define QE_KERN_CUDA_KV_H

#include <stddef.h>
#include <stdint.h>

#include "kern_paged.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One descriptor write: table[index] = w. */
typedef struct {
  int64_t index;
  kern_pwin_t w;
} kc_kv_upd_t;

/* table[upd[i].index] = upd[i].w for i < n (upd: device [n]). */
int kc_kv_scatter(kern_pwin_t *table, const kc_kv_upd_t *upd, int n, void *stream);

/* Token i of n (K and V rows k[i], v[i] of `row` = n_kv * head_dim floats) is written, rounded to
 * bf16, into row pos % omega of window pos / omega of its slot, where pos = tok_pos[i] and the
 * slot's windows start at table[tok_slot[i] * slot_stride]; the window's n_tok becomes at least
 * pos % omega + 1. The windows must be FULL with their pages set (offsets from arena); a token
 * whose window is not FULL, or whose tok_slot is negative (an inactive row), is skipped. */
typedef struct {
  uint8_t *arena;
  kern_pwin_t *table;
  int64_t slot_stride; /* windows per slot in the table */
  int omega, row, n;
  const float *k, *v;      /* [n][row] */
  const int32_t *tok_slot; /* [n] */
  const int32_t *tok_pos;  /* [n] */
} kc_kv_store_t;
int kc_kv_store(const kc_kv_store_t *a, void *stream);

/* The first n_tok tokens of one sequence (windows win[0 ..], FULL, consecutive positions from 0)
 * as fp32 rows: k[t], v[t] [n_tok][row] from row t % omega of window t / omega. */
int kc_kv_gather(const uint8_t *arena, const kern_pwin_t *win, int omega, int row, int n_tok,
                 float *k, float *v, void *stream);

/* dst[i] = src[idx[i]] (scatter = 0) or dst[idx[i]] = src[i] (scatter = 1), rows of `row`
 * floats, i < n (idx: device [n]). */
int kc_kv_rows(float *dst, const float *src, const int32_t *idx, int n, int row, int scatter,
               void *stream);

/* Pinned host memory (cudaMallocHost) for asynchronous uploads; NULL on failure. */
void *kc_host_alloc(size_t bytes);
void kc_host_free(void *p); /* NULL-safe */
/* Asynchronous host -> device copy on stream (src should be pinned and must stay unchanged until
 * the stream passes the copy: see kc_stream_sync). */
int kc_upload_async(void *dst, const void *src, size_t bytes, void *stream);
/* Asynchronous memset of device memory on stream. */
int kc_memset_async(void *dst, int value, size_t bytes, void *stream);
/* Waits for every queued operation of stream. */
int kc_stream_sync(void *stream);

/* GPU time of a repeated piece of work (e.g. the routing launches of each step), from CUDA event
 * pairs recorded on its stream: begin / end never wait; kc_timer_ms waits for the pairs still
 * pending and returns the total in milliseconds over every pair so far. A full set of pairs
 * (64) is folded in (waiting for the oldest) before a new one starts. One stream and one
 * thread per timer. */
typedef struct kc_timer kc_timer_t;
int kc_timer_create(kc_timer_t **out); /* 0, QE_ENOMEM or QE_EBACKEND */
void kc_timer_destroy(kc_timer_t *t);  /* NULL-safe */
int kc_timer_begin(kc_timer_t *t, void *stream);
int kc_timer_end(kc_timer_t *t, void *stream);
/* Total milliseconds and the number of timed pieces; QE_EBACKEND on a CUDA error. */
int kc_timer_ms(kc_timer_t *t, double *ms, long *count);

#ifdef __cplusplus
}
#endif

#endif
