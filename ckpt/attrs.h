/* attrs.h: reading and writing the attributes of one stored piece. */
#ifndef TP_CKPT_ATTRS_H
#define TP_CKPT_ATTRS_H

#include "internal.h"

typedef struct {
    ckpt_tensor_copy tensor;
    int piece;          /* tp rank for split tensors, 0 for replicated ones */
    int tp;             /* tensor-parallel degree of the checkpoint */
    int64_t order;      /* declaration order, for listing */
    int64_t block_rows; /* rows per checksum block */
    uint64_t checksum;  /* piece checksum (read only with with_checksum) */
    uint64_t digest;    /* the piece's part of the logical digest (likewise) */
} ckpt_piece_attrs;

int ckpt_attrs_write(hid_t dset, const ckpt_piece_attrs *attrs);
int ckpt_attrs_read(hid_t dset, ckpt_piece_attrs *attrs, int with_checksum);

/* A shard file's layout attributes on its root: layout_tp_pp_dp,
 * num_layers and, with several chunks per stage, layout_virtual_stages
 * (format 1.5; absent means one). The check refuses a shard whose tp, pp,
 * number of layers or chunks per stage differ from the layout's (dp is
 * recorded only), naming the file. */
int ckpt_shard_layout_write(hid_t file, const ckpt_layout *layout);
int ckpt_shard_layout_check(hid_t file, const ckpt_layout *layout, const char *path);

/* "tp=2 pp=2 layers=8", with " virtual_stages=2" when several: how
 * messages name a layout. */
void ckpt_layout_describe(const ckpt_layout *layout, char *out, size_t out_size);

int ckpt_anchor_parse(const char *text, ckpt_anchor *out);
const char *ckpt_anchor_name(ckpt_anchor anchor);

#endif
