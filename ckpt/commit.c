/* commit.c: from a staging directory of complete shard files to a visible
 * checkpoint. The index is built from the shard files themselves (their
 * attributes are the single source of truth), so distributed writers need
 * no side channel: each rank writes its shard, one process commits.
 *
 * Durability order: shard files fsynced (by their writers), index.json
 * written and fsynced, staging directory fsynced, renamed to its final name,
 * parent fsynced, then `latest` replaced by rename. A crash before the rename
 * leaves only a hidden staging directory; after it, a complete checkpoint. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/file.h"
#include "attrs.h"
#include "commit.h"
#include "index.h"
#include "namemap.h"

int ckpt_seal_piece(hid_t file, const char *file_path, const char *tensor_name,
                    const uint64_t *block_hashes, int64_t num_blocks, uint64_t digest)
{
    char path[CKPT_NAME_MAX + 32];
    uint64_t checksum = ckpt_hash_blocks(block_hashes, num_blocks);
    hsize_t dims[1] = {(hsize_t)num_blocks};
    hid_t space = H5Screate_simple(1, dims, NULL);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    hid_t sums = -1, dset = -1;
    int status = TP_OK;
    snprintf(path, sizeof path, "/%s/%s", CKPT_CHECKSUM_GROUP, tensor_name);
    if (space < 0 || lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        (sums = H5Dcreate2(file, path, H5T_STD_U64LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
        H5Dwrite(sums, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, block_hashes) < 0)
        status = ckpt_fail_hdf5("%s: cannot store block checksums of tensor %s", file_path, tensor_name);
    snprintf(path, sizeof path, "/%s/%s", CKPT_TENSOR_GROUP, tensor_name);
    if (!status && (dset = H5Dopen2(file, path, H5P_DEFAULT)) < 0)
        status = ckpt_fail_hdf5("%s: cannot open tensor %s", file_path, tensor_name);
    if (!status) status = ckpt_h5_write_u64(dset, "checksum", checksum);
    if (!status) status = ckpt_h5_write_u64(dset, "digest", digest);
    if (dset >= 0) H5Dclose(dset);
    if (sums >= 0) H5Dclose(sums);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (space >= 0) H5Sclose(space);
    return status;
}

/* ------------------------------------------------------------ index build */

/* An index being built: from the shard files of a staging directory (one
 * process commits), or from the parts processes describe of their own
 * shards (a distributed commit, ckpt_index_from_parts). A file entry
 * without a name is not known yet. */
typedef struct {
    ckpt_index index;
    ckpt_name_map names;
    int capacity;
    int files_capacity; /* the shards' files first (tp x pp), then data-parallel files (format 1.6) */
    ckpt_name_map dp_file_names; /* the data-parallel files' names: each once */
} index_builder;

static int builder_init(index_builder *b, const ckpt_layout *layout, const ckpt_train_state *state)
{
    memset(b, 0, sizeof *b);
    b->index.major = CKPT_FORMAT_MAJOR;
    b->index.minor = CKPT_FORMAT_MINOR;
    b->index.layout = *layout;
    ckpt_train_state empty = {0, 0, NULL, NULL, NULL, NULL};
    TP_TRY(ckpt_index_set_state(&b->index, state ? state : &empty));
    b->index.num_files = b->files_capacity = layout->tp * layout->pp;
    b->index.files = calloc((size_t)b->index.num_files, sizeof *b->index.files);
    if (!b->index.files) return tp_fail(TP_ERR_NOMEM, "out of memory");
    return TP_OK;
}

/* A data-parallel file's entry (format 1.6), named, after the others; *at:
 * its place. Each file once. */
static int builder_dp_file(index_builder *b, int pp, int tp, int dp, const char *where, int *at)
{
    const ckpt_layout *layout = &b->index.layout;
    char name[64];
    ckpt_shard_file_name(pp, tp, dp, name, sizeof name);
    if (pp >= layout->pp || tp >= layout->tp || dp >= layout->dp)
        return tp_fail(TP_ERR_FORMAT, "%s: %s is not a file of layout tp=%d pp=%d dp=%d", where, name, layout->tp,
                       layout->pp, layout->dp);
    if (ckpt_name_map_find(&b->dp_file_names, name, ckpt_index_file_name_of, &b->index) >= 0)
        return tp_fail(TP_ERR_FORMAT, "%s: %s is described twice", where, name);
    if (b->index.num_files == b->files_capacity) {
        int capacity = 2 * b->files_capacity;
        ckpt_index_file *grown = realloc(b->index.files, (size_t)capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
        b->index.files = grown;
        b->files_capacity = capacity;
    }
    ckpt_index_file *file = &b->index.files[b->index.num_files];
    *file = (ckpt_index_file){.pp = pp, .tp = tp, .dp = dp};
    snprintf(file->name, sizeof file->name, "%s", name);
    TP_TRY(ckpt_name_map_insert(&b->dp_file_names, file->name, b->index.num_files, ckpt_index_file_name_of, &b->index));
    *at = b->index.num_files++;
    return TP_OK;
}

static void builder_free(index_builder *b)
{
    ckpt_name_map_free(&b->names);
    ckpt_name_map_free(&b->dp_file_names);
    ckpt_index_free(&b->index);
}

/* The file entry of shard f, named. */
static ckpt_index_file *builder_file(index_builder *b, int f)
{
    ckpt_index_file *file = &b->index.files[f];
    file->pp = f / b->index.layout.tp;
    file->tp = f % b->index.layout.tp;
    ckpt_shard_file_name(file->pp, file->tp, 0, file->name, sizeof file->name);
    return file;
}

static const char *index_name_of(const void *ctx, int64_t i)
{
    const ckpt_index *index = ctx;
    return index->tensors[i].tensor.name;
}

/* The entry of a tensor (*out: its position), added on its first piece;
 * every shard must describe it alike. */
static int builder_tensor(index_builder *b, const ckpt_tensor_copy *tensor, int stage, int64_t block_rows,
                          int64_t order, int64_t *out)
{
    ckpt_index *index = &b->index;
    const ckpt_tensor_desc *t = &tensor->desc;
    int64_t i = ckpt_name_map_find(&b->names, t->name, index_name_of, index);
    if (i < 0) {
        if (index->num_tensors == b->capacity) {
            int capacity = b->capacity ? 2 * b->capacity : 256;
            ckpt_index_tensor *grown = realloc(index->tensors, (size_t)capacity * sizeof *grown);
            if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
            index->tensors = grown;
            b->capacity = capacity;
            for (int k = 0; k < index->num_tensors; k++) ckpt_tensor_copy_rebind(&grown[k].tensor);
        }
        ckpt_index_tensor *it = &index->tensors[index->num_tensors];
        memset(it, 0, sizeof *it);
        it->tensor = *tensor;
        ckpt_tensor_copy_rebind(&it->tensor);
        it->stage = stage;
        it->block_rows = block_rows;
        it->order = order;
        it->num_pieces = ckpt_piece_count(t, index->layout.tp);
        it->pieces = calloc((size_t)it->num_pieces, sizeof *it->pieces);
        if (!it->pieces) return tp_fail(TP_ERR_NOMEM, "out of memory");
        for (int p = 0; p < it->num_pieces; p++) it->pieces[p].file_index = -1;
        i = index->num_tensors++;
        TP_TRY(ckpt_name_map_insert(&b->names, it->tensor.name, i, index_name_of, index));
    }
    ckpt_index_tensor *it = &index->tensors[i];
    if (!ckpt_tensor_equal(&it->tensor.desc, t) || it->block_rows != block_rows)
        return tp_fail(TP_ERR_FORMAT, "tensor %s is described differently in different shards", t->name);
    if (order < it->order) it->order = order;
    *out = i;
    return TP_OK;
}

/* Records piece p of tensor i, taking its extents; each piece once. */
static int builder_piece(index_builder *b, int64_t i, int p, ckpt_index_piece *piece)
{
    ckpt_index_tensor *it = &b->index.tensors[i];
    ckpt_index_piece *ip = &it->pieces[p];
    if (ip->file_index >= 0) {
        free(piece->extents);
        piece->extents = NULL;
        return tp_fail(TP_ERR_FORMAT, "tensor %s piece %d is stored twice", it->tensor.name, p);
    }
    *ip = *piece;
    piece->extents = NULL;
    return TP_OK;
}

static int by_order(const void *a, const void *b)
{
    const ckpt_index_tensor *x = a, *y = b;
    if (x->order != y->order) return x->order < y->order ? -1 : 1;
    return strcmp(x->tensor.name, y->tensor.name);
}

/* Every piece of every tensor found, and (format 1.6) every tensor the
 * writers of a shard declared; the tensors in their writers' order. */
static int builder_finish(index_builder *b, const char *where)
{
    ckpt_index *index = &b->index;
    int shards = index->layout.tp * index->layout.pp;
    int64_t *found = calloc((size_t)shards, sizeof *found);
    if (!found) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < index->num_tensors; i++) {
        const ckpt_index_tensor *it = &index->tensors[i];
        for (int p = 0; p < it->num_pieces; p++) {
            if (it->pieces[p].file_index < 0) {
                free(found);
                return tp_fail(TP_ERR_STATE, "%s: tensor %s has no piece %d in any shard", where, it->tensor.name, p);
            }
            found[it->stage * index->layout.tp + it->pieces[p].tp]++;
        }
    }
    for (int f = 0; f < index->num_files; f++) {
        const ckpt_index_file *file = &index->files[f];
        int64_t held = found[file->pp * index->layout.tp + file->tp];
        if (file->has_shard_tensors && file->shard_tensors != held) {
            free(found);
            return tp_fail(TP_ERR_STATE,
                           "%s: the writer of %s declared %lld tensors in shard pp=%d tp=%d, its files hold %lld "
                           "(a data-parallel file missing?)",
                           where, file->name, (long long)file->shard_tensors, file->pp, file->tp, (long long)held);
        }
    }
    free(found);
    if (index->num_tensors > 1) qsort(index->tensors, (size_t)index->num_tensors, sizeof *index->tensors, by_order);
    for (int k = 0; k < index->num_tensors; k++) ckpt_tensor_copy_rebind(&index->tensors[k].tensor);
    return TP_OK;
}

typedef struct {
    const store_ops *storage;
    index_builder *builder;
    const ckpt_index_file *file;
    const char *file_path;
    int status;
    hid_t h5file; /* the shard file being scanned */
} scan_state;

/* Where a piece's bytes lie (format 1.1): its contiguous data, or every
 * chunk (one per checksum block) of a compressed piece. */
static int piece_extents(hid_t dset, const char *name, const ckpt_piece_geometry *g, int compressed,
                         ckpt_extent **out, int64_t *count)
{
    int64_t n = compressed ? g->num_blocks : 1;
    ckpt_extent *extents = calloc((size_t)n, sizeof *extents);
    if (!extents) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = ckpt_h5_check_dataset_storage(dset, name);
    if (!status && !compressed) {
        haddr_t offset = H5Dget_offset(dset);
        hsize_t size = H5Dget_storage_size(dset);
        if (offset == HADDR_UNDEF || (int64_t)size != g->bytes)
            status = tp_fail(TP_ERR_FORMAT, "tensor %s: contiguous data not allocated in the file", name);
        extents[0] = (ckpt_extent){(int64_t)offset, (int64_t)size, 0};
    }
    char where[CKPT_NAME_MAX + 16];
    snprintf(where, sizeof where, "tensor %s", name);
    for (int64_t b = 0; !status && compressed && b < n; b++) {
        uint64_t address = 0, size = 0;
        unsigned mask = 0;
        status = ckpt_h5_chunk_location(dset, b, g->block_rows, where, &address, &size, &mask);
        extents[b] = (ckpt_extent){(int64_t)address, (int64_t)size, mask};
    }
    if (status) {
        free(extents);
        return status;
    }
    *out = extents;
    *count = n;
    return TP_OK;
}

/* Where the block checksums of a piece lie (format 1.2): contiguous,
 * num_blocks little-endian uint64. */
static int piece_checksums_at(hid_t file, const char *name, int64_t num_blocks, int64_t *out)
{
    char path[CKPT_NAME_MAX + 32];
    snprintf(path, sizeof path, "/%s/%s", CKPT_CHECKSUM_GROUP, name);
    hid_t sums = H5Dopen2(file, path, H5P_DEFAULT);
    if (sums < 0) return ckpt_fail_hdf5("tensor %s: block checksums missing", name);
    hid_t dcpl = H5Dget_create_plist(sums);
    H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    if (dcpl >= 0) H5Pclose(dcpl);
    haddr_t offset = H5Dget_offset(sums);
    hsize_t size = H5Dget_storage_size(sums);
    H5Dclose(sums);
    if (layout != H5D_CONTIGUOUS || offset == HADDR_UNDEF || offset == 0 || (int64_t)size != 8 * num_blocks)
        return tp_fail(TP_ERR_FORMAT, "tensor %s: block checksums not stored as %lld contiguous values", name,
                       (long long)num_blocks);
    *out = (int64_t)offset;
    return TP_OK;
}

/* Adds one dataset (a piece) of the file being scanned to the index. */
static int scan_piece(scan_state *st, hid_t dset)
{
    ckpt_index *index = &st->builder->index;
    ckpt_piece_attrs attrs;
    int status = ckpt_attrs_read(dset, &attrs, 1);
    if (status) return status;
    const ckpt_tensor_desc *t = &attrs.tensor.desc;
    if (attrs.tp != index->layout.tp)
        return tp_fail(TP_ERR_FORMAT, "tensor %s was written for tp=%d, the checkpoint has tp=%d",
                         t->name, attrs.tp, index->layout.tp);
    int stage = ckpt_tensor_stage(t, &index->layout);
    int expect_tp = t->partition.kind == CKPT_SPLIT ? attrs.piece : 0;
    if (stage != st->file->pp || expect_tp != st->file->tp)
        return tp_fail(TP_ERR_FORMAT,
                         "tensor %s piece %d belongs in shard pp=%d tp=%d, found in pp=%d tp=%d",
                         t->name, attrs.piece, stage, expect_tp, st->file->pp, st->file->tp);

    ckpt_piece_geometry g;
    ckpt_piece_geometry_init(&g, t, index->layout.tp, attrs.block_rows);
    int shape_ok, type_ok;
    ckpt_h5_dataset_form(dset, &g, t->dtype, &shape_ok, &type_ok);
    if (!shape_ok)
        return tp_fail(TP_ERR_FORMAT, "tensor %s: dataset shape does not match its partition",
                         t->name);
    /* Its stored type is its dtype: readers through the index alone (object
     * stores, tp-reshard) take the dtype from the index and never ask HDF5. */
    if (!type_ok)
        return tp_fail(TP_ERR_FORMAT, "tensor %s: dataset type is not its dtype %s", t->name, tp_dtype_name(t->dtype));
    hid_t dcpl = H5Dget_create_plist(dset);
    int compressed = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED;
    if (dcpl >= 0) H5Pclose(dcpl);
    ckpt_index_piece piece;
    memset(&piece, 0, sizeof piece);
    snprintf(piece.file, sizeof piece.file, "%s", st->file->name);
    piece.file_index = (int)(st->file - index->files);
    piece.pp = st->file->pp;
    piece.tp = st->file->tp;
    memcpy(piece.shape, g.shape, sizeof piece.shape);
    piece.bytes = g.bytes;
    piece.checksum = attrs.checksum;
    piece.digest = attrs.digest;
    piece.compressed = compressed;
    status = piece_checksums_at(st->h5file, t->name, g.num_blocks, &piece.checksums_at);
    if (!status) status = piece_extents(dset, t->name, &g, compressed, &piece.extents, &piece.num_extents);
    int64_t i = -1;
    if (!status) status = builder_tensor(st->builder, &attrs.tensor, stage, attrs.block_rows, attrs.order, &i);
    if (!status) return builder_piece(st->builder, i, attrs.piece, &piece);
    free(piece.extents);
    return status;
}

static herr_t visit_object(hid_t group, const char *name, const H5O_info_t *info, void *data)
{
    scan_state *st = data;
    if (info->type != H5O_TYPE_DATASET) return 0;
    hid_t lapl = ckpt_h5_link_access();
    hid_t dset = lapl >= 0 ? H5Dopen2(group, name, lapl) : -1;
    if (lapl >= 0) H5Pclose(lapl);
    if (dset < 0) {
        st->status = ckpt_fail_hdf5("%s: cannot open dataset %s", st->file_path, name);
        return -1;
    }
    st->status = scan_piece(st, dset);
    H5Dclose(dset);
    if (st->status) {
        st->status = tp_fail_context(st->status, "%s", st->file_path);
        return -1;
    }
    return 0;
}

/* Opens a shard file of the staging directory and checks its root attributes. */
static int scan_file(scan_state *st, const char *dir)
{
    char path[CKPT_PATH_MAX];
    int status = tp_path_join(path, dir, st->file->name);
    if (status) return status;
    st->file_path = path;
    store_stat info;
    TP_TRY(st->storage->stat(st->storage, path, &info));
    if (!info.exists)
        return tp_fail(TP_ERR_STATE, "%s missing: the writer of shard pp=%d tp=%d did not finish", path, st->file->pp,
                       st->file->tp);
    TP_TRY(tp_refuse_special(path)); /* HDF5 would block on a FIFO */
    hid_t fapl = ckpt_h5_file_access();
    hid_t file = fapl >= 0 ? H5Fopen(path, H5F_ACC_RDONLY, fapl) : -1;
    if (fapl >= 0) H5Pclose(fapl);
    if (file < 0) return ckpt_fail_hdf5("%s: cannot open shard file", path);
    int64_t complete = 0, coords[2] = {-1, -1}, dp = 0; /* shard_dp: 1.6 data-parallel files only */
    char format[64];
    status = ckpt_h5_read_string(file, "format", format, sizeof format);
    if (!status) status = ckpt_h5_read_i64s(file, "complete", &complete, 1, NULL);
    if (!status) {
        int n = 0;
        status = ckpt_h5_read_i64s(file, "shard_pp_tp", coords, 2, &n);
    }
    if (!status) status = ckpt_h5_read_optional_i64(file, "shard_dp", &dp, NULL);
    ckpt_index_file *file_entry = (ckpt_index_file *)st->file;
    file_entry->has_shard_tensors = 0;
    if (!status)
        status = ckpt_h5_read_optional_i64(file, "shard_tensors", &file_entry->shard_tensors, &file_entry->has_shard_tensors);
    if (status) status = tp_fail_context(status, "%s", path);
    else if (strcmp(format, CKPT_FORMAT_TAG) != 0 || coords[0] != st->file->pp ||
             coords[1] != st->file->tp || dp != st->file->dp)
        status = tp_fail(TP_ERR_FORMAT, "%s: not shard pp=%d tp=%d dp=%d of this checkpoint", path,
                           st->file->pp, st->file->tp, st->file->dp);
    else if (complete != 1)
        status = tp_fail(TP_ERR_STATE, "%s: the shard's writer did not finish", path);
    if (!status) status = ckpt_shard_layout_check(file, &st->builder->index.layout, path);
    if (!status) status = ckpt_h5_check_links(file, path);
    st->h5file = file;
    if (!status && H5Lexists(file, CKPT_TENSOR_GROUP, H5P_DEFAULT) > 0) {
        hid_t group = H5Gopen2(file, CKPT_TENSOR_GROUP, H5P_DEFAULT);
        st->status = TP_OK;
        if (group < 0 ||
            H5Ovisit2(group, H5_INDEX_NAME, H5_ITER_NATIVE, visit_object, st, H5O_INFO_BASIC) < 0 ||
            st->status)
            status = st->status ? st->status : ckpt_fail_hdf5("%s: cannot list tensors", path);
        if (group >= 0) H5Gclose(group);
    }
    H5Fclose(file);
    if (!status) status = st->storage->stat(st->storage, path, &info);
    ckpt_index *index = &st->builder->index;
    if (!status) file_entry->bytes = info.size;
    /* Every piece of this file is in the index now: its metadata checksum. */
    if (!status)
        status = ckpt_shard_meta_checksum(st->storage, path, index, (int)(st->file - index->files),
                                          &file_entry->meta_checksum);
    if (!status) file_entry->has_meta_checksum = 1;
    return status;
}

/* Scans file f of the staging directory into the builder: a shard's file
 * (f below tp x pp), named here, or a data-parallel file builder_dp_file named. */
static int scan_shard(const store_ops *storage, index_builder *builder, const char *staging, int f)
{
    const ckpt_index_file *file = f < builder->index.layout.tp * builder->index.layout.pp ? builder_file(builder, f)
                                                                                          : &builder->index.files[f];
    scan_state st = {storage, builder, file, NULL, TP_OK, -1};
    return scan_file(&st, staging);
}

/* The data-parallel files of a staging directory (format 1.6), named in
 * their order (shard, then data-parallel rank), whoever wrote them. */
typedef struct {
    int (*coords)[3];
    int count, capacity, status;
} dp_listing;

static int list_dp_file(void *ctx, const char *name)
{
    dp_listing *l = ctx;
    int pp, tp, dp;
    if (!ckpt_shard_file_parse(name, &pp, &tp, &dp) || dp == 0) return TP_OK;
    if (l->count == l->capacity) {
        int capacity = l->capacity ? 2 * l->capacity : 16;
        int (*grown)[3] = realloc(l->coords, (size_t)capacity * sizeof *grown);
        if (!grown) return l->status = tp_fail(TP_ERR_NOMEM, "out of memory");
        l->coords = grown;
        l->capacity = capacity;
    }
    l->coords[l->count][0] = pp;
    l->coords[l->count][1] = tp;
    l->coords[l->count++][2] = dp;
    return TP_OK;
}

static int by_coords(const void *a, const void *b)
{
    const int *x = a, *y = b;
    for (int k = 0; k < 3; k++)
        if (x[k] != y[k]) return x[k] < y[k] ? -1 : 1;
    return 0;
}

static int add_dp_files(const store_ops *storage, index_builder *b, const char *staging)
{
    dp_listing l = {0};
    int status = storage->list(storage, staging, list_dp_file, &l);
    if (!status) status = l.status;
    if (!status && l.count > 1) qsort(l.coords, (size_t)l.count, sizeof *l.coords, by_coords);
    for (int k = 0, at; !status && k < l.count; k++)
        status = builder_dp_file(b, l.coords[k][0], l.coords[k][1], l.coords[k][2], staging, &at);
    free(l.coords);
    return status;
}

static int build_index(const store_ops *storage, const char *staging, const ckpt_layout *layout,
                       const ckpt_train_state *state)
{
    index_builder b;
    int status = builder_init(&b, layout, state);
    if (!status) status = add_dp_files(storage, &b, staging);
    for (int f = 0; !status && f < b.index.num_files; f++) status = scan_shard(storage, &b, staging, f);
    if (!status) status = builder_finish(&b, staging);
    char *json = NULL;
    if (!status) status = ckpt_index_to_json(&b.index, &json);
    if (!status) status = store_write_file_atomic(storage, staging, CKPT_INDEX_NAME, json, strlen(json));
    free(json);
    builder_free(&b);
    return status;
}

int ckpt_describe_shard(const store_ops *storage, const char *staging, const ckpt_layout *layout, int shard_pp,
                        int shard_tp, int shard_dp, char **out)
{
    *out = NULL;
    if (shard_pp < 0 || shard_pp >= layout->pp || shard_tp < 0 || shard_tp >= layout->tp || shard_dp < 0 ||
        shard_dp >= layout->dp)
        return tp_fail(TP_ERR_ARG, "shard pp=%d tp=%d dp=%d is outside layout tp=%d pp=%d dp=%d", shard_pp, shard_tp,
                       shard_dp, layout->tp, layout->pp, layout->dp);
    index_builder b;
    int status = builder_init(&b, layout, NULL), f = shard_pp * layout->tp + shard_tp;
    if (!status && shard_dp > 0) status = builder_dp_file(&b, shard_pp, shard_tp, shard_dp, staging, &f);
    if (!status) status = scan_shard(storage, &b, staging, f);
    if (!status) status = ckpt_index_part_to_json(&b.index, out);
    builder_free(&b);
    return status;
}

/* Adds a described part to the builder: its file, its tensors and their
 * pieces. */
static int merge_part(index_builder *b, ckpt_index *part, const char *where)
{
    const ckpt_layout *ours = &b->index.layout, *theirs = &part->layout;
    if (theirs->tp != ours->tp || theirs->pp != ours->pp || theirs->num_layers != ours->num_layers ||
        ckpt_layout_chunks(theirs) != ckpt_layout_chunks(ours)) {
        char a[128], c[128];
        ckpt_layout_describe(theirs, a, sizeof a);
        ckpt_layout_describe(ours, c, sizeof c);
        return tp_fail(TP_ERR_FORMAT, "%s: layout %s, the checkpoint has %s", where, a, c);
    }
    /* The shards' files keep their places; data-parallel files come after
     * them in the order the parts arrive, and their pieces follow them. */
    int own = ours->tp * ours->pp;
    int *place = malloc((size_t)part->num_files * sizeof *place);
    if (!place) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = TP_OK;
    for (int f = 0; !status && f < part->num_files; f++) {
        const ckpt_index_file *file = &part->files[f];
        place[f] = f;
        if (!file->name[0]) continue;
        if (file->dp > 0) {
            status = builder_dp_file(b, file->pp, file->tp, file->dp, where, &place[f]);
            if (!status) b->index.files[place[f]] = *file;
        } else if (f >= own || b->index.files[f].name[0]) {
            status = tp_fail(TP_ERR_FORMAT, "%s: shard %s is described twice", where, file->name);
        } else {
            b->index.files[f] = *file;
        }
    }
    for (int i = 0; !status && i < part->num_tensors; i++) {
        ckpt_index_tensor *it = &part->tensors[i];
        int64_t into = -1;
        status = builder_tensor(b, &it->tensor, it->stage, it->block_rows, it->order, &into);
        for (int p = 0; !status && p < it->num_pieces; p++) {
            if (it->pieces[p].file_index < 0) continue;
            it->pieces[p].file_index = place[it->pieces[p].file_index];
            status = builder_piece(b, into, p, &it->pieces[p]);
            if (status) status = tp_fail_context(status, "%s", where);
        }
    }
    free(place);
    return status;
}

int ckpt_index_from_parts(const ckpt_layout *layout, const ckpt_train_state *state, const char *const *parts,
                          int count, const char *where, char **out, int64_t *bytes)
{
    *out = NULL;
    if (bytes) *bytes = 0;
    index_builder b;
    int status = builder_init(&b, layout, state);
    for (int k = 0; !status && k < count; k++) {
        if (!parts[k]) continue; /* a process that writes no shard */
        char name[CKPT_PATH_MAX + 32];
        snprintf(name, sizeof name, "%s (part %d)", where, k);
        ckpt_index part;
        status = ckpt_index_part_parse(parts[k], name, &part);
        if (status) break;
        status = merge_part(&b, &part, name);
        ckpt_index_free(&part);
    }
    for (int f = 0; !status && f < layout->tp * layout->pp; f++)
        if (!b.index.files[f].name[0])
            status = tp_fail(TP_ERR_STATE, "%s: no process described shard pp=%d tp=%d", where, f / layout->tp,
                             f % layout->tp);
    if (!status) status = builder_finish(&b, where);
    if (!status) status = ckpt_index_to_json(&b.index, out);
    for (int f = 0; !status && bytes && f < b.index.num_files; f++) *bytes += b.index.files[f].bytes;
    builder_free(&b);
    return status;
}

/* ------------------------------------------------------------------ commit */

int ckpt_commit_directory(const store_ops *storage, store_staged *staged, const char *path,
                          const ckpt_layout *layout, const ckpt_train_state *state, const ckpt_write_options *options)
{
    char parent[CKPT_PATH_MAX], base[CKPT_PATH_MAX];
    const char *staging = store_staged_path(staged);
    int status = tp_split_path(path, parent, sizeof parent, base, sizeof base);
    tp_fault_point("before-index");
    if (!status) status = build_index(storage, staging, layout, state);
    tp_fault_point("before-rename");
    if (status) {
        store_staged_discard(staged);
        return status;
    }
    TP_TRY(store_staged_publish(staged)); /* syncs the directory first */
    if (!options->update_latest) return TP_OK;
    tp_fault_point("before-latest");
    return ckpt_latest_update(storage, parent, base, state ? state->step : 0);
}
