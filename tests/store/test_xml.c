/* The text of an object store's XML answers (store/xml.c xml_text): the
 * five named entities and numeric character references, decimal and hex,
 * written out as UTF-8. S3 escapes a key's control characters numerically
 * in a listing not asked for encoding-type=url (`&#13;`); such references
 * were copied as they were ("run&#13;" for "run\r"), and a listed name cut
 * at the prefix's length came out as garbage. A reference that names no
 * character is refused, naming it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../../common/error.h"
#include "../../store/xml.h"

/* The decoded text of s, into out; the status of the decoding. */
static int decode(const char *s, char *out, size_t out_size)
{
    return xml_text(s, s + strlen(s), out, out_size);
}

Test(xml, named_entities_are_decoded)
{
    char out[64];
    cr_assert_eq(decode("a&amp;b&lt;c&gt;d&quot;e&apos;f", out, sizeof out), TP_OK);
    cr_assert_str_eq(out, "a&b<c>d\"e'f");
    cr_assert_eq(decode("R&amp;D &unknown; & done", out, sizeof out), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(out, "R&D &unknown; & done", "an ampersand of no reference is kept as it is");
}

Test(xml, numeric_references_are_written_as_utf8)
{
    char out[64];
    cr_assert_eq(decode("run&#13;/x", out, sizeof out), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(out, "run\r/x", "S3's escape of a carriage return");
    cr_assert_eq(decode("&#x0D;&#X0a;&#9;", out, sizeof out), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(out, "\r\n\t");
    cr_assert_eq(decode("&#233;&#xe9;", out, sizeof out), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(out, "\xc3\xa9\xc3\xa9", "U+00E9: two bytes");
    cr_assert_eq(decode("&#x20AC;", out, sizeof out), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(out, "\xe2\x82\xac", "U+20AC: three bytes");
    cr_assert_eq(decode("&#x1F600;&#128512;", out, sizeof out), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(out, "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", "U+1F600: four bytes");
    cr_assert_eq(decode("&#x10FFFF;&#127;&#x7F;", out, sizeof out), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(out, "\xf4\x8f\xbf\xbf\x7f\x7f", "the last code point; DEL");
    cr_assert_eq(decode("&#38;amp;", out, sizeof out), TP_OK);
    cr_assert_str_eq(out, "&amp;", "decoded once, not again");
}

Test(xml, references_naming_no_character_are_refused)
{
    const char *bad[] = {"&#;", "&#x;", "&#xZZ;", "&#12", "&#12 ;", "&#0;", "&#x0;", "&#xD800;", "&#57343;",
                         "&#x110000;", "&#99999999999999999999;", "&#-5;", "&#x+5;"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char out[64], text[64];
        snprintf(text, sizeof text, "key%s", bad[i]);
        cr_assert_eq(decode(text, out, sizeof out), TP_ERR_FORMAT, "%s taken", bad[i]);
        cr_assert(strstr(tp_errmsg(), "character reference"), "%s: %s", bad[i], tp_errmsg());
    }
    char out[64];
    decode("a&#xD800;b", out, sizeof out);
    cr_assert(strstr(tp_errmsg(), "&#xD800;"), "the reference named: %s", tp_errmsg());
}

Test(xml, a_character_that_does_not_fit_is_left_out_whole)
{
    char out[4];
    cr_assert_eq(decode("ab&#x1F600;", out, sizeof out), TP_OK);
    cr_assert_str_eq(out, "ab", "never the first bytes of a UTF-8 sequence alone");
    cr_assert_eq(decode("abcdef", out, sizeof out), TP_OK);
    cr_assert_str_eq(out, "abc", "truncated to fit, as before");
}
