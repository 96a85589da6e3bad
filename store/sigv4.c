/* sigv4.c: AWS Signature Version 4 (sigv4.h). */
#include "sigv4.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/buffer.h"
#include "../common/error.h"

/* The buffer's text to *out, or its failure. */
static int finish(byte_buffer *b, char **out)
{
    if (b->failed || !b->data) {
        free(b->data);
        *out = NULL;
        return tp_fail(TP_ERR_NOMEM, "out of memory signing a request");
    }
    *out = b->data;
    return TP_OK;
}

static int unreserved(unsigned char c)
{
    return isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
}

void sigv4_uri_encode(byte_buffer *b, const char *s, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (unreserved(*p) || (keep_slash && *p == '/')) {
            buffer_put(b, (const char *)p, 1);
        } else {
            char escaped[3] = {'%', hex[*p >> 4], hex[*p & 15]};
            buffer_put(b, escaped, 3);
        }
    }
}

static char *encoded(const char *s)
{
    byte_buffer b = {0};
    sigv4_uri_encode(&b, s, 0);
    if (!b.data && !b.failed) buffer_put_text(&b, "");
    return b.failed ? (free(b.data), NULL) : b.data;
}

/* A query parameter or header, canonical: name and value as signed. */
typedef struct {
    char *name, *value;
} entry;

static int compare_entries(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->value, y->value);
}

/* Header names compare alone: repeated names keep their order (stable
 * through the index tiebreak). */
typedef struct {
    entry e;
    int index;
} indexed_entry;

static int compare_header_entries(const void *a, const void *b)
{
    const indexed_entry *x = a, *y = b;
    int c = strcmp(x->e.name, y->e.name);
    return c ? c : x->index - y->index;
}

static void free_entries(entry *e, int n)
{
    for (int i = 0; e && i < n; i++) free(e[i].name), free(e[i].value);
    free(e);
}

/* value trimmed, runs of spaces and tabs collapsed to one space. */
static char *trimmed(const char *value)
{
    size_t n = strlen(value);
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t k = 0;
    int space = 0;
    for (const char *p = value; *p; p++) {
        if (*p == ' ' || *p == '\t') {
            space = k > 0;
            continue;
        }
        if (space) out[k++] = ' ';
        space = 0;
        out[k++] = *p;
    }
    out[k] = '\0';
    return out;
}

static char *lowercase(const char *s)
{
    char *out = strdup(s);
    for (char *p = out; p && *p; p++) *p = (char)tolower((unsigned char)*p);
    return out;
}

/* The canonical headers ("name:value\n" each) and the signed header list. */
static int canonical_headers(const sigv4_request *r, byte_buffer *headers, byte_buffer *signed_names)
{
    indexed_entry *e = calloc((size_t)r->num_headers + 1, sizeof *e);
    if (!e) return tp_fail(TP_ERR_NOMEM, "out of memory signing a request");
    int status = TP_OK;
    for (int i = 0; i < r->num_headers && !status; i++) {
        if (!r->headers[i].name || !r->headers[i].name[0] || !r->headers[i].value)
            status = tp_fail(TP_ERR_ARG, "signing a request: header %d has no name or value", i);
        e[i].e.name = status ? NULL : lowercase(r->headers[i].name);
        e[i].e.value = status ? NULL : trimmed(r->headers[i].value);
        e[i].index = i;
        if (!status && (!e[i].e.name || !e[i].e.value)) status = tp_fail(TP_ERR_NOMEM, "out of memory signing a request");
    }
    if (!status) qsort(e, (size_t)r->num_headers, sizeof *e, compare_header_entries);
    for (int i = 0; i < r->num_headers && !status; i++) {
        int repeated = i > 0 && strcmp(e[i].e.name, e[i - 1].e.name) == 0;
        if (repeated) {
            buffer_put_text(headers, ",");
        } else {
            if (i > 0) buffer_put_text(headers, "\n"), buffer_put_text(signed_names, ";");
            buffer_put_text(headers, e[i].e.name);
            buffer_put_text(headers, ":");
            buffer_put_text(signed_names, e[i].e.name);
        }
        buffer_put_text(headers, e[i].e.value);
    }
    if (r->num_headers > 0) buffer_put_text(headers, "\n");
    for (int i = 0; i < r->num_headers; i++) free(e[i].e.name), free(e[i].e.value);
    free(e);
    return status;
}

static int check_request(const sigv4_request *r)
{
    if (!r->method || !r->path || r->path[0] != '/' || !r->payload_hash || !r->amz_date || strlen(r->amz_date) != 16 ||
        r->num_headers < 0 || r->num_query < 0)
        return tp_fail(TP_ERR_ARG, "signing a request: a method, a path from '/', a payload hash and a date "
                                   "YYYYMMDDTHHMMSSZ are needed");
    return TP_OK;
}

/* The canonical request and the signed header list. */
static int canonical(const sigv4_request *r, char **out, char **signed_out)
{
    TP_TRY(check_request(r));
    byte_buffer b = {0}, headers = {0}, names = {0};
    buffer_put_text(&b, r->method);
    buffer_put_text(&b, "\n");
    sigv4_uri_encode(&b, r->path, 1);
    buffer_put_text(&b, "\n");
    /* Query: encoded, sorted by name then value. */
    entry *q = calloc((size_t)r->num_query + 1, sizeof *q);
    int status = q ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory signing a request");
    for (int i = 0; i < r->num_query && !status; i++) {
        q[i].name = encoded(r->query[i].name ? r->query[i].name : "");
        q[i].value = encoded(r->query[i].value ? r->query[i].value : "");
        if (!q[i].name || !q[i].value) status = tp_fail(TP_ERR_NOMEM, "out of memory signing a request");
    }
    if (!status) qsort(q, (size_t)r->num_query, sizeof *q, compare_entries);
    for (int i = 0; i < r->num_query && !status; i++) {
        if (i) buffer_put_text(&b, "&");
        buffer_put_text(&b, q[i].name);
        buffer_put_text(&b, "=");
        buffer_put_text(&b, q[i].value);
    }
    free_entries(q, r->num_query);
    buffer_put_text(&b, "\n");
    if (!status) status = canonical_headers(r, &headers, &names);
    if (!status) {
        buffer_put_text(&b, headers.data ? headers.data : "");
        buffer_put_text(&b, "\n");
        buffer_put_text(&b, names.data ? names.data : "");
        buffer_put_text(&b, "\n");
        buffer_put_text(&b, r->payload_hash);
    }
    free(headers.data);
    if (status || headers.failed || names.failed) {
        free(b.data);
        free(names.data);
        return status ? status : tp_fail(TP_ERR_NOMEM, "out of memory signing a request");
    }
    status = finish(&b, out);
    if (status) {
        free(names.data);
        return status;
    }
    *signed_out = names.data ? names.data : strdup("");
    if (!*signed_out) {
        free(*out);
        return tp_fail(TP_ERR_NOMEM, "out of memory signing a request");
    }
    return TP_OK;
}

int sigv4_canonical_request(const sigv4_request *r, char **out)
{
    char *names = NULL;
    *out = NULL;
    TP_TRY(canonical(r, out, &names));
    free(names);
    return TP_OK;
}

/* A 32-byte digest as 64 lowercase hex digits. */
static void digest_hex(const unsigned char digest[32], char out[65])
{
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", digest[i]);
}

void sigv4_sha256_hex(const void *data, size_t n, char out[65])
{
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_Digest(data, n, digest, &length, EVP_sha256(), NULL);
    digest_hex(digest, out);
}

/* "DATE/REGION/SERVICE/aws4_request" into scope. */
static int credential_scope(const sigv4_key *k, const sigv4_request *r, char *scope, size_t size)
{
    if (!k->region || !k->service || !k->access_key || !k->secret_key)
        return tp_fail(TP_ERR_ARG, "signing a request: a key, a secret, a region and a service are needed");
    int n = snprintf(scope, size, "%.8s/%s/%s/aws4_request", r->amz_date, k->region, k->service);
    return n > 0 && (size_t)n < size ? TP_OK : tp_fail(TP_ERR_ARG, "signing a request: region or service too long");
}

/* The string to sign, the signed header list and the credential scope
 * (scope: SCOPE_SIZE bytes). */
enum { SCOPE_SIZE = 256 };
static int string_to_sign(const sigv4_key *k, const sigv4_request *r, char **out, char **signed_names, char *scope)
{
    char *creq = NULL, hash[65];
    TP_TRY(credential_scope(k, r, scope, SCOPE_SIZE));
    TP_TRY(canonical(r, &creq, signed_names));
    sigv4_sha256_hex(creq, strlen(creq), hash);
    free(creq);
    byte_buffer b = {0};
    buffer_put_text(&b, "AWS4-HMAC-SHA256\n");
    buffer_put_text(&b, r->amz_date);
    buffer_put_text(&b, "\n");
    buffer_put_text(&b, scope);
    buffer_put_text(&b, "\n");
    buffer_put_text(&b, hash);
    int status = finish(&b, out);
    if (status) free(*signed_names), *signed_names = NULL;
    return status;
}

int sigv4_string_to_sign(const sigv4_key *k, const sigv4_request *r, char **out)
{
    char *names = NULL, scope[SCOPE_SIZE];
    *out = NULL;
    TP_TRY(string_to_sign(k, r, out, &names, scope));
    free(names);
    return TP_OK;
}

static void hmac(const void *key, size_t key_size, const char *text, unsigned char out[32])
{
    unsigned int length = 32;
    HMAC(EVP_sha256(), key, (int)key_size, (const unsigned char *)text, strlen(text), out, &length);
}

int sigv4_authorization(const sigv4_key *k, const sigv4_request *r, char **out)
{
    char *sts = NULL, *names = NULL, scope[SCOPE_SIZE], date[9];
    *out = NULL;
    TP_TRY(string_to_sign(k, r, &sts, &names, scope));
    /* kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request") */
    size_t secret_size = strlen(k->secret_key) + 4;
    char *secret = malloc(secret_size + 1);
    if (!secret) {
        free(sts), free(names);
        return tp_fail(TP_ERR_NOMEM, "out of memory signing a request");
    }
    snprintf(secret, secret_size + 1, "AWS4%s", k->secret_key);
    snprintf(date, sizeof date, "%.8s", r->amz_date);
    unsigned char a[32], b[32];
    hmac(secret, secret_size, date, a);
    memset(secret, 0, secret_size); /* no copy of the secret outlives the call */
    free(secret);
    hmac(a, 32, k->region, b);
    hmac(b, 32, k->service, a);
    hmac(a, 32, "aws4_request", b);
    hmac(b, 32, sts, a);
    char signature[65];
    digest_hex(a, signature);
    byte_buffer t = {0};
    buffer_put_text(&t, "AWS4-HMAC-SHA256 Credential=");
    buffer_put_text(&t, k->access_key);
    buffer_put_text(&t, "/");
    buffer_put_text(&t, scope);
    buffer_put_text(&t, ", SignedHeaders=");
    buffer_put_text(&t, names);
    buffer_put_text(&t, ", Signature=");
    buffer_put_text(&t, signature);
    free(sts);
    free(names);
    return finish(&t, out);
}
