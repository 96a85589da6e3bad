/* http.h: HTTP requests for the object stores (webdav.c, s3.c, object.c),
 * through libcurl, with the retry policy in one place. libcurl is the store
 * library's alone (scripts/check-layers.py).
 *
 * Connections, DNS answers and TLS sessions are shared by every thread of
 * the process (a curl share handle), so the many threads of the reader and
 * the uploader reuse connections instead of opening one per request.
 *
 * A request is retried, after an exponential backoff with jitter, on what
 * is transient: a connection refused, reset or timed out, a transfer cut
 * short, HTTP 5xx and 429. Other answers are returned as they are; the
 * caller maps them to errors. The URL of a request never carries a secret
 * (object.c refuses user information in URLs), so errors name it. */
#ifndef TP_STORE_HTTP_H
#define TP_STORE_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "../common/buffer.h"

typedef struct {
    const char *method; /* "GET", "PUT", "HEAD", "DELETE", "POST", "PROPFIND", "MKCOL" */
    const char *url;
    const char *const *headers; /* "Name: value" lines, NULL-terminated; may be NULL */
    /* Called before every attempt (a signature carries the time): fills
     * extra header lines, NULL-terminated, into a buffer it owns. */
    int (*sign)(void *ctx, const char *const **headers_out);
    void *sign_ctx;

    /* The body sent: none, a memory buffer, or a region of a local file. */
    const void *body;
    size_t body_size;
    const char *body_file;
    int64_t body_offset, body_length;

    /* The body received: into dst (at most dst_size bytes; more is an
     * error), or appended to a growing buffer (at most body_max bytes). */
    void *dst;
    size_t dst_size;
    byte_buffer *body_out;
    size_t body_max;
    const char *range; /* "first-last", or NULL */
    /* A 2xx answer whose body (body_out) is an S3 <Error> document is that
     * error: S3 answers a CompleteMultipartUpload 200 before it does the
     * work, and a failure then comes in the body. It is retried as a 5xx
     * where its code is transient (http_error_code_transient). */
    int ok_may_carry_error;
    /* A request that makes something each time it is taken (S3's
     * CreateMultipartUpload): sent on a fresh connection, so that libcurl
     * never sends it again by itself (it does, without a word, when a
     * reused connection closes before any answer) and every sending is
     * an attempt counted in http_response.attempts. */
    int fresh_connection;
} http_request;

typedef struct {
    long code;            /* HTTP status of the last attempt */
    size_t received;      /* body bytes received into dst */
    int64_t content_length; /* -1 when the answer had none */
    char etag[128];       /* the ETag header, quotes kept; "" without one */
    /* The Content-Range header of a 206: bytes first..last of total (total
     * -1 when "*"); first -1 without one. A 416's names the total alone
     * (first and last -1). */
    int64_t range_first, range_last, range_total;
    char error_body[1024]; /* the start of the body of an answer other than 2xx */
    char bucket_region[64]; /* S3's x-amz-bucket-region header (the bucket's region); "" without one */
    /* S3's encryption of the object an answer names: its
     * x-amz-server-side-encryption ("AES256", "aws:kms", "aws:kms:dsse"),
     * or "SSE-C" where it names a customer's key
     * (x-amz-server-side-encryption-customer-algorithm); "" without either.
     * The ETag of an object encrypted with aws:kms or SSE-C is no MD5. */
    char encryption[64];
    int error_in_ok;        /* a 2xx carrying an <Error> (ok_may_carry_error), its start in error_body */
    int attempts;
    /* Of those, the attempts sent that got no whole answer (a connection
     * closed or timed out after the request may have gone): whether the
     * server did their work is not known. An attempt answered, a 5xx or a
     * throttling 503 too, is not one; nor one never sent (no connection). */
    int unanswered;
    int64_t server_time;    /* the answer's Date header, seconds since 1970 (the server's clock); 0 without one */
} http_response;

/* The transfer policy (environment, read once; docs/STORES.md):
 * TP_REMOTE_RETRIES attempts after the first (default 6), TP_REMOTE_TIMEOUT
 * seconds without progress before a transfer is given up (default 30), and
 * the window over which TP_REMOTE_MIN_SPEED bytes per second (default 1024;
 * 0: off) must move, so that a trickling server is given up too; every
 * attempt also has a deadline scaled by its size (2 x TP_REMOTE_TIMEOUT +
 * its bytes at the minimum speed),
 * TP_REMOTE_BACKOFF_MS the first backoff (default 200, doubled each time,
 * at most 10 s), TP_REMOTE_THREADS parallel GETs of one large read (default
 * 8, 1-256), TP_REMOTE_PART_MB the S3 multipart part size (default 64,
 * 5-5120: S3 takes parts of 5 MiB at least).
 *
 * A server asking its clients to slow down (HTTP 429, or S3's 503 SlowDown:
 * http_status_throttled) is not failing: such answers are retried with the
 * same backoff without counting against TP_REMOTE_RETRIES, so that many
 * readers over a store's request rate are paced by it instead of failing
 * once a few of them were refused seven times in a row (docs/SCALE.md).
 * TP_REMOTE_THROTTLE_SECONDS (default 600; 0: such answers count as
 * retries like any 5xx) bounds a throttled stretch of the whole process,
 * not of each request: it begins with the first throttled answer and ends
 * with the first answer that is not one (the store serves again), so that
 * a command whose requests follow one another waits the allowance once,
 * not once per request. While a stretch lasts, a notice says so
 * (store_set_notice); once it has outlasted the allowance every request
 * throttled fails, naming the setting. */
typedef struct {
    int retries;
    long throttle_seconds;
    long stall_seconds;
    long min_speed; /* bytes per second over a stall window; 0: no minimum */
    long backoff_ms;
    int read_threads;
    int64_t part_bytes;
} http_policy;
const http_policy *http_policy_get(void);

/* Performs the request, retrying what is transient. TP_OK when an answer
 * came (whatever its status: see response->code); TP_ERR_IO naming the URL
 * and libcurl's reason when none did after every retry. */
int http_perform(const http_request *request, http_response *response);

/* Whether a status is worth a retry (5xx, 429, 408). */
int http_status_transient(long code);

/* Whether an S3 error document (<Error><Code>...) names a failure worth a
 * retry: InternalError, ServiceUnavailable, SlowDown (what S3 sends as a
 * 5xx, and inside a 200 it answered before the failure). */
int http_error_code_transient(const char *body);

/* Whether an answer that came is worth a retry: its status
 * (http_status_transient), the error a 2xx carries
 * (http_error_code_transient), or S3's 400 BadDigest: a body that arrived
 * other than its Content-MD5 says, damaged on the way, and sent whole
 * again from its file. */
int http_answer_transient(const http_response *r);

/* Whether an answer to a request of `method` asks the client to slow
 * down: 429; a 503 whose S3 error code is SlowDown; or a 503 to a HEAD,
 * whose answer has no body to name a cause in (S3 answers a throttled HEAD
 * with a bare 503, and a 503 says "temporarily unavailable" by its
 * definition). */
int http_status_throttled(const char *method, const http_response *r);

/* Decodes %XX escapes of s in place (names in listings; encoding is
 * sigv4_uri_encode's). */
void http_decode(char *s);

#endif
