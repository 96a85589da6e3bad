/* The storage seam (store/store.h): a store plugged in through the options
 * carries every byte of the pieces and every operation on names of a write,
 * a commit and a read, and its failures come back as the library's errors
 * with nothing half-visible. The store here wraps the POSIX one, counting
 * what goes through it and failing on request. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../support/fixture.h"

TestSuite(storage, .init = make_dir, .fini = remove_dir);

/* What went through the wrapper, and which operation is to fail. */
typedef struct {
    int64_t bytes_read, bytes_written, reads, writes, opens, renames, lists, stats, syncs, dir_syncs, removes;
    const char *fail; /* "read", "write", "rename" or NULL */
} traffic;

static traffic seen;

struct store_file {
    const store_ops *storage;
    store_file *inner;
};

static const store_ops *posix(void)
{
    return store_posix();
}

static int injected(const char *what)
{
    return tp_fail(TP_ERR_IO, "injected %s failure", what);
}

static int w_open(const store_ops *s, const char *path, store_open_mode mode, store_file **out)
{
    seen.opens++;
    store_file *f = calloc(1, sizeof *f);
    cr_assert_not_null(f);
    f->storage = s;
    int status = posix()->open(posix(), path, mode, &f->inner);
    if (status) {
        free(f);
        return status;
    }
    *out = f;
    return TP_OK;
}

static int w_read_at(store_file *f, void *buf, size_t size, int64_t offset)
{
    if (seen.fail && strcmp(seen.fail, "read") == 0) return injected("read");
    seen.reads++;
    seen.bytes_read += (int64_t)size;
    return posix()->read_at(f->inner, buf, size, offset);
}

static int w_write_at(store_file *f, const void *buf, size_t size, int64_t offset)
{
    if (seen.fail && strcmp(seen.fail, "write") == 0) return injected("write");
    seen.writes++;
    seen.bytes_written += (int64_t)size;
    return posix()->write_at(f->inner, buf, size, offset);
}

static void w_read_ahead(store_file *f, int64_t offset, int64_t size)
{
    posix()->read_ahead(f->inner, offset, size);
}

static int w_resize(store_file *f, int64_t size)
{
    return posix()->resize(f->inner, size);
}

static int w_sync(store_file *f)
{
    seen.syncs++;
    return posix()->sync(f->inner);
}

static void w_close(store_file *f)
{
    posix()->close(f->inner);
    free(f);
}

static const char *w_path_of(const store_file *f)
{
    return posix()->path_of(f->inner);
}

static int w_stat(const store_ops *s, const char *path, store_stat *out)
{
    (void)s;
    seen.stats++;
    return posix()->stat(posix(), path, out);
}

static int w_list(const store_ops *s, const char *dir_path, int (*visit)(void *ctx, const char *name), void *ctx)
{
    (void)s;
    seen.lists++;
    return posix()->list(posix(), dir_path, visit, ctx);
}

static int w_make_dir(const store_ops *s, const char *path)
{
    (void)s;
    return posix()->make_dir(posix(), path);
}

static int w_rename(const store_ops *s, const char *from, const char *to, store_rename_mode mode)
{
    (void)s;
    /* The rename that publishes fails; the one that names a fresh staging entry does not. */
    size_t n = strlen(to);
    if (seen.fail && strcmp(seen.fail, "rename") == 0 && !(n > 8 && strcmp(to + n - 8, ".staging") == 0))
        return injected("rename");
    seen.renames++;
    return posix()->rename(posix(), from, to, mode);
}

static int w_remove_tree(const store_ops *s, const char *path)
{
    (void)s;
    seen.removes++;
    return posix()->remove_tree(posix(), path);
}

static int w_sync_dir(const store_ops *s, const char *path)
{
    (void)s;
    seen.dir_syncs++;
    return posix()->sync_dir(posix(), path);
}

static int w_lock(const store_ops *s, const char *path, int flags, store_file **out)
{
    store_file *f = calloc(1, sizeof *f);
    cr_assert_not_null(f);
    f->storage = s;
    int status = posix()->lock(posix(), path, flags, &f->inner);
    if (status) {
        free(f);
        return status;
    }
    *out = f;
    return TP_OK;
}

static const store_ops wrapper = {.name = "counting",
                                     .local_paths = 1,
                                     .open = w_open,
                                     .read_at = w_read_at,
                                     .write_at = w_write_at,
                                     .read_ahead = w_read_ahead,
                                     .resize = w_resize,
                                     .sync = w_sync,
                                     .close = w_close,
                                     .path_of = w_path_of,
                                     .stat = w_stat,
                                     .list = w_list,
                                     .make_dir = w_make_dir,
                                     .rename = w_rename,
                                     .remove_tree = w_remove_tree,
                                     .sync_dir = w_sync_dir,
                                     .lock = w_lock,
                                     .impl = NULL};

/* Two tensors, one split and one replicated, uncompressed, at tp 2: 2 + 1
 * pieces. Writes them through the wrapper; returns their stored bytes. */
static int64_t write_through(const char *path, ckpt_tensor_desc *descs, float *data, int64_t n, int *status_out)
{
    ckpt_layout layout = {2, 1, 1, 1, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.storage = &wrapper;
    options.update_latest = 1;
    ckpt_writer *w = NULL;
    int status = ckpt_writer_create(&w, path, &layout, &options);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    int64_t bytes = 0;
    for (int i = 0; i < 2 && !status; i++) {
        int id;
        cr_assert_eq(ckpt_writer_add_tensor(w, &descs[i], &id), TP_OK, "%s", tp_errmsg());
        for (int p = 0; p < ckpt_piece_count(&descs[i], 2) && !status; p++) {
            int64_t shape[CKPT_MAX_DIMS];
            ckpt_piece_shape(&descs[i], 2, shape);
            status = ckpt_writer_put_piece(w, id, p, data + p * shape[0]);
            bytes += shape[0] * (int64_t)sizeof(float);
        }
    }
    if (status) ckpt_writer_abort(w);
    else status = ckpt_writer_commit(w, NULL);
    *status_out = status;
    (void)n;
    return bytes;
}

static void two_tensors(ckpt_tensor_desc *descs, float *data, int64_t n)
{
    descs[0] = (ckpt_tensor_desc){.name = "model/split", .dtype = TP_FP32, .ndim = 1, .shape = {n},
                                  .anchor = CKPT_ANCHOR_FIRST};
    descs[0].partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 0, 0, 0};
    descs[1] = (ckpt_tensor_desc){.name = "model/replicated", .dtype = TP_FP32, .ndim = 1, .shape = {n},
                                  .anchor = CKPT_ANCHOR_FIRST};
    for (int64_t i = 0; i < n; i++) data[i] = (float)i * 0.5f - 7.0f;
}

Test(storage, carries_every_byte_of_a_write_commit_and_read)
{
    enum { N = 4096 };
    static float data[N], back[N];
    ckpt_tensor_desc descs[2];
    two_tensors(descs, data, N);
    char run[700], path[800];
    snprintf(run, sizeof run, "%s/run", dir);
    cr_assert_eq(mkdir(run, 0755), 0);
    snprintf(path, sizeof path, "%s/step_00000001", run);
    memset(&seen, 0, sizeof seen);
    int status;
    int64_t piece_bytes = write_through(path, descs, data, N, &status);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    /* Every piece's bytes, index.json and latest went through the store, and
     * the commit renamed and synced there. */
    cr_assert_geq(seen.bytes_written, piece_bytes + 2, "%lld bytes written through the store, the pieces alone hold %lld",
                  (long long)seen.bytes_written, (long long)piece_bytes);
    cr_assert_geq(seen.renames, 3, "index, checkpoint and latest are renamed into place (%lld renames)", (long long)seen.renames);
    cr_assert_geq(seen.syncs, 2, "the shard files and small files are synced (%lld)", (long long)seen.syncs);
    cr_assert_geq(seen.dir_syncs, 2, "the staging and run directories are synced (%lld)", (long long)seen.dir_syncs);

    /* Reading the run directory through the store: it is listed or its
     * latest followed, and every byte of a piece arrives through it. */
    memset(&seen, 0, sizeof seen);
    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.storage = &wrapper;
    ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_reader_open(&r, run, &options), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(ckpt_reader_path(r), path);
    int64_t index_bytes = seen.bytes_read;
    cr_assert_gt(index_bytes, 0, "index.json is read through the store");
    int i = ckpt_reader_find(r, "model/split");
    cr_assert_geq(i, 0);
    for (int p = 0; p < 2; p++)
        cr_assert_eq(ckpt_reader_read_piece(r, i, p, back + p * (N / 2), sizeof back / 2), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(memcmp(back, data, sizeof data), 0, "the pieces read through the store are the ones written");
    cr_assert_geq(seen.bytes_read - index_bytes, (int64_t)sizeof data, "every byte of the pieces came through the store");
    ckpt_reader_close(r);
}

Test(storage, a_failing_read_is_the_readers_error)
{
    enum { N = 1024 };
    static float data[N], back[N];
    ckpt_tensor_desc descs[2];
    two_tensors(descs, data, N);
    char path[700];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    memset(&seen, 0, sizeof seen);
    int status;
    write_through(path, descs, data, N, &status);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.storage = &wrapper;
    ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_reader_open(&r, path, &options), TP_OK, "%s", tp_errmsg());
    seen.fail = "read";
    int i = ckpt_reader_find(r, "model/replicated");
    cr_assert_eq(ckpt_reader_read_piece(r, i, 0, back, sizeof back), TP_ERR_IO);
    cr_assert(strstr(tp_errmsg(), "injected read failure"), "the store's message comes back: %s", tp_errmsg());
    seen.fail = NULL;
    cr_assert_eq(ckpt_reader_read_piece(r, i, 0, back, sizeof back), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(memcmp(back, data, sizeof back), 0);
    ckpt_reader_close(r);
}

Test(storage, a_failing_write_or_rename_leaves_nothing_visible)
{
    enum { N = 1024 };
    static float data[N];
    ckpt_tensor_desc descs[2];
    two_tensors(descs, data, N);
    const char *failures[] = {"write", "rename"};
    for (int k = 0; k < 2; k++) {
        char path[700], staging_prefix[800];
        snprintf(path, sizeof path, "%s/ckpt_%s", dir, failures[k]);
        snprintf(staging_prefix, sizeof staging_prefix, ".ckpt_%s.", failures[k]);
        memset(&seen, 0, sizeof seen);
        seen.fail = failures[k];
        int status;
        write_through(path, descs, data, N, &status);
        cr_assert_eq(status, TP_ERR_IO, "a failing %s fails the write", failures[k]);
        cr_assert(strstr(tp_errmsg(), "injected"), "%s", tp_errmsg());
        struct stat st;
        cr_assert_neq(stat(path, &st), 0, "nothing at %s after a failing %s", path, failures[k]);
        DIR *d = opendir(dir);
        cr_assert_not_null(d);
        for (struct dirent *e; (e = readdir(d)) != NULL;)
            cr_assert(strncmp(e->d_name, staging_prefix, strlen(staging_prefix)) != 0,
                      "no staging left after a failing %s: %s", failures[k], e->d_name);
        closedir(d);
        cr_assert_eq(ckpt_is_committed(path), 0);
    }
}

Test(storage, urls_name_their_scheme)
{
    const store_ops *s = NULL;
    cr_assert_eq(store_for("runs/gpt/step_00000010", &s), TP_OK);
    cr_assert_eq(s, store_posix());
    cr_assert_eq(store_for("/abs/dir:with://colon", &s), TP_OK, "a local path that holds :// later is local");
    const char *remote[] = {"s3://bucket/run", "http://127.0.0.1:9/run", "https://example.org/run"};
    const store_ops *object_stores[] = {store_s3(), store_webdav(), store_webdav()};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(store_for(remote[i], &s), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(s, object_stores[i], "%s is an object store's", remote[i]);
        cr_assert_eq(s->local_paths, 0, "HDF5 cannot open %s", remote[i]);
    }
    cr_assert_eq(store_for("gopher://example.org/run", &s), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "gopher://"), "%s", tp_errmsg());
    ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_reader_open(&r, "ftp://example.org/run", NULL), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "ftp://"), "%s", tp_errmsg());
}

Test(storage, credentials_in_urls_are_refused_unprinted)
{
    ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_reader_open(&r, "http://alice:Hunter2Secret@127.0.0.1:9/run", NULL), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "credentials in URLs are refused"), "%s", tp_errmsg());
    cr_assert_null(strstr(tp_errmsg(), "Hunter2Secret"), "the secret is not repeated: %s", tp_errmsg());
}

/* s3://KEY:SECRET@bucket was taken as a bucket of that name: the secret was
 * sent in the request's path and repeated in the error. */
Test(storage, credentials_in_s3_urls_are_refused_unprinted)
{
    ckpt_reader *r = NULL;
    cr_assert_eq(ckpt_reader_open(&r, "s3://AKIA:Hunter2Secret@bucket/run", NULL), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "credentials in URLs are refused"), "%s", tp_errmsg());
    cr_assert_null(strstr(tp_errmsg(), "Hunter2Secret"), "the secret is not repeated: %s", tp_errmsg());
}

Test(storage, an_unreachable_server_fails_after_bounded_retries)
{
    /* Port 9 (discard) of the loopback: nothing listens, the connection is
     * refused at once; 2 retries with 20 ms backoff. */
    setenv("TP_REMOTE_RETRIES", "2", 1);
    setenv("TP_REMOTE_BACKOFF_MS", "20", 1);
    ckpt_reader *r = NULL;
    int status = ckpt_reader_open(&r, "http://127.0.0.1:9/run", NULL);
    cr_assert_eq(status, TP_ERR_IO, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "http://127.0.0.1:9/run"), "names the URL: %s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "after 3 attempts"), "the first try and 2 retries: %s", tp_errmsg());
}

static char notices[4][1024];
static int num_notices;

static void keep_notice(void *ctx, const char *text)
{
    (void)ctx;
    if (num_notices < 4) snprintf(notices[num_notices], sizeof notices[0], "%s", text);
    num_notices++;
}

/* Each retry is told as it happens (store_set_notice, a line on stderr in
 * the programs): a store that cannot be reached held `tp-ckpt info` silent
 * for 7.4 s (refused) or 218 s (never answering) before its one error. */
Test(storage, each_retry_is_a_notice)
{
    setenv("TP_REMOTE_RETRIES", "2", 1);
    setenv("TP_REMOTE_BACKOFF_MS", "20", 1);
    num_notices = 0;
    store_set_notice(keep_notice, NULL);
    const store_ops *s = store_webdav();
    store_stat st;
    cr_assert_eq(s->stat(s, "http://127.0.0.1:9/run", &st), TP_ERR_IO, "one request: %s", tp_errmsg());
    store_set_notice(NULL, NULL);
    cr_assert_eq(num_notices, 2, "one notice per retry, %d", num_notices);
    for (int i = 0; i < 2; i++) {
        char retry[32];
        snprintf(retry, sizeof retry, "; retry %d of 2 in ", i + 1);
        cr_assert(strstr(notices[i], "http://127.0.0.1:9/run") && strstr(notices[i], retry) &&
                      strstr(notices[i], "(TP_REMOTE_RETRIES)"),
                  "names the URL, the retry and the setting: %s", notices[i]);
    }
}

/* The wrapper, but a store HDF5 cannot open (as an object store): the
 * reader must take every location from the index (format 1.2). */
static const store_ops *index_only(void)
{
    static store_ops store;
    store = wrapper;
    store.name = "index-only";
    store.local_paths = 0;
    return &store;
}

static void write_compressed(const char *path, ckpt_tensor_desc *descs, float *data, int64_t n)
{
    ckpt_layout layout = {2, 1, 1, 1, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.compress_level = 3;
    ckpt_writer *w = NULL;
    cr_assert_eq(ckpt_writer_create(&w, path, &layout, &options), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < 2; i++) {
        int id;
        cr_assert_eq(ckpt_writer_add_tensor(w, &descs[i], &id), TP_OK, "%s", tp_errmsg());
        for (int p = 0; p < ckpt_piece_count(&descs[i], 2); p++)
            cr_assert_eq(ckpt_writer_put_piece(w, id, p, data + p * (n / 2)), TP_OK, "%s", tp_errmsg());
    }
    cr_assert_eq(ckpt_writer_commit(w, NULL), TP_OK, "%s", tp_errmsg());
}

Test(storage, a_store_without_local_paths_reads_from_the_index)
{
    enum { N = 1 << 16 };
    static float data[N], back[N];
    ckpt_tensor_desc descs[2];
    two_tensors(descs, data, N);
    for (int compressed = 0; compressed < 2; compressed++) {
        char path[700];
        snprintf(path, sizeof path, "%s/ckpt_%d", dir, compressed);
        int status = TP_OK;
        if (compressed) write_compressed(path, descs, data, N);
        else write_through(path, descs, data, N, &status);
        cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
        ckpt_read_options options;
        ckpt_read_options_init(&options);
        options.storage = index_only();
        options.verify = 1;
        ckpt_reader *r = NULL;
        cr_assert_eq(ckpt_reader_open(&r, path, &options), TP_OK, "%s", tp_errmsg());
        int major, minor;
        ckpt_reader_version(r, &major, &minor);
        cr_assert(major == 1 && minor >= 2, "written as format %d.%d", major, minor);
        memset(&seen, 0, sizeof seen);
        int split = ckpt_reader_find(r, "model/split"), replicated = ckpt_reader_find(r, "model/replicated");
        for (int p = 0; p < 2; p++)
            cr_assert_eq(ckpt_reader_read_piece(r, split, p, back + p * (N / 2), sizeof back / 2), TP_OK, "%s",
                         tp_errmsg());
        cr_assert_eq(memcmp(back, data, sizeof data), 0, "compressed=%d: the split tensor read back", compressed);
        cr_assert_eq(ckpt_reader_read_piece(r, replicated, 0, back, sizeof back), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(back, data, sizeof data), 0, "compressed=%d: the replicated tensor read back", compressed);
        cr_assert_gt(seen.reads, 0, "the data came through the store");
        cr_assert_eq(ckpt_reader_verify_piece(r, split, 1), TP_OK, "%s", tp_errmsg());
        ckpt_reader_close(r);
    }
}

Test(storage, damaged_block_checksums_are_caught_without_hdf5)
{
    enum { N = 4096 };
    static float data[N], back[N];
    ckpt_tensor_desc descs[2];
    two_tensors(descs, data, N);
    char path[700], shard[800];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    int status;
    write_through(path, descs, data, N, &status);
    cr_assert_eq(status, TP_OK, "%s", tp_errmsg());
    /* Where the replicated tensor's block checksums lie, from the index. */
    ckpt_reader *r = NULL;
    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.storage = index_only();
    cr_assert_eq(ckpt_reader_open(&r, path, &options), TP_OK, "%s", tp_errmsg());
    char *json = NULL;
    cr_assert_eq(ckpt_reader_index_json(r, &json), TP_OK);
    ckpt_reader_close(r);
    const char *at = strstr(strstr(json, "\"model/replicated\""), "\"checksums_at\":");
    cr_assert_not_null(at, "the index records where the block checksums are");
    long long offset = atoll(at + strlen("\"checksums_at\":"));
    free(json);
    snprintf(shard, sizeof shard, "%s/shard_pp00_tp00.h5", path);
    FILE *f = fopen(shard, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, offset + 3, SEEK_SET), 0);
    int c = fgetc(f);
    cr_assert_eq(fseek(f, offset + 3, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    fclose(f);
    cr_assert_eq(ckpt_reader_open(&r, path, &options), TP_OK, "%s", tp_errmsg());
    int i = ckpt_reader_find(r, "model/replicated");
    cr_assert_eq(ckpt_reader_read_piece(r, i, 0, back, sizeof back), TP_ERR_CHECKSUM, "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "model/replicated"), "names the tensor: %s", tp_errmsg());
    ckpt_reader_close(r);
}
