/* kern_cpu_internal: functions shared between the CPU backend's files. */
#ifndef QE_KERN_CPU_INTERNAL_H
#define QE_KERN_CPU_INTERNAL_H

#include "kern.h"

void kern_cpu_softmax_row(float *x, int n);
void kern_cpu_rope(kern_backend_t *be, float *x, const int32_t *pos, int m, int n_heads,
                   int head_dim, const kern_rope_t *r);
void kern_cpu_attention(kern_backend_t *be, const kern_attn_seq_t *seqs, int n_seqs,
                        const kern_attn_shape_t *shape);
int kern_cpu_sample(kern_backend_t *be, const float *logits, int n, const kern_sampler_t *s,
                    uint64_t *rng, void *scratch);

#endif
