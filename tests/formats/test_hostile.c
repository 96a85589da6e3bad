/* Hostile and odd safetensors inputs: names holding a NUL, headers past the
 * size limit or that would take gigabytes to parse, an index of 60,000 files
 * (quadratic once), FIFOs where files are read, and the fuzzing corpus of
 * tests/fuzz/corpus/safetensors (crashes found by `make fuzz` included)
 * replayed through the fuzz target. Each ends in an error naming the file,
 * never a crash, a hang or memory out of proportion. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../formats/formats.h"
#include "../support/fixture.h"

TestSuite(hostile_st, .init = make_dir, .fini = remove_dir, .timeout = 60);

/* Writes a safetensors file: the 8-byte length, the header as given, then
 * `data` zero bytes. */
static void write_st(const char *file, const char *header, size_t header_size, size_t data)
{
    FILE *f = fopen(file, "wb");
    cr_assert(f, "%s", file);
    uint64_t n = header_size;
    cr_assert_eq(fwrite(&n, 8, 1, f), 1);
    cr_assert_eq(fwrite(header, 1, header_size, f), header_size);
    for (size_t i = 0; i < data; i++) fputc(0, f);
    fclose(f);
}

static void expect_refused(const char *path, const char *needle, const char *needle2)
{
    safetensors_set *set = NULL;
    int status = safetensors_open(&set, path);
    if (set) safetensors_close(set);
    cr_assert_neq(status, TP_OK, "%s accepted", path);
    cr_assert(strstr(tp_errmsg(), needle), "'%s' not in: %s", needle, tp_errmsg());
    if (needle2) cr_assert(strstr(tp_errmsg(), needle2), "'%s' not in: %s", needle2, tp_errmsg());
}

Test(hostile_st, a_valid_file_opens)
{
    char file[700];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    const char *h = "{\"ab\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_st(file, h, strlen(h), 8);
    safetensors_set *set;
    cr_assert_eq(safetensors_open(&set, file), TP_OK, "%s", tp_errmsg());
    cr_assert(safetensors_find(set, "ab"));
    safetensors_close(set);
}

/* "a\u0000b" would be read as the name "a". */
Test(hostile_st, nul_in_a_name)
{
    char file[700];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    const char *h = "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_st(file, h, strlen(h), 8);
    expect_refused(file, "model.safetensors", "NUL");
    /* a raw zero byte inside the name */
    char raw[128];
    size_t n = (size_t)snprintf(raw, sizeof raw, "{\"aXb\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}");
    raw[3] = '\0';
    write_st(file, raw, n, 8);
    expect_refused(file, "model.safetensors", "NUL");
    /* an escaped backslash before u0000 is no NUL: a valid name */
    h = "{\"a\\\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_st(file, h, strlen(h), 8);
    safetensors_set *set;
    cr_assert_eq(safetensors_open(&set, file), TP_OK, "%s", tp_errmsg());
    cr_assert(safetensors_find(set, "a\\u0000b"));
    safetensors_close(set);
}

/* A header length past the limit is refused from the length alone. */
Test(hostile_st, header_too_large)
{
    char file[700];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    FILE *f = fopen(file, "wb");
    uint64_t n = 100000000; /* the reference implementation's limit, ours is lower */
    fwrite(&n, 8, 1, f);
    fclose(f);
    cr_assert_eq(truncate(file, 8 + 100000000), 0); /* sparse */
    expect_refused(file, "model.safetensors", "100000000");
}

static long peak_rss_mb(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;
}

/* 30 MB of header that is an array of small numbers: plain cJSON took about
 * 1.2 GB for it. */
Test(hostile_st, numbers_header_memory)
{
    char file[700];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    size_t n = 30u << 20;
    char *h = malloc(n);
    h[0] = '[';
    for (size_t i = 1; i + 1 < n; i += 2) memcpy(h + i, "1,", 2);
    h[n - 2] = '1';
    h[n - 1] = ']';
    write_st(file, h, n, 0);
    free(h);
    long before = peak_rss_mb();
    expect_refused(file, "model.safetensors", "memory");
    long after = peak_rss_mb();
    cr_assert_lt(after - before, 100, "opening took %ld MB", after - before);
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* The guards below are against work that grows faster than the input (a
 * quadratic pass took 48 s at 60,000 entries): 60,000 entries must take
 * under 30 times what 6,000 take (plus a second for timing noise), measured
 * in the same run, not under a fixed time, which a loaded machine or
 * AddressSanitizer missed (4.7 s under both, for a linear 1.5 s). Linear
 * work gives 10 times; quadratic, 100. */
static void assert_linear(double small, double large, const char *what)
{
    cr_assert_lt(large, 30.0 * small + 1.0, "%s: 60,000 took %.2f s, 6,000 took %.2f s: more than linear", what, large,
                 small);
}

/* An index of n entries, each naming its own (missing) file: the seconds
 * to refuse it. */
static double index_of_files(int n)
{
    char file[700];
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(file, "w");
    fprintf(f, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\"model.layers.%d.weight\": \"model-%05d-of-%05d.safetensors\"", i ? ", " : "", i, i, n);
    fprintf(f, "}}");
    fclose(f);
    char first[64];
    snprintf(first, sizeof first, "model-00000-of-%05d.safetensors", n);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_refused(dir, first, NULL);
    return seconds_since(&t0);
}

/* The files were deduplicated pairwise (48 s at 60,000); now at once, failing at the first. */
Test(hostile_st, index_of_60000_files)
{
    double small = index_of_files(6000), large = index_of_files(60000);
    assert_linear(small, large, "an index of files");
}

/* n tensors in one file, all listed in the index (and one in a second
 * file, listed first): the seconds to open it. */
static double index_of_tensors(int n)
{
    char file[700];
    size_t cap = 64u << 20, at = 0;
    char *h = malloc(cap);
    at += (size_t)snprintf(h + at, cap - at, "{");
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(h + at, cap - at, "%s\"t%d\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                               i ? "," : "", i, 2 * i, 2 * i + 2);
    at += (size_t)snprintf(h + at, cap - at, "}");
    snprintf(file, sizeof file, "%s/model-00001-of-00002.safetensors", dir);
    write_st(file, h, at, 2 * (size_t)n);
    const char *one = "{\"u\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}}";
    snprintf(file, sizeof file, "%s/model-00002-of-00002.safetensors", dir);
    write_st(file, one, strlen(one), 2);
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(file, "w");
    fprintf(f, "{\"metadata\": {}, \"weight_map\": {\"u\": \"model-00002-of-00002.safetensors\"");
    for (int i = 0; i < n; i++) fprintf(f, ", \"t%d\": \"model-00001-of-00002.safetensors\"", i);
    fprintf(f, "}}");
    fclose(f);
    free(h);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    safetensors_set *set;
    cr_assert_eq(safetensors_open(&set, dir), TP_OK, "%s", tp_errmsg());
    double seconds = seconds_since(&t0);
    cr_assert_eq(safetensors_count(set), n + 1);
    /* files in order of first appearance in the weight map */
    cr_assert(strstr(safetensors_tensor(set, 0)->file, "model-00002-of-00002"), "%s", safetensors_tensor(set, 0)->file);
    safetensors_close(set);
    return seconds;
}

/* 60,000 tensors in one file, all listed in the index: opens at once. */
Test(hostile_st, index_of_60000_tensors)
{
    double small = index_of_tensors(6000), large = index_of_tensors(60000);
    assert_linear(small, large, "an index of tensors");
}

Test(hostile_st, fifo_file, .timeout = 20)
{
    char file[700];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    cr_assert_eq(mkfifo(file, 0644), 0);
    expect_refused(file, "model.safetensors", "FIFO");
    expect_refused(dir, "model.safetensors", "FIFO");
}

Test(hostile_st, fifo_index, .timeout = 20)
{
    char file[700];
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", dir);
    cr_assert_eq(mkfifo(file, 0644), 0);
    expect_refused(dir, "model.safetensors.index.json", "FIFO");
}

/* ------------------------------------------ the fuzzing corpus, replayed */

#define LLVMFuzzerTestOneInput fuzz_safetensors_one
#include "../fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput

Test(hostile_st, fuzz_corpus_safetensors)
{
    cr_assert_gt(replay_corpus("safetensors", fuzz_safetensors_one), 0);
}
