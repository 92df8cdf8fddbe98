/* sched_util: clocks and UTF-8 checking for the scheduler. */
#include <stddef.h>
#include <stdint.h>
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
