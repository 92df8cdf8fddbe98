/* model_rig: shared test scaffolding: a loaded model with a FullKV cache, a whole-prompt
 * prefill returning logits at every position, and the same prefill on forked tensor-parallel
 * ranks (CPU collective backend) compared against a reference. */
#ifndef QE_MODEL_RIG_H
#define QE_MODEL_RIG_H

#include "model_gen.h"

typedef struct {
  kern_backend_t *be;
  model_t *m;
  kv_cache_t *kv;
  tp_comm_t *c;
} rig_t;

/* Loads path as rank/size with max_batch tokens per forward and a 4-slot FullKV cache. */
int rig_open(rig_t *r, const char *path, int rank, int size, tp_comm_t *c, int max_batch);
/* The same with the CPU backend's weights (kern_cpu_create_ex: KERN_WEIGHT_F32 or _PACKED). */
int rig_open_ex(rig_t *r, const char *path, int rank, int size, tp_comm_t *c, int max_batch,
                int weights);
void rig_close(rig_t *r);
/* Prefill of tokens[0..n) in slot 0 with logits at every position: out [n][V] (rank 0). */
int run_prefill(rig_t *r, const int32_t *tokens, int n, float *out);
/* The same prefill on `size` forked ranks; returns rank 0's max relative error against
 * ref [n][V] (INFINITY if a rank failed). */
double tp_prefill_err(const char *path, int size, const int32_t *tokens, int n, const float *ref,
                      int V);
/* The same with the ranks' CPU weights (rig_open_ex). */
double tp_prefill_err_ex(const char *path, int size, const int32_t *tokens, int n, const float *ref,
                         int V, int weights);

#endif
