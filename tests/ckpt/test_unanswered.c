/* A store that cannot be asked is not a store that said "not there": a
 * failure to stat a checkpoint's index.json (a local disk's EIO; an object
 * store's 503, timeout or redirect fails the same way, tests/e2e/
 * test_store_unanswered.sh) stops the listing of a run directory and the
 * resolution of a checkpoint, naming the index, instead of leaving the step
 * out: a resume then took an older checkpoint for the newest and overwrote
 * the newest with its next save; `latest` was moved back; a replacement
 * took the output for absent. The store here is the POSIX one with stat
 * failing for paths that end as `failing` says, and open failing as an
 * object replaced while read for those that end as `replaced` says (a
 * `latest` moved while it is read is no pointer, not a failure). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../ckpt/internal.h"
#include "../support/fixture.h"

TestSuite(unanswered, .init = make_dir, .fini = remove_dir);

static const char *failing; /* a path suffix whose stat fails; NULL: none */
static int failed_stats;

static int eio_stat(const store_ops *s, const char *path, store_stat *out)
{
    (void)s;
    size_t n = strlen(path), k = failing ? strlen(failing) : 0;
    if (failing && n >= k && strcmp(path + n - k, failing) == 0) {
        memset(out, 0, sizeof *out);
        failed_stats++;
        return tp_fail(TP_ERR_IO, "%s: Input/output error", path);
    }
    return store_posix()->stat(store_posix(), path, out);
}

static const char *replaced; /* a path suffix whose open fails as a file replaced while read; NULL: none */

static int replaced_open(const store_ops *s, const char *path, store_open_mode mode, store_file **out)
{
    (void)s;
    size_t n = strlen(path), k = replaced ? strlen(replaced) : 0;
    if (replaced && n >= k && strcmp(path + n - k, replaced) == 0)
        return tp_fail(TP_ERR_CHECKSUM, "%s changed while it was being read (ETag \"1\", now \"2\")", path);
    return store_posix()->open(store_posix(), path, mode, out);
}

static const store_ops *eio_store(void)
{
    static store_ops store;
    store = *store_posix();
    store.name = "eio";
    store.stat = eio_stat;
    store.open = replaced_open;
    return &store;
}

static char run[600];

/* run/step_00000005 .. step_00000020, committed, `latest` naming step 20. */
static void make_run(void)
{
    snprintf(run, sizeof run, "%s/run", dir);
    cr_assert_eq(mkdir(run, 0755), 0);
    ckpt_layout layout = {1, 1, 1, 0, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.update_latest = 1;
    for (int64_t step = 5; step <= 20; step += 5) {
        char path[700];
        ckpt_train_state state = {step, 0, NULL, NULL, NULL, NULL};
        ckpt_writer *w = NULL;
        snprintf(path, sizeof path, "%s/step_%08lld", run, (long long)step);
        cr_assert_eq(ckpt_writer_create(&w, path, &layout, &options), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(ckpt_writer_commit(w, &state), TP_OK, "%s", tp_errmsg());
    }
    failing = NULL;
    replaced = NULL;
    failed_stats = 0;
}

static void latest_is(const char *name)
{
    char path[700], *text = NULL;
    snprintf(path, sizeof path, "%s/latest", run);
    cr_assert_eq(store_read_text_file(path, 4096, &text, NULL), TP_OK, "%s", tp_errmsg());
    text[strcspn(text, "\n")] = '\0';
    cr_assert_str_eq(text, name);
    free(text);
}

Test(unanswered, store_exists_tells_not_there_from_could_not_ask)
{
    make_run();
    char index[700];
    snprintf(index, sizeof index, "%s/step_00000020/index.json", run);
    int exists = -1;
    cr_assert_eq(store_exists(eio_store(), index, &exists), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(exists, 1);
    cr_assert_eq(store_exists(eio_store(), "/nonexistent/index.json", &exists), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(exists, 0, "not there: answered, 0");
    failing = "step_00000020/index.json";
    cr_assert_eq(store_exists(eio_store(), index, &exists), TP_ERR_IO, "could not ask: the store's failure");
    cr_assert(strstr(tp_errmsg(), index), "names the path: %s", tp_errmsg());
}

Test(unanswered, a_failing_stat_of_the_newest_index_stops_the_listing)
{
    make_run();
    failing = "step_00000020/index.json";
    ckpt_candidate *list = NULL;
    int count = 0;
    int status = ckpt_candidates_in(eio_store(), run, &list, &count);
    cr_assert_eq(status, TP_ERR_IO, "the listing fails (it had %d candidates, the first %s)", count,
                 count ? list[0].path : "-");
    cr_assert(strstr(tp_errmsg(), "step_00000020/index.json: Input/output error"), "names the index: %s",
              tp_errmsg());
    cr_assert_null(list);
    free(list);
}

Test(unanswered, a_failing_stat_of_the_newest_index_is_no_older_checkpoint)
{
    make_run();
    failing = "step_00000020/index.json";
    char resolved[CKPT_PATH_MAX] = "";
    cr_assert_eq(ckpt_resolve_in(eio_store(), run, resolved), TP_ERR_IO, "resolved to %s", resolved);
    cr_assert(strstr(tp_errmsg(), "step_00000020/index.json: Input/output error"), "%s", tp_errmsg());
    /* The reader (tp-ckpt info and verify of a run directory). */
    ckpt_read_options options;
    ckpt_read_options_init(&options);
    options.storage = eio_store();
    ckpt_reader *r = NULL;
    int status = ckpt_reader_open(&r, run, &options);
    cr_assert_eq(status, TP_ERR_IO, "opened %s", r ? ckpt_reader_path(r) : "-");
    cr_assert(strstr(tp_errmsg(), "step_00000020/index.json"), "%s", tp_errmsg());
    /* The checkpoint itself, named: not "not a checkpoint". */
    char step20[700];
    snprintf(step20, sizeof step20, "%s/step_00000020", run);
    cr_assert_eq(ckpt_resolve_in(eio_store(), step20, resolved), TP_ERR_IO, "%s", tp_errmsg());
    cr_assert_null(strstr(tp_errmsg(), "not a checkpoint"), "%s", tp_errmsg());
}

Test(unanswered, a_failing_stat_of_latest_stops_too)
{
    make_run();
    failing = "run/latest";
    char resolved[CKPT_PATH_MAX] = "";
    cr_assert_eq(ckpt_resolve_in(eio_store(), run, resolved), TP_ERR_IO, "resolved to %s", resolved);
    cr_assert(strstr(tp_errmsg(), "run/latest: Input/output error"), "%s", tp_errmsg());
    ckpt_candidate *list = NULL;
    int count = 0;
    cr_assert_eq(ckpt_candidates_in(eio_store(), run, &list, &count), TP_ERR_IO);
    free(list);
}

Test(unanswered, latest_replaced_while_read_is_no_pointer)
{
    /* A committer moving `latest` while it is read (S3's 412 to If-Match):
     * the newest committed step, not an error, nor an older step. */
    make_run();
    replaced = "run/latest";
    char resolved[CKPT_PATH_MAX] = "";
    cr_assert_eq(ckpt_resolve_in(eio_store(), run, resolved), TP_OK, "%s", tp_errmsg());
    cr_assert(strstr(resolved, "step_00000020"), "%s", resolved);
    /* A committer of an older step compares with it, and leaves `latest`. */
    cr_assert_eq(ckpt_latest_update(eio_store(), run, "step_00000012", 12), TP_OK, "%s", tp_errmsg());
    replaced = NULL;
    latest_is("step_00000020");
}

Test(unanswered, a_failing_stat_of_an_older_index_stops_the_listing)
{
    make_run();
    /* Not the newest: but a listing that leaves a step out is no listing of the run. */
    failing = "step_00000010/index.json";
    ckpt_candidate *list = NULL;
    int count = 0;
    cr_assert_eq(ckpt_candidates_in(eio_store(), run, &list, &count), TP_ERR_IO);
    cr_assert(strstr(tp_errmsg(), "step_00000010/index.json"), "%s", tp_errmsg());
    free(list);
}

Test(unanswered, latest_is_not_moved_back_when_the_newest_cannot_be_asked)
{
    make_run();
    failing = "step_00000020/index.json";
    /* A committer of step 12 compares with what the run resolves to: not -1. */
    int status = ckpt_latest_update(eio_store(), run, "step_00000012", 12);
    cr_assert_eq(status, TP_ERR_IO, "the update fails");
    failing = NULL;
    latest_is("step_00000020");
}

Test(unanswered, what_is_not_there_is_still_not_there)
{
    make_run();
    /* The control: a step without its index is no checkpoint, and the
     * listing goes on without it; so does a damaged `latest`. */
    char index[700], latest[700];
    snprintf(index, sizeof index, "%s/step_00000020/index.json", run);
    cr_assert_eq(remove(index), 0);
    snprintf(latest, sizeof latest, "%s/latest", run);
    FILE *f = fopen(latest, "w");
    cr_assert_not_null(f);
    fputs("step_00000020\n", f);
    fclose(f);
    ckpt_candidate *list = NULL;
    int count = 0;
    cr_assert_eq(ckpt_candidates_in(eio_store(), run, &list, &count), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(count, 3);
    cr_assert(strstr(list[0].path, "step_00000015"), "%s", list[0].path);
    free(list);
    char resolved[CKPT_PATH_MAX];
    cr_assert_eq(ckpt_resolve_in(eio_store(), run, resolved), TP_OK, "%s", tp_errmsg());
    cr_assert(strstr(resolved, "step_00000015"), "%s", resolved);
}

Test(unanswered, a_replacement_does_not_take_an_output_it_could_not_ask_about_for_absent)
{
    make_run();
    char out[700];
    snprintf(out, sizeof out, "%s/out", dir);
    cr_assert_eq(mkdir(out, 0755), 0);
    failing = "/out";
    store_stage_options stage = {.directory = 1, .overwrite = 1, .may_replace = ckpt_may_replace_checkpoint};
    store_staged *staged = NULL;
    int status = store_stage(eio_store(), out, &stage, &staged);
    if (staged) store_staged_discard(staged);
    cr_assert_eq(status, TP_ERR_IO, "staged as if nothing were there");
    cr_assert(strstr(tp_errmsg(), "/out: Input/output error"), "%s", tp_errmsg());
}
