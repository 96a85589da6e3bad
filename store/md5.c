/* md5.c: MD5 digests of files and of multipart uploads (md5.h). */
#include "md5.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/error.h"

#define READ_CHUNK ((size_t)1 << 20) /* bytes read at a time: a part is up to 5 GiB */

int md5_file_range(const char *path, int64_t offset, int64_t length, unsigned char digest[MD5_BYTES])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tp_fail(TP_ERR_IO, "%s: cannot open to upload: %s", path, strerror(errno));
    unsigned char *chunk = malloc(READ_CHUNK);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int status = !chunk || !md ? tp_fail(TP_ERR_NOMEM, "out of memory reading %s", path) : TP_OK;
    if (!status && EVP_DigestInit_ex(md, EVP_md5(), NULL) != 1)
        status = tp_fail(TP_ERR_IO, "OpenSSL cannot compute MD5 (a FIPS-only libcrypto?)");
    for (int64_t done = 0; !status && done < length;) {
        size_t want = length - done < (int64_t)READ_CHUNK ? (size_t)(length - done) : READ_CHUNK;
        ssize_t got = pread(fd, chunk, want, (off_t)(offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            status = tp_fail(TP_ERR_IO, "%s: read failed at byte %lld of the %lld to upload: %s", path,
                             (long long)(offset + done), (long long)(offset + length),
                             got < 0 ? strerror(errno) : "the file ends there (truncated while it was uploaded?)");
        else
            EVP_DigestUpdate(md, chunk, (size_t)got), done += got;
    }
    unsigned int n = 0;
    if (!status) EVP_DigestFinal_ex(md, digest, &n);
    EVP_MD_CTX_free(md);
    free(chunk);
    close(fd);
    return status;
}

void md5_bytes(const void *data, size_t size, unsigned char digest[MD5_BYTES])
{
    unsigned int n = 0;
    EVP_Digest(data, size, digest, &n, EVP_md5(), NULL);
}

void md5_etag(const unsigned char digest[MD5_BYTES], char *out, size_t size)
{
    char hex[2 * MD5_BYTES + 1];
    for (int i = 0; i < MD5_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    snprintf(out, size, "\"%s\"", hex);
}

void md5_multipart_etag(const unsigned char (*digests)[MD5_BYTES], int64_t parts, char *out, size_t size)
{
    unsigned char whole[MD5_BYTES];
    md5_bytes(digests, (size_t)parts * MD5_BYTES, whole);
    char quoted[2 * MD5_BYTES + 3];
    md5_etag(whole, quoted, sizeof quoted);
    snprintf(out, size, "%.*s-%lld\"", 2 * MD5_BYTES + 1, quoted, (long long)parts);
}

void md5_base64(const unsigned char digest[MD5_BYTES], char out[25])
{
    EVP_EncodeBlock((unsigned char *)out, digest, MD5_BYTES);
}
