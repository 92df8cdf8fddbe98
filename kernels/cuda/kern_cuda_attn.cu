/* kern_cuda_attn: decode attention over tiered paged KV on the GPU (see kern_cuda_attn.h for the
 * contract and kern_cuda_attn_dev.cuh for the kernels' design). This file holds the launchers:
 * argument checks, the chunking plan, the RoPE table of the CPU formula, and the two launches
 * (chunk kernel, then, unless every sequence is one chunk, the combine kernel as a programmatic
 * dependent launch on sm_90). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "qe_env.h"
#include "qe_log.h"
#include "qe_status.h"
}
#include "kern_cuda_attn.h"
#include "kern_cuda_attn_dev.cuh"

/* Returns QE_EBACKEND with the call's text, error, file and line unless e is cudaSuccess. */
static int kca_cuda_at(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return 0;
  return qe_errf(QE_EBACKEND, "cuda: %s: %s (%s:%d)", what, cudaGetErrorString(e), file, line);
}
#define KCA_CUDA(call) kca_cuda_at((call), #call, __FILE__, __LINE__)

/* ---------------------------------------------------------------- kernels */

template <int HD, int BITS, int ROT, int PK, int VG, bool G4>
__global__ void __launch_bounds__(KCA_NT, KCA_MINB)
    kca_chunk_kernel(const __grid_constant__ kca_params_t p) {
  extern __shared__ __align__(16) uint8_t kca_smem[];
  const unsigned c = p.cmaj ? blockIdx.z : blockIdx.x, k = p.cmaj ? blockIdx.x : blockIdx.y;
  kca_chunk_body<HD, BITS, ROT, PK, VG, G4>(p, kca_smem, (int)c, (int)k,
                                            (int)(p.cmaj ? blockIdx.y : blockIdx.z), threadIdx.x);
}

__global__ void __launch_bounds__(KCA_CT)
    kca_combine_kernel(const __grid_constant__ kca_params_t p, int hd) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory"); /* the chunk kernel's writes are visible */
#endif
  extern __shared__ float kca_lse_s[];
  kca_combine_body(p, hd, blockIdx.x, blockIdx.y, gridDim.y, threadIdx.x, kca_lse_s);
}

typedef void (*kca_kern_fn)(kca_params_t);

/* A chunk kernel, its dynamic shared memory, and its resident blocks per multiprocessor by device
 * (0: not known yet; kca_slots fills it). */
typedef struct {
  kca_kern_fn fn;
  int smem;
  int *occ; /* [64] */
} kca_kern_t;

/* The occupancy slots of one chunk kernel instantiation. */
template <int HD, int BITS, int R, int PK, int VG, bool G4> static int *kca_occ(void) {
  static int occ[64];
  return occ;
}

template <int HD, int BITS, int R, int PK, int VG, bool G4> static kca_kern_t kca_kern(void) {
  return {kca_chunk_kernel<HD, BITS, R, PK, VG, G4>, kca_smem_bytes<HD, BITS, R, PK>(),
          kca_occ<HD, BITS, R, PK, VG, G4>()};
}

/* The chunk kernel for (head_dim, bits or 0, KCA_ROT_*, windows per tile: kca_pk, value-group
 * shift: kca_vg, GQA <= 4: g4). Windows of 4 (PK 4) only where no key is turned (kca_check_geom
 * refuses the rest); the KCA_G4 build where the kernel has one and g4. */
template <int HD, int BITS, int R, int VG> static kca_kern_t kca_pick_pk(int pk, bool g4) {
  if (pk == 2) {
    if constexpr (kca_g4<HD, BITS, R, 2>::v)
      if (g4) return kca_kern<HD, BITS, R, 2, VG, true>();
    return kca_kern<HD, BITS, R, 2, VG, false>();
  }
  if constexpr (BITS == 0 || R == KCA_ROT_ABS)
    if (pk == 4) return kca_kern<HD, BITS, R, 4, VG, false>();
  return kca_kern<HD, BITS, R, 1, VG, false>();
}

template <int HD, int BITS, int R> static kca_kern_t kca_pick_vg(int pk, int vg, bool g4) {
  if constexpr (HD == 128 && BITS == 2)
    if (vg == 5) return kca_pick_pk<HD, BITS, R, 5>(pk, g4);
  return kca_pick_pk<HD, BITS, R, 0>(pk, g4);
}

template <int HD, int BITS> static kca_kern_t kca_pick_rot(int rot, int pk, int vg, bool g4) {
  if (BITS == 0 || rot == KCA_ROT_NORM) return kca_pick_vg<HD, BITS, KCA_ROT_NORM>(pk, vg, g4);
  if (rot == KCA_ROT_NEOX) return kca_pick_vg<HD, BITS, KCA_ROT_NEOX>(pk, vg, g4);
  return kca_pick_vg<HD, BITS, KCA_ROT_ABS>(pk, vg, g4);
}

template <int HD> static kca_kern_t kca_pick_hd(int bits, int rot, int pk, int vg, bool g4) {
  if (bits == 0) return kca_pick_rot<HD, 0>(rot, pk, vg, g4);
  if (bits == 2) return kca_pick_rot<HD, 2>(rot, pk, vg, g4);
  if (bits == 4) return kca_pick_rot<HD, 4>(rot, pk, vg, g4);
  return kca_pick_rot<HD, 8>(rot, pk, vg, g4);
}

static kca_kern_t kca_pick(const kc_attn_args_t *a) {
  const int bits = a->has_quant ? a->geom.bits : 0, pk = kca_pk(a->geom.omega);
  const int rot = kca_rot_kind(a), vg = kca_vg(a);
  const bool g4 = kca_g4_grp(a->n_head / a->geom.n_kv);
  return a->geom.head_dim == 64 ? kca_pick_hd<64>(bits, rot, pk, vg, g4)
                                : kca_pick_hd<128>(bits, rot, pk, vg, g4);
}

/* ---------------------------------------------------------------- checks */

static int kca_check_rope(const kc_attn_args_t *a) {
  const kc_attn_rope_t *r = &a->rope;
  const int hd = a->geom.head_dim, g = a->geom.group;
  if (a->geom.bits != 2 && a->geom.bits != 4 && a->geom.bits != 8)
    return qe_errf(QE_EINVAL, "kc_attn: geom.bits must be 2, 4 or 8 (got %d)", a->geom.bits);
  if (g < 8 || g % 8 != 0 || hd % g != 0 || hd / g < 2)
    return qe_errf(
        QE_EUNSUPPORTED,
        "kc_attn: geom.group must be a multiple of 8 dividing %d, at most half of it (got %d)", hd,
        g);
  if (r->mode != KERN_ROPE_NORM && r->mode != KERN_ROPE_NEOX)
    return qe_errf(QE_EINVAL, "kc_attn: rope.mode must be NORM or NEOX (got %d)", r->mode);
  if (r->n_rot <= 0 || r->n_rot % 2 != 0 || r->n_rot > hd)
    return qe_errf(QE_EINVAL, "kc_attn: rope.n_rot must be even, in 2..%d (got %d)", hd, r->n_rot);
  if (r->mode == KERN_ROPE_NEOX && r->n_rot != hd)
    return qe_errf(QE_EUNSUPPORTED, "kc_attn: NEOX rope needs n_rot == head_dim (got %d)",
                   r->n_rot);
  if (!r->table) return qe_errf(QE_EINVAL, "kc_attn: rope.table is NULL");
  return 0;
}

/* Everything but the buffers (sizing works before allocating). */
static int kca_check_geom(const kc_attn_args_t *a) {
  if (!a) return qe_errf(QE_EINVAL, "kc_attn: no arguments");
  const kern_paged_geom_t *g = &a->geom;
  if (g->head_dim != 64 && g->head_dim != 128)
    return qe_errf(QE_EUNSUPPORTED, "kc_attn: geom.head_dim must be 64 or 128 (got %d)",
                   g->head_dim);
  if (g->n_kv < 1 || g->n_kv > 65535)
    return qe_errf(QE_EINVAL, "kc_attn: geom.n_kv must be in 1..65535 (got %d)", g->n_kv);
  if (a->n_head < 1 || a->n_head % g->n_kv != 0 || a->n_head / g->n_kv > KCA_GMAX)
    return qe_errf(QE_EUNSUPPORTED, "kc_attn: n_head must be n_kv * (1..%d) (got %d, n_kv %d)",
                   KCA_GMAX, a->n_head, g->n_kv);
  if (g->omega != 4 && g->omega != 8 && (g->omega % 16 != 0 || g->omega < 16 || g->omega > 1024))
    return qe_errf(QE_EUNSUPPORTED,
                   "kc_attn: geom.omega must be 4, 8 or a multiple of 16 up to 1024 (got %d)",
                   g->omega);
  if (g->omega == 4 && a->has_quant && !a->abs_keys)
    return qe_errf(QE_EUNSUPPORTED,
                   "kc_attn: windows of 4 tokens need post-RoPE QUANT keys (abs_keys 1)");
  if ((long long)g->omega * g->n_kv * g->head_dim * 2 > 0x7fffffffLL)
    return qe_errf(QE_EUNSUPPORTED,
                   "kc_attn: a window's page (omega %d x n_kv %d x head_dim %d x 2 bytes) must be "
                   "under 2 GiB",
                   g->omega, g->n_kv, g->head_dim);
  if (a->n_seq < 1 || a->n_seq > 65535)
    return qe_errf(QE_EINVAL, "kc_attn: n_seq must be in 1..65535 (got %d)", a->n_seq);
  if (a->n_win < 0 || a->max_win < 0 || a->chunk_win < 0)
    return qe_errf(QE_EINVAL, "kc_attn: n_win, max_win and chunk_win must be >= 0");
  if (!(a->scale == a->scale) || isinf(a->scale))
    return qe_errf(QE_EINVAL, "kc_attn: scale must be finite");
  if (a->abs_keys != 0 && a->abs_keys != 1)
    return qe_errf(QE_EINVAL, "kc_attn: abs_keys must be 0 or 1 (got %d)", a->abs_keys);
  return a->has_quant ? kca_check_rope(a) : 0;
}

int kc_attn_check(const kc_attn_args_t *a) {
  const int rc = kca_check_geom(a);
  if (rc) return rc;
  if (!a->seq_win || !a->q || !a->out || !a->ws || (a->n_win > 0 && !a->win))
    return qe_errf(QE_EINVAL, "kc_attn: seq_win, q, out, ws (and win) must be set");
  if ((uintptr_t)a->q % 16)
    return qe_errf(QE_EINVAL, "kc_attn: q must be 16-byte aligned (it is read as float4)");
  return 0;
}

/* ---------------------------------------------------------------- planning */

/* Multiprocessors of the current device and resident chunk blocks per multiprocessor of the
 * call's kernel (both cached; benign races write the same values). */
static int kca_slots(const kc_attn_args_t *a, int *slots, int *n_sm = NULL) {
  static int sms[64];
  int dev = 0;
  if (KCA_CUDA(cudaGetDevice(&dev))) return QE_EBACKEND;
  const int d = dev & 63;
  const kca_kern_t k = kca_pick(a);
  if (!__atomic_load_n(&sms[d], __ATOMIC_RELAXED)) {
    int v = 0;
    if (KCA_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev)))
      return QE_EBACKEND;
    __atomic_store_n(&sms[d], v, __ATOMIC_RELAXED);
  }
  int *o = &k.occ[d];
  if (!__atomic_load_n(o, __ATOMIC_RELAXED)) {
    int v = 0;
    if (KCA_CUDA(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem)) ||
        KCA_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k.fn, KCA_NT, k.smem)))
      return QE_EBACKEND;
    __atomic_store_n(o, v > 0 ? v : 1, __ATOMIC_RELAXED);
  }
  *slots = __atomic_load_n(&sms[d], __ATOMIC_RELAXED) * __atomic_load_n(o, __ATOMIC_RELAXED);
  if (n_sm) *n_sm = __atomic_load_n(&sms[d], __ATOMIC_RELAXED);
  return 0;
}

/* $name (lo..hi, qe_env_long), else dflt (>= -1), read once into *cache: the value + 2, 0 while
 * not read yet (benign race: every reader computes the same value). */
static int kca_env_once(int *cache, const char *name, int lo, int hi, int dflt) {
  int v = __atomic_load_n(cache, __ATOMIC_RELAXED);
  if (!v) __atomic_store_n(cache, v = (int)qe_env_long(name, lo, hi, dflt) + 2, __ATOMIC_RELAXED);
  return v - 2;
}

static int kca_split_env(void) { /* $QE_CUDA_ATTN_SPLIT, -1 when unset or out of range */
  static int v;
  return kca_env_once(&v, "QE_CUDA_ATTN_SPLIT", 1, 8, -1);
}
int kc_attn_split(void) {
  const int v = kca_split_env();
  return v > 0 ? v : KC_ATTN_SPLIT;
}
int kc_attn_split_wide(void) {
  const int v = kca_split_env();
  return v > 0 ? v : KC_ATTN_SPLIT_WIDE;
}

/* Whether a call of n_seq sequences is wide (kern_cuda_attn.h): tiered, and its long sequences
 * in KC_ATTN_SPLIT chunks would fill more than two waves of slots. */
static bool kca_wide(const kc_attn_args_t *a, int slots, long n_seq) {
  return a->has_quant && n_seq * a->geom.n_kv * KC_ATTN_SPLIT > 2L * slots;
}

/* Chunks a sequence of the call's n_seq sequences with windows mw (slots: resident chunk blocks of
 * the device). One wave: about `slots` blocks of (sequence, KV head, chunk). Past one wave (with
 * masses, past half of one), long sequences in KC_ATTN_SPLIT chunks, or KC_ATTN_SPLIT_WIDE in a
 * wide call (kern_cuda_attn.h). */
static long kca_per_seq(const kc_attn_args_t *a, int slots, long n_seq, int mw) {
  const long pairs = n_seq * a->geom.n_kv;
  const bool split = pairs > slots || (a->mass && 2 * pairs > slots);
  if (split && mw >= 2 * KC_ATTN_SPLIT_MIN)
    return kca_wide(a, slots, n_seq) ? kc_attn_split_wide() : kc_attn_split();
  return slots / pairs > 1 ? slots / pairs : 1;
}

/* The chunk size (windows) of per_seq chunks over mw windows: at least 8 units, whole units. */
static int kca_cw(const kc_attn_args_t *a, long per_seq, int mw) {
  const int unit = kca_pk(a->geom.omega);
  int cw = (int)((mw + per_seq - 1) / per_seq);
  cw = cw < 8 * unit ? 8 * unit : cw;
  return (cw + unit - 1) / unit * unit;
}

int kc_attn_chunk_win(const kc_attn_args_t *a) {
  int rc = kca_check_geom(a), slots = 0;
  if (rc) return rc;
  if (a->chunk_win > 0) return a->chunk_win;
  if ((rc = kca_slots(a, &slots))) return rc;
  const int mw = a->max_win > 0 ? a->max_win : 1;
  return kca_cw(a, kca_per_seq(a, slots, a->n_seq, mw), mw);
}

int kc_attn_max_chunks(const kc_attn_args_t *a, int n_seq_min) {
  int slots = 0, rc = kca_check_geom(a);
  if (rc) return rc;
  if (n_seq_min < 1 || n_seq_min > a->n_seq)
    return qe_errf(QE_EINVAL, "kc_attn_max_chunks: n_seq_min must be in 1..n_seq");
  if ((rc = kca_slots(a, &slots))) return rc;
  /* each n_seq's chunks a sequence below and from the split's length (lo, hi); the count is not
     monotonic in n_seq (one chunk up to a wave, KC_ATTN_SPLIT past it), so each distinct pair is
     walked over every max_win */
  const int top = a->max_win > 0 ? a->max_win : 1;
  long seen[64][2];
  int n_seen = 0, most = 1;
  for (long n = n_seq_min; n <= a->n_seq; n++) {
    const long lo = kca_per_seq(a, slots, n, 1);
    const long hi = kca_per_seq(a, slots, n, 2 * KC_ATTN_SPLIT_MIN);
    int k = 0;
    while (k < n_seen && (seen[k][0] != lo || seen[k][1] != hi)) k++;
    if (k < n_seen) continue;
    if (n_seen < 64) seen[n_seen][0] = lo, seen[n_seen][1] = hi, n_seen++;
    for (int mw = 1; mw <= top; mw++) {
      const int cw = kca_cw(a, mw >= 2 * KC_ATTN_SPLIT_MIN ? hi : lo, mw);
      most = (mw + cw - 1) / cw > most ? (mw + cw - 1) / cw : most;
    }
  }
  return most;
}

int kc_attn_ws_bytes(const kc_attn_args_t *a, size_t *bytes) {
  const int cw = kc_attn_chunk_win(a);
  if (cw < 0) return cw;
  *bytes = kca_ws_layout(a, cw).total;
  return 0;
}

/* ---------------------------------------------------------------- RoPE table */

int kc_attn_rope_init(const kern_rope_t *r, float *table_host, kc_attn_rope_t *out) {
  if (!r || !table_host || !out) return qe_errf(QE_EINVAL, "kc_attn_rope_init: NULL argument");
  if (kca_rope_fill(r, table_host, out))
    return qe_errf(QE_EINVAL, "kc_attn_rope_init: n_rot must be even and positive (got %d)",
                   r->n_rot);
  return 0;
}

/* ---------------------------------------------------------------- the call */

/* Compute capability major of the current device (cached). */
static int kca_cc_major(int *major) {
  static int cc[64];
  int dev = 0;
  if (KCA_CUDA(cudaGetDevice(&dev))) return QE_EBACKEND;
  if (!__atomic_load_n(&cc[dev & 63], __ATOMIC_RELAXED)) {
    int v = 0;
    if (KCA_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev)))
      return QE_EBACKEND;
    __atomic_store_n(&cc[dev & 63], v, __ATOMIC_RELAXED);
  }
  *major = __atomic_load_n(&cc[dev & 63], __ATOMIC_RELAXED);
  return 0;
}

/* The combine kernel, programmatically dependent on the chunk kernel where the GPU has it. */
static int kca_launch_combine(const kc_attn_args_t *a, const kca_params_t *p, cudaStream_t s) {
  int major = 0;
  if (kca_cc_major(&major)) return QE_EBACKEND;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3((unsigned)a->n_seq, (unsigned)kca_combine_parts(a), 1);
  cfg.blockDim = dim3(KCA_CT, 1, 1);
  cfg.dynamicSmemBytes = (size_t)kca_combine_smem(a->n_head) * sizeof(float);
  cfg.stream = s;
  if (major >= 9) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  if (KCA_CUDA(cudaLaunchKernelEx(&cfg, kca_combine_kernel, *p, a->geom.head_dim)))
    return QE_EBACKEND;
  return KCA_CUDA(cudaGetLastError()) ? QE_EBACKEND : 0;
}

#ifndef KCA_LEAD_PM_FULL /* the leads' permille of a chunk by default (kca_lead_pm) */
#define KCA_LEAD_PM_FULL 0
#endif
#ifndef KCA_LEAD_PM_QUANT
#define KCA_LEAD_PM_QUANT 75
#endif
#ifndef KCA_LEAD_PM_WIDE /* wide tiered calls' lead (kca_wide) */
#define KCA_LEAD_PM_WIDE 300
#endif

/* The permille of a chunk that a call's lead may take: $QE_CUDA_ATTN_LEAD (0..900, read once;
 * *forced 1: every call of two or more chunks takes it, whatever its waves), else
 * KCA_LEAD_PM_FULL or _QUANT by the cache's tiers. */
static int kca_lead_pm(const kc_attn_args_t *a, int *forced) {
  static int env;
  const int v = kca_env_once(&env, "QE_CUDA_ATTN_LEAD", 0, 900, -1); /* (-1: unset) */
  *forced = v >= 0;
  return v >= 0 ? v : a->has_quant ? KCA_LEAD_PM_QUANT : KCA_LEAD_PM_FULL;
}

/* The lead (kca_chunk_beg) of a call of n_chunk chunks of cw windows on slots resident blocks
 * over n_sm multiprocessors: by default only for one wave in which some multiprocessors hold
 * two blocks, and for wide tiered calls (KCA_LEAD_PM_WIDE); in whole units of the walk. */
static int kca_lead(const kc_attn_args_t *a, int cw, int n_chunk, int slots, int n_sm) {
  int forced = 0, pm = kca_lead_pm(a, &forced);
  const int unit = kca_pk(a->geom.omega);
  const long blocks = (long)a->n_seq * a->geom.n_kv * n_chunk;
  if (!forced && kca_wide(a, slots, a->n_seq))
    pm = KCA_LEAD_PM_WIDE;
  else if (!forced && (blocks > slots || blocks <= n_sm || slots < 2 * n_sm))
    return 0;
  if (pm == 0 || n_chunk < 2) return 0;
  return (int)((long)cw * pm / 1000 / unit * unit);
}

/* Whether a call of n_chunk chunks on slots resident blocks spreads its blocks' FULL tiles among
 * their quads: $QE_CUDA_ATTN_SPREAD (0 or 1, read once), else in tiered calls of at most two
 * waves (past them blocks run out of step, and one's FULL tiles overlap another's quads anyway:
 * +0.9% at long_ctx's 121 sequences against -3.3% at B=8 32K, H200). */
static bool kca_spread(const kc_attn_args_t *a, int n_chunk, int slots) {
  static int env;
  const int v = kca_env_once(&env, "QE_CUDA_ATTN_SPREAD", 0, 1, -1); /* (-1: unset) */
  if (v >= 0) return v == 1;
  return a->has_quant && (long)a->n_seq * a->geom.n_kv * n_chunk <= 2L * slots;
}

/* The order word (kc_attn_lead) of a call of n_chunk chunks of cw windows. */
static int kca_order(const kc_attn_args_t *a, int cw, int n_chunk, int slots, int n_sm) {
  const int spread = kca_spread(a, n_chunk, slots) ? KC_ATTN_SPREAD : 0;
  return kca_lead(a, cw, n_chunk, slots, n_sm) | spread;
}

int kc_attn_lead(const kc_attn_args_t *a) {
  const int cw = kc_attn_chunk_win(a);
  int slots = 0, n_sm = 0;
  if (cw < 0) return cw;
  if (kca_slots(a, &slots, &n_sm)) return QE_EBACKEND;
  const int mw = a->max_win > 0 ? a->max_win : 1;
  return kca_order(a, cw, (mw + cw - 1) / cw, slots, n_sm);
}

/* Whether a launch's grid is chunk-major (so that a lead's longer chunks are placed first): with
 * a lead; for chunk_dev launches (whose steps' leads come from chunk_dev[1]) when a lead may
 * come and the launch's blocks fill at most two waves, or the bucket is wide (kca_wide), or the
 * lead is forced. (A bucket of more blocks keeps its order otherwise: a step of it that leads
 * has the eager launch's bits, not its speed.) */
static int kca_cmaj(const kc_attn_args_t *a, int lead, int n_chunk, int slots) {
  int forced = 0;
  if (!a->chunk_dev) return lead > 0;
  const long blocks = (long)a->n_seq * a->geom.n_kv * n_chunk;
  const int pm = kca_lead_pm(a, &forced);
  if (n_chunk < 2) return 0;
  return forced ? pm > 0 : kca_wide(a, slots, a->n_seq) || (pm > 0 && blocks <= 2L * slots);
}

int kc_attn_decode(const kc_attn_args_t *a, void *stream) {
  int rc = kc_attn_check(a);
  if (rc) return rc;
  const int cw = kc_attn_chunk_win(a);
  if (cw < 0) return cw;
  const kca_ws_t w = kca_ws_layout(a, cw);
  if (a->chunk_dev && a->max_chunk < 1)
    return qe_errf(QE_EINVAL, "kc_attn: max_chunk must be >= 1 with chunk_dev");
  if (a->ws_bytes < w.total)
    return qe_errf(QE_EINVAL, "kc_attn: workspace of %zu bytes, %zu needed", a->ws_bytes, w.total);
  if (w.n_chunk > 65535)
    return qe_errf(QE_EUNSUPPORTED, "kc_attn: %d chunks per sequence (at most 65535)", w.n_chunk);
  kca_params_t p = kca_params(a, cw);
  cudaStream_t s = (cudaStream_t)stream;
  const kca_kern_t k = kca_pick(a);
  int slots = 0, n_sm = 0; /* also sets the kernel's shared-memory attribute on first use */
  if (kca_slots(a, &slots, &n_sm)) return QE_EBACKEND;
  p.lead = a->chunk_dev ? 0 : kca_order(a, cw, w.n_chunk, slots, n_sm);
  p.cmaj = kca_cmaj(a, p.lead & (KC_ATTN_SPREAD - 1), w.n_chunk, slots);
  const unsigned nc = (unsigned)w.n_chunk, nk = (unsigned)a->geom.n_kv, ns = (unsigned)a->n_seq;
  const dim3 grid = p.cmaj ? dim3(nk, ns, nc) : dim3(nc, nk, ns);
  k.fn<<<grid, KCA_NT, (size_t)k.smem, s>>>(p);
  if (KCA_CUDA(cudaGetLastError())) return QE_EBACKEND;
  if ((a->flags & KC_ATTN_SKIP_COMBINE) || (w.n_chunk == 1 && (!a->mass || a->tickets))) return 0;
  return kca_launch_combine(a, &p, s);
}

#if KCA_TRACE
#include <algorithm>
#include <vector>

/* Diagnostics builds (-DKCA_TRACE=1): clears kca_trace before a traced call. */
int kc_attn_trace_reset(void) {
  void *t = nullptr;
  if (KCA_CUDA(cudaGetSymbolAddress(&t, kca_trace))) return QE_EBACKEND;
  return KCA_CUDA(cudaMemset(t, 0, sizeof kca_trace));
}

/* Prints one JSON line of the traced call's block timeline (us; means over its blocks): the
 * span of the launch, a block's time, its list, its warps' first compute (the earliest and the
 * latest warp), their walk ends, and the block's end after its last walk (the epilogue). */
int kc_attn_trace_report(const char *name) {
  static unsigned long long h[KCA_TR_MAX * KCA_TR_N];
  int dev = 0, khz = 0;
  if (KCA_CUDA(cudaMemcpyFromSymbol(h, kca_trace, sizeof h)) || KCA_CUDA(cudaGetDevice(&dev)) ||
      KCA_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev)))
    return QE_EBACKEND;
  const double cyc = khz / 1e3; /* cycles a microsecond */
  double n = 0, dur = 0, lst = 0, f0 = 0, f1 = 0, e0 = 0, e1 = 0, epi = 0, ld = 0, sc = 0, gd = 0;
  std::vector<double> ends;
  unsigned long long g0 = ~0ull, g1 = 0, gs1 = 0;
  for (int k = 0; k < KCA_TR_MAX; k++) {
    const unsigned long long *r = h + (size_t)k * KCA_TR_N;
    if (!r[0] || !r[4]) continue;
    double a = 1e30, b = 0, c = 1e30, d = 0;
    for (int w = 0; w < KCA_NW; w++) {
      const unsigned long long f = r[9 + w], e = r[9 + KCA_NW + w];
      if (f) a = fmin(a, (double)(f - r[2])), b = fmax(b, (double)(f - r[2]));
      if (e) c = fmin(c, (double)(e - r[2])), d = fmax(d, (double)(e - r[2]));
    }
    n++, dur += (double)(r[4] - r[2]), lst += (double)(r[3] - r[2]);
    f0 += a < 1e30 ? a : 0, f1 += b, e0 += c < 1e30 ? c : 0, e1 += d;
    epi += (double)(r[4] - r[2]) - d, gd += (double)(r[5] - r[0]);
    ld += r[6] > r[2] ? (double)(r[6] - r[2]) : 0, sc += r[7] > r[2] ? (double)(r[7] - r[2]) : 0;
    g0 = r[0] < g0 ? r[0] : g0, g1 = r[5] > g1 ? r[5] : g1, gs1 = r[0] > gs1 ? r[0] : gs1;
  }
  if (n == 0) return qe_errf(QE_EBACKEND, "kca_trace: no block stamped");
  for (int k = 0; k < KCA_TR_MAX; k++) {
    const unsigned long long *r = h + (size_t)k * KCA_TR_N;
    if (!r[0] || !r[4]) continue;
    ends.push_back((double)(r[5] - g0) / 1e3);
    if (getenv("KCA_TRACE_BLOCKS")) { /* block, SM, start and end ns, cycles, FULL, QUANT, then
                                         each warp's walk end (cycles from the block's start) */
      printf("tr %s %d %llu %llu %llu %llu %llu %llu", name, k, r[1] & 0xffffffffull, r[0] - g0,
             r[5] - g0, r[4] - r[2], r[8] & 0xffffffffull, r[8] >> 32);
      for (int w = 0; w < KCA_NW; w++)
        printf(" %lld", r[9 + KCA_NW + w] ? (long long)(r[9 + KCA_NW + w] - r[2]) : -1ll);
      printf("\n");
    }
  }
  std::sort(ends.begin(), ends.end());
  const double u = n * cyc, q50 = ends[ends.size() / 2], q90 = ends[ends.size() * 9 / 10];
  printf("{\"trace\": \"%s\", \"blocks\": %.0f, \"span_us\": %.2f, \"start_spread_us\": %.2f, "
         "\"block_us\": %.2f, \"block_gt_us\": %.2f, \"end_us_p50_p90_max\": [%.2f, %.2f, %.2f], "
         "\"list_us\": [%.2f, %.2f, %.2f], \"first_compute_us\": [%.2f, %.2f], "
         "\"walk_end_us\": [%.2f, %.2f], \"after_walks_us\": %.2f}\n",
         name, n, (g1 - g0) / 1e3, (gs1 - g0) / 1e3, dur / u, gd / n / 1e3, q50, q90, ends.back(),
         ld / u, sc / u, lst / u, f0 / u, f1 / u, e0 / u, e1 / u, epi / u);
  return 0;
}
#endif
