/* kv_gpu: FullKV in bf16 pages on the GPU (see kv_gpu.h). The host keeps which pages a slot
 * owns and its length; the device keeps the window table [n_layer][max_seqs][max_win] that the
 * kernels read. store() only records the call; attend() writes the layer's new tokens with one
 * kernel, runs the fused decode kernel over every single-token request and the backend's
 * attention over the gathered pages of every multi-token (prefill) request. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kv_gpu_internal.h"
#include "qe_status.h"

size_t kv_gpu_pool_bytes(const kv_geom_t *g, int omega, int n_seqs, int capacity) {
  size_t wins = (size_t)(capacity + omega - 1) / (size_t)omega;
  return wins * (size_t)g->n_layer * (size_t)n_seqs * kv_gpu_page_bytes(g, omega);
}

/* ---- device buffers and staging ------------------------------------------------------------ */

int kv_gpu__buf_need(kv_gpu_t *g, kvg_buf_t *b, size_t bytes) {
  if (bytes <= b->cap) return 0;
  size_t cap = bytes + bytes / 2 + 256;
  void *p = kern_alloc(g->base.be, cap);
  if (!p) return qe_errf(QE_ENOMEM, "kv_gpu: no device memory for %zu bytes of workspace", cap);
  kern_free(g->base.be, b->p);
  b->p = p, b->cap = cap;
  return 0;
}

/* Copies bytes of host src to device dst through the pinned ring (asynchronous). */
int kv_gpu__stage(kv_gpu_t *g, void *dst, const void *src, size_t bytes) {
  size_t need = (bytes + 255) & ~(size_t)255;
  if (g->pin_used + need > g->pin_cap) {
    int rc = kc_stream_sync(g->stream); /* every earlier copy out of the ring is done */
    if (rc) return rc;
    g->pin_used = 0;
    if (need > g->pin_cap) {
      kc_host_free(g->pin);
      g->pin_cap = need > 2 * g->pin_cap ? need : 2 * g->pin_cap;
      if (!(g->pin = kc_host_alloc(g->pin_cap)))
        return g->pin_cap = 0, qe_errf(QE_ENOMEM, "kv_gpu: no pinned memory");
    }
  }
  uint8_t *at = g->pin + g->pin_used;
  memcpy(at, src, bytes);
  g->pin_used += need;
  return kc_upload_async(dst, at, bytes, g->stream);
}

int64_t kv_gpu__tab_index(const kv_gpu_t *g, int layer, int seq, int w) {
  return ((int64_t)layer * g->base.geom.max_seqs + seq) * g->max_win + w;
}

/* ---- slots ----------------------------------------------------------------------------------- */

static void gpu_seq_close(kv_cache_t *kv, int seq) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  if (seq < 0 || seq >= kv->geom.max_seqs || !g->seqs[seq].open) return;
  kvg_seq_t *s = &g->seqs[seq];
  if (g->t) {
    kv_gpu__tier_close(g, seq);
    memset(s, 0, sizeof *s);
    return;
  }
  size_t n = (size_t)s->n_win * kv->geom.n_layer;
  for (size_t i = 0; i < n; i++) g->free_pages[g->n_free++] = s->pages[i];
  free(s->pages);
  memset(s, 0, sizeof *s);
}

/* Writes the descriptors of a freshly opened slot (empty FULL windows). */
static int write_descs(kv_gpu_t *g, int seq) {
  const kvg_seq_t *s = &g->seqs[seq];
  int nl = g->base.geom.n_layer, n = s->n_win * nl, rc = 0;
  kc_kv_upd_t *u = malloc(sizeof *u * (size_t)n);
  if (!u) return qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
  for (int l = 0; l < nl; l++)
    for (int w = 0; w < s->n_win; w++) {
      uint64_t off = (uint64_t)s->pages[l * s->n_win + w] * g->page_bytes;
      kern_pwin_t pw = {
          .k = off, .v = off + g->page_bytes / 2, .pos0 = w * g->omega, .tier = KERN_PW_FULL};
      u[l * s->n_win + w] = (kc_kv_upd_t){kv_gpu__tab_index(g, l, seq, w), pw};
    }
  size_t bytes = sizeof *u * (size_t)n;
  rc = kv_gpu__buf_need(g, &g->d_upd, bytes);
  if (!rc) rc = kv_gpu__stage(g, g->d_upd.p, u, bytes);
  if (!rc) rc = kc_kv_scatter(g->tab, g->d_upd.p, n, g->stream);
  free(u);
  return rc;
}

static int gpu_seq_open(kv_cache_t *kv, int seq, int capacity) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  if (seq < 0 || seq >= kv->geom.max_seqs || capacity <= 0 || capacity > g->max_win * g->omega)
    return qe_errf(QE_EINVAL, "kv_gpu: bad slot %d or capacity %d (at most %d)", seq, capacity,
                   g->max_win * g->omega);
  gpu_seq_close(kv, seq);
  kvg_seq_t *s = &g->seqs[seq];
  if (g->t) {
    int rc = kv_gpu__tier_open(g, seq, capacity);
    if (!rc) s->open = 1, s->capacity = capacity, s->len = 0;
    return rc;
  }
  int n_win = (capacity + g->omega - 1) / g->omega, n = n_win * kv->geom.n_layer;
  if (n > g->n_free)
    return qe_errf(QE_ENOSPC, "kv_gpu: %d pages needed for %d tokens, %d free", n, capacity,
                   g->n_free);
  if (!(s->pages = malloc(sizeof(int32_t) * (size_t)n)))
    return qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
  for (int i = 0; i < n; i++) s->pages[i] = g->free_pages[--g->n_free];
  if (g->n_pages - g->n_free > g->n_peak) g->n_peak = g->n_pages - g->n_free;
  s->open = 1, s->capacity = capacity, s->n_win = n_win, s->len = 0;
  int rc = write_descs(g, seq);
  if (rc) gpu_seq_close(kv, seq);
  return rc;
}

static size_t gpu_seq_bytes(const kv_cache_t *kv_c, int seq) {
  kv_cache_t *kv = (kv_cache_t *)kv_c; /* reads the device's accounting (synchronizes) */
  kv_gpu_t *g = (kv_gpu_t *)kv;
  if (seq < 0 || seq >= kv->geom.max_seqs) return 0;
  if (g->t) return g->seqs[seq].open ? kv_gpu__tier_bytes(g, seq) : 0;
  return (size_t)g->seqs[seq].n_win * kv->geom.n_layer * g->page_bytes;
}

/* ---- store ----------------------------------------------------------------------------------- */

static int gpu_store(kv_cache_t *kv, int seq, int layer, int pos0, int n, const float *k,
                     const float *v) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  if (g->fixed && g->n_segs) return 0; /* fixed mode: row 0's k and v locate every row */
  if (seq < 0 || seq >= kv->geom.max_seqs || !g->seqs[seq].open)
    return qe_errf(QE_EINVAL, "kv_gpu: store into closed slot %d", seq);
  if (layer < 0 || layer >= kv->geom.n_layer || pos0 < 0 || n <= 0 ||
      pos0 + n > g->seqs[seq].capacity)
    return qe_errf(QE_EINVAL, "kv_gpu: store of %d tokens at %d in slot %d (capacity %d)", n, pos0,
                   seq, g->seqs[seq].capacity);
  if (g->n_segs == KVG_MAX_SEGS) return qe_errf(QE_EINVAL, "kv_gpu: too many stores per layer");
  g->segs[g->n_segs++] = (kvg_seg_t){seq, pos0, n, k, v};
  return 0;
}

/* Stages src unless the device buffer already holds exactly these bytes (the layers of one step
 * write the same token and window tables): last keeps what was staged there last; *same (may be
 * NULL) says whether it did. */
static int stage_once(kv_gpu_t *g, kvg_last_t *last, void *dst, const void *src, size_t bytes,
                      int *same) {
  const int held = last->dst == dst && last->bytes == bytes && !memcmp(last->copy, src, bytes);
  if (same) *same = held;
  if (held) return 0;
  if (bytes > last->cap) {
    void *c = realloc(last->copy, bytes);
    if (!c) return qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
    last->copy = c, last->cap = bytes;
  }
  int rc = kv_gpu__stage(g, dst, src, bytes);
  memcpy(last->copy, src, bytes);
  last->dst = rc ? NULL : dst, last->bytes = bytes;
  return rc;
}

static int tok_need(kv_gpu_t *g, int n) {
  if (n <= g->tok_cap) return 0;
  int cap = n + n / 2 + 64;
  int32_t *t = realloc(g->h_tok, sizeof(int32_t) * 2 * (size_t)cap);
  if (!t) return qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
  g->h_tok = t, g->tok_cap = cap;
  return kv_gpu__buf_need(g, &g->d_tok, sizeof(int32_t) * 2 * (size_t)cap);
}

/* Writes the recorded stores of `layer`: one kernel when the sources are consecutive rows of one
 * buffer (the model's layout), else one per store. */
static int flush_stores(kv_gpu_t *g, int layer) {
  int total = 0, rc = 0, contiguous = 1;
  for (int i = 0; i < g->n_segs; i++) {
    const kvg_seg_t *s = &g->segs[i];
    contiguous &= s->k == g->segs[0].k + (size_t)total * g->row &&
                  s->v == g->segs[0].v + (size_t)total * g->row;
    total += s->n;
  }
  if (!total || (rc = tok_need(g, total))) return rc;
  for (int i = 0, t = 0; i < g->n_segs; i++)
    for (int j = 0; j < g->segs[i].n; j++, t++) {
      g->h_tok[t] = g->segs[i].seq;
      g->h_tok[g->tok_cap + t] = g->segs[i].pos0 + j;
    }
  int32_t *dt = g->d_tok.p;
  int same = 0;
  if ((rc = stage_once(g, &g->tok_last, dt, g->h_tok, sizeof(int32_t) * 2 * (size_t)g->tok_cap,
                       &same)))
    return rc;
  /* tiered: pages for the windows the tokens start; in a decode-only step (one token per
   * sequence: at most one new window each) every layer's at layer 0, since a forward pass stores
   * the same tokens on every layer; else (a prompt's windows are routed layer by layer, which
   * bounds the pool's peak) this layer's */
  const int L = g->base.geom.n_layer, decode = total == g->n_segs;
  g->alloc_all &= same;
  const int n_alloc = !g->t ? 0 : layer == 0 && decode ? L : g->alloc_all ? 0 : 1;
  kern_pwin_t *tab = g->tab + kv_gpu__tab_index(g, layer, 0, 0);
  for (int i = 0, t = 0; i < g->n_segs && !rc; i++) {
    const kvg_seg_t *s = &g->segs[i];
    int n = contiguous ? total : s->n;
    kc_kv_store_t a = {g->arena, tab,  g->max_win, g->omega, g->row,
                       n,        s->k, s->v,       dt + t,   dt + g->tok_cap + t};
    if (n_alloc) rc = kv_gpu__tier_alloc(g, layer, n_alloc, a.tok_slot, a.tok_pos, n);
    if (!rc) rc = kc_kv_store(&a, g->stream);
    for (int j = i; j < (contiguous ? g->n_segs : i + 1); j++) {
      kvg_seq_t *q = &g->seqs[g->segs[j].seq];
      if (g->segs[j].pos0 + g->segs[j].n > q->len) q->len = g->segs[j].pos0 + g->segs[j].n;
    }
    if (contiguous) break;
    t += s->n;
  }
  g->n_segs = 0;
  if (layer == 0) g->alloc_all = !rc && n_alloc == L && L > 1; /* valid within this pass */
  if (layer == L - 1) g->alloc_all = 0;
  return rc;
}

/* ---- attention ------------------------------------------------------------------------------- */

/* The decode kernel of a; with an observer, its step masses then join the layer's scores. */
static int run_decode(kv_gpu_t *g, int layer, const kc_attn_args_t *a) {
  int rc = kc_attn_decode(a, g->stream);
  if (!rc && g->obs) kv_gpu__obs_fold(g, layer);
  return rc;
}

/* The decode kernel's arguments for n_seq sequences of at most max_win windows at `layer`
 * (tables and buffers still to set). */
static kc_attn_args_t attn_args(const kv_gpu_t *g, int layer, int n_seq, int max_win) {
  const kv_geom_t *ge = &g->base.geom;
  kc_attn_args_t a = {.geom = {ge->n_kv_head, ge->head_dim, g->omega, 2, 32},
                      .n_seq = n_seq,
                      .n_head = ge->n_head,
                      .scale = 1.0f / sqrtf((float)ge->head_dim),
                      .arena = g->arena,
                      .win = g->tab + kv_gpu__tab_index(g, layer, 0, 0),
                      .n_win = ge->max_seqs * g->max_win,
                      .max_win = max_win,
                      .tickets = g->d_tk.p};
  if (g->t) kv_gpu__tier_attn_args(g, layer, &a);
  return a;
}

/* The fused decode kernel over the single-token requests idx[0..nd) of reqs. Their queries are
 * gathered into one buffer unless they already are consecutive rows. */
static int decode_attend(kv_gpu_t *g, int layer, const kv_attn_req_t *reqs, const int *sel,
                         int nd) {
  const kv_geom_t *ge = &g->base.geom;
  int nq = ge->n_head * ge->head_dim, max_win = 1, direct = 1, rc = 0;
  const float *base = reqs[sel[0]].q;
  for (int i = 0; i < nd; i++) {
    const kv_attn_req_t *r = &reqs[sel[i]];
    if (r->q < base) base = r->q;
    int nw = (g->seqs[r->seq].len + g->omega - 1) / g->omega;
    g->h_seqwin[i] = r->seq * g->max_win;
    g->h_seqwin[ge->max_seqs + i] = nw;
    max_win = nw > max_win ? nw : max_win;
    direct &=
        r->q == reqs[sel[0]].q + (size_t)i * nq && r->out == reqs[sel[0]].out + (size_t)i * nq;
  }
  for (int i = 0; i < nd; i++) g->h_idx[i] = (int)((reqs[sel[i]].q - base) / nq);
  int32_t *dsw = g->d_seqwin.p;
  if ((rc = stage_once(g, &g->sw_last, dsw, g->h_seqwin, sizeof(int32_t) * 2 * (size_t)ge->max_seqs,
                       NULL)))
    return rc;
  kc_attn_args_t a = attn_args(g, layer, nd, max_win);
  a.seq_win = dsw, a.seq_nwin = dsw + ge->max_seqs;
  if (g->obs && (rc = kv_gpu__obs_args(g, &a))) return rc;
  size_t ws = 0;
  if ((rc = kc_attn_ws_bytes(&a, &ws)) || (rc = kv_gpu__buf_need(g, &g->d_ws, ws))) return rc;
  a.ws = g->d_ws.p, a.ws_bytes = g->d_ws.cap;
  if (direct) {
    a.q = reqs[sel[0]].q, a.out = reqs[sel[0]].out;
    return run_decode(g, layer, &a);
  }
  size_t qb = sizeof(float) * (size_t)nd * nq;
  if ((rc = kv_gpu__buf_need(g, &g->d_q, qb)) || (rc = kv_gpu__buf_need(g, &g->d_out, qb)) ||
      (rc = kv_gpu__buf_need(g, &g->d_idx, sizeof(int32_t) * (size_t)nd)))
    return rc;
  if ((rc = kv_gpu__stage(g, g->d_idx.p, g->h_idx, sizeof(int32_t) * (size_t)nd))) return rc;
  if ((rc = kc_kv_rows(g->d_q.p, base, g->d_idx.p, nd, nq, 0, g->stream))) return rc;
  a.q = g->d_q.p, a.out = g->d_out.p;
  if ((rc = run_decode(g, layer, &a))) return rc;
  float *obase = reqs[sel[0]].out - (reqs[sel[0]].q - base); /* out rows mirror q rows */
  return kc_kv_rows(obase, g->d_out.p, g->d_idx.p, nd, nq, 1, g->stream);
}

/* The backend's attention over the gathered pages of the multi-token requests sel[0..np) (tiered:
 * with their observation queries' key masses in g->work[i].key_mass). */
static int prefill_attend(kv_gpu_t *g, int layer, const kv_attn_req_t *reqs, const int *sel,
                          int np) {
  const kv_geom_t *ge = &g->base.geom;
  size_t total = 0;
  int rc = 0;
  for (int i = 0; i < np; i++) total += (size_t)(reqs[sel[i]].pos0 + reqs[sel[i]].n_q);
  size_t bytes = sizeof(float) * total * g->row;
  if ((rc = kv_gpu__buf_need(g, &g->d_gk, bytes)) || (rc = kv_gpu__buf_need(g, &g->d_gv, bytes)))
    return rc;
  float *mass = NULL;
  if (g->t && (rc = kv_gpu__tier_masses(g, total, &mass))) return rc;
  size_t at = 0;
  for (int i = 0; i < np && !rc; i++) {
    const kv_attn_req_t *r = &reqs[sel[i]];
    int n_kv = r->pos0 + r->n_q;
    if (g->t && g->seqs[r->seq].routed) /* the gather reads FULL pages only */
      return qe_errf(QE_EUNSUPPORTED,
                     "kv_gpu: the tiered GPU cache takes a prompt in one piece "
                     "(slot %d continues at %d)",
                     r->seq, r->pos0);
    float *k = (float *)g->d_gk.p + at * g->row, *v = (float *)g->d_gv.p + at * g->row;
    rc = kc_kv_gather(g->arena, g->tab + kv_gpu__tab_index(g, layer, r->seq, 0), g->omega, g->row,
                      n_kv, k, v, g->stream);
    g->work[i] = (kern_attn_seq_t){
        .q = r->q, .k = k, .v = v, .out = r->out, .n_q = r->n_q, .n_kv = n_kv, .q_pos0 = r->pos0};
    if (mass) {
      int obs = kv_gpu__tier_obs(g);
      g->work[i].key_mass = mass + at, g->work[i].mass_q0 = r->n_q > obs ? r->n_q - obs : 0;
    }
    at += (size_t)n_kv;
  }
  if (rc) return rc;
  kern_attn_shape_t sh = {ge->n_head, ge->n_kv_head, ge->head_dim,
                          1.0f / sqrtf((float)ge->head_dim)};
  g->base.be->ops->attention(g->base.be, g->work, np, &sh);
  return 0;
}

/* With QEVICT_KV_GPU_SYNC=1 in the environment at creation: waits for the device after each
 * phase so that a device fault names the phase (debugging; slow). */
static int debug_sync(kv_gpu_t *g, const char *what, int layer) {
  if (!g->debug) return 0;
  int rc = kc_stream_sync(g->stream);
  return rc ? qe_errf(rc, "kv_gpu: %s of layer %d: %s", what, layer, qe_errmsg()) : 0;
}

/* ---- fixed-shape decode steps (kv_cache_ops_t.fixed_*) ------------------------------------- */

/* The most chunks per sequence of f's attention launch (cached per bucket and n_min). */
static int fixed_chunks(kv_gpu_t *g, const kv_fixed_t *f) {
  for (int i = 0; i < g->n_fx_chunks; i++)
    if (g->fx_chunks[0][i] == f->bucket && g->fx_chunks[1][i] == f->n_min)
      return g->fx_chunks[2][i];
  kc_attn_args_t a = attn_args(g, 0, f->bucket, g->max_win);
  int mc = kc_attn_max_chunks(&a, f->n_min), i = g->n_fx_chunks < 32 ? g->n_fx_chunks++ : 31;
  if (mc > 0) g->fx_chunks[0][i] = f->bucket, g->fx_chunks[1][i] = f->n_min;
  if (mc > 0) g->fx_chunks[2][i] = mc;
  return mc;
}

/* f's attention arguments for `layer` with its per-step tables and chunking from f->dev. */
static kc_attn_args_t fixed_args(kv_gpu_t *g, const kv_fixed_t *f, int layer, int max_chunk) {
  kc_attn_args_t a = attn_args(g, layer, f->bucket, g->max_win);
  a.seq_win = f->dev + 2 * f->stride, a.seq_nwin = f->dev + 3 * f->stride;
  a.chunk_dev = f->dev + 4 * f->stride, a.max_chunk = max_chunk;
  a.ws = g->d_fws.p, a.ws_bytes = g->d_fws.cap;
  return a;
}

/* Checks row i (slot s, position p) of a fixed step; its window count after the step. */
static int fixed_row(kv_gpu_t *g, int s, int p, int *n_win) {
  if (s < 0 || s >= g->base.geom.max_seqs || !g->seqs[s].open || p < 0 ||
      p >= g->seqs[s].capacity || p > g->seqs[s].len || g->seqs[s].fx_step == g->fx_step)
    return qe_errf(QE_EINVAL,
                   "kv_gpu: decode of slot %d at %d (closed, past its capacity, or twice)", s, p);
  g->seqs[s].fx_step = g->fx_step;
  int len = p + 1 > g->seqs[s].len ? p + 1 : g->seqs[s].len;
  *n_win = (len + g->omega - 1) / g->omega;
  return 0;
}

static int gpu_fixed_fill(kv_cache_t *kv, const kv_fixed_t *f, int32_t *in, const int32_t *seq,
                          const int32_t *pos, int n) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  int S = f->stride, max_win = 1, rc = 0;
  if (g->obs) /* the observer's hooks run between launches: the eager path */
    return qe_errf(QE_ERANGE, "kv_gpu: fixed steps do not run with an observer");
  if (n < 1 || n > f->bucket || f->bucket > S || n > 1024)
    return qe_errf(QE_EINVAL, "kv_gpu: fixed step of %d rows in a bucket of %d", n, f->bucket);
  if (!++g->fx_step) ++g->fx_step; /* 0 marks a slot never taken */
  for (int i = 0; i < f->bucket && !rc; i++) {
    int nw = 0, on = i < n && seq[i] != KV_FIXED_SKIP; /* (a skipped row: no windows, nw -1) */
    if (on && !(rc = fixed_row(g, seq[i], pos[i], &nw))) max_win = nw > max_win ? nw : max_win;
    in[i] = on ? seq[i] : -1, in[S + i] = on ? pos[i] : 0;
    in[2 * S + i] = on ? seq[i] * g->max_win : 0, in[3 * S + i] = i < n && !on ? -1 : nw;
  }
  kc_attn_args_t a = attn_args(g, 0, n, max_win); /* the chunking of the eager path */
  int cw = rc ? 0 : kc_attn_chunk_win(&a), mc = rc || cw < 0 ? 0 : fixed_chunks(g, f);
  if (rc || cw < 0 || mc < 0) return rc ? rc : cw < 0 ? cw : mc;
  if ((max_win + cw - 1) / cw > mc)
    return qe_errf(QE_ERANGE, "kv_gpu: %d chunks exceed the fixed launch's %d",
                   (max_win + cw - 1) / cw, mc);
  a.chunk_win = cw; /* (the lead's call takes this chunking, not a second search for it) */
  const int lead = kc_attn_lead(&a); /* (the eager path's, for the same bits) */
  if (lead < 0) return lead;
  in[4 * S] = cw, in[4 * S + 1] = lead;
  for (int i = 0; i < n; i++)
    if (seq[i] != KV_FIXED_SKIP && pos[i] + 1 > g->seqs[seq[i]].len)
      g->seqs[seq[i]].len = pos[i] + 1;
  return 0;
}

static int gpu_fixed_mode(kv_cache_t *kv, const kv_fixed_t *f) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  g->fixed = 0, g->n_segs = 0;
  if (!f) return 0;
  if (f->bucket < 1 || f->bucket > f->stride || f->n_min < 1 || f->n_min > f->bucket || !f->dev ||
      (size_t)f->bucket > g->d_tk.cap / sizeof(uint32_t))
    return qe_errf(QE_EINVAL, "kv_gpu: fixed mode for a bucket of %d rows", f->bucket);
  int mc = fixed_chunks(g, f), rc = mc < 0 ? mc : 0;
  kc_attn_args_t a = fixed_args(g, f, 0, mc > 0 ? mc : 1);
  size_t ws = 0;
  if (!rc) rc = kc_attn_ws_bytes(&a, &ws);
  if (!rc && ws > g->d_fws.cap) g->fx_epoch++;
  if (!rc) rc = kv_gpu__buf_need(g, &g->d_fws, ws);
  if (!rc) g->fx = *f, g->fixed = 1;
  return rc;
}

/* fixed mode's attend: the rows' new K/V into their pages (tiered: pages for the windows the
 * rows start, every layer's in one launch at layer 0: a step stores the same tokens on every
 * layer), then the decode kernel over every row (inactive rows have no windows). */
static int fixed_attend(kv_gpu_t *g, int layer, const kv_attn_req_t *r) {
  const kv_fixed_t *f = &g->fx;
  const int32_t *ts = f->dev, *tp = f->dev + f->stride;
  if (!g->n_segs)
    return qe_errf(QE_EINVAL, "kv_gpu: fixed attend of layer %d before a store", layer);
  kc_kv_store_t st = {g->arena,     g->tab + kv_gpu__tab_index(g, layer, 0, 0),
                      g->max_win,   g->omega,
                      g->row,       f->bucket,
                      g->segs[0].k, g->segs[0].v,
                      ts,           tp};
  g->n_segs = 0;
  int rc =
      g->t && layer == 0 ? kv_gpu__tier_alloc(g, 0, g->base.geom.n_layer, ts, tp, f->bucket) : 0;
  if (!rc) rc = kc_kv_store(&st, g->stream);
  kc_attn_args_t a = fixed_args(g, f, layer, fixed_chunks(g, f));
  a.q = r->q, a.out = r->out;
  return rc ? rc : kc_attn_decode(&a, g->stream);
}

static int gpu_fixed_done(kv_cache_t *kv, const int32_t *seq, int n) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  return g->t && n > 0 ? kv_gpu__tier_step_done(g, seq, n) : 0;
}

static unsigned long gpu_fixed_epoch(const kv_cache_t *kv) {
  return ((const kv_gpu_t *)kv)->fx_epoch;
}

static int gpu_attend(kv_cache_t *kv, int layer, const kv_attn_req_t *reqs, int n_reqs) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  if (g->fixed) return n_reqs > 0 ? fixed_attend(g, layer, reqs) : 0;
  int dec[1024], pre[1024], nd = 0, np = 0, rc = flush_stores(g, layer);
  if (rc) return rc;
  if (n_reqs > kv->geom.max_seqs || n_reqs > 1024)
    return qe_errf(QE_EINVAL, "kv_gpu: %d requests in one call (max %d)", n_reqs,
                   kv->geom.max_seqs);
  for (int i = 0; i < n_reqs; i++) {
    const kv_attn_req_t *r = &reqs[i];
    if (r->seq < 0 || r->seq >= kv->geom.max_seqs || !g->seqs[r->seq].open ||
        r->pos0 + r->n_q > g->seqs[r->seq].len)
      return qe_errf(QE_EINVAL, "kv_gpu: attention of slot %d at %d before its keys are stored",
                     r->seq, r->pos0);
    if (r->n_q == 1)
      dec[nd++] = i;
    else
      pre[np++] = i;
  }
  if (!rc) rc = debug_sync(g, "store", layer);
  if (nd && !rc) rc = decode_attend(g, layer, reqs, dec, nd);
  if (!rc) rc = debug_sync(g, "decode attention", layer);
  if (!rc && np) rc = prefill_attend(g, layer, reqs, pre, np);
  if (!rc && g->obs) rc = kv_gpu__obs_capture(g, layer, reqs, n_reqs);
  if (!rc && np && g->t) rc = kv_gpu__tier_prefilled(g, layer, reqs, pre, np);
  if (!rc) rc = debug_sync(g, "prefill attention and routing", layer);
  if (!rc && g->t) rc = kv_gpu__tier_decoded(g, layer, reqs, dec, nd);
  if (!rc) rc = debug_sync(g, "decode routing", layer);
  if (!rc && g->obs) rc = kv_gpu__obs_emit(g, layer, nd);
  return rc;
}

/* ---- create / destroy ------------------------------------------------------------------------ */

void kv_gpu__dispose(kv_gpu_t *g) {
  kv_cache_t *kv = &g->base;
  for (int i = 0; g->seqs && i < kv->geom.max_seqs; i++) gpu_seq_close(kv, i);
  if (g->stream) kc_stream_sync(g->stream);
  kv_gpu__obs_free(g);
  kv_gpu__tier_destroy(g);
  kvg_buf_t *bufs[] = {&g->d_tok, &g->d_upd, &g->d_seqwin, &g->d_idx, &g->d_q, &g->d_out,
                       &g->d_ws,  &g->d_gk,  &g->d_gv,     &g->d_fws, &g->d_tk};
  for (size_t i = 0; kv->be && i < sizeof bufs / sizeof *bufs; i++) kern_free(kv->be, bufs[i]->p);
  if (kv->be) kern_free(kv->be, g->arena), kern_free(kv->be, g->tab);
  kc_host_free(g->pin);
  free(g->free_pages), free(g->seqs), free(g->segs), free(g->h_tok), free(g->h_seqwin);
  free(g->h_idx), free(g->work), free(g->tok_last.copy), free(g->sw_last.copy);
  free(g);
}

static void gpu_destroy(kv_cache_t *kv) { kv_gpu__dispose((kv_gpu_t *)kv); }

static int gpu_prompt_room(const kv_cache_t *kv) { return ((const kv_gpu_t *)kv)->prompt_room; }

/* The two modes' tables: the same functions; only the tiered mode takes an observer. */
#define KV_GPU_OPS(NAME, OBS)                                                                      \
  {                                                                                                \
    .name = NAME, .seq_open = gpu_seq_open, .seq_close = gpu_seq_close, .store = gpu_store,        \
    .attend = gpu_attend, .seq_bytes = gpu_seq_bytes, .destroy = gpu_destroy, .set_observer = OBS, \
    .fixed_fill = gpu_fixed_fill, .fixed_mode = gpu_fixed_mode, .fixed_done = gpu_fixed_done,      \
    .fixed_epoch = gpu_fixed_epoch, .prompt_room = gpu_prompt_room                                 \
  }
static const kv_cache_ops_t kv_gpu_ops = KV_GPU_OPS("gpu-full", NULL);
static const kv_cache_ops_t kv_gpu_tiered_ops = KV_GPU_OPS("gpu-tiered", kv_gpu__obs_set);

int kv_gpu_is_tiered(const kv_cache_t *kv) { return kv && kv->ops == &kv_gpu_tiered_ops; }

int kv_gpu_is(const kv_cache_t *kv) {
  return kv && (kv->ops == &kv_gpu_ops || kv_gpu_is_tiered(kv));
}

int kv_gpu_pool_usage(kv_cache_t *kv, kv_gpu_pool_t *out) {
  kv_gpu_t *g = (kv_gpu_t *)kv;
  memset(out, 0, sizeof *out);
  if (!kv_gpu_is(kv))
    return qe_errf(QE_EINVAL, "kv_gpu: pool usage of a %s cache (not a GPU cache)",
                   kv ? kv->ops->name : "NULL");
  int rc = g->t ? kv_gpu__tier_usage(g, out) : 0; /* sets nothing on error */
  if (rc) return rc;
  if (!g->t) {
    out->units_total = g->n_pages;
    out->units_in_use = g->n_pages - g->n_free, out->units_peak = g->n_peak;
  }
  out->unit_bytes = g->page_bytes, out->arena_bytes = g->arena_bytes;
  return 0;
}

static int check_args(kern_backend_t *be, const kv_geom_t *ge, int omega, int max_tokens) {
  if (!be || be->ops->host_memory || !kern_cuda_stream(be))
    return qe_errf(QE_EINVAL, "kv_gpu: needs the CUDA backend");
  if (ge->n_layer < 1 || ge->n_kv_head < 1 || ge->max_seqs < 1 || max_tokens < 1)
    return qe_errf(QE_EINVAL, "kv_gpu: bad geometry or max_tokens %d", max_tokens);
  if (!kv_gpu_omega_ok(omega))
    return qe_errf(QE_EUNSUPPORTED,
                   "kv_gpu: the GPU cache takes windows of 4, 8 or a multiple of 16 tokens up to "
                   "1024 (--window; got %d)",
                   omega);
  if (ge->head_dim != 64 && ge->head_dim != 128)
    return qe_errf(QE_EUNSUPPORTED, "kv_gpu: head_dim must be 64 or 128 (got %d)", ge->head_dim);
  if (ge->n_head % ge->n_kv_head || ge->n_head / ge->n_kv_head > 8)
    return qe_errf(QE_EUNSUPPORTED, "kv_gpu: n_head / n_kv_head must be 1..8 (got %d/%d)",
                   ge->n_head, ge->n_kv_head);
  return 0;
}

static int alloc_host(kv_gpu_t *g) {
  const kv_geom_t *ge = &g->base.geom;
  g->free_pages = malloc(sizeof(int32_t) * (size_t)(g->n_pages ? g->n_pages : 1));
  g->seqs = calloc((size_t)ge->max_seqs, sizeof *g->seqs);
  g->segs = malloc(sizeof *g->segs * KVG_MAX_SEGS);
  g->h_seqwin = malloc(sizeof(int32_t) * 2 * (size_t)ge->max_seqs);
  g->h_idx = malloc(sizeof(int32_t) * (size_t)ge->max_seqs);
  g->work = malloc(sizeof *g->work * (size_t)ge->max_seqs);
  g->pin_cap = KVG_PIN_MIN;
  g->pin = kc_host_alloc(g->pin_cap);
  if (!g->free_pages || !g->seqs || !g->segs || !g->h_seqwin || !g->h_idx || !g->work || !g->pin)
    return qe_errf(QE_ENOMEM, "kv_gpu: out of host memory");
  for (int i = 0; i < g->n_pages; i++) g->free_pages[i] = g->n_pages - 1 - i;
  g->n_free = g->n_pages;
  return 0;
}

/* The window table and, when pool_bytes > 0, the FullKV arena. */
static int alloc_device(kv_gpu_t *g, size_t pool_bytes) {
  const kv_geom_t *ge = &g->base.geom;
  size_t tab = sizeof(kern_pwin_t) * (size_t)ge->n_layer * ge->max_seqs * g->max_win;
  g->arena = pool_bytes ? kern_alloc(g->base.be, pool_bytes) : NULL;
  g->arena_bytes = pool_bytes;
  g->tab = kern_alloc(g->base.be, tab);
  if ((pool_bytes && !g->arena) || !g->tab)
    return qe_errf(QE_ENOSPC, "kv_gpu: no device memory for a %zu-byte pool and %zu-byte table",
                   pool_bytes, tab);
  const int n_tk = ge->max_seqs > 1024 ? ge->max_seqs : 1024; /* eager rows, or a fixed bucket */
  int rc = kv_gpu__buf_need(g, &g->d_seqwin, sizeof(int32_t) * 2 * (size_t)ge->max_seqs);
  if (!rc) rc = kv_gpu__buf_need(g, &g->d_tk, sizeof(uint32_t) * (size_t)n_tk);
  return rc ? rc : kc_memset_async(g->d_tk.p, 0, g->d_tk.cap, g->stream);
}

int kv_gpu__init(kv_gpu_t *g, kern_backend_t *be, const kv_geom_t *geom, int omega, int max_tokens,
                 size_t pool_bytes, int tiered) {
  g->base = (kv_cache_t){tiered ? &kv_gpu_tiered_ops : &kv_gpu_ops, *geom, be};
  int rc = check_args(be, geom, omega, max_tokens);
  if (rc) return rc;
  g->omega = omega, g->row = geom->n_kv_head * geom->head_dim;
  g->max_win = (max_tokens + omega - 1) / omega;
  g->page_bytes = kv_gpu_page_bytes(geom, omega);
  g->n_pages = tiered ? 0 : (int)(pool_bytes / g->page_bytes);
  g->stream = kern_cuda_stream(be);
  static unsigned long caches; /* epochs of different caches never meet */
  g->fx_epoch = __atomic_add_fetch(&caches, 1, __ATOMIC_RELAXED) << 24;
  const char *dbg = getenv("QEVICT_KV_GPU_SYNC");
  g->debug = dbg && *dbg == '1';
  if (!(rc = alloc_host(g))) rc = alloc_device(g, pool_bytes);
  return rc;
}

int kv_gpu_create(kern_backend_t *be, const kv_geom_t *geom, int omega, int max_tokens,
                  size_t pool_bytes, kv_cache_t **out) {
  kv_gpu_t *g = calloc(1, sizeof *g);
  if (!g) return qe_errf(QE_ENOMEM, "kv_gpu: out of memory");
  int rc = kv_gpu__init(g, be, geom, omega, max_tokens, pool_bytes, 0);
  if (rc) {
    kv_gpu__dispose(g);
    return rc;
  }
  *out = &g->base;
  return 0;
}
