/* index.h: the checkpoint index (index.json) in memory. */
#ifndef TP_CKPT_INDEX_H
#define TP_CKPT_INDEX_H

#include "internal.h"

/* Where a piece's stored bytes lie in its shard file (format 1.1): one
 * extent for a contiguous piece, one per chunk (block order) for a
 * compressed one, with the chunk's filter mask. */
typedef struct {
    int64_t offset, length;
    uint32_t filter_mask;
} ckpt_extent;

typedef struct {
    char file[64];
    int file_index;               /* into ckpt_index.files */
    int pp, tp;
    int64_t shape[CKPT_MAX_DIMS];
    int64_t bytes;
    uint64_t checksum;
    uint64_t digest; /* the piece's part of the tensor's logical digest */
    int compressed;
    int64_t num_extents; /* 0: not recorded (format 1.0) */
    ckpt_extent *extents;
    /* Where the piece's block checksums lie in its shard file (format 1.2):
     * num_blocks little-endian uint64, contiguous; 0: not recorded (the
     * superblock is at 0, so no dataset is). With the extents, a reader
     * needs no HDF5 metadata to read and check the piece (remote stores). */
    int64_t checksums_at;
} ckpt_index_piece;

typedef struct {
    ckpt_tensor_copy tensor;
    int stage;
    int64_t block_rows;
    int64_t order;
    uint64_t digest; /* logical digest: the sum of the pieces' */
    int num_pieces;
    ckpt_index_piece *pieces;
} ckpt_index_tensor;

typedef struct {
    char name[64];
    int pp, tp;
    int dp; /* 0: the shard's file; D > 0: its data-parallel file D (format 1.6) */
    int64_t bytes;
    int has_meta_checksum; /* 0: not recorded (format 1.0) */
    uint64_t meta_checksum; /* XXH3 of the bytes outside the pieces' extents */
    /* Building an index (commit.c, and parts of one): the tensors with pieces
     * in this file's shard, as its writer declared them (the file's
     * attribute shard_tensors, format 1.6), when has_shard_tensors. */
    int has_shard_tensors;
    int64_t shard_tensors;
} ckpt_index_file;

typedef struct {
    int major, minor;
    ckpt_layout layout;
    ckpt_train_state state; /* JSON strings owned by the index */
    int num_files;
    ckpt_index_file *files;
    int num_tensors;
    ckpt_index_tensor *tensors;
} ckpt_index;

/* The name of file i of an index (ctx): a ckpt_name_map's key (namemap.h). */
const char *ckpt_index_file_name_of(const void *index, int64_t i);

/* Serializes the index; *out is malloc'ed, NUL-terminated. */
int ckpt_index_to_json(const ckpt_index *index, char **out);

/* Parses and validates index.json text; `where` names the file in errors. */
int ckpt_index_parse(const char *text, const char *where, ckpt_index *out);

/* A part of an index: what one process of a distributed commit knows (its
 * own shard files, ckpt_describe_shard), sent to the process that builds
 * the whole index. The index's form, with null for the files and pieces of
 * other parts, each tensor's "order" kept, and no seal (the text travels
 * over the communicator, never into a store). */
int ckpt_index_part_to_json(const ckpt_index *part, char **out);
int ckpt_index_part_parse(const char *text, const char *where, ckpt_index *out);

/* Owned copies of the train state's JSON texts (validated: objects/array). */
int ckpt_index_set_state(ckpt_index *index, const ckpt_train_state *state);

void ckpt_index_free(ckpt_index *index);

/* The metadata checksum of shard file f (shardmeta.c): XXH3 of its bytes
 * outside the extents the index records for its pieces, read through the
 * store; the file's size must be the index's. */
int ckpt_shard_meta_checksum(const store_ops *storage, const char *path, const ckpt_index *index,
                             int f, uint64_t *out);

#endif
