/* fuzz_frame: libFuzzer harness for the transport's frame decoder (transport/uv/tr_frame.h).
 * Input: one control byte, then a byte stream as a peer would send it. The control byte picks
 * the frame limit (the handshake's 64 KiB or 1 MiB) and seeds the chunk sizes the stream is
 * fed in (1 byte up to all of it), as reads from a socket would split it. Every Envelope that
 * comes out must pack again and decode to the same bytes; every error must fail the decoder
 * for good and leave nothing allocated. Any memory error trips ASan; broken invariants trap.
 * Build and run: see tests/fuzz/meson.build. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"
#include "tr_frame.h"

#define FUZZ_REQUIRE(e)                                                                            \
  do {                                                                                             \
    if (!(e)) __builtin_trap();                                                                    \
  } while (0)

/* m packs to bytes that decode (without the allocation cap) and pack to the same bytes. */
static void check_roundtrip(const tr_env_t *m) {
  size_t n = tr_frame_payload_size(m);
  uint8_t *a = malloc(TR_FRAME_HEADER + n), *b;
  tr_env_t *again;
  FUZZ_REQUIRE(a && tr_frame_pack(m, a) == TR_FRAME_HEADER + n);
  again = qevict__worker__v1__envelope__unpack(NULL, n, a + TR_FRAME_HEADER);
  FUZZ_REQUIRE(again && again->msg_case == m->msg_case);
  FUZZ_REQUIRE(tr_frame_payload_size(again) == n);
  b = malloc(TR_FRAME_HEADER + n);
  FUZZ_REQUIRE(b && tr_frame_pack(again, b) == TR_FRAME_HEADER + n);
  FUZZ_REQUIRE(memcmp(a, b, TR_FRAME_HEADER + n) == 0);
  FUZZ_REQUIRE(strcmp(tr_env_name(m), "none") != 0);
  tr_env_free(again);
  free(a);
  free(b);
}

static size_t next_chunk(uint32_t *st, size_t left) {
  *st = *st * 1103515245u + 12345u;
  uint32_t r = *st >> 8;
  size_t n = (r & 7) == 0 ? left : (r & 1) ? 1 + (r >> 4) % 7 : 1 + (r >> 4) % 4096;
  return n < left ? n : left;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tr_decoder_t d;
  uint32_t st;
  size_t off = 1;
  if (size < 1) return 0;
  st = data[0];
  tr_decoder_init(&d, (data[0] & 0x80) ? TR_FRAME_MAX_HELLO : (size_t)1 << 20);
  while (off < size) {
    size_t n = next_chunk(&st, size - off), used;
    while (n) {
      tr_env_t *m;
      int rc = tr_decoder_feed(&d, data + off, n, &used, &m);
      FUZZ_REQUIRE(used <= n);
      off += used, n -= used;
      if (rc < 0) { /* failed for good, nothing held */
        FUZZ_REQUIRE(rc == QE_ERANGE || rc == QE_EFORMAT);
        FUZZ_REQUIRE(d.buf == NULL && tr_decoder_feed(&d, data, size, &used, &m) == rc);
        tr_decoder_dispose(&d);
        return 0;
      }
      FUZZ_REQUIRE(rc == 1 || n == 0); /* 0: everything consumed */
      if (rc == 1) {
        check_roundtrip(m);
        tr_env_free(m);
      }
      if (rc == 0) break;
    }
  }
  FUZZ_REQUIRE(tr_decoder_pending(&d) <= size);
  tr_decoder_dispose(&d);
  return 0;
}
