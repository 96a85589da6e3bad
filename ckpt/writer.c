/* writer.c: writing shard files into a staging directory.
 *
 * Each piece is a dataset under /tensors/<name>. Uncompressed pieces are
 * contiguous datasets allocated when declared; their bytes are written with
 * pwrite() at the offset HDF5 reports, from any thread, outside HDF5's global
 * lock. Compressed pieces are chunked (one chunk per checksum block); chunks
 * are compressed in the caller's thread and stored with H5Dwrite_chunk.
 * Block hashes are taken from the caller's buffer as rows arrive. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/memory.h"
#include "../common/parallel.h"
#include "attrs.h"
#include "commit.h"
#include "namemap.h"

typedef struct {
    int pp, tp, dp; /* dp > 0: the shard's data-parallel file (format 1.6) */
    char path[CKPT_PATH_MAX];
    hid_t file;      /* HDF5's handle: metadata */
    store_file *data; /* the store's: the bytes of pieces */
} shard_file;

typedef struct {
    int shard; /* index into writer->shards, -1 when another process writes it */
    ckpt_piece_geometry geometry;
    int64_t offset; /* contiguous: file offset of the data; -1 when chunked */
    uint64_t *block_hash;
    uint8_t *block_done;
    int64_t blocks_done;
    uint64_t digest; /* logical digest of the rows written so far */
    convert_nonfinite nonfinite; /* their NaNs and infinities (options.count_nonfinite) */
} piece_state;

typedef struct {
    ckpt_tensor_copy tensor;
    int stage;
    int num_pieces;
    piece_state *pieces;
} tensor_state;

struct ckpt_writer {
    char path[CKPT_PATH_MAX];
    const store_ops *storage;
    store_staged *staged;         /* this writer's staging directory (not distributed) */
    char staging[CKPT_PATH_MAX]; /* its path; distributed: the shared one */
    ckpt_layout layout;
    ckpt_write_options options;
    int distributed;
    shard_file *shards;
    int num_shards;
    tensor_state *tensors;
    int num_tensors, capacity;
    ckpt_name_map names;
    pthread_mutex_t lock; /* bookkeeping of blocks written */
    /* The bytes of the pieces this writer writes, as declared; before the
     * first is written, uncompressed, the file system's room for them is
     * checked once (room_checked; room_status its verdict). */
    int64_t declared_bytes;
    int room_checked, room_status;
    char room_message[2 * CKPT_PATH_MAX + 128];
};

/* Shard files made durable at once, at most. */
#define SYNC_THREADS_MAX 16

void ckpt_write_options_init(ckpt_write_options *options)
{
    memset(options, 0, sizeof *options);
    options->shard_pp = -1;
    options->shard_tp = -1;
}

static const char *tensor_name_of(const void *ctx, int64_t i)
{
    const ckpt_writer *w = ctx;
    return w->tensors[i].tensor.name;
}

static int shard_index(const ckpt_writer *w, int pp, int tp)
{
    if (!w->distributed) return pp * w->layout.tp + tp;
    return pp == w->options.shard_pp && tp == w->options.shard_tp ? 0 : -1;
}

static int open_shard(ckpt_writer *w, shard_file *s)
{
    char name[64];
    ckpt_shard_file_name(s->pp, s->tp, s->dp, name, sizeof name);
    s->file = -1;
    s->data = NULL;
    int status = tp_path_join(s->path, w->staging, name);
    if (status) return status;
    hid_t fapl = ckpt_h5_file_access();
    if (fapl < 0) return ckpt_fail_hdf5("%s: cannot set up file access", s->path);
    s->file = H5Fcreate(s->path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    /* Read HDF5's error stack before another call of its API clears it (a
     * full disk was "no detail from HDF5"). */
    status = s->file < 0 ? ckpt_fail_hdf5("%s: cannot create shard file", s->path) : TP_OK;
    H5Pclose(fapl);
    if (status) return status;
    int64_t version[2] = {CKPT_FORMAT_MAJOR, CKPT_FORMAT_MINOR};
    int64_t coords[2] = {s->pp, s->tp};
    int64_t complete = 0;
    status = ckpt_h5_write_string(s->file, "format", CKPT_FORMAT_TAG);
    if (!status) status = ckpt_h5_write_i64s(s->file, "format_version", version, 2);
    if (!status) status = ckpt_h5_write_i64s(s->file, "shard_pp_tp", coords, 2);
    int64_t dp = s->dp;
    if (!status && dp > 0) status = ckpt_h5_write_i64s(s->file, "shard_dp", &dp, 1);
    if (!status) status = ckpt_shard_layout_write(s->file, &w->layout);
    if (!status) status = ckpt_h5_write_i64s(s->file, "complete", &complete, 1);
    if (status) return tp_fail_context(status, "%s", s->path);
    TP_TRY(w->storage->open(w->storage, s->path, STORE_OPEN_WRITE, &s->data));
    return TP_OK;
}

static void close_shard(const ckpt_writer *w, shard_file *s)
{
    if (s->file >= 0) H5Fclose(s->file);
    if (s->data) w->storage->close(s->data);
    s->file = -1;
    s->data = NULL;
}

/* Frees the writer; a staging directory it still holds is removed. */
static void free_writer(ckpt_writer *w)
{
    for (int i = 0; i < w->num_shards; i++) close_shard(w, &w->shards[i]);
    store_staged_discard(w->staged);
    for (int i = 0; i < w->num_tensors; i++) {
        for (int p = 0; p < w->tensors[i].num_pieces; p++) {
            free(w->tensors[i].pieces[p].block_hash);
            free(w->tensors[i].pieces[p].block_done);
        }
        free(w->tensors[i].pieces);
    }
    free(w->tensors);
    free(w->shards);
    ckpt_name_map_free(&w->names);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

/* The store a writer with these options uses for path. */
static int storage_of(const ckpt_write_options *options, const char *path, const store_ops **out)
{
    *out = options->storage;
    return *out ? TP_OK : store_for(path, out);
}

/* owner NULL: a fresh one, private to this writer. */
static int stage_checkpoint(const ckpt_write_options *options, const char *path, const char *owner,
                            store_staged **out)
{
    const store_ops *storage;
    TP_TRY(storage_of(options, path, &storage));
    store_stage_options stage = {.directory = 1, .overwrite = options->overwrite,
                                 .may_replace = ckpt_may_replace_checkpoint, .owner = owner,
                                 .wait_for_readers = options->wait_for_readers};
    return store_stage(storage, path, &stage, out);
}

int ckpt_stage_prepare(const char *path, const ckpt_write_options *options)
{
    store_staged *staged = NULL;
    /* Shared with the distributed writers, which find it by the owner's name;
     * held in the staging registry until ckpt_commit_staged or
     * ckpt_stage_discard. */
    const char *owner = options->staging_owner ? options->staging_owner : store_process_owner();
    return stage_checkpoint(options, path, owner, &staged);
}

/* The staging directory this process prepared for a distributed checkpoint. */
static int prepared(const char *path, const ckpt_write_options *options, store_staged **out)
{
    char staging[CKPT_PATH_MAX];
    TP_TRY(store_staging_path(path, options->staging_owner, staging, sizeof staging));
    *out = store_staged_find(staging);
    if (!*out) return tp_fail(TP_ERR_STATE, "%s: no staging directory %s prepared by this process", path, staging);
    return TP_OK;
}

void ckpt_stage_discard(const char *path, const ckpt_write_options *options)
{
    /* Not through prepared(): nothing prepared is no failure here, and the
     * caller's message (why the staging failed) must stay. */
    char staging[CKPT_PATH_MAX];
    store_staged *staged = store_staging_path(path, options->staging_owner, staging, sizeof staging) == TP_OK
                               ? store_staged_find(staging)
                               : NULL;
    if (staged) store_staged_discard(staged);
}

int ckpt_writer_create(ckpt_writer **out, const char *path, const ckpt_layout *layout,
                       const ckpt_write_options *options)
{
    *out = NULL;
    ckpt_write_options defaults;
    if (!options) {
        ckpt_write_options_init(&defaults);
        options = &defaults;
    }
    int status = ckpt_library_init();
    if (status) return status;
    status = ckpt_layout_check(layout);
    if (status) return status;
    if (options->compress_level < 0 || options->compress_level > 22)
        return tp_fail(TP_ERR_ARG, "zstd level %d outside 1..22", options->compress_level);
    int distributed = options->shard_pp >= 0;
    if (distributed && (options->shard_pp >= layout->pp || options->shard_tp < 0 ||
                        options->shard_tp >= layout->tp))
        return tp_fail(TP_ERR_ARG, "shard pp=%d tp=%d is outside layout tp=%d pp=%d",
                         options->shard_pp, options->shard_tp, layout->tp, layout->pp);
    if (options->shard_dp < 0 || options->shard_dp >= layout->dp || (options->shard_dp > 0 && !distributed))
        return tp_fail(TP_ERR_ARG, "data-parallel file %d: outside 1..%d, or not for a distributed writer",
                       options->shard_dp, layout->dp - 1);
    if (strlen(path) >= CKPT_PATH_MAX) return tp_fail(TP_ERR_ARG, "path too long: %s", path);

    ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return tp_fail(TP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&w->lock, NULL);
    strcpy(w->path, path);
    w->layout = *layout;
    w->options = *options;
    w->distributed = distributed;
    status = storage_of(options, path, &w->storage);
    if (!status && !distributed) {
        status = stage_checkpoint(options, path, NULL, &w->staged);
        if (!status) strcpy(w->staging, store_staged_path(w->staged));
    }
    if (!status && distributed) status = store_staging_path(path, options->staging_owner, w->staging, sizeof w->staging);
    if (!status && distributed) {
        store_stat st;
        status = w->storage->stat(w->storage, w->staging, &st);
        if (!status && (!st.exists || !st.is_dir))
            status = tp_fail(TP_ERR_STATE, "%s: staging directory %s missing (ckpt_stage_prepare not called?)", path,
                             w->staging);
    }
    if (status) {
        free_writer(w);
        return status;
    }
    w->num_shards = distributed ? 1 : layout->tp * layout->pp;
    w->shards = calloc((size_t)w->num_shards, sizeof *w->shards);
    if (!w->shards) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; !status && i < w->num_shards; i++) {
        w->shards[i].pp = distributed ? options->shard_pp : i / layout->tp;
        w->shards[i].tp = distributed ? options->shard_tp : i % layout->tp;
        w->shards[i].dp = distributed ? options->shard_dp : 0;
        status = open_shard(w, &w->shards[i]);
    }
    if (status) {
        ckpt_writer_abort(w);
        return status;
    }
    *out = w;
    return TP_OK;
}

/* Creates the dataset of one piece, with its attributes; records the offset
 * of contiguous data. */
static int create_piece(ckpt_writer *w, tensor_state *ts, int piece, piece_state *ps)
{
    const ckpt_tensor_desc *t = &ts->tensor.desc;
    shard_file *s = &w->shards[ps->shard];
    char dset_path[CKPT_NAME_MAX + 32];
    snprintf(dset_path, sizeof dset_path, "/%s/%s", CKPT_TENSOR_GROUP, t->name);
    hsize_t dims[CKPT_MAX_DIMS], chunk[CKPT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) dims[d] = chunk[d] = (hsize_t)ps->geometry.shape[d];
    chunk[0] = (hsize_t)ps->geometry.block_rows;

    hid_t type = ckpt_h5_type(t->dtype);
    hid_t space = H5Screate_simple(t->ndim, dims, NULL);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t dset = -1;
    int status = TP_OK;
    /* Attributes kept in the object header (HDF5 moves more than 8 to a
     * heap and B-tree of their own per dataset): declaring, sealing and
     * committing 1776 pieces took 0.43 s with them there, 0.33 s here. */
    int ok = type >= 0 && space >= 0 && lcpl >= 0 && dcpl >= 0 &&
             H5Pset_create_intermediate_group(lcpl, 1) >= 0 && H5Pset_attr_phase_change(dcpl, 64, 48) >= 0;
    if (ok && w->options.compress_level > 0) {
        unsigned level = (unsigned)w->options.compress_level;
        ok = H5Pset_chunk(dcpl, t->ndim, chunk) >= 0 && H5Pset_shuffle(dcpl) >= 0 &&
             H5Pset_filter(dcpl, CKPT_ZSTD_FILTER_ID, H5Z_FLAG_OPTIONAL, 1, &level) >= 0;
    } else if (ok) {
        /* Space reserved now, never filled by HDF5: the data arrives by pwrite. */
        ok = H5Pset_layout(dcpl, H5D_CONTIGUOUS) >= 0 &&
             H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0 &&
             H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0;
    }
    if (ok) dset = H5Dcreate2(s->file, dset_path, type, space, lcpl, dcpl, H5P_DEFAULT);
    if (!ok || dset < 0) {
        status = ckpt_fail_hdf5("%s: cannot create dataset for tensor %s", s->path, t->name);
    } else {
        ckpt_piece_attrs attrs = {ts->tensor, piece, w->layout.tp, w->num_tensors,
                                  ps->geometry.block_rows, 0, 0};
        status = ckpt_attrs_write(dset, &attrs);
        if (status) status = tp_fail_context(status, "%s", s->path);
        ps->offset = -1;
        if (!status && w->options.compress_level == 0) {
            haddr_t offset = H5Dget_offset(dset);
            if (offset == HADDR_UNDEF)
                status = ckpt_fail_hdf5("%s: tensor %s has no file offset", s->path, t->name);
            ps->offset = (int64_t)offset;
        }
    }
    if (dset >= 0) H5Dclose(dset);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (status) return status;
    ps->block_hash = calloc((size_t)ps->geometry.num_blocks, sizeof *ps->block_hash);
    ps->block_done = calloc((size_t)ps->geometry.num_blocks, 1);
    if (!ps->block_hash || !ps->block_done) return tp_fail(TP_ERR_NOMEM, "out of memory");
    return TP_OK;
}

/* here: whether this writer writes the tensor's pieces of its shards. */
static int add_tensor(ckpt_writer *w, const ckpt_tensor_desc *tensor, int here, int *id_out)
{
    *id_out = -1;
    int status = ckpt_library_init();
    if (status) return status;
    if (w->num_tensors == w->capacity) {
        int capacity = w->capacity ? 2 * w->capacity : 64;
        tensor_state *grown = realloc(w->tensors, (size_t)capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
        w->tensors = grown;
        w->capacity = capacity;
        for (int k = 0; k < w->num_tensors; k++) ckpt_tensor_copy_rebind(&grown[k].tensor);
    }
    tensor_state *ts = &w->tensors[w->num_tensors];
    memset(ts, 0, sizeof *ts);
    status = ckpt_tensor_copy_init(&ts->tensor, tensor);
    if (!status) status = ckpt_tensor_check(&ts->tensor.desc, w->layout.tp);
    if (status) return status;
    const ckpt_tensor_desc *t = &ts->tensor.desc;
    if (t->anchor == CKPT_ANCHOR_LAYER && t->layer >= w->layout.num_layers)
        return tp_fail(TP_ERR_ARG, "tensor %s: layer %lld outside the model's %lld layers",
                         t->name, (long long)t->layer, (long long)w->layout.num_layers);
    ts->stage = ckpt_tensor_stage(t, &w->layout);
    ts->num_pieces = ckpt_piece_count(t, w->layout.tp);
    ts->pieces = calloc((size_t)ts->num_pieces, sizeof *ts->pieces);
    if (!ts->pieces) return tp_fail(TP_ERR_NOMEM, "out of memory");
    /* Registered before the pieces so that free_writer releases them on failure. */
    status = ckpt_name_map_insert(&w->names, t->name, w->num_tensors, tensor_name_of, w);
    if (status) {
        free(ts->pieces);
        return status;
    }
    w->num_tensors++;
    for (int p = 0; p < ts->num_pieces; p++) {
        piece_state *ps = &ts->pieces[p];
        ps->nonfinite.first = -1;
        ps->shard = here ? shard_index(w, ts->stage, t->partition.kind == CKPT_SPLIT ? p : 0) : -1;
        ckpt_piece_geometry_init(&ps->geometry, t, w->layout.tp, 0);
        if (ps->shard >= 0) {
            status = create_piece(w, ts, p, ps);
            if (status) return status;
            w->declared_bytes += ps->geometry.rows * ps->geometry.row_bytes;
        }
    }
    *id_out = w->num_tensors - 1;
    return TP_OK;
}

int ckpt_writer_add_tensor(ckpt_writer *w, const ckpt_tensor_desc *tensor, int *id_out)
{
    return add_tensor(w, tensor, 1, id_out);
}

int ckpt_writer_add_tensor_elsewhere(ckpt_writer *w, const ckpt_tensor_desc *tensor, int *id_out)
{
    return add_tensor(w, tensor, 0, id_out);
}

static int get_piece(const ckpt_writer *w, int id, int piece, piece_state **out)
{
    if (id < 0 || id >= w->num_tensors)
        return tp_fail(TP_ERR_ARG, "tensor id %d out of range (0..%d)", id, w->num_tensors - 1);
    const tensor_state *ts = &w->tensors[id];
    if (piece < 0 || piece >= ts->num_pieces)
        return tp_fail(TP_ERR_ARG, "tensor %s: piece %d out of range (0..%d)", ts->tensor.name,
                         piece, ts->num_pieces - 1);
    if (ts->pieces[piece].shard < 0)
        return tp_fail(TP_ERR_ARG, "tensor %s: piece %d belongs to a shard this writer does not write",
                         ts->tensor.name, piece);
    *out = &ts->pieces[piece];
    return TP_OK;
}

int ckpt_writer_owns_piece(const ckpt_writer *w, int id, int piece)
{
    return id >= 0 && id < w->num_tensors && piece >= 0 && piece < w->tensors[id].num_pieces &&
           w->tensors[id].pieces[piece].shard >= 0;
}

int64_t ckpt_writer_block_rows(const ckpt_writer *w, int id)
{
    if (id < 0 || id >= w->num_tensors) return -1;
    return ckpt_piece_block_rows(&w->tensors[id].tensor.desc, w->layout.tp);
}

/* Shuffles, compresses and stores blocks [first, first + count) of a chunked
 * piece. */
static int write_chunks(ckpt_writer *w, const tensor_state *ts, const piece_state *ps,
                        int64_t first, int64_t count, const char *data)
{
    const ckpt_piece_geometry *g = &ps->geometry;
    const shard_file *s = &w->shards[ps->shard];
    size_t chunk_bytes = (size_t)(g->block_rows * g->row_bytes);
    size_t element_size = tp_dtype_size(ts->tensor.desc.dtype);
    size_t capacity = ckpt_zstd_bound(chunk_bytes);
    char *padded = alloc_pages(chunk_bytes), *shuffled = alloc_pages(chunk_bytes);
    char *packed = alloc_pages(capacity);
    char dset_path[CKPT_NAME_MAX + 32];
    snprintf(dset_path, sizeof dset_path, "/%s/%s", CKPT_TENSOR_GROUP, ts->tensor.name);
    hid_t dset = H5Dopen2(s->file, dset_path, H5P_DEFAULT);
    int status = TP_OK;
    if (!padded || !shuffled || !packed) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    else if (dset < 0) status = ckpt_fail_hdf5("%s: cannot open tensor %s", s->path, ts->tensor.name);
    for (int64_t b = first; !status && b < first + count; b++) {
        int64_t rows = g->rows - b * g->block_rows;
        if (rows > g->block_rows) rows = g->block_rows;
        const char *block = data + (b - first) * g->block_rows * g->row_bytes;
        if (rows < g->block_rows) { /* HDF5 stores edge chunks at full size */
            memcpy(padded, block, (size_t)(rows * g->row_bytes));
            memset(padded + rows * g->row_bytes, 0, chunk_bytes - (size_t)(rows * g->row_bytes));
            block = padded;
        }
        ckpt_shuffle(block, shuffled, chunk_bytes, element_size);
        size_t packed_size = 0;
        status = ckpt_zstd_compress(shuffled, chunk_bytes, packed, capacity,
                                    w->options.compress_level, &packed_size);
        if (status) break;
        /* An incompressible chunk is stored as it is, both (optional) filters skipped. */
        int raw = packed_size >= chunk_bytes;
        uint32_t filter_mask = raw ? CKPT_MASK_NO_SHUFFLE | CKPT_MASK_NO_ZSTD : 0;
        hsize_t offset[CKPT_MAX_DIMS] = {0};
        offset[0] = (hsize_t)(b * g->block_rows);
        if (H5Dwrite_chunk(dset, H5P_DEFAULT, filter_mask, offset, raw ? chunk_bytes : packed_size,
                           raw ? block : packed) < 0)
            status = ckpt_fail_hdf5("%s: cannot write chunk %lld of tensor %s", s->path,
                                    (long long)b, ts->tensor.name);
    }
    if (dset >= 0) H5Dclose(dset);
    free(padded);
    free(shuffled);
    free(packed);
    return status;
}

int ckpt_writer_put_rows(ckpt_writer *w, int id, int piece, int64_t row_start, int64_t row_count,
                         const void *data)
{
    piece_state *ps;
    int status = ckpt_library_init();
    if (!status) status = get_piece(w, id, piece, &ps);
    if (status) return status;
    const tensor_state *ts = &w->tensors[id];
    const ckpt_piece_geometry *g = &ps->geometry;
    if (row_start < 0 || row_count < 1 || row_start + row_count > g->rows)
        return tp_fail(TP_ERR_ARG, "tensor %s piece %d: rows [%lld, %lld) outside 0..%lld",
                         ts->tensor.name, piece, (long long)row_start,
                         (long long)(row_start + row_count), (long long)g->rows);
    if (row_start % g->block_rows != 0 ||
        (row_count % g->block_rows != 0 && row_start + row_count != g->rows))
        return tp_fail(TP_ERR_ARG,
                         "tensor %s piece %d: rows [%lld, %lld) do not cover whole blocks of %lld rows",
                         ts->tensor.name, piece, (long long)row_start,
                         (long long)(row_start + row_count), (long long)g->block_rows);
    int64_t first = row_start / g->block_rows;
    int64_t count = (row_count + g->block_rows - 1) / g->block_rows;
    pthread_mutex_lock(&w->lock);
    /* The writers declare every tensor before the first rows: an output
     * that cannot fit is refused before its data is written, not at the
     * disk's end (compressed, its size is not known). */
    if (!w->room_checked) {
        w->room_checked = 1;
        char parent[CKPT_PATH_MAX], base[CKPT_PATH_MAX]; /* the staging directory's, named as the output's */
        if (w->options.compress_level == 0 && tp_split_path(w->path, parent, sizeof parent, base, sizeof base) == TP_OK)
            w->room_status = store_check_room(w->storage, parent, w->declared_bytes);
        if (w->room_status) snprintf(w->room_message, sizeof w->room_message, "%s: %s", w->path, tp_errmsg());
    }
    if (w->room_status) status = tp_fail(w->room_status, "%s", w->room_message); /* each thread's own message */
    for (int64_t b = first; b < first + count && !status; b++)
        if (ps->block_done[b])
            status = tp_fail(TP_ERR_STATE, "tensor %s piece %d: rows from %lld written twice",
                               ts->tensor.name, piece, (long long)(b * g->block_rows));
    for (int64_t b = first; b < first + count && !status; b++) ps->block_done[b] = 2; /* claimed */
    pthread_mutex_unlock(&w->lock);
    if (status) return status;

    const char *bytes = data;
    for (int64_t b = first; b < first + count; b++) {
        int64_t rows = g->rows - b * g->block_rows;
        if (rows > g->block_rows) rows = g->block_rows;
        ps->block_hash[b] = ckpt_hash_block(bytes + (b - first) * g->block_rows * g->row_bytes,
                                            (size_t)(rows * g->row_bytes));
    }
    convert_nonfinite found = {0, 0, -1};
    uint64_t digest = ckpt_digest_rows_counting(&ts->tensor.desc, w->layout.tp, piece, row_start, row_start + row_count,
                                                data, w->options.count_nonfinite ? &found : NULL);
    if (ps->offset >= 0)
        status = w->storage->write_at(w->shards[ps->shard].data, data, (size_t)(row_count * g->row_bytes),
                                      ps->offset + row_start * g->row_bytes);
    else
        status = write_chunks(w, ts, ps, first, count, data);

    pthread_mutex_lock(&w->lock);
    for (int64_t b = first; b < first + count; b++) ps->block_done[b] = status ? 0 : 1;
    if (!status) {
        ps->blocks_done += count;
        ps->digest += digest;
        convert_nonfinite_add(&ps->nonfinite, found, 0);
    }
    pthread_mutex_unlock(&w->lock);
    return status;
}

convert_nonfinite ckpt_writer_nonfinite(ckpt_writer *w, int id)
{
    convert_nonfinite sum = {0, 0, -1};
    if (id < 0 || id >= w->num_tensors) return sum;
    const tensor_state *ts = &w->tensors[id];
    pthread_mutex_lock(&w->lock);
    for (int p = 0; p < ts->num_pieces; p++) convert_nonfinite_add(&sum, ts->pieces[p].nonfinite, 0);
    pthread_mutex_unlock(&w->lock);
    return sum;
}

int ckpt_writer_put_piece(ckpt_writer *w, int id, int piece, const void *data)
{
    piece_state *ps;
    int status = get_piece(w, id, piece, &ps);
    if (status) return status;
    return ckpt_writer_put_rows(w, id, piece, 0, ps->geometry.rows, data);
}

/* Writes the checksums of every piece of shard s and marks the file complete. */
static int seal_shard(ckpt_writer *w, int s)
{
    shard_file *sf = &w->shards[s];
    int status = TP_OK;
    for (int i = 0; i < w->num_tensors && !status; i++) {
        tensor_state *ts = &w->tensors[i];
        for (int p = 0; p < ts->num_pieces && !status; p++) {
            piece_state *ps = &ts->pieces[p];
            if (ps->shard != s) continue;
            if (ps->blocks_done != ps->geometry.num_blocks) {
                status = tp_fail(TP_ERR_STATE,
                                   "tensor %s piece %d is incomplete: %lld of %lld blocks written",
                                   ts->tensor.name, p, (long long)ps->blocks_done,
                                   (long long)ps->geometry.num_blocks);
                break;
            }
            status = ckpt_seal_piece(sf->file, sf->path, ts->tensor.name, ps->block_hash,
                                     ps->geometry.num_blocks, ps->digest);
        }
    }
    /* Format 1.6: the tensors with pieces in this shard, wherever they are
     * written (ckpt_writer_add_tensor_elsewhere), so that the commit knows
     * what every file of the shard must hold between them. */
    int64_t shard_tensors = 0, complete = 1;
    for (int i = 0; i < w->num_tensors; i++)
        shard_tensors += w->tensors[i].stage == sf->pp &&
                         (w->tensors[i].tensor.desc.partition.kind == CKPT_SPLIT || sf->tp == 0);
    if (!status) status = ckpt_h5_write_i64s(sf->file, "shard_tensors", &shard_tensors, 1);
    if (!status) {
        if (H5Adelete(sf->file, "complete") < 0)
            status = ckpt_fail_hdf5("%s: cannot update attribute complete", sf->path);
        else
            status = ckpt_h5_write_i64s(sf->file, "complete", &complete, 1);
    }
    if (!status && H5Fclose(sf->file) < 0)
        status = ckpt_fail_hdf5("%s: cannot close shard file", sf->path);
    sf->file = -1;
    return status;
}

static int sync_shard(void *ctx, int64_t s, int thread)
{
    (void)thread;
    ckpt_writer *w = ctx;
    return w->storage->sync(w->shards[s].data);
}

/* Most of the data is on its way to the disk already (the store starts
 * writeback as it writes); the syncs run at once, so that the file system
 * makes their journal commits one (8 shards' fsyncs one after another cost
 * 0.8-1.1 s of a 2.5 GB reshard, where one `sync` after cp costs one commit). */
static int seal_all(ckpt_writer *w)
{
    ckpt_library_init();
    for (int s = 0; s < w->num_shards; s++) {
        int status = seal_shard(w, s);
        if (status) return status;
    }
    int threads = w->num_shards < SYNC_THREADS_MAX ? w->num_shards : SYNC_THREADS_MAX;
    return parallel_for(w->num_shards, threads, sync_shard, w);
}

int ckpt_writer_finish(ckpt_writer *w)
{
    int status = seal_all(w);
    free_writer(w);
    return status;
}

int ckpt_writer_commit(ckpt_writer *w, const ckpt_train_state *state)
{
    if (w->distributed) {
        ckpt_writer_abort(w);
        return tp_fail(TP_ERR_STATE, "a distributed writer ends with ckpt_writer_finish");
    }
    int status = seal_all(w);
    if (status) {
        ckpt_writer_abort(w);
        return status;
    }
    store_staged *staged = w->staged;
    w->staged = NULL;
    status = ckpt_commit_directory(w->storage, staged, w->path, &w->layout, state, &w->options);
    free_writer(w);
    return status;
}

void ckpt_writer_abort(ckpt_writer *w)
{
    if (!w) return;
    free_writer(w);
}

int ckpt_commit_staged(const char *path, const ckpt_layout *layout, const ckpt_train_state *state,
                       const ckpt_write_options *options)
{
    int status = ckpt_library_init();
    if (!status) status = ckpt_layout_check(layout);
    const store_ops *storage;
    store_staged *staged = NULL;
    if (!status) status = storage_of(options, path, &storage);
    if (!status) status = prepared(path, options, &staged);
    if (status) {
        store_staged_discard(staged);
        return status;
    }
    return ckpt_commit_directory(storage, staged, path, layout, state, options);
}
