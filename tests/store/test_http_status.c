/* Which answers store/http.c retries (an S3 error inside a 200 too), and which it takes as a server
 * pacing its clients (not counted against TP_REMOTE_RETRIES): S3's 503
 * SlowDown, 429, and a 503 to a HEAD (no body to say SlowDown in) are; a
 * 503 of another cause, other 5xx, and 4xx refusals are not. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../../common/error.h"
#include "../../store/http.h"
#include "../../store/object.h"
#include "../support/http_answer.h"


Test(http_status, slow_down_and_too_many_requests_are_throttling)
{
    http_response slow = http_answer(503, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
                                     "<Message>Please reduce your request rate.</Message></Error>");
    http_response many = http_answer(429, "");
    cr_assert(http_status_throttled("GET", &slow), "S3's 503 SlowDown");
    cr_assert(http_status_throttled("GET", &many), "429 Too Many Requests");
    cr_assert(http_status_transient(slow.code) && http_status_transient(many.code));
}

Test(http_status, other_failures_are_not_throttling)
{
    http_response unavailable = http_answer(503, "<Error><Code>ServiceUnavailable</Code></Error>");
    http_response internal = http_answer(500, "<Error><Code>InternalError</Code></Error>");
    http_response slow_in_message = http_answer(503, "<Error><Code>InternalError</Code><Message>SlowDown</Message></Error>");
    http_response denied = http_answer(403, "<Error><Code>SlowDown</Code></Error>"); /* only with 503 */
    cr_assert_not(http_status_throttled("GET", &unavailable), "a 503 of another cause: a retry like any 5xx");
    cr_assert_not(http_status_throttled("GET", &internal));
    cr_assert_not(http_status_throttled("GET", &slow_in_message), "the word in the message is not the code");
    cr_assert_not(http_status_throttled("GET", &denied));
    cr_assert(http_status_transient(503) && http_status_transient(500) && http_status_transient(408));
    cr_assert_not(http_status_transient(403));
    cr_assert_not(http_status_transient(404));
}

/* S3 answers a throttled HEAD with a bare 503: a HEAD's answer has no body
 * to carry the SlowDown code. It used to be a retry like any 5xx, and
 * `tp-ckpt verify s3://...` failed after 16 s of a store throttling for 40
 * with 600 s allowed. */
Test(http_status, a_bare_503_to_a_head_is_throttling)
{
    http_response bare = http_answer(503, "");
    cr_assert(http_status_throttled("HEAD", &bare), "a HEAD's 503 cannot say SlowDown: it is taken as such");
    cr_assert_not(http_status_throttled("GET", &bare), "a GET's 503 says its cause in its body");
    http_response not_found = http_answer(404, ""), internal = http_answer(500, "");
    cr_assert_not(http_status_throttled("HEAD", &not_found));
    cr_assert_not(http_status_throttled("HEAD", &internal), "a 500 is a failure, whatever the method");
}

/* S3 answers a CompleteMultipartUpload 200 before it assembles the parts,
 * and a failure then comes in the body: retried as a 5xx when its code is
 * one S3 sends as a 5xx (it failed the upload at once, said as "HTTP
 * 500 ... (after retries)"); a refusal of the request itself is final. */
Test(http_status, an_error_inside_a_200_is_retried_when_transient)
{
    cr_assert(http_error_code_transient("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\n<Error><Code>InternalError</Code>"
                                        "<Message>We encountered an internal error. Please try again.</Message></Error>"));
    cr_assert(http_error_code_transient("<Error><Code>SlowDown</Code></Error>"));
    cr_assert(http_error_code_transient("<Error><Code>ServiceUnavailable</Code></Error>"));
    cr_assert_not(http_error_code_transient("<Error><Code>InvalidPart</Code></Error>"), "a part S3 does not have");
    cr_assert_not(http_error_code_transient("<Error><Code>EntityTooSmall</Code></Error>"));
    cr_assert_not(http_error_code_transient("<Error><Code>AccessDenied</Code><Message>InternalError</Message></Error>"),
                  "the word in the message is not the code");
}

/* A 5xx that outlasted the retries is said with the attempts it took: it
 * said "(after retries)" whatever their number, with TP_REMOTE_RETRIES=0
 * (one attempt) too. */
Test(http_status, a_5xx_given_up_says_its_real_attempts)
{
    http_response once = http_answer(500, "<Error><Code>InternalError</Code><Message>try again</Message></Error>");
    once.attempts = 1;
    object_answer_error("GET", "s3://bkt/k", &once);
    cr_assert(strstr(tp_errmsg(), "GET s3://bkt/k: HTTP 500 InternalError: try again (after 1 attempt)"), "%s",
              tp_errmsg());
    cr_assert_not(strstr(tp_errmsg(), "retries"), "no retry was made: %s", tp_errmsg());
    http_response seven = http_answer(503, "");
    seven.attempts = 7;
    object_answer_error("PUT", "http://host/k", &seven);
    cr_assert(strstr(tp_errmsg(), "PUT http://host/k: HTTP 503 (after 7 attempts)"), "%s", tp_errmsg());
    http_response refused = http_answer(403, "");
    refused.attempts = 1;
    object_answer_error("GET", "http://host/k", &refused);
    cr_assert_not(strstr(tp_errmsg(), "attempt"), "a refusal is not retried, nor said to be: %s", tp_errmsg());
}

/* S3 refuses a body that arrived other than its Content-MD5 says (400
 * BadDigest): damaged on the way, sent again from its file; other 400s
 * are final. */
Test(http_status, a_body_damaged_on_the_way_is_sent_again)
{
    http_response damaged = http_answer(400, "<Error><Code>BadDigest</Code><Message>The Content-MD5 you specified "
                                             "did not match what we received.</Message></Error>");
    http_response bad = http_answer(400, "<Error><Code>InvalidArgument</Code><Message>BadDigest</Message></Error>");
    http_response internal = http_answer(500, ""), denied = http_answer(403, "<Error><Code>BadDigest</Code></Error>");
    cr_assert(http_answer_transient(&damaged));
    cr_assert_not(http_answer_transient(&bad), "the word in the message is not the code");
    cr_assert_not(http_answer_transient(&denied), "only with 400");
    cr_assert(http_answer_transient(&internal));
    http_response in_ok = http_answer(200, "<Error><Code>InternalError</Code></Error>");
    in_ok.error_in_ok = 1;
    cr_assert(http_answer_transient(&in_ok), "a 200 carrying a transient error");
}
