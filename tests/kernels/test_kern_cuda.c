/* test_kern_cuda: every op of the CUDA backend against the CPU backend (the fp32 reference) on
 * fresh random data of several shapes, each GPU output poisoned with NaN first (an element the
 * GPU never writes fails the check):
 * - matmul with and without bias, accumulating or not, through cuBLASLt and through cuBLAS
 *   GemmEx (QE_CUDA_GEMM=gemmex), over a plain fp32 weight and again after that buffer is
 *   rewritten (read afresh): bf16 operands, normalized error < 1e-2;
 * - weight_upload: the device holds exactly the round-to-nearest-even bf16 of every host value
 *   (a matrix above one 64 MiB staging chunk included), and a matmul over it is within 1e-2 of
 *   the CPU backend's;
 * - RMSNorm, RoPE (NORM / NEOX, partial rotation, frequency factors, YaRN, negative and large
 *   positions), SwiGLU, add, embedding, softmax: max relative error < 1e-5 (3e-5 for softmax
 *   rows past 4096, where the CPU's sequential sum drifts), add and embedding bit-exact;
 * - the fused projections' ops: qkv_rope (split and rotated: the bits of the columns copied out
 *   and rope, within 1e-5 of the CPU), swiglu_cat (swiglu's bits), weight_concat (a matmul over
 *   the stack within 1e-2 of the CPU's over the parts; mixed parts refused, parts kept);
 * - causal GQA attention over several sequences at once (prefill, chunked prefill, decode,
 *   explicit key positions) with per-key masses: max relative error < 1e-4 on the reference
 *   kernel, normalized error < 2e-3 on the fused prefill kernel (fp16 tensor cores; GQA groups of
 *   1, 3, 4, 8, head_dim 64 and 128) and on the GEMM path (TF32; QE_CUDA_PREFILL=gemm);
 *   `--attention` runs these alone, `--fused` the fused kernel's cases alone and `--chunks` the
 *   GEMM path's chunked case alone (sanitizers); `--prefill-bench` times the prefill attention
 *   (reports, asserts nothing);
 * - sampling (greedy with ties, seeded temperature / top-k / top-p): the same ids and the same
 *   rng states on many rows; the device argmax (greedy steps) equal to the CPU backend's on
 *   random rows up to 128,256 columns, ties, NaN and constant rows (identical on an H100,
 *   2026-12-07);
 * - whole models, teacher-forced on the CPU's greedy tokens: stories260K (when
 *   QE_SHARED_MODELS has it) and random llama / qwen2 models written here (one with a 600-token
 *   prompt: past MODEL_FUSE_ROWS, the stacked FFN weights' halves); every position's
 *   logits within 5e-2 normalized error, and every position's argmax agrees unless the CPU's
 *   own margin between the two candidates is under 2% of the row's RMS logit (a near-tie);
 * - the "tiny" model_create_random shape, tied and untied, on both backends: prefill logits
 *   within 5e-2, and the GPU holds every matrix once, in bf16 (its weight bytes are the CPU's
 *   less 2 per matrix element; a tied output adds a bf16 copy beside the fp32 token_embd);
 * - with NCCL: a 1-rank communicator's all-reduce, broadcast and all-gather on device buffers.
 * Exits 77 when there is no CUDA device. Also a tool for bench/gpu_ops.sh:
 *   test_kern_cuda --gap MODEL N_PROMPT ID,ID,...
 * teacher-forces the ids through both backends and prints the first position where the GPU's
 * greedy choice differs from the next id, with the logit gaps on both backends; and
 *   test_kern_cuda --random SHAPE
 * builds model_create_random(SHAPE) on the GPU, prints its build time and weight bytes, and
 * runs a 16-token prefill and 4 decode steps (finite logits or exit 1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda/kern_cuda.h"
#include "model_gen.h"
#include "qe_status.h"
#include "rand_model.h"
#include "test_util.h"
#ifdef QE_HAVE_NCCL
#include "tp_comm.h"
#endif

static kern_backend_t *g_cpu, *g_gpu;
static uint64_t rs = 0x5eedf00dULL;

static float *randv(size_t n, float amp) {
  float *v = malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) v[i] = tu_randf(&rs, -amp, amp);
  return v;
}

/* A backend buffer holding a copy of host bytes h. */
static void *bput(kern_backend_t *be, const void *h, size_t bytes) {
  void *d = kern_alloc(be, bytes ? bytes : 4);
  CHECK(d != NULL);
  if (d && bytes) CHECK_OK(be->ops->upload(be, d, h, bytes));
  return d;
}

/* A backend buffer of n NaNs. */
static float *bpoison(kern_backend_t *be, size_t n) {
  float *h = malloc(sizeof(float) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) h[i] = NAN;
  float *d = bput(be, h, sizeof(float) * n);
  free(h);
  return d;
}

/* A malloc'd host copy of n floats of backend buffer d. */
static float *bget(kern_backend_t *be, const float *d, size_t n) {
  float *h = malloc(sizeof(float) * (n ? n : 1));
  CHECK_OK(be->ops->download(be, h, d, sizeof(float) * n));
  return h;
}

/* ||a - ref|| / ||ref|| (INFINITY if a holds a NaN or Inf). */
static double nerr(const float *a, const float *ref, size_t n) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(a[i])) return INFINITY;
    num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  return sqrt(num / den);
}

static int bits_equal(const float *a, const float *b, size_t n) {
  return !memcmp(a, b, sizeof(float) * n);
}

/* ---- matmul ---------------------------------------------------------------------------------- */

static void check_matmul(kern_backend_t *gpu, const char *path, int m, int n, int k, int bias,
                         int acc) {
  float *x = randv((size_t)m * k, 1), *w = randv((size_t)n * k, 1), *b = randv(n, 1);
  float *y0 = randv((size_t)m * n, 1), *ref = malloc(sizeof(float) * m * n);
  memcpy(ref, y0, sizeof(float) * m * n);
  kern_weight_t wc = {w, n, k, KERN_WEIGHT_F32};
  g_cpu->ops->matmul(g_cpu, ref, x, &wc, bias ? b : NULL, m, acc);
  kern_weight_t wg = {bput(gpu, w, sizeof(float) * n * k), n, k, KERN_WEIGHT_F32};
  float *dx = bput(gpu, x, sizeof(float) * m * k), *db = bput(gpu, b, sizeof(float) * n);
  float *dy = acc ? bput(gpu, y0, sizeof(float) * m * n) : bpoison(gpu, (size_t)m * n);
  gpu->ops->matmul(gpu, dy, dx, &wg, bias ? db : NULL, m, acc);
  float *y = bget(gpu, dy, (size_t)m * n);
  double e = nerr(y, ref, (size_t)m * n);
  fprintf(stderr, "matmul %-7s m %4d n %5d k %5d%s%s: normalized error %.2e\n", path, m, n, k,
          bias ? " +bias" : "", acc ? " +acc" : "", e);
  CHECK(e < 1e-2);
  free(y);
  /* rewrite the weight in place: the bf16 copy must follow */
  float *w2 = randv((size_t)n * k, 1);
  kern_weight_t wc2 = {w2, n, k, KERN_WEIGHT_F32};
  g_cpu->ops->matmul(g_cpu, ref, x, &wc2, NULL, m, 0);
  CHECK_OK(gpu->ops->upload(gpu, wg.data, w2, sizeof(float) * n * k));
  gpu->ops->matmul(gpu, dy, dx, &wg, NULL, m, 0);
  y = bget(gpu, dy, (size_t)m * n);
  e = nerr(y, ref, (size_t)m * n);
  CHECK(e < 1e-2);
  if (!(e < 1e-2)) fprintf(stderr, "  after rewriting the weight: %.2e\n", e);
  free(y);
  kern_free(gpu, wg.data), kern_free(gpu, dx), kern_free(gpu, db), kern_free(gpu, dy);
  free(x), free(w), free(w2), free(b), free(y0), free(ref);
}

static void check_matmuls(kern_backend_t *gpu, const char *path) {
  static const int shapes[][3] = {{1, 37, 70},      {3, 64, 172},     {7, 512, 64},
                                  {64, 1000, 256},  {300, 256, 1024}, {1, 4096, 4096},
                                  {16, 2048, 4096}, {5, 32000, 288}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int v = 0; v < 3; v++)
      check_matmul(gpu, path, shapes[i][0], shapes[i][1], shapes[i][2], v == 1, v == 2);
}

/* ---- weight_upload ----------------------------------------------------------------------- */

/* The round-to-nearest-even bf16 bits of a finite f. */
static uint16_t bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static void check_weight_upload(int rows, int cols, int m) {
  size_t n = (size_t)rows * cols, ny = (size_t)m * rows;
  float *w = randv(n, 1), *x = randv((size_t)m * cols, 1), *ref = malloc(sizeof(float) * ny);
  uint16_t *bits = malloc(sizeof(uint16_t) * n);
  kern_weight_t wc, wg;
  CHECK_OK(g_cpu->ops->weight_upload(g_cpu, &wc, w, rows, cols));
  CHECK_OK(g_gpu->ops->weight_upload(g_gpu, &wg, w, rows, cols));
  CHECK(wc.dtype == KERN_WEIGHT_F32 && wg.dtype == KERN_WEIGHT_BF16);
  CHECK(wg.rows == rows && wg.cols == cols && kern_weight_bytes(&wg) == 2 * n);
  CHECK_OK(g_gpu->ops->download(g_gpu, bits, wg.data, sizeof(uint16_t) * n));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += bits[i] != bf16_bits(w[i]);
  g_cpu->ops->matmul(g_cpu, ref, x, &wc, NULL, m, 0);
  float *dx = bput(g_gpu, x, sizeof(float) * m * cols), *dy = bpoison(g_gpu, ny);
  g_gpu->ops->matmul(g_gpu, dy, dx, &wg, NULL, m, 0);
  float *y = bget(g_gpu, dy, ny);
  double e = nerr(y, ref, ny);
  fprintf(stderr,
          "weight_upload [%d][%d]: %zu bf16 values differ from host rounding; matmul m %d "
          "normalized error %.2e\n",
          rows, cols, bad, m, e);
  CHECK(bad == 0);
  CHECK(e < 1e-2);
  g_gpu->ops->weight_free(g_gpu, &wg);
  g_cpu->ops->weight_free(g_cpu, &wc);
  CHECK(wg.data == NULL && wc.data == NULL);
  CHECK(g_gpu->ops->weight_upload(g_gpu, &wg, w, -1, cols) == QE_EINVAL && !wg.data);
  kern_free(g_gpu, dx), kern_free(g_gpu, dy);
  free(w), free(x), free(ref), free(bits), free(y);
}

/* ---- element-wise ops ----------------------------------------------------------------------- */

static void check_rmsnorm(int m, int n, int in_place) {
  float *x = randv((size_t)m * n, 3), *g = randv(n, 1.5f), *ref = malloc(sizeof(float) * m * n);
  g_cpu->ops->rmsnorm(g_cpu, ref, x, g, m, n, 1e-5f);
  float *dx = bput(g_gpu, x, sizeof(float) * m * n), *dg = bput(g_gpu, g, sizeof(float) * n);
  float *dy = in_place ? dx : bpoison(g_gpu, (size_t)m * n);
  g_gpu->ops->rmsnorm(g_gpu, dy, dx, dg, m, n, 1e-5f);
  float *y = bget(g_gpu, dy, (size_t)m * n);
  double e = tu_rel_err(y, ref, (size_t)m * n);
  fprintf(stderr, "rmsnorm m %d n %d%s: max rel error %.2e\n", m, n, in_place ? " in place" : "",
          e);
  CHECK(e < 1e-5);
  if (!in_place) kern_free(g_gpu, dy);
  kern_free(g_gpu, dx), kern_free(g_gpu, dg);
  free(x), free(g), free(ref), free(y);
}

/* ---- the bf16 copies that RMSNorm and SwiGLU write for the next matmul ------------------ */

/* op 0: rmsnorm, 1: swiglu of x (m x k) into y, 2: x += d then y = rmsnorm(x) (add_rmsnorm
 * where the backend has it), then (stale: y += d first) z = y W^T on be; x's final values in xo. */
static void fused_chain(kern_backend_t *be, int op, int stale, const float *x, const float *g,
                        const float *d, const float *w, int m, int n, int k, float *z, float *xo) {
  kern_weight_t wg = {bput(be, w, sizeof(float) * n * k), n, k, KERN_WEIGHT_F32};
  float *dx = bput(be, x, sizeof(float) * m * k), *dg = bput(be, g, sizeof(float) * m * k);
  float *dd = bput(be, d, sizeof(float) * m * k), *dy = bpoison(be, (size_t)m * k);
  float *dz = bpoison(be, (size_t)m * n);
  be->ops->matmul(be, dz, dx, &wg, NULL, m, 0); /* (sizes the bf16 buffer) */
  if (op == 0)
    be->ops->rmsnorm(be, dy, dx, dg, m, k, 1e-5f);
  else if (op == 1)
    be->ops->swiglu(be, dy, dx, dg, m, k);
  else if (be->ops->add_rmsnorm)
    be->ops->add_rmsnorm(be, dx, dd, dy, dg, m, k, 1e-5f);
  else
    be->ops->add(be, dx, dd, (size_t)m * k), be->ops->rmsnorm(be, dy, dx, dg, m, k, 1e-5f);
  if (stale) be->ops->add(be, dy, dd, (size_t)m * k);
  be->ops->matmul(be, dz, dy, &wg, NULL, m, 0);
  CHECK_OK(be->ops->download(be, z, dz, sizeof(float) * m * n));
  CHECK_OK(be->ops->download(be, xo, dx, sizeof(float) * m * k));
  kern_free(be, wg.data), kern_free(be, dx), kern_free(be, dg), kern_free(be, dd);
  kern_free(be, dy), kern_free(be, dz);
}

/* RMSNorm (both forms), SwiGLU and the residual add with RMSNorm followed by a matmul on their
 * output: the same bits with and without the fusions (QE_CUDA_FUSE_BF16=0 QE_CUDA_FUSE_ADD=0:
 * kcu_to_bf16, and add then rmsnorm), within bf16 tolerance of the CPU, and with an op between
 * them (the bf16 copy is then stale) too. */
static void check_fused_bf16(kern_backend_t *unfused, int m, int n, int k) {
  static const char *const what[] = {"rmsnorm", "swiglu", "add_rmsnorm"};
  const size_t mk = (size_t)m * k, mn = (size_t)m * n;
  float *x = randv(mk, 2), *g = randv(mk, 1.5f), *d = randv(mk, 1), *w = randv((size_t)n * k, 1);
  float *z0 = malloc(sizeof(float) * mn), *z1 = malloc(sizeof(float) * mn);
  float *ref = malloc(sizeof(float) * mn), *x0 = malloc(sizeof(float) * mk);
  float *x1 = malloc(sizeof(float) * mk), *xr = malloc(sizeof(float) * mk);
  for (int op = 0; op < 3; op++)
    for (int stale = 0; stale < 2; stale++) {
      fused_chain(g_cpu, op, stale, x, g, d, w, m, n, k, ref, xr);
      fused_chain(g_gpu, op, stale, x, g, d, w, m, n, k, z1, x1);
      fused_chain(unfused, op, stale, x, g, d, w, m, n, k, z0, x0);
      const double e = nerr(z1, ref, mn), ex = nerr(x1, xr, mk);
      const int same = bits_equal(z0, z1, mn) && bits_equal(x0, x1, mk);
      fprintf(stderr, "%s%s then matmul m %d n %d k %d: fused %s, error %.2e (x %.2e)\n", what[op],
              stale ? " + add" : "", m, n, k, same ? "= unfused" : "!= UNFUSED", e, ex);
      CHECK(same);
      CHECK(e < 1e-2 && ex < 1e-6);
    }
  free(x), free(g), free(d), free(w), free(z0), free(z1), free(ref), free(x0), free(x1), free(xr);
}

static void check_rope_case(const char *what, const kern_rope_t *r, int m, int n_heads, int hd,
                            int max_pos, int negative) {
  size_t n = (size_t)m * n_heads * hd;
  float *x = randv(n, 2), *ref = malloc(sizeof(float) * n);
  int32_t *pos = malloc(sizeof(int32_t) * m);
  for (int t = 0; t < m; t++) {
    pos[t] = (int32_t)tu_randf(&rs, 0, (float)max_pos);
    if (negative && t % 2) pos[t] = -pos[t];
  }
  pos[0] = max_pos - 1;
  memcpy(ref, x, sizeof(float) * n);
  g_cpu->ops->rope(g_cpu, ref, pos, m, n_heads, hd, r);
  float *dx = bput(g_gpu, x, sizeof(float) * n);
  int32_t *dp = bput(g_gpu, pos, sizeof(int32_t) * m);
  g_gpu->ops->rope(g_gpu, dx, dp, m, n_heads, hd, r);
  float *y = bget(g_gpu, dx, n);
  double e = tu_rel_err(y, ref, n);
  fprintf(stderr, "rope %-26s m %3d heads %2d hd %3d n_rot %3d pos < %6d: max rel error %.2e\n",
          what, m, n_heads, hd, r->n_rot, max_pos, e);
  CHECK(e < 1e-5);
  kern_free(g_gpu, dx), kern_free(g_gpu, dp);
  free(x), free(ref), free(pos), free(y);
}

static void check_ropes(void) {
  float factors[64];
  for (int i = 0; i < 64; i++) factors[i] = 1.0f + (float)i / 8.0f;
  kern_rope_t base = {KERN_ROPE_NORM, 64, 10000.0f, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 4096};
  kern_rope_t r = base;
  check_rope_case("norm", &r, 17, 4, 64, 2048, 0);
  check_rope_case("norm, negative positions", &r, 9, 3, 64, 40000, 1);
  r.mode = KERN_ROPE_NEOX, r.theta = 1000000.0f;
  check_rope_case("neox", &r, 33, 8, 64, 32768, 0);
  r.n_rot = 32;
  check_rope_case("neox, partial rotation", &r, 5, 2, 64, 4096, 0);
  r = base, r.n_rot = 128, r.theta = 500000.0f, r.factors = factors;
  check_rope_case("norm, frequency factors", &r, 8, 4, 128, 100000, 0);
  r = base, r.mode = KERN_ROPE_NEOX, r.n_rot = 128, r.freq_scale = 0.25f, r.ext_factor = 1.0f;
  check_rope_case("neox, yarn x4", &r, 11, 4, 128, 16384, 0);
  r = base, r.freq_scale = 0.5f;
  check_rope_case("norm, linear x2", &r, 6, 2, 64, 8192, 0);
}

/* ---- fused projections: weight_concat, qkv_rope, swiglu_cat ----------------------------- */

/* qkv [m][n_q + 2 n_kv][hd] through qkv_rope: the same bits as the columns copied out and rope
 * on q and k on the GPU, within 1e-5 of the CPU's rope, v copied exactly. */
static void check_qkv_rope_case(const char *what, const kern_rope_t *r, int m, int n_q, int n_kv,
                                int hd) {
  const int nh = n_q + 2 * n_kv;
  const size_t nq = (size_t)m * n_q * hd, nk = (size_t)m * n_kv * hd;
  float *qkv = randv((size_t)m * nh * hd, 2), *part[3];
  const size_t nn[3] = {nq, nk, nk},
               w[3] = {(size_t)n_q * hd, (size_t)n_kv * hd, (size_t)n_kv * hd};
  int32_t *pos = malloc(sizeof(int32_t) * m);
  for (int t = 0; t < m; t++) pos[t] = (int32_t)tu_randf(&rs, 0, 30000.0f) - (t % 3 == 2) * 40000;
  for (int i = 0, off = 0; i < 3; off += (int)w[i++]) { /* the columns of q, k and v */
    part[i] = malloc(sizeof(float) * nn[i]);
    for (int t = 0; t < m; t++)
      memcpy(part[i] + t * w[i], qkv + (size_t)t * nh * hd + off, sizeof(float) * w[i]);
  }
  float *dqkv = bput(g_gpu, qkv, sizeof(float) * m * nh * hd), *dq = bpoison(g_gpu, nq);
  float *dk = bpoison(g_gpu, nk), *dv = bpoison(g_gpu, nk);
  int32_t *dp = bput(g_gpu, pos, sizeof(int32_t) * m);
  g_gpu->ops->qkv_rope(g_gpu, dq, dk, dv, dqkv, dp, m, n_q, n_kv, hd, r);
  float *dref[3], *got[3] = {bget(g_gpu, dq, nq), bget(g_gpu, dk, nk), bget(g_gpu, dv, nk)};
  int same = 1;
  double e = 0;
  for (int i = 0; i < 3; i++) {
    dref[i] = bput(g_gpu, part[i], sizeof(float) * nn[i]);
    if (i < 2) g_gpu->ops->rope(g_gpu, dref[i], dp, m, i ? n_kv : n_q, hd, r);
    if (i < 2) g_cpu->ops->rope(g_cpu, part[i], pos, m, i ? n_kv : n_q, hd, r);
    float *gr = bget(g_gpu, dref[i], nn[i]);
    const double ei = tu_rel_err(got[i], part[i], nn[i]);
    same &= bits_equal(got[i], gr, nn[i]) && (i < 2 || bits_equal(got[i], part[i], nn[i]));
    e = ei > e ? ei : e;
    free(gr), kern_free(g_gpu, dref[i]), free(got[i]), free(part[i]);
  }
  fprintf(stderr, "qkv_rope %-22s m %2d heads %d/%d hd %3d n_rot %3d: %s split + rope, %.2e\n",
          what, m, n_q, n_kv, hd, r->n_rot, same ? "=" : "!=", e);
  CHECK(same);
  CHECK(e < 1e-5);
  kern_free(g_gpu, dqkv), kern_free(g_gpu, dq), kern_free(g_gpu, dk), kern_free(g_gpu, dv);
  kern_free(g_gpu, dp), free(qkv), free(pos);
}

/* gu [m][2n] through swiglu_cat: swiglu's bits on the halves, within 1e-5 of the CPU's. */
static void check_swiglu_cat(int m, int n) {
  const size_t t = (size_t)m * n;
  float *gu = randv(2 * t, 6), *g = malloc(sizeof(float) * t), *u = malloc(sizeof(float) * t);
  float *ref = malloc(sizeof(float) * t);
  for (int r = 0; r < m; r++) {
    memcpy(g + (size_t)r * n, gu + (size_t)r * 2 * n, sizeof(float) * n);
    memcpy(u + (size_t)r * n, gu + (size_t)r * 2 * n + n, sizeof(float) * n);
  }
  g_cpu->ops->swiglu(g_cpu, ref, g, u, m, n);
  float *dgu = bput(g_gpu, gu, sizeof(float) * 2 * t), *dy = bpoison(g_gpu, t);
  float *dg = bput(g_gpu, g, sizeof(float) * t), *du = bput(g_gpu, u, sizeof(float) * t);
  g_gpu->ops->swiglu_cat(g_gpu, dy, dgu, m, n);
  g_gpu->ops->swiglu(g_gpu, dg, dg, du, m, n);
  float *y = bget(g_gpu, dy, t), *y2 = bget(g_gpu, dg, t);
  const double e = tu_rel_err(y, ref, t);
  const int same = bits_equal(y, y2, t);
  fprintf(stderr, "swiglu_cat m %d n %d: %s swiglu, %.2e\n", m, n, same ? "=" : "!=", e);
  CHECK(same);
  CHECK(e < 1e-5);
  kern_free(g_gpu, dgu), kern_free(g_gpu, dy), kern_free(g_gpu, dg), kern_free(g_gpu, du);
  free(gu), free(g), free(u), free(ref), free(y), free(y2);
}

/* Three weights of rows[i] x k stacked by weight_concat: the parts come back empty, and a matmul
 * over the stack is within 1e-2 (normalized) of the CPU's matmuls over the parts, row block by
 * row block; a part of another kind is refused and leaves the parts as they were. */
static void check_weight_concat(const int rows[3], int k, int m) {
  int n = rows[0] + rows[1] + rows[2];
  float *w = randv((size_t)n * k, 1), *x = randv((size_t)m * k, 1);
  float *ref = malloc(sizeof(float) * m * n), *part = malloc(sizeof(float) * m * n);
  kern_weight_t pw[3], cw[3], stack;
  for (int i = 0, r0 = 0; i < 3; r0 += rows[i++]) {
    CHECK_OK(g_gpu->ops->weight_upload(g_gpu, &pw[i], w + (size_t)r0 * k, rows[i], k));
    kern_weight_t c = {w + (size_t)r0 * k, rows[i], k, KERN_WEIGHT_F32};
    g_cpu->ops->matmul(g_cpu, part, x, &c, NULL, m, 0);
    for (int t = 0; t < m; t++)
      memcpy(ref + (size_t)t * n + r0, part + (size_t)t * rows[i], sizeof(float) * rows[i]);
  }
  kern_weight_t bad[2] = {pw[0], {w, rows[1], k, KERN_WEIGHT_F32}};
  CHECK(g_gpu->ops->weight_concat(g_gpu, &stack, bad, 2) == QE_EUNSUPPORTED);
  CHECK(bad[0].data == pw[0].data && bad[0].rows == rows[0]);
  memcpy(cw, pw, sizeof cw);
  CHECK_OK(g_gpu->ops->weight_concat(g_gpu, &stack, cw, 3));
  CHECK(cw[0].data == NULL && cw[2].data == NULL && stack.rows == n && stack.cols == k);
  float *dx = bput(g_gpu, x, sizeof(float) * m * k), *dy = bpoison(g_gpu, (size_t)m * n);
  g_gpu->ops->matmul(g_gpu, dy, dx, &stack, NULL, m, 0);
  float *y = bget(g_gpu, dy, (size_t)m * n);
  const double e = nerr(y, ref, (size_t)m * n);
  fprintf(stderr, "weight_concat %d+%d+%d x %d, m %d: matmul error %.2e\n", rows[0], rows[1],
          rows[2], k, m, e);
  CHECK(e < 1e-2);
  g_gpu->ops->weight_free(g_gpu, &stack);
  kern_free(g_gpu, dx), kern_free(g_gpu, dy);
  free(w), free(x), free(ref), free(part), free(y);
}

static void check_fused_proj(void) {
  kern_rope_t r = {KERN_ROPE_NORM, 128, 500000.0f, 1.0f, NULL, 0.0f, 1.0f, 32.0f, 1.0f, 8192};
  check_qkv_rope_case("norm (llama)", &r, 32, 32, 8, 128);
  r.mode = KERN_ROPE_NEOX, r.n_rot = 32, r.theta = 1000000.0f;
  check_qkv_rope_case("neox, partial", &r, 7, 7, 1, 64);
  r.mode = KERN_ROPE_NORM, r.n_rot = 48, r.freq_scale = 0.25f, r.ext_factor = 1.0f;
  check_qkv_rope_case("norm, partial, yarn", &r, 5, 4, 2, 64);
  r.n_rot = 0;
  check_qkv_rope_case("no rotation", &r, 3, 2, 2, 8);
  check_swiglu_cat(1, 7), check_swiglu_cat(32, 14336), check_swiglu_cat(5, 1001);
  const int qkv[3] = {4096, 1024, 1024}, odd[3] = {37, 5, 70};
  check_weight_concat(qkv, 512, 32), check_weight_concat(odd, 99, 3);
}

/* Row softmax in fp64, rounded to fp32. */
static void softmax_ref64(const float *x, float *out, int m, int n) {
  for (int r = 0; r < m; r++) {
    const float *row = x + (size_t)r * n;
    double mx = row[0], sum = 0;
    for (int j = 1; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    for (int j = 0; j < n; j++) sum += exp((double)row[j] - mx);
    for (int j = 0; j < n; j++) out[(size_t)r * n + j] = (float)(exp((double)row[j] - mx) / sum);
  }
}

static void check_swiglu_add_embed_softmax(int m, int n) {
  size_t t = (size_t)m * n;
  float *g = randv(t, 6), *u = randv(t, 2), *ref = malloc(sizeof(float) * t);
  g_cpu->ops->swiglu(g_cpu, ref, g, u, m, n);
  float *dg = bput(g_gpu, g, sizeof(float) * t), *du = bput(g_gpu, u, sizeof(float) * t);
  float *dy = bpoison(g_gpu, t);
  g_gpu->ops->swiglu(g_gpu, dy, dg, du, m, n);
  float *y = bget(g_gpu, dy, t);
  double e_sw = tu_rel_err(y, ref, t);
  CHECK(e_sw < 1e-5);
  free(y);
  g_gpu->ops->swiglu(g_gpu, dg, dg, du, m, n); /* in place */
  y = bget(g_gpu, dg, t);
  CHECK(tu_rel_err(y, ref, t) < 1e-5);
  free(y);
  /* add: bit-exact */
  memcpy(ref, u, sizeof(float) * t);
  g_cpu->ops->add(g_cpu, ref, g, t);
  CHECK_OK(g_gpu->ops->upload(g_gpu, dg, g, sizeof(float) * t));
  g_gpu->ops->add(g_gpu, du, dg, t);
  y = bget(g_gpu, du, t);
  int add_ok = bits_equal(y, ref, t);
  CHECK(add_ok);
  free(y);
  /* softmax rows, against an fp64 reference (the CPU backend sums a long row sequentially in
   * fp32, which alone errs by ~1e-5 relative at 32K columns) */
  softmax_ref64(g, ref, m, n);
  g_gpu->ops->softmax(g_gpu, dg, m, n);
  y = bget(g_gpu, dg, t);
  double e_sm = tu_rel_err(y, ref, t);
  CHECK(e_sm < 1e-5);
  fprintf(stderr, "swiglu/add/softmax m %d n %d: swiglu %.2e, add %s, softmax %.2e\n", m, n, e_sw,
          add_ok ? "exact" : "DIFFERENT", e_sm);
  free(y);
  kern_free(g_gpu, dg), kern_free(g_gpu, du), kern_free(g_gpu, dy);
  free(g), free(u), free(ref);
}

static void check_embed(int vocab, int n, int m) {
  float *table = randv((size_t)vocab * n, 1), *ref = malloc(sizeof(float) * m * n);
  int32_t *ids = malloc(sizeof(int32_t) * m);
  for (int i = 0; i < m; i++) ids[i] = (int32_t)tu_randf(&rs, 0, (float)vocab);
  ids[0] = vocab - 1;
  g_cpu->ops->embed(g_cpu, ref, table, ids, m, n);
  float *dt = bput(g_gpu, table, sizeof(float) * vocab * n), *dy = bpoison(g_gpu, (size_t)m * n);
  int32_t *di = bput(g_gpu, ids, sizeof(int32_t) * m);
  g_gpu->ops->embed(g_gpu, dy, dt, di, m, n);
  float *y = bget(g_gpu, dy, (size_t)m * n);
  CHECK(bits_equal(y, ref, (size_t)m * n));
  kern_free(g_gpu, dt), kern_free(g_gpu, dy), kern_free(g_gpu, di);
  free(table), free(ref), free(ids), free(y);
}

/* ---- attention --------------------------------------------------------------------------------
 */

typedef struct {
  int n_q, q_pos0, n_kv, mass, mass_q0, gaps; /* gaps: explicit ascending key positions */
} attn_case_t;

typedef struct {
  float *q, *k, *v, *mass;
  int32_t *kpos;
} attn_host_t;

/* Host inputs of one sequence (mass starts random: the op adds to it). */
static void attn_make(const attn_case_t *c, const kern_attn_shape_t *sh, attn_host_t *h,
                      kern_attn_seq_t *s) {
  size_t qn = (size_t)c->n_q * sh->n_head * sh->head_dim;
  size_t kn = (size_t)c->n_kv * sh->n_kv_head * sh->head_dim;
  h->q = randv(qn, 1), h->k = randv(kn, 1), h->v = randv(kn, 1);
  h->mass = c->mass ? randv(c->n_kv, 1) : NULL;
  h->kpos = NULL;
  if (c->gaps) {
    h->kpos = malloc(sizeof(int32_t) * c->n_kv);
    for (int j = 0, p = 0; j < c->n_kv; j++, p += 1 + (int)tu_randf(&rs, 0, 3)) h->kpos[j] = p;
  }
  *s =
      (kern_attn_seq_t){.n_q = c->n_q, .n_kv = c->n_kv, .q_pos0 = c->q_pos0, .mass_q0 = c->mass_q0};
}

/* Sequences of at least 64 queries over keys at 0..n_kv-1 take the GEMM path (TF32 tensor cores:
 * normalized error within TF32_TOL, below bf16's 2^-8); the others the fp32 reference kernel. */
#define TF32_TOL 2e-3
static void check_attention(const char *what, const kern_attn_shape_t *sh, const attn_case_t *cs,
                            int n, double tol) {
  kern_attn_seq_t *sc = calloc((size_t)n, sizeof *sc), *sg = calloc((size_t)n, sizeof *sg);
  attn_host_t *h = calloc((size_t)n, sizeof *h);
  size_t *on = calloc((size_t)n, sizeof *on);
  for (int i = 0; i < n; i++) {
    attn_make(&cs[i], sh, &h[i], &sc[i]);
    sg[i] = sc[i];
    size_t qn = (size_t)cs[i].n_q * sh->n_head * sh->head_dim;
    size_t kn = (size_t)cs[i].n_kv * sh->n_kv_head * sh->head_dim;
    on[i] = qn;
    sc[i].q = h[i].q, sc[i].k = h[i].k, sc[i].v = h[i].v, sc[i].k_pos = h[i].kpos;
    sc[i].out = malloc(sizeof(float) * qn);
    sc[i].key_mass = h[i].mass ? malloc(sizeof(float) * cs[i].n_kv) : NULL;
    if (sc[i].key_mass) memcpy(sc[i].key_mass, h[i].mass, sizeof(float) * cs[i].n_kv);
    sg[i].q = bput(g_gpu, h[i].q, sizeof(float) * qn);
    sg[i].k = bput(g_gpu, h[i].k, sizeof(float) * kn);
    sg[i].v = bput(g_gpu, h[i].v, sizeof(float) * kn);
    sg[i].out = bpoison(g_gpu, qn);
    sg[i].key_mass = h[i].mass ? bput(g_gpu, h[i].mass, sizeof(float) * cs[i].n_kv) : NULL;
    sg[i].k_pos = h[i].kpos ? bput(g_gpu, h[i].kpos, sizeof(int32_t) * cs[i].n_kv) : NULL;
  }
  g_cpu->ops->attention(g_cpu, sc, n, sh);
  g_gpu->ops->attention(g_gpu, sg, n, sh);
  double eo = 0, em = 0;
  for (int i = 0; i < n; i++) {
    float *o = bget(g_gpu, sg[i].out, on[i]);
    double e = tu_rel_err(o, sc[i].out, on[i]);
    eo = e > eo || isnan(e) ? e : eo;
    free(o);
    if (sg[i].key_mass) {
      float *mm = bget(g_gpu, sg[i].key_mass, (size_t)cs[i].n_kv);
      e = tu_rel_err(mm, sc[i].key_mass, (size_t)cs[i].n_kv);
      em = e > em || isnan(e) ? e : em;
      free(mm);
    }
  }
  fprintf(stderr, "attention %-28s heads %2d/%d hd %3d, %2d seqs: out %.2e, key mass %.2e\n", what,
          sh->n_head, sh->n_kv_head, sh->head_dim, n, eo, em);
  CHECK(eo < tol);
  CHECK(em < tol);
  for (int i = 0; i < n; i++) {
    kern_free(g_gpu, (void *)sg[i].q), kern_free(g_gpu, (void *)sg[i].k);
    kern_free(g_gpu, (void *)sg[i].v), kern_free(g_gpu, sg[i].out);
    if (sg[i].key_mass) kern_free(g_gpu, sg[i].key_mass);
    if (sg[i].k_pos) kern_free(g_gpu, (void *)sg[i].k_pos);
    free(sc[i].out), free(sc[i].key_mass);
    free(h[i].q), free(h[i].k), free(h[i].v), free(h[i].mass), free(h[i].kpos);
  }
  free(sc), free(sg), free(h), free(on);
}

static void check_attentions(void) {
  /* prefill, decode, chunked prefill with masses from query 5, explicit positions with gaps
   * (queries past the last key see them all) */
  attn_case_t mix[] = {{37, 0, 37, 0, 0, 0},
                       {1, 100, 101, 1, 0, 0},
                       {16, 50, 66, 1, 5, 0},
                       {4, 400, 80, 1, 0, 1},
                       {7, 0, 7, 1, 0, 0}};
  int nm = (int)(sizeof mix / sizeof *mix);
  kern_attn_shape_t shapes[] = {
      {8, 4, 8, 0}, {32, 8, 128, 0}, {4, 4, 64, 0}, {12, 2, 256, 0}, {6, 3, 40, 0}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    shapes[i].scale = 1.0f / sqrtf((float)shapes[i].head_dim);
    check_attention("mixed batch", &shapes[i], mix, nm, 1e-4);
  }
  /* a decode batch at a longer context */
  attn_case_t dec[32];
  for (int i = 0; i < 32; i++)
    dec[i] = (attn_case_t){1, 1279 - i * 7, 1280 - i * 7, i % 4 == 0, 0, 0};
  kern_attn_shape_t big = {32, 8, 128, 1.0f / sqrtf(128.0f)};
  check_attention("decode, 32 sequences", &big, dec, 32, 1e-4);
  attn_case_t pre[] = {{512, 0, 512, 1, 480, 0}};
  check_attention("prefill 512, masses from 480", &big, pre, 1, TF32_TOL);
  /* the GEMM path beside the reference kernel in one call: a prompt, a chunk of a prompt after a
   * cached prefix with masses from every query, a decode row, a short chunk */
  attn_case_t gm[] = {{300, 0, 300, 1, 268, 0},
                      {100, 700, 800, 1, 0, 0},
                      {1, 50, 51, 1, 0, 0},
                      {70, 30, 100, 0, 0, 0},
                      {20, 10, 30, 1, 0, 0}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    check_attention("gemm path and reference", &shapes[i], gm, 5, TF32_TOL);
}

/* The fused prefill kernel (head_dim 64 / 128, the sequences the GEMM path takes; the queries
 * from mass_q0 on, with masses, by the reference kernel): long prompts, a chunk after a cached
 * prefix, query counts off the tile, GQA groups of 1, 3, 4 and 8; then the same cases through the
 * GEMM path (QE_CUDA_PREFILL=gemm), which the fused kernel replaced for these shapes. */
static void check_attention_flash(int fused_only) {
  attn_case_t fl[] = {{2000, 0, 2000, 1, 1968, 0},
                      {700, 300, 1000, 0, 0, 0},
                      {65, 0, 65, 1, 0, 0},
                      {129, 7, 136, 1, 128, 0},
                      {1, 40, 41, 1, 0, 0}};
  kern_attn_shape_t shapes[] = {{32, 8, 128, 0}, {4, 4, 64, 0}, {9, 3, 128, 0}, {16, 2, 64, 0}};
  kern_backend_t *saved = g_gpu, *gemm = NULL;
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    shapes[i].scale = 1.0f / sqrtf((float)shapes[i].head_dim);
    check_attention("fused prefill and reference", &shapes[i], fl, 5, TF32_TOL);
  }
  /* 40 sequences in one call: two launches (32 a launch), reordered longest first; some after
   * a cached prefix, some with masses from their last 8 queries */
  attn_case_t many[40];
  for (int i = 0; i < 40; i++) {
    const int q0 = i % 3 ? 17 * i : 0, nq = 64 + 5 * i;
    many[i] = (attn_case_t){nq, q0, q0 + nq, i % 4 == 0, i % 4 == 0 ? nq - 8 : 0, 0};
  }
  check_attention("fused prefill, 40 sequences", &shapes[0], many, 40, TF32_TOL);
  /* over 4K keys, masses from the last 32 and 200 queries: by the GEMM path (the default), then
   * by the reference kernel (QE_CUDA_MASS=ref) */
  attn_case_t tail[] = {{4200, 0, 4200, 1, 4168, 0}, {300, 4000, 4300, 1, 100, 0}};
  check_attention("fused prefill, masses by GEMM", &shapes[1], tail, 2, TF32_TOL);
  kern_backend_t *mr = NULL;
  setenv("QE_CUDA_MASS", "ref", 1);
  CHECK_OK(kern_cuda_create(0, &mr));
  unsetenv("QE_CUDA_MASS");
  if (mr) {
    g_gpu = mr;
    check_attention("fused, masses by the reference", &shapes[1], tail, 2, TF32_TOL);
    g_gpu = saved;
    kern_destroy(mr);
  }
  if (fused_only) return;
  setenv("QE_CUDA_PREFILL", "gemm", 1);
  CHECK_OK(kern_cuda_create(0, &gemm));
  unsetenv("QE_CUDA_PREFILL");
  if (!gemm) return;
  g_gpu = gemm;
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    check_attention("gemm path (QE_CUDA_PREFILL=gemm)", &shapes[i], fl, 5, TF32_TOL);
  g_gpu = saved;
  kern_destroy(gemm);
}

/* The GEMM path with a 1 MiB score budget: many chunks of 16 queries per sequence. */
static void check_attention_chunks(void) {
  kern_backend_t *saved = g_gpu, *small = NULL;
  setenv("QE_CUDA_PREFILL_MB", "1", 1);
  setenv("QE_CUDA_PREFILL", "gemm", 1); /* (the shape would take the fused kernel) */
  CHECK_OK(kern_cuda_create(0, &small));
  unsetenv("QE_CUDA_PREFILL_MB");
  unsetenv("QE_CUDA_PREFILL");
  if (!small) return;
  g_gpu = small;
  attn_case_t gm[] = {{1000, 0, 1000, 1, 900, 0}, {333, 1200, 1533, 1, 17, 0}};
  kern_attn_shape_t sh = {32, 8, 128, 1.0f / sqrtf(128.0f)};
  check_attention("gemm path, 1 MiB chunks", &sh, gm, 2, TF32_TOL);
  g_gpu = saved;
  kern_destroy(small);
}

/* ---- sampling ------------------------------------------------------------------------------- */

/* The device argmax against the CPU backend's on fresh random rows (continuous values), plus
 * rows of ties, NaN in column 0, NaN elsewhere, all-equal values, +inf, and only -inf (the
 * last four: -1 on both, and checked to be). */
static void check_argmax(int rows, int n) {
  float *h = randv((size_t)rows * n, 4.0f);
  const int special = rows >= 6 && n >= 8;
  if (special) {
    h[0 * n + 3] = h[0 * n + n - 1] = 50.0f;  /* tie: the lower index */
    h[1 * n + 0] = NAN;                       /* NaN first: -1 */
    h[2 * n + 5] = NAN, h[2 * n + 1] = 60.0f; /* NaN later: -1 */
    for (int j = 0; j < n; j++) h[3 * n + j] = 2.0f, h[5 * n + j] = -INFINITY;
    h[4 * n + n - 2] = INFINITY; /* +inf: -1 */
  }
  float *d = bput(g_gpu, h, sizeof(float) * (size_t)rows * n);
  int32_t *gi = malloc(sizeof(int32_t) * rows), *ci = malloc(sizeof(int32_t) * rows);
  CHECK_OK(g_gpu->ops->argmax(g_gpu, d, rows, n, gi));
  CHECK_OK(g_cpu->ops->argmax(g_cpu, h, rows, n, ci));
  int same = 1;
  for (int i = 0; i < rows; i++) same &= gi[i] == ci[i];
  CHECK(same);
  CHECK(!special ||
        (ci[0] == 3 && ci[1] == -1 && ci[2] == -1 && ci[3] == 0 && ci[4] == -1 && ci[5] == -1));
  fprintf(stderr, "argmax: %d rows of %d: %s\n", rows, n, same ? "identical" : "DIFFERENT");
  kern_free(g_gpu, d);
  free(h), free(gi), free(ci);
}

static void check_sampling(int n_vocab, int rows) {
  kern_sampler_t ss[] = {
      {0, 0, 1.0f}, {0.8f, 40, 1.0f}, {1.0f, 0, 0.9f}, {1.3f, 0, 1.0f}, {0.7f, 50, 0.95f}};
  float *scratch = malloc(sizeof(float) * n_vocab * 2 + 64);
  float *logits = malloc(sizeof(float) * n_vocab);
  int same = 1, draws = 0;
  for (size_t k = 0; k < sizeof ss / sizeof *ss; k++) {
    uint64_t rc = kern_rng_seed(1000 + k), rg = rc;
    for (int r = 0; r < rows; r++) {
      for (int i = 0; i < n_vocab; i++) logits[i] = tu_randf(&rs, -8, 8);
      if (r % 5 == 0) logits[7] = logits[3] = 9.0f; /* a tie: lowest id wins */
      int a = g_cpu->ops->sample(g_cpu, logits, n_vocab, &ss[k], &rc, scratch);
      int b = g_gpu->ops->sample(g_gpu, logits, n_vocab, &ss[k], &rg, scratch);
      if (a != b || rc != rg) same = 0;
      if (ss[k].temp <= 0 && r % 5 == 0 && a != 3) same = 0;
      draws++;
    }
  }
  fprintf(stderr, "sample vocab %d: %d draws, %s\n", n_vocab, draws,
          same ? "identical" : "DIFFERENT");
  CHECK(same);
  free(scratch), free(logits);
}

/* ---- whole models -----------------------------------------------------------------------------
 */

typedef struct {
  kern_backend_t *be;
  model_t *m;
  kv_cache_t *kv;
  tp_comm_t *c;
} mrig_t;

/* Loads path (or, with path NULL, builds model_create_random(hp, seed)) with a 1-slot FullKV
 * cache of cap tokens, slot 0 open. */
static int mrig_open_any(mrig_t *r, kern_backend_t *be, const char *path, const model_hparams_t *hp,
                         uint64_t seed, int cap) {
  memset(r, 0, sizeof *r);
  r->be = be;
  model_load_opts_t o = {be, 0, 1, cap, 0};
  int rc = tp_comm_create_single(&r->c);
  if (!rc) rc = path ? model_load(path, &o, &r->m) : model_create_random(hp, seed, &o, &r->m);
  kv_geom_t g;
  if (!rc) g = model_kv_geom(r->m, 1), rc = kv_full_create(be, &g, &r->kv);
  if (!rc) rc = r->kv->ops->seq_open(r->kv, 0, cap);
  return rc;
}

static int mrig_open(mrig_t *r, kern_backend_t *be, const char *path, int cap) {
  return mrig_open_any(r, be, path, NULL, 0, cap);
}

static void mrig_close(mrig_t *r) {
  kv_cache_destroy(r->kv);
  model_destroy(r->m);
  tp_comm_destroy(r->c);
}

/* Teacher-forced logits of ids: rows [0, n_prompt) from one prefill batch, then one decode
 * step per further id. out [n][V] (row t predicts ids[t + 1]). */
static int mrig_logits(mrig_t *r, const int32_t *ids, int n, int n_prompt, float *out) {
  int V = model_hparams(r->m)->n_vocab, rc = 0;
  int32_t *pos = malloc(sizeof(int32_t) * n), *seq = calloc((size_t)n, sizeof(int32_t));
  uint8_t *want = malloc((size_t)n);
  for (int i = 0; i < n; i++) pos[i] = i, want[i] = 1;
  model_batch_t b = {n_prompt, ids, pos, seq, want};
  rc = model_forward(r->m, r->kv, r->c, &b, out);
  for (int t = n_prompt; t < n && !rc; t++) {
    model_batch_t d = {1, ids + t, pos + t, seq, want};
    rc = model_forward(r->m, r->kv, r->c, &d, out + (size_t)t * V);
  }
  free(pos), free(seq), free(want);
  return rc;
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

/* Greedy continuation of ids[0, n_prompt) on the CPU backend up to n ids (teacher forcing
 * then reproduces exactly these logits). */
static int cpu_greedy(const char *path, int32_t *ids, int n_prompt, int n, int V) {
  mrig_t r;
  float *lg = malloc(sizeof(float) * V);
  int32_t *pos = malloc(sizeof(int32_t) * n), *seq = calloc((size_t)n, sizeof(int32_t));
  for (int i = 0; i < n; i++) pos[i] = i;
  int rc = mrig_open(&r, g_cpu, path, n);
  model_batch_t b = {n_prompt, ids, pos, seq, NULL}; /* logits of the last prompt token */
  if (!rc) rc = model_forward(r.m, r.kv, r.c, &b, lg);
  for (int t = n_prompt; t < n && !rc; t++) {
    ids[t] = argmax(lg, V);
    model_batch_t d = {1, ids + t, pos + t, seq, NULL};
    if (t + 1 < n) rc = model_forward(r.m, r.kv, r.c, &d, lg);
  }
  mrig_close(&r);
  free(lg), free(pos), free(seq);
  return rc;
}

typedef struct {
  int first_diff; /* first row whose GPU argmax differs from the CPU's (-1: none) */
  int n_diff;     /* rows whose argmax differs */
  int bad;        /* of those, rows that are not near-ties */
  double worst;   /* largest per-row normalized logit error */
  double gap_cpu; /* at first_diff: CPU logit of its pick minus of the GPU's pick */
  double gap_gpu; /* at first_diff: GPU logit of its pick minus of the CPU's pick */
  int pick_cpu, pick_gpu;
} cmp_t;

static cmp_t compare_rows(const float *ref, const float *got, int n, int V) {
  cmp_t c = {.first_diff = -1};
  for (int t = 0; t < n; t++) {
    const float *a = ref + (size_t)t * V, *b = got + (size_t)t * V;
    double e = nerr(b, a, (size_t)V), ms = 0;
    c.worst = e > c.worst || isnan(e) ? e : c.worst;
    for (int i = 0; i < V; i++) ms += (double)a[i] * a[i] / V;
    int pa = argmax(a, V), pb = argmax(b, V);
    if (pa == pb) continue;
    double ga = (double)a[pa] - a[pb], gb = (double)b[pb] - b[pa];
    if (c.first_diff < 0)
      c.first_diff = t, c.gap_cpu = ga, c.gap_gpu = gb, c.pick_cpu = pa, c.pick_gpu = pb;
    c.n_diff++;
    if (!(ga <= 0.02 * sqrt(ms))) c.bad++; /* not a near-tie: a real disagreement */
  }
  return c;
}

/* Logits of ids through both backends: ref (CPU) and got (GPU), [n][V] each. */
static int both_logits(const char *path, const int32_t *ids, int n, int n_prompt, float *ref,
                       float *got) {
  mrig_t rc_, rg_;
  int rc = mrig_open(&rc_, g_cpu, path, n);
  if (!rc) rc = mrig_logits(&rc_, ids, n, n_prompt, ref);
  mrig_close(&rc_);
  if (rc) return rc;
  rc = mrig_open(&rg_, g_gpu, path, n);
  if (!rc) rc = mrig_logits(&rg_, ids, n, n_prompt, got);
  mrig_close(&rg_);
  return rc;
}

static void check_model(const char *what, const char *path, int n_prompt, int n) {
  gguf_t *g = NULL;
  model_hparams_t hp;
  CHECK_OK(gguf_open(path, &g));
  if (!g) return;
  CHECK_OK(model_read_hparams(g, &hp));
  gguf_close(g);
  int V = hp.n_vocab;
  int32_t *ids = malloc(sizeof(int32_t) * n);
  ids[0] = 1;
  for (int i = 1; i < n_prompt; i++) ids[i] = 3 + (int32_t)tu_randf(&rs, 0, (float)(V - 3));
  float *ref = malloc(sizeof(float) * n * V), *got = malloc(sizeof(float) * n * V);
  CHECK_OK(cpu_greedy(path, ids, n_prompt, n, V));
  CHECK_OK(both_logits(path, ids, n, n_prompt, ref, got));
  cmp_t c = compare_rows(ref, got, n, V);
  fprintf(stderr,
          "model %-30s %d prompt + %d decode positions: worst logit error %.2e; argmax differs "
          "at %d (%d not near-ties), first at %d (CPU margin %.4f)\n",
          what, n_prompt, n - n_prompt, c.worst, c.n_diff, c.bad, c.first_diff, c.gap_cpu);
  CHECK(c.worst < 5e-2);
  CHECK(c.bad == 0);
  free(ids), free(ref), free(got);
}

static void check_models(void) {
  const char *p = tu_env_path("QE_SHARED_MODELS", "stories260K.gguf");
  char path[4096];
  if (p && !access(p, R_OK)) {
    snprintf(path, sizeof path, "%s", p);
    check_model("stories260K", path, 24, 160);
  } else {
    fprintf(stderr, "model stories260K: absent (QE_SHARED_MODELS), not checked\n");
  }
  char tmpl[] = "/tmp/test_kern_cuda_XXXXXX";
  int fd = mkstemp(tmpl);
  CHECK(fd >= 0);
  if (fd < 0) return;
  close(fd);
  rand_model_spec_t specs[] = {{MODEL_ARCH_LLAMA, GGUF_T_F32, 8, 2, 0, 2, 7},
                               {MODEL_ARCH_QWEN2, GGUF_T_F32, 8, 4, 1, 2, 8}};
  const char *names[] = {"random llama (GQA 8/2)", "random qwen2 (bias)"};
  for (int i = 0; i < 2; i++) {
    CHECK_OK(rand_model_write(&specs[i], tmpl));
    check_model(names[i], tmpl, 40, 96);
  }
  /* a prefill past MODEL_FUSE_ROWS: the stacked gate, up weights run as their two halves */
  CHECK_OK(rand_model_write_ctx(&specs[0], 1024, tmpl));
  check_model("random llama, 600-token prompt", tmpl, 600, 616);
  unlink(tmpl);
}

/* Elements of hp's 2-D weights as one rank holds them: every layer's, and the output's. */
static size_t matrix_elems(const model_hparams_t *hp) {
  size_t E = hp->n_embd, NQ = (size_t)hp->n_head * hp->head_dim;
  size_t NK = (size_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
  return hp->n_layer * (2 * E * NQ + 2 * E * NK + 3 * E * F) + (size_t)hp->n_vocab * E;
}

static void check_random_model(int tied) {
  model_hparams_t hp;
  CHECK_OK(model_shape_named("tiny", &hp));
  hp.tied_output = tied;
  enum { N = 40 };
  int V = hp.n_vocab;
  int32_t ids[N];
  for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 37 + 1) % V);
  float *lg[2] = {malloc(sizeof(float) * N * V), malloc(sizeof(float) * N * V)};
  size_t bytes[2] = {0, 0};
  kern_backend_t *bes[2] = {g_cpu, g_gpu};
  for (int b = 0; b < 2; b++) {
    mrig_t r;
    int rc = mrig_open_any(&r, bes[b], NULL, &hp, 3, N);
    if (!rc) rc = mrig_logits(&r, ids, N, N, lg[b]);
    CHECK_OK(rc);
    if (r.m) bytes[b] = model_weight_bytes(r.m);
    mrig_close(&r);
  }
  cmp_t c = compare_rows(lg[0], lg[1], N, V);
  size_t mat = matrix_elems(&hp), VE = (size_t)V * hp.n_embd;
  size_t want = bytes[0] - 2 * mat + (tied ? 4 * VE : 0); /* tied: + bf16 output beside fp32 */
  fprintf(stderr,
          "random tiny%s: worst logit error %.2e; weight bytes cpu %zu, gpu %zu (expected %zu)\n",
          tied ? " (tied)" : "", c.worst, bytes[0], bytes[1], want);
  CHECK(c.worst < 5e-2);
  CHECK(bytes[1] == want);
  free(lg[0]), free(lg[1]);
}

/* --random SHAPE: a full-size random model on the GPU (build time, bytes, a few steps). */
static int random_tool(const char *shape) {
  enum { NP = 16, N = 20 };
  model_hparams_t hp;
  mrig_t r = {0};
  struct timespec t0, t1;
  int rc = model_shape_named(shape, &hp), bad = 0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (!rc) rc = mrig_open_any(&r, g_gpu, NULL, &hp, 1, N);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  float *lg = rc ? NULL : malloc(sizeof(float) * N * (size_t)hp.n_vocab);
  if (!rc) {
    fprintf(stderr, "random %s: built in %.1f s, %.2f GiB of weights on the GPU\n", shape,
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
            (double)model_weight_bytes(r.m) / (1 << 30));
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 1) % hp.n_vocab);
    rc = mrig_logits(&r, ids, N, NP, lg);
  }
  if (!rc) {
    double ss = 0;
    for (size_t i = 0; i < (size_t)N * hp.n_vocab; i++)
      bad += !isfinite(lg[i]), ss += (double)lg[i] * lg[i];
    fprintf(stderr, "random %s: %d prefill + %d decode positions, logits rms %.3f, %d not finite\n",
            shape, NP, N - NP, sqrt(ss / ((double)N * hp.n_vocab)), bad);
  } else {
    fprintf(stderr, "random %s: %s: %s\n", shape, qe_strerror(rc), qe_errmsg());
  }
  mrig_close(&r);
  free(lg);
  return rc || bad ? 1 : 0;
}

/* ---- NCCL ---------------------------------------------------------------------------------------
 */

#ifdef QE_HAVE_NCCL
/* An add and an all-reduce recorded in a graph (as a tensor-parallel decode step records its
 * all-reduces), launched twice: d doubles each time, h follows; returns d's download. */
static float *check_nccl_graph(tp_comm_t *c, float *d, float *h, size_t n) {
  kern_graph_t *g = NULL;
  CHECK_OK(g_gpu->ops->graph_begin(g_gpu));
  g_gpu->ops->add(g_gpu, d, d, n);
  CHECK_OK(c->ops->allreduce_sum_f32(c, d, n));
  CHECK_OK(g_gpu->ops->graph_end(g_gpu, &g));
  for (int k = 0; g && k < 2; k++) CHECK_OK(g_gpu->ops->graph_launch(g_gpu, g));
  for (size_t i = 0; g && i < n; i++) h[i] *= 4;
  float *o = bget(g_gpu, d, n);
  CHECK(g && bits_equal(o, h, n));
  if (g) g_gpu->ops->graph_free(g_gpu, g);
  return o;
}

static void check_nccl(void) {
  unsigned char id[TP_NCCL_ID_BYTES];
  tp_comm_t *c = NULL;
  CHECK_OK(tp_comm_nccl_unique_id(id));
  CHECK_OK(tp_comm_create_nccl(id, 0, 1, 0, &c));
  if (!c) return;
  size_t n = 1000;
  float *h = randv(n, 4), *d = bput(g_gpu, h, sizeof(float) * n), *r = bpoison(g_gpu, n);
  CHECK_OK(c->ops->allreduce_sum_f32(c, d, n));
  float *o = bget(g_gpu, d, n);
  CHECK(bits_equal(o, h, n));
  free(o);
  CHECK_OK(c->ops->broadcast(c, d, sizeof(float) * n, 0));
  CHECK(c->ops->broadcast(c, d, 4, 1) == QE_EINVAL);
  CHECK_OK(c->ops->allgather(c, d, r, sizeof(float) * n));
  o = bget(g_gpu, r, n);
  CHECK(bits_equal(o, h, n));
  free(o);
  /* queued on the backend's stream: ordered with its ops, complete at its next download */
  CHECK(!c->ops->capturable(c)); /* synchronous collectives wait: not recordable */
  CHECK_OK(tp_comm_nccl_set_stream(c, kern_cuda_stream(g_gpu)));
  CHECK(c->ops->capturable(c));
  g_gpu->ops->add(g_gpu, d, d, n);
  CHECK_OK(c->ops->allreduce_sum_f32(c, d, n));
  o = bget(g_gpu, d, n);
  for (size_t i = 0; i < n; i++) h[i] += h[i];
  CHECK(bits_equal(o, h, n));
  free(o);
  o = check_nccl_graph(c, d, h, n);
  /* timing (generate --time-allreduce): every timed all-reduce counted, results unchanged */
  double ms = -1;
  long calls = -1;
  CHECK(tp_comm_nccl_timing(NULL, 1) == QE_EINVAL);
  CHECK_OK(tp_comm_nccl_timing(c, 1));
  CHECK(!c->ops->capturable(c)); /* its events are drained by waiting */
  for (int i = 0; i < 5; i++) CHECK_OK(c->ops->allreduce_sum_f32(c, d, n));
  CHECK_OK(tp_comm_nccl_time(c, &ms, &calls));
  CHECK(calls == 5 && ms >= 0);
  CHECK_OK(tp_comm_nccl_timing(c, 0));
  CHECK_OK(c->ops->allreduce_sum_f32(c, d, n));
  CHECK_OK(tp_comm_nccl_time(c, &ms, &calls));
  CHECK(calls == 5);
  free(o);
  o = bget(g_gpu, d, n);
  CHECK(bits_equal(o, h, n));
  fprintf(stderr, "nccl 1 rank: all-reduce, broadcast, all-gather, timing (%ld calls) checked\n",
          calls);
  free(o), free(h);
  kern_free(g_gpu, d), kern_free(g_gpu, r);
  tp_comm_destroy(c);
}
#endif

/* ---- --gap tool ---------------------------------------------------------------------------------
 */

static int gap_tool(const char *path, int n_prompt, const char *list) {
  int cap = 1, n = 0;
  for (const char *p = list; *p; p++) cap += *p == ',';
  int32_t *ids = malloc(sizeof(int32_t) * cap);
  for (const char *p = list; *p && n < cap;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) break;
    ids[n++] = (int32_t)v;
    p = *end == ',' ? end + 1 : end;
  }
  gguf_t *g = NULL;
  model_hparams_t hp;
  int rc = gguf_open(path, &g);
  if (!rc) rc = model_read_hparams(g, &hp);
  gguf_close(g);
  if (!rc && (n_prompt < 1 || n_prompt > n)) rc = qe_errf(QE_EINVAL, "bad N_PROMPT %d", n_prompt);
  float *ref = NULL, *got = NULL;
  if (!rc) {
    ref = malloc(sizeof(float) * (size_t)n * hp.n_vocab);
    got = malloc(sizeof(float) * (size_t)n * hp.n_vocab);
    rc = both_logits(path, ids, n, n_prompt, ref, got);
  }
  if (rc) {
    fprintf(stderr, "gap: %s: %s\n", qe_strerror(rc), qe_errmsg());
    free(ids), free(ref), free(got);
    return 1;
  }
  int V = hp.n_vocab, first = -1;
  for (int t = n_prompt - 1; t + 1 < n && first < 0; t++)
    if (argmax(got + (size_t)t * V, V) != ids[t + 1]) first = t;
  cmp_t c = compare_rows(ref, got, n, V);
  printf("gap: %d ids (%d prompt); worst per-position logit error %.3e\n", n, n_prompt, c.worst);
  if (first < 0) {
    printf("gap: the GPU's greedy choice equals the given next id at every position\n");
  } else {
    const float *a = ref + (size_t)first * V, *b = got + (size_t)first * V;
    int want = ids[first + 1], pick = argmax(b, V);
    printf("gap: first divergence at token %d (generated #%d): given %d, GPU picks %d; CPU logits "
           "%.5f vs %.5f (gap %.5f), GPU logits %.5f vs %.5f (gap %.5f); row error %.3e\n",
           first + 1, first + 1 - n_prompt, want, pick, a[want], a[pick], a[want] - a[pick],
           b[pick], b[want], b[pick] - b[want], nerr(b, a, (size_t)V));
  }
  free(ids), free(ref), free(got);
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* --prefill-bench: times the prefill attention op (GQA 32/8, head_dim 128: the Llama-3.1-8B
 * shape; one layer) on one prompt of 32,768 tokens and on 32 prompts of 256, no key masses,
 * inputs random; median of 5 calls after 2, each ended by a download (so host time is in);
 * prints ms and the causal product's TFLOP/s. Speed is reported here, never asserted. */
static double prefill_ms(const kern_attn_seq_t *sg, int n, const kern_attn_shape_t *sh) {
  double t[7];
  float one;
  for (int r = 0; r < 7; r++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    g_gpu->ops->attention(g_gpu, sg, n, sh);
    CHECK_OK(g_gpu->ops->download(g_gpu, &one, sg[0].out, sizeof one));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    t[r] = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  }
  qsort(t + 2, 5, sizeof *t, cmp_double); /* the last 5 */
  return t[4];
}

static void prefill_bench(void) {
  const kern_attn_shape_t sh = {32, 8, 128, 1.0f / sqrtf(128.0f)};
  const struct { int n_seq, len; } cs[] = {{1, 32768}, {32, 256}};
  for (int c = 0; c < 2; c++) {
    const int n = cs[c].n_seq, len = cs[c].len;
    const size_t qn = (size_t)len * sh.n_head * sh.head_dim, kn = qn / 4;
    float *hq = randv(qn, 1), *hk = randv(kn, 1);
    kern_attn_seq_t *sg = calloc((size_t)n, sizeof *sg);
    for (int i = 0; i < n; i++) {
      sg[i] = (kern_attn_seq_t){.n_q = len, .n_kv = len};
      sg[i].q = bput(g_gpu, hq, sizeof(float) * qn);
      sg[i].k = bput(g_gpu, hk, sizeof(float) * kn);
      sg[i].v = bput(g_gpu, hk, sizeof(float) * kn);
      sg[i].out = bpoison(g_gpu, qn);
    }
    const double ms = prefill_ms(sg, n, &sh);
    const double flop = 4.0 * sh.n_head * sh.head_dim * n * ((double)len * (len + 1) / 2);
    printf("{\"prefill_bench\": \"%dx%d\", \"ms\": %.3f, \"tflops\": %.1f}\n", n, len, ms,
           flop / ms / 1e9);
    for (int i = 0; i < n; i++) {
      kern_free(g_gpu, (void *)sg[i].q), kern_free(g_gpu, (void *)sg[i].k);
      kern_free(g_gpu, (void *)sg[i].v), kern_free(g_gpu, sg[i].out);
    }
    free(sg), free(hq), free(hk);
  }
}

static void attention_checks(void) {
  check_attentions(), check_attention_chunks(), check_attention_flash(0);
}

static void fused_checks(void) { check_attention_flash(1); }

int main(int argc, char **argv) {
  if (kern_cuda_device_count() <= 0) tu_skip("no CUDA device visible (the CUDA backend is built)");
  CHECK_OK(kern_cpu_create(0, &g_cpu));
  CHECK_OK(kern_cuda_create(0, &g_gpu));
  if (!g_cpu || !g_gpu) return tu_done("kern_cuda");
  if (argc == 3 && !strcmp(argv[1], "--random")) {
    int rc = random_tool(argv[2]);
    kern_destroy(g_gpu), kern_destroy(g_cpu);
    return rc;
  }
  if (argc == 5 && !strcmp(argv[1], "--gap")) {
    int rc = gap_tool(argv[2], atoi(argv[3]), argv[4]);
    kern_destroy(g_gpu), kern_destroy(g_cpu);
    return rc;
  }
  if (argc == 2) { /* one group of checks alone (for the sanitizers), or the benchmark */
    static const struct {
      const char *flag;
      void (*run)(void);
    } only[] = {{"--attention", attention_checks},    /* every attention check */
                {"--fused", fused_checks},            /* the fused prefill kernel's cases */
                {"--chunks", check_attention_chunks}, /* the GEMM path's chunked case */
                {"--prefill-bench", prefill_bench}};
    for (size_t i = 0; i < sizeof only / sizeof *only; i++)
      if (!strcmp(argv[1], only[i].flag)) {
        only[i].run();
        kern_destroy(g_gpu), kern_destroy(g_cpu);
        return tu_done("kern_cuda");
      }
  }
  kern_backend_t *gemmex = NULL;
  setenv("QE_CUDA_GEMM", "gemmex", 1);
  CHECK_OK(kern_cuda_create(0, &gemmex));
  unsetenv("QE_CUDA_GEMM");
  check_matmuls(g_gpu, "cublasLt");
  if (gemmex) check_matmuls(gemmex, "gemmex");
  kern_destroy(gemmex);
  check_weight_upload(37, 70, 3), check_weight_upload(4100, 4099, 5);
  check_rmsnorm(1, 64, 0), check_rmsnorm(5, 4096, 0), check_rmsnorm(33, 1000, 1);
  /* the vector form at its largest row, and the loop form (odd or long rows) */
  check_rmsnorm(4, 8192, 1), check_rmsnorm(3, 1001, 0), check_rmsnorm(2, 16384, 0);
  check_ropes();
  check_swiglu_add_embed_softmax(1, 7), check_swiglu_add_embed_softmax(4, 512);
  check_swiglu_add_embed_softmax(3, 32000), check_swiglu_add_embed_softmax(64, 11008);
  check_fused_proj();
  kern_backend_t *unfused = NULL;
  setenv("QE_CUDA_FUSE_BF16", "0", 1), setenv("QE_CUDA_FUSE_ADD", "0", 1);
  CHECK_OK(kern_cuda_create(0, &unfused));
  unsetenv("QE_CUDA_FUSE_BF16"), unsetenv("QE_CUDA_FUSE_ADD");
  if (unfused) { /* the vector RMSNorm (k a multiple of 4) and the loop form (odd k) */
    check_fused_bf16(unfused, 32, 512, 4096), check_fused_bf16(unfused, 5, 300, 1001);
    check_fused_bf16(unfused, 1, 64, 16384);
  }
  kern_destroy(unfused);
  check_embed(512, 64, 9), check_embed(32000, 4096, 33);
  check_attentions();
  check_attention_chunks();
  check_attention_flash(0);
  check_sampling(512, 400), check_sampling(32000, 60);
  check_argmax(64, 128256), check_argmax(7, 33), check_argmax(1, 1);
  check_models();
  check_random_model(0), check_random_model(1);
#ifdef QE_HAVE_NCCL
  check_nccl();
#else
  fprintf(stderr, "nccl: not built, not checked\n");
#endif
  kern_destroy(g_gpu);
  kern_destroy(g_cpu);
  return tu_done("kern_cuda");
}
