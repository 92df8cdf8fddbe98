/* sched_main: qevict-sched's lifecycle: configuration, the state directory and admin key, the
 * model's tokenizer, the servers (gRPC, metrics, workers) on one libuv loop, and the stop on a
 * signal. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qe_log.h"
#include "qe_status.h"
#include "qe_tls.h"
#include "sched_internal.h"

void sched_config_init(sched_config_t *c) {
  memset(c, 0, sizeof *c);
  c->listen = "127.0.0.1:50051";
  c->metrics_listen = "127.0.0.1:9464";
  c->worker_listen = "127.0.0.1:50052";
  c->max_message = (size_t)64 << 20;
  c->keep_finished_s = 600;
  c->max_queued = 10000;
  c->shutdown_grace_s = 30;
  c->worker_timeout_ms = 5000;
  c->max_resumes = 3;
}

static int read_key_file(const char *path, char key[SCHED_KEY_STRLEN + 1]) {
  FILE *f = fopen(path, "r");
  if (!f) return qe_errf(QE_EIO, "%s: cannot read the admin key", path);
  char buf[128] = "";
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
  if (n != SCHED_KEY_STRLEN)
    return qe_errf(QE_EINVAL, "%s: not an admin key (qk_ + 64 hex digits)", path);
  memcpy(key, buf, n + 1);
  return 0;
}

static int write_key_file(const char *path, const char *key) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return qe_errf(QE_EIO, "%s: cannot create (%s)", path, strerror(errno));
  size_t n = strlen(key);
  int ok = write(fd, key, n) == (ssize_t)n && write(fd, "\n", 1) == 1;
  close(fd);
  return ok ? 0 : qe_errf(QE_EIO, "%s: write failed", path);
}

/* Uses the admin key in the file, or issues one and writes it there. */
static int admin_key(sched_t *s) {
  char path[4096], key[SCHED_KEY_STRLEN + 1];
  if (s->cfg.admin_key_file)
    snprintf(path, sizeof path, "%s", s->cfg.admin_key_file);
  else
    snprintf(path, sizeof path, "%s/admin.key", s->cfg.state_dir);
  if (access(path, F_OK) == 0) {
    int rc = read_key_file(path, key);
    return rc ? rc : sched_tenants_set_admin_key(s->tenants, key, NULL);
  }
  int rc = sched_tenants_set_admin_key(s->tenants, NULL, key);
  if (!rc) rc = write_key_file(path, key);
  if (!rc) qe_log(QE_LOG_INFO, "sched: new admin key written to %s", path);
  return rc;
}

/* An exclusive lock on the state directory (its file "lock", held open for the process's
 * life): a second scheduler on the same directory would serve the same tenants with admission
 * of its own, each tenant's quota once per scheduler. */
static int lock_state(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/lock", dir);
  const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return qe_errf(QE_EIO, "%s: cannot open (%s)", path, strerror(errno));
  if (!flock(fd, LOCK_EX | LOCK_NB)) return 0; /* (fd stays open: the lock with it) */
  const int busy = errno == EWOULDBLOCK;
  close(fd);
  return busy ? qe_errf(QE_EIO, "--state-dir %s is in use by another scheduler", dir)
              : qe_errf(QE_EIO, "%s: cannot lock (%s)", path, strerror(errno));
}

static int open_state(sched_t *s) {
  if (!s->cfg.state_dir || !*s->cfg.state_dir) return qe_errf(QE_EINVAL, "--state-dir is required");
  if (mkdir(s->cfg.state_dir, 0700) && errno != EEXIST)
    return qe_errf(QE_EIO, "%s: cannot create (%s)", s->cfg.state_dir, strerror(errno));
  char path[4096];
  snprintf(path, sizeof path, "%s/tenants.db", s->cfg.state_dir);
  int rc = lock_state(s->cfg.state_dir);
  if (!rc) rc = sched_tenants_check_emptied(path);
  if (!rc) rc = sched_tenants_open(path, &s->tenants);
  if (!rc) rc = admin_key(s);
  return rc;
}

static int load_tenants(sched_t *s) {
  sched_tenant_t *all = NULL;
  size_t n = 0;
  int rc = sched_admit_create(0, sched_admit_event, s, &s->admit);
  if (!rc) rc = sched_tenants_list(s->tenants, &all, &n);
  for (size_t i = 0; i < n && !rc; i++)
    rc = sched_admit_set_tenant(s->admit, all[i].id, all[i].kv_quota_bytes);
  free(all);
  return rc;
}

/* The longest piece of t's vocabulary in bytes, at least 1 (sched_validate's bound on how much
 * text a long prompt's refusal tokenizes). */
static size_t max_piece(const tok_t *t) {
  size_t most = 1;
  for (int id = 0; id < tok_n_vocab(t); id++) {
    const char *p = tok_piece(t, id);
    const size_t n = p ? strlen(p) : 0;
    most = n > most ? n : most;
  }
  return most;
}

static int load_model(sched_t *s) {
  if (!s->cfg.model) return qe_errf(QE_EINVAL, "--model is required");
  int rc = gguf_open(s->cfg.model, &s->gguf);
  if (!rc) rc = model_read_hparams(s->gguf, &s->hp);
  if (!rc) rc = tok_create(s->gguf, &s->tok);
  if (!rc) s->chat_kind = chat_kind_of(s->gguf), s->max_piece = max_piece(s->tok);
  return rc;
}

static void stop_all(sched_t *s) {
  if (s->stopping) return;
  s->stopping = 1;
  s->unfinished = sched_req_live(s);
  qe_log(QE_LOG_INFO, "sched: stopping");
  sched_req_destroy_all(s);
  sched_rpc_stop(s);
  sched_export_stop(s);
  sched_groups_destroy(s);
  uv_close((uv_handle_t *)&s->sig_int, NULL);
  uv_close((uv_handle_t *)&s->sig_term, NULL);
  uv_close((uv_handle_t *)&s->sig_hup, NULL);
  uv_close((uv_handle_t *)&s->tick, NULL);
}

/* The first signal: the accepted requests may finish for shutdown_grace_s (sched_closing);
 * a second one, or none left to wait for, stops at once. */
static void on_signal(uv_signal_t *h, int sig) {
  sched_t *s = h->data;
  (void)sig;
  const int live = sched_req_live(s);
  if (s->closing || !s->cfg.shutdown_grace_s || !live || !sched_groups_up(s)) {
    stop_all(s);
    return;
  }
  s->closing = 1;
  s->close_deadline_us = sched_now_us() + (uint64_t)s->cfg.shutdown_grace_s * 1000000u;
  qe_log(QE_LOG_WARN,
         "sched: stopping: %d accepted request(s) may finish for up to %u s, no new "
         "ones (a second signal stops at once)",
         live, s->cfg.shutdown_grace_s);
  sched_health_changed(s);
}

/* --ready-file before the start: a stale one (an earlier run's) removed, and the path tried
 * for writing, so that one that cannot be written fails now instead of never appearing. */
static int ready_preflight(const char *path) {
  if (!path) return 0;
  if (unlink(path) && errno != ENOENT)
    return qe_errf(QE_EIO, "--ready-file %s: cannot remove the old one (%s)", path,
                   strerror(errno));
  FILE *f = fopen(path, "w");
  if (!f) return qe_errf(QE_EIO, "--ready-file %s: cannot write (%s)", path, strerror(errno));
  fclose(f);
  unlink(path);
  return 0;
}

static void on_tick(uv_timer_t *t) {
  sched_t *s = t->data;
  const int live = s->closing ? sched_req_live(s) : 0;
  if (s->closing && (!live || !sched_groups_up(s) || sched_now_us() >= s->close_deadline_us)) {
    stop_all(s);
    return;
  }
  if (s->ready_written || !s->cfg.ready_file || !sched_groups_up(s)) return;
  FILE *f = fopen(s->cfg.ready_file, "w");
  const int bad = !f || fprintf(f, "ready\n") < 0;
  if ((f && fclose(f)) || bad)
    qe_log(QE_LOG_ERROR, "sched: --ready-file %s: cannot write (%s)", s->cfg.ready_file,
           strerror(errno));
  s->ready_written = 1;
}

static int start(sched_t *s) {
  int rc = ready_preflight(s->cfg.ready_file);
  if (!rc) rc = open_state(s);
  if (!rc) rc = load_tenants(s);
  if (!rc) rc = load_model(s);
  if (!rc) rc = sched_export_start(s);
  if (!rc) rc = sched_groups_listen(s);
  if (!rc) rc = sched_rpc_start(s);
  if (rc) return rc;
  uv_signal_init(s->loop, &s->sig_int);
  uv_signal_init(s->loop, &s->sig_term);
  uv_signal_init(s->loop, &s->sig_hup);
  uv_timer_init(s->loop, &s->tick);
  s->sig_int.data = s->sig_term.data = s->sig_hup.data = s->tick.data = s;
  uv_signal_start(&s->sig_int, on_signal, SIGINT);
  uv_signal_start(&s->sig_term, on_signal, SIGTERM);
  uv_signal_start(&s->sig_hup, on_signal, SIGHUP); /* (no reload: an orderly stop) */
  uv_timer_start(&s->tick, on_tick, 100, 100);
  char mport[32] = "";
  if (s->http) snprintf(mport, sizeof mport, " (port %d)", sh_server_port(s->http));
  /* (at any log level: the ports, which a listen address of port 0 leaves to the system) */
  fprintf(stderr, "qevict sched: gRPC on %s (port %d)%s, workers on %s%s, metrics on %s%s%s\n",
          s->cfg.listen, sgrpc_server_port(s->grpc), s->cfg.tls_cert ? " over TLS" : "",
          tr_server_address(s->workers), s->worker_tls ? " over mutual TLS" : "",
          s->http ? s->cfg.metrics_listen : "(off)", mport,
          s->http && s->cfg.metrics_tls ? " over TLS" : "");
  return 0;
}

static void cleanup(sched_t *s) {
  if (s->ready_written) unlink(s->cfg.ready_file); /* (not ready once stopped) */
  qe_tls_ctx_destroy(s->worker_tls);               /* (its connections are gone with the loop) */
  sched_admit_destroy(s->admit);
  sched_tenants_close(s->tenants);
  tok_destroy(s->tok);
  gguf_close(s->gguf);
}

int sched_run(const sched_config_t *c) {
  signal(SIGPIPE, SIG_IGN); /* a peer gone mid-write (a metrics scraper, a worker) is EPIPE */
  sched_t s;
  memset(&s, 0, sizeof s);
  s.cfg = *c;
  uv_loop_t loop;
  if (uv_loop_init(&loop)) return qe_errf(QE_EIO, "uv_loop_init failed");
  s.loop = &loop;
  s.next_id = (uint64_t)sched_unix_ms() * 1000u;
  int rc = start(&s);
  if (rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", qe_errmsg());
    if (s.grpc || s.http || s.workers || s.metrics) {
      s.stopping = 0;
      sched_rpc_stop(&s);
      sched_export_stop(&s);
      sched_groups_destroy(&s);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    cleanup(&s);
    return qe_errf(rc, "%s", msg);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  cleanup(&s);
  if (s.unfinished)
    qe_log(QE_LOG_WARN, "sched: stopped with %d accepted request(s) unfinished: exit status %d",
           s.unfinished, SCHED_EXIT_UNFINISHED);
  return s.unfinished ? SCHED_EXIT_UNFINISHED : 0;
}
