/* json.c: JSON that comes from files is parsed within bounds. cJSON builds a
 * tree of about 40 bytes of memory per byte of input for an array of small
 * numbers; files are limited in size by their readers, and parsing may
 * allocate at most TP_JSON_MEMORY_PER_BYTE bytes per byte of text (plus a
 * MiB), so a crafted file costs memory in proportion to a real one. A key
 * twice in one object is refused: readers disagree on its value. Numbers
 * printed into JSON by hand are null when not finite. */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "json.h"

/* The budget of the parse running on this thread, if one is. */
static _Thread_local int bounded;
static _Thread_local size_t budget_left;
static _Thread_local int budget_exceeded;

static void *bounded_malloc(size_t size)
{
    if (bounded) {
        if (size > budget_left) {
            budget_left = 0;
            budget_exceeded = 1;
            return NULL;
        }
        budget_left -= size;
    }
    return malloc(size);
}

static void install_hooks(void)
{
    /* Process-wide; outside a bounded parse it is plain malloc, and cJSON
     * frees with free either way. */
    cJSON_Hooks hooks = {bounded_malloc, free};
    cJSON_InitHooks(&hooks);
}

/* cJSON ends its strings at a NUL, so a name holding one ("a\u0000b", or a raw
 * NUL byte) would be taken for its prefix: the offset of the first one, or -1.
 * Every backslash of valid JSON starts an escape inside a string, so
 * stepping over escapes two characters at a time finds each \u0000. */
static int64_t first_nul(const char *text, size_t length)
{
    for (size_t i = 0; i < length; i++) {
        if (text[i] == '\0') return (int64_t)i;
        if (text[i] != '\\' || i + 1 >= length) continue;
        if (text[i + 1] == 'u' && i + 5 < length && memcmp(text + i + 2, "0000", 4) == 0) return (int64_t)i;
        i++;
    }
    return -1;
}

static int by_string(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first key that an object under node holds twice, as its path
 * ("rope_scaling.factor", "layers[2].name") into path; 1 when there is one,
 * 0 when none, -1 out of memory. cJSON keeps both members and its lookups
 * find the first, where Python's json (and so transformers) keeps the last:
 * the same file would mean two things. Objects are checked by sorting their
 * names (a safetensors header holds 100,000). */
static int duplicate_key(const cJSON *node, char *path, size_t size, size_t at)
{
    if (!cJSON_IsObject(node) && !cJSON_IsArray(node)) return 0;
    int n = cJSON_GetArraySize(node), found = 0;
    if (cJSON_IsObject(node) && n > 1) {
        const char **names = malloc((size_t)n * sizeof *names);
        if (!names) return -1;
        int k = 0;
        const cJSON *child;
        cJSON_ArrayForEach(child, node) names[k++] = child->string;
        qsort(names, (size_t)n, sizeof *names, by_string);
        for (int i = 1; i < n && !found; i++)
            if (strcmp(names[i - 1], names[i]) == 0) {
                snprintf(path + at, size - at, "%s%s", at ? "." : "", names[i]);
                found = 1;
            }
        free(names);
        if (found) return 1;
    }
    int index = 0;
    const cJSON *child;
    cJSON_ArrayForEach(child, node)
    {
        int written = cJSON_IsObject(node) ? snprintf(path + at, size - at, "%s%s", at ? "." : "", child->string)
                                           : snprintf(path + at, size - at, "[%d]", index);
        size_t next = written < 0 || (size_t)written >= size - at ? size - 1 : at + (size_t)written;
        int deeper = duplicate_key(child, path, size, next);
        if (deeper) return deeper;
        index++;
    }
    path[at] = '\0';
    return 0;
}

/* How many values cJSON would allocate a node of 64 bytes for, at most: one
 * per comma, '[' and '{' outside strings, plus one. Counted before parsing,
 * so that a file of small numbers is refused without allocating anything. */
static size_t value_count(const char *text, size_t length)
{
    size_t count = 1;
    int in_string = 0;
    for (size_t i = 0; i < length; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == ',' || c == '[' || c == '{') {
            count++;
        }
    }
    return count;
}

int tp_json_parse(const char *text, size_t length, const char *what, struct cJSON **out)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install_hooks);
    *out = NULL;
    int64_t nul = first_nul(text, length);
    if (nul >= 0)
        return tp_fail(TP_ERR_FORMAT, "%s: a NUL character (%s) at byte %lld: names and strings cannot hold one",
                       what, text[nul] ? "\\u0000" : "a zero byte", (long long)nul);
    size_t budget = length * TP_JSON_MEMORY_PER_BYTE + ((size_t)1 << 20);
    if (value_count(text, length) > budget / sizeof(cJSON))
        return tp_fail(TP_ERR_FORMAT, "%s: %zu bytes of JSON holding %zu values would need more than %d bytes of "
                       "memory per byte to parse (not a file of this kind?)", what, length, value_count(text, length),
                       TP_JSON_MEMORY_PER_BYTE);
    budget_left = budget;
    budget_exceeded = 0;
    bounded = 1;
    const char *end = NULL;
    cJSON *value = cJSON_ParseWithLengthOpts(text, length, &end, 0);
    bounded = 0;
    int exceeded = budget_exceeded;
    budget_left = 0;
    budget_exceeded = 0;
    if (exceeded) {
        cJSON_Delete(value);
        return tp_fail(TP_ERR_FORMAT, "%s: parsing its %zu bytes of JSON needs more than %d bytes of memory per byte "
                       "(not a file of this kind?)", what, length, TP_JSON_MEMORY_PER_BYTE);
    }
    /* After the value only white space may follow. */
    while (value && end && end < text + length && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
        end++;
    if (!value || !end || end != text + length) {
        cJSON_Delete(value);
        /* Where the parse stopped (cJSON sets end there on failure too), as
         * an editor shows it: a trailing comma or a NaN (which Python's json
         * reads) in a 40-line config.json is found at a glance. */
        size_t at = end && end >= text && end <= text + length ? (size_t)(end - text) : length;
        size_t line = 1, column = 1;
        for (size_t i = 0; i < at; i++) {
            if (text[i] == '\n') line++, column = 1;
            else column++;
        }
        char near[4 * 16 + 1];
        tp_text_escape(text + at, length - at < 16 ? length - at : 16, near, sizeof near);
        return tp_fail(TP_ERR_FORMAT, "%s: not a JSON object: %s at line %zu, column %zu (byte %zu%s%s%s) (damaged or "
                       "truncated?)", what, value ? "text follows it" : "invalid JSON", line, column, at,
                       at < length ? ", at \"" : ": the end", near, at < length ? "\"" : "");
    }
    char key[512] = "";
    int twice = duplicate_key(value, key, sizeof key, 0);
    if (twice) {
        cJSON_Delete(value);
        if (twice < 0) return tp_fail(TP_ERR_NOMEM, "%s: out of memory checking its JSON for duplicate keys", what);
        return tp_fail(TP_ERR_FORMAT, "%s: key %s appears twice: JSON readers differ on which value counts "
                       "(Python's json, so transformers, takes the last, this toolkit the first); remove one",
                       what, key);
    }
    *out = value;
    return TP_OK;
}

/* ------------------------------------------ an object's array read element by element */

/* tp_json_parse_deferring finds where the deferred array's elements lie by
 * their delimiters alone, then has cJSON parse the rest of the object (the
 * array emptied) and, later, each element: the object with its elements put
 * back is valid JSON exactly when those parses succeed, since between the
 * elements only white space and commas were let through. */

/* White space as cJSON skips it: every byte up to 32. */
static int is_space(char c)
{
    return (unsigned char)c <= 32;
}

static size_t skip_space(const char *text, size_t length, size_t i)
{
    while (i < length && is_space(text[i])) i++;
    return i;
}

/* One past the closing quote of the string opening at text[i], or 0. */
static size_t string_end(const char *text, size_t length, size_t i)
{
    for (i++; i < length; i++) {
        if (text[i] == '\\') i++;
        else if (text[i] == '"') return i + 1;
    }
    return 0;
}

/* One past the end of the value starting at text[i]: a string to its closing
 * quote, an object or array to its matching bracket, anything else (a number,
 * true, false, null) to the next delimiter; 0 where it does not end. */
static size_t value_end(const char *text, size_t length, size_t i)
{
    if (i >= length) return 0;
    if (text[i] == '"') return string_end(text, length, i);
    if (text[i] == '{' || text[i] == '[') {
        size_t depth = 0;
        for (; i < length; i++) {
            char c = text[i];
            if (c == '"') {
                size_t end = string_end(text, length, i);
                if (!end) return 0;
                i = end - 1;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if ((c == '}' || c == ']') && --depth == 0) {
                return i + 1;
            }
        }
        return 0;
    }
    size_t start = i;
    while (i < length && text[i] != ',' && text[i] != '}' && text[i] != ']' && !is_space(text[i])) i++;
    return i > start ? i : 0;
}

/* Whether the string at text[start, end) says `name` once its escapes are
 * read (cJSON's reading: "tens\u006frs" is "tensors"). */
static int key_is(const char *text, size_t start, size_t end, const char *name)
{
    if (!memchr(text + start, '\\', end - start))
        return end - start == strlen(name) + 2 && !memcmp(text + start + 1, name, end - start - 2);
    cJSON *key = cJSON_ParseWithLength(text + start, end - start);
    int same = cJSON_IsString(key) && !strcmp(key->valuestring, name);
    cJSON_Delete(key);
    return same;
}

/* Finds the array under the object's first member `name`: its brackets at
 * text[*open] and text[*close], its elements' spans. 1 when found, 0 when the
 * object has no such member (or it is no array, or the text is not an object
 * as far as the delimiters show: the caller's whole parse says so), -1 out of
 * memory. */
static int find_deferred(const char *text, size_t length, const char *name, size_t *open, size_t *close,
                         tp_json_span **spans, int64_t *count)
{
    size_t i = length >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3) ? 3 : 0; /* a byte-order mark, which cJSON skips */
    i = skip_space(text, length, i);
    if (i >= length || text[i] != '{') return 0;
    for (i = skip_space(text, length, i + 1); i < length && text[i] == '"';) {
        size_t key_end = string_end(text, length, i);
        if (!key_end) return 0;
        int wanted = key_is(text, i, key_end, name);
        size_t at = skip_space(text, length, key_end);
        if (at >= length || text[at] != ':') return 0;
        at = skip_space(text, length, at + 1);
        size_t end = value_end(text, length, at);
        if (!end) return 0;
        if (wanted) {
            if (text[at] != '[') return 0;
            *open = at;
            *close = end - 1;
            int64_t capacity = 0;
            for (size_t e = skip_space(text, length, at + 1); e < *close;) {
                size_t element_end = value_end(text, length, e);
                if (!element_end || element_end > *close) return 0;
                if (*count == capacity) {
                    capacity = capacity ? 2 * capacity : 64;
                    tp_json_span *grown = realloc(*spans, (size_t)capacity * sizeof *grown);
                    if (!grown) return -1;
                    *spans = grown;
                }
                (*spans)[(*count)++] = (tp_json_span){e, element_end - e};
                e = skip_space(text, length, element_end);
                if (e < *close && text[e] != ',') return 0;
                if (e < *close) {
                    e = skip_space(text, length, e + 1);
                    if (e >= *close) return 0; /* a comma before the closing bracket */
                }
            }
            return 1;
        }
        i = skip_space(text, length, end);
        if (i >= length || text[i] != ',') return 0;
        i = skip_space(text, length, i + 1);
    }
    return 0;
}

static void forget_spans(tp_json_span **spans, int64_t *count)
{
    free(*spans);
    *spans = NULL;
    *count = 0;
}

int tp_json_parse_deferring(const char *text, size_t length, const char *what, const char *deferred,
                            struct cJSON **out, tp_json_span **spans, int64_t *count)
{
    *out = NULL;
    *spans = NULL;
    *count = 0;
    size_t open = 0, close = 0;
    int found = first_nul(text, length) < 0 ? find_deferred(text, length, deferred, &open, &close, spans, count) : 0;
    if (found < 0) {
        forget_spans(spans, count);
        return tp_fail(TP_ERR_NOMEM, "%s: out of memory listing the elements of its '%s'", what, deferred);
    }
    if (!found) {
        forget_spans(spans, count);
        int status = tp_json_parse(text, length, what, out);
        /* Found by the delimiters wherever cJSON reads it as an array. */
        const cJSON *member = status ? NULL : cJSON_GetObjectItemCaseSensitive(*out, deferred);
        if (cJSON_IsArray(member) && cJSON_GetArraySize(member) > 0) {
            cJSON_Delete(*out);
            *out = NULL;
            return tp_fail(TP_ERR_STATE, "%s: its array '%s' was not found element by element (a defect of this "
                           "build)", what, deferred);
        }
        return status;
    }
    /* The object with the array emptied: text[0, open] then text[close, length). */
    size_t rest_length = open + 1 + (length - close);
    char *rest = malloc(rest_length);
    if (!rest) {
        forget_spans(spans, count);
        return tp_fail(TP_ERR_NOMEM, "%s: out of memory", what);
    }
    memcpy(rest, text, open + 1);
    memcpy(rest + open + 1, text + close, length - close);
    int status = tp_json_parse(rest, rest_length, what, out);
    free(rest);
    if (status) {
        forget_spans(spans, count);
        /* Said of the whole text, where its line and column are. */
        cJSON *whole = NULL;
        int whole_status = tp_json_parse(text, length, what, &whole);
        cJSON_Delete(whole);
        if (whole_status) return whole_status;
        return status;
    }
    return TP_OK;
}

int64_t tp_utf8_invalid_at(const char *text, size_t length)
{
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < length;) {
        unsigned c = s[i];
        size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!n || i + n > length) return (int64_t)i;
        /* The second byte's range excludes overlong forms (E0 80..9F, F0
         * 80..8F), surrogates (ED A0..BF) and code points past U+10FFFF (F4
         * 90..BF), as the Unicode standard's table 3-7 and Rust's from_utf8. */
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        if (n > 1 && (s[i + 1] < lo || s[i + 1] > hi)) return (int64_t)i;
        for (size_t k = 2; k < n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return (int64_t)i;
        i += n;
    }
    return -1;
}

void tp_text_escape(const char *text, size_t length, char *out, size_t size)
{
    size_t at = 0;
    for (size_t i = 0; i < length && size > 0; i++) {
        unsigned char c = (unsigned char)text[i];
        char piece[5];
        if (c >= 0x20 && c < 0x7F && c != '\\') snprintf(piece, sizeof piece, "%c", c);
        else snprintf(piece, sizeof piece, "\\x%02x", c);
        size_t n = strlen(piece);
        if (at + n >= size) break; /* whole escapes only */
        memcpy(out + at, piece, n);
        at += n;
    }
    if (size > 0) out[at] = '\0';
}

const char *tp_json_number(char out[TP_JSON_NUMBER_MAX], const char *format, double value)
{
    if (!isfinite(value)) {
        snprintf(out, TP_JSON_NUMBER_MAX, "null");
        return out;
    }
    /* A fixed-point format of a huge number (%.3f of 1e300) would not fit:
     * cut short it would be no number; nine digits of it are. */
    if (snprintf(out, TP_JSON_NUMBER_MAX, format, value) >= TP_JSON_NUMBER_MAX)
        snprintf(out, TP_JSON_NUMBER_MAX, "%.9g", value);
    return out;
}
