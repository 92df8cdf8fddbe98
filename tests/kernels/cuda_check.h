/* cuda_check: the GPU tests' CUDA error check, and the benches' L2 flush (l2_flush). CK(call)
 * prints the call, its file and line and CUDA's message, and exits 1, unless call returns
 * cudaSuccess. */
#ifndef QE_TESTS_CUDA_CHECK_H
#define QE_TESTS_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));       \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* ATTN_FLUSH=1: before each queued launch, 4x the L2's bytes are written (untimed), so the
 * launch reads its inputs from DRAM as a decode step does (the other layers' KV and weights pass
 * through L2 between two reads of a layer's KV); without it a launch may hit the previous one's
 * last lines, as torch's timing of the peers does (bench/sdpa_queued.py --flush to match). */
static inline void l2_flush(void) {
  static uint8_t *buf = nullptr;
  static size_t n = 0;
  static const int on = getenv("ATTN_FLUSH") && !strcmp(getenv("ATTN_FLUSH"), "1");
  if (!on) return;
  if (!buf) {
    int dev = 0, l2 = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    n = 4 * (size_t)l2;
    CK(cudaMalloc((void **)&buf, n));
  }
  CK(cudaMemsetAsync(buf, 0, n));
}

#endif
