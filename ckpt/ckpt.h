/* ckpt.h: sharded, self-describing HDF5 checkpoints (format: docs/FORMAT.md).
 *
 * A checkpoint is a directory holding one HDF5 file per shard (pipeline stage x
 * tensor-parallel rank) and index.json. Every tensor is stored under its global
 * name with a partition description that says how its global (logical) tensor
 * is cut into per-rank pieces, so any layout can be read back without model code.
 *
 * Conventions:
 *  - Every function that can fail returns a tp_status (TP_OK == 0). The
 *    message of the most recent failure in the calling thread is tp_errmsg();
 *    the library never prints.
 *  - Handles are opaque; each _create/_open has its _free/_close.
 *  - Data moves with positioned I/O between files and caller buffers; buffers
 *    aligned to 4096 bytes copy about twice as fast (common/memory.h). Every
 *    byte and name goes through a store (store/store.h), the local file system
 *    unless the options name another.
 *  - Reading functions may be called from several threads at once on one reader.
 *    Writer put functions may be called from several threads at once as long as
 *    they write disjoint rows.
 */
#ifndef TP_CKPT_H
#define TP_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "../common/dtype.h"
#include "../common/error.h"
#include "../common/path.h"
#include "../kernels/kernels.h"
#include "../store/staging.h"
#include "../store/store.h"

#define CKPT_FORMAT_MAJOR 1
#define CKPT_FORMAT_MINOR 7
#define CKPT_MAX_DIMS 8
#define CKPT_MAX_SEGMENTS 16
#define CKPT_NAME_MAX 255
#define CKPT_PATH_MAX TP_PATH_MAX /* bytes of a path, its NUL included */
#define CKPT_MAX_ELEMENTS ((int64_t)1 << 50) /* of a tensor, padding included: larger is refused as absurd */
#define CKPT_ZSTD_FILTER_ID 32015 /* the registered HDF5 filter id of Zstandard */

/* Memory the library keeps beside its callers' buffers, for tools that work
 * within a memory limit, beyond what the process holds when it plans (the
 * program, its libraries, the index read; measured then, apart): once
 * (HDF5's caches, the writer's tables, libcurl's connections) and per thread
 * that reads or writes (the reader's and writer's scratch, the thread's
 * stack and heap); more for a writer of zstd-compressed files (a compression
 * context and HDF5's filter buffers a thread). Measured on conversions of a
 * 384 MB checkpoint at 1 to 8 threads, local and from WebDAV (docs/
 * BENCHMARKS.md, "The memory planner's allowance"): at most 5.3 MiB once and
 * 1.9 MiB a thread beyond the buffers; writing zstd 13.5 MiB once and 13.7 a
 * thread. These are about 1.5 times that. (Until 2026-12-01 one allowance of
 * 32 MiB and 12 a thread served every run: sized for zstd, it refused
 * limits plain conversions fit in.) */
#define CKPT_FIXED_MEMORY ((int64_t)8 << 20)
#define CKPT_THREAD_MEMORY ((int64_t)4 << 20)
#define CKPT_ZSTD_FIXED_MEMORY ((int64_t)24 << 20)  /* in place of CKPT_FIXED_MEMORY */
#define CKPT_ZSTD_THREAD_MEMORY ((int64_t)16 << 20) /* in place of CKPT_THREAD_MEMORY */

/* ---------------------------------------------------------------- types */

/* A parallel layout. Layers are split evenly over pipeline stages: in
 * pp consecutive runs, or with virtual_stages V > 1 (the interleaved
 * schedule) in pp * V chunks of num_layers / (pp V) layers, chunk k on
 * stage k mod pp (stage s holds chunks s, s + pp, ..., s + (V-1) pp). */
typedef struct {
    int tp;             /* tensor-parallel degree */
    int pp;             /* pipeline-parallel degree */
    int dp;             /* data-parallel degree (recorded; shards do not depend on it) */
    int64_t num_layers; /* transformer layers in the whole model */
    int virtual_stages; /* chunks of layers per stage; 0 and 1 both mean one */
} ckpt_layout;

/* Chunks of layers per stage: layout->virtual_stages, or 1 when it is 0. */
int ckpt_layout_chunks(const ckpt_layout *layout);

/* Checks tp, pp, dp >= 1 and num_layers divisible by pp (by pp x
 * virtual_stages with several chunks per stage). */
int ckpt_layout_check(const ckpt_layout *layout);

typedef enum { CKPT_REPLICATED = 0, CKPT_SPLIT = 1 } ckpt_partition_kind;

/* How a global tensor is cut into tensor-parallel pieces.
 *
 * A split axis is a concatenation of segments (fused QKV: [q, k, v]; SwiGLU:
 * [gate, up]). Each segment is split evenly and independently over the tp
 * ranks, and rank r's piece is the concatenation, in segment order, of its
 * share of every segment. A share is a whole number of granules (head_dim for
 * attention heads, 1 otherwise). With pad_multiple d >= 1 each segment is
 * padded at its end with zero rows up to a multiple of tp * d * granule (a
 * vocabulary padded for tp); with d == 0 a segment that does not split evenly
 * is an error.
 *
 * With replicate_small_segments, a segment of n granules with n < tp and tp
 * divisible by n is replicated instead: rank r's share is its single granule
 * r / (tp / n), held alike by the tp / n consecutive ranks that share it
 * (grouped-query attention with fewer key/value heads than ranks, as
 * Megatron-LM places them). The first of those ranks holds the granule's
 * primary copy, which readers and digests take; the others hold replicas.
 * Not combined with padding. */
typedef struct {
    ckpt_partition_kind kind;
    int axis;                               /* split axis, 0 <= axis < ndim */
    int num_segments;                       /* 0 means one segment spanning the axis */
    int64_t segments[CKPT_MAX_SEGMENTS];    /* logical sizes; they sum to shape[axis] */
    int64_t granule;                        /* 0 is taken as 1 */
    int64_t pad_multiple;                   /* 0: no padding allowed */
    int replicate_small_segments;           /* segments of fewer granules than ranks are replicated */
} ckpt_partition;

/* Where a tensor lives in the pipeline: with a layer (stage = layer / (layers/pp);
 * with V chunks per stage, (layer / (layers/(pp V))) mod pp), or on the first or
 * last stage (embeddings, final norm). */
typedef enum { CKPT_ANCHOR_LAYER = 0, CKPT_ANCHOR_FIRST = 1, CKPT_ANCHOR_LAST = 2 } ckpt_anchor;

typedef struct {
    const char *name;   /* global name, e.g. "model/layers.3.attn.qkv.weight" */
    const char *role;   /* "param" (NULL means this), "exp_avg", "exp_avg_sq", "master", ... */
    const char *param;  /* name of the parameter this belongs to; NULL means name */
    tp_dtype dtype;
    int ndim;                      /* 1..CKPT_MAX_DIMS */
    int64_t shape[CKPT_MAX_DIMS];  /* logical global shape (no padding) */
    ckpt_partition partition;
    ckpt_anchor anchor;
    int64_t layer;                 /* global layer index when anchor == CKPT_ANCHOR_LAYER */
} ckpt_tensor_desc;

/* A tensor description that owns its strings, with the partition normalized
 * (an explicit segment list, granule >= 1). */
typedef struct {
    ckpt_tensor_desc desc;
    char name[CKPT_NAME_MAX + 1];
    char role[64];
    char param[CKPT_NAME_MAX + 1];
} ckpt_tensor_copy;

/* Whether name is a tensor name of this format (docs/FORMAT.md section 5):
 * 1..CKPT_NAME_MAX characters of [A-Za-z0-9._-] in '/'-separated
 * components, none empty, "." or "..". */
int ckpt_name_is_valid(const char *name);

/* Validates a description (names, shape, partition) and copies it. */
int ckpt_tensor_copy_init(ckpt_tensor_copy *out, const ckpt_tensor_desc *in);

/* Whether the tensor is a parameter (role "param" or none), not optimizer state. */
int ckpt_tensor_is_param(const ckpt_tensor_desc *t);

/* Points desc's strings at the copy's own arrays again: needed after the
 * struct was moved (realloc, qsort, assignment). */
void ckpt_tensor_copy_rebind(ckpt_tensor_copy *copy);

/* Training state recorded with a checkpoint (docs/FORMAT.md "train"). The JSON
 * texts are validated on write; NULL stands for an empty object/array. */
typedef struct {
    int64_t step;
    int64_t consumed_samples;
    const char *model_json;    /* object: model configuration */
    const char *schedule_json; /* object: learning-rate schedule state */
    const char *rng_json;      /* array: per-rank random-number state */
    const char *user_json;     /* object: free-form user metadata */
} ckpt_train_state;

/* ---------------------------------------------------- partition arithmetic */

/* Checks the description (names, shape, segments, granule) and that it can be
 * partitioned over tp ranks; the error names the tensor, segment and sizes. */
int ckpt_tensor_check(const ckpt_tensor_desc *tensor, int tp);

/* Whether two descriptions have the same logical shape, partition and
 * pipeline placement (names, roles and dtypes aside). */
int ckpt_tensor_equal_layout(const ckpt_tensor_desc *a, const ckpt_tensor_desc *b);

/* Number of pieces at degree tp: tp for split tensors, 1 for replicated ones. */
int ckpt_piece_count(const ckpt_tensor_desc *tensor, int tp);

/* Stored shape of every piece at degree tp (padding included). */
void ckpt_piece_shape(const ckpt_tensor_desc *tensor, int tp, int64_t shape_out[CKPT_MAX_DIMS]);

/* Global stored shape at degree tp: the logical shape with padding. */
void ckpt_padded_shape(const ckpt_tensor_desc *tensor, int tp, int64_t shape_out[CKPT_MAX_DIMS]);

/* Bytes of the tensor stored at degree tp, padding included: its pieces together. */
int64_t ckpt_padded_bytes(const ckpt_tensor_desc *tensor, int tp);

/* A shape as listings and messages write it, "[192, 64]" (cut to size). */
void ckpt_shape_text(const int64_t *shape, int ndim, char *out, size_t size);

/* NaN and infinite values found in the sources of a conversion into this
 * format (tp-ckpt import of a Hugging Face model or of a Megatron
 * checkpoint, tp-reshard of another tool's), which refuses them before the
 * commit unless told to carry them (--allow-nonfinite): the one sentence
 * that says what was found, built source tensor by source tensor. */
typedef struct {
    int tensors;         /* source tensors holding any; 0: none */
    int64_t values;      /* their NaNs and infinities together */
    size_t first_length; /* of summary's sentence about the first */
    char summary[1024];  /* the first of them: its file, name and shape, how many NaNs and infinities, the first's
                          * [row, col] (or index); then how many tensors in all */
} ckpt_nonfinite;

void ckpt_nonfinite_init(ckpt_nonfinite *found);
/* Notes what a source tensor holds (first: the flat row-major index in
 * shape); the first tensor noted that holds any is the one named, in file. */
void ckpt_nonfinite_note(ckpt_nonfinite *found, const char *file, const char *name, const int64_t *shape, int ndim,
                         convert_nonfinite counted);
/* TP_OK when nothing was found or allow; else TP_ERR_FORMAT: the summary,
 * "nothing DONE", and that --allow-nonfinite CARRIES them as they are. */
int ckpt_nonfinite_check(const ckpt_nonfinite *found, int allow, const char *done, const char *carries);

/* Rows per checksum block (and zstd chunk) in pieces a writer stores at
 * degree tp: about 1 MiB of data, at least one row. */
int64_t ckpt_piece_block_rows(const ckpt_tensor_desc *tensor, int tp);

/* Pipeline stage that holds the tensor in the given layout. */
int ckpt_tensor_stage(const ckpt_tensor_desc *tensor, const ckpt_layout *layout);

/* A run of consecutive logical indices along the split axis that lie
 * consecutively in one rank's piece. */
typedef struct {
    int rank;
    int64_t logical_start; /* along the split axis of the logical tensor */
    int64_t local_start;   /* along the split axis of the rank's piece */
    int64_t length;
    int replica;           /* 0: the primary copy; k > 0: the k-th replica of a replicated segment's granule */
} ckpt_run;

/* Cuts the logical range [start, start + count) of the split axis into runs, in
 * increasing logical order. At most num_segments * tp runs; returns how many
 * were written, or -1 when max_runs is too small or the range is out of bounds. */
int64_t ckpt_partition_runs(const ckpt_tensor_desc *tensor, int tp, int64_t start, int64_t count,
                            ckpt_run *runs, int64_t max_runs);

/* Runs of rank's piece in local order, covering its whole split axis: entries
 * with logical_start == -1 are padding; replicas of a replicated segment's
 * granule have their logical rows and replica > 0. At most 2 * num_segments runs; returns
 * how many were written, or -1 when max_runs is too small. */
int64_t ckpt_piece_runs(const ckpt_tensor_desc *tensor, int tp, int rank, ckpt_run *runs,
                        int64_t max_runs);

/* Visits the elements of rows [row0, row1) of a piece (indices along its
 * axis 0) in stored order, as runs contiguous both in the piece and in the
 * logical tensor: offset counts elements from the start of row row0;
 * logical_first is the flat row-major index of the run's first element in
 * the logical tensor, or -1 for padding. A nonzero return stops the walk and
 * is returned. */
typedef int (*ckpt_element_run_fn)(void *ctx, int64_t offset, int64_t logical_first, int64_t n);
int ckpt_piece_element_runs(const ckpt_tensor_desc *tensor, int tp, int piece, int64_t row0,
                            int64_t row1, ckpt_element_run_fn visit, void *ctx);

/* Logical digest (docs/FORMAT.md "Logical digests") of n elements stored
 * contiguously whose flat logical indices start at first. Digests of
 * disjoint parts of a tensor add up (mod 2^64) to the tensor's digest. */
uint64_t ckpt_digest_run(const void *data, size_t element_size, int64_t first, int64_t n);

/* ------------------------------------------------------------------ writer */

typedef struct ckpt_writer ckpt_writer;

typedef struct {
    int compress_level; /* 0: uncompressed (default); 1..22: zstd level */
    int overwrite;      /* 1: replace a checkpoint already at the path (default 0: refuse) */
    int update_latest;  /* 1: point <parent>/latest at this checkpoint on commit (default 0) */
    /* Distributed writing (one process per rank): when shard_pp >= 0 this writer
     * writes only shard (shard_pp, shard_tp) into the shared staging directory and
     * ckpt_writer_finish() ends it; one process then calls ckpt_commit_staged().
     * Default -1: this writer writes every shard and ckpt_writer_commit() ends it. */
    int shard_pp, shard_tp;
    /* Distributed writing with a sharded optimizer (format 1.6): 0 (default)
     * writes the shard's file; D in 1..dp-1 writes the shard's
     * data-parallel file D (shard_pp{P}_tp{T}_dp{D}.h5), which holds the
     * pieces that data-parallel rank D keeps: optimizer state, and (1.7,
     * ZeRO-3) parameters. */
    int shard_dp;
    const store_ops *storage; /* where the files go; NULL (default): the store of the path */
    /* Distributed writing: the owner part of the shared staging name
     * (store_staging_owner of the process that prepares and commits); NULL
     * (default): this process's own. */
    const char *staging_owner;
    /* With overwrite: seconds a commit waits for the readers of the
     * checkpoint it replaces to finish (0, the default: refused at once). */
    double wait_for_readers;
    /* 1: count the NaNs and infinities of every tensor's rows as they are
     * written, in the pass that computes their logical digest (replicas and
     * padding left out), for ckpt_writer_nonfinite before the commit: the
     * conversion of another tool's checkpoint refuses them (default 0). */
    int count_nonfinite;
} ckpt_write_options;

void ckpt_write_options_init(ckpt_write_options *options);

/* Starts a checkpoint at `path` (its parent must exist). Fails with
 * TP_ERR_EXISTS when path exists and options->overwrite is 0. Nothing is
 * visible at path until commit. */
int ckpt_writer_create(ckpt_writer **out, const char *path, const ckpt_layout *layout,
                       const ckpt_write_options *options);

/* Declares a tensor and allocates its pieces in their shard files. *id_out is
 * the handle for the put functions. Fails with TP_ERR_LAYOUT when the tensor
 * cannot be split at this layout. A tensor on a shard this writer does not
 * write is accepted and ignored. */
int ckpt_writer_add_tensor(ckpt_writer *writer, const ckpt_tensor_desc *tensor, int *id_out);

/* Declares a tensor whose pieces, in this writer's shard too, another
 * distributed writer writes (a data-parallel file's, or the shard file's,
 * format 1.6): it keeps its place in the checkpoint's order of tensors. */
int ckpt_writer_add_tensor_elsewhere(ckpt_writer *writer, const ckpt_tensor_desc *tensor, int *id_out);

/* Whether this writer writes the given piece (distributed writers own one shard). */
int ckpt_writer_owns_piece(const ckpt_writer *writer, int tensor_id, int piece);

/* Rows (indices along axis 0 of the stored piece) per checksum block. Slabs put
 * with ckpt_writer_put_rows must start on a block boundary and cover whole
 * blocks, except for the last block of the piece. */
int64_t ckpt_writer_block_rows(const ckpt_writer *writer, int tensor_id);

/* Writes a whole piece (stored shape, padding included, padding zero). */
int ckpt_writer_put_piece(ckpt_writer *writer, int tensor_id, int piece, const void *data);

/* Writes rows [row_start, row_start + row_count) of a piece. */
int ckpt_writer_put_rows(ckpt_writer *writer, int tensor_id, int piece, int64_t row_start,
                         int64_t row_count, const void *data);

/* With count_nonfinite: the NaNs and infinities of the rows of tensor
 * tensor_id written so far, first the flat row-major index of the earliest
 * in the logical tensor (-1: none). */
convert_nonfinite ckpt_writer_nonfinite(ckpt_writer *writer, int tensor_id);

/* Checks every piece is complete, syncs, writes index.json and atomically
 * renames the checkpoint into place (then updates `latest` if asked). Frees
 * the writer whatever the outcome; on failure nothing is visible at path. */
int ckpt_writer_commit(ckpt_writer *writer, const ckpt_train_state *state);

/* Distributed writing: completes and syncs this writer's shard without
 * committing. Frees the writer. */
int ckpt_writer_finish(ckpt_writer *writer);

/* Removes everything written so far. Frees the writer. */
void ckpt_writer_abort(ckpt_writer *writer);

/* Distributed writing, called by one process before any writer is created:
 * creates the shared staging directory (store_stage), held by this process
 * until ckpt_commit_staged or ckpt_stage_discard. */
int ckpt_stage_prepare(const char *path, const ckpt_write_options *options);

/* Distributed writing, by the process that prepared: removes the staging
 * directory after a failure (none prepared: nothing). The thread's error
 * message stays the caller's. */
void ckpt_stage_discard(const char *path, const ckpt_write_options *options);

/* Distributed writing, called by one process after every writer finished:
 * checks that all shards are complete and commits as ckpt_writer_commit. */
int ckpt_commit_staged(const char *path, const ckpt_layout *layout, const ckpt_train_state *state,
                       const ckpt_write_options *options);

/* ------------------------------------------------------------------ reader */

typedef struct ckpt_reader ckpt_reader;

typedef struct {
    int verify; /* 1 (default): check the checksum of every block read */
    /* 1: read a local checkpoint of format 1.3 or later as from an object
     * store, through the index alone: each shard file's size and metadata
     * checksum are checked at open with plain reads (the checksum ties
     * HDF5's metadata to the index byte for byte), the block checksums are
     * taken at checksums_at and the data at the extents, and HDF5 opens
     * nothing. 0 (default): also open each file and piece with HDF5 and
     * check them against the index (verify's full check). For tools that
     * read whole checkpoints once, whose outputs carry digests of their
     * own (tp-reshard): HDF5's metadata cost them a tenth of their time. */
    int through_index;
    const store_ops *storage; /* where the data is read from; NULL (default): the store of the path */
    int holder; /* the caller holds the path itself (its own staging entry, locked): no reader's lock is taken,
                   which would wait for the caller for ever */
    /* The checkpoint's index.json as another process read it
     * (ckpt_read_index_text), so that many readers of one checkpoint cost
     * its store one read of the index, not one each: the path is then taken
     * as the committed checkpoint itself (not resolved) and nothing of it is
     * read at open. Needed only during ckpt_reader_open. */
    const char *index_text;
    /* In an object store, each shard file's size is checked on the answers
     * to its reads (store_ops.expect_size) instead of by a request of its
     * own at open: for the many readers of one checkpoint at scale. A
     * damaged file then fails its pieces as they are read, not the open. */
    int sizes_on_read;
    /* 1: a shard file found missing or of another size than the index
     * records at open fails its own pieces as they are read (each with that
     * message), not the open: verify reports every damaged file, not only
     * the first. 0 (default): the open fails. */
    int damaged_files_fail_pieces;
    /* 1: in an object store too, each shard file's metadata checksum is
     * checked at open, as a local file's always is (a ranged read per gap
     * between the pieces' data): verify's. 0 (default): a store's reads take
     * everything from the index and never parse the metadata, so damage
     * there is found only where the file is read locally (after a copy). */
    int check_metadata;
} ckpt_read_options;

void ckpt_read_options_init(ckpt_read_options *options);

/* The text of the index.json of the committed checkpoint at path (a
 * directory or URL as ckpt_candidates gives it), malloc'ed, for
 * ckpt_read_options.index_text. */
int ckpt_read_index_text(const char *path, char **out);


/* Opens a checkpoint (a path as ckpt_resolve takes). Checks the index, the
 * format version and that every shard file is present with its recorded
 * size (see sizes_on_read). */
int ckpt_reader_open(ckpt_reader **out, const char *path, const ckpt_read_options *options);

/* A checkpoint of another tool (a Megatron-LM checkpoint: formats/
 * megatron.h) read through this reader, so that resharding, comparing,
 * exporting and verifying work on it unchanged: its tensors described as
 * this format describes them, each piece stored whole, uncompressed and
 * row-major at a byte range of one of its files. Such files carry no
 * checksums: reads are not verified, and each tensor's logical digest is
 * computed at open by reading the data once when compute_digests is set
 * (else ckpt_reader_digest is 0 and verify_piece checks only that the
 * piece reads). */
typedef struct {
    const char *path;                /* the checkpoint, for messages and ckpt_reader_path */
    ckpt_layout layout;
    /* The layout the checkpoint was saved at, where it is read at another
     * (as whole tensors, at tp 1 pp 1): for summaries. All 0: layout. */
    ckpt_layout saved;
    ckpt_train_state state;
    int num_tensors;
    const ckpt_tensor_desc *tensors;
    int num_files;
    const char *const *files;        /* paths or URLs, of one store */
    const int64_t *file_bytes;       /* their sizes, checked at open */
    /* Piece p of tensor i (ckpt_piece_count pieces each, tensors in order,
     * pieces in order, flattened): its file and byte offset. */
    const int *piece_file;
    const int64_t *piece_offset;
    /* Or, when boxes is not NULL (piece_file and piece_offset unused), piece
     * k of that flattened order is stored as boxes[box_first[k]] up to
     * boxes[box_first[k + 1]] (box_first has one entry more than there are
     * pieces): a checkpoint that cuts its tensors into boxes of its own. */
    const struct ckpt_foreign_box *boxes;
    const int64_t *box_first;
    /* Logical digests the checkpoint records for its tensors (one a
     * tensor; NULL: none), taken as the index's are, so that
     * ckpt_reader_verify_piece checks the data against them; only at tp 1,
     * where a tensor is its one piece. Ignored with compute_digests. */
    const uint64_t *digests;
    /* Byte ranges of the files whose CRC-32 the checkpoint records (a
     * torch.save archive's zip entries that hold tensors; NULL: none),
     * checked as they are read: a read that completes a range compares it,
     * and ckpt_reader_finish_checks reads to its end what was read in part. */
    const struct ckpt_foreign_check *checks;
    int num_checks;
    /* Per file (NULL, or "" for one: none), the version its reads must
     * match (store_file_version of the handle the source was opened
     * through: an object's ETag), so that the data read later is of the
     * version the source's description was read from. */
    const char *const *versions;
} ckpt_foreign;

typedef struct ckpt_foreign_check {
    int file;
    int64_t offset, bytes;
    uint32_t crc32;
    const char *name; /* for messages: the entry's */
} ckpt_foreign_check;

/* A box [start, start + count) of a foreign piece (in the coordinates of
 * its stored shape) stored whole and row-major at a byte offset of one of
 * the checkpoint's files: a PyTorch distributed checkpoint's chunk. The
 * boxes of a piece must not overlap, must lie inside it and must cover
 * every element of it that is not padding (checked at open); padding reads
 * as zeros. A box may be empty (a count of 0).
 * A box may instead be stored dense in another order of its dimensions
 * (permuted not 0): order[0] outermost in memory, order[ndim - 1]
 * innermost (a transposed [R, C] box, strides (1, R): order (1, 0); a
 * channels_last [N, C, H, W] one: (0, 2, 3, 1)); the reader reads its bytes
 * in slabs and permutes them into row-major in memory (read_boxes). */
typedef struct ckpt_foreign_box {
    int file;
    int64_t offset;
    int64_t start[CKPT_MAX_DIMS];
    int64_t count[CKPT_MAX_DIMS];
    int permuted;
    int order[CKPT_MAX_DIMS];
} ckpt_foreign_box;

int ckpt_reader_open_foreign(ckpt_reader **out, const ckpt_foreign *source, int compute_digests);
/* The path of the file that holds flat row-major element `element` of
 * tensor index's logical tensor (a foreign checkpoint's rank file or
 * chunk's data file; the shard file's name in this format), or, where no
 * one file can be said, the checkpoint's path: what a message names. */
const char *ckpt_reader_element_file(const ckpt_reader *reader, int index, int64_t element);
/* Whether the reader reads a foreign checkpoint (no checksums of its own). */
int ckpt_reader_is_foreign(const ckpt_reader *reader);
/* The checksums a foreign checkpoint records (ckpt_foreign.checks) of what
 * was read, whole: each range read in part is read to its end and
 * compared; and where it records logical digests (ckpt_foreign.digests),
 * each piece read is read again and its digest compared. A consumer calls
 * it before it publishes what it made of the data (TP_ERR_CHECKSUM naming
 * the file and entry, or the tensor); *checked (may be NULL): the ranges
 * and pieces found whole and matching. TP_OK for other readers. */
int ckpt_reader_finish_checks(ckpt_reader *reader, int *checked);
void ckpt_reader_close(ckpt_reader *reader);

const char *ckpt_reader_path(const ckpt_reader *reader); /* the resolved checkpoint directory */
/* Whether a checkpoint in an object store is no longer the one the reader
 * opened: its index.json removed, or other than what was read at open (a
 * --force upload removes the index first, replaces the shards, then puts
 * its own). Pieces that failed their checks were then read from another
 * checkpoint's files, which says nothing of damage. *changed is 0 for a
 * local checkpoint (a replacement waits for its readers) and for another
 * tool's. One read of the index. */
int ckpt_reader_changed(const ckpt_reader *reader, int *changed);
const ckpt_layout *ckpt_reader_layout(const ckpt_reader *reader);
/* The layout the checkpoint was saved at: another tool's read at another
 * layout (ckpt_foreign.saved), else ckpt_reader_layout's. */
const ckpt_layout *ckpt_reader_saved_layout(const ckpt_reader *reader);
const ckpt_train_state *ckpt_reader_state(const ckpt_reader *reader);
void ckpt_reader_version(const ckpt_reader *reader, int *major, int *minor);

int ckpt_reader_num_tensors(const ckpt_reader *reader);
const ckpt_tensor_desc *ckpt_reader_tensor(const ckpt_reader *reader, int index);
int ckpt_reader_find(const ckpt_reader *reader, const char *name); /* index, or -1 */

typedef struct {
    const char *file;               /* shard file name inside the checkpoint */
    int pp, tp;                     /* the shard */
    int64_t shape[CKPT_MAX_DIMS];   /* stored shape */
    int64_t bytes;                  /* stored bytes, uncompressed */
    uint64_t checksum;
    uint64_t digest;                /* the piece's part of the tensor's logical digest */
    int64_t block_rows;             /* rows per checksum block */
    int compressed;
} ckpt_piece_info;

int ckpt_reader_piece_info(const ckpt_reader *reader, int index, int piece, ckpt_piece_info *out);

/* The logical digest of a tensor as recorded in the index: equal for equal
 * logical tensors (same values, same dtype) whatever the layout. */
uint64_t ckpt_reader_digest(const ckpt_reader *reader, int index);

/* The index as JSON text (docs/FORMAT.md section 3); *out is malloc'ed. */
int ckpt_reader_index_json(const ckpt_reader *reader, char **out);

/* What an index.json text (ckpt_reader_index_json's) says of its checkpoint,
 * apart from where its bytes are: for a foreign checkpoint that carries the
 * index of the checkpoint it was made from (a PyTorch distributed checkpoint
 * this toolkit wrote), so that it reads back with the same descriptions,
 * training state and digests. The text is validated as index.json is. */
typedef struct ckpt_description ckpt_description;
int ckpt_description_parse(const char *text, const char *where, ckpt_description **out);
void ckpt_description_free(ckpt_description *description);
const ckpt_layout *ckpt_description_layout(const ckpt_description *description);
const ckpt_train_state *ckpt_description_state(const ckpt_description *description);
int ckpt_description_count(const ckpt_description *description);
const ckpt_tensor_desc *ckpt_description_tensor(const ckpt_description *description, int index);
/* The tensor's logical digest as recorded (ckpt_reader_digest's). */
uint64_t ckpt_description_digest(const ckpt_description *description, int index);
/* The text that ckpt_description_parse reads back: the tensors (their
 * logical digests, or 0 where digests is NULL), the number of layers of
 * layout and the training state, as the index of the same tensors at tp 1
 * pp 1 (*out malloc'ed). */
int ckpt_description_json(const ckpt_layout *layout, const ckpt_train_state *state, int count,
                          const ckpt_tensor_desc *tensors, const uint64_t *digests, char **out);

int ckpt_reader_num_files(const ckpt_reader *reader);
/* Name and size in bytes of shard file i. */
const char *ckpt_reader_file(const ckpt_reader *reader, int i, int64_t *bytes);

/* Reads a whole stored piece (padding included) into buf. */
int ckpt_reader_read_piece(ckpt_reader *reader, int index, int piece, void *buf, size_t buf_size);

/* Reads rows [row_start, row_start + row_count) of a stored piece (indices
 * along its axis 0), for streaming a piece through a small buffer. */
int ckpt_reader_read_rows(ckpt_reader *reader, int index, int piece, int64_t row_start,
                          int64_t row_count, void *buf, size_t buf_size);

/* Reads the region [start, start + count) of the logical global tensor, in the
 * stored dtype, into buf as a dense row-major array of shape count. Reads only
 * the pieces and rows the region needs (with verification on, whole checksum
 * blocks). */
int ckpt_reader_read_region(ckpt_reader *reader, int index, const int64_t *start,
                            const int64_t *count, void *buf, size_t buf_size);

/* Reads a piece and checks every block against its checksum, the block
 * checksums against the piece checksum in the file and in the index, and the
 * data against the piece's recorded part of the logical digest. */
int ckpt_reader_verify_piece(ckpt_reader *reader, int index, int piece);

/* Checks that every padding element of a piece is zero (this format's
 * rule; a foreign checkpoint's padding is not checked). */
int ckpt_reader_check_padding(ckpt_reader *reader, int index, int piece);

/* Compares, bit for bit, every replica a piece holds (format 1.4's
 * replicated segments: a granule of fewer key/value heads than ranks on
 * several ranks) with its primary copy, the one readers and digests take:
 * TP_ERR_FORMAT at the first that differs, naming the tensor, both ranks
 * and files, the element (logical coordinates) and both values. A piece
 * without replicas, and a foreign checkpoint's, is TP_OK unread. Digests
 * and block checksums cannot see such a difference: the writer checksums
 * what it writes, and a digest counts the primary copy alone. */
int ckpt_reader_check_replicas(ckpt_reader *reader, int index, int piece);

/* A damaged piece found by ckpt_verify. */
typedef struct {
    int tensor, piece;
    int status;          /* the error code: TP_ERR_CHECKSUM, TP_ERR_FORMAT, ... */
    char message[1024];  /* what is wrong, naming the file and the tensor */
} ckpt_damage;

typedef struct {
    int threads; /* 0: 1 */
    /* Called from the worker threads as pieces are done (may be NULL). */
    void (*progress)(void *ctx, int64_t bytes);
    void *progress_ctx;
} ckpt_verify_options;

typedef struct {
    int64_t pieces, bytes; /* checked */
    int damaged;           /* pieces damaged */
    ckpt_damage *damage;   /* those pieces, in file order (ckpt_verify_result_free) */
} ckpt_verify_result;

/* Verifies every piece of the checkpoint (ckpt_reader_verify_piece, then
 * ckpt_reader_check_padding, then ckpt_reader_check_replicas), threads
 * taking neighbouring pieces of one file. Once an object store failed a
 * request through every retry, the pieces left are not read (TP_ERR_IO,
 * "not read"). Returns TP_OK when it could check, whatever it found
 * (out->damaged); an error only when it could not (out of memory).
 * options may be NULL. */
int ckpt_verify(ckpt_reader *reader, const ckpt_verify_options *options, ckpt_verify_result *out);
/* Verifies a whole checkpoint on `threads` threads: TP_OK, or one error
 * naming it, how many pieces are damaged and the first one. */
int ckpt_verify_whole(ckpt_reader *reader, int threads);
/* ckpt_verify_whole of the checkpoint at path, opened with options. */
int ckpt_verify_checkpoint(const char *path, int threads, const ckpt_read_options *options);
void ckpt_verify_result_free(ckpt_verify_result *result);

/* Bytes of a verified read: a piece's digest is computed this many bytes
 * of whole checksum blocks at a time (one block where a block is larger). */
#define CKPT_VERIFY_READ_BYTES ((int64_t)16 << 20)

/* Bytes of buffers one thread of ckpt_verify holds at most for this
 * checkpoint, beside CKPT_THREAD_MEMORY: its largest piece's verified read
 * (whole blocks, up to CKPT_VERIFY_READ_BYTES), a compressed piece's chunk
 * and its compressed bound, and beside it the largest bounce buffer a
 * foreign piece's boxes take (rows of a box narrower than its piece, up to
 * 8 MiB; none for boxes of whole rows). A checkpoint whose pieces are small needs that much
 * alone: a memory limit is sized from it (reshard_threads_within), so that
 * a checkpoint of kilobytes is not given 16 MiB a thread it never reads. */
int64_t ckpt_reader_verify_thread_bytes(const ckpt_reader *reader);
/* The verified read of one piece of tensor at degree tp as this library
 * writes it (its checksum blocks as the writer cuts them; compressed: one
 * block and its chunk scratch; foreign: another tool's file read as such a
 * piece, through the bounce buffer of its boxes too): what
 * ckpt_reader_verify_thread_bytes counts for that piece once it is written,
 * so that an output not yet written is read back within a limit sized from
 * its own pieces. */
int64_t ckpt_tensor_verify_read_bytes(const ckpt_tensor_desc *tensor, int tp, int compressed, int foreign);
/* Bytes of buffers a thread reading this checkpoint (ckpt_reader_read_rows
 * and the other reads) keeps from call to call, beside CKPT_THREAD_MEMORY
 * and the caller's buffers; 0 for this library's own checkpoints. Another
 * tool's: the bounce buffer its boxes are read through where a region's
 * rows do not land whole (up to 8 MiB and its largest piece), and the rows
 * a thread keeps of a box stored in another order
 * (ckpt_foreign_box.permuted), up to 8 MiB more. */
int64_t ckpt_reader_read_thread_bytes(const ckpt_reader *reader);
/* The bounce buffer the verified read of a foreign piece of tensor at
 * degree tp takes for a box of count[] inside it (what
 * ckpt_reader_verify_thread_bytes counts for that box): 0 where the box
 * holds the piece's whole rows, so that a writer that knows its boxes (a
 * DCP chunk) sizes its output's read back by them, not by the bound that
 * ckpt_tensor_verify_read_bytes adds for a foreign piece. */
int64_t ckpt_tensor_box_bounce_bytes(const ckpt_tensor_desc *tensor, int tp, const int64_t *count);



/* Size limits of the small files the toolkit reads: far above what real
 * ones need (an index of 100,000 tensors is about 60 MB), far below what
 * would hurt. */
#define CKPT_INDEX_MAX_BYTES ((int64_t)256 << 20) /* index.json */
#define CKPT_CONFIG_MAX_BYTES ((int64_t)1 << 20)  /* config.json and other small JSON */

/* ------------------------------------------------------- run directories */

/* A run directory holds a run's checkpoints, step_<digits> (committed: with
 * index.json), and `latest`, naming the newest committed one (docs/FORMAT.md
 * "Run directories"). Every tool and the trainer follow these rules. */

/* The step of a checkpoint named step_<1 to 15 digits>, or -1. */
int64_t ckpt_step_of_name(const char *name);

/* run_dir/step_<step, 8 digits at least>; out_size at least CKPT_PATH_MAX. */
int ckpt_step_path(const char *run_dir, int64_t step, char *out, size_t out_size);

/* Whether dir is a committed checkpoint (its index.json is there): 1 only
 * when its store says so; a store that cannot be asked is 0 too, so this is
 * for a directory this process just wrote, or a check whose "no" is
 * harmless. What must tell "not there" from "could not ask" (which
 * checkpoints a run has) uses ckpt_candidates and ckpt_resolve, which
 * fail on the store's failure. */
int ckpt_is_committed(const char *dir);

/* Finds the checkpoint a path names: a checkpoint directory itself, or a run
 * directory, through its `latest` pointer or else its newest committed step_*
 * directory. Refuses a checkpoint still being written. A store that cannot
 * say whether an index is there fails, naming it (never read as "no
 * checkpoint there"). out_size at least CKPT_PATH_MAX. */
int ckpt_resolve(const char *path, char *out, size_t out_size);

typedef struct {
    char path[CKPT_PATH_MAX];
    int64_t step; /* from the name; -1 for a checkpoint not named step_* */
} ckpt_candidate;

/* The checkpoints a path offers, in the order to try them when resuming: a
 * checkpoint directory alone; in a run directory what `latest` names, then
 * every other committed step_* newest first. Fails with TP_ERR_NOT_FOUND when
 * there is none; with the store's failure, naming what it was asked, when
 * the store could not say whether a step is committed (a step left out
 * would make an older one the newest). *out is malloc'ed. */
int ckpt_candidates(const char *path, ckpt_candidate **out, int *count);

/* Whether a failure to read a checkpoint is its store's, saying nothing of
 * the checkpoint: the store did not answer, or answered an error (5xx,
 * access denied), a redirect or something that is no answer to what was
 * asked (an HTML page for a listing); a local disk's EIO or EACCES: all
 * TP_ERR_IO. Whoever tries a run's checkpoints in turn (a resume) stops at
 * such a failure, naming it, and goes on to an older checkpoint only past
 * damage: a bad checksum, a file missing or truncated as the store
 * reported, an index that does not parse (docs/FORMAT.md, "Finding a
 * checkpoint"). */
int ckpt_store_failure(int status);

/* What a directory (or URL) given to a trainer for its checkpoints holds
 * (rundir.c): CKPT_DIR_FREE, no committed checkpoint (it does not exist, is
 * empty, or holds only the leftovers of killed saves); CKPT_DIR_RUN, a run
 * directory with committed checkpoints, *newest the one a resume tries
 * first (`latest`, else the newest step_*); CKPT_DIR_CHECKPOINT, a committed
 * checkpoint itself, *newest that checkpoint with the step of its index.
 * A trainer writes into FREE, continues RUN only when asked to (its history
 * is never replaced by another run's), and never writes inside a checkpoint.
 * Fails when the directory cannot be listed. */
typedef enum { CKPT_DIR_FREE, CKPT_DIR_RUN, CKPT_DIR_CHECKPOINT } ckpt_dir_kind;
int ckpt_run_dir_kind(const char *path, ckpt_dir_kind *kind, ckpt_candidate *newest);

/* Whether a program may write a checkpoint recording `step` at out (local
 * or a URL), asked before anything is read or written (the rule of
 * tp-ckpt synth and import and tp-reshard, in one place): an output named
 * step_N is a checkpoint of a run directory, ordered there (and by
 * `latest`, and a resume) by N, so it must record step N (import wrote step
 * 0 as step_00000007); and with new_model (an import: weights that do not
 * continue the run's), the run directory holds no committed checkpoint but
 * out itself (one --force replaces): `latest` never moves backwards
 * (ckpt_latest_update), so it stayed on the other model's newest and
 * tp-train --resume continued that. Refused: *why says why and what to do
 * instead, else it is left empty. An output not named step_N is anyone's.
 * Fails when the run directory cannot be listed. */
int ckpt_run_output_refusal(const char *out, int64_t step, int new_model, char *why, size_t size);
/* Whether an output that is not one of this toolkit's checkpoints (what
 * names it: "an export", "a PyTorch distributed checkpoint") may be written
 * at out: one named step_N inside a run directory (one holding committed
 * checkpoints) sits among the run's checkpoints without being one, and
 * tp-train, reaching step N, stops there (it replaces only checkpoints).
 * Refused: *why says so, else it is left empty. Fails when the run
 * directory cannot be listed. */
int ckpt_foreign_output_refusal(const char *out, const char *what, char *why, size_t size);

/* One live run per run directory: a trainer claims its directory for its
 * whole life, and a second one is refused at start naming the first
 * ("tp-train (pid 41 on host n1, since ...)"). Local: an flock on
 * run_dir/.tp-run.lock, which the kernel frees when the holder dies (a
 * holder of this machine that is ending, killed and not yet done, is
 * waited for, up to 10 s: it holds the lock until its files close). An
 * object store: a lease object run_dir/.tp-run.lease, renewed by a thread
 * every TP_RUN_LEASE_SECONDS/4 (default 30 s); one found there is waited
 * for until it proves dead (its holder a gone process of this machine, or
 * no renewal for a period) or alive (refused). local_dir: a remote run's
 * local cache, locked too (NULL: run_dir). */
typedef struct ckpt_run_claim ckpt_run_claim;
int ckpt_run_claim_take(const char *run_dir, const char *local_dir, const char *program, ckpt_run_claim **out);
/* Whether a live run holds run_dir now, without claiming it: TP_OK when
 * none does, else TP_ERR_EXISTS naming the holder as ckpt_run_claim_take's
 * refusal does, for a caller that must not start what would be refused (or
 * count as its own what the holder writes there: tp-elastic before a
 * launch). Local directories only (the lock, tried shared for a moment: a
 * claimant starting at that moment is refused as beside any other); for an
 * object store TP_OK: a lease is live or dead only by waiting for it, which
 * ckpt_run_claim_take does. */
int ckpt_run_claim_free(const char *run_dir);
/* The claim of a program that writes a checkpoint into run_dir beside no
 * run of its own (tp-ckpt synth, import, copy, tp-reshard: an output named
 * step_N, which becomes the run's `latest`): shared with other such
 * writers, refused (naming the holder) while a run holds run_dir, and a run
 * is refused while it is held. In an object store (a lease is not shared):
 * a live run's lease refuses the writer all the same, after a wait of up to
 * a lease period (TP_RUN_LEASE_SECONDS) for one that is no longer renewed
 * to prove dead; the writer then holds a lease of its own
 * (run_dir/.tp-run.writers/OWNER), which refuses a trainer starting while
 * it writes. */
int ckpt_run_claim_share(const char *run_dir, const char *program, ckpt_run_claim **out);
/* TP_OK while the claim holds; an error naming the new holder once a lease
 * was taken over (this run's renewals held up for a period). */
int ckpt_run_claim_check(ckpt_run_claim *claim);
/* Frees the claim: the lock released, the lease removed. NULL is fine. */
void ckpt_run_claim_release(ckpt_run_claim *claim);

/* --------------------------------------------- what --force may replace */

/* The run-directory rules of replacing (rundir.c): --force never replaces
 * a run directory (it holds step_* checkpoints or `latest`: a run's
 * history); TP_OK, or TP_ERR_EXISTS naming why. Every store_replace_check
 * of the toolkit's outputs asks this first. */
int ckpt_refuse_run_directory(const store_ops *storage, const char *path);
/* The replace check of checkpoints: a directory holding only index.json and
 * shard files (or nothing). */
int ckpt_replaceable_checkpoint(const store_ops *storage, const char *path);
/* A store_replace_check (store/staging.h) for checkpoints: not a run
 * directory, and a checkpoint (ckpt_replaceable_checkpoint). The checkpoint
 * writers stage with it; ctx is unused. */
int ckpt_may_replace_checkpoint(const store_ops *storage, const char *path, void *ctx);

/* ---------------------------------------------------------- object stores */

/* Checkpoint locations may be http(s):// URLs of a WebDAV-style server or
 * s3://bucket/prefix (store/store.h, docs/STORES.md). Readers read them in
 * place; writers write locally and upload. */
int ckpt_is_remote(const char *path);

/* Files and parts an upload or download keeps in flight unless told. */
#define CKPT_TRANSFER_THREADS 8

typedef struct {
    int threads; /* files and parts in flight (0: CKPT_TRANSFER_THREADS) */
    int replace; /* a checkpoint already at the URL is replaced (it vanishes first) */
    void (*on_file)(void *ctx, int64_t bytes); /* a shard file arrived (any thread) */
    void *ctx;
    /* The run directory's `latest` is pointed at the output once it is up
     * (ckpt_upload_latest), as the upload's last step: when that fails, the
     * output is removed as for any failed upload. */
    int update_latest;
} ckpt_upload_options;
void ckpt_upload_options_init(ckpt_upload_options *options);

/* Uploads the committed local checkpoint local_dir to url: every shard file
 * in parallel, each checked for its size there, then index.json, so that
 * the remote checkpoint is visible only whole. Refuses a URL that holds a
 * checkpoint unless replace. An upload that fails, or is stopped by a
 * signal (store/staging.h store_upload_begin), removes what it sent, and
 * with replace what was there, before it returns: the URL then holds
 * nothing and a plain retry is accepted. */
int ckpt_upload(const char *local_dir, const char *url, const ckpt_upload_options *options);
/* Downloads the remote checkpoint at url (a run directory: its newest)
 * into local_dir, committed there as a local writer would (staged, every
 * file synced, index.json, then published); files in parallel ranged GETs
 * of 8 MiB. Refuses an existing local_dir unless replace. */
int ckpt_download(const char *url, const char *local_dir, const ckpt_upload_options *options);
/* Bytes of buffers one thread of ckpt_upload or ckpt_download of this
 * checkpoint holds at most: twice a download's part (8 MiB, or its largest
 * file where that is smaller: measured), or the verify of the copy before
 * it is published (ckpt_reader_verify_thread_bytes), the larger. */
int64_t ckpt_reader_transfer_thread_bytes(const ckpt_reader *reader);
/* Uploads a local file, or the files of a local directory tree (an
 * export, a Megatron-LM checkpoint) to url under their relative paths:
 * files in parallel, those that name the others last (names ending in
 * index.json, a latest_checkpointed_iteration.txt at the root). With
 * replace, what is at url is removed first. */
int ckpt_upload_files(const char *local, const char *url, const ckpt_upload_options *options);
/* Points the `latest` of the remote run directory that holds checkpoint_url
 * at it. */
int ckpt_upload_latest(const char *checkpoint_url);

/* Several processes writing one checkpoint to an object store, with no
 * file system shared between them (docs/STORES.md): each writing process
 * stages its own shard in a local directory of its own (ckpt_stage_prepare
 * with its own staging owner, a distributed ckpt_writer, ckpt_writer_finish)
 * and uploads it with ckpt_shard_upload, which hands back the shard's
 * description (sizes, offsets, checksums: its part of the index). One
 * process gathers the descriptions and calls ckpt_commit_uploaded, which
 * uploads index.json, then `latest`. Until then nothing is visible.
 *
 * First, by one process, before any shard goes up: a checkpoint already at
 * url is refused (TP_ERR_EXISTS) unless replace; replaced, its index is
 * removed first, so that no index ever names the new files. */
int ckpt_upload_begin(const char *url, int replace);
/* The finished shard file (options->shard_pp, shard_tp, shard_dp) staged for local_path
 * (options->staging_owner's staging directory, prepared by this process)
 * uploaded to url and checked there for its size; *description
 * (malloc'ed) for ckpt_commit_uploaded. The local staging directory is
 * removed whatever the outcome. */
int ckpt_shard_upload(const char *local_path, const ckpt_layout *layout, const ckpt_write_options *options,
                      const char *url, const ckpt_upload_options *upload, char **description);
/* The index built from every description (NULL entries: processes that
 * write no shard; every shard must be described once) uploaded to url,
 * then the run directory's `latest` pointed at it when update_latest;
 * claim (ckpt_run_claim_take's, may be NULL) checked before each, so that
 * nothing goes up beside a run that took the lease over. *bytes (may be
 * NULL): the checkpoint's bytes, its shard files'. */
int ckpt_commit_uploaded(const char *url, const ckpt_layout *layout, const ckpt_train_state *state,
                         const char *const *descriptions, int count, ckpt_run_claim *claim, int update_latest,
                         int64_t *bytes);

/* Whether a tool's output may be written at target, local or remote, as
 * its writing will decide: nothing there, or replace and may_replace (NULL
 * accepts nothing) accepting what is there. For a plan that writes
 * nothing (--dry-run), so that it fails as the real run would. */
int ckpt_output_check(const char *target, int replace, store_replace_check may_replace, void *ctx);

/* A tool's output at target: a local target is written where it is
 * (local = target; its writer stages it and asks its own replace check);
 * a remote one (refused at once when something is there and not replace,
 * or when may_replace, the check the writer asks of a local target, does
 * not accept what is there: NULL accepts nothing) is written into a
 * private local directory
 * under TMPDIR, then ckpt_output_finish uploads it (a checkpoint with
 * ckpt_upload, other outputs with ckpt_upload_files; and `latest` with
 * update_latest) and removes the local copy, or only removes it when the
 * writing failed (ok = 0). A failed upload keeps the local copy and says
 * where it is, unless a signal stopped it: a signal's clean-up removes the
 * local copy whenever it comes (store/staging.h store_scratch_make). */
int ckpt_output_begin(const char *target, int replace, store_replace_check may_replace, void *ctx, char *local,
                      size_t local_size);

/* A local directory named after a remote location, for a purpose
 * ("train-cache", "elastic"): $TMPDIR/tp-PURPOSE-HASH (HASH: XXH64 of the
 * URL), so that a program restarted on the same node finds it again. */
int ckpt_local_dir_for(const char *url, const char *purpose, char *out, size_t out_size);
int ckpt_output_finish(const char *target, const char *local, int ok, const ckpt_upload_options *options,
                       int update_latest);

/* ------------------------------------------------- merged HDF5 files */

/* A plain HDF5 file of whole (merged, unpadded) tensors for tools outside
 * this format (docs/FORMAT.md "Merged HDF5 files"): one contiguous dataset
 * per tensor at its name, string attributes on the root. The caller writes
 * each dataset's bytes at the file offset ckpt_flat_add reports. The file is
 * written under a temporary name beside path and renamed into place by
 * commit, so a failure leaves nothing at path. */
typedef struct ckpt_flat_file ckpt_flat_file;

/* Staged as options say (directory is ignored): fails with TP_ERR_EXISTS
 * when path exists and may not be replaced. */
int ckpt_flat_create(ckpt_flat_file **out, const char *path, const store_stage_options *options);
/* Adds dataset `name` ('/' makes groups) of the given dtype and shape. */
int ckpt_flat_add(ckpt_flat_file *file, const char *name, tp_dtype dtype, int ndim, const int64_t *shape,
                  int64_t *offset_out);
int ckpt_flat_attribute(ckpt_flat_file *file, const char *name, const char *value);
/* Positioned write of data bytes; any thread, after every dataset is added. */
int ckpt_flat_write(ckpt_flat_file *file, int64_t offset, const void *data, size_t bytes);
/* Closes, syncs and renames into place; frees the handle whatever the outcome. */
int ckpt_flat_commit(ckpt_flat_file *file);
/* Removes the temporary file; frees the handle. */
void ckpt_flat_abort(ckpt_flat_file *file);
/* The root string attribute `name` of the local HDF5 file at path, whoever
 * wrote it, into out (size bytes): what an export's replacement asks of
 * the file it would replace. TP_ERR_NOT_FOUND when the file has no such
 * attribute; TP_ERR_HDF5 when HDF5 cannot open it. */
int ckpt_flat_read_attribute(const char *path, const char *name, char *out, size_t size);

/* ------------------------------------------------------ logical comparison */

/* An element of dtype at `at` (little-endian, as stored) as a message says
 * it: its value and its bits, "5 (0x40a00000)", "nan (0x7e00)": two copies
 * that should be equal named apart even where their values print alike. */
void ckpt_element_text(const void *at, tp_dtype dtype, char *out, size_t size);
/* The coordinates of flat (row-major) element `element` of a block of
 * shape [ndim], each plus origin[d] (NULL: 0): "2, 1". */
void ckpt_element_place(const int64_t *shape, const int64_t *origin, int ndim, int64_t element, char *out, size_t size);

typedef struct {
    int64_t elements;        /* elements compared */
    int64_t mismatches;      /* elements outside tolerance */
    double max_abs_diff;
    double max_rel_diff;     /* |a-b| / max(|a|,|b|), over elements with a nonzero */
    int64_t worst_index;     /* flat logical index of the largest absolute difference, or -1 */
    unsigned char worst_a[4], worst_b[4]; /* its stored bytes, in each side's dtype (ckpt_element_text) */
} ckpt_compare_result;

/* Compares tensor a_index of a with tensor b_index of b logically (merged,
 * unpadded), whatever the layouts and stored dtypes. An element matches when
 * its values are bit-identical after conversion to fp32 (so that +0 and -0
 * differ, and NaNs of other bits) or, with a tolerance (rtol or atol not
 * 0), both are finite and |a-b| <= atol + rtol * max(|a|,|b|): an infinity
 * or a NaN matches only its own bits. Streams in slabs of at most
 * slab_bytes per side. Fails with TP_ERR_ARG when the logical shapes differ. */
int ckpt_compare_tensor(ckpt_reader *a, int a_index, ckpt_reader *b, int b_index, double rtol,
                        double atol, size_t slab_bytes, ckpt_compare_result *out);

#endif
