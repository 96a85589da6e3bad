/* Hostile and odd inputs to the checkpoint readers: crafted index.json files
 * (sizes whose arithmetic overflows, absurd checksum blocks, NUL characters,
 * files too large, JSON that would take gigabytes to parse), special files
 * (FIFOs) where a file is read, and the fuzzing corpus of tests/fuzz (crashes
 * found by `make fuzz` included), replayed through the fuzz targets. Each
 * must end in an error naming the file and the tensor: never a crash, a hang
 * or an allocation out of proportion. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../common/json.h"
#include "../../ckpt/index.h"
#include "../support/fixture.h"

TestSuite(hostile, .init = make_dir, .fini = remove_dir, .timeout = 60);

/* A checkpoint of two tensors at tp=2: model/a.weight [64, 64] split on axis
 * 0, model/b.bias [4096] replicated. */
static void checkpoint(const char *path)
{
    ckpt_layout layout = {2, 1, 1, 2, 1};
    static uint8_t data[2][4096 * 4];
    for (size_t b = 0; b < sizeof data; b++) ((uint8_t *)data)[b] = (uint8_t)(b * 7);
    test_tensor t[2];
    memset(t, 0, sizeof t);
    strcpy(t[0].name, "model/a.weight");
    strcpy(t[1].name, "model/b.bias");
    t[0].desc = (ckpt_tensor_desc){.name = t[0].name, .dtype = TP_FP32, .ndim = 2, .shape = {64, 64},
                                   .anchor = CKPT_ANCHOR_LAYER, .layer = 1};
    t[0].desc.partition = (ckpt_partition){CKPT_SPLIT, 0, 0, {0}, 0, 1, 0};
    t[1].desc = (ckpt_tensor_desc){.name = t[1].name, .dtype = TP_BF16, .ndim = 1, .shape = {4096},
                                   .anchor = CKPT_ANCHOR_FIRST};
    t[0].logical = data[0];
    t[1].logical = data[1];
    write_tensors(path, &layout, t, 2, 0, 1);
}

static char *read_all(const char *file, size_t *size)
{
    FILE *f = fopen(file, "rb");
    cr_assert(f, "%s", file);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    cr_assert_eq(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = '\0';
    fclose(f);
    if (size) *size = (size_t)n;
    return text;
}

static void write_all(const char *file, const char *text, size_t size)
{
    FILE *f = fopen(file, "wb");
    cr_assert(f, "%s", file);
    cr_assert_eq(fwrite(text, 1, size, f), size);
    fclose(f);
}

/* Replaces field (dotted: "partition.granule") of the tensor named `tensor`
 * in path/index.json with the JSON value `value`. */
static void craft(const char *path, const char *tensor, const char *field, const char *value)
{
    char file[700];
    snprintf(file, sizeof file, "%s/index.json", path);
    char *text = read_all(file, NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cr_assert(root);
    cJSON *t, *target = NULL;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tensors"))
    if (strcmp(cJSON_GetObjectItem(t, "name")->valuestring, tensor) == 0) target = t;
    cr_assert(target, "no tensor %s", tensor);
    char key[128];
    snprintf(key, sizeof key, "%s", field);
    char *dot = strchr(key, '.');
    if (dot) {
        *dot = '\0';
        target = cJSON_GetObjectItem(target, key);
        memmove(key, dot + 1, strlen(dot + 1) + 1);
    }
    cJSON *v = cJSON_Parse(value);
    cr_assert(v, "%s", value);
    cr_assert(cJSON_ReplaceItemInObjectCaseSensitive(target, key, v), "no field %s", field);
    char *out = cJSON_Print(root);
    write_all(file, out, strlen(out));
    free(out);
    cJSON_Delete(root);
    reseal_index(file); /* the deeper check must answer, not the index's seal */
}

/* Opening and verifying every piece must fail, with a message holding each
 * of the (up to two) needles. */
static void expect_refused(const char *path, const char *needle, const char *needle2)
{
    ckpt_reader *r = NULL;
    int status = ckpt_reader_open(&r, path, NULL);
    for (int i = 0; status == TP_OK && i < ckpt_reader_num_tensors(r); i++) {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(r, i);
        for (int p = 0; status == TP_OK && p < ckpt_piece_count(t, ckpt_reader_layout(r)->tp); p++)
            status = ckpt_reader_verify_piece(r, i, p);
    }
    if (r) ckpt_reader_close(r);
    cr_assert_neq(status, TP_OK, "accepted (expected an error naming '%s')", needle);
    cr_assert(strstr(tp_errmsg(), needle), "'%s' not in: %s", needle, tp_errmsg());
    if (needle2) cr_assert(strstr(tp_errmsg(), needle2), "'%s' not in: %s", needle2, tp_errmsg());
}

Test(hostile, intact_checkpoint_verifies)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    ckpt_reader *r;
    cr_assert_eq(ckpt_reader_open(&r, path, NULL), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_reader_verify_piece(r, 0, 0), TP_OK, "%s", tp_errmsg());
    ckpt_reader_close(r);
}

/* Sizes whose products overflow int64 (they crashed every reader with
 * SIGFPE): refused when the index is read, naming the tensor. */
Test(hostile, shape_overflowing_elements)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    craft(path, "model/a.weight", "shape", "[1099511627776, 1099511627776]");
    craft(path, "model/a.weight", "partition.segments", "[1099511627776]");
    expect_refused(path, "model/a.weight", "2^50");
}

Test(hostile, eight_huge_dimensions)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    craft(path, "model/b.bias", "shape",
          "[1099511627776, 8, 8, 8, 8, 8, 8, 8]");
    expect_refused(path, "model/b.bias", "index.json");
}

Test(hostile, padding_unit_overflow)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    /* tp 2 x pad multiple 2^20 x granule 2^40 = 2^61 rows of padding unit */
    craft(path, "model/a.weight", "shape", "[1099511627776, 64]");
    craft(path, "model/a.weight", "partition.segments", "[1099511627776]");
    craft(path, "model/a.weight", "partition.granule", "1099511627776");
    craft(path, "model/a.weight", "partition.pad_multiple", "1048576");
    expect_refused(path, "model/a.weight", "index.json");
}

Test(hostile, partition_arithmetic_at_the_api)
{
    ckpt_tensor_desc t = {.name = "model/x.weight", .dtype = TP_FP32, .ndim = 1, .shape = {(int64_t)1 << 40},
                          .anchor = CKPT_ANCHOR_FIRST};
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 1, {(int64_t)1 << 40}, (int64_t)1 << 40, 1 << 20, 0};
    /* 4096 x 2^20 x 2^40 wraps to 0: a division by zero before the check */
    cr_assert_neq(ckpt_tensor_check(&t, 4096), TP_OK);
    cr_assert(strstr(tp_errmsg(), "model/x.weight") && strstr(tp_errmsg(), "padding unit"), "%s", tp_errmsg());
    /* segments whose sum overflows (found by fuzz_partition) */
    t.partition = (ckpt_partition){CKPT_SPLIT, 0, 2, {INT64_MAX / 2 + 7, INT64_MAX / 2 + 9}, 1, 0, 0};
    cr_assert_neq(ckpt_tensor_check(&t, 2), TP_OK);
    cr_assert(strstr(tp_errmsg(), "model/x.weight"), "%s", tp_errmsg());
    ckpt_tensor_desc many = {.name = "model/y", .dtype = TP_BF16, .ndim = 8,
                             .shape = {(int64_t)1 << 40, 8, 8, 8, 8, 8, 8, 8}, .anchor = CKPT_ANCHOR_FIRST};
    cr_assert_neq(ckpt_tensor_check(&many, 1), TP_OK);
    cr_assert(strstr(tp_errmsg(), "model/y") && strstr(tp_errmsg(), "2^50"), "%s", tp_errmsg());
}

/* A checksum block larger than the piece made verify allocate 128 TiB. */
Test(hostile, checksum_block_rows_above_rows)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    craft(path, "model/a.weight", "checksum_block_rows", "1099511627776");
    expect_refused(path, "model/a.weight", "checksum_block_rows");
}

Test(hostile, checksum_block_rows_zero)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    craft(path, "model/b.bias", "checksum_block_rows", "0");
    expect_refused(path, "model/b.bias", "checksum_block_rows");
}

/* A NUL in a name would cut it short: "model/a\u0000x" read as "model/a". */
Test(hostile, nul_in_a_name)
{
    char path[600], file[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    snprintf(file, sizeof file, "%s/index.json", path);
    size_t size;
    char *text = read_all(file, &size);
    char *at = strstr(text, "\"model/b.bias\"");
    cr_assert(at);
    /* "model/b.bias" -> "model/b\u0000s": same length, so the rest stays valid */
    memcpy(at + 1, "model/b\\u0000s", 14);
    write_all(file, text, size);
    free(text);
    expect_refused(path, "index.json", "NUL");
}

/* index.json past its size limit: refused from its size, naming both. */
Test(hostile, index_too_large)
{
    char path[600], file[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    snprintf(file, sizeof file, "%s/index.json", path);
    cr_assert_eq(truncate(file, CKPT_INDEX_MAX_BYTES + 1), 0); /* sparse */
    expect_refused(path, "index.json", "too large");
    char limit[32];
    snprintf(limit, sizeof limit, "%lld", (long long)CKPT_INDEX_MAX_BYTES);
    cr_assert(strstr(tp_errmsg(), limit), "%s", tp_errmsg());
}

static long peak_rss_mb(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;
}

/* 30 MB of small numbers: cJSON alone would take ~1.2 GB for it. */
Test(hostile, json_memory_is_bounded)
{
    size_t n = 30u << 20;
    char *text = malloc(n + 1);
    text[0] = '[';
    for (size_t i = 1; i + 1 < n; i += 2) memcpy(text + i, "1,", 2);
    text[n - 1 - (n % 2 == 0)] = '1';
    text[n - 1] = ']';
    text[n] = '\0';
    long before = peak_rss_mb();
    cJSON *value = NULL;
    int status = tp_json_parse(text, n, "numbers.json", &value);
    long after = peak_rss_mb();
    cJSON_Delete(value);
    free(text);
    cr_assert_neq(status, TP_OK, "parsed 30 MB of numbers");
    cr_assert(strstr(tp_errmsg(), "numbers.json") && strstr(tp_errmsg(), "memory"), "%s", tp_errmsg());
    cr_assert_lt(after - before, 64, "parsing took %ld MB", after - before);
}

static void make_fifo(const char *path)
{
    unlink(path);
    cr_assert_eq(mkfifo(path, 0644), 0, "%s", path);
}

/* A FIFO where a file is read blocked every tool forever. */
Test(hostile, fifo_index, .timeout = 20)
{
    char path[600], file[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    snprintf(file, sizeof file, "%s/index.json", path);
    make_fifo(file);
    expect_refused(path, "index.json", "FIFO");
}

Test(hostile, fifo_shard, .timeout = 20)
{
    char path[600], file[700];
    snprintf(path, sizeof path, "%s/ck", dir);
    checkpoint(path);
    snprintf(file, sizeof file, "%s/shard_pp00_tp01.h5", path);
    make_fifo(file);
    expect_refused(path, "shard_pp00_tp01.h5", NULL);
}

Test(hostile, fifo_latest, .timeout = 20)
{
    char run[600], path[700], file[700], out[4096];
    snprintf(run, sizeof run, "%s/run", dir);
    mkdir(run, 0755);
    snprintf(path, sizeof path, "%s/step_00000001", run);
    checkpoint(path);
    snprintf(file, sizeof file, "%s/latest", run);
    make_fifo(file);
    /* Either refused naming it or passed over for the newest step: never a hang. */
    int status = ckpt_resolve(run, out, sizeof out);
    if (status == TP_OK) cr_assert(strstr(out, "step_00000001"), "%s", out);
    else cr_assert(strstr(tp_errmsg(), "latest"), "%s", tp_errmsg());
}

Test(hostile, fifo_text_file, .timeout = 20)
{
    char file[700], *text = NULL;
    snprintf(file, sizeof file, "%s/config.json", dir);
    make_fifo(file);
    cr_assert_neq(store_read_text_file(file, CKPT_CONFIG_MAX_BYTES, &text, NULL), TP_OK);
    cr_assert(strstr(tp_errmsg(), "config.json") && strstr(tp_errmsg(), "FIFO"), "%s", tp_errmsg());
    cr_assert_null(text);
}

/* A FIFO among the shards a distributed commit scans (HDF5 opens them
 * itself, and would block). */
Test(hostile, fifo_shard_at_commit, .timeout = 20)
{
    char path[600];
    snprintf(path, sizeof path, "%s/ck", dir);
    ckpt_layout layout = {2, 1, 1, 1, 1};
    ckpt_write_options options;
    ckpt_write_options_init(&options);
    cr_assert_eq(ckpt_stage_prepare(path, &options), TP_OK, "%s", tp_errmsg());
    /* rank tp=1 writes its shard; where tp=0's would be, a FIFO */
    ckpt_write_options rank = options;
    rank.shard_pp = 0;
    rank.shard_tp = 1;
    ckpt_writer *w;
    cr_assert_eq(ckpt_writer_create(&w, path, &layout, &rank), TP_OK, "%s", tp_errmsg());
    ckpt_tensor_desc b = {.name = "model/b", .dtype = TP_FP32, .ndim = 1, .shape = {3}, .anchor = CKPT_ANCHOR_FIRST};
    int id;
    cr_assert_eq(ckpt_writer_add_tensor(w, &b, &id), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(ckpt_writer_finish(w), TP_OK, "%s", tp_errmsg());
    char staging[1200] = "";
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, "staging")) snprintf(staging, sizeof staging, "%s/%s/shard_pp00_tp00.h5", dir, e->d_name);
    closedir(d);
    cr_assert(staging[0], "no staging directory in %s", dir);
    unlink(staging);
    cr_assert_eq(mkfifo(staging, 0644), 0, "%s", staging);
    cr_assert_neq(ckpt_commit_staged(path, &layout, NULL, &options), TP_OK);
    cr_assert(strstr(tp_errmsg(), "shard_pp00_tp00.h5") && strstr(tp_errmsg(), "FIFO"), "%s", tp_errmsg());
}

/* ------------------------------------------ the fuzzing corpus, replayed */

#define LLVMFuzzerTestOneInput fuzz_index_one
#include "../fuzz/fuzz_index.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_partition_one
#include "../fuzz/fuzz_partition.c"
#undef LLVMFuzzerTestOneInput

Test(hostile, fuzz_corpus_index)
{
    cr_assert_gt(replay_corpus("index", fuzz_index_one), 0);
}

Test(hostile, fuzz_corpus_partition)
{
    cr_assert_gt(replay_corpus("partition", fuzz_partition_one), 0);
}
