/* test_qe_env: the environment's knobs (common/qe_env.h): values taken, values refused (the
 * default, and one warning a knob however often it is read), unset and empty ones. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qe_env.h"
#include "test_util.h"

static const char *const KNOB = "QE_TEST_KNOB";

static int choice(const char *v) {
  static const char *const vals[] = {"fused", "gemm", "ref"};
  if (v)
    setenv(KNOB, v, 1);
  else
    unsetenv(KNOB);
  return qe_env_choice(KNOB, vals, 3, 1);
}

static long num(const char *v) {
  if (v)
    setenv(KNOB, v, 1);
  else
    unsetenv(KNOB);
  return qe_env_long(KNOB, -3, 1000, 7);
}

/* The warnings written to stderr while f runs (through a temporary file). */
static int warnings_during(void (*f)(void)) {
  char path[] = "/tmp/qe_env_XXXXXX";
  const int fd = mkstemp(path), saved = dup(2);
  if (fd < 0 || saved < 0) return -1;
  dup2(fd, 2);
  f();
  dup2(saved, 2);
  close(saved), close(fd);
  size_t n = 0;
  char *s = tu_read_file(path, &n);
  unlink(path);
  int count = 0;
  for (const char *p = s; p && (p = strstr(p, "ignored")); p++) count++;
  free(s);
  return count;
}

static void refused_three_times(void) {
  for (int i = 0; i < 3; i++) CHECK(qe_env_long("QE_TEST_ONCE", 0, 9, 4) == 4);
}

int main(void) {
  CHECK(choice(NULL) == 1);
  CHECK(choice("") == 1);
  CHECK(choice("fused") == 0);
  CHECK(choice("ref") == 2);
  CHECK(choice("REF") == 1); /* exact match only */
  CHECK(choice("gemm ") == 1);
  CHECK(choice("refx") == 1);
  CHECK(num(NULL) == 7);
  CHECK(num("") == 7);
  CHECK(num("0") == 0);
  CHECK(num("-3") == -3);
  CHECK(num("1000") == 1000);
  CHECK(num("1001") == 7);
  CHECK(num("-4") == 7);
  CHECK(num("12abc") == 7);
  CHECK(num("abc") == 7);
  CHECK(num(" 5") == 7); /* a blank first is refused, as a choice's trailing blank is */
  CHECK(num("+5") == 5);
  CHECK(num("-") == 7);
  CHECK(num("99999999999999999999999") == 7);
  setenv("QE_TEST_ONCE", "x", 1);
  CHECK(warnings_during(refused_three_times) == 1);
  return tu_done("qe_env");
}
