/* model_fp: a model file's fingerprint, so that the scheduler only takes workers that load the
 * weights it tokenizes for (see model.h). */
#include <stdio.h>
#include <stdlib.h>

#include "model.h"
#include "qe_sha256.h"
#include "qe_status.h"

int model_fingerprint(const char *path, char out[MODEL_FP_LEN + 1]) {
  FILE *f = fopen(path, "rb");
  if (!f) return qe_errf(QE_EIO, "%s: cannot open", path);
  qe_sha256_t c;
  qe_sha256_init(&c);
  unsigned char *buf = malloc(1 << 16);
  size_t total = 0, n;
  while (buf && total < ((size_t)4 << 20) && (n = fread(buf, 1, 1 << 16, f)) > 0) {
    qe_sha256_update(&c, buf, n);
    total += n;
  }
  long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  fclose(f);
  free(buf);
  if (!buf) return qe_errf(QE_ENOMEM, "fingerprint: out of memory");
  qe_sha256_update(&c, &size, sizeof size);
  uint8_t h[QE_SHA256_LEN];
  qe_sha256_final(&c, h);
  for (int i = 0; i < MODEL_FP_LEN / 2; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
  return 0;
}
