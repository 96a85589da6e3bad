/* Data-parallel files (format 1.6): a sharded optimizer's ranks each write
 * the optimizer state they keep (1.7, ZeRO-3: and parameters) into their
 * shard's data-parallel file; the commit, the parts of an object-store
 * commit and the reader take the checkpoint as one. What may not be there
 * is refused: a piece written twice or by nobody, such files in an index of
 * an older version, a parameter in one in an index of 1.6. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../ckpt/ckpt.h"
#include "../../ckpt/commit.h"
#include "../../store/store.h"
#include "../support/fixture.h"

TestSuite(dp_files, .init = make_dir, .fini = remove_dir);

/* tp 2, pp 1, dp 2, one layer: a column-split weight w [8, 3] and a
 * replicated bias b [3], each with both Adam moments. */
enum { W, B, W_AVG, W_AVG_SQ, B_AVG, B_AVG_SQ, TENSORS };
static const ckpt_layout layout = {2, 1, 2, 1, 1};
static const char *const names[TENSORS] = {"model/layers.0.w", "model/layers.0.b",
                                           "optim/layers.0.w.exp_avg", "optim/layers.0.w.exp_avg_sq",
                                           "optim/layers.0.b.exp_avg", "optim/layers.0.b.exp_avg_sq"};
static const char *const roles[TENSORS] = {"param", "param", "exp_avg", "exp_avg_sq", "exp_avg", "exp_avg_sq"};
/* The data-parallel rank that writes each tensor: the parameters the first,
 * the moments split as a sharded optimizer splits them; with ZeRO-3 the
 * parameters split too. */
static const int usual_writer[TENSORS] = {0, 0, 0, 1, 1, 1};
static const int zero3_writer[TENSORS] = {1, 0, 0, 1, 1, 1};

static ckpt_tensor_desc describe(int k)
{
    int weight = k == W || k == W_AVG || k == W_AVG_SQ;
    ckpt_tensor_desc d = {.name = names[k], .role = roles[k], .param = weight ? names[W] : names[B],
                          .dtype = TP_FP32, .ndim = weight ? 2 : 1, .shape = {weight ? 8 : 3, 3},
                          .anchor = CKPT_ANCHOR_LAYER, .layer = 0};
    if (weight) d.partition.kind = CKPT_SPLIT;
    return d;
}

/* Logical value i of tensor k. */
static float value_of(int k, int64_t i) { return (float)(k * 1000 + i); }

/* Writes the file (tp, dp) of the one stage: the tensors writer[k] assigns
 * to dp, and `also` (-1: none) besides. */
static int write_file(const char *path, int tp, int dp, const int *writer, int also)
{
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    options.shard_pp = 0;
    options.shard_tp = tp;
    options.shard_dp = dp;
    ckpt_writer *w;
    TP_TRY(ckpt_writer_create(&w, path, &layout, &options));
    int status = TP_OK, ids[TENSORS];
    for (int k = 0; k < TENSORS && !status; k++) {
        ckpt_tensor_desc d = describe(k);
        int here = writer[k] == dp || k == also;
        status = here ? ckpt_writer_add_tensor(w, &d, &ids[k]) : ckpt_writer_add_tensor_elsewhere(w, &d, &ids[k]);
    }
    for (int k = 0; k < TENSORS && !status; k++) {
        int piece = describe(k).partition.kind == CKPT_SPLIT ? tp : 0;
        if (!ckpt_writer_owns_piece(w, ids[k], piece)) continue;
        float values[12];
        int64_t n = describe(k).ndim == 2 ? 12 : 3, first = describe(k).ndim == 2 ? 12 * tp : 0;
        for (int64_t i = 0; i < n; i++) values[i] = value_of(k, first + i);
        status = ckpt_writer_put_piece(w, ids[k], piece, values);
    }
    if (status) {
        ckpt_writer_abort(w);
        return status;
    }
    return ckpt_writer_finish(w);
}

/* Stages a checkpoint of every file writer[] gives work to; `also`: a
 * tensor the data-parallel file of rank 1 writes too. */
static void stage(const char *path, const int *writer, int also)
{
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    cr_assert_eq(ckpt_stage_prepare(path, &options), TP_OK, "%s", tp_errmsg());
    for (int tp = 0; tp < 2; tp++)
        for (int dp = 0; dp < 2; dp++) cr_assert_eq(write_file(path, tp, dp, writer, dp ? also : -1), TP_OK, "%s", tp_errmsg());
}

static int commit(const char *path)
{
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    ckpt_train_state state = {3, 12, "{}", NULL, "[]", NULL};
    return ckpt_commit_staged(path, &layout, &state, &options);
}

static void read_file_text(const char *path, char **text)
{
    int64_t size;
    cr_assert_eq(store_read_text_file(path, 1 << 24, text, &size), TP_OK, "%s", tp_errmsg());
}

/* Every value of the checkpoint at path where writer[] put it, verified whole. */
static void check_reads_as_one(const char *path, const int *writer)
{
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    int major, minor;
    ckpt_reader_version(r, &major, &minor);
    cr_assert(major == 1 && minor == 7, "format %d.%d", major, minor);
    cr_assert_eq(ckpt_reader_num_files(r), 4, "two shards, each with a data-parallel file");
    for (int k = 0; k < TENSORS; k++) {
        int i = ckpt_reader_find(r, names[k]);
        cr_assert_geq(i, 0, "%s", names[k]);
        float values[24];
        ckpt_tensor_desc d = describe(k);
        int64_t n = d.ndim == 2 ? 24 : 3, start[2] = {0, 0};
        cr_assert_eq(ckpt_reader_read_region(r, i, start, d.shape, values, sizeof values), TP_OK, "%s", tp_errmsg());
        for (int64_t e = 0; e < n; e++) cr_assert_eq(values[e], value_of(k, e), "%s [%lld]", names[k], (long long)e);
        for (int p = 0; p < (describe(k).ndim == 2 ? 2 : 1); p++) {
            ckpt_piece_info info;
            cr_assert_eq(ckpt_reader_piece_info(r, i, p, &info), TP_OK);
            char expect[64];
            if (writer[k]) snprintf(expect, sizeof expect, "shard_pp00_tp%02d_dp01.h5", p);
            else snprintf(expect, sizeof expect, "shard_pp00_tp%02d.h5", p);
            cr_assert_str_eq(info.file, expect, "%s piece %d", names[k], p);
        }
    }
    cr_assert_eq(ckpt_verify_whole(r, 2), TP_OK, "%s", tp_errmsg());
    ckpt_reader_close(r);
}

Test(dp_files, each_rank_writes_its_part_and_the_checkpoint_reads_as_one)
{
    char path[600], file[700];
    snprintf(path, sizeof path, "%s/step_00000003", dir);
    stage(path, usual_writer, -1);
    cr_assert_eq(commit(path), TP_OK, "%s", tp_errmsg());
    check_reads_as_one(path, usual_writer);
    /* The index says which file is whose. */
    char *index;
    snprintf(file, sizeof file, "%s/index.json", path);
    read_file_text(file, &index);
    cr_assert(strstr(index, "\"name\":\t\"shard_pp00_tp01_dp01.h5\",\n\t\t\t\"pp\":\t0,\n\t\t\t\"tp\":\t1,\n\t\t\t\"dp\":\t1"),
              "%s", index);
    free(index);
}

/* An object store's commit: each writer describes its own file, the parts
 * build the index the commit of the directory builds, byte for byte. */
Test(dp_files, described_files_build_the_committed_index)
{
    char path[600], staging[CKPT_PATH_MAX], file[700];
    snprintf(path, sizeof path, "%s/step_00000003", dir);
    stage(path, usual_writer, -1);
    cr_assert_eq(store_staging_path(path, NULL, staging, sizeof staging), TP_OK);
    char *parts[4] = {NULL};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(ckpt_describe_shard(store_posix(), staging, &layout, 0, i / 2, i % 2, &parts[i]), TP_OK, "%s",
                     tp_errmsg());
    ckpt_train_state state = {3, 12, "{}", NULL, "[]", NULL};
    /* The data-parallel files' parts first: the index lists them after the shards' files all the same. */
    const char *order[4] = {parts[3], parts[1], parts[2], parts[0]};
    char *built = NULL, *refused = NULL, *committed = NULL;
    cr_assert_eq(ckpt_index_from_parts(&layout, &state, order, 4, path, &built, NULL), TP_OK, "%s", tp_errmsg());
    const char *twice[5] = {parts[0], parts[1], parts[2], parts[3], parts[3]};
    cr_assert_eq(ckpt_index_from_parts(&layout, &state, twice, 5, path, &refused, NULL), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp01_dp01.h5 is described twice"), "%s", tp_errmsg());
    const char *missing[3] = {parts[0], parts[2], parts[3]};
    cr_assert_eq(ckpt_index_from_parts(&layout, &state, missing, 3, path, &refused, NULL), TP_ERR_STATE);
    cr_assert(strstr(tp_errmsg(), "optim/layers.0.w.exp_avg_sq has no piece 0"), "%s", tp_errmsg());
    /* Without any data-parallel file, tensors are missing whole: the parts say what their shards hold. */
    cr_assert_eq(ckpt_index_from_parts(&layout, &state, (const char *const[]){parts[0], parts[2]}, 2, path, &refused,
                                       NULL),
                 TP_ERR_STATE);
    cr_assert(strstr(tp_errmsg(), "declared 6 tensors in shard pp=0 tp=0, its files hold 3"), "%s", tp_errmsg());
    cr_assert_null(refused);
    cr_assert_eq(commit(path), TP_OK, "%s", tp_errmsg());
    snprintf(file, sizeof file, "%s/index.json", path);
    read_file_text(file, &committed);
    /* Built from parts in another order, the data-parallel files are listed in the order the parts came. */
    cr_assert(strstr(built, "shard_pp00_tp01_dp01.h5") < strstr(built, "shard_pp00_tp00_dp01.h5"));
    char *reordered = NULL;
    const char *in_order[4] = {parts[0], parts[1], parts[2], parts[3]};
    cr_assert_eq(ckpt_index_from_parts(&layout, &state, in_order, 4, path, &reordered, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_str_eq(reordered, committed);
    for (int i = 0; i < 4; i++) free(parts[i]);
    free(built);
    free(reordered);
    free(committed);
}

/* ZeRO-3 (format 1.7): a parameter's pieces in a data-parallel file, and
 * the index that says so refused by a reader of 1.6 rules. */
Test(dp_files, a_parameter_goes_to_a_data_parallel_file_from_format_1_7)
{
    char path[600];
    snprintf(path, sizeof path, "%s/step_00000003", dir);
    stage(path, zero3_writer, -1);
    cr_assert_eq(commit(path), TP_OK, "%s", tp_errmsg());
    check_reads_as_one(path, zero3_writer);
    edit_index(path, "\"format_version\":\t\\[1, 7\\]", "\"format_version\":\t[1, 6]");
    ckpt_reader *r = NULL;
    cr_assert_neq(ckpt_reader_open(&r, path, NULL), TP_OK);
    cr_assert(strstr(tp_errmsg(), "the shard's own file (a parameter before format 1.7)"), "%s", tp_errmsg());
}

Test(dp_files, data_parallel_files_of_ranks_the_layout_has_only)
{
    char path[600];
    snprintf(path, sizeof path, "%s/step_00000003", dir);
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    cr_assert_eq(ckpt_stage_prepare(path, &options), TP_OK, "%s", tp_errmsg());
    /* Data-parallel numbers the layout has, for distributed writers only. */
    ckpt_writer *w = NULL;
    options.shard_pp = 0;
    options.shard_tp = 0;
    options.shard_dp = 2;
    cr_assert_eq(ckpt_writer_create(&w, path, &layout, &options), TP_ERR_ARG);
    cr_assert(strstr(tp_errmsg(), "data-parallel file 2: outside 1..1"), "%s", tp_errmsg());
    ckpt_write_options whole;
    ckpt_write_options_init(&whole);
    whole.shard_dp = 1;
    char other[600];
    snprintf(other, sizeof other, "%s/whole", dir);
    cr_assert_eq(ckpt_writer_create(&w, other, &layout, &whole), TP_ERR_ARG);
    cr_assert_null(w);
}

Test(dp_files, a_piece_written_twice_or_by_nobody_is_not_committed)
{
    char path[600];
    snprintf(path, sizeof path, "%s/step_00000003", dir);
    stage(path, usual_writer, W_AVG); /* the first moments by both ranks */
    cr_assert_eq(commit(path), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "optim/layers.0.w.exp_avg piece 0 is stored twice"), "%s", tp_errmsg());
    cr_assert_eq(access(path, F_OK), -1, "nothing published");

    snprintf(path, sizeof path, "%s/step_00000004", dir);
    const int nobody[TENSORS] = {0, 0, 0, -1, 1, 1};
    stage(path, nobody, -1);
    /* Nobody's tensor is in no file: the shards' writers declared it. */
    cr_assert_eq(commit(path), TP_ERR_STATE);
    cr_assert(strstr(tp_errmsg(), "the writer of shard_pp00_tp00.h5 declared 6 tensors in shard pp=0 tp=0, its files "
                                  "hold 5 (a data-parallel file missing?)"),
              "%s", tp_errmsg());
    cr_assert_eq(access(path, F_OK), -1, "nothing published");
}

/* A file of a data-parallel rank the layout does not have, left in the
 * staging directory, is not taken for part of the checkpoint. */
Test(dp_files, a_file_outside_the_layout_is_refused_at_commit)
{
    char path[600], staging[CKPT_PATH_MAX], from[CKPT_PATH_MAX + 64], to[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/step_00000003", dir);
    stage(path, usual_writer, -1);
    cr_assert_eq(store_staging_path(path, NULL, staging, sizeof staging), TP_OK);
    snprintf(from, sizeof from, "%s/shard_pp00_tp00_dp01.h5", staging);
    snprintf(to, sizeof to, "%s/shard_pp00_tp00_dp05.h5", staging);
    cr_assert_eq(rename(from, to), 0);
    cr_assert_eq(commit(path), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00_dp05.h5 is not a file of layout tp=2 pp=1 dp=2"), "%s",
              tp_errmsg());
}

/* The index, edited (and sealed again): data-parallel files in an index of
 * format 1.5, and a parameter's piece said to be in one that does not hold
 * it, are refused. */
Test(dp_files, the_index_holds_data_parallel_files_to_the_rules)
{
    char path[600], file[700];
    snprintf(path, sizeof path, "%s/step_00000003", dir);
    stage(path, usual_writer, -1);
    cr_assert_eq(commit(path), TP_OK, "%s", tp_errmsg());
    snprintf(file, sizeof file, "%s/index.json", path);
    char *index;
    read_file_text(file, &index);
    struct {
        const char *from, *to, *message; /* from: an extended regular expression */
    } cases[] = {
        {"\"format_version\":\t\\[1, 7\\]", "\"format_version\":\t[1, 5]", "data-parallel files need format 1.6"},
        {"\"file\":\t\"shard_pp00_tp00\\.h5\"", "\"file\":\t\"shard_pp00_tp00_dp01.h5\"",
         "shard_pp00_tp00_dp01.h5: the index's data extents overlap or lie outside the file"},
        {"\"dp\":\t1", "\"dp\":\t2", "field 'dp' missing or not an integer in range"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        edit_index(path, cases[c].from, cases[c].to);
        ckpt_reader *r = NULL;
        int status = ckpt_reader_open(&r, path, NULL);
        if (!status) { /* a piece said to be where it is not: a 1.7 index may say so, reading finds out */
            status = ckpt_verify_whole(r, 1);
            ckpt_reader_close(r);
        }
        cr_assert_neq(status, TP_OK, "case %zu passed", c);
        cr_assert(strstr(tp_errmsg(), cases[c].message), "case %zu: %s", c, tp_errmsg());
        FILE *f = fopen(file, "w"); /* the committed index back, sealed as it was */
        cr_assert(f);
        fputs(index, f);
        cr_assert_eq(fclose(f), 0);
    }
    free(index);
}
