/* upload.c: checkpoints into object stores.
 *
 * An object store has no renames, so the local commit's trick (a staging
 * directory renamed into place) is replaced by an order: every shard file
 * is uploaded (in parallel; S3 multipart for large ones), their sizes are
 * checked against the index, then index.json goes, then the run
 * directory's `latest`. A reader takes a checkpoint only by its index
 * (ckpt_resolve's rules), so it sees a remote checkpoint whole or not at
 * all; a shard uploaded by an interrupted upload is invisible and is
 * replaced by the next. The data's integrity travels with it: the reader
 * checks every block it reads against the block checksums, and those
 * against the index. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/parallel.h"
#include "index.h"
#include "remote.h"

int ckpt_is_remote(const char *path)
{
    return remote_is_url(path);
}

typedef struct {
    const char *local_dir, *url;
    const ckpt_index *index;
    int threads;
    const ckpt_upload_options *options;
} upload_job;

static int upload_shard(void *ctx, int64_t f, int thread)
{
    (void)thread;
    upload_job *j = ctx;
    const ckpt_index_file *file = &j->index->files[f];
    char local[CKPT_PATH_MAX], remote[CKPT_PATH_MAX];
    TP_TRY(ckpt_path_join(local, j->local_dir, file->name));
    TP_TRY(ckpt_path_join(remote, j->url, file->name));
    /* Parts of one file share the threads with other files: a checkpoint
     * of one large shard still goes up in parallel. */
    int part_threads = j->threads / j->index->num_files;
    TP_TRY(remote_put_file(remote, local, 0, file->bytes, part_threads > 1 ? part_threads : 1));
    ckpt_stat st;
    TP_TRY(ckpt_storage_remote()->stat(ckpt_storage_remote(), remote, &st));
    if (!st.exists || st.size != file->bytes)
        return tp_fail(TP_ERR_IO, "%s: %lld bytes arrived of %lld sent", remote, (long long)st.size,
                       (long long)file->bytes);
    if (j->options && j->options->on_file) j->options->on_file(j->options->ctx, file->bytes);
    return TP_OK;
}

void ckpt_upload_options_init(ckpt_upload_options *options)
{
    memset(options, 0, sizeof *options);
}

int ckpt_upload(const char *local_dir, const char *url, const ckpt_upload_options *options)
{
    if (!ckpt_is_remote(url)) return tp_fail(TP_ERR_ARG, "%s: not an http(s):// or s3:// location", url);
    const ckpt_storage *store = ckpt_storage_remote();
    char local_index[CKPT_PATH_MAX], remote_index[CKPT_PATH_MAX];
    TP_TRY(ckpt_path_join(local_index, local_dir, CKPT_INDEX_NAME));
    TP_TRY(ckpt_path_join(remote_index, url, CKPT_INDEX_NAME));
    char *text = NULL;
    int64_t text_size = 0;
    TP_TRY(ckpt_read_text_file(local_index, CKPT_INDEX_MAX_BYTES, &text, &text_size));
    ckpt_index index;
    memset(&index, 0, sizeof index);
    int status = ckpt_index_parse(text, local_index, &index);
    ckpt_stat st = {0};
    if (!status) status = store->stat(store, remote_index, &st);
    if (!status && st.exists) {
        if (!options || !options->replace)
            status = tp_fail(TP_ERR_EXISTS, "%s holds a checkpoint already (--force replaces it)", url);
        /* The old checkpoint disappears first: never an index over new files. */
        else
            status = remote_delete(remote_index);
    }
    upload_job job = {local_dir, url, &index, options && options->threads > 0 ? options->threads : 8, options};
    if (!status && index.num_files > 0)
        status = parallel_for(index.num_files, index.num_files < job.threads ? index.num_files : job.threads,
                              upload_shard, &job);
    ckpt_fault_point("upload-before-index");
    if (!status) status = remote_put_data(remote_index, text, (size_t)text_size);
    ckpt_index_free(&index);
    free(text);
    return status;
}

int ckpt_upload_latest(const char *run_url, const char *name)
{
    char path[CKPT_PATH_MAX];
    TP_TRY(ckpt_path_join(path, run_url, CKPT_LATEST_NAME));
    char text[CKPT_NAME_MAX + 2];
    int n = snprintf(text, sizeof text, "%s\n", name);
    return remote_put_data(path, text, (size_t)n);
}

/* ------------------------------------------------- outputs of the tools */

int ckpt_output_begin(const char *target, int replace, char *local, size_t local_size)
{
    if (!ckpt_is_remote(target)) {
        if (strlen(target) >= local_size) return tp_fail(TP_ERR_ARG, "path too long: %s", target);
        strcpy(local, target);
        return TP_OK;
    }
    char remote_index[CKPT_PATH_MAX];
    TP_TRY(ckpt_path_join(remote_index, target, CKPT_INDEX_NAME));
    ckpt_stat st;
    TP_TRY(ckpt_storage_remote()->stat(ckpt_storage_remote(), remote_index, &st));
    if (st.exists && !replace) return tp_fail(TP_ERR_EXISTS, "%s holds a checkpoint already (--force replaces it)", target);
    /* Written here first, committed, then uploaded: a private directory. */
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char owner[128], dir[CKPT_PATH_MAX];
    TP_TRY(ckpt_staging_owner(owner, sizeof owner));
    if ((size_t)snprintf(dir, sizeof dir, "%s/tp-upload.%s", tmp, owner) >= sizeof dir)
        return tp_fail(TP_ERR_ARG, "TMPDIR too long");
    const ckpt_storage *posix = ckpt_storage_posix();
    int status = posix->make_dir(posix, dir);
    if (status && status != TP_ERR_EXISTS) return tp_fail_context(status, "a local copy for the upload to %s", target);
    const char *base = strrchr(target, '/');
    base = base && base[1] ? base + 1 : "checkpoint";
    if ((size_t)snprintf(local, local_size, "%s/%s", dir, base) >= local_size)
        return tp_fail(TP_ERR_ARG, "path too long: %s", target);
    return TP_OK;
}

int ckpt_output_finish(const char *target, const char *local, int ok, const ckpt_upload_options *options,
                       int update_latest)
{
    if (!ckpt_is_remote(target)) return TP_OK;
    int status = TP_OK;
    if (ok) status = ckpt_upload(local, target, options);
    if (ok && !status && update_latest) {
        char run[CKPT_PATH_MAX], name[CKPT_NAME_MAX];
        status = ckpt_split_path(target, run, sizeof run, name, sizeof name);
        if (!status) status = ckpt_upload_latest(run, name);
    }
    /* The local copy goes, whatever happened: the remote one is the output. */
    char parent[CKPT_PATH_MAX], base[CKPT_NAME_MAX];
    const ckpt_storage *posix = ckpt_storage_posix();
    posix->remove_tree(posix, local);
    if (ckpt_split_path(local, parent, sizeof parent, base, sizeof base) == TP_OK) rmdir(parent);
    return status;
}
