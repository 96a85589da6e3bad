/* tp_json_number (common/json.c): numbers printed into JSON by hand, as the
 * trainer's log is, stay JSON: a NaN or an infinity (a diverged step's loss)
 * is null, which cJSON reads back; a finite number keeps its format. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
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
