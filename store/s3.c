/* s3.c: the store of s3://bucket/key URLs: S3 or an S3-compatible store,
 * requests signed with AWS Signature Version 4 (sigv4.c). Files are read
 * through object.c; names are S3's listings (ListObjectsV2, page by page);
 * large files go up as multipart uploads, their parts in parallel.
 *
 * Settings come from the environment as AWS's tools read them:
 * AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (a self-hosted store; path-style
 * addressing then, virtual-hosted on AWS itself; TP_S3_ADDRESSING=path or
 * virtual overrides), AWS_REGION or AWS_DEFAULT_REGION (us-east-1), the
 * credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * AWS_SESSION_TOKEN, or else from the credentials file
 * (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials, profile AWS_PROFILE
 * or "default"). Never from a command line, and never printed: URLs with
 * user information are refused, and errors name URLs and HTTP codes only. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "../common/buffer.h"
#include "../common/clock.h"
#include "../common/error.h"
#include "../common/parallel.h"
#include "../common/path.h"
#include "md5.h"
#include "object.h"
#include "sigv4.h"
#include "xml.h"

#define LIST_PAGES_MAX 100000 /* pages of one listing: 10^8 keys at 1000 a page */
#define UPLOAD_PAGES_MAX 100 /* pages of a key's multipart uploads under way read to find orphans: 10^5 at 1000 a page */

/* ------------------------------------------------------------ S3 settings */

typedef struct {
    int status;
    char error[512];
    char endpoint[512]; /* scheme://host[:port], no trailing slash; "" on AWS */
    char region[64];
    const char *region_from; /* where region came from, for errors: "from AWS_REGION", ... */
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
    char path[TP_PATH_MAX];
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
    s3.region_from = env("AWS_REGION")   ? "from AWS_REGION"
                     : region             ? "from AWS_DEFAULT_REGION"
                                          : "the default: neither AWS_REGION nor AWS_DEFAULT_REGION is set";
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

/* What one request goes to: the URL to send, the host and the canonical
 * path (decoded) that are signed. */
typedef struct {
    char url[TP_PATH_MAX + 1024];
    char host[512];
    char path[TP_PATH_MAX + 128];
} target;

void object_s3_region(char *out, size_t size)
{
    pthread_once(&s3_once, s3_configure);
    snprintf(out, size, "%s, %s", s3.region, s3.region_from);
}

/* The request target of an s3:// URL and an optional query (decoded pairs). */
static int resolve(const char *path, const sigv4_pair *query, int num_query, target *t)
{
    memset(t, 0, sizeof *t);
    byte_buffer b = {0};
    pthread_once(&s3_once, s3_configure);
    if (s3.status) return tp_fail(s3.status, "%s: %s", path, s3.error);
    /* The key of the canonical URL: "run//x" is "run/x" (tp_path_canonical). */
    char canonical[TP_PATH_MAX];
    if (tp_path_canonical(path, canonical, sizeof canonical)) return tp_fail(TP_ERR_ARG, "%s: URL too long", path);
    const char *bucket = canonical + 5, *slash = strchr(bucket, '/');
    size_t bucket_len = slash ? (size_t)(slash - bucket) : strlen(bucket);
    const char *key = slash ? slash + 1 : "";
    if (bucket_len == 0 || bucket_len > 63) return tp_fail(TP_ERR_ARG, "%s: no bucket name in this URL", path);
    /* s3://KEY:SECRET@bucket (Hadoop's s3a form) was taken as a bucket of
     * that name, the secret sent in the request's path: store_for refuses
     * it first; a bucket holds no other characters either. */
    for (size_t i = 0; i < bucket_len; i++)
        if (!(islower((unsigned char)bucket[i]) || isdigit((unsigned char)bucket[i]) || bucket[i] == '.' ||
              bucket[i] == '-'))
            return tp_fail(TP_ERR_ARG, "%s: '%.*s' is not a bucket name (lower-case letters, digits, '.' and '-')",
                           path, (int)bucket_len, bucket);
    if (s3.path_style) {
        const char *rest;
        TP_TRY(object_split_authority(s3.endpoint, t->host, sizeof t->host, &rest));
        snprintf(t->path, sizeof t->path, "%s/%.*s/%s", rest, (int)bucket_len, bucket, key);
        buffer_put(&b, s3.endpoint, (size_t)(rest - s3.endpoint));
    } else {
        const char *scheme = "https://";
        if (s3.endpoint[0]) {
            const char *rest;
            char base[256];
            TP_TRY(object_split_authority(s3.endpoint, base, sizeof base, &rest));
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
    const char *content_md5; /* the Content-MD5 header's value (a part's), signed too; NULL without one */
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
    sigv4_pair headers[5] = {{"host", g->t->host}, {"x-amz-content-sha256", g->payload_hash}, {"x-amz-date", amz_date}};
    int num_headers = 3;
    if (s3.session_token) headers[num_headers++] = (sigv4_pair){"x-amz-security-token", s3.session_token};
    if (g->content_md5) headers[num_headers++] = (sigv4_pair){"content-md5", g->content_md5};
    sigv4_key key = {s3.access_key, s3.secret_key, s3.session_token, s3.region, "s3"};
    sigv4_request request = {g->method, g->t->path, g->query, g->num_query, headers, num_headers,
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

/* Sends a request, signed. */
static int s3_send(const object_call *c, http_response *r)
{
    target t;
    TP_TRY(resolve(c->path, c->query, c->num_query, &t));
    http_request q = c->http;
    q.url = t.url;
    s3_signature signature = {0};
    char hash[65];
    signature.t = &t;
    signature.method = q.method;
    signature.query = c->query;
    signature.num_query = c->num_query;
    for (const char *const *h = q.headers; h && *h; h++)
        if (!strncasecmp(*h, "Content-MD5: ", 13)) signature.content_md5 = *h + 13;
    if (q.body_file) signature.payload_hash = "UNSIGNED-PAYLOAD";
    else if (q.body) {
        sigv4_sha256_hex(q.body, q.body_size, hash);
        signature.payload_hash = hash;
    } else
        signature.payload_hash = EMPTY_SHA256;
    q.sign = sign_s3;
    q.sign_ctx = &signature;
    int status = http_perform(&q, r);
    free(signature.auth_line);
    free(signature.token_line);
    /* http.c's message names the URL sent; the store's own name is added
     * where it differs (s3:// names an https:// URL). */
    if (status && strncmp(q.url, c->path, strlen(c->path)) != 0) return tp_fail_context(status, "%s", c->path);
    return status;
}

/* ------------------------------------------------------------- listings */

typedef struct {
    int (*visit)(void *ctx, const char *name);
    void *ctx;
    int delimited; /* names one level down (with "/"), or every key below */
    int found;
} list_visit;

/* The text of an element of a listing of dir_url, decoded; a key or a
 * prefix (url_encoded) then URL-decoded where the listing says
 * EncodingType url: S3 writes a space '+' there (a '+' is "%2B"), as the
 * AWS SDKs read it (botocore: unquote_plus). */
static int listing_text(const char *text, const char *text_end, int url_encoded, const char *dir_url, char *out,
                        size_t size)
{
    int status = xml_text(text, text_end, out, size);
    if (status) return tp_fail_context(status, "%s: the server's listing", dir_url);
    if (!url_encoded) return TP_OK;
    for (char *c = out; *c; c++)
        if (*c == '+') *c = ' ';
    http_decode(out);
    return TP_OK;
}

/* The name a listed key (or common prefix) gives below the listing's
 * prefix, decoded (listing_text): S3 lists only keys that begin with the
 * prefix asked for, and the name was the key cut at the prefix's length
 * without looking. A key that does not begin with it (a server ignoring
 * the prefix, or writing keys otherwise than its EncodingType says, so
 * that they decode to other bytes) was cut into another name without a
 * word: a run directory's names lost or made up (the claim that
 * "vanished"), and a removal deleting keys of that made-up name. Such a
 * listing is refused, naming the key as decoded and the prefix. */
static int name_below_prefix(const char *listed, const char *prefix, int url_encoded, const char *dir_url,
                             const char **name)
{
    size_t n = strlen(prefix);
    if (strncmp(listed, prefix, n) != 0)
        return tp_fail(TP_ERR_FORMAT, "%s: the server's listing names the key '%s' (%s), which does not begin with "
                       "the prefix '%s' asked for: a listing of other keys (a store ignoring the prefix, or writing "
                       "keys otherwise than it says?), refused rather than cut into another name", dir_url, listed,
                       url_encoded ? "URL-decoded, as its EncodingType url says" : "as written, no EncodingType said",
                       prefix);
    *name = listed + n;
    return TP_OK;
}

/* Lists keys below an S3 prefix ("key/"), page by page. */
static int s3_list(const char *dir_url, int delimited, int max_keys, list_visit *v)
{
    /* s3://bucket/dir -> bucket URL s3://bucket, prefix "dir/" */
    char canonical[TP_PATH_MAX]; /* "run//step" lists "run/step/" (tp_path_canonical) */
    if (tp_path_canonical(dir_url, canonical, sizeof canonical)) return tp_fail(TP_ERR_ARG, "%s: URL too long", dir_url);
    const char *bucket = canonical + 5, *slash = strchr(bucket, '/');
    char bucket_url[512], prefix[TP_PATH_MAX], token[1024] = "", max[16];
    snprintf(bucket_url, sizeof bucket_url, "s3://%.*s", (int)(slash ? slash - bucket : (long)strlen(bucket)), bucket);
    snprintf(prefix, sizeof prefix, "%s", slash ? slash + 1 : "");
    size_t n = strlen(prefix);
    while (n && prefix[n - 1] == '/') prefix[--n] = '\0';
    if (n) strcat(prefix, "/");
    snprintf(max, sizeof max, "%d", max_keys);
    int status = TP_OK;
    /* A server that keeps answering "truncated" with the token it was given
     * (or any it gave before) would be listed for ever; so would one that
     * never stops. */
    char seen[4][1024] = {"", "", "", ""};
    for (int64_t page = 0;; page++) {
        if (page >= LIST_PAGES_MAX)
            return tp_fail(TP_ERR_FORMAT, "%s: the listing did not end after %d pages of %d keys", dir_url,
                           LIST_PAGES_MAX, max_keys > 0 ? max_keys : 1000);
        /* encoding-type=url: keys come percent-encoded, so that a key's
         * control characters (which XML 1.0 cannot hold; S3 writes them as
         * "&#13;" otherwise) come back whole; a store that ignores it (no
         * EncodingType in its answer: s3rver) sends them as text. */
        sigv4_pair query[6] = {{"list-type", "2"}, {"prefix", prefix}, {"encoding-type", "url"}};
        int nq = 3;
        if (delimited) query[nq++] = (sigv4_pair){"delimiter", "/"};
        if (max_keys > 0) query[nq++] = (sigv4_pair){"max-keys", max};
        if (token[0]) query[nq++] = (sigv4_pair){"continuation-token", token};
        byte_buffer body = {0};
        object_call c = {.path = bucket_url, .query = query, .num_query = nq,
            .http = {.method = "GET", .body_out = &body, .body_max = OBJECT_LIST_MAX}};
        http_response r;
        status = object_call_ok(store_s3(), &c, &r);
        if (!status) status = xml_check_listing(body.data ? body.data : "", body.size, "ListBucketResult", dir_url);
        const char *p = body.data ? body.data : "", *end = p + body.size, *text, *text_end, *next;
        char name[TP_PATH_MAX], encoding[16] = "";
        if (!status && xml_element(p, end, "EncodingType", &text, &text_end))
            status = listing_text(text, text_end, 0, dir_url, encoding, sizeof encoding);
        int url_encoded = !strcmp(encoding, "url");
        /* Keys of objects, then prefixes one level down ("step_1/"). */
        for (const char *q = p; !status && (next = xml_element(q, end, "Contents", &text, &text_end)); q = next) {
            const char *key, *key_end;
            if (!xml_element(text, text_end, "Key", &key, &key_end)) continue;
            const char *below = "";
            if ((status = listing_text(key, key_end, url_encoded, dir_url, name, sizeof name)) ||
                (status = name_below_prefix(name, prefix, url_encoded, dir_url, &below)))
                break;
            v->found = 1;
            if (v->visit && *below) status = v->visit(v->ctx, below);
        }
        for (const char *q = p; !status && (next = xml_element(q, end, "CommonPrefixes", &text, &text_end)); q = next) {
            const char *key, *key_end;
            if (!xml_element(text, text_end, "Prefix", &key, &key_end)) continue;
            const char *below = "";
            if ((status = listing_text(key, key_end, url_encoded, dir_url, name, sizeof name)) ||
                (status = name_below_prefix(name, prefix, url_encoded, dir_url, &below)))
                break;
            size_t len = strlen(name);
            if (len && name[len - 1] == '/') name[--len] = '\0'; /* "run/step_1/" names "step_1" */
            v->found = 1;
            if (v->visit && name + len > below) status = v->visit(v->ctx, below);
        }
        char truncated[16] = "";
        if (!status && xml_element(p, end, "IsTruncated", &text, &text_end))
            status = listing_text(text, text_end, 0, dir_url, truncated, sizeof truncated);
        token[0] = '\0';
        if (!status && !strcmp(truncated, "true") && xml_element(p, end, "NextContinuationToken", &text, &text_end))
            status = listing_text(text, text_end, 0, dir_url, token, sizeof token);
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

/* ---------------------------------------------------------------- names */

static int s3_stat(const store_ops *s, const char *path, store_stat *out)
{
    memset(out, 0, sizeof *out);
    const char *key = strchr(path + 5, '/');
    if (!key || !key[1]) { /* the bucket itself */
        out->exists = out->is_dir = 1;
        return TP_OK;
    }
    object_call c = {.path = path, .http = {.method = "HEAD"}};
    http_response r;
    TP_TRY(object_protocol_of(s)->send(&c, &r));
    if (r.code >= 200 && r.code < 300) {
        *out = (store_stat){1, 0, r.content_length >= 0 ? r.content_length : 0};
        return TP_OK;
    }
    if (r.code != 404) return object_answer_error("HEAD", path, &r);
    list_visit v = {0};
    TP_TRY(s3_list(path, 1, 1, &v));
    out->exists = out->is_dir = v.found;
    return TP_OK;
}

static int s3_list_dir(const store_ops *s, const char *dir, int (*visit)(void *ctx, const char *name), void *ctx)
{
    (void)s;
    list_visit v = {.visit = visit, .ctx = ctx, .delimited = 1};
    TP_TRY(s3_list(dir, 1, 0, &v));
    return v.found ? TP_OK : tp_fail(TP_ERR_NOT_FOUND, "%s: cannot list: nothing there", dir);
}

static int s3_make_dir(const store_ops *s, const char *path)
{
    (void)s, (void)path;
    return TP_OK; /* prefixes exist by their keys */
}

static int delete_key(void *dir, const char *name)
{
    char url[TP_PATH_MAX];
    TP_TRY(tp_path_join(url, dir, name));
    return object_delete(store_s3(), url);
}

static int s3_remove_tree(const store_ops *s, const char *path)
{
    store_stat st;
    TP_TRY(s3_stat(s, path, &st));
    if (!st.exists) return TP_OK;
    if (!st.is_dir) return object_delete(s, path);
    /* Every key below, deleted as the listing pages through them (a
     * continuation token resumes after the last key returned, so keys
     * already deleted do not shift the pages). */
    list_visit v = {.visit = delete_key, .ctx = (void *)path};
    return s3_list(path, 0, 0, &v);
}

/* ----------------------------------------------------------------- writes */

typedef struct {
    const char *url, *local;
    int64_t offset, length, part;
    const char *upload_id;
    char (*etags)[128];
    unsigned char (*md5s)[MD5_BYTES]; /* (parts) of each part's bytes, read before it is sent */
} multipart;

static int put_part(void *ctx, int64_t k, int thread)
{
    (void)thread;
    multipart *m = ctx;
    char number[24];
    snprintf(number, sizeof number, "%lld", (long long)k + 1);
    sigv4_pair query[2] = {{"partNumber", number}, {"uploadId", m->upload_id}};
    int64_t begin = k * m->part, length = begin + m->part < m->length ? m->part : m->length - begin;
    /* The part's MD5, from its bytes read before they are sent: S3 refuses
     * a part that does not match it (Content-MD5: damaged on the way), and
     * the upload's ETag is made of these (completion_lost). */
    TP_TRY(md5_file_range(m->local, m->offset + begin, length, m->md5s[k]));
    char content_md5[40] = "Content-MD5: ";
    md5_base64(m->md5s[k], content_md5 + strlen(content_md5));
    const char *headers[] = {content_md5, NULL};
    object_call c = {.path = m->url, .query = query, .num_query = 2,
        .http = {.method = "PUT", .headers = headers, .body_file = m->local, .body_offset = m->offset + begin,
                 .body_length = length}};
    http_response r;
    TP_TRY(object_call_ok(store_s3(), &c, &r));
    if (!r.etag[0]) return tp_fail(TP_ERR_IO, "%s: part %lld uploaded without an ETag", m->url, (long long)k + 1);
    memcpy(m->etags[k], r.etag, sizeof r.etag);
    return TP_OK;
}

/* A completion answered 404 NoSuchUpload: S3 knows the upload no more. An
 * earlier attempt whose answer was lost (a connection closed after S3
 * did the work) leaves exactly that, and the object made: it is this
 * upload's when its ETag is the one the parts' MD5s make (md5.h) and its
 * size the upload's. Anything else is refused, saying what is there: S3
 * tells which upload made an object by nothing but its ETag. (It was
 * said as "no such object (HTTP 404 NoSuchUpload)" though the object was
 * made.) */
static int completion_lost(const multipart *m, int64_t parts, int attempts)
{
    char expected[64], tried[48];
    md5_multipart_etag((const unsigned char (*)[MD5_BYTES])m->md5s, parts, expected, sizeof expected);
    snprintf(tried, sizeof tried, "after %d completion attempt%s", attempts, attempts == 1 ? "" : "s");
    object_call head = {.path = m->url, .http = {.method = "HEAD"}};
    http_response r;
    TP_TRY(s3_send(&head, &r));
    int made = r.code >= 200 && r.code < 300;
    if (made && !strcasecmp(r.etag, expected) && r.content_length == m->length) {
        char text[1024];
        snprintf(text, sizeof text, "POST %s: its multipart upload is no longer known to the store (NoSuchUpload, "
                 "%s): an earlier completion was done, its answer lost; the object there is this upload's "
                 "(ETag %s, %lld bytes)", m->url, tried, expected, (long long)m->length);
        store_notify(text);
        return TP_OK;
    }
    if (r.code == 404)
        return tp_fail(TP_ERR_IO, "POST %s: its multipart upload (uploadId %s) is gone (NoSuchUpload, %s) and no "
                       "object is there: aborted by another process, or by a lifecycle rule "
                       "(AbortIncompleteMultipartUpload)? The file is not uploaded", m->url, m->upload_id, tried);
    if (!made)
        return tp_fail_context(object_answer_error("HEAD", m->url, &r), "POST %s: its multipart upload is gone "
                               "(NoSuchUpload, %s), and whether its object was made cannot be told", m->url, tried);
    return tp_fail(TP_ERR_IO, "POST %s: its multipart upload (uploadId %s) is gone (NoSuchUpload, %s) and the "
                   "object there is not this upload's: ETag %s, %lld bytes, where this upload's would be ETag %s, "
                   "%lld bytes (replaced by another writer since? An object encrypted with SSE-KMS or SSE-C has an "
                   "ETag that is no MD5, and cannot be told so)", m->url, m->upload_id, tried,
                   r.etag[0] ? r.etag : "(none)", (long long)r.content_length, expected, (long long)m->length);
}

/* The seconds since 1970 of an S3 time, "2026-12-01T04:43:25.000Z"; -1
 * when it is not one. */
static double s3_time(const char *text)
{
    struct tm tm = {0};
    const char *rest = strptime(text, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!rest) return -1;
    double fraction = 0;
    if (*rest == '.') fraction = strtod(rest, (char **)&rest);
    return *rest == 'Z' && !rest[1] ? (double)timegm(&tm) + fraction : -1;
}

/* The uploads that this process's creates of one multipart upload left
 * when an answer to one was lost: S3 made an upload of each create it
 * took, and the process knows the last answered one's alone (upload_id;
 * "" when none was answered). They are found by listing the key's uploads
 * under way (ListMultipartUploads), and aborted when S3 initiated them
 * between the first create sent (began) and the end of the last (ended),
 * and are no more than the creates whose answer was lost (lost:
 * http_response.unanswered; a create answered, a throttling 503 or a 5xx,
 * made none, and counting it would let another writer's upload of that
 * window pass for an orphan and be aborted). The two clocks
 * are set side by side by the listing's answer: its Date (S3's clock, to
 * the second) was written between the listing's request and its answer.
 * More uploads in that window than the lost answers means another writer
 * began one meanwhile: none is aborted (which is whose cannot be told),
 * they are named. S3 initiates an upload between a create's sending and
 * its answer, so none begun before or after this process's creates is
 * ever aborted. A server without ListMultipartUploads (s3rver) is said to
 * be. What is done is said (store_notify): the upload itself is made or
 * not whatever this finds. */
static int abort_orphaned_uploads(const char *url, const char *upload_id, int creates, int lost, double began,
                                  double ended)
{
    char canonical[TP_PATH_MAX], bucket_url[512];
    if (tp_path_canonical(url, canonical, sizeof canonical)) return tp_fail(TP_ERR_ARG, "%s: URL too long", url);
    const char *bucket = canonical + 5, *key = strchr(bucket, '/');
    if (!key) return tp_fail(TP_ERR_ARG, "%s: no key in this URL", url);
    snprintf(bucket_url, sizeof bucket_url, "s3://%.*s", (int)(key - bucket), bucket);
    key++;
    enum { LISTED_MAX = 64 };
    char ids[LISTED_MAX][1024], listed_key[TP_PATH_MAX];
    int found = 0, status = TP_OK, truncated = 0;
    double from = 0, to = 0;
    /* Page by page (S3 lists 1000 uploads a page, the key's own among the
     * bucket's others of that prefix, oldest first): the first page alone
     * was read, and an orphan past it was never found. The next page
     * begins after the last listed (NextKeyMarker, NextUploadIdMarker). */
    char key_marker[TP_PATH_MAX] = "", id_marker[1024] = "";
    int page = 0;
    for (; !status && page < UPLOAD_PAGES_MAX; page++) {
        sigv4_pair query[5] = {{"uploads", ""}, {"prefix", key}, {"encoding-type", "url"}};
        int num_query = 3;
        if (page) {
            query[num_query++] = (sigv4_pair){"key-marker", key_marker};
            query[num_query++] = (sigv4_pair){"upload-id-marker", id_marker};
        }
        byte_buffer body = {0};
        object_call c = {.path = bucket_url, .query = query, .num_query = num_query,
            .http = {.method = "GET", .body_out = &body, .body_max = OBJECT_LIST_MAX}};
        http_response r;
        double asked = now_seconds();
        status = object_call_ok(store_s3(), &c, &r);
        double answered = now_seconds();
        const char *p = body.data ? body.data : "", *end = p + body.size, *text, *text_end, *next;
        if (!status) status = xml_check_listing(p, body.size, "ListMultipartUploadsResult", bucket_url);
        char encoding[16] = "", more[16] = "", next_key[TP_PATH_MAX] = "", next_id[1024] = "";
        if (!status && xml_element(p, end, "EncodingType", &text, &text_end))
            status = listing_text(text, text_end, 0, bucket_url, encoding, sizeof encoding);
        int url_encoded = !strcmp(encoding, "url");
        if (!status && xml_element(p, end, "IsTruncated", &text, &text_end))
            status = listing_text(text, text_end, 0, bucket_url, more, sizeof more);
        if (!status && xml_element(p, end, "NextKeyMarker", &text, &text_end))
            status = listing_text(text, text_end, url_encoded, bucket_url, next_key, sizeof next_key);
        if (!status && xml_element(p, end, "NextUploadIdMarker", &text, &text_end))
            status = listing_text(text, text_end, 0, bucket_url, next_id, sizeof next_id);
        if (!status && page == 0 && !r.server_time)
            status = tp_fail(TP_ERR_FORMAT, "%s: the store's answer has no Date to set its clock by", bucket_url);
        /* The window, in S3's clock (the first page's): the offset of the
         * two clocks lies in [Date - answered, Date + 1 - asked]; a second
         * more either way. */
        if (!status && page == 0)
            from = began + (double)r.server_time - answered - 1, to = ended + (double)r.server_time + 1 - asked + 1;
        for (const char *q = p; !status && (next = xml_element(q, end, "Upload", &text, &text_end)); q = next) {
            const char *x, *x_end;
            char initiated[64] = "", id[1024] = "";
            if (!xml_element(text, text_end, "Key", &x, &x_end)) continue;
            if ((status = listing_text(x, x_end, url_encoded, bucket_url, listed_key, sizeof listed_key))) break;
            if (xml_element(text, text_end, "UploadId", &x, &x_end))
                status = listing_text(x, x_end, 0, bucket_url, id, sizeof id);
            if (!status && xml_element(text, text_end, "Initiated", &x, &x_end))
                status = listing_text(x, x_end, 0, bucket_url, initiated, sizeof initiated);
            double when = s3_time(initiated);
            if (status || strcmp(listed_key, key) || !id[0] || !strcmp(id, upload_id) || when < from || when > to)
                continue;
            if (found < LISTED_MAX) snprintf(ids[found], sizeof ids[found], "%s", id);
            found++;
        }
        free(body.data);
        /* Truncated without a way on, or the same way again: the rest
         * cannot be listed (said below as a truncated listing). */
        truncated = !strcmp(more, "true");
        if (status || !truncated || !next_key[0] ||
            (!strcmp(next_key, key_marker) && !strcmp(next_id, id_marker)))
            break;
        snprintf(key_marker, sizeof key_marker, "%s", next_key);
        snprintf(id_marker, sizeof id_marker, "%s", next_id);
    }
    char text_out[2048];
    if (status) {
        snprintf(text_out, sizeof text_out, "%s: its multipart upload was created in %d requests, an answer lost: "
                 "the uploads S3 made for the lost answers could not be looked for (%s); a lifecycle rule "
                 "(AbortIncompleteMultipartUpload) removes them", url, creates, tp_errmsg());
        store_notify(text_out);
        return status;
    }
    if (found == 0 && truncated) {
        snprintf(text_out, sizeof text_out, "%s: its multipart upload was created in %d requests, an answer lost: "
                 "the key's uploads under way could not be listed whole (truncated after %d pages%s), and none of "
                 "those listed is one S3 made for the lost answers; a lifecycle rule "
                 "(AbortIncompleteMultipartUpload) removes any", url, creates, page + (page < UPLOAD_PAGES_MAX),
                 page < UPLOAD_PAGES_MAX ? ", without a next marker or with the same again" : ", the most read");
        store_notify(text_out);
        return TP_OK;
    }
    if (found == 0) return TP_OK; /* the lost answers made none (a 5xx is refused work) */
    char named[1024] = ""; /* the uploads' ids, as many as fit */
    for (int i = 0, n = 0; i < found && i < LISTED_MAX && n < (int)sizeof named; i++)
        n += snprintf(named + n, sizeof named - (size_t)n, "%s%s", i ? ", " : "", ids[i]);
    if (found > lost || truncated) {
        snprintf(text_out, sizeof text_out, "%s: its multipart upload was created in %d requests, an answer lost, "
                 "and %d other uploads of this key were initiated meanwhile%s, more than these requests made: none "
                 "aborted, as one may be another writer's (uploadId %s); abort those that are not (aws s3api "
                 "abort-multipart-upload), or let a lifecycle rule (AbortIncompleteMultipartUpload)", url, creates,
                 found, truncated ? " (the listing was truncated)" : "", named);
        store_notify(text_out);
        return TP_OK;
    }
    int aborted = 0;
    for (int i = 0; i < found; i++) {
        sigv4_pair id_query[1] = {{"uploadId", ids[i]}};
        object_call abort_upload = {.path = url, .query = id_query, .num_query = 1, .http = {.method = "DELETE"}};
        http_response answer;
        if (!s3_send(&abort_upload, &answer) && ((answer.code >= 200 && answer.code < 300) || answer.code == 404))
            aborted++;
    }
    snprintf(text_out, sizeof text_out, "%s: its multipart upload was created in %d requests, an answer lost: "
             "%d of the %d uploads S3 made for the lost answers aborted (uploadId %s)%s", url, creates, aborted,
             found, named, aborted < found ? "; the rest are left to a lifecycle rule (AbortIncompleteMultipartUpload)"
                                           : "");
    store_notify(text_out);
    return TP_OK;
}

/* S3 multipart upload: create, parts in parallel, complete (or abort). */
static int put_multipart(const char *url, const char *local, int64_t offset, int64_t length, int64_t part,
                         int threads)
{
    sigv4_pair create_query[1] = {{"uploads", ""}};
    byte_buffer answer = {0};
    /* A create is not idempotent: a retry after a lost answer makes
     * another upload (abort_orphaned_uploads); on a fresh connection, so
     * that every sending is counted. */
    object_call create = {.path = url, .query = create_query, .num_query = 1,
        .http = {.method = "POST", .body_out = &answer, .body_max = 1 << 20, .fresh_connection = 1}};
    http_response r;
    memset(&r, 0, sizeof r);
    double create_began = now_seconds();
    int status = object_call_ok(store_s3(), &create, &r);
    double create_ended = now_seconds();
    /* Creates whose answer was lost after they were sent, S3 having taken
     * them or not: those alone may have left an upload. */
    int creates = r.attempts, lost_answers = r.unanswered;
    char upload_id[1024] = "";
    const char *text, *text_end;
    if (!status && answer.data && xml_element(answer.data, answer.data + answer.size, "UploadId", &text, &text_end) &&
        (status = xml_text(text, text_end, upload_id, sizeof upload_id)))
        status = tp_fail_context(status, "POST %s: the answer to its multipart upload's creation", url);
    free(answer.data);
    answer = (byte_buffer){0};
    if (!status && !upload_id[0]) status = tp_fail(TP_ERR_IO, "%s: the store started no multipart upload", url);
    int64_t parts = (length + part - 1) / part;
    multipart m = {url, local, offset, length, part, upload_id, NULL, NULL};
    if (!status) {
        m.etags = calloc((size_t)parts, sizeof *m.etags);
        m.md5s = calloc((size_t)parts, sizeof *m.md5s);
        if (!m.etags || !m.md5s) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    }
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
        /* S3 answers 200 before it assembles the parts, and a failure then
         * comes in the body (ok_may_carry_error: retried where transient,
         * as the AWS SDKs do); it was said as "HTTP 500 (after retries)"
         * and never retried. Only a CompleteMultipartUploadResult says the
         * object is made: any other 200 (a proxy's page) was taken for it,
         * the upload left unaborted, and the object found missing later.
         * NoSuchUpload: completion_lost (a fresh connection: each
         * attempt counted, none sent again by libcurl unsaid). */
        object_call complete = {.path = url, .query = id_query, .num_query = 1,
            .http = {.method = "POST", .body = xml.data, .body_size = xml.size, .body_out = &answer,
                     .body_max = 1 << 20, .ok_may_carry_error = 1, .fresh_connection = 1}};
        status = s3_send(&complete, &r);
        const char *end = answer.data ? answer.data + answer.size : NULL;
        if (!status && r.code == 404 && strstr(r.error_body, "<Code>NoSuchUpload</Code>"))
            status = completion_lost(&m, parts, r.attempts);
        else if (!status && (r.code < 200 || r.code >= 300 || r.error_in_ok))
            status = object_answer_error("POST", url, &r);
        else if (!status && !xml_element(answer.data, end, "CompleteMultipartUploadResult", &text, &text_end))
            status = tp_fail(TP_ERR_IO, "POST %s: the completion of its multipart upload was answered HTTP %ld without "
                             "a CompleteMultipartUploadResult (%zu bytes: not S3's answer; a proxy's?): the object "
                             "is not known to be made", url, r.code, answer.size);
        free(answer.data);
    }
    char message[2048], why[1024] = "";
    snprintf(message, sizeof message, "%s", status ? tp_errmsg() : "");
    if (status && upload_id[0]) { /* nothing half-done stays billed in the bucket */
        object_call abort_upload = {.path = url, .query = id_query, .num_query = 1, .http = {.method = "DELETE"}};
        http_response answer_to_abort;
        int aborted = s3_send(&abort_upload, &answer_to_abort);
        long code = answer_to_abort.code;
        if (!aborted && code != 404 && (code < 200 || code >= 300))
            aborted = object_answer_error("DELETE", url, &answer_to_abort);
        if (aborted) snprintf(why, sizeof why, "%s", tp_errmsg());
    }
    /* Said by a notice, whatever it finds: the upload's status stays its own. */
    if (lost_answers > 0)
        (void)abort_orphaned_uploads(url, upload_id, creates, lost_answers, create_began, create_ended);
    /* An abort that failed is said, not dropped: its parts stay in the bucket, billed and unlisted. */
    if (status && why[0])
        tp_fail(status, "%s (and its multipart upload could not be aborted, its parts staying billed in the bucket "
                "until it is: uploadId %s: %s)", message, upload_id, why);
    else if (status)
        tp_fail(status, "%s", message);
    free(xml.data);
    free(m.etags);
    free(m.md5s);
    return status;
}

#define S3_PARTS_MAX 10000
#define S3_PART_MAX ((int64_t)5 << 30)
#define S3_OBJECT_MAX ((int64_t)5 << 40)

int store_s3_part_bytes(int64_t length, int64_t wanted, int64_t *part)
{
    const int64_t MiB = (int64_t)1 << 20;
    *part = wanted;
    if (length > S3_OBJECT_MAX)
        return tp_fail(TP_ERR_ARG, "%lld bytes: larger than the 5 TiB an S3 object may hold", (long long)length);
    if ((length + wanted - 1) / wanted > S3_PARTS_MAX) /* the fewest whole MiB that keep to 10,000 parts */
        *part = ((length + S3_PARTS_MAX - 1) / S3_PARTS_MAX + MiB - 1) / MiB * MiB;
    if (*part > S3_PART_MAX)
        return tp_fail(TP_ERR_ARG, "a part of %lld bytes: larger than the 5 GiB S3 takes", (long long)*part);
    return TP_OK;
}

/* Files larger than the part size (TP_REMOTE_PART_MB, or what keeps to
 * S3's 10,000 parts) go as a multipart upload whose parts are sent on
 * `threads` threads; others in one PUT. */
static int s3_put_file(const store_ops *s, const char *path, const char *local_path, int64_t offset, int64_t length,
                       int threads)
{
    int64_t part;
    int status = store_s3_part_bytes(length, http_policy_get()->part_bytes, &part);
    if (status) return tp_fail_context(status, "%s", path);
    if (length > part) return put_multipart(path, local_path, offset, length, part, threads);
    return object_put_file(s, path, local_path, offset, length);
}

static const object_protocol s3_protocol = {.send = s3_send, .put_md5 = 1};

static const store_ops s3_store = {.name = "s3",
                                   OBJECT_STORE_OPS,
                                   .stat = s3_stat,
                                   .list = s3_list_dir,
                                   .make_dir = s3_make_dir,
                                   .remove_tree = s3_remove_tree,
                                   .put_file = s3_put_file,
                                   .impl = &s3_protocol};

const store_ops *store_s3(void)
{
    return &s3_store;
}
