/* fuzz_partition.c: libFuzzer target for the partition arithmetic. The input
 * fills a tensor description as index.json could (any shape, segments,
 * granule, pad multiple, tp); ckpt_tensor_check must refuse it or accept
 * it, and for an accepted one every size and run computed from it must be
 * consistent, with no overflow or division by zero (UBSan traps on both).
 * `make fuzz` runs it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../ckpt/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    const uint8_t *data;
    size_t size, at;
} input;

static uint64_t take(input *in, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v = v << 8 | (in->at < in->size ? in->data[in->at++] : 0);
    return v;
}

/* Mostly small sizes, sometimes huge or hostile ones. */
static int64_t take_size(input *in)
{
    uint8_t kind = (uint8_t)take(in, 1);
    switch (kind % 8) {
    case 0: return (int64_t)take(in, 8);                 /* anything, negative included */
    case 1: return (int64_t)1 << (take(in, 1) % 63);     /* powers of two up to 2^62 */
    case 2: return ((int64_t)1 << (take(in, 1) % 63)) - 1;
    default: return (int64_t)(take(in, 2) % 64);         /* small */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, size, 0};
    ckpt_tensor_desc t;
    memset(&t, 0, sizeof t);
    t.name = "model/fuzz.weight";
    t.dtype = (tp_dtype)(take(&in, 1) % 3 == 0 ? TP_FP32 : take(&in, 1) % 2 ? TP_BF16 : TP_FP16);
    t.ndim = (int)(take(&in, 1) % (CKPT_MAX_DIMS + 2));
    for (int d = 0; d < CKPT_MAX_DIMS; d++) t.shape[d] = d < t.ndim ? take_size(&in) : 0;
    t.anchor = CKPT_ANCHOR_FIRST;
    int tp = (int)(take(&in, 2) % 5000) - 2;
    if (take(&in, 1) % 4 != 0) {
        ckpt_partition *p = &t.partition;
        p->kind = CKPT_SPLIT;
        p->axis = (int)(take(&in, 1) % (CKPT_MAX_DIMS + 1));
        p->num_segments = (int)(take(&in, 1) % (CKPT_MAX_SEGMENTS + 2));
        for (int s = 0; s < CKPT_MAX_SEGMENTS; s++) p->segments[s] = s < p->num_segments ? take_size(&in) : 0;
        p->granule = take_size(&in);
        p->pad_multiple = take_size(&in);
        p->replicate_small_segments = (int)(take(&in, 1) % 3); /* 2: refused */
    }
    if (ckpt_tensor_check(&t, tp) != TP_OK) return 0;
    ckpt_tensor_copy copy;
    if (ckpt_tensor_copy_init(&copy, &t) != TP_OK) abort(); /* check accepted it */
    const ckpt_tensor_desc *c = &copy.desc;
    int64_t piece[CKPT_MAX_DIMS], padded[CKPT_MAX_DIMS];
    ckpt_piece_shape(c, tp, piece);
    ckpt_padded_shape(c, tp, padded);
    int64_t bytes = ckpt_padded_bytes(c, tp);
    if (bytes <= 0 || bytes > CKPT_MAX_ELEMENTS * 4) abort();
    ckpt_piece_geometry g;
    ckpt_piece_geometry_init(&g, c, tp, 0);
    if (g.block_rows < 1 || g.num_blocks < 1 || g.bytes * (c->partition.kind == CKPT_SPLIT ? tp : 1) != bytes)
        abort();
    if (c->partition.kind != CKPT_SPLIT) return 0;
    /* Each rank's runs cover its piece's split axis exactly; the logical runs
     * of the whole axis cover it once. */
    ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
    int ranks = tp < 64 ? tp : 64;
    for (int r = 0; r < ranks; r++) {
        int64_t n = ckpt_piece_runs(c, tp, r, runs, 2 * CKPT_MAX_SEGMENTS), total = 0;
        if (n < 0) abort();
        for (int64_t k = 0; k < n; k++) {
            total += runs[k].length;
            /* A replica is a copy of logical rows, never padding. */
            if (runs[k].replica && (runs[k].logical_start < 0 || !c->partition.replicate_small_segments)) abort();
        }
        if (total != piece[c->partition.axis]) abort();
    }
    int64_t axis = c->shape[c->partition.axis], start = (int64_t)(take(&in, 8) % (uint64_t)axis);
    int64_t count = (int64_t)(take(&in, 8) % (uint64_t)(axis - start + 1));
    ckpt_run many[256];
    int64_t n = ckpt_partition_runs(c, tp, start, count, many, 256), total = 0;
    for (int64_t k = 0; k < n; k++) {
        total += many[k].length;
        if (many[k].replica != 0 || many[k].rank < 0 || many[k].rank >= tp) abort(); /* read from primary copies */
    }
    if (n >= 0 && total != count) abort();
    return 0;
}
