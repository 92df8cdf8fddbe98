/* cli_policy: KV cache options of the command line, cache construction and memory summaries
 * (see cli_policy.h). */
#include "cli_policy.h"
#ifdef QE_HAVE_KV_GPU
#include "kv_gpu.h"
#else
typedef struct {
  size_t budget, bytes;
  long windows[3];
  long promotions, demotions, evictions, quantizations, routings;
  int err_flags;
} kv_gpu_stats_t; /* kv_gpu.h's, for builds without it (never filled) */
#endif

#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "qe_status.h"

void cli_policy_init(cli_policy_t *p) {
  *p = (cli_policy_t){.name = "full",
                      .frac = 1.0,
                      .q = -1,
                      .omega = -1,
                      .bits = -1,
                      .sink = -1,
                      .local = -1,
                      .scorer = -1,
                      .promote = -1,
                      .key_frame = -1};
  p->gkv = graphkv_defaults();
}

/* --budget: a fraction in (0, 1] or bytes (> 1; cli_parse_bytes's suffixes, as submit takes). */
static int parse_budget(cli_policy_t *p, const char *v) {
  double d;
  uint64_t b;
  if (!cli_parse_float(v, 1e-9, 1.0, &d)) return p->frac = d, p->bytes = 0, 0;
  if (cli_parse_bytes(v, &b) || b <= 1 || b > SIZE_MAX)
    return cli_parse_note_set(CLI_BUDGET_NOTE), 2;
  p->frac = 1.0, p->bytes = (size_t)b;
  return 0;
}

/* --graphkv[=k,m,T]: source fraction, neighbours, rounds. */
static int parse_graphkv(cli_policy_t *p, const char *v) {
  p->graphkv = 1;
  if (!v) return 0;
  double k;
  long m, t;
  if (cli_parse_graphkv(v, &k, &m, &t)) return 2;
  p->gkv = (graphkv_params_t){(float)k, (int)m, (int)t};
  return 0;
}

/* --scorer: which score ranks the windows. */
static int parse_scorer(cli_policy_t *p, const char *v) {
  static const char *names[] = {"cumulative", "decayed", "pnorm", "knorm", "recency", "prefill"};
  for (int i = 0; i < 6; i++)
    if (!strcmp(v, names[i])) return p->scorer = i, 0;
  return 2;
}

int cli_check_policy(const char *name) {
  kv_policy_desc_t d;
  int rc = kv_policy_find(name, &d);
  qe_errclear();
  return rc ? -1 : 0;
}

const char *cli_policy_names(char *buf, size_t size) {
  size_t n = 0;
  buf[0] = '\0';
  for (const kv_policy_desc_t *const *p = kv_policy_list(); *p && n < size; p++)
    n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? ", " : "", (*p)->name);
  return buf;
}

int cli_policy_parse(cli_policy_t *p, const char *f, const char *v) {
  long l;
  double d;
  if (!strcmp(f, "--graphkv")) return parse_graphkv(p, v);
  if (!v) return 1;
  if (!strcmp(f, "--policy")) { /* (an unknown one had failed later, as a run's error: exit 1) */
    char names[200], note[256];
    if (!cli_check_policy(v)) return p->name = v, 0;
    snprintf(note, sizeof note, " (%s; NAME+graphkv)", cli_policy_names(names, sizeof names));
    cli_parse_note_set(note);
    return 2;
  } else if (!strcmp(f, "--key-frame")) {
    if (strcmp(v, "pos") && strcmp(v, "window") && strcmp(v, "abs")) return 2;
    p->key_frame = !strcmp(v, "pos")      ? KV_KEY_FRAME_POS
                   : !strcmp(v, "window") ? KV_KEY_FRAME_WINDOW
                                          : KV_KEY_FRAME_ABS;
  } else if (!strcmp(f, "--scorer"))
    return parse_scorer(p, v);
  else if (!strcmp(f, "--budget"))
    return parse_budget(p, v);
  else if (!strcmp(f, "--trace"))
    p->trace = v;
  else if (!strcmp(f, "--q")) { /* (-1, the unset mark, is no value a user can give) */
    if (cli_parse_float(v, 0.0, 1.0, &d)) return 2;
    p->q = (float)d;
    return 0;
  } else {
    int *dst = !strcmp(f, "--window")  ? &p->omega
               : !strcmp(f, "--bits")  ? &p->bits
               : !strcmp(f, "--sink")  ? &p->sink
               : !strcmp(f, "--local") ? &p->local
                                       : NULL;
    if (!dst) return 1;
    if (cli_parse_int(v, 0, 1000000, &l)) return 2;
    *dst = (int)l;
  }
  return 0;
}

int cli_policy_resolve(const cli_policy_t *p, int head_dim, kv_policy_desc_t *d) {
  char name[96];
  if (p->graphkv && !strcmp(p->name, "full"))
    return qe_errf(QE_EINVAL, "--graphkv needs a scorer-based --policy to re-score (qevict, h2o, "
                              "snapkv, pyramidkv, knorm), not full");
  snprintf(name, sizeof name, "%s%s", p->name,
           p->graphkv && !strstr(p->name, "+graphkv") ? "+graphkv" : "");
  int rc = kv_policy_find(name, d);
  if (rc || d->full) return rc;
  kv_policy_cfg_t *c = &d->cfg;
  if (p->graphkv) c->gkv = p->gkv;
  if (p->q != -1) c->q = p->q;
  if (p->omega != -1) c->omega = p->omega;
  if (p->bits != -1) c->quant.bits = p->bits;
  if (p->sink != -1) c->n_sink = p->sink;
  if (p->local != -1) c->n_local = p->local;
  if (p->scorer != -1) c->scorer = p->scorer;
  if (p->promote != -1) c->promote = p->promote;
  if (p->key_frame != -1) c->quant.key_frame = p->key_frame;
  if ((p->bits != -1 || p->key_frame != -1) && c->q == 0.0f)
    return qe_errf(QE_EINVAL, "%s: policy %s keeps no quantized windows (its q is 0); give --q too",
                   p->bits != -1 ? "--bits" : "--key-frame", name);

  *c = kv_policy_fit(c, head_dim);
  return kv_policy_check(c, head_dim);
}

const char *cli_policy_stray(const cli_policy_t *p) {
  const struct {
    int set;
    const char *flag;
  } opts[] = {{p->frac != 1.0 || p->bytes, "--budget"},
              {p->q != -1, "--q"},
              {p->omega != -1, "--window"},
              {p->bits != -1, "--bits"},
              {p->sink != -1, "--sink"},
              {p->local != -1, "--local"},
              {p->scorer != -1, "--scorer"},
              {p->key_frame != -1, "--key-frame"},
              {p->graphkv, "--graphkv"},
              {p->trace != NULL, "--trace"}};
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    if (opts[i].set) return opts[i].flag;
  return NULL;
}

static void trace_event(void *ud, const kv_route_event_t *e) {
  fprintf((FILE *)ud,
          "{\"seq\":%d,\"layer\":%d,\"len\":%d,\"candidates\":%d,\"full\":%d,\"int2\":%d,"
          "\"evicted\":%d,\"promoted\":%d,\"demoted\":%d,\"newly_evicted\":%d,\"bytes\":%zu,"
          "\"budget\":%zu}\n",
          e->seq, e->layer, e->len, e->n_cand, e->n_full, e->n_int2, e->n_evicted, e->promoted,
          e->demoted, e->evicted, e->bytes, e->budget);
}

/* FullKV: bf16 pages on a GPU backend where the paged kernel supports the geometry, else the
 * plain per-slot buffers of kv_full (every backend). */
static int make_full(kern_backend_t *be, const kv_geom_t *g, int capacity, kv_cache_t **out) {
#ifdef QE_HAVE_KV_GPU
  int ok = g->head_dim == 64 || g->head_dim == 128;
  ok &= g->n_head % g->n_kv_head == 0 && g->n_head / g->n_kv_head <= 8;
  if (!be->ops->host_memory && ok) {
    size_t pool = kv_gpu_pool_bytes(g, KV_GPU_OMEGA, g->max_seqs, capacity);
    return kv_gpu_create(be, g, KV_GPU_OMEGA, capacity, pool, out);
  }
#else
  (void)capacity;
#endif
  return kv_full_create(be, g, out);
}

/* A --budget in bytes under tensor parallelism: this rank's share (by its KV heads) must hold its
 * slot's protected regions (the check a slot's open makes, in the request's terms: the open
 * named the rank's share and the rank's minimum). 0, or QE_EINVAL naming --budget and the
 * least whole budget this rank takes. */
static int check_share(const cli_policy_t *p, kern_backend_t *be, const model_t *m,
                       const kv_geom_t *g, const kv_policy_cfg_t *cfg, int capacity, size_t share) {
  const model_shard_t *sh = model_shard(m);
  size_t min = 0, full = 0;
  if (!p->bytes || sh->size < 2) return 0;
  int rc;
#ifdef QE_HAVE_KV_GPU
  if (!be->ops->host_memory) /* (the GPU's tiered cache, its bounds) */
    rc = kv_gpu_bounds(g, cfg, capacity, NULL, &min, NULL);
  else
#else
  (void)be;
#endif
    rc = kv_tiered_bounds(g, cfg, capacity, &min, &full);
  if (rc || share >= min) return rc;
  return qe_errf(QE_EINVAL,
                 "--budget %zu bytes at --tp %d gives rank %d %zu bytes (its %d of %d KV heads), "
                 "below its protected regions' %zu bytes for %d tokens: give at least %llu bytes",
                 p->bytes, sh->size, sh->rank, share, sh->n_kv, model_hparams(m)->n_head_kv, min,
                 capacity, (unsigned long long)model_kv_whole(model_hparams(m), sh, min));
}

int cli_policy_make_cache(const cli_policy_t *p, kern_backend_t *be, const model_t *m, int n_seqs,
                          int capacity, FILE *trace_out, kv_cache_t **out) {
  kv_policy_desc_t d;
  kv_geom_t g = model_kv_geom(m, n_seqs);
  int rc = cli_policy_resolve(p, g.head_dim, &d);
  if (rc) return rc;
  if (d.full) return make_full(be, &g, capacity, out);
  /* (a byte budget is the whole sequence's: this rank's share, by its KV heads, as the
     daemon's workers split it) */
  const size_t share = (size_t)model_kv_share(model_hparams(m), model_shard(m), p->bytes);
  rc = check_share(p, be, m, &g, &d.cfg, capacity, share);
  if (rc) return rc;
#ifdef QE_HAVE_KV_GPU
  if (!be->ops->host_memory) /* the GPU's tiered cache: routing on the device */
    return kv_gpu_create_tiered(be, &g, &model_hparams(m)->rope, &d.cfg, capacity, n_seqs, p->frac,
                                share, out);
#endif
  rc = kv_tiered_create(be, &g, &model_hparams(m)->rope, &d.cfg, 0, out);
  if (rc) return rc;
  kv_tiered_set_budget_spec(*out, p->frac, share);
  rc = kv_tiered_reserve(*out, n_seqs, capacity);
  if (!rc && trace_out) kv_tiered_set_trace(*out, trace_event, trace_out);
  if (rc) {
    kv_cache_destroy(*out);
    *out = NULL;
  }
  return rc;
}

static int is_tiered(const kv_cache_t *kv) { return kv && !strcmp(kv->ops->name, "tiered"); }

/* The GPU tiered cache's slot 0 (kv_gpu_stats; 0 when not one, or on failure). */
static int gpu_stats(kv_cache_t *kv, kv_gpu_stats_t *s) {
#ifdef QE_HAVE_KV_GPU
  return kv_gpu_is_tiered(kv) && !kv_gpu_stats(kv, 0, s);
#else
  (void)kv, (void)s;
  return 0;
#endif
}

/* A GPU cache's warning when its pool ran out during the run (nothing otherwise). */
static void pool_warning(int err_flags, FILE *f) {
  if (err_flags & 1)
    fprintf(f, "qevict: warning: the GPU cache's pool ran out of units during the run: windows "
               "were kept at a lower tier or (a new window) left unstored, so routing was not "
               "exact; QEVICT_KV_GPU_POOL_SLACK=30 gives the pool 30%% more units (README)\n");
}

void cli_policy_mem_print(const char *policy, int rank, const cli_policy_mem_t *m, FILE *f) {
  const kv_mem_stats_t *s = &m->s;
  if (m->kind == CLI_MEM_GPU) {
    fprintf(f,
            "qevict: memory (policy %s, GPU, rank %d): budget %zu bytes, persistent %zu; windows "
            "Full/INT2/Evicted %ld/%ld/%ld; promotions %ld, demotions %ld, evictions %ld, "
            "routing events %ld; pool faults %d\n",
            policy, rank, s->budget, s->bytes, s->windows[0], s->windows[1], s->windows[2],
            s->promotions, s->demotions, s->evictions, s->routing_events, m->pool_faults);
    pool_warning(m->pool_faults, f);
  } else if (m->kind == CLI_MEM_CPU) {
    fprintf(f,
            "qevict: memory (policy %s, rank %d): budget %zu bytes, persistent %zu (peak %zu): "
            "Full %zu, INT2 %zu, sink %zu, metadata %zu; windows Full/INT2/Evicted "
            "%ld/%ld/%ld; promotions %ld, demotions %ld, evictions %ld, routing events %ld; "
            "peak transient %zu bytes, workspace %zu bytes\n",
            policy, rank, s->budget, s->bytes, s->peak_bytes, s->full_bytes, s->int2_bytes,
            s->sink_bytes, s->meta_bytes, s->windows[0], s->windows[1], s->windows[2],
            s->promotions, s->demotions, s->evictions, s->routing_events, s->peak_transient,
            s->workspace);
  }
}

void cli_policy_print(const cli_policy_t *p, kv_cache_t *kv, FILE *f) {
  cli_policy_mem_t m;
  cli_policy_mem(kv, &m);
  cli_policy_mem_print(p->name, 0, &m, f);
}

size_t cli_policy_fullkv_bytes(const kv_cache_t *kv, long n_tokens) {
#ifdef QE_HAVE_KV_GPU
  if (kv_gpu_is(kv)) return kv_gpu_fullkv_bytes(kv, n_tokens);
#endif
  const kv_geom_t *g = &kv->geom;
  return (size_t)n_tokens * 2u * sizeof(float) * (size_t)g->n_layer * (size_t)g->n_kv_head *
         (size_t)g->head_dim;
}

void cli_policy_mem(kv_cache_t *kv, cli_policy_mem_t *m) {
  kv_gpu_stats_t gs;
  *m = (cli_policy_mem_t){CLI_MEM_FULL};
  if (gpu_stats(kv, &gs)) {
    kv_mem_stats_t *s = &m->s;
    m->kind = CLI_MEM_GPU, m->pool_faults = gs.err_flags;
    *s = (kv_mem_stats_t){.budget = gs.budget, .bytes = gs.bytes, .peak_bytes = gs.bytes};
    memcpy(s->windows, gs.windows, sizeof s->windows);
    s->promotions = gs.promotions, s->demotions = gs.demotions;
    s->evictions = gs.evictions, s->quantizations = gs.quantizations;
    s->routing_events = gs.routings;
#ifdef QE_HAVE_KV_GPU
    (void)kv_gpu_routing_time(kv, m->routing_ms, m->routing_passes);
#endif
  } else if (is_tiered(kv)) {
    m->kind = CLI_MEM_CPU;
    kv_tiered_stats(kv, 0, &m->s);
  }
}

int cli_policy_mem_stats(kv_cache_t *kv, kv_mem_stats_t *out) {
  cli_policy_mem_t m;
  cli_policy_mem(kv, &m);
  if (m.kind != CLI_MEM_FULL) *out = m.s;
  return m.kind != CLI_MEM_FULL;
}

void cli_policy_mem_json(const char *policy, int rank, const cli_policy_mem_t *m, FILE *f) {
  const kv_mem_stats_t *s = &m->s;
  fprintf(f, "{\"policy\":\"%s\"", m->kind == CLI_MEM_FULL ? "full" : policy);
  if (rank >= 0) fprintf(f, ",\"rank\":%d", rank);
  if (m->kind == CLI_MEM_FULL) {
    fputc('}', f);
    return;
  }
  fprintf(f, "%s,\"budget_bytes\":%zu,\"bytes\":%zu",
          m->kind == CLI_MEM_GPU ? ",\"device\":\"gpu\"" : "", s->budget, s->bytes);
  if (m->kind == CLI_MEM_CPU)
    fprintf(f,
            ",\"peak_bytes\":%zu,\"full_bytes\":%zu,\"int2_bytes\":%zu,\"sink_bytes\":%zu,"
            "\"meta_bytes\":%zu",
            s->peak_bytes, s->full_bytes, s->int2_bytes, s->sink_bytes, s->meta_bytes);
  fprintf(f,
          ",\"windows_full\":%ld,\"windows_int2\":%ld,\"windows_evicted\":%ld,"
          "\"promotions\":%ld,\"demotions\":%ld,\"evictions\":%ld,\"quantizations\":%ld,"
          "\"routing_events\":%ld,",
          s->windows[0], s->windows[1], s->windows[2], s->promotions, s->demotions, s->evictions,
          s->quantizations, s->routing_events);
  if (m->kind == CLI_MEM_CPU)
    fprintf(f, "\"peak_transient_bytes\":%zu,\"workspace_bytes\":%zu}", s->peak_transient,
            s->workspace);
  else /* the GPU routing passes' device time (kv_gpu_routing_time) */
    fprintf(f,
            "\"pool_faults\":%d,\"routing_gpu_ms_prefill\":%.3f,\"routing_passes_prefill\":%ld,"
            "\"routing_gpu_ms_decode\":%.3f,\"routing_passes_decode\":%ld}",
            m->pool_faults, m->routing_ms[0], m->routing_passes[0], m->routing_ms[1],
            m->routing_passes[1]);
}

void cli_policy_json(const cli_policy_t *p, kv_cache_t *kv, int rank, FILE *f) {
  cli_policy_mem_t m;
  cli_policy_mem(kv, &m);
  cli_policy_mem_json(p->name, rank, &m, f);
  if (m.kind == CLI_MEM_GPU) pool_warning(m.pool_faults, stderr); /* (beside the JSON) */
}
