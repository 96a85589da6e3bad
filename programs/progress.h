/* progress.h: a one-line progress bar (bytes, rate, ETA) for long jobs. */
#ifndef TP_PROGRESS_H
#define TP_PROGRESS_H

#include <pthread.h>
#include <stdint.h>

#include "../common/clock.h"
#include "../common/parse.h" /* format_bytes, for what the programs print beside it */

typedef struct {
    const char *label;
    int64_t total_bytes;
    int64_t done_bytes;
    double start_seconds;
    double last_draw;
    int enabled;
    pthread_mutex_t lock;
} progress;

/* Enabled when stderr is a terminal, or when forced (force > 0). */
void progress_start(progress *p, const char *label, int64_t total_bytes, int force);
/* Adds bytes done; redraws at most ten times a second. Thread-safe. */
void progress_add(progress *p, int64_t bytes);
/* Clears the bar. Returns the elapsed seconds. */
double progress_finish(progress *p);

#endif
