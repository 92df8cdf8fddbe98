/* qe_target: the ports of gRPC target strings, checked before gRPC sees them (it takes a port
 * past 65535 modulo 65536 and drops junk after one, reaching another port without a word). */
#ifndef QE_TARGET_H
#define QE_TARGET_H

/* 1 when every port written in target is digits in min_port..65535: host[:port], [v6][:port],
 * a bare IPv6 address (no port), dns:[//authority/]host[:port], and each address of an ipv4: or
 * ipv6: list; a target without a port, and other schemes (unix:, xds:, ...), are gRPC's. */
int qe_target_ports_ok(const char *target, int min_port);
/* 1 when addr is an address a server can listen on as gRPC reads it: qe_target_ports_ok's forms
 * with a port (0..65535) written in every address, or unix:, unix-abstract: or vsock:. */
int qe_listen_addr_ok(const char *addr);

#endif
