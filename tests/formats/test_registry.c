/* The registry of checkpoint formats (formats/registry.h): the built-in
 * formats by name, the detection order (Megatron-Core's torch_dist before
 * the DCP it is made of, this toolkit's own as the fallback), a registered
 * format asked first and opened through formats_source_open, its refusals
 * passed on, and a source of each kind giving its own handle only; writing
 * through the registry: each built-in format's writer planned, written and
 * read back, a registered format's writer used, a read-only format and a
 * writer missing a part refused. Run from the repository root (the DCP
 * fixture of tests/data). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
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
        cr_assert(f->writer && f->writer->plan && f->writer->write && f->writer->free_plan && f->writer->may_replace,
                  "%s is written as well as read", names[i]);
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

/* A true vocabulary is Megatron's formats' alone: another format's source
 * is refused once open (a path that is nothing says that instead). */
Test(registry, a_true_vocabulary_is_taken_by_megatrons_formats_alone)
{
    cr_assert(formats_find("megatron")->pads_vocabulary && formats_find("torch_dist")->pads_vocabulary);
    cr_assert(!formats_find("dcp")->pads_vocabulary && !formats_find("tp")->pads_vocabulary);
    formats_source_options told = {.true_vocab = 30};
    formats_source *s = NULL;
    cr_assert_eq(formats_source_open("tests/data/dcp/cols2", NULL, &told, &s), TP_ERR_ARG);
    cr_assert_null(s);
    cr_assert(strstr(tp_errmsg(), "cols2: a true vocabulary size applies to a Megatron checkpoint (Megatron-LM legacy or "
                                  "Megatron-Core torch_dist), not to this one (PyTorch distributed checkpoint)"),
              "%s", tp_errmsg());
    char missing[600];
    snprintf(missing, sizeof missing, "%s/nothing", dir);
    cr_assert_neq(formats_source_open(missing, NULL, &told, &s), TP_OK);
    cr_assert(strstr(tp_errmsg(), "no such checkpoint"), "%s", tp_errmsg());
    /* The torch_dist fixture: 30 tokens in 32 rows. */
    cr_assert_eq(formats_source_open("tests/data/megatron-dist/dp_reshardable", NULL, &told, &s), TP_OK, "%s",
                 tp_errmsg());
    ckpt_reader *r = formats_source_reader(s);
    int table = ckpt_reader_find(r, "embedding.word_embeddings.weight");
    cr_assert_geq(table, 0);
    cr_assert_eq(ckpt_reader_tensor(r, table)->shape[0], 30);
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
    static const checkpoint_format marked = {"marked", "a test's format", marked_detect, marked_open, NULL, 0};
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

/* The DCP fixture written through the registry as format at tp, then
 * reopened as that format: every tensor's values equal (logical digests). */
static void write_and_read_back(const char *format_name, int tp, const char *target_words)
{
    formats_source *source = NULL;
    cr_assert_eq(formats_source_open("tests/data/dcp/cols2", NULL, &(formats_source_options){.compute_digests = 1},
                                     &source), TP_OK, "%s", tp_errmsg());
    const checkpoint_format *format = formats_find(format_name);
    formats_write_options options;
    formats_write_options_init(&options);
    options.reshard.tp = tp;
    options.reshard.pp = 1;
    options.reshard.threads = 1;
    formats_write_plan *plan = NULL;
    cr_assert_eq(formats_write_plan_create(source, format, &options, &plan), TP_OK, "%s", tp_errmsg());
    const formats_write_summary *s = formats_write_plan_summary(plan);
    cr_assert_eq(s->to.tp, tp);
    cr_assert(strstr(s->target, target_words), "%s: %s", format_name, s->target);
    cr_assert(s->bytes_written > 0);
    cr_assert(s->details >= 4, "the plan says files, tensors, bytes and memory: %d lines", s->details);
    cr_assert(cJSON_GetObjectItemCaseSensitive(s->json, "format"), "the JSON names the format");
    char out[600];
    snprintf(out, sizeof out, "%s/%s", dir, format_name);
    cr_assert_eq(formats_write(plan, out), TP_OK, "%s", tp_errmsg());
    formats_write_plan_free(plan);

    formats_source *back = NULL;
    cr_assert_eq(formats_source_open(out, format, &(formats_source_options){.compute_digests = 1}, &back), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(ckpt_reader_layout(formats_source_reader(back))->tp == tp ||
                     ckpt_reader_saved_layout(formats_source_reader(back))->tp == tp,
                 1, "%s read back at tp%d", format_name, tp);
    reshard_verify_result checked;
    cr_assert_eq(reshard_verify(formats_source_reader(source), formats_source_reader(back), 1, &checked), TP_OK, "%s",
                 tp_errmsg());
    cr_assert_eq(checked.mismatches, 0, "%s: %s", format_name, checked.first_mismatch);
    cr_assert_eq(checked.tensors, ckpt_reader_num_tensors(formats_source_reader(source)));
    formats_source_close(back);
    formats_source_close(source);
}

Test(registry, this_toolkits_format_written_through_the_registry)
{
    write_and_read_back("tp", 1, "tp1pp1");
}

Test(registry, a_dcp_written_through_the_registry)
{
    write_and_read_back("dcp", 1, "PyTorch distributed checkpoint, tp1pp1");
}

Test(registry, a_source_of_no_megatron_model_is_not_written_as_megatrons)
{
    formats_source *source = NULL;
    cr_assert_eq(formats_source_open("tests/data/dcp/cols2", NULL, NULL, &source), TP_OK, "%s", tp_errmsg());
    formats_write_options options;
    formats_write_options_init(&options);
    formats_write_plan *plan = NULL;
    const char *formats[] = {"megatron", "torch_dist"};
    for (int i = 0; i < 2; i++) {
        cr_assert_neq(formats_write_plan_create(source, formats_find(formats[i]), &options, &plan), TP_OK, "%s",
                      formats[i]);
        cr_assert_null(plan);
        cr_assert(strstr(tp_errmsg(), "not a Megatron model") && strstr(tp_errmsg(), "cols2"), "%s", tp_errmsg());
    }
    options.reshard.virtual_stages = 2;
    options.reshard.pp = 2;
    cr_assert_neq(formats_write_plan_create(source, formats_find("dcp"), &options, &plan), TP_OK);
    cr_assert(strstr(tp_errmsg(), "--to tp1pp2v2: chunks of layers interleaved over the stages"), "%s", tp_errmsg());
    formats_source_close(source);
}

/* --dtype, --compress and --device cuda are this toolkit's format's alone:
 * another format's writer copies the source's dtypes, uncompressed, on the
 * CPU, and refuses them rather than ignore them (they were dropped without
 * a word: a "bf16" output still fp32). Their values that say what it does
 * anyway (keep, none, cpu) pass. */
Test(registry, options_only_this_toolkits_format_honours_are_refused_by_the_others)
{
    formats_source *source = NULL;
    cr_assert_eq(formats_source_open("tests/data/dcp/cols2", NULL, NULL, &source), TP_OK, "%s", tp_errmsg());
    const struct {
        int dtype, level;
        reshard_device device;
        const char *refusal;
    } cases[] = {
        {TP_BF16, -1, RESHARD_DEVICE_AUTO, "--dtype bf16 applies to this toolkit's format (--format tp): a %s output "
                                           "(--format %s) keeps the source's dtypes"},
        {-1, 3, RESHARD_DEVICE_AUTO, "--compress zstd:3 applies to this toolkit's format (--format tp): a %s output "
                                     "(--format %s) is not compressed"},
        {-1, -1, RESHARD_DEVICE_CUDA, "--device cuda applies to this toolkit's format (--format tp): a %s output "
                                      "(--format %s) is written on the CPU"},
    };
    const char *formats[] = {"dcp", "megatron", "torch_dist"};
    for (size_t f = 0; f < sizeof formats / sizeof *formats; f++) {
        const checkpoint_format *format = formats_find(formats[f]);
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            formats_write_options options;
            formats_write_options_init(&options);
            options.reshard.param_dtype = cases[i].dtype;
            options.reshard.compress_level = cases[i].level;
            options.reshard.device = cases[i].device;
            char expected[512], why[256];
            snprintf(expected, sizeof expected, cases[i].refusal, format->title, format->name);
            cr_assert_eq(formats_write_ignored_option(format, &options, why, sizeof why), 1, "%s: case %zu", formats[f], i);
            cr_assert_str_eq(why, expected);
            formats_write_plan *plan = NULL;
            cr_assert_eq(formats_write_plan_create(source, format, &options, &plan), TP_ERR_ARG, "%s: case %zu",
                         formats[f], i);
            cr_assert_null(plan);
            cr_assert_str_eq(tp_errmsg(), expected);
            /* This toolkit's own format honours each. */
            cr_assert_eq(formats_write_ignored_option(formats_find("tp"), &options, why, sizeof why), 0);
        }
        formats_write_options options;
        formats_write_options_init(&options);
        options.reshard.compress_level = 0; /* --compress none */
        options.reshard.device = RESHARD_DEVICE_CPU;
        char why[256];
        cr_assert_eq(formats_write_ignored_option(format, &options, why, sizeof why), 0, "%s", formats[f]);
    }
    formats_write_options options;
    formats_write_options_init(&options);
    options.reshard.device = RESHARD_DEVICE_CPU;
    options.reshard.compress_level = 0;
    formats_write_plan *plan = NULL;
    cr_assert_eq(formats_write_plan_create(source, formats_find("dcp"), &options, &plan), TP_OK, "%s", tp_errmsg());
    formats_write_plan_free(plan);
    formats_source_close(source);
}

/* A writer of a test: its plan counts the source's tensors; its write
 * leaves a file holding that count. */
static int marked_plan(formats_source *source, const formats_write_options *options, formats_write_summary *s,
                       void **state)
{
    (void)options;
    int *count = malloc(sizeof *count);
    cr_assert(count);
    *count = ckpt_reader_num_tensors(formats_source_reader(source));
    *state = count;
    snprintf(s->target, sizeof s->target, "marked, %d tensors", *count);
    return TP_OK;
}

static int marked_write(void *state, const char *path)
{
    if (mkdir(path, 0755)) return tp_fail(TP_ERR_IO, "%s: cannot make it", path);
    char file[700];
    snprintf(file, sizeof file, "%s/marked", path);
    FILE *f = fopen(file, "w");
    if (!f) return tp_fail(TP_ERR_IO, "%s: cannot write", file);
    fprintf(f, "%d\n", *(int *)state);
    fclose(f);
    return TP_OK;
}

static int freed;

static void marked_free(void *state)
{
    freed++;
    free(state);
}

static int marked_may_replace(const store_ops *storage, const char *path, void *ctx)
{
    (void)storage, (void)path, (void)ctx;
    return TP_OK;
}

Test(registry, a_registered_format_is_written_by_its_writer)
{
    static const formats_writer half = {marked_plan, NULL, marked_free, marked_may_replace};
    static const checkpoint_format broken = {"broken", "a test's format", marked_detect, marked_open, &half, 0};
    cr_assert_neq(formats_register(&broken), TP_OK, "a writer without a write");
    cr_assert(strstr(tp_errmsg(), "a writer needs"), "%s", tp_errmsg());
    cr_assert_null(formats_find("broken"));

    static const formats_writer writer = {marked_plan, marked_write, marked_free, marked_may_replace};
    static const checkpoint_format marked = {"marked", "a test's format", marked_detect, marked_open, &writer, 0};
    cr_assert_eq(formats_register(&marked), TP_OK, "%s", tp_errmsg());
    formats_source *source = NULL;
    cr_assert_eq(formats_source_open("tests/data/dcp/cols2", NULL, NULL, &source), TP_OK, "%s", tp_errmsg());
    int tensors = ckpt_reader_num_tensors(formats_source_reader(source));
    formats_write_options options;
    formats_write_options_init(&options);
    formats_write_plan *plan = NULL;
    cr_assert_eq(formats_write_plan_create(source, &marked, &options, &plan), TP_OK, "%s", tp_errmsg());
    char expected[64];
    snprintf(expected, sizeof expected, "marked, %d tensors", tensors);
    cr_assert_str_eq(formats_write_plan_summary(plan)->target, expected);
    char out[600];
    snprintf(out, sizeof out, "%s/out", dir);
    cr_assert_eq(formats_write(plan, out), TP_OK, "%s", tp_errmsg());
    formats_write_plan_free(plan);
    cr_assert_eq(freed, 1, "its plan's state freed once");

    /* Read back as the registered format (the mark is there), and the count written. */
    const checkpoint_format *found = NULL;
    cr_assert_eq(formats_detect(out, &found), TP_OK);
    cr_assert_eq(found, &marked);
    char file[700];
    snprintf(file, sizeof file, "%s/marked", out);
    FILE *f = fopen(file, "r");
    int written = -1;
    cr_assert(f && fscanf(f, "%d", &written) == 1);
    fclose(f);
    cr_assert_eq(written, tensors);

    /* A format without a writer is read, not written. */
    static const checkpoint_format read_only = {"read-only", "read-only test", marked_detect, marked_open, NULL, 0};
    cr_assert_neq(formats_write_plan_create(source, &read_only, &options, &plan), TP_OK);
    cr_assert_null(plan);
    cr_assert(strstr(tp_errmsg(), "read-only test checkpoints are read, not written"), "%s", tp_errmsg());
    formats_source_close(source);
}

/* Detection fails naming the location given (the file a format looked for
 * there may follow), and a scheme no store serves is refused naming the
 * scheme, not ".../latest_checkpointed_iteration.txt", the file Megatron's
 * detect looks for first. */
Test(registry, a_failing_detect_names_the_location)
{
    setenv("TP_REMOTE_RETRIES", "0", 1);
    const checkpoint_format *found = NULL;
    cr_assert_eq(formats_detect("ftp://127.0.0.1/run", &found), TP_ERR_ARG);
    cr_assert(!strncmp(tp_errmsg(), "ftp://127.0.0.1/run: ", 21) && strstr(tp_errmsg(), "not in ftp://") &&
                  !strstr(tp_errmsg(), "latest_checkpointed_iteration"),
              "%s", tp_errmsg());
    cr_assert_eq(formats_detect("http://127.0.0.1:9/run", &found), TP_ERR_IO);
    cr_assert(!strncmp(tp_errmsg(), "http://127.0.0.1:9/run: ", 24), "the location given first: %s", tp_errmsg());
}
