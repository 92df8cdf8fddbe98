/* test_kv_full: the FullKV cache: attention through the cache equals the backend's attention
 * over the same keys, byte accounting, and bad slots / capacity overflow are errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_cache.h"
#include "qe_status.h"
#include "test_util.h"

int main(void) {
  kern_backend_t *be = NULL;
  kv_cache_t *kv = NULL;
  CHECK_OK(kern_cpu_create(1, &be));
  kv_geom_t g = {2, 4, 2, 8, 3};
  CHECK_OK(kv_full_create(be, &g, &kv));
  kv_geom_t bad = {2, 3, 2, 8, 3};
  kv_cache_t *kv2 = NULL;
  CHECK(kv_full_create(be, &bad, &kv2) == QE_EINVAL);
  CHECK(kv->ops->seq_open(kv, 3, 10) == QE_EINVAL);
  CHECK(kv->ops->seq_open(kv, 0, 0) == QE_EINVAL);
  CHECK_OK(kv->ops->seq_open(kv, 1, 10));
  uint64_t s = 5;
  int n = 6, row = 2 * 8;
  float k[6 * 16], v[6 * 16], q[6 * 32], out[6 * 32], ref[6 * 32];
  for (int i = 0; i < n * row; i++) k[i] = tu_randf(&s, -1, 1), v[i] = tu_randf(&s, -1, 1);
  for (int i = 0; i < n * 32; i++) q[i] = tu_randf(&s, -1, 1);
  CHECK_OK(kv->ops->store(kv, 1, 1, 0, 4, k, v));
  CHECK_OK(kv->ops->store(kv, 1, 1, 4, 2, k + 4 * row, v + 4 * row));
  CHECK(kv->ops->store(kv, 1, 1, 9, 2, k, v) == QE_ERANGE);
  kv_attn_req_t req = {1, 0, n, q, out};
  CHECK_OK(kv->ops->attend(kv, 1, &req, 1));
  kern_attn_seq_t sq = {.q = q, .k = k, .v = v, .out = ref, .n_q = n, .n_kv = n};
  kern_attn_shape_t sh = {4, 2, 8, 1.0f / sqrtf(8.0f)};
  be->ops->attention(be, &sq, 1, &sh);
  CHECK(!memcmp(out, ref, sizeof out));
  CHECK(kv->ops->seq_bytes(kv, 1) == 2 * sizeof(float) * row * 6 * 2);
  kv_attn_req_t past = {1, 5, 3, q, out};
  CHECK(kv->ops->attend(kv, 0, &past, 1) == QE_ERANGE);
  kv->ops->seq_close(kv, 1);
  CHECK(kv->ops->seq_bytes(kv, 1) == 0);
  kv_cache_destroy(kv);
  kern_destroy(be);
  return tu_done("test_kv_full");
}
