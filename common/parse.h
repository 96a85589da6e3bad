/* parse.h: numbers and sizes from text, for command lines and model options,
 * and sizes as text, for what tools print. */
#ifndef TP_PARSE_H
#define TP_PARSE_H

#include <stdint.h>

/* What the parsers return: 0, or why the text is not taken. */
enum {
    PARSE_SYNTAX = -1,   /* not written as the parser takes it */
    PARSE_RANGE = -2,    /* out of range: beyond min..max, a double's range, 2^63 - 1 bytes */
    PARSE_FRACTION = -3, /* a size of a fraction of a byte: 1.5, 0.1K */
};

/* One rule for the numbers of command lines and model options: decimal, no
 * blanks anywhere, no '+', no hexadecimal; a '-' is the only sign.
 *
 * A decimal integer, digits with an optional leading '-' ("7", "-3", "007";
 * not " 7", "+5", "7 ", "0x10", "1e3"), within [min, max]: PARSE_SYNTAX or
 * PARSE_RANGE when the text is not one. */
int parse_int(const char *text, int64_t min, int64_t max, int64_t *out);

/* A decimal integer within [min, max] as a file holds it (a world file, a
 * host file's slots=N): digits with an optional leading '-', whitespace
 * around them (spaces, tabs, newlines: `echo 4 >FILE` ends in one)
 * ignored; anything else ("1x", "+1", "1 2", "") is not one: -1. One rule
 * for every number read from such a file. */
int parse_int_in_file(const char *text, int64_t min, int64_t max, int64_t *out);

/* A size in bytes: a decimal number ("512", "1.5") and an optional binary
 * unit, K, M, G or T (either case; 2^10, 2^20, 2^30, 2^40), followed by an
 * optional "i" and an optional "B": "64K", "1.5G", "2GiB", "4GB" (4 GiB),
 * "512B". Whole bytes only: "1.5K" is 1536, "1.5" and "0.1K" are
 * PARSE_FRACTION. No sign, blanks, exponent or hexadecimal ("1e3", "0x10",
 * "-1M", "1 G"), no lower-case "b" ("1Gb": bits, to many): PARSE_SYNTAX;
 * past 2^63 - 1 bytes, PARSE_RANGE. */
int parse_size(const char *text, int64_t *out);

/* bytes as "512 B", "1.50 KiB", "2.00 GiB": binary units, two decimals. */
void format_bytes(double bytes, char *out, int out_size);

/* A decimal floating-point number: an optional '-', digits with an optional
 * point ("3", "0.5", ".5", "5."), an optional exponent ("3e-4", "1E+5");
 * not "+1", " 1", "0x1p3", "inf", "nan": PARSE_SYNTAX. One beyond a
 * double's range ("1e999") or that would round to 0 ("1e-400"):
 * PARSE_RANGE; a subnormal one ("1e-320") is taken. */
int parse_double(const char *text, double *out);

/* Seconds from the environment variable name: fallback when it is unset
 * or empty, -1 when it is not a number (parse_double) in [min, max]. */
double parse_env_seconds(const char *name, double fallback, double min, double max);

#endif
