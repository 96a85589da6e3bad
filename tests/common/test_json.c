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

/* ------------------------------------------------ tp_json_parse_deferring */

/* The deferred array's elements parsed one by one and put back: the tree a
 * whole parse gives, or NULL where an element does not parse. */
static cJSON *put_back(const char *text, cJSON *rest, const char *member, const tp_json_span *spans, int64_t count)
{
    cJSON *array = cJSON_GetObjectItemCaseSensitive(rest, member);
    for (int64_t k = 0; k < count; k++) {
        cJSON *element = NULL;
        if (tp_json_parse(text + spans[k].offset, spans[k].length, "element", &element)) {
            cJSON_Delete(rest);
            return NULL;
        }
        cJSON_AddItemToArray(array, element);
    }
    return rest;
}

Test(json_deferring, each_element_is_found_where_it_lies)
{
    static const char text[] = "\xEF\xBB\xBF { \"format\": \"x\", \"a\": [\"]\", {\"tensors\": [9]}],\n"
                               "\t\"tensors\" : [ {\"name\": \"q\\\"]}\", \"shape\": [2, [3]]} ,\r\n7,\"s\\\\\" , null,"
                               "[], {}\x01] ,\"seal\": \"x\"}\n";
    static const char *const elements[] = {"{\"name\": \"q\\\"]}\", \"shape\": [2, [3]]}", "7", "\"s\\\\\"", "null",
                                           "[]", "{}"};
    cJSON *rest = NULL;
    tp_json_span *spans = NULL;
    int64_t count = 0;
    cr_assert_eq(tp_json_parse_deferring(text, strlen(text), "index.json", "tensors", &rest, &spans, &count), TP_OK,
                 "%s", tp_errmsg());
    cr_assert_eq(count, 6);
    for (int k = 0; k < 6; k++)
        cr_assert(spans[k].length == strlen(elements[k]) && !memcmp(text + spans[k].offset, elements[k],
                                                                    spans[k].length),
                  "element %d: '%.*s', expected '%s'", k, (int)spans[k].length, text + spans[k].offset, elements[k]);
    /* The rest is all there; the array is empty, the one inside "a" kept. */
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(rest, "tensors")), 0);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(rest, "a")), 2);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(rest, "seal")->valuestring, "x");
    cJSON *whole = NULL;
    cr_assert_eq(tp_json_parse(text, strlen(text), "index.json", &whole), TP_OK, "%s", tp_errmsg());
    rest = put_back(text, rest, "tensors", spans, count);
    cr_assert(rest && cJSON_Compare(whole, rest, 1));
    cJSON_Delete(whole);
    cJSON_Delete(rest);
    free(spans);
}

/* The member is named as cJSON reads names; only the object's own member is
 * taken, never one inside another member's value. */
Test(json_deferring, the_member_is_the_objects_own_by_its_read_name)
{
    static const char escaped[] = "{\"x\": {\"tensors\": [1, 2, 3]}, \"tens\\u006frs\": [4, 5]}";
    cJSON *rest = NULL;
    tp_json_span *spans = NULL;
    int64_t count = 0;
    cr_assert_eq(tp_json_parse_deferring(escaped, strlen(escaped), "index.json", "tensors", &rest, &spans, &count),
                 TP_OK, "%s", tp_errmsg());
    cr_assert_eq(count, 2);
    cr_assert(!memcmp(escaped + spans[0].offset, "4", 1) && !memcmp(escaped + spans[1].offset, "5", 1));
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(
                     cJSON_GetObjectItemCaseSensitive(rest, "x"), "tensors")), 3);
    cJSON_Delete(rest);
    free(spans);
    /* Named twice: the first is deferred, and the second is refused as a
     * key twice, as a whole parse refuses it. */
    static const char twice[] = "{\"tensors\": [1], \"tensors\": [2]}";
    cr_assert_eq(tp_json_parse_deferring(twice, strlen(twice), "index.json", "tensors", &rest, &spans, &count),
                 TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "key tensors appears twice"), "%s", tp_errmsg());
    cr_assert(!rest && !spans && !count);
}

/* Without the member as an array, the whole text's tree; nothing deferred. */
Test(json_deferring, without_the_array_the_whole_tree)
{
    static const char *const texts[] = {"{\"files\": [1, 2]}", "{\"tensors\": {\"a\": [1]}}", "{\"tensors\": 3}",
                                        "{}", "[1, 2]", "\"tensors\""};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        cJSON *rest = NULL, *whole = NULL;
        tp_json_span *spans = NULL;
        int64_t count = 0;
        cr_assert_eq(tp_json_parse_deferring(texts[i], strlen(texts[i]), "t", "tensors", &rest, &spans, &count),
                     TP_OK, "%s: %s", texts[i], tp_errmsg());
        cr_assert(!spans && !count, "%s", texts[i]);
        cr_assert_eq(tp_json_parse(texts[i], strlen(texts[i]), "t", &whole), TP_OK);
        cr_assert(cJSON_Compare(whole, rest, 1), "%s", texts[i]);
        cJSON_Delete(whole);
        cJSON_Delete(rest);
    }
}

/* Errors are the whole text's: where a parse of it stops, by its line and
 * column (here past the array, which the rest's text would place elsewhere). */
Test(json_deferring, errors_are_said_of_the_whole_text)
{
    static const char text[] = "{\"tensors\": [1,\n 2,\n 3], \"seal\": x}";
    cJSON *rest = NULL;
    tp_json_span *spans = NULL;
    int64_t count = 0;
    cr_assert_eq(tp_json_parse_deferring(text, strlen(text), "index.json", "tensors", &rest, &spans, &count),
                 TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "index.json: not a JSON object: invalid JSON at line 3, column 14"), "%s",
              tp_errmsg());
    cr_assert(!rest && !spans && !count);
}

/* The same texts accepted as by a whole parse, and the same tree: every text
 * one byte away from a few valid ones (each byte removed, or replaced by each
 * of JSON's delimiters, a control byte or a letter). Accepted means the rest
 * and every element parse. */
Test(json_deferring, accepts_what_a_whole_parse_accepts_and_reads_it_alike)
{
    static const char *const seeds[] = {
        "{\"f\": [1, {\"g\": \"]\"}], \"tensors\": [{\"n\": \"a\\\"b\", \"s\": [1, [2]]}, [3, 4], \"x\", 5e3, true],"
        " \"z\": {}}",
        "\xEF\xBB\xBF{\"tensors\":[[],{},\"\\\\\"]}",
        "{ \"a\" : null , \"tensors\" : [ 1 , 2 ] }",
    };
    static const char replacements[] = "{}[],:\"\\ \x01\nax0";
    int64_t compared = 0, accepted = 0;
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        size_t n = strlen(seeds[s]);
        char *text = malloc(n + 1);
        for (size_t at = 0; at < n; at++)
            for (size_t r = 0; r <= sizeof replacements - 1; r++) {
                size_t length = n;
                memcpy(text, seeds[s], n);
                if (r == sizeof replacements - 1) { /* the byte removed */
                    memmove(text + at, text + at + 1, n - at - 1);
                    length--;
                } else {
                    text[at] = replacements[r];
                }
                cJSON *whole = NULL, *rest = NULL;
                tp_json_span *spans = NULL;
                int64_t count = 0;
                int whole_status = tp_json_parse(text, length, "t", &whole);
                int status = tp_json_parse_deferring(text, length, "t", "tensors", &rest, &spans, &count);
                cr_assert_neq(status, TP_ERR_STATE, "'%.*s': %s", (int)length, text, tp_errmsg());
                if (!status) rest = put_back(text, rest, "tensors", spans, count);
                cr_assert_eq(!whole_status, rest != NULL, "'%.*s': a whole parse %s it, element by element %s",
                             (int)length, text, whole_status ? "refuses" : "accepts", rest ? "accepted" : "refused");
                if (rest) {
                    cr_assert(cJSON_Compare(whole, rest, 1), "'%.*s' read otherwise", (int)length, text);
                    accepted++;
                }
                compared++;
                cJSON_Delete(whole);
                cJSON_Delete(rest);
                free(spans);
            }
        free(text);
    }
    /* Both sides of the comparison were met. */
    cr_assert(accepted > 50 && compared - accepted > 500, "%lld of %lld accepted", (long long)accepted,
              (long long)compared);
}
