/* kern_cpu_pool: a small blocking thread pool for the CPU backend's parallel loops. The calling
 * thread takes part in every job. Between jobs, and while the caller waits for a job's end, a
 * thread first spins for a bounded time (QE_CPU_SPIN_US microseconds, default 100; 0 never
 * spins), then sleeps on a condition variable: a decode step runs hundreds of short jobs, and a
 * sleeping worker takes tens of microseconds to wake, while a worker that spun forever would
 * steal the cores of a busy or small machine. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "kern_cpu_internal.h"
#include "qe_env.h"
#include "qe_log.h"

struct kern_cpu_pool {
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  pthread_t *threads;
  int n_threads;          /* workers, excluding the caller */
  atomic_uint generation; /* bumped per job (under mu) */
  atomic_int pending;     /* workers still running the current job */
  atomic_int quit;
  long spin_ns; /* how long a thread spins before it sleeps */
  kern_cpu_task_fn fn;
  void *ctx;
  int n_tasks;
};

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Spins until done(p) or spin_ns have passed; returns done(p). */
static int spin_until(kern_cpu_pool_t *p, int (*done)(kern_cpu_pool_t *, unsigned), unsigned arg) {
  if (p->spin_ns <= 0) return done(p, arg);
  long end = now_ns() + p->spin_ns;
  for (int i = 0;; i++) {
    if (done(p, arg)) return 1;
    if ((i & 63) == 63 && now_ns() > end) return 0;
    cpu_relax();
  }
}

static int new_job(kern_cpu_pool_t *p, unsigned seen) {
  return atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
         atomic_load(&p->quit);
}

static int job_done(kern_cpu_pool_t *p, unsigned unused) {
  (void)unused;
  return atomic_load_explicit(&p->pending, memory_order_acquire) == 0;
}

/* Worker w runs tasks w+1, w+1+T, ... of the job (the caller runs task 0, T, ...). */
static void run_share(kern_cpu_pool_t *p, int slot) {
  int stride = p->n_threads + 1;
  for (int t = slot; t < p->n_tasks; t += stride) p->fn(p->ctx, t);
}

static void *worker_main(void *arg) {
  kern_cpu_pool_t *p = arg;
  pthread_mutex_lock(&p->mu);
  int slot = atomic_fetch_add(&p->pending, 1) + 1; /* startup registration: 1..n_threads */
  unsigned seen = atomic_load(&p->generation);
  if (slot == p->n_threads) pthread_cond_signal(&p->done);
  pthread_mutex_unlock(&p->mu);
  for (;;) {
    if (!spin_until(p, new_job, seen)) {
      pthread_mutex_lock(&p->mu);
      while (!new_job(p, seen)) pthread_cond_wait(&p->wake, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->quit)) break;
    seen = atomic_load(&p->generation);
    run_share(p, slot);
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->mu);
    }
  }
  return NULL;
}

/* The spin time: QE_CPU_SPIN_US microseconds (0 .. 1000000), default 100; another value is
 * ignored with a warning. */
static long spin_setting(void) { return qe_env_long("QE_CPU_SPIN_US", 0, 1000000, 100) * 1000; }

kern_cpu_pool_t *kern_cpu_pool_create(int n_threads) {
  kern_cpu_pool_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  p->spin_ns = spin_setting();
  p->threads = calloc((size_t)(n_threads > 1 ? n_threads : 1), sizeof *p->threads);
  pthread_mutex_lock(&p->mu); /* the workers register under mu once n_threads is final */
  for (int i = 0; p->threads && i < n_threads - 1; i++) /* handles packed: a failure leaves none */
    if (!pthread_create(&p->threads[p->n_threads], NULL, worker_main, p)) p->n_threads++;
  while (atomic_load(&p->pending) < p->n_threads) pthread_cond_wait(&p->done, &p->mu);
  atomic_store(&p->pending, 0);
  pthread_mutex_unlock(&p->mu);
  return p;
}

void kern_cpu_pool_run(kern_cpu_pool_t *p, kern_cpu_task_fn fn, void *ctx, int n_tasks) {
  if (!p || !p->n_threads || n_tasks <= 1) {
    for (int t = 0; t < n_tasks; t++) fn(ctx, t);
    return;
  }
  p->fn = fn, p->ctx = ctx, p->n_tasks = n_tasks;
  atomic_store(&p->pending, p->n_threads);
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  run_share(p, 0);
  if (spin_until(p, job_done, 0)) return;
  pthread_mutex_lock(&p->mu);
  while (!job_done(p, 0)) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void kern_cpu_pool_destroy(kern_cpu_pool_t *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->quit, 1);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  free(p->threads);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  free(p);
}
