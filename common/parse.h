/* parse.h: numbers and sizes from text, for command lines and model options,
 * and sizes as text, for what tools print. */
#ifndef TP_PARSE_H
#define TP_PARSE_H

#include <stdint.h>

/* A decimal integer within [min, max]; -1 when the text is not one. */
int parse_int(const char *text, int64_t min, int64_t max, int64_t *out);

/* A decimal integer within [min, max] as a file holds it (a world file, a
 * host file's slots=N): digits with an optional leading '-', whitespace
 * around them (spaces, tabs, newlines: `echo 4 >FILE` ends in one)
 * ignored; anything else ("1x", "+1", "1 2", "") is not one: -1. One rule
 * for every number read from such a file. */
int parse_int_in_file(const char *text, int64_t min, int64_t max, int64_t *out);

/* A size with an optional binary suffix: "512", "64K", "1.5G", "2GiB"; -1 when not one. */
int parse_size(const char *text, int64_t *out);

/* bytes as "512 B", "1.50 KiB", "2.00 GiB": binary units, two decimals. */
void format_bytes(double bytes, char *out, int out_size);

/* A finite floating-point number; -1 when the text is not one. */
int parse_double(const char *text, double *out);

#endif
