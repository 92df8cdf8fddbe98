/* qe_target: the ports of gRPC target strings, checked before gRPC sees them (it takes a port
 * past 65535 modulo 65536 and drops junk after one, reaching another port without a word). */
#ifndef QE_TARGET_H
#define QE_TARGET_H

/* 1 when target is host:port, [v6]:port, dns:[//authority/]host:port, or an ipv4: or ipv6: list
 * of such addresses, each port digits in min_port..65535 and each host written, or a host name
 * alone (gRPC's resolver gives it port 443; it dialed an IP address alone at port 0, and cannot
 * tell a bare IPv6 address's port), or unix:PATH, unix-abstract:NAME, vsock:CID:PORT, xds:... or
 * google-c2p:... with something after the scheme (gRPC's own). */
int qe_target_ports_ok(const char *target, int min_port);
/* 1 when addr is an address a server can listen on as gRPC reads it: qe_target_ports_ok's
 * address forms (ports 0..65535), or unix:PATH, unix-abstract:NAME or vsock:CID:PORT, each
 * non-empty. */
int qe_listen_addr_ok(const char *addr);

#endif
