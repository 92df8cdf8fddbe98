/* qe_json: minimal JSON writing helpers for CLI output (escaping strings, arrays of ids).
 * Writes to a FILE*; not thread-safe per stream. */
#ifndef QE_JSON_H
#define QE_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Writes s (len bytes, UTF-8) as a quoted JSON string; invalid bytes become \ufffd. */
void qe_json_str(FILE *f, const char *s, size_t len);
/* Writes a number (%.6g), or null when it is not finite. */
void qe_json_num(FILE *f, double v);
/* Writes [a, b, ...]. */
void qe_json_ids(FILE *f, const int32_t *ids, size_t n);

#endif
