/* tr_frame: length-prefixed Envelope frames: the incremental decoder, bounded payload
 * decoding and packing (see tr_frame.h). */
#include "tr_frame.h"

#include <stdlib.h>
#include <string.h>

#include "qe_status.h"

#define TR__GROW_MIN      ((size_t)64 << 10) /* first buffer of a frame split across reads */
#define TR__KEEP_MAX      ((size_t)1 << 20)  /* larger buffers are freed after their frame */
#define TR__DECODE_FACTOR 8                  /* allocation cap: bytes per payload byte ... */
#define TR__DECODE_SLACK  ((size_t)64 << 10) /* ... plus this */

/* ---- bounded decoding --------------------------------------------------------------------- */

/* A protobuf-c allocator that refuses to hand out more than `limit` bytes in total. */
typedef struct {
  size_t used, limit;
  int over;
} tr__budget_t;

static void *budget_alloc(void *ud, size_t size) {
  tr__budget_t *b = ud;
  if (size > b->limit - b->used) {
    b->over = 1;
    return NULL;
  }
  b->used += size;
  return malloc(size);
}

static void budget_free(void *ud, void *p) { free(p); }

/* The first message within m (m included) that carries fields this build does not know, or
 * NULL. Both ends of a connection speak the same protocol version, so an unknown field is
 * garbage; refusing it also keeps every accepted Envelope re-packable as it was read. The
 * schema has no recursive message, so the depth is bounded. */
static const ProtobufCMessage *find_unknown(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  const char *base = (const char *)m;
  if (m->n_unknown_fields) return m;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const ProtobufCMessage *hit = NULL;
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
      for (size_t k = 0; k < n && !hit; k++) hit = v[k] ? find_unknown(v[k]) : NULL;
    } else if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ||
               *(const uint32_t *)(base + f->quantifier_offset) == f->id) {
      const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
      hit = sub ? find_unknown(sub) : NULL;
    }
    if (hit) return hit;
  }
  return NULL;
}

/* 0, or QE_EFORMAT (m freed) for an Envelope with no message or with unknown fields. */
static int check_env(tr_env_t *m, size_t len) {
  const ProtobufCMessage *u = find_unknown(&m->base);
  int rc = 0;
  if (m->msg_case == QEVICT__WORKER__V1__ENVELOPE__MSG__NOT_SET)
    rc = qe_errf(QE_EFORMAT, "transport: frame of %zu bytes carries no known message", len);
  else if (u)
    rc = qe_errf(QE_EFORMAT, "transport: frame of %zu bytes: unknown field %u in %s", len,
                 (unsigned)u->unknown_fields[0].tag, u->descriptor->name);
  if (rc) tr_env_free(m);
  return rc;
}

int tr_frame_decode(const uint8_t *payload, size_t len, tr_env_t **out) {
  size_t limit = len > (SIZE_MAX - TR__DECODE_SLACK) / TR__DECODE_FACTOR
                     ? SIZE_MAX
                     : len * TR__DECODE_FACTOR + TR__DECODE_SLACK;
  tr__budget_t b = {0, limit, 0};
  ProtobufCAllocator a = {budget_alloc, budget_free, &b};
  tr_env_t *m = qevict__worker__v1__envelope__unpack(&a, len, payload);
  int rc;
  *out = NULL;
  if (!m && b.over)
    return qe_errf(QE_EFORMAT, "transport: frame of %zu bytes decodes to more than %zu bytes", len,
                   limit);
  if (!m) return qe_errf(QE_EFORMAT, "transport: frame of %zu bytes is not a valid Envelope", len);
  if ((rc = check_env(m, len))) return rc;
  *out = m;
  return 0;
}

void tr_env_free(tr_env_t *m) {
  /* budget_alloc took its memory from malloc, so the default allocator frees it */
  if (m) qevict__worker__v1__envelope__free_unpacked(m, NULL);
}

const char *tr_env_name(const tr_env_t *m) {
  const ProtobufCFieldDescriptor *f;
  if (!m || m->msg_case == QEVICT__WORKER__V1__ENVELOPE__MSG__NOT_SET) return "none";
  f = protobuf_c_message_descriptor_get_field(&qevict__worker__v1__envelope__descriptor,
                                              (unsigned)m->msg_case);
  return f ? f->name : "unknown";
}

/* ---- packing ------------------------------------------------------------------------------ */

size_t tr_frame_payload_size(const tr_env_t *m) {
  return qevict__worker__v1__envelope__get_packed_size(m);
}

size_t tr_frame_pack(const tr_env_t *m, uint8_t *dst) {
  size_t n = qevict__worker__v1__envelope__pack(m, dst + TR_FRAME_HEADER);
  uint32_t len = (uint32_t)n;
  dst[0] = (uint8_t)len;
  dst[1] = (uint8_t)(len >> 8);
  dst[2] = (uint8_t)(len >> 16);
  dst[3] = (uint8_t)(len >> 24);
  return TR_FRAME_HEADER + n;
}

static size_t clamp_max(size_t max_frame) {
  if (!max_frame) return TR_FRAME_MAX_DEFAULT;
  return max_frame > TR_FRAME_MAX_LIMIT ? TR_FRAME_MAX_LIMIT : max_frame;
}

int tr_frame_encode(const tr_env_t *m, size_t max_frame, uint8_t **out, size_t *len) {
  size_t body, max = clamp_max(max_frame);
  *out = NULL;
  *len = 0;
  if (m->msg_case == QEVICT__WORKER__V1__ENVELOPE__MSG__NOT_SET)
    return qe_errf(QE_EINVAL, "transport: Envelope has no message set");
  body = tr_frame_payload_size(m);
  if (body > max)
    return qe_errf(QE_ERANGE, "transport: %s frame of %zu bytes exceeds the maximum %zu",
                   tr_env_name(m), body, max);
  *out = malloc(TR_FRAME_HEADER + body);
  if (!*out) return qe_errf(QE_ENOMEM, "transport: frame of %zu bytes", body);
  *len = tr_frame_pack(m, *out);
  return 0;
}

/* ---- incremental decoder ------------------------------------------------------------------ */

void tr_decoder_init(tr_decoder_t *d, size_t max_frame) {
  memset(d, 0, sizeof *d);
  d->max_frame = clamp_max(max_frame);
}

void tr_decoder_dispose(tr_decoder_t *d) {
  free(d->buf);
  d->buf = NULL;
  d->cap = d->have = 0;
}

void tr_decoder_set_max(tr_decoder_t *d, size_t max_frame) { d->max_frame = clamp_max(max_frame); }

size_t tr_decoder_pending(const tr_decoder_t *d) { return d->hdr_len + d->have; }

static int fail(tr_decoder_t *d, int rc) {
  d->err = rc;
  tr_decoder_dispose(d);
  return rc;
}

/* The 4 header bytes are in: take the declared length, refusing one above the maximum. */
static int start_frame(tr_decoder_t *d) {
  d->len = (uint32_t)d->hdr[0] | (uint32_t)d->hdr[1] << 8 | (uint32_t)d->hdr[2] << 16 |
           (uint32_t)d->hdr[3] << 24;
  d->have = 0;
  if (d->len > d->max_frame)
    return fail(d, qe_errf(QE_ERANGE, "transport: frame of %u bytes exceeds the maximum %zu",
                           (unsigned)d->len, d->max_frame));
  return 0;
}

/* Ready for the next frame; a large buffer is not kept. */
static void end_frame(tr_decoder_t *d) {
  d->hdr_len = 0;
  d->have = 0;
  if (d->cap > TR__KEEP_MAX) tr_decoder_dispose(d);
}

/* Decodes a complete payload; 1 with *out, or the failure. */
static int finish_frame(tr_decoder_t *d, const uint8_t *payload, tr_env_t **out) {
  int rc = tr_frame_decode(payload, d->len, out);
  if (rc) return fail(d, rc);
  end_frame(d);
  return 1;
}

/* Room for `want` more payload bytes: grows geometrically, never past the declared length. */
static int reserve(tr_decoder_t *d, size_t want) {
  size_t need = d->have + want, cap;
  uint8_t *p;
  if (need <= d->cap) return 0;
  cap = d->cap * 2 > TR__GROW_MIN ? d->cap * 2 : TR__GROW_MIN;
  if (cap < need) cap = need;
  if (cap > d->len) cap = d->len;
  p = realloc(d->buf, cap);
  if (!p) return fail(d, qe_errf(QE_ENOMEM, "transport: frame buffer of %zu bytes", cap));
  d->buf = p;
  d->cap = cap;
  return 0;
}

/* Copies header bytes; returns how many were taken. */
static size_t take_header(tr_decoder_t *d, const uint8_t *p, size_t n) {
  size_t k = 4 - d->hdr_len < n ? 4 - d->hdr_len : n;
  if (k == 0) return 0;
  memcpy(d->hdr + d->hdr_len, p, k);
  d->hdr_len += (unsigned)k;
  return k;
}

/* Payload phase of a frame whose header is complete: decodes in place when the whole payload
 * is in data[0..n) and nothing is buffered, else buffers what there is. Same returns as feed. */
static int feed_payload(tr_decoder_t *d, const uint8_t *data, size_t n, size_t *used,
                        tr_env_t **out) {
  size_t k = d->len - d->have < n ? d->len - d->have : n;
  int rc;
  if (d->have == 0 && n >= d->len) { /* no copy */
    *used = d->len;
    return finish_frame(d, data, out);
  }
  *used = 0;
  if (k == 0) return 0;
  if ((rc = reserve(d, k))) return rc;
  memcpy(d->buf + d->have, data, k);
  d->have += k;
  *used = k;
  return d->have == d->len ? finish_frame(d, d->buf, out) : 0;
}

int tr_decoder_feed(tr_decoder_t *d, const uint8_t *data, size_t n, size_t *used, tr_env_t **out) {
  size_t off = 0, k = 0;
  int rc = 0;
  *out = NULL;
  *used = 0;
  if (d->err) return d->err;
  if (!n) data = (const uint8_t *)""; /* no arithmetic on a NULL pointer */
  if (d->hdr_len < 4) {
    off = take_header(d, data, n);
    if (d->hdr_len == 4) rc = start_frame(d);
  }
  if (!rc && d->hdr_len == 4) rc = feed_payload(d, data + off, n - off, &k, out);
  *used = off + k;
  return rc;
}
