/* wrk: qevictd, one worker rank (DESIGN.md "Processes"): loads its shard of the model, owns its
 * KV pool, connects to the scheduler over the transport, and runs the engine loop: continuous
 * batching of the requests the scheduler starts, each with its own KV policy and budget, tokens
 * streamed back as they are sampled, periodic memory reports. Ranks of a TP group run in
 * lockstep (rank 0 drives, the others follow over the collective backend). */
#ifndef QE_WRK_H
#define QE_WRK_H

#include <stddef.h>

typedef struct {
  const char *model;     /* GGUF file (required) */
  const char *scheduler; /* transport address of qevict-sched (default "127.0.0.1:50052") */
  const char *group;     /* TP group name (default "g0") */
  const char *name;      /* for logs and metrics (default host:pid) */
  const char *tp_addr;   /* TP rendezvous: a Unix socket path rank 0 listens on (tp > 1) */
  int rank, tp;          /* position in the group (default 0 of 1) */
  int threads;           /* CPU threads (0: cores / tp) */
  int max_seqs;          /* concurrent sequences (default 64) */
  int max_batch;         /* tokens per forward pass (default 4096) */
  size_t pool_bytes;     /* KV bytes this rank may hold reserved (default 4 GiB on the CPU) */
  /* > 0: pool_bytes is instead this share (0..1] of the memory free once the model is loaded:
   * the device's on a GPU (where the share is the whole FullKV arena: the pool plus each slot's
   * partly filled windows), else qe_mem_available's figure (MemAvailable, or a memory cgroup's
   * room); the worker sets pool_bytes to it at its load (`--pool-bytes N%`). 0: pool_bytes as
   * given. < 0 (no --pool-bytes given, the default): WRK_GPU_POOL_SHARE on a GPU, else
   * pool_bytes (wrk_pool_share resolves it). */
  double pool_share;
  unsigned report_ms;  /* memory report interval (default 500) */
  unsigned timeout_ms; /* scheduler silent this long: reconnect (default 5000) */
  /* On the first SIGTERM, SIGINT or SIGHUP, rank 0 tells the scheduler it is stopping (no new
   * requests come to its group) and lets its running requests finish for up to this long; a
   * follower waits as long for rank 0 to end the group. A second signal, no scheduler link, or
   * nothing running: at once. 0: at once (default 30). */
  unsigned shutdown_grace_s;
  /* The engine thread silent this long (a step, or a follower's wait for rank 0, that does not
   * come back: a hung GPU or collective, a stopped peer rank): the worker exits with status
   * WRK_EXIT_RESTART for its supervisor to restart it. 0: never; negative (default): 300 s on a
   * GPU, never on the CPU (a long prompt's single pass there may take minutes). */
  int step_timeout_s;
  /* CUDA GPU of rank 0 of the group: rank r runs on GPU (device + r) mod the GPU count, with
   * the CUDA backend, KV caches on the GPU (wrk_cache.h) and NCCL between the ranks. -1
   * (default): the CPU backend. A device index at or past the count is QE_EINVAL; any device
   * in a build without CUDA is QE_EUNSUPPORTED (both from wrk_run). */
  int device;
  int cpu_weights; /* the CPU backend's weights (kern_cpu_create_ex): KERN_WEIGHT_F32 or _PACKED */
  /* The scheduler link over TLS when tls_ca is set: the CA bundle the scheduler's certificate
   * must chain to, this worker's client certificate chain and key (required with it: the
   * scheduler verifies workers), and the name the scheduler's certificate must carry (NULL:
   * the IP of a TCP scheduler address; a Unix socket address checks the chain only). Unusable
   * files are QE_EINVAL/QE_EIO/QE_EFORMAT from wrk_run, before the model loads. */
  const char *tls_ca, *tls_cert, *tls_key, *tls_server_name;
} wrk_config_t;

/* The exit status of a worker whose engine stopped after its start: silent past step_timeout_s,
 * or failed (a peer rank lost, a broken collective, a failed step): for its supervisor to
 * restart it (`qevict serve` never takes it for a failure to start). */
#define WRK_EXIT_RESTART 70

/* A GPU rank's pool when no --pool-bytes is given: this share of the device memory free once
 * the model is loaded, as its whole FullKV arena. 40% leaves room for a tiered policy's arena
 * beside it (each configuration in use holds one), the decode graphs and NCCL's buffers; vLLM's
 * default is 90% of the whole card for its one cache. */
#define WRK_GPU_POOL_SHARE 0.40

void wrk_config_init(wrk_config_t *c);

/* c's pool share once its device is known (wrk.h's pool_share): > 0 a share, 0 bytes. */
double wrk_pool_share(const wrk_config_t *c);

/* Runs the worker until SIGINT/SIGTERM/SIGHUP and its shutdown grace (0) or a fatal error: a
 * negative QE_E* with a detail before the engine started (model load, the device, the TP group's
 * join), WRK_EXIT_RESTART once its engine stopped on an error (logged: a broken TP group). A lost
 * scheduler connection cancels the running requests and reconnects. Installs signal handlers; once
 * per process. */
int wrk_run(const wrk_config_t *c);

#endif
