/* dcp_internal.h (private to formats/): what the DCP reader and writer share. */
#ifndef TP_FORMATS_DCP_INTERNAL_H
#define TP_FORMATS_DCP_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#include "dcp.h"

/* The checkpoint's description, beside its data files. */
#define DCP_METADATA_NAME ".metadata"

typedef struct {
    char name[64]; /* relative to the directory */
    int64_t bytes;
} dcp_file_info;

/* Per data file, the version its first read saw (an object's ETag; ""
 * before it, and always on a local file system, where the shared lock
 * keeps a file as it is): every later read of the file, through any
 * handle, must match it, so that items and tensors read at different
 * times never mix two versions of a file replaced meanwhile. */
#define DCP_VERSION_MAX 128
typedef struct {
    pthread_mutex_t lock;
    char (*of)[DCP_VERSION_MAX];
} dcp_versions;

struct dcp_checkpoint {
    char path[CKPT_PATH_MAX];
    store_hold *hold; /* a shared lock on path while it is read */
    char metadata_path[CKPT_PATH_MAX + 16];
    int64_t metadata_bytes;
    pickle_doc *doc;    /* .metadata's tree: the keys point into it */
    dcp_torch_version torch_version; /* of its class paths */
    dcp_entry *entries;
    int num_entries;
    int *by_key;        /* entry indices sorted by key */
    char *names;        /* the tensor entries' plain names (dcp_entry.name), one after another */
    int *by_name;       /* the indices of the entries named, sorted by name */
    int num_named;
    dcp_chunk *chunks;  /* every entry's, in entry order */
    int64_t chunk_capacity;
    dcp_file_info *files;
    int num_files, files_capacity;
    dcp_versions *versions; /* num_files of them */
};

/* stat of a path of any store. */
int dcp_stat(const char *path, store_stat *st);
/* The path of data file `file`. */
void dcp_file_path(const dcp_checkpoint *dcp, int file, char *out, size_t size);
/* Opens the data file of a chunk's item, to read, pinned to the version
 * its first read saw; dcp_close_item_file records the version a first read
 * saw, and closes it. */
int dcp_open_item_file(const dcp_checkpoint *dcp, const dcp_chunk *c, const store_ops **store, store_file **file);
void dcp_close_item_file(const dcp_checkpoint *dcp, const dcp_chunk *c, const store_ops *store, store_file *file);
/* Reads a chunk's whole item (c->item_bytes) into buf. */
int dcp_read_item(const dcp_checkpoint *dcp, const dcp_chunk *c, void *buf);
/* Checks chunk c's item as verify does: a torch.save archive (an item that
 * does not start as a zip is not checked) whose entries match their
 * CRC-32s; damage is TP_ERR_CHECKSUM, naming the file and entry. */
int dcp_check_item(const dcp_checkpoint *dcp, const dcp_chunk *c);

/* Opens the items of chunks chunk[0..n) (indices into dcp->chunks, of the
 * entries chunk_entry[]) on threads threads, and gives where each one's
 * tensor data starts in its file: its item a torch.save archive of one
 * row-major tensor of the entry's dtype and the chunk's sizes; or, where
 * orders is not NULL, of one dense in any order of its dimensions (a
 * transposed or channels_last tensor, as torch.save writes it), whose
 * order (torch_tensor_dense_order) orders[k] receives. checks (may
 * be NULL; n of them): the zip entry holding each one's data and the CRC-32
 * its archive records for it (named by the entry's key), or bytes -1 where
 * none is recorded; dcp_compact_checks keeps those to check. */
int dcp_locate(const dcp_checkpoint *dcp, int64_t n, const int64_t *chunk, const int *chunk_entry, int threads,
               int64_t *data_offset, int (*orders)[TORCH_MAX_DIMS], ckpt_foreign_check *checks);
/* Whether a chunk of sizes (ndim), dense in order (dcp_locate's orders),
 * is row-major: its dimensions of more than one element in order. */
int dcp_order_is_row_major(const int *order, const int64_t *sizes, int ndim);
/* Moves the checks that record a CRC-32 to the front: how many. */
int dcp_compact_checks(ckpt_foreign_check *checks, int64_t n);

/* The data files as a foreign reader takes them (ckpt_foreign's files,
 * file_bytes and versions): each pinned to the version read first, and one
 * not read yet read now (a byte), so that the reader's later reads are of
 * the version the checkpoint was opened at. */
typedef struct {
    int count;
    const char **paths;
    int64_t *bytes;
    const char **versions;
    char *text; /* the paths' and versions' */
} dcp_file_list;
int dcp_file_list_make(const dcp_checkpoint *dcp, dcp_file_list *out);
void dcp_file_list_free(dcp_file_list *list);

/* The boxes (ckpt_foreign_box) of a box [offsets, offsets + sizes) of a
 * tensor described by t, stored row-major at data_offset of file, in the
 * coordinates of its one piece at tp 1: where t's segments are padded, a
 * box across segments is cut at their runs; at most CKPT_MAX_SEGMENTS.
 * where names it in messages. */
int dcp_box_boxes(const char *where, const ckpt_tensor_desc *t, int file, int64_t data_offset, const int64_t *offsets,
                  const int64_t *sizes, ckpt_foreign_box *boxes, int64_t *n);

/* ------------------------------------------------------------ writing */

/* What a format built on DCP (Megatron-Core's torch_dist,
 * megatron_dist_write.c) changes in how dcp_write_into lays a checkpoint
 * out (dcp_write_options.hooks; NULL: plain DCP). */
struct dcp_write_hooks {
    void *ctx;
    /* The entry source tensor `tensor` is written under: its key, and
     * where its box lies along a leading axis the entry stacks its tensors
     * on (*index of *stack; *stack 0: not stacked, the entry is the
     * tensor alone). *skip: not written. NULL: dcp_key_of, unstacked. */
    int (*key_of)(void *ctx, int tensor, char *key, size_t size, int64_t *index, int64_t *stack, int *skip);
    /* Tensors split on rows with vocabulary padding are written at their
     * padded shape, each piece one chunk with its padding rows, which
     * fill_padding (may be NULL: left as the source's read gives them)
     * fills in rows [row0, row0 + count) of piece at degree tp. */
    int padded;
    int (*fill_padding)(void *ctx, int tensor, int tp, int piece, int64_t row0, int64_t count, void *rows);
    /* Whether a tensor is read whole (as its one piece at tp 1) and given
     * to transform (scratch as large), which lays its rows out in the
     * output's order: a fused QKV regrouped into Megatron-Core's order,
     * whose rank r then holds rows [r rows/tp, (r + 1) rows/tp) of it. */
    int (*whole_piece)(void *ctx, int tensor);
    int (*transform)(void *ctx, int tensor, void *whole, void *scratch, int64_t bytes);
    int no_description;   /* leave out DCP_INDEX_KEY */
    /* Which other entries of options->others_from go along (NULL: all). */
    int (*carry)(void *ctx, const dcp_entry *entry);
    /* Bytes entries of the caller's, appended to rank 0's data file after
     * the carried ones: write_object writes item i (a torch.save of the
     * object) at the file's position. */
    int num_objects;
    const char *(*object_key)(void *ctx, int object);
    int (*write_object)(void *ctx, int object, FILE *file, const char *path);
};

/* Whether name is a data file as the writer names them: __<rank>_0.distcp. */
int dcp_is_data_file_name(const char *name);

/* dcp_write without staging: into dir, an empty directory the caller made
 * (and publishes). plan (may be NULL) receives what was done. */
int dcp_write_into(ckpt_reader *source, const dcp_write_options *options, const char *dir, dcp_write_plan *plan);

#endif
