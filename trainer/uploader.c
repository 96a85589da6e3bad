/* uploader.c: one thread uploading committed checkpoints in step order. */
#include "uploader.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt.h"
#include "../ckpt/storage.h"
#include "../common/clock.h"

#define QUEUE_MAX 64

struct uploader {
    char local_run[CKPT_PATH_MAX], remote_run[CKPT_PATH_MAX];
    ckpt_run_claim *claim; /* the run directory's lease: no upload once it is lost */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int64_t queue[QUEUE_MAX]; /* steps to upload, oldest first */
    int queued, busy, quit;
    upload_result done[QUEUE_MAX];
    int num_done;
};

static void add_bytes(void *ctx, int64_t bytes)
{
    __atomic_fetch_add((int64_t *)ctx, bytes, __ATOMIC_RELAXED); /* from ckpt_upload's threads */
}

/* Local checkpoints older than `step`: uploaded (or superseded), not needed. */
static void prune_local(const char *local_run, int64_t step)
{
    ckpt_candidate *list = NULL;
    int count = 0;
    if (ckpt_candidates(local_run, &list, &count) != TP_OK) return;
    const ckpt_storage *posix = ckpt_storage_posix();
    for (int i = 0; i < count; i++)
        if (list[i].step >= 0 && list[i].step < step) posix->remove_tree(posix, list[i].path);
    free(list);
}

static void upload_one(uploader *u, int64_t step, upload_result *r)
{
    char local[CKPT_PATH_MAX];
    memset(r, 0, sizeof *r);
    r->step = step;
    double start = now_seconds();
    int64_t bytes = 0;
    int status = ckpt_step_path(u->local_run, step, local, sizeof local);
    if (!status) status = ckpt_step_path(u->remote_run, step, r->url, sizeof r->url);
    ckpt_upload_options options;
    ckpt_upload_options_init(&options);
    options.replace = 1; /* a step written again (a run resumed before it) replaces its old upload */
    options.threads = 4;  /* network-bound: few threads, the cores are training */
    options.on_file = add_bytes;
    options.ctx = &bytes;
    if (!status) status = ckpt_run_claim_check(u->claim);
    if (!status) status = ckpt_upload(local, r->url, &options);
    if (!status) status = ckpt_upload_latest(r->url);
    if (!status) prune_local(u->local_run, step);
    r->status = status;
    if (status) snprintf(r->error, sizeof r->error, "%s", tp_errmsg());
    r->bytes = bytes;
    r->seconds = now_seconds() - start;
}

static void *run(void *arg)
{
    uploader *u = arg;
    pthread_mutex_lock(&u->lock);
    for (;;) {
        while (!u->queued && !u->quit) pthread_cond_wait(&u->changed, &u->lock);
        if (u->quit) break;
        int64_t step = u->queue[0];
        u->busy = 1;
        pthread_mutex_unlock(&u->lock);
        upload_result r;
        upload_one(u, step, &r);
        pthread_mutex_lock(&u->lock);
        memmove(u->queue, u->queue + 1, (size_t)--u->queued * sizeof *u->queue);
        if (u->num_done < QUEUE_MAX) u->done[u->num_done++] = r;
        u->busy = 0;
        pthread_cond_broadcast(&u->changed);
    }
    pthread_mutex_unlock(&u->lock);
    return NULL;
}

int uploader_create(uploader **out, const char *local_run, const char *remote_run, ckpt_run_claim *claim)
{
    *out = NULL;
    uploader *u = calloc(1, sizeof *u);
    if (!u) return tp_fail(TP_ERR_NOMEM, "out of memory");
    snprintf(u->local_run, sizeof u->local_run, "%s", local_run);
    snprintf(u->remote_run, sizeof u->remote_run, "%s", remote_run);
    u->claim = claim;
    pthread_mutex_init(&u->lock, NULL);
    pthread_cond_init(&u->changed, NULL);
    if (pthread_create(&u->thread, NULL, run, u) != 0) {
        free(u);
        return tp_fail(TP_ERR_IO, "cannot start the upload thread");
    }
    *out = u;
    return TP_OK;
}

int uploader_push(uploader *u, int64_t step)
{
    pthread_mutex_lock(&u->lock);
    int status = TP_OK;
    if (u->queued == QUEUE_MAX)
        status = tp_fail(TP_ERR_STATE, "%d checkpoints wait for their upload to %s: the store is too slow for "
                         "--ckpt-every", QUEUE_MAX, u->remote_run);
    else
        u->queue[u->queued++] = step;
    pthread_cond_broadcast(&u->changed);
    pthread_mutex_unlock(&u->lock);
    return status;
}

int uploader_take_done(uploader *u, upload_result *out)
{
    pthread_mutex_lock(&u->lock);
    int any = u->num_done > 0;
    if (any) {
        *out = u->done[0];
        memmove(u->done, u->done + 1, (size_t)--u->num_done * sizeof *u->done);
    }
    pthread_mutex_unlock(&u->lock);
    return any;
}

void uploader_drain(uploader *u)
{
    pthread_mutex_lock(&u->lock);
    while (u->queued) pthread_cond_wait(&u->changed, &u->lock);
    pthread_mutex_unlock(&u->lock);
}

void uploader_free(uploader *u)
{
    if (!u) return;
    pthread_mutex_lock(&u->lock);
    u->quit = 1;
    pthread_cond_broadcast(&u->changed);
    pthread_mutex_unlock(&u->lock);
    pthread_join(u->thread, NULL);
    pthread_mutex_destroy(&u->lock);
    pthread_cond_destroy(&u->changed);
    free(u);
}
