/* model_graph: decode steps recorded once per batch-size bucket and replayed (CUDA graphs; see
 * model.h). A step of n rows is padded to its bucket; every input that changes from step to
 * step (token ids, positions, and the cache's slots, windows and chunking) sits in one backend
 * buffer at a fixed address (model_graphs_t.dev) that one asynchronous copy from pinned host
 * staging fills before the replay, so that every launch of the bucket (grids, pointers,
 * scalars) stays the same; the forward pass reads ids and positions from m->s, which point
 * into that buffer while a fixed step is queued or recorded. Inactive rows embed token 0 at
 * position 0, own no KV window (the cache skips their stores) and their outputs are not read. */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "qe_log.h"
#include "qe_status.h"

#define MG_BUCKETS  11   /* powers of two up to MG_MAX_ROWS */
#define MG_MAX_ROWS 1024 /* the GPU cache's most decode rows per call */

/* One bucket and output kind's graph. */
typedef struct {
  kern_graph_t *g;
  const kv_cache_t *kv;             /* the cache it was recorded with */
  unsigned long be_epoch, kv_epoch; /* the scratch it reads, as of the recording */
  int warm;                         /* a step of this bucket ran its launches unrecorded */
} mg_slot_t;

struct model_graphs {
  mg_slot_t slot[2][MG_BUCKETS]; /* [greedy ids, logits][log2 of the bucket's power of two] */
  int S;                         /* rows of the buffers: min(max_batch, MG_MAX_ROWS) */
  int32_t *dev;                  /* backend: ids [S], pos [S], cache input, out ids [S] */
  int32_t *host;                 /* pinned staging of ids, pos and the cache input */
  model_graph_stats_t st;
};

/* Off also frees the recorded graphs: an NCCL communicator cannot be destroyed while a graph
 * that recorded its collectives lives (ncclCommDestroy waits for them). */
void model_set_graphs(model_t *m, int on) {
  m->graphs_on = on != 0;
  if (!on) model__graph_free(m);
}
int model_graphs_on(const model_t *m) { return m->graphs_on && m->be->ops->graph_begin; }

void model_graph_stats(const model_t *m, model_graph_stats_t *out) {
  memset(out, 0, sizeof *out);
  if (m->gr) *out = m->gr->st;
}

static void slot_drop(model_t *m, mg_slot_t *s) {
  if (s->g) m->be->ops->graph_free(m->be, s->g);
  s->g = NULL;
}

void model__graph_free(model_t *m) {
  model_graphs_t *gr = m->gr;
  if (!gr) return;
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < MG_BUCKETS; i++) slot_drop(m, &gr->slot[k][i]);
  if (gr->dev) kern_free(m->be, gr->dev);
  m->be->ops->host_free(m->be, gr->host);
  free(gr);
  m->gr = NULL;
}

/* Words staged per step: ids [S], pos [S], the cache's input [KV_FIXED_WORDS(S)]. */
static size_t staged_words(int S) { return 2 * (size_t)S + KV_FIXED_WORDS(S); }

static int graphs_get(model_t *m, model_graphs_t **out) {
  model_graphs_t *gr = m->gr;
  if (!gr && !(gr = m->gr = calloc(1, sizeof *m->gr)))
    return qe_errf(QE_ENOMEM, "model: out of memory for graphs");
  int S = gr->S = m->max_batch < MG_MAX_ROWS ? m->max_batch : MG_MAX_ROWS;
  size_t bytes = sizeof(int32_t) * (staged_words(S) + (size_t)S);
  if (!gr->dev && !(gr->dev = kern_alloc(m->be, bytes)))
    return qe_errf(QE_ENOMEM, "model: no backend memory for graph inputs");
  if (!gr->host && !(gr->host = m->be->ops->host_alloc(m->be, bytes)))
    return qe_errf(QE_ENOMEM, "model: no pinned host memory for graph inputs");
  *out = gr;
  return 0;
}

/* Whether the group's all-reduces can be recorded: one rank, or a device communicator that
 * only queues them on the backend's stream (NCCL). */
static int comm_takes(const tp_comm_t *comm) {
  return comm->size == 1 || (comm->dev && tp_capturable(comm->dev));
}

/* Whether graphs may run at all: switched on, recordable collectives, a backend and a cache
 * with recorded / fixed steps (the same on every rank of a group). */
static int graphs_possible(const model_t *m, const kv_cache_t *kv, const tp_comm_t *comm) {
  return m->graphs_on && comm_takes(comm) && m->be->ops->graph_begin && kv->ops->fixed_fill;
}

/* Whether b (n_segs runs) is a step a graph expresses on this rank (graphs_possible): every row
 * its own sequence's single token and (rank 0, which alone computes outputs) an output row. */
static int takes(const model_t *m, const kv_cache_t *kv, const tp_comm_t *comm,
                 const model_batch_t *b, int n_segs, const model_out_t *o) {
  int cap = m->max_batch < MG_MAX_ROWS ? m->max_batch : MG_MAX_ROWS;
  if (n_segs != b->n || b->n > kv->geom.max_seqs || b->n > cap) return 0;
  if (comm->rank == 0 && !o->ids && !o->logits) return 0;
  for (int i = 0; b->logits && i < b->n; i++)
    if (!b->logits[i]) return 0;
  return 1;
}

/* Sums v [n] over the group (itself for one rank): under tensor parallelism, recording an NCCL
 * collective, and launching the graph that holds it, are collective (NCCL's rule: every rank
 * records the same step and replays the graph of that recording), so the ranks agree over the
 * CPU link on each step's choices; a rank whose scratch moved or whose recording failed makes
 * every rank record again or run eagerly. */
static int agree(tp_comm_t *comm, float *v, int n) { return tp_allreduce_sum(comm, v, (size_t)n); }

/* The fixed step of n rows: the bucket (the power of two p >= n, capped at the cache's slots
 * and the buffers' rows), n_min = p / 2 + 1; returns log2 p. */
static int bucket_of(const model_t *m, const kv_cache_t *kv, int n, kv_fixed_t *f) {
  int lg = 0, p = 1, cap = m->gr->S < kv->geom.max_seqs ? m->gr->S : kv->geom.max_seqs;
  for (; p < n; p *= 2) lg++;
  int32_t *d = m->gr->dev;
  *f = (kv_fixed_t){d + 2 * m->gr->S, m->gr->S, p < cap ? p : cap, p / 2 + 1};
  if (f->n_min > f->bucket) f->n_min = f->bucket;
  return lg;
}

/* Stages ids and positions (inactive rows: token 0 at 0) and the cache's input, and queues
 * their copy. QE_ERANGE from the cache: run the step eagerly. */
static int stage(model_t *m, kv_cache_t *kv, const kv_fixed_t *f, const model_batch_t *b) {
  int32_t *h = m->gr->host, S = m->gr->S;
  for (int i = 0; i < f->bucket; i++) {
    h[i] = i < b->n ? b->tokens[i] : 0;
    h[S + i] = i < b->n ? b->pos[i] : 0;
  }
  int rc = kv->ops->fixed_fill(kv, f, h + 2 * S, b->seq, b->pos, b->n);
  size_t bytes = sizeof(int32_t) * staged_words(S);
  return rc ? rc : m->be->ops->upload_async(m->be, m->gr->dev, h, bytes);
}

/* The padded step's launches in the cache's fixed mode, with the forward pass reading ids and
 * positions from the graph buffer; recorded into *rec (not run) when rec is set. */
static int run_fixed(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const kv_fixed_t *f,
                     const model_batch_t *b, const model_out_t *o, kern_graph_t **rec) {
  static _Thread_local model_seg_t segs[MODEL_MAX_SEGS];
  kern_backend_t *be = m->be;
  model_batch_t pb = {f->bucket, NULL, NULL, NULL, NULL};
  for (int i = 0; i < f->bucket; i++) /* the cache reads only row 0's run in fixed mode */
    segs[i] = (model_seg_t){b->seq[0], b->pos[0], i, 1};
  int32_t *ids = m->s.ids, *pos = m->s.pos;
  m->s.ids = m->gr->dev, m->s.pos = m->gr->dev + m->gr->S;
  int rc = kv->ops->fixed_mode(kv, f), began = 0;
  if (!rc && rec) began = !(rc = be->ops->graph_begin(be));
  if (!rc) rc = model__forward_dev(m, kv, comm, &pb, segs, f->bucket, o);
  int erc = began ? be->ops->graph_end(be, rec) : 0;
  int lrc = kv->ops->fixed_mode(kv, NULL);
  m->s.ids = ids, m->s.pos = pos;
  return rc ? rc : erc ? erc : lrc;
}

/* Whether s was recorded against scratch that has moved since (or another cache). */
static int stale(model_t *m, const kv_cache_t *kv, const mg_slot_t *s) {
  return s->kv != kv || s->be_epoch != m->be->ops->scratch_epoch(m->be) ||
         s->kv_epoch != kv->ops->fixed_epoch(kv);
}

/* Runs the staged step through s, whose need for a new recording (any rank's graph missing or
 * stale) and warmth (every rank ran the bucket once) the ranks agreed on: its graph, else a
 * recording (then, if every rank's succeeded, its launch), else the launches unrecorded. */
static int run_step(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const kv_fixed_t *f,
                    const model_batch_t *b, const model_out_t *o, mg_slot_t *s, int need,
                    int warm) {
  model_graph_stats_t *st = &m->gr->st;
  if (need) slot_drop(m, s);
  if (need && warm) {
    qe_log(QE_LOG_DEBUG, "graph: rank %d records a bucket of %d rows", comm->rank, f->bucket);
    int rc = run_fixed(m, kv, comm, f, b, o, &s->g);
    if (rc && rc != QE_EUNSUPPORTED) return rc;
    float ok = s->g != NULL;
    if ((rc = agree(comm, &ok, 1))) return rc;
    qe_log(QE_LOG_DEBUG, "graph: rank %d recorded a bucket of %d rows: %s (%g of %d ranks)",
           comm->rank, f->bucket, s->g ? "ok" : "refused", (double)ok, comm->size);
    if (ok < (float)comm->size) slot_drop(m, s);
    st->captures += s->g != NULL;
    s->kv = kv, s->be_epoch = m->be->ops->scratch_epoch(m->be);
    s->kv_epoch = kv->ops->fixed_epoch(kv);
  }
  if (s->g) return st->replays++, m->be->ops->graph_launch(m->be, s->g);
  st->warmups++, s->warm = 1;
  return run_fixed(m, kv, comm, f, b, o, NULL);
}

/* This rank's view of the step [take, rank 0's output kind, need and warmth of both kinds'
 * slots], summed over the group. */
enum { AG_TAKE, AG_LOGITS, AG_NEED, AG_WARM = AG_NEED + 2, AG_N = AG_WARM + 2 };

static int step_view(model_t *m, kv_cache_t *kv, tp_comm_t *comm, int take, int logits, int lg,
                     float *v) {
  model_graphs_t *gr = m->gr;
  v[AG_TAKE] = (float)take, v[AG_LOGITS] = (float)logits;
  for (int k = 0; k < 2; k++) {
    const mg_slot_t *s = gr ? &gr->slot[k][lg] : NULL;
    v[AG_NEED + k] = (float)(!s || !s->g || stale(m, kv, s));
    v[AG_WARM + k] = (float)(s && s->warm);
  }
  return agree(comm, v, AG_N);
}

/* Prepares this rank's side of a graphed step: buffers, bucket, staging; 0 in *take when the
 * step must run eagerly here. */
static int prepare(model_t *m, kv_cache_t *kv, const model_batch_t *b, int logits, kv_fixed_t *f,
                   int *lg, int *take) {
  model_graphs_t *gr = NULL;
  int rc = graphs_get(m, &gr);
  if (rc) return rc;
  *lg = bucket_of(m, kv, b->n, f);
  if (logits && f->bucket > m->out_rows) return *take = 0, 0; /* one logits chunk */
  if ((rc = stage(m, kv, f, b)) == QE_ERANGE) return gr->st.eager_steps++, *take = 0, 0;
  return rc;
}

int model__graph_forward(model_t *m, kv_cache_t *kv, tp_comm_t *comm, const model_batch_t *b,
                         int n_segs, const model_out_t *o) {
  if (!graphs_possible(m, kv, comm)) return 1;
  int take = takes(m, kv, comm, b, n_segs, o), lg = 0, rc = 0;
  int logits = comm->rank == 0 && !o->ids; /* rank 0's output kind; the others have none */
  if (!take && comm->size == 1) return 1;
  kv_fixed_t f;
  if (take && (rc = prepare(m, kv, b, logits, &f, &lg, &take))) return rc;
  float v[AG_N];
  if ((rc = step_view(m, kv, comm, take, logits, lg, v))) return rc;
  if (v[AG_TAKE] < (float)comm->size) return 1;
  int kind = v[AG_LOGITS] > 0.5f, n = comm->size;
  int32_t *out_ids = m->gr->dev + staged_words(m->gr->S);
  model_out_t go = {NULL, NULL, kind ? NULL : out_ids, kind};
  rc = run_step(m, kv, comm, &f, b, &go, &m->gr->slot[kind][lg], v[AG_NEED + kind] > 0.5f,
                v[AG_WARM + kind] > (float)n - 0.5f);
  if (!rc) rc = kv->ops->fixed_done(kv, b->seq, b->n);
  if (rc || comm->rank != 0) return rc;
  size_t V = (size_t)m->hp.n_vocab, nr = (size_t)b->n;
  return kind ? m->be->ops->download(m->be, o->logits, m->s.logits, nr * V * sizeof(float))
              : m->be->ops->download(m->be, o->ids, out_ids, nr * sizeof(int32_t));
}
