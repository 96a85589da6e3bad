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
int ckpt_commit_directory(const store_ops *storage, store_staged *staged, const char *path,
                          const ckpt_layout *layout, const ckpt_train_state *state, const ckpt_write_options *options);

/* A distributed commit without a shared file system: each process
 * describes its own shard file (pp, tp, and dp > 0 for a data-parallel
 * file, format 1.6) of the staging directory as a part
 * of the index (ckpt_index_part_to_json text, malloc'ed), and one process
 * builds the whole index.json text from every part (parts[k] NULL: a
 * process without a shard), refusing a shard described twice or never.
 * The index is the one ckpt_commit_directory would build from the files. */
int ckpt_describe_shard(const store_ops *storage, const char *staging, const ckpt_layout *layout, int shard_pp,
                        int shard_tp, int shard_dp, char **out);
int ckpt_index_from_parts(const ckpt_layout *layout, const ckpt_train_state *state, const char *const *parts,
                          int count, const char *where, char **out, int64_t *bytes /* of its files; may be NULL */);

#endif
