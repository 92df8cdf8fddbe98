/* kern_cuda_graphkv: GraphKV re-scoring on the GPU (see kern_cuda_graphkv.h). The CPU reference
 * is cache/graphkv.c's graphkv_rescore; tests/kernels/test_kv_gpu.c compares them bit for bit on
 * fresh random scores and keys. Explicit _rn intrinsics: no FMA contraction anywhere. */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "qe_status.h"
}
#include "kern_cuda_graphkv.h"
#include "kern_cuda_sort.cuh"

#define KG_NT    256
#define KG_WARPS (KG_NT / 32) /* sources whose neighbours are found at once, a warp each */
#define KG_FULL  0xffffffffu

static int kg_cuda_at(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return 0;
  return qe_errf(QE_EBACKEND, "cuda: %s: %s (%s:%d)", what, cudaGetErrorString(e), file, line);
}
#define KG_CUDA(call) kg_cuda_at((call), #call, __FILE__, __LINE__)

/* graphkv_n_sources: ceil(frac * n_slots) with a 2^-22 relative slack, clamped to [1, n]. */
__device__ int kg_n_sources(float frac, int n, int n_slots) {
  if (n <= 0) return 0;
  const double x = __dmul_rn((double)frac, (double)(n_slots > 0 ? n_slots : 0));
  const double k = ceil(__dsub_rn(x, __dmul_rn(x, 0x1p-22)));
  return k < 1.0 ? 1 : k > (double)n ? n : (int)k;
}

/* gk_cos: dot / (|i| |j|) clamped to [-1, 1], rounded to float; 0 for a zero norm or a
 * non-finite quotient. */
__device__ float kg_cos(double dot, double ni, double nj) {
  if (ni == 0.0 || nj == 0.0) return 0.0f;
  const double c = __ddiv_rn(dot, __dmul_rn(ni, nj));
  if (!isfinite(c)) return 0.0f;
  return __double2float_rn(c > 1.0 ? 1.0 : c < -1.0 ? -1.0 : c);
}

/* <x, y> in double, in dimension order (the products of floats are exact in double). */
__device__ double kg_dot(const float *x, const float *y, int dim) {
  double s = 0.0;
  for (int d = 0; d < dim; d++) s = __dadd_rn(s, __dmul_rn((double)x[d], (double)y[d]));
  return s;
}

/* One warp: the similarities of source `src` with every candidate into sim[n] (the source
 * itself -inf), then its m best other candidates (e desc, index asc) into lj/le, best first. */
__device__ void kg_neighbours(const kc_graphkv_args_t &a, const float *keys, const double *norm,
                              int src, int n, int m, float *sim, int *lj, float *le) {
  const int lane = threadIdx.x & 31;
  const float *xs = keys + (size_t)src * a.dim;
  for (int j = lane; j < n; j += 32)
    sim[j] = j == src ? -INFINITY
                      : kg_cos(kg_dot(xs, keys + (size_t)j * a.dim, a.dim), norm[src], norm[j]);
  __syncwarp();
  for (int t = 0; t < m; t++) {
    float be = -INFINITY;
    int bj = INT_MAX;
    for (int j = lane; j < n; j += 32)
      if (kc_before(sim[j], j, be, bj)) be = sim[j], bj = j;
    for (int o = 16; o; o >>= 1) {
      const float oe = __shfl_xor_sync(KG_FULL, be, o);
      const int oj = __shfl_xor_sync(KG_FULL, bj, o);
      if (kc_before(oe, oj, be, bj)) be = oe, bj = oj;
    }
    if (lane == 0) lj[t] = bj, le[t] = be, sim[bj] = -INFINITY;
    __syncwarp();
  }
}

/* Candidates' keys into key/idx for the source ranking, decays to 1, norms. */
__device__ void kg_prepare(const kc_graphkv_args_t &a, int n, int P, const float *sc,
                           const float *keys, float *key, int *idx, double *norm, float *decay) {
  for (int j = threadIdx.x; j < P; j += blockDim.x) {
    key[j] = j < n ? sc[j] : -INFINITY, idx[j] = j < n ? j : INT_MAX;
    if (j >= n) continue;
    const float *x = keys + (size_t)j * a.dim;
    decay[j] = 1.0f, norm[j] = sqrt(kg_dot(x, x, a.dim));
  }
  __syncthreads();
}

__global__ void kg_rescore_k(const kc_graphkv_args_t a, int P) {
  extern __shared__ __align__(16) uint8_t kg_sm[];
  float *key = (float *)kg_sm;
  int *idx = (int *)(key + P);
  __shared__ int lj[KG_WARPS][KC_GRAPHKV_MAX_M];
  __shared__ float le[KG_WARPS][KC_GRAPHKV_MAX_M];
  const int g = blockIdx.x, n = a.n[g], warp = threadIdx.x >> 5;
  if (n <= 0) return;
  const size_t base = (size_t)g * a.stride;
  float *sc = a.scores + base, *decay = a.decay + base;
  double *norm = a.norm + base;
  const float *keys = a.keys + base * a.dim;
  kg_prepare(a, n, P, sc, keys, key, idx, norm, decay);
  kc_sort_pairs(key, idx, P); /* idx[0 .. k): the sources, best first */
  const int k = kg_n_sources(a.source_frac, n, a.n_slots[g]), m = a.m < n - 1 ? a.m : n - 1;
  float *sim = a.sim + ((size_t)g * KG_WARPS + warp) * a.stride;
  for (int b0 = 0; m > 0 && b0 < k; b0 += KG_WARPS) {
    if (b0 + warp < k) kg_neighbours(a, keys, norm, idx[b0 + warp], n, m, sim, lj[warp], le[warp]);
    __syncthreads();
    for (int w = 0; threadIdx.x == 0 && w < KG_WARPS && b0 + w < k; w++) /* rank order */
      for (int t = 0; t < m; t++)
        decay[lj[w][t]] = __fmul_rn(decay[lj[w][t]], __fsub_rn(1.0f, fmaxf(le[w][t], 0.0f)));
    __syncthreads();
  }
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float s = sc[j];
    for (int r = 0; r < a.rounds; r++) s = __fmul_rn(s, decay[j]);
    sc[j] = s;
  }
}

extern "C" int kc_graphkv_check(const kc_graphkv_args_t *a) {
  if (!a) return qe_errf(QE_EINVAL, "kc_graphkv: no arguments");
  if (!(a->source_frac > 0.0f && a->source_frac <= 1.0f))
    return qe_errf(QE_EINVAL, "kc_graphkv: source_frac must be in (0, 1] (got %g)",
                   (double)a->source_frac);
  if (a->m < 1 || a->m > KC_GRAPHKV_MAX_M)
    return qe_errf(QE_EINVAL, "kc_graphkv: m (neighbours) must be in 1..%d on the GPU (got %d)",
                   KC_GRAPHKV_MAX_M, a->m);
  if (a->rounds < 1)
    return qe_errf(QE_EINVAL, "kc_graphkv: rounds must be >= 1 (got %d)", a->rounds);
  if (a->n_groups < 0 || a->n_groups > 65535)
    return qe_errf(QE_EINVAL, "kc_graphkv: n_groups must be in 0..65535 (got %d)", a->n_groups);
  if (a->stride < 1 || a->stride > KC_GRAPHKV_MAX_N)
    return qe_errf(QE_EINVAL, "kc_graphkv: stride must be in 1..%d (got %d)", KC_GRAPHKV_MAX_N,
                   a->stride);
  if (a->dim < 1) return qe_errf(QE_EINVAL, "kc_graphkv: dim must be >= 1 (got %d)", a->dim);
  if (a->n_groups &&
      (!a->n || !a->n_slots || !a->scores || !a->keys || !a->norm || !a->decay || !a->sim))
    return qe_errf(QE_EINVAL, "kc_graphkv: a device buffer is NULL");
  return 0;
}

extern "C" int kc_graphkv_rescore(const kc_graphkv_args_t *a, void *stream) {
  int rc = kc_graphkv_check(a);
  if (rc || !a->n_groups) return rc;
  int P = 1;
  while (P < a->stride) P <<= 1;
  const size_t smem = (size_t)P * (sizeof(float) + sizeof(int));
  if (smem > 48 * 1024 &&
      (rc = KG_CUDA(cudaFuncSetAttribute(kg_rescore_k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem))))
    return rc;
  kg_rescore_k<<<(unsigned)a->n_groups, KG_NT, smem, (cudaStream_t)stream>>>(*a, P);
  return KG_CUDA(cudaGetLastError());
}
