/* plan.c: from a source checkpoint and a target layout to a list of slabs,
 * each with the source rows it reads and the moves that place them.
 *
 * A tensor's output is cut one of three ways, by its partition alone:
 *  - replicated: rows of its one piece, read from the one source piece;
 *  - split along axis 0: rows of one output piece; each maps to logical rows
 *    (or padding), which map to rows of source pieces, read straight to place;
 *  - split along a later axis A: the same rows of every output piece at once,
 *    so every source row is read once; per output piece and run along A, one
 *    strided move per source piece places [outer, run, inner] elements. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../common/memory.h"
#include "../common/parallel.h"
#include "../common/parse.h"
#include "internal.h"

/* Bytes of a slab per thread, staging and output together. On the CPU a
 * slab that stays in the CPU's cache while it is read, checked, moved,
 * hashed and written copies at 1.6 times the speed of a 64 MiB one (2.7 GB
 * tp8 -> tp4pp2 with Adam state, warm: 3.0 s -> 1.8 s, cp 1.5 s; cold
 * unchanged, docs/BENCHMARKS.md); one checksum block (1 MiB) is the least.
 * The GPU executor copies each slab to the device and back: large slabs. */
#define SLAB_MAX_BYTES_CPU ((int64_t)4 << 20)
#define SLAB_MAX_BYTES_GPU ((int64_t)64 << 20)

void reshard_options_init(reshard_options *o)
{
    memset(o, 0, sizeof *o);
    o->device = RESHARD_DEVICE_AUTO;
    o->param_dtype = -1;
    o->compress_level = -1;
}

int reshard_parse_layout(const char *text, int *tp, int *pp, int *virtual_stages)
{
    *tp = 0;
    *pp = 0;
    *virtual_stages = 0;
    const char *c = text;
    const int *last = NULL;
    int ok = *c != '\0';
    while (ok && *c) {
        int *degree = NULL, skip = 2;
        if (strncmp(c, "tp", 2) == 0) degree = tp;
        else if (strncmp(c, "pp", 2) == 0) degree = pp;
        else if (*c == 'v' && last == pp) { /* vV only right after ppP */
            degree = virtual_stages;
            skip = 1;
        }
        ok = degree && !*degree && c[skip] >= '1' && c[skip] <= '9';
        if (!ok) break;
        c += skip;
        /* The degree's digits, read by the one rule for numbers (parse_int):
         * a run too long for the buffer is out of range as well. */
        char digits[16];
        size_t n = strspn(c, "0123456789");
        int64_t value = 0;
        ok = n < sizeof digits;
        if (ok) {
            memcpy(digits, c, n);
            digits[n] = '\0';
            ok = parse_int(digits, 1, 4096, &value) == 0;
        }
        c += n;
        *degree = (int)value;
        last = degree;
    }
    if (!ok) return tp_fail(TP_ERR_ARG, "layout '%s' not understood (expected e.g. tp4, pp2, tp4pp2 or tp4pp2v2)", text);
    if (*virtual_stages == 1)
        return tp_fail(TP_ERR_ARG, "layout '%s': v1 is one chunk of layers per stage, as without v; v2 or more "
                       "interleaves chunks over the stages", text);
    if (*virtual_stages > 1 && *pp < 2)
        return tp_fail(TP_ERR_ARG, "layout '%s': %d virtual stages (chunks of layers per stage) need pp 2 or more",
                       text, *virtual_stages);
    return TP_OK;
}

void reshard_layout_text(const ckpt_layout *layout, char out[RESHARD_LAYOUT_TEXT_MAX])
{
    int chunks = ckpt_layout_chunks(layout);
    if (chunks > 1) snprintf(out, RESHARD_LAYOUT_TEXT_MAX, "tp%dpp%dv%d", layout->tp, layout->pp, chunks);
    else snprintf(out, RESHARD_LAYOUT_TEXT_MAX, "tp%dpp%d", layout->tp, layout->pp);
}

static int64_t row_elements(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int d = 1; d < ndim; d++) n *= shape[d];
    return n;
}

/* ------------------------------------------------------------ slab ops */

static int add_read(slab_ops *ops, int piece, int64_t row0, int64_t row1, int64_t staging)
{
    if (ops->num_reads == ops->reads_capacity) {
        int64_t capacity = ops->reads_capacity ? 2 * ops->reads_capacity : 64;
        read_op *grown = realloc(ops->reads, (size_t)capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory for the slab plan");
        ops->reads = grown;
        ops->reads_capacity = capacity;
    }
    ops->reads[ops->num_reads++] = (read_op){piece, row0, row1, staging};
    return TP_OK;
}

static int add_move(slab_ops *ops, strided_move move)
{
    if (ops->num_moves == ops->moves_capacity) {
        int64_t capacity = ops->moves_capacity ? 2 * ops->moves_capacity : 64;
        strided_move *grown = realloc(ops->moves, (size_t)capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory for the slab plan");
        ops->moves = grown;
        ops->moves_capacity = capacity;
    }
    ops->moves[ops->num_moves++] = move;
    return TP_OK;
}

void reshard_slab_ops_free(slab_ops *ops)
{
    free(ops->reads);
    free(ops->moves);
    memset(ops, 0, sizeof *ops);
}

/* Output rows [row0, row1) of one piece of a tensor split along axis 0. */
static int rows_ops(const reshard_plan *plan, const tensor_plan *t, int piece, int64_t row0, int64_t row1,
                    slab_ops *ops)
{
    const ckpt_tensor_desc *src = ckpt_reader_tensor(plan->source, t->source);
    int src_tp = ckpt_reader_layout(plan->source)->tp;
    ckpt_run runs[2 * CKPT_MAX_SEGMENTS];
    int64_t n = ckpt_piece_runs(&t->out.desc, plan->to.tp, piece, runs, 2 * CKPT_MAX_SEGMENTS);
    int64_t max_src_runs = (int64_t)src->partition.num_segments * src_tp;
    ckpt_run *src_runs = malloc((size_t)max_src_runs * sizeof *src_runs);
    int status = src_runs ? TP_OK : tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int64_t k = 0; k < n && !status; k++) {
        int64_t a = runs[k].local_start > row0 ? runs[k].local_start : row0;
        int64_t end = runs[k].local_start + runs[k].length, b = end < row1 ? end : row1;
        if (a >= b) continue;
        int64_t offset = (a - row0) * t->out_row;
        if (runs[k].logical_start < 0) {
            status = add_move(ops, (strided_move){-1, 0, offset, 0, (b - a) * t->out_row, 1});
            continue;
        }
        int64_t logical = runs[k].logical_start + a - runs[k].local_start;
        int64_t m = ckpt_partition_runs(src, src_tp, logical, b - a, src_runs, max_src_runs);
        if (m < 0) status = tp_fail(TP_ERR_FORMAT, "tensor %s: source partition does not cover rows", src->name);
        for (int64_t j = 0; j < m && !status; j++) {
            int64_t at = offset + (src_runs[j].logical_start - logical) * t->out_row;
            status = add_read(ops, src_runs[j].rank, src_runs[j].local_start,
                              src_runs[j].local_start + src_runs[j].length, at);
            if (!status) status = add_move(ops, (strided_move){at, 0, at, 0, src_runs[j].length * t->out_row, 1});
        }
    }
    free(src_runs);
    ops->staging_elements = ops->output_elements = (row1 - row0) * t->out_row;
    ops->direct = 1;
    return status;
}

/* Rows [row0, row1) of output pieces [first, first + count) of a tensor split
 * along axis A > 0. Staging holds the rows of each source piece in turn, the
 * output those of each output piece in turn. */
static int all_pieces_ops(const reshard_plan *plan, const tensor_plan *t, int64_t row0, int64_t row1, int first,
                          int count, slab_ops *ops)
{
    const ckpt_tensor_desc *src = ckpt_reader_tensor(plan->source, t->source);
    const ckpt_tensor_desc *out = &t->out.desc;
    int src_tp = ckpt_reader_layout(plan->source)->tp, out_tp = plan->to.tp, axis = out->partition.axis;
    (void)out_tp;
    int64_t src_shape[CKPT_MAX_DIMS], out_shape[CKPT_MAX_DIMS];
    ckpt_piece_shape(src, src_tp, src_shape);
    ckpt_piece_shape(out, out_tp, out_shape);
    int64_t outer = row1 - row0, inner = 1;
    for (int d = 1; d < axis; d++) outer *= out_shape[d];
    for (int d = axis + 1; d < out->ndim; d++) inner *= out_shape[d];
    int64_t rows = row1 - row0;
    int status = TP_OK;
    for (int s = 0; s < src_tp && !status; s++) status = add_read(ops, s, row0, row1, s * rows * t->src_row);
    int64_t max_src_runs = (int64_t)src->partition.num_segments * src_tp;
    ckpt_run runs[2 * CKPT_MAX_SEGMENTS], *src_runs = malloc((size_t)max_src_runs * sizeof *src_runs);
    if (!src_runs) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int p = first; p < first + count && !status; p++) {
        int64_t base = (p - first) * rows * t->out_row;
        int64_t n = ckpt_piece_runs(out, out_tp, p, runs, 2 * CKPT_MAX_SEGMENTS);
        for (int64_t k = 0; k < n && !status; k++) {
            int64_t dst = base + runs[k].local_start * inner, dst_stride = out_shape[axis] * inner;
            if (runs[k].logical_start < 0) {
                status = add_move(ops, (strided_move){-1, 0, dst, dst_stride, runs[k].length * inner, outer});
                continue;
            }
            int64_t m = ckpt_partition_runs(src, src_tp, runs[k].logical_start, runs[k].length, src_runs, max_src_runs);
            if (m < 0) status = tp_fail(TP_ERR_FORMAT, "tensor %s: source partition does not cover a run", src->name);
            for (int64_t j = 0; j < m && !status; j++) {
                int64_t from = src_runs[j].rank * rows * t->src_row + src_runs[j].local_start * inner;
                int64_t to = dst + (src_runs[j].logical_start - runs[k].logical_start) * inner;
                status = add_move(ops, (strided_move){from, src_shape[axis] * inner, to, dst_stride,
                                                      src_runs[j].length * inner, outer});
            }
        }
    }
    free(src_runs);
    ops->staging_elements = src_tp * rows * t->src_row;
    ops->output_elements = count * rows * t->out_row;
    ops->direct = 0;
    return status;
}

int reshard_slab_ops(const reshard_plan *plan, const slab *s, slab_ops *ops)
{
    ops->num_reads = ops->num_moves = 0;
    const tensor_plan *t = &plan->tensors[s->tensor];
    switch (t->kind) {
    case SLAB_WHOLE: {
        int64_t n = (s->row1 - s->row0) * t->out_row;
        ops->staging_elements = ops->output_elements = n;
        ops->direct = 1;
        int status = add_read(ops, 0, s->row0, s->row1, 0);
        return status ? status : add_move(ops, (strided_move){0, 0, 0, 0, n, 1});
    }
    case SLAB_ROWS: return rows_ops(plan, t, s->piece, s->row0, s->row1, ops);
    case SLAB_ALL_PIECES:
        return s->piece < 0 ? all_pieces_ops(plan, t, s->row0, s->row1, 0, plan->to.tp, ops)
                            : all_pieces_ops(plan, t, s->row0, s->row1, s->piece, 1, ops);
    }
    return tp_fail(TP_ERR_ARG, "unknown slab kind");
}

/* ----------------------------------------------------------------- plan */

/* Bytes a slab of one row needs in staging and output buffers together. */
static int64_t bytes_per_row(const reshard_plan *plan, const tensor_plan *t)
{
    const ckpt_tensor_desc *src = ckpt_reader_tensor(plan->source, t->source);
    int64_t src_size = (int64_t)tp_dtype_size(src->dtype), out_size = (int64_t)tp_dtype_size(t->out.desc.dtype);
    if (t->kind == SLAB_ALL_PIECES)
        return ckpt_reader_layout(plan->source)->tp * t->src_row * src_size + plan->to.tp * t->out_row * out_size;
    return t->src_row * src_size + t->out_row * out_size;
}

/* Rows per slab for every tensor within a per-thread budget; fails (-1)
 * when one checksum block of some tensor does not fit. */
static int size_slabs(reshard_plan *plan, int64_t budget)
{
    for (int i = 0; i < plan->num_tensors; i++) {
        tensor_plan *t = &plan->tensors[i];
        int64_t per_row = bytes_per_row(plan, t);
        int64_t most = plan->use_cuda ? SLAB_MAX_BYTES_GPU : SLAB_MAX_BYTES_CPU;
        int64_t limit = budget < most ? budget : most;
        if (t->block_rows * per_row > budget) return -1;
        int64_t rows = limit / per_row / t->block_rows * t->block_rows;
        if (rows < t->block_rows) rows = t->block_rows;
        t->rows_per_slab = rows < t->rows ? rows : t->rows;
    }
    return 0;
}

/* The tensor whose one checksum block needs the most buffer memory, and how much. */
static int64_t largest_block(const reshard_plan *plan, const char **name)
{
    int64_t most = 0;
    *name = NULL;
    for (int i = 0; i < plan->num_tensors; i++) {
        const tensor_plan *t = &plan->tensors[i];
        int64_t need = t->block_rows * bytes_per_row(plan, t);
        if (need > most || !*name) {
            most = need;
            *name = t->out.name;
        }
    }
    return most;
}

static int by_file_then_order(const void *a, const void *b)
{
    const slab *x = a, *y = b;
    if (x->file != y->file) return x->file - y->file;
    if (x->tensor != y->tensor) return x->tensor - y->tensor;
    return x->row0 < y->row0 ? -1 : x->row0 > y->row0;
}

/* Files take turns: workers running at once write different files (writers
 * of one file wait on each other for its inode lock), while each file is
 * still written front to back. */
static int by_turn_then_file(const void *a, const void *b)
{
    const slab *x = a, *y = b;
    if (x->turn != y->turn) return x->turn < y->turn ? -1 : 1;
    return x->file - y->file;
}

static int add_slab(reshard_plan *plan, int64_t *capacity, slab s)
{
    if (plan->num_slabs == *capacity) {
        *capacity = *capacity ? 2 * *capacity : 1024;
        slab *grown = realloc(plan->slabs, (size_t)*capacity * sizeof *grown);
        if (!grown) return tp_fail(TP_ERR_NOMEM, "out of memory for the slab list");
        plan->slabs = grown;
    }
    plan->slabs[plan->num_slabs++] = s;
    return TP_OK;
}

/* Walks every slab once: source bytes read (whole checksum blocks, as the
 * verifying reader reads them), buffer sizes and move counts. */
static int measure(reshard_plan *plan)
{
    slab_ops ops;
    memset(&ops, 0, sizeof ops);
    int status = TP_OK;
    for (int64_t k = 0; k < plan->num_slabs && !status; k++) {
        const slab *s = &plan->slabs[k];
        const tensor_plan *t = &plan->tensors[s->tensor];
        const ckpt_tensor_desc *src = ckpt_reader_tensor(plan->source, t->source);
        status = reshard_slab_ops(plan, s, &ops);
        if (status) break;
        for (int64_t r = 0; r < ops.num_reads; r++) {
            ckpt_piece_info info;
            ckpt_reader_piece_info(plan->source, t->source, ops.reads[r].piece, &info);
            /* Reads check whole checksum blocks; a foreign source has none and reads its rows alone. */
            int64_t block = ckpt_reader_is_foreign(plan->source) ? 1 : info.block_rows, rows = info.shape[0];
            int64_t b0 = ops.reads[r].row0 / block * block;
            int64_t b1 = (ops.reads[r].row1 + block - 1) / block * block;
            plan->summary.bytes_read += ((b1 < rows ? b1 : rows) - b0) * (info.bytes / rows);
        }
        int64_t staging = ops.staging_elements * (int64_t)tp_dtype_size(src->dtype);
        int64_t output = ops.output_elements * (int64_t)tp_dtype_size(t->out.desc.dtype);
        if (staging > plan->max_staging_bytes) plan->max_staging_bytes = staging;
        if (output > plan->max_output_bytes) plan->max_output_bytes = output;
        if (ops.num_moves > plan->max_moves) plan->max_moves = ops.num_moves;
    }
    reshard_slab_ops_free(&ops);
    return status;
}

void reshard_plan_free(reshard_plan *plan)
{
    if (!plan) return;
    free(plan->tensors);
    free(plan->slabs);
    free(plan);
}

ckpt_layout reshard_target_layout(const ckpt_layout *from, const reshard_options *options)
{
    ckpt_layout to = *from;
    if (options->tp) to.tp = options->tp;
    if (options->pp) to.pp = options->pp;
    /* A pipeline named anew has one chunk per stage unless said otherwise;
     * a kept one keeps its chunks. */
    if (options->virtual_stages || options->pp) to.virtual_stages = options->virtual_stages > 1 ? options->virtual_stages : 1;
    return to;
}

static void allowance(int zstd, int64_t *fixed, int64_t *per_thread)
{
    *fixed = zstd ? CKPT_ZSTD_FIXED_MEMORY : CKPT_FIXED_MEMORY;
    *per_thread = zstd ? CKPT_ZSTD_THREAD_MEMORY : CKPT_THREAD_MEMORY;
}

int reshard_threads_within(int64_t limit, int threads, int64_t need, int zstd, int64_t *share)
{
    if (limit <= 0) limit = RESHARD_DEFAULT_MEMORY;
    int64_t fixed, per_thread;
    allowance(zstd, &fixed, &per_thread);
    int64_t base = resident_bytes() + fixed;
    *share = 0;
    for (; threads >= 1; threads--) {
        *share = (limit - base) / threads - per_thread;
        if (*share >= need) return threads;
    }
    return 0;
}

int reshard_memory_refusal(int64_t limit, int64_t need, int zstd, const char *what, ...)
{
    if (limit <= 0) limit = RESHARD_DEFAULT_MEMORY;
    char text[768];
    va_list args;
    va_start(args, what);
    vsnprintf(text, sizeof text, what, args);
    va_end(args);
    int64_t fixed, per_thread, held = resident_bytes();
    allowance(zstd, &fixed, &per_thread);
    char given[32], least[32], buffers[32], holds[32], reserve[32];
    format_bytes((double)limit, given, sizeof given);
    format_bytes((double)(held + fixed + per_thread + need), least, sizeof least);
    format_bytes((double)need, buffers, sizeof buffers);
    format_bytes((double)held, holds, sizeof holds);
    format_bytes((double)(fixed + per_thread), reserve, sizeof reserve);
    return tp_fail(TP_ERR_LIMIT,
                   "memory limit of %s is too small: one thread needs at least %s: %s: %s of buffers, beside the %s "
                   "this process holds now and %s set aside for the checkpoint library%s (its caches and one "
                   "thread's scratch: an allowance, not a measure); raise --memory-limit",
                   given, least, text, buffers, holds, reserve, zstd ? " writing zstd" : "");
}

int reshard_plan_create(reshard_plan **out, ckpt_reader *source, const reshard_options *options)
{
    *out = NULL;
    reshard_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return tp_fail(TP_ERR_NOMEM, "out of memory");
    plan->source = source;
    if (options) plan->options = *options;
    else reshard_options_init(&plan->options);
    const reshard_options *o = &plan->options;
    const ckpt_layout *from = ckpt_reader_layout(source);
    plan->to = reshard_target_layout(from, o);
    char to_text[RESHARD_LAYOUT_TEXT_MAX];
    reshard_layout_text(&plan->to, to_text);
    int status = ckpt_layout_check(&plan->to);
    if (status) {
        tp_fail_context(status, "cannot reshard to %s", to_text);
        reshard_plan_free(plan);
        return status;
    }
    int n = ckpt_reader_num_tensors(source), any_compressed = 0, converts = 0;
    plan->tensors = calloc((size_t)n + 1, sizeof *plan->tensors);
    if (!plan->tensors) status = tp_fail(TP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !status; i++) {
        const ckpt_tensor_desc *src = ckpt_reader_tensor(source, i);
        ckpt_piece_info info;
        ckpt_reader_piece_info(source, i, 0, &info);
        any_compressed |= info.compressed;
        if (o->drop_optimizer && strcmp(src->role, "param") != 0) {
            plan->summary.tensors_dropped++;
            continue;
        }
        tensor_plan *t = &plan->tensors[plan->num_tensors];
        t->source = i;
        ckpt_tensor_desc desc = *src;
        if (o->param_dtype >= 0 && strcmp(src->role, "param") == 0) desc.dtype = (tp_dtype)o->param_dtype;
        converts |= desc.dtype != src->dtype;
        status = ckpt_tensor_copy_init(&t->out, &desc);
        if (!status) status = ckpt_tensor_check(&t->out.desc, plan->to.tp);
        if (status) {
            status = tp_fail_context(status, "cannot reshard to %s", to_text);
            break;
        }
        const ckpt_tensor_desc *d = &t->out.desc;
        t->kind = d->partition.kind == CKPT_REPLICATED ? SLAB_WHOLE : d->partition.axis == 0 ? SLAB_ROWS : SLAB_ALL_PIECES;
        t->stage = ckpt_tensor_stage(d, &plan->to);
        t->block_rows = ckpt_piece_block_rows(d, plan->to.tp);
        int64_t shape[CKPT_MAX_DIMS];
        ckpt_piece_shape(d, plan->to.tp, shape);
        t->rows = shape[0];
        t->out_row = row_elements(shape, d->ndim);
        ckpt_piece_shape(src, from->tp, shape);
        t->src_row = row_elements(shape, src->ndim);
        plan->num_tensors++;
    }
    if (status) {
        reshard_plan_free(plan);
        return status;
    }

    /* Device. --device cpu asks no driver: starting CUDA would map memory
     * (counted below as resident) and take time, for nothing. */
    int gpus = o->device == RESHARD_DEVICE_CPU ? 0 : cuda_device_count();
    if (o->device == RESHARD_DEVICE_CUDA && gpus == 0) {
        reshard_plan_free(plan);
        return tp_fail(TP_ERR_ARG, "--device cuda: %s",
                            cuda_built() ? "no CUDA device is available" : "this build has no CUDA support");
    }
    /* Auto takes the GPU only for a plan that converts dtypes. Plain copies
     * move the same bytes on the CPU either way (reads into staging, output
     * to the writer); a GPU would add a copy to the device and one back per
     * slab, so it cannot be faster there. (Whether conversions are faster on
     * a GPU than on the CPU's cores has not yet been measured.) */
    plan->use_cuda = o->device == RESHARD_DEVICE_CUDA || (o->device == RESHARD_DEVICE_AUTO && gpus > 0 && converts);
    plan->summary.device_reason = o->device != RESHARD_DEVICE_AUTO ? NULL
                                  : gpus == 0 ? "no CUDA device found, using the CPU"
                                  : converts  ? "the plan converts dtypes, on the GPU"
                                              : "no dtype to convert, which a GPU cannot speed up";
    plan->compress_level = o->compress_level >= 0 ? o->compress_level : any_compressed ? 3 : 0;

    /* Memory: what is resident now, fixed and per-thread overheads, then the
     * rest split between the threads' staging and output buffers. With too
     * little for one checksum block per slab, fewer threads are tried. */
    int64_t limit = o->memory_limit > 0 ? o->memory_limit : RESHARD_DEFAULT_MEMORY;
    /* zstd's writers hold more a thread; the GPU executor's own has not
     * been measured, so it is given that larger allowance too. */
    int heavy = plan->compress_level > 0 || plan->use_cuda;
    const char *name;
    int64_t needed = largest_block(plan, &name), budget = 0;
    /* A thread's reads of the source may keep buffers of their own (the
     * rows of a DCP chunk stored transposed, ckpt_reader_read_thread_bytes). */
    int64_t reading = ckpt_reader_read_thread_bytes(source);
    int threads = reshard_threads_within(limit, o->threads > 0 ? o->threads : parallel_cpu_count(),
                                         (needed > 0 ? needed : 1) + reading, heavy, &budget);
    if (threads < 1 || size_slabs(plan, budget - reading) != 0) {
        status = reshard_memory_refusal(limit, needed + reading, heavy, "tensor %s (one checksum block per slab)",
                                        name ? name : "(none)");
        reshard_plan_free(plan);
        return status;
    }

    /* Slabs, file by file. */
    int64_t capacity = 0;
    for (int i = 0; i < plan->num_tensors && !status; i++) {
        const tensor_plan *t = &plan->tensors[i];
        int pieces = t->kind == SLAB_ROWS ? plan->to.tp : 1;
        for (int p = 0; p < pieces && !status; p++) {
            int piece = t->kind == SLAB_ALL_PIECES ? -1 : p;
            int file = t->stage * plan->to.tp + (piece > 0 ? piece : 0);
            for (int64_t r = 0; r < t->rows && !status; r += t->rows_per_slab) {
                int64_t end = r + t->rows_per_slab < t->rows ? r + t->rows_per_slab : t->rows;
                status = add_slab(plan, &capacity, (slab){i, piece, r, end, file, 0});
            }
        }
        plan->summary.pieces_written += ckpt_piece_count(&t->out.desc, plan->to.tp);
        plan->summary.bytes_written += (int64_t)ckpt_piece_count(&t->out.desc, plan->to.tp) * t->rows * t->out_row *
                                       (int64_t)tp_dtype_size(t->out.desc.dtype);
    }
    if (!status && plan->num_slabs > 1) {
        qsort(plan->slabs, (size_t)plan->num_slabs, sizeof *plan->slabs, by_file_then_order);
        for (int64_t k = 1; k < plan->num_slabs; k++)
            plan->slabs[k].turn = plan->slabs[k].file == plan->slabs[k - 1].file ? plan->slabs[k - 1].turn + 1 : 0;
        qsort(plan->slabs, (size_t)plan->num_slabs, sizeof *plan->slabs, by_turn_then_file);
    }
    if (!status) status = measure(plan);
    if (status) {
        reshard_plan_free(plan);
        return status;
    }
    reshard_summary *s = &plan->summary;
    s->from = *from;
    s->to = plan->to;
    s->tensors = plan->num_tensors;
    s->files_written = plan->to.tp * plan->to.pp;
    s->slabs = plan->num_slabs;
    s->threads = threads;
    s->slab_bytes = plan->max_staging_bytes > plan->max_output_bytes ? plan->max_staging_bytes : plan->max_output_bytes;
    s->buffer_memory = threads * (plan->max_staging_bytes + plan->max_output_bytes);
    /* A reading-back thread keeps its largest piece's buffer and its largest
     * converted slab's from tensor to tensor (scratch_buffer): both at once. */
    int64_t piece_read = 0, converted = 0;
    for (int i = 0; i < plan->num_tensors; i++) {
        const tensor_plan *t = &plan->tensors[i];
        int64_t read = ckpt_tensor_verify_read_bytes(&t->out.desc, plan->to.tp, plan->compress_level > 0, 0);
        int64_t slab = reshard_converted_digest_bytes(ckpt_reader_tensor(source, t->source), t->out.desc.dtype);
        if (read > piece_read) piece_read = read;
        if (slab > converted) converted = slab;
    }
    /* A converted tensor's source is read again, slab by slab
     * (converted_digest), through the buffers its reader keeps a thread:
     * another tool's bounce buffer and a transposed box's rows. */
    s->read_back_bytes = piece_read + converted + (converted > 0 ? reading : 0);
    s->memory_limit = limit;
    s->device = plan->use_cuda ? "cuda" : "cpu";
    *out = plan;
    return TP_OK;
}

const reshard_summary *reshard_plan_summary(const reshard_plan *plan)
{
    return &plan->summary;
}
