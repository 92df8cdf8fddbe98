/* tr_frame: the wire format of the scheduler<->worker transport, with no I/O in it, so that it
 * can be unit-tested and fuzzed on its own (the libuv connections are in tr_conn.h).
 *
 * A frame is a 4-byte little-endian payload length N, then N bytes: one serialized
 * qevict.worker.v1.Envelope (proto/worker.proto). N is at most the receiver's maximum frame
 * size; a larger declared N is refused as soon as its 4 bytes arrive, before any allocation.
 * A payload that does not parse, that decodes to far more memory than its size (see
 * tr_frame_decode), whose Envelope has no message set, or that carries a field this build
 * does not know (both ends speak the same protocol version) is refused too. Every refusal is an
 * error value with a one-line detail (qe_errmsg), never a crash.
 *
 * Everything here is reentrant; a tr_decoder_t is used by one thread at a time. */
#ifndef QE_TR_FRAME_H
#define QE_TR_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "worker.pb-c.h"

/* Hello.protocol_version / HelloAck.protocol_version of this build; peers must match. */
#define TR_PROTOCOL_VERSION 1u
#define TR_FRAME_HEADER     4u
/* Default maximum payload bytes of one frame (16 MiB), and the largest a header can say. */
#define TR_FRAME_MAX_DEFAULT ((size_t)16 << 20)
#define TR_FRAME_MAX_LIMIT   ((size_t)UINT32_MAX)
/* Maximum payload before the handshake completes (a Hello or HelloAck is small). */
#define TR_FRAME_MAX_HELLO ((size_t)64 << 10)

typedef Qevict__Worker__V1__Envelope tr_env_t;

/* Incremental decoder: bytes in, in chunks of any size, Envelopes out. Owns a buffer for the
 * frame in progress (grown as its bytes arrive, at most the declared length). After an error
 * it stays failed and returns that error to every later call. */
typedef struct tr_decoder {
  size_t max_frame; /* payload limit */
  uint8_t hdr[4];   /* length bytes received so far */
  unsigned hdr_len; /* 0..4 */
  uint32_t len;     /* payload length of the frame in progress (valid when hdr_len == 4) */
  uint8_t *buf;     /* [cap] payload bytes of the frame in progress */
  size_t cap, have; /* allocated, received */
  int err;          /* 0, or the error that failed the decoder */
} tr_decoder_t;

/* max_frame: payload limit (0: TR_FRAME_MAX_DEFAULT; clamped to TR_FRAME_MAX_LIMIT). */
void tr_decoder_init(tr_decoder_t *d, size_t max_frame);
/* Frees the buffer. The decoder may be initialised again afterwards. */
void tr_decoder_dispose(tr_decoder_t *d);
/* Changes the payload limit; applies from the next frame header on. */
void tr_decoder_set_max(tr_decoder_t *d, size_t max_frame);

/* Consumes bytes of data[0..n) until one frame completes or the bytes run out; *used says
 * how many were consumed (the caller feeds the rest again). Returns 1 with *out set to a
 * decoded Envelope (the caller frees it with tr_env_free), 0 when every byte was consumed
 * and the frame in progress needs more, or a negative code, the decoder then failed:
 * QE_ERANGE (declared length above the maximum), QE_EFORMAT (payload not a valid Envelope),
 * QE_ENOMEM. A complete frame within data is decoded in place, without a copy. */
int tr_decoder_feed(tr_decoder_t *d, const uint8_t *data, size_t n, size_t *used, tr_env_t **out);

/* Bytes of an incomplete frame held (header included); 0 at a frame boundary. A stream that
 * ends while this is not 0 ended mid-frame. */
size_t tr_decoder_pending(const tr_decoder_t *d);

/* Decodes one payload (no header). Its allocations are capped at 8 bytes per payload byte
 * plus 64 KiB: a small frame cannot make the receiver allocate much more than it sent.
 * 0 with *out (free with tr_env_free), or QE_EFORMAT / QE_ENOMEM with a detail. */
int tr_frame_decode(const uint8_t *payload, size_t len, tr_env_t **out);

/* Payload bytes of m once packed (header not included). */
size_t tr_frame_payload_size(const tr_env_t *m);
/* Writes header + payload into dst, which holds TR_FRAME_HEADER + tr_frame_payload_size(m)
 * bytes; returns the bytes written. m must have a message set. */
size_t tr_frame_pack(const tr_env_t *m, uint8_t *dst);
/* A malloc'd frame (header + payload) in *out, its size in *len. QE_EINVAL when m has no
 * message set, QE_ERANGE when the payload exceeds max_frame (0: the default), QE_ENOMEM. */
int tr_frame_encode(const tr_env_t *m, size_t max_frame, uint8_t **out, size_t *len);

/* Frees a decoded Envelope (NULL-safe). */
void tr_env_free(tr_env_t *m);
/* Field name of the message an Envelope carries ("hello", "token_batch", ...), for logs;
 * "none" when unset. Static storage. */
const char *tr_env_name(const tr_env_t *m);

#endif
