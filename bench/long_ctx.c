/* long_ctx: how many long sequences fit on the GPUs and how fast they decode, FullKV against a
 * tiered policy at a budget (issue 5, "long context"). A random-weight model of a named shape
 * (model_create_random) on the CUDA backend, optionally tensor-parallel (--tp T: T processes,
 * rank r on GPU (device + r) mod the visible count, each holding its shard of the model and of
 * the KV heads; forked from this one and joined by CPU socketpairs plus an NCCL communicator
 * that carries the activations' all-reduces, timed with CUDA events). Each rank sizes its cache
 * from the GPU memory left after its weights and a workspace reserve, for as many slots of
 * ctx + new tokens as it can hold (the tiered cache at its budget, FullKV at full size); the
 * ranks then agree on the smallest count. Each slot is filled with ctx tokens of random K/V
 * through the cache's own store and prefill path (the last n_obs positions as the observation
 * queries, so the tiered cache scores and routes every layer as after a real prompt; the
 * prompt's other hidden states are not computed: this measures memory and decode, not
 * prefill), then every slot decodes `new` tokens in one batch through the whole model
 * (model_forward_greedy on rank 0, model_forward on the others). Rank 0 prints one JSON line;
 * any rank's failure makes the run exit 1 with one message (never a hang).
 * Usage: long_ctx [--shape llama3-8b] [--ctx 32768] [--new 32] [--policy full|qevict]
 *                 [--budget 0.2] [--device 0] [--reserve-gb 4] [--max-seqs N] [--tp 1]
 *                 [--key-frame pos|abs] (INT2 keys pre-RoPE or post-RoPE; default: the
 *                 policy's, post-RoPE) */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda/kern_cuda.h"
#include "kv_gpu.h"
#include "model.h"
#include "qe_status.h"

#define LC_MAX_TP           64
#define LC_SETUP_TIMEOUT_MS 300000 /* CPU comm I/O timeout before decoding (see set_timeout) */

typedef struct {
  const char *shape, *policy;
  int ctx, n_new, device, max_seqs, tp;
  double budget, reserve_gb;
  int key_frame; /* KV_KEY_FRAME_POS or KV_KEY_FRAME_ABS; -1: the policy's */
} lc_args_t;

/* One rank's state. Owned: destroyed by rank_free (c, which borrows nc as c->dev, first). */
typedef struct {
  kern_backend_t *be;
  model_t *m;
  kv_cache_t *kv;
  tp_comm_t *nc;         /* NCCL communicator (T > 1), NULL otherwise */
  float *k, *v;          /* fill K, V rows: [ctx][n_kv_local][head_dim] */
  float *q, *o;          /* fill queries, outputs: [32][n_head_local][head_dim] */
  int n_fit, n;          /* slots fit_slots made here; slots agreed by every rank */
  double fill_s, step_s; /* fill time; mean decode step, the first excluded */
  double route_ms;       /* tiered: GPU ms of the decode routing passes in the timed steps */
  long route_calls;      /* and their count */
  long mig[4];           /* tiered: promotions, demotions, quantizations, evictions in them */
  double ar_ms;          /* NCCL all-reduce time over the timed decode steps */
  long ar_calls;         /* and their count */
} lc_rank_t;

/* A rank's status at an agreement point (tp_allgather over the CPU comm). */
typedef struct {
  int32_t rc, val;
  char msg[200];
} lc_vote_t;

/* A rank's numbers at the end, gathered by rank 0. */
typedef struct {
  double gpu_used_gb, ar_ms;
  uint64_t slot_bytes;
  int64_t ar_calls;
  int64_t units_total, units_peak; /* the KV pool (kv_gpu_pool_usage) */
  int32_t err_flags;               /* tiered: kv_gpu_stats' err_flags (a pool ran dry, ...) */
} lc_report_t;

static pid_t lc_pids[LC_MAX_TP]; /* rank 0: the forked ranks 1..tp-1 (0: none) */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse_flag(lc_args_t *a, const char *f, const char *v) {
  if (!strcmp(f, "--shape"))
    a->shape = v;
  else if (!strcmp(f, "--policy"))
    a->policy = v;
  else if (!strcmp(f, "--ctx"))
    a->ctx = atoi(v);
  else if (!strcmp(f, "--new"))
    a->n_new = atoi(v);
  else if (!strcmp(f, "--device"))
    a->device = atoi(v);
  else if (!strcmp(f, "--max-seqs"))
    a->max_seqs = atoi(v);
  else if (!strcmp(f, "--tp"))
    a->tp = atoi(v);
  else if (!strcmp(f, "--budget"))
    a->budget = atof(v);
  else if (!strcmp(f, "--reserve-gb"))
    a->reserve_gb = atof(v);
  else if (!strcmp(f, "--key-frame") && (!strcmp(v, "pos") || !strcmp(v, "abs")))
    a->key_frame = strcmp(v, "pos") ? KV_KEY_FRAME_ABS : KV_KEY_FRAME_POS;
  else
    return fprintf(stderr, "long_ctx: unknown option %s\n", f), 2;
  return 0;
}

static int parse(int argc, char **argv, lc_args_t *a) {
  *a = (lc_args_t){"llama3-8b", "full", 32768, 32, 0, 0, 1, 0.2, 4.0, -1};
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return fprintf(stderr, "long_ctx: %s needs a value\n", argv[i]), 2;
    if (parse_flag(a, argv[i], argv[i + 1])) return 2;
  }
  if (a->ctx < 64 || a->n_new < 1 || a->budget <= 0 || a->budget > 1 || a->device < 0)
    return fprintf(stderr, "long_ctx: bad --ctx, --new, --budget or --device\n"), 2;
  if (a->tp < 1 || a->tp > LC_MAX_TP)
    return fprintf(stderr, "long_ctx: --tp must be in 1..%d\n", LC_MAX_TP), 2;
#ifndef QE_HAVE_NCCL
  if (a->tp > 1)
    return fprintf(stderr,
                   "long_ctx: --tp %d needs NCCL, and this build has none (nccl.h and "
                   "libnccl were not found at configure time)\n",
                   a->tp),
           2;
#endif
  return 0;
}

/* A cache of n slots; *per_slot: its device bytes per slot (pool share). */
static int make_cache(const lc_args_t *a, kern_backend_t *be, const model_t *m, int n,
                      kv_cache_t **kv) {
  kv_geom_t g = model_kv_geom(m, n);
  int cap = a->ctx + a->n_new;
  if (!strcmp(a->policy, "full"))
    return kv_gpu_create(be, &g, KV_GPU_OMEGA, cap, kv_gpu_pool_bytes(&g, KV_GPU_OMEGA, n, cap),
                         kv);
  kv_policy_desc_t d;
  int rc = kv_policy_find(a->policy, &d);
  if (a->key_frame >= 0) d.cfg.quant.key_frame = a->key_frame;
  return rc ? rc
            : kv_gpu_create_tiered(be, &g, &model_hparams(m)->rope, &d.cfg, cap, n, a->budget, 0,
                                   kv);
}

/* Device bytes a cache of n slots takes (made and destroyed), or 0 when it does not fit. */
static size_t cache_cost(const lc_args_t *a, kern_backend_t *be, const model_t *m, int n) {
  size_t f0 = 0, f1 = 0, total = 0;
  kv_cache_t *kv = NULL;
  kern_cuda_mem_info(be, &f0, &total);
  if (make_cache(a, be, m, n, &kv)) return 0;
  kern_cuda_mem_info(be, &f1, &total);
  kv_cache_destroy(kv);
  return f0 > f1 ? f0 - f1 : 1;
}

/* The most slots whose cache fits in the free memory less the reserve: the per-slot and fixed
 * costs from caches of k and 2k slots (k 8, or 1 where 16 slots do not fit: FullKV at 32K on
 * an 80 GB card), then creation from that estimate downwards. */
static int fit_slots(const lc_args_t *a, kern_backend_t *be, const model_t *m, kv_cache_t **kv) {
  size_t free_b = 0, total = 0, reserve = (size_t)(a->reserve_gb * (1 << 30));
  int k = 8;
  size_t c1 = cache_cost(a, be, m, k), c2 = c1 ? cache_cost(a, be, m, 2 * k) : 0;
  if (!c2) k = 1, c1 = cache_cost(a, be, m, 1), c2 = c1 ? cache_cost(a, be, m, 2) : 0;
  if (k == 1 && c1 && !c2) /* one slot and no second */
    return make_cache(a, be, m, 1, kv) ? qe_errf(QE_ENOSPC, "long_ctx: not even one slot fits") : 1;
  if (kern_cuda_mem_info(be, &free_b, &total) || !c1 || !c2 || free_b <= reserve + c1)
    return qe_errf(QE_ENOSPC, "long_ctx: no memory left for a cache");
  size_t per = c2 > c1 ? (c2 - c1) / k : c1 / k, fixed = c1 > k * per ? c1 - k * per : 0;
  int n = (int)((free_b - reserve - fixed) / per), rc = 0;
  if (a->max_seqs > 0 && n > a->max_seqs) n = a->max_seqs;
  for (; n > 0; n -= n / 32 > 1 ? n / 32 : 1) {
    if (!(rc = make_cache(a, be, m, n, kv))) return n;
    if (rc != QE_ENOSPC) return rc;
  }
  return qe_errf(QE_ENOSPC, "long_ctx: not even one slot fits");
}

/* Fills slot s with ctx tokens of the given K/V rows on every layer, then the prefill path with
 * the last n_obs positions as queries (scores and routing as after a prompt). */
static int fill_slot(kv_cache_t *kv, int s, int ctx, int cap, const float *k, const float *v,
                     float *q, float *out) {
  int rc = kv->ops->seq_open(kv, s, cap), n_obs = 32;
  for (int l = 0; !rc && l < kv->geom.n_layer; l++) {
    rc = kv->ops->store(kv, s, l, 0, ctx, k, v);
    kv_attn_req_t r = {s, ctx - n_obs, n_obs, q, out};
    if (!rc) rc = kv->ops->attend(kv, l, &r, 1);
  }
  return rc;
}

static int random_rows(kern_backend_t *be, size_t n, float **out) {
  float *h = malloc(sizeof(float) * n);
  uint64_t st = 0x6c6f6e67ULL;
  if (!h || !(*out = kern_alloc(be, sizeof(float) * n))) return free(h), QE_ENOMEM;
  for (size_t i = 0; i < n; i++) h[i] = kern_rng_uniform(&st) * 2.0f - 1.0f;
  int rc = be->ops->upload(be, *out, h, sizeof(float) * n);
  free(h);
  return rc;
}

/* The fill rows of this rank's cache geometry (random_rows: the same values on every rank). */
static int make_rows(const lc_args_t *a, lc_rank_t *r) {
  const kv_geom_t *g = &r->kv->geom;
  size_t row = (size_t)g->n_kv_head * g->head_dim, qn = (size_t)32 * g->n_head * g->head_dim;
  int rc = random_rows(r->be, row * (size_t)a->ctx, &r->k);
  if (!rc) rc = random_rows(r->be, row * (size_t)a->ctx, &r->v);
  if (!rc) rc = random_rows(r->be, qn, &r->q);
  if (!rc && !(r->o = kern_alloc(r->be, sizeof(float) * qn)))
    rc = qe_errf(QE_ENOMEM, "long_ctx: no device memory for the fill rows");
  return rc;
}

/* Rank 0 with T > 1: a forked rank that exits before the final report has failed or crashed
 * mid-run, and the others may wait on it in NCCL forever: stop them all and exit 1. Async-signal
 * safe (write, kill, _exit). */
static void kill_ranks(void) {
  for (int r = 1; r < LC_MAX_TP; r++)
    if (lc_pids[r] > 0) kill(lc_pids[r], SIGKILL);
}

static void on_rank_exit(int sig) {
  static const char msg[] = "long_ctx: a tensor-parallel rank exited mid-run; stopped the others\n";
  int saved = errno, st, ours = 0;
  (void)sig;
  for (int r = 1; r < LC_MAX_TP; r++) /* a child of a library is not ours: not reaped */
    if (lc_pids[r] > 0 && waitpid(lc_pids[r], &st, WNOHANG) == lc_pids[r]) ours = 1, lc_pids[r] = 0;
  errno = saved;
  if (!ours) return;
  if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {
  }
  kill_ranks();
  _exit(1);
}

/* Arms (on = 1) or disarms rank 0's watchdog on its forked ranks (SIGCHLD). */
static void watch_ranks(int on) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on ? on_rank_exit : SIG_DFL;
  sa.sa_flags = SA_NOCLDSTOP;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
}

/* A failure where the other ranks may be blocked in NCCL and cannot be told (joining it,
 * decoding). With one rank, returns rc; otherwise prints it and ends this process: rank 0 stops
 * the forked ranks first, a forked rank leaves that to rank 0's watchdog. */
static int fatal(const tp_comm_t *c, int rc) {
  if (c->size == 1) return rc;
  fprintf(stderr, "long_ctx: rank %d: %s (%s)\n", c->rank, qe_strerror(rc), qe_errmsg());
  fflush(stderr);
  if (c->rank == 0) watch_ranks(0), kill_ranks();
  _exit(1);
}

/* Collective agreement point: each rank gives its status rc (0 or QE_E*) and a value. Returns 0
 * on every rank with *min_val the smallest value, or, on every rank, the lowest failing rank's
 * rc with its detail message ("rank r: ..."), or this rank's QE_ECOMM for a broken link. */
static int agree(tp_comm_t *c, int rc, int val, int *min_val) {
  lc_vote_t mine = {rc, val, ""}, all[LC_MAX_TP];
  if (rc) snprintf(mine.msg, sizeof mine.msg, "%s", qe_errmsg());
  int grc = tp_allgather(c, &mine, all, sizeof mine);
  if (grc) return grc;
  *min_val = val;
  for (int r = 0; r < c->size; r++) {
    if (all[r].rc && c->size == 1) return qe_errf(all[r].rc, "%s", all[r].msg);
    if (all[r].rc) return qe_errf(all[r].rc, "rank %d: %s", r, all[r].msg);
    if (all[r].val < *min_val) *min_val = all[r].val;
  }
  return 0;
}

/* This rank's backend on GPU (device + rank) mod the visible count (one GPU per rank), and its
 * shard of the random model. After the fork: no CUDA state crosses one. */
static int load_rank(const lc_args_t *a, const tp_comm_t *c, lc_rank_t *r) {
  model_hparams_t hp;
  int n_dev = kern_cuda_device_count(), rc = model_shape_named(a->shape, &hp);
  if (!rc && (a->device >= n_dev || c->size > n_dev))
    rc = qe_errf(QE_EINVAL, "--device %d, --tp %d: %d CUDA device(s) visible, one per rank",
                 a->device, c->size, n_dev);
  if (!rc) rc = kern_cuda_create((a->device + c->rank) % n_dev, &r->be);
  model_load_opts_t mo = {r->be, c->rank, c->size, a->ctx > 4096 ? 4096 : a->ctx, 0};
  if (!rc) rc = model_create_random(&hp, 1, &mo, &r->m);
  return rc;
}

/* T > 1: every rank joins an NCCL communicator of the group (rank 0 makes the id and broadcasts
 * it over c) ordered on its backend's stream, with all-reduce timing on; c->dev points at it.
 * Returns 0 or an agreed error; failing to join is fatal (the others wait inside NCCL). */
static int join_nccl(tp_comm_t *c, lc_rank_t *r) {
#ifdef QE_HAVE_NCCL
  unsigned char id[TP_NCCL_ID_BYTES] = {0};
  int unused, rc = agree(c, c->rank == 0 ? tp_comm_nccl_unique_id(id) : 0, 0, &unused);
  if (!rc) rc = tp_broadcast(c, id, sizeof id, 0);
  if (rc) return rc;
  rc = tp_comm_create_nccl(id, c->rank, c->size, kern_cuda_device(r->be), &r->nc);
  if (!rc) rc = tp_comm_nccl_set_stream(r->nc, kern_cuda_stream(r->be));
  if (!rc) rc = tp_comm_nccl_timing(r->nc, 1);
  if (!rc) c->dev = r->nc;
  return rc ? fatal(c, rc) : 0;
#else
  (void)r;
  return qe_errf(QE_EUNSUPPORTED, "--tp %d needs NCCL, and this build has none", c->size);
#endif
}

/* The cache at exactly n slots (recreated when fit_slots made more here), then every slot
 * filled; rank 0's fill time in r->fill_s. */
static int fill_rank(const lc_args_t *a, lc_rank_t *r, int n) {
  int rc = 0;
  if (n != r->n_fit) {
    kv_cache_destroy(r->kv);
    r->kv = NULL;
    rc = make_cache(a, r->be, r->m, n, &r->kv);
  }
  r->n = rc ? 0 : n;
  if (!rc) rc = make_rows(a, r);
  double t0 = now_s();
  for (int s = 0; !rc && s < n; s++)
    rc = fill_slot(r->kv, s, a->ctx, a->ctx + a->n_new, r->k, r->v, r->q, r->o);
  r->fill_s = now_s() - t0;
  return rc;
}

/* Total NCCL all-reduce milliseconds and count so far (0 without NCCL). Waits for them. */
static int ar_time(lc_rank_t *r, double *ms, long *calls) {
  *ms = 0, *calls = 0;
#ifdef QE_HAVE_NCCL
  if (r->nc) return tp_comm_nccl_time(r->nc, ms, calls);
#endif
  return 0;
}

/* The decode routing passes so far (0 for FullKV): GPU ms and count. Waits for the device. */
static int route_time(lc_rank_t *r, double *ms, long *calls) {
  double m[2];
  long n[2];
  *ms = 0, *calls = 0;
  if (!kv_gpu_is_tiered(r->kv)) return 0;
  int rc = kv_gpu_routing_time(r->kv, m, n);
  if (!rc) *ms = m[1], *calls = n[1];
  return rc;
}

/* The slots' migrations so far, summed (tiered; zeros for FullKV): promotions, demotions,
 * quantizations, evictions. Reads the device. */
static int mig_totals(lc_rank_t *r, long out[4]) {
  kv_gpu_stats_t st;
  out[0] = out[1] = out[2] = out[3] = 0;
  for (int s = 0; kv_gpu_is_tiered(r->kv) && s < r->n; s++) {
    int rc = kv_gpu_stats(r->kv, s, &st);
    if (rc) return rc;
    out[0] += st.promotions, out[1] += st.demotions;
    out[2] += st.quantizations, out[3] += st.evictions;
  }
  return 0;
}

/* $QE_LC_PROFILE "A:B": the CUDA profiler's range covers decode steps A..B (ncu
 * --profile-from-start off); first and last step, or -1 when unset or malformed. */
static void profile_steps(int *first, int *last) {
  const char *e = getenv("QE_LC_PROFILE");
  *first = *last = -1;
  if (e && sscanf(e, "%d:%d", first, last) != 2) *first = *last = -1;
}

/* Decodes a->n_new tokens in every slot (collective): per step rank 0 broadcasts the batch's ids
 * over c, then rank 0 runs model_forward_greedy (the next ids) and the others model_forward.
 * Sets r->step_s (mean step on this rank, the first excluded: it warms the GEMM plans) and
 * r->ar_ms, r->ar_calls (the NCCL all-reduces of the timed steps only). */
static int decode(const lc_args_t *a, tp_comm_t *c, lc_rank_t *r) {
  int n = r->n, rc = 0, steps = a->n_new;
  int32_t *tok = calloc((size_t)n, 4), *pos = calloc((size_t)n, 4), *seq = calloc((size_t)n, 4);
  if (!tok || !pos || !seq) rc = qe_errf(QE_ENOMEM, "long_ctx: out of memory");
  double t0 = 0, ms0 = 0, rms0 = 0;
  long calls0 = 0, rcalls0 = 0, mig0[4] = {0};
  int pf, pl;
  profile_steps(&pf, &pl);
  for (int t = 0; !rc && t < steps; t++) {
    if (t == 1 && !(rc = ar_time(r, &ms0, &calls0)) && !(rc = route_time(r, &rms0, &rcalls0)) &&
        !(rc = mig_totals(r, mig0)))
      t0 = now_s();
    if (t == pf) rc = kern_cuda_profile(r->be, 1);
    for (int i = 0; i < n; i++) pos[i] = a->ctx + t, seq[i] = i;
    model_batch_t b = {n, tok, pos, seq, NULL};
    if (!rc) rc = tp_broadcast(c, tok, sizeof(int32_t) * (size_t)n, 0);
    if (!rc)
      rc = c->rank ? model_forward(r->m, r->kv, c, &b, NULL)
                   : model_forward_greedy(r->m, r->kv, c, &b, tok);
    if (!rc && t == pl) rc = kern_cuda_profile(r->be, 0);
  }
  r->step_s = steps > 1 ? (now_s() - t0) / (steps - 1) : 0;
  if (!rc && steps > 1 && !(rc = route_time(r, &r->route_ms, &r->route_calls)))
    r->route_ms -= rms0, r->route_calls -= rcalls0;
  if (!rc && steps > 1 && !(rc = mig_totals(r, r->mig)))
    for (int i = 0; i < 4; i++) r->mig[i] -= mig0[i];
  if (!rc && steps > 1 && !(rc = ar_time(r, &r->ar_ms, &r->ar_calls)))
    r->ar_ms -= ms0, r->ar_calls -= calls0;
  free(tok), free(pos), free(seq);
  return rc;
}

/* The CPU comm's I/O timeout (T > 1): generous while the ranks load, fit and fill at their own
 * speeds (a 70B shard takes a while), the default while they decode in lockstep. */
static void set_timeout(tp_comm_t *c, int ms) {
  if (c->size > 1) tp_comm_cpu_set_timeout(c, ms);
}

/* One rank's run, collective over c: load, join NCCL (T > 1), fit a cache, agree on the slots
 * (the minimum over ranks), fill, decode. Returns 0 or an error every rank agreed on (a QE_ECOMM
 * may be this rank's alone); failures while others may be inside NCCL end the process. */
static int run_rank(const lc_args_t *a, tp_comm_t *c, lc_rank_t *r) {
  set_timeout(c, LC_SETUP_TIMEOUT_MS);
  int n = 0, rc = agree(c, load_rank(a, c, r), 0, &n);
  if (!rc && c->size > 1) rc = join_nccl(c, r);
  if (!rc) {
    int frc = (r->n_fit = fit_slots(a, r->be, r->m, &r->kv)) < 0 ? r->n_fit : 0;
    rc = agree(c, frc, frc ? 0 : r->n_fit, &n);
  }
  int unused;
  if (!rc) rc = agree(c, fill_rank(a, r, n), 0, &unused);
  set_timeout(c, TP_COMM_DEFAULT_TIMEOUT_MS);
  if (!rc && (rc = decode(a, c, r))) rc = fatal(c, rc);
  return rc;
}

/* Gathers every rank's numbers into all[size] (collective; rank 0 prints them). */
static int gather_reports(tp_comm_t *c, const lc_rank_t *r, lc_report_t *all) {
  lc_report_t mine = {0, r->ar_ms, 0, r->ar_calls, 0, 0, 0};
  size_t free_b = 0, total = 0;
  if (r->be && !kern_cuda_mem_info(r->be, &free_b, &total))
    mine.gpu_used_gb = (double)(total - free_b) / (1 << 30);
  if (r->kv && r->n > 0) mine.slot_bytes = r->kv->ops->seq_bytes(r->kv, 0);
  kv_gpu_pool_t pu;
  kv_gpu_stats_t st;
  if (r->kv && !kv_gpu_pool_usage(r->kv, &pu))
    mine.units_total = pu.units_total, mine.units_peak = pu.units_peak;
  if (r->kv && r->n > 0 && kv_gpu_is_tiered(r->kv) && !kv_gpu_stats(r->kv, 0, &st))
    mine.err_flags = st.err_flags;
  return tp_allgather(c, &mine, all, sizeof mine);
}

static void rank_free(lc_rank_t *r, tp_comm_t *c) {
  if (r->m) model_set_graphs(r->m, 0); /* graphs that recorded NCCL calls go before r->nc */
  tp_comm_destroy(c);
  tp_comm_destroy(r->nc);
  if (r->be) kern_free(r->be, r->k), kern_free(r->be, r->v), kern_free(r->be, r->q);
  if (r->be) kern_free(r->be, r->o);
  kv_cache_destroy(r->kv);
  model_destroy(r->m);
  kern_destroy(r->be);
}

/* A forked rank > 0: runs with rank 0 over its socket fd, reports, exits 0 or 1 (rank 0 prints
 * the agreed error; this rank prints only what it cannot report). */
static int run_follower(const lc_args_t *a, int rank, int fd) {
  tp_comm_t *c = NULL;
  lc_rank_t r = {0};
  lc_report_t all[LC_MAX_TP];
  int fds[1] = {fd}, rc = tp_comm_create_cpu_fds(fds, rank, a->tp, &c);
  if (rc)
    return fprintf(stderr, "long_ctx: rank %d: %s (%s)\n", rank, qe_strerror(rc), qe_errmsg()), 1;
  rc = run_rank(a, c, &r);
  int grc = gather_reports(c, &r, all);
  rank_free(&r, c);
  return rc || grc ? 1 : 0;
}

/* Rank 0: forks ranks 1..tp-1 (lc_pids), each linked to it by a socketpair, arms the watchdog
 * and makes *c; with tp 1, the single-rank communicator. Before any CUDA call. */
static int spawn_ranks(const lc_args_t *a, tp_comm_t **c) {
  int fds[LC_MAX_TP] = {-1}, sv[2], rc = 0;
  if (a->tp == 1) return tp_comm_create_single(c);
  for (int r = 1; !rc && r < a->tp; r++) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) rc = qe_errf(QE_ECOMM, "socketpair failed");
    fflush(NULL);
    if (!rc && (lc_pids[r] = fork()) < 0)
      lc_pids[r] = 0, close(sv[0]), close(sv[1]), rc = qe_errf(QE_ECOMM, "fork failed");
    if (!rc && lc_pids[r] == 0) {
      close(sv[0]);
      for (int j = 1; j < r; j++) close(fds[j]);
      _exit(run_follower(a, r, sv[1]));
    }
    if (!rc) close(sv[1]), fds[r] = sv[0];
  }
  for (int r = 1; rc && r < a->tp; r++)
    if (lc_pids[r] > 0) close(fds[r]); /* the forked ranks see the link close and stop */
  if (!rc) watch_ranks(1);
  return rc ? rc : tp_comm_create_cpu_fds(fds, 0, a->tp, c);
}

/* Reaps the forked ranks, killing any still there after 30 s. QE_ECOMM if one failed. */
static int wait_ranks(int tp) {
  int bad = 0;
  double end = now_s() + 30;
  for (int r = 1; r < tp; r++) {
    int st = 0;
    pid_t w = 0;
    while (lc_pids[r] > 0 && (w = waitpid(lc_pids[r], &st, WNOHANG)) == 0 && now_s() < end)
      usleep(10000);
    if (lc_pids[r] > 0 && w == 0) kill(lc_pids[r], SIGKILL), w = waitpid(lc_pids[r], &st, 0);
    if (lc_pids[r] > 0 && (w <= 0 || !WIFEXITED(st) || WEXITSTATUS(st))) bad = 1;
  }
  return bad ? qe_errf(QE_ECOMM, "a tensor-parallel rank failed") : 0;
}

/* A line on stderr for each rank whose tiered cache raised err_flags (kv_gpu_stats): a pool ran
 * dry or a routing pass had more migrations than its job lists hold, so the run measured a cache
 * that did less than its decisions asked. */
static void warn_flags(const lc_args_t *a, const lc_report_t *all) {
  for (int i = 0; i < a->tp; i++)
    if (all[i].err_flags)
      fprintf(stderr,
              "long_ctx: warning: rank %d's cache raised err_flags %d (1 pages, 2 ledgers ran dry; "
              "4 too many windows; 8 migration job lists full: promotions past the cap wait for a "
              "later pass, demotions past three rounds of it become evictions)\n",
              i, all[i].err_flags);
}

/* The JSON line: the top-level slot_bytes and gpu_used_gb are rank 0's (a shard's with T > 1),
 * the ranks array has every rank's (with its KV pool's units, peak and, tiered, err_flags:
 * non-zero when a pool ran dry); all-reduce and routing numbers cover the timed decode steps
 * only (route_ms_per_step: rank 0's routing passes' GPU time over the timed steps). */
static void print_json(const lc_args_t *a, const lc_rank_t *r, const lc_report_t *all) {
  int timed = a->n_new > 1 ? a->n_new - 1 : 1;
  printf("{\"bench\":\"long_ctx\",\"shape\":\"%s\",\"policy\":\"%s\",\"key_frame\":\"%s\","
         "\"budget\":%.3f,\"ctx\":%d,"
         "\"sequences\":%d,\"slot_bytes\":%llu,\"fill_s\":%.2f,\"step_ms\":%.3f,"
         "\"tokens_per_s\":%.1f,\"gpu_used_gb\":%.2f,\"tp\":%d,\"allreduce_ms_per_step\":%.4f,"
         "\"allreduce_calls_per_step\":%.1f,\"route_ms_per_step\":%.3f,\"route_passes\":%ld,"
         "\"promotions\":%ld,\"demotions\":%ld,\"quantizations\":%ld,\"evictions\":%ld,"
         "\"ranks\":[",
         a->shape, a->policy, a->key_frame == KV_KEY_FRAME_POS ? "pos" : "policy's",
         strcmp(a->policy, "full") ? a->budget : 1.0, a->ctx, r->n,
         (unsigned long long)all[0].slot_bytes, r->fill_s, r->step_s * 1e3,
         r->step_s > 0 ? r->n / r->step_s : 0.0, all[0].gpu_used_gb, a->tp, r->ar_ms / timed,
         (double)r->ar_calls / timed, r->route_ms / timed, r->route_calls, r->mig[0], r->mig[1],
         r->mig[2], r->mig[3]);
  for (int i = 0; i < a->tp; i++)
    printf("%s{\"rank\":%d,\"gpu_used_gb\":%.2f,\"slot_bytes\":%llu,\"allreduce_ms\":%.3f,"
           "\"pool_units\":%lld,\"pool_units_peak\":%lld,\"pool_err_flags\":%d}",
           i ? "," : "", i, all[i].gpu_used_gb, (unsigned long long)all[i].slot_bytes, all[i].ar_ms,
           (long long)all[i].units_total, (long long)all[i].units_peak, all[i].err_flags);
  printf("]}\n");
}

int main(int argc, char **argv) {
  lc_args_t a;
  if (parse(argc, argv, &a)) return 2;
  tp_comm_t *c = NULL;
  lc_rank_t r = {0};
  lc_report_t all[LC_MAX_TP];
  char msg[256] = "";
  int rc = spawn_ranks(&a, &c);
  if (!rc) rc = run_rank(&a, c, &r);
  if (rc) snprintf(msg, sizeof msg, "%s", qe_errmsg());
  watch_ranks(0); /* the forked ranks exit after the report */
  int grc = c ? gather_reports(c, &r, all) : QE_ECOMM;
  if (!rc && grc) rc = grc, snprintf(msg, sizeof msg, "%s", qe_errmsg());
  if (!rc) print_json(&a, &r, all), warn_flags(&a, all);
  rank_free(&r, c);
  int wrc = wait_ranks(a.tp);
  if (!rc && wrc) rc = wrc, snprintf(msg, sizeof msg, "%s", qe_errmsg());
  if (rc) fprintf(stderr, "long_ctx: %s (%s)\n", qe_strerror(rc), msg);
  return rc ? 1 : 0;
}
