/* xml.c: the few elements of an object store's answers (listings, errors,
 * multipart uploads) found by a small scanner that knows no DTD, and the
 * checks that make a listing it cannot read an error rather than an empty
 * listing. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

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

/* The code point of the numeric character reference at c ("&#13;",
 * "&#x1F600;", ending before end): its length in *length, or -1 when it
 * names no character (no digits, no ';', 0, a surrogate, past U+10FFFF). */
static long character_reference(const char *c, const char *end, size_t *length)
{
    const char *p = c + 2;
    int base = 10;
    if (p < end && (*p == 'x' || *p == 'X')) base = 16, p++;
    long value = 0;
    const char *digits = p;
    for (; p < end && *p != ';'; p++) {
        int d = *p >= '0' && *p <= '9' ? *p - '0'
                : base == 16 && *p >= 'a' && *p <= 'f' ? *p - 'a' + 10
                : base == 16 && *p >= 'A' && *p <= 'F' ? *p - 'A' + 10
                                                        : -1;
        if (d < 0) return -1;
        value = value * base + d;
        if (value > 0x10FFFF) return -1;
    }
    if (p == end || p == digits || value == 0 || (value >= 0xD800 && value <= 0xDFFF)) return -1;
    *length = (size_t)(p + 1 - c);
    return value;
}

/* The UTF-8 bytes of a code point (at most 4) into out; their number. */
static size_t utf8_encode(long code, char out[4])
{
    if (code < 0x80) return out[0] = (char)code, 1;
    if (code < 0x800) return out[0] = (char)(0xC0 | code >> 6), out[1] = (char)(0x80 | (code & 0x3F)), 2;
    if (code < 0x10000)
        return out[0] = (char)(0xE0 | code >> 12), out[1] = (char)(0x80 | (code >> 6 & 0x3F)),
               out[2] = (char)(0x80 | (code & 0x3F)), 3;
    return out[0] = (char)(0xF0 | code >> 18), out[1] = (char)(0x80 | (code >> 12 & 0x3F)),
           out[2] = (char)(0x80 | (code >> 6 & 0x3F)), out[3] = (char)(0x80 | (code & 0x3F)), 4;
}

int xml_text(const char *text, const char *text_end, char *out, size_t out_size)
{
    static const struct {
        const char *entity;
        char c;
    } entities[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    size_t n = 0;
    for (const char *c = text; c < text_end; c++) {
        char bytes[4] = {*c};
        size_t count = 1;
        if (*c == '&' && text_end - c >= 2 && c[1] == '#') {
            size_t length = 0;
            long code = character_reference(c, text_end, &length);
            if (code < 0) {
                size_t shown = 0; /* the reference as written, up to its ';' (at most 24 bytes) */
                while (c + shown < text_end && shown < 24 && c[shown] != '<' && (shown == 0 || c[shown - 1] != ';'))
                    shown++;
                if (out_size) out[n] = '\0';
                return tp_fail(TP_ERR_FORMAT, "the character reference %.*s names no character (a code point "
                               "of 1 to 0x10FFFF, not a surrogate, written in decimal or after x in hex, ending "
                               "with ';')", (int)shown, c);
            }
            count = utf8_encode(code, bytes);
            c += length - 1;
        }
        for (size_t e = 0; *c == '&' && count == 1 && e < sizeof entities / sizeof *entities; e++) {
            size_t len = strlen(entities[e].entity);
            if ((size_t)(text_end - c) >= len && !memcmp(c, entities[e].entity, len)) {
                bytes[0] = entities[e].c;
                c += len - 1;
                break;
            }
        }
        if (n + count >= out_size) break; /* truncated to fit, never inside a character */
        memcpy(out + n, bytes, count);
        n += count;
    }
    if (out_size) out[n] = '\0';
    return TP_OK;
}

/* A listing answer is read with the small scanner above, which knows no
 * DTD: one holding a declaration (<!DOCTYPE, <!ENTITY: entity expansion),
 * nested deeper than any real listing, or without its root element is a
 * server's malformed answer, refused naming the URL rather than read as an
 * empty listing ("no such checkpoint"). The scanner reads UTF-8 (and so
 * ASCII): an answer in UTF-16 or UTF-32 (a byte-order mark, NUL bytes, or
 * an XML declaration naming it) is refused as an encoding not supported,
 * not taken for a malformed one ("nested deeper than 32", a UTF-16 body's
 * bytes read as tags). */
#define LISTING_DEPTH_MAX 32

/* The encoding a listing is in when it is not one the scanner reads:
 * "UTF-16" and the like, or NULL (UTF-8, with or without its byte-order
 * mark). */
static const char *unsupported_encoding(const char *body, size_t size, char *declared, size_t declared_size)
{
    const unsigned char *b = (const unsigned char *)body;
    if (size >= 4 && ((b[0] == 0xFF && b[1] == 0xFE && !b[2] && !b[3]) || (!b[0] && !b[1] && b[2] == 0xFE && b[3] == 0xFF)))
        return "UTF-32 (it begins with a byte-order mark)";
    if (size >= 2 && ((b[0] == 0xFF && b[1] == 0xFE) || (b[0] == 0xFE && b[1] == 0xFF)))
        return "UTF-16 (it begins with a byte-order mark)";
    if (memchr(body, '\0', size)) return "UTF-16 or UTF-32 (it holds NUL bytes)";
    /* <?xml version="1.0" encoding="..."?> */
    const char *end = body + size, *decl_end;
    size_t start = size >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF ? 3 : 0; /* UTF-8's mark */
    if (size >= start + 5 && !memcmp(body + start, "<?xml", 5) && (decl_end = memchr(body, '>', size)) != NULL) {
        const char *enc = NULL;
        for (const char *q = body; q + 8 <= decl_end && !enc; q++)
            if (!memcmp(q, "encoding", 8)) enc = q + 8;
        while (enc && enc < decl_end && (*enc == ' ' || *enc == '=' || *enc == '"' || *enc == '\'')) enc++;
        size_t n = 0;
        while (enc && enc + n < end && enc + n < decl_end && enc[n] != '"' && enc[n] != '\'' && n + 1 < declared_size)
            n++;
        if (enc && n) {
            memcpy(declared, enc, n);
            declared[n] = '\0';
            if (!strncasecmp(declared, "utf-16", 6) || !strncasecmp(declared, "utf-32", 6) ||
                !strncasecmp(declared, "ucs", 3))
                return declared;
        }
    }
    return NULL;
}

int xml_check_listing(const char *body, size_t size, const char *root, const char *url)
{
    char declared[64];
    const char *encoding = unsupported_encoding(body, size, declared, sizeof declared);
    if (encoding)
        return tp_fail(TP_ERR_FORMAT, "%s: the server's listing is in %s, an encoding not supported: listings are "
                       "read as UTF-8", url, encoding);
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
