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

int ckpt_anchor_parse(const char *text, ckpt_anchor *out);
const char *ckpt_anchor_name(ckpt_anchor anchor);

#endif
