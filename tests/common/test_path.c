/* tp_path_within (common/path.c), the rule behind "an output is never
 * written inside its input": paths resolved as the system would (links
 * followed, "." and ".."), an output that does not exist yet placed by its
 * parent, a link counted both where it stands and where it leads, URLs
 * compared by location (not spelling), a sibling whose name merely starts the same not inside. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/error.h"
#include "../../common/path.h"

static char root[256];

static void make_tree(void)
{
    snprintf(root, sizeof root, "/tmp/tp_path_XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    char p[512];
    snprintf(p, sizeof p, "%s/ckpt", root);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/ckpt/shard.h5", root);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fclose(f);
    snprintf(p, sizeof p, "%s/ckpt-other", root);
    cr_assert_eq(mkdir(p, 0755), 0);
    char target[512];
    snprintf(target, sizeof target, "%s/ckpt", root);
    snprintf(p, sizeof p, "%s/link", root);
    cr_assert_eq(symlink(target, p), 0);
    snprintf(target, sizeof target, "%s/ckpt/shard.h5", root);
    snprintf(p, sizeof p, "%s/shard-link", root); /* outside, pointing in */
    cr_assert_eq(symlink(target, p), 0);
}

static void remove_tree(void)
{
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s'", root);
    cr_assert_eq(system(command), 0);
}

/* Whether ROOT/path lies within ROOT/outer (either may be absolute when it starts with '/'). */
static int within(const char *path, const char *outer)
{
    char a[512], b[512];
    snprintf(a, sizeof a, path[0] == '/' || strstr(path, "://") ? "%.0s%s" : "%s/%s", root, path);
    snprintf(b, sizeof b, outer[0] == '/' || strstr(outer, "://") ? "%.0s%s" : "%s/%s", root, outer);
    int in = -1;
    cr_assert_eq(tp_path_within(a, b, &in), TP_OK, "%s in %s: %s", a, b, tp_errmsg());
    return in;
}

TestSuite(path, .init = make_tree, .fini = remove_tree);

Test(path, an_entry_inside_existing_or_not)
{
    cr_assert_eq(within("ckpt/shard.h5", "ckpt"), 1);
    cr_assert_eq(within("ckpt/not-yet", "ckpt"), 1, "an output that does not exist yet");
    cr_assert_eq(within("ckpt/a/b/c", "ckpt"), 1, "nor its parents");
    cr_assert_eq(within("ckpt", "ckpt"), 1, "a path is within itself");
    cr_assert_eq(within("ckpt/", "ckpt"), 1, "a trailing slash");
    cr_assert_eq(within("ckpt/../ckpt/x", "ckpt"), 1, "..");
    cr_assert_eq(within("./ckpt/./x", "ckpt"), 1, ".");
    cr_assert_eq(within("ckpt", "ckpt/shard.h5"), 0, "the reverse");
    cr_assert_eq(within("ckpt-other/x", "ckpt"), 0, "a sibling whose name starts the same");
    cr_assert_eq(within("ckpt-other", "ckpt"), 0);
    cr_assert_eq(within("ckpt/x", "no-such"), 0, "nothing lies in what does not exist");
    cr_assert_eq(within("ckpt/x", "/"), 1, "everything lies in /");
}

Test(path, links_followed)
{
    cr_assert_eq(within("link/x", "ckpt"), 1, "through a link to the directory");
    cr_assert_eq(within("ckpt/x", "link"), 1, "the input given as a link");
    cr_assert_eq(within("shard-link", "ckpt"), 1, "a link outside that points inside");
    cr_assert_eq(within("link", "ckpt"), 1, "the link itself leads to the directory");
    cr_assert_eq(within("ckpt-other/y", "link"), 0);
}

Test(path, urls_as_text)
{
    cr_assert_eq(within("s3://b/run/step_1/x", "s3://b/run"), 1);
    cr_assert_eq(within("s3://b/run", "s3://b/run/"), 1);
    cr_assert_eq(within("s3://b/run2", "s3://b/run"), 0);
    cr_assert_eq(within("http://h/run/x", "s3://b/run"), 0, "another scheme");
    cr_assert_eq(within("s3://b/run", "ckpt"), 0, "a URL and a local path never overlap");
    cr_assert_eq(within("ckpt/x", "s3://b/run"), 0);
}

/* Two spellings of one location are one location: `tp-reshard URL -o
 * URL' --force` replaced its input when URL' was URL spelled with "//",
 * another name of the loopback host, a dot segment or an escape. */
Test(path, urls_spelled_otherwise)
{
    const char *same[][2] = {
        {"http://127.0.0.1:8080//y/src", "http://127.0.0.1:8080/y/src"},
        {"http://localhost:8080/y/src", "http://127.0.0.1:8080/y/src"},
        {"http://127.0.0.2:8080/y/src", "http://[::1]:8080/y/src"},
        {"HTTP://LocalHost:8080/y/src", "http://127.0.0.1:8080/y/src"},
        {"http://h/x/%73rc", "http://h:80/x/src"},
        {"https://h:443/x/src", "https://H/x/src"},
        {"http://h/x/../x/./src", "http://h/x/src"},
        {"http://user@h/x/src/step_1", "http://h/x/src"},
        {"s3://b/run/./step_1/../step_2/x", "s3://b/run"},
        {"http://h/x/sp%2fc/d", "http://h/x/sp%2Fc"},
        {"http://h/x/%2e%2e/src", "http://h/src"}, /* servers decode, then take the dots */
        {"http://h/x/%2E/src", "http://h/x/src"},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        cr_assert_eq(within(same[i][0], same[i][1]), 1, "%s within %s", same[i][0], same[i][1]);
    const char *apart[][2] = {
        {"http://h:8081/y/src", "http://h:8080/y/src"},   /* another port */
        {"https://h/y/src", "http://h/y/src"},            /* another scheme */
        {"http://h2/y/src", "http://h/y/src"},            /* another host */
        {"http://h/y/src2", "http://h/y/src"},            /* a sibling */
        {"http://h/y/../src", "http://h/y/src"},          /* /src */
        {"http://h/x/sp%2Fc", "http://h/x/sp"},           /* an escaped '/' is no separator */
        {"http://128.0.0.1/y/src", "http://localhost/y/src"},
    };
    for (size_t i = 0; i < sizeof apart / sizeof apart[0]; i++)
        cr_assert_eq(within(apart[i][0], apart[i][1]), 0, "%s within %s", apart[i][0], apart[i][1]);
}

/* A directory given with trailing slashes ("run/", a URL pasted with one)
 * is the same directory: joined with one separator, never "run//name",
 * which an object store took for another key (`tp-ckpt info s3://b/run/`
 * found no index; `copy` to "URL/step_3/" uploaded "step_3//shard..."). */
Test(path, a_join_takes_one_separator)
{
    char out[TP_PATH_MAX];
    const char *cases[][3] = {
        {"run", "latest", "run/latest"},
        {"run/", "latest", "run/latest"},
        {"run///", "latest", "run/latest"},
        {"/", "tmp", "/tmp"},
        {"s3://bkt/run/", "index.json", "s3://bkt/run/index.json"},
        {"http://127.0.0.1:8080/run//", "step_00000003", "http://127.0.0.1:8080/run/step_00000003"},
        {"s3://bkt/", "run", "s3://bkt/run"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(tp_path_join(out, cases[i][0], cases[i][1]), TP_OK, "%s", tp_errmsg());
        cr_assert_str_eq(out, cases[i][2], "%s + %s", cases[i][0], cases[i][1]);
    }
}

/* The form the object stores send: runs of '/' after the scheme made one,
 * a trailing one kept (a WebDAV collection's). */
Test(path, canonical_urls)
{
    char out[TP_PATH_MAX];
    const char *cases[][2] = {
        {"s3://bkt/run//step_00000003//shard.h5", "s3://bkt/run/step_00000003/shard.h5"},
        {"http://h:1/run//", "http://h:1/run/"},
        {"http://h:1/run", "http://h:1/run"},
        {"s3://bkt", "s3://bkt"},
        {"local//dir/", "local/dir/"},
        /* dot segments taken, as curl sends the request (a listing then names what was asked) */
        {"http://h:1/z/./out2", "http://h:1/z/out2"},
        {"http://h:1/x/../x/src/", "http://h:1/x/src/"},
        {"http://h:1/x/..", "http://h:1/"},
        {"http://h:1/..", "http://h:1/"},
        {"s3://bkt/a/.", "s3://bkt/a/"},
        {"local/./dir/../x", "local/./dir/../x"}, /* a local path is the system's to resolve */
        {"http://h/a/b?x=/../c", "http://h/a/b?x=/../c"}, /* a query or fragment as it is */
        {"http://h/a/./b#/../x", "http://h/a/b#/../x"},
        {"http://h?x=/a/../b", "http://h?x=/a/../b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(tp_path_canonical(cases[i][0], out, sizeof out), TP_OK, "%s", tp_errmsg());
        cr_assert_str_eq(out, cases[i][1], "%s", cases[i][0]);
    }
    char small[8];
    cr_assert_eq(tp_path_canonical("s3://bkt/run", small, sizeof small), TP_ERR_ARG, "too long for out");
}

/* An http(s) URL holding a space (or a control character) is refused,
 * naming its %-encoded spelling: curl refused it after a retry as "URL
 * using bad/illegal format", and encoding it for the user would give one
 * resource two spellings that comparisons of URLs take as two. s3:// keys
 * and local paths take a space as they always did. */
Test(path, an_http_url_with_a_space_is_refused_naming_its_encoded_spelling)
{
    cr_assert_eq(tp_url_refuse_unencoded("http://h:81/my run/step_1"), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "http://h:81/my run/step_1: a space in an http(s) URL"), "%s", tp_errmsg());
    cr_assert(strstr(tp_errmsg(), "write it %20 (http://h:81/my%20run/step_1)"), "%s", tp_errmsg());
    cr_assert_eq(tp_url_refuse_unencoded("https://h/a\tb"), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "a control character in an http(s) URL is not sent as it is: write it %09 "
                                  "(https://h/a%09b)"), "%s", tp_errmsg());
    cr_assert_eq(tp_url_refuse_unencoded("http://h/my%20run"), TP_OK);
    cr_assert_eq(tp_url_refuse_unencoded("s3://bucket/my run/step_1"), TP_OK);
    cr_assert_eq(tp_url_refuse_unencoded("/tmp/my run/step_1"), TP_OK);
}
