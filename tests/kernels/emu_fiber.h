/* emu_fiber: the CPU emulation of a CUDA block for the kernels' own code (attn_emu, flash_emu):
 * every CUDA thread of a block is a fiber (ucontext) of one OS thread; warp collectives
 * (shuffles, votes, mma.sync) and barriers switch fibers until all participants arrived, so a
 * divergent collective shows up as a reported deadlock. mma is computed in fp64 from the PTX
 * fragment layouts. At most KCA_CT threads a block. Include once per program, after
 * kern_cuda_attn_dev.cuh (KCA_EMU). */
#ifndef QE_EMU_FIBER_H
#define QE_EMU_FIBER_H
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

/* ---------------------------------------------------------------- fibers */

namespace {

const size_t kStack = 256 << 10;

struct Emu {
  int nthr = 0, cur = 0;
  std::vector<ucontext_t> ctx;
  std::vector<int> done;
  std::vector<char> stacks;
  ucontext_t sched;
  std::function<void(int)> body;
  float xf[KCA_CT / 32][32];
  int xi[KCA_CT / 32][32];
  uint32_t xa[KCA_CT / 32][32][4], xb[KCA_CT / 32][32][2];
  const void *xp[KCA_CT / 32][32];
  int w_arr[KCA_CT / 32] = {0}, b_arr = 0;
  unsigned w_gen[KCA_CT / 32] = {0}, b_gen = 0;
  long progress = 0;
};

Emu *E;

void emu_yield() { swapcontext(&E->ctx[E->cur], &E->sched); }

void emu_trampoline() {
  E->body(E->cur);
  E->done[E->cur] = 1;
  E->progress++;
  swapcontext(&E->ctx[E->cur], &E->sched);
}

/* Waits until `count` fibers arrived at this barrier (generation gen of *arr). */
void emu_barrier(int *arr, unsigned *gen, int count) {
  unsigned g = *gen;
  E->progress++;
  if (++*arr == count) {
    *arr = 0, ++*gen;
    return;
  }
  while (*gen == g) emu_yield();
}

void emu_bar_warp() {
  int w = E->cur / 32;
  emu_barrier(&E->w_arr[w], &E->w_gen[w], 32);
}

/* Runs body(tid) for tid < nthr as one block. Returns -1 on a deadlock. */
int emu_block(int nthr, std::function<void(int)> body) {
  E->nthr = nthr, E->body = body, E->b_arr = 0;
  E->ctx.assign(nthr, ucontext_t());
  E->done.assign(nthr, 0);
  if (E->stacks.size() < (size_t)nthr * kStack) E->stacks.resize((size_t)nthr * kStack);
  for (int w = 0; w < KCA_CT / 32; w++) E->w_arr[w] = 0;
  for (int i = 0; i < nthr; i++) {
    getcontext(&E->ctx[i]);
    E->ctx[i].uc_stack.ss_sp = E->stacks.data() + (size_t)i * kStack;
    E->ctx[i].uc_stack.ss_size = kStack;
    E->ctx[i].uc_link = NULL;
    makecontext(&E->ctx[i], emu_trampoline, 0);
  }
  for (;;) {
    long p0 = E->progress;
    int live = 0;
    for (int i = 0; i < nthr; i++) {
      if (E->done[i]) continue;
      live = 1, E->cur = i;
      swapcontext(&E->sched, &E->ctx[i]);
    }
    if (!live) return 0;
    if (E->progress == p0) {
      fprintf(stderr, "emu: deadlock (divergent collective or barrier)\n");
      return -1;
    }
  }
}

float emu_elem(uint32_t r, int hi, int f16) {
  uint16_t h = (uint16_t)(hi ? r >> 16 : r);
  if (f16) return qe_half_to_f32(h);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

} // namespace

/* ---------------------------------------------------------------- the layer's collectives */

float kca_emu_shfl(float v, int x, int is_xor) {
  int w = E->cur / 32, l = E->cur % 32;
  E->xf[w][l] = v;
  emu_bar_warp();
  float r = E->xf[w][is_xor ? (l ^ x) : (x & 31)];
  emu_bar_warp();
  return r;
}

uint32_t kca_emu_shfl_u(uint32_t v, int src) {
  int w = E->cur / 32, l = E->cur % 32;
  E->xi[w][l] = (int)v;
  emu_bar_warp();
  uint32_t r = (uint32_t)E->xi[w][src & 31];
  emu_bar_warp();
  return r;
}

int kca_emu_any(int pred) {
  int w = E->cur / 32, l = E->cur % 32, r = 0;
  E->xi[w][l] = pred != 0;
  emu_bar_warp();
  for (int i = 0; i < 32; i++) r |= E->xi[w][i];
  emu_bar_warp();
  return r;
}

uint32_t kca_emu_ballot(int pred) {
  int w = E->cur / 32, l = E->cur % 32;
  uint32_t r = 0;
  E->xi[w][l] = pred != 0;
  emu_bar_warp();
  for (int i = 0; i < 32; i++) r |= (uint32_t)E->xi[w][i] << i;
  emu_bar_warp();
  return r;
}

/* The pointer lane src of the warp holds (ldmatrix's row addresses). */
const void *kca_emu_shfl_ptr(const void *p, int src) {
  int w = E->cur / 32, l = E->cur % 32;
  E->xp[w][l] = p;
  emu_bar_warp();
  const void *r = E->xp[w][src & 31];
  emu_bar_warp();
  return r;
}

void kca_emu_syncwarp(void) { emu_bar_warp(); }
void kca_emu_syncthreads(void) { emu_barrier(&E->b_arr, &E->b_gen, E->nthr); }

void kca_emu_mma(float *d, const uint32_t *a, const uint32_t *b, int k, int f16) {
  int w = E->cur / 32, l = E->cur % 32, g = l / 4, c = l % 4;
  for (int i = 0; i < (k == 16 ? 4 : 2); i++) E->xa[w][l][i] = a[i];
  for (int i = 0; i < (k == 16 ? 2 : 1); i++) E->xb[w][l][i] = b[i];
  emu_bar_warp();
  for (int i = 0; i < 4; i++) {
    int row = g + (i >= 2 ? 8 : 0), col = 2 * c + (i & 1);
    double s = 0.0;
    for (int kk = 0; kk < k; kk++) {
      int la = (row % 8) * 4 + (kk % 8) / 2, ra = (row >= 8 ? 1 : 0) + (kk >= 8 ? 2 : 0);
      int lb = col * 4 + (kk % 8) / 2, rb = kk >= 8 ? 1 : 0;
      s += (double)emu_elem(E->xa[w][la][ra], kk & 1, f16) *
           (double)emu_elem(E->xb[w][lb][rb], kk & 1, f16);
    }
    d[i] = (float)((double)d[i] + s);
  }
  emu_bar_warp();
}

#endif
