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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "../common/parallel.h"
#include "../common/path.h"
#include "commit.h"
#include "index.h"

int ckpt_is_remote(const char *path)
{
    return store_is_remote(path);
}

/* Files (and parts) an upload or download keeps in flight. */
static int transfer_threads(const ckpt_upload_options *options)
{
    return options && options->threads > 0 ? options->threads : 8;
}

typedef struct {
    const char *local_dir, *url;
    const ckpt_index *index;
    int threads;
    const ckpt_upload_options *options;
} upload_job;

/* One shard file of `bytes` bytes up as the object remote (on `threads`
 * threads of parts), and its size there checked. */
static int put_shard_file(const char *local, const char *remote, int64_t bytes, int threads)
{
    TP_TRY(store_put_file(remote, local, 0, bytes, threads));
    const store_ops *store;
    store_stat st;
    TP_TRY(store_for(remote, &store));
    TP_TRY(store->stat(store, remote, &st));
    if (!st.exists || st.size != bytes)
        return tp_fail(TP_ERR_IO, "%s: %lld bytes arrived of %lld sent", remote, (long long)st.size,
                       (long long)bytes);
    return TP_OK;
}

static int upload_shard(void *ctx, int64_t f, int thread)
{
    (void)thread;
    upload_job *j = ctx;
    const ckpt_index_file *file = &j->index->files[f];
    char local[CKPT_PATH_MAX], remote[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(local, j->local_dir, file->name));
    TP_TRY(tp_path_join(remote, j->url, file->name));
    /* Parts of one file share the threads with other files: a checkpoint
     * of one large shard still goes up in parallel. */
    int part_threads = j->threads / j->index->num_files;
    TP_TRY(put_shard_file(local, remote, file->bytes, part_threads > 1 ? part_threads : 1));
    if (j->options && j->options->on_file) j->options->on_file(j->options->ctx, file->bytes);
    return TP_OK;
}

void ckpt_upload_options_init(ckpt_upload_options *options)
{
    memset(options, 0, sizeof *options);
}

/* The rule of every remote output, asked before any work: nothing may be
 * at target unless replace, and then only what may_replace (the writer's
 * own check of a local target; NULL accepts nothing) accepts. */
static int output_target_check(const store_ops *store, const char *target, int replace,
                               store_replace_check may_replace, void *ctx)
{
    store_stat st;
    TP_TRY(store->stat(store, target, &st));
    if (!st.exists) return TP_OK;
    if (!replace) return tp_fail(TP_ERR_EXISTS, "%s exists already (--force replaces it)", target);
    /* What --force replaces there is what it replaces on a disk: asked
     * now, before hours of writing, of what the upload will remove. */
    if (!may_replace) return tp_fail(TP_ERR_EXISTS, "%s exists already; nothing there is replaced", target);
    return may_replace(store, target, ctx);
}

/* An upload that failed before its index (or its files naming the others)
 * went up, or whose `latest` could not follow, leaves nothing at url: what
 * it sent, and with replace what was there (its index went first: no
 * reader could use it any more), is removed, so that the location reads as
 * before the command, empty, and a retry needs no --force. A signal is such
 * a failure: it cuts the upload's requests off (store/staging.h
 * store_stopping) and the process dies of it once this removal is done.
 * status and its message are kept; a removal that fails too is added to
 * the message. (A writer killed outright, SIGKILL or a lost node, still
 * leaves its objects: invisible without an index, docs/STORES.md.) */
static int discard_upload(const char *url, int status)
{
    char message[2048];
    snprintf(message, sizeof message, "%s", tp_errmsg());
    const store_ops *store;
    int removed = store_for(url, &store);
    if (!removed) removed = store->remove_tree(store, url);
    if (removed)
        return tp_fail(status, "%s (and what was uploaded stays under %s: %s)", message, url, tp_errmsg());
    return tp_fail(status, "%s", message);
}

/* Appends name to a growing array of names (*names, *count of *capacity). */
static int append_name(char (**names)[CKPT_NAME_MAX + 1], int *count, int *capacity, const char *name)
{
    if (*count == *capacity) {
        int grown_capacity = *capacity ? 2 * *capacity : 16;
        void *grown = realloc(*names, (size_t)grown_capacity * sizeof **names);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
        *names = grown;
        *capacity = grown_capacity;
    }
    snprintf((*names)[(*count)++], sizeof **names, "%s", name);
    return TP_OK;
}

/* After a replacement is committed (its index up), the old checkpoint's
 * files that the new one does not have: removed, so that the location
 * holds the new checkpoint alone, as a local --force leaves its directory.
 * A reader of the new checkpoint never opens them (its index names none);
 * one still reading the old checkpoint already met its replaced index and
 * shards (a missing or changed object, docs/STORES.md "Reading"). */
typedef struct {
    const ckpt_index *index;
    char (*stale)[CKPT_NAME_MAX + 1];
    int count, capacity;
} stale_scan;

static int collect_stale(void *ctx, const char *name)
{
    stale_scan *s = ctx;
    if (!strcmp(name, CKPT_INDEX_NAME)) return TP_OK;
    for (int f = 0; f < s->index->num_files; f++)
        if (!strcmp(name, s->index->files[f].name)) return TP_OK;
    return append_name(&s->stale, &s->count, &s->capacity, name);
}

static int remove_stale(const char *url, const ckpt_index *index)
{
    const store_ops *store;
    TP_TRY(store_for(url, &store));
    stale_scan scan = {index, NULL, 0, 0};
    int status = store->list(store, url, collect_stale, &scan);
    for (int i = 0; !status && i < scan.count; i++) {
        char path[CKPT_PATH_MAX];
        status = tp_path_join(path, url, scan.stale[i]);
        if (!status) status = store->remove_tree(store, path);
    }
    free(scan.stale);
    if (status)
        return tp_fail_context(status, "%s: replaced, but a file of the checkpoint it replaced could not be removed",
                               url);
    return TP_OK;
}

int ckpt_upload(const char *local_dir, const char *url, const ckpt_upload_options *options)
{
    if (!ckpt_is_remote(url)) return tp_fail(TP_ERR_ARG, "%s: not an http(s):// or s3:// location", url);
    int replace = options && options->replace;
    const store_ops *store;
    TP_TRY(store_for(url, &store));
    /* The output rule, as for every tool's remote output: a location that
     * holds anything (a run directory, another tool's files) is refused
     * without --force, and with it replaced only when it is a checkpoint. */
    TP_TRY(output_target_check(store, url, replace, ckpt_may_replace_checkpoint, NULL));
    char local_index[CKPT_PATH_MAX], remote_index[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(local_index, local_dir, CKPT_INDEX_NAME));
    TP_TRY(tp_path_join(remote_index, url, CKPT_INDEX_NAME));
    /* What goes up must read back whole there: a damaged local copy (or one
     * whose index disagrees with its files) is refused before any upload. */
    TP_TRY(ckpt_verify_checkpoint(local_dir, transfer_threads(options), NULL));
    char *text = NULL;
    int64_t text_size = 0;
    TP_TRY(store_read_text_file(local_index, CKPT_INDEX_MAX_BYTES, &text, &text_size));
    ckpt_index index;
    memset(&index, 0, sizeof index);
    int status = ckpt_index_parse(text, local_index, &index);
    /* From the first change at url until a failure is cleaned up, a signal
     * waits for this upload (store_upload_begin): its requests fail, what
     * it sent is removed here, and then the process dies of the signal. */
    int held = !status && !(status = store_upload_begin(url));
    if (!status) status = ckpt_upload_begin(url, replace);
    int begun = !status;
    upload_job job = {local_dir, url, &index, transfer_threads(options), options};
    if (!status && index.num_files > 0)
        status = parallel_for(index.num_files, index.num_files < job.threads ? index.num_files : job.threads,
                              upload_shard, &job);
    tp_fault_point("upload-before-index");
    if (!status) status = store_put_data(remote_index, text, (size_t)text_size);
    int committed = !status;
    if (committed && replace) status = remove_stale(url, &index);
    /* `latest` is part of the upload: a checkpoint up without it (a signal
     * between the two) was refused to a plain retry, "holds a checkpoint
     * already", though the command had failed. */
    if (committed && !status && options && options->update_latest) {
        tp_fault_point("before-latest");
        if ((status = ckpt_upload_latest(url))) committed = 0;
    }
    if (status && begun && !committed) status = discard_upload(url, status);
    if (held) store_upload_end();
    ckpt_index_free(&index);
    free(text);
    return status;
}

int ckpt_upload_begin(const char *url, int replace)
{
    if (!ckpt_is_remote(url)) return tp_fail(TP_ERR_ARG, "%s: not an http(s):// or s3:// location", url);
    const store_ops *store;
    TP_TRY(store_for(url, &store));
    char remote_index[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(remote_index, url, CKPT_INDEX_NAME));
    store_stat st = {0};
    TP_TRY(store->stat(store, remote_index, &st));
    if (!st.exists) return TP_OK;
    if (!replace) return tp_fail(TP_ERR_EXISTS, "%s holds a checkpoint already (--force replaces it)", url);
    /* The old checkpoint disappears first: never an index over new files. */
    return store_delete(remote_index);
}

int ckpt_shard_upload(const char *local_path, const ckpt_layout *layout, const ckpt_write_options *options,
                      const char *url, const ckpt_upload_options *upload, char **description)
{
    *description = NULL;
    char staging[CKPT_PATH_MAX], name[64], local[CKPT_PATH_MAX], remote[CKPT_PATH_MAX];
    TP_TRY(store_staging_path(local_path, options->staging_owner, staging, sizeof staging));
    store_staged *staged = store_staged_find(staging);
    if (!staged) return tp_fail(TP_ERR_STATE, "%s: no staging directory %s prepared by this process", local_path, staging);
    ckpt_shard_file_name(options->shard_pp, options->shard_tp, options->shard_dp, name, sizeof name);
    int status = tp_path_join(local, staging, name);
    if (!status) status = tp_path_join(remote, url, name);
    if (!status)
        status = ckpt_describe_shard(store_posix(), staging, layout, options->shard_pp, options->shard_tp, options->shard_dp,
                                     description);
    store_stat st = {0};
    if (!status) status = store_posix()->stat(store_posix(), local, &st);
    if (!status) status = put_shard_file(local, remote, st.size, transfer_threads(upload));
    if (!status && upload && upload->on_file) upload->on_file(upload->ctx, st.size);
    store_staged_discard(staged);
    if (status) {
        free(*description);
        *description = NULL;
    }
    return status;
}

int ckpt_commit_uploaded(const char *url, const ckpt_layout *layout, const ckpt_train_state *state,
                         const char *const *descriptions, int count, ckpt_run_claim *claim, int update_latest,
                         int64_t *bytes)
{
    char remote_index[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(remote_index, url, CKPT_INDEX_NAME));
    char *json = NULL;
    TP_TRY(ckpt_index_from_parts(layout, state, descriptions, count, url, &json, bytes));
    tp_fault_point("upload-before-index");
    int status = ckpt_run_claim_check(claim);
    if (!status) status = store_put_data(remote_index, json, strlen(json));
    free(json);
    if (status || !update_latest) return status;
    tp_fault_point("before-latest");
    TP_TRY(ckpt_run_claim_check(claim)); /* nothing more beside a run that took the lease over meanwhile */
    return ckpt_upload_latest(url);
}

int ckpt_upload_latest(const char *checkpoint_url)
{
    char run_url[CKPT_PATH_MAX], name[CKPT_NAME_MAX + 1], path[CKPT_PATH_MAX];
    TP_TRY(tp_split_path(checkpoint_url, run_url, sizeof run_url, name, sizeof name));
    TP_TRY(tp_path_join(path, run_url, CKPT_LATEST_NAME));
    char text[CKPT_NAME_MAX + 2];
    int n = snprintf(text, sizeof text, "%s\n", name);
    return store_put_data(path, text, (size_t)n);
}

/* ------------------------------------------------- files other than checkpoints */

typedef struct {
    const char *local, *url;
    char (*names)[CKPT_NAME_MAX + 1];
    const ckpt_upload_options *options;
} files_job;

static int upload_named(void *ctx, int64_t i, int thread)
{
    (void)thread;
    files_job *j = ctx;
    char local[CKPT_PATH_MAX], remote[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(local, j->local, j->names[i]));
    TP_TRY(tp_path_join(remote, j->url, j->names[i]));
    store_stat st;
    TP_TRY(store_posix()->stat(store_posix(), local, &st));
    TP_TRY(store_put_file(remote, local, 0, st.size, 1));
    if (j->options && j->options->on_file) j->options->on_file(j->options->ctx, st.size);
    return TP_OK;
}

/* The files of a directory tree, as paths relative to its root (a
 * Megatron-LM checkpoint: iter_NNNNNNN/mp_rank_TT/model_optim_rng.pt). */
typedef struct {
    char (*names)[CKPT_NAME_MAX + 1];
    int count, capacity;
    const char *root;
    char prefix[CKPT_NAME_MAX + 1]; /* of the directory being listed, "" or ending in '/' */
} name_list;

static int collect_name(void *ctx, const char *name)
{
    name_list *l = ctx;
    char relative[CKPT_NAME_MAX + 1], path[CKPT_PATH_MAX];
    if ((size_t)snprintf(relative, sizeof relative, "%s%s", l->prefix, name) >= sizeof relative)
        return tp_fail(TP_ERR_ARG, "%s/%s%s: path too long", l->root, l->prefix, name);
    TP_TRY(tp_path_join(path, l->root, relative));
    const store_ops *posix = store_posix();
    store_stat st;
    TP_TRY(posix->stat(posix, path, &st));
    if (st.is_dir) { /* its files, under its name */
        char saved[CKPT_NAME_MAX + 1];
        snprintf(saved, sizeof saved, "%s", l->prefix);
        if ((size_t)snprintf(l->prefix, sizeof l->prefix, "%s/", relative) >= sizeof l->prefix)
            return tp_fail(TP_ERR_ARG, "%s: path too long", path);
        int status = posix->list(posix, path, collect_name, l);
        snprintf(l->prefix, sizeof l->prefix, "%s", saved);
        return status;
    }
    return append_name(&l->names, &l->count, &l->capacity, relative);
}

/* Files that name the others go last: an index.json, a Megatron-LM
 * checkpoint's latest_checkpointed_iteration.txt, a PyTorch distributed
 * checkpoint's .metadata (its readers take one as a whole checkpoint). */
static int names_an_index(const char *name)
{
    size_t length = strlen(name), n = strlen("index.json");
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    return (length >= n && !strcmp(name + length - n, "index.json")) || !strcmp(name, "latest_checkpointed_iteration.txt") ||
           !strcmp(base, ".metadata");
}

static int index_last(const void *a, const void *b)
{
    const char *x = a, *y = b;
    int ix = names_an_index(x), iy = names_an_index(y);
    return ix != iy ? ix - iy : strcmp(x, y);
}

/* ckpt_upload_files, the signal clean-up waiting for it (ckpt_upload). */
static int upload_files(const char *local, const char *url, const ckpt_upload_options *options);

int ckpt_upload_files(const char *local, const char *url, const ckpt_upload_options *options)
{
    TP_TRY(store_upload_begin(url));
    int status = upload_files(local, url, options);
    store_upload_end();
    return status;
}

static int upload_files(const char *local, const char *url, const ckpt_upload_options *options)
{
    const store_ops *posix = store_posix();
    store_stat st;
    int update_latest = options && options->update_latest;
    TP_TRY(posix->stat(posix, local, &st));
    if (!st.exists) return tp_fail(TP_ERR_NOT_FOUND, "%s: nothing to upload", local);
    if (!st.is_dir) { /* one object: made whole or not at all */
        TP_TRY(store_put_file(url, local, 0, st.size, transfer_threads(options)));
        if (options && options->on_file) options->on_file(options->ctx, st.size);
        int status = update_latest ? ckpt_upload_latest(url) : TP_OK;
        return status ? discard_upload(url, status) : TP_OK;
    }
    name_list names = {.root = local};
    int status = posix->list(posix, local, collect_name, &names);
    /* What was there goes first, whole: no file of it stays beside the new
     * ones, and no tracker or index names files that are not there yet. */
    if (!status && options && options->replace) {
        const store_ops *remote;
        status = store_for(url, &remote);
        if (!status) status = remote->remove_tree(remote, url);
    }
    int threads = transfer_threads(options);
    if (!status && names.count) qsort(names.names, (size_t)names.count, sizeof *names.names, index_last);
    int first_index = names.count;
    while (first_index > 0 && names_an_index(names.names[first_index - 1])) first_index--;
    files_job job = {local, url, names.names, options};
    int begun = !status;
    if (!status && first_index > 0)
        status = parallel_for(first_index, first_index < threads ? first_index : threads, upload_named, &job);
    if (!status && first_index < names.count) tp_fault_point("upload-before-index");
    for (int i = first_index; !status && i < names.count; i++) status = upload_named(&job, i, 0);
    if (!status && update_latest) {
        tp_fault_point("before-latest");
        status = ckpt_upload_latest(url);
    }
    /* Nothing half-sent stays (discard_upload): whatever was at url was
     * removed first, or there was nothing (ckpt_output_begin). */
    if (status && begun) status = discard_upload(url, status);
    free(names.names);
    return status;
}

/* ------------------------------------------------- outputs of the tools */

int ckpt_local_dir_for(const char *url, const char *purpose, char *out, size_t out_size)
{
    if ((size_t)snprintf(out, out_size, "%s/tp-%s-%016llx", tp_temporary_dir(), purpose,
                         (unsigned long long)XXH64(url, strlen(url), 0)) >= out_size)
        return tp_fail(TP_ERR_ARG, "TMPDIR too long");
    return TP_OK;
}

int ckpt_output_check(const char *target, int replace, store_replace_check may_replace, void *ctx)
{
    const store_ops *store;
    TP_TRY(store_for(target, &store));
    return output_target_check(store, target, replace, may_replace, ctx);
}

int ckpt_output_begin(const char *target, int replace, store_replace_check may_replace, void *ctx, char *local,
                      size_t local_size)
{
    if (!ckpt_is_remote(target)) {
        if (strlen(target) >= local_size) return tp_fail(TP_ERR_ARG, "path too long: %s", target);
        strcpy(local, target);
        return TP_OK;
    }
    const store_ops *store;
    TP_TRY(store_for(target, &store));
    TP_TRY(output_target_check(store, target, replace, may_replace, ctx));
    /* Written here first, committed, then uploaded: a private directory. */
    char owner[128], dir[CKPT_PATH_MAX];
    TP_TRY(store_staging_owner(owner, sizeof owner));
    if ((size_t)snprintf(dir, sizeof dir, "%s/tp-upload.%s", tp_temporary_dir(), owner) >= sizeof dir)
        return tp_fail(TP_ERR_ARG, "TMPDIR too long");
    /* Removed by a signal's clean-up too, whenever it comes: a copy left
     * there would be sent by nobody (store_scratch_make). */
    int status = store_scratch_make(dir);
    if (status) return tp_fail_context(status, "a local copy for the upload to %s", target);
    /* Named as the target is ("URL/step_3/" as "URL/step_3"). */
    char parent[CKPT_PATH_MAX], base[CKPT_NAME_MAX + 1];
    if (tp_split_path(target, parent, sizeof parent, base, sizeof base)) snprintf(base, sizeof base, "checkpoint");
    if ((size_t)snprintf(local, local_size, "%s/%s", dir, base) >= local_size) {
        rmdir(dir);
        store_scratch_forget(dir);
        return tp_fail(TP_ERR_ARG, "path too long: %s", target);
    }
    return TP_OK;
}

int ckpt_output_finish(const char *target, const char *local, int ok, const ckpt_upload_options *options,
                       int update_latest)
{
    if (!ckpt_is_remote(target)) return TP_OK;
    int status = TP_OK;
    ckpt_upload_options upload;
    if (options) upload = *options;
    else ckpt_upload_options_init(&upload);
    upload.update_latest = update_latest;
    if (ok) status = ckpt_is_committed(local) ? ckpt_upload(local, target, &upload)
                                              : ckpt_upload_files(local, target, &upload);
    char parent[CKPT_PATH_MAX], base[CKPT_NAME_MAX];
    int split = tp_split_path(local, parent, sizeof parent, base, sizeof base) == TP_OK;
    /* A written output whose upload failed stays: hours of work are not
     * thrown away for a network error; `tp-ckpt copy` sends it later. Not
     * when a signal stopped the upload: the user asked for nothing to be
     * left, and the signal's clean-up removes it (store_scratch_make). */
    if (ok && status && !store_stopping()) {
        if (split) store_scratch_forget(parent);
        return tp_fail_context(status, "the output stays in %s (tp-ckpt copy uploads it)", local);
    }
    const store_ops *posix = store_posix();
    posix->remove_tree(posix, local);
    if (split) {
        rmdir(parent);
        store_scratch_forget(parent); /* removed first: a signal meanwhile removes the rest */
    }
    return status;
}

/* ------------------------------------------------------------- downloads */

#define DOWNLOAD_PART ((int64_t)8 << 20) /* bytes per ranged GET and local write (one GET: below the split of large reads) */

typedef struct {
    const char *url, *dir; /* remote checkpoint, local staging directory */
    const ckpt_index *index;
    int64_t *first_part; /* [file]: its parts' first task number; [num_files]: the total */
    store_file **remote;  /* [file]: opened once, so that all its parts are read from one version (its ETag) */
    char **buffers;      /* [thread] */
    const ckpt_upload_options *options;
    const store_ops *store; /* the remote checkpoint's */
} download_job;

static int download_part(void *ctx, int64_t task, int thread)
{
    download_job *j = ctx;
    int f = 0;
    while (j->first_part[f + 1] <= task) f++;
    const ckpt_index_file *file = &j->index->files[f];
    int64_t offset = (task - j->first_part[f]) * DOWNLOAD_PART;
    int64_t size = file->bytes - offset < DOWNLOAD_PART ? file->bytes - offset : DOWNLOAD_PART;
    char local[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(local, j->dir, file->name));
    if (!j->buffers[thread] && !(j->buffers[thread] = malloc((size_t)DOWNLOAD_PART)))
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    const store_ops *store = j->store, *posix = store_posix();
    store_file *out = NULL;
    int status = size > 0 ? store->read_at(j->remote[f], j->buffers[thread], (size_t)size, offset) : TP_OK;
    if (!status) status = posix->open(posix, local, STORE_OPEN_WRITE, &out);
    if (!status && size > 0) status = posix->write_at(out, j->buffers[thread], (size_t)size, offset);
    if (!status && j->options && j->options->on_file) j->options->on_file(j->options->ctx, size);
    if (out) posix->close(out);
    return status;
}

/* Attempts of a download whose object changed under it (or came back
 * other than asked): each from the start. */
#define DOWNLOAD_ATTEMPTS 3

/* What one attempt read of the source, to tell when it fails a source that
 * changed under it (another attempt may find it whole) from a damaged one
 * (another attempt reads the same bytes). */
typedef struct {
    char resolved[CKPT_PATH_MAX]; /* the checkpoint (a run directory's newest) */
    char *index_text;             /* its index as read; NULL: not read */
    int num_files;
    char (*names)[CKPT_NAME_MAX + 1];
    int64_t *bytes;
    char (*versions)[128]; /* each file's version (ETag) its reads were pinned to; "": none came */
} download_seen;

static void download_seen_free(download_seen *seen)
{
    free(seen->index_text);
    free(seen->names);
    free(seen->bytes);
    free(seen->versions);
    memset(seen, 0, sizeof *seen);
}

/* Whether the source is still what the attempt read: the same checkpoint,
 * the same index, and every file at the version its reads were pinned to
 * (a fresh one-byte read of each tells its version now). 0 when anything
 * differs or cannot be told (a file none of whose reads came back, a store
 * without versions, a request failing): another attempt is then worth it. */
static int source_unchanged(const char *url, const download_seen *seen)
{
    const store_ops *store;
    char resolved[CKPT_PATH_MAX], path[CKPT_PATH_MAX];
    char *text = NULL;
    if (!seen->index_text || store_for(url, &store) || ckpt_resolve_in(store, url, resolved) ||
        strcmp(resolved, seen->resolved) || tp_path_join(path, resolved, CKPT_INDEX_NAME) ||
        store_read_text(store, path, CKPT_INDEX_MAX_BYTES, &text, NULL)) {
        free(text);
        return 0;
    }
    int same = !strcmp(text, seen->index_text);
    free(text);
    for (int f = 0; same && f < seen->num_files; f++) {
        if (seen->bytes[f] == 0) continue; /* nothing read, nothing to be damaged */
        if (!seen->versions[f][0]) return 0;
        store_file *file = NULL;
        char byte, now[128] = "";
        same = !tp_path_join(path, resolved, seen->names[f]) && !store->open(store, path, STORE_OPEN_READ, &file) &&
               !store->read_at(file, &byte, 1, 0);
        if (file) {
            store_file_version(store, file, now, sizeof now);
            store->close(file);
        }
        same = same && !strcmp(now, seen->versions[f]);
    }
    return same;
}

static int download_once(const char *url, const char *local_dir, const ckpt_upload_options *options,
                         download_seen *seen);

int ckpt_download(const char *url, const char *local_dir, const ckpt_upload_options *options)
{
    for (int attempt = 1;; attempt++) {
        download_seen seen;
        memset(&seen, 0, sizeof seen);
        int status = download_once(url, local_dir, options, &seen);
        /* A checksum or format failure is what a change mid-download looks
         * like (a new ETag, a block that fails its checksum), and what a
         * damaged stored checkpoint looks like: told apart by whether the
         * source is still what was read. Nothing was published. Anything
         * else (the network after its retries, a local disk) is not made
         * better by starting again. */
        int again = 0;
        if (status == TP_ERR_CHECKSUM || status == TP_ERR_FORMAT) {
            char message[2048];
            snprintf(message, sizeof message, "%s", tp_errmsg());
            if (source_unchanged(url, &seen))
                status = tp_fail(status, "%s: the stored checkpoint is damaged: its index and every file kept their "
                                 "versions (ETags) through the download, so another download would read the same "
                                 "bytes: %s", seen.resolved, message);
            else if (attempt == DOWNLOAD_ATTEMPTS)
                status = tp_fail(status, "%s: no whole version of it could be downloaded in %d attempts, each from "
                                 "the start (it changed between them): %s", url, DOWNLOAD_ATTEMPTS, message);
            else
                again = 1;
        }
        download_seen_free(&seen);
        if (!again) return status;
    }
}

/* The downloaded copy at dir (staged, ours) verified: every block against
 * its checksum, the index against the files. A damaged piece is named by
 * the file it came from in the store (the staging copy goes with the
 * failure). */
static int verify_download(const char *dir, const char *resolved, int threads)
{
    ckpt_read_options ours;
    ckpt_read_options_init(&ours);
    ours.holder = 1; /* the staging entry is ours, locked */
    ckpt_reader *r = NULL;
    int status = ckpt_reader_open(&r, dir, &ours);
    if (status) return tp_fail_context(status, "%s: its download", resolved);
    ckpt_verify_options verify = {.threads = threads};
    ckpt_verify_result result;
    status = ckpt_verify(r, &verify, &result);
    if (!status && result.damaged) {
        const ckpt_damage *first = &result.damage[0];
        ckpt_piece_info info;
        ckpt_reader_piece_info(r, first->tensor, first->piece, &info);
        /* The piece's message names the staging copy of the file: the store's is named instead. */
        char local[CKPT_PATH_MAX + 2];
        const char *what = first->message;
        if (!tp_path_join(local, dir, info.file) && strlen(local) + 2 < sizeof local) {
            strcat(local, ": ");
            if (!strncmp(what, local, strlen(local))) what += strlen(local);
        }
        status = tp_fail(first->status, "%s/%s as downloaded: %lld of %lld pieces damaged, the first: %s", resolved,
                         info.file, (long long)result.damaged, (long long)result.pieces, what);
    }
    ckpt_verify_result_free(&result);
    ckpt_reader_close(r);
    return status;
}

static int download_once(const char *url, const char *local_dir, const ckpt_upload_options *options,
                         download_seen *seen)
{
    if (!ckpt_is_remote(url)) return tp_fail(TP_ERR_ARG, "%s: not an http(s):// or s3:// location", url);
    const store_ops *store, *posix = store_posix();
    TP_TRY(store_for(url, &store));
    char resolved[CKPT_PATH_MAX], remote_index[CKPT_PATH_MAX];
    TP_TRY(ckpt_resolve_in(store, url, resolved));
    snprintf(seen->resolved, sizeof seen->resolved, "%s", resolved);
    TP_TRY(tp_path_join(remote_index, resolved, CKPT_INDEX_NAME));
    char *text = NULL;
    int64_t text_size = 0;
    TP_TRY(store_read_text(store, remote_index, CKPT_INDEX_MAX_BYTES, &text, &text_size));
    ckpt_index index;
    memset(&index, 0, sizeof index);
    int status = (seen->index_text = strdup(text)) ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) status = ckpt_index_parse(text, remote_index, &index);
    if (!status && index.num_files > 0) {
        seen->names = calloc((size_t)index.num_files, sizeof *seen->names);
        seen->bytes = calloc((size_t)index.num_files, sizeof *seen->bytes);
        seen->versions = calloc((size_t)index.num_files, sizeof *seen->versions);
        if (!seen->names || !seen->bytes || !seen->versions) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        for (int f = 0; !status && f < index.num_files; f++) {
            snprintf(seen->names[f], sizeof seen->names[f], "%s", index.files[f].name);
            seen->bytes[f] = index.files[f].bytes;
        }
        if (!status) seen->num_files = index.num_files;
    }
    store_stage_options stage = {.directory = 1, .overwrite = options && options->replace,
                                 .may_replace = ckpt_may_replace_checkpoint};
    store_staged *staged = NULL;
    if (!status) status = store_stage(posix, local_dir, &stage, &staged);
    const char *dir = staged ? store_staged_path(staged) : NULL;
    int threads = transfer_threads(options);
    download_job job = {resolved, dir, &index, calloc((size_t)index.num_files + 1, sizeof(int64_t)),
                        calloc((size_t)index.num_files + 1, sizeof(store_file *)),
                        calloc((size_t)threads, sizeof(char *)), options, store};
    if (!status && (!job.first_part || !job.remote || !job.buffers)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int f = 0; !status && f < index.num_files; f++) {
        char remote[CKPT_PATH_MAX];
        status = tp_path_join(remote, resolved, index.files[f].name);
        if (!status) status = store->open(store, remote, STORE_OPEN_READ, &job.remote[f]);
    }
    /* Every file at its full size first, then its parts in parallel. */
    for (int f = 0; !status && f < index.num_files; f++) {
        char local[CKPT_PATH_MAX];
        store_file *file = NULL;
        status = tp_path_join(local, dir, index.files[f].name);
        if (!status) status = posix->open(posix, local, STORE_OPEN_CREATE, &file);
        if (!status) status = posix->resize(file, index.files[f].bytes);
        if (file) posix->close(file);
        job.first_part[f + 1] = job.first_part[f] + (index.files[f].bytes + DOWNLOAD_PART - 1) / DOWNLOAD_PART;
    }
    int64_t tasks = job.first_part ? job.first_part[index.num_files] : 0;
    if (!status && tasks > 0) status = parallel_for(tasks, tasks < threads ? (int)tasks : threads, download_part, &job);
    for (int f = 0; !status && f < index.num_files; f++) { /* durable before the index names them */
        char local[CKPT_PATH_MAX];
        store_file *file = NULL;
        status = tp_path_join(local, dir, index.files[f].name);
        if (!status) status = posix->open(posix, local, STORE_OPEN_WRITE, &file);
        if (!status) status = posix->sync(file);
        if (file) posix->close(file);
    }
    if (!status) status = store_write_file_atomic(posix, dir, CKPT_INDEX_NAME, text, (size_t)text_size);
    /* Trusted only once checked: the copy is verified (every block against
     * its checksum, the index against the files) before it is visible. */
    if (!status) status = verify_download(dir, resolved, threads);
    if (staged) {
        if (status) store_staged_discard(staged);
        else status = store_staged_publish(staged);
    }
    for (int f = 0; job.remote && f < index.num_files; f++) {
        if (!job.remote[f]) continue;
        if (f < seen->num_files) store_file_version(store, job.remote[f], seen->versions[f], sizeof seen->versions[f]);
        store->close(job.remote[f]);
    }
    free(job.remote);
    for (int t = 0; job.buffers && t < threads; t++) free(job.buffers[t]);
    free(job.buffers);
    free(job.first_part);
    ckpt_index_free(&index);
    free(text);
    return status;
}
