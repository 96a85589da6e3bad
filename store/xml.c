/* xml.c: the few elements of an object store's answers (listings, errors,
 * multipart uploads) found by a small scanner that knows no DTD, and the
 * checks that make a listing it cannot read an error rather than an empty
 * listing. */
#include <stdio.h>
#include <string.h>

#include "../common/error.h"
#include "xml.h"

/* The first element <tag> (any namespace prefix) in [p, end): its text
 * between *text and *text_end; returns where the element ends, or NULL. */
const char *xml_element(const char *p, const char *end, const char *tag, const char **text, const char **text_end)
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
void xml_text(const char *text, const char *text_end, char *out, size_t out_size)
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

int xml_check_listing(const char *body, size_t size, const char *root, const char *url)
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
