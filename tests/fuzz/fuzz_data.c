/* fuzz_data.c: libFuzzer target for the token files `tp-train --data`
 * reads (trainer/data.c, docs/DATA.md): llm.c's 1024-byte header (magic,
 * version, token count) and uint16 or uint32 tokens. The input is one
 * token file, opened as tp-train opens it against a byte-level vocabulary
 * (256, prepare's), Llama 3's (128256) and the largest a model may have
 * (GPT_MAX_SIZE, 2^31: a uint32 id of 2^31 or more is outside it, and one
 * read as an int must never be negative), alone and in a glob beside a
 * fixed file of the other width. What opens is read as training and eval
 * read it: samples of the shortest and the longest window, a window longer
 * than any file (refused), the whole stream, ranges across the files and
 * past the end (refused); every token read must be inside the vocabulary.
 * Then the file is cut in half under the open dataset, as a run's file
 * may be, and read again: an error, never a crash or a token read from
 * outside it. Each open must succeed or fail with an error, never crash,
 * hang or take memory out of proportion to the file (a header's huge count
 * included). `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../trainer/data.h"
#include "../support/fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fixed second file of the glob: Llama 3's format, 3 uint32 tokens. */
#define FUZZ_DATA_OTHER_TOKENS 3

/* The scratch directory, holding b.bin (the glob's second file), made once. */
static const char *fuzz_data_dir(void)
{
    static int made;
    static char dir[512];
    if (!made) {
        made = 1;
        char path[600];
        int32_t file[DATA_HEADER_INTS + FUZZ_DATA_OTHER_TOKENS] = {DATA_MAGIC_LLAMA3, DATA_VERSION_LLAMA3,
                                                                   FUZZ_DATA_OTHER_TOKENS};
        file[DATA_HEADER_INTS] = 1, file[DATA_HEADER_INTS + 1] = 2, file[DATA_HEADER_INTS + 2] = 255;
        if (fuzz_scratch_dir("data", dir, sizeof dir) == 0) {
            snprintf(path, sizeof path, "%s/b.bin", dir);
            if (fuzz_write_file(path, file, sizeof file)) dir[0] = '\0';
        } else {
            dir[0] = '\0';
        }
    }
    return dir;
}

/* Tokens [0, count) all inside the vocabulary, or the run is a finding. */
static void fuzz_data_check_tokens(const int *tokens, int64_t count, int64_t vocab)
{
    for (int64_t i = 0; i < count; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab) __builtin_trap();
}

/* Reads d as training and evaluation do; its tokens are not kept. */
static void fuzz_data_read(const dataset *d, int64_t vocab)
{
    const int64_t total = dataset_tokens(d), longest = dataset_longest_file(d);
    if (longest < 2 || total < longest) __builtin_trap(); /* a token file holds at least 2 */
    if (total > ((int64_t)1 << 22)) return;               /* an input is far smaller */
    int *tokens = malloc((size_t)(total + 1) * sizeof *tokens);
    if (!tokens) return;
    const int64_t seqs[] = {1, longest - 1, longest / 2 + 1};
    for (int i = 0; i < 3; i++)
        for (int64_t index = 0; index < 3 && seqs[i] >= 1; index++)
            if (dataset_sample(d, index, seqs[i], tokens) == 0) fuzz_data_check_tokens(tokens, seqs[i] + 1, vocab);
    if (dataset_sample(d, 0, longest, tokens) == 0) __builtin_trap(); /* no window of longest + 1 */
    if (dataset_read_tokens(d, 0, total, tokens) == 0) fuzz_data_check_tokens(tokens, total, vocab);
    if (dataset_read_tokens(d, total - 1, 2, tokens) == 0) __builtin_trap(); /* past the end */
    if (dataset_read_tokens(d, longest - 1, total - longest + 1, tokens) == 0)
        fuzz_data_check_tokens(tokens, total - longest + 1, vocab);
    const char *names[1];
    int64_t counts[1];
    if (dataset_files_shorter_than(d, longest + 1, names, counts, 1) < 1) __builtin_trap();
    free(tokens);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_data_dir();
    if (!dir[0]) return 0;
    char path[600], glob[600];
    snprintf(path, sizeof path, "%s/a.bin", dir);
    snprintf(glob, sizeof glob, "%s/[ab].bin", dir);
    static const int64_t vocabs[] = {256, 128256, (int64_t)1 << 31};
    for (int v = 0; v < 3; v++) {
        if (fuzz_write_file(path, data, size)) return 0;
        dataset *d = NULL;
        if (dataset_open(&d, path, vocabs[v], 1) == 0) {
            fuzz_data_read(d, vocabs[v]);
            if (dataset_tokens(d) != dataset_longest_file(d)) __builtin_trap(); /* one file */
            /* Cut short under the open dataset: each read fails or reads
             * tokens of the vocabulary. */
            if (truncate(path, (off_t)(size / 2)) == 0) fuzz_data_read(d, vocabs[v]);
            dataset_close(d);
            if (fuzz_write_file(path, data, size)) return 0;
        }
        if (dataset_open(&d, glob, vocabs[v], 1) == 0) {
            if (dataset_tokens(d) < FUZZ_DATA_OTHER_TOKENS + 2) __builtin_trap(); /* both files */
            fuzz_data_read(d, vocabs[v]);
            dataset_close(d);
        }
    }
    return 0;
}
