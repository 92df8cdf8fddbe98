/* kern_cpu_internal: functions shared between the CPU backend's files. */
#ifndef QE_KERN_CPU_INTERNAL_H
#define QE_KERN_CPU_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#if defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
#endif

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
/* y[m][w.cols] = rows ids of the packed weight w, each value fma(code, scale, offset) (the
 * values its matmul uses). */
void kern_cpu_packed_rows(const kern_weight_t *w, const int32_t *ids, int m, float *y);
void kern_cpu_packed_matmul(kern_cpu_t *c, float *y, const float *x, const kern_weight_t *w,
                            const float *bias, int m, int acc);

/* The attention's arithmetic, shared by its two paths (kern_cpu_attn.c, kern_cpu_attn_split.c),
 * which must give the same bits. */
typedef float attn_v8 __attribute__((vector_size(32), aligned(4)));

/* a + x y lane by lane, rounded once (fmaf's result): the attention's one multiply-add. By the
 * instruction where the target has it (-march=native or x86-64-v3 builds), else by fmaf. */
static inline __attribute__((always_inline)) attn_v8 kern_cpu_fma8(attn_v8 x, attn_v8 y,
                                                                   attn_v8 a) {
#if defined(__FMA__) && defined(__AVX__)
  return (attn_v8)_mm256_fmadd_ps((__m256)x, (__m256)y, (__m256)a);
#else
  for (int l = 0; l < 8; l++) a[l] = fmaf(x[l], y[l], a[l]);
  return a;
#endif
}

/* The dot product of attn_dot for a given n: inlined where n is a constant, so the common head
 * sizes get unrolled loops (the same operations in the same order: the same bits). */
static inline __attribute__((always_inline)) float kern_cpu_attn_dot_n(const float *a,
                                                                       const float *b, int n) {
  int d = 0;
  float s = 0;
  if (n % 8 == 0) {
    attn_v8 acc = {0};
    for (; d < n; d += 8)
      acc = kern_cpu_fma8(*(const attn_v8 *)(a + d), *(const attn_v8 *)(b + d), acc);
    s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
  for (; d < n; d++) s = fmaf(a[d], b[d], s);
  return s;
}

static inline float kern_cpu_attn_dot(const float *a, const float *b, int n) {
  if (n == 64) return kern_cpu_attn_dot_n(a, b, 64);
  if (n == 128) return kern_cpu_attn_dot_n(a, b, 128);
  return kern_cpu_attn_dot_n(a, b, n);
}

static inline __attribute__((always_inline)) void kern_cpu_attn_axpy_n(float *y, float a,
                                                                       const float *x, int n) {
  for (int d = 0; d < n; d++) y[d] = fmaf(a, x[d], y[d]);
}

/* y += a x, unrolled for the common head sizes as kern_cpu_attn_dot. */
static inline void kern_cpu_attn_axpy(float *y, float a, const float *x, int n) {
  if (n == 64)
    kern_cpu_attn_axpy_n(y, a, x, 64);
  else if (n == 128)
    kern_cpu_attn_axpy_n(y, a, x, 128);
  else
    kern_cpu_attn_axpy_n(y, a, x, n);
}

/* out[i] = scale * kern_cpu_attn_dot(q, rows + i * stride, n) for i < m, eight rows at a time
 * (their lanes summed together by shuffles, each in its own fixed pairing), then four, then one:
 * the same bits. */
void kern_cpu_attn_dots(const float *q, const float *rows, size_t stride, int m, int n, float scale,
                        float *out);
/* y += p[i] * rows_i for i = 0 .. m - 1 in that order (kern_cpu_attn_axpy m times: the same
 * bits), y held in registers across the rows for the common head sizes. */
void kern_cpu_attn_axpys(float *y, const float *p, const float *rows, size_t stride, int m, int n);
/* e^x as the softmax computes it, in single precision without contraction: 0 below -87 (and
 * for -inf), y = x clamped to [-87, 88], n = rint(y log2(e)) (by adding and taking away 1.5 x
 * 2^23), r = (y - 0.693359375 n) + 2.12194440e-4 n, e^r by Cephes' degree-7 polynomial
 * 1 + r + r^2 (5.0000001201e-1 + r (1.6666665459e-1 + r (4.1665795894e-2 + r (8.3334519073e-3
 * + r (1.3981999507e-3 + r 1.9875691500e-4))))) evaluated as written, times 2^n from the
 * exponent bits; NaN gives NaN. Within ~2 ulp of e^x. SwiGLU takes it too: y = g / (1 +
 * kern_cpu_exp1(-g)) * u (so g below -88 gives about 6e-39 g u, not -0, and g = -inf gives
 * -inf u, not NaN: e^-g is clamped at e^88). */
float kern_cpu_exp1(float x);
/* The softmax of x[0..n) in place: m = the maximum (m = x > m ? x : m, so NaNs are passed over),
 * each x replaced by kern_cpu_exp1(x - m), the exponentials summed in eight lanes (lane j % 8,
 * in order) and the lanes as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), each x divided by that
 * sum. The same bits for a value wherever it sits in the row. */
void kern_cpu_softmax_row(float *x, int n);
/* Keys of sq visible to a query at position qp. */
int kern_cpu_visible_keys(const kern_attn_seq_t *sq, int qp);
/* Whether kern_cpu_attn_split runs the call: every sequence one query, its keys from a source. */
int kern_cpu_attn_split_takes(const kern_attn_seq_t *seqs, int n_seqs);
/* The call in three passes over the pool (kern_cpu_attn_split.c); the key masses go to each
 * sequence's rows [n_head][n_kv] of mass at mass_off[seq], as kern_cpu_attention's. */
void kern_cpu_attn_split(kern_cpu_t *c, const kern_attn_seq_t *seqs, int n_seqs,
                         const kern_attn_shape_t *sh, float *mass, const size_t *mass_off);
void kern_cpu_rope(kern_backend_t *be, float *x, const int32_t *pos, int m, int n_heads,
                   int head_dim, const kern_rope_t *r);
void kern_cpu_attention(kern_backend_t *be, const kern_attn_seq_t *seqs, int n_seqs,
                        const kern_attn_shape_t *shape);
int kern_cpu_sample(kern_backend_t *be, const float *logits, int n, const kern_sampler_t *s,
                    uint64_t *rng, void *scratch);
int kern_cpu_argmax(kern_backend_t *be, const float *x, int m, int n, int32_t *ids);

#endif
