/* tr_addr: parsing and formatting of transport addresses (see tr_addr.h). */
#include "tr_addr.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"

static int parse_unix(const char *path, tr_addr_t *a) {
  size_t n = strlen(path);
  if (n == 0) return qe_errf(QE_EINVAL, "transport: empty Unix socket path");
  if (n >= sizeof a->path)
    return qe_errf(QE_EINVAL, "transport: Unix socket path of %zu bytes (at most %zu)", n,
                   sizeof a->path - 1);
  a->is_unix = 1;
  memcpy(a->path, path, n + 1);
  return 0;
}

static int parse_port(const char *s, const char *text, unsigned *port) {
  char *end;
  unsigned long v;
  if (*s < '0' || *s > '9') return qe_errf(QE_EINVAL, "transport: no port in \"%s\"", text);
  v = strtoul(s, &end, 10);
  if (*end || v > 65535) return qe_errf(QE_EINVAL, "transport: bad port in \"%s\"", text);
  *port = (unsigned)v;
  return 0;
}

/* host is a NUL-terminated copy without brackets. */
static int parse_host(const char *host, int v6, unsigned port, const char *text, tr_addr_t *a) {
  struct sockaddr_in *s4 = (struct sockaddr_in *)&a->sa;
  struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&a->sa;
  if (v6) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons((uint16_t)port);
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) return 0;
    return qe_errf(QE_EINVAL, "transport: bad IPv6 address in \"%s\"", text);
  }
  if (!strcmp(host, "localhost")) host = "127.0.0.1";
  if (!strcmp(host, "*")) host = "0.0.0.0";
  s4->sin_family = AF_INET;
  s4->sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) return 0;
  return qe_errf(QE_EINVAL, "transport: \"%s\": the host must be an IP address or localhost", text);
}

static int parse_tcp(const char *hp, const char *text, tr_addr_t *a) {
  char host[64];
  const char *colon, *h = hp;
  size_t hl;
  unsigned port;
  int v6 = hp[0] == '[';
  int rc;
  if (v6) {
    const char *close = strchr(hp, ']');
    if (!close || close[1] != ':') return qe_errf(QE_EINVAL, "transport: bad address \"%s\"", text);
    h = hp + 1;
    colon = close + 1;
    hl = (size_t)(close - h);
  } else {
    colon = strrchr(hp, ':');
    if (!colon) return qe_errf(QE_EINVAL, "transport: \"%s\" has no :PORT", text);
    hl = (size_t)(colon - hp);
  }
  if (hl == 0 || hl >= sizeof host)
    return qe_errf(QE_EINVAL, "transport: bad host in \"%s\"", text);
  memcpy(host, h, hl);
  host[hl] = 0;
  if ((rc = parse_port(colon + 1, text, &port))) return rc;
  return parse_host(host, v6, port, text, a);
}

int tr_addr_parse(const char *text, tr_addr_t *a) {
  memset(a, 0, sizeof *a);
  if (!text || !*text) return qe_errf(QE_EINVAL, "transport: empty address");
  if (!strncmp(text, "unix:", 5)) return parse_unix(text + 5, a);
  if (text[0] == '/' || !strncmp(text, "./", 2)) return parse_unix(text, a);
  if (!strncmp(text, "tcp://", 6)) return parse_tcp(text + 6, text, a);
  return parse_tcp(text, text, a);
}

void tr_addr_format_sa(const struct sockaddr *sa, char *buf, size_t n) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof ip);
    snprintf(buf, n, "tcp://[%s]:%u", ip, (unsigned)ntohs(s6->sin6_port));
  } else {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof ip);
    snprintf(buf, n, "tcp://%s:%u", ip, (unsigned)ntohs(s4->sin_port));
  }
}

void tr_addr_format(const tr_addr_t *a, char *buf, size_t n) {
  if (a->is_unix)
    snprintf(buf, n, "unix:%s", a->path);
  else
    tr_addr_format_sa((const struct sockaddr *)&a->sa, buf, n);
}
