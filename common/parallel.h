/* parallel.h: a parallel loop over independent tasks on a few threads. */
#ifndef TP_PARALLEL_H
#define TP_PARALLEL_H

#include <stdint.h>

/* One task; returns 0 or an error code that stops the loop. thread is in
 * [0, threads) so tasks can use per-thread scratch. */
typedef int (*parallel_task)(void *ctx, int64_t task, int thread);

/* Where a failure's message comes from: messages are often per thread (like
 * ckpt_errmsg), so the failing worker calls message() and the text is kept. */
typedef struct {
    const char *(*message)(void);
    char text[2048];
} parallel_failure;

/* Runs task(ctx, i, thread) for i in [0, n) on `threads` threads (the caller's
 * among them), handing out tasks in order. Returns 0, or the error of the
 * lowest-numbered failing task (its message in failure->text when failure is
 * given); tasks not yet started are then skipped. */
int parallel_for(int64_t n, int threads, parallel_task task, void *ctx, parallel_failure *failure);

/* Number of online CPUs (at least 1). */
int parallel_cpu_count(void);

#endif
