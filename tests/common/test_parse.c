/* common/parse.c: one rule for the numbers of command lines and model
 * options (decimal; no blanks, '+', hexadecimal, inf or nan; '-' the only
 * sign), and sizes: a decimal number of bytes or of binary units, whole
 * bytes, no exponent. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../common/parse.h"

static int int_of(const char *text, int64_t *v)
{
    *v = -12345;
    return parse_int(text, INT64_MIN, INT64_MAX, v);
}

Test(parse, integers_are_digits_with_an_optional_minus)
{
    int64_t v;
    cr_assert_eq(int_of("7", &v), 0);
    cr_assert_eq(v, 7);
    cr_assert_eq(int_of("-3", &v), 0);
    cr_assert_eq(v, -3);
    cr_assert_eq(int_of("007", &v), 0);
    cr_assert_eq(v, 7);
    cr_assert_eq(int_of("9223372036854775807", &v), 0);
    cr_assert_eq(v, INT64_MAX);
    cr_assert_eq(int_of("-9223372036854775808", &v), 0);
    cr_assert_eq(v, INT64_MIN);
}

Test(parse, integers_refuse_blanks_plus_and_other_notations)
{
    /* strtoll took the first four: `--steps " 7"`, `--tokens +5` ran. */
    const char *refused[] = {" 7", "+5", "\t7", "\n7", "7 ", "", "-", "+", "1e3", "0x10", "7.0", "1,000", "1_000", "--7",
                             "- 7", "7x"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int64_t v;
        cr_assert_eq(int_of(refused[i], &v), PARSE_SYNTAX, "'%s' was taken as %lld", refused[i], (long long)v);
        cr_assert_eq(v, -12345, "'%s' wrote a value", refused[i]);
    }
    int64_t v;
    cr_assert_eq(parse_int(NULL, 0, 1, &v), PARSE_SYNTAX);
}

Test(parse, integers_out_of_range)
{
    int64_t v = 0;
    cr_assert_eq(parse_int("5", 1, 4, &v), PARSE_RANGE);
    cr_assert_eq(parse_int("0", 1, 4, &v), PARSE_RANGE);
    cr_assert_eq(parse_int("-1", 0, 4, &v), PARSE_RANGE);
    cr_assert_eq(parse_int("9223372036854775808", 0, INT64_MAX, &v), PARSE_RANGE);
    cr_assert_eq(parse_int("99999999999999999999999", 0, INT64_MAX, &v), PARSE_RANGE);
    cr_assert_eq(parse_int("4", 1, 4, &v), 0);
    cr_assert_eq(v, 4);
}

/* A file's rule is its own (blanks around the digits are a file's): unchanged. */
Test(parse, integers_in_files_keep_their_rule)
{
    int64_t v = 0;
    cr_assert_eq(parse_int_in_file(" 4\n", 0, 10, &v), 0);
    cr_assert_eq(v, 4);
    cr_assert_eq(parse_int_in_file("-2", -5, 10, &v), 0);
    cr_assert_eq(v, -2);
    cr_assert_eq(parse_int_in_file("+1", 0, 10, &v), -1);
    cr_assert_eq(parse_int_in_file("1 2", 0, 10, &v), -1);
    cr_assert_eq(parse_int_in_file("11", 0, 10, &v), -1);
    cr_assert_eq(parse_int_in_file("", 0, 10, &v), -1);
}

Test(parse, numbers_are_decimal)
{
    const struct {
        const char *text;
        double value;
    } taken[] = {{"3", 3}, {"0.5", 0.5}, {".5", 0.5}, {"5.", 5}, {"3e-4", 3e-4}, {"1E+5", 1e5}, {"-2.5", -2.5},
                 {"0", 0}, {"0e-999", 0}, {"1.7976931348623157e308", DBL_MAX}};
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        double v = -1;
        cr_assert_eq(parse_double(taken[i].text, &v), 0, "'%s' refused", taken[i].text);
        cr_assert_eq(v, taken[i].value, "'%s' read as %g", taken[i].text, v);
    }
}

Test(parse, numbers_refuse_blanks_plus_hexadecimal_and_words)
{
    /* strtod took all but the empty ones and "1e". */
    const char *refused[] = {" 1", "1 ", "+1", "0x10", "0x1p-3", "inf", "-inf", "nan", "infinity", "", ".", "-", "1e",
                             "1e+", "e5", "1.2.3", "1,5", "--1"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        double v = -12345;
        cr_assert_eq(parse_double(refused[i], &v), PARSE_SYNTAX, "'%s' was taken as %g", refused[i], v);
        cr_assert_eq(v, -12345, "'%s' wrote a value", refused[i]);
    }
}

/* strtod's ERANGE refused a subnormal (1e-320) as "not a number": it is one. */
Test(parse, subnormal_numbers_are_taken_and_out_of_range_ones_said)
{
    double v = 0;
    cr_assert_eq(parse_double("1e-320", &v), 0);
    cr_assert(v > 0 && v < DBL_MIN && fpclassify(v) == FP_SUBNORMAL);
    cr_assert_eq(parse_double("4.9e-324", &v), 0);
    cr_assert_eq(v, 4.9e-324);
    cr_assert_eq(parse_double("1e-400", &v), PARSE_RANGE); /* would be 0 */
    char tiny[512] = "0."; /* 0.000...1, 1e-400 without an exponent */
    memset(tiny + 2, '0', 399);
    strcpy(tiny + 401, "1");
    cr_assert_eq(parse_double(tiny, &v), PARSE_RANGE);
    cr_assert_eq(parse_double("1e999", &v), PARSE_RANGE);
    cr_assert_eq(parse_double("-1e999", &v), PARSE_RANGE);
}

Test(parse, sizes_are_bytes_or_binary_units)
{
    const struct {
        const char *text;
        int64_t bytes;
    } taken[] = {{"512", 512},
                 {"0", 0},
                 {"1.0", 1},
                 {"512B", 512},
                 {"64K", 64 << 10},
                 {"64k", 64 << 10},
                 {"1.5K", 1536},
                 {"1.50K", 1536},
                 {"0.5K", 512},
                 {"0.0009765625K", 1}, /* 2^-10 K */
                 {"3M", 3 << 20},
                 {"1.5G", (int64_t)3 << 29},
                 {"2GiB", (int64_t)2 << 30},
                 {"2Gi", (int64_t)2 << 30},
                 {"4GB", (int64_t)4 << 30},
                 {"1T", (int64_t)1 << 40},
                 {"0.25T", (int64_t)1 << 38},
                 {"8388607T", ((int64_t)8388607) << 40},
                 {"9223372036854775807", INT64_MAX},
                 {"9223372036854775807B", INT64_MAX}};
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        int64_t v = -1;
        cr_assert_eq(parse_size(taken[i].text, &v), 0, "'%s' refused", taken[i].text);
        cr_assert_eq(v, taken[i].bytes, "'%s' read as %lld", taken[i].text, (long long)v);
    }
}

Test(parse, sizes_refuse_exponents_hexadecimal_bits_and_blanks)
{
    /* Taken before: 1e3 as 1000, 0x10 as 16, 0x1p30 as 2^30, 1Gb as 2^30, 1 G. */
    const char *refused[] = {"1e3", "1E3", "0x10", "0x1p30", "1Gb", "1gb", "1Kb", "1b", "1 G", " 1G", "1G ", "-1M",
                             "+1M", "", "G", ".5K", "1.K", "1GIB", "1iB", "1P", "1KK", "1GBB", "inf", "nan", "1,5K"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int64_t v = -12345;
        cr_assert_eq(parse_size(refused[i], &v), PARSE_SYNTAX, "'%s' was taken as %lld", refused[i], (long long)v);
        cr_assert_eq(v, -12345, "'%s' wrote a value", refused[i]);
    }
}

Test(parse, sizes_are_whole_bytes)
{
    /* 1.5 was 1 byte, truncated; 0.1K 102. */
    const char *refused[] = {"1.5", "0.5", "1.5B", "0.1K", "1.0001K", "0.00048828125K", "0.3M", "1.1G"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int64_t v = -12345;
        cr_assert_eq(parse_size(refused[i], &v), PARSE_FRACTION, "'%s' was taken as %lld", refused[i], (long long)v);
        cr_assert_eq(v, -12345, "'%s' wrote a value", refused[i]);
    }
}

Test(parse, sizes_past_the_largest)
{
    int64_t v = 0;
    cr_assert_eq(parse_size("9223372036854775808", &v), PARSE_RANGE);
    cr_assert_eq(parse_size("8388608T", &v), PARSE_RANGE); /* 2^63 */
    cr_assert_eq(parse_size("99999999999T", &v), PARSE_RANGE);
    cr_assert_eq(parse_size("99999999999999999999999999", &v), PARSE_RANGE);
    /* 2^63 - 2^40 + (2^40 - 1): the largest, its fraction carried exactly. */
    cr_assert_eq(parse_size("8388607.9999999999990905052982270717620849609375T", &v), 0);
    cr_assert_eq(v, INT64_MAX);
}
