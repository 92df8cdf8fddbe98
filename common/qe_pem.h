/* qe_pem: reading PEM files (TLS certificates, keys and CA bundles) for the gRPC server and
 * client: the whole file as a NUL-terminated string, with the checks that turn a wrong path
 * or a wrong file into one clear line. Does not parse the certificates (gRPC's TLS library does
 * that when a port is bound or a connection made). */
#ifndef QE_PEM_H
#define QE_PEM_H

/* Largest PEM file read (a long CA bundle fits). */
#define QE_PEM_MAX (1 << 20)

/* Reads path into *out (malloc'd, NUL-terminated; caller frees). `what` names the file in the
 * error detail ("--tls-cert"). The file must be readable, at most QE_PEM_MAX bytes, free of NUL
 * bytes and hold a "-----BEGIN <label>" line whose label contains `label` ("CERTIFICATE",
 * "PRIVATE KEY": matches "RSA PRIVATE KEY" and "EC PRIVATE KEY" too). Returns 0, QE_EIO
 * (unreadable), QE_EFORMAT (empty, too large or no such PEM block) or QE_ENOMEM. */
int qe_read_pem(const char *path, const char *what, const char *label, char **out);

/* The same checks without keeping the contents: 0 or qe_read_pem's errors. */
int qe_check_pem(const char *path, const char *what, const char *label);

#endif
