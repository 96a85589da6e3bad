/* attrs.c: the per-dataset attributes that describe a stored piece, and
 * the layout a shard file records on its root (docs/FORMAT.md "Shard
 * files"). Written by the writer; read when the index is built and when a
 * reader cross-checks a dataset or a file against the index. */
#include <stdio.h>
#include <string.h>

#include "attrs.h"

static const char *anchor_name(ckpt_anchor anchor)
{
    return anchor == CKPT_ANCHOR_FIRST ? "first" : anchor == CKPT_ANCHOR_LAST ? "last" : "layer";
}

int ckpt_anchor_parse(const char *text, ckpt_anchor *out)
{
    if (strcmp(text, "layer") == 0) *out = CKPT_ANCHOR_LAYER;
    else if (strcmp(text, "first") == 0) *out = CKPT_ANCHOR_FIRST;
    else if (strcmp(text, "last") == 0) *out = CKPT_ANCHOR_LAST;
    else return tp_fail(TP_ERR_FORMAT, "unknown pipeline anchor '%s'", text);
    return TP_OK;
}

const char *ckpt_anchor_name(ckpt_anchor anchor)
{
    return anchor_name(anchor);
}

int ckpt_attrs_write(hid_t dset, const ckpt_piece_attrs *a)
{
    const ckpt_tensor_desc *t = &a->tensor.desc;
    int64_t padded[CKPT_MAX_DIMS];
    ckpt_padded_shape(t, a->tp, padded);
    int64_t piece = a->piece, layer = t->layer, tp = a->tp, order = a->order;
    int64_t block_rows = a->block_rows;
    int status = ckpt_h5_write_string(dset, "name", t->name);
    if (!status) status = ckpt_h5_write_string(dset, "role", t->role);
    if (!status) status = ckpt_h5_write_string(dset, "param", t->param);
    if (!status) status = ckpt_h5_write_string(dset, "dtype", tp_dtype_name(t->dtype));
    if (!status) status = ckpt_h5_write_i64s(dset, "logical_shape", t->shape, t->ndim);
    if (!status) status = ckpt_h5_write_i64s(dset, "padded_shape", padded, t->ndim);
    if (!status) status = ckpt_h5_write_string(dset, "anchor", anchor_name(t->anchor));
    if (!status) status = ckpt_h5_write_i64s(dset, "layer", &layer, 1);
    if (!status) status = ckpt_h5_write_i64s(dset, "piece", &piece, 1);
    if (!status) status = ckpt_h5_write_i64s(dset, "tp", &tp, 1);
    if (!status) status = ckpt_h5_write_i64s(dset, "order", &order, 1);
    if (!status) status = ckpt_h5_write_i64s(dset, "checksum_block_rows", &block_rows, 1);
    const ckpt_partition *p = &t->partition;
    if (!status)
        status = ckpt_h5_write_string(dset, "partition",
                                      p->kind == CKPT_SPLIT ? "split" : "replicated");
    if (p->kind == CKPT_SPLIT) {
        int64_t axis = p->axis;
        if (!status) status = ckpt_h5_write_i64s(dset, "split_axis", &axis, 1);
        if (!status) status = ckpt_h5_write_i64s(dset, "segments", p->segments, p->num_segments);
        if (!status) status = ckpt_h5_write_i64s(dset, "granule", &p->granule, 1);
        if (!status) status = ckpt_h5_write_i64s(dset, "pad_multiple", &p->pad_multiple, 1);
        int64_t replicate = p->replicate_small_segments;
        if (!status && replicate) status = ckpt_h5_write_i64s(dset, "replicate_small_segments", &replicate, 1);
    }
    return status ? tp_fail_context(status, "tensor %s", t->name) : TP_OK;
}

int ckpt_attrs_read(hid_t dset, ckpt_piece_attrs *a, int with_checksum)
{
    memset(a, 0, sizeof *a);
    char dtype[16], anchor[16], partition[16];
    int ndim = 0, ndim_padded = 0;
    int64_t padded[CKPT_MAX_DIMS], layer = -1, piece = 0, tp = 1, order = 0, block_rows = 0;
    ckpt_tensor_desc d;
    memset(&d, 0, sizeof d);
    ckpt_tensor_copy *c = &a->tensor;
    int status = ckpt_h5_read_string(dset, "name", c->name, sizeof c->name);
    if (!status) status = ckpt_h5_read_string(dset, "role", c->role, sizeof c->role);
    if (!status) status = ckpt_h5_read_string(dset, "param", c->param, sizeof c->param);
    if (!status) status = ckpt_h5_read_string(dset, "dtype", dtype, sizeof dtype);
    if (!status) status = ckpt_h5_read_i64s(dset, "logical_shape", d.shape, CKPT_MAX_DIMS, &ndim);
    if (!status) status = ckpt_h5_read_i64s(dset, "padded_shape", padded, CKPT_MAX_DIMS, &ndim_padded);
    if (!status) status = ckpt_h5_read_string(dset, "anchor", anchor, sizeof anchor);
    if (!status) status = ckpt_h5_read_i64s(dset, "layer", &layer, 1, NULL);
    if (!status) status = ckpt_h5_read_i64s(dset, "piece", &piece, 1, NULL);
    if (!status) status = ckpt_h5_read_i64s(dset, "tp", &tp, 1, NULL);
    if (!status) status = ckpt_h5_read_i64s(dset, "order", &order, 1, NULL);
    if (!status) status = ckpt_h5_read_i64s(dset, "checksum_block_rows", &block_rows, 1, NULL);
    if (!status) status = ckpt_h5_read_string(dset, "partition", partition, sizeof partition);
    if (!status && with_checksum) status = ckpt_h5_read_u64(dset, "checksum", &a->checksum);
    if (!status && with_checksum) status = ckpt_h5_read_u64(dset, "digest", &a->digest);
    if (!status) status = tp_dtype_parse(dtype, &d.dtype) ? TP_ERR_FORMAT : TP_OK;
    if (!status) status = ckpt_anchor_parse(anchor, &d.anchor);
    if (status) return status == TP_ERR_ARG ? TP_ERR_FORMAT : status;
    d.ndim = ndim;
    d.layer = layer;
    if (strcmp(partition, "split") == 0) {
        int64_t axis = 0;
        d.partition.kind = CKPT_SPLIT;
        status = ckpt_h5_read_i64s(dset, "split_axis", &axis, 1, NULL);
        if (!status)
            status = ckpt_h5_read_i64s(dset, "segments", d.partition.segments, CKPT_MAX_SEGMENTS,
                                       &d.partition.num_segments);
        if (!status) status = ckpt_h5_read_i64s(dset, "granule", &d.partition.granule, 1, NULL);
        if (!status)
            status = ckpt_h5_read_i64s(dset, "pad_multiple", &d.partition.pad_multiple, 1, NULL);
        /* Format 1.4, written only when set. */
        int64_t replicate = 0;
        if (!status) status = ckpt_h5_read_optional_i64(dset, "replicate_small_segments", &replicate, NULL);
        if (!status && replicate != 0 && replicate != 1)
            status = tp_fail(TP_ERR_FORMAT, "attribute replicate_small_segments is %lld, not 0 or 1", (long long)replicate);
        d.partition.replicate_small_segments = (int)replicate;
        if (status) return status;
        d.partition.axis = (int)axis;
    } else if (strcmp(partition, "replicated") != 0) {
        return tp_fail(TP_ERR_FORMAT, "unknown partition '%s'", partition);
    }
    char name[sizeof c->name], role[sizeof c->role], param[sizeof c->param];
    strcpy(name, c->name);
    strcpy(role, c->role);
    strcpy(param, c->param);
    d.name = name;
    d.role = role;
    d.param = param;
    status = ckpt_tensor_copy_init(c, &d);
    if (status) return TP_ERR_FORMAT;
    if (tp < 1 || tp > 4096 || piece < 0 || piece >= ckpt_piece_count(&c->desc, (int)tp))
        return tp_fail(TP_ERR_FORMAT, "piece %lld of tp=%lld is out of range", (long long)piece,
                         (long long)tp);
    status = ckpt_tensor_check(&c->desc, (int)tp);
    if (status) return TP_ERR_FORMAT;
    int64_t expect[CKPT_MAX_DIMS];
    ckpt_padded_shape(&c->desc, (int)tp, expect);
    if (ndim_padded != ndim || memcmp(expect, padded, sizeof(int64_t) * (size_t)ndim) != 0)
        return tp_fail(TP_ERR_FORMAT, "padded_shape does not follow from the partition");
    a->piece = (int)piece;
    a->tp = (int)tp;
    a->order = order;
    a->block_rows = block_rows;
    return TP_OK;
}

/* ------------------------------------------------------- a shard's layout */

void ckpt_layout_describe(const ckpt_layout *layout, char *out, size_t out_size)
{
    int chunks = ckpt_layout_chunks(layout);
    int n = snprintf(out, out_size, "tp=%d pp=%d layers=%lld", layout->tp, layout->pp, (long long)layout->num_layers);
    if (chunks > 1 && n >= 0 && (size_t)n < out_size) snprintf(out + n, out_size - (size_t)n, " virtual_stages=%d", chunks);
}

int ckpt_shard_layout_write(hid_t file, const ckpt_layout *layout)
{
    int64_t degrees[3] = {layout->tp, layout->pp, layout->dp}, chunks = ckpt_layout_chunks(layout);
    int status = ckpt_h5_write_i64s(file, "layout_tp_pp_dp", degrees, 3);
    if (!status) status = ckpt_h5_write_i64s(file, "num_layers", &layout->num_layers, 1);
    /* Format 1.5, written only with several chunks per stage. */
    if (!status && chunks > 1) status = ckpt_h5_write_i64s(file, "layout_virtual_stages", &chunks, 1);
    return status;
}

int ckpt_shard_layout_check(hid_t file, const ckpt_layout *layout, const char *path)
{
    int64_t degrees[3] = {0, 0, 0}, layers = -1, chunks = 1;
    int n = 0;
    int status = ckpt_h5_read_i64s(file, "layout_tp_pp_dp", degrees, 3, &n);
    if (!status && n != 3) status = tp_fail(TP_ERR_FORMAT, "attribute layout_tp_pp_dp: expected 3 integers");
    if (!status) status = ckpt_h5_read_i64s(file, "num_layers", &layers, 1, NULL);
    if (!status) status = ckpt_h5_read_optional_i64(file, "layout_virtual_stages", &chunks, NULL);
    if (status) return tp_fail_context(TP_ERR_FORMAT, "%s", path);
    if (degrees[0] == layout->tp && degrees[1] == layout->pp && layers == layout->num_layers &&
        chunks == ckpt_layout_chunks(layout))
        return TP_OK;
    char expected[128], chunk_text[48] = "";
    ckpt_layout_describe(layout, expected, sizeof expected);
    if (chunks != 1) snprintf(chunk_text, sizeof chunk_text, " virtual_stages=%lld", (long long)chunks);
    return tp_fail(TP_ERR_FORMAT, "%s: a shard of layout tp=%lld pp=%lld layers=%lld%s, the checkpoint's is %s", path,
                   (long long)degrees[0], (long long)degrees[1], (long long)layers, chunk_text, expected);
}
