/* kern_cuda_ops: the CUDA backend's kernels other than GEMM: RMSNorm, RoPE (NORM / NEOX, YaRN,
 * frequency factors), SwiGLU, residual add, embedding, row softmax, the bf16 conversion and
 * bias add of the GEMM path, and a straightforward causal GQA attention over kern_attn_seq_t
 * with per-key attention masses (prefill and decode alike; the tiered fast decode kernel is
 * kern_cuda_attn.cu). Each op follows the CPU reference (kernels/cpu) closely enough that the
 * two agree to fp32 rounding: RoPE angles are built from the same host-computed frequencies
 * with the same unfused float operations, so only cosf/sinf differ (by an ulp or two). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda_internal.h"

/* ---- reductions -------------------------------------------------------------------------- */

/* Butterfly sums: every lane ends with the same bits (each step adds a commutative pair). */
__device__ __forceinline__ float kcu_warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float kcu_warp_max(float v) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Block-wide sum or max (blockDim.x a multiple of 32), returned to every thread. sh: [32]. */
__device__ float kcu_block_reduce(float v, float *sh, int is_max) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = is_max ? kcu_warp_max(v) : kcu_warp_sum(v);
  __syncthreads(); /* sh may still be read by an earlier call */
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float id = is_max ? -INFINITY : 0.0f;
  v = lane < nw ? sh[lane] : id;
  return is_max ? kcu_warp_max(v) : kcu_warp_sum(v);
}

/* ---- element-wise kernels ------------------------------------------------------------------ */

#define KCU_GRID_STRIDE(i, n)                                                                      \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                          \
       i += (size_t)gridDim.x * blockDim.x)

__global__ void kcu_to_bf16_k(__nv_bfloat16 *dst, const float *src, size_t n) {
  KCU_GRID_STRIDE(i, n) dst[i] = __float2bfloat16(src[i]);
}

__global__ void kcu_bias_k(float *y, const float *bias, size_t total, int n) {
  KCU_GRID_STRIDE(i, total) y[i] += bias[i % (size_t)n];
}

/* y[m][n] = silu(gate) * up, the rows of gate and up ld floats apart (n: apart; 2n: one fused
 * projection's output, up = gate + n). yb (when not NULL): the same values in bf16
 * (kcu_xb_out). */
__global__ void kcu_swiglu_k(float *y, __nv_bfloat16 *yb, const float *gate, const float *up,
                             size_t total, int n, int ld) {
  KCU_GRID_STRIDE(i, total) {
    const size_t at = (i / n) * (size_t)ld + i % n;
    float g = gate[at];
    y[i] = g / (1.0f + expf(-g)) * up[at];
    if (yb) yb[i] = __float2bfloat16(y[i]);
  }
}

__global__ void kcu_add_k(float *y, const float *x, size_t n) {
  KCU_GRID_STRIDE(i, n) y[i] += x[i];
}

/* One block per row. */
__global__ void kcu_embed_k(float *y, const float *table, const int32_t *ids, int n) {
  const float *src = table + (size_t)ids[blockIdx.x] * n;
  float *dst = y + (size_t)blockIdx.x * n;
  for (int j = threadIdx.x; j < n; j += blockDim.x) dst[j] = src[j];
}

/* One block per row; y may equal x (every read happens before the reduction's barrier); yb
 * (when not NULL): the same values in bf16 (kcu_xb_out). */
__global__ void kcu_rmsnorm_k(float *y, __nv_bfloat16 *yb, const float *x, const float *g, int n,
                              float eps) {
  __shared__ float sh[32];
  const float *xr = x + (size_t)blockIdx.x * n;
  float *yr = y + (size_t)blockIdx.x * n;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) ss += xr[j] * xr[j];
  ss = kcu_block_reduce(ss, sh, 0);
  float inv = 1.0f / sqrtf(ss / n + eps);
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    yr[j] = xr[j] * inv * g[j];
    if (yb) yb[(size_t)blockIdx.x * n + j] = __float2bfloat16(yr[j]);
  }
}

#define KCU_RMS_T 512 /* threads of the vector form */
#define KCU_RMS_V 4   /* float4 per thread, held in registers: rows of up to 8192 floats */

/* The same for rows of a multiple of 4 floats up to 4 KCU_RMS_T KCU_RMS_V, 16-byte aligned:
 * each thread loads its float4s once, keeps them in registers over the reduction, and writes
 * them scaled (one pass over x instead of two; a decode step's rows are few and short). d (when
 * not NULL): x += d first, written back (kcu_add_rmsnorm: the add kernel's sums, then the same
 * reduction). */
__global__ void __launch_bounds__(KCU_RMS_T)
    kcu_rmsnorm4_k(float *y, __nv_bfloat16 *yb, float *x, const float *d, const float *g, int n,
                   float eps) {
  __shared__ float sh[32];
  float4 *xr = (float4 *)(x + (size_t)blockIdx.x * n);
  const float4 *dr = (const float4 *)(d + (d ? (size_t)blockIdx.x * n : 0)),
               *g4 = (const float4 *)g;
  float4 *yr = (float4 *)(y + (size_t)blockIdx.x * n), v[KCU_RMS_V];
  const int n4 = n / 4;
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < KCU_RMS_V; i++) {
    const int j = threadIdx.x + i * KCU_RMS_T;
    v[i] = j < n4 ? xr[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (d && j < n4) {
      const float4 e = dr[j];
      v[i] = make_float4(v[i].x + e.x, v[i].y + e.y, v[i].z + e.z, v[i].w + e.w);
      xr[j] = v[i];
    }
    ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  }
  ss = kcu_block_reduce(ss, sh, 0);
  const float inv = 1.0f / sqrtf(ss / n + eps);
#pragma unroll
  for (int i = 0; i < KCU_RMS_V; i++) {
    const int j = threadIdx.x + i * KCU_RMS_T;
    if (j >= n4) break;
    const float4 w = g4[j];
    const float4 o =
        make_float4(v[i].x * inv * w.x, v[i].y * inv * w.y, v[i].z * inv * w.z, v[i].w * inv * w.w);
    yr[j] = o;
    if (yb) { /* (8-byte aligned: n is a multiple of 4) */
      __nv_bfloat162 *b2 = (__nv_bfloat162 *)(yb + (size_t)blockIdx.x * n) + 2 * j;
      b2[0] = __floats2bfloat162_rn(o.x, o.y), b2[1] = __floats2bfloat162_rn(o.z, o.w);
    }
  }
}

/* One block per row, in place. */
__global__ void kcu_softmax_k(float *x, int n) {
  __shared__ float sh[32];
  float *xr = x + (size_t)blockIdx.x * n;
  float mx = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, xr[j]);
  mx = kcu_block_reduce(mx, sh, 1);
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float e = expf(xr[j] - mx);
    xr[j] = e;
    s += e;
  }
  s = kcu_block_reduce(s, sh, 0);
  for (int j = threadIdx.x; j < n; j += blockDim.x) xr[j] /= s;
}

/* The rotation of pair i of a head at position p. tab [half][2]: frequency and YaRN mix per
 * pair. The angle uses unfused float products as the CPU reference does; negative positions
 * rotate backwards. */
struct kcu_rope_c {
  const float *tab;
  float freq_scale, mscale;
  int half, neox, ext;
};

__device__ __forceinline__ void kcu_rope_pair(const kcu_rope_c &r, int p, int i, float x0, float x1,
                                              float *y0, float *y1) {
  int ap = p < 0 ? -p : p;
  float sign = p < 0 ? -1.0f : 1.0f, freq = r.tab[2 * i], mix = r.tab[2 * i + 1];
  float extrap = __fmul_rn((float)ap, freq), theta = __fmul_rn(extrap, r.freq_scale);
  if (r.ext) theta = __fadd_rn(__fmul_rn(theta, __fsub_rn(1.0f, mix)), __fmul_rn(extrap, mix));
  float cs = __fmul_rn(cosf(theta), r.mscale),
        sn = __fmul_rn(__fmul_rn(sinf(theta), r.mscale), sign);
  *y0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
  *y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
}

/* One thread per (token, head, pair), in place. */
__global__ void kcu_rope_k(float *x, const int32_t *pos, int m, int n_heads, int head_dim,
                           kcu_rope_c r) {
  size_t total = (size_t)m * n_heads * r.half;
  KCU_GRID_STRIDE(idx, total) {
    int i = (int)(idx % r.half);
    size_t th = idx / r.half; /* token * n_heads + head */
    float *xh = x + th * head_dim;
    int a = r.neox ? i : 2 * i, b = r.neox ? i + r.half : 2 * i + 1;
    kcu_rope_pair(r, pos[th / n_heads], i, xh[a], xh[b], &xh[a], &xh[b]);
  }
}

/* A fused projection's output qkv [m][n_q + 2 n_kv][hd] split into q, k (rotated as kcu_rope_k
 * rotates them) and v. One thread per (token, head, pair i of dims): pair i < half rotates (dims
 * 2i, 2i + 1 or, NEOX, i, i + half: together dims 0 .. n_rot - 1); the others, which are dims
 * n_rot .. hd - 1 in either mode, and every pair of v copy dims 2i and 2i + 1. hd even. */
__global__ void kcu_qkv_rope_k(float *q, float *k, float *v, const float *qkv, const int32_t *pos,
                               int m, int n_q, int n_kv, int hd, kcu_rope_c r) {
  const int nh = n_q + 2 * n_kv, hp = hd / 2;
  size_t total = (size_t)m * nh * hp;
  KCU_GRID_STRIDE(idx, total) {
    int i = (int)(idx % hp), h = (int)(idx / hp % nh), t = (int)(idx / hp / nh);
    const float *src = qkv + ((size_t)t * nh + h) * hd;
    float *dst = h < n_q          ? q + ((size_t)t * n_q + h) * hd
                 : h < n_q + n_kv ? k + ((size_t)t * n_kv + h - n_q) * hd
                                  : v + ((size_t)t * n_kv + h - n_q - n_kv) * hd;
    if (h < n_q + n_kv && i < r.half) {
      int a = r.neox ? i : 2 * i, b = r.neox ? i + r.half : 2 * i + 1;
      kcu_rope_pair(r, pos[t], i, src[a], src[b], &dst[a], &dst[b]);
    } else {
      dst[2 * i] = src[2 * i], dst[2 * i + 1] = src[2 * i + 1];
    }
  }
}

/* ---- launchers --------------------------------------------------------------------------- */

int kcu_to_bf16(kcu_t *c, void *dst, const float *src, size_t n) {
  if (!n) return 0;
  return KCU_LAUNCH(c, kcu_to_bf16_k, kcu_blocks(n), 256, 0, (__nv_bfloat16 *)dst, src, n);
}

/* Where an op writing y[n] also writes its bf16 copy for the matmul after it: c->xb when that is
 * large enough (only kcu_matmul grows it), else NULL; kcu_xb_mark then records it as kcu_matmul
 * records its own conversion, so that a matmul on y as the next op skips its kcu_to_bf16 (the
 * same bits: both round to nearest). $QE_CUDA_FUSE_BF16=0 turns it off. */
static __nv_bfloat16 *kcu_xb_out(kcu_t *c, size_t n) {
  const int ok = c->xb_fuse && c->xb && c->xb_cap >= n * sizeof(__nv_bfloat16);
  return ok ? (__nv_bfloat16 *)c->xb : NULL;
}

static void kcu_xb_mark(kcu_t *c, const float *y, size_t n, const __nv_bfloat16 *yb, int rc) {
  if (yb && !rc) c->xb_src = y, c->xb_n = n, c->xb_seq = c->op_seq;
}

int kcu_add_bias(kcu_t *c, float *y, const float *bias, int m, int n) {
  size_t total = (size_t)m * n;
  if (!total) return 0;
  return KCU_LAUNCH(c, kcu_bias_k, kcu_blocks(total), 256, 0, y, bias, total, n);
}

/* Whether the vector RMSNorm takes rows of n floats at these addresses. */
static int kcu_rms_vec(int n, uintptr_t addrs) {
  return n % 4 == 0 && n <= 4 * KCU_RMS_T * KCU_RMS_V && (addrs & 15) == 0;
}

void kcu_rmsnorm(kern_backend_t *be, float *y, const float *x, const float *g, int m, int n,
                 float eps) {
  kcu_t *c = KCU(be);
  if (kcu_enter(c) || m <= 0 || n <= 0) return;
  const int vec = kcu_rms_vec(n, (uintptr_t)y | (uintptr_t)x | (uintptr_t)g);
  __nv_bfloat16 *yb = kcu_xb_out(c, (size_t)m * n);
  /* (the vector kernel writes x only when given a d) */
  const int rc =
      vec ? KCU_LAUNCH(c, kcu_rmsnorm4_k, m, KCU_RMS_T, 0, y, yb, (float *)x, NULL, g, n, eps)
          : KCU_LAUNCH(c, kcu_rmsnorm_k, m, 256, 0, y, yb, x, g, n, eps);
  kcu_xb_mark(c, y, (size_t)m * n, yb, rc);
}

void kcu_add_rmsnorm(kern_backend_t *be, float *x, const float *d, float *y, const float *g, int m,
                     int n, float eps) {
  kcu_t *c = KCU(be);
  const uintptr_t a = (uintptr_t)y | (uintptr_t)x | (uintptr_t)d | (uintptr_t)g;
  if (!c->add_fuse || !kcu_rms_vec(n, a) || m <= 0 || n <= 0) { /* two kernels */
    kcu_add(be, x, d, (size_t)(m > 0 ? m : 0) * (size_t)(n > 0 ? n : 0));
    kcu_rmsnorm(be, y, x, g, m, n, eps);
    return;
  }
  if (kcu_enter(c)) return;
  __nv_bfloat16 *yb = kcu_xb_out(c, (size_t)m * n);
  const int rc = KCU_LAUNCH(c, kcu_rmsnorm4_k, m, KCU_RMS_T, 0, y, yb, x, d, g, n, eps);
  kcu_xb_mark(c, y, (size_t)m * n, yb, rc);
}

static void kcu_swiglu_ld(kern_backend_t *be, float *y, const float *gate, const float *up, int m,
                          int n, int ld) {
  kcu_t *c = KCU(be);
  size_t total = (size_t)(m > 0 ? m : 0) * (size_t)(n > 0 ? n : 0);
  if (kcu_enter(c) || !total) return;
  __nv_bfloat16 *yb = kcu_xb_out(c, total);
  const int rc =
      KCU_LAUNCH(c, kcu_swiglu_k, kcu_blocks(total), 256, 0, y, yb, gate, up, total, n, ld);
  kcu_xb_mark(c, y, total, yb, rc);
}

void kcu_swiglu(kern_backend_t *be, float *y, const float *gate, const float *up, int m, int n) {
  kcu_swiglu_ld(be, y, gate, up, m, n, n);
}

void kcu_swiglu_cat(kern_backend_t *be, float *y, const float *gu, int m, int n) {
  kcu_swiglu_ld(be, y, gu, gu + n, m, n, 2 * n);
}

void kcu_add(kern_backend_t *be, float *y, const float *x, size_t n) {
  kcu_t *c = KCU(be);
  if (kcu_enter(c) || !n) return;
  KCU_LAUNCH(c, kcu_add_k, kcu_blocks(n), 256, 0, y, x, n);
}

void kcu_embed(kern_backend_t *be, float *y, const float *table, const int32_t *ids, int m, int n) {
  kcu_t *c = KCU(be);
  if (kcu_enter(c) || m <= 0 || n <= 0) return;
  KCU_LAUNCH(c, kcu_embed_k, m, 256, 0, y, table, ids, n);
}

void kcu_softmax(kern_backend_t *be, float *x, int m, int n) {
  kcu_t *c = KCU(be);
  if (kcu_enter(c) || m <= 0 || n <= 0) return;
  KCU_LAUNCH(c, kcu_softmax_k, m, 256, 0, x, n);
}

/* ---- RoPE table (host) --------------------------------------------------------------------- */

/* YaRN ramp and correction dimension: llama.cpp's semantics, as in kern_cpu_attn.c. */
static float kcu_yarn_ramp(float low, float high, int i0) {
  float y = (i0 / 2 - low) / fmaxf(0.001f, high - low);
  return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

static float kcu_corr_dim(int n_rot, int n_ctx_orig, float beta, float base) {
  return n_rot * logf(n_ctx_orig / (beta * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

/* Fills the host table [half][2] (frequency, YaRN mix) of r; returns the magnitude scale. */
static float kcu_rope_fill(const kern_rope_t *r, float *h) {
  int half = r->n_rot / 2, ext = r->ext_factor != 0.0f;
  float lo = 0, hi = 0, mscale = r->attn_factor;
  if (ext) {
    lo = fmaxf(0.0f, floorf(kcu_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_fast, r->theta)));
    hi = fminf(r->n_rot - 1.0f,
               ceilf(kcu_corr_dim(r->n_rot, r->n_ctx_orig, r->beta_slow, r->theta)));
    mscale *= 1.0f + 0.1f * logf(1.0f / r->freq_scale);
  }
  for (int i = 0; i < half; i++) {
    float freq = 1.0f / powf(r->theta, (float)(2 * i) / (float)r->n_rot);
    if (r->factors) freq /= r->factors[i];
    h[2 * i] = freq;
    h[2 * i + 1] = ext ? kcu_yarn_ramp(lo, hi, 2 * i) * r->ext_factor : 0.0f;
  }
  return mscale;
}

/* Uploads r's table when r differs from the last call's parameters. */
static int kcu_rope_table(kcu_t *c, const kern_rope_t *r) {
  if (c->rope_valid && !memcmp(&c->rope_key, r, sizeof *r)) return 0;
  if (kcu_capture_refuse(c, "the rope table")) return QE_EUNSUPPORTED;
  c->epoch++;
  size_t bytes = sizeof(float) * (size_t)r->n_rot; /* [n_rot/2][2] */
  float *h = (float *)realloc(c->rope_host, bytes);
  if (!h) return kcu_fail(c, "out of host memory (rope table)");
  c->rope_host = h;
  c->rope_valid = 0;
  float mscale = kcu_rope_fill(r, h);
  /* the previous table may still be read by queued rope kernels */
  if (c->rope_tab && KCU_CUDA(c, cudaStreamSynchronize(c->stream))) return QE_EBACKEND;
  if (c->rope_tab && KCU_CUDA(c, cudaFree(c->rope_tab))) return QE_EBACKEND;
  c->rope_tab = NULL;
  if (KCU_CUDA(c, cudaMalloc((void **)&c->rope_tab, bytes))) return QE_EBACKEND;
  if (KCU_CUDA(c, cudaMemcpyAsync(c->rope_tab, h, bytes, cudaMemcpyHostToDevice, c->stream)))
    return QE_EBACKEND;
  if (KCU_CUDA(c, cudaStreamSynchronize(c->stream))) return QE_EBACKEND;
  c->rope_key = *r, c->rope_mscale = mscale, c->rope_valid = 1;
  return 0;
}

/* The rope table for r made current and its constants in *rc; non-zero (sticky) on failure. */
static int kcu_rope_prep(kcu_t *c, const kern_rope_t *r, int head_dim, kcu_rope_c *rc) {
  if (r->n_rot > head_dim)
    return kcu_fail(c, "rope: n_rot %d exceeds head_dim %d", r->n_rot, head_dim);
  if (r->n_rot / 2 > 0 && kcu_rope_table(c, r)) return QE_EBACKEND;
  rc->tab = c->rope_tab, rc->freq_scale = r->freq_scale, rc->mscale = c->rope_mscale;
  rc->half = r->n_rot / 2, rc->neox = r->mode == KERN_ROPE_NEOX, rc->ext = r->ext_factor != 0.0f;
  return 0;
}

void kcu_rope(kern_backend_t *be, float *x, const int32_t *pos, int m, int n_heads, int head_dim,
              const kern_rope_t *r) {
  kcu_t *c = KCU(be);
  kcu_rope_c rc;
  if (kcu_enter(c) || m <= 0 || n_heads <= 0 || r->n_rot / 2 <= 0) return;
  if (kcu_rope_prep(c, r, head_dim, &rc)) return;
  size_t total = (size_t)m * n_heads * rc.half;
  KCU_LAUNCH(c, kcu_rope_k, kcu_blocks(total), 256, 0, x, pos, m, n_heads, head_dim, rc);
}

void kcu_qkv_rope(kern_backend_t *be, float *q, float *k, float *v, const float *qkv,
                  const int32_t *pos, int m, int n_q, int n_kv, int head_dim,
                  const kern_rope_t *r) {
  kcu_t *c = KCU(be);
  kcu_rope_c rc;
  if (kcu_enter(c) || m <= 0 || n_q + n_kv <= 0) return;
  if (head_dim <= 0 || head_dim % 2) {
    kcu_fail(c, "qkv_rope: head_dim %d is not even", head_dim);
    return;
  }
  if (kcu_rope_prep(c, r, head_dim, &rc)) return;
  size_t total = (size_t)m * (n_q + 2 * n_kv) * (head_dim / 2);
  KCU_LAUNCH(c, kcu_qkv_rope_k, kcu_blocks(total), 256, 0, q, k, v, qkv, pos, m, n_q, n_kv,
             head_dim, rc);
}

/* ---- attention ----------------------------------------------------------------------------- */

/* One sequence's work as the kernels read it (device copy of kern_attn_seq_t). */
typedef struct {
  const float *q, *k, *v;
  float *out, *mass;
  const int32_t *k_pos;
  int n_q, n_kv, q_pos0, mass_q0;
  long long stat_off; /* first float of this sequence's [n_q][n_head][2] stats; -1 if no mass */
} kcu_attn_desc_t;

#define KCU_ATTN_WARPS 4 /* warps per (query, head) block */
#define KCU_MASS_WARPS 8 /* keys per mass block (one warp each) */
#define KCU_PER_LANE   (KCU_HD_MAX / 32)

/* Keys visible to the query at position qp: a prefix, since key positions ascend. */
__device__ int kcu_visible(const kcu_attn_desc_t &d, int qp) {
  if (!d.k_pos) return qp + 1 < d.n_kv ? qp + 1 : d.n_kv;
  int lo = 0, hi = d.n_kv;
  while (lo < hi) {
    int mid = (lo + hi) >> 1;
    if (d.k_pos[mid] <= qp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Loads a head vector, lane-strided (element lane + 32 t), zero past hd. */
__device__ __forceinline__ void kcu_load_head(float (&r)[KCU_PER_LANE], const float *p, int hd,
                                              int lane) {
#pragma unroll
  for (int t = 0; t < KCU_PER_LANE; t++) {
    int d = lane + 32 * t;
    r[t] = d < hd ? p[d] : 0.0f;
  }
}

/* a · b over the warp: the same bits in every lane and in both kernels. */
__device__ __forceinline__ float kcu_dot(const float (&a)[KCU_PER_LANE],
                                         const float (&b)[KCU_PER_LANE]) {
  float s = 0.0f;
#pragma unroll
  for (int t = 0; t < KCU_PER_LANE; t++) s += a[t] * b[t];
  return kcu_warp_sum(s);
}

/* One block per (sequence = blockIdx.y, query * n_head + head = blockIdx.x): each warp runs an
 * online softmax over keys warp, warp + 4, ...; the warps' partial results are merged. The
 * softmax max and sum go to stats when the sequence wants key masses. */
__global__ __launch_bounds__(KCU_ATTN_WARPS * 32) void kcu_attn_k(const kcu_attn_desc_t *descs,
                                                                  int n_head, int n_kv_head, int hd,
                                                                  float scale, float *stats) {
  __shared__ float s_m[KCU_ATTN_WARPS], s_l[KCU_ATTN_WARPS], s_o[KCU_ATTN_WARPS][KCU_HD_MAX];
  const kcu_attn_desc_t d = descs[blockIdx.y];
  int qh = blockIdx.x;
  if (qh >= d.n_q * n_head) return;
  int i = qh / n_head, h = qh - i * n_head, kvh = h / (n_head / n_kv_head);
  int nk = kcu_visible(d, d.q_pos0 + i);
  if (nk <= 0) return; /* like the CPU reference: out left as it is */
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  size_t stride = (size_t)n_kv_head * hd;
  float qr[KCU_PER_LANE], kr[KCU_PER_LANE], o[KCU_PER_LANE], m = -INFINITY, l = 0.0f;
  kcu_load_head(qr, d.q + (size_t)qh * hd, hd, lane);
#pragma unroll
  for (int t = 0; t < KCU_PER_LANE; t++) o[t] = 0.0f;
  for (int j = warp; j < nk; j += KCU_ATTN_WARPS) {
    kcu_load_head(kr, d.k + (size_t)j * stride + (size_t)kvh * hd, hd, lane);
    float s = kcu_dot(qr, kr) * scale, mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
    const float *vr = d.v + (size_t)j * stride + (size_t)kvh * hd;
    l = l * corr + p;
#pragma unroll
    for (int t = 0; t < KCU_PER_LANE; t++) {
      int dd = lane + 32 * t;
      o[t] = o[t] * corr + (dd < hd ? p * vr[dd] : 0.0f);
    }
    m = mn;
  }
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
#pragma unroll
  for (int t = 0; t < KCU_PER_LANE; t++)
    if (lane + 32 * t < hd) s_o[warp][lane + 32 * t] = o[t];
  __syncthreads();
  float M = -INFINITY, L = 0.0f;
  for (int w = 0; w < KCU_ATTN_WARPS; w++) M = fmaxf(M, s_m[w]);
  for (int w = 0; w < KCU_ATTN_WARPS; w++) L += s_l[w] * expf(s_m[w] - M);
  float *out = d.out + (size_t)qh * hd;
  for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
    float acc = 0.0f;
    for (int w = 0; w < KCU_ATTN_WARPS; w++) acc += s_o[w][dd] * expf(s_m[w] - M);
    out[dd] = acc / L;
  }
  if (d.stat_off >= 0 && threadIdx.x == 0) {
    stats[d.stat_off + 2 * (long long)qh] = M;
    stats[d.stat_off + 2 * (long long)qh + 1] = L;
  }
}

/* One warp per key j of sequence blockIdx.y: key_mass[j] += (1/n_head) sum over heads and over
 * the queries i >= mass_q0 that see j of exp(s_ij - M_i) / L_i, with s recomputed exactly as
 * the attention kernel did. Each key has one writer: no atomics, deterministic. */
__global__ __launch_bounds__(KCU_MASS_WARPS * 32) void kcu_mass_k(const kcu_attn_desc_t *descs,
                                                                  int n_head, int n_kv_head, int hd,
                                                                  float scale, const float *stats) {
  const kcu_attn_desc_t d = descs[blockIdx.y];
  int lane = threadIdx.x & 31, j = blockIdx.x * KCU_MASS_WARPS + (threadIdx.x >> 5);
  if (d.stat_off < 0 || j >= d.n_kv) return;
  int kp = d.k_pos ? d.k_pos[j] : j, group = n_head / n_kv_head;
  int i0 = kp - d.q_pos0 > d.mass_q0 ? kp - d.q_pos0 : d.mass_q0;
  if (i0 < 0) i0 = 0;
  size_t stride = (size_t)n_kv_head * hd;
  float qr[KCU_PER_LANE], kr[KCU_PER_LANE], acc = 0.0f;
  for (int kvh = 0; kvh < n_kv_head && i0 < d.n_q; kvh++) {
    kcu_load_head(kr, d.k + (size_t)j * stride + (size_t)kvh * hd, hd, lane);
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
      for (int i = i0; i < d.n_q; i++) {
        long long qh = (long long)i * n_head + h;
        kcu_load_head(qr, d.q + (size_t)qh * hd, hd, lane);
        float s = kcu_dot(qr, kr) * scale;
        const float *st = stats + d.stat_off + 2 * qh;
        acc += expf(s - st[0]) / st[1];
      }
  }
  if (lane == 0) d.mass[j] += acc / (float)n_head;
}

/* Host descriptors for the call; returns the stats floats needed and the grid extents. */
static void kcu_attn_descs(const kern_attn_seq_t *seqs, int n_seqs, int n_head, kcu_attn_desc_t *dd,
                           size_t *n_stats, int *max_qh, int *max_kv) {
  size_t off = 0;
  *max_qh = 0, *max_kv = 0;
  for (int s = 0; s < n_seqs; s++) {
    const kern_attn_seq_t *q = &seqs[s];
    dd[s] = (kcu_attn_desc_t){q->q,   q->k,    q->v,      q->out,     q->key_mass, q->k_pos,
                              q->n_q, q->n_kv, q->q_pos0, q->mass_q0, -1};
    if (q->key_mass && q->n_q > 0 && q->n_kv > 0) {
      dd[s].stat_off = (long long)off;
      off += 2 * (size_t)q->n_q * n_head;
      if (q->n_kv > *max_kv) *max_kv = q->n_kv;
    }
    if (q->n_q * n_head > *max_qh) *max_qh = q->n_q * n_head;
  }
  *n_stats = off;
}

/* Runs the sequences that take the fused kernel (kcu_flash_takes; their queries from mass_q0 on,
 * when they want key masses, go over KCU_TAIL_GEMM_KV keys to the GEMM path, else, or with
 * QE_CUDA_MASS=ref, to the reference kernel), all in one kcu_flash call, or
 * else the GEMM path (kcu_attn_gemm_takes), and copies the others to c->attn_rest; *n_rest
 * their count. 0 or QE_EBACKEND. */
static int kcu_attn_split(kcu_t *c, const kern_attn_seq_t *seqs, int n_seqs,
                          const kern_attn_shape_t *sh, int *n_rest) {
  *n_rest = 0;
  int n_fl = 0;
  int rc = kcu_grow_host(c, (void **)&c->attn_rest, &c->attn_rest_cap,
                         sizeof(kern_attn_seq_t) * (size_t)n_seqs);
  if (!rc)
    rc = kcu_grow_host(c, (void **)&c->flash_seqs, &c->flash_seqs_cap,
                       sizeof(kern_attn_seq_t) * (size_t)n_seqs);
  for (int i = 0; !rc && i < n_seqs; i++) {
    const kern_attn_seq_t *s = &seqs[i];
    const int m0 = s->mass_q0 > 0 ? s->mass_q0 : 0,
              obs = s->key_mass && m0 < s->n_q ? s->n_q - m0 : 0;
    if (!c->attn_ref_only && !c->attn_no_flash && kcu_flash_takes(s, sh) &&
        obs <= KCU_FLASH_MASS_Q) {
      kern_attn_seq_t head = *s, tail = *s; /* queries [0, n_q - obs) fused, the rest: masses */
      head.n_q = s->n_q - obs, head.key_mass = NULL;
      if (head.n_q > 0) c->flash_seqs[n_fl++] = head;
      size_t skip = (size_t)head.n_q * sh->n_head * sh->head_dim;
      tail.q += skip, tail.out += skip, tail.n_q = obs, tail.q_pos0 += head.n_q, tail.mass_q0 = 0;
      if (obs > 0 && c->attn_mass_gemm && tail.n_kv >= KCU_TAIL_GEMM_KV)
        rc = kcu_attn_gemm(c, &tail, sh);
      else if (obs > 0)
        c->attn_rest[(*n_rest)++] = tail;
    } else if (!c->attn_ref_only && kcu_attn_gemm_takes(s)) {
      rc = kcu_attn_gemm(c, s, sh);
    } else {
      c->attn_rest[(*n_rest)++] = *s;
    }
  }
  return rc || !n_fl ? rc : kcu_flash(c, c->flash_seqs, n_fl, sh);
}

void kcu_attention(kern_backend_t *be, const kern_attn_seq_t *seqs, int n_seqs,
                   const kern_attn_shape_t *sh) {
  kcu_t *c = KCU(be);
  if (kcu_enter(c) || n_seqs <= 0) return;
  if (sh->head_dim <= 0 || sh->head_dim > KCU_HD_MAX || sh->n_kv_head <= 0 ||
      sh->n_head % sh->n_kv_head || n_seqs > 65535) {
    kcu_fail(c, "attention: unsupported shape (head_dim %d, heads %d/%d, %d sequences)",
             sh->head_dim, sh->n_head, sh->n_kv_head, n_seqs);
    return;
  }
  if (kcu_attn_split(c, seqs, n_seqs, sh, &n_seqs) || n_seqs == 0) return;
  seqs = c->attn_rest;
  size_t bytes = sizeof(kcu_attn_desc_t) * (size_t)n_seqs, n_stats = 0;
  int max_qh = 0, max_kv = 0;
  if (kcu_grow_host(c, &c->attn_host, &c->attn_host_cap, bytes)) return;
  if (kcu_grow(c, &c->attn_desc, &c->attn_desc_cap, bytes)) return;
  kcu_attn_descs(seqs, n_seqs, sh->n_head, (kcu_attn_desc_t *)c->attn_host, &n_stats, &max_qh,
                 &max_kv);
  if (n_stats && kcu_grow(c, (void **)&c->attn_stats, &c->attn_stats_cap, n_stats * sizeof(float)))
    return;
  /* pageable source: the copy returns once the descriptors are staged, so the host buffer can
   * be refilled by the next call */
  if (KCU_CUDA(
          c, cudaMemcpyAsync(c->attn_desc, c->attn_host, bytes, cudaMemcpyHostToDevice, c->stream)))
    return;
  if (max_qh <= 0) return;
  const kcu_attn_desc_t *dd = (const kcu_attn_desc_t *)c->attn_desc;
  dim3 grid((unsigned)max_qh, (unsigned)n_seqs);
  if (KCU_LAUNCH(c, kcu_attn_k, grid, KCU_ATTN_WARPS * 32, 0, dd, sh->n_head, sh->n_kv_head,
                 sh->head_dim, sh->scale, c->attn_stats))
    return;
  if (!n_stats) return;
  dim3 mgrid((unsigned)((max_kv + KCU_MASS_WARPS - 1) / KCU_MASS_WARPS), (unsigned)n_seqs);
  KCU_LAUNCH(c, kcu_mass_k, mgrid, KCU_MASS_WARPS * 32, 0, dd, sh->n_head, sh->n_kv_head,
             sh->head_dim, sh->scale, c->attn_stats);
}

/* ---- greedy argmax ------------------------------------------------------------------------- */

/* (value, index) pairs: a beats b when larger, or equal with a lower index; NaN never beats. */
__device__ __forceinline__ void kcu_amax_merge(float *v, int *i, float ov, int oi) {
  if (ov > *v || (ov == *v && oi < *i) || (*v != *v && ov == ov)) *v = ov, *i = oi;
}

/* One block per row. A row holding a NaN or +inf, or only -inf, gives -1 (kern.h). */
__global__ void kcu_argmax_k(const float *x, int n, int32_t *ids) {
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ int bad;
  const float *r = x + (size_t)blockIdx.x * n;
  float v = -INFINITY;
  int idx = 0x7fffffff, nonfinite = 0;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = r[j];
    nonfinite |= e != e || e == INFINITY;
    kcu_amax_merge(&v, &idx, e, j);
  }
  if (__any_sync(0xffffffffu, nonfinite) && (threadIdx.x & 31) == 0) atomicOr(&bad, 1);
  for (int o = 16; o; o >>= 1)
    kcu_amax_merge(&v, &idx, __shfl_xor_sync(0xffffffffu, v, o),
                   __shfl_xor_sync(0xffffffffu, idx, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = v, si[warp] = idx;
  __syncthreads();
  if (warp) return;
  v = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
  idx = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
  for (int o = 16; o; o >>= 1)
    kcu_amax_merge(&v, &idx, __shfl_xor_sync(0xffffffffu, v, o),
                   __shfl_xor_sync(0xffffffffu, idx, o));
  if (lane == 0) ids[blockIdx.x] = bad || idx == 0x7fffffff || v == -INFINITY ? -1 : idx;
}

int kcu_argmax_dev(kern_backend_t *be, const float *x, int m, int n, int32_t *ids) {
  kcu_t *c = KCU(be);
  int rc = kcu_enter(c);
  if (rc) return rc;
  if (m <= 0 || n <= 0 || m > 65535) return qe_errf(QE_EINVAL, "argmax: %d rows of %d", m, n);
  return KCU_LAUNCH(c, kcu_argmax_k, m, 1024, 0, x, n, ids);
}

int kcu_argmax(kern_backend_t *be, const float *x, int m, int n, int32_t *ids) {
  kcu_t *c = KCU(be);
  size_t bytes = sizeof(int32_t) * (size_t)(m > 0 ? m : 0);
  int rc = kcu_enter(c);
  if (!rc) rc = kcu_grow(c, &c->amax, &c->amax_cap, bytes);
  if (!rc) rc = kcu_argmax_dev(be, x, m, n, (int32_t *)c->amax);
  if (!rc)
    rc = KCU_CUDA(c, cudaMemcpyAsync(ids, c->amax, bytes, cudaMemcpyDeviceToHost, c->stream));
  return rc ? rc : KCU_CUDA(c, cudaStreamSynchronize(c->stream));
}
