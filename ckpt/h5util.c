/* h5util.c: HDF5 types, file access properties and attribute helpers. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

hid_t ckpt_h5_type(tp_dtype dtype)
{
    if (dtype == TP_FP32) return H5Tcopy(H5T_IEEE_F32LE);
    /* bf16 and fp16 are IEEE-style floats HDF5 describes field by field, so
     * h5py and h5dump convert them to fp32 on read (docs/FORMAT.md "Dtypes"). */
    hid_t type = H5Tcopy(H5T_IEEE_F32LE);
    if (type < 0) return type;
    int ok;
    if (dtype == TP_BF16) /* sign 15, exponent 7..14 (bias 127), mantissa 0..6 */
        ok = H5Tset_fields(type, 15, 7, 8, 0, 7) >= 0 && H5Tset_size(type, 2) >= 0 &&
             H5Tset_precision(type, 16) >= 0 && H5Tset_ebias(type, 127) >= 0;
    else /* fp16: sign 15, exponent 10..14 (bias 15), mantissa 0..9 */
        ok = H5Tset_fields(type, 15, 10, 5, 0, 10) >= 0 && H5Tset_size(type, 2) >= 0 &&
             H5Tset_precision(type, 16) >= 0 && H5Tset_ebias(type, 15) >= 0;
    if (!ok) {
        H5Tclose(type);
        return -1;
    }
    return type;
}

hid_t ckpt_h5_file_access(void)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return fapl;
    /* Version-2 object headers carry checksums, so HDF5 itself detects damaged
     * metadata. Large datasets start on 4 KiB boundaries for positioned I/O.
     * No file locking: it fails on many parallel file systems and readers only
     * open committed, immutable files. */
    if (H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0 ||
        H5Pset_alignment(fapl, 64 * 1024, 4096) < 0 || H5Pset_file_locking(fapl, 0, 1) < 0 ||
        H5Pset_meta_block_size(fapl, 256 * 1024) < 0) {
        H5Pclose(fapl);
        return -1;
    }
    /* Objects leave the metadata cache when closed: each is touched in one go,
     * and without this the memory of a process grew with every dataset it
     * opened (113 MB after the 8000 pieces of a 1B-parameter checkpoint; 35 MB
     * with it). A small cache serves the objects that are open. */
    if (H5Pset_evict_on_close(fapl, 1) < 0) {
        H5Pclose(fapl);
        return -1;
    }
    H5AC_cache_config_t cache;
    cache.version = H5AC__CURR_CACHE_CONFIG_VERSION;
    if (H5Pget_mdc_config(fapl, &cache) >= 0) {
        cache.set_initial_size = 1;
        cache.initial_size = 1 << 20;
        cache.min_size = 512 << 10;
        cache.max_size = 2 << 20;
        if (H5Pset_mdc_config(fapl, &cache) < 0) {
            H5Pclose(fapl);
            return -1;
        }
    }
    return fapl;
}

/* Strings are fixed-length, NUL-terminated UTF-8 (format 1.1): reading a
 * variable-length string makes libhdf5 follow a global-heap reference stored
 * in the file, and damaged ones crashed it (issue 11). */
int ckpt_h5_write_string(hid_t obj, const char *name, const char *value)
{
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR), attr = -1;
    int ok = type >= 0 && space >= 0 && H5Tset_size(type, strlen(value) + 1) >= 0 &&
             H5Tset_strpad(type, H5T_STR_NULLTERM) >= 0 && H5Tset_cset(type, H5T_CSET_UTF8) >= 0;
    if (ok) attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    ok = ok && attr >= 0 && H5Awrite(attr, type, value) >= 0;
    if (attr >= 0) H5Aclose(attr);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    return ok ? TP_OK : ckpt_fail_hdf5("cannot write attribute %s", name);
}

/* Variable-length strings, for the merged HDF5 export (docs/FORMAT.md
 * section 10), which readers outside this toolkit expect as Python str. */
int ckpt_h5_write_vlen_string(hid_t obj, const char *name, const char *value)
{
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR), attr = -1;
    int ok = type >= 0 && space >= 0 && H5Tset_size(type, H5T_VARIABLE) >= 0 &&
             H5Tset_cset(type, H5T_CSET_UTF8) >= 0;
    if (ok) attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    ok = ok && attr >= 0 && H5Awrite(attr, type, &value) >= 0;
    if (attr >= 0) H5Aclose(attr);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    return ok ? TP_OK : ckpt_fail_hdf5("cannot write attribute %s", name);
}

int ckpt_h5_write_i64s(hid_t obj, const char *name, const int64_t *values, int count)
{
    hsize_t dims[1] = {(hsize_t)count};
    hid_t space = H5Screate_simple(1, dims, NULL), attr = -1;
    if (space >= 0) attr = H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    int ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_INT64, values) >= 0;
    if (attr >= 0) H5Aclose(attr);
    if (space >= 0) H5Sclose(space);
    return ok ? TP_OK : ckpt_fail_hdf5("cannot write attribute %s", name);
}

int ckpt_h5_write_u64(hid_t obj, const char *name, uint64_t value)
{
    hid_t space = H5Screate(H5S_SCALAR), attr = -1;
    if (space >= 0) attr = H5Acreate2(obj, name, H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    int ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_UINT64, &value) >= 0;
    if (attr >= 0) H5Aclose(attr);
    if (space >= 0) H5Sclose(space);
    return ok ? TP_OK : ckpt_fail_hdf5("cannot write attribute %s", name);
}

int ckpt_h5_read_string(hid_t obj, const char *name, char *out, size_t out_size)
{
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    if (attr < 0) return ckpt_fail_hdf5("attribute %s missing", name);
    hid_t file_type = H5Aget_type(attr);
    hid_t space = H5Aget_space(attr);
    int status = TP_OK;
    if (file_type < 0 || space < 0 || H5Tget_class(file_type) != H5T_STRING ||
        H5Sget_simple_extent_npoints(space) != 1) {
        status = tp_fail(TP_ERR_FORMAT, "attribute %s is not a string", name);
    } else if (H5Tis_variable_str(file_type) > 0) {
        hid_t mem_type = H5Tcopy(H5T_C_S1);
        char *value = NULL;
        if (mem_type < 0 || H5Tset_size(mem_type, H5T_VARIABLE) < 0 ||
            H5Tset_cset(mem_type, H5Tget_cset(file_type)) < 0 ||
            H5Aread(attr, mem_type, &value) < 0 || !value) {
            status = ckpt_fail_hdf5("cannot read attribute %s", name);
        } else {
            if (strlen(value) >= out_size)
                status = tp_fail(TP_ERR_FORMAT, "attribute %s is too long", name);
            else
                strcpy(out, value);
            H5free_memory(value);
        }
        if (mem_type >= 0) H5Tclose(mem_type);
    } else {
        /* Fixed-length: `size` bytes, NUL-terminated within them (format
         * 1.1) or padded; read into size + 1 so that it always ends. */
        size_t size = H5Tget_size(file_type);
        char *value = size > 0 && size <= out_size ? calloc(size + 1, 1) : NULL;
        if (size == 0 || size > out_size) {
            status = tp_fail(TP_ERR_FORMAT, "attribute %s is too long", name);
        } else if (!value) {
            status = tp_fail(TP_ERR_NOMEM, "out of memory");
        } else {
            hid_t mem_type = H5Tcopy(file_type);
            if (mem_type < 0 || H5Aread(attr, mem_type, value) < 0)
                status = ckpt_fail_hdf5("cannot read attribute %s", name);
            else if (strlen(value) >= out_size)
                status = tp_fail(TP_ERR_FORMAT, "attribute %s is too long", name);
            else
                strcpy(out, value);
            if (mem_type >= 0) H5Tclose(mem_type);
        }
        free(value);
    }
    if (space >= 0) H5Sclose(space);
    if (file_type >= 0) H5Tclose(file_type);
    H5Aclose(attr);
    return status;
}

int ckpt_h5_read_i64s(hid_t obj, const char *name, int64_t *values, int max_count, int *count)
{
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    if (attr < 0) return ckpt_fail_hdf5("attribute %s missing", name);
    hid_t space = H5Aget_space(attr);
    hid_t type = H5Aget_type(attr);
    hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    int status = TP_OK;
    if (n < 1 || n > max_count || type < 0 || H5Tget_class(type) != H5T_INTEGER)
        status = tp_fail(TP_ERR_FORMAT, "attribute %s: expected 1..%d integers", name,
                           max_count);
    else if (H5Aread(attr, H5T_NATIVE_INT64, values) < 0)
        status = ckpt_fail_hdf5("cannot read attribute %s", name);
    else if (count)
        *count = (int)n;
    else if (n != 1)
        status = tp_fail(TP_ERR_FORMAT, "attribute %s: expected one integer", name);
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Aclose(attr);
    return status;
}

int ckpt_h5_read_optional_i64(hid_t obj, const char *name, int64_t *value, int *present)
{
    int there = H5Aexists(obj, name) > 0;
    if (present) *present = there;
    return there ? ckpt_h5_read_i64s(obj, name, value, 1, NULL) : TP_OK;
}

int ckpt_h5_read_u64(hid_t obj, const char *name, uint64_t *value)
{
    hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
    if (attr < 0) return ckpt_fail_hdf5("attribute %s missing", name);
    hid_t space = H5Aget_space(attr);
    int status = TP_OK;
    if (space < 0 || H5Sget_simple_extent_npoints(space) != 1)
        status = tp_fail(TP_ERR_FORMAT, "attribute %s: expected one integer", name);
    else if (H5Aread(attr, H5T_NATIVE_UINT64, value) < 0)
        status = ckpt_fail_hdf5("cannot read attribute %s", name);
    if (space >= 0) H5Sclose(space);
    H5Aclose(attr);
    return status;
}

/* ------------------------------------------------ links to other files */

static herr_t refuse_external_link(const char *parent_file, const char *parent_group,
                                   const char *child_file, const char *child_object,
                                   unsigned *acc_flags, hid_t fapl, void *data)
{
    (void)parent_group, (void)acc_flags, (void)fapl, (void)data;
    tp_fail(TP_ERR_FORMAT, "%s: external link to %s:%s refused (a checkpoint must not reach other files)",
            parent_file, child_file, child_object);
    return -1;
}

hid_t ckpt_h5_link_access(void)
{
    hid_t lapl = H5Pcreate(H5P_DATASET_ACCESS); /* a link access list too */
    if (lapl >= 0 && H5Pset_elink_cb(lapl, refuse_external_link, NULL) < 0) {
        H5Pclose(lapl);
        return -1;
    }
    return lapl;
}

void ckpt_h5_dataset_form(hid_t dset, const ckpt_piece_geometry *g, tp_dtype dtype, int *shape_ok, int *type_ok)
{
    hid_t space = H5Dget_space(dset);
    hsize_t dims[CKPT_MAX_DIMS];
    int ndim = space >= 0 ? H5Sget_simple_extent_dims(space, dims, NULL) : -1;
    if (space >= 0) H5Sclose(space);
    *shape_ok = ndim == g->ndim;
    for (int d = 0; *shape_ok && d < ndim; d++) *shape_ok = (int64_t)dims[d] == g->shape[d];
    hid_t type = H5Dget_type(dset), want = ckpt_h5_type(dtype);
    *type_ok = type >= 0 && want >= 0 && H5Tequal(type, want) > 0;
    if (type >= 0) H5Tclose(type);
    if (want >= 0) H5Tclose(want);
}

int ckpt_h5_check_dataset_storage(hid_t dset, const char *where)
{
    hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) return ckpt_fail_hdf5("%s: cannot read the storage properties", where);
    int external = H5Pget_external_count(dcpl);
    H5D_layout_t layout = H5Pget_layout(dcpl);
    H5Pclose(dcpl);
    if (external != 0)
        return tp_fail(TP_ERR_FORMAT, "%s: data stored in external files refused (a checkpoint must "
                       "not reach other files)", where);
    if (layout == H5D_VIRTUAL)
        return tp_fail(TP_ERR_FORMAT, "%s: virtual dataset refused (a checkpoint must not reach "
                       "other files)", where);
    if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT)
        return tp_fail(TP_ERR_FORMAT, "%s: unexpected storage layout", where);
    return TP_OK;
}

int ckpt_h5_chunk_location(hid_t dset, int64_t block, int64_t block_rows, const char *where, uint64_t *address,
                           uint64_t *size, unsigned *filter_mask)
{
    hsize_t offset[CKPT_MAX_DIMS] = {0}; /* the block's first row: chunks span whole rows */
    offset[0] = (hsize_t)(block * block_rows);
    unsigned mask = 0;
    haddr_t at = HADDR_UNDEF;
    hsize_t bytes = 0;
    if (H5Dget_chunk_info_by_coord(dset, offset, &mask, &at, &bytes) < 0 || at == HADDR_UNDEF || bytes == 0)
        return ckpt_fail_hdf5("%s: chunk %lld missing", where, (long long)block);
    *address = (uint64_t)at;
    *size = (uint64_t)bytes;
    *filter_mask = mask;
    return TP_OK;
}

typedef struct {
    const char *path;
    int status;
} link_check;

static herr_t check_link(hid_t group, const char *name, const H5L_info_t *info, void *data)
{
    link_check *c = data;
    if (info->type != H5L_TYPE_HARD) {
        const char *kind = info->type == H5L_TYPE_EXTERNAL ? "external" :
                           info->type == H5L_TYPE_SOFT ? "soft" : "user-defined";
        c->status = tp_fail(TP_ERR_FORMAT, "%s: %s link /%s refused (a checkpoint must not reach "
                            "other files or objects)", c->path, kind, name);
        return -1;
    }
    H5O_info_t object;
    if (H5Oget_info_by_name2(group, name, &object, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
        c->status = ckpt_fail_hdf5("%s: object /%s damaged", c->path, name);
        return -1;
    }
    if (object.type != H5O_TYPE_DATASET) return 0;
    hid_t dset = H5Dopen2(group, name, H5P_DEFAULT);
    if (dset < 0) {
        c->status = ckpt_fail_hdf5("%s: dataset /%s damaged", c->path, name);
        return -1;
    }
    char where[CKPT_PATH_MAX + CKPT_NAME_MAX + 32];
    snprintf(where, sizeof where, "%s: dataset /%s", c->path, name);
    c->status = ckpt_h5_check_dataset_storage(dset, where);
    H5Dclose(dset);
    return c->status ? -1 : 0;
}

int ckpt_h5_check_links(hid_t file, const char *path)
{
    link_check c = {path, TP_OK};
    if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, check_link, &c) < 0 || c.status)
        return c.status ? c.status : ckpt_fail_hdf5("%s: cannot list the file's objects", path);
    return TP_OK;
}
