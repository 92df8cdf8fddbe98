/* graphkv: GraphKV re-scoring (seed 002) for any scorer-based eviction policy.
 * Given non-negative scores s_j over n candidates and their key vectors (for windows: the
 * mean pre-RoPE key over the window, concatenated over the worker's KV heads of the layer):
 * sources = the top k candidates by score (k = ceil(source_frac * n_slots), at least 1, at
 * most n); for each source i, its neighbours N(i) = its top m other candidates by cosine
 * similarity e_ij; then s_j <- s_j * prod over sources i with j in N(i) of (1 - max(e_ij, 0)),
 * repeated for `rounds` rounds with the same sources, neighbours and edges (the multi-source
 * product of the paper's Eq. 5; similarity clipped at 0 so scores only decay).
 * Pure function over caller buffers: thread-safe. */
#ifndef QE_GRAPHKV_H
#define QE_GRAPHKV_H

#include <stddef.h>

typedef struct {
  float source_frac; /* default 0.3 */
  int m;             /* neighbours per source; default: min(c, n - 1) with c = 8 */
  int rounds;        /* default 1 */
} graphkv_params_t;

/* The most rounds graphkv_check takes: a round multiplies every score by the same decay again,
 * so more rounds only push the neighbours' scores further toward 0, and each costs a pass. */
#define GRAPHKV_MAX_ROUNDS 64

/* Default parameters (source_frac 0.3, m = 8, rounds 1). */
graphkv_params_t graphkv_defaults(void);
/* QE_EINVAL with a detail naming the field for source_frac outside (0, 1], m < 1, rounds outside
 * 1..GRAPHKV_MAX_ROUNDS. */
int graphkv_check(const graphkv_params_t *p);

/* Number of sources k for n candidates and n_slots kept: ceil(source_frac * n_slots), clamped
 * to [1, n] (0 when n <= 0); the product is taken with a 2^-22 relative slack so that a float
 * fraction such as 0.3f gives ceil(0.3 * n_slots). p must be valid (graphkv_check). */
int graphkv_n_sources(const graphkv_params_t *p, int n, int n_slots);

/* Workspace bytes graphkv_rescore needs for n candidates of dimension dim. */
size_t graphkv_workspace(int n, int dim);

/* Re-scores scores[n] in place. keys [n][dim]; n_slots = how many candidates the caller will
 * keep (sets the number of sources). ws: graphkv_workspace(n, dim) bytes. Returns 0 or
 * QE_EINVAL. A zero key vector has similarity 0 with everything. */
int graphkv_rescore(float *scores, const float *keys, int n, int dim, int n_slots,
                    const graphkv_params_t *p, void *ws);

#endif
