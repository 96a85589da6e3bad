/* http.c: requests through libcurl with connection sharing and retries. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "../common/clock.h"
#include "../common/error.h"
#include "../common/parse.h"
#include "../common/fault.h"
#include "http.h"
#include "staging.h"
#include "store.h"

/* ------------------------------------------------------------ shared state */

static CURLSH *share;
static pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
static http_policy policy;
static int init_status;
static char init_error[256] = "libcurl failed to initialize";
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_key_t handle_key;
static atomic_long requests_given_up; /* store_requests_given_up */

#define BACKOFF_MAX_MS 10000L /* the longest wait between two attempts */
/* Bytes of a body no one reads (an error answer's, whose start alone is
 * kept; any answer to a request taking none) read before the transfer is
 * cut and the answer taken as its status: a server sending such a body
 * without end was read until the attempt's deadline, which is scaled by
 * the bytes asked for (a listing's 64 MiB at TP_REMOTE_MIN_SPEED: 18 hours
 * an attempt). Reading a short one whole keeps its connection reusable. */
#define UNREAD_BODY_MAX ((size_t)1 << 20)

static void share_lock(CURL *handle, curl_lock_data data, curl_lock_access access, void *ctx)
{
    (void)handle, (void)access, (void)ctx;
    pthread_mutex_lock(&share_locks[data]);
}

static void share_unlock(CURL *handle, curl_lock_data data, void *ctx)
{
    (void)handle, (void)ctx;
    pthread_mutex_unlock(&share_locks[data]);
}

/* A setting from the environment: unset or empty, the default; anything but
 * a whole number in [min, max] makes every request fail naming it (0, abc
 * or -5 for TP_REMOTE_TIMEOUT became 30 s without a word). */
static long env_long(const char *name, long fallback, long min, long max)
{
    const char *text = getenv(name);
    if (!text || !*text) return fallback;
    int64_t value;
    if (parse_int(text, min, max, &value) == 0) return (long)value;
    if (!init_status) {
        init_status = TP_ERR_ARG;
        snprintf(init_error, sizeof init_error, "%s=%.64s: expected a whole number in %ld..%ld", name, text, min, max);
    }
    return fallback;
}

static void release_handle(void *handle)
{
    curl_easy_cleanup(handle);
}

static void init(void)
{
    policy.retries = (int)env_long("TP_REMOTE_RETRIES", 6, 0, 100);
    policy.throttle_seconds = env_long("TP_REMOTE_THROTTLE_SECONDS", 600, 0, 86400);
    policy.stall_seconds = env_long("TP_REMOTE_TIMEOUT", 30, 1, 86400);
    policy.min_speed = env_long("TP_REMOTE_MIN_SPEED", 1024, 0, 1L << 30);
    policy.backoff_ms = env_long("TP_REMOTE_BACKOFF_MS", 200, 0, 600000);
    policy.read_threads = (int)env_long("TP_REMOTE_THREADS", 8, 1, 256);
    policy.part_bytes = (int64_t)env_long("TP_REMOTE_PART_MB", 64, 5, 5120) << 20;
    if (init_status) return; /* a setting refused: said by every request */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || pthread_key_create(&handle_key, release_handle)) {
        init_status = tp_fail(TP_ERR_IO, "libcurl failed to initialize");
        return;
    }
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&share_locks[i], NULL);
    share = curl_share_init();
    if (!share || curl_share_setopt(share, CURLSHOPT_LOCKFUNC, share_lock) ||
        curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, share_unlock) ||
        curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) ||
        curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) ||
        curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION))
        init_status = tp_fail(TP_ERR_IO, "libcurl cannot share connections between threads"),
        snprintf(init_error, sizeof init_error, "libcurl cannot share connections between threads");
}

const http_policy *http_policy_get(void)
{
    pthread_once(&init_once, init);
    return &policy;
}

/* This thread's easy handle: created once, released when the thread ends. */
static int thread_handle(CURL **out)
{
    pthread_once(&init_once, init);
    if (init_status) return tp_fail(init_status, "%s", init_error);
    CURL *handle = pthread_getspecific(handle_key);
    if (!handle) {
        handle = curl_easy_init();
        if (!handle || pthread_setspecific(handle_key, handle)) {
            if (handle) curl_easy_cleanup(handle);
            return tp_fail(TP_ERR_NOMEM, "libcurl: cannot create a handle");
        }
    }
    curl_easy_reset(handle);
    *out = handle;
    return TP_OK;
}

/* ------------------------------------------------------------- callbacks */

typedef struct {
    CURL *curl;
    const http_request *request;
    http_response *response;
    int fd;          /* body_file, opened for this attempt */
    int64_t sent;    /* body bytes handed to libcurl */
    int overflow;    /* more bytes came than dst holds */
    size_t unread;   /* bytes of a body no one reads (UNREAD_BODY_MAX) */
    int unread_cut;  /* such a body was cut off: the answer is its status */
    int read_error;  /* errno of a failed read of body_file */
    /* Stall detection: the bytes moved either way, and when they last changed. */
    curl_off_t moved;
    double moved_at;
    int stalled;
    /* Speed: the bytes moved when the current window began, and when. */
    curl_off_t window_moved;
    double window_at;
    int too_slow;
    double allowed, deadline; /* seconds this attempt may take, and when they end */
    int late;
    int writes;  /* the request adds to the store (request_writes) */
    int stopped; /* cut off: the process is being stopped (store_stopping) */
    int sending; /* the body's first bytes went (the test hook's point) */
} transfer;

/* Whether a request adds something to the store: all but reads and
 * removals. None goes out once the process is being stopped by a signal
 * (store/staging.h store_stopping), so that an upload fails and removes
 * what it sent (DELETE, and the listings PROPFIND and GET that it needs,
 * still go) before the process dies. */
static int request_writes(const char *method)
{
    return strcmp(method, "GET") && strcmp(method, "HEAD") && strcmp(method, "PROPFIND") && strcmp(method, "DELETE");
}

/* n more bytes of a body no one reads: n, or 0 (the transfer cut) past
 * UNREAD_BODY_MAX. */
static size_t unread_body(transfer *t, size_t n)
{
    t->unread += n;
    if (t->unread <= UNREAD_BODY_MAX) return n;
    t->unread_cut = 1;
    return 0;
}

static size_t on_body(char *data, size_t size, size_t count, void *ctx)
{
    transfer *t = ctx;
    size_t n = size * count;
    const http_request *q = t->request;
    long code = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code < 200 || code >= 300) {
        /* An error answer's body is not the data asked for: kept apart
         * (its start), for the message it may carry. */
        http_response *r = t->response;
        size_t used = strlen(r->error_body), room = sizeof r->error_body - 1 - used;
        memcpy(r->error_body + used, data, n < room ? n : room);
        r->error_body[used + (n < room ? n : room)] = '\0';
        return unread_body(t, n);
    }
    if (q->dst) {
        if (t->response->received + n > q->dst_size) {
            t->overflow = 1;
            return 0; /* aborts the transfer */
        }
        memcpy((char *)q->dst + t->response->received, data, n);
        t->response->received += n;
        return n;
    }
    if (q->body_out) {
        if (q->body_max && q->body_out->size + n > q->body_max) {
            t->overflow = 1;
            return 0;
        }
        buffer_put(q->body_out, data, n);
        return q->body_out->failed ? 0 : n;
    }
    return unread_body(t, n);
}

static size_t on_send(char *out, size_t size, size_t count, void *ctx)
{
    transfer *t = ctx;
    const http_request *q = t->request;
    size_t want = size * count;
    if (t->sent > 0 && !t->sending) {
        t->sending = 1;
        tp_fault_point("upload-sending"); /* a body partly sent: a test's signal strikes mid-transfer */
    }
    /* A body not all sent when the process is being stopped is cut off:
     * the server drops a request whose body ends early, so the object is
     * not made, and nothing of the upload outlives its clean-up. */
    int64_t total = q->body ? (int64_t)q->body_size : q->body_length;
    if (t->writes && t->sent < total && store_stopping()) {
        t->stopped = 1;
        return CURL_READFUNC_ABORT;
    }
    if (q->body) {
        size_t left = q->body_size - (size_t)t->sent;
        size_t n = want < left ? want : left;
        memcpy(out, (const char *)q->body + t->sent, n);
        t->sent += (int64_t)n;
        return n;
    }
    int64_t left = q->body_length - t->sent;
    size_t n = (int64_t)want < left ? want : (size_t)left;
    if (n == 0) return 0;
    ssize_t got;
    do got = pread(t->fd, out, n, (off_t)(q->body_offset + t->sent));
    while (got < 0 && errno == EINTR);
    if (got <= 0) {
        t->read_error = got < 0 ? errno : EIO;
        return CURL_READFUNC_ABORT;
    }
    t->sent += got;
    return (size_t)got;
}

/* libcurl resends a request itself when a reused connection turns out
 * dead: the body is rewound to its start. */
static int on_seek(void *ctx, curl_off_t offset, int origin)
{
    transfer *t = ctx;
    if (origin != SEEK_SET || offset < 0) return CURL_SEEKFUNC_CANTSEEK;
    t->sent = (int64_t)offset;
    return CURL_SEEKFUNC_OK;
}

/* A transfer during which no byte moves, either way, for the stall time is
 * given up (libcurl's low-speed limit averages over seconds and counts the
 * request body just sent, so a server that stops answering was waited on
 * far longer than asked). */
static int on_progress(void *ctx, curl_off_t down_total, curl_off_t down_now, curl_off_t up_total,
                       curl_off_t up_now)
{
    (void)down_total;
    transfer *t = ctx;
    /* Stopped while the body is being sent (on_send is not called while
     * the server is slow to take it). A body all sent is let be answered:
     * cut off then, the server might make the object after the upload's
     * clean-up removed what was there. */
    if (t->writes && up_now < up_total && store_stopping()) {
        t->stopped = 1;
        return 1;
    }
    double now = now_seconds();
    if (now > t->deadline) {
        t->late = 1;
        return 1;
    }
    curl_off_t moved = down_now + up_now;
    if (moved != t->moved || t->moved_at == 0) {
        t->moved = moved;
        t->moved_at = now;
    } else if (now - t->moved_at >= (double)policy.stall_seconds) {
        t->stalled = 1;
        return 1; /* aborts: CURLE_ABORTED_BY_CALLBACK */
    }
    /* A trickle (a byte every few seconds) is progress that never ends:
     * over each window of the stall time, the minimum speed must be met by
     * a transfer still moving (one that stopped is a stall, said as such). */
    if (t->window_at == 0) {
        t->window_at = now;
        t->window_moved = moved;
    } else if (now - t->window_at >= (double)policy.stall_seconds) {
        double elapsed = now - t->window_at;
        int moving = now - t->moved_at < elapsed / 2;
        if (moving && (double)(moved - t->window_moved) < (double)policy.min_speed * elapsed) {
            t->too_slow = 1;
            return 1;
        }
        t->window_at = now;
        t->window_moved = moved;
    }
    return 0;
}

/* The value of header line data (n bytes, "Name: value\r\n") when its name
 * is name (case aside), spaces and the line's end left out, into out
 * (size bytes); a value too long for out is left out. */
static void header_value(const char *data, size_t n, const char *name, char *out, size_t size)
{
    size_t name_len = strlen(name);
    if (n <= name_len || strncasecmp(data, name, name_len) != 0 || data[name_len] != ':') return;
    const char *v = data + name_len + 1;
    while (v < data + n && *v == ' ') v++;
    size_t len = (size_t)(data + n - v);
    while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' ')) len--;
    if (len >= size) return;
    memcpy(out, v, len);
    out[len] = '\0';
}

static size_t on_header(char *data, size_t size, size_t count, void *ctx)
{
    transfer *t = ctx;
    size_t n = size * count;
    long first, last, total;
    if (n > 14 && !strncasecmp(data, "Content-Range:", 14)) {
        char star;
        if (sscanf(data + 14, " bytes %ld-%ld/%ld", &first, &last, &total) == 3)
            t->response->range_first = first, t->response->range_last = last, t->response->range_total = total;
        else if (sscanf(data + 14, " bytes %ld-%ld/%c", &first, &last, &star) == 3 && star == '*')
            t->response->range_first = first, t->response->range_last = last, t->response->range_total = -1;
        else if (sscanf(data + 14, " bytes */%ld", &total) == 1) /* a 416's: the size alone */
            t->response->range_total = total;
    }
    header_value(data, n, "ETag", t->response->etag, sizeof t->response->etag);
    char date[64] = "";
    struct tm tm = {0};
    header_value(data, n, "Date", date, sizeof date); /* "Tue, 01 Dec 2026 04:43:25 GMT" (RFC 9110's IMF-fixdate) */
    const char *parsed = date[0] ? strptime(date, "%a, %d %b %Y %H:%M:%S GMT", &tm) : NULL;
    if (parsed && !*parsed) t->response->server_time = (int64_t)timegm(&tm);
    header_value(data, n, "x-amz-bucket-region", t->response->bucket_region, sizeof t->response->bucket_region);
    header_value(data, n, "x-amz-server-side-encryption", t->response->encryption, sizeof t->response->encryption);
    char customer[64] = "";
    header_value(data, n, "x-amz-server-side-encryption-customer-algorithm", customer, sizeof customer);
    if (customer[0]) snprintf(t->response->encryption, sizeof t->response->encryption, "SSE-C");
    return n;
}

/* ---------------------------------------------------------------- perform */

int http_status_transient(long code)
{
    return code >= 500 || code == 429 || code == 408;
}

int http_error_code_transient(const char *body)
{
    return strstr(body, "<Code>InternalError</Code>") || strstr(body, "<Code>ServiceUnavailable</Code>") ||
           strstr(body, "<Code>SlowDown</Code>");
}

int http_answer_transient(const http_response *r)
{
    if (r->error_in_ok) return http_error_code_transient(r->error_body);
    if (r->code == 400) return strstr(r->error_body, "<Code>BadDigest</Code>") != NULL;
    return http_status_transient(r->code);
}

int http_status_throttled(const char *method, const http_response *r)
{
    return r->code == 429 ||
           (r->code == 503 && (!strcmp(method, "HEAD") || strstr(r->error_body, "<Code>SlowDown</Code>")));
}

static int curl_transient(CURLcode code)
{
    switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SEND_FAIL_REWIND:
        return 1;
    default:
        return 0;
    }
}

/* The wait before attempt + 1: exponential with full jitter in its upper
 * half, so that many threads hitting one overloaded server do not come
 * back in step. */
static long backoff_ms(int attempt)
{
    long ms = policy.backoff_ms;
    for (int i = 0; i < attempt && ms < BACKOFF_MAX_MS; i++) ms *= 2;
    if (ms > BACKOFF_MAX_MS) ms = BACKOFF_MAX_MS;
    return ms / 2 + (ms > 1 ? rand() % (ms / 2 + 1) : 0);
}

/* Waits ms before the next attempt of q; a write's wait ends early once the
 * process is being stopped (it is not sent again: http_perform). */
static void sleep_ms(const http_request *q, long ms)
{
    const long slice = 50;
    for (long left = ms; left > 0; left -= slice) {
        if (request_writes(q->method) && store_stopping()) return;
        long now = left < slice ? left : slice;
        struct timespec ts = {now / 1000, (now % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) && errno == EINTR) {
        }
    }
}

/* ------------------------------------------------------------ throttling */

/* A throttled stretch is the process's, not a request's (http.h): the
 * requests of one command follow one another, and each waiting out the
 * allowance afresh made a store that never stopped throttling hold
 * `tp-ckpt info` silent for 1,310 s with the default 600. A request that
 * waits asks again at least every BACKOFF_MAX_MS; when no throttled answer
 * came for THROTTLE_GAP_SECONDS nobody was waiting, and the next one
 * begins a stretch of its own (a trainer's next checkpoint, an hour after
 * one that the store refused). */
#define THROTTLE_GAP_SECONDS 60.0
/* A notice once a stretch has lasted this long (a store pacing a burst of
 * readers for a moment is no news), then at most every
 * THROTTLE_NOTICE_EVERY seconds, whatever the stretch. */
#define THROTTLE_NOTICE_AFTER 1.0
#define THROTTLE_NOTICE_EVERY 30.0

static pthread_mutex_t throttle_lock = PTHREAD_MUTEX_INITIALIZER;
static double stretch_began = -1;     /* the stretch's first throttled answer; -1: none under way */
static double stretch_last;           /* its latest throttled answer */
static double last_notice = -1e9;     /* when a notice last went out */
static store_notice_fn notice_fn;     /* the program's (store_set_notice) */
static void *notice_ctx;

void store_set_notice(store_notice_fn fn, void *ctx)
{
    pthread_mutex_lock(&throttle_lock);
    notice_fn = fn;
    notice_ctx = ctx;
    pthread_mutex_unlock(&throttle_lock);
}

void store_notify(const char *text)
{
    pthread_mutex_lock(&throttle_lock);
    store_notice_fn fn = notice_fn;
    void *ctx = notice_ctx;
    pthread_mutex_unlock(&throttle_lock);
    if (fn) fn(ctx, text);
}

/* The answer that made a request throttled, for notices and errors. */
static void throttle_reason(const http_response *r, char *out, size_t size)
{
    snprintf(out, size, "HTTP %ld%s", r->code, strstr(r->error_body, "<Code>SlowDown</Code>") ? " SlowDown" : "");
}

/* An answer that was served (no throttling, no failure): the store takes
 * requests again, and the stretch, if any, is over. */
static void throttle_served(void)
{
    pthread_mutex_lock(&throttle_lock);
    stretch_began = -1;
    pthread_mutex_unlock(&throttle_lock);
}

/* A throttled answer to q: the seconds of the allowance left (<= 0: it is
 * spent), and in *waited how long the stretch or this request (since
 * *request_since, its first throttled answer), whichever began first, has
 * lasted. Tells the program, now and then, that the store is throttling. */
static double throttle_answered(const http_request *q, const http_response *r, double *request_since,
                                double *waited)
{
    double now = now_seconds();
    if (*request_since < 0) *request_since = now;
    char text[1024] = "";
    store_notice_fn fn = NULL;
    void *ctx = NULL;
    pthread_mutex_lock(&throttle_lock);
    if (stretch_began < 0 || now - stretch_last > THROTTLE_GAP_SECONDS) stretch_began = now;
    stretch_last = now;
    double since = stretch_began < *request_since ? stretch_began : *request_since;
    *waited = now - since;
    double left = (double)policy.throttle_seconds - *waited;
    if (left > 0 && *waited >= THROTTLE_NOTICE_AFTER && now - last_notice >= THROTTLE_NOTICE_EVERY && notice_fn) {
        last_notice = now;
        fn = notice_fn;
        ctx = notice_ctx;
        char reason[64];
        throttle_reason(r, reason, sizeof reason);
        snprintf(text, sizeof text,
                 "the store is throttling (%s to %s %s); waiting, %.0f s of %ld s allowed (TP_REMOTE_THROTTLE_SECONDS)",
                 reason, q->method, q->url, *waited, policy.throttle_seconds);
    }
    pthread_mutex_unlock(&throttle_lock);
    if (fn) fn(ctx, text);
    return left;
}

static int attempt_once(CURL *curl, const http_request *q, http_response *r, CURLcode *code_out,
                        char *why, size_t why_size)
{
    transfer t = {.curl = curl, .request = q, .response = r, .fd = -1, .writes = request_writes(q->method)};
    r->received = 0;
    r->error_body[0] = '\0';
    r->code = 0;
    r->content_length = -1;
    r->etag[0] = '\0';
    r->bucket_region[0] = '\0';
    r->encryption[0] = '\0';
    r->error_in_ok = 0;
    r->server_time = 0;
    r->range_first = r->range_last = r->range_total = -1;
    if (q->body_out) q->body_out->size = 0;
    /* The deadline of this attempt: its bytes at the minimum speed, and
     * twice the stall time for the answer to begin and end. */
    double bytes = (double)(q->dst ? q->dst_size : q->body_max ? q->body_max : 0) +
                   (double)(q->body ? q->body_size : q->body_file ? (size_t)q->body_length : 0);
    if (q->body_out && !q->body_max) bytes = 0;
    t.allowed = 2.0 * (double)policy.stall_seconds + (policy.min_speed > 0 ? bytes / (double)policy.min_speed : 1e9);
    t.deadline = now_seconds() + t.allowed;
    if (q->body_file) {
        t.fd = open(q->body_file, O_RDONLY | O_CLOEXEC);
        if (t.fd < 0) return tp_fail(TP_ERR_IO, "%s: cannot open to upload: %s", q->body_file, strerror(errno));
    }
    struct curl_slist *list = NULL, *grown;
    int status = TP_OK;
    const char *const *signed_headers = NULL;
    if (q->sign) status = q->sign(q->sign_ctx, &signed_headers);
    /* No "Expect: 100-continue": a round trip per upload for nothing. */
    const char *fixed[] = {"Expect:", NULL};
    const char *const *groups[] = {fixed, q->headers, signed_headers};
    for (int g = 0; !status && g < 3; g++)
        for (const char *const *h = groups[g]; h && *h; h++) {
            grown = curl_slist_append(list, *h);
            if (!grown) {
                status = tp_fail(TP_ERR_NOMEM, "out of memory");
                break;
            }
            list = grown;
        }
    if (status) {
        curl_slist_free_all(list);
        if (t.fd >= 0) close(t.fd);
        return status;
    }
    int has_body = q->body || q->body_file;
    curl_easy_setopt(curl, CURLOPT_URL, q->url);
    curl_easy_setopt(curl, CURLOPT_SHARE, share);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, policy.stall_seconds);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L * 1024);
    if (q->fresh_connection) curl_easy_setopt(curl, CURLOPT_FRESH_CONNECT, 1L);
    if (q->range) curl_easy_setopt(curl, CURLOPT_RANGE, q->range);
    if (!strcmp(q->method, "HEAD"))
        curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    else if (has_body) {
        curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, 512L * 1024);
        curl_easy_setopt(curl, CURLOPT_READFUNCTION, on_send);
        curl_easy_setopt(curl, CURLOPT_READDATA, &t);
        curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(curl, CURLOPT_SEEKDATA, &t);
        curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
                         (curl_off_t)(q->body ? (int64_t)q->body_size : q->body_length));
        if (strcmp(q->method, "PUT")) curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, q->method);
    } else if (strcmp(q->method, "GET"))
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, q->method);
    CURLcode code = curl_easy_perform(curl);
    curl_slist_free_all(list);
    if (t.fd >= 0) close(t.fd);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r->code);
    curl_off_t length = -1;
    if (curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK) r->content_length = length;
    *code_out = code;
    if (t.stopped)
        return tp_fail(TP_ERR_STATE, "%s %s: cut off: the process is being stopped by a signal", q->method, q->url);
    if (t.read_error)
        return tp_fail(TP_ERR_IO, "%s: read failed while uploading it: %s", q->body_file, strerror(t.read_error));
    /* A server that ignores Range sends the whole object: not more data
     * than asked, but no ranged reads at all (a transport's fault, not the
     * object's). */
    if (t.overflow && q->dst && q->range && r->code == 200)
        return tp_fail(TP_ERR_IO, "%s: the server answered a ranged GET (bytes %s) with the whole object (HTTP 200%s%lld "
                       "bytes): ranges not supported? Reading in place needs a server that honours Range",
                       q->url, q->range, r->content_length >= 0 ? ", " : "", (long long)r->content_length);
    if (t.overflow && q->dst && r->code >= 200 && r->code < 300)
        return tp_fail(TP_ERR_FORMAT, "%s: the server sent more than the %zu bytes asked for", q->url, q->dst_size);
    if (t.overflow && q->body_out && r->code >= 200 && r->code < 300)
        return tp_fail(TP_ERR_FORMAT, "%s: answer longer than %zu bytes", q->url, q->body_max);
    if (q->body_out && q->body_out->failed) return tp_fail(TP_ERR_NOMEM, "out of memory reading %s", q->url);
    if (t.stalled) {
        *code_out = CURLE_OPERATION_TIMEDOUT; /* transient: retried */
        snprintf(why, why_size, "timed out: no byte moved for %ld s (TP_REMOTE_TIMEOUT)", policy.stall_seconds);
    } else if (t.too_slow) {
        *code_out = CURLE_OPERATION_TIMEDOUT;
        snprintf(why, why_size, "too slow: under %ld bytes/s for %ld s (TP_REMOTE_MIN_SPEED, TP_REMOTE_TIMEOUT)",
                 policy.min_speed, policy.stall_seconds);
    } else if (t.late) {
        *code_out = CURLE_OPERATION_TIMEDOUT;
        snprintf(why, why_size, "not done within %.0f s (its size at TP_REMOTE_MIN_SPEED, and 2 x TP_REMOTE_TIMEOUT)",
                 t.allowed);
    } else if (code == CURLE_PARTIAL_FILE) { /* the connection closed before the body's announced end */
        curl_off_t got = 0;
        curl_easy_getinfo(curl, CURLINFO_SIZE_DOWNLOAD_T, &got);
        if (r->content_length >= 0)
            snprintf(why, why_size, "a short body from the server: the connection closed after %lld of the %lld "
                     "bytes its Content-Length announced", (long long)got, (long long)r->content_length);
        else
            snprintf(why, why_size, "a short body from the server: the connection closed after %lld bytes, before "
                     "the body's announced end", (long long)got);
    } else if (code != CURLE_OK && !t.unread_cut && !(t.overflow && r->code >= 300))
        snprintf(why, why_size, "%s", curl_easy_strerror(code));
    else if (r->code == 206 && q->dst && r->range_first >= 0 && r->range_last >= r->range_first &&
             r->received < (size_t)(r->range_last - r->range_first + 1)) {
        /* A body shorter than the bytes its Content-Range names (its
         * Content-Length agreeing with the body): cut short on the way, as
         * a dropped connection would; retried like one. */
        *code_out = CURLE_PARTIAL_FILE;
        snprintf(why, why_size, "a short body from the server: %zu of the %lld bytes its Content-Range (bytes "
                 "%lld-%lld) names came", r->received, (long long)(r->range_last - r->range_first + 1),
                 (long long)r->range_first, (long long)r->range_last);
    } else
        *code_out = CURLE_OK;
    /* S3's 200 before the work, and the work's failure in the body. */
    if (*code_out == CURLE_OK && q->ok_may_carry_error && r->code >= 200 && r->code < 300 && q->body_out &&
        q->body_out->data && strstr(q->body_out->data, "<Error>")) {
        r->error_in_ok = 1;
        snprintf(r->error_body, sizeof r->error_body, "%s", q->body_out->data);
    }
    return TP_OK;
}

long store_requests_given_up(void)
{
    return atomic_load(&requests_given_up);
}

int http_perform(const http_request *q, http_response *r)
{
    CURL *curl = NULL;
    TP_TRY(thread_handle(&curl));
    memset(r, 0, sizeof *r);
    char why[256] = "";
    double throttled_since = -1; /* when the server first asked this request to slow down */
    for (int attempt = 0, counted = 0;; attempt++) {
        if (request_writes(q->method) && store_stopping()) /* a retry too: store/staging.h store_stopping */
            return tp_fail(TP_ERR_STATE, "%s %s: not sent: the process is being stopped by a signal", q->method, q->url);
        CURLcode code = CURLE_OK;
        why[0] = '\0';
        TP_TRY(attempt_once(curl, q, r, &code, why, sizeof why));
        r->attempts = attempt + 1;
        if (code != CURLE_OK && code != CURLE_COULDNT_CONNECT && code != CURLE_COULDNT_RESOLVE_HOST &&
            code != CURLE_COULDNT_RESOLVE_PROXY)
            r->unanswered++;
        int transient = code != CURLE_OK ? curl_transient(code) : http_answer_transient(r);
        if (code == CURLE_OK && !transient) {
            throttle_served();
            return TP_OK;
        }
        if (code == CURLE_OK && policy.throttle_seconds > 0 && http_status_throttled(q->method, r)) {
            /* Paced, not failing: not a retry, but within the allowance of
             * the whole stretch; the wait never runs past its end. */
            double waited, left = throttle_answered(q, r, &throttled_since, &waited);
            if (left <= 0) {
                atomic_fetch_add(&requests_given_up, 1);
                char reason[64];
                throttle_reason(r, reason, sizeof reason);
                return tp_fail(TP_ERR_IO, "%s %s: the store kept asking to slow down (%s) for %.0f s, as long as "
                               "TP_REMOTE_THROTTLE_SECONDS allows (%ld); given up after %d attempt%s", q->method,
                               q->url, reason, waited, policy.throttle_seconds, attempt + 1, attempt ? "s" : "");
            }
            long ms = backoff_ms(attempt);
            sleep_ms(q, (double)ms < left * 1000 ? ms : (long)(left * 1000) + 1);
            continue;
        }
        if (!transient || counted >= policy.retries) {
            if (transient) atomic_fetch_add(&requests_given_up, 1);
            if (code == CURLE_OK) return TP_OK; /* a 5xx after every retry: the caller names it */
            return tp_fail(TP_ERR_IO, "%s %s: %s (after %d attempts)", q->method, q->url, why, attempt + 1);
        }
        counted++;
        /* Said as it happens: a store that cannot be reached otherwise held
         * a command silent for minutes (7 attempts of TP_REMOTE_TIMEOUT
         * each) before its one error. */
        long ms = backoff_ms(attempt);
        char text[1024], answer[32];
        snprintf(answer, sizeof answer, "HTTP %ld%s", r->code, r->error_in_ok ? " carrying an error" : "");
        snprintf(text, sizeof text, "%s %s: %s; retry %d of %d in %.1f s (TP_REMOTE_RETRIES)", q->method, q->url,
                 code != CURLE_OK ? why : answer, counted, policy.retries, (double)ms / 1000);
        store_notify(text);
        sleep_ms(q, ms);
    }
}

/* ------------------------------------------------------------ URL coding */

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

void http_decode(char *s)
{
    char *out = s;
    for (const char *c = s; *c; c++) {
        int hi, lo;
        if (*c == '%' && (hi = hex_value(c[1])) >= 0 && (lo = hex_value(c[2])) >= 0) {
            *out++ = (char)(hi * 16 + lo);
            c += 2;
        } else
            *out++ = *c;
    }
    *out = '\0';
}
