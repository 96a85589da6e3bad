/* codec.c: checksums (XXH3-64 block trees) and the zstd chunk codec, which
 * also serves as HDF5 filter 32015 so that HDF5 itself can read our compressed
 * datasets without any plugin installed. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>
#if defined(__x86_64__)
/* libxxhash's runtime dispatch picks the widest vector unit (AVX2/AVX-512):
 * about 9x the speed of the baseline SSE2 build on the same data. */
#include <xxh_x86dispatch.h>
#endif

#include "internal.h"

uint64_t ckpt_hash_block(const void *data, size_t bytes)
{
    return XXH3_64bits(data, bytes);
}

uint64_t ckpt_hash_blocks(const uint64_t *block_hashes, int64_t num_blocks)
{
    /* The host is little-endian (internal.h), so the array is the LE byte string. */
    return XXH3_64bits(block_hashes, (size_t)num_blocks * sizeof(uint64_t));
}

void ckpt_format_checksum(uint64_t checksum, char out[17])
{
    snprintf(out, 17, "%016" PRIx64, checksum);
}

int ckpt_parse_checksum(const char *text, uint64_t *out)
{
    uint64_t value = 0;
    if (strlen(text) != 16) return TP_ERR_FORMAT;
    for (int i = 0; i < 16; i++) {
        char c = text[i];
        int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0) return TP_ERR_FORMAT;
        value = value << 4 | (uint64_t)digit;
    }
    *out = value;
    return TP_OK;
}

int64_t ckpt_block_rows_for(int64_t rows, int64_t row_bytes)
{
    int64_t block_rows = CKPT_BLOCK_TARGET_BYTES / (row_bytes > 0 ? row_bytes : 1);
    if (block_rows < 1) block_rows = 1;
    if (block_rows > rows) block_rows = rows;
    return block_rows;
}

/* HDF5's shuffle filter (id 2): byte j of element i moves to plane j, so
 * the slowly varying sign/exponent bytes of floats sit together and zstd finds
 * them. out[j * n + i] = in[i * size + j]; bytes past the last element stay. */
void ckpt_shuffle(const void *in, void *out, size_t bytes, size_t size)
{
    const uint8_t *src = in;
    uint8_t *dst = out;
    size_t n = bytes / size;
    if (size == 4) {
        for (size_t i = 0; i < n; i++) {
            dst[i] = src[4 * i];
            dst[n + i] = src[4 * i + 1];
            dst[2 * n + i] = src[4 * i + 2];
            dst[3 * n + i] = src[4 * i + 3];
        }
    } else if (size == 2) {
        for (size_t i = 0; i < n; i++) {
            dst[i] = src[2 * i];
            dst[n + i] = src[2 * i + 1];
        }
    } else {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < size; j++) dst[j * n + i] = src[i * size + j];
    }
    memcpy(dst + n * size, src + n * size, bytes - n * size);
}

void ckpt_unshuffle(const void *in, void *out, size_t bytes, size_t size)
{
    const uint8_t *src = in;
    uint8_t *dst = out;
    size_t n = bytes / size;
    if (size == 4) {
        for (size_t i = 0; i < n; i++) {
            dst[4 * i] = src[i];
            dst[4 * i + 1] = src[n + i];
            dst[4 * i + 2] = src[2 * n + i];
            dst[4 * i + 3] = src[3 * n + i];
        }
    } else if (size == 2) {
        for (size_t i = 0; i < n; i++) {
            dst[2 * i] = src[i];
            dst[2 * i + 1] = src[n + i];
        }
    } else {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < size; j++) dst[i * size + j] = src[j * n + i];
    }
    memcpy(dst + n * size, src + n * size, bytes - n * size);
}

size_t ckpt_zstd_bound(size_t src_size)
{
    return ZSTD_compressBound(src_size);
}

int ckpt_zstd_compress(const void *src, size_t src_size, void *dst, size_t dst_capacity,
                       int level, size_t *out_size)
{
    /* One frame with its content size in the header: what the common 32015
     * plugin expects to find in a chunk. */
    size_t n = ZSTD_compress(dst, dst_capacity, src, src_size, level);
    if (ZSTD_isError(n))
        return tp_fail(TP_ERR_ARG, "zstd compression failed: %s", ZSTD_getErrorName(n));
    *out_size = n;
    return TP_OK;
}

int ckpt_zstd_decompress(const void *src, size_t src_size, void *dst, size_t dst_size)
{
    unsigned long long content = ZSTD_getFrameContentSize(src, src_size);
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN)
        return tp_fail(TP_ERR_FORMAT, "compressed chunk is not a zstd frame with its size");
    if (content != dst_size)
        return tp_fail(TP_ERR_FORMAT, "compressed chunk holds %llu bytes, expected %zu",
                         content, dst_size);
    size_t n = ZSTD_decompress(dst, dst_size, src, src_size);
    if (ZSTD_isError(n))
        return tp_fail(TP_ERR_FORMAT, "zstd decompression failed: %s", ZSTD_getErrorName(n));
    if (n != dst_size)
        return tp_fail(TP_ERR_FORMAT, "chunk decompressed to %zu bytes, expected %zu", n,
                         dst_size);
    return TP_OK;
}

/* The HDF5 filter callback. Returns the size of the new buffer, or 0 on
 * failure (HDF5's convention). Buffers crossing into HDF5 use its allocator. */
static size_t zstd_h5_filter(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[],
                             size_t nbytes, size_t *buf_size, void **buf)
{
    void *out = NULL;
    size_t out_size = 0;
    if (flags & H5Z_FLAG_REVERSE) {
        unsigned long long content = ZSTD_getFrameContentSize(*buf, nbytes);
        if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN) return 0;
        out = H5allocate_memory((size_t)content, 0);
        if (!out) return 0;
        out_size = ZSTD_decompress(out, (size_t)content, *buf, nbytes);
        if (ZSTD_isError(out_size) || out_size != content) goto fail;
    } else {
        int level = cd_nelmts > 0 ? (int)cd_values[0] : 3;
        size_t capacity = ZSTD_compressBound(nbytes);
        out = H5allocate_memory(capacity, 0);
        if (!out) return 0;
        out_size = ZSTD_compress(out, capacity, *buf, nbytes, level);
        if (ZSTD_isError(out_size)) goto fail;
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = out_size;
    return out_size;
fail:
    H5free_memory(out);
    return 0;
}

int ckpt_zstd_register(void)
{
    static const H5Z_class2_t zstd_class = {
        H5Z_CLASS_T_VERS, (H5Z_filter_t)CKPT_ZSTD_FILTER_ID, 1, 1, "zstd", NULL, NULL,
        (H5Z_func_t)zstd_h5_filter,
    };
    if (H5Zregister(&zstd_class) < 0) return ckpt_fail_hdf5("cannot register the zstd filter");
    return TP_OK;
}
