/* qe_json: JSON string escaping and id arrays for machine-readable CLI output. */
#include "qe_json.h"

#include <math.h>

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  size_t len = s[0] < 0x80         ? 1
               : (s[0] >> 5) == 6  ? 2
               : (s[0] >> 4) == 14 ? 3
               : (s[0] >> 3) == 30 ? 4
                                   : 0;
  if (!len || len > n) return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  return len;
}

void qe_json_str(FILE *f, const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  fputc('"', f);
  for (size_t i = 0; i < len;) {
    size_t n = utf8_len(u + i, len - i);
    if (!n) {
      fputs("\\ufffd", f);
      i++;
      continue;
    }
    unsigned char c = u[i];
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c == '\n')
      fputs("\\n", f);
    else if (c == '\t')
      fputs("\\t", f);
    else if (c == '\r')
      fputs("\\r", f);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fwrite(u + i, 1, n, f);
    i += n;
  }
  fputc('"', f);
}

void qe_json_ids(FILE *f, const int32_t *ids, size_t n) {
  fputc('[', f);
  for (size_t i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", ids[i]);
  fputc(']', f);
}

void qe_json_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fputs("null", f);
}
