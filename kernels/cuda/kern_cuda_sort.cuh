/* kern_cuda_sort: a block-wide bitonic sort of (key, index) pairs in shared memory, by key
 * descending and index ascending on ties (a strict total order for non-NaN keys): the ranking
 * of GraphKV's sources (kern_cuda_graphkv) and of the routing decision past 8,192 candidates
 * (kern_cuda_route; below, a block radix sort). Device code only; every thread of the block must
 * call it. */
#ifndef QE_KERN_CUDA_SORT_CUH
#define QE_KERN_CUDA_SORT_CUH

/* (key desc, index asc): true when a sorts before b. */
__device__ __forceinline__ bool kc_before(float ka, int ia, float kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}

/* Sorts key[P], idx[P] (P a power of two) in place; ends with a __syncthreads. */
__device__ __forceinline__ void kc_sort_pairs(float *key, int *idx, int P) {
  for (int k = 2; k <= P; k <<= 1)
    for (int jj = k >> 1; jj > 0; jj >>= 1) {
      for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int l = i ^ jj;
        if (l <= i) continue;
        const bool up = (i & k) == 0; /* this pair's run sorts "before" first */
        const bool sw = up ? kc_before(key[l], idx[l], key[i], idx[i])
                           : kc_before(key[i], idx[i], key[l], idx[l]);
        if (sw) {
          const float tk = key[i];
          const int ti = idx[i];
          key[i] = key[l], idx[i] = idx[l], key[l] = tk, idx[l] = ti;
        }
      }
      __syncthreads();
    }
}

#endif
