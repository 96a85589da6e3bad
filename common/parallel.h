/* parallel.h: a parallel loop over independent tasks on a few threads. */
#ifndef TP_PARALLEL_H
#define TP_PARALLEL_H

#include <stdint.h>

/* One task; returns TP_OK or a status (common/error.h) that stops the loop.
 * thread is in [0, threads) so tasks can use per-thread scratch. */
typedef int (*parallel_task)(void *ctx, int64_t task, int thread);

/* Runs task(ctx, i, thread) for i in [0, n) on `threads` threads (the caller's
 * among them), handing out tasks in order. Returns TP_OK, or the status of
 * the lowest-numbered failing task, whose message (tp_errmsg() of the thread
 * that ran it) becomes the caller's; tasks not yet started are then skipped. */
int parallel_for(int64_t n, int threads, parallel_task task, void *ctx);

/* Number of online CPUs (at least 1). */
int parallel_cpu_count(void);

#endif
