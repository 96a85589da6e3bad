/* workers.h: the CPU backend's threads. One pool per process, made once and
 * kept, that runs the tasks of one kernel call at a time: the matrix
 * products cut into blocks of rows (each a single-threaded OpenBLAS or
 * oneDNN product), the attention's heads, rows of normalizations, spans of
 * element-wise work. The calling thread takes tasks too.
 *
 * Why not common/parallel.c's parallel_for: it starts its threads per call
 * (tens of microseconds, and fresh stacks whose pages the kernel clears),
 * right for coarse I/O tasks, not for the hundreds of sub-millisecond
 * kernel calls of a training step. Why not OpenBLAS's and OpenMP's own
 * threads: two pools whose idle threads spin beside each other (and beside
 * another rank's on a small machine) took a tiny model's bf16 step from
 * 3 ms to 220-320 ms (docs/BENCHMARKS.md); one pool owns the cores and
 * OpenBLAS runs single-threaded inside its tasks. */
#ifndef TP_CPU_WORKERS_H
#define TP_CPU_WORKERS_H

#include <stdint.h>

/* One task: TP_OK, or a status with tp_fail's message. */
typedef int (*worker_task)(void *ctx, int64_t task);

/* Threads the pool may use for each call (the caller counted), 1 to
 * WORKERS_MAX; kernels_set_threads sets it. */
#define WORKERS_MAX 64
void workers_set_threads(int threads);
int workers_threads(void);

/* Runs task(ctx, 0 .. tasks - 1), each once, on the pool and the calling
 * thread, and returns when all have ended: TP_OK, or the status and message
 * of the lowest-numbered failed task (tasks not yet begun are skipped after
 * a failure). A call from inside a task, or while another thread's call
 * holds the pool (ranks as threads of one process), runs its tasks on the
 * calling thread alone. */
int workers_run(int64_t tasks, worker_task task, void *ctx);

/* Elements of simple element-wise work a share holds at least: about
 * 5-10 us of work, which outweighs handing the share to another thread. */
#define WORKERS_GRAIN 16384

/* fn(ctx, begin, end) over shares of [0, count) that together cover it
 * once, on the pool; each item costs about item_cost elements of
 * element-wise work (a share holds at least WORKERS_GRAIN of them). */
typedef void (*worker_range)(void *ctx, int64_t begin, int64_t end);
void workers_for(int64_t count, int64_t item_cost, worker_range fn, void *ctx);

/* Cuts count items into at most workers_threads() shares of at least
 * min_share items each (at least one share): returns the number of shares
 * and sets *per_share, the size of each but the last. */
int64_t workers_shares(int64_t count, int64_t min_share, int64_t *per_share);

#endif
