/* qe_target: see qe_target.h. */
#include "qe_target.h"

#include <stdlib.h>
#include <string.h>

/* Whether the n bytes at a are digits and dots alone (an IPv4 address, or no name). */
static int ipv4_literal(const char *a, size_t n) { return strspn(a, "0123456789.") >= n; }

/* One address of n bytes: a host (not empty) and a port of digits in min_port..65535, or (name:
 * a client's) a host name alone, which gRPC's resolver gives port 443; an IP address alone
 * it dialed at port 0, and a bare IPv6 address's port cannot be told. */
static int addr_port_ok(const char *a, size_t n, int min_port, int name) {
  const char *end = a + n, *c = NULL;
  if (n && a[0] == '[') { /* [v6]:port */
    const char *rb = memchr(a, ']', n);
    if (!rb || rb == a + 1 || rb + 1 == end || rb[1] != ':') return 0;
    c = rb + 1;
  } else {
    c = memchr(a, ':', n);
    if (!c) return name && n && !ipv4_literal(a, n);
    if (c == a || memchr(c + 1, ':', (size_t)(end - c - 1))) return 0;
  }
  size_t d = 0;
  while (c + 1 + d < end && c[1 + d] >= '0' && c[1 + d] <= '9') d++;
  return d && d <= 5 && c + 1 + d == end && atol(c + 1) >= min_port && atol(c + 1) <= 65535;
}

/* 1 when target starts with one of gRPC's schemes that take no port (listen: those a server can
 * listen on) followed by something ("unix://", an absolute path's prefix, is nothing); *known is
 * set when it starts with one at all. */
static int scheme_ok(const char *t, int listen, int *known) {
  static const char *const server[] = {"unix:", "unix-abstract:", "vsock:", NULL};
  static const char *const client[] = {
      "unix:", "unix-abstract:", "vsock:", "xds:", "google-c2p:", NULL};
  for (const char *const *s = listen ? server : client; *s; s++) {
    const size_t n = strlen(*s);
    if (!strncmp(t, *s, n)) return *known = 1, t[n] != '\0' && strcmp(t, "unix://");
  }
  return *known = 0, 0;
}

static int ports_ok(const char *target, int min_port, int listen) {
  const char *t = target;
  int list = 0, known;
  if (!strncmp(t, "dns:", 4)) {
    t += 4;
    if (!strncmp(t, "//", 2)) t = strchr(t + 2, '/') ? strchr(t + 2, '/') + 1 : t + 2;
  } else if (!strncmp(t, "ipv4:", 5) || !strncmp(t, "ipv6:", 5)) {
    t += 5, list = 1;
  } else {
    const int ok = scheme_ok(t, listen, &known);
    if (known) return ok;
  }
  for (;;) {
    const size_t n = list ? strcspn(t, ",") : strlen(t);
    if (!addr_port_ok(t, n, min_port, !listen)) return 0;
    if (!list || !t[n]) return 1;
    t += n + 1;
  }
}

int qe_target_ports_ok(const char *target, int min_port) { return ports_ok(target, min_port, 0); }

int qe_listen_addr_ok(const char *addr) { return ports_ok(addr, 0, 1); }
