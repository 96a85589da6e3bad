/* checkpoint.c: which checkpoint a relaunch resumes from (elastic.h): the
 * newest of the run directory whose every block verifies, in the order the
 * trainer itself tries them (ckpt_candidates: `latest`, then newest first). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt.h"
#include "../common/clock.h"
#include "../common/error.h"
#include "elastic.h"

/* Every piece of the checkpoint at path, checked as `tp-ckpt verify` checks
 * it; the first damage found names the file, tensor and piece. */
static int verify_checkpoint(const char *path, int threads, elastic_checkpoint *out)
{
    ckpt_reader *r = NULL;
    TP_TRY(ckpt_reader_open(&r, path, NULL));
    int status = ckpt_verify_whole(r, threads);
    if (!status) {
        const ckpt_layout *layout = ckpt_reader_layout(r);
        snprintf(out->path, sizeof out->path, "%s", ckpt_reader_path(r));
        out->step = ckpt_reader_state(r)->step;
        out->tp = layout->tp;
        out->pp = layout->pp;
        /* {} (a checkpoint that names no model): the trainer says so itself */
        out->has_model = gpt_config_from_json(ckpt_reader_state(r)->model_json, &out->model) == TP_OK;
    }
    ckpt_reader_close(r);
    return status;
}

int elastic_choose_checkpoint(const char *run_dir, int threads,
                              void (*rejected)(void *ctx, const char *path, const char *why), void *ctx,
                              elastic_checkpoint *out)
{
    memset(out, 0, sizeof *out);
    double start = now_seconds();
    ckpt_candidate *list = NULL;
    int n = 0, status = ckpt_candidates(run_dir, &list, &n);
    if (status) return status;
    status = TP_ERR_NOT_FOUND;
    int unread = 0;
    for (int k = 0; k < n && status && !unread; k++) {
        status = verify_checkpoint(list[k].path, threads > 0 ? threads : 1, out);
        /* A store that could not be read (ckpt_store_failure: EIO, EACCES,
         * a 5xx) says nothing of the checkpoint. Called a rejection, an older
         * checkpoint was chosen in its place, which the trainer refuses to
         * do (it stops at the same failure): the choice ends here, as the
         * trainer's resume does. */
        unread = status && ckpt_store_failure(status);
        if (unread) {
            char cause[4096 + 512]; /* tp_errmsg's buffer is the one tp_fail writes */
            snprintf(cause, sizeof cause, "%s", tp_errmsg());
            status = tp_fail(status, "%s; %s could not be read, and no older checkpoint is taken in its place "
                             "(resume when the store answers)", cause, list[k].path);
        }
        else if (status && rejected) rejected(ctx, list[k].path, tp_errmsg());
    }
    /* Checkpoints there, none intact, is not "no checkpoint": the trainer's
     * resume refuses such a directory too, and a fresh start beside them
     * would be nobody's wish. */
    if (status && !unread) status = tp_fail(TP_ERR_CHECKSUM, "%s: none of its %d checkpoints verifies", run_dir, n);
    free(list);
    out->seconds = now_seconds() - start;
    return status;
}
