/* qe_pem: see qe_pem.h. */
#include "qe_pem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qe_status.h"

/* 1 if s has a line "-----BEGIN ...label...-----". */
static int has_block(const char *s, const char *label) {
  for (const char *b = strstr(s, "-----BEGIN "); b; b = strstr(b + 1, "-----BEGIN ")) {
    const char *end = strstr(b + 11, "-----"), *nl = strchr(b, '\n');
    if (!end || (nl && nl < end)) continue;
    size_t n = (size_t)(end - (b + 11)), k = strlen(label);
    for (size_t i = 0; i + k <= n; i++)
      if (!memcmp(b + 11 + i, label, k)) return 1;
  }
  return 0;
}

static int read_all(FILE *f, const char *path, const char *what, char **out) {
  char *buf = malloc(QE_PEM_MAX + 1);
  if (!buf) return QE_ENOMEM;
  size_t n = fread(buf, 1, QE_PEM_MAX + 1, f);
  int err = ferror(f) ? errno : 0;
  if (err || n > QE_PEM_MAX || !n || memchr(buf, 0, n)) {
    free(buf);
    if (err) return qe_errf(QE_EIO, "%s '%s': %s", what, path, strerror(err));
    return qe_errf(QE_EFORMAT, "%s '%s': %s", what, path,
                   !n               ? "the file is empty"
                   : n > QE_PEM_MAX ? "larger than 1 MiB"
                                    : "not PEM text");
  }
  buf[n] = '\0';
  *out = buf;
  return 0;
}

int qe_read_pem(const char *path, const char *what, const char *label, char **out) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return qe_errf(QE_EIO, "%s '%s': %s", what, path, strerror(errno));
  char *buf = NULL;
  int rc = read_all(f, path, what, &buf);
  fclose(f);
  if (rc) return rc;
  if (!has_block(buf, label)) {
    free(buf);
    return qe_errf(QE_EFORMAT, "%s '%s': no PEM %s block (-----BEGIN ...%s-----)", what, path,
                   label, label);
  }
  *out = buf;
  return 0;
}

int qe_check_pem(const char *path, const char *what, const char *label) {
  char *pem = NULL;
  int rc = qe_read_pem(path, what, label, &pem);
  if (pem) explicit_bzero(pem, strlen(pem)); /* (it may be a private key) */
  free(pem);
  return rc;
}
