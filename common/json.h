/* json.h: JSON that comes from files (objects, all of them), parsed within
 * bounds, and numbers written as JSON by hand (printf'ed lines): parsing may allocate at most TP_JSON_MEMORY_PER_BYTE bytes per
 * byte of text, plus a MiB (a real file needs a few; cJSON takes 40 for an
 * array of small numbers), only white space may follow the value, and no
 * object holds a key twice.
 * Every library that reads JSON from a file parses it here. */
#ifndef TP_JSON_H
#define TP_JSON_H

#include <stddef.h>
#include <stdint.h>

#define TP_JSON_MEMORY_PER_BYTE 16

struct cJSON;

/* Parses length bytes of text into *out (cJSON_Delete frees it); a
 * tp_status, errors naming `what` (a NUL inside, too much memory, not one
 * JSON value, text after it, a key twice in one object: named by its path,
 * since cJSON reads the first value and Python's json the last). */
int tp_json_parse(const char *text, size_t length, const char *what, struct cJSON **out);

/* Where a value lies in a text: its first byte and its length. */
typedef struct {
    size_t offset, length;
} tp_json_span;

/* Parses a JSON object as tp_json_parse does, except the elements of its
 * array member `deferred` (the first member of that name): in *out that
 * member is an empty array, and *spans (malloc'ed, *count of them; NULL when
 * none) says where each element lies in text, to be parsed one at a time
 * with tp_json_parse. cJSON's tree takes 5 to 11 bytes of memory a byte of an
 * index.json, almost all of it its tensors; one at a time, the tree never
 * holds more than one tensor. Without such a member, or where it is not an
 * array, *out is the whole text's tree. Errors are tp_json_parse's of the
 * whole text; what the elements hold is checked as each is parsed. */
int tp_json_parse_deferring(const char *text, size_t length, const char *what, const char *deferred,
                            struct cJSON **out, tp_json_span **spans, int64_t *count);

/* The offset of the first byte of text that does not begin a valid UTF-8
 * sequence (overlong forms, surrogates and code points past U+10FFFF are
 * invalid, as in Rust's from_utf8, so the safetensors reference reader), or
 * -1 when all length bytes are valid. cJSON does not check: it reads any
 * bytes into names. */
int64_t tp_utf8_invalid_at(const char *text, size_t length);

/* length bytes of text, printable for a one-line message: bytes outside
 * printable ASCII, and backslashes, as \xNN, so that a name from a file
 * never sends raw bytes (a terminal's escape sequences, invalid UTF-8) to a
 * terminal. At most size - 1 characters are written, whole escapes only,
 * and a NUL; size 4 * length + 1 holds any text. */
void tp_text_escape(const char *text, size_t length, char *out, size_t size);

/* Bytes tp_json_number may write, its NUL included. */
#define TP_JSON_NUMBER_MAX 64

/* value as a JSON number printed with format (a printf conversion of one
 * double, e.g. "%.9g"), or null when it is not finite. JSON has no NaN or
 * infinity: a line holding `nan` is no JSON at all (cJSON, jq and Python's
 * json refuse it), so a diverged run's log went unread; cJSON writes null
 * for them too. A finite number that format would print longer than the
 * buffer (%.3f of 1e300) is printed with %.9g. Every number a program
 * prints into JSON by hand goes through here. Returns out, to print with %s. */
const char *tp_json_number(char out[TP_JSON_NUMBER_MAX], const char *format, double value);

#endif
