/* reader.c: reading checkpoints.
 *
 * Metadata comes from index.json. When a piece is first touched its dataset
 * is opened once, cross-checked against the index (attributes, shape,
 * checksum), and its storage located: the file offset of a contiguous piece,
 * or the address and size of every chunk of a compressed one. From then on
 * data is read through the store (positioned reads) outside HDF5's global
 * lock, so many threads read in parallel; compressed chunks are decompressed
 * in the reading thread.
 * With verification on, every block read is hashed and compared. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "../common/file.h"
#include "../common/memory.h"
#include "attrs.h"
#include "foreign_check.h"
#include "index.h"
#include "namemap.h"

#define DIRECT_READ_MAX ((int64_t)64 << 20) /* bytes per pread straight into a caller buffer */
#define GROUP_TARGET ((int64_t)8 << 20)     /* bytes per bounced read without verification */
#define SPARSE_RUN_MIN ((int64_t)64 << 10)  /* runs at least this long are read one by one */
#define VERIFY_READ_MAX ((int64_t)8 << 20)  /* bytes per verified read: hashed while in L3 */
#define PREFETCH_MIN ((int64_t)64 << 10)    /* reads this large are announced to the kernel */
#define PREFETCH_AHEAD ((int64_t)16 << 20)  /* and so are this many bytes after them */

typedef struct {
    uint64_t address;
    uint64_t size;
    uint32_t filter_mask;
} chunk_location;

typedef struct {
    int loaded;
    int64_t offset;          /* contiguous pieces */
    chunk_location *chunks;  /* compressed pieces, one per block */
    uint64_t *block_hash;
    ckpt_piece_geometry geometry;
    /* A foreign piece stored as boxes (ckpt_foreign_box), and whether it
     * holds padding, which no box covers and reads as zeros. */
    ckpt_foreign_box *boxes;
    int64_t num_boxes;
    int padded;
    /* The file range last announced to the kernel, [from, to): a piece read
     * in small consecutive blocks announces only what lies past it, every
     * PREFETCH_AHEAD / 2 bytes (each announcement walks the page cache over
     * its whole range). Threads may race on it: it is a hint. */
    _Atomic int64_t announced_from, announced_to;
    _Atomic int read; /* a foreign piece with a recorded digest was read (checked by ckpt_reader_finish_checks) */
} piece_runtime;

typedef struct {
    char path[CKPT_PATH_MAX];
    hid_t file;       /* HDF5's handle: metadata */
    store_file *data;  /* the store's: the bytes of pieces */
    int meta_checked; /* its metadata checksum matched the index's (format 1.1) */
    int through_index; /* read through the index alone (local_through_index, its metadata checksum matched) */
    int open_status;  /* a failed open is not retried for every piece */
    char *open_error; /* its message */
    char version[128]; /* a foreign file: the version its reads must match ("" none) */
    /* Its pieces, and those loaded through HDF5: once all are, HDF5's handle
     * is closed (the data is read through `data`). libhdf5 keeps about half
     * a MiB for each open file (its metadata cache's hash table): verify held
     * 16 MiB of handles for 32 files it had finished with. */
    int64_t pieces, pieces_loaded;
    uint64_t used_at; /* when its HDF5 handle was last used: the least recent is closed first (HDF5_HANDLES_MAX) */
} file_runtime;

struct ckpt_reader {
    char path[CKPT_PATH_MAX];
    const store_ops *storage;
    ckpt_index index;
    ckpt_read_options options;
    file_runtime *files;
    piece_runtime **pieces; /* [tensor][piece] */
    ckpt_name_map names;
    pthread_mutex_t lock;   /* lazy opening of files and pieces */
    store_file *hold;        /* a shared lock on the checkpoint: no one replaces it while it is read */
    int foreign;            /* pieces are byte ranges of another tool's files (ckpt_reader_open_foreign) */
    ckpt_layout saved;      /* such a checkpoint's layout when saved, if read at another (tp 0: none) */
    foreign_checks *checks; /* the checksums such files record, checked as they are read */
    int recorded_digests;   /* such a checkpoint records its tensors' logical digests (recorded_digests) */
    uint64_t serial;        /* this reader among those of the process (a thread's permuted rows, read_boxes) */
    int64_t permuted_rows_bytes; /* those rows' buffer a thread holds at most (0: no box stored permuted) */
    uint64_t index_digest;  /* XXH64 of the index text read at open (ckpt_reader_changed) */
    int64_t index_size;
    int hdf5_handles;       /* files' HDF5 handles open now (at most HDF5_HANDLES_MAX) */
    uint64_t hdf5_clock;    /* counts HDF5 uses: file_runtime.used_at */
};

/* HDF5 handles a reader keeps open at once (about 0.8 MiB each): a handle
 * serves only to load a file's pieces, and a tool reading some tensors of
 * every file (an export takes the weights, not the optimizer's moments)
 * kept all of them: 32 files took `tp-ckpt export --memory-limit 56M` to
 * 63 MiB. Readers going tensor by tensor use a stage's tp files at once. */
#define HDF5_HANDLES_MAX 16

void ckpt_read_options_init(ckpt_read_options *options)
{
    memset(options, 0, sizeof *options);
    options->verify = 1;
}

/* -------------------------------------------------------------------- open */

static const char *reader_name_of(const void *ctx, int64_t i)
{
    const ckpt_reader *r = ctx;
    return r->index.tensors[i].tensor.name;
}

void ckpt_reader_close(ckpt_reader *r)
{
    if (!r) return;
    for (int f = 0; r->files && f < r->index.num_files; f++) {
        if (r->files[f].file > 0) H5Fclose(r->files[f].file);
        if (r->files[f].data) r->storage->close(r->files[f].data);
        free(r->files[f].open_error);
    }
    for (int i = 0; r->pieces && i < r->index.num_tensors; i++) {
        for (int p = 0; r->pieces[i] && p < r->index.tensors[i].num_pieces; p++) {
            free(r->pieces[i][p].chunks);
            free(r->pieces[i][p].block_hash);
            free(r->pieces[i][p].boxes);
        }
        free(r->pieces[i]);
    }
    free(r->pieces);
    free(r->files);
    ckpt_name_map_free(&r->names);
    ckpt_index_free(&r->index);
    pthread_mutex_destroy(&r->lock);
    if (r->hold) r->storage->close(r->hold);
    foreign_checks_free(r->checks);
    free(r);
}

int ckpt_reader_open(ckpt_reader **out, const char *path, const ckpt_read_options *options)
{
    *out = NULL;
    int status = ckpt_library_init();
    if (status) return status;
    ckpt_reader *r = calloc(1, sizeof *r);
    if (!r) return tp_fail(TP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&r->lock, NULL);
    if (options) r->options = *options;
    else ckpt_read_options_init(&r->options);
    r->storage = r->options.storage;
    if (!r->storage) status = store_for(path, &r->storage);
    if (!status && r->options.index_text) { /* the caller read the index of this committed checkpoint */
        if (strlen(path) >= sizeof r->path) status = tp_fail(TP_ERR_ARG, "path too long: %s", path);
        else strcpy(r->path, path);
    } else if (!status) {
        status = ckpt_resolve_in(r->storage, path, r->path);
    }
    /* Files are opened as pieces are read, so what is at the path must stay:
     * a replacement (--force) waits for, or refuses, readers. */
    if (!status && !r->options.holder)
        status = store_lock_for_reading(r->storage, r->path, &r->hold);
    char index_path[CKPT_PATH_MAX] = "";
    char *text = NULL;
    if (!status) status = tp_path_join(index_path, r->path, CKPT_INDEX_NAME);
    if (!status && !r->options.index_text)
        status = store_read_text(r->storage, index_path, CKPT_INDEX_MAX_BYTES, &text, NULL);
    if (!status) status = ckpt_index_parse(text ? text : r->options.index_text, index_path, &r->index);
    if (!status) { /* what was read, for ckpt_reader_changed */
        const char *read = text ? text : r->options.index_text;
        r->index_size = (int64_t)strlen(read);
        r->index_digest = XXH64(read, (size_t)r->index_size, 0);
    }
    free(text);
    r->options.index_text = NULL; /* the caller's, needed no longer */
    for (int i = 0; !status && i < r->index.num_tensors; i++) {
        status = ckpt_name_map_insert(&r->names, r->index.tensors[i].tensor.name, i, reader_name_of, r);
        if (status == TP_ERR_ARG) status = tp_fail_context(TP_ERR_FORMAT, "%s", index_path); /* a name twice */
    }
    if (!status) {
        r->files = calloc((size_t)r->index.num_files, sizeof *r->files);
        r->pieces = calloc((size_t)r->index.num_tensors + 1, sizeof *r->pieces);
        if (!r->files || !r->pieces) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    for (int f = 0; !status && f < r->index.num_files; f++) {
        file_runtime *fr = &r->files[f];
        fr->file = -1;
        store_stat st;
        status = tp_path_join(fr->path, r->path, r->index.files[f].name);
        if (!status && r->options.sizes_on_read && r->storage->expect_size) continue; /* see open_file_once */
        if (!status) status = r->storage->stat(r->storage, fr->path, &st);
        if (status) break;
        if (!st.exists)
            status = tp_fail(TP_ERR_NOT_FOUND, "%s: shard file missing: %s", fr->path, strerror(ENOENT));
        else if (st.size != r->index.files[f].bytes)
            status = tp_fail(TP_ERR_FORMAT, "%s: %lld bytes, the index records %lld (truncated or replaced?)", fr->path,
                             (long long)st.size, (long long)r->index.files[f].bytes);
        if (status && r->options.damaged_files_fail_pieces) { /* open_file fails its pieces with this */
            fr->open_status = status;
            fr->open_error = strdup(tp_errmsg());
            status = fr->open_error ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
        }
    }
    for (int f = status ? r->index.num_files : 0; f < r->index.num_files; f++) r->files[f].file = -1;
    for (int i = 0; !status && i < r->index.num_tensors; i++) {
        const ckpt_index_tensor *it = &r->index.tensors[i];
        r->pieces[i] = calloc((size_t)it->num_pieces, sizeof **r->pieces);
        if (!r->pieces[i]) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        for (int p = 0; !status && p < it->num_pieces; p++) {
            ckpt_piece_geometry_init(&r->pieces[i][p].geometry, &it->tensor.desc, r->index.layout.tp,
                                     it->block_rows);
            r->files[it->pieces[p].file_index].pieces++;
        }
    }
    if (status) {
        ckpt_reader_close(r);
        return status;
    }
    *out = r;
    return TP_OK;
}

int ckpt_read_index_text(const char *path, char **out)
{
    *out = NULL;
    const store_ops *storage;
    char index_path[CKPT_PATH_MAX];
    TP_TRY(ckpt_library_init());
    TP_TRY(store_for(path, &storage));
    TP_TRY(tp_path_join(index_path, path, CKPT_INDEX_NAME));
    return store_read_text(storage, index_path, CKPT_INDEX_MAX_BYTES, out, NULL);
}

const char *ckpt_reader_path(const ckpt_reader *r) { return r->path; }

int ckpt_reader_changed(const ckpt_reader *r, int *changed)
{
    *changed = 0;
    if (r->storage->local_paths || r->foreign) return TP_OK; /* a replacement waits for local readers */
    char index_path[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(index_path, r->path, CKPT_INDEX_NAME));
    char *text = NULL;
    int64_t size = 0;
    int status = store_read_text(r->storage, index_path, CKPT_INDEX_MAX_BYTES, &text, &size);
    if (status == TP_ERR_NOT_FOUND) { /* removed: a --force upload's first step */
        *changed = 1;
        return TP_OK;
    }
    TP_TRY(status);
    *changed = size != r->index_size || XXH64(text, (size_t)size, 0) != r->index_digest;
    free(text);
    return TP_OK;
}
const ckpt_layout *ckpt_reader_layout(const ckpt_reader *r) { return &r->index.layout; }
const ckpt_layout *ckpt_reader_saved_layout(const ckpt_reader *r) { return r->saved.tp ? &r->saved : &r->index.layout; }
const ckpt_train_state *ckpt_reader_state(const ckpt_reader *r) { return &r->index.state; }
int ckpt_reader_num_tensors(const ckpt_reader *r) { return r->index.num_tensors; }
int ckpt_reader_num_files(const ckpt_reader *r) { return r->index.num_files; }

void ckpt_reader_version(const ckpt_reader *r, int *major, int *minor)
{
    *major = r->index.major;
    *minor = r->index.minor;
}

const ckpt_tensor_desc *ckpt_reader_tensor(const ckpt_reader *r, int i)
{
    return i >= 0 && i < r->index.num_tensors ? &r->index.tensors[i].tensor.desc : NULL;
}

int ckpt_reader_find(const ckpt_reader *r, const char *name)
{
    return (int)ckpt_name_map_find(&r->names, name, reader_name_of, r);
}

int ckpt_reader_index_json(const ckpt_reader *r, char **out)
{
    return ckpt_index_to_json(&r->index, out);
}

const char *ckpt_reader_file(const ckpt_reader *r, int i, int64_t *bytes)
{
    if (i < 0 || i >= r->index.num_files) return NULL;
    if (bytes) *bytes = r->index.files[i].bytes;
    return r->index.files[i].name;
}

static int check_piece_arg(const ckpt_reader *r, int i, int piece)
{
    if (i < 0 || i >= r->index.num_tensors)
        return tp_fail(TP_ERR_ARG, "%s: tensor index %d out of range", r->path, i);
    if (piece < 0 || piece >= r->index.tensors[i].num_pieces)
        return tp_fail(TP_ERR_ARG, "%s: tensor %s has no piece %d", r->path,
                         r->index.tensors[i].tensor.name, piece);
    return TP_OK;
}

int ckpt_reader_piece_info(const ckpt_reader *r, int i, int piece, ckpt_piece_info *out)
{
    int status = check_piece_arg(r, i, piece);
    if (status) return status;
    const ckpt_index_piece *ip = &r->index.tensors[i].pieces[piece];
    out->file = ip->file;
    out->pp = ip->pp;
    out->tp = ip->tp;
    memcpy(out->shape, ip->shape, sizeof out->shape);
    out->bytes = ip->bytes;
    out->checksum = ip->checksum;
    out->digest = ip->digest;
    out->block_rows = r->index.tensors[i].block_rows;
    out->compressed = ip->compressed;
    return TP_OK;
}

uint64_t ckpt_reader_digest(const ckpt_reader *r, int i)
{
    return i >= 0 && i < r->index.num_tensors ? r->index.tensors[i].digest : 0;
}

/* ----------------------------------------------------- lazy piece loading */

static int open_file_once(ckpt_reader *r, int f);

static void hdf5_close(ckpt_reader *r, file_runtime *fr)
{
    H5Fclose(fr->file);
    fr->file = 0;
    r->hdf5_handles--;
}

/* Opens fr's file with HDF5, first closing the least recently used handle
 * of another file where HDF5_HANDLES_MAX are open. */
static hid_t hdf5_open(ckpt_reader *r, file_runtime *fr)
{
    if (r->hdf5_handles >= HDF5_HANDLES_MAX) {
        file_runtime *oldest = NULL;
        for (int f = 0; f < r->index.num_files; f++) {
            file_runtime *other = &r->files[f];
            if (other != fr && other->file > 0 && (!oldest || other->used_at < oldest->used_at)) oldest = other;
        }
        if (oldest) hdf5_close(r, oldest);
    }
    hid_t fapl = ckpt_h5_file_access();
    hid_t file = fapl >= 0 ? H5Fopen(fr->path, H5F_ACC_RDONLY, fapl) : -1;
    if (fapl >= 0) H5Pclose(fapl);
    return file;
}

/* A local checkpoint read through its index alone (ckpt_read_options
 * through_index): from format 1.3 on, where the index records every
 * piece's extents and block checksums' place (1.2), every file's metadata
 * checksum (1.1) and its own checksum (1.3). A file whose entry lacks the
 * metadata checksum is opened with HDF5 all the same. */
static int local_through_index(const ckpt_reader *r)
{
    return r->storage->local_paths && r->options.through_index &&
           (r->index.major > 1 || (r->index.major == 1 && r->index.minor >= 3));
}

/* Opens a shard file on first use. A damaged file fails every piece of it
 * with the same message, without being read again. */
static int open_file(ckpt_reader *r, int f)
{
    file_runtime *fr = &r->files[f];
    if (fr->file >= 0) return TP_OK;
    if (fr->open_status) return tp_fail(fr->open_status, "%s", fr->open_error ? fr->open_error : fr->path);
    int status = open_file_once(r, f);
    if (status && status != TP_ERR_IO && status != TP_ERR_NOMEM) { /* those may pass: tried again */
        fr->open_status = status;
        fr->open_error = strdup(tp_errmsg());
    }
    return status;
}

/* The file's metadata checksum against the index's (format 1.1): every
 * byte outside the pieces' data, read plainly (ckpt_shard_meta_checksum). */
static int check_file_metadata(ckpt_reader *r, int f)
{
    file_runtime *fr = &r->files[f];
    const ckpt_index_file *idx = &r->index.files[f];
    uint64_t sum = 0;
    TP_TRY(ckpt_shard_meta_checksum(r->storage, fr->path, &r->index, f, &sum));
    if (sum != idx->meta_checksum)
        return tp_fail(TP_ERR_CHECKSUM, "%s: metadata damaged (checksum %016llx, index says %016llx)", fr->path,
                       (unsigned long long)sum, (unsigned long long)idx->meta_checksum);
    fr->meta_checked = 1;
    return TP_OK;
}

static int open_file_once(ckpt_reader *r, int f)
{
    file_runtime *fr = &r->files[f];
    if (r->foreign) { /* no HDF5 metadata: the bytes only, of the version the source was read from */
        TP_TRY(tp_refuse_special(fr->path));
        TP_TRY(r->storage->open(r->storage, fr->path, STORE_OPEN_READ, &fr->data));
        int status = store_file_pin(r->storage, fr->data, fr->version);
        if (status) {
            r->storage->close(fr->data);
            fr->data = NULL;
            return status;
        }
        fr->file = 0;
        return TP_OK;
    }
    if (!r->storage->local_paths) { /* everything comes from the index */
        if (r->index.major == 1 && r->index.minor < 2)
            return tp_fail(TP_ERR_VERSION, "%s: format %d.%d records no block checksum offsets; reading it from "
                           "an object store needs format 1.2 (reshard or copy it locally)", fr->path,
                           r->index.major, r->index.minor);
        TP_TRY(r->storage->open(r->storage, fr->path, STORE_OPEN_READ, &fr->data));
        int status = r->storage->expect_size
                         ? r->storage->expect_size(fr->data, r->index.files[f].bytes, "the index records")
                         : TP_OK;
        /* Reads from a store never parse the metadata: checked only when
         * asked (verify), a ranged read per gap between the data extents. */
        if (!status && r->options.check_metadata && r->index.files[f].has_meta_checksum) {
            status = check_file_metadata(r, f);
            /* A request that failed names its URL, not the file it was for. */
            if (status && status != TP_ERR_CHECKSUM && status != TP_ERR_NOT_FOUND)
                tp_fail_context(status, "%s: reading its metadata", fr->path);
        }
        if (status) {
            r->storage->close(fr->data);
            fr->data = NULL;
            return status;
        }
        fr->file = 0; /* opened: no HDF5 handle */
        return TP_OK;
    }
    TP_TRY(tp_refuse_special(fr->path)); /* HDF5 would block on a FIFO */
    const ckpt_index_file *idx = &r->index.files[f];
    /* Checked with plain reads before libhdf5 parses anything of the file:
     * libhdf5 crashes on some damaged metadata (issue 11). */
    if (idx->has_meta_checksum) TP_TRY(check_file_metadata(r, f));
    if (fr->meta_checked && local_through_index(r)) { /* byte for byte the file the index describes */
        TP_TRY(r->storage->open(r->storage, fr->path, STORE_OPEN_READ, &fr->data));
        fr->through_index = 1;
        fr->file = 0;
        return TP_OK;
    }
    hid_t file = hdf5_open(r, fr);
    if (file < 0) return ckpt_fail_hdf5("%s: cannot open shard file (damaged?)", fr->path);
    int64_t version[2] = {0, 0}, coords[2] = {-1, -1}, complete = 0, dp = 0; /* shard_dp: 1.6 data-parallel files only */
    int n = 0;
    /* A file whose metadata matched the index's checksum is the one the
     * commit scanned (links included); older ones are checked here. Only
     * integer attributes are read: the string `format` was variable-length
     * in format 1.0, which libhdf5 follows into the file's global heap. */
    int status = ckpt_h5_read_i64s(file, "format_version", version, 2, &n);
    if (!status) status = ckpt_h5_read_i64s(file, "shard_pp_tp", coords, 2, &n);
    if (!status) status = ckpt_h5_read_i64s(file, "complete", &complete, 1, NULL);
    if (!status) status = ckpt_h5_read_optional_i64(file, "shard_dp", &dp, NULL);
    if (status) status = tp_fail_context(TP_ERR_FORMAT, "%s", fr->path);
    else if (version[0] > CKPT_FORMAT_MAJOR)
        status = tp_fail(TP_ERR_VERSION,
                           "%s: format version %lld.%lld is newer than this build reads (%d.x)",
                           fr->path, (long long)version[0], (long long)version[1], CKPT_FORMAT_MAJOR);
    else if (coords[0] != idx->pp || coords[1] != idx->tp || dp != idx->dp || complete != 1)
        status = tp_fail(TP_ERR_FORMAT, "%s: shard pp=%lld tp=%lld dp=%lld complete=%lld, the index "
                           "expects pp=%d tp=%d dp=%d complete=1",
                           fr->path, (long long)coords[0], (long long)coords[1], (long long)dp,
                           (long long)complete, idx->pp, idx->tp, idx->dp);
    if (!status) status = ckpt_shard_layout_check(file, &r->index.layout, fr->path);
    if (!status && !fr->meta_checked) status = ckpt_h5_check_links(file, fr->path);
    if (!status) status = r->storage->open(r->storage, fr->path, STORE_OPEN_READ, &fr->data);
    if (status) {
        H5Fclose(file);
        return status;
    }
    fr->file = file;
    r->hdf5_handles++;
    return TP_OK;
}

/* Finds every chunk of a compressed piece (address, size, skipped filters)
 * after checking the pipeline is shuffle then zstd, one chunk per block. */
static int locate_chunks(hid_t dset, piece_runtime *pr, const char *where)
{
    const ckpt_piece_geometry *g = &pr->geometry;
    pr->chunks = calloc((size_t)g->num_blocks, sizeof *pr->chunks);
    if (!pr->chunks) return tp_fail(TP_ERR_NOMEM, "out of memory");
    hid_t dcpl = H5Dget_create_plist(dset);
    int num_filters = dcpl >= 0 ? H5Pget_nfilters(dcpl) : -1;
    H5Z_filter_t ids[2] = {-1, -1};
    for (int k = 0; k < num_filters && k < 2; k++) {
        unsigned flags, values[8];
        size_t num_values = 8;
        ids[k] = H5Pget_filter2(dcpl, (unsigned)k, &flags, &num_values, values, 0, NULL, NULL);
    }
    hsize_t chunk_dims[CKPT_MAX_DIMS];
    int chunk_ndim = dcpl >= 0 ? H5Pget_chunk(dcpl, CKPT_MAX_DIMS, chunk_dims) : -1;
    if (dcpl >= 0) H5Pclose(dcpl);
    if (num_filters != 2 || ids[0] != H5Z_FILTER_SHUFFLE || ids[1] != CKPT_ZSTD_FILTER_ID ||
        chunk_ndim != g->ndim || (int64_t)chunk_dims[0] != g->block_rows)
        return tp_fail(TP_ERR_FORMAT, "%s: chunked tensor without the shuffle and zstd filters "
                         "and one chunk per checksum block", where);
    for (int d = 1; d < g->ndim; d++)
        if ((int64_t)chunk_dims[d] != g->shape[d])
            return tp_fail(TP_ERR_FORMAT, "%s: chunks do not span whole rows", where);
    for (int64_t b = 0; b < g->num_blocks; b++) {
        uint64_t address, size;
        unsigned mask;
        TP_TRY(ckpt_h5_chunk_location(dset, b, g->block_rows, where, &address, &size, &mask));
        pr->chunks[b] = (chunk_location){address, size, mask};
    }
    return TP_OK;
}

static int fetch_piece_from_index(ckpt_reader *r, int i, int piece, piece_runtime *pr);

/* The end of loading a piece whose block checksums are read (unless
 * status already failed): they must hash to the index's piece checksum;
 * on failure what was loaded is released. */
static int finish_piece(piece_runtime *pr, const ckpt_index_piece *ip, int status, const char *where)
{
    if (!status && ckpt_hash_blocks(pr->block_hash, pr->geometry.num_blocks) != ip->checksum)
        status = tp_fail(TP_ERR_CHECKSUM, "%s: block checksum list does not match the piece checksum", where);
    if (status) {
        free(pr->block_hash);
        free(pr->chunks);
        pr->block_hash = NULL;
        pr->chunks = NULL;
        return status;
    }
    pr->loaded = 1;
    return TP_OK;
}

/* Reads a piece's block checksums at the offset the index records (format
 * 1.2), for stores HDF5 cannot open: its data lies where the extents say.
 * Called and returning with r->lock held, which it lets go during the
 * request: a remote read takes a round trip, and other threads' pieces
 * should not queue behind it. The first thread to finish installs. */
static int load_piece_from_index(ckpt_reader *r, int i, int piece, piece_runtime *shared)
{
    piece_runtime fetched = *shared, *pr = &fetched;
    pthread_mutex_unlock(&r->lock);
    int status = fetch_piece_from_index(r, i, piece, pr);
    pthread_mutex_lock(&r->lock);
    if (status || shared->loaded) { /* failed, or another thread was first */
        if (!status) {
            free(fetched.chunks);
            free(fetched.block_hash);
        }
        return status;
    }
    *shared = fetched;
    return TP_OK;
}

static int fetch_piece_from_index(ckpt_reader *r, int i, int piece, piece_runtime *pr)
{
    const ckpt_index_tensor *it = &r->index.tensors[i];
    const ckpt_index_piece *ip = &it->pieces[piece];
    file_runtime *fr = &r->files[ip->file_index];
    const ckpt_piece_geometry *g = &pr->geometry;
    char where[CKPT_PATH_MAX + CKPT_NAME_MAX + 32];
    snprintf(where, sizeof where, "%s: tensor %s piece %d", fr->path, it->tensor.desc.name, piece);
    if (ip->num_extents == 0 || ip->checksums_at <= 0)
        return tp_fail(TP_ERR_FORMAT, "%s: the index records no storage offsets", where);
    const ckpt_index_file *fi = &r->index.files[ip->file_index];
    if (ip->checksums_at + 8 * g->num_blocks > fi->bytes)
        return tp_fail(TP_ERR_FORMAT, "%s: block checksums lie outside the file", where);
    if (ip->compressed) {
        pr->chunks = calloc((size_t)g->num_blocks, sizeof *pr->chunks);
        if (!pr->chunks) return tp_fail(TP_ERR_NOMEM, "out of memory");
        for (int64_t b = 0; b < g->num_blocks; b++)
            pr->chunks[b] = (chunk_location){(uint64_t)ip->extents[b].offset, (uint64_t)ip->extents[b].length,
                                             ip->extents[b].filter_mask};
    } else {
        pr->offset = ip->extents[0].offset;
    }
    /* Stored little-endian, read as they are: hosts are (internal.h). */
    pr->block_hash = calloc((size_t)g->num_blocks, sizeof *pr->block_hash);
    size_t bytes = (size_t)g->num_blocks * sizeof *pr->block_hash;
    int status = !pr->block_hash ? tp_fail(TP_ERR_NOMEM, "out of memory")
                                 : r->storage->read_at(fr->data, pr->block_hash, bytes, ip->checksums_at);
    if (status && status != TP_ERR_NOMEM) status = tp_fail_context(status, "%s", where);
    return finish_piece(pr, ip, status, where);
}

/* Opens a piece's dataset, checks it against the index and locates its data. */
static int load_piece_locked(ckpt_reader *r, int i, int piece, piece_runtime *pr)
{
    const ckpt_index_tensor *it = &r->index.tensors[i];
    const ckpt_index_piece *ip = &it->pieces[piece];
    const ckpt_tensor_desc *t = &it->tensor.desc;
    int status = open_file(r, ip->file_index);
    if (status) return status;
    if (r->foreign) { /* stored whole at the recorded offset, or as boxes; no checksums */
        for (int64_t b = 0; b < pr->num_boxes && !status; b++) status = open_file(r, pr->boxes[b].file);
        if (status) return status;
        pr->offset = pr->boxes ? 0 : ip->extents[0].offset;
        pr->loaded = 1;
        return TP_OK;
    }
    file_runtime *fr = &r->files[ip->file_index];
    if (!r->storage->local_paths || fr->through_index) return load_piece_from_index(r, i, piece, pr);
    /* No handle here, with a piece still to load: closed to make room. The
     * same file (held by this reader's lock), checked at its first open. */
    if (fr->file == 0) {
        hid_t file = hdf5_open(r, fr);
        if (file < 0) return ckpt_fail_hdf5("%s: cannot open shard file again", fr->path);
        fr->file = file;
        r->hdf5_handles++;
    }
    fr->used_at = ++r->hdf5_clock;
    char where[CKPT_PATH_MAX + CKPT_NAME_MAX + 32], path[CKPT_NAME_MAX + 32];
    snprintf(where, sizeof where, "%s: tensor %s piece %d", fr->path, t->name, piece);
    snprintf(path, sizeof path, "/%s/%s", CKPT_TENSOR_GROUP, t->name);
    hid_t lapl = ckpt_h5_link_access();
    hid_t dset = lapl >= 0 ? H5Dopen2(fr->file, path, lapl) : -1;
    if (dset < 0) {
        if (lapl >= 0) H5Pclose(lapl);
        return ckpt_fail_hdf5("%s: dataset missing or damaged", where);
    }
    /* The piece's description comes from the index only: no attribute of the
     * dataset is read here. Damaged variable-length string attributes (all
     * strings of format 1.0) crashed or hung libhdf5 (issue 11), and the
     * data is checked against the index's checksum through the block
     * checksums anyway. Files of format 1.1 are tied to the index as a
     * whole by their metadata checksum, checked when the file was opened. */
    status = ckpt_h5_check_dataset_storage(dset, where);
    const ckpt_piece_geometry *g = &pr->geometry;
    if (!status) {
        int shape_ok, type_ok;
        ckpt_h5_dataset_form(dset, g, t->dtype, &shape_ok, &type_ok);
        if (!shape_ok || !type_ok)
            status = tp_fail(TP_ERR_FORMAT, "%s: dataset shape or type disagrees with the index", where);
    }
    if (!status) {
        hid_t dcpl = H5Dget_create_plist(dset);
        H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
        if (dcpl >= 0) H5Pclose(dcpl);
        if ((layout == H5D_CHUNKED) != (ip->compressed != 0))
            status = tp_fail(TP_ERR_FORMAT, "%s: storage layout disagrees with the index", where);
        else if (layout == H5D_CHUNKED) {
            status = locate_chunks(dset, pr, where);
            for (int64_t b = 0; !status && ip->num_extents && b < g->num_blocks; b++)
                if (ip->extents[b].offset != (int64_t)pr->chunks[b].address ||
                    ip->extents[b].length != (int64_t)pr->chunks[b].size ||
                    ip->extents[b].filter_mask != pr->chunks[b].filter_mask)
                    status = tp_fail(TP_ERR_FORMAT, "%s: chunk %lld lies elsewhere than the index says",
                                     where, (long long)b);
        }
        else if (layout == H5D_CONTIGUOUS) {
            haddr_t offset = H5Dget_offset(dset);
            const ckpt_index_file *fi = &r->index.files[ip->file_index];
            if (offset == HADDR_UNDEF || (int64_t)offset + g->bytes > fi->bytes)
                status = tp_fail(TP_ERR_FORMAT, "%s: data lies outside the file", where);
            else if (ip->num_extents && ip->extents[0].offset != (int64_t)offset)
                status = tp_fail(TP_ERR_FORMAT, "%s: data at offset %lld, the index says %lld", where,
                                 (long long)offset, (long long)ip->extents[0].offset);
            pr->offset = (int64_t)offset;
        } else
            status = tp_fail(TP_ERR_FORMAT, "%s: unexpected storage layout", where);
    }
    H5Dclose(dset);
    if (status) {
        H5Pclose(lapl);
        free(pr->chunks);
        pr->chunks = NULL;
        return status;
    }

    pr->block_hash = calloc((size_t)g->num_blocks, sizeof *pr->block_hash);
    if (!pr->block_hash) return tp_fail(TP_ERR_NOMEM, "out of memory");
    snprintf(path, sizeof path, "/%s/%s", CKPT_CHECKSUM_GROUP, t->name);
    hid_t sums = H5Dopen2(fr->file, path, lapl);
    H5Pclose(lapl);
    if (sums >= 0 && !fr->meta_checked) {
        status = ckpt_h5_check_dataset_storage(sums, where);
        if (status) {
            H5Dclose(sums);
            free(pr->block_hash);
            free(pr->chunks);
            pr->block_hash = NULL;
            pr->chunks = NULL;
            return status;
        }
    }
    hid_t space = sums >= 0 ? H5Dget_space(sums) : -1;
    hssize_t count = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    if (space >= 0) H5Sclose(space);
    if (sums < 0 || count != g->num_blocks ||
        H5Dread(sums, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, pr->block_hash) < 0)
        status = ckpt_fail_hdf5("%s: block checksums missing or damaged", where);
    /* Readers from an object store take the block checksums at the index's
     * checksums_at without HDF5: a checkpoint that verifies here must read
     * there alike, so that field is checked against the file too. */
    if (!status && ip->checksums_at > 0) {
        haddr_t at = H5Dget_offset(sums);
        if (at == HADDR_UNDEF || (int64_t)at != ip->checksums_at)
            status = tp_fail(TP_ERR_FORMAT, "%s: block checksums at offset %lld, the index says %lld", where,
                             at == HADDR_UNDEF ? -1LL : (long long)at, (long long)ip->checksums_at);
    }
    if (sums >= 0) H5Dclose(sums);
    status = finish_piece(pr, ip, status, where);
    if (!status && ++fr->pieces_loaded == fr->pieces) hdf5_close(r, fr); /* HDF5 has nothing more to find */
    return status;
}

static int load_piece(ckpt_reader *r, int i, int piece, piece_runtime **out)
{
    int status = ckpt_library_init();
    if (!status) status = check_piece_arg(r, i, piece);
    if (status) return status;
    piece_runtime *pr = &r->pieces[i][piece];
    pthread_mutex_lock(&r->lock);
    if (!pr->loaded) status = load_piece_locked(r, i, piece, pr);
    pthread_mutex_unlock(&r->lock);
    *out = pr;
    return status;
}

/* ----------------------------------------------------------- data access */

typedef struct {
    ckpt_reader *r;
    int tensor, piece;
    piece_runtime *pr;
    const store_ops *storage;
    store_file *file;
    int file_index;
    const char *file_path;
} piece_ctx;

static int piece_context(ckpt_reader *r, int i, int piece, piece_ctx *ctx)
{
    int status = load_piece(r, i, piece, &ctx->pr);
    if (status) return status;
    const ckpt_index_piece *ip = &r->index.tensors[i].pieces[piece];
    ctx->r = r;
    ctx->tensor = i;
    ctx->piece = piece;
    ctx->storage = r->storage;
    ctx->file = r->files[ip->file_index].data;
    ctx->file_index = ip->file_index;
    if (r->recorded_digests) atomic_store_explicit(&ctx->pr->read, 1, memory_order_relaxed);
    ctx->file_path = r->files[ip->file_index].path;
    return TP_OK;
}

static int64_t block_row_count(const ckpt_piece_geometry *g, int64_t b)
{
    int64_t rows = g->rows - b * g->block_rows;
    return rows < g->block_rows ? rows : g->block_rows;
}

static int verify_block(const piece_ctx *c, int64_t b, const void *data)
{
    const ckpt_piece_geometry *g = &c->pr->geometry;
    int64_t rows = block_row_count(g, b);
    uint64_t got = ckpt_hash_block(data, (size_t)(rows * g->row_bytes));
    if (got == c->pr->block_hash[b]) return TP_OK;
    return tp_fail(TP_ERR_CHECKSUM,
                     "%s: tensor %s piece %d rows %lld..%lld: checksum %016llx, expected %016llx "
                     "(data damaged)",
                     c->file_path, c->r->index.tensors[c->tensor].tensor.name, c->piece,
                     (long long)(b * g->block_rows), (long long)(b * g->block_rows + rows - 1),
                     (unsigned long long)got, (unsigned long long)c->pr->block_hash[b]);
}

/* Bytes of file f of the reader into buf: a foreign file's then go to the
 * checks of the checksums it records (foreign_check.c). */
static int read_data(ckpt_reader *r, int f, void *buf, size_t size, int64_t offset)
{
    int status = r->storage->read_at(r->files[f].data, buf, size, offset);
    if (!status && r->checks) status = foreign_checks_note(r->checks, f, offset, buf, (int64_t)size);
    return status;
}

/* Reads block b of a compressed piece: its rows into dst (block_row_count rows).
 * scratch holds scratch_bytes(): a full chunk, then its compressed bound. */
static int read_chunk(const piece_ctx *c, int64_t b, char *dst, char *scratch)
{
    const ckpt_piece_geometry *g = &c->pr->geometry;
    const chunk_location *loc = &c->pr->chunks[b];
    const char *name = c->r->index.tensors[c->tensor].tensor.name;
    size_t chunk_bytes = (size_t)(g->block_rows * g->row_bytes);
    size_t rows_bytes = (size_t)(block_row_count(g, b) * g->row_bytes);
    size_t element_size = tp_dtype_size(c->r->index.tensors[c->tensor].tensor.desc.dtype);
    int shuffled = !(loc->filter_mask & CKPT_MASK_NO_SHUFFLE), zstd = !(loc->filter_mask & CKPT_MASK_NO_ZSTD);
    if (loc->size > ckpt_zstd_bound(chunk_bytes) || (!zstd && loc->size != chunk_bytes))
        return tp_fail(TP_ERR_FORMAT, "%s: tensor %s chunk %lld has an impossible size %llu",
                         c->file_path, name, (long long)b, (unsigned long long)loc->size);
    char *packed = scratch + chunk_bytes;
    int status = c->storage->read_at(c->file, packed, loc->size, (int64_t)loc->address);
    if (status) return status;
    /* Stages in reverse: zstd, then unshuffle; whole blocks land straight in dst. */
    const char *plain = packed;
    if (zstd) {
        char *out = !shuffled && rows_bytes == chunk_bytes ? dst : scratch;
        status = ckpt_zstd_decompress(packed, loc->size, out, chunk_bytes);
        if (status) return tp_fail_context(status, "%s: tensor %s chunk %lld", c->file_path, name, (long long)b);
        plain = out;
    }
    if (shuffled) {
        if (rows_bytes == chunk_bytes) {
            ckpt_unshuffle(plain, dst, chunk_bytes, element_size);
            return TP_OK;
        }
        char *out = plain == scratch ? packed : scratch; /* the other buffer */
        ckpt_unshuffle(plain, out, chunk_bytes, element_size);
        plain = out;
    }
    if (plain != dst) memcpy(dst, plain, rows_bytes);
    return TP_OK;
}

static size_t scratch_bytes(const ckpt_piece_geometry *g)
{
    size_t chunk = (size_t)(g->block_rows * g->row_bytes);
    return chunk + ckpt_zstd_bound(chunk);
}

static int read_box_rows(const piece_ctx *c, int64_t row0, int64_t row1, char *dst);

/* Reads blocks [b0, b1) into dst (their rows, contiguous), verifying each
 * when asked. scratch: scratch_bytes() for compressed pieces, else unused. */
static int read_blocks(const piece_ctx *c, int64_t b0, int64_t b1, char *dst, char *scratch,
                       int verify)
{
    const ckpt_piece_geometry *g = &c->pr->geometry;
    int64_t block_bytes = g->block_rows * g->row_bytes;
    int status = TP_OK;
    if (c->pr->boxes) { /* foreign: nothing to verify */
        int64_t row1 = b1 * g->block_rows < g->rows ? b1 * g->block_rows : g->rows;
        return read_box_rows(c, b0 * g->block_rows, row1, dst);
    }
    if (c->pr->chunks) {
        for (int64_t b = b0; b < b1 && !status; b++) {
            char *out = dst + (b - b0) * block_bytes;
            status = read_chunk(c, b, out, scratch);
            if (!status && verify) status = verify_block(c, b, out);
        }
        return status;
    }
    /* Reads of up to VERIFY_READ_MAX, each hashed right after it arrives,
     * while it is still in the cache: large enough to keep the disk busy,
     * small enough to stay in L3. */
    int64_t per_read = verify ? VERIFY_READ_MAX / block_bytes : b1 - b0;
    if (per_read < 1) per_read = 1;
    for (int64_t b = b0; b < b1 && !status; b += per_read) {
        int64_t end = b + per_read < b1 ? b + per_read : b1;
        int64_t row_end = end * g->block_rows < g->rows ? end * g->block_rows : g->rows;
        char *out = dst + (b - b0) * block_bytes;
        status = read_data(c->r, c->file_index, out, (size_t)((row_end - b * g->block_rows) * g->row_bytes),
                           c->pr->offset + b * block_bytes);
        for (int64_t k = b; k < end && !status && verify; k++)
            status = verify_block(c, k, out + (k - b) * block_bytes);
    }
    return status;
}

/* A box inside a dense row-major array. */
typedef struct {
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];  /* of the whole array */
    int64_t origin[CKPT_MAX_DIMS]; /* of the box */
} box_frame;

/* Calls emit(src_offset, dst_offset, bytes) for every maximal run that is
 * contiguous in both frames, for a box of extents count. Offsets in bytes. */
typedef int (*run_fn)(void *ctx, int64_t src_offset, int64_t dst_offset, int64_t bytes);

/* Bytes of the longest run contiguous in both frames: the innermost extent
 * and every trailing dimension whole in both. *inner_out is the outermost
 * dimension the run spans. */
static int64_t common_run_bytes(const int64_t *src_shape, const int64_t *dst_shape, const int64_t *count,
                                int ndim, int64_t elem_size, int *inner_out)
{
    int inner = ndim - 1;
    int64_t run = count[inner] * elem_size;
    while (inner > 0 && count[inner] == src_shape[inner] && count[inner] == dst_shape[inner]) {
        inner--;
        run *= count[inner];
    }
    *inner_out = inner;
    return run;
}

static int box_runs(const box_frame *src, const box_frame *dst, const int64_t *count, int ndim,
                    int64_t elem_size, run_fn emit, void *ctx)
{
    int inner;
    int64_t run = common_run_bytes(src->shape, dst->shape, count, ndim, elem_size, &inner);
    int64_t src_stride[CKPT_MAX_DIMS], dst_stride[CKPT_MAX_DIMS];
    src_stride[ndim - 1] = dst_stride[ndim - 1] = elem_size;
    for (int d = ndim - 2; d >= 0; d--) {
        src_stride[d] = src_stride[d + 1] * src->shape[d + 1];
        dst_stride[d] = dst_stride[d + 1] * dst->shape[d + 1];
    }
    int64_t idx[CKPT_MAX_DIMS] = {0};
    for (;;) {
        int64_t so = 0, dof = 0;
        for (int d = 0; d < ndim; d++) {
            int64_t i = d < inner ? idx[d] : 0;
            so += (src->origin[d] + i) * src_stride[d];
            dof += (dst->origin[d] + i) * dst_stride[d];
        }
        int status = emit(ctx, so, dof, run);
        if (status) return status;
        int d = inner - 1;
        while (d >= 0 && ++idx[d] == count[d]) idx[d--] = 0;
        if (d < 0) return TP_OK;
    }
}

typedef struct {
    const char *src;
    char *dst;
} copy_ctx;

static int copy_run(void *ctx, int64_t so, int64_t dof, int64_t bytes)
{
    copy_ctx *c = ctx;
    memcpy(c->dst + dof, c->src + so, (size_t)bytes);
    return TP_OK;
}

typedef struct {
    const piece_ctx *piece;
    char *dst;
} pread_ctx;

static int pread_run(void *ctx, int64_t so, int64_t dof, int64_t bytes)
{
    pread_ctx *c = ctx;
    return read_data(c->piece->r, c->piece->file_index, c->dst + dof, (size_t)bytes, c->piece->pr->offset + so);
}

/* ------------------------------------------------ pieces stored as boxes */

/* Bytes of a foreign box's rows read at once through the bounce buffer. */
#define BOX_BOUNCE_MAX ((int64_t)8 << 20)

static int zero_run(void *ctx, int64_t src_offset, int64_t dst_offset, int64_t bytes)
{
    (void)src_offset;
    memset((char *)ctx + dst_offset, 0, (size_t)bytes);
    return TP_OK;
}

typedef struct {
    ckpt_reader *r;
    int file;
    int64_t base; /* the box's offset in the file */
    char *dst;
} box_pread_ctx;

static int box_pread_run(void *ctx, int64_t so, int64_t dof, int64_t bytes)
{
    box_pread_ctx *c = ctx;
    return read_data(c->r, c->file, c->dst + dof, (size_t)bytes, c->base + so);
}

static int64_t element_bytes(const ckpt_piece_geometry *g)
{
    int64_t elem = g->row_bytes;
    for (int d = 1; d < g->ndim; d++) elem /= g->shape[d];
    return elem;
}

/* ------------------------------------------ boxes stored in another order */

/* Copies count elements of elem bytes from src, stride src_stride bytes
 * apart, to dst, one after another (the usual sizes as fixed moves). */
static void gather_elements(char *dst, const char *src, int64_t src_stride, int64_t count, int64_t elem)
{
#define GATHER(size)                                                                                                   \
    for (int64_t k = 0; k < count; k++) memcpy(dst + k * (size), src + k * src_stride, (size));                        \
    break
    switch (elem) {
    case 1: GATHER(1);
    case 2: GATHER(2);
    case 4: GATHER(4);
    case 8: GATHER(8);
    case 16: GATHER(16);
    default: GATHER(elem);
    }
#undef GATHER
}

/* Elements of a tile's side in permuted_copy: a 32 x 32 tile of 8-byte
 * elements is 8 KiB read and 8 KiB written, in L1. */
#define PERMUTE_TILE 32

/* Copies the box of extents n (logical dimensions) from src to dst, each
 * addressed by byte strides per logical dimension: dst's row-major (its
 * dimension ndim - 1 innermost), src's those of an order whose innermost
 * dimension is src_inner. Where the two innermost differ (a transpose),
 * their plane is copied in tiles of PERMUTE_TILE x PERMUTE_TILE, so that
 * the lines a tile reads and writes stay in cache: copied a column at a
 * time, every element written touched another cache line (with a read per
 * column, the 12.5x a transposed [4096, 4096] chunk took against its
 * contiguous copy; docs/BENCHMARKS.md, bench-dcp-strided). */
static void permuted_copy(const char *src, const int64_t *src_stride, char *dst, const int64_t *dst_stride,
                          const int64_t *n, int ndim, int src_inner, int64_t elem)
{
    int a = ndim - 1, b = src_inner; /* dst's innermost, src's */
    int64_t idx[CKPT_MAX_DIMS] = {0};
    for (;;) {
        const char *s0 = src;
        char *d0 = dst;
        for (int d = 0; d < ndim; d++)
            if (d != a && d != b) {
                s0 += idx[d] * src_stride[d];
                d0 += idx[d] * dst_stride[d];
            }
        if (a == b) memcpy(d0, s0, (size_t)(n[a] * elem)); /* contiguous in both */
        else
            for (int64_t i0 = 0; i0 < n[b]; i0 += PERMUTE_TILE)
                for (int64_t j0 = 0; j0 < n[a]; j0 += PERMUTE_TILE) {
                    int64_t i1 = i0 + PERMUTE_TILE < n[b] ? i0 + PERMUTE_TILE : n[b];
                    int64_t j1 = j0 + PERMUTE_TILE < n[a] ? j0 + PERMUTE_TILE : n[a];
                    for (int64_t i = i0; i < i1; i++)
                        gather_elements(d0 + i * dst_stride[b] + j0 * elem, s0 + i * src_stride[b] + j0 * src_stride[a],
                                        src_stride[a], j1 - j0, elem);
                }
        int d = ndim - 1;
        for (; d >= 0; d--) {
            if (d == a || d == b) continue;
            if (++idx[d] < n[d]) break;
            idx[d] = 0;
        }
        if (d < 0) return;
    }
}

/* Bytes read at once from a box stored in another order may exceed the
 * bytes it gives by this factor (the parts of its stored runs the region
 * does not need, read over instead of stepped over one read a run). */
#define PERMUTED_SPAN_WASTE 4

/* Reads the region [lo, lo + n) (the piece's coordinates) of box b, stored
 * dense in b->order, into dst at frame `at` (origin: where lo lands). The
 * region, in the box's stored order, is read in slabs along one stored
 * dimension `axis`: one index of each dimension outside it, a group of
 * indices along it, all the region needs of the dimensions inside it,
 * axis the outermost whose inner part fits BOX_BOUNCE_MAX (a transposed
 * [R, C] box: a group of its C stored columns). A slab is read whole, the
 * bytes from its first element needed to its last (at most
 * PERMUTED_SPAN_WASTE times what it gives), or else one read per run it
 * needs, packed; then permuted into dst by permuted_copy. Its buffer is
 * the bounce buffer of the row-major boxes, at most BOX_BOUNCE_MAX and
 * the piece's bytes: what ckpt_reader_verify_thread_bytes accounts a
 * thread of a foreign reader. */
static int read_permuted_box(const piece_ctx *c, const ckpt_foreign_box *b, const int64_t *lo, const int64_t *n, char *dst,
                             const box_frame *at, int64_t elem)
{
    int ndim = c->pr->geometry.ndim;
    const int *o = b->order;
    /* Stored order: the box's shape, the region's start and extents, byte strides. */
    int64_t shape[CKPT_MAX_DIMS], s_lo[CKPT_MAX_DIMS], s_n[CKPT_MAX_DIMS], s_stride[CKPT_MAX_DIMS];
    for (int j = 0; j < ndim; j++) {
        shape[j] = b->count[o[j]];
        s_lo[j] = lo[o[j]] - b->start[o[j]];
        s_n[j] = n[o[j]];
    }
    s_stride[ndim - 1] = elem;
    for (int j = ndim - 2; j >= 0; j--) s_stride[j] = s_stride[j + 1] * shape[j + 1];
    /* dst's byte strides per logical dimension, and the region's first element there. */
    int64_t d_stride[CKPT_MAX_DIMS];
    d_stride[ndim - 1] = elem;
    for (int d = ndim - 2; d >= 0; d--) d_stride[d] = d_stride[d + 1] * at->shape[d + 1];
    char *dst0 = dst;
    for (int d = 0; d < ndim; d++) dst0 += at->origin[d] * d_stride[d];
    /* The slab axis, the bytes one index of it needs and spans in the file. */
    int64_t cap = c->pr->geometry.bytes < BOX_BOUNCE_MAX ? c->pr->geometry.bytes : BOX_BOUNCE_MAX;
    int axis = ndim - 1;
    int64_t inner_needed = elem;
    while (axis > 0 && inner_needed * s_n[axis] <= cap) inner_needed *= s_n[axis--];
    int64_t inner_span = elem;
    for (int j = axis + 1; j < ndim; j++) inner_span += (s_n[j] - 1) * s_stride[j];
    char *bounce = (char *)scratch_buffer(SCRATCH_BOUNCE, (size_t)cap);
    if (!bounce) return tp_fail(TP_ERR_NOMEM, "out of memory for a %lld-byte read buffer", (long long)cap);
    int64_t idx[CKPT_MAX_DIMS] = {0}; /* along the stored dimensions outside axis */
    int status = TP_OK;
    for (;;) {
        for (int64_t r = 0; r < s_n[axis] && !status;) {
            int64_t left = s_n[axis] - r;
            /* The slab's first element, in the box's bytes and in dst. */
            int64_t base = (s_lo[axis] + r) * s_stride[axis];
            char *to = dst0 + r * d_stride[o[axis]];
            for (int j = 0; j < ndim; j++) {
                if (j < axis) {
                    base += (s_lo[j] + idx[j]) * s_stride[j];
                    to += idx[j] * d_stride[o[j]];
                } else if (j > axis) base += s_lo[j] * s_stride[j];
            }
            int64_t group = inner_span <= cap ? 1 + (cap - inner_span) / s_stride[axis] : 0;
            if (group > left) group = left;
            int64_t span = (group - 1) * s_stride[axis] + inner_span;
            int64_t counts[CKPT_MAX_DIMS], src_stride[CKPT_MAX_DIMS]; /* per logical dimension */
            if (group > 0 && span <= PERMUTED_SPAN_WASTE * group * inner_needed) { /* the slab's bytes whole */
                status = read_data(c->r, b->file, bounce, (size_t)span, b->offset + base);
                for (int j = 0; j < ndim; j++) src_stride[o[j]] = s_stride[j];
            } else { /* its runs, packed: [group, s_n[axis + 1], ...] */
                group = cap / inner_needed < left ? cap / inner_needed : left;
                box_frame file = {ndim, {0}, {0}}, packed = {ndim, {0}, {0}};
                int64_t sub[CKPT_MAX_DIMS];
                for (int j = 0; j < ndim; j++) {
                    file.shape[j] = shape[j];
                    file.origin[j] = s_lo[j] + (j < axis ? idx[j] : j == axis ? r : 0);
                    packed.shape[j] = sub[j] = j < axis ? 1 : j == axis ? group : s_n[j];
                }
                box_pread_ctx pc = {c->r, b->file, b->offset, bounce};
                status = box_runs(&file, &packed, sub, ndim, elem, box_pread_run, &pc);
                int64_t stride = elem;
                for (int j = ndim - 1; j >= 0; j--) {
                    src_stride[o[j]] = stride;
                    stride *= packed.shape[j];
                }
            }
            for (int j = 0; j < ndim; j++) counts[o[j]] = j < axis ? 1 : j == axis ? group : s_n[j];
            if (!status) permuted_copy(bounce, src_stride, to, d_stride, counts, ndim, o[ndim - 1], elem);
            r += group;
        }
        int j = axis - 1;
        while (j >= 0 && ++idx[j] == s_n[j]) idx[j--] = 0;
        if (j < 0 || status) return status;
    }
}

/* Bytes of a box stored in another order that a thread keeps in
 * row-major, rows of it (its dimension 0) at a time: the reshard asks for a
 * few hundred rows of a piece at a time (4 MiB slabs), and each such request
 * read from a transposed box alone is a read per stored column of a
 * few hundred elements (a [4096, 4096] one: a million reads). Kept, the
 * rows of 8 MiB serve the requests that follow them; read with runs 2 KiB
 * long at least (a [4096, 4096] fp32 box: 512 rows, 4,096 reads). */
#define PERMUTED_ROWS_MAX ((int64_t)8 << 20)

/* The rows a thread keeps (in its SCRATCH_PERMUTED buffer): rows [row0,
 * row1) of box `box` of piece `piece` of tensor `tensor` of the reader of
 * serial `reader`, row-major, every other dimension whole. */
typedef struct {
    uint64_t reader;
    int tensor, piece;
    int64_t box, row0, row1;
    const char *data; /* the buffer they were read into (another: gone) */
} permuted_rows;
static _Thread_local permuted_rows kept_rows;
static _Atomic uint64_t reader_serials;

/* Reads the region [lo, lo + n) of box k of a piece, stored permuted, into
 * dst at frame `at` from the rows the thread keeps, read first where they
 * do not hold it: rows [lo[0], lo[0] + PERMUTED_ROWS_MAX worth) of the
 * box, whole in every other dimension, permuted into row-major. A region
 * larger than those rows is read straight into dst. */
static int read_permuted_rows(const piece_ctx *c, int64_t k, const int64_t *lo, const int64_t *n, char *dst,
                              const box_frame *at, int64_t elem)
{
    const ckpt_foreign_box *b = &c->pr->boxes[k];
    int ndim = c->pr->geometry.ndim;
    int64_t row_bytes = elem;
    for (int d = 1; d < ndim; d++) row_bytes *= b->count[d];
    int64_t rows = c->r->permuted_rows_bytes / row_bytes; /* kept at once */
    if (rows > b->count[0]) rows = b->count[0];
    if (n[0] > rows) return read_permuted_box(c, b, lo, n, dst, at, elem);
    char *data = scratch_buffer(SCRATCH_PERMUTED, (size_t)(rows * row_bytes));
    permuted_rows *kept = &kept_rows;
    if (!data) { /* the buffer they were in is freed: a later one at its address holds none of them */
        kept->data = NULL;
        return tp_fail(TP_ERR_NOMEM, "out of memory for %lld bytes of rows", (long long)(rows * row_bytes));
    }
    if (kept->data != data || kept->reader != c->r->serial || kept->tensor != c->tensor || kept->piece != c->piece ||
        kept->box != k || lo[0] < kept->row0 || lo[0] + n[0] > kept->row1) {
        kept->data = NULL;
        int64_t row0 = lo[0] - b->start[0]; /* in the box */
        if (row0 > b->count[0] - rows) row0 = b->count[0] - rows;
        int64_t from[CKPT_MAX_DIMS], all[CKPT_MAX_DIMS];
        box_frame frame = {ndim, {0}, {0}};
        for (int d = 0; d < ndim; d++) {
            from[d] = b->start[d] + (d == 0 ? row0 : 0);
            all[d] = frame.shape[d] = d == 0 ? rows : b->count[d];
        }
        TP_TRY(read_permuted_box(c, b, from, all, data, &frame, elem));
        *kept = (permuted_rows){c->r->serial, c->tensor, c->piece, k, from[0], from[0] + rows, data};
    }
    box_frame src = {ndim, {0}, {0}};
    for (int d = 0; d < ndim; d++) {
        src.shape[d] = d == 0 ? kept->row1 - kept->row0 : b->count[d];
        src.origin[d] = lo[d] - (d == 0 ? kept->row0 : b->start[d]);
    }
    copy_ctx cc = {data, dst};
    return box_runs(&src, at, n, ndim, elem, copy_run, &cc);
}

/* Reads the box [start, start + count) of a piece stored as boxes into the
 * box of dst at dst_frame->origin: for each stored box it meets, the rows
 * of that box the region needs, read whole (each box's rows lie
 * contiguously in its file) straight into dst when they land there whole,
 * else through a bounce buffer of at most BOX_BOUNCE_MAX bytes. */
static int read_boxes(const piece_ctx *c, const int64_t *start, const int64_t *count, char *dst,
                      const box_frame *dst_frame)
{
    const ckpt_piece_geometry *g = &c->pr->geometry;
    int ndim = g->ndim;
    int64_t elem = element_bytes(g);
    int status = TP_OK;
    if (c->pr->padded) status = box_runs(dst_frame, dst_frame, count, ndim, elem, zero_run, dst);
    for (int64_t k = 0; k < c->pr->num_boxes && !status; k++) {
        const ckpt_foreign_box *b = &c->pr->boxes[k];
        int64_t lo[CKPT_MAX_DIMS], n[CKPT_MAX_DIMS];
        int empty = 0;
        for (int d = 0; d < ndim; d++) {
            int64_t a = start[d] > b->start[d] ? start[d] : b->start[d];
            int64_t e1 = start[d] + count[d], e2 = b->start[d] + b->count[d];
            n[d] = (e1 < e2 ? e1 : e2) - a;
            lo[d] = a;
            if (n[d] <= 0) empty = 1;
        }
        if (empty) continue;
        int64_t box_row_bytes = elem;
        int whole_rows = 1; /* the rows land whole and contiguously in dst */
        for (int d = 1; d < ndim; d++) {
            box_row_bytes *= b->count[d];
            whole_rows = whole_rows && n[d] == b->count[d] && n[d] == dst_frame->shape[d];
        }
        box_frame src = {ndim, {0}, {0}}, at = *dst_frame;
        for (int d = 0; d < ndim; d++) {
            src.shape[d] = b->count[d];
            src.origin[d] = lo[d] - b->start[d];
            at.origin[d] += lo[d] - start[d];
        }
        if (b->permuted) {
            status = read_permuted_rows(c, k, lo, n, dst, &at, elem);
            continue;
        }
        if (whole_rows) {
            int64_t row_bytes = box_row_bytes, to = 0;
            for (int d = 0; d < ndim; d++) to = to * dst_frame->shape[d] + at.origin[d];
            status = read_data(c->r, b->file, dst + to * elem, (size_t)(n[0] * row_bytes),
                               b->offset + src.origin[0] * row_bytes);
            continue;
        }
        if (box_row_bytes > BOX_BOUNCE_MAX) { /* rows too long to bounce: each run read where it goes */
            box_pread_ctx pc = {c->r, b->file, b->offset, dst};
            status = box_runs(&src, &at, n, ndim, elem, box_pread_run, &pc);
            continue;
        }
        int64_t group = BOX_BOUNCE_MAX / box_row_bytes;
        if (group > n[0]) group = n[0];
        char *bounce = (char *)scratch_buffer(SCRATCH_BOUNCE, (size_t)(group * box_row_bytes));
        if (!bounce) return tp_fail(TP_ERR_NOMEM, "out of memory for a %lld-byte read buffer", (long long)(group * box_row_bytes));
        for (int64_t r = 0; r < n[0] && !status; r += group) {
            int64_t rows = group < n[0] - r ? group : n[0] - r;
            status = read_data(c->r, b->file, bounce, (size_t)(rows * box_row_bytes),
                               b->offset + (src.origin[0] + r) * box_row_bytes);
            box_frame s = src, d2 = at;
            s.shape[0] = rows;
            s.origin[0] = 0;
            d2.origin[0] += r;
            int64_t sub[CKPT_MAX_DIMS];
            memcpy(sub, n, sizeof sub);
            sub[0] = rows;
            copy_ctx cc = {bounce, dst};
            if (!status) status = box_runs(&s, &d2, sub, ndim, elem, copy_run, &cc);
        }
    }
    if (status && status != TP_ERR_NOMEM)
        status = tp_fail_context(status, "%s: tensor %s piece %d", c->r->path, c->r->index.tensors[c->tensor].tensor.name,
                                 c->piece);
    return status;
}

/* Rows [row0, row1) of a piece stored as boxes, into dst (whole rows). */
static int read_box_rows(const piece_ctx *c, int64_t row0, int64_t row1, char *dst)
{
    const ckpt_piece_geometry *g = &c->pr->geometry;
    int64_t start[CKPT_MAX_DIMS] = {0}, count[CKPT_MAX_DIMS];
    memcpy(count, g->shape, sizeof count);
    start[0] = row0;
    count[0] = row1 - row0;
    box_frame frame = {g->ndim, {0}, {0}};
    memcpy(frame.shape, count, sizeof frame.shape);
    return read_boxes(c, start, count, dst, &frame);
}

/* Asks the kernel to start reading rows [row0, row1) of a piece, and a little
 * beyond, in the background: callers stream pieces in order, so the disk
 * works ahead while blocks are hashed and copied. */
static void prefetch(const piece_ctx *c, int64_t row0, int64_t row1)
{
    const ckpt_piece_geometry *g = &c->pr->geometry;
    int64_t ahead = PREFETCH_AHEAD / g->row_bytes;
    if ((row1 - row0) * g->row_bytes < PREFETCH_MIN) return;
    row1 = row1 + ahead < g->rows ? row1 + ahead : g->rows;
    int64_t begin, end;
    if (c->pr->chunks) {
        const chunk_location *first = &c->pr->chunks[row0 / g->block_rows];
        const chunk_location *last = &c->pr->chunks[(row1 - 1) / g->block_rows];
        begin = (int64_t)first->address;
        end = (int64_t)(last->address + last->size);
        if (end <= begin) return; /* chunks out of file order: no single range */
    } else {
        begin = c->pr->offset + row0 * g->row_bytes;
        end = c->pr->offset + row1 * g->row_bytes;
    }
    int64_t from = atomic_load_explicit(&c->pr->announced_from, memory_order_relaxed);
    int64_t to = atomic_load_explicit(&c->pr->announced_to, memory_order_relaxed);
    if (begin >= from && begin <= to) {
        if (end <= to || (end < c->pr->offset + g->rows * g->row_bytes && end - to < PREFETCH_AHEAD / 2)) return;
        begin = to; /* continues the range announced */
    } else {
        atomic_store_explicit(&c->pr->announced_from, begin, memory_order_relaxed);
    }
    atomic_store_explicit(&c->pr->announced_to, end, memory_order_relaxed);
    c->storage->read_ahead(c->file, begin, end - begin);
}

/* Reads the box [start, start + count) of a piece into the box of dst at
 * dst_frame->origin (dst_frame->shape is the caller's whole array). */
static int read_piece_box(const piece_ctx *c, const int64_t *start, const int64_t *count,
                          char *dst, const box_frame *dst_frame)
{
    if (c->pr->boxes) return read_boxes(c, start, count, dst, dst_frame);
    const ckpt_piece_geometry *g = &c->pr->geometry;
    int ndim = g->ndim;
    int64_t elem = element_bytes(g);
    int verify = c->r->options.verify;
    int blockwise = verify || c->pr->chunks;
    prefetch(c, start[0], start[0] + count[0]);
    /* Whole rows, landing contiguously in dst: row r goes to dst_row0 + r - start[0]. */
    int whole_rows = 1;
    for (int d = 1; d < ndim; d++)
        whole_rows = whole_rows && count[d] == g->shape[d] && dst_frame->shape[d] == count[d];
    int64_t row0 = start[0], row1 = start[0] + count[0];
    /* With whole rows, piece row r lands at dst row origin[0] + r - row0. */
#define DST_ROW(r) (dst + (dst_frame->origin[0] + (r) - row0) * g->row_bytes)

    if (!blockwise && whole_rows) { /* one pread per 64 MiB, straight into dst */
        for (int64_t r = row0; r < row1;) {
            int64_t n = DIRECT_READ_MAX / g->row_bytes;
            if (n < 1) n = 1;
            if (n > row1 - r) n = row1 - r;
            int status = read_data(c->r, c->file_index, DST_ROW(r), (size_t)(n * g->row_bytes),
                                   c->pr->offset + r * g->row_bytes);
            if (status) return status;
            r += n;
        }
        return TP_OK;
    }
    /* Row groups: checksum blocks when verifying or compressed, else ~8 MiB. */
    int64_t group_rows = blockwise ? g->block_rows : GROUP_TARGET / g->row_bytes;
    if (group_rows < 1) group_rows = 1;
    int64_t first = blockwise ? row0 / group_rows * group_rows : row0;
    char *bounce = NULL, *scratch = NULL;
    int status = TP_OK;
    if (c->pr->chunks && !(scratch = (char *)scratch_buffer(SCRATCH_CHUNK, scratch_bytes(g))))
        return tp_fail(TP_ERR_NOMEM, "out of memory for a %zu-byte chunk buffer", scratch_bytes(g));
    box_frame src_frame = {ndim, {0}, {0}};
    memcpy(src_frame.shape, g->shape, sizeof src_frame.shape);

    for (int64_t r = first; r < row1 && !status;) {
        int64_t group_end = r + group_rows < g->rows ? r + group_rows : g->rows;
        if (!blockwise && group_end > row1) group_end = row1;
        int64_t sel0 = r > row0 ? r : row0, sel1 = group_end < row1 ? group_end : row1;
        if (blockwise && whole_rows && sel0 == r && sel1 == group_end) {
            /* Whole blocks inside the selection go straight into dst, many per read. */
            int64_t b0 = r / g->block_rows, b1 = b0 + 1;
            for (;;) {
                int64_t next = b1 * g->block_rows;
                int64_t next_end = next + g->block_rows < g->rows ? next + g->block_rows : g->rows;
                if (next >= row1 || next_end > row1 || (next_end - r) * g->row_bytes > DIRECT_READ_MAX)
                    break;
                b1++;
            }
            status = read_blocks(c, b0, b1, DST_ROW(r), scratch, verify);
            r = b1 * g->block_rows;
            continue;
        }
        if (!blockwise && !whole_rows) {
            /* Long runs are read one by one; short ones through the bounce buffer. */
            int inner;
            if (common_run_bytes(g->shape, dst_frame->shape, count, ndim, elem, &inner) >= SPARSE_RUN_MIN) {
                int64_t sub_count[CKPT_MAX_DIMS];
                memcpy(sub_count, count, sizeof(int64_t) * (size_t)ndim);
                sub_count[0] = sel1 - sel0;
                box_frame s = src_frame, dd = *dst_frame;
                memcpy(s.origin, start, sizeof(int64_t) * (size_t)ndim);
                s.origin[0] = sel0;
                dd.origin[0] = dst_frame->origin[0] + sel0 - row0;
                pread_ctx pc = {c, dst};
                status = box_runs(&s, &dd, sub_count, ndim, elem, pread_run, &pc);
                r = group_end;
                continue;
            }
        }
        /* Bounce: rows [r, group_end) into the buffer, then copy the selection. */
        size_t bounce_size = (size_t)(group_rows * g->row_bytes);
        if (!bounce && !(bounce = (char *)scratch_buffer(SCRATCH_BOUNCE, bounce_size))) {
            status = tp_fail(TP_ERR_NOMEM, "out of memory for a %zu-byte read buffer", bounce_size);
            break;
        }
        if (blockwise) {
            int64_t b = r / g->block_rows;
            status = read_blocks(c, b, b + 1, bounce, scratch, verify);
        } else {
            status = read_data(c->r, c->file_index, bounce, (size_t)((group_end - r) * g->row_bytes),
                               c->pr->offset + r * g->row_bytes);
        }
        if (status) break;
        box_frame s = src_frame, dd = *dst_frame;
        memcpy(s.origin, start, sizeof(int64_t) * (size_t)ndim);
        s.shape[0] = group_end - r;
        s.origin[0] = sel0 - r;
        dd.origin[0] = dst_frame->origin[0] + sel0 - row0;
        int64_t sub_count[CKPT_MAX_DIMS];
        memcpy(sub_count, count, sizeof(int64_t) * (size_t)ndim);
        sub_count[0] = sel1 - sel0;
        copy_ctx cc = {bounce, dst};
        status = box_runs(&s, &dd, sub_count, ndim, elem, copy_run, &cc);
        r = group_end;
    }
    return status;
#undef DST_ROW
}

int ckpt_reader_read_rows(ckpt_reader *r, int i, int piece, int64_t row_start, int64_t row_count,
                          void *buf, size_t buf_size)
{
    piece_ctx c;
    int status = piece_context(r, i, piece, &c);
    if (status) return status;
    const ckpt_piece_geometry *g = &c.pr->geometry;
    const char *name = r->index.tensors[i].tensor.name;
    if (row_start < 0 || row_count < 1 || row_start + row_count > g->rows)
        return tp_fail(TP_ERR_ARG, "tensor %s piece %d: rows [%lld, %lld) outside 0..%lld", name, piece,
                         (long long)row_start, (long long)(row_start + row_count), (long long)g->rows);
    if (buf_size < (size_t)(row_count * g->row_bytes))
        return tp_fail(TP_ERR_ARG, "tensor %s piece %d: buffer of %zu bytes, need %lld", name, piece,
                         buf_size, (long long)(row_count * g->row_bytes));
    int64_t start[CKPT_MAX_DIMS] = {0}, count[CKPT_MAX_DIMS];
    memcpy(count, g->shape, sizeof count);
    start[0] = row_start;
    count[0] = row_count;
    box_frame frame = {g->ndim, {0}, {0}};
    memcpy(frame.shape, count, sizeof frame.shape);
    return read_piece_box(&c, start, count, buf, &frame);
}

int ckpt_reader_read_piece(ckpt_reader *r, int i, int piece, void *buf, size_t buf_size)
{
    int status = check_piece_arg(r, i, piece);
    if (status) return status;
    return ckpt_reader_read_rows(r, i, piece, 0, r->pieces[i][piece].geometry.rows, buf, buf_size);
}

int ckpt_reader_read_region(ckpt_reader *r, int i, const int64_t *start, const int64_t *count,
                            void *buf, size_t buf_size)
{
    if (i < 0 || i >= r->index.num_tensors)
        return tp_fail(TP_ERR_ARG, "%s: tensor index %d out of range", r->path, i);
    const ckpt_tensor_desc *t = &r->index.tensors[i].tensor.desc;
    int64_t elements = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (start[d] < 0 || count[d] < 1 || start[d] + count[d] > t->shape[d])
            return tp_fail(TP_ERR_ARG,
                             "tensor %s: region [%lld, %lld) of dimension %d outside 0..%lld",
                             t->name, (long long)start[d], (long long)(start[d] + count[d]), d,
                             (long long)t->shape[d]);
        elements *= count[d];
    }
    if (buf_size < (size_t)elements * tp_dtype_size(t->dtype))
        return tp_fail(TP_ERR_ARG, "tensor %s: buffer of %zu bytes, region needs %lld", t->name,
                         buf_size, (long long)(elements * (int64_t)tp_dtype_size(t->dtype)));
    box_frame frame = {t->ndim, {0}, {0}};
    memcpy(frame.shape, count, sizeof(int64_t) * (size_t)t->ndim);
    piece_ctx c;
    int status;
    if (t->partition.kind == CKPT_REPLICATED) {
        status = piece_context(r, i, 0, &c);
        return status ? status : read_piece_box(&c, start, count, buf, &frame);
    }
    int axis = t->partition.axis;
    int64_t max_runs = (int64_t)t->partition.num_segments * r->index.layout.tp;
    ckpt_run *runs = malloc((size_t)max_runs * sizeof *runs);
    if (!runs) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int64_t n = ckpt_partition_runs(t, r->index.layout.tp, start[axis], count[axis], runs, max_runs);
    status = n < 0 ? tp_fail(TP_ERR_ARG, "tensor %s: bad region", t->name) : TP_OK;
    for (int64_t k = 0; k < n && !status; k++) {
        int64_t piece_start[CKPT_MAX_DIMS], piece_count[CKPT_MAX_DIMS];
        memcpy(piece_start, start, sizeof(int64_t) * (size_t)t->ndim);
        memcpy(piece_count, count, sizeof(int64_t) * (size_t)t->ndim);
        piece_start[axis] = runs[k].local_start;
        piece_count[axis] = runs[k].length;
        box_frame dst = frame;
        dst.origin[axis] = runs[k].logical_start - start[axis];
        status = piece_context(r, i, runs[k].rank, &c);
        if (!status) status = read_piece_box(&c, piece_start, piece_count, buf, &dst);
    }
    free(runs);
    return status;
}

/* Blocks of a piece that piece_digest reads at a time: whole blocks of
 * about CKPT_VERIFY_READ_BYTES (at least one, at most the piece's), one of a
 * compressed piece (read chunk by chunk). */
static int64_t blocks_per_digest_read(const ckpt_piece_geometry *g, int compressed)
{
    int64_t per_read = compressed ? 1 : CKPT_VERIFY_READ_BYTES / (g->block_rows * g->row_bytes);
    if (per_read < 1) per_read = 1;
    if (per_read > g->num_blocks) per_read = g->num_blocks;
    return per_read;
}

/* The buffer piece_digest reads into: [per_read blocks of data][chunk
 * scratch when compressed]. */
static size_t digest_buffer_bytes(const ckpt_piece_geometry *g, int compressed)
{
    int64_t data = blocks_per_digest_read(g, compressed) * g->block_rows * g->row_bytes;
    return (size_t)data + (compressed ? scratch_bytes(g) : 0);
}

/* The bounce buffer read_boxes takes for a box of count[] inside a foreign
 * piece of geometry g when piece_digest reads it: none where the box's rows
 * are the piece's whole rows (read where they go) or longer than
 * BOX_BOUNCE_MAX (each run read where it goes); else as many of its rows as
 * fit BOX_BOUNCE_MAX, at most the box's and a digest read's. */
static int64_t box_bounce_bytes(const ckpt_piece_geometry *g, const int64_t *count)
{
    int64_t box_row_bytes = element_bytes(g);
    int whole_rows = 1;
    for (int d = 1; d < g->ndim; d++) {
        box_row_bytes *= count[d];
        whole_rows = whole_rows && count[d] == g->shape[d];
    }
    if (whole_rows || box_row_bytes <= 0 || box_row_bytes > BOX_BOUNCE_MAX) return 0;
    int64_t rows = BOX_BOUNCE_MAX / box_row_bytes, read_rows = blocks_per_digest_read(g, 0) * g->block_rows;
    if (rows > count[0]) rows = count[0];
    if (rows > read_rows) rows = read_rows;
    return rows * box_row_bytes;
}

/* What piece_digest holds for a piece of geometry g, its bounce buffer
 * apart: a foreign piece's rows come through the bounce buffer of its boxes
 * (read_boxes). Each is a thread's scratch (scratch_buffer), kept at the
 * largest it was asked for: a thread holds the largest of each at once. */
static int64_t piece_verify_bytes(const ckpt_piece_geometry *g, int compressed)
{
    return (int64_t)digest_buffer_bytes(g, compressed);
}

/* The most bounce a foreign piece of geometry g may take when no box is
 * known (the output of another tool's writer): its rows through
 * BOX_BOUNCE_MAX. */
static int64_t piece_bounce_bound(const ckpt_piece_geometry *g)
{
    return g->bytes < BOX_BOUNCE_MAX ? g->bytes : BOX_BOUNCE_MAX;
}

int64_t ckpt_tensor_verify_read_bytes(const ckpt_tensor_desc *t, int tp, int compressed, int foreign)
{
    ckpt_piece_geometry g;
    ckpt_piece_geometry_init(&g, t, tp, 0); /* the writer's blocks (ckpt_piece_block_rows) */
    return piece_verify_bytes(&g, compressed) + (foreign ? piece_bounce_bound(&g) : 0);
}

int64_t ckpt_tensor_box_bounce_bytes(const ckpt_tensor_desc *t, int tp, const int64_t *count)
{
    ckpt_piece_geometry g;
    ckpt_piece_geometry_init(&g, t, tp, 0);
    return box_bounce_bytes(&g, count);
}

int64_t ckpt_reader_read_thread_bytes(const ckpt_reader *r)
{
    if (!r->foreign) return 0;
    /* The bounce buffer of the boxes (read_boxes, read_permuted_box): a
     * region whose rows do not land whole in the caller's buffer (a column
     * range of a foreign chunk, as a cut along dimension 1 asks for) is read
     * through it, up to BOX_BOUNCE_MAX and the piece's bytes. */
    int64_t bounce = 0;
    for (int i = 0; i < r->index.num_tensors; i++)
        for (int p = 0; p < r->index.tensors[i].num_pieces; p++) {
            int64_t bytes = piece_bounce_bound(&r->pieces[i][p].geometry);
            if (bytes > bounce) bounce = bytes;
        }
    return bounce + r->permuted_rows_bytes;
}

int64_t ckpt_reader_verify_thread_bytes(const ckpt_reader *r)
{
    int64_t most = 0, bounce = 0;
    for (int i = 0; i < r->index.num_tensors; i++)
        for (int p = 0; p < r->index.tensors[i].num_pieces; p++) {
            const piece_runtime *pr = &r->pieces[i][p];
            int64_t bytes = piece_verify_bytes(&pr->geometry, r->index.tensors[i].pieces[p].compressed);
            if (bytes > most) most = bytes;
            for (int64_t k = 0; k < pr->num_boxes; k++) {
                /* A box stored in another order is read in slabs of the whole bound (read_permuted_box). */
                int64_t b = pr->boxes[k].permuted ? piece_bounce_bound(&pr->geometry)
                                                  : box_bounce_bytes(&pr->geometry, pr->boxes[k].count);
                if (b > bounce) bounce = b;
            }
        }
    return most + bounce + r->permuted_rows_bytes; /* the rows of a permuted box kept (0 for most) */
}

/* A piece's part of its tensor's logical digest, its blocks read (and
 * checked against their checksums, unless foreign) about
 * CKPT_VERIFY_READ_BYTES at a time. */
static int piece_digest(ckpt_reader *r, int i, int piece, piece_ctx *c, uint64_t *out)
{
    int status = piece_context(r, i, piece, c);
    if (status) return status;
    const ckpt_piece_geometry *g = &c->pr->geometry;
    int64_t block_bytes = g->block_rows * g->row_bytes;
    int64_t per_read = blocks_per_digest_read(g, c->pr->chunks != NULL);
    size_t size = digest_buffer_bytes(g, c->pr->chunks != NULL);
    /* [per_read blocks of data][chunk scratch when compressed] */
    char *buf = (char *)scratch_buffer(SCRATCH_VERIFY, size);
    if (!buf) return tp_fail(TP_ERR_NOMEM, "out of memory for a %zu-byte buffer", size);
    const ckpt_tensor_desc *t = &r->index.tensors[i].tensor.desc;
    uint64_t digest = 0;
    for (int64_t b = 0; b < g->num_blocks && !status; b += per_read) {
        int64_t end = b + per_read < g->num_blocks ? b + per_read : g->num_blocks;
        status = read_blocks(c, b, end, buf, buf + per_read * block_bytes, !r->foreign);
        int64_t row_end = end * g->block_rows < g->rows ? end * g->block_rows : g->rows;
        if (!status) digest += ckpt_digest_rows(t, r->index.layout.tp, piece, b * g->block_rows, row_end, buf);
    }
    *out = digest;
    return status;
}

int ckpt_reader_verify_piece(ckpt_reader *r, int i, int piece)
{
    piece_ctx c;
    uint64_t digest = 0;
    int status = piece_digest(r, i, piece, &c, &digest);
    if (status || (r->foreign && !r->index.tensors[i].digest)) return status; /* foreign: no digest computed to compare with */
    const ckpt_index_piece *ip = &r->index.tensors[i].pieces[piece];
    if (digest != ip->digest)
        status = tp_fail(TP_ERR_CHECKSUM,
                           "%s: tensor %s piece %d: logical digest %016llx, the index records %016llx",
                           c.file_path, r->index.tensors[i].tensor.desc.name, piece, (unsigned long long)digest,
                           (unsigned long long)ip->digest);
    return status;
}

int ckpt_reader_check_padding(ckpt_reader *r, int i, int piece)
{
    int status = check_piece_arg(r, i, piece);
    if (status) return status;
    const ckpt_tensor_desc *t = &r->index.tensors[i].tensor.desc;
    /* Zero padding is this format's rule; another tool's padding rows hold
     * what it keeps there (Megatron-LM's trained vocabulary padding). */
    if (t->partition.kind != CKPT_SPLIT || r->foreign) return TP_OK;
    ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
    int64_t n = ckpt_piece_runs(t, r->index.layout.tp, piece, runs, 2 * CKPT_MAX_SEGMENTS);
    piece_ctx c;
    status = piece_context(r, i, piece, &c);
    const ckpt_piece_geometry *g = &c.pr->geometry;
    int axis = t->partition.axis;
    for (int64_t k = 0; k < n && !status; k++) {
        if (runs[k].logical_start >= 0) continue;
        int64_t start[CKPT_MAX_DIMS] = {0}, count[CKPT_MAX_DIMS];
        memcpy(count, g->shape, sizeof count);
        start[axis] = runs[k].local_start;
        count[axis] = runs[k].length;
        /* Padding along axis 0 can be read slab by slab; along other axes it is
         * a thin box that is small whenever the tensor is. */
        int64_t elements = 1;
        for (int d = 0; d < g->ndim; d++) elements *= count[d];
        size_t bytes = (size_t)elements * tp_dtype_size(t->dtype);
        unsigned char *buf = alloc_pages(bytes);
        if (!buf) return tp_fail(TP_ERR_NOMEM, "out of memory");
        box_frame frame = {g->ndim, {0}, {0}};
        memcpy(frame.shape, count, sizeof frame.shape);
        status = read_piece_box(&c, start, count, (char *)buf, &frame);
        for (size_t b = 0; b < bytes && !status; b++)
            if (buf[b] != 0)
                status = tp_fail(TP_ERR_FORMAT,
                                   "%s: tensor %s piece %d: padding at %lld..%lld of axis %d is "
                                   "not zero",
                                   c.file_path, t->name, piece, (long long)runs[k].local_start,
                                   (long long)(runs[k].local_start + runs[k].length - 1), axis);
        free(buf);
    }
    return status;
}

int ckpt_reader_check_replicas(ckpt_reader *r, int i, int piece)
{
    int status = check_piece_arg(r, i, piece);
    if (status) return status;
    const ckpt_tensor_desc *t = &r->index.tensors[i].tensor.desc;
    int tp = r->index.layout.tp;
    if (t->partition.kind != CKPT_SPLIT || !t->partition.replicate_small_segments || r->foreign) return TP_OK;
    ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
    int64_t n = ckpt_piece_runs(t, tp, piece, runs, 2 * CKPT_MAX_SEGMENTS);
    if (n < 0) return tp_fail(TP_ERR_FORMAT, "tensor %s: piece %d's runs at tp %d", t->name, piece, tp);
    int axis = t->partition.axis;
    size_t elem = tp_dtype_size(t->dtype);
    for (int64_t k = 0; k < n && !status; k++) {
        if (!runs[k].replica) continue;
        /* Where readers take these rows: the primary copy, one run (a granule lies whole on its rank). */
        ckpt_run primary;
        if (ckpt_partition_runs(t, tp, runs[k].logical_start, runs[k].length, &primary, 1) != 1)
            return tp_fail(TP_ERR_FORMAT, "tensor %s: the primary copy of rows %lld..%lld of axis %d is not one run",
                           t->name, (long long)runs[k].logical_start,
                           (long long)(runs[k].logical_start + runs[k].length - 1), axis);
        piece_ctx copy, read;
        status = piece_context(r, i, piece, &copy);
        if (!status) status = piece_context(r, i, primary.rank, &read);
        if (status) return status;
        /* The box: the run's rows along axis, every element of the other
         * dimensions of the piece ([... , length, ...]). */
        const ckpt_piece_geometry *g = &copy.pr->geometry;
        int64_t start[CKPT_MAX_DIMS] = {0}, count[CKPT_MAX_DIMS], elements = 1;
        memcpy(count, g->shape, sizeof count);
        count[axis] = runs[k].length;
        for (int d = 0; d < g->ndim; d++) elements *= count[d];
        size_t bytes = (size_t)elements * elem;
        unsigned char *a = alloc_pages(bytes), *b = alloc_pages(bytes);
        if (!a || !b) {
            free(a);
            free(b);
            return tp_fail(TP_ERR_NOMEM, "out of memory");
        }
        box_frame frame = {g->ndim, {0}, {0}};
        memcpy(frame.shape, count, sizeof frame.shape);
        start[axis] = runs[k].local_start;
        status = read_piece_box(&copy, start, count, (char *)a, &frame);
        start[axis] = primary.local_start;
        if (!status) status = read_piece_box(&read, start, count, (char *)b, &frame);
        if (!status && memcmp(a, b, bytes)) {
            int64_t e = 0; /* the first element whose bits differ */
            while (!memcmp(a + e * (int64_t)elem, b + e * (int64_t)elem, elem)) e++;
            int64_t origin[CKPT_MAX_DIMS] = {0};
            origin[axis] = runs[k].logical_start;
            char place[200], copy_value[64], read_value[64];
            ckpt_element_place(count, origin, g->ndim, e, place, sizeof place);
            ckpt_element_text(a + e * (int64_t)elem, t->dtype, copy_value, sizeof copy_value);
            ckpt_element_text(b + e * (int64_t)elem, t->dtype, read_value, sizeof read_value);
            status = tp_fail(TP_ERR_FORMAT,
                             "tensor %s: rows %lld..%lld of axis %d are replicated over the tensor-parallel ranks "
                             "(replicate_small_segments) and their copies differ: element [%s] is %s in %s "
                             "(tensor-parallel rank %d's replica), %s in %s (rank %d's, the primary copy read)",
                             t->name, (long long)runs[k].logical_start,
                             (long long)(runs[k].logical_start + runs[k].length - 1), axis, place, copy_value,
                             copy.file_path, piece, read_value, read.file_path, primary.rank);
        }
        free(a);
        free(b);
    }
    return status;
}

/* --------------------------------------------------- foreign checkpoints */

static int read_for_check(void *ctx, int f, void *buf, int64_t n, int64_t offset)
{
    ckpt_reader *r = ctx;
    pthread_mutex_lock(&r->lock);
    int status = open_file(r, f);
    pthread_mutex_unlock(&r->lock);
    return status ? status : r->storage->read_at(r->files[f].data, buf, (size_t)n, offset);
}

int ckpt_reader_finish_checks(ckpt_reader *r, int *checked)
{
    int status = foreign_checks_finish(r->checks, read_for_check, r, checked);
    /* Recorded logical digests (the toolkit's description in another
     * format): each piece read is read again whole and its digest compared.
     * Its data in another order (two chunks' items swapped) gives another. */
    for (int i = 0; !status && r->recorded_digests && i < r->index.num_tensors; i++) {
        const ckpt_index_tensor *it = &r->index.tensors[i];
        for (int p = 0; p < it->num_pieces && !status; p++) {
            if (!atomic_load_explicit(&r->pieces[i][p].read, memory_order_relaxed)) continue;
            piece_ctx c;
            uint64_t digest = 0;
            status = piece_digest(r, i, p, &c, &digest);
            if (!status && digest != it->pieces[p].digest)
                status = tp_fail(TP_ERR_CHECKSUM, "%s: tensor %s: its data has the logical digest %016llx, the "
                                 "checkpoint's description records %016llx (data damaged or out of place)",
                                 r->path, it->tensor.name, (unsigned long long)digest,
                                 (unsigned long long)it->pieces[p].digest);
            if (!status && checked) (*checked)++;
        }
    }
    return status;
}

const char *ckpt_reader_element_file(const ckpt_reader *r, int i, int64_t element)
{
    if (i < 0 || i >= r->index.num_tensors || element < 0) return ckpt_reader_path(r);
    const ckpt_index_tensor *it = &r->index.tensors[i];
    const ckpt_tensor_desc *t = &it->tensor.desc;
    int64_t at[CKPT_MAX_DIMS], rest = element; /* its coordinates, logical, then in its piece */
    for (int k = t->ndim - 1; k >= 0; k--) {
        at[k] = t->shape[k] ? rest % t->shape[k] : 0;
        rest = t->shape[k] ? rest / t->shape[k] : 0;
    }
    int piece = 0;
    if (t->partition.kind == CKPT_SPLIT) {
        ckpt_run run;
        if (ckpt_partition_runs(t, r->index.layout.tp, at[t->partition.axis], 1, &run, 1) != 1)
            return ckpt_reader_path(r);
        piece = run.rank;
        at[t->partition.axis] = run.local_start;
    }
    if (piece >= it->num_pieces) return ckpt_reader_path(r);
    int f = it->pieces[piece].file_index;
    const piece_runtime *pr = &r->pieces[i][piece];
    for (int64_t k = 0; k < pr->num_boxes; k++) { /* a foreign piece's boxes: the one around it */
        const ckpt_foreign_box *b = &pr->boxes[k];
        int inside = 1;
        for (int d = 0; d < t->ndim && inside; d++) inside = at[d] >= b->start[d] && at[d] < b->start[d] + b->count[d];
        if (inside) {
            f = b->file;
            break;
        }
    }
    if (f < 0 || f >= r->index.num_files) return ckpt_reader_path(r);
    return r->foreign ? r->files[f].path : r->index.files[f].name;
}

int ckpt_reader_is_foreign(const ckpt_reader *r)
{
    return r->foreign;
}

/* A box's start on the sweep axis, and its place in the list (the order
 * among equal starts, so that the sort's result is one). */
typedef struct {
    int64_t start;
    int64_t box;
} swept_box;

static int by_start(const void *x, const void *y)
{
    const swept_box *a = x, *b = y;
    if (a->start != b->start) return a->start < b->start ? -1 : 1;
    return (a->box > b->box) - (a->box < b->box);
}

/* The pairs of boxes the overlap check may compare, a chunk: a foreign
 * index is untrusted, and a layout of chunks that defeats the sweep would
 * otherwise hold the reader for hours (2^26 chunks: 2^51 pairs); bounded
 * so, a whole checkpoint's check is bounded by its chunks (2^26: 2^34
 * comparisons, about half a minute). A grid of chunks takes as many a
 * chunk as it has chunks across the axis swept (tp x FSDP, 8 x 128: 8). */
#define BOX_COMPARISONS_PER_BOX 256
#define BOX_COMPARISONS_BASE 65536

/* No two of the live boxes (order[0..live)) share an element. They are
 * swept along the axis on which they are thinnest (the least sum of their
 * extents over the piece's: the axis they are cut along), each compared
 * with those that start on it before it ends there; a sort by start, not
 * an insertion sort, as chunks in reverse order took it n^2 / 2 steps. */
static int check_box_overlaps(const ckpt_foreign *src, const ckpt_tensor_desc *t, const ckpt_foreign_box *boxes,
                              int ndim, const int64_t *shape, const int64_t *order, int64_t live)
{
    if (live < 2) return TP_OK;
    int axis = 0;
    double thinnest = 0;
    for (int d = 0; d < ndim; d++) {
        double extent = 0;
        for (int64_t i = 0; i < live; i++) extent += (double)boxes[order[i]].count[d] / (double)shape[d];
        if (d == 0 || extent < thinnest) {
            thinnest = extent;
            axis = d;
        }
    }
    swept_box *swept = malloc((size_t)live * sizeof *swept);
    if (!swept) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < live; i++) swept[i] = (swept_box){boxes[order[i]].start[axis], order[i]};
    qsort(swept, (size_t)live, sizeof *swept, by_start);
    int status = TP_OK;
    int64_t comparisons = 0, most = BOX_COMPARISONS_PER_BOX * live + BOX_COMPARISONS_BASE;
    for (int64_t i = 0; i < live && !status; i++) {
        const ckpt_foreign_box *a = &boxes[swept[i].box];
        for (int64_t j = i + 1; j < live && !status && swept[j].start < a->start[axis] + a->count[axis]; j++) {
            if (++comparisons > most) {
                status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s: its %lld chunks are laid out so that checking them for "
                                 "overlaps takes more than %lld comparisons (%d a chunk; chunks cut along several "
                                 "dimensions at once): refused unread", src->path, t->name, (long long)live,
                                 (long long)most, BOX_COMPARISONS_PER_BOX);
                break;
            }
            const ckpt_foreign_box *b = &boxes[swept[j].box];
            int overlap = 1;
            for (int d = 0; d < ndim && overlap; d++)
                overlap = a->start[d] < b->start[d] + b->count[d] && b->start[d] < a->start[d] + a->count[d];
            if (overlap)
                status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s: two chunks overlap (at offsets %lld and %lld of dimension "
                                 "%d)", src->path, t->name, (long long)a->start[axis], (long long)b->start[axis], axis);
        }
    }
    free(swept);
    return status;
}

/* Checks the boxes of a foreign piece of shape g (ckpt_foreign_box): inside
 * the piece and their files, clear of its padding, without overlaps, and
 * covering every other element; copies them into pr. */
static int take_boxes(const ckpt_foreign *src, const ckpt_tensor_desc *t, int piece,
                      const ckpt_foreign_box *boxes, int64_t n, piece_runtime *pr)
{
    const ckpt_piece_geometry *g = &pr->geometry;
    int ndim = g->ndim;
    int64_t elem = element_bytes(g);
    /* The piece's padding: runs of its split axis that hold no logical rows. */
    ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
    int64_t num_runs = 0, padding_rows = 0, axis = t->partition.axis;
    if (t->partition.kind == CKPT_SPLIT) {
        num_runs = ckpt_piece_runs(t, src->layout.tp, piece, runs, 2 * CKPT_MAX_SEGMENTS);
        if (num_runs < 0) return tp_fail(TP_ERR_ARG, "%s: tensor %s: piece %d has no runs", src->path, t->name, piece);
        for (int64_t k = 0; k < num_runs; k++) padding_rows += runs[k].logical_start < 0 ? runs[k].length : 0;
    }
    int64_t piece_elements = 1;
    for (int d = 0; d < ndim; d++) piece_elements *= g->shape[d];
    int64_t data_elements = piece_elements / g->shape[axis] * (g->shape[axis] - padding_rows), covered = 0;
    int64_t *order = malloc((size_t)(n + 1) * sizeof *order), live = 0;
    pr->boxes = malloc((size_t)(n + 1) * sizeof *pr->boxes);
    if (!order || !pr->boxes) {
        free(order);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    pr->num_boxes = n;
    int status = TP_OK;
    for (int64_t k = 0; k < n && !status; k++) {
        const ckpt_foreign_box *b = &boxes[k];
        pr->boxes[k] = *b;
        int64_t volume = 1;
        for (int d = 0; d < ndim && !status; d++) {
            if (b->start[d] < 0 || b->count[d] < 0 || b->start[d] > g->shape[d] || b->count[d] > g->shape[d] - b->start[d])
                status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s: a chunk [%lld, %lld) of dimension %d lies outside 0..%lld",
                                 src->path, t->name, (long long)b->start[d], (long long)(b->start[d] + b->count[d]), d,
                                 (long long)g->shape[d]);
            volume *= b->count[d];
        }
        if (status) break;
        unsigned seen = 0; /* a stored order: each dimension once */
        for (int j = 0; b->permuted && j < ndim; j++)
            seen |= b->order[j] >= 0 && b->order[j] < ndim ? 1u << b->order[j] : 1u << CKPT_MAX_DIMS;
        if (b->permuted && seen != (1u << ndim) - 1)
            status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s: a chunk stored in an order that is no order of its %d dimensions",
                             src->path, t->name, ndim);
        else if (b->file < 0 || b->file >= src->num_files)
            status = tp_fail(TP_ERR_ARG, "%s: tensor %s: a chunk in no file (%d)", src->path, t->name, b->file);
        else if (b->offset < 0 || b->offset > src->file_bytes[b->file] || volume * elem > src->file_bytes[b->file] - b->offset)
            status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s: a chunk of %lld bytes at %lld lies outside the file (%lld bytes)",
                             src->files[b->file], t->name, (long long)(volume * elem), (long long)b->offset,
                             (long long)src->file_bytes[b->file]);
        for (int64_t j = 0; j < num_runs && !status && volume; j++)
            if (runs[j].logical_start < 0 && b->start[axis] < runs[j].local_start + runs[j].length &&
                runs[j].local_start < b->start[axis] + b->count[axis])
                status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s: a chunk covers padding rows [%lld, %lld) of dimension %lld",
                                 src->path, t->name, (long long)runs[j].local_start,
                                 (long long)(runs[j].local_start + runs[j].length), (long long)axis);
        if (volume) order[live++] = k;
        covered += volume;
    }
    if (!status) status = check_box_overlaps(src, t, boxes, ndim, g->shape, order, live);
    if (!status && covered != data_elements)
        status = tp_fail(TP_ERR_FORMAT, "%s: tensor %s: its chunks hold %lld elements, the tensor %lld (a chunk missing?)",
                         src->path, t->name, (long long)covered, (long long)data_elements);
    free(order);
    pr->padded = padding_rows > 0;
    return status;
}

/* The index of a foreign checkpoint: its descriptions, and each piece as
 * one extent at its offset, or as its boxes. */
static int foreign_index(ckpt_reader *r, const ckpt_foreign *src)
{
    ckpt_index *index = &r->index;
    index->major = CKPT_FORMAT_MAJOR;
    index->minor = CKPT_FORMAT_MINOR;
    index->layout = src->layout;
    TP_TRY(ckpt_layout_check(&src->layout));
    if (src->saved.tp) TP_TRY(ckpt_layout_check(&src->saved));
    r->saved = src->saved;
    TP_TRY(ckpt_index_set_state(index, &src->state));
    index->files = calloc((size_t)src->num_files + 1, sizeof *index->files);
    index->tensors = calloc((size_t)src->num_tensors + 1, sizeof *index->tensors);
    r->files = calloc((size_t)src->num_files + 1, sizeof *r->files);
    r->pieces = calloc((size_t)src->num_tensors + 1, sizeof *r->pieces);
    if (!index->files || !index->tensors || !r->files || !r->pieces) return tp_fail(TP_ERR_NOMEM, "out of memory");
    index->num_files = src->num_files;
    for (int f = 0; f < src->num_files; f++) {
        r->files[f].file = -1;
        if (strlen(src->files[f]) >= sizeof r->files[f].path)
            return tp_fail(TP_ERR_ARG, "%.200s...: path too long", src->files[f]);
        snprintf(r->files[f].path, sizeof r->files[f].path, "%s", src->files[f]);
        if (src->versions && src->versions[f] && strlen(src->versions[f]) >= sizeof r->files[f].version)
            return tp_fail(TP_ERR_ARG, "%s: a version of %zu bytes", src->files[f], strlen(src->versions[f]));
        if (src->versions && src->versions[f]) snprintf(r->files[f].version, sizeof r->files[f].version, "%s", src->versions[f]);
        const char *base = strrchr(src->files[f], '/');
        snprintf(index->files[f].name, sizeof index->files[f].name, "%s", base ? base + 1 : src->files[f]);
        index->files[f].bytes = src->file_bytes[f];
    }
    int64_t at = 0;
    for (int i = 0; i < src->num_tensors; i++) {
        ckpt_index_tensor *it = &index->tensors[i];
        int status = ckpt_tensor_copy_init(&it->tensor, &src->tensors[i]);
        if (status) return tp_fail_context(status, "%s", src->path);
        index->num_tensors = i + 1;
        status = ckpt_name_map_insert(&r->names, it->tensor.name, i, reader_name_of, r);
        if (status) return tp_fail_context(TP_ERR_FORMAT, "%s", src->path);
        const ckpt_tensor_desc *t = &it->tensor.desc;
        it->stage = ckpt_tensor_stage(t, &src->layout);
        it->block_rows = ckpt_piece_block_rows(t, src->layout.tp);
        it->order = i;
        it->num_pieces = ckpt_piece_count(t, src->layout.tp);
        it->pieces = calloc((size_t)it->num_pieces, sizeof *it->pieces);
        r->pieces[i] = calloc((size_t)it->num_pieces, sizeof **r->pieces);
        if (!it->pieces || !r->pieces[i]) return tp_fail(TP_ERR_NOMEM, "out of memory");
        for (int p = 0; p < it->num_pieces; p++, at++) {
            ckpt_index_piece *ip = &it->pieces[p];
            piece_runtime *pr = &r->pieces[i][p];
            ckpt_piece_geometry_init(&pr->geometry, t, src->layout.tp, it->block_rows);
            const ckpt_piece_geometry *g = &pr->geometry;
            ip->pp = it->stage;
            ip->tp = p;
            ckpt_piece_shape(t, src->layout.tp, ip->shape);
            ip->bytes = g->bytes;
            if (src->boxes) { /* the piece's boxes, one extent each */
                int64_t first = src->box_first[at], n = src->box_first[at + 1] - first;
                if (first < 0 || n < 0) return tp_fail(TP_ERR_ARG, "%s: tensor %s piece %d: bad box list", src->path, t->name, p);
                TP_TRY(take_boxes(src, t, p, src->boxes + first, n, pr));
                for (int64_t k = 0; k < n; k++) /* the rows a thread keeps of a box stored permuted */
                    if (pr->boxes[k].permuted) {
                        int64_t bytes = element_bytes(g);
                        for (int d = 0; d < g->ndim; d++) bytes *= pr->boxes[k].count[d];
                        if (bytes > PERMUTED_ROWS_MAX) bytes = PERMUTED_ROWS_MAX;
                        if (bytes > r->permuted_rows_bytes) r->permuted_rows_bytes = bytes;
                    }
                ip->file_index = n ? pr->boxes[0].file : 0;
                snprintf(ip->file, sizeof ip->file, "%s", index->files[ip->file_index].name);
                ip->num_extents = n;
                if (n && !(ip->extents = calloc((size_t)n, sizeof *ip->extents))) return tp_fail(TP_ERR_NOMEM, "out of memory");
                for (int64_t k = 0; k < n; k++) {
                    int64_t bytes = element_bytes(g);
                    for (int d = 0; d < g->ndim; d++) bytes *= pr->boxes[k].count[d];
                    ip->extents[k].offset = pr->boxes[k].offset;
                    ip->extents[k].length = bytes;
                }
                continue;
            }
            int f = src->piece_file[at];
            if (f < 0 || f >= src->num_files) return tp_fail(TP_ERR_ARG, "%s: tensor %s piece %d: no file %d", src->path, t->name, p, f);
            ip->file_index = f;
            snprintf(ip->file, sizeof ip->file, "%s", index->files[f].name);
            ip->num_extents = 1;
            if (!(ip->extents = calloc(1, sizeof *ip->extents))) return tp_fail(TP_ERR_NOMEM, "out of memory");
            ip->extents[0].offset = src->piece_offset[at];
            ip->extents[0].length = g->bytes;
            if (src->piece_offset[at] < 0 || src->piece_offset[at] > src->file_bytes[f] - g->bytes)
                return tp_fail(TP_ERR_FORMAT, "%s: tensor %s piece %d: %lld bytes at %lld lie outside the file (%lld bytes)",
                               src->files[f], t->name, p, (long long)g->bytes, (long long)src->piece_offset[at],
                               (long long)src->file_bytes[f]);
        }
    }
    return TP_OK;
}

/* Each tensor's logical digest: the sum of its pieces' (piece_digest). */
static int foreign_digests(ckpt_reader *r)
{
    int status = TP_OK;
    for (int i = 0; i < r->index.num_tensors && !status; i++) {
        ckpt_index_tensor *it = &r->index.tensors[i];
        it->digest = 0;
        for (int p = 0; p < it->num_pieces && !status; p++) {
            piece_ctx c;
            status = piece_digest(r, i, p, &c, &it->pieces[p].digest);
            it->digest += it->pieces[p].digest;
        }
    }
    return status;
}

/* The digests a foreign checkpoint records: each tensor's, its one piece's. */
static int recorded_digests(ckpt_reader *r, const ckpt_foreign *src)
{
    if (src->layout.tp != 1)
        return tp_fail(TP_ERR_ARG, "%s: recorded digests of a checkpoint at tp %d (only at tp 1)", src->path, src->layout.tp);
    for (int i = 0; i < r->index.num_tensors; i++) {
        ckpt_index_tensor *it = &r->index.tensors[i];
        it->digest = src->digests[i];
        for (int p = 0; p < it->num_pieces; p++) it->pieces[p].digest = src->digests[i];
    }
    r->recorded_digests = 1;
    return TP_OK;
}

int ckpt_reader_open_foreign(ckpt_reader **out, const ckpt_foreign *source, int compute_digests)
{
    *out = NULL;
    int status = ckpt_library_init();
    if (status) return status;
    ckpt_reader *r = calloc(1, sizeof *r);
    if (!r) return tp_fail(TP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&r->lock, NULL);
    ckpt_read_options_init(&r->options);
    r->options.verify = 0; /* nothing to verify against */
    r->foreign = 1;
    r->serial = ++reader_serials;
    snprintf(r->path, sizeof r->path, "%s", source->path);
    status = source->num_files > 0 ? store_for(source->files[0], &r->storage)
                                   : tp_fail(TP_ERR_ARG, "%s: no files", source->path);
    if (!status) status = foreign_index(r, source);
    if (!status && source->num_checks)
        status = foreign_checks_create(source->checks, source->num_checks, source->files, source->num_files, &r->checks);
    if (!status && compute_digests) status = foreign_digests(r);
    else if (!status && source->digests) status = recorded_digests(r, source);
    if (status) {
        ckpt_reader_close(r);
        return status;
    }
    tp_fault_point("foreign-opened"); /* a test holds a reader here: opened, its data not yet read */
    *out = r;
    return TP_OK;
}
