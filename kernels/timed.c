/* timed.c: a kernel backend that times the operations of another
 * (kernels_timed, kernels.h): where a training step's time goes, operation
 * by operation, on a machine without a profiler that sees the host's side.
 *
 * Each call is timed on the host (its issue: a GPU's operations return once
 * their work is queued, unless they wait, as to_host does), then the inner
 * backend's synchronize is timed (the device's work of that call still
 * running: the queue was empty when the call began, so issue + wait bounds
 * its device time from above). What a step spends outside all calls is the
 * trainer's own host time (communication, bookkeeping). The waits take the
 * overlap of host and device away, so a timed step is slower than a plain
 * one: the figures say what each part costs, not the step's speed. */
#include <pthread.h>
#include <string.h>

#include "../common/clock.h"
#include "../common/error.h"
#include "kernels.h"

/* The memory operations timed, as KERNEL_OPERATIONS lists the computing ones
 * (kernels.h): X(field, (parameters), (arguments)). Not the snapshots'
 * (mark_work, to_host_background): they run beside the step, on another
 * thread, and a wait after them would stop the step's own work. */
#define MEMORY_OPS(X)                                                                                                  \
    X(alloc, (void **out, size_t bytes), (out, bytes))                                                                 \
    X(zero, (void *memory, size_t bytes), (memory, bytes))                                                             \
    X(to_device, (void *device_dst, const void *host_src, size_t bytes), (device_dst, host_src, bytes))                \
    X(to_host, (void *host_dst, const void *device_src, size_t bytes), (host_dst, device_src, bytes))                  \
    X(copy, (void *dst, const void *src, size_t bytes), (dst, src, bytes))                                             \
    X(host_alloc, (void **out, size_t bytes), (out, bytes))
/* Every operation timed: its field in kernel_backend (synchronize is timed as
 * a wait of its own, timed_synchronize). */
#define TIMED_OPS(X) MEMORY_OPS(X) KERNEL_OPERATIONS(X) X(synchronize, (void), ())

#define OP_INDEX(op, PARAMS, ARGS) OP_##op,
enum { TIMED_OPS(OP_INDEX) NUM_TIMED_OPS };
#define OP_NAME(op, PARAMS, ARGS) #op,
static const char *const op_names[NUM_TIMED_OPS] = {TIMED_OPS(OP_NAME)};

static struct {
    const kernel_backend *inner;
    kernel_backend table;
    kernel_op_time times[NUM_TIMED_OPS];
} timed;
static pthread_mutex_t times_lock = PTHREAD_MUTEX_INITIALIZER;

/* The call's status, else the wait's; both times recorded. */
static int record(int op, double start, int status)
{
    double issued = now_seconds();
    int waited = status ? TP_OK : timed.inner->synchronize();
    double done = now_seconds();
    pthread_mutex_lock(&times_lock);
    timed.times[op].calls++;
    timed.times[op].issue_seconds += issued - start;
    timed.times[op].wait_seconds += done - issued;
    pthread_mutex_unlock(&times_lock);
    return status ? status : waited;
}

/* A wrapper per operation: PARAMS its parameter list, ARGS the call's arguments. */
#define WRAP(op, PARAMS, ARGS)                                                                                         \
    static int timed_##op PARAMS                                                                                       \
    {                                                                                                                  \
        double start = now_seconds();                                                                                  \
        return record(OP_##op, start, timed.inner->op ARGS);                                                          \
    }
MEMORY_OPS(WRAP)
KERNEL_OPERATIONS(WRAP)
#undef WRAP

/* synchronize is its own wait: all of it counted as waiting. */
static int timed_synchronize(void)
{
    double start = now_seconds();
    int status = timed.inner->synchronize();
    double done = now_seconds();
    pthread_mutex_lock(&times_lock);
    timed.times[OP_synchronize].calls++;
    timed.times[OP_synchronize].wait_seconds += done - start;
    pthread_mutex_unlock(&times_lock);
    return status;
}

const kernel_backend *kernels_timed(const kernel_backend *inner)
{
    if (!inner) {
        tp_fail(TP_ERR_ARG, "kernels_timed: no backend to time");
        return NULL;
    }
    if (timed.inner && timed.inner != inner) {
        tp_fail(TP_ERR_STATE, "kernels_timed: this process times the %s backend already (one per process)",
                timed.inner->name);
        return NULL;
    }
    if (timed.inner) return &timed.table;
    timed.inner = inner;
    timed.table = *inner; /* operations not timed (release, host_release, and any added later) are the inner ones */
    for (int i = 0; i < NUM_TIMED_OPS; i++) timed.times[i].name = op_names[i];
#define INSTALL(op, PARAMS, ARGS) if (inner->op) timed.table.op = timed_##op; /* an operation the backend lacks stays NULL */
    TIMED_OPS(INSTALL)
#undef INSTALL
    return &timed.table;
}

void kernels_timed_reset(void)
{
    pthread_mutex_lock(&times_lock);
    for (int i = 0; i < NUM_TIMED_OPS; i++) {
        timed.times[i].calls = 0;
        timed.times[i].issue_seconds = timed.times[i].wait_seconds = 0;
    }
    pthread_mutex_unlock(&times_lock);
}

int kernels_timed_read(kernel_op_time *out, int max)
{
    int n = 0;
    pthread_mutex_lock(&times_lock);
    for (int i = 0; i < NUM_TIMED_OPS && n < max; i++)
        if (timed.times[i].calls) out[n++] = timed.times[i];
    pthread_mutex_unlock(&times_lock);
    /* Slowest first: issue and wait together (an insertion sort of a few dozen). */
    for (int i = 1; i < n; i++) {
        kernel_op_time t = out[i];
        double total = t.issue_seconds + t.wait_seconds;
        int j = i;
        for (; j > 0 && out[j - 1].issue_seconds + out[j - 1].wait_seconds < total; j--) out[j] = out[j - 1];
        out[j] = t;
    }
    return n;
}
