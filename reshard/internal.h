/* internal.h: the plan the reshard sources share. */
#ifndef TP_RESHARD_INTERNAL_H
#define TP_RESHARD_INTERNAL_H

#include "../kernels/kernels.h"
#include "reshard.h"

/* How a tensor's output slabs are cut. */
typedef enum {
    SLAB_WHOLE,      /* replicated: rows of the single piece */
    SLAB_ROWS,       /* split along axis 0: rows of one output piece */
    SLAB_ALL_PIECES, /* split along a later axis: the same rows of every output piece */
} slab_kind;

typedef struct {
    int source;              /* tensor index in the source reader */
    ckpt_tensor_copy out;    /* output description (dtype may differ from the source) */
    slab_kind kind;
    int stage;               /* output pipeline stage */
    int64_t block_rows;      /* output rows per checksum block */
    int64_t rows;            /* rows of each output piece */
    int64_t out_row;         /* elements per row of an output piece */
    int64_t src_row;         /* elements per row of a source piece */
    int64_t rows_per_slab;
} tensor_plan;

typedef struct {
    int tensor;      /* into plan->tensors */
    int piece;       /* output piece; -1 for SLAB_ALL_PIECES */
    int64_t row0, row1;
    int file;        /* output shard file */
    int64_t turn;    /* position among the slabs of its file */
} slab;

/* Source rows to read into the staging buffer (offsets in elements). */
typedef struct {
    int piece;
    int64_t row0, row1;
    int64_t staging;
} read_op;

/* What one slab does: reads into staging, then moves from staging to output.
 * direct: every move is an identity copy of what a read placed, so with equal
 * dtypes the reads can land in the output buffer itself. */
typedef struct {
    read_op *reads;
    int64_t num_reads, reads_capacity;
    strided_move *moves;
    int64_t num_moves, moves_capacity;
    int64_t staging_elements, output_elements;
    int direct;
} slab_ops;

struct reshard_plan {
    ckpt_reader *source;
    reshard_options options;
    ckpt_layout to;
    tensor_plan *tensors;
    int num_tensors;
    slab *slabs;
    int64_t num_slabs;
    int64_t max_staging_bytes, max_output_bytes; /* per thread */
    int64_t max_moves;
    int compress_level;
    int use_cuda;
    reshard_summary summary;
};

/* Bytes of the buffer reshard_verify's thread keeps to digest source tensor
 * `source` converted to dtype (a slab of its rows and the same converted);
 * 0 where the dtype is kept. */
int64_t reshard_converted_digest_bytes(const ckpt_tensor_desc *source, tp_dtype dtype);

/* Fills ops for one slab (reusing its arrays). */
int reshard_slab_ops(const reshard_plan *plan, const slab *s, slab_ops *ops);
void reshard_slab_ops_free(slab_ops *ops);

#endif
