/* parse.c: numbers and sizes from text, and sizes as text. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

/* Decimal digits at *text: *text moves past them; returns how many. */
static size_t skip_digits(const char **text)
{
    size_t n = 0;
    while (isdigit((unsigned char)(*text)[n])) n++;
    *text += n;
    return n;
}

int parse_int(const char *text, int64_t min, int64_t max, int64_t *out)
{
    if (!text) return PARSE_SYNTAX;
    const char *p = text + (*text == '-');
    if (!skip_digits(&p) || *p) return PARSE_SYNTAX;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || v < min || v > max) return PARSE_RANGE;
    *out = v;
    return 0;
}

int parse_int_in_file(const char *text, int64_t min, int64_t max, int64_t *out)
{
    if (!text) return -1;
    while (isspace((unsigned char)*text)) text++;
    size_t n = strlen(text);
    while (n > 0 && isspace((unsigned char)text[n - 1])) n--;
    char digits[32];
    if (n == 0 || n >= sizeof digits) return -1;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)text[i]) && !(i == 0 && text[i] == '-' && n > 1)) return -1;
    memcpy(digits, text, n);
    digits[n] = '\0';
    return parse_int(digits, min, max, out) ? -1 : 0;
}

int parse_double(const char *text, double *out)
{
    if (!text) return PARSE_SYNTAX;
    /* -?(D+(.D*)?|.D+)(e[+-]?D+)?: strtod alone also takes blanks, '+',
     * hexadecimal, inf and nan. */
    const char *p = text + (*text == '-');
    size_t whole = skip_digits(&p), fraction = 0;
    if (*p == '.') {
        p++;
        fraction = skip_digits(&p);
    }
    if (!whole && !fraction) return PARSE_SYNTAX;
    int nonzero = 0; /* a digit of the mantissa other than 0 */
    for (const char *d = text; d < p; d++) nonzero |= *d >= '1' && *d <= '9';
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!skip_digits(&p)) return PARSE_SYNTAX;
    }
    if (*p) return PARSE_SYNTAX;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    /* Beyond the largest double (1e999), or so small that it rounds to 0
     * (1e-400): not the number written. strtod's ERANGE also flags a
     * subnormal result (1e-320), which is a value: taken. */
    if (!isfinite(v) || (v == 0 && nonzero)) return PARSE_RANGE;
    *out = v;
    return 0;
}

int parse_size(const char *text, int64_t *out)
{
    if (!text) return PARSE_SYNTAX;
    const char *p = text, *whole = text;
    size_t whole_digits = skip_digits(&p);
    const char *fraction = p;
    size_t fraction_digits = 0;
    if (!whole_digits) return PARSE_SYNTAX;
    if (*p == '.') {
        fraction = ++p;
        fraction_digits = skip_digits(&p);
        if (!fraction_digits) return PARSE_SYNTAX;
    }
    /* The unit: K, M, G or T (any case), binary; then "i" and "B", each
     * optional ("1G", "1GB", "1GiB"); "B" alone is bytes. A lower-case b
     * (bits, to most readers) is not taken. */
    int power = 0;
    const char *units = "KMGT", *u = *p ? strchr(units, toupper((unsigned char)*p)) : NULL;
    if (u) {
        power = (int)(u - units) + 1;
        p++;
        if (*p == 'i') p++;
    }
    if (*p == 'B') p++;
    if (*p) return PARSE_SYNTAX;
    int shift = 10 * power;
    /* The whole part, exactly. */
    uint64_t bytes = 0;
    for (size_t i = 0; i < whole_digits; i++) {
        uint64_t d = (uint64_t)(whole[i] - '0');
        if (bytes > ((uint64_t)INT64_MAX - d) / 10) return PARSE_RANGE;
        bytes = bytes * 10 + d;
    }
    if (bytes > ((uint64_t)INT64_MAX >> shift)) return PARSE_RANGE;
    bytes <<= shift;
    /* The fraction times 2^shift, exactly: doubled digit by digit; whole
     * bytes only (1.5K is 1536; 1.5 bytes, or 0.1K, is not a size). */
    while (fraction_digits > 0 && fraction[fraction_digits - 1] == '0') fraction_digits--;
    if (fraction_digits > (size_t)shift) return PARSE_FRACTION; /* 2^-shift has shift decimals */
    unsigned char digit[40];
    for (size_t i = 0; i < fraction_digits; i++) digit[i] = (unsigned char)(fraction[i] - '0');
    uint64_t carried = 0;
    for (int k = 0; k < shift; k++) {
        int carry = 0;
        for (size_t i = fraction_digits; i-- > 0;) {
            int d = digit[i] * 2 + carry;
            digit[i] = (unsigned char)(d % 10);
            carry = d / 10;
        }
        carried = carried * 2 + (uint64_t)carry;
    }
    for (size_t i = 0; i < fraction_digits; i++)
        if (digit[i]) return PARSE_FRACTION;
    if (carried > (uint64_t)INT64_MAX - bytes) return PARSE_RANGE;
    *out = (int64_t)(bytes + carried);
    return 0;
}

void format_bytes(double bytes, char *out, int out_size)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    snprintf(out, (size_t)out_size, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
}

double parse_env_seconds(const char *name, double fallback, double min, double max)
{
    const char *text = getenv(name);
    if (!text || !*text) return fallback;
    double value;
    return parse_double(text, &value) == 0 && value >= min && value <= max ? value : -1;
}
