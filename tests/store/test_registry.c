/* The registry of stores (store/registry.c): the one place that recognises
 * a URL. Built-in schemes, local paths, an unknown scheme refused by name,
 * and a scheme registered at run time (a store of the test's own) found by
 * store_for and store_is_remote; a prefix that is not a scheme, or one
 * registered twice, refused. */
#include <criterion/criterion.h>
#include <string.h>

#include "../../common/error.h"
#include "../../store/store.h"

Test(registry, built_in_schemes_and_local_paths)
{
    const store_ops *s = NULL;
    cr_assert_eq(store_for("s3://bucket/run", &s), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(s, store_s3());
    cr_assert_eq(store_for("http://127.0.0.1:8080/run", &s), TP_OK);
    cr_assert_eq(s, store_webdav());
    cr_assert_eq(store_for("https://store.example/run", &s), TP_OK);
    cr_assert_eq(s, store_webdav());
    cr_assert_eq(store_for("runs/gpt/step_00000010", &s), TP_OK);
    cr_assert_eq(s, store_posix());
    cr_assert_eq(store_for("/a/dir:with://colons", &s), TP_OK, "a local path whose name holds :// is local");
    cr_assert_eq(s, store_posix());
    cr_assert(store_is_remote("s3://b/k") && store_is_remote("https://h/p"));
    cr_assert(!store_is_remote("runs/gpt") && !store_is_remote("ftp://h/p"));
}

Test(registry, an_unknown_scheme_is_refused_by_name)
{
    const store_ops *s = NULL;
    cr_assert_eq(store_for("ftp://host/run", &s), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "not in ftp://"), "%s", tp_errmsg());
}

static int fake_stat(const store_ops *s, const char *path, store_stat *out)
{
    (void)s;
    memset(out, 0, sizeof *out);
    out->exists = strcmp(path, "mem://here") == 0;
    return TP_OK;
}

Test(registry, a_store_registered_at_run_time)
{
    static store_ops mem = {.name = "mem"};
    mem.stat = fake_stat;
    cr_assert_eq(store_register("mem://", &mem), TP_OK, "%s", tp_errmsg());
    const store_ops *s = NULL;
    cr_assert_eq(store_for("mem://here", &s), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(s, &mem);
    cr_assert(store_is_remote("mem://here"));
    store_stat st;
    cr_assert_eq(s->stat(s, "mem://here", &st), TP_OK);
    cr_assert(st.exists);
    cr_assert_eq(store_register("mem://", &mem), TP_ERR_EXISTS, "a scheme registered twice");
    cr_assert_eq(store_register("s3://", &mem), TP_ERR_EXISTS, "a built-in scheme taken over");
    cr_assert_eq(store_register("mem", &mem), TP_ERR_ARG, "not a scheme prefix");
    cr_assert_eq(store_register("://", &mem), TP_ERR_ARG, "no scheme");
    cr_assert_eq(store_register("mem://x", &mem), TP_ERR_ARG, "more than a prefix");
}
