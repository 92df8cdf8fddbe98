/* sched_util: clocks, UTF-8 checking and the wire's NUL bytes for the scheduler. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "sched_internal.h"

uint64_t sched_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int64_t sched_unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Length of the UTF-8 sequence starting at s[0..n), 0 if invalid (overlong, surrogate, > U+10FFFF).
 */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  if (s[0] < 0x80) return 1;
  size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
  if (!len || len > n || s[0] > 0xf4) return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (len == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return 0;
  if (len == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return 0;
  return len;
}

int sched_utf8_valid(const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq(s + i, n - i);
    if (!k) return 0;
    i += k;
  }
  return 1;
}

void sched_utf8_clean(char *str) {
  unsigned char *s = (unsigned char *)str;
  const size_t n = strlen(str);
  for (size_t i = 0; i < n;) {
    const size_t k = utf8_seq(s + i, n - i);
    if (!k) s[i] = '?';
    i += k ? k : 1;
  }
}

/* A varint at *p, which moves past it; -1 when it runs past end. */
static int pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; *p < end && shift < 64; shift += 7) {
    const uint8_t c = *(*p)++;
    *v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) return 0;
  }
  return -1;
}

/* Field f's name in path at at, with its index when repeated (seen [64]: the elements of each
 * of the message's first 64 fields met so far at this level; a later field is named alone). */
static void pb_name(const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f,
                    unsigned *seen, char *path, size_t cap, size_t at) {
  const size_t fi = (size_t)(f - d->fields);
  const char *dot = at ? "." : "";
  if (f->label == PROTOBUF_C_LABEL_REPEATED && fi < 64)
    snprintf(path + at, cap - at, "%s%s[%u]", dot, f->name, seen[fi]++);
  else
    snprintf(path + at, cap - at, "%s%s", dot, f->name);
}

/* One level of sched_pb_nul_string: 1 with path set when a string field below holds a NUL. */
static int pb_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
                  char *path, size_t cap, int depth) {
  const size_t at = strlen(path);
  unsigned seen[64] = {0};
  uint64_t tag, len;
  while (p < end && !pb_varint(&p, end, &tag)) {
    const int wt = (int)(tag & 7);
    if (wt == 0 && pb_varint(&p, end, &len)) return 0;
    if (wt == 1 || wt == 5) p += wt == 1 ? 8 : 4;
    if (wt != 2) {
      if (wt != 0 && wt != 1 && wt != 5) return 0; /* (groups: not in our messages) */
      continue;
    }
    if (pb_varint(&p, end, &len) || len > (uint64_t)(end - p)) return 0;
    const ProtobufCFieldDescriptor *f =
        tag >> 3 <= 0xffffffffu ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3))
                                : NULL;
    if (f) pb_name(d, f, seen, path, cap, at);
    if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)len)) return 1;
    if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 16 &&
        pb_nul(f->descriptor, p, p + len, path, cap, depth + 1))
      return 1;
    path[at] = '\0';
    p += len;
  }
  return 0;
}

int sched_pb_nul_string(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t n, char *path,
                        size_t cap) {
  if (!cap) return 0;
  path[0] = '\0';
  return pb_nul(d, b, b + n, path, cap, 0);
}
