/* lease.c: what the run directory's lease and an upload's claim share
 * (lease.h): the renewal thread, the holder's description, and the read of
 * a claim object its holder may be rewriting. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../common/clock.h"
#include "../common/error.h"
#include "../common/parse.h"
#include "../store/staging.h"
#include "../store/store.h"
#include "lease.h"

void ckpt_lease_describe_holder(const char *program, char *out, size_t out_size)
{
    char host[64], when[32];
    store_host_name(host, sizeof host);
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
    snprintf(out, out_size, "%s (pid %ld on host %s, since %s)", program, (long)getpid(), host, when);
}

int ckpt_lease_period(const char *name, double fallback, double min, double max, double *out)
{
    *out = parse_env_seconds(name, fallback, min, max);
    if (*out < 0) return tp_fail(TP_ERR_ARG, "%s=%s: expected seconds in %.0f..%.0f", name, getenv(name), min, max);
    return TP_OK;
}

int ckpt_lease_read_settled(ckpt_lease_read_fn read, const char *path, int *found, void *record)
{
    int status = read(path, found, record);
    for (int attempt = 1; store_read_changed(status) && attempt < 8 && !store_stopping(); attempt++) {
        sleep_seconds(0.02 * attempt);
        status = read(path, found, record);
    }
    return status;
}

void ckpt_lease_renewer_init(ckpt_lease_renewer *r, double period, ckpt_lease_renew_fn renew, void *ctx)
{
    *r = (ckpt_lease_renewer){.period = period, .renew = renew, .ctx = ctx};
    pthread_mutex_init(&r->mutex, NULL);
    pthread_cond_init(&r->wake, NULL);
}

static void *renew_loop(void *arg)
{
    ckpt_lease_renewer *r = arg;
    pthread_mutex_lock(&r->mutex);
    while (!r->stopping && !atomic_load(&r->lost)) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double wait = r->period / 4;
        until.tv_sec += (time_t)wait;
        until.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        while (!r->stopping && pthread_cond_timedwait(&r->wake, &r->mutex, &until) == 0) {
        }
        if (r->stopping) break;
        pthread_mutex_unlock(&r->mutex);
        r->renew(r->ctx, r);
        pthread_mutex_lock(&r->mutex);
    }
    pthread_mutex_unlock(&r->mutex);
    return NULL;
}

int ckpt_lease_renewer_start(ckpt_lease_renewer *r, const char *what)
{
    if (pthread_create(&r->thread, NULL, renew_loop, r) != 0)
        return tp_fail(TP_ERR_NOMEM, "cannot start the renewal thread of %s", what);
    r->running = 1;
    return TP_OK;
}

void ckpt_lease_renewer_stop(ckpt_lease_renewer *r)
{
    if (!r->running) return;
    pthread_mutex_lock(&r->mutex);
    r->stopping = 1;
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->mutex);
    pthread_join(r->thread, NULL);
    r->running = 0;
}

void ckpt_lease_renewer_destroy(ckpt_lease_renewer *r)
{
    ckpt_lease_renewer_stop(r);
    pthread_cond_destroy(&r->wake);
    pthread_mutex_destroy(&r->mutex);
}

void ckpt_lease_set_lost(ckpt_lease_renewer *r, const char *why)
{
    pthread_mutex_lock(&r->mutex);
    if (!atomic_load(&r->lost)) snprintf(r->lost_why, sizeof r->lost_why, "%s", why);
    atomic_store(&r->lost, 1);
    pthread_mutex_unlock(&r->mutex);
}

int ckpt_lease_lost(ckpt_lease_renewer *r, char *why, size_t size)
{
    if (!atomic_load(&r->lost)) return 0;
    pthread_mutex_lock(&r->mutex);
    snprintf(why, size, "%s", r->lost_why);
    pthread_mutex_unlock(&r->mutex);
    return 1;
}
