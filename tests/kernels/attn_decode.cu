/* attn_decode: checks the GPU decode attention over tiered paged KV (kc_attn_decode) against
 * the fp64 CPU reference (attn_ref.c), and with --bench times it.
 *
 *   attn_decode [--small] [--bench [--shapes SUBSTR[,SUBSTR...]] [--tma] [--pipes]] [--only NAME]
 * Check (default): fresh random problems of several shapes (GQA, MHA, head_dim 64 and 128,
 * omega 4/8/16/32, partial windows, FULL/QUANT/EVICTED mixes, INT2/4/8, NORM and NEOX RoPE, keys
 * pre-RoPE and post-RoPE (abs_keys)), each
 * run with the automatic chunking and with small chunks, outputs poisoned (NaN) before every
 * run; passes when ||out - ref|| / ||ref|| < 1e-2, every mass is within 1e-3 of the reference,
 * nothing is NaN/Inf and a repeated run is bitwise identical. --small: a few small cases (for
 * compute-sanitizer). Exit 0 on success, 1 on any failure, 77 without a CUDA device.
 * Bench: device-to-device copy bandwidth, then FullKV at B=32 S=1280 and B=8 S=32768 and the
 * tiered 20% budget (q = 0.7, INT2) at B=8 S=32768 (GQA 32/8, d=128, windows of 16 and of 8,
 * QEvict's default; abs_*: the same with post-RoPE INT2 keys; --shapes: only the shapes whose
 * name contains one of the SUBSTRs; FullKV shapes also time the kernel without masses, as the
 * engine's FullKV cache calls it, two reads of the same bytes, the shape's read roofline: a plain
 * stream and the chunk kernel's own access pattern, and the chunk kernel's cp.async pipeline
 * alone with a stand-in for the work a tile at five sizes, then a warp-specialized one on sm_90):
 * CUDA events
 * around each call, warm-up, median; inputs rotated so that repeated calls do not hit L2; one
 * JSON line per measurement and a table at the end. Two timings of the copy, the automatic
 * chunking, FullKV without masses and the streaming read: "ms" from an idle GPU (the host's
 * submission of the launch falls between the events, as ../shared/peers/peers.py times torch)
 * and "ms_gpu", the launch queued behind a kernel that holds the stream until the host has
 * enqueued it (bench_block; nvbench's method), the GPU's own time. --tma adds a pipeline of
 * Hopper tensor copies to the FullKV shapes' pipelines, --pipes times only those reads and
 * pipelines, $QE_BENCH_QUICK=1 times one launch a measurement (for compute-sanitizer),
 * $ATTN_FIXED=M also times the automatic chunking as CUDA graph steps launch it (bench_fixed),
 * $ATTN_CPV=1 the cp.async pipeline's ring depths and tile sizes against spin (bench_cpv). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

extern "C" {
#include "attn_ref.h"
#include "qe_status.h"
}
#include "cuda_check.h"
#include "kern_cuda_attn.h"

#define CKQ(call)                                                                                  \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_) {                                                                                     \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, qe_strerror(rc_),          \
              qe_errmsg());                                                                        \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* ---------------------------------------------------------------- device copies of a problem */

struct Dev {
  uint8_t *arena = nullptr;
  kern_pwin_t *win = nullptr;
  int32_t *seq_win = nullptr;
  float *q = nullptr, *out = nullptr, *mass = nullptr, *rope = nullptr;
  uint32_t *tickets = nullptr; /* [n_seq], zeroed (kc_attn_args_t.tickets) */
  void *ws = nullptr;
  size_t ws_bytes = 0;
};

static void dev_free(Dev *d) {
  cudaFree(d->arena), cudaFree(d->win), cudaFree(d->seq_win), cudaFree(d->q), cudaFree(d->out);
  cudaFree(d->mass), cudaFree(d->rope), cudaFree(d->ws), cudaFree(d->tickets);
  *d = Dev();
}

template <class T> static T *dev_upload(const T *h, size_t n) {
  T *d = nullptr;
  CK(cudaMalloc((void **)&d, sizeof(T) * (n ? n : 1)));
  if (n) CK(cudaMemcpy(d, h, sizeof(T) * n, cudaMemcpyHostToDevice));
  return d;
}

/* Zeroed ticket counters for n sequences. */
static uint32_t *dev_tickets(int n) {
  uint32_t *t = nullptr;
  CK(cudaMalloc((void **)&t, sizeof(uint32_t) * n));
  CK(cudaMemset(t, 0, sizeof(uint32_t) * n));
  return t;
}

/* Arguments for prob on device copies d (workspace sized for the largest chunking used);
 * tickets 0: none (every sequence's masses through the combine kernel). */
static kc_attn_args_t dev_args(const attn_prob_t *pr, Dev *d, int chunk_win, int tickets = 1) {
  kc_attn_args_t a;
  memset(&a, 0, sizeof a);
  std::vector<float> tab(pr->geom.head_dim + 2);
  CKQ(kc_attn_rope_init(&pr->rope, tab.data(), &a.rope));
  if (!d->rope) d->rope = dev_upload(tab.data(), tab.size());
  a.rope.table = d->rope;
  a.geom = pr->geom, a.n_seq = pr->n_seq, a.n_head = pr->n_head, a.scale = pr->scale;
  a.arena = d->arena, a.win = d->win, a.seq_win = d->seq_win, a.n_win = pr->n_win;
  a.max_win = pr->max_win, a.has_quant = pr->has_quant, a.q = d->q, a.out = d->out;
  a.mass = d->mass, a.chunk_win = chunk_win, a.abs_keys = pr->abs_keys;
  a.tickets = tickets ? d->tickets : nullptr;
  size_t need = 0;
  CKQ(kc_attn_ws_bytes(&a, &need));
  if (need > d->ws_bytes) {
    CK(cudaFree(d->ws));
    CK(cudaMalloc(&d->ws, need));
    d->ws_bytes = need;
  }
  a.ws = d->ws, a.ws_bytes = d->ws_bytes;
  return a;
}

static void dev_load(const attn_prob_t *pr, Dev *d) {
  d->arena = dev_upload(pr->arena, pr->arena_bytes);
  d->win = dev_upload(pr->win, (size_t)pr->n_win);
  d->seq_win = dev_upload(pr->seq_win, (size_t)pr->n_seq + 1);
  d->q = dev_upload(pr->q, (size_t)pr->n_seq * pr->n_head * pr->geom.head_dim);
  CK(cudaMalloc((void **)&d->out, sizeof(float) * pr->n_seq * pr->n_head * pr->geom.head_dim));
  CK(cudaMalloc((void **)&d->mass, sizeof(float) * (pr->n_win + 1)));
  d->tickets = dev_tickets(pr->n_seq);
}

/* ---------------------------------------------------------------- check */

struct Case {
  const char *name;
  int n_head, n_kv, hd, omega, bits, group, mode, n_rot;
  float theta;
  int sink, n_local;
  double p_full, p_quant;
  std::vector<int> lens;
  int small;
  int yarn = 0;
  int abs_keys = 0; /* QUANT keys post-RoPE (kc_attn_args_t.abs_keys) */
};

/* One run: poisons, launches, downloads, compares (with keep's earlier run, bitwise, when set);
 * tickets 0: without ticket counters; acc: masses accumulated onto 0.25 (taken off again);
 * nomass: a call without masses (the outputs alone are checked). Returns 1 on failure. */
static int check_run(const Case &cs, const attn_prob_t *pr, Dev *d, int chunk_win,
                     const std::vector<double> &ref, const std::vector<double> &rmass,
                     std::vector<float> *keep, int tickets = 1, int acc = 0, int nomass = 0) {
  const size_t n_out = (size_t)pr->n_seq * pr->n_head * pr->geom.head_dim;
  const int n_tk = pr->n_seq;
  kc_attn_args_t a = dev_args(pr, d, chunk_win, tickets);
  a.flags = acc ? KC_ATTN_MASS_ACCUMULATE : 0;
  if (nomass) a.mass = nullptr;
  CK(cudaMemset(d->out, 0xff, sizeof(float) * n_out)); /* NaN */
  CK(cudaMemset(d->mass, 0xff, sizeof(float) * (pr->n_win + 1)));
  if (acc) {
    const std::vector<float> quarter(pr->n_win + 1, 0.25f);
    CK(cudaMemcpy(d->mass, quarter.data(), sizeof(float) * quarter.size(),
                  cudaMemcpyHostToDevice));
  }
  CKQ(kc_attn_decode(&a, nullptr));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> out(n_out + pr->n_win);
  CK(cudaMemcpy(out.data(), d->out, sizeof(float) * n_out, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(out.data() + n_out, d->mass, sizeof(float) * pr->n_win, cudaMemcpyDeviceToHost));
  for (int w = 0; acc && w < pr->n_win; w++) out[n_out + w] -= 0.25f;
  std::vector<uint32_t> tk(n_tk);
  CK(cudaMemcpy(tk.data(), d->tickets, sizeof(uint32_t) * n_tk, cudaMemcpyDeviceToHost));
  double num = 0, den = 0, merr = 0;
  int bad = 0, zero_bad = 0, same = 1, tk_left = 0;
  for (int b = 0; b < n_tk; b++) tk_left += tk[b] != 0; /* each call leaves them zero */
  for (size_t i = 0; i < n_out; i++) {
    bad += !isfinite(out[i]);
    num += (out[i] - ref[i]) * (out[i] - ref[i]), den += ref[i] * ref[i];
  }
  for (int w = 0; w < pr->n_win && !nomass; w++) {
    bad += !isfinite(out[n_out + w]);
    merr = fmax(merr, fabs(out[n_out + w] - rmass[w]));
    zero_bad += !kern_pwin_live(&pr->win[w]) && out[n_out + w] != 0.0f;
  }
  if (!keep->empty()) /* (without masses: the outputs) */
    same = !memcmp(keep->data(), out.data(), sizeof(float) * (nomass ? n_out : out.size()));
  *keep = out;
  const double err = den > 0 ? sqrt(num / den) : sqrt(num);
  const int fail = bad || zero_bad || !same || tk_left || !(err < 1e-2) || !(merr < 1e-3);
  printf("%s %-36s chunk %4d (%d)%s%s%s  err %.2e  mass %.2e  nonfinite %d  evicted!=0 %d  "
         "tickets!=0 %d  repeat %s\n",
         fail ? "FAIL" : "ok  ", cs.name, chunk_win, kc_attn_chunk_win(&a),
         tickets ? "" : " no tickets", acc ? " acc" : "", nomass ? " no masses" : "", err, merr,
         bad, zero_bad, tk_left, same ? "same" : "DIFFERS");
  fflush(stdout);
  return fail;
}

static int check_case(const Case &cs, uint64_t seed) {
  attn_spec_t s;
  memset(&s, 0, sizeof s);
  s.geom = {cs.n_kv, cs.hd, cs.omega, cs.bits, cs.group};
  s.n_seq = (int)cs.lens.size(), s.n_head = cs.n_head;
  s.rope_mode = cs.mode, s.n_rot = cs.n_rot, s.rope_theta = cs.theta;
  s.rope_yarn = cs.yarn, s.abs_keys = cs.abs_keys;
  s.seq_len = cs.lens.data(), s.sink = cs.sink, s.n_local = cs.n_local;
  s.p_full = cs.p_full, s.p_quant = cs.p_quant, s.n_full = -1, s.n_quant = -1;
  s.realistic = 1, s.seed = seed;
  attn_prob_t pr;
  if (attn_prob_make(&s, &pr)) {
    printf("FAIL %s: cannot build the problem\n", cs.name);
    return 1;
  }
  printf("---- %s: %d seqs, %d windows (F %d Q %d E %d)\n", cs.name, pr.n_seq, pr.n_win, pr.n_full,
         pr.n_quant, pr.n_evicted);
  std::vector<double> ref((size_t)pr.n_seq * pr.n_head * pr.geom.head_dim), rmass(pr.n_win + 1);
  int fails = attn_ref_run(&pr, ref.data(), rmass.data()) != 0;
  Dev d;
  dev_load(&pr, &d);
  std::vector<float> keep;
  fails += check_run(cs, &pr, &d, 0, ref, rmass, &keep);
  fails += check_run(cs, &pr, &d, 0, ref, rmass, &keep); /* repeat: bitwise the same */
  keep.clear();
  fails += check_run(cs, &pr, &d, 3, ref, rmass, &keep);
  const std::vector<float> with_mass3 = keep;
  /* one chunk per sequence, masses accumulated: the chunk kernel alone (tickets) and with the
   * combine kernel (no tickets) give the same bits */
  keep.clear();
  const int one = pr.max_win > 0 ? pr.max_win : 1;
  fails += check_run(cs, &pr, &d, one, ref, rmass, &keep, 1, 1);
  fails += check_run(cs, &pr, &d, one, ref, rmass, &keep, 0, 1);
  /* without masses (the FullKV cache's calls), three windows a chunk, with and without tickets:
   * the outputs are the bits of the run with masses at three windows a chunk */
  keep = with_mass3;
  fails += check_run(cs, &pr, &d, 3, ref, rmass, &keep, 1, 0, 1);
  keep = with_mass3;
  fails += check_run(cs, &pr, &d, 3, ref, rmass, &keep, 0, 0, 1);
  dev_free(&d);
  attn_prob_free(&pr);
  return fails;
}

static int check_all(int small, const char *only) {
  const int NORM = KERN_ROPE_NORM, NEOX = KERN_ROPE_NEOX;
  /* a table: a case a line or two */
  // clang-format off
  const std::vector<Case> cases = {
      {"gqa4 d128 w16 int2 norm mix", 32, 8, 128, 16, 2, 32, NORM, 128, 500000.f, 5, 2, 0.3, 0.5,
       {1000, 777, 1280, 65}, 1},
      {"gqa4 d128 w16 full only", 32, 8, 128, 16, 2, 32, NORM, 128, 10000.f, 0, 2, 1.0, 0.0,
       {1280, 1280, 999}, 0},
      {"gqa4 d128 w16 full+evicted", 32, 8, 128, 16, 2, 32, NORM, 128, 10000.f, 0, 2, 0.5, 0.0,
       {2000, 17}, 0},
      {"mha d128 w16 int4 neox", 8, 8, 128, 16, 4, 32, NEOX, 128, 1000000.f, 0, 0, 0.2, 0.6,
       {500, 300}, 1},
      {"gqa4 d64 w8 int2 neox pairs", 16, 4, 64, 8, 2, 16, NEOX, 64, 10000.f, 3, 1, 0.3, 0.5,
       {901, 255}, 1},
      {"gqa4 d64 w8 full pairs", 16, 4, 64, 8, 2, 32, NORM, 64, 10000.f, 0, 0, 0.6, 0.0, {1001, 8},
       0},
      {"gqa8 d128 w32 int8 norm rot96", 32, 4, 128, 32, 8, 64, NORM, 96, 10000.f, 0, 0, 0.25, 0.5,
       {700, 63}, 0},
      {"gqa4 d128 w16 int2 g8", 16, 4, 128, 16, 2, 8, NORM, 128, 10000.f, 1, 1, 0.2, 0.7, {640, 33},
       0},
      {"gqa2 d64 w64 int4 norm", 8, 4, 64, 64, 4, 32, NORM, 64, 10000.f, 0, 1, 0.3, 0.5, {1500, 90},
       0},
      {"evicted and empty seqs", 32, 8, 128, 16, 2, 32, NORM, 128, 10000.f, 0, 0, 0.0, 0.0,
       {400, 0, 16}, 0},
      {"gqa4 d128 w16 int2 8k", 32, 8, 128, 16, 2, 32, NORM, 128, 500000.f, 4, 2, 0.06, 0.64,
       {8192, 6000}, 0},
      {"gqa8 d128 w64 int4 neox yarn", 32, 4, 128, 64, 4, 32, NEOX, 128, 1000000.f, 0, 1, 0.2, 0.6,
       {3000, 130}, 0, 1},
      {"gqa4 d128 w16 int2 g8 yarn 32k", 8, 2, 128, 16, 2, 8, NORM, 128, 500000.f, 5, 2, 0.05, 0.7,
       {32768}, 0, 1},
      /* post-RoPE QUANT keys (KV_KEY_FRAME_ABS): no rotation, every tier in one mma pass */
      {"abs gqa4 d128 w8 int2 pairs", 32, 8, 128, 8, 2, 32, NORM, 128, 500000.f, 5, 2, 0.3, 0.5,
       {3000, 130, 9}, 1, 0, 1},
      {"abs gqa4 d128 w16 int2 mix", 32, 8, 128, 16, 2, 32, NEOX, 128, 10000.f, 3, 1, 0.2, 0.6,
       {2500, 77}, 1, 0, 1},
      {"abs gqa8 d64 w8 int4 yarn", 16, 2, 64, 8, 4, 16, NORM, 64, 10000.f, 0, 1, 0.3, 0.5,
       {1500, 40}, 0, 1, 1},
      {"abs gqa4 d128 w32 int8", 8, 2, 128, 32, 8, 32, NORM, 128, 500000.f, 0, 1, 0.25, 0.5,
       {2000, 31}, 0, 0, 1},
      {"abs gqa4 d128 w8 int2 32k", 8, 2, 128, 8, 2, 32, NORM, 128, 500000.f, 5, 4, 0.06, 0.5,
       {32768}, 0, 0, 1},
      /* the INT2 quad kernels at GQA 8 (no KCA_G4) and GQA 3 (KCA_G4 with a padding head) */
      {"abs gqa8 d128 w8 int2 quads", 16, 2, 128, 8, 2, 32, NORM, 128, 500000.f, 5, 2, 0.3, 0.5,
       {2600, 45}, 1, 0, 1},
      {"abs gqa3 d128 w8 int2 quads", 6, 2, 128, 8, 2, 32, NORM, 128, 500000.f, 3, 1, 0.2, 0.6,
       {2300, 61}, 1, 0, 1},
      /* windows of 4 (post-RoPE keys, or FULL only): four windows of one tier per tile */
      {"abs gqa4 d128 w4 int2 quads", 32, 8, 128, 4, 2, 32, NORM, 128, 500000.f, 3, 2, 0.3, 0.5,
       {3000, 130, 9}, 1, 0, 1},
      {"gqa4 d128 w4 full+evicted quads", 32, 8, 128, 4, 2, 32, NORM, 128, 10000.f, 0, 2, 0.5, 0.0,
       {2000, 17}, 0},
      {"abs gqa8 d64 w4 int4 quads", 16, 2, 64, 4, 4, 16, NORM, 64, 10000.f, 1, 1, 0.3, 0.5,
       {1500, 40}, 0, 0, 1},
      /* a wide call (KC_ATTN_SPLIT_WIDE): 34 x 8 (sequence, KV head) pairs of 2,050 windows,
         more than two waves of two chunks on 132 multiprocessors: four chunks, led */
      {"abs gqa4 d128 w8 int2 wide", 32, 8, 128, 8, 2, 32, NORM, 128, 500000.f, 5, 4, 0.06, 0.5,
       std::vector<int>(34, 16400), 0, 0, 1},
  };
  // clang-format on
  int fails = 0, n = 0;
  const uint64_t seed = (uint64_t)time(NULL); /* fresh data on every run; printed to replay */
  printf("attn_decode check: seed %llu\n", (unsigned long long)seed);
  for (size_t i = 0; i < cases.size(); i++) {
    if ((small && !cases[i].small) || (only && !strstr(cases[i].name, only))) continue;
    fails += check_case(cases[i], seed * 1000 + i), n++;
  }
  printf("attn_decode check: %d case(s), %d failure(s)\n", n, fails);
  return fails ? 1 : 0;
}

/* ---------------------------------------------------------------- bench */

/* Random bf16 values (about N(0,1), sum of 4 uniforms) over n 16-bit words. As fp16 the same
 * bits are finite numbers of magnitude about 0.5..4, so QUANT scales and zeros are valid too. */
__global__ void bench_fill(uint16_t *p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float x =
        ((z & 0xffff) + (z >> 16 & 0xffff) + (z >> 32 & 0xffff) + (z >> 48)) / 65536.0f - 2.0f;
    uint32_t u = __float_as_uint(x * 1.7f);
    p[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

/* Bench options (main's flags): --tma adds the tensor-copy pipeline, --pipes times only the
 * FullKV shapes' reads and pipelines (no attention), $QE_BENCH_QUICK=1 one timed launch a
 * measurement (under compute-sanitizer). */
static struct {
  int tma, pipes, quick;
} g_opt;

struct Result {
  const char *name;
  double ms, bytes, ms_gpu; /* best ms from an idle GPU; ms_gpu: the auto chunks' queued (GPU) ms */
};

static double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/* Holds the stream until the host sets *go (mapped pinned memory), at most timeout cycles (then
 * *late = 1): what the host enqueues behind it meanwhile starts back to back on the GPU. */
__global__ void bench_block(const volatile int *go, long long timeout, int *late) {
  const long long t0 = clock64();
  while (!*go)
    if (clock64() - t0 > timeout) {
      *late = 1;
      return;
    }
}

/* Two timings of one launch: ms from an idle GPU (events around the launch as the host submits
 * it, so the host's submission of the launch falls between the events, as in peers.py), and
 * ms_gpu with the launch queued behind bench_block (the GPU's own time, as nvbench measures). */
struct Timing {
  double ms, ms_gpu;
};

struct Blocker {
  int *go = nullptr, *late = nullptr;
  Blocker() {
    CK(cudaHostAlloc((void **)&go, sizeof(int), cudaHostAllocMapped));
    CK(cudaMalloc((void **)&late, sizeof(int)));
    CK(cudaMemset(late, 0, sizeof(int)));
  }
  ~Blocker() {
    int l = 0;
    CK(cudaMemcpy(&l, late, sizeof l, cudaMemcpyDeviceToHost));
    if (l) fprintf(stderr, "bench: a queued launch waited past bench_block's timeout\n");
    CK(cudaFreeHost(go));
    CK(cudaFree(late));
  }
  void hold(void) {
    l2_flush();
    *(volatile int *)go = 0;
    bench_block<<<1, 1>>>(go, 4000000000ll, late); /* ~2 s at 2 GHz */
  }
  void release(void) {
    __sync_synchronize();
    *(volatile int *)go = 1;
  }
};

/* Which timings event_median2 takes (a mask): from an idle GPU (ms), queued (ms_gpu). */
enum { T_IDLE = 1, T_QUEUED = 2, T_BOTH = 3 };

/* The medians of launch(i) for i in [warm, n), each timed the ways of the mask (a way not taken
 * gives 0); i < warm untimed. */
template <typename F> static Timing event_median2(int warm, int n, F launch, int ways = T_BOTH) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> t, tq;
  Blocker blk;
  if (g_opt.quick) warm = 1, n = 2;
  for (int i = 0; i < n; i++)
    for (int queued = 0; queued < 2; queued++) {
      if (!(ways >> queued & 1)) continue;
      if (queued) blk.hold();
      CK(cudaEventRecord(e0));
      launch(i);
      CK(cudaEventRecord(e1));
      if (queued) blk.release();
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= warm) (queued ? tq : t).push_back(ms);
    }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return {ways & T_IDLE ? median(t) : 0.0, ways & T_QUEUED ? median(tq) : 0.0};
}

/* The median ms of launch(i) from an idle GPU (event_median2's ms). */
template <typename F> static double event_median(int warm, int n, F launch) {
  return event_median2(warm, n, launch, T_IDLE).ms;
}

/* Median ms of `reps` calls of a after 10 (arena rotated over n_rot copies), timed the ways of
 * the mask. */
static Timing bench_time2(kc_attn_args_t a, uint8_t **arenas, int n_rot, int reps, int ways) {
  return event_median2(
      10, 10 + reps,
      [&](int i) {
        a.arena = arenas[i % n_rot];
        CKQ(kc_attn_decode(&a, nullptr));
      },
      ways);
}
static double bench_time(kc_attn_args_t a, uint8_t **arenas, int n_rot, int reps) {
  return bench_time2(a, arenas, n_rot, reps, T_IDLE).ms;
}

/* Copy bandwidth (read + write GB/s) from an idle GPU and (*gpu) queued. */
static double bench_copy(double *gpu) {
  const size_t n = (size_t)2 << 30;
  void *src, *dst;
  CK(cudaMalloc(&src, n));
  CK(cudaMalloc(&dst, n));
  bench_fill<<<4096, 256>>>((uint16_t *)src, n / 2, 1);
  CK(cudaGetLastError());
  const Timing t = event_median2(3, 23, [&](int) {
    CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice));
  });
  CK(cudaFree(src));
  CK(cudaFree(dst));
  const double gbps = 2.0 * n / t.ms / 1e6;
  *gpu = 2.0 * n / t.ms_gpu / 1e6;
  printf("{\"bench\": \"copy\", \"bytes\": %zu, \"ms\": %.4f, \"GBps_read_plus_write\": %.1f, "
         "\"ms_gpu\": %.4f, \"GBps_gpu\": %.1f}\n",
         2 * n, t.ms, gbps, t.ms_gpu, *gpu);
  return gbps;
}

/* The read roofline of a shape: a plain streaming read of the same bytes (16-byte loads, grid
 * stride, 4 in flight per thread), timed as the attention is (one launch between events, inputs
 * rotated over the same arenas); the best of three grid sizes. */
__global__ void bench_read(const uint4 *p, size_t n, unsigned *sink) {
  unsigned acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc ^= a.x ^ a.w ^ b.y ^ b.z ^ c.x ^ c.w ^ d.y ^ d.z;
  }
  for (; i < n; i += stride) acc ^= p[i].x ^ p[i].w;
  if (acc == 0x9e3779b9u) *sink = acc; /* keeps the loads */
}

/* (HM: the same walk over a head-major layout, each KV head's K or V rows of a sequence
 * contiguous, as torch's [B, H_kv, S, D] tensors that cuDNN reads: ATTN_HM=1.)
 * The same bytes read in the chunk kernel's pattern (FullKV, n_kv 8, head_dim 128): block (KV
 * head, sequence, chunk) reads its head's 256-byte slice of every 2 KiB token row of its chunk
 * of the sequence's K rows and V rows (rows contiguous; the problem's 32 KiB pages are shuffled
 * over the arena, the same bytes), 16 lanes a row, 4 loads in flight per thread, 192 threads,
 * chunks as many as make two blocks per multiprocessor: a layout's cost apart from the
 * attention's own work. */
template <bool HM>
__global__ void bench_read_gqa(const uint4 *p, int seq, unsigned *sink) {
  const int kvh = blockIdx.x, b = blockIdx.y, nkv = gridDim.x, per = blockDim.x / 16;
  const int row = HM ? 16 : nkv * 16; /* uint4 per token row (n_kv * 128 bf16; HM: one head) */
  const int t0 = (int)((long)seq * blockIdx.z / gridDim.z);
  const int t1 = (int)((long)seq * (blockIdx.z + 1) / gridDim.z);
  unsigned acc = 0;
  for (int kv = 0; kv < 2; kv++) {
    const uint4 *k = HM ? p + ((size_t)(2 * b + kv) * nkv + kvh) * seq * 16 + threadIdx.x % 16
                        : p + ((size_t)(2 * b + kv) * seq) * row + kvh * 16 + threadIdx.x % 16;
    for (int t = t0 + threadIdx.x / 16; t < t1; t += 4 * per) {
      uint4 a[4];
#pragma unroll
      for (int u = 0; u < 4; u++) a[u] = t + u * per < t1 ? k[(size_t)(t + u * per) * row] : uint4{};
#pragma unroll
      for (int u = 0; u < 4; u++) acc ^= a[u].x ^ a[u].w;
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

/* The chunk kernel's memory pipeline alone (FullKV, n_kv 8, head_dim 128): block (KV head,
 * sequence, chunk) of warps taking tiles of TT tokens round-robin and copying a tile's K and V
 * slices (TT / 2 16-byte cp.async of each a lane, as kca_issue_half does) into the warp's own ring
 * of NS stages (NS - 1 tiles in flight while one is read), then reading the stage; spin16
 * dependent integer steps per 16 tokens stand for the attention's work. The kernel's own shape
 * is <2, 16> with 6 warps: its rate against spin says whether the cp.async pipeline or the work
 * per tile holds the kernel below the read roofline; other depths and tile sizes (ATTN_CPV=1),
 * whether a deeper ring or finer tiles in the same shared memory would hide that work. */
template <int NS, int TT>
__global__ void bench_read_cpn(const uint4 *p, int seq, int spin16, unsigned *sink) {
  extern __shared__ uint4 ring[]; /* [warp][NS stages][TT * 32] */
  constexpr int SU = TT * 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  const int kvh = blockIdx.x, b = blockIdx.y, row = gridDim.x * 16, nT = seq / TT;
  const int t0 = TT * (int)((long)nT * blockIdx.z / gridDim.z);
  const int nt = (int)((long)nT * (blockIdx.z + 1) / gridDim.z) - t0 / TT;
  const int spin = spin16 * TT / 16;
  const uint4 *K = p + (size_t)(2 * b) * seq * row + kvh * 16 + lane % 16;
  const uint4 *V = K + (size_t)seq * row;
  uint4 *st = ring + warp * NS * SU;
  auto issue = [&](int i, int s) {
    const int t = t0 + TT * i;
#pragma unroll
    for (int j = 0; j < TT / 2; j++) {
      const size_t r = (size_t)(t + 2 * j + lane / 16) * row;
      const unsigned dk = (unsigned)__cvta_generic_to_shared(st + s * SU + j * 32 + lane);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dk), "l"(K + r));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dk + SU / 2 * 16), "l"(V + r));
    }
  };
  unsigned acc = 0;
#pragma unroll
  for (int k = 0; k < NS - 1; k++) {
    if (warp + k * nw < nt) issue(warp + k * nw, k);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  int s = 0;
  for (int i = warp; i < nt; i += nw, s = s + 1 == NS ? 0 : s + 1) {
    if (i + (NS - 1) * nw < nt) issue(i + (NS - 1) * nw, s == 0 ? NS - 1 : s - 1);
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group %0;" ::"n"(NS - 1) : "memory");
    __syncwarp();
#pragma unroll
    for (int j = 0; j < TT; j++) acc ^= st[s * SU + j * 32 + lane].x;
    for (int k = 0; k < spin; k++)
      asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(acc) : "r"(1664525u), "r"(1013904223u));
    __syncwarp();
  }
  atomicXor(sink, acc);
}

/* The warp-specialized pipelines' parts (sm_90; no-ops below). A ring of ns stages of 8 KiB has
 * a "full" and an "empty" mbarrier a stage (8 bytes each, at shared addresses full and empty),
 * each completing on one arrival (full: plus the copies' bytes). ns must be a multiple of the
 * consumer warps: see KCA_TMA_NS. */
__device__ void ws_init(unsigned full, unsigned empty, int ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if ((int)threadIdx.x < ns) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(full + 8 * threadIdx.x));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(empty + 8 * threadIdx.x));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
#endif
}

/* Waits until the phase of parity par of the mbarrier at bar has completed. */
__device__ void ws_wait(unsigned bar, unsigned par) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(par) : "memory");
#endif
}

/* A consumer warp (1 .. nc) of nt tiles: waits for each of its tiles (round-robin), XORs its
 * words .x into the result, spins, and frees the stage. ring: the stages (generic address). */
__device__ unsigned ws_consume(const uint4 *ring, unsigned full, unsigned empty, int ns, int nt,
                               int nc, int spin) {
  unsigned acc = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = warp - 1; i < nt; i += nc) {
    const int s = i % ns, k = i / ns;
    ws_wait(full + 8 * s, k & 1);
    for (int j = 0; j < 16; j++) acc ^= ring[s * 512 + j * 32 + lane].x;
    for (int q = 0; q < spin; q++)
      asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(acc) : "r"(1664525u), "r"(1013904223u));
    __syncwarp();
    if (lane == 0)
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(empty + 8 * s) : "memory");
  }
#endif
  return acc;
}

/* The same bytes through a warp-specialized pipeline (sm_90; a no-op below): warp 0 of each
 * block only copies, a tile's 32 row slices (16 K, 16 V, 256 bytes) as one bulk copy a lane into
 * a ring of KCA_WS_NS stages shared by the block, each completing on its stage's "full" mbarrier;
 * warps 1 .. 5 take the tiles round-robin, wait for them, read them, spin, and free the stage on
 * its "empty" mbarrier. Up to KCA_WS_NS tiles a block are in flight whatever the consumers' work
 * (the two-stage ring of bench_read_cpn<2, 16> holds one a warp while the warp works). */
#define KCA_WS_NS 10 /* a multiple of the 5 consumers: see KCA_TMA_NS */
__global__ void bench_read_ws(const uint4 *p, int seq, int spin, unsigned *sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 ring[]; /* [KCA_WS_NS][512], then full[NS], empty[NS] (8 bytes each) */
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nc = blockDim.x / 32 - 1;
  const int kvh = blockIdx.x, b = blockIdx.y, row = gridDim.x * 16, n16 = seq / 16;
  const int t0 = 16 * (int)((long)n16 * blockIdx.z / gridDim.z);
  const int nt = (int)((long)n16 * (blockIdx.z + 1) / gridDim.z) - t0 / 16;
  const uint4 *K = p + (size_t)(2 * b) * seq * row + kvh * 16, *V = K + (size_t)seq * row;
  const unsigned full = (unsigned)__cvta_generic_to_shared(ring + KCA_WS_NS * 512);
  const unsigned empty = full + 8 * KCA_WS_NS;
  ws_init(full, empty, KCA_WS_NS);
  unsigned acc = 0;
  if (warp == 0) {
    for (int i = 0; i < nt; i++) {
      const int s = i % KCA_WS_NS, k = i / KCA_WS_NS;
      if (k > 0) ws_wait(empty + 8 * s, (k - 1) & 1);
      const uint4 *src = (lane < 16 ? K : V) + (size_t)(t0 + 16 * i + lane % 16) * row;
      const unsigned dst = (unsigned)__cvta_generic_to_shared(ring + s * 512 + lane * 16);
      if (lane == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 8192;" ::"r"(full + 8 * s)
                     : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                   "256, [%2];" ::"r"(dst), "l"(src), "r"(full + 8 * s) : "memory");
    }
  } else {
    acc = ws_consume(ring, full, empty, KCA_WS_NS, nt, nc, spin);
  }
  atomicXor(sink, acc);
#endif
}

/* The same through tensor copies (sm_90; a no-op below): lane 0 of warp 0 copies a tile's K and
 * V as two 4 KiB boxes (16 rows x 1 KV head x 128 channels of the 3D tensor map over the arena's
 * token rows) into a ring of KCA_TMA_NS stages (1 KiB aligned) shared by the block, completing
 * on the stage's "full" mbarrier; warps 1 .. 5 consume as in bench_read_ws. Two operations a
 * tile where bench_read_ws issues 32. */
#define KCA_TMA_NS 10 /* a multiple of the 5 consumer warps, so that a stage always has the same
                          consumer: with 12, a consumer 12 tiles ahead of another waited on a
                          stage's next phase while its last was still in flight, whose parity
                          reads as done (the phases' parities alias), and the ring deadlocked
                          (H200, 2026-12-03) */
__global__ void bench_read_tma(const __grid_constant__ CUtensorMap map, int seq, int spin,
                               unsigned *sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint8_t tma_smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nc = blockDim.x / 32 - 1;
  const int kvh = blockIdx.x, b = blockIdx.y, n16 = seq / 16;
  const int t0 = 16 * (int)((long)n16 * blockIdx.z / gridDim.z);
  const int nt = (int)((long)n16 * (blockIdx.z + 1) / gridDim.z) - t0 / 16;
  const unsigned raw = (unsigned)__cvta_generic_to_shared(tma_smem);
  const unsigned ring = (raw + 1023u) & ~1023u; /* [KCA_TMA_NS][8 KiB] */
  const unsigned full = ring + KCA_TMA_NS * 8192, empty = full + 8 * KCA_TMA_NS;
  const uint4 *ring_g = (const uint4 *)(tma_smem + (ring - raw));
  ws_init(full, empty, KCA_TMA_NS);
  unsigned acc = 0;
  if (warp == 0) {
    if (lane == 0)
      for (int i = 0; i < nt; i++) {
        const int s = i % KCA_TMA_NS, k = i / KCA_TMA_NS;
        if (k > 0) ws_wait(empty + 8 * s, (k - 1) & 1);
        const unsigned bar = full + 8 * s, dst = ring + s * 8192;
        const int rk = 2 * b * seq + t0 + 16 * i, rv = rk + seq;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 8192;" ::"r"(bar)
                     : "memory");
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx"
                     "::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
                     "l"((uint64_t)&map), "r"(0), "r"(kvh), "r"(rk), "r"(bar)
                     : "memory");
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx"
                     "::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst + 4096),
                     "l"((uint64_t)&map), "r"(0), "r"(kvh), "r"(rv), "r"(bar)
                     : "memory");
      }
  } else {
    acc = ws_consume(ring_g, full, empty, KCA_TMA_NS, nt, nc, spin);
  }
  atomicXor(sink, acc);
#endif
}

/* The 3D tensor map bench_read_tma reads an arena of n_rows token rows through (n_kv 8, head_dim
 * 128, bf16; boxes of 16 rows x 1 head x 128 channels), or 0 when the driver has no encoder. */
static int tma_map(CUtensorMap *m, void *arena, size_t n_rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 enc = nullptr;
  if (!enc) {
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return 0;
  }
  const cuuint64_t dims[3] = {128, 8, n_rows}, strides[2] = {256, 2048};
  const cuuint32_t box[3] = {128, 1, 16}, es[3] = {1, 1, 1};
  const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, arena, dims, strides, box, es,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) fprintf(stderr, "bench: cuTensorMapEncodeTiled: error %d\n", (int)r);
  return r == CUDA_SUCCESS;
}

/* A pipeline's median time over 100 queued launch(i) after 10, and in *xr the XOR of the words
 * one launch read (into sink, which is freed). */
template <typename F> static double sink_time(unsigned *sink, F launch, unsigned *xr) {
  CK(cudaMemset(sink, 0, sizeof *sink));
  launch(0);
  CK(cudaGetLastError());
  CK(cudaMemcpy(xr, sink, sizeof *xr, cudaMemcpyDeviceToHost));
  const double ms = event_median2(10, 110, launch, T_QUEUED).ms_gpu;
  CK(cudaFree(sink));
  return ms;
}

/* One bench_read_cpn<NS, TT> configuration on FullKV's bytes: nw warps a block, bps blocks a
 * multiprocessor (the grid's chunks sized for it); the median of 100 queued launches, the XOR
 * of one launch's reads in *xr. */
template <int NS, int TT>
static double bench_read_cpn_ms(uint8_t **arenas, int n_rot, int n_seq, int seq, int spin, int nw,
                                int bps, unsigned *xr) {
  int sms = 0, dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int smem = nw * NS * TT * 32 * 16, z = std::max(1, bps * sms / (8 * n_seq));
  CK(cudaFuncSetAttribute(bench_read_cpn<NS, TT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          smem));
  unsigned *sink;
  CK(cudaMalloc((void **)&sink, sizeof *sink));
  auto launch = [&](int i) {
    bench_read_cpn<NS, TT><<<dim3(8, n_seq, z), 32 * nw, smem>>>(
        (const uint4 *)arenas[i % n_rot], seq, spin, sink);
  };
  return sink_time(sink, launch, xr);
}

/* ATTN_CPV=1: the ring's depth and tile size against spin (bench_read_cpn), one JSON line each;
 * x0: the XOR of mode 0's reads (every configuration reads the same words). */
static void bench_cpv(const char *name, uint8_t **arenas, int n_rot, int n_seq, int seq,
                      double bytes, double copy_gpu, double attn_ms, unsigned x0) {
  struct Cfg {
    const char *nm;
    int nw, bps;
    double (*fn)(uint8_t **, int, int, int, int, int, int, unsigned *);
  };
  static const Cfg cfgs[] = {
      {"ns2_t16_w6x2", 6, 2, bench_read_cpn_ms<2, 16>},
      {"ns3_t16_w4x2", 4, 2, bench_read_cpn_ms<3, 16>},
      {"ns4_t8_w6x2", 6, 2, bench_read_cpn_ms<4, 8>},
      {"ns3_t8_w8x2", 8, 2, bench_read_cpn_ms<3, 8>},
      {"ns4_t16_w3x2", 3, 2, bench_read_cpn_ms<4, 16>},
      {"ns3_t16_w6x1", 6, 1, bench_read_cpn_ms<3, 16>},
      {"ns2_t8_w12x2", 12, 2, bench_read_cpn_ms<2, 8>}};
  for (const Cfg &c : cfgs)
    for (int spin : {0, 400, 600, 800}) {
      unsigned x = 0;
      const double ms = c.fn(arenas, n_rot, n_seq, seq, spin, c.nw, c.bps, &x);
      printf("{\"bench\": \"%s_cpv\", \"cfg\": \"%s\", \"spin\": %d, \"ms_gpu\": %.4f, "
             "\"frac_copy_bw_gpu\": %.3f, \"attention_over\": %.3f, \"reads_match_cp\": %s}\n",
             name, c.nm, spin, ms, bytes / ms / 1e6 / copy_gpu, attn_ms / ms,
             spin == 0 && x != x0 ? "false" : "true");
      fflush(stdout);
    }
}

/* The memory pipelines alone (mode 0: bench_read_cpn<2, 16>, 1: bench_read_ws, 2:
 * bench_read_tma) on FullKV's bytes (n_seq sequences of seq tokens) at spin, chunks as the chunk
 * kernel would (two blocks a multiprocessor at most): the median of 100 after 10 (queued
 * launches), and in *xr the XOR of the words one launch read on arena 0 (equal for every mode
 * when each reads every byte once). Returns -1 when the mode cannot run here. */
static double bench_read_cp_ms(uint8_t **arenas, int n_rot, size_t arena_bytes, int n_seq, int seq,
                               int spin, int mode, unsigned *xr) {
  int sms = 0, dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int smem = mode == 2   ? KCA_TMA_NS * 8192 + 1024 + 16 * KCA_TMA_NS
                   : mode == 1 ? KCA_WS_NS * (512 * 16 + 16)
                               : 6 * 2 * 512 * 16;
  const int z = std::max(1, 2 * sms / (8 * n_seq));
  std::vector<CUtensorMap> maps(n_rot);
  if (mode == 2)
    for (int r = 0; r < n_rot; r++)
      if (!tma_map(&maps[r], arenas[r], arena_bytes / 2048)) return -1;
  if (mode == 2)
    CK(cudaFuncSetAttribute(bench_read_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  else if (mode == 1)
    CK(cudaFuncSetAttribute(bench_read_ws, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  else
    CK(cudaFuncSetAttribute(bench_read_cpn<2, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem));
  unsigned *sink;
  CK(cudaMalloc((void **)&sink, sizeof *sink));
  auto launch = [&](int i) {
    const uint4 *a = (const uint4 *)arenas[i % n_rot];
    if (mode == 2)
      bench_read_tma<<<dim3(8, n_seq, z), 192, smem>>>(maps[i % n_rot], seq, spin, sink);
    else if (mode == 1)
      bench_read_ws<<<dim3(8, n_seq, z), 192, smem>>>(a, seq, spin, sink);
    else
      bench_read_cpn<2, 16><<<dim3(8, n_seq, z), 192, smem>>>(a, seq, spin, sink);
  };
  return sink_time(sink, launch, xr);
}

static Timing bench_read_ms(uint8_t **arenas, int n_rot, size_t bytes, int ways, int gqa_seqs = 0,
                            int gqa_len = 0, int gqa_hm = 0) {
  int sms = 0, dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  unsigned *sink;
  CK(cudaMalloc((void **)&sink, sizeof *sink));
  Timing best = {1e30, 1e30};
  for (int per_sm = 4; per_sm <= 16; per_sm *= 2) {
    /* (per_sm: 4, 8, 16 chunks' worth of blocks a multiprocessor, halved) */
    const dim3 gg(8, gqa_seqs, (sms * per_sm / 2 + 8 * gqa_seqs - 1) / (8 * std::max(gqa_seqs, 1)));
    const auto gqa = gqa_hm ? bench_read_gqa<true> : bench_read_gqa<false>;
    const Timing t = event_median2(10, 110, [&](int i) {
      if (gqa_seqs)
        gqa<<<gg, 192>>>((const uint4 *)arenas[i % n_rot], gqa_len, sink);
      else
        bench_read<<<sms * per_sm, 256>>>((const uint4 *)arenas[i % n_rot], bytes / 16, sink);
    }, ways);
    best.ms = std::min(best.ms, t.ms), best.ms_gpu = std::min(best.ms_gpu, t.ms_gpu);
  }
  CK(cudaFree(sink));
  return best;
}

#if KCA_TRACE
int kc_attn_trace_reset(void);
int kc_attn_trace_report(const char *name);

/* Diagnostics builds: one traced call of a (after a warm one), and (nomass) one without masses. */
static void bench_trace(const char *name, kc_attn_args_t a, uint8_t **arenas, bool nomass) {
  for (int m = 0; m < (nomass ? 2 : 1); m++) {
    if (m) a.mass = nullptr;
    a.arena = arenas[0];
    CKQ(kc_attn_decode(&a, nullptr));
    CKQ(kc_attn_trace_reset());
    CKQ(kc_attn_decode(&a, nullptr));
    CK(cudaDeviceSynchronize());
    CKQ(kc_attn_trace_report(m ? (std::string(name) + "_no_masses").c_str() : name));
  }
}
#endif

/* $ATTN_FIXED=M: the automatic chunking launched as a CUDA graph step launches it (chunk_dev
 * holding the step's windows a chunk and lead, a grid of M chunks a sequence whose surplus blocks
 * exit), eagerly and replayed from a graph captured on a stream, GPU time each; with and without
 * masses for FullKV shapes. The engine's graphs hold a bucket's most chunks (6 at B=8 32K on the
 * H200) where a step uses 4: this isolates what those surplus blocks cost in either grid order
 * ($QE_CUDA_ATTN_LEAD=0 keeps the old order; a forced lead, chunk-major). */
static void bench_fixed(const char *name, kc_attn_args_t a, uint8_t **arenas, int n_rot, int reps,
                        int max_chunk, bool full) {
  const int cw = kc_attn_chunk_win(&a), lead = kc_attn_lead(&a);
  if (cw < 1 || lead < 0 || (a.max_win + cw - 1) / cw > max_chunk) {
    printf("{\"bench\": \"%s_fixed\", \"skipped\": \"ATTN_FIXED=%d below the step's %d chunks\"}\n",
           name, max_chunk, cw > 0 ? (a.max_win + cw - 1) / cw : cw);
    return;
  }
  const int32_t h[2] = {cw, lead};
  int32_t *dc = dev_upload(h, 2);
  void *ws = nullptr; /* (the workspace laid out for max_chunk chunks) */
  a.chunk_dev = dc, a.max_chunk = max_chunk;
  CKQ(kc_attn_ws_bytes(&a, &a.ws_bytes));
  CK(cudaMalloc(&ws, a.ws_bytes));
  a.ws = ws, a.chunk_dev = nullptr, a.max_chunk = 0;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int m = 0; m < (full ? 2 : 1); m++) {
    kc_attn_args_t b = a;
    if (m) b.mass = nullptr;
    b.chunk_dev = dc, b.max_chunk = max_chunk, b.chunk_win = 0;
    const double eager = bench_time2(b, arenas, n_rot, reps, T_QUEUED).ms_gpu;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    b.arena = arenas[0]; /* (a graph's arguments are fixed: no rotation) */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CKQ(kc_attn_decode(&b, s));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const double graph =
        event_median2(10, 10 + reps, [&](int) { CK(cudaGraphLaunch(ge, 0)); }, T_QUEUED).ms_gpu;
    b.chunk_dev = nullptr, b.chunk_win = cw;
    const double exact = bench_time2(b, arenas, n_rot, reps, T_QUEUED).ms_gpu;
    printf("{\"bench\": \"%s_fixed%s\", \"chunk_win\": %d, \"lead\": %d, \"spread\": %d, "
           "\"chunks\": %d, \"max_chunk\": %d, \"ms_gpu_exact_grid\": %.4f, "
           "\"ms_gpu_fixed\": %.4f, "
           "\"ms_gpu_fixed_graph\": %.4f, \"fixed_over_exact\": %.3f}\n",
           name, m ? "_no_masses" : "", cw, lead & (KC_ATTN_SPREAD - 1),
           (lead & KC_ATTN_SPREAD) != 0, (a.max_win + cw - 1) / cw, max_chunk, exact,
           eager, graph, eager / exact);
    fflush(stdout);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  CK(cudaStreamDestroy(s));
  CK(cudaFree(dc));
  CK(cudaFree(ws));
}

/* One benchmark shape: builds the window tables, fills arenas on the GPU, times variants. */
static Result bench_shape(const char *name, int n_seq, int seq, int omega, int n_full, int n_quant,
                          double copy_gbps, double copy_gpu, double full_ms, double full_gpu,
                          int hot, int abs_keys) {
  std::vector<int> lens(n_seq, seq);
  attn_spec_t s;
  memset(&s, 0, sizeof s);
  s.geom = {8, 128, omega, 2, 32};
  s.n_seq = n_seq, s.n_head = 32, s.rope_mode = KERN_ROPE_NORM, s.n_rot = 128;
  s.rope_theta = 500000.0f, s.seq_len = lens.data(), s.sink = 0, s.n_local = 2;
  s.p_full = 1.0, s.p_quant = 0.0, s.n_full = n_full, s.n_quant = n_quant, s.realistic = 0;
  s.seed = 42;
  attn_prob_t pr;
  if (attn_prob_make(&s, &pr)) {
    fprintf(stderr, "bench %s: cannot build the problem\n", name);
    exit(1);
  }
  pr.abs_keys = abs_keys;
  int l2 = 0, dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const int n_rot =
      hot ? 1 : (int)std::min<size_t>(4, (4 * (size_t)l2 + pr.arena_bytes - 1) / pr.arena_bytes);
  std::vector<uint8_t *> arenas(n_rot);
  for (int r = 0; r < n_rot; r++) {
    CK(cudaMalloc((void **)&arenas[r], pr.arena_bytes));
    bench_fill<<<8192, 256>>>((uint16_t *)arenas[r], pr.arena_bytes / 2, 1000 + r);
    CK(cudaGetLastError());
  }
  for (size_t i = 0; i < (size_t)n_seq * 32 * 128; i++) pr.q[i] = (float)attn_rng_normal(&s.seed);
  Dev d;
  d.win = dev_upload(pr.win, (size_t)pr.n_win);
  d.seq_win = dev_upload(pr.seq_win, (size_t)n_seq + 1);
  d.q = dev_upload(pr.q, (size_t)n_seq * 32 * 128);
  CK(cudaMalloc((void **)&d.out, sizeof(float) * n_seq * 32 * 128));
  CK(cudaMalloc((void **)&d.mass, sizeof(float) * (pr.n_win + 1)));
  d.tickets = dev_tickets(n_seq);
  d.arena = arenas[0];
  kc_attn_args_t a = dev_args(&pr, &d, 0);
  const int cw0 = kc_attn_chunk_win(&a), reps = seq > 4096 ? 60 : 200;
  const double bytes = (double)pr.kv_bytes;
  Result best = {name, 1e30, bytes, 0};
  /* the automatic chunking, then 1, 2, 3, 4, 6 and 8 chunks a sequence (chunks a multiple of
     4 windows, so every unit of kca_pk fits whole) */
  std::vector<int> n_ch = {0, 1, 2, 3, 4, 6, 8};
  if (const char *e = getenv("ATTN_CHUNKS")) { /* e.g. "4,8,16": the sweep's counts instead */
    n_ch = {0};
    for (const char *c = e; *c; c += *c == ',') {
      char *end = nullptr;
      const long k = strtol(c, &end, 10);
      if (end == c || k < 1 || k > 4096 || (*end && *end != ',')) {
        fprintf(stderr, "attn_decode: ATTN_CHUNKS='%s': expected chunk counts 1..4096 separated "
                        "by commas\n", e);
        exit(2);
      }
      n_ch.push_back((int)k), c = end;
    }
  }
  for (int v = 0; v < (g_opt.pipes ? 0 : (int)n_ch.size()); v++) {
    const int cw = v ? ((a.max_win + n_ch[v] - 1) / n_ch[v] + 3) / 4 * 4 : cw0;
    if (v > 0 && cw == cw0) continue;
    a = dev_args(&pr, &d, cw);
    const Timing tt = bench_time2(a, arenas.data(), n_rot, reps, T_BOTH);
    const double ms = tt.ms;
    if (v == 0) best.ms_gpu = tt.ms_gpu;
    if (n_full < 0 && getenv("ATTN_CHUNKS")) { /* FullKV: the engine's (no masses) too */
      kc_attn_args_t b = a;
      b.mass = nullptr;
      const double t0 = bench_time2(b, arenas.data(), n_rot, reps, T_QUEUED).ms_gpu;
      b.flags = KC_ATTN_SKIP_COMBINE;
      const double t1 = bench_time2(b, arenas.data(), n_rot, reps, T_QUEUED).ms_gpu;
      printf("{\"bench\": \"%s_no_masses\", \"chunk_win\": %d, \"ms_gpu\": %.4f, "
             "\"ms_gpu_chunk_kernel_only\": %.4f}\n", name, cw, t0, t1);
    }
    a.flags = KC_ATTN_SKIP_COMBINE;
    const double ms_main = bench_time(a, arenas.data(), n_rot, reps);
    const double gbps = bytes / ms / 1e6;
    printf("{\"bench\": \"%s\", \"batch\": %d, \"seq\": %d, \"chunk_win\": %d, "
           "\"chunks_per_seq\": %d, \"auto\": %s, "
           "\"l2_rotation\": %d, \"windows\": {\"full\": %d, \"int2\": %d, \"evicted\": %d}, "
           "\"ms\": %.4f, \"ms_chunk_kernel_only\": %.4f, \"bytes_read\": %.0f, \"GBps\": %.1f, "
           "\"frac_copy_bw\": %.3f",
           name, n_seq, seq, cw, (a.max_win + cw - 1) / cw, v == 0 ? "true" : "false", n_rot,
           pr.n_full, pr.n_quant, pr.n_evicted, ms, ms_main, bytes, gbps, gbps / copy_gbps);
    if (full_ms > 0) printf(", \"ratio_to_full\": %.3f", ms / full_ms);
    printf(", \"ms_gpu\": %.4f, \"frac_copy_bw_gpu\": %.3f", tt.ms_gpu,
           bytes / tt.ms_gpu / 1e6 / copy_gpu);
    if (full_gpu > 0) printf(", \"ratio_to_full_gpu\": %.3f", tt.ms_gpu / full_gpu);
    printf("}\n");
    fflush(stdout);
    if (ms < best.ms) best.ms = ms;
  }
#if KCA_TRACE
  bench_trace(name, dev_args(&pr, &d, cw0), arenas.data(), n_full < 0);
#endif
  if (const char *e = getenv("ATTN_FIXED")) {
    const int mc = atoi(e);
    if (mc < 1 || mc > 4096) {
      fprintf(stderr, "attn_decode: ATTN_FIXED='%s': expected a chunk count 1..4096\n", e);
      exit(2);
    }
    bench_fixed(name, dev_args(&pr, &d, 0), arenas.data(), n_rot, reps, mc, n_full < 0);
  }
  if (n_full < 0 && !g_opt.pipes) { /* FullKV as the engine's FullKV cache runs it (no masses,
                                        its own automatic chunking) */
    a = dev_args(&pr, &d, 0);
    a.mass = nullptr;
    const int cw_nm = kc_attn_chunk_win(&a);
    const Timing t = bench_time2(a, arenas.data(), n_rot, reps, T_BOTH);
    const double ms = t.ms, gbps = bytes / ms / 1e6;
    printf("{\"bench\": \"%s_no_masses\", \"chunk_win\": %d, \"ms\": %.4f, \"GBps\": %.1f, "
           "\"frac_copy_bw\": %.3f, \"over_with_masses\": %.3f, \"ms_gpu\": %.4f, "
           "\"frac_copy_bw_gpu\": %.3f}\n",
           name, cw_nm, ms, gbps, gbps / copy_gbps, ms / best.ms, t.ms_gpu,
           bytes / t.ms_gpu / 1e6 / copy_gpu);
  }
  if (n_full < 0 && pr.arena_bytes >= (size_t)bytes) { /* FullKV: the read roofline */
    const Timing rt = bench_read_ms(arenas.data(), n_rot, (size_t)bytes, T_BOTH);
    const double rms = rt.ms,
                 gms = bench_read_ms(arenas.data(), n_rot, (size_t)bytes, T_IDLE, n_seq, seq).ms;
    printf("{\"bench\": \"%s_read_only\", \"ms\": %.4f, \"frac_copy_bw\": %.3f, "
           "\"attention_over_read\": %.3f, \"gqa_pattern_ms\": %.4f, \"gqa_frac_copy_bw\": %.3f, "
           "\"attention_over_gqa_read\": %.3f, \"ms_gpu\": %.4f, \"frac_copy_bw_gpu\": %.3f}\n",
           name, rms, bytes / rms / 1e6 / copy_gbps, g_opt.pipes ? 0.0 : best.ms / rms, gms,
           bytes / gms / 1e6 / copy_gbps, g_opt.pipes ? 0.0 : best.ms / gms, rt.ms_gpu,
           bytes / rt.ms_gpu / 1e6 / copy_gpu);
    const Timing gp = bench_read_ms(arenas.data(), n_rot, (size_t)bytes, T_QUEUED, n_seq, seq),
                 hm = bench_read_ms(arenas.data(), n_rot, (size_t)bytes, T_QUEUED, n_seq, seq, 1);
    printf("{\"bench\": \"%s_read_patterns\", \"stream_ms_gpu\": %.4f, \"gqa_ms_gpu\": %.4f, "
           "\"head_major_ms_gpu\": %.4f, \"gqa_over_stream\": %.4f, \"hm_over_gqa\": %.4f}\n",
           name, rt.ms_gpu, gp.ms_gpu, hm.ms_gpu, gp.ms_gpu / rt.ms_gpu, hm.ms_gpu / gp.ms_gpu);
    int dev = 0, major = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    static const char *const modes[] = {"cp_pipeline", "ws_pipeline", "tma_pipeline"};
    unsigned x0 = 0;
    for (int mode = 0; mode < (major >= 9 ? 2 + g_opt.tma : 1); mode++)
      for (int spin : {0, 100, 200, 400, 800}) {
        unsigned x = 0;
        const double cms = bench_read_cp_ms(arenas.data(), n_rot, pr.arena_bytes, n_seq, seq,
                                            spin, mode, &x);
        if (cms < 0) break;
        if (mode == 0 && spin == 0) x0 = x;
        printf("{\"bench\": \"%s_%s\", \"spin\": %d, \"ms_gpu\": %.4f, "
               "\"frac_copy_bw_gpu\": %.3f, \"attention_over\": %.3f, \"reads_match_cp\": %s}\n",
               name, modes[mode], spin, cms, bytes / cms / 1e6 / copy_gpu, best.ms_gpu / cms,
               spin == 0 && x != x0 ? "false" : "true");
        fflush(stdout);
      }
    if (const char *e = getenv("ATTN_CPV"))
      if (!strcmp(e, "1"))
        bench_cpv(name, arenas.data(), n_rot, n_seq, seq, bytes, copy_gpu, best.ms_gpu, x0);
  }
  for (int r = 0; r < n_rot; r++) CK(cudaFree(arenas[r]));
  d.arena = nullptr;
  dev_free(&d);
  attn_prob_free(&pr);
  return best;
}

/* Full and INT2 windows of a sequence of n_win windows of omega tokens at a 20% budget: 30% of
 * the budget as Full windows, the rest as INT2 windows (GQA 32/8, d 128, value group 32). */
static void tiered20(int omega, int n_win, int *nf, int *nq) {
  const double win_full = omega * 8.0 * 128 * 2 * 2; /* bytes of one FULL window (K + V) */
  const double win_int2 = 2.0 * omega * 8 * 128 / 4 + 2.0 * 8 * 128 * 2 + 2.0 * omega * 8 * 4 * 2;
  const double budget = 0.2 * n_win * win_full;
  *nf = (int)(0.3 * budget / win_full), *nq = (int)((budget - *nf * win_full) / win_int2);
}

/* 1 when name contains one of filter's comma-separated substrings (NULL filter: every name). */
static int shape_selected(const char *name, const char *filter) {
  if (!filter) return 1;
  const std::string f = filter;
  for (size_t a = 0;;) {
    const size_t e = f.find(',', a);
    const std::string sub = f.substr(a, e == std::string::npos ? e : e - a);
    if (!sub.empty() && strstr(name, sub.c_str())) return 1;
    if (e == std::string::npos) return 0;
    a = e + 1;
  }
}

/* filter: run only the shapes shape_selected picks. */
static int bench_all(const char *filter) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("{\"device\": \"%s\", \"sms\": %d, \"l2_MB\": %.1f, \"cc\": \"%d.%d\"}\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, prop.major, prop.minor);
  double copy_gpu = 0;
  const double copy = bench_copy(&copy_gpu);
  int nf16, nq16, nf8, nq8, nfs, nqs;
  tiered20(16, 2048, &nf16, &nq16);
  tiered20(8, 4096, &nf8, &nq8);
  tiered20(8, 160, &nfs, &nqs);
  struct {
    const char *name;
    int n_seq, seq, omega, nf, nq, hot, full_ref; /* full_ref: index of the FullKV shape */
    int abs_keys;                                 /* post-RoPE INT2 keys (no rotation) */
  } sh[] = {{"full_b32_s1280", 32, 1280, 16, -1, -1, 0, -1, 0},
            {"full_b32_s1280_hot", 32, 1280, 16, -1, -1, 1, -1, 0},
            {"full_b8_s32768", 8, 32768, 16, -1, -1, 0, -1, 0},
            {"tiered20_b8_s32768", 8, 32768, 16, nf16, nq16, 0, 2, 0},
            {"tiered20_w8_b8_s32768", 8, 32768, 8, nf8, nq8, 0, 2, 0},
            {"tiered20_w8_b32_s1280", 32, 1280, 8, nfs, nqs, 0, 0, 0},
            {"abs_tiered20_b8_s32768", 8, 32768, 16, nf16, nq16, 0, 2, 1},
            {"abs_tiered20_w8_b8_s32768", 8, 32768, 8, nf8, nq8, 0, 2, 1},
            {"abs_tiered20_w8_b32_s1280", 32, 1280, 8, nfs, nqs, 0, 0, 1},
            /* 78 and 84 windows of 16 a sequence: 13 and 14 tiles for each of a block's six
               warps, where 1280 tokens give two warps 14 and four 13 (the straggler's cost) */
            {"fullw_b32_s1248", 32, 1248, 16, -1, -1, 0, -1, 0},
            {"fullw_b32_s1344", 32, 1344, 16, -1, -1, 0, -1, 0},
            /* long_ctx's batches on one H200 (29 FullKV, 122 QEvict 20% 32K-token sequences) */
            {"lc_fkv_b29_s32768", 29, 32768, 16, -1, -1, 0, -1, 0},
            {"lc_q20_w8_b122_s32768", 122, 32768, 8, nf8, nq8, 0, 11, 1},
            /* the 121 of long_ctx's QEvict run since the ninth session */
            {"lc_q20_w8_b121_s32768", 121, 32768, 8, nf8, nq8, 0, 11, 1},
            /* the 32K ratio past one wave of blocks (B=8 fills one: its blocks start, list and
               end together, and its combine is a larger share) */
            {"full_b32_s32768", 32, 32768, 16, -1, -1, 0, -1, 0},
            {"abs_tiered20_w8_b32_s32768", 32, 32768, 8, nf8, nq8, 0, 14, 1}};
  const int n = (int)(sizeof sh / sizeof sh[0]);
  Result r[n];
  for (int i = 0; i < n; i++) {
    r[i] = {sh[i].name, 0, 0, 0};
    if (!shape_selected(sh[i].name, filter)) continue;
    const double ref = sh[i].full_ref >= 0 ? r[sh[i].full_ref].ms : 0;
    const double ref_gpu = sh[i].full_ref >= 0 ? r[sh[i].full_ref].ms_gpu : 0;
    r[i] = bench_shape(sh[i].name, sh[i].n_seq, sh[i].seq, sh[i].omega, sh[i].nf, sh[i].nq, copy,
                       copy_gpu, ref, ref_gpu, sh[i].hot, sh[i].abs_keys);
  }
  printf("\n%-26s %10s %12s %9s %9s %9s %9s %9s %9s\n", "shape", "best ms", "bytes", "GB/s",
         "of copy", "/ full", "gpu ms", "of copy", "/ full");
  for (int i = 0; i < n; i++) {
    if (r[i].ms <= 0) continue;
    const double ref = sh[i].full_ref >= 0 ? r[sh[i].full_ref].ms : 0;
    const double rg = sh[i].full_ref >= 0 ? r[sh[i].full_ref].ms_gpu : 0;
    printf("%-26s %10.4f %12.0f %9.1f %9.3f %9.3f %9.4f %9.3f %9.3f\n", r[i].name, r[i].ms,
           r[i].bytes, r[i].bytes / r[i].ms / 1e6, r[i].bytes / r[i].ms / 1e6 / copy,
           ref > 0 ? r[i].ms / ref : 0.0, r[i].ms_gpu, r[i].bytes / r[i].ms_gpu / 1e6 / copy_gpu,
           rg > 0 ? r[i].ms_gpu / rg : 0.0);
  }
  printf("windows per sequence at 20%%: omega 16: %d Full, %d INT2 of 2048; omega 8: %d Full, "
         "%d INT2 of 4096 (S=32768), %d Full, %d INT2 of 160 (S=1280)\n",
         nf16, nq16, nf8, nq8, nfs, nqs);
  printf("copy bandwidth (read + write): %.1f GB/s (queued: %.1f GB/s)\n", copy, copy_gpu);
  printf("ms: events around a launch from an idle GPU (the host's submission inside, as peers.py "
         "times); gpu ms: the launch queued behind a held stream (the GPU's own time)\n");
  return 0;
}

/* ---------------------------------------------------------------- argument checks (no GPU) */

/* Rejects bad geometry with the documented codes; sizes a workspace before any buffer exists. */
static int api_checks(void) {
  kc_attn_args_t a;
  memset(&a, 0, sizeof a);
  a.geom = {8, 128, 16, 2, 32};
  a.n_seq = 2, a.n_head = 32, a.scale = 0.088f, a.max_win = 100, a.n_win = 150, a.chunk_win = 7;
  int fails = 0;
  size_t bytes = 0;
#define EXPECT(cond, what)                                                                         \
  if (!(cond)) fails++, fprintf(stderr, "api check failed: %s (%s)\n", what, qe_errmsg())
  EXPECT(kc_attn_ws_bytes(&a, &bytes) == 0 && bytes > 0, "ws_bytes without buffers");
  EXPECT(kc_attn_check(&a) == QE_EINVAL, "check wants the buffers");
  kc_attn_args_t b = a;
  b.geom.head_dim = 96;
  EXPECT(kc_attn_check(&b) == QE_EUNSUPPORTED, "head_dim 96");
  b = a, b.n_head = 80;
  EXPECT(kc_attn_check(&b) == QE_EUNSUPPORTED, "10 query heads per KV head");
  b = a, b.geom.omega = 24;
  EXPECT(kc_attn_check(&b) == QE_EUNSUPPORTED, "omega 24");
  float tab[2] = {1.0f, 0.0f};
  b = a, b.geom.omega = 4, b.has_quant = 1, b.abs_keys = 0; /* pre-RoPE keys in windows of 4 */
  b.rope.mode = KERN_ROPE_NORM, b.rope.n_rot = 128, b.rope.table = tab;
  EXPECT(kc_attn_ws_bytes(&b, &bytes) == QE_EUNSUPPORTED, "omega 4 pre-RoPE");
  b.abs_keys = 1;
  EXPECT(kc_attn_ws_bytes(&b, &bytes) == 0, "omega 4 post-RoPE");
  b.has_quant = 0, b.abs_keys = 0;
  EXPECT(kc_attn_ws_bytes(&b, &bytes) == 0, "omega 4 FULL only");
  b = a, b.has_quant = 1, b.rope.mode = KERN_ROPE_NEOX, b.rope.n_rot = 64, b.rope.table = a.q;
  EXPECT(kc_attn_ws_bytes(&b, &bytes) == QE_EUNSUPPORTED, "NEOX with n_rot < head_dim");
  b.rope.mode = KERN_ROPE_NORM, b.geom.group = 128;
  EXPECT(kc_attn_ws_bytes(&b, &bytes) == QE_EUNSUPPORTED, "group == head_dim");
  b.geom.group = 32, b.geom.bits = 3;
  EXPECT(kc_attn_ws_bytes(&b, &bytes) == QE_EINVAL, "bits 3");
  b = a, b.abs_keys = 2;
  EXPECT(kc_attn_ws_bytes(&b, &bytes) == QE_EINVAL, "abs_keys 2");
  b = a, b.geom.omega = 1024, b.geom.n_kv = 8192, b.n_head = 8192; /* a 2 GiB window page */
  EXPECT(kc_attn_check(&b) == QE_EUNSUPPORTED, "a window page of 2 GiB");
  b.geom.n_kv = 8191, b.n_head = 8191;
  EXPECT(kc_attn_ws_bytes(&b, &bytes) == 0, "a window page just under 2 GiB");
  alignas(16) static float qbuf[8]; /* host pointers: the check looks at addresses only */
  int32_t sw[3] = {0, 0, 0};
  b = a, b.seq_win = sw, b.out = qbuf, b.ws = qbuf, b.n_win = 0, b.q = qbuf + 1;
  EXPECT(kc_attn_check(&b) == QE_EINVAL, "q not 16-byte aligned");
  b.q = qbuf;
  EXPECT(kc_attn_check(&b) == 0, "q 16-byte aligned");
  if (!getenv("QE_CUDA_ATTN_SPLIT")) { /* (read once: a value given to the run stays in force) */
    setenv("QE_CUDA_ATTN_SPLIT", "9", 1);
    EXPECT(kc_attn_split() == KC_ATTN_SPLIT, "QE_CUDA_ATTN_SPLIT=9 ignored, with a warning");
    unsetenv("QE_CUDA_ATTN_SPLIT");
  }
#undef EXPECT
  printf("attn_decode api checks: %d failure(s)\n", fails);
  return fails;
}

/* kc_attn_max_chunks bounds kc_attn_chunk_win's chunks for every batch of a bucket whose sizes
 * cross one wave (and half of one), with and without masses, for several smallest batches. */
static int max_chunk_checks(kc_attn_args_t a) {
  static float m[1]; /* (the chunking looks at whether masses are asked, not at the buffer) */
  int fails = 0, cases = 0;
  for (int mass = 0; mass < 2; mass++)
    for (int n_min : {1, 5, 17, 20, 33, 40}) {
      a.mass = mass ? m : nullptr, a.n_seq = 80, a.max_win = 3 * KC_ATTN_SPLIT_MIN;
      const int mc = kc_attn_max_chunks(&a, n_min);
      for (int n = n_min; n <= 80; n++)
        for (int mw : {1, 100, 2 * KC_ATTN_SPLIT_MIN - 1, 2 * KC_ATTN_SPLIT_MIN, a.max_win}) {
          kc_attn_args_t b = a;
          b.n_seq = n, b.max_win = mw;
          const int cw = kc_attn_chunk_win(&b);
          cases++;
          if (cw <= 0 || mc < 1 || (mw + cw - 1) / cw > mc) {
            if (fails++ < 3)
              printf("FAIL max chunks: masses %d, n %d of [%d, 80], %d windows: %d chunks, at "
                     "most %d\n", mass, n, n_min, mw, cw > 0 ? (mw + cw - 1) / cw : cw, mc);
          }
        }
    }
  printf("%s max chunks of a bucket: %d cases, %d failure(s)\n", fails ? "FAIL" : "ok  ", cases,
         fails);
  return fails;
}

/* The automatic chunking past one wave (kc_attn_chunk_win, on the current device): sequences of
 * 2 KC_ATTN_SPLIT_MIN windows or more in kc_attn_split_wide() chunks (a tiered call of many
 * waves), kc_attn_split() without INT2 tiers, shorter ones whole. */
static int split_checks(void) {
  const int split = kc_attn_split_wide();
  kc_attn_args_t a;
  memset(&a, 0, sizeof a);
  a.geom = {8, 128, 8, 2, 32};
  a.n_seq = 1000, a.n_head = 32, a.scale = 0.088f, a.has_quant = 1, a.abs_keys = 1;
  static float tab[2] = {1.0f, 0.0f}; /* (checked for presence only) */
  a.rope.mode = KERN_ROPE_NORM, a.rope.n_rot = 128, a.rope.table = tab;
  a.max_win = 4 * KC_ATTN_SPLIT_MIN; /* 8,000 (sequence, KV head) pairs: many waves */
  const int cw = kc_attn_chunk_win(&a), want = ((a.max_win + split - 1) / split + 1) / 2 * 2;
  a.max_win = 2 * KC_ATTN_SPLIT_MIN - 2; /* (windows of 8 pair up: chunks of even counts) */
  const int cw_short = kc_attn_chunk_win(&a);
  a.max_win = 4 * KC_ATTN_SPLIT_MIN, a.has_quant = 0; /* FullKV: kc_attn_split() */
  const int cw_full = kc_attn_chunk_win(&a), split_f = kc_attn_split();
  const int want_f = ((a.max_win + split_f - 1) / split_f + 1) / 2 * 2;
  a.has_quant = 1;
  const int fails = (cw != want) + (cw_short != 2 * KC_ATTN_SPLIT_MIN - 2) + (cw_full != want_f);
  printf("%s chunking past one wave: %d a chunk of %d windows (want %d), %d of %d (want %d), "
         "FullKV %d (want %d)\n", fails ? "FAIL" : "ok  ", cw, 4 * KC_ATTN_SPLIT_MIN, want,
         cw_short, 2 * KC_ATTN_SPLIT_MIN - 2, 2 * KC_ATTN_SPLIT_MIN - 2, cw_full, want_f);
  return fails + max_chunk_checks(a);
}

int main(int argc, char **argv) {
  int small = 0, bench = 0;
  const char *only = nullptr, *filter = nullptr;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--small"))
      small = 1;
    else if (!strcmp(argv[i], "--bench"))
      bench = 1;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc)
      filter = argv[++i];
    else if (!strcmp(argv[i], "--tma"))
      g_opt.tma = 1;
    else if (!strcmp(argv[i], "--pipes"))
      g_opt.pipes = 1;
    else {
      fprintf(stderr,
              "usage: %s [--small] [--bench [--shapes SUBSTR[,SUBSTR...]] [--tma] [--pipes]] "
              "[--only NAME]\n",
              argv[0]);
      return 2;
    }
  }
  const char *quick = getenv("QE_BENCH_QUICK");
  g_opt.quick = quick && !strcmp(quick, "1");
  if (api_checks()) return 1;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("attn_decode: no CUDA device, skipped\n");
    return 77;
  }
  CK(cudaSetDevice(0));
  if (!bench && split_checks()) return 1;
  return bench ? bench_all(filter) : check_all(small, only);
}
