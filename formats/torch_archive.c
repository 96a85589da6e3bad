/* torch_archive.c: a torch.save file: its zip container (zip.c), data.pkl
 * interpreted (pickle.c), and tensors as byte ranges of its storages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "../common/memory.h"
#include "torch.h"
#include "zip.h"

/* ARCHIVE/byteorder and ARCHIVE/version are a few bytes. */
#define SMALL_ENTRY_MAX 64

struct torch_archive {
    zip_archive *zip;
    char prefix[256]; /* "ARCHIVE/" */
    pickle_doc *doc;
};

/* The pickle stream torch.save wrote before PyTorch 1.6 (and with
 * _use_new_zipfile_serialization=False) starts with protocol 2 and this
 * LONG1 magic number, 0x1950a86a20f9469cfc6c. */
static const unsigned char legacy_magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                             0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

/* Refuses, with a message saying what the file is, a file whose first n
 * bytes (start) are not those of a zip archive. */
static int check_start(const char *path, const unsigned char *start, size_t n)
{
    if (n == sizeof legacy_magic && memcmp(start, legacy_magic, sizeof legacy_magic) == 0)
        return tp_fail(TP_ERR_VERSION,
                       "%s was written in torch.save's format of before PyTorch 1.6 (a bare pickle stream), which is not "
                       "read; load it and torch.save it again with PyTorch 1.6 or later", path);
    if (n < 4 || memcmp(start, "PK\3\4", 4) != 0)
        return tp_fail(TP_ERR_FORMAT, "%s is not a torch.save file (no zip archive: it starts with %02x %02x %02x %02x)", path,
                       start[0], start[1], start[2], start[3]);
    return TP_OK;
}

/* Why a file the zip reader refused is not a torch.save file, when its
 * start says (the format of before PyTorch 1.6, no zip at all); else
 * status, the zip reader's own failure. */
static int explain_refusal(const char *path, int status)
{
    const store_ops *store;
    store_file *file;
    store_stat st;
    unsigned char start[sizeof legacy_magic] = {0};
    if (store_for(path, &store) || store->stat(store, path, &st) || !st.exists || st.is_dir) return status;
    size_t n = st.size < (int64_t)sizeof start ? (size_t)st.size : sizeof start;
    if (store->open(store, path, STORE_OPEN_READ, &file)) return status;
    int read = store->read_at(file, start, n, 0);
    store->close(file);
    int why = read ? TP_OK : check_start(path, start, n);
    return why ? why : status;
}

/* The bytes of a small entry (at most SMALL_ENTRY_MAX), NUL-terminated. */
static int read_small(torch_archive *a, const char *name, char *out, int *found)
{
    char full[512];
    snprintf(full, sizeof full, "%s%s", a->prefix, name);
    int entry = zip_find(a->zip, full);
    *found = entry >= 0;
    out[0] = 0;
    if (entry < 0) return TP_OK;
    int64_t offset, size;
    TP_TRY(zip_entry_range(a->zip, entry, &offset, &size));
    if (size > SMALL_ENTRY_MAX)
        return tp_fail(TP_ERR_FORMAT, "%s: %s holds %lld bytes (at most %d expected)", zip_path(a->zip), full, (long long)size,
                       SMALL_ENTRY_MAX);
    TP_TRY(zip_read(a->zip, out, size, offset));
    TP_TRY(zip_entry_check_data(a->zip, entry, out));
    out[size] = 0;
    return TP_OK;
}

/* The archive's folder: the part before the first '/' of the first entry's
 * name, as PyTorch's reader takes it; data.pkl must be inside. */
static int find_prefix(torch_archive *a)
{
    const char *path = zip_path(a->zip), *first = zip_name(a->zip, 0);
    const char *slash = first ? strchr(first, '/') : NULL;
    if (!slash || slash == first || (size_t)(slash - first) + 2 > sizeof a->prefix)
        return tp_fail(TP_ERR_FORMAT, "%s: a zip archive whose first entry (%s) is in no folder: not a torch.save file", path,
                       first ? first : "none");
    snprintf(a->prefix, sizeof a->prefix, "%.*s", (int)(slash - first + 1), first);
    return TP_OK;
}

static int storage_range(const torch_archive *archive, const pickle_value *storage, int64_t *offset);

/* Every tensor's storage is an entry holding its elements (and the pickle
 * checked that the tensor lies within them). */
static int check_tensor(void *ctx, const char *path, const pickle_value *tensor)
{
    int64_t offset;
    if (storage_range(ctx, tensor->tensor->storage, &offset)) return tp_fail_context(TP_ERR_FORMAT, "tensor %s", path);
    return TP_OK;
}

int torch_archive_open(const char *path, const pickle_limits *limits, torch_archive **out)
{
    return torch_archive_open_range(path, 0, -1, NULL, limits, out);
}

/* What torch.load reads of the archive a->zip: its start, folder, byte
 * order and version, data.pkl interpreted, each tensor inside its storage. */
static int read_archive(torch_archive *a, const char *path, const pickle_limits *limits)
{
    unsigned char start[sizeof legacy_magic];
    size_t n = zip_file_bytes(a->zip) < (int64_t)sizeof start ? (size_t)zip_file_bytes(a->zip) : sizeof start;
    int status = zip_read(a->zip, start, (int64_t)n, 0);
    if (!status) status = check_start(path, start, n);
    if (!status) status = find_prefix(a);
    char small[SMALL_ENTRY_MAX + 1];
    int found = 0;
    if (!status) status = read_small(a, "byteorder", small, &found);
    /* Archives of PyTorch before 2.1 have no byteorder entry: they are
     * little-endian, as every machine PyTorch runs on. */
    if (!status && found && strcmp(small, "little") != 0)
        status = tp_fail(TP_ERR_FORMAT, "%s: byte order '%s'; only little-endian archives are read", path, small);
    if (!status) status = read_small(a, "version", small, &found);
    if (!status && !found) status = tp_fail(TP_ERR_FORMAT, "%s: no %sversion entry: not a torch.save file", path, a->prefix);
    char pkl_name[512];
    snprintf(pkl_name, sizeof pkl_name, "%sdata.pkl", a->prefix);
    int entry = status ? -1 : zip_find(a->zip, pkl_name);
    if (!status && entry < 0)
        status = tp_fail(TP_ERR_FORMAT, "%s: no %s: a TorchScript archive or not a torch.save file", path, pkl_name);
    int64_t offset = 0, size = 0;
    if (!status) status = zip_entry_range(a->zip, entry, &offset, &size);
    if (!status && size > limits->max_memory)
        status = tp_fail(TP_ERR_FORMAT, "%s: %s of %lld bytes, more than the limit of %lld", path, pkl_name, (long long)size,
                         (long long)limits->max_memory);
    unsigned char *pickle = status ? NULL : malloc((size_t)size + 1);
    if (!status && !pickle) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) status = zip_read(a->zip, pickle, size, offset);
    /* Checked against its CRC-32 before it is interpreted: a flipped byte
     * in a string or an integer still makes a valid pickle (an activation
     * 'gelu' read as another name), which no later check of the tree sees. */
    if (!status) status = zip_entry_check_data(a->zip, entry, pickle);
    char name[4200];
    snprintf(name, sizeof name, "%s:%s", path, pkl_name);
    if (!status) status = pickle_load(pickle, (size_t)size, name, limits, &a->doc);
    free(pickle);
    if (!status) status = pickle_walk_tensors(a->doc, pickle_root(a->doc), check_tensor, a);
    return status;
}

/* The rest of an open whose zip was opened (status: the opening's): its
 * pickle read within limits (NULL: the defaults) and checked; a failure
 * closes a. */
static int finish_open(torch_archive *a, int status, const char *name, const pickle_limits *limits, torch_archive **out)
{
    pickle_limits defaults;
    if (!limits) {
        pickle_limits_init(&defaults);
        limits = &defaults;
    }
    if (!status) status = read_archive(a, name, limits);
    if (status) {
        torch_archive_close(a);
        return status;
    }
    *out = a;
    return TP_OK;
}

int torch_archive_open_range(const char *path, int64_t base, int64_t bytes, const char *version,
                             const pickle_limits *limits, torch_archive **out)
{
    *out = NULL;
    torch_archive *a = calloc(1, sizeof *a);
    if (!a) return tp_fail(TP_ERR_NOMEM, "out of memory");
    /* The start is read through the archive's own open file: one open of
     * it (round trips, for a store), and a second look only at a refusal. */
    int status = zip_open_range(path, base, bytes, version, &a->zip);
    if (status == TP_ERR_FORMAT && base == 0 && bytes < 0) status = explain_refusal(path, status);
    return finish_open(a, status, path, limits, out);
}

int torch_archive_open_memory(const char *name, const void *data, int64_t size, const pickle_limits *limits,
                              torch_archive **out)
{
    *out = NULL;
    torch_archive *a = calloc(1, sizeof *a);
    if (!a) return tp_fail(TP_ERR_NOMEM, "out of memory");
    return finish_open(a, zip_open_memory(name, data, size, &a->zip), name, limits, out);
}

void torch_archive_close(torch_archive *archive)
{
    if (!archive) return;
    pickle_free(archive->doc);
    zip_close(archive->zip);
    free(archive);
}

const pickle_doc *torch_archive_doc(const torch_archive *archive)
{
    return archive->doc;
}

const pickle_value *torch_archive_root(const torch_archive *archive)
{
    return pickle_root(archive->doc);
}

const char *torch_archive_path(const torch_archive *archive)
{
    return zip_path(archive->zip);
}

int64_t torch_archive_bytes(const torch_archive *archive)
{
    return zip_file_bytes(archive->zip);
}

int64_t torch_tensor_numel(const pickle_value *tensor)
{
    int64_t n = 1;
    for (int d = 0; d < tensor->tensor->ndim; d++) n *= tensor->tensor->shape[d];
    return n;
}

int torch_tensor_is_contiguous(const pickle_value *tensor)
{
    int64_t expected = 1;
    for (int d = tensor->tensor->ndim - 1; d >= 0; d--) {
        if (tensor->tensor->shape[d] != 1 && tensor->tensor->stride[d] != expected) return 0;
        expected *= tensor->tensor->shape[d];
    }
    return 1;
}

int torch_tensor_dense_order(const pickle_value *tensor, int order[TORCH_MAX_DIMS])
{
    const pickle_tensor *t = tensor->tensor;
    int n = 0;
    /* Dimensions of more than one element by stride, largest first (an
     * insertion sort: at most 16); those of one element take any stride
     * and no place in memory, so they come last. */
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 1) continue;
        int at = n++;
        while (at > 0 && t->stride[order[at - 1]] < t->stride[d]) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = d;
    }
    for (int d = 0, k = n; d < t->ndim; d++)
        if (t->shape[d] == 1) order[k++] = d;
    /* Dense: the innermost stride 1, each next one the size of what it steps over. */
    int64_t expected = 1;
    for (int k = n - 1; k >= 0; k--) {
        if (t->stride[order[k]] != expected) return 0;
        expected *= t->shape[order[k]];
    }
    return 1;
}

/* Where the storage's data starts in the file, checked to hold its elements. */
static int storage_entry(const torch_archive *archive, const pickle_value *storage, int *entry)
{
    char name[512];
    snprintf(name, sizeof name, "%sdata/%s", archive->prefix, storage->storage.key);
    *entry = zip_find(archive->zip, name);
    if (*entry < 0)
        return tp_fail(TP_ERR_FORMAT, "%s: storage %s has no entry %s", zip_path(archive->zip), storage->storage.key, name);
    return TP_OK;
}

static int storage_range(const torch_archive *archive, const pickle_value *storage, int64_t *offset)
{
    const char *path = zip_path(archive->zip);
    int entry;
    TP_TRY(storage_entry(archive, storage, &entry));
    int64_t bytes, element = (int64_t)torch_dtype_size(storage->storage.dtype);
    TP_TRY(zip_entry_range(archive->zip, entry, offset, &bytes));
    if (bytes / element < storage->storage.numel)
        return tp_fail(TP_ERR_FORMAT, "%s: storage %s holds %lld bytes, %lld elements of %s need %lld", path,
                       storage->storage.key, (long long)bytes, (long long)storage->storage.numel,
                       torch_dtype_name(storage->storage.dtype), (long long)(storage->storage.numel * element));
    return TP_OK;
}

/* Where a tensor's bytes are in the archive (not its file): a contiguous
 * one's, or with dense, a torch_tensor_dense_order one's. */
static int tensor_bytes_in_archive(const torch_archive *archive, const pickle_value *tensor, int dense, int64_t *offset,
                                   int64_t *size)
{
    if (!tensor || tensor->kind != PICKLE_TENSOR) return tp_fail(TP_ERR_ARG, "%s: not a tensor", zip_path(archive->zip));
    const pickle_value *storage = tensor->tensor->storage;
    int order[TORCH_MAX_DIMS];
    if (dense && !torch_tensor_dense_order(tensor, order))
        return tp_fail(TP_ERR_FORMAT, "%s: a tensor of storage %s is not dense (its strides overlap or leave gaps)",
                       zip_path(archive->zip), storage->storage.key);
    if (!dense && !torch_tensor_is_contiguous(tensor))
        return tp_fail(TP_ERR_FORMAT, "%s: a tensor of storage %s is not contiguous (a view saved with its strides)",
                       zip_path(archive->zip), storage->storage.key);
    int64_t data, element = (int64_t)torch_dtype_size(storage->storage.dtype);
    TP_TRY(storage_range(archive, storage, &data));
    /* The pickle checked that the tensor lies within the storage's numel. */
    *offset = data + tensor->tensor->offset * element;
    *size = torch_tensor_numel(tensor) * element;
    return TP_OK;
}

/* Where a contiguous tensor's bytes are in the archive (not its file). */
static int tensor_range_in_archive(const torch_archive *archive, const pickle_value *tensor, int64_t *offset, int64_t *size)
{
    return tensor_bytes_in_archive(archive, tensor, 0, offset, size);
}

int torch_tensor_range(const torch_archive *archive, const pickle_value *tensor, int64_t *offset, int64_t *size)
{
    TP_TRY(tensor_range_in_archive(archive, tensor, offset, size));
    *offset += zip_base(archive->zip);
    return TP_OK;
}

int torch_tensor_dense_range(const torch_archive *archive, const pickle_value *tensor, int64_t *offset, int64_t *size)
{
    TP_TRY(tensor_bytes_in_archive(archive, tensor, 1, offset, size));
    *offset += zip_base(archive->zip);
    return TP_OK;
}

void torch_archive_version(const torch_archive *archive, char *out, size_t size)
{
    zip_version(archive->zip, out, size);
}

int torch_tensor_storage_entry(const torch_archive *archive, const pickle_value *tensor, torch_storage_entry *out)
{
    if (!tensor || tensor->kind != PICKLE_TENSOR) return tp_fail(TP_ERR_ARG, "%s: not a tensor", zip_path(archive->zip));
    int entry;
    TP_TRY(storage_entry(archive, tensor->tensor->storage, &entry));
    TP_TRY(zip_entry_range(archive->zip, entry, &out->offset, &out->size));
    out->offset += zip_base(archive->zip);
    out->crc32 = zip_entry_crc(archive->zip, entry);
    out->recorded = out->crc32 != 0 || out->size == 0;
    out->entry = zip_name(archive->zip, entry);
    return TP_OK;
}

int torch_tensor_read(const torch_archive *archive, const pickle_value *tensor, void *buf, int64_t from, int64_t size)
{
    int64_t offset, bytes;
    TP_TRY(tensor_range_in_archive(archive, tensor, &offset, &bytes));
    if (from < 0 || size < 0 || from > bytes - size)
        return tp_fail(TP_ERR_ARG, "%s: bytes [%lld, %lld) of a tensor of %lld bytes", zip_path(archive->zip), (long long)from,
                       (long long)(from + size), (long long)bytes);
    return zip_read(archive->zip, buf, size, offset + from);
}

int torch_tensor_read_checked(const torch_archive *archive, const pickle_value *tensor, void *buf, int64_t size)
{
    int64_t offset, bytes, data, stored;
    int entry;
    TP_TRY(tensor_range_in_archive(archive, tensor, &offset, &bytes));
    if (size != bytes)
        return tp_fail(TP_ERR_ARG, "%s: %lld bytes asked of a tensor of %lld", zip_path(archive->zip), (long long)size,
                       (long long)bytes);
    TP_TRY(storage_entry(archive, tensor->tensor->storage, &entry));
    TP_TRY(zip_entry_range(archive->zip, entry, &data, &stored));
    unsigned char *whole = malloc((size_t)stored + 1);
    if (!whole) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = zip_read(archive->zip, whole, stored, data);
    if (!status) status = zip_entry_check_data(archive->zip, entry, whole);
    if (!status) memcpy(buf, whole + (offset - data), (size_t)size);
    free(whole);
    return status;
}

int torch_archive_check(torch_archive *archive, torch_archive_check_result *result,
                        void (*on_bytes)(void *ctx, int64_t bytes), void *ctx)
{
    memset(result, 0, sizeof *result);
    size_t size = (size_t)TORCH_ARCHIVE_CHECK_BYTES;
    void *buf = alloc_pages(size);
    if (!buf) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = TP_OK;
    for (int i = 0; i < zip_count(archive->zip) && !status; i++) {
        int checked;
        status = zip_entry_check(archive->zip, i, buf, size, &checked, on_bytes, ctx);
        result->entries++;
        result->unchecked += !status && !checked; /* a damaged entry recorded its CRC-32 */
    }
    free(buf);
    return status;
}
