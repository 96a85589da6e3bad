/* webdav.c: the store of http(s):// URLs, a server taking PUT (whole
 * files, creating the directories on the way or taking MKCOL), ranged GET,
 * DELETE, PROPFIND (listing, Depth 0 and 1) and MKCOL: WebDAV-style
 * (docs/STORES.md). Files are read through object.c; names are PROPFIND's.
 * Credentials never travel in a URL: one with user information is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/error.h"
#include "../common/path.h"
#include "object.h"
#include "xml.h"

/* Sends a request: the URL is the path itself, without query or fragment,
 * in its canonical form (tp_path_canonical: "run//x" is "run/x", as a
 * directory given with a trailing slash and joined to reads). */
static int webdav_send(const object_call *c, http_response *r)
{
    char host[512], url[TP_PATH_MAX + 2];
    const char *rest;
    TP_TRY(tp_url_refuse_unencoded(c->path)); /* every request passes here */
    TP_TRY(object_split_authority(c->path, host, sizeof host, &rest));
    if (strchr(rest, '?') || strchr(rest, '#') || c->num_query)
        return tp_fail(TP_ERR_ARG, "%s: a checkpoint URL takes no query or fragment", c->path);
    if (tp_path_canonical(c->path, url, sizeof url)) return tp_fail(TP_ERR_ARG, "%s: URL too long", c->path);
    http_request q = c->http;
    q.url = url;
    return http_perform(&q, r);
}

typedef struct {
    int exists, is_dir;
    int64_t size;
} dav_entry;

/* The path of a listed href, decoded, trailing slashes taken (a
 * collection's): an absolute URL's path (its host not compared: a proxy
 * may name the server otherwise), an absolute path as it is, and a
 * relative reference resolved against the request's path (RFC 3986: in
 * place of its last segment; request_path as sent, "/run/" for a listing). */
static int href_path(const char *href, const char *request_path, char *out, size_t size)
{
    const char *path = href;
    if (strstr(href, "://")) {
        const char *s = strstr(href, "://") + 3;
        path = s + strcspn(s, "/");
    }
    int base = (int)(strrchr(request_path, '/') ? strrchr(request_path, '/') - request_path + 1 : 0);
    int n = path[0] == '/' ? snprintf(out, size, "%s", path)
            : path[0]      ? snprintf(out, size, "%.*s%s", base, request_path, path)
                           : snprintf(out, size, "%s", request_path); /* "": the request itself */
    if (n < 0 || (size_t)n >= size) return tp_fail(TP_ERR_ARG, "%s: a name too long", href);
    http_decode(out);
    size_t len = strlen(out);
    while (len && out[len - 1] == '/') out[--len] = '\0';
    return TP_OK;
}

/* PROPFIND of a path (Depth 0: itself; 1: and its entries, visited by name). */
static int dav_propfind(const char *path, int depth, dav_entry *self, int (*visit)(void *ctx, const char *name),
                        void *ctx)
{
    char url[TP_PATH_MAX + 2];
    const char *depth_header = depth ? "Depth: 1" : "Depth: 0";
    const char *headers[] = {depth_header, "Content-Type: application/xml", NULL};
    static const char body[] = "<?xml version=\"1.0\" encoding=\"utf-8\"?><D:propfind xmlns:D=\"DAV:\"><D:prop>"
                               "<D:resourcetype/><D:getcontentlength/></D:prop></D:propfind>";
    if (tp_path_canonical(path, url, sizeof url)) return tp_fail(TP_ERR_ARG, "%s: URL too long", path);
    byte_buffer answer = {0};
    http_response r;
    memset(self, 0, sizeof *self);
    int status = TP_OK;
    for (int tries = 0; tries < 2; tries++) {
        object_call c = {.path = url,
            .http = {.method = "PROPFIND", .headers = headers, .body = body, .body_size = sizeof body - 1,
                     .body_out = &answer, .body_max = OBJECT_LIST_MAX}};
        status = webdav_send(&c, &r);
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
                     : object_answer_error("PROPFIND", path, &r);
    /* The request's own path, to tell itself from its entries. */
    char host[512], own[TP_PATH_MAX];
    const char *own_path = NULL;
    if (!status) status = object_split_authority(url, host, sizeof host, &own_path);
    if (!status) {
        snprintf(own, sizeof own, "%s", own_path);
        http_decode(own);
        size_t n = strlen(own);
        while (n && own[n - 1] == '/') own[--n] = '\0';
    }
    if (!status) status = xml_check_listing(answer.data ? answer.data : "", answer.size, "multistatus", path);
    const char *p = answer.data ? answer.data : "", *end = p + answer.size, *text, *text_end, *next;
    for (const char *q = p; !status && (next = xml_element(q, end, "response", &text, &text_end)); q = next) {
        const char *h, *h_end, *x, *x_end;
        if (!xml_element(text, text_end, "href", &h, &h_end)) continue;
        char href[TP_PATH_MAX];
        status = xml_text(h, h_end, href, sizeof href);
        if (status) {
            status = tp_fail_context(status, "%s: a name in the server's listing", path);
            break;
        }
        char entry[TP_PATH_MAX];
        if ((status = href_path(href, own_path, entry, sizeof entry))) {
            status = tp_fail_context(status, "%s: a name in the server's listing", path);
            break;
        }
        size_t n = strlen(href);
        int slash = n && href[n - 1] == '/';
        int is_dir = slash || (xml_element(text, text_end, "collection", &x, &x_end) != NULL);
        int64_t size = 0;
        if (xml_element(text, text_end, "getcontentlength", &x, &x_end)) {
            char number[32];
            if (xml_text(x, x_end, number, sizeof number)) number[0] = '\0'; /* no size said */
            size = strtoll(number, NULL, 10);
        }
        if (!strcmp(entry, own)) {
            *self = (dav_entry){1, is_dir, size};
            continue;
        }
        /* An entry is own/NAME: its name was the href's last segment,
         * whatever came before it, so that an entry of another collection
         * (a server listing elsewhere, an href written under another root
         * than the request's, a '/' encoded in a name) became a name of
         * this one, and the request's own entry, not recognised, made the
         * collection absent. */
        size_t own_len = strlen(own);
        const char *name = entry + own_len + 1;
        if (strncmp(entry, own, own_len) || entry[own_len] != '/' || !*name || strchr(name, '/')) {
            status = tp_fail(TP_ERR_FORMAT, "%s: the server's listing names '%s' (href %s), which is not %s: a "
                             "listing of something else, refused rather than taken as a name of %s", path, entry,
                             href, depth ? "the collection or an entry of it" : "the resource asked for", path);
            break;
        }
        if (visit) status = visit(ctx, name);
    }
    free(answer.data);
    return status;
}

/* ---------------------------------------------------------------- names */

static int webdav_stat(const store_ops *s, const char *path, store_stat *out)
{
    (void)s;
    dav_entry e;
    memset(out, 0, sizeof *out);
    TP_TRY(dav_propfind(path, 0, &e, NULL, NULL));
    *out = (store_stat){e.exists, e.is_dir, e.size};
    return TP_OK;
}

static int webdav_list(const store_ops *s, const char *dir, int (*visit)(void *ctx, const char *name), void *ctx)
{
    (void)s;
    char url[TP_PATH_MAX + 2];
    snprintf(url, sizeof url, "%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/");
    dav_entry self;
    TP_TRY(dav_propfind(url, 1, &self, visit, ctx));
    return self.exists ? TP_OK : tp_fail(TP_ERR_NOT_FOUND, "%s: cannot list: no such directory", dir);
}

static int webdav_make_dir(const store_ops *s, const char *path)
{
    (void)s;
    char url[TP_PATH_MAX + 2];
    snprintf(url, sizeof url, "%s/", path);
    object_call c = {.path = url, .http = {.method = "MKCOL"}};
    http_response r;
    TP_TRY(webdav_send(&c, &r));
    if (r.code == 405) return tp_fail(TP_ERR_EXISTS, "%s: cannot create: it exists", path);
    return r.code >= 200 && r.code < 300 ? TP_OK : object_answer_error("MKCOL", path, &r);
}

static int webdav_remove_tree(const store_ops *s, const char *path)
{
    store_stat st;
    TP_TRY(webdav_stat(s, path, &st));
    if (!st.exists) return TP_OK;
    if (!st.is_dir) return object_delete(s, path);
    char url[TP_PATH_MAX + 2];
    snprintf(url, sizeof url, "%s/", path);
    const char *headers[] = {"Depth: infinity", NULL};
    return object_delete_at(s, url, headers, path);
}

/* A server takes one PUT per file, however large. */
static int webdav_put_file(const store_ops *s, const char *path, const char *local_path, int64_t offset,
                           int64_t length, int threads)
{
    (void)threads;
    return object_put_file(s, path, local_path, offset, length);
}

static const object_protocol webdav_protocol = {.send = webdav_send};

static const store_ops webdav_store = {.name = "webdav",
                                       OBJECT_STORE_OPS,
                                       .stat = webdav_stat,
                                       .list = webdav_list,
                                       .make_dir = webdav_make_dir,
                                       .remove_tree = webdav_remove_tree,
                                       .put_file = webdav_put_file,
                                       .impl = &webdav_protocol};

const store_ops *store_webdav(void)
{
    return &webdav_store;
}
