/* flat.c: a plain HDF5 file of whole tensors (docs/FORMAT.md "Merged HDF5
 * files"). Datasets are contiguous and allocated when created, so their data
 * goes in by positioned writes at the offset HDF5 reports, from any thread,
 * outside HDF5's global lock, as the shard writer does. Object times are not
 * recorded, so equal contents give equal files. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/file.h"
#include "internal.h"

struct ckpt_flat_file {
    char path[CKPT_PATH_MAX];  /* final name */
    store_staged *staged;       /* written here, renamed on commit */
    const char *temp;          /* its path */
    const store_ops *storage;
    hid_t file;                /* HDF5's handle: metadata */
    store_file *data;           /* the store's: the datasets' bytes */
};

void ckpt_flat_abort(ckpt_flat_file *f)
{
    if (!f) return;
    if (f->file >= 0) H5Fclose(f->file);
    if (f->data) f->storage->close(f->data);
    store_staged_discard(f->staged);
    free(f);
}

static int create_hdf5(void *ctx)
{
    ckpt_flat_file *f = ctx;
    hid_t fapl = ckpt_h5_file_access(), fcpl = H5Pcreate(H5P_FILE_CREATE);
    if (fapl >= 0 && fcpl >= 0 && H5Pset_obj_track_times(fcpl, 0) >= 0)
        f->file = H5Fcreate(f->temp, H5F_ACC_TRUNC, fcpl, fapl);
    /* HDF5's error stack read before another call of its API clears it (a
     * full disk was "no detail from HDF5"). */
    int status = f->file < 0 ? ckpt_fail_hdf5("%s: cannot create", f->temp) : TP_OK;
    if (fapl >= 0) H5Pclose(fapl);
    if (fcpl >= 0) H5Pclose(fcpl);
    return status;
}

int ckpt_flat_create(ckpt_flat_file **out, const char *path, const store_stage_options *options)
{
    *out = NULL;
    ckpt_flat_file *f = calloc(1, sizeof *f);
    if (!f) return tp_fail(TP_ERR_NOMEM, "out of memory");
    f->file = -1;
    store_stage_options stage = *options;
    stage.directory = 0;
    int status = store_for(path, &f->storage);
    if (!status) status = store_stage(f->storage, path, &stage, &f->staged);
    if (!status) f->temp = store_staged_path(f->staged);
    if (status) {
        free(f);
        return status;
    }
    snprintf(f->path, sizeof f->path, "%s", path);
    /* HDF5 makes the file by its name: not once a signal's clean-up ran. */
    status = store_staged_create(f->staged, create_hdf5, f);
    if (!status) status = f->storage->open(f->storage, f->temp, STORE_OPEN_WRITE, &f->data);
    if (status) {
        ckpt_flat_abort(f);
        return status;
    }
    *out = f;
    return TP_OK;
}

int ckpt_flat_add(ckpt_flat_file *f, const char *name, tp_dtype dtype, int ndim, const int64_t *shape,
                  int64_t *offset_out)
{
    if (ndim < 1 || ndim > CKPT_MAX_DIMS) return tp_fail(TP_ERR_ARG, "%s: %d dimensions", name, ndim);
    hsize_t dims[CKPT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) dims[d] = (hsize_t)shape[d];
    char dset_path[CKPT_NAME_MAX + 2];
    snprintf(dset_path, sizeof dset_path, "/%s", name);
    hid_t type = ckpt_h5_type(dtype), space = H5Screate_simple(ndim, dims, NULL);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE), gcpl = H5Pcreate(H5P_GROUP_CREATE);
    hid_t dset = -1;
    int ok = type >= 0 && space >= 0 && lcpl >= 0 && dcpl >= 0 && gcpl >= 0 && H5Pset_obj_track_times(gcpl, 0) >= 0 &&
             H5Pset_obj_track_times(dcpl, 0) >= 0 &&
             H5Pset_layout(dcpl, H5D_CONTIGUOUS) >= 0 && H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0 &&
             H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0;
    /* The groups on the way, made here so that they record no times either. */
    for (char *slash = strchr(dset_path + 1, '/'); ok && slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        htri_t exists = H5Lexists(f->file, dset_path, H5P_DEFAULT);
        if (exists == 0) {
            hid_t group = H5Gcreate2(f->file, dset_path, H5P_DEFAULT, gcpl, H5P_DEFAULT);
            ok = group >= 0;
            if (ok) H5Gclose(group);
        }
        ok = ok && exists >= 0;
        *slash = '/';
    }
    if (ok) dset = H5Dcreate2(f->file, dset_path, type, space, lcpl, dcpl, H5P_DEFAULT);
    int status = TP_OK;
    if (!ok || dset < 0) status = ckpt_fail_hdf5("%s: cannot create dataset %s", f->path, name);
    if (!status) {
        haddr_t offset = H5Dget_offset(dset);
        if (offset == HADDR_UNDEF) status = ckpt_fail_hdf5("%s: dataset %s has no file offset", f->path, name);
        else *offset_out = (int64_t)offset;
    }
    if (dset >= 0) H5Dclose(dset);
    if (gcpl >= 0) H5Pclose(gcpl);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    return status;
}

int ckpt_flat_attribute(ckpt_flat_file *f, const char *name, const char *value)
{
    int status = ckpt_h5_write_vlen_string(f->file, name, value);
    return status ? tp_fail_context(status, "%s", f->path) : TP_OK;
}

int ckpt_flat_write(ckpt_flat_file *f, int64_t offset, const void *data, size_t bytes)
{
    return f->storage->write_at(f->data, data, bytes, offset);
}

int ckpt_flat_commit(ckpt_flat_file *f)
{
    int status = H5Fclose(f->file) < 0 ? ckpt_fail_hdf5("%s: cannot close", f->temp) : TP_OK;
    f->file = -1;
    if (status) {
        ckpt_flat_abort(f);
        return status;
    }
    status = store_staged_publish(f->staged); /* frees it, whatever the outcome */
    f->staged = NULL;
    f->storage->close(f->data);
    free(f);
    return status;
}

int ckpt_flat_read_attribute(const char *path, const char *name, char *out, size_t size)
{
    out[0] = '\0';
    TP_TRY(ckpt_library_init());
    TP_TRY(tp_refuse_special(path)); /* HDF5 would block on a FIFO */
    hid_t fapl = ckpt_h5_file_access();
    hid_t file = fapl >= 0 ? H5Fopen(path, H5F_ACC_RDONLY, fapl) : -1;
    if (fapl >= 0) H5Pclose(fapl);
    if (file < 0) return ckpt_fail_hdf5("%s: cannot open as HDF5", path);
    htri_t exists = H5Aexists(file, name);
    int status = exists < 0  ? ckpt_fail_hdf5("%s: cannot read its attributes", path)
                 : !exists   ? tp_fail(TP_ERR_NOT_FOUND, "%s: no root attribute %s", path, name)
                             : ckpt_h5_read_string(file, name, out, size);
    H5Fclose(file);
    return status;
}
