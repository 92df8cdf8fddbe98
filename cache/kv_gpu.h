/* kv_gpu: FullKV on the GPU in bf16 pages (kernels/kern_paged.h): every token's K and V, in
 * windows of omega tokens, decoded by the fused paged kernel (kern_cuda_attn.h) and prefilled
 * through the backend's attention over the gathered pages. Pages come from one device arena;
 * a slot's pages are taken at seq_open for its whole capacity (QE_ENOSPC when the arena cannot
 * hold them) and their descriptors written then, so a decode step uploads only its per-token
 * slots and positions. Needs the CUDA backend (kern_cuda.h); built in CUDA builds only
 * (users get QE_HAVE_KV_GPU). Not thread-safe: one engine thread drives a cache. */
#ifndef QE_KV_GPU_H
#define QE_KV_GPU_H

#include <stddef.h>

#include "kv_cache.h"

/* Default tokens per page. */
#define KV_GPU_OMEGA 16

/* Bytes of one window's K and V pages (one layer). */
size_t kv_gpu_page_bytes(const kv_geom_t *geom, int omega);
/* Arena bytes that hold n_seqs slots of `capacity` tokens (all layers). */
size_t kv_gpu_pool_bytes(const kv_geom_t *geom, int omega, int n_seqs, int capacity);

/* Creates the cache on be (a CUDA backend: QE_EINVAL otherwise) with an arena of pool_bytes and
 * slots of up to max_tokens tokens. omega: 8 or a multiple of 16 (kern_paged.h); head_dim 64 or
 * 128 and n_head / n_kv_head <= 8 (the decode kernel's limits: QE_EUNSUPPORTED naming them).
 * *out owned by caller: kv_cache_destroy(). */
int kv_gpu_create(kern_backend_t *be, const kv_geom_t *geom, int omega, int max_tokens,
                  size_t pool_bytes, kv_cache_t **out);

#endif
