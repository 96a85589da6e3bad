/* data.h: training samples by global index, independent of the layout.
 *
 * A token file (llm.c format, docs/DATA.md) or a glob of them is one stream;
 * sample i is the window of seq+1 tokens at an offset drawn from (seed, i).
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

#define DATA_MAGIC 20240520
#define DATA_VERSION 1
#define DATA_HEADER_INTS 256

#endif
