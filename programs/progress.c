/* progress.c: the progress bar of the programs, on stderr. */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "progress.h"

void progress_start(progress *p, const char *label, int64_t total_bytes, int force)
{
    p->label = label;
    p->total_bytes = total_bytes;
    p->done_bytes = 0;
    p->start_seconds = now_seconds();
    p->last_draw = 0;
    p->enabled = force > 0 || (force == 0 && isatty(STDERR_FILENO));
    pthread_mutex_init(&p->lock, NULL);
}

static void draw(progress *p, double now)
{
    double elapsed = now - p->start_seconds;
    double fraction = p->total_bytes > 0 ? (double)p->done_bytes / (double)p->total_bytes : 1;
    double rate = elapsed > 0 ? (double)p->done_bytes / elapsed : 0;
    double eta = rate > 0 && p->total_bytes > p->done_bytes ? (double)(p->total_bytes - p->done_bytes) / rate : 0;
    char done[32], total[32], speed[32];
    format_bytes((double)p->done_bytes, done, sizeof done);
    format_bytes((double)p->total_bytes, total, sizeof total);
    format_bytes(rate, speed, sizeof speed);
    char bar[31];
    int filled = (int)(fraction * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < filled ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "\r%s [%s] %5.1f%%  %s / %s  %s/s  ETA %.0fs   ", p->label, bar,
            fraction * 100, done, total, speed, eta);
    fflush(stderr);
}

void progress_add(progress *p, int64_t bytes)
{
    pthread_mutex_lock(&p->lock);
    p->done_bytes += bytes;
    if (p->enabled) {
        double now = now_seconds();
        if (now - p->last_draw >= 0.1 || p->done_bytes >= p->total_bytes) {
            p->last_draw = now;
            draw(p, now);
        }
    }
    pthread_mutex_unlock(&p->lock);
}

double progress_finish(progress *p)
{
    double elapsed = now_seconds() - p->start_seconds;
    if (p->enabled) {
        fprintf(stderr, "\r%*s\r", 100, "");
        fflush(stderr);
    }
    pthread_mutex_destroy(&p->lock);
    return elapsed;
}
