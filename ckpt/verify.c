/* verify.c: a whole checkpoint checked, piece by piece, on several threads
 * (ckpt.h): what `tp-ckpt verify` reports and what tp-elastic requires of a
 * checkpoint before resuming from it. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/parallel.h"
#include "internal.h"

typedef struct {
    int tensor, piece;
    int64_t bytes;
    int file; /* the shard file: pieces are checked file by file, front to back */
    int status;
    char *message; /* a damaged piece's (malloc'ed): a buffer for every piece took 1 KiB each, 43 MB for 41,505 */
} piece_check;

typedef struct {
    ckpt_reader *reader;
    piece_check *checks;
    const ckpt_verify_options *options;
    /* Once a request to an object store failed through every retry (cut
     * bodies, no answer: store_requests_given_up grew), the pieces left are
     * not asked for: each would wait through the same retries, minutes of
     * backoff from a server that answers none, to be said unreadable all
     * the same. One object refused (a 403: no retry) stops nothing. Told
     * by the count growing while the failed piece was checked (another
     * thread of the process, a lease's renewal or an upload, gives up on
     * requests of its own), and only for a checkpoint in a store: a local
     * one's pieces never wait on one. */
    int remote;
    atomic_int store_failed;
} verify_job;

static int by_file_order(const void *a, const void *b)
{
    const piece_check *x = a, *y = b;
    return x->file != y->file ? x->file - y->file : x->tensor - y->tensor;
}

static int verify_one(void *ctx, int64_t i, int thread)
{
    (void)thread;
    verify_job *job = ctx;
    piece_check *check = &job->checks[i];
    if (atomic_load(&job->store_failed)) {
        check->status = tp_fail(TP_ERR_IO, "%s: not read: the store failed an earlier piece through every retry "
                                "(TP_REMOTE_RETRIES)", ckpt_reader_path(job->reader));
        if (!(check->message = strdup(tp_errmsg()))) return tp_fail(TP_ERR_NOMEM, "out of memory verifying");
        if (job->options->progress) job->options->progress(job->options->progress_ctx, check->bytes);
        return TP_OK;
    }
    long given_up_before = store_requests_given_up();
    check->status = ckpt_reader_verify_piece(job->reader, check->tensor, check->piece);
    if (!check->status) check->status = ckpt_reader_check_padding(job->reader, check->tensor, check->piece);
    if (!check->status) check->status = ckpt_reader_check_replicas(job->reader, check->tensor, check->piece);
    if (check->status && job->remote && store_requests_given_up() > given_up_before) atomic_store(&job->store_failed, 1);
    if (check->status && !(check->message = strdup(tp_errmsg())))
        return tp_fail(TP_ERR_NOMEM, "out of memory verifying");
    if (job->options->progress) job->options->progress(job->options->progress_ctx, check->bytes);
    return TP_OK; /* keep going: every damaged piece is reported */
}

int ckpt_verify(ckpt_reader *r, const ckpt_verify_options *options, ckpt_verify_result *out)
{
    memset(out, 0, sizeof *out);
    static const ckpt_verify_options defaults = {0};
    if (!options) options = &defaults;
    const ckpt_layout *layout = ckpt_reader_layout(r);
    int tensors = ckpt_reader_num_tensors(r);
    for (int t = 0; t < tensors; t++) out->pieces += ckpt_piece_count(ckpt_reader_tensor(r, t), layout->tp);
    verify_job job = {r, calloc((size_t)out->pieces + 1, sizeof *job.checks), options,
                      store_is_remote(ckpt_reader_path(r)), 0};
    if (!job.checks) return tp_fail(TP_ERR_NOMEM, "%s: out of memory verifying", ckpt_reader_path(r));
    int64_t k = 0;
    for (int t = 0; t < tensors; t++)
        for (int p = 0; p < ckpt_piece_count(ckpt_reader_tensor(r, t), layout->tp); p++) {
            ckpt_piece_info info;
            ckpt_reader_piece_info(r, t, p, &info);
            job.checks[k++] = (piece_check){t, p, info.bytes, info.pp * layout->tp + info.tp, 0, NULL};
            out->bytes += info.bytes;
        }
    /* Threads take neighbouring pieces of one file, so the disk sees one stream. */
    qsort(job.checks, (size_t)out->pieces, sizeof *job.checks, by_file_order);
    int status = parallel_for(out->pieces, options->threads > 0 ? options->threads : 1, verify_one, &job);
    for (int64_t i = 0; !status && i < out->pieces; i++) out->damaged += job.checks[i].status != 0;
    if (!status && out->damaged) {
        out->damage = calloc((size_t)out->damaged, sizeof *out->damage);
        if (!out->damage) status = tp_fail(TP_ERR_NOMEM, "%s: out of memory verifying", ckpt_reader_path(r));
        for (int64_t i = 0, d = 0; !status && i < out->pieces; i++) {
            const piece_check *c = &job.checks[i];
            if (!c->status) continue;
            out->damage[d] = (ckpt_damage){c->tensor, c->piece, c->status, ""};
            snprintf(out->damage[d++].message, sizeof out->damage->message, "%s", c->message);
        }
    }
    for (int64_t i = 0; i < out->pieces; i++) free(job.checks[i].message);
    free(job.checks);
    if (status) ckpt_verify_result_free(out);
    return status;
}

void ckpt_verify_result_free(ckpt_verify_result *result)
{
    free(result->damage);
    result->damage = NULL;
    result->damaged = 0;
}

int ckpt_verify_whole(ckpt_reader *r, int threads)
{
    ckpt_verify_options options = {.threads = threads};
    ckpt_verify_result result;
    int status = ckpt_verify(r, &options, &result);
    if (!status && result.damaged) {
        const ckpt_damage *first = &result.damage[0];
        status = tp_fail(first->status, "%s does not verify: %lld of %lld pieces damaged, the first: %s",
                         ckpt_reader_path(r), (long long)result.damaged, (long long)result.pieces, first->message);
    }
    ckpt_verify_result_free(&result);
    return status;
}

int ckpt_verify_checkpoint(const char *path, int threads, const ckpt_read_options *read)
{
    ckpt_reader *r = NULL;
    TP_TRY(ckpt_reader_open(&r, path, read));
    int status = ckpt_verify_whole(r, threads);
    ckpt_reader_close(r);
    return status;
}
