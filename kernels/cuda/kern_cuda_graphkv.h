/* kern_cuda_graphkv: GraphKV re-scoring (cache/graphkv.h) on the GPU, for the tiered GPU cache's
 * routing: many independent problems ("groups", one (slot, layer) each) in one launch, one
 * block per group. The result is bit-identical to graphkv_rescore on the same scores and keys:
 * the same source ranking (score descending, lower index first), norms and dot products
 * accumulated in double in dimension order (products of two floats are exact in double, so the
 * sums round alike), e_ij clamped and rounded to float as gk_cos does, each source's m most
 * similar other candidates (ties: lower index first) discounted in source rank order, and the
 * rounds as repeated float products.
 * Cost per group: O(n dim) norms, O(k n dim) similarities (eight sources at a time, one warp
 * each), O(k m n / 32) neighbour selection, O(k m) serial discounts. Plain C declarations (the
 * stream is a void *, a cudaStream_t). */
#ifndef QE_KERN_CUDA_GRAPHKV_H
#define QE_KERN_CUDA_GRAPHKV_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Neighbours per source the GPU takes (graphkv_params_t.m); the CPU takes any. */
#define KC_GRAPHKV_MAX_M 32
/* Candidates per group (the stride) the GPU takes. */
#define KC_GRAPHKV_MAX_N 16384

typedef struct {
  float source_frac;      /* graphkv_params_t's: (0, 1] */
  int m;                  /* 1 .. KC_GRAPHKV_MAX_M */
  int rounds;             /* >= 1 */
  int n_groups;           /* problems, one block each (<= 65535) */
  int stride;             /* entries from one group's candidates to the next's (1 .. MAX_N) */
  int dim;                /* key length (>= 1) */
  const int32_t *n;       /* device [n_groups]: candidates of the group (0 .. stride) */
  const int32_t *n_slots; /* device [n_groups]: slots the caller will keep (sets k) */
  float *scores;          /* device [n_groups * stride]: finite, >= 0; re-scored in place */
  const float *keys;      /* device [n_groups * stride][dim] */
  double *norm;           /* device scratch [n_groups * stride] */
  float *decay;           /* device scratch [n_groups * stride] */
  float *sim;             /* device scratch [n_groups * 8 * stride] */
} kc_graphkv_args_t;

/* Checks a's scalars (no device access): QE_EINVAL naming the field, or 0. */
int kc_graphkv_check(const kc_graphkv_args_t *a);

/* Enqueues the re-scoring of every group on stream. Returns 0, QE_EINVAL or QE_EBACKEND. */
int kc_graphkv_rescore(const kc_graphkv_args_t *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif
