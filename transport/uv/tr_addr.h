/* tr_addr: the addresses the transport listens on and connects to.
 *
 *   tcp://HOST:PORT  or  HOST:PORT   HOST: an IPv4 address, [IPv6], "localhost" (127.0.0.1)
 *                                    or "*" (0.0.0.0, listening only); PORT 0..65535 (0 when
 *                                    listening: the system picks one, see tr_server_address)
 *   unix:PATH        or  a PATH starting with '/' or "./"   a Unix-domain stream socket
 *
 * Host names other than "localhost" are not resolved (no DNS in the transport): give the
 * address. Pure functions, thread-safe. */
#ifndef QE_TR_ADDR_H
#define QE_TR_ADDR_H

#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

typedef struct tr_addr {
  int is_unix;
  struct sockaddr_storage sa;                             /* TCP: sockaddr_in or sockaddr_in6 */
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* Unix: the socket path */
} tr_addr_t;

/* Parses text into *a. QE_EINVAL with a detail naming what is wrong. */
int tr_addr_parse(const char *text, tr_addr_t *a);
/* Formats a as "tcp://1.2.3.4:5", "tcp://[::1]:5" or "unix:PATH" into buf (truncated to n). */
void tr_addr_format(const tr_addr_t *a, char *buf, size_t n);
/* Same for a socket address of either TCP family (as returned by getsockname). */
void tr_addr_format_sa(const struct sockaddr *sa, char *buf, size_t n);

#endif
