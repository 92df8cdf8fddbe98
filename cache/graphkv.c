/* graphkv: GraphKV re-scoring (seed 002; arXiv:2509.00388, Eq. 5) over caller buffers.
 * Reading of the paper: sources are picked once from the initial scores; every source i
 * discounts its m most similar other candidates j by (1 - max(e_ij, 0)); a candidate near
 * several sources takes the product of their discounts (Eq. 5, not Algorithm 2's overwrite);
 * sources are ordinary candidates, so a source that is a neighbour of another source decays
 * too (summary 2.3: "源节点也可能成为其他源节点的邻居"), while a source never discounts
 * itself. With fixed sources, neighbours and edges, T rounds give s_j * c_j^T (summary 2.5).
 *
 * Arithmetic (fixed, so a brute-force reference can reproduce it bit for bit): norms and dot
 * products are accumulated in double in dimension order; e_ij = dot / (|k_i| |k_j|) clamped
 * to [-1, 1] and rounded to float (0 if either norm is 0 or the result is not finite);
 * c_j = 1.0f, then c_j *= (1.0f - max(e_ij, 0.0f)) over the sources in rank order (score
 * descending, lower index first); each round does s_j *= c_j.
 *
 * Cost: O(n dim) norms + O(k n dim) similarities (sources against all candidates only; 16
 * sources per pass over the keys, two keys at a time) + O(n log k) source selection +
 * O(k n log m) neighbour selection with bounded heaps (no sort) + O(T n) updates.
 * Memory: the caller's workspace only (no allocation). */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "graphkv.h"
#include "qe_status.h"

enum { GK_BLOCK = 16 }; /* sources whose similarities are computed in one pass over the keys */

typedef struct {
  double *norm;  /* [n] L2 norm of each key */
  double *src_t; /* [dim][GK_BLOCK] keys of the current source block, transposed */
  float *sim;    /* [GK_BLOCK][n] e_ij of each block source with every candidate */
  float *decay;  /* [n] c_j: product of the discounts j receives in one round */
  int *src;      /* [n] sources, best first (first k used) */
  int *heap;     /* [n] top-m selection heap */
} gk_ws_t;

graphkv_params_t graphkv_defaults(void) {
  graphkv_params_t p = {0.3f, 8, 1};
  return p;
}

int graphkv_check(const graphkv_params_t *p) {
  if (!p) return qe_errf(QE_EINVAL, "graphkv: params is NULL");
  if (!(p->source_frac > 0.0f && p->source_frac <= 1.0f))
    return qe_errf(QE_EINVAL, "graphkv: source_frac must be in (0, 1] (got %g)",
                   (double)p->source_frac);
  if (p->m < 1) return qe_errf(QE_EINVAL, "graphkv: m (neighbours) must be >= 1 (got %d)", p->m);
  if (p->rounds < 1 || p->rounds > GRAPHKV_MAX_ROUNDS)
    return qe_errf(QE_EINVAL, "graphkv: rounds must be in 1..%d (got %d)", GRAPHKV_MAX_ROUNDS,
                   p->rounds);
  return 0;
}

int graphkv_n_sources(const graphkv_params_t *p, int n, int n_slots) {
  if (n <= 0) return 0;
  /* Slack of 2^-22 relative: a float fraction such as 0.3f gives ceil(0.3 * n_slots). */
  double x = (double)p->source_frac * (n_slots > 0 ? n_slots : 0);
  double k = ceil(x - x * 0x1p-22);
  if (k < 1) return 1;
  return k > n ? n : (int)k;
}

static size_t gk_bytes(int n, int dim, gk_ws_t *w, char *base) {
  size_t nn = (size_t)n, off = 0;
  if (w) w->norm = (double *)(base + off);
  off += nn * sizeof(double);
  if (w) w->src_t = (double *)(base + off);
  off += (size_t)dim * GK_BLOCK * sizeof(double);
  if (w) w->sim = (float *)(base + off);
  off += nn * GK_BLOCK * sizeof(float);
  if (w) w->decay = (float *)(base + off);
  off += nn * sizeof(float);
  if (w) w->src = (int *)(base + off);
  off += nn * sizeof(int);
  if (w) w->heap = (int *)(base + off);
  return off + nn * sizeof(int);
}

size_t graphkv_workspace(int n, int dim) {
  if (n <= 0 || dim <= 0) return 0;
  return gk_bytes(n, dim, NULL, NULL) + sizeof(double); /* slack to align ws */
}

/* ---- top-k selection: bounded min-heap whose root is the worst index kept ---- */

/* Ranking: larger key first, lower index on ties (a strict total order for non-NaN keys). */
static int gk_better(const float *key, int a, int b) {
  return key[a] > key[b] || (key[a] == key[b] && a < b);
}

static void gk_sift_down(const float *key, int *h, int len, int i) {
  for (;;) {
    int w = i, l = 2 * i + 1, r = l + 1;
    if (l < len && gk_better(key, h[w], h[l])) w = l;
    if (r < len && gk_better(key, h[w], h[r])) w = r;
    if (w == i) return;
    int t = h[i];
    h[i] = h[w];
    h[w] = t;
    i = w;
  }
}

static void gk_sift_up(const float *key, int *h, int i) {
  while (i > 0) {
    int parent = (i - 1) / 2;
    if (!gk_better(key, h[parent], h[i])) return;
    int t = h[i];
    h[i] = h[parent];
    h[parent] = t;
    i = parent;
  }
}

/* Puts the best `cap` indices of [0, n) other than `skip` into h (heap order); returns how
 * many. O(n log cap). */
static int gk_top(const float *key, int n, int skip, int cap, int *h) {
  int len = 0;
  for (int j = 0; j < n; j++) {
    if (j == skip) continue;
    if (len < cap) {
      h[len] = j;
      gk_sift_up(key, h, len++);
    } else if (gk_better(key, j, h[0])) {
      h[0] = j;
      gk_sift_down(key, h, len, 0);
    }
  }
  return len;
}

/* Heap-sorts a gk_top heap into best-first order. */
static void gk_sort_best_first(const float *key, int *h, int len) {
  for (int end = len - 1; end > 0; end--) {
    int t = h[0];
    h[0] = h[end];
    h[end] = t;
    gk_sift_down(key, h, end, 0);
  }
}

/* ---- similarities ---- */

static void gk_norms(const float *keys, int n, int dim, double *norm) {
  for (int j = 0; j < n; j++) {
    const float *x = keys + (size_t)j * dim;
    double s = 0.0;
    for (int d = 0; d < dim; d++) s += (double)x[d] * x[d];
    norm[j] = sqrt(s);
  }
}

static float gk_cos(double dot, double ni, double nj) {
  if (ni == 0.0 || nj == 0.0) return 0.0f;
  double c = dot / (ni * nj);
  if (!isfinite(c)) return 0.0f;
  return (float)(c > 1.0 ? 1.0 : c < -1.0 ? -1.0 : c);
}

/* Loads the keys of sources src[0, nb) into src_t [dim][GK_BLOCK] (unused lanes zero). */
static void gk_load_block(const float *keys, int dim, const int *src, int nb, double *src_t) {
  for (int b = 0; b < GK_BLOCK; b++) {
    const float *x = b < nb ? keys + (size_t)src[b] * dim : NULL;
    for (int d = 0; d < dim; d++) src_t[(size_t)d * GK_BLOCK + b] = x ? x[d] : 0.0;
  }
}

/* acc[r][b] = <source b, row r> for rows r = 0, 1, each summed in dimension order (two rows
 * at a time: independent accumulation chains; vectorised across b). */
static void gk_dots2(const double *src_t, const float *row0, const float *row1, int dim,
                     double acc[2][GK_BLOCK]) {
  for (int b = 0; b < GK_BLOCK; b++) acc[0][b] = acc[1][b] = 0.0;
  for (int d = 0; d < dim; d++) {
    double x0 = row0[d], x1 = row1[d];
    const double *s = src_t + (size_t)d * GK_BLOCK;
    for (int b = 0; b < GK_BLOCK; b++) {
      acc[0][b] += s[b] * x0;
      acc[1][b] += s[b] * x1;
    }
  }
}

/* sim[b][j] = e_{src[b], j} for the nb sources of the block and every candidate j. */
static void gk_block_sims(const gk_ws_t *w, const float *keys, int n, int dim, const int *src,
                          int nb) {
  double acc[2][GK_BLOCK];
  gk_load_block(keys, dim, src, nb, w->src_t);
  for (int j = 0; j < n; j += 2) {
    int j1 = j + 1 < n ? j + 1 : j;
    gk_dots2(w->src_t, keys + (size_t)j * dim, keys + (size_t)j1 * dim, dim, acc);
    for (int r = 0; r < 2 && j + r < n; r++)
      for (int b = 0; b < nb; b++)
        w->sim[(size_t)b * n + j + r] = gk_cos(acc[r][b], w->norm[src[b]], w->norm[j + r]);
  }
}

/* ---- propagation ---- */

/* Multiplies the discounts of the block's sources, in rank order, into decay. */
static void gk_block_decay(const gk_ws_t *w, int n, const int *src, int nb, int m) {
  for (int b = 0; b < nb; b++) {
    const float *e = w->sim + (size_t)b * n;
    int cnt = gk_top(e, n, src[b], m, w->heap);
    for (int t = 0; t < cnt; t++) {
      int j = w->heap[t];
      w->decay[j] *= 1.0f - fmaxf(e[j], 0.0f);
    }
  }
}

static int gk_check_args(const float *scores, const float *keys, int n, int dim, int n_slots,
                         const graphkv_params_t *p, const void *ws) {
  int rc = graphkv_check(p);
  if (rc) return rc;
  if (n < 0) return qe_errf(QE_EINVAL, "graphkv: n must be >= 0 (got %d)", n);
  if (dim < 1) return qe_errf(QE_EINVAL, "graphkv: dim must be >= 1 (got %d)", dim);
  if (n_slots < 0) return qe_errf(QE_EINVAL, "graphkv: n_slots must be >= 0 (got %d)", n_slots);
  if (n == 0) return 0;
  if (!scores || !keys || !ws)
    return qe_errf(QE_EINVAL, "graphkv: NULL %s", !scores ? "scores" : !keys ? "keys" : "ws");
  for (int j = 0; j < n; j++)
    if (!(scores[j] >= 0.0f && scores[j] <= FLT_MAX))
      return qe_errf(QE_EINVAL, "graphkv: scores[%d] must be finite and >= 0 (got %g)", j,
                     (double)scores[j]);
  return 0;
}

int graphkv_rescore(float *scores, const float *keys, int n, int dim, int n_slots,
                    const graphkv_params_t *p, void *ws) {
  int rc = gk_check_args(scores, keys, n, dim, n_slots, p, ws);
  if (rc || n == 0) return rc;
  gk_ws_t w;
  uintptr_t base = ((uintptr_t)ws + sizeof(double) - 1) & ~(uintptr_t)(sizeof(double) - 1);
  gk_bytes(n, dim, &w, (char *)base);
  int k = gk_top(scores, n, -1, graphkv_n_sources(p, n, n_slots), w.src);
  gk_sort_best_first(scores, w.src, k);
  int m = p->m < n - 1 ? p->m : n - 1;
  for (int j = 0; j < n; j++) w.decay[j] = 1.0f;
  if (m > 0) {
    gk_norms(keys, n, dim, w.norm);
    for (int b0 = 0; b0 < k; b0 += GK_BLOCK) {
      int nb = k - b0 < GK_BLOCK ? k - b0 : GK_BLOCK;
      gk_block_sims(&w, keys, n, dim, w.src + b0, nb);
      gk_block_decay(&w, n, w.src + b0, nb, m);
    }
  }
  for (int r = 0; r < p->rounds; r++)
    for (int j = 0; j < n; j++) scores[j] *= w.decay[j];
  return 0;
}
