/* zip.c: the central directory of a zip archive, and the data of its
 * stored entries, read through a store. */
#include <isa-l/crc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "zip.h"

#define ZIP_MAX_ENTRIES (1 << 22)
#define ZIP_MAX_DIRECTORY ((int64_t)256 << 20)
#define EOCD_SIZE 22
#define EOCD_SEARCH (EOCD_SIZE + 65535) /* the record and the longest comment */
#define ZIP64_LOCATOR_SIZE 20
#define ZIP64_EOCD_SIZE 56
#define CENTRAL_HEADER_SIZE 46
#define LOCAL_HEADER_SIZE 30

typedef struct {
    const char *name;
    int method, flags;
    uint32_t crc;             /* CRC-32 of the data, as the central directory records it */
    int64_t size, stored_size, local_offset;
    _Atomic int64_t data_offset; /* 0 until the local header is read */
} zip_entry;

struct zip_archive {
    const store_ops *store;
    store_file *file;
    char *path;
    int64_t base;      /* where the archive starts in the file */
    int64_t file_size; /* bytes of the archive (the file's, for a whole file) */
    int64_t directory_offset;
    zip_entry *entries;
    int count;
    int *by_name; /* entry indices sorted by name */
    char *names;
    const unsigned char *memory; /* an archive held in memory (zip_open_memory), not a store's file */
};

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

const char *zip_path(const zip_archive *zip)
{
    return zip->path;
}

int64_t zip_file_bytes(const zip_archive *zip)
{
    return zip->file_size;
}

int64_t zip_base(const zip_archive *zip)
{
    return zip->base;
}

int zip_read(const zip_archive *zip, void *buf, int64_t size, int64_t offset)
{
    if (size < 0 || offset < 0 || offset > zip->file_size - size)
        return tp_fail(TP_ERR_FORMAT, "%s: bytes [%lld, %lld) asked of a file of %lld", zip->path, (long long)offset,
                       (long long)(offset + size), (long long)zip->file_size);
    if (zip->memory) {
        memcpy(buf, zip->memory + offset, (size_t)size);
        return TP_OK;
    }
    return zip->store->read_at(zip->file, buf, (size_t)size, zip->base + offset);
}

/* The end of the central directory: its offset, size and entry count,
 * from the Zip64 records when there are some. */
static int read_end(zip_archive *zip, int64_t *offset, int64_t *size, int64_t *count)
{
    int64_t tail = zip->file_size < EOCD_SEARCH + ZIP64_LOCATOR_SIZE ? zip->file_size : EOCD_SEARCH + ZIP64_LOCATOR_SIZE;
    if (tail < EOCD_SIZE) return tp_fail(TP_ERR_FORMAT, "%s: %lld bytes, too short for a zip archive", zip->path, (long long)zip->file_size);
    unsigned char *buf = malloc((size_t)tail);
    if (!buf) return tp_fail(TP_ERR_NOMEM, "out of memory");
    int status = zip_read(zip, buf, tail, zip->file_size - tail);
    int64_t at = -1;
    for (int64_t i = tail - EOCD_SIZE; !status && i >= 0; i--) {
        if (memcmp(buf + i, "PK\5\6", 4) == 0 && i + EOCD_SIZE + (int64_t)le(buf + i + 20, 2) <= tail) {
            at = i;
            break;
        }
    }
    if (!status && at < 0) status = tp_fail(TP_ERR_FORMAT, "%s: no end of central directory (not a zip archive, or truncated)", zip->path);
    if (!status) {
        const unsigned char *e = buf + at;
        if (le(e + 4, 2) != 0 || le(e + 6, 2) != 0)
            status = tp_fail(TP_ERR_FORMAT, "%s: a zip archive split across disks", zip->path);
        *count = (int64_t)le(e + 10, 2);
        *size = (int64_t)le(e + 12, 4);
        *offset = (int64_t)le(e + 16, 4);
    }
    /* Zip64: a locator just before the record points at the Zip64 record. */
    if (!status && at >= ZIP64_LOCATOR_SIZE && memcmp(buf + at - ZIP64_LOCATOR_SIZE, "PK\6\7", 4) == 0) {
        uint64_t record = le(buf + at - ZIP64_LOCATOR_SIZE + 8, 8);
        unsigned char z[ZIP64_EOCD_SIZE];
        if (record > (uint64_t)(zip->file_size - ZIP64_EOCD_SIZE))
            status = tp_fail(TP_ERR_FORMAT, "%s: Zip64 end record at %llu, past the end", zip->path, (unsigned long long)record);
        if (!status) status = zip_read(zip, z, ZIP64_EOCD_SIZE, (int64_t)record);
        if (!status && memcmp(z, "PK\6\6", 4) != 0)
            status = tp_fail(TP_ERR_FORMAT, "%s: no Zip64 end record where its locator says (%llu)", zip->path,
                             (unsigned long long)record);
        if (!status) {
            uint64_t count64 = le(z + 32, 8), size64 = le(z + 40, 8), offset64 = le(z + 48, 8);
            if (count64 > ZIP_MAX_ENTRIES || size64 > (uint64_t)zip->file_size || offset64 > (uint64_t)zip->file_size)
                status = tp_fail(TP_ERR_FORMAT, "%s: Zip64 record of %llu entries, directory of %llu bytes at %llu",
                                 zip->path, (unsigned long long)count64, (unsigned long long)size64,
                                 (unsigned long long)offset64);
            *count = (int64_t)count64;
            *size = (int64_t)size64;
            *offset = (int64_t)offset64;
        }
    }
    free(buf);
    if (status) return status;
    if (*count > ZIP_MAX_ENTRIES || *size > ZIP_MAX_DIRECTORY)
        return tp_fail(TP_ERR_FORMAT, "%s: %lld entries in a directory of %lld bytes (limits %d and %lld)", zip->path,
                       (long long)*count, (long long)*size, ZIP_MAX_ENTRIES, (long long)ZIP_MAX_DIRECTORY);
    if (*offset > zip->file_size - *size)
        return tp_fail(TP_ERR_FORMAT, "%s: central directory [%lld, %lld) past the end of the file (%lld bytes)", zip->path,
                       (long long)*offset, (long long)(*offset + *size), (long long)zip->file_size);
    return TP_OK;
}

/* The Zip64 extra field (id 1) replaces, in this order, each of the
 * fields that hold 0xFFFFFFFF. */
static int apply_zip64(zip_archive *zip, zip_entry *e, const unsigned char *extra, int extra_size)
{
    int64_t *fields[] = {&e->size, &e->stored_size, &e->local_offset};
    for (int at = 0; at + 4 <= extra_size;) {
        int id = (int)le(extra + at, 2), size = (int)le(extra + at + 2, 2);
        if (at + 4 + size > extra_size) break;
        if (id == 1) {
            int used = 0;
            for (int f = 0; f < 3; f++) {
                if (*fields[f] != 0xFFFFFFFF) continue;
                if (used + 8 > size) return tp_fail(TP_ERR_FORMAT, "%s: entry %s: Zip64 field too short", zip->path, e->name);
                uint64_t v = le(extra + at + 4 + used, 8);
                if (v > INT64_MAX) return tp_fail(TP_ERR_FORMAT, "%s: entry %s: Zip64 value %llu", zip->path, e->name, (unsigned long long)v);
                *fields[f] = (int64_t)v;
                used += 8;
            }
            return TP_OK;
        }
        at += 4 + size;
    }
    for (int f = 0; f < 3; f++)
        if (*fields[f] == 0xFFFFFFFF) return tp_fail(TP_ERR_FORMAT, "%s: entry %s: a Zip64 size without its extra field", zip->path, e->name);
    return TP_OK;
}

static int by_entry_name(const void *a, const void *b, void *zip)
{
    const zip_entry *entries = ((const zip_archive *)zip)->entries;
    return strcmp(entries[*(const int *)a].name, entries[*(const int *)b].name);
}

static int read_directory(zip_archive *zip)
{
    int64_t offset = 0, size = 0, count = 0;
    TP_TRY(read_end(zip, &offset, &size, &count));
    zip->directory_offset = offset;
    unsigned char *dir = malloc((size_t)size + 1);
    zip->entries = calloc((size_t)count + 1, sizeof *zip->entries);
    zip->by_name = calloc((size_t)count + 1, sizeof *zip->by_name);
    zip->names = malloc((size_t)size + 1); /* names are shorter than their records */
    if (!dir || !zip->entries || !zip->by_name || !zip->names) {
        free(dir);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    int status = zip_read(zip, dir, size, offset);
    int64_t at = 0, names_at = 0;
    for (int64_t i = 0; i < count && !status; i++) {
        const unsigned char *h = dir + at;
        if (size - at < CENTRAL_HEADER_SIZE || memcmp(h, "PK\1\2", 4) != 0) {
            status = tp_fail(TP_ERR_FORMAT, "%s: central directory entry %lld of %lld is damaged", zip->path, (long long)i,
                             (long long)count);
            break;
        }
        int name_size = (int)le(h + 28, 2), extra_size = (int)le(h + 30, 2), comment_size = (int)le(h + 32, 2);
        if (size - at < CENTRAL_HEADER_SIZE + name_size + extra_size + comment_size) {
            status = tp_fail(TP_ERR_FORMAT, "%s: central directory entry %lld runs past the directory", zip->path, (long long)i);
            break;
        }
        zip_entry *e = &zip->entries[i];
        char *name = zip->names + names_at;
        memcpy(name, h + CENTRAL_HEADER_SIZE, (size_t)name_size);
        name[name_size] = 0;
        names_at += name_size + 1;
        e->name = name;
        if ((int)strlen(name) != name_size) {
            status = tp_fail(TP_ERR_FORMAT, "%s: entry %lld's name holds a NUL", zip->path, (long long)i);
            break;
        }
        e->flags = (int)le(h + 8, 2);
        e->method = (int)le(h + 10, 2);
        e->crc = (uint32_t)le(h + 16, 4);
        e->stored_size = (int64_t)le(h + 20, 4);
        e->size = (int64_t)le(h + 24, 4);
        e->local_offset = (int64_t)le(h + 42, 4);
        status = apply_zip64(zip, e, h + CENTRAL_HEADER_SIZE + name_size, extra_size);
        at += CENTRAL_HEADER_SIZE + name_size + extra_size + comment_size;
        zip->count = (int)i + 1;
    }
    free(dir);
    if (status) return status;
    for (int i = 0; i < zip->count; i++) zip->by_name[i] = i;
    qsort_r(zip->by_name, (size_t)zip->count, sizeof *zip->by_name, by_entry_name, zip);
    for (int i = 1; i < zip->count; i++)
        if (!strcmp(zip->entries[zip->by_name[i - 1]].name, zip->entries[zip->by_name[i]].name))
            return tp_fail(TP_ERR_FORMAT, "%s: two entries named %s", zip->path, zip->entries[zip->by_name[i]].name);
    return TP_OK;
}

int zip_open(const char *path, zip_archive **out)
{
    return zip_open_range(path, 0, -1, NULL, out);
}

int zip_open_range(const char *path, int64_t base, int64_t size, const char *version, zip_archive **out)
{
    *out = NULL;
    zip_archive *zip = calloc(1, sizeof *zip);
    if (!zip || !(zip->path = strdup(path))) {
        free(zip);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    store_stat st;
    int status = store_for(path, &zip->store);
    if (!status) status = zip->store->stat(zip->store, path, &st);
    if (!status && !st.exists) status = tp_fail(TP_ERR_NOT_FOUND, "%s: no such file", path);
    if (!status && st.is_dir) status = tp_fail(TP_ERR_FORMAT, "%s is a directory, not a torch.save file", path);
    if (!status && (base < 0 || base > st.size || (size >= 0 && size > st.size - base)))
        status = tp_fail(TP_ERR_FORMAT, "%s: an archive of %lld bytes at %lld lies outside the file (%lld bytes)", path,
                         (long long)size, (long long)base, (long long)st.size);
    if (!status) {
        zip->base = base;
        zip->file_size = size >= 0 ? size : st.size - base;
        status = zip->store->open(zip->store, path, STORE_OPEN_READ, &zip->file);
    }
    if (!status && version) status = store_file_pin(zip->store, zip->file, version);
    if (!status) status = read_directory(zip);
    if (status) {
        zip_close(zip);
        return status;
    }
    *out = zip;
    return TP_OK;
}

int zip_open_memory(const char *name, const void *data, int64_t size, zip_archive **out)
{
    *out = NULL;
    zip_archive *zip = calloc(1, sizeof *zip);
    if (!zip || !(zip->path = strdup(name))) {
        free(zip);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    zip->memory = data;
    zip->file_size = size;
    int status = read_directory(zip);
    if (status) {
        zip_close(zip);
        return status;
    }
    *out = zip;
    return TP_OK;
}

void zip_close(zip_archive *zip)
{
    if (!zip) return;
    if (zip->file) zip->store->close(zip->file);
    free(zip->entries);
    free(zip->by_name);
    free(zip->names);
    free(zip->path);
    free(zip);
}

int zip_count(const zip_archive *zip)
{
    return zip->count;
}

const char *zip_name(const zip_archive *zip, int entry)
{
    return entry >= 0 && entry < zip->count ? zip->entries[entry].name : NULL;
}

int zip_find(const zip_archive *zip, const char *name)
{
    int lo = 0, hi = zip->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(zip->entries[zip->by_name[mid]].name, name);
        if (c == 0) return zip->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

int zip_entry_range(zip_archive *zip, int entry, int64_t *offset, int64_t *size)
{
    if (entry < 0 || entry >= zip->count) return tp_fail(TP_ERR_ARG, "%s: no entry %d", zip->path, entry);
    zip_entry *e = &zip->entries[entry];
    if (e->flags & 1) return tp_fail(TP_ERR_FORMAT, "%s: entry %s is encrypted", zip->path, e->name);
    if (e->method != 0 || e->stored_size != e->size)
        return tp_fail(TP_ERR_FORMAT, "%s: entry %s is compressed (method %d, %lld bytes for %lld); torch.save stores its entries",
                       zip->path, e->name, e->method, (long long)e->stored_size, (long long)e->size);
    int64_t data = atomic_load_explicit(&e->data_offset, memory_order_relaxed);
    if (!data) {
        unsigned char h[LOCAL_HEADER_SIZE];
        if (e->local_offset > zip->directory_offset - LOCAL_HEADER_SIZE)
            return tp_fail(TP_ERR_FORMAT, "%s: entry %s's header at %lld lies past the entries", zip->path, e->name,
                           (long long)e->local_offset);
        TP_TRY(zip_read(zip, h, LOCAL_HEADER_SIZE, e->local_offset));
        if (memcmp(h, "PK\3\4", 4) != 0)
            return tp_fail(TP_ERR_FORMAT, "%s: no local header of entry %s at %lld", zip->path, e->name, (long long)e->local_offset);
        /* Without a data descriptor (flag 8) the local header repeats the
         * CRC-32 that the central directory records: two that differ mean
         * a damaged or a half-written archive. */
        uint32_t local_crc = (uint32_t)le(h + 14, 4);
        if (!(e->flags & 8) && local_crc != e->crc)
            return tp_fail(TP_ERR_FORMAT, "%s: entry %s: its local header records CRC-32 %08x, the central directory "
                           "%08x", zip->path, e->name, local_crc, e->crc);
        data = e->local_offset + LOCAL_HEADER_SIZE + (int64_t)le(h + 26, 2) + (int64_t)le(h + 28, 2);
        if (data > zip->directory_offset || e->size > zip->directory_offset - data)
            return tp_fail(TP_ERR_FORMAT, "%s: entry %s's %lld bytes at %lld run into the central directory at %lld",
                           zip->path, e->name, (long long)e->size, (long long)data, (long long)zip->directory_offset);
        atomic_store_explicit(&e->data_offset, data, memory_order_relaxed);
    }
    *offset = data;
    *size = e->size;
    return TP_OK;
}

void zip_version(const zip_archive *zip, char *out, size_t size)
{
    if (zip->store && zip->file) store_file_version(zip->store, zip->file, out, size);
    else if (size) out[0] = '\0';
}

uint32_t zip_entry_crc(const zip_archive *zip, int entry)
{
    return zip->entries[entry].crc;
}

/* Whether an entry records a CRC-32 to compare with: 0 for data that is not
 * empty is torch.serialization.set_crc32_options(False)'s "none". */
static int crc_recorded(const zip_entry *e)
{
    return e->crc != 0 || e->size == 0;
}

/* crc, taken over all of e's data, against the central directory's: the
 * one message of a damaged entry, for a read in parts and a read whole. */
static int compare_crc(const zip_archive *zip, const zip_entry *e, uint32_t crc)
{
    if (crc != e->crc)
        return tp_fail(TP_ERR_CHECKSUM, "%s: entry %s: its %lld bytes have CRC-32 %08x, the archive records %08x (damaged)",
                       zip->path, e->name, (long long)e->size, crc, e->crc);
    return TP_OK;
}

int zip_entry_check_data(const zip_archive *zip, int entry, const void *data)
{
    if (entry < 0 || entry >= zip->count) return tp_fail(TP_ERR_ARG, "%s: no entry %d", zip->path, entry);
    const zip_entry *e = &zip->entries[entry];
    if (!crc_recorded(e)) return TP_OK;
    return compare_crc(zip, e, e->size > 0 ? crc32_gzip_refl(0, data, (uint64_t)e->size) : 0);
}

int zip_entry_check(zip_archive *zip, int entry, void *buf, size_t buf_size, int *checked,
                    void (*on_bytes)(void *ctx, int64_t bytes), void *ctx)
{
    int64_t offset, size;
    *checked = 0;
    TP_TRY(zip_entry_range(zip, entry, &offset, &size));
    const zip_entry *e = &zip->entries[entry];
    if (!crc_recorded(e)) return TP_OK;
    uint32_t crc = 0;
    for (int64_t at = 0; at < size;) {
        int64_t n = size - at < (int64_t)buf_size ? size - at : (int64_t)buf_size;
        TP_TRY(zip_read(zip, buf, n, offset + at));
        crc = crc32_gzip_refl(crc, buf, (uint64_t)n);
        at += n;
        if (on_bytes) on_bytes(ctx, n);
    }
    TP_TRY(compare_crc(zip, e, crc));
    *checked = 1;
    return TP_OK;
}
