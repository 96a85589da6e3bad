/* md5.h: the MD5 digests S3 names objects and parts by (s3.c). A part's
 * ETag is the MD5 of its bytes, and S3 checks a part against the
 * Content-MD5 it was sent with (base64 of the digest); a multipart
 * upload's ETag is "HEX-N": the MD5 of its N parts' binary MD5s, one after
 * the other. MD5 comes from OpenSSL's libcrypto, as SHA-256 does for
 * sigv4.c. (ETags of objects encrypted with SSE-KMS or SSE-C are not
 * MD5s.) */
#ifndef TP_STORE_MD5_H
#define TP_STORE_MD5_H

#include <stddef.h>
#include <stdint.h>

#define MD5_BYTES 16

/* The MD5 of bytes [offset, offset + length) of a local file; fails naming
 * the file when it cannot be read whole. */
int md5_file_range(const char *path, int64_t offset, int64_t length, unsigned char digest[MD5_BYTES]);

/* The MD5 of bytes in memory. */
void md5_bytes(const void *data, size_t size, unsigned char digest[MD5_BYTES]);

/* "HEX": the ETag S3 gives an object PUT whole (not encrypted with SSE-KMS
 * or SSE-C), quotes included as S3 sends them. */
void md5_etag(const unsigned char digest[MD5_BYTES], char *out, size_t size);

/* "HEX-N": the ETag S3 gives an object completed from the parts whose MD5s
 * are digests[0..parts), quotes included as S3 sends them. */
void md5_multipart_etag(const unsigned char (*digests)[MD5_BYTES], int64_t parts, char *out, size_t size);

/* The digest in base64 (24 characters), as the Content-MD5 header carries it. */
void md5_base64(const unsigned char digest[MD5_BYTES], char out[25]);

#endif
