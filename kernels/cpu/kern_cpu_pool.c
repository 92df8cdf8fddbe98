/* kern_cpu_pool: a small blocking thread pool for the CPU backend's parallel loops. Workers
 * sleep on a condition variable between jobs (no spinning: on a busy or small machine spinning
 * workers steal the cores the job needs). The calling thread takes part in every job. */
#include <pthread.h>
#include <stdlib.h>

#include "kern_cpu_internal.h"

struct kern_cpu_pool {
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  pthread_t *threads;
  int n_threads;       /* workers, excluding the caller */
  unsigned generation; /* bumped per job */
  int pending;         /* workers still running the current job */
  int quit;
  kern_cpu_task_fn fn;
  void *ctx;
  int n_tasks;
};

/* Worker w runs tasks w+1, w+1+T, ... of the job (the caller runs task 0, T, ...). */
static void run_share(kern_cpu_pool_t *p, int slot) {
  int stride = p->n_threads + 1;
  for (int t = slot; t < p->n_tasks; t += stride) p->fn(p->ctx, t);
}

static void *worker_main(void *arg) {
  kern_cpu_pool_t *p = arg;
  pthread_mutex_lock(&p->mu);
  int slot = ++p->pending; /* startup registration: 1..n_threads */
  unsigned seen = p->generation;
  if (p->pending == p->n_threads) pthread_cond_signal(&p->done);
  for (;;) {
    while (p->generation == seen && !p->quit) pthread_cond_wait(&p->wake, &p->mu);
    if (p->quit) break;
    seen = p->generation;
    pthread_mutex_unlock(&p->mu);
    run_share(p, slot);
    pthread_mutex_lock(&p->mu);
    if (--p->pending == 0) pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

kern_cpu_pool_t *kern_cpu_pool_create(int n_threads) {
  kern_cpu_pool_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  p->threads = calloc((size_t)(n_threads > 1 ? n_threads : 1), sizeof *p->threads);
  for (int i = 0; p->threads && i < n_threads - 1; i++)
    if (!pthread_create(&p->threads[i], NULL, worker_main, p)) p->n_threads++;
  pthread_mutex_lock(&p->mu);
  while (p->pending < p->n_threads) pthread_cond_wait(&p->done, &p->mu);
  p->pending = 0;
  pthread_mutex_unlock(&p->mu);
  return p;
}

void kern_cpu_pool_run(kern_cpu_pool_t *p, kern_cpu_task_fn fn, void *ctx, int n_tasks) {
  if (!p || !p->n_threads || n_tasks <= 1) {
    for (int t = 0; t < n_tasks; t++) fn(ctx, t);
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->fn = fn, p->ctx = ctx, p->n_tasks = n_tasks;
  p->pending = p->n_threads;
  p->generation++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  run_share(p, 0);
  pthread_mutex_lock(&p->mu);
  while (p->pending) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void kern_cpu_pool_destroy(kern_cpu_pool_t *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->quit = 1;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  free(p->threads);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  free(p);
}
