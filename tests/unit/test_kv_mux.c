/* test_kv_mux: one cache over several. On a random model, a FullKV sequence and a QEvict
 * sequence under a budget that forces quantization and eviction run through one mux (bound
 * to slots that differ from the mux's, decode steps batched together so every attend call
 * spans both children) and give, step by step, the same logits bit for bit as each alone on
 * its own cache, with the same memory outcome; then binding, removal and geometry errors,
 * and which slots are open. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_mux.h"
#include "kv_tiered.h"
#include "model_gen.h"
#include "qe_status.h"
#include "rand_model.h"
#include "test_util.h"

enum { PA = 40, PB = 80, ND = 40 };

typedef struct {
  kern_backend_t *be;
  model_t *m;
  tp_comm_t *c;
  int V;
  int32_t pa[PA], pb[PB];
} world_t;

/* One sequence's run: its logits after the prompt and after each decode token, the tokens. */
typedef struct {
  float *lg; /* [ND + 1][V] */
  int32_t tok[ND];
} trace_t;

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
  return b;
}

/* A QEvict cache of n slots (16 protected recent tokens) at 30% of the FullKV bytes. */
static int make_tiered(world_t *w, int n, kv_cache_t **kv) {
  kv_policy_desc_t d;
  kv_geom_t g = model_kv_geom(w->m, n);
  int rc = kv_policy_find("qevict", &d);
  d.cfg.n_local = 16;
  d.cfg = kv_policy_fit(&d.cfg, g.head_dim);
  if (!rc) rc = kv_tiered_create(w->be, &g, &model_hparams(w->m)->rope, &d.cfg, 64u << 20, kv);
  if (!rc) kv_tiered_set_budget_spec(*kv, 0.3, 0);
  return rc;
}

static int make_full(world_t *w, int n, kv_cache_t **kv) {
  kv_geom_t g = model_kv_geom(w->m, n);
  return kv_full_create(w->be, &g, kv);
}

/* Prefill of p[0..np) in slot; logits of the last token into out [V]. */
static int prefill(world_t *w, kv_cache_t *kv, int slot, const int32_t *p, int np, float *out) {
  int32_t pos[PB], seq[PB];
  for (int i = 0; i < np; i++) pos[i] = i, seq[i] = slot;
  model_batch_t b = {np, p, pos, seq, NULL};
  return model_forward(w->m, kv, w->c, &b, out);
}

/* The reference: the sequence alone in slot 0 of kv, greedy. */
static int run_alone(world_t *w, kv_cache_t *kv, const int32_t *p, int np, trace_t *t) {
  int rc = kv->ops->seq_open(kv, 0, np + ND);
  if (!rc) rc = prefill(w, kv, 0, p, np, t->lg);
  for (int s = 0; s < ND && !rc; s++) {
    int32_t pos = np + s, seq = 0;
    t->tok[s] = argmax(t->lg + (size_t)s * w->V, w->V);
    model_batch_t b = {1, &t->tok[s], &pos, &seq, NULL};
    rc = model_forward(w->m, kv, w->c, &b, t->lg + (size_t)(s + 1) * w->V);
  }
  return rc;
}

/* Both sequences through the mux: A in mux slot 3, B in mux slot 1; prefills one at a time
 * (as alone), then one batch per decode step with both (order alternating). */
static int run_mux(world_t *w, kv_cache_t *mux, trace_t *a, trace_t *b) {
  int V = w->V, rc = mux->ops->seq_open(mux, 3, PA + ND);
  if (!rc) rc = mux->ops->seq_open(mux, 1, PB + ND);
  if (!rc) rc = prefill(w, mux, 3, w->pa, PA, a->lg);
  if (!rc) rc = prefill(w, mux, 1, w->pb, PB, b->lg);
  float *two = malloc(sizeof(float) * 2 * V);
  for (int s = 0; s < ND && !rc; s++) {
    a->tok[s] = argmax(a->lg + (size_t)s * V, V);
    b->tok[s] = argmax(b->lg + (size_t)s * V, V);
    int af = s % 2 == 0; /* A first on even steps */
    int32_t tok[2] = {af ? a->tok[s] : b->tok[s], af ? b->tok[s] : a->tok[s]};
    int32_t pos[2] = {af ? PA + s : PB + s, af ? PB + s : PA + s};
    int32_t seq[2] = {af ? 3 : 1, af ? 1 : 3};
    model_batch_t bt = {2, tok, pos, seq, NULL};
    rc = model_forward(w->m, mux, w->c, &bt, two);
    memcpy(a->lg + (size_t)(s + 1) * V, two + (af ? 0 : V), sizeof(float) * V);
    memcpy(b->lg + (size_t)(s + 1) * V, two + (af ? V : 0), sizeof(float) * V);
  }
  free(two);
  return rc;
}

static int same_trace(const trace_t *x, const trace_t *y, int V) {
  return !memcmp(x->lg, y->lg, sizeof(float) * (ND + 1) * V) &&
         !memcmp(x->tok, y->tok, sizeof x->tok);
}

/* Returns the mux (children: 0 = FullKV with 2 slots, 1 = QEvict with 3), still open. */
static kv_cache_t *check_identical(world_t *w) {
  int V = w->V, id_full = -1, id_tiered = -1;
  trace_t ra = {0}, rb = {0}, ma = {0}, mb = {0};
  trace_t *all[4] = {&ra, &rb, &ma, &mb};
  for (int i = 0; i < 4; i++) all[i]->lg = malloc(sizeof(float) * (ND + 1) * V);
  kv_cache_t *full = NULL, *tiered = NULL, *mux = NULL, *cf = NULL, *ct = NULL;
  kv_mem_stats_t ref_st, mux_st;
  CHECK_OK(make_full(w, 1, &full));
  CHECK_OK(make_tiered(w, 1, &tiered));
  CHECK_OK(run_alone(w, full, w->pa, PA, &ra));
  CHECK_OK(run_alone(w, tiered, w->pb, PB, &rb));
  size_t ref_bytes = tiered->ops->seq_bytes(tiered, 0);
  kv_tiered_stats(tiered, 0, &ref_st);
  kv_geom_t g = model_kv_geom(w->m, 4);
  CHECK_OK(kv_mux_create(w->be, &g, &mux));
  CHECK_OK(make_full(w, 2, &cf));
  CHECK_OK(make_tiered(w, 3, &ct));
  CHECK_OK(kv_mux_add_child(mux, cf, &id_full));
  CHECK_OK(kv_mux_add_child(mux, ct, &id_tiered));
  CHECK(id_full == 0 && id_tiered == 1 && kv_mux_n_children(mux) == 2);
  CHECK(kv_mux_child(mux, 0) == cf && kv_mux_child(mux, 1) == ct);
  CHECK_OK(kv_mux_bind(mux, 3, id_full, 1));
  CHECK_OK(kv_mux_bind(mux, 1, id_tiered, 2));
  CHECK_OK(run_mux(w, mux, &ma, &mb));
  int same_a = same_trace(&ra, &ma, V), same_b = same_trace(&rb, &mb, V);
  kv_tiered_stats(ct, 2, &mux_st);
  fprintf(stderr,
          "mux: FullKV sequence %s, QEvict sequence %s alone (%ld evictions, %ld demotions, "
          "%zu/%zu bytes)\n",
          same_a ? "bit-identical to" : "DIFFERS from",
          same_b ? "bit-identical to" : "DIFFERS from", mux_st.evictions, mux_st.demotions,
          mux_st.bytes, mux_st.budget);
  CHECK(same_a && same_b);
  CHECK(ref_st.evictions > 0 && ref_st.demotions > 0 && mux_st.bytes <= mux_st.budget);
  CHECK(mux_st.evictions == ref_st.evictions && mux_st.demotions == ref_st.demotions);
  CHECK(mux->ops->seq_bytes(mux, 1) == ref_bytes && ref_bytes == ct->ops->seq_bytes(ct, 2));
  CHECK(mux->ops->seq_bytes(mux, 3) == cf->ops->seq_bytes(cf, 1) &&
        mux->ops->seq_bytes(mux, 3) > 0);
  CHECK(mux->ops->seq_bytes(mux, 0) == 0);
  int cid = -1, cslot = -1;
  CHECK_OK(kv_mux_lookup(mux, 1, &cid, &cslot));
  CHECK(cid == id_tiered && cslot == 2);
  for (int i = 0; i < 4; i++) free(all[i]->lg);
  kv_cache_destroy(full);
  kv_cache_destroy(tiered);
  return mux;
}

/* Binding, removal and geometry errors on the mux left open by check_identical. */
static void check_errors(world_t *w, kv_cache_t *mux) {
  int id = -1, cid, cslot;
  int32_t tok = 5, pos = 0, seq = 0;
  float k[2 * 32] = {0};
  /* slot 3 is open on child 0 slot 1; slot 1 on child 1 slot 2 */
  CHECK(kv_mux_is_open(mux, 3) && kv_mux_is_open(mux, 1) && !kv_mux_is_open(mux, 0));
  CHECK(!kv_mux_is_open(mux, -1) && !kv_mux_is_open(mux, 4) && !kv_mux_is_open(NULL, 0));
  /* fixed steps go to the children of the rows, when they have them (the CPU caches do not) */
  {
    int32_t in[KV_FIXED_WORDS(4)], rows[2] = {3, 1}, at[2] = {0, 0};
    kv_fixed_t f = {NULL, 4, 2, 1};
    CHECK(mux->ops->fixed_fill(mux, &f, in, rows, at, 1) == QE_ERANGE); /* kv_full: none */
    CHECK(mux->ops->fixed_fill(mux, &f, in, rows, at, 2) == QE_ERANGE &&
          strstr(qe_errmsg(), "child caches with fixed steps"));
    rows[0] = 0; /* not open */
    CHECK(mux->ops->fixed_fill(mux, &f, in, rows, at, 1) == QE_ERANGE);
    CHECK(mux->ops->fixed_fill(mux, &f, in, rows, at, 0) == QE_EINVAL);
    CHECK(mux->ops->fixed_mode(mux, &f) == QE_EINVAL && mux->ops->fixed_mode(mux, NULL) == 0);
    unsigned long e0 = mux->ops->fixed_epoch(mux);
    CHECK(mux->ops->fixed_epoch(mux) == e0);
  }
  CHECK(kv_mux_bind(mux, 3, 0, 0) == QE_EINVAL && strstr(qe_errmsg(), "is open"));
  CHECK(kv_mux_bind(mux, 0, 0, 1) == QE_EINVAL && strstr(qe_errmsg(), "in use"));
  CHECK(kv_mux_bind(mux, 0, 7, 0) == QE_EINVAL && strstr(qe_errmsg(), "no child"));
  CHECK(kv_mux_bind(mux, 0, 0, 2) == QE_EINVAL && strstr(qe_errmsg(), "has no slot"));
  CHECK(kv_mux_bind(mux, 4, 0, 0) == QE_EINVAL);
  CHECK(mux->ops->seq_open(mux, 0, 16) == QE_EINVAL && strstr(qe_errmsg(), "not bound"));
  CHECK(kv_mux_lookup(mux, 0, &cid, &cslot) == QE_EINVAL);
  CHECK(mux->ops->store(mux, 0, 0, 0, 1, k, k) == QE_EINVAL);
  model_batch_t b = {1, &tok, &pos, &seq, NULL};
  CHECK(model_forward(w->m, mux, w->c, &b, NULL) == QE_EINVAL);
  /* two mux slots bound to one child slot: only one may be open */
  CHECK_OK(kv_mux_bind(mux, 0, 1, 0));
  CHECK_OK(kv_mux_bind(mux, 2, 1, 0));
  CHECK_OK(mux->ops->seq_open(mux, 0, 120));
  CHECK(kv_mux_is_open(mux, 0));
  CHECK(mux->ops->seq_open(mux, 2, 120) == QE_EINVAL && strstr(qe_errmsg(), "in use"));
  CHECK(!kv_mux_is_open(mux, 2)); /* a failed open leaves the slot closed */
  mux->ops->seq_close(mux, 0);
  CHECK(!kv_mux_is_open(mux, 0));
  mux->ops->seq_close(mux, 0); /* closing a closed slot is harmless */
  CHECK_OK(mux->ops->seq_open(mux, 2, 120));
  mux->ops->seq_close(mux, 2);
  /* a child with open slots cannot be removed */
  CHECK(kv_mux_remove_child(mux, 1) == QE_EINVAL && strstr(qe_errmsg(), "open slots"));
  CHECK(kv_mux_n_children(mux) == 2);
  mux->ops->seq_close(mux, 1);
  CHECK_OK(kv_mux_remove_child(mux, 1));
  CHECK(kv_mux_n_children(mux) == 1 && kv_mux_child(mux, 1) == NULL);
  CHECK(kv_mux_lookup(mux, 1, &cid, &cslot) == QE_EINVAL); /* its bindings went with it */
  CHECK(kv_mux_remove_child(mux, 1) == QE_EINVAL);
  /* geometry: another layer count or head size is refused and stays the caller's */
  kv_cache_t *bad = NULL, *again = NULL;
  kv_geom_t g = model_kv_geom(w->m, 2);
  g.n_layer++;
  CHECK_OK(kv_full_create(w->be, &g, &bad));
  CHECK(kv_mux_add_child(mux, bad, &id) == QE_EINVAL && strstr(qe_errmsg(), "geometry"));
  kv_cache_destroy(bad);
  g = model_kv_geom(w->m, 2), g.head_dim = 16;
  CHECK_OK(kv_full_create(w->be, &g, &bad));
  CHECK(kv_mux_add_child(mux, bad, &id) == QE_EINVAL);
  kv_cache_destroy(bad);
  /* a freed id is reused */
  CHECK_OK(make_full(w, 1, &again));
  CHECK_OK(kv_mux_add_child(mux, again, &id));
  CHECK(id == 1 && kv_mux_n_children(mux) == 2);
  /* not a mux */
  CHECK(kv_mux_add_child(again, again, &id) == QE_EINVAL);
  CHECK(kv_mux_bind(again, 0, 0, 0) == QE_EINVAL && kv_mux_child(again, 0) == NULL);
  CHECK(kv_mux_n_children(again) == 0 && !kv_mux_is_open(again, 0));
  g = model_kv_geom(w->m, 0);
  CHECK(kv_mux_create(w->be, &g, &bad) == QE_EINVAL && bad == NULL);
  /* slot 3 is still open: destroy closes it and the children */
  kv_cache_destroy(mux);
}

int main(void) {
  char path[] = "/tmp/qe_test_kv_mux_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  rand_model_spec_t sp = {MODEL_ARCH_LLAMA, GGUF_T_F32, 8, 2, 0, 2, 21};
  world_t w = {0};
  CHECK_OK(rand_model_write(&sp, path));
  CHECK_OK(kern_cpu_create(1, &w.be));
  CHECK_OK(tp_comm_create_single(&w.c));
  model_load_opts_t o = {w.be, 0, 1, 128, 0};
  CHECK_OK(model_load(path, &o, &w.m));
  unlink(path);
  if (!w.m) return tu_done("test_kv_mux");
  w.V = model_hparams(w.m)->n_vocab;
  uint64_t s = 5;
  for (int i = 0; i < PA; i++) w.pa[i] = 3 + (int)tu_randf(&s, 0, (float)(w.V - 3));
  for (int i = 0; i < PB; i++) w.pb[i] = 3 + (int)tu_randf(&s, 0, (float)(w.V - 3));
  check_errors(&w, check_identical(&w));
  model_destroy(w.m);
  tp_comm_destroy(w.c);
  kern_destroy(w.be);
  return tu_done("test_kv_mux");
}
