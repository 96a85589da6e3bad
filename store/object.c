/* object.c: what the object stores share (object.h): requests through a
 * protocol, the errors of answers, whole-object writes and deletes, and
 * files read in place.
 *
 * Reads are ranged GETs straight into the caller's buffer; a large read is
 * split into parts fetched in parallel, small ones go through a few windows
 * of the object. Every answer is checked against what was asked and
 * against the object's identity (its first answer's ETag). There are no
 * positioned writes, renames or locks in an object store: checkpoints are
 * written locally and uploaded whole (ckpt/upload.c); a reader needs no lock
 * because a remote checkpoint becomes visible only when its index, uploaded
 * last, is there. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../common/error.h"
#include "../common/parallel.h"
#include "../common/path.h"
#include "md5.h"
#include "object.h"
#include "xml.h"

#define PARALLEL_READ_MIN ((int64_t)16 << 20) /* reads at least this large are split */
#define READ_PART ((int64_t)8 << 20)          /* into parts of this size */

const object_protocol *object_protocol_of(const store_ops *s)
{
    return s->impl;
}

int object_call_ok(const store_ops *s, const object_call *c, http_response *r)
{
    TP_TRY(object_protocol_of(s)->send(c, r));
    if (r->code < 200 || r->code >= 300 || r->error_in_ok) return object_answer_error(c->http.method, c->path, r);
    return TP_OK;
}

/* ---------------------------------------------------------------- answers */

/* host[:port] of an http(s) URL, and where its path starts. */
int object_split_authority(const char *url, char *host, size_t host_size, const char **path_out)
{
    const char *start = strstr(url, "://") + 3, *end = start + strcspn(start, "/?#");
    if (tp_url_has_user_info(url))
        return tp_fail(TP_ERR_ARG, "credentials in URLs are refused (they would show in logs): give them "
                       "in the environment");
    if (end == start || (size_t)(end - start) >= host_size) return tp_fail(TP_ERR_ARG, "%s: no host in this URL", url);
    memcpy(host, start, (size_t)(end - start));
    host[end - start] = '\0';
    *path_out = end;
    return TP_OK;
}

/* The failure of an answer that is not a success: what it means for a
 * user, never a secret (an S3 error's Code and Message are the server's
 * words about the request). */
int object_answer_error(const char *method, const char *path, const http_response *r)
{
    char code[128] = "", message[256] = "";
    const char *body = r->error_body, *end = body + strlen(body), *text, *text_end;
    /* A Code or Message that cannot be read is left out of the message: the status says the failure. */
    if (xml_element(body, end, "Code", &text, &text_end) && xml_text(text, text_end, code, sizeof code)) code[0] = '\0';
    if (xml_element(body, end, "Message", &text, &text_end) && xml_text(text, text_end, message, sizeof message))
        message[0] = '\0';
    char detail[420] = "";
    if (code[0]) snprintf(detail, sizeof detail, " %s%s%s", code, message[0] ? ": " : "", message);
    if (r->error_in_ok) /* S3's status goes before the work it answers: the failure came in the body */
        return tp_fail(TP_ERR_IO, "%s %s: HTTP %ld carrying an error:%s (after %d attempt%s)", method, path, r->code,
                       detail, r->attempts, r->attempts == 1 ? "" : "s");
    if (r->code == 404)
        return tp_fail(TP_ERR_NOT_FOUND, "%s: no such object (HTTP 404%s)", path, detail);
    /* S3 names the bucket's region (x-amz-bucket-region) in its answers to
     * requests signed for, or sent to, another (a 400, to a HEAD without a
     * body; a 301 PermanentRedirect): the remedy said with it. Those codes
     * alone: some S3-compatible stores (MinIO with a region set) send the
     * header with every answer, a 503's too. */
    if ((r->code == 400 || r->code == 301) && r->bucket_region[0] && !strncmp(path, "s3://", 5)) {
        char used[160];
        object_s3_region(used, sizeof used);
        size_t name = strcspn(used, ",");
        if (strlen(r->bucket_region) != name || strncmp(used, r->bucket_region, name) != 0)
            return tp_fail(TP_ERR_IO, "%s %s: HTTP %ld%s: the bucket is in %s (S3's x-amz-bucket-region), these "
                           "requests are signed for %s: set AWS_REGION=%s", method, path, r->code, detail,
                           r->bucket_region, used, r->bucket_region);
    }
    if (r->code == 401 || r->code == 403)
        return tp_fail(TP_ERR_IO, "%s: access denied (HTTP %ld%s): check the credentials%s", path, r->code, detail,
                       !strncmp(path, "s3://", 5) ? " (AWS_ACCESS_KEY_ID and its secret key, or the profile "
                                                    "of the credentials file) and the bucket's permissions"
                                                  : " and the server's permissions");
    /* S3 answers a request signed for another region than the bucket's
     * (AWS_REGION wrong) 400, and to a HEAD with no body to say so: "HTTP
     * 400" alone named neither, where a 403 names the credentials. */
    if (r->code == 400 && !code[0] && !strncmp(path, "s3://", 5)) {
        char region[160];
        object_s3_region(region, sizeof region);
        return tp_fail(TP_ERR_IO, "%s %s: HTTP 400 with no reason given%s: from S3 this most often means a request "
                       "signed for another region than the bucket's (these are signed for %s; set AWS_REGION or "
                       "AWS_DEFAULT_REGION to the bucket's), or a bucket name S3 does not accept", method, path,
                       !strcmp(method, "HEAD") ? " (the answer to a HEAD has no body)" : "", region);
    }
    /* A transient answer is final only once the retries are spent: said
     * with the attempts made (it said "after retries" with
     * TP_REMOTE_RETRIES=0 too, one attempt). */
    char attempts[48] = "";
    if (http_status_transient(r->code))
        snprintf(attempts, sizeof attempts, " (after %d attempt%s)", r->attempts, r->attempts == 1 ? "" : "s");
    return tp_fail(TP_ERR_IO, "%s %s: HTTP %ld%s%s", method, path, r->code, detail, attempts);
}

/* ------------------------------------------------------------------ files */

/* Small reads (a small tensor, a piece's block checksums, an index) come
 * in many round trips that each cost far more than their bytes: they are
 * served from a few windows of the object fetched whole, so that the small
 * neighbours HDF5 laid out side by side arrive together. */
#define WINDOW_BYTES ((int64_t)256 << 10)
#define WINDOW_READ_MAX ((int64_t)64 << 10) /* reads at most this large go through the windows */
#define WINDOWS 4

typedef struct {
    uint8_t *data; /* NULL: empty */
    int64_t begin, length;
    uint64_t used; /* for replacing the least recently used */
} window;

struct store_file {
    const store_ops *storage;
    char path[TP_PATH_MAX];
    pthread_mutex_t lock; /* the windows and the ETag */
    char etag[128];       /* of the first answer: the object's identity while open ("" before) */
    int64_t expected_size; /* -1: not known (object_expect_size) */
    char expected_whose[64];
    window windows[WINDOWS];
    uint64_t clock;
};

int object_open(const store_ops *s, const char *path, store_open_mode mode, store_file **out)
{
    *out = NULL;
    if (mode != STORE_OPEN_READ)
        return tp_fail(TP_ERR_STATE, "%s: an object store takes whole objects, not writes in place: checkpoints "
                       "are written locally and uploaded", path);
    if (strlen(path) >= TP_PATH_MAX) return tp_fail(TP_ERR_ARG, "path too long: %s", path);
    /* No request here: a missing object fails the first read, naming it. */
    store_file *f = calloc(1, sizeof *f);
    if (!f) return tp_fail(TP_ERR_NOMEM, "out of memory opening %s", path);
    f->storage = s;
    f->expected_size = -1;
    strcpy(f->path, path);
    pthread_mutex_init(&f->lock, NULL);
    *out = f;
    return TP_OK;
}

/* Bytes [offset, offset + size) of an object into buf; with at_least > 0,
 * an object ending after offset + at_least is fine (*got says how much came).
 * Every answer is checked against what was asked (a 206's Content-Range)
 * and against the object's identity: the ETag of the file's first answer,
 * sent as If-Match with every later request and compared with every later
 * answer, so that bytes of two versions of an object are never mixed. */
static int read_range_upto(store_file *f, void *buf, size_t size, int64_t offset, size_t at_least, size_t *got);

static int read_range(store_file *f, void *buf, size_t size, int64_t offset)
{
    return read_range_upto(f, buf, size, offset, 0, NULL);
}

static int object_changed(const store_file *f, const char *was, const char *now)
{
    return tp_fail(TP_ERR_CHECKSUM, "%s changed while it was being read (ETag %s, now %s)", f->path, was,
                   now[0] ? now : "(none)");
}

static int read_range_upto(store_file *f, void *buf, size_t size, int64_t offset, size_t at_least, size_t *got)
{
    const char *path = f->path;
    char range[64], if_match[160] = "", etag[128];
    pthread_mutex_lock(&f->lock);
    snprintf(etag, sizeof etag, "%s", f->etag);
    pthread_mutex_unlock(&f->lock);
    if (etag[0]) snprintf(if_match, sizeof if_match, "If-Match: %s", etag);
    const char *headers[] = {if_match, NULL};
    snprintf(range, sizeof range, "%lld-%lld", (long long)offset, (long long)(offset + (int64_t)size - 1));
    object_call c = {.path = path,
        .http = {.method = "GET", .headers = etag[0] ? headers : NULL, .dst = buf, .dst_size = size, .range = range}};
    http_response r;
    TP_TRY(object_protocol_of(f->storage)->send(&c, &r));
    if (r.code == 412) return object_changed(f, etag, "another (HTTP 412 to If-Match)");
    /* The object's size, from the answer: a 206's Content-Range total, a
     * whole object's length, or the total alone that a 416's Content-Range
     * names (a server leaving the total out is asked by a HEAD). */
    if (f->expected_size >= 0 && (r.code == 206 || r.code == 200 || r.code == 416)) {
        int64_t total = r.code == 200 ? r.content_length : r.range_total;
        if (total < 0) {
            store_stat st;
            TP_TRY(f->storage->stat(f->storage, path, &st));
            total = st.exists ? st.size : 0;
        }
        if (total != f->expected_size)
            return tp_fail(TP_ERR_FORMAT, "%s: %lld bytes, %s %lld (truncated or replaced?)", path, (long long)total,
                           f->expected_whose, (long long)f->expected_size);
    }
    if (r.code == 416)
        return tp_fail(TP_ERR_FORMAT, "%s: object ends before offset %lld (%zu bytes missing; truncated?)", path,
                       (long long)offset, size);
    if (r.code != 206 && !(r.code == 200 && offset == 0 && r.received == size && r.content_length == (int64_t)size))
        return r.code < 200 || r.code >= 300
                   ? object_answer_error("GET", path, &r)
                   : tp_fail(TP_ERR_IO, "%s: the server answered a ranged GET with HTTP %ld (ranges not supported?)",
                             path, r.code);
    if (r.received != size && (at_least == 0 || r.received < at_least))
        return tp_fail(TP_ERR_FORMAT, "%s: object ends before offset %lld (%zu of %zu bytes came; truncated?)", path,
                       (long long)offset + (long long)r.received, r.received, at_least ? at_least : size);
    /* The bytes that came must be the ones asked for. */
    if (r.code == 206 && (r.range_first != offset || r.range_last != offset + (int64_t)r.received - 1))
        return tp_fail(TP_ERR_FORMAT, "%s: asked for bytes %lld-%lld, the server answered with %s %lld-%lld (%zu bytes)",
                       path, (long long)offset, (long long)(offset + (int64_t)size - 1),
                       r.range_first < 0 ? "no Content-Range, or a malformed one:" : "bytes",
                       (long long)r.range_first, (long long)r.range_last, r.received);
    pthread_mutex_lock(&f->lock);
    int status = TP_OK;
    if (!f->etag[0]) snprintf(f->etag, sizeof f->etag, "%s", r.etag);
    else if (strcmp(f->etag, r.etag) != 0) status = object_changed(f, f->etag, r.etag);
    pthread_mutex_unlock(&f->lock);
    if (status) return status;
    if (got) *got = r.received;
    return TP_OK;
}

/* A small read through the windows (see WINDOW_BYTES). */
static int read_windowed(store_file *f, void *buf, size_t size, int64_t offset)
{
    pthread_mutex_lock(&f->lock);
    for (int w = 0; w < WINDOWS; w++) {
        window *x = &f->windows[w];
        if (x->data && offset >= x->begin && offset + (int64_t)size <= x->begin + x->length) {
            memcpy(buf, x->data + (offset - x->begin), size);
            x->used = ++f->clock;
            pthread_mutex_unlock(&f->lock);
            return TP_OK;
        }
    }
    pthread_mutex_unlock(&f->lock);
    uint8_t *data = malloc((size_t)WINDOW_BYTES);
    if (!data) return tp_fail(TP_ERR_NOMEM, "out of memory reading %s", f->path);
    size_t got = 0;
    int status = read_range_upto(f, data, (size_t)WINDOW_BYTES, offset, size, &got);
    if (status) {
        free(data);
        return status;
    }
    memcpy(buf, data, size);
    pthread_mutex_lock(&f->lock);
    window *oldest = &f->windows[0];
    for (int w = 1; w < WINDOWS; w++)
        if (f->windows[w].used < oldest->used) oldest = &f->windows[w];
    free(oldest->data);
    *oldest = (window){data, offset, (int64_t)got, ++f->clock};
    pthread_mutex_unlock(&f->lock);
    return TP_OK;
}

typedef struct {
    store_file *file;
    char *buf;
    size_t size;
    int64_t offset;
} split_read;

static int read_part(void *ctx, int64_t part, int thread)
{
    (void)thread;
    const split_read *s = ctx;
    int64_t begin = part * READ_PART, end = begin + READ_PART < (int64_t)s->size ? begin + READ_PART : (int64_t)s->size;
    return read_range(s->file, s->buf + begin, (size_t)(end - begin), s->offset + begin);
}

int object_read_at(store_file *f, void *buf, size_t size, int64_t offset)
{
    if (size == 0) return TP_OK;
    if ((int64_t)size <= WINDOW_READ_MAX) return read_windowed(f, buf, size, offset);
    int threads = http_policy_get()->read_threads;
    if ((int64_t)size < PARALLEL_READ_MIN || threads == 1) return read_range(f, buf, size, offset);
    split_read s = {f, buf, size, offset};
    int64_t parts = ((int64_t)size + READ_PART - 1) / READ_PART;
    return parallel_for(parts, parts < threads ? (int)parts : threads, read_part, &s);
}

int object_expect_size(store_file *f, int64_t size, const char *whose)
{
    f->expected_size = size;
    snprintf(f->expected_whose, sizeof f->expected_whose, "%s", whose);
    return TP_OK;
}

int object_write_at(store_file *f, const void *buf, size_t size, int64_t offset)
{
    (void)buf, (void)size, (void)offset;
    return tp_fail(TP_ERR_STATE, "%s: an object store takes whole objects, not writes in place", f->path);
}

void object_read_ahead(store_file *f, int64_t offset, int64_t size)
{
    (void)f, (void)offset, (void)size;
}

int object_resize(store_file *f, int64_t size)
{
    (void)size;
    return object_write_at(f, NULL, 0, 0);
}

int object_sync(store_file *f)
{
    (void)f;
    return TP_OK; /* an object is durable once its PUT is answered */
}

void object_close(store_file *f)
{
    if (!f) return;
    for (int w = 0; w < WINDOWS; w++) free(f->windows[w].data);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

const char *object_path_of(const store_file *f)
{
    return f->path;
}

/* ------------------------------------------------------- names and writes */

int object_rename(const store_ops *s, const char *from, const char *to, store_rename_mode mode)
{
    (void)s, (void)mode;
    return tp_fail(TP_ERR_STATE, "cannot move %s to %s: an object store has no renames (checkpoints are "
                   "uploaded with their index last instead)", from, to);
}


int object_sync_dir(const store_ops *s, const char *path)
{
    (void)s, (void)path;
    return TP_OK;
}

int object_lock(const store_ops *s, const char *path, int flags, store_file **out)
{
    /* No locks in an object store: a reader needs none (a checkpoint is
     * visible whole or not at all), and writers publish by the index. */
    (void)flags;
    return object_open(s, path, STORE_OPEN_READ, out);
}

void object_version(store_file *f, char *out, size_t size)
{
    pthread_mutex_lock(&f->lock);
    snprintf(out, size, "%s", f->etag);
    pthread_mutex_unlock(&f->lock);
}

int object_pin(store_file *f, const char *version)
{
    if (strlen(version) >= sizeof f->etag) return tp_fail(TP_ERR_ARG, "%s: a version of %zu bytes", f->path, strlen(version));
    pthread_mutex_lock(&f->lock);
    int status = TP_OK;
    if (!f->etag[0]) snprintf(f->etag, sizeof f->etag, "%s", version);
    else if (strcmp(f->etag, version)) status = object_changed(f, version, f->etag);
    pthread_mutex_unlock(&f->lock);
    return status;
}

/* DELETE of url (errors name `what`); what is not there is fine. */
int object_delete_at(const store_ops *s, const char *url, const char *const *headers, const char *what)
{
    object_call c = {.path = url, .http = {.method = "DELETE", .headers = headers}};
    http_response r;
    TP_TRY(object_protocol_of(s)->send(&c, &r));
    return r.code == 404 || (r.code >= 200 && r.code < 300) ? TP_OK : object_answer_error("DELETE", what, &r);
}

int object_delete(const store_ops *s, const char *path)
{
    return object_delete_at(s, path, NULL, path);
}

/* One PUT of a whole object (c, its body set; md5: the body's MD5 where
 * the protocol's PUTs carry one, else NULL). S3 refuses a body that
 * arrived otherwise than its Content-MD5 says (400 BadDigest, sent again
 * from its bytes: http_answer_transient); single PUTs went without one, so
 * a body damaged on the way was kept, said "copied", and found damaged by
 * the next verify. The answer's ETag, where it is the MD5 of what the
 * store keeps (etag_is_content_md5), is compared: another one is refused
 * as damage on the way, should a store take the body unchecked. A PUT whose
 * answer was lost (a connection closed) is sent again by http.c: the same
 * bytes, so the same object and ETag, whether the first was taken or not. */
/* Whether an answer's ETag is the MD5 of the bytes kept, so that one other
 * than the body's is damage: an object the store does not say it encrypts
 * (S3's ETag of an SSE-KMS or SSE-C object is no MD5, and stores that say
 * SSE-S3, MinIO's among them, may keep another), and an ETag of an MD5's
 * form ("32 hex digits"): a store whose ETags are something else (a
 * SHA-1, a multipart "-N") is not refused for it; its Content-MD5, where it
 * checks one, and the block checksums read back still find damage. */
static int etag_is_content_md5(const http_response *r)
{
    size_t n = strlen(r->etag);
    if (r->encryption[0] || n != 2 * MD5_BYTES + 2 || r->etag[0] != '"' || r->etag[n - 1] != '"') return 0;
    for (size_t i = 1; i + 1 < n; i++)
        if (!isxdigit((unsigned char)r->etag[i])) return 0;
    return 1;
}

static int put_whole(const store_ops *s, object_call *c, int64_t size, const unsigned char *md5)
{
    char content_md5[40] = "Content-MD5: ", expected[2 * MD5_BYTES + 3] = "";
    const char *headers[] = {content_md5, NULL};
    if (md5) {
        md5_base64(md5, content_md5 + strlen(content_md5));
        md5_etag(md5, expected, sizeof expected);
        c->http.headers = headers;
    }
    http_response r;
    TP_TRY(object_call_ok(s, c, &r));
    if (md5 && etag_is_content_md5(&r) && strcasecmp(r.etag, expected) != 0)
        return tp_fail(TP_ERR_CHECKSUM, "PUT %s: answered HTTP %ld with ETag %s, where the %lld bytes sent have the "
                       "MD5 %s: the store keeps other bytes than were sent (damaged on the way, and its Content-MD5 "
                       "not checked?)", c->path, r.code, r.etag, (long long)size, expected);
    return TP_OK;
}

int object_put_data(const store_ops *s, const char *path, const void *data, size_t size)
{
    object_call c = {.path = path, .http = {.method = "PUT", .body = size ? data : "", .body_size = size}};
    unsigned char md5[MD5_BYTES];
    if (object_protocol_of(s)->put_md5) md5_bytes(data, size, md5);
    return put_whole(s, &c, (int64_t)size, object_protocol_of(s)->put_md5 ? md5 : NULL);
}

int object_put_file(const store_ops *s, const char *path, const char *local_path, int64_t offset, int64_t length)
{
    object_call c = {.path = path,
        .http = {.method = "PUT", .body_file = local_path, .body_offset = offset, .body_length = length}};
    if (length == 0) {
        c.http.body_file = NULL;
        c.http.body = "";
    }
    /* The MD5 from the bytes read before they are sent, as a part's (s3.c put_part). */
    unsigned char md5[MD5_BYTES];
    if (object_protocol_of(s)->put_md5) TP_TRY(md5_file_range(local_path, offset, length, md5));
    return put_whole(s, &c, length, object_protocol_of(s)->put_md5 ? md5 : NULL);
}
