/* shardmeta.c: the metadata checksum of a shard file (docs/FORMAT.md
 * section 3, format 1.1). Every byte of the file outside the pieces' data
 * extents (HDF5's superblock, object headers, attributes, B-trees, heaps,
 * the block checksum datasets, free space) is hashed with plain reads, so a
 * reader finds damaged metadata before libhdf5 parses any of it: libhdf5
 * itself crashed on fuzzed files (issue 11). The data is covered by the
 * pieces' block checksums. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "index.h"

#define META_READ ((int64_t)1 << 20)

static int by_offset(const void *a, const void *b)
{
    const ckpt_extent *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int ckpt_shard_meta_checksum(const store_ops *storage, const char *path, const ckpt_index *index,
                             int f, uint64_t *out)
{
    int64_t count = 0;
    for (int i = 0; i < index->num_tensors; i++)
        for (int p = 0; p < index->tensors[i].num_pieces; p++) {
            const ckpt_index_piece *ip = &index->tensors[i].pieces[p];
            if (ip->file_index != f) continue;
            if (ip->num_extents < 1)
                return tp_fail(TP_ERR_FORMAT, "%s: the index records no extents of tensor %s piece %d",
                               path, index->tensors[i].tensor.name, p);
            count += ip->num_extents;
        }
    ckpt_extent *extents = malloc((size_t)(count > 0 ? count : 1) * sizeof *extents);
    char *buffer = malloc(META_READ);
    XXH3_state_t *state = XXH3_createState();
    int status = TP_OK;
    if (!extents || !buffer || !state) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    int64_t n = 0;
    for (int i = 0; !status && i < index->num_tensors; i++)
        for (int p = 0; p < index->tensors[i].num_pieces; p++) {
            const ckpt_index_piece *ip = &index->tensors[i].pieces[p];
            if (ip->file_index != f) continue;
            memcpy(extents + n, ip->extents, (size_t)ip->num_extents * sizeof *extents);
            n += ip->num_extents;
        }
    if (!status && n > 1) qsort(extents, (size_t)n, sizeof *extents, by_offset);

    int64_t size = index->files[f].bytes;
    store_stat info;
    if (!status) status = storage->stat(storage, path, &info);
    /* A file gone (removed under a reader that opened the checkpoint before)
     * is missing, as ckpt_reader_open says, not damaged. */
    if (!status && !info.exists)
        status = tp_fail(TP_ERR_NOT_FOUND, "%s: shard file missing: %s", path, strerror(ENOENT));
    else if (!status && info.size != size)
        status = tp_fail(TP_ERR_CHECKSUM, "%s: metadata damaged (size %lld bytes, index says %lld)", path,
                         (long long)info.size, (long long)size);
    int64_t pos = 0;
    for (int64_t k = 0; !status && k < n; k++) {
        if (extents[k].offset < pos || extents[k].length > size - extents[k].offset)
            status = tp_fail(TP_ERR_FORMAT, "%s: the index's data extents overlap or lie outside the "
                             "file (%lld bytes at %lld)", path, (long long)extents[k].length,
                             (long long)extents[k].offset);
        else
            pos = extents[k].offset + extents[k].length;
    }
    store_file *file = NULL;
    if (!status) status = storage->open(storage, path, STORE_OPEN_READ, &file);
    if (!status) XXH3_64bits_reset(state);
    pos = 0;
    for (int64_t k = 0; !status && k <= n; k++) {
        int64_t end = k < n ? extents[k].offset : size;
        while (!status && pos < end) {
            int64_t step = end - pos < META_READ ? end - pos : META_READ;
            status = storage->read_at(file, buffer, (size_t)step, pos);
            if (!status) XXH3_64bits_update(state, buffer, (size_t)step);
            pos += step;
        }
        if (k < n) pos = extents[k].offset + extents[k].length;
    }
    if (!status) *out = XXH3_64bits_digest(state);
    if (file) storage->close(file);
    if (state) XXH3_freeState(state);
    free(buffer);
    free(extents);
    return status;
}
