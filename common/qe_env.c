/* qe_env: see qe_env.h. */
#include "qe_env.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "qe_log.h"

/* 1 the first time name is warned about in this process (a knob read in two places warns once);
 * past 32 names, always. */
static int first_warning(const char *name) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static const char *seen[32];
  static int n;
  int first = 1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < n && first; i++) first = strcmp(seen[i], name) != 0;
  if (first && n < 32) seen[n++] = name;
  pthread_mutex_unlock(&mu);
  return first;
}

int qe_env_choice(const char *name, const char *const *vals, int n, int dflt) {
  QE_ASSERT(n > 0 && dflt >= 0 && dflt < n);
  const char *e = getenv(name);
  if (!e || !*e) return dflt;
  for (int i = 0; i < n; i++)
    if (!strcmp(e, vals[i])) return i;
  char want[160] = "";
  for (int i = 0; i < n; i++) {
    const size_t len = strlen(want);
    const char *sep = !i ? "" : i + 1 < n ? ", " : " or ";
    if (len + strlen(sep) + strlen(vals[i]) < sizeof want) strcat(strcat(want, sep), vals[i]);
  }
  if (first_warning(name))
    qe_log(QE_LOG_WARN, "%s='%s' ignored: %s is expected (using %s)", name, e, want, vals[dflt]);
  return dflt;
}

long qe_env_long(const char *name, long lo, long hi, long dflt) {
  const char *e = getenv(name);
  if (!e || !*e) return dflt;
  char *end = NULL;
  errno = 0;
  const long v = strtol(e, &end, 10);
  const int digit0 = (*e >= '0' && *e <= '9') || ((*e == '-' || *e == '+') && e[1] >= '0' &&
                                                  e[1] <= '9'); /* (strtol skips spaces) */
  if (digit0 && !errno && !*end && v >= lo && v <= hi) return v;
  if (!first_warning(name)) return dflt;
  if (dflt >= lo && dflt <= hi)
    qe_log(QE_LOG_WARN, "%s='%s' ignored: %ld..%ld is expected (using %ld)", name, e, lo, hi, dflt);
  else /* (a caller's "unset" marker, not a value) */
    qe_log(QE_LOG_WARN, "%s='%s' ignored: %ld..%ld is expected (using the default)", name, e, lo,
           hi);
  return dflt;
}
