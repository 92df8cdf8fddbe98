/* kern_cuda: the CUDA backend behind the kern.h function table (one GPU, one CUDA stream).
 * Plain C declarations: no CUDA type appears here, so C code includes it freely (built only
 * when meson finds nvcc; users see QE_HAVE_CUDA defined).
 *
 * Memory and precision:
 * - Backend buffers are device memory (host_memory = 0): kern_alloc is cudaMalloc, upload /
 *   download / copy are cudaMemcpy on the backend's stream (download waits for it).
 * - Activations are fp32. Weights are held once, in bf16: weight_upload allocates the bf16
 *   matrix and converts the host fp32 rows into it on the device, through an fp32 staging
 *   buffer of at most 64 MiB that is freed before it returns. A plain fp32 weight (dtype
 *   KERN_WEIGHT_F32, e.g. a kern_alloc'd buffer) is still accepted by matmul, rounded to bf16
 *   into a scratch buffer on every call (tests; nothing is cached). GEMMs run through
 *   cuBLASLt (cuBLAS GemmEx when cuBLASLt offers no algorithm) on bf16 operands with fp32
 *   accumulation and fp32 output: the activations are rounded to bf16 on the way in, once for
 *   consecutive matmuls over the same x (q, k, v; gate, up): a matmul reuses the previous
 *   call's bf16 copy when x and its size match and no other backend op ran in between (work
 *   outside the backend that rewrites x between two matmuls must call any op, e.g. a 0-byte
 *   copy, in between). embed
 *   reads an fp32 table (kern.h), so a model keeps token_embd in fp32 beside a bf16 output
 *   weight.
 * - The buffers inside kern_attn_seq_t (q, k, v, out, key_mass, k_pos) and the positions of
 *   rope and the ids of embed are device memory; kern_rope_t.factors and the logits of
 *   sample are host memory (as kern.h says). sample runs the CPU sampler on the host: the
 *   same token as the CPU backend for the same logits and rng state.
 * Errors: every CUDA / cuBLAS call and every launch is checked with file and line. The table's
 * void ops cannot return an error: the first failure is kept (sticky) and returned, as
 * QE_EBACKEND with a qe_errf detail, by the next upload, download or copy; later ops are
 * skipped. A backend is used by one thread at a time (any thread: each call selects the
 * backend's device). */
#ifndef QE_KERN_CUDA_H
#define QE_KERN_CUDA_H

#include "kern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices visible to this process; 0 when there is none or no driver. */
int kern_cuda_device_count(void);

/* Creates the backend on GPU `device` (its own non-blocking stream, cuBLASLt and cuBLAS
 * handles, a 32 MiB GEMM workspace). *out owned by caller: kern_destroy(). Returns 0, or
 * QE_EINVAL for a device out of range, or QE_EBACKEND with a detail. The environment variable
 * QE_CUDA_GEMM=gemmex at creation makes every GEMM take the cuBLAS GemmEx path (tests). */
int kern_cuda_create(int device, kern_backend_t **out);

/* The backend's cudaStream_t (as void *), for work that must be ordered with its ops (an NCCL
 * communicator's collectives, see tp_comm_nccl_set_stream). Borrowed: valid until destroy. */
void *kern_cuda_stream(kern_backend_t *be);
/* Free and total memory of the backend's device (cudaMemGetInfo). 0 or QE_EBACKEND. */
int kern_cuda_mem_info(kern_backend_t *be, size_t *free_bytes, size_t *total_bytes);
/* The backend's CUDA device ordinal. */
int kern_cuda_device(const kern_backend_t *be);
/* Waits for the backend's stream, then starts (on 1) or stops (0) the CUDA profiler's range
 * (cudaProfilerStart/Stop: what `ncu --profile-from-start off` profiles). 0 or QE_EBACKEND. */
int kern_cuda_profile(kern_backend_t *be, int on);

#ifdef __cplusplus
}
#endif

#endif
