/* commit.h: checksums of finished pieces and the commit of a staging directory. */
#ifndef TP_CKPT_COMMIT_H
#define TP_CKPT_COMMIT_H

#include "internal.h"

/* Stores a piece's block hashes (/checksums/<name>) and its checksum attribute. */
int ckpt_store_checksums(hid_t file, const char *file_path, const char *tensor_name,
                         const uint64_t *block_hashes, int64_t num_blocks);

/* Builds index.json from the staging directory's shard files, then makes the
 * checkpoint visible at path and updates `latest` as the options say. */
int ckpt_commit_directory(const char *staging, const char *path, const ckpt_layout *layout,
                          const ckpt_train_state *state, const ckpt_write_options *options);

#endif
