/* json.h: JSON that comes from files (objects, all of them), parsed within
 * bounds: parsing may allocate at most TP_JSON_MEMORY_PER_BYTE bytes per
 * byte of text, plus a MiB (a real file needs a few; cJSON takes 40 for an
 * array of small numbers), and only white space may follow the value.
 * Every library that reads JSON from a file parses it here. */
#ifndef TP_JSON_H
#define TP_JSON_H

#include <stddef.h>

#define TP_JSON_MEMORY_PER_BYTE 16

struct cJSON;

/* Parses length bytes of text into *out (cJSON_Delete frees it); a
 * tp_status, errors naming `what` (a NUL inside, too much memory, not one
 * JSON value, text after it). */
int tp_json_parse(const char *text, size_t length, const char *what, struct cJSON **out);

#endif
