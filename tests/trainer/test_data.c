/* Token files (docs/DATA.md "Token files"): llm.c's two formats, GPT-2's
 * uint16 tokens and Llama-3's uint32 ones, written here as llm.c's
 * dev/data/data_common.py write_datafile writes them; a pair of magic and
 * version of neither refused; a size that is not the count times the
 * width refused; both widths in one glob read as one stream; files shorter
 * than a window reported. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/error.h"
#include "../../trainer/data.h"
#include "../support/fixture.h"

TestSuite(data, .init = make_dir, .fini = remove_dir);

/* llm.c's vocabulary of Llama 3 (the llama-3.2-1b preset's). */
#define LLAMA3_VOCAB 128256

/* dir/name: a header of 256 int32 ([0] magic, [1] version, [2] count,
 * the rest 0), then bytes of tokens; the path into path. */
static void write_file(char *path, size_t size, const char *name, int32_t magic, int32_t version, int32_t count,
                       const void *tokens, size_t bytes)
{
    snprintf(path, size, "%s/%s", dir, name);
    int32_t header[DATA_HEADER_INTS] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(header, sizeof header, 1, f), 1);
    if (bytes) cr_assert_eq(fwrite(tokens, bytes, 1, f), 1);
    cr_assert_eq(fclose(f), 0);
}

static void write_u16(char *path, size_t size, const char *name, const uint32_t *ids, int32_t n)
{
    uint16_t *t = malloc((size_t)n * sizeof *t);
    for (int32_t i = 0; i < n; i++) t[i] = (uint16_t)ids[i];
    write_file(path, size, name, DATA_MAGIC_GPT2, DATA_VERSION_GPT2, n, t, (size_t)n * sizeof *t);
    free(t);
}

static void write_u32(char *path, size_t size, const char *name, const uint32_t *ids, int32_t n)
{
    write_file(path, size, name, DATA_MAGIC_LLAMA3, DATA_VERSION_LLAMA3, n, ids, (size_t)n * sizeof *ids);
}

/* Ids over the whole of Llama 3's vocabulary, most above 65535. */
static void llama_ids(uint32_t *ids, int n, uint32_t salt)
{
    for (int i = 0; i < n; i++) ids[i] = (uint32_t)(((uint64_t)i * 2654435761u + salt) % LLAMA3_VOCAB);
}

Test(data, uint32_tokens_of_llama3_files_are_read_whole)
{
    enum { N = 40000 }; /* several of the reader's chunks */
    uint32_t *ids = malloc(N * sizeof *ids);
    llama_ids(ids, N, 7);
    int above = 0;
    for (int i = 0; i < N; i++) above += ids[i] > 65535;
    cr_assert_gt(above, N / 3, "the test's ids should mostly be above uint16's range");
    char path[700];
    write_u32(path, sizeof path, "llama3_val_000000.bin", ids, N);

    dataset *d = NULL;
    cr_assert_eq(dataset_open(&d, path, LLAMA3_VOCAB, 1), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(dataset_tokens(d), N);
    cr_assert_eq(dataset_longest_file(d), N);
    int *got = malloc(N * sizeof *got);
    cr_assert_eq(dataset_read_tokens(d, 0, N, got), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < N; i++) cr_assert_eq((uint32_t)got[i], ids[i], "token %d: %d, the file has %u", i, got[i], ids[i]);
    cr_assert_eq(dataset_read_tokens(d, 12345, 7, got), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < 7; i++) cr_assert_eq((uint32_t)got[i], ids[12345 + i]);

    /* A training sample is a window of the file: seq + 1 consecutive ids. */
    enum { SEQ = 64 };
    int sample[SEQ + 1];
    for (int64_t s = 0; s < 20; s++) {
        cr_assert_eq(dataset_sample(d, s, SEQ, sample), TP_OK, "%s", tp_errmsg());
        int at = -1;
        for (int i = 0; i + SEQ < N && at < 0; i++)
            if ((uint32_t)sample[0] == ids[i] && (uint32_t)sample[1] == ids[i + 1] && (uint32_t)sample[2] == ids[i + 2])
                at = i;
        cr_assert_geq(at, 0, "sample %lld is no window of the file", (long long)s);
        for (int i = 0; i <= SEQ; i++) cr_assert_eq((uint32_t)sample[i], ids[at + i], "sample %lld token %d", (long long)s, i);
    }
    dataset_close(d);

    /* The model's vocabulary still bounds the ids (65536: uint16's range). */
    cr_assert_eq(dataset_open(&d, path, 65536, 1), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "llama3_val_000000.bin: token ") && strstr(tp_errmsg(), "outside the vocabulary of 65536"),
              "%s", tp_errmsg());
    free(got);
    free(ids);
}

/* The same ids as uint16 and as uint32: the same stream and the same samples. */
Test(data, both_widths_give_the_same_samples)
{
    enum { N = 3000, SEQ = 32 };
    uint32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (uint32_t)((i * 7919u) % 65536);
    char narrow[700], wide[700];
    write_u16(narrow, sizeof narrow, "gpt2.bin", ids, N);
    write_u32(wide, sizeof wide, "llama3.bin", ids, N);
    dataset *a = NULL, *b = NULL;
    cr_assert_eq(dataset_open(&a, narrow, 65536, 5), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(dataset_open(&b, wide, 65536, 5), TP_OK, "%s", tp_errmsg());
    int x[SEQ + 1], y[SEQ + 1];
    for (int64_t s = 0; s < 50; s++) {
        cr_assert_eq(dataset_sample(a, s, SEQ, x), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(dataset_sample(b, s, SEQ, y), TP_OK, "%s", tp_errmsg());
        cr_assert_eq(memcmp(x, y, sizeof x), 0, "sample %lld differs between the widths", (long long)s);
    }
    dataset_close(a);
    dataset_close(b);
}

/* An id at uint32's top is past any vocabulary: refused, not wrapped to a
 * negative int that passes a signed comparison. */
Test(data, a_uint32_id_beyond_int32_is_refused)
{
    uint32_t ids[4] = {1, 2, 0xFFFFFFFFu, 3};
    char path[700];
    write_u32(path, sizeof path, "huge.bin", ids, 4);
    dataset *d = NULL;
    cr_assert_eq(dataset_open(&d, path, (int64_t)1 << 31, 1), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "huge.bin: token 4294967295 at position 2 is outside the vocabulary"), "%s",
              tp_errmsg());
    cr_assert_null(d);
}

Test(data, a_pair_of_magic_and_version_of_neither_format_is_refused)
{
    uint32_t ids[100];
    llama_ids(ids, 100, 1);
    const struct {
        int32_t magic, version;
    } bad[] = {
        {DATA_MAGIC_GPT2, DATA_VERSION_LLAMA3}, /* each magic with the other's version */
        {DATA_MAGIC_LLAMA3, DATA_VERSION_GPT2},
        {20240522, 1}, /* llm.c's eval files (HellaSwag): no token file */
        {0, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char path[700], name[64];
        snprintf(name, sizeof name, "bad%zu.bin", i);
        write_file(path, sizeof path, name, bad[i].magic, bad[i].version, 100, ids, sizeof ids);
        dataset *d = NULL;
        cr_assert_eq(dataset_open(&d, path, LLAMA3_VOCAB, 1), TP_ERR_FORMAT, "magic %d version %d", bad[i].magic,
                     bad[i].version);
        char want[128];
        snprintf(want, sizeof want, "%s: not a token file of a known format (magic %d, version %d;", name,
                 bad[i].magic, bad[i].version);
        cr_assert(strstr(tp_errmsg(), want), "%s", tp_errmsg());
        cr_assert(strstr(tp_errmsg(), "magic 20240520 version 1, uint16 tokens") &&
                      strstr(tp_errmsg(), "magic 20240801 version 7, uint32 tokens"),
                  "the known pairs are named: %s", tp_errmsg());
    }
}

/* The size is the header's count times 4: uint16 tokens under a Llama-3
 * header (half the bytes), a cut file, and bytes beyond the count. */
Test(data, a_llama3_file_whose_size_is_not_four_bytes_a_token_is_refused)
{
    uint32_t ids[101];
    llama_ids(ids, 101, 3);
    char path[700];
    dataset *d = NULL;
    write_file(path, sizeof path, "half.bin", DATA_MAGIC_LLAMA3, DATA_VERSION_LLAMA3, 100, ids, 200);
    cr_assert_eq(dataset_open(&d, path, LLAMA3_VOCAB, 1), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "half.bin: header says 100 tokens (400 bytes of uint32), the file holds 50 "),
              "%s", tp_errmsg());
    write_file(path, sizeof path, "cut.bin", DATA_MAGIC_LLAMA3, DATA_VERSION_LLAMA3, 100, ids, 398);
    cr_assert_eq(dataset_open(&d, path, LLAMA3_VOCAB, 1), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "cut.bin: header says 100 tokens (400 bytes of uint32), the file holds 99 "), "%s",
              tp_errmsg());
    write_file(path, sizeof path, "long.bin", DATA_MAGIC_LLAMA3, DATA_VERSION_LLAMA3, 100, ids, 402);
    cr_assert_eq(dataset_open(&d, path, LLAMA3_VOCAB, 1), TP_ERR_FORMAT);
    cr_assert(strstr(tp_errmsg(), "long.bin: header says 100 tokens (400 bytes of uint32), the file holds 402 bytes "
                                  "after the header"),
              "%s", tp_errmsg());
    cr_assert_null(d);
}

/* One glob, both widths: each file read with its own, as one stream. */
Test(data, a_glob_of_both_widths_is_one_stream)
{
    enum { A = 500, B = 700 };
    uint32_t a[A], b[B];
    for (int i = 0; i < A; i++) a[i] = (uint32_t)(i % 65536);
    llama_ids(b, B, 11);
    char path[700], pattern[700];
    write_u16(path, sizeof path, "shard_0.bin", a, A);
    write_u32(path, sizeof path, "shard_1.bin", b, B);
    snprintf(pattern, sizeof pattern, "%s/shard_*.bin", dir);
    dataset *d = NULL;
    cr_assert_eq(dataset_open(&d, pattern, LLAMA3_VOCAB, 1), TP_OK, "%s", tp_errmsg());
    cr_assert_eq(dataset_tokens(d), A + B);
    int got[A + B];
    cr_assert_eq(dataset_read_tokens(d, 0, A + B, got), TP_OK, "%s", tp_errmsg());
    for (int i = 0; i < A + B; i++)
        cr_assert_eq((uint32_t)got[i], i < A ? a[i] : b[i - A], "token %d of the stream", i);
    /* Across the boundary: the last of the uint16 file, the first of the uint32 one. */
    cr_assert_eq(dataset_read_tokens(d, A - 2, 4, got), TP_OK, "%s", tp_errmsg());
    cr_assert(got[0] == (int)a[A - 2] && got[1] == (int)a[A - 1] && got[2] == (int)b[0] && got[3] == (int)b[1]);
    dataset_close(d);
}

/* Files shorter than a window are reported, the first few named, in the
 * glob's order; none is when all hold one. */
Test(data, files_shorter_than_a_window_are_reported)
{
    uint32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = (uint32_t)i;
    char path[700], pattern[700];
    write_u16(path, sizeof path, "f_a.bin", ids, 40);
    write_u32(path, sizeof path, "f_b.bin", ids, 20);
    write_u16(path, sizeof path, "f_c.bin", ids, 100);
    write_u16(path, sizeof path, "f_d.bin", ids, 10);
    write_u32(path, sizeof path, "f_e.bin", ids, 32);
    snprintf(pattern, sizeof pattern, "%s/f_*.bin", dir);
    dataset *d = NULL;
    cr_assert_eq(dataset_open(&d, pattern, 256, 1), TP_OK, "%s", tp_errmsg());
    const char *names[2];
    int64_t counts[2];
    cr_assert_eq(dataset_files_shorter_than(d, 33, names, counts, 2), 3); /* b, d, e: 20, 10 and 32 < 33 */
    cr_assert(strstr(names[0], "/f_b.bin") && counts[0] == 20, "%s %lld", names[0], (long long)counts[0]);
    cr_assert(strstr(names[1], "/f_d.bin") && counts[1] == 10, "%s %lld", names[1], (long long)counts[1]);
    cr_assert_eq(dataset_files_shorter_than(d, 10, names, counts, 2), 0);
    dataset_close(d);
    cr_assert_eq(dataset_open(&d, NULL, 256, 1), TP_OK);
    cr_assert_eq(dataset_files_shorter_than(d, 33, names, counts, 2), 0, "the synthetic dataset has no files");
    dataset_close(d);
}

/* ------------------------------------------ the fuzzing corpus, replayed */

#include "../fuzz/fuzz_data.c"

/* tests/fuzz/corpus/data (token files written by `tp-train prepare`, and
 * crashes found by `make fuzz`): each opened and read as fuzz_data does. */
Test(data, fuzz_corpus)
{
    cr_assert_gt(replay_corpus("data", LLVMFuzzerTestOneInput), 0);
}
