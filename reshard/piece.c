/* piece.c: one piece of a tensor, at any degree, from a checkpoint of any
 * layout: the plan of a single slab covering the piece, carried out on the
 * CPU. Trainers resuming at a new layout read their parameters this way,
 * each rank touching only the source regions its pieces need. */
#include <stdlib.h>
#include <string.h>

#include "../common/memory.h"
#include "internal.h"

/* Staging up to this size is the thread's scratch buffer: a piece streamed a
 * block of rows at a time comes here thousands of times. Larger staging (a
 * whole piece, read once, as a trainer resumes) is freed after. */
#define SCRATCH_STAGING_MAX ((size_t)8 << 20)

static void init_tensor_plan(tensor_plan *t, const ckpt_tensor_desc *src, int src_tp, int tp)
{
    const ckpt_tensor_desc *d = &t->out.desc;
    t->kind = d->partition.kind == CKPT_REPLICATED ? SLAB_WHOLE : d->partition.axis == 0 ? SLAB_ROWS : SLAB_ALL_PIECES;
    int64_t shape[CKPT_MAX_DIMS];
    ckpt_piece_shape(d, tp, shape);
    t->rows = shape[0];
    t->out_row = 1;
    for (int k = 1; k < d->ndim; k++) t->out_row *= shape[k];
    ckpt_piece_shape(src, src_tp, shape);
    t->src_row = 1;
    for (int k = 1; k < src->ndim; k++) t->src_row *= shape[k];
}

int reshard_read_piece_rows(ckpt_reader *source, int index, const ckpt_tensor_desc *target, int tp, int piece,
                            int64_t row0, int64_t row_count, void *out, size_t out_size)
{
    const ckpt_tensor_desc *src = ckpt_reader_tensor(source, index);
    if (!src) return tp_fail(TP_ERR_ARG, "tensor index %d out of range", index);
    reshard_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.source = source;
    plan.to = *ckpt_reader_layout(source);
    plan.to.tp = tp;
    tensor_plan t;
    memset(&t, 0, sizeof t);
    t.source = index;
    int status = ckpt_tensor_copy_init(&t.out, target);
    if (!status) status = ckpt_tensor_check(&t.out.desc, tp);
    if (status) return status;
    ckpt_tensor_desc same = t.out.desc;
    same.dtype = src->dtype;
    same.name = src->name;
    same.role = src->role;
    same.param = src->param;
    same.partition.pad_multiple = src->partition.pad_multiple; /* padding is recomputed for the target */
    if (!ckpt_tensor_equal_layout(src, &same))
        return tp_fail(TP_ERR_ARG, "tensor %s: the checkpoint describes it differently (shape or partition)",
                            src->name);
    if (piece < 0 || piece >= ckpt_piece_count(&t.out.desc, tp))
        return tp_fail(TP_ERR_ARG, "tensor %s: no piece %d at tp=%d", src->name, piece, tp);
    init_tensor_plan(&t, src, ckpt_reader_layout(source)->tp, tp);
    if (row_count < 0) row_count = t.rows - row0; /* to the piece's end */
    if (row0 < 0 || row_count < 1 || row0 + row_count > t.rows)
        return tp_fail(TP_ERR_ARG, "tensor %s piece %d: rows [%lld, %lld) outside 0..%lld", src->name, piece,
                       (long long)row0, (long long)(row0 + row_count), (long long)t.rows);
    plan.tensors = &t;
    plan.num_tensors = 1;
    slab s = {0, t.kind == SLAB_WHOLE ? 0 : piece, row0, row0 + row_count, 0, 0};
    slab_ops ops;
    memset(&ops, 0, sizeof ops);
    status = reshard_slab_ops(&plan, &s, &ops);
    size_t src_size = tp_dtype_size(src->dtype), out_elem = tp_dtype_size(t.out.desc.dtype);
    if (!status && out_size < (size_t)ops.output_elements * out_elem)
        status = tp_fail(TP_ERR_ARG, "tensor %s piece %d: buffer of %zu bytes, need %lld", src->name, piece,
                              out_size, (long long)(ops.output_elements * (int64_t)out_elem));
    int direct = ops.direct && src->dtype == t.out.desc.dtype;
    size_t staging_size = (size_t)ops.staging_elements * src_size;
    int scratch = staging_size <= SCRATCH_STAGING_MAX;
    char *staging = status || direct ? NULL : scratch ? scratch_buffer(SCRATCH_STAGING, staging_size) : alloc_pages(staging_size);
    if (!status && !direct && !staging) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    char *target_buffer = direct ? out : staging;
    size_t target_size = direct ? out_size : staging_size;
    for (int64_t r = 0; r < ops.num_reads && !status; r++) {
        const read_op *op = &ops.reads[r];
        size_t offset = (size_t)op->staging * src_size;
        status = ckpt_reader_read_rows(source, index, op->piece, op->row0, op->row1 - op->row0, target_buffer + offset,
                                       target_size - offset);
    }
    if (!status) {
        convert_overflow overflow = {0, 0.0f};
        for (int64_t k = 0; k < ops.num_moves; k++) {
            if (direct && ops.moves[k].src >= 0) continue; /* identities: already in place */
            convert_overflow_add(&overflow, moves_apply(staging, src->dtype, out, t.out.desc.dtype, &ops.moves[k], 1));
        }
        status = convert_overflow_check(overflow, t.out.desc.dtype, src->name, 0);
    }
    if (!scratch) free(staging);
    reshard_slab_ops_free(&ops);
    return status;
}

int reshard_read_piece(ckpt_reader *source, int index, const ckpt_tensor_desc *target, int tp, int piece,
                       void *out, size_t out_size)
{
    return reshard_read_piece_rows(source, index, target, tp, piece, 0, -1, out, out_size);
}
