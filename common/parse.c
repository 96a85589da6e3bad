/* parse.c: numbers and sizes from text, and sizes as text. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "parse.h"

int parse_int(const char *text, int64_t min, int64_t max, int64_t *out)
{
    if (!text || !*text) return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || *end || v < min || v > max) return -1;
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
    return parse_int(digits, min, max, out);
}

int parse_double(const char *text, double *out)
{
    if (!text || !*text) return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int parse_size(const char *text, int64_t *out)
{
    if (!text || !*text) return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || !(v >= 0)) return -1;
    while (isspace((unsigned char)*end)) end++;
    double scale = 1;
    if (*end) {
        const char *units = "KMGT";
        const char *u = strchr(units, toupper((unsigned char)*end));
        if (!u) return -1;
        scale = pow(1024, (double)(u - units + 1));
        end++;
        if (strcasecmp(end, "iB") == 0 || strcasecmp(end, "B") == 0) end += strlen(end);
        if (*end) return -1;
    }
    double bytes = v * scale;
    if (bytes > 9.0e18) return -1;
    *out = (int64_t)bytes;
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
