/* qe_target: see qe_target.h. */
#include "qe_target.h"

#include <stdlib.h>
#include <string.h>

/* One address of n bytes: its port, where it has one (need: it must), is digits in
 * min_port..65535. */
static int addr_port_ok(const char *a, size_t n, int min_port, int need) {
  const char *end = a + n, *c = NULL;
  if (n && a[0] == '[') { /* [v6] or [v6]:port */
    const char *rb = memchr(a, ']', n);
    if (!rb) return 0;
    if (rb + 1 == end) return !need;
    if (rb[1] != ':') return 0;
    c = rb + 1;
  } else {
    const char *first = memchr(a, ':', n);
    if (!first) return !need;                                            /* host alone */
    if (memchr(first + 1, ':', (size_t)(end - first - 1))) return !need; /* a bare IPv6 address */
    c = first;
  }
  size_t d = 0;
  while (c + 1 + d < end && c[1 + d] >= '0' && c[1 + d] <= '9') d++;
  return d && d <= 5 && c + 1 + d == end && atol(c + 1) >= min_port && atol(c + 1) <= 65535;
}

static int ports_ok(const char *target, int min_port, int need) {
  const char *t = target;
  int list = 0;
  if (!strncmp(t, "dns:", 4)) {
    t += 4;
    if (!strncmp(t, "//", 2)) t = strchr(t + 2, '/') ? strchr(t + 2, '/') + 1 : t + 2;
  } else if (!strncmp(t, "ipv4:", 5) || !strncmp(t, "ipv6:", 5)) {
    t += 5, list = 1;
  } else if (need) { /* a server listens on host:port or one of these */
    if (!strncmp(t, "unix:", 5) || !strncmp(t, "unix-abstract:", 14) || !strncmp(t, "vsock:", 6))
      return 1;
  } else { /* another of gRPC's schemes (a name before ':' that is not one is a host) */
    static const char *const schemes[] = {
        "unix:", "unix-abstract:", "vsock:", "xds:", "google-c2p:"};
    for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++)
      if (!strncmp(t, schemes[i], strlen(schemes[i]))) return 1;
  }
  for (;;) {
    const size_t n = list ? strcspn(t, ",") : strlen(t);
    if (!addr_port_ok(t, n, min_port, need)) return 0;
    if (!list || !t[n]) return 1;
    t += n + 1;
  }
}

int qe_target_ports_ok(const char *target, int min_port) { return ports_ok(target, min_port, 0); }

int qe_listen_addr_ok(const char *addr) { return ports_ok(addr, 0, 1); }
