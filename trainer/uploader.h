/* uploader.h: the background upload of a run's checkpoints to an object
 * store (tp-train --ckpt-dir http(s)://... or s3://...).
 *
 * Checkpoints are written and committed in a local directory (the cache),
 * as for a local run; each committed one is handed to a thread that
 * uploads it (ckpt_upload: shards, then its index) and then points the
 * remote `latest` at it, in step order, while training goes on. The local
 * copies of older checkpoints are removed once a newer one is uploaded, so
 * the cache holds the newest uploaded checkpoint and those not yet up. */
#ifndef TP_TRAINER_UPLOADER_H
#define TP_TRAINER_UPLOADER_H

#include <stdint.h>

typedef struct uploader uploader;

/* An uploader from local_run (a run directory) to remote_run (a URL); claim
 * (may be NULL): the run directory's, checked before every upload, so that
 * nothing is uploaded beside a run that took the lease over. */
struct ckpt_run_claim;
int uploader_create(uploader **out, const char *local_run, const char *remote_run, struct ckpt_run_claim *claim);

/* Queues the committed checkpoint of `step` (local_run/step_N). */
int uploader_push(uploader *u, int64_t step);

/* An upload that ended since the last call: 1 with its step, seconds,
 * bytes and status (TP_OK, or a failure whose message is in `error`);
 * 0 when none has. */
typedef struct {
    int64_t step, bytes;
    double seconds;
    int status;
    char error[1024];
    char url[4200];
} upload_result;
int uploader_take_done(uploader *u, upload_result *out);

/* Waits until every queued checkpoint is uploaded (or failed). */
void uploader_drain(uploader *u);

/* Stops after the upload under way (the rest of the queue is dropped) and frees. */
void uploader_free(uploader *u);

#endif
