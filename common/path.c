/* path.c: joining and splitting paths. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "path.h"

int tp_path_join(char *out, const char *dir, const char *name)
{
    /* A directory named with trailing slashes ("run/", a URL pasted with
     * one) is the same directory: joined with one separator, never
     * "run//name", which an object store takes for another key. The "//"
     * of a scheme stays. */
    size_t a = strlen(dir), b = strlen(name);
    while (a > 0 && dir[a - 1] == '/' && !(a >= 3 && dir[a - 2] == '/' && dir[a - 3] == ':')) a--;
    if (a + 1 + b + 1 > TP_PATH_MAX)
        return tp_fail(TP_ERR_ARG, "path %.*s/%s is longer than %d bytes", (int)a, dir, name, TP_PATH_MAX);
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return TP_OK;
}

/* A URL's path (from its first '/', single slashes) with its "." and ".."
 * segments taken, in place (RFC 3986 5.2.4): what curl sends for it and a
 * server resolves, so that the names a store compares are those it is sent.
 * ".." at the root stays at the root; a path ending in a dot segment ends
 * with '/'; a query or fragment after it stays as it is (curl's too). */
static void remove_dot_segments(char *path)
{
    char *out = path, *in = path;
    while (*in == '/') {
        const char *segment = in + 1;
        size_t length = strcspn(segment, "/?#");
        int last = segment[length] != '/';
        if (length == 1 && segment[0] == '.') {
            if (last) *out++ = '/';
        } else if (length == 2 && segment[0] == '.' && segment[1] == '.') {
            while (out > path && *--out != '/') {
            }
            if (last) *out++ = '/';
        } else {
            memmove(out, in, length + 1); /* the '/' and the segment */
            out += length + 1;
        }
        in += length + 1;
    }
    memmove(out, in, strlen(in) + 1);
}

int tp_path_canonical(const char *path, char *out, size_t size)
{
    const char *scheme = tp_path_is_url(path) ? strstr(path, "://") + 3 : path;
    size_t n = 0, kept = (size_t)(scheme - path);
    if (kept >= size) return tp_fail(TP_ERR_ARG, "path '%s' is too long", path);
    memcpy(out, path, kept);
    n = kept;
    for (const char *c = scheme; *c; c++) {
        if (*c == '/' && n > kept && out[n - 1] == '/') continue;
        if (n + 1 >= size) return tp_fail(TP_ERR_ARG, "path '%s' is too long", path);
        out[n++] = *c;
    }
    out[n] = '\0';
    if (kept > 0) {
        char *url_path = out + kept + strcspn(out + kept, "/?#"); /* none before a query or fragment */
        if (*url_path == '/') remove_dot_segments(url_path);
    }
    return TP_OK;
}

int tp_split_path(const char *path, char *parent, size_t parent_size, char *base, size_t base_size)
{
    char copy[TP_PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof copy) return tp_fail(TP_ERR_ARG, "path '%s' is empty or too long", path);
    memcpy(copy, path, n + 1);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    char *slash = strrchr(copy, '/');
    const char *dir = ".", *name = copy;
    if (slash == copy) {
        dir = "/";
        name = copy + 1;
    } else if (slash) {
        *slash = '\0';
        dir = copy;
        name = slash + 1;
    }
    if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return tp_fail(TP_ERR_ARG, "path '%s' does not name a directory entry", path);
    if (snprintf(parent, parent_size, "%s", dir) >= (int)parent_size ||
        snprintf(base, base_size, "%s", name) >= (int)base_size)
        return tp_fail(TP_ERR_ARG, "path '%s' is too long", path);
    return TP_OK;
}

/* The places a path names: [0] its entry (its parent resolved, then its
 * name; the whole path resolved when it names no entry, as "/" or ".."),
 * [1] where it leads when it exists (links followed), else empty. */
static int resolve_places(const char *path, char places[2][TP_PATH_MAX])
{
    places[0][0] = places[1][0] = '\0';
    if (strlen(path) >= TP_PATH_MAX) return tp_fail(TP_ERR_ARG, "path '%s' is too long", path);
    char full[PATH_MAX];
    if (realpath(path, full)) snprintf(places[1], TP_PATH_MAX, "%s", full);
    else if (errno != ENOENT) return tp_fail(TP_ERR_IO, "%s: cannot resolve: %s", path, strerror(errno));
    char parent[TP_PATH_MAX], base[TP_PATH_MAX];
    if (tp_split_path(path, parent, sizeof parent, base, sizeof base) != TP_OK) {
        if (!places[1][0]) return tp_fail(TP_ERR_IO, "%s: cannot resolve: %s", path, strerror(ENOENT));
        memcpy(places[0], places[1], TP_PATH_MAX);
        return TP_OK;
    }
    if (!realpath(parent, full)) {
        if (errno != ENOENT) return tp_fail(TP_ERR_IO, "%s: cannot resolve: %s", parent, strerror(errno));
        /* Its parent does not exist either: placed by the nearest that does. */
        char above[2][TP_PATH_MAX];
        TP_TRY(resolve_places(parent, above));
        snprintf(full, sizeof full, "%s", above[0]);
    }
    return tp_path_join(places[0], strcmp(full, "/") ? full : "", base);
}

static int lies_within(const char *path, const char *outer)
{
    size_t n = strlen(outer);
    while (n > 1 && outer[n - 1] == '/') n--;
    if (n == 1 && outer[0] == '/') return path[0] == '/';
    return strncmp(path, outer, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

int tp_path_is_url(const char *path)
{
    const char *end = strstr(path, "://");
    int url = end && end > path && isalpha((unsigned char)path[0]);
    for (const char *c = path; url && c < end; c++) url = isalnum((unsigned char)*c) || strchr("+-.", *c);
    return url;
}

static int hex_value(char c)
{
    return isdigit((unsigned char)c) ? c - '0' : tolower((unsigned char)c) - 'a' + 10;
}

/* Whether an authority's host (lowercased) names this machine's loopback. */
static int loopback_host(const char *host, size_t length)
{
    if ((length == 9 && !memcmp(host, "localhost", 9)) || (length == 5 && !memcmp(host, "[::1]", 5))) return 1;
    if (length < 4 || memcmp(host, "127.", 4)) return 0;
    for (size_t i = 4; i < length; i++)
        if (!isdigit((unsigned char)host[i]) && host[i] != '.') return 0;
    return 1;
}

/* A URL in the form two spellings of one location share, for comparing:
 * escapes of unreserved characters decoded ("%73rc" is "src" to a server,
 * "%2e%2e" is ".."), the others' hex uppercased; then canonical (single
 * slashes, dot segments taken), scheme and host lowercased, user
 * information dropped, a loopback host as "localhost", the scheme's default
 * port dropped. */
static int url_comparable(const char *url, char *out, size_t size)
{
    char decoded[TP_PATH_MAX], canonical[TP_PATH_MAX], host[TP_PATH_MAX];
    size_t d = 0;
    for (const char *c = url; *c && d + 3 < sizeof decoded; c++) {
        if (c[0] == '%' && isxdigit((unsigned char)c[1]) && isxdigit((unsigned char)c[2])) {
            char byte = (char)(hex_value(c[1]) * 16 + hex_value(c[2]));
            if (isalnum((unsigned char)byte) || strchr("-._~", byte)) decoded[d++] = byte;
            else decoded[d++] = '%', decoded[d++] = (char)toupper((unsigned char)c[1]),
                 decoded[d++] = (char)toupper((unsigned char)c[2]);
            c += 2;
        } else decoded[d++] = *c;
    }
    decoded[d] = '\0';
    if (d + 3 >= sizeof decoded) return tp_fail(TP_ERR_ARG, "URL '%s' is too long", url);
    TP_TRY(tp_path_canonical(decoded, canonical, sizeof canonical));
    char *authority = strstr(canonical, "://") + 3, *after = authority + strcspn(authority, "/?#");
    char *at = memchr(authority, '@', (size_t)(after - authority));
    char *start = at ? at + 1 : authority, *colon = NULL; /* host[:port]; an IPv6 host in brackets */
    for (char *c = start; c < after; c++) colon = *c == ':' ? c : *c == ']' ? NULL : colon;
    size_t host_length = (size_t)((colon ? colon : after) - start);
    for (size_t i = 0; i < host_length; i++) host[i] = (char)tolower((unsigned char)start[i]);
    host[host_length] = '\0';
    for (char *c = canonical; c < authority; c++) *c = (char)tolower((unsigned char)*c);
    authority[-3] = '\0'; /* canonical: the scheme alone */
    const char *port = colon ? colon + 1 : after;
    int port_length = (int)(after - port);
    if ((!strcmp(canonical, "http") && port_length == 2 && !memcmp(port, "80", 2)) ||
        (!strcmp(canonical, "https") && port_length == 3 && !memcmp(port, "443", 3)))
        port_length = 0;
    int n = snprintf(out, size, "%s://%s%s%.*s%s", canonical, loopback_host(host, host_length) ? "localhost" : host,
                     port_length ? ":" : "", port_length, port, after);
    return n < 0 || (size_t)n >= size ? tp_fail(TP_ERR_ARG, "URL '%s' is too long", url) : TP_OK;
}

int tp_path_within(const char *path, const char *outer, int *within)
{
    *within = 0;
    if (tp_path_is_url(path) || tp_path_is_url(outer)) {
        if (!tp_path_is_url(path) || !tp_path_is_url(outer)) return TP_OK;
        char a[TP_PATH_MAX], b[TP_PATH_MAX];
        TP_TRY(url_comparable(path, a, sizeof a));
        TP_TRY(url_comparable(outer, b, sizeof b));
        *within = lies_within(a, b);
        return TP_OK;
    }
    char inner[2][TP_PATH_MAX], around[2][TP_PATH_MAX];
    TP_TRY(resolve_places(path, inner));
    TP_TRY(resolve_places(outer, around));
    if (!around[1][0]) return TP_OK; /* outer does not exist: nothing lies in it */
    for (int i = 0; i < 2; i++)
        for (int o = 0; o < 2; o++)
            if (inner[i][0] && around[o][0] && lies_within(inner[i], around[o])) *within = 1;
    return TP_OK;
}

/* curl refused such a URL only after a retry, as "URL using bad/illegal
 * format", from a request the user never asked about. It is refused rather
 * than encoded: encoded, "my run" and "my%20run" would be two spellings of
 * one resource that every comparison of URLs (url_comparable, which keeps
 * %20 as it is, and so an output apart from its input, a claim's or
 * lease's URL) would have to take as equal; refused, a resource keeps the
 * one spelling its server uses in its listings. An s3:// key is encoded
 * by the request's signing, and a space there is the key's own: s3:// URLs
 * take it as they always did. */
int tp_url_refuse_unencoded(const char *path)
{
    if (strncmp(path, "http://", 7) && strncmp(path, "https://", 8)) return TP_OK;
    const char *c = path;
    while (*c && (unsigned char)*c > 0x20 && *c != 0x7f) c++;
    if (!*c) return TP_OK;
    char encoded[TP_PATH_MAX];
    size_t n = 0;
    for (const char *u = path; *u && n + 4 < sizeof encoded; u++) {
        unsigned char b = (unsigned char)*u;
        if (b > 0x20 && b != 0x7f) encoded[n++] = (char)b;
        else n += (size_t)snprintf(encoded + n, sizeof encoded - n, "%%%02X", b);
    }
    encoded[n] = '\0';
    return tp_fail(TP_ERR_ARG, "%s: %s in an http(s) URL is not sent as it is: write it %%%02X (%s)", path,
                   *c == ' ' ? "a space" : "a control character", (unsigned char)*c, encoded);
}

const char *tp_temporary_dir(void)
{
    const char *tmp = getenv("TMPDIR");
    return tmp && *tmp ? tmp : "/tmp";
}

int tp_url_has_user_info(const char *path)
{
    if (!tp_path_is_url(path)) return 0;
    const char *authority = strstr(path, "://") + 3;
    return memchr(authority, '@', strcspn(authority, "/?#")) != NULL;
}
