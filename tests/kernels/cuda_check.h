/* cuda_check: the GPU tests' CUDA error check. CK(call) prints the call, its file and line and
 * CUDA's message, and exits 1, unless call returns cudaSuccess. */
#ifndef QE_TESTS_CUDA_CHECK_H
#define QE_TESTS_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));       \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#endif
