/* zip.h (private to formats/): the zip container of torch.save archives,
 * read through a store (store/store.h) so that archives in object stores
 * open as local ones do. Only the central directory is read at open; an
 * entry's local header when its data is first asked for. Entries must be
 * stored (method 0), as torch.save writes them; Zip64 sizes and offsets
 * and data descriptors are understood. */
#ifndef TP_FORMATS_ZIP_H
#define TP_FORMATS_ZIP_H

#include <stdint.h>

#include "../store/store.h"

typedef struct zip_archive zip_archive;

/* Fails with TP_ERR_FORMAT naming path on anything that is not a zip
 * archive within the limits (at most 1 << 22 entries, a central directory
 * of at most 256 MiB). */
int zip_open(const char *path, zip_archive **out);
/* The archive held in bytes [base, base + size) of the file (size -1: to
 * its end), as PyTorch's distributed checkpoints hold one torch.save
 * archive per item; offsets inside are the archive's own. version (NULL or
 * "": any) is the version of the file every read must match (an object's
 * ETag another handle read it at: zip_version). */
int zip_open_range(const char *path, int64_t base, int64_t size, const char *version, zip_archive **out);
/* The archive held in data[0, size) (the caller's, kept while it is
 * open), name in messages: a torch.save in an io.BytesIO. */
int zip_open_memory(const char *name, const void *data, int64_t size, zip_archive **out);
void zip_close(zip_archive *zip);

int zip_count(const zip_archive *zip);
const char *zip_name(const zip_archive *zip, int entry);
/* The entry of that name, or -1. */
int zip_find(const zip_archive *zip, const char *name);

/* Where entry's bytes lie in the archive: reads its local header once (safe
 * from several threads) and checks that it is stored and lies inside the
 * file. */
int zip_entry_range(zip_archive *zip, int entry, int64_t *offset, int64_t *size);

/* Reads entry's data through buf (buf_size bytes at a time) and compares
 * its CRC-32 with the central directory's: TP_ERR_CHECKSUM naming the
 * file, the entry and both values. An entry that records 0 for data that
 * is not empty (torch.serialization.set_crc32_options(False)) is read no
 * further: *checked 0. on_bytes (may be NULL) hears the bytes read. */
int zip_entry_check(zip_archive *zip, int entry, void *buf, size_t buf_size, int *checked,
                    void (*on_bytes)(void *ctx, int64_t bytes), void *ctx);

/* zip_entry_check of an entry the caller has read whole into data (its
 * zip_entry_range size bytes): a data.pkl, read anyway, checked without a
 * second read. TP_OK when the entry records no CRC-32. */
int zip_entry_check_data(const zip_archive *zip, int entry, const void *data);

/* The CRC-32 the central directory records for entry's data; 0 for data
 * that is not empty means none was recorded (set_crc32_options(False)). */
uint32_t zip_entry_crc(const zip_archive *zip, int entry);

/* The version of the archive's file its reads are pinned to (an object's
 * ETag; "" on a local file system): store_file_version. */
void zip_version(const zip_archive *zip, char *out, size_t size);

/* Reads [offset, offset + size) of the archive. */
int zip_read(const zip_archive *zip, void *buf, int64_t size, int64_t offset);

const char *zip_path(const zip_archive *zip);
/* Bytes of the archive (of its file, for a whole file). */
int64_t zip_file_bytes(const zip_archive *zip);
/* Where the archive starts in its file (0 for a whole file). */
int64_t zip_base(const zip_archive *zip);

#endif
