/* AWS Signature Version 4 (store/sigv4.h) against the published test-suite
 * vectors (credentials AKIDEXAMPLE, 2015-08-30T12:36:00Z, us-east-1,
 * service "service": canonical request, string to sign and signature) and
 * the S3 documentation's GET Object example (a ranged read, as the
 * object-store reader makes them). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../store/sigv4.h"
#include "../../common/error.h"

static const sigv4_key suite_key = {"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", NULL, "us-east-1",
                                    "service"};
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define SUITE_DATE "20150830T123600Z"
#define SUITE_CREDENTIAL "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "

static void expect_authorization(const sigv4_key *key, const sigv4_request *r, const char *want, const char *name)
{
    char *got = NULL;
    cr_assert_eq(sigv4_authorization(key, r, &got), TP_OK, "%s: %s", name, tp_errmsg());
    cr_assert_str_eq(got, want, "%s", name);
    cr_assert_null(strstr(got, key->secret_key), "%s: the secret is in the header", name);
    free(got);
}

Test(sigv4, get_vanilla_canonical_request_string_to_sign_and_signature)
{
    sigv4_pair headers[] = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", SUITE_DATE}};
    sigv4_request r = {"GET", "/", NULL, 0, headers, 2, EMPTY_SHA256, SUITE_DATE};
    char *creq = NULL, *sts = NULL;
    cr_assert_eq(sigv4_canonical_request(&r, &creq), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(creq, "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" EMPTY_SHA256);
    cr_assert_eq(sigv4_string_to_sign(&suite_key, &r, &sts), TP_OK);
    cr_assert_str_eq(sts, "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
                          "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
    free(creq);
    free(sts);
    expect_authorization(&suite_key, &r,
                         SUITE_CREDENTIAL "SignedHeaders=host;x-amz-date, "
                                          "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
                         "get-vanilla");
}

Test(sigv4, query_parameters_are_sorted)
{
    sigv4_pair headers[] = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", SUITE_DATE}};
    sigv4_pair query[] = {{"Param2", "value2"}, {"Param1", "value1"}};
    sigv4_request r = {"GET", "/", query, 2, headers, 2, EMPTY_SHA256, SUITE_DATE};
    char *creq = NULL, *sts = NULL;
    cr_assert_eq(sigv4_canonical_request(&r, &creq), TP_OK);
    cr_assert(strstr(creq, "\n/\nParam1=value1&Param2=value2\n"), "%s", creq);
    cr_assert_eq(sigv4_string_to_sign(&suite_key, &r, &sts), TP_OK);
    cr_assert(strstr(sts, "816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0"), "%s", sts);
    free(creq);
    free(sts);
    expect_authorization(&suite_key, &r,
                         SUITE_CREDENTIAL "SignedHeaders=host;x-amz-date, "
                                          "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
                         "get-vanilla-query-order-key-case");
}

Test(sigv4, methods_headers_and_paths_of_the_suite)
{
    sigv4_pair plain[] = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", SUITE_DATE}};
    sigv4_request post = {"POST", "/", NULL, 0, plain, 2, EMPTY_SHA256, SUITE_DATE};
    expect_authorization(&suite_key, &post,
                         SUITE_CREDENTIAL "SignedHeaders=host;x-amz-date, "
                                          "Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
                         "post-vanilla");

    sigv4_pair value_case[] = {{"Host", "example.amazonaws.com"}, {"My-Header1", "VALUE1"}, {"X-Amz-Date", SUITE_DATE}};
    sigv4_request r1 = {"POST", "/", NULL, 0, value_case, 3, EMPTY_SHA256, SUITE_DATE};
    expect_authorization(&suite_key, &r1,
                         SUITE_CREDENTIAL "SignedHeaders=host;my-header1;x-amz-date, "
                                          "Signature=cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d",
                         "post-header-value-case");

    sigv4_pair trim[] = {{"Host", "example.amazonaws.com"},
                         {"My-Header1", " value1"},
                         {"My-Header2", "\"a   b   c\""},
                         {"X-Amz-Date", SUITE_DATE}};
    sigv4_request r2 = {"GET", "/", NULL, 0, trim, 4, EMPTY_SHA256, SUITE_DATE};
    expect_authorization(&suite_key, &r2,
                         SUITE_CREDENTIAL "SignedHeaders=host;my-header1;my-header2;x-amz-date, "
                                          "Signature=acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736",
                         "get-header-value-trim");

    sigv4_pair duplicate[] = {{"Host", "example.amazonaws.com"},
                              {"My-Header1", "value2"},
                              {"My-Header1", "value2"},
                              {"My-Header1", "value1"},
                              {"X-Amz-Date", SUITE_DATE}};
    sigv4_request r3 = {"GET", "/", NULL, 0, duplicate, 5, EMPTY_SHA256, SUITE_DATE};
    char *creq = NULL;
    cr_assert_eq(sigv4_canonical_request(&r3, &creq), TP_OK);
    cr_assert(strstr(creq, "\nmy-header1:value2,value2,value1\n"), "repeated names joined in order: %s", creq);
    free(creq);
    expect_authorization(&suite_key, &r3,
                         SUITE_CREDENTIAL "SignedHeaders=host;my-header1;x-amz-date, "
                                          "Signature=c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea",
                         "get-header-key-duplicate");

    sigv4_request r4 = {"GET", "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", NULL, 0, plain, 2,
                        EMPTY_SHA256, SUITE_DATE};
    expect_authorization(&suite_key, &r4,
                         SUITE_CREDENTIAL "SignedHeaders=host;x-amz-date, "
                                          "Signature=07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f",
                         "get-unreserved");
}

Test(sigv4, s3_ranged_get_of_the_s3_documentation)
{
    const sigv4_key s3 = {"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", NULL, "us-east-1", "s3"};
    sigv4_pair headers[] = {{"Host", "examplebucket.s3.amazonaws.com"},
                            {"Range", "bytes=0-9"},
                            {"x-amz-content-sha256", EMPTY_SHA256},
                            {"x-amz-date", "20130524T000000Z"}};
    sigv4_request r = {"GET", "/test.txt", NULL, 0, headers, 4, EMPTY_SHA256, "20130524T000000Z"};
    expect_authorization(&s3, &r,
                         "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                         "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                         "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
                         "S3 GET Object");
}

Test(sigv4, paths_and_query_values_are_encoded_once)
{
    sigv4_pair headers[] = {{"Host", "h"}, {"X-Amz-Date", SUITE_DATE}};
    sigv4_pair query[] = {{"prefix", "step_0/a b"}, {"list-type", "2"}, {"uploads", ""}};
    sigv4_request r = {"GET", "/bucket/run dir/ሴ.h5", query, 3, headers, 2, "UNSIGNED-PAYLOAD", SUITE_DATE};
    char *creq = NULL;
    cr_assert_eq(sigv4_canonical_request(&r, &creq), TP_OK);
    cr_assert(strstr(creq, "GET\n/bucket/run%20dir/%E1%88%B4.h5\nlist-type=2&prefix=step_0%2Fa%20b&uploads=\n"), "%s",
              creq);
    cr_assert(strstr(creq, "\nUNSIGNED-PAYLOAD") != NULL);
    free(creq);
    sigv4_request bad = {"GET", "no-slash", NULL, 0, headers, 2, EMPTY_SHA256, SUITE_DATE};
    cr_assert_eq(sigv4_canonical_request(&bad, &creq), TP_ERR_ARG);
    char hex[65];
    sigv4_sha256_hex("", 0, hex);
    cr_assert_str_eq(hex, EMPTY_SHA256);
}
