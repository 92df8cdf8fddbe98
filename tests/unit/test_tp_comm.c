/* test_tp_comm: the tensor-parallel collectives. The single-rank backend in process; the CPU
 * socket backend with T = 2, 3, 4 forked ranks joined both ways (pre-connected socketpairs and
 * a Unix socket path): all-reduce bitwise equal to the serial rank-order sum and identical on
 * every rank, broadcast from every root, all-gather order, a 64 MB all-reduce, and failures
 * (a peer that exits or stays silent, desynchronised calls, refused handshakes, nobody to
 * connect to) that must give QE_ECOMM within the timeout, never a hang. Each child exits
 * with 0 or 1 (its CHECK count); the parent collects them under a global alarm(). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qe_log.h"
#include "qe_status.h"
#include "test_util.h"
#include "tp_comm.h"

#define MAX_T   8
#define SLOW_MS 3000 /* a failure must be reported well within this */

enum { MODE_FDS, MODE_PATH };

typedef void (*rank_fn)(tp_comm_t *c, const void *arg);

/* One forked group: how it is joined, what each rank claims and expects, what it runs. */
typedef struct {
  const char *name;
  int mode, size;
  int swap12;            /* MODE_FDS: rank 0's links to ranks 1 and 2 swapped */
  int claim_size[MAX_T]; /* size each rank passes to create (0: the real size) */
  int create_rc[MAX_T];  /* expected create result per rank */
  int timeout_ms;        /* I/O timeout set after creation (0: default) */
  rank_fn fn;
  const void *arg;
} group_t;

static char g_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

static void new_path(void) {
  static int n;
  snprintf(g_path, sizeof g_path, "/tmp/qe_tp_test_%d_%d.sock", (int)getpid(), n++);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* What rank r contributes at index i of test salt: mixed signs and magnitudes, so the order of
 * summation shows in the bits. */
static float val(int r, size_t i, uint32_t salt) {
  static const float scale[] = {1e-3f, 1.0f, 3e2f, 7e4f, 1e-7f};
  uint64_t h = mix(((uint64_t)salt << 48) ^ ((uint64_t)r << 40) ^ i);
  float m = (float)((h >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
  return m * scale[(h >> 3) % 5];
}

static uint8_t byte_of(int r, size_t i, uint32_t salt) {
  return (uint8_t)mix(((uint64_t)salt << 48) ^ ((uint64_t)r << 40) ^ i);
}

static uint64_t fnv(const void *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
  return h;
}

/* ---- group runner -------------------------------------------------------------------- */

static int child_create(const group_t *g, int rank, int pairs[][2], tp_comm_t **c) {
  int size = g->claim_size[rank] ? g->claim_size[rank] : g->size;
  if (g->mode == MODE_PATH) return tp_comm_create_cpu(g_path, rank, size, 10000, c);
  int fds[MAX_T];
  for (int p = 0; p < MAX_T; p++) fds[p] = -1;
  for (int p = 1; p < g->size; p++) {
    int mine = rank == 0 ? pairs[p][0] : p == rank ? pairs[p][1] : -1;
    for (int e = 0; e < 2; e++)
      if (pairs[p][e] != mine) close(pairs[p][e]);
    if (rank == 0) fds[p] = mine;
    if (rank == p) fds[0] = mine;
  }
  if (rank == 0 && g->swap12) {
    int t = fds[1];
    fds[1] = fds[2];
    fds[2] = t;
  }
  return tp_comm_create_cpu_fds(fds, rank, size, c);
}

static void child_main(const group_t *g, int rank, int pairs[][2]) {
  tu_failures = 0;
  alarm(120);
  tp_comm_t *c = NULL;
  int rc = child_create(g, rank, pairs, &c);
  if (rc != g->create_rc[rank])
    fprintf(stderr, "[%s rank %d] create -> %d (%s), expected %d\n", g->name, rank, rc, qe_errmsg(),
            g->create_rc[rank]);
  CHECK(rc == g->create_rc[rank]);
  if (rc == 0 && g->create_rc[rank] == 0) {
    CHECK(c->rank == rank && c->size == g->size && strcmp(c->ops->name, "cpu") == 0);
    if (g->timeout_ms) CHECK_OK(tp_comm_cpu_set_timeout(c, g->timeout_ms));
    if (g->fn) g->fn(c, g->arg);
  }
  if (rc == 0) tp_comm_destroy(c);
  if (tu_failures) fprintf(stderr, "[%s rank %d] %d failure(s)\n", g->name, rank, tu_failures);
  exit(tu_failures ? 1 : 0);
}

/* Forks the group's ranks and waits for them; every rank must exit 0. */
static void run_group(const group_t *g) {
  int pairs[MAX_T][2];
  for (int p = 0; p < MAX_T; p++) pairs[p][0] = pairs[p][1] = -1;
  for (int p = 1; g->mode == MODE_FDS && p < g->size; p++)
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, pairs[p]) == 0);
  if (g->mode == MODE_PATH) new_path();
  fflush(NULL);
  pid_t pid[MAX_T];
  for (int r = 0; r < g->size; r++) {
    pid[r] = fork();
    CHECK(pid[r] >= 0);
    if (pid[r] == 0) child_main(g, r, pairs);
  }
  for (int p = 1; g->mode == MODE_FDS && p < g->size; p++) {
    close(pairs[p][0]);
    close(pairs[p][1]);
  }
  for (int r = 0; r < g->size; r++) {
    int st = 0;
    CHECK(pid[r] > 0 && waitpid(pid[r], &st, 0) == pid[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      fprintf(stderr, "%s (%s, T=%d): rank %d ended with status 0x%x\n", g->name,
              g->mode == MODE_FDS ? "fds" : "path", g->size, r, st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  unlink(g_path);
}

static void run_both(group_t g) {
  g.mode = MODE_FDS;
  run_group(&g);
  g.mode = MODE_PATH;
  run_group(&g);
}

/* ---- collectives that must work ---------------------------------------------------- */

/* All-reduce of n floats: bitwise the serial sum in rank order, the same on every rank. */
static void check_allreduce(tp_comm_t *c, size_t n, uint32_t salt) {
  int T = c->size;
  float *buf = malloc(n ? n * sizeof *buf : 1);
  CHECK(buf != NULL);
  for (size_t i = 0; i < n; i++) buf[i] = val(c->rank, i, salt);
  int64_t t0 = now_ms();
  CHECK_OK(tp_allreduce_sum(c, buf, n));
  if (c->rank == 0 && n >= (8u << 20))
    fprintf(stderr, "  allreduce of %zu MB over %d ranks: %lld ms\n", n * sizeof *buf >> 20, T,
            (long long)(now_ms() - t0));
  /* Each rank checks every T-th element against the serial sum; the hashes below show that
   * all ranks hold the same bits, so together every element is checked everywhere. */
  size_t bad = 0, order_shows = 0;
  for (size_t i = (size_t)c->rank; i < n; i += (size_t)T) {
    float s = val(0, i, salt), rev = val(T - 1, i, salt);
    for (int r = 1; r < T; r++) s += val(r, i, salt);
    bad += memcmp(&s, &buf[i], sizeof s) != 0;
    if (i >= 4096) continue;
    for (int r = T - 2; r >= 0; r--) rev += val(r, i, salt);
    order_shows += memcmp(&s, &rev, sizeof s) != 0;
  }
  CHECK(bad == 0);
  if (T >= 3 && n >= 1000) CHECK(order_shows > 0); /* the test can see a wrong order */
  uint64_t h = fnv(buf, n * sizeof *buf), all[MAX_T];
  CHECK_OK(tp_allgather(c, &h, all, sizeof h));
  for (int r = 0; r < T; r++) CHECK(all[r] == h);
  free(buf);
}

static void check_broadcast(tp_comm_t *c, size_t bytes, uint32_t salt) {
  uint8_t *buf = malloc(bytes ? bytes : 1);
  CHECK(buf != NULL);
  for (int root = 0; root < c->size; root++) {
    for (size_t i = 0; i < bytes; i++) buf[i] = byte_of(c->rank, i, salt + root);
    CHECK_OK(tp_broadcast(c, buf, bytes, root));
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++) bad += buf[i] != byte_of(root, i, salt + root);
    CHECK(bad == 0);
  }
  free(buf);
}

/* All-gather of `bytes` per rank, from a separate send buffer and in place. */
static void check_allgather(tp_comm_t *c, size_t bytes, uint32_t salt) {
  int T = c->size;
  uint8_t *send = malloc(bytes ? bytes : 1), *recv = malloc(bytes * T + 1);
  CHECK(send && recv);
  for (int in_place = 0; in_place < 2; in_place++) {
    memset(recv, 0xee, bytes * T);
    uint8_t *src = in_place ? recv + (size_t)c->rank * bytes : send;
    for (size_t i = 0; i < bytes; i++) src[i] = byte_of(c->rank, i, salt);
    CHECK_OK(tp_allgather(c, src, recv, bytes));
    size_t bad = 0;
    for (int r = 0; r < T; r++)
      for (size_t i = 0; i < bytes; i++) bad += recv[(size_t)r * bytes + i] != byte_of(r, i, salt);
    CHECK(bad == 0);
  }
  free(send);
  free(recv);
}

/* Many small calls of every kind in a row: sequence numbers and framing stay in step. */
static void check_mixed(tp_comm_t *c) {
  int T = c->size, r = c->rank;
  for (int it = 0; it < 300; it++) {
    if (it % 3 == 0) {
      float v[3] = {(float)(r + it), 1.0f, 0.5f * r};
      CHECK_OK(tp_allreduce_sum(c, v, 3));
      CHECK(v[0] == (float)(T * it + T * (T - 1) / 2) && v[1] == (float)T &&
            v[2] == 0.25f * T * (T - 1));
    } else if (it % 3 == 1) {
      int root = it % T, x = r == root ? it * 7 : -1;
      CHECK_OK(tp_broadcast(c, &x, sizeof x, root));
      CHECK(x == it * 7);
    } else {
      int me = r * 1000 + it, all[MAX_T];
      CHECK_OK(tp_allgather(c, &me, all, sizeof me));
      for (int p = 0; p < T; p++) CHECK(all[p] == p * 1000 + it);
    }
  }
}

static void rank_basic(tp_comm_t *c, const void *arg) {
  /* the largest sizes cross the 4 MB framing chunk */
  static const size_t floats[] = {0, 1, 7, 1000, (1u << 20) + 37};
  static const size_t bytes[] = {0, 1, 13, 4096, (4u << 20) + 3};
  for (size_t k = 0; k < sizeof floats / sizeof *floats; k++) check_allreduce(c, floats[k], 1 + k);
  for (size_t k = 0; k < sizeof bytes / sizeof *bytes; k++) check_broadcast(c, bytes[k], 20 + k);
  for (size_t k = 0; k < sizeof bytes / sizeof *bytes; k++) check_allgather(c, bytes[k], 40 + k);
  check_mixed(c);
  CHECK(c->size == 1 || !tp_capturable(c)); /* socket collectives cannot be recorded */
}

static void rank_large(tp_comm_t *c, const void *arg) {
  check_allreduce(c, (64u << 20) / sizeof(float), 99);
}

/* ---- failures ---------------------------------------------------------------------- */

/* Every call of this rank returns QE_ECOMM within SLOW_MS, and the next one at once. */
static void expect_comm_failure(tp_comm_t *c, int64_t t0) {
  float v[1000] = {0};
  int rc = tp_allreduce_sum(c, v, 1000);
  int64_t dt = now_ms() - t0;
  if (c->rank == 0 || rc != QE_ECOMM)
    fprintf(stderr, "  rank %d: rc %d after %lld ms: %s\n", c->rank, rc, (long long)dt,
            qe_errmsg());
  CHECK(rc == QE_ECOMM);
  CHECK(dt < SLOW_MS);
  CHECK(tp_broadcast(c, v, 4, 0) == QE_ECOMM);
  CHECK(strstr(qe_errmsg(), "broken") != NULL);
}

/* arg: the victim rank, which leaves right after joining. */
static void rank_early_exit(tp_comm_t *c, const void *arg) {
  if (c->rank == *(const int *)arg) return;
  expect_comm_failure(c, now_ms());
}

/* arg: the victim rank, alive but silent for longer than the others' timeout; by the time it
 * calls, the others have gone, so it fails too (promptly). */
static void rank_silent(tp_comm_t *c, const void *arg) {
  if (c->rank == *(const int *)arg) {
    usleep(2500 * 1000); /* 5x the others' timeout: they have given up, even on a loaded host */
    float v[4] = {0};
    int64_t t0 = now_ms();
    CHECK(tp_allreduce_sum(c, v, 4) == QE_ECOMM);
    CHECK(now_ms() - t0 < SLOW_MS);
    return;
  }
  int64_t t0 = now_ms();
  expect_comm_failure(c, t0);
  CHECK(now_ms() - t0 >= 400); /* it did wait for the silent rank (timeout 500 ms) */
}

/* Rank 1 asks for a different length: the group fails in that call. */
static void rank_desync_len(tp_comm_t *c, const void *arg) {
  float v[100] = {0};
  int rc = tp_allreduce_sum(c, v, c->rank == 1 ? 50 : 100);
  if (c->rank == 0) fprintf(stderr, "  rank 0: %s\n", qe_errmsg());
  CHECK(rc == QE_ECOMM);
}

/* The last rank calls all-gather while the others all-reduce. */
static void rank_desync_op(tp_comm_t *c, const void *arg) {
  float v[2] = {0}, all[2 * MAX_T];
  int rc = c->rank == c->size - 1 ? tp_allgather(c, v, all, sizeof v) : tp_allreduce_sum(c, v, 2);
  if (c->rank == 0) fprintf(stderr, "  rank 0: %s\n", qe_errmsg());
  CHECK(rc == QE_ECOMM);
}

/* Rank 1 believes the broadcast root is 1, the others 0: the first call may pass on some
 * ranks, the next one fails on all of them. */
static void rank_desync_root(tp_comm_t *c, const void *arg) {
  int x = 5;
  (void)tp_broadcast(c, &x, sizeof x, c->rank == 1 ? 1 : 0);
  float v[3] = {0};
  CHECK(tp_allreduce_sum(c, v, 3) == QE_ECOMM);
}

static void test_failures(void) {
  for (int T = 2; T <= 3; T++)
    for (int victim = 0; victim < T; victim++) {
      group_t g = {.name = "early exit",
                   .size = T,
                   .timeout_ms = 2000,
                   .fn = rank_early_exit,
                   .arg = &victim};
      run_both(g);
      g = (group_t){
          .name = "silent", .size = T, .timeout_ms = 500, .fn = rank_silent, .arg = &victim};
      run_both(g);
    }
  setenv("QEVICT_TP_TIMEOUT_MS", "500", 1); /* the default timeout, from the environment */
  int victim = 1;
  group_t g = {.name = "silent, env timeout", .size = 2, .fn = rank_silent, .arg = &victim};
  run_both(g);
  unsetenv("QEVICT_TP_TIMEOUT_MS");
  g = (group_t){.name = "desync len", .size = 3, .timeout_ms = 2000, .fn = rank_desync_len};
  run_both(g);
  g = (group_t){.name = "desync op", .size = 3, .timeout_ms = 2000, .fn = rank_desync_op};
  run_both(g);
  g = (group_t){.name = "desync root", .size = 3, .timeout_ms = 2000, .fn = rank_desync_root};
  run_both(g);
}

/* ---- handshakes ---------------------------------------------------------------------- */

static void test_bad_fds_handshakes(void) {
  group_t g = {.name = "swapped links",
               .mode = MODE_FDS,
               .size = 3,
               .swap12 = 1,
               .create_rc = {QE_ECOMM, QE_ECOMM, QE_ECOMM}};
  run_group(&g);
  g = (group_t){.name = "size mismatch",
                .mode = MODE_FDS,
                .size = 2,
                .claim_size = {0, 3},
                .create_rc = {QE_ECOMM, QE_ECOMM}};
  run_group(&g);
}

/* A raw client: connects, sends len bytes, then must see rank 0 answer and hang up. */
static void raw_client(const void *msg, size_t len) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, g_path, strlen(g_path) + 1);
  int fd = -1;
  for (int i = 0; i < 500 && fd < 0; i++) { /* rank 0 may not be listening yet */
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
      close(fd);
      fd = -1;
      usleep(10000);
    }
  }
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK(write(fd, msg, len) == (ssize_t)len);
  char buf[64];
  ssize_t r;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  do r = poll(&p, 1, 5000) == 1 ? read(fd, buf, sizeof buf) : -1;
  while (r > 0);
  CHECK(r == 0 || (r < 0 && errno == ECONNRESET)); /* closed by rank 0, not a timeout */
  close(fd);
}

static pid_t fork_fn(void (*fn)(const void *), const void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    tu_failures = 0;
    alarm(120);
    fn(arg);
    exit(tu_failures ? 1 : 0);
  }
  CHECK(pid > 0);
  return pid;
}

static void reap(pid_t pid, const char *what) {
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st)) fprintf(stderr, "%s: status 0x%x\n", what, st);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void path_rank0(const void *arg) {
  tp_comm_t *c;
  CHECK_OK(tp_comm_create_cpu(g_path, 0, 3, 20000, &c));
  check_allreduce(c, 1000, 7);
  tp_comm_destroy(c);
}

/* arg: {rank, size, pipe fd to report joining or -1, expected rc} */
static void path_peer(const void *arg) {
  const int *a = arg;
  tp_comm_t *c;
  int rc = tp_comm_create_cpu(g_path, a[0], a[1], 5000, &c);
  if (rc) fprintf(stderr, "  rank %d of %d: %s\n", a[0], a[1], qe_errmsg());
  CHECK(rc == a[3]);
  if (a[2] >= 0) CHECK(write(a[2], "j", 1) == 1);
  if (rc == 0) {
    check_allreduce(c, 1000, 7);
    tp_comm_destroy(c);
  }
}

static void garbage_client(const void *arg) { raw_client("not a tp_comm peer, just noise", 30); }

/* A hello as the wire carries it (magic, version, rank, size), with a rank out of range. */
static void rogue_client(const void *arg) {
  const uint32_t hello[4] = {0x54504551u, 1, (uint32_t) * (const int *)arg, 3};
  raw_client(hello, sizeof hello);
}

/* Rank 0 of 3 on a path sees, one by one: noise, a rank out of range, rank 0 again, a size
 * mismatch, the real rank 1, a duplicate rank 1, the real rank 2 — refuses the bad ones and
 * forms the group from the good ones. */
static void test_bad_path_handshakes(void) {
  new_path();
  int pfd[2];
  CHECK(pipe(pfd) == 0);
  pid_t r0 = fork_fn(path_rank0, NULL);
  int out_of_range = 7, zero = 0;
  int bad_size[4] = {1, 4, -1, QE_ECOMM}, one[4] = {1, 3, pfd[1], 0};
  int dup[4] = {1, 3, -1, QE_ECOMM}, two[4] = {2, 3, -1, 0};
  reap(fork_fn(garbage_client, NULL), "garbage client");
  reap(fork_fn(rogue_client, &out_of_range), "rank 7 client");
  reap(fork_fn(rogue_client, &zero), "rank 0 client");
  reap(fork_fn(path_peer, bad_size), "size-4 peer");
  pid_t r1 = fork_fn(path_peer, one);
  char ch = 0;
  struct pollfd p = {.fd = pfd[0], .events = POLLIN};
  CHECK(poll(&p, 1, 10000) == 1 && read(pfd[0], &ch, 1) == 1 && ch == 'j');
  reap(fork_fn(path_peer, dup), "duplicate rank 1");
  pid_t r2 = fork_fn(path_peer, two);
  reap(r0, "rank 0");
  reap(r1, "rank 1");
  reap(r2, "rank 2");
  close(pfd[0]);
  close(pfd[1]);
  unlink(g_path);
}

/* Nobody to talk to: both sides of tp_comm_create_cpu give up after their timeout. */
static void test_create_timeouts(void) {
  tp_comm_t *c = NULL;
  new_path();
  int64_t t0 = now_ms();
  CHECK(tp_comm_create_cpu(g_path, 0, 3, 300, &c) == QE_ECOMM);
  CHECK(now_ms() - t0 >= 250 && now_ms() - t0 < SLOW_MS);
  CHECK(access(g_path, F_OK) != 0); /* rank 0 removed its socket */
  t0 = now_ms();
  CHECK(tp_comm_create_cpu(g_path, 1, 3, 300, &c) == QE_ECOMM);
  CHECK(now_ms() - t0 >= 250 && now_ms() - t0 < SLOW_MS);
}

/* A rank alone past TP_WAIT_NOTE_MS (5 s) logs that it waits, and for what, before its timeout:
 * rank 0 with its peers' count and socket, a rank > 0 for rank 0's socket; each in a child whose
 * log goes to a file, both at once. */
static void wait_alone(const void *arg) {
  const int *a = arg; /* rank, log file descriptor */
  tp_comm_t *c = NULL;
  dup2(a[1], 2);
  qe_log_set_level(QE_LOG_WARN); /* (the default level) */
  CHECK(tp_comm_create_cpu(g_path, a[0], 3, 5600, &c) == QE_ECOMM);
}

static void check_wait_log(int fd, const char *want) {
  char buf[4096] = {0};
  CHECK(pread(fd, buf, sizeof buf - 1, 0) > 0);
  CHECK(strstr(buf, want) != NULL);
  if (!strstr(buf, want)) fprintf(stderr, "no '%s' in the log:\n%s\n", want, buf);
  CHECK(strstr(buf, g_path) != NULL && strstr(buf, "s left)") != NULL);
  close(fd);
}

static void test_wait_notes(void) {
  char f0[] = "/tmp/qe_tp_note_XXXXXX", f1[] = "/tmp/qe_tp_note_XXXXXX";
  int a0[2] = {0, mkstemp(f0)}, a1[2] = {1, mkstemp(f1)};
  CHECK(a0[1] >= 0 && a1[1] >= 0);
  unlink(f0), unlink(f1);
  new_path(); /* rank 0 listens here, rank 1 waits for another path */
  pid_t p0 = fork_fn(wait_alone, a0);
  char path0[sizeof g_path];
  memcpy(path0, g_path, sizeof g_path);
  new_path();
  pid_t p1 = fork_fn(wait_alone, a1);
  reap(p0, "rank 0 alone");
  reap(p1, "rank 1 alone");
  check_wait_log(a1[1], "tp: rank 1 of 3: waiting for rank 0 to listen on");
  memcpy(g_path, path0, sizeof g_path);
  check_wait_log(a0[1], "tp: rank 0: 0 of 2 peers joined on");
}

/* ---- single rank and arguments ------------------------------------------------------- */

static void check_size1(tp_comm_t *c) {
  float v[3] = {1.5f, -2.0f, 3.25f};
  int x = 42, y[4] = {0};
  CHECK(c->rank == 0 && c->size == 1);
  CHECK(tp_capturable(c)); /* one rank: nothing to record */
  CHECK_OK(tp_allreduce_sum(c, v, 3));
  CHECK(v[0] == 1.5f && v[1] == -2.0f && v[2] == 3.25f);
  CHECK_OK(tp_broadcast(c, &x, sizeof x, 0));
  CHECK(x == 42);
  CHECK_OK(tp_allgather(c, &x, y, sizeof x));
  CHECK(y[0] == 42 && y[1] == 0);
  CHECK_OK(tp_allgather(c, y, y, sizeof y)); /* in place */
  CHECK(y[0] == 42);
}

static void test_single_and_args(void) {
  tp_comm_t *c = NULL;
  CHECK_OK(tp_comm_create_single(&c));
  check_size1(c);
  CHECK(strcmp(c->ops->name, "single") == 0);
  CHECK(tp_comm_cpu_set_timeout(c, 1000) == QE_EINVAL);
  tp_comm_destroy(c);
  tp_comm_destroy(NULL);
  new_path();
  CHECK_OK(tp_comm_create_cpu(g_path, 0, 1, 1000, &c));
  check_size1(c);
  CHECK(c->ops->broadcast(c, &c, 1, 3) == QE_EINVAL);
  CHECK_OK(tp_comm_cpu_set_timeout(c, 1000));
  CHECK(tp_comm_cpu_set_timeout(c, 0) == QE_EINVAL);
  tp_comm_destroy(c);
  int fds[1] = {-1};
  CHECK_OK(tp_comm_create_cpu_fds(fds, 0, 1, &c));
  check_size1(c);
  tp_comm_destroy(c);
  CHECK(tp_comm_create_cpu(g_path, 2, 2, 1000, &c) == QE_EINVAL);
  CHECK(tp_comm_create_cpu(g_path, 0, 0, 1000, &c) == QE_EINVAL);
  CHECK(tp_comm_create_cpu(NULL, 0, 2, 1000, &c) == QE_EINVAL);
  CHECK(tp_comm_create_cpu(g_path, 0, 2, 0, &c) == QE_EINVAL);
  CHECK(tp_comm_create_cpu_fds(NULL, 1, 2, &c) == QE_EINVAL);
  int sp[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
  CHECK(tp_comm_create_cpu_fds(&sp[0], 1, 2, NULL) == QE_EINVAL);
  CHECK(fcntl(sp[0], F_GETFD) < 0); /* owned, so closed even on failure */
  close(sp[1]);
  char longp[200];
  memset(longp, 'x', sizeof longp - 1);
  longp[sizeof longp - 1] = '\0';
  CHECK(tp_comm_create_cpu(longp, 0, 2, 1000, &c) == QE_EINVAL);
  FILE *f = fopen(g_path, "w"); /* a regular file where the socket goes is left alone */
  CHECK(f != NULL);
  if (f) fclose(f);
  CHECK(tp_comm_create_cpu(g_path, 0, 2, 1000, &c) == QE_EINVAL);
  CHECK(access(g_path, F_OK) == 0);
  unlink(g_path);
}

int main(void) {
  alarm(600);
  test_single_and_args();
  for (int T = 2; T <= 4; T++) {
    group_t g = {.name = "basic", .size = T, .fn = rank_basic};
    run_both(g);
    g = (group_t){.name = "large", .size = T, .fn = rank_large};
    run_both(g);
  }
  test_failures();
  test_bad_fds_handshakes();
  test_bad_path_handshakes();
  test_create_timeouts();
  test_wait_notes();
  return tu_done("tp_comm");
}
