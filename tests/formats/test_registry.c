/* The registry of checkpoint formats (formats/registry.h): the built-in
 * formats by name, the detection order (Megatron-Core's torch_dist before
 * the DCP it is made of, this toolkit's own as the fallback), a registered
 * format asked first and opened through formats_source_open, its refusals
 * passed on, and a source of each kind giving its own handle only. Run from
 * the repository root (the DCP fixture of tests/data). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../../common/error.h"
#include "../../formats/registry.h"
#include "../support/fixture.h"

TestSuite(registry, .init = make_dir, .fini = remove_dir);

Test(registry, builtin_formats_by_name)
{
    const char *names[] = {"tp", "megatron", "torch_dist", "dcp"};
    for (int i = 0; i < 4; i++) {
        const checkpoint_format *f = formats_find(names[i]);
        cr_assert(f, "%s", names[i]);
        cr_assert_str_eq(f->name, names[i]);
        cr_assert(f->title && *f->title);
        cr_assert(f->open);
    }
    cr_assert_null(formats_find("zarr"));
    cr_assert_null(formats_find("tp")->detect, "this toolkit's format is the fallback");
}

Test(registry, a_directory_of_nothing_is_asked_of_the_fallback)
{
    const checkpoint_format *f = NULL;
    cr_assert_eq(formats_detect(dir, &f), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(f->name, "tp");
    formats_source *s = NULL;
    cr_assert_neq(formats_source_open(dir, NULL, NULL, &s), TP_OK);
    cr_assert_null(s);
    cr_assert(strstr(tp_errmsg(), dir), "the message names the path: %s", tp_errmsg());
}

Test(registry, a_dcp_checkpoint_is_detected_and_opened)
{
    const char *path = "tests/data/dcp/cols2";
    const checkpoint_format *f = NULL;
    cr_assert_eq(formats_detect(path, &f), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(f->name, "dcp");
    formats_source *s = NULL;
    cr_assert_eq(formats_source_open(path, NULL, NULL, &s), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(formats_source_format(s), f);
    cr_assert(formats_source_reader(s));
    cr_assert(ckpt_reader_num_tensors(formats_source_reader(s)) > 0);
    cr_assert(formats_source_dcp(s));
    cr_assert_null(formats_source_megatron(s));
    cr_assert_null(formats_source_megatron_dist(s));
    cr_assert_null(formats_source_megatron_config(s));
    formats_source_close(s);
}

/* A format of a test: a directory holding a file named "marked" is one;
 * its open refuses, or gives the DCP fixture's reader as its own. */
static int opened, closed;

static int marked_detect(const char *path, int *found)
{
    char marker[600];
    snprintf(marker, sizeof marker, "%s/marked", path);
    struct stat st;
    *found = stat(marker, &st) == 0;
    return TP_OK;
}

static void close_marked(void *handle)
{
    cr_assert_eq(handle, &opened);
    closed++;
}

static int marked_open(const char *path, const formats_source_options *options, formats_source *source)
{
    (void)options;
    opened++;
    if (strstr(path, "refuse")) return tp_fail(TP_ERR_FORMAT, "%s: refused by the test's format", path);
    ckpt_reader *reader = NULL;
    dcp_checkpoint *d = NULL;
    TP_TRY(dcp_open("tests/data/dcp/cols2", &d));
    int status = dcp_reader_open(d, 0, 1, &reader);
    dcp_close(d);
    TP_TRY(status);
    formats_source_attach(source, &opened, close_marked, reader);
    return TP_OK;
}

Test(registry, a_registered_format_is_asked_first)
{
    static const checkpoint_format marked = {"marked", "a test's format", marked_detect, marked_open};
    cr_assert_eq(formats_register(&marked), TP_OK, "%s", tp_errmsg());
    cr_assert_neq(formats_register(&marked), TP_OK, "the same name twice");
    cr_assert(strstr(tp_errmsg(), "marked exists already"), "%s", tp_errmsg());
    cr_assert_eq(formats_find("marked"), &marked);

    /* A DCP directory that carries the mark: the registered format wins. */
    char path[600];
    snprintf(path, sizeof path, "%s/ok", dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    char marker[700];
    snprintf(marker, sizeof marker, "%s/marked", path);
    FILE *f = fopen(marker, "w");
    cr_assert(f);
    fclose(f);
    const checkpoint_format *found = NULL;
    cr_assert_eq(formats_detect(path, &found), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(found, &marked);
    formats_source *s = NULL;
    cr_assert_eq(formats_source_open(path, NULL, NULL, &s), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(formats_source_format(s), &marked);
    cr_assert(ckpt_reader_num_tensors(formats_source_reader(s)) > 0);
    cr_assert_null(formats_source_dcp(s), "a registered format's handle is its own");
    formats_source_close(s);
    cr_assert_eq(closed, 1, "its handle closed once");

    snprintf(path, sizeof path, "%s/refuse", dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(marker, sizeof marker, "%s/marked", path);
    cr_assert((f = fopen(marker, "w")));
    fclose(f);
    s = NULL;
    cr_assert_eq(formats_source_open(path, NULL, NULL, &s), TP_ERR_FORMAT);
    cr_assert_null(s);
    cr_assert(strstr(tp_errmsg(), "refused by the test's format"), "%s", tp_errmsg());

    /* Anything else is still asked of the built-ins. */
    cr_assert_eq(formats_detect("tests/data/dcp/cols2", &found), TP_OK);
    cr_assert_str_eq(found->name, "dcp");
}
