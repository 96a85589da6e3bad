/* dcp_write.c: PyTorch distributed checkpoints written at any layout
 * (dcp.h dcp_write): a data file per rank, each of its pieces cut into the
 * boxes of the global tensor it holds (the runs of its split axis, padding
 * and replicas left out), each box a torch.save archive streamed from the
 * source (reshard_read_piece_rows) a block of rows at a time; then the
 * description carried, the other entries of a DCP source, and `.metadata`
 * last, pickled as the PyTorch that will read it names its classes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/buffer.h"
#include "../common/error.h"
#include "../common/memory.h"
#include "../common/parallel.h"
#include "../common/parse.h"
#include "../reshard/reshard.h"
#include "dcp_internal.h"
#include "torch_write.h"

/* A box streams from the source to its file through a buffer of about this
 * size (as the Megatron writer's pieces do: it stays in the CPU's cache). */
#define BLOCK_BYTES ((int64_t)256 << 10)
#define ARCHIVE_NAME "archive" /* torch.save's folder name when it writes to a stream, as DCP's writer does */

int dcp_torch_version_parse(const char *text, dcp_torch_version *out)
{
    if (!strcmp(text, "2")) *out = DCP_TORCH_2;
    else if (!strcmp(text, "1.13")) *out = DCP_TORCH_1_13;
    else return tp_fail(TP_ERR_ARG, "a PyTorch version of distributed checkpoints '%s' (2 or 1.13)", text);
    return TP_OK;
}

/* One box written: a chunk of a tensor of the source. */
typedef struct {
    int tensor;                 /* the source's */
    int k;                      /* among the tensors written */
    int piece;                  /* at the target tp */
    int padded;                 /* a whole piece at its place in the padded shape, padding rows included
                                   (hooks->padded, or a piece transformed) */
    int axis;                   /* the piece is cut along it (0 for a whole piece) */
    int64_t local_start;        /* where the box starts along axis, in the piece */
    int64_t row0, rows;         /* the rows of the piece it takes (axis 0) */
    int64_t offsets[CKPT_MAX_DIMS], sizes[CKPT_MAX_DIMS]; /* in the global tensor */
    int file;                   /* rank: (stage x tp + tensor rank) x dp + data-parallel rank */
    int64_t item_offset, item_bytes;
    uint64_t digest;            /* of its elements: a part of the tensor's logical digest */
} out_chunk;

typedef struct {
    ckpt_reader *source;
    const dcp_write_options *options;
    ckpt_layout to;
    int *tensors;               /* source indices written, in order */
    int num_tensors;
    out_chunk *chunks;          /* tensor by tensor, pieces in rank order */
    int64_t num_chunks;
    int64_t *tensor_first;      /* per tensor written: its first chunk; one more entry at the end */
    int64_t *by_file;           /* chunk indices ordered by file */
    int64_t *file_first;        /* per file: its first in by_file; one more entry at the end */
    int64_t largest_row;        /* bytes of the longest piece row */
    int64_t largest_whole;      /* bytes of the largest piece read whole (hooks->whole_piece) */
    const char *longest_name, *whole_name; /* their tensors */
    int dp;                     /* data-parallel ranks each box is cut over along dimension 0 */
    const char *root;           /* the directory written into */
    const struct dcp_write_hooks *hooks; /* NULL: plain DCP */
    /* The entries: the keys written, each one tensor or a stack of them
     * along a leading axis (hooks->key_of), in order of first appearance. */
    char (*keys)[CKPT_NAME_MAX + 1]; /* per tensor written: its entry's key */
    int64_t *stack_index;       /* per tensor written: its place along its entry's leading axis, or -1 */
    int64_t *stack_size;        /* per tensor written: the size of that axis, or 0 */
    int *entry_of;              /* per tensor written: its entry */
    int num_entries;
    int *entry_tensor;          /* per entry: its first tensor (index among those written) */
    int *members;               /* tensors written, entry by entry, each entry's in order */
    int *member_first;          /* per entry: its first in members; one more entry at the end */
} writer;

/* The entry's shape of a tensor: its global shape, padded where the
 * hooks write the padding, after the stacking axis where there is one. */
static int entry_shape(const writer *w, int k, int64_t *shape)
{
    const ckpt_tensor_desc *t = ckpt_reader_tensor(w->source, w->tensors[k]);
    int lead = w->stack_index[k] >= 0;
    if (lead) shape[0] = w->stack_size[k];
    const struct dcp_write_hooks *hooks = w->hooks;
    int read_whole = hooks && hooks->whole_piece && hooks->whole_piece(hooks->ctx, w->tensors[k]);
    if (hooks && hooks->padded && !read_whole) ckpt_padded_shape(t, w->to.tp, shape + lead);
    else memcpy(shape + lead, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    return t->ndim + lead;
}

static void writer_free(writer *w)
{
    free(w->tensors);
    free(w->tensor_first);
    free(w->chunks);
    free(w->by_file);
    free(w->file_first);
    free(w->keys);
    free(w->stack_index);
    free(w->stack_size);
    free(w->entry_of);
    free(w->entry_tensor);
    free(w->members);
    free(w->member_first);
}

static int64_t chunk_bytes(const writer *w, const out_chunk *c)
{
    const ckpt_tensor_desc *t = ckpt_reader_tensor(w->source, c->tensor);
    int64_t bytes = (int64_t)tp_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) bytes *= c->sizes[d];
    return bytes;
}

static int add_chunk_once(writer *w, int64_t *capacity, out_chunk c)
{
    if (w->num_chunks == *capacity) {
        int64_t grown_capacity = *capacity ? 2 * *capacity : 256;
        out_chunk *grown = realloc(w->chunks, (size_t)grown_capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory");
        w->chunks = grown;
        *capacity = grown_capacity;
    }
    w->chunks[w->num_chunks++] = c;
    return TP_OK;
}

/* A box of rank tp_rank of a stage, cut along dimension 0 over the
 * data-parallel ranks as torch.chunk cuts (the last parts smaller, or
 * none), as FSDP with tensor parallelism shards. */
static int add_chunk(writer *w, int64_t *capacity, out_chunk c, int stage, int tp_rank, int64_t *bytes)
{
    int64_t rows = c.sizes[0], part = (rows + w->dp - 1) / w->dp;
    for (int r = 0; r < w->dp && r * part < rows; r++) {
        out_chunk d = c;
        int64_t n = rows - r * part < part ? rows - r * part : part;
        d.offsets[0] += r * part;
        d.sizes[0] = n;
        d.row0 += r * part;
        d.rows = n;
        if (d.axis == 0) d.local_start += r * part;
        d.file = (stage * w->to.tp + tp_rank) * w->dp + r;
        TP_TRY(add_chunk_once(w, capacity, d));
        *bytes += chunk_bytes(w, &d);
    }
    return TP_OK;
}


/* The key tensor t is written under where no hooks choose it: the key
 * it was read from, the source being a DCP checkpoint (options->keys_from:
 * a state dict's key comes out as it went in), else dcp_key_of(name). */
static int key_of_tensor(const writer *w, const ckpt_tensor_desc *t, char *key, size_t size)
{
    const dcp_checkpoint *from = w->options->keys_from;
    if (!from) {
        dcp_key_of(t->name, key, size);
        return TP_OK;
    }
    int e = dcp_find_tensor(from, t->name);
    if (e < 0) return tp_fail(TP_ERR_STATE, "tensor %s: no entry of %s holds it", t->name, dcp_path(from));
    const char *read_from = dcp_entry_at(from, e)->key;
    if (strlen(read_from) >= size)
        return tp_fail(TP_ERR_STATE, "tensor %s: its key %s is longer than %zu bytes", t->name, read_from, size - 1);
    memcpy(key, read_from, strlen(read_from) + 1);
    return TP_OK;
}

/* The chunks of every tensor written, and their order by file. */
static int plan_chunks(writer *w, dcp_write_plan *plan)
{
    ckpt_reader *source = w->source;
    int n = ckpt_reader_num_tensors(source);
    const struct dcp_write_hooks *hooks = w->hooks;
    w->tensors = calloc((size_t)n + 1, sizeof *w->tensors);
    w->tensor_first = calloc((size_t)n + 2, sizeof *w->tensor_first);
    w->keys = calloc((size_t)n + 1, sizeof *w->keys);
    w->stack_index = calloc((size_t)n + 1, sizeof *w->stack_index);
    w->stack_size = calloc((size_t)n + 1, sizeof *w->stack_size);
    if (!w->tensors || !w->tensor_first || !w->keys || !w->stack_index || !w->stack_size)
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    int64_t capacity = 0;
    for (int i = 0; i < n; i++) {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(source, i);
        if (w->options->weights_only && t->role && strcmp(t->role, "param")) continue;
        int k = w->num_tensors, skip = 0;
        int64_t index = -1, stack = 0;
        if (hooks && hooks->key_of) TP_TRY(hooks->key_of(hooks->ctx, i, w->keys[k], sizeof w->keys[k], &index, &stack, &skip));
        else TP_TRY(key_of_tensor(w, t, w->keys[k], sizeof w->keys[k]));
        if (skip) continue;
        if (stack > 0 && (index < 0 || index >= stack))
            return tp_fail(TP_ERR_STATE, "tensor %s: place %lld along the leading axis of %s, of %lld", t->name,
                           (long long)index, w->keys[k], (long long)stack);
        w->stack_index[k] = stack > 0 ? index : -1;
        w->stack_size[k] = stack > 0 ? stack : 0;
        TP_TRY(ckpt_tensor_check(t, w->to.tp));
        w->num_tensors++;
        w->tensors[k] = i;
        w->tensor_first[k] = w->num_chunks;
        int stage = ckpt_tensor_stage(t, &w->to);
        int64_t shape[CKPT_MAX_DIMS], row = (int64_t)tp_dtype_size(t->dtype);
        ckpt_piece_shape(t, w->to.tp, shape);
        for (int d = 1; d < t->ndim; d++) row *= shape[d];
        if (row > w->largest_row) w->largest_row = row, w->longest_name = t->name;
        if (hooks && hooks->whole_piece && hooks->whole_piece(hooks->ctx, i) && row * t->shape[0] > w->largest_whole)
            w->largest_whole = row * t->shape[0], w->whole_name = t->name; /* the whole tensor */
        out_chunk whole = {.tensor = i, .k = k, .piece = 0, .axis = 0, .local_start = 0, .row0 = 0, .rows = t->shape[0]};
        for (int d = 0; d < t->ndim; d++) whole.sizes[d] = t->shape[d];
        if (t->partition.kind != CKPT_SPLIT) { /* written once, by tensor rank 0 of its stage */
            TP_TRY(add_chunk(w, &capacity, whole, stage, 0, &plan->bytes));
            continue;
        }
        int64_t padded[CKPT_MAX_DIMS];
        ckpt_padded_shape(t, w->to.tp, padded);
        int read_whole = hooks && hooks->whole_piece && hooks->whole_piece(hooks->ctx, i);
        if (read_whole || (hooks && hooks->padded && padded[t->partition.axis] != t->shape[t->partition.axis])) {
            /* Each piece whole at its place in the padded tensor, its padding rows included; a tensor
             * transformed (a QKV regrouped) is laid out in the target's order of rows, each piece a run
             * of them, not as the source's segments say. */
            if (t->partition.axis != 0 || w->dp > 1 || (read_whole && t->shape[0] % w->to.tp))
                return tp_fail(TP_ERR_LAYOUT, "tensor %s: %s along dimension %d is written on rows only%s", t->name,
                               read_whole ? "a tensor transformed" : "padding", t->partition.axis,
                               read_whole ? ", tp dividing them" : "");
            if (read_whole) shape[0] = t->shape[0] / w->to.tp;
            for (int p = 0; p < w->to.tp; p++) {
                out_chunk c = whole;
                c.piece = p;
                c.padded = 1;
                c.rows = shape[0];
                for (int d = 0; d < t->ndim; d++) c.sizes[d] = shape[d];
                c.offsets[0] = p * shape[0];
                TP_TRY(add_chunk(w, &capacity, c, stage, p, &plan->bytes));
            }
            continue;
        }
        ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
        for (int p = 0; p < w->to.tp; p++) {
            int64_t m = ckpt_piece_runs(t, w->to.tp, p, runs, 2 * CKPT_MAX_SEGMENTS);
            if (m < 0) return tp_fail(TP_ERR_STATE, "tensor %s: the runs of piece %d", t->name, p);
            for (int64_t r = 0; r < m; r++) {
                if (runs[r].logical_start < 0 || runs[r].replica) continue; /* padding; a copy of a replicated head */
                out_chunk c = whole;
                c.piece = p;
                c.axis = t->partition.axis;
                c.local_start = runs[r].local_start;
                c.offsets[c.axis] = runs[r].logical_start;
                c.sizes[c.axis] = runs[r].length;
                if (c.axis == 0) {
                    c.row0 = runs[r].local_start;
                    c.rows = runs[r].length;
                }
                TP_TRY(add_chunk(w, &capacity, c, stage, p, &plan->bytes));
            }
        }
    }
    w->tensor_first[w->num_tensors] = w->num_chunks;
    /* By file, keeping tensor order inside each: a counting sort. */
    int files = w->to.tp * w->to.pp * w->dp;
    w->by_file = calloc((size_t)w->num_chunks + 1, sizeof *w->by_file);
    w->file_first = calloc((size_t)files + 1, sizeof *w->file_first);
    if (!w->by_file || !w->file_first) return tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int64_t c = 0; c < w->num_chunks; c++) w->file_first[w->chunks[c].file + 1]++;
    for (int f = 0; f < files; f++) w->file_first[f + 1] += w->file_first[f];
    int64_t *next = calloc((size_t)files + 1, sizeof *next);
    if (!next) return tp_fail(TP_ERR_NOMEM, "out of memory");
    memcpy(next, w->file_first, sizeof *next * (size_t)files);
    for (int64_t c = 0; c < w->num_chunks; c++) w->by_file[next[w->chunks[c].file]++] = c;
    free(next);
    plan->tensors = w->num_tensors;
    plan->chunks = (int)w->num_chunks;
    return TP_OK;
}

/* A tensor written as qsort orders them: by key, then by its place along
 * the leading axis, then as written. */
typedef struct {
    const char *key;
    int64_t index;
    int k;
} keyed;

static int compare_keyed(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c) return c;
    if (x->index != y->index) return x->index < y->index ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

/* Whether key is taken by an entry that is not a tensor written: the
 * description, another entry carried, an object of the hooks'. */
static int key_taken(const writer *w, const char *key)
{
    const struct dcp_write_hooks *hooks = w->hooks;
    const dcp_checkpoint *others = w->options->others_from;
    if (!(hooks && hooks->no_description) && !strcmp(key, DCP_INDEX_KEY)) return 1;
    int other = others ? dcp_find(others, key) : -1;
    if (other >= 0 && dcp_entry_is_other(dcp_entry_at(others, other)) &&
        !(hooks && hooks->carry && !hooks->carry(hooks->ctx, dcp_entry_at(others, other))))
        return 1;
    for (int o = 0; hooks && o < hooks->num_objects; o++)
        if (!strcmp(key, hooks->object_key(hooks->ctx, o))) return 1;
    return 0;
}

/* The entries: tensors under the same key make one, stacked along its
 * leading axis, each place of it taken once and every member of the same
 * shape and dtype; an entry alone under its key otherwise. Entries are
 * numbered in order of first appearance. */
static int build_entries(writer *w)
{
    int n = w->num_tensors;
    keyed *sorted = calloc((size_t)n + 1, sizeof *sorted);
    int *order = calloc((size_t)n + 1, sizeof *order);
    w->entry_of = calloc((size_t)n + 1, sizeof *w->entry_of);
    w->entry_tensor = calloc((size_t)n + 1, sizeof *w->entry_tensor);
    w->members = calloc((size_t)n + 1, sizeof *w->members);
    w->member_first = calloc((size_t)n + 2, sizeof *w->member_first);
    if (!sorted || !order || !w->entry_of || !w->entry_tensor || !w->members || !w->member_first) {
        free(sorted);
        free(order);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < n; k++) sorted[k] = (keyed){w->keys[k], w->stack_index[k], k};
    qsort(sorted, (size_t)n, sizeof *sorted, compare_keyed);
    for (int k = 0; k < n; k++) order[k] = sorted[k].k;
    free(sorted);
    int status = TP_OK;
    /* Groups of one key: the first member (smallest k) names the group. */
    for (int g = 0; g < n && !status; ) {
        int h = g, first = order[g];
        while (h < n && !strcmp(w->keys[order[h]], w->keys[order[g]])) {
            if (order[h] < first) first = order[h];
            h++;
        }
        const ckpt_tensor_desc *a = ckpt_reader_tensor(w->source, w->tensors[order[g]]);
        if (key_taken(w, w->keys[order[g]]))
            status = tp_fail(TP_ERR_LAYOUT, "tensor %s: its key %s is another entry's", a->name, w->keys[order[g]]);
        for (int m = g; m < h && !status; m++) {
            int k = order[m];
            const ckpt_tensor_desc *t = ckpt_reader_tensor(w->source, w->tensors[k]);
            int64_t sa[CKPT_MAX_DIMS + 1], st[CKPT_MAX_DIMS + 1];
            int na = entry_shape(w, order[g], sa), nt = entry_shape(w, k, st);
            int same = na == nt && t->dtype == a->dtype && !memcmp(sa, st, sizeof(int64_t) * (size_t)na);
            if (h - g > 1 && w->stack_index[k] < 0) { /* named against another member, not itself */
                const ckpt_tensor_desc *o = m == g ? ckpt_reader_tensor(w->source, w->tensors[order[g + 1]]) : t;
                status = tp_fail(TP_ERR_LAYOUT, "two tensors are written under the key %s (%s and %s; '/' and '.' both "
                                 "become '.')", w->keys[k], a->name, o->name);
            }
            else if (!same)
                status = tp_fail(TP_ERR_LAYOUT, "tensors %s and %s, stacked under %s, differ in shape or dtype", a->name,
                                 t->name, w->keys[k]);
            else if (m > g && w->stack_index[k] == w->stack_index[order[m - 1]]) /* t and the one before it */
                status = tp_fail(TP_ERR_LAYOUT, "tensors %s and %s both take place %lld of %s",
                                 ckpt_reader_tensor(w->source, w->tensors[order[m - 1]])->name, t->name,
                                 (long long)w->stack_index[k], w->keys[k]);
        }
        if (!status && w->stack_index[order[g]] >= 0 && h - g != w->stack_size[order[g]])
            status = tp_fail(TP_ERR_LAYOUT, "%s stacks %d tensors along an axis of %lld (the first %s)", w->keys[order[g]],
                             h - g, (long long)w->stack_size[order[g]], a->name);
        for (int m = g; m < h; m++) w->entry_of[order[m]] = first; /* numbered below */
        g = h;
    }
    /* Entries numbered in order of first appearance; members in key order. */
    int *number = calloc((size_t)n + 1, sizeof *number);
    if (!status && !number) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int k = 0; !status && k < n; k++) number[k] = -1;
    for (int k = 0; !status && k < n; k++)
        if (w->entry_of[k] == k) {
            number[k] = w->num_entries;
            w->entry_tensor[w->num_entries++] = k;
        }
    for (int k = 0; !status && k < n; k++) {
        w->entry_of[k] = number[w->entry_of[k]];
        w->member_first[w->entry_of[k] + 1]++;
    }
    for (int e = 0; !status && e < w->num_entries; e++) w->member_first[e + 1] += w->member_first[e];
    int *next = status ? NULL : calloc((size_t)w->num_entries + 1, sizeof *next);
    if (!status && !next) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    if (!status) memcpy(next, w->member_first, sizeof *next * (size_t)w->num_entries);
    for (int m = 0; !status && m < n; m++) w->members[next[w->entry_of[order[m]]]++] = order[m];
    free(next);
    free(number);
    free(order);
    return status;
}

/* Whether other entry e of the DCP source goes along. */
static int carried_along(const writer *w, const dcp_entry *e)
{
    return dcp_entry_is_other(e) && !(w->hooks && w->hooks->carry && !w->hooks->carry(w->hooks->ctx, e));
}

/* The layout, the chunks and the entries of a write; w->source and
 * w->options set. */
static int writer_plan(writer *w, dcp_write_plan *plan)
{
    const dcp_write_options *options = w->options;
    w->to = *ckpt_reader_layout(w->source);
    w->dp = options->dp > 0 ? options->dp : 1;
    w->hooks = options->hooks;
    if (options->tp) w->to.tp = options->tp;
    if (options->pp) w->to.pp = options->pp;
    w->to.dp = 1;
    w->to.virtual_stages = 1; /* a rank file per stage, its layers consecutive: DCP records no interleaving */
    int status = ckpt_layout_check(&w->to);
    if (status) return tp_fail(TP_ERR_LAYOUT, "%lld layers do not divide over pp %d", (long long)w->to.num_layers, w->to.pp);
    if (w->dp > 4096 || (int64_t)w->to.tp * w->to.pp * w->dp > 1 << 20)
        return tp_fail(TP_ERR_ARG, "%d data-parallel ranks of %d x %d: more than the 2^20 data files written", w->dp,
                       w->to.tp, w->to.pp);
    TP_TRY(plan_chunks(w, plan));
    return build_entries(w);
}

/* A thread holds a block of rows, a block gathered from it, and the
 * staging reshard_read_piece_rows may use: three blocks; and a piece read
 * whole with its scratch where the hooks transform one. */
static int64_t block_bytes(const writer *w)
{
    return w->largest_row > BLOCK_BYTES ? w->largest_row : BLOCK_BYTES;
}

int dcp_write_plan_create(ckpt_reader *source, const dcp_write_options *options, dcp_write_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    writer w = {.source = source, .options = options};
    int status = writer_plan(&w, plan);
    plan->tp = w.to.tp;
    plan->pp = w.to.pp;
    plan->dp = w.dp;
    plan->files = w.to.tp * w.to.pp * w.dp;
    for (int i = 0; !status && options->others_from && i < dcp_num_entries(options->others_from); i++)
        plan->others += carried_along(&w, dcp_entry_at(options->others_from, i));
    /* The read back: DCP's reader presents every tensor whole (tp1), its chunks as boxes. */
    int64_t verify_read = 0, bounce = 0;
    for (int64_t c = 0; !status && !w.hooks && c < w.num_chunks; c++) {
        const ckpt_tensor_desc *t = ckpt_reader_tensor(source, w.chunks[c].tensor);
        int64_t read = ckpt_tensor_verify_read_bytes(t, 1, 0, 0), box = ckpt_tensor_box_bounce_bytes(t, 1, w.chunks[c].sizes);
        if (read > verify_read) verify_read = read;
        if (box > bounce) bounce = box;
    }
    plan->read_back_bytes = verify_read + bounce;
    int64_t per_thread = 3 * block_bytes(&w) + 2 * w.largest_whole, share;
    int threads = options->threads > 0 ? options->threads : parallel_cpu_count();
    if (threads > plan->files) threads = plan->files;
    if (!status) threads = reshard_threads_within(options->memory_limit, threads, per_thread, 0, &share);
    char row[32];
    format_bytes((double)w.largest_row, row, sizeof row);
    if (!status && threads < 1)
        status = reshard_memory_refusal(options->memory_limit, per_thread, 0,
                                        "the longest row, %s of tensor %s%s%s%s", row,
                                        w.longest_name ? w.longest_name : "(none)",
                                        w.whole_name ? "; the largest piece read whole, " : "",
                                        w.whole_name ? w.whole_name : "", w.whole_name ? ", twice" : "");
    plan->threads = threads > 0 ? threads : 1;
    plan->buffer_memory = plan->threads * per_thread;
    writer_free(&w);
    return status;
}

/* The logical digest of a box's elements, stored row-major in data: the
 * offsets and sizes of the box in a tensor of shape t->shape. */
static uint64_t box_digest(const ckpt_tensor_desc *t, const int64_t *offsets, const int64_t *sizes, const void *data)
{
    int ndim = t->ndim;
    size_t es = tp_dtype_size(t->dtype);
    int64_t stride[CKPT_MAX_DIMS];
    stride[ndim - 1] = 1;
    for (int d = ndim - 2; d >= 0; d--) stride[d] = stride[d + 1] * t->shape[d + 1];
    /* Runs contiguous in the tensor: the innermost dimension, and every
     * dimension outside it the box covers whole. */
    int inner = ndim - 1;
    int64_t run = sizes[inner];
    while (inner > 0 && sizes[inner] == t->shape[inner]) run *= sizes[--inner];
    int64_t idx[CKPT_MAX_DIMS] = {0}, total = 1;
    for (int d = 0; d < ndim; d++) total *= sizes[d];
    uint64_t digest = 0;
    const char *p = data;
    for (int64_t done = 0; done < total; done += run, p += run * (int64_t)es) {
        int64_t first = 0;
        for (int d = 0; d < ndim; d++) first += (offsets[d] + (d < inner ? idx[d] : 0)) * stride[d];
        digest += ckpt_digest_run(p, es, first, run);
        for (int d = inner - 1; d >= 0 && ++idx[d] == sizes[d]; d--) idx[d] = 0;
    }
    return digest;
}

typedef struct {
    writer *w;
    char *block, *gathered;     /* BLOCK_BYTES or a row each, per thread */
    size_t block_size;
    char *piece, *scratch;      /* a piece read whole, and its scratch (hooks->whole_piece); NULL: none */
} rank_buffers;

/* Streams chunk c into file as one torch.save archive of its box (with a
 * leading axis of 1 where its entry stacks tensors). */
static int write_chunk(writer *w, rank_buffers *rb, out_chunk *c, FILE *file, const char *path)
{
    const struct dcp_write_hooks *hooks = w->hooks;
    const ckpt_tensor_desc *t = ckpt_reader_tensor(w->source, c->tensor);
    int ndim = t->ndim;
    size_t es = tp_dtype_size(t->dtype);
    int64_t piece[CKPT_MAX_DIMS];
    ckpt_piece_shape(t, w->to.tp, piece);
    int64_t inner = 1, outer = 1; /* elements after the cut axis; rows before it, in a row of the piece */
    for (int d = c->axis + 1; d < ndim; d++) inner *= piece[d];
    for (int d = 1; d < c->axis; d++) outer *= piece[d];
    int whole = c->axis == 0 || c->sizes[c->axis] == piece[c->axis];
    int64_t row_bytes = (int64_t)es, first_row = c->row0;
    for (int d = 1; d < ndim; d++) row_bytes *= piece[d];
    int64_t rows = c->rows, per_block = (int64_t)rb->block_size / row_bytes;
    if (per_block < 1) per_block = 1;
    int read_whole = hooks && hooks->whole_piece && hooks->whole_piece(hooks->ctx, c->tensor);
    off_t at = ftello(file);
    if (at < 0) return tp_fail(TP_ERR_IO, "%s: cannot tell the position: %s", path, strerror(errno));
    c->item_offset = (int64_t)at;
    int status = TP_OK;
    if (read_whole) { /* the tensor read whole and transformed (a QKV regrouped); the piece a run of its rows */
        int64_t bytes = row_bytes * t->shape[0];
        if (!rb->piece) return tp_fail(TP_ERR_STATE, "tensor %s: no buffer for a tensor read whole", t->name);
        /* A failed read is the source's to name (its file, its entry): the
         * item being written lies in a staging file the user never sees. */
        TP_TRY(reshard_read_piece(w->source, c->tensor, t, 1, 0, rb->piece, (size_t)bytes));
        status = hooks->transform(hooks->ctx, c->tensor, rb->piece, rb->scratch, bytes);
        if (status) return tp_fail_context(status, "%s: tensor %s", path, t->name);
        first_row = c->offsets[0];
    }
    int64_t sizes[CKPT_MAX_DIMS + 1] = {1};
    int lead = w->stack_index[c->k] >= 0; /* the entry's leading axis, of 1 in the box */
    memcpy(sizes + lead, c->sizes, sizeof(int64_t) * (size_t)ndim);
    torch_writer *tw;
    TP_TRY(torch_writer_open_in(file, path, ARCHIVE_NAME, &tw));
    status = torch_writer_tensor(tw, torch_dtype_from_tp(t->dtype), ndim + lead, sizes);
    if (!status) status = torch_writer_begin_storages(tw);
    c->digest = 0;
    int source_failed = 0; /* the source's read failed: its message names it, no context of the output's */
    for (int64_t r = 0; r < rows && !status; r += per_block) {
        int64_t n = per_block < rows - r ? per_block : rows - r;
        if (read_whole) memcpy(rb->block, rb->piece + (first_row + r) * row_bytes, (size_t)(n * row_bytes));
        else status = reshard_read_piece_rows(w->source, c->tensor, t, w->to.tp, c->piece, first_row + r, n, rb->block,
                                              rb->block_size);
        source_failed = status != TP_OK;
        if (!status && c->padded && hooks->fill_padding)
            status = hooks->fill_padding(hooks->ctx, c->tensor, w->to.tp, c->piece, first_row + r, n, rb->block);
        if (status) break;
        const char *data = rb->block;
        int64_t bytes = n * row_bytes;
        if (!whole) { /* the box's part of each row: [outer, sizes[axis], inner] from [outer, piece[axis], inner] */
            int64_t run = c->sizes[c->axis] * inner * (int64_t)es, stride = piece[c->axis] * inner * (int64_t)es;
            for (int64_t o = 0; o < n * outer; o++)
                memcpy(rb->gathered + o * run, rb->block + o * stride + c->local_start * inner * (int64_t)es, (size_t)run);
            data = rb->gathered;
            bytes = n * outer * run;
        }
        int64_t offsets[CKPT_MAX_DIMS], box[CKPT_MAX_DIMS];
        memcpy(offsets, c->offsets, sizeof offsets);
        memcpy(box, c->sizes, sizeof box);
        offsets[0] += r;
        box[0] = n;
        /* The logical digest, of a box of the logical tensor (a padded piece is not one: no description goes with it). */
        if (!c->padded) c->digest += box_digest(t, offsets, box, data);
        status = torch_writer_storage_part(tw, data, bytes);
        if (!status && w->options->on_bytes) w->options->on_bytes(w->options->progress_ctx, bytes);
    }
    if (status) {
        torch_writer_abort(tw);
        return source_failed ? status : tp_fail_context(status, "%s: tensor %s", path, t->name);
    }
    TP_TRY(torch_writer_finish(tw));
    off_t end = ftello(file);
    if (end < 0) return tp_fail(TP_ERR_IO, "%s: cannot tell the position: %s", path, strerror(errno));
    c->item_bytes = (int64_t)end - c->item_offset;
    return TP_OK;
}

static void data_file_name(int rank, char *out, size_t size)
{
    snprintf(out, size, "__%d_0.distcp", rank);
}

typedef struct {
    writer *w;
    rank_buffers *buffers; /* per thread */
} rank_job;

/* Task f: rank f's data file, its chunks one after the other. */
static int write_rank_task(void *ctx, int64_t f, int thread)
{
    rank_job *job = ctx;
    writer *w = job->w;
    char name[64], path[CKPT_PATH_MAX + 80];
    data_file_name((int)f, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", w->root, name);
    FILE *file = fopen(path, "wbx");
    if (!file) return tp_fail(TP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int status = TP_OK;
    for (int64_t k = w->file_first[f]; k < w->file_first[f + 1] && !status; k++)
        status = write_chunk(w, &job->buffers[thread], &w->chunks[w->by_file[k]], file, path);
    if (!status && (fflush(file) != 0 || fsync(fileno(file)) != 0))
        status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    if (fclose(file) != 0 && !status) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return status;
}

/* ------------------------------------------------------------ .metadata */

typedef struct {
    const char *metadata;   /* Metadata, TensorStorageMetadata, ChunkStorageMetadata, ... */
    const char *properties; /* TensorProperties */
    const char *encoding;   /* its memory format's enum */
    const char *filesystem; /* _StorageInfo */
    int planner_data;       /* flatten_state_dict's mapping, as 2.x writes it */
} dialect;

static const dialect *dialect_of(dcp_torch_version v)
{
    static const dialect torch2 = {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.metadata",
                                   "_MEM_FORMAT_ENCODING", "torch.distributed.checkpoint.filesystem", 1};
    static const dialect torch113 = {"torch.distributed._shard.checkpoint.metadata",
                                     "torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING",
                                     "torch.distributed._shard.checkpoint.filesystem", 0};
    return v == DCP_TORCH_1_13 ? &torch113 : &torch2;
}

/* The .metadata pickle being built: each class and string written once,
 * then the memo's GET of it, as PyTorch's pickler writes it. */
typedef struct {
    byte_buffer b;
    pk_memo *memo;
    const dialect *d;
} meta_pickle;

static void meta_string(meta_pickle *p, const char *text)
{
    pk_shared_string(&p->b, p->memo, text);
}

static void meta_global(meta_pickle *p, const char *module, const char *name)
{
    pk_shared_global(&p->b, p->memo, module, name);
}

static void meta_object_begin(meta_pickle *p, const char *module, const char *name)
{
    pk_object_begin(&p->b, p->memo, module, name);
    pk_dict_begin(&p->b);
}

/* The dataclass's state dict closed and given to it. */
static void meta_object_end(meta_pickle *p)
{
    pk_dict_end(&p->b);
    pk_build(&p->b);
}

static void meta_size(meta_pickle *p, const int64_t *values, int n)
{
    meta_global(p, "torch", "Size");
    pk_mark(&p->b);
    pk_mark(&p->b);
    for (int i = 0; i < n; i++) pk_int(&p->b, values[i]);
    pk_tuple_end(&p->b);
    pk_tuple_end(&p->b);
    pk_reduce(&p->b);
}

/* TensorProperties(dtype), its state the tuple (dtype, layout, requires_grad,
 * memory format, pin_memory) that its __getstate__ gives. */
static void meta_properties(meta_pickle *p, torch_dtype dtype)
{
    byte_buffer *b = &p->b;
    pk_object_begin(b, p->memo, p->d->properties, "TensorProperties");
    pk_mark(b);
    meta_global(p, "torch", torch_dtype_name(dtype));
    meta_global(p, "torch.serialization", "_get_layout");
    pk_mark(b);
    meta_string(p, "torch.strided");
    pk_tuple_end(b);
    pk_reduce(b);
    pk_bool(b, 0);
    meta_global(p, "builtins", "getattr");
    pk_mark(b);
    meta_global(p, p->d->properties, p->d->encoding);
    meta_string(p, "TORCH_CONTIGUOUS_FORMAT");
    pk_tuple_end(b);
    pk_reduce(b);
    pk_bool(b, 0);
    pk_tuple_end(b);
    pk_build(b);
}

static void meta_tensor_begin(meta_pickle *p, torch_dtype dtype, const int64_t *shape, int ndim)
{
    meta_object_begin(p, p->d->metadata, "TensorStorageMetadata");
    meta_string(p, "properties");
    meta_properties(p, dtype);
    meta_string(p, "size");
    meta_size(p, shape, ndim);
    meta_string(p, "chunks");
    pk_list_begin(&p->b);
}

static void meta_tensor_end(meta_pickle *p)
{
    pk_list_end(&p->b);
    meta_object_end(p);
}

static void meta_chunk(meta_pickle *p, const int64_t *offsets, const int64_t *sizes, int ndim)
{
    meta_object_begin(p, p->d->metadata, "ChunkStorageMetadata");
    meta_string(p, "offsets");
    meta_size(p, offsets, ndim);
    meta_string(p, "sizes");
    meta_size(p, sizes, ndim);
    meta_object_end(p);
}

static void meta_bytes(meta_pickle *p)
{
    meta_object_begin(p, p->d->metadata, "BytesStorageMetadata");
    meta_object_end(p);
}

/* MetadataIndex(fqn, offset, index) -> _StorageInfo(relative_path, offset, length). */
static void meta_storage_item(meta_pickle *p, const char *key, const int64_t *offsets, int ndim, int index, int file,
                              int64_t item_offset, int64_t item_bytes)
{
    meta_object_begin(p, p->d->metadata, "MetadataIndex");
    meta_string(p, "fqn");
    meta_string(p, key);
    meta_string(p, "offset");
    if (offsets) meta_size(p, offsets, ndim);
    else pk_none(&p->b);
    meta_string(p, "index");
    if (offsets) pk_int(&p->b, index);
    else pk_none(&p->b);
    meta_object_end(p);
    char name[64];
    data_file_name(file, name, sizeof name);
    meta_object_begin(p, p->d->filesystem, "_StorageInfo");
    meta_string(p, "relative_path");
    meta_string(p, name);
    meta_string(p, "offset");
    pk_int(&p->b, item_offset);
    meta_string(p, "length");
    pk_int(&p->b, item_bytes);
    meta_object_end(p);
}

/* Where the other entries, the description and the hooks' objects went (file 0). */
typedef struct {
    int entry;                   /* in the DCP source; -1: the description, or object */
    int object;                  /* the hooks' object; -1: none */
    int64_t *item_offset, *item_bytes; /* per chunk of the entry */
} carried;

static const char *carried_key(const writer *w, const carried *x)
{
    if (x->object >= 0) return w->hooks->object_key(w->hooks->ctx, x->object);
    return x->entry < 0 ? DCP_INDEX_KEY : dcp_entry_at(w->options->others_from, x->entry)->key;
}

/* A chunk's offsets in its entry: after the stacking axis where there is one. */
static void entry_offsets(const writer *w, const out_chunk *c, int64_t *offsets, int64_t *sizes)
{
    int lead = w->stack_index[c->k] >= 0;
    offsets[0] = lead ? w->stack_index[c->k] : 0;
    sizes[0] = 1;
    int ndim = ckpt_reader_tensor(w->source, c->tensor)->ndim;
    memcpy(offsets + lead, c->offsets, sizeof(int64_t) * (size_t)ndim);
    memcpy(sizes + lead, c->sizes, sizeof(int64_t) * (size_t)ndim);
}

static int write_metadata(const writer *w, const carried *extra, int num_extra, const char *path)
{
    const dcp_checkpoint *others = w->options->others_from;
    meta_pickle p = {.d = dialect_of(w->options->torch_version)};
    TP_TRY(pk_memo_create(0, &p.memo));
    byte_buffer *b = &p.b;
    pk_proto(b);
    meta_object_begin(&p, p.d->metadata, "Metadata");
    meta_string(&p, "state_dict_metadata");
    pk_dict_begin(b);
    int64_t offsets[CKPT_MAX_DIMS + 1], sizes[CKPT_MAX_DIMS + 1], shape[CKPT_MAX_DIMS + 1];
    for (int e = 0; e < w->num_entries; e++) {
        int first = w->entry_tensor[e];
        const ckpt_tensor_desc *t = ckpt_reader_tensor(w->source, w->tensors[first]);
        int ndim = entry_shape(w, first, shape);
        meta_string(&p, w->keys[first]);
        meta_tensor_begin(&p, torch_dtype_from_tp(t->dtype), shape, ndim);
        for (int m = w->member_first[e]; m < w->member_first[e + 1]; m++)
            for (int64_t c = w->tensor_first[w->members[m]]; c < w->tensor_first[w->members[m] + 1]; c++) {
                entry_offsets(w, &w->chunks[c], offsets, sizes);
                meta_chunk(&p, offsets, sizes, ndim);
            }
        meta_tensor_end(&p);
    }
    for (int x = 0; x < num_extra; x++) {
        meta_string(&p, carried_key(w, &extra[x]));
        const dcp_entry *e = extra[x].entry < 0 ? NULL : dcp_entry_at(others, extra[x].entry);
        if (!e || e->kind == DCP_BYTES) {
            meta_bytes(&p);
            continue;
        }
        meta_tensor_begin(&p, e->dtype, e->shape, e->ndim);
        for (int c = 0; c < e->num_chunks; c++) meta_chunk(&p, e->chunks[c].offsets, e->chunks[c].sizes, e->ndim);
        meta_tensor_end(&p);
    }
    pk_dict_end(b);
    meta_string(&p, "planner_data");
    if (p.d->planner_data) { /* the key of each flat entry maps to the path (key,) */
        pk_dict_begin(b);
        for (int e = 0; e < w->num_entries + num_extra; e++) {
            const char *k = e < w->num_entries ? w->keys[w->entry_tensor[e]] : carried_key(w, &extra[e - w->num_entries]);
            meta_string(&p, k);
            pk_mark(b);
            meta_string(&p, k);
            pk_tuple_end(b);
        }
        pk_dict_end(b);
    } else {
        pk_none(b);
    }
    meta_string(&p, "storage_data");
    pk_dict_begin(b);
    for (int e = 0; e < w->num_entries; e++) {
        int index = 0, first = w->entry_tensor[e];
        int ndim = entry_shape(w, first, shape);
        for (int m = w->member_first[e]; m < w->member_first[e + 1]; m++)
            for (int64_t c = w->tensor_first[w->members[m]]; c < w->tensor_first[w->members[m] + 1]; c++) {
                const out_chunk *oc = &w->chunks[c];
                entry_offsets(w, oc, offsets, sizes);
                meta_storage_item(&p, w->keys[first], offsets, ndim, index++, oc->file, oc->item_offset, oc->item_bytes);
            }
    }
    for (int x = 0; x < num_extra; x++) {
        if (extra[x].entry < 0) {
            meta_storage_item(&p, carried_key(w, &extra[x]), NULL, 0, 0, 0, extra[x].item_offset[0], extra[x].item_bytes[0]);
            continue;
        }
        const dcp_entry *e = dcp_entry_at(others, extra[x].entry);
        for (int c = 0; c < e->num_chunks; c++)
            if (e->chunks[c].file >= 0)
                meta_storage_item(&p, e->key, e->kind == DCP_BYTES ? NULL : e->chunks[c].offsets, e->ndim, c, 0,
                                  extra[x].item_offset[c], extra[x].item_bytes[c]);
    }
    pk_dict_end(b);
    meta_object_end(&p);
    pk_stop(b);
    pk_memo_free(p.memo);
    int status = b->failed ? tp_fail(TP_ERR_NOMEM, "out of memory for %s", path) : TP_OK;
    FILE *file = status ? NULL : fopen(path, "wbx");
    if (!status && !file) status = tp_fail(TP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (file) {
        if (fwrite(b->data, 1, b->size, file) != b->size || fflush(file) != 0 || fsync(fileno(file)) != 0)
            status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        if (fclose(file) != 0 && !status) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    free(b->data);
    return status;
}

/* ------------------------------------------------------------ the rest */

/* Copies an item of the DCP source to the end of file, in blocks. */
static int copy_item(const dcp_checkpoint *dcp, const dcp_chunk *c, FILE *file, const char *path, char *buf, size_t size,
                     int64_t *offset)
{
    off_t at = ftello(file);
    if (at < 0) return tp_fail(TP_ERR_IO, "%s: cannot tell the position: %s", path, strerror(errno));
    *offset = (int64_t)at;
    const store_ops *store;
    store_file *in;
    TP_TRY(dcp_open_item_file(dcp, c, &store, &in));
    int status = TP_OK;
    for (int64_t done = 0; done < c->item_bytes && !status; done += (int64_t)size) {
        size_t n = c->item_bytes - done < (int64_t)size ? (size_t)(c->item_bytes - done) : size;
        status = store->read_at(in, buf, n, c->item_offset + done);
        if (!status && fwrite(buf, 1, n, file) != n) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    dcp_close_item_file(dcp, c, store, in);
    return status;
}

/* The description of what was written (its digests computed while writing) as
 * a torch.save archive of one string, at the end of file. */
static int write_description(const writer *w, FILE *file, const char *path, int64_t *offset, int64_t *bytes)
{
    ckpt_tensor_desc *descs = calloc((size_t)w->num_tensors + 1, sizeof *descs);
    uint64_t *digests = calloc((size_t)w->num_tensors + 1, sizeof *digests);
    if (!descs || !digests) {
        free(descs);
        free(digests);
        return tp_fail(TP_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < w->num_tensors; k++) {
        descs[k] = *ckpt_reader_tensor(w->source, w->tensors[k]);
        for (int64_t c = w->tensor_first[k]; c < w->tensor_first[k + 1]; c++) digests[k] += w->chunks[c].digest;
    }
    char *text = NULL;
    int status = ckpt_description_json(&w->to, ckpt_reader_state(w->source), w->num_tensors, descs, digests, &text);
    free(descs);
    free(digests);
    off_t at = status ? 0 : ftello(file);
    if (!status && at < 0) status = tp_fail(TP_ERR_IO, "%s: cannot tell the position: %s", path, strerror(errno));
    torch_writer *tw = NULL;
    if (!status) status = torch_writer_open_in(file, path, ARCHIVE_NAME, &tw);
    if (!status) {
        pk_string(torch_writer_pickle(tw), text);
        status = torch_writer_begin_storages(tw);
        if (status) torch_writer_abort(tw);
        else status = torch_writer_finish(tw);
    }
    free(text);
    off_t end = status ? 0 : ftello(file);
    if (!status && end < 0) status = tp_fail(TP_ERR_IO, "%s: cannot tell the position: %s", path, strerror(errno));
    *offset = (int64_t)at;
    *bytes = (int64_t)(end - at);
    return status;
}

/* After the ranks: the description and the other entries at the end of
 * rank 0's file, then `.metadata`. */
static int write_rest(writer *w)
{
    const dcp_checkpoint *others = w->options->others_from;
    const struct dcp_write_hooks *hooks = w->hooks;
    int describe = !(hooks && hooks->no_description), objects = hooks ? hooks->num_objects : 0;
    int num_extra = describe + objects;
    for (int i = 0; others && i < dcp_num_entries(others); i++) num_extra += carried_along(w, dcp_entry_at(others, i));
    carried *extra = calloc((size_t)num_extra + 1, sizeof *extra);
    if (!extra) return tp_fail(TP_ERR_NOMEM, "out of memory");
    char name[64], path[CKPT_PATH_MAX + 80];
    data_file_name(0, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", w->root, name);
    int status = TP_OK;
    FILE *file = fopen(path, "r+b"); /* not "a": appended writes ignore pwrite's offsets */
    if (!file || fseeko(file, 0, SEEK_END) != 0) status = tp_fail(TP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = status ? NULL : alloc_pages((size_t)BLOCK_BYTES);
    if (!status && !buf) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    int x = 0;
    for (int i = 0; i < num_extra; i++) extra[i].object = extra[i].entry = -1;
    if (describe) {
        extra[x].item_offset = calloc(1, sizeof(int64_t));
        extra[x].item_bytes = calloc(1, sizeof(int64_t));
        if (!status && (!extra[x].item_offset || !extra[x].item_bytes)) status = tp_fail(TP_ERR_NOMEM, "out of memory");
        if (!status) status = write_description(w, file, path, extra[x].item_offset, extra[x].item_bytes);
        x++;
    }
    for (int i = 0; !status && others && i < dcp_num_entries(others); i++) {
        const dcp_entry *e = dcp_entry_at(others, i);
        if (!carried_along(w, e)) continue;
        extra[x].entry = i;
        extra[x].item_offset = calloc((size_t)e->num_chunks + 1, sizeof(int64_t));
        extra[x].item_bytes = calloc((size_t)e->num_chunks + 1, sizeof(int64_t));
        x++;
        if (!extra[x - 1].item_offset || !extra[x - 1].item_bytes) {
            status = tp_fail(TP_ERR_NOMEM, "out of memory");
            break;
        }
        for (int c = 0; c < e->num_chunks && !status; c++) {
            if (e->chunks[c].file < 0) continue;
            /* Checked as every item read is: a damaged one is not carried on as if whole. */
            status = dcp_check_item(others, &e->chunks[c]);
            if (!status)
                status = copy_item(others, &e->chunks[c], file, path, buf, (size_t)BLOCK_BYTES, &extra[x - 1].item_offset[c]);
            extra[x - 1].item_bytes[c] = e->chunks[c].item_bytes;
            if (status) status = tp_fail_context(status, "%s", e->key);
        }
    }
    for (int o = 0; !status && o < objects; o++) {
        carried *c = &extra[x++];
        c->object = o;
        c->item_offset = calloc(1, sizeof(int64_t));
        c->item_bytes = calloc(1, sizeof(int64_t));
        if (!c->item_offset || !c->item_bytes) {
            status = tp_fail(TP_ERR_NOMEM, "out of memory");
            break;
        }
        off_t at = ftello(file);
        if (at < 0) status = tp_fail(TP_ERR_IO, "%s: cannot tell the position: %s", path, strerror(errno));
        if (!status) status = hooks->write_object(hooks->ctx, o, file, path);
        off_t end = status ? 0 : ftello(file);
        if (!status && end < 0) status = tp_fail(TP_ERR_IO, "%s: cannot tell the position: %s", path, strerror(errno));
        c->item_offset[0] = (int64_t)at;
        c->item_bytes[0] = (int64_t)(end - at);
    }
    if (file) {
        if (!status && (fflush(file) != 0 || fsync(fileno(file)) != 0))
            status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        if (fclose(file) != 0 && !status) status = tp_fail(TP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    free(buf);
    snprintf(path, sizeof path, "%s/" DCP_METADATA_NAME, w->root);
    if (!status) status = write_metadata(w, extra, x, path);
    for (int i = 0; i < num_extra; i++) {
        free(extra[i].item_offset);
        free(extra[i].item_bytes);
    }
    free(extra);
    return status;
}

int dcp_is_data_file_name(const char *name)
{
    const char *c = name;
    if (strncmp(c, "__", 2)) return 0;
    for (c += 2; *c >= '0' && *c <= '9'; c++) {}
    return c > name + 2 && !strcmp(c, "_0.distcp");
}

static int visit_output_entry(void *ctx, const char *name)
{
    char *stray = ctx;
    if (!strcmp(name, DCP_METADATA_NAME) || dcp_is_data_file_name(name)) return TP_OK;
    snprintf(stray, 256, "%s", name);
    return TP_ERR_EXISTS;
}

int dcp_may_replace(const store_ops *storage, const char *path, void *ctx)
{
    (void)ctx;
    TP_TRY(ckpt_refuse_run_directory(storage, path));
    store_stat st;
    TP_TRY(storage->stat(storage, path, &st));
    if (!st.exists) return TP_OK;
    const char *refusal = "--force replaces only a distributed checkpoint the toolkit could have written (.metadata and "
                          "__R_0.distcp files, nothing else): choose another output, or remove it yourself";
    if (!st.is_dir) return tp_fail(TP_ERR_EXISTS, "%s is a file, not a distributed checkpoint; %s", path, refusal);
    char stray[256] = "";
    int status = storage->list(storage, path, visit_output_entry, stray);
    if (status == TP_ERR_EXISTS) return tp_fail(TP_ERR_EXISTS, "%s holds '%s'; %s", path, stray, refusal);
    return status;
}

int dcp_write_into(ckpt_reader *source, const dcp_write_options *options, const char *dir, dcp_write_plan *result)
{
    dcp_write_plan plan;
    TP_TRY(dcp_write_plan_create(source, options, &plan));
    if (result) *result = plan;
    writer w = {.source = source, .options = options, .root = dir};
    dcp_write_plan unused;
    memset(&unused, 0, sizeof unused);
    int status = writer_plan(&w, &unused);
    int64_t block = block_bytes(&w), whole = w.largest_whole;
    rank_buffers *buffers = calloc((size_t)plan.threads, sizeof *buffers);
    if (!status && !buffers) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; !status && i < plan.threads; i++) {
        buffers[i] = (rank_buffers){&w, alloc_pages((size_t)block), alloc_pages((size_t)block), (size_t)block,
                                    whole ? alloc_pages((size_t)whole) : NULL, whole ? alloc_pages((size_t)whole) : NULL};
        if (!buffers[i].block || !buffers[i].gathered || (whole && (!buffers[i].piece || !buffers[i].scratch)))
            status = tp_fail(TP_ERR_NOMEM, "out of memory for buffers");
    }
    rank_job job = {&w, buffers};
    if (!status) status = parallel_for(plan.files, plan.threads, write_rank_task, &job);
    if (!status) status = write_rest(&w);
    for (int i = 0; buffers && i < plan.threads; i++) {
        free(buffers[i].block);
        free(buffers[i].gathered);
        free(buffers[i].piece);
        free(buffers[i].scratch);
    }
    free(buffers);
    writer_free(&w);
    return status;
}

int dcp_write(ckpt_reader *source, const dcp_write_options *options, const char *out, dcp_write_plan *result)
{
    dcp_write_plan plan;
    TP_TRY(dcp_write_plan_create(source, options, &plan)); /* refused before anything is staged */
    store_stage_options stage = {.directory = 1, .overwrite = options->overwrite, .may_replace = dcp_may_replace,
                                 .bytes = plan.bytes};
    store_staged *staged = NULL;
    TP_TRY(store_stage(NULL, out, &stage, &staged));
    int status = dcp_write_into(source, options, store_staged_path(staged), result);
    /* What a foreign source records of what was read, whole, before the output appears. */
    if (!status) status = ckpt_reader_finish_checks(source, NULL);
    if (status) {
        store_staged_discard(staged);
        return status;
    }
    return store_staged_publish(staged);
}
