/* workers.c: the CPU backend's pool of threads (workers.h).
 *
 * A call closes the claim word (generation << 32 | next task) to claims of
 * the previous call, writes its job (task, context, count), and then opens
 * the word at task 0 of its own generation. Threads claim tasks by
 * compare-and-swap on that word after reading the job, so a claim succeeds
 * only if the word did not move since it was read: the job read is the one
 * the word belongs to. (Without the closing, a thread that read a spent word
 * of the previous call and the new job's count could claim a task of the
 * new job under the old generation: test_workers saw a task run twice.)
 * The caller takes tasks too and
 * then waits for the count of ended tasks, never for a worker that claimed
 * nothing: a worker the system left asleep costs nothing. Idle workers spin
 * a little (WORKER_SPINS) and then sleep on a futex. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../common/error.h"
#include "workers.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Pauses an idle worker spins before it sleeps: about 20-40 us on the
 * AMD EPYC here (a pause is about 65 cycles). Kernel calls of a step follow
 * each other within microseconds, so a spinning worker usually catches the
 * next one; a longer spin would take the core from another rank's process
 * on a small machine. */
#define WORKER_SPINS 1000

/* Pauses the caller spins waiting for claimed tasks to end before it
 * yields its core (to the worker running them, where cores are shared). */
#define CALLER_SPINS 2000

/* The low half of a closed claim word: above any count of tasks (at most INT32_MAX). */
#define CLOSED 0xFFFFFFFFu

static struct {
    pthread_mutex_t owner; /* held by the call in progress */
    int started;           /* workers running, under owner */
    int threads;           /* per call, the caller counted; atomic */
    /* The job of the call in progress: written (atomically, relaxed) under
     * owner before its claim word is published, read by the workers. */
    worker_task task;
    void *ctx;
    int64_t tasks;
    int participants;  /* workers 0 .. participants - 1 take tasks */
    uint64_t claim;    /* generation << 32 | next task; atomic */
    int64_t done;      /* tasks ended; atomic */
    int failed;        /* atomic */
    pthread_mutex_t failure_lock;
    int64_t failed_task; /* the lowest failed task, -1 for none; under failure_lock */
    int failed_status;
    char message[2048];
    uint32_t wake;     /* futex word: the generation; atomic */
    int sleepers;      /* workers asleep or about to be; atomic */
} pool = {PTHREAD_MUTEX_INITIALIZER, 0, 1, NULL, NULL, 0, 0, 0, 0, 0, PTHREAD_MUTEX_INITIALIZER, -1, 0, "", 0, 0};

/* Set in the workers, and in a caller while it takes tasks: a call from a
 * task runs inline. */
static _Thread_local int in_pool;

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define LOAD_RELAXED(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define STORE_RELAXED(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

void workers_set_threads(int threads)
{
    STORE_RELAXED(pool.threads, threads < 1 ? 1 : threads > WORKERS_MAX ? WORKERS_MAX : threads);
}

int workers_threads(void)
{
    return LOAD_RELAXED(pool.threads);
}

int64_t workers_shares(int64_t count, int64_t min_share, int64_t *per_share)
{
    int64_t shares = min_share > 0 ? count / min_share : count;
    if (shares > workers_threads()) shares = workers_threads();
    if (shares < 1) shares = 1;
    *per_share = count > 0 ? (count + shares - 1) / shares : 1;
    return count > 0 ? (count + *per_share - 1) / *per_share : 1;
}

static void run_one(worker_task task, void *ctx, int64_t i)
{
    if (LOAD_RELAXED(pool.failed)) return; /* skipped after a failure */
    int status = task(ctx, i);
    if (status == TP_OK) return;
    pthread_mutex_lock(&pool.failure_lock);
    if (pool.failed_task < 0 || i < pool.failed_task) {
        pool.failed_task = i;
        pool.failed_status = status;
        snprintf(pool.message, sizeof pool.message, "%s", tp_errmsg());
    }
    pthread_mutex_unlock(&pool.failure_lock);
    STORE_RELAXED(pool.failed, 1);
}

/* Claims and runs tasks of the given generation until none is left. */
static void take_tasks(uint32_t generation)
{
    for (;;) {
        uint64_t word = LOAD(pool.claim);
        if ((uint32_t)(word >> 32) != generation) return;
        worker_task task = LOAD(pool.task);
        void *ctx = LOAD(pool.ctx);
        int64_t tasks = LOAD(pool.tasks), next = (int64_t)(uint32_t)word;
        if (next >= tasks) return;
        /* Succeeds only while the word is unchanged: the fields read are this generation's. */
        if (!__atomic_compare_exchange_n(&pool.claim, &word, word + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        run_one(task, ctx, next);
        __atomic_fetch_add(&pool.done, 1, __ATOMIC_RELEASE);
    }
}

static void futex_wait(uint32_t *word, uint32_t expected)
{
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(uint32_t *word, int count)
{
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

typedef struct {
    int index;
    uint32_t seen; /* the generation at its start */
} worker_start;

static void *worker_main(void *arg)
{
    worker_start start = *(worker_start *)arg;
    free(arg);
    in_pool = 1;
    uint32_t seen = start.seen;
    for (;;) {
        uint32_t now;
        int spins = 0;
        while ((now = LOAD(pool.wake)) == seen) {
            if (spins++ < WORKER_SPINS) {
                cpu_relax();
                continue;
            }
            /* Counted before the wait, which returns at once if the word has moved. */
            __atomic_fetch_add(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
            futex_wait(&pool.wake, seen);
            __atomic_fetch_sub(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
        }
        seen = now;
        if (start.index < LOAD_RELAXED(pool.participants)) take_tasks(now);
    }
    return NULL;
}

/* Starts workers up to wanted, under owner. Signals stay with the threads
 * that were there (the trainer's SIGTERM and SIGUSR1). */
static void start_workers(int wanted)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (pool.started < wanted) {
        worker_start *start = malloc(sizeof *start);
        pthread_t id;
        if (!start) break;
        *start = (worker_start){pool.started, LOAD(pool.wake)};
        if (pthread_create(&id, NULL, worker_main, start) != 0) {
            free(start);
            break;
        }
        pthread_detach(id);
        pool.started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* A child of fork has none of its parent's workers. */
static void forget_workers(void)
{
    pthread_mutex_init(&pool.owner, NULL);
    pthread_mutex_init(&pool.failure_lock, NULL);
    pool.started = 0;
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, forget_workers);
}

static int run_inline(int64_t tasks, worker_task task, void *ctx)
{
    int was = in_pool;
    in_pool = 1;
    int status = TP_OK;
    for (int64_t i = 0; i < tasks && status == TP_OK; i++) status = task(ctx, i);
    in_pool = was;
    return status;
}

int workers_run(int64_t tasks, worker_task task, void *ctx)
{
    if (tasks <= 0) return TP_OK;
    int threads = workers_threads();
    if (tasks == 1 || threads <= 1 || in_pool || tasks > INT32_MAX || pthread_mutex_trylock(&pool.owner) != 0)
        return run_inline(tasks, task, ctx);
    pthread_once(&fork_once, watch_forks);
    if (pool.started < threads - 1) start_workers(threads - 1);
    int helpers = threads - 1 < pool.started ? threads - 1 : pool.started;
    if (helpers > tasks - 1) helpers = (int)(tasks - 1);
    if (helpers < 1) {
        pthread_mutex_unlock(&pool.owner);
        return run_inline(tasks, task, ctx);
    }
    /* The word closed (no count reaches CLOSED), the job (released: a thread
     * that reads any of it sees the word closed), the word opened, the wake-up. */
    uint32_t generation = LOAD_RELAXED(pool.wake) + 1;
    STORE_RELAXED(pool.claim, (uint64_t)generation << 32 | CLOSED);
    STORE(pool.task, task);
    STORE(pool.ctx, ctx);
    STORE(pool.tasks, tasks);
    STORE_RELAXED(pool.participants, helpers);
    STORE_RELAXED(pool.done, 0);
    STORE_RELAXED(pool.failed, 0);
    pool.failed_task = -1;
    STORE(pool.claim, (uint64_t)generation << 32);
    __atomic_store_n(&pool.wake, generation, __ATOMIC_SEQ_CST);
    /* All sleepers: after the count of threads went down, those asleep may
     * include workers that take no part, and waking only as many as take
     * part could leave the ones that do asleep. */
    if (__atomic_load_n(&pool.sleepers, __ATOMIC_SEQ_CST) > 0) futex_wake(&pool.wake, INT_MAX);

    in_pool = 1;
    take_tasks(generation);
    in_pool = 0;
    for (int spins = 0; LOAD(pool.done) < tasks; spins++) {
        if (spins < CALLER_SPINS) cpu_relax();
        else sched_yield();
    }
    int status = TP_OK;
    if (LOAD_RELAXED(pool.failed)) {
        pthread_mutex_lock(&pool.failure_lock);
        status = tp_fail(pool.failed_status, "%s", pool.message);
        pthread_mutex_unlock(&pool.failure_lock);
    }
    pthread_mutex_unlock(&pool.owner);
    return status;
}

typedef struct {
    int64_t count, per_share;
    worker_range fn;
    void *ctx;
} range_job;

static int range_task(void *ctx, int64_t share)
{
    const range_job *job = ctx;
    int64_t begin = share * job->per_share, end = begin + job->per_share;
    job->fn(job->ctx, begin, end < job->count ? end : job->count);
    return TP_OK;
}

void workers_for(int64_t count, int64_t item_cost, worker_range fn, void *ctx)
{
    if (count <= 0) return;
    int64_t min_share = item_cost >= WORKERS_GRAIN ? 1 : (WORKERS_GRAIN + item_cost - 1) / (item_cost > 0 ? item_cost : 1);
    int64_t per_share, shares = workers_shares(count, min_share, &per_share);
    if (shares == 1) {
        fn(ctx, 0, count);
        return;
    }
    range_job job = {count, per_share, fn, ctx};
    (void)workers_run(shares, range_task, &job); /* its tasks cannot fail */
}
