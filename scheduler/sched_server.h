/* sched: qevict-sched, the process clients talk to (DESIGN.md "Processes"): the gRPC API
 * (qevict.v1.Generation, qevict.v1.Admin, grpc.health.v1.Health), tokenization, tenants and
 * keys (SQLite), admission (sched_admit), dispatch to TP groups of workers over the transport,
 * streaming with per-stream flow control, cancellation, resumption of a lost worker's requests,
 * and Prometheus metrics over HTTP. */
#ifndef QE_SCHED_SERVER_H
#define QE_SCHED_SERVER_H

#include <stddef.h>

typedef struct {
  const char *model;          /* GGUF file: tokenizer, chat template, hyperparameters */
  const char *listen;         /* gRPC address (default "127.0.0.1:50051") */
  const char *metrics_listen; /* HTTP /metrics and /healthz (default "127.0.0.1:9464"); "" off */
  const char *worker_listen;  /* transport address workers connect to (default "127.0.0.1:50052") */
  const char *state_dir;      /* tenants.db lives here (created 0700 if missing); required */
  const char *admin_key_file; /* read the admin key from it, or write a new one there if it
                               * does not exist (default STATE_DIR/admin.key) */
  size_t max_message;         /* gRPC message size limit both ways (default 64 MiB) */
  unsigned keep_finished_s;   /* finished requests stay visible to Watch/GetRequest (600) */
  unsigned max_queued;        /* a tenant's accepted, unfinished requests at most (10000; 0: no
                               * bound); past it Generate and Submit are RESOURCE_EXHAUSTED */
  unsigned worker_timeout_ms; /* a silent worker is down after this long (5000) */
  unsigned max_resumes;       /* a request whose group fails while it runs (not the group's own
                               * stop) is resumed this many times at most, then ends with an
                               * error (3; 0: never resumed) */
  unsigned shutdown_grace_s;  /* on SIGTERM, SIGINT or SIGHUP, accepted requests may finish for
                               * this long (30; 0: none): no new ones, health NOT_SERVING */
  const char *ready_file;     /* written ("ready\n") once at least one group is up, if set */
  const char *tls_cert;       /* PEM certificate chain: the gRPC port speaks TLS only (with key) */
  const char *tls_key;        /* PEM private key of tls_cert */
  const char *tls_client_ca;  /* PEM CA bundle: clients must present a certificate it verifies */
  int metrics_tls;            /* /metrics and /healthz over TLS too, with the same three files */
  /* The worker link over TLS (all three, or none): the scheduler's certificate chain and key
   * on worker_listen, and the CA bundle every worker's client certificate must chain to. */
  const char *worker_tls_cert, *worker_tls_key, *worker_tls_ca;
} sched_config_t;

/* Fills the defaults. */
void sched_config_init(sched_config_t *c);

/* Runs the scheduler until SIGINT, SIGTERM or SIGHUP, then lets the accepted requests finish
 * for up to shutdown_grace_s while it takes no new ones (a second signal, or no worker group
 * left up, ends the wait); what is left then ends with UNAVAILABLE and workers are
 * disconnected. Returns 0 after a clean stop, SCHED_EXIT_UNFINISHED after a stop that left
 * accepted requests unfinished (the grace's end, a second signal, no worker group up), or a
 * negative QE_E* when it could not start (detail in qe_errmsg: bad address, unreadable model,
 * state directory...). Installs signal handlers; call it once per process. */
int sched_run(const sched_config_t *c);

/* sched_run's status, and qevict sched's exit status, after a stop with accepted requests
 * unfinished (EX_TEMPFAIL: they ended UNAVAILABLE, and their clients may retry them). */
#define SCHED_EXIT_UNFINISHED 75

#endif
