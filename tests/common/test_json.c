/* tp_json_number (common/json.c): numbers printed into JSON by hand, as the
 * trainer's log is, stay JSON: a NaN or an infinity (a diverged step's loss)
 * is null, which cJSON reads back; a finite number keeps its format. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../common/json.h"

Test(json_number, a_finite_number_keeps_its_format)
{
    char out[TP_JSON_NUMBER_MAX];
    cr_assert_str_eq(tp_json_number(out, "%.9g", 5.58642699), "5.58642699");
    cr_assert_str_eq(tp_json_number(out, "%.3f", 1.9491), "1.949");
    cr_assert_str_eq(tp_json_number(out, "%.9g", -0.0), "-0");
}

Test(json_number, nan_and_infinities_are_null)
{
    char out[TP_JSON_NUMBER_MAX];
    cr_assert_str_eq(tp_json_number(out, "%.9g", NAN), "null");
    cr_assert_str_eq(tp_json_number(out, "%.9g", -NAN), "null", "not -nan");
    cr_assert_str_eq(tp_json_number(out, "%.1f", INFINITY), "null");
    cr_assert_str_eq(tp_json_number(out, "%.3f", -INFINITY), "null");
}

/* %.3f of 1e300 is 305 characters: cut at the buffer it would be digits of
 * another number (or none); it is written with %.9g instead. */
Test(json_number, a_number_too_long_for_its_format_is_shortened_not_cut)
{
    char out[TP_JSON_NUMBER_MAX];
    cr_assert_str_eq(tp_json_number(out, "%.3f", 1e300), "1e+300");
}

Test(json_number, a_line_of_them_parses)
{
    char a[TP_JSON_NUMBER_MAX], b[TP_JSON_NUMBER_MAX], line[256];
    snprintf(line, sizeof line, "{\"loss\":%s,\"grad_norm\":%s}", tp_json_number(a, "%.9g", NAN),
             tp_json_number(b, "%.9g", 2.5));
    cJSON *o = NULL;
    cr_assert_eq(tp_json_parse(line, strlen(line), "line", &o), TP_OK, "%s", tp_errmsg());
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "loss")));
    cr_assert_float_eq(cJSON_GetObjectItem(o, "grad_norm")->valuedouble, 2.5, 0);
    cJSON_Delete(o);
}

/* A key twice in one object is read as the first value by cJSON and as the
 * last by Python's json (so by transformers): config.json's
 * "rope_theta": 10000, "rope_theta": 500000 computed another model than the
 * one imported. Refused at any depth, naming the key by its path; the same
 * name in two objects is no duplicate. */
Test(json_parse, a_key_twice_in_one_object_is_refused_naming_it)
{
    static const struct {
        const char *text, *key;
    } twice[] = {
        {"{\"rope_theta\": 10000, \"n\": 1, \"rope_theta\": 500000}", "key rope_theta appears twice"},
        {"{\"rope_scaling\": {\"factor\": 8, \"factor\": 32}}", "key rope_scaling.factor appears twice"},
        {"{\"a\": [1, {\"x\": 1}, {\"y\": 2, \"y\": 3}]}", "key a[2].y appears twice"},
        {"{\"__metadata__\": {\"format\": \"pt\", \"format\": \"tf\"}, \"t\": {}}", "key __metadata__.format appears twice"},
    };
    for (size_t i = 0; i < sizeof twice / sizeof twice[0]; i++) {
        cJSON *o = NULL;
        cr_assert_eq(tp_json_parse(twice[i].text, strlen(twice[i].text), "config.json", &o), TP_ERR_FORMAT, "%s",
                     twice[i].text);
        cr_assert_null(o);
        cr_assert(strstr(tp_errmsg(), "config.json: ") && strstr(tp_errmsg(), twice[i].key), "%s: %s", twice[i].text,
                  tp_errmsg());
    }
    const char *apart = "{\"a\": {\"x\": 1}, \"b\": {\"x\": 2}, \"c\": [{\"x\": 3}, {\"x\": 4}], \"x\": 5}";
    cJSON *o = NULL;
    cr_assert_eq(tp_json_parse(apart, strlen(apart), "apart", &o), TP_OK, "%s", tp_errmsg());
    cJSON_Delete(o);
}

/* Many keys (a safetensors header holds 100,000 tensors): the duplicate is
 * found wherever it is. */
Test(json_parse, a_duplicate_among_many_keys_is_found)
{
    size_t size = 4000 * 16 + 64, at = 0;
    char *text = malloc(size);
    at += (size_t)snprintf(text + at, size - at, "{");
    for (int k = 0; k < 4000; k++) at += (size_t)snprintf(text + at, size - at, "\"t%d\":%d,", k, k);
    snprintf(text + at, size - at, "\"t1234\":0}");
    cJSON *o = NULL;
    cr_assert_eq(tp_json_parse(text, strlen(text), "header", &o), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "key t1234 appears twice"), "%s", tp_errmsg());
    text[at - 1] = '}'; /* without the last member: 4000 distinct keys */
    cr_assert_eq(tp_json_parse(text, at, "header", &o), TP_OK, "%s", tp_errmsg());
    cJSON_Delete(o);
    free(text);
}

/* Where the parse stopped, as an editor counts: config.json with a trailing
 * comma, or a NaN (which Python's json writes and reads), said "not a JSON
 * object (damaged or truncated?)" with no place to look. */
Test(json_parse, invalid_json_is_said_with_its_line_and_column)
{
    static const struct {
        const char *text, *where;
    } bad[] = {
        {"{\n  \"a\": 1,\n  \"b\": 2,\n}", "invalid JSON at line 4, column 1 (byte 22, at \"}\")"},
        {"{\"a\": 1, \"r\": NaN, \"b\": 2}", "invalid JSON at line 1, column 15 (byte 14, at \"NaN, \"b\": 2}\")"},
        {"{\"a\": [1, 2", "at line 1, column 11 (byte 10"},
        {"{\"a\": 1}\n{\"b\": 2}", "text follows it at line 2, column 1 (byte 9, at \"{\"b\": 2}\")"},
        {"{\"a\": \"\x1b[31m\" x}", "at \"x}\")"}, /* past the string: nothing raw shown */
        {"{\"a\": 1 \x7f[31m}", "at \"\\x7f[31m}\")"}, /* cJSON skips bytes up to 32 as white space */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *o = NULL;
        cr_assert_eq(tp_json_parse(bad[i].text, strlen(bad[i].text), "config.json", &o), TP_ERR_FORMAT, "%s",
                     bad[i].text);
        cr_assert_null(o);
        cr_assert(strstr(tp_errmsg(), "config.json: not a JSON object: ") && strstr(tp_errmsg(), bad[i].where),
                  "%s: %s, expected %s", bad[i].text, tp_errmsg(), bad[i].where);
    }
}

/* UTF-8 as Rust's from_utf8 (so the safetensors reference reader) takes it:
 * the offset of the first byte that starts no valid sequence. */
Test(utf8, the_first_invalid_byte_is_found)
{
    static const struct {
        const char *text;
        int64_t at;
    } cases[] = {
        {"model.layers.0", -1},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", -1}, /* 2, 3 and 4 bytes */
        {"model.\xff", 6},
        {"a\xc3", 1},                 /* cut short */
        {"a\xc3(", 1},                /* no continuation */
        {"\xc0\xaf", 0},              /* overlong '/' */
        {"\xe0\x80\xaf", 0},          /* overlong, 3 bytes */
        {"x\xed\xa0\x80", 1},         /* a surrogate, U+D800 */
        {"\xf4\x90\x80\x80", 0},      /* past U+10FFFF */
        {"ok\xf4\x8f\xbf\xbf!", -1},  /* U+10FFFF itself */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(tp_utf8_invalid_at(cases[i].text, strlen(cases[i].text)), cases[i].at, "case %zu", i);
}

/* A name from a file reaches a terminal as printable ASCII only. */
Test(text_escape, bytes_outside_printable_ascii_are_escaped_whole)
{
    char out[64];
    tp_text_escape("model.\xff\x1b[2J\\", 12, out, sizeof out);
    cr_assert_str_eq(out, "model.\\xff\\x1b[2J\\x5c");
    tp_text_escape("ab\xff", 3, out, 5); /* room for "ab" and not the whole escape */
    cr_assert_str_eq(out, "ab");
}
