/* parallel.c: parallel_for on pthreads with an atomic task counter. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "error.h"
#include "parallel.h"

typedef struct {
    int64_t n;
    parallel_task task;
    void *ctx;
    atomic_llong next;
    atomic_int stop;
    pthread_mutex_t lock;
    int64_t failed_task;
    int failed_status;
    char message[2048]; /* of the failed task */
} loop_state;

typedef struct {
    loop_state *loop;
    int thread;
} worker_arg;

static void *worker(void *arg)
{
    worker_arg *w = arg;
    loop_state *s = w->loop;
    while (!atomic_load(&s->stop)) {
        int64_t i = atomic_fetch_add(&s->next, 1);
        if (i >= s->n) break;
        int status = s->task(s->ctx, i, w->thread);
        if (status) {
            pthread_mutex_lock(&s->lock);
            if (s->failed_task < 0 || i < s->failed_task) {
                s->failed_task = i;
                s->failed_status = status;
                snprintf(s->message, sizeof s->message, "%s", tp_errmsg());
            }
            pthread_mutex_unlock(&s->lock);
            atomic_store(&s->stop, 1);
        }
    }
    return NULL;
}

int parallel_for(int64_t n, int threads, parallel_task task, void *ctx)
{
    if (n <= 0) return TP_OK;
    if (threads < 1) threads = 1;
    if (threads > n) threads = (int)n;
    loop_state s = {.n = n, .task = task, .ctx = ctx, .failed_task = -1, .failed_status = TP_OK};
    atomic_init(&s.next, 0);
    atomic_init(&s.stop, 0);
    pthread_mutex_init(&s.lock, NULL);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    worker_arg *args = calloc((size_t)threads, sizeof *args);
    int started = 1;
    if (ids && args) {
        for (int t = 1; t < threads; t++) {
            args[t] = (worker_arg){&s, t};
            if (pthread_create(&ids[t], NULL, worker, &args[t]) != 0) break;
            started++;
        }
    }
    worker_arg self = {&s, 0};
    worker(&self);
    for (int t = 1; t < started; t++) pthread_join(ids[t], NULL);
    free(ids);
    free(args);
    pthread_mutex_destroy(&s.lock);
    if (s.failed_status != TP_OK) return tp_fail(s.failed_status, "%s", s.message);
    return TP_OK;
}

int parallel_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
