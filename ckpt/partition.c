/* partition.c: how a global tensor is cut into tensor-parallel pieces.
 *
 * Split axis of logical size sum(S_s) over segments s, granule g, pad multiple
 * d, degree T (docs/FORMAT.md "Partition"):
 *   padded_s = d == 0 ? S_s : roundup(S_s, T * d * g)
 *   share_s  = padded_s / T                  rows of segment s on every rank
 *   piece of rank r = concat over s of padded segment s, [r*share_s, (r+1)*share_s)
 * Logical index k inside segment s goes to rank k / share_s at local index
 * (sum of earlier shares) + k % share_s; indices in [S_s, padded_s) are padding.
 * A replicated segment (replicate_small_segments, n = S_s / g granules,
 * n < T): share_s = g, rank r holds granule r / (T / n), and logical index k
 * has its primary copy on rank (k / g) * (T / n). */
#include <string.h>

#include "internal.h"

int ckpt_layout_check(const ckpt_layout *layout)
{
    if (layout->tp < 1 || layout->pp < 1 || layout->dp < 1)
        return tp_fail(TP_ERR_LAYOUT, "layout tp=%d pp=%d dp=%d: every degree must be >= 1",
                         layout->tp, layout->pp, layout->dp);
    if (layout->tp > 4096 || layout->pp > 4096)
        return tp_fail(TP_ERR_LAYOUT, "layout tp=%d pp=%d: degrees above 4096 are not supported",
                         layout->tp, layout->pp);
    if (layout->num_layers < 0)
        return tp_fail(TP_ERR_LAYOUT, "layout: negative layer count %lld",
                         (long long)layout->num_layers);
    if (layout->virtual_stages < 0 || layout->virtual_stages > 4096)
        return tp_fail(TP_ERR_LAYOUT, "layout: %d virtual stages (chunks of layers per stage): 1 to 4096 are supported",
                       layout->virtual_stages);
    if (layout->num_layers % layout->pp != 0)
        return tp_fail(TP_ERR_LAYOUT,
                         "%lld layers cannot be split evenly over pp=%d pipeline stages",
                         (long long)layout->num_layers, layout->pp);
    int chunks = ckpt_layout_chunks(layout);
    if (chunks > 1 && layout->num_layers % ((int64_t)layout->pp * chunks) != 0)
        return tp_fail(TP_ERR_LAYOUT,
                       "%lld layers cannot be split evenly into pp=%d x %d virtual stages = %lld chunks",
                       (long long)layout->num_layers, layout->pp, chunks, (long long)layout->pp * chunks);
    return TP_OK;
}

/* The partition with the defaults of ckpt.h filled in (one segment spanning the
 * axis, granule 1), so the public functions accept descriptions as written. */
static ckpt_partition normalized(const ckpt_tensor_desc *t)
{
    ckpt_partition p = t->partition;
    if (p.kind != CKPT_SPLIT) return p;
    if (p.num_segments == 0) {
        p.num_segments = 1;
        p.segments[0] = t->shape[p.axis];
    }
    if (p.granule == 0) p.granule = 1;
    return p;
}

int ckpt_name_is_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > CKPT_NAME_MAX || name[0] == '/' || name[n - 1] == '/') return 0;
    const char *component = name;
    for (size_t i = 0; i <= n; i++) {
        char c = name[i];
        if (c == '/' || c == '\0') {
            size_t len = (size_t)(name + i - component);
            if (len == 0) return 0;
            if ((len == 1 && component[0] == '.') ||
                (len == 2 && component[0] == '.' && component[1] == '.'))
                return 0;
            component = name + i + 1;
            continue;
        }
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}

void ckpt_tensor_copy_rebind(ckpt_tensor_copy *copy)
{
    copy->desc.name = copy->name;
    copy->desc.role = copy->role;
    copy->desc.param = copy->param;
}

int ckpt_tensor_is_param(const ckpt_tensor_desc *t)
{
    return !t->role || strcmp(t->role, "param") == 0;
}

int ckpt_tensor_copy_init(ckpt_tensor_copy *out, const ckpt_tensor_desc *in)
{
    memset(out, 0, sizeof *out);
    if (!in->name || !ckpt_name_is_valid(in->name))
        return tp_fail(TP_ERR_ARG,
                         "tensor name '%s' is not valid: use 1..%d characters of [A-Za-z0-9._-] "
                         "in '/'-separated components",
                         in->name ? in->name : "(null)", CKPT_NAME_MAX);
    const char *role = in->role ? in->role : "param";
    const char *param = in->param ? in->param : in->name;
    if (strlen(role) == 0 || strlen(role) >= sizeof out->role || strchr(role, '"'))
        return tp_fail(TP_ERR_ARG, "tensor %s: role '%s' is not valid", in->name, role);
    if (!ckpt_name_is_valid(param))
        return tp_fail(TP_ERR_ARG, "tensor %s: parameter name '%s' is not valid", in->name,
                         param);
    strcpy(out->name, in->name);
    strcpy(out->role, role);
    strcpy(out->param, param);
    out->desc = *in;
    ckpt_tensor_copy_rebind(out);

    ckpt_tensor_desc *t = &out->desc;
    if (t->dtype != TP_FP32 && t->dtype != TP_BF16 && t->dtype != TP_FP16)
        return tp_fail(TP_ERR_ARG, "tensor %s: unknown dtype %d", t->name, (int)t->dtype);
    if (t->ndim < 1 || t->ndim > CKPT_MAX_DIMS)
        return tp_fail(TP_ERR_ARG, "tensor %s: %d dimensions, expected 1..%d", t->name, t->ndim,
                         CKPT_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 1 || t->shape[d] > ((int64_t)1 << 40))
            return tp_fail(TP_ERR_ARG, "tensor %s: dimension %d has size %lld", t->name, d,
                             (long long)t->shape[d]);
    for (int d = t->ndim; d < CKPT_MAX_DIMS; d++) t->shape[d] = 1;
    /* Sizes come from files too: every product below is bounded here. */
    int64_t elements = 1;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(elements, t->shape[d], &elements) || elements > CKPT_MAX_ELEMENTS)
            return tp_fail(TP_ERR_ARG, "tensor %s: more than 2^50 elements (dimension %d of size %lld)", t->name, d,
                           (long long)t->shape[d]);
    if (t->anchor != CKPT_ANCHOR_LAYER && t->anchor != CKPT_ANCHOR_FIRST &&
        t->anchor != CKPT_ANCHOR_LAST)
        return tp_fail(TP_ERR_ARG, "tensor %s: unknown pipeline anchor %d", t->name,
                         (int)t->anchor);
    if (t->anchor == CKPT_ANCHOR_LAYER && t->layer < 0)
        return tp_fail(TP_ERR_ARG, "tensor %s: negative layer index %lld", t->name,
                         (long long)t->layer);
    if (t->anchor != CKPT_ANCHOR_LAYER) t->layer = -1;

    ckpt_partition *p = &t->partition;
    if (p->kind == CKPT_REPLICATED) {
        memset(p, 0, sizeof *p);
        return TP_OK;
    }
    if (p->kind != CKPT_SPLIT)
        return tp_fail(TP_ERR_ARG, "tensor %s: unknown partition kind %d", t->name,
                         (int)p->kind);
    if (p->axis < 0 || p->axis >= t->ndim)
        return tp_fail(TP_ERR_ARG, "tensor %s: split axis %d outside 0..%d", t->name, p->axis,
                         t->ndim - 1);
    if (p->num_segments < 0 || p->num_segments > CKPT_MAX_SEGMENTS)
        return tp_fail(TP_ERR_ARG, "tensor %s: %d segments, expected 1..%d", t->name,
                         p->num_segments, CKPT_MAX_SEGMENTS);
    *p = normalized(t);
    if (p->granule < 0 || p->pad_multiple < 0 || p->pad_multiple > (1 << 20))
        return tp_fail(TP_ERR_ARG, "tensor %s: granule %lld or pad multiple %lld out of range",
                         t->name, (long long)p->granule, (long long)p->pad_multiple);
    if (p->replicate_small_segments != 0 && p->replicate_small_segments != 1)
        return tp_fail(TP_ERR_ARG, "tensor %s: replicate_small_segments %d is not a boolean", t->name,
                       p->replicate_small_segments);
    if (p->replicate_small_segments && p->pad_multiple)
        return tp_fail(TP_ERR_ARG, "tensor %s: replicated segments cannot be padded (pad multiple %lld)", t->name,
                       (long long)p->pad_multiple);
    int64_t total = 0;
    for (int s = 0; s < p->num_segments; s++) {
        if (p->segments[s] < 1)
            return tp_fail(TP_ERR_ARG, "tensor %s: segment %d has size %lld", t->name, s,
                             (long long)p->segments[s]);
        if (p->segments[s] % p->granule != 0)
            return tp_fail(TP_ERR_ARG,
                             "tensor %s: segment %d (size %lld) is not a multiple of the "
                             "granule %lld",
                             t->name, s, (long long)p->segments[s], (long long)p->granule);
        if (__builtin_add_overflow(total, p->segments[s], &total) || total > CKPT_MAX_ELEMENTS)
            return tp_fail(TP_ERR_ARG, "tensor %s: segments sum to more than 2^50 (segment %d of size %lld)", t->name,
                           s, (long long)p->segments[s]);
    }
    for (int s = p->num_segments; s < CKPT_MAX_SEGMENTS; s++) p->segments[s] = 0;
    if (total != t->shape[p->axis])
        return tp_fail(TP_ERR_ARG,
                         "tensor %s: segments sum to %lld but axis %d has size %lld", t->name,
                         (long long)total, p->axis, (long long)t->shape[p->axis]);
    return TP_OK;
}

int64_t ckpt_segment_padded(const ckpt_partition *p, int s, int tp)
{
    if (p->pad_multiple == 0) return p->segments[s];
    int64_t unit = (int64_t)tp * p->pad_multiple * p->granule;
    return (p->segments[s] + unit - 1) / unit * unit;
}

/* Ranks holding each granule of segment s: tp / granules when the segment
 * is replicated, else 1. */
static int64_t segment_holders(const ckpt_partition *p, int s, int tp)
{
    int64_t granules = p->segments[s] / p->granule;
    return p->replicate_small_segments && granules < tp ? tp / granules : 1;
}

/* Rows of segment s on every rank. */
static int64_t segment_share(const ckpt_partition *p, int s, int tp)
{
    return segment_holders(p, s, tp) > 1 ? p->granule : ckpt_segment_padded(p, s, tp) / tp;
}

int64_t ckpt_piece_axis_size(const ckpt_partition *p, int tp)
{
    int64_t size = 0;
    for (int s = 0; s < p->num_segments; s++) size += segment_share(p, s, tp);
    return size;
}

int ckpt_tensor_check(const ckpt_tensor_desc *tensor, int tp)
{
    ckpt_tensor_copy copy;
    int status = ckpt_tensor_copy_init(&copy, tensor);
    if (status) return status;
    if (tp < 1) return tp_fail(TP_ERR_LAYOUT, "tensor %s: tp=%d must be >= 1", tensor->name, tp);
    const ckpt_tensor_desc *t = &copy.desc;
    const ckpt_partition *p = &t->partition;
    if (p->kind == CKPT_REPLICATED) return TP_OK;
    /* The padding unit and the padded sizes stay far from int64's range
     * (checked before ckpt_segment_padded computes them). */
    int64_t unit = 1, padded_total = 0;
    if (p->pad_multiple > 0 &&
        (__builtin_mul_overflow((int64_t)tp, p->pad_multiple, &unit) ||
         __builtin_mul_overflow(unit, p->granule, &unit) || unit > CKPT_MAX_ELEMENTS))
        return tp_fail(TP_ERR_LAYOUT, "tensor %s: padding unit tp %d x pad multiple %lld x granule %lld is absurd",
                       t->name, tp, (long long)p->pad_multiple, (long long)p->granule);
    for (int s = 0; s < p->num_segments; s++) {
        if (p->segments[s] > CKPT_MAX_ELEMENTS - unit)
            return tp_fail(TP_ERR_LAYOUT, "tensor %s: segment %d of size %lld is absurd", t->name, s,
                           (long long)p->segments[s]);
        /* A replicated segment stores one granule on every rank. */
        padded_total += segment_holders(p, s, tp) > 1 ? p->granule * tp : ckpt_segment_padded(p, s, tp);
    }
    int64_t elements = padded_total;
    if (elements > CKPT_MAX_ELEMENTS)
        return tp_fail(TP_ERR_LAYOUT, "tensor %s: more than 2^50 elements stored at tp=%d (padding and replicas)",
                       t->name, tp);
    for (int d = 0; d < t->ndim; d++)
        if (d != p->axis && (__builtin_mul_overflow(elements, t->shape[d], &elements) || elements > CKPT_MAX_ELEMENTS))
            return tp_fail(TP_ERR_LAYOUT, "tensor %s: more than 2^50 elements once padded", t->name);
    for (int s = 0; s < p->num_segments; s++) {
        int64_t granules = ckpt_segment_padded(p, s, tp) / p->granule;
        if (p->replicate_small_segments && granules < tp) {
            if (tp % granules != 0)
                return tp_fail(TP_ERR_LAYOUT,
                               "tensor %s: segment %d of split axis %d has %lld granules of %lld, fewer than "
                               "tp=%d and not dividing it: they cannot be replicated evenly",
                               t->name, s, p->axis, (long long)granules, (long long)p->granule, tp);
            continue;
        }
        if (granules % tp != 0)
            return tp_fail(TP_ERR_LAYOUT,
                             "tensor %s: segment %d of split axis %d has %lld granules of %lld "
                             "(size %lld), not divisible by tp=%d",
                             t->name, s, p->axis, (long long)(p->segments[s] / p->granule),
                             (long long)p->granule, (long long)p->segments[s], tp);
    }
    return TP_OK;
}

int ckpt_piece_count(const ckpt_tensor_desc *tensor, int tp)
{
    return tensor->partition.kind == CKPT_SPLIT ? tp : 1;
}

void ckpt_piece_shape(const ckpt_tensor_desc *tensor, int tp, int64_t shape_out[CKPT_MAX_DIMS])
{
    for (int d = 0; d < CKPT_MAX_DIMS; d++) shape_out[d] = d < tensor->ndim ? tensor->shape[d] : 1;
    if (tensor->partition.kind == CKPT_SPLIT) {
        ckpt_partition p = normalized(tensor);
        shape_out[p.axis] = ckpt_piece_axis_size(&p, tp);
    }
}

void ckpt_padded_shape(const ckpt_tensor_desc *tensor, int tp, int64_t shape_out[CKPT_MAX_DIMS])
{
    ckpt_piece_shape(tensor, tp, shape_out);
    if (tensor->partition.kind == CKPT_SPLIT) shape_out[tensor->partition.axis] *= tp;
}

int64_t ckpt_padded_bytes(const ckpt_tensor_desc *tensor, int tp)
{
    int64_t shape[CKPT_MAX_DIMS], bytes = (int64_t)tp_dtype_size(tensor->dtype);
    ckpt_padded_shape(tensor, tp, shape);
    for (int d = 0; d < tensor->ndim; d++) bytes *= shape[d];
    return bytes;
}

void ckpt_shape_text(const int64_t *shape, int ndim, char *out, size_t size)
{
    int n = snprintf(out, size, "[");
    for (int d = 0; d < ndim && n < (int)size; d++)
        n += snprintf(out + n, size - (size_t)n, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (n < (int)size) snprintf(out + n, size - (size_t)n, "]");
}

int ckpt_tensor_stage(const ckpt_tensor_desc *tensor, const ckpt_layout *layout)
{
    switch (tensor->anchor) {
    case CKPT_ANCHOR_FIRST: return 0;
    case CKPT_ANCHOR_LAST: return layout->pp - 1;
    case CKPT_ANCHOR_LAYER: break;
    }
    int chunks = ckpt_layout_chunks(layout);
    int64_t per_chunk = layout->num_layers / ((int64_t)layout->pp * chunks);
    if (per_chunk < 1) return 0;
    int64_t chunk = tensor->layer / per_chunk;
    if (chunks > 1) return (int)(chunk % layout->pp);
    return chunk >= layout->pp ? layout->pp - 1 : (int)chunk;
}

int ckpt_layout_chunks(const ckpt_layout *layout)
{
    return layout->virtual_stages > 1 ? layout->virtual_stages : 1;
}

int64_t ckpt_partition_runs(const ckpt_tensor_desc *tensor, int tp, int64_t start, int64_t count,
                            ckpt_run *runs, int64_t max_runs)
{
    const ckpt_partition norm = normalized(tensor), *p = &norm;
    if (p->kind != CKPT_SPLIT || start < 0 || count < 0 ||
        start + count > tensor->shape[p->axis])
        return -1;
    int64_t n = 0, end = start + count;
    int64_t seg_logical = 0, seg_local = 0;
    for (int s = 0; s < p->num_segments; s++) {
        int64_t size = p->segments[s];
        int64_t share = segment_share(p, s, tp), holders = segment_holders(p, s, tp);
        int64_t lo = start > seg_logical ? start - seg_logical : 0;
        int64_t hi = end < seg_logical + size ? end - seg_logical : size;
        /* [lo, hi) is the requested part of this segment, in segment coordinates;
         * share `share` of it is on rank (its index) x holders, the primary copy */
        while (lo < hi) {
            int64_t block = lo / share;
            int64_t block_end = (block + 1) * share;
            int64_t stop = hi < block_end ? hi : block_end;
            if (n == max_runs) return -1;
            runs[n].rank = (int)(block * holders);
            runs[n].logical_start = seg_logical + lo;
            runs[n].local_start = seg_local + lo - block * share;
            runs[n].length = stop - lo;
            runs[n].replica = 0;
            n++;
            lo = stop;
        }
        seg_logical += size;
        seg_local += share;
    }
    return n;
}

int64_t ckpt_piece_runs(const ckpt_tensor_desc *tensor, int tp, int rank, ckpt_run *runs,
                        int64_t max_runs)
{
    const ckpt_partition norm = normalized(tensor), *p = &norm;
    if (p->kind != CKPT_SPLIT || rank < 0 || rank >= tp) return -1;
    int64_t n = 0, seg_logical = 0, seg_local = 0;
    for (int s = 0; s < p->num_segments; s++) {
        int64_t size = p->segments[s];
        int64_t share = segment_share(p, s, tp), holders = segment_holders(p, s, tp);
        if (holders > 1) { /* the granule rank / holders, a replica unless rank is its first holder */
            if (n == max_runs) return -1;
            runs[n++] = (ckpt_run){rank, seg_logical + rank / holders * share, seg_local, share, (int)(rank % holders)};
            seg_logical += size;
            seg_local += share;
            continue;
        }
        int64_t first = (int64_t)rank * share; /* segment coordinate of the share's start */
        int64_t data = size - first;           /* logical rows that fall in this share */
        if (data > share) data = share;
        if (data < 0) data = 0;
        if (data > 0) {
            if (n == max_runs) return -1;
            runs[n++] = (ckpt_run){rank, seg_logical + first, seg_local, data, 0};
        }
        if (share - data > 0) {
            if (n == max_runs) return -1;
            runs[n++] = (ckpt_run){rank, -1, seg_local + data, share - data, 0};
        }
        seg_logical += size;
        seg_local += share;
    }
    return n;
}

void ckpt_piece_geometry_init(ckpt_piece_geometry *g, const ckpt_tensor_desc *t, int tp,
                              int64_t block_rows)
{
    g->ndim = t->ndim;
    ckpt_piece_shape(t, tp, g->shape);
    int64_t row_elements = 1;
    for (int d = 1; d < t->ndim; d++) row_elements *= g->shape[d];
    g->rows = g->shape[0];
    g->row_bytes = row_elements * (int64_t)tp_dtype_size(t->dtype);
    g->bytes = g->rows * g->row_bytes;
    g->block_rows = block_rows > 0 ? block_rows : ckpt_block_rows_for(g->rows, g->row_bytes);
    g->num_blocks = (g->rows + g->block_rows - 1) / g->block_rows;
}

int ckpt_tensor_equal_layout(const ckpt_tensor_desc *a, const ckpt_tensor_desc *b)
{
    ckpt_partition p = normalized(a), q = normalized(b);
    int same_partition = p.kind == q.kind;
    if (same_partition && p.kind == CKPT_SPLIT)
        same_partition = p.axis == q.axis && p.num_segments == q.num_segments && p.granule == q.granule &&
                         p.pad_multiple == q.pad_multiple &&
                         p.replicate_small_segments == q.replicate_small_segments &&
                         memcmp(p.segments, q.segments, sizeof(int64_t) * (size_t)p.num_segments) == 0;
    return same_partition && a->ndim == b->ndim &&
           memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0 && a->anchor == b->anchor &&
           (a->anchor != CKPT_ANCHOR_LAYER || a->layer == b->layer);
}

int ckpt_tensor_equal(const ckpt_tensor_desc *a, const ckpt_tensor_desc *b)
{
    return ckpt_tensor_equal_layout(a, b) && strcmp(a->name, b->name) == 0 && strcmp(a->role, b->role) == 0 &&
           strcmp(a->param, b->param) == 0 && a->dtype == b->dtype && a->layer == b->layer;
}

/* ckpt_piece_element_runs; with primary_only, a replica's runs are left out
 * (not visited): each logical element is then visited once over all pieces. */
int ckpt_piece_element_runs_of(const ckpt_tensor_desc *t, int tp, int piece, int64_t row0, int64_t row1,
                               int primary_only, ckpt_element_run_fn visit, void *ctx)
{
    int64_t shape[CKPT_MAX_DIMS], row_elements = 1;
    ckpt_piece_shape(t, tp, shape);
    for (int d = 1; d < t->ndim; d++) row_elements *= shape[d];
    if (t->partition.kind == CKPT_REPLICATED)
        return visit(ctx, 0, row0 * row_elements, (row1 - row0) * row_elements);
    ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
    int64_t n = ckpt_piece_runs(t, tp, piece, runs, 2 * CKPT_MAX_SEGMENTS);
    int axis = t->partition.axis, status = 0;
    if (axis == 0) { /* runs are row ranges */
        for (int64_t k = 0; k < n && !status; k++) {
            int64_t a = runs[k].local_start > row0 ? runs[k].local_start : row0;
            int64_t end = runs[k].local_start + runs[k].length;
            int64_t b = end < row1 ? end : row1;
            if (a >= b || (primary_only && runs[k].replica)) continue;
            int64_t logical = runs[k].logical_start < 0
                                  ? -1
                                  : (runs[k].logical_start + a - runs[k].local_start) * row_elements;
            status = visit(ctx, (a - row0) * row_elements, logical, (b - a) * row_elements);
        }
        return status;
    }
    /* Split axis > 0: the piece is [outer, P_axis, inner] against the logical
     * [outer, L_axis, inner]; each outer index repeats the runs. */
    int64_t outer_per_row = 1, inner = 1;
    for (int d = 1; d < axis; d++) outer_per_row *= shape[d];
    for (int d = axis + 1; d < t->ndim; d++) inner *= shape[d];
    int64_t offset = 0;
    for (int64_t o = row0 * outer_per_row; o < row1 * outer_per_row && !status; o++) {
        for (int64_t k = 0; k < n && !status; k++) {
            int64_t len = runs[k].length * inner;
            int64_t logical = runs[k].logical_start < 0 ? -1 : (o * t->shape[axis] + runs[k].logical_start) * inner;
            if (!primary_only || !runs[k].replica) status = visit(ctx, offset, logical, len);
            offset += len;
        }
    }
    return status;
}

int ckpt_piece_element_runs(const ckpt_tensor_desc *t, int tp, int piece, int64_t row0, int64_t row1,
                            ckpt_element_run_fn visit, void *ctx)
{
    return ckpt_piece_element_runs_of(t, tp, piece, row0, row1, 0, visit, ctx);
}

int64_t ckpt_piece_block_rows(const ckpt_tensor_desc *t, int tp)
{
    ckpt_piece_geometry g;
    ckpt_piece_geometry_init(&g, t, tp, 0);
    return g.block_rows;
}
