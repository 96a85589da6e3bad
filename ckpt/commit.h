/* commit.h: checksums of finished pieces and the commit of a staging directory. */
#ifndef TP_CKPT_COMMIT_H
#define TP_CKPT_COMMIT_H

#include "internal.h"

/* Seals a finished piece: its block hashes (/checksums/<name>), checksum
 * attribute and logical-digest attribute. */
int ckpt_seal_piece(hid_t file, const char *file_path, const char *tensor_name,
                    const uint64_t *block_hashes, int64_t num_blocks, uint64_t digest);

/* Builds index.json in the staged directory from its shard files, then makes
 * the checkpoint visible at path and updates `latest` as the options say.
 * Consumes staged: on failure its directory is removed. */
int ckpt_commit_directory(const ckpt_storage *storage, ckpt_staged *staged, const char *path,
                          const ckpt_layout *layout, const ckpt_train_state *state, const ckpt_write_options *options);

#endif
