/* sigv4.h: AWS Signature Version 4, the signing of requests to S3 and
 * S3-compatible stores (s3.c). SHA-256 and HMAC come from OpenSSL's
 * libcrypto, which libcurl already brings; OpenSSL is the store library's
 * alone (scripts/check-layers.py).
 *
 * The canonical request follows S3's rules: the path is URI-encoded once,
 * '/' kept, and not normalized; query parameters (given decoded) are
 * encoded and sorted; header names are lowercased and sorted, their values
 * trimmed with runs of spaces collapsed, repeated names joined by commas in
 * the order given. Secrets appear only in the HMAC, never in an output. */
#ifndef TP_STORE_SIGV4_H
#define TP_STORE_SIGV4_H

#include <stddef.h>

#include "../common/buffer.h"

typedef struct {
    const char *name, *value;
} sigv4_pair;

typedef struct {
    const char *access_key, *secret_key;
    const char *session_token; /* NULL without one; else sent and signed as x-amz-security-token */
    const char *region, *service;
} sigv4_key;

typedef struct {
    const char *method;         /* "GET", "PUT", ... */
    const char *path;           /* decoded: "/bucket/step_00000010/index.json" */
    const sigv4_pair *query;    /* decoded names and values (a value may be ""), any order */
    int num_query;
    const sigv4_pair *headers;  /* must include host and x-amz-date (and x-amz-security-token with a token) */
    int num_headers;
    const char *payload_hash;   /* hex SHA-256 of the body, or "UNSIGNED-PAYLOAD" */
    const char *amz_date;       /* the x-amz-date value, "YYYYMMDDTHHMMSSZ" */
} sigv4_request;

/* Each returns a malloc'ed string (free() releases it), or fails with
 * TP_ERR_ARG naming what is malformed, or TP_ERR_NOMEM. */
int sigv4_canonical_request(const sigv4_request *request, char **out);
int sigv4_string_to_sign(const sigv4_key *key, const sigv4_request *request, char **out);
/* The Authorization header's value: "AWS4-HMAC-SHA256 Credential=AKID/DATE/
 * REGION/SERVICE/aws4_request, SignedHeaders=..., Signature=...". */
int sigv4_authorization(const sigv4_key *key, const sigv4_request *request, char **out);

/* RFC 3986 encoding of every byte of s but the unreserved ones (letters,
 * digits, - _ . ~) and '/' when keep_slash, as S3 wants paths, query
 * names and values in URLs and in the canonical request alike. */
void sigv4_uri_encode(byte_buffer *b, const char *s, int keep_slash);

/* Hex SHA-256 of n bytes (the payload hash). */
void sigv4_sha256_hex(const void *data, size_t n, char out[65]);

#endif
