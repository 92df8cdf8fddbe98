/* kern_cpu_attn_split: decode attention (one query a sequence) over keys read from a source
 * (kern_kv_src_t), in three passes over the pool so that every thread has work whatever the
 * batch and the number of KV heads (a batch of one with three KV heads gave two threads three
 * tasks before):
 *   1. scores, a task per (sequence, KV head, part of the runs): each run's keys are read (or
 *      dequantized) once for the heads that share them;
 *   2. softmax and key masses, a task per (sequence, head);
 *   3. outputs, a task per (sequence, KV head, part of the channels), each run's values read
 *      once for the heads that share them.
 * Every score, probability and output element gets exactly the operations of
 * kern_cpu_attention's blocks, in the same order (the outputs summed in key order): the same
 * bits. */
#include <stdlib.h>

#include "kern_cpu_internal.h"

typedef struct {
  const kern_attn_seq_t *seqs;
  const kern_attn_shape_t *sh;
  float *p;            /* each sequence's probabilities [n_head][n_kv + 1] at p_off[seq] */
  const size_t *p_off; /* [n_seqs] */
  float *mass;         /* each sequence's key masses [n_head][n_kv] at mass_off[seq] */
  const size_t *mass_off;
  int parts_k; /* parts a sequence's runs are split into for the scores */
  int parts_v; /* parts its (KV head, channel chunk) units are split into for the outputs */
  int chunk_v; /* channels a chunk (the head or a power-of-two part of it, >= 16) */
} split_job_t;

int kern_cpu_attn_split_takes(const kern_attn_seq_t *seqs, int n_seqs) {
  for (int s = 0; s < n_seqs; s++)
    if (!seqs[s].src || seqs[s].n_q != 1) return 0;
  return n_seqs > 0;
}

static float *seq_p(const split_job_t *J, int s, int h) {
  return J->p + J->p_off[s] + (size_t)h * (size_t)(J->seqs[s].n_kv + 1);
}

static void *buf_or_die(size_t floats) {
  float *b = malloc(sizeof(float) * (floats ? floats : 1));
  if (!b) abort(); /* a task's rows: fails only on an exhausted host */
  return b;
}

/* Pass 1: p[h][j] = scale * q_h . k_j for every head and the keys of a part of the runs, each
 * run's KV heads one after the other (its bytes read once, while in cache). */
static void split_scores(void *ctx, int task) {
  const split_job_t *J = ctx;
  int s = task / J->parts_k, part = task % J->parts_k, hd = J->sh->head_dim;
  int group = J->sh->n_head / J->sh->n_kv_head;
  const kern_attn_seq_t *sq = &J->seqs[s];
  const kern_kv_src_t *src = sq->src;
  int nk = kern_cpu_visible_keys(sq, sq->q_pos0);
  int r0 = (int)((long)src->n_run * part / J->parts_k);
  int r1 = (int)((long)src->n_run * (part + 1) / J->parts_k);
  float *buf = buf_or_die((size_t)src->max_rows * hd);
  for (int r = r0; r < r1 && src->first[r] < nk; r++)
    for (int kvh = 0; kvh < J->sh->n_kv_head; kvh++) {
      const float *rows;
      size_t st;
      int n = src->view(src, r, 0, kvh, 0, hd, buf, &rows, &st), j0 = src->first[r];
      int m = nk - j0 < n ? nk - j0 : n;
      for (int h = kvh * group; h < (kvh + 1) * group; h++)
        kern_cpu_attn_dots(sq->q + (size_t)h * hd, rows, st, m, hd, J->sh->scale,
                           seq_p(J, s, h) + j0);
    }
  free(buf);
}

/* Pass 2: one head's softmax, its output zeroed, its probabilities added to its mass row. */
static void split_softmax(void *ctx, int task) {
  const split_job_t *J = ctx;
  int s = task / J->sh->n_head, h = task % J->sh->n_head, hd = J->sh->head_dim;
  const kern_attn_seq_t *sq = &J->seqs[s];
  int nk = kern_cpu_visible_keys(sq, sq->q_pos0);
  if (nk <= 0) return; /* no visible key: the output is left as it is */
  float *p = seq_p(J, s, h), *out = sq->out + (size_t)h * hd;
  kern_cpu_softmax_row(p, nk);
  for (int d = 0; d < hd; d++) out[d] = 0;
  float *mrow = sq->key_mass ? J->mass + J->mass_off[s] + (size_t)h * sq->n_kv : NULL;
  for (int j = 0; mrow && sq->mass_q0 <= 0 && j < nk; j++) mrow[j] += p[j];
}

/* Pass 3: out_h[c0, c0 + nc) = sum_j p[h][j] v_j[c0, c0 + nc) in key order, for a part of the
 * (KV head, channel chunk) units, each run's units one after the other. */
static void split_values(void *ctx, int task) {
  const split_job_t *J = ctx;
  int s = task / J->parts_v, part = task % J->parts_v, hd = J->sh->head_dim;
  int group = J->sh->n_head / J->sh->n_kv_head, per = (hd + J->chunk_v - 1) / J->chunk_v;
  int units = J->sh->n_kv_head * per, u0 = units * part / J->parts_v;
  int u1 = units * (part + 1) / J->parts_v;
  const kern_attn_seq_t *sq = &J->seqs[s];
  const kern_kv_src_t *src = sq->src;
  int nk = kern_cpu_visible_keys(sq, sq->q_pos0);
  float *buf = buf_or_die((size_t)src->max_rows * J->chunk_v);
  for (int r = 0; r < src->n_run && src->first[r] < nk; r++)
    for (int u = u0; u < u1; u++) {
      int kvh = u / per, c0 = u % per * J->chunk_v,
          nc = hd - c0 < J->chunk_v ? hd - c0 : J->chunk_v;
      const float *rows;
      size_t st;
      int n = src->view(src, r, 1, kvh, c0, nc, buf, &rows, &st), j0 = src->first[r];
      int m = nk - j0 < n ? nk - j0 : n;
      for (int h = kvh * group; h < (kvh + 1) * group; h++)
        kern_cpu_attn_axpys(sq->out + (size_t)h * hd + c0, seq_p(J, s, h) + j0, rows, st, m, nc);
    }
  free(buf);
}

/* Parts enough for about two tasks a thread: of the runs for the scores, of the (KV head,
 * channel chunk) units for the outputs (the head halved while a half is a multiple of 16). */
static void split_parts(split_job_t *J, int n_seqs, int n_threads) {
  int want = (2 * n_threads + n_seqs - 1) / n_seqs, max_runs = 1, hd = J->sh->head_dim;
  for (int s = 0; s < n_seqs; s++) /* (a shorter sequence's surplus parts are empty) */
    max_runs = J->seqs[s].src->n_run > max_runs ? J->seqs[s].src->n_run : max_runs;
  J->parts_k = want < max_runs ? want : max_runs;
  J->chunk_v = hd;
  while (J->chunk_v % 32 == 0 && J->sh->n_kv_head * (hd / J->chunk_v) < want) J->chunk_v /= 2;
  int units = J->sh->n_kv_head * ((hd + J->chunk_v - 1) / J->chunk_v);
  J->parts_v = want < units ? want : units;
}

void kern_cpu_attn_split(kern_cpu_t *c, const kern_attn_seq_t *seqs, int n_seqs,
                         const kern_attn_shape_t *sh, float *mass, const size_t *mass_off) {
  size_t *p_off = malloc(sizeof(size_t) * (size_t)n_seqs), total = 0;
  if (!p_off) abort();
  for (int s = 0; s < n_seqs; s++) {
    p_off[s] = total;
    total += (size_t)sh->n_head * (size_t)(seqs[s].n_kv + 1);
  }
  split_job_t J = {seqs, sh, buf_or_die(total), p_off, mass, mass_off, 1, 1, sh->head_dim};
  split_parts(&J, n_seqs, c->base.n_threads);
  kern_cpu_pool_run(c->pool, split_scores, &J, n_seqs * J.parts_k);
  kern_cpu_pool_run(c->pool, split_softmax, &J, n_seqs * sh->n_head);
  kern_cpu_pool_run(c->pool, split_values, &J, n_seqs * J.parts_v);
  free(J.p);
  free(p_off);
}
