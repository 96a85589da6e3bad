/* checkpoint.c: which checkpoint a relaunch resumes from (elastic.h): the
 * newest of the run directory whose every block verifies, in the order the
 * trainer itself tries them (ckpt_candidates: `latest`, then newest first). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt.h"
#include "../common/clock.h"
#include "../common/error.h"
#include "../common/parallel.h"
#include "elastic.h"

typedef struct {
    ckpt_reader *reader;
    int (*pieces)[2]; /* tensor, piece */
    int *status;
} verify_job;

static int verify_one(void *ctx, int64_t i, int thread)
{
    (void)thread;
    verify_job *job = ctx;
    job->status[i] = ckpt_reader_verify_piece(job->reader, job->pieces[i][0], job->pieces[i][1]);
    return TP_OK;
}

/* Every piece of the checkpoint at path, checked; the first damage found
 * names the tensor and piece. */
static int verify_checkpoint(const char *path, int threads, elastic_checkpoint *out)
{
    ckpt_reader *r = NULL;
    TP_TRY(ckpt_reader_open(&r, path, NULL));
    const ckpt_layout *layout = ckpt_reader_layout(r);
    int tensors = ckpt_reader_num_tensors(r), count = 0, total = 0;
    for (int t = 0; t < tensors; t++) total += ckpt_piece_count(ckpt_reader_tensor(r, t), layout->tp);
    verify_job job = {r, malloc((size_t)total * sizeof *job.pieces + 1), calloc((size_t)total + 1, sizeof *job.status)};
    int status = job.pieces && job.status ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory verifying %s", path);
    for (int t = 0; !status && t < tensors; t++)
        for (int p = 0; p < ckpt_piece_count(ckpt_reader_tensor(r, t), layout->tp); p++) {
            job.pieces[count][0] = t;
            job.pieces[count++][1] = p;
        }
    if (!status) status = parallel_for(count, threads, verify_one, &job);
    for (int i = 0; !status && i < count; i++)
        if (job.status[i]) status = tp_fail(job.status[i], "%s: tensor %s piece %d: damaged", path,
                                            ckpt_reader_tensor(r, job.pieces[i][0])->name, job.pieces[i][1]);
    if (!status) {
        snprintf(out->path, sizeof out->path, "%s", ckpt_reader_path(r));
        out->step = ckpt_reader_state(r)->step;
        out->tp = layout->tp;
        out->pp = layout->pp;
    }
    free(job.pieces);
    free(job.status);
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
    for (int k = 0; k < n && status; k++) {
        status = verify_checkpoint(list[k].path, threads > 0 ? threads : 1, out);
        if (status && rejected) rejected(ctx, list[k].path, tp_errmsg());
    }
    if (status) status = tp_fail(TP_ERR_NOT_FOUND, "%s: none of its %d checkpoints verifies", run_dir, n);
    free(list);
    out->seconds = now_seconds() - start;
    return status;
}
