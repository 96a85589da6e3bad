/* data.h: training samples by global index, independent of the layout.
 *
 * A token file (llm.c's formats, docs/DATA.md: uint16 or uint32 tokens) or
 * a glob of them is one stream; sample i is the window of seq+1 tokens inside
 * one file at an offset drawn from (seed, i).
 * Without a file, a synthetic dataset: sample i is a sequence drawn from
 * (seed, i) where each token follows its predecessor by a fixed rule with
 * probability 3/4 and is uniform otherwise, so the loss falls toward the
 * entropy of that process (dataset_loss_floor). */
#ifndef TP_DATA_H
#define TP_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct dataset dataset;

/* pattern NULL: the synthetic dataset over vocab tokens. Fails (tp_status)
 * naming the file and what is wrong with it. */
int dataset_open(dataset **out, const char *pattern, int64_t vocab, uint64_t seed);
void dataset_close(dataset *d);

/* tokens[seq + 1] of sample index. Fails (tp_status, naming the file)
 * when a token file was cut short or rewritten with tokens outside the
 * vocabulary since it was opened, or when none holds seq + 1 tokens. */
int dataset_sample(const dataset *d, int64_t index, int64_t seq, int *tokens);

/* Tokens in the files (0 for the synthetic dataset). */
int64_t dataset_tokens(const dataset *d);

/* Tokens in the longest file (0 for the synthetic dataset): a sample of
 * seq + 1 tokens is a window inside one file. */
int64_t dataset_longest_file(const dataset *d);

/* How many files hold fewer than window tokens (training never samples
 * them, while evaluation's stream reads them); the paths (owned by d) and
 * token counts of the first min(that, max_names) of them, in the glob's
 * order, into names and counts. 0 for the synthetic dataset. */
int dataset_files_shorter_than(const dataset *d, int64_t window, const char **names, int64_t *counts, int max_names);

/* Tokens [first, first + count) of the files read as one stream, in the
 * glob's order (for evaluation windows). Fails with TP_ERR_ARG when the
 * range is not inside the stream (or the dataset is synthetic). */
int dataset_read_tokens(const dataset *d, int64_t first, int64_t count, int *tokens);

/* Expected loss (nats per token) of a perfect model: the synthetic data's
 * entropy rate; -1 for files. */
double dataset_loss_floor(const dataset *d);

/* Writes text as a token file with the byte-level vocabulary (256 tokens)
 * at out_path, whole or not at all: under a staging name of its own beside
 * it (store/staging.h), synced, then renamed into place; removed on failure
 * and by the signal clean-up (store_discard_all_staged). An existing output
 * is replaced only with overwrite, and only when it is a token file; the
 * input itself (by any path) never is. Refusals are TP_ERR_EXISTS, naming
 * what is there. */
int dataset_prepare(const char *text_path, const char *out_path, int overwrite);

/* llm.c's token files (dev/data/data_common.py, HEADERS_INFO): a header of
 * DATA_HEADER_INTS int32, [0] magic, [1] version, [2] the token count, then
 * the tokens, whose width the (magic, version) pair says. prepare writes the
 * GPT-2 one (its 256-token vocabulary fits). */
#define DATA_HEADER_INTS 256
#define DATA_MAGIC_GPT2 20240520 /* version 1: uint16 tokens */
#define DATA_VERSION_GPT2 1
#define DATA_MAGIC_LLAMA3 20240801 /* version 7: uint32 tokens (vocabularies over 65536) */
#define DATA_VERSION_LLAMA3 7

#endif
