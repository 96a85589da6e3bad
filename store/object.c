/* storage_remote.c: the store of object-store URLs.
 *
 *   http(s)://host[:port]/path   a server taking PUT, ranged GET, DELETE,
 *                                PROPFIND (listing) and MKCOL: WebDAV-style
 *   s3://bucket/key              S3 or an S3-compatible store, signed with
 *                                AWS Signature Version 4 (sigv4.c)
 *
 * S3 settings come from the environment as AWS's tools read them:
 * AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (a self-hosted store; path-style
 * addressing then, virtual-hosted on AWS itself; TP_S3_ADDRESSING=path or
 * virtual overrides), AWS_REGION or AWS_DEFAULT_REGION (us-east-1), the
 * credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * AWS_SESSION_TOKEN, or else from the credentials file
 * (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials, profile AWS_PROFILE
 * or "default"). Never from a command line, and never printed: URLs with
 * user information are refused, and errors name URLs and HTTP codes only.
 *
 * Reads are ranged GETs straight into the caller's buffer; a large read is
 * split into parts fetched in parallel. There are no positioned writes,
 * renames or locks in an object store: checkpoints are written locally and
 * uploaded whole (upload.c); a reader needs no lock because a remote
 * checkpoint becomes visible only when its index, uploaded last, is there. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/parallel.h"
#include "http.h"
#include "internal.h"
#include "remote.h"
#include "sigv4.h"

#define PARALLEL_READ_MIN ((int64_t)16 << 20) /* reads at least this large are split */
#define READ_PART ((int64_t)8 << 20)          /* into parts of this size */
#define LIST_MAX ((size_t)64 << 20)           /* bytes of one listing answer */
#define LIST_PAGES_MAX 100000                  /* pages of one listing: 10^8 keys at 1000 a page */

/* ------------------------------------------------------------ S3 settings */

typedef struct {
    int status;
    char error[512];
    char endpoint[512]; /* scheme://host[:port], no trailing slash; "" on AWS */
    char region[64];
    char access_key[256], secret_key[256];
    char *session_token;
    int path_style;
} s3_config;

static s3_config s3;
static pthread_once_t s3_once = PTHREAD_ONCE_INIT;

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    size_t k = 0;
    while (isspace((unsigned char)s[k])) k++;
    memmove(s, s + k, n - k + 1);
}

/* The keys of one profile of an AWS credentials file (INI). */
static void read_credentials_file(void)
{
    char path[CKPT_PATH_MAX];
    const char *file = env("AWS_SHARED_CREDENTIALS_FILE"), *home = env("HOME");
    if (file) snprintf(path, sizeof path, "%s", file);
    else if (home) snprintf(path, sizeof path, "%s/.aws/credentials", home);
    else return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
    char line[4096];
    int in_profile = 0;
    while (fgets(line, sizeof line, f)) {
        trim(line);
        if (line[0] == '[') {
            char *end = strchr(line, ']');
            if (end) *end = '\0';
            trim(line + 1);
            in_profile = !strcmp(line + 1, profile);
            continue;
        }
        char *eq = strchr(line, '=');
        if (!in_profile || !eq || line[0] == '#' || line[0] == ';') continue;
        *eq = '\0';
        char *key = line, *value = eq + 1;
        trim(key);
        trim(value);
        if (!strcmp(key, "aws_access_key_id")) snprintf(s3.access_key, sizeof s3.access_key, "%s", value);
        else if (!strcmp(key, "aws_secret_access_key")) snprintf(s3.secret_key, sizeof s3.secret_key, "%s", value);
        else if (!strcmp(key, "aws_session_token") && !s3.session_token) s3.session_token = strdup(value);
    }
    fclose(f);
}

static void s3_configure(void)
{
    const char *endpoint = env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
    const char *region = env("AWS_REGION") ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
    snprintf(s3.region, sizeof s3.region, "%s", region ? region : "us-east-1");
    if (endpoint) {
        snprintf(s3.endpoint, sizeof s3.endpoint, "%s", endpoint);
        size_t n = strlen(s3.endpoint);
        while (n && s3.endpoint[n - 1] == '/') s3.endpoint[--n] = '\0';
        if (strncmp(s3.endpoint, "http://", 7) && strncmp(s3.endpoint, "https://", 8)) {
            s3.status = TP_ERR_ARG;
            snprintf(s3.error, sizeof s3.error,
                     "the S3 endpoint (AWS_ENDPOINT_URL) must start with http:// or https://");
            return;
        }
    }
    const char *style = env("TP_S3_ADDRESSING");
    s3.path_style = style ? !strcmp(style, "path") : endpoint != NULL;
    const char *id = env("AWS_ACCESS_KEY_ID"), *secret = env("AWS_SECRET_ACCESS_KEY");
    if (id && secret) {
        snprintf(s3.access_key, sizeof s3.access_key, "%s", id);
        snprintf(s3.secret_key, sizeof s3.secret_key, "%s", secret);
        if (env("AWS_SESSION_TOKEN")) s3.session_token = strdup(env("AWS_SESSION_TOKEN"));
    } else {
        read_credentials_file();
    }
    if (!s3.access_key[0] || !s3.secret_key[0]) {
        s3.status = TP_ERR_ARG;
        snprintf(s3.error, sizeof s3.error,
                 "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give the profile "
                 "(AWS_PROFILE, default \"default\") in the credentials file (AWS_SHARED_CREDENTIALS_FILE, "
                 "default ~/.aws/credentials)");
    }
}

/* --------------------------------------------------------------- targets */

/* What one request goes to: the URL to send, and for S3 what is signed. */
typedef struct {
    int s3;
    char url[CKPT_PATH_MAX + 1024];
    char host[512];
    char path[CKPT_PATH_MAX + 128]; /* S3: the canonical path, decoded */
} target;

int remote_is_url(const char *path)
{
    return !strncmp(path, "http://", 7) || !strncmp(path, "https://", 8) || !strncmp(path, "s3://", 5);
}

/* host[:port] of an http(s) URL, and where its path starts. */
static int split_authority(const char *url, char *host, size_t host_size, const char **path_out)
{
    const char *start = strstr(url, "://") + 3, *end = start + strcspn(start, "/?#");
    if (memchr(start, '@', (size_t)(end - start)))
        return tp_fail(TP_ERR_ARG, "credentials in URLs are refused (they would show in logs): give them "
                       "in the environment");
    if (end == start || (size_t)(end - start) >= host_size) return tp_fail(TP_ERR_ARG, "%s: no host in this URL", url);
    memcpy(host, start, (size_t)(end - start));
    host[end - start] = '\0';
    *path_out = end;
    return TP_OK;
}

/* The request target of a path (a URL) and an optional query (decoded pairs). */
static int resolve(const char *path, const sigv4_pair *query, int num_query, target *t)
{
    memset(t, 0, sizeof *t);
    byte_buffer b = {0};
    if (strncmp(path, "s3://", 5) != 0) {
        const char *rest;
        TP_TRY(split_authority(path, t->host, sizeof t->host, &rest));
        if (strchr(rest, '?') || strchr(rest, '#'))
            return tp_fail(TP_ERR_ARG, "%s: a checkpoint URL takes no query or fragment", path);
        buffer_put_text(&b, path);
    } else {
        pthread_once(&s3_once, s3_configure);
        if (s3.status) return tp_fail(s3.status, "%s: %s", path, s3.error);
        t->s3 = 1;
        const char *bucket = path + 5, *slash = strchr(bucket, '/');
        size_t bucket_len = slash ? (size_t)(slash - bucket) : strlen(bucket);
        const char *key = slash ? slash + 1 : "";
        if (bucket_len == 0 || bucket_len > 63) return tp_fail(TP_ERR_ARG, "%s: no bucket name in this URL", path);
        if (s3.path_style) {
            const char *rest;
            TP_TRY(split_authority(s3.endpoint, t->host, sizeof t->host, &rest));
            snprintf(t->path, sizeof t->path, "%s/%.*s/%s", rest, (int)bucket_len, bucket, key);
            buffer_put(&b, s3.endpoint, (size_t)(rest - s3.endpoint));
        } else {
            const char *scheme = "https://";
            if (s3.endpoint[0]) {
                const char *rest;
                char base[256];
                TP_TRY(split_authority(s3.endpoint, base, sizeof base, &rest));
                snprintf(t->host, sizeof t->host, "%.*s.%s", (int)bucket_len, bucket, base);
                scheme = !strncmp(s3.endpoint, "http://", 7) ? "http://" : "https://";
            } else {
                snprintf(t->host, sizeof t->host, "%.*s.s3.%s.amazonaws.com", (int)bucket_len, bucket, s3.region);
            }
            snprintf(t->path, sizeof t->path, "/%s", key);
            buffer_put_text(&b, scheme);
            buffer_put_text(&b, t->host);
        }
        sigv4_uri_encode(&b, t->path, 1);
    }
    for (int i = 0; i < num_query; i++) {
        buffer_put_text(&b, i ? "&" : "?");
        sigv4_uri_encode(&b, query[i].name, 0);
        buffer_put_text(&b, "=");
        sigv4_uri_encode(&b, query[i].value, 0);
    }
    int status = b.failed ? tp_fail(TP_ERR_NOMEM, "out of memory")
                 : !b.data || b.size >= sizeof t->url ? tp_fail(TP_ERR_ARG, "%s: URL too long", path)
                                                      : TP_OK;
    if (!status) memcpy(t->url, b.data, b.size + 1);
    free(b.data);
    return status;
}

/* ------------------------------------------------------------- signatures */

#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

typedef struct {
    const target *t;
    const char *method;
    const sigv4_pair *query;
    int num_query;
    const char *payload_hash;
    char date_line[64], hash_line[96], *token_line, *auth_line;
    const char *lines[5];
} s3_signature;

static int sign_s3(void *ctx, const char *const **headers_out)
{
    s3_signature *g = ctx;
    char amz_date[17];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tm);
    sigv4_pair headers[4] = {{"host", g->t->host}, {"x-amz-content-sha256", g->payload_hash}, {"x-amz-date", amz_date},
                             {"x-amz-security-token", s3.session_token}};
    sigv4_key key = {s3.access_key, s3.secret_key, s3.session_token, s3.region, "s3"};
    sigv4_request request = {g->method, g->t->path, g->query, g->num_query, headers, s3.session_token ? 4 : 3,
                             g->payload_hash, amz_date};
    char *authorization = NULL;
    TP_TRY(sigv4_authorization(&key, &request, &authorization));
    free(g->auth_line);
    free(g->token_line);
    g->token_line = NULL;
    g->auth_line = malloc(strlen(authorization) + 32);
    if (g->auth_line) sprintf(g->auth_line, "Authorization: %s", authorization);
    free(authorization);
    if (s3.session_token && (g->token_line = malloc(strlen(s3.session_token) + 32)))
        sprintf(g->token_line, "x-amz-security-token: %s", s3.session_token);
    if (!g->auth_line || (s3.session_token && !g->token_line)) return tp_fail(TP_ERR_NOMEM, "out of memory");
    snprintf(g->date_line, sizeof g->date_line, "x-amz-date: %s", amz_date);
    snprintf(g->hash_line, sizeof g->hash_line, "x-amz-content-sha256: %s", g->payload_hash);
    int n = 0;
    g->lines[n++] = g->auth_line;
    g->lines[n++] = g->date_line;
    g->lines[n++] = g->hash_line;
    if (g->token_line) g->lines[n++] = g->token_line;
    g->lines[n] = NULL;
    *headers_out = g->lines;
    return TP_OK;
}

/* --------------------------------------------------------------- requests */

/* The first element <tag> (any namespace prefix) in [p, end): its text
 * between *text and *text_end; returns where the element ends, or NULL. */
static const char *xml_element(const char *p, const char *end, const char *tag, const char **text,
                               const char **text_end)
{
    size_t tag_len = strlen(tag);
    while (p && p < end && (p = memchr(p, '<', (size_t)(end - p))) != NULL) {
        const char *name = p + 1;
        p++;
        if (*name == '/' || *name == '?' || *name == '!') continue;
        const char *name_end = name + strcspn(name, " \t\r\n/>");
        const char *colon = memchr(name, ':', (size_t)(name_end - name));
        const char *local = colon ? colon + 1 : name;
        if ((size_t)(name_end - local) != tag_len || memcmp(local, tag, tag_len)) continue;
        const char *close = memchr(name_end, '>', (size_t)(end - name_end));
        if (!close) return NULL;
        if (close[-1] == '/') { /* <tag/> */
            *text = *text_end = close;
            return close + 1;
        }
        /* The matching end tag: </prefix:tag> with the same prefix. */
        char end_tag[128];
        snprintf(end_tag, sizeof end_tag, "</%.*s>", (int)(name_end - name), name);
        const char *found = close + 1;
        size_t end_len = strlen(end_tag);
        while (found && found < end) {
            found = memchr(found, '<', (size_t)(end - found));
            if (!found || (size_t)(end - found) < end_len) return NULL;
            if (!memcmp(found, end_tag, end_len)) break;
            found++;
        }
        *text = close + 1;
        *text_end = found;
        return found + end_len;
    }
    return NULL;
}

/* The text of an element, entities decoded, into out (truncated to fit). */
static void xml_text(const char *text, const char *text_end, char *out, size_t out_size)
{
    static const struct {
        const char *entity;
        char c;
    } entities[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    size_t n = 0;
    for (const char *c = text; c < text_end && n + 1 < out_size; c++) {
        char v = *c;
        for (size_t e = 0; v == '&' && e < sizeof entities / sizeof *entities; e++) {
            size_t len = strlen(entities[e].entity);
            if ((size_t)(text_end - c) >= len && !memcmp(c, entities[e].entity, len)) {
                v = entities[e].c;
                c += len - 1;
                break;
            }
        }
        out[n++] = v;
    }
    out[n] = '\0';
}

/* A listing answer is read with the small scanner above, which knows no
 * DTD: one holding a declaration (<!DOCTYPE, <!ENTITY: entity expansion),
 * nested deeper than any real listing, or without its root element is a
 * server's malformed answer, refused naming the URL rather than read as an
 * empty listing ("no such checkpoint"). */
#define LISTING_DEPTH_MAX 32

static int check_listing(const char *body, size_t size, const char *root, const char *url)
{
    const char *p = body, *end = body + size, *text, *text_end;
    int depth = 0;
    while ((p = memchr(p, '<', (size_t)(end - p))) != NULL) {
        p++;
        if (p < end && *p == '!' && !(end - p >= 3 && !memcmp(p, "!--", 3)))
            return tp_fail(TP_ERR_FORMAT, "%s: malformed listing from the server: it holds a declaration (<!...), "
                           "which a listing never needs", url);
        if (p < end && (*p == '?' || *p == '!')) continue;
        const char *close = memchr(p, '>', (size_t)(end - p));
        if (!close) break;
        if (*p == '/') depth--;
        else if (close[-1] != '/') depth++;
        if (depth > LISTING_DEPTH_MAX)
            return tp_fail(TP_ERR_FORMAT, "%s: malformed listing from the server: elements nested deeper than %d",
                           url, LISTING_DEPTH_MAX);
    }
    if (!xml_element(body, end, root, &text, &text_end))
        return tp_fail(TP_ERR_FORMAT, "%s: malformed listing from the server: no <%s> element", url, root);
    return TP_OK;
}

/* The failure of an answer that is not a success: what it means for a
 * user, never a secret (an S3 error's Code and Message are the server's
 * words about the request). */
static int answer_error(const char *method, const char *path, const http_response *r)
{
    char code[128] = "", message[256] = "";
    const char *body = r->error_body, *end = body + strlen(body), *text, *text_end;
    if (xml_element(body, end, "Code", &text, &text_end)) xml_text(text, text_end, code, sizeof code);
    if (xml_element(body, end, "Message", &text, &text_end)) xml_text(text, text_end, message, sizeof message);
    char detail[420] = "";
    if (code[0]) snprintf(detail, sizeof detail, " %s%s%s", code, message[0] ? ": " : "", message);
    if (r->code == 404)
        return tp_fail(TP_ERR_NOT_FOUND, "%s: no such object (HTTP 404%s)", path, detail);
    if (r->code == 401 || r->code == 403)
        return tp_fail(TP_ERR_IO, "%s: access denied (HTTP %ld%s): check the credentials%s", path, r->code, detail,
                       !strncmp(path, "s3://", 5) ? " (AWS_ACCESS_KEY_ID and its secret key, or the profile "
                                                    "of the credentials file) and the bucket's permissions"
                                                  : " and the server's permissions");
    return tp_fail(TP_ERR_IO, "%s %s: HTTP %ld%s%s", method, path, r->code, detail,
                   http_status_transient(r->code) ? " (after retries)" : "");
}

/* A request to the store: a URL as the store's users name it, an optional
 * query (decoded pairs), and the rest as http.c takes it (its url and
 * signature are filled in by call()). */
typedef struct {
    const char *path;
    const sigv4_pair *query;
    int num_query;
    http_request http;
} remote_call;

/* Sends a request to the store; TP_OK with the answer whatever its code. */
static int call(const remote_call *c, http_response *r)
{
    target t;
    TP_TRY(resolve(c->path, c->query, c->num_query, &t));
    http_request q = c->http;
    q.url = t.url;
    s3_signature signature = {0};
    char hash[65];
    if (t.s3) {
        signature.t = &t;
        signature.method = q.method;
        signature.query = c->query;
        signature.num_query = c->num_query;
        if (q.body_file) signature.payload_hash = "UNSIGNED-PAYLOAD";
        else if (q.body) {
            sigv4_sha256_hex(q.body, q.body_size, hash);
            signature.payload_hash = hash;
        } else
            signature.payload_hash = EMPTY_SHA256;
        q.sign = sign_s3;
        q.sign_ctx = &signature;
    }
    int status = http_perform(&q, r);
    free(signature.auth_line);
    free(signature.token_line);
    /* http.c's message names the URL sent; the store's own name is added
     * only where it differs (s3:// names an https:// URL). */
    if (status && strncmp(q.url, c->path, strlen(c->path)) != 0) return tp_fail_context(status, "%s", c->path);
    return status;
}

/* A request that must succeed (2xx). */
static int call_ok(const remote_call *c, http_response *r)
{
    TP_TRY(call(c, r));
    if (r->code < 200 || r->code >= 300) return answer_error(c->http.method, c->path, r);
    return TP_OK;
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

struct ckpt_file {
    const ckpt_storage *storage;
    char path[CKPT_PATH_MAX];
    pthread_mutex_t lock; /* the windows and the ETag */
    char etag[128];       /* of the first answer: the object's identity while open ("" before) */
    window windows[WINDOWS];
    uint64_t clock;
};

static int remote_open(const ckpt_storage *s, const char *path, ckpt_open_mode mode, ckpt_file **out)
{
    *out = NULL;
    if (mode != CKPT_OPEN_READ)
        return tp_fail(TP_ERR_STATE, "%s: an object store takes whole objects, not writes in place: checkpoints "
                       "are written locally and uploaded", path);
    if (strlen(path) >= CKPT_PATH_MAX) return tp_fail(TP_ERR_ARG, "path too long: %s", path);
    /* No request here: a missing object fails the first read, naming it. */
    ckpt_file *f = calloc(1, sizeof *f);
    if (!f) return tp_fail(TP_ERR_NOMEM, "out of memory opening %s", path);
    f->storage = s;
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
static int read_range_upto(ckpt_file *f, void *buf, size_t size, int64_t offset, size_t at_least, size_t *got);

static int read_range(ckpt_file *f, void *buf, size_t size, int64_t offset)
{
    return read_range_upto(f, buf, size, offset, 0, NULL);
}

static int object_changed(const ckpt_file *f, const char *was, const char *now)
{
    return tp_fail(TP_ERR_CHECKSUM, "%s changed while it was being read (ETag %s, now %s)", f->path, was,
                   now[0] ? now : "(none)");
}

static int read_range_upto(ckpt_file *f, void *buf, size_t size, int64_t offset, size_t at_least, size_t *got)
{
    const char *path = f->path;
    char range[64], if_match[160] = "", etag[128];
    pthread_mutex_lock(&f->lock);
    snprintf(etag, sizeof etag, "%s", f->etag);
    pthread_mutex_unlock(&f->lock);
    if (etag[0]) snprintf(if_match, sizeof if_match, "If-Match: %s", etag);
    const char *headers[] = {if_match, NULL};
    snprintf(range, sizeof range, "%lld-%lld", (long long)offset, (long long)(offset + (int64_t)size - 1));
    remote_call c = {.path = path,
        .http = {.method = "GET", .headers = etag[0] ? headers : NULL, .dst = buf, .dst_size = size, .range = range}};
    http_response r;
    TP_TRY(call(&c, &r));
    if (r.code == 412) return object_changed(f, etag, "another (HTTP 412 to If-Match)");
    if (r.code == 416)
        return tp_fail(TP_ERR_FORMAT, "%s: object ends before offset %lld (%zu bytes missing; truncated?)", path,
                       (long long)offset, size);
    if (r.code != 206 && !(r.code == 200 && offset == 0 && r.received == size && r.content_length == (int64_t)size))
        return r.code < 200 || r.code >= 300
                   ? answer_error("GET", path, &r)
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
static int read_windowed(ckpt_file *f, void *buf, size_t size, int64_t offset)
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
    ckpt_file *file;
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

static int remote_read_at(ckpt_file *f, void *buf, size_t size, int64_t offset)
{
    if (size == 0) return TP_OK;
    if ((int64_t)size <= WINDOW_READ_MAX) return read_windowed(f, buf, size, offset);
    int threads = http_policy_get()->read_threads;
    if ((int64_t)size < PARALLEL_READ_MIN || threads == 1) return read_range(f, buf, size, offset);
    split_read s = {f, buf, size, offset};
    int64_t parts = ((int64_t)size + READ_PART - 1) / READ_PART;
    return parallel_for(parts, parts < threads ? (int)parts : threads, read_part, &s);
}

static int read_only(ckpt_file *f, const void *buf, size_t size, int64_t offset)
{
    (void)buf, (void)size, (void)offset;
    return tp_fail(TP_ERR_STATE, "%s: an object store takes whole objects, not writes in place", f->path);
}

static void remote_read_ahead(ckpt_file *f, int64_t offset, int64_t size)
{
    (void)f, (void)offset, (void)size;
}

static int remote_resize(ckpt_file *f, int64_t size)
{
    (void)size;
    return read_only(f, NULL, 0, 0);
}

static int remote_sync(ckpt_file *f)
{
    (void)f;
    return TP_OK; /* an object is durable once its PUT is answered */
}

static void remote_close(ckpt_file *f)
{
    if (!f) return;
    for (int w = 0; w < WINDOWS; w++) free(f->windows[w].data);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

static const char *remote_path_of(const ckpt_file *f)
{
    return f->path;
}

/* ------------------------------------------------------- names: S3 lists */

typedef struct {
    int (*visit)(void *ctx, const char *name);
    void *ctx;
    int delimited; /* names one level down (with "/"), or every key below */
    size_t prefix_len;
    int found;
} list_visit;

/* Lists keys below an S3 prefix ("key/"), page by page. */
static int s3_list(const char *dir_url, int delimited, int max_keys, list_visit *v)
{
    /* s3://bucket/dir -> bucket URL s3://bucket, prefix "dir/" */
    const char *bucket = dir_url + 5, *slash = strchr(bucket, '/');
    char bucket_url[512], prefix[CKPT_PATH_MAX], token[1024] = "", max[16];
    snprintf(bucket_url, sizeof bucket_url, "s3://%.*s", (int)(slash ? slash - bucket : (long)strlen(bucket)), bucket);
    snprintf(prefix, sizeof prefix, "%s", slash ? slash + 1 : "");
    size_t n = strlen(prefix);
    while (n && prefix[n - 1] == '/') prefix[--n] = '\0';
    if (n) strcat(prefix, "/");
    snprintf(max, sizeof max, "%d", max_keys);
    v->prefix_len = strlen(prefix);
    int status = TP_OK;
    /* A server that keeps answering "truncated" with the token it was given
     * (or any it gave before) would be listed for ever; so would one that
     * never stops. */
    char seen[4][1024] = {"", "", "", ""};
    for (int64_t page = 0;; page++) {
        if (page >= LIST_PAGES_MAX)
            return tp_fail(TP_ERR_FORMAT, "%s: the listing did not end after %d pages of %d keys", dir_url,
                           LIST_PAGES_MAX, max_keys > 0 ? max_keys : 1000);
        sigv4_pair query[5] = {{"list-type", "2"}, {"prefix", prefix}};
        int nq = 2;
        if (delimited) query[nq++] = (sigv4_pair){"delimiter", "/"};
        if (max_keys > 0) query[nq++] = (sigv4_pair){"max-keys", max};
        if (token[0]) query[nq++] = (sigv4_pair){"continuation-token", token};
        byte_buffer body = {0};
        remote_call c = {.path = bucket_url, .query = query, .num_query = nq,
            .http = {.method = "GET", .body_out = &body, .body_max = LIST_MAX}};
        http_response r;
        status = call_ok(&c, &r);
        if (!status) status = check_listing(body.data ? body.data : "", body.size, "ListBucketResult", dir_url);
        const char *p = body.data ? body.data : "", *end = p + body.size, *text, *text_end, *next;
        char name[CKPT_PATH_MAX];
        /* Keys of objects, then prefixes one level down ("step_1/"). */
        for (const char *q = p; !status && (next = xml_element(q, end, "Contents", &text, &text_end)); q = next) {
            const char *key, *key_end;
            if (!xml_element(text, text_end, "Key", &key, &key_end)) continue;
            xml_text(key, key_end, name, sizeof name);
            v->found = 1;
            if (v->visit && strlen(name) > v->prefix_len) status = v->visit(v->ctx, name + v->prefix_len);
        }
        for (const char *q = p; !status && (next = xml_element(q, end, "CommonPrefixes", &text, &text_end)); q = next) {
            const char *key, *key_end;
            if (!xml_element(text, text_end, "Prefix", &key, &key_end)) continue;
            xml_text(key, key_end, name, sizeof name);
            size_t len = strlen(name);
            if (len && name[len - 1] == '/') name[--len] = '\0';
            v->found = 1;
            if (v->visit && len > v->prefix_len) status = v->visit(v->ctx, name + v->prefix_len);
        }
        char truncated[16] = "";
        if (!status && xml_element(p, end, "IsTruncated", &text, &text_end))
            xml_text(text, text_end, truncated, sizeof truncated);
        token[0] = '\0';
        if (!status && !strcmp(truncated, "true") && xml_element(p, end, "NextContinuationToken", &text, &text_end))
            xml_text(text, text_end, token, sizeof token);
        /* Truncated without a way on: what was listed is not all there is. */
        if (!status && !strcmp(truncated, "true") && !token[0] && !(max_keys > 0 && v->found))
            status = tp_fail(TP_ERR_FORMAT, "%s: the server's listing is truncated (page %lld) without a "
                             "continuation token: the rest cannot be listed", dir_url, (long long)page + 1);
        for (int k = 0; !status && token[0] && k < 4; k++)
            if (!strcmp(seen[k], token))
                status = tp_fail(TP_ERR_FORMAT, "%s: the server's listing repeats a continuation token (page %lld): "
                                 "it would never end", dir_url, (long long)page + 1);
        memmove(seen[1], seen[0], sizeof seen - sizeof seen[0]);
        snprintf(seen[0], sizeof seen[0], "%s", token);
        free(body.data);
        if (status || !token[0] || (max_keys > 0 && v->found)) return status;
    }
}

/* ---------------------------------------------------- names: WebDAV lists */

typedef struct {
    int exists, is_dir;
    int64_t size;
} dav_entry;

/* PROPFIND of a path (Depth 0: itself; 1: and its entries, visited by name). */
static int dav_propfind(const char *path, int depth, dav_entry *self, list_visit *v)
{
    char url[CKPT_PATH_MAX + 2];
    const char *depth_header = depth ? "Depth: 1" : "Depth: 0";
    const char *headers[] = {depth_header, "Content-Type: application/xml", NULL};
    static const char body[] = "<?xml version=\"1.0\" encoding=\"utf-8\"?><D:propfind xmlns:D=\"DAV:\"><D:prop>"
                               "<D:resourcetype/><D:getcontentlength/></D:prop></D:propfind>";
    snprintf(url, sizeof url, "%s", path);
    byte_buffer answer = {0};
    http_response r;
    memset(self, 0, sizeof *self);
    int status = TP_OK;
    for (int tries = 0; tries < 2; tries++) {
        remote_call c = {.path = url,
            .http = {.method = "PROPFIND", .headers = headers, .body = body, .body_size = sizeof body - 1,
                     .body_out = &answer, .body_max = LIST_MAX}};
        status = call(&c, &r);
        /* A directory named without its slash may be redirected to it. */
        if (!status && (r.code == 301 || r.code == 302 || r.code == 307 || r.code == 308) && tries == 0 &&
            url[strlen(url) - 1] != '/') {
            strcat(url, "/");
            continue;
        }
        break;
    }
    if (!status && r.code == 404) {
        free(answer.data);
        return TP_OK;
    }
    if (!status && r.code != 207)
        status = r.code >= 200 && r.code < 300
                     ? tp_fail(TP_ERR_IO, "%s: PROPFIND answered HTTP %ld, not 207 (a WebDAV server is needed)", path,
                               r.code)
                     : answer_error("PROPFIND", path, &r);
    /* The request's own path, to tell itself from its entries. */
    char host[512], own[CKPT_PATH_MAX];
    const char *own_path = NULL;
    if (!status) status = split_authority(path, host, sizeof host, &own_path);
    if (!status) {
        snprintf(own, sizeof own, "%s", own_path);
        http_decode(own);
        size_t n = strlen(own);
        while (n && own[n - 1] == '/') own[--n] = '\0';
    }
    if (!status) status = check_listing(answer.data ? answer.data : "", answer.size, "multistatus", path);
    const char *p = answer.data ? answer.data : "", *end = p + answer.size, *text, *text_end, *next;
    for (const char *q = p; !status && (next = xml_element(q, end, "response", &text, &text_end)); q = next) {
        const char *h, *h_end, *x, *x_end;
        if (!xml_element(text, text_end, "href", &h, &h_end)) continue;
        char href[CKPT_PATH_MAX];
        xml_text(h, h_end, href, sizeof href);
        char *href_path = href;
        if (strstr(href, "://")) { /* an absolute URL: its path */
            char *s = strstr(href, "://") + 3;
            href_path = s + strcspn(s, "/");
        }
        http_decode(href_path);
        size_t n = strlen(href_path);
        int slash = n && href_path[n - 1] == '/';
        while (n && href_path[n - 1] == '/') href_path[--n] = '\0';
        int is_dir = slash || (xml_element(text, text_end, "collection", &x, &x_end) != NULL);
        int64_t size = 0;
        if (xml_element(text, text_end, "getcontentlength", &x, &x_end)) {
            char number[32];
            xml_text(x, x_end, number, sizeof number);
            size = strtoll(number, NULL, 10);
        }
        if (!strcmp(href_path, own)) {
            *self = (dav_entry){1, is_dir, size};
            continue;
        }
        const char *name = strrchr(href_path, '/');
        name = name ? name + 1 : href_path;
        if (v && v->visit && *name) status = v->visit(v->ctx, name);
    }
    free(answer.data);
    return status;
}

/* ---------------------------------------------------------------- names */

static int remote_stat(const ckpt_storage *s, const char *path, ckpt_stat *out)
{
    (void)s;
    memset(out, 0, sizeof *out);
    if (strncmp(path, "s3://", 5) != 0) {
        dav_entry e;
        TP_TRY(dav_propfind(path, 0, &e, NULL));
        *out = (ckpt_stat){e.exists, e.is_dir, e.size};
        return TP_OK;
    }
    const char *key = strchr(path + 5, '/');
    if (!key || !key[1]) { /* the bucket itself */
        out->exists = out->is_dir = 1;
        return TP_OK;
    }
    remote_call c = {.path = path, .http = {.method = "HEAD"}};
    http_response r;
    TP_TRY(call(&c, &r));
    if (r.code >= 200 && r.code < 300) {
        *out = (ckpt_stat){1, 0, r.content_length >= 0 ? r.content_length : 0};
        return TP_OK;
    }
    if (r.code != 404) return answer_error("HEAD", path, &r);
    list_visit v = {0};
    TP_TRY(s3_list(path, 1, 1, &v));
    out->exists = out->is_dir = v.found;
    return TP_OK;
}

static int remote_list(const ckpt_storage *s, const char *dir, int (*visit)(void *ctx, const char *name), void *ctx)
{
    (void)s;
    list_visit v = {.visit = visit, .ctx = ctx, .delimited = 1};
    if (!strncmp(dir, "s3://", 5)) {
        TP_TRY(s3_list(dir, 1, 0, &v));
        return v.found ? TP_OK : tp_fail(TP_ERR_NOT_FOUND, "%s: cannot list: nothing there", dir);
    }
    char url[CKPT_PATH_MAX + 2];
    snprintf(url, sizeof url, "%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/");
    dav_entry self;
    TP_TRY(dav_propfind(url, 1, &self, &v));
    return self.exists ? TP_OK : tp_fail(TP_ERR_NOT_FOUND, "%s: cannot list: no such directory", dir);
}

static int remote_make_dir(const ckpt_storage *s, const char *path)
{
    (void)s;
    if (!strncmp(path, "s3://", 5)) return TP_OK; /* prefixes exist by their keys */
    char url[CKPT_PATH_MAX + 2];
    snprintf(url, sizeof url, "%s/", path);
    remote_call c = {.path = url, .http = {.method = "MKCOL"}};
    http_response r;
    TP_TRY(call(&c, &r));
    if (r.code == 405) return tp_fail(TP_ERR_EXISTS, "%s: cannot create: it exists", path);
    return r.code >= 200 && r.code < 300 ? TP_OK : answer_error("MKCOL", path, &r);
}

static int remote_rename(const ckpt_storage *s, const char *from, const char *to, ckpt_rename_mode mode)
{
    (void)s, (void)mode;
    return tp_fail(TP_ERR_STATE, "cannot move %s to %s: an object store has no renames (checkpoints are "
                   "uploaded with their index last instead)", from, to);
}

/* DELETE of url (errors name `what`); what is not there is fine. */
static int delete_at(const char *url, const char *const *headers, const char *what)
{
    remote_call c = {.path = url, .http = {.method = "DELETE", .headers = headers}};
    http_response r;
    TP_TRY(call(&c, &r));
    return r.code == 404 || (r.code >= 200 && r.code < 300) ? TP_OK : answer_error("DELETE", what, &r);
}

int remote_delete(const char *url)
{
    return delete_at(url, NULL, url);
}

static int delete_key(void *dir, const char *name)
{
    char url[CKPT_PATH_MAX];
    TP_TRY(tp_path_join(url, dir, name));
    return remote_delete(url);
}

static int remote_remove_tree(const ckpt_storage *s, const char *path)
{
    ckpt_stat st;
    TP_TRY(remote_stat(s, path, &st));
    if (!st.exists) return TP_OK;
    if (!st.is_dir) return remote_delete(path);
    if (!strncmp(path, "s3://", 5)) {
        /* Every key below, deleted as the listing pages through them (a
         * continuation token resumes after the last key returned, so keys
         * already deleted do not shift the pages). */
        list_visit v = {.visit = delete_key, .ctx = (void *)path};
        return s3_list(path, 0, 0, &v);
    }
    char url[CKPT_PATH_MAX + 2];
    snprintf(url, sizeof url, "%s/", path);
    const char *headers[] = {"Depth: infinity", NULL};
    return delete_at(url, headers, path);
}

static int remote_sync_dir(const ckpt_storage *s, const char *path)
{
    (void)s, (void)path;
    return TP_OK;
}

static int remote_lock(const ckpt_storage *s, const char *path, int flags, ckpt_file **out)
{
    /* No locks in an object store: a reader needs none (a checkpoint is
     * visible whole or not at all), and writers publish by the index. */
    (void)flags;
    return remote_open(s, path, CKPT_OPEN_READ, out);
}

static const ckpt_storage remote_storage = {.name = "remote",
                                            .local_paths = 0,
                                            .open = remote_open,
                                            .read_at = remote_read_at,
                                            .write_at = read_only,
                                            .read_ahead = remote_read_ahead,
                                            .resize = remote_resize,
                                            .sync = remote_sync,
                                            .close = remote_close,
                                            .path_of = remote_path_of,
                                            .stat = remote_stat,
                                            .list = remote_list,
                                            .make_dir = remote_make_dir,
                                            .rename = remote_rename,
                                            .remove_tree = remote_remove_tree,
                                            .sync_dir = remote_sync_dir,
                                            .lock = remote_lock,
                                            .impl = NULL};

const ckpt_storage *ckpt_storage_remote(void)
{
    return &remote_storage;
}

/* ----------------------------------------------------------------- writes */

int remote_put_data(const char *url, const void *data, size_t size)
{
    remote_call c = {.path = url, .http = {.method = "PUT", .body = size ? data : "", .body_size = size}};
    http_response r;
    return call_ok(&c, &r);
}

typedef struct {
    const char *url, *local;
    int64_t offset, length, part;
    const char *upload_id;
    char (*etags)[128];
} multipart;

static int put_part(void *ctx, int64_t k, int thread)
{
    (void)thread;
    multipart *m = ctx;
    char number[24];
    snprintf(number, sizeof number, "%lld", (long long)k + 1);
    sigv4_pair query[2] = {{"partNumber", number}, {"uploadId", m->upload_id}};
    int64_t begin = k * m->part, length = begin + m->part < m->length ? m->part : m->length - begin;
    remote_call c = {.path = m->url, .query = query, .num_query = 2,
        .http = {.method = "PUT", .body_file = m->local, .body_offset = m->offset + begin, .body_length = length}};
    http_response r;
    TP_TRY(call_ok(&c, &r));
    if (!r.etag[0]) return tp_fail(TP_ERR_IO, "%s: part %lld uploaded without an ETag", m->url, (long long)k + 1);
    memcpy(m->etags[k], r.etag, sizeof r.etag);
    return TP_OK;
}

/* S3 multipart upload: create, parts in parallel, complete (or abort). */
static int put_multipart(const char *url, const char *local, int64_t offset, int64_t length, int64_t part,
                         int threads)
{
    sigv4_pair create_query[1] = {{"uploads", ""}};
    byte_buffer answer = {0};
    remote_call create = {.path = url, .query = create_query, .num_query = 1,
        .http = {.method = "POST", .body_out = &answer, .body_max = 1 << 20}};
    http_response r;
    int status = call_ok(&create, &r);
    char upload_id[1024] = "";
    const char *text, *text_end;
    if (!status && answer.data && xml_element(answer.data, answer.data + answer.size, "UploadId", &text, &text_end))
        xml_text(text, text_end, upload_id, sizeof upload_id);
    free(answer.data);
    answer = (byte_buffer){0};
    if (!status && !upload_id[0]) status = tp_fail(TP_ERR_IO, "%s: the store started no multipart upload", url);
    if (status) return status;
    int64_t parts = (length + part - 1) / part;
    multipart m = {url, local, offset, length, part, upload_id, calloc((size_t)parts, sizeof *m.etags)};
    if (!m.etags) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) status = parallel_for(parts, threads < parts ? threads : (int)parts, put_part, &m);
    byte_buffer xml = {0};
    buffer_put_text(&xml, "<CompleteMultipartUpload>");
    for (int64_t k = 0; !status && k < parts; k++) {
        char line[256];
        snprintf(line, sizeof line, "<Part><PartNumber>%lld</PartNumber><ETag>%s</ETag></Part>", (long long)k + 1,
                 m.etags[k]);
        buffer_put_text(&xml, line);
    }
    buffer_put_text(&xml, "</CompleteMultipartUpload>");
    if (!status && xml.failed) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    sigv4_pair id_query[1] = {{"uploadId", upload_id}};
    if (!status) {
        remote_call complete = {.path = url, .query = id_query, .num_query = 1,
            .http = {.method = "POST", .body = xml.data, .body_size = xml.size, .body_out = &answer,
                     .body_max = 1 << 20}};
        status = call_ok(&complete, &r);
        /* S3 may answer 200 and report a failure in the body. */
        if (!status && answer.data && strstr(answer.data, "<Error>")) {
            snprintf(r.error_body, sizeof r.error_body, "%s", answer.data);
            r.code = 500;
            status = answer_error("POST", url, &r);
        }
        free(answer.data);
    }
    if (status) { /* nothing half-done stays billed in the bucket */
        remote_call abort_upload = {.path = url, .query = id_query, .num_query = 1, .http = {.method = "DELETE"}};
        http_response ignored;
        call(&abort_upload, &ignored);
    }
    free(xml.data);
    free(m.etags);
    return status;
}

int remote_put_file(const char *url, const char *local_path, int64_t offset, int64_t length, int threads)
{
    int64_t part = http_policy_get()->part_bytes;
    if (!strncmp(url, "s3://", 5) && length > part)
        return put_multipart(url, local_path, offset, length, part, threads);
    remote_call c = {.path = url,
        .http = {.method = "PUT", .body_file = local_path, .body_offset = offset, .body_length = length}};
    if (length == 0) {
        c.http.body_file = NULL;
        c.http.body = "";
    }
    http_response r;
    return call_ok(&c, &r);
}
