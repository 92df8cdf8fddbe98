/* kern_cpu_internal: functions shared between the CPU backend's files. */
#ifndef QE_KERN_CPU_INTERNAL_H
#define QE_KERN_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kern.h"

/* Blocking thread pool: kern_cpu_pool_run calls fn(ctx, t) for t in [0, n_tasks) across the
 * pool's workers and the caller, and returns when all are done. Not reentrant. */
typedef struct kern_cpu_pool kern_cpu_pool_t;
typedef void (*kern_cpu_task_fn)(void *ctx, int task);
kern_cpu_pool_t *kern_cpu_pool_create(int n_threads); /* NULL on failure: runs serially */
void kern_cpu_pool_run(kern_cpu_pool_t *p, kern_cpu_task_fn fn, void *ctx, int n_tasks);
void kern_cpu_pool_destroy(kern_cpu_pool_t *p);

/* The CPU backend object. */
/* cos/sin of every (position, pair) for one RoPE configuration, built on first use. */
typedef struct {
  kern_rope_t key; /* the parameters the table was built for */
  int n_pos;       /* positions [0, n_pos) */
  float *cs;       /* [n_pos][n_rot/2][2] */
} kern_rope_table_t;

typedef struct {
  kern_backend_t base;
  kern_cpu_pool_t *pool;
  kern_rope_table_t rope;
} kern_cpu_t;

/* Rows at or below this go through the streaming kernels: each weight row is read once for
 * all m activations (decode batches), instead of BLAS packing the whole matrix per call. */
#define CPU_SKINNY_M 16

/* Packed weights (kern_cpu_packed.c, where the arithmetic is written out). */
/* A packed weight [rows][cols] (cols % 32 == 0) from codes [rows][cols] and the scales and
 * offsets [rows][cols / 32] of its blocks of 32: KERN_WEIGHT_PACKED4 when every code fits in 4
 * bits, else KERN_WEIGHT_PACKED. 0, QE_EINVAL or QE_ENOMEM. */
int kern_cpu_packed_upload(kern_weight_t *w, const int8_t *code, const float *scale,
                           const float *offset, int rows, int cols);
/* y (+)= x w^T (+ bias) with w a packed weight, as kern_ops_t.matmul. */
void kern_cpu_packed_matmul(kern_cpu_t *c, float *y, const float *x, const kern_weight_t *w,
                            const float *bias, int m, int acc);

void kern_cpu_softmax_row(float *x, int n);
void kern_cpu_rope(kern_backend_t *be, float *x, const int32_t *pos, int m, int n_heads,
                   int head_dim, const kern_rope_t *r);
void kern_cpu_attention(kern_backend_t *be, const kern_attn_seq_t *seqs, int n_seqs,
                        const kern_attn_shape_t *shape);
int kern_cpu_sample(kern_backend_t *be, const float *logits, int n, const kern_sampler_t *s,
                    uint64_t *rng, void *scratch);
int kern_cpu_argmax(kern_backend_t *be, const float *x, int m, int n, int32_t *ids);

#endif
